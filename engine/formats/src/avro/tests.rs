use std::sync::Arc;

use apache_avro::Schema;
use apache_avro::types::Value as AV;
use spate_core::pipeline::chain::{RecordError, RecordErrorKind};

use super::*;
use spate_row::rowbinary::Value;
use spate_row::rowbinary::decode::decode;
use spate_row::spec::{ColumnOptions, ColumnSpec, MissingValue, simple_columns};
use spate_row::types::ChType;
use spate_testkit::sensor::avro as sensor;

fn t(s: &str) -> ChType {
    ChType::parse(s).expect("type parses")
}

fn cols(spec: &[(&str, &str)]) -> Vec<ColumnSpec> {
    simple_columns(spec.iter().map(|(n, ty)| (*n, t(ty))))
}

fn schema(json: &str) -> Arc<Schema> {
    Arc::new(Schema::parse_str(json).expect("schema parses"))
}

fn explode(path: &str) -> AvroOptions {
    AvroOptions {
        explode: Some(spate_row::spec::parse_pointer(path).expect("pointer")),
        ..AvroOptions::default()
    }
}

/// The rows of one message, decoded back into values per column.
fn rows(mapping: &Arc<AvroMapping>, message: &[u8]) -> Result<Vec<Vec<Value>>, RecordError> {
    let mut dec = mapping.decoder();
    let mut enc = mapping.encoder();
    let mut bufs = Vec::new();
    dec.decode_value(Some(message), |r| {
        let mut b = Vec::new();
        enc.encode_row(&r, &mut b)?;
        bufs.push(b);
        Ok(())
    })?;
    Ok(bufs
        .iter()
        .map(|b| {
            let mut input = &b[..];
            let vals = mapping
                .columns()
                .iter()
                .map(|c| decode(&c.ty, &mut input).expect("our RowBinary decodes"))
                .collect();
            assert!(input.is_empty(), "a row has exactly the columns");
            vals
        })
        .collect())
}

fn plain_rows(
    json: &str,
    columns: Vec<ColumnSpec>,
    options: AvroOptions,
    value: AV,
) -> Result<Vec<Vec<Value>>, RecordError> {
    let s = schema(json);
    let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&s)
        .build()
        .expect("writer")
        .write_value_to_vec(value)
        .expect("value fits the schema");
    let m =
        AvroMapping::plain(columns, options, s).map_err(|e| RecordError::decode(e.to_string()))?;
    rows(&m, &datum)
}

fn plan_err(json: &str, columns: Vec<ColumnSpec>, options: AvroOptions) -> PlanError {
    compile(Some(42), schema(json), &columns, &options).expect_err("a plan error")
}

fn int(v: i128) -> Value {
    Value::Int(spate_row::num::Wide::from_i128(v))
}

fn s(v: &str) -> Value {
    Value::String(v.as_bytes().to_vec())
}

fn sensor_mapping(columns: Vec<ColumnSpec>) -> Arc<AvroMapping> {
    let source =
        FileSchemaSource::from_schemas([(7, sensor::schema_v1()), (8, sensor::schema_v2())]);
    AvroMapping::confluent(columns, explode("/events"), Arc::new(source)).expect("mapping")
}

fn expected_sensor_row(i: u64, j: u64) -> Vec<Value> {
    let b = sensor::batch(i);
    let e = sensor::event(i, j);
    vec![
        int(i128::from(b.batch_id)),
        s(&b.source),
        s(b.region.as_deref().unwrap_or("unknown")),
        int(i128::from(b.produced_at)),
        int(i128::from(e.event_seq)),
        int(i128::from(e.sensor_id)),
        s(&e.name),
        Value::Float64(e.value),
        match e.quality {
            None => Value::Null,
            Some(q) => int(i128::from(q)),
        },
        s(e.unit),
        int(i128::from(e.ts)),
    ]
}

