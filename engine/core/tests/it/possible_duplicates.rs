//! Every write attempt whose outcome is unknown (a timeout) may have landed:
//! a batch acknowledged after `k` of them is counted as `k` possible extra
//! copies (batches and rows), a plain retryable failure is not, and a
//! replica that still runs an earlier attempt (same query id) is waited out
//! on that replica without counting a failure.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use spate_core::ack::{AckIssuer, AckSet, Outcome, ack_channel};
use spate_core::budget::BudgetPermit;
use spate_core::record::TopicPartition;
use spate_core::sink::{Chunk, RunNonce, ShardReport, SinkConfig, SinkPool};
use spate_testkit::{CaptureWriter, WriterMode};
use tokio::time::Instant;

/// Writes one batch of 2 rows through a pool of one shard with replicas r0,
/// r1 whose writes answer per `script`; `max_attempts` bounds the failures.
async fn one_batch(writer: &CaptureWriter, max_attempts: u32) -> (ShardReport, Outcome) {
    let mut config = SinkConfig::new("dup", vec![vec!["r0".into(), "r1".into()]]);
    config.write_timeout = Duration::from_millis(200);
    config.batch.linger = Duration::from_millis(1);
    config.retry.max_attempts = max_attempts;
    let pool = SinkPool::start(
        config,
        Arc::new(writer.clone()),
        RunNonce::from_u64(9),
        &tokio::runtime::Handle::current(),
    )
    .expect("pool");
    let (tx, mut rx) = ack_channel();
    let mut issuer = AckIssuer::new(TopicPartition::new("t", 0), 1, tx);
    let ack = issuer.issue(0, 1);
    let mut acks = AckSet::new();
    acks.push(&ack);
    drop(ack);
    let chunk = Chunk::new(
        Bytes::from_static(b"row\nrow\n"),
        2,
        acks,
        BudgetPermit::unbounded(),
    );
    pool.handle().try_send(0, chunk).expect("queue has room");
    let outcome = loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Some(r) = rx.try_recv() {
            break r.outcome;
        }
    };
    let report = pool.drain(Instant::now() + Duration::from_secs(1)).await;
    (report.shards[0].clone(), outcome)
}

fn scripted(modes: &[WriterMode]) -> CaptureWriter {
    let writer = CaptureWriter::new();
    writer.script(modes.iter().copied());
    writer
}

#[tokio::test(start_paused = true)]
async fn success_after_a_timeout_counts_a_possible_duplicate() {
    let writer = scripted(&[WriterMode::Hang]);
    let (report, outcome) = one_batch(&writer, 10).await;
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(report.retries, 1);
    assert_eq!(report.possible_duplicates, 1);
    assert_eq!(report.possible_duplicate_rows, 2);
}

#[tokio::test(start_paused = true)]
async fn each_timed_out_attempt_is_one_more_possible_copy() {
    let writer = scripted(&[WriterMode::Hang, WriterMode::Hang, WriterMode::Hang]);
    let (report, outcome) = one_batch(&writer, 10).await;
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(report.retries, 3);
    assert_eq!(report.possible_duplicates, 3, "up to 4 copies: 3 extra");
    assert_eq!(report.possible_duplicate_rows, 6);
}

#[tokio::test(start_paused = true)]
async fn success_after_a_refusal_is_not_a_possible_duplicate() {
    let writer = scripted(&[WriterMode::FailRetryable]);
    let (report, outcome) = one_batch(&writer, 10).await;
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(report.retries, 1);
    assert_eq!(report.possible_duplicates, 0);
    assert_eq!(report.possible_duplicate_rows, 0);
}

/// A timeout on r0, then r1 says "already running" five times (more than
/// `max_attempts` = 2 allows failures): the batch is neither abandoned nor
/// moved back to r0; r1 is asked until it acknowledges, and only the
/// timeout counts as a possible copy.
#[tokio::test(start_paused = true)]
async fn already_running_is_waited_out_on_the_same_replica() {
    let mut modes = vec![WriterMode::Hang];
    modes.extend([WriterMode::AlreadyRunning; 5]);
    let writer = scripted(&modes);
    let (report, outcome) = one_batch(&writer, 2).await;
    assert_eq!(outcome, Outcome::Delivered);
    let replicas: Vec<usize> = writer
        .attempts()
        .iter()
        .map(|a| a.endpoint.replica)
        .collect();
    assert_eq!(replicas, [0, 1, 1, 1, 1, 1, 1], "waits stay on r1");
    assert!(writer.attempts().last().unwrap().accepted);
    assert_eq!(report.retries, 1, "waits are not retries");
    assert_eq!(report.batches_abandoned, 0);
    assert_eq!(report.possible_duplicates, 1);
    assert_eq!(report.possible_duplicate_rows, 2);
}

/// An abandoned batch whose attempts all timed out may be in the table once
/// per attempt already.
#[tokio::test(start_paused = true)]
async fn an_abandoned_batch_counts_its_unknown_attempts() {
    let writer = scripted(&[WriterMode::Hang, WriterMode::Hang]);
    let (report, outcome) = one_batch(&writer, 2).await;
    assert_eq!(outcome, Outcome::Failed);
    assert_eq!(report.batches_abandoned, 1);
    assert_eq!(report.possible_duplicates, 2);
    assert_eq!(report.possible_duplicate_rows, 4);
}
