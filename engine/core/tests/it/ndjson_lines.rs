//! NDJSON messages through the pipeline (one-thread mode): each line of a
//! message is a row, rows of one message land on different shards, and the
//! message's offset is committed only once every one of its rows is durable
//! (D1).

use std::time::Duration;

use spate_core::pipeline::chain::RoundRobin;
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::lines::LinesDecoder;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{ExitStatus, Pipeline, PipelineConfig, Shutdown};
use spate_core::record::TopicPartition;
use spate_core::sink::{RunNonce, SinkConfig};
use spate_testkit::{CaptureWriter, LineEncoder, ScriptedSource, WriterMode};

const MESSAGES: usize = 200;
const LINES: usize = 3;

#[tokio::test(start_paused = true)]
async fn ndjson_message_commits_only_after_all_its_rows_land() {
    let (source, script) = ScriptedSource::new(16);
    let writer = CaptureWriter::new();
    let tp = TopicPartition::new("t", 0);
    for m in 0..MESSAGES {
        let lines: Vec<String> = (0..LINES).map(|l| format!("{m}-{l}")).collect();
        // Blank lines and CRLF endings are not rows.
        script.append(&tp, format!("{}\r\n\n", lines.join("\n")));
    }
    script.assign(&tp);
    // Two shards, rows round robin: every message has rows on both.
    let mut sink = SinkConfig::new("ndjson", vec![vec!["a".into()], vec!["b".into()]]);
    sink.batch.linger = Duration::from_millis(20);
    sink.write_timeout = Duration::from_secs(3_600);
    let mut config = PipelineConfig::new(sink);
    config.checkpoint_interval = Duration::from_millis(50);
    // Shard 1 does not answer: no message is wholly durable.
    writer.set_replica_mode(1, 0, Some(WriterMode::Hang));
    let pipeline = Pipeline::builder(config, source, writer.clone(), |buffers: ChunkBuffers| {
        ChainProcessor::new(
            LinesDecoder,
            Terminal::new(LineEncoder, RoundRobin::default(), buffers),
        )
    })
    .nonce(RunNonce::from_u64(11))
    .build()
    .expect("valid config");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));

    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        // D1: shard 0 has taken rows of every message, but none is committed.
        assert_eq!(script.committed(&tp).unwrap_or(0), 0);
    }
    assert!(
        !writer.accepted_lines().is_empty(),
        "shard 0 took its rows meanwhile"
    );
    writer.set_replica_mode(1, 0, None);
    for _ in 0..1_000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if script.committed(&tp) == Some(MESSAGES as i64) {
            break;
        }
    }
    shutdown.trigger();
    let report = run.await.unwrap();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(script.committed(&tp), Some(MESSAGES as i64));
    let mut lines = writer.accepted_lines();
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), MESSAGES * LINES);
}
