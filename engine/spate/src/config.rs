//! The YAML config model of one pipeline: what `spate run -c FILE` reads.
//!
//! Loading is three steps, each failing with a [`ConfigError`] that names the
//! key (or the environment variable) and says why:
//!
//! 1. [`interpolate`]: `${NAME}` and `${NAME:-default}` are replaced from the
//!    environment in the raw text (`$${` stays a literal `${`); an unset
//!    variable without a default is an error.
//! 2. Parsing with `deny_unknown_fields` everywhere: a misspelt key is an error
//!    with the key's path and, where one is close, a did-you-mean.
//! 3. [`Config::validate`]: the cross-field and range checks, by building the
//!    engine's own configs ([`Config::pipeline_config`],
//!    [`Config::kafka_config`]) and running their validation.
//!
//! This module does no I/O beyond reading the file: reaching brokers and
//! replicas is `spate check`'s job.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use spate_core::pipeline::{self, Delivery, OnError, PipelineConfig};
use spate_core::sink::{BatchConfig, RetryConfig, SinkConfig};
use spate_kafka::KafkaSourceConfig;
use spate_row::shard::{KeyHash, KeyType, MissingKey, ShardKey, ShardSpec};

pub mod formats;
pub mod secrets;

/// A config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `${NAME}` names an unset variable and has no `:-default`.
    #[error(
        "line {line}: environment variable `{name}` is not set (use ${{{name}:-default}} for a default)"
    )]
    UnsetVariable {
        /// The variable.
        name: String,
        /// 1-based line of the reference.
        line: usize,
    },
    /// A `${` without its closing `}` or with an invalid name.
    #[error("line {line}: malformed variable reference `{text}`")]
    BadReference {
        /// The text found.
        text: String,
        /// 1-based line.
        line: usize,
    },
    /// The YAML does not fit the model (syntax, unknown key, wrong type).
    #[error("config key `{key}`: {reason}")]
    Parse {
        /// Dotted path of the offending key (`.` for the root).
        key: String,
        /// The parser's message, with a did-you-mean where one is close.
        reason: String,
    },
    /// A value is out of range or inconsistent.
    #[error("config key `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the offending key.
        key: String,
        /// Why it is rejected.
        reason: String,
    },
}

pub mod transform;

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// A duration written as humantime text: `500ms`, `5s`, `2m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim())
            .map(Dur)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "bad duration `{text}` ({e}); write e.g. 500ms, 5s, 2m"
                ))
            })
    }
}

/// A byte count: an integer, or text with a binary unit (`64KiB`, `8MiB`,
/// `1GiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `text` (`123`, `64KiB`, `8MiB`, `1GiB`).
    pub fn parse(text: &str) -> Option<ByteSize> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().ok()?;
        let mult = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            _ => return None,
        };
        n.checked_mul(mult).map(ByteSize)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => ByteSize::parse(&s).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "bad byte size `{s}`; write an integer or e.g. 64KiB, 8MiB, 1GiB"
                ))
            }),
        }
    }
}

/// The whole config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `pipeline`: name and threads.
    pub pipeline: PipelineSection,
    /// `checkpoint`: commit interval.
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// `source`: where records come from.
    pub source: SourceSection,
    /// `format`: how message bytes decode.
    #[serde(default)]
    pub format: FormatSection,
    /// `mapping`: JSON fields onto table columns.
    #[serde(default)]
    pub mapping: MappingSection,
    /// `time`: how JSON values become DateTime/DateTime64 values.
    #[serde(default)]
    pub time: TimeSection,
    /// `on_error`: the record error policy.
    #[serde(default)]
    pub on_error: OnErrorSection,
    /// `sink`: where rows go.
    pub sink: SinkSection,
    /// `rebalance`: how a revoke drains.
    #[serde(default)]
    pub rebalance: RebalanceSection,
    /// `shutdown`: drain bounds.
    #[serde(default)]
    pub shutdown: ShutdownSection,
    /// `admin`: the HTTP admin server.
    #[serde(default)]
    pub admin: AdminSection,
}

/// `pipeline`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSection {
    /// Pipeline name: part of every batch token (D4); keep it stable across
    /// restarts and unique per table.
    pub name: String,
    /// Pipeline threads polling lanes (default 1).
    #[serde(default = "one")]
    pub threads: usize,
    /// `pipeline.delivery`: `at_least_once` (default) or `effectively_once`.
    #[serde(default)]
    pub delivery: DeliveryName,
    /// I/O runtime threads for the sink pool (default 1).
    #[serde(default = "one")]
    pub io_threads: usize,
    /// First sleep of an idle pipeline thread or controller round (default
    /// 1ms, between 100us and 1s); consecutive idle rounds double it up to
    /// `idle_poll_max`.
    #[serde(default)]
    pub idle_poll: Option<Dur>,
    /// Longest idle sleep (default 10ms, or `idle_poll` when that is set
    /// higher; between `idle_poll` and 1s): the most a record arriving at an
    /// idle pipeline waits before it is polled. Lower it for latency, raise
    /// it to spend less CPU idling.
    #[serde(default)]
    pub idle_poll_max: Option<Dur>,
}

fn one() -> usize {
    1
}

/// `checkpoint`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSection {
    /// How often offsets behind acknowledged rows are committed (default 5s).
    pub interval: Dur,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self {
            interval: Dur(pipeline::DEFAULT_CHECKPOINT_INTERVAL),
        }
    }
}

