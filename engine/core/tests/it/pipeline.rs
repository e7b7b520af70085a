//! The pipeline runtime end to end (issue 3): scripted source -> chain ->
//! capture writer, driven in one-thread mode on a paused tokio clock (D7),
//! plus one run in thread mode on real OS threads.
//!
//! Every test states the invariant it guards (docs/DESIGN.md D1..D8) and is
//! built so that it fails when that behaviour breaks: data is placed where
//! only the code under test can move it (open batches only shutdown seals, a
//! hanging replica only a revoke can give up on, a budget smaller than the
//! shard queue, ...).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use spate_core::ack::{AckIssuer, Outcome, Resolution, ack_channel};
use spate_core::budget::Budget;
use spate_core::pipeline::chain::{
    Decoder, Encoder, PayloadDecoder, RecordCx, RecordError, RecordErrorKind, RoundRobin, Router,
    Stage, filter, flat_map,
};
use spate_core::pipeline::driver::{ChainProcessor, Driver, Processor, RecordCounters};
use spate_core::pipeline::terminal::{ChunkBuffers, ChunkConfig, Terminal};
use spate_core::pipeline::{
    DeadLetter, ExitStatus, OnError, PipelineConfig, PipelineError, RunReport, Shutdown,
};
use spate_core::record::{Offset, Payload, TopicPartition};
use spate_core::sink::{DRAIN_GRACE, RunNonce, SinkPool};
use spate_core::source::{AssignmentEvent, CommitOffset, Source};
use spate_testkit::harness::{Parts, accepted_offsets, commits_of, eventually, fill, sink, tp};
use spate_testkit::{Attempt, CaptureWriter, Harness, LineEncoder, ScriptedSource, WriterMode};
use tokio::time::Instant;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The smoke chain: payload bytes as lines, round robin over shards.
fn line_chain(buffers: ChunkBuffers) -> impl Processor {
    ChainProcessor::new(
        PayloadDecoder,
        Terminal::new(LineEncoder, RoundRobin::default(), buffers),
    )
}

// ---------------------------------------------------------------------------
// The filter / flat_map chain
// ---------------------------------------------------------------------------

/// One output row of the fan-out chain: copy `copy` of `partition`/`offset`.
#[derive(Clone, Copy, Debug)]
struct Row {
    partition: i32,
    offset: Offset,
    copy: u8,
}

/// Writes a [`Row`] as `"{partition}-{offset}-{copy}\n"`.
struct RowEncoder;

impl Encoder<Row> for RowEncoder {
    fn encode(
        &mut self,
        r: &Row,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        buf.extend_from_slice(format!("{}-{}-{}\n", r.partition, r.offset, r.copy).as_bytes());
        Ok(())
    }
}

/// Partition 3 is filtered entirely; elsewhere every 7th payload is dropped.
fn keep(partition: i32, offset: Offset) -> bool {
    partition != 3 && offset % 7 != 0
}

/// Every 3rd payload fans out into two rows.
fn copies(offset: Offset) -> u8 {
    if offset % 3 == 0 { 2 } else { 1 }
}

/// decode -> filter -> flat_map -> encode, round robin over shards.
fn fan_chain(buffers: ChunkBuffers) -> impl Processor {
    ChainProcessor::new(
        PayloadDecoder,
        filter(
            |p: &Payload<'_>| keep(p.partition.partition(), p.offset),
            flat_map(
                |p: Payload<'_>| {
                    let (partition, offset) = (p.partition.partition(), p.offset);
                    (0..copies(offset)).map(move |copy| Row {
                        partition,
                        offset,
                        copy,
                    })
                },
                Terminal::new(RowEncoder, RoundRobin::default(), buffers),
            ),
        ),
    )
}

/// The rows the fan chain must write for `partitions` x `0..n`, sorted.
fn expected_fan_rows(partitions: &[TopicPartition], n: Offset) -> Vec<String> {
    let mut rows = Vec::new();
    for tp in partitions {
        let p = tp.partition();
        for offset in 0..n {
            if keep(p, offset) {
                for copy in 0..copies(offset) {
                    rows.push(format!("{p}-{offset}-{copy}"));
                }
            }
        }
    }
    rows.sort();
    rows
}

fn accepted_sorted(writer: &CaptureWriter) -> Vec<String> {
    let mut v: Vec<String> = writer
        .accepted_lines()
        .iter()
        .map(|l| String::from_utf8(l.to_vec()).expect("utf-8"))
        .collect();
    v.sort();
    v
}

