//! Runs one seed: incarnations of spate's real pipeline against the
//! simulated world, with the seed's faults, then heal, catch up and shut down.
//!
//! Phases (simulated time): the producer appends each partition's records over
//! `produce_for`; faults fire within `fault_phase`; afterwards everything is
//! healthy and the pipeline must commit every produced record within
//! `liveness_bound`; then shutdown, whose duration is recorded (D5). A crash
//! fault drops the incarnation's runtime mid-run, losing all engine state; a
//! pipeline that stops on an error is restarted after a pause, as a process
//! supervisor would. Each incarnation is a fresh current-thread tokio runtime
//! with paused time, so the run is a function of the seed (D7).

use std::time::Duration;

use rand::RngCore;
use spate_core::pipeline::chain::PayloadDecoder;
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, ChunkConfig, Terminal};
use spate_core::pipeline::{ExitStatus, OnError, Pipeline, PipelineConfig, RunReport, Shutdown};
use spate_core::sink::{BreakerConfig, RetryConfig, RunNonce, SinkConfig};

use crate::broker::SimSource;
use crate::clickhouse::{SimEncoder, SimRouter, SimWriter};
use crate::config::{FaultKind, SimConfig};
use crate::world::{DrainFact, FNV_BASIS, Shared, World, fnv1a};

/// A paused, current-thread process restart costs this much simulated time.
const RESTART_PAUSE: Duration = Duration::from_millis(500);
/// The pipeline's chunk size in the simulator: small, so budgets of a few KB
/// hold several chunks.
pub const CHUNK_BYTES: usize = 1_200;
/// How often the harness looks at the world (and the producer and the fault
/// schedule move on).
const TICK: Duration = Duration::from_millis(100);
/// The same while a shutdown drains: drains are short, and a fault due
/// mid-drain must land inside it.
const DRAIN_TICK: Duration = Duration::from_millis(10);

/// The simulated sink table (`database.table`), part of every range token.
pub const SIM_TABLE: &str = "sim.events";

/// What one seed's run left behind, for the oracles.
#[derive(Debug)]
pub struct SimOutcome {
    /// The world at the end: logs, commits, tables, facts, trace.
    pub world: World,
    /// The final run report's one-line summary, per incarnation.
    pub summaries: Vec<String>,
    /// Whether every produced record was committed before the liveness bound.
    pub caught_up: bool,
    /// Simulated time when the run reached zero lag (if it did).
    pub caught_up_at: Option<Duration>,
    /// The final incarnation's exit status.
    pub final_status: Option<ExitStatus>,
    /// Hash of the whole trace: equal for equal seeds (D7).
    pub trace_hash: u64,
}

enum End {
    Crashed,
    Stopped(RunReport),
    Final(RunReport, bool),
}

/// Runs `seed` to the end.
pub fn run_seed(seed: u64) -> SimOutcome {
    run_config(SimConfig::from_seed(seed))
}

/// Runs `cfg` to the end: a seed's run with its schedule replaced, as the
/// shrinker and `spate-verify replay --faults` use it. Still a pure function
/// of `cfg` (D7).
pub fn run_config(cfg: SimConfig) -> SimOutcome {
    let world = Shared::new(World::new(cfg.clone()));
    let crashes: Vec<Duration> = cfg.faults_of(FaultKind::Crash).map(|f| f.start).collect();
    let restarts: Vec<Duration> = cfg
        .faults_of(FaultKind::GracefulRestart)
        .map(|f| f.start)
        .collect();
    let mut summaries = Vec::new();
    let mut first = true;
    let (final_status, caught_up) = loop {
        if !first {
            retention_while_down(&mut world.lock());
        }
        let now = world.lock().base;
        let crash_at = crashes.iter().copied().find(|t| *t > now);
        let restart_at = restarts.iter().copied().find(|t| *t > now);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("current-thread runtime");
        let end = rt.block_on(incarnation(world.clone(), crash_at, restart_at, first));
        drop(rt);
        first = false;
        match end {
            End::Crashed => {
                summaries.push("crashed".to_owned());
            }
            End::Stopped(report) => {
                summaries.push(report.summary());
                world.lock().trace(format!("stopped: {}", report.summary()));
            }
            End::Final(report, caught_up) => {
                summaries.push(report.summary());
                break (Some(report.status), caught_up);
            }
        }
    };
    let mut world = std::sync::Arc::try_unwrap(world.into_inner())
        .map(|m| m.into_inner().expect("world lock"))
        .unwrap_or_else(|_| panic!("world still shared after the run"));
    world.ended = true;
    // Every fault has healed: a zombie's held inserts that are still due
    // land now (after the final commit: the window must still drop them),
    // and replication catches up.
    crate::clickhouse::run_zombies(&mut world, true);
    world.replicate(true);
    let trace_hash = world.trace.iter().fold(FNV_BASIS, |h, l| {
        fnv1a(l.what.bytes().chain(l.at_ms.to_le_bytes()), h)
    });
    let caught_up_at = world.caught_up_at.take();
    SimOutcome {
        world,
        summaries,
        caught_up,
        caught_up_at,
        final_status,
        trace_hash,
    }
}

