//! The group's lag as Kafka sees it (issue 31): for every partition of every
//! subscribed topic, `log end - the group's committed offset`, read on an
//! interval by a client of its own on a thread of its own.
//!
//! Why not librdkafka's statistics (`spate_consumer_lag`): they cover only
//! the partitions assigned to this process, none before the group's first
//! commit, and while a partition is paused (the in-flight budget full, D2's
//! pause-and-keep-polling) they keep the high watermark of the last fetch,
//! so the lag froze during an outage. This reader asks the brokers
//! directly, like Burrow and kafka-lag-exporter do: a metadata request for
//! the topics, an OffsetFetch for the group's committed offsets and a
//! ListOffsets per partition for its log end. Whoever consumes a partition
//! (this process, another member, nobody), paused or not, it has a value.
//!
//! A partition the group never committed counts from where a new member
//! would start it: the low watermark under `auto.offset.reset` `earliest`
//! (`smallest`, `beginning`; and `error`, where nothing is read until an
//! operator acts), so a new group with a backlog shows it; the log end
//! under `latest`, so such a partition reads 0.
//!
//! D2: the reader never runs on a pipeline thread, nor on the controller:
//! its blocking requests run on the `spate-lag` thread. The controller only
//! copies the last reading into the gauges (`KafkaSource::poll_event`, a
//! check of an atomic per round), so every series keeps its pipeline's
//! metrics scope.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use metrics::Gauge;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset as KafkaOffset, TopicPartitionList};
use spate_core::record::TopicPartition;

use crate::config::{ConfigError, KafkaSourceConfig};

/// Gauge per `topic` and `partition`: the group's lag in messages as the
/// brokers report it, `log end offset - committed offset` (from where
/// `auto.offset.reset` starts when the group has no committed offset), for
/// every partition of every subscribed topic, assigned to this process or
/// not. Read every `source.kafka.lag_interval` ([`DEFAULT_LAG_INTERVAL`]).
pub const GROUP_LAG: &str = "spate_group_lag";

/// Gauge: [`GROUP_LAG`] summed over every partition of every subscribed
/// topic.
pub const GROUP_LAG_TOTAL: &str = "spate_group_total_lag";

/// Gauge: unix seconds of the last complete [`GROUP_LAG`] reading; `time() -`
/// it is the reading's age (it stops moving while the brokers cannot be
/// asked).
pub const GROUP_LAG_UPDATED: &str = "spate_group_lag_updated_timestamp_seconds";

/// Counter: lag readings that failed (a broker or the coordinator did not
/// answer within [`REQUEST_TIMEOUT`]); the gauges keep their last values.
pub const GROUP_LAG_ERRORS: &str = "spate_group_lag_errors_total";

/// The default of `source.kafka.lag_interval`.
pub const DEFAULT_LAG_INTERVAL: Duration = Duration::from_secs(10);

/// The bound on each request of one reading.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One reading of the group's lag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LagReading {
    /// Per partition: the lag, and the committed offset (`None`: the group
    /// has none; the lag then counts from where `auto.offset.reset` starts).
    pub partitions: BTreeMap<TopicPartition, PartitionLag>,
}

/// One partition's part of a [`LagReading`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionLag {
    /// Messages from the committed offset (or the reset start) to the log
    /// end; never negative.
    pub lag: i64,
    /// The group's committed offset, when it has one.
    pub committed: Option<i64>,
    /// The partition's low watermark and log end offset.
    pub low: i64,
    /// The log end offset (high watermark).
    pub high: i64,
}

impl LagReading {
    /// The lag summed over every partition.
    pub fn total(&self) -> i64 {
        self.partitions.values().map(|p| p.lag).sum()
    }
}

/// Whether a partition without a committed offset starts at its low
/// watermark under this `auto.offset.reset` (`error` included: the backlog
/// is there, waiting for an operator).
fn starts_at_low(reset: &str) -> bool {
    !matches!(reset, "latest" | "largest" | "end")
}

/// The lag of one partition: from `committed` (or the reset start) to
/// `high`, never negative.
pub fn partition_lag(committed: Option<i64>, low: i64, high: i64, reset: &str) -> i64 {
    let from = match committed {
        Some(c) => c,
        None if starts_at_low(reset) => low,
        None => high,
    };
    (high - from).max(0)
}

