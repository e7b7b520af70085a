//! The checkpointer: owns the [`Tracker`] and the ack channel's receiving end.
//!
//! It pulls resolutions off the unbounded ack channel (D3), applies them,
//! counts failed batches (`spate_ack_failures_total`, D6) and publishes
//! `spate_committed_offset{topic,partition}` when a commit is accepted. The
//! decision of *when* to commit (ticker, revoke, shutdown) belongs to the
//! pipeline controller.

use std::collections::BTreeMap;

use crate::ack::{AckReceiver, Outcome, Resolution};
use crate::checkpoint::{Applied, Tracker};
use crate::metrics::{self as m, Gauge};
use crate::record::{Epoch, TopicPartition};
use crate::source::CommitOffset;

/// The tracker plus the ack channel and checkpoint metrics.
#[derive(Debug)]
pub struct Checkpointer {
    tracker: Tracker,
    rx: AckReceiver,
    ack_failures: m::Counter,
    committed: BTreeMap<TopicPartition, Gauge>,
    failed: bool,
}

impl Checkpointer {
    /// A checkpointer reading resolutions from `rx`.
    pub fn new(rx: AckReceiver) -> Self {
        Self {
            tracker: Tracker::new(),
            rx,
            ack_failures: ::metrics::counter!(m::ACK_FAILURES),
            committed: BTreeMap::new(),
            failed: false,
        }
    }

    /// The tracker, for queries.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// Starts tracking `partition` at `epoch`. Its committed-offset gauge is
    /// registered at this run's first commit of it, not here: registered
    /// now it would read 0 until then, as if the group had committed
    /// nothing (the source may publish the group's committed offset at
    /// assignment under the same name; the Kafka source does).
    pub fn assign(&mut self, partition: TopicPartition, epoch: Epoch) {
        self.tracker.assign(partition, epoch);
    }

    /// See [`Tracker::revoke`].
    pub fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch) {
        self.tracker.revoke(partition, epoch);
    }

    /// See [`Tracker::release`].
    pub fn release(&mut self, partition: &TopicPartition, epoch: Epoch) {
        self.tracker.release(partition, epoch);
    }

    /// Applies one resolution and counts a failure.
    pub fn apply(&mut self, r: &Resolution) -> Applied {
        if r.outcome == Outcome::Failed {
            self.ack_failures.increment(1);
            self.failed = true;
        }
        let applied = self.tracker.apply(r);
        debug_assert!(
            r.outcome == Outcome::Delivered || matches!(applied, Applied::Failed | Applied::Stale),
            "D1: failed batch {} of {} was taken as {applied:?}",
            r.seq,
            r.partition
        );
        debug_assert!(
            r.outcome == Outcome::Delivered || self.failed,
            "D1: a failed batch of {} left the failure flag down, so the pipeline would not stop",
            r.partition
        );
        applied
    }

    /// Whether a failed resolution was applied since the last call (and
    /// resets the answer): the controller then checks which partitions are
    /// frozen (D1: the pipeline must stop so the data replays).
    pub fn take_failure_flag(&mut self) -> bool {
        std::mem::take(&mut self.failed)
    }

    /// Applies every resolution already queued, without waiting; returns how
    /// many were applied.
    pub fn apply_ready(&mut self) -> usize {
        let mut n = 0;
        while let Some(r) = self.rx.try_recv() {
            self.apply(&r);
            n += 1;
        }
        n
    }

    /// Waits for one resolution and applies it; `None` once the channel closed.
    #[cfg(not(loom))]
    pub async fn apply_next(&mut self) -> Option<Applied> {
        let r = self.rx.recv().await?;
        Some(self.apply(&r))
    }

    /// Applies queued resolutions, then returns the offsets to commit now.
    pub fn pending_commits(&mut self) -> Vec<CommitOffset> {
        self.apply_ready();
        let pending = self.tracker.pending_commits();
        debug_assert!(
            pending
                .iter()
                .all(|c| self.tracker.committable(&c.partition, c.epoch) == Some(c.offset)),
            "D1: a commit offered is not its partition's committable offset"
        );
        debug_assert!(
            pending.iter().all(|c| c.metadata.is_none()),
            "D9: the tracker's commits carry metadata; only the range recorder writes it"
        );
        pending
    }

    /// Records commits the source accepted and publishes the gauge.
    pub fn mark_committed(&mut self, commits: &[CommitOffset]) {
        for c in commits {
            debug_assert!(
                c.offset >= 0,
                "D1: commit {} of {} is below every offset",
                c.offset,
                c.partition
            );
            debug_assert!(
                self.tracker
                    .committable(&c.partition, c.epoch)
                    .is_none_or(|o| c.offset <= o),
                "D1: commit {} of {} passes the delivered prefix",
                c.offset,
                c.partition
            );
            self.tracker.mark_committed(c);
            // Registered at the first commit (see `assign`); no clone after.
            if !self.committed.contains_key(&c.partition) {
                let gauge = ::metrics::gauge!(m::COMMITTED_OFFSET,
                    "topic" => c.partition.topic().to_owned(),
                    "partition" => c.partition.partition().to_string());
                self.committed.insert(c.partition.clone(), gauge);
            }
            self.committed[&c.partition].set(c.offset as f64);
        }
    }
}
