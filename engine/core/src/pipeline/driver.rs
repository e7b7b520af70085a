//! The lane driver: what one pipeline thread does with its lanes.
//!
//! A [`Driver`] owns some lanes and one [`Processor`] (decoder + chain +
//! terminal buffers). Each [`Driver::step`] first tries to hand pending chunks
//! to the sink; if they do not fit it pauses its lanes, otherwise it resumes
//! them; then it polls every lane once without waiting and runs the chain over
//! what arrived. It never waits on a channel, a lock or I/O other than the
//! lane poll (D2): a full sink means paused lanes and polls that keep coming.
//!
//! Record errors follow the policy (D6): `Skip` counts the record by reason
//! (and hands it to the dead-letter hook), `Fail` fails the record's ack, so the
//! partition's watermark freezes in front of it (D1), and stops the driver.
//!
//! The same code runs on an OS thread (service) or inline in the controller
//! task on a current-thread runtime (simulator); see `threads.rs` and
//! `controller.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::ack::AckIssuer;
use crate::metrics::Counter;
use crate::pipeline::chain::{Decoder, RecordCx, RecordError, RecordErrorKind, Stage};
use crate::pipeline::eo::LanePlan;
use crate::pipeline::terminal::{ChunkBuffers, Flush, Tail};
use crate::pipeline::{DeadLetter, OnError, PipelineError};
use crate::record::{Epoch, Payload, TopicPartition};
use crate::source::{Lane, PollBatch, SourceError};

/// Decoder plus chain: turns one payload into rows in the terminal buffers.
pub trait Processor {
    /// Runs the chain over one payload.
    ///
    /// # Errors
    /// The [`RecordError`] of whichever stage refused it.
    fn process(&mut self, cx: &RecordCx<'_>) -> Result<(), RecordError>;

    /// The terminal buffers at the end of the chain.
    fn buffers(&mut self) -> &mut ChunkBuffers;

    /// Called once before each poll batch's records (see
    /// [`Stage::begin_poll_batch`]); the default does nothing.
    fn begin_poll_batch(&mut self) {}
}

/// The usual [`Processor`]: a decoder feeding a chain of stages that ends in a
/// [`crate::pipeline::terminal::Terminal`].
#[derive(Debug)]
pub struct ChainProcessor<D, S> {
    decoder: D,
    chain: S,
}

impl<D, S> ChainProcessor<D, S> {
    /// `decoder` feeding `chain`.
    pub fn new(decoder: D, chain: S) -> Self {
        Self { decoder, chain }
    }
}

impl<D, S> Processor for ChainProcessor<D, S>
where
    D: Decoder,
    S: for<'a> Stage<D::Record<'a>> + Tail,
{
    #[inline]
    fn process(&mut self, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        self.decoder.decode(cx, &mut self.chain)
    }

    fn buffers(&mut self) -> &mut ChunkBuffers {
        self.chain.buffers()
    }

    #[inline]
    fn begin_poll_batch(&mut self) {
        begin_poll_batch::<D, S>(&mut self.chain);
    }
}

/// [`Stage::begin_poll_batch`] on a chain that takes `D`'s records of any
/// lifetime (the call does not depend on one).
fn begin_poll_batch<'a, D: Decoder, S: Stage<D::Record<'a>>>(chain: &mut S) {
    chain.begin_poll_batch();
}

/// Record counters shared by all drivers of a pipeline, for the run report.
/// Updated once per poll batch, not per record.
#[derive(Debug, Default)]
pub struct RecordCounters {
    /// Payloads polled.
    pub polled: AtomicU64,
    /// Payloads skipped by policy, any reason.
    pub skipped: AtomicU64,
    /// Payloads that failed the pipeline (Fail policy).
    pub failed: AtomicU64,
    /// Rows encoded into chunks.
    pub rows_encoded: AtomicU64,
    /// Lane polls made (also while paused).
    pub polls: AtomicU64,
}

/// One poll of `lane`, without waiting; `None` after a transient error
/// (logged: the lane is polled on next round).
fn poll_lane<L: Lane>(lane: &mut L) -> Result<Option<L::Batch<'_>>, PipelineError> {
    match lane.poll(Duration::ZERO) {
        Ok(b) => Ok(Some(b)),
        Err(SourceError::Transient { context, message }) => {
            tracing::warn!(%context, %message, "transient lane error; polling on");
            Ok(None)
        }
        Err(e) => Err(PipelineError::Source(e)),
    }
}

/// What one poll round saw, added to the counters once at its end.
#[derive(Debug, Default)]
struct Round {
    /// Whether any lane returned payloads.
    busy: bool,
    polls: u64,
    polled: u64,
    skipped: u64,
}

