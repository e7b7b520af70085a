//! Proves the simulator-side oracles can fail: each of the simulator's
//! planted bugs ([`spate_sim::planted::SimBug`]) must be caught by its oracle
//! within 1,000 seeds. One test, so bugs are planted one at a time in this
//! process (and no other test of this binary runs beside a planted bug).

use spate_sim::planted::{SimBug, plant};
use spate_verify::Campaign;

/// The oracle each planted bug must break.
fn oracle_for(bug: SimBug) -> &'static str {
    match bug {
        SimBug::Nondeterminism => "D7 determinism",
        SimBug::GapSkipsRecord => "D1 at-least-once",
        SimBug::IgnoreSchemaChange | SimBug::PositionalColumns => "values",
    }
}

#[test]
fn planted_sim_bugs_are_caught() {
    let _planting = crate::planting();
    let mut missed = Vec::new();
    for bug in SimBug::ALL {
        plant(Some(bug));
        let want = oracle_for(bug);
        // A campaign over 0..1000 (seed by seed, stopping at the first catch).
        let caught = (0..1_000).find(|&seed| {
            let c = Campaign::run(seed, 1);
            c.failures
                .iter()
                .any(|f| f.violations.iter().any(|v| v.oracle == want))
        });
        match caught {
            Some(seed) => println!("{bug:?}: caught by `{want}` at seed {seed}"),
            None => missed.push(bug),
        }
    }
    plant(None);
    assert!(
        missed.is_empty(),
        "not caught within 1,000 seeds: {missed:?}"
    );
    // Unplanted, the determinism check passes on a re-run seed.
    let c = Campaign::run(0, 1);
    assert_eq!(c.rechecked, 1);
    assert!(c.failures.is_empty(), "{}", c.summary());
}
