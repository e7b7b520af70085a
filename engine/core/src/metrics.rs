//! Metric names (all under `spate_`) and the handles the engine registers once,
//! at build time, so no record or batch path looks a metric up by name.
//!
//! Emitted through the `metrics` facade; the service installs a Prometheus
//! exporter, tests install a debugging recorder. Labels: `shard` (index in
//! `sink.shards`), `topic` and `partition`.

use std::sync::OnceLock;

use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub use ::metrics::{Counter, Gauge, Histogram};

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

/// Histogram: per acknowledged batch, seconds from its first write attempt
/// to its acknowledgment (retries and backoff included), per shard.
pub const INSERT_DURATION: &str = "spate_sink_insert_duration_seconds";
/// Histogram: rows per acknowledged batch, per shard.
pub const BATCH_ROWS: &str = "spate_sink_batch_rows";
/// Histogram: encoded bytes per acknowledged batch, per shard.
pub const BATCH_BYTES: &str = "spate_sink_batch_bytes";
/// Histogram: per acknowledged batch, seconds from the Kafka timestamp of
/// its oldest poll batch's first record to the acknowledgment, per shard
/// (wall clock: needs [`set_wall_clock`]; batches without timestamps record
/// nothing).
pub const END_TO_END_LATENCY: &str = "spate_end_to_end_latency_seconds";
/// Gauge (0/1): per `shard` and `replica`, 1 while the replica's breaker is
/// open (its failures reached `sink.breaker.failure_threshold` and no write
/// succeeded since; the cooldown and the half-open trial included).
pub const REPLICA_BREAKER_OPEN: &str = "spate_sink_replica_breaker_open";
/// Gauge (0/1): per shard, 1 while the shard has a replica whose breaker is
/// closed.
pub const SHARD_READY: &str = "spate_sink_shard_ready";
/// Histogram: seconds one successful offset commit took (set by the source).
pub const COMMIT_DURATION: &str = "spate_commit_duration_seconds";
/// Gauge: unix seconds of the last successful commit that included the
/// `topic` and `partition` (set by the source, which has the wall clock).
pub const LAST_COMMIT_TIMESTAMP: &str = "spate_last_commit_timestamp_seconds";
/// Gauge: bytes of the in-flight budget taken (set at each scrape by the service).
pub const BUDGET_BYTES_IN_USE: &str = "spate_budget_bytes_in_use";
/// Gauge: the in-flight byte budget.
pub const BUDGET_BYTES_MAX: &str = "spate_budget_bytes_max";
/// Gauge: rows of the in-flight budget taken (set at each scrape by the service).
pub const BUDGET_ROWS_IN_USE: &str = "spate_budget_rows_in_use";
/// Gauge: the in-flight row budget.
pub const BUDGET_ROWS_MAX: &str = "spate_budget_rows_max";
/// Gauge (0/1): 1 while the pipeline is ready (what `/readyz` answers 200 for).
pub const READY: &str = "spate_ready";

/// Histogram buckets (upper bounds) of every histogram above, for the
/// exporter (`PrometheusBuilder::set_buckets_for_metric`); without them it
/// would render summaries. Latencies span a fast local insert (5 ms) to a
/// retry storm (2 min); end-to-end latency up to an hour of backlog; sizes
/// span `sink.batch` limits from one row to a million rows / 256 MiB.
pub const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[
    (
        INSERT_DURATION,
        &[
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
        ],
    ),
    (
        COMMIT_DURATION,
        &[
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ],
    ),
    (
        END_TO_END_LATENCY,
        &[
            0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
            3600.0,
        ],
    ),
    (
        BATCH_ROWS,
        &[
            1.0, 10.0, 100.0, 1000.0, 5000.0, 10000.0, 50000.0, 100000.0, 500000.0, 1000000.0,
        ],
    ),
    (
        BATCH_BYTES,
        &[
            1024.0,
            16384.0,
            65536.0,
            262144.0,
            1048576.0,
            4194304.0,
            16777216.0,
            67108864.0,
            268435456.0,
        ],
    ),
];

/// A wall clock: milliseconds since the Unix epoch.
pub type WallClock = fn() -> i64;

static WALL_CLOCK: OnceLock<WallClock> = OnceLock::new();

/// Installs the wall clock the end-to-end latency histogram reads (the
/// service passes the system clock; tests and the simulator leave it unset,
/// so core reads no wall clock of its own: D7). The first call wins.
pub fn set_wall_clock(clock: WallClock) {
    let _ = WALL_CLOCK.set(clock);
}

/// The installed wall clock, if any.
pub(crate) fn wall_clock() -> Option<WallClock> {
    WALL_CLOCK.get().copied()
}

/// Registers the `# HELP` text and unit of every series core emits with the
/// installed recorder (the Prometheus exporter renders them). Call once,
/// after installing the recorder; series registered before or after it get
/// their description either way.
pub fn describe() {
    describe_writes();
    describe_shards();
    describe_intake();
    describe_checkpoint();
    describe_budget();
}

