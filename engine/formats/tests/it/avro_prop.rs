//! Property tests: the hot-path Avro decoder (`spate_formats::avro`)
//! agrees with apache-avro's own decoding on generated writer schemas and
//! values: every primitive, the logical types (date, timestamp-millis and
//! -micros, decimal, uuid), enums, fixed, unions with null (either branch
//! order), nested records (read by pointer paths, nullable or not),
//! arrays and maps (nested in each other), and fields no column reads.
//!
//! For each case: apache-avro writes the value (the datum), apache-avro
//! reads it back (the reference `Value`), and a reference encoder in this
//! file turns that `Value` into the row's RowBinary through the crate's
//! generic `rowbinary::encode` (independent of the Avro hot path). The hot
//! path's row must be the same bytes (map entries compared in key order,
//! since apache-avro's `Value::Map` is a `HashMap`). Column order is
//! shuffled by a flag, so both the direct and the permuting writer are
//! covered. Every strict prefix of the datum must be a record error, never
//! a panic or a row.

use std::collections::HashMap;
use std::sync::Arc;

use apache_avro::Schema;
use apache_avro::types::Value as AV;
use proptest::prelude::*;
use serde_json::json;

use spate_formats::avro::{AvroMapping, AvroOptions};
use spate_row::num::Wide;
use spate_row::rowbinary::decode::decode;
use spate_row::rowbinary::{Value, encode};
use spate_row::spec::{ColumnOptions, ColumnSpec, MissingValue};
use spate_row::types::ChType;

/// A generated field type: its Avro schema and its column type follow.
#[derive(Clone, Debug)]
enum Kind {
    Bool,
    /// int; into Int64 when `wide`, else Int32.
    Int {
        wide: bool,
    },
    /// long; into Int128 when `wide`, else Int64.
    Long {
        wide: bool,
    },
    /// float; into Float64 when `wide`.
    Float {
        wide: bool,
    },
    Double,
    Bytes,
    Str,
    Fixed(usize),
    /// enum of `n` symbols into String, or Enum8 (`s{i}` = i + 1).
    Enum {
        n: usize,
        enum8: bool,
    },
    Uuid,
    /// date into Date32.
    Date,
    /// timestamp-millis into DateTime64(p).
    Millis {
        p: u8,
    },
    /// timestamp-micros into DateTime64(6).
    Micros,
    /// decimal(p, s) bytes into Decimal(p + up, s + up).
    Decimal {
        p: u8,
        s: u8,
        up: u8,
    },
    /// ["null", T] (or [T, "null"] when `null_second`) into Nullable.
    Nullable {
        inner: Box<Kind>,
        null_second: bool,
    },
    Array(Box<Kind>),
    Map(Box<Kind>),
}

fn scalar() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Bool),
        any::<bool>().prop_map(|wide| Kind::Int { wide }),
        any::<bool>().prop_map(|wide| Kind::Long { wide }),
        any::<bool>().prop_map(|wide| Kind::Float { wide }),
        Just(Kind::Double),
        Just(Kind::Bytes),
        Just(Kind::Str),
        (1usize..6).prop_map(Kind::Fixed),
        (1usize..5, any::<bool>()).prop_map(|(n, enum8)| Kind::Enum { n, enum8 }),
        Just(Kind::Uuid),
        Just(Kind::Date),
        prop_oneof![Just(3u8), Just(6u8)].prop_map(|p| Kind::Millis { p }),
        Just(Kind::Micros),
        (1u8..=18, 0u8..=2)
            .prop_flat_map(|(p, up)| (Just(p), 0..=p, Just(up)))
            .prop_map(|(p, s, up)| Kind::Decimal { p, s, up }),
    ]
}

fn nullable(k: impl Strategy<Value = Kind>) -> impl Strategy<Value = Kind> {
    (k, any::<bool>()).prop_map(|(inner, null_second)| Kind::Nullable {
        inner: Box::new(inner),
        null_second,
    })
}

fn kind() -> impl Strategy<Value = Kind> {
    let leaf = prop_oneof![3 => scalar(), 1 => nullable(scalar())];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|k| Kind::Array(Box::new(k))),
            inner.prop_map(|k| Kind::Map(Box::new(k))),
        ]
    })
}

