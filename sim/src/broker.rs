//! SimBroker: the source seam over the simulated world.
//!
//! One topic, `partitions` append-only logs, one consumer-group member (this
//! process). The group assigns every partition at start (new epochs), revokes
//! and re-assigns on a rebalance fault, refuses commits while the member is
//! evicted and revokes everything when it rejoins. Commits land in a store
//! that survives crashes; each accepted commit is recorded with the durable
//! prefix of its partition at that instant, for the D1 oracle.
//!
//! Issue 16's faults: offsets with no record for the consumer (control and
//! aborted records under `read_committed`, compacted records) are skipped
//! and end a poll batch (a batch holds consecutive offsets); a fetch
//! position outside the log (after truncation or retention) resets to the
//! log start, as librdkafka does with `auto.offset.reset: earliest`; a log
//! truncation revokes and re-assigns its partition (a new epoch: the
//! source seam promises increasing offsets within an epoch, see
//! [`crate::world::World::truncate`]); a slow coordinator queues commits and
//! applies them in order seconds later while the call times out.

use std::sync::Arc;
use std::time::Duration;

use spate_core::record::{Epoch, Offset, TopicPartition};
use spate_core::source::{
    AssignmentEvent, CommitOffset, Committed, RANGE_LANE_EPOCH, Source, SourceError,
};
use spate_testkit::lane::{self, LaneFeed, LaneState, MemLane};

use crate::config::FaultKind;
use crate::world::{GAP, GroupEvent, Shared, World};

/// The topic every simulated partition belongs to.
pub const TOPIC: &str = "sim";

/// The simulated consumer: implements [`Source`].
#[derive(Debug)]
pub struct SimSource {
    world: Shared,
    topic: Arc<str>,
}

impl SimSource {
    /// The member's view of `world`.
    pub fn new(world: Shared) -> Self {
        Self {
            world,
            topic: TOPIC.into(),
        }
    }
}

fn index(partition: &TopicPartition) -> usize {
    partition.partition() as usize
}

/// The metadata string a commit carries (empty: none).
fn metadata(c: &CommitOffset) -> &str {
    c.metadata.as_deref().unwrap_or("")
}

impl Source for SimSource {
    type Lane = SimLane;

    fn reads_ranges(&self) -> bool {
        true
    }

    fn read_range(
        &mut self,
        partition: &TopicPartition,
        first: Offset,
        last: Offset,
    ) -> Result<SimLane, SourceError> {
        if first > last || first < 0 {
            return Err(SourceError::Fatal {
                context: format!("read range {partition} {first}..={last}"),
                message: "empty range".into(),
            });
        }
        let mut w = self.world.lock();
        w.trace(format!("read range p{} {first}..={last}", index(partition)));
        let feed = WorldFeed {
            world: self.world.clone(),
            range_last: Some(last),
        };
        Ok(MemLane::new(
            partition.clone(),
            RANGE_LANE_EPOCH,
            first,
            feed,
        ))
    }

    fn poll_event(
        &mut self,
        _timeout: Duration,
    ) -> Result<Option<AssignmentEvent<SimLane>>, SourceError> {
        let mut w = self.world.lock();
        let Some(ev) = w.group_events.pop_front() else {
            return Ok(None);
        };
        Ok(Some(match ev {
            GroupEvent::Assign(p, epoch) => {
                let position = w.committed[p].unwrap_or(0);
                // The group's OffsetFetch answer: offset and metadata.
                let committed = w.committed[p].map(|offset| Committed {
                    offset,
                    metadata: w.committed_meta[p].clone(),
                });
                w.trace(format!("deliver assign p{p} e{epoch} from {position}"));
                let partition = TopicPartition::new(Arc::clone(&self.topic), p as i32);
                let feed = WorldFeed {
                    world: self.world.clone(),
                    range_last: None,
                };
                lane::assigned(partition, epoch, position, committed, feed)
            }
            GroupEvent::Revoke(p, epoch) => {
                w.trace(format!("deliver revoke p{p} e{epoch}"));
                AssignmentEvent::Revoked {
                    partition: TopicPartition::new(Arc::clone(&self.topic), p as i32),
                    epoch,
                }
            }
        }))
    }

