//! Fixtures for the modern-engine check of types ClickHouse 18.16 lacks
//! (DateTime64(3) and (9), Map, Bool, Date32, Int128/256, IPv4/IPv6,
//! LowCardinality(Nullable(String)), Decimal256): each case maps JSON rows
//! through the real JSON-to-RowBinary encoder and writes
//!
//! - `<dir>/<case>.bin`: the RowBinary rows,
//! - `<dir>/<case>.native`: the same rows transcoded into a Native block
//!   by the writer's transcoder (`spate_clickhouse::native`), and
//! - `<dir>/<case>.json`: `{"case", "schema", "inputs", "expected"}`, where
//!   `schema` is the ClickHouse structure (`id UInt32, t DateTime64(3, 'UTC')`)
//!   and `expected` the rows a current ClickHouse must print for the file in
//!   `JSONEachRow` (64-bit and wider integers and decimals quoted).
//!
//! `<dir>` is `$SPATE_CHDB_DIR`, else `$CARGO_TARGET_DIR/chdb`, else
//! `target/chdb` in the workspace (`ci/test.sh` sets `SPATE_CHDB_DIR`).
//! `ci/chdb_check.py` then decodes every `.bin` with chdb-core
//! (`SELECT * FROM file(path, 'RowBinary', schema)`) and every `.native`
//! (`file(path, 'Native')`, the block's own column types) and compares. The
//! expectations are written from what the input JSON means, not from what the
//! encoder produced.

use std::path::PathBuf;

use serde_json::{Value, json};
use spate_clickhouse::native::BlockPlan;
use spate_formats::json::JsonRowEncoder;
use spate_row::spec::{MappingOptions, simple_columns};
use spate_row::types::ChType;

struct Case {
    name: &'static str,
    columns: &'static [(&'static str, &'static str)],
    inputs: &'static [&'static str],
    expected: Value,
}