/// One top-level field: a value field or a nested record whose fields each
/// feed a column by pointer path; `read` false: no column reads it.
#[derive(Clone, Debug)]
enum Field {
    Plain { kind: Kind, read: bool },
    Record { fields: Vec<Kind>, nullable: bool },
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        4 => (kind(), prop::bool::weighted(0.8)).prop_map(|(kind, read)| Field::Plain { kind, read }),
        1 => prop::collection::vec(scalar(), 1..4)
            .prop_map(|fields| Field::Record { fields, nullable: false }),
        1 => prop::collection::vec(scalar(), 1..4)
            .prop_map(|fields| Field::Record { fields, nullable: true }),
    ]
}

fn schema_of(k: &Kind, names: &mut u32) -> serde_json::Value {
    let mut name = || {
        *names += 1;
        format!("N{names}")
    };
    match k {
        Kind::Bool => json!("boolean"),
        Kind::Int { .. } => json!("int"),
        Kind::Long { .. } => json!("long"),
        Kind::Float { .. } => json!("float"),
        Kind::Double => json!("double"),
        Kind::Bytes => json!("bytes"),
        Kind::Str => json!("string"),
        Kind::Fixed(n) => json!({"type": "fixed", "name": name(), "size": n}),
        Kind::Enum { n, .. } => json!({
            "type": "enum", "name": name(),
            "symbols": (0..*n).map(|i| format!("s{i}")).collect::<Vec<_>>()
        }),
        Kind::Uuid => json!({"type": "string", "logicalType": "uuid"}),
        Kind::Date => json!({"type": "int", "logicalType": "date"}),
        Kind::Millis { .. } => json!({"type": "long", "logicalType": "timestamp-millis"}),
        Kind::Micros => json!({"type": "long", "logicalType": "timestamp-micros"}),
        Kind::Decimal { p, s, .. } => {
            json!({"type": "bytes", "logicalType": "decimal", "precision": p, "scale": s})
        }
        Kind::Nullable { inner, null_second } => {
            let i = schema_of(inner, names);
            if *null_second {
                json!([i, "null"])
            } else {
                json!(["null", i])
            }
        }
        Kind::Array(i) => json!({"type": "array", "items": schema_of(i, names)}),
        Kind::Map(i) => json!({"type": "map", "values": schema_of(i, names)}),
    }
}

fn ty_of(k: &Kind) -> ChType {
    match k {
        Kind::Bool => ChType::Bool,
        Kind::Int { wide } => {
            if *wide {
                ChType::Int64
            } else {
                ChType::Int32
            }
        }
        Kind::Long { wide } => {
            if *wide {
                ChType::Int128
            } else {
                ChType::Int64
            }
        }
        Kind::Float { wide } => {
            if *wide {
                ChType::Float64
            } else {
                ChType::Float32
            }
        }
        Kind::Double => ChType::Float64,
        Kind::Bytes | Kind::Str => ChType::String,
        Kind::Fixed(n) => ChType::FixedString(*n),
        Kind::Enum { n, enum8 } => {
            if *enum8 {
                ChType::Enum8((0..*n).map(|i| (format!("s{i}"), i as i8 + 1)).collect())
            } else {
                ChType::LowCardinality(Box::new(ChType::String))
            }
        }
        Kind::Uuid => ChType::Uuid,
        Kind::Date => ChType::Date32,
        Kind::Millis { p } => ChType::DateTime64 {
            precision: *p,
            tz: None,
        },
        Kind::Micros => ChType::DateTime64 {
            precision: 6,
            tz: None,
        },
        Kind::Decimal { p, s, up } => ChType::Decimal {
            precision: p + up,
            scale: s + up,
        },
        Kind::Nullable { inner, .. } => ChType::Nullable(Box::new(ty_of(inner))),
        Kind::Array(i) => ChType::Array(Box::new(ty_of(i))),
        Kind::Map(i) => ChType::Map(Box::new(ChType::String), Box::new(ty_of(i))),
    }
}

/// Big-endian two's complement, minimal length (Avro's decimal bytes).
fn be_bytes(v: i64) -> Vec<u8> {
    let b = v.to_be_bytes();
    let mut i = 0;
    while i < 7 {
        let (x, next) = (b[i], b[i + 1]);
        if (x == 0 && next & 0x80 == 0) || (x == 0xff && next & 0x80 != 0) {
            i += 1;
        } else {
            break;
        }
    }
    b[i..].to_vec()
}

// DateTime64's range in seconds (1900-01-01 ..= 2299-12-31).
const MIN_S: i64 = -2_208_988_800;
const MAX_S: i64 = 10_413_791_999;

