//! Bugs planted in the simulator's own edges (the mapping stand-in and the
//! world), to prove that the oracles which judge them can fail: each must be
//! caught within 1,000 seeds (`verify/tests/planted/planted_sim.rs`). spate-core's
//! planted bugs (its `planted-bugs` feature) cover the engine; these cover
//! what the engine's seams hand it and what the simulator itself promises.
//!
//! Nothing is planted unless a test or `spate-verify --plant-sim` calls
//! [`plant`]; a check of an unplanted bug is one relaxed atomic load.

use std::sync::atomic::{AtomicU8, Ordering};

/// A bug the simulator can plant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimBug {
    /// Every world draws its random choices from a process-wide counter as
    /// well as its seed, so a re-run of a seed differs (breaks D7; the
    /// campaign's determinism check must catch it).
    Nondeterminism = 1,
    /// The consumer, skipping an offset gap, skips the record after it too
    /// (a source that loses a record at every gap: the D1 at-least-once
    /// oracle, which demands every record around a gap, must catch it).
    GapSkipsRecord = 2,
    /// The mapping ignores a schema change: it keeps writing the layout it
    /// probed, as RowBinary (no declared types), so the server reads the
    /// bytes under the new types (the value oracle must catch it).
    IgnoreSchemaChange = 3,
    /// The mapping writes record fields by position instead of by column
    /// name (the value oracle must catch it).
    PositionalColumns = 4,
}

impl SimBug {
    /// Every planted simulator bug, in declaration order.
    pub const ALL: [SimBug; 4] = [
        SimBug::Nondeterminism,
        SimBug::GapSkipsRecord,
        SimBug::IgnoreSchemaChange,
        SimBug::PositionalColumns,
    ];
}

static ACTIVE: AtomicU8 = AtomicU8::new(0);

/// Plants `bug` (or none) process-wide.
pub fn plant(bug: Option<SimBug>) {
    ACTIVE.store(bug.map_or(0, |b| b as u8), Ordering::Relaxed);
}

/// Whether `bug` is planted.
pub fn planted(bug: SimBug) -> bool {
    ACTIVE.load(Ordering::Relaxed) == bug as u8
}
