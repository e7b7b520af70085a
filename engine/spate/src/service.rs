//! Assembles one pipeline from a [`Config`]: the schema probe that plans the
//! INSERT, the ClickHouse writer, the JSON mapper, the Kafka source, the
//! optional dead-letter producer, and the [`Pipeline`] itself.
//!
//! Start-up order follows docs/DESIGN.md "Control": the table's columns are
//! read from the first replica that answers (the plan every replica is then
//! probed against by the pipeline's own start-up probe), so a table missing a
//! column or a type the encoder cannot write fails before any offset moves.

use std::sync::Arc;

use spate_clickhouse::writer::{
    Credentials, HttpWriter, HttpWriterConfig, SchemaProbeError, TlsOptions, tls,
};
use spate_core::pipeline::chain::{Decoder, PayloadDecoder, RecordCx, RecordError, Stage};
use spate_core::pipeline::driver::{ChainProcessor, Processor};
use spate_core::pipeline::lines::LinesDecoder;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{DeadLetter, Pipeline, PipelineConfig};
use spate_core::record::Payload;
use spate_formats::json::JsonRowEncoder;
use spate_formats::json::explode::{ExplodeDecoder, ExplodeEncoder};
use spate_formats::json::live::{JsonLive, LiveEncoder, LiveExplodeEncoder, check_columns};
use spate_formats::json::route::ShardRouter;
use spate_kafka::{KafkaDeadLetter, KafkaSource};
use spate_row::coerce::TimeRules;
use spate_row::filter::{FilterExpr, Filtered, RowFilter};
use spate_row::plan::LivePlan;
use spate_row::schema::{
    InsertOptions, RowFormat, TableSchema, per_row_defaults_refused, plan_insert, row_format,
};
use spate_row::spec::{ColumnOptions, ColumnSpec, MappingOptions, MissingValue};

use crate::config::{Config, ConfigError, JsonMode, TlsSection};
pub use crate::error::ServiceError;
use crate::schema_formats::{
    AvroChain, FormatPlan, ProtoChain, avro_chain, plan_format, proto_chain,
};

/// The INSERT plan: the table's schema and the columns the INSERT names.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The table as `system.columns` describes it.
    pub schema: TableSchema,
    /// The INSERT's columns in order, with their JSON sources.
    pub columns: Vec<ColumnSpec>,
    /// The mapper's options.
    pub options: MappingOptions,
    /// The rows' wire format (RowBinaryWithDefaults when a per-row DEFAULT
    /// is left to the server); the writer names it in the INSERT.
    pub row_format: RowFormat,
    /// How the columns were planned, kept to re-plan them live when the
    /// table changes ([`LivePlan`]).
    pub insert: InsertOptions,
    /// `mapping.filter`, checked against the columns.
    pub filter: Option<FilterExpr>,
    /// `mapping.explode` as path segments.
    pub explode: Option<Vec<String>>,
    /// How messages decode (`format`): JSON, or the Avro/Protobuf plan.
    pub format: FormatPlan,
}

impl Plan {
    /// `(name, type text)` of each INSERT column, for the writer's probe.
    pub fn typed_columns(&self) -> Vec<(String, String)> {
        spate_row::plan::typed_columns(&self.schema, &self.columns)
    }

    /// The live plan the writer and the pipeline threads share, starting
    /// from this one.
    pub fn live(&self) -> Arc<LivePlan> {
        LivePlan::new(
            self.schema.clone(),
            self.columns.clone(),
            self.insert.clone(),
            self.options.clone(),
            check_columns,
        )
    }

    /// What a row missing column `c`'s field gets, in words.
    pub fn when_missing(&self, c: &ColumnSpec) -> String {
        match &c.missing {
            MissingValue::Null => "NULL".into(),
            MissingValue::Literal(lit) if self.insert.defaults.contains_key(&c.name) => {
                format!("{lit} (mapping.defaults, written by spate; also for a null)")
            }
            MissingValue::Literal(lit) => format!("DEFAULT {lit} (written by spate)"),
            MissingValue::ServerDefault => "the server's DEFAULT (RowBinaryWithDefaults)".into(),
            MissingValue::Reject => "record error (on_error)".into(),
        }
    }

