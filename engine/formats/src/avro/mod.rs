//! Avro to RowBinary: Confluent-framed or plain Avro datums become rows of
//! the table's INSERT columns, decoded straight into the shard's chunk
//! buffer with no `apache_avro::types::Value` and no per-record allocation.
//!
//! **Framing** ([`framing`]): the Confluent wire format (magic byte 0, the
//! schema id as a big-endian u32, then the datum:
//! <https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format>),
//! the writer schema fetched by id from a [`SchemaSource`] (the registry
//! client, or [`FileSchemaSource`]); or a plain datum whose one writer
//! schema comes from a file ([`AvroMapping::plain`]).
//!
//! **Plans** ([`plan`]): apache-avro parses the writer schema; [`compile`]
//! turns it and the table's [`ColumnSpec`]s (as [`spate_row::schema::plan_insert`]
//! builds them for JSON: renames and pointer paths, `missing`) into a
//! decode program. Fields map onto columns by name as JSON's do (paths
//! `/a/b` into nested records, the flatten join); what cannot carry
//! exactly is a [`PlanError`] naming the schema id, the field and the
//! column. Plans are cached per schema id: once in the shared
//! [`AvroMapping`] (behind a lock, asked on a miss only) and again in each
//! pipeline thread's decoder, encoder and router (no lock on the hot path).
//!
//! **The chain**: [`AvroDecoder`] (`Decoder`) parses the framing, finds the
//! plan and pushes one [`AvroRecord`] per message, or with `explode` one
//! per element of the array (an empty array pushes none: the message
//! resolves as filtered, D1/D6); records borrow the payload (the datum and
//! an element's byte range). [`AvroRowEncoder`] (`Encoder<AvroRecord>`)
//! writes the row: the parent's fields before the array, the element's
//! fields, the parent's fields after the array, each column once and, when
//! the schema's field order is the INSERT's ([`Plan::is_direct`]), with no
//! copy; otherwise through reused spans and one permutation.
//! [`AvroRouter`] (`Router<AvroRecord>`) shards by an Avro field, the Kafka
//! key, or round robin, hashing as [`crate::json::route`] documents.
//!
//! **Errors**: a payload that is not a framed datum, an unknown schema id,
//! a registry failure, a schema that cannot be planned, a truncated datum:
//! a Decode [`RecordError`] naming the schema id (and the field or column);
//! a value that does not fit its column: an Encode error naming the column.
//! The lane driver adds topic, partition and offset and applies `on_error`.
//!
//! **Kafka metadata columns** ([`ColumnSpec::meta`]: `_topic`, `_offset`,
//! `_key`, headers, ...) are written by [`spate_row::meta::encode_meta`]
//! from the record's message (an absent value follows the column's
//! `missing`), exactly as the JSON mapper writes them; their types are
//! checked when the plan is compiled.
//!
//! `tests/it/avro_prop.rs` checks the decoder against apache-avro's own
//! decoding; spate-clickhouse's `tests/it/no_alloc.rs` counts allocations per row (zero);
//! `spate_testkit::sensor::avro` is the benchmark workload's generator.

mod exec;
pub mod framing;
pub mod plan;
mod route;
pub mod source;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use apache_avro::Schema;
use spate_core::pipeline::chain::{
    Decoder, Encoder, RecordCx, RecordError, RecordErrorKind, Stage,
};

pub use plan::{AvroOptions, Plan, PlanError, compile};
pub use route::AvroRouter;
pub use source::{
    FileSchemaSource, SchemaError, SchemaErrorKind, SchemaSource, parse_schema, read_schema_file,
};

use exec::{At, Element, Fail, RowFail, Scratch};
use spate_core::record::Payload;
use spate_row::spec::{ColumnSpec, MissingValue};

/// Where a mapping's writer schemas come from.
enum Schemas {
    /// Confluent framing: by the id in each message.
    Registry(Arc<dyn SchemaSource>),
    /// Plain datums: one schema, planned at build.
    Plain(Arc<Plan>),
}

/// One table's Avro mapping, shared by every pipeline thread: the columns,
/// the options, the schema source and the plans compiled so far (by
/// schema id). Build one per pipeline, then a decoder, an encoder and a
/// router per thread.
pub struct AvroMapping {
    columns: Vec<ColumnSpec>,
    options: AvroOptions,
    schemas: Schemas,
    plans: Mutex<HashMap<u32, Result<Arc<Plan>, PlanError>>>,
}

