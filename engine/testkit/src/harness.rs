//! A pipeline harness for paused-clock tests: the setup every test of
//! `engine/core/tests/it/pipeline.rs` shares, so each test shows only what it
//! checks.
//!
//! [`Harness::new`] makes a [`ScriptedSource`], a [`CaptureWriter`] and a
//! [`PipelineConfig`] tuned for quick runs under tokio's paused clock
//! (checkpoint every 50 ms, chunk linger 10 ms, batch linger 20 ms, one
//! shard of one `mem://` replica). Builder methods add partitions (filled
//! with [`fill`]'s `"{partition}-{offset}"` lines and assigned), change the
//! sink's shape or any setting, and pick the run nonce; then
//! [`Harness::start`] spawns the pipeline in one-thread mode (D7) and returns
//! a [`Run`] to wait on and stop, or [`Harness::build`] returns the pipeline
//! for a test that drives it itself (thread mode, `build()` errors).
//!
//! Topic `t`; partitions `t/0`, `t/1`, ... ([`tp`]).

use std::sync::Arc;
use std::time::Duration;

use spate_core::pipeline::driver::Processor;
use spate_core::pipeline::terminal::ChunkBuffers;
use spate_core::pipeline::{
    DeadLetter, Pipeline, PipelineConfig, PipelineError, RunReport, Shutdown,
};
use spate_core::record::{Offset, TopicPartition};
use spate_core::sink::{RunNonce, SinkConfig};
use spate_core::source::CommitOffset;

use crate::scripted::{CaptureWriter, ScriptHandle, ScriptedSource};

/// Partition `p` of the harness topic `t`.
pub fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

/// Appends `n` rows `"{partition}-{offset}"` to `partition`, continuing its
/// log (so a row names where it was read from; [`parse_line`] reads it back).
pub fn fill(script: &ScriptHandle, partition: &TopicPartition, n: usize) {
    for _ in 0..n {
        let next = script.end_offset(partition);
        let at = script.append(partition, format!("{}-{next}", partition.partition()));
        assert_eq!(at, next);
    }
}

/// `(partition, offset)` of a `"{partition}-{offset}[-...]"` line; panics
/// on any other line.
pub fn parse_line(line: &[u8]) -> (i32, Offset) {
    let s = std::str::from_utf8(line).expect("utf-8 line");
    let mut it = s.split('-');
    let p = it.next().and_then(|x| x.parse().ok()).expect("partition");
    let o = it.next().and_then(|x| x.parse().ok()).expect("offset");
    (p, o)
}

/// Offsets of `partition` among `writer`'s accepted lines, sorted,
/// duplicates kept (so "exactly once" is an equality with `0..n`).
pub fn accepted_offsets(writer: &CaptureWriter, partition: i32) -> Vec<Offset> {
    let mut v: Vec<Offset> = writer
        .accepted_lines()
        .iter()
        .map(|l| parse_line(l))
        .filter(|&(p, _)| p == partition)
        .map(|(_, o)| o)
        .collect();
    v.sort_unstable();
    v
}

/// Every commit of `partition` the source accepted, in order.
pub fn commits_of(script: &ScriptHandle, partition: &TopicPartition) -> Vec<CommitOffset> {
    script
        .commits()
        .into_iter()
        .filter(|c| &c.partition == partition)
        .collect()
}

/// Sleeps in 10 ms steps of tokio time until `cond` holds; panics naming
/// `what` after 60 s of tokio time.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..6_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not reached within 60 s of tokio time: {what}");
}

/// A sink of `shards` shards of `replicas` replicas each (`mem://sSrR`),
/// batch linger 20 ms.
pub fn sink(shards: usize, replicas: usize) -> SinkConfig {
    let urls = (0..shards)
        .map(|s| (0..replicas).map(|r| format!("mem://s{s}r{r}")).collect())
        .collect();
    let mut sink = SinkConfig::new("pipeline-test", urls);
    sink.batch.linger = Duration::from_millis(20);
    sink
}

/// Pipeline settings for quick paused-time runs over `sink`: checkpoint
/// every 50 ms, chunk linger 10 ms.
pub fn config(sink: SinkConfig) -> PipelineConfig {
    let mut c = PipelineConfig::new(sink);
    c.checkpoint_interval = Duration::from_millis(50);
    c.chunk.linger = Duration::from_millis(10);
    c
}

/// Builds one test's pipeline; see the module docs.
pub struct Harness {
    /// The scripted source's handle: append, assign, revoke, read commits.
    pub script: ScriptHandle,
    /// The writer every batch goes to.
    pub writer: CaptureWriter,
    /// The partitions added by [`Harness::partitions`], in order.
    pub partitions: Vec<TopicPartition>,
    /// The settings the pipeline is built with (edit freely before start).
    pub config: PipelineConfig,
    source: ScriptedSource,
    dead_letter: Option<Arc<dyn DeadLetter>>,
    nonce: Option<u64>,
}

impl Harness {
    /// A source whose lanes return at most `max_batch` records per poll, an
    /// accepting writer, [`config`]`(`[`sink`]`(1, 1))`, no partitions.
    pub fn new(max_batch: usize) -> Self {
        let (source, script) = ScriptedSource::new(max_batch);
        Harness {
            script,
            writer: CaptureWriter::new(),
            partitions: Vec::new(),
            config: config(sink(1, 1)),
            source,
            dead_letter: None,
            nonce: None,
        }
    }