/// A driver's parts that run the chain over one poll batch, borrowed apart
/// from its lanes (the batch borrows its lane's memory).
struct BatchRun<'a, P> {
    processor: &'a mut P,
    on_error: OnError,
    dead_letter: &'a Option<Arc<dyn DeadLetter>>,
    metrics: &'a DriverMetrics,
    /// Records the driver skipped so far, for the log's pacing.
    skips: &'a mut u64,
    /// `delivery: effectively_once`: payloads go to the lane's range former.
    eo: bool,
}

impl<P: Processor> BatchRun<'_, P> {
    /// Issues the batch's ack and runs the chain over each payload; returns
    /// how many were skipped (`on_error: skip`), and the error that stops
    /// the driver under `on_error: fail`, after failing the batch's ack so
    /// its watermark freezes in front of it (D1).
    #[inline]
    fn run<'b, B: PollBatch<'b>>(
        &mut self,
        batch: &B,
        issuer: &mut AckIssuer,
    ) -> (u64, Result<(), PipelineError>) {
        let n = batch.len();
        let first = batch.payload(0);
        let ack = issuer.issue_at(
            first.offset,
            batch.payload(n - 1).offset,
            first.timestamp_ms,
        );
        // A plan published since the last poll batch applies from here:
        // never inside a poll batch, never per record.
        self.processor.begin_poll_batch();
        if self.eo {
            self.processor
                .buffers()
                .eo_select(issuer.partition(), issuer.epoch());
        }
        let mut skipped = 0;
        for i in 0..n {
            let cx = RecordCx {
                payload: batch.payload(i),
                ack: &ack,
            };
            // effectively_once: a range holds whole payloads, so its
            // boundaries fall between them (a poll batch may hold a
            // boundary: its ack then waits for both ranges).
            if self.eo {
                self.processor.buffers().eo_before(cx.payload.offset);
            }
            let processed = self.processor.process(&cx);
            if self.eo {
                self.processor.buffers().eo_after(cx.payload.offset);
            }
            let Err(error) = processed else { continue };
            match self.on_error {
                OnError::Skip => {
                    skipped += 1;
                    self.metrics.skipped[error.kind as usize].increment(1);
                    *self.skips += 1;
                    skip(self.dead_letter, &cx.payload, &error, *self.skips);
                }
                OnError::Fail => {
                    // D1: the batch's watermark freezes in front of it.
                    ack.fail();
                    let failed = PipelineError::RecordFailed {
                        partition: cx.payload.partition.clone(),
                        offset: cx.payload.offset,
                        error,
                    };
                    return (skipped, Err(failed));
                }
            }
        }
        (skipped, Ok(()))
    }
}

/// Metric handles of one driver, registered when it is built.
#[derive(Debug, Clone)]
struct DriverMetrics {
    polled: Counter,
    skipped: [Counter; 3],
    pauses: Counter,
    /// [`crate::metrics::RECORDS_FILTERED`] `reason=filter`, added once per
    /// poll round from the buffers' count (no per-row update).
    filtered: Counter,
}

impl DriverMetrics {
    fn register() -> Self {
        let skipped = |kind: RecordErrorKind| ::metrics::counter!(crate::metrics::RECORDS_SKIPPED, "reason" => kind.as_str());
        Self {
            polled: ::metrics::counter!(crate::metrics::RECORDS_POLLED),
            skipped: [
                skipped(RecordErrorKind::Decode),
                skipped(RecordErrorKind::Operator),
                skipped(RecordErrorKind::Encode),
            ],
            pauses: ::metrics::counter!(crate::metrics::LANE_PAUSES),
            filtered: crate::metrics::records_filtered("filter"),
        }
    }
}

struct LaneSlot<L> {
    lane: L,
    issuer: AckIssuer,
    paused: bool,
}

/// What one [`Driver::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Some lane returned records.
    Busy,
    /// No lane returned anything.
    Idle,
}

/// One pipeline thread's lanes and chain.
pub struct Driver<L, P> {
    lanes: Vec<LaneSlot<L>>,
    processor: P,
    on_error: OnError,
    dead_letter: Option<Arc<dyn DeadLetter>>,
    counters: Arc<RecordCounters>,
    metrics: DriverMetrics,
    rows_reported: u64,
    /// [`ChunkBuffers::rows_filtered`] already added to the metric.
    filtered_reported: u64,
    /// Records this driver skipped (`on_error: skip`), for the log's pacing.
    skips: u64,
    failed: bool,
}