/// Filter and flat_map through the whole service path: every expected row is
/// written exactly once, filtered payloads (including a partition whose every
/// payload is filtered, and a filtered last offset) still let the watermark
/// pass (DESIGN "Acks": a filter delivers), and the committed offsets equal
/// the end offsets (D1, D6).
#[tokio::test(start_paused = true)]
async fn filter_and_flat_map_write_each_row_once_and_commit_to_the_end() {
    // 701 payloads: offset 700 is a multiple of 7, so the last one is filtered.
    const N: Offset = 701;
    let mut run = Harness::new(64)
        .partitions(4, N as usize)
        .shards(2, 1)
        .with(|c| {
            c.threads = 2;
            c.chunk.max_rows = 100;
        })
        .nonce(1)
        .start(fan_chain);
    run.until_committed(N).await;
    let report = run.stop().await;
    let (script, writer, tps) = (&run.script, &run.writer, &run.partitions);

    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    let expected = expected_fan_rows(tps, N);
    // Exactly once: the sorted multiset of written rows is the expected set.
    assert_eq!(accepted_sorted(writer), expected);
    assert!(writer.attempts().iter().all(|a| a.accepted));
    assert_eq!(report.polled, 4 * N as u64);
    assert_eq!(report.rows_encoded, expected.len() as u64);
    assert_eq!(report.sink.rows_flushed(), expected.len() as u64);
    assert_eq!(report.sink.rows_abandoned(), 0);
    for tp in tps {
        assert_eq!(script.committed(tp), Some(N), "{tp}");
        // Commits only ever move forward and never pass the end (D1).
        let offsets: Vec<_> = commits_of(script, tp).iter().map(|c| c.offset).collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{tp}: {offsets:?}");
        assert_eq!(offsets.last(), Some(&N), "{tp}");
    }
    // The all-filtered partition wrote nothing yet committed its end.
    assert!(accepted_offsets(writer, 3).is_empty());
}

/// Encodes as [`RowEncoder`], then refuses (on the bytes) every row whose
/// offset ends in 5.
struct KeepEncoder;

impl Encoder<Row> for KeepEncoder {
    fn encode(&mut self, r: &Row, cx: &RecordCx<'_>, buf: &mut Vec<u8>) -> Result<(), RecordError> {
        RowEncoder.encode(r, cx, buf)
    }

    fn keep(&mut self, row: &[u8]) -> bool {
        // "{p}-{offset}-{copy}\n": refuse offsets ending in 5.
        row.len() < 5 || row[row.len() - 4] != b'5'
    }
}

/// Encoder::keep (the hook `mapping.filter` uses): a row refused after it
/// was encoded is not written, is not counted as encoded, and its payload's
/// offset still commits (D1, D6: filtered rows deliver).
#[tokio::test(start_paused = true)]
async fn rows_refused_by_keep_are_dropped_and_their_offsets_commit() {
    const N: Offset = 301;
    let chain = |buffers: ChunkBuffers| {
        ChainProcessor::new(
            PayloadDecoder,
            flat_map(
                |p: Payload<'_>| {
                    let (partition, offset) = (p.partition.partition(), p.offset);
                    (0..copies(offset)).map(move |copy| Row {
                        partition,
                        offset,
                        copy,
                    })
                },
                Terminal::new(KeepEncoder, RoundRobin::default(), buffers),
            ),
        )
    };
    let mut run = Harness::new(64)
        .partitions(2, N as usize)
        .shards(2, 1)
        .with(|c| c.chunk.max_rows = 50)
        .nonce(1)
        .start(chain);
    run.until_committed(N).await;
    let report = run.stop().await;
    let mut expected = Vec::new();
    let mut refused = 0u64;
    for tp in &run.partitions {
        for offset in 0..N {
            for copy in 0..copies(offset) {
                if offset % 10 == 5 {
                    refused += 1;
                } else {
                    expected.push(format!("{}-{offset}-{copy}", tp.partition()));
                }
            }
        }
    }
    expected.sort();
    assert!(refused > 0);
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(accepted_sorted(&run.writer), expected);
    assert_eq!(report.rows_encoded, expected.len() as u64);
    for tp in &run.partitions {
        assert_eq!(run.script.committed(tp), Some(N), "{tp}");
    }
}

