//! A few messages of each partition, read without joining the group or
//! committing: what `spate check --sample N` runs through the chain.
//!
//! The reader assigns every partition of the plain (non-pattern) topics
//! directly, starting at the group's committed offset where there is one
//! (what the next run reads) and at the beginning otherwise, with
//! `enable.auto.commit=false` and nothing stored, so the group's offsets
//! stay as they were. Each partition contributes at most
//! `ceil(N / partitions)` messages, so a sample spans the partitions; it
//! stops at each partition's end as it was when the sample started, and at
//! the time bound.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers as _, Message, Timestamp};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use spate_core::record::TimestampKind;

use crate::tools::{self, KafkaToolError};

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

/// Where a sample reads from.
#[derive(Clone, Copy, Debug)]
pub struct SampleSource<'a> {
    /// Bootstrap brokers.
    pub brokers: &'a str,
    /// The group whose committed offsets the sample starts at (never
    /// joined, never committed).
    pub group_id: &'a str,
    /// The topics; `^` patterns are left out.
    pub topics: &'a [String],
    /// The consumer's client properties (security, TLS, SASL), as the
    /// pipeline's.
    pub properties: &'a BTreeMap<String, String>,
}

/// A topic and partition.
type Tp = (String, i32);

fn client_err(what: String) -> impl FnOnce(KafkaError) -> KafkaToolError {
    move |source| KafkaToolError::Client { what, source }
}

/// Reads up to `n` messages from every partition of `from`'s plain topics
/// (see the module docs), waiting at most `within` overall and stopping
/// early once every partition reached its end or its share.
///
/// # Errors
/// [`KafkaToolError`] when the client cannot be created, a topic does not
/// exist, or the committed offsets or the assignment fail.
pub fn read(
    from: &SampleSource<'_>,
    n: usize,
    within: Duration,
) -> Result<Vec<SampledMessage>, KafkaToolError> {
    let consumer = consumer(from)?;
    let wanted = partitions(&consumer, from.topics, within)?;
    if wanted.count() == 0 || n == 0 {
        return Ok(Vec::new());
    }
    let start = Start::at_committed(&consumer, from.group_id, wanted, within)?;
    consumer
        .assign(&start.assign)
        .map_err(client_err("assigning the partitions".into()))?;
    let out = start.poll(&consumer, n, within)?;
    // Dropped without a commit (auto commit is off, nothing was stored).
    Ok(out)
}

