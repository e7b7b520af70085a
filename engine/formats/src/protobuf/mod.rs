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
//!   record once scratch has grown; spate-clickhouse's `tests/it/no_alloc.rs`
//!   counts), with
//!   `conv` (which scalar carries into which column type) and `put` (the
//!   value writers).
//! - The sensor workload as a flat message (`spate_testkit::sensor::protobuf`)
//!   serves the no-allocation test and `examples/proto_sensor.rs` (instructions per
//!   row: about 2,350 for its 11 columns, callgrind; the JSON mapper takes
//!   about 3,200 for the same rows as JSON objects).
//!
//! `tests.rs` holds the property tests against prost-reflect's
//! `DynamicMessage` (generated schemas of every scalar kind, labels and
//! column types, nested messages, maps, oneofs, unknown fields, cut
//! messages; Timestamps and wrappers).
//!
//! **The chain**, shaped as `crate::avro`'s: a [`ProtoMapping`]
//! per pipeline (the columns, the schema source, the plans compiled so
//! far by schema id and message indexes, behind a lock asked on a miss
//! only); per pipeline thread a [`ProtoDecoder`] (`Decoder`: framing and
//! plan lookup, one [`ProtoRecord`] per message, borrowing the payload)
//! and a [`ProtoRowEncoder`] (`Encoder<ProtoRecord>`: the row), each with
//! its own plan cache (the last plan, then the ones it has met: no lock on
//! the hot path). A [`ProtoRowEncoder`] is also an `Encoder<Payload>`
//! (framing and all, with the chain's `PayloadDecoder`), the JSON mapper's
//! shape.
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
//! Wiring (for `format.protobuf`): [`ProtoMapping::from_descriptor_set`]
//! (a descriptor-set path, a message name, the columns: plain messages, or
//! Confluent-framed ones decoded with that one message whatever the id),
//! and [`ProtoMapping::confluent`] (a [`ProtoSchemaSource`], the columns);
//! then `mapping.decoder()` and `mapping.encoder()` per thread.

pub mod framing;
pub mod plan;
pub mod source;

mod conv;
mod decode;
mod put;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Arc, Mutex};

use prost_reflect::MessageDescriptor;
use spate_core::pipeline::chain::{Decoder, Encoder, RecordCx, RecordError, Stage};
use spate_core::record::Payload;

pub use framing::{Frame, FramingError, parse_frame};
pub use plan::{Plan, PlanError};
pub use source::{FileSchemaSource, ProtoSchemaSource, SchemaError};

use spate_row::spec::{ColumnSpec, MappingError, MappingOptions, MissingValue};

/// Most plans one mapping keeps (schema ids x message types); a record of
/// a further one is a Decode error naming its schema id. A topic carries a
/// handful of writer schemas over its life, so this bounds memory against
/// a producer that registers a schema per message, not real evolution.
pub const MAX_CACHED_PLANS: usize = 1024;

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
    /// Confluent framing ([`framing`]); with a fixed message type the
    /// schema id and indexes are read and checked but do not choose it.
    Confluent,
}

/// Where a mapping's schemas come from.
enum Schemas {
    /// One message type for every record.
    Fixed { plan: Arc<Plan>, framing: Framing },
    /// Confluent framing, schemas by id from a source.
    Registry(Arc<dyn ProtoSchemaSource>),
}

/// A plan the shared mapping compiled: its key is its position.
struct Shared {
    id: u32,
    indexes: Vec<i32>,
    /// The plan, or the Decode error every record of it gets.
    plan: Result<Arc<Plan>, RecordError>,
}

/// One table's Protobuf mapping, shared by every pipeline thread: the
/// columns, the options, the schema source and the plans compiled so far
/// (by schema id and message indexes). Build one per pipeline, then a
/// decoder and an encoder per thread.
pub struct ProtoMapping {
    columns: Vec<ColumnSpec>,
    options: MappingOptions,
    schemas: Schemas,
    plans: Mutex<Vec<Shared>>,
}