fn pipeline_config(cfg: &SimConfig, incarnation: u32) -> PipelineConfig {
    let shards = (0..cfg.shards)
        .map(|s| {
            (0..cfg.replicas)
                .map(|r| format!("sim://s{s}r{r}"))
                .collect()
        })
        .collect();
    let mut sink = SinkConfig::new("sim", shards);
    sink.batch.max_rows = cfg.batch_rows;
    sink.batch.max_bytes = 1 << 20;
    sink.batch.linger = cfg.linger;
    sink.max_inflight = cfg.max_inflight;
    sink.queue_chunks = 4;
    sink.write_timeout = cfg.write_timeout;
    sink.retry = RetryConfig {
        initial: Duration::from_millis(50),
        max: Duration::from_secs(1),
        max_attempts: cfg.max_attempts,
    };
    sink.breaker = BreakerConfig {
        failure_threshold: 2,
        cooldown: Duration::from_secs(1),
    };
    sink.seed = Some(cfg.seed ^ u64::from(incarnation));
    let mut pc = PipelineConfig::new(sink);
    pc.delivery = cfg.delivery;
    pc.table = SIM_TABLE.to_owned();
    pc.threads = cfg.drivers;
    pc.checkpoint_interval = cfg.checkpoint_interval;
    pc.rebalance_drain_timeout = Duration::from_secs(2);
    pc.shutdown_drain_timeout = cfg.drain_timeout;
    pc.on_error = OnError::Fail;
    pc.chunk = ChunkConfig {
        max_bytes: CHUNK_BYTES,
        max_rows: 100,
        linger: Duration::from_millis(20),
    };
    pc.budget_bytes = cfg.budget_bytes;
    pc.budget_rows = 1 << 20;
    pc.idle_poll = Duration::from_millis(100);
    // A fixed poll interval: the campaign's schedules stay as they were.
    pc.idle_poll_max = pc.idle_poll;
    pc.probe_timeout = Duration::from_secs(1);
    pc
}

/// A new incarnation of the process: counted, traced, with its nonce drawn
/// from the world's RNG. Returns the config, the nonce and its number.
fn begin(w: &mut World) -> (SimConfig, u64, u32) {
    w.origin = tokio::time::Instant::now();
    w.incarnations += 1;
    let number = w.incarnations;
    let nonce = w.rng.next_u64();
    w.trace(format!("incarnation {number} nonce {nonce:016x}"));
    (w.cfg.clone(), nonce, number)
}

/// A new member: the group hands it every partition under new epochs.
fn join_group(w: &mut World, partitions: usize) {
    w.group_events.clear();
    w.revoking.clear();
    w.reassign_on_release.clear();
    for p in 0..partitions {
        w.assign(p);
    }
}

/// What ends an incarnation, and when.
struct Ends {
    crash_at: Option<Duration>,
    restart_at: Option<Duration>,
    /// When every fault has healed.
    heal_at: Duration,
    /// The liveness bound.
    end_by: Duration,
}

/// What an incarnation does after a tick.
enum Next {
    Wait,
    Finished,
    Crash,
    Restart,
    /// The final shutdown; whether the run caught up first.
    Shutdown(bool),
}

impl Ends {
    /// How long to sleep from `now`: a tick, or less when a crash or
    /// restart is due sooner.
    fn next_wake(&self, now: Duration) -> Duration {
        [self.crash_at, self.restart_at]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .map(|t| t - now)
            .fold(TICK, Duration::min)
    }

