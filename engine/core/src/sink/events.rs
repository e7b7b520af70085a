//! A shard's state and the things that happen to it, one method per event.
//!
//! [`ShardShared`] is what a shard's worker, its write tasks and the pool
//! share: the shard's endpoints, its replica set, its metric handles and the
//! counters the drain report is made of. Each event a worker reports (a batch
//! flushed, a retry, an abandon, ...) is one method here that updates the
//! report's counter, the metric and the log line together, so every
//! consequence of "a retry happened" is found in one function and the drain
//! report (D6) and the metrics cannot drift apart.
//!
//! Hot paths: the metric handles are registered once per shard
//! ([`ShardMetrics::register`]) and only incremented here; an event takes no
//! lock but the abandon cause's, written once per run (an abandon ends it).
//! The pipeline threads' events ([`ShardShared::enqueued`],
//! [`ShardShared::dropped`]) touch one atomic each.
//!
//! Not here: deciding when an event happens (the worker does, in
//! `worker.rs`), and the pool's per-shard totals over all shards
//! (`DrainReport` in `pool.rs`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinError;
use tokio::time::Instant;

use crate::metrics::{Gauge, ShardMetrics};
use crate::sink::{Endpoint, ReplicaSet, SealedBatch, WriteError};

/// One shard's totals over the pool's life, as reported by
/// [`SinkPool::drain`](crate::sink::SinkPool::drain).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardReport {
    /// Shard index.
    pub shard: usize,
    /// Batches written and acknowledged.
    pub batches_flushed: u64,
    /// Rows written and acknowledged.
    pub rows_flushed: u64,
    /// Bytes written and acknowledged.
    pub bytes_flushed: u64,
    /// Batches given up on (their acks failed).
    pub batches_abandoned: u64,
    /// Rows bound for the shard and never acknowledged (their acks failed):
    /// queued and not written, or dropped by a pipeline thread before they
    /// could be queued.
    pub rows_abandoned: u64,
    /// Write attempts after the first.
    pub retries: u64,
    /// Extra copies of batches that may be in the table: for each batch, the
    /// attempts whose outcome is unknown (timed out, or the connection lost
    /// after sending). On a server that ignores the dedup token (plain
    /// MergeTree) an acknowledged batch with `k` of them may be stored up to
    /// `k + 1` times; an abandoned one up to `k` times.
    pub possible_duplicates: u64,
    /// The rows of those extra copies (each copy counts its batch's rows).
    pub possible_duplicate_rows: u64,
    /// Whether the worker ignored the deadline and was aborted after the grace.
    pub forced_abort: bool,
    /// Why the shard's first batch was abandoned: the last error of its
    /// write (the server's code and text, the endpoint, how many attempts),
    /// or the drain deadline. `None` when nothing was abandoned.
    pub first_abandon_cause: Option<String>,
}

/// Why a batch was given up on.
pub(crate) enum Abandon {
    /// The error cannot succeed on a retry.
    Fatal(WriteError),
    /// `sink.retry.max_attempts` failures in a row.
    Exhausted(WriteError),
}

/// Counters for the drain report; atomics so a report can be made even for
/// a worker that had to be aborted. Written only by [`ShardShared`]'s event
/// methods.
#[derive(Debug, Default)]
struct ShardStats {
    rows_enqueued: AtomicU64,
    /// Rows for this shard a pipeline thread dropped before queueing them.
    rows_dropped: AtomicU64,
    batches_flushed: AtomicU64,
    rows_flushed: AtomicU64,
    bytes_flushed: AtomicU64,
    batches_abandoned: AtomicU64,
    retries: AtomicU64,
    possible_duplicates: AtomicU64,
    possible_duplicate_rows: AtomicU64,
    /// Why the shard's first batch was abandoned (the run report's cause).
    /// Written once, off the hot path (an abandon is the end of a run).
    first_abandon: Mutex<Option<String>>,
}

