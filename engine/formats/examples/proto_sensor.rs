//! The Protobuf decoder on the sensor workload's flat rows: rows per second,
//! and the loop to count instructions per row with callgrind.
//!
//! `cargo run --release -p spate-formats --example proto_sensor`
//! (`ROWS=n`, default 1,000,000; `CONFLUENT=1` frames each message for a
//! schema id served by a `FileSchemaSource`, so the plan-cache lookup is
//! measured too; `JSON=1` encodes the same rows as JSON objects with the
//! JSON mapper instead, for comparison). Instructions:
//! `ROWS=100000 valgrind --tool=callgrind target/release/examples/proto_sensor`,
//! then `encode_one` (or `encode_json_one`) inclusive / ROWS.

use std::sync::Arc;
use std::time::Instant;

use spate_formats::json::JsonRowEncoder;
use spate_formats::protobuf::framing::write_header;
use spate_formats::protobuf::source::compile_proto;
use spate_formats::protobuf::{FileSchemaSource, Framing, ProtoRowEncoder};
use spate_row::spec::MappingOptions;
use spate_testkit::sensor::protobuf as sensor;

/// One row (not inlined, so callgrind shows its inclusive cost).
#[inline(never)]
fn encode_one(enc: &mut ProtoRowEncoder, message: &[u8], buf: &mut Vec<u8>) {
    enc.encode_message(message, buf).expect("encodes");
}

/// One JSON row, likewise.
#[inline(never)]
fn encode_json_one(enc: &mut JsonRowEncoder, json: &[u8], buf: &mut Vec<u8>) {
    enc.encode_json(json, buf).expect("encodes");
}

/// The same rows as JSON objects, as a producer would write them.
fn json_rows(rows: u64) {
    let mut enc =
        JsonRowEncoder::new(sensor::sensor_columns(), MappingOptions::default()).expect("columns");
    let (mut all, mut ends) = (String::new(), Vec::new());
    for n in 0..rows {
        let (i, j) = (n / 100, n % 100);
        let k = i * 100 + j;
        let p = 1_700_000_000_000 + i * 10;
        let region = if i % 10 == 0 {
            String::new()
        } else {
            format!(",\"region\":\"eu-{}\"", i % 4)
        };
        let quality = if j % 5 == 0 {
            "null".to_owned()
        } else {
            (j % 3).to_string()
        };
        let unit = if k % 8 == 0 {
            "drop"
        } else {
            ["C", "hPa", "pct"][(k % 3) as usize]
        };
        all.push_str(&format!(
            "{{\"batch_id\":{i},\"source\":\"gw-{}\"{region},\"produced_at\":{p},\"event_seq\":{j},\
             \"sensor_id\":{},\"name\":\"sensor-{}\",\"value\":{},\"quality\":{quality},\
             \"unit\":\"{unit}\",\"ts\":{}}}",
            i % 16,
            k % 1024,
            k % 1024,
            (k % 4000) as f64 * 0.25 - 100.0,
            p * 1000 + j
        ));
        ends.push(all.len());
    }
    let mut buf = Vec::with_capacity(64 << 20);
    let started = Instant::now();
    let mut start = 0;
    for &end in &ends {
        if buf.len() > (60 << 20) {
            buf.clear();
        }
        encode_json_one(&mut enc, &all.as_bytes()[start..end], &mut buf);
        start = end;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "JSON: {rows} rows ({} bytes) in {secs:.3} s: {:.2} M rows/s",
        all.len(),
        rows as f64 / secs / 1e6
    );
}

fn main() {
    let rows: u64 = std::env::var("ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    if std::env::var("JSON").is_ok_and(|v| v == "1") {
        return json_rows(rows);
    }
    let confluent = std::env::var("CONFLUENT").is_ok_and(|v| v == "1");
    let file = compile_proto("sensor.proto", sensor::SENSOR_PROTO, &[])
        .expect("the sensor schema compiles");
    let mut enc = if confluent {
        let mut src = FileSchemaSource::new();
        src.insert(1, file);
        ProtoRowEncoder::confluent(
            Arc::new(src),
            sensor::sensor_columns(),
            MappingOptions::default(),
        )
        .expect("columns")
    } else {
        let msg = file
            .parent_pool()
            .get_message_by_name(sensor::SENSOR_MESSAGE)
            .expect("message");
        ProtoRowEncoder::fixed(
            &msg,
            Framing::Plain,
            sensor::sensor_columns(),
            MappingOptions::default(),
            "sensor.proto",
        )
        .expect("plans")
    };
    // Messages in one buffer, with their ends.
    let (mut all, mut ends, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..rows {
        if confluent {
            write_header(&mut all, 1, &[0]);
        }
        sensor::sensor_row(n / 100, n % 100, &mut all, &mut scratch);
        ends.push(all.len());
    }
    let mut buf = Vec::with_capacity(64 << 20);
    let started = Instant::now();
    let mut start = 0;
    for &end in &ends {
        if buf.len() > (60 << 20) {
            buf.clear();
        }
        encode_one(&mut enc, &all[start..end], &mut buf);
        start = end;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{rows} rows ({} message bytes) in {secs:.3} s: {:.2} M rows/s",
        all.len(),
        rows as f64 / secs / 1e6
    );
}
