//! proptest state-machine test over fault schedules (issue 4): the reference
//! machine's transitions are fault events ([`FaultSchedule`]); each generated
//! schedule runs through the real engine in the simulator and must hold every
//! oracle (D1, D4, D5, D6, D8, liveness). A failure shrinks to a minimal
//! schedule and is persisted in `verify/proptest-regressions/`, which is
//! committed and replayed first on every later run.
//!
//! [`FaultSchedule`]: spate_verify::shrink::FaultSchedule

use proptest::test_runner::Config;
use proptest_state_machine::prop_state_machine;
use spate_verify::shrink::ScheduleTest;

prop_state_machine! {
    #![proptest_config(Config {
        // Each case is a whole simulated run (debug build: tens of ms);
        // ci/test.sh's campaign covers thousands of seeded schedules more.
        cases: 64,
        ..Config::default()
    })]

    #[test]
    fn generated_fault_schedules_hold_every_invariant(sequential 1..8 => ScheduleTest);
}
