//! The controller: start, assignment, revoke drain, checkpoint ticker and
//! shutdown (DESIGN "Control").
//!
//! - **Start:** probe every replica; a shard with no answering replica stops
//!   the run before anything is read.
//! - **Assigned:** a new epoch in the checkpointer, an [`AckIssuer`], a lane on
//!   the least-loaded driver.
//! - **Revoked:** stop the lanes, seal their chunks, wait up to
//!   `rebalance.drain_timeout` for their acks, commit what settled (D1),
//!   release. What did not settle is not committed; the next owner re-reads it.
//! - **Ticker:** commit the watermarks every `checkpoint.interval`.
//! - **Stop** (shutdown requested, a driver failed, or an ack failed): seal,
//!   hand pending chunks over until the deadline, drain the pool by the same
//!   deadline (D5), final commit, report.
//!
//! Time comes only from tokio's clock and `select!` is biased (D7).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{Instant, MissedTickBehavior};

use crate::ack::{AckIssuer, AckSender};
use crate::checkpoint::{Checkpointer, FailedBatch};
use crate::metrics::Counter;
use crate::pipeline::driver::RecordCounters;
use crate::pipeline::eo::Recorder;
use crate::pipeline::threads::{LaneEvent, LaneHost};
use crate::pipeline::{
    ExitStatus, IdleBackoff, PipelineConfig, PipelineError, REASON_REFRESH, Readiness, RunReport,
    STATUS_REFRESH, Shutdown,
};
use crate::record::{Epoch, TopicPartition};
use crate::sink::{DrainReport, PoolHandle, SinkPool, Writer};
use crate::source::{AssignmentEvent, CommitOffset, OffsetReset, Source, SourceError};

pub(crate) struct Controller<S: Source, W: Writer, H> {
    pub(crate) source: S,
    pub(crate) pool: Option<SinkPool<W>>,
    pub(crate) checkpointer: Checkpointer,
    pub(crate) ack_tx: AckSender,
    pub(crate) host: H,
    pub(crate) events: UnboundedReceiver<LaneEvent<S::Lane>>,
    pub(crate) config: Arc<PipelineConfig>,
    pub(crate) counters: Arc<RecordCounters>,
    pub(crate) ready: Readiness,
    pub(crate) commit_failures: Counter,
    pub(crate) committed: BTreeMap<TopicPartition, CommitOffset>,
    pub(crate) revoked: BTreeMap<(TopicPartition, Epoch), Option<u64>>,
    pub(crate) frozen: Vec<FailedBatch>,
    pub(crate) offset_resets: Vec<OffsetReset>,
    pub(crate) error: Option<PipelineError>,
    /// `delivery: effectively_once`: the pending ranges of every lane, and
    /// when a failed record commit may be tried again (D9).
    pub(crate) recorder: Option<Recorder>,
    pub(crate) record_retry_at: Option<Instant>,
    /// When the controller first saw the shutdown request: the stop's drain
    /// deadline counts from here (D5), not from the end of whatever revoke
    /// drain it interrupted.
    pub(crate) shutdown_at: Option<Instant>,
}

/// How long after a failed (transient) record commit the controller tries
/// again: the sealed ranges wait unwritten meanwhile.
const RECORD_RETRY: Duration = Duration::from_millis(100);

/// effectively_once: a partition holding pending ranges whose committed
/// offset has not moved for this long (or ten checkpoint intervals, if
/// longer) is named in a warning saying what its first range waits on.
const STALL_REPORT_AFTER: Duration = Duration::from_secs(30);

