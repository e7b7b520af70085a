//! spate-verify's integration tests, one test binary (each module was a test
//! binary of its own), except the planted-bug tests: those plant a bug
//! process-wide and live in `tests/planted/`, so no test here ever runs
//! beside a planted bug.
//!
//! Run one module with a filter: `cargo test -p spate-verify --test it -- campaign::`.

mod campaign;
mod eo_regressions;
mod schedule_regressions;
mod schedules;
mod sim_eo;
