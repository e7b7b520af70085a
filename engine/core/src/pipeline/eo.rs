//! `delivery: effectively_once` (D9): per-partition ranges, recorded in the
//! partition's commit metadata before they are written, re-formed on replay.
//!
//! - A pipeline thread forms, per lane, one open **range** `[first, last]` of
//!   the partition's offsets at a time: the rows of every payload in it, in
//!   one buffer per shard. It seals the range at a payload boundary by size
//!   or linger (the sink's `batch` limits, applied to each shard part), or,
//!   while replaying, exactly at a recorded boundary ([`Former`]).
//! - A sealed range goes to the controller ([`SealedRange`], unbounded
//!   channel: the thread never waits, D2). The controller ([`Recorder`])
//!   commits the partition with offset = its committed watermark and
//!   metadata = every sealed range the watermark has not passed
//!   ([`crate::checkpoint::ranges`]); only when that commit returned `Ok`
//!   does it raise the lane's [`RangeGate::recorded`], and only then does
//!   the thread hand the range's shard parts to the pool, each as its own
//!   batch with [`crate::sink::range_token`] (D9: recorded before written).
//! - A rejected commit (fenced, evicted) leaves the gate where it was: those
//!   ranges are never written by this member; they stay unacknowledged, so
//!   nothing is committed past them (D1), and they are dropped once the
//!   revoke has released the epoch ([`RangeGate::closed`]).
//! - A lane whose pending list holds [`MAX_PENDING_RANGES`] ranges seals no
//!   new one and is paused, polled on (D2), until the watermark passes some.
//!
//! Why the controller makes the write-ahead commit: it owns the
//! [`crate::source::Source`] (the only commit path, and single-threaded, so
//! the order of commits of one partition is the order they are made), and it
//! already knows each partition's watermark from the checkpointer; see
//! docs/adr/0004-effectively-once.md.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::Instant;

use crate::ack::AckSet;
use crate::budget::{Budget, BudgetPermit};
use crate::checkpoint::ranges::{self, Member, RECORD_CAPACITY, RangesError, Recorded};
use crate::pipeline::chain::RecordError;
use crate::record::{Epoch, Offset, TopicPartition};
use crate::sink::{Chunk, PoolHandle, PushError, range_token};
use crate::source::Committed;

/// What a lane's thread and the controller share about its ranges. Atomics
/// only: the thread reads them without a lock (D2).
#[derive(Debug, Default)]
pub(crate) struct RangeGate {
    /// Free ranges with a sequence number below this are in a commit the
    /// group accepted: their parts may be written.
    recorded: AtomicU64,
    /// Ranges sealed (or replayed) and not yet passed by the watermark.
    pending: AtomicUsize,
    /// What those ranges take of the lane's record, in bytes
    /// ([`ranges::item_weight`]): a lane seals nothing its record could not
    /// hold within [`ranges::MAX_METADATA_BYTES`].
    weight: AtomicUsize,
    /// The epoch ended (released after a revoke): drop what is not written.
    closed: AtomicBool,
    /// What the thread's flush last stopped on ([`Waits`] as a byte), for
    /// the controller's stall report; written only when it changes.
    waits: AtomicU8,
}

/// What a lane's ranges last waited on at its thread, for the stall report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Waits {
    Nothing = 0,
    /// The in-flight budget refused the range's rows (D8).
    Budget = 1,
    /// A shard's queue to the sink is full.
    ShardQueue = 2,
}

impl Waits {
    fn describe(code: u8) -> &'static str {
        match code {
            1 => "the in-flight budget (sink.budget) refused its rows",
            2 => "a shard queue to the sink is full",
            _ => {
                "nothing at its thread (its parts are with the sink, or it waits for its record commit or for rows to poll)"
            }
        }
    }
}

impl RangeGate {
    /// Whether free range `seq` was recorded (its parts may be written).
    pub(crate) fn is_recorded(&self, seq: u64) -> bool {
        crate::planted::active(crate::planted::Bug::InsertBeforeRecord)
            || seq < self.recorded.load(Ordering::Acquire)
    }

    /// Whether the lane holds as many pending ranges as the metadata fits
    /// (no room for one more solo).
    pub(crate) fn is_full(&self) -> bool {
        !self.has_room(ranges::item_weight(1), RECORD_CAPACITY)
    }

    /// Whether an item of `weight` bytes fits the lane's record beside what
    /// it holds, within `capacity`.
    fn has_room(&self, weight: usize, capacity: usize) -> bool {
        self.weight.load(Ordering::Acquire) + weight <= capacity
    }

    /// Whether the epoch ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Notes what the thread's flush stopped on (an atomic store only when
    /// it changed: no cost on the common path).
    fn wait_on(&self, w: Waits) {
        if self.waits.load(Ordering::Relaxed) != w as u8 {
            self.waits.store(w as u8, Ordering::Relaxed);
        }
    }

    /// A free range taking `weight` bytes of the record was sealed.
    pub(crate) fn sealed(&self, weight: usize) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.weight.fetch_add(weight, Ordering::AcqRel);
    }

    /// `n` ranges taking `weight` bytes left the record (passed by the
    /// watermark, or a group never recorded).
    fn retired(&self, n: usize, weight: usize) {
        let pending = self.pending.fetch_sub(n, Ordering::AcqRel);
        let held = self.weight.fetch_sub(weight, Ordering::AcqRel);
        debug_assert!(
            pending >= n && held >= weight,
            "D9: a gate retires more ranges ({n}, {weight} bytes) than it counts ({pending}, {held} bytes)"
        );
    }
}

/// A recorded range to re-form first: a solo, or one member of a group.
#[derive(Clone, Debug)]
pub(crate) struct ReplayItem {
    pub(crate) first: Offset,
    pub(crate) last: Offset,
    /// The recorded group it is a member of: every member, sorted by
    /// partition, this lane's among them.
    pub(crate) group: Option<Arc<[Member]>>,
}

/// A free range a thread sealed, for the controller to record. The members
/// of one group travel in one message ([`Sealed`]), so the controller never
/// commits a record naming the group in some members and not in the others
/// (ADR 0007, C5).
#[derive(Debug)]
pub(crate) struct SealedRange {
    pub(crate) partition: TopicPartition,
    pub(crate) epoch: Epoch,
    pub(crate) seq: u64,
    pub(crate) first: Offset,
    pub(crate) last: Offset,
    /// The group the range is a member of (`None`: a solo).
    pub(crate) group: Option<Arc<[Member]>>,
}

/// What one seal sends the controller: a solo's range, or every member of
/// a group.
pub(crate) type Sealed = Vec<SealedRange>;

/// What a lane's thread needs to form its ranges, made by the controller at
/// assignment.
#[derive(Debug)]
pub struct LanePlan {
    pub(crate) gate: Arc<RangeGate>,
    pub(crate) tx: UnboundedSender<Sealed>,
    /// Recorded ranges to re-form first, in offset order (D9).
    pub(crate) replay: VecDeque<ReplayItem>,
}

/// One range of a lane's record the watermark has not passed.
#[derive(Debug)]
struct PendingItem {
    last: Offset,
    /// The free range's seq; `None` if replayed (recorded before this run).
    seq: Option<u64>,
    /// The group it is a member of (`None`: a solo).
    group: Option<Arc<[Member]>>,
}

impl PendingItem {
    fn weight(&self) -> usize {
        ranges::item_weight(self.group.as_ref().map_or(1, |g| g.len()))
    }
}

