//! The admin HTTP server: `/metrics` (Prometheus text from the installed
//! `metrics` recorder, families sorted by name and each counter's and
//! gauge's samples by labels, so scrapes list series in a stable order),
//! `/healthz` (200 while the process serves) and `/readyz` (200 `ready`
//! only while the pipeline is ready: after the start-up probe of every
//! replica and until shutdown begins, while every shard has a replica whose
//! breaker is closed and the consumer holds an assignment or waits for one
//! without an error; else 503 `not ready: <why>`, naming the shard and each
//! replica's last error, or the consumer's standing error; see
//! `spate_core::pipeline::Readiness`). With several pipelines in the process
//! (`pipelines:`), `/readyz` is 200 only while every one is ready, and its
//! 503 body names each one that is not with its reason.
//!
//! It runs on its own thread with a current-thread tokio runtime, so it
//! never competes with the pipeline threads or the sink's I/O runtime, and
//! it keeps answering during a drain. HTTP/1.1 only (hyper 1), no TLS.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use spate_core::pipeline::Readiness;

/// The admin server could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Binding `addr` failed.
    #[error("admin server: cannot listen on {addr}: {source}")]
    Bind {
        /// The address from `admin.listen`.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The thread or its runtime could not start.
    #[error("admin server: {0}")]
    Start(std::io::Error),
}

/// A function run before each `/metrics` render (refreshes gauges read
/// from elsewhere: `process_*`, the in-flight budget).
pub type Collector = Arc<dyn Fn() + Send + Sync>;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Renders the Prometheus text.
    pub metrics: PrometheusHandle,
    /// The pipeline's readiness and why it is not ready (the single form;
    /// not read when `pipelines` is not empty).
    pub ready: Readiness,
    /// With several pipelines (`pipelines:`): each one's name and state.
    pub pipelines: Vec<(String, PipelineState)>,
    /// Run before each render, in order.
    pub collectors: Vec<Collector>,
}

/// One pipeline's state, as `/readyz` reads it with several pipelines.
#[derive(Clone, Debug)]
pub enum PipelineState {
    /// Built: its own readiness (down while starting, degraded, stopped).
    Running(Readiness),
    /// It could not start; why.
    Failed(String),
}

impl AdminState {
    /// `Ok(())` when ready, else why not: the single pipeline's reason, or
    /// with several each pipeline that is not ready and its reason,
    /// `; `-separated.
    fn check(&self) -> Result<(), String> {
        if self.pipelines.is_empty() {
            return self.ready.check();
        }
        let down: Vec<String> = self
            .pipelines
            .iter()
            .filter_map(|(name, state)| match state {
                PipelineState::Running(r) => {
                    r.check().err().map(|why| format!("pipeline {name}: {why}"))
                }
                PipelineState::Failed(why) => {
                    Some(format!("pipeline {name}: could not start: {why}"))
                }
            })
            .collect();
        if down.is_empty() {
            Ok(())
        } else {
            Err(down.join("; "))
        }
    }
}

impl AdminState {
    /// Each pipeline's consumer status (`Readiness::status`: joining since
    /// when, partitions assigned, lag and time without progress), one line
    /// each, `pipeline NAME: ` before it with several pipelines; empty
    /// lines left out.
    fn status_lines(&self) -> String {
        let mut out = String::new();
        if self.pipelines.is_empty() {
            let status = self.ready.status();
            if !status.is_empty() {
                out.push_str(&status);
                out.push('\n');
            }
            return out;
        }
        for (name, state) in &self.pipelines {
            if let PipelineState::Running(r) = state {
                let status = r.status();
                if !status.is_empty() {
                    out.push_str(&format!("pipeline {name}: {status}\n"));
                }
            }
        }
        out
    }
}

/// The answer to one admin request (pure, so tests need no socket).
/// `target` is the request's path with its query, if any: `/healthz?verbose`
/// adds readiness and each consumer's status to `ok`.
///
/// `/readyz` answers `ready` or `not ready: <why>` on its first line (the
/// meaning is unchanged) and what the consumer is doing on the next:
/// `joining the group since 12.0 s ago (...)`, `assigned 8 partition(s)`,
/// `no progress for 40 s while lag is 1200` (issue 31).
pub fn respond(state: &AdminState, method: &Method, target: &str) -> (StatusCode, String) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match path {
        "/metrics" => {
            for collect in &state.collectors {
                collect();
            }
            (StatusCode::OK, stable_order(&state.metrics.render()))
        }
        "/healthz"
            if query
                .split('&')
                .any(|q| q == "verbose" || q.starts_with("verbose=")) =>
        {
            let readiness = match state.check() {
                Ok(()) => "ready".to_owned(),
                Err(why) => format!("not ready: {why}"),
            };
            (
                StatusCode::OK,
                format!("ok\nreadiness: {readiness}\n{}", state.status_lines()),
            )
        }
        "/healthz" => (StatusCode::OK, "ok\n".into()),
        "/readyz" => match state.check() {
            Ok(()) => (StatusCode::OK, format!("ready\n{}", state.status_lines())),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n{}", state.status_lines()),
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz, /readyz\n".into(),
        ),
    }
}

