//! `spate check --sample N` (the real binary, an embedded broker, the real
//! ClickHouse at `SPATE_CLICKHOUSE_URL` for the table's schema; skipped
//! without it): the sample is read without committing, mapped and routed
//! without inserting, and the report shows per column what was missing,
//! null, defaulted or refused, the first errors with partition and offset,
//! and the shard distribution. A typo in the shard key or a rename, and a
//! type that cannot hold the data (`delay UInt16` for negative delays), are
//! problems (exit 3) before the first insert.

use crate::common;

use std::process::Command;

use common::*;
use spate::kafka_tools;

fn run_check(tag: &str, yaml: &str, n: usize) -> (Option<i32>, String) {
    let path = std::env::temp_dir().join(format!("spate-sample-{tag}-{}.yaml", std::process::id()));
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "--sample", &n.to_string(), "-c"])
        .arg(&path)
        .output()
        .expect("spawn spate check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The report line of `column`: `[missing, null, defaulted, refused]`.
fn counts(out: &str, column: &str) -> [u64; 4] {
    let line = out
        .lines()
        .skip_while(|l| !l.starts_with("sample:"))
        .find(|l| l.split_whitespace().next() == Some(column))
        .unwrap_or_else(|| panic!("no report line for {column}: {out}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(4)
        .map(|x| x.parse().unwrap())
        .collect();
    [n[0], n[1], n[2], n[3]]
}

#[test]
fn sample_reports_columns_errors_and_shards_and_catches_typos() {
    let Some(url) = clickhouse_url() else { return };
    let table = Table::create(&url, "sample");
    let mock = kafka_tools::start_broker("flights", 2).unwrap();
    let brokers = mock.bootstrap_servers();
    let rows: Vec<String> = (0..200).map(flight_row).collect();
    produce(&brokers, "flights", 2, &rows);
    let base = config(
        "smp",
        &brokers,
        "flights",
        &url,
        &table.name,
        free_port(),
        "{ policy: fail }",
    );
    let good = with_shards(&base, &url, &[vec![url.clone()], vec![url.clone()]]);

    // A clean sample: 100 messages, 50 from each partition, both shards
    // used, nothing refused, nothing committed.
    let (code, out) = run_check("good", &good, 100);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("sample: 100 message(s), 100 record(s), 0 refused"),
        "{out}"
    );
    assert_eq!(counts(&out, "delay"), [0, 0, 0, 0], "{out}");
    let shards_line = out
        .lines()
        .find(|l| l.contains("shards: shard 0:"))
        .unwrap();
    assert!(!shards_line.contains(": 0,"), "both shards used: {out}");
    assert!(shards_line.ends_with("without a shard key: 0"), "{out}");
    assert!(!out.contains("PROBLEM"), "{out}");
    let committed = committed(&brokers, "smp", "flights", 2);
    assert!(
        committed.values().all(Option::is_none),
        "the sample committed: {committed:?}"
    );

    // A shard key typo: every record is unroutable, a problem naming the key.
    let typo = good.replace("shard_key: { field: id }", "shard_key: { field: idd }");
    assert_ne!(typo, good);
    let (code, out) = run_check("key", &typo, 20);
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("without a shard key: 20"), "{out}");
    assert!(
        out.contains("20 of 20 sampled record(s) have no usable shard key"),
        "{out}"
    );
    assert!(
        out.contains("error at flights/") && out.contains("shard key field `idd`"),
        "{out}"
    );

    // A rename typo: the column's field is absent from every record.
    let rename = base.replace(
        "on_error:",
        "mapping: { rename: { distance: distnace } }\non_error:",
    );
    assert_ne!(rename, base);
    let (code, out) = run_check("rename", &rename, 20);
    assert_eq!(code, Some(3), "{out}");
    assert_eq!(counts(&out, "distance")[0], 20, "{out}");
    assert!(
        out.contains("column `distance`: no sampled record has its source field `distnace`"),
        "{out}"
    );

    // delay UInt16: the negative delays are refused, with their offsets.
    let narrow = format!("{}_u16", table.name);
    table.query(&format!(
        "CREATE TABLE default.{narrow} (id UInt64, date DateTime, delay UInt16, \
         distance UInt32, origin String, destination String) ENGINE = MergeTree ORDER BY id"
    ));
    let negative = rows.iter().filter(|r| r.contains("\"delay\":-")).count() as u64;
    assert!(negative > 0, "the fixture has negative delays");
    let u16_yaml = base.replace(
        &format!("table: {}", table.name),
        &format!("table: {narrow}"),
    );
    assert_ne!(u16_yaml, base);
    let (code, out) = run_check("u16", &u16_yaml, 200);
    table.query(&format!("DROP TABLE default.{narrow}"));
    assert_eq!(code, Some(3), "{out}");
    assert_eq!(counts(&out, "delay")[3], negative, "{out}");
    assert!(
        out.contains(&format!(
            "{negative} of 200 sampled record(s) refused by the mapping"
        )),
        "{out}"
    );
    assert!(
        out.contains("error at flights/") && out.contains("delay"),
        "{out}"
    );
}

/// `spate check` reaches the brokers with the consumer's own
/// `source.kafka.properties`, as `spate run` does: a config asking for SASL
/// against a plaintext broker is a Kafka problem in check (it fails the
/// same way in run), not `check: ok` (found by a new-user trial).
#[test]
fn check_uses_the_consumers_kafka_properties() {
    let Some(url) = clickhouse_url() else { return };
    let table = Table::create(&url, "checkprops");
    let mock = kafka_tools::start_broker("flights", 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let base = config(
        "chkprops",
        &brokers,
        "flights",
        &url,
        &table.name,
        free_port(),
        "{ policy: fail }",
    );
    let sasl = base.replace(
        r#"properties: { session.timeout.ms: "6000", heartbeat.interval.ms: "500" }"#,
        r#"properties: { security.protocol: sasl_plaintext, sasl.mechanism: PLAIN, sasl.username: u, sasl.password: p }"#,
    );
    assert_ne!(sasl, base, "the properties were rewritten");
    let path = std::env::temp_dir().join(format!("spate-checkprops-{}.yaml", std::process::id()));
    std::fs::write(&path, &sasl).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("spawn spate check");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!("kafka {brokers}: PROBLEM")),
        "the topic check must fail as the consumer would: {text}"
    );
    // The same config without SASL checks clean.
    std::fs::write(&path, &base).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("spawn spate check");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("topic flights: 1 partitions"), "{text}");
}
