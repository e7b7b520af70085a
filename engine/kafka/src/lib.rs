//! spate-kafka: the Kafka source on rdkafka (librdkafka).
//!
//! One consumer per process ([`KafkaSource`]), subscribed to a list of topics
//! or a `^regex`, implements spate-core's source seam: every assigned partition
//! gets its own librdkafka queue, which is a [`KafkaLane`] polled by one
//! pipeline thread and handing out payloads that borrow librdkafka's message
//! memory (zero copy; see `lane.rs`, and `native.rs` for the batch consume).
//!
//! What it guarantees, with the invariants of `docs/DESIGN.md`:
//!
//! - **D1:** offsets are committed only when the controller asks, with the
//!   offsets the checkpoint tracker derived from acknowledged data; auto-commit
//!   and the offset store are owned off ([`OWNED_PROPERTIES`]); on revoke the
//!   rebalance waits until the controller has drained, committed and released
//!   the partition (`source.rs`).
//! - **D2:** lane polls take the caller's timeout (the pipeline passes zero);
//!   backpressure pauses one partition and keeps polling.
//! - Epochs: each assignment of a partition gets a larger epoch than the last
//!   one in this process, so acks of an earlier assignment cannot move a later
//!   one's watermark.
//! - A committed offset outside the partition's valid range is logged at
//!   error level naming topic, partition, offset and range, counted
//!   ([`COMMITTED_OUT_OF_RANGE`]) and handed to the run report with where
//!   librdkafka resets it (`Source::take_offset_resets`); see `offsets.rs`.
//!   The group's committed offsets read there also seed
//!   `spate_committed_offset{topic,partition}` at assignment.
//! - A `^regex` subscription that matches no topic yet waits (INFO line),
//!   a missing plain topic is fatal (`source.rs`, `errors.rs`).
//! - With the `debug` property, librdkafka's debug lines are logged (at
//!   INFO) for the whole run, not only during client creation
//!   (`context.rs`).
//!
//! Cargo features `ssl` (TLS; SASL PLAIN, SCRAM, OAUTHBEARER), `ssl-vendored`
//! and `sasl` (GSSAPI) build librdkafka with OpenSSL or Cyrus SASL; the
//! settings themselves are plain librdkafka properties (the workspace README,
//! "Kafka security", has a config example).
//!
//! - The group's lag as the brokers see it, for every subscribed partition
//!   (`spate_group_lag`, [`LagReader`], `lag.rs`), read by a client and
//!   thread of its own; progress (`spate_last_progress_timestamp_seconds`)
//!   and a join longer than `session.timeout.ms` + [`JOIN_GRACE`] reading
//!   not ready; a close during the first join waits up to
//!   [`JOIN_WAIT_AT_CLOSE`] so the group is left (issue 31).
//!
//! Beside the source: [`KafkaDeadLetter`] (`dead_letter.rs`), the producer
//! behind `on_error.dead_letter`; [`sample`], the non-committing reader of
//! `spate check --sample`; and [`tools`], the helpers of local work and
//! tests (embedded broker, loader, end and committed offsets).
//!
//! What it does not do (yet): a commit in a revoke when the controller is
//! gone (a revoke pending at shutdown is completed without a commit: the
//! controller's final commit precedes it).
//!
//! Tests, all against librdkafka's in-process mock cluster:
//! `tests/it/mock_cluster.rs` runs whole pipelines (volume, rebalances) and the
//! source alone (the rebalance hand-over); `tests/it/mock_faults.rs` a broker
//! down, a stalled sink, eviction, regex subscription, an out-of-range
//! committed offset; `tests/it/mock_metrics.rs` the lag gauge, the
//! committed-offset gauge before the first commit, and the first commit;
//! `tests/it/mock_join.rs` the stop during the first join and the stuck
//! join; `tests/it/mock_report.rs` a pattern matching no topic yet and librdkafka's
//! debug lines after the join; `tests/it/throughput.rs` (ignored) measures lane
//! throughput.
// `unsafe` only in `native.rs`: librdkafka's batch consume (see there why).
#![deny(unsafe_code)]

mod config;
mod context;
mod dead_letter;
mod errors;
mod lag;
mod lane;
mod native;
mod offsets;
pub mod sample;
mod source;
pub mod tools;

pub use config::{ConfigError, DEFAULT_MAX_BATCH, KafkaSourceConfig, OWNED_PROPERTIES};
pub use context::SpateContext;
pub use dead_letter::{
    DEAD_LETTER_DROPPED, DeadLetterError, KafkaDeadLetter, is_connection_property,
};
pub use lag::{
    DEFAULT_LAG_INTERVAL, GROUP_LAG, GROUP_LAG_ERRORS, GROUP_LAG_TOTAL, GROUP_LAG_UPDATED,
    LagReader, LagReading, PartitionLag, lag_client, partition_lag, read_group_lag,
};
pub use lane::{KafkaBatch, KafkaLane};
pub use source::{
    CLOSE_TIMEOUT, COMMIT_TIMEOUT, CONSUMER_ERROR_HOLD, JOIN_GRACE, JOIN_WAIT_AT_CLOSE, KafkaSource,
};

/// Gauge: consumer lag per `topic` and `partition`, in messages: the
/// partition's high watermark minus this group's committed offset, as
/// librdkafka's statistics report it (`consumer_lag`, see librdkafka's
/// [STATISTICS.md](https://github.com/confluentinc/librdkafka/blob/master/STATISTICS.md)).
/// Published every `statistics.interval.ms`, which spate sets to
/// [`DEFAULT_STATISTICS_INTERVAL_MS`] unless the config sets it (`0` turns
/// statistics, and with them the lag, off). While the partition's leader
/// broker is not up the value is the last known one and
/// [`CONSUMER_LAG_STALE`] reads 1.
pub const CONSUMER_LAG: &str = "spate_consumer_lag";

