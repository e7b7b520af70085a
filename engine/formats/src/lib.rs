//! spate-formats: message decoders that write RowBinary rows for a table's
//! columns (spate-row's column specs), each implementing the chain's
//! `Decoder`/`Encoder`/`Router` seams.
//!
//! - [`json`]: JSON messages (one object per message; fan-out with
//!   `explode`), the JSON shard router ([`json::route`]) and the encoder
//!   that follows the live INSERT plan ([`json::live`]).
//! - [`avro`] (feature `avro`): Avro, Confluent-framed or plain, with
//!   fan-out and its own router by Avro field.
//! - [`protobuf`] (feature `protobuf`): Protobuf messages, plain or
//!   Confluent-framed.
//! - [`registry`] (with `avro` or `protobuf`): the Confluent-compatible
//!   schema registry client (writer schemas by id).
//!
//! No format names a sink: the rows go to whatever writer the chain ends in
//! (spate-clickhouse's). A value that cannot map is a record error, never a
//! type's default (D6).
#![forbid(unsafe_code)]

#[cfg(feature = "avro")]
pub mod avro;
pub mod json;
#[cfg(feature = "protobuf")]
pub mod protobuf;
#[cfg(any(feature = "avro", feature = "protobuf"))]
pub mod registry;