impl<L, P> std::fmt::Debug for Driver<L, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("lanes", &self.lanes.len())
            .field("failed", &self.failed)
            .finish()
    }
}

impl<L: Lane, P: Processor> Driver<L, P> {
    /// A driver with no lanes yet.
    pub fn new(
        processor: P,
        on_error: OnError,
        dead_letter: Option<Arc<dyn DeadLetter>>,
        counters: Arc<RecordCounters>,
    ) -> Self {
        Self {
            lanes: Vec::new(),
            processor,
            on_error,
            dead_letter,
            counters,
            metrics: DriverMetrics::register(),
            rows_reported: 0,
            filtered_reported: 0,
            skips: 0,
            failed: false,
        }
    }

    /// Lanes currently owned.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Whether any lane is paused for backpressure.
    pub fn is_paused(&self) -> bool {
        self.lanes.iter().any(|l| l.paused)
    }

    /// Takes over `lane`, whose batches get handles from `issuer`.
    pub fn assign(&mut self, lane: L, issuer: AckIssuer) {
        self.assign_with(lane, issuer, None);
    }

    /// [`Driver::assign`], with the lane's range plan in `delivery:
    /// effectively_once` (required there, `None` otherwise).
    pub(crate) fn assign_with(&mut self, lane: L, issuer: AckIssuer, plan: Option<LanePlan>) {
        debug_assert_eq!(lane.partition(), issuer.partition());
        debug_assert_eq!(lane.epoch(), issuer.epoch());
        let buffers = self.processor.buffers();
        match plan {
            Some(plan) => buffers.eo_assign(lane.partition().clone(), lane.epoch(), plan),
            None => assert!(
                !buffers.is_effectively_once(),
                "an effectively_once lane comes with its range plan"
            ),
        }
        self.lanes.push(LaneSlot {
            lane,
            issuer,
            paused: false,
        });
    }

