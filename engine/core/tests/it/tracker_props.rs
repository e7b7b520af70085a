//! Property tests of the checkpoint tracker against a brute-force model (D1).
//!
//! Random interleavings of assign / issue / fail / drop / revoke / release /
//! re-assign (new epoch) / pump / commit over three partitions are driven
//! through the real ack path: [`AckIssuer`] hands out [`AckHandle`]s (cloned,
//! failed, dropped plainly or through an [`AckSet`]), resolutions travel over
//! [`ack_channel`] and reach [`Tracker::apply`] only when the test pumps, so
//! resolutions of a released epoch arrive late and must be stale.
//!
//! The model keeps, per `(partition, epoch)`, every issued batch with its
//! offsets and the outcome the tracker has been told. Its committable offset is
//! the last offset of the longest prefix of delivered batches plus one,
//! stopping at the first unresolved or failed batch. After every step the
//! tracker's `committable`, `failure`, `resolved`, `is_revoked`,
//! `pending_commits` and `stale` must equal the model's, and every resolution
//! that comes off the channel must be exactly the one the model expects.

use std::collections::VecDeque;

use proptest::prelude::*;
use spate_core::ack::{AckHandle, AckIssuer, AckReceiver, AckSender, AckSet, Outcome, ack_channel};
use spate_core::checkpoint::{Applied, FailedBatch, Tracker};
use spate_core::record::{Epoch, Offset, TopicPartition};
use spate_core::source::CommitOffset;

/// The partitions the interleavings spread over.
fn partitions() -> [TopicPartition; 3] {
    [
        TopicPartition::new("a", 0),
        TopicPartition::new("a", 1),
        TopicPartition::new("b", 0),
    ]
}

/// How the last holder of a clone lets go of it.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// A plain drop (a filter dropping its record): delivers unless failed.
    Plain,
    /// Held by the sink and delivered after a durable write.
    AckSetDeliver,
    /// Held by the sink and dropped unwritten: fails the batch.
    AckSetDrop,
}

