//! The library API: assemble a pipeline from any source, any chain and any
//! writer, then run it in thread mode (the service) or one-thread mode (the
//! simulator and tests, D7).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::pipeline::Readiness;

use tokio::runtime::Handle;

use crate::ack::ack_channel;
use crate::budget::Budget;
use crate::checkpoint::Checkpointer;
use crate::pipeline::controller::Controller;
use crate::pipeline::driver::{Processor, RecordCounters};
use crate::pipeline::eo::{EoConfig, Recorder};
use crate::pipeline::terminal::ChunkBuffers;
use crate::pipeline::threads::{DriverParts, InlineHost, LaneHost, ThreadHost};
use crate::pipeline::{
    DeadLetter, Delivery, ExitStatus, PipelineConfig, PipelineError, RunReport, Shutdown,
    trigger_on_signal,
};
use crate::sink::{DrainReport, RunNonce, SinkPool, Writer};
use crate::source::Source;

/// Builds a [`Pipeline`].
///
/// `factory` is called once per pipeline thread (or per inline driver) with
/// that thread's [`ChunkBuffers`] and returns its [`Processor`], usually
/// `ChainProcessor::new(decoder, ops(Terminal::new(encoder, router, buffers)))`.
pub struct PipelineBuilder<S, W, F> {
    config: PipelineConfig,
    source: S,
    writer: Arc<W>,
    factory: F,
    dead_letter: Option<Arc<dyn DeadLetter>>,
    nonce: Option<RunNonce>,
}

impl<S, W, F, P> PipelineBuilder<S, W, F>
where
    S: Source,
    W: Writer,
    P: Processor + 'static,
    F: Fn(ChunkBuffers) -> P + Send + Sync + 'static,
{
    /// Sends skipped records to `hook` (D6).
    pub fn dead_letter(mut self, hook: Arc<dyn DeadLetter>) -> Self {
        self.dead_letter = Some(hook);
        self
    }

    /// Uses `nonce` in every dedup token instead of one from the OS (the
    /// simulator's replayable runs; D4 then rests on the caller).
    pub fn nonce(mut self, nonce: RunNonce) -> Self {
        self.nonce = Some(nonce);
        self
    }

    /// Validates the configuration and returns the runnable pipeline.
    ///
    /// # Errors
    /// [`PipelineError::Config`] naming the first invalid key.
    pub fn build(self) -> Result<Pipeline<S, W, F>, PipelineError> {
        self.config.validate()?;
        let budget = Budget::new(self.config.budget_bytes, self.config.budget_rows);
        Ok(Pipeline {
            config: Arc::new(self.config),
            source: self.source,
            writer: self.writer,
            factory: Arc::new(self.factory),
            dead_letter: self.dead_letter,
            nonce: self.nonce,
            ready: Readiness::new(),
            counters: Arc::new(RecordCounters::default()),
            budget,
            metrics: crate::metrics::Scope::none(),
        })
    }
}

/// A pipeline ready to run.
pub struct Pipeline<S, W, F> {
    config: Arc<PipelineConfig>,
    source: S,
    writer: Arc<W>,
    factory: Arc<F>,
    dead_letter: Option<Arc<dyn DeadLetter>>,
    nonce: Option<RunNonce>,
    ready: Readiness,
    counters: Arc<RecordCounters>,
    budget: Arc<Budget>,
    metrics: crate::metrics::Scope,
}

impl<S, W, F> std::fmt::Debug for Pipeline<S, W, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("config", &self.config)
            .finish()
    }
}