/// `source`: exactly one kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// `source.kafka`.
    pub kafka: KafkaSection,
}

/// `source.kafka`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSection {
    /// Bootstrap brokers (`host:port`), a list or one comma-separated string.
    pub brokers: Brokers,
    /// Topics; a name starting with `^` is a regular expression.
    pub topics: Vec<String>,
    /// Consumer group id.
    pub group_id: String,
    /// Where a partition without a committed offset starts: `earliest` or
    /// `latest` (default `earliest`).
    #[serde(default = "earliest")]
    pub auto_offset_reset: String,
    /// Messages per lane poll (one ack handle each).
    #[serde(default)]
    pub max_batch: Option<usize>,
    /// How often the group's lag is read from the brokers for every
    /// subscribed partition (`spate_group_lag`); `0s` turns it off.
    /// Default [`spate_kafka::DEFAULT_LAG_INTERVAL`].
    #[serde(default)]
    pub lag_interval: Option<Dur>,
    /// librdkafka properties passed through unchanged.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn earliest() -> String {
    "earliest".into()
}

/// Brokers as a YAML list or one comma-separated string.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Brokers {
    /// `brokers: [a:9092, b:9092]`
    List(Vec<String>),
    /// `brokers: a:9092,b:9092`
    Text(String),
}

impl Brokers {
    /// The comma-joined `bootstrap.servers` value.
    pub fn joined(&self) -> String {
        match self {
            Brokers::List(l) => l.join(","),
            Brokers::Text(t) => t.clone(),
        }
    }
}

/// `format`: exactly one kind; JSON by default.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatSection {
    /// `format.json` (the default kind; see [`FormatSection::json`]).
    #[serde(default, rename = "json")]
    pub json_section: Option<JsonFormat>,
    /// `format.avro`: Avro, Confluent-framed through a schema registry or
    /// plain with a schema file ([`formats::AvroFormat`]).
    #[serde(default)]
    pub avro: Option<formats::AvroFormat>,
    /// `format.protobuf`: Protobuf, Confluent-framed through a schema
    /// registry or plain with a descriptor set ([`formats::ProtobufFormat`]).
    #[serde(default)]
    pub protobuf: Option<formats::ProtobufFormat>,
}

/// The JSON format's defaults, for a config without `format.json`.
static JSON_DEFAULT: JsonFormat = JsonFormat {
    mode: JsonMode::Object,
    time_formats: Vec::new(),
};

impl FormatSection {
    /// `format.json`, or its defaults when not written.
    pub fn json(&self) -> &JsonFormat {
        self.json_section.as_ref().unwrap_or(&JSON_DEFAULT)
    }

    /// `format.avro` when the messages are Avro.
    pub fn avro(&self) -> Option<&formats::AvroFormat> {
        self.avro.as_ref()
    }

    /// `format.protobuf` when the messages are Protobuf.
    pub fn protobuf(&self) -> Option<&formats::ProtobufFormat> {
        self.protobuf.as_ref()
    }

    /// The kind's name: `json`, `avro` or `protobuf`.
    pub fn kind(&self) -> &'static str {
        if self.avro.is_some() {
            "avro"
        } else if self.protobuf.is_some() {
            "protobuf"
        } else {
            "json"
        }
    }

    /// Exactly one kind.
    fn validate(&self) -> Result<(), ConfigError> {
        let set: Vec<&str> = [
            ("json", self.json_section.is_some()),
            ("avro", self.avro.is_some()),
            ("protobuf", self.protobuf.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, on)| on.then_some(k))
        .collect();
        if set.len() > 1 {
            return Err(invalid(
                "format",
                format!(
                    "`{}` are all set; a pipeline reads one format",
                    set.join("`, `")
                ),
            ));
        }
        if let Some(avro) = &self.avro {
            avro.validate()?;
        }
        if let Some(p) = &self.protobuf {
            p.validate()?;
        }
        Ok(())
    }
}

/// `format.json`: JSON objects, one per message or one per line.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonFormat {
    /// `object` (default): each message is one JSON object, one row.
    /// `ndjson`: each non-blank line of a message is one object, one row; a
    /// message's offset is committed once all its rows are durable.
    #[serde(default)]
    pub mode: JsonMode,
    /// Time formats (strftime-like, e.g. `%Y/%m/%d %H:%M`) tried after RFC
    /// 3339 and `YYYY-MM-DD HH:MM:SS` for DateTime columns.
    #[serde(default)]
    pub time_formats: Vec<String>,
}

/// `format.json.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JsonMode {
    /// One JSON object per message.
    #[default]
    Object,
    /// Newline-delimited JSON: one object per line of a message.
    Ndjson,
}

