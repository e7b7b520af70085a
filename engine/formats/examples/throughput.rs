//! Rough single-core throughput of the mapper and the RowBinary encoder
//! (until the criterion benches in `benches/` take these over).
//!
//! `cargo run --release -p spate-formats --example throughput [flights.ndjson]`
//!
//! Without an argument it uses the crate's 50-row flights fixture, repeated to
//! `ROWS` rows (default 2,000,000). For profiling (e.g. under cachegrind):
//! `ONLY_VALUE=1` runs only the `serde_json::Value` calibration, `ONLY_FIRST=1`
//! only the flights mapping, `ONLY_EVENT=1` only the 15-column event;
//! `ID_COLUMN=1` maps flights into the demo table `(id UInt64, date DateTime,
//! delay Int32, distance UInt32, origin String, destination String)`, for
//! rows carrying `"id":N` first. `META=1` adds the Kafka metadata columns
//! `_topic`, `_partition`, `_offset`, `_timestamp` and `_key` to the flights
//! table and encodes each row through `encode_message` (as `spate run` does),
//! for the cost of metadata columns.

use std::hint::black_box;
use std::time::Instant;

use spate_formats::json::JsonRowEncoder;
use spate_row::coerce::TimeRules;
use spate_row::num::Wide;
use spate_row::rowbinary::{Value, encode, put_string};
use spate_row::spec::{MappingOptions, simple_columns};
use spate_row::time::TimeFormat;
use spate_row::types::ChType;
use spate_testkit::fixtures::{EVENT15, FLIGHTS, event15_row};

const FIXTURE: &str = spate_testkit::fixtures::FLIGHTS_50;
const TARGET_ROWS: usize = 2_000_000;
fn target_rows() -> usize {
    std::env::var("ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TARGET_ROWS)
}

fn report(what: &str, rows: usize, bytes: usize, secs: f64) {
    println!(
        "{what:<44} {:>6.2} M rows/s  {:>6.1} ns/row  ({rows} rows, {:.1} MB out)",
        rows as f64 / secs / 1e6,
        secs * 1e9 / rows as f64,
        bytes as f64 / 1e6
    );
}

fn run_json(what: &str, enc: &mut JsonRowEncoder, lines: &[String]) {
    let mut buf = Vec::with_capacity(64 << 20);
    // warm up
    for l in lines.iter().take(10_000) {
        enc.encode_json(l.as_bytes(), &mut buf).unwrap();
    }
    let mut best = f64::MAX;
    let mut out_bytes = 0;
    for _ in 0..3 {
        buf.clear();
        let start = Instant::now();
        for l in lines {
            enc.encode_json(l.as_bytes(), &mut buf).unwrap();
        }
        best = best.min(start.elapsed().as_secs_f64());
        out_bytes = buf.len();
        black_box(&buf);
    }
    report(what, lines.len(), out_bytes, best);
}

/// A Kafka message around row `i` (offset = row number).
fn message<'a>(
    tp: &'a spate_core::record::TopicPartition,
    i: usize,
    l: &'a str,
) -> spate_core::record::Payload<'a> {
    use spate_core::record::{Headers, Payload, TimestampKind};
    Payload {
        value: Some(l.as_bytes()),
        key: Some(b"flight-key"),
        partition: tp,
        offset: i as i64,
        timestamp_ms: Some(1_700_000_000_000 + i as i64),
        timestamp_kind: TimestampKind::CreateTime,
        headers: Headers::NONE,
    }
}

/// As [`run_json`], through `encode_message` with a Kafka message around
/// each row.
fn run_message(what: &str, enc: &mut JsonRowEncoder, lines: &[String]) {
    let tp = spate_core::record::TopicPartition::new("flights", 3);
    let mut buf = Vec::with_capacity(64 << 20);
    for (i, l) in lines.iter().take(10_000).enumerate() {
        enc.encode_message(&message(&tp, i, l), &mut buf).unwrap();
    }
    let mut best = f64::MAX;
    let mut out_bytes = 0;
    for _ in 0..3 {
        buf.clear();
        let start = Instant::now();
        for (i, l) in lines.iter().enumerate() {
            enc.encode_message(&message(&tp, i, l), &mut buf).unwrap();
        }
        best = best.min(start.elapsed().as_secs_f64());
        out_bytes = buf.len();
        black_box(&buf);
    }
    report(what, lines.len(), out_bytes, best);
}

