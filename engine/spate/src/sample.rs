//! `spate check --sample N`: read up to N messages from the configured
//! topics without committing, run them through decode, mapping and routing
//! (no insert), and report per column how many values were missing, null,
//! defaulted or refused, the first errors (topic/partition/offset/reason) and
//! the shard distribution.
//!
//! The reader, [`spate_kafka::sample`], never joins the consumer group and
//! never commits: it starts at the group's committed offsets (what the next
//! run reads), at the beginning otherwise, and takes at most
//! `ceil(N / partitions)` messages per partition.
//!
//! This is a diagnostic, not the hot path: it parses each record with
//! `serde_json` to see which fields are present, besides running the real
//! encoder ([`JsonRowEncoder`]) and router ([`ShardRouter`]).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;
use spate_core::record::{Header, Headers, Payload, TopicPartition};
use spate_formats::json::JsonRowEncoder;
use spate_formats::json::route::ShardRouter;
use spate_row::shard::ShardSpec;
use spate_row::spec::{ColumnSpec, MissingValue};

use crate::config::{Config, JsonMode};
use crate::service::Plan;
use spate_kafka::tools::KafkaToolError;

/// How many errors the report lists.
pub const FIRST_ERRORS: usize = 5;

pub use spate_kafka::sample::SampledMessage;

/// Reads up to `n` messages from every partition of the plain topics of
/// `config`, from the group's committed offsets, never committing
/// ([`spate_kafka::sample::read`]), waiting at most `within`.
///
/// # Errors
/// [`KafkaToolError`] when the client cannot be created, a topic does not
/// exist, or the committed offsets or the assignment fail.
pub fn read(
    config: &Config,
    n: usize,
    within: Duration,
) -> Result<Vec<SampledMessage>, KafkaToolError> {
    let k = &config.source.kafka;
    let brokers = k.brokers.joined();
    let from = spate_kafka::sample::SampleSource {
        brokers: &brokers,
        group_id: &k.group_id,
        topics: &k.topics,
        properties: &k.properties,
    };
    spate_kafka::sample::read(&from, n, within)
}

/// What happened to one column over the sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColumnStats {
    /// The column.
    pub column: String,
    /// Its source field, as `check` prints it.
    pub field: String,
    /// Records without the field.
    pub missing: u64,
    /// Records with `null` there.
    pub null: u64,
    /// Records where the column's constant DEFAULT applies (field missing
    /// or null, the column has a DEFAULT spate encodes).
    pub defaulted: u64,
    /// Records the encoder refused naming this column.
    pub refused: u64,
}

/// One error found in the sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleError {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// What failed, with the column.
    pub reason: String,
}

/// The sample's findings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleReport {
    /// Messages read.
    pub messages: u64,
    /// Records in them (one per message, or one per line for NDJSON).
    pub records: u64,
    /// Records the encoder or the router refused.
    pub refused: u64,
    /// Per INSERT column, in order.
    pub columns: Vec<ColumnStats>,
    /// Records per shard (routed and encoded).
    pub shards: Vec<u64>,
    /// Records without their shard key (or with a value the typed mode
    /// refuses).
    pub unroutable: u64,
    /// The first [`FIRST_ERRORS`] errors.
    pub errors: Vec<SampleError>,
}

/// Runs `messages` through decode, the mapping of `plan` and the router of
/// `spec` over `shards` shards (at least 1).
///
/// # Panics
/// When `plan`'s encoder cannot be built (`plan()` checked it already).
pub fn analyze(
    plan: &Plan,
    spec: &ShardSpec,
    shards: usize,
    mode: JsonMode,
    messages: &[SampledMessage],
) -> SampleReport {
    let mut analyzer = Analyzer {
        plan,
        encoder: JsonRowEncoder::new(plan.columns.clone(), plan.options.clone())
            .expect("the encoder was checked by plan()"),
        router: ShardRouter::with_spec(spec.clone()),
        shards,
        buf: Vec::new(),
        report: SampleReport {
            messages: messages.len() as u64,
            columns: plan
                .columns
                .iter()
                .map(|c| ColumnStats {
                    column: c.name.clone(),
                    field: plan.describe(c).0,
                    ..ColumnStats::default()
                })
                .collect(),
            shards: vec![0; shards],
            ..SampleReport::default()
        },
    };
    for m in messages {
        analyzer.message(m, mode);
    }
    analyzer.report
}

/// The real encoder and router over the sample, and what they found.
struct Analyzer<'p> {
    plan: &'p Plan,
    encoder: JsonRowEncoder,
    router: ShardRouter,
    shards: usize,
    buf: Vec<u8>,
    report: SampleReport,
}