/// `mapping`: how JSON fields reach columns. Columns not named here read
/// the top-level field of their own name.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MappingSection {
    /// Column -> top-level JSON field.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
    /// Column -> JSON pointer (`/properties/mag`) or Kafka metadata
    /// source (`_offset`, `_key`, `_header.trace-id`, ...).
    #[serde(default)]
    pub columns: BTreeMap<String, String>,
    /// Read nested objects flattened with this join: column `a_b` reads
    /// `{"a":{"b":..}}` with `flatten: "_"`.
    #[serde(default)]
    pub flatten: Option<String>,
    /// Kept so old configs load; it no longer has an effect: DEFAULT
    /// columns are always in the INSERT, so a field present in a record
    /// lands (issue 19).
    #[serde(default)]
    pub include_default_columns: bool,
    /// A JSON `""` counts as missing: NULL in a Nullable column, the
    /// DEFAULT in a column whose DEFAULT spate can apply, else kept as a
    /// value (default false).
    #[serde(default)]
    pub empty_as_null: bool,
    /// Column -> options for that column alone (override the global ones).
    #[serde(default)]
    pub column_options: BTreeMap<String, ColumnOptionsSection>,
    /// `mapping.explode`: a JSON pointer (`/events`) to an array in each
    /// record; each element becomes one row, with the record's other
    /// fields (see [`transform`]).
    #[serde(default)]
    pub explode: Option<String>,
    /// `mapping.filter`: which rows are kept, evaluated on the row as
    /// encoded (see [`transform`] for the shape, [`MappingSection::filter_expr`]).
    #[serde(default)]
    pub filter: Option<serde_norway::Value>,
    /// `mapping.defaults`: column -> the value it gets when its field is
    /// missing or null (a string, number or bool).
    #[serde(default)]
    pub defaults: BTreeMap<String, serde_norway::Value>,
}

/// `mapping.column_options.<column>`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnOptionsSection {
    /// The column's own `time.epoch_unit` (DateTime/DateTime64 columns).
    #[serde(default)]
    pub epoch_unit: Option<EpochUnitName>,
    /// The column's own `mapping.empty_as_null`.
    #[serde(default)]
    pub empty_as_null: Option<bool>,
}

/// `time`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeSection {
    /// How epoch numbers are read into DateTime/DateTime64 columns: `auto`
    /// (default: guessed from the number's size, see the README), `s`,
    /// `ms`, `us`, `ns`.
    #[serde(default)]
    pub epoch_unit: EpochUnitName,
}

/// An epoch unit as written in the config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EpochUnitName {
    /// `auto`.
    #[default]
    Auto,
    /// `s`.
    S,
    /// `ms`.
    Ms,
    /// `us`.
    Us,
    /// `ns`.
    Ns,
}

impl EpochUnitName {
    /// The mapper's unit.
    pub fn unit(self) -> spate_row::coerce::EpochUnit {
        use spate_row::coerce::EpochUnit;
        match self {
            EpochUnitName::Auto => EpochUnit::Auto,
            EpochUnitName::S => EpochUnit::Seconds,
            EpochUnitName::Ms => EpochUnit::Millis,
            EpochUnitName::Us => EpochUnit::Micros,
            EpochUnitName::Ns => EpochUnit::Nanos,
        }
    }
}

/// `pipeline.delivery`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryName {
    /// Nothing lost; a replay after a crash or rebalance may duplicate.
    #[default]
    AtLeastOnce,
    /// Deterministic per-partition batches recorded in the commit metadata
    /// (D9, docs/adr/0004-effectively-once.md).
    EffectivelyOnce,
}

impl From<DeliveryName> for Delivery {
    fn from(d: DeliveryName) -> Self {
        match d {
            DeliveryName::AtLeastOnce => Delivery::AtLeastOnce,
            DeliveryName::EffectivelyOnce => Delivery::EffectivelyOnce,
        }
    }
}

/// `on_error`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnErrorSection {
    /// `skip` (count it, dead-letter it, go on) or `fail` (stop without
    /// committing past it). Default `fail`.
    pub policy: Policy,
    /// Where skipped records go.
    #[serde(default)]
    pub dead_letter: Option<DeadLetterSection>,
}

impl Default for OnErrorSection {
    fn default() -> Self {
        Self {
            policy: Policy::Fail,
            dead_letter: None,
        }
    }
}

/// `on_error.policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Skip and count.
    Skip,
    /// Stop.
    Fail,
}

/// `on_error.dead_letter`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSection {
    /// The topic skipped records are produced to (same brokers as the source).
    pub topic: String,
}

/// `sink`: exactly one kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkSection {
    /// `sink.clickhouse`.
    pub clickhouse: ClickHouseSection,
}

/// `sink.clickhouse`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClickHouseSection {
    /// Replica HTTP URLs per shard: `[[http://a:8123, http://b:8123], [...]]`.
    pub shards: Vec<Vec<String>>,
    /// Database (default `default`).
    #[serde(default = "default_db")]
    pub database: String,
    /// Table.
    pub table: String,
    /// User (sent as HTTP Basic auth).
    #[serde(default)]
    pub user: Option<String>,
    /// Password.
    #[serde(default)]
    pub password: Option<String>,
    /// Batch sealing thresholds.
    #[serde(default)]
    pub batch: BatchSection,
    /// In-flight bounds.
    #[serde(default)]
    pub inflight: InflightSection,
    /// Retry of a failed insert.
    #[serde(default)]
    pub retry: RetrySection,
    /// Bound on one insert attempt (default 30s).
    #[serde(default)]
    pub write_timeout: Option<Dur>,
    /// How a row picks its shard (default: round robin, row by row).
    #[serde(default)]
    pub shard_key: Option<ShardKeySection>,
    /// Insert body compression: `none` (default), `gzip` or `deflate`, the
    /// encodings ClickHouse 18.16 and later decode.
    #[serde(default)]
    pub compression: CompressionName,
    /// zlib level for `gzip` and `deflate`: 1 (fastest, default) to 9.
    #[serde(default)]
    pub compression_level: Option<u32>,
    /// TLS for `https://` replica URLs.
    #[serde(default)]
    pub tls: TlsSection,
    /// Insert format: `native` (default; blocks name each column's type,
    /// so a table whose column type changed refuses them) or `rowbinary`.
    #[serde(default)]
    pub format: FormatName,
    /// How often the writer re-reads the table's columns before an insert
    /// where the server checks a Native block's types itself (default
    /// 60s). Where it does not (RowBinary, or a server without
    /// `input_format_native_allow_types_conversion` such as 18.16) the
    /// columns are re-read before every insert whatever this says.
    #[serde(default)]
    pub schema_refresh: Option<Dur>,
    /// ClickHouse settings sent with every INSERT (`async_insert: 1`,
    /// `insert_quorum: 2`, `max_insert_block_size: 1048576`); values are
    /// YAML scalars (bools as 1/0). Names are checked against each
    /// replica's `system.settings` at start and by `spate check`.
    #[serde(default)]
    pub settings: BTreeMap<String, SettingValue>,
}

