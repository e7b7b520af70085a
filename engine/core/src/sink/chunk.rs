//! Chunks (what a pipeline thread hands a shard) and sealed batches (what a
//! shard worker writes).
//!
//! A [`Chunk`] is encoded rows for one shard plus the acks of the poll batches
//! they came from and their share of the in-flight budget. A worker merges
//! chunks into an open batch and seals it: the encoded segments and the dedup
//! token go into an immutable [`SealedBatch`] shared by every retry (D4: same
//! bytes, same token); acks and budget stay with the write task and settle
//! when it ends.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::ack::AckSet;
use crate::budget::BudgetPermit;
use crate::record::{Epoch, Offset, TopicPartition};

/// Encoded rows bound for one shard.
#[derive(Debug)]
pub struct Chunk {
    data: Bytes,
    rows: u64,
    acks: AckSet,
    permit: BudgetPermit,
    layout: Layout,
    /// `delivery: effectively_once`: the range token; the worker writes
    /// such a chunk as its own batch with this token, never merged (D9).
    pub(crate) token: Option<String>,
}

/// Which row layout a chunk's or batch's bytes follow: an opaque number the
/// encoder reports ([`crate::pipeline::chain::Encoder::replan`]) and the
/// writer understands (for ClickHouse, the INSERT plan generation). `0` is
/// the layout planned at start. A shard worker never merges chunks of two
/// layouts into one batch.
pub type Layout = u64;

impl Chunk {
    /// `rows` rows encoded in `data` (whole rows in the sink's format), with
    /// the acks of their poll batches and the budget taken for them.
    /// The chunk is of layout 0 ([`Chunk::with_layout`] sets another).
    pub fn new(data: Bytes, rows: u64, acks: AckSet, permit: BudgetPermit) -> Self {
        Self {
            data,
            rows,
            acks,
            permit,
            layout: 0,
            token: None,
        }
    }

    /// The same chunk, its rows of `layout`.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The layout its rows follow.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The chunk as one shard's part of a range (`delivery:
    /// effectively_once`): written as it is, as its own batch, with `token`
    /// ([`crate::sink::range_token`]).
    pub fn with_token(mut self, token: String) -> Self {
        self.token = Some(token);
        self
    }

    /// The range token, for a range part.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    pub(crate) fn into_range_parts(self) -> (Bytes, u64, AckSet, BudgetPermit, Option<String>) {
        (self.data, self.rows, self.acks, self.permit, self.token)
    }

    /// The encoded bytes.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Rows in the chunk.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Encoded size in bytes.
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Whether the chunk holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The acks the chunk holds.
    pub fn acks(&self) -> &AckSet {
        &self.acks
    }

    pub(crate) fn into_parts(self) -> (Bytes, u64, AckSet, BudgetPermit, Layout) {
        debug_assert!(self.token.is_none(), "a range part is never merged");
        (self.data, self.rows, self.acks, self.permit, self.layout)
    }
}

/// The offsets of one partition (at one epoch) whose poll batches contributed
/// to a sealed batch. Inclusive. Poll batches fan out over shards, so a range
/// says where the rows came from, not that every offset in it is in this batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchRange {
    /// The partition.
    pub partition: TopicPartition,
    /// The epoch the data was polled under.
    pub epoch: Epoch,
    /// Lowest offset covered.
    pub first: Offset,
    /// Highest offset covered.
    pub last: Offset,
}

/// A hash of a batch's token and bytes (std's SipHash with fixed keys, so
/// it does not depend on the process).
#[cfg(debug_assertions)]
fn fingerprint(token: &str, segments: &[Bytes]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    token.hash(&mut h);
    for s in segments {
        h.write(s);
    }
    h.finish()
}

/// An immutable batch ready to write: every attempt sends these bytes with this
/// token (D4).
#[derive(Debug)]
pub struct SealedBatch {
    shard: usize,
    seq: u64,
    token: String,
    segments: Vec<Bytes>,
    rows: u64,
    bytes: u64,
    ranges: Vec<BatchRange>,
    layout: Layout,
    /// Hash of token and bytes taken at seal, checked again before every
    /// attempt ([`SealedBatch::debug_assert_unchanged`]): the D4 seam.
    #[cfg(debug_assertions)]
    sealed_fingerprint: u64,
}

