//! Acks: how the sink tells the checkpointer that a poll batch is safe.
//!
//! One [`AckHandle`] per poll batch (partition, epoch, batch sequence number,
//! offset range). Every record derived from the batch holds a clone; when the
//! last clone is dropped the batch resolves as [`Outcome::Delivered`], unless
//! any holder called [`AckHandle::fail`], in which case it resolves as
//! [`Outcome::Failed`]. A filter that drops a record therefore delivers it; a
//! fan-out clones the handle (DESIGN "Acks").
//!
//! The sink holds handles in an [`AckSet`], which fails every handle it holds
//! when dropped and delivers only on an explicit [`AckSet::deliver`] after a
//! durable write. So a batch that is abandoned, aborted at the drain deadline or
//! lost in a panicking task can only ever *fail* its acks (D1, D5).
//!
//! Resolutions travel to the checkpointer over an unbounded channel, so resolving
//! an ack never waits and never queues behind data (D3). What this module does
//! not do: decide what is committable; that is [`crate::checkpoint::Tracker`].
//!
//! Tests: `tests/loom_models.rs` (exactly one resolution per batch under every
//! interleaving), unit tests below.

use std::fmt;

use crate::record::{Epoch, Offset, TopicPartition};
use crate::sync::{Arc, AtomicBool, Ordering};

/// How a poll batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Every record derived from the batch was durably written or filtered.
    Delivered,
    /// At least one derived record failed (abandoned batch, Fail policy, drain
    /// abort). The partition's watermark freezes in front of it (D1).
    Failed,
}

/// The resolution of one poll batch, sent once when its last handle drops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The batch's partition.
    pub partition: TopicPartition,
    /// The assignment epoch the batch was polled under.
    pub epoch: Epoch,
    /// The batch's position among the batches issued for this partition and
    /// epoch: 0, 1, 2, ... in poll order.
    pub seq: u64,
    /// First offset the batch covers (inclusive).
    pub first: Offset,
    /// Last offset the batch covers (inclusive); committing `last + 1` is safe
    /// once this batch and all earlier ones are delivered.
    pub last: Offset,
    /// How it ended.
    pub outcome: Outcome,
}

#[cfg(not(loom))]
type Tx = tokio::sync::mpsc::UnboundedSender<Resolution>;
#[cfg(not(loom))]
type Rx = tokio::sync::mpsc::UnboundedReceiver<Resolution>;
#[cfg(loom)]
type Tx = loom::sync::mpsc::Sender<Resolution>;
#[cfg(loom)]
type Rx = loom::sync::mpsc::Receiver<Resolution>;

/// The sending half of the ack channel; cloned into every [`AckIssuer`].
#[derive(Clone, Debug)]
pub struct AckSender(Tx);

/// The receiving half of the ack channel, owned by the checkpointer.
#[derive(Debug)]
pub struct AckReceiver(Rx);

/// Creates the unbounded ack channel (D3: a send never waits).
pub fn ack_channel() -> (AckSender, AckReceiver) {
    #[cfg(not(loom))]
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    #[cfg(loom)]
    let (tx, rx) = loom::sync::mpsc::channel();
    (AckSender(tx), AckReceiver(rx))
}

impl AckReceiver {
    /// The next resolution if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Option<Resolution> {
        self.0.try_recv().ok()
    }

    /// Waits for the next resolution; `None` once every sender (every issuer
    /// and every outstanding handle) is gone.
    #[cfg(not(loom))]
    pub async fn recv(&mut self) -> Option<Resolution> {
        self.0.recv().await
    }
}

/// Issues the ack handles of one lane: one per poll batch, numbered in poll
/// order within `(partition, epoch)`.
#[derive(Debug)]
pub struct AckIssuer {
    partition: TopicPartition,
    epoch: Epoch,
    next_seq: u64,
    last_issued: Option<Offset>,
    tx: AckSender,
}

impl AckIssuer {
    /// An issuer for `partition` at `epoch`, sending resolutions on `tx`.
    pub fn new(partition: TopicPartition, epoch: Epoch, tx: AckSender) -> Self {
        Self {
            partition,
            epoch,
            next_seq: 0,
            last_issued: None,
            tx,
        }
    }

    /// The handle for the next poll batch, covering offsets `first..=last`.
    ///
    /// Panics when `first > last`, or when the range does not start after the
    /// previously issued one (poll batches of one lane are ordered).
    pub fn issue(&mut self, first: Offset, last: Offset) -> AckHandle {
        self.issue_at(first, last, None)
    }