/// `sink.clickhouse.format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatName {
    /// `FORMAT Native`.
    #[default]
    Native,
    /// `FORMAT RowBinary`.
    RowBinary,
}

impl FormatName {
    /// The writer's insert format.
    pub fn insert_format(self) -> spate_clickhouse::writer::InsertFormat {
        match self {
            FormatName::Native => spate_clickhouse::writer::InsertFormat::Native,
            FormatName::RowBinary => spate_clickhouse::writer::InsertFormat::RowBinary,
        }
    }
}

/// One value of `sink.clickhouse.settings`: a YAML scalar.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum SettingValue {
    /// `true`/`false`, sent as `1`/`0`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// Text, sent as it is.
    Text(String),
}

impl SettingValue {
    /// The value as the query-string parameter carries it.
    pub fn to_param(&self) -> String {
        match self {
            SettingValue::Bool(b) => u8::from(*b).to_string(),
            SettingValue::Int(i) => i.to_string(),
            SettingValue::Float(f) => f.to_string(),
            SettingValue::Text(t) => t.clone(),
        }
    }
}

/// `sink.clickhouse.compression`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionName {
    /// Bodies sent as they are.
    #[default]
    None,
    /// `Content-Encoding: gzip`.
    Gzip,
    /// `Content-Encoding: deflate` (a zlib stream).
    Deflate,
}

/// `sink.clickhouse.tls`: trust for `https://` replica URLs. Without it
/// the system's root certificates are trusted.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// A PEM file of CA certificates to trust instead of the system's.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Skip certificate verification entirely (tests only: anyone on the
    /// path can read and change the data). Default false.
    #[serde(default)]
    pub insecure: bool,
}

/// `sink.clickhouse.shard_key`: exactly one of `{field: name}`,
/// `{pointer: /a/b}` or `{kafka_key: true}`, with optional `hash`, `type`,
/// `weights` and `missing`. By default a row goes to shard
/// `XXH64(key text, seed 0) mod shards` (see `spate_row::shard`);
/// a row without the key is a record error (the `on_error` policy).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShardKeySection {
    /// A top-level JSON field of the message value.
    #[serde(default)]
    pub field: Option<String>,
    /// A JSON pointer into the message value (RFC 6901, e.g. `/user/id`).
    #[serde(default)]
    pub pointer: Option<String>,
    /// The Kafka message key.
    #[serde(default)]
    pub kafka_key: bool,
    /// `text` (default: XXH64 of the key's text), `xxhash64` (as
    /// ClickHouse's `xxHash64(col)` of the value read as `type`) or `value`
    /// (the integer value itself, as a `Distributed` sharding key `col`).
    #[serde(default)]
    pub hash: Option<String>,
    /// The ClickHouse type the key is read as for `hash: xxhash64` or
    /// `value`: `UInt8`..`UInt64`, `Int8`..`Int64`, `String` (xxhash64 only).
    #[serde(default, rename = "type")]
    pub key_type: Option<String>,
    /// One weight per shard, as the `Distributed` engine's (default all 1).
    #[serde(default)]
    pub weights: Option<Vec<u64>>,
    /// `error` (default: a record without its key is a record error) or
    /// `round_robin`.
    #[serde(default)]
    pub missing: Option<String>,
}

impl ClickHouseSection {
    /// The writer's body compression.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `sink.clickhouse.compression_level`
    /// for a level outside 1..=9 or a level without compression.
    pub fn compression(&self) -> Result<spate_clickhouse::writer::Compression, ConfigError> {
        let name = match self.compression {
            CompressionName::None => {
                if self.compression_level.is_some() {
                    return Err(invalid(
                        "sink.clickhouse.compression_level",
                        "set without `compression: gzip` or `deflate`",
                    ));
                }
                "none"
            }
            CompressionName::Gzip => "gzip",
            CompressionName::Deflate => "deflate",
        };
        spate_clickhouse::writer::Compression::parse(name, self.compression_level)
            .map_err(|e| invalid("sink.clickhouse.compression_level", e))
    }

    /// The router key this section asks for.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `sink.clickhouse.shard_key.pointer` for
    /// a malformed pointer.
    pub fn shard_key(&self) -> Result<ShardKey, ConfigError> {
        let Some(k) = &self.shard_key else {
            return Ok(ShardKey::None);
        };
        match (&k.field, &k.pointer, k.kafka_key) {
            (Some(f), None, false) => Ok(ShardKey::field(f.clone())),
            (None, Some(p), false) => ShardKey::pointer(p)
                .map_err(|e| invalid("sink.clickhouse.shard_key.pointer", e.to_string())),
            (None, None, true) => Ok(ShardKey::KafkaKey),
            _ => Err(invalid(
                "sink.clickhouse.shard_key",
                "set exactly one of field, pointer or kafka_key: true",
            )),
        }
    }

