//! Everything a simulated run does, derived from one seed (D7).

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::schema::{ColType, Column, FIELDS, Schema};

/// The kinds of fault the simulator injects; each run's schedule draws from
/// these, and campaigns report how often each was hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// A replica refuses every write and probe (error before write).
    ReplicaDown,
    /// Every replica of a shard is down.
    ShardDown,
    /// A replica fails some writes before writing.
    WriteErrors,
    /// A replica writes, then never answers: the client times out (the
    /// ambiguous case; the retry must carry the same token).
    AmbiguousWrites,
    /// A replica answers later than the client waits, and writes anyway.
    SlowReplica,
    /// A shard restarts and forgets its dedup window.
    DedupLoss,
    /// A partition's leader is unavailable: fetches return nothing.
    PartitionUnavailable,
    /// Fetches of a partition fail with a transient error.
    FetchErrors,
    /// The group rebalances: some partitions are revoked and re-assigned.
    Rebalance,
    /// Commits fail; some of them after being applied (response lost).
    CommitFailures,
    /// The member is evicted: its commits are refused until it rejoins.
    Eviction,
    /// The process crashes and restarts: engine state lost.
    Crash,
    /// The process is stopped gracefully (SIGTERM: drain, final commit) and
    /// started again, as in a deploy.
    GracefulRestart,
    /// The producer writes transactions on a partition: each tick's records
    /// end with a control record, and some transactions abort. Under
    /// `read_committed` neither control records nor aborted records reach
    /// the consumer: offset gaps.
    TxnGaps,
    /// Log compaction removes some records of a partition (superseded by a
    /// later record with the same key): offset gaps in data already written.
    Compaction,
    /// An unclean leader election: the new leader's log is shorter, so the
    /// partition's log end moves backwards, possibly below offsets already
    /// read and below a commit; the producer's next records reuse the lost
    /// offsets.
    Truncation,
    /// While the process is down (the schedule pairs it with a crash),
    /// retention deletes a partition's log up to a point past the committed
    /// offset: the committed offset is out of range on restart and the
    /// consumer resets to the earliest offset.
    Retention,
    /// The group coordinator is slow: commits queue behind each other and
    /// apply 1-5 s later, in order; the client's call times out meanwhile.
    SlowCoordinator,
    /// Every replica splits inserts into blocks of
    /// [`SimConfig::block_rows`] rows (each commits and is deduplicated on
    /// its own); on the target shard, some inserts fail after some of their
    /// blocks were written.
    PartialInsert,
    /// `ALTER TABLE` (ADD, DROP or MODIFY of a value column) on every shard
    /// while spate runs: its probed layout is stale until it probes again.
    SchemaChange,
    /// A frozen replica accepts requests, queues them and runs them all
    /// (every retry too) once it thaws; the client hears nothing.
    QueuedRequests,
    /// The member is evicted (its commits refused, as with
    /// [`FaultKind::Eviction`]) while it goes on writing, a zombie that does
    /// not know yet: the server takes every insert it sends meanwhile and
    /// runs it 0.2-2 s after the eviction ends, once the member has rejoined
    /// and (in `effectively_once`) re-formed and written the same range with
    /// the same token, as a zombie's in-flight insert lands after the new
    /// owner's (clickhouse-kafka-connect #24).
    ZombieWrite,
}

