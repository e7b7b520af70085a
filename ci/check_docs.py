#!/usr/bin/env python3
"""Checks that the docs point at things that exist.

Over README.md, docs/*.md, docs/adr/*.md, engine/*/README.md and
ops/*/README.md it checks that:

- every relative link `[text](path)` and `[text](path#anchor)` (and `(#anchor)`
  within a file) resolves: the file or directory exists, and the anchor is
  the GitHub slug of a heading of the target file;
- every script a doc runs (`bash PATH`, `python3 PATH`, `sh PATH`) exists;
- every backticked snake_case name of five words or more (how the docs
  cite a test function) occurs in the Rust sources;
- every `cargo ...` command in code (fenced blocks and inline code) names a
  workspace package (`-p` / `--package`), and the `--example`, `--test`,
  `--bench` and `--bin` targets and `--features` it names exist in that
  package (or, without `-p`, in some package), read from
  `cargo metadata --no-deps --format-version 1`;
- docs/OPERATIONS.md's alert table (rows whose first cell is a backticked
  `Spate...` name) lists exactly the alerts of ops/prometheus/alerts.yml, and
  its dashboard table is exactly `ops/grafana/build_dashboard.py --markdown`;
- docs/CONFIG.md's key index ("Every key" table) lists exactly the keys the
  config parser accepts (the serde structs of engine/spate/src/config*, plus
  `pipelines`, `fail_process` and `tables`), and for each key whose type is
  a plain enum, every value it accepts.

Before that it runs its own self-test: a temporary tree with a broken link,
a broken anchor, a missing script, an unknown package, an unknown test
target, an alert table missing an alert and a key index missing a key must
each be reported, and a clean tree must pass. So a check that cannot fail
fails the run.

    python3 ci/check_docs.py              self-test, then the repository
    python3 ci/check_docs.py --no-self-test
"""
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- markdown


def doc_files(root):
    """The docs this checks, in a stable order."""
    pats = ["README.md", "docs/*.md", "docs/adr/*.md", "engine/*/README.md", "ops/*/README.md"]
    out = []
    for p in pats:
        out.extend(sorted(root.glob(p)))
    return out


FENCE = re.compile(r"^(\s*)(```|~~~)")


def split_code(text):
    """(prose, code): prose with fenced blocks and inline code blanked out
    (so links inside code are not links), and the list of code texts (each
    fenced block, each inline span with its newlines made spaces)."""
    prose_lines, code, block, fence = [], [], None, None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if block is not None:
            if m and m.group(2) == fence:
                code.append("\n".join(block))
                block, fence = None, None
            else:
                block.append(line)
            prose_lines.append("")
            continue
        if m:
            block, fence = [], m.group(2)
            prose_lines.append("")
            continue
        prose_lines.append(line)
    prose = "\n".join(prose_lines)
    spans = []

    def blank(m):
        spans.append(m.group(2).replace("\n", " "))
        return " " * len(m.group(0))

    prose = re.sub(r"(`+)(.+?)\1", blank, prose, flags=re.S)
    return prose, code + spans


