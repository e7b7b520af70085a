//! Mapper tests: real rows from the fixtures (copied from shared/data), the
//! coercion rules, missing fields, and the chain's `Encoder` seam.

use std::net::Ipv4Addr;

use spate_core::ack::{AckIssuer, ack_channel};
use spate_core::pipeline::chain::{RecordCx, RecordErrorKind};
use spate_core::record::TopicPartition;

use super::*;
use spate_row::coerce::EpochUnit;
use spate_row::num::Wide;
use spate_row::rowbinary::decode::decode;
use spate_row::rowbinary::{Value, encode};
use spate_row::spec::{ColumnOptions, parse_pointer, simple_columns};
use spate_row::time::{TimeFormat, days_from_civil};

const FLIGHTS: &str = spate_testkit::fixtures::FLIGHTS_50;
const EARTHQUAKES: &str = spate_testkit::fixtures::EARTHQUAKES_20;
const MOVIES: &str = spate_testkit::fixtures::MOVIES_33;

fn t(s: &str) -> ChType {
    ChType::parse(s).unwrap()
}

fn encoder(cols: &[(&str, &str)], options: MappingOptions) -> JsonRowEncoder {
    let specs = simple_columns(cols.iter().map(|(n, ty)| (*n, t(ty))));
    JsonRowEncoder::new(specs, options).unwrap()
}

fn row(enc: &mut JsonRowEncoder, json: &str) -> Result<Vec<Value>, RecordError> {
    let mut buf = Vec::new();
    enc.encode_json(json.as_bytes(), &mut buf)?;
    let mut input = buf.as_slice();
    let values = enc
        .columns()
        .iter()
        .map(|c| decode(&c.ty, &mut input).unwrap())
        .collect();
    assert!(input.is_empty(), "row has trailing bytes");
    Ok(values)
}

fn one(cols: &[(&str, &str)], json: &str) -> Result<Value, RecordError> {
    let mut enc = encoder(cols, MappingOptions::default());
    Ok(row(&mut enc, json)?.remove(0))
}

fn err(ty: &str, json_value: &str) -> RecordError {
    let e = one(&[("c", ty)], &format!("{{\"c\": {json_value}}}")).expect_err("should be refused");
    assert_eq!(e.kind, RecordErrorKind::Encode, "{e}");
    assert_eq!(e.column.as_deref(), Some("c"));
    e
}

fn ok(ty: &str, json_value: &str) -> Value {
    one(&[("c", ty)], &format!("{{\"c\": {json_value}}}"))
        .unwrap_or_else(|e| panic!("{ty} <- {json_value}: {e}"))
}

fn int(v: i128) -> Value {
    Value::Int(Wide::from_i128(v))
}

fn s(v: &str) -> Value {
    Value::String(v.as_bytes().to_vec())
}

fn flights_encoder() -> JsonRowEncoder {
    encoder(
        &[
            ("date", "DateTime('UTC')"),
            ("delay", "Int32"),
            ("distance", "UInt32"),
            ("origin", "LowCardinality(String)"),
            ("destination", "String"),
        ],
        MappingOptions {
            time: TimeRules {
                formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
                ..TimeRules::default()
            },
            ..MappingOptions::default()
        },
    )
}

#[test]
fn flights_rows_encode_byte_exact() {
    let mut enc = flights_encoder();
    let mut buf = Vec::new();
    let first = FLIGHTS.lines().next().unwrap();
    enc.encode_json(first.as_bytes(), &mut buf).unwrap();
    // {"date":"2001/01/01 00:47","delay":66,"distance":1750,"origin":"DTW","destination":"LAS"}
    let mut expect = Vec::new();
    expect.extend_from_slice(&978_310_020u32.to_le_bytes());
    expect.extend_from_slice(&66i32.to_le_bytes());
    expect.extend_from_slice(&1750u32.to_le_bytes());
    expect.extend_from_slice(b"\x03DTW\x03LAS");
    assert_eq!(buf, expect);

    let mut all = Vec::new();
    for line in FLIGHTS.lines() {
        enc.encode_json(line.as_bytes(), &mut all).unwrap();
    }
    let mut input = all.as_slice();
    let mut rows = 0;
    while !input.is_empty() {
        let vals: Vec<Value> = enc
            .columns()
            .iter()
            .map(|c| decode(&c.ty, &mut input).unwrap())
            .collect();
        assert!(matches!(vals[0], Value::DateTime(s) if (978_307_200..978_393_600).contains(&s)));
        rows += 1;
    }
    assert_eq!(rows, 50);
}

#[test]
fn field_order_does_not_change_bytes() {
    let mut enc = flights_encoder();
    let a = r#"{"date":"2001/01/01 00:47","delay":66,"distance":1750,"origin":"DTW","destination":"LAS"}"#;
    let b = r#"{"destination":"LAS","origin":"DTW","extra":[1,{"x":2}],"distance":1750,"delay":66,"date":"2001/01/01 00:47"}"#;
    let (mut x, mut y) = (vec![7u8], vec![7u8]);
    enc.encode_json(a.as_bytes(), &mut x).unwrap();
    enc.encode_json(b.as_bytes(), &mut y).unwrap();
    assert_eq!(x, y);
    // a duplicate key: the last one wins, and no dead bytes stay behind
    let c = r#"{"date":"2001/01/01 00:47","delay":1,"distance":1750,"origin":"DTW","destination":"LAS","delay":66}"#;
    let mut z = vec![7u8];
    enc.encode_json(c.as_bytes(), &mut z).unwrap();
    assert_eq!(x, z);
}

#[test]
fn integers_are_range_checked_never_wrapped() {
    assert_eq!(ok("UInt8", "255"), int(255));
    assert_eq!(ok("Int8", "-128"), int(-128));
    assert_eq!(
        ok("Int32", "\"42\""),
        int(42),
        "strings of digits are numbers"
    );
    assert_eq!(ok("Int32", "5.0"), int(5));
    assert_eq!(ok("Int32", "1e3"), int(1000));
    assert_eq!(
        ok("Int64", "1e17"),
        int(100_000_000_000_000_000),
        "exact from the text"
    );
    assert!(err("UInt64", "1e20").reason.contains("out of range"));
    assert_eq!(
        ok("UInt64", "18446744073709551615"),
        int(i128::from(u64::MAX))
    );
    assert_eq!(
        ok("Int64", "-9223372036854775808"),
        int(i128::from(i64::MIN))
    );
    assert_eq!(
        ok("Int128", "\"-170141183460469231731687303715884105728\""),
        int(i128::MIN)
    );
    assert!(err("UInt8", "256").reason.contains("out of range"));
    assert!(err("UInt32", "-1").reason.contains("out of range"));
    assert!(
        err("Int64", "9223372036854775808")
            .reason
            .contains("out of range")
    );
    assert!(err("Int32", "1.5").reason.contains("not an integer"));
    let e = err("UInt32", "\"abc\"");
    assert!(e.reason.contains("\"abc\" is not a number"), "{e}");
    assert!(err("Int32", "true").reason.contains("cannot put a bool"));
    assert!(err("Int32", "[1]").reason.contains("cannot put"));
}

#[test]
fn floats_take_numbers_and_special_strings() {
    assert_eq!(ok("Float64", "0.1"), Value::Float64(0.1));
    assert_eq!(ok("Float64", "7"), Value::Float64(7.0));
    assert_eq!(ok("Float32", "\"-inf\""), Value::Float32(f32::NEG_INFINITY));
    assert_eq!(ok("Float64", "\"Infinity\""), Value::Float64(f64::INFINITY));
    assert!(matches!(ok("Float64", "\"NaN\""), Value::Float64(f) if f.is_nan()));
    assert!(err("Float64", "1e400").reason.contains("out of range"));
    assert!(err("Float32", "1e39").reason.contains("out of range"));
    assert!(err("Float64", "\"1,5\"").reason.contains("not a number"));
}

#[test]
fn decimals_never_go_through_binary_floats() {
    let d = |v: i128| Value::Decimal(Wide::from_i128(v));
    assert_eq!(ok("Decimal(18, 4)", "\"12345.6789\""), d(123_456_789));
    assert_eq!(ok("Decimal(18, 4)", "0.1"), d(1000));
    assert_eq!(ok("Decimal(18, 4)", "-2"), d(-20_000));
    assert_eq!(
        ok("Decimal(38, 18)", "123456789.123456789123456789"),
        d(123_456_789_123_456_789_123_456_789)
    );
    assert!(
        err("Decimal(18, 4)", "0.00001")
            .reason
            .contains("truncated")
    );
    assert!(
        err("Decimal(9, 2)", "10000000")
            .reason
            .contains("digits before the point")
    );
    assert!(
        err("Decimal(9, 2)", "\"x\"")
            .reason
            .contains("not a number")
    );
}

#[test]
fn times_from_text_and_epochs() {
    let secs = 1_517_966_773i64;
    assert_eq!(
        ok("DateTime", "\"2018-02-07T01:26:13Z\""),
        Value::DateTime(secs)
    );
    assert_eq!(
        ok("DateTime", "\"2018-02-07 01:26:13\""),
        Value::DateTime(secs)
    );
    assert_eq!(
        ok("DateTime", "\"2018-02-07T06:56:13+05:30\""),
        Value::DateTime(secs)
    );
    assert_eq!(ok("DateTime", "1517966773"), Value::DateTime(secs));
    assert_eq!(
        ok("DateTime", "1517966773840"),
        Value::DateTime(secs),
        "epoch ms into DateTime"
    );
    assert_eq!(ok("DateTime", "\"1517966773840\""), Value::DateTime(secs));
    assert_eq!(
        ok("DateTime64(3)", "1517966773840"),
        Value::DateTime64(1_517_966_773_840)
    );
    assert_eq!(
        ok("DateTime64(3)", "1517966773.84"),
        Value::DateTime64(1_517_966_773_840)
    );
    assert_eq!(
        ok("DateTime64(9, 'UTC')", "1517966773.840123456"),
        Value::DateTime64(1_517_966_773_840_123_456)
    );
    assert_eq!(
        ok("DateTime64(6)", "\"2018-02-07 01:26:13.840123\""),
        Value::DateTime64(1_517_966_773_840_123)
    );
    assert_eq!(
        ok("DateTime64(3)", "\"1969-12-31T23:59:59.9995Z\""),
        Value::DateTime64(-1),
        "times floor to the column's precision"
    );
    assert_eq!(
        ok("Date", "\"2000-03-01\""),
        Value::Date(days_from_civil(2000, 3, 1))
    );
    assert_eq!(ok("Date32", "\"1900-01-01\""), Value::Date(-25_567));
    assert!(err("Date", "\"1969-12-31\"").reason.contains("range"));
    assert!(err("Date", "17000").reason.contains("date text"));
    assert!(err("DateTime", "-1").reason.contains("range"));
    assert!(
        err("DateTime", "\"yesterday\"")
            .reason
            .contains("not a time")
    );
    let e = err("DateTime('Europe/Moscow')", "\"2018-02-07 01:26:13\"");
    assert!(e.reason.contains("no UTC offset"), "{e}");
    assert_eq!(
        ok("DateTime('Europe/Moscow')", "\"2018-02-07T01:26:13Z\""),
        Value::DateTime(secs)
    );
}

