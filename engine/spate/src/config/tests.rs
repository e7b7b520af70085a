use super::*;

const EXAMPLE: &str = include_str!("../../../../examples/spate.yaml");

fn no_env(_: &str) -> Option<String> {
    None
}

const MINIMAL: &str = "
pipeline: {name: p}
source: {kafka: {brokers: 'b:1', topics: [t], group_id: g}}
sink: {clickhouse: {shards: [[http://c:8123]], table: t}}
";

fn err(text: &str) -> String {
    Config::from_yaml(text, no_env).unwrap_err().to_string()
}

#[test]
fn example_file_loads_with_defaults_from_env_fallbacks() {
    let c = Config::from_yaml(EXAMPLE, no_env).unwrap();
    assert_eq!(c.source.kafka.brokers.joined(), "127.0.0.1:9092");
    assert_eq!(
        c.sink.clickhouse.shards,
        vec![vec!["http://127.0.0.1:8123".to_owned()]]
    );
    let p = c.pipeline_config();
    assert_eq!(p.sink.batch.max_bytes, 64 << 20);
    assert_eq!(p.sink.batch.linger, Duration::from_millis(500));
    assert_eq!(p.checkpoint_interval, Duration::from_secs(1));
    assert_eq!(p.budget_bytes, 256 << 20);
}

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::from_yaml(MINIMAL, no_env).unwrap();
    assert_eq!(c.pipeline.threads, 1);
    assert_eq!(c.sink.clickhouse.database, "default");
    assert_eq!(c.admin.listen, "127.0.0.1:9464");
    let k = c.kafka_config();
    assert_eq!(k.properties["auto.offset.reset"], "earliest");
    assert_eq!(c.pipeline_config().on_error, OnError::Fail);
}

#[test]
fn env_interpolation_and_defaults() {
    let env = |n: &str| (n == "HOST").then(|| "kafka:9092".to_owned());
    assert_eq!(
        interpolate("a: ${HOST}\nb: ${PORT:-1}\nc: $${HOST}", env).unwrap(),
        "a: kafka:9092\nb: 1\nc: ${HOST}"
    );
    match interpolate("x: 1\ny: ${MISSING}", env) {
        Err(ConfigError::UnsetVariable { name, line }) => {
            assert_eq!(name, "MISSING");
            assert_eq!(line, 2);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        interpolate("${OPEN", env),
        Err(ConfigError::BadReference { .. })
    ));
    assert_eq!(
        interpolate("  # ${UNSET} in a comment\n", env).unwrap(),
        "  # ${UNSET} in a comment\n"
    );
    assert!(matches!(
        interpolate("${a b}", env),
        Err(ConfigError::BadReference { .. })
    ));
}

#[test]
fn unknown_key_names_its_path_and_suggests() {
    let text = MINIMAL.replace("group_id", "grup_id");
    let e = err(&text);
    assert!(e.contains("source.kafka"), "{e}");
    assert!(e.contains("did you mean `group_id`"), "{e}");
    let e = err(&format!("{MINIMAL}\nadmn: {{listen: off}}"));
    assert!(e.contains("did you mean `admin`"), "{e}");
}

#[test]
fn bad_values_name_the_key() {
    let e = err(&format!("{MINIMAL}\ncheckpoint: {{interval: soon}}"));
    assert!(e.contains("checkpoint.interval"), "{e}");
    let e = err(&MINIMAL.replace("group_id: g", "group_id: g, auto_offset_reset: newest"));
    assert!(e.contains("source.kafka.auto_offset_reset"), "{e}");
    let e = err(&MINIMAL.replace("http://c:8123", "c:8123"));
    assert!(e.contains("sink.clickhouse.shards[0][0]"), "{e}");
    let e = err(&MINIMAL.replace("{name: p}", "{name: p, threads: 0}"));
    assert!(e.contains("pipeline.threads"), "{e}");
    let e = err(&MINIMAL.replace("{name: p}", "{name: p, threads: two}"));
    assert_eq!(
        e.matches("pipeline.threads").count(),
        1,
        "the key once: {e}"
    );
    let e = err(&MINIMAL.replace("table: t", "table: t, batch: {max_rows: 0}"));
    assert_eq!(
        e.matches("max_rows").count(),
        1,
        "the key once, in the YAML's spelling: {e}"
    );
    let e = err(&format!("{MINIMAL}\non_error: {{policy: sikp}}"));
    assert!(
        e.contains("on_error.policy") && e.contains("did you mean `skip`"),
        "{e}"
    );
    let e = err(&MINIMAL.replace(
        "group_id: g",
        "group_id: g, properties: {enable.auto.commit: 'true'}",
    ));
    assert!(e.contains("enable.auto.commit"), "{e}");
    let e = err(&format!(
        "{MINIMAL}\nmapping: {{columns: {{mag: properties/mag}}}}"
    ));
    assert!(e.contains("mapping.columns.mag"), "{e}");
}

#[test]
fn byte_sizes() {
    assert_eq!(ByteSize::parse("123"), Some(ByteSize(123)));
    assert_eq!(ByteSize::parse("8MiB"), Some(ByteSize(8 << 20)));
    assert_eq!(ByteSize::parse("1 GiB"), Some(ByteSize(1 << 30)));
    assert_eq!(ByteSize::parse("8MB"), None);
    assert_eq!(ByteSize::parse("MiB"), None);
}

#[test]
fn shard_key_parses_each_form_and_names_a_bad_pointer() {
    let with = |key: &str| {
        format!("{MINIMAL}\n").replace("table: t}}", &format!("table: t, shard_key: {key}}}}}"))
    };
    let c = Config::from_yaml(&with("{field: carrier}"), no_env).unwrap();
    assert_eq!(
        c.sink.clickhouse.shard_key().unwrap(),
        ShardKey::field("carrier")
    );
    let c = Config::from_yaml(&with("{kafka_key: true}"), no_env).unwrap();
    assert_eq!(c.sink.clickhouse.shard_key().unwrap(), ShardKey::KafkaKey);
    let c = Config::from_yaml(&with("{pointer: /a/b}"), no_env).unwrap();
    assert_eq!(
        c.sink.clickhouse.shard_key().unwrap(),
        ShardKey::Field(vec!["a".into(), "b".into()])
    );
    assert_eq!(
        Config::from_yaml(MINIMAL, no_env)
            .unwrap()
            .sink
            .clickhouse
            .shard_key()
            .unwrap(),
        ShardKey::None
    );
    let e = Config::from_yaml(&with("{pointer: no-slash}"), no_env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sink.clickhouse.shard_key.pointer"), "{e}");
}

#[test]
fn compression_tls_and_json_mode_parse_and_name_bad_keys() {
    use spate_clickhouse::writer::Compression;
    let c = Config::from_yaml(MINIMAL, no_env).unwrap();
    assert_eq!(c.sink.clickhouse.compression().unwrap(), Compression::None);
    assert_eq!(c.format.json().mode, JsonMode::Object);
    assert_eq!(c.sink.clickhouse.tls, TlsSection::default());

    let text = MINIMAL
        .replace(
            "table: t}",
            "table: t, compression: gzip, tls: {ca_file: /etc/ca.pem}}",
        )
        .replace("http://c:8123", "https://c:8443");
    let c = Config::from_yaml(
        &format!("{text}\nformat: {{json: {{mode: ndjson}}}}"),
        no_env,
    )
    .unwrap();
    assert_eq!(
        c.sink.clickhouse.compression().unwrap(),
        Compression::Gzip { level: 1 }
    );
    assert_eq!(
        c.sink.clickhouse.tls.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/ca.pem"))
    );
    assert!(!c.sink.clickhouse.tls.insecure);
    assert_eq!(c.format.json().mode, JsonMode::Ndjson);

    let e = err(&MINIMAL.replace("table: t}", "table: t, compression: zstd}"));
    assert!(e.contains("sink.clickhouse.compression"), "{e}");
    assert!(e.contains("gzip"), "{e}");
    let e = err(&MINIMAL.replace("table: t}", "table: t, compression: gzp}"));
    assert!(e.contains("did you mean `gzip`"), "{e}");
    let e = err(&MINIMAL.replace(
        "table: t}",
        "table: t, compression: deflate, compression_level: 12}",
    ));
    assert!(e.contains("sink.clickhouse.compression_level"), "{e}");
    let e = err(&MINIMAL.replace("table: t}", "table: t, compression_level: 3}"));
    assert!(e.contains("sink.clickhouse.compression_level"), "{e}");
    let e = err(&MINIMAL.replace(
        "table: t}",
        "table: t, tls: {ca_file: a.pem, insecure: true}}",
    ));
    assert!(e.contains("sink.clickhouse.tls.insecure"), "{e}");
    let e = err(&MINIMAL.replace("table: t}", "table: t, tls: {insecur: true}}"));
    assert!(e.contains("did you mean `insecure`"), "{e}");
    let e = err(&format!("{MINIMAL}\nformat: {{json: {{mode: lines}}}}"));
    assert!(e.contains("format.json.mode"), "{e}");
}

#[test]
fn idle_poll_keys_reach_the_pipeline_and_are_checked() {
    let p = Config::from_yaml(MINIMAL, no_env)
        .unwrap()
        .pipeline_config();
    assert_eq!(
        (p.idle_poll, p.idle_poll_max),
        (Duration::from_millis(1), Duration::from_millis(10))
    );
    let text = MINIMAL.replace(
        "{name: p}",
        "{name: p, idle_poll: 2ms, idle_poll_max: 50ms}",
    );
    let p = Config::from_yaml(&text, no_env).unwrap().pipeline_config();
    assert_eq!(
        (p.idle_poll, p.idle_poll_max),
        (Duration::from_millis(2), Duration::from_millis(50))
    );
    let text = MINIMAL.replace("{name: p}", "{name: p, idle_poll: 50ms}");
    let p = Config::from_yaml(&text, no_env).unwrap().pipeline_config();
    assert_eq!(
        (p.idle_poll, p.idle_poll_max),
        (Duration::from_millis(50), Duration::from_millis(50)),
        "raising idle_poll alone raises the cap with it"
    );
    let e = err(&MINIMAL.replace(
        "{name: p}",
        "{name: p, idle_poll: 20ms, idle_poll_max: 5ms}",
    ));
    assert!(e.contains("pipeline.idle_poll_max"), "{e}");
    let e = err(&MINIMAL.replace("{name: p}", "{name: p, idle_poll: 1h}"));
    assert!(e.contains("`pipeline.idle_poll`"), "{e}");
    assert_eq!(e.matches("pipeline.idle_poll").count(), 1, "{e}");
}

#[test]
fn rebalance_drain_timeout_reaches_the_pipeline_and_is_checked_against_max_poll() {
    let c = Config::from_yaml(MINIMAL, no_env).unwrap();
    let p = c.pipeline_config();
    assert_eq!(
        (
            p.rebalance_drain_timeout,
            p.shutdown_drain_timeout,
            p.checkpoint_interval
        ),
        (
            pipeline::DEFAULT_REBALANCE_DRAIN_TIMEOUT,
            pipeline::DEFAULT_SHUTDOWN_DRAIN_TIMEOUT,
            pipeline::DEFAULT_CHECKPOINT_INTERVAL
        ),
        "YAML defaults and PipelineConfig::new agree"
    );
    let text = format!("{MINIMAL}rebalance: {{drain_timeout: 20s}}\n");
    let p = Config::from_yaml(&text, no_env).unwrap().pipeline_config();
    assert_eq!(p.rebalance_drain_timeout, Duration::from_secs(20));
    // 200 s is more than half of librdkafka's default 300 s.
    let e = err(&format!("{MINIMAL}rebalance: {{drain_timeout: 200s}}\n"));
    assert!(
        e.contains("rebalance.drain_timeout") && e.contains("max.poll.interval.ms"),
        "{e}"
    );
    // Raising max.poll.interval.ms makes room for it.
    let text = MINIMAL.replace(
        "group_id: g}",
        "group_id: g, properties: {max.poll.interval.ms: '600000'}}",
    ) + "rebalance: {drain_timeout: 200s}\n";
    let p = Config::from_yaml(&text, no_env).unwrap().pipeline_config();
    assert_eq!(p.rebalance_drain_timeout, Duration::from_secs(200));
    let text = MINIMAL.replace(
        "group_id: g}",
        "group_id: g, properties: {max.poll.interval.ms: '15000'}}",
    );
    let e = err(&text);
    assert!(e.contains("rebalance.drain_timeout"), "{e}");
}

#[test]
fn insert_format_and_schema_refresh_parse_and_name_bad_keys() {
    use spate_clickhouse::writer::{DEFAULT_SCHEMA_REFRESH, InsertFormat};
    let c = Config::from_yaml(MINIMAL, no_env).unwrap();
    assert_eq!(c.sink.clickhouse.format, FormatName::Native);
    let w = crate::service::writer_config(&c, Vec::new()).unwrap();
    assert_eq!(w.format, InsertFormat::Native);
    assert_eq!(w.schema_refresh, Some(DEFAULT_SCHEMA_REFRESH));

    let c = Config::from_yaml(
        &MINIMAL.replace(
            "table: t}",
            "table: t, format: rowbinary, schema_refresh: 5s}",
        ),
        no_env,
    )
    .unwrap();
    let w = crate::service::writer_config(&c, Vec::new()).unwrap();
    assert_eq!(w.format, InsertFormat::RowBinary);
    assert_eq!(w.schema_refresh, Some(std::time::Duration::from_secs(5)));

    let e = err(&MINIMAL.replace("table: t}", "table: t, format: json}"));
    assert!(e.contains("sink.clickhouse.format"), "{e}");
    assert!(e.contains("native"), "{e}");
    let e = err(&MINIMAL.replace("table: t}", "table: t, schema_refresh: soon}"));
    assert!(e.contains("sink.clickhouse.schema_refresh"), "{e}");
}

#[test]
fn epoch_units_and_empty_strings_parse_globally_and_per_column() {
    use spate_row::coerce::EpochUnit;
    let c = Config::from_yaml(MINIMAL, no_env).unwrap();
    assert_eq!(c.time.epoch_unit.unit(), EpochUnit::Auto);
    assert!(!c.mapping.empty_as_null);
    let c = Config::from_yaml(
        &format!(
            "{MINIMAL}\ntime: {{epoch_unit: ms}}\nmapping: {{empty_as_null: true, \
             column_options: {{at: {{epoch_unit: us}}, name: {{empty_as_null: false}}}}}}"
        ),
        no_env,
    )
    .unwrap();
    assert_eq!(c.time.epoch_unit.unit(), EpochUnit::Millis);
    assert!(c.mapping.empty_as_null);
    let at = &c.mapping.column_options["at"];
    assert_eq!(
        at.epoch_unit.map(EpochUnitName::unit),
        Some(EpochUnit::Micros)
    );
    assert_eq!(at.empty_as_null, None);
    assert_eq!(c.mapping.column_options["name"].empty_as_null, Some(false));
    for (text, unit) in [
        ("auto", EpochUnit::Auto),
        ("s", EpochUnit::Seconds),
        ("ns", EpochUnit::Nanos),
    ] {
        let c =
            Config::from_yaml(&format!("{MINIMAL}\ntime: {{epoch_unit: {text}}}"), no_env).unwrap();
        assert_eq!(c.time.epoch_unit.unit(), unit);
    }
    let e = err(&format!("{MINIMAL}\ntime: {{epoch_unit: millis}}"));
    assert!(e.contains("time.epoch_unit"), "{e}");
    let e = err(&format!(
        "{MINIMAL}\nmapping: {{column_options: {{at: {{epoch_unit: sec}}}}}}"
    ));
    assert!(e.contains("mapping.column_options.at.epoch_unit"), "{e}");
    let e = err(&format!(
        "{MINIMAL}\nmapping: {{column_options: {{at: {{empty_as_nul: true}}}}}}"
    ));
    assert!(e.contains("mapping.column_options.at"), "{e}");
}

#[test]
fn shard_key_modes_weights_and_missing_parse_and_name_bad_keys() {
    use spate_row::shard::{KeyHash, KeyType, MissingKey};
    let with = |key: &str| {
        format!("{MINIMAL}\n").replace("table: t}}", &format!("table: t, shard_key: {key}}}}}"))
    };
    let c = Config::from_yaml(&with("{field: id}"), no_env).unwrap();
    let spec = c.sink.clickhouse.shard_spec().unwrap();
    assert_eq!(spec.hash, KeyHash::Text);
    assert_eq!(spec.missing, MissingKey::Error);
    let c = Config::from_yaml(
        &with("{field: id, hash: xxhash64, type: UInt64, missing: round_robin}"),
        no_env,
    )
    .unwrap();
    let spec = c.sink.clickhouse.shard_spec().unwrap();
    assert_eq!(spec.hash, KeyHash::Typed(KeyType::UInt64));
    assert_eq!(spec.missing, MissingKey::RoundRobin);
    for (key, names) in [
        (
            "{field: id, hash: xxhash64}",
            "sink.clickhouse.shard_key.type",
        ),
        (
            "{field: id, type: UInt64}",
            "sink.clickhouse.shard_key.type",
        ),
        (
            "{field: id, hash: xxhash64, type: Float64}",
            "sink.clickhouse.shard_key.type",
        ),
        (
            "{field: id, hash: value, type: String}",
            "sink.clickhouse.shard_key.type",
        ),
        ("{field: id, hash: city}", "sink.clickhouse.shard_key.hash"),
        (
            "{field: id, missing: drop}",
            "sink.clickhouse.shard_key.missing",
        ),
        (
            "{field: id, weights: [1, 2]}",
            "sink.clickhouse.shard_key.weights",
        ),
    ] {
        let e = Config::from_yaml(&with(key), no_env)
            .unwrap_err()
            .to_string();
        assert!(e.contains(names), "{key}: {e}");
    }
}

#[test]
fn insert_settings_load_as_params_and_bad_names_are_named() {
    let c = Config::from_yaml(
        &MINIMAL.replace(
            "table: t}",
            "table: t, settings: {async_insert: true, insert_quorum: 2, max_insert_block_size: 1048576, \
             insert_quorum_timeout: 60000, load_balancing: random, x_ratio: 0.5}}",
        ),
        no_env,
    )
    .unwrap();
    let params: Vec<(String, String)> = c
        .sink
        .clickhouse
        .settings
        .iter()
        .map(|(k, v)| (k.clone(), v.to_param()))
        .collect();
    assert_eq!(
        params,
        [
            ("async_insert".to_owned(), "1".to_owned()),
            ("insert_quorum".to_owned(), "2".to_owned()),
            ("insert_quorum_timeout".to_owned(), "60000".to_owned()),
            ("load_balancing".to_owned(), "random".to_owned()),
            ("max_insert_block_size".to_owned(), "1048576".to_owned()),
            ("x_ratio".to_owned(), "0.5".to_owned()),
        ]
    );
    let e = err(&MINIMAL.replace(
        "table: t}",
        "table: t, settings: {insert_deduplication_token: x}}",
    ));
    assert!(
        e.contains("sink.clickhouse.settings.insert_deduplication_token"),
        "{e}"
    );
    let e = err(&MINIMAL.replace("table: t}", "table: t, settings: {\"a b\": 1}}"));
    assert!(e.contains("sink.clickhouse.settings.a b"), "{e}");
}

#[test]
fn delivery_defaults_to_at_least_once_and_names_its_key_when_unknown() {
    let c = Config::from_yaml(MINIMAL, no_env).unwrap();
    assert_eq!(c.pipeline_config().delivery, Delivery::AtLeastOnce);
    assert!(!c.kafka_config().committed_required);
    let e = err(&MINIMAL.replace("{name: p}", "{name: p, delivery: exactly_once}"));
    assert!(e.contains("pipeline.delivery"), "{e}");
    assert!(e.contains("effectively_once"), "{e}");
}

#[test]
fn effectively_once_loads_and_refuses_round_robin_over_shards() {
    let eo = MINIMAL.replace("{name: p}", "{name: p, delivery: effectively_once}");
    let c = Config::from_yaml(&eo, no_env).unwrap();
    let p = c.pipeline_config();
    assert_eq!(p.delivery, Delivery::EffectivelyOnce);
    assert_eq!(p.table, "default.t");
    assert!(c.kafka_config().committed_required);
    let two = eo.replace("[[http://c:8123]]", "[[http://c:8123], [http://d:8123]]");
    let e = err(&two);
    assert!(e.contains("sink.clickhouse.shard_key"), "{e}");
    let keyed = two.replace("table: t}", "table: t, shard_key: {field: id}}");
    Config::from_yaml(&keyed, no_env).unwrap();
    let e = err(&keyed.replace("{field: id}", "{field: id, missing: round_robin}"));
    assert!(e.contains("sink.clickhouse.shard_key.missing"), "{e}");
}

/// mapping.explode / filter / defaults: the sensor workload's shape loads,
/// and every malformed piece is refused naming its key.
#[test]
fn explode_filter_and_defaults_load_and_bad_ones_name_their_key() {
    let good = format!(
        "{MINIMAL}mapping:
  explode: /events
  filter:
    all:
      - unit != \"drop\"
      - value >= 0
      - any:
          - quality is null
          - quality in [1, 2]
  defaults:
    region: unknown
    n: 0
    b: true
    q: \"it's\"
"
    );
    let c = Config::from_yaml(&good, no_env).unwrap();
    assert_eq!(
        c.mapping.explode_path().unwrap(),
        Some(vec!["events".to_owned()])
    );
    assert_eq!(
        c.mapping.filter_expr().unwrap().unwrap().to_string(),
        "all(unit != \"drop\", value >= 0, any(quality is null, quality in [1, 2]))"
    );
    let d = c.mapping.default_literals().unwrap();
    assert_eq!(d["region"], "'unknown'");
    assert_eq!(d["n"], "0");
    assert_eq!(d["b"], "'true'");
    assert_eq!(d["q"], "'it\\'s'");
    // A list is `all`; a single string is one predicate.
    assert_eq!(
        filter_of("mapping: {filter: [a == 1, b != 2]}"),
        "all(a == 1, b != 2)"
    );
    assert_eq!(
        filter_of("mapping: {filter: 'a is not null'}"),
        "a is not null"
    );
    for (yaml, key, says) in BAD_MAPPINGS {
        let e = err(&format!("{MINIMAL}{yaml}"));
        assert!(e.contains(&format!("`{key}`")), "{yaml}: {e}");
        assert!(e.contains(says), "{yaml}: {e}");
    }
}

/// `mapping.filter` of [`MINIMAL`] with `yaml`, as the filter prints.
fn filter_of(yaml: &str) -> String {
    let c = Config::from_yaml(&format!("{MINIMAL}{yaml}"), no_env).unwrap();
    c.mapping.filter_expr().unwrap().unwrap().to_string()
}

/// Malformed `mapping.explode` / `filter` / `defaults` pieces: the YAML, the
/// key the error names and a phrase of its reason.
const BAD_MAPPINGS: [(&str, &str, &str); 12] = [
    ("mapping: {explode: events}", "mapping.explode", "pointer"),
    (
        "mapping: {explode: /}",
        "mapping.explode",
        "a pointer to a field",
    ),
    (
        "mapping: {filter: {all: [a == 1, b = 2]}}",
        "mapping.filter.all[1]",
        "operator",
    ),
    (
        "mapping: {filter: {some: [a == 1]}}",
        "mapping.filter.some",
        "unknown group",
    ),
    (
        "mapping: {filter: {all: [a == 1], any: [b == 1]}}",
        "mapping.filter",
        "exactly one key",
    ),
    (
        "mapping: {filter: {any: []}}",
        "mapping.filter.any",
        "keeps no row",
    ),
    (
        "mapping: {filter: {all: a == 1}}",
        "mapping.filter.all",
        "list",
    ),
    (
        "mapping: {filter: [[x == drop]]}",
        "mapping.filter[0][0]",
        "constant",
    ),
    ("mapping: {filter: 7}", "mapping.filter", "predicate string"),
    (
        "mapping: {defaults: {region: null}}",
        "mapping.defaults.region",
        "null is no default",
    ),
    (
        "mapping: {defaults: {region: [a]}}",
        "mapping.defaults.region",
        "string, number or bool",
    ),
    (
        "mapping: {explode: /events, columns: {e: /events}}",
        "mapping.columns.e",
        "exploded array itself",
    ),
];

#[test]
fn credentials_in_urls_move_to_the_sections_keys() {
    let text = MINIMAL.replace("http://c:8123", "http://u:p%40ss@c:8123");
    let c = Config::from_yaml(&text, no_env).unwrap();
    let ch = &c.sink.clickhouse;
    assert_eq!(ch.shards, vec![vec!["http://c:8123".to_owned()]]);
    assert_eq!(
        (ch.user.as_deref(), ch.password.as_deref()),
        (Some("u"), Some("p@ss"))
    );
    // The same user in the key and the URL agrees; another one is an error
    // naming the URL's key, without its password.
    let agree = text.replace("table: t}", "table: t, user: u}");
    assert!(Config::from_yaml(&agree, no_env).is_ok());
    let differ = text.replace("table: t}", "table: t, user: other, password: x}");
    let e = err(&differ);
    assert!(e.contains("sink.clickhouse.shards[0][0]"), "{e}");
    assert!(!e.contains("p%40ss") && !e.contains("p@ss"), "{e}");
    let bad_scheme = MINIMAL.replace("http://c:8123", "ftp://u:hidden@c:21");
    let e = err(&bad_scheme);
    assert!(
        e.contains("expected an http://") && !e.contains("hidden"),
        "{e}"
    );
}

/// A zero limit is refused naming the key as the user wrote it (the
/// core's `sink.` keys map to `sink.clickhouse.`; `max_inflight` lives
/// under `inflight`, where an error once said it did not).
#[test]
fn zero_limits_name_the_key_the_user_wrote() {
    for (section, key) in [
        (
            "inflight: {max_inflight: 0}",
            "sink.clickhouse.inflight.max_inflight",
        ),
        (
            "inflight: {max_bytes: 0}",
            "sink.clickhouse.inflight.max_bytes",
        ),
        (
            "inflight: {max_rows: 0}",
            "sink.clickhouse.inflight.max_rows",
        ),
        ("batch: {max_rows: 0}", "sink.clickhouse.batch.max_rows"),
    ] {
        let e = err(&MINIMAL.replace("table: t}", &format!("table: t, {section}}}")));
        assert!(
            e.contains(&format!("`{key}`")) || e.contains(key),
            "{section}: {e}"
        );
        assert!(e.contains("greater than 0"), "{section}: {e}");
    }
}

/// Issue 31: `source.kafka.lag_interval` defaults to 10 s, takes a
/// duration, `0s` turns the group-lag reader off; the binary probes
/// tripped breakers in the background.
#[test]
fn lag_interval_defaults_to_10_s_and_breakers_are_probed() {
    let c = Config::from_yaml(MINIMAL, no_env).unwrap();
    assert_eq!(
        c.kafka_config().lag_interval,
        Some(spate_kafka::DEFAULT_LAG_INTERVAL)
    );
    assert!(c.pipeline_config().sink.probe_tripped);
    let c = Config::from_yaml(
        &MINIMAL.replace("group_id: g", "group_id: g, lag_interval: 2s"),
        no_env,
    )
    .unwrap();
    assert_eq!(c.kafka_config().lag_interval, Some(Duration::from_secs(2)));
    let c = Config::from_yaml(
        &MINIMAL.replace("group_id: g", "group_id: g, lag_interval: 0s"),
        no_env,
    )
    .unwrap();
    assert_eq!(c.kafka_config().lag_interval, Some(Duration::ZERO));
}