    /// DEFAULT columns whose per-row DEFAULT cannot be applied to a record
    /// missing the field (the server lacks RowBinaryWithDefaults): such a
    /// record is a record error. `(column, expression)`.
    pub fn refused_defaults(&self) -> Vec<(String, String)> {
        per_row_defaults_refused(&self.schema, &self.columns)
    }

    /// How column `c` is sourced, in words: (source field, rule).
    pub fn describe(&self, c: &ColumnSpec) -> (String, &'static str) {
        if let Some(m) = &c.meta {
            let how = if self.insert.pointers.contains_key(&c.name) {
                "kafka metadata"
            } else {
                "kafka metadata (by name)"
            };
            return (m.to_string(), how);
        }
        if let Some(path) = &self.explode {
            let pointed = self.insert.pointers.contains_key(&c.name);
            return match &c.path {
                Some(p) if pointed && p.len() > path.len() && p.starts_with(path) => {
                    (format!("/{}", p.join("/")), "element (pointer)")
                }
                Some(p) if pointed => (format!("/{}", p.join("/")), "record (pointer)"),
                Some(p) => (p.join("/"), "element or record (rename)"),
                None => (c.name.clone(), "element or record (name)"),
            };
        }
        match &c.path {
            Some(p) if p.len() == 1 => (p[0].clone(), "rename"),
            Some(p) => (format!("/{}", p.join("/")), "pointer"),
            None if self.options.flatten_join.is_some() => (c.name.clone(), "name (flattened)"),
            None => (c.name.clone(), "name"),
        }
    }
}

/// The ClickHouse setting that lets RowBinary input carry a `JSON` column's
/// value as JSON text (a String).
pub const JSON_AS_STRING: &str = "input_format_binary_read_json_as_string";

/// The writer's config for `config`, with `columns` (empty for the schema
/// probe itself).
///
/// # Errors
/// [`ConfigError::Invalid`](crate::config::ConfigError::Invalid) naming
/// `sink.clickhouse.tls.ca_file` when the CA file cannot be used, or the
/// compression key when it is invalid.
pub fn writer_config(
    config: &Config,
    columns: Vec<(String, String)>,
) -> Result<HttpWriterConfig, ServiceError> {
    let ch = &config.sink.clickhouse;
    let mut w = HttpWriterConfig::new(&ch.database, &ch.table, columns);
    w.compression = ch.compression()?;
    w.format = ch.format.insert_format();
    w.schema_refresh = Some(
        ch.schema_refresh
            .map_or(spate_clickhouse::writer::DEFAULT_SCHEMA_REFRESH, |d| d.0),
    );
    if ch.tls != TlsSection::default() {
        let options = TlsOptions {
            ca_file: ch.tls.ca_file.clone(),
            insecure: ch.tls.insecure,
        };
        let tls = tls::client_config(&options).map_err(|e| ConfigError::Invalid {
            key: "sink.clickhouse.tls.ca_file".into(),
            reason: e.to_string(),
        })?;
        if ch.tls.insecure {
            tracing::warn!(
                "sink.clickhouse.tls.insecure is set: https:// replicas are not verified"
            );
        }
        w.tls = Some(tls);
    }
    w.credentials = ch.user.as_ref().map(|user| Credentials {
        user: user.clone(),
        password: ch.password.clone().unwrap_or_default(),
    });
    w.insert_settings = ch
        .settings
        .iter()
        .map(|(k, v)| (k.clone(), v.to_param()))
        .collect();
    // JSON columns get their values as JSON text in a RowBinary String
    // (https://clickhouse.com/docs/interfaces/formats/RowBinary, format
    // settings); a user's own value for the setting wins.
    let json = w
        .columns
        .iter()
        .any(|(_, t)| spate_row::types::ChType::parse(t).is_ok_and(|t| t.contains_json()));
    if json && !ch.settings.contains_key(JSON_AS_STRING) {
        w.insert_settings
            .push((JSON_AS_STRING.to_owned(), "1".to_owned()));
    }
    w.query_timeout = config.pipeline_config().sink.write_timeout;
    w.effectively_once = effectively_once(config);
    Ok(w)
}

