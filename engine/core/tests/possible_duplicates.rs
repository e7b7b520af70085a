//! A batch acknowledged after an attempt that timed out is counted as a
//! possible duplicate (the timed-out insert may have landed; a server that
//! ignores the dedup token keeps both), and a plain retryable failure is not.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use spate_core::ack::{AckIssuer, AckSet, Outcome, ack_channel};
use spate_core::budget::BudgetPermit;
use spate_core::pipeline::testkit::{CaptureWriter, WriterMode};
use spate_core::record::TopicPartition;
use spate_core::sink::{Chunk, RunNonce, SinkConfig, SinkPool};
use tokio::time::Instant;

async fn one_batch(first_replica: WriterMode) -> (u64, u64, Outcome) {
    let writer = CaptureWriter::new();
    writer.set_replica_mode(0, 0, Some(first_replica));
    let mut config = SinkConfig::new("dup", vec![vec!["r0".into(), "r1".into()]]);
    config.write_timeout = Duration::from_millis(200);
    config.batch.linger = Duration::from_millis(1);
    let pool = SinkPool::start(
        config,
        Arc::new(writer.clone()),
        RunNonce::from_u64(9),
        &tokio::runtime::Handle::current(),
    )
    .expect("pool");
    let (tx, mut rx) = ack_channel();
    let mut issuer = AckIssuer::new(TopicPartition::new("t", 0), 1, tx);
    let ack = issuer.issue(0, 0);
    let mut acks = AckSet::new();
    acks.push(&ack);
    drop(ack);
    let chunk = Chunk::new(
        Bytes::from_static(b"row\n"),
        1,
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
    (
        report.shards[0].possible_duplicates,
        report.shards[0].retries,
        outcome,
    )
}

#[tokio::test(start_paused = true)]
async fn success_after_a_timeout_counts_a_possible_duplicate() {
    let (dups, retries, outcome) = one_batch(WriterMode::Hang).await;
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(retries, 1);
    assert_eq!(dups, 1);
}

#[tokio::test(start_paused = true)]
async fn success_after_a_refusal_is_not_a_possible_duplicate() {
    let (dups, retries, outcome) = one_batch(WriterMode::FailRetryable).await;
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(retries, 1);
    assert_eq!(dups, 0);
}
