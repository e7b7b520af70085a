//! The sensor workload (issue 21/22) as a flat Protobuf message: one
//! `SensorEventRow` per row of the `sensor_events` table, the fields of a
//! `SensorBatch` and of one of its events side by side (the Protobuf path
//! has no fan-out of its own yet). Deterministic: batch `i`, event `j`
//! gives the same bytes every time, with the values of the shared spec
//! (`briefs/sensor-and-formats.md`): `k = i * 100 + j`.
//!
//! Used by the no-allocation test and the instructions-per-row
//! measurement (`examples/proto_sensor.rs`).

use spate_row::spec::{ColumnOptions, ColumnSpec, MissingValue};
use spate_row::types::ChType;

/// The schema, as a registry would serve it (`schemaType: PROTOBUF`);
/// compile it with spate-formats' `protobuf::source::compile_proto`.
pub const SENSOR_PROTO: &str = r#"syntax = "proto3";
package spate.bench;

message SensorEventRow {
  uint64 batch_id = 1;
  string source = 2;
  optional string region = 3;
  uint64 produced_at = 4;
  uint32 event_seq = 5;
  uint32 sensor_id = 6;
  string name = 7;
  double value = 8;
  optional int32 quality = 9;
  string unit = 10;
  uint64 ts = 11;
}
"#;

/// The message's full name.
pub const SENSOR_MESSAGE: &str = "spate.bench.SensorEventRow";

/// The `sensor_events` table's stored columns (18.16 types), `region`
/// defaulting to `'unknown'` as the pipeline's `defaults:` says.
pub fn sensor_columns() -> Vec<ColumnSpec> {
    let c = |name: &str, ty: &str, missing: MissingValue| ColumnSpec {
        name: name.into(),
        ty: ChType::parse(ty).expect("a valid type"),
        path: None,
        meta: None,
        missing,
        options: ColumnOptions::default(),
    };
    vec![
        c("batch_id", "UInt64", MissingValue::Reject),
        c("source", "String", MissingValue::Reject),
        c(
            "region",
            "String",
            MissingValue::Literal("'unknown'".into()),
        ),
        c("produced_at", "UInt64", MissingValue::Reject),
        c("event_seq", "UInt32", MissingValue::Reject),
        c("sensor_id", "UInt32", MissingValue::Reject),
        c("name", "String", MissingValue::Reject),
        c("value", "Float64", MissingValue::Reject),
        c("quality", "Nullable(Int32)", MissingValue::Null),
        c("unit", "String", MissingValue::Reject),
        c("ts", "UInt64", MissingValue::Reject),
    ]
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn text(out: &mut Vec<u8>, tag: u8, s: &[u8]) {
    out.push(tag);
    varint(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// Appends the message for batch `i`, event `j` (`j < 100`) to `out`.
/// Fields are written in number order, as generated code writes them;
/// `scratch` holds the formatted names (reused, no allocation once grown).
pub fn sensor_row(i: u64, j: u64, out: &mut Vec<u8>, scratch: &mut Vec<u8>) {
    use std::io::Write;
    debug_assert!(j < 100, "a batch has 100 events");
    let k = i * 100 + j;
    let produced_at = 1_700_000_000_000 + i * 10;
    out.push(1 << 3);
    varint(out, i);
    scratch.clear();
    write!(scratch, "gw-{}", i % 16).expect("vec write");
    text(out, 2 << 3 | 2, scratch);
    if i % 10 != 0 {
        scratch.clear();
        write!(scratch, "eu-{}", i % 4).expect("vec write");
        text(out, 3 << 3 | 2, scratch);
    }
    out.push(4 << 3);
    varint(out, produced_at);
    if j != 0 {
        out.push(5 << 3);
        varint(out, j);
    }
    if k % 1024 != 0 {
        out.push(6 << 3);
        varint(out, k % 1024);
    }
    scratch.clear();
    write!(scratch, "sensor-{}", k % 1024).expect("vec write");
    text(out, 7 << 3 | 2, scratch);
    let value = (k % 4000) as f64 * 0.25 - 100.0;
    if value != 0.0 {
        out.push(8 << 3 | 1);
        out.extend_from_slice(&value.to_le_bytes());
    }
    if j % 5 != 0 {
        out.push(9 << 3);
        varint(out, j % 3);
    }
    let unit: &[u8] = if k % 8 == 0 {
        b"drop"
    } else {
        [&b"C"[..], b"hPa", b"pct"][(k % 3) as usize]
    };
    text(out, 10 << 3 | 2, unit);
    out.push(11 << 3);
    varint(out, produced_at * 1000 + j);
}