/// The workload: one message -> 100 rows, each the parent's fields and
/// one element's, in INSERT order with no permutation; a null region takes
/// the DEFAULT; schema version 2 (a field after the array) gives the same
/// rows.
#[test]
fn sensor_messages_fan_out_into_their_closed_form() {
    let m = sensor_mapping(sensor::columns());
    assert!(m.plan(Some(7)).expect("plan").is_direct());
    for i in [0u64, 1, 3, 10, 11, 977] {
        for (id, v2) in [(7, false), (8, true)] {
            let mut msg = Vec::new();
            if v2 {
                sensor::message_v2(i, id, &mut msg);
            } else {
                sensor::message(i, id, &mut msg);
            }
            let got = rows(&m, &msg).expect("rows");
            assert_eq!(got.len(), sensor::EVENTS as usize);
            for (j, row) in got.iter().enumerate() {
                assert_eq!(
                    *row,
                    expected_sensor_row(i, j as u64),
                    "message {i} event {j}"
                );
            }
        }
    }
}

/// A field after the exploded array feeds a column (version 2), and the
/// version without it takes the column's DEFAULT.
#[test]
fn a_parent_field_after_the_array_is_reachable() {
    let mut c = sensor::columns();
    c.push(ColumnSpec {
        name: "firmware".into(),
        ty: ChType::String,
        path: None,
        missing: MissingValue::Literal("'none'".into()),
        options: ColumnOptions::default(),
        meta: None,
    });
    let m = sensor_mapping(c);
    for i in [2u64, 5] {
        let mut msg = Vec::new();
        sensor::message_v2(i, 8, &mut msg);
        let got = rows(&m, &msg).expect("rows");
        assert_eq!(got.len(), 100);
        for row in &got {
            assert_eq!(row[11], s(&sensor::firmware(i)));
        }
        let mut msg = Vec::new();
        sensor::message(i, 7, &mut msg);
        let got = rows(&m, &msg).expect("rows");
        assert!(got.iter().all(|r| r[11] == s("none")));
    }
}

/// Columns in another order than the schema's fields: the same values,
/// permuted once.
#[test]
fn columns_out_of_schema_order_are_permuted() {
    let mut c = sensor::columns();
    c.reverse();
    let m = sensor_mapping(c);
    assert!(!m.plan(Some(7)).expect("plan").is_direct());
    let mut msg = Vec::new();
    sensor::message(13, 7, &mut msg);
    let got = rows(&m, &msg).expect("rows");
    for (j, row) in got.iter().enumerate() {
        let mut want = expected_sensor_row(13, j as u64);
        want.reverse();
        assert_eq!(*row, want);
    }
}

const EV: &str = r#"{"type":"record","name":"R","fields":[
    {"name":"id","type":"long"},
    {"name":"events","type":{"type":"array","items":{"type":"record","name":"E","fields":[
        {"name":"x","type":"int"},{"name":"id","type":"string"}]}}},
    {"name":"tail","type":"string"}]}"#;

