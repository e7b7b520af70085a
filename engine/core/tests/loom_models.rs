//! loom models of the ack path and the in-flight budget: every interleaving
//! (up to the preemption bound) of the very code production runs, with
//! `src/sync.rs` swapping in loom's `Arc` and atomics and `ack_channel()`
//! becoming loom's mpsc.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p spate-core --release --test loom_models`
//! The preemption bound defaults to 3 here; `LOOM_MAX_PREEMPTIONS` overrides.
//!
//! - Acks: exactly one resolution per poll batch whichever thread drops the
//!   last clone, `Failed` iff some holder failed it (including an `AckSet`
//!   dropped unwritten), and the tracker's committable offset stops in front
//!   of the failed batch (D1, D3).
//! - Budget: usage never exceeds the limit except for one oversized chunk
//!   alone, a failed row take rolls back its bytes, and everything returns to
//!   0 once the permits are gone (D8).

#![cfg(loom)]

use loom::model::Builder;
use loom::thread;
use spate_core::ack::{
    AckHandle, AckIssuer, AckReceiver, AckSet, Outcome, Resolution, ack_channel,
};
use spate_core::budget::Budget;
use spate_core::checkpoint::Tracker;
use spate_core::record::{Offset, TopicPartition};

/// Explores `f` under loom with a preemption bound of 3 unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise.
fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

fn tp() -> TopicPartition {
    TopicPartition::new("t", 0)
}

/// Applies every queued resolution to `tracker`, recording each one, and
/// checks the committable offset never moves back or passes `bound` (D1).
fn collect(rx: &mut AckReceiver, tracker: &mut Tracker, seen: &mut Vec<Resolution>, bound: Offset) {
    while let Some(r) = rx.try_recv() {
        let before = tracker.committable(&tp(), 1);
        tracker.apply(&r);
        let after = tracker.committable(&tp(), 1);
        assert!(after >= before, "committable moved back");
        assert!(
            after.is_none_or(|c| c <= bound),
            "D1: committable {after:?} passes {bound}"
        );
        seen.push(r);
    }
}

/// The outcome of batch `seq` among `seen`; panics unless it resolved exactly
/// once.
fn outcome_of(seen: &[Resolution], seq: u64) -> Outcome {
    let mine: Vec<_> = seen.iter().filter(|r| r.seq == seq).collect();
    assert_eq!(mine.len(), 1, "batch {seq} resolved {} times", mine.len());
    mine[0].outcome
}

/// (a) Two threads hold clones of two batches; one fails batch 1 and both
/// drop everything while the main thread drops its own clones and collects
/// resolutions concurrently. Batch 0 resolves Delivered and batch 1 Failed,
/// each exactly once, whoever drops last, and the commit stops at batch 1's
/// first offset (D1).
#[test]
fn concurrent_drops_resolve_each_batch_once_and_fail_iff_failed() {
    model(|| {
        let (tx, mut rx) = ack_channel();
        let mut issuer = AckIssuer::new(tp(), 1, tx);
        let a = issuer.issue(0, 4);
        let b = issuer.issue(5, 9);
        drop(issuer);
        let mut tracker = Tracker::new();
        tracker.assign(tp(), 1);

        let (a1, b1) = (a.clone(), b.clone());
        let failer = thread::spawn(move || {
            b1.fail();
            drop(a1);
            drop(b1);
        });
        let (a2, b2) = (a.clone(), b.clone());
        let dropper = thread::spawn(move || {
            drop(b2);
            drop(a2);
        });

        let mut seen = Vec::new();
        drop(a);
        collect(&mut rx, &mut tracker, &mut seen, 5);
        drop(b);
        collect(&mut rx, &mut tracker, &mut seen, 5);
        failer.join().unwrap();
        dropper.join().unwrap();
        collect(&mut rx, &mut tracker, &mut seen, 5);

        assert_eq!(seen.len(), 2, "one resolution per batch: {seen:?}");
        assert_eq!(outcome_of(&seen, 0), Outcome::Delivered);
        assert_eq!(outcome_of(&seen, 1), Outcome::Failed, "fail() was lost");
        assert_eq!(tracker.committable(&tp(), 1), Some(5));
        assert_eq!(tracker.failure(&tp(), 1).map(|f| f.first), Some(5));
        assert_eq!(tracker.resolved(&tp(), 1), 2);
    });
}

/// (a') Nobody fails: the batch resolves Delivered exactly once, whichever of
/// three concurrent holders drops last.
#[test]
fn concurrent_drops_without_fail_deliver_once() {
    model(|| {
        let (tx, mut rx) = ack_channel();
        let mut issuer = AckIssuer::new(tp(), 1, tx);
        let a = issuer.issue(0, 9);
        drop(issuer);
        let mut tracker = Tracker::new();
        tracker.assign(tp(), 1);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let h = a.clone();
                thread::spawn(move || drop(h))
            })
            .collect();
        let mut seen = Vec::new();
        drop(a);
        collect(&mut rx, &mut tracker, &mut seen, 10);
        for t in threads {
            t.join().unwrap();
        }
        collect(&mut rx, &mut tracker, &mut seen, 10);
        assert_eq!(outcome_of(&seen, 0), Outcome::Delivered);
        assert_eq!(tracker.committable(&tp(), 1), Some(10));
    });
}

