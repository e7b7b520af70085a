//! The admin HTTP server: `/metrics` (Prometheus text from the installed
//! `metrics` recorder), `/healthz` (200 while the process serves) and
//! `/readyz` (200 only while the pipeline's ready flag is set, with
//! several pipelines while every one's is, the 503 body naming those that
//! are not: after the
//! start-up probe of every replica and until shutdown begins, while every
//! shard has a replica whose breaker is closed and the consumer holds an
//! assignment or waits for one without an error; see
//! `spate_core::pipeline::Pipeline::ready_flag`).
//!
//! It runs on its own thread with a current-thread tokio runtime, so it
//! never competes with the pipeline threads or the sink's I/O runtime, and
//! it keeps answering during a drain. HTTP/1.1 only (hyper 1), no TLS.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;

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

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// Renders the Prometheus text.
    pub metrics: PrometheusHandle,
    /// The pipeline's ready flag (the single-pipeline form).
    pub ready: Arc<AtomicBool>,
    /// With several pipelines (`pipelines:`): each one's name and ready
    /// flag; `/readyz` is 200 when every flag is set (then `ready` is not
    /// read) and its 503 body names those that are not.
    pub pipelines: Vec<(String, Arc<AtomicBool>)>,
}

impl AdminState {
    /// The pipelines not ready now, by name (empty when all are; the
    /// single form reads `ready` and names none).
    fn not_ready(&self) -> Option<Vec<&str>> {
        if self.pipelines.is_empty() {
            return (!self.ready.load(Ordering::Acquire)).then(Vec::new);
        }
        let names: Vec<&str> = self
            .pipelines
            .iter()
            .filter(|(_, f)| !f.load(Ordering::Acquire))
            .map(|(n, _)| n.as_str())
            .collect();
        (!names.is_empty()).then_some(names)
    }
}

/// The answer to one admin request (pure, so tests need no socket).
pub fn respond(state: &AdminState, method: &Method, path: &str) -> (StatusCode, String) {
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match path {
        "/metrics" => (StatusCode::OK, state.metrics.render()),
        "/healthz" => (StatusCode::OK, "ok\n".into()),
        "/readyz" => match state.not_ready() {
            None => (StatusCode::OK, "ready\n".into()),
            Some(names) if names.is_empty() => {
                (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into())
            }
            Some(names) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: pipeline {}\n", names.join(", pipeline ")),
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz, /readyz\n".into(),
        ),
    }
}

async fn handle(
    state: AdminState,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = respond(&state, req.method(), req.uri().path());
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
            ready: Arc::new(AtomicBool::new(false)),
            pipelines: Vec::new(),
        };
        assert_eq!(respond(&state, &Method::GET, "/healthz").0, StatusCode::OK);
        assert_eq!(
            respond(&state, &Method::GET, "/readyz").0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        state.ready.store(true, Ordering::Release);
        assert_eq!(respond(&state, &Method::GET, "/readyz").0, StatusCode::OK);
        assert_eq!(respond(&state, &Method::GET, "/metrics").0, StatusCode::OK);
        assert_eq!(respond(&state, &Method::GET, "/x").0, StatusCode::NOT_FOUND);
        assert_eq!(
            respond(&state, &Method::POST, "/readyz").0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    /// With several pipelines, `/readyz` is 200 only when every one is
    /// ready, and its 503 body names each one that is not.
    #[test]
    fn readyz_with_pipelines_names_those_not_ready() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let flag = |b| Arc::new(AtomicBool::new(b));
        let state = AdminState {
            metrics: recorder.handle(),
            ready: flag(false),
            pipelines: vec![
                ("a".into(), flag(true)),
                ("b".into(), flag(false)),
                ("c".into(), flag(false)),
            ],
        };
        let (status, body) = respond(&state, &Method::GET, "/readyz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: pipeline b, pipeline c\n");
        state.pipelines[1].1.store(true, Ordering::Release);
        state.pipelines[2].1.store(true, Ordering::Release);
        assert_eq!(
            respond(&state, &Method::GET, "/readyz"),
            (StatusCode::OK, "ready\n".to_owned())
        );
        state.pipelines[0].1.store(false, Ordering::Release);
        assert_eq!(
            respond(&state, &Method::GET, "/readyz").1,
            "not ready: pipeline a\n"
        );
    }
}
