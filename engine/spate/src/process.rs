//! Runs every pipeline of a [`ProcessConfig`] in one process (the
//! `pipelines:` form of `spate run`).
//!
//! Each pipeline is assembled by [`service::plan`] and [`service::build`]
//! from its own resolved [`Config`](crate::config::Config), exactly as the
//! single form is, and runs on its own thread with its own pipeline threads,
//! I/O runtime, sink pool and consumer ([`Pipeline::run_threaded`]), so the
//! invariants D1..D9 hold per pipeline as they do for one. What they share:
//!
//! - One Prometheus recorder. Every series a pipeline registers carries
//!   `pipeline="NAME"`: the pipeline is built and run inside a
//!   [`Scope`] labelling what it registers (`spate_core::metrics::Scope`).
//! - One admin server: `/readyz` is 200 when every pipeline is ready, its
//!   503 body names those that are not (a pipeline that stopped or failed
//!   to start is not ready).
//! - One signal handling: the first SIGINT/SIGTERM triggers one
//!   [`Shutdown`] every pipeline watches, so each drains within its own
//!   `shutdown.drain_timeout` (they drain at the same time); the binary
//!   exits at once on a second one.
//! - The exit status: the worst of the pipelines' ([`worst`]).
//!
//! A pipeline that stops on its own (an error) or cannot start is reported
//! and the others keep running, unless it has `fail_process: true`: then
//! its stop triggers the shared shutdown (all drain and stop), and its
//! failure to start stops the process before any pipeline runs.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};
use spate_core::error::chain;
use spate_core::metrics::Scope;
use spate_core::pipeline::{ExitStatus, Readiness, RunReport, Shutdown, trigger_on_signal};
use spate_kafka::KafkaDeadLetter;

use crate::admin::{self, AdminState, Collector, PipelineState};
use crate::config::pipelines::{PipelineEntry, ProcessConfig};
use crate::routing::{self, RoutedPipeline};
use crate::service::{self, ServiceError, SpatePipeline};

/// The metric label naming a pipeline on every one of its series.
pub const PIPELINE_LABEL: &str = "pipeline";

/// How long a pipeline's dead-letter producer may flush after its run.
const DEAD_LETTER_FLUSH: Duration = Duration::from_secs(5);

/// The process could not run its pipelines at all.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Another metrics recorder was installed first.
    #[error("metrics recorder: {0}")]
    Metrics(String),
    /// A pipeline with `fail_process: true` could not start.
    #[error("pipeline {name} (fail_process: true) could not start: {why}")]
    Start {
        /// The pipeline.
        name: String,
        /// Its error chain.
        why: String,
    },
    /// The admin server, a thread or a runtime could not start.
    #[error("{0}")]
    Io(String),
}

/// How one pipeline's run ended.
#[derive(Debug)]
pub struct Outcome {
    /// `pipeline.name`.
    pub name: String,
    /// Its run's report, or why it could not start.
    pub result: Result<RunReport, String>,
}

impl Outcome {
    /// The pipeline's exit status ([`ExitStatus::Failed`] when it could not
    /// start).
    pub fn status(&self) -> ExitStatus {
        self.result
            .as_ref()
            .map_or(ExitStatus::Failed, |r| r.status)
    }

    /// One line for stdout, the single form's status line with the name:
    /// `pipeline=NAME status=...`.
    pub fn summary(&self) -> String {
        match &self.result {
            Ok(r) => format!("pipeline={} {}", self.name, r.summary()),
            Err(why) => format!("pipeline={} status=Failed polled=0 error: {why}", self.name),
        }
    }
}

/// What a multi-pipeline run did.
#[derive(Debug)]
pub struct ProcessReport {
    /// Each pipeline's outcome, in config order.
    pub outcomes: Vec<Outcome>,
    /// The worst of their statuses ([`worst`]).
    pub status: ExitStatus,
}

/// How bad a status is, for [`worst`]: failed (3) over abandoned (2) over
/// offset reset (4, nothing lost by spate) over clean (0).
fn severity(s: ExitStatus) -> u8 {
    match s {
        ExitStatus::Clean => 0,
        ExitStatus::OffsetReset => 1,
        ExitStatus::Abandoned => 2,
        ExitStatus::Failed => 3,
    }
}