/// State shared by a shard's worker, its write tasks and the pool, and the
/// events they report.
#[derive(Debug)]
pub(crate) struct ShardShared {
    pub(crate) shard: usize,
    pub(crate) endpoints: Vec<Endpoint>,
    /// Rotation and breakers. A std mutex held only for a pick or an update,
    /// never across an await, and never touched by pipeline threads.
    pub(crate) replicas: Mutex<ReplicaSet>,
    metrics: ShardMetrics,
    stats: ShardStats,
    /// Backoff being slept now, in nanoseconds, summed over the shard's
    /// writes: the gauge is set from this integer under the lock, so it
    /// reads exactly 0 when no write sleeps (adding and subtracting floats
    /// left residues such as 2.77e-17). Taken only when a backoff starts or
    /// ends.
    backoff_nanos: Mutex<u64>,
    /// The last failure of each replica (endpoint order), for the
    /// not-ready reason; cleared by a success. Written only on a failed or
    /// first successful attempt after a failure.
    last_errors: Mutex<Vec<Option<String>>>,
}

impl ShardShared {
    /// The state of shard `shard` writing to `endpoints` through `replicas`;
    /// registers the shard's metric handles.
    pub(crate) fn new(shard: usize, endpoints: Vec<Endpoint>, replicas: ReplicaSet) -> Self {
        let n = endpoints.len();
        Self {
            shard,
            endpoints,
            replicas: Mutex::new(replicas),
            metrics: ShardMetrics::register(shard, n),
            stats: ShardStats::default(),
            backoff_nanos: Mutex::new(0),
            last_errors: Mutex::new(vec![None; n]),
        }
    }

    /// A write to `replica` succeeded: its breaker closes (and its gauge
    /// and the shard's readiness follow).
    pub(crate) fn replica_succeeded(&self, replica: usize) {
        let mut set = self.replicas.lock().expect("replica set lock");
        let was_tripped = set.is_tripped(replica);
        set.success(replica);
        if was_tripped {
            self.publish_breakers(&set);
        }
        drop(set);
        let mut errors = self
            .last_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        errors[replica] = None;
    }

    /// A write to `replica` failed at `now` with `err`: counts against its
    /// breaker; the error is kept for the not-ready reason.
    pub(crate) fn replica_failed(&self, replica: usize, now: Instant, err: &WriteError) {
        let mut set = self.replicas.lock().expect("replica set lock");
        let was_tripped = set.is_tripped(replica);
        set.failure(replica, now);
        if !was_tripped && set.is_tripped(replica) {
            self.publish_breakers(&set);
        }
        drop(set);
        let mut errors = self
            .last_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        errors[replica] = Some(err.to_string());
    }

    /// The replicas whose breaker tripped (see `ReplicaSet::is_tripped`).
    pub(crate) fn tripped_replicas(&self) -> Vec<usize> {
        let set = self.replicas.lock().expect("replica set lock");
        (0..self.endpoints.len())
            .filter(|&r| set.is_tripped(r))
            .collect()
    }

    /// Sets every breaker gauge and the shard's readiness gauge from `set`.
    fn publish_breakers(&self, set: &ReplicaSet) {
        let mut any_closed = false;
        for (r, g) in self.metrics.breaker_open.iter().enumerate() {
            let tripped = set.is_tripped(r);
            any_closed |= !tripped;
            g.set(if tripped { 1.0 } else { 0.0 });
        }
        self.metrics
            .shard_ready
            .set(if any_closed { 1.0 } else { 0.0 });
    }

    /// Whether the shard has a replica whose breaker is closed
    /// ([`ReplicaSet::is_tripped`]): what readiness requires of it.
    pub(crate) fn healthy(&self) -> bool {
        let set = self.replicas.lock().expect("replica set lock");
        (0..self.endpoints.len()).any(|r| !set.is_tripped(r))
    }

    /// Why the shard is not healthy, naming each replica and its last
    /// error, e.g. `shard 1: every replica's breaker open (r0
    /// http://..: connection refused)`; `None` when it is healthy.
    pub(crate) fn unhealthy_reason(&self) -> Option<String> {
        if self.healthy() {
            return None;
        }
        let errors = self
            .last_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let replicas: Vec<String> = self
            .endpoints
            .iter()
            .zip(errors.iter())
            .map(|(e, err)| {
                format!(
                    "r{} {}: {}",
                    e.replica,
                    e.url,
                    err.as_deref().unwrap_or("no error recorded")
                )
            })
            .collect();
        Some(format!(
            "shard {}: every replica's breaker open ({})",
            self.shard,
            replicas.join("; ")
        ))
    }

