//! The dead-letter producer of `on_error.dead_letter`: a skipped record goes
//! to the dead-letter topic as it came (key, bytes, a tombstone as a
//! tombstone) with headers naming why and where from (D6: nothing vanishes).
//! It implements spate-core's [`DeadLetter`] seam, called on a pipeline
//! thread, and never blocks it (D2): a full producer queue is a counted
//! loss, not a wait.
//!
//! Tests: below (an undeliverable dead letter is counted; a tombstone stays
//! one, against librdkafka's mock cluster).

use std::time::Duration;

use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use spate_core::pipeline::DeadLetter;
use spate_core::pipeline::chain::RecordError;
use spate_core::record::Payload;

/// Name of the counter of skipped records that could not be handed to the
/// dead-letter producer (its queue was full or it refused them).
pub const DEAD_LETTER_DROPPED: &str = "spate_dead_letter_dropped_total";

/// The dead-letter producer could not be created.
#[derive(Debug, thiserror::Error)]
#[error("dead-letter producer for topic `{topic}`: {source}")]
pub struct DeadLetterError {
    /// The dead-letter topic.
    pub topic: String,
    /// Why librdkafka refused it.
    pub source: rdkafka::error::KafkaError,
}

/// Produces skipped records to the dead-letter topic with their original
/// key and bytes and headers `spate.reason`, `spate.source` (topic/partition)
/// and `spate.offset`. Never blocks the pipeline thread (D2). A dead letter
/// that does not reach the topic is never lost silently (D6): a full
/// producer queue at send time, a delivery report with an error (the broker
/// refused it, or `message.timeout.ms` passed), and a dead letter still
/// queued when the final flush times out are each logged with the record's
/// partition and offset and counted in [`DEAD_LETTER_DROPPED`]; the skip
/// itself is counted by the engine.
pub struct KafkaDeadLetter {
    producer: ThreadedProducer<DeadLetterContext>,
    topic: String,
}

/// Reads the dead-letter producer's delivery reports.
struct DeadLetterContext {
    topic: String,
    dropped: metrics::Counter,
    dropped_total: std::sync::atomic::AtomicU64,
}

impl DeadLetterContext {
    fn drop_one(&self, what: std::fmt::Arguments<'_>) {
        self.dropped.increment(1);
        self.dropped_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::error!("dead-letter topic {}: lost {what}", self.topic);
    }
}

impl ClientContext for DeadLetterContext {}

impl ProducerContext for DeadLetterContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, msg)) = result {
            // The headers we wrote name the record.
            let header = |key: &str| {
                msg.headers()
                    .and_then(|h| h.iter().find(|x| x.key == key))
                    .and_then(|x| x.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_else(|| "?".into())
            };
            self.drop_one(format_args!(
                "{}@{}: delivery failed: {e}",
                header("spate.source"),
                header("spate.offset")
            ));
        }
    }
}

impl KafkaDeadLetter {
    /// A producer to `topic` on `brokers` (the source's).
    ///
    /// # Errors
    /// [`DeadLetterError`] when librdkafka refuses the config.
    pub fn new(brokers: &str, topic: &str) -> Result<Self, DeadLetterError> {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", brokers);
        Self::with_client(client, topic)
    }

    /// A producer to `topic` with `client`'s settings (brokers and any
    /// passthrough), plus the dead-letter defaults below.
    fn with_client(mut client: ClientConfig, topic: &str) -> Result<Self, DeadLetterError> {
        client.set("linger.ms", "20");
        // A dead letter is the original message, which may exceed librdkafka's
        // 1 MB default; allow what the consumer may receive (its
        // receive.message.max.bytes default, 100 MB).
        if client.get("message.max.bytes").is_none() {
            client.set("message.max.bytes", "100000000");
        }
        let context = DeadLetterContext {
            topic: topic.to_owned(),
            dropped: metrics::counter!(DEAD_LETTER_DROPPED),
            dropped_total: std::sync::atomic::AtomicU64::new(0),
        };
        let producer = client
            .create_with_context(context)
            .map_err(|source| DeadLetterError {
                topic: topic.to_owned(),
                source,
            })?;
        Ok(Self {
            producer,
            topic: topic.to_owned(),
        })
    }

