#!/usr/bin/env python3
"""Decode spate's RowBinary and Native with a current ClickHouse engine (chdb-core).

ClickHouse 18.16, the server the real-server tests run against, lacks
DateTime64, Map, Bool, Date32, Int128/256, IPv4/IPv6 and Decimal256, and
needs a setting for LowCardinality. For those types this script lets a
current engine's own RowBinary parser read what spate's encoder wrote:

    cargo test -p spate-clickhouse --test it chdb_fixtures   # writes the cases
    python3 ci/chdb_check.py [DIR]                         # DIR: target/chdb

Every case is DIR/<case>.bin (RowBinary rows) plus DIR/<case>.json
({"case", "schema", "inputs", "expected"}); DIR/router.json instead holds
the shard router's vectors ({"case", "hash_vectors": [{"key", "hash",
"shards": {"N": shard}}]}), recomputed as xxHash64(key) % N. The check runs

    SELECT * FROM file('<case>.bin', 'RowBinary', '<schema>') FORMAT JSONEachRow
    SELECT * FROM file('<case>.native', 'Native') FORMAT JSONEachRow
    DESCRIBE file('<case>.native', 'Native')   -- the block's declared types

(64-bit and wider integers and decimals quoted, decimals with all their
scale digits) and compares each row with
the expected one, printing both sides. Exit status: 0 when every case
matches, 1 on any mismatch or decode error, 2 when there is nothing to check
or chdb cannot be set up.

chdb-core is imported from the running Python if it has it; otherwise it is
installed (pip) into a virtual environment DIR/venv (about 530 MB) and the
script re-runs itself there.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chdb_venv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = (
    "output_format_json_quote_64bit_integers = 1, "
    "output_format_json_quote_decimals = 1, "
    "output_format_decimal_trailing_zeros = 1"
)


def ensure_chdb(case_dir):
    """Returns the chdb module, installing chdb-core into DIR/venv if needed."""
    env_dir = os.environ.get("SPATE_CHDB_VENV") or os.path.join(case_dir, "venv")
    return chdb_venv.ensure_chdb(__file__, sys.argv[1:], env_dir, "chdb_check")


def sql_string(s):
    """A ClickHouse single-quoted string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_router(chdb, vectors):
    """The shard router's formula recomputed in SQL: xxHash64(key) % shards."""
    print("\n== router: xxHash64(key) and xxHash64(key) % shards")
    failures = ok = 0
    for v in vectors:
        shard_cols = ", ".join(
            f"toUInt64(xxHash64(k) % {n}) AS s{n}" for n in sorted(v["shards"], key=int)
        )
        out = chdb.query(
            f"SELECT toString(xxHash64(k)) AS hash, {shard_cols} FROM (SELECT {sql_string(v['key'])} AS k) "
            f"SETTINGS output_format_json_quote_64bit_integers = 0",
            "JSONEachRow",
        ).bytes().decode()
        got = json.loads(out)
        want = {"hash": v["hash"], **{f"s{n}": s for n, s in v["shards"].items()}}
        status = "ok" if got == want else "MISMATCH"
        print(f"  key {json.dumps(v['key'], ensure_ascii=False)} {status}: ClickHouse {got}")
        if got != want:
            print(f"    spate    {want}")
            failures += 1
        else:
            ok += 1
    return failures, ok


