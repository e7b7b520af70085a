//! The simulated world: topic logs, the consumer group, the commit store,
//! shard tables with their dedup windows, replica health, and the record of
//! facts the oracles judge. Shared by the broker and the ClickHouse sides
//! through [`Shared`]; everything runs on one thread, so the mutex is never
//! contended and is never held across an await.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spate_core::record::{Epoch, Offset};

use crate::config::{FaultKind, SimConfig};

/// The world behind a mutex, shared by the simulated edges.
#[derive(Clone, Debug)]
pub struct Shared(Arc<Mutex<World>>);

impl Shared {
    /// Wraps `world`.
    pub fn new(world: World) -> Self {
        Self(Arc::new(Mutex::new(world)))
    }

    /// The world itself, once no one else holds it.
    pub fn into_inner(self) -> Arc<Mutex<World>> {
        self.0
    }

    /// Locks the world (never contended: one thread).
    pub fn lock(&self) -> MutexGuard<'_, World> {
        self.0.lock().expect("world lock")
    }
}

/// One line of the trace: simulated time in ms and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceLine {
    /// Simulated milliseconds since the run began.
    pub at_ms: u64,
    /// What happened.
    pub what: String,
}

/// An event the group delivers to the member's `poll_event`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupEvent {
    /// Partition assigned under an epoch.
    Assign(usize, Epoch),
    /// Partition's epoch revoked.
    Revoke(usize, Epoch),
}

/// A commit the broker accepted, with what was durable at that instant (the
/// D1 oracle compares the two).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitFact {
    /// Simulated ms.
    pub at_ms: u64,
    /// Partition.
    pub partition: usize,
    /// Committed offset (next to read).
    pub offset: Offset,
    /// Length of the contiguous durable prefix of the partition then.
    pub durable_prefix: Offset,
    /// The commit's metadata string (empty: none), as the group stores it
    /// beside the offset (Kafka's `OffsetCommit` `committed_metadata`).
    pub metadata: String,
}

/// A drain (shutdown) and how long it took in simulated time (D5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainFact {
    /// The configured `shutdown.drain_timeout`.
    pub timeout: Duration,
    /// From the shutdown request to the run's return.
    pub took: Duration,
    /// Rows the sink reported abandoned over the incarnation (some may have
    /// been re-read and delivered under a later epoch).
    pub abandoned_rows: u64,
    /// Whether the run ended with data left unwritten
    /// (`ExitStatus::Abandoned`).
    pub left_unwritten: bool,
    /// Whether any sink fault was scheduled to be active during the drain.
    pub sink_faulty: bool,
}

