//! Proves the oracles can fail: each planted bug (spate-core's `planted-bugs`
//! feature) must be caught by some oracle within 1,000 seeds, in the
//! delivery mode whose path it sits on (`Bug::effectively_once`: the
//! write-ahead record, the replay of recorded ranges and the range token
//! are judged in `effectively_once` runs, by D9 and D4).

use spate_core::planted::{Bug, plant};
use spate_sim::config::{Delivery, SimConfig};
use spate_verify::run_and_check_config;

/// The first seed (of 0..1000) whose run in `delivery` breaks an oracle,
/// with the oracle.
fn first_caught(delivery: Delivery) -> Option<(u64, &'static str)> {
    (0..1_000).find_map(|seed| {
        let cfg = SimConfig::from_seed(seed).with_delivery(delivery);
        let (_, r) = run_and_check_config(cfg);
        r.violations.first().map(|v| (seed, v.oracle))
    })
}

fn delivery_of(bug: Bug) -> Delivery {
    if bug.effectively_once() {
        Delivery::EffectivelyOnce
    } else {
        Delivery::AtLeastOnce
    }
}

#[test]
fn planted_bugs_are_caught() {
    // One test, so bugs are planted one at a time; `planting` keeps the
    // other planted-bug tests of this binary out meanwhile.
    let _planting = crate::planting();
    let mut missed = Vec::new();
    for bug in Bug::ALL {
        plant(Some(bug));
        let delivery = delivery_of(bug);
        match first_caught(delivery) {
            Some((seed, oracle)) => {
                println!(
                    "{bug:?} ({}): caught by `{oracle}` at seed {seed}",
                    delivery.as_str()
                )
            }
            None => missed.push(bug),
        }
    }
    plant(None);
    assert!(
        missed.is_empty(),
        "no oracle caught {missed:?} within 1,000 seeds"
    );
    // And with nothing planted, the first seeds pass in either mode (the
    // oracles are not just always failing).
    for delivery in [Delivery::AtLeastOnce, Delivery::EffectivelyOnce] {
        for seed in 0..20 {
            let (_, r) = run_and_check_config(SimConfig::from_seed(seed).with_delivery(delivery));
            assert!(
                r.violations.is_empty(),
                "seed {seed} ({}): {:?}",
                delivery.as_str(),
                r.violations
            );
        }
    }
}
