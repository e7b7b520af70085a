//! Whole pipelines on [`KafkaSource`] against librdkafka's in-process mock
//! cluster (no Docker, no network beyond loopback).
//!
//! Facts about the mock these tests rely on (shared/ENVIRONMENT.md): it keeps
//! at most 5 MiB per partition, so every test checks the low watermark is 0
//! before counting; its first group join waits 3 s (the broker's
//! `group.initial.rebalance.delay.ms`); a member joining a running group makes
//! it wait `session.timeout.ms - 1 s` for the others to rejoin, so the tests
//! use a short session timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant};

use spate_core::pipeline::ExitStatus;
use spate_core::source::{AssignmentEvent, Lane, Source};
use spate_kafka::{ConfigError, KafkaSource, KafkaSourceConfig};
use spate_testkit::{CaptureWriter, WriterMode};

use crate::common;
use common::*;

/// Issue 5's volume test: 100,000 messages over 8 partitions, lanes on 2
/// pipeline threads. Every (partition, offset) of the log is written exactly
/// once (no rebalance, so no re-reads), and once everything is acknowledged
/// the committed offsets equal the end offsets (D1: never past them either,
/// checked on every sample while waiting).
#[test]
fn every_offset_lands_exactly_once_and_commits_reach_the_end_offsets() {
    const PARTITIONS: i32 = 8;
    // 12,500 per partition of 8-byte values: far below the mock's 5 MiB.
    const N: usize = 100_000;
    let (topic, group) = ("flights", "g-all");
    let (_mock, bootstrap) = mock(topic, PARTITIONS);
    produce(&bootstrap, topic, PARTITIONS, 0..N);
    let ends = end_offsets(&bootstrap, topic, PARTITIONS);
    assert_eq!(ends.values().sum::<i64>(), N as i64);

    let writer = CaptureWriter::new();
    let source = KafkaSource::new(source_config(&bootstrap, topic, group, "range")).unwrap();
    let running = run(source, writer.clone(), 2);

    let deadline = Instant::now() + DELIVERY;
    loop {
        let c = committed(&bootstrap, group, topic, PARTITIONS);
        for (p, &end) in &ends {
            let at = c.get(p).copied().flatten().unwrap_or(0);
            assert!(at <= end, "{topic}/{p}: committed {at} past the end {end}");
        }
        if all_committed(&c, &ends) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all committed: {c:?} vs {ends:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let report = running.stop();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(report.polled, N as u64, "every offset polled exactly once");

    // Every (partition, offset) of the log, by its value, exactly once.
    let log = read_log(&bootstrap, topic, &ends);
    assert_eq!(log.len(), N);
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for line in lines(&writer) {
        *seen.entry(line).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "written more than once: {twice:?}");
    let missing: Vec<_> = log
        .iter()
        .filter(|(_, v)| !seen.contains_key(*v))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "offsets never written: {missing:?}");
    assert_eq!(seen.len(), N, "nothing written that is not in the log");
    let c = committed(&bootstrap, group, topic, PARTITIONS);
    assert!(all_committed(&c, &ends), "{c:?} vs {ends:?}");
}

/// A second member joins mid-stream. Every record lands at least once, both
/// members consume, and no commit observed at any time passes data the
/// writers had acknowledged by then (D1).
///
/// With `stall_first`, the first member's writer hangs from just before the
/// second member joins until after the first member's revoke drain timed out:
/// its unsettled data must not be committed, and is re-read by the new owner.
fn rebalance_mid_stream(strategy: &str, group: &str, stall_first: bool) {
    const PARTITIONS: i32 = 6;
    /// Produced before the first member starts.
    const FIRST: usize = 6_000;
    /// Produced at least in all; production goes on (bounded) until the
    /// second member has written something, so the rebalance is mid-stream.
    const MIN: usize = 12_000;
    const MAX: usize = 100_000;
    const CHUNK: usize = 300;
    let topic = "events";
    let (_mock, bootstrap) = mock(topic, PARTITIONS);
    produce(&bootstrap, topic, PARTITIONS, 0..FIRST);

    let (wa, wb) = (CaptureWriter::new(), CaptureWriter::new());
    let drain = if stall_first {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(10)
    };
    let a = run_with(
        KafkaSource::new(source_config(&bootstrap, topic, group, strategy)).unwrap(),
        wa.clone(),
        1,
        drain,
    );
    let deadline = Instant::now() + DELIVERY;
    while lines(&wa).is_empty() {
        assert!(Instant::now() < deadline, "first member never delivered");
        thread::sleep(Duration::from_millis(50));
    }
    if stall_first {
        wa.set_mode(WriterMode::Hang);
    }
    let b = run(
        KafkaSource::new(source_config(&bootstrap, topic, group, strategy)).unwrap(),
        wb.clone(),
        1,
    );
    let mut stalled_until: Option<Instant> = None;

    // Snapshots: committed offsets first, then what the writers hold, so a
    // snapshot's lines include everything acknowledged before its commits.
    let mut snapshots = Vec::new();
    let mut produced = FIRST;
    let mut ends = BTreeMap::new();
    let deadline = Instant::now() + DELIVERY;
    loop {
        if stall_first && !lines(&wb).is_empty() {
            // The rebalance is done (the second member writes); unstall the
            // first a little later.
            let until =
                *stalled_until.get_or_insert_with(|| Instant::now() + Duration::from_secs(1));
            if Instant::now() >= until {
                wa.set_mode(WriterMode::Accept);
            }
        }
        if produced < MIN || (lines(&wb).is_empty() && produced < MAX) {
            produce(&bootstrap, topic, PARTITIONS, produced..produced + CHUNK);
            produced += CHUNK;
        } else if ends.is_empty() {
            ends = end_offsets(&bootstrap, topic, PARTITIONS);
            assert_eq!(ends.values().sum::<i64>(), produced as i64);
        }
        let c = committed(&bootstrap, group, topic, PARTITIONS);
        let mut held: BTreeSet<String> = lines(&wa).into_iter().collect();
        held.extend(lines(&wb));
        snapshots.push((c.clone(), held));
        if !ends.is_empty() && all_committed(&c, &ends) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all committed: {c:?} vs {ends:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let (ra, rb) = (a.stop(), b.stop());
    assert_eq!(ra.status, ExitStatus::Clean, "first: {}", ra.summary());
    assert_eq!(rb.status, ExitStatus::Clean, "second: {}", rb.summary());
    assert!(ra.polled > 0 && rb.polled > 0, "both members consumed");
    // Duplicates are allowed (at-least-once). Even without the stall there
    // can be some: the mock cluster refuses commits while the group collects
    // joins (REBALANCE_IN_PROGRESS), where a real broker accepts commits of
    // the current generation, so a revoke-time commit may be refused here.
    // That the rebalance waits for the release is shown by
    // `revoke_holds_the_rebalance_until_release_*` below.

    let log = read_log(&bootstrap, topic, &ends);
    let mut union: BTreeSet<String> = lines(&wa).into_iter().collect();
    union.extend(lines(&wb));
    let missing: Vec<_> = log
        .values()
        .filter(|v| !union.contains(*v))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "records never written: {missing:?}...");
    for (c, held) in &snapshots {
        for (&p, &offset) in c {
            let Some(offset) = offset else { continue };
            assert!(
                offset <= ends[&p],
                "{topic}/{p}: committed {offset} past the end"
            );
            for o in 0..offset {
                let v = &log[&(p, o)];
                assert!(
                    held.contains(v),
                    "{topic}/{p}: committed {offset} but offset {o} ({v}) was not written"
                );
            }
        }
    }
}

#[test]
fn rebalance_eager_mid_stream_loses_nothing_and_never_commits_ahead() {
    rebalance_mid_stream("range", "g-eager", false);
}

#[test]
fn rebalance_eager_with_a_stalled_sink_commits_only_what_was_written() {
    rebalance_mid_stream("range", "g-eager-stall", true);
}

#[test]
fn rebalance_cooperative_mid_stream_loses_nothing_and_never_commits_ahead() {
    rebalance_mid_stream("cooperative-sticky", "g-coop", false);
}

#[test]
fn rebalance_cooperative_with_a_stalled_sink_commits_only_what_was_written() {
    rebalance_mid_stream("cooperative-sticky", "g-coop-stall", true);
}

#[test]
fn config_setting_an_owned_key_is_rejected_naming_it() {
    let mut config = KafkaSourceConfig::new(["t"]);
    config
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("group.id", "g")
        .set("enable.auto.commit", "true");
    let err = KafkaSource::new(config).expect_err("owned key accepted");
    assert!(
        matches!(&err, ConfigError::OwnedKey { key, .. } if key == "enable.auto.commit"),
        "{err:?}"
    );
    assert!(err.to_string().contains("enable.auto.commit"), "{err}");
}

fn assert_prompt_shutdown(source: KafkaSource, settle: Duration) {
    let running = run(source, CaptureWriter::new(), 1);
    thread::sleep(settle);
    let started = Instant::now();
    let report = running.stop();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert_eq!(report.polled, 0);
    assert_ne!(report.status, ExitStatus::Failed, "{}", report.summary());
}

#[test]
fn shutdown_with_an_empty_topic_returns_promptly() {
    let (_mock, bootstrap) = mock("empty", 4);
    let source = KafkaSource::new(source_config(&bootstrap, "empty", "g-empty", "range")).unwrap();
    // Long enough to join the group (3 s on the mock) and own empty partitions.
    assert_prompt_shutdown(source, Duration::from_millis(4_500));
}

#[test]
fn shutdown_before_the_group_was_joined_returns_promptly() {
    // Nothing listens on port 1: the consumer never reaches a broker.
    let source = KafkaSource::new(source_config("127.0.0.1:1", "t", "g-never", "range")).unwrap();
    assert_prompt_shutdown(source, Duration::from_millis(500));
}

/// Polls `source` for events for `period`, returning them.
fn events_for(
    source: &mut KafkaSource,
    period: Duration,
) -> Vec<AssignmentEvent<spate_kafka::KafkaLane>> {
    let mut out = Vec::new();
    let until = Instant::now() + period;
    while Instant::now() < until {
        if let Some(ev) = source
            .poll_event(Duration::from_millis(20))
            .expect("poll_event")
        {
            out.push(ev);
        }
    }
    out
}

/// Drives two sources directly (no pipeline): the first is assigned, the
/// second joins, the first is told of the revoke and holds its partitions
/// (still polling) without releasing them. While it holds, the second member
/// gets nothing; only after the release does the rebalance complete and the
/// second member get partitions. This is what lets the controller drain and
/// commit before anyone else reads the partition (D1).
fn revoke_holds_the_rebalance_until_release(strategy: &str, group: &str) {
    const PARTITIONS: i32 = 4;
    const HOLD: Duration = Duration::from_millis(1_500);
    let topic = "held";
    let (_mock, bootstrap) = mock(topic, PARTITIONS);
    let mut a = KafkaSource::new(source_config(&bootstrap, topic, group, strategy)).unwrap();
    let deadline = Instant::now() + DELIVERY;
    let mut lanes = Vec::new();
    while lanes.len() < PARTITIONS as usize {
        assert!(Instant::now() < deadline, "first member never assigned");
        for ev in events_for(&mut a, Duration::from_millis(100)) {
            match ev {
                AssignmentEvent::Assigned { lane, .. } => lanes.push(lane),
                AssignmentEvent::Revoked { partition, .. } => panic!("early revoke of {partition}"),
            }
        }
    }

    let (tx, rx) = std::sync::mpsc::channel();
    let b_config = source_config(&bootstrap, topic, group, strategy);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_b = std::sync::Arc::clone(&stop);
    let b = thread::spawn(move || {
        let mut b = KafkaSource::new(b_config).unwrap();
        let until = Instant::now() + DELIVERY;
        while Instant::now() < until && !stop_b.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(AssignmentEvent::Assigned { partition, .. }) =
                b.poll_event(Duration::from_millis(20)).expect("poll_event")
            {
                if tx.send((Instant::now(), partition)).is_err() {
                    break;
                }
            }
        }
    });

    let mut revoked = Vec::new();
    while revoked.is_empty() {
        assert!(Instant::now() < deadline, "first member never saw a revoke");
        for ev in events_for(&mut a, Duration::from_millis(50)) {
            if let AssignmentEvent::Revoked { partition, epoch } = ev {
                revoked.push((partition, epoch));
            }
        }
    }
    // The rest of the same revoke is already queued.
    while let Some(ev) = a.poll_event(Duration::ZERO).expect("poll_event") {
        match ev {
            AssignmentEvent::Revoked { partition, epoch } => revoked.push((partition, epoch)),
            other => panic!("unexpected event: {other:?}"),
        }
    }
    // Like the controller: stop the revoked lanes, then hold (the drain).
    lanes.retain(|l| !revoked.iter().any(|(p, _)| p == l.partition()));
    let during_hold = events_for(&mut a, HOLD);
    assert!(
        during_hold.is_empty(),
        "events while holding the revoke: {during_hold:?}"
    );
    assert!(
        rx.try_recv().is_err(),
        "the second member was assigned before the release"
    );
    let released = Instant::now();
    for (p, e) in &revoked {
        a.release(p, *e).unwrap();
    }
    // Keep serving the first member (its rejoin follows the release).
    let (at, partition) = loop {
        assert!(Instant::now() < deadline, "second member never assigned");
        let _ = events_for(&mut a, Duration::from_millis(50));
        if let Ok(got) = rx.try_recv() {
            break got;
        }
    };
    assert!(
        at > released,
        "{partition} assigned to the second member before the release"
    );
    drop(rx);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(lanes);
    drop(a);
    b.join().expect("second member");
}

#[test]
fn revoke_holds_the_rebalance_until_release_eager() {
    revoke_holds_the_rebalance_until_release("range", "g-hold-eager");
}

#[test]
fn revoke_holds_the_rebalance_until_release_cooperative() {
    revoke_holds_the_rebalance_until_release("cooperative-sticky", "g-hold-coop");
}

/// The consumer half of readiness (`Source::consumer_ready`, what `/readyz`
/// adds to the shards' state): ready while waiting for an assignment and
/// while holding one; not ready once the broker is down and the consumer
/// reports errors; ready again after the broker is back (at the latest
/// `CONSUMER_ERROR_HOLD` after the last error, or at a new assignment).
#[test]
fn consumer_is_not_ready_while_the_broker_is_down() {
    let topic = "down";
    let (mock, bootstrap) = mock(topic, 2);
    let mut source = KafkaSource::new(source_config(&bootstrap, topic, "down", "range")).unwrap();
    assert!(
        source.consumer_ready(),
        "waiting for an assignment, no error"
    );
    let deadline = Instant::now() + DELIVERY;
    let mut lanes = Vec::new();
    while lanes.len() < 2 {
        assert!(Instant::now() < deadline, "never assigned");
        for ev in events_for(&mut source, Duration::from_millis(100)) {
            if let AssignmentEvent::Assigned { lane, .. } = ev {
                lanes.push(lane);
            }
        }
    }
    assert!(source.consumer_ready(), "holding an assignment");

    mock.broker_down(1).unwrap();
    while source.consumer_ready() {
        assert!(
            Instant::now() < deadline,
            "still ready with the broker down"
        );
        let _ = events_for(&mut source, Duration::from_millis(100));
    }
    let down = Instant::now();
    mock.broker_up(1).unwrap();
    while !source.consumer_ready() {
        assert!(
            down.elapsed() < spate_kafka::CONSUMER_ERROR_HOLD + Duration::from_secs(15),
            "not ready again after the broker came back"
        );
        let _ = events_for(&mut source, Duration::from_millis(100));
    }
    println!(
        "consumer ready again {:?} after the broker came back",
        down.elapsed()
    );
    drop(lanes);
}

/// A lane's payloads carry what the producer set: key (or none), the
/// create-time timestamp and its kind, and the headers in order with
/// repeated names and a null value (read lazily through librdkafka's
/// message, `native::MessageHeaders`); a message without headers has none.
#[test]
fn lane_payloads_carry_keys_timestamps_and_headers_as_produced() {
    use rdkafka::ClientConfig;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use spate_core::record::{Header as MetaHeader, TimestampKind};
    use spate_core::source::PollBatch;

    let topic = "meta";
    let (_mock, bootstrap) = mock(topic, 1);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("producer");
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "h",
            value: Some("a"),
        })
        .insert(Header {
            key: "n",
            value: None::<&str>,
        })
        .insert(Header {
            key: "h",
            value: Some("b"),
        });
    producer
        .send(
            BaseRecord::to(topic)
                .key("k0")
                .payload("v0")
                .partition(0)
                .timestamp(1_700_000_000_123)
                .headers(headers),
        )
        .unwrap();
    producer
        .send(
            BaseRecord::<(), _>::to(topic)
                .payload("v1")
                .partition(0)
                .timestamp(1_700_000_000_124),
        )
        .unwrap();
    producer.flush(RPC).expect("flush");

    let mut source = KafkaSource::new(source_config(&bootstrap, topic, "g-meta", "range")).unwrap();
    let deadline = Instant::now() + DELIVERY;
    let mut lane = loop {
        assert!(Instant::now() < deadline, "never assigned");
        let assigned = events_for(&mut source, Duration::from_millis(100))
            .into_iter()
            .find_map(|ev| match ev {
                AssignmentEvent::Assigned { lane, .. } => Some(lane),
                AssignmentEvent::Revoked { .. } => None,
            });
        if let Some(lane) = assigned {
            break lane;
        }
    };
    let mut got = Vec::new();
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "polled {} of 2", got.len());
        let batch = lane.poll(Duration::from_millis(100)).expect("poll");
        for i in 0..batch.len() {
            let p = batch.payload(i);
            let hs: Vec<(Vec<u8>, Option<Vec<u8>>)> = p
                .headers
                .iter()
                .map(|h: MetaHeader<'_>| (h.name.to_vec(), h.value.map(<[u8]>::to_vec)))
                .collect();
            let last_h = p
                .headers
                .last(b"h")
                .and_then(|h| h.value.map(<[u8]>::to_vec));
            got.push((
                p.offset,
                p.key.map(<[u8]>::to_vec),
                p.timestamp_ms,
                p.timestamp_kind,
                hs,
                last_h,
            ));
        }
    }
    let b = |s: &str| s.as_bytes().to_vec();
    assert_eq!(
        got,
        [
            (
                0,
                Some(b("k0")),
                Some(1_700_000_000_123),
                TimestampKind::CreateTime,
                vec![
                    (b("h"), Some(b("a"))),
                    (b("n"), None),
                    (b("h"), Some(b("b")))
                ],
                Some(b("b")),
            ),
            (
                1,
                None,
                Some(1_700_000_000_124),
                TimestampKind::CreateTime,
                vec![],
                None,
            ),
        ]
    );
}
