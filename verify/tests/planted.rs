//! Proves the oracles can fail: each planted bug (spate-core's `planted-bugs`
//! feature) must be caught by some oracle within 1,000 seeds.

use spate_core::planted::{Bug, plant};
use spate_verify::run_and_check;

/// The first seed (of 0..1000) whose run breaks an oracle, with the oracle.
fn first_caught() -> Option<(u64, &'static str)> {
    (0..1_000).find_map(|seed| {
        let (_, r) = run_and_check(seed);
        r.violations.first().map(|v| (seed, v.oracle))
    })
}

#[test]
fn planted_bugs_are_caught() {
    // One test, so bugs are planted one at a time in this process.
    let mut missed = Vec::new();
    for bug in Bug::ALL {
        plant(Some(bug));
        match first_caught() {
            Some((seed, oracle)) => println!("{bug:?}: caught by `{oracle}` at seed {seed}"),
            None => missed.push(bug),
        }
    }
    plant(None);
    assert!(
        missed.is_empty(),
        "no oracle caught {missed:?} within 1,000 seeds"
    );
    // And with nothing planted, the first seeds pass (the oracles are not
    // just always failing).
    for seed in 0..20 {
        let (_, r) = run_and_check(seed);
        assert!(r.violations.is_empty(), "seed {seed}: {:?}", r.violations);
    }
}
