//! The formats that come with a schema, `format.avro` and
//! `format.protobuf`: planned at start against the table ([`plan_format`],
//! whose [`FormatPlan`] says JSON for the rest) and turned into one pipeline
//! thread's chain ([`avro_chain`], [`proto_chain`], used by
//! [`crate::service::build`]). This module depends on [`crate::error`] and
//! the config only; the assembly in [`crate::service`] depends on it.
//!
//! Start-up (docs/DESIGN.md "Control": fail before any offset moves):
//! - with a registry, the client is built from `format.*.registry` and
//!   asked `GET /subjects` (with its retries): a registry that does not
//!   answer, or refuses the credentials, fails `spate run` and `spate
//!   check` with an error naming the URL. It does not wait longer than the
//!   retry bound: a wrong URL or password should stop the start where a
//!   supervisor shows it, as a ClickHouse replica that never answers the
//!   schema probe does; a registry that is only slow to start is covered
//!   by `retry.attempts`/`backoff`.
//! - Avro with a registry: the latest schema of the subject
//!   (`format.avro.registry.subject`, default `{first topic}-value`) is
//!   planned against the table when the subject exists, so a writer schema
//!   the table cannot take fails the start, naming schema id, field and
//!   column; other ids are planned as messages name them.
//! - plain Avro: the schema file is read and planned; plain Protobuf: the
//!   descriptor set is loaded, the message found and planned.
//!
//! Running: Avro decodes with `spate_formats::avro` (explode, its own
//! router by Avro field), Protobuf with `spate_formats::protobuf` (one
//! row per message, routed by the Kafka key or round robin); both through
//! `mapping.filter` ([`Filtered`]). Neither follows a live table change
//! (ADR 0005's re-plan is JSON's): a changed column fails the batch and the
//! restart plans again.

use std::sync::Arc;

use prost_reflect::MessageDescriptor;
use spate_core::pipeline::chain::PayloadDecoder;
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_formats::avro::{
    AvroDecoder, AvroMapping, AvroOptions, AvroRouter, AvroRowEncoder, read_schema_file,
};
use spate_formats::json::route::ShardRouter;
use spate_formats::protobuf::{self, ProtoRowEncoder, ProtoSchemaSource};
use spate_formats::registry::{RegistryClient, SubjectVersion};
use spate_row::filter::{FilterExpr, Filtered};
use spate_row::shard::{ShardKey, ShardSpec};
use spate_row::spec::{ColumnSpec, MappingOptions};

use crate::config::formats::{AvroFormat, Framing, ProtobufFormat, RegistrySection};
use crate::config::{Config, ConfigError};
use crate::error::ServiceError;

/// One pipeline thread's Avro chain.
pub type AvroChain = ChainProcessor<AvroDecoder, Terminal<Filtered<AvroRowEncoder>, AvroRouter>>;

/// One pipeline thread's Protobuf chain.
pub type ProtoChain =
    ChainProcessor<PayloadDecoder, Terminal<Filtered<ProtoRowEncoder>, ShardRouter>>;

/// How a pipeline's messages decode, planned at start.
#[derive(Clone, Debug)]
pub enum FormatPlan {
    /// `format.json` (the chain is [`crate::service`]'s).
    Json,
    /// `format.avro`.
    Avro(AvroPlan),
    /// `format.protobuf`.
    Protobuf(ProtoPlan),
}

/// The Avro part of a plan.
#[derive(Clone, Debug)]
pub struct AvroPlan {
    /// The shared mapping (columns, options, plans by schema id).
    pub mapping: Arc<AvroMapping>,
    /// The framing.
    pub framing: Framing,
    /// The registry (Confluent framing).
    pub registry: Option<Arc<RegistryClient>>,
    /// The subject planned at start and its latest version (`None`: the
    /// subject is not registered yet, or plain framing).
    pub latest: Option<SubjectVersion>,
    /// The subject asked for at start (Confluent framing).
    pub subject: Option<String>,
}