/// The worst of `statuses` ([`ExitStatus::Clean`] for none).
pub fn worst(statuses: impl IntoIterator<Item = ExitStatus>) -> ExitStatus {
    statuses
        .into_iter()
        .max_by_key(|s| severity(*s))
        .unwrap_or(ExitStatus::Clean)
}

/// A pipeline built from one entry: one table, or routed to several.
pub enum Built {
    /// One table ([`service::build`]).
    One(SpatePipeline),
    /// `tables:` ([`routing::build`]).
    Routed(RoutedPipeline),
}

impl Built {
    /// Builds `entry`'s pipeline (probing its table, or each routed table,
    /// first), and its dead-letter producer when configured. Run it inside
    /// the pipeline's metrics [`Scope`] so what it registers is labelled.
    ///
    /// # Errors
    /// [`ServiceError`] from the probe, the mapping or the builders.
    pub fn build(
        rt: &tokio::runtime::Runtime,
        entry: &PipelineEntry,
    ) -> Result<(Built, Option<Arc<KafkaDeadLetter>>), ServiceError> {
        let config = &entry.config;
        let name = entry.name();
        if entry.tables.is_empty() {
            let plan = rt.block_on(service::plan(config))?;
            for c in &plan.columns {
                let (field, rule) = plan.describe(c);
                tracing::info!(pipeline = %name, column = %c.name, source = %field, rule, "mapping");
            }
            let (p, dl) = service::build(config, &plan)?;
            return Ok((Built::One(p), dl));
        }
        let plans = rt.block_on(routing::plans(&entry.tables))?;
        for (r, plan) in entry.tables.iter().zip(&plans) {
            for c in &plan.columns {
                let (field, rule) = plan.describe(c);
                tracing::info!(
                    pipeline = %name,
                    route = %r.key,
                    table = %r.config.sink.clickhouse.table,
                    column = %c.name,
                    source = %field,
                    rule,
                    "mapping"
                );
            }
        }
        let (p, dl) = routing::build(config, &entry.tables, &plans)?;
        Ok((Built::Routed(p), dl))
    }

    /// The pipeline's readiness (`/readyz`).
    pub fn readiness(&self) -> Readiness {
        match self {
            Built::One(p) => p.readiness(),
            Built::Routed(p) => p.readiness(),
        }
    }

    /// The pipeline's in-flight budget (for its gauges).
    pub fn budget(&self) -> Arc<spate_core::budget::Budget> {
        match self {
            Built::One(p) => p.budget(),
            Built::Routed(p) => p.budget(),
        }
    }

    /// See `Pipeline::set_metrics_scope`.
    pub fn set_metrics_scope(&mut self, scope: Scope) {
        match self {
            Built::One(p) => p.set_metrics_scope(scope),
            Built::Routed(p) => p.set_metrics_scope(scope),
        }
    }

    /// See `Pipeline::run_threaded`.
    pub fn run_threaded(self, shutdown: Shutdown, io_threads: usize) -> RunReport {
        match self {
            Built::One(p) => p.run_threaded(shutdown, io_threads),
            Built::Routed(p) => p.run_threaded(shutdown, io_threads),
        }
    }
}

/// Installs the process's Prometheus recorder as the global one and
/// returns its handle (for `/metrics`) and the recorder itself (`'static`,
/// for the pipelines' labelled scopes).
///
/// # Errors
/// [`ProcessError::Metrics`] when a recorder is already installed.
pub fn install_metrics() -> Result<(PrometheusHandle, &'static PrometheusRecorder), ProcessError> {
    crate::telemetry::install_static().map_err(ProcessError::Metrics)
}

/// The metrics scope of pipeline `name`: `pipeline="NAME"` on every series.
pub fn scope(recorder: &'static PrometheusRecorder, name: &str) -> Scope {
    Scope::labelled(
        recorder,
        vec![metrics::Label::new(PIPELINE_LABEL, name.to_owned())],
    )
}