#[test]
fn bools_uuids_ips_enums() {
    assert_eq!(ok("Bool", "true"), Value::Bool(true));
    assert_eq!(ok("Bool", "0"), Value::Bool(false));
    assert_eq!(ok("Bool", "\"1\""), Value::Bool(true));
    assert!(err("Bool", "2").reason.contains("not a bool"));
    assert!(err("Bool", "\"yes\"").reason.contains("not a bool"));
    assert_eq!(
        ok("UUID", "\"61f0c404-5cb3-11e7-907b-a6006ad3dba0\""),
        Value::Uuid(0x61f0_c404_5cb3_11e7_907b_a600_6ad3_dba0)
    );
    assert!(
        err("UUID", "\"61f0c404-5cb3-11e7-907b\"")
            .reason
            .contains("not a UUID")
    );
    assert_eq!(
        ok("IPv4", "\"1.2.3.4\""),
        Value::Ipv4(Ipv4Addr::new(1, 2, 3, 4))
    );
    assert_eq!(
        ok("IPv6", "\"1.2.3.4\""),
        Value::Ipv6(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped())
    );
    assert!(err("IPv4", "\"1.2.3\"").reason.contains("not an IPv4"));
    assert_eq!(ok("Enum8('a' = 1, 'b' = -2)", "\"b\""), Value::Enum(-2));
    assert_eq!(ok("Enum8('a' = 1, 'b' = -2)", "1"), Value::Enum(1));
    assert!(
        err("Enum8('a' = 1)", "\"c\"")
            .reason
            .contains("not a value")
    );
}

#[test]
fn strings_take_any_scalar_as_text() {
    assert_eq!(ok("String", "\"a\\\"b\\u00e9\""), s("a\"b\u{e9}"));
    assert_eq!(ok("String", "1776"), s("1776"));
    assert_eq!(ok("String", "1.50"), s("1.50"), "the number as written");
    assert_eq!(ok("String", "false"), s("false"));
    assert_eq!(
        ok("String", "{\"b\": 1, \"a\": [1, 2]}"),
        s("{\"b\": 1, \"a\": [1, 2]}")
    );
    assert_eq!(ok("String", "\"\""), s(""));
    assert_eq!(
        ok("FixedString(3)", "\"ab\""),
        Value::String(b"ab\0".to_vec())
    );
    assert!(
        err("FixedString(1)", "\"ab\"")
            .reason
            .contains("do not fit")
    );
    assert_eq!(ok("LowCardinality(Nullable(String))", "null"), Value::Null);
}

