//! Shrinking works (issue 4): with a planted bug, proptest's state machine
//! finds a failing schedule, and the shrinkers reduce it to one where
//! removing any single fault makes the run pass; the shrunk run replays to
//! the same failure. Prints the time to shrink each bug.
//!
//! One test, so bugs are planted one at a time in this process.

use spate_core::planted::{Bug, plant};
use spate_sim::config::{SimConfig, schedule_spec};
use spate_verify::run_and_check_config;
use spate_verify::shrink::search_and_shrink;

/// Bugs that need a fault to show, with the fault kinds a minimal schedule
/// must then consist of.
const BUGS: [Bug; 4] = [
    Bug::TokenReusedAfterRestart,
    Bug::DrainDropsPartialBatch,
    Bug::CommitReleasedEpoch,
    Bug::TimeoutIsSuccess,
];

#[test]
fn planted_bugs_shrink_to_one_minimal_schedules() {
    let _planting = crate::planting();
    for bug in BUGS {
        plant(Some(bug));
        let shrunk = search_and_shrink(300, 6)
            .unwrap_or_else(|| panic!("{bug:?}: no generated schedule of 300 broke an oracle"));
        let oracle = shrunk.violations[0].oracle;
        println!(
            "{bug:?}: `{oracle}` shrunk to `{}` in {} runs, {:.2} s",
            schedule_spec(&shrunk.faults),
            shrunk.runs,
            shrunk.elapsed.as_secs_f64()
        );
        assert!(
            !shrunk.faults.is_empty(),
            "{bug:?} needs a fault to show, yet it shrank to none"
        );
        assert!(shrunk.faults.len() <= 2, "{bug:?}: {shrunk:?}");
        // The shrunk run replays to the same failure (D7).
        let again = SimConfig::with_faults(shrunk.seed, shrunk.faults.clone());
        let (_, r) = run_and_check_config(again);
        assert_eq!(r.violations, shrunk.violations, "{bug:?}: replay differs");
        // 1-minimal: without any one of its faults the oracle holds.
        for i in 0..shrunk.faults.len() {
            let mut fewer = shrunk.faults.clone();
            fewer.remove(i);
            let (_, r) = run_and_check_config(SimConfig::with_faults(shrunk.seed, fewer));
            assert!(
                r.violations.iter().all(|v| v.oracle != oracle),
                "{bug:?}: still breaks `{oracle}` without fault {i} of `{}`",
                schedule_spec(&shrunk.faults)
            );
        }
    }
    plant(None);
}
