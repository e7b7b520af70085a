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
use std::time::Duration;

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
    Chunk, Endpoint, Pick, SealedBatch, SinkConfig, WriteError, WriteErrorKind, Writer,
    backoff_delay,
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
    /// The layout of every chunk in it (one per batch).
    layout: crate::sink::Layout,
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
    let mut batches = Batches::new(token_prefix);
    let mut inflight: JoinSet<()> = JoinSet::new();
    loop {
        spawn_writes(
            &mut batches,
            &mut inflight,
            &writer,
            &shared,
            &config,
            &mut rng,
        );
        if input_closed && batches.is_empty() && inflight.is_empty() {
            break;
        }
        shared.queue_depth(rx.len());
        let linger_at = batches.linger_at(&config);
        // Read the queue only while no sealed batch waits for a write slot:
        // that is what turns a slow shard into backpressure (D2, D8).
        let accept = !input_closed && batches.sealed.is_empty();
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
                abandon_at_deadline(&shared, &mut batches.open, &mut batches.sealed, &mut inflight).await;
                return;
            }
            Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                if let Err(e) = joined {
                    // A panicking write task dropped its acks: they failed (D1).
                    shared.write_task_failed(&e);
                }
            }
            msg = rx.recv(), if accept => match msg {
                Some(chunk) => batches.take(shared.shard, chunk, &config),
                None => {
                    input_closed = true;
                    batches.close(shared.shard);
                }
            },
            () = async { sleep_until(linger_at.expect("guarded")).await }, if linger_at.is_some() => {
                batches.seal(shared.shard, None);
            }
        }
    }
}

/// The background prober of one shard ([`SinkConfig::probe_tripped`]):
/// every `breaker.cooldown`, each replica whose breaker tripped gets one
/// probe (the writer's cheap query, bounded by the cooldown or
/// `write_timeout`, whichever is shorter); an answer closes its breaker
/// (gauge and readiness follow), a failure re-arms its cooldown and keeps
/// the error for `/readyz`. Probes nothing while every breaker is closed.
/// Time from tokio's clock (D7).
pub(crate) async fn probe_tripped<W: Writer>(
    shared: Arc<ShardShared>,
    writer: Arc<W>,
    config: Arc<SinkConfig>,
) {
    let every = config.breaker.cooldown.max(Duration::from_millis(10));
    let bound = every.min(config.write_timeout);
    loop {
        sleep(every).await;
        for replica in shared.tripped_replicas() {
            let endpoint = &shared.endpoints[replica];
            let result = match tokio::time::timeout(bound, writer.probe(endpoint)).await {
                Ok(r) => r,
                Err(_) => Err(WriteError::retryable(format!(
                    "background probe of {endpoint} got no answer within {bound:?}"
                ))),
            };
            match result {
                Ok(()) => {
                    tracing::info!(%endpoint, "background probe answered; breaker closed");
                    shared.replica_succeeded(replica);
                }
                Err(e) => {
                    tracing::debug!(%endpoint, error = %e, "background probe failed; breaker stays open");
                    shared.replica_failed(replica, Instant::now(), &e);
                }
            }
        }
    }
}

/// Starts a write task per sealed batch while fewer than `max_inflight`
/// run, each with its own seed from the shard's RNG (D7).
fn spawn_writes<W: Writer>(
    batches: &mut Batches,
    inflight: &mut JoinSet<()>,
    writer: &Arc<W>,
    shared: &Arc<ShardShared>,
    config: &Arc<SinkConfig>,
    rng: &mut SmallRng,
) {
    while inflight.len() < config.max_inflight {
        let Some(p) = batches.sealed.pop_front() else {
            break;
        };
        inflight.spawn(write_batch(
            Arc::clone(writer),
            Arc::clone(shared),
            Arc::clone(config),
            p,
            rng.next_u64(),
        ));
    }
}

/// A shard's batches not yet written: the one being filled and the sealed
/// ones waiting for a write slot, and the numbering their tokens take (D4).
struct Batches {
    /// `{pipeline}-{run nonce}-{shard}-`: a batch's token is this and its
    /// sequence number.
    token_prefix: String,
    next_seq: u64,
    open: Option<OpenBatch>,
    sealed: VecDeque<PendingBatch>,
}

impl Batches {
    fn new(token_prefix: String) -> Self {
        Self {
            token_prefix,
            next_seq: 0,
            open: None,
            sealed: VecDeque::new(),
        }
    }

    /// When the open batch's linger ends, if one is open.
    fn linger_at(&self, config: &SinkConfig) -> Option<Instant> {
        self.open
            .as_ref()
            .map(|b| b.opened_at + config.batch.linger)
    }

    /// Whether no batch is open or waits for a write slot.
    fn is_empty(&self) -> bool {
        self.open.is_none() && self.sealed.is_empty()
    }

