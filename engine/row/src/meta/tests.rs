//! Every metadata source into every type it takes, byte for byte, and the
//! refusals: types at plan time, values that would lose digits or leave
//! the column's range at record time.

use spate_core::record::{Header, Payload, TimestampKind, TopicPartition};

use super::*;
use crate::rowbinary::Value;
use crate::rowbinary::decode::decode;

use spate_testkit::fixtures::meta::{HEADERS, META_TS as TS, message};

fn ty(t: &str) -> ChType {
    ChType::parse(t).unwrap()
}

/// The cell `source` writes for `p` into `t`, or the error's reason.
fn cell(source: &str, t: &str, p: &Payload<'_>) -> Result<Option<Vec<u8>>, String> {
    let source = MetaSource::parse(source).unwrap();
    let t = ty(t);
    source.check_type(&t)?;
    let mut buf = Vec::new();
    match encode_meta(&source, "col", &t, p, &mut buf) {
        Ok(MetaPut::Written) => Ok(Some(buf)),
        Ok(MetaPut::Absent) => {
            assert!(buf.is_empty(), "an absent value writes nothing");
            Ok(None)
        }
        Err(e) => {
            assert_eq!(e.column.as_deref(), Some("col"), "errors name the column");
            Err(e.reason)
        }
    }
}

/// The cell decoded by the RowBinary decoder (an independent reader).
fn value(source: &str, t: &str, p: &Payload<'_>) -> Value {
    let bytes = cell(source, t, p).unwrap().expect("a value");
    let mut input = &bytes[..];
    let v = decode(&ty(t), &mut input).unwrap();
    assert!(input.is_empty(), "{source} into {t}: trailing bytes");
    v
}

fn int(v: i64) -> Value {
    Value::Int(crate::num::Wide::from_i128(i128::from(v)))
}

fn s(b: &[u8]) -> Value {
    Value::String(b.to_vec())
}

