//! `spate-verify`: run fault campaigns over the simulator and replay seeds.
//!
//! ```text
//! spate-verify campaign --seeds 2000 [--first 0] [--min-coverage 1]
//!                                      # exit 1 if any seed fails
//! spate-verify replay 1234 [--faults SPEC]   # trace + verdict of one run
//! spate-verify shrink 1234             # minimal fault schedule of a failing seed
//! spate-verify search --cases 200      # proptest schedules, shrink the first failure
//! ```
//!
//! Built with `--features planted-bugs`, `--plant BUG` runs with one of
//! spate-core's planted bugs (e.g. `TimeoutIsSuccess`); `--plant-sim BUG`
//! plants one of the simulator's (e.g. `IgnoreSchemaChange`) in any build.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use spate_sim::config::{SimConfig, parse_schedule, schedule_spec};
use spate_verify::shrink::{Shrunk, minimize, search_and_shrink};
use spate_verify::{Campaign, replay_line, run_and_check_config};

#[derive(Parser)]
#[command(about = "Fault campaigns and replays for spate's deterministic simulator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Plant one of spate-core's bugs for this run (needs the `planted-bugs`
    /// feature).
    #[arg(long, global = true)]
    plant: Option<String>,
    /// Plant one of the simulator's own bugs (`spate_sim::planted::SimBug`,
    /// e.g. `IgnoreSchemaChange`) for this run.
    #[arg(long, global = true)]
    plant_sim: Option<String>,
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
        /// Write one line per seed (`seed trace-hash violations kinds`) to this
        /// file, to compare two builds' campaigns seed by seed.
        #[arg(long)]
        hashes: Option<std::path::PathBuf>,
    },
    /// Runs one seed and prints its trace and verdict.
    Replay {
        /// The seed to replay.
        seed: u64,
        /// Replace the seed's fault schedule with this one (as `shrink`
        /// prints it: `Kind@START+DURATION/TARGET.TARGET2`, comma-separated,
        /// ms).
        #[arg(long)]
        faults: Option<String>,
    },
    /// Shrinks a failing seed to a minimal fault schedule (removing any one
    /// fault makes it pass) and prints its replay line.
    Shrink {
        /// The failing seed.
        seed: u64,
    },
    /// Generates fault schedules with proptest's state machine, and shrinks
    /// the first one that breaks an oracle.
    Search {
        /// Schedules to try.
        #[arg(long, default_value_t = 256)]
        cases: u32,
        /// Most faults per schedule.
        #[arg(long, default_value_t = 6)]
        max_faults: usize,
    },
}

fn print_shrunk(s: &Shrunk) {
    println!(
        "shrunk to {} fault(s) in {} runs, {:.2} s: seed {} faults `{}`",
        s.faults.len(),
        s.runs,
        s.elapsed.as_secs_f64(),
        s.seed,
        schedule_spec(&s.faults)
    );
    for v in &s.violations {
        println!("VIOLATION {}: {}", v.oracle, v.detail);
    }
    println!("replay: {}", s.replay_line());
}

#[cfg(feature = "planted-bugs")]
fn plant(name: Option<&str>) -> Result<(), String> {
    use spate_core::planted::{Bug, plant};
    let Some(name) = name else { return Ok(()) };
    let bug = Bug::ALL
        .into_iter()
        .find(|b| format!("{b:?}") == name)
        .ok_or_else(|| format!("--plant: unknown bug `{name}`; one of {:?}", Bug::ALL))?;
    plant(Some(bug));
    eprintln!("planted bug {bug:?}");
    Ok(())
}

#[cfg(not(feature = "planted-bugs"))]
fn plant(name: Option<&str>) -> Result<(), String> {
    match name {
        None => Ok(()),
        Some(_) => Err("--plant needs a build with `--features planted-bugs`".into()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(name) = cli.plant_sim.as_deref() {
        use spate_sim::planted::{SimBug, plant};
        let Some(bug) = SimBug::ALL.into_iter().find(|b| format!("{b:?}") == name) else {
            eprintln!(
                "--plant-sim: unknown bug `{name}`; one of {:?}",
                SimBug::ALL
            );
            return ExitCode::from(2);
        };
        plant(Some(bug));
        eprintln!("planted simulator bug {bug:?}");
    }
    if let Err(e) = plant(cli.plant.as_deref()) {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Campaign {
            seeds,
            first,
            min_coverage,
            hashes,
        } => {
            #[allow(clippy::disallowed_methods)] // wall time of the campaign itself, not of a run
            let started = Instant::now();
            let c = Campaign::run(first, seeds);
            let wall = started.elapsed().as_secs_f64();
            if let Some(path) = hashes {
                let lines: String = c
                    .per_seed
                    .iter()
                    .map(|(s, h, n, k)| format!("{s} {h:016x} {n} {k:x}\n"))
                    .collect();
                if let Err(e) = std::fs::write(&path, lines) {
                    eprintln!("--hashes {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
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
        Command::Shrink { seed } => match minimize(SimConfig::from_seed(seed)) {
            None => {
                println!("seed {seed}: every oracle holds; nothing to shrink");
                ExitCode::SUCCESS
            }
            Some(s) => {
                print_shrunk(&s);
                ExitCode::FAILURE
            }
        },
        Command::Search { cases, max_faults } => match search_and_shrink(cases, max_faults) {
            None => {
                println!("{cases} generated schedules: every oracle holds");
                ExitCode::SUCCESS
            }
            Some(s) => {
                print_shrunk(&s);
                ExitCode::FAILURE
            }
        },
        Command::Replay { seed, faults } => {
            let cfg = match faults.as_deref().map(parse_schedule) {
                None => SimConfig::from_seed(seed),
                Some(Ok(f)) => SimConfig::with_faults(seed, f),
                Some(Err(e)) => {
                    eprintln!("--faults: {e}");
                    return ExitCode::from(2);
                }
            };
            let (o, r) = run_and_check_config(cfg);
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
                match faults {
                    None => println!("replay: {}", replay_line(seed)),
                    Some(f) => println!(
                        "replay: cargo run -p spate-verify --release -- replay {seed} --faults '{f}'"
                    ),
                }
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