fn out_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPATE_CHDB_DIR") {
        return PathBuf::from(d);
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t).join("chdb"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/chdb"),
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "datetime64",
            columns: &[
                ("id", "UInt32"),
                ("t3", "DateTime64(3, 'UTC')"),
                ("t9", "DateTime64(9, 'UTC')"),
                ("t6", "Nullable(DateTime64(6, 'UTC'))"),
            ],
            inputs: &[
                r#"{"id":1,"t3":"2018-02-07T01:26:13.840Z","t9":"2018-02-07 01:26:13.123456789","t6":null}"#,
                r#"{"id":2,"t3":1517966773840,"t9":1517966773.5,"t6":"1969-12-31T23:59:59.999999Z"}"#,
                r#"{"id":3,"t3":"2262-04-11 23:47:16.854","t9":"1900-01-01T00:00:00Z","t6":"2299-12-31 23:59:59.999999"}"#,
                r#"{"id":4,"t3":"2018-02-07T03:26:13.5+02:00","t9":"1970-01-01T00:00:00.000000001Z","t6":0}"#,
            ],
            expected: json!([
                {"id":1,"t3":"2018-02-07 01:26:13.840","t9":"2018-02-07 01:26:13.123456789","t6":null},
                {"id":2,"t3":"2018-02-07 01:26:13.840","t9":"2018-02-07 01:26:13.500000000","t6":"1969-12-31 23:59:59.999999"},
                {"id":3,"t3":"2262-04-11 23:47:16.854","t9":"1900-01-01 00:00:00.000000000","t6":"2299-12-31 23:59:59.999999"},
                {"id":4,"t3":"2018-02-07 01:26:13.500","t9":"1970-01-01 00:00:00.000000001","t6":"1970-01-01 00:00:00.000000"},
            ]),
        },
        Case {
            name: "map_bool",
            columns: &[
                ("id", "UInt32"),
                ("m", "Map(String, UInt64)"),
                ("mn", "Map(String, Nullable(Float64))"),
                ("b", "Bool"),
                ("ab", "Array(Bool)"),
            ],
            inputs: &[
                r#"{"id":1,"m":{"k":9,"\u00e9":18446744073709551615},"mn":{"x":1.5,"y":null},"b":true,"ab":[true,false]}"#,
                r#"{"id":2,"m":{},"mn":{},"b":0,"ab":[]}"#,
                r#"{"id":3,"m":{"a":"1"},"mn":{"z":-0.25},"b":1,"ab":[1,0,true]}"#,
            ],
            expected: json!([
                {"id":1,"m":{"k":"9","é":"18446744073709551615"},"mn":{"x":1.5,"y":null},"b":true,"ab":[true,false]},
                {"id":2,"m":{},"mn":{},"b":false,"ab":[]},
                {"id":3,"m":{"a":"1"},"mn":{"z":-0.25},"b":true,"ab":[true,false,true]},
            ]),
        },
        Case {
            name: "wide_ints",
            columns: &[
                ("id", "UInt32"),
                ("i128", "Int128"),
                ("u128", "UInt128"),
                ("i256", "Int256"),
                ("u256", "UInt256"),
            ],
            inputs: &[
                r#"{"id":1,"i128":"-170141183460469231731687303715884105728","u128":"340282366920938463463374607431768211455","i256":"-57896044618658097711785492504343953926634992332820282019728792003956564819968","u256":"115792089237316195423570985008687907853269984665640564039457584007913129639935"}"#,
                r#"{"id":2,"i128":170141183460469231731687303715884105727,"u128":0,"i256":57896044618658097711785492504343953926634992332820282019728792003956564819967,"u256":"12345678901234567890123456789"}"#,
                r#"{"id":3,"i128":-1,"u128":18446744073709551616,"i256":-1,"u256":1}"#,
            ],
            expected: json!([
                {"id":1,"i128":"-170141183460469231731687303715884105728","u128":"340282366920938463463374607431768211455","i256":"-57896044618658097711785492504343953926634992332820282019728792003956564819968","u256":"115792089237316195423570985008687907853269984665640564039457584007913129639935"},
                {"id":2,"i128":"170141183460469231731687303715884105727","u128":"0","i256":"57896044618658097711785492504343953926634992332820282019728792003956564819967","u256":"12345678901234567890123456789"},
                {"id":3,"i128":"-1","u128":"18446744073709551616","i256":"-1","u256":"1"},
            ]),
        },
        Case {
            name: "date32_ip",
            columns: &[
                ("id", "UInt32"),
                ("d", "Date32"),
                ("v4", "IPv4"),
                ("v6", "IPv6"),
                ("n6", "Nullable(IPv6)"),
            ],
            inputs: &[
                r#"{"id":1,"d":"1900-01-01","v4":"1.2.3.4","v6":"2001:db8::1","n6":null}"#,
                r#"{"id":2,"d":"2299-12-31","v4":"255.255.255.255","v6":"::ffff:1.2.3.4","n6":"::"}"#,
                r#"{"id":3,"d":"1969-12-31","v4":"0.0.0.0","v6":"fe80::1:2","n6":"2001:DB8:0:0:0:0:0:1"}"#,
            ],
            expected: json!([
                {"id":1,"d":"1900-01-01","v4":"1.2.3.4","v6":"2001:db8::1","n6":null},
                {"id":2,"d":"2299-12-31","v4":"255.255.255.255","v6":"::ffff:1.2.3.4","n6":"::"},
                {"id":3,"d":"1969-12-31","v4":"0.0.0.0","v6":"fe80::1:2","n6":"2001:db8::1"},
            ]),
        },
        Case {
            name: "low_cardinality",
            columns: &[
                ("id", "UInt32"),
                ("lc", "LowCardinality(String)"),
                ("lcn", "LowCardinality(Nullable(String))"),
                ("alcn", "Array(LowCardinality(Nullable(String)))"),
            ],
            inputs: &[
                r#"{"id":1,"lc":"hi","lcn":"h\u00e9llo \u2713","alcn":["a",null,""]}"#,
                r#"{"id":2,"lc":"","lcn":null,"alcn":[]}"#,
                r#"{"id":3,"lc":"hi","lcn":"","alcn":[null]}"#,
            ],
            expected: json!([
                {"id":1,"lc":"hi","lcn":"héllo ✓","alcn":["a",null,""]},
                {"id":2,"lc":"","lcn":null,"alcn":[]},
                {"id":3,"lc":"hi","lcn":"","alcn":[null]},
            ]),
        },
        Case {
            // The types 18.16 also has, nested the ways Native lays out
            // differently from RowBinary (offsets, null maps, tuples of
            // element columns, LowCardinality inside a tuple).
            name: "nested_native",
            columns: &[
                ("id", "UInt32"),
                ("i16", "Int16"),
                ("e8", "Enum8('a' = 1, 'b' = -2)"),
                ("e16", "Enum16('x' = 1000, 'y' = -1000)"),
                ("fs", "FixedString(3)"),
                ("u", "UUID"),
                ("d9", "Decimal(9, 2)"),
                ("dd", "Date"),
                ("dt", "DateTime('UTC')"),
                ("ns", "Nullable(String)"),
                ("t", "Tuple(a UInt8, b LowCardinality(String))"),
                ("aa", "Array(Array(UInt8))"),
                ("mna", "Map(String, Array(Nullable(UInt8)))"),
            ],
            inputs: &[
                r#"{"id":1,"i16":-32768,"e8":"b","e16":"y","fs":"ab","u":"61f0c404-5cb3-11e7-907b-a6006ad3dba0","d9":"1.5","dd":"2000-03-01","dt":"2018-02-07T01:26:13Z","ns":null,"t":{"a":1,"b":"x"},"aa":[[1,2],[],[3]],"mna":{"k":[1,null]}}"#,
                r#"{"id":2,"i16":7,"e8":"a","e16":"x","fs":"xyz","u":"00000000000000000000000000000001","d9":-0.01,"dd":"1970-01-01","dt":0,"ns":"q","t":{"a":0,"b":""},"aa":[],"mna":{}}"#,
                r#"{"id":3,"i16":0,"e8":1,"e16":"x","fs":"","u":"FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF","d9":0,"dd":"2149-06-06","dt":"2018-02-07 01:26:14","ns":"","t":{"a":255,"b":"x"},"aa":[[]],"mna":{"a":[],"b":[null]}}"#,
            ],
            expected: json!([
                {"id":1,"i16":-32768,"e8":"b","e16":"y","fs":"ab\u{0}","u":"61f0c404-5cb3-11e7-907b-a6006ad3dba0","d9":"1.50","dd":"2000-03-01","dt":"2018-02-07 01:26:13","ns":null,"t":{"a":1,"b":"x"},"aa":[[1,2],[],[3]],"mna":{"k":[1,null]}},
                {"id":2,"i16":7,"e8":"a","e16":"x","fs":"xyz","u":"00000000-0000-0000-0000-000000000001","d9":"-0.01","dd":"1970-01-01","dt":"1970-01-01 00:00:00","ns":"q","t":{"a":0,"b":""},"aa":[],"mna":{}},
                {"id":3,"i16":0,"e8":"a","e16":"x","fs":"\u{0}\u{0}\u{0}","u":"ffffffff-ffff-ffff-ffff-ffffffffffff","d9":"0.00","dd":"2149-06-06","dt":"2018-02-07 01:26:14","ns":"","t":{"a":255,"b":"x"},"aa":[[]],"mna":{"a":[],"b":[null]}},
            ]),
        },
        Case {
            name: "decimal256",
            columns: &[
                ("id", "UInt32"),
                ("d38", "Decimal(38, 10)"),
                ("d76", "Decimal(76, 20)"),
            ],
            inputs: &[
                r#"{"id":1,"d38":"12345.6789","d76":0.1}"#,
                r#"{"id":2,"d38":-0.0000000001,"d76":"-12345678901234567890123456789012345678901234567890.12345678901234567890"}"#,
            ],
            expected: json!([
                {"id":1,"d38":"12345.6789000000","d76":"0.10000000000000000000"},
                {"id":2,"d38":"-0.0000000001","d76":"-12345678901234567890123456789012345678901234567890.12345678901234567890"},
            ]),
        },
    ]
}