    /// Adds a chunk from the queue: a range part (effectively_once) is a
    /// batch of its own, written as it is with its range token (D9); any
    /// other chunk joins the open batch, which seals before the chunk would
    /// pass its size (or change its layout) and once it is full.
    fn take(&mut self, shard: usize, mut chunk: Chunk, config: &SinkConfig) {
        if chunk.token.is_some() {
            self.seal(shard, None);
            let token = chunk.token.take();
            add(&mut self.open, chunk);
            self.seal(shard, token);
            return;
        }
        if self
            .open
            .as_ref()
            .is_some_and(|b| would_overflow(b, &chunk, config))
        {
            self.seal(shard, None);
        }
        add(&mut self.open, chunk);
        if self.open.as_ref().is_some_and(|b| is_full(b, config)) {
            self.seal(shard, None);
        }
    }

    /// The queue closed (drain): seals what is open.
    fn close(&mut self, shard: usize) {
        if planted::active(Bug::DrainDropsPartialBatch) {
            self.open = None;
        }
        self.seal(shard, None);
    }

    /// Seals the open batch, if any, with `range` (the token of a range
    /// part, effectively_once) or else the run's `{prefix}{seq}` (D4).
    fn seal(&mut self, shard: usize, range: Option<String>) {
        let Some(b) = self.open.take() else {
            return;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        debug_assert!(
            range
                .as_deref()
                .is_none_or(|t| !t.starts_with(&self.token_prefix)),
            "D9: range part {seq} of shard {shard} carries a run token"
        );
        let token = range.unwrap_or_else(|| format!("{}{seq}", self.token_prefix));
        debug_assert!(
            token.ends_with(&format!("-{seq}")) || !token.starts_with(&self.token_prefix),
            "D4: batch {seq} of shard {shard} has token {token}, not one ending in its number"
        );
        let batch = SealedBatch::new(shard, seq, token, b.segments, b.rows, &b.acks, b.layout);
        debug_assert_eq!(
            batch.bytes(),
            b.bytes,
            "D4: batch {seq} of shard {shard} sealed other bytes than it was filled with"
        );
        let acks = if planted::active(Bug::CommitBeforeAck) {
            b.acks.deliver();
            AckSet::new()
        } else {
            b.acks
        };
        self.sealed.push_back(PendingBatch {
            batch: Arc::new(batch),
            acks,
            _permit: b.permit,
        });
    }
}

fn add(open: &mut Option<OpenBatch>, chunk: Chunk) {
    let (data, rows, acks, permit, layout) = chunk.into_parts();
    match open {
        Some(b) => {
            debug_assert_eq!(b.layout, layout, "one layout per batch");
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
                layout,
            });
        }
    }
}

/// Whether `chunk` cannot join `b`: it would pass the batch's size, or its
/// rows follow another layout (a batch is one layout, written under one
/// INSERT plan).
fn would_overflow(b: &OpenBatch, chunk: &Chunk, config: &SinkConfig) -> bool {
    b.layout != chunk.layout()
        || b.rows + chunk.rows() > config.batch.max_rows
        || b.bytes + chunk.len() > config.batch.max_bytes
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

/// Re-seals a batch at most this many times (each after the table changed
/// again under the batch's layout): a bound on the write loop, far above
/// the schema changes a batch can meet while it is written.
const MAX_RESEALS: u32 = 8;

/// Writes one sealed batch, retrying the same bytes and token on the next
/// healthy replica with backoff, until it is acknowledged, fails fatally or
/// runs out of attempts. Owns the batch's acks: delivered only on success.
///
/// An answer [`WriteErrorKind::AlreadyRunning`] (the replica still runs an
/// earlier attempt of this batch under the same query id) is waited out: the
/// same replica is asked again after a backoff, without counting a failure
/// or touching its breaker. An answer [`WriteErrorKind::Replanned`] (the
/// table changed under the batch's layout; nothing was stored) swaps the
/// batch for the writer's re-seal of it ([`Writer::reseal`]), which every
/// later attempt sends unchanged (D4); a re-seal the writer refuses is
/// fatal.
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
    let _inflight = shared.write_in_flight();
    let started = Instant::now();
    let mut attempts = Attempts::new(seed);
    let mut batch = Arc::clone(&pending.batch);
    let outcome = loop {
        let replica = attempts.replica(&shared).await;
        let endpoint = &shared.endpoints[replica];
        batch.debug_assert_unchanged();
        let err = match attempt(&*writer, endpoint, &batch, &config).await {
            Ok(()) => {
                shared.replica_succeeded(replica);
                break Ok(());
            }
            Err(e) => e,
        };
        match err.kind {
            WriteErrorKind::AlreadyRunning => {
                attempts
                    .wait_running(&shared, &config, &batch, &err, replica)
                    .await;
            }
            WriteErrorKind::Replanned => {
                match reseal(&*writer, &shared, &batch, &mut attempts, &err) {
                    Ok(next) => batch = Arc::new(next),
                    Err(e) => break Err(Abandon::Fatal(e)),
                }
            }
            _ => {
                if let Some(abandon) = attempts
                    .failed(&shared, &config, &batch, err, replica)
                    .await
                {
                    break Err(abandon);
                }
            }
        }
    };
    match outcome {
        Ok(()) => {
            let oldest = pending.acks.oldest_timestamp_ms();
            shared.flushed(&batch, attempts.ambiguous, started, oldest);
            // D1: delivered only after a replica acknowledged the insert.
            pending.acks.deliver();
        }
        Err(reason) => {
            shared.abandoned(&batch, &reason, attempts.failures, attempts.ambiguous);
            // Dropping `pending` fails the acks (D1).
        }
    }
}

