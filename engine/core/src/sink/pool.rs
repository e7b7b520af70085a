//! The sink pool: per-shard bounded queues, one worker task per shard, probes
//! and the bounded drain (D5).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::metrics::ShardMetrics;
use crate::planted::{self, Bug};
use crate::sink::worker::{self, ShardShared};
use crate::sink::{
    Chunk, ConfigError, Endpoint, ReplicaSet, RunNonce, SinkConfig, WriteError, Writer,
};

/// How long past its deadline [`SinkPool::drain`] waits for a worker that
/// ignores the deadline before aborting it (D5: "grace about 1 s").
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Why a chunk was handed back by [`PoolHandle::try_send`]. The caller keeps
/// the chunk, pauses its lane and tries again later (D2).
#[derive(Debug)]
pub enum PushError {
    /// The shard's queue is full: backpressure.
    Full(Chunk),
    /// The pool is draining or gone: intake has stopped.
    Closed(Chunk),
}

impl PushError {
    /// The chunk that was not queued.
    pub fn into_chunk(self) -> Chunk {
        match self {
            PushError::Full(c) | PushError::Closed(c) => c,
        }
    }
}

/// The pipeline threads' side of the pool: a cheap, cloneable set of per-shard
/// queue senders. Never waits.
#[derive(Clone, Debug)]
pub struct PoolHandle {
    senders: Arc<[mpsc::Sender<Chunk>]>,
    shared: Arc<[Arc<ShardShared>]>,
}

impl PoolHandle {
    /// Number of shards (valid shard indexes are `0..shards()`).
    pub fn shards(&self) -> usize {
        self.senders.len()
    }

    /// Queues `chunk` for `shard` if its queue has room.
    ///
    /// # Errors
    /// [`PushError::Full`] when the queue is full, [`PushError::Closed`] when
    /// the pool is draining; both hand the chunk back. Panics if `shard` is out
    /// of range (the router's bug, not a runtime condition).
    pub fn try_send(&self, shard: usize, chunk: Chunk) -> Result<(), PushError> {
        let rows = chunk.rows();
        match self.senders[shard].try_send(chunk) {
            Ok(()) => {
                self.shared[shard]
                    .stats
                    .rows_enqueued
                    .fetch_add(rows, Ordering::Relaxed);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(c)) => Err(PushError::Full(c)),
            Err(mpsc::error::TrySendError::Closed(c)) => Err(PushError::Closed(c)),
        }
    }

    /// Records that a pipeline thread dropped `rows` rows bound for `shard`
    /// without queueing them (shutdown past its deadline, a closed pool): their
    /// acks failed, and the drain report counts them as abandoned (D6).
    pub(crate) fn note_dropped(&self, shard: usize, rows: u64) {
        self.shared[shard]
            .stats
            .rows_dropped
            .fetch_add(rows, Ordering::Relaxed);
    }

    /// Whether every shard has a replica whose circuit breaker is closed (or
    /// has cooled down) at `now`: what readiness reports once started. A
    /// shard whose every replica keeps failing makes this false until one
    /// cools down.
    pub fn reachable(&self, now: Instant) -> bool {
        self.shared.iter().all(|s| {
            let replicas = s.replicas.lock().expect("replica set lock");
            (0..s.endpoints.len()).any(|r| !replicas.is_open(r, now))
        })
    }

    /// Chunks waiting in `shard`'s queue.
    pub fn queue_depth(&self, shard: usize) -> usize {
        let tx = &self.senders[shard];
        tx.max_capacity() - tx.capacity()
    }
}

/// Counters a worker keeps for the drain report; atomics so a report can be
/// made even for a worker that had to be aborted.
#[derive(Debug, Default)]
pub(crate) struct ShardStats {
    pub(crate) rows_enqueued: AtomicU64,
    /// Rows for this shard a pipeline thread dropped before queueing them.
    pub(crate) rows_dropped: AtomicU64,
    pub(crate) batches_flushed: AtomicU64,
    pub(crate) rows_flushed: AtomicU64,
    pub(crate) bytes_flushed: AtomicU64,
    pub(crate) batches_abandoned: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) possible_duplicates: AtomicU64,
    /// Why the shard's first batch was abandoned (the run report's cause).
    /// Written once, off the hot path (an abandon is the end of a run).
    pub(crate) first_abandon: std::sync::Mutex<Option<String>>,
    pub(crate) possible_duplicate_rows: AtomicU64,
}

impl ShardStats {
    /// Keeps `cause` as the shard's abandon cause unless one is kept already.
    pub(crate) fn note_abandon(&self, cause: impl FnOnce() -> String) {
        let mut first = self
            .first_abandon
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if first.is_none() {
            *first = Some(cause());
        }
    }
}