impl std::fmt::Debug for ProtoMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtoMapping")
            .field("columns", &self.columns.len())
            .field(
                "schemas",
                &match self.schemas {
                    Schemas::Fixed { .. } => "fixed",
                    Schemas::Registry(_) => "registry",
                },
            )
            .finish_non_exhaustive()
    }
}

impl ProtoMapping {
    /// Every record is a `message` (plain bytes, or Confluent-framed with
    /// `framing`), mapped onto `columns` (INSERT order); `schema` names it
    /// in errors (a file name).
    ///
    /// # Errors
    /// [`PlanError`] naming the message, field and column.
    pub fn fixed(
        message: &MessageDescriptor,
        framing: Framing,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
        schema: &str,
    ) -> Result<Arc<Self>, PlanError> {
        let label = format!("Protobuf schema `{schema}`");
        let plan = Arc::new(plan::compile(message, &columns, &options, &label)?);
        Ok(Arc::new(Self {
            columns,
            options,
            schemas: Schemas::Fixed { plan, framing },
            plans: Mutex::new(Vec::new()),
        }))
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
    ) -> Result<Arc<Self>, ProtoError> {
        let pool = source::load_descriptor_set(path)?;
        let what = path.display().to_string();
        let msg = source::message_by_name(&pool, message_name, &what)?;
        Ok(Self::fixed(&msg, framing, columns, options, &what)?)
    }

    /// Confluent-framed records whose schema is looked up by id in
    /// `source` (once per id and message indexes, on a miss) and whose
    /// message type the frame's message indexes pick.
    ///
    /// # Errors
    /// [`MappingError`] for an empty column list or a DEFAULT literal that
    /// does not encode (what can be checked before a schema is seen).
    pub fn confluent(
        source: Arc<dyn ProtoSchemaSource>,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
    ) -> Result<Arc<Self>, MappingError> {
        if columns.is_empty() {
            return Err(MappingError::NoColumns);
        }
        for c in &columns {
            if let MissingValue::Literal(lit) = &c.missing {
                spate_row::spec::encode_literal(c, lit, &options.time)?;
            }
        }
        Ok(Arc::new(Self {
            columns,
            options,
            schemas: Schemas::Registry(source),
            plans: Mutex::new(Vec::new()),
        }))
    }