/// One attempt of `batch` on `endpoint`, bounded by `sink.write_timeout`
/// (no answer in time is ambiguous: it may have landed).
async fn attempt<W: Writer>(
    writer: &W,
    endpoint: &Endpoint,
    batch: &SealedBatch,
    config: &SinkConfig,
) -> Result<(), WriteError> {
    match tokio::time::timeout(config.write_timeout, writer.write(endpoint, batch)).await {
        Ok(r) => r,
        Err(_) if planted::active(Bug::TimeoutIsSuccess) => Ok(()),
        Err(_) => Err(WriteError::ambiguous(format!(
            "no answer within sink.write_timeout {:?}; the insert may have landed, \
             the retry carries the same token",
            config.write_timeout
        ))),
    }
}

/// The writer's re-seal of `batch` after it answered `replanned`, bounded by
/// [`MAX_RESEALS`].
fn reseal<W: Writer>(
    writer: &W,
    shared: &ShardShared,
    batch: &SealedBatch,
    attempts: &mut Attempts,
    replanned: &WriteError,
) -> Result<SealedBatch, WriteError> {
    attempts.reseals += 1;
    if attempts.reseals > MAX_RESEALS {
        return Err(WriteError::fatal(format!(
            "batch {} re-sealed {MAX_RESEALS} times and the table changed again: {}",
            batch.token(),
            replanned.message
        )));
    }
    let next = writer.reseal(batch)?;
    debug_assert_eq!(next.token(), batch.token(), "a re-seal keeps the token");
    debug_assert_eq!(next.rows(), batch.rows(), "a re-seal keeps every row");
    debug_assert_ne!(
        next.layout(),
        batch.layout(),
        "a re-seal changes the layout"
    );
    shared.resealed(batch, &next, replanned);
    Ok(next)
}

/// The retry state of one batch's write: failures, ambiguous attempts, the
/// "still running" waits and the replica they pin, re-seals, and the seeded
/// RNG for backoff jitter (D7).
struct Attempts {
    rng: SmallRng,
    failures: u32,
    /// Attempts that timed out or lost the connection after sending: each
    /// may have landed.
    ambiguous: u64,
    /// Consecutive "still running" answers, for the wait's backoff.
    waits: u32,
    /// The replica that answered "still running", asked again next.
    again: Option<usize>,
    reseals: u32,
}

impl Attempts {
    fn new(seed: u64) -> Self {
        Self {
            rng: SmallRng::seed_from_u64(seed),
            failures: 0,
            ambiguous: 0,
            waits: 0,
            again: None,
            reseals: 0,
        }
    }

    /// The replica for the next attempt: the one pinned by a "still
    /// running" answer, else the replica set's pick (waiting while every
    /// breaker is open).
    async fn replica(&mut self, shared: &ShardShared) -> usize {
        if let Some(r) = self.again.take() {
            return r;
        }
        loop {
            let pick = shared
                .replicas
                .lock()
                .expect("replica set lock")
                .pick(Instant::now());
            match pick {
                Pick::Replica(r) => return r,
                Pick::WaitUntil(t) => sleep_until(t).await,
            }
        }
    }

    /// The replica still runs an earlier attempt: back off and ask it again
    /// (not a failure).
    async fn wait_running(
        &mut self,
        shared: &ShardShared,
        config: &SinkConfig,
        batch: &SealedBatch,
        err: &WriteError,
        replica: usize,
    ) {
        self.waits = self.waits.saturating_add(1);
        let delay = backoff_delay(&config.retry, self.waits, self.rng.random::<f64>());
        shared.still_running(&shared.endpoints[replica], batch, self.waits, delay, err);
        let _backoff = shared.backing_off(delay);
        sleep(delay).await;
        self.again = Some(replica);
    }

    /// A failed attempt: counts it against the replica's breaker and
    /// `retry.max_attempts`; `Some` when the batch is given up on, else
    /// after the backoff the next attempt may go.
    async fn failed(
        &mut self,
        shared: &ShardShared,
        config: &SinkConfig,
        batch: &SealedBatch,
        err: WriteError,
        replica: usize,
    ) -> Option<Abandon> {
        self.waits = 0;
        shared.replica_failed(replica, Instant::now(), &err);
        self.failures = self.failures.saturating_add(1);
        if err.kind == WriteErrorKind::Ambiguous {
            self.ambiguous += 1;
        }
        if err.is_fatal() {
            return Some(Abandon::Fatal(err));
        }
        if config.retry.max_attempts != 0 && self.failures >= config.retry.max_attempts {
            return Some(Abandon::Exhausted(err));
        }
        let delay = backoff_delay(&config.retry, self.failures, self.rng.random::<f64>());
        shared.retried(
            &shared.endpoints[replica],
            batch,
            self.failures,
            delay,
            &err,
        );
        let _backoff = shared.backing_off(delay);
        sleep(delay).await;
        None
    }
}