    /// [`AckIssuer::issue`], remembering the Kafka timestamp (milliseconds
    /// since the Unix epoch) of the poll batch's first record: what the
    /// end-to-end latency histogram measures from
    /// ([`AckSet::oldest_timestamp_ms`]). One value per poll batch, no
    /// per-record work.
    pub fn issue_at(
        &mut self,
        first: Offset,
        last: Offset,
        timestamp_ms: Option<i64>,
    ) -> AckHandle {
        assert!(first <= last, "ack range {first}..={last} is empty");
        if let Some(prev) = self.last_issued {
            assert!(
                first > prev,
                "ack range {first}..={last} of {} overlaps the previous batch ending at {prev}",
                self.partition
            );
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.last_issued = Some(last);
        AckHandle(Arc::new(AckInner {
            partition: self.partition.clone(),
            epoch: self.epoch,
            seq,
            first,
            last,
            timestamp_ms,
            failed: AtomicBool::new(false),
            tx: self.tx.clone(),
        }))
    }

    /// Acks the offsets after the last issued batch up to `next - 1` as a
    /// batch of no records, delivered at once: what a lane's
    /// [`crate::source::Lane::position`] says the client stepped over
    /// (transaction markers, aborted or compacted-away offsets). The
    /// tracker commits `next` only once every batch issued before this one
    /// is delivered, and never past a failed one (D1). Nothing happens when
    /// no batch was issued yet (the start is unknown) or when `next` is not
    /// past the last issued offset + 1.
    pub fn skip_to(&mut self, next: Offset) {
        let issued = self.next_seq;
        if let Some(prev) = self.last_issued {
            if next > prev + 1 {
                drop(self.issue(prev + 1, next - 1));
            }
        }
        debug_assert!(
            self.last_issued.is_none_or(|last| next <= last + 1),
            "D1: {} skipped to {next} but its acks stop before it",
            self.partition
        );
        debug_assert!(
            self.next_seq <= issued + 1,
            "D1: a skip of {} acked more than one gap batch",
            self.partition
        );
    }

    /// How many handles this issuer has issued; the checkpointer compares it
    /// with resolutions received to know when a revoked lane has settled.
    pub fn issued(&self) -> u64 {
        self.next_seq
    }

    /// The partition this issuer serves.
    pub fn partition(&self) -> &TopicPartition {
        &self.partition
    }

    /// The epoch this issuer serves.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}

struct AckInner {
    partition: TopicPartition,
    epoch: Epoch,
    seq: u64,
    first: Offset,
    last: Offset,
    /// The Kafka timestamp of the batch's first record, if it had one.
    timestamp_ms: Option<i64>,
    failed: AtomicBool,
    tx: AckSender,
}

impl Drop for AckInner {
    /// Runs exactly once, when the last [`AckHandle`] clone is dropped. The
    /// `Arc` drop's acquire fence makes every earlier `fail()` visible here.
    fn drop(&mut self) {
        debug_assert!(
            self.first <= self.last,
            "D1: {} seq {} resolves the empty range {}..={}",
            self.partition,
            self.seq,
            self.first,
            self.last
        );
        let outcome = if self.failed.load(Ordering::Relaxed) {
            Outcome::Failed
        } else {
            Outcome::Delivered
        };
        debug_assert!(
            self.first >= 0,
            "D1: {} seq {} resolves offsets below 0 ({}), which no log holds",
            self.partition,
            self.seq,
            self.first
        );
        // D3: unbounded, never waits. A send error means the checkpointer is
        // gone (shutdown finished); nothing can be committed any more, so there
        // is nothing to protect.
        let _ = self.tx.0.send(Resolution {
            partition: self.partition.clone(),
            epoch: self.epoch,
            seq: self.seq,
            first: self.first,
            last: self.last,
            outcome,
        });
    }
}

/// The ack of one poll batch, cloned into every record derived from it.
///
/// Clone and drop cost one atomic increment and decrement each. The batch
/// resolves when the last clone drops: delivered, or failed if any holder
/// called [`AckHandle::fail`].
#[derive(Clone)]
pub struct AckHandle(Arc<AckInner>);

impl AckHandle {
    /// Marks the whole batch failed; it resolves as [`Outcome::Failed`] when the
    /// last clone drops. Idempotent.
    pub fn fail(&self) {
        self.0.failed.store(true, Ordering::Relaxed);
    }

    /// Whether some holder has already failed this batch.
    pub fn is_failed(&self) -> bool {
        self.0.failed.load(Ordering::Relaxed)
    }

    /// The batch's partition.
    pub fn partition(&self) -> &TopicPartition {
        &self.0.partition
    }

    /// The batch's assignment epoch.
    pub fn epoch(&self) -> Epoch {
        self.0.epoch
    }

    /// The batch's sequence number within its partition and epoch.
    pub fn seq(&self) -> u64 {
        self.0.seq
    }

    /// First and last offset the batch covers (inclusive).
    pub fn offsets(&self) -> (Offset, Offset) {
        (self.0.first, self.0.last)
    }

    /// The Kafka timestamp (ms since the Unix epoch) of the poll batch's
    /// first record, when issued with one ([`AckIssuer::issue_at`]).
    pub fn timestamp_ms(&self) -> Option<i64> {
        self.0.timestamp_ms
    }

    /// Whether both handles are clones of the same batch's ack.
    pub fn same_batch(&self, other: &AckHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for AckHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AckHandle({} epoch {} seq {} offsets {}..={})",
            self.0.partition, self.0.epoch, self.0.seq, self.0.first, self.0.last
        )
    }
}

/// A sink-side collection of ack handles: fails them all when dropped, delivers
/// them only through [`AckSet::deliver`] after a durable write (D1).
///
/// Consecutive pushes of the same batch's handle are kept once, so a chunk of
/// N records from one poll batch holds one handle, not N.
#[derive(Debug, Default)]
pub struct AckSet {
    handles: Vec<AckHandle>,
}

impl AckSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `handle` (cloned) unless the last handle added is of the same batch.
    pub fn push(&mut self, handle: &AckHandle) {
        if !self.handles.last().is_some_and(|h| h.same_batch(handle)) {
            self.handles.push(handle.clone());
        }
        debug_assert!(
            !self.ends_with_a_repeat(),
            "D1: the set holds one batch's handle twice in a row"
        );
    }