    /// Everything the router routes by: the key, the hash mode, weights and
    /// what a record without its key becomes.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the `sink.clickhouse.shard_key.*` key:
    /// an unknown `hash`, `type` or `missing`, a `type` without a typed hash
    /// (or the reverse), weights that are not one positive number per shard.
    pub fn shard_spec(&self) -> Result<ShardSpec, ConfigError> {
        let key = self.shard_key()?;
        let Some(k) = &self.shard_key else {
            return Ok(ShardSpec::default());
        };
        Ok(ShardSpec {
            key,
            hash: k.key_hash()?,
            weights: k.shard_weights(self.shards.len())?,
            missing: k.missing_key()?,
        })
    }
}

impl ShardKeySection {
    /// `hash` and `type`: text, or xxhash64 / value of a typed key.
    fn key_hash(&self) -> Result<KeyHash, ConfigError> {
        let key_type = match &self.key_type {
            None => None,
            Some(t) => Some(KeyType::parse(t).ok_or_else(|| {
                invalid(
                    "sink.clickhouse.shard_key.type",
                    format!("`{t}` is not one of UInt8, UInt16, UInt32, UInt64, Int8, Int16, Int32, Int64, String"),
                )
            })?),
        };
        let refused = |reason: &str| Err(invalid("sink.clickhouse.shard_key.type", reason));
        match (self.hash.as_deref().unwrap_or("text"), key_type) {
            ("text", None) => Ok(KeyHash::Text),
            ("xxhash64", Some(t)) => Ok(KeyHash::Typed(t)),
            ("value", Some(KeyType::String)) => refused("`hash: value` needs an integer type"),
            ("value", Some(t)) => Ok(KeyHash::Value(t)),
            ("text", Some(_)) => refused("only with `hash: xxhash64` or `hash: value`"),
            ("xxhash64" | "value", None) => {
                refused("required with `hash: xxhash64` or `hash: value`")
            }
            (other, _) => Err(invalid(
                "sink.clickhouse.shard_key.hash",
                format!("`{other}` is not one of text, xxhash64, value"),
            )),
        }
    }

    /// `weights`: none, or one positive number per shard of `shards`.
    fn shard_weights(&self, shards: usize) -> Result<Vec<u64>, ConfigError> {
        let weights = self.weights.clone().unwrap_or_default();
        if weights.is_empty() {
            return Ok(weights);
        }
        if weights.len() != shards {
            return Err(invalid(
                "sink.clickhouse.shard_key.weights",
                format!(
                    "{} weight(s) for {shards} shard(s): give one per shard",
                    weights.len(),
                ),
            ));
        }
        if weights.iter().sum::<u64>() == 0 {
            return Err(invalid(
                "sink.clickhouse.shard_key.weights",
                "the weights sum to 0",
            ));
        }
        Ok(weights)
    }

    /// `missing`: what a record without its key becomes.
    fn missing_key(&self) -> Result<MissingKey, ConfigError> {
        match self.missing.as_deref().unwrap_or("error") {
            "error" => Ok(MissingKey::Error),
            "round_robin" => Ok(MissingKey::RoundRobin),
            other => Err(invalid(
                "sink.clickhouse.shard_key.missing",
                format!("`{other}` is not one of error, round_robin"),
            )),
        }
    }
}

fn default_db() -> String {
    "default".into()
}

/// `sink.clickhouse.batch`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSection {
    /// Seal a batch at this many rows.
    pub max_rows: Option<u64>,
    /// Seal a batch at this many bytes.
    pub max_bytes: Option<ByteSize>,
    /// Seal a batch this long after its first row.
    pub linger: Option<Dur>,
}

/// `sink.clickhouse.inflight`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InflightSection {
    /// Concurrent inserts per shard.
    pub max_inflight: Option<usize>,
    /// Byte budget of data in flight across the pipeline (D8).
    pub max_bytes: Option<ByteSize>,
    /// Row budget of data in flight.
    pub max_rows: Option<u64>,
}

/// `sink.clickhouse.retry`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    /// First backoff.
    pub initial: Option<Dur>,
    /// Backoff cap.
    pub max: Option<Dur>,
    /// Attempts before a batch is abandoned.
    pub max_attempts: Option<u32>,
}

/// `shutdown`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSection {
    /// How long shutdown lets in-flight data finish (default 30s, D5).
    pub drain_timeout: Dur,
}

impl Default for ShutdownSection {
    fn default() -> Self {
        Self {
            drain_timeout: Dur(pipeline::DEFAULT_SHUTDOWN_DRAIN_TIMEOUT),
        }
    }
}

/// `rebalance`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebalanceSection {
    /// How long a revoke waits for the revoked partitions' in-flight data
    /// before committing what settled and releasing them (default 10s). The
    /// revoke holds the group's rebalance meanwhile (docs/adr/0002), so it
    /// must stay at most half of librdkafka's `max.poll.interval.ms` (the
    /// rebalance timeout the member sends; 300 s by default), checked at load.
    pub drain_timeout: Dur,
}

impl Default for RebalanceSection {
    fn default() -> Self {
        Self {
            drain_timeout: Dur(pipeline::DEFAULT_REBALANCE_DRAIN_TIMEOUT),
        }
    }
}