/// The labels of a histogram or summary sample line without its `le` or
/// `quantile` label: the key its label set sorts by.
fn series_labels(line: &str) -> String {
    let Some((_, rest)) = line.split_once('{') else {
        return String::new();
    };
    let labels = rest.rsplit_once('}').map_or(rest, |(l, _)| l);
    labels
        .split(',')
        .filter(|l| !l.starts_with("le=") && !l.starts_with("quantile="))
        .collect::<Vec<_>>()
        .join(",")
}

/// The exporter's text with its families (a `# HELP`/`# TYPE` header and
/// its samples, separated by blank lines) sorted by name, and the samples
/// of each counter and gauge family sorted by their text (labels). The
/// exporter walks hash maps, so its own order changes between scrapes.
/// Histogram and summary families are sorted by label set, each keeping
/// its samples' order (the buckets in `le` order, then `_sum`, `_count`).
pub fn stable_order(text: &str) -> String {
    let mut families: Vec<(String, Vec<&str>)> = Vec::new();
    for block in text.split("\n\n") {
        let lines: Vec<&str> = block.lines().filter(|l| !l.is_empty()).collect();
        if lines.is_empty() {
            continue;
        }
        let (header, mut samples): (Vec<&str>, Vec<&str>) =
            lines.into_iter().partition(|l| l.starts_with('#'));
        let kind = header
            .iter()
            .find_map(|l| l.strip_prefix("# TYPE "))
            .and_then(|t| t.split_whitespace().nth(1))
            .unwrap_or("untyped");
        let name = header
            .iter()
            .find_map(|l| l.strip_prefix("# TYPE "))
            .and_then(|t| t.split_whitespace().next())
            .map(str::to_owned)
            .or_else(|| {
                samples
                    .first()
                    .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_owned())
            })
            .unwrap_or_default();
        if matches!(kind, "counter" | "gauge" | "untyped") {
            samples.sort_unstable();
        } else {
            // Label sets in order, each keeping its buckets' order (stable
            // sort on the labels without `le`/`quantile`).
            samples.sort_by_cached_key(|l| series_labels(l));
        }
        let mut lines = header;
        lines.extend(samples);
        families.push((name, lines));
    }
    families.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::with_capacity(text.len() + 1);
    for (_, lines) in families {
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

async fn handle(
    state: AdminState,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path(), |p| p.as_str());
    let (status, body) = respond(&state, req.method(), target);
    let content_type = if req.uri().path() == "/metrics" {
        "text/plain; version=0.0.4"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    Ok(resp)
}

/// Binds `addr` and serves on a background thread for the life of the
/// process. Returns the bound address (useful with port 0).
///
/// # Errors
/// [`AdminError`] when the address cannot be bound or the thread not started.
pub fn spawn(addr: SocketAddr, state: AdminState) -> Result<SocketAddr, AdminError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| AdminError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(AdminError::Start)?;
    let local = listener.local_addr().map_err(AdminError::Start)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AdminError::Start)?;
    std::thread::Builder::new()
        .name("spate-admin".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("admin server: {e}");
                        return;
                    }
                };
                loop {
                    let (stream, _) = match listener.accept().await {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!("admin server: accept: {e}");
                            continue;
                        }
                    };
                    let state = state.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req| handle(state.clone(), req));
                        if let Err(e) = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                        {
                            tracing::debug!("admin server: connection: {e}");
                        }
                    });
                }
            });
        })
        .map_err(AdminError::Start)?;
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn readyz_follows_the_flag_and_healthz_is_always_ok() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let state = AdminState {
            metrics: recorder.handle(),
            ready: Readiness::new(),
            pipelines: Vec::new(),
            collectors: Vec::new(),
        };
        assert_eq!(respond(&state, &Method::GET, "/healthz").0, StatusCode::OK);
        let (status, body) = respond(&state, &Method::GET, "/readyz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.starts_with("not ready: starting"), "{body}");
        assert_eq!(respond(&state, &Method::GET, "/metrics").0, StatusCode::OK);
        assert_eq!(respond(&state, &Method::GET, "/x").0, StatusCode::NOT_FOUND);
        assert_eq!(
            respond(&state, &Method::POST, "/readyz").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn metrics_runs_the_collectors_before_rendering() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Arc::clone(&runs);
        let state = AdminState {
            metrics: recorder.handle(),
            ready: Readiness::new(),
            pipelines: Vec::new(),
            collectors: vec![Arc::new(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })],
        };
        respond(&state, &Method::GET, "/metrics");
        respond(&state, &Method::GET, "/healthz");
        respond(&state, &Method::GET, "/metrics");
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn histogram_label_sets_sort_and_keep_their_bucket_order() {
        let text = "# TYPE h histogram\nh_bucket{shard=\"1\",le=\"1\"} 1\nh_bucket{shard=\"1\",le=\"+Inf\"} 1\n\
                    h_sum{shard=\"1\"} 1\nh_count{shard=\"1\"} 1\nh_bucket{shard=\"0\",le=\"1\"} 2\n\
                    h_bucket{shard=\"0\",le=\"+Inf\"} 2\nh_sum{shard=\"0\"} 2\nh_count{shard=\"0\"} 2\n\n";
        let want = "# TYPE h histogram\nh_bucket{shard=\"0\",le=\"1\"} 2\nh_bucket{shard=\"0\",le=\"+Inf\"} 2\n\
                    h_sum{shard=\"0\"} 2\nh_count{shard=\"0\"} 2\nh_bucket{shard=\"1\",le=\"1\"} 1\n\
                    h_bucket{shard=\"1\",le=\"+Inf\"} 1\nh_sum{shard=\"1\"} 1\nh_count{shard=\"1\"} 1\n\n";
        assert_eq!(stable_order(text), want);
    }

    #[test]
    fn stable_order_sorts_families_and_counter_samples_keeps_histograms() {
        let a = "# HELP b_total B.\n# TYPE b_total counter\nb_total{shard=\"1\"} 2\nb_total{shard=\"0\"} 1\n\n\
                 # TYPE a_seconds histogram\na_seconds_bucket{le=\"1\"} 1\na_seconds_bucket{le=\"+Inf\"} 1\n\
                 a_seconds_sum 0.5\na_seconds_count 1\n\n\
                 # HELP c C.\n# TYPE c gauge\nc 0\n\n";
        let b = "# HELP c C.\n# TYPE c gauge\nc 0\n\n\
                 # HELP b_total B.\n# TYPE b_total counter\nb_total{shard=\"0\"} 1\nb_total{shard=\"1\"} 2\n\n\
                 # TYPE a_seconds histogram\na_seconds_bucket{le=\"1\"} 1\na_seconds_bucket{le=\"+Inf\"} 1\n\
                 a_seconds_sum 0.5\na_seconds_count 1\n\n";
        let want = "# TYPE a_seconds histogram\na_seconds_bucket{le=\"1\"} 1\na_seconds_bucket{le=\"+Inf\"} 1\n\
                    a_seconds_sum 0.5\na_seconds_count 1\n\n\
                    # HELP b_total B.\n# TYPE b_total counter\nb_total{shard=\"0\"} 1\nb_total{shard=\"1\"} 2\n\n\
                    # HELP c C.\n# TYPE c gauge\nc 0\n\n";
        assert_eq!(stable_order(a), want);
        assert_eq!(stable_order(b), want);
    }

    /// `/healthz?verbose` says readiness; a query never changes `/readyz`'s
    /// status.
    #[test]
    fn healthz_verbose_says_readiness_and_readyz_ignores_queries() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let state = AdminState {
            metrics: recorder.handle(),
            ready: Readiness::new(),
            pipelines: Vec::new(),
            collectors: Vec::new(),
        };
        assert_eq!(respond(&state, &Method::GET, "/healthz").1, "ok\n");
        let (status, body) = respond(&state, &Method::GET, "/healthz?verbose");
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.starts_with("ok\nreadiness: not ready: starting"),
            "{body}"
        );
        let (status, _) = respond(&state, &Method::GET, "/readyz?x=1");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }

    /// With several pipelines, `/readyz` names each one that is not ready
    /// with its reason (one that could not start included); the 200 when
    /// every one is ready is in `tests/it/multi.rs` (a Readiness is only set
    /// ready by its controller).
    #[test]
    fn readyz_with_pipelines_names_each_one_not_ready_and_why() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let state = AdminState {
            metrics: recorder.handle(),
            ready: Readiness::new(),
            pipelines: vec![
                ("a".into(), PipelineState::Running(Readiness::new())),
                ("b".into(), PipelineState::Failed("no table".into())),
            ],
            collectors: Vec::new(),
        };
        let (status, body) = respond(&state, &Method::GET, "/readyz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.starts_with("not ready: pipeline a: starting"),
            "{body}"
        );
        assert!(
            body.trim_end()
                .ends_with("; pipeline b: could not start: no table"),
            "{body}"
        );
    }
}
