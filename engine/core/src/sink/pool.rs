//! The sink pool: per-shard bounded queues, one worker task per shard, probes
//! and the bounded drain (D5).

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::planted::{self, Bug};
use crate::sink::events::{ShardReport, ShardShared};
use crate::sink::worker;
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
                self.shared[shard].enqueued(rows);
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
        self.shared[shard].dropped(rows);
    }

    /// Whether every shard has a replica whose circuit breaker is closed:
    /// what readiness reports once started. A breaker that reached its
    /// failure threshold counts as open until a write to it succeeds, its
    /// cooldown and half-open trial included
    /// ([`crate::sink::ReplicaSet::is_tripped`]), so a shard whose every
    /// replica keeps failing reads as unreachable steadily (it used to read
    /// reachable for each moment between a cooldown's end and the trial's
    /// failure, and `/readyz` flapped).
    pub fn reachable(&self) -> bool {
        self.shared.iter().all(|s| s.healthy())
    }

    /// Why [`PoolHandle::reachable`] is false: one entry per unhealthy
    /// shard, naming the shard and each replica's last error (e.g. `shard 1:
    /// every replica's breaker open (r0 http://..: connection refused)`).
    /// Empty when reachable. Formats strings: not for a hot path.
    pub fn unreachable_reasons(&self) -> Vec<String> {
        self.shared
            .iter()
            .filter_map(|s| s.unhealthy_reason())
            .collect()
    }

    /// Chunks waiting in `shard`'s queue.
    pub fn queue_depth(&self, shard: usize) -> usize {
        let tx = &self.senders[shard];
        tx.max_capacity() - tx.capacity()
    }
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
    /// The background prober of tripped breakers
    /// ([`SinkConfig::probe_tripped`]), aborted at the drain.
    prober: Option<JoinHandle<()>>,
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
            let s = Arc::new(ShardShared::new(
                shard,
                endpoints,
                ReplicaSet::new(urls.len(), config.breaker.clone()),
            ));
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
            let prober = config.probe_tripped.then(|| {
                runtime.spawn(worker::probe_tripped(
                    Arc::clone(&s),
                    Arc::clone(&writer),
                    Arc::clone(&config),
                ))
            });
            senders.push(tx);
            shared.push(s);
            workers.push(WorkerSlot {
                join,
                drain: Some(drain_tx),
                prober,
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
            if let Some(p) = w.prober.take() {
                p.abort();
            }
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

/// A distinct, deterministic jitter seed per shard (D7).
fn shard_seed(seed: u64, shard: usize) -> u64 {
    seed ^ (shard as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