/// Runs every pipeline of `process` until SIGINT/SIGTERM (or until each
/// has stopped on its own), and reports each one's outcome.
///
/// # Errors
/// [`ProcessError`] when the recorder, the admin server or a thread cannot
/// start, or a `fail_process: true` pipeline cannot start.
pub fn run(process: &ProcessConfig) -> Result<ProcessReport, ProcessError> {
    let (handle, recorder) = install_metrics()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ProcessError::Io(format!("runtime: {e}")))?;
    let mut started = Started::build(process, &rt, recorder)?;
    if process.admin.listen != "off" {
        started.serve_admin(process, handle, recorder)?;
    }
    let shutdown = Shutdown::new();
    trigger_on_signal(shutdown.clone(), "signal received; draining every pipeline")
        .map_err(|e| ProcessError::Io(format!("signal listener: {e}")))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let running = started.built.len();
    for (i, pipeline, dead_letter) in std::mem::take(&mut started.built) {
        spawn_pipeline(
            &process.pipelines[i],
            i,
            pipeline,
            dead_letter,
            &shutdown,
            &tx,
        )?;
    }
    drop(tx);
    let mut outcomes = started.outcomes;
    for _ in 0..running {
        let Ok((i, report)) = rx.recv() else {
            break;
        };
        let entry = &process.pipelines[i];
        if !shutdown.is_triggered() {
            stopped_on_its_own(entry, &report, &shutdown);
        }
        outcomes[i] = Some(Outcome {
            name: entry.name().to_owned(),
            result: Ok(report),
        });
    }
    let outcomes: Vec<Outcome> = outcomes
        .into_iter()
        .zip(&process.pipelines)
        .map(|(o, e)| {
            o.unwrap_or_else(|| Outcome {
                name: e.name().to_owned(),
                result: Err("its thread ended without a report".into()),
            })
        })
        .collect();
    let status = worst(outcomes.iter().map(Outcome::status));
    Ok(ProcessReport { outcomes, status })
}

/// A pipeline built for [`run`], with its index in the config and its
/// dead-letter producer.
type Ready = (usize, Built, Option<Arc<KafkaDeadLetter>>);

/// The process after building its pipelines: those that start, each
/// pipeline's `/readyz` state, the metrics collectors, and the outcome of
/// those that could not start.
struct Started {
    built: Vec<Ready>,
    states: Vec<(String, PipelineState)>,
    collectors: Vec<Collector>,
    outcomes: Vec<Option<Outcome>>,
}

impl Started {
    /// Builds every pipeline of `process` in its own metrics scope. One
    /// that cannot start is reported and the others run, unless it is
    /// `fail_process: true`.
    fn build(
        process: &ProcessConfig,
        rt: &tokio::runtime::Runtime,
        recorder: &'static PrometheusRecorder,
    ) -> Result<Self, ProcessError> {
        let n = process.pipelines.len();
        let mut started = Started {
            built: Vec::with_capacity(n),
            states: Vec::with_capacity(n),
            collectors: vec![crate::telemetry::process_collector()],
            outcomes: (0..n).map(|_| None).collect(),
        };
        for (i, entry) in process.pipelines.iter().enumerate() {
            let name = entry.name().to_owned();
            let scope = scope(recorder, &name);
            match scope.run(|| Built::build(rt, entry)) {
                Ok((mut pipeline, dead_letter)) => {
                    // In the pipeline's scope: its budget gauges carry its label.
                    let budget = pipeline.budget();
                    let collector = scope.run(|| crate::telemetry::budget_collector(budget));
                    started.collectors.push(collector);
                    pipeline.set_metrics_scope(scope);
                    let ready = PipelineState::Running(pipeline.readiness());
                    started.states.push((name, ready));
                    started.built.push((i, pipeline, dead_letter));
                }
                Err(e) => {
                    let why = chain(&e);
                    if entry.fail_process {
                        return Err(ProcessError::Start { name, why });
                    }
                    tracing::error!(pipeline = %name, "cannot start: {why}; the other pipelines run");
                    // Its `spate_ready` reads 0 for as long as the process runs,
                    // as its /readyz entry does (alerts and the dashboard read the
                    // gauge; a pipeline without one would look ready to them).
                    drop(scope.run(Readiness::new));
                    started
                        .states
                        .push((name.clone(), PipelineState::Failed(why.clone())));
                    started.outcomes[i] = Some(Outcome {
                        name,
                        result: Err(why),
                    });
                }
            }
        }
        Ok(started)
    }

