//! spate against a current ClickHouse engine (chdb-core 26.9) behind
//! `ci/chdb_server.py`, the test endpoint whose HTTP layer is ours and whose
//! engine is real (its header says what that proves and what not).
//! `SPATE_CHDB_URLS` names the endpoint's ports (`url1,url2`: two ports of
//! one process, one chdb session, so two "replicas" of one table);
//! ci/test.sh starts it. Without it each test prints
//! `skipped: SPATE_CHDB_URLS not set` and passes.
//!
//! - Tokens (D4): an insert whose reply the endpoint drops after executing
//!   it is retried with the same `insert_deduplication_token`, and a
//!   MergeTree with `non_replicated_deduplication_window` keeps the rows
//!   once: the row count is exact. A second run (a new run nonce, same
//!   pipeline name, sequence numbers from 0 again) inserts its new rows.
//!   With two replicas the retry goes to the other port.
//! - Types 18.16 lacks, through the real binary and the real engine: each
//!   case's JSON, `spate run`, `SELECT ... FORMAT JSONEachRow`, compared with
//!   the value written here; out-of-range values are skipped record errors.
//! - The schema probe on a current `system.columns`, and a column added by
//!   `ALTER` while spate runs.

use crate::common;

use common::*;
use serde_json::{Value, json};
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
use spate_row::schema::{DefaultKind, InsertOptions, plan_insert};

/// The endpoint's URLs, or `None` after printing why the test is skipped.
fn chdb_urls() -> Option<Vec<String>> {
    match std::env::var("SPATE_CHDB_URLS") {
        Ok(u) if !u.trim().is_empty() => {
            // A claim like the servers' (the runs that need both cores run
            // alone: spate_testkit::serial).
            spate_testkit::serial::shared(Resource::Chdb);
            Some(u.split(',').map(|s| s.trim().to_owned()).collect())
        }
        _ => {
            println!("skipped: SPATE_CHDB_URLS not set");
            None
        }
    }
}

/// SQL at the endpoint through spate's own HTTP client.
struct Chdb {
    rt: tokio::runtime::Runtime,
    ch: HttpWriter,
    url: String,
}

impl Chdb {
    fn new(url: &str, table: &str) -> Chdb {
        Chdb {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            ch: HttpWriter::new(HttpWriterConfig::new("default", table, Vec::new())),
            url: url.to_owned(),
        }
    }

    fn query(&self, sql: &str) -> String {
        self.rt
            .block_on(self.ch.query(&self.url, sql))
            .unwrap_or_else(|e| panic!("{}: {sql}: {e}", self.url))
    }

    fn number(&self, sql: &str) -> u64 {
        self.query(sql).trim().parse().unwrap()
    }

    /// The endpoint's test switches (`/_chdb/fault?...`).
    fn fault(&self, params: &str) {
        let port: u16 = self.url.rsplit(':').next().unwrap().parse().unwrap();
        let (status, body) = get(port, &format!("/_chdb/fault?{params}")).unwrap();
        assert_eq!(status, 200, "{body}");
    }

