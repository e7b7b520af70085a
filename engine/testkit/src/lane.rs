//! The in-memory lane: one state machine for every lane over a log held in
//! memory, shared by the test kit's [`crate::ScriptedLane`] and the
//! simulator's `SimLane` (`sim/src/broker.rs`), which differ only in where
//! the records come from and, for the simulator, in the faults it injects
//! on the way ([`LaneFeed`]).
//!
//! The state: the partition and epoch the lane was assigned under, the
//! next offset to read (`position`), whether the pipeline paused it (a
//! paused lane is still polled and returns nothing, D2), and the buffer the
//! last poll filled, lent out as a [`BufferedBatch`] until the next poll.
//! A batch holds consecutive offsets starting at its first (the source seam's
//! promise); [`LaneState::take`] keeps it by construction.

use std::time::Duration;

use bytes::Bytes;
use spate_core::record::{Epoch, Offset, TopicPartition};
use spate_core::source::{AssignmentEvent, BufferedBatch, Committed, Lane, SourceError};

/// A lane's read state (see the module docs).
#[derive(Debug)]
pub struct LaneState {
    /// The partition read.
    pub partition: TopicPartition,
    /// The assignment epoch the lane reads under.
    pub epoch: Epoch,
    /// The next offset to read.
    pub position: Offset,
    /// Whether the pipeline paused the lane (it then reads nothing).
    pub paused: bool,
    buf: Vec<Bytes>,
    first: Offset,
}

impl LaneState {
    /// A running lane of `partition` under `epoch`, reading from `position`.
    pub fn new(partition: TopicPartition, epoch: Epoch, position: Offset) -> Self {
        Self {
            partition,
            epoch,
            position,
            paused: false,
            buf: Vec::new(),
            first: 0,
        }
    }

    /// Starts a poll: an empty batch at the current position.
    fn begin(&mut self) {
        self.buf.clear();
        self.first = self.position;
    }

    /// Makes `values` this poll's batch, the records at offsets `first..`;
    /// the position moves past them. Call at most once per poll.
    pub fn take(&mut self, first: Offset, values: &[Bytes]) {
        debug_assert!(self.buf.is_empty(), "one take per poll");
        debug_assert!(first >= 0, "offset {first} below zero");
        self.buf.extend_from_slice(values);
        self.first = first;
        self.position = first + values.len() as Offset;
    }

    /// The number of records this poll took so far (0 or the batch's).
    pub fn taken(&self) -> usize {
        self.buf.len()
    }

    fn batch(&self) -> BufferedBatch<'_> {
        BufferedBatch {
            values: &self.buf,
            partition: &self.partition,
            first: self.first,
        }
    }
}

/// Where an in-memory lane's records come from: called once per poll with
/// the lane's state (the batch still empty), it [`LaneState::take`]s what the
/// poll returns, or nothing (paused, no data, or a fault), or fails the poll.
pub trait LaneFeed {
    /// Fills this poll's batch.
    ///
    /// # Errors
    /// Whatever the lane's poll should fail with (a simulated fetch error).
    fn feed(&mut self, lane: &mut LaneState) -> Result<(), SourceError>;
}

/// A [`Lane`] over a [`LaneFeed`].
#[derive(Debug)]
pub struct MemLane<F> {
    state: LaneState,
    feed: F,
}

impl<F: LaneFeed> MemLane<F> {
    /// A running lane of `partition` under `epoch` from `position`, fed by
    /// `feed`.
    pub fn new(partition: TopicPartition, epoch: Epoch, position: Offset, feed: F) -> Self {
        Self {
            state: LaneState::new(partition, epoch, position),
            feed,
        }
    }
}

/// The assignment of `partition` under `epoch` to a new lane reading from
/// `position` (the group had `committed`), fed by `feed`: what an in-memory source's
/// [`spate_core::source::Source::poll_event`] returns for an assignment.
pub fn assigned<F: LaneFeed>(
    partition: TopicPartition,
    epoch: Epoch,
    position: Offset,
    committed: Option<Committed>,
    feed: F,
) -> AssignmentEvent<MemLane<F>>
where
    MemLane<F>: Lane,
{
    AssignmentEvent::Assigned {
        partition: partition.clone(),
        epoch,
        committed,
        lane: MemLane::new(partition, epoch, position, feed),
    }
}

impl<F: LaneFeed + Send + 'static> Lane for MemLane<F> {
    type Batch<'a>
        = BufferedBatch<'a>
    where
        Self: 'a;

    fn partition(&self) -> &TopicPartition {
        &self.state.partition
    }

    fn epoch(&self) -> Epoch {
        self.state.epoch
    }

    fn poll(&mut self, _timeout: Duration) -> Result<BufferedBatch<'_>, SourceError> {
        self.state.begin();
        self.feed.feed(&mut self.state)?;
        Ok(self.state.batch())
    }

    fn pause(&mut self) -> Result<(), SourceError> {
        self.state.paused = true;
        Ok(())
    }

    fn resume(&mut self) -> Result<(), SourceError> {
        self.state.paused = false;
        Ok(())
    }
}