    /// The INSERT's columns, in order.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Whether rows are `RowBinaryWithDefaults` (some column has
    /// [`MissingValue::ServerDefault`]); the INSERT must name the same
    /// format ([`spate_row::schema::row_format`]).
    pub fn with_defaults(&self) -> bool {
        self.columns
            .iter()
            .any(|c| c.missing == MissingValue::ServerDefault)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Shared>> {
        self.plans.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plan for schema `id` at message `indexes`, and its key,
    /// compiled on first use and kept (at most [`MAX_CACHED_PLANS`]); a
    /// plan error is kept too (a schema does not change under its id), a
    /// schema-source error is not (asked again next time). Blocks while
    /// the source is asked. Call it at start-up to fail early on a known
    /// id.
    ///
    /// # Errors
    /// A Decode [`RecordError`] naming the schema id: the source's error,
    /// indexes that name no message, or the plan error.
    pub fn plan(&self, id: u32, indexes: &[i32]) -> Result<(u32, Arc<Plan>), RecordError> {
        let source = match &self.schemas {
            Schemas::Fixed { plan, .. } => return Ok((0, Arc::clone(plan))),
            Schemas::Registry(s) => s,
        };
        let found = |plans: &[Shared]| {
            plans
                .iter()
                .position(|p| p.id == id && p.indexes == indexes)
                .map(|k| (k as u32, plans[k].plan.clone()))
        };
        if let Some((k, r)) = found(&self.lock()) {
            return r.map(|p| (k, p));
        }
        // Ask the source without holding the lock (it may block on HTTP).
        let file = source
            .descriptor(id)
            .map_err(|e| RecordError::decode(e.to_string()))?;
        let plan = match source::message_at(&file, indexes) {
            None => Err(RecordError::decode(format!(
                "Protobuf schema id {id}: the message indexes {indexes:?} name no message in `{}`",
                file.name()
            ))),
            Some(msg) => plan::compile(
                &msg,
                &self.columns,
                &self.options,
                &format!("Protobuf schema id {id}"),
            )
            .map(Arc::new)
            .map_err(|e| RecordError {
                column: match &e {
                    PlanError::Column { column, .. } => Some(column.clone()),
                    PlanError::Mapping(_) => None,
                },
                ..RecordError::decode(e.to_string())
            }),
        };
        let mut plans = self.lock();
        let (k, r) = match found(&plans) {
            Some(hit) => hit,
            None if plans.len() >= MAX_CACHED_PLANS => {
                return Err(RecordError::decode(format!(
                    "Protobuf schema id {id}: more than {MAX_CACHED_PLANS} schema ids and \
                     message types on one mapping"
                )));
            }
            None => {
                plans.push(Shared {
                    id,
                    indexes: indexes.to_vec(),
                    plan: plan.clone(),
                });
                ((plans.len() - 1) as u32, plan)
            }
        };
        r.map(|p| (k, p))
    }

    /// The plan of key `key` (from [`ProtoMapping::plan`]).
    fn plan_by_key(&self, key: u32) -> Result<Arc<Plan>, RecordError> {
        if let Schemas::Fixed { plan, .. } = &self.schemas {
            return Ok(Arc::clone(plan));
        }
        match self.lock().get(key as usize) {
            Some(s) => s.plan.clone(),
            None => Err(RecordError::decode(format!(
                "no Protobuf plan of key {key}"
            ))),
        }
    }

    /// A decoder for one pipeline thread.
    pub fn decoder(self: &Arc<Self>) -> ProtoDecoder {
        ProtoDecoder {
            plans: LocalPlans::new(self),
        }
    }

    /// An encoder for one pipeline thread.
    pub fn encoder(self: &Arc<Self>) -> ProtoRowEncoder {
        ProtoRowEncoder {
            plans: LocalPlans::new(self),
            scratch: decode::Scratch::default(),
        }
    }
}

/// What a Kafka value is: its plan, the plan's key, the frame's schema id
/// and the message bytes.
type ForValue<'p, 'a> = (&'p Plan, u32, Option<u32>, &'a [u8]);

/// A pipeline thread's plan cache: the last plan used, then the others it
/// has met, then the shared mapping (locked only on a miss).
struct LocalPlans {
    mapping: Arc<ProtoMapping>,
    /// `(key, schema id, indexes, plan)`.
    seen: Vec<(u32, u32, Vec<i32>, Arc<Plan>)>,
    last: usize,
    /// The current frame's message indexes (reused).
    indexes: Vec<i32>,
}

impl LocalPlans {
    fn new(mapping: &Arc<ProtoMapping>) -> Self {
        Self {
            mapping: Arc::clone(mapping),
            seen: Vec::new(),
            last: 0,
            indexes: Vec::with_capacity(framing::MAX_MESSAGE_INDEXES),
        }
    }

    /// The plan for one Kafka value, its key, schema id and message bytes.
    #[inline]
    fn for_value<'a>(&mut self, value: &'a [u8]) -> Result<ForValue<'_, 'a>, RecordError> {
        match &self.mapping.schemas {
            Schemas::Fixed { framing, .. } => {
                let (id, message) = match framing {
                    Framing::Plain => (None, value),
                    Framing::Confluent => {
                        let f = parse_frame(value, &mut self.indexes)
                            .map_err(|e| RecordError::decode(e.to_string()))?;
                        (Some(f.schema_id), f.message)
                    }
                };
                let Schemas::Fixed { plan, .. } = &self.mapping.schemas else {
                    unreachable!("matched Fixed")
                };
                Ok((plan, 0, id, message))
            }
            Schemas::Registry(_) => {
                let f = parse_frame(value, &mut self.indexes)
                    .map_err(|e| RecordError::decode(e.to_string()))?;
                let hit =
                    |s: &(u32, u32, Vec<i32>, Arc<Plan>)| s.1 == f.schema_id && s.2 == self.indexes;
                if !self.seen.get(self.last).is_some_and(hit) {
                    self.miss_frame(f.schema_id)?;
                }
                let s = &self.seen[self.last];
                Ok((&s.3, s.0, Some(f.schema_id), f.message))
            }
        }
    }

    #[cold]
    fn miss_frame(&mut self, id: u32) -> Result<(), RecordError> {
        if let Some(i) = self
            .seen
            .iter()
            .position(|s| s.1 == id && s.2 == self.indexes)
        {
            self.last = i;
            return Ok(());
        }
        let (key, plan) = self.mapping.plan(id, &self.indexes)?;
        self.seen.push((key, id, self.indexes.clone(), plan));
        self.last = self.seen.len() - 1;
        Ok(())
    }

    /// The plan of key `key`.
    #[inline]
    fn for_key(&mut self, key: u32) -> Result<&Plan, RecordError> {
        if matches!(self.mapping.schemas, Schemas::Fixed { .. }) {
            let Schemas::Fixed { plan, .. } = &self.mapping.schemas else {
                unreachable!("matched Fixed")
            };
            return Ok(plan);
        }
        if self.seen.get(self.last).is_none_or(|s| s.0 != key) {
            self.miss_key(key)?;
        }
        Ok(&self.seen[self.last].3)
    }

    #[cold]
    fn miss_key(&mut self, key: u32) -> Result<(), RecordError> {
        if let Some(i) = self.seen.iter().position(|s| s.0 == key) {
            self.last = i;
            return Ok(());
        }
        let plan = self.mapping.plan_by_key(key)?;
        // Ids and indexes are not needed on the key path.
        self.seen.push((key, u32::MAX, Vec::new(), plan));
        self.last = self.seen.len() - 1;
        Ok(())
    }
}

/// One Protobuf message: the bytes it borrows, its schema id (`None` for
/// plain messages) and the key of its plan in the mapping.
#[derive(Clone, Copy, Debug)]
pub struct ProtoRecord<'a> {
    message: &'a [u8],
    schema_id: Option<u32>,
    plan: u32,
}