    /// Every INSERT the endpoint saw, oldest first.
    fn inserts(&self) -> Vec<Value> {
        let port: u16 = self.url.rsplit(':').next().unwrap().parse().unwrap();
        let (status, body) = get(port, "/_chdb/inserts").unwrap();
        assert_eq!(status, 200, "{body}");
        body.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// [`config`] pointed at `replicas` (one shard), whatever
/// `SPATE_CLICKHOUSE_URL` says (ci/test.sh sets it to the 18.16 server).
fn chdb_config(feed: &Feed, replicas: &[String], table: &str, on_error: &str) -> String {
    let yaml = feed.config("X", table, on_error);
    let quoted: Vec<String> = replicas.iter().map(|u| format!("\"{u}\"")).collect();
    let out = yaml.replace(
        "[[\"${SPATE_CLICKHOUSE_URL:-X}\"]]",
        &format!("[[{}]]", quoted.join(", ")),
    );
    assert_ne!(out, yaml, "the shard list was rewritten");
    out
}

fn flights_table(db: &Chdb, name: &str) {
    db.query(&format!("DROP TABLE IF EXISTS default.{name}"));
    db.query(&format!(
        "CREATE TABLE default.{name} (id UInt64, date DateTime, delay Int32, distance UInt32, \
         origin String, destination String) ENGINE = MergeTree ORDER BY id \
         SETTINGS non_replicated_deduplication_window = 1000"
    ));
}

/// Runs spate over `lines` (already produced) until every offset is
/// committed, then SIGTERM; asserts a clean exit.
fn run_until_committed(test: &str, yaml: &str, feed: &Feed) {
    let spate = Spate::start(test, yaml);
    feed.await_commits(&spate);
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "stdout: {out}\nlog: {logs}");
}

/// D4 on one replica and on two: dropped replies, retried with the same
/// token, exact counts; a second run's new nonce inserts new rows; a column
/// added by ALTER between the runs does not disturb the INSERT.
fn tokens_case(replicas: &[String], test: &str) {
    let table = format!("spate_chdb_{test}_{}", std::process::id());
    let db = Chdb::new(&replicas[0], &table);
    flights_table(&db, &table);
    let rows = 2_000u64;
    let feed = Feed::mock("flights", 4, &format!("chdb-{test}"));
    feed.produce_flights(0..rows);
    let seen_before = db.inserts().len();
    // The first two inserts land and lose their reply: spate sees an
    // ambiguous write and retries the same bytes with the same token.
    db.fault(&format!("table=default.{table}&drop=2"));
    let yaml = chdb_config(&feed, replicas, &table, "{ policy: fail }");
    run_until_committed(test, &yaml, &feed);
    let count = db.number(&format!("SELECT count() FROM default.{table}"));
    let distinct = db.number(&format!("SELECT uniqExact(id) FROM default.{table}"));
    let ours: Vec<Value> = db.inserts()[seen_before..]
        .iter()
        .filter(|i| i["table"] == format!("default.{table}"))
        .cloned()
        .collect();
    let dropped: Vec<&Value> = ours.iter().filter(|i| i["outcome"] == "dropped").collect();
    assert_eq!(dropped.len(), 2, "two replies dropped: {ours:?}");
    for d in &dropped {
        let token = &d["settings"]["insert_deduplication_token"];
        assert!(token.is_string(), "the dropped insert carried a token: {d}");
        let same: Vec<&Value> = ours
            .iter()
            .filter(|i| &i["settings"]["insert_deduplication_token"] == token)
            .collect();
        assert!(
            same.iter().any(|i| i["outcome"] == "ok"),
            "token {token} retried until it succeeded: {ours:?}"
        );
        if replicas.len() > 1 {
            assert!(
                same.iter().any(|r| r["port"] != d["port"]),
                "a retry went to the other replica: {ours:?}"
            );
        }
    }
    println!(
        "{test}: {} inserts, {count} rows for {rows} produced",
        ours.len()
    );
    assert_eq!(
        (count, distinct),
        (rows, rows),
        "exactly once despite the dropped replies"
    );

    // A column added while the table is in use (between two runs here;
    // the INSERT names its columns, so nothing shifts), then a second run
    // over new rows: its tokens reuse the pipeline name and sequence
    // numbers from 0, only the run nonce differs.
    db.query(&format!(
        "ALTER TABLE default.{table} ADD COLUMN late String DEFAULT 'filled'"
    ));
    feed.produce_flights(rows..2 * rows);
    run_until_committed(test, &yaml, &feed);
    let count = db.number(&format!("SELECT count() FROM default.{table}"));
    let distinct = db.number(&format!("SELECT uniqExact(id) FROM default.{table}"));
    assert_eq!(
        (count, distinct),
        (2 * rows, 2 * rows),
        "the second run's rows are new rows"
    );
    let filled = db.number(&format!(
        "SELECT countIf(late = 'filled') FROM default.{table}"
    ));
    assert_eq!(filled, 2 * rows, "the server filled the ALTER's DEFAULT");
    db.query(&format!("DROP TABLE default.{table}"));
}

#[test]
fn dropped_replies_are_retried_with_the_same_token_exactly_once() {
    let Some(urls) = chdb_urls() else {
        return;
    };
    tokens_case(&urls[..1], "tok1");
}

#[test]
fn dropped_replies_retried_on_the_other_replica_exactly_once() {
    let Some(urls) = chdb_urls() else {
        return;
    };
    assert!(urls.len() >= 2, "SPATE_CHDB_URLS names two ports: {urls:?}");
    tokens_case(&urls[..2], "tok2");
}

/// The schema probe reads a current `system.columns`: default kinds, type
/// text with wrappers and time zones, a column added by ALTER.
#[test]
fn schema_probe_reads_a_current_system_columns() {
    let Some(urls) = chdb_urls() else {
        return;
    };
    let table = format!("spate_chdb_probe_{}", std::process::id());
    let db = Chdb::new(&urls[0], &table);
    db.query(&format!("DROP TABLE IF EXISTS default.{table}"));
    db.query(&format!(
        "CREATE TABLE default.{table} (id UInt64, \
         t DateTime64(3, 'UTC'), \
         lc LowCardinality(Nullable(String)), \
         n Nullable(Int32), \
         status String DEFAULT 'n/a', \
         seen DateTime DEFAULT now(), \
         day Date MATERIALIZED toDate(t), \
         id2 UInt64 ALIAS id * 2, \
         raw String EPHEMERAL) \
         ENGINE = MergeTree ORDER BY id"
    ));
    let writer = HttpWriter::new(HttpWriterConfig::new("default", &table, Vec::new()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let schema = rt.block_on(writer.table_schema(&urls[0])).unwrap();
    let got: Vec<(&str, &str, DefaultKind, &str)> = schema
        .columns
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.type_text.as_str(),
                c.default_kind,
                c.default_expression.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("id", "UInt64", DefaultKind::None, ""),
            ("t", "DateTime64(3, 'UTC')", DefaultKind::None, ""),
            (
                "lc",
                "LowCardinality(Nullable(String))",
                DefaultKind::None,
                ""
            ),
            ("n", "Nullable(Int32)", DefaultKind::None, ""),
            ("status", "String", DefaultKind::Default, "'n/a'"),
            ("seen", "DateTime", DefaultKind::Default, "now()"),
            ("day", "Date", DefaultKind::Materialized, "toDate(t)"),
            ("id2", "UInt64", DefaultKind::Alias, "id * 2"),
            // A current server shows EPHEMERAL's implicit default.
            (
                "raw",
                "String",
                DefaultKind::Ephemeral,
                "defaultValueOfTypeName('String')"
            ),
        ]
    );
    let plan = plan_insert(&schema, &InsertOptions::default()).unwrap();
    let names: Vec<&str> = plan.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["id", "t", "lc", "n", "status", "seen"],
        "DEFAULT columns named (a field present in the record lands); MATERIALIZED, ALIAS, \
         EPHEMERAL never named"
    );