def slug(heading):
    """GitHub's anchor of a heading's text."""
    h = re.sub(r"`|\*\*|__", "", heading.strip()).lower()
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        text = path.read_text()
        seen, out = {}, set()
        # Headings are read from the raw text outside fences.
        in_fence = None
        for line in text.split("\n"):
            m = FENCE.match(line)
            if in_fence:
                if m and m.group(2) == in_fence:
                    in_fence = None
                continue
            if m:
                in_fence = m.group(2)
                continue
            h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if h:
                s = slug(h.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', text):
            out.add(m.group(1))
        cache[path] = out
    return cache[path]


LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def check_links(root, doc, prose, errors):
    for m in LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = doc if not path_part else (doc.parent / path_part)
        where = f"{doc.relative_to(root)}: link ({target})"
        if not dest.exists():
            errors.append(f"{where}: {path_part} does not exist")
            continue
        try:
            dest.resolve().relative_to(root.resolve())
        except ValueError:
            errors.append(f"{where}: leaves the repository")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix != ".md":
                errors.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor not in anchors(dest.resolve()):
                errors.append(f"{where}: no heading with anchor #{anchor} in {dest.resolve().relative_to(root.resolve())}")


SCRIPT = re.compile(r"(?:^|[\s;&|(`])(?:bash|python3|sh)\s+((?:\./)?[\w./-]+\.(?:sh|py))\b")


def check_scripts(root, doc, code, errors):
    for text in code:
        for m in SCRIPT.finditer(text):
            p = m.group(1)
            if not (root / p).is_file():
                errors.append(f"{doc.relative_to(root)}: `{m.group(0).strip()}`: {p} does not exist")


# ---------------------------------------------------------------- cargo


def metadata(root):
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    packages = {}
    for p in json.loads(out)["packages"]:
        targets = {}
        for t in p["targets"]:
            for k in t["kind"]:
                targets.setdefault(k, set()).add(t["name"])
        packages[p["name"]] = {"targets": targets, "features": set(p.get("features", {}))}
    return packages


CARGO = re.compile(r"\bcargo\s+(?:\+\S+\s+)?([a-z-]+)((?:[^;&|\n#`]|\\\n)*)")
KIND = {"--example": "example", "--test": "test", "--bench": "bench", "--bin": "bin"}


def check_cargo(root, doc, code, packages, errors):
    name = doc.relative_to(root)
    for text in code:
        for m in CARGO.finditer(text):
            sub, rest = m.group(1), m.group(2)
            if sub not in {"run", "test", "build", "check", "bench", "clippy", "doc", "nextest"}:
                continue
            # Arguments after `--` go to the binary, not to cargo.
            args = rest.replace("\\\n", " ").split(" -- ")[0].split()
            pkgs, wanted, feats = [], [], []
            i = 0
            while i < len(args):
                a = args[i]
                val = args[i + 1] if i + 1 < len(args) else None
                key, eq, inline = a.partition("=")
                if eq:
                    a, val, step = key, inline, 1
                else:
                    step = 2
                if a in ("-p", "--package") and val:
                    pkgs.append(val)
                    i += step
                elif a in KIND and val:
                    wanted.append((KIND[a], val))
                    i += step
                elif a in ("--features", "-F") and val:
                    feats.extend(f for f in re.split(r"[,\s]+", val.strip("'\"")) if f)
                    i += step
                else:
                    i += 1
            cmd = f"cargo {sub}{rest}".split(" -- ")[0].strip()
            for p in pkgs:
                if p not in packages:
                    errors.append(f"{name}: `{cmd}`: no workspace package {p}")
            scope = [p for p in pkgs if p in packages] or list(packages)
            for kind, target in wanted:
                if target in ("NAME", "N", "FILE"):
                    continue
                if not any(target in packages[p]["targets"].get(kind, ()) for p in scope):
                    errors.append(f"{name}: `{cmd}`: no {kind} target {target} in {', '.join(pkgs) or 'the workspace'}")
            for f in feats:
                owner, slash, feat = f.rpartition("/")
                fscope = [owner] if slash else scope
                if not any(feat in packages.get(p, {}).get("features", ()) for p in fscope):
                    errors.append(f"{name}: `{cmd}`: no feature {f}")


# ---------------------------------------------------------------- names


NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+){4,}$")
# Names from outside the Rust sources: librdkafka's C symbols and the
# exporter's standard process_* series.
FOREIGN = re.compile(r"^(?:rd_kafka_|process_)")


def source_words(root, cache={}):
    """Every identifier-like word of the Rust sources (test names among them)."""
    if root not in cache:
        words = set()
        for d in ("engine", "sim", "verify", "benches"):
            for p in (root / d).rglob("*.rs"):
                if "target" not in p.parts:
                    words.update(re.findall(r"[a-z][a-z0-9_]+", p.read_text()))
        cache[root] = words
    return cache[root]


def check_names(root, doc, code, errors):
    """A backticked snake_case name of five words or more (a test function,
    as the docs cite them) must still be in the sources: a renamed or deleted
    test leaves the doc pointing at nothing."""
    words = source_words(root)
    for text in code:
        t = text.strip()
        if NAME.match(t) and not FOREIGN.match(t) and t not in words:
            errors.append(f"{doc.relative_to(root)}: `{t}` is in no Rust source (a renamed or deleted test?)")


