//! Readiness (what `/readyz` reports): ready after the start-up probe, not
//! ready while every replica of a shard has its circuit breaker open, ready
//! again once one cools down and answers; not ready while the consumer
//! reports an error, ready while it holds or waits for an assignment.

use std::sync::atomic::Ordering;
use std::time::Duration;

use spate_core::pipeline::chain::{PayloadDecoder, RoundRobin};
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{ExitStatus, Pipeline, PipelineConfig, Shutdown};
use spate_core::record::TopicPartition;
use spate_core::sink::{BreakerConfig, RunNonce, SinkConfig};
use spate_testkit::{CaptureWriter, LineEncoder, ScriptedSource, WriterMode};

/// Waits (in paused tokio time) until `cond` holds; panics after 60 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..6_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test(start_paused = true)]
async fn not_ready_while_every_replica_of_a_shard_is_down() {
    let (source, script) = ScriptedSource::new(10);
    let writer = CaptureWriter::new();
    let tp = TopicPartition::new("t", 0);
    script.assign(&tp);
    let mut sink = SinkConfig::new("ready", vec![vec!["a".into(), "b".into()]]);
    sink.batch.linger = Duration::from_millis(10);
    sink.retry.initial = Duration::from_millis(10);
    sink.retry.max = Duration::from_millis(100);
    sink.retry.max_attempts = 0;
    sink.breaker = BreakerConfig {
        failure_threshold: 2,
        cooldown: Duration::from_secs(1),
    };
    let mut config = PipelineConfig::new(sink);
    config.checkpoint_interval = Duration::from_millis(50);
    let pipeline = Pipeline::builder(config, source, writer.clone(), |buffers: ChunkBuffers| {
        ChainProcessor::new(
            PayloadDecoder,
            Terminal::new(LineEncoder, RoundRobin::default(), buffers),
        )
    })
    .nonce(RunNonce::from_u64(3))
    .build()
    .expect("valid config");
    let ready = pipeline.ready_flag();
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    eventually("ready after the probe", || ready.load(Ordering::Acquire)).await;

    writer.set_mode(WriterMode::FailRetryable);
    for i in 0..5 {
        script.append(&tp, format!("r{i}"));
    }
    eventually("not ready with both replicas' breakers open", || {
        !ready.load(Ordering::Acquire)
    })
    .await;

    writer.set_mode(WriterMode::Accept);
    eventually("ready and caught up once a replica answers", || {
        ready.load(Ordering::Acquire) && script.committed(&tp) == Some(5)
    })
    .await;
    shutdown.trigger();
    let report = run.await.expect("pipeline task");
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert!(!ready.load(Ordering::Acquire), "not ready after shutdown");
}

/// A steady fault reads as steadily not ready: `/readyz` answered 200, 503,
/// 200, 503 while one shard stayed down, because a breaker counted as closed
/// from its cooldown's end until its half-open trial failed. Sampled every
/// 10 ms over ten cooldowns, readiness never comes back while every write
/// fails, and the reason names the shard and each replica's error.
#[tokio::test(start_paused = true)]
async fn steadily_not_ready_during_a_steady_fault_with_the_reason() {
    let (source, script) = ScriptedSource::new(10);
    let writer = CaptureWriter::new();
    let tp = TopicPartition::new("t", 0);
    script.assign(&tp);
    let mut sink = SinkConfig::new("ready", vec![vec!["a".into(), "b".into()]]);
    sink.batch.linger = Duration::from_millis(10);
    sink.retry.initial = Duration::from_millis(10);
    sink.retry.max = Duration::from_millis(100);
    sink.retry.max_attempts = 0;
    sink.breaker = BreakerConfig {
        failure_threshold: 2,
        cooldown: Duration::from_millis(500),
    };
    let mut config = PipelineConfig::new(sink);
    config.checkpoint_interval = Duration::from_millis(50);
    let pipeline = Pipeline::builder(config, source, writer.clone(), |buffers: ChunkBuffers| {
        ChainProcessor::new(
            PayloadDecoder,
            Terminal::new(LineEncoder, RoundRobin::default(), buffers),
        )
    })
    .nonce(RunNonce::from_u64(5))
    .build()
    .expect("valid config");
    let readiness = pipeline.readiness();
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    eventually("ready after the probe", || readiness.is_ready()).await;

    writer.set_mode(WriterMode::FailRetryable);
    script.append(&tp, "r0");
    eventually("not ready with both replicas' breakers open", || {
        !readiness.is_ready()
    })
    .await;
    for i in 0..500 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let why = readiness
            .check()
            .expect_err(&format!("ready again {} ms into a steady fault", i * 10));
        assert!(
            why.contains("shard 0: every replica's breaker open (r0 a: ")
                && why.contains("; r1 b: "),
            "the reason names the shard and its replicas: {why}"
        );
    }

    writer.set_mode(WriterMode::Accept);
    eventually("ready and caught up once a replica answers", || {
        readiness.is_ready() && script.committed(&tp) == Some(1)
    })
    .await;
    shutdown.trigger();
    let report = run.await.expect("pipeline task");
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert!(
        readiness.reason().starts_with("shutting down"),
        "{}",
        readiness.reason()
    );
}

#[tokio::test(start_paused = true)]
async fn not_ready_while_the_consumer_reports_an_error() {
    let (source, script) = ScriptedSource::new(10);
    let writer = CaptureWriter::new();
    let tp = TopicPartition::new("t", 0);
    let mut sink = SinkConfig::new("ready", vec![vec!["a".into()]]);
    sink.batch.linger = Duration::from_millis(10);
    let mut config = PipelineConfig::new(sink);
    config.checkpoint_interval = Duration::from_millis(50);
    let pipeline = Pipeline::builder(config, source, writer.clone(), |buffers: ChunkBuffers| {
        ChainProcessor::new(
            PayloadDecoder,
            Terminal::new(LineEncoder, RoundRobin::default(), buffers),
        )
    })
    .nonce(RunNonce::from_u64(4))
    .build()
    .expect("valid config");
    let ready = pipeline.ready_flag();
    let pipeline_readiness = pipeline.readiness();
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    // Waiting for an assignment without an error: ready.
    eventually("ready while waiting for an assignment", || {
        ready.load(Ordering::Acquire)
    })
    .await;

    script.set_consumer_error(true);
    eventually("not ready while the consumer reports an error", || {
        !ready.load(Ordering::Acquire)
    })
    .await;
    let why = pipeline_readiness.reason();
    assert!(why.starts_with("consumer: "), "{why}");

    // The error is over and the group hands out a partition: ready, and the
    // data flows.
    script.set_consumer_error(false);
    script.assign(&tp);
    script.append(&tp, "r0");
    eventually("ready and committed once the consumer recovers", || {
        ready.load(Ordering::Acquire) && script.committed(&tp) == Some(1)
    })
    .await;
    shutdown.trigger();
    let report = run.await.expect("pipeline task");
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
}
