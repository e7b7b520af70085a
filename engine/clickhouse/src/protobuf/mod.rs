//! Protobuf to RowBinary: one Protobuf message per Kafka value becomes one
//! row of the INSERT's columns, decoded straight from the wire format into
//! the chunk buffer.
//!
//! - [`framing`]: the Confluent frame (magic 0, schema id, message
//!   indexes) before the message; or plain messages, no frame.
//! - [`source`]: descriptors from a descriptor-set file or a registry's
//!   `.proto` text ([`ProtoSchemaSource`], [`FileSchemaSource`]).
//! - [`plan`]: message descriptor + [`ColumnSpec`]s -> a [`Plan`] (fields by
//!   name, types that carry exactly, absent fields vs `missing`).
//! - `decode`: the hot path (no `DynamicMessage`, no allocation per
//!   record once scratch has grown; `tests/no_alloc.rs` counts).
//!
//! [`ProtoRowEncoder`] ties them together and implements the chain's
//! `Encoder<Payload>` (use it with `PayloadDecoder`, as the JSON mapper is
//! used). With Confluent framing it keeps a per-lane plan cache keyed by
//! schema id and message indexes; the shared [`ProtoSchemaSource`] is asked
//! only on a miss.
//!
//! **Errors.** A frame or message that does not parse is a
//! [`RecordError`] of kind Decode naming the schema id (or descriptor) and
//! message; a value that cannot be written exactly, or a missing field with
//! no missing value, is kind Encode naming the column. A schema id whose
//! schema cannot be planned for the table is a Decode error naming the
//! schema id, field and column (cached: asked once per lane). The lane
//! driver adds topic, partition and offset (D6: skipped by policy or
//! failed, never replaced by a default).
//!
//! Wiring (for `format.protobuf`): [`ProtoRowEncoder::from_descriptor_set`]
//! (a descriptor-set path, a message name, the columns: plain messages, or
//! Confluent-framed ones decoded with that one message whatever the id),
//! and [`ProtoRowEncoder::confluent`] (a [`ProtoSchemaSource`], the
//! columns).

pub mod framing;
pub mod plan;
pub mod sensor;
pub mod source;

mod decode;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;

use prost_reflect::MessageDescriptor;
use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError};
use spate_core::record::Payload;

pub use framing::{Frame, FramingError, parse_frame};
pub use plan::{Plan, PlanError};
pub use source::{FileSchemaSource, ProtoSchemaSource, SchemaError};

use crate::mapping::{ColumnSpec, MappingError, MappingOptions, MissingValue};

/// Most plans one lane keeps (schema ids x message indexes); the oldest is
/// dropped beyond it. A topic rarely carries more than a few writer
/// schemas at once.
pub const MAX_CACHED_PLANS: usize = 64;

/// An encoder that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The descriptor could not be had.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The columns cannot be fed from the message.
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// How payloads carry the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// The value is the message bytes, nothing else.
    Plain,
    /// Confluent framing ([`framing`]); the schema id and indexes are read
    /// and checked, the message type is the fixed one.
    Confluent,
}

struct Cached {
    id: u32,
    indexes: Vec<i32>,
    plan: Result<Plan, String>,
}

enum Mode {
    /// One message type for every record.
    Fixed { plan: Plan, framing: Framing },
    /// Confluent framing, schemas by id from a source.
    Registry {
        source: Arc<dyn ProtoSchemaSource>,
        cache: Vec<Cached>,
        last: usize,
    },
}

/// The Protobuf-to-RowBinary encoder for one table's INSERT columns (one
/// per lane: it holds the lane's plan cache and scratch).
///
/// Implements the chain's `Encoder<Payload>`: each call appends exactly one
/// row or returns a [`RecordError`] (the chain truncates a failed row).
pub struct ProtoRowEncoder {
    columns: Vec<ColumnSpec>,
    options: MappingOptions,
    with_defaults: bool,
    mode: Mode,
    scratch: decode::Scratch,
    indexes: Vec<i32>,
}

impl std::fmt::Debug for ProtoRowEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtoRowEncoder")
            .field("columns", &self.columns.len())
            .field("with_defaults", &self.with_defaults)
            .finish_non_exhaustive()
    }
}

impl ProtoRowEncoder {
    /// Every record is a `message` (plain bytes, or Confluent-framed with
    /// `framing`), mapped onto `columns` (INSERT order).
    ///
    /// # Errors
    /// [`PlanError`] naming the message, field and column.
    pub fn fixed(
        message: &MessageDescriptor,
        framing: Framing,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
        schema: &str,
    ) -> Result<Self, PlanError> {
        let plan = plan::compile(message, &columns, &options, schema)?;
        Ok(Self::build(columns, options, Mode::Fixed { plan, framing }))
    }

    /// Every record is the message `message_name` (fully qualified) of the
    /// descriptor set at `path` (`protoc --include_imports
    /// --descriptor_set_out`).
    ///
    /// # Errors
    /// [`ProtoError`]: the file does not load, lacks the message, or the
    /// columns cannot be planned.
    pub fn from_descriptor_set(
        path: &Path,
        message_name: &str,
        framing: Framing,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
    ) -> Result<Self, ProtoError> {
        let pool = source::load_descriptor_set(path)?;
        let what = path.display().to_string();
        let msg = source::message_by_name(&pool, message_name, &what)?;
        Ok(Self::fixed(&msg, framing, columns, options, &what)?)
    }

