//! A library user's Avro pipeline over the sensor workload
//! (`spate_testkit::sensor::avro`): Confluent-framed `SensorBatch`
//! messages are decoded and fanned out (`explode: /events`, 100 rows per
//! message) by the chain's [`AvroDecoder`], turned into typed rows, filtered
//! (`unit != "drop"` and `value >= 0`) and given the two computed columns
//! (`name_upper`, `value_scaled = value * 10`) in Rust, through the chain's
//! typed operators (`try_map`, `filter`, `map`). A service would put those
//! computed columns in the table instead (`MATERIALIZED upper(name)`,
//! `value * 10`) and filter with `mapping.filter`.
//!
//! It checks its totals against the closed form of the workload (computed
//! by iterating the message and event indexes) and exits non-zero on a
//! mismatch, so it cannot rot (`ci/test.sh` runs it). Then it times the
//! bare library path (decode + fan-out + RowBinary encode into a chunk
//! buffer) on one core.
//!
//! `cargo run --release -p spate-formats --example avro_sensor`
//! (`MESSAGES=N`, default 2,000; `ONLY_HOT=1` runs only the timed loop, for
//! callgrind: instructions per row = total / (MESSAGES * 100)).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use spate_core::ack::{AckIssuer, ack_channel};
use spate_core::pipeline::chain::{
    self, Decoder, RecordCx, RecordError, Stage, filter, map, try_map,
};
use spate_core::record::{Payload, TopicPartition};
use spate_formats::avro::{AvroMapping, AvroOptions, AvroRecord, AvroRowEncoder, FileSchemaSource};
use spate_row::rowbinary::Value;
use spate_row::rowbinary::decode::decode;
use spate_testkit::sensor::avro as sensor;

const SCHEMA_ID: u32 = 7;

/// One event row as a library user would type it.
#[derive(Debug)]
struct SensorRow {
    batch_id: u64,
    region: String,
    event_seq: u32,
    name: String,
    value: f64,
    quality: Option<i32>,
    unit: String,
}

/// The row with the two computed columns.
#[derive(Debug)]
struct Computed {
    row: SensorRow,
    name_upper: String,
    value_scaled: f64,
}

/// Totals the last stage keeps.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    rows: u64,
    value_scaled_sum: f64,
    name_upper_bytes: u64,
    name_upper_checksum: u64,
    quality_nulls: u64,
    unknown_regions: u64,
    seq_sum: u64,
    batch_sum: u64,
}

impl Summary {
    fn add(
        &mut self,
        name_upper: &str,
        value_scaled: f64,
        quality: Option<i32>,
        region: &str,
        seq: u32,
        batch: u64,
    ) {
        self.rows += 1;
        self.value_scaled_sum += value_scaled;
        self.name_upper_bytes += name_upper.len() as u64;
        self.name_upper_checksum = self.name_upper_checksum.wrapping_add(
            name_upper
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))),
        );
        self.quality_nulls += u64::from(quality.is_none());
        self.unknown_regions += u64::from(region == "unknown");
        self.seq_sum += u64::from(seq);
        self.batch_sum += batch;
    }
}

impl Stage<Computed> for Summary {
    fn push(&mut self, c: Computed, _cx: &RecordCx<'_>) -> Result<(), RecordError> {
        self.add(
            &c.name_upper,
            c.value_scaled,
            c.row.quality,
            &c.row.region,
            c.row.event_seq,
            c.row.batch_id,
        );
        Ok(())
    }
}

/// The record's row through the library's encoder, read back typed.
fn typed(
    enc: &mut AvroRowEncoder,
    buf: &mut Vec<u8>,
    rec: &AvroRecord<'_>,
) -> Result<SensorRow, RecordError> {
    buf.clear();
    enc.encode_row(rec, buf)?;
    let mut input = &buf[..];
    let mut vals = Vec::with_capacity(11);
    for c in enc.columns() {
        vals.push(decode(&c.ty, &mut input).map_err(|e| RecordError::operator(e.to_string()))?);
    }
    let s = |v: &Value| match v {
        Value::String(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("a string column, got {other:?}"),
    };
    let u = |v: &Value| match v {
        Value::Int(w) => w.to_i128().expect("fits") as u64,
        other => panic!("an integer column, got {other:?}"),
    };
    Ok(SensorRow {
        batch_id: u(&vals[0]),
        region: s(&vals[2]),
        event_seq: u(&vals[4]) as u32,
        name: s(&vals[6]),
        value: match vals[7] {
            Value::Float64(f) => f,
            ref other => panic!("Float64, got {other:?}"),
        },
        quality: match &vals[8] {
            Value::Null => None,
            v => Some(u(v) as i32),
        },
        unit: s(&vals[9]),
    })
}

fn mapping() -> Arc<AvroMapping> {
    let source = FileSchemaSource::one(SCHEMA_ID, sensor::schema_v1());
    let options = AvroOptions {
        explode: Some(vec!["events".into()]),
        ..AvroOptions::default()
    };
    AvroMapping::confluent(sensor::columns(), options, Arc::new(source)).expect("the workload maps")
}

fn messages(n: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut m = Vec::new();
            sensor::message(i, SCHEMA_ID, &mut m);
            m
        })
        .collect()
}