    db.query(&format!(
        "ALTER TABLE default.{table} ADD COLUMN added Map(String, UInt64) AFTER n"
    ));
    let schema = rt.block_on(writer.table_schema(&urls[0])).unwrap();
    let added = schema
        .columns
        .iter()
        .position(|c| c.name == "added")
        .expect("added column");
    assert_eq!(
        added, 4,
        "system.columns keeps table order after ALTER ... AFTER"
    );
    assert_eq!(schema.columns[added].type_text, "Map(String, UInt64)");
    let plan = plan_insert(&schema, &InsertOptions::default()).unwrap();
    let names: Vec<&str> = plan.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["id", "t", "lc", "n", "added", "status", "seen"]);
    db.query(&format!("DROP TABLE default.{table}"));

    // A type spate cannot encode stops the plan naming column and type.
    db.query(&format!(
        "CREATE TABLE default.{table}_dyn (id UInt64, d Dynamic) ENGINE = MergeTree ORDER BY id"
    ));
    let writer = HttpWriter::new(HttpWriterConfig::new(
        "default",
        format!("{table}_dyn"),
        Vec::new(),
    ));
    let schema = rt.block_on(writer.table_schema(&urls[0])).unwrap();
    let e = plan_insert(&schema, &InsertOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`d`") && e.contains("`Dynamic`"), "{e}");
    db.query(&format!("DROP TABLE default.{table}_dyn"));
}

/// The type round trip's table: every type spate encodes that 18.16 lacks
/// (and a few it has, in their current spelling).
const TYPES_TABLE: &str = "id UInt64, \
    lc LowCardinality(String), \
    lcn LowCardinality(Nullable(String)), \
    alc Array(LowCardinality(Nullable(String))), \
    t0 DateTime64(0, 'UTC'), t3 DateTime64(3, 'UTC'), t6 DateTime64(6, 'UTC'), t9 DateTime64(9, 'UTC'), \
    tn Nullable(DateTime64(3, 'UTC')), \
    d32 Date32, \
    m Map(String, Nullable(Float64)), \
    b Bool, \
    ip4 IPv4, ip6 IPv6, u UUID, \
    i128 Int128, u256 UInt256, \
    d9 Decimal(9, 2), d18 Decimal(18, 4), d38 Decimal(38, 10), d76 Decimal(76, 20), \
    e8 Enum8('a' = 1, 'b' = -2), e16 Enum16('x' = 1000, 'y' = -1000), \
    fs FixedString(4), \
    tup Tuple(name String, n UInt8), \
    nest Nested(k String, v UInt32), \
    af Array(Nullable(Float64)), \
    j JSON, jp JSON";

