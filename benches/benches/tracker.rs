//! Checkpoint tracker throughput (DESIGN "Checkpoint").
//!
//! - `apply/*`: [`Tracker::apply`] alone. Resolutions of [`PARTITIONS`]
//!   partitions x [`BATCHES`] poll batches are generated before timing; each
//!   iteration applies all of them to a freshly assigned tracker (set up
//!   outside the timed section):
//!   - `in_order`: partitions round robin, each partition's batches in order
//!     (every apply advances the watermark).
//!   - `shuffled_window64`: the in-order sequence shuffled within windows of 64
//!     (bounded reordering, as concurrent writes to a few shards produce).
//!   - `shuffled_full`: the whole sequence shuffled (seeded); the buffered
//!     `ahead` maps grow to thousands of entries: a worst case.
//! - `end_to_end/*`: the ack path as the engine runs it: [`AckIssuer::issue`]
//!   per poll batch, the handle dropped (one resolution sent on the unbounded
//!   channel), then the checkpointer's drain, [`AckReceiver::try_recv`] into
//!   [`Tracker::apply`]. State persists across iterations (sequence numbers keep
//!   growing), as in a long run. `in_order` drops each handle at once;
//!   `shuffled` issues [`E2E_BATCHES`] handles and drops them in a seeded
//!   random order before draining.
//!
//! Target: `apply/in_order` at or above 20 M acks/s on one core.
//!
//! [`AckReceiver::try_recv`]: spate_core::ack::AckReceiver::try_recv

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use spate_core::ack::{AckHandle, AckIssuer, Outcome, Resolution, ack_channel};
use spate_core::checkpoint::{Applied, Tracker};
use spate_core::record::TopicPartition;

/// Partitions tracked at once.
const PARTITIONS: i32 = 8;
/// Poll batches per partition per `apply` iteration.
const BATCHES: u64 = 4096;
/// Records per poll batch (only shapes the offsets).
const BATCH_RECORDS: i64 = 500;
/// Handles issued (then dropped) per `end_to_end` iteration.
const E2E_BATCHES: usize = 1024;
/// Epoch of every assignment.
const EPOCH: u64 = 1;
/// Seed of every shuffle (D7 in spirit: the same orders every run).
const SEED: u64 = 0x5EED_5EED;

fn partitions() -> Vec<TopicPartition> {
    (0..PARTITIONS)
        .map(|p| TopicPartition::new("bench-topic", p))
        .collect()
}

/// Every partition's batches in order, partitions round robin.
fn in_order(parts: &[TopicPartition]) -> Vec<Resolution> {
    let mut out = Vec::with_capacity(parts.len() * BATCHES as usize);
    for seq in 0..BATCHES {
        for p in parts {
            let first = seq as i64 * BATCH_RECORDS;
            out.push(Resolution {
                partition: p.clone(),
                epoch: EPOCH,
                seq,
                first,
                last: first + BATCH_RECORDS - 1,
                outcome: Outcome::Delivered,
            });
        }
    }
    out
}

fn fresh_tracker(parts: &[TopicPartition]) -> Tracker {
    let mut t = Tracker::new();
    for p in parts {
        t.assign(p.clone(), EPOCH);
    }
    t
}

fn apply(c: &mut Criterion) {
    let parts = partitions();
    let ordered = in_order(&parts);
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut windowed = ordered.clone();
    for w in windowed.chunks_mut(64) {
        w.shuffle(&mut rng);
    }
    let mut shuffled = ordered.clone();
    shuffled.shuffle(&mut rng);

    let mut g = c.benchmark_group("tracker/apply");
    g.throughput(Throughput::Elements(ordered.len() as u64));
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    for (name, resolutions) in [
        ("in_order", &ordered),
        ("shuffled_window64", &windowed),
        ("shuffled_full", &shuffled),
    ] {
        // Sanity check outside timing: every order ends fully committed.
        let mut t = fresh_tracker(&parts);
        for r in resolutions {
            t.apply(r);
        }
        for p in &parts {
            assert_eq!(
                t.committable(p, EPOCH),
                Some(BATCHES as i64 * BATCH_RECORDS),
                "{name}: {p} not fully committable"
            );
        }

        g.bench_function(name, |b| {
            b.iter_batched(
                || fresh_tracker(&parts),
                |mut t| {
                    for r in resolutions {
                        black_box(t.apply(black_box(r)));
                    }
                    t
                },
                BatchSize::SmallInput,
            );
        });
    }
    g.finish();
}

/// One lane's issuer and the next offset it polls.
struct Lane {
    issuer: AckIssuer,
    next_offset: i64,
}

impl Lane {
    fn issue(&mut self) -> AckHandle {
        let first = self.next_offset;
        self.next_offset += BATCH_RECORDS;
        self.issuer.issue(first, self.next_offset - 1)
    }
}

fn end_to_end(c: &mut Criterion) {
    let parts = partitions();
    let mut g = c.benchmark_group("tracker/end_to_end");
    g.throughput(Throughput::Elements(E2E_BATCHES as u64));
    g.sample_size(30);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));

    for shuffled in [false, true] {
        let (tx, mut rx) = ack_channel();
        let mut tracker = fresh_tracker(&parts);
        let mut lanes: Vec<Lane> = parts
            .iter()
            .map(|p| Lane {
                issuer: AckIssuer::new(p.clone(), EPOCH, tx.clone()),
                next_offset: 0,
            })
            .collect();
        drop(tx);
        let mut order: Vec<usize> = (0..E2E_BATCHES).collect();
        order.shuffle(&mut SmallRng::seed_from_u64(SEED));
        let mut held: Vec<Option<AckHandle>> = Vec::with_capacity(E2E_BATCHES);
        let mut applied = 0u64;

        let name = if shuffled { "shuffled" } else { "in_order" };
        g.bench_function(name, |b| {
            b.iter(|| {
                if shuffled {
                    for i in 0..E2E_BATCHES {
                        held.push(Some(lanes[i % PARTITIONS as usize].issue()));
                    }
                    for &i in &order {
                        drop(held[i].take());
                    }
                    held.clear();
                } else {
                    for i in 0..E2E_BATCHES {
                        drop(lanes[i % PARTITIONS as usize].issue());
                    }
                }
                while let Some(r) = rx.try_recv() {
                    let a = tracker.apply(&r);
                    debug_assert!(matches!(a, Applied::Advanced | Applied::Buffered));
                    applied += 1;
                }
            });
        });

        // Sanity check outside timing: everything issued resolved and committed.
        let issued: u64 = lanes.iter().map(|l| l.issuer.issued()).sum();
        assert_eq!(applied, issued, "{name}: resolutions lost");
        for (lane, p) in lanes.iter().zip(&parts) {
            assert_eq!(
                tracker.committable(p, EPOCH),
                Some(lane.next_offset).filter(|&o| o > 0)
            );
        }
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    apply(&mut c);
    end_to_end(&mut c);
    c.final_summary();
}
