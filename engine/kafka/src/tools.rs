//! Kafka helpers for local work and tests: an embedded broker (librdkafka's
//! mock cluster), a loader that spreads keyed messages (NDJSON lines, or
//! any indexed payloads) evenly over partitions, and the broker-side facts
//! a test, a demo or `spate check` looks at (end offsets, a group's
//! committed offsets, metadata reachability). Not the source: nothing here
//! runs inside a pipeline.
//!
//! The mock cluster keeps at most 5 MiB per partition (shared/ENVIRONMENT.md):
//! [`end_offsets`] refuses to report a partition whose low watermark moved,
//! so broker-side deletion is never mistaken for loss.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, DeliveryResult, Producer, ProducerContext,
};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientContext, Message};

/// An embedded broker.
pub type MockBroker = MockCluster<'static, DefaultProducerContext>;

/// A Kafka helper that failed.
#[derive(Debug, thiserror::Error)]
pub enum KafkaToolError {
    /// A client call failed.
    #[error("{what}: {source}")]
    Client {
        /// What was being done (names the broker, topic or partition).
        what: String,
        /// Why.
        source: KafkaError,
    },
    /// The topic does not exist on the brokers.
    #[error("topic `{0}` does not exist")]
    NoTopic(String),
    /// Messages the broker did not take (delivery reports with an error,
    /// e.g. a message larger than the broker's `message.max.bytes`).
    #[error("{count} message(s) to {topic} not delivered; first: {first}")]
    Undelivered {
        /// Topic.
        topic: String,
        /// How many.
        count: u64,
        /// The first failure: partition and error.
        first: String,
    },
    /// The broker deleted data (retention) from a partition.
    #[error(
        "{topic}/{partition}: low watermark is {low}, not 0: the broker deleted data (retention)"
    )]
    Retention {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Its low watermark.
        low: i64,
    },
}

fn client_err(what: impl Into<String>) -> impl FnOnce(KafkaError) -> KafkaToolError {
    let what = what.into();
    move |source| KafkaToolError::Client { what, source }
}

/// Starts an embedded broker with `topic` of `partitions` partitions.
///
/// # Errors
/// [`KafkaToolError::Client`] when the mock cluster or the topic cannot be
/// created.
pub fn start_broker(topic: &str, partitions: i32) -> Result<MockBroker, KafkaToolError> {
    let mock = MockCluster::new(1).map_err(client_err("start the embedded broker"))?;
    mock.create_topic(topic, partitions, 1)
        .map_err(client_err(format!("create topic {topic}")))?;
    Ok(mock)
}

/// The number of partitions of `topic` on `brokers` (a metadata fetch
/// bounded by `timeout`).
///
/// # Errors
/// [`KafkaToolError`] when the brokers do not answer or the topic is missing.
pub fn partition_count(
    brokers: &str,
    topic: &str,
    timeout: Duration,
) -> Result<i32, KafkaToolError> {
    partition_count_with(brokers, &std::collections::BTreeMap::new(), topic, timeout)
}

/// [`partition_count`] with the client `properties` a pipeline's consumer
/// uses (`source.kafka.properties`: security protocol, SASL, TLS), so that
/// `spate check` reaches the brokers exactly as `spate run` will: a cluster
/// that needs SASL fails here as it would there, and one that has it passes.
///
/// # Errors
/// As [`partition_count`]; also a property librdkafka refuses.
pub fn partition_count_with(
    brokers: &str,
    properties: &std::collections::BTreeMap<String, String>,
    topic: &str,
    timeout: Duration,
) -> Result<i32, KafkaToolError> {
    let mut client = ClientConfig::new();
    for (key, value) in properties {
        client.set(key, value);
    }
    let c: BaseConsumer = client
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(client_err(format!("client for {brokers}")))?;
    topic_partitions(
        &c,
        topic,
        timeout,
        &format!("metadata of {topic} from {brokers}"),
    )
}

/// The number of partitions of `topic` as `consumer`'s brokers know it
/// (one metadata fetch bounded by `timeout`; `what` names the fetch in an
/// error).
///
/// # Errors
/// [`KafkaToolError::Client`] when the brokers do not answer,
/// [`KafkaToolError::NoTopic`] when the topic is missing, in error or has
/// no partition.
pub(crate) fn topic_partitions<C: ClientContext + rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    timeout: Duration,
    what: &str,
) -> Result<i32, KafkaToolError> {
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(client_err(what))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| KafkaToolError::NoTopic(topic.to_owned()))?;
    if t.error().is_some() || t.partitions().is_empty() {
        return Err(KafkaToolError::NoTopic(topic.to_owned()));
    }
    Ok(t.partitions().len() as i32)
}

/// Records failed deliveries of [`produce_lines`] (count, first error).
#[derive(Default)]
struct DeliveryCheck(std::sync::Mutex<(u64, Option<String>)>);