/// One shard's totals over the pool's life, as reported by [`SinkPool::drain`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardReport {
    /// Shard index.
    pub shard: usize,
    /// Batches written and acknowledged.
    pub batches_flushed: u64,
    /// Rows written and acknowledged.
    pub rows_flushed: u64,
    /// Bytes written and acknowledged.
    pub bytes_flushed: u64,
    /// Batches given up on (their acks failed).
    pub batches_abandoned: u64,
    /// Rows bound for the shard and never acknowledged (their acks failed):
    /// queued and not written, or dropped by a pipeline thread before they
    /// could be queued.
    pub rows_abandoned: u64,
    /// Write attempts after the first.
    pub retries: u64,
    /// Extra copies of batches that may be in the table: for each batch, the
    /// attempts whose outcome is unknown (timed out, or the connection lost
    /// after sending). On a server that ignores the dedup token (plain
    /// MergeTree) an acknowledged batch with `k` of them may be stored up to
    /// `k + 1` times; an abandoned one up to `k` times.
    pub possible_duplicates: u64,
    /// The rows of those extra copies (each copy counts its batch's rows).
    pub possible_duplicate_rows: u64,
    /// Whether the worker ignored the deadline and was aborted after the grace.
    pub forced_abort: bool,
    /// Why the shard's first batch was abandoned: the last error of its
    /// write (the server's code and text, the endpoint, how many attempts),
    /// or the drain deadline. `None` when nothing was abandoned.
    pub first_abandon_cause: Option<String>,
}

/// What a drain found: per shard totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// One entry per shard, in shard order.
    pub shards: Vec<ShardReport>,
}

impl DrainReport {
    /// Batches flushed over all shards.
    pub fn batches_flushed(&self) -> u64 {
        self.shards.iter().map(|s| s.batches_flushed).sum()
    }

    /// Rows flushed over all shards.
    pub fn rows_flushed(&self) -> u64 {
        self.shards.iter().map(|s| s.rows_flushed).sum()
    }

    /// Batches abandoned over all shards.
    pub fn batches_abandoned(&self) -> u64 {
        self.shards.iter().map(|s| s.batches_abandoned).sum()
    }

    /// The first shard (in shard order) that abandoned a batch, with why
    /// ([`ShardReport::first_abandon_cause`]).
    pub fn first_abandon_cause(&self) -> Option<(usize, &str)> {
        self.shards
            .iter()
            .find_map(|s| Some((s.shard, s.first_abandon_cause.as_deref()?)))
    }

    /// Rows abandoned over all shards.
    pub fn rows_abandoned(&self) -> u64 {
        self.shards.iter().map(|s| s.rows_abandoned).sum()
    }

    /// Whether everything queued was written: no abandoned rows or batches and
    /// no forced abort.
    pub fn is_clean(&self) -> bool {
        self.shards
            .iter()
            .all(|s| s.batches_abandoned == 0 && s.rows_abandoned == 0 && !s.forced_abort)
    }
}

/// The result of probing one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    /// The endpoint probed.
    pub endpoint: Endpoint,
    /// `Ok` when it answered as expected.
    pub result: Result<(), WriteError>,
}

struct WorkerSlot {
    join: JoinHandle<()>,
    drain: Option<oneshot::Sender<Instant>>,
}

/// The sink pool: one worker task per shard on a tokio runtime.
pub struct SinkPool<W: Writer> {
    writer: Arc<W>,
    handle: PoolHandle,
    workers: Vec<WorkerSlot>,
    nonce: RunNonce,
}

impl<W: Writer> std::fmt::Debug for SinkPool<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkPool")
            .field("shards", &self.handle.shards())
            .field("nonce", &self.nonce)
            .finish()
    }
}

impl<W: Writer> SinkPool<W> {
    /// Validates `config`, registers metrics and spawns one worker per shard on
    /// `runtime`. Tokens carry `nonce` (use [`RunNonce::from_os`] in
    /// production; a fixed one in the simulator).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first invalid key. Warnings (see
    /// [`SinkConfig::validate`]) are logged.
    pub fn start(
        config: SinkConfig,
        writer: Arc<W>,
        nonce: RunNonce,
        runtime: &Handle,
    ) -> Result<Self, ConfigError> {
        for w in config.validate()? {
            tracing::warn!(key = w.key, "{}", w.message);
        }
        let config = Arc::new(config);
        let seed = config.seed.unwrap_or(nonce.value());
        let mut senders = Vec::with_capacity(config.shards.len());
        let mut shared = Vec::with_capacity(config.shards.len());
        let mut workers = Vec::with_capacity(config.shards.len());
        for (shard, urls) in config.shards.iter().enumerate() {
            let (tx, rx) = mpsc::channel(config.queue_chunks);
            let (drain_tx, drain_rx) = oneshot::channel();
            let endpoints = urls
                .iter()
                .enumerate()
                .map(|(replica, url)| Endpoint {
                    shard,
                    replica,
                    url: url.as_str().into(),
                })
                .collect();
            let s = Arc::new(ShardShared {
                shard,
                endpoints,
                replicas: Mutex::new(ReplicaSet::new(urls.len(), config.breaker.clone())),
                metrics: ShardMetrics::register(shard),
                stats: ShardStats::default(),
            });
            let join = runtime.spawn(worker::run(worker::WorkerArgs {
                shared: Arc::clone(&s),
                config: Arc::clone(&config),
                writer: Arc::clone(&writer),
                rx,
                drain: drain_rx,
                token_prefix: if planted::active(Bug::TokenWithoutNonce) {
                    format!("{}-{}-", config.pipeline, shard)
                } else if planted::active(Bug::TokenReusedAfterRestart) {
                    format!("{}-{}-{}-", config.pipeline, RunNonce::from_u64(0), shard)
                } else {
                    format!("{}-{}-{}-", config.pipeline, nonce, shard)
                },
                seed: shard_seed(seed, shard),
            }));
            senders.push(tx);
            shared.push(s);
            workers.push(WorkerSlot {
                join,
                drain: Some(drain_tx),
            });
        }
        Ok(Self {
            writer,
            handle: PoolHandle {
                senders: senders.into(),
                shared: shared.into(),
            },
            workers,
            nonce,
        })
    }