fn ev_value(n: usize) -> AV {
    AV::Record(vec![
        ("id".into(), AV::Long(5)),
        (
            "events".into(),
            AV::Array(
                (0..n)
                    .map(|k| {
                        AV::Record(vec![
                            ("x".into(), AV::Int(k as i32)),
                            ("id".into(), AV::String(format!("e{k}"))),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("tail".into(), AV::String("end".into())),
    ])
}

/// An empty array pushes no record (the message resolves as filtered).
#[test]
fn an_empty_array_pushes_nothing() {
    let got = plain_rows(
        EV,
        cols(&[("x", "Int32"), ("tail", "String")]),
        explode("/events"),
        ev_value(0),
    )
    .expect("decodes");
    assert!(got.is_empty());
    let got = plain_rows(
        EV,
        cols(&[("x", "Int32"), ("tail", "String")]),
        explode("/events"),
        ev_value(3),
    )
    .expect("decodes");
    assert_eq!(
        got,
        (0..3).map(|k| vec![int(k), s("end")]).collect::<Vec<_>>()
    );
}

/// A name both the parent and the element have is a plan error, unless a
/// pointer says which.
#[test]
fn a_parent_element_name_clash_needs_a_pointer() {
    let e = plan_err(EV, cols(&[("id", "String")]), explode("/events"));
    assert_eq!(e.column.as_deref(), Some("id"));
    assert!(e.to_string().contains("schema id 42"), "{e}");
    assert!(e.reason.contains("/events/id"), "{e}");
    let mut c = cols(&[("eid", "String"), ("pid", "Int64")]);
    c[0].path = Some(vec!["events".into(), "id".into()]);
    c[1].path = Some(vec!["id".into()]);
    let got = plain_rows(EV, c, explode("/events"), ev_value(2)).expect("decodes");
    assert_eq!(got, vec![vec![s("e0"), int(5)], vec![s("e1"), int(5)]]);
}

const TS: &str = r#"{"type":"record","name":"R","fields":[
    {"name":"ms","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"us","type":{"type":"long","logicalType":"timestamp-micros"}}]}"#;

fn ts_value(ms: i64, us: i64) -> AV {
    AV::Record(vec![
        ("ms".into(), AV::TimestampMillis(ms)),
        ("us".into(), AV::TimestampMicros(us)),
    ])
}

/// Timestamps carry exactly: scaled into DateTime64, whole seconds into
/// DateTime, and a value with a fraction the column cannot hold is a
/// record error naming the column, never truncated.
#[test]
fn timestamps_never_truncate() {
    let c = cols(&[("ms", "DateTime64(6)"), ("us", "DateTime64(3)")]);
    let got = plain_rows(
        TS,
        c.clone(),
        AvroOptions::default(),
        ts_value(1_500, 2_000),
    )
    .expect("exact");
    assert_eq!(
        got,
        vec![vec![Value::DateTime64(1_500_000), Value::DateTime64(2)]]
    );
    let e =
        plain_rows(TS, c, AvroOptions::default(), ts_value(1_500, 2_001)).expect_err("fraction");
    assert_eq!(e.kind, RecordErrorKind::Encode);
    assert_eq!(e.column.as_deref(), Some("us"));
    assert!(e.reason.contains("2001 us has a fraction"), "{e}");
    let c = cols(&[("ms", "DateTime"), ("us", "UInt64")]);
    let got = plain_rows(TS, c.clone(), AvroOptions::default(), ts_value(3_000, 7)).expect("whole");
    assert_eq!(got, vec![vec![Value::DateTime(3), int(7)]]);
    let e = plain_rows(TS, c, AvroOptions::default(), ts_value(3_001, 7)).expect_err("fraction");
    assert_eq!(e.column.as_deref(), Some("ms"));
    assert!(e.reason.contains("3001 ms has a fraction"), "{e}");
}

/// Narrowing is range-checked per value; widening is exact.
#[test]
fn integers_widen_exactly_and_narrow_checked() {
    const L: &str = r#"{"type":"record","name":"R","fields":[{"name":"v","type":"long"}]}"#;
    let v = |x: i64| AV::Record(vec![("v".into(), AV::Long(x))]);
    for ty in ["Int128", "Int256", "Int64"] {
        let got =
            plain_rows(L, cols(&[("v", ty)]), AvroOptions::default(), v(i64::MIN)).expect("fits");
        assert_eq!(got, vec![vec![int(i128::from(i64::MIN))]]);
    }
    let got = plain_rows(L, cols(&[("v", "UInt8")]), AvroOptions::default(), v(255)).expect("fits");
    assert_eq!(got, vec![vec![int(255)]]);
    let e = plain_rows(L, cols(&[("v", "UInt8")]), AvroOptions::default(), v(256))
        .expect_err("too big");
    assert_eq!(e.column.as_deref(), Some("v"));
    assert!(e.reason.contains("256 is out of range for UInt8"), "{e}");
    let e =
        plain_rows(L, cols(&[("v", "UInt64")]), AvroOptions::default(), v(-1)).expect_err("neg");
    assert!(e.reason.contains("-1 is out of range for UInt64"), "{e}");
}

/// What cannot carry exactly is a plan error naming schema id, field and
/// column.
#[test]
fn plan_errors_name_schema_field_and_column() {
    const M: &str = r#"{"type":"record","name":"R","fields":[
        {"name":"m","type":{"type":"map","values":"long"}},
        {"name":"d","type":"double"},
        {"name":"p","type":{"type":"long"}},
        {"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":4}}]}"#;
    let e = plan_err(M, cols(&[("m", "String")]), AvroOptions::default());
    assert_eq!(
        (e.field.as_deref(), e.column.as_deref()),
        (Some("m"), Some("m"))
    );
    assert!(e.reason.contains("18.16 has no Map"), "{e}");
    let e = plan_err(M, cols(&[("d", "Float32")]), AvroOptions::default());
    assert!(e.reason.contains("Float32 would round"), "{e}");
    let e = plan_err(M, cols(&[("p", "DateTime")]), AvroOptions::default());
    assert!(e.reason.contains("matching logical type"), "{e}");
    let e = plan_err(
        M,
        cols(&[("dec", "Decimal(12, 2)")]),
        AvroOptions::default(),
    );
    assert!(e.reason.contains("4 digits after the point"), "{e}");
    let e = plan_err(
        M,
        cols(&[("dec", "Decimal(12, 8)")]),
        AvroOptions::default(),
    );
    assert!(e.reason.contains("digits before the point"), "{e}");
    let e = plan_err(
        M,
        cols(&[("d", "Float64"), ("absent", "String")]),
        AvroOptions::default(),
    );
    assert_eq!(e.column.as_deref(), Some("absent"));
    assert!(
        e.to_string()
            .starts_with("Avro writer schema id 42, column `absent`"),
        "{e}"
    );
    let e = plan_err(M, cols(&[("d", "Float64")]), explode("/m"));
    assert!(e.reason.contains("not an array"), "{e}");
}

/// Decimals carry exactly, rescaled to the column's scale.
#[test]
fn decimals_rescale_exactly() {
    const D: &str = r#"{"type":"record","name":"R","fields":[
        {"name":"a","type":{"type":"bytes","logicalType":"decimal","precision":6,"scale":2}},
        {"name":"b","type":{"type":"fixed","name":"F","size":5,"logicalType":"decimal","precision":9,"scale":0}}]}"#;
    let v = AV::Record(vec![
        (
            "a".into(),
            AV::Decimal(apache_avro::Decimal::from(vec![0xfb, 0x2e])),
        ), // -1234
        (
            "b".into(),
            AV::Decimal(apache_avro::Decimal::from(vec![0, 0, 0, 0x30, 0x39])),
        ), // 12345
    ]);
    let got = plain_rows(
        D,
        cols(&[("a", "Decimal(10, 4)"), ("b", "Decimal(18, 3)")]),
        AvroOptions::default(),
        v,
    )
    .expect("exact");
    assert_eq!(
        got,
        vec![vec![
            Value::Decimal(spate_row::num::Wide::from_i128(-123_400)),
            Value::Decimal(spate_row::num::Wide::from_i128(12_345_000))
        ]]
    );
}

/// Arrays in several blocks (negative counts with byte sizes) land with
/// their total count.
#[test]
fn multi_block_arrays_get_their_total_count() {
    const A: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"array","items":"int"}}]}"#;
    // Blocks: 2 items [1, 2]; -1 items (size 1) [3]; end. 200 items in a
    // second block so the LEB128 count grows to two bytes.
    let mut d = vec![4, 2, 4, 1, 2, 6, 0];
    let m = AvroMapping::plain(
        cols(&[("a", "Array(Int32)")]),
        AvroOptions::default(),
        schema(A),
    )
    .expect("plan");
    let got = rows(&m, &d).expect("decodes");
    assert_eq!(got, vec![vec![Value::Array(vec![int(1), int(2), int(3)])]]);
    d = vec![2, 0];
    d.extend_from_slice(&[0x90, 0x03]); // 200 items
    d.extend(std::iter::repeat_n(8u8, 200)); // int 4
    d.push(0);
    let got = rows(&m, &d).expect("decodes");
    let mut want = vec![int(0)];
    want.extend(std::iter::repeat_n(int(4), 200));
    assert_eq!(got, vec![vec![Value::Array(want)]]);
}

