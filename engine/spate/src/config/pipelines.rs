//! The process config: one pipeline (the single-pipeline form, a [`Config`]
//! document exactly as before) or several (`pipelines:`), each a full
//! [`Config`] once resolved.
//!
//! The multi-pipeline form, and its merge rule:
//!
//! ```yaml
//! admin: {listen: 127.0.0.1:9464}      # process-wide: one admin server
//! source: {kafka: {brokers: 'k:9092'}} # any other top-level section is a
//! sink: {clickhouse: {shards: [[http://c:8123]]}}  # default for every pipeline
//! shutdown: {drain_timeout: 20s}
//! pipelines:
//!   - pipeline: {name: orders}
//!     source: {kafka: {topics: [orders], group_id: spate-orders}}
//!     sink: {clickhouse: {table: orders}}
//!   - pipeline: {name: clicks}
//!     fail_process: true                # its failure stops the others
//!     source: {kafka: {topics: [clicks], group_id: spate-clicks}}
//!     sink: {clickhouse: {table: clicks, batch: {max_rows: 50000}}}
//! ```
//!
//! - Each entry of `pipelines` is deep-merged over the top-level sections
//!   (every top-level key but `pipelines` and `admin`): mappings merge key by
//!   key, the entry's value winning; a list or scalar in the entry replaces
//!   the default whole (topics, shards); an explicit `null` clears a default.
//!   The merged document is then read and validated as a single-pipeline
//!   [`Config`], so every key means what it means there; errors name the key
//!   as `pipelines[i].KEY`.
//! - `admin` is process-wide: only at the top level (an entry's `admin` is an
//!   error).
//! - `fail_process` (entry or top level, default `false`): when this
//!   pipeline stops on its own (an error, not a shutdown), the process shuts
//!   every other pipeline down too. Otherwise the others keep running.
//! - Checked across pipelines at load: `pipeline.name` distinct (it is part
//!   of every batch token, D4, and the `pipeline` metric label), and
//!   `source.kafka.group_id` distinct among pipelines on the same brokers
//!   (two pipelines in one group would split one topic set's partitions
//!   between them, each committing the other's offsets away).
//!
//! No I/O beyond reading the file, as in [`Config`].

use std::collections::BTreeMap;
use std::path::Path;

use serde_norway::{Mapping, Value};

use super::tables::{TABLES, TableRoute, describe, resolve_doc};
use super::{AdminSection, Config, ConfigError, interpolate, invalid, merge};

/// The process-level key listing the pipelines.
pub const PIPELINES: &str = "pipelines";
/// The per-pipeline key asking a failure to stop the whole process.
pub const FAIL_PROCESS: &str = "fail_process";

/// One pipeline of the process: its resolved config and its failure rule.
#[derive(Clone, Debug)]
pub struct PipelineEntry {
    /// The pipeline's config, defaults merged in and validated.
    pub config: Config,
    /// `fail_process`: a failure of this pipeline shuts the others down.
    pub fail_process: bool,
    /// `tables`: topic-to-table routes inside this pipeline (`tables.rs`);
    /// empty without it. With routes, `config` is the first route's.
    pub tables: Vec<TableRoute>,
}

impl PipelineEntry {
    /// The pipeline's name (`pipeline.name`).
    pub fn name(&self) -> &str {
        &self.config.pipeline.name
    }
}

/// What one `spate run` process runs.
#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// The admin server (top-level `admin`).
    pub admin: AdminSection,
    /// The pipelines, in file order; never empty.
    pub pipelines: Vec<PipelineEntry>,
    /// Whether the file used the `pipelines:` form (its series carry a
    /// `pipeline` label; the single form's keep their labels unchanged).
    pub multi: bool,
}

impl ProcessConfig {
    /// Reads, interpolates, parses and validates `path`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, variable or key.
    pub fn load(path: &Path) -> Result<ProcessConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        ProcessConfig::from_yaml(&text, |name| std::env::var(name).ok())
    }

    /// Parses `text` (either form) with `${NAME}` taken from `env`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the variable or the key (`pipelines[i].KEY`
    /// inside an entry).
    pub fn from_yaml(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ProcessConfig, ConfigError> {
        let resolved = interpolate(text, &env)?;
        let root: Value = serde_norway::from_str(&resolved).map_err(|e| ConfigError::Parse {
            key: ".".into(),
            reason: e.to_string(),
        })?;
        let multi = root.as_mapping().is_some_and(|m| m.contains_key(PIPELINES));
        if !multi {
            let routed = root.as_mapping().is_some_and(|m| m.contains_key(TABLES));
            let (config, tables) = match root {
                // The single form with routes to several tables.
                Value::Mapping(doc) if routed => resolve_doc("", doc)?,
                // The single form, read exactly as before.
                _ => (Config::from_yaml(text, &env)?, Vec::new()),
            };
            return Ok(ProcessConfig {
                admin: config.admin.clone(),
                pipelines: vec![PipelineEntry {
                    config,
                    fail_process: false,
                    tables,
                }],
                multi: false,
            });
        }
        let Value::Mapping(mut defaults) = root else {
            unreachable!("checked above: the root is a mapping")
        };
        let entries = match defaults.remove(PIPELINES) {
            Some(Value::Sequence(s)) if !s.is_empty() => s,
            Some(Value::Sequence(_)) => {
                return Err(invalid(PIPELINES, "must list at least one pipeline"));
            }
            _ => return Err(invalid(PIPELINES, "expected a list of pipelines")),
        };
        let admin = defaults.remove("admin");
        let mut pipelines = Vec::with_capacity(entries.len());
        for (i, entry) in entries.into_iter().enumerate() {
            pipelines.push(resolve(i, &defaults, admin.as_ref(), entry)?);
        }
        check_distinct(&pipelines)?;
        Ok(ProcessConfig {
            admin: pipelines[0].config.admin.clone(),
            pipelines,
            multi: true,
        })
    }
}

