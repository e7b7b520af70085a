#!/usr/bin/env python3
"""Runs the test binaries `cargo test --no-run` built, in two lanes side by side.

ci/test.sh builds every test binary once (`cargo test --workspace ...
--no-run --message-format=json-render-diagnostics > FILE`) and hands FILE
here. `cargo test` would then run the binaries one after another; most of the
time would go to the binaries that wait on real servers, with a core idle.
This runs them in two lanes at once:

- servers: the integration tests of every package not named in LOCAL (spate,
  spate-clickhouse, and any package added later), one binary at a time, by
  package and target name. They share the ClickHouse, Kafka, registry and chdb servers
  ci/test.sh starts; within one binary, spate_testkit::serial keeps the tests
  that freeze or kill a server apart from the others. Two binaries of this
  lane never run at once (they do not share such a lock).
- local: every unit-test binary (src/), and the integration tests of the
  LOCAL packages, which use no shared server (the simulator, the scripted
  source, librdkafka's in-process mock cluster, a registry fixture of the
  test's own).

Each binary runs as `cargo test` runs it: in its package's directory, with
CARGO_MANIFEST_DIR, CARGO_PKG_NAME and the other variables cargo sets, and
the arguments given after `--` (e.g. `--nocapture`). The servers lane's output
is streamed as it comes; a local binary's output is printed whole when it
ends. At the end: one line per binary (lane, seconds, result) and the totals.
Exit status 1 when a binary failed (no new binary starts after a failure;
running ones finish), 2 on bad input.

    python3 ci/run_tests.py FILE lanes [-- ARGS]      all test binaries, both lanes
    python3 ci/run_tests.py FILE run PKG TARGET [-- ARGS]
                                                     one binary (e.g. spate it -- e2e::)
    python3 ci/run_tests.py FILE benches              the bench binaries in test mode
                                                     (criterion runs each bench once)
    python3 ci/run_tests.py FILE example NAME         print the path of example NAME's binary
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

# Packages whose integration tests use no real server.
LOCAL = {
    "spate-benches",
    "spate-core",
    "spate-formats",  # its registry tests start a fixture of their own
    "spate-http",
    "spate-kafka",
    "spate-row",
    "spate-sim",
    "spate-testkit",
    "spate-verify",
}

# More test threads than the 2 cores for the binaries whose tests mostly
# wait (on servers, rebalances, drains, the mock cluster's 3 s group join);
# the tests that must not overlap say so themselves (spate_testkit::serial).
# RUST_TEST_THREADS, when set, wins. spate-kafka's binary: 119 s with 2
# threads, 64 s with 4 (measured on this machine, loaded); spate's, with
# effectively_once and real_kafka's steady scenarios no longer alone: 408 s
# with 3 threads, 417 s with 4 (fresh-clone CIs, 2026-12-02: the servers,
# not the threads, are the limit).
THREADS = {("spate", "it"): 3, ("spate-kafka", "it"): 4}

OUT = threading.Lock()


def say(text):
    with OUT:
        sys.stdout.write(text)
        sys.stdout.flush()


class Binary:
    def __init__(self, msg):
        target = msg["target"]
        self.kind = target["kind"][0]
        self.name = target["name"]
        self.path = msg["executable"]
        self.manifest = msg["manifest_path"]
        self.pkg, self.version = package_of(msg["package_id"])
        self.test = msg["profile"]["test"]
        self.seconds = 0.0
        self.rc = None
        self.counts = [0, 0, 0]  # passed, failed, ignored

    def label(self):
        what = "unittests" if self.kind in ("lib", "bin", "proc-macro") else self.kind
        return f"{self.pkg} {what} {self.name}"

    def env(self):
        env = dict(os.environ)
        version = self.version.split("-")[0].split(".") + ["", "", ""]
        env.update(
            {
                "CARGO_MANIFEST_DIR": os.path.dirname(self.manifest),
                "CARGO_MANIFEST_PATH": self.manifest,
                "CARGO_PKG_NAME": self.pkg,
                "CARGO_PKG_VERSION": self.version,
                "CARGO_PKG_VERSION_MAJOR": version[0],
                "CARGO_PKG_VERSION_MINOR": version[1],
                "CARGO_PKG_VERSION_PATCH": version[2],
                "CARGO_CRATE_NAME": self.name.replace("-", "_"),
                "CARGO": env.get("CARGO") or shutil.which("cargo") or "cargo",
            }
        )
        deps = os.path.dirname(self.path)
        env["LD_LIBRARY_PATH"] = deps + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        return env

    def run(self, args, stream, extra_env=None):
        """Runs the binary; streams its output (stream=True) or returns it."""
        env = self.env()
        env.update(extra_env or {})
        threads = THREADS.get((self.pkg, self.name))
        if threads and self.kind == "test" and "RUST_TEST_THREADS" not in env:
            args = [f"--test-threads={threads}", *args]
        header = f"\n     Running {self.label()} ({os.path.relpath(self.path)}){' ' + ' '.join(args) if args else ''}\n"
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [self.path, *args],
            cwd=os.path.dirname(self.manifest),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        lines = []
        if stream:
            say(header)
        for line in proc.stdout:
            lines.append(line)
            if stream:
                say(line)
            m = re.match(r"test result: \S+\. (\d+) passed; (\d+) failed; (\d+) ignored", line)
            if m:
                self.counts = [a + int(b) for a, b in zip(self.counts, m.groups())]
        self.rc = proc.wait()
        self.seconds = time.monotonic() - t0
        if not stream:
            say(header + "".join(lines))
        return self.rc


def package_of(package_id):
    """(name, version) from a cargo package id: `path+file:///dir#name@1.0`,
    or `path+file:///dir/name#1.0` when the name is the directory's."""
    url, _, frag = package_id.partition("#")
    if "@" in frag:
        name, _, version = frag.partition("@")
    else:
        name, version = url.rstrip("/").rsplit("/", 1)[-1], frag
    return name, version


