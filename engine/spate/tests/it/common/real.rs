//! The real Apache Kafka cluster of `ci/kafka.sh` (issue 14) for the tests
//! that need what librdkafka's mock cluster lacks: replication, a broker
//! that dies and comes back, transactions, log retention, a real group
//! coordinator.
//!
//! [`RealKafka::from_env`] reads `SPATE_KAFKA_BROKERS` (the bootstrap list
//! `ci/kafka.sh start` prints). Unset, a test prints why it is skipped and
//! passes, unless `SPATE_KAFKA_REQUIRED=1` (ci/test.sh sets it), where it
//! fails: CI never skips the real broker silently.
//!
//! The topic helpers use rdkafka's admin client (CreateTopics with a
//! replication factor and partition count, DeleteRecords; Kafka protocol
//! <https://kafka.apache.org/protocol#The_Messages_CreateTopics> and
//! `DeleteRecords`) and a group's OffsetFetch (committed offset and metadata
//! string per partition).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientContext, Message};

use super::{RPC, flight_row};

/// A handle on the running cluster: its bootstrap list and an admin client.
pub struct RealKafka {
    /// `host:port,...` as `ci/kafka.sh start` printed it.
    pub brokers: String,
    admin: AdminClient<DefaultClientContext>,
    rt: tokio::runtime::Runtime,
}

/// Whether CI demands the real broker (`SPATE_KAFKA_REQUIRED=1`).
pub fn required() -> bool {
    std::env::var("SPATE_KAFKA_REQUIRED").is_ok_and(|v| v == "1")
}

impl RealKafka {
    /// The cluster at `SPATE_KAFKA_BROKERS`; `None` after printing why the
    /// test is skipped. Panics when unset and [`required`]. The test holds a
    /// shared claim on the cluster from here on
    /// ([`spate_testkit::serial::shared`]).
    pub fn from_env() -> Option<RealKafka> {
        let brokers = match std::env::var("SPATE_KAFKA_BROKERS") {
            Ok(b) if !b.trim().is_empty() => b.trim().to_owned(),
            _ => {
                assert!(
                    !required(),
                    "SPATE_KAFKA_REQUIRED=1 but SPATE_KAFKA_BROKERS is not set: \
                     ci/kafka.sh start did not run or failed"
                );
                println!("skipped: SPATE_KAFKA_BROKERS not set (ci/kafka.sh start prints it)");
                return None;
            }
        };
        spate_testkit::serial::shared(spate_testkit::serial::Resource::Kafka);
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap_or_else(|e| panic!("admin client for {brokers}: {e}"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Some(RealKafka { brokers, admin, rt })
    }

    fn opts() -> AdminOptions {
        AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))
    }

    /// Creates `topic` with `partitions` partitions, replication factor
    /// `rf` and the topic `configs` (e.g. `("cleanup.policy", "compact")`);
    /// deletes a topic of that name first. Panics naming the topic on error.
    pub fn create_topic(&self, topic: &str, partitions: i32, rf: i32, configs: &[(&str, &str)]) {
        self.delete_topic(topic);
        let mut t = NewTopic::new(topic, partitions, TopicReplication::Fixed(rf));
        for (k, v) in configs {
            t = t.set(k, v);
        }
        let res = self
            .rt
            .block_on(self.admin.create_topics(&[t], &Self::opts()))
            .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
        for r in res {
            r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
        }
        // Until every partition has a leader in the metadata.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.leaders(topic).len() != partitions as usize {
            assert!(
                std::time::Instant::now() < deadline,
                "topic {topic}: not every partition has a leader after 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Deletes `topic` if it exists.
    pub fn delete_topic(&self, topic: &str) {
        let res = self
            .rt
            .block_on(self.admin.delete_topics(&[topic], &Self::opts()));
        if let Ok(res) = res {
            let existed = res.iter().any(Result::is_ok);
            if existed {
                // Deletion is asynchronous on the brokers.
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }

    /// DeleteRecords: moves the low watermark of each `(partition, offset)`
    /// of `topic` up to `offset`. Panics naming the partition on error.
    pub fn delete_records(&self, topic: &str, upto: &[(i32, i64)]) {
        let mut tpl = TopicPartitionList::new();
        for &(p, o) in upto {
            tpl.add_partition_offset(topic, p, Offset::Offset(o))
                .unwrap();
        }
        let res = self
            .rt
            .block_on(self.admin.delete_records(&tpl, &Self::opts()))
            .unwrap_or_else(|e| panic!("delete records of {topic}: {e}"));
        for e in res.elements() {
            if let Err(err) = e.error() {
                panic!("delete records of {topic}/{}: {err}", e.partition());
            }
        }
    }

    /// The leader's node id of each partition of `topic` (partitions
    /// without a leader are left out).
    pub fn leaders(&self, topic: &str) -> BTreeMap<i32, i32> {
        let c = self.client(None);
        let Ok(md) = c.fetch_metadata(Some(topic), RPC) else {
            return BTreeMap::new();
        };
        md.topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions())
            .filter(|p| p.leader() >= 0 && p.error().is_none())
            .map(|p| (p.id(), p.leader()))
            .collect()
    }

    /// (low, high) watermarks per partition.
    pub fn watermarks(&self, topic: &str, partitions: i32) -> BTreeMap<i32, (i64, i64)> {
        let c = self.client(None);
        (0..partitions)
            .map(|p| {
                let w = c
                    .fetch_watermarks(topic, p, RPC)
                    .unwrap_or_else(|e| panic!("watermarks of {topic}/{p}: {e}"));
                (p, w)
            })
            .collect()
    }

    /// High watermark per partition.
    pub fn ends(&self, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
        self.watermarks(topic, partitions)
            .into_iter()
            .map(|(p, (_, h))| (p, h))
            .collect()
    }

    /// `group`'s committed (offset, metadata string) per partition of
    /// `topic`, from the group coordinator (OffsetFetch); offset `None`
    /// when nothing was committed.
    pub fn committed(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
    ) -> BTreeMap<i32, (Option<i64>, String)> {
        let c = self.client(Some(group));
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        // NotCoordinator / CoordinatorLoadInProgress while the group's
        // coordinator moves or loads: ask again for a while.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let tpl = loop {
            match c.committed_offsets(tpl.clone(), RPC) {
                Ok(t) => break t,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("committed offsets of {group}: {e}; asking again");
                    std::thread::sleep(std::time::Duration::from_millis(250));
                }
                Err(e) => panic!("committed offsets of {group} on {topic}: {e}"),
            }
        };
        tpl.elements()
            .iter()
            .map(|e| {
                let o = match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                };
                (e.partition(), (o, e.metadata().to_owned()))
            })
            .collect()
    }