/// The router's documented formula, `xxHash64(key) % shards`, for
/// `ci/chdb_check.py` to recompute in SQL: `router.json` holds keys with
/// the hash and shard (of 2, 3 and 16) spate computes.
#[test]
fn write_router_vectors_for_chdb() {
    use spate_row::shard::{key_hash, shard_of_key};
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let keys = [
        "",
        "a",
        "user-1",
        "user-2",
        "42",
        "h\u{e9}llo \"x\"",
        "日本",
        "😀",
    ];
    let vectors: Vec<Value> = keys
        .iter()
        .map(|k| {
            json!({
                "key": k,
                "hash": key_hash(k.as_bytes()).to_string(),
                "shards": {
                    "2": shard_of_key(k.as_bytes(), 2),
                    "3": shard_of_key(k.as_bytes(), 3),
                    "16": shard_of_key(k.as_bytes(), 16),
                },
            })
        })
        .collect();
    std::fs::write(
        dir.join("router.json"),
        serde_json::to_string_pretty(&json!({ "case": "router", "hash_vectors": vectors }))
            .unwrap(),
    )
    .unwrap();
}

#[test]
fn write_fixtures_for_chdb() {
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for case in cases() {
        let cols: Vec<(&str, ChType)> = case
            .columns
            .iter()
            .map(|&(n, t)| (n, ChType::parse(t).unwrap_or_else(|e| panic!("{t}: {e}"))))
            .collect();
        let mut enc = JsonRowEncoder::new(simple_columns(cols), MappingOptions::default()).unwrap();
        let mut bin = Vec::new();
        for row in case.inputs {
            enc.encode_json(row.as_bytes(), &mut bin)
                .unwrap_or_else(|e| panic!("{}: {e}: {row}", case.name));
        }
        assert_eq!(
            case.expected.as_array().unwrap().len(),
            case.inputs.len(),
            "{}",
            case.name
        );
        let schema = case
            .columns
            .iter()
            .map(|(n, t)| format!("{n} {t}"))
            .collect::<Vec<_>>()
            .join(", ");
        let manifest = json!({
            "case": case.name,
            "schema": schema,
            "inputs": case.inputs,
            "expected": case.expected,
        });
        std::fs::write(dir.join(format!("{}.bin", case.name)), &bin).unwrap();
        let typed: Vec<(String, String)> = case
            .columns
            .iter()
            .map(|&(n, t)| (n.to_owned(), t.to_owned()))
            .collect();
        let mut native = Vec::new();
        let rows = BlockPlan::new(&typed)
            .unwrap()
            .transcode([&bin[..]], &mut native)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(rows as usize, case.inputs.len(), "{}", case.name);
        std::fs::write(dir.join(format!("{}.native", case.name)), &native).unwrap();
        std::fs::write(
            dir.join(format!("{}.json", case.name)),
            serde_json::to_string_pretty(&manifest).unwrap(),
        )
        .unwrap();
    }
}

