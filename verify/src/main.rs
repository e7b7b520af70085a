//! `spate-verify`: run fault campaigns over the simulator and replay seeds.
//!
//! ```text
//! spate-verify campaign --seeds 2000 [--first 0] [--min-coverage 1]
//!                       [--delivery at_least_once|effectively_once|both]
//!                                      # exit 1 if any seed fails
//! spate-verify replay 1234 [--faults SPEC] [--delivery MODE]
//!                                      # trace + verdict of one run
//! spate-verify shrink 1234 [--delivery MODE]
//!                                      # minimal fault schedule of a failing seed
//! spate-verify search --cases 200      # proptest schedules, shrink the first failure
//! ```
//!
//! Built with `--features planted-bugs`, `--plant BUG` runs with one of
//! spate-core's planted bugs (e.g. `TimeoutIsSuccess`); `--plant-sim BUG`
//! plants one of the simulator's (e.g. `IgnoreSchemaChange`) in any build.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use spate_sim::config::{Delivery, SimConfig, parse_schedule, schedule_spec};
use spate_verify::shrink::{Shrunk, minimize, search_and_shrink};
use spate_verify::{Campaign, replay_line_mode, run_and_check_config};

/// A pipeline `delivery` for a run (the YAML key's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
enum Mode {
    /// `delivery: at_least_once`.
    AtLeastOnce,
    /// `delivery: effectively_once` (D9 judged where the window covers the replay).
    EffectivelyOnce,
    /// Both, one campaign after the other over the same seeds (campaign only).
    Both,
}

