//! proptest state-machine test over fault schedules (issue 4): the reference
//! machine's transitions are fault events ([`FaultSchedule`]); each generated
//! schedule runs through the real engine in the simulator and must hold every
//! oracle (D1, D4, D5, D6, D8, liveness). A failure shrinks to a minimal
//! schedule and is persisted in `verify/proptest-regressions/schedules.txt`,
//! which is committed and replayed first on every later run.
//!
//! The schedules are drawn from a fresh random seed on every run, in CI too,
//! on purpose: the fixed campaigns (`campaign.rs`, ci/test.sh's 20000 seeds)
//! only run each seed's own schedule, and this search over other schedules
//! for the same seeds is how a schema change on an identity-only table was
//! found losing rows (`schedule_regressions.rs`). A failure is therefore a
//! new bug, not noise: the simulator is deterministic (D7), and the panic
//! message of the minimal case ends in the one `replay:` line that
//! reproduces it exactly. Add that run to `schedule_regressions.rs` with the
//! fix it led to.
//!
//! [`FaultSchedule`]: spate_verify::shrink::FaultSchedule

use proptest::test_runner::{Config, FileFailurePersistence};
use proptest_state_machine::prop_state_machine;
use spate_verify::shrink::ScheduleTest;

prop_state_machine! {
    #![proptest_config(Config {
        // Each case is a whole simulated run (debug build: tens of ms);
        // ci/test.sh's campaign covers thousands of seeded schedules more.
        cases: 64,
        // The committed file the module doc names (proptest's default
        // would write `tests/schedules.proptest-regressions` instead).
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/schedules.txt"
        ))),
        ..Config::default()
    })]

    #[test]
    fn generated_fault_schedules_hold_every_invariant(sequential 1..8 => ScheduleTest);
}
