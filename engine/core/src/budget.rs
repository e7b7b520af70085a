//! The in-flight budget (D8): bytes and rows taken by the chain before a chunk
//! is queued, given back when the batch holding it settles.
//!
//! Pipeline threads only ever [`Budget::try_acquire`] (D2): when the budget is
//! exhausted they keep their pending chunk, pause the lane and keep polling.
//! A [`BudgetPermit`] gives its share back when dropped, so a batch that is
//! delivered, abandoned or aborted returns its bytes whichever way it ends.
//!
//! One exception keeps a single oversized chunk from wedging the pipeline: when
//! nothing at all is in flight, any one acquisition succeeds. In-flight data is
//! therefore bounded by `max(max_bytes, largest chunk)`.
//!
//! Lock-free (two atomics, compare-and-swap); modelled by loom in
//! `tests/loom_models.rs`.

use std::fmt;

use crate::sync::{Arc, AtomicU64, Ordering};

/// The shared in-flight budget: at most `max_bytes` bytes and `max_rows` rows.
pub struct Budget {
    max_bytes: u64,
    max_rows: u64,
    bytes: AtomicU64,
    rows: AtomicU64,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("max_bytes", &self.max_bytes)
            .field("max_rows", &self.max_rows)
            .field("bytes", &self.bytes_in_use())
            .field("rows", &self.rows_in_use())
            .finish()
    }
}

impl Budget {
    /// A budget of `max_bytes` bytes and `max_rows` rows in flight. Both must be
    /// positive (the config layer rejects 0 with the key's name).
    pub fn new(max_bytes: u64, max_rows: u64) -> Arc<Self> {
        assert!(max_bytes > 0, "budget max_bytes must be positive");
        assert!(max_rows > 0, "budget max_rows must be positive");
        Arc::new(Self {
            max_bytes,
            max_rows,
            bytes: AtomicU64::new(0),
            rows: AtomicU64::new(0),
        })
    }

    /// Takes `bytes` and `rows` if they fit (or if nothing is in flight), never
    /// waiting. `None` means: keep the chunk, pause, try again later.
    #[cfg(not(loom))]
    pub fn try_acquire(self: &Arc<Self>, bytes: u64, rows: u64) -> Option<BudgetPermit> {
        Self::acquire(self, bytes, rows)
    }

    /// Under `--cfg loom`: the same, as an associated function, because loom's
    /// `Arc` cannot be a method receiver on stable Rust. Call it as
    /// `Budget::try_acquire(&budget, bytes, rows)`, which also compiles
    /// without loom.
    #[cfg(loom)]
    pub fn try_acquire(budget: &Arc<Self>, bytes: u64, rows: u64) -> Option<BudgetPermit> {
        Self::acquire(budget, bytes, rows)
    }

    fn acquire(budget: &Arc<Self>, bytes: u64, rows: u64) -> Option<BudgetPermit> {
        if !take(&budget.bytes, bytes, budget.max_bytes) {
            return None;
        }
        if !take(&budget.rows, rows, budget.max_rows) {
            budget.bytes.fetch_sub(bytes, Ordering::AcqRel);
            return None;
        }
        Some(BudgetPermit {
            budget: Some(Arc::clone(budget)),
            bytes,
            rows,
        })
    }

    /// Bytes currently in flight.
    pub fn bytes_in_use(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Rows currently in flight.
    pub fn rows_in_use(&self) -> u64 {
        self.rows.load(Ordering::Acquire)
    }

    /// The byte limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The row limit.
    pub fn max_rows(&self) -> u64 {
        self.max_rows
    }
}

/// Adds `amount` to `used` if the sum stays within `max`, or if `used` is 0
/// (the oversized-chunk exception).
fn take(used: &AtomicU64, amount: u64, max: u64) -> bool {
    let mut current = used.load(Ordering::Acquire);
    loop {
        let next = current.saturating_add(amount);
        if current != 0 && next > max && !crate::planted::active(crate::planted::Bug::BudgetIgnored)
        {
            return false;
        }
        match used.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(seen) => current = seen,
        }
    }
}

