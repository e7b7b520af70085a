//! Topic-to-table routing inside one pipeline: the `tables:` map of a
//! pipeline document (single form or a `pipelines:` entry).
//!
//! ```yaml
//! source: {kafka: {brokers: 'k:9092', topics: ["^events\\..*"], group_id: g}}
//! sink: {clickhouse: {shards: [[http://c:8123]]}}     # no `table` here
//! tables:
//!   events.a: events_a                    # a plain topic: exact match
//!   "^events\\.b.*":                      # a `^regex` over the topic name
//!     table: events_b
//!     database: other                     # default: sink.clickhouse.database
//!     shard_key: {field: id}              # default: sink.clickhouse.shard_key
//!     mapping: {rename: {user: uid}}      # merged over the pipeline's mapping
//! ```
//!
//! - A record goes to the table of the **first** entry (in file order) its
//!   topic matches. A plain key matches that topic exactly; a key starting
//!   with `^` is a regular expression (Rust's `regex` syntax, searched in the
//!   topic name; the `^` anchors it at the start, as in a subscription).
//! - Each table gets its own resolved [`Config`]: the pipeline's document
//!   with `sink.clickhouse.table` (and `database`, `shard_key`) set from the
//!   entry and the entry's `mapping` deep-merged over the pipeline's (the
//!   merge rule of [`crate::config::merge`]). So each table has its own schema probe,
//!   INSERT plan and encoder; everything else (brokers, batch sizes, shards,
//!   retries, settings) is the pipeline's and shared.
//! - Without `source.kafka.topics`, the subscription is the list of keys.
//!   Every plain topic of `source.kafka.topics` must match an entry (a load
//!   error otherwise). A topic that matches no entry at run time (only a
//!   subscription pattern can bring one) is a record error of each of its
//!   records, handled by `on_error` (`fail` stops before committing it;
//!   `skip` dead-letters it with the reason): never written to a guessed
//!   table.
//! - Refused with `tables`: `sink.clickhouse.table` (each entry names its
//!   table), `pipeline.delivery: effectively_once` (its range formers
//!   carry one table; not built for several yet) and `mapping.explode`
//!   (a decoder of its own per thread, not per table), and any `format`
//!   but `format.json` (the routed chain decodes JSON only). `mapping.filter`
//!   and `mapping.defaults` work per table.

use regex::Regex;
use serde_norway::{Mapping, Value};

use super::{Config, ConfigError, invalid, merge, parse_error};

/// The key of the routing map in a pipeline document.
pub const TABLES: &str = "tables";

/// How a table entry's key matches topics.
#[derive(Clone, Debug)]
pub enum TopicMatch {
    /// A plain topic name, matched exactly.
    Exact(String),
    /// A `^regex`, searched in the topic name.
    Pattern(Regex),
}

impl TopicMatch {
    /// Whether `topic` matches.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            TopicMatch::Exact(t) => t == topic,
            TopicMatch::Pattern(r) => r.is_match(topic),
        }
    }
}

/// One entry of `tables`: which topics, and the table's resolved config.
#[derive(Clone, Debug)]
pub struct TableRoute {
    /// The entry's key as written (`events.a`, `^events\..*`).
    pub key: String,
    /// How it matches topics.
    pub matcher: TopicMatch,
    /// The pipeline's config with this table (and its mapping) in it.
    pub config: Config,
}

/// The index of the first route whose key matches `topic`.
pub fn route_of(routes: &[TableRoute], topic: &str) -> Option<usize> {
    routes.iter().position(|r| r.matcher.matches(topic))
}