/// The Protobuf part of a plan.
#[derive(Clone, Debug)]
pub enum ProtoPlan {
    /// Confluent framing: schemas by id from the registry.
    Registry {
        /// The registry.
        client: Arc<RegistryClient>,
    },
    /// Plain messages of one type from a descriptor set.
    Fixed {
        /// The message type.
        message: MessageDescriptor,
        /// Where it came from (the descriptor set's path), for errors.
        what: String,
    },
}

impl FormatPlan {
    /// The format's name.
    pub fn name(&self) -> &'static str {
        match self {
            FormatPlan::Json => "json",
            FormatPlan::Avro(_) => "avro",
            FormatPlan::Protobuf(_) => "protobuf",
        }
    }

    /// Lines describing the plan for `spate check` (empty for JSON).
    pub fn describe(&self) -> Vec<String> {
        match self {
            FormatPlan::Json => Vec::new(),
            FormatPlan::Avro(a) => {
                let mut out = vec![format!(
                    "format: avro, framing {}{}",
                    a.framing.as_str(),
                    a.registry
                        .as_ref()
                        .map(|r| format!(", writer schemas by id from the registry {}", r.url()))
                        .unwrap_or_default()
                )];
                match (&a.latest, &a.subject) {
                    (Some(v), _) => {
                        let plan = a.mapping.plan(Some(v.schema.id));
                        out.push(format!(
                            "writer schema: subject {} version {} (schema id {}): {}",
                            v.subject,
                            v.version,
                            v.schema.id,
                            match plan {
                                Ok(p) if p.is_direct() =>
                                    "planned, fields in the INSERT's order (no copy)".to_owned(),
                                Ok(_) => "planned, fields reordered into the INSERT's".to_owned(),
                                Err(e) => format!("PROBLEM: {e}"),
                            }
                        ));
                    }
                    (None, Some(s)) => out.push(format!(
                        "writer schema: subject {s} is not registered yet; each schema id is \
                         fetched and planned when a message first names it"
                    )),
                    (None, None) => {
                        if let Ok(p) = a.mapping.plan(None) {
                            out.push(format!(
                                "writer schema: the schema file, planned{}",
                                if p.is_direct() {
                                    ", fields in the INSERT's order (no copy)"
                                } else {
                                    ", fields reordered into the INSERT's"
                                }
                            ));
                        }
                    }
                }
                out
            }
            FormatPlan::Protobuf(ProtoPlan::Registry { client }) => vec![format!(
                "format: protobuf, framing confluent, schemas by id from the registry {}",
                client.url()
            )],
            FormatPlan::Protobuf(ProtoPlan::Fixed { message, what }) => vec![format!(
                "format: protobuf, framing plain, message {} from {what}",
                message.full_name()
            )],
        }
    }
}

/// The registry client of `section` (at `key`), asked `GET /subjects` so a
/// registry that is down or refuses the credentials fails here.
///
/// # Errors
/// [`ServiceError::Registry`] naming the key and the URL.
fn registry(section: &RegistrySection, key: &str) -> Result<Arc<RegistryClient>, ServiceError> {
    let config = section.client_config(key)?;
    let url = config.url.clone();
    let client = RegistryClient::new(config).map_err(|e| ConfigError::Invalid {
        key: format!("{key}.url"),
        reason: e.to_string(),
    })?;
    match client.check() {
        Ok(subjects) => {
            tracing::info!(registry = %url, subjects = subjects.len(), "schema registry answers");
            Ok(Arc::new(client))
        }
        Err(e) => Err(ServiceError::Registry {
            key: key.to_owned(),
            url,
            reason: e.to_string(),
        }),
    }
}

