//! Faults and edges of the Kafka source against librdkafka's in-process mock
//! cluster: a broker down mid-stream, a sink stalled past
//! `max.poll.interval.ms`, an evicted member's commits, a regex subscription
//! picking up a topic created later, and a committed offset out of range.
//!
//! Mock facts (shared/ENVIRONMENT.md, `tests/common`): first join 3 s; a
//! rejoin of a running group waits `session.timeout.ms - 1 s` (4 s here).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaApiKey;
use rdkafka::types::RDKafkaRespErr;
use spate_core::pipeline::ExitStatus;
use spate_core::sink::{Endpoint, SealedBatch, WriteError, Writer};
use spate_core::source::{AssignmentEvent, CommitOffset, Lane, PollBatch, Source, SourceError};
use spate_kafka::{COMMITTED_OUT_OF_RANGE, KafkaLane, KafkaSource};
use spate_testkit::{CaptureWriter, WriterMode};

use crate::common;
use common::*;

/// Every value of the log is among `written` (duplicates allowed).
fn assert_nothing_lost(log: &BTreeMap<(i32, i64), String>, written: &[String]) {
    let written: BTreeSet<&String> = written.iter().collect();
    let missing: Vec<_> = log
        .iter()
        .filter(|(_, v)| !written.contains(v))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "never written: {missing:?}...");
}

/// The broker goes down for 3 s mid-stream (fetches, heartbeats and commits
/// fail meanwhile) and comes back: consumption recovers on its own
/// (librdkafka reconnects; spate counts the transient errors) and every
/// record lands; commits reach the end offsets.
#[test]
fn broker_down_mid_stream_recovers_and_loses_nothing() {
    const PARTITIONS: i32 = 4;
    let (topic, group) = ("down", "g-down");
    let (mock, bootstrap) = mock(topic, PARTITIONS);
    produce(&bootstrap, topic, PARTITIONS, 0..2_000);
    let writer = CaptureWriter::new();
    let source = KafkaSource::new(source_config(&bootstrap, topic, group, "range")).unwrap();
    let running = run(source, writer.clone(), 2);
    await_lines(&writer, 1);

    mock.broker_down(1).expect("broker down");
    thread::sleep(Duration::from_secs(3));
    mock.broker_up(1).expect("broker up");
    produce(&bootstrap, topic, PARTITIONS, 2_000..4_000);
    let ends = end_offsets(&bootstrap, topic, PARTITIONS);
    assert_eq!(ends.values().sum::<i64>(), 4_000);
    await_committed(&bootstrap, group, topic, &ends);
    let report = running.stop();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_nothing_lost(&read_log(&bootstrap, topic, &ends), &lines(&writer));
}

/// D2: the sink hangs for 6 s, longer than `max.poll.interval.ms` (4 s, the
/// smallest librdkafka allows with a 4 s session) and the session timeout.
/// The in-flight budget fills, the lanes pause, and the controller keeps
/// serving the consumer, so the member stays in its group: when the sink
/// comes back everything lands exactly once (a rebalance would have re-read
/// the unacknowledged data: more polls than messages) and commits catch up.
#[test]
fn sink_stalled_past_max_poll_interval_keeps_the_member_in_its_group() {
    const PARTITIONS: i32 = 4;
    const N: usize = 6_000;
    let (topic, group) = ("stall", "g-stall");
    let (_mock, bootstrap) = mock(topic, PARTITIONS);
    produce(&bootstrap, topic, PARTITIONS, 0..N);
    let ends = end_offsets(&bootstrap, topic, PARTITIONS);
    let writer = CaptureWriter::new();
    let mut config = source_config(&bootstrap, topic, group, "range");
    config.set("max.poll.interval.ms", "4000");
    config.max_batch = 100;
    let source = KafkaSource::new(config).unwrap();
    writer.set_mode(WriterMode::Hang);
    let entered = Arc::new(AtomicUsize::new(0));
    let counting = Counting(writer.clone(), Arc::clone(&entered));
    let running = run_custom(source, counting, 2, |c| {
        // Small enough that the stalled sink fills it long before N.
        c.budget_rows = 1_000;
        c.chunk.max_rows = 100;
    });
    // Wait for the first write (the member has joined and read).
    let deadline = Instant::now() + DELIVERY;
    while entered.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "nothing reached the sink");
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_secs(6));
    assert!(lines(&writer).is_empty(), "the sink was to hang");
    writer.set_mode(WriterMode::Accept);
    await_committed(&bootstrap, group, topic, &ends);
    let report = running.stop();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(
        report.polled, N as u64,
        "polled more than once: the member lost its partitions during the stall"
    );
    let got = lines(&writer);
    assert_eq!(got.len(), N, "re-read after a rebalance");
    assert_nothing_lost(&read_log(&bootstrap, topic, &ends), &got);
}