impl Mode {
    /// The modes this choice runs, in order.
    fn deliveries(self) -> &'static [Delivery] {
        match self {
            Mode::AtLeastOnce => &[Delivery::AtLeastOnce],
            Mode::EffectivelyOnce => &[Delivery::EffectivelyOnce],
            Mode::Both => &[Delivery::AtLeastOnce, Delivery::EffectivelyOnce],
        }
    }

    /// The one mode of a single run.
    fn single(self) -> Result<Delivery, &'static str> {
        match self {
            Mode::AtLeastOnce => Ok(Delivery::AtLeastOnce),
            Mode::EffectivelyOnce => Ok(Delivery::EffectivelyOnce),
            Mode::Both => Err("--delivery both: only `campaign` runs both modes"),
        }
    }
}

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
        /// file, to compare two builds' campaigns seed by seed (with
        /// `--delivery both`, the effectively_once lines end in ` eo`).
        #[arg(long)]
        hashes: Option<std::path::PathBuf>,
        /// The pipelines' delivery mode; `both` runs the seeds in each.
        #[arg(long, value_enum, default_value_t = Mode::AtLeastOnce)]
        delivery: Mode,
        /// How many seeds the effectively_once campaign of `--delivery
        /// both` runs (default: `--seeds`), from `--first` too.
        #[arg(long)]
        eo_seeds: Option<u64>,
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
        /// The pipeline's delivery mode.
        #[arg(long, value_enum, default_value_t = Mode::AtLeastOnce)]
        delivery: Mode,
    },
    /// Shrinks a failing seed to a minimal fault schedule (removing any one
    /// fault makes it pass) and prints its replay line.
    Shrink {
        /// The failing seed.
        seed: u64,
        /// The pipeline's delivery mode.
        #[arg(long, value_enum, default_value_t = Mode::AtLeastOnce)]
        delivery: Mode,
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
        if let Err(e) = plant_sim(name) {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
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
            delivery,
            eo_seeds,
        } => campaign(first, seeds, eo_seeds, min_coverage, hashes, delivery),
        Command::Shrink { seed, delivery } => match delivery.single() {
            Ok(d) => shrink(SimConfig::from_seed(seed).with_delivery(d)),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
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
        Command::Replay {
            seed,
            faults,
            delivery,
        } => match delivery.single() {
            Ok(d) => replay(seed, faults, d),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
    }
}

/// `--plant-sim NAME`: plants one of the simulator's own bugs.
fn plant_sim(name: &str) -> Result<(), String> {
    use spate_sim::planted::{SimBug, plant};
    let Some(bug) = SimBug::ALL.into_iter().find(|b| format!("{b:?}") == name) else {
        return Err(format!(
            "--plant-sim: unknown bug `{name}`; one of {:?}",
            SimBug::ALL
        ));
    };
    plant(Some(bug));
    eprintln!("planted simulator bug {bug:?}");
    Ok(())
}

/// `spate-verify campaign`: seeds `first..first + seeds` in each delivery
/// mode (`eo_seeds` of them in the effectively_once mode of `--delivery
/// both`, if given), a summary and speed per mode, the coverage gaps under
/// `min_coverage`, and the per-seed lines to `hashes`. Exit 1 if any seed
/// fails or coverage falls short.
fn campaign(
    first: u64,
    seeds: u64,
    eo_seeds: Option<u64>,
    min_coverage: Option<f64>,
    hashes: Option<std::path::PathBuf>,
    delivery: Mode,
) -> ExitCode {
    let mut lines = String::new();
    let mut ok = true;
    for &mode in delivery.deliveries() {
        let count = match mode {
            Delivery::EffectivelyOnce => eo_seeds.unwrap_or(seeds),
            Delivery::AtLeastOnce => seeds,
        };
        #[allow(clippy::disallowed_methods)]
        // wall time of the campaign itself, not of a run
        let started = Instant::now();
        let c = Campaign::run_mode(first, count, mode);
        let wall = started.elapsed().as_secs_f64();
        let cpu_total = cpu_seconds();
        let tag = match mode {
            Delivery::AtLeastOnce => "",
            Delivery::EffectivelyOnce => " eo",
        };
        for (s, h, n, k) in &c.per_seed {
            lines += &format!("{s} {h:016x} {n} {k:x}{tag}\n");
        }
        print!("{}", c.summary());
        println!(
            "{:.0} seeds/s, {:.0} simulated s per wall s",
            c.runs as f64 / wall,
            c.simulated.as_secs_f64() / wall
        );
        if let Some(cpu) = cpu_total {
            // On a shared machine wall time includes other processes;
            // CPU time is this process's own (one thread; with both
            // modes, the total so far).
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
        ok &= c.failures.is_empty() && gaps.is_empty();
    }
    if let Some(path) = hashes
        && let Err(e) = std::fs::write(&path, lines)
    {
        eprintln!("--hashes {}: {e}", path.display());
        return ExitCode::from(2);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `spate-verify replay`: one seed's trace (with `faults` as its schedule
/// if given) and its verdict.
fn replay(seed: u64, faults: Option<String>, delivery: Delivery) -> ExitCode {
    let cfg = match faults.as_deref().map(parse_schedule) {
        None => SimConfig::from_seed(seed),
        Some(Ok(f)) => SimConfig::with_faults(seed, f),
        Some(Err(e)) => {
            eprintln!("--faults: {e}");
            return ExitCode::from(2);
        }
    }
    .with_delivery(delivery);
    let (o, r) = run_and_check_config(cfg);
    for l in &o.world.trace {
        println!("{:>7} ms  {}", l.at_ms, l.what);
    }
    println!("config: {:?}", o.world.cfg);
    for s in &o.summaries {
        println!("run: {s}");
    }
    println!(
        "trace hash {:016x}, duplicates {}, dedup window {} every replay",
        r.trace_hash,
        r.duplicates,
        if r.covered {
            "covered"
        } else {
            "did not cover"
        }
    );
    if r.violations.is_empty() {
        println!("seed {seed}: every oracle holds");
        ExitCode::SUCCESS
    } else {
        for v in &r.violations {
            println!("VIOLATION {}: {}", v.oracle, v.detail);
        }
        match faults {
            None => println!("replay: {}", replay_line_mode(seed, delivery)),
            Some(f) => println!(
                "replay: {} --faults '{f}'",
                replay_line_mode(seed, delivery)
            ),
        }
        ExitCode::FAILURE
    }
}

/// Shrinks `cfg`'s run if it fails and prints the minimal schedule.
fn shrink(cfg: SimConfig) -> ExitCode {
    let seed = cfg.seed;
    match minimize(cfg) {
        None => {
            println!("seed {seed}: every oracle holds; nothing to shrink");
            ExitCode::SUCCESS
        }
        Some(s) => {
            print_shrunk(&s);
            ExitCode::FAILURE
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