#[test]
fn names_parse_and_print_as_the_kafka_engines_virtual_columns() {
    for name in [
        "_topic",
        "_partition",
        "_offset",
        "_timestamp",
        "_timestamp_s",
        "_timestamp_type",
        "_key",
        "_headers",
        "_headers.name",
        "_headers.value",
        "_header.trace-id",
        "_header.a.b",
    ] {
        let m = MetaSource::parse(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(m.to_string(), name);
    }
    assert_eq!(
        MetaSource::parse("_timestamp_ms"),
        Some(MetaSource::Timestamp)
    );
    assert_eq!(
        MetaSource::parse("_header.x"),
        Some(MetaSource::Header("x".into()))
    );
    for not in [
        "_header.", "_header", "topic", "_Topic", "_offsets", "", "/_key",
    ] {
        assert_eq!(MetaSource::parse(not), None, "{not}");
    }
}

#[test]
fn types_are_checked_when_planned() {
    let accepted = [
        ("_topic", "String"),
        ("_topic", "LowCardinality(String)"),
        ("_topic", "Nullable(String)"),
        ("_topic", "FixedString(16)"),
        ("_topic", "Enum8('a' = 1)"),
        ("_partition", "Int32"),
        ("_partition", "UInt8"),
        ("_offset", "UInt64"),
        ("_offset", "Nullable(Int64)"),
        ("_offset", "Int256"),
        ("_timestamp", "DateTime64(3)"),
        ("_timestamp", "DateTime('UTC')"),
        ("_timestamp", "Int64"),
        ("_timestamp", "Nullable(DateTime64(6, 'UTC'))"),
        ("_timestamp_s", "DateTime"),
        ("_timestamp_type", "String"),
        ("_timestamp_type", "Int8"),
        ("_key", "String"),
        ("_key", "UInt64"),
        ("_key", "Nullable(UUID)"),
        ("_header.h", "Date"),
        ("_headers", "Map(String, String)"),
        ("_headers", "Map(LowCardinality(String), Nullable(String))"),
        ("_headers", "Array(Tuple(String, String))"),
        (
            "_headers",
            "Array(Tuple(name String, value Nullable(String)))",
        ),
        ("_headers.name", "Array(String)"),
        ("_headers.value", "Array(Nullable(String))"),
    ];
    for (source, t) in accepted {
        let m = MetaSource::parse(source).unwrap();
        assert_eq!(m.check_type(&ty(t)), Ok(()), "{source} into {t}");
    }
    let refused = [
        ("_topic", "UInt32"),
        ("_partition", "String"),
        ("_partition", "Float64"),
        ("_offset", "DateTime"),
        ("_offset", "Decimal(18, 0)"),
        ("_timestamp", "String"),
        ("_timestamp", "Date"),
        ("_timestamp", "Float64"),
        ("_timestamp_type", "Float32"),
        ("_key", "Array(String)"),
        ("_header.h", "Map(String, String)"),
        ("_headers", "Map(String, UInt32)"),
        ("_headers", "Map(UInt8, String)"),
        ("_headers", "Array(String)"),
        ("_headers", "Array(Tuple(String, String, String))"),
        ("_headers", "String"),
        ("_headers.name", "Array(Nullable(String))"),
        ("_headers.name", "String"),
        ("_headers.value", "Array(UInt8)"),
    ];
    for (source, t) in refused {
        let m = MetaSource::parse(source).unwrap();
        let e = m.check_type(&ty(t)).unwrap_err();
        assert!(
            e.contains(source) && e.contains("takes"),
            "{source} into {t}: {e}"
        );
    }
}

#[test]
fn topic_and_partition() {
    let tp = TopicPartition::new("events", 3);
    let p = message(&tp, &[]);
    assert_eq!(value("_topic", "String", &p), s(b"events"));
    assert_eq!(value("_topic", "LowCardinality(String)", &p), s(b"events"));
    assert_eq!(
        cell("_topic", "Nullable(String)", &p).unwrap().unwrap(),
        b"\x00\x06events"
    );
    assert_eq!(
        cell("_topic", "FixedString(8)", &p).unwrap().unwrap(),
        b"events\0\0"
    );
    assert!(cell("_topic", "FixedString(4)", &p).is_err());
    assert_eq!(
        cell("_topic", "Enum8('other' = 1, 'events' = 2)", &p)
            .unwrap()
            .unwrap(),
        [2]
    );
    assert!(cell("_topic", "Enum8('other' = 1)", &p).is_err());
    assert_eq!(
        cell("_partition", "Int32", &p).unwrap().unwrap(),
        [3, 0, 0, 0]
    );
    assert_eq!(cell("_partition", "UInt8", &p).unwrap().unwrap(), [3]);
    assert_eq!(
        cell("_partition", "Nullable(UInt16)", &p).unwrap().unwrap(),
        [0, 3, 0]
    );
    assert_eq!(value("_partition", "Int128", &p), int(3));
    let wide = TopicPartition::new("events", 300);
    let e = cell("_partition", "UInt8", &message(&wide, &[])).unwrap_err();
    assert!(e.contains("300") && e.contains("UInt8"), "{e}");
}

#[test]
fn offsets_are_range_checked_never_wrapped() {
    let tp = TopicPartition::new("t", 0);
    let mut p = message(&tp, &[]);
    assert_eq!(value("_offset", "UInt64", &p), int(42));
    assert_eq!(value("_offset", "Int64", &p), int(42));
    assert_eq!(value("_offset", "Int256", &p), int(42));
    assert_eq!(value("_offset", "UInt128", &p), int(42));
    p.offset = 1 << 40;
    assert_eq!(
        cell("_offset", "UInt64", &p).unwrap().unwrap(),
        (1u64 << 40).to_le_bytes()
    );
    let e = cell("_offset", "UInt32", &p).unwrap_err();
    assert!(e.contains("out of UInt32's range"), "{e}");
    p.offset = 255;
    assert_eq!(cell("_offset", "UInt8", &p).unwrap().unwrap(), [255]);
    p.offset = 256;
    assert!(cell("_offset", "UInt8", &p).is_err());
    p.offset = 127;
    assert_eq!(cell("_offset", "Int8", &p).unwrap().unwrap(), [127]);
    p.offset = 128;
    assert!(cell("_offset", "Int8", &p).is_err());
}

#[test]
fn timestamps_keep_every_millisecond_or_refuse() {
    let tp = TopicPartition::new("t", 0);
    let mut p = message(&tp, &[]);
    assert_eq!(
        value("_timestamp", "DateTime64(3)", &p),
        Value::DateTime64(TS)
    );
    assert_eq!(
        value("_timestamp_ms", "DateTime64(3, 'UTC')", &p),
        Value::DateTime64(TS)
    );
    assert_eq!(
        value("_timestamp", "DateTime64(6)", &p),
        Value::DateTime64(TS * 1000)
    );
    assert_eq!(value("_timestamp", "Int64", &p), int(TS));
    assert_eq!(value("_timestamp", "UInt64", &p), int(TS));
    assert_eq!(
        cell("_timestamp", "Nullable(DateTime64(3))", &p)
            .unwrap()
            .unwrap()[0],
        0
    );
    // Milliseconds a type cannot keep: a record error, never a truncation.
    for t in [
        "DateTime",
        "DateTime('UTC')",
        "DateTime64(0)",
        "DateTime64(2)",
    ] {
        let e = cell("_timestamp", t, &p).unwrap_err();
        assert!(e.contains("_timestamp_s") && e.contains("drop"), "{t}: {e}");
    }
    assert!(cell("_timestamp", "UInt32", &p).is_err(), "ms past UInt32");
    // ... unless asked for: whole seconds, floored.
    assert_eq!(
        value("_timestamp_s", "DateTime", &p),
        Value::DateTime(1_700_000_000)
    );
    assert_eq!(
        value("_timestamp_s", "DateTime64(3)", &p),
        Value::DateTime64(1_700_000_000_000)
    );
    assert_eq!(value("_timestamp_s", "UInt32", &p), int(1_700_000_000));
    // Whole seconds fit DateTime exactly; 120 ms fits DateTime64(2).
    p.timestamp_ms = Some(1_700_000_000_000);
    assert_eq!(
        value("_timestamp", "DateTime", &p),
        Value::DateTime(1_700_000_000)
    );
    p.timestamp_ms = Some(1_700_000_000_120);
    assert_eq!(
        value("_timestamp", "DateTime64(2)", &p),
        Value::DateTime64(170_000_000_012)
    );
    // Out of the type's range.
    p.timestamp_ms = Some(-1000);
    assert!(cell("_timestamp", "DateTime", &p).is_err());
    assert!(cell("_timestamp_s", "DateTime", &p).is_err());
    p.timestamp_ms = Some(-1);
    let e = cell("_timestamp_s", "DateTime", &p).unwrap_err();
    assert!(e.contains("range"), "floored to -1 s: {e}");
    p.timestamp_ms = Some(9_300_000_000_000); // 2264: past Int64 nanoseconds
    assert!(cell("_timestamp", "DateTime64(9)", &p).is_err());
    assert!(cell("_timestamp", "DateTime64(6)", &p).is_ok());
    p.timestamp_ms = Some(20_000_000_000_000); // 2603: past DateTime64
    assert!(cell("_timestamp", "DateTime64(3)", &p).is_err());
    // No timestamp: absent (the column's missing-value rule applies).
    p.timestamp_ms = None;
    p.timestamp_kind = TimestampKind::None;
    assert_eq!(cell("_timestamp", "DateTime64(3)", &p), Ok(None));
    assert_eq!(cell("_timestamp_s", "Nullable(DateTime)", &p), Ok(None));
}

#[test]
fn timestamp_types_by_name_and_kafka_id() {
    let tp = TopicPartition::new("t", 0);
    let mut p = message(&tp, &[]);
    assert_eq!(value("_timestamp_type", "String", &p), s(b"CreateTime"));
    assert_eq!(value("_timestamp_type", "Int8", &p), int(0));
    p.timestamp_kind = TimestampKind::LogAppendTime;
    assert_eq!(value("_timestamp_type", "String", &p), s(b"LogAppendTime"));
    assert_eq!(value("_timestamp_type", "UInt8", &p), int(1));
    let en = "Enum8('NoTimestampType' = -1, 'CreateTime' = 0, 'LogAppendTime' = 1)";
    assert_eq!(cell("_timestamp_type", en, &p).unwrap().unwrap(), [1]);
    p.timestamp_kind = TimestampKind::None;
    assert_eq!(cell("_timestamp_type", en, &p).unwrap().unwrap(), [0xff]);
    assert_eq!(value("_timestamp_type", "Int16", &p), int(-1));
    assert!(cell("_timestamp_type", "UInt8", &p).is_err());
}

#[test]
fn keys_are_bytes_or_parsed_and_a_null_key_is_absent() {
    let tp = TopicPartition::new("t", 0);
    let mut p = message(&tp, &[]);
    assert_eq!(value("_key", "String", &p), s(b"user-7"));
    assert_eq!(
        cell("_key", "Nullable(String)", &p).unwrap().unwrap(),
        b"\x00\x06user-7"
    );
    let e = cell("_key", "UInt64", &p).unwrap_err();
    assert!(e.contains("user-7"), "{e}");
    p.key = Some(b"\xff\x00\xfe");
    assert_eq!(
        value("_key", "String", &p),
        s(b"\xff\x00\xfe"),
        "bytes kept"
    );
    p.key = Some(b"18446744073709551615");
    assert_eq!(
        cell("_key", "UInt64", &p).unwrap().unwrap(),
        u64::MAX.to_le_bytes()
    );
    p.key = Some(b"2020-01-02T03:04:05.678Z");
    assert_eq!(
        value("_key", "DateTime64(3)", &p),
        Value::DateTime64(1_577_934_245_678)
    );
    p.key = Some(b"");
    assert_eq!(
        value("_key", "String", &p),
        s(b""),
        "an empty key is a value"
    );
    p.key = None;
    assert_eq!(cell("_key", "String", &p), Ok(None));
    assert_eq!(cell("_key", "Nullable(String)", &p), Ok(None));
}

#[test]
fn one_header_by_name_takes_the_last_of_repeats() {
    let tp = TopicPartition::new("t", 0);
    let p = message(&tp, &HEADERS);
    assert_eq!(value("_header.trace", "String", &p), s(b"t-2"));
    assert_eq!(value("_header.empty", "String", &p), s(b""));
    assert_eq!(cell("_header.gone", "Nullable(String)", &p), Ok(None));
    assert_eq!(cell("_header.nope", "String", &p), Ok(None));
    assert_eq!(cell("_header.Trace", "String", &p), Ok(None), "exact name");
    let n = [Header {
        name: b"n",
        value: Some(b"-5"),
    }];
    let p = message(&tp, &n);
    assert_eq!(value("_header.n", "Int32", &p), int(-5));
    assert!(cell("_header.n", "UInt32", &p).is_err());
}

#[test]
fn all_headers_in_order_with_repeats() {
    let tp = TopicPartition::new("t", 0);
    let p = message(&tp, &HEADERS);
    let want = |v3: Value| {
        vec![
            (s(b"trace"), s(b"t-1")),
            (s(b"empty"), s(b"")),
            (s(b"trace"), s(b"t-2")),
            (s(b"gone"), v3),
        ]
    };
    assert_eq!(
        value("_headers", "Map(String, Nullable(String))", &p),
        Value::Map(want(Value::Null))
    );
    let tuples = value("_headers", "Array(Tuple(String, Nullable(String)))", &p);
    let pairs = want(Value::Null)
        .into_iter()
        .map(|(k, v)| Value::Tuple(vec![k, v]))
        .collect();
    assert_eq!(tuples, Value::Array(pairs));
    // The same bytes either way (Map is an array of pairs in RowBinary).
    assert_eq!(
        cell("_headers", "Map(String, Nullable(String))", &p),
        cell("_headers", "Array(Tuple(String, Nullable(String)))", &p)
    );
    let e = cell("_headers", "Map(String, String)", &p).unwrap_err();
    assert!(e.contains("`gone`") && e.contains("null"), "{e}");
    assert_eq!(
        value("_headers.name", "Array(String)", &p),
        Value::Array(vec![s(b"trace"), s(b"empty"), s(b"trace"), s(b"gone")])
    );
    assert_eq!(
        value("_headers.value", "Array(Nullable(String))", &p),
        Value::Array(vec![s(b"t-1"), s(b""), s(b"t-2"), Value::Null])
    );
    assert!(cell("_headers.value", "Array(String)", &p).is_err());
    let ok = &HEADERS[..3];
    let p = message(&tp, ok);
    assert_eq!(
        value("_headers", "Map(String, String)", &p),
        Value::Map(want(Value::Null)[..3].to_vec())
    );
    // No headers: empty containers, never absent.
    let p = message(&tp, &[]);
    for (source, t) in [
        ("_headers", "Map(String, String)"),
        ("_headers", "Array(Tuple(String, String))"),
        ("_headers.name", "Array(String)"),
        ("_headers.value", "Array(String)"),
    ] {
        assert_eq!(cell(source, t, &p), Ok(Some(vec![0])), "{source} into {t}");
    }
}
