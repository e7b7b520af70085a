//! The sensor workload (issue 21's end-to-end test, issue 22's benchmark):
//! a deterministic generator of `spate.bench.SensorBatch` messages, message
//! `i` -> Confluent-framed Avro bytes, and the closed form of every value,
//! so tests compute their expectations by iterating `i` and `j` rather than
//! copying numbers from a run.
//!
//! Message `i` (0-based) holds:
//! - `batch_id` = i; `source` = `gw-{i % 16}`; `region` = null when
//!   `i % 10 == 0`, else `eu-{i % 4}`; `produced_at` (timestamp-millis) =
//!   1_700_000_000_000 + i * 10;
//! - `events`: exactly [`EVENTS`] records, `j` = 0..99, `k` = i * 100 + j:
//!   `event_seq` = j; `sensor_id` = k % 1024; `name` = `sensor-{k % 1024}`;
//!   `value` = (k % 4000) * 0.25 - 100.0 (exact in binary); `quality` =
//!   null when `j % 5 == 0`, else `j % 3`; `unit` = `drop` when
//!   `k % 8 == 0`, else `["C", "hPa", "pct"][k % 3]`; `ts`
//!   (timestamp-micros) = produced_at * 1000 + j.
//!
//! Version 2 of the writer schema ([`SCHEMA_V2`]) adds `firmware` (a
//! string, default `"unknown"`) after `events`, = `fw-{i % 3}`: a
//! compatible evolution for the registry test.
//!
//! The datum is written by hand here (Avro's binary encoding: zig-zag
//! varints, length-prefixed strings, little-endian doubles, union branch
//! indexes, one array block; Avro specification, "Binary Encoding",
//! <https://avro.apache.org/docs/1.11.1/specification/#binary-encoding>) so
//! generating is fast; a test checks apache-avro reads it back as the
//! closed form says.

use apache_avro::Schema;

use spate_row::spec::{ColumnOptions, ColumnSpec, MissingValue};
use spate_row::types::ChType;

/// The writer schema, version 1 (`fixtures/sensor_batch.avsc`).
pub const SCHEMA_V1: &str = include_str!("../../fixtures/sensor_batch.avsc");
/// The writer schema, version 2 (`fixtures/sensor_batch_v2.avsc`): adds
/// `firmware`.
pub const SCHEMA_V2: &str = include_str!("../../fixtures/sensor_batch_v2.avsc");
/// Events per message.
pub const EVENTS: u64 = 100;
/// `produced_at` of message 0, in epoch milliseconds.
pub const EPOCH_MS: i64 = 1_700_000_000_000;
/// The units, by `k % 3` (when not `drop`).
pub const UNITS: [&str; 3] = ["C", "hPa", "pct"];

/// The ClickHouse 18.16 table of the workload (no DateTime64 there:
/// `produced_at` and `ts` land as epoch ms and us in UInt64).
pub const TABLE_DDL: &str = "CREATE TABLE sensor_events (\n  \
    batch_id UInt64, source String, region String, produced_at UInt64,\n  \
    event_seq UInt32, sensor_id UInt32, name String, value Float64,\n  \
    quality Nullable(Int32), unit String, ts UInt64,\n  \
    name_upper String MATERIALIZED upper(name),\n  \
    value_scaled Float64 MATERIALIZED value * 10\n\
    ) ENGINE = MergeTree ORDER BY (batch_id, event_seq)";

/// Version 1 parsed.
pub fn schema_v1() -> Schema {
    Schema::parse_str(SCHEMA_V1).expect("the fixture parses")
}

/// Version 2 parsed.
pub fn schema_v2() -> Schema {
    Schema::parse_str(SCHEMA_V2).expect("the fixture parses")
}