fn payload_of<'a>(tp: &'a TopicPartition, off: usize, m: &'a [u8]) -> Payload<'a> {
    Payload {
        value: Some(m),
        key: None,
        partition: tp,
        offset: off as i64,
        timestamp_ms: None,
        timestamp_kind: spate_core::record::TimestampKind::None,
        headers: spate_core::record::Headers::NONE,
    }
}

fn main() {
    let n: u64 = std::env::var("MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let msgs = messages(n);
    let (tx, _rx) = ack_channel();
    let tp = TopicPartition::new("sensor", 0);
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let ack = issuer.issue(0, n as i64);
    let mapping = mapping();

    if std::env::var_os("ONLY_HOT").is_none() {
        // The typed chain: decode + fan-out -> typed row -> filter -> computed columns.
        let mut enc = mapping.encoder();
        let mut buf = Vec::new();
        let mut stages = try_map(
            move |rec: AvroRecord<'_>| typed(&mut enc, &mut buf, &rec),
            filter(
                |r: &SensorRow| r.unit != "drop" && r.value >= 0.0,
                map(
                    |row: SensorRow| Computed {
                        name_upper: row.name.to_uppercase(),
                        value_scaled: row.value * 10.0,
                        row,
                    },
                    Summary::default(),
                ),
            ),
        );
        let mut dec = mapping.decoder();
        let t = Instant::now();
        for (off, m) in msgs.iter().enumerate() {
            let payload = payload_of(&tp, off, m);
            let cx = RecordCx { payload, ack: &ack };
            dec.decode(&cx, &mut stages).expect("every message decodes");
        }
        let secs = t.elapsed().as_secs_f64();
        let got: &Summary = stages.next_mut().next_mut().next_mut();
        // The closed form, by iterating i and j.
        let mut want = Summary::default();
        for i in 0..n {
            let b = sensor::batch(i);
            for j in 0..sensor::EVENTS {
                if !sensor::kept(i, j) {
                    continue;
                }
                let e = sensor::event(i, j);
                want.add(
                    &e.name.to_uppercase(),
                    e.value * 10.0,
                    e.quality,
                    b.region.as_deref().unwrap_or("unknown"),
                    e.event_seq as u32,
                    i,
                );
            }
        }
        println!(
            "typed chain: {n} messages -> {} candidate rows -> {} kept ({:.0}%), sum(value_scaled) = {}, \
             {} null qualities, {} regions defaulted to 'unknown', name_upper checksum {:#x} \
             ({:.2} s, {:.2} M candidate rows/s)",
            n * sensor::EVENTS,
            got.rows,
            100.0 * got.rows as f64 / (n * sensor::EVENTS) as f64,
            got.value_scaled_sum,
            got.quality_nulls,
            got.unknown_regions,
            got.name_upper_checksum,
            secs,
            (n * sensor::EVENTS) as f64 / secs / 1e6
        );
        if *got != want {
            eprintln!("MISMATCH with the closed form:\n got  {got:?}\n want {want:?}");
            std::process::exit(1);
        }
        println!("matches the closed form");
    }

    // The bare library path: decode + fan-out + RowBinary into one buffer.
    struct Encode<'e> {
        enc: &'e mut AvroRowEncoder,
        buf: &'e mut Vec<u8>,
        rows: u64,
    }
    impl<'a> Stage<AvroRecord<'a>> for Encode<'_> {
        fn push(&mut self, r: AvroRecord<'a>, cx: &RecordCx<'_>) -> Result<(), RecordError> {
            self.rows += 1;
            chain::Encoder::encode(self.enc, &r, cx, self.buf)
        }
    }
    let mut dec = mapping.decoder();
    let mut enc = mapping.encoder();
    let mut buf = Vec::with_capacity(1 << 20);
    let rounds = if std::env::var_os("ONLY_HOT").is_some() {
        1
    } else {
        5
    };
    let mut best = f64::MAX;
    let mut rows = 0;
    for _ in 0..rounds {
        let mut st = Encode {
            enc: &mut enc,
            buf: &mut buf,
            rows: 0,
        };
        let t = Instant::now();
        for (off, m) in msgs.iter().enumerate() {
            let payload = payload_of(&tp, off, m);
            let cx = RecordCx { payload, ack: &ack };
            dec.decode(&cx, &mut st).expect("decodes");
            if st.buf.len() > 1 << 20 {
                black_box(&st.buf);
                st.buf.clear();
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
        rows = st.rows;
    }
    let in_bytes: usize = msgs.iter().map(Vec::len).sum();
    println!(
        "library path (decode + explode + RowBinary encode): {:.2} M rows/s, {:.1} ns/row, {:.0} MB/s of Avro \
         ({rows} rows from {n} messages, best of {rounds})",
        rows as f64 / best / 1e6,
        best * 1e9 / rows as f64,
        in_bytes as f64 / best / 1e6
    );
}