impl<S: Source, W: Writer, H: LaneHost<S::Lane>> Controller<S, W, H> {
    pub(crate) async fn run(mut self, shutdown: Shutdown) -> RunReport {
        if let Err(e) = self.start().await {
            self.error = Some(e);
        }
        let interval = self.config.checkpoint_interval;
        let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let pool = self.pool.as_ref().map(SinkPool::handle);
        let started = self.error.is_none();
        let mut backoff = IdleBackoff::new(self.config.idle_poll, self.config.idle_poll_max);
        let mut reason_at: Option<Instant> = None;
        let mut status_at: Option<Instant> = None;
        while self.error.is_none() && !shutdown.is_triggered() {
            self.report_readiness(pool.as_ref(), started, &mut reason_at);
            if status_at.is_none_or(|at| Instant::now() >= at) {
                status_at = Some(Instant::now() + STATUS_REFRESH);
                self.ready.set_status(self.source.consumer_status());
            }
            let busy = self.host.step(Instant::now());
            self.take_events();
            self.checkpointer.apply_ready();
            self.record();
            if let Some(failed) = self.failed_partitions() {
                self.error = Some(PipelineError::AcksFailed(failed));
                break;
            }
            if let Err(e) = self.poll_source(&shutdown).await {
                self.error = Some(e);
                break;
            }
            // Thread mode is never busy here: the controller then sleeps up to
            // idle_poll_max between rounds; commits and shutdown do not wait
            // for it (their own branches).
            let idle = if busy {
                backoff.busy();
                Duration::ZERO
            } else {
                backoff.idle()
            };
            tokio::select! {
                biased;
                () = shutdown.wait() => self.note_shutdown(),
                _ = ticker.tick() => self.commit(),
                () = tokio::task::yield_now(), if busy => {}
                () = tokio::time::sleep(idle), if !busy => {}
            }
        }
        self.stop().await
    }

    /// Ready (what /readyz reports): started, every shard has a replica
    /// whose breaker is closed, and the consumer holds an assignment or
    /// waits for one without an error standing. A breaker that reached its
    /// threshold counts as open until a write succeeds (not only during its
    /// cooldown), so a steady fault reads as steadily not ready. The reason
    /// is written before the flag drops, then refreshed every
    /// [`REASON_REFRESH`] (`reason_at`) while it stays down.
    fn report_readiness(
        &mut self,
        pool: Option<&PoolHandle>,
        started: bool,
        reason_at: &mut Option<Instant>,
    ) {
        let reachable = pool.is_some_and(PoolHandle::reachable);
        let consumer = self.source.consumer_ready();
        if started && reachable && consumer {
            self.ready.set_ready();
            *reason_at = None;
            return;
        }
        if reason_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        *reason_at = Some(Instant::now() + REASON_REFRESH);
        let mut why = pool
            .map(PoolHandle::unreachable_reasons)
            .unwrap_or_default();
        if !consumer {
            why.push(format!(
                "consumer: {}",
                self.source.consumer_not_ready_reason()
            ));
        }
        if !started {
            why.insert(0, "the start-up probe failed".to_owned());
        }
        if why.is_empty() {
            // A replica answered between the two reads.
            why.push("a shard's replicas were failing a moment ago; re-checking".to_owned());
        }
        self.ready.set_not_ready(why.join("; "));
    }

    /// After a failed ack: the frozen partitions the run must stop for,
    /// tracked or frozen before their revoke released them. A failure that
    /// arrives after the release is stale: that data was never committed
    /// and the partition's next owner re-reads it (D1), so it stops nothing.
    fn failed_partitions(&mut self) -> Option<Vec<FailedBatch>> {
        if !self.checkpointer.take_failure_flag() {
            return None;
        }
        let mut failed = self.frozen.clone();
        failed.extend(self.checkpointer.tracker().failures());
        (!failed.is_empty()).then_some(failed)
    }