# ---------------------------------------------------------------- operations


def table_rows(text, first_cell):
    """First cells of markdown table rows whose first cell matches."""
    out = []
    for line in text.split("\n"):
        m = re.match(r"^\|\s*([^|]*?)\s*\|", line)
        if m and re.fullmatch(first_cell, m.group(1)):
            out.append(m.group(1).strip("`"))
    return out


def check_operations(root, errors):
    ops = root / "docs" / "OPERATIONS.md"
    rules = root / "ops" / "prometheus" / "alerts.yml"
    if not ops.exists():
        errors.append("docs/OPERATIONS.md does not exist")
        return
    text = ops.read_text()
    documented = table_rows(text, r"`Spate[A-Za-z]+`")
    alerts = re.findall(r"^\s*-\s*alert:\s*(\S+)", rules.read_text(), flags=re.M)
    for a in sorted(set(alerts) - set(documented)):
        errors.append(f"docs/OPERATIONS.md: alert {a} of ops/prometheus/alerts.yml is not in the alert table")
    for a in sorted(set(documented) - set(alerts)):
        errors.append(f"docs/OPERATIONS.md: alert {a} is in the table but not in ops/prometheus/alerts.yml")
    builder = root / "ops" / "grafana" / "build_dashboard.py"
    if builder.exists():
        table = subprocess.run([sys.executable, str(builder), "--markdown"],
                               check=True, capture_output=True, text=True).stdout
        if table not in text:
            errors.append("docs/OPERATIONS.md: the dashboard table is not exactly "
                          "`python3 ops/grafana/build_dashboard.py --markdown` (paste its output)")


# ---------------------------------------------------------------- config keys


def rust_items(src):
    """Structs and enums deriving Deserialize: name -> ('struct', [(key,
    type)]) or ('enum', [values]) (None for untagged enums)."""
    items = {}
    for m in re.finditer(r"((?:#\[[^\]]*\]\s*|///[^\n]*\n\s*)*)pub (struct|enum) (\w+)\s*\{", src):
        attrs, kind, name = m.group(1), m.group(2), m.group(3)
        if "Deserialize" not in attrs:
            continue
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            i += 1
        body = src[m.end():i - 1]
        if kind == "struct":
            fields = []
            for f in re.finditer(r"((?:#\[[^\]]*\]\s*|///[^\n]*\n\s*)*)pub (\w+):\s*([^\n]+),\n", body):
                ren = re.search(r'rename\s*=\s*"([^"]+)"', f.group(1))
                fields.append((ren.group(1) if ren else f.group(2), f.group(3)))
            items[name] = ("struct", fields)
        else:
            if "untagged" in attrs:
                items[name] = ("enum", None)
                continue
            rule = re.search(r'rename_all\s*=\s*"([^"]+)"', attrs)
            values = []
            for v in re.finditer(r"^\s*(?:#\[[^\]]*\]\s*)*([A-Z]\w*)\s*,", re.sub(r"///[^\n]*", "", body), flags=re.M):
                n = v.group(1)
                if rule and rule.group(1) == "lowercase":
                    n = n.lower()
                elif rule and rule.group(1) == "snake_case":
                    n = re.sub(r"(?<!^)([A-Z])", r"_\1", n).lower()
                values.append(n)
            items[name] = ("enum", values)
    return items


# Keys read outside serde (engine/spate/src/config/pipelines.rs, tables.rs):
# checked against their string literals there, so a rename shows.
EXTRA_KEYS = {
    "pipelines": ("pipelines.rs", '"pipelines"'),
    "pipelines[].fail_process": ("pipelines.rs", '"fail_process"'),
    "tables": ("tables.rs", '"tables"'),
    "tables.<*>.table": ("tables.rs", '"table"'),
    "tables.<*>.database": ("tables.rs", '"database"'),
    "tables.<*>.shard_key": ("tables.rs", '"shard_key"'),
    "tables.<*>.mapping": ("tables.rs", '"mapping"'),
}