    fn release(&mut self, partition: &TopicPartition, epoch: Epoch) -> Result<(), SourceError> {
        let mut w = self.world.lock();
        let p = index(partition);
        w.revoking.remove(&(p, epoch));
        w.trace(format!("release p{p} e{epoch}"));
        if w.reassign_on_release.remove(&p) {
            w.assign(p);
        }
        Ok(())
    }

    fn commit(&mut self, offsets: &[CommitOffset]) -> Result<(), SourceError> {
        let mut w = self.world.lock();
        refuse_unowned(&mut w, offsets)?;
        let failing = w.fault_active(FaultKind::CommitFailures, |_, _| true);
        let ambiguous = failing && w.rng_bool(0.5);
        if failing && !ambiguous {
            w.trace("commit failed (not applied)");
            return Err(SourceError::Transient {
                context: "commit".into(),
                message: "simulated commit failure".into(),
            });
        }
        let slow = w.fault_active(FaultKind::SlowCoordinator, |_, _| true);
        if slow || !w.commit_queue.is_empty() {
            return Err(queue_at_coordinator(&mut w, offsets, slow));
        }
        for c in offsets {
            w.apply_commit(index(&c.partition), c.offset, c.epoch, metadata(c), "");
        }
        if ambiguous {
            w.ambiguous_commits += 1;
            w.trace("commit applied, response lost");
            return Err(SourceError::Transient {
                context: "commit".into(),
                message: "simulated lost commit response".into(),
            });
        }
        Ok(())
    }
}

/// Refuses a commit from an evicted member, or one naming an epoch the
/// member no longer owns (neither current nor revoking: a stale commit).
fn refuse_unowned(w: &mut World, offsets: &[CommitOffset]) -> Result<(), SourceError> {
    if w.evicted {
        let c = &offsets[0];
        w.trace(format!("commit refused (evicted) {}", c.partition));
        return Err(SourceError::CommitRejected {
            partition: c.partition.clone(),
            epoch: c.epoch,
            message: "member evicted from the group".into(),
        });
    }
    for c in offsets {
        let p = index(&c.partition);
        let current = w.epochs[p] == c.epoch;
        if !current && !w.revoking.contains(&(p, c.epoch)) {
            w.trace(format!("commit refused (stale epoch) p{p} e{}", c.epoch));
            w.stale_commits.push((p, c.epoch));
            return Err(SourceError::CommitRejected {
                partition: c.partition.clone(),
                epoch: c.epoch,
                message: "epoch no longer owned by this member".into(),
            });
        }
    }
    Ok(())
}

/// A slow coordinator (or one still working through its backlog) takes the
/// request and applies it later, in order behind what it already holds;
/// the client times out (the error returned). Once healed it works through
/// its backlog at once: a request waits only for those ahead of it (a
/// coordinator that stayed slow for every commit behind a backlog would
/// never catch up with a client that commits as often as effectively_once
/// does).
fn queue_at_coordinator(w: &mut World, offsets: &[CommitOffset], slow: bool) -> SourceError {
    let now = w.now();
    let after = w.commit_queue.back().map_or(now, |c| c.due);
    let slow_by = if slow {
        Duration::from_millis(w.rng_range(1_000..=5_000))
    } else {
        Duration::ZERO
    };
    let due = (now + slow_by).max(after);
    for c in offsets {
        let (partition, offset, epoch) = (index(&c.partition), c.offset, c.epoch);
        w.commit_queue.push_back(crate::world::QueuedCommit {
            due,
            partition,
            offset,
            epoch,
            metadata: metadata(c).to_owned(),
        });
    }
    w.trace(format!(
        "commit queued at a slow coordinator until {} ms",
        due.as_millis()
    ));
    SourceError::Transient {
        context: "commit".into(),
        message: "simulated commit timeout (slow coordinator)".into(),
    }
}