fn value_of(k: &Kind) -> BoxedStrategy<AV> {
    match k {
        Kind::Bool => any::<bool>().prop_map(AV::Boolean).boxed(),
        Kind::Int { .. } => any::<i32>().prop_map(AV::Int).boxed(),
        Kind::Long { .. } => any::<i64>().prop_map(AV::Long).boxed(),
        Kind::Float { .. } => any::<f32>().prop_map(AV::Float).boxed(),
        Kind::Double => any::<f64>().prop_map(AV::Double).boxed(),
        Kind::Bytes => prop::collection::vec(any::<u8>(), 0..20)
            .prop_map(AV::Bytes)
            .boxed(),
        Kind::Str => "\\PC{0,12}".prop_map(AV::String).boxed(),
        Kind::Fixed(n) => {
            let n = *n;
            prop::collection::vec(any::<u8>(), n..=n)
                .prop_map(move |b| AV::Fixed(n, b))
                .boxed()
        }
        Kind::Enum { n, .. } => (0..*n as u32)
            .prop_map(|i| AV::Enum(i, format!("s{i}")))
            .boxed(),
        Kind::Uuid => any::<u128>()
            .prop_map(|u| AV::Uuid(apache_avro::Uuid::from_u128(u)))
            .boxed(),
        Kind::Date => (-25_567i32..=120_529).prop_map(AV::Date).boxed(),
        Kind::Millis { .. } => (MIN_S * 1000..=MAX_S * 1000 + 999)
            .prop_map(AV::TimestampMillis)
            .boxed(),
        Kind::Micros => (MIN_S * 1_000_000..=MAX_S * 1_000_000 + 999_999)
            .prop_map(AV::TimestampMicros)
            .boxed(),
        Kind::Decimal { p, .. } => {
            let lim = 10i64.pow(u32::from(*p)) - 1;
            (-lim..=lim)
                .prop_map(|v| AV::Decimal(apache_avro::Decimal::from(be_bytes(v))))
                .boxed()
        }
        Kind::Nullable { inner, null_second } => {
            let (ni, vi) = if *null_second { (1, 0) } else { (0, 1) };
            prop_oneof![
                1 => Just(AV::Union(ni, Box::new(AV::Null))),
                3 => value_of(inner).prop_map(move |v| AV::Union(vi, Box::new(v))),
            ]
            .boxed()
        }
        Kind::Array(i) => prop::collection::vec(value_of(i), 0..4)
            .prop_map(AV::Array)
            .boxed(),
        Kind::Map(i) => prop::collection::hash_map("[a-z]{0,4}", value_of(i), 0..4)
            .prop_map(|m: HashMap<String, AV>| AV::Map(m))
            .boxed(),
    }
}

/// The reference: apache-avro's decoded value as the column's RowBinary
/// value (map entries in key order).
fn to_rb(av: &AV, k: &Kind) -> Value {
    match (k, av) {
        (Kind::Nullable { inner, .. }, AV::Union(_, v)) => match &**v {
            AV::Null => Value::Null,
            v => to_rb(v, inner),
        },
        (Kind::Bool, AV::Boolean(b)) => Value::Bool(*b),
        (Kind::Int { .. }, AV::Int(i)) => Value::Int(Wide::from_i128(i128::from(*i))),
        (Kind::Long { .. }, AV::Long(i)) => Value::Int(Wide::from_i128(i128::from(*i))),
        (Kind::Float { wide: false }, AV::Float(f)) => Value::Float32(*f),
        (Kind::Float { wide: true }, AV::Float(f)) => Value::Float64(f64::from(*f)),
        (Kind::Double, AV::Double(f)) => Value::Float64(*f),
        (Kind::Bytes, AV::Bytes(b)) => Value::String(b.clone()),
        (Kind::Str, AV::String(s)) => Value::String(s.as_bytes().to_vec()),
        (Kind::Fixed(_), AV::Fixed(_, b)) => Value::String(b.clone()),
        (Kind::Enum { enum8: false, .. }, AV::Enum(_, s)) => Value::String(s.as_bytes().to_vec()),
        (Kind::Enum { enum8: true, .. }, AV::Enum(i, _)) => Value::Enum(*i as i16 + 1),
        (Kind::Uuid, AV::Uuid(u)) => Value::Uuid(u.as_u128()),
        (Kind::Date, AV::Date(d)) => Value::Date(i64::from(*d)),
        (Kind::Millis { p }, AV::TimestampMillis(v)) => {
            Value::DateTime64(v * 10i64.pow(u32::from(*p - 3)))
        }
        (Kind::Micros, AV::TimestampMicros(v)) => Value::DateTime64(*v),
        (Kind::Decimal { up, .. }, AV::Decimal(d)) => {
            let bytes: Vec<u8> = d.try_into().expect("decimal bytes");
            let mut v: i128 = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
                -1
            } else {
                0
            };
            for b in bytes {
                v = (v << 8) | i128::from(b);
            }
            Value::Decimal(Wide::from_i128(v * 10i128.pow(u32::from(*up))))
        }
        (Kind::Array(i), AV::Array(vs)) => Value::Array(vs.iter().map(|v| to_rb(v, i)).collect()),
        (Kind::Map(i), AV::Map(m)) => {
            let mut e: Vec<(Value, Value)> = m
                .iter()
                .map(|(k, v)| (Value::String(k.as_bytes().to_vec()), to_rb(v, i)))
                .collect();
            e.sort_by(|a, b| key_bytes(&a.0).cmp(key_bytes(&b.0)));
            Value::Map(e)
        }
        (k, v) => panic!("apache-avro gave {v:?} for {k:?}"),
    }
}

