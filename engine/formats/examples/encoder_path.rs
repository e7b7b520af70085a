//! The pipeline thread's encode path as the terminal stage runs it, for a
//! before/after instruction count of the live re-plan (ADR 0005):
//! `ENCODER=json` encodes flight rows through `JsonRowEncoder`'s
//! `Encoder::encode` (the service's encoder before), `ENCODER=live` through
//! `LiveEncoder` with `Encoder::replan` once per poll batch of `BATCH` rows
//! (default 500) and `Encoder::encode` per row (the service's encoder now).
//!
//! `cargo build --release -p spate-formats --example encoder_path`, then
//! `ENCODER=json valgrind --tool=callgrind target/release/examples/encoder_path`
//! and the same with `ENCODER=live`; the difference of the totals over
//! `ROWS` (default 200,000) is the cost per row.

use std::hint::black_box;

use spate_core::ack::{AckIssuer, ack_channel};
use spate_core::pipeline::chain::{Encoder, RecordCx};
use spate_core::record::{Payload, TopicPartition};
use spate_formats::json::JsonRowEncoder;
use spate_formats::json::live::{JsonLive, check_columns};
use spate_row::coerce::TimeRules;
use spate_row::plan::LivePlan;
use spate_row::schema::{InsertOptions, TableSchema, plan_insert};
use spate_row::spec::MappingOptions;
use spate_row::time::TimeFormat;

const FIXTURE: &str = spate_testkit::fixtures::FLIGHTS_50;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run<E: for<'a> Encoder<Payload<'a>>>(enc: &mut E, lines: &[&str], batch: usize, replan: bool) {
    let tp = TopicPartition::new("flights", 0);
    let (tx, _rx) = ack_channel();
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let mut buf = Vec::with_capacity(64 << 20);
    for (b, chunk) in lines.chunks(batch).enumerate() {
        let first = (b * batch) as i64;
        let ack = issuer.issue(first, first + chunk.len() as i64 - 1);
        if replan {
            black_box(enc.replan());
        }
        for (i, line) in chunk.iter().enumerate() {
            let payload = Payload {
                value: Some(line.as_bytes()),
                key: None,
                partition: &tp,
                offset: first + i as i64,
                timestamp_ms: None,
                timestamp_kind: spate_core::record::TimestampKind::None,
                headers: spate_core::record::Headers::NONE,
            };
            let cx = RecordCx { payload, ack: &ack };
            enc.encode(&payload, &cx, &mut buf).unwrap();
        }
        if buf.len() > 32 << 20 {
            buf.clear();
        }
    }
    black_box(&buf);
}

fn main() {
    let rows = env("ROWS", 200_000);
    let batch = env("BATCH", 500);
    let base: Vec<&str> = FIXTURE.lines().collect();
    let lines: Vec<&str> = base.iter().copied().cycle().take(rows).collect();
    let body: String = [
        ("date", "DateTime"),
        ("delay", "Int32"),
        ("distance", "UInt32"),
        ("origin", "LowCardinality(String)"),
        ("destination", "String"),
    ]
    .iter()
    .map(|(n, t)| {
        format!(
            "{{\"name\":\"{n}\",\"type\":\"{t}\",\"default_kind\":\"\",\"default_expression\":\"\"}}\n"
        )
    })
    .collect();
    let schema = TableSchema::from_json_each_row("db", "flights", &body).unwrap();
    let columns = plan_insert(&schema, &InsertOptions::default()).unwrap();
    let options = MappingOptions {
        time: TimeRules {
            formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    match std::env::var("ENCODER").as_deref() {
        Ok("live") => {
            let live = LivePlan::new(
                schema,
                columns,
                InsertOptions::default(),
                options,
                check_columns,
            );
            let mut enc = live.encoder().unwrap();
            run(&mut enc, &lines, batch, true);
        }
        _ => {
            let mut enc = JsonRowEncoder::new(columns, options).unwrap();
            run(&mut enc, &lines, batch, false);
        }
    }
    println!("{rows} rows in poll batches of {batch}");
}