impl FaultKind {
    /// This kind's bit in a set of kinds.
    pub fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 22] = [
        FaultKind::ReplicaDown,
        FaultKind::ShardDown,
        FaultKind::WriteErrors,
        FaultKind::AmbiguousWrites,
        FaultKind::SlowReplica,
        FaultKind::DedupLoss,
        FaultKind::PartitionUnavailable,
        FaultKind::FetchErrors,
        FaultKind::Rebalance,
        FaultKind::CommitFailures,
        FaultKind::Eviction,
        FaultKind::Crash,
        FaultKind::GracefulRestart,
        FaultKind::TxnGaps,
        FaultKind::Compaction,
        FaultKind::Truncation,
        FaultKind::Retention,
        FaultKind::SlowCoordinator,
        FaultKind::PartialInsert,
        FaultKind::SchemaChange,
        FaultKind::QueuedRequests,
        FaultKind::ZombieWrite,
    ];

    /// How many of [`FaultKind::ALL`] (the first ones) existed before issue 16.
    pub const BEFORE_ISSUE16: usize = 13;

    /// The kinds added by issue 16, drawn from their own random stream
    /// ([`SimConfig::from_seed`]) so that a seed which draws none of them
    /// runs exactly as it did before they existed.
    pub const ISSUE16: [FaultKind; 8] = [
        FaultKind::TxnGaps,
        FaultKind::Compaction,
        FaultKind::Truncation,
        FaultKind::Retention,
        FaultKind::SlowCoordinator,
        FaultKind::PartialInsert,
        FaultKind::SchemaChange,
        FaultKind::QueuedRequests,
    ];

    /// The kinds added by issue 23 (effectively-once), drawn from a stream
    /// of their own as well, so seeds that draw none run as they did.
    pub const ISSUE23: [FaultKind; 1] = [FaultKind::ZombieWrite];
}

/// One scheduled fault: `kind` on `target` from `start` for `duration`
/// (simulated time since the run began; instant kinds ignore the duration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What happens.
    pub kind: FaultKind,
    /// Shard, replica or partition index the fault hits (kind-dependent;
    /// `target % count` picks it).
    pub target: usize,
    /// Second index (the replica of a shard), when needed.
    pub target2: usize,
    /// When it starts.
    pub start: Duration,
    /// How long it lasts.
    pub duration: Duration,
}

impl Fault {
    /// Whether the fault is active at `now`.
    pub fn active(&self, now: Duration) -> bool {
        now >= self.start && now < self.start + self.duration
    }

    /// The fault as one token of a schedule spec:
    /// `Kind@START+DURATION/TARGET.TARGET2`, times in ms, e.g.
    /// `Crash@1200+300/3.5`. [`parse_schedule`] reads it back.
    pub fn spec(&self) -> String {
        format!(
            "{:?}@{}+{}/{}.{}",
            self.kind,
            self.start.as_millis(),
            self.duration.as_millis(),
            self.target,
            self.target2
        )
    }
}

/// A schedule as one line: the [`Fault::spec`]s joined by `,` (empty for no
/// faults). With the seed it replays a shrunk run exactly.
pub fn schedule_spec(faults: &[Fault]) -> String {
    faults.iter().map(Fault::spec).collect::<Vec<_>>().join(",")
}