#[derive(Debug)]
struct LaneRecord {
    gate: Arc<RangeGate>,
    /// Pending ranges by first offset.
    ranges: BTreeMap<Offset, PendingItem>,
    /// Highest free seq received + 1.
    received: u64,
    /// The offset committed last (or found committed at assignment).
    committed: Option<Offset>,
    /// Ranges received and not yet in an accepted commit.
    dirty: bool,
    /// A commit of this epoch was rejected: it records nothing more.
    rejected: bool,
    /// When the committed offset last moved (or the lane was assigned),
    /// and whether the stall report already named it since.
    moved_at: Instant,
    reported: bool,
}

/// One commit the recorder wants made, and what it settles.
#[derive(Debug)]
pub(crate) struct RecordCommit {
    pub(crate) partition: TopicPartition,
    pub(crate) epoch: Epoch,
    pub(crate) offset: Offset,
    pub(crate) metadata: String,
    received: u64,
}

/// The controller's side: every lane's pending ranges (D9).
#[derive(Debug)]
pub(crate) struct Recorder {
    tx: UnboundedSender<Sealed>,
    rx: UnboundedReceiver<Sealed>,
    lanes: BTreeMap<(TopicPartition, Epoch), LaneRecord>,
    /// Whether lanes re-form recorded groups ([`crate::source::Source::reads_ranges`]);
    /// if not, a record holding one fails the partition.
    groups: bool,
}

impl Recorder {
    /// A recorder; `groups`: lanes re-form recorded range groups (the
    /// source reads ranges, ADR 0007).
    pub(crate) fn new(groups: bool) -> Self {
        let (tx, rx) = unbounded_channel();
        Self {
            tx,
            rx,
            lanes: BTreeMap::new(),
            groups,
        }
    }

    /// A new lane: decodes the group's metadata into the ranges to replay.
    ///
    /// # Errors
    /// The metadata is not ours (or malformed, or holds a group while this
    /// pipeline re-forms none): the caller fails the partition naming it
    /// (never read as "no ranges", D9).
    pub(crate) fn assign(
        &mut self,
        partition: &TopicPartition,
        epoch: Epoch,
        committed: Option<&Committed>,
    ) -> Result<LanePlan, RangesError> {
        let mut replay = match committed {
            Some(_) if crate::planted::active(crate::planted::Bug::ReplayIgnoresRanges) => {
                VecDeque::new()
            }
            Some(c) => self.decode(&c.metadata, partition)?,
            None => VecDeque::new(),
        };
        let offset = committed.map(|c| c.offset);
        // Ranges wholly behind the committed offset are done.
        replay.retain(|r| offset.is_none_or(|o| r.last >= o));
        debug_assert!(
            !self.lanes.contains_key(&(partition.clone(), epoch)),
            "D9: {partition} epoch {epoch} assigned twice"
        );
        debug_assert!(
            replay
                .iter()
                .zip(replay.iter().skip(1))
                .all(|(a, b)| a.last < b.first),
            "D9: the recorded ranges of {partition} to re-form are not sorted and disjoint"
        );
        let gate = Arc::new(RangeGate::default());
        let ranges: BTreeMap<Offset, PendingItem> = replay
            .iter()
            .map(|r| {
                let item = PendingItem {
                    last: r.last,
                    seq: None,
                    group: r.group.clone(),
                };
                (r.first, item)
            })
            .collect();
        let weight = ranges.values().map(PendingItem::weight).sum();
        gate.pending.store(ranges.len(), Ordering::Release);
        gate.weight.store(weight, Ordering::Release);
        let record = LaneRecord {
            gate: Arc::clone(&gate),
            ranges,
            received: 0,
            committed: offset,
            dirty: false,
            rejected: false,
            moved_at: Instant::now(),
            reported: false,
        };
        self.lanes.insert((partition.clone(), epoch), record);
        Ok(LanePlan {
            gate,
            tx: self.tx.clone(),
            replay,
        })
    }

    /// The items of `partition`'s record, solos and group members.
    fn decode(
        &self,
        metadata: &str,
        partition: &TopicPartition,
    ) -> Result<VecDeque<ReplayItem>, RangesError> {
        if !self.groups {
            let solos = ranges::decode_solos(metadata, partition)?;
            return Ok(solos
                .into_iter()
                .map(|(first, last)| ReplayItem {
                    first,
                    last,
                    group: None,
                })
                .collect());
        }
        Ok(ranges::decode_record(metadata, partition)?
            .into_iter()
            .map(|r| ReplayItem {
                first: r.first,
                last: r.last,
                group: (!r.group.is_empty()).then(|| r.group.into()),
            })
            .collect())
    }

    /// The epoch was released: the thread drops what it holds unwritten,
    /// and groups of it no commit recorded yet are recorded by no member.
    pub(crate) fn release(&mut self, partition: &TopicPartition, epoch: Epoch) {
        if let Some(r) = self.lanes.remove(&(partition.clone(), epoch)) {
            r.gate.closed.store(true, Ordering::Release);
            self.drop_unrecorded_groups(partition);
        }
    }

    /// Takes the ranges threads sealed; `true` if a lane now has ranges to
    /// record.
    pub(crate) fn receive(&mut self) -> bool {
        let mut any = false;
        while let Ok(sealed) = self.rx.try_recv() {
            // A group whose member lane is gone or rejected can be recorded
            // in none of them (one request, ADR 0007): the thread never
            // writes it, its acks fail with it.
            let whole = sealed.iter().all(|s| {
                self.lanes
                    .get(&(s.partition.clone(), s.epoch))
                    .is_some_and(|r| !r.rejected)
            });
            for s in sealed {
                let Some(r) = self.lanes.get_mut(&(s.partition.clone(), s.epoch)) else {
                    continue; // released meanwhile: the thread drops it
                };
                debug_assert_eq!(s.seq, r.received, "D9: free ranges arrive in order");
                r.received = s.seq + 1;
                let item = PendingItem {
                    last: s.last,
                    seq: Some(s.seq),
                    group: s.group,
                };
                if !whole {
                    r.gate.retired(1, item.weight());
                    continue;
                }
                debug_assert!(
                    s.first <= s.last && !overlaps(&r.ranges, s.first, s.last),
                    "D9: sealed range {}..={} of epoch {} is empty or overlaps a pending one",
                    s.first,
                    s.last,
                    s.epoch
                );
                r.ranges.insert(s.first, item);
                r.dirty = true;
                any |= !r.rejected;
            }
        }
        any
    }

    /// Whether some lane has ranges not yet recorded.
    pub(crate) fn has_dirty(&self) -> bool {
        self.lanes.values().any(|r| r.dirty && !r.rejected)
    }

    /// The commits to make: every lane in `watermarks` (its new committable
    /// offset) and, when `dirty_too` or when a listed lane holds a group
    /// not yet recorded, every lane with unrecorded ranges (at its
    /// committed offset): the members of a group are recorded in one
    /// request (ADR 0007). Every one carries the lane's pending ranges.
    pub(crate) fn commits(
        &self,
        watermarks: &BTreeMap<(TopicPartition, Epoch), Offset>,
        dirty_too: bool,
    ) -> Vec<RecordCommit> {
        let dirty_groups = self.lanes.iter().any(|(k, r)| {
            watermarks.contains_key(k) && !r.rejected && r.dirty && r.holds_unrecorded_group()
        });
        let dirty_too = dirty_too || dirty_groups;
        let mut out = Vec::new();
        for ((p, e), r) in &self.lanes {
            let moved = watermarks.get(&(p.clone(), *e)).copied();
            if r.rejected || (moved.is_none() && !(dirty_too && r.dirty)) {
                continue;
            }
            if let Some(c) = r.commit(p, *e, moved) {
                out.push(c);
            }
        }
        out
    }

