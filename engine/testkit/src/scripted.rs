//! In-memory test utilities, public so users can test their own pipelines:
//! a [`ScriptedSource`] (partitions with logs you append to, assignment events
//! you script, a commit store you inspect) and a [`CaptureWriter`] (records
//! every write attempt; can be told to fail or hang), plus a [`LineEncoder`]
//! that writes each payload as one newline-terminated row so captured batches
//! split back into rows.
//!
//! They use mutexes freely: they are test doubles, not the record path.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use spate_core::pipeline::Shutdown;
use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError};
use spate_core::record::{Epoch, Offset, Payload, TopicPartition};
use spate_core::sink::{Endpoint, SealedBatch, WriteError, Writer};
use spate_core::source::{AssignmentEvent, CommitOffset, Committed, Source, SourceError};

use crate::lane::{self, LaneFeed, LaneState, MemLane};

#[derive(Debug, Default)]
struct Log {
    values: Vec<Bytes>,
    committed: Option<Offset>,
    /// The metadata of the last commit (empty: none).
    metadata: String,
    epoch: Epoch,
}

#[derive(Debug)]
enum Scripted {
    Assign(TopicPartition),
    Revoke(TopicPartition),
}

#[derive(Debug, Default)]
struct ScriptState {
    logs: BTreeMap<TopicPartition, Log>,
    events: VecDeque<Scripted>,
    commits: Vec<CommitOffset>,
    released: Vec<(TopicPartition, Epoch)>,
    fail_commits: u32,
    reject_commits: bool,
    consumer_error: bool,
    rows_read: u64,
    bytes_read: u64,
    shutdown_after: Option<(u64, Shutdown)>,
    /// Whether the source answers [`Source::reads_ranges`] true.
    reads_ranges: bool,
}

/// A test handle on a [`ScriptedSource`]: append records, script assignment
/// changes, inspect commits. Cloneable; usable while the pipeline runs.
#[derive(Clone, Debug, Default)]
pub struct ScriptHandle {
    state: Arc<Mutex<ScriptState>>,
    polls: Arc<AtomicU64>,
    max_batch: usize,
}

impl ScriptHandle {
    fn lock(&self) -> MutexGuard<'_, ScriptState> {
        self.state.lock().expect("script state lock")
    }

    /// Appends `value` to `partition`'s log; returns its offset.
    pub fn append(&self, partition: &TopicPartition, value: impl Into<Bytes>) -> Offset {
        let mut s = self.lock();
        let log = s.logs.entry(partition.clone()).or_default();
        log.values.push(value.into());
        log.values.len() as Offset - 1
    }

    /// Scripts an assignment of `partition` (a new epoch), served by the next
    /// [`Source::poll_event`].
    pub fn assign(&self, partition: &TopicPartition) {
        let mut s = self.lock();
        s.logs.entry(partition.clone()).or_default();
        s.events.push_back(Scripted::Assign(partition.clone()));
    }

    /// Scripts a revoke of `partition`'s current epoch.
    pub fn revoke(&self, partition: &TopicPartition) {
        self.lock()
            .events
            .push_back(Scripted::Revoke(partition.clone()));
    }

    /// The last committed offset of `partition`.
    pub fn committed(&self, partition: &TopicPartition) -> Option<Offset> {
        self.lock().logs.get(partition).and_then(|l| l.committed)
    }

    /// The log end offset of `partition` (next offset to be appended).
    pub fn end_offset(&self, partition: &TopicPartition) -> Offset {
        self.lock()
            .logs
            .get(partition)
            .map_or(0, |l| l.values.len() as Offset)
    }

    /// The metadata of `partition`'s last accepted commit (empty: none).
    pub fn committed_metadata(&self, partition: &TopicPartition) -> String {
        self.lock()
            .logs
            .get(partition)
            .map(|l| l.metadata.clone())
            .unwrap_or_default()
    }

    /// Every commit accepted, in order.
    pub fn commits(&self) -> Vec<CommitOffset> {
        self.lock().commits.clone()
    }

    /// Partitions released after a revoke, in order.
    pub fn released(&self) -> Vec<(TopicPartition, Epoch)> {
        self.lock().released.clone()
    }

    /// Makes the source read recorded ranges on demand
    /// ([`Source::reads_ranges`] true, [`Source::read_range`] served from the
    /// log), as the simulator's does; off by default, as for Kafka.
    pub fn read_ranges(&self, on: bool) {
        self.lock().reads_ranges = on;
    }

    /// Makes the next `n` commits fail with a transient error.
    pub fn fail_commits(&self, n: u32) {
        self.lock().fail_commits = n;
    }

    /// Makes every commit be rejected (`true`) as the group rejects a
    /// fenced or evicted member's ([`SourceError::CommitRejected`], naming
    /// the first partition), or accepted again (`false`).
    pub fn reject_commits(&self, reject: bool) {
        self.lock().reject_commits = reject;
    }

    /// Makes [`Source::consumer_ready`] report an error standing (`true`)
    /// or a healthy consumer (`false`, the start state).
    pub fn set_consumer_error(&self, error: bool) {
        self.lock().consumer_error = error;
    }

    /// Lane polls served so far (also paused and empty ones).
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    /// Records the lanes returned so far, over every partition and epoch.
    pub fn rows_read(&self) -> u64 {
        self.lock().rows_read
    }

    /// Value bytes of the records the lanes returned so far.
    pub fn bytes_read(&self) -> u64 {
        self.lock().bytes_read
    }

    /// Triggers `shutdown` from inside the lane poll that brings
    /// [`ScriptHandle::rows_read`] to `rows` or more: a stop that arrives
    /// mid-stream, with the rows just read still in the driver's hands.
    pub fn shutdown_after(&self, rows: u64, shutdown: Shutdown) {
        self.lock().shutdown_after = Some((rows, shutdown));
    }
}