/// Bad input: clear errors naming the schema id, nothing panics.
#[test]
fn bad_input_names_the_schema_id() {
    let m = sensor_mapping(sensor::columns());
    let e = rows(&m, &[1, 0, 0, 0, 7, 1]).expect_err("bad magic");
    assert_eq!(e.kind, RecordErrorKind::Decode);
    assert!(e.reason.contains("magic byte 0x01"), "{e}");
    let e = rows(&m, &[0, 0, 0]).expect_err("short");
    assert!(e.reason.contains("3 bytes"), "{e}");
    let e = rows(&m, &[0, 0, 0, 0, 99, 2]).expect_err("unknown id");
    assert_eq!(e.kind, RecordErrorKind::Decode);
    assert!(
        e.reason.contains("Avro schema id 99: unknown schema id"),
        "{e}"
    );
    let e = rows(&m, &[]).expect_err("empty");
    assert!(e.reason.contains("0 bytes"), "{e}");
    let mut msg = Vec::new();
    sensor::message(3, 7, &mut msg);
    // Every cut of the message is an error (never a panic, never rows).
    for cut in 5..msg.len() {
        let e = rows(&m, &msg[..cut]).expect_err("truncated");
        assert_eq!(e.kind, RecordErrorKind::Decode, "cut {cut}: {e}");
        assert!(e.reason.contains("Avro schema id 7"), "cut {cut}: {e}");
    }
    // A truncated tail (after the array) is caught by the encoder, naming
    // the field.
    let mut msg = Vec::new();
    sensor::message_v2(3, 8, &mut msg);
    let e = rows(&m, &msg[..msg.len() - 1]).expect_err("truncated tail");
    assert!(e.reason.contains("field `firmware`"), "{e}");
    assert!(e.reason.contains("truncated"), "{e}");
    // Trailing bytes: another schema's datum.
    let mut msg = Vec::new();
    sensor::message_v2(3, 7, &mut msg);
    let e = rows(&m, &msg).expect_err("trailing");
    assert!(e.reason.contains("bytes are left after the datum"), "{e}");
}

