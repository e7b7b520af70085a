//! The chain: decode -> optional user operators -> encode into the chunk of
//! the shard the router picks (DESIGN "Chain").
//!
//! Every stage is a generic type, so a chain is one monomorphised call tree:
//! no dynamic dispatch and no allocation per record on the hot path. A record
//! does not own an ack handle clone; it travels with a [`RecordCx`] that points
//! at its poll batch's [`AckHandle`], and the terminal stage adds that handle
//! to the chunk the row lands in (one clone per chunk and poll batch, not per
//! record). Hence the ack rules of DESIGN "Acks" hold without per-record
//! atomics: a filtered record simply never reaches a chunk (its batch resolves
//! delivered as far as it is concerned), and a flat_map's outputs all add the
//! same handle.
//!
//! Errors are per payload: a [`RecordError`] raised anywhere in the chain
//! returns to the lane driver, which applies the skip-or-fail policy (D6).

use std::fmt;

use crate::ack::AckHandle;
use crate::record::Payload;

/// Where a record came from: its payload (partition, offset, key, bytes) and
/// the ack handle of its poll batch.
#[derive(Clone, Copy, Debug)]
pub struct RecordCx<'a> {
    /// The payload the record was decoded from.
    pub payload: Payload<'a>,
    /// The ack of the payload's poll batch.
    pub ack: &'a AckHandle,
}

/// Which stage refused a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordErrorKind {
    /// The payload could not be decoded (not JSON, truncated, ...).
    Decode,
    /// A user operator refused the record.
    Operator,
    /// The record could not be encoded into the table's row (missing column,
    /// value out of range, wrong type).
    Encode,
}

impl RecordErrorKind {
    /// The label used in metrics and dead-letter headers.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordErrorKind::Decode => "decode",
            RecordErrorKind::Operator => "operator",
            RecordErrorKind::Encode => "encode",
        }
    }
}

/// A record that cannot go on; the lane driver skips or fails it per policy
/// and reports it with the payload's topic, partition and offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordError {
    /// Which stage refused it.
    pub kind: RecordErrorKind,
    /// The column concerned, when there is one.
    pub column: Option<String>,
    /// Why, in words a user can act on.
    pub reason: String,
}

impl RecordError {
    /// A decode error.
    pub fn decode(reason: impl Into<String>) -> Self {
        Self {
            kind: RecordErrorKind::Decode,
            column: None,
            reason: reason.into(),
        }
    }

    /// An encode error about `column`.
    pub fn encode(column: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            kind: RecordErrorKind::Encode,
            column: Some(column.into()),
            reason: reason.into(),
        }
    }

    /// An error raised by a user operator.
    pub fn operator(reason: impl Into<String>) -> Self {
        Self {
            kind: RecordErrorKind::Operator,
            column: None,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.column {
            Some(c) => write!(
                f,
                "{} error in column `{c}`: {}",
                self.kind.as_str(),
                self.reason
            ),
            None => write!(f, "{} error: {}", self.kind.as_str(), self.reason),
        }
    }
}

impl std::error::Error for RecordError {}

/// A stage that accepts records of type `T`.
pub trait Stage<T> {
    /// Processes one record.
    ///
    /// # Errors
    /// [`RecordError`] when this or a later stage refuses the record.
    fn push(&mut self, record: T, cx: &RecordCx<'_>) -> Result<(), RecordError>;

    /// Called by the lane driver once before each poll batch's records;
    /// operator stages pass it on, the terminal asks its encoder whether it
    /// switched plans ([`Encoder::replan`]) and, if so, seals its open
    /// chunks before a row of the new layout is appended. Once per poll
    /// batch, never per record. The default does nothing.
    #[inline]
    fn begin_poll_batch(&mut self) {}
}

/// Turns a payload into zero or more records and pushes them to `next`.
pub trait Decoder: Send {
    /// The decoded record; may borrow the payload (zero copy).
    type Record<'a>;