/// A [`Source`] whose partitions, records and assignment events a test
/// scripts through its [`ScriptHandle`].
#[derive(Debug)]
pub struct ScriptedSource {
    handle: ScriptHandle,
}

impl ScriptedSource {
    /// A source whose lanes return at most `max_batch` records per poll.
    pub fn new(max_batch: usize) -> (Self, ScriptHandle) {
        assert!(max_batch > 0, "max_batch must be positive");
        let handle = ScriptHandle {
            max_batch,
            ..ScriptHandle::default()
        };
        (
            Self {
                handle: handle.clone(),
            },
            handle,
        )
    }
}

impl Source for ScriptedSource {
    type Lane = ScriptedLane;

    fn reads_ranges(&self) -> bool {
        self.handle.lock().reads_ranges
    }

    fn read_range(
        &mut self,
        partition: &TopicPartition,
        first: Offset,
        last: Offset,
    ) -> Result<ScriptedLane, SourceError> {
        if !self.reads_ranges() || first > last || first < 0 {
            return Err(SourceError::Fatal {
                context: format!("read range {partition} {first}..={last}"),
                message: "not enabled (ScriptHandle::read_ranges) or an empty range".into(),
            });
        }
        let feed = ScriptFeed {
            handle: self.handle.clone(),
            range_last: Some(last),
        };
        Ok(MemLane::new(
            partition.clone(),
            spate_core::source::RANGE_LANE_EPOCH,
            first,
            feed,
        ))
    }

    fn poll_event(
        &mut self,
        _timeout: Duration,
    ) -> Result<Option<AssignmentEvent<ScriptedLane>>, SourceError> {
        let mut s = self.handle.lock();
        let Some(ev) = s.events.pop_front() else {
            return Ok(None);
        };
        Ok(Some(match ev {
            Scripted::Assign(partition) => {
                let log = s.logs.entry(partition.clone()).or_default();
                log.epoch += 1;
                let epoch = log.epoch;
                let position = log.committed.unwrap_or(0);
                let committed = log.committed.map(|offset| Committed {
                    offset,
                    metadata: log.metadata.clone(),
                });
                drop(s);
                let feed = ScriptFeed {
                    handle: self.handle.clone(),
                    range_last: None,
                };
                lane::assigned(partition, epoch, position, committed, feed)
            }
            Scripted::Revoke(partition) => {
                let log = s.logs.entry(partition.clone()).or_default();
                let epoch = log.epoch;
                // Lanes of this epoch stop reading at once.
                log.epoch += 1;
                AssignmentEvent::Revoked { partition, epoch }
            }
        }))
    }

    fn release(&mut self, partition: &TopicPartition, epoch: Epoch) -> Result<(), SourceError> {
        self.handle.lock().released.push((partition.clone(), epoch));
        Ok(())
    }

