//! The planted-bug tests (each module was a test binary of its own): each
//! plants bugs through a process-wide switch (`spate_core::planted::plant`,
//! `spate_sim::planted::plant`), so this binary holds only them, away from
//! the tests of `tests/it/`, and each takes [`PLANTING`] so no two of them
//! run side by side.
//!
//! Run one with a filter: `cargo test -p spate-verify --test planted -- shrink_planted::`.

use std::sync::{Mutex, MutexGuard};

mod planted;
mod planted_sim;
mod shrink_planted;

/// Held by each test here for its whole run: a bug planted by one must never
/// be live while another runs.
static PLANTING: Mutex<()> = Mutex::new(());

/// Takes [`PLANTING`], then unplants both kinds of bug: a test that failed
/// with a bug planted (poisoning the lock) must not hand it to the next.
fn planting() -> MutexGuard<'static, ()> {
    let guard = PLANTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    spate_core::planted::plant(None);
    spate_sim::planted::plant(None);
    guard
}
