//! The simulator's speed: how many seeds a fault campaign gets through per
//! second, and how much simulated time that is (docs/BENCHMARKS.md, docs/VERIFICATION.md).
//!
//! One iteration runs and judges seeds `0..SEEDS` with
//! [`spate_verify::run_and_check`], exactly as `spate-verify campaign` does
//! per seed (the simulated run of `spate_sim::harness::run_seed`, then every
//! oracle). Throughput is in seeds, so criterion's `elem/s` is seeds/s.
//!
//! Simulated seconds per second: each seed covers a different stretch of
//! simulated time (its production window, faults and liveness phase), fixed
//! by the seed (D7). Criterion takes one throughput per bench, and a second
//! bench with "simulated milliseconds" as its element would run the same
//! seeds again for a number that moves exactly with this one. So the bench
//! times its own iterations (`iter_custom`), adds up the simulated time the
//! seeds report, and prints seeds/s and simulated s per s (over every
//! iteration it ran, warm-up included) after criterion's own lines.
//!
//! Time is the bench thread's CPU time ([`cpu_time::CpuTime`]; a simulated
//! run is single-threaded: a current-thread runtime, the pipeline run
//! inline), so seeds/s is per core and the other load on the shared machine
//! stays mostly out of it. The printed lines give both: per CPU second and
//! per wall second.
//!
//! A seed runs in a few milliseconds, so the iteration is long: flat
//! sampling, few samples. `SPATE_BENCH_QUICK=1` shortens the measurement.

use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use spate_verify::run_and_check;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::{CpuTime, thread_cpu};

/// Seeds per iteration: `0..SEEDS`, the start of CI's fixed campaign.
const SEEDS: u64 = 16;

fn sim(c: &mut Criterion<CpuTime>) {
    let quick = std::env::var_os("SPATE_BENCH_QUICK").is_some_and(|v| v != "0");
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(SEEDS));
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(if quick { 300 } else { 1000 }));
    g.measurement_time(Duration::from_millis(if quick { 2000 } else { 5000 }));

    let wall = Cell::new(Duration::ZERO);
    let cpu = Cell::new(Duration::ZERO);
    let simulated = Cell::new(Duration::ZERO);
    let seeds = Cell::new(0u64);
    g.bench_function("seeds", |b| {
        b.iter_custom(|iters| {
            let mut sim = Duration::ZERO;
            let start = Instant::now();
            let cpu_start = thread_cpu();
            for _ in 0..iters {
                for seed in 0..SEEDS {
                    let (outcome, result) = run_and_check(seed);
                    assert!(
                        result.violations.is_empty(),
                        "seed {seed} breaks an oracle: {:?}",
                        result.violations
                    );
                    sim += result.simulated;
                    black_box(outcome);
                }
            }
            let on_cpu = thread_cpu().saturating_sub(cpu_start);
            wall.set(wall.get() + start.elapsed());
            cpu.set(cpu.get() + on_cpu);
            simulated.set(simulated.get() + sim);
            seeds.set(seeds.get() + iters * SEEDS);
            on_cpu
        });
    });
    g.finish();

    let simulated = simulated.get().as_secs_f64();
    let n = seeds.get() as f64;
    for (what, d) in [("CPU", cpu.get()), ("wall", wall.get())] {
        let secs = d.as_secs_f64();
        if secs > 0.0 {
            println!(
                "sim: {n} seeds in {secs:.2} {what} s: {:.0} seeds/s, {:.0} simulated s per {what} s \
                 ({:.1} simulated s per seed)",
                n / secs,
                simulated / secs,
                simulated / n,
            );
        }
    }
}

fn main() {
    let mut c = Criterion::default()
        .with_measurement(CpuTime)
        .configure_from_args();
    sim(&mut c);
    c.final_summary();
}