/// Reads pipeline document `doc` (defaults already merged), its `tables`
/// included: the pipeline's config (the first table's, when there are
/// tables) and the routes. Errors name keys under `at` (`pipelines[i]`, or
/// empty for the single form).
///
/// # Errors
/// [`ConfigError`] naming the key.
pub fn resolve_doc(at: &str, mut doc: Mapping) -> Result<(Config, Vec<TableRoute>), ConfigError> {
    let Some(tables) = doc.remove(TABLES) else {
        let config = read(Value::Mapping(doc)).map_err(|e| prefix(at, e))?;
        return Ok((config, Vec::new()));
    };
    let Value::Mapping(tables) = tables else {
        return Err(invalid(
            join(at, TABLES),
            "expected a map from topic (or ^regex) to table",
        ));
    };
    if tables.is_empty() {
        return Err(invalid(join(at, TABLES), "must name at least one table"));
    }
    refuse_with_tables(at, &doc)?;
    let keys = route_keys(at, &tables)?;
    if lookup(&doc, &["source", "kafka", "topics"]).is_none() {
        // The subscription is the routed topics and patterns.
        let topics = Value::Sequence(keys.iter().cloned().map(Value::String).collect());
        let over = nest(&["source", "kafka", "topics"], topics);
        let Value::Mapping(merged) = merge(Value::Mapping(doc), over) else {
            unreachable!("a mapping merged over a mapping is a mapping")
        };
        doc = merged;
    }
    let mut routes = Vec::with_capacity(keys.len());
    for (key, value) in keys.into_iter().zip(tables.into_iter().map(|(_, v)| v)) {
        routes.push(route(at, &doc, key, value)?);
    }
    let config = routes[0].config.clone();
    for (i, topic) in config.source.kafka.topics.iter().enumerate() {
        if !topic.starts_with('^') && route_of(&routes, topic).is_none() {
            return Err(invalid(
                join(at, &format!("source.kafka.topics[{i}]")),
                format!("topic `{topic}` matches no entry of `tables`"),
            ));
        }
    }
    Ok((config, routes))
}

/// What a pipeline document with `tables` must not set: its own table,
/// `effectively_once`, a format other than JSON.
fn refuse_with_tables(at: &str, doc: &Mapping) -> Result<(), ConfigError> {
    if lookup(doc, &["sink", "clickhouse", "table"]).is_some() {
        return Err(invalid(
            join(at, "sink.clickhouse.table"),
            "set together with `tables`: each entry of `tables` names its table",
        ));
    }
    if lookup(doc, &["pipeline", "delivery"]).and_then(Value::as_str) == Some("effectively_once") {
        return Err(invalid(
            join(at, TABLES),
            "not with pipeline.delivery: effectively_once yet (its range formers carry one \
             table); use one pipeline per table (`pipelines:`)",
        ));
    }
    // The routed chain decodes JSON (object or NDJSON) only: a format
    // section added later (another decoder) must not be read as JSON.
    if let Some(Value::Mapping(format)) = lookup(doc, &["format"]) {
        if let Some(other) = format.keys().find(|k| k.as_str() != Some("json")) {
            return Err(invalid(
                join(at, &format!("format.{}", other.as_str().unwrap_or("?"))),
                "not with `tables` yet: routing decodes JSON (format.json) only",
            ));
        }
    }
    Ok(())
}

/// The keys of `tables`: each a topic name or a `^regex`.
fn route_keys(at: &str, tables: &Mapping) -> Result<Vec<String>, ConfigError> {
    tables
        .keys()
        .map(|k| match k {
            Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
            other => Err(invalid(
                join(at, TABLES),
                format!("a key is a topic name or a ^regex, got {}", describe(other)),
            )),
        })
        .collect()
}

/// The route of entry `key: value` of `tables`: its matcher and the
/// pipeline's document `doc` with the entry merged over it, read as a
/// config (errors name the entry).
fn route(at: &str, doc: &Mapping, key: String, value: Value) -> Result<TableRoute, ConfigError> {
    let key_of = |k: &str| join(at, &format!("{TABLES}.{k}"));
    let matcher = if key.starts_with('^') {
        TopicMatch::Pattern(
            Regex::new(&key).map_err(|e| invalid(key_of(&key), format!("bad regex: {e}")))?,
        )
    } else {
        TopicMatch::Exact(key.clone())
    };
    let over = table_doc(&key_of(&key), value)?;
    let merged = merge(Value::Mapping(doc.clone()), over);
    let config = read(merged).map_err(|e| {
        let e = prefix(at, e);
        match e {
            ConfigError::Parse { key: k, reason } => ConfigError::Parse {
                key: k,
                reason: format!("{reason} (in table entry `{key}`)"),
            },
            ConfigError::Invalid { key: k, reason } => ConfigError::Invalid {
                key: k,
                reason: format!("{reason} (in table entry `{key}`)"),
            },
            other => other,
        }
    })?;
    if config.mapping.explode.is_some() {
        return Err(invalid(
            join(at, "mapping.explode"),
            format!(
                "not with `tables` yet (in table entry `{key}`): use one pipeline per \
                 table (`pipelines:`)"
            ),
        ));
    }
    Ok(TableRoute {
        key,
        matcher,
        config,
    })
}