    /// A pipeline thread queued `rows` rows for the shard.
    #[inline]
    pub(crate) fn enqueued(&self, rows: u64) {
        self.stats.rows_enqueued.fetch_add(rows, Ordering::Relaxed);
    }

    /// A pipeline thread dropped `rows` rows bound for the shard without
    /// queueing them; their acks failed (the report counts them abandoned).
    pub(crate) fn dropped(&self, rows: u64) {
        self.stats.rows_dropped.fetch_add(rows, Ordering::Relaxed);
    }

    /// The worker's queue holds `chunks` chunks.
    pub(crate) fn queue_depth(&self, chunks: usize) {
        self.metrics.queue_depth.set(chunks as f64);
    }

    /// A write of one batch is in flight for as long as the guard lives
    /// (also when its task is aborted).
    pub(crate) fn write_in_flight(&self) -> GaugeGuard<'_> {
        GaugeGuard::new(&self.metrics.inflight_writes, 1.0)
    }

    /// A write sleeps `delay` before its next attempt, for as long as the
    /// guard lives.
    pub(crate) fn backing_off(&self, delay: Duration) -> BackoffGuard<'_> {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.adjust_backoff(|total| total.saturating_add(nanos));
        BackoffGuard { shard: self, nanos }
    }

    /// Applies `f` to the backoff total and sets the gauge from the result
    /// under the lock (so concurrent writes cannot leave it stale).
    fn adjust_backoff(&self, f: impl FnOnce(u64) -> u64) {
        let mut total = self
            .backoff_nanos
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *total = f(*total);
        self.metrics
            .backoff_seconds
            .set(backoff_gauge_value(*total));
    }

    /// `batch` was acknowledged by a replica, after `ambiguous` attempts
    /// whose outcome is unknown (each may have landed: possible duplicates).
    /// `started` is when its first attempt began, `oldest_ms` the Kafka
    /// timestamp its end-to-end latency counts from
    /// ([`crate::ack::AckSet::oldest_timestamp_ms`]). One record per
    /// histogram per batch.
    pub(crate) fn flushed(
        &self,
        batch: &SealedBatch,
        ambiguous: u64,
        started: Instant,
        oldest_ms: Option<i64>,
    ) {
        let (st, m) = (&self.stats, &self.metrics);
        m.insert_duration.record(started.elapsed().as_secs_f64());
        m.batch_rows.record(batch.rows() as f64);
        m.batch_bytes.record(batch.bytes() as f64);
        if let (Some(ts), Some(clock)) = (oldest_ms, crate::metrics::wall_clock()) {
            // A producer clock ahead of ours reads as 0, not negative.
            m.end_to_end.record((clock() - ts).max(0) as f64 / 1000.0);
        }
        st.batches_flushed.fetch_add(1, Ordering::Relaxed);
        st.rows_flushed.fetch_add(batch.rows(), Ordering::Relaxed);
        st.bytes_flushed.fetch_add(batch.bytes(), Ordering::Relaxed);
        m.batches_flushed.increment(1);
        m.rows_written.increment(batch.rows());
        m.bytes_written.increment(batch.bytes());
        if ambiguous > 0 {
            self.possible_duplicates(
                batch,
                ambiguous,
                format_args!(
                    "batch acknowledged after {ambiguous} attempt(s) whose outcome is unknown \
                     (timed out or cut off after sending): where the server ignores the dedup \
                     token (plain MergeTree), its rows may be in the table up to {} times",
                    ambiguous + 1
                ),
            );
        }
    }

    /// Attempt `attempt` of `batch` on `endpoint` failed with `err`; the
    /// same batch is tried again after `delay`.
    pub(crate) fn retried(
        &self,
        endpoint: &Endpoint,
        batch: &SealedBatch,
        attempt: u32,
        delay: Duration,
        err: &WriteError,
    ) {
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
        self.metrics.retries.increment(1);
        tracing::warn!(
            %endpoint, token = batch.token(), attempt, backoff_ms = delay.as_millis() as u64,
            error = %err, "insert failed; retrying the same batch"
        );
    }

    /// `endpoint` still runs an earlier attempt of `batch` (the `waits`-th
    /// such answer in a row): asked again after `delay`. Not a failure, so
    /// nothing is counted.
    pub(crate) fn still_running(
        &self,
        endpoint: &Endpoint,
        batch: &SealedBatch,
        waits: u32,
        delay: Duration,
        err: &WriteError,
    ) {
        tracing::warn!(
            %endpoint, token = batch.token(), wait = waits, backoff_ms = delay.as_millis() as u64,
            error = %err, "an earlier attempt of this batch still runs on the replica; waiting"
        );
    }

    /// The table changed under `old`'s layout (`replanned` says how) and
    /// the writer re-sealed it as `new`, which the write goes on with. Not a
    /// failure: nothing is counted.
    pub(crate) fn resealed(&self, old: &SealedBatch, new: &SealedBatch, replanned: &WriteError) {
        tracing::info!(
            shard = self.shard,
            token = old.token(),
            rows = old.rows(),
            from_layout = old.layout(),
            to_layout = new.layout(),
            reason = %replanned.message,
            "batch re-sealed under the table's new columns; writing the re-sealed batch"
        );
    }

    /// `batch` was given up on after `failures` failed attempts, `ambiguous`
    /// of them with an unknown outcome. Its acks fail when the caller drops
    /// them (D1).
    pub(crate) fn abandoned(
        &self,
        batch: &SealedBatch,
        reason: &Abandon,
        failures: u32,
        ambiguous: u64,
    ) {
        self.stats.batches_abandoned.fetch_add(1, Ordering::Relaxed);
        self.metrics.batches_abandoned.increment(1);
        let (why, err) = match reason {
            Abandon::Fatal(e) => ("fatal error", e),
            Abandon::Exhausted(e) => ("attempts exhausted", e),
        };
        self.note_abandon(|| format!("{err} ({why} after {failures} attempt(s))"));
        tracing::error!(
            shard = self.shard, token = batch.token(), rows = batch.rows(),
            attempts = failures, ranges = ?batch.ranges(), error = %err,
            "batch abandoned ({why}); its acks fail and its partitions stop committing"
        );
        if ambiguous > 0 {
            // Not acknowledged, yet it may have landed: a later run
            // rereads it and adds one more copy.
            self.possible_duplicates(
                batch,
                ambiguous,
                format_args!(
                    "the abandoned batch may be in the table up to {ambiguous} times already \
                     (attempts whose outcome is unknown); a run that rereads it adds one more \
                     copy where the server ignores the dedup token"
                ),
            );
        }
    }

    /// A write task panicked: it dropped its batch's acks, which failed
    /// (D1). Counted like any abandoned batch (D6).
    pub(crate) fn write_task_failed(&self, e: &JoinError) {
        self.stats.batches_abandoned.fetch_add(1, Ordering::Relaxed);
        self.metrics.batches_abandoned.increment(1);
        self.note_abandon(|| format!("a write task failed: {e}"));
        tracing::error!(shard = self.shard, error = %e, "write task failed; batch abandoned");
    }

    /// The drain deadline passed with `batches` batches not written (D5);
    /// their acks failed. Nothing is recorded for `batches == 0`.
    pub(crate) fn abandoned_at_deadline(&self, batches: u64) {
        if batches == 0 {
            return;
        }
        self.stats
            .batches_abandoned
            .fetch_add(batches, Ordering::Relaxed);
        self.metrics.batches_abandoned.increment(batches);
        self.note_abandon(|| {
            format!("shutdown.drain_timeout passed with {batches} batch(es) not written")
        });
        tracing::error!(
            shard = self.shard,
            batches,
            "drain deadline reached; batches not written were abandoned and their acks failed"
        );
    }

    /// The shard's totals; `forced_abort` when the pool aborted its worker
    /// after the drain grace.
    pub(crate) fn report(&self, forced_abort: bool) -> ShardReport {
        let st = &self.stats;
        let enqueued =
            st.rows_enqueued.load(Ordering::Relaxed) + st.rows_dropped.load(Ordering::Relaxed);
        let rows_flushed = st.rows_flushed.load(Ordering::Relaxed);
        ShardReport {
            shard: self.shard,
            batches_flushed: st.batches_flushed.load(Ordering::Relaxed),
            rows_flushed,
            bytes_flushed: st.bytes_flushed.load(Ordering::Relaxed),
            batches_abandoned: st.batches_abandoned.load(Ordering::Relaxed),
            rows_abandoned: enqueued.saturating_sub(rows_flushed),
            retries: st.retries.load(Ordering::Relaxed),
            possible_duplicates: st.possible_duplicates.load(Ordering::Relaxed),
            possible_duplicate_rows: st.possible_duplicate_rows.load(Ordering::Relaxed),
            forced_abort,
            first_abandon_cause: if forced_abort {
                Some("the worker ignored the drain deadline and was aborted".to_owned())
            } else {
                None
            }
            .or_else(|| {
                st.first_abandon
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            }),
        }
    }

    /// `batch` may be in the table `copies` more times than acknowledged
    /// (attempts whose outcome is unknown): counts them and warns `why`.
    fn possible_duplicates(&self, batch: &SealedBatch, copies: u64, why: fmt::Arguments<'_>) {
        let (st, m) = (&self.stats, &self.metrics);
        let rows = batch.rows();
        st.possible_duplicates.fetch_add(copies, Ordering::Relaxed);
        st.possible_duplicate_rows
            .fetch_add(copies * rows, Ordering::Relaxed);
        m.possible_duplicates.increment(copies);
        m.possible_duplicate_rows.increment(copies * rows);
        tracing::warn!(
            shard = self.shard,
            token = batch.token(),
            rows,
            ambiguous_attempts = copies,
            "{why}"
        );
    }

    /// Keeps `cause` as the shard's abandon cause unless one is kept already.
    fn note_abandon(&self, cause: impl FnOnce() -> String) {
        let mut first = self
            .stats
            .first_abandon
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if first.is_none() {
            *first = Some(cause());
        }
    }
}