impl ClientContext for DeliveryCheck {}

impl ProducerContext for DeliveryCheck {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
            g.0 += 1;
            if g.1.is_none() {
                g.1 = Some(format!("partition {}: {e}", m.partition()));
            }
        }
    }
}

/// The largest message [`produce_lines`] sends, in bytes (16 MiB).
pub const MAX_MESSAGE_BYTES: &str = "16777216";

/// Produces `lines` to `topic`: line `i` gets key `{key_prefix}{i}` and
/// partition `i % partitions` (explicit: the default partitioner is sticky
/// and would fill a few partitions). `progress` is called with the count of
/// lines handed to the client so far, every 10,000 lines and at the end.
///
/// # Errors
/// [`KafkaToolError::Client`] for a refused message or a flush that did not
/// finish within `timeout`; [`KafkaToolError::Undelivered`] when the broker
/// refused any (counted from the delivery reports after the flush).
pub fn produce_lines<'a>(
    brokers: &str,
    topic: &str,
    partitions: i32,
    lines: impl IntoIterator<Item = &'a [u8]>,
    key_prefix: &str,
    timeout: Duration,
    progress: impl FnMut(u64),
) -> Result<u64, KafkaToolError> {
    produce_indexed(
        brokers,
        topic,
        partitions,
        lines.into_iter().enumerate().map(|(i, l)| (i as u64, l)),
        key_prefix,
        timeout,
        progress,
    )
}

/// Produces `(index, payload)` items to `topic`: key `{key_prefix}{index}`,
/// partition `index % partitions` (explicit: the default partitioner is
/// sticky and would fill a few partitions). `progress` gets the count
/// handed to the client so far, every 10,000 items and at the end.
///
/// # Errors
/// As [`produce_lines`].
pub fn produce_indexed<P: AsRef<[u8]>>(
    brokers: &str,
    topic: &str,
    partitions: i32,
    items: impl IntoIterator<Item = (u64, P)>,
    key_prefix: &str,
    timeout: Duration,
    mut progress: impl FnMut(u64),
) -> Result<u64, KafkaToolError> {
    assert!(partitions > 0, "a topic has at least one partition");
    let producer: BaseProducer<DeliveryCheck> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        // Lines up to 16 MiB (librdkafka's default refuses more than 1 MB
        // before the broker sees it; the broker may still refuse).
        .set("message.max.bytes", MAX_MESSAGE_BYTES)
        .create_with_context(DeliveryCheck::default())
        .map_err(client_err(format!("producer for {brokers}")))?;
    let mut n: u64 = 0;
    for (index, payload) in items {
        let key = format!("{key_prefix}{index}");
        let mut record = BaseRecord::to(topic)
            .key(key.as_bytes())
            .payload(payload.as_ref())
            .partition((index % partitions as u64) as i32);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => {
                    return Err(client_err(format!("produce to {topic}"))(e));
                }
            }
        }
        n += 1;
        if n % 10_000 == 0 {
            producer.poll(Duration::ZERO);
            progress(n);
        }
    }
    producer
        .flush(timeout)
        .map_err(client_err(format!("flush to {topic}")))?;
    let (failed, first) = std::mem::take(
        &mut *producer
            .context()
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    if failed > 0 {
        return Err(KafkaToolError::Undelivered {
            topic: topic.to_owned(),
            count: failed,
            first: first.unwrap_or_default(),
        });
    }
    progress(n);
    Ok(n)
}

/// The high watermark of each partition of `topic`, after checking its low
/// watermark is 0.
///
/// # Errors
/// [`KafkaToolError::Retention`] when the broker deleted data, or a client
/// error.
pub fn end_offsets(
    brokers: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<BTreeMap<i32, i64>, KafkaToolError> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(client_err(format!("client for {brokers}")))?;
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = c
            .fetch_watermarks(topic, p, timeout)
            .map_err(client_err(format!("watermarks of {topic}/{p}")))?;
        if low != 0 {
            return Err(KafkaToolError::Retention {
                topic: topic.to_owned(),
                partition: p,
                low,
            });
        }
        out.insert(p, high);
    }
    Ok(out)
}

/// `group`'s committed offset per partition of `topic` (`None`: nothing
/// committed).
///
/// # Errors
/// [`KafkaToolError::Client`] when the coordinator does not answer.
pub fn committed_offsets(
    brokers: &str,
    group: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<BTreeMap<i32, Option<i64>>, KafkaToolError> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .map_err(client_err(format!("client for {brokers}")))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let tpl = c
        .committed_offsets(tpl, timeout)
        .map_err(client_err(format!(
            "committed offsets of {group} on {topic}"
        )))?;
    Ok(tpl
        .elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            (e.partition(), o)
        })
        .collect())
}
