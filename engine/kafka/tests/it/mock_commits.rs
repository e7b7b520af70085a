//! Commits trail acks (D1), against librdkafka's mock cluster: a partition
//! whose rows sit in a hung shard keeps its committed offset while the other
//! partitions commit to their ends, even when later records of it are
//! filtered out (acked at once); a partition whose batch fails never commits
//! past it.
//!
//! One partition's rows are routed to shard 1 and every other partition's to
//! shard 0, so a shard's writer mode holds or fails exactly that partition.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use spate_core::pipeline::chain::{PayloadDecoder, RecordCx, Router, filter};
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{ExitStatus, Pipeline, PipelineConfig};
use spate_core::record::Payload;
use spate_core::sink::SinkConfig;
use spate_kafka::KafkaSource;
use spate_testkit::{CaptureWriter, LineEncoder, WriterMode};

use crate::common;
use common::*;

const PARTITIONS: i32 = 4;
/// The partition whose rows go to shard 1.
const SINGLED: i32 = 2;
/// Records of [`SINGLED`] at or past this offset are filtered out.
const FILTER_FROM: i64 = 10;

/// [`SINGLED`] to shard 1, the rest to shard 0.
struct SingleOut;

impl<'a> Router<Payload<'a>> for SingleOut {
    fn route(&mut self, p: &Payload<'a>, _: &RecordCx<'_>, _shards: usize) -> usize {
        usize::from(p.partition.partition() == SINGLED)
    }
}

/// Runs a pipeline over 2 shards (one replica each) whose chain drops
/// [`SINGLED`]'s records from [`FILTER_FROM`] on when `filtered`.
fn start(source: KafkaSource, writer: CaptureWriter, filtered: bool) -> Running {
    let mut sink = SinkConfig::new("kafka-commits", vec![vec!["s0".into()], vec!["s1".into()]]);
    sink.batch.linger = Duration::from_millis(10);
    let mut config = PipelineConfig::new(sink);
    config.threads = 2;
    config.checkpoint_interval = Duration::from_millis(100);
    config.shutdown_drain_timeout = Duration::from_secs(2);
    let pipeline = Pipeline::builder(config, source, writer, move |buffers: ChunkBuffers| {
        ChainProcessor::new(
            PayloadDecoder,
            filter(
                move |p: &Payload<'_>| {
                    !(filtered && p.partition.partition() == SINGLED && p.offset >= FILTER_FROM)
                },
                Terminal::new(LineEncoder, SingleOut, buffers),
            ),
        )
    })
    .build()
    .expect("valid pipeline config");
    spawn(pipeline)
}

/// Waits until every partition but [`SINGLED`] has committed its end.
fn await_others(bootstrap: &str, group: &str, topic: &str, ends: &BTreeMap<i32, i64>) {
    let others: BTreeMap<i32, i64> = ends
        .iter()
        .filter(|(p, _)| **p != SINGLED)
        .map(|(p, e)| (*p, *e))
        .collect();
    let deadline = Instant::now() + DELIVERY;
    loop {
        let c = committed(bootstrap, group, topic, PARTITIONS);
        if all_committed(&c, &others) {
            return;
        }
        assert!(Instant::now() < deadline, "others not committed: {c:?}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// Held acks: while shard 1 hangs, [`SINGLED`] commits nothing (its first
/// rows are undelivered; its later records are filtered, i.e. acked at once,
/// and must not move the commit past them) while the other partitions commit
/// to their ends; once shard 1 answers, it commits to its end too.
#[test]
fn held_partition_keeps_its_commit_while_others_advance_even_past_filtered_records() {
    let (topic, group) = ("held", "g-held");
    let (_mock, bootstrap) = mock(topic, PARTITIONS);
    produce(&bootstrap, topic, PARTITIONS, 0..400);
    let ends = end_offsets(&bootstrap, topic, PARTITIONS);
    let writer = CaptureWriter::new();
    writer.set_replica_mode(1, 0, Some(WriterMode::Hang));
    let source = KafkaSource::new(source_config(&bootstrap, topic, group, "range")).unwrap();
    let running = start(source, writer.clone(), true);

    await_others(&bootstrap, group, topic, &ends);
    // A few more commit intervals: still nothing for the held partition.
    for _ in 0..10 {
        let c = committed(&bootstrap, group, topic, PARTITIONS);
        assert_eq!(
            c[&SINGLED], None,
            "{topic}/{SINGLED} committed while its first rows were undelivered"
        );
        thread::sleep(Duration::from_millis(100));
    }

    writer.set_replica_mode(1, 0, None);
    await_committed(&bootstrap, group, topic, &ends);
    let report = running.stop();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    // Exactly the unfiltered rows were written: ends minus the filtered tail.
    let written = lines(&writer).len() as i64;
    let filtered = ends[&SINGLED] - FILTER_FROM;
    assert_eq!(written, ends.values().sum::<i64>() - filtered);
}

/// A failed batch: shard 1 refuses with a fatal error, so [`SINGLED`]'s
/// acks fail; the pipeline stops (D1: it cannot commit past a failure) and
/// the group never holds a commit for that partition.
#[test]
fn failed_partition_never_commits_past_the_failed_batch() {
    let (topic, group) = ("failed", "g-failed");
    let (_mock, bootstrap) = mock(topic, PARTITIONS);
    produce(&bootstrap, topic, PARTITIONS, 0..400);
    let ends = end_offsets(&bootstrap, topic, PARTITIONS);
    let writer = CaptureWriter::new();
    writer.set_replica_mode(1, 0, Some(WriterMode::FailFatal));
    let source = KafkaSource::new(source_config(&bootstrap, topic, group, "range")).unwrap();
    let running = start(source, writer.clone(), false);

    let deadline = Instant::now() + DELIVERY;
    while !running.handle.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the pipeline did not stop on a failed batch"
        );
        let c = committed(&bootstrap, group, topic, PARTITIONS);
        assert_eq!(
            c[&SINGLED], None,
            "{topic}/{SINGLED} committed past a failed batch"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let report = running.handle.join().expect("pipeline thread");
    assert_eq!(report.status, ExitStatus::Failed, "{}", report.summary());
    let c = committed(&bootstrap, group, topic, PARTITIONS);
    assert_eq!(
        c[&SINGLED], None,
        "{topic}/{SINGLED} committed past a failed batch"
    );
    for (p, at) in &c {
        assert!(
            at.unwrap_or(0) <= ends[p],
            "{topic}/{p}: committed past the end"
        );
    }
}
