//! The JSON mapper's metadata columns (spate-row's `meta`) beside record
//! fields: where they sit in the row, absent values, the defaults marker,
//! and types refused at plan time.

use spate_core::pipeline::chain::RecordError;
use spate_core::record::{Payload, TopicPartition};
use spate_row::meta::MetaSource;
use spate_row::rowbinary::Value;
use spate_row::rowbinary::decode::decode;
use spate_row::spec::{ColumnOptions, ColumnSpec, MappingOptions, MissingValue};
use spate_row::types::ChType;

use crate::json::JsonRowEncoder;

use spate_testkit::fixtures::meta::{HEADERS, META_TS as TS, message};

fn ty(t: &str) -> ChType {
    ChType::parse(t).unwrap()
}

fn int(v: i64) -> Value {
    Value::Int(spate_row::num::Wide::from_i128(i128::from(v)))
}

fn s(b: &[u8]) -> Value {
    Value::String(b.to_vec())
}

/// The cell `source` writes for `p` into `t`, decoded by the RowBinary
/// decoder: what the mapper's metadata cell must equal.
fn value(source: &str, t: &str, p: &Payload<'_>) -> Value {
    let source = MetaSource::parse(source).unwrap();
    let mut bytes = Vec::new();
    let put = spate_row::meta::encode_meta(&source, "col", &ty(t), p, &mut bytes).unwrap();
    assert_eq!(put, spate_row::meta::MetaPut::Written);
    let mut input = &bytes[..];
    let v = decode(&ty(t), &mut input).unwrap();
    assert!(input.is_empty(), "trailing bytes");
    v
}

fn spec(name: &str, t: &str, meta: Option<&str>, missing: MissingValue) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        ty: ty(t),
        path: None,
        meta: meta.map(|m| MetaSource::parse(m).unwrap()),
        missing,
        options: ColumnOptions::default(),
    }
}

/// The row `enc` writes for `json` in message `p`, decoded per column.
fn json_row(
    enc: &mut JsonRowEncoder,
    json: &str,
    p: &Payload<'_>,
) -> Result<Vec<Value>, RecordError> {
    let mut buf = vec![0xee]; // rows append after what the chunk holds
    let p = Payload {
        value: Some(json.as_bytes()),
        ..*p
    };
    enc.encode_message(&p, &mut buf)?;
    assert_eq!(buf[0], 0xee);
    let mut input = &buf[1..];
    let values = enc
        .columns()
        .iter()
        .map(|c| decode(&c.ty, &mut input).unwrap())
        .collect();
    assert!(input.is_empty(), "row has trailing bytes");
    Ok(values)
}