def main():
    case_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "chdb"))
    manifests = sorted(
        f for f in os.listdir(case_dir) if f.endswith(".json")
    ) if os.path.isdir(case_dir) else []
    if not manifests:
        print(
            f"chdb_check: no cases in {case_dir}; run "
            "`cargo test -p spate-clickhouse --test it chdb_fixtures` first",
            file=sys.stderr,
        )
        return 2
    chdb = ensure_chdb(case_dir)
    version = chdb.query("SELECT version()", "TSV").bytes().decode().strip()
    print(f"chdb_check: ClickHouse {version} (chdb-core) decoding {len(manifests)} cases from {case_dir}")

    failures = 0
    rows_ok = 0
    for name in manifests:
        with open(os.path.join(case_dir, name), encoding="utf-8") as f:
            case = json.load(f)
        if "hash_vectors" in case:
            f, n = check_router(chdb, case["hash_vectors"])
            failures += f
            rows_ok += n
            continue
        path = os.path.join(case_dir, case["case"] + ".bin")
        native = os.path.join(case_dir, case["case"] + ".native")
        row_fmt = case.get("format", "RowBinary")
        queries = [
            (row_fmt, f"SELECT * FROM file({sql_string(path)}, {sql_string(row_fmt)}, {sql_string(case['schema'])}) "
             f"SETTINGS {SETTINGS}"),
        ]
        if case.get("clickhouse_parses_inputs"):
            # ClickHouse's own reading of the same JSON must give the same
            # rows (a check of spate's rules, not only of its encoding).
            own = chdb.query(
                f"SELECT * FROM format(JSONEachRow, {sql_string(case['schema'])}, "
                f"{sql_string(chr(10).join(case['inputs']))}) SETTINGS {SETTINGS}",
                "JSONEachRow",
            ).bytes().decode()
            own_rows = [json.loads(line) for line in own.splitlines() if line.strip()]
            if own_rows != case["expected"]:
                print(f"\n== {case['case']}: MISMATCH: ClickHouse parses the inputs as")
                for r in own_rows:
                    print(f"    {json.dumps(r, ensure_ascii=False, sort_keys=True)}")
                failures += 1
            else:
                print(f"\n== {case['case']}: ClickHouse's own JSON parse of the inputs agrees")
        if row_fmt != "RowBinary":
            # Native has no per-row defaults: such plans insert in their own
            # row format, so there is no Native file to check.
            pass
        elif os.path.exists(native):
            # The block names its own columns and types; the schema is the
            # check that they are the ones spate was given.
            queries.append(("Native", f"SELECT * FROM file({sql_string(native)}, 'Native') SETTINGS {SETTINGS}"))
            queries.append(("Native structure", f"DESCRIBE file({sql_string(native)}, 'Native')"))
        else:
            print(f"  MISSING: {native} (the fixtures predate the Native transcoder?)")
            failures += 1
        for fmt, query in queries:
            print(f"\n== {case['case']} ({fmt}): {case['schema']}")
            try:
                out = chdb.query(query, "JSONEachRow").bytes().decode()
            except Exception as e:  # chdb raises its own error types
                print(f"  DECODE ERROR: {e}")
                failures += 1
                continue
            got = [json.loads(line) for line in out.splitlines() if line.strip()]
            if fmt == "Native structure":
                # Compared as the engine normalises both (enum order, tuple layout).
                want_out = chdb.query(
                    f"DESCRIBE file({sql_string(path)}, {sql_string(row_fmt)}, {sql_string(case['schema'])})",
                    "JSONEachRow",
                ).bytes().decode()
                want_cols = [(c["name"], c["type"]) for c in map(json.loads, want_out.splitlines()) if c]
                got_cols = [(c["name"], c["type"]) for c in got]
                status = "ok" if got_cols == want_cols else "MISMATCH"
                print(f"  {status}: block declares {got_cols}")
                if got_cols != want_cols:
                    print(f"    schema   {want_cols}")
                    failures += 1
                continue
            want = case["expected"]
            if len(got) != len(want):
                print(f"  MISMATCH: {len(got)} rows decoded, {len(want)} expected")
                failures += 1
            for i, (g, w, src) in enumerate(zip(got, want, case["inputs"])):
                status = "ok" if g == w else "MISMATCH"
                print(f"  row {i + 1} {status}")
                print(f"    input    {src}")
                print(f"    decoded  {json.dumps(g, ensure_ascii=False, sort_keys=True)}")
                if g != w:
                    print(f"    expected {json.dumps(w, ensure_ascii=False, sort_keys=True)}")
                    failures += 1
                else:
                    rows_ok += 1
    print()
    if failures:
        print(f"chdb_check: FAILED: {failures} mismatches ({rows_ok} rows matched)")
        return 1
    print(f"chdb_check: ok: {rows_ok} rows in {len(manifests)} cases decoded as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