    /// Ticks the world and decides what comes next (`Finished`: the
    /// pipeline task `run` ended on its own).
    fn next(&self, w: &mut World, run: &tokio::task::JoinHandle<RunReport>) -> Next {
        tick(w);
        let now = w.now();
        if run.is_finished() {
            Next::Finished
        } else if self.crash_at.is_some_and(|t| now >= t) {
            w.hit.insert(FaultKind::Crash);
            w.trace("crash");
            Next::Crash
        } else if self.restart_at.is_some_and(|t| now >= t) {
            w.hit.insert(FaultKind::GracefulRestart);
            w.trace("graceful restart (SIGTERM)");
            Next::Restart
        } else if now >= self.heal_at && w.caught_up() {
            if w.caught_up_at.is_none() {
                w.caught_up_at = Some(now);
            }
            Next::Shutdown(true)
        } else if now >= self.end_by {
            w.trace("liveness bound reached without catching up");
            Next::Shutdown(false)
        } else {
            Next::Wait
        }
    }
}

async fn incarnation(
    world: Shared,
    crash_at: Option<Duration>,
    restart_at: Option<Duration>,
    first: bool,
) -> End {
    let (cfg, nonce, number) = begin(&mut world.lock());
    if !first {
        tokio::time::sleep(RESTART_PAUSE).await;
    }
    join_group(&mut world.lock(), cfg.partitions);
    // The mapping's probe: the table's schema as it is now.
    let probed: crate::schema::Plan = {
        let mut w = world.lock();
        w.plan_version = w.schema.version;
        w.plan_row_bytes = w.schema.row_bytes();
        std::sync::Arc::new(w.schema.clone())
    };
    let pipeline = Pipeline::builder(
        pipeline_config(&cfg, number),
        SimSource::new(world.clone()),
        SimWriter::new(world.clone(), probed.clone()),
        move |buffers: ChunkBuffers| {
            ChainProcessor::new(
                PayloadDecoder,
                Terminal::new(SimEncoder::new(probed.clone()), SimRouter, buffers),
            )
        },
    )
    .nonce(RunNonce::from_u64(nonce))
    .build()
    .expect("the simulator's pipeline config is valid");
    world.lock().budget = Some(pipeline.budget());
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    let ends = Ends {
        crash_at,
        restart_at,
        heal_at: cfg.fault_phase,
        end_by: cfg.fault_phase + cfg.liveness_bound,
    };
    let caught_up = loop {
        // Wake at the next tick, or exactly when a crash or restart is due,
        // so faults scheduled just after it find the process in that state.
        let due = ends.next_wake(world.lock().now());
        tokio::time::sleep(due).await;
        let next = ends.next(&mut world.lock(), &run);
        match next {
            Next::Wait => {}
            Next::Shutdown(caught_up) => break caught_up,
            Next::Finished | Next::Crash | Next::Restart => {
                let end = match next {
                    Next::Finished => End::Stopped(run.await.expect("pipeline task")),
                    Next::Restart => {
                        End::Stopped(graceful_stop(&world, &shutdown, run, cfg.drain_timeout).await)
                    }
                    _ => End::Crashed,
                };
                finish(&world);
                return end;
            }
        }
    };
    let report = graceful_stop(&world, &shutdown, run, cfg.drain_timeout).await;
    finish(&world);
    End::Final(report, caught_up)
}

/// SIGTERM: requests shutdown, waits for the run and records how long the
/// drain took and what it abandoned (D5, D6).
async fn graceful_stop(
    world: &Shared,
    shutdown: &Shutdown,
    run: tokio::task::JoinHandle<RunReport>,
    timeout: Duration,
) -> RunReport {
    let started = tokio::time::Instant::now();
    let from = {
        let mut w = world.lock();
        w.draining = true;
        w.trace("shutdown requested");
        w.now()
    };
    shutdown.trigger();
    // The world goes on while the pipeline drains (faults fire, records
    // arrive: a rebalance can land mid-drain).
    let mut run = run;
    let report = loop {
        tokio::select! {
            biased;
            r = &mut run => break r.expect("pipeline task"),
            () = tokio::time::sleep(DRAIN_TICK) => tick(&mut world.lock()),
        }
    };
    let took = started.elapsed();
    let mut w = world.lock();
    w.draining = false;
    let sink_faulty = w.sink_faulty_between(from, w.now());
    w.drains.push(DrainFact {
        timeout,
        took,
        abandoned_rows: report.sink.rows_abandoned(),
        left_unwritten: report.status == ExitStatus::Abandoned,
        sink_faulty,
    });
    w.trace(format!(
        "shutdown done in {} ms: {}",
        took.as_millis(),
        report.summary()
    ));
    report
}