/// One step of an interleaving. Indexes are raw and resolved modulo whatever
/// is there at the time, so every generated sequence is valid.
#[derive(Clone, Debug)]
enum Op {
    /// Assign a partition again under a new, larger epoch (only when its
    /// current epoch is revoked or released).
    Assign {
        part: usize,
        epoch_bump: u64,
        start: Offset,
    },
    /// Issue the next poll batch of an active lane, held by `clones` clones.
    Issue {
        lane: usize,
        gap: Offset,
        len: Offset,
        clones: usize,
    },
    /// Some holder fails a live batch (any lane, also revoked or released).
    Fail { lane: usize, batch: usize },
    /// One clone of a live batch goes away.
    Drop {
        lane: usize,
        batch: usize,
        clone: usize,
        how: Release,
    },
    /// Revoke an active lane: it stops issuing, in-flight batches still count.
    Revoke { lane: usize },
    /// Release a revoked lane: later resolutions for it are stale.
    ReleaseLane { lane: usize },
    /// Apply up to `n` queued resolutions to the tracker.
    Pump { n: usize },
    /// Offer pending commits and mark those selected by `mask` committed.
    Commit { mask: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    let release = prop_oneof![
        3 => Just(Release::Plain),
        2 => Just(Release::AckSetDeliver),
        1 => Just(Release::AckSetDrop),
    ];
    prop_oneof![
        2 => (0..3usize, 0..3u64, 0..40i64).prop_map(|(part, epoch_bump, start)| Op::Assign { part, epoch_bump, start }),
        8 => (0..8usize, 0..3i64, 1..5i64, 1..4usize)
            .prop_map(|(lane, gap, len, clones)| Op::Issue { lane, gap, len, clones }),
        2 => (0..8usize, 0..8usize).prop_map(|(lane, batch)| Op::Fail { lane, batch }),
        12 => (0..8usize, 0..8usize, 0..4usize, release)
            .prop_map(|(lane, batch, clone, how)| Op::Drop { lane, batch, clone, how }),
        1 => (0..8usize).prop_map(|lane| Op::Revoke { lane }),
        1 => (0..8usize).prop_map(|lane| Op::ReleaseLane { lane }),
        4 => (0..4usize).prop_map(|n| Op::Pump { n }),
        2 => any::<u8>().prop_map(|mask| Op::Commit { mask }),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneState {
    Active,
    Revoked,
    Released,
}

/// One issued poll batch, as the model sees it.
#[derive(Debug)]
struct ModelBatch {
    first: Offset,
    last: Offset,
    /// Clones still held; the batch resolves when the last one goes.
    handles: Vec<AckHandle>,
    /// Whether any holder failed it.
    failed: bool,
    /// Whether its resolution was sent (last clone gone).
    sent: bool,
    /// The outcome the tracker was told (`None`: not applied, or applied
    /// after release and counted stale).
    applied: Option<Outcome>,
}

/// One `(partition, epoch)`: an assignment of a partition to this process.
#[derive(Debug)]
struct Lane {
    tp: TopicPartition,
    epoch: Epoch,
    issuer: Option<AckIssuer>,
    next_offset: Offset,
    state: LaneState,
    committed: Option<Offset>,
    batches: Vec<ModelBatch>,
    /// Highest committable offset seen so far (it must never go back).
    high_water: Option<Offset>,
}

impl Lane {
    fn tracked(&self) -> bool {
        self.state != LaneState::Released
    }

    /// The brute-force committable offset: last offset of the longest prefix
    /// of delivered batches, plus one.
    fn committable(&self) -> Option<Offset> {
        if !self.tracked() {
            return None;
        }
        self.batches
            .iter()
            .take_while(|b| b.applied == Some(Outcome::Delivered))
            .last()
            .map(|b| b.last + 1)
    }

    /// The lowest failed batch the tracker was told about.
    fn failure(&self) -> Option<FailedBatch> {
        if !self.tracked() {
            return None;
        }
        self.batches
            .iter()
            .enumerate()
            .find(|(_, b)| b.applied == Some(Outcome::Failed))
            .map(|(seq, b)| FailedBatch {
                partition: self.tp.clone(),
                epoch: self.epoch,
                seq: seq as u64,
                first: b.first,
            })
    }

    fn resolved(&self) -> u64 {
        if !self.tracked() {
            return 0;
        }
        self.batches.iter().filter(|b| b.applied.is_some()).count() as u64
    }

    fn pending_commit(&self) -> Option<CommitOffset> {
        let offset = self.committable()?;
        (self.committed != Some(offset)).then(|| CommitOffset {
            partition: self.tp.clone(),
            epoch: self.epoch,
            offset,
            metadata: None,
        })
    }

    /// What `Tracker::apply` must answer for batch `seq` ending `outcome`.
    fn apply(&mut self, seq: usize, outcome: Outcome) -> Applied {
        if !self.tracked() {
            return Applied::Stale;
        }
        let lowest_failed = self
            .batches
            .iter()
            .position(|b| b.applied == Some(Outcome::Failed));
        let before = self.committable();
        self.batches[seq].applied = Some(outcome);
        match outcome {
            Outcome::Failed => Applied::Failed,
            Outcome::Delivered if lowest_failed.is_some_and(|f| seq > f) => Applied::Failed,
            Outcome::Delivered if self.committable() != before => Applied::Advanced,
            Outcome::Delivered => Applied::Buffered,
        }
    }
}

/// The system under test plus the model, stepped together.
struct Harness {
    tracker: Tracker,
    tx: AckSender,
    rx: AckReceiver,
    parts: [TopicPartition; 3],
    lanes: Vec<Lane>,
    /// Resolutions sent and not yet pumped, in send order: (lane, seq).
    expected: VecDeque<(usize, usize)>,
    stale: u64,
}

impl Harness {
    fn new() -> Self {
        let (tx, rx) = ack_channel();
        let mut h = Self {
            tracker: Tracker::new(),
            tx,
            rx,
            parts: partitions(),
            lanes: Vec::new(),
            expected: VecDeque::new(),
            stale: 0,
        };
        for part in 0..h.parts.len() {
            h.assign(part, 1, 0);
        }
        h
    }

    fn assign(&mut self, part: usize, epoch: Epoch, start: Offset) {
        let tp = self.parts[part].clone();
        self.tracker.assign(tp.clone(), epoch);
        self.lanes.push(Lane {
            issuer: Some(AckIssuer::new(tp.clone(), epoch, self.tx.clone())),
            tp,
            epoch,
            next_offset: start,
            state: LaneState::Active,
            committed: None,
            batches: Vec::new(),
            high_water: None,
        });
    }

    fn lanes_in(&self, state: LaneState) -> Vec<usize> {
        (0..self.lanes.len())
            .filter(|&i| self.lanes[i].state == state)
            .collect()
    }

    /// (lane, seq) of every batch with a clone still alive.
    fn live_batches(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (l, lane) in self.lanes.iter().enumerate() {
            for (s, b) in lane.batches.iter().enumerate() {
                if !b.handles.is_empty() {
                    out.push((l, s));
                }
            }
        }
        out
    }

    fn pick_live(&self, lane: usize, batch: usize) -> Option<(usize, usize)> {
        let live = self.live_batches();
        if live.is_empty() {
            return None;
        }
        // Prefer the chosen lane's batches so out-of-order resolution within a
        // lane is common, fall back to any live batch.
        let in_lane: Vec<_> = live
            .iter()
            .copied()
            .filter(|(l, _)| *l == lane % self.lanes.len())
            .collect();
        let pool = if in_lane.is_empty() { &live } else { &in_lane };
        Some(pool[batch % pool.len()])
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Assign {
                part,
                epoch_bump,
                start,
            } => {
                let latest = self
                    .lanes
                    .iter()
                    .filter(|l| l.tp == self.parts[part])
                    .map(|l| (l.epoch, l.state))
                    .max_by_key(|(e, _)| *e);
                if let Some((epoch, state)) = latest {
                    if state != LaneState::Active {
                        // A new assignment gets a larger epoch; its offsets may
                        // restart anywhere (replay from the committed offset).
                        self.assign(part, epoch + 1 + epoch_bump, start);
                    }
                }
            }
            Op::Issue {
                lane,
                gap,
                len,
                clones,
            } => {
                let active = self.lanes_in(LaneState::Active);
                if active.is_empty() {
                    return;
                }
                let l = &mut self.lanes[active[lane % active.len()]];
                // Offset gaps (compaction, transaction markers) must not stall.
                let first = l.next_offset + gap;
                let last = first + len - 1;
                let issuer = l.issuer.as_mut().expect("active lane has an issuer");
                let h = issuer.issue(first, last);
                assert_eq!(h.seq(), l.batches.len() as u64, "seqs count from 0");
                assert_eq!(h.offsets(), (first, last));
                assert_eq!((h.partition(), h.epoch()), (&l.tp, l.epoch));
                let mut handles: Vec<AckHandle> = (1..clones).map(|_| h.clone()).collect();
                handles.push(h);
                l.next_offset = last + 1;
                l.batches.push(ModelBatch {
                    first,
                    last,
                    handles,
                    failed: false,
                    sent: false,
                    applied: None,
                });
            }
            Op::Fail { lane, batch } => {
                let Some((l, s)) = self.pick_live(lane, batch) else {
                    return;
                };
                let b = &mut self.lanes[l].batches[s];
                b.handles[0].fail();
                b.failed = true;
                assert!(
                    b.handles.iter().all(AckHandle::is_failed),
                    "every clone sees the failure"
                );
            }
            Op::Drop {
                lane,
                batch,
                clone,
                how,
            } => {
                let Some((l, s)) = self.pick_live(lane, batch) else {
                    return;
                };
                let b = &mut self.lanes[l].batches[s];
                let h = b.handles.swap_remove(clone % b.handles.len());
                match how {
                    Release::Plain => drop(h),
                    Release::AckSetDeliver => {
                        let mut set = AckSet::new();
                        set.push(&h);
                        drop(h);
                        set.deliver();
                    }
                    Release::AckSetDrop => {
                        let mut set = AckSet::new();
                        set.push(&h);
                        drop(h);
                        drop(set);
                        b.failed = true;
                    }
                }
                if b.handles.is_empty() {
                    b.sent = true;
                    self.expected.push_back((l, s));
                }
            }
            Op::Revoke { lane } => {
                let active = self.lanes_in(LaneState::Active);
                if active.is_empty() {
                    return;
                }
                let l = &mut self.lanes[active[lane % active.len()]];
                self.tracker.revoke(&l.tp, l.epoch);
                l.state = LaneState::Revoked;
                // The lane stops polling: no more batches at this epoch.
                l.issuer = None;
            }
            Op::ReleaseLane { lane } => {
                let revoked = self.lanes_in(LaneState::Revoked);
                if revoked.is_empty() {
                    return;
                }
                let l = &mut self.lanes[revoked[lane % revoked.len()]];
                self.tracker.release(&l.tp, l.epoch);
                l.state = LaneState::Released;
            }
            Op::Pump { n } => self.pump(n),
            Op::Commit { mask } => {
                let offered = self.tracker.pending_commits();
                assert_eq!(offered, self.model_pending(), "pending_commits");
                for (i, c) in offered.iter().enumerate() {
                    if mask & (1 << (i % 8)) != 0 {
                        self.tracker.mark_committed(c);
                        let lane = self
                            .lanes
                            .iter_mut()
                            .find(|l| l.tracked() && l.tp == c.partition && l.epoch == c.epoch)
                            .expect("a commit is offered for a tracked lane");
                        lane.committed = Some(c.offset);
                    }
                }
            }
        }
    }

    /// Applies up to `n` queued resolutions; each must be exactly the next one
    /// the model expects.
    fn pump(&mut self, n: usize) {
        for _ in 0..n {
            let Some((l, s)) = self.expected.pop_front() else {
                assert_eq!(self.rx.try_recv(), None, "a resolution nobody sent");
                return;
            };
            let r = self.rx.try_recv().expect("a sent resolution is queued");
            let lane = &mut self.lanes[l];
            let b = &lane.batches[s];
            let outcome = if b.failed {
                Outcome::Failed
            } else {
                Outcome::Delivered
            };
            assert_eq!(
                (&r.partition, r.epoch, r.seq, r.first, r.last, r.outcome),
                (&lane.tp, lane.epoch, s as u64, b.first, b.last, outcome),
                "resolution content"
            );
            let want = lane.apply(s, outcome);
            if want == Applied::Stale {
                self.stale += 1;
            }
            assert_eq!(self.tracker.apply(&r), want, "Applied for {r:?}");
        }
    }

    fn model_pending(&self) -> Vec<CommitOffset> {
        let mut v: Vec<_> = self
            .lanes
            .iter()
            .filter(|l| l.tracked())
            .filter_map(Lane::pending_commit)
            .collect();
        // The tracker iterates (partition, epoch) in order (D7).
        v.sort_by(|a, b| (&a.partition, a.epoch).cmp(&(&b.partition, b.epoch)));
        v
    }

    /// Tracker == model, for every lane ever assigned.
    fn check_model(&self) {
        for l in &self.lanes {
            let what = format!("{} epoch {} ({:?})", l.tp, l.epoch, l.state);
            assert_eq!(
                self.tracker.committable(&l.tp, l.epoch),
                l.committable(),
                "committable of {what}"
            );
            assert_eq!(
                self.tracker.failure(&l.tp, l.epoch),
                l.failure(),
                "failure of {what}"
            );
            assert_eq!(
                self.tracker.resolved(&l.tp, l.epoch),
                l.resolved(),
                "resolved of {what}"
            );
            assert_eq!(
                self.tracker.is_revoked(&l.tp, l.epoch),
                l.state == LaneState::Revoked,
                "is_revoked of {what}"
            );
        }
        let failures: Vec<_> = {
            let mut v: Vec<_> = self.lanes.iter().filter_map(Lane::failure).collect();
            v.sort_by(|a, b| (&a.partition, a.epoch).cmp(&(&b.partition, b.epoch)));
            v
        };
        assert_eq!(self.tracker.failures(), failures, "failures()");
        assert_eq!(self.tracker.pending_commits(), self.model_pending());
        assert_eq!(self.tracker.stale(), self.stale, "stale count");
    }

    /// D1, checked against the ground truth rather than the model's
    /// algorithm: a committable offset `c` of a lane means every batch with
    /// offsets below `c` was delivered, none failed; `c` never moves back.
    fn check_d1(&mut self) {
        for l in &mut self.lanes {
            let Some(c) = self.tracker.committable(&l.tp, l.epoch) else {
                continue;
            };
            for (seq, b) in l.batches.iter().enumerate() {
                if b.first < c {
                    // D1: nothing failed, unresolved or undelivered below c.
                    assert_eq!(
                        b.applied,
                        Some(Outcome::Delivered),
                        "D1: {} epoch {} commits {c} past batch {seq} ({}..={}, failed: {})",
                        l.tp,
                        l.epoch,
                        b.first,
                        b.last,
                        b.failed
                    );
                    assert!(b.last < c, "D1: commit {c} splits batch {seq}");
                }
            }
            if let Some(f) = self.tracker.failure(&l.tp, l.epoch) {
                assert!(c <= f.first, "D1: commit {c} passes failed batch {f:?}");
            }
            assert!(
                l.high_water.is_none_or(|hw| c >= hw),
                "committable of {} epoch {} moved back to {c}",
                l.tp,
                l.epoch
            );
            l.high_water = Some(c);
        }
    }

    /// Lets go of every clone, applies everything and checks that every batch
    /// resolved exactly once.
    fn finish(&mut self) {
        for l in 0..self.lanes.len() {
            for s in 0..self.lanes[l].batches.len() {
                let b = &mut self.lanes[l].batches[s];
                if !b.handles.is_empty() {
                    b.handles.clear();
                    b.sent = true;
                    self.expected.push_back((l, s));
                }
            }
        }
        let n = self.expected.len();
        self.pump(n + 1);
        assert!(self.expected.is_empty());
        assert_eq!(self.rx.try_recv(), None, "a batch resolved twice");
        for l in &self.lanes {
            assert!(l.batches.iter().all(|b| b.sent));
            if let (true, Some(issuer)) = (l.tracked(), &l.issuer) {
                // Once every batch has settled, resolved == issued.
                assert_eq!(self.tracker.resolved(&l.tp, l.epoch), issuer.issued());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The tracker agrees with the brute-force model after every step of any
    /// interleaving, across partitions, epochs, revoke/release/re-assign and
    /// stale acks from released epochs (D1).
    #[test]
    fn tracker_matches_brute_force_model(ops in prop::collection::vec(op(), 1..150)) {
        let mut h = Harness::new();
        h.check_model();
        for op in &ops {
            h.step(op);
            h.check_model();
        }
        h.finish();
        h.check_model();
    }

    /// D1: whatever the interleaving, the committable offset never passes a
    /// failed (or unresolved) batch of its epoch, never splits a batch and
    /// never moves back; checked against the batches themselves.
    #[test]
    fn commit_never_passes_failed_batch(ops in prop::collection::vec(op(), 1..150)) {
        let mut h = Harness::new();
        for op in &ops {
            h.step(op);
            // Keep the tracker current so the check sees every state.
            if h.expected.len() > 3 {
                h.pump(1);
            }
            h.check_d1();
        }
        h.finish();
        h.check_d1();
    }
}

/// A stale ack from a released epoch must not move the re-assigned
/// partition's watermark, even when its seq and offsets line up exactly with
/// the new epoch's next batch (D1).
#[test]
fn stale_ack_from_released_epoch_never_moves_new_epoch() {
    let (tx, mut rx) = ack_channel();
    let tp = TopicPartition::new("a", 0);
    let mut t = Tracker::new();
    t.assign(tp.clone(), 1);
    let mut old = AckIssuer::new(tp.clone(), 1, tx.clone());
    let old0 = old.issue(0, 9);
    t.revoke(&tp, 1);
    t.release(&tp, 1);
    t.assign(tp.clone(), 2);
    let mut new = AckIssuer::new(tp.clone(), 2, tx);
    let new0 = new.issue(0, 9);
    drop(old0);
    let r = rx.try_recv().unwrap();
    assert_eq!(t.apply(&r), Applied::Stale);
    assert_eq!(t.committable(&tp, 2), None, "old epoch's ack moved epoch 2");
    new0.fail();
    drop(new0);
    assert_eq!(t.apply(&rx.try_recv().unwrap()), Applied::Failed);
    assert_eq!(t.committable(&tp, 2), None);
    assert_eq!(t.failure(&tp, 2).map(|f| f.first), Some(0));
}