/// The INSERT columns of [`TABLE_DDL`] (MATERIALIZED ones are not sent),
/// with the workload's `defaults: {region: unknown}` (a null region lands
/// as `'unknown'`).
pub fn columns() -> Vec<ColumnSpec> {
    let c = |name: &str, ty: ChType, missing: MissingValue| ColumnSpec {
        name: name.into(),
        ty,
        path: None,
        missing,
        options: ColumnOptions::default(),
        meta: None,
    };
    vec![
        c("batch_id", ChType::UInt64, MissingValue::Reject),
        c("source", ChType::String, MissingValue::Reject),
        c(
            "region",
            ChType::String,
            MissingValue::Literal("'unknown'".into()),
        ),
        c("produced_at", ChType::UInt64, MissingValue::Reject),
        c("event_seq", ChType::UInt32, MissingValue::Reject),
        c("sensor_id", ChType::UInt32, MissingValue::Reject),
        c("name", ChType::String, MissingValue::Reject),
        c("value", ChType::Float64, MissingValue::Reject),
        c(
            "quality",
            ChType::Nullable(Box::new(ChType::Int32)),
            MissingValue::Null,
        ),
        c("unit", ChType::String, MissingValue::Reject),
        c("ts", ChType::UInt64, MissingValue::Reject),
    ]
}

/// The batch-level values of message `i`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// `batch_id`.
    pub batch_id: i64,
    /// `source`.
    pub source: String,
    /// `region`.
    pub region: Option<String>,
    /// `produced_at`, epoch ms.
    pub produced_at: i64,
}

/// One event's values.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// `event_seq` = j.
    pub event_seq: i32,
    /// `sensor_id`.
    pub sensor_id: i32,
    /// `name`.
    pub name: String,
    /// `value`.
    pub value: f64,
    /// `quality`.
    pub quality: Option<i32>,
    /// `unit`.
    pub unit: &'static str,
    /// `ts`, epoch us.
    pub ts: i64,
}

/// Message `i`'s batch values.
pub fn batch(i: u64) -> Batch {
    Batch {
        batch_id: i as i64,
        source: format!("gw-{}", i % 16),
        region: (i % 10 != 0).then(|| format!("eu-{}", i % 4)),
        produced_at: EPOCH_MS + i as i64 * 10,
    }
}

/// Event `j` of message `i`.
pub fn event(i: u64, j: u64) -> Event {
    let k = i * EVENTS + j;
    Event {
        event_seq: j as i32,
        sensor_id: (k % 1024) as i32,
        name: format!("sensor-{}", k % 1024),
        value: (k % 4000) as f64 * 0.25 - 100.0,
        quality: (j % 5 != 0).then_some((j % 3) as i32),
        unit: unit(k),
        ts: (EPOCH_MS + i as i64 * 10) * 1000 + j as i64,
    }
}

/// The unit of event number `k` (= i * 100 + j).
pub fn unit(k: u64) -> &'static str {
    if k % 8 == 0 {
        "drop"
    } else {
        UNITS[(k % 3) as usize]
    }
}

/// Whether event `j` of message `i` passes the workload's filters
/// (`unit != "drop"` and `value >= 0`).
pub fn kept(i: u64, j: u64) -> bool {
    let k = i * EVENTS + j;
    k % 8 != 0 && (k % 4000) >= 400
}

/// `firmware` of message `i` (version 2 only).
pub fn firmware(i: u64) -> String {
    format!("fw-{}", i % 3)
}

fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_long(out, s.len() as i64);
    out.extend_from_slice(s);
}

/// A small decimal formatter into a stack buffer (no allocation per value).
fn put_prefixed(out: &mut Vec<u8>, prefix: &[u8], n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut m = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    let d = &digits[at..];
    put_long(out, (prefix.len() + d.len()) as i64);
    out.extend_from_slice(prefix);
    out.extend_from_slice(d);
}

/// Appends the version-1 datum of message `i` (no framing).
pub fn datum(i: u64, out: &mut Vec<u8>) {
    put_long(out, i as i64);
    put_prefixed(out, b"gw-", i % 16);
    if i % 10 == 0 {
        put_long(out, 0);
    } else {
        put_long(out, 1);
        put_prefixed(out, b"eu-", i % 4);
    }
    let produced = EPOCH_MS + i as i64 * 10;
    put_long(out, produced);
    put_long(out, EVENTS as i64);
    for j in 0..EVENTS {
        let k = i * EVENTS + j;
        put_long(out, j as i64);
        put_long(out, (k % 1024) as i64);
        put_prefixed(out, b"sensor-", k % 1024);
        out.extend_from_slice(&((k % 4000) as f64 * 0.25 - 100.0).to_le_bytes());
        if j % 5 == 0 {
            put_long(out, 0);
        } else {
            put_long(out, 1);
            put_long(out, (j % 3) as i64);
        }
        put_str(out, unit(k).as_bytes());
        put_long(out, produced * 1000 + j as i64);
    }
    put_long(out, 0);
}