/// A plan error met mid-stream is a Decode record error naming the schema
/// id and the column.
#[test]
fn an_unmappable_schema_is_a_record_error() {
    let mut c = sensor::columns();
    c[0].ty = ChType::String; // batch_id long into String: no exact conversion
    let m = sensor_mapping(c);
    let mut msg = Vec::new();
    sensor::message(1, 7, &mut msg);
    let e = rows(&m, &msg).expect_err("plan error");
    assert_eq!(e.kind, RecordErrorKind::Decode);
    assert_eq!(e.column.as_deref(), Some("batch_id"));
    assert!(e.reason.contains("schema id 7, field `batch_id`"), "{e}");
}

/// Unions with null into Nullable, enums, uuid, nested record paths and the
/// flatten join.
#[test]
fn nested_records_unions_enums_and_uuids() {
    const N: &str = r#"{"type":"record","name":"R","fields":[
        {"name":"loc","type":["null",{"type":"record","name":"L","fields":[
            {"name":"lat","type":"double"},{"name":"tag","type":["null","string"]}]}]},
        {"name":"kind","type":{"type":"enum","name":"K","symbols":["A","B"]}},
        {"name":"u","type":{"type":"string","logicalType":"uuid"}}]}"#;
    let c = || {
        cols(&[
            ("loc_lat", "Nullable(Float64)"),
            ("loc_tag", "Nullable(String)"),
            ("kind", "Enum8('B' = 2, 'A' = 1)"),
            ("kind_s", "LowCardinality(String)"),
            ("u", "UUID"),
        ])
    };
    let mut cs = c();
    cs[3].path = Some(vec!["kind".into()]);
    cs[2].path = None;
    // kind feeds one column only: give the Enum8 one a pointer too? no: the
    // String one reads `kind` by pointer, the Enum8 one by name: a
    // duplicate.
    let e =
        compile(None, schema(N), &cs, &AvroOptions::default()).expect_err("one field, two columns");
    assert!(e.reason.contains("already feeds column"), "{e}");
    let mut cs = c();
    cs.remove(3);
    let opts = AvroOptions {
        flatten_join: Some("_".into()),
        ..AvroOptions::default()
    };
    let uuid = "01234567-89ab-cdef-0123-456789abcdef";
    let v = |loc: Option<(f64, Option<&str>)>| {
        AV::Record(vec![
            (
                "loc".into(),
                match loc {
                    None => AV::Union(0, Box::new(AV::Null)),
                    Some((lat, tag)) => AV::Union(
                        1,
                        Box::new(AV::Record(vec![
                            ("lat".into(), AV::Double(lat)),
                            (
                                "tag".into(),
                                match tag {
                                    None => AV::Union(0, Box::new(AV::Null)),
                                    Some(t) => AV::Union(1, Box::new(AV::String(t.into()))),
                                },
                            ),
                        ])),
                    ),
                },
            ),
            ("kind".into(), AV::Enum(1, "B".into())),
            ("u".into(), AV::Uuid(uuid.parse().expect("uuid"))),
        ])
    };
    let u = Value::Uuid(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let got = plain_rows(N, cs.clone(), opts.clone(), v(Some((1.5, Some("x"))))).expect("rows");
    assert_eq!(
        got,
        vec![vec![Value::Float64(1.5), s("x"), Value::Enum(2), u.clone()]]
    );
    let got = plain_rows(N, cs.clone(), opts.clone(), v(Some((2.0, None)))).expect("rows");
    assert_eq!(
        got,
        vec![vec![
            Value::Float64(2.0),
            Value::Null,
            Value::Enum(2),
            u.clone()
        ]]
    );
    let got = plain_rows(N, cs, opts, v(None)).expect("rows");
    assert_eq!(got, vec![vec![Value::Null, Value::Null, Value::Enum(2), u]]);
}