/// (c) One sink task delivers its `AckSet` while another sink task's set of
/// the same batch is dropped unwritten and a record's plain clone drops too:
/// the batch fails, exactly once, in every interleaving (D1: one unwritten
/// share is enough to replay the batch).
#[test]
fn ack_set_drop_fails_the_batch_even_when_another_set_delivers() {
    model(|| {
        let (tx, mut rx) = ack_channel();
        let mut issuer = AckIssuer::new(tp(), 1, tx);
        let a = issuer.issue(0, 9);
        drop(issuer);
        let mut written = AckSet::new();
        written.push(&a);
        let mut unwritten = AckSet::new();
        unwritten.push(&a);
        let t1 = thread::spawn(move || written.deliver());
        let t2 = thread::spawn(move || drop(unwritten));
        drop(a);
        let mut tracker = Tracker::new();
        tracker.assign(tp(), 1);
        let mut seen = Vec::new();
        collect(&mut rx, &mut tracker, &mut seen, 0);
        t1.join().unwrap();
        t2.join().unwrap();
        collect(&mut rx, &mut tracker, &mut seen, 0);
        assert_eq!(outcome_of(&seen, 0), Outcome::Failed);
        assert_eq!(tracker.committable(&tp(), 1), None);
    });
}

/// (c') A set holding two batches is delivered while another thread drops a
/// plain clone of the second batch: both deliver exactly once and the commit
/// covers both.
#[test]
fn ack_set_deliver_races_plain_clone_drop() {
    model(|| {
        let (tx, mut rx) = ack_channel();
        let mut issuer = AckIssuer::new(tp(), 1, tx);
        let a = issuer.issue(0, 4);
        let b = issuer.issue(5, 9);
        drop(issuer);
        let mut set = AckSet::new();
        set.push(&a);
        set.push(&b);
        let b_clone: AckHandle = b.clone();
        let t1 = thread::spawn(move || set.deliver());
        let t2 = thread::spawn(move || drop(b_clone));
        drop((a, b));
        let mut tracker = Tracker::new();
        tracker.assign(tp(), 1);
        let mut seen = Vec::new();
        collect(&mut rx, &mut tracker, &mut seen, 10);
        t1.join().unwrap();
        t2.join().unwrap();
        collect(&mut rx, &mut tracker, &mut seen, 10);
        assert_eq!(seen.len(), 2);
        assert_eq!(outcome_of(&seen, 0), Outcome::Delivered);
        assert_eq!(outcome_of(&seen, 1), Outcome::Delivered);
        assert_eq!(tracker.committable(&tp(), 1), Some(10));
    });
}

/// What a budget holder may observe while it holds a permit of `bytes`: an
/// oversized permit is alone (usage is exactly its own), a permit within the
/// limit sees usage within the limit (D8).
fn check_while_held(budget: &Budget, bytes: u64) {
    let in_use = budget.bytes_in_use();
    assert!(
        in_use >= bytes,
        "usage {in_use} below a held permit {bytes}"
    );
    if bytes > budget.max_bytes() {
        assert_eq!(in_use, bytes, "an oversized permit shares the budget");
    } else {
        assert!(
            in_use <= budget.max_bytes(),
            "usage {in_use} over the limit {}",
            budget.max_bytes()
        );
    }
    assert!(budget.rows_in_use() <= budget.max_rows());
}

/// (b) Three threads try to take 6, 4 and an oversized 25 bytes of a 10-byte
/// budget concurrently, then drop: usage never exceeds the limit except for
/// the oversized chunk alone, and returns to 0 (D8).
#[test]
fn budget_never_exceeds_limit_except_oversized_alone() {
    model(|| {
        let budget = Budget::new(10, 10);
        let spawn = |bytes: u64| {
            let budget = budget.clone();
            thread::spawn(move || {
                let got = Budget::try_acquire(&budget, bytes, 1);
                if let Some(p) = &got {
                    assert_eq!(p.bytes(), bytes);
                    check_while_held(&budget, bytes);
                }
                got.is_some()
            })
        };
        let t6 = spawn(6);
        let t25 = spawn(25);
        let p4 = Budget::try_acquire(&budget, 4, 1);
        let got4 = p4.is_some();
        if got4 {
            check_while_held(&budget, 4);
        }
        drop(p4);
        let got6 = t6.join().unwrap();
        let got25 = t25.join().unwrap();
        // A take fails only while someone holds a permit, so someone got one.
        assert!(got4 || got6 || got25, "every take refused: budget wedged");
        assert_eq!(budget.bytes_in_use(), 0, "bytes leaked");
        assert_eq!(budget.rows_in_use(), 0, "rows leaked");
        // Alone, each request succeeds again (nothing is wedged).
        assert!(Budget::try_acquire(&budget, 25, 1).is_some());
    });
}

/// (b') A take that fits in bytes but not in rows rolls its bytes back, racing
/// a holder and its release: no bytes leak and the limits hold.
#[test]
fn budget_row_refusal_rolls_back_bytes() {
    model(|| {
        let budget = Budget::new(10, 2);
        let other = budget.clone();
        let t = thread::spawn(move || {
            if let Some(p) = Budget::try_acquire(&other, 4, 2) {
                check_while_held(&other, 4);
                drop(p);
            }
        });
        if let Some(p) = Budget::try_acquire(&budget, 4, 1) {
            check_while_held(&budget, 4);
            drop(p);
        }
        t.join().unwrap();
        assert_eq!(budget.bytes_in_use(), 0, "bytes leaked");
        assert_eq!(budget.rows_in_use(), 0, "rows leaked");
    });
}