#[test]
fn json_rows_take_metadata_columns_anywhere_in_the_row() {
    let tp = TopicPartition::new("events", 5);
    let p = message(&tp, &HEADERS);
    let cols = || {
        vec![
            spec("id", "UInt64", None, MissingValue::Reject),
            spec("off", "UInt64", Some("_offset"), MissingValue::Reject),
            spec("k", "Nullable(String)", Some("_key"), MissingValue::Null),
            spec("name", "String", None, MissingValue::Reject),
            spec(
                "hs",
                "Array(Tuple(String, Nullable(String)))",
                Some("_headers"),
                MissingValue::Reject,
            ),
            spec(
                "ts",
                "DateTime64(3)",
                Some("_timestamp"),
                MissingValue::Reject,
            ),
        ]
    };
    let mut enc = JsonRowEncoder::new(cols(), MappingOptions::default()).unwrap();
    let want = vec![
        int(7),
        int(42),
        s(b"user-7"),
        s(b"ada"),
        value("_headers", "Array(Tuple(String, Nullable(String)))", &p),
        Value::DateTime64(TS),
    ];
    for json in [
        r#"{"id":7,"name":"ada"}"#,
        r#"{"name":"ada","id":7}"#,
        r#"{"id":7,"name":"ada","_offset":9,"off":9}"#,
    ] {
        assert_eq!(json_row(&mut enc, json, &p).unwrap(), want, "{json}");
    }
    // Metadata columns last: rows need no reordering, same values.
    let (record, metas): (Vec<_>, Vec<_>) = cols().into_iter().partition(|c| c.meta.is_none());
    let mut enc = JsonRowEncoder::new(
        record.into_iter().chain(metas).collect(),
        MappingOptions::default(),
    )
    .unwrap();
    let got = json_row(&mut enc, r#"{"id":7,"name":"ada"}"#, &p).unwrap();
    assert_eq!(
        got,
        [0, 3, 1, 2, 4, 5].map(|i| want[i].clone()).to_vec(),
        "columns id, name, off, k, hs, ts"
    );
}

#[test]
fn absent_metadata_follows_the_missing_value_rule() {
    let tp = TopicPartition::new("events", 0);
    let mut p = message(&tp, &[]);
    p.key = None;
    p.timestamp_ms = None;
    let mut enc = JsonRowEncoder::new(
        vec![
            spec("id", "UInt64", None, MissingValue::Reject),
            spec("kn", "Nullable(String)", Some("_key"), MissingValue::Null),
            spec(
                "kd",
                "String",
                Some("_key"),
                MissingValue::Literal("'none'".into()),
            ),
            spec(
                "h",
                "Nullable(Int32)",
                Some("_header.n"),
                MissingValue::Null,
            ),
        ],
        MappingOptions::default(),
    )
    .unwrap();
    assert_eq!(
        json_row(&mut enc, r#"{"id":1}"#, &p).unwrap(),
        [int(1), Value::Null, s(b"none"), Value::Null]
    );
    for (name, t, source) in [
        ("k", "String", "_key"),
        ("ts", "DateTime64(3)", "_timestamp"),
        ("h", "String", "_header.h"),
    ] {
        let mut enc = JsonRowEncoder::new(
            vec![
                spec("id", "UInt64", None, MissingValue::Reject),
                spec(name, t, Some(source), MissingValue::Reject),
            ],
            MappingOptions::default(),
        )
        .unwrap();
        let e = json_row(&mut enc, r#"{"id":1}"#, &p).unwrap_err();
        assert_eq!(e.column.as_deref(), Some(name), "{e}");
    }
    // A value that does not fit is the record's error, naming the column.
    let mut enc = JsonRowEncoder::new(
        vec![
            spec("id", "UInt64", None, MissingValue::Reject),
            spec("ts", "DateTime", Some("_timestamp"), MissingValue::Reject),
        ],
        MappingOptions::default(),
    )
    .unwrap();
    let e = json_row(&mut enc, r#"{"id":1}"#, &message(&tp, &[])).unwrap_err();
    assert_eq!(e.column.as_deref(), Some("ts"));
    assert!(e.reason.contains("milliseconds"), "{e}");
    // Without a message (encode_json) a metadata column cannot be filled.
    let e = enc
        .encode_json(br#"{"id":1}"#, &mut Vec::new())
        .unwrap_err();
    assert!(e.reason.contains("no message"), "{e}");
}

#[test]
fn metadata_cells_get_the_defaults_marker() {
    let tp = TopicPartition::new("events", 0);
    let p = message(&tp, &[]);
    let mut enc = JsonRowEncoder::new(
        vec![
            spec("id", "UInt64", None, MissingValue::ServerDefault),
            spec("off", "UInt64", Some("_offset"), MissingValue::Reject),
        ],
        MappingOptions::default(),
    )
    .unwrap();
    let mut buf = Vec::new();
    let p = Payload {
        value: Some(b"{}"),
        ..p
    };
    enc.encode_message(&p, &mut buf).unwrap();
    let mut want = vec![1, 0];
    want.extend_from_slice(&42u64.to_le_bytes());
    assert_eq!(buf, want, "id: server DEFAULT, off: marker 0 then 42");
}

#[test]
fn the_encoder_refuses_a_metadata_column_of_the_wrong_type() {
    let e = JsonRowEncoder::new(
        vec![spec("off", "String", Some("_offset"), MissingValue::Reject)],
        MappingOptions::default(),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("`off`") && msg.contains("integer"), "{msg}");
}
