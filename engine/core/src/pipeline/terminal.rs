//! The terminal stage: encode each record into the open chunk of the shard the
//! router picks; seal chunks at a target size; take budget and `try_send` them
//! to the shard queue, keeping what does not fit as pending (D2, D8).
//!
//! [`ChunkBuffers`] is the per-thread state (one open chunk per shard and a
//! FIFO of sealed chunks waiting for budget or queue room); [`Terminal`] is the
//! stage that feeds it. Open and pending chunks hold their rows' acks in an
//! [`AckSet`], so dropping them (a crash of the thread, a shutdown past its
//! deadline) fails those acks (D1).
//!
//! Memory bound (D8): in flight <= the budget; per thread, besides that, at
//! most one open chunk per shard plus the encoded rows of the poll batches
//! processed since the thread's lanes were paused (a paused lane yields at
//! most what was already fetched). In `delivery: effectively_once` the open
//! chunks are per lane range formers instead (`pipeline::eo`): one open
//! range per lane, which takes budget every `pipeline.chunk_bytes` as it
//! grows (pausing its lane when refused), so what is unpaid per lane is at
//! most about one chunk (docs/adr/0004-effectively-once.md).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use crate::ack::AckSet;
use crate::budget::{Budget, BudgetPermit};
use crate::pipeline::chain::{Encoder, RecordCx, RecordError, Router, Stage};
use crate::pipeline::eo::{EoConfig, Former, FormerFlush, LanePlan};
use crate::record::{Epoch, Offset, TopicPartition};
use crate::sink::{Chunk, Layout, PoolHandle, PushError};

/// Sizes at which the terminal stage seals a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkConfig {
    /// Seal a shard's open chunk once it holds this many bytes
    /// (`pipeline.chunk_bytes`, > 0).
    pub max_bytes: usize,
    /// Seal once it holds this many rows (`pipeline.chunk_rows`, > 0).
    pub max_rows: u64,
    /// Seal an open chunk this long after its first row even if it is small
    /// (`pipeline.chunk_linger`), so a quiet partition's rows still move.
    pub linger: std::time::Duration,
}

impl Default for ChunkConfig {
    /// 256 KiB or 8,192 rows, 50 ms: big enough to amortise the queue hand-off,
    /// small enough to keep per-thread memory low.
    fn default() -> Self {
        Self {
            max_bytes: 256 << 10,
            max_rows: 8_192,
            linger: std::time::Duration::from_millis(50),
        }
    }
}

struct OpenChunk {
    buf: Vec<u8>,
    rows: u64,
    acks: AckSet,
    opened_at: Option<Instant>,
}

struct Pending {
    shard: usize,
    data: Bytes,
    rows: u64,
    acks: AckSet,
    permit: Option<BudgetPermit>,
    layout: Layout,
}

/// What [`ChunkBuffers::flush`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// Nothing is pending.
    Clear,
    /// `delivery: effectively_once`: sealed ranges wait for the commit that
    /// records them (D9); not backpressure, lanes keep reading.
    Waiting,
    /// Chunks are pending: the budget or a shard queue is full. Pause lanes.
    Blocked,
}

/// Per-thread chunk state: open chunks per shard and the pending FIFO.
pub struct ChunkBuffers {
    /// `delivery: effectively_once`: one range former per lane (D9).
    eo: Option<EoBuffers>,
    open: Vec<OpenChunk>,
    pending: VecDeque<Pending>,
    budget: Arc<Budget>,
    pool: PoolHandle,
    config: ChunkConfig,
    rows_encoded: u64,
    /// Rows an encoder appended and then refused ([`Encoder::keep`]).
    rows_filtered: u64,
    chunks_dropped: u64,
    /// The layout the open chunks' rows follow ([`ChunkBuffers::set_layout`]).
    layout: Layout,
}

