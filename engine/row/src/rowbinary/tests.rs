//! Byte-exact checks against the documented RowBinary layout (module docs of
//! `rowbinary`), and a proptest round trip: random rows of random schemas
//! encode and decode back equal.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::decode::decode;
use super::*;
use crate::types::TupleElement;

fn ty(s: &str) -> ChType {
    ChType::parse(s).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn enc(t: &str, v: Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&ty(t), &v, &mut out).unwrap_or_else(|e| panic!("{t}: {e}"));
    let mut rest = out.as_slice();
    let back = decode(&ty(t), &mut rest).unwrap();
    assert!(rest.is_empty(), "{t}: decode left bytes");
    assert_eq!(back, v, "{t}: decode(encode(v)) != v");
    out
}

fn int(v: i128) -> Value {
    Value::Int(Wide::from_i128(v))
}

#[test]
fn leb128_lengths() {
    let mut out = Vec::new();
    for (v, h) in [
        (0u64, "00"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (16_384, "808001"),
    ] {
        out.clear();
        put_leb128(&mut out, v);
        assert_eq!(out, hex(h), "{v}");
    }
    let long = vec![b'x'; 128];
    assert_eq!(enc("String", Value::String(long.clone()))[..2], hex("8001"));
}

#[test]
fn integers_little_endian_twos_complement() {
    assert_eq!(enc("UInt8", int(255)), hex("ff"));
    assert_eq!(enc("Int8", int(-1)), hex("ff"));
    assert_eq!(enc("Int16", int(-2)), hex("feff"));
    assert_eq!(enc("UInt32", int(1)), hex("01000000"));
    assert_eq!(
        enc("Int64", int(i128::from(i64::MIN))),
        hex("0000000000000080")
    );
    assert_eq!(
        enc("UInt64", int(i128::from(u64::MAX))),
        hex("ffffffffffffffff")
    );
    assert_eq!(
        enc("Int128", int(-2)),
        hex(&format!("fe{}", "ff".repeat(15)))
    );
    assert_eq!(
        enc("UInt256", int(1)),
        hex(&format!("01{}", "00".repeat(31)))
    );
    assert_eq!(enc("Int256", int(-1)), hex(&"ff".repeat(32)));
    let mut out = Vec::new();
    assert!(matches!(
        encode(&ty("UInt8"), &int(256), &mut out),
        Err(EncodeError::OutOfRange { .. })
    ));
    assert!(encode(&ty("UInt64"), &int(-1), &mut out).is_err());
    assert!(encode(&ty("Int8"), &int(-129), &mut out).is_err());
}

#[test]
fn floats_bools_strings() {
    assert_eq!(enc("Float64", Value::Float64(1.0)), hex("000000000000f03f"));
    assert_eq!(
        enc("Float64", Value::Float64(-0.5)),
        hex("000000000000e0bf")
    );
    assert_eq!(
        enc("Float32", Value::Float32(f32::INFINITY)),
        hex("0000807f")
    );
    assert_eq!(enc("Bool", Value::Bool(true)), hex("01"));
    assert_eq!(enc("String", Value::String(b"hi".to_vec())), hex("026869"));
    assert_eq!(enc("String", Value::String(Vec::new())), hex("00"));
    let mut out = Vec::new();
    encode(
        &ty("FixedString(4)"),
        &Value::String(b"ab".to_vec()),
        &mut out,
    )
    .unwrap();
    assert_eq!(out, hex("61620000"));
    assert!(
        encode(
            &ty("FixedString(1)"),
            &Value::String(b"ab".to_vec()),
            &mut out
        )
        .is_err()
    );
}

#[test]
fn dates_and_times() {
    assert_eq!(enc("Date", Value::Date(11_017)), hex("092b"));
    assert_eq!(enc("Date32", Value::Date(-25_567)), hex("219cffff"));
    assert_eq!(
        enc("DateTime", Value::DateTime(1_517_966_773)),
        hex("b5557a5a")
    );
    assert_eq!(
        enc("DateTime('UTC')", Value::DateTime(1_517_966_773)),
        hex("b5557a5a")
    );
    assert_eq!(
        enc("DateTime64(3, 'UTC')", Value::DateTime64(1_517_966_773_840)),
        hex("50cede6d61010000")
    );
    let mut out = Vec::new();
    assert!(encode(&ty("Date"), &Value::Date(-1), &mut out).is_err());
    assert!(encode(&ty("Date"), &Value::Date(65_536), &mut out).is_err());
    assert!(encode(&ty("DateTime"), &Value::DateTime(-1), &mut out).is_err());
    assert!(encode(&ty("DateTime"), &Value::DateTime(1 << 32), &mut out).is_err());
}

#[test]
fn uuid_is_two_little_endian_halves() {
    // 61f0c404-5cb3-11e7-907b-a6006ad3dba0: high half 0x61f0c4045cb311e7 and
    // low half 0x907ba6006ad3dba0, each written little-endian.
    let u = 0x61f0_c404_5cb3_11e7_907b_a600_6ad3_dba0u128;
    assert_eq!(
        enc("UUID", Value::Uuid(u)),
        hex("e711b35c04c4f061 a0dbd36a00a67b90")
    );
}

#[test]
fn ip_addresses() {
    assert_eq!(
        enc("IPv4", Value::Ipv4(Ipv4Addr::new(1, 2, 3, 4))),
        hex("04030201")
    );
    assert_eq!(
        enc(
            "IPv6",
            Value::Ipv6("2001:db8::1".parse::<Ipv6Addr>().unwrap())
        ),
        hex("20010db8000000000000000000000001")
    );
}

#[test]
fn decimals_are_scaled_integers() {
    assert_eq!(
        enc(
            "Decimal(18, 4)",
            Value::Decimal(Wide::from_i128(123_456_789))
        ),
        hex("15cd5b0700000000")
    );
    assert_eq!(
        enc("Decimal(9, 2)", Value::Decimal(Wide::from_i128(-100))),
        hex("9cffffff")
    );
    assert_eq!(
        enc("Decimal128(2)", Value::Decimal(Wide::from_i128(1))).len(),
        16
    );
    assert_eq!(
        enc("Decimal(76, 10)", Value::Decimal(Wide::from_i128(1))).len(),
        32
    );
    let mut out = Vec::new();
    // Decimal(9, 2) holds at most 9 digits: 9999999.99.
    assert!(
        encode(
            &ty("Decimal(9, 2)"),
            &Value::Decimal(Wide::from_i128(1_000_000_000)),
            &mut out
        )
        .is_err()
    );
    assert!(
        encode(
            &ty("Decimal(9, 2)"),
            &Value::Decimal(Wide::from_i128(-999_999_999)),
            &mut out
        )
        .is_ok()
    );
}

#[test]
fn enums_nullables_and_containers() {
    assert_eq!(enc("Enum8('a' = 1, 'b' = -2)", Value::Enum(-2)), hex("fe"));
    assert_eq!(enc("Enum16('a' = 1000)", Value::Enum(1000)), hex("e803"));
    let mut out = Vec::new();
    assert!(encode(&ty("Enum8('a' = 1)"), &Value::Enum(2), &mut out).is_err());

    assert_eq!(enc("Nullable(UInt8)", Value::Null), hex("01"));
    assert_eq!(enc("Nullable(UInt8)", int(5)), hex("0005"));
    assert!(encode(&ty("UInt8"), &Value::Null, &mut out).is_err());
    assert_eq!(
        enc(
            "Array(Nullable(Float64))",
            Value::Array(vec![Value::Float64(1.0), Value::Null])
        ),
        hex("02 00 000000000000f03f 01")
    );
    assert_eq!(enc("Array(UInt8)", Value::Array(vec![])), hex("00"));
    assert_eq!(
        enc(
            "Map(String, Nullable(UInt8))",
            Value::Map(vec![
                (Value::String(b"k".to_vec()), int(9)),
                (Value::String(b"n".to_vec()), Value::Null)
            ])
        ),
        hex("02 016b 0009 016e 01")
    );
    assert_eq!(
        enc(
            "Tuple(UInt8, String)",
            Value::Tuple(vec![int(1), Value::String(b"a".to_vec())])
        ),
        hex("01 0161")
    );
    assert_eq!(
        enc(
            "LowCardinality(Nullable(String))",
            Value::String(b"hi".to_vec())
        ),
        hex("00 026869")
    );
    assert_eq!(
        enc("LowCardinality(String)", Value::String(b"hi".to_vec())),
        hex("026869")
    );
}

// ---- proptest: random schemas, random rows, encode -> decode -> equal ----

fn leaf_type() -> impl Strategy<Value = ChType> {
    prop_oneof![
        Just(ChType::Int8),
        Just(ChType::Int32),
        Just(ChType::Int128),
        Just(ChType::Int256),
        Just(ChType::UInt16),
        Just(ChType::UInt64),
        Just(ChType::UInt256),
        Just(ChType::Float32),
        Just(ChType::Float64),
        Just(ChType::Bool),
        Just(ChType::String),
        (1usize..8).prop_map(ChType::FixedString),
        Just(ChType::Date),
        Just(ChType::Date32),
        Just(ChType::DateTime(None)),
        (0u8..=9).prop_map(|precision| ChType::DateTime64 {
            precision,
            tz: None
        }),
        Just(ChType::Uuid),
        Just(ChType::Ipv4),
        Just(ChType::Ipv6),
        (1u8..=76).prop_map(|precision| ChType::Decimal {
            precision,
            scale: 0
        }),
        Just(ChType::Enum8(vec![("a".into(), -3), ("b".into(), 7)])),
        Just(ChType::Enum16(vec![("x".into(), 1000)])),
    ]
}

fn type_tree() -> impl Strategy<Value = ChType> {
    leaf_type().prop_recursive(3, 16, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|t| ChType::Nullable(Box::new(t))),
            inner
                .clone()
                .prop_map(|t| ChType::LowCardinality(Box::new(t))),
            inner.clone().prop_map(|t| ChType::Array(Box::new(t))),
            (inner.clone(), inner.clone()).prop_map(|(k, v)| ChType::Map(Box::new(k), Box::new(v))),
            proptest::collection::vec(inner, 1..4).prop_map(|ts| ChType::Tuple(
                ts.into_iter()
                    .map(|ty| TupleElement { name: None, ty })
                    .collect()
            )),
        ]
    })
}

