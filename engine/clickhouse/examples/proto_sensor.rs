//! The Protobuf decoder on the sensor workload's flat rows: rows per second,
//! and the loop to count instructions per row with callgrind.
//!
//! `cargo run --release -p spate-clickhouse --example proto_sensor`
//! (`ROWS=n`, default 1,000,000; `CONFLUENT=1` frames each message for a
//! schema id served by a `FileSchemaSource`, so the plan-cache lookup is
//! measured too). Instructions:
//! `ROWS=100000 valgrind --tool=callgrind target/release/examples/proto_sensor`,
//! then `encode_message` inclusive / ROWS.

use std::sync::Arc;
use std::time::Instant;

use spate_clickhouse::mapping::MappingOptions;
use spate_clickhouse::protobuf::framing::write_header;
use spate_clickhouse::protobuf::{FileSchemaSource, Framing, ProtoRowEncoder, sensor};

fn main() {
    let rows: u64 = std::env::var("ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let confluent = std::env::var("CONFLUENT").is_ok_and(|v| v == "1");
    let file = sensor::sensor_file().expect("the sensor schema compiles");
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
        enc.encode_message(&all[start..end], &mut buf)
            .expect("encodes");
        start = end;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{rows} rows ({} message bytes) in {secs:.3} s: {:.2} M rows/s",
        all.len(),
        rows as f64 / secs / 1e6
    );
}