/// The same chain driven by hand (Driver + SinkPool + the ack channel), to
/// watch the resolutions themselves: every poll batch resolves exactly once,
/// as delivered, the batches of a lane tile its log without gaps, and nothing
/// resolves again after the pool is drained (D1, D3, DESIGN "Acks").
#[tokio::test(start_paused = true)]
async fn every_poll_batch_resolves_exactly_once_as_delivered() {
    const N: Offset = 500;
    let (mut source, script) = ScriptedSource::new(23);
    let writer = CaptureWriter::new();
    let tps: Vec<_> = (0..4).map(tp).collect();
    for tp in &tps {
        fill(&script, tp, N as usize);
        script.assign(tp);
    }
    let pool = SinkPool::start(
        sink(2, 1),
        Arc::new(writer.clone()),
        RunNonce::from_u64(2),
        &tokio::runtime::Handle::current(),
    )
    .expect("valid sink");
    let chunk = ChunkConfig {
        max_bytes: 1 << 20,
        max_rows: 37,
        linger: Duration::from_millis(5),
    };
    let buffers = ChunkBuffers::new(pool.handle(), Budget::new(1 << 20, 1 << 20), chunk);
    let mut driver = Driver::new(
        fan_chain(buffers),
        OnError::Fail,
        None,
        Arc::new(RecordCounters::default()),
    );
    let (ack_tx, mut acks) = ack_channel();
    let mut epochs = Vec::new();
    while let Some(ev) = source.poll_event(Duration::ZERO).expect("scripted") {
        match ev {
            AssignmentEvent::Assigned {
                partition,
                epoch,
                lane,
                ..
            } => {
                epochs.push((partition.clone(), epoch));
                driver.assign(lane, AckIssuer::new(partition, epoch, ack_tx.clone()));
            }
            AssignmentEvent::Revoked { .. } => unreachable!("nothing revoked"),
        }
    }
    drop(ack_tx);
    assert_eq!(epochs.len(), 4);

    let mut resolutions: Vec<Resolution> = Vec::new();
    let covered = |rs: &[Resolution]| {
        tps.iter().all(|tp| {
            let mut seen: Vec<_> = rs.iter().filter(|r| &r.partition == tp).collect();
            seen.sort_by_key(|r| r.first);
            seen.last().is_some_and(|r| r.last == N - 1)
                && seen.iter().map(|r| r.last - r.first + 1).sum::<Offset>() >= N
        })
    };
    for _ in 0..10_000 {
        driver.step(Instant::now()).expect("no record error");
        while let Some(r) = acks.try_recv() {
            resolutions.push(r);
        }
        if covered(&resolutions) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(covered(&resolutions), "not every batch resolved");

    // Take the lanes back (each revoke reports how many handles the lane
    // issued), then shut everything down and collect any late resolution.
    let mut issued = Vec::new();
    for (p, e) in &epochs {
        issued.push(driver.revoke(p, *e).expect("driver owns the lane"));
    }
    drop(driver);
    let drain = pool.drain(Instant::now() + Duration::from_secs(1)).await;
    assert!(drain.is_clean());
    while let Some(r) = acks.try_recv() {
        resolutions.push(r);
    }

    for ((p, e), issued) in epochs.iter().zip(issued) {
        let mut mine: Vec<_> = resolutions
            .iter()
            .filter(|r| &r.partition == p && r.epoch == *e)
            .collect();
        mine.sort_by_key(|r| r.seq);
        // Exactly once: seqs are 0..issued, each present once.
        let seqs: Vec<u64> = mine.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (0..issued).collect::<Vec<_>>(), "{p}");
        assert!(mine.iter().all(|r| r.outcome == Outcome::Delivered), "{p}");
        // The batches tile 0..N in seq order.
        let mut next = 0;
        for r in &mine {
            assert_eq!(r.first, next, "{p} seq {}", r.seq);
            next = r.last + 1;
        }
        assert_eq!(next, N, "{p}");
    }
    assert_eq!(accepted_sorted(&writer), expected_fan_rows(&tps, N));
}

// ---------------------------------------------------------------------------
// Backpressure
// ---------------------------------------------------------------------------

/// A stalled writer stalls intake, not memory (D2, D8): while every write
/// hangs the driver pauses its lanes yet keeps polling (the poll count keeps
/// rising between two samples while the rows read stay put), what was read is
/// bounded by the in-flight budget plus one round of poll batches and one
/// open chunk (the budget, not the much larger shard queue, is what binds),
/// nothing is committed, and everything lands exactly once when the writer
/// recovers.
#[tokio::test(start_paused = true)]
async fn stalled_writer_pauses_intake_keeps_polling_and_stays_within_budget() {
    const N: usize = 2_000;
    const BUDGET: u64 = 1_000;
    const MAX_BATCH: usize = 16;
    const LANES: u64 = 2;
    let harness = Harness::new(MAX_BATCH)
        .partitions(LANES as i32, N)
        .with(|c| {
            // A queue far larger than the budget (64 chunks of ~16 rows of
            // <= 7 bytes), so only the budget can stop intake.
            c.sink.queue_chunks = 64;
            c.sink.max_inflight = 1;
            c.sink.batch.max_rows = 32;
            c.sink.write_timeout = Duration::from_secs(600);
            c.budget_bytes = BUDGET;
            c.chunk.max_rows = 16;
        })
        .nonce(3);
    harness.writer.set_mode(WriterMode::Hang);
    let mut run = harness.start(line_chain);
    let (script, writer, tps) = (
        run.script.clone(),
        run.writer.clone(),
        run.partitions.clone(),
    );
    // What the lanes handed out: rows, and the bytes LineEncoder makes of
    // them (each value plus '\n').
    let read = || {
        (
            script.polls(),
            script.rows_read(),
            script.bytes_read() + script.rows_read(),
        )
    };

    tokio::time::sleep(Duration::from_secs(1)).await;
    let (polls_1, rows_1, bytes_1) = read();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (polls_2, rows_2, bytes_2) = read();
    // D2: paused, not blocked: the lanes are polled all along...
    assert!(
        polls_2 > polls_1 + 100,
        "polls stopped while stalled: {polls_1} -> {polls_2}"
    );
    // ...but return nothing: intake stalled.
    assert_eq!(
        rows_2, rows_1,
        "lanes kept reading while the sink was stalled"
    );
    assert_eq!(bytes_2, bytes_1);
    assert!(
        rows_1 < 2 * N as u64 / 10,
        "read {rows_1} rows into a stalled sink"
    );
    // D8: what was read is the budget plus one round of poll batches (the
    // step that found the budget full) and one open chunk. Each row is at
    // most 7 bytes ("1-1999\n").
    let slack = LANES * MAX_BATCH as u64 * 7 + 16 * 7;
    assert!(
        bytes_2 <= BUDGET + slack,
        "{bytes_2} bytes read while stalled; budget {BUDGET} + slack {slack}"
    );
    assert!(
        bytes_2 >= BUDGET / 2,
        "only {bytes_2} bytes read: something other than the budget stalled intake"
    );
    for tp in &tps {
        assert_eq!(script.committed(tp), None, "{tp} committed unwritten data");
    }
    assert!(writer.attempts().is_empty());

    writer.set_mode(WriterMode::Accept);
    run.until_committed(N as Offset).await;
    let report = run.stop().await;
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert!(report.polls >= polls_2);
    for tp in &tps {
        let offsets = accepted_offsets(&writer, tp.partition());
        assert_eq!(offsets, (0..N as Offset).collect::<Vec<_>>(), "{tp}");
    }
}