    /// Dead letters lost so far (also in [`DEAD_LETTER_DROPPED`]).
    pub fn dropped(&self) -> u64 {
        self.producer
            .context()
            .dropped_total
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits up to `timeout` for queued dead letters to reach the broker;
    /// those still queued after it are counted as lost.
    pub fn flush(&self, timeout: Duration) {
        if let Err(e) = self.producer.flush(timeout) {
            let left = self.producer.in_flight_count().max(0);
            for _ in 0..left {
                self.producer
                    .context()
                    .drop_one(format_args!("a queued dead letter: flush: {e}"));
            }
        }
    }
}

impl DeadLetter for KafkaDeadLetter {
    fn dead_letter(&self, payload: &Payload<'_>, error: &RecordError) {
        let reason = error.to_string();
        let source = payload.partition.to_string();
        let offset = payload.offset.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "spate.reason",
                value: Some(reason.as_bytes()),
            })
            .insert(Header {
                key: "spate.source",
                value: Some(source.as_bytes()),
            })
            .insert(Header {
                key: "spate.offset",
                value: Some(offset.as_bytes()),
            });
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic).headers(headers);
        // A tombstone stays a tombstone (a null value, not an empty one), so
        // its dead-letter copy still deletes in a compacted topic.
        if let Some(value) = payload.value {
            record = record.payload(value);
        }
        if let Some(k) = payload.key {
            record = record.key(k);
        }
        if let Err((e, _)) = self.producer.send(record) {
            self.producer
                .context()
                .drop_one(format_args!("{source}@{offset}: send: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::record::TopicPartition;

    /// A consumed message at `offset` of `tp`, without timestamp or headers.
    fn message<'a>(
        tp: &'a TopicPartition,
        offset: spate_core::record::Offset,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
    ) -> Payload<'a> {
        Payload {
            value,
            key,
            partition: tp,
            offset,
            timestamp_ms: None,
            timestamp_kind: spate_core::record::TimestampKind::None,
            headers: spate_core::record::Headers::NONE,
        }
    }

    /// D6: a dead letter the broker never takes is counted, not lost
    /// silently. Nothing listens on port 1; the message times out.
    #[test]
    fn undeliverable_dead_letters_are_counted() {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "300");
        let dl = KafkaDeadLetter::with_client(client, "dead").expect("producer");
        let tp = TopicPartition::new("events", 3);
        for offset in [7, 8] {
            let payload = message(&tp, offset, None, Some(b"not json"));
            dl.dead_letter(&payload, &RecordError::decode("expected a JSON object"));
        }
        dl.flush(Duration::from_secs(5));
        assert_eq!(dl.dropped(), 2);
    }

    /// A dead letter is the original message: a tombstone's copy has a null
    /// value (not an empty one) and its key; other values keep their bytes.
    #[test]
    fn a_dead_tombstone_stays_a_tombstone() {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let mock = crate::tools::start_broker("dead", 1).expect("mock broker");
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", mock.bootstrap_servers());
        let dl = KafkaDeadLetter::with_client(client, "dead").expect("producer");
        let tp = TopicPartition::new("events", 0);
        for (offset, value) in [(1, None), (2, Some(&b""[..])), (3, Some(&b"x"[..]))] {
            let payload = message(&tp, offset, Some(b"k1"), value);
            dl.dead_letter(&payload, &RecordError::decode("refused"));
        }
        dl.flush(Duration::from_secs(5));
        assert_eq!(dl.dropped(), 0);
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .set("group.id", "reader")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("dead", 0, rdkafka::Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while got.len() < 3 && std::time::Instant::now() < deadline {
            if let Some(m) = c.poll(Duration::from_millis(200)) {
                let m = m.unwrap();
                got.push((m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)));
            }
        }
        let key = Some(b"k1".to_vec());
        assert_eq!(
            got,
            vec![
                (key.clone(), None),
                (key.clone(), Some(Vec::new())),
                (key, Some(b"x".to_vec()))
            ]
        );
    }
}