    fn consumer_ready(&self) -> bool {
        !self.handle.lock().consumer_error
    }

    fn commit(&mut self, offsets: &[CommitOffset]) -> Result<(), SourceError> {
        let mut s = self.handle.lock();
        if s.reject_commits {
            if let Some(c) = offsets.first() {
                return Err(SourceError::CommitRejected {
                    partition: c.partition.clone(),
                    epoch: c.epoch,
                    message: "scripted: this member was fenced".into(),
                });
            }
        }
        if s.fail_commits > 0 {
            s.fail_commits -= 1;
            return Err(SourceError::Transient {
                context: "commit".into(),
                message: "scripted commit failure".into(),
            });
        }
        for c in offsets {
            let log = s.logs.entry(c.partition.clone()).or_default();
            assert!(
                log.committed.is_none_or(|prev| c.offset >= prev),
                "commit of {} went backwards",
                c.partition
            );
            log.committed = Some(c.offset);
            log.metadata = c.metadata.clone().unwrap_or_default();
            s.commits.push(c.clone());
        }
        Ok(())
    }
}

impl ScriptedSource {
    /// A new source over `handle`'s logs, commits and commit metadata, as a
    /// process restarted after a crash sees them; its lanes return at most
    /// `max_batch` records per poll (poll batches may differ between runs).
    pub fn restarted(handle: &ScriptHandle, max_batch: usize) -> (Self, ScriptHandle) {
        assert!(max_batch > 0, "max_batch must be positive");
        let handle = ScriptHandle {
            state: Arc::clone(&handle.state),
            polls: Arc::default(),
            max_batch,
        };
        (
            Self {
                handle: handle.clone(),
            },
            handle,
        )
    }
}

/// A lane of a [`ScriptedSource`]: the shared in-memory lane
/// ([`crate::lane`]) fed from the script's log.
pub type ScriptedLane = MemLane<ScriptFeed>;

/// Feeds a [`ScriptedLane`] from its partition's scripted log: at most
/// `max_batch` records from its position, nothing while paused or once the
/// partition was revoked (a later epoch).
#[derive(Debug)]
pub struct ScriptFeed {
    handle: ScriptHandle,
    /// A range lane's last offset ([`Source::read_range`]): it reads the
    /// log outside any epoch, up to that offset. `None`: an assigned lane.
    range_last: Option<Offset>,
}

impl LaneFeed for ScriptFeed {
    fn feed(&mut self, lane: &mut LaneState) -> Result<(), SourceError> {
        self.handle.polls.fetch_add(1, Ordering::Relaxed);
        if lane.paused {
            return Ok(());
        }
        let mut s = self.handle.lock();
        let mut bytes = 0;
        if let Some(log) = s
            .logs
            .get(&lane.partition)
            .filter(|l| self.range_last.is_some() || l.epoch == lane.epoch)
        {
            let start = lane.position as usize;
            let stop = self
                .range_last
                .map_or(usize::MAX, |last| (last + 1).max(0) as usize);
            let end = log
                .values
                .len()
                .min(start + self.handle.max_batch)
                .min(stop);
            let values = &log.values[start.min(end)..end];
            bytes = values.iter().map(|v| v.len() as u64).sum::<u64>();
            lane.take(lane.position, values);
        }
        s.rows_read += lane.taken() as u64;
        s.bytes_read += bytes;
        if let Some((rows, shutdown)) = &s.shutdown_after {
            if s.rows_read >= *rows {
                shutdown.trigger();
            }
        }
        Ok(())
    }
}

/// Appends each payload's value and a `\n`: one row per line, so captured
/// batches split back into rows. Refuses values containing `\n`.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineEncoder;

impl<'a> Encoder<Payload<'a>> for LineEncoder {
    fn encode(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let bytes = record.bytes();
        if bytes.contains(&b'\n') {
            return Err(RecordError::encode("line", "value contains a newline"));
        }
        buf.extend_from_slice(bytes);
        buf.push(b'\n');
        Ok(())
    }
}

/// How a [`CaptureWriter`] answers writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterMode {
    /// Acknowledge.
    Accept,
    /// Fail with a retryable error.
    FailRetryable,
    /// Fail with a fatal error.
    FailFatal,
    /// Refuse as a replica does that still runs an earlier attempt with the
    /// same query id ([`WriteError::already_running`]).
    AlreadyRunning,
    /// Never answer while the mode stays `Hang`; answers per the new mode when
    /// it changes. (In a [`CaptureWriter::script`], never answers at all.)
    Hang,
}