    /// Decodes `cx.payload`.
    ///
    /// # Errors
    /// [`RecordErrorKind::Decode`] for a payload that cannot be decoded, or
    /// whatever `next` returned.
    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<Self::Record<'a>>;
}

/// The identity decoder: the record is the payload itself. Use it when the
/// encoder reads the bytes directly (the JSON-to-RowBinary mapper does).
#[derive(Clone, Copy, Debug, Default)]
pub struct PayloadDecoder;

impl Decoder for PayloadDecoder {
    type Record<'a> = Payload<'a>;

    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<Payload<'a>>,
    {
        next.push(cx.payload, cx)
    }
}

/// Appends one record as one row to a shard's chunk buffer.
///
/// An encoder must either append exactly one whole row and return `Ok`, or
/// return `Err`; the terminal stage truncates whatever a failed call appended,
/// so a refused record never leaves half a row behind.
pub trait Encoder<T>: Send {
    /// Appends `record` as one row to `buf`.
    ///
    /// # Errors
    /// [`RecordErrorKind::Encode`] naming the column and the reason.
    fn encode(
        &mut self,
        record: &T,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError>;

    /// Whether the row `encode` just appended is kept: `row` is exactly its
    /// bytes (in the INSERT's row format). `false` drops the row: the
    /// terminal truncates it and counts it as filtered
    /// ([`crate::metrics::RECORDS_FILTERED`], reason `filter`); the record's
    /// ack is unaffected, so its message still commits (D1, D6). Asked once
    /// per row right after a successful `encode`, so a filter sees the value
    /// the table would store, whichever decoder produced it. The default
    /// keeps every row (and compiles to nothing).
    #[inline]
    fn keep(&mut self, row: &[u8]) -> bool {
        let _ = row;
        true
    }

    /// How the encoder follows a table that changes while it runs, asked
    /// once per poll batch before its records ([`Stage::begin_poll_batch`]):
    /// `Some(layout)` when it has just switched to another plan, so the rows
    /// it appends from now on follow `layout` ([`crate::sink::Layout`]) and
    /// the terminal seals the open chunks first; `None` (the default, and
    /// the usual answer) when nothing changed. Keep it to an atomic load
    /// when nothing changed.
    #[inline]
    fn replan(&mut self) -> Option<crate::sink::Layout> {
        None
    }
}

/// Picks the shard of a record: an index in `0..shards`.
pub trait Router<T>: Send {
    /// The shard for `record`; must be `< shards`.
    fn route(&mut self, record: &T, cx: &RecordCx<'_>, shards: usize) -> usize;

    /// The shard for `record`, or a record error when it has none (a record
    /// without its sharding key): what the terminal stage calls. The
    /// default is [`Router::route`], which always has a shard.
    ///
    /// # Errors
    /// A [`RecordError`] the lane's `on_error` policy handles.
    fn try_route(
        &mut self,
        record: &T,
        cx: &RecordCx<'_>,
        shards: usize,
    ) -> Result<usize, RecordError> {
        Ok(self.route(record, cx, shards))
    }
}

/// Round robin over shards, record by record: for tables without a sharding
/// key.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl<T> Router<T> for RoundRobin {
    fn route(&mut self, _record: &T, _cx: &RecordCx<'_>, shards: usize) -> usize {
        let s = self.next % shards;
        self.next = s + 1;
        s
    }
}

/// Keeps the records for which `F` returns true; the others are filtered
/// (they count as delivered once their batch settles, DESIGN "Acks").
#[derive(Clone, Debug)]
pub struct Filter<F, N> {
    f: F,
    next: N,
}

impl<T, F: FnMut(&T) -> bool, N: Stage<T>> Stage<T> for Filter<F, N> {
    #[inline]
    fn push(&mut self, record: T, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        if (self.f)(&record) {
            self.next.push(record, cx)
        } else {
            Ok(())
        }
    }

    #[inline]
    fn begin_poll_batch(&mut self) {
        self.next.begin_poll_batch();
    }
}

/// Transforms each record with `F`.
#[derive(Clone, Debug)]
pub struct Map<F, N> {
    f: F,
    next: N,
}

impl<T, U, F: FnMut(T) -> U, N: Stage<U>> Stage<T> for Map<F, N> {
    #[inline]
    fn push(&mut self, record: T, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        self.next.push((self.f)(record), cx)
    }

    #[inline]
    fn begin_poll_batch(&mut self) {
        self.next.begin_poll_batch();
    }
}

/// Turns each record into zero or more records with `F`; each output carries
/// the input's ack (a fan-out clones the handle, DESIGN "Acks").
#[derive(Clone, Debug)]
pub struct FlatMap<F, N> {
    f: F,
    next: N,
}

impl<T, U, I, F, N> Stage<T> for FlatMap<F, N>
where
    I: IntoIterator<Item = U>,
    F: FnMut(T) -> I,
    N: Stage<U>,
{
    #[inline]
    fn push(&mut self, record: T, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        for out in (self.f)(record) {
            self.next.push(out, cx)?;
        }
        Ok(())
    }

    #[inline]
    fn begin_poll_batch(&mut self) {
        self.next.begin_poll_batch();
    }
}

/// Fallible transformation: `Err` becomes an operator record error.
#[derive(Clone, Debug)]
pub struct TryMap<F, N> {
    f: F,
    next: N,
}

impl<T, U, F: FnMut(T) -> Result<U, RecordError>, N: Stage<U>> Stage<T> for TryMap<F, N> {
    #[inline]
    fn push(&mut self, record: T, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        let out = (self.f)(record)?;
        self.next.push(out, cx)
    }

    #[inline]
    fn begin_poll_batch(&mut self) {
        self.next.begin_poll_batch();
    }
}

macro_rules! next_mut {
    ($($op:ident),*) => {$(
        impl<F, N> $op<F, N> {
            /// The stage after this one.
            pub fn next_mut(&mut self) -> &mut N {
                &mut self.next
            }
        }
    )*};
}
next_mut!(Filter, Map, FlatMap, TryMap);

/// See [`Filter`].
pub fn filter<F, N>(f: F, next: N) -> Filter<F, N> {
    Filter { f, next }
}

/// See [`Map`].
pub fn map<F, N>(f: F, next: N) -> Map<F, N> {
    Map { f, next }
}

/// See [`FlatMap`].
pub fn flat_map<F, N>(f: F, next: N) -> FlatMap<F, N> {
    FlatMap { f, next }
}

/// See [`TryMap`].
pub fn try_map<F, N>(f: F, next: N) -> TryMap<F, N> {
    TryMap { f, next }
}
