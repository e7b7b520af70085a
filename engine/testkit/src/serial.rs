//! Tests of one binary that must not overlap, and the ones that may.
//!
//! Each crate's integration tests are one test binary (`tests/it/`), so tests
//! of different modules run side by side on libtest's threads. Most of them
//! share what they use happily (the ClickHouse and Kafka servers ci/test.sh
//! starts, each test on its own tables and topics). A few cannot: a test that
//! freezes a server (SIGSTOP) or kills a broker would fail every other test
//! on it meanwhile, one that installs a process-wide `metrics` recorder and
//! reads an unlabeled counter would count other tests' events, and some need
//! both cores to keep their deadlines. Those take [`alone`] on the
//! [`Resource`]s they disturb; every test that uses a resource takes
//! [`shared`] on it first, in practice through the helper that hands it the
//! server (e.g. `clickhouse_url()` in `engine/spate/tests/it/common`).
//!
//! - [`alone`] waits until no other thread holds a claim on its resources and
//!   keeps new ones out until its guard drops. Waiting claims of [`alone`] go
//!   first: once one waits, a thread that holds no claim yet waits behind it
//!   for a shared one, so it cannot starve.
//! - [`shared`] holds a shared claim until the calling thread ends. libtest
//!   runs every test on a thread of its own (with `--test-threads=1` too), so
//!   that is the end of the test, however it ends (a panic included); the
//!   claim needs no guard the test could drop too early or forget to hold.
//!   Called again on the same thread it does nothing.
//!
//! No two tests can wait on each other in a circle: [`alone`] gives up the
//! thread's shared claims before it waits (and takes them back with its own,
//! at once), a thread holding [`alone`] must take every shared claim it needs
//! before (asking for one inside it panics, unless [`alone`] covers it), and
//! a thread that already holds a shared claim waits for a further one only on
//! a test running alone, never on one waiting to. A test holding [`alone`]
//! must not wait on another thread that calls [`shared`] on the same resource
//! (it would wait forever): the tests that take [`alone`] claim on their own
//! thread.
//!
//! Neither waits forever: after [`PATIENCE`] it panics naming what it waited
//! for (a claim held by a thread that never ends, such as a pool thread, would
//! otherwise hang the run).

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long [`alone`] and [`shared`] wait before they panic: longer than any
/// test holds a claim.
pub const PATIENCE: Duration = Duration::from_secs(20 * 60);

/// What tests of one binary share and some disturb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// The plain ClickHouse server (`SPATE_CLICKHOUSE_URL`).
    ClickHouse,
    /// The replicated ClickHouse cluster (`SPATE_CLICKHOUSE_SHARDS`).
    Replicas,
    /// The real Kafka cluster (`SPATE_KAFKA_BROKERS`).
    Kafka,
    /// The current ClickHouse engine behind ci/chdb_server.py
    /// (`SPATE_CHDB_URLS`).
    Chdb,
    /// The process-wide `metrics` recorder: every pipeline of the process
    /// records into it.
    Recorder,
}

impl Resource {
    /// Every resource: [`alone`] on these runs beside no test that holds any
    /// claim (the tests that need both cores).
    pub const ALL: [Resource; 5] = [
        Resource::ClickHouse,
        Resource::Replicas,
        Resource::Kafka,
        Resource::Chdb,
        Resource::Recorder,
    ];

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of resources, one bit each.
fn mask(resources: &[Resource]) -> u8 {
    resources.iter().fold(0, |m, r| m | r.bit())
}

/// Who holds what, process-wide.
struct Claims {
    /// Threads holding a shared claim, per resource.
    shared: [usize; 5],
    /// Resources some [`Alone`] guard holds.
    alone: u8,
    /// Callers of [`alone`] still waiting, per resource.
    waiting: [usize; 5],
}

impl Claims {
    fn each(bits: u8) -> impl Iterator<Item = usize> {
        (0..5).filter(move |i| bits & (1 << i) != 0)
    }

    fn shared_in(&self, bits: u8) -> bool {
        Self::each(bits).any(|i| self.shared[i] > 0)
    }