/// Carries the incarnation's elapsed time into the world's base.
fn finish(world: &Shared) {
    let mut w = world.lock();
    w.base = w.now();
    w.origin = tokio::time::Instant::now();
}

/// One harness tick: the producer, the fault schedule, replication between
/// replicas, a budget sample.
fn tick(w: &mut World) {
    produce(w);
    drive_faults(w);
    w.apply_due_commits();
    crate::clickhouse::run_queued(w);
    crate::clickhouse::run_zombies(w, false);
    w.replicate(false);
    w.sample_budget();
}

/// Appends each partition's records at an even pace over `produce_for`; as an
/// outside producer it carries on from wherever the log is. Called every tick.
fn produce(w: &mut World) {
    let now = w.now();
    let total = w.cfg.records_per_partition;
    let frac = (now.as_secs_f64() / w.cfg.produce_for.as_secs_f64()).min(1.0);
    let target = (((total as f64) * frac).ceil() as usize).min(total);
    for p in 0..w.cfg.partitions {
        if w.produced[p] >= target {
            continue;
        }
        // A transactional producer: this tick's records are one
        // transaction, closed by a control record; a quarter abort (their
        // records stay in the log, invisible under read_committed).
        let n = w.cfg.partitions;
        let txn = w.fault_active(FaultKind::TxnGaps, |t, _| t % n == p);
        if txn && w.rng_bool(0.25) {
            for _ in w.produced[p]..target {
                w.append_gap(p);
            }
            w.append_gap(p);
            continue;
        }
        while w.produced[p] < target {
            w.append_record(p);
        }
        if txn {
            w.append_gap(p);
        }
    }
}

/// Retention that ran while the process was down: applies every retention
/// fault due by now (once), before the next incarnation starts.
fn retention_while_down(w: &mut World) {
    let now = w.base;
    for i in 0..w.cfg.faults.len() {
        let f = &w.cfg.faults[i];
        if f.kind != FaultKind::Retention || f.start > now || w.retention_done.contains(&i) {
            continue;
        }
        let p = f.target % w.cfg.partitions;
        w.retention_done.insert(i);
        if w.retain(p) {
            w.hit.insert(FaultKind::Retention);
        }
    }
}

/// Applies the instant faults (rebalance, dedup loss, end of an eviction) when
/// their time comes, and keeps the eviction flag in step with its windows.
/// Called every tick.
fn drive_faults(w: &mut World) {
    let now = w.now();
    // A zombie-write fault is an eviction too (the server also holds the
    // member's inserts: `clickhouse.rs`); its hit is a held insert.
    let evicted = w.fault_active(FaultKind::Eviction, |_, _| true)
        | w.fault_on(FaultKind::ZombieWrite, |_, _| true);
    if w.evicted && !evicted {
        // Rejoin: the member learns it lost everything.
        w.trace("eviction over; rejoining");
        for p in 0..w.cfg.partitions {
            w.rebalance(p);
        }
    } else if evicted && !w.evicted {
        w.trace("evicted");
    }
    w.evicted = evicted;
    while let Some(i) =
        (0..w.cfg.faults.len()).find(|i| !w.applied.contains(i) && w.cfg.faults[*i].start <= now)
    {
        w.applied.insert(i);
        let f = w.cfg.faults[i].clone();
        match f.kind {
            FaultKind::Rebalance => {
                w.hit.insert(FaultKind::Rebalance);
                let n = w.cfg.partitions;
                // Revoke a deterministic subset (possibly all).
                for p in (0..n).filter(|&p| (f.target2 >> (p % 6)) & 1 == 1 || p == f.target % n) {
                    w.rebalance(p);
                }
            }
            FaultKind::Truncation => {
                let p = f.target % w.cfg.partitions;
                if w.truncate(p) {
                    w.hit.insert(FaultKind::Truncation);
                }
            }
            FaultKind::Compaction => {
                let p = f.target % w.cfg.partitions;
                if w.compact(p) {
                    w.hit.insert(FaultKind::Compaction);
                }
            }
            FaultKind::SchemaChange => {
                w.hit.insert(FaultKind::SchemaChange);
                w.alter();
            }
            FaultKind::DedupLoss => {
                w.hit.insert(FaultKind::DedupLoss);
                let s = f.target % w.cfg.shards;
                w.dedup[s].clear();
                w.trace(format!("shard {s} restarted: dedup window lost"));
            }
            _ => {}
        }
    }
}
