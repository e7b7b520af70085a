//! spate: the service facade. The `spate` binary (run, check, broker,
//! produce, demo) lives in `main.rs`; this library holds what it is built
//! from and what tests can reach without a process:
//!
//! - [`config`]: the YAML config model, interpolation and validation.
//! - [`admin`]: the admin HTTP server (`/metrics`, `/healthz`, `/readyz`).
//! - [`kafka_tools`]: `spate_kafka::tools` (embedded broker, NDJSON
//!   producer, offsets) under the name the integration tests use.
//! - [`schema_formats`]: `format.avro` and `format.protobuf` planned at
//!   start and turned into a pipeline thread's chain (with the schema
//!   registry).
//! - [`error`]: [`error::ServiceError`], why a pipeline could not be
//!   assembled.
//! - [`process`]: several pipelines in one process (`pipelines:`).
//! - [`routing`]: topic-to-table routing inside one pipeline (`tables:`).
//! - [`telemetry`]: the Prometheus recorder, `# HELP` text, build and
//!   process metrics (every series: `docs/METRICS.md`).
//! - [`service`]: assembling the Kafka source, the ClickHouse writer and
//!   mapper and the pipeline from a [`config::Config`].
#![forbid(unsafe_code)]

pub mod admin;
pub mod config;
pub mod error;
pub mod process;
pub mod routing;
pub mod sample;
pub mod schema_formats;
pub mod service;
pub mod telemetry;

/// The Kafka helpers ([`spate_kafka::tools`]) under their old name, for the
/// integration tests in `tests/`.
pub use spate_kafka::tools as kafka_tools;
