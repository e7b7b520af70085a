//! Smoke test of the pipeline runtime in one-thread mode.

use std::time::Duration;

use spate_core::pipeline::chain::{PayloadDecoder, RoundRobin};
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{ExitStatus, Pipeline, PipelineConfig, Shutdown};
use spate_core::record::TopicPartition;
use spate_core::sink::{RunNonce, SinkConfig};
use spate_testkit::{CaptureWriter, LineEncoder, ScriptedSource};

#[tokio::test(start_paused = true)]
async fn scripted_run_delivers_and_commits_everything() {
    let (source, script) = ScriptedSource::new(100);
    let writer = CaptureWriter::new();
    let tps: Vec<_> = (0..3).map(|p| TopicPartition::new("t", p)).collect();
    for tp in &tps {
        for i in 0..1_000 {
            script.append(tp, format!("{}-{i}", tp.partition()));
        }
        script.assign(tp);
    }
    let mut sink = SinkConfig::new(
        "smoke",
        vec![vec!["a".into()], vec!["b".into(), "c".into()]],
    );
    sink.batch.linger = Duration::from_millis(20);
    let mut config = PipelineConfig::new(sink);
    config.threads = 2;
    config.checkpoint_interval = Duration::from_millis(50);
    let pipeline = Pipeline::builder(config, source, writer.clone(), |buffers: ChunkBuffers| {
        ChainProcessor::new(
            PayloadDecoder,
            Terminal::new(LineEncoder, RoundRobin::default(), buffers),
        )
    })
    .nonce(RunNonce::from_u64(7))
    .build()
    .expect("valid config");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    for _ in 0..1_000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if tps.iter().all(|tp| script.committed(tp) == Some(1_000)) {
            break;
        }
    }
    shutdown.trigger();
    let report = run.await.unwrap();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(report.polled, 3_000);
    let mut lines: Vec<_> = writer.accepted_lines();
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), 3_000);
    for tp in &tps {
        assert_eq!(script.committed(tp), Some(1_000), "{tp}");
    }
}
