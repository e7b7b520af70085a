//! One shard's worker: merge chunks into batches, seal, write with retries.
//!
//! The worker task owns the shard's queue receiver, the open batch, sealed
//! batches waiting for a write slot and a `JoinSet` of write tasks (at most
//! `max_inflight`). Each write task owns its batch's acks and budget permit,
//! so however it ends (written, abandoned, aborted) they settle exactly once:
//! delivered only after a replica acknowledged the insert (D1).
//!
//! Backpressure: while a sealed batch waits for a write slot the worker stops
//! reading its queue, the queue fills and pipeline threads' `try_send` fails,
//! so they pause their lanes (D2, D8).
//!
//! `select!` is `biased` and every random draw comes from the shard's seeded
//! RNG, so on a current-thread runtime with paused time a run replays (D7).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until};

use crate::ack::AckSet;
use crate::budget::BudgetPermit;
use crate::planted::{self, Bug};
use crate::sink::events::{Abandon, ShardShared};
use crate::sink::{
    Chunk, Pick, SealedBatch, SinkConfig, WriteError, WriteErrorKind, Writer, backoff_delay,
};

pub(crate) struct WorkerArgs<W> {
    pub(crate) shared: Arc<ShardShared>,
    pub(crate) config: Arc<SinkConfig>,
    pub(crate) writer: Arc<W>,
    pub(crate) rx: mpsc::Receiver<Chunk>,
    pub(crate) drain: oneshot::Receiver<Instant>,
    pub(crate) token_prefix: String,
    pub(crate) seed: u64,
}

/// A batch being filled.
struct OpenBatch {
    segments: Vec<Bytes>,
    rows: u64,
    bytes: u64,
    acks: AckSet,
    permit: BudgetPermit,
    opened_at: Instant,
}

/// A sealed batch with what settles when its write ends.
struct PendingBatch {
    batch: Arc<SealedBatch>,
    acks: AckSet,
    _permit: BudgetPermit,
}

pub(crate) async fn run<W: Writer>(args: WorkerArgs<W>) {
    let WorkerArgs {
        shared,
        config,
        writer,
        mut rx,
        drain,
        token_prefix,
        seed,
    } = args;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut drain = Some(drain);
    let mut deadline: Option<Instant> = None;
    let mut input_closed = false;
    let mut open: Option<OpenBatch> = None;
    let mut sealed: VecDeque<PendingBatch> = VecDeque::new();
    let mut inflight: JoinSet<()> = JoinSet::new();
    let mut next_seq: u64 = 0;
    // `range`: the token of a range part (effectively_once), written as it
    // is; else the run's `{prefix}{seq}`.
    let mut seal = |open: &mut Option<OpenBatch>,
                    sealed: &mut VecDeque<PendingBatch>,
                    range: Option<String>| {
        if let Some(b) = open.take() {
            let seq = next_seq;
            next_seq += 1;
            let token = range.unwrap_or_else(|| format!("{token_prefix}{seq}"));
            let batch = SealedBatch::new(shared.shard, seq, token, b.segments, b.rows, &b.acks);
            debug_assert_eq!(batch.bytes(), b.bytes);
            let acks = if planted::active(Bug::CommitBeforeAck) {
                b.acks.deliver();
                AckSet::new()
            } else {
                b.acks
            };
            sealed.push_back(PendingBatch {
                batch: Arc::new(batch),
                acks,
                _permit: b.permit,
            });
        }
    };

    loop {
        while inflight.len() < config.max_inflight {
            let Some(p) = sealed.pop_front() else { break };
            let child_seed = rng.next_u64();
            inflight.spawn(write_batch(
                Arc::clone(&writer),
                Arc::clone(&shared),
                Arc::clone(&config),
                p,
                child_seed,
            ));
        }
        if input_closed && open.is_none() && sealed.is_empty() && inflight.is_empty() {
            break;
        }
        shared.queue_depth(rx.len());
        let linger_at = open.as_ref().map(|b| b.opened_at + config.batch.linger);
        // Read the queue only while no sealed batch waits for a write slot:
        // that is what turns a slow shard into backpressure (D2, D8).
        let accept = !input_closed && sealed.is_empty();

        tokio::select! {
            biased;
            d = async { drain.as_mut().expect("guarded").await }, if drain.is_some() => {
                drain = None;
                if let Ok(d) = d {
                    deadline = Some(d);
                    // Stop intake; chunks already queued are still received.
                    rx.close();
                }
            }
            () = async { sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => {
                abandon_at_deadline(&shared, &mut open, &mut sealed, &mut inflight).await;
                return;
            }
            Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                if let Err(e) = joined {
                    // A panicking write task dropped its acks: they failed (D1).
                    shared.write_task_failed(&e);
                }
            }
            msg = rx.recv(), if accept => match msg {
                Some(mut chunk) if chunk.token.is_some() => {
                    // D9: a range part is one batch, never merged.
                    seal(&mut open, &mut sealed, None);
                    let token = chunk.token.take();
                    add(&mut open, chunk);
                    seal(&mut open, &mut sealed, token);
                }
                Some(chunk) => {
                    if open.as_ref().is_some_and(|b| would_overflow(b, &chunk, &config)) {
                        seal(&mut open, &mut sealed, None);
                    }
                    add(&mut open, chunk);
                    if open.as_ref().is_some_and(|b| is_full(b, &config)) {
                        seal(&mut open, &mut sealed, None);
                    }
                }
                None => {
                    input_closed = true;
                    if planted::active(Bug::DrainDropsPartialBatch) {
                        open = None;
                    }
                    seal(&mut open, &mut sealed, None);
                }
            },
            () = async { sleep_until(linger_at.expect("guarded")).await }, if linger_at.is_some() => {
                seal(&mut open, &mut sealed, None);
            }
        }
    }
}