/// Plans `config`'s format for the INSERT `columns`: see the module doc.
/// `explode` is `mapping.explode`'s path (Avro only).
///
/// # Errors
/// [`ServiceError::Registry`] for a registry that does not answer,
/// [`ServiceError::Config`] for a file that cannot be used (naming its
/// key), [`ServiceError::Mapping`] for a schema the table cannot take.
pub fn plan_format(
    config: &Config,
    columns: &[ColumnSpec],
    options: &MappingOptions,
    explode: Option<Vec<String>>,
    filter: Option<&FilterExpr>,
) -> Result<FormatPlan, ServiceError> {
    if let Some(avro) = config.format.avro() {
        let plan = plan_avro(config, avro, columns, explode)?;
        // One encoder with the filter now, so a filter the Avro rows
        // cannot take fails here, not on a pipeline thread.
        Filtered::new(
            plan.mapping.encoder(),
            filter.cloned(),
            options.time.clone(),
        )
        .map_err(|e| mapping_err(config, e.to_string()))?;
        return Ok(FormatPlan::Avro(plan));
    }
    if let Some(proto) = config.format.protobuf() {
        let plan = FormatPlan::Protobuf(plan_protobuf(config, proto, explode.as_deref())?);
        // Build one encoder with the filter now (a plan error, a DEFAULT
        // literal, a filter constant fail here).
        let encoder = proto_encoder(&plan, columns, options).map_err(|e| mapping_err(config, e))?;
        Filtered::new(encoder, filter.cloned(), options.time.clone())
            .map_err(|e| mapping_err(config, e.to_string()))?;
        return Ok(plan);
    }
    Ok(FormatPlan::Json)
}

/// A schema the table cannot take, naming the table.
fn mapping_err(config: &Config, reason: String) -> ServiceError {
    ServiceError::Mapping {
        table: config.sink.clickhouse.table.clone(),
        reason,
    }
}

/// `format.avro`: with a registry (Confluent framing) the subject's latest
/// schema is planned now if there is one; plain, the schema file.
fn plan_avro(
    config: &Config,
    avro: &AvroFormat,
    columns: &[ColumnSpec],
    explode: Option<Vec<String>>,
) -> Result<AvroPlan, ServiceError> {
    let options = AvroOptions {
        flatten_join: config.mapping.flatten.clone(),
        explode,
    };
    if avro.framing() == Framing::Plain {
        return plan_avro_file(config, avro, columns, options);
    }
    let section = avro
        .registry
        .as_ref()
        .expect("validated: confluent framing has a registry");
    let client = registry(section, "format.avro.registry")?;
    let mapping = AvroMapping::confluent(
        columns.to_vec(),
        options,
        Arc::clone(&client) as Arc<dyn spate_formats::avro::SchemaSource>,
    )
    .map_err(|e| mapping_err(config, e.to_string()))?;
    let topic = config
        .source
        .kafka
        .topics
        .first()
        .cloned()
        .unwrap_or_default();
    let subject = section.subject_for(&topic);
    let latest = client
        .latest(&subject)
        .map_err(|e| ServiceError::Registry {
            key: "format.avro.registry.subject".into(),
            url: client.url().to_owned(),
            reason: e.to_string(),
        })?;
    if let Some(v) = &latest {
        mapping.plan(Some(v.schema.id)).map_err(|e| {
            let reason = format!(
                "the latest writer schema of subject {subject} (version {}): {e}",
                v.version
            );
            mapping_err(config, reason)
        })?;
    }
    Ok(AvroPlan {
        mapping,
        framing: Framing::Confluent,
        registry: Some(client),
        latest,
        subject: Some(subject),
    })
}

/// Plain `format.avro`: the schema file, read and planned.
fn plan_avro_file(
    config: &Config,
    avro: &AvroFormat,
    columns: &[ColumnSpec],
    options: AvroOptions,
) -> Result<AvroPlan, ServiceError> {
    let path = avro
        .schema_file
        .as_ref()
        .expect("validated: plain framing has a schema file");
    let schema = read_schema_file(path).map_err(|reason| ConfigError::Invalid {
        key: "format.avro.schema_file".into(),
        reason,
    })?;
    let mapping = AvroMapping::plain(columns.to_vec(), options, Arc::new(schema)).map_err(|e| {
        let reason = format!("{} (format.avro.schema_file): {e}", path.display());
        mapping_err(config, reason)
    })?;
    Ok(AvroPlan {
        mapping,
        framing: Framing::Plain,
        registry: None,
        latest: None,
        subject: None,
    })
}