/// Whether `config` asks for `pipeline.delivery: effectively_once`.
pub fn effectively_once(config: &Config) -> bool {
    config.pipeline_config().delivery == spate_core::pipeline::Delivery::EffectivelyOnce
}

/// Reads the table's columns from the first replica that answers and plans
/// the INSERT.
///
/// # Errors
/// [`ServiceError::Probe`] when no replica answers, [`ServiceError::Mapping`]
/// when the columns cannot be mapped.
pub async fn plan(config: &Config) -> Result<Plan, ServiceError> {
    let ch = &config.sink.clickhouse;
    let probe = HttpWriter::new(writer_config(config, Vec::new())?);
    let schema = probe_schema(config, &probe).await?;
    let server_defaults = server_defaults(config, &probe).await;
    let insert = insert_options(config, server_defaults)?;
    let mapping_err = |reason: String| ServiceError::Mapping {
        table: ch.table.clone(),
        reason,
    };
    let columns = plan_insert(&schema, &insert).map_err(|e| mapping_err(e.to_string()))?;
    let options = config.mapping_options();
    // Build one encoder now so a bad DEFAULT literal fails here, not on a
    // pipeline thread.
    JsonRowEncoder::new(columns.clone(), options.clone())
        .map_err(|e| mapping_err(e.to_string()))?;
    // The filter too: a name that is no column, a constant its column's
    // type cannot hold.
    let filter = config.mapping.filter_expr()?;
    if let Some(f) = &filter {
        RowFilter::compile(f, &columns, row_format(&columns), &options.time)
            .map_err(|e| mapping_err(e.to_string()))?;
    }
    let explode = config.mapping.explode_path()?;
    let format = plan_format(config, &columns, &options, explode.clone(), filter.as_ref())?;
    if let (Some(path), FormatPlan::Json) = (&explode, &format) {
        // The fan-out split of the columns (element / record / either).
        let pointed = insert.pointers.keys().cloned().collect();
        ExplodeEncoder::new(columns.clone(), options.clone(), path, &pointed)
            .map_err(|e| mapping_err(format!("mapping.explode: {e}")))?;
    }
    let plan = Plan {
        format,
        row_format: row_format(&columns),
        schema,
        columns,
        options,
        insert,
        filter,
        explode,
    };
    warn_about(config, &plan);
    Ok(plan)
}