impl<'a> ProtoRecord<'a> {
    /// The message bytes (after the Confluent header).
    pub fn message(&self) -> &'a [u8] {
        self.message
    }

    /// The schema id of its frame (`None` for a plain message).
    pub fn schema_id(&self) -> Option<u32> {
        self.schema_id
    }
}

/// The Protobuf `Decoder`: framing and plan lookup, one record per
/// message.
pub struct ProtoDecoder {
    plans: LocalPlans,
}

impl ProtoDecoder {
    /// The record of one Kafka value.
    ///
    /// # Errors
    /// A Decode [`RecordError`]: tombstone, bad framing, unknown schema id
    /// or one that cannot be planned.
    pub fn decode_value<'a>(
        &mut self,
        value: Option<&'a [u8]>,
    ) -> Result<ProtoRecord<'a>, RecordError> {
        let value =
            value.ok_or_else(|| RecordError::decode("tombstone: the message has no value"))?;
        let (_, plan, schema_id, message) = self.plans.for_value(value)?;
        Ok(ProtoRecord {
            message,
            schema_id,
            plan,
        })
    }
}

impl Decoder for ProtoDecoder {
    type Record<'a> = ProtoRecord<'a>;

    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<ProtoRecord<'a>>,
    {
        let r = self.decode_value(cx.payload.value)?;
        next.push(r, cx)
    }
}

/// The Protobuf-to-RowBinary encoder for one pipeline thread: one record
/// (or one Kafka value), one row; it holds the thread's plan cache and
/// the decoder's scratch.
pub struct ProtoRowEncoder {
    plans: LocalPlans,
    scratch: decode::Scratch,
}

impl std::fmt::Debug for ProtoRowEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtoRowEncoder")
            .field("mapping", &self.plans.mapping)
            .finish_non_exhaustive()
    }
}

