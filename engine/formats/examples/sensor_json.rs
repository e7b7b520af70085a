//! Single-core cost of the JSON fan-out path on the issue-21 sensor
//! workload: `mapping.explode: /events` (ExplodeDecoder), the two filters
//! (`unit != "drop"`, `value >= 0`, evaluated on the encoded rows) and
//! `defaults: {region: unknown}`, into the 11 INSERT columns of the
//! workload's table.
//!
//! `cargo run --release -p spate-formats --example sensor_json`
//! (`MESSAGES`, default 2,000, of 100 events each). For instruction
//! counts: `valgrind --tool=callgrind target/release/examples/sensor_json`
//! and divide `run`'s inclusive count by the candidate rows it prints.

use std::hint::black_box;
use std::time::Instant;

use spate_core::ack::{AckIssuer, ack_channel};
use spate_core::pipeline::chain::{Decoder, Encoder, RecordCx, RecordError, Stage};
use spate_core::record::{Payload, TopicPartition};
use spate_formats::json::explode::{ExplodeDecoder, ExplodeEncoder, JsonElement};
use spate_row::coerce::TimeRules;
use spate_row::filter::{FilterExpr, Filtered};
use spate_row::spec::{MappingOptions, MissingValue, simple_columns};
use spate_row::types::ChType;

fn batch(i: u64) -> String {
    let region = if i % 10 == 0 {
        "null".to_owned()
    } else {
        format!("\"eu-{}\"", i % 4)
    };
    let produced = 1_700_000_000_000 + i * 10;
    let events: Vec<String> = (0..100u64)
        .map(|j| {
            let k = i * 100 + j;
            let unit = if k % 8 == 0 {
                "drop"
            } else {
                ["C", "hPa", "pct"][(k % 3) as usize]
            };
            let quality = if j % 5 == 0 {
                "null".to_owned()
            } else {
                (j % 3).to_string()
            };
            format!(
                "{{\"event_seq\":{j},\"sensor_id\":{s},\"name\":\"sensor-{s}\",\"value\":{v:?},\
                 \"quality\":{quality},\"unit\":\"{unit}\",\"ts\":{ts}}}",
                s = k % 1024,
                v = (k % 4000) as f64 * 0.25 - 100.0,
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

/// Encodes and filters each element into one buffer, as the terminal does.
struct Sink {
    enc: Filtered<ExplodeEncoder>,
    buf: Vec<u8>,
    kept: u64,
}

impl<'a> Stage<JsonElement<'a>> for Sink {
    fn push(&mut self, el: JsonElement<'a>, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        let start = self.buf.len();
        self.enc.encode(&el, cx, &mut self.buf)?;
        if self.enc.keep(&self.buf[start..]) {
            self.kept += 1;
        } else {
            self.buf.truncate(start);
        }
        Ok(())
    }
}

fn main() {
    let n: u64 = std::env::var("MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let messages: Vec<String> = (0..n).map(batch).collect();
    let ty = |t: &str| ChType::parse(t).unwrap();
    let mut cols = simple_columns([
        ("batch_id", ty("UInt64")),
        ("source", ty("String")),
        ("region", ty("String")),
        ("produced_at", ty("UInt64")),
        ("event_seq", ty("UInt32")),
        ("sensor_id", ty("UInt32")),
        ("name", ty("String")),
        ("value", ty("Float64")),
        ("quality", ty("Nullable(Int32)")),
        ("unit", ty("String")),
        ("ts", ty("UInt64")),
    ]);
    cols[2].missing = MissingValue::Literal("'unknown'".into());
    cols[2].options.null_as_missing = true;
    let path = vec!["events".to_owned()];
    let enc =
        ExplodeEncoder::new(cols, MappingOptions::default(), &path, &Default::default()).unwrap();
    let filter = FilterExpr::All(vec![
        FilterExpr::parse_predicate("unit != \"drop\"").unwrap(),
        FilterExpr::parse_predicate("value >= 0").unwrap(),
    ]);
    let mut sink = Sink {
        enc: Filtered::new(enc, Some(filter), TimeRules::default()).unwrap(),
        buf: Vec::with_capacity(64 << 20),
        kept: 0,
    };
    let mut dec = ExplodeDecoder::new(path, false);
    let tp = TopicPartition::new("t", 0);
    let (tx, _rx) = ack_channel();
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let ack = issuer.issue(0, n as i64);
    let start = Instant::now();
    run(&messages, &mut dec, &mut sink, &tp, &ack);
    let secs = start.elapsed().as_secs_f64();
    let rows = n * 100;
    println!(
        "sensor JSON explode + filter + encode: {rows} candidate rows, {} kept, {:.2} M candidate rows/s, {:.1} ns/candidate row, {:.1} MB out",
        sink.kept,
        rows as f64 / secs / 1e6,
        secs * 1e9 / rows as f64,
        sink.buf.len() as f64 / 1e6
    );
    black_box(&sink.buf);
}

#[inline(never)]
fn run(
    messages: &[String],
    dec: &mut ExplodeDecoder,
    sink: &mut Sink,
    tp: &TopicPartition,
    ack: &spate_core::ack::AckHandle,
) {
    for (i, m) in messages.iter().enumerate() {
        let cx = RecordCx {
            payload: Payload {
                value: Some(m.as_bytes()),
                key: None,
                partition: tp,
                offset: i as i64,
                timestamp_ms: None,
                timestamp_kind: spate_core::record::TimestampKind::None,
                headers: spate_core::record::Headers::NONE,
            },
            ack,
        };
        dec.decode(&cx, sink).unwrap();
    }
}
