//! spate-row: the row model every format and the ClickHouse sink share.
//!
//! - [`types`]: ClickHouse type strings parsed into a [`types::ChType`] tree.
//! - [`num`], [`time`]: exact numbers and time text, the coercions' helpers.
//! - [`rowbinary`]: the RowBinary byte layout (primitive writers, a generic
//!   value encoder and its decoder).
//! - [`spec`]: the column specs an INSERT is encoded by ([`spec::ColumnSpec`],
//!   [`spec::MissingValue`], [`spec::MappingError`]): which field or
//!   metadata feeds a column and what a missing value means.
//! - [`coerce`]: record values (numbers, strings, time text) to RowBinary
//!   cells of a column's type, with the coercions users expect and no more.
//! - [`meta`]: Kafka metadata columns (`_topic`, `_offset`, `_key`, ...),
//!   written by [`meta::encode_meta`] for every format.
//! - [`filter`]: row filters (`mapping.filter`) evaluated on the encoded row.
//! - [`shard`]: shard keys and the routing hash (XXH64, as ClickHouse's
//!   `xxHash64`).
//! - [`schema`]: the target table's columns from `system.columns`, and the
//!   plan of which columns an INSERT names.
//! - [`plan`]: the INSERT plan and the live plan the writer re-plans when the
//!   table's columns change.
//!
//! Nothing here decodes a message format (spate-formats does) or talks to a
//! server (spate-clickhouse does). Invariant (docs/DESIGN.md): a value that
//! cannot map is a record error, never a type's default (D6).
#![forbid(unsafe_code)]

pub mod coerce;
pub mod filter;
pub mod meta;
pub mod num;
pub mod plan;
pub mod rowbinary;
pub mod schema;
pub mod shard;
pub mod spec;
pub mod time;
pub mod types;