/// Appends the version-2 datum of message `i`.
pub fn datum_v2(i: u64, out: &mut Vec<u8>) {
    datum(i, out);
    put_prefixed(out, b"fw-", i % 3);
}

/// Appends message `i` as Confluent-framed version 1 under `schema_id`.
pub fn message(i: u64, schema_id: u32, out: &mut Vec<u8>) {
    put_confluent_header(out, schema_id);
    datum(i, out);
}

/// Appends message `i` as Confluent-framed version 2 under `schema_id`.
pub fn message_v2(i: u64, schema_id: u32, out: &mut Vec<u8>) {
    put_confluent_header(out, schema_id);
    datum_v2(i, out);
}

/// The Confluent wire header: magic byte 0, then the schema id as 4
/// big-endian bytes (what spate-formats' `avro::framing` parses; the
/// decoder tests read these messages through it).
fn put_confluent_header(out: &mut Vec<u8>, schema_id: u32) {
    out.push(0);
    out.extend_from_slice(&schema_id.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Value;

    fn field<'v>(rec: &'v [(String, Value)], name: &str) -> &'v Value {
        &rec.iter().find(|(n, _)| n == name).expect(name).1
    }

    /// apache-avro reads the hand-written datum as the closed form says
    /// (both versions), and consumes it whole.
    #[test]
    fn apache_avro_reads_the_closed_form() {
        for (v2, schema) in [(false, schema_v1()), (true, schema_v2())] {
            for i in [0u64, 1, 7, 10, 99, 12_345] {
                let mut d = Vec::new();
                if v2 {
                    datum_v2(i, &mut d);
                } else {
                    datum(i, &mut d);
                }
                let mut r = &d[..];
                let v = apache_avro::reader::datum::GenericDatumReader::builder(&schema)
                    .build()
                    .expect("reader")
                    .read_value(&mut r)
                    .expect("decodes");
                assert!(r.is_empty(), "the whole datum is read");
                let Value::Record(rec) = v else {
                    panic!("a record")
                };
                let b = batch(i);
                assert_eq!(field(&rec, "batch_id"), &Value::Long(b.batch_id));
                assert_eq!(field(&rec, "source"), &Value::String(b.source));
                assert_eq!(
                    field(&rec, "region"),
                    &match b.region {
                        None => Value::Union(0, Box::new(Value::Null)),
                        Some(r) => Value::Union(1, Box::new(Value::String(r))),
                    }
                );
                assert_eq!(
                    field(&rec, "produced_at"),
                    &Value::TimestampMillis(b.produced_at)
                );
                let Value::Array(events) = field(&rec, "events") else {
                    panic!("events")
                };
                assert_eq!(events.len(), EVENTS as usize);
                for (j, e) in events.iter().enumerate() {
                    let Value::Record(e) = e else {
                        panic!("event record")
                    };
                    let x = event(i, j as u64);
                    assert_eq!(field(e, "event_seq"), &Value::Int(x.event_seq));
                    assert_eq!(field(e, "sensor_id"), &Value::Int(x.sensor_id));
                    assert_eq!(field(e, "name"), &Value::String(x.name));
                    assert_eq!(field(e, "value"), &Value::Double(x.value));
                    assert_eq!(
                        field(e, "quality"),
                        &match x.quality {
                            None => Value::Union(0, Box::new(Value::Null)),
                            Some(q) => Value::Union(1, Box::new(Value::Int(q))),
                        }
                    );
                    assert_eq!(field(e, "unit"), &Value::String(x.unit.into()));
                    assert_eq!(field(e, "ts"), &Value::TimestampMicros(x.ts));
                }
                if v2 {
                    assert_eq!(field(&rec, "firmware"), &Value::String(firmware(i)));
                }
            }
        }
    }

    #[test]
    fn kept_matches_the_filters() {
        for i in 0..50 {
            for j in 0..EVENTS {
                let e = event(i, j);
                assert_eq!(kept(i, j), e.unit != "drop" && e.value >= 0.0, "{i} {j}");
            }
        }
    }
}