impl std::fmt::Debug for AvroMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AvroMapping")
            .field("columns", &self.columns.len())
            .field("options", &self.options)
            .field(
                "framing",
                &match self.schemas {
                    Schemas::Registry(_) => "confluent",
                    Schemas::Plain(_) => "plain",
                },
            )
            .finish()
    }
}

/// Why a schema id has no plan.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AvroMappingError {
    /// The schema source failed.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The schema cannot be mapped.
    #[error(transparent)]
    Plan(#[from] PlanError),
}

impl AvroMappingError {
    /// As a Decode record error (naming the schema id, and the column for a
    /// plan error that has one).
    pub fn record_error(&self) -> RecordError {
        RecordError {
            kind: RecordErrorKind::Decode,
            column: match self {
                AvroMappingError::Plan(p) => p.column.clone(),
                AvroMappingError::Schema(_) => None,
            },
            reason: self.to_string(),
        }
    }
}

impl AvroMapping {
    /// A mapping for Confluent-framed messages whose writer schemas come
    /// from `source` by id (asked once per new id, on a miss).
    ///
    /// # Errors
    /// [`PlanError`] for an empty column list.
    pub fn confluent(
        columns: Vec<ColumnSpec>,
        options: AvroOptions,
        source: Arc<dyn SchemaSource>,
    ) -> Result<Arc<Self>, PlanError> {
        if columns.is_empty() {
            return Err(PlanError {
                schema_id: None,
                field: None,
                column: None,
                reason: "a mapping needs at least one column".into(),
            });
        }
        Ok(Arc::new(Self {
            columns,
            options,
            schemas: Schemas::Registry(source),
            plans: Mutex::new(HashMap::new()),
        }))
    }

    /// A mapping for plain datums (no framing) of one writer schema, e.g.
    /// from a `schema_file`; planned now.
    ///
    /// # Errors
    /// [`PlanError`] when the schema cannot fill the columns.
    pub fn plain(
        columns: Vec<ColumnSpec>,
        options: AvroOptions,
        schema: Arc<Schema>,
    ) -> Result<Arc<Self>, PlanError> {
        let plan = Arc::new(compile(None, schema, &columns, &options)?);
        Ok(Arc::new(Self {
            columns,
            options,
            schemas: Schemas::Plain(plan),
            plans: Mutex::new(HashMap::new()),
        }))
    }

    /// The INSERT's columns.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// The options.
    pub fn options(&self) -> &AvroOptions {
        &self.options
    }

    /// Whether rows are `RowBinaryWithDefaults` (some column has
    /// [`MissingValue::ServerDefault`]); the INSERT must name that format.
    pub fn with_defaults(&self) -> bool {
        self.columns
            .iter()
            .any(|c| c.missing == MissingValue::ServerDefault)
    }