/// The simulated world.
#[derive(Debug)]
pub struct World {
    /// The run's parameters.
    pub cfg: SimConfig,
    /// The sim's own random choices (latencies, per-attempt faults).
    pub rng: SmallRng,
    /// Simulated time at which the current incarnation's tokio clock started.
    pub base: Duration,
    /// The current incarnation's clock origin.
    pub origin: tokio::time::Instant,
    /// Whether the run has ended (every incarnation is over).
    pub ended: bool,
    /// Per partition, the log of payloads (a gap's payload is empty).
    pub logs: Vec<Vec<Bytes>>,
    /// Per partition and offset, the record id there, or [`GAP`] for an
    /// offset the consumer never sees (a control record, an aborted or a
    /// compacted record).
    pub ids: Vec<Vec<u32>>,
    /// Every record ever produced, by id (truncated ones included).
    pub records: Vec<RecordFact>,
    /// Per partition, the records the producer has written and the log
    /// still holds or held (truncation takes its losses back off: the
    /// producer writes them again as new records).
    pub produced: Vec<usize>,
    /// Per partition, the log start offset (retention deleted below it).
    pub log_start: Vec<Offset>,
    /// Per partition, the highest offset the consumer has fetched up to.
    pub fetched_end: Vec<Offset>,
    /// Per partition, offset ranges the oracles do not demand: after a
    /// truncation to `L`, new records below what the consumer had already
    /// fetched or committed (they may be committed over, as Kafka warns for
    /// unclean leader election); retention's deletions sit below
    /// [`World::log_start`].
    pub excused: Vec<Vec<(Offset, Offset)>>,
    /// Fetch positions reset back to the log start (out of range after an
    /// unclean election): (partition, to, from). Records in `[to, from)` are
    /// read again under new ranges, so D9 does not demand that they land
    /// only once (the run reports the reset, as `OffsetReset`).
    pub resets_back: Vec<(usize, Offset, Offset)>,
    /// Each effectively_once range's first batch token, by the token
    /// without its composition suffix (`~gaps`): a later batch of the same
    /// range under another token was re-formed after records inside it
    /// were deleted.
    pub range_first_tokens: BTreeMap<String, String>,
    /// Records retention deleted before any of their rows landed.
    pub lost_to_retention: u64,
    /// Records an unclean leader election removed from a log.
    pub lost_to_truncation: u64,
    /// Offset gaps written or made (control, aborted, compacted records).
    pub gaps: u64,
    /// Commits waiting at a slow coordinator, applied in order at `due`.
    pub commit_queue: VecDeque<QueuedCommit>,
    /// Rows whose record id does not name the record at their partition
    /// and offset (a row identity the simulator never produced).
    pub wrong_rows: Vec<String>,
    /// Indexes of retention faults already applied.
    pub retention_done: BTreeSet<usize>,
    /// The table's current value columns (every shard: ALTERs run on the
    /// whole cluster).
    pub schema: crate::schema::Schema,
    /// Rows whose values, decoded under the schema in force when they were
    /// written, differ from the record's (at most [`WRONG_VALUES_KEPT`]
    /// kept; [`World::wrong_value_rows`] counts them all).
    pub wrong_values: Vec<String>,
    /// Rows with wrong values, over the run.
    pub wrong_value_rows: u64,
    /// Inserts a frozen replica accepted and will run when it thaws.
    pub server_queue: VecDeque<QueuedInsert>,
    /// The schema version the current incarnation probed.
    pub plan_version: u32,
    /// The row width of the layout the current incarnation probed (its
    /// inserts' rows, whatever the table's schema is now).
    pub plan_row_bytes: usize,
    /// `effectively_once` write attempts whose range the partition's
    /// committed metadata did not record (nor the committed offset cover)
    /// when they were sent: breaches of the write-ahead rule (D9), the first
    /// few described.
    pub unrecorded_inserts: Vec<String>,
    /// How many such attempts, over the run.
    pub unrecorded: u64,
    /// Inserts that failed after some of their blocks were written.
    pub partial_inserts: u64,
    /// Inserts refused because their declared types or layout did not match
    /// the table's current schema.
    pub schema_refusals: u64,
    /// Epochs whose lanes may fetch no more (a truncated partition's epoch,
    /// revoked at the truncation).
    pub fenced: BTreeSet<(usize, Epoch)>,
    /// Per partition, the committed offset.
    pub committed: Vec<Option<Offset>>,
    /// Per partition, the metadata string stored with the committed offset
    /// (empty when none was sent). The group returns both at assignment
    /// (`OffsetFetch`), as `Assigned::committed`.
    pub committed_meta: Vec<String>,
    /// Per partition, the current epoch (0: never assigned).
    pub epochs: Vec<Epoch>,
    /// Per partition, epochs revoked and not yet released.
    pub revoking: BTreeSet<(usize, Epoch)>,
    /// Last epoch handed out.
    pub epoch_counter: Epoch,
    /// Events waiting for the member's poll.
    pub group_events: VecDeque<GroupEvent>,
    /// Partitions to re-assign once released.
    pub reassign_on_release: BTreeSet<usize>,
    /// Whether the member is currently evicted (commits refused).
    pub evicted: bool,
    /// Per shard and replica, the rows its parts hold (inserted there, or
    /// fetched from another replica).
    pub replica_rows: Vec<Vec<u64>>,
    /// Per shard, the rows of every part it accepted.
    pub shard_rows: Vec<u64>,
    /// Parts on their way to other replicas of their shard.
    pub fetches: Vec<Fetch>,
    /// Per shard, the dedup window of recent tokens.
    pub dedup: Vec<DedupWindow>,
    /// Per shard, every token whose block was ever applied there, with the
    /// incarnation that applied it first (to tell a re-sent block that the
    /// window dropped from one it no longer held, and a replay from a retry).
    pub applied_tokens: Vec<BTreeMap<String, u32>>,
    /// Blocks the window dropped whose token an earlier incarnation had
    /// applied: a replay after a crash or restart, deduplicated.
    pub replay_drops: u64,
    /// Zombie inserts the window dropped (the new owner's got in first).
    pub zombie_dropped: u64,
    /// Blocks applied again although their token had been applied on the
    /// shard before: the window no longer held it (too small, a plain
    /// MergeTree with none, or lost in a shard restart). A run with none is
    /// one whose window covered every replay (the D9 oracle's premise).
    pub dedup_misses: u64,
    /// The first few of those misses, described.
    pub dedup_miss_examples: Vec<String>,
    /// Inserts a zombie member sent while evicted, which the server holds
    /// and runs late ([`FaultKind::ZombieWrite`]), in the order they came.
    pub zombie_queue: Vec<QueuedInsert>,
    /// Zombie inserts that ran late.
    pub zombie_landed: u64,
    /// Commits the slow coordinator had queued and then refused when it got
    /// to them, because the member was evicted or the epoch was no longer
    /// its own by then (the generation check happens when the coordinator
    /// processes the request).
    pub late_commits_fenced: u64,
    /// The fault kinds in the schedule, one bit each ([`FaultKind::bit`]).
    pub scheduled: u32,
    /// Per partition, the contiguous durable prefix length.
    pub durable_prefix: Vec<Offset>,
    /// Token to FNV hash of the bytes it carried, over all incarnations.
    pub tokens: BTreeMap<String, u64>,
    /// Tokens that were seen with two different bodies (D4 violations).
    pub token_conflicts: Vec<String>,
    /// In `effectively_once`, per token: the probed schema version and the
    /// rows (partition, offset, record id) of the first body it carried.
    /// A range's token names its offsets, not its rows: a replay after the
    /// log lost records of the range (compaction, retention, an unclean
    /// election) or after the table's schema changed carries other bytes,
    /// which D4 allows there (counted in [`World::token_rebodied`]).
    pub range_rows: BTreeMap<String, (u32, Vec<[u32; 3]>)>,
    /// Range tokens re-sent with other bytes for one of those reasons.
    pub token_rebodied: u64,
    /// Accepted commits.
    pub commits: Vec<CommitFact>,
    /// Commits attempted for an epoch the member no longer owned
    /// (partition, epoch), refused by the group.
    pub stale_commits: Vec<(usize, Epoch)>,
    /// Drains.
    pub drains: Vec<DrainFact>,
    /// Rows dropped by a shard's dedup window (a retry or replay deduplicated).
    pub dedup_drops: u64,
    /// Writes applied but answered with a timeout (the ambiguous case).
    pub ambiguous_writes: u64,
    /// Commits applied but answered with an error.
    pub ambiguous_commits: u64,
    /// The current incarnation's in-flight budget, sampled at every write
    /// attempt and every harness tick.
    pub budget: Option<std::sync::Arc<spate_core::budget::Budget>>,
    /// The most bytes the in-flight budget held at any sample (D8).
    pub max_in_flight: u64,
    /// Fault kinds that actually took effect at least once.
    pub hit: BTreeSet<FaultKind>,
    /// Whether a rebalance was delivered while a drain was running.
    pub rebalance_during_drain: bool,
    /// Whether the sink is currently draining.
    pub draining: bool,
    /// Incarnations run (1 + crashes + restarts after failure).
    pub incarnations: u32,
    /// Indexes of instant faults already applied (kept across incarnations).
    pub applied: BTreeSet<usize>,
    /// Simulated time when every produced record was committed.
    pub caught_up_at: Option<Duration>,
    /// The trace.
    pub trace: Vec<TraceLine>,
}