/// Writes one case's `.bin` and `.json` (with `extra` manifest keys), and
/// its `.native` transcode when `native` gives the columns (a RowBinary
/// case; Native has no per-row defaults, so a `RowBinaryWithDefaults` case
/// has none).
fn write_case(
    name: &str,
    schema: &str,
    inputs: &[&str],
    bin: &[u8],
    expected: Value,
    extra: Value,
    native: Option<&[(&str, &str)]>,
) {
    let dir = out_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut manifest = json!({
        "case": name,
        "schema": schema,
        "inputs": inputs,
        "expected": expected,
    });
    for (k, v) in extra.as_object().unwrap() {
        manifest[k] = v.clone();
    }
    std::fs::write(dir.join(format!("{name}.bin")), bin).unwrap();
    if let Some(columns) = native {
        let typed: Vec<(String, String)> = columns
            .iter()
            .map(|&(n, t)| (n.to_owned(), t.to_owned()))
            .collect();
        let mut out = Vec::new();
        let rows = BlockPlan::new(&typed)
            .unwrap()
            .transcode([bin], &mut out)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(rows as usize, inputs.len(), "{name}");
        std::fs::write(dir.join(format!("{name}.native")), &out).unwrap();
    }
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
}

/// Issue 19: per-row DEFAULTs sent as `RowBinaryWithDefaults` (a current
/// server computes `id + 100` for the row missing `at`), and fractional
/// negative epochs, which the check also has ClickHouse parse from the
/// same JSON (`clickhouse_parses_inputs`): -1.2345 into DateTime64(3) is
/// .766 in both.
#[test]
fn write_defaults_and_epoch_fixtures_for_chdb() {
    use spate_row::coerce::EpochUnit;
    use spate_row::spec::{ColumnOptions, ColumnSpec, MissingValue};
    let spec = |name: &str, ty: &str, missing| ColumnSpec {
        name: name.into(),
        ty: ChType::parse(ty).unwrap(),
        path: None,
        meta: None,
        missing,
        options: ColumnOptions::default(),
    };
    let columns = vec![
        spec("id", "UInt32", MissingValue::Reject),
        spec("at", "UInt32", MissingValue::ServerDefault),
        spec("n", "Nullable(UInt8)", MissingValue::ServerDefault),
        spec("s", "String", MissingValue::Literal("'x'".into())),
    ];
    let inputs = [
        r#"{"id":1,"at":7,"n":null,"s":"y"}"#,
        r#"{"id":2}"#,
        r#"{"n":3,"id":3,"at":null}"#,
    ];
    let mut enc = JsonRowEncoder::new(columns, MappingOptions::default()).unwrap();
    assert!(enc.with_defaults());
    let mut bin = Vec::new();
    for row in inputs {
        enc.encode_json(row.as_bytes(), &mut bin).unwrap();
    }
    write_case(
        "row_binary_with_defaults",
        "id UInt32, at UInt32 DEFAULT id + 100, n Nullable(UInt8) DEFAULT 5, s String DEFAULT 'x'",
        &inputs,
        &bin,
        json!([
            {"id":1,"at":7,"n":null,"s":"y"},
            {"id":2,"at":102,"n":5,"s":"x"},
            {"id":3,"at":103,"n":3,"s":"x"},
        ]),
        json!({"format": "RowBinaryWithDefaults"}),
        None,
    );

    let mut columns = simple_columns([
        ("id", ChType::UInt32),
        ("t", ChType::parse("DateTime64(3, 'UTC')").unwrap()),
    ]);
    columns[1].options.epoch_unit = Some(EpochUnit::Seconds);
    let inputs = [
        r#"{"id":1,"t":-1.2345}"#,
        r#"{"id":2,"t":1.2345}"#,
        r#"{"id":3,"t":-0.0005}"#,
        r#"{"id":4,"t":1517966773.8409}"#,
        r#"{"id":5,"t":-86400.9999}"#,
    ];
    let mut enc = JsonRowEncoder::new(columns, MappingOptions::default()).unwrap();
    let mut bin = Vec::new();
    for row in inputs {
        enc.encode_json(row.as_bytes(), &mut bin).unwrap();
    }
    write_case(
        "epoch_fractions",
        "id UInt32, t DateTime64(3, 'UTC')",
        &inputs,
        &bin,
        json!([
            {"id":1,"t":"1969-12-31 23:59:58.766"},
            {"id":2,"t":"1970-01-01 00:00:01.234"},
            {"id":3,"t":"1970-01-01 00:00:00.000"},
            {"id":4,"t":"2018-02-07 01:26:13.840"},
            {"id":5,"t":"1969-12-30 23:59:59.001"},
        ]),
        json!({"clickhouse_parses_inputs": true}),
        Some(&[("id", "UInt32"), ("t", "DateTime64(3, 'UTC')")]),
    );
}