/// The backoff gauge's value for `nanos` of total backoff: exactly 0.0 for
/// 0 (the gauge is always set from the integer total, never accumulated).
fn backoff_gauge_value(nanos: u64) -> f64 {
    Duration::from_nanos(nanos).as_secs_f64()
}

/// Adds a backoff to its shard's total for as long as it lives (also when
/// the task holding it is aborted).
pub(crate) struct BackoffGuard<'a> {
    shard: &'a ShardShared,
    nanos: u64,
}

impl Drop for BackoffGuard<'_> {
    fn drop(&mut self) {
        let nanos = self.nanos;
        self.shard
            .adjust_backoff(|total| total.saturating_sub(nanos));
    }
}

/// Raises a gauge by `amount` for as long as the guard lives (also when the
/// task holding it is aborted).
pub(crate) struct GaugeGuard<'a> {
    gauge: &'a Gauge,
    amount: f64,
}

impl<'a> GaugeGuard<'a> {
    fn new(gauge: &'a Gauge, amount: f64) -> Self {
        gauge.increment(amount);
        Self { gauge, amount }
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.gauge.decrement(self.amount);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::sink::BreakerConfig;

    fn shard(replicas: usize) -> ShardShared {
        let endpoints = (0..replicas)
            .map(|replica| Endpoint {
                shard: 1,
                replica,
                url: format!("http://h{replica}:8123").into(),
            })
            .collect();
        ShardShared::new(
            1,
            endpoints,
            ReplicaSet::new(
                replicas,
                BreakerConfig {
                    failure_threshold: 1,
                    cooldown: Duration::from_millis(1),
                },
            ),
        )
    }

    /// Every gauge of shard 1 from one snapshot, keyed by name and
    /// replica label ("" without). The debugging recorder resets values
    /// at each snapshot, so a test reads what was set since the last one.
    fn gauges(
        snapshotter: &metrics_util::debugging::Snapshotter,
    ) -> BTreeMap<(String, String), f64> {
        use metrics_util::debugging::DebugValue;
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let k = key.key();
                let label = |name: &str| {
                    k.labels()
                        .find(|l| l.key() == name)
                        .map(|l| l.value().to_owned())
                };
                match value {
                    DebugValue::Gauge(v) if label("shard").as_deref() == Some("1") => Some((
                        (k.name().to_owned(), label("replica").unwrap_or_default()),
                        v.0,
                    )),
                    _ => None,
                }
            })
            .collect()
    }

    #[test]
    fn the_backoff_gauge_returns_to_exactly_zero_and_breakers_show() {
        use crate::metrics as m;
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let s = ::metrics::with_local_recorder(&recorder, || shard(2));
        // 0.1 + 0.2 - 0.1 - 0.2 is 2.77e-17 in f64: the residue a scrape
        // showed when the gauge was incremented and decremented.
        let a = s.backing_off(Duration::from_millis(100));
        let b = s.backing_off(Duration::from_millis(200));
        drop(a);
        drop(b);
        let g = gauges(&snapshotter);
        let v = g[&(m::BACKOFF_SECONDS.to_owned(), String::new())];
        assert_eq!(v.to_bits(), 0.0f64.to_bits(), "backoff gauge {v:e}");
        assert_eq!(g[&(m::SHARD_READY.to_owned(), String::new())], 1.0);

        let breaker = |g: &BTreeMap<(String, String), f64>, r: &str| {
            g[&(m::REPLICA_BREAKER_OPEN.to_owned(), r.to_owned())]
        };
        let ready =
            |g: &BTreeMap<(String, String), f64>| g[&(m::SHARD_READY.to_owned(), String::new())];
        let now = Instant::now();
        s.replica_failed(0, now, &WriteError::retryable("refused"));
        let g = gauges(&snapshotter);
        assert_eq!(
            (breaker(&g, "0"), breaker(&g, "1"), ready(&g)),
            (1.0, 0.0, 1.0)
        );
        s.replica_failed(1, now, &WriteError::retryable("refused"));
        let g = gauges(&snapshotter);
        assert_eq!(
            (breaker(&g, "0"), breaker(&g, "1"), ready(&g)),
            (1.0, 1.0, 0.0)
        );
        s.replica_succeeded(0);
        let g = gauges(&snapshotter);
        assert_eq!(
            (breaker(&g, "0"), breaker(&g, "1"), ready(&g)),
            (0.0, 1.0, 1.0)
        );
    }

    #[test]
    fn backoff_total_returns_to_exactly_zero() {
        let s = shard(1);
        // Delays whose float sum does not cancel exactly: 0.1 + 0.2 - 0.1 - 0.2
        // is 2.77e-17 in f64, the residue seen on a scrape.
        let a = s.backing_off(Duration::from_millis(100));
        let b = s.backing_off(Duration::from_millis(200));
        assert_eq!(*s.backoff_nanos.lock().unwrap(), 300_000_000);
        drop(a);
        drop(b);
        assert_eq!(*s.backoff_nanos.lock().unwrap(), 0);
        assert_eq!(backoff_gauge_value(0).to_bits(), 0.0f64.to_bits());
        assert_eq!(backoff_gauge_value(300_000_000), 0.3);
    }

    #[test]
    fn unhealthy_reason_names_the_shard_and_each_replica() {
        let s = shard(2);
        let now = Instant::now();
        assert!(s.healthy());
        assert_eq!(s.unhealthy_reason(), None);
        s.replica_failed(0, now, &WriteError::retryable("connection refused"));
        assert!(s.healthy(), "r1 still closed");
        s.replica_failed(1, now, &WriteError::retryable("timed out"));
        assert!(!s.healthy());
        let why = s.unhealthy_reason().expect("unhealthy");
        assert!(
            why.starts_with("shard 1: every replica's breaker open ("),
            "{why}"
        );
        assert!(why.contains("r0 http://h0:8123: "), "{why}");
        assert!(why.contains("connection refused"), "{why}");
        assert!(why.contains("r1 http://h1:8123: "), "{why}");
        assert!(why.contains("timed out"), "{why}");
        // A cooldown over is not health: still unhealthy until a success.
        assert!(!s.healthy());
        s.replica_succeeded(1);
        assert!(s.healthy());
    }
}