    /// The group accepted `commits`: their ranges are recorded (the gate
    /// opens, D9) and those the offset passed are retired.
    pub(crate) fn accepted(&mut self, commits: &[RecordCommit]) {
        for c in commits {
            let Some(r) = self.lanes.get_mut(&(c.partition.clone(), c.epoch)) else {
                continue;
            };
            if r.committed != Some(c.offset) {
                r.moved_at = Instant::now();
                r.reported = false;
            }
            r.committed = Some(c.offset);
            debug_assert!(
                c.received <= r.received,
                "D9: a commit of {} settles ranges the recorder never received",
                c.partition
            );
            let (mut n, mut weight) = (0, 0);
            r.ranges.retain(|_, item| {
                let keep = item.last >= c.offset;
                if !keep {
                    n += 1;
                    weight += item.weight();
                }
                keep
            });
            r.gate.retired(n, weight);
            // D9: raised only after the commit listing them returned Ok.
            r.gate.recorded.fetch_max(c.received, Ordering::AcqRel);
            r.dirty = r.received > c.received;
        }
    }

    /// Logs, once per stall, each lane whose committed offset has not moved
    /// for `after` while it holds pending ranges: the partition, the
    /// committed offset, the first pending range and what it waits on (a
    /// record commit, the in-flight budget, a shard queue, or the sink's
    /// acknowledgement), so a stalled partition is visible (issue 23's
    /// group test saw lanes stop with nothing logged). Returns how many it
    /// named this time.
    pub(crate) fn report_stalls(&mut self, now: Instant, after: std::time::Duration) -> usize {
        let mut named = 0;
        for ((p, e), r) in &mut self.lanes {
            if r.reported || r.ranges.is_empty() || now.duration_since(r.moved_at) < after {
                continue;
            }
            r.reported = true;
            named += 1;
            let (first, item) = r.ranges.iter().next().expect("not empty");
            let last = item.last;
            let on = if r.rejected {
                "nothing more: a commit of this epoch was rejected (fenced or evicted); it waits for the revoke"
            } else if r.dirty {
                "its record commit (ranges sealed, not yet in an accepted commit)"
            } else {
                Waits::describe(r.gate.waits.load(Ordering::Relaxed))
            };
            tracing::warn!(
                partition = %p,
                epoch = *e,
                committed = ?r.committed,
                pending_ranges = r.ranges.len(),
                first_pending = %format!("{first}..={last}"),
                stalled_for = ?now.duration_since(r.moved_at),
                waits_on = on,
                "effectively_once: partition {p} has not committed for {:?}; its first pending range {first}..={last} waits on {on}",
                now.duration_since(r.moved_at),
            );
        }
        named
    }

    /// The group rejected a commit of `partition` at `epoch` (fenced,
    /// evicted): this member records nothing more for it, so its unrecorded
    /// ranges are never written (they stay unacknowledged, D1), and neither
    /// are the groups it is a member of that no commit recorded yet: the
    /// other members' next commits list them no more (ADR 0007).
    pub(crate) fn rejected(&mut self, partition: &TopicPartition, epoch: Epoch) {
        if let Some(r) = self.lanes.get_mut(&(partition.clone(), epoch)) {
            r.rejected = true;
            self.drop_unrecorded_groups(partition);
        }
    }

    /// Forgets, in every lane, the groups holding `partition` that no
    /// accepted commit recorded: their parts wait on a gate that never
    /// opens and drop with the epoch (their acks fail, D1).
    fn drop_unrecorded_groups(&mut self, partition: &TopicPartition) {
        for r in self.lanes.values_mut() {
            let recorded = r.gate.recorded.load(Ordering::Acquire);
            let (mut n, mut weight) = (0, 0);
            r.ranges.retain(|_, item| {
                let drop = item.seq.is_some_and(|s| s >= recorded)
                    && item
                        .group
                        .as_ref()
                        .is_some_and(|g| g.iter().any(|m| m.partition == *partition));
                if drop {
                    n += 1;
                    weight += item.weight();
                }
                !drop
            });
            r.gate.retired(n, weight);
        }
    }
}

impl LaneRecord {
    /// Whether a range sealed as a group member is not yet recorded.
    fn holds_unrecorded_group(&self) -> bool {
        let recorded = self.gate.recorded.load(Ordering::Acquire);
        self.ranges
            .values()
            .any(|i| i.group.is_some() && i.seq.is_some_and(|s| s >= recorded))
    }

    /// The commit of this lane at its watermark `moved` (else what is
    /// committed, else its first range's start), listing its pending items.
    fn commit(&self, p: &TopicPartition, e: Epoch, moved: Option<Offset>) -> Option<RecordCommit> {
        // The watermark, else what is committed, else (nothing ever
        // committed) the first range's start: nothing before it was read.
        // Never below what is committed (a watermark over filtered
        // payloads can trail a first range's start).
        let offset = moved
            .max(self.committed)
            .or_else(|| self.ranges.keys().next().copied())?;
        // Never into a pending range (the watermark passes a range's
        // offsets as their rows' shard parts are acknowledged): a replay
        // reads from the committed offset, and must re-form the whole
        // range, the same rows under the same token (D9; the
        // simulator's D4 oracle found a replay of a range cut short).
        let offset = self
            .ranges
            .iter()
            .find(|&(&f, i)| f < offset && i.last >= offset)
            .map_or(offset, |(&f, _)| f);
        let items: Vec<Recorded> = self
            .ranges
            .iter()
            .filter(|(_, i)| i.last >= offset)
            .map(|(&first, i)| Recorded {
                first,
                last: i.last,
                group: i
                    .group
                    .as_deref()
                    .map(<[Member]>::to_vec)
                    .unwrap_or_default(),
            })
            .collect();
        debug_assert!(
            !self
                .ranges
                .iter()
                .any(|(&f, i)| f < offset && offset <= i.last),
            "D9: the commit {offset} of {p} stops inside a pending range, so a replay would cut it short"
        );
        debug_assert!(
            items.first().is_none_or(|i| i.first >= offset),
            "D9: the commit {offset} of {p} lists a range it has passed"
        );
        let metadata = ranges::encode_record(p, &items);
        debug_assert!(
            metadata.len() <= ranges::MAX_METADATA_BYTES,
            "D9: the record of {p} is {} bytes, over the broker's limit",
            metadata.len()
        );
        Some(RecordCommit {
            partition: p.clone(),
            epoch: e,
            offset,
            metadata,
            received: self.received,
        })
    }
}

/// Whether `first..=last` shares an offset with a range in `ranges` (by
/// first offset).
fn overlaps(ranges: &BTreeMap<Offset, PendingItem>, first: Offset, last: Offset) -> bool {
    let before = ranges.range(..=first).next_back();
    let after = ranges.range(first..).next();
    before.is_some_and(|(_, i)| i.last >= first) || after.is_some_and(|(&f, _)| f <= last)
}