impl World {
    /// A fresh world for `cfg`: empty logs, nothing committed.
    pub fn new(cfg: SimConfig) -> Self {
        let mut rng_seed = cfg.seed ^ 0xB0B0_CAFE_0000_0002;
        if crate::planted::planted(crate::planted::SimBug::Nondeterminism) {
            static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            rng_seed ^= RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let rng = SmallRng::seed_from_u64(rng_seed);
        Self {
            rng,
            base: Duration::ZERO,
            origin: tokio::time::Instant::now(),
            ended: false,
            logs: vec![Vec::new(); cfg.partitions],
            ids: vec![Vec::new(); cfg.partitions],
            records: Vec::new(),
            produced: vec![0; cfg.partitions],
            log_start: vec![0; cfg.partitions],
            fetched_end: vec![0; cfg.partitions],
            excused: vec![Vec::new(); cfg.partitions],
            resets_back: Vec::new(),
            range_first_tokens: BTreeMap::new(),
            lost_to_retention: 0,
            lost_to_truncation: 0,
            gaps: 0,
            commit_queue: VecDeque::new(),
            wrong_rows: Vec::new(),
            retention_done: BTreeSet::new(),
            fenced: BTreeSet::new(),
            schema: cfg.schema.clone(),
            wrong_values: Vec::new(),
            wrong_value_rows: 0,
            server_queue: VecDeque::new(),
            partial_inserts: 0,
            plan_version: 0,
            plan_row_bytes: crate::schema::IDENTITY_BYTES,
            unrecorded_inserts: Vec::new(),
            unrecorded: 0,
            schema_refusals: 0,
            committed: vec![None; cfg.partitions],
            committed_meta: vec![String::new(); cfg.partitions],
            epochs: vec![0; cfg.partitions],
            revoking: BTreeSet::new(),
            epoch_counter: 0,
            group_events: VecDeque::new(),
            reassign_on_release: BTreeSet::new(),
            evicted: false,
            replica_rows: vec![vec![0; cfg.replicas]; cfg.shards],
            shard_rows: vec![0; cfg.shards],
            fetches: Vec::new(),
            dedup: vec![DedupWindow::default(); cfg.shards],
            applied_tokens: vec![BTreeMap::new(); cfg.shards],
            replay_drops: 0,
            zombie_dropped: 0,
            dedup_misses: 0,
            dedup_miss_examples: Vec::new(),
            zombie_queue: Vec::new(),
            zombie_landed: 0,
            late_commits_fenced: 0,
            scheduled: cfg.faults.iter().fold(0, |m, f| m | f.kind.bit()),
            durable_prefix: vec![0; cfg.partitions],
            tokens: BTreeMap::new(),
            token_conflicts: Vec::new(),
            range_rows: BTreeMap::new(),
            token_rebodied: 0,
            commits: Vec::new(),
            stale_commits: Vec::new(),
            drains: Vec::new(),
            dedup_drops: 0,
            ambiguous_writes: 0,
            ambiguous_commits: 0,
            budget: None,
            max_in_flight: 0,
            hit: BTreeSet::new(),
            rebalance_during_drain: false,
            draining: false,
            incarnations: 0,
            applied: BTreeSet::new(),
            caught_up_at: None,
            trace: Vec::new(),
            cfg,
        }
    }

    /// Samples the in-flight budget (D8).
    pub fn sample_budget(&mut self) {
        if let Some(b) = &self.budget {
            self.max_in_flight = self.max_in_flight.max(b.bytes_in_use());
        }
    }

    /// Simulated time since the run began (`base` once the run has ended:
    /// no incarnation's paused clock runs then, and a wall clock must not
    /// leak into the trace, D7).
    pub fn now(&self) -> Duration {
        if self.ended {
            return self.base;
        }
        self.base + (tokio::time::Instant::now() - self.origin)
    }

    /// Appends a trace line at the current simulated time.
    pub fn trace(&mut self, what: impl Into<String>) {
        let at_ms = self.now().as_millis() as u64;
        self.trace.push(TraceLine {
            at_ms,
            what: what.into(),
        });
    }

    /// Whether a fault of `kind` matching `hits` is active now; records the hit.
    pub fn fault_active(&mut self, kind: FaultKind, hits: impl Fn(usize, usize) -> bool) -> bool {
        let active = self.fault_on(kind, hits);
        if active {
            self.hit.insert(kind);
        }
        active
    }

    /// Whether a fault of `kind` matching `hits` is active now (without
    /// recording a hit).
    pub fn fault_on(&self, kind: FaultKind, hits: impl Fn(usize, usize) -> bool) -> bool {
        if self.scheduled & kind.bit() == 0 {
            // Most runs schedule few kinds: skip the clock read (a mutex in
            // tokio's paused clock) for the rest.
            return false;
        }
        let now = self.now();
        self.cfg
            .faults
            .iter()
            .any(|f| f.kind == kind && f.active(now) && hits(f.target, f.target2))
    }

    /// Whether replica `r` of shard `s` is down now.
    pub fn replica_down(&self, s: usize, r: usize) -> bool {
        let (shards, replicas) = (self.cfg.shards, self.cfg.replicas);
        self.fault_on(FaultKind::ShardDown, |t, _| t % shards == s)
            || self.fault_on(FaultKind::ReplicaDown, |t, t2| {
                t % shards == s && t2 % replicas == r
            })
    }

    /// Records a part of `rows` rows inserted on replica `r` of shard `s`,
    /// and queues its fetch by every other replica after the replication lag.
    pub fn insert_part(&mut self, s: usize, r: usize, rows: u64) {
        self.shard_rows[s] += rows;
        self.replica_rows[s][r] += rows;
        let now = self.now();
        for to in (0..self.cfg.replicas).filter(|&to| to != r) {
            let (lo, hi) = self.cfg.replication_lag_ms;
            let lag = Duration::from_millis(self.rng.random_range(lo..=hi));
            self.fetches.push(Fetch {
                shard: s,
                replica: to,
                rows,
                due: now + lag,
            });
        }
    }

    /// Delivers the fetches that are due to replicas that are up (every
    /// fetch when `all`: the end of a run, once every fault has healed).
    pub fn replicate(&mut self, all: bool) {
        if self.fetches.is_empty() {
            return;
        }
        // At the end of a run no incarnation's clock runs: it ended at `base`.
        let now = if all { self.base } else { self.now() };
        let mut i = 0;
        while i < self.fetches.len() {
            let f = &self.fetches[i];
            if all || (f.due <= now && !self.replica_down(f.shard, f.replica)) {
                let f = self.fetches.remove(i);
                // Not traced (a line per part and replica would double the
                // trace); the replication oracle checks the totals.
                self.replica_rows[f.shard][f.replica] += f.rows;
            } else {
                i += 1;
            }
        }
    }

    /// A coin flip with probability `p` from the world's seeded RNG.
    pub fn rng_bool(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// A draw from `range` with the world's seeded RNG.
    pub fn rng_range(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        self.rng.random_range(range)
    }

    /// Whether any sink-side fault is active at any time in `[from, to]`,
    /// or the incarnation's probed schema is stale (its inserts are refused).
    pub fn sink_faulty_between(&self, from: Duration, to: Duration) -> bool {
        use FaultKind::*;
        self.schema.version != self.plan_version
            || self.cfg.faults.iter().any(|f| {
                matches!(
                    f.kind,
                    ReplicaDown
                        | ShardDown
                        | WriteErrors
                        | AmbiguousWrites
                        | SlowReplica
                        | PartialInsert
                        | QueuedRequests
                        | ZombieWrite
                ) && f.start <= to
                    && f.start + f.duration + Duration::from_secs(5) >= from
            })
    }

    /// Assigns `partition` under a fresh epoch and queues the event.
    pub fn assign(&mut self, partition: usize) {
        self.epoch_counter += 1;
        let epoch = self.epoch_counter;
        self.epochs[partition] = epoch;
        self.group_events
            .push_back(GroupEvent::Assign(partition, epoch));
        self.trace(format!("group assign p{partition} e{epoch}"));
    }

    /// Revokes `partition`'s current epoch (if assigned and not already
    /// revoking) and re-assigns it once released.
    pub fn rebalance(&mut self, partition: usize) {
        let epoch = self.epochs[partition];
        if epoch == 0 || self.revoking.contains(&(partition, epoch)) {
            return;
        }
        if self.draining {
            self.rebalance_during_drain = true;
        }
        self.revoking.insert((partition, epoch));
        self.reassign_on_release.insert(partition);
        self.group_events
            .push_back(GroupEvent::Revoke(partition, epoch));
        self.trace(format!("group revoke p{partition} e{epoch}"));
    }

    /// Appends a record with `payload_of(id)` to `partition`'s log.
    pub fn append_record(&mut self, partition: usize) {
        let id = self.records.len() as u32;
        let offset = self.ids[partition].len() as Offset;
        self.records.push(RecordFact {
            partition: partition as u32,
            offset,
            landed: 0,
            reformed: 0,
        });
        self.ids[partition].push(id);
        self.logs[partition].push(Bytes::from(crate::schema::payload(id)));
        self.produced[partition] += 1;
    }

    /// Appends an offset the consumer never sees (a control record, or an
    /// aborted record under `read_committed`).
    pub fn append_gap(&mut self, partition: usize) {
        self.ids[partition].push(GAP);
        self.logs[partition].push(Bytes::new());
        self.gaps += 1;
        self.advance_prefix(partition);
    }

    /// Whether the oracles demand nothing at `partition`'s `offset`.
    pub fn not_demanded(&self, partition: usize, offset: Offset) -> bool {
        offset < self.log_start[partition]
            || self.excused[partition]
                .iter()
                .any(|&(from, to)| offset >= from && offset < to)
    }

    /// Moves `partition`'s durable prefix over every offset that landed, is a
    /// gap, or is not demanded.
    pub fn advance_prefix(&mut self, partition: usize) {
        let ids = &self.ids[partition];
        let mut prefix = self.durable_prefix[partition];
        loop {
            // Past the log end only offsets not demanded count (a truncation
            // below what the consumer had read: those reads may be
            // committed over before the producer refills the offsets).
            let done = match ids.get(prefix as usize) {
                Some(&id) => {
                    id == GAP
                        || self.records[id as usize].landed > 0
                        || self.not_demanded(partition, prefix)
                }
                None => !self.excused[partition].is_empty() && self.not_demanded(partition, prefix),
            };
            if !done {
                break;
            }
            prefix += 1;
        }
        self.durable_prefix[partition] = prefix;
    }

    /// Records that a row of `partition`'s `offset`, naming record `id`,
    /// landed in a shard table.
    pub fn land(&mut self, partition: usize, offset: Offset, id: u32) {
        let named = self.records.get(id as usize);
        if named.is_none_or(|r| r.partition as usize != partition || r.offset != offset) {
            self.wrong_rows.push(format!(
                "a row names p{partition} offset {offset} record {id}, which is not there"
            ));
            return;
        }
        self.records[id as usize].landed += 1;
        self.advance_prefix(partition);
    }

    /// Lands a row under a range token re-formed after deletions (see
    /// [`RecordFact::reformed`]).
    pub fn land_reformed(&mut self, partition: usize, offset: Offset, id: u32) {
        let before = self.records.get(id as usize).map(|r| r.landed);
        self.land(partition, offset, id);
        if before != self.records.get(id as usize).map(|r| r.landed) {
            self.records[id as usize].reformed += 1;
        }
    }

    /// Whether the batch `token` (a block suffix `#i` stripped) is a range
    /// re-formed with other gaps than the first batch of its range had.
    pub fn reformed_range(&mut self, token: &str) -> bool {
        let batch = token.split('#').next().unwrap_or(token);
        let range = batch.split('~').next().unwrap_or(batch);
        let first = self
            .range_first_tokens
            .entry(range.to_owned())
            .or_insert_with(|| batch.to_owned());
        first != batch
    }

    /// Rows that landed more than once, over all partitions.
    pub fn duplicates(&self) -> u64 {
        self.records
            .iter()
            .map(|r| u64::from(r.landed.saturating_sub(1)))
            .sum()
    }

    /// One past `partition`'s last record the consumer can see (0 if none).
    pub fn live_end(&self, partition: usize) -> Offset {
        let ids = &self.ids[partition];
        let start = self.log_start[partition] as usize;
        ids.iter()
            .rposition(|&id| id != GAP)
            .filter(|&i| i >= start)
            .map_or(0, |i| i as Offset + 1)
    }

    /// Whether every produced record is committed (trailing gaps need not
    /// be: spate commits the last delivered offset + 1).
    pub fn caught_up(&self) -> bool {
        (0..self.cfg.partitions).all(|p| {
            self.produced[p] == self.cfg.records_per_partition
                && self.committed[p].is_some_and(|c| c >= self.live_end(p))
        })
    }

    /// An unclean leader election on `partition`: the log ends at a point
    /// up to 40 offsets back (never below the log start); the records past
    /// it are gone and the producer writes them again.
    /// Returns whether anything was removed.
    pub fn truncate(&mut self, partition: usize) -> bool {
        let end = self.ids[partition].len() as Offset;
        let start = self.log_start[partition];
        if end <= start {
            return false;
        }
        let to = self.rng.random_range(start.max(end - 40)..end);
        let lost = self.ids[partition][to as usize..]
            .iter()
            .filter(|&&id| id != GAP)
            .count();
        self.ids[partition].truncate(to as usize);
        self.logs[partition].truncate(to as usize);
        self.produced[partition] -= lost;
        self.lost_to_truncation += lost as u64;
        let read = self.fetched_end[partition].max(self.committed[partition].unwrap_or(0));
        if read > to {
            self.excused[partition].push((to, read));
        }
        self.durable_prefix[partition] = self.durable_prefix[partition].min(to);
        self.advance_prefix(partition);
        self.trace(format!(
            "unclean leader election p{partition}: log end {end} -> {to} ({lost} records lost, consumer had read to {read})"
        ));
        // The source seam promises increasing offsets within an epoch, so a
        // client that detects the truncation (KIP-320) ends the epoch: the
        // old lane fetches no more and the partition is re-assigned.
        let epoch = self.epochs[partition];
        if epoch != 0 {
            self.fenced.insert((partition, epoch));
            self.rebalance(partition);
        }
        true
    }

    /// Log compaction on `partition`: about a third of the records below the
    /// last one become gaps. Returns whether any did.
    pub fn compact(&mut self, partition: usize) -> bool {
        let end = self.ids[partition].len();
        let mut removed = 0;
        for o in (self.log_start[partition] as usize)..end.saturating_sub(1) {
            if self.ids[partition][o] != GAP && self.rng.random_bool(0.3) {
                self.ids[partition][o] = GAP;
                removed += 1;
            }
        }
        self.gaps += removed;
        self.advance_prefix(partition);
        self.trace(format!(
            "compaction p{partition}: {removed} records removed"
        ));
        removed > 0
    }

    /// Retention on `partition` while the consumer is down: the log start
    /// moves past the committed offset (to at most the log end). Returns
    /// whether it did (nothing past the commit: nothing to delete).
    pub fn retain(&mut self, partition: usize) -> bool {
        let end = self.ids[partition].len() as Offset;
        let committed = self.committed[partition]
            .unwrap_or(0)
            .max(self.log_start[partition]);
        if end <= committed {
            return false;
        }
        let to = self.rng.random_range(committed + 1..=end);
        let lost = (committed..to)
            .filter(|&o| {
                let id = self.ids[partition][o as usize];
                id != GAP && self.records[id as usize].landed == 0
            })
            .count();
        self.lost_to_retention += lost as u64;
        self.log_start[partition] = to;
        self.advance_prefix(partition);
        self.trace(format!(
            "retention p{partition}: log start -> {to} past commit {committed} ({lost} unread records deleted)"
        ));
        true
    }

    /// `ALTER TABLE` on every shard: ADD a missing field, DROP a column
    /// (never the last) or MODIFY a column's type, chosen at random (ADD
    /// when the table has no value column).
    pub fn alter(&mut self) {
        use crate::schema::{ColType, Column, FIELDS};
        let cols = self.schema.columns.len();
        let roll = self.rng.random_range(0..3);
        let what = if cols == 0 || (roll == 0 && cols < FIELDS) {
            let field = (0..FIELDS)
                .find(|f| self.schema.columns.iter().all(|c| c.field != *f))
                .expect("a missing field");
            let ty = ColType::ALL[self.rng.random_range(0..ColType::ALL.len())];
            let at = self.rng.random_range(0..=cols);
            self.schema.columns.insert(at, Column { field, ty });
            format!("ADD COLUMN f{field} {ty:?}")
        } else if roll == 1 && cols > 1 {
            let at = self.rng.random_range(0..cols);
            let c = self.schema.columns.remove(at);
            format!("DROP COLUMN f{}", c.field)
        } else {
            let at = self.rng.random_range(0..cols);
            let old = self.schema.columns[at].ty;
            let others: Vec<ColType> = ColType::ALL.into_iter().filter(|t| *t != old).collect();
            let ty = others[self.rng.random_range(0..others.len())];
            self.schema.columns[at].ty = ty;
            format!(
                "MODIFY COLUMN f{} {old:?} -> {ty:?}",
                self.schema.columns[at].field
            )
        };
        self.schema.version += 1;
        let now = self.schema.describe();
        self.trace(format!("ALTER TABLE {what}: schema {now}"));
    }

    /// Applies the slow coordinator's queued commits that are due. The
    /// coordinator checks the member's generation when it processes a
    /// request, not when it takes it: a queued commit whose member has been
    /// evicted, or whose epoch is no longer the member's (a rebalance or a
    /// new incarnation came first), is refused then, so a zombie's queued
    /// commit can neither move the offset nor record ranges.
    pub fn apply_due_commits(&mut self) {
        let now = self.now();
        while self.commit_queue.front().is_some_and(|c| c.due <= now) {
            let c = self.commit_queue.pop_front().expect("front");
            let owned = self.epochs[c.partition] == c.epoch
                || self.revoking.contains(&(c.partition, c.epoch));
            if self.evicted || !owned {
                self.late_commits_fenced += 1;
                let why = if self.evicted {
                    "member evicted"
                } else {
                    "stale epoch"
                };
                self.trace(format!(
                    "commit late p{}={} e{} refused ({why})",
                    c.partition, c.offset, c.epoch
                ));
                continue;
            }
            self.apply_commit(c.partition, c.offset, c.epoch, &c.metadata, " late");
        }
    }

    /// Stores a commit (offset and metadata) and records the fact with the
    /// durable prefix now (D1).
    pub fn apply_commit(
        &mut self,
        p: usize,
        offset: Offset,
        epoch: Epoch,
        metadata: &str,
        how: &str,
    ) {
        let at_ms = self.now().as_millis() as u64;
        let durable_prefix = self.durable_prefix[p];
        self.commits.push(CommitFact {
            at_ms,
            partition: p,
            offset,
            durable_prefix,
            metadata: metadata.to_owned(),
        });
        self.committed[p] = Some(offset);
        if self.committed_meta[p] != metadata {
            metadata.clone_into(&mut self.committed_meta[p]);
        }
        // The line is as it was before commits carried metadata when there
        // is none (at-least-once runs keep their trace hashes).
        let meta = if metadata.is_empty() {
            String::new()
        } else {
            format!(" meta={metadata}")
        };
        self.trace(format!(
            "commit{how} p{p}={offset} e{epoch} (durable {durable_prefix}){meta}"
        ));
    }

    /// Holds a zombie's insert until `due`, when it runs
    /// ([`World::run_zombies`]).
    pub fn hold_zombie(&mut self, insert: QueuedInsert) {
        self.trace(format!(
            "s{}r{} zombie insert {} held until {} ms",
            insert.shard,
            insert.replica,
            insert.token,
            insert.due.as_millis()
        ));
        self.zombie_queue.push(insert);
    }
}

/// How many wrong-value rows a run keeps described (the rest are counted).
pub const WRONG_VALUES_KEPT: usize = 8;

/// An insert a frozen replica holds, to run at `due`.
#[derive(Clone, Debug)]
pub struct QueuedInsert {
    /// When it runs.
    pub due: Duration,
    /// Shard.
    pub shard: usize,
    /// Replica.
    pub replica: usize,
    /// The insert's token.
    pub token: String,
    /// The columns the insert names (the schema its incarnation probed).
    pub named: crate::schema::Plan,
    /// The insert's body.
    pub body: bytes::Bytes,
}

/// The id of an offset the consumer never sees.
pub const GAP: u32 = u32::MAX;

/// A produced record: where it is (or was) and how often its row landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordFact {
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: Offset,
    /// How many of its rows landed in shard tables.
    pub landed: u32,
    /// How many of those landed under a range token re-formed with other
    /// gaps than the range's first write had (records deleted inside the
    /// range since: ADR 0004 holds such a replay to D1, not D9).
    pub reformed: u32,
}

/// A commit the slow coordinator has taken and not yet applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedCommit {
    /// When it applies.
    pub due: Duration,
    /// Partition.
    pub partition: usize,
    /// Offset.
    pub offset: Offset,
    /// Epoch it was sent under.
    pub epoch: Epoch,
    /// The metadata string sent with it.
    pub metadata: String,
}

