//! In-flight budget costs (D8): what a pipeline thread pays per chunk it seals.
//!
//! - `acquire_drop`: [`Budget::try_acquire`] that succeeds, then the permit
//!   dropped (two compare-and-swaps, two `fetch_sub`s, an `Arc` clone and drop).
//! - `acquire_merge_drop`: two permits merged into one (as a shard worker
//!   merges chunks into a batch), then dropped.
//! - `acquire_exhausted`: [`Budget::try_acquire`] on a full budget (the
//!   backpressure path: returns `None`, nothing to release).
//!
//! Single-threaded, so the atomics are uncontended; [`OPS`] operations per
//! iteration.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use spate_core::budget::Budget;

/// Operations per iteration.
const OPS: u64 = 1000;
/// A typical chunk: 1000 rows of about 100 bytes.
const CHUNK_BYTES: u64 = 100_000;
/// Rows per chunk.
const CHUNK_ROWS: u64 = 1000;

fn budget(c: &mut Criterion) {
    let mut g = c.benchmark_group("budget");
    g.throughput(Throughput::Elements(OPS));
    g.sample_size(50);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));

    let budget = Budget::new(64 << 20, 1 << 20);
    g.bench_function("acquire_drop", |b| {
        b.iter(|| {
            let budget = black_box(&budget);
            for _ in 0..OPS {
                let permit =
                    Budget::try_acquire(budget, black_box(CHUNK_BYTES), black_box(CHUNK_ROWS));
                drop(black_box(permit.expect("budget has room")));
            }
        });
    });
    assert_eq!(budget.bytes_in_use(), 0);

    g.bench_function("acquire_merge_drop", |b| {
        b.iter(|| {
            let budget = black_box(&budget);
            for _ in 0..OPS {
                let mut a =
                    Budget::try_acquire(budget, black_box(CHUNK_BYTES), black_box(CHUNK_ROWS))
                        .expect("budget has room");
                let other =
                    Budget::try_acquire(budget, black_box(CHUNK_BYTES), black_box(CHUNK_ROWS))
                        .expect("budget has room");
                a.merge(other);
                drop(black_box(a));
            }
        });
    });
    assert_eq!(budget.bytes_in_use(), 0);

    let full = Budget::new(CHUNK_BYTES, CHUNK_ROWS);
    let _hold = Budget::try_acquire(&full, CHUNK_BYTES, 1).expect("empty budget");
    g.bench_function("acquire_exhausted", |b| {
        b.iter(|| {
            let full = black_box(&full);
            for _ in 0..OPS {
                let permit =
                    Budget::try_acquire(full, black_box(CHUNK_BYTES), black_box(CHUNK_ROWS));
                assert!(black_box(permit).is_none());
            }
        });
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    budget(&mut c);
    c.final_summary();
}
