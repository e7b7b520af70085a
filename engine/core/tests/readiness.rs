//! Readiness (what `/readyz` reports): ready after the start-up probe, not
//! ready while every replica of a shard has its circuit breaker open, ready
//! again once one cools down and answers.

use std::sync::atomic::Ordering;
use std::time::Duration;

use spate_core::pipeline::chain::{PayloadDecoder, RoundRobin};
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::testkit::{CaptureWriter, LineEncoder, ScriptedSource, WriterMode};
use spate_core::pipeline::{ExitStatus, Pipeline, PipelineConfig, Shutdown};
use spate_core::record::TopicPartition;
use spate_core::sink::{BreakerConfig, RunNonce, SinkConfig};

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