/// A writer that counts the writes it was asked for, then lets `CaptureWriter`
/// answer (which, in `Hang` mode, records nothing until released).
struct Counting(CaptureWriter, Arc<AtomicUsize>);

impl Writer for Counting {
    async fn write(&self, endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.write(endpoint, batch).await
    }

    async fn probe(&self, endpoint: &Endpoint) -> Result<(), WriteError> {
        self.0.probe(endpoint).await
    }
}

/// Polls `source` until `n` partitions are assigned; returns their lanes.
fn assigned(source: &mut KafkaSource, n: usize) -> Vec<KafkaLane> {
    let deadline = Instant::now() + DELIVERY;
    let mut lanes = Vec::new();
    while lanes.len() < n {
        assert!(Instant::now() < deadline, "assigned {} of {n}", lanes.len());
        match source
            .poll_event(Duration::from_millis(20))
            .expect("poll_event")
        {
            Some(AssignmentEvent::Assigned { lane, .. }) => lanes.push(lane),
            Some(other) => panic!("unexpected event: {other:?}"),
            None => {}
        }
    }
    lanes.sort_by_key(|l| l.partition().partition());
    lanes
}

/// Reads `n` messages from `lane`; returns the last offset.
fn read(lane: &mut KafkaLane, n: usize) -> i64 {
    let deadline = Instant::now() + DELIVERY;
    let (mut got, mut last) = (0, -1);
    while got < n {
        assert!(Instant::now() < deadline, "read {got} of {n}");
        let batch = lane.poll(Duration::from_millis(20)).expect("lane poll");
        for i in 0..batch.len() {
            last = batch.payload(i).offset;
        }
        got += batch.len();
    }
    last
}

/// D1 on eviction: the group drops the member (its heartbeat is answered
/// UNKNOWN_MEMBER_ID, as after a session timeout). librdkafka reports the
/// assignment lost; the controller's revoke-time commit for that epoch is
/// refused ([`SourceError::CommitRejected`]) and commits nothing, and once
/// the partition is reassigned under a new epoch, the old epoch's offsets
/// are refused without reaching the broker. Only the new epoch commits.
#[test]
fn evicted_member_commits_nothing_for_the_ended_epoch() {
    let (topic, group) = ("evict", "g-evict");
    let (mock, bootstrap) = mock(topic, 1);
    produce(&bootstrap, topic, 1, 0..100);
    let mut source = KafkaSource::new(source_config(&bootstrap, topic, group, "range")).unwrap();
    let mut lanes = assigned(&mut source, 1);
    let (partition, old) = (lanes[0].partition().clone(), lanes[0].epoch());
    let last = read(&mut lanes[0], 100);
    let commit = |epoch| {
        [CommitOffset {
            partition: partition.clone(),
            epoch,
            offset: last + 1,
            metadata: None,
        }]
    };

    mock.request_errors(
        RDKafkaApiKey::Heartbeat,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID],
    );
    let deadline = Instant::now() + DELIVERY;
    loop {
        assert!(Instant::now() < deadline, "the eviction was never reported");
        if let Some(ev) = source
            .poll_event(Duration::from_millis(20))
            .expect("poll_event")
        {
            match ev {
                AssignmentEvent::Revoked { epoch, .. } => {
                    assert_eq!(epoch, old);
                    break;
                }
                other => panic!("unexpected event: {other:?}"),
            }
        }
    }
    // The controller's revoke: commit what settled, which the group refuses.
    match source.commit(&commit(old)) {
        Err(SourceError::CommitRejected { epoch, .. }) => assert_eq!(epoch, old),
        other => panic!("commit of an evicted member: {other:?}"),
    }
    drop(lanes);
    source.release(&partition, old).expect("release");
    let lanes = assigned(&mut source, 1);
    let new = lanes[0].epoch();
    assert!(new > old, "epoch {new} after {old}");
    match source.commit(&commit(old)) {
        Err(SourceError::CommitRejected { epoch, .. }) => assert_eq!(epoch, old),
        other => panic!("commit of an ended epoch: {other:?}"),
    }
    assert_eq!(
        committed(&bootstrap, group, topic, 1)[&0],
        None,
        "the ended epoch's offsets reached the broker"
    );
    source
        .commit(&commit(new))
        .expect("commit of the live epoch");
    assert_eq!(committed(&bootstrap, group, topic, 1)[&0], Some(last + 1));
}