    /// Whether the last two handles are clones of one batch's ack (what
    /// [`AckSet::push`] and [`AckSet::append`] keep from happening).
    fn ends_with_a_repeat(&self) -> bool {
        matches!(self.handles.as_slice(), [.., a, b] if a.same_batch(b))
    }

    /// Moves every handle of `other` into `self`, keeping order (and keeping a
    /// batch once where `other` starts with the batch `self` ends with).
    pub fn append(&mut self, mut other: AckSet) {
        let mut moved = std::mem::take(&mut other.handles).into_iter();
        let (before, adding) = (self.handles.len(), moved.len());
        if let Some(first) = moved.next() {
            if !self
                .handles
                .last()
                .is_some_and(|last| last.same_batch(&first))
            {
                self.handles.push(first);
            }
        }
        self.handles.extend(moved);
        debug_assert!(
            other.handles.is_empty(),
            "D1: appended handles stay in the source set, whose drop would fail them"
        );
        debug_assert!(
            self.handles.len() + 1 >= before + adding,
            "D1: appending lost a handle other than one repeat at the join"
        );
    }

    /// Number of distinct handles held (distinct poll batches, unless batches
    /// interleave).
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether the set holds no handle.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The smallest first-record timestamp over the poll batches held
    /// (ms since the Unix epoch), `None` when none has one. Work per poll
    /// batch held, not per record: the end-to-end latency of a sink batch
    /// is measured from it.
    pub fn oldest_timestamp_ms(&self) -> Option<i64> {
        self.handles
            .iter()
            .filter_map(AckHandle::timestamp_ms)
            .min()
    }

    /// The handles held, in push order.
    pub fn handles(&self) -> &[AckHandle] {
        &self.handles
    }

    /// Releases every handle without failing it: the data is durable. A batch
    /// resolves delivered once its other holders let go too.
    pub fn deliver(mut self) {
        self.handles.clear();
    }

    /// Fails every handle and releases them (same as dropping the set, spelled
    /// out where failing is the intent).
    pub fn fail(self) {
        drop(self);
    }
}