/// What a thread needs to seal ranges: the token's names and the size and
/// linger limits (the sink's `batch`, applied to each shard part, since a
/// part is written as it is).
#[derive(Clone, Debug)]
pub(crate) struct EoConfig {
    pub(crate) pipeline: String,
    pub(crate) table: String,
    pub(crate) max_rows: u64,
    pub(crate) max_bytes: u64,
    pub(crate) linger: std::time::Duration,
    /// An open range takes budget for its rows every this many bytes
    /// (`pipeline.chunk_bytes`), so open ranges stay under the in-flight
    /// budget as chunks do (D8).
    pub(crate) pay_every: u64,
}

#[derive(Debug, Default)]
struct Part {
    buf: Vec<u8>,
    rows: u64,
    acks: AckSet,
}

#[derive(Debug)]
struct OpenRange {
    first: Offset,
    /// The last payload offset taken (free) or the recorded bound (fixed).
    last: Offset,
    /// A recorded range being re-formed: its bounds are fixed (D9).
    fixed: bool,
    parts: Vec<Part>,
    opened_at: Instant,
    /// Encoded bytes and rows over all parts.
    bytes: u64,
    rows: u64,
    /// The budget taken so far for them (D8).
    permit: Option<BudgetPermit>,
    /// The offset the next payload has if the log holds every offset of
    /// the range from here on.
    next: Offset,
    /// The range's offset gaps so far (0: none), see [`range_gaps`].
    gaps: u64,
}

impl OpenRange {
    fn new(first: Offset, last: Offset, fixed: bool, shards: usize) -> Self {
        Self {
            first,
            last,
            fixed,
            parts: (0..shards).map(|_| Part::default()).collect(),
            opened_at: Instant::now(),
            bytes: 0,
            rows: 0,
            permit: None,
            next: first,
            gaps: 0,
        }
    }

    /// Notes the payload at `offset`: a gap before it changes `gaps`.
    fn saw(&mut self, offset: Offset) {
        if offset != self.next {
            self.gaps = range_gaps(self.gaps, self.next, offset);
        }
        self.next = offset + 1;
    }

    /// The range's gap digest (0: the log held every offset `first..=last`
    /// as the range was formed).
    fn gap_digest(&self) -> u64 {
        if self.next <= self.last {
            // A replayed range whose last records are gone.
            range_gaps(self.gaps, self.next, self.last + 1)
        } else {
            self.gaps
        }
    }

    /// The token suffix naming the range's composition: empty when the log
    /// held every offset `first..=last` as the range was formed.
    fn composition(&self) -> String {
        let gaps = self.gap_digest();
        if gaps == 0 {
            String::new()
        } else {
            format!("~{gaps:016x}")
        }
    }

    fn is_full(&self, cfg: &EoConfig) -> bool {
        self.parts
            .iter()
            .any(|p| p.rows >= cfg.max_rows || p.buf.len() as u64 >= cfg.max_bytes)
    }
}

#[derive(Debug)]
struct ReadyPart {
    shard: usize,
    data: Bytes,
    rows: u64,
    acks: AckSet,
    token: String,
    permit: Option<BudgetPermit>,
}

#[derive(Debug)]
struct SealedParts {
    /// The free range's seq (written once recorded); `None` for a replayed
    /// range, recorded before this run.
    seq: Option<u64>,
    parts: VecDeque<ReadyPart>,
    /// The range took budget as it grew: its parts go to the pool with
    /// what it paid, the rest (under `pay_every` bytes plus what a lane
    /// paused by a refusal had fetched, the bound D8 already allows an
    /// open range) unpaid. Waiting at hand-over for that rest while
    /// holding the paid share is what deadlocked lanes: each held part of
    /// the budget and waited for more (the simulator's liveness oracle,
    /// seed 6179).
    paid: bool,
}

/// Folds the gap `missing..present` (offsets a range spans that the log
/// does not hold: transaction markers, compaction, retention) into `gaps`.
///
/// A range's token names its bounds, and a token-deduplicating table drops
/// every block of a replay whose token it holds. When compaction or
/// retention removes records inside a recorded range before it is replayed,
/// the re-formed parts hold fewer rows, split into blocks at other rows: a
/// replay under the first token would have blocks dropped that hold rows
/// the first write never landed (fresh seeds 3006368 and 3017406 lost rows
/// that way after a partial insert). So the token carries the range's gaps:
/// the same log gives the same gaps and the same token (D9), a log that
/// lost records gives another token and the rows land again (duplicates,
/// held to D1), never fewer.
fn range_gaps(gaps: u64, missing: Offset, present: Offset) -> u64 {
    debug_assert!(missing != present, "a gap spans at least one offset");
    let mut h = gaps ^ 0x9E37_79B9_7F4A_7C15;
    for v in [missing as u64, present as u64] {
        // splitmix64's finaliser over each bound: pure, stable across
        // versions and platforms (a token must be).
        h = (h ^ v).wrapping_add(0x9E37_79B9_7F4A_7C15);
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
    }
    // 0 means "no gaps": never the result of a gap.
    h.max(1)
}

/// What [`Former::flush`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FormerFlush {
    Clear,
    /// A sealed range waits for its record.
    Waiting,
    /// Budget or a shard queue is full.
    Blocked,
}

/// One lane's ranges on its pipeline thread.
#[derive(Debug)]
pub(crate) struct Former {
    pub(crate) partition: TopicPartition,
    pub(crate) epoch: Epoch,
    gate: Arc<RangeGate>,
    tx: UnboundedSender<Sealed>,
    replay: VecDeque<ReplayItem>,
    next_seq: u64,
    open: Option<OpenRange>,
    sealed: VecDeque<SealedParts>,
    /// The open range could not take budget for its rows: pause (D8).
    over_budget: bool,
}

impl Former {
    pub(crate) fn new(partition: TopicPartition, epoch: Epoch, plan: LanePlan) -> Self {
        debug_assert!(
            plan.replay
                .iter()
                .all(|r| r.first <= r.last && r.group.is_none()),
            "D9: {partition} replays an empty recorded range"
        );
        debug_assert!(
            plan.replay
                .iter()
                .zip(plan.replay.iter().skip(1))
                .all(|(a, b)| a.last < b.first),
            "D9: {partition} replays recorded ranges out of offset order"
        );
        Self {
            partition,
            epoch,
            gate: plan.gate,
            tx: plan.tx,
            replay: plan.replay,
            next_seq: 0,
            open: None,
            sealed: VecDeque::new(),
            over_budget: false,
        }
    }

    /// Whether the lane must pause: its pending list is full (D2: paused and
    /// polled on, never blocked).
    pub(crate) fn is_full(&self) -> bool {
        self.gate.is_full() || self.over_budget
    }