/// A share of the budget; returned when dropped.
///
/// Permits merge ([`BudgetPermit::merge`]) as chunks merge into a batch, so a
/// sealed batch holds one permit for all its bytes.
pub struct BudgetPermit {
    budget: Option<Arc<Budget>>,
    bytes: u64,
    rows: u64,
}

impl fmt::Debug for BudgetPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BudgetPermit({} bytes, {} rows)", self.bytes, self.rows)
    }
}

impl BudgetPermit {
    /// A permit tied to no budget, for tests and sources that do their own
    /// accounting. Holds nothing back.
    pub fn unbounded() -> Self {
        Self {
            budget: None,
            bytes: 0,
            rows: 0,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Rows held.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Splits off a permit for up to `bytes` and `rows` of this one's share
    /// (as much as it holds), from the same budget.
    pub fn split(&mut self, bytes: u64, rows: u64) -> BudgetPermit {
        let (bytes, rows) = (bytes.min(self.bytes), rows.min(self.rows));
        self.bytes -= bytes;
        self.rows -= rows;
        BudgetPermit {
            budget: self.budget.clone(),
            bytes,
            rows,
        }
    }

    /// Takes over `other`'s share. Both must come from the same budget (or
    /// either be unbounded).
    pub fn merge(&mut self, mut other: BudgetPermit) {
        match (&self.budget, other.budget.take()) {
            (_, None) => {
                debug_assert_eq!(other.bytes + other.rows, 0);
            }
            (None, Some(b)) => {
                debug_assert_eq!(self.bytes + self.rows, 0);
                self.budget = Some(b);
            }
            (Some(a), Some(b)) => {
                assert!(Arc::ptr_eq(a, &b), "permits from different budgets");
            }
        }
        self.bytes += other.bytes;
        self.rows += other.rows;
        other.bytes = 0;
        other.rows = 0;
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            let b = budget.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
            let r = budget.rows.fetch_sub(self.rows, Ordering::AcqRel);
            debug_assert!(b >= self.bytes, "budget bytes underflow");
            debug_assert!(r >= self.rows, "budget rows underflow");
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_split_permit_returns_its_share_when_dropped() {
        let b = Budget::new(100, 10);
        let mut p = b.try_acquire(60, 6).unwrap();
        let q = p.split(40, 10);
        assert_eq!((q.bytes(), q.rows()), (40, 6));
        assert_eq!((p.bytes(), p.rows()), (20, 0));
        drop(q);
        assert_eq!(b.bytes_in_use(), 20);
        drop(p);
        assert_eq!(b.bytes_in_use(), 0);
    }

    #[test]
    fn acquire_within_limits_and_release_on_drop() {
        let b = Budget::new(100, 10);
        let p1 = b.try_acquire(60, 5).unwrap();
        assert!(b.try_acquire(50, 1).is_none(), "bytes over budget");
        let p2 = b.try_acquire(40, 5).unwrap();
        assert!(b.try_acquire(0, 1).is_none(), "rows over budget");
        assert_eq!(b.bytes_in_use(), 100);
        drop(p1);
        drop(p2);
        assert_eq!((b.bytes_in_use(), b.rows_in_use()), (0, 0));
    }

    #[test]
    fn failed_row_take_rolls_back_bytes() {
        let b = Budget::new(100, 1);
        let _p = b.try_acquire(10, 1).unwrap();
        assert!(b.try_acquire(10, 1).is_none());
        assert_eq!(b.bytes_in_use(), 10);
    }

    #[test]
    fn oversized_chunk_passes_alone() {
        let b = Budget::new(100, 10);
        let big = b.try_acquire(1_000, 1).expect("alone it fits");
        assert!(b.try_acquire(1, 1).is_none());
        drop(big);
        assert_eq!(b.bytes_in_use(), 0);
    }

    #[test]
    fn merged_permits_release_together() {
        let b = Budget::new(100, 10);
        let mut p = b.try_acquire(10, 1).unwrap();
        p.merge(b.try_acquire(20, 2).unwrap());
        assert_eq!(b.bytes_in_use(), 30);
        drop(p);
        assert_eq!(b.bytes_in_use(), 0);
    }
}
