//! `spate check --sample N`: read up to N messages from the configured
//! topics without committing, run them through decode, mapping and routing
//! (no insert), and report per column how many values were missing, null,
//! defaulted or refused, the first errors (topic/partition/offset/reason) and
//! the shard distribution.
//!
//! The reader never joins the consumer group and never commits: it assigns
//! every partition of the plain (non-pattern) topics directly, starting at
//! the group's committed offset where there is one (what the next run reads)
//! and at the beginning otherwise, with `enable.auto.commit=false`. Each
//! partition contributes at most `ceil(N / partitions)` messages, so a
//! sample spans the partitions.
//!
//! This is a diagnostic, not the hot path: it parses each record with
//! `serde_json` to see which fields are present, besides running the real
//! encoder ([`JsonRowEncoder`]) and router ([`ShardRouter`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers as _, Message, Timestamp};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde_json::Value;
use spate_core::record::{Header, Headers, Payload, TimestampKind, TopicPartition};
use spate_formats::json::JsonRowEncoder;
use spate_formats::json::route::ShardRouter;
use spate_row::shard::ShardSpec;
use spate_row::spec::{ColumnSpec, MissingValue};

use crate::config::{Config, JsonMode};
use crate::kafka_tools::KafkaToolError;
use crate::service::Plan;

/// How many errors the report lists.
pub const FIRST_ERRORS: usize = 5;

/// One message read for the sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampledMessage {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// The Kafka key.
    pub key: Option<Vec<u8>>,
    /// The value (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// The timestamp (ms since the epoch) and its kind, for `_timestamp`
    /// columns.
    pub timestamp: (Option<i64>, TimestampKind),
    /// The headers in order (name, value), for `_headers` columns.
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Reads up to `n` messages from every partition of the plain topics of
/// `config` (see the module docs), waiting at most `within` overall and
/// stopping early once every partition reached its end or its share.
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
    let err = |what: String| move |source: KafkaError| KafkaToolError::Client { what, source };
    let mut client = ClientConfig::new();
    for (key, value) in &k.properties {
        client.set(key, value);
    }
    let consumer: BaseConsumer = client
        .set("bootstrap.servers", &brokers)
        .set("group.id", &k.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()
        .map_err(err(format!("client for {brokers}")))?;
    let mut wanted = TopicPartitionList::new();
    for topic in k.topics.iter().filter(|t| !t.starts_with('^')) {
        let md = consumer
            .fetch_metadata(Some(topic), within)
            .map_err(err(format!("metadata of {topic}")))?;
        let parts = md
            .topics()
            .first()
            .filter(|t| t.error().is_none())
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        if parts == 0 {
            return Err(KafkaToolError::NoTopic(topic.clone()));
        }
        for p in 0..parts as i32 {
            wanted.add_partition(topic, p);
        }
    }
    if wanted.count() == 0 || n == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer
        .committed_offsets(wanted.clone(), within)
        .map_err(err(format!("committed offsets of group {}", k.group_id)))?;
    let mut assign = TopicPartitionList::new();
    // Per partition: the offset after which the sample stops reading it
    // (its end when the sample started).
    let mut ends: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut done: BTreeMap<(String, i32), ()> = BTreeMap::new();
    for e in committed.elements() {
        let tp = (e.topic().to_owned(), e.partition());
        let (low, high) = consumer
            .fetch_watermarks(&tp.0, tp.1, within)
            .map_err(err(format!("watermarks of {}/{}", tp.0, tp.1)))?;
        let start = match e.offset() {
            Offset::Offset(o) if o >= 0 => o,
            _ => low,
        };
        if start >= high {
            done.insert(tp.clone(), ());
        }
        ends.insert(tp, high);
        assign
            .add_partition_offset(e.topic(), e.partition(), Offset::Offset(start))
            .map_err(err(format!("assigning {}/{}", e.topic(), e.partition())))?;
    }
    consumer
        .assign(&assign)
        .map_err(err("assigning the partitions".into()))?;
    let share = n.div_ceil(assign.count());
    let mut taken: BTreeMap<(String, i32), usize> = BTreeMap::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + within;
    while out.len() < n && done.len() < assign.count() && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            None | Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => return Err(err("reading the sample".into())(e)),
            Some(Ok(m)) => {
                let tp = (m.topic().to_owned(), m.partition());
                if done.contains_key(&tp) {
                    continue;
                }
                let t = taken.entry(tp.clone()).or_insert(0);
                *t += 1;
                if *t >= share || m.offset() + 1 >= ends.get(&tp).copied().unwrap_or(0) {
                    done.insert(tp.clone(), ());
                }
                out.push(SampledMessage {
                    topic: tp.0,
                    partition: tp.1,
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    timestamp: match m.timestamp() {
                        Timestamp::CreateTime(t) => (Some(t), TimestampKind::CreateTime),
                        Timestamp::LogAppendTime(t) => (Some(t), TimestampKind::LogAppendTime),
                        Timestamp::NotAvailable => (None, TimestampKind::None),
                    },
                    headers: m
                        .headers()
                        .map(|hs| {
                            hs.iter()
                                .map(|h| (h.key.as_bytes().to_vec(), h.value.map(<[u8]>::to_vec)))
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
        }
    }
    // Dropped without a commit (auto commit is off, nothing was stored).
    Ok(out)
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
    let mut encoder = JsonRowEncoder::new(plan.columns.clone(), plan.options.clone())
        .expect("the encoder was checked by plan()");
    let mut router = ShardRouter::with_spec(spec.clone());
    let mut report = SampleReport {
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
    };
    let mut buf = Vec::new();
    let note = |report: &mut SampleReport, m: &SampledMessage, reason: String| {
        report.refused += 1;
        if report.errors.len() < FIRST_ERRORS {
            report.errors.push(SampleError {
                topic: m.topic.clone(),
                partition: m.partition,
                offset: m.offset,
                reason,
            });
        }
    };
    for m in messages {
        let Some(value) = m.value.as_deref() else {
            report.records += 1;
            note(&mut report, m, "decode: no value (a tombstone)".into());
            continue;
        };
        let records: Vec<&[u8]> = match mode {
            JsonMode::Object => vec![value],
            JsonMode::Ndjson => value
                .split(|&b| b == b'\n')
                .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                .collect(),
        };
        // The message around each record, for metadata columns.
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
            report.records += 1;
            if let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(record) {
                let join = plan.options.flatten_join.as_deref();
                for (c, st) in plan.columns.iter().zip(report.columns.iter_mut()) {
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
            buf.clear();
            let payload = Payload {
                value: Some(record),
                key: m.key.as_deref(),
                partition: &tp,
                offset: m.offset,
                timestamp_ms: m.timestamp.0,
                timestamp_kind: m.timestamp.1,
                headers: Headers::from_slice(&headers),
            };
            if let Err(e) = encoder.encode_message(&payload, &mut buf) {
                if let Some(col) = &e.column {
                    if let Some(st) = report.columns.iter_mut().find(|s| &s.column == col) {
                        st.refused += 1;
                    }
                }
                note(&mut report, m, e.to_string());
                continue;
            }
            match router.try_shard_for(m.key.as_deref(), record, shards) {
                Ok(s) => report.shards[s] += 1,
                Err(e) => {
                    report.unroutable += 1;
                    let e = router.record_error(&e);
                    note(&mut report, m, format!("route: {}", e.reason));
                }
            }
        }
    }
    report
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