/// Gauge (0/1) per `topic` and `partition`: 1 when the last statistics
/// report found the partition's leader broker not `UP` (or no leader, or the
/// lag unknown, as after a revoke): [`CONSUMER_LAG`] then holds its last
/// known value, not a current one.
pub const CONSUMER_LAG_STALE: &str = "spate_consumer_lag_stale";

/// Gauge per `topic` and `partition`: unix seconds of the last statistics
/// report that refreshed [`CONSUMER_LAG`] from an up leader. `time() -` it
/// is the lag's age; it keeps growing while the brokers are down or
/// statistics stop.
pub const CONSUMER_LAG_UPDATED: &str = "spate_consumer_lag_updated_timestamp_seconds";

/// The `statistics.interval.ms` spate sets when the config does not: the
/// lag series then appear without any setting.
pub const DEFAULT_STATISTICS_INTERVAL_MS: &str = "5000";

/// Counter: consumer errors by `kind` (`transient`: logged and retried by
/// librdkafka; fatal errors stop the pipeline instead of being counted here).
pub const SOURCE_ERRORS: &str = "spate_source_errors_total";

/// Counter: rebalances this process took part in, by `kind`: `assigned`
/// (a rebalance callback handed this consumer at least one partition: the
/// whole assignment under the eager protocol, the added partitions under
/// cooperative-sticky and KIP-848) and `revoked` (one took at least one
/// away, a lost assignment included). See librdkafka's
/// [rebalance callback](https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html)
/// (`rd_kafka_conf_set_rebalance_cb`).
pub const REBALANCES: &str = "spate_consumer_rebalances_total";

/// Gauge: partitions this process owns now (assigned, and not yet released
/// after a revoke).
pub const ASSIGNED_PARTITIONS: &str = "spate_consumer_assigned_partitions";

/// Gauge: partitions this process owns now; the same value as
/// [`ASSIGNED_PARTITIONS`], under the name the readiness text and the
/// progress alert use (issue 31).
pub const ASSIGNED: &str = "spate_assigned_partitions";

/// Gauge: unix seconds of the last progress, a commit that moved some
/// partition's committed offset forward (the start of the run until the
/// first one). `time() -` it, while `spate_group_total_lag > 0`, is how long
/// the group has waited on this process.
pub const LAST_PROGRESS: &str = "spate_last_progress_timestamp_seconds";

/// Registers the `# HELP` text and unit of every series this crate emits
/// (the Prometheus exporter renders them). Call once after installing the
/// recorder.
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_gauge!(
        CONSUMER_LAG,
        Unit::Count,
        "Consumer lag in messages per partition: high watermark minus the group's committed offset, from librdkafka's statistics (see spate_consumer_lag_stale)."
    );
    describe_gauge!(
        CONSUMER_LAG_STALE,
        Unit::Count,
        "1 when the partition's leader broker was not up at the last statistics report: spate_consumer_lag is then its last known value."
    );
    describe_gauge!(
        CONSUMER_LAG_UPDATED,
        Unit::Seconds,
        "Unix time in seconds of the last statistics report that refreshed spate_consumer_lag from an up leader."
    );
    describe_counter!(
        SOURCE_ERRORS,
        Unit::Count,
        "Consumer errors by kind (transient: logged and retried by librdkafka)."
    );
    describe_counter!(
        REBALANCES,
        Unit::Count,
        "Rebalances this process took part in, by kind: assigned (it got partitions), revoked (it lost some)."
    );
    describe_gauge!(
        ASSIGNED_PARTITIONS,
        Unit::Count,
        "Partitions this process owns now."
    );
    describe_gauge!(
        ASSIGNED,
        Unit::Count,
        "Partitions this process owns now (as spate_consumer_assigned_partitions)."
    );
    describe_gauge!(
        LAST_PROGRESS,
        Unit::Seconds,
        "Unix time in seconds of the last commit that moved a committed offset forward (the run's start until the first)."
    );
    describe_gauge!(
        GROUP_LAG,
        Unit::Count,
        "The group's lag per partition from the brokers: log end offset minus the committed offset (from where auto.offset.reset starts when none), for every subscribed partition, assigned here or not, paused or not."
    );
    describe_gauge!(
        GROUP_LAG_TOTAL,
        Unit::Count,
        "spate_group_lag summed over every subscribed partition."
    );
    describe_gauge!(
        GROUP_LAG_UPDATED,
        Unit::Seconds,
        "Unix time in seconds of the last complete spate_group_lag reading."
    );
    describe_counter!(
        GROUP_LAG_ERRORS,
        Unit::Count,
        "Group lag readings that failed (the gauges keep their last values)."
    );
    describe_counter!(
        COMMITTED_OUT_OF_RANGE,
        Unit::Count,
        "Committed offsets found outside the partition's valid range at assignment (librdkafka resets them per auto.offset.reset)."
    );
}

/// Counter: committed offsets found outside their partition's valid range
/// `[low watermark, high watermark]` when the partition was assigned, per
/// `topic` and `partition`. librdkafka then resets the partition per
/// `auto.offset.reset` (re-reading or skipping data), so any increase wants an
/// operator's look; each one is also logged at error level with the offsets.
pub const COMMITTED_OUT_OF_RANGE: &str = "spate_committed_offset_out_of_range_total";