impl SealedBatch {
    pub(crate) fn new(
        shard: usize,
        seq: u64,
        token: String,
        segments: Vec<Bytes>,
        rows: u64,
        acks: &AckSet,
        layout: Layout,
    ) -> Self {
        debug_assert!(!segments.is_empty(), "a sealed batch is never empty");
        let bytes = segments.iter().map(|s| s.len() as u64).sum();
        #[cfg(debug_assertions)]
        let sealed_fingerprint = fingerprint(&token, &segments);
        Self {
            shard,
            seq,
            token,
            segments,
            rows,
            bytes,
            ranges: ranges_of(acks),
            layout,
            #[cfg(debug_assertions)]
            sealed_fingerprint,
        }
    }

    /// A new immutable batch holding this batch's rows re-encoded as
    /// `segments` of `layout` (the writer's re-seal after the table changed,
    /// [`crate::sink::Writer::reseal`]): same shard, sequence number, token,
    /// row count and ranges; its own bytes, which every attempt of it sends
    /// unchanged (D4, checked by [`SealedBatch::debug_assert_unchanged`]).
    ///
    /// The token stays: it names the rows, so a server that deduplicates by
    /// token drops the re-sealed batch if an earlier attempt of the old bytes
    /// landed; one that deduplicates by block hash (18.16) does not (ADR 0005).
    pub fn resealed(&self, layout: Layout, segments: Vec<Bytes>) -> SealedBatch {
        debug_assert!(!segments.is_empty(), "a re-sealed batch is never empty");
        debug_assert_ne!(layout, self.layout, "a re-seal changes the layout");
        let bytes = segments.iter().map(|s| s.len() as u64).sum();
        #[cfg(debug_assertions)]
        let sealed_fingerprint = fingerprint(&self.token, &segments);
        SealedBatch {
            shard: self.shard,
            seq: self.seq,
            token: self.token.clone(),
            segments,
            rows: self.rows,
            bytes,
            ranges: self.ranges.clone(),
            layout,
            #[cfg(debug_assertions)]
            sealed_fingerprint,
        }
    }

    /// The layout its rows follow ([`Layout`]).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// In debug builds, panics unless the token and bytes are those the batch
    /// was sealed with: every attempt of one sealed batch carries identical
    /// bytes and the identical token (D4), checked where it is sealed and
    /// again where each attempt is written. A no-op in release builds.
    pub fn debug_assert_unchanged(&self) {
        #[cfg(debug_assertions)]
        assert_eq!(
            fingerprint(&self.token, &self.segments),
            self.sealed_fingerprint,
            "batch {} changed between seal and write (D4)",
            self.token
        );
    }

    /// The shard it is written to (never another: rows are not rerouted).
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// Its sequence number among the batches the shard sealed in this run.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The dedup token, `{pipeline}-{nonce}-{shard}-{seq}` (D4), or in
    /// `delivery: effectively_once` the range token (D9).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The encoded rows as the chunks delivered them, in order; the body of the
    /// insert is their concatenation.
    pub fn segments(&self) -> &[Bytes] {
        &self.segments
    }

    /// The insert body as one contiguous buffer (copies; for writers that
    /// cannot stream segments).
    pub fn to_contiguous(&self) -> Bytes {
        match self.segments.as_slice() {
            [one] => one.clone(),
            many => {
                let mut buf = Vec::with_capacity(self.bytes as usize);
                for s in many {
                    buf.extend_from_slice(s);
                }
                Bytes::from(buf)
            }
        }
    }

    /// Rows in the batch.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Encoded size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Per partition and epoch, the offsets whose poll batches contributed, in
    /// partition order.
    pub fn ranges(&self) -> &[BatchRange] {
        &self.ranges
    }
}

fn ranges_of(acks: &AckSet) -> Vec<BatchRange> {
    let mut by_partition: BTreeMap<(&TopicPartition, Epoch), (Offset, Offset)> = BTreeMap::new();
    for h in acks.handles() {
        let (first, last) = h.offsets();
        by_partition
            .entry((h.partition(), h.epoch()))
            .and_modify(|r| {
                r.0 = r.0.min(first);
                r.1 = r.1.max(last);
            })
            .or_insert((first, last));
    }
    by_partition
        .into_iter()
        .map(|((partition, epoch), (first, last))| BatchRange {
            partition: partition.clone(),
            epoch,
            first,
            last,
        })
        .collect()
}