// ---------------------------------------------------------------------------
// Revoke
// ---------------------------------------------------------------------------

/// Routes every record of partition `p` to shard `p % shards`, so one shard's
/// trouble is one partition's trouble.
struct ByPartition;

impl<T> Router<T> for ByPartition {
    fn route(&mut self, _record: &T, cx: &RecordCx<'_>, shards: usize) -> usize {
        cx.payload.partition.partition() as usize % shards
    }
}

/// Payload bytes as lines, partition `p` to shard `p % shards`.
fn by_partition_chain(buffers: ChunkBuffers) -> impl Processor {
    ChainProcessor::new(
        PayloadDecoder,
        Terminal::new(LineEncoder, ByPartition, buffers),
    )
}

/// Revoke mid-stream while the only replica of the revoked partition's shard
/// hangs on its latest rows: the revoke commits exactly the settled prefix
/// (not yet committed by the ticker, so the revoke commit is the one under
/// test) and nothing of the held rows (D1), releases the partition after
/// `rebalance.drain_timeout`, and the other partition keeps flowing during
/// and after the drain. A later reassignment re-reads the uncommitted rows
/// from the committed offset: at least once.
#[tokio::test(start_paused = true)]
async fn revoke_commits_only_settled_data_and_other_partitions_keep_flowing() {
    let (a, b) = (tp(0), tp(1));
    let mut run = Harness::new(32)
        .partitions(2, 100)
        .shards(2, 1)
        .with(|c| {
            c.checkpoint_interval = Duration::from_secs(5);
            c.rebalance_drain_timeout = Duration::from_secs(1);
        })
        .nonce(4)
        .start(by_partition_chain);
    let (script, writer) = (run.script.clone(), run.writer.clone());

    eventually("a's first 100 rows written", || {
        accepted_offsets(&writer, 0).len() == 100
    })
    .await;
    assert_eq!(
        script.committed(&a),
        None,
        "the ticker committed before the revoke"
    );
    // Shard 0 (partition a's) stops answering; a's next rows get stuck there.
    writer.set_replica_mode(0, 0, Some(WriterMode::Hang));
    fill(&script, &a, 50);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(accepted_offsets(&writer, 0).len(), 100);

    let revoked_at = Instant::now();
    script.revoke(&a);
    fill(&script, &b, 50);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Mid-drain: b's new rows were written although a's drain is pending.
    assert!(
        script.released().is_empty(),
        "released before the drain timeout"
    );
    assert_eq!(
        accepted_offsets(&writer, 1),
        (0..150).collect::<Vec<_>>(),
        "b stalled during a's revoke drain"
    );

    eventually("a released", || !script.released().is_empty()).await;
    assert!(revoked_at.elapsed() >= Duration::from_secs(1));
    assert_eq!(script.released(), vec![(a.clone(), 1)]);
    // D1: the settled prefix is committed by the revoke, the held rows are not.
    assert_eq!(script.committed(&a), Some(100));
    assert!(commits_of(&script, &a).iter().all(|c| c.offset <= 100));

    // b keeps flowing after the revoke.
    fill(&script, &b, 50);
    eventually("b committed to its end", || {
        script.committed(&b) == Some(200)
    })
    .await;
    assert_eq!(script.committed(&a), Some(100));

    // The shard recovers and a comes back under a new epoch: it re-reads from
    // the committed offset, so the held rows land (at least once).
    writer.set_replica_mode(0, 0, None);
    script.assign(&a);
    eventually("a committed to its end", || {
        script.committed(&a) == Some(150)
    })
    .await;
    let report = run.stop().await;
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    let a_rows: BTreeSet<_> = accepted_offsets(&writer, 0).into_iter().collect();
    assert_eq!(a_rows, (0..150).collect());
    assert!(
        commits_of(&script, &a)
            .iter()
            .all(|c| c.epoch == 1 && c.offset <= 100 || c.epoch > 1),
        "{:?}",
        commits_of(&script, &a)
    );
    assert_eq!(accepted_offsets(&writer, 1), (0..200).collect::<Vec<_>>());
}