    /// `n` more partitions, each [`fill`]ed with `rows` rows and assigned.
    pub fn partitions(mut self, n: i32, rows: usize) -> Self {
        let first = self.partitions.len() as i32;
        for p in first..first + n {
            let partition = tp(p);
            fill(&self.script, &partition, rows);
            self.script.assign(&partition);
            self.partitions.push(partition);
        }
        self
    }

    /// Replaces the sink with [`sink`]`(shards, replicas)` (call before
    /// changing sink settings through [`Harness::with`]).
    pub fn shards(mut self, shards: usize, replicas: usize) -> Self {
        self.config.sink = sink(shards, replicas);
        self
    }

    /// Changes any setting.
    pub fn with(mut self, change: impl FnOnce(&mut PipelineConfig)) -> Self {
        change(&mut self.config);
        self
    }

    /// Sends skipped records to `hook` (D6).
    pub fn dead_letter(mut self, hook: Arc<dyn DeadLetter>) -> Self {
        self.dead_letter = Some(hook);
        self
    }

    /// Uses `nonce` in the dedup tokens (reproducible runs) instead of one
    /// from the OS.
    pub fn nonce(mut self, nonce: u64) -> Self {
        self.nonce = Some(nonce);
        self
    }

    /// The pipeline with one processor per thread made by `chain`, and the
    /// handles to watch it by.
    ///
    /// # Errors
    /// The builder's [`PipelineError::Config`] naming the first bad key.
    #[allow(clippy::type_complexity)]
    pub fn build<F, P>(
        self,
        chain: F,
    ) -> Result<(Pipeline<ScriptedSource, CaptureWriter, F>, Parts), PipelineError>
    where
        P: Processor + 'static,
        F: Fn(ChunkBuffers) -> P + Send + Sync + 'static,
    {
        let mut builder = Pipeline::builder(self.config, self.source, self.writer.clone(), chain);
        if let Some(hook) = self.dead_letter {
            builder = builder.dead_letter(hook);
        }
        if let Some(nonce) = self.nonce {
            builder = builder.nonce(RunNonce::from_u64(nonce));
        }
        let parts = Parts {
            script: self.script,
            writer: self.writer,
            partitions: self.partitions,
        };
        Ok((builder.build()?, parts))
    }

    /// Builds (panicking on a config error) and spawns the pipeline in
    /// one-thread mode on the current tokio runtime.
    pub fn start<F, P>(self, chain: F) -> Run
    where
        P: Processor + Send + 'static,
        F: Fn(ChunkBuffers) -> P + Send + Sync + 'static,
    {
        let (pipeline, parts) = self.build(chain).expect("valid config");
        let shutdown = Shutdown::new();
        let task = tokio::spawn(pipeline.run_inline(shutdown.clone()));
        Run {
            script: parts.script,
            writer: parts.writer,
            partitions: parts.partitions,
            shutdown,
            task,
        }
    }
}

/// What a built pipeline is watched by (see [`Harness::build`]).
#[derive(Debug)]
pub struct Parts {
    /// The scripted source's handle.
    pub script: ScriptHandle,
    /// The capture writer.
    pub writer: CaptureWriter,
    /// The partitions added to the harness.
    pub partitions: Vec<TopicPartition>,
}

/// A pipeline running in one-thread mode (see [`Harness::start`]).
#[derive(Debug)]
pub struct Run {
    /// The scripted source's handle.
    pub script: ScriptHandle,
    /// The capture writer.
    pub writer: CaptureWriter,
    /// The partitions added to the harness.
    pub partitions: Vec<TopicPartition>,
    /// Triggers the pipeline's shutdown.
    pub shutdown: Shutdown,
    task: tokio::task::JoinHandle<RunReport>,
}

impl Run {
    /// [`eventually`] on this run.
    pub async fn until(&self, what: &str, cond: impl FnMut() -> bool) {
        eventually(what, cond).await;
    }

    /// Waits until every harness partition is committed up to `offset`.
    pub async fn until_committed(&self, offset: Offset) {
        let (script, partitions) = (&self.script, &self.partitions);
        eventually(&format!("every partition committed to {offset}"), || {
            partitions
                .iter()
                .all(|tp| script.committed(tp) == Some(offset))
        })
        .await;
    }

    /// Whether the pipeline has returned (by itself: a failure).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Triggers shutdown and returns the report. Call once.
    pub async fn stop(&mut self) -> RunReport {
        self.shutdown.trigger();
        (&mut self.task).await.expect("pipeline task")
    }

    /// Triggers shutdown and returns the report; panics when it takes more
    /// than `limit` of tokio time (a broken drain fails the test, D5). Call
    /// once.
    pub async fn stop_within(&mut self, limit: Duration) -> RunReport {
        self.shutdown.trigger();
        self.finish_within(limit).await
    }

    /// The report of a pipeline that stops by itself (a failure, or a
    /// shutdown triggered from elsewhere); panics after `limit`. Call once.
    pub async fn finish_within(&mut self, limit: Duration) -> RunReport {
        tokio::time::timeout(limit, &mut self.task)
            .await
            .unwrap_or_else(|_| panic!("the pipeline did not return within {limit:?}"))
            .expect("pipeline task")
    }
}