/// A valid record (every column) and what the engine reads back for it.
fn base() -> (Value, Value) {
    let input = json!({
        "lc": "cat", "lcn": "dog", "alc": ["a", null, "b"],
        "t0": "2018-02-07 01:26:13", "t3": "2018-02-07 01:26:13.840",
        "t6": "2018-02-07 01:26:13.840123", "t9": "2018-02-07 01:26:13.840123456",
        "tn": null, "d32": "1950-06-01", "m": {"k": 1.5, "z": null}, "b": true,
        "ip4": "10.1.2.3", "ip6": "2001:db8::1", "u": "61f0c404-5cb3-11e7-907b-a6006ad3dba0",
        "i128": "-1", "u256": "1",
        "d9": "1.50", "d18": "-2.0001", "d38": "3.1415926535", "d76": "0.00000000000000000001",
        "e8": "a", "e16": "x", "fs": "abcd", "tup": {"name": "x", "n": 3},
        "nest.k": ["p", "q"], "nest.v": [1, 2], "af": [1.5, null, -2],
        "j": {"a": 1, "b": {"c": "x"}, "l": [1, 2]}, "meta": {"props": {"k": "v"}, "other": 1}
    });
    let expected = json!({
        "lc": "cat", "lcn": "dog", "alc": ["a", null, "b"],
        "t0": "2018-02-07 01:26:13", "t3": "2018-02-07 01:26:13.840",
        "t6": "2018-02-07 01:26:13.840123", "t9": "2018-02-07 01:26:13.840123456",
        "tn": null, "d32": "1950-06-01", "m": {"k": 1.5, "z": null}, "b": true,
        "ip4": "10.1.2.3", "ip6": "2001:db8::1", "u": "61f0c404-5cb3-11e7-907b-a6006ad3dba0",
        "i128": "-1", "u256": "1",
        "d9": "1.50", "d18": "-2.0001", "d38": "3.1415926535", "d76": "0.00000000000000000001",
        "e8": "a", "e16": "x", "fs": "abcd", "tup": {"name": "x", "n": 3},
        "nest.k": ["p", "q"], "nest.v": [1, 2], "af": [1.5, null, -2],
        "j": {"a": "1", "b": {"c": "x"}, "l": ["1", "2"]}, "jp": {"k": "v"}
    });
    (input, expected)
}