fn wide_in(bits: u32, signed: bool) -> BoxedStrategy<Wide> {
    let bytes = bits as usize / 8;
    proptest::collection::vec(any::<u8>(), bytes)
        .prop_map(move |b| Wide::from_le(&b, signed))
        .boxed()
}

fn value_of(ty: &ChType) -> BoxedStrategy<Value> {
    match ty {
        ChType::Nullable(inner) => prop_oneof![Just(Value::Null), value_of(inner)].boxed(),
        ChType::LowCardinality(inner) => value_of(inner),
        t if int_shape(t).is_some() => {
            let (bits, signed) = int_shape(t).unwrap();
            wide_in(bits, signed).prop_map(Value::Int).boxed()
        }
        ChType::Float32 => any::<f32>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::Float32)
            .boxed(),
        ChType::Float64 => any::<f64>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::Float64)
            .boxed(),
        ChType::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        ChType::String => proptest::collection::vec(any::<u8>(), 0..200)
            .prop_map(Value::String)
            .boxed(),
        ChType::FixedString(n) => proptest::collection::vec(any::<u8>(), *n)
            .prop_map(Value::String)
            .boxed(),
        ChType::Date => (0..=DATE_MAX_DAYS).prop_map(Value::Date).boxed(),
        ChType::Date32 => (DATE32_MIN_DAYS..=DATE32_MAX_DAYS)
            .prop_map(Value::Date)
            .boxed(),
        ChType::DateTime(_) => (0..=i64::from(u32::MAX)).prop_map(Value::DateTime).boxed(),
        ChType::DateTime64 { .. } => any::<i64>().prop_map(Value::DateTime64).boxed(),
        ChType::Uuid => any::<u128>().prop_map(Value::Uuid).boxed(),
        ChType::Ipv4 => any::<u32>()
            .prop_map(|v| Value::Ipv4(Ipv4Addr::from(v)))
            .boxed(),
        ChType::Ipv6 => any::<u128>()
            .prop_map(|v| Value::Ipv6(Ipv6Addr::from(v)))
            .boxed(),
        ChType::Decimal { precision, .. } => {
            let digits = usize::from(*precision);
            (
                any::<bool>(),
                proptest::collection::vec(0u8..10, 1..=digits),
            )
                .prop_map(|(neg, ds)| {
                    let text: String = std::iter::once(if neg { '-' } else { '+' })
                        .chain(ds.iter().map(|d| char::from(b'0' + d)))
                        .collect();
                    let w = crate::num::DecimalText::parse(text.as_bytes())
                        .unwrap()
                        .scaled(0, crate::num::Rounding::Exact)
                        .unwrap();
                    Value::Decimal(w)
                })
                .boxed()
        }
        ChType::Enum8(pairs) => {
            proptest::sample::select(pairs.iter().map(|(_, v)| i16::from(*v)).collect::<Vec<_>>())
                .prop_map(Value::Enum)
                .boxed()
        }
        ChType::Enum16(pairs) => {
            proptest::sample::select(pairs.iter().map(|(_, v)| *v).collect::<Vec<_>>())
                .prop_map(Value::Enum)
                .boxed()
        }
        ChType::Array(inner) => proptest::collection::vec(value_of(inner), 0..4)
            .prop_map(Value::Array)
            .boxed(),
        ChType::Map(k, v) => proptest::collection::vec((value_of(k), value_of(v)), 0..4)
            .prop_map(Value::Map)
            .boxed(),
        ChType::Tuple(elements) => elements
            .iter()
            .map(|e| value_of(&e.ty))
            .collect::<Vec<_>>()
            .prop_map(Value::Tuple)
            .boxed(),
        other => panic!("no strategy for {other}"),
    }
}

