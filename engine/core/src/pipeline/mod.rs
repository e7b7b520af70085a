//! The pipeline runtime: the chain, lanes on pipeline threads with
//! pause-and-keep-polling backpressure, and the controller for start,
//! rebalance and shutdown.
//!
//! - [`chain`]: decoder, operators (filter, map, flat_map), encoder and router
//!   traits.
//! - [`terminal`]: the terminal stage and its per-thread chunk buffers.
//! - [`driver`]: what a pipeline thread does with its lanes (D2, D6).
//! - [`lines`]: the NDJSON decoder, one record per line of a message (D1).
//! - `controller`: assignment, revoke drain, commits, shutdown (D1, D5).
//! - [`Pipeline`]: the builder-made runnable, in thread mode (service) or in
//!   one-thread mode (simulator, tests; D7).
//! - [`wait_for_signal`], [`trigger_on_signal`]: SIGINT and SIGTERM, for
//!   the runner and the binary alike.
//!
//! Test doubles for users' pipelines (a scripted source, a capture writer)
//! live in the dev-only `spate-testkit` crate (`engine/testkit`).

pub mod chain;
mod controller;
pub mod driver;
mod eo;
pub mod lines;
mod readiness;
mod runner;
mod signal;
pub mod terminal;
mod threads;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

pub use readiness::{REASON_REFRESH, Readiness, STATUS_REFRESH};
pub use runner::{Pipeline, PipelineBuilder};
pub use signal::{trigger_on_signal, wait_for_signal};

use crate::checkpoint::FailedBatch;
use crate::pipeline::chain::RecordError;
use crate::pipeline::terminal::ChunkConfig;
use crate::record::{Offset, Payload, TopicPartition};
use crate::sink::{ConfigError, DrainReport, SinkConfig};
use crate::source::{CommitOffset, OffsetReset, SourceError};

/// Smallest `pipeline.idle_poll`: below it an idle thread spins.
pub const IDLE_POLL_MIN: Duration = Duration::from_micros(100);

/// Largest `pipeline.idle_poll` and `pipeline.idle_poll_max`: data arriving
/// at an idle pipeline waits at most this long to be polled.
pub const IDLE_POLL_MAX_LIMIT: Duration = Duration::from_secs(1);

/// Sleep lengths for consecutive idle rounds of a polling loop: `first`, then
/// doubling up to `max`; a busy round starts over from `first`.
///
/// Why: a pipeline thread polls its lanes without blocking (D2), so an idle
/// service pays a sweep of every lane per sleep. At a fixed 1 ms that was
/// about 6% of a core per idle `spate run` (two threads and the
/// controller); backing off to 10 ms keeps the first reaction to new data at
/// 1 ms and bounds the slowest at `max`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdleBackoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl IdleBackoff {
    /// Starts at `first`; `max` below `first` is taken as `first`.
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
            next: first,
        }
    }

    /// A round found work: the next idle sleep is `first` again.
    pub(crate) fn busy(&mut self) {
        self.next = self.first;
    }

    /// A round found nothing: how long to sleep now.
    pub(crate) fn idle(&mut self) -> Duration {
        let now = self.next;
        self.next = now.saturating_mul(2).min(self.max);
        now
    }
}

/// What to do with a record the chain refuses (D6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// Count it by reason, hand it to the dead-letter hook if any, go on.
    Skip,
    /// Fail its ack (nothing at or past it is committed) and stop the pipeline.
    Fail,
}

/// The delivery guarantee (`pipeline.delivery`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// `at_least_once` (the default): nothing is lost (D1); a crash or a
    /// rebalance re-reads rows into new batches with new tokens, so they may
    /// land twice.
    #[default]
    AtLeastOnce,
    /// `effectively_once`: every batch is one partition's contiguous offset
    /// range for one shard, recorded in the partition's commit metadata
    /// before it is written and re-formed identically on replay, with a
    /// nonce-free token ([`crate::sink::range_token`]), so the server's
    /// dedup window drops a replay (D9). Holds while the replay falls inside
    /// the table's dedup window; see docs/adr/0004-effectively-once.md.
    EffectivelyOnce,
}

