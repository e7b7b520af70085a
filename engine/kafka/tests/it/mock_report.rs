//! What the Kafka source tells a user (issue 19, "a user cannot tell what
//! happened"), against librdkafka's in-process mock cluster: a `^regex`
//! matching no topic yet is waited for; librdkafka's `debug` lines keep
//! coming after start-up (join, assign, leave); a restart with static
//! membership (`group.instance.id`) gets its partitions back without
//! waiting for the old member's session to expire.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spate_core::source::{AssignmentEvent, Lane, Source};
use spate_kafka::{KafkaLane, KafkaSource};

use crate::common;
use common::*;

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

    /// Captures this thread's INFO logs until the guard drops.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }
}

/// Polls `source` until it hands out a lane (panics on an error or after
/// `within`).
fn next_lane(source: &mut KafkaSource, within: Duration) -> KafkaLane {
    let deadline = Instant::now() + within;
    loop {
        assert!(
            Instant::now() < deadline,
            "nothing assigned within {within:?}"
        );
        match source.poll_event(Duration::from_millis(50)) {
            Ok(Some(AssignmentEvent::Assigned { lane, .. })) => return lane,
            Ok(Some(other)) => panic!("unexpected event: {other:?}"),
            Ok(None) => {}
            Err(e) => panic!("source error: {e}"),
        }
    }
}

/// A `^regex` that matches no topic at start is a wait, not an error (it
/// was a fatal UnknownTopicOrPartition): the source says so at INFO, stays
/// in its group, and takes the topic when it is created.
#[test]
fn a_pattern_matching_no_topic_yet_waits_and_picks_the_topic_up() {
    let (mock, bootstrap) = mock("unrelated", 1);
    let captured = Captured::default();
    let _log = captured.install();
    let mut config = source_config(&bootstrap, "^later\\..*", "g-pattern-wait", "range");
    config.set("topic.metadata.refresh.interval.ms", "500");
    let mut source = KafkaSource::new(config).unwrap();
    // Past the group join (3 s) and several metadata refreshes.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match source.poll_event(Duration::from_millis(50)) {
            Ok(None) => {}
            Ok(Some(ev)) => panic!("nothing matches yet, got {ev:?}"),
            Err(e) => panic!("a pattern with no topic yet must wait, got: {e}"),
        }
    }
    let text = captured.text();
    let line = text
        .lines()
        .find(|l| l.contains("matches no topic yet"))
        .unwrap_or_else(|| panic!("no waiting line in:\n{text}"));
    assert!(
        line.contains("INFO") && line.contains("^later\\..*"),
        "{line}"
    );
    assert!(source.consumer_ready(), "waiting is not an error");

    mock.create_topic("later.a", 1, 1).unwrap();
    produce(&bootstrap, "later.a", 1, 0..10);
    let lane = next_lane(&mut source, Duration::from_secs(20));
    assert_eq!(lane.partition().topic(), "later.a");
}

/// A plain topic that does not exist stays fatal, and the error names it
/// (librdkafka's poll error alone said "UnknownTopicOrPartition").
#[test]
fn a_plain_topic_that_does_not_exist_fails_naming_the_topic() {
    let (_mock, bootstrap) = mock("present", 1);
    let config = source_config(&bootstrap, "absent-topic", "g-absent", "range");
    let mut source = KafkaSource::new(config).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let error = loop {
        assert!(Instant::now() < deadline, "no error for a missing topic");
        match source.poll_event(Duration::from_millis(50)) {
            Ok(None) => {}
            Ok(Some(ev)) => panic!("the topic does not exist, got {ev:?}"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(error.contains("absent-topic"), "{error}");
}

/// With `debug: cgrp`, librdkafka's consumer-group lines are logged for the
/// whole run, not only during client creation: lines after the assignment
/// (the join and assign traffic) and at close (the leave).
#[test]
fn debug_cgrp_lines_keep_coming_after_the_group_join() {
    let (topic, group) = ("dbg", "g-debug");
    let (_mock, bootstrap) = mock(topic, 1);
    let captured = Captured::default();
    let _log = captured.install();
    let mut config = source_config(&bootstrap, topic, group, "range");
    config.set("debug", "cgrp");
    let mut source = KafkaSource::new(config).unwrap();
    let _lane = next_lane(&mut source, DELIVERY);
    let after_assign = captured.text().len();
    // Heartbeats and the assignment's own lines follow within a second.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let _ = source.poll_event(Duration::from_millis(50)).expect("poll");
    }
    drop(_lane);
    drop(source);
    let text = captured.text();
    let cgrp_after: Vec<&str> = text[after_assign..]
        .lines()
        .filter(|l| l.contains("librdkafka"))
        .collect();
    assert!(
        !cgrp_after.is_empty(),
        "no librdkafka debug line after the assignment:\n{text}"
    );
    let before: Vec<&str> = text[..after_assign]
        .lines()
        .filter(|l| l.contains("librdkafka") && l.contains("JOIN"))
        .collect();
    assert!(!before.is_empty(), "no join line:\n{text}");
    assert!(
        cgrp_after
            .iter()
            .any(|l| l.contains("LEAVE") || l.contains("leave")),
        "no leave line at close:\n{}",
        cgrp_after.join("\n")
    );
}