/// (fields changed from the base record, `Some(expected read-back of those
/// fields)` or `None`: a record error, skipped by policy).
fn type_cases() -> Vec<(Value, Option<Value>)> {
    let big_i128 = "170141183460469231731687303715884105727";
    let u256_max = "115792089237316195423570985008687907853269984665640564039457584007913129639935";
    let d76_max = format!("{}.{}", "9".repeat(56), "9".repeat(20));
    vec![
        // DateTime64 from epoch seconds, milliseconds, microseconds, nanoseconds.
        (
            json!({"t0": 1517966773, "t3": 1517966773840u64, "t6": 1517966773840123u64, "t9": 1517966773840123456u64}),
            Some(
                json!({"t0": "2018-02-07 01:26:13", "t3": "2018-02-07 01:26:13.840",
                        "t6": "2018-02-07 01:26:13.840123", "t9": "2018-02-07 01:26:13.840123456"}),
            ),
        ),
        // Epoch seconds into finer columns; fractional seconds (digits
        // finer than the column are floored, as ClickHouse's parser does).
        (
            json!({"t0": 1517966773.9, "t3": 1517966773.84, "t6": 1517966773, "t9": "#raw:1517966773.000000001"}),
            Some(
                json!({"t0": "2018-02-07 01:26:13", "t3": "2018-02-07 01:26:13.840",
                        "t6": "2018-02-07 01:26:13.000000", "t9": "2018-02-07 01:26:13.000000001"}),
            ),
        ),
        // Text: RFC 3339 with a zone, naive text (UTC), a Nullable one set.
        (
            json!({"t3": "2018-02-07T02:26:13.5+01:00", "t9": "2018-02-07T01:26:13.123456789Z",
                   "tn": "2018-02-07 01:26:13.001"}),
            Some(
                json!({"t3": "2018-02-07 01:26:13.500", "t9": "2018-02-07 01:26:13.123456789",
                        "tn": "2018-02-07 01:26:13.001"}),
            ),
        ),
        (json!({"t3": "yesterday"}), None),
        // Date32 at both ends of its range; one day before is an error.
        (
            json!({"d32": "1900-01-01"}),
            Some(json!({"d32": "1900-01-01"})),
        ),
        (
            json!({"d32": "2299-12-31"}),
            Some(json!({"d32": "2299-12-31"})),
        ),
        (json!({"d32": "1899-12-31"}), None),
        // Map, Bool spellings.
        (json!({"m": {}, "b": 0}), Some(json!({"m": {}, "b": false}))),
        (
            json!({"m": {"a": -0.25}, "b": "true"}),
            Some(json!({"m": {"a": -0.25}, "b": true})),
        ),
        (json!({"b": 2}), None),
        (json!({"m": {"a": "x"}}), None),
        // Addresses and UUIDs.
        (
            json!({"ip4": "255.255.255.255", "ip6": "::ffff:1.2.3.4", "u": "00000000-0000-0000-0000-000000000000"}),
            Some(
                json!({"ip4": "255.255.255.255", "ip6": "::ffff:1.2.3.4", "u": "00000000-0000-0000-0000-000000000000"}),
            ),
        ),
        (json!({"ip4": "256.1.1.1"}), None),
        (json!({"ip6": "2001:db8::g"}), None),
        (json!({"u": "not-a-uuid"}), None),
        // Wide integers at their limits, and one past.
        (
            json!({"i128": format!("-{big_i128}").replace("727", "728"), "u256": u256_max}),
            Some(json!({"i128": "-170141183460469231731687303715884105728", "u256": u256_max})),
        ),
        (json!({"i128": big_i128.replace("727", "728")}), None),
        (json!({"u256": -1}), None),
        // Decimals: exact values, trailing zeros, limits; rounding and
        // overflow are errors, never rounded or wrapped.
        (
            json!({"d9": 9999999.99, "d18": "-99999999999999.9999", "d38": "1234567890123456789012345678.0123456789",
                   "d76": d76_max}),
            Some(json!({"d9": "9999999.99", "d18": "-99999999999999.9999",
                        "d38": "1234567890123456789012345678.0123456789", "d76": d76_max})),
        ),
        (json!({"d9": "#raw:1.230"}), Some(json!({"d9": "1.23"}))),
        (json!({"d9": 1.234}), None),
        (json!({"d9": 10000000}), None),
        (json!({"d18": "0.00001"}), None),
        (json!({"d38": "12345678901234567890123456789"}), None),
        (json!({"d76": format!("1{}", "0".repeat(56))}), None),
        // Enums by name and by value; FixedString padding.
        (
            json!({"e8": -2, "e16": "y", "fs": "ab"}),
            Some(json!({"e8": "b", "e16": "y", "fs": "ab\u{0}\u{0}"})),
        ),
        (json!({"e8": "c"}), None),
        (json!({"e16": 7}), None),
        (json!({"fs": "abcde"}), None),
        // Named tuple, Nested, arrays with nulls.
        (
            json!({"tup": {"n": 255, "name": ""}, "nest.k": [], "nest.v": [], "af": [null, null], "alc": []}),
            Some(
                json!({"tup": {"name": "", "n": 255}, "nest.k": [], "nest.v": [], "af": [null, null], "alc": []}),
            ),
        ),
        (json!({"tup": {"name": "x", "n": 256}}), None),
        (json!({"af": [1, "x"]}), None),
        // JSON: an object (also a sub-object by pointer, column jp); a
        // string, an array or a missing object is a record error.
        (
            json!({"j": {}, "meta": {"props": {"n": null, "f": 1.5}}}),
            Some(json!({"j": {}, "jp": {"f": 1.5}})),
        ),
        (json!({"j": "{\"a\": 1}"}), None),
        (json!({"j": [1, 2]}), None),
        (json!({"meta": {}}), None),
        // LowCardinality(Nullable) null; a null into a non-Nullable column.
        (json!({"lcn": null}), Some(json!({"lcn": null}))),
        (json!({"lc": null}), None),
    ]
}