/// The router hashes an Avro field as the JSON router hashes the same
/// value: a string's bytes, an integer's decimal text.
#[test]
fn the_router_hashes_avro_fields_like_json_text() {
    use spate_core::ack::{AckIssuer, ack_channel};
    use spate_core::pipeline::chain::{RecordCx, Router};
    use spate_core::record::{Payload, TopicPartition};
    use spate_row::shard::{ShardKey, ShardSpec, key_hash};
    let m = sensor_mapping(sensor::columns());
    let mut msg = Vec::new();
    sensor::message(5, 7, &mut msg);
    let tp = TopicPartition::new("t", 0);
    let (tx, _rx) = ack_channel();
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let ack = issuer.issue(0, 0);
    let payload = Payload {
        value: Some(&msg),
        key: None,
        partition: &tp,
        offset: 0,
        timestamp_ms: None,
        timestamp_kind: spate_core::record::TimestampKind::None,
        headers: spate_core::record::Headers::NONE,
    };
    let cx = RecordCx { payload, ack: &ack };
    let mut records = Vec::new();
    m.decoder()
        .decode_value(Some(&msg), |r| {
            records.push(r);
            Ok(())
        })
        .expect("decodes");
    for (path, want) in [
        (
            vec!["source".to_owned()],
            (|_j: u64| key_hash(b"gw-5")) as fn(u64) -> u64,
        ),
        (vec!["sensor_id".to_owned()], |j: u64| {
            key_hash(((5 * 100 + j) % 1024).to_string().as_bytes())
        }),
        (vec!["events".to_owned(), "name".to_owned()], |j: u64| {
            key_hash(format!("sensor-{}", (5 * 100 + j) % 1024).as_bytes())
        }),
        (vec!["batch_id".to_owned()], |_j: u64| key_hash(b"5")),
    ] {
        let mut r = m.router(ShardSpec {
            key: ShardKey::Field(path.clone()),
            ..ShardSpec::default()
        });
        for (j, rec) in records.iter().enumerate() {
            let shards = 1000;
            let got = r.try_route(rec, &cx, shards).expect("routes");
            assert_eq!(got as u64, want(j as u64) % shards as u64, "{path:?} {j}");
        }
    }
    let mut r = m.router(ShardSpec {
        key: ShardKey::Field(vec!["region".into()]),
        ..ShardSpec::default()
    });
    let mut msg0 = Vec::new();
    sensor::message(0, 7, &mut msg0);
    let mut dec = m.decoder();
    let mut first = None;
    dec.decode_value(Some(&msg0), |rec| {
        first.get_or_insert(rec);
        Ok(())
    })
    .expect("decodes");
    let e = r
        .try_route(&first.expect("a record"), &cx, 4)
        .expect_err("null key");
    assert!(
        e.reason.contains("`region`") && e.reason.contains("null"),
        "{e}"
    );
}