fn schema_and_rows() -> impl Strategy<Value = (Vec<ChType>, Vec<Vec<Value>>)> {
    proptest::collection::vec(type_tree(), 1..6).prop_flat_map(|schema| {
        let row = schema.iter().map(value_of).collect::<Vec<_>>();
        (Just(schema), proptest::collection::vec(row, 0..5))
    })
}

proptest! {
    #[test]
    fn random_rows_of_random_schemas_round_trip((schema, rows) in schema_and_rows()) {
        let mut buf = Vec::new();
        for row in &rows {
            for (t, v) in schema.iter().zip(row) {
                encode(t, v, &mut buf).map_err(|e| TestCaseError::fail(format!("{t}: {e}")))?;
            }
        }
        let mut input = buf.as_slice();
        for row in &rows {
            for (t, v) in schema.iter().zip(row) {
                let back = decode(t, &mut input).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&back, v, "type {}", t);
            }
        }
        prop_assert!(input.is_empty());
    }
}

#[test]
fn input_strings_write_as_put_string_at_every_place_and_length() {
    // Inputs shorter and longer than the 16-byte window, strings of every
    // length up to past it and past a one-byte LEB128, at every start.
    for input_len in [0usize, 1, 5, 15, 16, 17, 24, 40, 140, 300] {
        let input: Vec<u8> = (0..input_len).map(|k| (k * 7 + 1) as u8).collect();
        for start in 0..=input_len {
            for end in start..=input_len {
                let mut want = vec![0xee];
                put_string(&mut want, &input[start..end]);
                let mut got = vec![0xee];
                put_input_string(&mut got, &input, start, end);
                assert_eq!(got, want, "{input_len} {start}..{end}");
            }
        }
    }
}

