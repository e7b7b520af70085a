//! SimBroker: the source seam over the simulated world.
//!
//! One topic, `partitions` append-only logs, one consumer-group member (this
//! process). The group assigns every partition at start (new epochs), revokes
//! and re-assigns on a rebalance fault, refuses commits while the member is
//! evicted and revokes everything when it rejoins. Commits land in a store
//! that survives crashes; each accepted commit is recorded with the durable
//! prefix of its partition at that instant, for the D1 oracle.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use spate_core::record::{Epoch, Offset, TopicPartition};
use spate_core::source::{AssignmentEvent, BufferedBatch, CommitOffset, Lane, Source, SourceError};

use crate::config::FaultKind;
use crate::world::{CommitFact, GroupEvent, Shared};

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

impl Source for SimSource {
    type Lane = SimLane;

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
                w.trace(format!("deliver assign p{p} e{epoch} from {position}"));
                let partition = TopicPartition::new(Arc::clone(&self.topic), p as i32);
                AssignmentEvent::Assigned {
                    partition: partition.clone(),
                    epoch,
                    lane: SimLane {
                        partition,
                        epoch,
                        position,
                        paused: false,
                        buf: Vec::new(),
                        first: 0,
                        world: self.world.clone(),
                    },
                }
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
        let failing = w.fault_active(FaultKind::CommitFailures, |_, _| true);
        let ambiguous = failing && w.rng_bool(0.5);
        if failing && !ambiguous {
            w.trace("commit failed (not applied)");
            return Err(SourceError::Transient {
                context: "commit".into(),
                message: "simulated commit failure".into(),
            });
        }
        let at_ms = w.now().as_millis() as u64;
        for c in offsets {
            let p = index(&c.partition);
            let durable_prefix = w.durable_prefix[p];
            w.commits.push(CommitFact {
                at_ms,
                partition: p,
                offset: c.offset,
                durable_prefix,
            });
            w.committed[p] = Some(c.offset);
            w.trace(format!(
                "commit p{p}={} e{} (durable {durable_prefix})",
                c.offset, c.epoch
            ));
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

/// A lane of the simulated consumer.
#[derive(Debug)]
pub struct SimLane {
    partition: TopicPartition,
    epoch: Epoch,
    position: Offset,
    paused: bool,
    buf: Vec<Bytes>,
    first: Offset,
    world: Shared,
}

impl Lane for SimLane {
    type Batch<'a> = BufferedBatch<'a>;

    fn partition(&self) -> &TopicPartition {
        &self.partition
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn poll(&mut self, _timeout: Duration) -> Result<BufferedBatch<'_>, SourceError> {
        self.buf.clear();
        self.first = self.position;
        let p = index(&self.partition);
        let mut w = self.world.lock();
        let n = w.cfg.partitions;
        if w.fault_active(FaultKind::FetchErrors, |t, _| t % n == p) {
            return Err(SourceError::Transient {
                context: format!("fetch {}", self.partition),
                message: "simulated fetch error".into(),
            });
        }
        let unavailable = w.fault_active(FaultKind::PartitionUnavailable, |t, _| t % n == p);
        if !self.paused && !unavailable && w.epochs[p] == self.epoch {
            let log = &w.logs[p];
            let start = (self.position as usize).min(log.len());
            let end = log.len().min(start + w.cfg.max_poll);
            self.buf.extend_from_slice(&log[start..end]);
        }
        drop(w);
        self.position += self.buf.len() as Offset;
        Ok(BufferedBatch {
            values: &self.buf,
            partition: &self.partition,
            first: self.first,
        })
    }

    fn pause(&mut self) -> Result<(), SourceError> {
        self.paused = true;
        Ok(())
    }

    fn resume(&mut self) -> Result<(), SourceError> {
        self.paused = false;
        Ok(())
    }
}
