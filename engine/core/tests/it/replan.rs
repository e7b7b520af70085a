//! A plan published while the pipeline runs (ADR 0005): the encoder switches
//! at a poll-batch boundary ([`Encoder::replan`]), the terminal seals the
//! rows of the old layout first, and every batch the writer gets holds rows
//! of its own layout only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spate_core::pipeline::chain::{Encoder, PayloadDecoder, RecordCx, RecordError, RoundRobin};
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{ExitStatus, Pipeline, PipelineConfig, Shutdown};
use spate_core::record::{Payload, TopicPartition};
use spate_core::sink::{Endpoint, Layout, RunNonce, SealedBatch, SinkConfig, WriteError, Writer};
use spate_testkit::ScriptedSource;

/// Writes `L{layout}:{value}\n` per record, following a shared generation;
/// publishes generation 5 itself after its 30th row (as the writer would,
/// from another task, while rows keep coming), so the switch meets an open
/// chunk holding rows of the old layout.
struct LayoutEncoder {
    published: Arc<AtomicU64>,
    layout: Layout,
    rows: u64,
}

impl<'a> Encoder<Payload<'a>> for LayoutEncoder {
    fn encode(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        buf.extend_from_slice(format!("L{}:", self.layout).as_bytes());
        buf.extend_from_slice(record.bytes());
        buf.push(b'\n');
        self.rows += 1;
        if self.rows == 30 {
            self.published.store(5, Ordering::Release);
        }
        Ok(())
    }

    fn replan(&mut self) -> Option<Layout> {
        let now = self.published.load(Ordering::Acquire);
        (now != self.layout).then(|| {
            self.layout = now;
            now
        })
    }
}

/// A written batch: its layout and body.
type Written = (Layout, Vec<u8>);

/// Records each written batch.
#[derive(Clone, Default)]
struct Batches(Arc<Mutex<Vec<Written>>>);

impl Writer for Batches {
    async fn write(&self, _endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        self.0
            .lock()
            .unwrap()
            .push((batch.layout(), batch.to_contiguous().to_vec()));
        Ok(())
    }

    async fn probe(&self, _endpoint: &Endpoint) -> Result<(), WriteError> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn rows_of_a_new_plan_never_share_a_batch_with_the_old_plans_rows() {
    let (source, script) = ScriptedSource::new(7);
    let writer = Batches::default();
    let tp = TopicPartition::new("t", 0);
    for i in 0..200 {
        script.append(&tp, format!("r{i}"));
    }
    script.assign(&tp);
    let mut sink = SinkConfig::new("replan", vec![vec!["a".into()]]);
    sink.batch.linger = Duration::from_millis(20);
    sink.batch.max_rows = 1_000;
    let mut config = PipelineConfig::new(sink);
    config.threads = 1;
    config.checkpoint_interval = Duration::from_millis(50);
    let published = Arc::new(AtomicU64::new(0));
    let factory_published = Arc::clone(&published);
    let pipeline = Pipeline::builder(
        config,
        source,
        writer.clone(),
        move |buffers: ChunkBuffers| {
            let encoder = LayoutEncoder {
                published: Arc::clone(&factory_published),
                layout: 0,
                rows: 0,
            };
            ChainProcessor::new(
                PayloadDecoder,
                Terminal::new(encoder, RoundRobin::default(), buffers),
            )
        },
    )
    .nonce(RunNonce::from_u64(7))
    .build()
    .expect("valid config");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    for _ in 0..2_000 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if script.committed(&tp) == Some(200) {
            break;
        }
    }
    shutdown.trigger();
    let report = run.await.unwrap();
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    assert_eq!(script.committed(&tp), Some(200));
    let batches = writer.0.lock().unwrap().clone();
    let mut layouts = std::collections::BTreeSet::new();
    let mut rows = 0;
    for (layout, body) in &batches {
        layouts.insert(*layout);
        for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            rows += 1;
            let tag = format!("L{layout}:");
            assert!(
                line.starts_with(tag.as_bytes()),
                "a row of another layout in a batch of layout {layout}: {}",
                String::from_utf8_lossy(line)
            );
        }
    }
    assert_eq!(rows, 200);
    assert_eq!(
        layouts.into_iter().collect::<Vec<_>>(),
        [0, 5],
        "both plans written"
    );
}
