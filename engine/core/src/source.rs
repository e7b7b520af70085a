//! The source seam: lanes that poll batches zero-copy, and a source that hands
//! out lanes, reports assignment changes and accepts commits.
//!
//! The Kafka source (`spate-kafka`) and the simulator's broker (`spate-sim`)
//! implement these traits; the pipeline runtime drives them. A lane belongs to
//! one pipeline thread at a time. Nothing here blocks beyond the poll timeout
//! the caller passes (D2).

use std::time::Duration;

use bytes::Bytes;

use crate::record::{Epoch, Offset, Payload, TopicPartition};

/// The messages returned by one poll of a lane, borrowed from the lane.
///
/// Payloads are ordered by offset, strictly increasing (gaps are allowed:
/// compaction and transaction markers leave holes in Kafka's offsets).
pub trait PollBatch<'a> {
    /// Number of payloads in the batch (0 when the poll timed out empty).
    fn len(&self) -> usize;

    /// Whether the poll returned nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload at `index` (`0..len()`); panics when out of range.
    fn payload(&self, index: usize) -> Payload<'a>;
}

/// A poll batch over payloads a lane holds in its own buffer, at consecutive
/// offsets from `first`: for sources that copy (the test kit, the simulator).
#[derive(Clone, Copy, Debug)]
pub struct BufferedBatch<'a> {
    /// The values, in offset order.
    pub values: &'a [Bytes],
    /// Their partition.
    pub partition: &'a TopicPartition,
    /// The offset of `values[0]`.
    pub first: Offset,
}

impl<'a> PollBatch<'a> for BufferedBatch<'a> {
    fn len(&self) -> usize {
        self.values.len()
    }

    fn payload(&self, index: usize) -> Payload<'a> {
        Payload {
            value: Some(&self.values[index]),
            key: None,
            partition: self.partition,
            offset: self.first + index as Offset,
            timestamp_ms: None,
            timestamp_kind: crate::record::TimestampKind::None,
            headers: crate::record::Headers::NONE,
        }
    }
}

/// A partition's queue of messages, polled by one pipeline thread.
///
/// `poll` returns a batch that borrows the lane (a generic associated type), so
/// the borrow checker guarantees no payload outlives the next poll.
pub trait Lane: Send {
    /// The batch type a poll returns, borrowing the lane for `'a`.
    type Batch<'a>: PollBatch<'a>
    where
        Self: 'a;

    /// The partition this lane reads.
    fn partition(&self) -> &TopicPartition;

    /// The assignment epoch this lane was created under.
    fn epoch(&self) -> Epoch;

    /// Waits at most `timeout` for messages and returns what arrived (possibly
    /// nothing).
    ///
    /// # Errors
    /// [`SourceError::Transient`] for a condition the client retries by itself
    /// (broker down, leader change); [`SourceError::Fatal`] when the partition
    /// cannot be read any more (authorisation, deleted topic).
    fn poll(&mut self, timeout: Duration) -> Result<Self::Batch<'_>, SourceError>;

    /// Stops fetching for this lane's partition (backpressure, D2); polls keep
    /// returning whatever was already fetched, then nothing.
    ///
    /// # Errors
    /// [`SourceError`] when the client refuses the pause.
    fn pause(&mut self) -> Result<(), SourceError>;

    /// Resumes fetching after [`Lane::pause`].
    ///
    /// # Errors
    /// [`SourceError`] when the client refuses the resume.
    fn resume(&mut self) -> Result<(), SourceError>;

    /// The client's position past offsets it read and never returned, when
    /// that is beyond the last returned offset + 1: `Some(next)` says every
    /// offset below `next` was either returned by an earlier poll of this
    /// lane or holds no record the client will ever return (a transaction
    /// control record, an aborted transaction's record under
    /// `read_committed`, an offset removed by compaction). Asked by the
    /// pipeline after a poll returned nothing; it acks the offsets from the
    /// last returned one + 1 to `next - 1` as a batch of no records
    /// ([`crate::ack::AckIssuer::skip_to`]), so the tracker commits `next`
    /// only behind every batch polled before it (D1).
    ///
    /// `None` (the default, and the simulator's answer) when the source
    /// cannot tell, when the lane still holds messages not returned, or when
    /// the position says nothing beyond the last returned offset + 1. Offsets
    /// the lane returns after `Some(next)` are at or past `next`.
    fn position(&mut self) -> Option<Offset> {
        None
    }
}