impl Delivery {
    /// The YAML spelling: `at_least_once` or `effectively_once`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::AtLeastOnce => "at_least_once",
            Delivery::EffectivelyOnce => "effectively_once",
        }
    }
}

/// Receives skipped records (original bytes, partition, offset and the reason),
/// for example to produce them to a dead-letter topic. Called on the pipeline
/// thread: must not block (D2); queue and return.
pub trait DeadLetter: Send + Sync {
    /// Takes one skipped record.
    fn dead_letter(&self, payload: &Payload<'_>, error: &RecordError);
}

/// Default `checkpoint.interval`: how often watermarks are committed.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);
/// Default `rebalance.drain_timeout`: how long a revoke waits for acks.
pub const DEFAULT_REBALANCE_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `shutdown.drain_timeout`: how long shutdown drains (D5).
pub const DEFAULT_SHUTDOWN_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Pipeline settings besides the sink's.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// OS threads polling lanes in thread mode (`pipeline.threads`, > 0).
    pub threads: usize,
    /// How often the controller commits the watermarks
    /// (`checkpoint.interval`, > 0).
    pub checkpoint_interval: Duration,
    /// How long a revoke waits for the revoked lanes' acks before committing
    /// what settled (`rebalance.drain_timeout`).
    pub rebalance_drain_timeout: Duration,
    /// How long shutdown lets in-flight data finish (`shutdown.drain_timeout`).
    pub shutdown_drain_timeout: Duration,
    /// Record error policy (`on_error`).
    pub on_error: OnError,
    /// Chunk sealing thresholds.
    pub chunk: ChunkConfig,
    /// In-flight byte budget (`sink.inflight.max_bytes`, > 0, D8).
    pub budget_bytes: u64,
    /// In-flight row budget (`sink.inflight.max_rows`, > 0, D8).
    pub budget_rows: u64,
    /// How long an idle pipeline thread (or the controller) sleeps after a
    /// round in which nothing arrived (`pipeline.idle_poll`, > 0). Each further
    /// idle round in a row doubles the sleep, up to [`Self::idle_poll_max`];
    /// a busy round starts over from this.
    pub idle_poll: Duration,
    /// The longest idle sleep (`pipeline.idle_poll_max`, at least
    /// `idle_poll`): the most a record arriving at an idle pipeline waits
    /// before a thread polls it, and how late a thread paused by a full
    /// in-flight budget (D8) can notice the budget freed. An idle service
    /// costs about one lane sweep per thread per `idle_poll_max`.
    pub idle_poll_max: Duration,
    /// Bound on each replica probe at start.
    pub probe_timeout: Duration,
    /// The sink pool's settings.
    pub sink: SinkConfig,
    /// The delivery guarantee (`pipeline.delivery`, default
    /// [`Delivery::AtLeastOnce`]).
    pub delivery: Delivery,
    /// The sink table as `database.table`: part of every range token in
    /// [`Delivery::EffectivelyOnce`] (required there, unused otherwise).
    pub table: String,
}

impl PipelineConfig {
    /// Defaults around `sink`: 1 thread, commit every 5 s, 10 s revoke drain,
    /// 30 s shutdown drain, Fail policy, 256 MiB / 4 M rows budget, 1 ms idle
    /// poll backing off to 10 ms, 5 s probe timeout.
    pub fn new(sink: SinkConfig) -> Self {
        Self {
            threads: 1,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            rebalance_drain_timeout: DEFAULT_REBALANCE_DRAIN_TIMEOUT,
            shutdown_drain_timeout: DEFAULT_SHUTDOWN_DRAIN_TIMEOUT,
            on_error: OnError::Fail,
            chunk: ChunkConfig::default(),
            budget_bytes: 256 << 20,
            budget_rows: 4 << 20,
            idle_poll: Duration::from_millis(1),
            idle_poll_max: Duration::from_millis(10),
            probe_timeout: Duration::from_secs(5),
            sink,
            delivery: Delivery::AtLeastOnce,
            table: String::new(),
        }
    }

