#!/usr/bin/env python3
"""Render ops/prometheus/alerts.yml with other thresholds.

Every threshold of alerts.yml is the last value on a line that ends in
`# param NAME` (inside an `expr:` that is a PromQL comment, so the file as
shipped is valid as it is and holds the defaults). This script replaces the
value of each NAME given with --set and writes the result to stdout:

    python3 ops/prometheus/render.py --set lag_growing_for=30m \\
        --set skipped_rate=5 ops/prometheus/alerts.yml > my-alerts.yml

    python3 ops/prometheus/render.py --list     # the parameters and defaults

    # the same rules as a Prometheus Operator PrometheusRule (ops/k8s/)
    python3 ops/prometheus/render.py --prometheus-rule > ops/k8s/prometheusrule.yaml

A NAME the file does not have, a value with white space or a `#`, or a
--set without `=` is an error (exit 2): a typo never leaves a default
silently in force. No dependency beyond Python 3.
"""

import argparse
import os
import re
import sys

PARAM = re.compile(r"^(?P<head>.*?)(?P<value>[^\s]+)(?P<tail>\s+# param (?P<name>[a-z_]+)\s*)$")


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?", default=os.path.join(here, "alerts.yml"))
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--list", action="store_true", help="print NAME=DEFAULT per parameter")
    ap.add_argument("--prometheus-rule", action="store_true",
                    help="wrap the rules in a PrometheusRule manifest (Prometheus Operator)")
    args = ap.parse_args()

    wanted = {}
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            print(f"render.py: --set {item!r}: expected NAME=VALUE", file=sys.stderr)
            return 2
        if re.search(r"[\s#]", value):
            print(f"render.py: --set {item!r}: the value may not hold white space or '#'", file=sys.stderr)
            return 2
        wanted[name] = value

    with open(args.file, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)

    seen = {}
    out = []
    for line in lines:
        m = PARAM.match(line.rstrip("\n"))
        if not m:
            out.append(line)
            continue
        name = m.group("name")
        seen.setdefault(name, m.group("value"))
        value = wanted.get(name, m.group("value"))
        out.append(m.group("head") + value + m.group("tail") + ("\n" if line.endswith("\n") else ""))

    if args.list:
        for name, default in seen.items():
            print(f"{name}={default}")
        return 0
    unknown = sorted(set(wanted) - set(seen))
    if unknown:
        print(
            f"render.py: {args.file} has no parameter {', '.join(unknown)} "
            f"(it has: {', '.join(sorted(seen))})",
            file=sys.stderr,
        )
        return 2
    if args.prometheus_rule:
        # The rule file's own header comments stay behind; its body moves
        # under spec: unchanged (indented), so both parse to the same groups.
        body = out[next(i for i, l in enumerate(out) if l.startswith("groups:")):]
        sets = "".join(f" --set {k}={v}" for k, v in wanted.items())
        sys.stdout.write(
            "# The rules of ops/prometheus/alerts.yml (parameters and runbooks are\n"
            "# explained there) for the Prometheus Operator. Generated, do not edit:\n"
            f"#   python3 ops/prometheus/render.py --prometheus-rule{sets} > ops/k8s/prometheusrule.yaml\n"
            "# engine/spate/tests/it/ops_manifests.rs checks it holds the same groups.\n"
            "apiVersion: monitoring.coreos.com/v1\n"
            "kind: PrometheusRule\n"
            "metadata:\n"
            "  name: spate\n"
            "  labels:\n"
            "    app.kubernetes.io/name: spate\n"
            "spec:\n"
            + "".join(("  " + l) if l.strip() else l for l in body)
        )
        return 0
    sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