/// A `^regex` subscription picks up a matching topic created after the
/// consumer started (librdkafka re-evaluates it on each metadata refresh,
/// here every 500 ms) and leaves a non-matching one alone.
#[test]
fn regex_subscription_picks_up_a_topic_created_later() {
    let group = "g-regex";
    let (mock, bootstrap) = mock("metrics.a", 2);
    mock.create_topic("other", 2, 1).expect("create topic");
    produce(&bootstrap, "metrics.a", 2, 0..200);
    produce(&bootstrap, "other", 2, 1_000..1_200);
    let mut config = source_config(&bootstrap, "^metrics\\..*", group, "range");
    config.set("topic.metadata.refresh.interval.ms", "500");
    let writer = CaptureWriter::new();
    let running = run(KafkaSource::new(config).unwrap(), writer.clone(), 2);
    await_lines(&writer, 200);

    mock.create_topic("metrics.b", 2, 1).expect("create topic");
    produce(&bootstrap, "metrics.b", 2, 2_000..2_200);
    let ends_a = end_offsets(&bootstrap, "metrics.a", 2);
    let ends_b = end_offsets(&bootstrap, "metrics.b", 2);
    await_committed(&bootstrap, group, "metrics.a", &ends_a);
    await_committed(&bootstrap, group, "metrics.b", &ends_b);
    let report = running.stop();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    let got = lines(&writer);
    assert_nothing_lost(&read_log(&bootstrap, "metrics.a", &ends_a), &got);
    assert_nothing_lost(&read_log(&bootstrap, "metrics.b", &ends_b), &got);
    assert!(
        !got.iter().any(|v| (1_000..1_200).any(|i| *v == value(i))),
        "read a topic the regex does not match"
    );
    assert_eq!(
        committed(&bootstrap, group, "other", 2)
            .values()
            .flatten()
            .count(),
        0
    );
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A committed offset beyond the log end (the group committed 500 on a
/// partition holding 20 messages, as after a topic was re-created) is
/// reported on assignment at error level, naming topic, partition, the
/// committed offset and the valid range, and counted per partition; the
/// partition with a valid committed offset is not reported. (librdkafka then
/// resets per `auto.offset.reset`; spate does not hide that it did.)
#[test]
fn committed_offset_beyond_the_log_end_is_reported() {
    let (topic, group) = ("oor", "g-oor");
    let (_mock, bootstrap) = mock(topic, 2);
    produce(&bootstrap, topic, 2, 0..40);
    // Commit as a group that has no member yet (the mock accepts it).
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(500))
        .unwrap();
    tpl.add_partition_offset(topic, 1, Offset::Offset(5))
        .unwrap();
    c.commit(&tpl, CommitMode::Sync).expect("commit");
    drop(c);
    assert_eq!(committed(&bootstrap, group, topic, 2)[&0], Some(500));

    // Capture this thread's logs and metrics while the source is driven here.
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);

    let mut source = KafkaSource::new(source_config(&bootstrap, topic, group, "range")).unwrap();
    let mut lanes = assigned(&mut source, 2);
    let text = captured.text();
    let line = text
        .lines()
        .find(|l| l.contains("out of range"))
        .unwrap_or_else(|| panic!("no out-of-range report in:\n{text}"));
    assert!(line.contains("ERROR"), "{line}");
    for part in ["oor/0", "committed offset 500", "[0, 20]"] {
        assert!(line.contains(part), "`{part}` missing: {line}");
    }
    assert_eq!(
        text.lines().filter(|l| l.contains("out of range")).count(),
        1,
        "only partition 0 is out of range:\n{text}"
    );
    let counted: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let k = key.key();
            match value {
                DebugValue::Counter(n) if k.name() == COMMITTED_OUT_OF_RANGE => {
                    let labels: Vec<String> = k
                        .labels()
                        .map(|l| format!("{}={}", l.key(), l.value()))
                        .collect();
                    Some((labels.join(","), n))
                }
                _ => None,
            }
        })
        .collect();
    assert_eq!(counted, vec![("topic=oor,partition=0".to_owned(), 1)]);
    // The run report gets it too (issue 19: the summary names it).
    let resets = source.take_offset_resets();
    assert_eq!(resets.len(), 1, "{resets:?}");
    let r = &resets[0];
    assert_eq!(
        (
            r.partition.to_string(),
            r.committed,
            r.low,
            r.high,
            r.reset_to
        ),
        ("oor/0".to_owned(), 500, 0, 20, Some(0))
    );
    assert_eq!(
        r.to_string(),
        "oor/0 committed 500 outside [0, 20] (beyond the log end): reset to 0 \
         (auto.offset.reset=earliest)"
    );
    assert!(source.take_offset_resets().is_empty(), "taken once");
    // librdkafka reset partition 0 to `earliest`; partition 1 resumed at 5.
    let first = |lane: &mut KafkaLane| {
        let deadline = Instant::now() + DELIVERY;
        loop {
            assert!(Instant::now() < deadline, "nothing read");
            let batch = lane.poll(Duration::from_millis(20)).expect("poll");
            if batch.len() > 0 {
                break batch.payload(0).offset;
            }
        }
    };
    assert_eq!(first(&mut lanes[0]), 0);
    assert_eq!(first(&mut lanes[1]), 5);
}