/// Every type case through `spate run` into the current engine, read back
/// with JSONEachRow and compared with the values written above.
#[test]
fn current_types_round_trip_through_spate() {
    let Some(urls) = chdb_urls() else {
        return;
    };
    let table = format!("spate_chdb_types_{}", std::process::id());
    let db = Chdb::new(&urls[0], &table);
    db.query(&format!("DROP TABLE IF EXISTS default.{table}"));
    db.query(&format!(
        "CREATE TABLE default.{table} ({TYPES_TABLE}) ENGINE = MergeTree ORDER BY id"
    ));
    let (base_in, base_out) = base();
    let mut lines = Vec::new();
    let mut want = std::collections::BTreeMap::new();
    let mut errors = 0u64;
    for (i, (change, expected)) in std::iter::once((json!({}), Some(json!({}))))
        .chain(type_cases())
        .enumerate()
    {
        let id = i as u64 + 1;
        let mut rec = base_in.clone();
        rec["id"] = json!(id);
        for (k, v) in change.as_object().unwrap() {
            rec[k] = v.clone();
        }
        // serde_json's numbers are f64: a "#raw:N" string is spliced in as
        // the number N, digit for digit.
        let mut line = rec.to_string();
        while let Some(start) = line.find("\"#raw:") {
            let end = start + 1 + line[start + 1..].find('"').unwrap();
            let number = line[start + 6..end].to_string();
            line.replace_range(start..=end, &number);
        }
        lines.push(line);
        match expected {
            Some(e) => {
                let mut row = base_out.clone();
                for (k, v) in e.as_object().unwrap() {
                    row[k] = v.clone();
                }
                want.insert(id, (change, row));
            }
            None => errors += 1,
        }
    }
    let feed = Feed::mock("types", 1, "chdb-types");
    feed.produce(&lines);
    let yaml = chdb_config(&feed, &urls[..1], &table, "{ policy: skip }")
        + "mapping: { columns: { jp: /meta/props } }\n";
    let spate = Spate::start("chdb-types", &yaml);
    feed.await_commits(&spate);
    let skipped = metric(feed.port, "spate_records_skipped_total");
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "stdout: {out}\nlog: {logs}");
    let answer = db.query(&format!(
        "SELECT * FROM default.{table} ORDER BY id FORMAT JSONEachRow \
         SETTINGS output_format_json_quote_64bit_integers = 1, output_format_json_quote_decimals = 1, output_format_decimal_trailing_zeros = 1"
    ));
    // (id, the row without it): the id's JSON spelling depends on
    // output_format_json_quote_64bit_integers, which is not under test.
    let got: Vec<(u64, Value)> = answer
        .lines()
        .map(|l| {
            let mut row: Value = serde_json::from_str(l).unwrap();
            let id = row.as_object_mut().unwrap().remove("id").unwrap();
            let id = id.as_u64().or_else(|| id.as_str()?.parse().ok()).unwrap();
            (id, row)
        })
        .collect();
    let mut mismatches = Vec::new();
    for (id, row) in &got {
        match want.get(id) {
            None => mismatches.push(format!("id {id}: landed, expected a record error: {row}")),
            Some((change, w)) if w != row => {
                mismatches.push(format!("id {id} ({change}):\n  got  {row}\n  want {w}"))
            }
            Some(_) => {}
        }
    }
    let landed: Vec<u64> = got.iter().map(|r| r.0).collect();
    for id in want.keys().filter(|id| !landed.contains(id)) {
        mismatches.push(format!("id {id} ({}): did not land\n{logs}", want[id].0));
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert_eq!(
        skipped, errors as f64,
        "every out-of-range case is a skipped record error"
    );
    println!("{} rows round-tripped, {errors} record errors", got.len());
    db.query(&format!("DROP TABLE default.{table}"));
}

/// `yaml` with `sink.clickhouse.settings: {settings}` (a YAML flow map).
fn with_settings(yaml: &str, table: &str, settings: &str) -> String {
    let line = format!("    table: {table}\n");
    let out = yaml.replace(&line, &format!("{line}    settings: {settings}\n"));
    assert_ne!(out, yaml, "settings added");
    out
}

