//! Assembles one pipeline from a [`Config`]: the schema probe that plans the
//! INSERT, the ClickHouse writer, the JSON mapper, the Kafka source, the
//! optional dead-letter producer, and the [`Pipeline`] itself.
//!
//! Start-up order follows docs/DESIGN.md "Control": the table's columns are
//! read from the first replica that answers (the plan every replica is then
//! probed against by the pipeline's own start-up probe), so a table missing a
//! column or a type the encoder cannot write fails before any offset moves.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use spate_clickhouse::writer::{
    Credentials, HttpWriter, HttpWriterConfig, SchemaProbeError, TlsOptions, tls,
};
use spate_core::pipeline::chain::{Decoder, PayloadDecoder, RecordCx, RecordError, Stage};
use spate_core::pipeline::driver::{ChainProcessor, Processor};
use spate_core::pipeline::lines::LinesDecoder;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{DeadLetter, Pipeline, PipelineError};
use spate_core::record::Payload;
use spate_formats::json::JsonRowEncoder;
use spate_formats::json::explode::{ExplodeDecoder, ExplodeEncoder};
use spate_formats::json::live::{JsonLive, LiveEncoder, LiveExplodeEncoder, check_columns};
use spate_formats::json::route::ShardRouter;
use spate_kafka::KafkaSource;
use spate_row::coerce::TimeRules;
use spate_row::filter::{FilterExpr, Filtered, RowFilter};
use spate_row::plan::LivePlan;
use spate_row::schema::{
    InsertOptions, RowFormat, TableSchema, per_row_defaults_refused, plan_insert, row_format,
};
use spate_row::spec::{ColumnOptions, ColumnSpec, MappingOptions, MissingValue};
use spate_row::time::TimeFormat;

use crate::config::{Config, ConfigError, JsonMode, TlsSection};
use crate::formats::{AvroChain, FormatPlan, ProtoChain, avro_chain, plan_format, proto_chain};

/// Name of the counter of skipped records that could not be handed to the
/// dead-letter producer (its queue was full or it refused them).
pub const DEAD_LETTER_DROPPED: &str = "spate_dead_letter_dropped_total";