/// `format.protobuf`: refuses `mapping.explode` and a field shard key;
/// with a registry the client, plain the message from the descriptor set.
fn plan_protobuf(
    config: &Config,
    proto: &ProtobufFormat,
    explode: Option<&[String]>,
) -> Result<ProtoPlan, ServiceError> {
    if explode.is_some() {
        return Err(ConfigError::Invalid {
            key: "mapping.explode".into(),
            reason: "not supported with format.protobuf (one row per message)".into(),
        }
        .into());
    }
    let spec = config.sink.clickhouse.shard_spec()?;
    if matches!(spec.key, ShardKey::Field(_)) {
        return Err(ConfigError::Invalid {
            key: "sink.clickhouse.shard_key".into(),
            reason: "format.protobuf rows shard by `kafka_key: true` or round robin; a \
                     field key is read from JSON messages only"
                .into(),
        }
        .into());
    }
    if proto.framing() == Framing::Confluent {
        let section = proto
            .registry
            .as_ref()
            .expect("validated: confluent framing has a registry");
        let client = registry(section, "format.protobuf.registry")?;
        return Ok(ProtoPlan::Registry { client });
    }
    let path = proto
        .descriptor_set
        .as_ref()
        .expect("validated: plain framing has a descriptor set");
    let invalid = |key: &str, reason: String| ConfigError::Invalid {
        key: key.into(),
        reason,
    };
    let pool = protobuf::source::load_descriptor_set(path)
        .map_err(|e| invalid("format.protobuf.descriptor_set", e.to_string()))?;
    let what = path.display().to_string();
    let name = proto
        .message
        .as_deref()
        .expect("validated: plain has a message");
    let message = protobuf::source::message_by_name(&pool, name, &what)
        .map_err(|e| invalid("format.protobuf.message", e.to_string()))?;
    Ok(ProtoPlan::Fixed { message, what })
}

/// A Protobuf encoder for one pipeline thread.
fn proto_encoder(
    plan: &FormatPlan,
    columns: &[ColumnSpec],
    options: &MappingOptions,
) -> Result<ProtoRowEncoder, String> {
    match plan {
        FormatPlan::Protobuf(ProtoPlan::Registry { client }) => ProtoRowEncoder::confluent(
            Arc::clone(client) as Arc<dyn ProtoSchemaSource>,
            columns.to_vec(),
            options.clone(),
        )
        .map_err(|e| e.to_string()),
        FormatPlan::Protobuf(ProtoPlan::Fixed { message, what }) => ProtoRowEncoder::fixed(
            message,
            protobuf::Framing::Plain,
            columns.to_vec(),
            options.clone(),
            what,
        )
        .map_err(|e| e.to_string()),
        _ => Err("not a protobuf plan".into()),
    }
}

/// One pipeline thread's Avro chain for `plan`.
pub fn avro_chain(
    plan: &AvroPlan,
    filter: Option<FilterExpr>,
    rules: spate_row::coerce::TimeRules,
    spec: ShardSpec,
    buffers: ChunkBuffers,
) -> AvroChain {
    let encoder = Filtered::new(plan.mapping.encoder(), filter, rules)
        .expect("plan_format checked the filter against these columns");
    ChainProcessor::new(
        plan.mapping.decoder(),
        Terminal::new(encoder, plan.mapping.router(spec), buffers),
    )
}