/// The topics of `subscription` in `metadata`: the plain names listed, and
/// every topic a `^regex` entry matches (internal topics left out).
fn subscribed_topics(
    subscription: &[String],
    patterns: &[regex::Regex],
    available: &[String],
) -> Vec<String> {
    let mut out: Vec<String> = subscription
        .iter()
        .filter(|t| !t.starts_with('^'))
        .cloned()
        .collect();
    for topic in available {
        if topic.starts_with("__") {
            continue;
        }
        if patterns.iter().any(|p| p.is_match(topic)) && !out.contains(topic) {
            out.push(topic.clone());
        }
    }
    out
}

/// Reads the group's lag once through `client` (a consumer of the group
/// that never subscribes): metadata, the committed offsets (one
/// OffsetFetch) and each partition's watermarks. A plain topic the brokers
/// do not know is left out (the source reports it).
///
/// # Errors
/// The first request that failed.
pub fn read_group_lag(
    client: &BaseConsumer,
    subscription: &[String],
    reset: &str,
    timeout: Duration,
) -> Result<LagReading, KafkaError> {
    let patterns: Vec<regex::Regex> = subscription
        .iter()
        .filter(|t| t.starts_with('^'))
        .filter_map(|t| regex::Regex::new(t).ok())
        .collect();
    let metadata = client.fetch_metadata(None, timeout)?;
    let available: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .collect();
    let topics = subscribed_topics(subscription, &patterns, &available);
    let mut list = TopicPartitionList::new();
    for t in metadata.topics() {
        if !topics.iter().any(|name| name == t.name()) || t.error().is_some() {
            continue;
        }
        for p in t.partitions() {
            list.add_partition(t.name(), p.id());
        }
    }
    let mut reading = LagReading::default();
    if list.count() == 0 {
        return Ok(reading);
    }
    let committed = client.committed_offsets(list.clone(), timeout)?;
    let mut by_partition: BTreeMap<TopicPartition, Option<i64>> = BTreeMap::new();
    for elem in committed.elements() {
        let offset = match elem.offset() {
            KafkaOffset::Offset(o) if o >= 0 => Some(o),
            _ => None,
        };
        by_partition.insert(TopicPartition::new(elem.topic(), elem.partition()), offset);
    }
    for elem in list.elements() {
        let (low, high) = client.fetch_watermarks(elem.topic(), elem.partition(), timeout)?;
        let tp = TopicPartition::new(elem.topic(), elem.partition());
        let committed = by_partition.get(&tp).copied().flatten();
        reading.partitions.insert(
            tp,
            PartitionLag {
                lag: partition_lag(committed, low, high, reset),
                committed,
                low,
                high,
            },
        );
    }
    Ok(reading)
}

/// The client the reader asks with: the source's connection and security
/// properties and its group id, never subscribed (it does not join the
/// group), no statistics, no static membership.
///
/// # Errors
/// [`ConfigError`] when the config is invalid or librdkafka refuses it.
pub fn lag_client(config: &KafkaSourceConfig) -> Result<BaseConsumer, ConfigError> {
    config.validate()?;
    let mut client = ClientConfig::new();
    for (key, value) in config.client_properties() {
        client.set(key, value);
    }
    client.remove("group.instance.id");
    client.set("statistics.interval.ms", "0");
    Ok(client.create()?)
}

#[derive(Default)]
struct Latest {
    reading: Option<Arc<LagReading>>,
    at: f64,
    errors: u64,
    stop: bool,
}

/// What the reader thread and its owner share.
#[derive(Default)]
struct Shared {
    latest: Mutex<Latest>,
    wake: Condvar,
    /// Bumped after each new reading or error.
    generation: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Latest> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The reader: a thread (`spate-lag`) reading the group's lag every
/// interval, and the gauges its owner publishes the readings to
/// ([`LagReader::publish`]). Dropping it stops the thread (it finishes the
/// request in progress, at most [`REQUEST_TIMEOUT`] each).
pub struct LagReader {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    seen: u64,
    gauges: BTreeMap<TopicPartition, Gauge>,
    total: Option<Gauge>,
    updated: Option<Gauge>,
    errors_seen: u64,
    last: Option<Arc<LagReading>>,
    /// When [`LagReader::last`] was published.
    published: Option<std::time::Instant>,
}

impl std::fmt::Debug for LagReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagReader")
            .field("partitions", &self.gauges.len())
            .finish_non_exhaustive()
    }
}

