//! Shrinking a failing run to a minimal fault schedule (issue 4).
//!
//! A run is a seed (workload, timings, every random choice) plus a fault
//! schedule. Two shrinkers work over the same harness and oracles:
//!
//! - **proptest state machine** ([`FaultSchedule`], [`ScheduleTest`]): the
//!   reference machine's state is the run's configuration and each transition
//!   is one fault event. proptest generates schedules, and when one breaks an
//!   oracle it shrinks by deleting transitions, simplifying each (earlier,
//!   shorter, lower kinds and targets) and simplifying the base seed. Failures
//!   of the test suite's property are persisted under
//!   `verify/proptest-regressions/` and replayed first on the next run.
//! - **[`minimize`]**: a deterministic greedy pass from any failing
//!   configuration (a campaign's seed, or proptest's result): drop faults one
//!   at a time, then halve durations, until neither step keeps the failure.
//!   Its result is 1-minimal: removing any one remaining fault makes the run
//!   pass (or fail differently).
//!
//! Shrinking keeps the *same* broken oracle as the original failure, so it
//! cannot slide from one bug to another on the way down.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use spate_sim::config::{Delivery, Fault, FaultKind, SimConfig, schedule_spec};

use crate::{Violation, run_and_check_config};

/// A shrunk failure: the base seed, the minimal schedule, what it breaks, and
/// what shrinking cost.
#[derive(Debug)]
pub struct Shrunk {
    /// The base seed (workload and random choices).
    pub seed: u64,
    /// The run's delivery mode (kept while shrinking).
    pub delivery: Delivery,
    /// The minimal fault schedule.
    pub faults: Vec<Fault>,
    /// The violations the minimal run shows (the original oracle among them).
    pub violations: Vec<Violation>,
    /// Simulated runs spent shrinking.
    pub runs: u64,
    /// Wall time spent, from the first failing run to the minimal one (the
    /// proptest search, when there was one, included).
    pub elapsed: Duration,
}

impl Shrunk {
    /// The one line that replays the minimal run exactly.
    pub fn replay_line(&self) -> String {
        format!(
            "{} --faults '{}'",
            crate::replay_line_mode(self.seed, self.delivery),
            schedule_spec(&self.faults)
        )
    }
}

/// The violations of `cfg`'s run if it breaks `oracle` (any oracle when
/// `None`), else `None`.
fn breaks(cfg: SimConfig, oracle: Option<&str>) -> Option<Vec<Violation>> {
    let (_, r) = run_and_check_config(cfg);
    let hit = match oracle {
        Some(o) => r.violations.iter().any(|v| v.oracle == o),
        None => !r.violations.is_empty(),
    };
    hit.then_some(r.violations)
}

/// Shrinks the failing run `cfg` to a 1-minimal schedule of the same broken
/// oracle. Returns `None` when `cfg`'s run holds every oracle.
pub fn minimize(cfg: SimConfig) -> Option<Shrunk> {
    let started = Instant::now();
    let (seed, delivery) = (cfg.seed, cfg.delivery);
    let mut faults = cfg.faults.clone();
    let mut violations = breaks(cfg, None)?;
    let oracle = violations[0].oracle;
    let mut runs = 1;
    let mut attempt = |faults: &[Fault]| {
        runs += 1;
        let cfg = SimConfig::with_faults(seed, faults.to_vec()).with_delivery(delivery);
        breaks(cfg, Some(oracle))
    };
    loop {
        let mut changed = false;
        // Drop one fault at a time, to a fixpoint.
        let mut i = 0;
        while i < faults.len() {
            let mut fewer = faults.clone();
            fewer.remove(i);
            if let Some(v) = attempt(&fewer) {
                faults = fewer;
                violations = v;
                changed = true;
            } else {
                i += 1;
            }
        }
        // Halve each duration while the failure stays.
        for i in 0..faults.len() {
            loop {
                let shorter = faults[i].duration / 2;
                if shorter < Duration::from_millis(10) {
                    break;
                }
                let mut t = faults.clone();
                t[i].duration = shorter;
                match attempt(&t) {
                    Some(v) => {
                        faults = t;
                        violations = v;
                        changed = true;
                    }
                    None => break,
                }
            }
        }
        if !changed {
            break;
        }
    }
    Some(Shrunk {
        seed,
        delivery,
        faults,
        violations,
        runs,
        elapsed: started.elapsed(),
    })
}