/// A column that reads the exploded array itself is a plan error (each row
/// carries one element), never a row missing a cell.
#[test]
fn a_column_on_the_exploded_array_is_a_plan_error() {
    let e = plan_err(
        EV,
        cols(&[("events", "String"), ("x", "Int32")]),
        explode("/events"),
    );
    assert_eq!(e.column.as_deref(), Some("events"));
    assert!(e.reason.contains("exploded array itself"), "{e}");
}

/// With a server DEFAULT column the rows are RowBinaryWithDefaults: a
/// marker byte before every cell, 1 for the absent column.
#[test]
fn server_defaults_write_markers() {
    const S: &str = r#"{"type":"record","name":"R","fields":[
        {"name":"a","type":"int"},{"name":"b","type":["null","string"]}]}"#;
    let mut c = cols(&[("a", "Int32"), ("b", "String"), ("z", "UInt8")]);
    c[1].missing = MissingValue::ServerDefault;
    c[2].missing = MissingValue::ServerDefault;
    let s = schema(S);
    let m = AvroMapping::plain(c, AvroOptions::default(), Arc::clone(&s)).expect("plan");
    assert!(m.with_defaults());
    let mut enc = m.encoder();
    let mut dec = m.decoder();
    for (b, want) in [
        (
            AV::Union(1, Box::new(AV::String("hi".into()))),
            vec![0u8, 5, 0, 0, 0, 0, 2, b'h', b'i', 1],
        ),
        (
            AV::Union(0, Box::new(AV::Null)),
            vec![0u8, 5, 0, 0, 0, 1, 1],
        ),
    ] {
        let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&s)
            .build()
            .expect("writer")
            .write_value_to_vec(AV::Record(vec![("a".into(), AV::Int(5)), ("b".into(), b)]))
            .expect("fits");
        let mut out = Vec::new();
        dec.decode_value(Some(&datum), |r| enc.encode_row(&r, &mut out))
            .expect("encodes");
        assert_eq!(out, want);
    }
}