/// `sink.clickhouse.settings` reach the engine with every insert. The
/// effect shown: with `max_block_size` and `min_insert_block_size_rows` at
/// 100 (merges stopped), the engine cuts each insert into parts of at most
/// 100 rows, where it makes one part per insert by default. The endpoint's
/// log also shows every insert carried the settings. (`insert_deduplicate:
/// 0` would not show it: measured on 26.9, an insert with
/// `insert_deduplication_token` is deduplicated even with it.)
#[test]
fn insert_settings_reach_the_engine() {
    let Some(urls) = chdb_urls() else {
        return;
    };
    let table = format!("spate_chdb_settings_{}", std::process::id());
    let db = Chdb::new(&urls[0], &table);
    flights_table(&db, &table);
    db.query(&format!("SYSTEM STOP MERGES default.{table}"));
    let rows = 1_000u64;
    let feed = Feed::mock("flights", 1, "chdb-settings");
    feed.produce_flights(0..rows);
    let yaml = chdb_config(&feed, &urls[..1], &table, "{ policy: fail }");
    let yaml = with_settings(
        &yaml,
        &table,
        "{ max_block_size: 100, min_insert_block_size_rows: 100, min_insert_block_size_bytes: 0 }",
    )
    // The block settings cut a row format's input into blocks; a Native
    // body arrives as ready blocks, which they leave alone.
    .replace(
        &format!("    table: {table}\n"),
        &format!("    table: {table}\n    format: rowbinary\n"),
    );
    run_until_committed("chdb-settings", &yaml, &feed);
    let count = db.number(&format!("SELECT count() FROM default.{table}"));
    assert_eq!(count, rows);
    let ours: Vec<Value> = db
        .inserts()
        .into_iter()
        .filter(|i| i["table"] == format!("default.{table}") && i["outcome"] == "ok")
        .collect();
    for i in &ours {
        assert_eq!(i["settings"]["max_block_size"], "100", "{i}");
        assert_eq!(i["settings"]["min_insert_block_size_rows"], "100", "{i}");
    }
    let parts = db.number(&format!(
        "SELECT count() FROM system.parts WHERE database = 'default' AND table = '{table}' AND active"
    ));
    println!(
        "{} inserts made {parts} parts of at most 100 rows",
        ours.len()
    );
    assert!(
        parts > ours.len() as u64,
        "the engine applied the block settings: {parts} parts, {} inserts",
        ours.len()
    );
    assert!(parts >= rows / 100, "{parts} parts for {rows} rows");
    db.query(&format!("DROP TABLE default.{table}"));
}

/// A setting the server does not know stops `spate run` at start and fails
/// `spate check`, both naming it; no insert is attempted.
#[test]
fn unknown_insert_setting_fails_at_start_naming_it() {
    let Some(urls) = chdb_urls() else {
        return;
    };
    let table = format!("spate_chdb_badsetting_{}", std::process::id());
    let db = Chdb::new(&urls[0], &table);
    flights_table(&db, &table);
    let feed = Feed::mock("flights", 1, "chdb-badsetting");
    feed.produce_flights(0..10);
    let yaml = chdb_config(&feed, &urls[..1], &table, "{ policy: fail }");
    let yaml = with_settings(
        &yaml,
        &table,
        "{ max_insert_block_size: 1000, no_such_setting_xyz: 1 }",
    );

    let mut spate = Spate::start("chdb-badsetting", &yaml);
    let (code, out) = spate.wait_exit(EXIT);
    let logs = spate.logs();
    assert_ne!(code, Some(0), "stdout: {out}\nlog: {logs}");
    assert!(
        logs.contains("no_such_setting_xyz"),
        "the log names the setting:\n{logs}"
    );
    assert!(
        !logs.contains("`max_insert_block_size`"),
        "only the unknown one is named:\n{logs}"
    );

    let file =
        std::env::temp_dir().join(format!("spate-chdb-badsetting-{}.yaml", std::process::id()));
    std::fs::write(&file, &yaml).unwrap();
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(3), "check fails:\n{text}");
    assert!(
        text.contains("PROBLEM") && text.contains("no_such_setting_xyz"),
        "check names the setting:\n{text}"
    );
    let tried = db
        .inserts()
        .iter()
        .filter(|i| i["table"] == format!("default.{table}"))
        .count();
    assert_eq!(tried, 0, "no insert was attempted");
    db.query(&format!("DROP TABLE default.{table}"));
}