    async fn start(&mut self) -> Result<(), PipelineError> {
        let pool = self.pool.as_ref().expect("pool present until stop");
        let reports = pool.probe(self.config.probe_timeout).await;
        let mut by_shard: BTreeMap<usize, (bool, Vec<String>)> = BTreeMap::new();
        for r in reports {
            let entry = by_shard.entry(r.endpoint.shard).or_default();
            match r.result {
                Ok(()) => entry.0 = true,
                Err(e) => {
                    let e = e.describe("probe");
                    tracing::warn!(endpoint = %r.endpoint, error = %e, "replica probe failed");
                    entry.1.push(format!("{}: {e}", r.endpoint));
                }
            }
        }
        if let Some((shard, (_, errors))) = by_shard.into_iter().find(|(_, (ok, _))| !ok) {
            return Err(PipelineError::Probe {
                shard,
                errors: errors.join("; "),
            });
        }
        self.ready.set_ready();
        tracing::info!("every shard has a reachable replica; pipeline ready");
        Ok(())
    }

    fn take_events(&mut self) {
        while let Ok(ev) = self.events.try_recv() {
            match ev {
                LaneEvent::Revoked {
                    partition,
                    epoch,
                    issued,
                } => {
                    self.revoked.insert((partition, epoch), issued);
                }
                LaneEvent::Surrendered(lane, issuer) => self.host.arrive(lane, issuer),
                LaneEvent::Failed(e) => {
                    tracing::error!(error = %e, "pipeline driver stopped");
                    // The refused record is the cause; its batch's failed
                    // ack (D1) can reach the controller first and stop it
                    // as AcksFailed, which names no column or reason.
                    let cause_arrived_late = matches!(e, PipelineError::RecordFailed { .. })
                        && matches!(self.error, Some(PipelineError::AcksFailed(_)));
                    if self.error.is_none() || cause_arrived_late {
                        self.error = Some(e);
                    }
                }
            }
        }
    }

    /// Records when shutdown was first seen (the stop's deadline counts from
    /// it, D5).
    fn note_shutdown(&mut self) {
        self.shutdown_at.get_or_insert_with(Instant::now);
    }

    /// Serves the source's assignment events until it has none.
    async fn poll_source(&mut self, shutdown: &Shutdown) -> Result<(), PipelineError> {
        let mut revoking = Vec::new();
        while let Some(ev) = self.source.poll_event(std::time::Duration::ZERO)? {
            match ev {
                AssignmentEvent::Assigned {
                    partition,
                    epoch,
                    lane,
                    committed,
                } => {
                    tracing::info!(%partition, epoch, "partition assigned");
                    // effectively_once: the recorded ranges to re-form first
                    // (D9); metadata we cannot read fails the partition.
                    let plan = match &mut self.recorder {
                        Some(r) => match r.assign(&partition, epoch, committed.as_ref()) {
                            Ok(plan) => Some(plan),
                            Err(error) => {
                                return Err(PipelineError::RangeMetadata { partition, error });
                            }
                        },
                        None => None,
                    };
                    self.checkpointer.assign(partition.clone(), epoch);
                    let issuer = AckIssuer::new(partition, epoch, self.ack_tx.clone());
                    self.host.assign(lane, issuer, plan);
                }
                AssignmentEvent::Revoked { partition, epoch } => {
                    tracing::info!(%partition, epoch, "partition revoked");
                    revoking.push((partition, epoch));
                }
            }
        }
        self.offset_resets.extend(self.source.take_offset_resets());
        if !revoking.is_empty() {
            self.revoke(revoking, shutdown).await;
        }
        Ok(())
    }

    /// Revoke drain: stop the lanes, wait (bounded) for their acks, commit
    /// what settled, release (D1). A shutdown request ends the wait at once
    /// (D5: the stop's drain deadline counts from the request, and the stop
    /// drains the pool, these partitions' parts included); what settled is
    /// committed as on a timeout.
    async fn revoke(&mut self, partitions: Vec<(TopicPartition, Epoch)>, shutdown: &Shutdown) {
        for (p, e) in &partitions {
            self.checkpointer.revoke(p, *e);
            self.host.revoke(p, *e);
        }
        self.wait_for_revoked(&partitions, shutdown).await;
        self.commit();
        self.release_revoked(partitions);
        // Spread the remaining lanes evenly over the drivers again; not in
        // effectively_once, where a lane's open range lives in its thread's
        // buffers and must not be cut by a move (D9).
        if self.recorder.is_none() {
            self.host.balance();
        }
    }

