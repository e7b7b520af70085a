//! Why a pipeline could not be assembled ([`ServiceError`]): the schema
//! probe, the mapping, the format plan (`schema_formats.rs`), the Kafka
//! client, the dead-letter producer or the pipeline builder. A module of its
//! own so the format planner and the assembly (`service.rs`) share it
//! without depending on each other.

use spate_core::pipeline::PipelineError;

/// Why a pipeline could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No replica answered the schema probe.
    #[error("schema probe of {database}.{table}: no replica gave the schema: {errors}")]
    Probe {
        /// Target database.
        database: String,
        /// Target table.
        table: String,
        /// Each replica's error, `; `-joined.
        errors: String,
    },
    /// The table's columns cannot be mapped.
    #[error("mapping onto {table}: {reason}")]
    Mapping {
        /// Target table.
        table: String,
        /// Why.
        reason: String,
    },
    /// The Kafka client refused its configuration.
    #[error("kafka source: {0}")]
    Kafka(#[from] spate_kafka::ConfigError),
    /// The dead-letter producer could not be created.
    #[error(transparent)]
    DeadLetter(#[from] spate_kafka::DeadLetterError),
    /// The pipeline refused its configuration.
    #[error("pipeline: {0}")]
    Pipeline(#[from] PipelineError),
    /// A runtime could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// The config is invalid (a check that only runs when the pipeline is
    /// assembled).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The schema registry did not answer (after its retries) or refused;
    /// `reason` names the URL.
    #[error("{key}: {reason}")]
    Registry {
        /// The config key of the registry section.
        key: String,
        /// The registry's URL.
        url: String,
        /// Why.
        reason: String,
    },
}