/// A batch held at revoke time that fails after the partition was released
/// is stale: that data was never committed (D1) and the partition's next
/// owner re-reads it, so it must not stop the pipeline; the other partition
/// keeps flowing. The run ends `Clean`: nothing this process still owns is
/// left unwritten, and the given-up batch shows in the sink's counts.
#[tokio::test(start_paused = true)]
async fn late_failure_of_a_released_partitions_batch_does_not_stop_the_others() {
    let (a, b) = (tp(0), tp(1));
    let mut run = Harness::new(32)
        .partitions(2, 100)
        .shards(2, 1)
        .with(|c| c.rebalance_drain_timeout = Duration::from_millis(500))
        .nonce(40)
        .start(by_partition_chain);
    let (script, writer) = (run.script.clone(), run.writer.clone());
    run.until_committed(100).await;
    writer.set_replica_mode(0, 0, Some(WriterMode::Hang));
    fill(&script, &a, 50);
    tokio::time::sleep(Duration::from_millis(300)).await;
    script.revoke(&a);
    eventually("a released", || !script.released().is_empty()).await;
    // The held batch now fails for good (a fatal answer): abandoned, acks
    // failed, for an epoch nobody tracks any more.
    writer.set_replica_mode(0, 0, Some(WriterMode::FailFatal));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!run.is_finished(), "a stale failure stopped the pipeline");
    fill(&script, &b, 50);
    eventually("b committed to its end", || {
        script.committed(&b) == Some(150)
    })
    .await;
    let report = run.stop().await;

    assert!(report.error.is_none(), "{}", report.summary());
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(report.sink.rows_abandoned(), 50);
    assert_eq!(report.sink.batches_abandoned(), 1);
    assert_eq!(script.committed(&a), Some(100));
    assert!(commits_of(&script, &a).iter().all(|c| c.offset <= 100));
}

// ---------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------

/// Shutdown mid-stream with a healthy writer: everything polled is written
/// once and committed, nothing more. The signal arrives from inside a lane
/// poll (after 1,000 rows were read, with far more waiting), so the last rows
/// are still in the driver's open chunks; chunk and batch lingers and sizes
/// are huge, so before the signal nothing was handed on at all: only
/// shutdown's seal, flush and drain can deliver the polled rows.
#[tokio::test(start_paused = true)]
async fn shutdown_with_healthy_writer_delivers_and_commits_everything_polled() {
    const N: usize = 1_000;
    let mut run = Harness::new(50)
        .partitions(3, N)
        .shards(2, 1)
        .with(|c| {
            c.sink.batch.linger = Duration::from_secs(60);
            c.sink.batch.max_rows = 1_000_000;
            c.chunk.linger = Duration::from_secs(60);
            c.chunk.max_rows = 1_000_000;
            c.threads = 2;
        })
        .nonce(5)
        .start(line_chain);
    // The signal comes from inside the lane poll that reads row N.
    run.script.shutdown_after(N as u64, run.shutdown.clone());
    let report = run.finish_within(Duration::from_secs(60)).await;
    let (script, writer, tps) = (&run.script, &run.writer, &run.partitions);

    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert!(
        report.polled >= N as u64 && report.polled < 3 * N as u64,
        "not mid-stream: {}",
        report.summary()
    );
    assert_eq!(report.sink.rows_abandoned(), 0);
    assert_eq!(report.sink.rows_flushed(), report.polled);
    let mut committed_total = 0;
    for tp in tps {
        let c = script.committed(tp).expect("committed at shutdown");
        committed_total += c as u64;
        assert_eq!(
            accepted_offsets(writer, tp.partition()),
            (0..c).collect::<Vec<_>>(),
            "{tp}: written rows are not exactly 0..committed"
        );
        assert!(
            report
                .committed
                .iter()
                .any(|r| &r.partition == tp && r.offset == c)
        );
    }
    assert_eq!(committed_total, report.polled, "polled but not committed");
    // One commit per partition: the final one; nothing was durable before.
    assert_eq!(script.commits().len(), tps.len());
}

