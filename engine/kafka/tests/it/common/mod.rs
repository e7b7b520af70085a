//! Helpers shared by the mock-cluster tests: a mock cluster with one
//! topic, an evenly spread keyed preload, watermarks and committed offsets
//! read by independent clients, and a whole pipeline on a [`KafkaSource`]
//! writing to a [`CaptureWriter`].
//!
//! Facts about the mock these helpers rely on (shared/ENVIRONMENT.md): it
//! keeps at most 5 MiB per partition, so [`end_offsets`] checks the low
//! watermark is 0 before anyone counts; its first group join waits 3 s.
#![allow(dead_code)] // not every part is used

use std::collections::BTreeMap;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use spate_core::pipeline::chain::{PayloadDecoder, RoundRobin};
use spate_core::pipeline::driver::{ChainProcessor, Processor};
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{Pipeline, PipelineConfig, RunReport, Shutdown};
use spate_core::sink::{SinkConfig, Writer};
use spate_kafka::{KafkaSource, KafkaSourceConfig};
use spate_testkit::{CaptureWriter, LineEncoder};

/// Bound on every broker round trip the tests make themselves.
pub const RPC: Duration = Duration::from_secs(10);
/// Bound on waiting for a pipeline to deliver and commit everything.
pub const DELIVERY: Duration = Duration::from_secs(45);

pub type Mock = MockCluster<'static, DefaultProducerContext>;

/// Sends `tracing` output to the test's captured output (shown on failure);
/// `RUST_LOG` filters it (default: spate's own info lines).
pub fn logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("spate_kafka=info,spate_core=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

pub fn mock(topic: &str, partitions: i32) -> (Mock, String) {
    logs();
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic(topic, partitions, 1)
        .expect("create topic");
    let bootstrap = mock.bootstrap_servers();
    (mock, bootstrap)
}

pub fn value(i: usize) -> String {
    format!("r{i:07}")
}

/// Produces records `ids` with keys, record `i` to partition `i % partitions`
/// (explicit, so the preload is spread evenly: the sticky partitioner is not).
pub fn produce(bootstrap: &str, topic: &str, partitions: i32, ids: std::ops::Range<usize>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for i in ids {
        let key = format!("k{i}");
        let payload = value(i);
        let mut record = BaseRecord::to(topic)
            .key(&key)
            .payload(&payload)
            .partition((i % partitions as usize) as i32);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) => {
                    assert!(
                        e.rdkafka_error_code() == Some(rdkafka::error::RDKafkaErrorCode::QueueFull),
                        "produce: {e}"
                    );
                    record = r;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(RPC).expect("flush");
}

pub fn plain_consumer(bootstrap: &str, group: Option<&str>) -> BaseConsumer {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    if let Some(g) = group {
        config.set("group.id", g);
    }
    config.create().expect("consumer")
}

/// The high watermark of every partition, after checking its low watermark is
/// 0 (the mock's retention deletes old data; that must not look like loss).
pub fn end_offsets(bootstrap: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c = plain_consumer(bootstrap, None);
    (0..partitions)
        .map(|p| {
            let (low, high) = c.fetch_watermarks(topic, p, RPC).expect("watermarks");
            assert_eq!(
                low, 0,
                "{topic}/{p}: the mock cluster deleted data (retention)"
            );
            (p, high)
        })
        .collect()
}

/// The group's committed offset per partition (`None`: nothing committed).
pub fn committed(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    let c = plain_consumer(bootstrap, Some(group));
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let tpl = c.committed_offsets(tpl, RPC).expect("committed offsets");
    tpl.elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            (e.partition(), offset)
        })
        .collect()
}

/// Reads the whole topic back: (partition, offset) -> value.
pub fn read_log(
    bootstrap: &str,
    topic: &str,
    ends: &BTreeMap<i32, i64>,
) -> BTreeMap<(i32, i64), String> {
    // assign() needs a group; this one never commits (auto-commit off).
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "spate-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for &p in ends.keys() {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).expect("assign");
    let total: i64 = ends.values().sum();
    let mut log = BTreeMap::new();
    let deadline = Instant::now() + DELIVERY;
    while (log.len() as i64) < total {
        assert!(
            Instant::now() < deadline,
            "read back {} of {total}",
            log.len()
        );
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.expect("read back");
            let v = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
            log.insert((m.partition(), m.offset()), v);
        }
    }
    log
}