def load(path):
    """The binaries of a cargo --message-format=json stream, in its order."""
    bins, seen = [], set()
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
                continue
            b = Binary(msg)
            if b.path not in seen:
                seen.add(b.path)
                bins.append(b)
    return bins


def lane_of(b):
    if b.kind in ("lib", "bin", "proc-macro") or b.pkg in LOCAL:
        return "local"
    return "servers"


def summary(done):
    say("\n== test binaries (lane, seconds, result) ==\n")
    for lane, b in done:
        result = "ok" if b.rc == 0 else ("FAILED" if b.rc is not None else "not run")
        p, f, i = b.counts
        say(f"{lane:8} {b.seconds:7.1f} s  {result:7} {p:4} passed {f:3} failed {i:3} ignored  {b.label()}\n")
    totals = [sum(b.counts[k] for _, b in done) for k in range(3)]
    say(f"total: {totals[0]} passed, {totals[1]} failed, {totals[2]} ignored in {len(done)} binaries\n")


def lanes(bins, args):
    rank = {"lib": 0, "bin": 1, "test": 2}
    tests = sorted(
        (b for b in bins if b.test and b.kind != "bench"),
        key=lambda b: (b.pkg, rank.get(b.kind, 3), b.name),
    )
    by_lane = {"servers": [], "local": []}
    for b in tests:
        by_lane[lane_of(b)].append(b)
    failed = threading.Event()
    done = []

    def run_lane(lane):
        for b in by_lane[lane]:
            if failed.is_set():
                break
            if b.run(args, stream=lane == "servers") != 0:
                failed.set()
            done.append((lane, b))

    threads = [threading.Thread(target=run_lane, args=(lane,)) for lane in by_lane]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summary(done)
    bad = [b.label() for _, b in done if b.rc != 0]
    if bad:
        say("failed: " + ", ".join(bad) + "\n")
        return 1
    return 0


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    args = []
    if "--" in argv:
        i = argv.index("--")
        argv, args = argv[:i], argv[i + 1 :]
    bins = load(argv[1])
    cmd = argv[2]
    if cmd == "lanes":
        return lanes(bins, args)
    if cmd == "run" and len(argv) == 5:
        found = [b for b in bins if b.test and b.pkg == argv[3] and b.name == argv[4]]
        if len(found) != 1:
            print(f"run_tests: no single test binary {argv[3]} {argv[4]} in {argv[1]}", file=sys.stderr)
            return 2
        rc = found[0].run(args, stream=True)
        summary([("servers", found[0])])
        return 0 if rc == 0 else 1
    if cmd == "benches":
        benches = [b for b in bins if b.kind == "bench"]
        if not benches:
            print(f"run_tests: no bench binaries in {argv[1]}", file=sys.stderr)
            return 2
        done = []
        for b in benches:
            b.run(args, stream=True)
            done.append(("benches", b))
            if b.rc != 0:
                break
        summary(done)
        return 0 if all(b.rc == 0 for _, b in done) else 1
    if cmd == "example" and len(argv) == 4:
        found = [b for b in bins if b.kind == "example" and b.name == argv[3]]
        if len(found) != 1:
            print(f"run_tests: not one example {argv[3]} in {argv[1]}: {len(found)}", file=sys.stderr)
            return 2
        print(found[0].path)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