    /// Steps the lanes until every revoked partition's acks have settled,
    /// the revoke drain times out, or shutdown is requested.
    async fn wait_for_revoked(
        &mut self,
        partitions: &[(TopicPartition, Epoch)],
        shutdown: &Shutdown,
    ) {
        let deadline = Instant::now() + self.config.rebalance_drain_timeout;
        loop {
            let busy = self.host.step(Instant::now());
            self.take_events();
            self.checkpointer.apply_ready();
            self.record();
            let tracker = self.checkpointer.tracker();
            let settled =
                partitions
                    .iter()
                    .all(|(p, e)| match self.revoked.get(&(p.clone(), *e)) {
                        Some(Some(issued)) => tracker.resolved(p, *e) >= *issued,
                        Some(None) => true,
                        None => false,
                    });
            if settled {
                break;
            }
            // In both modes: a revoke drain that waited out its own timeout
            // before the stop began counting would make the stop take up to
            // rebalance_drain_timeout + drain_timeout from the request (the
            // at_least_once campaign's fresh seed 2937598149: 2.9 s with a
            // 1 s drain timeout). The stop drains the pool, these
            // partitions' batches included, within its own deadline.
            if shutdown.is_triggered() {
                self.note_shutdown();
                tracing::warn!(
                    "shutdown requested during a revoke drain; unsettled data of the revoked partitions is not committed and will be re-read"
                );
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    timeout = ?self.config.rebalance_drain_timeout,
                    "revoke drain timed out; unsettled data of the revoked partitions is not committed and will be re-read"
                );
                break;
            }
            let pause = if busy {
                Duration::ZERO
            } else {
                self.config.idle_poll
            };
            tokio::select! {
                biased;
                () = shutdown.wait() => self.note_shutdown(),
                () = tokio::task::yield_now(), if busy => {}
                () = tokio::time::sleep(pause), if !busy => {}
            }
        }
    }

    /// After the revoke commit: keeps what froze, forgets the revoked
    /// epochs (D1: their late acks are stale) and releases them at the
    /// source.
    fn release_revoked(&mut self, partitions: Vec<(TopicPartition, Epoch)>) {
        for (p, e) in partitions {
            if let Some(f) = self.checkpointer.tracker().failure(&p, e) {
                self.frozen.push(f);
            }
            if !crate::planted::active(crate::planted::Bug::CommitReleasedEpoch) {
                self.checkpointer.release(&p, e);
            }
            if let Some(r) = &mut self.recorder {
                // What this epoch holds unwritten is dropped by its thread.
                r.release(&p, e);
            }
            self.revoked.remove(&(p.clone(), e));
            if let Err(err) = self.source.release(&p, e) {
                tracing::warn!(partition = %p, epoch = e, error = %err, "release after revoke failed");
            }
        }
    }

    /// Commits every committable offset not yet committed. A failed commit is
    /// logged, counted and retried on the next tick.
    fn commit(&mut self) {
        if self.recorder.is_some() {
            self.commit_ranges(false);
            let after = STALL_REPORT_AFTER.max(self.config.checkpoint_interval * 10);
            if let Some(r) = &mut self.recorder {
                r.report_stalls(Instant::now(), after);
            }
            return;
        }
        let pending = self.checkpointer.pending_commits();
        if pending.is_empty() {
            return;
        }
        match self.source.commit(&pending) {
            Ok(()) => {
                if !crate::planted::active(crate::planted::Bug::CommitReleasedEpoch) {
                    self.checkpointer.mark_committed(&pending);
                }
                for c in pending {
                    tracing::debug!(partition = %c.partition, offset = c.offset, "committed");
                    self.committed.insert(c.partition.clone(), c);
                }
            }
            Err(e) => {
                self.commit_failures.increment(1);
                match e {
                    SourceError::CommitRejected { .. } => {
                        tracing::warn!(error = %e, "commit rejected; that epoch has ended")
                    }
                    _ => tracing::warn!(error = %e, "commit failed; retrying next interval"),
                }
            }
        }
    }

    /// effectively_once: takes the ranges threads sealed and records them
    /// (D9): the write-ahead commit, before any of their parts is written.
    fn record(&mut self) {
        if let Some(mut c) = self.range_commits() {
            c.record();
        }
    }

    fn commit_ranges(&mut self, dirty_too: bool) {
        if let Some(mut c) = self.range_commits() {
            c.commit(dirty_too);
        }
    }

    fn range_commits(&mut self) -> Option<RangeCommits<'_, S>> {
        Some(RangeCommits {
            recorder: self.recorder.as_mut()?,
            source: &mut self.source,
            checkpointer: &mut self.checkpointer,
            retry_at: &mut self.record_retry_at,
            committed: &mut self.committed,
            failures: &self.commit_failures,
        })
    }

    async fn stop(mut self) -> RunReport {
        // D5: the drain deadline counts from the shutdown request (a failure
        // stop has none: from now).
        let deadline =
            self.shutdown_at.unwrap_or_else(Instant::now) + self.config.shutdown_drain_timeout;
        tracing::info!(timeout = ?self.config.shutdown_drain_timeout, "stopping: sealing and draining");
        self.ready
            .set_not_ready("shutting down: sealing and draining".to_owned());
        self.shut_down_host(deadline).await;
        let pool = self.pool.take().expect("stop runs once");
        let sink = pool.drain(deadline).await;
        // Let tasks aborted by the drain drop their ack sets before the final
        // count (they fail, D1).
        tokio::task::yield_now().await;
        self.take_events();
        self.checkpointer.apply_ready();
        self.commit();
        self.offset_resets.extend(self.source.take_offset_resets());
        let mut frozen = std::mem::take(&mut self.frozen);
        frozen.extend(self.checkpointer.tracker().failures());
        let c = &self.counters;
        let status = self.exit_status(&frozen, &sink);
        let report = RunReport {
            polled: c.polled.load(Ordering::Relaxed),
            rows_encoded: c.rows_encoded.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            failed_records: c.failed.load(Ordering::Relaxed),
            polls: c.polls.load(Ordering::Relaxed),
            sink,
            committed: self.committed.into_values().collect(),
            frozen,
            offset_resets: self.offset_resets,
            error: self.error,
            status,
        };
        tracing::info!("{}", report.summary());
        report
    }

    /// Stop, first step: the lane host seals and hands over what it holds
    /// by `deadline`; the ranges it seals are recorded meanwhile
    /// (effectively_once, D9; nothing to record otherwise).
    async fn shut_down_host(&mut self, deadline: Instant) {
        let Controller {
            host,
            recorder,
            source,
            checkpointer,
            record_retry_at,
            committed,
            commit_failures,
            ..
        } = self;
        let mut service = || {
            if let Some(recorder) = recorder.as_mut() {
                RangeCommits {
                    recorder,
                    source: &mut *source,
                    checkpointer: &mut *checkpointer,
                    retry_at: &mut *record_retry_at,
                    committed: &mut *committed,
                    failures: &*commit_failures,
                }
                .record();
            }
        };
        host.shutdown(deadline, &mut service).await;
    }

    /// How the run ended, once drained: failed on an error; abandoned when
    /// data is left unwritten (a partition is frozen in front of it, or a
    /// worker had to be aborted; batches abandoned earlier whose partitions
    /// were re-read under a later epoch are counted in `sink` but leave
    /// nothing behind); offset reset; else clean.
    fn exit_status(&self, frozen: &[FailedBatch], sink: &DrainReport) -> ExitStatus {
        if self.error.is_some() {
            ExitStatus::Failed
        } else if !frozen.is_empty() || sink.shards.iter().any(|s| s.forced_abort) {
            ExitStatus::Abandoned
        } else if !self.offset_resets.is_empty() {
            ExitStatus::OffsetReset
        } else {
            ExitStatus::Clean
        }
    }
}