/// Parses a [`schedule_spec`] line, sorted by start as a seed's schedule is.
///
/// # Errors
/// A message naming the token that is not `Kind@START+DURATION/TARGET.TARGET2`
/// or whose kind is unknown.
pub fn parse_schedule(spec: &str) -> Result<Vec<Fault>, String> {
    let mut faults = spec
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|token| {
            let bad =
                || format!("fault `{token}`: expected Kind@START+DURATION/TARGET.TARGET2 (ms)");
            let (kind, rest) = token.split_once('@').ok_or_else(bad)?;
            let (start, rest) = rest.split_once('+').ok_or_else(bad)?;
            let (duration, targets) = rest.split_once('/').ok_or_else(bad)?;
            let (target, target2) = targets.split_once('.').ok_or_else(bad)?;
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| format!("{k:?}") == kind)
                .ok_or_else(|| format!("fault `{token}`: unknown kind `{kind}`"))?;
            let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
            Ok(Fault {
                kind,
                start: Duration::from_millis(num(start)?),
                duration: Duration::from_millis(num(duration)?),
                target: num(target)? as usize,
                target2: num(target2)? as usize,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    faults.sort_by_key(|f| (f.start, f.kind));
    Ok(faults)
}

/// The chance that a seed schedules each of [`FaultKind::ISSUE16`] (once):
/// high enough that a campaign hits each in well over 1% of seeds.
pub const EXTRA_FAULT_P: f64 = 0.04;

/// The delivery guarantee a run's pipeline is configured for.
pub use spate_core::pipeline::Delivery;

/// The parameters of one simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The seed everything derives from.
    pub seed: u64,
    /// The pipeline's `delivery` (a campaign runs a seed in either mode:
    /// the mode changes nothing else the seed decides).
    pub delivery: Delivery,
    /// Partitions of the one topic.
    pub partitions: usize,
    /// ClickHouse shards.
    pub shards: usize,
    /// Replicas per shard.
    pub replicas: usize,
    /// Records produced per partition over the produce phase.
    pub records_per_partition: usize,
    /// Length of the produce phase.
    pub produce_for: Duration,
    /// Faults happen within `[0, fault_phase)`; after it everything heals.
    pub fault_phase: Duration,
    /// After healing, the run must reach zero lag within this bound (liveness).
    pub liveness_bound: Duration,
    /// The dedup window of each shard in batches (0 models a plain MergeTree).
    pub dedup_window: usize,
    /// Records per lane poll at most.
    pub max_poll: usize,
    /// Write latency range of a healthy replica, in ms.
    pub write_latency_ms: (u64, u64),
    /// The fault schedule, ordered by start.
    pub faults: Vec<Fault>,
    /// The table's value columns at the start.
    pub schema: Schema,
    /// Rows per insert block on every replica (`usize::MAX`: one block per
    /// insert, as ClickHouse's default `max_insert_block_size` gives for
    /// the simulator's batches).
    pub block_rows: usize,
    /// Pipeline drivers (one-thread mode).
    pub drivers: usize,
    /// `checkpoint.interval`.
    pub checkpoint_interval: Duration,
    /// `sink.batch.max_rows`.
    pub batch_rows: u64,
    /// `sink.batch.linger`.
    pub linger: Duration,
    /// `sink.max_inflight`.
    pub max_inflight: usize,
    /// `sink.retry.max_attempts` (0 = until drain).
    pub max_attempts: u32,
    /// `sink.write_timeout`.
    pub write_timeout: Duration,
    /// `shutdown.drain_timeout`.
    pub drain_timeout: Duration,
    /// In-flight byte budget.
    pub budget_bytes: u64,
    /// How long a part inserted on one replica takes to reach each other
    /// replica of its shard (a range in ms; a replica that is down fetches
    /// once it is up again). Deduplication is shard-wide at once, as
    /// ReplicatedMergeTree records block ids in ZooKeeper when the insert
    /// commits; the data follows with this lag.
    pub replication_lag_ms: (u64, u64),
}

/// The main stream's faults: up to five of the kinds before issue 16, and
/// with probability 0.1 a rebalance that lands while a SIGTERM restart
/// drains (interesting combinations are made likely on purpose, so a
/// campaign covers each in well over 1% of seeds, issue 4).
fn base_faults(rng: &mut SmallRng, fault_phase: Duration) -> Vec<Fault> {
    let phase_ms = fault_phase.as_millis() as u64;
    let mut faults: Vec<Fault> = (0..rng.random_range(0..=5))
        .map(|_| {
            // The kinds before issue 16 only: this stream stays as it was.
            let kind = FaultKind::ALL[rng.random_range(0..FaultKind::BEFORE_ISSUE16)];
            let start = rng.random_range(100..phase_ms - 500);
            // Every fault heals by the end of the fault phase.
            let duration = rng.random_range(100..3_000).min(phase_ms - start);
            Fault {
                kind,
                target: rng.random_range(0..64),
                target2: rng.random_range(0..64),
                start: Duration::from_millis(start),
                duration: Duration::from_millis(duration),
            }
        })
        .collect();
    if rng.random_bool(0.1) {
        let at = rng.random_range(500..phase_ms - 1_000);
        let after = rng.random_range(1..=8);
        for (kind, start) in [
            (FaultKind::GracefulRestart, at),
            (FaultKind::Rebalance, at + after),
        ] {
            faults.push(Fault {
                kind,
                target: rng.random_range(0..64),
                target2: rng.random_range(0..64),
                start: Duration::from_millis(start),
                duration: Duration::from_millis(100),
            });
        }
    }
    faults
}

/// Issue 16's fault kinds, each with probability [`EXTRA_FAULT_P`] (a
/// partial insert twice that), from their own stream; a retention fault
/// brings a crash soon after it (retention acts while the process is down).
fn issue16_faults(extra: &mut SmallRng, fault_phase: Duration, faults: &mut Vec<Fault>) {
    let phase_ms = fault_phase.as_millis() as u64;
    for kind in FaultKind::ISSUE16 {
        // A partial insert needs an insert of two blocks or more while
        // it lasts: scheduled twice as often, to clear the 1% floor.
        let p = match kind {
            FaultKind::PartialInsert => 2.0 * EXTRA_FAULT_P,
            _ => EXTRA_FAULT_P,
        };
        if !extra.random_bool(p) {
            continue;
        }
        let start = extra.random_range(300..phase_ms - 1_000);
        let duration = extra.random_range(200..3_000).min(phase_ms - start);
        let target = extra.random_range(0..64);
        faults.push(Fault {
            kind,
            target,
            target2: extra.random_range(0..64),
            start: Duration::from_millis(start),
            duration: Duration::from_millis(duration),
        });
        if kind == FaultKind::Retention {
            faults.push(Fault {
                kind: FaultKind::Crash,
                target,
                target2: 0,
                start: Duration::from_millis(start + extra.random_range(1..500)),
                duration: Duration::from_millis(100),
            });
        }
    }
}

/// Issue 23's fault kinds, each with probability [`EXTRA_FAULT_P`], from a
/// third stream.
fn issue23_faults(eo: &mut SmallRng, fault_phase: Duration, faults: &mut Vec<Fault>) {
    let phase_ms = fault_phase.as_millis() as u64;
    for kind in FaultKind::ISSUE23 {
        if !eo.random_bool(EXTRA_FAULT_P) {
            continue;
        }
        let start = eo.random_range(300..phase_ms - 1_000);
        let duration = eo.random_range(300..3_000).min(phase_ms - start);
        faults.push(Fault {
            kind,
            target: eo.random_range(0..64),
            target2: eo.random_range(0..64),
            start: Duration::from_millis(start),
            duration: Duration::from_millis(duration),
        });
    }
}

/// The table's value columns: none (identity rows only, as before issue
/// 16) unless the schedule changes the schema (`changes`) or a 0.3 draw
/// asks for some; then a random choice of fields and types.
fn value_schema(extra: &mut SmallRng, changes: bool) -> Schema {
    let mut schema = Schema::default();
    if changes || extra.random_bool(0.3) {
        let mut fields: Vec<usize> = (0..FIELDS).collect();
        for i in (1..fields.len()).rev() {
            fields.swap(i, extra.random_range(0..=i));
        }
        let n = extra.random_range(1..=FIELDS);
        schema.columns = fields[..n]
            .iter()
            .map(|&field| Column {
                field,
                ty: ColType::ALL[extra.random_range(0..ColType::ALL.len())],
            })
            .collect();
    }
    schema
}

/// Moves each schema change into the produce phase: it matters while
/// records still arrive.
fn within_produce_phase(faults: &mut [Fault], produce_for: Duration) {
    for f in faults
        .iter_mut()
        .filter(|f| f.kind == FaultKind::SchemaChange)
    {
        let within = produce_for.as_millis() as u64 - 200;
        f.start = Duration::from_millis(200 + f.start.as_millis() as u64 % within);
    }
}

impl SimConfig {
    /// The run that `seed` describes. Three RNG streams, each drawn in the
    /// order it always was, so a seed keeps its run as kinds are added: the
    /// main stream, issue 16's (its fault kinds, the value columns, the
    /// block size) and issue 23's.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5EED_C0FF_EE00_0001);
        let partitions = rng.random_range(1..=6);
        let shards = rng.random_range(1..=3);
        let replicas = rng.random_range(1..=3);
        let fault_phase = Duration::from_secs(8);
        let mut faults = base_faults(&mut rng, fault_phase);
        // Issue 16's kinds come from a stream of their own: the draws above
        // (and so every seed that gets none of these) stay as they were.
        let mut extra = SmallRng::seed_from_u64(seed ^ 0x5EED_FA17_0000_0016);
        issue16_faults(&mut extra, fault_phase, &mut faults);
        // Issue 23's kinds: a third stream, for the same reason.
        let mut eo = SmallRng::seed_from_u64(seed ^ 0x5EED_E0E0_0000_0023);
        issue23_faults(&mut eo, fault_phase, &mut faults);
        // The table's value columns (none: identity rows only, as before
        // issue 16); always some when the schedule changes the schema.
        let changes = faults.iter().any(|f| f.kind == FaultKind::SchemaChange);
        let schema = value_schema(&mut extra, changes);
        let block_rows = if faults.iter().any(|f| f.kind == FaultKind::PartialInsert) {
            extra.random_range(5..30)
        } else {
            usize::MAX
        };
        // A schema change matters while records still arrive: it lands
        // within the produce phase (drawn here, after the faults).
        // (In the order the fields below drew them before: seeds stay.)
        let records_per_partition = rng.random_range(50..=400);
        let produce_for = Duration::from_millis(rng.random_range(1_000..6_000));
        within_produce_phase(&mut faults, produce_for);
        faults.sort_by_key(|f| (f.start, f.kind));
        Self {
            seed,
            delivery: Delivery::AtLeastOnce,
            schema,
            block_rows,
            partitions,
            shards,
            replicas,
            records_per_partition,
            produce_for,
            fault_phase,
            liveness_bound: Duration::from_secs(30),
            dedup_window: match rng.random_range(0..10) {
                0 => 0,                       // plain MergeTree: tokens ignored
                1 => rng.random_range(1..=3), // a late retry can fall outside it
                _ => 100,                     // ReplicatedMergeTree's default
            },
            max_poll: rng.random_range(1..=64),
            write_latency_ms: (1, rng.random_range(2..40)),
            faults,
            drivers: rng.random_range(1..=2),
            checkpoint_interval: Duration::from_millis(rng.random_range(50..1_000)),
            batch_rows: rng.random_range(10..500),
            linger: Duration::from_millis(rng.random_range(5..300)),
            max_inflight: rng.random_range(1..=3),
            max_attempts: if rng.random_bool(0.5) {
                0
            } else {
                rng.random_range(2..8)
            },
            write_timeout: Duration::from_millis(rng.random_range(200..1_000)),
            drain_timeout: Duration::from_secs(rng.random_range(1..=5)),
            budget_bytes: rng.random_range(2_000..200_000),
            replication_lag_ms: (0, rng.random_range(1..=2_000)),
        }
    }

    /// `seed`'s run with `faults` as its schedule instead of the seed's own
    /// (sorted by start).
    pub fn with_faults(seed: u64, mut faults: Vec<Fault>) -> Self {
        faults.sort_by_key(|f| (f.start, f.kind));
        let base = Self::from_seed(seed);
        // A schedule with a partial-insert fault needs multi-block inserts.
        let block_rows = if faults.iter().any(|f| f.kind == FaultKind::PartialInsert)
            && base.block_rows == usize::MAX
        {
            20
        } else {
            base.block_rows
        };
        Self {
            faults,
            block_rows,
            ..base
        }
    }

    /// This run with `delivery` as its pipeline's mode.
    pub fn with_delivery(self, delivery: Delivery) -> Self {
        Self { delivery, ..self }
    }

    /// The faults of `kind` in the schedule.
    pub fn faults_of(&self, kind: FaultKind) -> impl Iterator<Item = &Fault> {
        self.faults.iter().filter(move |f| f.kind == kind)
    }
}