impl std::fmt::Debug for ChunkBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkBuffers")
            .field("shards", &self.open.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl ChunkBuffers {
    /// Buffers for `pool`'s shards, taking budget from `budget`.
    pub fn new(pool: PoolHandle, budget: Arc<Budget>, config: ChunkConfig) -> Self {
        let open = (0..pool.shards())
            .map(|_| OpenChunk {
                buf: Vec::with_capacity(config.max_bytes),
                rows: 0,
                acks: AckSet::new(),
                opened_at: None,
            })
            .collect();
        Self {
            eo: None,
            open,
            pending: VecDeque::new(),
            budget,
            pool,
            config,
            rows_encoded: 0,
            rows_filtered: 0,
            chunks_dropped: 0,
            layout: 0,
        }
    }

    /// Rows appended from now on follow `layout`: when it is another than
    /// the open chunks', they are sealed first, so a chunk never mixes two
    /// layouts (the shard worker keeps them apart in batches too). Called
    /// at a poll-batch boundary ([`Stage::begin_poll_batch`]).
    pub fn set_layout(&mut self, layout: Layout) {
        if layout != self.layout {
            self.seal_all();
            debug_assert!(!self.has_open_rows(), "sealed before the layout changes");
            self.layout = layout;
        }
    }

    /// The layout of the rows appended now.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Switches these buffers to `delivery: effectively_once`: rows go to
    /// per-lane range formers instead of the shared per-shard chunks.
    pub(crate) fn set_effectively_once(&mut self, mut config: EoConfig) {
        config.pay_every = self.config.max_bytes as u64;
        self.eo = Some(EoBuffers {
            config,
            formers: Vec::new(),
            current: usize::MAX,
        });
    }

    /// Whether these buffers form ranges (`delivery: effectively_once`).
    pub(crate) fn is_effectively_once(&self) -> bool {
        self.eo.is_some()
    }

    /// A new lane's range former.
    pub(crate) fn eo_assign(&mut self, partition: TopicPartition, epoch: Epoch, plan: LanePlan) {
        let eo = self.eo.as_mut().expect("effectively_once buffers");
        eo.formers.push(Former::new(partition, epoch, plan));
    }

    fn eo_index(&self, partition: &TopicPartition, epoch: Epoch) -> Option<usize> {
        self.eo
            .as_ref()?
            .formers
            .iter()
            .position(|f| &f.partition == partition && f.epoch == epoch)
    }

    /// Picks the former of the lane whose poll batch comes next.
    pub(crate) fn eo_select(&mut self, partition: &TopicPartition, epoch: Epoch) {
        let i = self
            .eo_index(partition, epoch)
            .expect("every effectively_once lane has a former");
        self.eo.as_mut().expect("checked").current = i;
    }

    /// Before the payload at `offset` of the selected lane.
    #[inline]
    pub(crate) fn eo_before(&mut self, offset: Offset) {
        let shards = self.open.len();
        let eo = self.eo.as_mut().expect("effectively_once buffers");
        eo.formers[eo.current].before(offset, shards, &eo.config);
    }

    /// After the payload at `offset` of the selected lane.
    #[inline]
    pub(crate) fn eo_after(&mut self, offset: Offset) {
        let eo = self.eo.as_mut().expect("effectively_once buffers");
        eo.formers[eo.current].after(offset, &eo.config, &self.budget);
    }

    /// Whether the lane's pending range list is full (pause it, D2).
    pub(crate) fn eo_full(&self, partition: &TopicPartition, epoch: Epoch) -> bool {
        self.eo_index(partition, epoch)
            .is_some_and(|i| self.eo.as_ref().expect("indexed").formers[i].is_full())
    }

    /// Whether the lane holds rows of a replayed range not yet complete
    /// (its bounds are fixed: it cannot be sealed short, D9).
    pub(crate) fn eo_replaying(&self, partition: &TopicPartition, epoch: Epoch) -> bool {
        self.eo_index(partition, epoch)
            .is_some_and(|i| self.eo.as_ref().expect("indexed").formers[i].replaying())
    }

    /// Whether any lane holds rows of a replayed range not yet complete.
    pub(crate) fn eo_any_replaying(&self) -> bool {
        self.eo
            .as_ref()
            .is_some_and(|eo| eo.formers.iter().any(|f| !f.is_closed() && f.replaying()))
    }

    /// The lane was revoked: its open free range seals (a replayed range
    /// left incomplete stays held until the epoch is released).
    pub(crate) fn eo_revoke(&mut self, partition: &TopicPartition, epoch: Epoch) {
        if let Some(i) = self.eo_index(partition, epoch) {
            let eo = self.eo.as_mut().expect("indexed");
            eo.formers[i].seal_for_revoke(&eo.config);
        }
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.open.len()
    }

    /// Rows encoded so far (monotonic).
    pub fn rows_encoded(&self) -> u64 {
        self.rows_encoded
    }

    /// Rows dropped by the encoder's filter so far (monotonic;
    /// [`Encoder::keep`]). Not in [`ChunkBuffers::rows_encoded`].
    pub fn rows_filtered(&self) -> u64 {
        self.rows_filtered
    }

    /// Sealed chunks waiting for budget or queue room.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Chunks dropped because the pool had closed (shutdown); their acks failed.
    pub fn chunks_dropped(&self) -> u64 {
        self.chunks_dropped
    }

    /// Appends one row to `shard`'s open chunk with `encode`; truncates what a
    /// failed encode appended. Seals the chunk when it reaches its size.
    ///
    /// # Errors
    /// Whatever `encode` returned.
    #[inline]
    pub fn append(
        &mut self,
        shard: usize,
        cx: &RecordCx<'_>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), RecordError>,
    ) -> Result<(), RecordError> {
        self.append_kept(shard, cx, |buf| encode(buf).map(|()| true))
    }

    /// [`ChunkBuffers::append`] with a row that may be refused after it was
    /// encoded: `encode` returns `Ok(false)` to drop the row it appended
    /// (truncated here, counted in [`ChunkBuffers::rows_filtered`]; its ack
    /// is not added, so the message resolves as filtered).
    ///
    /// # Errors
    /// Whatever `encode` returned.
    #[inline]
    pub fn append_kept(
        &mut self,
        shard: usize,
        cx: &RecordCx<'_>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<bool, RecordError>,
    ) -> Result<(), RecordError> {
        if let Some(eo) = &mut self.eo {
            if eo.formers[eo.current].append(shard, cx.ack, encode)? {
                self.rows_encoded += 1;
            } else {
                self.rows_filtered += 1;
            }
            return Ok(());
        }
        let oc = &mut self.open[shard];
        let start = oc.buf.len();
        match encode(&mut oc.buf) {
            Ok(true) => {}
            Ok(false) => {
                oc.buf.truncate(start);
                self.rows_filtered += 1;
                return Ok(());
            }
            Err(e) => {
                oc.buf.truncate(start);
                return Err(e);
            }
        }
        debug_assert!(oc.buf.len() > start, "an encoder appended an empty row");
        if oc.rows == 0 {
            oc.opened_at = Some(Instant::now());
        }
        oc.rows += 1;
        oc.acks.push(cx.ack);
        self.rows_encoded += 1;
        if oc.buf.len() >= self.config.max_bytes || oc.rows >= self.config.max_rows {
            self.seal(shard);
        }
        Ok(())
    }

    /// Moves `shard`'s open chunk (if any rows) to the pending FIFO.
    fn seal(&mut self, shard: usize) {
        let cap = self.config.max_bytes;
        let oc = &mut self.open[shard];
        if oc.rows == 0 {
            return;
        }
        let buf = std::mem::replace(&mut oc.buf, Vec::with_capacity(cap));
        self.pending.push_back(Pending {
            shard,
            data: Bytes::from(buf),
            rows: std::mem::take(&mut oc.rows),
            acks: std::mem::take(&mut oc.acks),
            permit: None,
            layout: self.layout,
        });
        oc.opened_at = None;
    }

    /// Seals every open chunk.
    pub fn seal_all(&mut self) {
        for shard in 0..self.open.len() {
            self.seal(shard);
        }
        if let Some(eo) = &mut self.eo {
            let now = Instant::now();
            for f in &mut eo.formers {
                f.seal_free(now, true, &eo.config);
            }
        }
    }

    /// Seals open chunks whose first row is older than the chunk linger.
    pub fn seal_lingering(&mut self, now: Instant) {
        for shard in 0..self.open.len() {
            if self.open[shard]
                .opened_at
                .is_some_and(|t| now.duration_since(t) >= self.config.linger)
            {
                self.seal(shard);
            }
        }
        if let Some(eo) = &mut self.eo {
            for f in &mut eo.formers {
                f.seal_free(now, false, &eo.config);
            }
        }
    }

    /// Whether any open chunk holds rows.
    pub fn has_open_rows(&self) -> bool {
        self.open.iter().any(|o| o.rows > 0)
    }

    /// Hands pending chunks to their shard queues, in order, until one does not
    /// fit (budget or queue full). Never waits (D2).
    pub fn flush(&mut self) -> Flush {
        if let Some(eo) = &mut self.eo {
            // Every former is flushed, even past one that is blocked: a
            // former waiting for budget must not keep the others from
            // handing over parts they already paid for, which is what
            // frees that budget (a lane set deadlocked on it when the
            // first former's refusal returned early: fixed seed 12641 of
            // the effectively_once campaign, liveness).
            let mut result = Flush::Clear;
            for f in &mut eo.formers {
                match f.flush(&self.pool, &self.budget) {
                    FormerFlush::Clear => {}
                    FormerFlush::Waiting if result == Flush::Clear => result = Flush::Waiting,
                    FormerFlush::Waiting => {}
                    FormerFlush::Blocked => result = Flush::Blocked,
                }
            }
            if eo.formers.iter().any(Former::is_closed) {
                eo.formers.retain(|f| !f.is_closed());
                eo.current = usize::MAX;
            }
            return result;
        }
        while let Some(mut p) = self.pending.pop_front() {
            if p.permit.is_none() {
                match Budget::try_acquire(&self.budget, p.data.len() as u64, p.rows) {
                    Some(permit) => p.permit = Some(permit),
                    None => {
                        self.pending.push_front(p);
                        return Flush::Blocked;
                    }
                }
            }
            let permit = p.permit.take().expect("acquired above");
            let chunk = Chunk::new(p.data, p.rows, p.acks, permit).with_layout(p.layout);
            match self.pool.try_send(p.shard, chunk) {
                Ok(()) => {}
                Err(PushError::Full(chunk)) => {
                    let (data, rows, acks, permit, layout) = chunk.into_parts();
                    self.pending.push_front(Pending {
                        shard: p.shard,
                        data,
                        rows,
                        acks,
                        permit: Some(permit),
                        layout,
                    });
                    return Flush::Blocked;
                }
                Err(PushError::Closed(chunk)) => {
                    // The pool is draining: nothing can take this chunk any
                    // more. Dropping it fails its acks (D1), so it replays.
                    self.chunks_dropped += 1;
                    self.pool.note_dropped(p.shard, chunk.rows());
                    tracing::warn!(
                        shard = p.shard,
                        rows = chunk.rows(),
                        "sink pool closed; chunk dropped, its acks fail and its data will replay"
                    );
                }
            }
        }
        Flush::Clear
    }
}

impl Drop for ChunkBuffers {
    /// Rows still open or pending when the buffers go (shutdown past its
    /// deadline, a dying thread) fail their acks as their [`AckSet`]s drop
    /// (D1); count them as abandoned by their shard so the run report shows
    /// them (D6).
    fn drop(&mut self) {
        if let Some(eo) = &self.eo {
            for f in &eo.formers {
                f.note_dropped(&self.pool);
            }
        }
        for p in &self.pending {
            self.pool.note_dropped(p.shard, p.rows);
        }
        for (shard, o) in self.open.iter().enumerate() {
            if o.rows > 0 {
                self.pool.note_dropped(shard, o.rows);
            }
        }
    }
}

/// The range formers of `delivery: effectively_once` (D9).
struct EoBuffers {
    config: EoConfig,
    formers: Vec<Former>,
    /// The former of the poll batch being processed.
    current: usize,
}

/// Lets the lane driver reach the [`ChunkBuffers`] at the end of a chain of
/// operator stages.
pub trait Tail {
    /// The terminal stage's buffers.
    fn buffers(&mut self) -> &mut ChunkBuffers;
}

/// The terminal stage: route, encode, append.
pub struct Terminal<E, R> {
    encoder: E,
    router: R,
    buffers: ChunkBuffers,
}

impl<E, R> Terminal<E, R> {
    /// A terminal stage encoding with `encoder` and routing with `router` into
    /// `buffers`.
    pub fn new(encoder: E, router: R, buffers: ChunkBuffers) -> Self {
        Self {
            encoder,
            router,
            buffers,
        }
    }
}

impl<T, E: Encoder<T>, R: Router<T>> Stage<T> for Terminal<E, R> {
    #[inline]
    fn push(&mut self, record: T, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        let shard = self.router.try_route(&record, cx, self.buffers.shards())?;
        debug_assert!(
            shard < self.buffers.shards(),
            "router picked shard {shard} out of range"
        );
        let encoder = &mut self.encoder;
        self.buffers.append_kept(shard, cx, |buf| {
            let start = buf.len();
            encoder.encode(&record, cx, buf)?;
            Ok(encoder.keep(&buf[start..]))
        })
    }

    #[inline]
    fn begin_poll_batch(&mut self) {
        if let Some(layout) = self.encoder.replan() {
            self.buffers.set_layout(layout);
        }
    }
}

impl<E, R> Tail for Terminal<E, R> {
    fn buffers(&mut self) -> &mut ChunkBuffers {
        &mut self.buffers
    }
}

impl<F, N: Tail> Tail for crate::pipeline::chain::Filter<F, N> {
    fn buffers(&mut self) -> &mut ChunkBuffers {
        self.next_mut().buffers()
    }
}

impl<F, N: Tail> Tail for crate::pipeline::chain::Map<F, N> {
    fn buffers(&mut self) -> &mut ChunkBuffers {
        self.next_mut().buffers()
    }
}

impl<F, N: Tail> Tail for crate::pipeline::chain::FlatMap<F, N> {
    fn buffers(&mut self) -> &mut ChunkBuffers {
        self.next_mut().buffers()
    }
}

impl<F, N: Tail> Tail for crate::pipeline::chain::TryMap<F, N> {
    fn buffers(&mut self) -> &mut ChunkBuffers {
        self.next_mut().buffers()
    }
}
