//! `spate-verify`: run fault campaigns over the simulator and replay seeds.
//!
//! ```text
//! spate-verify campaign --seeds 2000 [--first 0]   # exit 1 if any seed fails
//! spate-verify replay 1234                          # trace + verdict of one seed
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use spate_verify::{Campaign, replay_line, run_and_check};

#[derive(Parser)]
#[command(about = "Fault campaigns and replays for spate's deterministic simulator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs seeds `first..first+seeds` and checks every oracle.
    Campaign {
        /// How many seeds.
        #[arg(long, default_value_t = 2000)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        first: u64,
        /// Fail unless every fault kind and every interesting combination
        /// was hit by at least this percentage of the runs.
        #[arg(long)]
        min_coverage: Option<f64>,
    },
    /// Runs one seed and prints its trace and verdict.
    Replay {
        /// The seed to replay.
        seed: u64,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Campaign {
            seeds,
            first,
            min_coverage,
        } => {
            #[allow(clippy::disallowed_methods)] // wall time of the campaign itself, not of a run
            let started = Instant::now();
            let c = Campaign::run(first, seeds);
            let wall = started.elapsed().as_secs_f64();
            print!("{}", c.summary());
            println!(
                "{:.0} seeds/s, {:.0} simulated s per wall s",
                c.runs as f64 / wall,
                c.simulated.as_secs_f64() / wall
            );
            if let Some(cpu) = cpu_seconds() {
                // On a shared machine wall time includes other processes;
                // CPU time is this campaign's own (one thread).
                println!(
                    "{:.0} seeds/s, {:.0} simulated s per CPU s (CPU {cpu:.2} s)",
                    c.runs as f64 / cpu,
                    c.simulated.as_secs_f64() / cpu
                );
            }
            let gaps = min_coverage.map(|m| c.coverage_gaps(m)).unwrap_or_default();
            for g in &gaps {
                println!("COVERAGE below {:.1}%: {g}", min_coverage.unwrap_or(0.0));
            }
            if c.failures.is_empty() && gaps.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Replay { seed } => {
            let (o, r) = run_and_check(seed);
            for l in &o.world.trace {
                println!("{:>7} ms  {}", l.at_ms, l.what);
            }
            println!("config: {:?}", o.world.cfg);
            for s in &o.summaries {
                println!("run: {s}");
            }
            println!(
                "trace hash {:016x}, duplicates {}",
                r.trace_hash, r.duplicates
            );
            if r.violations.is_empty() {
                println!("seed {seed}: every oracle holds");
                ExitCode::SUCCESS
            } else {
                for v in &r.violations {
                    println!("VIOLATION {}: {}", v.oracle, v.detail);
                }
                println!("replay: {}", replay_line(seed));
                ExitCode::FAILURE
            }
        }
    }
}

/// This process's user + system CPU time, from `/proc/self/stat` (fields 14
/// and 15, in clock ticks of 1/100 s on Linux); `None` elsewhere.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; count from after its ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split(' ').skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}