fn key_bytes(v: &Value) -> &[u8] {
    match v {
        Value::String(s) => s,
        _ => &[],
    }
}

/// Map entries in key order, recursively (our decoder keeps wire order).
fn normalize(v: Value) -> Value {
    match v {
        Value::Array(vs) => Value::Array(vs.into_iter().map(normalize).collect()),
        Value::Map(es) => {
            let mut es: Vec<(Value, Value)> =
                es.into_iter().map(|(k, v)| (k, normalize(v))).collect();
            es.sort_by(|a, b| key_bytes(&a.0).cmp(key_bytes(&b.0)));
            Value::Map(es)
        }
        other => other,
    }
}

struct Case {
    schema: Arc<Schema>,
    columns: Vec<ColumnSpec>,
    /// Per column: the top-level field index, the sub-field (nested
    /// records) and the kind.
    sources: Vec<(usize, Option<usize>, Kind, bool)>,
}

fn build(fields: &[Field], reverse: bool) -> Case {
    let mut names = 0;
    let mut sfields = Vec::new();
    let mut columns = Vec::new();
    let mut sources = Vec::new();
    let spec = |name: String, ty: ChType, path: Option<Vec<String>>| ColumnSpec {
        missing: if ty.is_nullable() {
            MissingValue::Null
        } else {
            MissingValue::Reject
        },
        name,
        ty,
        path,
        options: ColumnOptions::default(),
        meta: None,
    };
    for (i, f) in fields.iter().enumerate() {
        let fname = format!("f{i}");
        match f {
            Field::Plain { kind, read } => {
                sfields.push(json!({"name": fname, "type": schema_of(kind, &mut names)}));
                if *read {
                    columns.push(spec(fname, ty_of(kind), None));
                    sources.push((i, None, kind.clone(), false));
                }
            }
            Field::Record {
                fields: subs,
                nullable,
            } => {
                names += 1;
                let rec = json!({
                    "type": "record", "name": format!("R{names}"),
                    "fields": subs.iter().enumerate()
                        .map(|(k, s)| json!({"name": format!("g{k}"), "type": schema_of(s, &mut names)}))
                        .collect::<Vec<_>>()
                });
                let ty = if *nullable { json!(["null", rec]) } else { rec };
                sfields.push(json!({"name": fname, "type": ty}));
                for (k, s) in subs.iter().enumerate() {
                    let mut t = ty_of(s);
                    if *nullable && !t.is_nullable() {
                        t = ChType::Nullable(Box::new(t));
                    }
                    columns.push(spec(
                        format!("{fname}_g{k}"),
                        t,
                        Some(vec![fname.clone(), format!("g{k}")]),
                    ));
                    sources.push((i, Some(k), s.clone(), *nullable));
                }
            }
        }
    }
    // At least one column: a trailing long read by every case.
    sfields.push(json!({"name": "last", "type": "long"}));
    columns.push(spec("last".into(), ChType::Int64, None));
    sources.push((fields.len(), None, Kind::Long { wide: false }, false));
    if reverse {
        columns.reverse();
        sources.reverse();
    }
    let schema = json!({"type": "record", "name": "Top", "fields": sfields});
    Case {
        schema: Arc::new(Schema::parse(&schema).expect("generated schema parses")),
        columns,
        sources,
    }
}