fn main() {
    let text = match std::env::args().nth(1) {
        Some(path) => std::fs::read_to_string(path).expect("read the ndjson file"),
        None => FIXTURE.to_owned(),
    };
    let base: Vec<String> = text.lines().map(str::to_owned).collect();
    let lines: Vec<String> = base
        .iter()
        .cycle()
        .take(target_rows().max(base.len()))
        .cloned()
        .collect();
    let in_bytes: usize = lines.iter().map(String::len).sum();
    println!(
        "{} rows, {:.1} bytes/row of JSON",
        lines.len(),
        in_bytes as f64 / lines.len() as f64
    );

    // Calibration: serde_json::Value per row (the issue measured ~1.7 M rows/s here).
    if std::env::var_os("ONLY_VALUE").is_some() {
        for l in &lines {
            black_box(serde_json::from_str::<serde_json::Value>(l).unwrap());
        }
        return;
    }
    let only_event = std::env::var_os("ONLY_EVENT").is_some();
    if std::env::var_os("ONLY_FIRST").is_none() && !only_event {
        let start = Instant::now();
        for l in &lines {
            black_box(serde_json::from_str::<serde_json::Value>(l).unwrap());
        }
        report(
            "calibration: serde_json::Value parse only",
            lines.len(),
            0,
            start.elapsed().as_secs_f64(),
        );
    }

    // Flights: JSON -> RowBinary driven by a schema known at run time.
    // `ID_COLUMN=1`: the table `spate demo` and `spate run` write (rows with
    // an `"id":N` first field, as the benches' flights set), so the id takes
    // the column path rather than the unknown-key skip.
    let cols = if std::env::var_os("ID_COLUMN").is_some() {
        simple_columns([
            ("id", ChType::UInt64),
            ("date", ChType::parse("DateTime").unwrap()),
            ("delay", ChType::Int32),
            ("distance", ChType::UInt32),
            ("origin", ChType::String),
            ("destination", ChType::String),
        ])
    } else {
        simple_columns(
            FLIGHTS
                .iter()
                .map(|&(name, ty)| (name, ChType::parse(ty).unwrap())),
        )
    };
    let options = MappingOptions {
        time: TimeRules {
            formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    if !only_event {
        flights(&cols, options, &lines, &base);
        if std::env::var_os("ONLY_FIRST").is_some() {
            return;
        }
    }
    event(lines.len());
}

fn flights(
    cols: &[spate_row::spec::ColumnSpec],
    options: MappingOptions,
    lines: &[String],
    base: &[String],
) {
    if std::env::var_os("META").is_some() {
        let mut cols = cols.to_vec();
        for (name, ty) in [
            ("_topic", "LowCardinality(String)"),
            ("_partition", "Int32"),
            ("_offset", "UInt64"),
            ("_timestamp", "DateTime64(3)"),
            ("_key", "String"),
        ] {
            cols.push(spate_row::spec::ColumnSpec {
                name: name.into(),
                ty: ChType::parse(ty).unwrap(),
                path: None,
                meta: spate_row::meta::MetaSource::parse(name),
                missing: spate_row::spec::MissingValue::Reject,
                options: Default::default(),
            });
        }
        let mut enc = JsonRowEncoder::new(cols, options).unwrap();
        run_message("flights + 5 metadata columns", &mut enc, lines);
        return;
    }
    let mut enc = JsonRowEncoder::new(cols.to_vec(), options).unwrap();
    run_json("flights: JSON parse + map + encode", &mut enc, lines);
    // The encode-alone runs below know only the five-column table.
    if std::env::var_os("ONLY_FIRST").is_some() || std::env::var_os("ID_COLUMN").is_some() {
        return;
    }

    // Same rows with an ISO date (the common case without a custom format).
    let iso: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let d = v["date"].as_str().unwrap().replace('/', "-");
            l.replace(v["date"].as_str().unwrap(), &format!("{d}:00"))
        })
        .collect();
    let mut enc = JsonRowEncoder::new(cols.to_vec(), MappingOptions::default()).unwrap();
    run_json(
        "flights (ISO dates): JSON parse + map + encode",
        &mut enc,
        &iso,
    );

    // Encode alone: typed values already in hand, primitive writers.
    let typed: Vec<(u32, i32, u32, String, String)> = lines
        .iter()
        .take(base.len())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                978_310_020,
                v["delay"].as_i64().unwrap() as i32,
                v["distance"].as_u64().unwrap() as u32,
                v["origin"].as_str().unwrap().to_owned(),
                v["destination"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut buf = Vec::with_capacity(64 << 20);
    let mut best = f64::MAX;
    for _ in 0..3 {
        buf.clear();
        let start = Instant::now();
        for row in typed.iter().cycle().take(lines.len()) {
            buf.extend_from_slice(&row.0.to_le_bytes());
            buf.extend_from_slice(&row.1.to_le_bytes());
            buf.extend_from_slice(&row.2.to_le_bytes());
            put_string(&mut buf, row.3.as_bytes());
            put_string(&mut buf, row.4.as_bytes());
        }
        best = best.min(start.elapsed().as_secs_f64());
        black_box(&buf);
    }
    report(
        "flights: RowBinary encode alone (primitives)",
        lines.len(),
        buf.len(),
        best,
    );

    // Encode alone through the generic, type-checked Value encoder.
    let values: Vec<Vec<Value>> = typed
        .iter()
        .map(|r| {
            vec![
                Value::DateTime(i64::from(r.0)),
                Value::Int(Wide::from_i128(i128::from(r.1))),
                Value::Int(Wide::from_i128(i128::from(r.2))),
                Value::String(r.3.clone().into_bytes()),
                Value::String(r.4.clone().into_bytes()),
            ]
        })
        .collect();
    let types: Vec<ChType> = cols.iter().map(|c| c.ty.clone()).collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        buf.clear();
        let start = Instant::now();
        for row in values.iter().cycle().take(lines.len()) {
            for (t, v) in types.iter().zip(row) {
                encode(t, v, &mut buf).unwrap();
            }
        }
        best = best.min(start.elapsed().as_secs_f64());
        black_box(&buf);
    }
    report(
        "flights: RowBinary encode alone (Value)",
        lines.len(),
        buf.len(),
        best,
    );
}

/// A 15-column event, `rows` of them.
fn event(rows: usize) {
    let event_cols = simple_columns(
        EVENT15
            .iter()
            .map(|&(name, ty)| (name, ChType::parse(ty).unwrap())),
    );
    let events: Vec<String> = (0..rows).map(event15_row).collect();
    let ev_bytes: usize = events.iter().map(String::len).sum();
    println!(
        "15-column event: {:.1} bytes/row of JSON",
        ev_bytes as f64 / events.len() as f64
    );
    let mut enc = JsonRowEncoder::new(event_cols, MappingOptions::default()).unwrap();
    run_json("15-col event: JSON parse + map + encode", &mut enc, &events);
}