/// The partial document entry `value` (at `key`) merges over the pipeline's.
fn table_doc(key: &str, value: Value) -> Result<Value, ConfigError> {
    let mut clickhouse = Mapping::new();
    let mut doc = Mapping::new();
    match value {
        Value::String(table) => {
            clickhouse.insert("table".into(), Value::String(table));
        }
        Value::Mapping(m) => {
            for (k, v) in m {
                match k.as_str() {
                    Some(name @ ("table" | "database" | "shard_key")) => {
                        clickhouse.insert(name.into(), v);
                    }
                    Some("mapping") => {
                        doc.insert("mapping".into(), v);
                    }
                    _ => {
                        return Err(invalid(
                            key,
                            format!(
                                "unknown key {} (a table entry has table, database, shard_key, \
                                 mapping)",
                                describe(&k)
                            ),
                        ));
                    }
                }
            }
            if !clickhouse.contains_key("table") {
                return Err(invalid(format!("{key}.table"), "missing"));
            }
        }
        other => {
            return Err(invalid(
                key,
                format!(
                    "expected a table name or {{table, database, shard_key, mapping}}, got {}",
                    describe(&other)
                ),
            ));
        }
    }
    let mut sink = Mapping::new();
    sink.insert("clickhouse".into(), Value::Mapping(clickhouse));
    doc.insert("sink".into(), Value::Mapping(sink));
    Ok(Value::Mapping(doc))
}

/// Deserializes and validates one resolved document.
fn read(doc: Value) -> Result<Config, ConfigError> {
    let mut config: Config = serde_path_to_error::deserialize(doc).map_err(parse_error)?;
    super::secrets::lift_url_credentials(&mut config)?;
    config.validate()?;
    Ok(config)
}

fn lookup<'a>(doc: &'a Mapping, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let v = doc.get(*first)?;
    if rest.is_empty() {
        return (!v.is_null()).then_some(v);
    }
    lookup(v.as_mapping()?, rest)
}

fn nest(path: &[&str], leaf: Value) -> Value {
    path.iter().rev().fold(leaf, |inner, k| {
        let mut m = Mapping::new();
        m.insert(Value::String((*k).to_owned()), inner);
        Value::Mapping(m)
    })
}

/// `at.key` (`key` alone when `at` is empty, `at` alone for the root).
pub(super) fn join(at: &str, key: &str) -> String {
    match (at.is_empty(), key == "." || key.is_empty()) {
        (true, true) => ".".to_owned(),
        (true, false) => key.to_owned(),
        (false, true) => at.to_owned(),
        (false, false) => format!("{at}.{key}"),
    }
}

/// `e` with its key under `at`.
pub(super) fn prefix(at: &str, e: ConfigError) -> ConfigError {
    match e {
        ConfigError::Parse { key, reason } => ConfigError::Parse {
            key: join(at, &key),
            reason,
        },
        ConfigError::Invalid { key, reason } => ConfigError::Invalid {
            key: join(at, &key),
            reason,
        },
        other => other,
    }
}

pub(super) fn describe(v: &Value) -> String {
    serde_norway::to_string(v)
        .map(|s| format!("`{}`", s.trim()))
        .unwrap_or_else(|_| "another type".into())
}