/// Issue 17: Kafka metadata columns in the types 18.16 lacks, decoded by a
/// current engine: the timestamp into DateTime64(3) and (6) exactly, the
/// headers (a repeated name, a null value, none) as Map and as
/// Array(Tuple), the topic as LowCardinality(String), the timestamp type
/// as an Enum8, the key parsed into a UUID.
#[test]
fn write_kafka_metadata_fixtures_for_chdb() {
    use spate_core::record::{Header, Headers, Payload, TimestampKind, TopicPartition};
    use spate_row::meta::MetaSource;
    use spate_row::spec::{ColumnOptions, ColumnSpec, MissingValue};
    let columns: &[(&str, &str, Option<&str>)] = &[
        ("id", "UInt32", None),
        ("topic", "LowCardinality(String)", Some("_topic")),
        ("off", "UInt64", Some("_offset")),
        ("ts3", "DateTime64(3, 'UTC')", Some("_timestamp")),
        ("ts6", "Nullable(DateTime64(6, 'UTC'))", Some("_timestamp")),
        (
            "tt",
            "Enum8('NoTimestampType' = -1, 'CreateTime' = 0, 'LogAppendTime' = 1)",
            Some("_timestamp_type"),
        ),
        ("k", "Nullable(UUID)", Some("_key")),
        ("hm", "Map(String, Nullable(String))", Some("_headers")),
        (
            "hp",
            "Array(Tuple(String, Nullable(String)))",
            Some("_headers"),
        ),
    ];
    let specs = columns
        .iter()
        .map(|&(name, ty, meta)| ColumnSpec {
            name: name.into(),
            ty: ChType::parse(ty).unwrap(),
            path: None,
            meta: meta.and_then(MetaSource::parse),
            missing: if ty.starts_with("Nullable") {
                MissingValue::Null
            } else {
                MissingValue::Reject
            },
            options: ColumnOptions::default(),
        })
        .collect();
    let mut enc = JsonRowEncoder::new(specs, MappingOptions::default()).unwrap();
    let tp = TopicPartition::new("events.a", 2);
    let repeated = [
        Header {
            name: b"h",
            value: Some(b"a"),
        },
        Header {
            name: b"n",
            value: None,
        },
        Header {
            name: b"h",
            value: Some(b"b"),
        },
    ];
    let inputs = [r#"{"id":1}"#, r#"{"id":2}"#];
    let messages = [
        Payload {
            value: Some(inputs[0].as_bytes()),
            key: Some(b"61f0c404-5cb3-11e7-907b-a6006ad3dba0"),
            partition: &tp,
            offset: 4_294_967_296,
            timestamp_ms: Some(1_517_966_773_840),
            timestamp_kind: TimestampKind::CreateTime,
            headers: Headers::from_slice(&repeated),
        },
        Payload {
            value: Some(inputs[1].as_bytes()),
            key: None,
            partition: &tp,
            offset: 7,
            timestamp_ms: Some(-1),
            timestamp_kind: TimestampKind::LogAppendTime,
            headers: Headers::NONE,
        },
    ];
    let mut bin = Vec::new();
    for m in &messages {
        enc.encode_message(m, &mut bin).unwrap();
    }
    let schema = columns
        .iter()
        .map(|(n, t, _)| format!("{n} {t}"))
        .collect::<Vec<_>>()
        .join(", ");
    let typed: Vec<(&str, &str)> = columns.iter().map(|&(n, t, _)| (n, t)).collect();
    write_case(
        "kafka_metadata",
        &schema,
        &inputs,
        &bin,
        // A JSON object keeps the last of repeated keys when parsed, so the
        // Map's order and repeats are checked through the Array(Tuple).
        json!([
            {"id":1,"topic":"events.a","off":"4294967296","ts3":"2018-02-07 01:26:13.840",
             "ts6":"2018-02-07 01:26:13.840000","tt":"CreateTime",
             "k":"61f0c404-5cb3-11e7-907b-a6006ad3dba0",
             "hm":{"h":"b","n":null},"hp":[["h","a"],["n",null],["h","b"]]},
            {"id":2,"topic":"events.a","off":"7","ts3":"1969-12-31 23:59:59.999",
             "ts6":"1969-12-31 23:59:59.999000","tt":"LogAppendTime","k":null,
             "hm":{},"hp":[]},
        ]),
        json!({}),
        Some(&typed),
    );
}