    /// Before the payload at `offset`: seal the open range at its boundary,
    /// open the next one.
    #[inline]
    pub(crate) fn before(&mut self, offset: Offset, shards: usize, cfg: &EoConfig) {
        if let Some(o) = &self.open {
            let seal = if o.fixed {
                offset > o.last
            } else {
                // A free range ends before the next recorded one whatever its
                // size; by size only while the pending list has room.
                self.replay.front().is_some_and(|r| offset >= r.first)
                    || (o.is_full(cfg) && !self.gate.is_full())
            };
            if seal {
                self.seal(cfg);
            }
        }
        if self.open.is_none() {
            while self.replay.front().is_some_and(|r| r.last < offset) {
                // Nothing of it came back (its records are gone): nothing to
                // write; the watermark retires it.
                self.replay.pop_front();
            }
            let (first, last, fixed) = match self.replay.front() {
                Some(r) if r.first <= offset => {
                    let (f, l) = (r.first, r.last);
                    self.replay.pop_front();
                    (f, l, true)
                }
                _ => (offset, offset, false),
            };
            self.open = Some(OpenRange::new(first, last, fixed, shards));
        }
        let o = self.open.as_mut().expect("opened above");
        o.saw(offset);
        if !o.fixed {
            o.last = offset;
        }
        debug_assert!(
            o.first <= offset && offset <= o.last,
            "D9: payload {offset} of {} falls outside its open range {}..={}",
            self.partition,
            o.first,
            o.last
        );
        debug_assert!(
            o.fixed || self.replay.front().is_none_or(|r| o.last < r.first),
            "D9: free range {}..={} of {} reaches into the next recorded range",
            o.first,
            o.last,
            self.partition
        );
    }

    /// After the payload at `offset`: a replayed range whose last offset
    /// arrived is complete.
    #[inline]
    pub(crate) fn after(&mut self, offset: Offset, cfg: &EoConfig, budget: &Arc<Budget>) {
        let Some(o) = self.open.as_ref() else { return };
        debug_assert!(
            o.first <= offset && offset <= o.last,
            "D9: payload {offset} of {} was appended outside its open range {}..={}",
            self.partition,
            o.first,
            o.last
        );
        debug_assert!(
            o.fixed || offset == o.last,
            "D9: free range {}..={} of {} does not end at its last payload {offset}",
            o.first,
            o.last,
            self.partition
        );
        // D8: take budget as a free range grows, every `pay_every` bytes; a
        // refusal pauses the lane until the budget frees. A replayed range
        // pays only when complete, at hand-over: its bounds are fixed, so a
        // lane paused inside it could never seal it, and lanes each holding
        // part of the budget for unfinished replays would wait on each other
        // for ever (the simulator's liveness oracle, seeds 2071, 3634). Its
        // rows are bounded by the batch limits it was formed under.
        let paid = o.permit.as_ref().map_or(0, BudgetPermit::bytes);
        if !o.fixed && o.bytes - paid >= cfg.pay_every {
            self.pay(budget);
        }
        if self
            .open
            .as_ref()
            .is_some_and(|o| o.fixed && offset >= o.last)
        {
            self.seal(cfg);
        }
    }

    /// Takes budget for the open range's unpaid rows; `over_budget` says
    /// whether it was refused (the lane then pauses, D8).
    fn pay(&mut self, budget: &Arc<Budget>) {
        let Some(o) = self.open.as_mut() else {
            self.over_budget = false;
            return;
        };
        let (paid_bytes, paid_rows) = o.permit.as_ref().map_or((0, 0), |p| (p.bytes(), p.rows()));
        debug_assert!(
            paid_bytes <= o.bytes && paid_rows <= o.rows,
            "D8: open range {}..={} of {} holds more budget than its rows take",
            o.first,
            o.last,
            self.partition
        );
        match Budget::try_acquire(budget, o.bytes - paid_bytes, o.rows - paid_rows) {
            Some(p) => {
                match &mut o.permit {
                    Some(held) => held.merge(p),
                    None => o.permit = Some(p),
                }
                debug_assert!(
                    o.permit
                        .as_ref()
                        .is_some_and(|p| (p.bytes(), p.rows()) == (o.bytes, o.rows)),
                    "D8: a paid open range of {} is not covered by its permit",
                    self.partition
                );
                self.over_budget = false;
            }
            None => {
                self.over_budget = true;
                self.gate.wait_on(Waits::Budget);
            }
        }
    }

    /// Appends one row to `shard`'s part of the open range; `Ok(false)`
    /// when `encode` refused the row it appended (filtered, truncated).
    #[inline]
    pub(crate) fn append(
        &mut self,
        shard: usize,
        ack: &crate::ack::AckHandle,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<bool, RecordError>,
    ) -> Result<bool, RecordError> {
        let o = self
            .open
            .as_mut()
            .expect("a range is open for every payload");
        let part = &mut o.parts[shard];
        let start = part.buf.len();
        match encode(&mut part.buf) {
            Ok(true) => {}
            Ok(false) => {
                // Filtered: the range's bytes stay a function of its
                // offsets, since the filter is of the record (D9).
                part.buf.truncate(start);
                return Ok(false);
            }
            Err(e) => {
                part.buf.truncate(start);
                return Err(e);
            }
        }
        part.rows += 1;
        part.acks.push(ack);
        o.bytes += (part.buf.len() - start) as u64;
        o.rows += 1;
        debug_assert_eq!(
            o.rows,
            o.parts.iter().map(|p| p.rows).sum::<u64>(),
            "D9: the open range's row count drifted from its parts'"
        );
        debug_assert_eq!(
            o.bytes,
            o.parts.iter().map(|p| p.buf.len() as u64).sum::<u64>(),
            "D9: the open range's byte count drifted from its parts'"
        );
        Ok(true)
    }

    /// Seals the open range if it is free and may seal now (`idle`: the
    /// thread found nothing to poll; else only past the linger).
    pub(crate) fn seal_free(&mut self, now: Instant, idle: bool, cfg: &EoConfig) {
        let replaying = self.open.as_ref().is_some_and(|o| o.fixed);
        let due = self
            .open
            .as_ref()
            .is_some_and(|o| !o.fixed && (idle || now.duration_since(o.opened_at) >= cfg.linger));
        // Read once: the controller lowers the count from its own thread.
        let full = self.gate.is_full();
        if due && !full {
            self.seal(cfg);
        }
        debug_assert!(
            !replaying || self.open.is_some(),
            "D9: a replayed range of {} was sealed short of its recorded end",
            self.partition
        );
        debug_assert!(
            !due || full || self.open.is_none(),
            "D9: a due free range of {} stays open with room in its pending list",
            self.partition
        );
    }

    /// Seals the open free range whatever the pending list holds (a revoke:
    /// no more data comes; the list may pass its bound by this one range).
    pub(crate) fn seal_for_revoke(&mut self, cfg: &EoConfig) {
        if self.open.as_ref().is_some_and(|o| !o.fixed) {
            self.seal(cfg);
        }
    }

    fn seal(&mut self, cfg: &EoConfig) {
        let Some(mut o) = self.open.take() else {
            return;
        };
        self.over_budget = false;
        if o.rows == 0 {
            // Every payload was filtered or skipped: nothing to record or
            // write; a replay filters them again.
            return;
        }
        debug_assert!(
            o.first <= o.last,
            "D9: sealed range {}..={} of {} is empty",
            o.first,
            o.last,
            self.partition
        );
        let paid = o
            .permit
            .as_ref()
            .is_some_and(|p| p.bytes() > 0 || p.rows() > 0);
        let composition = o.composition();
        let parts: VecDeque<ReadyPart> = o
            .parts
            .into_iter()
            .enumerate()
            .filter(|(_, p)| p.rows > 0)
            .map(|(shard, p)| ReadyPart {
                shard,
                token: range_token(
                    &cfg.pipeline,
                    &cfg.table,
                    &self.partition,
                    o.first,
                    o.last,
                    shard,
                ) + &composition,
                // What the range paid for goes with its parts; the rest is
                // taken when each is handed over.
                permit: o
                    .permit
                    .as_mut()
                    .map(|held| held.split(p.buf.len() as u64, p.rows)),
                data: Bytes::from(p.buf),
                rows: p.rows,
                acks: p.acks,
            })
            .collect();
        debug_assert_eq!(
            parts.iter().map(|p| p.rows).sum::<u64>(),
            o.rows,
            "D9: sealing range {}..={} of {} lost rows",
            o.first,
            o.last,
            self.partition
        );
        let seq = (!o.fixed).then(|| self.announce(o.first, o.last));
        self.sealed.push_back(SealedParts { seq, parts, paid });
    }