/// A consumer that never commits nor stores an offset.
fn consumer(from: &SampleSource<'_>) -> Result<BaseConsumer, KafkaToolError> {
    let mut client = ClientConfig::new();
    for (key, value) in from.properties {
        client.set(key, value);
    }
    client
        .set("bootstrap.servers", from.brokers)
        .set("group.id", from.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .create()
        .map_err(client_err(format!("client for {}", from.brokers)))
}

/// Every partition of the plain topics (one metadata fetch each).
fn partitions(
    consumer: &BaseConsumer,
    topics: &[String],
    within: Duration,
) -> Result<TopicPartitionList, KafkaToolError> {
    let mut wanted = TopicPartitionList::new();
    for topic in topics.iter().filter(|t| !t.starts_with('^')) {
        let parts =
            tools::topic_partitions(consumer, topic, within, &format!("metadata of {topic}"))?;
        for p in 0..parts {
            wanted.add_partition(topic, p);
        }
    }
    Ok(wanted)
}

/// Where the sample starts in each partition, and where it stops.
struct Start {
    /// Each partition at its start: the group's committed offset, else
    /// the low watermark.
    assign: TopicPartitionList,
    /// Per partition: the offset after which the sample stops reading it
    /// (its end when the sample started).
    ends: BTreeMap<Tp, i64>,
    /// Partitions with nothing (more) to read.
    done: BTreeMap<Tp, ()>,
}

impl Start {
    /// The start of each partition in `wanted`: the committed offset of
    /// `group`, else the beginning.
    fn at_committed(
        consumer: &BaseConsumer,
        group: &str,
        wanted: TopicPartitionList,
        within: Duration,
    ) -> Result<Self, KafkaToolError> {
        let committed = consumer
            .committed_offsets(wanted, within)
            .map_err(client_err(format!("committed offsets of group {group}")))?;
        let mut start = Start {
            assign: TopicPartitionList::new(),
            ends: BTreeMap::new(),
            done: BTreeMap::new(),
        };
        for e in committed.elements() {
            let tp = (e.topic().to_owned(), e.partition());
            let (low, high) = consumer
                .fetch_watermarks(&tp.0, tp.1, within)
                .map_err(client_err(format!("watermarks of {}/{}", tp.0, tp.1)))?;
            let at = match e.offset() {
                Offset::Offset(o) if o >= 0 => o,
                _ => low,
            };
            if at >= high {
                start.done.insert(tp.clone(), ());
            }
            start.ends.insert(tp, high);
            start
                .assign
                .add_partition_offset(e.topic(), e.partition(), Offset::Offset(at))
                .map_err(client_err(format!(
                    "assigning {}/{}",
                    e.topic(),
                    e.partition()
                )))?;
        }
        Ok(start)
    }

    /// Polls until `n` messages, every partition's share or end, or
    /// `within`.
    fn poll(
        mut self,
        consumer: &BaseConsumer,
        n: usize,
        within: Duration,
    ) -> Result<Vec<SampledMessage>, KafkaToolError> {
        let share = n.div_ceil(self.assign.count());
        let mut taken: BTreeMap<Tp, usize> = BTreeMap::new();
        let mut out = Vec::new();
        let deadline = Instant::now() + within;
        while out.len() < n && self.done.len() < self.assign.count() && Instant::now() < deadline {
            let m = match consumer.poll(Duration::from_millis(100)) {
                None | Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(e)) => return Err(client_err("reading the sample".into())(e)),
                Some(Ok(m)) => m,
            };
            let tp = (m.topic().to_owned(), m.partition());
            if self.done.contains_key(&tp) {
                continue;
            }
            let t = taken.entry(tp.clone()).or_insert(0);
            *t += 1;
            if *t >= share || m.offset() + 1 >= self.ends.get(&tp).copied().unwrap_or(0) {
                self.done.insert(tp, ());
            }
            out.push(sampled(&m));
        }
        Ok(out)
    }
}

/// A copy of `m` for the sample.
fn sampled(m: &BorrowedMessage<'_>) -> SampledMessage {
    SampledMessage {
        topic: m.topic().to_owned(),
        partition: m.partition(),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample spans the partitions (at most its share of each), reads
    /// from the beginning of a group that committed nothing, and commits
    /// nothing.
    #[test]
    fn a_sample_takes_a_share_of_each_partition_and_commits_nothing() {
        let mock = tools::start_broker("events", 2).expect("mock broker");
        let brokers = mock.bootstrap_servers();
        let lines: Vec<Vec<u8>> = (0..10)
            .map(|i| format!("{{\"i\":{i}}}").into_bytes())
            .collect();
        let rpc = Duration::from_secs(10);
        tools::produce_lines(
            &brokers,
            "events",
            2,
            lines.iter().map(Vec::as_slice),
            "k",
            rpc,
            |_| {},
        )
        .expect("produced");
        let topics = vec!["events".to_owned(), "^ignored".to_owned()];
        let properties = BTreeMap::new();
        let from = SampleSource {
            brokers: &brokers,
            group_id: "g",
            topics: &topics,
            properties: &properties,
        };
        let got = read(&from, 4, Duration::from_secs(20)).expect("sample");
        let per = |p: i32| got.iter().filter(|m| m.partition == p).count();
        assert_eq!((got.len(), per(0), per(1)), (4, 2, 2), "{got:?}");
        assert!(got.iter().all(|m| m.topic == "events" && m.offset < 2));
        let committed = tools::committed_offsets(&brokers, "g", "events", 2, rpc).expect("read");
        assert!(committed.values().all(Option::is_none), "{committed:?}");
    }
}