/// Why a pipeline could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No replica answered the schema probe.
    #[error("schema probe of {database}.{table}: no replica gave the schema: {errors}")]
    Probe {
        /// Target database.
        database: String,
        /// Target table.
        table: String,
        /// Each replica's error, `; `-joined.
        errors: String,
    },
    /// The table's columns cannot be mapped.
    #[error("mapping onto {table}: {reason}")]
    Mapping {
        /// Target table.
        table: String,
        /// Why.
        reason: String,
    },
    /// The Kafka client refused its configuration.
    #[error("kafka source: {0}")]
    Kafka(#[from] spate_kafka::ConfigError),
    /// The dead-letter producer could not be created.
    #[error("dead-letter producer for topic `{topic}`: {source}")]
    DeadLetter {
        /// The dead-letter topic.
        topic: String,
        /// Why.
        source: rdkafka::error::KafkaError,
    },
    /// The pipeline refused its configuration.
    #[error("pipeline: {0}")]
    Pipeline(#[from] PipelineError),
    /// A runtime could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// The config is invalid (a check that only runs when the pipeline is
    /// assembled).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The schema registry did not answer (after its retries) or refused;
    /// `reason` names the URL.
    #[error("{key}: {reason}")]
    Registry {
        /// The config key of the registry section.
        key: String,
        /// The registry's URL.
        url: String,
        /// Why.
        reason: String,
    },
}

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

/// The mapper's options from `mapping` and `format.json`.
pub fn mapping_options(config: &Config) -> MappingOptions {
    MappingOptions {
        flatten_join: config.mapping.flatten.clone(),
        time: TimeRules {
            formats: config
                .format
                .json()
                .time_formats
                .iter()
                .filter_map(|f| TimeFormat::compile(f).ok())
                .collect(),
            epoch_unit: config.time.epoch_unit.unit(),
            ..TimeRules::default()
        },
        empty_as_null: config.mapping.empty_as_null,
    }
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
    let mut errors = Vec::new();
    let mut schema = None;
    for url in ch.shards.iter().flatten() {
        match probe.table_schema(url).await {
            Ok(s) => {
                schema = Some(s);
                break;
            }
            Err(SchemaProbeError::Query(e)) => {
                errors.push(format!("{url}: {}", e.describe("schema probe")));
            }
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    let schema = schema.ok_or_else(|| ServiceError::Probe {
        database: ch.database.clone(),
        table: ch.table.clone(),
        errors: errors.join("; "),
    })?;
    // Per-row DEFAULTs go to the server only if every replica that
    // answers accepts RowBinaryWithDefaults (an insert may land on any).
    let mut server_defaults = true;
    let mut answered = false;
    for url in ch.shards.iter().flatten() {
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
    let insert = InsertOptions {
        renames: config.mapping.rename.clone(),
        pointers: config.mapping.columns.clone(),
        include_default_columns: config.mapping.include_default_columns,
        server_defaults: server_defaults && answered,
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
    };
    let mapping_err = |reason: String| ServiceError::Mapping {
        table: ch.table.clone(),
        reason,
    };
    let columns = plan_insert(&schema, &insert).map_err(|e| mapping_err(e.to_string()))?;
    let options = mapping_options(config);
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
    Ok(plan)
}

/// Produces skipped records to the dead-letter topic with their original
/// key and bytes and headers `spate.reason`, `spate.source` (topic/partition)
/// and `spate.offset`. Never blocks the pipeline thread (D2). A dead letter
/// that does not reach the topic is never lost silently (D6): a full
/// producer queue at send time, a delivery report with an error (the broker
/// refused it, or `message.timeout.ms` passed), and a dead letter still
/// queued when the final flush times out are each logged with the record's
/// partition and offset and counted in [`DEAD_LETTER_DROPPED`]; the skip
/// itself is counted by the engine.
pub struct KafkaDeadLetter {
    producer: ThreadedProducer<DeadLetterContext>,
    topic: String,
}

/// Reads the dead-letter producer's delivery reports.
pub struct DeadLetterContext {
    topic: String,
    dropped: metrics::Counter,
    dropped_total: std::sync::atomic::AtomicU64,
}

impl DeadLetterContext {
    fn drop_one(&self, what: std::fmt::Arguments<'_>) {
        self.dropped.increment(1);
        self.dropped_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::error!("dead-letter topic {}: lost {what}", self.topic);
    }
}

impl ClientContext for DeadLetterContext {}

impl ProducerContext for DeadLetterContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, msg)) = result {
            // The headers we wrote name the record.
            let header = |key: &str| {
                msg.headers()
                    .and_then(|h| h.iter().find(|x| x.key == key))
                    .and_then(|x| x.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_else(|| "?".into())
            };
            self.drop_one(format_args!(
                "{}@{}: delivery failed: {e}",
                header("spate.source"),
                header("spate.offset")
            ));
        }
    }
}

impl KafkaDeadLetter {
    /// A producer to `topic` on the source's brokers.
    ///
    /// # Errors
    /// [`ServiceError::DeadLetter`] when librdkafka refuses the config.
    pub fn new(config: &Config, topic: &str) -> Result<Self, ServiceError> {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", config.source.kafka.brokers.joined());
        Self::with_client(client, topic)
    }

    /// A producer to `topic` with `client`'s settings (brokers and any
    /// passthrough), plus the dead-letter defaults below.
    fn with_client(mut client: ClientConfig, topic: &str) -> Result<Self, ServiceError> {
        client.set("linger.ms", "20");
        // A dead letter is the original message, which may exceed librdkafka's
        // 1 MB default; allow what the consumer may receive (its
        // receive.message.max.bytes default, 100 MB).
        if client.get("message.max.bytes").is_none() {
            client.set("message.max.bytes", "100000000");
        }
        let context = DeadLetterContext {
            topic: topic.to_owned(),
            dropped: metrics::counter!(DEAD_LETTER_DROPPED),
            dropped_total: std::sync::atomic::AtomicU64::new(0),
        };
        let producer =
            client
                .create_with_context(context)
                .map_err(|source| ServiceError::DeadLetter {
                    topic: topic.to_owned(),
                    source,
                })?;
        Ok(Self {
            producer,
            topic: topic.to_owned(),
        })
    }

    /// Dead letters lost so far (also in [`DEAD_LETTER_DROPPED`]).
    pub fn dropped(&self) -> u64 {
        self.producer
            .context()
            .dropped_total
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits up to `timeout` for queued dead letters to reach the broker;
    /// those still queued after it are counted as lost.
    pub fn flush(&self, timeout: Duration) {
        if let Err(e) = self.producer.flush(timeout) {
            let left = self.producer.in_flight_count().max(0);
            for _ in 0..left {
                self.producer
                    .context()
                    .drop_one(format_args!("a queued dead letter: flush: {e}"));
            }
        }
    }
}

impl DeadLetter for KafkaDeadLetter {
    fn dead_letter(&self, payload: &Payload<'_>, error: &RecordError) {
        let reason = error.to_string();
        let source = payload.partition.to_string();
        let offset = payload.offset.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "spate.reason",
                value: Some(reason.as_bytes()),
            })
            .insert(Header {
                key: "spate.source",
                value: Some(source.as_bytes()),
            })
            .insert(Header {
                key: "spate.offset",
                value: Some(offset.as_bytes()),
            });
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic).headers(headers);
        // A tombstone stays a tombstone (a null value, not an empty one), so
        // its dead-letter copy still deletes in a compacted topic.
        if let Some(value) = payload.value {
            record = record.payload(value);
        }
        if let Some(k) = payload.key {
            record = record.key(k);
        }
        if let Err((e, _)) = self.producer.send(record) {
            self.producer
                .context()
                .drop_one(format_args!("{source}@{offset}: send: {e}"));
        }
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
    let source = KafkaSource::new(config.kafka_config())?;
    let shard_spec = config.sink.clickhouse.shard_spec()?;
    let decoder = match config.format.json().mode {
        JsonMode::Object => MessageDecoder::Object,
        JsonMode::Ndjson => MessageDecoder::Ndjson,
    };
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
    let mut builder = Pipeline::builder(config.pipeline_config(), source, writer, factory);
    let mut dead_letter = None;
    if let Some(dl) = &config.on_error.dead_letter {
        let hook = Arc::new(KafkaDeadLetter::new(config, &dl.topic)?);
        builder = builder.dead_letter(Arc::clone(&hook) as Arc<dyn DeadLetter>);
        dead_letter = Some(hook);
    }
    Ok((builder.build()?, dead_letter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::record::TopicPartition;

    /// A consumed message at `offset` of `tp`, without timestamp or headers.
    fn message<'a>(
        tp: &'a TopicPartition,
        offset: spate_core::record::Offset,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
    ) -> Payload<'a> {
        Payload {
            value,
            key,
            partition: tp,
            offset,
            timestamp_ms: None,
            timestamp_kind: spate_core::record::TimestampKind::None,
            headers: spate_core::record::Headers::NONE,
        }
    }

    /// D6: a dead letter the broker never takes is counted, not lost
    /// silently. Nothing listens on port 1; the message times out.
    #[test]
    fn undeliverable_dead_letters_are_counted() {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "300");
        let dl = KafkaDeadLetter::with_client(client, "dead").expect("producer");
        let tp = TopicPartition::new("events", 3);
        for offset in [7, 8] {
            let payload = message(&tp, offset, None, Some(b"not json"));
            dl.dead_letter(&payload, &RecordError::decode("expected a JSON object"));
        }
        dl.flush(Duration::from_secs(5));
        assert_eq!(dl.dropped(), 2);
    }

    /// A dead letter is the original message: a tombstone's copy has a null
    /// value (not an empty one) and its key; other values keep their bytes.
    #[test]
    fn a_dead_tombstone_stays_a_tombstone() {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let mock = crate::kafka_tools::start_broker("dead", 1).expect("mock broker");
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", mock.bootstrap_servers());
        let dl = KafkaDeadLetter::with_client(client, "dead").expect("producer");
        let tp = TopicPartition::new("events", 0);
        for (offset, value) in [(1, None), (2, Some(&b""[..])), (3, Some(&b"x"[..]))] {
            let payload = message(&tp, offset, Some(b"k1"), value);
            dl.dead_letter(&payload, &RecordError::decode("refused"));
        }
        dl.flush(Duration::from_secs(5));
        assert_eq!(dl.dropped(), 0);
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .set("group.id", "reader")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("dead", 0, rdkafka::Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while got.len() < 3 && std::time::Instant::now() < deadline {
            if let Some(m) = c.poll(Duration::from_millis(200)) {
                let m = m.unwrap();
                got.push((m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)));
            }
        }
        let key = Some(b"k1".to_vec());
        assert_eq!(
            got,
            vec![
                (key.clone(), None),
                (key.clone(), Some(Vec::new())),
                (key, Some(b"x".to_vec()))
            ]
        );
    }
}
