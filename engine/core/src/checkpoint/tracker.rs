//! The checkpoint tracker: per partition and epoch, the contiguous delivered
//! prefix of poll batches, and the offset it is safe to commit (D1).
//!
//! Batches of one `(partition, epoch)` are numbered 0, 1, 2, ... by their
//! [`crate::ack::AckIssuer`] in poll order and may resolve in any order. The
//! tracker advances a watermark over the longest prefix of delivered batches;
//! the **committable offset** is the last offset of that prefix plus one (Kafka
//! commits the next offset to read). Numbering batches instead of offsets means
//! gaps in Kafka offsets (compaction, transaction markers) never stall it.
//!
//! - The first failed batch **freezes** the partition at that epoch: the
//!   watermark never passes it, whatever resolves later (D1).
//! - State is keyed by `(partition, epoch)`: a resolution from a revoked or
//!   released epoch can never move a later epoch's watermark.
//! - Maps are `BTreeMap`s, so iteration (and every result) is deterministic (D7).
//!
//! Synchronous and free of async types so loom can model it
//! (`tests/loom_models.rs`); `tests/it/tracker_props.rs` checks it against a
//! brute-force model with proptest.

use std::collections::BTreeMap;

use crate::ack::{Outcome, Resolution};
use crate::record::{Epoch, Offset, TopicPartition};
use crate::source::CommitOffset;

/// What [`Tracker::apply`] did with a resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The watermark moved forward.
    Advanced,
    /// Delivered ahead of an unresolved batch; held until the gap closes.
    Buffered,
    /// A failed batch: the partition is frozen at it (or stays frozen).
    Failed,
    /// The `(partition, epoch)` is not tracked (never assigned, or released):
    /// ignored.
    Stale,
}

/// The first failed batch of a frozen `(partition, epoch)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedBatch {
    /// The partition.
    pub partition: TopicPartition,
    /// The epoch.
    pub epoch: Epoch,
    /// The failed batch's sequence number.
    pub seq: u64,
    /// The failed batch's first offset: nothing at or past it is ever committed
    /// under this epoch.
    pub first: Offset,
}

#[derive(Debug, Default)]
struct PartitionState {
    /// Sequence number of the first batch not yet in the delivered prefix.
    next_seq: u64,
    /// Last offset of the delivered prefix, if any batch is in it.
    last_delivered: Option<Offset>,
    /// Delivered batches beyond the prefix: seq -> last offset.
    ahead: BTreeMap<u64, Offset>,
    /// The lowest failed batch, if any: (seq, first offset).
    frozen_at: Option<(u64, Offset)>,
    /// Distinct batches resolved either way.
    resolved: u64,
    /// Last offset handed out as committed by [`Tracker::mark_committed`].
    committed: Option<Offset>,
    revoked: bool,
}

impl PartitionState {
    fn committable(&self) -> Option<Offset> {
        self.last_delivered.map(|last| last + 1)
    }

    fn advance(&mut self) -> bool {
        let mut moved = false;
        while let Some(last) = self.ahead.remove(&self.next_seq) {
            debug_assert!(
                self.frozen_at.is_none_or(|(s, _)| s > self.next_seq),
                "D1: the delivered prefix grows over batch {} at or past the frozen one",
                self.next_seq
            );
            debug_assert!(
                self.last_delivered.is_none_or(|prev| last > prev),
                "D1: the delivered prefix's last offset moves backwards to {last}"
            );
            self.last_delivered = Some(last);
            self.next_seq += 1;
            moved = true;
        }
        debug_assert!(
            !self.ahead.contains_key(&self.next_seq),
            "D1: batch {} waits ahead of a prefix that reached it",
            self.next_seq
        );
        moved
    }
}

impl PartitionState {
    /// A failed batch: freezes the partition at the lowest failed batch (D1).
    fn fail(&mut self, r: &Resolution) -> Applied {
        if self.frozen_at.is_none_or(|(s, _)| r.seq < s) {
            self.frozen_at = Some((r.seq, r.first));
        }
        debug_assert!(
            self.frozen_at.is_some_and(|(s, _)| s <= r.seq),
            "D1: failed batch {} of {} did not freeze the partition at or before it",
            r.seq,
            r.partition
        );
        debug_assert!(
            self.frozen_at.is_some_and(|(s, _)| self.next_seq <= s),
            "D1: the delivered prefix of {} already passed its failed batch {}",
            r.partition,
            r.seq
        );
        Applied::Failed
    }