    /// Starts the admin server on `admin.listen` with every pipeline's
    /// state and the collectors (which it takes).
    fn serve_admin(
        &mut self,
        process: &ProcessConfig,
        metrics: PrometheusHandle,
        recorder: &'static PrometheusRecorder,
    ) -> Result<(), ProcessError> {
        let addr = process
            .admin
            .listen
            .parse()
            .map_err(|e| ProcessError::Io(format!("admin.listen: {e}")))?;
        let states = std::mem::take(&mut self.states);
        // Not read with `pipelines` set; a running pipeline's, so no
        // extra `spate_ready` series is registered.
        let ready = states
            .iter()
            .find_map(|(_, s)| match s {
                PipelineState::Running(r) => Some(r.clone()),
                PipelineState::Failed(_) => None,
            })
            .unwrap_or_else(|| scope(recorder, process.pipelines[0].name()).run(Readiness::new));
        let state = AdminState {
            metrics,
            ready,
            pipelines: states,
            collectors: std::mem::take(&mut self.collectors),
        };
        let bound = admin::spawn(addr, state).map_err(|e| ProcessError::Io(e.to_string()))?;
        tracing::info!("admin server on http://{bound} (/metrics /healthz /readyz)");
        Ok(())
    }
}

/// Runs pipeline `i` (of `entry`) on its own thread until `shutdown`, then
/// flushes its dead letters and sends its report on `tx`.
fn spawn_pipeline(
    entry: &PipelineEntry,
    i: usize,
    pipeline: Built,
    dead_letter: Option<Arc<KafkaDeadLetter>>,
    shutdown: &Shutdown,
    tx: &std::sync::mpsc::Sender<(usize, RunReport)>,
) -> Result<(), ProcessError> {
    let config = &entry.config;
    let name = config.pipeline.name.clone();
    tracing::info!(
        pipeline = %name,
        table = %format!("{}.{}", config.sink.clickhouse.database, config.sink.clickhouse.table),
        delivery = config.pipeline_config().delivery.as_str(),
        "starting"
    );
    let io_threads = config.pipeline.io_threads;
    let shutdown = shutdown.clone();
    let tx = tx.clone();
    std::thread::Builder::new()
        .name(format!("spate-{name}"))
        .spawn(move || {
            let _span = tracing::info_span!("pipeline", name = %name).entered();
            let report = pipeline.run_threaded(shutdown, io_threads);
            if let Some(dl) = dead_letter {
                dl.flush(DEAD_LETTER_FLUSH);
            }
            // The receiver lives until every pipeline has reported.
            let _ = tx.send((i, report));
        })
        .map(drop)
        .map_err(|e| ProcessError::Io(format!("pipeline thread: {e}")))
}

/// A pipeline stopped before shutdown was asked for: logged, and with
/// `fail_process: true` every pipeline is shut down.
fn stopped_on_its_own(entry: &PipelineEntry, report: &RunReport, shutdown: &Shutdown) {
    tracing::error!(
        pipeline = %entry.name(),
        status = ?report.status,
        "pipeline stopped on its own: {}",
        report.summary()
    );
    if entry.fail_process {
        tracing::error!(
            pipeline = %entry.name(),
            "fail_process: true: shutting every pipeline down"
        );
        shutdown.trigger();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_status_wins() {
        use ExitStatus::*;
        assert_eq!(worst([]), Clean);
        assert_eq!(worst([Clean, OffsetReset, Clean]), OffsetReset);
        assert_eq!(worst([OffsetReset, Abandoned]), Abandoned);
        assert_eq!(worst([Abandoned, Failed, Clean]), Failed);
        assert_eq!(worst([Failed, Abandoned]), Failed);
    }
}
