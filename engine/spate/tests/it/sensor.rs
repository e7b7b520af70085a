//! The issue-21 sensor workload in its JSON rendering, end to end: the real
//! `spate` binary reads `SensorBatch` messages (one batch of 100 events
//! each) from an embedded broker (librdkafka's mock cluster) and writes
//! into the ClickHouse at `SPATE_CLICKHOUSE_URL` (without it the test
//! prints `skipped: SPATE_CLICKHOUSE_URL not set` and passes), with
//! `mapping.explode: /events`, the two filters (`unit != "drop"`,
//! `value >= 0`), `defaults: {region: unknown}` and the table's
//! MATERIALIZED `name_upper` / `value_scaled`.
//!
//! Checked against the closed form computed here from the workload's
//! formulas (docs: /work/briefs, "The sensor workload"; issue 21): the kept
//! count, no loss and no duplicate on `(batch_id, event_seq)`, per-column
//! checksums (sum of value and value_scaled, name_upper against the
//! sensor id, the null pattern and sum of quality, the defaulted regions,
//! every unit, the timestamps), `spate_records_filtered_total` on
//! `/metrics` (rows filtered, and the empty batches), and the group's
//! commits reaching every partition's end (D1, D6: filtered rows and empty
//! batches still commit).

use crate::common;

use std::process::Command;

use common::*;

/// Messages in the run (100 candidate rows each): 1,000 keeps the mock
/// broker's partitions under its 5 MiB retention (ENVIRONMENT.md).
const MESSAGES: u64 = 1_000;
/// Extra messages whose `events` array is empty (no row, still commit).
const EMPTY: u64 = 5;
const EVENTS: u64 = 100;
const T0_MS: u64 = 1_700_000_000_000;

const UNITS: [&str; 3] = ["C", "hPa", "pct"];

fn value_of(k: u64) -> f64 {
    (k % 4000) as f64 * 0.25 - 100.0
}

fn unit_of(k: u64) -> &'static str {
    if k % 8 == 0 {
        "drop"
    } else {
        UNITS[(k % 3) as usize]
    }
}

/// Message i of the workload, as JSON.
fn batch(i: u64) -> String {
    let region = if i % 10 == 0 {
        "null".to_owned()
    } else {
        format!("\"eu-{}\"", i % 4)
    };
    let produced = T0_MS + i * 10;
    let events: Vec<String> = (0..EVENTS)
        .map(|j| {
            let k = i * EVENTS + j;
            let quality = if j % 5 == 0 {
                "null".to_owned()
            } else {
                (j % 3).to_string()
            };
            format!(
                "{{\"event_seq\":{j},\"sensor_id\":{s},\"name\":\"sensor-{s}\",\"value\":{v:?},\
                 \"quality\":{quality},\"unit\":\"{u}\",\"ts\":{ts}}}",
                s = k % 1024,
                v = value_of(k),
                u = unit_of(k),
                ts = produced * 1000 + j,
            )
        })
        .collect();
    format!(
        "{{\"batch_id\":{i},\"source\":\"gw-{}\",\"region\":{region},\"produced_at\":{produced},\
         \"events\":[{}]}}",
        i % 16,
        events.join(",")
    )
}

/// What the table must hold, from the formulas.
#[derive(Debug, Default, PartialEq)]
struct Expected {
    kept: u64,
    /// Sum of batch_id * 100 + event_seq over kept rows (identity checksum).
    keys: u64,
    value_sum: f64,
    quality_nulls: u64,
    quality_sum: u64,
    unknown_regions: u64,
    per_unit: [u64; 3],
    /// Sum of (ts - T0_MS * 1000) and of (produced_at - T0_MS).
    ts_sum: u64,
    produced_sum: u64,
}

fn expected() -> Expected {
    let mut e = Expected::default();
    for i in 0..MESSAGES {
        for j in 0..EVENTS {
            let k = i * EVENTS + j;
            if unit_of(k) == "drop" || value_of(k) < 0.0 {
                continue;
            }
            e.kept += 1;
            e.keys += i * 100 + j;
            e.value_sum += value_of(k);
            if j % 5 == 0 {
                e.quality_nulls += 1;
            } else {
                e.quality_sum += j % 3;
            }
            e.unknown_regions += u64::from(i % 10 == 0);
            e.per_unit[(k % 3) as usize] += 1;
            e.ts_sum += i * 10 * 1000 + j;
            e.produced_sum += i * 10;
        }
    }
    e
}

const TABLE: &str = "batch_id UInt64, source String, region String, produced_at UInt64, \
    event_seq UInt32, sensor_id UInt32, name String, value Float64, \
    quality Nullable(Int32), unit String, ts UInt64, \
    name_upper String MATERIALIZED upper(name), \
    value_scaled Float64 MATERIALIZED value * 10";