/// `admin`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// `host:port` of the admin HTTP server; `off` disables it
    /// (default `127.0.0.1:9464`).
    pub listen: String,
}

impl Default for AdminSection {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".into(),
        }
    }
}

impl Config {
    /// Reads, interpolates, parses and validates the file at `path`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, variable or key.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_yaml(&text, |name| std::env::var(name).ok())
    }

    /// Interpolates `text` with `env`, parses and validates it.
    ///
    /// # Errors
    /// [`ConfigError`] naming the variable or key.
    pub fn from_yaml(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let text = interpolate(text, env)?;
        let de = serde_norway::Deserializer::from_str(&text);
        let mut config: Config = serde_path_to_error::deserialize(de).map_err(parse_error)?;
        secrets::lift_url_credentials(&mut config)?;
        config.validate()?;
        Ok(config)
    }

    /// `rebalance.drain_timeout` against librdkafka's `max.poll.interval.ms`
    /// (from `source.kafka.properties`, else librdkafka's 300000): a revoke
    /// that drains longer than the rebalance timeout gets the member evicted
    /// (docs/adr/0002), so the drain may take at most half of it.
    fn check_rebalance_drain(&self) -> Result<(), ConfigError> {
        let drain = self.rebalance.drain_timeout.0;
        if drain.is_zero() {
            return Err(invalid("rebalance.drain_timeout", "must be greater than 0"));
        }
        let key = "max.poll.interval.ms";
        let poll_ms = match self.source.kafka.properties.get(key) {
            Some(v) => v.trim().parse::<u64>().map_err(|_| {
                invalid(
                    format!("source.kafka.properties.{key}"),
                    format!("`{v}`: expected milliseconds"),
                )
            })?,
            None => 300_000,
        };
        let poll = Duration::from_millis(poll_ms);
        if drain * 2 > poll {
            return Err(invalid(
                "rebalance.drain_timeout",
                format!(
                    "{drain:?} is more than half of {key} ({poll:?}): a revoke holds the \
                     group's rebalance while it drains, and a member silent for {key} is \
                     evicted; lower it or raise source.kafka.properties.{key}"
                ),
            ));
        }
        Ok(())
    }

    /// Checks ranges and consistency by building the engine's configs.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_delivery()?;
        self.check_pipeline()?;
        self.check_kafka()?;
        self.check_clickhouse()?;
        self.check_mapping_and_format()?;
        self.check_on_error_and_admin()?;
        self.pipeline_config().validate().map_err(|e| {
            let spate_core::sink::ConfigError::Invalid { key, reason } = e;
            invalid(key.replace("sink.", "sink.clickhouse."), reason)
        })?;
        Ok(())
    }

    /// `pipeline.delivery` against the shard key (and the key itself).
    fn check_delivery(&self) -> Result<(), ConfigError> {
        let spec = self.sink.clickhouse.shard_spec()?;
        // D9: a replay must route every row to the shard it went to before,
        // so the router must be a function of the record. Round robin (no
        // shard_key, or `missing: round_robin`) is not.
        if self.pipeline.delivery == DeliveryName::EffectivelyOnce
            && self.sink.clickhouse.shards.len() > 1
        {
            if spec.key == spate_row::shard::ShardKey::None {
                return Err(invalid(
                    "sink.clickhouse.shard_key",
                    "pipeline.delivery: effectively_once with more than one shard needs a \
                     shard_key: round robin sends a replayed row to another shard than the \
                     first attempt, where no dedup token matches",
                ));
            }
            if spec.missing == spate_row::shard::MissingKey::RoundRobin {
                return Err(invalid(
                    "sink.clickhouse.shard_key.missing",
                    "`round_robin` is not a function of the record; pipeline.delivery: \
                     effectively_once needs `error` (the default)",
                ));
            }
        }
        Ok(())
    }

    /// `pipeline.name` and `pipeline.io_threads`.
    fn check_pipeline(&self) -> Result<(), ConfigError> {
        if self.pipeline.name.trim().is_empty() {
            return Err(invalid("pipeline.name", "must not be empty"));
        }
        if self.pipeline.io_threads == 0 {
            return Err(invalid("pipeline.io_threads", "must be greater than 0"));
        }
        Ok(())
    }

    /// `source.kafka`: the reset policy, the brokers, the properties spate
    /// owns, the revoke drain against the poll interval, and the source's
    /// own check.
    fn check_kafka(&self) -> Result<(), ConfigError> {
        let k = &self.source.kafka;
        if !matches!(k.auto_offset_reset.as_str(), "earliest" | "latest") {
            return Err(invalid(
                "source.kafka.auto_offset_reset",
                format!("`{}`: expected earliest or latest", k.auto_offset_reset),
            ));
        }
        if k.brokers.joined().trim().is_empty() {
            return Err(invalid(
                "source.kafka.brokers",
                "must name at least one broker",
            ));
        }
        for key in k.properties.keys() {
            let owned = [
                ("bootstrap.servers", "source.kafka.brokers"),
                ("group.id", "source.kafka.group_id"),
                ("auto.offset.reset", "source.kafka.auto_offset_reset"),
            ];
            if let Some((_, instead)) = owned.iter().find(|(p, _)| p == key) {
                return Err(invalid(
                    format!("source.kafka.properties.{key}"),
                    format!("set it with `{instead}`"),
                ));
            }
        }
        self.check_rebalance_drain()?;
        self.kafka_config()
            .validate()
            .map_err(|e| invalid("source.kafka", e.to_string()))?;
        Ok(())
    }

    /// `sink.clickhouse`: the table, the replica URLs, compression, the
    /// settings spate owns, TLS and the credentials.
    fn check_clickhouse(&self) -> Result<(), ConfigError> {
        let ch = &self.sink.clickhouse;
        if ch.table.trim().is_empty() {
            return Err(invalid("sink.clickhouse.table", "must not be empty"));
        }
        for (s, shard) in ch.shards.iter().enumerate() {
            for (r, url) in shard.iter().enumerate() {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid(
                        format!("sink.clickhouse.shards[{s}][{r}]"),
                        format!(
                            "`{}`: expected an http:// or https:// URL",
                            secrets::redact(url)
                        ),
                    ));
                }
            }
        }
        ch.compression()?;
        for name in ch.settings.keys() {
            let key = format!("sink.clickhouse.settings.{name}");
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(invalid(key, "a setting name is letters, digits and `_`"));
            }
            let owned = [
                (
                    "insert_deduplication_token",
                    "spate sends its batch token there (D4)",
                ),
                ("query", "not a setting"),
                ("user", "set it with `sink.clickhouse.user`"),
                ("password", "set it with `sink.clickhouse.password`"),
                ("database", "set it with `sink.clickhouse.database`"),
                ("query_id", "not a setting"),
                ("session_id", "not a setting"),
            ];
            if let Some((_, why)) = owned.iter().find(|(p, _)| p == name) {
                return Err(invalid(key, *why));
            }
        }
        if ch.tls.insecure && ch.tls.ca_file.is_some() {
            return Err(invalid(
                "sink.clickhouse.tls.insecure",
                "verification is skipped, so `ca_file` would be ignored; set one of them",
            ));
        }
        if ch.password.is_some() && ch.user.is_none() {
            return Err(invalid("sink.clickhouse.password", "set without `user`"));
        }
        Ok(())
    }

    /// `mapping` and `format`: the flatten join, the column sources, the
    /// format sections, the transforms and the time formats.
    fn check_mapping_and_format(&self) -> Result<(), ConfigError> {
        if self.mapping.flatten.as_deref() == Some("") {
            return Err(invalid("mapping.flatten", "the join must not be empty"));
        }
        for (col, source) in &self.mapping.columns {
            spate_row::spec::parse_source(source)
                .map_err(|e| invalid(format!("mapping.columns.{col}"), e.to_string()))?;
        }
        self.format.validate()?;
        self.mapping.validate_transforms()?;
        for (i, f) in self.format.json().time_formats.iter().enumerate() {
            spate_row::time::TimeFormat::compile(f)
                .map_err(|e| invalid(format!("format.json.time_formats[{i}]"), e.to_string()))?;
        }
        Ok(())
    }

    /// `on_error.dead_letter` and `admin.listen`.
    fn check_on_error_and_admin(&self) -> Result<(), ConfigError> {
        if let Some(dl) = &self.on_error.dead_letter {
            if dl.topic.trim().is_empty() {
                return Err(invalid("on_error.dead_letter.topic", "must not be empty"));
            }
            if self.on_error.policy != Policy::Skip {
                return Err(invalid(
                    "on_error.dead_letter",
                    "only used with `policy: skip`",
                ));
            }
        }
        if self.admin.listen != "off" {
            self.admin
                .listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| invalid("admin.listen", format!("`{}`: {e}", self.admin.listen)))?;
        }
        Ok(())
    }

    /// The mapper's options from `mapping`, `format.json` and `time`.
    pub fn mapping_options(&self) -> spate_row::spec::MappingOptions {
        use spate_row::coerce::TimeRules;
        use spate_row::spec::MappingOptions;
        MappingOptions {
            flatten_join: self.mapping.flatten.clone(),
            time: TimeRules {
                formats: self
                    .format
                    .json()
                    .time_formats
                    .iter()
                    .filter_map(|f| spate_row::time::TimeFormat::compile(f).ok())
                    .collect(),
                epoch_unit: self.time.epoch_unit.unit(),
                ..TimeRules::default()
            },
            empty_as_null: self.mapping.empty_as_null,
        }
    }

    /// The Kafka source's config.
    pub fn kafka_config(&self) -> KafkaSourceConfig {
        let k = &self.source.kafka;
        let mut c = KafkaSourceConfig::new(k.topics.iter().cloned());
        for (key, value) in &k.properties {
            c.set(key, value);
        }
        c.set("bootstrap.servers", k.brokers.joined())
            .set("group.id", &k.group_id)
            .set("auto.offset.reset", &k.auto_offset_reset);
        if let Some(m) = k.max_batch {
            c.max_batch = m;
        }
        c.committed_required = self.pipeline.delivery == DeliveryName::EffectivelyOnce;
        c.lag_interval = Some(
            k.lag_interval
                .map_or(spate_kafka::DEFAULT_LAG_INTERVAL, |d| d.0),
        );
        c
    }

    /// The pipeline's (and its sink pool's) config.
    pub fn pipeline_config(&self) -> PipelineConfig {
        let ch = &self.sink.clickhouse;
        let mut sink = SinkConfig::new(self.pipeline.name.clone(), ch.shards.clone());
        // Issue 31: a tripped breaker follows its replica, not the last write.
        sink.probe_tripped = true;
        let batch = BatchConfig::default();
        sink.batch = BatchConfig {
            max_rows: ch.batch.max_rows.unwrap_or(batch.max_rows),
            max_bytes: ch.batch.max_bytes.map_or(batch.max_bytes, |b| b.0),
            linger: ch.batch.linger.map_or(batch.linger, |d| d.0),
        };
        if let Some(n) = ch.inflight.max_inflight {
            sink.max_inflight = n;
        }
        let retry = RetryConfig::default();
        sink.retry = RetryConfig {
            initial: ch.retry.initial.map_or(retry.initial, |d| d.0),
            max: ch.retry.max.map_or(retry.max, |d| d.0),
            max_attempts: ch.retry.max_attempts.unwrap_or(retry.max_attempts),
        };
        if let Some(t) = ch.write_timeout {
            sink.write_timeout = t.0;
        }
        let mut p = PipelineConfig::new(sink);
        p.threads = self.pipeline.threads;
        p.delivery = self.pipeline.delivery.into();
        p.table = format!("{}.{}", ch.database, ch.table);
        if let Some(d) = self.pipeline.idle_poll {
            p.idle_poll = d.0;
            // Raising idle_poll alone raises the cap with it.
            p.idle_poll_max = p.idle_poll_max.max(d.0);
        }
        if let Some(d) = self.pipeline.idle_poll_max {
            p.idle_poll_max = d.0;
        }
        p.checkpoint_interval = self.checkpoint.interval.0;
        p.shutdown_drain_timeout = self.shutdown.drain_timeout.0;
        p.rebalance_drain_timeout = self.rebalance.drain_timeout.0;
        p.on_error = match self.on_error.policy {
            Policy::Skip => OnError::Skip,
            Policy::Fail => OnError::Fail,
        };
        if let Some(b) = ch.inflight.max_bytes {
            p.budget_bytes = b.0;
        }
        if let Some(r) = ch.inflight.max_rows {
            p.budget_rows = r;
        }
        p
    }
}