    /// A delivered batch: extends the prefix when it is the next one (then
    /// takes the batches that waited behind it), else waits ahead of the
    /// gap; behind a failure it never counts (D1).
    fn deliver(&mut self, r: &Resolution) -> Applied {
        if self.frozen_at.is_some_and(|(s, _)| r.seq > s) {
            // Behind a failure: can never become committable.
            return Applied::Failed;
        }
        if r.seq < self.next_seq {
            return Applied::Stale;
        }
        if r.seq > self.next_seq {
            self.ahead.insert(r.seq, r.last);
            return Applied::Buffered;
        }
        // In order (the common case): extend the prefix directly,
        // then take any batches that were waiting behind this one.
        debug_assert!(
            self.last_delivered.is_none_or(|prev| r.last > prev),
            "D1: the delivered prefix of {} moves backwards to {}",
            r.partition,
            r.last
        );
        self.last_delivered = Some(r.last);
        self.next_seq += 1;
        self.advance();
        debug_assert!(
            self.committable().is_some_and(|c| c > r.last),
            "D1: delivering the prefix's next batch of {} did not commit past its last offset {}",
            r.partition,
            r.last
        );
        Applied::Advanced
    }
}

/// Tracks delivered prefixes and committable offsets per partition and epoch.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Per partition, per epoch. Nested so a lookup borrows the partition
    /// instead of cloning it into a tuple key (one lookup per ack).
    parts: BTreeMap<TopicPartition, BTreeMap<Epoch, PartitionState>>,
    stale: u64,
}

