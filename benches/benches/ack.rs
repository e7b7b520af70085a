//! Ack handle costs on the per-record path (DESIGN "Acks").
//!
//! Every record derived from a poll batch holds a clone of the batch's
//! [`AckHandle`]; the sink keeps one per chunk in an [`AckSet`], whose `push`
//! skips a handle of the same batch as the last one pushed. Measured per record
//! with a batch of [`RECORDS`] records:
//!
//! - `clone_drop`: clone the handle and drop the clone at once (one atomic
//!   increment and one decrement on the shared count).
//! - `clone_into_vec_clear`: clone into a pre-allocated `Vec` (records holding
//!   their handle), then clear it (the records dropped).
//! - `ackset_push_same`: `AckSet::push` of the same handle for every record, the
//!   dedupe path the chain's terminal stage takes per row; one `AckSet` per
//!   batch, delivered at the end.
//! - `ackset_push_alternating`: two batches interleaved row by row, so no push
//!   dedupes: the worst case (a clone and a `Vec` push per row).
//!
//! - `baseline_arc_clone_drop`: the same loop over a plain `Arc<()>`, so the
//!   platform's cost of an uncontended atomic increment and decrement can be
//!   told apart from anything `AckHandle` adds.
//!
//! Target: `clone_drop` at or below 10 ns per record.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use spate_core::ack::{AckHandle, AckIssuer, AckSet, ack_channel};
use spate_core::record::TopicPartition;

/// Records derived from one poll batch.
const RECORDS: u64 = 1000;

fn ack(c: &mut Criterion) {
    let (tx, _rx) = ack_channel();
    let mut issuer = AckIssuer::new(TopicPartition::new("bench", 0), 1, tx);
    let batch = issuer.issue(0, RECORDS as i64 - 1);
    let other = issuer.issue(RECORDS as i64, 2 * RECORDS as i64 - 1);

    let mut g = c.benchmark_group("ack");
    g.throughput(Throughput::Elements(RECORDS));
    g.sample_size(50);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));

    g.bench_function("clone_drop", |b| {
        b.iter(|| {
            let h = black_box(&batch);
            for _ in 0..RECORDS {
                drop(black_box(h.clone()));
            }
        });
    });

    let plain = std::sync::Arc::new(());
    g.bench_function("baseline_arc_clone_drop", |b| {
        b.iter(|| {
            let a = black_box(&plain);
            for _ in 0..RECORDS {
                drop(black_box(a.clone()));
            }
        });
    });

    let mut held: Vec<AckHandle> = Vec::with_capacity(RECORDS as usize);
    g.bench_function("clone_into_vec_clear", |b| {
        b.iter(|| {
            let h = black_box(&batch);
            for _ in 0..RECORDS {
                held.push(h.clone());
            }
            black_box(&held);
            held.clear();
        });
    });

    g.bench_function("ackset_push_same", |b| {
        b.iter(|| {
            let h = black_box(&batch);
            let mut set = AckSet::new();
            for _ in 0..RECORDS {
                set.push(h);
            }
            black_box(&set);
            set.deliver();
        });
    });

    g.bench_function("ackset_push_alternating", |b| {
        b.iter(|| {
            let pair = [black_box(&batch), black_box(&other)];
            let mut set = AckSet::new();
            for i in 0..RECORDS as usize {
                set.push(pair[i & 1]);
            }
            black_box(&set);
            set.deliver();
        });
    });

    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    ack(&mut c);
    c.final_summary();
}