impl ProtoRowEncoder {
    /// [`ProtoMapping::fixed`], then its encoder.
    ///
    /// # Errors
    /// As [`ProtoMapping::fixed`].
    pub fn fixed(
        message: &MessageDescriptor,
        framing: Framing,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
        schema: &str,
    ) -> Result<Self, PlanError> {
        Ok(ProtoMapping::fixed(message, framing, columns, options, schema)?.encoder())
    }

    /// [`ProtoMapping::from_descriptor_set`], then its encoder.
    ///
    /// # Errors
    /// As [`ProtoMapping::from_descriptor_set`].
    pub fn from_descriptor_set(
        path: &Path,
        message_name: &str,
        framing: Framing,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
    ) -> Result<Self, ProtoError> {
        Ok(
            ProtoMapping::from_descriptor_set(path, message_name, framing, columns, options)?
                .encoder(),
        )
    }

    /// [`ProtoMapping::confluent`], then its encoder.
    ///
    /// # Errors
    /// As [`ProtoMapping::confluent`].
    pub fn confluent(
        source: Arc<dyn ProtoSchemaSource>,
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
    ) -> Result<Self, MappingError> {
        Ok(ProtoMapping::confluent(source, columns, options)?.encoder())
    }

    /// The INSERT's columns, in order.
    pub fn columns(&self) -> &[ColumnSpec] {
        self.plans.mapping.columns()
    }

    /// Whether rows are `RowBinaryWithDefaults` (some column has
    /// [`MissingValue::ServerDefault`]); the INSERT must name the same
    /// format ([`spate_row::schema::row_format`]).
    pub fn with_defaults(&self) -> bool {
        self.plans.mapping.with_defaults()
    }

    /// Appends the row for one Kafka value (framing and all) to `buf`.
    ///
    /// # Errors
    /// [`RecordError`]: Decode for a frame or message that does not parse
    /// or a schema id that cannot be had or planned (naming it), Encode
    /// naming the column for a value that cannot be written or a missing
    /// field. `buf` may then hold part of the row; truncate it.
    pub fn encode_message(&mut self, value: &[u8], buf: &mut Vec<u8>) -> Result<(), RecordError> {
        let (plan, _, _, message) = self.plans.for_value(value)?;
        decode::decode_row(plan, &mut self.scratch, message, buf).map_err(|f| row_error(plan, f))
    }

    /// Appends the row for one decoded record to `buf`.
    ///
    /// # Errors
    /// As [`ProtoRowEncoder::encode_message`] (after framing).
    pub fn encode_record(
        &mut self,
        record: &ProtoRecord<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let plan = self.plans.for_key(record.plan)?;
        decode::decode_row(plan, &mut self.scratch, record.message, buf)
            .map_err(|f| row_error(plan, f))
    }
}

#[cold]
fn row_error(plan: &Plan, f: decode::Fail) -> RecordError {
    match f {
        decode::Fail::Wire(reason) => RecordError::decode(format!(
            "{}, message `{}`: {reason}",
            plan.schema, plan.message
        )),
        decode::Fail::Value(col, reason) => {
            let c = &plan.cols[col as usize];
            RecordError::encode(
                &c.name,
                format!("{}, field `{}`: {reason}", plan.schema, c.field),
            )
        }
        decode::Fail::Missing(col) => {
            let c = &plan.cols[col as usize];
            RecordError::encode(
                &c.name,
                format!(
                    "{}, field `{}`: absent, and the column is not Nullable and has no \
                     DEFAULT spate can apply",
                    plan.schema, c.field
                ),
            )
        }
    }
}

impl<'a> Encoder<ProtoRecord<'a>> for ProtoRowEncoder {
    fn encode(
        &mut self,
        record: &ProtoRecord<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.encode_record(record, buf)
    }
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

impl spate_row::filter::RowColumns for ProtoRowEncoder {
    fn row_columns(&self) -> &[ColumnSpec] {
        self.columns()
    }

    fn row_format(&self) -> spate_row::schema::RowFormat {
        spate_row::schema::RowFormat::of(self.with_defaults())
    }
}