impl Tracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts tracking `partition` at `epoch`. Panics if that pair is already
    /// tracked (an epoch is never reused).
    pub fn assign(&mut self, partition: TopicPartition, epoch: Epoch) {
        let epochs = self.parts.entry(partition).or_default();
        assert!(!epochs.contains_key(&epoch), "epoch {epoch} assigned twice");
        epochs.insert(epoch, PartitionState::default());
        debug_assert!(
            epochs[&epoch].committable().is_none(),
            "D1: a new epoch {epoch} starts with an offset to commit"
        );
        debug_assert!(
            epochs[&epoch].frozen_at.is_none(),
            "D1: a new epoch {epoch} starts frozen"
        );
    }

    fn state(&self, partition: &TopicPartition, epoch: Epoch) -> Option<&PartitionState> {
        self.parts.get(partition)?.get(&epoch)
    }

    fn state_mut(
        &mut self,
        partition: &TopicPartition,
        epoch: Epoch,
    ) -> Option<&mut PartitionState> {
        self.parts.get_mut(partition)?.get_mut(&epoch)
    }

    fn iter(&self) -> impl Iterator<Item = (&TopicPartition, Epoch, &PartitionState)> {
        self.parts
            .iter()
            .flat_map(|(p, epochs)| epochs.iter().map(move |(e, s)| (p, *e, s)))
    }

    /// Marks `partition` at `epoch` revoked: it keeps accepting the
    /// resolutions of batches already in flight until [`Tracker::release`].
    pub fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch) {
        let before = self.committable(partition, epoch);
        if let Some(state) = self.state_mut(partition, epoch) {
            state.revoked = true;
        }
        debug_assert!(
            self.state(partition, epoch).is_none_or(|s| s.revoked),
            "D1: {partition} epoch {epoch} is tracked but not marked revoked"
        );
        debug_assert_eq!(
            self.committable(partition, epoch),
            before,
            "D1: revoking {partition} epoch {epoch} moved its watermark"
        );
    }

    /// Forgets `partition` at `epoch`; later resolutions for it are stale.
    pub fn release(&mut self, partition: &TopicPartition, epoch: Epoch) {
        if let Some(epochs) = self.parts.get_mut(partition) {
            epochs.remove(&epoch);
            if epochs.is_empty() {
                self.parts.remove(partition);
            }
        }
        debug_assert!(
            self.state(partition, epoch).is_none(),
            "D1: released {partition} epoch {epoch} is still tracked, so its late acks would count"
        );
        debug_assert!(
            self.parts.get(partition).is_none_or(|e| !e.is_empty()),
            "D1: {partition} keeps an empty epoch map after its release"
        );
    }

    /// Applies one resolution. Never panics on input from the ack channel:
    /// unknown pairs are counted as stale, duplicates are ignored in release
    /// builds (and assert in debug builds, since handles resolve exactly once).
    pub fn apply(&mut self, r: &Resolution) -> Applied {
        let Some(state) = self.state_mut(&r.partition, r.epoch) else {
            self.stale += 1;
            return Applied::Stale;
        };
        debug_assert!(
            r.seq >= state.next_seq && !state.ahead.contains_key(&r.seq),
            "D1: {} epoch {} seq {} resolved twice",
            r.partition,
            r.epoch,
            r.seq
        );
        debug_assert!(
            r.first <= r.last,
            "D1: {} epoch {} seq {} resolves the empty range {}..={}",
            r.partition,
            r.epoch,
            r.seq,
            r.first,
            r.last
        );
        state.resolved += 1;
        match r.outcome {
            Outcome::Failed => state.fail(r),
            Outcome::Delivered => state.deliver(r),
        }
    }

    /// The offset it is safe to commit for `partition` at `epoch` (last
    /// delivered + 1), or `None` when nothing is delivered yet or the pair is
    /// not tracked.
    pub fn committable(&self, partition: &TopicPartition, epoch: Epoch) -> Option<Offset> {
        self.state(partition, epoch)
            .and_then(PartitionState::committable)
    }

    /// Batches of `partition` at `epoch` resolved so far, delivered or failed.
    /// Equal to the lane issuer's [`crate::ack::AckIssuer::issued`] once every
    /// batch has settled.
    pub fn resolved(&self, partition: &TopicPartition, epoch: Epoch) -> u64 {
        self.state(partition, epoch).map_or(0, |s| s.resolved)
    }

    /// The first failed batch of `partition` at `epoch`, if it is frozen.
    pub fn failure(&self, partition: &TopicPartition, epoch: Epoch) -> Option<FailedBatch> {
        let state = self.state(partition, epoch)?;
        state.frozen_at.map(|(seq, first)| FailedBatch {
            partition: partition.clone(),
            epoch,
            seq,
            first,
        })
    }

    /// Every frozen `(partition, epoch)`, in partition order.
    pub fn failures(&self) -> Vec<FailedBatch> {
        self.iter()
            .filter_map(|(p, epoch, s)| {
                s.frozen_at.map(|(seq, first)| FailedBatch {
                    partition: p.clone(),
                    epoch,
                    seq,
                    first,
                })
            })
            .collect()
    }

    /// Offsets that are committable and not yet marked committed, in partition
    /// order. For a revoked-but-not-released pair too (the revoke commit).
    pub fn pending_commits(&self) -> Vec<CommitOffset> {
        self.iter()
            .filter_map(|(p, epoch, s)| {
                let offset = s.committable()?;
                debug_assert!(
                    s.committed.is_none_or(|c| offset >= c),
                    "D1: the committable offset {offset} of {p} fell behind its commit"
                );
                debug_assert!(
                    s.frozen_at.is_none_or(|(_, first)| offset <= first),
                    "D1: the committable offset {offset} of {p} passes its failed batch"
                );
                (s.committed != Some(offset)).then(|| CommitOffset {
                    partition: p.clone(),
                    epoch,
                    offset,
                    metadata: None,
                })
            })
            .collect()
    }

    /// Records that `commit` was accepted by the source, so it is not offered
    /// again by [`Tracker::pending_commits`].
    pub fn mark_committed(&mut self, commit: &CommitOffset) {
        if let Some(state) = self.state_mut(&commit.partition, commit.epoch) {
            debug_assert!(
                state.committable().is_some_and(|c| commit.offset <= c),
                "D1: commit {} of {} passes the delivered prefix",
                commit.offset,
                commit.partition
            );
            debug_assert!(
                state.committed.is_none_or(|c| commit.offset >= c),
                "D1: commit {} of {} moves its committed offset backwards",
                commit.offset,
                commit.partition
            );
            debug_assert!(
                state
                    .frozen_at
                    .is_none_or(|(_, first)| commit.offset <= first),
                "D1: commit {} of {} passes its failed batch",
                commit.offset,
                commit.partition
            );
            state.committed = Some(commit.offset);
        }
    }

    /// Whether `partition` at `epoch` was revoked (and not yet released).
    pub fn is_revoked(&self, partition: &TopicPartition, epoch: Epoch) -> bool {
        self.state(partition, epoch).is_some_and(|s| s.revoked)
    }

    /// Resolutions ignored because their `(partition, epoch)` was not tracked.
    pub fn stale(&self) -> u64 {
        self.stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(seq: u64, first: Offset, last: Offset, outcome: Outcome) -> Resolution {
        Resolution {
            partition: TopicPartition::new("t", 0),
            epoch: 1,
            seq,
            first,
            last,
            outcome,
        }
    }

    fn tp() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    #[test]
    fn out_of_order_delivery_waits_for_the_gap() {
        let mut t = Tracker::new();
        t.assign(tp(), 1);
        assert_eq!(
            t.apply(&res(1, 10, 19, Outcome::Delivered)),
            Applied::Buffered
        );
        assert_eq!(t.committable(&tp(), 1), None);
        assert_eq!(
            t.apply(&res(0, 0, 9, Outcome::Delivered)),
            Applied::Advanced
        );
        assert_eq!(t.committable(&tp(), 1), Some(20));
    }

    #[test]
    fn commit_never_passes_failed_batch() {
        let mut t = Tracker::new();
        t.assign(tp(), 1);
        t.apply(&res(0, 0, 9, Outcome::Delivered));
        t.apply(&res(1, 10, 19, Outcome::Failed));
        t.apply(&res(2, 20, 29, Outcome::Delivered));
        assert_eq!(t.committable(&tp(), 1), Some(10));
        assert_eq!(t.failure(&tp(), 1).map(|f| f.first), Some(10));
    }

    #[test]
    fn revoked_epoch_never_moves_a_later_epoch() {
        let mut t = Tracker::new();
        t.assign(tp(), 1);
        t.revoke(&tp(), 1);
        t.release(&tp(), 1);
        t.assign(tp(), 2);
        assert_eq!(t.apply(&res(0, 0, 99, Outcome::Delivered)), Applied::Stale);
        assert_eq!(t.committable(&tp(), 2), None);
        assert_eq!(t.stale(), 1);
    }

    #[test]
    fn pending_commits_offer_each_offset_once() {
        let mut t = Tracker::new();
        t.assign(tp(), 1);
        t.apply(&res(0, 0, 4, Outcome::Delivered));
        let pending = t.pending_commits();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].offset, 5);
        t.mark_committed(&pending[0]);
        assert!(t.pending_commits().is_empty());
    }

    /// D1 asserted where it would break: a caller that marks an offset
    /// committed past the delivered prefix (batch 1, offsets 10..=19, is
    /// still out) stops a debug build at once.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "D1: commit 20 of t/0 passes the delivered prefix")]
    fn marking_a_commit_past_the_delivered_prefix_fails_its_assertion() {
        let mut t = first_batch_delivered();
        t.mark_committed(&CommitOffset {
            partition: tp(),
            epoch: 1,
            offset: 20,
            metadata: None,
        });
    }

    /// D1 asserted where it would break: a resolution for a batch the
    /// tracker already took (a handle resolving twice) stops a debug build.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "D1: t/0 epoch 1 seq 0 resolved twice")]
    fn a_batch_resolved_twice_fails_its_assertion() {
        let mut t = first_batch_delivered();
        t.apply(&res(0, 0, 9, Outcome::Delivered));
    }

    /// `t/0` at epoch 1 with batch 0 (offsets 0..=9) delivered.
    #[cfg(debug_assertions)]
    fn first_batch_delivered() -> Tracker {
        let mut t = Tracker::new();
        t.assign(tp(), 1);
        t.apply(&res(0, 0, 9, Outcome::Delivered));
        t
    }
}
