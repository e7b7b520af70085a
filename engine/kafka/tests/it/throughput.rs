//! Messages per second through [`KafkaLane`]s with trivial per-record work
//! (sum the payload lengths), from a pre-filled mock-cluster topic, at 64 B and
//! 1 KiB, with one and two polling threads. Ignored by default (it measures,
//! it does not check); run it optimised:
//!
//! ```text
//! cargo test -p spate-kafka --profile ci --test it -- throughput:: --ignored --nocapture
//! ```
//!
//! The clock starts at the first message polled, so the ~3 s group join of
//! the mock cluster is not counted. Preloads stay under the mock's 5 MiB per
//! partition retention (checked: low watermark 0).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use spate_core::source::{AssignmentEvent, Lane, PollBatch, Source};
use spate_kafka::{KafkaLane, KafkaSource, KafkaSourceConfig};

const PARTITIONS: i32 = 8;

fn preload(bootstrap: &str, topic: &str, size: usize, count: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .create()
        .expect("producer");
    let payload = vec![b'x'; size];
    for i in 0..count {
        let key = i.to_le_bytes();
        let mut record = BaseRecord::to(topic)
            .key(&key[..])
            .payload(&payload[..])
            .partition((i % PARTITIONS as usize) as i32);
        while let Err((_, r)) = producer.send(record) {
            record = r;
            producer.poll(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let mut total = 0;
    for p in 0..PARTITIONS {
        let (low, high) = c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        assert_eq!(low, 0, "retention deleted data of {topic}/{p}");
        total += high;
    }
    assert_eq!(total as usize, count);
}

fn measure(size: usize, count: usize, threads: usize) -> f64 {
    let mock = MockCluster::new(1).unwrap();
    let topic = "bench";
    mock.create_topic(topic, PARTITIONS, 1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    preload(&bootstrap, topic, size, count);

    let mut config = KafkaSourceConfig::new([topic]);
    config
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "bench")
        .set("auto.offset.reset", "earliest");
    let mut source = KafkaSource::new(config).unwrap();
    let mut lanes: Vec<KafkaLane> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lanes.len() < PARTITIONS as usize {
        assert!(Instant::now() < deadline, "not assigned");
        if let Some(AssignmentEvent::Assigned { lane, .. }) =
            source.poll_event(Duration::from_millis(50)).unwrap()
        {
            lanes.push(lane);
        }
    }
    let seen = Arc::new(AtomicU64::new(0));
    let first = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut groups: Vec<Vec<KafkaLane>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, lane) in lanes.into_iter().enumerate() {
        groups[i % threads].push(lane);
    }
    let workers: Vec<_> = groups
        .into_iter()
        .map(|mut lanes| {
            let seen = Arc::clone(&seen);
            let first = Arc::clone(&first);
            thread::spawn(move || {
                let mut bytes = 0u64;
                while seen.load(Ordering::Relaxed) < count as u64 {
                    for lane in &mut lanes {
                        let batch = lane.poll(Duration::ZERO).unwrap();
                        let n = batch.len();
                        if n == 0 {
                            continue;
                        }
                        first.get_or_init(Instant::now);
                        for i in 0..n {
                            bytes += batch.payload(i).bytes().len() as u64;
                        }
                        seen.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
                bytes
            })
        })
        .collect();
    // The controller's part: keep serving the consumer queue.
    while seen.load(Ordering::Relaxed) < count as u64 {
        let _ = source.poll_event(Duration::from_millis(1)).unwrap();
    }
    let elapsed = first.get().expect("something polled").elapsed();
    let bytes: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(bytes, (size * count) as u64);
    count as f64 / elapsed.as_secs_f64()
}

#[test]
#[ignore = "measurement; run with --release --ignored --nocapture"]
fn lane_throughput() {
    // Under 5 MiB per partition: 64 B x 320k = 2.6 MiB/partition of payload,
    // 1 KiB x 32k = 4 MiB/partition.
    for (size, count) in [(64usize, 320_000usize), (1024, 32_000)] {
        for threads in [1usize, 2] {
            let rate = measure(size, count, threads);
            println!("{size:>5} B  {threads} thread(s)  {count:>7} msgs  {rate:>12.0} msg/s");
        }
    }
}