    /// Stops and drops the lane of `partition` at `epoch`, seals every open
    /// chunk (so its rows head for the sink) and returns how many ack handles
    /// the lane issued, or `None` if this driver does not own it.
    pub fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch) -> Option<u64> {
        let i = self
            .lanes
            .iter()
            .position(|l| l.lane.partition() == partition && l.lane.epoch() == epoch)?;
        let mut slot = self.lanes.swap_remove(i);
        let issued = slot.issuer.issued();
        if slot.paused {
            // librdkafka keeps a partition's pause across a rebalance: a
            // lane paused here (budget full, pending list full) would leave
            // the partition paused for its next lane on this consumer,
            // whose slot starts unpaused and so never resumes it; nothing
            // is then fetched (issue 23's group test: partitions stopped
            // committing after a SIGSTOP/SIGCONT, nothing logged).
            if let Err(e) = slot.lane.resume() {
                tracing::warn!(%partition, epoch, error = %e, "resume of a paused lane at its revoke failed; its next lane may start paused");
            }
        }
        drop(slot);
        let buffers = self.processor.buffers();
        buffers.eo_revoke(partition, epoch);
        buffers.seal_all();
        buffers.flush();
        Some(issued)
    }

    /// Gives up the lane of `partition` at `epoch` (resumed if it was paused)
    /// so another driver can take it; rows already encoded stay in this
    /// driver's chunks, which carry their own acks.
    ///
    /// # Errors
    /// None: a lane that refuses to resume is handed over paused and logged.
    pub fn take_lane(
        &mut self,
        partition: &TopicPartition,
        epoch: Epoch,
    ) -> Option<(L, AckIssuer)> {
        let i = self
            .lanes
            .iter()
            .position(|l| l.lane.partition() == partition && l.lane.epoch() == epoch)?;
        Some(self.release_slot(i))
    }

    /// Gives up the most recently assigned lane (see [`Driver::take_lane`]).
    pub fn take_last_lane(&mut self) -> Option<(L, AckIssuer)> {
        let i = self.lanes.len().checked_sub(1)?;
        Some(self.release_slot(i))
    }

    fn release_slot(&mut self, i: usize) -> (L, AckIssuer) {
        let mut slot = self.lanes.remove(i);
        if slot.paused {
            if let Err(e) = slot.lane.resume() {
                tracing::warn!(partition = %slot.lane.partition(), error = %e, "resume before moving a lane failed");
            }
        }
        (slot.lane, slot.issuer)
    }

    /// One round: flush, pause or resume, poll every lane once, run the chain.
    ///
    /// # Errors
    /// [`PipelineError::RecordFailed`] under the Fail policy,
    /// [`PipelineError::Source`] for a fatal lane error. After an error the
    /// driver does nothing more.
    pub fn step(&mut self, now: Instant) -> Result<Step, PipelineError> {
        if self.failed {
            return Ok(Step::Idle);
        }
        let blocked = self.processor.buffers().flush() == Flush::Blocked;
        let eo = self.processor.buffers().is_effectively_once();
        for slot in &mut self.lanes {
            // effectively_once: a lane whose pending range list is full
            // pauses too, polled on (D2), until the watermark passes some.
            let blocked = blocked
                || (eo
                    && self
                        .processor
                        .buffers()
                        .eo_full(slot.lane.partition(), slot.lane.epoch()));
            if blocked && !slot.paused {
                slot.lane.pause()?;
                slot.paused = true;
                self.metrics.pauses.increment(1);
            } else if !blocked && slot.paused {
                slot.lane.resume()?;
                slot.paused = false;
            }
        }
        let busy = self.poll_round(eo, false)?;
        let buffers = self.processor.buffers();
        if busy {
            buffers.seal_lingering(now);
        } else {
            // Nothing arrived: ship what is open rather than let it wait.
            buffers.seal_all();
        }
        buffers.flush();
        Ok(if busy { Step::Busy } else { Step::Idle })
    }

    /// Polls every lane once (`replay_only`: only the lanes holding an
    /// incomplete replayed range) and runs the chain over what came;
    /// `Ok(true)` if anything did.
    fn poll_round(&mut self, eo: bool, replay_only: bool) -> Result<bool, PipelineError> {
        let mut round = Round::default();
        let mut result = Ok(());
        let Driver {
            lanes,
            processor,
            on_error,
            dead_letter,
            metrics,
            skips,
            ..
        } = self;
        let mut chain = BatchRun {
            processor,
            on_error: *on_error,
            dead_letter,
            metrics,
            skips,
            eo,
        };
        for slot in lanes.iter_mut() {
            if replay_only
                && !chain
                    .processor
                    .buffers()
                    .eo_replaying(slot.lane.partition(), slot.lane.epoch())
            {
                continue;
            }
            round.polls += 1;
            let LaneSlot { lane, issuer, .. } = slot;
            let batch = match poll_lane(lane) {
                Ok(Some(b)) => b,
                Ok(None) => continue,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            let n = batch.len();
            if n == 0 {
                drop(batch);
                // Caught up: offsets the client stepped over at the tail
                // (transaction markers) become a delivered batch of no
                // records behind the ones before (D1).
                if let Some(next) = lane.position() {
                    issuer.skip_to(next);
                }
                continue;
            }
            round.busy = true;
            round.polled += n as u64;
            let (skipped, processed) = chain.run(&batch, issuer);
            round.skipped += skipped;
            if let Err(e) = processed {
                result = Err(e);
                break;
            }
        }
        self.count_round(&round);
        if let Err(e) = result {
            if matches!(e, PipelineError::RecordFailed { .. }) {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
            }
            self.failed = true;
            return Err(e);
        }
        Ok(round.busy)
    }

    /// Adds one poll round to the run's counters and metrics: polls,
    /// payloads polled and skipped, rows encoded and filtered (D6).
    fn count_round(&mut self, round: &Round) {
        let c = &self.counters;
        c.polls.fetch_add(round.polls, Ordering::Relaxed);
        c.polled.fetch_add(round.polled, Ordering::Relaxed);
        c.skipped.fetch_add(round.skipped, Ordering::Relaxed);
        self.metrics.polled.increment(round.polled);
        let buffers = self.processor.buffers();
        let rows = buffers.rows_encoded();
        c.rows_encoded
            .fetch_add(rows - self.rows_reported, Ordering::Relaxed);
        self.rows_reported = rows;
        let filtered = buffers.rows_filtered();
        if filtered != self.filtered_reported {
            self.metrics
                .filtered
                .increment(filtered - self.filtered_reported);
            self.filtered_reported = filtered;
        }
    }

    /// Seals every open chunk and tries once to hand all pending chunks over;
    /// [`Flush::Clear`] when nothing is left. Used by shutdown, which repeats it
    /// until clear or its deadline.
    ///
    /// effectively_once: a lane holding an incomplete replayed range is
    /// polled on first (that range cannot seal short: its token names its
    /// bounds, D9), and the result is not `Clear` while one is incomplete,
    /// so shutdown completes it by its deadline rather than dropping it
    /// (D6; the simulator's seeds 421 and 4408 returned early with it
    /// unwritten).
    pub fn flush_all(&mut self) -> Flush {
        if !self.failed && self.processor.buffers().eo_any_replaying() {
            if let Err(e) = self.poll_round(true, true) {
                tracing::warn!(error = %e, "poll during shutdown failed; the replayed range it completes is dropped and replays");
            }
        }
        let buffers = self.processor.buffers();
        buffers.seal_all();
        let flushed = buffers.flush();
        if flushed == Flush::Clear && !self.failed && buffers.eo_any_replaying() {
            return Flush::Waiting;
        }
        flushed
    }
}