/// Replaces `${NAME}` and `${NAME:-default}` in `text` with values from
/// `env`; `$${` is a literal `${`. Whole-line comments (first non-blank
/// character `#`) are left as they are, so a commented example may mention
/// a variable that is not set.
///
/// # Errors
/// [`ConfigError::UnsetVariable`] for an unset variable without default,
/// [`ConfigError::BadReference`] for an unclosed or nameless reference.
pub fn interpolate(
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
        } else {
            interpolate_line(line, i + 1, &env, &mut out)?;
        }
    }
    Ok(out)
}

/// `over` deep-merged onto `base`: mappings key by key (`over` wins),
/// anything else replaced whole by `over`. What `pipelines:` entries do
/// with `defaults:` and `tables:` routes with their pipeline.
pub fn merge(base: serde_norway::Value, over: serde_norway::Value) -> serde_norway::Value {
    use serde_norway::Value;
    match (base, over) {
        (Value::Mapping(mut base), Value::Mapping(over)) => {
            for (k, v) in over {
                let merged = match base.remove(&k) {
                    Some(b) => merge(b, v),
                    None => v,
                };
                base.insert(k, merged);
            }
            Value::Mapping(base)
        }
        (_, over) => over,
    }
}

fn interpolate_line(
    text: &str,
    line: usize,
    env: &impl Fn(&str) -> Option<String>,
    out: &mut String,
) -> Result<(), ConfigError> {
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        if at > 0 && rest.as_bytes()[at - 1] == b'$' {
            out.push_str(&rest[..at - 1]);
            out.push_str("${");
            rest = &rest[at + 2..];
            continue;
        }
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(ConfigError::BadReference {
                text: rest[at..].trim_end().to_owned(),
                line,
            });
        };
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        let valid = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(ConfigError::BadReference {
                text: format!("${{{inner}}}"),
                line,
            });
        }
        match (env(name), default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                return Err(ConfigError::UnsetVariable {
                    name: name.to_owned(),
                    line,
                });
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(())
}

