//! Tests of one binary that must not overlap, and the ones that may.
//!
//! Each crate's integration tests are one test binary (`tests/it/`), so tests
//! of different modules run side by side on libtest's threads. Most of them
//! share what they use happily (the ClickHouse and Kafka servers ci/test.sh
//! starts, each test on its own tables and topics). A few cannot: a test that
//! freezes a shared server (SIGSTOP) or kills a broker would fail every other
//! test on it meanwhile, one that installs a process-wide `metrics` recorder
//! and reads an unlabeled counter would count other tests' events, and some
//! need both cores to keep their deadlines. Those take [`alone`]; every test
//! that uses what they disturb takes [`shared`] first, in practice through
//! the helper that hands it the server (e.g. `clickhouse_url()` in
//! `engine/spate/tests/it/common`).
//!
//! - [`alone`] waits until no other thread holds a claim and keeps new ones
//!   out until its guard drops. Waiting claims of [`alone`] go first: once
//!   one waits, new [`shared`] claims wait behind it, so it cannot starve.
//! - [`shared`] holds a shared claim until the calling thread ends. libtest
//!   runs every test on a thread of its own (with `--test-threads=1` too), so
//!   that is the end of the test, however it ends (a panic included); the
//!   claim needs no guard the test could drop too early or forget to hold.
//!   Called again on the same thread, or inside [`alone`] on it, it does
//!   nothing.
//!
//! A test that holds [`alone`] must not wait on another thread that calls
//! [`shared`] (it would wait forever): the tests that take [`alone`] do their
//! work on their own thread, or on threads that take no claim.
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

/// Who holds what, process-wide.
#[derive(Default)]
struct Claims {
    /// Threads holding a [`shared`] claim.
    shared: usize,
    /// Whether an [`Alone`] guard is alive.
    alone: bool,
    /// Callers of [`alone`] still waiting (they go before new shared claims).
    waiting_alone: usize,
}

static CLAIMS: Mutex<Claims> = Mutex::new(Claims {
    shared: 0,
    alone: false,
    waiting_alone: 0,
});
static CHANGED: Condvar = Condvar::new();

/// This thread's claim.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mine {
    None,
    Shared,
    Alone,
}

/// Gives the thread's shared claim back when the thread ends.
struct ThreadClaim(Cell<Mine>);

impl Drop for ThreadClaim {
    fn drop(&mut self) {
        if self.0.get() == Mine::Shared {
            let mut c = lock();
            c.shared -= 1;
            drop(c);
            CHANGED.notify_all();
        }
    }
}

thread_local! {
    static MINE: ThreadClaim = const { ThreadClaim(Cell::new(Mine::None)) };
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
            "spate_testkit::serial: waited {PATIENCE:?} for {what} ({} shared claims, alone: {}); \
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

/// A shared claim for the rest of the calling thread (the test): waits while
/// a test runs [`alone`] or waits to. Does nothing if this thread already
/// holds a claim.
pub fn shared() {
    MINE.with(|mine| {
        if mine.0.get() != Mine::None {
            return;
        }
        let mut c = wait_while(lock(), "a shared claim", |c| c.alone || c.waiting_alone > 0);
        c.shared += 1;
        mine.0.set(Mine::Shared);
    });
}

/// Held by a test that runs alone: no thread but the holder's holds a claim
/// until it drops.
#[must_use = "the test runs alone only while the guard lives"]
pub struct Alone {
    /// Whether this guard took the claim (not a nested call on a thread that
    /// already ran alone).
    outer: bool,
}

impl Drop for Alone {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        // The thread may be ending (the guard dropped during its unwinding
        // after its thread-locals): the claim goes back regardless.
        let _ = MINE.try_with(|mine| mine.0.set(Mine::None));
        lock().alone = false;
        CHANGED.notify_all();
    }
}

/// Waits until no other thread holds a claim (giving up this thread's own
/// shared claim first), then keeps every new claim out until the guard drops.
/// Nested on a thread that already runs alone, it returns a guard that does
/// nothing.
pub fn alone() -> Alone {
    MINE.with(|mine| {
        let mut c = lock();
        match mine.0.get() {
            Mine::Alone => return Alone { outer: false },
            Mine::Shared => {
                c.shared -= 1;
                mine.0.set(Mine::None);
                CHANGED.notify_all();
            }
            Mine::None => {}
        }
        c.waiting_alone += 1;
        let mut c = wait_while(c, "the other tests to finish (alone)", |c| {
            c.alone || c.shared > 0
        });
        c.waiting_alone -= 1;
        c.alone = true;
        mine.0.set(Mine::Alone);
        Alone { outer: true }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::thread;

    // One test: the claims are process-wide, and libtest runs this crate's
    // unit tests side by side.
    #[test]
    fn alone_excludes_shared_claims_and_other_alone_holders() {
        // Nested calls on one thread neither deadlock nor release early.
        shared();
        shared();
        {
            let _a = alone(); // gives up this thread's shared claim first
            let _b = alone(); // nested: nothing
            shared(); // inside alone: nothing
            assert!(lock().alone);
        }
        assert!(!lock().alone);
        assert_eq!(lock().shared, 0);

        // Shared claims overlap; alone overlaps nothing.
        let inside = Arc::new(AtomicUsize::new(0));
        let max_beside_alone = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (inside, max_beside_alone, start) =
                    (inside.clone(), max_beside_alone.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    if i % 4 == 0 {
                        let _alone = alone();
                        let n = inside.fetch_add(1, Ordering::SeqCst);
                        max_beside_alone.fetch_max(n, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(30));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    } else {
                        shared();
                        inside.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(30));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                    // The shared claim goes back as the thread ends.
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(max_beside_alone.load(Ordering::SeqCst), 0);
        let c = lock();
        assert_eq!((c.shared, c.alone, c.waiting_alone), (0, false, 0));
    }
}