#[test]
fn nulls_and_missing_fields() {
    assert_eq!(ok("Nullable(Int32)", "null"), Value::Null);
    assert_eq!(one(&[("c", "Nullable(Int32)")], "{}").unwrap(), Value::Null);
    let e = one(&[("c", "Int32")], "{}").unwrap_err();
    assert_eq!(e.column.as_deref(), Some("c"));
    assert!(e.reason.contains("missing"), "{e}");
    let e = one(&[("c", "Int32")], r#"{"c": null}"#).unwrap_err();
    assert!(e.reason.contains("missing or null"), "{e}");

    let specs = vec![
        ColumnSpec {
            name: "status".into(),
            ty: t("String"),
            path: None,
            meta: None,
            missing: MissingValue::Literal("'n/a'".into()),
            options: ColumnOptions::default(),
        },
        ColumnSpec {
            name: "n".into(),
            ty: t("UInt16"),
            path: None,
            meta: None,
            missing: MissingValue::Literal("7".into()),
            options: ColumnOptions::default(),
        },
    ];
    let mut enc = JsonRowEncoder::new(specs, MappingOptions::default()).unwrap();
    assert_eq!(row(&mut enc, r#"{"n": null}"#).unwrap(), [s("n/a"), int(7)]);
    let bad = vec![ColumnSpec {
        name: "n".into(),
        ty: t("UInt8"),
        path: None,
        meta: None,
        missing: MissingValue::Literal("300".into()),
        options: ColumnOptions::default(),
    }];
    assert!(matches!(
        JsonRowEncoder::new(bad, MappingOptions::default()),
        Err(MappingError::BadDefault { .. })
    ));
}

#[test]
fn string_arrays_take_escapes_nulls_and_other_scalars() {
    assert_eq!(
        ok("Array(String)", r#"["a", "b\"c", "\u00e9", 7, true]"#),
        Value::Array(vec![s("a"), s("b\"c"), s("\u{e9}"), s("7"), s("true")])
    );
    assert_eq!(
        ok("Array(Nullable(String))", r#"["x", null]"#),
        Value::Array(vec![s("x"), Value::Null])
    );
    assert_eq!(
        ok("Array(LowCardinality(String))", r#"["x"]"#),
        Value::Array(vec![s("x")])
    );
    assert_eq!(
        ok("Array(Array(String))", r#"[["x"], []]"#),
        Value::Array(vec![Value::Array(vec![s("x")]), Value::Array(vec![])])
    );
    let e = err("Array(String)", r#"["x", null]"#);
    assert!(e.reason.contains("not Nullable"), "{e}");
}

#[test]
fn scalar_fast_paths_keep_the_general_rules() {
    // Each of these goes through a fast path or declines to put_scalar;
    // either way the value and the refusals are the general ones.
    assert_eq!(ok("Nullable(Float64)", "null"), Value::Null);
    assert_eq!(ok("Float64", "-0.5e-2"), Value::Float64(-0.005));
    assert_eq!(ok("Float64", "\"2.5\""), Value::Float64(2.5));
    assert!(err("Float32", "1e39").reason.contains("out of range"));
    assert!(err("Float64", "1e400").reason.contains("out of range"));
    assert_eq!(ok("Nullable(Bool)", "true"), Value::Bool(true));
    assert_eq!(ok("Bool", "\"false\""), Value::Bool(false));
    assert!(err("Bool", "2").reason.contains("not a bool"));
    assert_eq!(
        ok("UUID", r#""61f0c404-5cb3-11e7-907b-a6006ad3dba0""#),
        Value::Uuid(0x61f0_c404_5cb3_11e7_907b_a600_6ad3_dba0)
    );
    assert_eq!(
        ok("UUID", r#""61f0c404-5cb3-11e7-907b-a6006ad3dba\u0030""#),
        Value::Uuid(0x61f0_c404_5cb3_11e7_907b_a600_6ad3_dba0)
    );
    assert!(
        err("UUID", r#""61f0c404-5cb3-11e7-907b-a6006ad3dbaz""#)
            .reason
            .contains("not a UUID")
    );
    assert!(
        err("FixedString(2)", r#""abc""#)
            .reason
            .contains("do not fit")
    );
    assert_eq!(
        ok("IPv4", "\"10.0.3.250\""),
        Value::Ipv4(Ipv4Addr::new(10, 0, 3, 250))
    );
    assert_eq!(
        ok("IPv4", "167772161"),
        Value::Ipv4(Ipv4Addr::new(10, 0, 0, 1))
    );
    assert!(
        err("Nullable(IPv4)", r#""1.2.3.256""#)
            .reason
            .contains("not an IPv4")
    );
    assert!(err("Decimal(9, 2)", "1.234").reason.contains("truncated"));
    assert!(
        err("Decimal(9, 2)", "10000000")
            .reason
            .contains("digits before the point")
    );
    assert_eq!(
        ok("Decimal(9, 2)", "\"-0012.5\""),
        Value::Decimal(Wide::from_i128(-1250))
    );
    assert_eq!(
        ok("Decimal(9, 2)", "1.2e1"),
        Value::Decimal(Wide::from_i128(1200))
    );
}

#[test]
fn arrays_maps_tuples() {
    assert_eq!(
        ok("Array(Nullable(Float64))", "[1.5, null, 2]"),
        Value::Array(vec![Value::Float64(1.5), Value::Null, Value::Float64(2.0)])
    );
    assert_eq!(ok("Array(String)", "[]"), Value::Array(vec![]));
    let e = err("Array(Float64)", "[1, null]");
    assert!(e.reason.contains("not Nullable"), "{e}");
    assert!(
        err("Array(UInt8)", "[1, 300]")
            .reason
            .contains("out of range")
    );
    assert!(
        err("Array(UInt8)", "\"[1]\"")
            .reason
            .contains("cannot put a string")
    );
    let long: Vec<String> = (0..200).map(|i| i.to_string()).collect();
    match ok("Array(UInt8)", &format!("[{}]", long.join(","))) {
        Value::Array(items) => assert_eq!(items.len(), 200),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        ok("Map(String, UInt64)", r#"{"k": 9, "z": "10"}"#),
        Value::Map(vec![(s("k"), int(9)), (s("z"), int(10))])
    );
    assert_eq!(
        ok("Map(UInt16, Nullable(String))", r#"{"42": null}"#),
        Value::Map(vec![(int(42), Value::Null)])
    );
    assert!(
        err("Map(UInt16, String)", r#"{"x": "a"}"#)
            .reason
            .contains("map key")
    );
    assert_eq!(
        ok("Tuple(UInt8, Array(String))", r#"[1, ["a"]]"#),
        Value::Tuple(vec![int(1), Value::Array(vec![s("a")])])
    );
    assert!(
        err("Tuple(UInt8, String)", "[1]")
            .reason
            .contains("needs 2")
    );
    assert!(err("Tuple(UInt8)", "[1, 2]").reason.contains("only 1"));
    assert_eq!(ok("Nullable(Array(UInt8))", "null"), Value::Null);
}

#[test]
fn not_one_json_object_is_a_decode_error() {
    let mut enc = encoder(&[("c", "Nullable(UInt8)")], MappingOptions::default());
    for bad in [
        "",
        "[1]",
        "null",
        "{\"c\": 1",
        "{\"c\": 1} x",
        "not json",
        "{\"c\": 1}{}",
    ] {
        let mut buf = Vec::new();
        let e = enc.encode_json(bad.as_bytes(), &mut buf).unwrap_err();
        assert_eq!(e.kind, RecordErrorKind::Decode, "{bad:?}: {e}");
    }
}

#[test]
fn nested_objects_flatten_and_pointers() {
    let options = MappingOptions {
        flatten_join: Some("_".into()),
        ..MappingOptions::default()
    };
    let mut enc = encoder(
        &[
            ("properties_mag", "Nullable(Float64)"),
            ("properties_felt", "Nullable(UInt32)"),
            ("geometry_type", "String"),
            ("top_level", "UInt8"),
        ],
        options.clone(),
    );
    let vals = row(
        &mut enc,
        r#"{"properties":{"mag":2.5,"felt":null},"geometry":{"type":"Point"},"top_level":1}"#,
    )
    .unwrap();
    assert_eq!(vals, [Value::Float64(2.5), Value::Null, s("Point"), int(1)]);
    // a flattened key written flat reads the same
    let vals = row(
        &mut enc,
        r#"{"properties_mag":1,"geometry":{"type":"P"},"top_level":0}"#,
    )
    .unwrap();
    assert_eq!(vals, [Value::Float64(1.0), Value::Null, s("P"), int(0)]);
    // a null parent object means its fields are missing
    let vals = row(
        &mut enc,
        r#"{"properties":null,"geometry":{"type":"P"},"top_level":0}"#,
    )
    .unwrap();
    assert_eq!(vals[0], Value::Null);

    let mut specs = simple_columns([
        ("lon", t("Float64")),
        ("geometry", t("String")),
        ("kind", t("String")),
    ]);
    specs[0].path = Some(parse_pointer("/geometry/coordinates/0").unwrap());
    specs[2].path = Some(parse_pointer("/geometry/type").unwrap());
    // `/geometry/coordinates/0` indexes an array, which paths do not do: an
    // error naming the column, not a silent NULL.
    let mut enc = JsonRowEncoder::new(specs, MappingOptions::default()).unwrap();
    let e = row(
        &mut enc,
        r#"{"geometry":{"type":"Point","coordinates":[1,2]}}"#,
    )
    .unwrap_err();
    assert_eq!(e.column.as_deref(), Some("lon"));
    assert!(e.reason.contains("expected a JSON object"), "{e}");
    assert_eq!(parse_pointer("/a~1b/c~0d").unwrap(), ["a/b", "c~d"]);
    assert!(parse_pointer("a").is_err());
}

#[test]
fn a_column_and_its_nested_columns_read_one_field() {
    let mut specs = simple_columns([("geometry", t("String")), ("kind", t("String"))]);
    specs[1].path = Some(parse_pointer("/geometry/type").unwrap());
    let mut enc = JsonRowEncoder::new(specs, MappingOptions::default()).unwrap();
    let vals = row(&mut enc, r#"{"geometry":{"type":"Point"}}"#).unwrap();
    assert_eq!(vals, [s(r#"{"type":"Point"}"#), s("Point")]);
}

#[test]
fn earthquakes_map_by_the_coercion_rules() {
    let options = MappingOptions {
        flatten_join: Some("_".into()),
        ..MappingOptions::default()
    };
    let mut specs = simple_columns([
        ("id", t("String")),
        ("properties_mag", t("Nullable(Float64)")),
        ("properties_place", t("String")),
        ("properties_time", t("DateTime64(3, 'UTC')")),
        ("properties_tz", t("Nullable(Int16)")),
        ("properties_felt", t("Nullable(UInt32)")),
        ("properties_tsunami", t("Bool")),
        ("coordinates", t("Array(Float64)")),
    ]);
    specs[7].path = Some(parse_pointer("/geometry/coordinates").unwrap());
    let mut enc = JsonRowEncoder::new(specs, options).unwrap();
    let mut n = 0;
    for line in EARTHQUAKES.lines() {
        let vals = row(&mut enc, line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if n == 0 {
            assert_eq!(vals[0], s("ci37868143"));
            assert_eq!(vals[1], Value::Float64(2.0));
            assert_eq!(vals[2], s("4km W of Castaic, CA"));
            assert_eq!(vals[3], Value::DateTime64(1_517_966_773_840));
            assert_eq!(vals[4], int(-480));
            assert_eq!(vals[5], Value::Null);
            assert_eq!(vals[6], Value::Bool(false));
            assert_eq!(
                vals[7],
                Value::Array(vec![
                    Value::Float64(-118.6671667),
                    Value::Float64(34.4945),
                    Value::Float64(26.49)
                ])
            );
        }
        n += 1;
    }
    assert_eq!(n, 20);
}

#[test]
fn movies_messy_values_land_by_the_rules() {
    let options = MappingOptions {
        time: TimeRules {
            formats: vec![TimeFormat::compile("%b %d %Y").unwrap()],
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    let mut enc = encoder(
        &[
            ("Title", "String"),
            ("US Gross", "Nullable(Int64)"),
            ("Release Date", "Date32"),
            ("IMDB Rating", "Nullable(Decimal(4, 1))"),
            ("Rotten Tomatoes Rating", "Nullable(UInt8)"),
            ("Director", "LowCardinality(Nullable(String))"),
        ],
        options,
    );
    let mut titles_as_numbers = 0;
    for line in MOVIES.lines() {
        let vals = row(&mut enc, line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if line.starts_with("{\"Title\":1776") {
            assert_eq!(vals[0], s("1776"));
            assert_eq!(vals[2], Value::Date(days_from_civil(1972, 11, 9)));
            assert_eq!(
                vals[3],
                Value::Decimal(Wide::from_i128(70)),
                "int rating 7 -> 7.0"
            );
            assert_eq!(vals[4], int(57));
            assert_eq!(vals[5], Value::Null);
            titles_as_numbers += 1;
        }
    }
    assert!(titles_as_numbers >= 1);
    // Date (from 1970) refuses the 1963 release dates instead of wrapping them.
    let e = one(&[("d", "Date")], r#"{"d": "1963-10-07"}"#).unwrap_err();
    assert!(e.reason.contains("outside Date's range"), "{e}");
    let first = row(&mut enc, MOVIES.lines().next().unwrap()).unwrap();
    assert_eq!(first[0], s("The Land Girls"));
    assert_eq!(first[3], Value::Decimal(Wide::from_i128(61)), "6.1 exactly");
}

#[test]
fn the_chain_encoder_seam_reads_payloads() {
    let (tx, _rx) = ack_channel();
    let tp = TopicPartition::new("flights", 3);
    let ack = AckIssuer::new(tp.clone(), 1, tx).issue(10, 10);
    let json = FLIGHTS.lines().next().unwrap().as_bytes();
    let payload = Payload {
        value: Some(json),
        key: None,
        partition: &tp,
        offset: 10,
        timestamp_ms: None,
        timestamp_kind: spate_core::record::TimestampKind::None,
        headers: spate_core::record::Headers::NONE,
    };
    let cx = RecordCx { payload, ack: &ack };
    let mut enc = flights_encoder();
    let mut buf = Vec::new();
    Encoder::encode(&mut enc, &payload, &cx, &mut buf).unwrap();
    assert_eq!(buf.len(), 4 + 4 + 4 + 4 + 4);
    let tomb = Payload {
        value: None,
        ..payload
    };
    let e = Encoder::encode(&mut enc, &tomb, &cx, &mut buf).unwrap_err();
    assert_eq!(e.kind, RecordErrorKind::Decode);
}

#[test]
fn generic_encoder_agrees_with_the_mapper() {
    // The mapper's bytes equal rowbinary::encode of the expected values.
    let cols = [
        ("a", "Nullable(Decimal(18, 4))"),
        ("b", "Array(Nullable(Float64))"),
        ("c", "UUID"),
    ];
    let mut enc = encoder(&cols, MappingOptions::default());
    let mut got = Vec::new();
    enc.encode_json(
        br#"{"a":"12345.6789","b":[1,null],"c":"61f0c404-5cb3-11e7-907b-a6006ad3dba0"}"#,
        &mut got,
    )
    .unwrap();
    let mut want = Vec::new();
    for ((_, ty), v) in cols.iter().zip([
        Value::Decimal(Wide::from_i128(123_456_789)),
        Value::Array(vec![Value::Float64(1.0), Value::Null]),
        Value::Uuid(0x61f0_c404_5cb3_11e7_907b_a600_6ad3_dba0),
    ]) {
        encode(&t(ty), &v, &mut want).unwrap();
    }
    assert_eq!(got, want);
}

// ---- the scanner against the serde reference reader ----

mod differential {
    use proptest::prelude::*;

    use super::*;

    const COLUMNS: &[(&str, &str)] = &[
        ("a", "Nullable(Int32)"),
        ("b", "String"),
        ("c", "Array(Nullable(Int16))"),
        ("d", "Map(String, UInt8)"),
        ("e", "Nullable(Decimal(9, 2))"),
        ("f", "Tuple(UInt8, String)"),
        ("g", "Nullable(DateTime('UTC'))"),
        ("h", "Nullable(Float64)"),
        ("i", "Nullable(Bool)"),
        ("j", "Nullable(UUID)"),
        ("k", "LowCardinality(Nullable(FixedString(3)))"),
        ("l", "Nullable(IPv4)"),
        ("m", "Nullable(Decimal(18, 4))"),
        ("n", "Nullable(Float32)"),
        ("o", "Array(Nullable(String))"),
        ("p", "Array(Array(LowCardinality(String)))"),
    ];

    fn value_for(col: &'static str) -> BoxedStrategy<String> {
        let quoted = |s: String| serde_json::to_string(&s).unwrap();
        match col {
            "a" => prop_oneof![
                Just("null".to_string()),
                any::<i32>().prop_map(|v| v.to_string()),
                any::<i64>().prop_map(|v| v.to_string())
            ]
            .boxed(),
            "b" => any::<String>().prop_map(quoted).boxed(),
            "c" => proptest::collection::vec(
                prop_oneof![
                    Just("null".to_string()),
                    any::<i16>().prop_map(|v| v.to_string())
                ],
                0..4,
            )
            .prop_map(|v| format!("[{}]", v.join(", ")))
            .boxed(),
            "d" => proptest::collection::vec(("[a-z\\\\\"]{0,3}", any::<u8>()), 0..3)
                .prop_map(move |v| {
                    let items: Vec<String> = v
                        .into_iter()
                        .map(|(k, n)| format!("{}: {n}", serde_json::to_string(&k).unwrap()))
                        .collect();
                    format!("{{{}}}", items.join(","))
                })
                .boxed(),
            "e" => prop_oneof![
                Just("null".to_string()),
                "-?[0-9]{1,7}(\\.[0-9]{1,2})?",
                "\"[0-9]{1,3}\\.[0-9]\""
            ]
            .boxed(),
            "f" => (any::<u8>(), any::<String>())
                .prop_map(move |(n, s)| format!("[{n}, {}]", serde_json::to_string(&s).unwrap()))
                .boxed(),
            "h" | "n" => prop_oneof![
                Just("null".to_string()),
                any::<f64>().prop_map(|v| serde_json::to_string(&v).unwrap()),
                any::<f32>().prop_map(|v| serde_json::to_string(&v).unwrap()),
                "-?[0-9]{1,3}(\\.[0-9]{1,4})?([eE][+-]?[0-9]{1,4})?",
                "-?[0-9]{30,45}",
                Just("3.4028236e38".to_string()),
                Just("1e-999".to_string()),
                "\"(-?[0-9]\\.5|NaN|-inf|x)\""
            ]
            .boxed(),
            "o" | "p" => proptest::collection::vec(
                prop_oneof![
                    Just("null".to_string()),
                    any::<String>().prop_map(quoted),
                    "[a-z\\\\\"]{0,3}".prop_map(quoted),
                    any::<i16>().prop_map(|v| v.to_string())
                ],
                0..4,
            )
            .prop_map(|v| format!("[{}]", v.join(", ")))
            .boxed(),
            "i" => prop_oneof![
                Just("null".to_string()),
                Just("true".to_string()),
                Just("false".to_string()),
                Just("1".to_string()),
                Just("\"true\"".to_string())
            ]
            .boxed(),
            "j" => prop_oneof![
                Just("null".to_string()),
                "\"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\"",
                "\"[0-9a-fA-Fg-]{31,37}\"",
                "\"[0-9a-f]{32}\"",
                "\"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-\\u0030[0-9a-f]{11}\""
            ]
            .boxed(),
            "k" => prop_oneof![
                Just("null".to_string()),
                "[a-z\u{e9}\\\\\"]{0,4}".prop_map(quoted),
                "[0-9]{1,4}"
            ]
            .boxed(),
            "l" => prop_oneof![
                Just("null".to_string()),
                "\"[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,4}\"",
                "\"0[0-9]\\.1\\.2\\.3\"",
                any::<u32>().prop_map(|v| v.to_string())
            ]
            .boxed(),
            "m" => prop_oneof![
                Just("null".to_string()),
                "-?[1-9][0-9]{0,16}(\\.[0-9]{1,6})?",
                "-?0(\\.[0-9]{1,6})?",
                "\"[-+]?0*[0-9]{1,15}(\\.[0-9]{0,5})?\"",
                "-?[0-9](\\.[0-9]{1,3})?[eE][+-]?[0-9]",
                "[1-9][0-9]{17,20}"
            ]
            .boxed(),
            _ => prop_oneof![
                Just("null".to_string()),
                (0u32..2_000_000_000).prop_map(|v| v.to_string()),
                Just("\"2018-02-07T01:26:13Z\"".to_string())
            ]
            .boxed(),
        }
    }

    fn row() -> impl Strategy<Value = String> {
        let fields: Vec<BoxedStrategy<Option<String>>> = COLUMNS
            .iter()
            .map(|(name, _)| {
                proptest::option::weighted(
                    0.9,
                    value_for(name).prop_map(move |v| format!("\"{name}\": {v}")),
                )
                .boxed()
            })
            .collect();
        (fields, "[ \\n]{0,2}", proptest::bool::ANY).prop_map(|(fs, ws, extra)| {
            let mut parts: Vec<String> = fs.into_iter().flatten().collect();
            if extra {
                parts.push("\"zz\": {\"x\": [1, 2.5e3, true, null, \"\\u00e9\"]}".to_string());
            }
            format!("{{{ws}{}{ws}}}", parts.join(&format!(",{ws}")))
        })
    }

    /// A row, maybe with one byte cut, changed or inserted.
    fn mutated() -> impl Strategy<Value = Vec<u8>> {
        (row(), any::<prop::sample::Index>(), 0u8..4, any::<u8>()).prop_map(|(r, at, how, byte)| {
            let mut b = r.into_bytes();
            let i = at.index(b.len().max(1)).min(b.len());
            match how {
                0 => {}
                1 if i < b.len() => {
                    b.remove(i);
                }
                2 if i < b.len() => b[i] = byte,
                _ => b.insert(i, byte),
            }
            b
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn scan_agrees_with_serde(json in mutated()) {
            let mut enc = encoder(COLUMNS, MappingOptions::default());
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            let a = enc.encode_json(&json, &mut fast);
            let b = enc.encode_json_serde(&json, &mut slow);
            let text = String::from_utf8_lossy(&json);
            match (&a, &b) {
                (Ok(()), Ok(())) => prop_assert_eq!(&fast, &slow, "{}", text),
                // Bad JSON after a refused value: the scanner checks the
                // grammar first (decode error), serde stops at the refusal.
                (Err(x), Err(y)) if x.kind == RecordErrorKind::Decode
                    && serde_json::from_slice::<serde::de::IgnoredAny>(&json).is_err() => {
                    let _ = y;
                }
                // serde_json refuses numbers beyond f64's range as bad JSON;
                // RFC 8259 allows them, and the scanner refuses the value.
                (Err(x), Err(y)) if x.kind == RecordErrorKind::Encode
                    && y.reason.contains("number out of range") => {}
                (Err(x), Err(y)) => prop_assert_eq!(x.kind, y.kind, "{} / {} on {}", x, y, text),
                _ => prop_assert!(false, "scanner {:?} but serde {:?} on {}", a, b, text),
            }
        }
    }
}

#[test]
fn named_tuples_from_objects_by_field_name() {
    let ty = "Tuple(a UInt8, b String, c Nullable(Int16))";
    let want = Value::Tuple(vec![int(1), s("x"), int(-2)]);
    // Any field order; the bytes come out in declared order.
    assert_eq!(ok(ty, r#"{"a": 1, "b": "x", "c": -2}"#), want);
    assert_eq!(
        ok(ty, r#"{"c": "-2", "zz": [1, {}], "b": "x", "a": 1}"#),
        want
    );
    // An array still maps by position.
    assert_eq!(ok(ty, r#"[1, "x", -2]"#), want);
    // A missing Nullable element is NULL, a missing other one is refused.
    assert_eq!(
        ok(ty, r#"{"b": "x", "a": 1}"#),
        Value::Tuple(vec![int(1), s("x"), Value::Null])
    );
    let e = err(ty, r#"{"a": 1}"#);
    assert!(e.reason.contains("`b`"), "{e}");
    assert!(
        err(ty, r#"{"a": 1, "a": 2, "b": ""}"#)
            .reason
            .contains("twice")
    );
    assert!(
        err(ty, r#"{"a": 300, "b": ""}"#)
            .reason
            .contains("out of range")
    );
    // Nested: arrays of named tuples, a Nullable named tuple.
    assert_eq!(
        ok(
            "Array(Tuple(k String, v UInt8))",
            r#"[{"v": 1, "k": "p"}, {"k": "q", "v": 2}]"#
        ),
        Value::Array(vec![
            Value::Tuple(vec![s("p"), int(1)]),
            Value::Tuple(vec![s("q"), int(2)]),
        ])
    );
    assert_eq!(
        ok(
            "Nullable(Tuple(k String, v UInt8))",
            r#"{"v": 3, "k": "r"}"#
        ),
        Value::Tuple(vec![s("r"), int(3)])
    );
    // Unnamed tuples take arrays only; the JSON is still checked.
    let e = err("Tuple(UInt8, String)", r#"{"a": 1}"#);
    assert!(e.reason.contains("send an array"), "{e}");
    let mut enc = encoder(&[("c", "Tuple(UInt8, String)")], MappingOptions::default());
    let e = row(&mut enc, r#"{"c": {"a": 1,}}"#).unwrap_err();
    assert_eq!(e.kind, RecordErrorKind::Decode, "{e}");
}

/// Strings around the scanner's one-word short path (the closing quote
/// within 8 bytes) and the 16-byte copy of `put_string`, at the start, the
/// middle and the very end of the message, agree with the serde reader.
#[test]
fn strings_of_every_short_length_read_exactly() {
    let mut enc = encoder(
        &[("a", "String"), ("b", "Nullable(String)"), ("k", "UInt8")],
        MappingOptions::default(),
    );
    let mut bodies: Vec<String> = Vec::new();
    for len in [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 127, 128, 129, 300,
    ] {
        bodies.push("x".repeat(len));
        // non-ASCII: a 2-byte character across the 8-byte word edge
        if len >= 2 {
            bodies.push(format!("{}é", "y".repeat(len - 2)));
        }
        // an escape at the first, the last and a word-edge place
        for at in [0, len.saturating_sub(1), 7, 8] {
            if at <= len && len > 0 {
                let mut t = "z".repeat(len);
                t.insert_str(at.min(len), "\\\"");
                bodies.push(t);
            }
        }
    }
    bodies.push("\\u00e9\\n".into());
    bodies.push("ab\\\\".into());
    for body in &bodies {
        let want: String = serde_json::from_str(&format!("\"{body}\"")).unwrap();
        for json in [
            format!(r#"{{"a":"{body}","b":"{body}","k":1}}"#),
            format!(r#"{{"k":1,"b":"{body}","a":"{body}"}}"#),
            format!(r#"{{"k":1,"a":"","b":"{body}"}}"#),
            format!(r#"{{"a":"{body}","k":1,"b":"{body}"  }}"#),
        ] {
            let mut fast = Vec::new();
            let mut reference = Vec::new();
            enc.encode_json(json.as_bytes(), &mut fast)
                .unwrap_or_else(|e| panic!("{json}: {e}"));
            enc.encode_json_serde(json.as_bytes(), &mut reference)
                .unwrap();
            assert_eq!(fast, reference, "{json}");
            let vals = row(&mut enc, &json).unwrap();
            assert_eq!(vals[1], s(&want), "{json}");
        }
    }
    // Errors inside and at the end of short strings stay decode errors.
    for bad in [
        "{\"a\":\"ab",
        "{\"a\":\"",
        "{\"a\":\"abc\u{1}\"}",
        "{\"a\":\"\u{1f}\"}",
        "{\"a\":\"ab\\q\"}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"abcdefghijk",
        "{\"a\":\"abc\\\"}",
    ] {
        let e = enc
            .encode_json(bad.as_bytes(), &mut Vec::new())
            .unwrap_err();
        assert_eq!(e.kind, RecordErrorKind::Decode, "{bad:?}: {e}");
    }
}

/// The date fast path reads a first format's fixed layout straight from
/// the message when its closing quote sits where the layout ends; every
/// other shape (escapes, a quote inside, other lengths, epochs, RFC 3339,
/// bad dates) must read as the serde reader reads it.
#[test]
fn fixed_layout_dates_read_as_the_general_path() {
    let mut enc = encoder(
        &[("date", "DateTime"), ("d64", "Nullable(DateTime64(3))")],
        MappingOptions {
            time: TimeRules {
                formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
                ..TimeRules::default()
            },
            ..MappingOptions::default()
        },
    );
    for date in [
        r#""2001/01/01 00:47""#,
        r#""2000/02/29 23:59""#,
        r#""1900/02/29 00:00""#,
        r#""2024/12/31 23:59""#,
        r#""2001/02/30 00:47""#,
        r#""2001/13/01 00:47""#,
        r#""2001/01/01 24:00""#,
        r#""2001/01/01 0x:47""#,
        r#""2001\/01\/01 00:47""#,
        r#""2001/01/01 00:4\"""#,
        r#""2001/01/01 00:47x""#,
        r#""2001/01/01 00:4""#,
        r#""2001/01/01 00:47 ""#,
        r#""2001-01-01T00:47:00Z""#,
        r#""978310020""#,
        "978310020",
        "null",
        r#""""#,
    ] {
        for json in [
            format!(r#"{{"date":{date},"d64":{date}}}"#),
            format!(r#"{{"d64":{date},"date":"2001/01/01 00:47"}}"#),
        ] {
            agrees_with_serde(&mut enc, &json, &[]);
        }
    }
    let vals = row(
        &mut enc,
        r#"{"date":"2001/01/01 00:47","d64":"2001/01/01 00:47"}"#,
    )
    .unwrap();
    assert_eq!(vals[0], Value::DateTime(978_310_020));
    assert_eq!(vals[1], Value::DateTime64(978_310_020_000));
    let e = enc
        .encode_json(br#"{"date":"2001/02/30 00:47"}"#, &mut Vec::new())
        .unwrap_err();
    assert_eq!(e.column.as_deref(), Some("date"), "{e}");
}

/// A key repeated in an object read into a Map: one entry, the last value,
/// at the key's first place (docs/CONFIG.md), nested Maps too, and the
/// serde reference reader agrees byte for byte.
#[test]
fn a_key_repeated_in_a_map_object_keeps_its_last_value() {
    assert_eq!(
        ok("Map(String, UInt8)", r#"{"a": 1, "b": 2, "a": 3}"#),
        Value::Map(vec![(s("a"), int(3)), (s("b"), int(2))])
    );
    assert_eq!(
        ok("Map(String, Nullable(UInt8))", r#"{"a": 1, "a": null}"#),
        Value::Map(vec![(s("a"), Value::Null)])
    );
    let nested = r#"{"o": {"x": 1, "x": 2}, "p": {}, "o": {"y": 3, "y": 4}}"#;
    assert_eq!(
        ok("Map(String, Map(String, UInt8))", nested),
        Value::Map(vec![
            (s("o"), Value::Map(vec![(s("y"), int(4))])),
            (s("p"), Value::Map(vec![])),
        ])
    );
    let mut enc = encoder(
        &[("m", "Map(String, Map(String, UInt8))"), ("n", "UInt8")],
        MappingOptions::default(),
    );
    for json in [
        format!(r#"{{"m": {nested}, "n": 7}}"#),
        r#"{"n": 7, "m": {"a": {}, "a": {"b": 1}, "c": {"d": 300}}}"#.to_string(),
    ] {
        agrees_with_serde(&mut enc, &json, b"prefix");
    }
}

/// The scanner and the serde reference reader write the same bytes after
/// `prefix`, or refuse `json` with the same kind, column and reason.
fn agrees_with_serde(enc: &mut JsonRowEncoder, json: &str, prefix: &[u8]) {
    let (mut fast, mut reference) = (prefix.to_vec(), prefix.to_vec());
    let got = enc.encode_json(json.as_bytes(), &mut fast);
    let want = enc.encode_json_serde(json.as_bytes(), &mut reference);
    match (got, want) {
        (Ok(()), Ok(())) => assert_eq!(fast, reference, "{json}"),
        (Err(a), Err(b)) => {
            assert_eq!((a.kind, &a.column), (b.kind, &b.column), "{json}");
            assert_eq!(a.reason, b.reason, "{json}");
        }
        (a, b) => panic!("{json}: scanner {a:?}, serde {b:?}"),
    }
}

/// Rows whose columns all arrive in column order skip the reorder pass;
/// every other arrival (out of order, missing, repeated, a late null into
/// a non-Nullable column) must still read as the serde reader reads it.
#[test]
fn in_order_rows_skip_the_reorder_pass_only_when_complete() {
    let mut enc = encoder(
        &[("a", "UInt8"), ("b", "Nullable(String)"), ("c", "Int32")],
        MappingOptions::default(),
    );
    for json in [
        r#"{"a":1,"b":"x","c":3}"#,
        r#"{"id":7,"a":1,"x":[1,{"y":2}],"b":"x","c":3,"z":null}"#,
        r#"{"c":3,"b":"x","a":1}"#,
        r#"{"a":1,"c":3,"b":"x"}"#,
        r#"{"a":1,"c":3}"#,
        r#"{"a":1,"b":null,"c":3}"#,
        r#"{"a":1,"b":"x"}"#,
        r#"{"b":"x","c":3}"#,
        r#"{"a":1,"b":"x","c":3,"a":2}"#,
        r#"{"a":1,"b":"x","c":3,"c":4}"#,
        r#"{"a":1,"b":"x","c":3,"c":null}"#,
        r#"{"a":1,"b":"x","c":3,"a":null}"#,
        r#"{"a":null,"a":1,"b":"x","c":3}"#,
        r#"{"a":1,"b":"x","b":"yy","c":3}"#,
        r#"{}"#,
    ] {
        agrees_with_serde(&mut enc, json, &[5]);
    }
    assert_eq!(
        row(&mut enc, r#"{"a":1,"b":"x","c":3,"c":4}"#).unwrap(),
        [int(1), s("x"), int(4)]
    );
    let e = enc
        .encode_json(br#"{"a":1,"b":"x","c":3,"c":null}"#, &mut Vec::new())
        .unwrap_err();
    assert_eq!(e.column.as_deref(), Some("c"), "{e}");
}

/// The in-order key comparison (a key, its quotes and the colon in
/// one load for keys of at most 13 bytes, a slice compare for longer ones)
/// reads every key as the serde reader does: keys of every length around
/// the 16-byte boundary, keys that are prefixes of one another, escaped
/// keys, whitespace around the colon, keys near the input's end, and keys
/// out of order, missing, repeated or unknown.
#[test]
fn expected_keys_read_as_the_general_path() {
    let names: Vec<String> = [1usize, 2, 6, 7, 8, 9, 13, 14, 15, 16, 17, 24]
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let first = char::from(b'a' + k as u8);
            format!("{first}{}", "k".repeat(n - 1))
        })
        .chain(["ab".into(), "abk".into(), "é".into(), "q\"t".into()])
        .collect();
    let specs: Vec<(&str, &str)> = names
        .iter()
        .enumerate()
        .map(|(k, n)| (n.as_str(), if k % 2 == 0 { "UInt16" } else { "String" }))
        .collect();
    let mut enc = encoder(&specs, MappingOptions::default());
    let value = |k: usize| {
        if k % 2 == 0 {
            format!("{k}")
        } else {
            format!("\"v{k}\"")
        }
    };
    let field = |k: usize, key: &str, sep: &str| format!("{key}{sep}{}", value(k));
    let quoted = |name: &str| serde_json::to_string(name).unwrap();
    let join = |fields: Vec<String>| format!("{{{}}}", fields.join(","));
    let all = |sep: &str| {
        join(
            names
                .iter()
                .enumerate()
                .map(|(k, n)| field(k, &quoted(n), sep))
                .collect(),
        )
    };
    let mut rows = vec![all(":"), all(" :"), all(": "), all(" : "), all("\n:\t")];
    // Each key escaped in turn (its first byte as \u00XX).
    for (k, n) in names.iter().enumerate() {
        let c = n.chars().next().unwrap();
        let escaped = format!(
            "\"\\u{:04x}{}",
            u32::from(c),
            &quoted(n)[1 + c.len_utf8()..]
        );
        rows.push(join(
            names
                .iter()
                .enumerate()
                .map(|(j, m)| field(j, &if j == k { escaped.clone() } else { quoted(m) }, ":"))
                .collect(),
        ));
    }
    // Out of order, missing, repeated and unknown keys.
    let mut reversed: Vec<String> = (0..names.len())
        .map(|k| field(k, &quoted(&names[k]), ":"))
        .collect();
    reversed.reverse();
    rows.push(join(reversed.clone()));
    for skip in 0..names.len() {
        let fields: Vec<String> = (0..names.len())
            .filter(|&k| k != skip)
            .map(|k| field(k, &quoted(&names[k]), ":"))
            .collect();
        rows.push(join(fields.clone()));
        let mut repeated = fields.clone();
        repeated.insert(
            skip.min(repeated.len()),
            field(skip, &quoted(&names[skip]), ":"),
        );
        repeated.insert(0, field(skip, &quoted(&names[skip]), ":"));
        rows.push(join(repeated));
        let mut unknown = fields;
        // A key one byte longer or shorter than the expected one, in its
        // place.
        let longer = format!("{}x", names[skip]);
        let mut shorter = names[skip].clone();
        shorter.pop();
        unknown.insert(skip, field(skip, &quoted(&longer), ":"));
        unknown.insert(skip, format!("{}:null", quoted(&shorter)));
        unknown.push(field(skip, &quoted(&names[skip]), ":"));
        rows.push(join(unknown));
    }
    // Short messages: the expected key within 16 bytes of the end.
    let mut short = encoder(
        &[("a", "UInt8"), ("bb", "String")],
        MappingOptions::default(),
    );
    let mut short_rows = vec![];
    for row in [
        r#"{"a":1,"bb":"x"}"#,
        r#"{"a":1,"bb":""}"#,
        r#"{"a":1,"bb" :"x"}"#,
        r#"{"a":1}"#,
        r#"{"bb":"x","a":1}"#,
        r#"{"a":1,"b":"x"}"#,
        r#"{"a":1,"bb":"x"} "#,
    ] {
        short_rows.push(row.to_owned());
    }
    // Malformed near a key: the scanner's messages as they were before the
    // key-and-colon comparison (the serde reader words them its own way).
    for (json, kind, reason) in [
        (
            r#"{"a":1,"bb"}"#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `:` at byte 11",
        ),
        (
            r#"{"a":1,"bb":}"#,
            RecordErrorKind::Decode,
            "not one JSON object: expected a value at byte 12",
        ),
        (
            r#"{"a":1,"bb""#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `:` at byte 11",
        ),
        (
            r#"{"a":1,"bb"#,
            RecordErrorKind::Decode,
            "not one JSON object: unterminated string at byte 10",
        ),
        (
            r#"{"a":1,"bb":"x""#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `,` or `}` at byte 15",
        ),
        (
            r#"{"a""#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `:` at byte 4",
        ),
        (
            r#"{"a":"#,
            RecordErrorKind::Decode,
            "not one JSON object: unexpected end at byte 5",
        ),
        (
            r#"{"a"1}"#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `:` at byte 4",
        ),
        (
            r#"{"a" 1}"#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `:` at byte 5",
        ),
        (
            r#"{"a":1,"bb":"x"}x"#,
            RecordErrorKind::Decode,
            "not one JSON object: unexpected text after the object at byte 16",
        ),
        (
            r#"{"a":1,"bb" }"#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `:` at byte 12",
        ),
        (
            r#"{"a":1,"bb"  "#,
            RecordErrorKind::Decode,
            "not one JSON object: expected `:` at byte 13",
        ),
    ] {
        let e = short
            .encode_json(json.as_bytes(), &mut Vec::new())
            .unwrap_err();
        assert_eq!((e.kind, e.reason.as_str()), (kind, reason), "{json}");
        let e = short
            .encode_json_serde(json.as_bytes(), &mut Vec::new())
            .unwrap_err();
        assert_eq!(e.kind, kind, "{json}");
    }
    for json in &rows {
        agrees_with_serde(&mut enc, json, &[7]);
    }
    for json in &short_rows {
        agrees_with_serde(&mut short, json, &[]);
    }
    // And the in-order row decodes to its values.
    let got = row(&mut enc, &all(":")).unwrap();
    for (k, v) in got.iter().enumerate() {
        let want = if k % 2 == 0 {
            int(k as i128)
        } else {
            s(&format!("v{k}"))
        };
        assert_eq!(*v, want, "{}", names[k]);
    }
}

/// The flights row and a nested, flattened, Array and long-key row, each
/// with every one-byte edit (a byte cut, replaced, or one of the JSON
/// punctuation and whitespace bytes inserted anywhere).
fn edited_rows() -> Vec<(JsonRowEncoder, Vec<Vec<u8>>)> {
    let opts = || MappingOptions {
        time: TimeRules {
            formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    let sets: Vec<(JsonRowEncoder, Vec<&str>)> = vec![
        (
            encoder(
                &[
                    ("id", "UInt64"),
                    ("date", "DateTime"),
                    ("delay", "Int32"),
                    ("distance", "UInt32"),
                    ("origin", "String"),
                    ("destination", "String"),
                ],
                opts(),
            ),
            vec![
                r#"{"id":12,"date":"2001/01/01 00:47","delay":-66,"distance":1750,"origin":"DTW","destination":"LAS"}"#,
                r#"{"id":12,"date":"2001/01/01 00:47","delay":6,"distance":1,"origin":"D\"W","destination":"a longer destination"}"#,
                r#"{ "id" : 1 , "date":"2001-01-01T00:47:00Z","delay":null,"distance":"17","origin":"","destination":"L"}"#,
            ],
        ),
        (
            encoder(
                &[
                    ("a", "UInt8"),
                    ("p_x", "Nullable(Int16)"),
                    ("p_y", "String"),
                    ("q", "Array(String)"),
                    ("averyveryverylongkey", "String"),
                ],
                MappingOptions {
                    flatten_join: Some("_".into()),
                    ..opts()
                },
            ),
            vec![
                r#"{"a":1,"p":{"x":2,"y":"z"},"q":["x","y"],"averyveryverylongkey":"v"}"#,
                r#"{"a":1,"p_x":3,"p_y":"s","q":[],"averyveryverylongkey":"v"}"#,
            ],
        ),
    ];
    sets.into_iter()
        .map(|(enc, rows)| {
            let mut variants = Vec::new();
            for row in rows {
                let b = row.as_bytes();
                variants.push(b.to_vec());
                for i in 0..=b.len() {
                    if i < b.len() {
                        let mut v = b.to_vec();
                        v.remove(i);
                        variants.push(v);
                    }
                    for ins in b" x},\"\\0:\n{]" {
                        let mut v = b.to_vec();
                        v.insert(i, *ins);
                        variants.push(v);
                        if i < b.len() {
                            let mut v = b.to_vec();
                            v[i] = *ins;
                            variants.push(v);
                        }
                    }
                }
            }
            (enc, variants)
        })
        .collect()
}

/// The scanner's in-order loop (fields in key order, compact) hands over
/// to the general loop wherever a row stops being one, and reads as the
/// serde reference does: every one-byte edit of in-order rows (whitespace,
/// punctuation, cut keys, broken values) gets the same bytes or the same
/// error kind (and, for a refused value, column and reason).
#[test]
fn in_order_rows_with_any_one_byte_edit_read_as_serde_does() {
    let mut checked = 0;
    for (mut enc, variants) in edited_rows() {
        for json in variants {
            let (mut fast, mut slow) = (vec![9], vec![9]);
            let a = enc.encode_json(&json, &mut fast);
            let b = enc.encode_json_serde(&json, &mut slow);
            let text = String::from_utf8_lossy(&json);
            match (&a, &b) {
                (Ok(()), Ok(())) => assert_eq!(fast, slow, "{text}"),
                (Err(x), Err(y)) if x.kind == RecordErrorKind::Encode => {
                    assert_eq!(
                        (x.kind, &x.column, &x.reason),
                        (y.kind, &y.column, &y.reason),
                        "{text}"
                    );
                }
                // The two readers word bad JSON differently (and the
                // scanner checks the grammar before reporting a refusal).
                (Err(x), Err(_)) => {
                    assert_eq!(x.kind, RecordErrorKind::Decode, "{text}");
                    assert!(
                        serde_json::from_slice::<serde::de::IgnoredAny>(&json).is_err(),
                        "{text}"
                    );
                }
                _ => panic!("scanner {a:?} but serde {b:?} on {text}"),
            }
            checked += 1;
        }
    }
    assert!(checked > 10_000, "{checked}");
}

/// Columns as a table plan would give them: `(name, type, missing rule)`.
fn planned(cols: &[(&str, &str, MissingValue)]) -> Vec<ColumnSpec> {
    cols.iter()
        .map(|(n, ty, m)| ColumnSpec {
            name: (*n).into(),
            ty: t(ty),
            path: None,
            meta: None,
            missing: m.clone(),
            options: ColumnOptions::default(),
        })
        .collect()
}

/// Issue 19 item 5: the epoch unit is configurable globally and per column,
/// and the auto rule is the documented one.
#[test]
fn epoch_units_global_and_per_column() {
    let rules = |unit| MappingOptions {
        time: TimeRules {
            epoch_unit: unit,
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    // 86400000 ms is 1970-01-02; auto reads it as seconds (below 1e11).
    let mut auto = encoder(&[("c", "DateTime")], MappingOptions::default());
    assert_eq!(
        row(&mut auto, r#"{"c":86400000}"#).unwrap(),
        [Value::DateTime(86_400_000)]
    );
    let mut ms = encoder(&[("c", "DateTime")], rules(EpochUnit::Millis));
    assert_eq!(
        row(&mut ms, r#"{"c":86400000}"#).unwrap(),
        [Value::DateTime(86_400)]
    );
    assert_eq!(
        row(&mut ms, r#"{"c":"86400000"}"#).unwrap(),
        [Value::DateTime(86_400)],
        "a numeric string is an epoch too"
    );
    for (unit, n, secs) in [
        (EpochUnit::Seconds, "86400", 86_400),
        (EpochUnit::Micros, "86400000000", 86_400),
        (EpochUnit::Nanos, "86400000000000", 86_400),
    ] {
        let mut enc = encoder(&[("c", "DateTime")], rules(unit));
        assert_eq!(
            row(&mut enc, &format!(r#"{{"c":{n}}}"#)).unwrap(),
            [Value::DateTime(secs)],
            "{unit:?}"
        );
    }
    // The auto boundaries, exactly: just below one, the number reads in
    // the coarser unit (year 5138, outside DateTime64: refused); at it, in
    // the finer one (1973-03-03).
    for (n, ticks) in [
        ("99999999999", None),
        ("100000000000", Some(100_000_000_000i64)),
        ("99999999999999", None),
        ("100000000000000", Some(100_000_000_000)),
        ("99999999999999999", None),
        ("100000000000000000", Some(100_000_000_000)),
        ("-100000000000", Some(-100_000_000_000)),
        ("-99999999999", None),
        ("-99999999999.9", None),
        ("1e11", Some(100_000_000_000)),
    ] {
        let got = one(&[("c", "DateTime64(3)")], &format!(r#"{{"c":{n}}}"#));
        match (got, ticks) {
            (Ok(v), Some(t)) => assert_eq!(v, Value::DateTime64(t), "{n}"),
            (Err(e), None) => assert!(e.reason.contains("range"), "{n}: {e}"),
            (got, _) => panic!("{n}: {got:?}"),
        }
    }
    // Per column: `b` reads milliseconds, `a` keeps the global seconds.
    let mut specs = simple_columns([("a", t("DateTime")), ("b", t("DateTime"))]);
    specs[1].options.epoch_unit = Some(EpochUnit::Millis);
    let mut enc = JsonRowEncoder::new(specs, rules(EpochUnit::Seconds)).unwrap();
    assert_eq!(
        row(&mut enc, r#"{"a":86400,"b":86400000}"#).unwrap(),
        [Value::DateTime(86_400), Value::DateTime(86_400)]
    );
    agrees_with_serde(&mut enc, r#"{"a":86400,"b":86400000}"#, b"");
    agrees_with_serde(&mut enc, r#"{"b":"86400000","a":"86400"}"#, b"");
}

/// Issue 19 item 5: fractional epochs drop digits toward zero (ClickHouse:
/// -1.2345 into DateTime64(3) is 1969-12-31 23:59:58.766), and values
/// outside DateTime64's 1900..2299 or DateTime's 1970..2106 are refused.
#[test]
fn epochs_truncate_toward_zero_and_ranges_are_enforced() {
    assert_eq!(ok("DateTime64(3)", "-1.2345"), Value::DateTime64(-1234));
    assert_eq!(ok("DateTime64(3)", "\"-1.2345\""), Value::DateTime64(-1234));
    assert_eq!(ok("DateTime64(3)", "1.2345"), Value::DateTime64(1234));
    assert_eq!(ok("DateTime64(1)", "-0.05"), Value::DateTime64(0));
    assert_eq!(ok("DateTime", "1.9"), Value::DateTime(1));
    // Text still cuts the written digits (the fraction is of a floored
    // second): 23:59:59.9995 is -0.0005 s, at precision 3 -1 tick.
    assert_eq!(
        ok("DateTime64(3)", "\"1969-12-31T23:59:59.9995Z\""),
        Value::DateTime64(-1)
    );
    // DateTime64's range, by number and by text, both paths.
    let lo = -2_208_988_800i64;
    let hi = 10_413_791_999i64;
    assert_eq!(ok("DateTime64(0)", &lo.to_string()), Value::DateTime64(lo));
    assert_eq!(
        ok("DateTime64(3)", &format!("{hi}.999")),
        Value::DateTime64(hi * 1000 + 999)
    );
    for (ty, v) in [
        ("DateTime64(0)", (lo - 1).to_string()),
        ("DateTime64(3)", format!("{}", hi + 1)),
        ("DateTime64(3)", "\"1899-12-31T23:59:59Z\"".into()),
        ("DateTime64(3)", "\"1899-12-31 23:59:59.999\"".into()),
        ("DateTime64(6)", "\"2300-01-01T00:00:00Z\"".into()),
        ("Nullable(DateTime64(3))", "\"2300-01-01 00:00:00\"".into()),
        ("DateTime64(9)", "\"2262-04-12T00:00:00Z\"".into()),
        ("DateTime", "4294967296".into()),
        ("DateTime", "\"1969-12-31T23:59:59Z\"".into()),
        ("DateTime", "\"2106-02-07 06:28:16\"".into()),
    ] {
        let e = err(ty, &v);
        assert!(e.reason.contains("range"), "{ty} <- {v}: {e}");
        let mut enc = encoder(&[("c", ty)], MappingOptions::default());
        agrees_with_serde(&mut enc, &format!(r#"{{"c":{v}}}"#), b"");
    }
    assert_eq!(
        ok("DateTime64(3)", "\"1900-01-01T00:00:00Z\""),
        Value::DateTime64(lo * 1000)
    );
    assert_eq!(
        ok("DateTime64(3)", "\"2299-12-31 23:59:59.999\""),
        Value::DateTime64(hi * 1000 + 999)
    );
    assert_eq!(
        ok("DateTime", "\"2106-02-07 06:28:15\""),
        Value::DateTime(4_294_967_295)
    );
}

/// Issue 19 item 6: `empty_as_null`, global and per column; the fast path
/// and the serde reader agree.
#[test]
fn empty_strings_as_null() {
    let on = MappingOptions {
        empty_as_null: true,
        ..MappingOptions::default()
    };
    let cols = [
        ("n", "Nullable(String)", MissingValue::Null),
        ("lc", "LowCardinality(Nullable(String))", MissingValue::Null),
        ("d", "String", MissingValue::Literal("'dflt'".into())),
        ("plain", "String", MissingValue::Reject),
        ("num", "Nullable(UInt32)", MissingValue::Null),
        ("arr", "Array(Nullable(String))", MissingValue::Reject),
    ];
    let mut enc = JsonRowEncoder::new(planned(&cols), on.clone()).unwrap();
    let json = r#"{"n":"","lc":"","d":"","plain":"","num":"","arr":[""]}"#;
    assert_eq!(
        row(&mut enc, json).unwrap(),
        [
            Value::Null,
            Value::Null,
            s("dflt"),
            s(""),
            Value::Null,
            Value::Array(vec![s("")]),
        ],
        "\"\" is missing only where NULL or a DEFAULT applies, never inside arrays"
    );
    for json in [
        json,
        r#"{"n":"x","lc":"y","d":"z","plain":"p","num":"5","arr":[]}"#,
        r#"{"n":" ","lc":"\"\"","d":"\u0000","plain":"","num":null,"arr":null}"#,
        r#"{"arr":[],"num":"","plain":"","d":"","lc":"","n":""}"#,
        r#"{"n":"" ,"lc": "", "d" :"","plain":"","num":"","arr":[""]}"#,
    ] {
        agrees_with_serde(&mut enc, json, b"");
    }
    // Off (the default): "" stays a value, and a number column refuses it.
    let mut off = JsonRowEncoder::new(planned(&cols), MappingOptions::default()).unwrap();
    let e = row(&mut off, json).unwrap_err();
    assert_eq!(e.column.as_deref(), Some("num"), "{e}");
    assert_eq!(
        row(
            &mut off,
            r#"{"n":"","lc":"","d":"","plain":"","num":1,"arr":[]}"#
        )
        .unwrap(),
        [s(""), s(""), s(""), s(""), int(1), Value::Array(vec![])]
    );
    // Per column, overriding the global setting both ways.
    let mut specs = planned(&cols[..2]);
    specs[0].options.empty_as_null = Some(true);
    let mut enc = JsonRowEncoder::new(specs.clone(), MappingOptions::default()).unwrap();
    assert_eq!(
        row(&mut enc, r#"{"n":"","lc":""}"#).unwrap(),
        [Value::Null, s("")]
    );
    specs[0].options.empty_as_null = Some(false);
    specs[1].options.empty_as_null = None;
    let mut enc = JsonRowEncoder::new(specs, on).unwrap();
    assert_eq!(
        row(&mut enc, r#"{"n":"","lc":""}"#).unwrap(),
        [s(""), Value::Null]
    );
}

/// Issue 19 item 2: a per-row DEFAULT left to the server is sent as
/// RowBinaryWithDefaults: a 0x00 marker before each value, 0x01 alone for
/// a missing field (the documented layout:
/// <https://clickhouse.com/docs/interfaces/formats/RowBinaryWithDefaults>).
#[test]
fn server_defaults_write_a_marker_before_every_cell() {
    let cols = [
        ("id", "UInt32", MissingValue::Reject),
        ("at", "DateTime", MissingValue::ServerDefault),
        ("k", "UInt8", MissingValue::Literal("7".into())),
        ("n", "Nullable(UInt8)", MissingValue::ServerDefault),
    ];
    let mut enc = JsonRowEncoder::new(planned(&cols), MappingOptions::default()).unwrap();
    assert!(enc.with_defaults());
    let mut buf = Vec::new();
    enc.encode_json(br#"{"id":1,"at":5,"k":2,"n":3}"#, &mut buf)
        .unwrap();
    assert_eq!(buf, [0, 1, 0, 0, 0, 0, 5, 0, 0, 0, 0, 2, 0, 0, 3]);
    buf.clear();
    enc.encode_json(br#"{"id":1}"#, &mut buf).unwrap();
    assert_eq!(
        buf,
        [0, 1, 0, 0, 0, 1, 0, 7, 1],
        "missing: markers and the constant"
    );
    buf.clear();
    enc.encode_json(br#"{"n":null,"id":2,"at":null}"#, &mut buf)
        .unwrap();
    assert_eq!(
        buf,
        [0, 2, 0, 0, 0, 1, 0, 7, 0, 1],
        "null into non-Nullable is missing; into Nullable it is NULL"
    );
    for json in [
        r#"{"id":1,"at":5,"k":2,"n":3}"#,
        r#"{"id":1}"#,
        r#"{"n":null,"id":2,"at":null}"#,
        r#"{"at":"2020-01-01 00:00:00","id":1,"id":3}"#,
        r#"{"at":5}"#,
    ] {
        agrees_with_serde(&mut enc, json, b"\x09");
    }
    let e = enc.encode_json(br#"{"at":5}"#, &mut buf).unwrap_err();
    assert_eq!(e.column.as_deref(), Some("id"));
    // Without a ServerDefault column, plain RowBinary.
    let enc = JsonRowEncoder::new(planned(&cols[..1]), MappingOptions::default()).unwrap();
    assert!(!enc.with_defaults());
}

/// A per-row DEFAULT the server cannot apply is a record error naming the
/// column, also for a Nullable column (NULL is not its DEFAULT).
#[test]
fn refused_per_row_defaults_name_the_column() {
    let cols = [
        ("id", "UInt32", MissingValue::Reject),
        ("n", "Nullable(DateTime)", MissingValue::Reject),
    ];
    let mut enc = JsonRowEncoder::new(planned(&cols), MappingOptions::default()).unwrap();
    let e = row(&mut enc, r#"{"id":1}"#).unwrap_err();
    assert_eq!(e.column.as_deref(), Some("n"));
    assert!(e.reason.contains("per row"), "{e}");
    assert_eq!(
        row(&mut enc, r#"{"id":1,"n":null}"#).unwrap(),
        [int(1), Value::Null]
    );
}

/// The JSON-to-type conversions listed in engine/spate/README.md
/// ("JSON to column conversions"), one assertion per table row, so the
/// table cannot drift from the code.
#[test]
fn conversion_table_of_the_readme() {
    let i = |v| int(v);
    // Numbers into integer columns: exact values only.
    for (ty, v, want) in [
        ("Int32", "\"5\"", 5),
        ("Int32", "\"+5\"", 5),
        ("Int32", "\"007\"", 7),
        ("Int32", "1e3", 1000),
        ("Int32", "\"1e3\"", 1000),
        ("Int32", "1.0", 1),
        ("UInt8", "-0", 0),
    ] {
        assert_eq!(ok(ty, v), i(want), "{ty} <- {v}");
    }
    for (ty, v, reason) in [
        ("Int32", "1.5", "not an integer"),
        ("UInt8", "300", "out of range"),
        ("UInt64", "18446744073709551616", "out of range"),
        ("Int32", "\" 5\"", "not a number"),
        ("Int32", "\"0x10\"", "not a number"),
        ("Int32", "\"\"", "not a number"),
        ("Int32", "true", "cannot put a bool"),
        ("UInt8", "\"true\"", "not a number"),
    ] {
        assert!(err(ty, v).reason.contains(reason), "{ty} <- {v}");
    }
    // Floats and decimals.
    assert_eq!(ok("Float64", "\"+1.5\""), Value::Float64(1.5));
    assert_eq!(ok("Float64", "\"1e3\""), Value::Float64(1000.0));
    assert!(err("Float64", "1e400").reason.contains("out of range"));
    assert!(err("Float32", "1e39").reason.contains("out of range"));
    assert!(err("Float64", "true").reason.contains("cannot put a bool"));
    assert_eq!(
        ok("Decimal(9,2)", "\"1.5e1\""),
        Value::Decimal(Wide::from_i128(1500))
    );
    assert!(err("Decimal(9,2)", "1.005").reason.contains("truncated"));
    // Strings take any scalar as its JSON text, composites as raw JSON.
    assert_eq!(ok("String", "true"), s("true"));
    assert_eq!(ok("String", "1.50"), s("1.50"));
    assert_eq!(ok("String", "-0.0"), s("-0.0"));
    assert_eq!(ok("String", r#"{"a": 1}"#), s(r#"{"a": 1}"#));
    assert_eq!(ok("String", "[1, 2]"), s("[1, 2]"));
    assert_eq!(ok("LowCardinality(String)", "5"), s("5"));
    assert_eq!(ok("FixedString(2)", "12"), s("12"));
    // Bools.
    assert_eq!(ok("Bool", "\"true\""), Value::Bool(true));
    assert!(err("Bool", "\"True\"").reason.contains("not a bool"));
    // Dates and times.
    assert_eq!(
        ok("Date", "\"2020-01-02T23:30:00-05:00\""),
        Value::Date(days_from_civil(2020, 1, 2)),
        "a date-time's written date, not its UTC date"
    );
    assert!(err("Date", "20200102").reason.contains("date text"));
    assert_eq!(
        ok("DateTime", "\"2020-01-02\""),
        Value::DateTime(1_577_923_200)
    );
    assert_eq!(
        ok("DateTime", "\"2020-01-02T10:00:00.5+01:00\""),
        Value::DateTime(1_577_955_600)
    );
    assert_eq!(ok("DateTime", "1e9"), Value::DateTime(1_000_000_000));
    assert_eq!(ok("DateTime", "\"1.5e9\""), Value::DateTime(1_500_000_000));
    assert!(err("DateTime", "true").reason.contains("cannot put a bool"));
    // Enums, IPs: numbers only as JSON numbers.
    assert_eq!(ok("Enum8('a' = 1)", "1"), Value::Enum(1));
    assert!(
        err("Enum8('a' = 1)", "\"1\"")
            .reason
            .contains("not a value")
    );
    assert_eq!(
        ok("IPv4", "167772161"),
        Value::Ipv4(Ipv4Addr::new(10, 0, 0, 1))
    );
    assert!(err("IPv4", "\"167772161\"").reason.contains("not an IPv4"));
    // Composites: JSON arrays and objects only, never their text.
    assert!(
        err("Array(UInt8)", "\"[1]\"")
            .reason
            .contains("cannot put a string")
    );
    assert_eq!(
        ok("Array(String)", "[1, true]"),
        Value::Array(vec![s("1"), s("true")])
    );
    assert_eq!(
        ok("Map(String, UInt8)", r#"{"a":"1"}"#),
        Value::Map(vec![(s("a"), i(1))])
    );
    assert!(
        err("Tuple(UInt8, String)", r#"{"a":1}"#)
            .reason
            .contains("no names")
    );
    // Null and missing; repeated keys: the last one wins, null included.
    assert_eq!(ok("Nullable(String)", "null"), Value::Null);
    let cols = [("n", "Nullable(UInt8)", MissingValue::Literal("5".into()))];
    let mut enc = JsonRowEncoder::new(planned(&cols), MappingOptions::default()).unwrap();
    assert_eq!(row(&mut enc, "{}").unwrap(), [i(5)], "missing: the DEFAULT");
    assert_eq!(
        row(&mut enc, r#"{"n":null}"#).unwrap(),
        [Value::Null],
        "null into a Nullable column with a DEFAULT: NULL"
    );
    assert!(err("String", "null").reason.contains("missing or null"));
    assert_eq!(one(&[("c", "UInt8")], r#"{"c":1,"c":2}"#).unwrap(), i(2));
    assert!(one(&[("c", "UInt8")], r#"{"c":1,"c":null}"#).is_err());
    assert_eq!(
        one(&[("c", "Nullable(UInt8)")], r#"{"c":1,"c":null}"#).unwrap(),
        Value::Null
    );
}

/// A JSON column takes an object as its text (the server parses it, with
/// input_format_binary_read_json_as_string); a string, a number, an array
/// or a null would fail the whole insert there, so each is this record's
/// error naming the column.
#[test]
fn json_columns_take_objects_as_text_only() {
    assert_eq!(
        ok("JSON", r#"{"a": 1, "b": {"c": [1, "x"]}}"#),
        s(r#"{"a": 1, "b": {"c": [1, "x"]}}"#)
    );
    assert_eq!(ok("JSON(a UInt8)", "{}"), s("{}"));
    for bad in [r#""{}""#, "1", "[1, 2]", "true"] {
        let e = err("JSON", bad);
        assert!(e.reason.contains("not a JSON object"), "{bad}: {e}");
    }
    err("JSON", "null");
}

/// `mapping.defaults` on a Nullable column coalesces: a null (and, with
/// empty_as_null, a `""`) takes the literal as a missing field does; the
/// serde reference reader agrees byte for byte. Without the flag a null
/// stays NULL.
#[test]
fn null_as_missing_coalesces_a_nullable_column_to_its_literal() {
    for empty_as_null in [false, true] {
        let mut specs = simple_columns([
            ("q", t("Nullable(Int32)")),
            ("r", t("LowCardinality(Nullable(String))")),
        ]);
        for (c, lit) in specs.iter_mut().zip(["-1", "'unknown'"]) {
            c.missing = MissingValue::Literal(lit.into());
            c.options.null_as_missing = true;
        }
        let options = MappingOptions {
            empty_as_null,
            ..MappingOptions::default()
        };
        let mut enc = JsonRowEncoder::new(specs.clone(), options.clone()).unwrap();
        let unknown = s("unknown");
        let minus1 = int(-1);
        let empty_r = if empty_as_null {
            unknown.clone()
        } else {
            s("")
        };
        for (json, want) in [
            (
                r#"{"q":null,"r":null}"#,
                vec![minus1.clone(), unknown.clone()],
            ),
            (r#"{}"#, vec![minus1.clone(), unknown.clone()]),
            (r#"{"r":"","q":7}"#, vec![int(7), empty_r.clone()]),
            (r#"{"q":null,"r":"eu"}"#, vec![minus1.clone(), s("eu")]),
        ] {
            assert_eq!(row(&mut enc, json).unwrap(), want, "{json}");
            let (mut a, mut b) = (Vec::new(), Vec::new());
            enc.encode_json(json.as_bytes(), &mut a).unwrap();
            enc.encode_json_serde(json.as_bytes(), &mut b).unwrap();
            assert_eq!(a, b, "scanner and serde reader agree on {json}");
        }
        for c in &mut specs {
            c.options.null_as_missing = false;
        }
        let mut plain = JsonRowEncoder::new(specs, options).unwrap();
        assert_eq!(
            row(&mut plain, r#"{"q":null,"r":null}"#).unwrap(),
            vec![Value::Null, Value::Null]
        );
    }
}

// A row filter (spate_row::filter) over the JSON mapper's rows.
/// The wrapper drops exactly the rows its filter refuses, through the
/// Encoder::keep hook the terminal asks, and keeps all without one.
#[test]
fn filtered_encoder_keeps_only_matching_rows() {
    use spate_core::pipeline::chain::Encoder;
    let cols = simple_columns([("unit", t("String")), ("value", t("Float64"))]);
    let enc = JsonRowEncoder::new(cols.clone(), MappingOptions::default()).unwrap();
    let expr = spate_row::filter::FilterExpr::All(vec![
        spate_row::filter::FilterExpr::parse_predicate("unit != \"drop\"").unwrap(),
        spate_row::filter::FilterExpr::parse_predicate("value >= 0").unwrap(),
    ]);
    let mut f =
        spate_row::filter::Filtered::new(enc, Some(expr), spate_row::coerce::TimeRules::default())
            .unwrap();
    let mut plain = spate_row::filter::Filtered::new(
        JsonRowEncoder::new(cols, MappingOptions::default()).unwrap(),
        None,
        spate_row::coerce::TimeRules::default(),
    )
    .unwrap();
    for (json, want) in [
        (&br#"{"unit":"C","value":1.5}"#[..], true),
        (br#"{"unit":"drop","value":1.5}"#, false),
        (br#"{"value":-0.25,"unit":"C"}"#, false),
        (br#"{"value":0,"unit":"hPa"}"#, true),
    ] {
        let mut buf = Vec::new();
        f.inner().encode_json(json, &mut buf).unwrap();
        assert_eq!(f.keep(&buf), want, "{}", String::from_utf8_lossy(json));
        assert!(plain.keep(&buf));
    }
    let _ = spate_row::spec::ColumnOptions::default();
}

mod meta;