/// Adds "did you mean `x`?" to serde's unknown-field and unknown-variant
/// messages when an expected name is close to the one written.
/// A parse error as a [`ConfigError::Parse`] naming the key's path, with a
/// did-you-mean where one is close.
fn parse_error(e: serde_path_to_error::Error<serde_norway::Error>) -> ConfigError {
    let key = e.path().to_string();
    let mut reason = did_you_mean(&e.inner().to_string());
    // serde_norway prefixes the key's own path (a wrong type) or its
    // parent's (an unknown key); the key already says it.
    let parent = key.rsplit_once('.').map(|(p, _)| p);
    for prefix in std::iter::once(key.as_str()).chain(parent) {
        if let Some(rest) = reason.strip_prefix(&format!("{prefix}: ")) {
            reason = rest.to_owned();
            break;
        }
    }
    ConfigError::Parse { key, reason }
}

fn did_you_mean(message: &str) -> String {
    let parse = || -> Option<String> {
        let (_, tail) = message
            .split_once("unknown field `")
            .or_else(|| message.split_once("unknown variant `"))?;
        let (written, tail) = tail.split_once('`')?;
        let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
        let best = expected
            .iter()
            .map(|e| (strsim::jaro_winkler(written, e), *e))
            .filter(|(score, _)| *score > 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))?;
        Some(best.1.to_owned())
    };
    match parse() {
        Some(best) => format!("{message}; did you mean `{best}`?"),
        None => message.to_owned(),
    }
}

pub mod pipelines;
pub mod tables;

#[cfg(test)]
mod tests;