/// A part on its way from the replica that took the insert to another
/// replica of the shard.
#[derive(Clone, Debug)]
pub struct Fetch {
    /// The shard.
    pub shard: usize,
    /// The replica that will fetch it.
    pub replica: usize,
    /// Rows in the part.
    pub rows: u64,
    /// Simulated time from which the fetch can happen.
    pub due: Duration,
}

/// A shard's window of the most recent insert tokens (ReplicatedMergeTree
/// keeps the last `replicated_deduplication_window` block ids, 100 by
/// default). Membership is a set lookup; the queue keeps the order in which
/// tokens leave.
#[derive(Clone, Debug, Default)]
pub struct DedupWindow {
    order: VecDeque<String>,
    members: BTreeSet<String>,
}

impl DedupWindow {
    /// Whether `token` is in the window.
    pub fn contains(&self, token: &str) -> bool {
        self.members.contains(token)
    }

    /// Adds `token`, dropping the oldest beyond `window` tokens.
    pub fn insert(&mut self, token: &str, window: usize) {
        if self.members.insert(token.to_owned()) {
            self.order.push_back(token.to_owned());
        }
        while self.order.len() > window {
            if let Some(old) = self.order.pop_front() {
                self.members.remove(&old);
            }
        }
    }

    /// Forgets every token (a restart that loses the window).
    pub fn clear(&mut self) {
        self.order.clear();
        self.members.clear();
    }
}

/// FNV-1a over `bytes`: a stable hash for traces and token bodies.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>, mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// The FNV-1a offset basis.
pub const FNV_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