    /// The plan for schema id `id` (`None`: the plain schema), compiled on
    /// first use and kept; a plan error is kept too (the schema does not
    /// change under its id), a schema-source error is not (asked again
    /// next time). Blocks while the source is asked. Call it at start-up
    /// to fail early on a known id.
    ///
    /// # Errors
    /// [`AvroMappingError`]: the source's error, or the plan error.
    pub fn plan(&self, id: Option<u32>) -> Result<Arc<Plan>, AvroMappingError> {
        let source = match (&self.schemas, id) {
            (Schemas::Plain(p), _) => return Ok(Arc::clone(p)),
            (Schemas::Registry(_), None) => {
                return Err(AvroMappingError::Plan(PlanError {
                    schema_id: None,
                    field: None,
                    column: None,
                    reason: "a Confluent-framed mapping needs a schema id".into(),
                }));
            }
            (Schemas::Registry(s), Some(_)) => s,
        };
        let id = id.expect("matched Some");
        if let Some(r) = self.lock().get(&id) {
            return r.clone().map_err(AvroMappingError::Plan);
        }
        // Ask the source without holding the lock (it may block on HTTP).
        let schema = source.schema(id)?;
        let r = compile(Some(id), schema, &self.columns, &self.options).map(Arc::new);
        self.lock()
            .entry(id)
            .or_insert(r)
            .clone()
            .map_err(AvroMappingError::Plan)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Result<Arc<Plan>, PlanError>>> {
        self.plans.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_confluent(&self) -> bool {
        matches!(self.schemas, Schemas::Registry(_))
    }

    /// A decoder for one pipeline thread.
    pub fn decoder(self: &Arc<Self>) -> AvroDecoder {
        AvroDecoder {
            confluent: self.is_confluent(),
            plans: LocalPlans::new(self),
            elements: Vec::new(),
        }
    }

    /// An encoder for one pipeline thread.
    pub fn encoder(self: &Arc<Self>) -> AvroRowEncoder {
        AvroRowEncoder {
            plans: LocalPlans::new(self),
            scratch: Scratch {
                spans: vec![(0, 0); self.columns.len()],
                ..Scratch::default()
            },
        }
    }
}

/// A pipeline thread's plan cache: the last plan used, then the others it
/// has met, then the shared mapping (locked only on a miss).
struct LocalPlans {
    mapping: Arc<AvroMapping>,
    last: Option<(Option<u32>, Arc<Plan>)>,
    seen: Vec<(Option<u32>, Arc<Plan>)>,
}

impl LocalPlans {
    fn new(mapping: &Arc<AvroMapping>) -> Self {
        Self {
            mapping: Arc::clone(mapping),
            last: None,
            seen: Vec::new(),
        }
    }

    #[inline]
    fn get(&mut self, id: Option<u32>) -> Result<&Plan, RecordError> {
        if !matches!(&self.last, Some((l, _)) if *l == id) {
            self.miss(id)?;
        }
        Ok(&self.last.as_ref().expect("set by miss").1)
    }

    #[cold]
    fn miss(&mut self, id: Option<u32>) -> Result<(), RecordError> {
        let plan = match self.seen.iter().find(|(i, _)| *i == id) {
            Some((_, p)) => Arc::clone(p),
            None => {
                let p = self.mapping.plan(id).map_err(|e| e.record_error())?;
                self.seen.push((id, Arc::clone(&p)));
                p
            }
        };
        self.last = Some((id, plan));
        Ok(())
    }
}

/// One record of an Avro message: the datum it borrows and, when the plan
/// fans out, which element of the array it is.
#[derive(Clone, Copy, Debug)]
pub struct AvroRecord<'a> {
    datum: &'a [u8],
    schema_id: Option<u32>,
    element: Option<Element>,
}

impl<'a> AvroRecord<'a> {
    /// The whole datum (after the Confluent header).
    pub fn datum(&self) -> &'a [u8] {
        self.datum
    }

    /// The writer schema id (`None` for a plain datum).
    pub fn schema_id(&self) -> Option<u32> {
        self.schema_id
    }

    /// The byte range of this record's array element within
    /// [`AvroRecord::datum`], when fanned out.
    pub fn element_range(&self) -> Option<std::ops::Range<usize>> {
        self.element.map(|e| e.start as usize..e.end as usize)
    }
}

/// The Avro `Decoder`: framing, plan lookup and fan-out (see the module
/// docs).
pub struct AvroDecoder {
    confluent: bool,
    plans: LocalPlans,
    elements: Vec<Element>,
}

fn schema_name(id: Option<u32>) -> String {
    match id {
        Some(id) => format!("Avro schema id {id}"),
        None => "Avro datum (schema file)".into(),
    }
}

impl AvroDecoder {
    /// Decodes one message value into its records, pushed to `push` (the
    /// chain calls it through [`Decoder::decode`]).
    ///
    /// # Errors
    /// A Decode [`RecordError`] (tombstone, bad framing, unknown schema id,
    /// plan error, a malformed array under `explode`), or what `push`
    /// returns.
    pub fn decode_value<'a>(
        &mut self,
        value: Option<&'a [u8]>,
        mut push: impl FnMut(AvroRecord<'a>) -> Result<(), RecordError>,
    ) -> Result<(), RecordError> {
        let value =
            value.ok_or_else(|| RecordError::decode("tombstone: the message has no value"))?;
        let (schema_id, datum) = if self.confluent {
            let (id, d) = framing::parse(value).map_err(|e| RecordError::decode(e.to_string()))?;
            (Some(id), d)
        } else {
            (None, value)
        };
        if u32::try_from(datum.len()).is_err() {
            return Err(RecordError::decode(format!(
                "{}: a datum of {} bytes, more than 4 GiB",
                schema_name(schema_id),
                datum.len()
            )));
        }
        let plan = self.plans.get(schema_id)?;
        let Some(ex) = &plan.explode else {
            return push(AvroRecord {
                datum,
                schema_id,
                element: None,
            });
        };
        plan.elements(datum, &mut self.elements).map_err(|f| {
            RecordError::decode(format!(
                "{}: field `{}` (mapping.explode): {}",
                schema_name(schema_id),
                ex.field,
                f.describe(None)
            ))
        })?;
        for e in &self.elements {
            push(AvroRecord {
                datum,
                schema_id,
                element: Some(*e),
            })?;
        }
        Ok(())
    }
}