/// Writes `entries` (key, value strings) as a Map(String, String) tail after
/// a one-byte prefix, with their marks, and keeps the last of each key.
fn map_kept(entries: &[(&str, &str)]) -> (Vec<u8>, u64) {
    let mut buf = vec![0xAA];
    let mut marks = Vec::new();
    for (k, v) in entries {
        let at = buf.len();
        put_string(&mut buf, k.as_bytes());
        marks.push((at, buf.len()));
        put_string(&mut buf, v.as_bytes());
    }
    let mut scratch = b"stale".to_vec();
    let kept = keep_last_map_entries(&mut buf, &marks, &mut scratch);
    (buf, kept)
}

#[test]
fn a_repeated_map_key_keeps_its_last_value_at_its_first_place() {
    let (buf, kept) = map_kept(&[("a", "1"), ("b", "2"), ("a", "3"), ("c", "4"), ("a", "")]);
    assert_eq!(kept, 3);
    let mut want = vec![0xAA];
    for (k, v) in [("a", ""), ("b", "2"), ("c", "4")] {
        put_string(&mut want, k.as_bytes());
        put_string(&mut want, v.as_bytes());
    }
    assert_eq!(buf, want);
}

#[test]
fn map_entries_without_a_repeated_key_are_left_as_written() {
    for entries in [
        &[][..],
        &[("a", "1")][..],
        &[("a", "1"), ("ab", "2"), ("b", "a")][..],
    ] {
        let mut want = vec![0xAA];
        for (k, v) in entries {
            put_string(&mut want, k.as_bytes());
            put_string(&mut want, v.as_bytes());
        }
        assert_eq!(map_kept(entries), (want, entries.len() as u64));
    }
}