/// Skips logged at WARN before the pacing starts (see [`skip`]).
const SKIPS_LOGGED_IN_FULL: u64 = 10;

/// Whether the `nth` skip of a driver is logged at WARN: the first
/// [`SKIPS_LOGGED_IN_FULL`], then every power of two.
fn skip_logged(nth: u64) -> bool {
    nth <= SKIPS_LOGGED_IN_FULL || nth.is_power_of_two()
}

/// The last skip logged at WARN among the first `n` (0 when `n` is 0).
fn last_logged(n: u64) -> u64 {
    if n <= SKIPS_LOGGED_IN_FULL {
        return n;
    }
    let pow = 1u64 << (63 - n.leading_zeros());
    pow.max(SKIPS_LOGGED_IN_FULL)
}

/// For a skip logged at WARN (`skip_logged(nth)`): how many skips were not
/// logged between it and the logged one before it.
fn suppressed_before(nth: u64) -> u64 {
    debug_assert!(skip_logged(nth), "skip {nth} is not logged");
    nth.saturating_sub(last_logged(nth.saturating_sub(1)) + 1)
}

/// After `n` skips: how many followed the last one logged at WARN.
fn suppressed_after(n: u64) -> u64 {
    n - last_logged(n)
}

impl<L, P> Drop for Driver<L, P> {
    /// At the end of the run, says how many skips the pacing kept off the
    /// WARN log since the last one it showed (issue 19: paced, and saying
    /// so).
    fn drop(&mut self) {
        let suppressed = suppressed_after(self.skips);
        if suppressed > 0 {
            tracing::warn!(
                suppressed,
                skipped_by_this_thread = self.skips,
                "{suppressed} more skipped record(s) suppressed since the last one logged \
                 (spate_records_skipped_total counts every one; RUST_LOG=spate_core=debug \
                 logs each)"
            );
        }
    }
}

/// Logs and dead-letters a skipped record; `nth` counts this driver's
/// skips. The first ten and then every power of two go out at WARN with
/// partition, offset and reason, so a user without a dead-letter topic can
/// find them, while a flood of bad records cannot flood the log (the
/// `spate_records_skipped_total` metric counts every one); the rest at
/// DEBUG. A paced WARN line says how many were suppressed since the one
/// before it, and the driver says how many followed the last one when it
/// ends (its `Drop`).
fn skip(
    dead_letter: &Option<Arc<dyn DeadLetter>>,
    payload: &Payload<'_>,
    error: &RecordError,
    nth: u64,
) {
    if skip_logged(nth) {
        let suppressed = suppressed_before(nth);
        if suppressed == 0 {
            tracing::warn!(
                partition = %payload.partition,
                offset = payload.offset,
                %error,
                skipped_by_this_thread = nth,
                "record skipped (on_error: skip)"
            );
        } else {
            tracing::warn!(
                partition = %payload.partition,
                offset = payload.offset,
                %error,
                skipped_by_this_thread = nth,
                suppressed,
                "record skipped (on_error: skip); {suppressed} more suppressed since the last \
                 one logged (spate_records_skipped_total counts every one)"
            );
        }
    } else {
        tracing::debug!(partition = %payload.partition, offset = payload.offset, %error, "record skipped");
    }
    if let Some(dl) = dead_letter {
        dl.dead_letter(payload, error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 19: the paced WARN lines say how many skips they left out.
    /// Over the first 100 skips, the logged ones plus what each says it
    /// suppressed, plus what the end says, account for every skip.
    #[test]
    fn paced_skip_lines_account_for_every_skip() {
        let logged: Vec<u64> = (1..=100).filter(|&n| skip_logged(n)).collect();
        assert_eq!(logged, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32, 64]);
        let said: Vec<u64> = logged.iter().map(|&n| suppressed_before(n)).collect();
        assert_eq!(said, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 15, 31]);
        assert_eq!(suppressed_after(100), 36, "65..=100");
        let total = logged.len() as u64 + said.iter().sum::<u64>() + suppressed_after(100);
        assert_eq!(total, 100);
        assert_eq!(suppressed_after(64), 0);
        assert_eq!(suppressed_after(7), 0);
        assert_eq!(suppressed_after(0), 0);
        assert_eq!(suppressed_after(12), 2);
    }
}