/// The batches, rows and bytes shards wrote, retried or gave up on.
fn describe_writes() {
    describe_counter!(
        BATCHES_FLUSHED,
        Unit::Count,
        "Batches a shard wrote and a replica acknowledged."
    );
    describe_counter!(
        BATCHES_ABANDONED,
        Unit::Count,
        "Batches a shard gave up on (attempts exhausted, fatal error, drain deadline, write task failed); their acks failed and their partitions stop committing."
    );
    describe_counter!(ROWS_WRITTEN, Unit::Count, "Rows acknowledged by a shard.");
    describe_counter!(
        BYTES_WRITTEN,
        Unit::Bytes,
        "Encoded payload bytes acknowledged by a shard."
    );
    describe_counter!(
        RETRIES,
        Unit::Count,
        "Write attempts after the first, per shard."
    );
    describe_counter!(
        POSSIBLE_DUPLICATES,
        Unit::Count,
        "Extra batch copies that may be in the table: write attempts with an unknown outcome (timed out, cut off after sending) where the server ignores the dedup token."
    );
    describe_counter!(
        POSSIBLE_DUPLICATE_ROWS,
        Unit::Count,
        "Rows of the possible duplicate batch copies."
    );
    describe_histogram!(
        INSERT_DURATION,
        Unit::Seconds,
        "Per acknowledged batch: seconds from its first write attempt to its acknowledgment (retries and backoff included), per shard."
    );
    describe_histogram!(
        BATCH_ROWS,
        Unit::Count,
        "Rows per acknowledged batch, per shard."
    );
    describe_histogram!(
        BATCH_BYTES,
        Unit::Bytes,
        "Encoded bytes per acknowledged batch, per shard."
    );
    describe_histogram!(
        END_TO_END_LATENCY,
        Unit::Seconds,
        "Per acknowledged batch: seconds from the Kafka timestamp of the first record of its oldest poll batch to the acknowledgment, per shard."
    );
}

/// What each shard is doing now: backoff, writes in flight, queue, breakers, readiness.
fn describe_shards() {
    describe_gauge!(
        BACKOFF_SECONDS,
        Unit::Seconds,
        "Seconds of retry backoff a shard's writes are sleeping right now, summed over its concurrent writes (0 when none sleeps)."
    );
    describe_gauge!(INFLIGHT_WRITES, Unit::Count, "Writes in flight per shard.");
    describe_gauge!(
        QUEUE_DEPTH,
        Unit::Count,
        "Chunks waiting in a shard's queue."
    );
    describe_gauge!(
        REPLICA_BREAKER_OPEN,
        Unit::Count,
        "1 while a replica's circuit breaker is open (failures reached sink.breaker.failure_threshold, no success since), else 0."
    );
    describe_gauge!(
        SHARD_READY,
        Unit::Count,
        "1 while the shard has a replica whose breaker is closed, else 0."
    );
}

/// What the pipeline threads polled, filtered, skipped and paused for.
fn describe_intake() {
    describe_counter!(RECORDS_POLLED, Unit::Count, "Payloads polled from lanes.");
    describe_counter!(
        RECORDS_FILTERED,
        Unit::Count,
        "Rows dropped on purpose, by reason: filter (mapping.filter refused the row, after fan-out), explode_empty (a record whose mapping.explode array was empty); their messages still commit."
    );
    describe_counter!(
        RECORDS_SKIPPED,
        Unit::Count,
        "Payloads skipped by the on_error: skip policy, by reason (decode, operator, encode)."
    );
    describe_counter!(
        LANE_PAUSES,
        Unit::Count,
        "Times a pipeline thread paused its lanes for backpressure."
    );
}

/// Acks and offset commits (D1).
fn describe_checkpoint() {
    describe_counter!(
        ACK_FAILURES,
        Unit::Count,
        "Poll batches whose ack resolved as failed."
    );
    describe_gauge!(
        COMMITTED_OFFSET,
        Unit::Count,
        "Last committed offset per topic and partition (the group's offset from the assignment on)."
    );
    describe_counter!(
        COMMIT_FAILURES,
        Unit::Count,
        "Offset commits the source refused or failed."
    );
    describe_histogram!(
        COMMIT_DURATION,
        Unit::Seconds,
        "Seconds one successful offset commit to the group took."
    );
    describe_gauge!(
        LAST_COMMIT_TIMESTAMP,
        Unit::Seconds,
        "Unix time in seconds of the last successful offset commit that included the partition."
    );
}

