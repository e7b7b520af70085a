//! Metric names (all under `spate_`) and the handles the engine registers once,
//! at build time, so no record or batch path looks a metric up by name.
//!
//! Emitted through the `metrics` facade; the service installs a Prometheus
//! exporter, tests install a debugging recorder. Labels: `shard` (index in
//! `sink.shards`), `topic` and `partition`.

pub use ::metrics::{Counter, Gauge};

mod scope;
pub use scope::{Labelled, Scope};

/// Counter: batches a shard wrote and got acknowledged.
pub const BATCHES_FLUSHED: &str = "spate_sink_batches_flushed_total";
/// Counter: batches a shard gave up on (attempts exhausted, fatal error or
/// drain deadline); their acks failed.
pub const BATCHES_ABANDONED: &str = "spate_sink_batches_abandoned_total";
/// Counter: rows acknowledged by a shard.
pub const ROWS_WRITTEN: &str = "spate_sink_rows_written_total";
/// Counter: bytes (encoded payload) acknowledged by a shard.
pub const BYTES_WRITTEN: &str = "spate_sink_bytes_written_total";
/// Counter: write attempts after the first, per shard.
pub const RETRIES: &str = "spate_sink_retries_total";
/// Counter: extra batch copies that may be in the table: one per write attempt
/// whose outcome is unknown (timed out, connection lost after sending) of a
/// batch, where the server ignores the dedup token (plain MergeTree). A batch
/// acknowledged after `k` such attempts may be stored up to `k + 1` times and
/// adds `k`.
pub const POSSIBLE_DUPLICATES: &str = "spate_sink_possible_duplicate_batches_total";
/// Counter: the rows of those extra copies ([`POSSIBLE_DUPLICATES`] weighted
/// by each batch's rows).
pub const POSSIBLE_DUPLICATE_ROWS: &str = "spate_sink_possible_duplicate_rows_total";
/// Gauge: seconds of retry backoff a shard's writes are sleeping right now
/// (summed over its concurrent writes).
pub const BACKOFF_SECONDS: &str = "spate_sink_backoff_seconds";
/// Gauge: writes in flight per shard.
pub const INFLIGHT_WRITES: &str = "spate_sink_inflight_writes";
/// Gauge: chunks waiting in a shard's queue.
pub const QUEUE_DEPTH: &str = "spate_sink_queue_depth";
/// Gauge: last committed offset per topic and partition.
pub const COMMITTED_OFFSET: &str = "spate_committed_offset";
/// Counter: poll batches whose ack resolved as failed.
pub const ACK_FAILURES: &str = "spate_ack_failures_total";

/// Handles for one shard's metrics, registered when the sink pool is built.
#[derive(Clone, Debug)]
pub struct ShardMetrics {
    /// [`BATCHES_FLUSHED`].
    pub batches_flushed: Counter,
    /// [`BATCHES_ABANDONED`].
    pub batches_abandoned: Counter,
    /// [`ROWS_WRITTEN`].
    pub rows_written: Counter,
    /// [`BYTES_WRITTEN`].
    pub bytes_written: Counter,
    /// [`RETRIES`].
    pub retries: Counter,
    /// [`POSSIBLE_DUPLICATES`].
    pub possible_duplicates: Counter,
    /// [`POSSIBLE_DUPLICATE_ROWS`].
    pub possible_duplicate_rows: Counter,
    /// [`BACKOFF_SECONDS`].
    pub backoff_seconds: Gauge,
    /// [`INFLIGHT_WRITES`].
    pub inflight_writes: Gauge,
    /// [`QUEUE_DEPTH`].
    pub queue_depth: Gauge,
}

impl ShardMetrics {
    /// Registers the handles of shard `shard` with the installed recorder.
    pub fn register(shard: usize) -> Self {
        let s = shard.to_string();
        Self {
            batches_flushed: ::metrics::counter!(BATCHES_FLUSHED, "shard" => s.clone()),
            batches_abandoned: ::metrics::counter!(BATCHES_ABANDONED, "shard" => s.clone()),
            rows_written: ::metrics::counter!(ROWS_WRITTEN, "shard" => s.clone()),
            bytes_written: ::metrics::counter!(BYTES_WRITTEN, "shard" => s.clone()),
            retries: ::metrics::counter!(RETRIES, "shard" => s.clone()),
            possible_duplicates: ::metrics::counter!(POSSIBLE_DUPLICATES, "shard" => s.clone()),
            possible_duplicate_rows: ::metrics::counter!(POSSIBLE_DUPLICATE_ROWS, "shard" => s.clone()),
            backoff_seconds: ::metrics::gauge!(BACKOFF_SECONDS, "shard" => s.clone()),
            inflight_writes: ::metrics::gauge!(INFLIGHT_WRITES, "shard" => s.clone()),
            queue_depth: ::metrics::gauge!(QUEUE_DEPTH, "shard" => s),
        }
    }
}

/// Counter: payloads polled from lanes.
pub const RECORDS_POLLED: &str = "spate_records_polled_total";
/// Counter: payloads skipped by the `on_error: skip` policy, by `reason`
/// (`decode`, `operator`, `encode`).
pub const RECORDS_SKIPPED: &str = "spate_records_skipped_total";
/// Counter: times a pipeline thread paused its lanes for backpressure.
pub const LANE_PAUSES: &str = "spate_lane_pauses_total";
/// Counter: commits the source refused or failed.
pub const COMMIT_FAILURES: &str = "spate_commit_failures_total";