    /// Checks every setting, the sink's included.
    ///
    /// # Errors
    /// The first invalid setting, naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |key: &str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::Invalid {
                    key: key.to_owned(),
                    reason: "must be greater than 0".into(),
                })
            }
        };
        positive("pipeline.threads", self.threads > 0)?;
        positive("checkpoint.interval", !self.checkpoint_interval.is_zero())?;
        positive("pipeline.chunk_bytes", self.chunk.max_bytes > 0)?;
        positive("pipeline.chunk_rows", self.chunk.max_rows > 0)?;
        positive("sink.inflight.max_bytes", self.budget_bytes > 0)?;
        positive("sink.inflight.max_rows", self.budget_rows > 0)?;
        let (first, max) = (self.idle_poll, self.idle_poll_max);
        if first < IDLE_POLL_MIN || first > IDLE_POLL_MAX_LIMIT {
            return Err(ConfigError::Invalid {
                key: "pipeline.idle_poll".to_owned(),
                reason: format!(
                    "{first:?} is outside {IDLE_POLL_MIN:?}..={IDLE_POLL_MAX_LIMIT:?} \
                     (shorter spins a core; longer leaves new data unread that long)"
                ),
            });
        }
        if max < first || max > IDLE_POLL_MAX_LIMIT {
            return Err(ConfigError::Invalid {
                key: "pipeline.idle_poll_max".to_owned(),
                reason: format!(
                    "{max:?} is outside pipeline.idle_poll ({first:?})..={IDLE_POLL_MAX_LIMIT:?}"
                ),
            });
        }
        if self.delivery == Delivery::EffectivelyOnce && self.table.is_empty() {
            return Err(ConfigError::Invalid {
                key: "pipeline.delivery".to_owned(),
                reason: "effectively_once needs the sink table (PipelineConfig.table, \
                         `database.table`): it is part of every range token"
                    .into(),
            });
        }
        self.sink.validate().map(|_| ())
    }
}

/// Errors that stop a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A record was refused under `on_error: fail`.
    #[error("record {partition} offset {offset} refused (on_error: fail): {error}")]
    RecordFailed {
        /// Its partition.
        partition: TopicPartition,
        /// Its offset.
        offset: Offset,
        /// Why.
        error: RecordError,
    },
    /// The source failed fatally.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// `delivery: effectively_once`: a partition's commit metadata is not a
    /// range list spate can read, so its recorded batches are unknown (D9).
    #[error("partition {partition}: {error}")]
    RangeMetadata {
        /// The partition whose metadata it is.
        partition: TopicPartition,
        /// Why it cannot be read.
        error: crate::checkpoint::ranges::RangesError,
    },
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A shard had no replica answering the start-up probe.
    #[error("no replica of shard {shard} answered the probe: {errors}")]
    Probe {
        /// The shard.
        shard: usize,
        /// Every replica's error, joined.
        errors: String,
    },
    /// Batches were abandoned or failed: their partitions stopped committing.
    #[error("{} partition(s) stopped committing at a failed batch (first: {})", .0.len(),
        .0.first().map(|f| format!("{} offset {}", f.partition, f.first)).unwrap_or_default())]
    AcksFailed(Vec<FailedBatch>),
    /// A pipeline thread panicked or could not start.
    #[error("pipeline thread: {0}")]
    Thread(String),
}

/// How a run ended, as a process exit status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// Everything polled was delivered, filtered or skipped by policy, and
    /// committed. Exit code 0.
    Clean,
    /// Shutdown left data unwritten (drain deadline, abandoned batches): a
    /// partition's commits stopped in front of it, so it replays on the next
    /// start. Exit code 2.
    Abandoned,
    /// The pipeline stopped on an error (record failure, source, sink, probe).
    /// Exit code 3.
    Failed,
    /// Everything read was delivered and committed as for [`Self::Clean`],
    /// but a committed offset was out of range and the source reset it
    /// ([`RunReport::offset_resets`] names each): data was skipped (deleted
    /// by retention before it was read) or read again. Not spate's loss, but
    /// an operator must look: exit code 4.
    OffsetReset,
}