/// The reference state machine: a run's configuration whose schedule grows by
/// one fault event per transition.
#[derive(Debug)]
pub struct FaultSchedule;

/// One fault event: any kind, starting inside the fault phase and healing by
/// its end, on any target.
pub fn fault_strategy(fault_phase: Duration) -> BoxedStrategy<Fault> {
    let phase = fault_phase.as_millis() as u64;
    (
        proptest::sample::select(FaultKind::ALL.to_vec()),
        100..phase - 500,
        100u64..3_000,
        0usize..64,
        0usize..64,
    )
        .prop_map(move |(kind, start, duration, target, target2)| Fault {
            kind,
            target,
            target2,
            start: Duration::from_millis(start),
            duration: Duration::from_millis(duration.min(phase - start)),
        })
        .boxed()
}

impl ReferenceStateMachine for FaultSchedule {
    type State = SimConfig;
    type Transition = Fault;

    fn init_state() -> BoxedStrategy<SimConfig> {
        any::<u64>()
            .prop_map(|seed| SimConfig::with_faults(seed, Vec::new()))
            .boxed()
    }

    fn transitions(state: &SimConfig) -> BoxedStrategy<Fault> {
        fault_strategy(state.fault_phase)
    }

    fn apply(mut state: SimConfig, fault: &Fault) -> SimConfig {
        state.faults.push(fault.clone());
        state.faults.sort_by_key(|f| (f.start, f.kind));
        state
    }
}

/// The system under test: the schedule handed to the real harness, which
/// runs once the whole schedule is known (faults are timed events of one
/// run, not steps taken one by one); `teardown` runs it and asserts every
/// oracle.
#[derive(Debug)]
pub struct ScheduleTest;

impl StateMachineTest for ScheduleTest {
    type SystemUnderTest = Vec<Fault>;
    type Reference = FaultSchedule;

    fn init_test(_: &SimConfig) -> Vec<Fault> {
        Vec::new()
    }

    fn apply(mut faults: Vec<Fault>, _: &SimConfig, fault: Fault) -> Vec<Fault> {
        faults.push(fault);
        faults
    }

    /// Runs the schedule and asserts every oracle; a failure's message ends
    /// in the one line that replays this exact run (proptest shows the
    /// message of the minimal case it shrank to).
    fn teardown(faults: Vec<Fault>, state: SimConfig) {
        let cfg = SimConfig::with_faults(state.seed, faults);
        let replay = format!(
            "{} --faults '{}'",
            crate::replay_line_mode(cfg.seed, cfg.delivery),
            schedule_spec(&cfg.faults)
        );
        let (_, r) = run_and_check_config(cfg);
        assert!(
            r.violations.is_empty(),
            "seed {} broke {:?}\nreplay: {replay}\n",
            state.seed,
            r.violations
        );
    }
}

/// Searches `cases` proptest-generated schedules (a deterministic proptest
/// RNG, so the search itself replays), shrinks the first failure with
/// proptest's state-machine shrinker and then [`minimize`]. `None` when every
/// case held.
pub fn search_and_shrink(cases: u32, max_faults: usize) -> Option<Shrunk> {
    let started = Instant::now();
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = FaultSchedule::sequential_strategy(1..=max_faults);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let result = runner.run(&strategy, move |(state, faults, seen)| {
        counted.fetch_add(1, Ordering::Relaxed);
        // The harness uses every transition; tell the shrinker so (it deletes
        // unseen ones first).
        if let Some(seen) = seen {
            seen.fetch_add(faults.len(), Ordering::SeqCst);
        }
        let (_, r) = run_and_check_config(SimConfig::with_faults(state.seed, faults));
        match r.violations.first() {
            None => Ok(()),
            Some(v) => Err(TestCaseError::fail(format!("{}: {}", v.oracle, v.detail))),
        }
    });
    let (state, faults) = match result {
        Ok(()) => return None,
        Err(TestError::Fail(_, (state, faults, _))) => (state, faults),
        Err(TestError::Abort(why)) => panic!("proptest aborted the schedule search: {why}"),
    };
    let mut shrunk = minimize(SimConfig::with_faults(state.seed, faults))
        .expect("proptest's minimal failing schedule fails again (D7: runs are deterministic)");
    shrunk.runs += runs.load(Ordering::Relaxed) as u64;
    shrunk.elapsed = started.elapsed();
    Some(shrunk)
}