/// Kafka metadata columns come from the message through `encode_meta`,
/// per record; a message with the same datum at another offset gets its
/// own offset (the parent-prefix reuse is off when metadata sits there).
#[test]
fn metadata_columns_come_from_the_message() {
    use spate_core::ack::{AckIssuer, ack_channel};
    use spate_core::pipeline::chain::{Encoder, RecordCx};
    use spate_core::record::{Headers, Payload, TimestampKind, TopicPartition};
    use spate_row::meta::MetaSource;
    let mut c = sensor::columns();
    let meta = |name: &str, ty: &str, src: MetaSource| ColumnSpec {
        name: name.into(),
        ty: t(ty),
        path: None,
        missing: if ty.starts_with("Nullable") {
            MissingValue::Null
        } else {
            MissingValue::Reject
        },
        options: ColumnOptions::default(),
        meta: Some(src),
    };
    c.insert(1, meta("_offset", "UInt64", MetaSource::Offset));
    c.push(meta("k", "Nullable(String)", MetaSource::Key));
    let m = sensor_mapping(c);
    let plan = m.plan(Some(7)).expect("plan");
    assert!(plan.is_direct() && !plan.prefix_cache);
    let (tx, _rx) = ack_channel();
    let tp = TopicPartition::new("t", 0);
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let ack = issuer.issue(0, 0);
    let mut msg = Vec::new();
    sensor::message(4, 7, &mut msg);
    let mut dec = m.decoder();
    let mut enc = m.encoder();
    for (offset, key) in [(40i64, Some(&b"k1"[..])), (41, None)] {
        let cx = RecordCx {
            payload: Payload {
                value: Some(&msg),
                key,
                partition: &tp,
                offset,
                timestamp_ms: None,
                timestamp_kind: TimestampKind::None,
                headers: Headers::NONE,
            },
            ack: &ack,
        };
        let mut rows = Vec::new();
        dec.decode_value(Some(&msg), |r| {
            let mut b = Vec::new();
            enc.encode(&r, &cx, &mut b)?;
            rows.push(b);
            Ok(())
        })
        .expect("rows");
        assert_eq!(rows.len(), 100);
        for (j, b) in rows.iter().enumerate() {
            let mut input = &b[..];
            let vals: Vec<Value> = m
                .columns()
                .iter()
                .map(|c| decode(&c.ty, &mut input).expect("decodes"))
                .collect();
            let mut want = expected_sensor_row(4, j as u64);
            want.insert(1, int(i128::from(offset)));
            want.push(match key {
                Some(k) => Value::String(k.to_vec()),
                None => Value::Null,
            });
            assert_eq!(vals, want);
        }
    }
    let mut first = None;
    dec.decode_value(Some(&msg), |r| {
        first.get_or_insert(r);
        Ok(())
    })
    .expect("decodes");
    let e = enc
        .encode_row(&first.expect("a record"), &mut Vec::new())
        .expect_err("no message");
    assert_eq!(e.column.as_deref(), Some("_offset"));
    let mut c = sensor::columns();
    c.push(meta("o", "String", MetaSource::Offset));
    let e = compile(
        Some(7),
        Arc::new(sensor::schema_v1()),
        &c,
        &explode("/events"),
    )
    .expect_err("type");
    assert_eq!(e.column.as_deref(), Some("o"));
    assert!(e.reason.contains("Kafka metadata"), "{e}");
}

/// An array of nulls claiming more items than any datum could carry is a
/// record error, not unbounded work.
#[test]
fn a_huge_count_of_empty_items_is_refused() {
    const A: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"array","items":"null"}}]}"#;
    // One block of 2^30 nulls (zig-zag 2^31: 0x80 0x80 0x80 0x80 0x08), then the end.
    let d = [0x80, 0x80, 0x80, 0x80, 0x08, 0];
    for ty in ["Array(Nullable(UInt8))", "UInt8"] {
        let mut c = cols(&[("a", ty)]);
        if ty == "UInt8" {
            // The array is skipped: no column reads it; another column does.
            c = cols(&[("b", "Nullable(UInt8)")]);
        }
        let m = AvroMapping::plain(c, AvroOptions::default(), schema(A)).expect("plan");
        let e = rows(&m, &d).expect_err("too many");
        assert!(e.reason.contains("beyond the datum"), "{e}");
    }
    // A small one decodes.
    let m = AvroMapping::plain(
        cols(&[("a", "Array(Nullable(UInt8))")]),
        AvroOptions::default(),
        schema(A),
    )
    .expect("plan");
    let got = rows(&m, &[6, 0]).expect("three nulls");
    assert_eq!(got, vec![vec![Value::Array(vec![Value::Null; 3])]]);
}