def parser_keys(root):
    """{key: enum values or None} the config parser accepts."""
    cfg = root / "engine" / "spate" / "src"
    files = [cfg / "config.rs"] + sorted((cfg / "config").glob("*.rs"))
    src = "\n".join(f.read_text() for f in files if f.exists() and f.name != "tests.rs")
    items = rust_items(src)
    keys = {}

    def walk(struct, prefix):
        for key, ty in items[struct][1]:
            path = f"{prefix}{key}"
            idents = re.findall(r"\w+", ty)
            inner = [t for t in idents if t in items]
            target = inner[-1] if inner else None
            is_map = "BTreeMap" in idents or "HashMap" in idents
            if target and items[target][0] == "struct":
                walk(target, f"{path}.<*>." if is_map else f"{path}.")
            else:
                vals = items[target][1] if target and not is_map else None
                keys[path] = vals

    if "Config" not in items:
        raise SystemExit("check_docs: no `pub struct Config` deriving Deserialize in engine/spate/src/config*")
    walk("Config", "")
    for key, (fname, literal) in EXTRA_KEYS.items():
        f = cfg / "config" / fname
        if not f.exists() or literal not in f.read_text():
            raise SystemExit(f"check_docs: {literal} not in {f}: update EXTRA_KEYS in ci/check_docs.py")
        keys[key] = None
    return keys


def expand(key):
    """`a.{b,c}.d` -> [`a.b.d`, `a.c.d`]."""
    m = re.search(r"\{([^}]*)\}", key)
    if not m:
        return [key]
    return [k for alt in m.group(1).split(",")
            for k in expand(key[:m.start()] + alt + key[m.end():])]


def check_config(root, errors):
    doc = root / "docs" / "CONFIG.md"
    if not doc.exists():
        errors.append("docs/CONFIG.md does not exist")
        return
    rows, inside = {}, False
    for line in doc.read_text().split("\n"):
        if line.startswith("## "):
            inside = line.strip() == "## Every key"
            continue
        m = re.match(r"^\|\s*`([a-z_\[\].<>*{},-]+)`\s*\|(.*)$", line)
        if inside and m:
            for key in expand(re.sub(r"<[^>]+>", "<*>", m.group(1))):
                rows[key] = m.group(2)
    if not rows:
        errors.append("docs/CONFIG.md: no key index (a table of `key` rows under '## Every key')")
    accepted = parser_keys(root)
    for key in sorted(set(accepted) - set(rows)):
        errors.append(f"docs/CONFIG.md: key `{key}` is accepted by the config parser but not in the key index")
    for key in sorted(set(rows) - set(accepted)):
        errors.append(f"docs/CONFIG.md: key `{key}` is in the key index but the config parser has no such key")
    for key, values in accepted.items():
        for v in values or ():
            if key in rows and f"`{v}`" not in rows[key]:
                errors.append(f"docs/CONFIG.md: key `{key}`: value `{v}` is accepted but not in its row")


# ---------------------------------------------------------------- driver


def check(root, packages):
    errors = []
    for doc in doc_files(root):
        prose, code = split_code(doc.read_text())
        check_links(root, doc, prose, errors)
        check_scripts(root, doc, code, errors)
        check_cargo(root, doc, code, packages, errors)
        check_names(root, doc, code, errors)
    check_operations(root, errors)
    check_config(root, errors)
    return errors