fn add(open: &mut Option<OpenBatch>, chunk: Chunk) {
    let (data, rows, acks, permit) = chunk.into_parts();
    match open {
        Some(b) => {
            b.bytes += data.len() as u64;
            b.rows += rows;
            b.segments.push(data);
            b.acks.append(acks);
            b.permit.merge(permit);
        }
        None => {
            *open = Some(OpenBatch {
                bytes: data.len() as u64,
                segments: vec![data],
                rows,
                acks,
                permit,
                opened_at: Instant::now(),
            });
        }
    }
}

fn would_overflow(b: &OpenBatch, chunk: &Chunk, config: &SinkConfig) -> bool {
    b.rows + chunk.rows() > config.batch.max_rows || b.bytes + chunk.len() > config.batch.max_bytes
}

fn is_full(b: &OpenBatch, config: &SinkConfig) -> bool {
    b.rows >= config.batch.max_rows || b.bytes >= config.batch.max_bytes
}

/// D5: the deadline passed. Abort the writes in flight and drop every batch
/// still held; their ack sets fail on drop (D1).
async fn abandon_at_deadline(
    shared: &ShardShared,
    open: &mut Option<OpenBatch>,
    sealed: &mut VecDeque<PendingBatch>,
    inflight: &mut JoinSet<()>,
) {
    let mut batches = sealed.len() as u64 + u64::from(open.is_some());
    inflight.abort_all();
    // Aborted tasks end at their next poll; this returns at once unless a
    // writer blocks its thread, which the pool's grace timer covers.
    while let Some(joined) = inflight.join_next().await {
        // Only a task that did not finish dropped its batch unwritten. One
        // that finished before the abort (written or abandoned at the same
        // instant as the deadline) has already counted itself.
        if joined.is_err() {
            batches += 1;
        }
    }
    sealed.clear();
    *open = None;
    shared.abandoned_at_deadline(batches);
}