/// Entry `i` merged over `defaults`, with the process's `admin`, read as a
/// [`Config`].
fn resolve(
    i: usize,
    defaults: &Mapping,
    admin: Option<&Value>,
    entry: Value,
) -> Result<PipelineEntry, ConfigError> {
    let at = format!("{PIPELINES}[{i}]");
    let Value::Mapping(entry) = entry else {
        return Err(invalid(at, "expected a mapping (a pipeline's sections)"));
    };
    if entry.contains_key("admin") {
        return Err(invalid(
            format!("{at}.admin"),
            "the admin server is process-wide: set `admin` at the top level",
        ));
    }
    let Value::Mapping(mut merged) = merge(Value::Mapping(defaults.clone()), Value::Mapping(entry))
    else {
        unreachable!("a mapping merged over a mapping is a mapping")
    };
    let fail_process = match merged.remove(FAIL_PROCESS) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(invalid(
                format!("{at}.{FAIL_PROCESS}"),
                format!("expected true or false, got {}", describe(&other)),
            ));
        }
    };
    if let Some(a) = admin {
        merged.insert(Value::String("admin".into()), a.clone());
    }
    let (config, tables) = resolve_doc(&at, merged)?;
    Ok(PipelineEntry {
        config,
        fail_process,
        tables,
    })
}