def self_test(packages):
    """A small tree with one planted fault per check: each must be found."""
    pkg = sorted(packages)[0]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="check_docs."))
    try:
        (tmp / "docs").mkdir()
        (tmp / "ci").mkdir()
        (tmp / "ci" / "real.sh").write_text("")
        (tmp / "ops" / "prometheus").mkdir(parents=True)
        (tmp / "ops" / "prometheus" / "alerts.yml").write_text(
            "groups:\n  - rules:\n      - alert: SpateOne\n      - alert: SpateTwo\n")
        (tmp / "engine" / "spate" / "src" / "config").mkdir(parents=True)
        (tmp / "engine" / "spate" / "src" / "config.rs").write_text(
            "#[derive(Deserialize)]\npub struct Config {\n    pub admin: AdminSection,\n    pub mode: Mode,\n}\n"
            "#[derive(Deserialize)]\npub struct AdminSection {\n    pub listen: String,\n    pub port: u16,\n}\n"
            "#[derive(Deserialize)]\n#[serde(rename_all = \"lowercase\")]\npub enum Mode {\n    Fast,\n    Slow,\n}\n")
        (tmp / "engine" / "spate" / "src" / "config" / "pipelines.rs").write_text('"pipelines" "fail_process"')
        (tmp / "engine" / "spate" / "src" / "config" / "tables.rs").write_text(
            '"tables" "table" "database" "shard_key" "mapping"')
        (tmp / "engine" / "spate" / "src" / "lib.rs").write_text("fn a_test_that_still_exists_here() {}")
        extra = "".join(f"| `{k}` | x |\n" for k in EXTRA_KEYS)
        good = {
            "README.md": "# T\n\n## A b\n\n[ok](docs/OPERATIONS.md#alerts) [self](#a-b)\n\n"
                         f"```sh\nbash ci/real.sh\ncargo test -p {pkg}\n```\n\n`a_test_that_still_exists_here`\n",
            "docs/OPERATIONS.md": "# O\n\n## Alerts\n\n| alert |\n|---|\n| `SpateOne` |\n| `SpateTwo` |\n",
            "docs/CONFIG.md": "# C\n\n## Every key\n\n| key | what |\n|---|---|\n| `admin.listen` | x |\n"
                              "| `admin.port` | x |\n| `mode` | `fast` or `slow` |\n" + extra,
        }
        faults = {
            "a broken link": ("README.md", "[x](docs/NOPE.md)", "NOPE.md does not exist"),
            "a broken anchor": ("README.md", "[x](docs/OPERATIONS.md#nope)", "no heading with anchor #nope"),
            "a broken anchor in the same file": ("README.md", "[x](#nope)", "no heading with anchor #nope"),
            "a missing script": ("README.md", "`bash ci/nope.sh`", "ci/nope.sh does not exist"),
            "an unknown package": ("README.md", "`cargo test -p no-such-crate`", "no workspace package no-such-crate"),
            "an unknown test target": ("README.md", f"`cargo test -p {pkg} --test no_such_test`",
                                       "no test target no_such_test"),
            "a test name that does not exist": ("README.md", "`a_test_that_was_renamed_long_ago`",
                                                "`a_test_that_was_renamed_long_ago` is in no Rust source"),
            "an unknown feature": ("README.md", f"`cargo build -p {pkg} --features no-such-feature`",
                                   "no feature no-such-feature"),
            "an alert missing from the table": ("docs/OPERATIONS.md", None, "alert SpateTwo of"),
            "a key missing from the index": ("docs/CONFIG.md", None, "key `admin.port` is accepted"),
            "an enum value missing from its row": ("docs/CONFIG.md", "", "value `slow` is accepted"),
        }
        drops = {"an alert missing from the table": "| `SpateTwo` |\n",
                 "a key missing from the index": "| `admin.port` | x |\n",
                 "an enum value missing from its row": " or `slow`"}

        def write(files):
            for rel, text in files.items():
                (tmp / rel).write_text(text)

        write(good)
        clean = check(tmp, packages)
        if clean:
            raise SystemExit("check_docs: self-test: the clean tree failed:\n  " + "\n  ".join(clean))
        for what, (rel, add, expect) in faults.items():
            files = dict(good)
            if what in drops:
                files[rel] = files[rel].replace(drops[what], "")
            if add:
                files[rel] = files[rel] + "\n" + add + "\n"
            write(files)
            found = check(tmp, packages)
            if not any(expect in e for e in found):
                raise SystemExit(f"check_docs: self-test: {what} was not reported (got {found})")
            write(good)
        return len(faults)
    finally:
        shutil.rmtree(tmp)


def main():
    packages = metadata(ROOT)
    if "--no-self-test" not in sys.argv:
        n = self_test(packages)
        print(f"check_docs: self-test: each of {n} planted faults reported, the clean tree passes")
    errors = check(ROOT, packages)
    for e in errors:
        print("check_docs: " + e, file=sys.stderr)
    if errors:
        sys.exit(1)
    docs = doc_files(ROOT)
    print(f"check_docs: {len(docs)} docs: links, anchors, scripts, cargo commands, "
          f"alert and dashboard tables, {len(parser_keys(ROOT))} config keys: all resolve")


if __name__ == "__main__":
    main()