    /// A handle for pipeline threads to queue chunks.
    pub fn handle(&self) -> PoolHandle {
        self.handle.clone()
    }

    /// The run nonce in every token of this pool.
    pub fn nonce(&self) -> RunNonce {
        self.nonce
    }

    /// Probes every replica of every shard, in order, each bounded by
    /// `timeout`; a probe that does not answer in time is a retryable error.
    pub async fn probe(&self, timeout: Duration) -> Vec<ProbeReport> {
        let mut out = Vec::new();
        for shard in self.handle.shared.iter() {
            for endpoint in &shard.endpoints {
                let result = match tokio::time::timeout(timeout, self.writer.probe(endpoint)).await
                {
                    Ok(r) => r,
                    Err(_) => Err(WriteError::retryable(format!(
                        "probe of {endpoint} got no answer within {timeout:?}"
                    ))),
                };
                out.push(ProbeReport {
                    endpoint: endpoint.clone(),
                    result,
                });
            }
        }
        out
    }

    /// Stops intake, seals partial batches and lets writes run until
    /// `deadline`; then aborts what is left (its acks fail). A worker that has
    /// not returned by `deadline + DRAIN_GRACE` is aborted too. Always returns,
    /// by `deadline + DRAIN_GRACE` (D5), with the totals of the pool's life.
    pub async fn drain(mut self, deadline: Instant) -> DrainReport {
        for w in &mut self.workers {
            if let Some(tx) = w.drain.take() {
                // An error means the worker already ended (input closed).
                let _ = tx.send(deadline);
            }
        }
        let hard = deadline + DRAIN_GRACE;
        let mut forced = vec![false; self.workers.len()];
        for (i, w) in self.workers.iter_mut().enumerate() {
            match tokio::time::timeout_at(hard, &mut w.join).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(shard = i, error = %e, "sink worker ended abnormally; its batches' acks failed");
                }
                Err(_) => {
                    // D5: the worker ignored the deadline. Aborting drops its
                    // batches, whose ack sets fail on drop (D1).
                    w.join.abort();
                    forced[i] = true;
                    tracing::error!(
                        shard = i,
                        "sink worker did not stop by the drain deadline + grace; aborted"
                    );
                }
            }
        }
        DrainReport {
            shards: self
                .handle
                .shared
                .iter()
                .zip(forced)
                .map(|(s, forced_abort)| s.report(forced_abort))
                .collect(),
        }
    }
}

impl ShardShared {
    fn report(&self, forced_abort: bool) -> ShardReport {
        let st = &self.stats;
        let enqueued =
            st.rows_enqueued.load(Ordering::Relaxed) + st.rows_dropped.load(Ordering::Relaxed);
        let rows_flushed = st.rows_flushed.load(Ordering::Relaxed);
        ShardReport {
            shard: self.shard,
            batches_flushed: st.batches_flushed.load(Ordering::Relaxed),
            rows_flushed,
            bytes_flushed: st.bytes_flushed.load(Ordering::Relaxed),
            batches_abandoned: st.batches_abandoned.load(Ordering::Relaxed),
            rows_abandoned: enqueued.saturating_sub(rows_flushed),
            retries: st.retries.load(Ordering::Relaxed),
            possible_duplicates: st.possible_duplicates.load(Ordering::Relaxed),
            possible_duplicate_rows: st.possible_duplicate_rows.load(Ordering::Relaxed),
            forced_abort,
            first_abandon_cause: if forced_abort {
                Some("the worker ignored the drain deadline and was aborted".to_owned())
            } else {
                None
            }
            .or_else(|| {
                st.first_abandon
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            }),
        }
    }
}

/// A distinct, deterministic jitter seed per shard (D7).
fn shard_seed(seed: u64, shard: usize) -> u64 {
    seed ^ (shard as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