/// Writes one sealed batch, retrying the same bytes and token on the next
/// healthy replica with backoff, until it is acknowledged, fails fatally or
/// runs out of attempts. Owns the batch's acks: delivered only on success.
///
/// An answer [`WriteErrorKind::AlreadyRunning`] (the replica still runs an
/// earlier attempt of this batch under the same query id) is waited out: the
/// same replica is asked again after a backoff, without counting a failure
/// or touching its breaker.
///
/// Every attempt whose outcome is unknown (timeout, connection lost after
/// sending) may have landed: the batch may be in the table once per such
/// attempt plus once for the acknowledged one where the server ignores the
/// token (plain MergeTree). That number is logged as "up to N copies" and
/// the extra copies are counted (`possible_duplicates`, in batches and rows).
async fn write_batch<W: Writer>(
    writer: Arc<W>,
    shared: Arc<ShardShared>,
    config: Arc<SinkConfig>,
    pending: PendingBatch,
    seed: u64,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let _inflight = shared.write_in_flight();
    let batch = &pending.batch;
    let mut failures: u32 = 0;
    // Attempts that timed out or lost the connection after sending: each may
    // have landed.
    let mut ambiguous: u64 = 0;
    // Consecutive "still running" answers, for the wait's backoff; and the
    // replica that gave them, asked again next.
    let mut waits: u32 = 0;
    let mut again: Option<usize> = None;
    let outcome = loop {
        let replica = match again.take() {
            Some(r) => r,
            None => {
                let pick = shared
                    .replicas
                    .lock()
                    .expect("replica set lock")
                    .pick(Instant::now());
                match pick {
                    Pick::Replica(r) => r,
                    Pick::WaitUntil(t) => {
                        sleep_until(t).await;
                        continue;
                    }
                }
            }
        };
        let endpoint = &shared.endpoints[replica];
        batch.debug_assert_unchanged();
        let result =
            match tokio::time::timeout(config.write_timeout, writer.write(endpoint, batch)).await {
                Ok(r) => r,
                Err(_) if planted::active(Bug::TimeoutIsSuccess) => Ok(()),
                Err(_) => Err(WriteError::ambiguous(format!(
                    "no answer within sink.write_timeout {:?}; the insert may have landed, \
                 the retry carries the same token",
                    config.write_timeout
                ))),
            };
        let err = match result {
            Ok(()) => {
                shared
                    .replicas
                    .lock()
                    .expect("replica set lock")
                    .success(replica);
                break Ok(());
            }
            Err(e) => e,
        };
        if err.kind == WriteErrorKind::AlreadyRunning {
            // The earlier attempt is alive on this replica: not a failure.
            waits = waits.saturating_add(1);
            let delay = backoff_delay(&config.retry, waits, rng.random::<f64>());
            shared.still_running(endpoint, batch, waits, delay, &err);
            let _backoff = shared.backing_off(delay);
            sleep(delay).await;
            again = Some(replica);
            continue;
        }
        waits = 0;
        shared
            .replicas
            .lock()
            .expect("replica set lock")
            .failure(replica, Instant::now());
        failures = failures.saturating_add(1);
        if err.kind == WriteErrorKind::Ambiguous {
            ambiguous += 1;
        }
        if err.is_fatal() {
            break Err(Abandon::Fatal(err));
        }
        if config.retry.max_attempts != 0 && failures >= config.retry.max_attempts {
            break Err(Abandon::Exhausted(err));
        }
        let delay = backoff_delay(&config.retry, failures, rng.random::<f64>());
        shared.retried(endpoint, batch, failures, delay, &err);
        let _backoff = shared.backing_off(delay);
        sleep(delay).await;
    };
    match outcome {
        Ok(()) => {
            shared.flushed(batch, ambiguous);
            // D1: delivered only after a replica acknowledged the insert.
            pending.acks.deliver();
        }
        Err(reason) => {
            shared.abandoned(batch, &reason, failures, ambiguous);
            // Dropping `pending` fails the acks (D1).
        }
    }
}