    /// Confluent-framed records whose schema is looked up by id in
    /// `source` (on a plan-cache miss only) and whose message type the
    /// frame's message indexes pick.
    ///
    /// # Errors
    /// [`MappingError`] for an empty column list or a DEFAULT literal that
    /// does not encode (what can be checked before a schema is seen).
    pub fn confluent(
        source: Arc<dyn ProtoSchemaSource>,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
    ) -> Result<Self, MappingError> {
        if columns.is_empty() {
            return Err(MappingError::NoColumns);
        }
        for c in &columns {
            if let MissingValue::Literal(lit) = &c.missing {
                crate::mapping::encode_literal(c, lit, &options.time)?;
            }
        }
        Ok(Self::build(
            columns,
            options,
            Mode::Registry {
                source,
                cache: Vec::new(),
                last: 0,
            },
        ))
    }

    fn build(columns: Vec<ColumnSpec>, options: MappingOptions, mode: Mode) -> Self {
        Self {
            with_defaults: columns
                .iter()
                .any(|c| c.missing == MissingValue::ServerDefault),
            columns,
            options,
            mode,
            scratch: decode::Scratch::default(),
            indexes: Vec::with_capacity(framing::MAX_MESSAGE_INDEXES),
        }
    }

    /// The INSERT's columns, in order.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Whether rows are `RowBinaryWithDefaults` (some column has
    /// [`MissingValue::ServerDefault`]); the INSERT must name the same
    /// format ([`crate::schema::row_format`]).
    pub fn with_defaults(&self) -> bool {
        self.with_defaults
    }

    /// Appends the row for one Kafka value to `buf`.
    ///
    /// # Errors
    /// [`RecordError`]: Decode for a frame or message that does not parse
    /// or a schema id that cannot be had or planned (naming it), Encode
    /// naming the column for a value that cannot be written or a missing
    /// field. `buf` may then hold part of the row; truncate it.
    pub fn encode_message(&mut self, value: &[u8], buf: &mut Vec<u8>) -> Result<(), RecordError> {
        let (plan, message) = match &mut self.mode {
            Mode::Fixed { plan, framing } => {
                let message = match framing {
                    Framing::Plain => value,
                    Framing::Confluent => {
                        parse_frame(value, &mut self.indexes)
                            .map_err(|e| RecordError::decode(e.to_string()))?
                            .message
                    }
                };
                (&*plan, message)
            }
            Mode::Registry {
                source,
                cache,
                last,
            } => {
                let frame = parse_frame(value, &mut self.indexes)
                    .map_err(|e| RecordError::decode(e.to_string()))?;
                let hit = match cache.get(*last) {
                    Some(c) if c.id == frame.schema_id && c.indexes == self.indexes => Some(*last),
                    _ => cache
                        .iter()
                        .position(|c| c.id == frame.schema_id && c.indexes == self.indexes),
                };
                let at = match hit {
                    Some(i) => i,
                    None => {
                        let plan = plan_for(
                            source.as_ref(),
                            frame.schema_id,
                            &self.indexes,
                            &self.columns,
                            &self.options,
                        )?;
                        if cache.len() >= MAX_CACHED_PLANS {
                            cache.remove(0);
                        }
                        cache.push(Cached {
                            id: frame.schema_id,
                            indexes: self.indexes.clone(),
                            plan,
                        });
                        cache.len() - 1
                    }
                };
                *last = at;
                match &cache[at].plan {
                    Ok(p) => (p, frame.message),
                    Err(e) => return Err(RecordError::decode(e.clone())),
                }
            }
        };
        decode::decode_row(plan, &mut self.scratch, message, buf).map_err(|f| match f {
            decode::Fail::Wire(reason) => RecordError::decode(format!(
                "protobuf schema {}, message `{}`: {reason}",
                plan.schema, plan.message
            )),
            decode::Fail::Value(col, reason) => {
                let c = &plan.cols[col as usize];
                RecordError::encode(
                    &c.name,
                    format!(
                        "{reason} (protobuf schema {}, field `{}`)",
                        plan.schema, c.field
                    ),
                )
            }
            decode::Fail::Missing(col) => {
                let c = &plan.cols[col as usize];
                RecordError::encode(
                    &c.name,
                    format!(
                        "field `{}` is absent (protobuf schema {}), and the column is not \
                         Nullable and has no DEFAULT spate can apply",
                        c.field, plan.schema
                    ),
                )
            }
        })
    }
}

/// The plan for schema `id` at `indexes`: `Err(RecordError)` when the
/// source fails (not cached: a registry may come back), `Ok(Err(text))`
/// when the schema cannot be planned (cached: it never will be).
fn plan_for(
    source: &dyn ProtoSchemaSource,
    id: u32,
    indexes: &[i32],
    columns: &[ColumnSpec],
    options: &MappingOptions,
) -> Result<Result<Plan, String>, RecordError> {
    let file = source
        .descriptor(id)
        .map_err(|e| RecordError::decode(e.to_string()))?;
    let Some(msg) = source::message_at(&file, indexes) else {
        return Ok(Err(format!(
            "protobuf schema id {id}: the message indexes {indexes:?} name no message in `{}`",
            file.name()
        )));
    };
    Ok(plan::compile(&msg, columns, options, &format!("id {id}")).map_err(|e| e.to_string()))
}

impl<'a> Encoder<Payload<'a>> for ProtoRowEncoder {
    fn encode(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        match record.value {
            Some(v) => self.encode_message(v, buf),
            None => Err(RecordError::decode("tombstone: the message has no value")),
        }
    }
}