/// A lane of the simulated consumer: the test kit's in-memory lane
/// (`spate_testkit::lane`, the state machine the scripted source's lanes
/// use too) fed from the world's log, with the simulator's fault hooks in
/// [`WorldFeed`].
pub type SimLane = MemLane<WorldFeed>;

/// Feeds a [`SimLane`] from the simulated world: a poll fails while a fetch
/// error fault covers the partition, returns nothing while paused, while the
/// partition is unavailable, while the lane's epoch is fenced or no longer
/// current; otherwise it resets an out-of-range position to the log start
/// (`auto.offset.reset: earliest`), skips gaps before the batch and ends it
/// at the next gap (see the module docs).
#[derive(Debug)]
pub struct WorldFeed {
    world: Shared,
    /// A range lane's last offset ([`Source::read_range`]); `None`: an
    /// assigned lane.
    range_last: Option<Offset>,
}

impl LaneFeed for WorldFeed {
    fn feed(&mut self, lane: &mut LaneState) -> Result<(), SourceError> {
        let p = index(&lane.partition);
        let mut w = self.world.lock();
        let n = w.cfg.partitions;
        if w.fault_active(FaultKind::FetchErrors, |t, _| t % n == p) {
            return Err(SourceError::Transient {
                context: format!("fetch {}", lane.partition),
                message: "simulated fetch error".into(),
            });
        }
        let unavailable = w.fault_active(FaultKind::PartitionUnavailable, |t, _| t % n == p);
        if lane.paused || unavailable {
            return Ok(());
        }
        if let Some(last) = self.range_last {
            // A range lane reads outside the assignment: no epoch to own.
            read_range_batch(&w, lane, p, last);
            return Ok(());
        }
        let fenced = !w.fenced.is_empty() && w.fenced.contains(&(p, lane.epoch));
        if !fenced && w.epochs[p] == lane.epoch {
            let end = w.ids[p].len() as Offset;
            if lane.position > end || lane.position < w.log_start[p] {
                // OFFSET_OUT_OF_RANGE: librdkafka resets per
                // auto.offset.reset, which spate sets to earliest.
                let to = w.log_start[p];
                w.trace(format!(
                    "p{p} e{} fetch at {} out of range [{to}, {end}]: reset to earliest {to}",
                    lane.epoch, lane.position
                ));
                if to < lane.position {
                    w.resets_back.push((p, to, lane.position));
                }
                lane.position = to;
            }
            let (start, len) = batch_at(&w, p, lane.position, w.ids[p].len());
            lane.take(start as Offset, &w.logs[p][start..start + len]);
            let fetched = &mut w.fetched_end[p];
            *fetched = (*fetched).max(lane.position);
        }
        Ok(())
    }
}

/// The batch a fetch at `position` of partition `p` returns, as (start,
/// len), stopping before index `stop`: gaps (control, aborted, compacted
/// records) before it are skipped, and since a batch holds consecutive
/// offsets it ends at the next gap.
fn batch_at(w: &World, p: usize, position: Offset, stop: usize) -> (usize, usize) {
    let ids = &w.ids[p];
    let mut start = position as usize;
    let gap = ids.get(start) == Some(&GAP);
    while ids.get(start) == Some(&GAP) {
        start += 1;
    }
    if gap && start < ids.len() && crate::planted::planted(crate::planted::SimBug::GapSkipsRecord) {
        start += 1;
    }
    let stop = stop.min(ids.len()).min(start + w.cfg.max_poll).max(start);
    let len = ids[start..stop].iter().take_while(|&&id| id != GAP).count();
    (start, len)
}

/// One poll of a range lane over `..=last` of partition `p`: what the log
/// still holds of it from the lane's position (an offset below the log
/// start is gone and skipped; nothing past `last`, nor past the log end).
fn read_range_batch(w: &World, lane: &mut LaneState, p: usize, last: Offset) {
    let end = w.ids[p].len() as Offset;
    lane.position = lane.position.max(w.log_start[p]);
    if lane.position > last || lane.position >= end {
        return;
    }
    let (start, len) = batch_at(w, p, lane.position, (last + 1) as usize);
    lane.take(start as Offset, &w.logs[p][start..start + len]);
}
