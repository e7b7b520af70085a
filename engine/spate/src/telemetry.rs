//! The metrics the service installs: the Prometheus recorder with every
//! histogram's buckets, the `# HELP` text of every series, `spate_build_info`,
//! the `process_*` series and the wall clock core's end-to-end latency reads.
//!
//! Every series spate emits is listed, with type, labels, unit and meaning,
//! in `docs/METRICS.md`. Registration stays where each series lives
//! (`spate_core::metrics`, `spate_kafka`, [`crate::service`]); this module
//! only describes them and configures the exporter.

use std::sync::Arc;

use metrics::{Unit, describe_counter, describe_gauge};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Gauge, always 1: `spate_build_info{version,librdkafka}` (spate's crate
/// version and the linked librdkafka's).
pub const BUILD_INFO: &str = "spate_build_info";

/// A Prometheus builder with the buckets of every spate histogram
/// ([`spate_core::metrics::HISTOGRAM_BUCKETS`]); without them the exporter
/// renders summaries.
///
/// # Errors
/// [`BuildError`] if a bucket list is empty (never, for ours).
pub fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    let mut b = PrometheusBuilder::new();
    for (name, buckets) in spate_core::metrics::HISTOGRAM_BUCKETS {
        b = b.set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)?;
    }
    Ok(b)
}

/// Installs the recorder ([`prometheus_builder`]), describes every series,
/// sets `spate_build_info`, installs the wall clock for end-to-end latency
/// and returns the handle `/metrics` renders with.
///
/// # Errors
/// [`BuildError`] when a recorder is installed already.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = prometheus_builder()?.install_recorder()?;
    describe();
    spate_core::metrics::set_wall_clock(unix_millis);
    Ok(handle)
}

/// As [`install`], and also returns the installed recorder itself (leaked,
/// so `'static`: once per process) for the pipelines' labelled metrics
/// scopes (`spate_core::metrics::Scope`, `crate::process`).
///
/// # Errors
/// The exporter's message when a recorder is installed already.
pub fn install_static() -> Result<
    (
        PrometheusHandle,
        &'static metrics_exporter_prometheus::PrometheusRecorder,
    ),
    String,
> {
    let recorder = prometheus_builder()
        .map_err(|e| e.to_string())?
        .build_recorder();
    let handle = recorder.handle();
    let recorder: &'static metrics_exporter_prometheus::PrometheusRecorder =
        Box::leak(Box::new(recorder));
    metrics::set_global_recorder(recorder).map_err(|e| e.to_string())?;
    describe();
    spate_core::metrics::set_wall_clock(unix_millis);
    Ok((handle, recorder))
}

/// Registers the `# HELP` text of every series spate emits and sets
/// `spate_build_info`. Call after installing the recorder.
pub fn describe() {
    spate_core::metrics::describe();
    spate_kafka::describe_metrics();
    describe_counter!(
        spate_kafka::DEAD_LETTER_DROPPED,
        Unit::Count,
        "Dead letters that did not reach the dead-letter topic (queue full, delivery failed, still queued at the final flush)."
    );
    describe_gauge!(
        BUILD_INFO,
        Unit::Count,
        "Always 1; labels: version (spate's) and librdkafka (the linked librdkafka's)."
    );
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    metrics::gauge!(BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "librdkafka" => librdkafka)
    .set(1.0);
}

/// The `process_*` series (CPU seconds, resident and virtual memory, open
/// and maximum file descriptors, start time, threads) from /proc, through
/// the `metrics-process` crate: described once here, refreshed by the
/// returned function, which the admin server calls before each render.
pub fn process_collector() -> Arc<dyn Fn() + Send + Sync> {
    let collector = metrics_process::Collector::default();
    collector.describe();
    Arc::new(move || collector.collect())
}

/// Milliseconds since the Unix epoch from the system clock (0 before it).
fn unix_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Sets the in-flight budget gauges (`spate_budget_{bytes,rows}_{in_use,max}`)
/// from `budget`; the admin server calls it before each render, so the
/// values are exact at scrape time and nothing is sampled in between.
pub fn budget_collector(budget: Arc<spate_core::budget::Budget>) -> Arc<dyn Fn() + Send + Sync> {
    use spate_core::metrics as m;
    let bytes_in_use = metrics::gauge!(m::BUDGET_BYTES_IN_USE);
    let rows_in_use = metrics::gauge!(m::BUDGET_ROWS_IN_USE);
    metrics::gauge!(m::BUDGET_BYTES_MAX).set(budget.max_bytes() as f64);
    metrics::gauge!(m::BUDGET_ROWS_MAX).set(budget.max_rows() as f64);
    Arc::new(move || {
        bytes_in_use.set(budget.bytes_in_use() as f64);
        rows_in_use.set(budget.rows_in_use() as f64);
    })
}