#[cfg(test)]
mod tests {
    use super::super::pipelines::ProcessConfig;
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    const ROUTED: &str = r#"
pipeline: {name: p}
source: {kafka: {brokers: 'b:1', group_id: g}}
sink: {clickhouse: {shards: [[http://c:8123]], database: db}}
mapping: {rename: {a: x}}
tables:
  events.a: ta
  "^events\\.b.*":
    table: tb
    database: other
    mapping: {rename: {b: y}}
  "^events\\..*": tc
"#;

    fn load(text: &str) -> ProcessConfig {
        ProcessConfig::from_yaml(text, no_env).unwrap()
    }

    fn err(text: &str) -> String {
        ProcessConfig::from_yaml(text, no_env)
            .unwrap_err()
            .to_string()
    }

    /// Each entry resolves to the pipeline's config with its own table and
    /// merged mapping; the subscription defaults to the keys; the first
    /// matching entry wins.
    #[test]
    fn tables_resolve_per_entry_and_route_by_first_match() {
        let p = load(ROUTED);
        assert!(!p.multi);
        let e = &p.pipelines[0];
        assert_eq!(e.tables.len(), 3);
        let [a, b, c] = &e.tables[..] else {
            panic!("three routes")
        };
        assert_eq!(
            e.config.source.kafka.topics,
            ["events.a", "^events\\.b.*", "^events\\..*"]
        );
        assert_eq!(
            (
                a.config.sink.clickhouse.database.as_str(),
                a.config.sink.clickhouse.table.as_str()
            ),
            ("db", "ta")
        );
        assert_eq!(
            (
                b.config.sink.clickhouse.database.as_str(),
                b.config.sink.clickhouse.table.as_str()
            ),
            ("other", "tb")
        );
        assert_eq!(c.config.sink.clickhouse.table, "tc");
        // The mapping merges key by key.
        assert_eq!(a.config.mapping.rename.len(), 1);
        assert_eq!(b.config.mapping.rename["a"], "x");
        assert_eq!(b.config.mapping.rename["b"], "y");
        let routes = &e.tables;
        assert_eq!(route_of(routes, "events.a"), Some(0));
        assert_eq!(route_of(routes, "events.b"), Some(1));
        assert_eq!(route_of(routes, "events.bx"), Some(1));
        assert_eq!(route_of(routes, "events.c"), Some(2));
        assert_eq!(route_of(routes, "eventsXa"), None);
        assert_eq!(route_of(routes, "other"), None);
        assert_eq!(route_of(routes, "x.events.a"), None);
    }

    #[test]
    fn tables_work_inside_a_pipelines_entry() {
        let text = r#"
source: {kafka: {brokers: 'b:1'}}
sink: {clickhouse: {shards: [[http://c:8123]]}}
pipelines:
  - pipeline: {name: p}
    source: {kafka: {group_id: g, topics: [events.a, "^events\\..*"]}}
    tables: {events.a: ta, "^events\\..*": tb}
  - {pipeline: {name: q}, source: {kafka: {group_id: h, topics: [q]}}, sink: {clickhouse: {table: q}}}
"#;
        let p = load(text);
        assert_eq!(p.pipelines[0].tables.len(), 2);
        assert!(p.pipelines[1].tables.is_empty());
        assert_eq!(p.pipelines[1].config.sink.clickhouse.table, "q");
    }

    #[test]
    fn bad_tables_name_their_key() {
        let e = err(&ROUTED.replace("database: db}", "database: db, table: t}"));
        assert!(e.contains("`sink.clickhouse.table`"), "{e}");
        let e = err(&ROUTED.replace(
            "pipeline: {name: p}",
            "pipeline: {name: p, delivery: effectively_once}",
        ));
        assert!(
            e.contains("`tables`") && e.contains("effectively_once"),
            "{e}"
        );
        let e = err(&ROUTED.replace("\"^events\\\\..*\": tc", "\"^events(\": tc"));
        assert!(e.contains("tables.^events("), "{e}");
        assert!(e.contains("bad regex"), "{e}");
        let e = err(&ROUTED.replace("    database: other\n", "    databse: other\n"));
        assert!(e.contains("tables.^events\\.b.*"), "{e}");
        assert!(e.contains("databse"), "{e}");
        let e = err(&ROUTED.replace("    table: tb\n", ""));
        assert!(e.contains("tables.^events\\.b.*.table"), "{e}");
        let e = err(&ROUTED.replace("events.a: ta", "events.a: [ta]"));
        assert!(e.contains("tables.events.a"), "{e}");
        let e = err(&ROUTED.replace("group_id: g}", "group_id: g, topics: [events.a, other]}"));
        assert!(e.contains("source.kafka.topics[1]"), "{e}");
        assert!(e.contains("`other` matches no entry"), "{e}");
        let e = err(&ROUTED.replace(
            "mapping: {rename: {a: x}}",
            "mapping: {rename: {a: x}, explode: /items}",
        ));
        assert!(e.contains("`mapping.explode`"), "{e}");
        assert!(e.contains("not with `tables`"), "{e}");
        let e = err(&format!("format: {{avro: {{}}}}\n{ROUTED}"));
        assert!(e.contains("`format.avro`") && e.contains("JSON"), "{e}");
        let e = err(&ROUTED.replace("mapping: {rename: {b: y}}", "mapping: {renam: {b: y}}"));
        assert!(e.contains("mapping"), "{e}");
        assert!(e.contains("did you mean `rename`"), "{e}");
        assert!(e.contains("in table entry `^events\\.b.*`"), "{e}");
        let e = err(
            "pipeline: {name: p}\nsource: {kafka: {brokers: 'b:1', group_id: g}}\nsink: {clickhouse: {shards: [[http://c:8123]]}}\ntables: {}\n",
        );
        assert!(e.contains("at least one table"), "{e}");
    }
}
