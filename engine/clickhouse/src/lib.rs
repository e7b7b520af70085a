//! spate-clickhouse: the ClickHouse side of spate.
//!
//! - [`avro`]: Avro (Confluent-framed or plain) to RowBinary rows, with
//!   fan-out (`explode`); the chain's Avro decoder, encoder and router.
//! - [`types`]: ClickHouse type strings parsed into a [`types::ChType`] tree.
//! - [`rowbinary`]: the RowBinary byte layout (primitive writers, a generic
//!   value encoder and its decoder).
//! - [`mapping`]: JSON messages to RowBinary rows for a table's columns, with
//!   the coercions users expect and no more; implements the chain's
//!   `Encoder<Payload>` seam.
//! - [`protobuf`]: Protobuf messages (plain, or Confluent-framed with a
//!   schema registry) to RowBinary rows, decoded from the wire format.
//! - [`native`]: the Native insert format, transcoded from a sealed batch's
//!   RowBinary rows; its blocks name each column's type, so a table whose
//!   column type changed refuses them.
//! - [`schema`]: the target table's columns from `system.columns`, and the
//!   plan of which columns an INSERT names.
//! - [`replan`]: the live INSERT plan the writer re-plans when the table's
//!   columns change and the pipeline threads follow per poll batch.
//! - [`writer`]: the HTTP insert writer implementing `spate_core::sink::Writer`.
//! - [`dedup`]: a table's insert-deduplication window (what a replay must
//!   fall within for `delivery: effectively_once`) and the insert rate.
//! - [`registry`]: the Confluent-compatible schema registry client (writer
//!   schemas of Confluent-framed Avro and Protobuf messages, by id).
//! - [`router`]: the shard router (`XXH64(key) mod shards`, as ClickHouse's
//!   `xxHash64`), implementing the chain's `Router<Payload>` seam.
//!
//! Exact numbers ([`num`]) and time text ([`time`]) are the mapper's helpers.
//!
//! Invariants (docs/DESIGN.md): a value that cannot map is a record error,
//! never a type's default (D6); every retry sends the same bytes with the same
//! token (D4: the writer sends a `SealedBatch`'s bytes, or their Native
//! transcode, a pure function of them).
#![forbid(unsafe_code)]

pub mod avro;
pub mod dedup;
pub mod filter;
pub mod mapping;
pub mod native;
pub mod num;
pub mod protobuf;
pub mod registry;
pub mod replan;
pub mod router;
pub mod rowbinary;
pub mod schema;
pub mod time;
pub mod types;
pub mod writer;