pub fn source_config(
    bootstrap: &str,
    topic: &str,
    group: &str,
    strategy: &str,
) -> KafkaSourceConfig {
    let mut c = KafkaSourceConfig::new([topic]);
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", strategy)
        .set("session.timeout.ms", "4000")
        .set("heartbeat.interval.ms", "300")
        .set("statistics.interval.ms", "500");
    c.max_batch = 256;
    c
}

pub struct Running {
    pub shutdown: Shutdown,
    pub handle: JoinHandle<RunReport>,
}

impl Running {
    pub fn stop(self) -> RunReport {
        self.shutdown.trigger();
        self.handle.join().expect("pipeline thread")
    }
}

/// Runs a pipeline on `source` in thread mode with `threads` pipeline threads,
/// writing each value as one line to `writer`.
pub fn run(source: KafkaSource, writer: CaptureWriter, threads: usize) -> Running {
    run_with(source, writer, threads, Duration::from_secs(10))
}

/// [`run`] with a `rebalance.drain_timeout`.
pub fn run_with(
    source: KafkaSource,
    writer: CaptureWriter,
    threads: usize,
    drain: Duration,
) -> Running {
    run_custom(source, writer, threads, |c| {
        c.rebalance_drain_timeout = drain
    })
}

/// [`run`] after `tune` adjusted the pipeline config (the defaults: commits
/// every 100 ms, 10 s revoke drain, 5 s shutdown drain, 10 ms sink linger).
pub fn run_custom<W: Writer>(
    source: KafkaSource,
    writer: W,
    threads: usize,
    tune: impl FnOnce(&mut PipelineConfig),
) -> Running {
    let mut sink = SinkConfig::new("kafka-test", vec![vec!["a".into()]]);
    sink.batch.linger = Duration::from_millis(10);
    let mut config = PipelineConfig::new(sink);
    config.threads = threads;
    config.checkpoint_interval = Duration::from_millis(100);
    config.rebalance_drain_timeout = Duration::from_secs(10);
    config.shutdown_drain_timeout = Duration::from_secs(5);
    tune(&mut config);
    let pipeline = Pipeline::builder(config, source, writer, |buffers: ChunkBuffers| {
        ChainProcessor::new(
            PayloadDecoder,
            Terminal::new(LineEncoder, RoundRobin::default(), buffers),
        )
    })
    .build()
    .expect("valid pipeline config");
    spawn(pipeline)
}

/// Runs `pipeline` in thread mode on its own thread until [`Running::stop`].
/// The test holds a shared claim ([`spate_testkit::serial::shared`]) from
/// here on: `mock_metrics` reads process-wide counters any pipeline adds to.
pub fn spawn<W, F, P>(pipeline: Pipeline<KafkaSource, W, F>) -> Running
where
    W: Writer,
    P: Processor + 'static,
    F: Fn(ChunkBuffers) -> P + Send + Sync + 'static,
{
    spate_testkit::serial::shared(spate_testkit::serial::Resource::Recorder);
    let shutdown = Shutdown::new();
    let trigger = shutdown.clone();
    let handle = thread::Builder::new()
        .name("pipeline".into())
        .spawn(move || pipeline.run_threaded(trigger, 1))
        .expect("spawn");
    Running { shutdown, handle }
}

/// Waits until `group` has committed `ends` on every partition of `topic`,
/// asserting on every sample that no commit passes an end offset.
pub fn await_committed(bootstrap: &str, group: &str, topic: &str, ends: &BTreeMap<i32, i64>) {
    let partitions = ends.len() as i32;
    let deadline = Instant::now() + DELIVERY;
    loop {
        let c = committed(bootstrap, group, topic, partitions);
        for (p, &end) in ends {
            let at = c.get(p).copied().flatten().unwrap_or(0);
            assert!(at <= end, "{topic}/{p}: committed {at} past the end {end}");
        }
        if all_committed(&c, ends) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: not all committed: {c:?} vs {ends:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `writer` holds at least `n` lines.
pub fn await_lines(writer: &CaptureWriter, n: usize) {
    let deadline = Instant::now() + DELIVERY;
    while lines(writer).len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} lines written",
            lines(writer).len()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

pub fn lines(writer: &CaptureWriter) -> Vec<String> {
    writer
        .accepted_lines()
        .iter()
        .map(|b: &Bytes| String::from_utf8(b.to_vec()).unwrap())
        .collect()
}

pub fn all_committed(c: &BTreeMap<i32, Option<i64>>, ends: &BTreeMap<i32, i64>) -> bool {
    ends.iter()
        .all(|(p, &end)| c.get(p).copied().flatten() == Some(end))
}