/// Distinct `pipeline.name`s, and distinct `group_id`s per broker list.
fn check_distinct(pipelines: &[PipelineEntry]) -> Result<(), ConfigError> {
    let mut names = BTreeMap::new();
    let mut groups = BTreeMap::new();
    for (i, p) in pipelines.iter().enumerate() {
        if let Some(j) = names.insert(p.name().to_owned(), i) {
            return Err(invalid(
                format!("{PIPELINES}[{i}].pipeline.name"),
                format!(
                    "`{}` is also the name of pipelines[{j}]: each pipeline needs its own \
                     (batch tokens and the `pipeline` metric label carry it)",
                    p.name()
                ),
            ));
        }
        let k = &p.config.source.kafka;
        if let Some(j) = groups.insert((k.brokers.joined(), k.group_id.clone()), i) {
            return Err(invalid(
                format!("{PIPELINES}[{i}].source.kafka.group_id"),
                format!(
                    "`{}` is also the consumer group of pipelines[{j}] on the same brokers: \
                     the two would split the partitions and commit each other's offsets",
                    k.group_id
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    const MULTI: &str = "
admin: {listen: '127.0.0.1:0'}
source: {kafka: {brokers: 'b:1', properties: {session.timeout.ms: '6000'}}}
sink: {clickhouse: {shards: [[http://c:8123]], batch: {max_rows: 100}}}
shutdown: {drain_timeout: 7s}
pipelines:
  - pipeline: {name: a}
    source: {kafka: {topics: [ta], group_id: ga}}
    sink: {clickhouse: {table: a}}
  - pipeline: {name: b, delivery: effectively_once}
    fail_process: true
    source: {kafka: {topics: [tb], group_id: gb, properties: {fetch.min.bytes: '10'}}}
    sink: {clickhouse: {table: b, shards: [[http://d:8123]], batch: {max_rows: 5}}}
";

    fn err(text: &str) -> String {
        ProcessConfig::from_yaml(text, no_env)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn the_single_form_is_one_unlabelled_pipeline() {
        let text = "
pipeline: {name: p}
source: {kafka: {brokers: 'b:1', topics: [t], group_id: g}}
sink: {clickhouse: {shards: [[http://c:8123]], table: t}}
admin: {listen: 'off'}
";
        let p = ProcessConfig::from_yaml(text, no_env).unwrap();
        assert!(!p.multi);
        assert_eq!(p.pipelines.len(), 1);
        assert_eq!(p.admin.listen, "off");
        assert!(!p.pipelines[0].fail_process);
        assert_eq!(p.pipelines[0].name(), "p");
    }

    /// The merge rule: mappings merge key by key (the entry wins), lists
    /// and scalars are replaced whole; `admin` is the process's.
    #[test]
    fn entries_merge_over_the_top_level_defaults() {
        let p = ProcessConfig::from_yaml(MULTI, no_env).unwrap();
        assert!(p.multi);
        assert_eq!(p.admin.listen, "127.0.0.1:0");
        let [a, b] = &p.pipelines[..] else {
            panic!("two pipelines")
        };
        assert_eq!((a.name(), b.name()), ("a", "b"));
        assert!(!a.fail_process);
        assert!(b.fail_process);
        let (ca, cb) = (&a.config, &b.config);
        assert_eq!(ca.source.kafka.brokers.joined(), "b:1");
        assert_eq!(cb.source.kafka.brokers.joined(), "b:1");
        assert_eq!(ca.source.kafka.topics, ["ta"]);
        assert_eq!(cb.source.kafka.group_id, "gb");
        // Properties merge key by key.
        assert_eq!(cb.source.kafka.properties["session.timeout.ms"], "6000");
        assert_eq!(cb.source.kafka.properties["fetch.min.bytes"], "10");
        assert!(!ca.source.kafka.properties.contains_key("fetch.min.bytes"));
        // A list is replaced whole.
        assert_eq!(ca.sink.clickhouse.shards, [["http://c:8123"]]);
        assert_eq!(cb.sink.clickhouse.shards, [["http://d:8123"]]);
        assert_eq!(ca.pipeline_config().sink.batch.max_rows, 100);
        assert_eq!(cb.pipeline_config().sink.batch.max_rows, 5);
        assert_eq!(
            ca.pipeline_config().shutdown_drain_timeout,
            std::time::Duration::from_secs(7)
        );
        assert_eq!(
            cb.pipeline.delivery,
            super::super::DeliveryName::EffectivelyOnce
        );
        assert_eq!(
            ca.pipeline.delivery,
            super::super::DeliveryName::AtLeastOnce
        );
        assert_eq!(ca.admin.listen, "127.0.0.1:0");
    }

    #[test]
    fn a_null_in_an_entry_clears_a_default() {
        let text = MULTI.replace(
            "sink: {clickhouse: {table: a}}",
            "sink: {clickhouse: {table: a, batch: null}}",
        );
        let p = ProcessConfig::from_yaml(&text, no_env).unwrap();
        let default_rows = spate_core::sink::BatchConfig::default().max_rows;
        assert_eq!(
            p.pipelines[0].config.pipeline_config().sink.batch.max_rows,
            default_rows
        );
    }

    #[test]
    fn names_and_groups_must_be_distinct() {
        let e = err(&MULTI.replace("{name: b,", "{name: a,"));
        assert!(e.contains("pipelines[1].pipeline.name"), "{e}");
        assert!(e.contains("pipelines[0]"), "{e}");
        let e = err(&MULTI.replace("group_id: gb", "group_id: ga"));
        assert!(e.contains("pipelines[1].source.kafka.group_id"), "{e}");
        // The same group on other brokers is another group.
        let other = MULTI.replace("group_id: gb,", "group_id: ga, brokers: 'other:1',");
        ProcessConfig::from_yaml(&other, no_env).unwrap();
    }

    #[test]
    fn errors_inside_an_entry_name_the_entry_and_the_key() {
        let e = err(&MULTI.replace("{max_rows: 5}", "{max_rws: 5}"));
        assert!(e.contains("pipelines[1].sink.clickhouse.batch"), "{e}");
        assert!(e.contains("did you mean `max_rows`"), "{e}");
        let e = err(&MULTI.replace("topics: [ta], ", ""));
        assert!(e.contains("pipelines[0]"), "{e}");
        assert!(e.contains("topics"), "{e}");
        let e = err(&MULTI.replace("{name: a}", "{name: ' '}"));
        assert!(e.contains("pipelines[0].pipeline.name"), "{e}");
        let e = err(&MULTI.replace("fail_process: true", "fail_process: sometimes"));
        assert!(e.contains("pipelines[1].fail_process"), "{e}");
        let e = err(&MULTI.replace(
            "  - pipeline: {name: a}\n",
            "  - pipeline: {name: a}\n    admin: {listen: off}\n",
        ));
        assert!(e.contains("pipelines[0].admin"), "{e}");
        assert!(e.contains("top level"), "{e}");
        let e = err("admin: {listen: off}\npipelines: []\n");
        assert!(e.contains("`pipelines`: must list at least one"), "{e}");
        let e = err("pipelines: {a: 1}\n");
        assert!(e.contains("expected a list"), "{e}");
        let e = err("pipelines: [3]\n");
        assert!(e.contains("pipelines[0]"), "{e}");
        // A top-level key the single form does not know is caught in
        // every entry it merges into.
        let e = err(&format!("sinks: {{}}\n{MULTI}"));
        assert!(e.contains("pipelines[0]"), "{e}");
        assert!(e.contains("did you mean `sink`"), "{e}");
    }

    #[test]
    fn the_commented_example_loads() {
        let text = include_str!("../../../../examples/multi-table.yaml");
        let p = ProcessConfig::from_yaml(text, no_env).unwrap();
        assert!(p.multi);
        assert!(p.pipelines.len() >= 4, "{}", p.pipelines.len());
        let events = p.pipelines.iter().find(|e| e.name() == "events").unwrap();
        assert_eq!(events.tables.len(), 3);
        assert_eq!(events.tables[1].config.mapping.rename["url"], "page");
    }
}
