//! The writer seam: how a shard worker reaches one replica.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::sink::SealedBatch;

/// One replica of one shard, as configured in `sink.shards[shard][replica]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Shard index.
    pub shard: usize,
    /// Replica index within the shard.
    pub replica: usize,
    /// The replica's URL (for ClickHouse, its HTTP interface).
    pub url: Arc<str>,
}

impl fmt::Display for Endpoint {
    /// `shard S replica R (url)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shard {} replica {} ({})",
            self.shard, self.replica, self.url
        )
    }
}

/// Whether retrying a failed write can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteErrorKind {
    /// Network errors, timeouts, overload, a replica restarting: retry the
    /// same bytes and token, on the next healthy replica.
    Retryable,
    /// No answer in time (or the connection dropped after the request was
    /// sent): the insert may or may not have landed. Retried like
    /// `Retryable`, with the same token (D4); a later success is counted as
    /// a possible duplicate.
    Ambiguous,
    /// The replica is still running an earlier attempt of this very batch
    /// (the insert's `query_id` is the batch token, and ClickHouse refuses a
    /// second query with an id that is running: code 216). This attempt did
    /// not land; the earlier one may still. The worker waits (backoff) and
    /// asks the same replica again; it is neither a failure counted against
    /// `retry.max_attempts` nor one that opens the replica's breaker.
    AlreadyRunning,
    /// The table changed under the batch's layout and the writer now writes
    /// another ([`SealedBatch::layout`]): nothing was sent. The worker asks
    /// [`Writer::reseal`] for the batch under the current layout and writes
    /// that instead; neither a failure counted against `retry.max_attempts`
    /// nor one that opens the replica's breaker.
    Replanned,
    /// The batch itself is refused (schema mismatch, malformed data, no such
    /// table, authorisation): abandon it at once and fail its acks.
    Fatal,
}

/// A failed write or probe, classified for the retry loop.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} write error: {message}", match .kind {
    WriteErrorKind::Retryable => "retryable",
    WriteErrorKind::Ambiguous => "ambiguous",
    WriteErrorKind::AlreadyRunning => "already-running",
    WriteErrorKind::Replanned => "replanned",
    WriteErrorKind::Fatal => "fatal",
})]
pub struct WriteError {
    /// Retryable or fatal.
    pub kind: WriteErrorKind,
    /// What the server or the client said.
    pub message: String,
}

impl WriteError {
    /// A failure a retry may fix.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            kind: WriteErrorKind::Retryable,
            message: message.into(),
        }
    }

    /// A failure that may have written the batch (timeout after sending).
    pub fn ambiguous(message: impl Into<String>) -> Self {
        Self {
            kind: WriteErrorKind::Ambiguous,
            message: message.into(),
        }
    }

    /// The replica still runs an earlier attempt with this batch's token as
    /// its query id: wait and ask again (see [`WriteErrorKind::AlreadyRunning`]).
    pub fn already_running(message: impl Into<String>) -> Self {
        Self {
            kind: WriteErrorKind::AlreadyRunning,
            message: message.into(),
        }
    }

    /// The batch's layout is no longer the table's: re-seal it (see
    /// [`WriteErrorKind::Replanned`]).
    pub fn replanned(message: impl Into<String>) -> Self {
        Self {
            kind: WriteErrorKind::Replanned,
            message: message.into(),
        }
    }

    /// A failure no retry can fix.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            kind: WriteErrorKind::Fatal,
            message: message.into(),
        }
    }

    /// The error in words for a request that is not a write (a probe, a
    /// query): `describe("schema probe")` reads "fatal schema probe error:
    /// ..." where the Display form says "write error".
    pub fn describe(&self, what: &str) -> String {
        let kind = match self.kind {
            WriteErrorKind::Retryable => "retryable",
            WriteErrorKind::Ambiguous => "ambiguous",
            WriteErrorKind::AlreadyRunning => "already-running",
            WriteErrorKind::Replanned => "replanned",
            WriteErrorKind::Fatal => "fatal",
        };
        format!("{kind} {what} error: {}", self.message)
    }

    /// Whether the error is [`WriteErrorKind::Fatal`].
    pub fn is_fatal(&self) -> bool {
        self.kind == WriteErrorKind::Fatal
    }
}

/// Writes sealed batches to replicas. Shared by every shard worker and every
/// concurrent write, so it takes `&self`.
///
/// An implementation must send the same bytes on every attempt of a batch:
/// `batch.segments()` byte for byte, or a pure function of them (the
/// ClickHouse writer's Native transcode), and pass `batch.token()` as the
/// dedup token every time (D4), and, where the server can refuse a query
/// whose id is already running (ClickHouse's `query_id`), as the attempt's
/// id, answering [`WriteErrorKind::AlreadyRunning`] when it does. It need not
/// impose its own timeout: the pool bounds each attempt by
/// `sink.write_timeout` and drops the future when it expires.
pub trait Writer: Send + Sync + 'static {
    /// Writes `batch` to `endpoint`. `Ok` means the replica acknowledged the
    /// insert durably.
    ///
    /// # Errors
    /// [`WriteError`] classified [`WriteErrorKind::Retryable`],
    /// [`WriteErrorKind::Ambiguous`], [`WriteErrorKind::AlreadyRunning`] or
    /// [`WriteErrorKind::Fatal`].
    fn write(
        &self,
        endpoint: &Endpoint,
        batch: &SealedBatch,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;

    /// Checks that `endpoint` is reachable and can take our inserts (for
    /// ClickHouse: the table exists with the expected columns).
    ///
    /// # Errors
    /// [`WriteError`] saying why not.
    fn probe(&self, endpoint: &Endpoint) -> impl Future<Output = Result<(), WriteError>> + Send;

    /// After [`Writer::write`] answered [`WriteErrorKind::Replanned`]: the
    /// batch's rows re-encoded under the layout the writer now writes, as a
    /// new immutable batch ([`SealedBatch::resealed`]), when every value
    /// carries over exactly. The worker writes it from then on, every
    /// attempt identical (D4). Runs on the worker's task: keep it to a pure
    /// transform of the bytes (no I/O).
    ///
    /// # Errors
    /// A fatal [`WriteError`] when the rows cannot be carried exactly (the
    /// batch is abandoned, its acks fail, D1). The default: this writer
    /// cannot re-seal.
    fn reseal(&self, batch: &SealedBatch) -> Result<SealedBatch, WriteError> {
        Err(WriteError::fatal(format!(
            "batch {}: the writer changed its layout but cannot re-seal batches",
            batch.token()
        )))
    }
}