/// The table's schema from the first replica that answers.
///
/// # Errors
/// [`ServiceError::Probe`] with each replica's error when none answers.
async fn probe_schema(config: &Config, probe: &HttpWriter) -> Result<TableSchema, ServiceError> {
    let ch = &config.sink.clickhouse;
    let mut errors = Vec::new();
    for url in ch.shards.iter().flatten() {
        match probe.table_schema(url).await {
            Ok(s) => return Ok(s),
            Err(SchemaProbeError::Query(e)) => {
                errors.push(format!("{url}: {}", e.describe("schema probe")));
            }
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    Err(ServiceError::Probe {
        database: ch.database.clone(),
        table: ch.table.clone(),
        errors: errors.join("; "),
    })
}

/// Whether per-row DEFAULTs go to the server: only if every replica
/// answers that it accepts RowBinaryWithDefaults (an insert may land on
/// any), and at least one answers.
async fn server_defaults(config: &Config, probe: &HttpWriter) -> bool {
    let mut server_defaults = true;
    let mut answered = false;
    for url in config.sink.clickhouse.shards.iter().flatten() {
        match probe.accepts_row_binary_with_defaults(url).await {
            Ok(yes) => {
                answered = true;
                server_defaults &= yes;
            }
            Err(e) => {
                tracing::warn!(
                    replica = %url,
                    "cannot ask for RowBinaryWithDefaults ({e}); per-row DEFAULTs stay refused"
                );
                server_defaults = false;
            }
        }
    }
    server_defaults && answered
}

/// How the INSERT's columns are planned from `mapping`.
///
/// # Errors
/// A `mapping.defaults` literal that is not valid.
fn insert_options(config: &Config, server_defaults: bool) -> Result<InsertOptions, ServiceError> {
    Ok(InsertOptions {
        renames: config.mapping.rename.clone(),
        pointers: config.mapping.columns.clone(),
        include_default_columns: config.mapping.include_default_columns,
        server_defaults,
        column_options: config
            .mapping
            .column_options
            .iter()
            .map(|(col, o)| {
                (
                    col.clone(),
                    ColumnOptions {
                        epoch_unit: o.epoch_unit.map(|u| u.unit()),
                        empty_as_null: o.empty_as_null,
                        ..ColumnOptions::default()
                    },
                )
            })
            .collect(),
        defaults: config.mapping.default_literals()?,
    })
}

/// The start-up warnings of a plan: an option that does nothing any more,
/// and each DEFAULT this server cannot apply per row.
fn warn_about(config: &Config, plan: &Plan) {
    if config.mapping.include_default_columns {
        tracing::warn!(
            "mapping.include_default_columns has no effect any more: DEFAULT columns are \
             always in the INSERT, so a field present in a record lands"
        );
    }
    for (column, expr) in plan.refused_defaults() {
        tracing::warn!(
            %column,
            default = %expr,
            "DEFAULT is computed per row and the server has no RowBinaryWithDefaults: \
             a record without this field is a record error (on_error), not the DEFAULT"
        );
    }
}

/// How a message becomes JSON records, per `format.json.mode`: the whole
/// message (`object`) or each line ([`LinesDecoder`], `ndjson`).
#[derive(Clone, Copy, Debug)]
pub enum MessageDecoder {
    /// One object per message.
    Object,
    /// One object per line.
    Ndjson,
}

impl MessageDecoder {
    /// The decoder `config`'s `format.json.mode` names.
    pub fn of(config: &Config) -> Self {
        match config.format.json().mode {
            JsonMode::Object => MessageDecoder::Object,
            JsonMode::Ndjson => MessageDecoder::Ndjson,
        }
    }
}

impl Decoder for MessageDecoder {
    type Record<'a> = Payload<'a>;

    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<Payload<'a>>,
    {
        match self {
            MessageDecoder::Object => PayloadDecoder.decode(cx, next),
            MessageDecoder::Ndjson => LinesDecoder.decode(cx, next),
        }
    }
}

/// The JSON chain: one row per record (message or NDJSON line), kept by
/// `mapping.filter`, routed by `sink.clickhouse.shard_key` (round robin
/// without one).
pub type JsonChain = ChainProcessor<MessageDecoder, Terminal<Filtered<LiveEncoder>, ShardRouter>>;

/// The JSON chain with `mapping.explode`: one row per array element.
pub type JsonExplodeChain =
    ChainProcessor<ExplodeDecoder, Terminal<Filtered<LiveExplodeEncoder>, ShardRouter>>;

/// The chain of one pipeline thread. One branch per payload picks the
/// shape; each arm is one monomorphised chain.
// One chain per pipeline thread, built once: its size does not matter, an
// indirection on every payload would.
#[allow(clippy::large_enum_variant)]
pub enum Chain {
    /// JSON, one row per record.
    Json(JsonChain),
    /// JSON with `mapping.explode`.
    JsonExploded(JsonExplodeChain),
    /// `format.avro`.
    Avro(AvroChain),
    /// `format.protobuf`.
    Protobuf(ProtoChain),
}

impl Processor for Chain {
    #[inline]
    fn process(&mut self, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        match self {
            Chain::Json(c) => c.process(cx),
            Chain::JsonExploded(c) => c.process(cx),
            Chain::Avro(c) => c.process(cx),
            Chain::Protobuf(c) => c.process(cx),
        }
    }

    fn buffers(&mut self) -> &mut ChunkBuffers {
        match self {
            Chain::Json(c) => c.buffers(),
            Chain::JsonExploded(c) => c.buffers(),
            Chain::Avro(c) => c.buffers(),
            Chain::Protobuf(c) => c.buffers(),
        }
    }

    #[inline]
    fn begin_poll_batch(&mut self) {
        match self {
            Chain::Json(c) => c.begin_poll_batch(),
            Chain::JsonExploded(c) => c.begin_poll_batch(),
            Chain::Avro(c) => c.begin_poll_batch(),
            Chain::Protobuf(c) => c.begin_poll_batch(),
        }
    }
}

/// A pipeline thread's JSON chain: [`Chain::Json`], or
/// [`Chain::JsonExploded`] with `explode` (pointer segments). `live`,
/// `filter` and `rules` were checked by [`plan`], so building cannot fail.
pub fn json_chain(
    live: &Arc<LivePlan>,
    explode: Option<&[String]>,
    decoder: MessageDecoder,
    filter: Option<FilterExpr>,
    rules: TimeRules,
    router: ShardRouter,
    buffers: ChunkBuffers,
) -> Chain {
    let checked = "the encoder and filter were checked by plan()";
    match explode {
        None => {
            let encoder = live.encoder().expect(checked);
            let encoder = Filtered::new(encoder, filter, rules).expect(checked);
            Chain::Json(ChainProcessor::new(
                decoder,
                Terminal::new(encoder, router, buffers),
            ))
        }
        Some(path) => {
            let encoder = live.explode_encoder(path.to_vec()).expect(checked);
            let encoder = Filtered::new(encoder, filter, rules).expect(checked);
            let decoder =
                ExplodeDecoder::new(path.to_vec(), matches!(decoder, MessageDecoder::Ndjson));
            Chain::JsonExploded(ChainProcessor::new(
                decoder,
                Terminal::new(encoder, router, buffers),
            ))
        }
    }
}

/// What a run of `config` with `plan` does, in one line: the insert's
/// `FORMAT` (as the writer planned it) and the delivery mode, e.g.
/// `inserts: FORMAT Native into default.flights; delivery: at_least_once
/// (...)`. `spate check` prints it and `spate run` logs it at start, so the
/// two can be compared (issue 31).
pub fn run_summary_line(config: &Config, insert_format: &str) -> String {
    let ch = &config.sink.clickhouse;
    let delivery = match config.pipeline.delivery {
        crate::config::DeliveryName::AtLeastOnce => {
            "at_least_once (nothing lost; a replay after a crash or rebalance may insert rows again \
             where the table does not deduplicate)"
        }
        crate::config::DeliveryName::EffectivelyOnce => {
            "effectively_once (per-partition ranges recorded in the commit metadata; a replay \
             re-inserts the same bytes under the same token, dropped within the table's dedup window)"
        }
    };
    format!(
        "inserts: FORMAT {insert_format} into {}.{}; delivery: {delivery}",
        ch.database, ch.table
    )
}

/// The `FORMAT` the writer for `config` and `plan` inserts with (builds
/// the writer, which needs no runtime to be built).
///
/// # Errors
/// [`ServiceError`] from the writer's config (TLS, compression).
pub fn insert_format(config: &Config, plan: &Plan) -> Result<&'static str, ServiceError> {
    let mut wc = writer_config(config, plan.typed_columns())?;
    wc.row_format = plan.row_format;
    Ok(HttpWriter::new(wc).insert_format())
}

/// A pipeline assembled from a config, ready to run.
pub type SpatePipeline =
    Pipeline<KafkaSource, HttpWriter, Box<dyn Fn(ChunkBuffers) -> Chain + Send + Sync>>;

/// Builds the pipeline for `config` with the INSERT `plan`, and the
/// dead-letter producer when one is configured (flush it after the run).
///
/// # Errors
/// [`ServiceError`] from the Kafka client, the dead-letter producer or the
/// pipeline builder.
pub fn build(
    config: &Config,
    plan: &Plan,
) -> Result<(SpatePipeline, Option<Arc<KafkaDeadLetter>>), ServiceError> {
    let mut wc = writer_config(config, plan.typed_columns())?;
    wc.row_format = plan.row_format;
    // The writer re-plans the INSERT when the table changes; every pipeline
    // thread's encoder follows it at a poll-batch boundary.
    let live = plan.live();
    // Not with effectively_once: its range formers keep rows across poll
    // batches and do not carry a layout yet, so a change stops the run there
    // (exit 3) and the restart re-plans (ADR 0005). Nor for Avro/Protobuf,
    // whose encoders have no live plan: a changed column fails the batch and
    // the restart plans again.
    if !effectively_once(config) && matches!(plan.format, FormatPlan::Json) {
        wc.live = Some(Arc::clone(&live));
    }
    let writer = HttpWriter::new(wc);
    tracing::info!("{}", run_summary_line(config, writer.insert_format()));
    let source = KafkaSource::new(config.kafka_config())?;
    let shard_spec = config.sink.clickhouse.shard_spec()?;
    let decoder = MessageDecoder::of(config);
    let filter = plan.filter.clone();
    let explode = plan.explode.clone();
    let rules = plan.options.time.clone();
    let format = plan.format.clone();
    let columns = plan.columns.clone();
    let options = plan.options.clone();
    let factory: Box<dyn Fn(ChunkBuffers) -> Chain + Send + Sync> =
        Box::new(move |buffers: ChunkBuffers| match &format {
            // plan() built the same encoder and filter once (and a re-plan
            // checks its own before publishing it), so this cannot fail.
            FormatPlan::Json => json_chain(
                &live,
                explode.as_deref(),
                decoder,
                filter.clone(),
                rules.clone(),
                ShardRouter::with_spec(shard_spec.clone()),
                buffers,
            ),
            FormatPlan::Avro(a) => Chain::Avro(avro_chain(
                a,
                filter.clone(),
                rules.clone(),
                shard_spec.clone(),
                buffers,
            )),
            FormatPlan::Protobuf(_) => Chain::Protobuf(proto_chain(
                &format,
                &columns,
                &options,
                filter.clone(),
                shard_spec.clone(),
                buffers,
            )),
        });
    assemble(config, config.pipeline_config(), source, writer, factory)
}

/// A pipeline reading Kafka through `W` with the chains `F` makes, and its
/// dead-letter producer when one is configured.
pub(crate) type Assembled<W, F> = (Pipeline<KafkaSource, W, F>, Option<Arc<KafkaDeadLetter>>);

/// The last step of [`build`] and of [`crate::routing::build`]: the
/// pipeline of `source`, `writer` and `factory` under `pipeline`, with
/// `config`'s dead-letter producer attached when one is configured (flush
/// it after the run).
///
/// # Errors
/// [`ServiceError`] from the dead-letter producer or the pipeline builder.
pub(crate) fn assemble<W, F, P>(
    config: &Config,
    pipeline: PipelineConfig,
    source: KafkaSource,
    writer: W,
    factory: F,
) -> Result<Assembled<W, F>, ServiceError>
where
    W: spate_core::sink::Writer,
    P: Processor + 'static,
    F: Fn(ChunkBuffers) -> P + Send + Sync + 'static,
{
    let mut builder = Pipeline::builder(pipeline, source, writer, factory);
    let mut dead_letter = None;
    if let Some(dl) = &config.on_error.dead_letter {
        let brokers = config.source.kafka.brokers.joined();
        let properties = &config.source.kafka.properties;
        let hook = Arc::new(KafkaDeadLetter::new(&brokers, properties, &dl.topic)?);
        builder = builder.dead_letter(Arc::clone(&hook) as Arc<dyn DeadLetter>);
        dead_letter = Some(hook);
    }
    Ok((builder.build()?, dead_letter))
}