    fn waiting_in(&self, bits: u8) -> bool {
        Self::each(bits).any(|i| self.waiting[i] > 0)
    }

    fn add_shared(&mut self, bits: u8, n: isize) {
        for i in Self::each(bits) {
            self.shared[i] = self.shared[i].checked_add_signed(n).expect("claim count");
        }
    }
}

static CLAIMS: Mutex<Claims> = Mutex::new(Claims {
    shared: [0; 5],
    alone: 0,
    waiting: [0; 5],
});
static CHANGED: Condvar = Condvar::new();

/// This thread's claims; the shared ones go back when the thread ends.
struct Mine {
    shared: Cell<u8>,
    alone: Cell<u8>,
}

impl Drop for Mine {
    fn drop(&mut self) {
        let bits = self.shared.get();
        if bits != 0 {
            lock().add_shared(bits, -1);
            CHANGED.notify_all();
        }
    }
}

thread_local! {
    static MINE: Mine = const {
        Mine {
            shared: Cell::new(0),
            alone: Cell::new(0),
        }
    };
}

fn lock() -> MutexGuard<'static, Claims> {
    // Poisoned only by a panic inside this module's own short sections,
    // which leave the counts consistent.
    CLAIMS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on [`CHANGED`] while `blocked` holds, panicking after [`PATIENCE`].
fn wait_while(
    mut c: MutexGuard<'static, Claims>,
    what: &str,
    blocked: impl Fn(&Claims) -> bool,
) -> MutexGuard<'static, Claims> {
    let deadline = Instant::now() + PATIENCE;
    while blocked(&c) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "spate_testkit::serial: waited {PATIENCE:?} for {what} (shared claims {:?}, alone {:#07b}); \
             a thread that never ends holds a claim, or a test holding `alone` waits on one that calls `shared`",
            c.shared,
            c.alone
        );
        c = CHANGED
            .wait_timeout(c, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    c
}

/// A shared claim on `resource` for the rest of the calling thread (the
/// test): waits while a test runs [`alone`] on it (or, for a thread that
/// holds no claim yet, waits to). Does nothing if this thread already holds
/// a claim on it. Panics inside [`alone`] on other resources: take every
/// claim before.
pub fn shared(resource: Resource) {
    let bit = resource.bit();
    MINE.with(|mine| {
        if (mine.shared.get() | mine.alone.get()) & bit != 0 {
            return;
        }
        assert!(
            mine.alone.get() == 0,
            "spate_testkit::serial: a shared claim on {resource:?} inside `alone` on other \
             resources; claim it before `alone`"
        );
        let fresh = mine.shared.get() == 0;
        let mut c = wait_while(lock(), "a shared claim", |c| {
            c.alone & bit != 0 || (fresh && c.waiting_in(bit))
        });
        c.add_shared(bit, 1);
        mine.shared.set(mine.shared.get() | bit);
    });
}

/// Held by a test that runs alone on some resources: no other thread holds a
/// claim on them until it drops.
#[must_use = "the test runs alone only while the guard lives"]
pub struct Alone {
    /// The resources this guard took (none for a nested call they cover).
    bits: u8,
}

impl Drop for Alone {
    fn drop(&mut self) {
        if self.bits == 0 {
            return;
        }
        // The thread may be ending (the guard dropped during its unwinding
        // after its thread-locals): the claim goes back regardless.
        let _ = MINE.try_with(|mine| mine.alone.set(mine.alone.get() & !self.bits));
        lock().alone &= !self.bits;
        CHANGED.notify_all();
    }
}