/// A change of this process's assignment, as reported by [`Source::poll_event`].
#[derive(Debug)]
pub enum AssignmentEvent<L> {
    /// A partition was assigned under a new `epoch`; `lane` reads it from the
    /// committed offset (or the reset policy's offset).
    Assigned {
        /// The assigned partition.
        partition: TopicPartition,
        /// The epoch of this assignment, larger than any earlier one of this
        /// partition in this process.
        epoch: Epoch,
        /// The lane that reads it.
        lane: L,
        /// The group's committed offset and commit metadata for the
        /// partition when it was assigned (`None`: nothing committed).
        /// `delivery: effectively_once` re-forms the ranges the metadata
        /// lists before new ones (D9); `at_least_once` ignores it.
        committed: Option<Committed>,
    },
    /// A partition is being revoked. The caller stops its lane, lets its data
    /// settle (bounded by `rebalance.drain_timeout`), commits what is
    /// committable, then calls [`Source::release`] so the rebalance completes.
    Revoked {
        /// The revoked partition.
        partition: TopicPartition,
        /// The epoch being revoked.
        epoch: Epoch,
    },
}

/// What the consumer group had committed for a partition: the offset and
/// the offset-commit metadata string stored with it (Kafka's
/// `OffsetCommit`/`OffsetFetch` `committed_metadata`,
/// <https://kafka.apache.org/protocol#The_Messages_OffsetFetch>).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The committed offset (the next offset to read).
    pub offset: Offset,
    /// The metadata committed with it; empty when none was given. spate's
    /// own is [`crate::checkpoint::ranges`]' encoding.
    pub metadata: String,
}

/// A committed offset outside its partition's valid range `[low, high]`
/// when the partition was assigned: below `low`, the data from `committed`
/// up to `low` was deleted (retention) before it was read; above `high`, the
/// log is shorter than what was committed (topic re-created). The client
/// then resets the partition per its reset policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetReset {
    /// The partition.
    pub partition: TopicPartition,
    /// The group's committed offset.
    pub committed: Offset,
    /// The partition's low watermark (first offset still in the log).
    pub low: Offset,
    /// The partition's high watermark (next offset to be written).
    pub high: Offset,
    /// Where reading resumes, when the policy says (`None`: the policy
    /// makes it an error instead, or is unknown).
    pub reset_to: Option<Offset>,
    /// The reset policy as configured (for Kafka, `auto.offset.reset`).
    pub policy: String,
}

impl std::fmt::Display for OffsetReset {
    /// `t/0 committed 500 outside [0, 20] (beyond the log end): reset to 0
    /// (auto.offset.reset=earliest)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = if self.committed < self.low {
            "below the low watermark: data deleted before it was read"
        } else {
            "beyond the log end"
        };
        write!(
            f,
            "{} committed {} outside [{}, {}] ({side}): ",
            self.partition, self.committed, self.low, self.high
        )?;
        match self.reset_to {
            Some(o) => write!(f, "reset to {o} ({})", self.policy),
            None => write!(f, "not reset ({})", self.policy),
        }
    }
}

/// One offset to commit: the next offset to read, i.e. last delivered + 1.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CommitOffset {
    /// The partition.
    pub partition: TopicPartition,
    /// The epoch whose delivered data this commit covers.
    pub epoch: Epoch,
    /// The offset to commit (Kafka convention: the next offset to consume).
    pub offset: Offset,
    /// The offset-commit metadata to store with it (`None`: empty). In
    /// `delivery: effectively_once` every commit carries the partition's
    /// pending ranges ([`crate::checkpoint::ranges::encode`]), so a commit
    /// never erases the record of a range being written (D9).
    pub metadata: Option<String>,
}

/// The source of lanes: one Kafka consumer per process, or the simulator.
pub trait Source: Send {
    /// The lane type this source hands out.
    type Lane: Lane;