    /// Numbers a sealed free range and sends it to the controller to record
    /// (D9); its parts wait until the gate passes the number returned.
    fn announce(&mut self, first: Offset, last: Offset) -> u64 {
        debug_assert!(
            first <= last,
            "D9: free range {first}..={last} of {} is empty",
            self.partition
        );
        let seq = self.next_seq;
        self.next_seq += 1;
        self.gate.sealed(ranges::item_weight(1));
        debug_assert!(
            !self.gate.is_recorded(seq)
                || crate::planted::active(crate::planted::Bug::InsertBeforeRecord),
            "D9: free range {seq} of {} counts as recorded before the controller saw it",
            self.partition
        );
        // D2: unbounded, never waits. An error means the controller is
        // gone: nothing is recorded, so nothing of it is written.
        let _ = self.tx.send(vec![SealedRange {
            partition: self.partition.clone(),
            epoch: self.epoch,
            seq,
            first,
            last,
            group: None,
        }]);
        seq
    }

    /// Rows held (open or sealed, not handed over), per shard, for the
    /// dropped-rows report.
    fn held(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let open = self
            .open
            .iter()
            .flat_map(|o| o.parts.iter().enumerate().map(|(s, p)| (s, p.rows)));
        let sealed = self
            .sealed
            .iter()
            .flat_map(|s| s.parts.iter().map(|p| (p.shard, p.rows)));
        open.chain(sealed).filter(|&(_, rows)| rows > 0)
    }

    /// Counts what is held as dropped (its acks fail as it drops, D1).
    pub(crate) fn note_dropped(&self, pool: &PoolHandle) {
        for (shard, rows) in self.held() {
            pool.note_dropped(shard, rows);
        }
    }

    /// Whether the open range is a replayed one holding rows but not yet
    /// its last offset (it cannot seal short: its token names its bounds).
    pub(crate) fn replaying(&self) -> bool {
        self.open.as_ref().is_some_and(|o| o.fixed && o.rows > 0)
    }

    /// Whether the epoch ended (the former can go once flushed).
    pub(crate) fn is_closed(&self) -> bool {
        self.gate.is_closed()
    }

    /// Hands the recorded ranges' parts to their shards, oldest first, each
    /// as its own batch with its range token. Never waits (D2).
    pub(crate) fn flush(&mut self, pool: &PoolHandle, budget: &Arc<Budget>) -> FormerFlush {
        if self.gate.is_closed() {
            self.drop_released(pool);
            return FormerFlush::Clear;
        }
        debug_assert!(
            !self.over_budget || self.open.is_some(),
            "D8: {} is paused over budget with no open range to pay for",
            self.partition
        );
        debug_assert!(
            self.sealed
                .iter()
                .filter_map(|s| s.seq)
                .zip(self.sealed.iter().filter_map(|s| s.seq).skip(1))
                .all(|(a, b)| a < b),
            "D9: the sealed ranges of {} are not in seal order",
            self.partition
        );
        if self.over_budget {
            // The paused lane brings no payload to retry with (D8).
            self.pay(budget);
        }
        while let Some(front) = self.sealed.front_mut() {
            // D9: a free range's parts reach the writer only after the commit
            // recording it returned Ok (the controller raised the gate).
            if front.seq.is_some_and(|s| !self.gate.is_recorded(s)) {
                return FormerFlush::Waiting;
            }
            if let Err(waits) = front.hand_over(pool, budget) {
                self.gate.wait_on(waits);
                return FormerFlush::Blocked;
            }
            self.sealed.pop_front();
        }
        if !self.over_budget {
            self.gate.wait_on(Waits::Nothing);
        }
        FormerFlush::Clear
    }

    /// The epoch was released: what is left was never written and never
    /// will be by this member; dropping it fails its acks, stale for the
    /// released epoch (D1).
    fn drop_released(&mut self, pool: &PoolHandle) {
        debug_assert!(
            self.gate.is_closed(),
            "D9: {} drops ranges of an epoch not released",
            self.partition
        );
        self.note_dropped(pool);
        self.sealed.clear();
        self.open = None;
        debug_assert!(
            self.held().next().is_none(),
            "D9: released {} still holds rows to write",
            self.partition
        );
    }
}

impl SealedParts {
    /// Hands the range's parts to their shards' queues in order, each with
    /// the budget it still owes (D8). Stops at the first part the budget or
    /// its queue cannot take yet, keeping it first, and says what it waits
    /// on; a closed pool drops a part (its acks fail and it replays).
    fn hand_over(&mut self, pool: &PoolHandle, budget: &Arc<Budget>) -> Result<(), Waits> {
        while let Some(mut p) = self.parts.pop_front() {
            debug_assert!(
                !p.token.is_empty(),
                "D9: a range part of shard {} has no range token",
                p.shard
            );
            let Some(permit) = part_permit(&mut p, self.paid, budget) else {
                self.parts.push_front(p);
                return Err(Waits::Budget);
            };
            debug_assert!(
                permit.bytes() <= p.data.len() as u64 && permit.rows() <= p.rows,
                "D8: a range part of shard {} takes more budget than its rows",
                p.shard
            );
            let chunk = Chunk::new(p.data, p.rows, p.acks, permit).with_token(p.token);
            match pool.try_send(p.shard, chunk) {
                Ok(()) => {}
                Err(PushError::Full(chunk)) => {
                    let (data, rows, acks, permit, token) = chunk.into_range_parts();
                    self.parts.push_front(ReadyPart {
                        shard: p.shard,
                        data,
                        rows,
                        acks,
                        token: token.expect("a range part has its token"),
                        permit: Some(permit),
                    });
                    return Err(Waits::ShardQueue);
                }
                Err(PushError::Closed(chunk)) => {
                    pool.note_dropped(p.shard, chunk.rows());
                    tracing::warn!(
                        shard = p.shard,
                        rows = chunk.rows(),
                        "sink pool closed; range part dropped, its acks fail and it will replay"
                    );
                }
            }
        }
        Ok(())
    }
}

