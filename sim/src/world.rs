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
    /// Per partition, the log of payloads.
    pub logs: Vec<Vec<Bytes>>,
    /// Per partition, the committed offset.
    pub committed: Vec<Option<Offset>>,
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
    /// The fault kinds in the schedule, one bit each ([`FaultKind::bit`]).
    pub scheduled: u32,
    /// Per partition and offset, how many times the row landed.
    pub landed: Vec<Vec<u32>>,
    /// Per partition, the contiguous durable prefix length.
    pub durable_prefix: Vec<Offset>,
    /// Token to FNV hash of the bytes it carried, over all incarnations.
    pub tokens: BTreeMap<String, u64>,
    /// Tokens that were seen with two different bodies (D4 violations).
    pub token_conflicts: Vec<String>,
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
            logs: vec![Vec::new(); cfg.partitions],
            committed: vec![None; cfg.partitions],
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
            scheduled: cfg.faults.iter().fold(0, |m, f| m | f.kind.bit()),
            landed: vec![Vec::new(); cfg.partitions],
            durable_prefix: vec![0; cfg.partitions],
            tokens: BTreeMap::new(),
            token_conflicts: Vec::new(),
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

    /// Simulated time since the run began.
    pub fn now(&self) -> Duration {
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

    /// Whether a fault of `kind` matching `hits` is active now.
    fn fault_on(&self, kind: FaultKind, hits: impl Fn(usize, usize) -> bool) -> bool {
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

    /// Whether any sink-side fault is active at any time in `[from, to]`.
    pub fn sink_faulty_between(&self, from: Duration, to: Duration) -> bool {
        use FaultKind::*;
        self.cfg.faults.iter().any(|f| {
            matches!(
                f.kind,
                ReplicaDown | ShardDown | WriteErrors | AmbiguousWrites | SlowReplica
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

    /// Records that `partition`'s `offset` landed in a shard table.
    pub fn land(&mut self, partition: usize, offset: Offset) {
        let landed = &mut self.landed[partition];
        let i = offset as usize;
        if landed.len() <= i {
            landed.resize(i + 1, 0);
        }
        landed[i] += 1;
        let prefix = &mut self.durable_prefix[partition];
        while (*prefix as usize) < landed.len() && landed[*prefix as usize] > 0 {
            *prefix += 1;
        }
    }

    /// Rows that landed more than once, over all partitions.
    pub fn duplicates(&self) -> u64 {
        self.landed
            .iter()
            .flatten()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum()
    }

    /// Whether every produced record is committed.
    pub fn caught_up(&self) -> bool {
        (0..self.cfg.partitions).all(|p| {
            self.logs[p].len() == self.cfg.records_per_partition
                && self.committed[p] == Some(self.logs[p].len() as Offset)
        })
    }
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