    /// A plain consumer (no subscription), in `group` when given.
    pub fn client(&self, group: Option<&str>) -> BaseConsumer {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.brokers)
            .set("enable.auto.commit", "false");
        if let Some(g) = group {
            cfg.set("group.id", g);
        }
        cfg.create().unwrap()
    }

    /// Every message of `topic` partition `partition` from the beginning
    /// up to its current end: (offset, payload, headers as (key, text)).
    pub fn read_partition(&self, topic: &str, partition: i32) -> Vec<Consumed> {
        let (_, high) = self.watermarks(topic, partition + 1)[&partition];
        // assign() needs a group id even when nothing is committed.
        let c = self.client(Some("spate-test-reader"));
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut out = Vec::new();
        while out.last().is_none_or(|m: &Consumed| m.0 + 1 < high) {
            assert!(
                std::time::Instant::now() < deadline,
                "{topic}/{partition}: read {} messages, not up to {high}",
                out.len()
            );
            let Some(m) = c.poll(Duration::from_millis(200)) else {
                continue;
            };
            let m = m.unwrap_or_else(|e| panic!("read {topic}/{partition}: {e}"));
            out.push((
                m.offset(),
                m.payload().unwrap_or_default().to_vec(),
                super::headers_text(&m),
            ));
        }
        out
    }
}

/// A consumed message: (offset, payload, headers as (key, value text)).
pub type Consumed = (i64, Vec<u8>, Vec<(String, String)>);

/// `ci/kafka.sh ARGS` (the same `SPATE_KAFKA_DIR`/`SPATE_KAFKA_BASE_PORT`
/// as the `start` that made the cluster, inherited from the environment).
pub fn kafka_sh(args: &[&str]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ci/kafka.sh");
    let status = Command::new("bash")
        .arg(&script)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(status.success(), "ci/kafka.sh {args:?}: {status}");
}

/// Counts delivery failures of a producer.
#[derive(Default, Clone)]
pub struct Failures(Arc<AtomicU64>);

impl Failures {
    /// Delivery failures so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl ClientContext for Failures {}

impl ProducerContext for Failures {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            eprintln!("delivery failed: {}/{} {e}", m.topic(), m.partition());
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An idempotent `acks=all` producer whose delivery failures are counted.
pub fn producer(brokers: &str) -> (BaseProducer<Failures>, Failures) {
    let failures = Failures::default();
    let p = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create_with_context(failures.clone())
        .unwrap();
    (p, failures)
}

/// Sends one record, waiting while the local queue is full.
pub fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    p: &BaseProducer<C>,
    topic: &str,
    partition: i32,
    key: &str,
    payload: &[u8],
) {
    let mut record = BaseRecord::to(topic)
        .key(key.as_bytes())
        .payload(payload)
        .partition(partition);
    loop {
        match p.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                p.poll(Duration::from_millis(5));
            }
            Err((e, _)) => panic!("produce to {topic}/{partition}: {e}"),
        }
    }
}

/// A producer thread writing flight rows with ids `0..` (id `i` to
/// partition `i % partitions`) at about `per_sec` rows a second until
/// stopped.
pub struct Steady {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    handle: Option<JoinHandle<u64>>,
}

impl Steady {
    /// Starts the thread.
    pub fn start(brokers: &str, topic: &str, partitions: i32, per_sec: u64) -> Steady {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
        let (stop2, sent2) = (Arc::clone(&stop), Arc::clone(&sent));
        let handle = std::thread::spawn(move || {
            let (p, failures) = producer(&brokers);
            let tick = Duration::from_millis(50);
            let per_tick = (per_sec / 20).max(1);
            let mut id = 0u64;
            while !stop2.load(Ordering::Acquire) {
                let t0 = std::time::Instant::now();
                for _ in 0..per_tick {
                    let row = flight_row(id);
                    send(
                        &p,
                        &topic,
                        (id % partitions as u64) as i32,
                        &format!("k{id}"),
                        row.as_bytes(),
                    );
                    id += 1;
                }
                sent2.store(id, Ordering::Release);
                p.poll(Duration::ZERO);
                if let Some(rest) = tick.checked_sub(t0.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
            p.flush(Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("flush the steady producer: {e}"));
            let failed = failures.0.load(Ordering::Relaxed);
            assert_eq!(failed, 0, "{failed} rows were not delivered to the broker");
            id
        });
        Steady {
            stop,
            sent,
            handle: Some(handle),
        }
    }

    /// Rows handed to the client so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }

    /// Stops, flushes (panics on a delivery failure): the rows produced.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.handle.take().unwrap().join().expect("steady producer")
    }
}

impl Drop for Steady {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}