/// D9: the metadata a commit carries comes back with the committed offset
/// when the partition is next assigned (`Assigned.committed`, read from the
/// group coordinator), as `effectively_once` needs to re-form the recorded
/// ranges; a partition with nothing committed comes with `None`.
#[test]
fn commit_metadata_comes_back_with_the_committed_offset_at_assignment() {
    let (topic, group) = ("eo-meta", "g-eo-meta");
    let (_mock, bootstrap) = mock(topic, 2);
    produce(&bootstrap, topic, 2, 0..20);
    let mut config = source_config(&bootstrap, topic, group, "range");
    config.committed_required = true;
    let mut source = KafkaSource::new(config.clone()).unwrap();
    let lanes = assigned(&mut source, 2);
    let (partition, epoch) = (lanes[0].partition().clone(), lanes[0].epoch());
    let metadata = spate_core::checkpoint::ranges::encode(&[(3, 5), (6, 9)]);
    source
        .commit(&[CommitOffset {
            partition: partition.clone(),
            epoch,
            offset: 3,
            metadata: Some(metadata.clone()),
        }])
        .expect("commit");
    drop(lanes);
    drop(source);
    let mut source = KafkaSource::new(config).unwrap();
    let deadline = Instant::now() + DELIVERY;
    let mut seen = BTreeMap::new();
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "assigned {seen:?}");
        if let Some(AssignmentEvent::Assigned {
            partition: p,
            committed,
            ..
        }) = source
            .poll_event(Duration::from_millis(20))
            .expect("poll_event")
        {
            seen.insert(p.partition(), committed);
        }
    }
    assert_eq!(
        seen[&partition.partition()],
        Some(spate_core::source::Committed {
            offset: 3,
            metadata
        })
    );
    assert_eq!(seen[&(1 - partition.partition())], None);
}