/// The controller's parts a range commit uses (effectively_once), borrowed
/// apart from the lane host so shutdown can record while it drains.
struct RangeCommits<'a, S> {
    recorder: &'a mut Recorder,
    source: &'a mut S,
    checkpointer: &'a mut Checkpointer,
    retry_at: &'a mut Option<Instant>,
    committed: &'a mut BTreeMap<TopicPartition, CommitOffset>,
    failures: &'a Counter,
}

impl<S: Source> RangeCommits<'_, S> {
    /// Takes the ranges threads sealed and records them (D9): the
    /// write-ahead commit, before any of their parts is written.
    fn record(&mut self) {
        let fresh = self.recorder.receive();
        let retry_due = self.retry_at.is_none_or(|t| Instant::now() >= t);
        if (fresh || self.recorder.has_dirty()) && retry_due {
            self.commit(true);
        }
    }

    /// effectively_once: commits every lane whose watermark moved (and,
    /// with `dirty_too`, every lane with unrecorded ranges), each carrying
    /// its pending ranges, so no commit erases the record of a range that
    /// may be in flight (D9). A rejected lane is left out and the rest
    /// committed again; a transient failure is retried after
    /// [`RECORD_RETRY`].
    fn commit(&mut self, dirty_too: bool) {
        let pending = self.checkpointer.pending_commits();
        let watermarks: BTreeMap<(TopicPartition, Epoch), i64> = pending
            .iter()
            .map(|c| ((c.partition.clone(), c.epoch), c.offset))
            .collect();
        let recorder = &mut *self.recorder;
        let mut commits = recorder.commits(&watermarks, dirty_too);
        while !commits.is_empty() {
            let offsets: Vec<CommitOffset> = commits
                .iter()
                .map(|c| CommitOffset {
                    partition: c.partition.clone(),
                    epoch: c.epoch,
                    offset: c.offset,
                    metadata: Some(c.metadata.clone()),
                })
                .collect();
            match self.source.commit(&offsets) {
                Ok(()) => {
                    *self.retry_at = None;
                    // Only the watermark commits are the tracker's; one at
                    // the committed offset only records ranges.
                    let moved: Vec<CommitOffset> = offsets
                        .iter()
                        .filter(|c| {
                            watermarks.get(&(c.partition.clone(), c.epoch)) == Some(&c.offset)
                        })
                        .cloned()
                        .collect();
                    if !crate::planted::active(crate::planted::Bug::CommitReleasedEpoch) {
                        self.checkpointer.mark_committed(&moved);
                    }
                    // D9: the gates open only now that the group holds them.
                    recorder.accepted(&commits);
                    for c in offsets {
                        tracing::debug!(partition = %c.partition, offset = c.offset, metadata = ?c.metadata, "committed");
                        self.committed.insert(c.partition.clone(), c);
                    }
                    return;
                }
                Err(SourceError::CommitRejected {
                    partition,
                    epoch,
                    message,
                }) => {
                    self.failures.increment(1);
                    tracing::warn!(%partition, epoch, %message, "commit rejected; that epoch records no more ranges, its unrecorded ones are never written");
                    recorder.rejected(&partition, epoch);
                    // Listed again: the rejected lane records nothing more,
                    // and the groups it is a member of that no commit
                    // recorded are recorded by no member (ADR 0007).
                    let before = commits.len();
                    commits = recorder.commits(&watermarks, dirty_too);
                    if commits.len() >= before {
                        return;
                    }
                }
                Err(e) => {
                    self.failures.increment(1);
                    tracing::warn!(error = %e, "commit failed; its ranges stay unwritten until a commit records them");
                    *self.retry_at = Some(Instant::now() + RECORD_RETRY);
                    return;
                }
            }
        }
    }
}