/// Waits until no other thread holds a claim on `resources`, then keeps
/// every new claim on them out until the guard drops. The thread's own
/// shared claims are given up while it waits and taken back with it.
/// Nested, on resources the thread already runs alone on, it returns a guard
/// that does nothing; on others it panics (take them all at once).
pub fn alone(resources: &[Resource]) -> Alone {
    let bits = mask(resources);
    MINE.with(|mine| {
        if mine.alone.get() != 0 {
            assert!(
                bits & !mine.alone.get() == 0,
                "spate_testkit::serial: `alone` on {resources:?} inside `alone` on other resources; \
                 take them all at once"
            );
            return Alone { bits: 0 };
        }
        let mut c = lock();
        let held = mine.shared.get();
        c.add_shared(held, -1);
        mine.shared.set(0);
        CHANGED.notify_all();
        for i in Claims::each(bits) {
            c.waiting[i] += 1;
        }
        let keep = held & !bits;
        let mut c = wait_while(c, "the other tests to finish (alone)", |c| {
            c.alone & (bits | keep) != 0 || c.shared_in(bits)
        });
        for i in Claims::each(bits) {
            c.waiting[i] -= 1;
        }
        c.alone |= bits;
        c.add_shared(keep, 1);
        mine.shared.set(keep);
        mine.alone.set(bits);
        Alone { bits }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::thread;

    use Resource::{ClickHouse, Kafka, Replicas};

    // One test: the claims are process-wide, and libtest runs this crate's
    // unit tests side by side.
    #[test]
    fn alone_excludes_claims_on_its_resources_and_nothing_else() {
        // Nested calls on one thread neither deadlock nor release early.
        shared(Kafka);
        shared(Kafka);
        shared(ClickHouse);
        {
            let _a = alone(&[Kafka]); // gives up the Kafka claim, keeps ClickHouse
            let _b = alone(&[Kafka]); // nested: nothing
            shared(Kafka); // covered by alone: nothing
            let c = lock();
            assert_eq!((c.alone, c.shared[Kafka as usize]), (Kafka.bit(), 0));
            assert_eq!(c.shared[ClickHouse as usize], 1);
        }
        assert_eq!(lock().alone, 0);
        // A claim inside `alone` on another resource is refused.
        let refused = thread::spawn(|| {
            let _a = alone(&[Replicas]);
            shared(Kafka);
        })
        .join();
        assert!(refused.is_err());

        // Shared claims overlap; alone overlaps nothing on its resource, and
        // claims on other resources overlap it.
        let on_kafka = Arc::new(AtomicUsize::new(0));
        let beside_alone = Arc::new(AtomicUsize::new(0));
        let other_beside_alone = Arc::new(AtomicUsize::new(0));
        let alone_now = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(12));
        let threads: Vec<_> = (0..12)
            .map(|i| {
                let (on_kafka, beside_alone, other_beside_alone, alone_now, start) = (
                    on_kafka.clone(),
                    beside_alone.clone(),
                    other_beside_alone.clone(),
                    alone_now.clone(),
                    start.clone(),
                );
                thread::spawn(move || {
                    start.wait();
                    match i % 4 {
                        0 => {
                            shared(ClickHouse); // kept across the alone below
                            let _alone = alone(&[Kafka]);
                            alone_now.fetch_add(1, Ordering::SeqCst);
                            let n = on_kafka.fetch_add(1, Ordering::SeqCst);
                            beside_alone.fetch_max(n, Ordering::SeqCst);
                            thread::sleep(Duration::from_millis(40));
                            on_kafka.fetch_sub(1, Ordering::SeqCst);
                            alone_now.fetch_sub(1, Ordering::SeqCst);
                        }
                        1 | 2 => {
                            shared(Kafka);
                            on_kafka.fetch_add(1, Ordering::SeqCst);
                            thread::sleep(Duration::from_millis(20));
                            on_kafka.fetch_sub(1, Ordering::SeqCst);
                        }
                        _ => {
                            shared(Replicas);
                            for _ in 0..20 {
                                if alone_now.load(Ordering::SeqCst) > 0 {
                                    other_beside_alone.fetch_add(1, Ordering::SeqCst);
                                }
                                thread::sleep(Duration::from_millis(10));
                            }
                        }
                    }
                    // The shared claims go back as the thread ends.
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(beside_alone.load(Ordering::SeqCst), 0);
        assert!(other_beside_alone.load(Ordering::SeqCst) > 0);
        let c = lock();
        assert_eq!(c.alone, 0);
        assert_eq!(c.waiting, [0; 5]);
        // This thread still holds its ClickHouse claim.
        assert_eq!(c.shared, [1, 0, 0, 0, 0]);
    }
}