impl ExitStatus {
    /// The process exit code: 0, 2 or 3.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Clean => 0,
            ExitStatus::Abandoned => 2,
            ExitStatus::Failed => 3,
            ExitStatus::OffsetReset => 4,
        }
    }
}

/// What a run did, returned when it ends.
#[derive(Debug)]
pub struct RunReport {
    /// Payloads polled.
    pub polled: u64,
    /// Rows encoded.
    pub rows_encoded: u64,
    /// Payloads skipped by policy.
    pub skipped: u64,
    /// Payloads that failed under the Fail policy.
    pub failed_records: u64,
    /// Lane polls made.
    pub polls: u64,
    /// The sink pool's totals.
    pub sink: DrainReport,
    /// The last offset committed per partition (and epoch).
    pub committed: Vec<CommitOffset>,
    /// Partitions frozen at a failed batch.
    pub frozen: Vec<FailedBatch>,
    /// Committed offsets the source found out of range and reset.
    pub offset_resets: Vec<OffsetReset>,
    /// The error that stopped the run, if any.
    pub error: Option<PipelineError>,
    /// The exit status.
    pub status: ExitStatus,
}

impl RunReport {
    /// A one-line summary for logs. `committed_by_this_run` lists the
    /// offsets this run committed; a partition it committed nothing for
    /// keeps what the group had before (not shown).
    pub fn summary(&self) -> String {
        let committed: Vec<String> = self
            .committed
            .iter()
            .map(|c| format!("{}={}", c.partition, c.offset))
            .collect();
        let resets = if self.offset_resets.is_empty() {
            String::new()
        } else {
            let each: Vec<String> = self.offset_resets.iter().map(ToString::to_string).collect();
            format!(" offset_resets=[{}]", each.join("; "))
        };
        // A stop at a failed batch names the sink's reason (the server's
        // code and text), as a record failure names its column.
        let cause = match (&self.error, self.status) {
            (Some(PipelineError::AcksFailed(_)), _) | (None, ExitStatus::Abandoned) => self
                .sink
                .first_abandon_cause()
                .map(|(shard, why)| format!(" cause: shard {shard}: {why}"))
                .unwrap_or_default(),
            _ => String::new(),
        };
        format!(
            "status={:?} polled={} rows={} skipped={} delivered_rows={} abandoned_rows={} committed_by_this_run=[{}]{resets}{}{cause}",
            self.status,
            self.polled,
            self.rows_encoded,
            self.skipped,
            self.sink.rows_flushed(),
            self.sink.rows_abandoned(),
            committed.join(","),
            self.error
                .as_ref()
                .map(|e| format!(" error: {e}"))
                .unwrap_or_default()
        )
    }
}

/// Asks a running pipeline to shut down; cloneable, callable from anywhere.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    inner: Arc<(AtomicBool, Notify)>,
}

impl Shutdown {
    /// A signal not yet triggered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests shutdown. Idempotent.
    pub fn trigger(&self) {
        self.inner.0.store(true, Ordering::Release);
        self.inner.1.notify_waiters();
    }

    /// Whether shutdown was requested.
    pub fn is_triggered(&self) -> bool {
        self.inner.0.load(Ordering::Acquire)
    }

