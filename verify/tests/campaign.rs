//! A fixed campaign in the test suite (the large one runs from ci/test.sh with
//! the release binary), and the determinism check (D7): the same seed gives a
//! byte-identical trace.

use spate_verify::{Campaign, run_and_check};

#[test]
fn fixed_campaign_holds_every_invariant() {
    let c = Campaign::run(10_000, 100);
    assert!(c.failures.is_empty(), "{}", c.summary());
    assert_eq!(c.runs, 100);
    assert_eq!(c.rechecked, 1, "seed 10000 is re-run (D7)");
}

#[test]
fn same_seed_same_trace() {
    for seed in [0, 1, 2, 3, 5, 8, 13, 21, 34, 55] {
        let (a, ra) = run_and_check(seed);
        let (b, rb) = run_and_check(seed);
        assert_eq!(ra.trace_hash, rb.trace_hash, "seed {seed} diverged");
        assert_eq!(a.world.trace, b.world.trace, "seed {seed} diverged");
    }
}

#[test]
fn different_seeds_differ() {
    let (_, a) = run_and_check(1);
    let (_, b) = run_and_check(2);
    assert_ne!(a.trace_hash, b.trace_hash);
}