fn values(fields: &[Field]) -> BoxedStrategy<Vec<AV>> {
    let mut s: Vec<BoxedStrategy<AV>> = fields
        .iter()
        .map(|f| match f {
            Field::Plain { kind, .. } => value_of(kind),
            Field::Record { fields, nullable } => {
                let subs: Vec<BoxedStrategy<AV>> = fields.iter().map(value_of).collect();
                let rec = subs
                    .prop_map(|vs| {
                        AV::Record(
                            vs.into_iter()
                                .enumerate()
                                .map(|(k, v)| (format!("g{k}"), v))
                                .collect(),
                        )
                    })
                    .boxed();
                if *nullable {
                    prop_oneof![
                        1 => Just(AV::Union(0, Box::new(AV::Null))),
                        3 => rec.prop_map(|r| AV::Union(1, Box::new(r))),
                    ]
                    .boxed()
                } else {
                    rec
                }
            }
        })
        .collect();
    s.push(any::<i64>().prop_map(AV::Long).boxed());
    s.boxed()
}

fn case() -> impl Strategy<Value = (Vec<Field>, bool, Vec<AV>)> {
    (prop::collection::vec(field(), 0..7), any::<bool>()).prop_flat_map(|(fields, reverse)| {
        let v = values(&fields);
        (Just(fields), Just(reverse), v)
    })
}

fn reference_row(case: &Case, decoded: &AV) -> Vec<u8> {
    let AV::Record(top) = decoded else {
        panic!("a record")
    };
    let mut out = Vec::new();
    for (c, (i, sub, kind, nullable_rec)) in case.columns.iter().zip(&case.sources) {
        let v = &top[*i].1;
        let rb = match sub {
            None => to_rb(v, kind),
            Some(k) => {
                let rec = match v {
                    AV::Union(_, inner) => &**inner,
                    other => other,
                };
                match rec {
                    AV::Null => {
                        assert!(*nullable_rec);
                        Value::Null
                    }
                    AV::Record(fs) => to_rb(&fs[*k].1, kind),
                    other => panic!("not a record: {other:?}"),
                }
            }
        };
        encode(&c.ty, &rb, &mut out).expect("the reference value encodes");
    }
    out
}

fn normalized_row(case: &Case, row: &[u8]) -> Vec<u8> {
    let mut input = row;
    let mut out = Vec::new();
    for c in &case.columns {
        let v = decode(&c.ty, &mut input).expect("our row decodes");
        encode(&c.ty, &normalize(v), &mut out).expect("re-encodes");
    }
    assert!(input.is_empty(), "no bytes after the columns");
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_hot_path_agrees_with_apache_avro((fields, reverse, vals) in case()) {
        let case = build(&fields, reverse);
        let record = AV::Record(
            vals.into_iter()
                .enumerate()
                .map(|(i, v)| (if i == fields.len() { "last".to_owned() } else { format!("f{i}") }, v))
                .collect(),
        );
        let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&case.schema)
            .build()
            .expect("writer")
            .write_value_to_vec(record)
            .expect("the generated value fits its schema");
        let mut r = &datum[..];
        let decoded = apache_avro::reader::datum::GenericDatumReader::builder(&case.schema)
            .build()
            .expect("reader")
            .read_value(&mut r)
            .expect("apache-avro reads its own datum");
        prop_assert!(r.is_empty());
        let want = reference_row(&case, &decoded);

        let mapping = AvroMapping::plain(case.columns.clone(), AvroOptions::default(), Arc::clone(&case.schema))
            .expect("the generated mapping plans");
        let mut dec = mapping.decoder();
        let mut enc = mapping.encoder();
        let mut row = Vec::new();
        let mut n = 0;
        dec.decode_value(Some(&datum), |rec| {
            n += 1;
            enc.encode_row(&rec, &mut row)
        }).expect("the hot path decodes it");
        prop_assert_eq!(n, 1);
        let has_map = case.columns.iter().any(|c| c.ty.to_string().contains("Map("));
        if !has_map {
            prop_assert_eq!(&row, &want, "raw bytes");
        }
        prop_assert_eq!(normalized_row(&case, &row), want);

        // Every strict prefix is an error.
        for cut in 0..datum.len() {
            let mut out = Vec::new();
            let r = dec.decode_value(Some(&datum[..cut]), |rec| enc.encode_row(&rec, &mut out));
            prop_assert!(r.is_err(), "a prefix of {} bytes of {} decoded", cut, datum.len());
        }
    }
}