    /// Resolves once shutdown is requested.
    pub async fn wait(&self) {
        loop {
            let notified = self.inner.1.notified();
            if self.is_triggered() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(status: ExitStatus, error: Option<PipelineError>) -> RunReport {
        RunReport {
            polled: 10,
            rows_encoded: 10,
            skipped: 0,
            failed_records: 0,
            polls: 1,
            sink: DrainReport::default(),
            committed: Vec::new(),
            frozen: Vec::new(),
            offset_resets: Vec::new(),
            error,
            status,
        }
    }

    /// Issue 19: a stop at a failed batch names the sink's reason.
    #[test]
    fn the_summary_of_a_sink_failure_names_its_cause() {
        let failed = FailedBatch {
            partition: TopicPartition::new("t", 3),
            epoch: 1,
            seq: 0,
            first: 17,
        };
        let mut r = report(
            ExitStatus::Failed,
            Some(PipelineError::AcksFailed(vec![failed])),
        );
        r.sink.shards = vec![
            crate::sink::ShardReport::default(),
            crate::sink::ShardReport {
                shard: 1,
                batches_abandoned: 1,
                first_abandon_cause: Some("fatal write error: ClickHouse code 60: no table".into()),
                ..Default::default()
            },
        ];
        let s = r.summary();
        assert!(
            s.ends_with(
                "error: 1 partition(s) stopped committing at a failed batch (first: t/3 offset 17) \
                 cause: shard 1: fatal write error: ClickHouse code 60: no table"
            ),
            "{s}"
        );
        // A record failure names its own cause; no sink cause is added.
        r.error = Some(PipelineError::Thread("x".into()));
        assert!(!r.summary().contains("cause:"), "{}", r.summary());
    }

    /// Issue 19: an out-of-range committed offset is named, and the status
    /// (exit 4) says it.
    #[test]
    fn the_summary_names_offset_resets() {
        let mut r = report(ExitStatus::OffsetReset, None);
        r.offset_resets = vec![
            OffsetReset {
                partition: TopicPartition::new("t", 0),
                committed: 3,
                low: 40,
                high: 90,
                reset_to: Some(40),
                policy: "auto.offset.reset=earliest".into(),
            },
            OffsetReset {
                partition: TopicPartition::new("t", 1),
                committed: 500,
                low: 0,
                high: 20,
                reset_to: None,
                policy: "auto.offset.reset=error".into(),
            },
        ];
        let s = r.summary();
        assert!(s.starts_with("status=OffsetReset "), "{s}");
        assert!(
            s.ends_with(
                "offset_resets=[t/0 committed 3 outside [40, 90] (below the low watermark: data \
                 deleted before it was read): reset to 40 (auto.offset.reset=earliest); t/1 \
                 committed 500 outside [0, 20] (beyond the log end): not reset \
                 (auto.offset.reset=error)]"
            ),
            "{s}"
        );
        assert_eq!(ExitStatus::OffsetReset.code(), 4);
    }

    #[test]
    fn idle_backoff_doubles_to_its_cap_and_a_busy_round_resets_it() {
        let ms = Duration::from_millis;
        let mut b = IdleBackoff::new(ms(1), ms(10));
        let slept: Vec<_> = (0..6).map(|_| b.idle()).collect();
        assert_eq!(slept, [ms(1), ms(2), ms(4), ms(8), ms(10), ms(10)]);
        b.busy();
        assert_eq!(
            b.idle(),
            ms(1),
            "new data must be polled again within idle_poll"
        );
        assert_eq!(b.idle(), ms(2));
    }

    #[test]
    fn idle_backoff_with_cap_below_first_stays_at_first() {
        let ms = Duration::from_millis;
        let mut b = IdleBackoff::new(ms(5), ms(1));
        assert_eq!([b.idle(), b.idle()], [ms(5), ms(5)]);
    }

    #[test]
    fn idle_polls_out_of_range_are_refused_by_key() {
        let ms = Duration::from_millis;
        let cases = [
            (ms(5), ms(2), "pipeline.idle_poll_max"),
            (ms(1), ms(0), "pipeline.idle_poll_max"),
            (ms(1), ms(1001), "pipeline.idle_poll_max"),
            (Duration::ZERO, ms(10), "pipeline.idle_poll"),
            (Duration::from_nanos(10), ms(10), "pipeline.idle_poll"),
            (ms(1001), ms(2000), "pipeline.idle_poll"),
        ];
        for (first, max, key) in cases {
            let mut c = PipelineConfig::new(SinkConfig::new("p", vec![vec!["http://a".into()]]));
            (c.idle_poll, c.idle_poll_max) = (first, max);
            let err = c.validate().expect_err("out of range").to_string();
            assert!(
                err.contains(&format!("`{key}`")),
                "{first:?} {max:?}: {err}"
            );
        }
        let mut c = PipelineConfig::new(SinkConfig::new("p", vec![vec!["http://a".into()]]));
        (c.idle_poll, c.idle_poll_max) = (IDLE_POLL_MIN, IDLE_POLL_MAX_LIMIT);
        assert!(c.validate().is_ok(), "the bounds themselves are allowed");
    }
}