impl Decoder for AvroDecoder {
    type Record<'a> = AvroRecord<'a>;

    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<AvroRecord<'a>>,
    {
        self.decode_value(cx.payload.value, |r| next.push(r, cx))
    }
}

/// The Avro `Encoder`: one record, one row (see the module docs).
pub struct AvroRowEncoder {
    plans: LocalPlans,
    scratch: Scratch,
}

impl AvroRowEncoder {
    /// The INSERT's columns.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.plans.mapping.columns
    }

    /// Whether rows are `RowBinaryWithDefaults`.
    pub fn with_defaults(&self) -> bool {
        self.plans.mapping.with_defaults()
    }

    /// Appends `record`'s row to `buf`.
    ///
    /// # Errors
    /// [`RecordError`]: Decode for a malformed datum (naming the schema id
    /// and the field), Encode naming the column for a value that does not
    /// fit it. `buf` may then hold part of the row: truncate it.
    pub fn encode_row(
        &mut self,
        record: &AvroRecord<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.write(record, None, buf)
    }

    /// [`AvroRowEncoder::encode_row`] with the Kafka message the record
    /// came from, for metadata columns ([`ColumnSpec::meta`]; without it
    /// such a column is a record error). The chain's `Encoder` calls this.
    ///
    /// # Errors
    /// As [`AvroRowEncoder::encode_row`], and Encode naming the column for
    /// metadata that does not fit it ([`spate_row::meta::encode_meta`]).
    pub fn encode_message(
        &mut self,
        record: &AvroRecord<'_>,
        message: &Payload<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.write(record, Some(message), buf)
    }

    #[inline]
    fn write(
        &mut self,
        record: &AvroRecord<'_>,
        message: Option<&Payload<'_>>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let plan = self.plans.get(record.schema_id)?;
        plan.write_row(
            record.datum,
            record.element.as_ref(),
            buf,
            &mut self.scratch,
            message,
        )
        .map_err(|e| match e {
            RowFail::At(at, f) => row_error(plan, record.schema_id, at, f),
            RowFail::Meta(m) => m,
        })
    }
}

#[cold]
fn row_error(plan: &Plan, id: Option<u32>, at: At, f: Fail) -> RecordError {
    let kind = if f.is_decode() {
        RecordErrorKind::Decode
    } else {
        RecordErrorKind::Encode
    };
    let who = schema_name(id);
    match at {
        At::Column(c) => {
            let col = &plan.columns[c as usize];
            let field = plan.col_fields[c as usize]
                .as_deref()
                .map(|f| format!(", field `{f}`"))
                .unwrap_or_default();
            RecordError {
                kind,
                column: Some(col.name.clone()),
                reason: format!("{who}{field}: {}", f.describe(Some(&col.ty))),
            }
        }
        At::Field(i) => RecordError {
            kind,
            column: None,
            reason: format!(
                "{who}, field `{}`: {}",
                plan.fields[i as usize],
                f.describe(None)
            ),
        },
        At::Datum => RecordError {
            kind,
            column: None,
            reason: format!("{who}: {}", f.describe(None)),
        },
    }
}

impl<'a> Encoder<AvroRecord<'a>> for AvroRowEncoder {
    fn encode(
        &mut self,
        record: &AvroRecord<'a>,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.write(record, Some(&cx.payload), buf)
    }
}

#[cfg(test)]
mod tests;

impl spate_row::filter::RowColumns for AvroRowEncoder {
    fn row_columns(&self) -> &[ColumnSpec] {
        self.columns()
    }

    fn row_format(&self) -> spate_row::schema::RowFormat {
        spate_row::schema::RowFormat::of(self.with_defaults())
    }
}