/// Shutdown with a hanging writer returns by `shutdown.drain_timeout` +
/// grace in tokio time (D5), reports the abandoned rows and the `Abandoned`
/// status, and commits nothing past the abandoned data (D1).
#[tokio::test(start_paused = true)]
async fn shutdown_with_hanging_writer_returns_by_deadline_and_commits_nothing_past_it() {
    const DRAIN: Duration = Duration::from_secs(2);
    let mut run = Harness::new(50)
        .partitions(2, 100)
        .with(|c| c.shutdown_drain_timeout = DRAIN)
        .nonce(6)
        .start(line_chain);
    run.until_committed(100).await;
    let (script, writer, tps) = (
        run.script.clone(),
        run.writer.clone(),
        run.partitions.clone(),
    );
    writer.set_mode(WriterMode::Hang);
    for tp in &tps {
        fill(&script, tp, 100);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    // A broken drain must fail the test, not hang it (D5).
    let report = run
        .stop_within(DRAIN + DRAIN_GRACE + Duration::from_secs(10))
        .await;
    let took = started.elapsed();

    // D5: bounded by the deadline plus grace; and the drain did give the
    // writer until the deadline rather than giving up at once.
    assert!(took <= DRAIN + DRAIN_GRACE, "shutdown took {took:?}");
    assert!(
        took >= DRAIN,
        "shutdown abandoned data before its deadline ({took:?})"
    );
    assert_eq!(report.status, ExitStatus::Abandoned, "{}", report.summary());
    assert!(report.error.is_none(), "{}", report.summary());
    assert_eq!(report.sink.rows_abandoned(), 200, "{}", report.summary());
    assert_eq!(report.sink.rows_flushed(), 200);
    assert_eq!(report.polled, 400);
    // D1: nothing past the abandoned data is committed, now or ever.
    for tp in &tps {
        assert_eq!(script.committed(tp), Some(100), "{tp}");
        assert!(
            commits_of(&script, tp).iter().all(|c| c.offset <= 100),
            "{tp}"
        );
        let frozen = report
            .frozen
            .iter()
            .find(|f| &f.partition == tp)
            .unwrap_or_else(|| panic!("{tp} not reported frozen"));
        assert_eq!(frozen.first, 100, "{tp}");
        assert!(
            accepted_offsets(&writer, tp.partition())
                .iter()
                .all(|&o| o < 100),
            "{tp}: a held row was reported written"
        );
    }
}

/// Shutdown against a sink stalled from the start, with a budget far smaller
/// than the data: rows are held in three places (write tasks, the shard
/// worker, and chunks the pipeline thread could not hand over). Shutdown
/// still returns by the deadline plus grace (D5), commits nothing (D1), and
/// the report counts every encoded row as delivered or abandoned, including
/// those that never left the pipeline thread (D6).
#[tokio::test(start_paused = true)]
async fn shutdown_with_stalled_sink_reports_rows_held_by_the_pipeline_thread() {
    const DRAIN: Duration = Duration::from_secs(1);
    let harness = Harness::new(16)
        .partitions(2, 2_000)
        .with(|c| {
            c.sink.queue_chunks = 64;
            c.sink.max_inflight = 1;
            c.sink.batch.max_rows = 32;
            c.budget_bytes = 1_000;
            c.chunk.max_rows = 16;
            c.shutdown_drain_timeout = DRAIN;
        })
        .nonce(9);
    harness.writer.set_mode(WriterMode::Hang);
    let mut run = harness.start(line_chain);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let report = run
        .stop_within(DRAIN + DRAIN_GRACE + Duration::from_secs(10))
        .await;
    assert!(started.elapsed() <= DRAIN + DRAIN_GRACE);

    assert_eq!(report.status, ExitStatus::Abandoned, "{}", report.summary());
    let script = &run.script;
    assert!(script.commits().is_empty(), "{:?}", script.commits());
    assert_eq!(report.sink.rows_flushed(), 0);
    assert!(report.rows_encoded > 0);
    assert_eq!(
        report.sink.rows_abandoned(),
        report.rows_encoded,
        "encoded rows vanished from the report: {}",
        report.summary()
    );
}

// ---------------------------------------------------------------------------
// Record error policies
// ---------------------------------------------------------------------------

/// Refuses every 100th payload (offsets 99, 199, ...) as undecodable.
struct RejectEvery100th;

impl Decoder for RejectEvery100th {
    type Record<'a> = Payload<'a>;

    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<Payload<'a>>,
    {
        if (cx.payload.offset + 1) % 100 == 0 {
            return Err(RecordError::decode("every 100th payload is corrupt"));
        }
        next.push(cx.payload, cx)
    }
}

/// A dead-letter hook that keeps what it is given.
#[derive(Default)]
struct Dlq(Mutex<Vec<(TopicPartition, Offset, RecordErrorKind, Bytes)>>);

impl DeadLetter for Dlq {
    fn dead_letter(&self, payload: &Payload<'_>, error: &RecordError) {
        self.0.lock().expect("dlq lock").push((
            payload.partition.clone(),
            payload.offset,
            error.kind,
            Bytes::copy_from_slice(payload.bytes()),
        ));
    }
}

fn reject_chain(buffers: ChunkBuffers) -> impl Processor {
    ChainProcessor::new(
        RejectEvery100th,
        Terminal::new(LineEncoder, RoundRobin::default(), buffers),
    )
}

/// Skip policy: the refused payloads are counted, handed to the dead-letter
/// hook with their bytes, partition and offset, the rest is written exactly
/// once, and the commits reach the end even though the last payload of each
/// partition is a refused one (D6: skipped is an outcome, not a hole).
#[tokio::test(start_paused = true)]
async fn skip_policy_counts_refused_records_and_delivers_the_rest() {
    const N: Offset = 1_000;
    let dlq = Arc::new(Dlq::default());
    let mut run = Harness::new(64)
        .partitions(2, N as usize)
        .shards(2, 1)
        .with(|c| c.on_error = OnError::Skip)
        .dead_letter(dlq.clone())
        .nonce(7)
        .start(reject_chain);
    run.until_committed(N).await;
    let report = run.stop().await;
    let (writer, tps) = (&run.writer, &run.partitions);

    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(report.skipped, 20);
    assert_eq!(report.failed_records, 0);
    assert_eq!(report.polled, 2 * N as u64);
    assert_eq!(report.rows_encoded, 2 * N as u64 - 20);
    let mut dead = dlq.0.lock().expect("dlq lock").clone();
    dead.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
    let expected_dead: Vec<_> = tps
        .iter()
        .flat_map(|tp| {
            (1..=10).map(move |k| {
                let offset = k * 100 - 1;
                (
                    tp.clone(),
                    offset,
                    RecordErrorKind::Decode,
                    Bytes::from(format!("{}-{offset}", tp.partition())),
                )
            })
        })
        .collect();
    assert_eq!(dead, expected_dead);
    for tp in tps {
        let expected: Vec<Offset> = (0..N).filter(|o| (o + 1) % 100 != 0).collect();
        assert_eq!(accepted_offsets(writer, tp.partition()), expected, "{tp}");
    }
}

/// Fail policy: the first refused payload (partition 0, offset 99) stops the
/// pipeline with `RecordFailed` naming it, status `Failed`, and no commit of
/// any partition ever passes a refused record (D1, D6).
#[tokio::test(start_paused = true)]
async fn fail_policy_stops_without_committing_past_the_bad_record() {
    let mut run = Harness::new(50)
        .partitions(2, 1_000)
        .shards(2, 1)
        .with(|c| c.on_error = OnError::Fail)
        .nonce(8)
        .start(reject_chain);
    // The pipeline stops by itself; the shutdown signal is never triggered.
    let report = run.finish_within(Duration::from_secs(60)).await;
    let (script, writer, tps) = (&run.script, &run.writer, &run.partitions);

    assert_eq!(report.status, ExitStatus::Failed, "{}", report.summary());
    assert_eq!(report.failed_records, 1);
    match &report.error {
        Some(
            e @ PipelineError::RecordFailed {
                partition,
                offset,
                error,
            },
        ) => {
            assert_eq!((partition, *offset), (&tps[0], 99));
            assert_eq!(error.kind, RecordErrorKind::Decode);
            let msg = e.to_string();
            assert!(msg.contains("t/0") && msg.contains("99"), "{msg}");
        }
        other => panic!("expected RecordFailed, got {other:?}"),
    }
    let frozen = report
        .frozen
        .iter()
        .find(|f| f.partition == tps[0])
        .expect("partition 0 frozen at the failed batch");
    assert!(frozen.first <= 99);
    for tp in tps {
        for c in commits_of(script, tp) {
            assert!(
                c.offset <= 99,
                "{tp} committed {} past a refused record",
                c.offset
            );
        }
    }
    assert!(
        commits_of(script, &tps[0])
            .iter()
            .all(|c| c.offset <= frozen.first),
        "committed into the failed batch"
    );
    // Nothing of partition 0 past the bad record was even read.
    assert!(accepted_offsets(writer, 0).iter().all(|&o| o < 99));
}

// ---------------------------------------------------------------------------
// Determinism (D7)
// ---------------------------------------------------------------------------

/// One scripted run on a fresh paused current-thread runtime: 4 partitions
/// on 2 inline drivers, 2 shards x 2 replicas with one replica failing
/// (retries with seeded jitter, a breaker), data arriving in rounds, a revoke
/// and a reassignment mid-stream. Returns the commits and the write attempts.
fn scripted_run() -> (Vec<CommitOffset>, Vec<Attempt>, RunReport) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let harness = Harness::new(37)
            .partitions(4, 300)
            .shards(2, 2)
            .with(|c| {
                c.sink.batch.max_rows = 120;
                c.sink.batch.linger = Duration::from_millis(13);
                c.sink.retry.initial = Duration::from_millis(10);
                c.sink.retry.max = Duration::from_millis(100);
                c.threads = 2;
                c.chunk.max_rows = 50;
                c.chunk.linger = Duration::from_millis(7);
                c.checkpoint_interval = Duration::from_millis(30);
                c.rebalance_drain_timeout = Duration::from_millis(200);
            })
            .nonce(0x5eed);
        harness
            .writer
            .set_replica_mode(1, 0, Some(WriterMode::FailRetryable));
        let mut run = harness.start(line_chain);
        let (script, writer, tps) = (
            run.script.clone(),
            run.writer.clone(),
            run.partitions.clone(),
        );
        for round in 0..10 {
            for tp in &tps {
                fill(&script, tp, 25);
            }
            match round {
                3 => script.revoke(&tps[1]),
                6 => script.assign(&tps[1]),
                7 => writer.set_replica_mode(1, 0, None),
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(9)).await;
        }
        eventually("every partition committed to its end", || {
            tps.iter()
                .all(|tp| script.committed(tp) == Some(script.end_offset(tp)))
        })
        .await;
        let report = run.stop().await;
        (script.commits(), writer.attempts(), report)
    })
}