/// The in-flight budget (D8) and the pipeline's readiness.
fn describe_budget() {
    describe_gauge!(
        BUDGET_BYTES_IN_USE,
        Unit::Bytes,
        "Bytes of the in-flight budget taken (sink.clickhouse.inflight.max_bytes)."
    );
    describe_gauge!(
        BUDGET_BYTES_MAX,
        Unit::Bytes,
        "The in-flight byte budget (sink.clickhouse.inflight.max_bytes)."
    );
    describe_gauge!(
        BUDGET_ROWS_IN_USE,
        Unit::Count,
        "Rows of the in-flight budget taken."
    );
    describe_gauge!(BUDGET_ROWS_MAX, Unit::Count, "The in-flight row budget.");
    describe_gauge!(
        READY,
        Unit::Count,
        "1 while the pipeline is ready (/readyz answers 200), else 0."
    );
}

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
    /// [`INSERT_DURATION`].
    pub insert_duration: Histogram,
    /// [`BATCH_ROWS`].
    pub batch_rows: Histogram,
    /// [`BATCH_BYTES`].
    pub batch_bytes: Histogram,
    /// [`END_TO_END_LATENCY`].
    pub end_to_end: Histogram,
    /// [`REPLICA_BREAKER_OPEN`], one per replica in `sink.shards` order.
    pub breaker_open: Vec<Gauge>,
    /// [`SHARD_READY`].
    pub shard_ready: Gauge,
}

impl ShardMetrics {
    /// Registers the handles of shard `shard`, which has `replicas`
    /// replicas, with the installed recorder; the breaker gauges start at 0
    /// and the shard's readiness at 1 (every breaker closed).
    pub fn register(shard: usize, replicas: usize) -> Self {
        let s = shard.to_string();
        let breaker_open: Vec<Gauge> = (0..replicas)
            .map(|r| {
                ::metrics::gauge!(REPLICA_BREAKER_OPEN, "shard" => s.clone(), "replica" => r.to_string())
            })
            .collect();
        for g in &breaker_open {
            g.set(0.0);
        }
        let shard_ready = ::metrics::gauge!(SHARD_READY, "shard" => s.clone());
        shard_ready.set(1.0);
        let backoff_seconds = ::metrics::gauge!(BACKOFF_SECONDS, "shard" => s.clone());
        backoff_seconds.set(0.0);
        Self {
            insert_duration: ::metrics::histogram!(INSERT_DURATION, "shard" => s.clone()),
            batch_rows: ::metrics::histogram!(BATCH_ROWS, "shard" => s.clone()),
            batch_bytes: ::metrics::histogram!(BATCH_BYTES, "shard" => s.clone()),
            end_to_end: ::metrics::histogram!(END_TO_END_LATENCY, "shard" => s.clone()),
            breaker_open,
            shard_ready,
            batches_flushed: ::metrics::counter!(BATCHES_FLUSHED, "shard" => s.clone()),
            batches_abandoned: ::metrics::counter!(BATCHES_ABANDONED, "shard" => s.clone()),
            rows_written: ::metrics::counter!(ROWS_WRITTEN, "shard" => s.clone()),
            bytes_written: ::metrics::counter!(BYTES_WRITTEN, "shard" => s.clone()),
            retries: ::metrics::counter!(RETRIES, "shard" => s.clone()),
            possible_duplicates: ::metrics::counter!(POSSIBLE_DUPLICATES, "shard" => s.clone()),
            possible_duplicate_rows: ::metrics::counter!(POSSIBLE_DUPLICATE_ROWS, "shard" => s.clone()),
            backoff_seconds,
            inflight_writes: ::metrics::gauge!(INFLIGHT_WRITES, "shard" => s.clone()),
            queue_depth: ::metrics::gauge!(QUEUE_DEPTH, "shard" => s),
        }
    }
}

/// Counter: payloads polled from lanes.
pub const RECORDS_POLLED: &str = "spate_records_polled_total";
/// Counter: records dropped on purpose, by `reason`: `filter` (a row the
/// encoder's filter refused, [`crate::pipeline::chain::Encoder::keep`]: one
/// per row after fan-out) and `explode_empty` (a message whose fan-out
/// array was empty, so it yields no row: one per message). Their messages
/// still commit (D6: filtered, counted).
pub const RECORDS_FILTERED: &str = "spate_records_filtered_total";

/// Registers the [`RECORDS_FILTERED`] handle of `reason` (once, when a
/// stage is built; never per record).
pub fn records_filtered(reason: &'static str) -> Counter {
    ::metrics::counter!(RECORDS_FILTERED, "reason" => reason)
}
/// Counter: payloads skipped by the `on_error: skip` policy, by `reason`
/// (`decode`, `operator`, `encode`).
pub const RECORDS_SKIPPED: &str = "spate_records_skipped_total";
/// Counter: times a pipeline thread paused its lanes for backpressure.
pub const LANE_PAUSES: &str = "spate_lane_pauses_total";
/// Counter: commits the source refused or failed.
pub const COMMIT_FAILURES: &str = "spate_commit_failures_total";
