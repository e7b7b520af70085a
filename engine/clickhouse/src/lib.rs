//! spate-clickhouse: the ClickHouse sink's I/O.
//!
//! - [`writer`]: the HTTP insert writer implementing `spate_core::sink::Writer`.
//! - [`native`]: the Native insert format, transcoded from a sealed batch's
//!   RowBinary rows; its blocks name each column's type, so a table whose
//!   column type changed refuses them.
//! - [`dedup`]: a table's insert-deduplication window (what a replay must
//!   fall within for `delivery: effectively_once`) and the insert rate.
//!
//! Rows come encoded (spate-row's layout, written by spate-formats'
//! decoders); the sink knows no message format. Invariant (docs/DESIGN.md):
//! every retry sends the same bytes with the same token (D4: the writer
//! sends a `SealedBatch`'s bytes, or their Native transcode, a pure function
//! of them).
#![forbid(unsafe_code)]

pub mod dedup;
pub mod native;
pub mod writer;