/// One pipeline thread's Protobuf chain for `plan`.
pub fn proto_chain(
    plan: &FormatPlan,
    columns: &[ColumnSpec],
    options: &MappingOptions,
    filter: Option<FilterExpr>,
    spec: ShardSpec,
    buffers: ChunkBuffers,
) -> ProtoChain {
    let encoder =
        proto_encoder(plan, columns, options).expect("plan_format built the same encoder");
    let encoder = Filtered::new(encoder, filter, options.time.clone())
        .expect("plan_format checked the filter against these columns");
    ChainProcessor::new(
        PayloadDecoder,
        Terminal::new(encoder, ShardRouter::with_spec(spec), buffers),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_testkit::sensor::avro as sensor;

    fn config(format: &str, extra: &str) -> Config {
        let text = format!(
            "pipeline: {{name: p}}\n\
             source: {{kafka: {{brokers: 'b:1', topics: [sensors], group_id: g}}}}\n\
             sink: {{clickhouse: {{shards: [[http://c:8123]], table: t{extra}}}}}\n\
             format: {format}\n"
        );
        Config::from_yaml(&text, |_| None).unwrap()
    }

    fn plan(c: &Config, explode: Option<Vec<String>>) -> Result<FormatPlan, ServiceError> {
        plan_format(c, &sensor::columns(), &c.mapping_options(), explode, None)
    }

    #[test]
    fn plain_avro_reads_and_plans_the_schema_file() {
        let file = spate_testkit::fixtures::dir().join("sensor_batch.avsc");
        let file = file.display();
        let c = config(&format!("{{avro: {{schema_file: '{file}'}}}}"), "");
        let p = plan(&c, Some(vec!["events".into()])).unwrap();
        let FormatPlan::Avro(a) = &p else {
            panic!("{p:?}")
        };
        assert_eq!(a.framing, Framing::Plain);
        assert!(a.mapping.plan(None).unwrap().explodes());
        assert!(
            p.describe()
                .iter()
                .any(|l| l.contains("the schema file, planned"))
        );
        // Without the fan-out the events array feeds no column: a plan
        // error naming a column, not rows with gaps.
        let e = plan(&c, None).unwrap_err().to_string();
        assert!(e.contains("format.avro.schema_file"), "{e}");
    }

    #[test]
    fn unusable_files_are_named_by_their_key() {
        let c = config("{avro: {schema_file: /nonexistent.avsc}}", "");
        let e = plan(&c, None).unwrap_err().to_string();
        assert!(
            e.contains("format.avro.schema_file") && e.contains("/nonexistent.avsc"),
            "{e}"
        );
        let c = config(
            "{protobuf: {descriptor_set: /nonexistent.pb, message: m.M}}",
            "",
        );
        let e = plan(&c, None).unwrap_err().to_string();
        assert!(e.contains("format.protobuf.descriptor_set"), "{e}");
    }

    #[test]
    fn protobuf_refuses_explode_and_field_shard_keys() {
        let c = config("{protobuf: {descriptor_set: /x.pb, message: m.M}}", "");
        let e = plan(&c, Some(vec!["events".into()]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mapping.explode"), "{e}");
        let c = config(
            "{protobuf: {descriptor_set: /x.pb, message: m.M}}",
            ", shard_key: {field: sensor_id}",
        );
        let e = plan(&c, None).unwrap_err().to_string();
        assert!(e.contains("sink.clickhouse.shard_key"), "{e}");
    }

    /// A registry nobody answers: the start fails naming key and URL.
    #[test]
    fn an_unreachable_registry_fails_the_plan_naming_it() {
        let c = config(
            "{avro: {registry: {url: 'http://127.0.0.1:1', retry: {attempts: 2, backoff: 10ms}}}}",
            "",
        );
        let e = plan(&c, None).unwrap_err();
        assert!(matches!(e, ServiceError::Registry { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.starts_with("format.avro.registry: schema registry http://127.0.0.1:1"),
            "{e}"
        );
        assert!(e.contains("after 2 attempt(s)"), "{e}");
    }
}