/// One write attempt seen by a [`CaptureWriter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Where it was sent.
    pub endpoint: Endpoint,
    /// The dedup token.
    pub token: String,
    /// The body (all segments concatenated).
    pub body: Bytes,
    /// Whether it was acknowledged.
    pub accepted: bool,
}

#[derive(Debug)]
struct CaptureState {
    mode: WriterMode,
    replica_modes: BTreeMap<(usize, usize), WriterMode>,
    script: std::collections::VecDeque<WriterMode>,
    attempts: Vec<Attempt>,
}

/// A [`Writer`] that records every attempt and answers per its mode.
#[derive(Clone, Debug)]
pub struct CaptureWriter {
    state: Arc<Mutex<CaptureState>>,
}

impl Default for CaptureWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl CaptureWriter {
    /// A writer that accepts everything.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(CaptureState {
                mode: WriterMode::Accept,
                replica_modes: BTreeMap::new(),
                script: std::collections::VecDeque::new(),
                attempts: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CaptureState> {
        self.state.lock().expect("capture state lock")
    }

    /// Sets how every replica answers from now on (per-replica modes win).
    pub fn set_mode(&self, mode: WriterMode) {
        self.lock().mode = mode;
    }

    /// Sets how one replica answers; `None` returns it to the global mode.
    pub fn set_replica_mode(&self, shard: usize, replica: usize, mode: Option<WriterMode>) {
        let mut s = self.lock();
        match mode {
            Some(m) => s.replica_modes.insert((shard, replica), m),
            None => s.replica_modes.remove(&(shard, replica)),
        };
    }

    /// Scripts the next writes, whichever replica they go to: the i-th next
    /// attempt answers per `modes[i]` (a scripted `Hang` never answers and is
    /// recorded as not accepted); after the script, the modes apply again.
    pub fn script(&self, modes: impl IntoIterator<Item = WriterMode>) {
        self.lock().script.extend(modes);
    }

    /// Every attempt so far, in order.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.lock().attempts.clone()
    }

    /// The rows (lines) of every accepted write, in acknowledgement order.
    pub fn accepted_lines(&self) -> Vec<Bytes> {
        self.lock()
            .attempts
            .iter()
            .filter(|a| a.accepted)
            .flat_map(|a| split_lines(&a.body))
            .collect()
    }

    fn mode_for(&self, endpoint: &Endpoint) -> WriterMode {
        let s = self.lock();
        s.replica_modes
            .get(&(endpoint.shard, endpoint.replica))
            .copied()
            .unwrap_or(s.mode)
    }
}

fn split_lines(body: &Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, b) in body.iter().enumerate() {
        if *b == b'\n' {
            out.push(body.slice(start..i));
            start = i + 1;
        }
    }
    out
}

impl Writer for CaptureWriter {
    async fn write(&self, endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        let scripted = self.lock().script.pop_front();
        if scripted == Some(WriterMode::Hang) {
            self.lock().attempts.push(Attempt {
                endpoint: endpoint.clone(),
                token: batch.token().to_owned(),
                body: batch.to_contiguous(),
                accepted: false,
            });
            return std::future::pending().await;
        }
        let mut mode = scripted.unwrap_or_else(|| self.mode_for(endpoint));
        while mode == WriterMode::Hang {
            tokio::time::sleep(Duration::from_millis(5)).await;
            mode = self.mode_for(endpoint);
        }
        let accepted = mode == WriterMode::Accept;
        self.lock().attempts.push(Attempt {
            endpoint: endpoint.clone(),
            token: batch.token().to_owned(),
            body: batch.to_contiguous(),
            accepted,
        });
        match mode {
            WriterMode::Accept => Ok(()),
            WriterMode::FailRetryable => Err(WriteError::retryable("scripted retryable failure")),
            WriterMode::FailFatal => Err(WriteError::fatal("scripted fatal failure")),
            WriterMode::AlreadyRunning => Err(WriteError::already_running(
                "scripted: query with this id is already running",
            )),
            WriterMode::Hang => unreachable!("left the loop"),
        }
    }

    async fn probe(&self, _endpoint: &Endpoint) -> Result<(), WriteError> {
        Ok(())
    }
}