/// One-thread mode is deterministic (D7): the same scripted run twice gives
/// the same sequence of commits and the same write attempts (endpoints,
/// tokens, bodies, answers), and the run is not trivial.
#[test]
fn one_thread_mode_replays_identically() {
    let (commits_1, attempts_1, report_1) = scripted_run();
    let (commits_2, attempts_2, report_2) = scripted_run();
    assert_eq!(report_1.status, ExitStatus::Clean, "{}", report_1.summary());
    assert_eq!(report_1.summary(), report_2.summary());
    assert!(commits_1.len() > 10, "{} commits", commits_1.len());
    assert!(attempts_1.iter().any(|a| !a.accepted), "no retry happened");
    assert!(
        commits_1
            .iter()
            .any(|c| c.partition == tp(1) && c.epoch > 1)
    );
    assert_eq!(commits_1, commits_2);
    assert_eq!(attempts_1.len(), attempts_2.len());
    for (i, (x, y)) in attempts_1.iter().zip(&attempts_2).enumerate() {
        assert_eq!(x, y, "attempt {i} differs");
    }
    // D4: an accepted token is accepted once (no two batches share one).
    let accepted: Vec<_> = attempts_1
        .iter()
        .filter(|a| a.accepted)
        .map(|a| &a.token)
        .collect();
    let distinct: BTreeSet<_> = accepted.iter().collect();
    assert_eq!(distinct.len(), accepted.len());
}