/// The permit a range part goes to the pool with: what its range paid for
/// it as it grew, and, unless the range paid that way, the rest taken now.
/// `None` (the part keeps what it holds) when the budget refuses the rest.
fn part_permit(p: &mut ReadyPart, range_paid: bool, budget: &Arc<Budget>) -> Option<BudgetPermit> {
    let (paid_bytes, paid_rows) = p.permit.as_ref().map_or((0, 0), |h| (h.bytes(), h.rows()));
    debug_assert!(
        paid_bytes <= p.data.len() as u64 && paid_rows <= p.rows,
        "D8: a range part of shard {} holds more budget than its rows take",
        p.shard
    );
    let owed = (p.data.len() as u64 - paid_bytes, p.rows - paid_rows);
    if owed == (0, 0) || range_paid {
        return Some(p.permit.take().unwrap_or_else(BudgetPermit::unbounded));
    }
    let more = Budget::try_acquire(budget, owed.0, owed.1)?;
    let permit = match p.permit.take() {
        Some(mut held) => {
            held.merge(more);
            held
        }
        None => more,
    };
    debug_assert_eq!(
        (permit.bytes(), permit.rows()),
        (p.data.len() as u64, p.rows),
        "D8: a range part of shard {} is not covered by its permit",
        p.shard
    );
    Some(permit)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ack::{Outcome, Resolution};
    use crate::checkpoint::Tracker;

    /// A lane stalled with pending ranges is named once, after the stall
    /// bound, with what it waits on; once its committed offset moves, a
    /// later stall is named again.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_lane_is_reported_once_per_stall() {
        let tp = TopicPartition::new("t", 0);
        let mut recorder = Recorder::new(false);
        let committed = Committed {
            offset: 10,
            metadata: ranges::encode(&[(10, 19), (20, 29)]),
        };
        let plan = recorder.assign(&tp, 1, Some(&committed)).unwrap();
        let after = std::time::Duration::from_secs(30);
        assert_eq!(recorder.report_stalls(Instant::now(), after), 0, "not yet");
        tokio::time::advance(after).await;
        plan.gate.wait_on(Waits::Budget);
        assert_eq!(recorder.report_stalls(Instant::now(), after), 1);
        assert_eq!(recorder.report_stalls(Instant::now(), after), 0, "once");
        let mut commits = recorder.commits(&BTreeMap::from([((tp.clone(), 1), 20)]), false);
        assert_eq!(commits.len(), 1);
        recorder.accepted(&commits);
        tokio::time::advance(after).await;
        assert_eq!(
            recorder.report_stalls(Instant::now(), after),
            1,
            "a new stall"
        );
        commits.clear();
    }

    /// Two lanes of `recorder` (partitions 0 and 1 of `t`, epoch 1), and a
    /// group of their ranges 0..=9 and 0..=4 sealed into its channel, as a
    /// thread sends one (both members in one message).
    fn two_lanes_and_a_group(recorder: &mut Recorder) -> [(TopicPartition, LanePlan); 2] {
        let (a, b) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
        let pa = recorder.assign(&a, 1, None).unwrap();
        let pb = recorder.assign(&b, 1, None).unwrap();
        let group: Arc<[Member]> = vec![
            Member {
                partition: a.clone(),
                first: 0,
                last: 9,
            },
            Member {
                partition: b.clone(),
                first: 0,
                last: 4,
            },
        ]
        .into();
        let member = |p: &TopicPartition, last| SealedRange {
            partition: p.clone(),
            epoch: 1,
            seq: 0,
            first: 0,
            last,
            group: Some(Arc::clone(&group)),
        };
        let weight = ranges::item_weight(2);
        pa.gate.sealed(weight);
        pb.gate.sealed(weight);
        pa.tx.send(vec![member(&a, 9), member(&b, 4)]).unwrap();
        [(a, pa), (b, pb)]
    }

    /// ADR 0007: a group is recorded by every member in one request (a
    /// commit listing one member lists them all, even when only one
    /// member's watermark moved), each member's record names the whole
    /// group, and the gates open only once that request was accepted.
    #[tokio::test(start_paused = true)]
    async fn a_group_is_recorded_by_every_member_in_one_request() {
        let mut recorder = Recorder::new(true);
        let [(a, pa), (b, pb)] = two_lanes_and_a_group(&mut recorder);
        assert!(recorder.receive());
        let commits = recorder.commits(&BTreeMap::from([((a.clone(), 1), 0)]), false);
        let listed: Vec<&TopicPartition> = commits.iter().map(|c| &c.partition).collect();
        assert_eq!(listed, [&a, &b], "both members in the one request");
        for c in &commits {
            let items = ranges::decode_record(&c.metadata, &c.partition).unwrap();
            assert_eq!(items.len(), 1, "{}", c.metadata);
            assert_eq!(
                items[0].group.len(),
                2,
                "the record names the group: {}",
                c.metadata
            );
        }
        assert!(
            !pa.gate.is_recorded(0) && !pb.gate.is_recorded(0),
            "not before Ok"
        );
        recorder.accepted(&commits);
        assert!(pa.gate.is_recorded(0) && pb.gate.is_recorded(0));
        // The watermark passing a member's range retires it, with its weight.
        recorder.accepted(&recorder.commits(&BTreeMap::from([((b.clone(), 1), 5)]), false));
        assert_eq!(pb.gate.weight.load(Ordering::Acquire), 0);
        assert_eq!(
            pa.gate.weight.load(Ordering::Acquire),
            ranges::item_weight(2)
        );
    }

    /// ADR 0007: a member rejected (fenced, evicted) before the group was
    /// recorded leaves it recorded by no member: the others' next commit
    /// lists it no more, and their gates give back what it took.
    #[tokio::test(start_paused = true)]
    async fn a_rejected_member_leaves_its_unrecorded_group_recorded_by_none() {
        let mut recorder = Recorder::new(true);
        let [(a, pa), (b, _)] = two_lanes_and_a_group(&mut recorder);
        assert!(recorder.receive());
        recorder.rejected(&b, 1);
        let commits = recorder.commits(&BTreeMap::new(), true);
        assert!(commits.is_empty(), "nothing left to record: {commits:?}");
        assert_eq!(pa.gate.weight.load(Ordering::Acquire), 0);
        assert_eq!(pa.gate.pending.load(Ordering::Acquire), 0);
        let commits = recorder.commits(&BTreeMap::from([((a.clone(), 1), 0)]), false);
        assert_eq!(commits.len(), 1);
        assert_eq!(commits[0].metadata, "", "A's record names no group");
    }

    /// ADR 0007: a group whose member was released before the controller
    /// received it is recorded by none of its members.
    #[tokio::test(start_paused = true)]
    async fn a_group_of_a_released_member_is_recorded_by_none() {
        let mut recorder = Recorder::new(true);
        let [(_, pa), (b, _)] = two_lanes_and_a_group(&mut recorder);
        recorder.release(&b, 1);
        assert!(!recorder.receive(), "nothing to record");
        assert!(!recorder.has_dirty());
        assert_eq!(pa.gate.weight.load(Ordering::Acquire), 0);
        assert!(!pa.gate.is_recorded(0));
    }

    /// A lane's record has room for as many solos as before groups, and
    /// for fewer groups: an item takes [`ranges::item_weight`] of its
    /// members, so no record passes the broker's limit.
    #[test]
    fn a_gate_counts_what_its_record_holds_in_bytes() {
        let gate = RangeGate::default();
        for _ in 0..ranges::MAX_PENDING_RANGES - 1 {
            gate.sealed(ranges::item_weight(1));
        }
        assert!(!gate.is_full());
        gate.sealed(ranges::item_weight(1));
        assert!(gate.is_full(), "146 solos fill a record, as before");
        let gate = RangeGate::default();
        let groups = RECORD_CAPACITY / ranges::item_weight(16);
        for _ in 0..groups {
            gate.sealed(ranges::item_weight(16));
        }
        assert!(!gate.has_room(ranges::item_weight(16), RECORD_CAPACITY));
        gate.retired(groups, groups * ranges::item_weight(16));
        assert!(gate.has_room(ranges::item_weight(16), RECORD_CAPACITY));
    }

    /// Cuts `0..n` into consecutive pieces at the sorted, distinct `cuts`.
    /// The token's composition suffix is a function of the offsets the log
    /// holds inside the range: none when it holds all of them; the same
    /// gaps (transaction markers, read again) give the same suffix; a record
    /// deleted since the first read (compaction inside, retention at the
    /// head, anything at the tail) gives another (D9, ADR 0004).
    #[tokio::test(start_paused = true)]
    async fn a_range_token_names_the_gaps_of_its_range() {
        let suffix = |offsets: &[Offset]| {
            let mut o = OpenRange::new(10, 14, true, 1);
            for &at in offsets {
                o.saw(at);
            }
            o.composition()
        };
        assert_eq!(suffix(&[10, 11, 12, 13, 14]), "");
        let marker = suffix(&[10, 11, 13, 14]);
        assert_eq!(marker.len(), 17, "{marker}");
        assert!(marker.starts_with('~'), "{marker}");
        assert_eq!(marker, suffix(&[10, 11, 13, 14]), "same log, same token");
        for changed in [
            &[10, 13, 14][..],
            &[10, 12, 13, 14],
            &[11, 12, 13, 14],
            &[10, 11, 12, 13],
            &[10, 11, 13],
        ] {
            let other = suffix(changed);
            assert!(!other.is_empty(), "{changed:?}");
            assert_ne!(other, marker, "{changed:?}");
        }
        // A free range's bounds are what it read: no tail gap.
        let mut free = OpenRange::new(20, 20, false, 1);
        for at in [20, 21, 23] {
            free.saw(at);
            free.last = at;
        }
        let mut again = OpenRange::new(20, 23, true, 1);
        for at in [20, 21, 23] {
            again.saw(at);
        }
        assert_eq!(free.composition(), again.composition());
    }

    fn pieces(n: Offset, cuts: &[Offset]) -> Vec<(Offset, Offset)> {
        let mut out = Vec::new();
        let mut first = 0;
        for &c in cuts.iter().chain(std::iter::once(&n)) {
            if c > first && c <= n {
                out.push((first, c - 1));
                first = c;
            }
        }
        out
    }

    proptest! {
        /// D1 with D9: ranges and poll batches cut the same offsets at
        /// unrelated boundaries (a poll batch resolves only when every range
        /// holding its rows is acknowledged). After any set of acknowledged
        /// ranges, the commit the recorder makes never passes an
        /// unacknowledged range nor stops inside any range, and its metadata
        /// decodes to exactly the ranges the offset has not passed: every
        /// unacknowledged one, and
        /// the acknowledged ones beyond the watermark (a replay must re-form
        /// those too, with their old boundaries).
        #[test]
        fn any_acknowledged_prefix_commits_below_every_unacknowledged_range(
            n in 1i64..60,
            range_cuts in prop::collection::btree_set(1i64..60, 0..20),
            poll_cuts in prop::collection::btree_set(1i64..60, 0..20),
            acked in prop::collection::vec(any::<bool>(), 21),
        ) {
            let tp = TopicPartition::new("t", 0);
            let ranges_ = pieces(n, &range_cuts.into_iter().collect::<Vec<_>>());
            let polls = pieces(n, &poll_cuts.into_iter().collect::<Vec<_>>());
            let is_acked = |i: usize| acked[i];
            let mut recorder = Recorder::new(false);
            let plan = recorder.assign(&tp, 1, None).unwrap();
            for (seq, &(first, last)) in ranges_.iter().enumerate() {
                plan.gate.sealed(ranges::item_weight(1));
                plan.tx.send(vec![SealedRange { partition: tp.clone(), epoch: 1, seq: seq as u64, first, last, group: None }]).unwrap();
            }
            recorder.receive();
            let mut tracker = Tracker::new();
            tracker.assign(tp.clone(), 1);
            // The model: the end of the longest prefix of delivered polls
            // (nothing delivered: the first range's start, 0).
            let mut model: Offset = 0;
            let mut prefix = true;
            for (seq, &(pf, pl)) in polls.iter().enumerate() {
                let delivered = ranges_
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.0 <= pl && r.1 >= pf)
                    .all(|(i, _)| is_acked(i));
                prefix &= delivered;
                if prefix {
                    model = pl + 1;
                }
                if delivered {
                    tracker.apply(&Resolution {
                        partition: tp.clone(), epoch: 1, seq: seq as u64,
                        first: pf, last: pl, outcome: Outcome::Delivered,
                    });
                }
            }
            let watermarks: BTreeMap<(TopicPartition, Epoch), Offset> = tracker
                .pending_commits()
                .into_iter()
                .map(|c| ((c.partition, c.epoch), c.offset))
                .collect();
            let commits = recorder.commits(&watermarks, true);
            prop_assert_eq!(commits.len(), 1);
            let c = &commits[0];
            // Never inside a range: a replay reads from the committed
            // offset and must re-form the whole range (the same rows under
            // the same token), so a watermark inside one commits its start.
            let model = ranges_
                .iter()
                .find(|r| r.0 < model && model <= r.1)
                .map_or(model, |r| r.0);
            prop_assert_eq!(c.offset, model);
            for (i, r) in ranges_.iter().enumerate() {
                if !is_acked(i) {
                    prop_assert!(c.offset <= r.0, "offset {} passes unacknowledged {:?}", c.offset, r);
                }
            }
            let listed = ranges::decode(&c.metadata).unwrap();
            let expected: Vec<(Offset, Offset)> =
                ranges_.iter().copied().filter(|r| r.1 >= c.offset).collect();
            prop_assert_eq!(&listed, &expected);
            // Accepting it retires exactly the passed ranges.
            recorder.accepted(&commits);
            prop_assert_eq!(plan.gate.pending.load(Ordering::Acquire), expected.len());
            prop_assert!(plan.gate.is_recorded(ranges_.len() as u64 - 1));
        }
    }

    /// D9: metadata that is not ours fails the assignment, naming why.
    #[test]
    fn foreign_metadata_fails_the_assignment() {
        let mut recorder = Recorder::new(false);
        let committed = Committed {
            offset: 5,
            metadata: "connect-state".into(),
        };
        let tp = TopicPartition::new("t", 0);
        let e = recorder.assign(&tp, 1, Some(&committed)).unwrap_err();
        assert!(matches!(e, RangesError::Foreign { .. }), "{e}");
        // A group record (ADR 0007) is never replayed as this partition's
        // range alone; nor is a record past the broker's limit read.
        for (metadata, tp_epoch) in [
            ("spate2:t;0.9@0.1.0.9;".to_owned(), 3),
            (format!("spate1:{}", "0.0,".repeat(2_000)), 4),
        ] {
            let c = Committed {
                offset: 0,
                metadata,
            };
            let e = recorder.assign(&tp, tp_epoch, Some(&c)).unwrap_err();
            assert!(
                matches!(
                    e,
                    RangesError::GroupNotReformed { .. } | RangesError::TooLarge { .. }
                ),
                "{e}"
            );
        }
        let ours = Committed {
            offset: 100,
            metadata: ranges::encode(&[(10, 20), (90, 120), (121, 130)]),
        };
        let plan = recorder.assign(&tp, 2, Some(&ours)).unwrap();
        assert_eq!(
            plan.replay
                .iter()
                .map(|r| (r.first, r.last))
                .collect::<Vec<_>>(),
            [(90, 120), (121, 130)],
            "passed ranges are done"
        );
    }
}