    /// Waits at most `timeout` for the next assignment change; `Ok(None)` when
    /// there was none. Also serves the client's housekeeping (group heartbeats),
    /// so the controller calls it regularly even when nothing changes.
    ///
    /// # Errors
    /// [`SourceError::Fatal`] when the consumer cannot continue (fenced,
    /// authentication failure, unknown topic).
    fn poll_event(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<AssignmentEvent<Self::Lane>>, SourceError>;

    /// Tells the source that the revoked `partition` at `epoch` has drained and
    /// committed, so the rebalance may complete.
    ///
    /// # Errors
    /// [`SourceError`] when the client rejects the call.
    fn release(&mut self, partition: &TopicPartition, epoch: Epoch) -> Result<(), SourceError>;

    /// Whether the consumer holds an assignment, or is waiting for one,
    /// without an error standing: readiness (`/readyz`) requires this as well
    /// as a reachable replica per shard. Read by the controller once per loop,
    /// never on the record path. A source that cannot tell answers `true`.
    fn consumer_ready(&self) -> bool {
        true
    }

    /// Why [`Source::consumer_ready`] is false, for `/readyz`'s body (e.g.
    /// the standing error and how long ago it came). Called at most every
    /// [`crate::pipeline::REASON_REFRESH`] while not ready.
    fn consumer_not_ready_reason(&self) -> String {
        "the consumer reports an error".to_owned()
    }

    /// What the consumer is doing, for the body of `/readyz` and
    /// `/healthz?verbose` whether ready or not (e.g. `joining the group
    /// since 2.0 s ago`, `assigned 8 partition(s); no progress for 40 s
    /// while lag is 1200`); empty (the default) when the source has
    /// nothing to say. Called at most every
    /// [`crate::pipeline::STATUS_REFRESH`].
    fn consumer_status(&self) -> String {
        String::new()
    }

    /// Commits `offsets` synchronously.
    ///
    /// # Errors
    /// [`SourceError::CommitRejected`] when the group refuses the commit (this
    /// member was evicted, or the epoch is no longer ours);
    /// [`SourceError::Transient`] when it may succeed on the next try.
    fn commit(&mut self, offsets: &[CommitOffset]) -> Result<(), SourceError>;

    /// Committed offsets found outside their partition's valid range since
    /// the last call (the source's client then resets them, skipping or
    /// re-reading data). The controller collects them into the run report,
    /// whose status they turn into [`crate::pipeline::ExitStatus::OffsetReset`]
    /// when nothing worse happened. A source that cannot tell returns none.
    fn take_offset_resets(&mut self) -> Vec<OffsetReset> {
        Vec::new()
    }

    /// Whether [`Source::read_range`] can read a recorded range of a
    /// partition outside this member's assignment (docs/adr/0007-range-groups.md).
    /// `delivery: effectively_once` forms range groups (several partitions'
    /// ranges in one insert) only when this is true, since a replay after a
    /// reassignment that split a recorded group must read the members it
    /// does not hold; a source that cannot forms one range per partition
    /// (solos) only, so it never records a group it could not re-form.
    /// `false` by default (and, for now, for the Kafka source).
    fn reads_ranges(&self) -> bool {
        false
    }

    /// A *range lane*: a [`Lane`] over `partition`'s offsets
    /// `first..=last` only, read outside the group's assignment (for Kafka
    /// an unassigned fetch; never committed, acknowledged to the group or
    /// moved by it). Its epoch is [`RANGE_LANE_EPOCH`], which no assignment
    /// has, so acks issued for it name no epoch the tracker commits. Its
    /// polls return the records the log holds in the range, in offset
    /// order (gaps skipped, as any lane's), then nothing once past `last`;
    /// offsets the log no longer holds (retention, truncation) are never
    /// returned. The pipeline polls it on a pipeline thread like any lane
    /// (the I/O stays in the source's client, D2).
    ///
    /// # Errors
    /// [`SourceError::Fatal`] when the source cannot read ranges
    /// ([`Source::reads_ranges`] is false: the default) or `first > last`.
    fn read_range(
        &mut self,
        partition: &TopicPartition,
        first: Offset,
        last: Offset,
    ) -> Result<Self::Lane, SourceError> {
        Err(SourceError::Fatal {
            context: format!("read range {partition} {first}..={last}"),
            message: "this source cannot read a recorded range on demand (reads_ranges is false)"
                .to_owned(),
        })
    }
}

/// The epoch of every range lane ([`Source::read_range`]): larger than any
/// epoch an assignment has, so it names no assignment and nothing commits it.
pub const RANGE_LANE_EPOCH: Epoch = Epoch::MAX;

/// Errors from a source or a lane, with the context they happened in.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Retried by the client (or the next call); counted, not fatal.
    #[error("transient source error ({context}): {message}")]
    Transient {
        /// What was being done, e.g. `poll flights/3`.
        context: String,
        /// The client's message.
        message: String,
    },
    /// The pipeline cannot continue reading.
    #[error("fatal source error ({context}): {message}")]
    Fatal {
        /// What was being done, e.g. `subscribe flights`.
        context: String,
        /// The client's message.
        message: String,
    },
    /// The consumer group refused a commit for `partition` at `epoch`.
    #[error("commit of {partition} (epoch {epoch}) rejected: {message}")]
    CommitRejected {
        /// The partition whose commit was refused.
        partition: TopicPartition,
        /// The epoch the commit was for.
        epoch: Epoch,
        /// The broker's reason.
        message: String,
    },
}