impl LagReader {
    /// Starts reading the lag of `config`'s group over its subscription
    /// every `interval` (the first reading at once).
    ///
    /// # Errors
    /// [`ConfigError`] when the client cannot be created; a thread that
    /// cannot be spawned is [`ConfigError::Client`] too.
    pub fn spawn(config: &KafkaSourceConfig, interval: Duration) -> Result<Self, ConfigError> {
        let client = lag_client(config)?;
        let subscription = config.topics.clone();
        let reset = config
            .properties
            .get("auto.offset.reset")
            .cloned()
            .unwrap_or_else(|| "largest".into());
        let group = config.group_id().to_owned();
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("spate-lag".into())
            .spawn(move || {
                read_loop(&client, &subscription, &reset, &group, interval, &theirs);
            })
            .map_err(|e| {
                ConfigError::Client(KafkaError::ClientCreation(format!(
                    "lag reader thread: {e}"
                )))
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
            seen: 0,
            gauges: BTreeMap::new(),
            total: None,
            updated: None,
            errors_seen: 0,
            last: None,
            published: None,
        })
    }

    /// Copies a reading that arrived since the last call into the gauges
    /// ([`GROUP_LAG`], [`GROUP_LAG_TOTAL`], [`GROUP_LAG_UPDATED`],
    /// [`GROUP_LAG_ERRORS`]); registers a partition's gauge at its first
    /// reading, on the calling thread (so in its metrics scope). One atomic
    /// load when nothing is new.
    pub fn publish(&mut self) {
        let generation = self.shared.generation.load(Ordering::Acquire);
        if generation == self.seen {
            return;
        }
        self.seen = generation;
        let (reading, at, errors) = {
            let latest = self.shared.lock();
            (latest.reading.clone(), latest.at, latest.errors)
        };
        if errors > self.errors_seen {
            metrics::counter!(GROUP_LAG_ERRORS).increment(errors - self.errors_seen);
            self.errors_seen = errors;
        }
        let Some(reading) = reading else {
            return;
        };
        if self.last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &reading)) {
            return;
        }
        for (tp, p) in &reading.partitions {
            self.gauges
                .entry(tp.clone())
                .or_insert_with(|| {
                    metrics::gauge!(GROUP_LAG,
                        "topic" => tp.topic().to_owned(),
                        "partition" => tp.partition().to_string())
                })
                .set(p.lag as f64);
        }
        self.total
            .get_or_insert_with(|| metrics::gauge!(GROUP_LAG_TOTAL))
            .set(reading.total() as f64);
        self.updated
            .get_or_insert_with(|| metrics::gauge!(GROUP_LAG_UPDATED))
            .set(at.floor());
        self.last = Some(reading);
        self.published = Some(std::time::Instant::now());
    }

    /// The last reading published, if any.
    pub fn last(&self) -> Option<&LagReading> {
        self.last.as_deref()
    }

    /// How long ago [`LagReader::last`] was published, if ever.
    pub fn age(&self) -> Option<Duration> {
        self.published.map(|at| at.elapsed())
    }
}

impl Drop for LagReader {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_loop(
    client: &BaseConsumer,
    subscription: &[String],
    reset: &str,
    group: &str,
    interval: Duration,
    shared: &Shared,
) {
    loop {
        let result = read_group_lag(client, subscription, reset, REQUEST_TIMEOUT);
        {
            let mut latest = shared.lock();
            if latest.stop {
                return;
            }
            match result {
                Ok(reading) => {
                    latest.reading = Some(Arc::new(reading));
                    latest.at = SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64());
                }
                Err(e) => {
                    latest.errors += 1;
                    tracing::debug!(%group, error = %e, "group lag reading failed; keeping the last one");
                }
            }
            shared.generation.fetch_add(1, Ordering::AcqRel);
            let (latest, _) = shared
                .wake
                .wait_timeout_while(latest, interval, |l| !l.stop)
                .unwrap_or_else(PoisonError::into_inner);
            if latest.stop {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_without_a_commit_counts_from_where_the_reset_starts() {
        assert_eq!(partition_lag(None, 10, 250, "earliest"), 240);
        assert_eq!(partition_lag(None, 10, 250, "smallest"), 240);
        assert_eq!(partition_lag(None, 10, 250, "error"), 240);
        assert_eq!(partition_lag(None, 10, 250, "latest"), 0);
        assert_eq!(partition_lag(Some(200), 10, 250, "latest"), 50);
        // A committed offset past the end (topic re-created) is no lag.
        assert_eq!(partition_lag(Some(300), 10, 250, "earliest"), 0);
    }

    #[test]
    fn patterns_add_the_topics_they_match_and_leave_internal_ones_out() {
        let subscription = vec!["plain".to_owned(), "^flights-.*".to_owned()];
        let patterns = vec![regex::Regex::new("^flights-.*").unwrap()];
        let available: Vec<String> = ["flights-a", "other", "__consumer_offsets", "plain"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(
            subscribed_topics(&subscription, &patterns, &available),
            vec!["plain".to_owned(), "flights-a".to_owned()]
        );
    }
}