impl Drop for AckSet {
    fn drop(&mut self) {
        // D1: anything the sink did not explicitly deliver is failed.
        for handle in &self.handles {
            handle.fail();
        }
        debug_assert!(
            self.handles.iter().all(AckHandle::is_failed),
            "D1: a dropped ack set left a handle it did not deliver unfailed"
        );
        debug_assert!(
            !self.ends_with_a_repeat(),
            "D1: a dropped ack set held one batch's handle twice in a row"
        );
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn issuer() -> (AckIssuer, AckReceiver) {
        let (tx, rx) = ack_channel();
        (AckIssuer::new(TopicPartition::new("t", 0), 1, tx), rx)
    }

    #[test]
    fn last_drop_delivers_once() {
        let (mut iss, mut rx) = issuer();
        let h = iss.issue(0, 9);
        let clones: Vec<_> = (0..10).map(|_| h.clone()).collect();
        drop(h);
        assert!(rx.try_recv().is_none(), "resolved while clones were alive");
        drop(clones);
        let r = rx.try_recv().expect("resolution after last drop");
        assert_eq!(
            (r.seq, r.first, r.last, r.outcome),
            (0, 0, 9, Outcome::Delivered)
        );
        assert!(rx.try_recv().is_none(), "resolved twice");
    }

    #[test]
    fn skip_to_acks_the_gap_behind_the_batches_before_it() {
        use crate::checkpoint::Tracker;
        let (mut iss, mut rx) = issuer();
        let tp = TopicPartition::new("t", 0);
        let mut tracker = Tracker::new();
        tracker.assign(tp.clone(), 1);
        // Nothing issued yet: the start of the gap is unknown.
        iss.skip_to(5);
        assert!(rx.try_recv().is_none(), "a gap before any batch");
        let h = iss.issue(0, 9);
        // Not past last + 1: nothing to ack.
        iss.skip_to(10);
        assert!(rx.try_recv().is_none(), "an empty gap");
        // A marker at 10 and 11: delivered at once, as seq 1.
        iss.skip_to(12);
        let gap = rx.try_recv().expect("the gap resolves at once");
        assert_eq!(
            (gap.seq, gap.first, gap.last, gap.outcome),
            (1, 10, 11, Outcome::Delivered)
        );
        tracker.apply(&gap);
        assert_eq!(
            tracker.committable(&tp, 1),
            None,
            "D1: the gap is committed only behind the batch before it"
        );
        drop(h);
        tracker.apply(&rx.try_recv().unwrap());
        assert_eq!(tracker.committable(&tp, 1), Some(12));
        assert_eq!(iss.issued(), 2);
        // Behind a failed batch the gap never becomes committable.
        let f = iss.issue(12, 20);
        f.fail();
        iss.skip_to(30);
        drop(f);
        while let Some(r) = rx.try_recv() {
            tracker.apply(&r);
        }
        assert_eq!(tracker.committable(&tp, 1), Some(12));
    }

    #[test]
    fn any_fail_fails_the_batch() {
        let (mut iss, mut rx) = issuer();
        let h = iss.issue(5, 7);
        let c = h.clone();
        c.fail();
        drop(c);
        drop(h);
        assert_eq!(rx.try_recv().unwrap().outcome, Outcome::Failed);
    }

    #[test]
    fn ack_set_fails_on_drop_and_delivers_on_deliver() {
        let (mut iss, mut rx) = issuer();
        let a = iss.issue(0, 0);
        let b = iss.issue(1, 1);
        let mut failing = AckSet::new();
        failing.push(&a);
        let mut ok = AckSet::new();
        ok.push(&b);
        drop((a, b));
        drop(failing);
        ok.deliver();
        let r0 = rx.try_recv().unwrap();
        let r1 = rx.try_recv().unwrap();
        assert_eq!((r0.seq, r0.outcome), (0, Outcome::Failed));
        assert_eq!((r1.seq, r1.outcome), (1, Outcome::Delivered));
    }

    #[test]
    fn ack_set_dedupes_consecutive_handles_across_append() {
        let (mut iss, _rx) = issuer();
        let a = iss.issue(0, 3);
        let b = iss.issue(4, 8);
        let mut s1 = AckSet::new();
        s1.push(&a);
        s1.push(&a);
        let mut s2 = AckSet::new();
        s2.push(&a);
        s2.push(&b);
        s1.append(s2);
        assert_eq!(s1.len(), 2);
        s1.deliver();
    }

    #[test]
    #[should_panic(expected = "overlaps")]
    fn issuer_rejects_overlapping_ranges() {
        let (mut iss, _rx) = issuer();
        let _a = iss.issue(0, 5);
        let _b = iss.issue(5, 6);
    }
}