// ---------------------------------------------------------------------------
// Thread mode
// ---------------------------------------------------------------------------

/// The service path on real OS threads and real time: two pipeline threads,
/// a multi-thread I/O runtime, a helper thread that triggers shutdown once
/// the commits reach the end (bounded loop, no timed assertion). Everything
/// is written exactly once and committed.
#[test]
fn thread_mode_delivers_and_commits_everything() {
    const N: Offset = 300;
    let (pipeline, parts) = Harness::new(40)
        .partitions(3, N as usize)
        .shards(2, 2)
        .with(|c| {
            c.threads = 2;
            c.checkpoint_interval = Duration::from_millis(20);
        })
        .build(fan_chain)
        .expect("valid config");
    let Parts {
        script,
        writer,
        partitions: tps,
    } = parts;
    let shutdown = Shutdown::new();
    let watcher = {
        let (script, shutdown, tps) = (script.clone(), shutdown.clone(), tps.clone());
        std::thread::spawn(move || {
            // Up to ~60 s; normally a few tens of milliseconds.
            for _ in 0..6_000 {
                if tps.iter().all(|tp| script.committed(tp) == Some(N)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            shutdown.trigger();
        })
    };
    let report = pipeline.run_threaded(shutdown, 2);
    watcher.join().expect("watcher thread");

    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    for tp in &tps {
        assert_eq!(script.committed(tp), Some(N), "{tp}");
    }
    assert_eq!(accepted_sorted(&writer), expected_fan_rows(&tps, N));
    assert_eq!(report.polled, 3 * N as u64);
}

/// A pipeline thread idles in a park of up to `idle_poll_max`; a command
/// (here the shutdown) unparks it instead of waiting that out. With the
/// longest allowed idle sleep (1 s), a stop after everything is committed
/// takes milliseconds; before commands unparked the threads it took the
/// rest of the sleep (~1 s), which is what this fails on.
#[test]
fn shutdown_wakes_pipeline_threads_from_their_idle_sleep() {
    const N: Offset = 50;
    let (pipeline, parts) = Harness::new(40)
        .partitions(2, N as usize)
        .with(|c| {
            c.threads = 2;
            c.checkpoint_interval = Duration::from_millis(20);
            c.idle_poll = spate_core::pipeline::IDLE_POLL_MAX_LIMIT;
            c.idle_poll_max = spate_core::pipeline::IDLE_POLL_MAX_LIMIT;
        })
        .build(fan_chain)
        .expect("valid config");
    let Parts {
        script,
        partitions: tps,
        ..
    } = parts;
    let shutdown = Shutdown::new();
    let triggered = Arc::new(Mutex::new(None));
    let watcher = {
        let (script, shutdown, tps, triggered) = (
            script.clone(),
            shutdown.clone(),
            tps.clone(),
            Arc::clone(&triggered),
        );
        std::thread::spawn(move || {
            for _ in 0..6_000 {
                if tps.iter().all(|tp| script.committed(tp) == Some(N)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            // Both threads are parked for up to 1 s by now.
            std::thread::sleep(Duration::from_millis(50));
            *triggered.lock().expect("not poisoned") = Some(Instant::now());
            shutdown.trigger();
        })
    };
    let report = pipeline.run_threaded(shutdown, 1);
    let stopped = Instant::now();
    watcher.join().expect("watcher thread");

    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    let took = stopped - triggered.lock().expect("not poisoned").expect("triggered");
    assert!(
        took < Duration::from_millis(500),
        "shutdown waited {took:?} for idle pipeline threads"
    );
    for tp in &tps {
        assert_eq!(script.committed(tp), Some(N), "{tp}");
    }
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// A bad setting is a typed `ConfigError` naming its key, from `build()`,
/// before anything runs.
#[test]
fn bad_pipeline_config_names_the_key() {
    type Mutation = fn(&mut PipelineConfig);
    let cases: &[(&str, Mutation)] = &[
        ("pipeline.threads", |c| c.threads = 0),
        ("pipeline.chunk_bytes", |c| c.chunk.max_bytes = 0),
        ("pipeline.chunk_rows", |c| c.chunk.max_rows = 0),
        ("sink.inflight.max_bytes", |c| c.budget_bytes = 0),
        ("sink.inflight.max_rows", |c| c.budget_rows = 0),
        ("checkpoint.interval", |c| {
            c.checkpoint_interval = Duration::ZERO
        }),
        ("pipeline.idle_poll", |c| c.idle_poll = Duration::ZERO),
        ("sink.inflight.max_inflight", |c| c.sink.max_inflight = 0),
        ("sink.shards", |c| c.sink.shards.clear()),
    ];
    for &(key, mutate) in cases {
        let err = Harness::new(1)
            .with(mutate)
            .build(line_chain)
            .map(|_| ())
            .expect_err(key);
        match err {
            PipelineError::Config(e) => assert_eq!(e.key(), key, "{e}"),
            other => panic!("{key}: expected a ConfigError, got {other}"),
        }
    }
    // And the untouched config builds.
    Harness::new(1).build(line_chain).expect("valid config");
}