impl<S, W, F, P> Pipeline<S, W, F>
where
    S: Source,
    W: Writer,
    P: Processor + 'static,
    F: Fn(ChunkBuffers) -> P + Send + Sync + 'static,
{
    /// Starts building a pipeline reading `source`, writing through `writer`,
    /// with one processor per thread made by `factory`.
    pub fn builder(
        config: PipelineConfig,
        source: S,
        writer: W,
        factory: F,
    ) -> PipelineBuilder<S, W, F> {
        PipelineBuilder {
            config,
            source,
            writer: Arc::new(writer),
            factory,
            dead_letter: None,
            nonce: None,
        }
    }

    /// True between a successful start-up probe and the start of shutdown,
    /// while every shard has a replica whose circuit breaker is closed and
    /// the source's consumer holds an assignment or waits for one without an
    /// error ([`crate::source::Source::consumer_ready`]): what `/readyz`
    /// reports.
    pub fn ready_flag(&self) -> Arc<AtomicBool> {
        self.ready.flag()
    }

    /// The flag with the reason it is down ([`Readiness::check`]): what
    /// `/readyz` answers, e.g. `shard 1: every replica's breaker open (r0
    /// http://..: connection refused)` or the consumer's standing error.
    pub fn readiness(&self) -> Readiness {
        self.ready.clone()
    }

    /// Registers every series of the run in `scope` (its labels on each):
    /// the controller thread, the I/O runtime's workers and the pipeline
    /// threads enter it (`metrics/scope.rs`). Default: [`Scope::none`],
    /// the global recorder. [`Pipeline::run_inline`] (the simulator's
    /// one-thread mode) does not enter it.
    ///
    /// [`Scope::none`]: crate::metrics::Scope::none
    pub fn set_metrics_scope(&mut self, scope: crate::metrics::Scope) {
        self.metrics = scope;
    }

    /// The in-flight budget the run will use (D8): for gauges and for the
    /// simulator's oracle, which samples `bytes_in_use`.
    pub fn budget(&self) -> Arc<Budget> {
        Arc::clone(&self.budget)
    }

    fn nonce_or_os(&self) -> Result<RunNonce, PipelineError> {
        match self.nonce {
            Some(n) => Ok(n),
            None => RunNonce::from_os().map_err(|e| {
                PipelineError::Thread(format!("no OS randomness for the run nonce: {e}"))
            }),
        }
    }

    /// One-thread mode: runs on the current tokio runtime (the simulator's
    /// current-thread runtime with paused time) with `config.threads` drivers
    /// stepped by the controller task; spawns no thread (D7). Returns when
    /// `shutdown` is triggered or the pipeline stops on an error.
    pub async fn run_inline(self, shutdown: Shutdown) -> RunReport {
        let nonce = match self.nonce_or_os() {
            Ok(n) => n,
            Err(e) => return failed_before_start(e),
        };
        let pool = match SinkPool::start(
            self.config.sink.clone(),
            Arc::clone(&self.writer),
            nonce,
            &Handle::current(),
        ) {
            Ok(p) => p,
            Err(e) => return failed_before_start(e.into()),
        };
        let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
        let parts = self.parts();
        let budget = Arc::clone(&self.budget);
        let processors = (0..self.config.threads)
            .map(|_| {
                (self.factory)(self.buffers(ChunkBuffers::new(
                    pool.handle(),
                    Arc::clone(&budget),
                    self.config.chunk.clone(),
                )))
            })
            .collect();
        let host = InlineHost::new(processors, parts, events_tx);
        self.controller(pool, host, events).run(shutdown).await
    }

    /// Thread mode (the service): pipeline threads for the lanes, a
    /// multi-thread I/O runtime with `io_threads` workers for the sink pool, and
    /// the controller on the calling thread. Blocks until `shutdown` is
    /// triggered or the pipeline stops on an error.
    pub fn run_threaded(self, shutdown: Shutdown, io_threads: usize) -> RunReport
    where
        S::Lane: 'static,
    {
        let (io, control) = match runtimes(&self.metrics, io_threads) {
            Ok(rts) => rts,
            Err(e) => return failed_before_start(e),
        };
        let io_handle = io.handle().clone();
        let scope = self.metrics.clone();
        let report = scope.run(|| {
            control.block_on(async move {
                let nonce = match self.nonce_or_os() {
                    Ok(n) => n,
                    Err(e) => return failed_before_start(e),
                };
                let pool = match SinkPool::start(
                    self.config.sink.clone(),
                    Arc::clone(&self.writer),
                    nonce,
                    &io_handle,
                ) {
                    Ok(p) => p,
                    Err(e) => return failed_before_start(e.into()),
                };
                let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
                let budget = Arc::clone(&self.budget);
                let buffers = (0..self.config.threads)
                    .map(|_| {
                        self.buffers(ChunkBuffers::new(
                            pool.handle(),
                            Arc::clone(&budget),
                            self.config.chunk.clone(),
                        ))
                    })
                    .collect();
                let host = match ThreadHost::spawn(
                    buffers,
                    Arc::clone(&self.factory),
                    self.parts(),
                    events_tx,
                ) {
                    Ok(h) => h,
                    Err(e) => return failed_before_start(e),
                };
                self.controller(pool, host, events).run(shutdown).await
            })
        });
        // Outside any async context: a runtime may not be dropped inside one.
        io.shutdown_timeout(std::time::Duration::from_secs(1));
        report
    }

    /// [`Pipeline::run_threaded`] until SIGINT or SIGTERM.
    pub fn run_until_signal(self, io_threads: usize) -> RunReport
    where
        S::Lane: 'static,
    {
        let shutdown = Shutdown::new();
        if let Err(e) = trigger_on_signal(shutdown.clone(), "signal received; shutting down") {
            return failed_before_start(PipelineError::Thread(format!("signal listener: {e}")));
        }
        self.run_threaded(shutdown, io_threads)
    }

    /// `buffers` set up for the delivery mode (range formers in
    /// effectively_once, D9).
    fn buffers(&self, mut buffers: ChunkBuffers) -> ChunkBuffers {
        if self.config.delivery == Delivery::EffectivelyOnce {
            let batch = &self.config.sink.batch;
            buffers.set_effectively_once(EoConfig {
                pipeline: self.config.sink.pipeline.clone(),
                table: self.config.table.clone(),
                max_rows: batch.max_rows,
                max_bytes: batch.max_bytes,
                linger: batch.linger,
                // Set by the buffers from pipeline.chunk_bytes.
                pay_every: 0,
            });
        }
        buffers
    }

    fn parts(&self) -> DriverParts {
        DriverParts {
            on_error: self.config.on_error,
            dead_letter: self.dead_letter.clone(),
            counters: Arc::clone(&self.counters),
            idle: self.config.idle_poll,
            idle_max: self.config.idle_poll_max,
            metrics: self.metrics.clone(),
        }
    }

    fn controller<H: LaneHost<S::Lane>>(
        self,
        pool: SinkPool<W>,
        host: H,
        events: tokio::sync::mpsc::UnboundedReceiver<crate::pipeline::threads::LaneEvent<S::Lane>>,
    ) -> Controller<S, W, H> {
        let (ack_tx, ack_rx) = ack_channel();
        // Range groups are recorded in one request (ADR 0007), but no
        // thread forms them yet: a group record fails the partition.
        let recorder =
            (self.config.delivery == Delivery::EffectivelyOnce).then(|| Recorder::new(false));
        Controller {
            source: self.source,
            pool: Some(pool),
            checkpointer: Checkpointer::new(ack_rx),
            ack_tx,
            host,
            events,
            counters: self.counters,
            config: self.config,
            ready: self.ready,
            commit_failures: ::metrics::counter!(crate::metrics::COMMIT_FAILURES),
            committed: BTreeMap::new(),
            revoked: BTreeMap::new(),
            frozen: Vec::new(),
            offset_resets: Vec::new(),
            error: None,
            recorder,
            record_retry_at: None,
            shutdown_at: None,
        }
    }
}

/// Thread mode's two runtimes: the multi-thread I/O runtime of the sink
/// pool (`io_threads` workers, each in the pipeline's metrics scope) and
/// the controller's current-thread runtime.
fn runtimes(
    metrics: &crate::metrics::Scope,
    io_threads: usize,
) -> Result<(tokio::runtime::Runtime, tokio::runtime::Runtime), PipelineError> {
    let io_scope = metrics.clone();
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(io_threads.max(1))
        .thread_name("spate-io")
        .on_thread_start(move || io_scope.enter_for_thread())
        .enable_all()
        .build()
        .map_err(|e| PipelineError::Thread(format!("I/O runtime: {e}")))?;
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PipelineError::Thread(format!("controller runtime: {e}")))?;
    Ok((io, control))
}

fn failed_before_start(error: PipelineError) -> RunReport {
    tracing::error!(%error, "pipeline could not start");
    RunReport {
        polled: 0,
        rows_encoded: 0,
        skipped: 0,
        failed_records: 0,
        polls: 0,
        sink: DrainReport::default(),
        committed: Vec::new(),
        frozen: Vec::new(),
        offset_resets: Vec::new(),
        error: Some(error),
        status: ExitStatus::Failed,
    }
}