impl Analyzer<'_> {
    /// One message: its records (one, or one per NDJSON line), each with
    /// the message around it for metadata columns. A tombstone is one
    /// refused record.
    fn message(&mut self, m: &SampledMessage, mode: JsonMode) {
        let Some(value) = m.value.as_deref() else {
            self.report.records += 1;
            self.report.note(m, "decode: no value (a tombstone)".into());
            return;
        };
        let records: Vec<&[u8]> = match mode {
            JsonMode::Object => vec![value],
            JsonMode::Ndjson => value
                .split(|&b| b == b'\n')
                .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                .collect(),
        };
        let tp = TopicPartition::new(m.topic.as_str(), m.partition);
        let headers: Vec<Header<'_>> = m
            .headers
            .iter()
            .map(|(name, value)| Header {
                name,
                value: value.as_deref(),
            })
            .collect();
        for record in records {
            self.report.records += 1;
            self.count_fields(record);
            let payload = Payload {
                value: Some(record),
                key: m.key.as_deref(),
                partition: &tp,
                offset: m.offset,
                timestamp_ms: m.timestamp.0,
                timestamp_kind: m.timestamp.1,
                headers: Headers::from_slice(&headers),
            };
            self.encode_and_route(m, &payload, record);
        }
    }

    /// Counts, per non-metadata column, a record missing its field or
    /// holding `null` there (and the constant DEFAULT that then applies).
    fn count_fields(&mut self, record: &[u8]) {
        let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(record) else {
            return;
        };
        let join = self.plan.options.flatten_join.as_deref();
        for (c, st) in self.plan.columns.iter().zip(self.report.columns.iter_mut()) {
            if c.meta.is_some() {
                continue;
            }
            match lookup(&obj, c, join) {
                None => st.missing += 1,
                Some(Value::Null) => st.null += 1,
                Some(_) => continue,
            }
            if matches!(c.missing, MissingValue::Literal(_)) {
                st.defaulted += 1;
            }
        }
    }

    /// Runs the encoder, then the router, over one record; counts a
    /// refusal against its column and notes it.
    fn encode_and_route(&mut self, m: &SampledMessage, payload: &Payload<'_>, record: &[u8]) {
        self.buf.clear();
        if let Err(e) = self.encoder.encode_message(payload, &mut self.buf) {
            if let Some(col) = &e.column {
                if let Some(st) = self.report.columns.iter_mut().find(|s| &s.column == col) {
                    st.refused += 1;
                }
            }
            self.report.note(m, e.to_string());
            return;
        }
        match self
            .router
            .try_shard_for(m.key.as_deref(), record, self.shards)
        {
            Ok(s) => self.report.shards[s] += 1,
            Err(e) => {
                self.report.unroutable += 1;
                let e = self.router.record_error(&e);
                self.report.note(m, format!("route: {}", e.reason));
            }
        }
    }
}

/// The value of column `c`'s source in `obj`: its path, or its name (with a
/// flatten join, also as nested objects whose keys joined give the name).
fn lookup<'a>(
    obj: &'a serde_json::Map<String, Value>,
    c: &ColumnSpec,
    join: Option<&str>,
) -> Option<&'a Value> {
    if let Some(path) = &c.path {
        let (last, parents) = path.split_last()?;
        let mut o = obj;
        for seg in parents {
            o = o.get(seg)?.as_object()?;
        }
        return o.get(last);
    }
    flat(obj, &c.name, join)
}

fn flat<'a>(
    obj: &'a serde_json::Map<String, Value>,
    name: &str,
    join: Option<&str>,
) -> Option<&'a Value> {
    if let Some(v) = obj.get(name) {
        return Some(v);
    }
    let join = join?;
    obj.iter().find_map(|(k, v)| {
        let rest = name.strip_prefix(k.as_str())?.strip_prefix(join)?;
        flat(v.as_object()?, rest, Some(join))
    })
}

impl SampleReport {
    /// A refused record of message `m`: counted, and listed among the
    /// first [`FIRST_ERRORS`].
    fn note(&mut self, m: &SampledMessage, reason: String) {
        self.refused += 1;
        if self.errors.len() < FIRST_ERRORS {
            self.errors.push(SampleError {
                topic: m.topic.clone(),
                partition: m.partition,
                offset: m.offset,
                reason,
            });
        }
    }

    /// The findings a user must look at, one line each: refused records,
    /// records without their shard key, columns whose field no sampled
    /// record has (a typo in a rename?).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.refused > self.unroutable {
            out.push(format!(
                "{} of {} sampled record(s) refused by the mapping",
                self.refused - self.unroutable,
                self.records
            ));
        }
        if self.unroutable > 0 {
            out.push(format!(
                "{} of {} sampled record(s) have no usable shard key \
                 (sink.clickhouse.shard_key)",
                self.unroutable, self.records
            ));
        }
        for c in &self.columns {
            if self.records > 0 && c.missing == self.records {
                out.push(format!(
                    "column `{}`: no sampled record has its source field `{}` \
                     (a typo in the mapping?)",
                    c.column, c.field
                ));
            }
        }
        out
    }

    /// The report as `check` prints it.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "sample: {} message(s), {} record(s), {} refused (nothing committed, nothing inserted)",
            self.messages, self.records, self.refused
        );
        let w = self
            .columns
            .iter()
            .map(|c| c.column.len())
            .chain([6])
            .max()
            .unwrap_or(6);
        let _ = writeln!(
            s,
            "  {:w$}  {:>8} {:>8} {:>9} {:>8}  source field",
            "column", "missing", "null", "defaulted", "refused"
        );
        for c in &self.columns {
            let _ = writeln!(
                s,
                "  {:w$}  {:>8} {:>8} {:>9} {:>8}  {}",
                c.column, c.missing, c.null, c.defaulted, c.refused, c.field
            );
        }
        let dist: Vec<String> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, n)| format!("shard {i}: {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  shards: {}; without a shard key: {}",
            dist.join(", "),
            self.unroutable
        );
        for e in &self.errors {
            let _ = writeln!(
                s,
                "  error at {}/{} offset {}: {}",
                e.topic, e.partition, e.offset, e.reason
            );
        }
        s
    }
}