const MAPPING: &str = r#"
mapping:
  explode: /events
  filter:
    all:
      - unit != "drop"
      - value >= 0
  defaults:
    region: unknown
"#;

/// `spate_records_filtered_total` with `reason`, from `/metrics`.
fn filtered_total(port: u16, reason: &str) -> u64 {
    let (200, text) = get(port, "/metrics").expect("metrics answer") else {
        panic!("/metrics did not answer 200");
    };
    let label = format!("reason=\"{reason}\"");
    text.lines()
        .filter(|l| l.starts_with("spate_records_filtered_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn sensor_batches_explode_filter_default_and_land_as_the_closed_form_says() {
    let Some(url) = clickhouse_url() else { return };
    let table = Table::create(&url, "sensor");
    table.query(&format!("DROP TABLE default.{}", table.name));
    table.query(&format!(
        "CREATE TABLE default.{} ({TABLE}) ENGINE = MergeTree ORDER BY (batch_id, event_seq)",
        table.name
    ));
    let mut messages: Vec<String> = (0..MESSAGES).map(batch).collect();
    for e in 0..EMPTY {
        messages.push(format!(
            "{{\"batch_id\":{},\"source\":\"gw-0\",\"region\":\"x\",\"produced_at\":0,\"events\":[]}}",
            1_000_000 + e
        ));
    }
    let feed = Feed::mock("sensor", 8, "sensor");
    feed.produce(&messages);
    let yaml = feed.config(&url, &table.name, "{ policy: fail }") + MAPPING;

    // spate check prints the fan-out and the filter, and the default.
    let path = std::env::temp_dir().join(format!("spate-sensor-{}.yaml", std::process::id()));
    std::fs::write(&path, &yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("explode: /events"), "{text}");
    assert!(
        text.contains("keep rows where all(unit != \"drop\", value >= 0)"),
        "{text}"
    );
    assert!(
        text.contains("region: 'unknown' (mapping.defaults"),
        "{text}"
    );
    assert!(text.contains("element or record (name)"), "{text}");

    let spate = Spate::start("sensor", &yaml);
    feed.await_commits(&spate);
    let filtered = filtered_total(feed.port, "filter");
    let empties = filtered_total(feed.port, "explode_empty");
    let logs = spate.logs();
    drop(spate);

    let want = expected();
    let n = |sql: &str| table.number(&format!("SELECT {sql} FROM default.{}", table.name));
    assert_eq!(n("count()"), want.kept, "{logs}");
    assert_eq!(
        n("uniqExact(batch_id, event_seq)"),
        want.kept,
        "no duplicates"
    );
    assert_eq!(n("sum(batch_id * 100 + event_seq)"), want.keys, "no loss");
    let f = |sql: &str| -> f64 {
        table
            .query(&format!("SELECT {sql} FROM default.{}", table.name))
            .parse()
            .unwrap()
    };
    // Multiples of 0.25 below 2^53: the sums are exact.
    assert_eq!(f("sum(value)"), want.value_sum);
    assert_eq!(f("sum(value_scaled)"), want.value_sum * 10.0);
    assert_eq!(n("countIf(value_scaled != value * 10)"), 0);
    assert_eq!(n("countIf(value < 0)"), 0);
    assert_eq!(
        n("countIf(name_upper != concat('SENSOR-', toString(sensor_id)))"),
        0
    );
    assert_eq!(
        n("countIf(name != concat('sensor-', toString(sensor_id)))"),
        0
    );
    assert_eq!(n("countIf(isNull(quality))"), want.quality_nulls);
    assert_eq!(n("countIf(isNull(quality) != (event_seq % 5 = 0))"), 0);
    assert_eq!(n("toUInt64(sum(assumeNotNull(quality)))"), want.quality_sum);
    assert_eq!(n("countIf(region = 'unknown')"), want.unknown_regions);
    assert_eq!(
        n("countIf(region = 'unknown') - countIf(batch_id % 10 = 0)"),
        0
    );
    assert_eq!(
        n("countIf(region != 'unknown' AND region != concat('eu-', toString(batch_id % 4)))"),
        0
    );
    assert_eq!(
        n("countIf(source != concat('gw-', toString(batch_id % 16)))"),
        0
    );
    for (u, want_u) in UNITS.iter().zip(want.per_unit) {
        assert_eq!(n(&format!("countIf(unit = '{u}')")), want_u, "{u}");
    }
    assert_eq!(n("sum(ts - 1700000000000000)"), want.ts_sum);
    assert_eq!(n("sum(produced_at - 1700000000000)"), want.produced_sum);
    // Every candidate row is either in the table or counted as filtered;
    // the empty batches are counted once each (D6).
    assert_eq!(filtered, MESSAGES * EVENTS - want.kept, "{logs}");
    assert_eq!(empties, EMPTY);
}
