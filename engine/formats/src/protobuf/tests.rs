//! Protobuf tests: framing cases, plan errors, missing-field semantics,
//! well-known types, bad input with its error text, and the property test
//! that the hot-path decoder agrees with prost-reflect's `DynamicMessage`
//! on generated schemas and wire encodings.

use std::sync::Arc;

use proptest::prelude::*;
use prost_reflect::{
    DescriptorPool, DynamicMessage, MapKey, MessageDescriptor, ReflectMessage, Value as PValue,
};
use prost_types::field_descriptor_proto::{Label as PLabel, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FieldOptions, FileDescriptorProto, FileDescriptorSet, MessageOptions, OneofDescriptorProto,
};
use spate_core::pipeline::chain::RecordErrorKind;

use super::framing::{FramingError, parse_frame, write_header};
use super::source::{FileSchemaSource, compile_proto};
use super::{Framing, ProtoRowEncoder};
use spate_row::num::Wide;
use spate_row::rowbinary::{self, Value};
use spate_row::spec::{ColumnOptions, ColumnSpec, MappingOptions, MissingValue, simple_columns};
use spate_row::types::ChType;
use spate_testkit::sensor::protobuf as sensor;

// ---------------------------------------------------------------- wire writer

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn put_key(out: &mut Vec<u8>, number: u32, wt: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wt));
}

fn put_len(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_key(out, number, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn ty(s: &str) -> ChType {
    ChType::parse(s).expect("type")
}

fn col(name: &str, t: &str, missing: MissingValue) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        ty: ty(t),
        path: None,
        meta: None,
        missing,
        options: ColumnOptions::default(),
    }
}

// ---------------------------------------------------------------- framing

#[test]
fn framing_parses_the_shorthand_and_explicit_indexes() {
    let mut idx = Vec::new();
    // [0] as the single byte 0.
    let f = parse_frame(&[0, 0, 0, 1, 2, 0, 0x08, 0x01], &mut idx).unwrap();
    assert_eq!(f.schema_id, 258);
    assert_eq!(idx, [0]);
    assert_eq!(f.message, [0x08, 0x01]);
    // [1, 2]: count 2 (zig-zag 4), then 2 (zig-zag 2) and 4.
    let f = parse_frame(&[0, 0, 0, 0, 7, 4, 2, 4, 0x10], &mut idx).unwrap();
    assert_eq!(
        (f.schema_id, idx.as_slice(), f.message),
        (7, &[1, 2][..], &[0x10][..])
    );
    // [0] in long form.
    let f = parse_frame(&[0, 0, 0, 0, 7, 2, 0], &mut idx).unwrap();
    assert_eq!((idx.as_slice(), f.message), (&[0][..], &[][..]));
    // The writer round-trips, using the shorthand for [0].
    for path in [vec![0], vec![3], vec![1, 0, 2], vec![200]] {
        let mut out = Vec::new();
        write_header(&mut out, 99, &path);
        out.push(0x55);
        let f = parse_frame(&out, &mut idx).unwrap();
        assert_eq!((f.schema_id, &idx, f.message), (99, &path, &[0x55][..]));
    }
    let mut out = Vec::new();
    write_header(&mut out, 1, &[0]);
    assert_eq!(out, [0, 0, 0, 0, 1, 0]);
}

#[test]
fn framing_refuses_bad_frames_with_their_reason() {
    let mut idx = Vec::new();
    assert_eq!(
        parse_frame(&[0, 0, 0], &mut idx),
        Err(FramingError::TooShort { len: 3 })
    );
    assert_eq!(
        parse_frame(&[1, 0, 0, 0, 1, 0], &mut idx),
        Err(FramingError::BadMagic { byte: 1 })
    );
    let e = parse_frame(&[0, 0, 0, 0, 9], &mut idx).unwrap_err();
    assert_eq!(
        e.to_string(),
        "schema id 9: bad message-index array: the count is truncated or too long"
    );
    // Count -1 (zig-zag 1).
    let e = parse_frame(&[0, 0, 0, 0, 9, 1], &mut idx).unwrap_err();
    assert!(e.to_string().contains("negative count"), "{e}");
    // Count 2 but one index.
    let e = parse_frame(&[0, 0, 0, 0, 9, 4, 2], &mut idx).unwrap_err();
    assert!(e.to_string().contains("an index is truncated"), "{e}");
    // Index -1.
    let e = parse_frame(&[0, 0, 0, 0, 9, 2, 1], &mut idx).unwrap_err();
    assert!(e.to_string().contains("negative index"), "{e}");
    // 33 indexes.
    let e = parse_frame(&[0, 0, 0, 0, 9, 66], &mut idx).unwrap_err();
    assert!(e.to_string().contains("more than 32"), "{e}");
}

// ---------------------------------------------------------------- .proto text

const EVENT_PROTO: &str = r#"
syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Other { int32 x = 1; }
message Event {
  int64 id = 1;
  string name = 2;
  optional int32 level = 3;
  google.protobuf.Timestamp at = 4;
  google.protobuf.StringValue note = 5;
  Meta meta = 6;
  optional Meta opt_meta = 7;
  oneof choice { Meta one_meta = 8; int32 other = 9; }
  message Meta { string source = 1; uint32 port = 2; }
}
"#;

fn event() -> MessageDescriptor {
    let file = compile_proto("event.proto", EVENT_PROTO, &[]).expect("compiles");
    file.parent_pool().get_message_by_name("t.Event").unwrap()
}

fn encoder(msg: &MessageDescriptor, cols: Vec<ColumnSpec>) -> ProtoRowEncoder {
    ProtoRowEncoder::fixed(
        msg,
        Framing::Plain,
        cols,
        MappingOptions::default(),
        "event.proto",
    )
    .expect("plans")
}

fn ts(seconds: i64, nanos: i32) -> Vec<u8> {
    let mut t = Vec::new();
    put_key(&mut t, 1, 0);
    put_varint(&mut t, seconds as u64);
    put_key(&mut t, 2, 0);
    put_varint(&mut t, nanos as u32 as u64);
    t
}

#[test]
fn timestamps_land_exactly_or_are_refused() {
    let msg = event();
    let mut enc = encoder(&msg, vec![col("at", "DateTime64(3)", MissingValue::Reject)]);
    let mut m = Vec::new();
    put_len(&mut m, 4, &ts(1_700_000_000, 123_000_000));
    let mut out = Vec::new();
    enc.encode_message(&m, &mut out).unwrap();
    assert_eq!(out, 1_700_000_000_123i64.to_le_bytes());
    // Two occurrences merge: the seconds of the first, the nanos of the second.
    let mut m = Vec::new();
    let mut only_s = Vec::new();
    put_key(&mut only_s, 1, 0);
    put_varint(&mut only_s, 5);
    let mut only_ns = Vec::new();
    put_key(&mut only_ns, 2, 0);
    put_varint(&mut only_ns, 7_000_000);
    put_len(&mut m, 4, &only_s);
    put_len(&mut m, 4, &only_ns);
    out.clear();
    enc.encode_message(&m, &mut out).unwrap();
    assert_eq!(out, 5_007i64.to_le_bytes());
    // Microseconds into milliseconds: refused, not truncated.
    let mut m = Vec::new();
    put_len(&mut m, 4, &ts(1, 1_000));
    let e = enc.encode_message(&m, &mut Vec::new()).unwrap_err();
    assert_eq!(e.kind, RecordErrorKind::Encode);
    assert_eq!(e.column.as_deref(), Some("at"));
    assert!(e.reason.contains("below DateTime64(3)'s resolution"), "{e}");
    // A fraction into DateTime: refused, as the JSON mapper does.
    let mut enc = encoder(&msg, vec![col("at", "DateTime", MissingValue::Reject)]);
    let e = enc.encode_message(&m, &mut Vec::new()).unwrap_err();
    assert!(e.reason.contains("fraction of a second"), "{e}");
    let mut m = Vec::new();
    put_len(&mut m, 4, &ts(86_400, 0));
    out.clear();
    enc.encode_message(&m, &mut out).unwrap();
    assert_eq!(out, 86_400u32.to_le_bytes());
    // Absent, no default: a record error naming the column and field.
    let e = enc.encode_message(&[], &mut Vec::new()).unwrap_err();
    assert_eq!(e.column.as_deref(), Some("at"));
    assert_eq!(
        e.reason,
        "Protobuf schema `event.proto`, field `at`: absent, and the column is not Nullable and \
         has no DEFAULT spate can apply"
    );
}

#[test]
fn presence_decides_default_or_missing() {
    let msg = event();
    let cols = vec![
        // Implicit presence: absent is 0, even though the column has a DEFAULT.
        col("id", "Int64", MissingValue::Literal("42".into())),
        // Explicit presence: absent takes the DEFAULT.
        col("level", "Int32", MissingValue::Literal("-1".into())),
        col("note", "Nullable(String)", MissingValue::Null),
        col("meta_port", "UInt32", MissingValue::Literal("7".into())),
        col("missing_col", "String", MissingValue::Literal("'x'".into())),
    ];
    let opts = MappingOptions {
        flatten_join: Some("_".into()),
        ..MappingOptions::default()
    };
    let mut enc = ProtoRowEncoder::fixed(&msg, Framing::Plain, cols, opts, "event.proto").unwrap();
    let mut out = Vec::new();
    enc.encode_message(&[], &mut out).unwrap();
    let mut want = Vec::new();
    want.extend_from_slice(&0i64.to_le_bytes());
    want.extend_from_slice(&(-1i32).to_le_bytes());
    want.push(1);
    want.extend_from_slice(&7u32.to_le_bytes()); // meta absent: missing
    want.extend_from_slice(&[1, b'x']);
    assert_eq!(out, want);
    // meta present but empty: port is its default 0; an empty wrapper is "".
    let mut m = Vec::new();
    put_len(&mut m, 6, &[]);
    put_len(&mut m, 5, &[]);
    put_key(&mut m, 3, 0);
    put_varint(&mut m, 0);
    out.clear();
    enc.encode_message(&m, &mut out).unwrap();
    let mut want = Vec::new();
    want.extend_from_slice(&0i64.to_le_bytes());
    want.extend_from_slice(&0i32.to_le_bytes()); // present 0, not the DEFAULT
    want.extend_from_slice(&[0, 0]);
    want.extend_from_slice(&0u32.to_le_bytes());
    want.extend_from_slice(&[1, b'x']);
    assert_eq!(out, want);
}

#[test]
fn paths_go_through_optional_messages_not_oneof_ones() {
    let msg = event();
    let mut c = col("src", "Nullable(String)", MissingValue::Null);
    c.path = Some(vec!["opt_meta".into(), "source".into()]);
    let mut enc = encoder(&msg, vec![c.clone()]);
    let mut meta = Vec::new();
    put_len(&mut meta, 1, b"s1");
    let mut m = Vec::new();
    put_len(&mut m, 7, &meta);
    let mut out = Vec::new();
    enc.encode_message(&m, &mut out).unwrap();
    assert_eq!(out, [0, 2, b's', b'1']);
    out.clear();
    enc.encode_message(&[], &mut out).unwrap();
    assert_eq!(out, [1]);
    c.path = Some(vec!["one_meta".into(), "source".into()]);
    let e = ProtoRowEncoder::fixed(
        &msg,
        Framing::Plain,
        vec![c],
        MappingOptions::default(),
        "e",
    )
    .unwrap_err();
    assert!(e.to_string().contains("oneof member"), "{e}");
}

#[test]
fn plan_errors_name_schema_field_and_column() {
    let msg = event();
    let plan = |cols| {
        ProtoRowEncoder::fixed(
            &msg,
            Framing::Plain,
            cols,
            MappingOptions::default(),
            "event.proto",
        )
        .unwrap_err()
        .to_string()
    };
    assert_eq!(
        plan(vec![col("id", "Int32", MissingValue::Reject)]),
        "Protobuf schema `event.proto`, message `t.Event`, field `id`, column `id`: a proto Int64 \
         does not carry exactly into Int32 (see the table in crate::protobuf::plan)"
    );
    assert!(
        plan(vec![col("nope", "String", MissingValue::Reject)])
            .contains("field `nope`, column `nope`: the message has no such field")
    );
    assert!(plan(vec![col("meta", "String", MissingValue::Reject)]).contains("is a message"));
    assert!(
        plan(vec![col("name", "UInt64", MissingValue::Reject)]).contains("String does not carry")
    );
    assert!(plan(vec![col("at", "UInt64", MissingValue::Reject)]).contains("Timestamp goes into"));
    // A Kafka metadata column is refused, not left NULL (the Protobuf
    // encoder does not write metadata yet).
    let mut offset = col("_offset", "Nullable(UInt64)", MissingValue::Null);
    offset.meta = spate_row::meta::MetaSource::parse("_offset");
    let e = plan(vec![col("id", "Int64", MissingValue::Reject), offset]);
    assert!(
        e.contains("column `_offset`") && e.contains("Kafka metadata"),
        "{e}"
    );
}

#[test]
fn bad_input_is_a_decode_error_naming_schema_and_message() {
    let msg = event();
    let mut enc = encoder(
        &msg,
        vec![
            col("id", "Int64", MissingValue::Reject),
            col("name", "String", MissingValue::Reject),
        ],
    );
    let cases: [(&[u8], &str); 6] = [
        (&[0x08, 0xff], "truncated message"),
        (
            &[0x08 | 2, 0x01, 0x00],
            "field 1 has wire type 2, its type needs 0",
        ),
        (&[0x12, 0x05, b'a'], "truncated message"),
        (
            &[0x12, 0x01, 0xff],
            "field 2: a string that is not valid UTF-8",
        ),
        (&[0x0f], "field 1 has wire type 7"),
        (&[0x9f, 0x06], "invalid wire type 7 (field 99)"),
    ];
    for (bytes, text) in cases {
        let e = enc.encode_message(bytes, &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind, RecordErrorKind::Decode, "{bytes:?}");
        assert!(
            e.reason
                .starts_with("Protobuf schema `event.proto`, message `t.Event`: "),
            "{e}"
        );
        assert!(e.reason.contains(text), "{bytes:?}: {e}");
        assert!(DynamicMessage::decode(msg.clone(), bytes).is_err());
    }
    // An unknown field (number 99, every wire type, a group) is skipped.
    let mut m = vec![0x08, 0x05];
    put_key(&mut m, 99, 0);
    put_varint(&mut m, 300);
    put_key(&mut m, 99, 1);
    m.extend_from_slice(&[0; 8]);
    put_len(&mut m, 99, b"zz");
    put_key(&mut m, 99, 5);
    m.extend_from_slice(&[0; 4]);
    put_key(&mut m, 99, 3);
    put_key(&mut m, 1, 0);
    put_varint(&mut m, 1);
    put_key(&mut m, 99, 4);
    DynamicMessage::decode(msg.clone(), m.as_slice()).expect("prost-reflect skips them too");
    let mut out = Vec::new();
    enc.encode_message(&m, &mut out).unwrap();
    assert_eq!(out, [5, 0, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn confluent_frames_pick_the_message_by_index_and_cache_plans() {
    let file = compile_proto("event.proto", EVENT_PROTO, &[]).unwrap();
    let mut src = FileSchemaSource::new();
    src.insert(7, file);
    let mut enc = ProtoRowEncoder::confluent(
        Arc::new(src),
        vec![col("x", "Int32", MissingValue::Reject)],
        MappingOptions::default(),
    )
    .unwrap();
    // [0] is Other, which has x.
    let mut m = Vec::new();
    write_header(&mut m, 7, &[0]);
    m.extend_from_slice(&[0x08, 0x03]);
    let mut out = Vec::new();
    enc.encode_message(&m, &mut out).unwrap();
    assert_eq!(out, 3i32.to_le_bytes());
    // [1] is Event, which has no x: a plan error naming the schema id.
    let mut m = Vec::new();
    write_header(&mut m, 7, &[1]);
    let e = enc.encode_message(&m, &mut Vec::new()).unwrap_err();
    assert_eq!(e.kind, RecordErrorKind::Decode);
    assert_eq!(e.column.as_deref(), Some("x"));
    assert!(
        e.reason
            .starts_with("Protobuf schema id 7, message `t.Event`, field `x`, column `x`"),
        "{e}"
    );
    // [5]: no such message.
    let mut m = Vec::new();
    write_header(&mut m, 7, &[5]);
    let e = enc.encode_message(&m, &mut Vec::new()).unwrap_err();
    assert_eq!(
        e.reason,
        "Protobuf schema id 7: the message indexes [5] name no message in `event.proto`"
    );
    // [1, 0] is Event.Meta (no x either), [1, 1] nothing.
    let mut m = Vec::new();
    write_header(&mut m, 7, &[1, 1]);
    let e = enc.encode_message(&m, &mut Vec::new()).unwrap_err();
    assert!(e.reason.contains("[1, 1] name no message"), "{e}");
    // Unknown schema id.
    let mut m = Vec::new();
    write_header(&mut m, 8, &[0]);
    let e = enc.encode_message(&m, &mut Vec::new()).unwrap_err();
    assert_eq!(
        e.reason,
        "Protobuf schema id 8: unknown to the schema source"
    );
    // Not a frame.
    let e = enc
        .encode_message(&[0x08, 0x03], &mut Vec::new())
        .unwrap_err();
    assert!(e.reason.contains("too short"), "{e}");
}

/// A source that counts its lookups.
struct Counting(FileSchemaSource, std::sync::atomic::AtomicUsize);

impl super::ProtoSchemaSource for Counting {
    fn descriptor(&self, id: u32) -> Result<prost_reflect::FileDescriptor, super::SchemaError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.descriptor(id)
    }
}

#[test]
fn the_chain_path_decodes_records_and_asks_the_source_once_per_schema() {
    let file = compile_proto("event.proto", EVENT_PROTO, &[]).unwrap();
    let mut files = FileSchemaSource::new();
    files.insert(7, file.clone()).insert(8, file);
    let source = Arc::new(Counting(files, Default::default()));
    let mapping = super::ProtoMapping::confluent(
        source.clone(),
        vec![col("x", "Int32", MissingValue::Literal("-1".into()))],
        MappingOptions::default(),
    )
    .unwrap();
    // Two threads' worth of decoders and encoders.
    let (mut d1, mut e1) = (mapping.decoder(), mapping.encoder());
    let (mut d2, mut e2) = (mapping.decoder(), mapping.encoder());
    let frame = |id: u32, idx: &[i32], x: u8| {
        let mut m = Vec::new();
        write_header(&mut m, id, idx);
        m.extend_from_slice(&[0x08, x]);
        m
    };
    let msgs = [
        frame(7, &[0], 1),
        frame(8, &[0], 2),
        frame(7, &[1, 0], 3),
        frame(7, &[0], 4),
    ];
    for _ in 0..3 {
        for (k, m) in msgs.iter().enumerate() {
            for (d, e) in [(&mut d1, &mut e1), (&mut d2, &mut e2)] {
                let r = d.decode_value(Some(m)).unwrap();
                assert_eq!(r.schema_id(), Some(if k == 1 { 8 } else { 7 }));
                let mut out = Vec::new();
                e.encode_record(&r, &mut out).unwrap();
                let mut direct = Vec::new();
                e.encode_message(m, &mut direct).unwrap();
                assert_eq!(out, direct);
                // Event.Meta ([1, 0]) has no x: the column's DEFAULT.
                let want: i32 = if k == 2 {
                    -1
                } else {
                    i32::from(m[m.len() - 1])
                };
                assert_eq!(out, want.to_le_bytes());
            }
        }
    }
    // Three (id, message) pairs, each fetched once for all four threads.
    assert_eq!(source.1.load(std::sync::atomic::Ordering::Relaxed), 3);
    let e = d1.decode_value(None).unwrap_err();
    assert!(e.reason.contains("tombstone"), "{e}");
}

#[test]
fn descriptor_set_files_load() {
    let file = compile_proto("event.proto", EVENT_PROTO, &[]).unwrap();
    let set = file.parent_pool().encode_to_vec();
    let dir = std::env::temp_dir().join(format!("spate-proto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("event.pb");
    std::fs::write(&path, set).unwrap();
    let mut enc = ProtoRowEncoder::from_descriptor_set(
        &path,
        "t.Event",
        Framing::Confluent,
        vec![col("name", "String", MissingValue::Reject)],
        MappingOptions::default(),
    )
    .unwrap();
    let mut m = Vec::new();
    write_header(&mut m, 1, &[1]);
    put_len(&mut m, 2, b"hi");
    let mut out = Vec::new();
    enc.encode_message(&m, &mut out).unwrap();
    assert_eq!(out, [2, b'h', b'i']);
    let e = ProtoRowEncoder::from_descriptor_set(
        &path,
        "t.Nope",
        Framing::Plain,
        vec![col("name", "String", MissingValue::Reject)],
        MappingOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("has no message `t.Nope`"), "{e}");
    // .proto text that does not compile, or imports what is not there.
    let e = compile_proto("bad.proto", "syntax = \"proto3\"; message {", &[]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("schema `bad.proto`: the .proto text does not compile: "),
        "{e}"
    );
    let e = compile_proto(
        "imp.proto",
        "syntax = \"proto3\"; import \"dep.proto\";",
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("dep.proto"), "{e}");
    let dep = (
        "dep.proto".to_owned(),
        "syntax = \"proto3\"; package d; message D { int32 x = 1; }".to_owned(),
    );
    let f = compile_proto(
        "imp.proto",
        "syntax = \"proto3\"; import \"dep.proto\"; message M { d.D d = 1; }",
        &[dep],
    )
    .unwrap();
    assert!(f.parent_pool().get_message_by_name("d.D").is_some());
    let mut src = FileSchemaSource::new();
    src.add_descriptor_set(3, &path, "event.proto").unwrap();
    assert!(src.add_descriptor_set(3, &path, "other.proto").is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------- the oracle

/// The 16 scalar kinds, with the column types that take them (the first
/// is the narrowest).
const KINDS: [(Type, &[&str]); 16] = [
    (Type::Int32, &["Int32", "Int64", "Int256"]),
    (Type::Int64, &["Int64", "Int128"]),
    (Type::Uint32, &["UInt32", "Int64", "UInt256"]),
    (Type::Uint64, &["UInt64", "Int128"]),
    (Type::Sint32, &["Int32", "Int64"]),
    (Type::Sint64, &["Int64"]),
    (Type::Fixed32, &["UInt32", "UInt64"]),
    (Type::Fixed64, &["UInt64"]),
    (Type::Sfixed32, &["Int32", "Int128"]),
    (Type::Sfixed64, &["Int64"]),
    (Type::Bool, &["Bool", "UInt8"]),
    (Type::Float, &["Float32", "Float64"]),
    (Type::Double, &["Float64"]),
    (Type::String, &["String"]),
    (Type::Bytes, &["String"]),
    (
        Type::Enum,
        &["String", "Int32", "Enum8('E0' = 10, 'E1' = 11, 'E5' = -3)"],
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lab {
    Implicit,
    Optional,
    Packed,
    Unpacked,
}

/// One generated top-level scalar field: kind index, label, column type pick.
#[derive(Clone, Debug)]
struct GenField {
    kind: usize,
    label: Lab,
    pick: usize,
    nullable: bool,
}

fn field(name: &str, number: i32, t: Type, label: Lab) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        r#type: Some(t as i32),
        label: Some(if matches!(label, Lab::Packed | Lab::Unpacked) {
            PLabel::Repeated
        } else {
            PLabel::Optional
        } as i32),
        type_name: (t == Type::Enum).then(|| ".t.E".to_owned()),
        options: (label == Lab::Unpacked).then(|| FieldOptions {
            packed: Some(false),
            ..FieldOptions::default()
        }),
        ..FieldDescriptorProto::default()
    }
}

fn msg_field(name: &str, number: i32, type_name: &str, repeated: bool) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        r#type: Some(Type::Message as i32),
        label: Some(if repeated {
            PLabel::Repeated
        } else {
            PLabel::Optional
        } as i32),
        type_name: Some(type_name.into()),
        ..FieldDescriptorProto::default()
    }
}

fn map_entry(name: &str, k: Type, v: Type) -> DescriptorProto {
    DescriptorProto {
        name: Some(name.into()),
        field: vec![
            field("key", 1, k, Lab::Implicit),
            field("value", 2, v, Lab::Implicit),
        ],
        options: Some(MessageOptions {
            map_entry: Some(true),
            ..MessageOptions::default()
        }),
        ..DescriptorProto::default()
    }
}

/// Field numbers: generated scalars 1..=16; n = 40 (N { a = 1 int32, s = 2
/// string, o = 3 optional sint64, r = 4 repeated fixed32 }); m1 = 41
/// map<string, int64>; m2 = 42 map<int32, string>; oneof choice { o1 = 43
/// int32, o2 = 44 string, o3 = 45 bool (no column) }.
fn schema(fields: &[GenField]) -> MessageDescriptor {
    let mut t = DescriptorProto {
        name: Some("T".into()),
        ..DescriptorProto::default()
    };
    for (i, g) in fields.iter().enumerate() {
        let mut f = field(&format!("f{i}"), i as i32 + 1, KINDS[g.kind].0, g.label);
        if g.label == Lab::Optional {
            f.proto3_optional = Some(true);
            f.oneof_index = Some(t.oneof_decl.len() as i32);
            t.oneof_decl.push(OneofDescriptorProto {
                name: Some(format!("_f{i}")),
                ..OneofDescriptorProto::default()
            });
        }
        t.field.push(f);
    }
    t.field.push(msg_field("n", 40, ".t.N", false));
    t.field.push(msg_field("m1", 41, ".t.T.M1Entry", true));
    t.field.push(msg_field("m2", 42, ".t.T.M2Entry", true));
    t.nested_type
        .push(map_entry("M1Entry", Type::String, Type::Int64));
    t.nested_type
        .push(map_entry("M2Entry", Type::Int32, Type::String));
    let choice = t.oneof_decl.len() as i32;
    t.oneof_decl.push(OneofDescriptorProto {
        name: Some("choice".into()),
        ..OneofDescriptorProto::default()
    });
    for (name, number, ty) in [
        ("o1", 43, Type::Int32),
        ("o2", 44, Type::String),
        ("o3", 45, Type::Bool),
    ] {
        let mut f = field(name, number, ty, Lab::Implicit);
        f.oneof_index = Some(choice);
        t.field.push(f);
    }
    let mut r = field("r", 4, Type::Fixed32, Lab::Packed);
    r.options = None;
    let mut o = field("o", 3, Type::Sint64, Lab::Optional);
    o.proto3_optional = Some(true);
    o.oneof_index = Some(0);
    let n = DescriptorProto {
        name: Some("N".into()),
        field: vec![
            field("a", 1, Type::Int32, Lab::Implicit),
            field("s", 2, Type::String, Lab::Implicit),
            o,
            r,
        ],
        oneof_decl: vec![OneofDescriptorProto {
            name: Some("_o".into()),
            ..OneofDescriptorProto::default()
        }],
        ..DescriptorProto::default()
    };
    let e = EnumDescriptorProto {
        name: Some("E".into()),
        value: [("E0", 0), ("E1", 1), ("E5", 5)]
            .iter()
            .map(|(n, v)| EnumValueDescriptorProto {
                name: Some((*n).into()),
                number: Some(*v),
                ..EnumValueDescriptorProto::default()
            })
            .collect(),
        ..EnumDescriptorProto::default()
    };
    let file = FileDescriptorProto {
        name: Some("t.proto".into()),
        package: Some("t".into()),
        syntax: Some("proto3".into()),
        message_type: vec![t, n],
        enum_type: vec![e],
        ..FileDescriptorProto::default()
    };
    let pool = DescriptorPool::from_file_descriptor_set(FileDescriptorSet { file: vec![file] })
        .expect("the generated schema is valid");
    pool.get_message_by_name("t.T").unwrap()
}

fn columns(fields: &[GenField]) -> Vec<ColumnSpec> {
    let mut cols = Vec::new();
    for (i, g) in fields.iter().enumerate() {
        let choices = KINDS[g.kind].1;
        let base = choices[g.pick % choices.len()];
        let t = match g.label {
            Lab::Packed | Lab::Unpacked => format!("Array({base})"),
            Lab::Optional => format!("Nullable({base})"),
            Lab::Implicit if g.nullable => format!("Nullable({base})"),
            Lab::Implicit => base.to_owned(),
        };
        cols.push((format!("f{i}"), ty(&t)));
    }
    for (n, t) in [
        ("n_a", "Int64"),
        ("n_s", "Nullable(String)"),
        ("n_o", "Nullable(Int64)"),
        ("n_r", "Array(UInt32)"),
        ("m1", "Map(String, Int64)"),
        ("m2", "Map(Int32, String)"),
        ("o1", "Nullable(Int32)"),
        ("o2", "Nullable(String)"),
    ] {
        cols.push((n.to_owned(), ty(t)));
    }
    let mut specs = simple_columns(cols.iter().map(|(n, t)| (n.as_str(), t.clone())));
    // n_a reads through the nested message with an explicit path; n_s by
    // the flatten join; n_o, n_r likewise.
    specs[fields.len()].path = Some(vec!["n".into(), "a".into()]);
    // A non-Nullable column under an absent message needs a missing value.
    specs[fields.len()].missing = MissingValue::Literal("-7".into());
    specs
}

/// One occurrence to put on the wire.
#[derive(Clone, Debug)]
struct Op {
    sel: u8,
    v: u64,
    bytes: Vec<u8>,
    mode: u8,
}

fn put_scalar_value(out: &mut Vec<u8>, t: Type, v: u64, bytes: &[u8], mode: u8) {
    match t {
        Type::Fixed32 | Type::Sfixed32 | Type::Float => {
            out.extend_from_slice(&(v as u32).to_le_bytes())
        }
        Type::Fixed64 | Type::Sfixed64 | Type::Double => out.extend_from_slice(&v.to_le_bytes()),
        Type::String | Type::Bytes => {
            let s: Vec<u8> = if t == Type::String && mode % 11 != 0 {
                String::from_utf8_lossy(bytes).into_owned().into_bytes()
            } else {
                bytes.to_vec()
            };
            put_varint(out, s.len() as u64);
            out.extend_from_slice(&s);
        }
        // Enums: mostly declared numbers, sometimes an undeclared one.
        Type::Enum => put_varint(out, [0, 1, 5, 7, 0xffff_ffff_ffff_fff0][(v % 5) as usize]),
        _ => {
            // Varints: small, large, and 64-bit values (int32 truncates).
            let x = match mode % 3 {
                0 => v % 300,
                1 => v,
                _ => v >> (v % 64),
            };
            put_varint(out, x);
        }
    }
}

fn wire_type(t: Type) -> u8 {
    match t {
        Type::Fixed32 | Type::Sfixed32 | Type::Float => 5,
        Type::Fixed64 | Type::Sfixed64 | Type::Double => 1,
        Type::String | Type::Bytes => 2,
        _ => 0,
    }
}

fn encode_ops(fields: &[GenField], ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    // Half the messages carry an (empty) n, so its columns take defaults.
    if ops.len() % 2 == 0 {
        put_len(&mut out, 40, &[]);
    }
    let nf = fields.len() as u8;
    for op in ops {
        let sel = op.sel % (nf + 8);
        if sel < nf {
            let g = &fields[sel as usize];
            let t = KINDS[g.kind].0;
            let number = u32::from(sel) + 1;
            let packable = wire_type(t) != 2;
            if matches!(g.label, Lab::Packed | Lab::Unpacked) && packable && op.mode % 2 == 0 {
                let mut run = Vec::new();
                for k in 0..(op.mode / 2 % 4) {
                    put_scalar_value(
                        &mut run,
                        t,
                        op.v.rotate_left(u32::from(k) * 13),
                        &op.bytes,
                        op.mode,
                    );
                }
                put_len(&mut out, number, &run);
            } else {
                put_key(&mut out, number, wire_type(t));
                put_scalar_value(&mut out, t, op.v, &op.bytes, op.mode);
            }
            continue;
        }
        match sel - nf {
            0 => {
                // n: a few of its fields, in any order.
                let mut sub = Vec::new();
                for k in 0..(op.mode % 4) {
                    let v = op.v.rotate_left(u32::from(k) * 7);
                    match (v >> 3) % 4 {
                        0 => {
                            put_key(&mut sub, 1, 0);
                            put_scalar_value(&mut sub, Type::Int32, v, &op.bytes, op.mode);
                        }
                        1 => {
                            put_key(&mut sub, 2, 2);
                            put_scalar_value(&mut sub, Type::String, v, &op.bytes, op.mode);
                        }
                        2 => {
                            put_key(&mut sub, 3, 0);
                            put_scalar_value(&mut sub, Type::Sint64, v, &op.bytes, op.mode);
                        }
                        _ => {
                            put_key(&mut sub, 4, 5);
                            put_scalar_value(&mut sub, Type::Fixed32, v, &op.bytes, op.mode);
                        }
                    }
                }
                put_len(&mut out, 40, &sub);
            }
            1 | 2 => {
                // A map entry; a small key space so keys repeat; key or
                // value sometimes left out.
                let mut e = Vec::new();
                let (kt, vt, number) = if sel - nf == 1 {
                    (Type::String, Type::Int64, 41)
                } else {
                    (Type::Int32, Type::String, 42)
                };
                if op.mode % 5 != 1 {
                    put_key(&mut e, 1, wire_type(kt));
                    let kb = [b'k', b'0' + (op.v % 3) as u8];
                    put_scalar_value(&mut e, kt, op.v % 3, &kb, 1);
                }
                if op.mode % 5 != 2 {
                    put_key(&mut e, 2, wire_type(vt));
                    put_scalar_value(&mut e, vt, op.v, &op.bytes, op.mode);
                }
                put_len(&mut out, number, &e);
            }
            3 => {
                put_key(&mut out, 43, 0);
                put_scalar_value(&mut out, Type::Int32, op.v, &op.bytes, op.mode);
            }
            4 => {
                put_key(&mut out, 44, 2);
                put_scalar_value(&mut out, Type::String, op.v, &op.bytes, op.mode);
            }
            5 => {
                put_key(&mut out, 45, 0);
                put_varint(&mut out, op.v % 2);
            }
            _ => {
                // Unknown fields of every wire type but groups.
                let number = 1000 + (op.v % 7) as u32;
                match op.mode % 4 {
                    0 => {
                        put_key(&mut out, number, 0);
                        put_varint(&mut out, op.v);
                    }
                    1 => {
                        put_key(&mut out, number, 1);
                        out.extend_from_slice(&op.v.to_le_bytes());
                    }
                    2 => put_len(&mut out, number, &op.bytes),
                    _ => {
                        put_key(&mut out, number, 5);
                        out.extend_from_slice(&(op.v as u32).to_le_bytes());
                    }
                }
            }
        }
    }
    out
}

/// What the oracle expects for one column: a value, or a record error.
fn expect_value(v: &PValue, t: &ChType) -> Result<Value, ()> {
    let t = t.without_low_cardinality();
    if let ChType::Nullable(inner) = t {
        return expect_value(v, inner);
    }
    Ok(match (v, t) {
        (PValue::List(items), ChType::Array(e)) => Value::Array(
            items
                .iter()
                .map(|x| expect_value(x, e))
                .collect::<Result<_, _>>()?,
        ),
        (PValue::Map(m), ChType::Map(kt, vt)) => {
            let mut entries = Vec::new();
            for (k, x) in m {
                let k = match k {
                    MapKey::String(s) => PValue::String(s.clone()),
                    MapKey::I32(i) => PValue::I32(*i),
                    other => panic!("key {other:?}"),
                };
                entries.push((expect_value(&k, kt)?, expect_value(x, vt)?));
            }
            Value::Map(entries)
        }
        (PValue::Bool(b), ChType::Bool) => Value::Bool(*b),
        (PValue::Bool(b), _) => Value::Int(Wide::from_i128(i128::from(*b))),
        (PValue::I32(x), _) => Value::Int(Wide::from_i128(i128::from(*x))),
        (PValue::I64(x), _) => Value::Int(Wide::from_i128(i128::from(*x))),
        (PValue::U32(x), _) => Value::Int(Wide::from_i128(i128::from(*x))),
        (PValue::U64(x), _) => Value::Int(Wide::from_i128(i128::from(*x))),
        (PValue::F32(x), ChType::Float32) => Value::Float32(*x),
        (PValue::F32(x), _) => Value::Float64(f64::from(*x)),
        (PValue::F64(x), _) => Value::Float64(*x),
        (PValue::String(s), _) => Value::String(s.as_bytes().to_vec()),
        (PValue::Bytes(b), _) => Value::String(b.to_vec()),
        (PValue::EnumNumber(n), ChType::String) => {
            let name = match n {
                0 => "E0",
                1 => "E1",
                5 => "E5",
                _ => return Err(()),
            };
            Value::String(name.as_bytes().to_vec())
        }
        (PValue::EnumNumber(n), ChType::Enum8(_)) => Value::Enum(match n {
            0 => 10,
            1 => 11,
            5 => -3,
            _ => return Err(()),
        }),
        (PValue::EnumNumber(n), _) => Value::Int(Wide::from_i128(i128::from(*n))),
        other => panic!("oracle: {other:?}"),
    })
}

/// The oracle's row: each column's value (NULL for an absent field with
/// presence) or the first column that must fail.
fn oracle_row(m: &DynamicMessage, cols: &[ColumnSpec]) -> Result<Vec<Value>, String> {
    let desc = m.descriptor();
    let mut row = Vec::new();
    for c in cols {
        let path: Vec<&str> = match c.name.split_once('_') {
            Some(("n", rest)) => vec!["n", rest],
            _ => vec![c.name.as_str()],
        };
        let (msg, fname) = if path.len() == 2 {
            let nf = desc.get_field_by_name("n").unwrap();
            if !m.has_field(&nf) {
                row.push(match &c.missing {
                    MissingValue::Literal(l) if l == "-7" => Value::Int(Wide::from_i128(-7)),
                    MissingValue::Null => Value::Null,
                    // n_r: an Array with no missing value.
                    _ => return Err(c.name.clone()),
                });
                continue;
            }
            (m.get_field(&nf).as_message().unwrap().clone(), path[1])
        } else {
            (m.clone(), path[0])
        };
        let f = msg.descriptor().get_field_by_name(fname).unwrap();
        if f.supports_presence() && !msg.has_field(&f) {
            row.push(Value::Null);
            continue;
        }
        match expect_value(&msg.get_field(&f), &c.ty) {
            Ok(v) => row.push(v),
            Err(()) => return Err(c.name.clone()),
        }
    }
    Ok(row)
}

/// Map entries in a canonical order (the decoder keeps arrival order,
/// prost-reflect a hash map), recursively.
fn canon(v: Value) -> Value {
    match v {
        Value::Map(mut e) => {
            e.sort_by_key(|(k, _)| format!("{k:?}"));
            Value::Map(e)
        }
        other => other,
    }
}

fn gen_field() -> impl Strategy<Value = GenField> {
    (0..16usize, 0..4u8, 0..3usize, any::<bool>()).prop_map(|(kind, l, pick, nullable)| GenField {
        kind,
        label: [Lab::Implicit, Lab::Optional, Lab::Packed, Lab::Unpacked][l as usize],
        pick,
        nullable,
    })
}

fn gen_op() -> impl Strategy<Value = Op> {
    (
        any::<u8>(),
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..6),
        any::<u8>(),
    )
        .prop_map(|(sel, v, bytes, mode)| Op {
            sel,
            v,
            bytes,
            mode,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    /// The hot-path decoder writes the row prost-reflect's DynamicMessage
    /// implies (values, defaults, NULLs, merged nested messages, last-wins
    /// scalars, concatenated packed/unpacked lists, last-wins map keys,
    /// oneof clearing), refuses what it refuses, and fails the same column
    /// when a value cannot be written.
    #[test]
    fn decoder_agrees_with_dynamic_message(
        fields in proptest::collection::vec(gen_field(), 1..16),
        ops in proptest::collection::vec(gen_op(), 0..24),
        cut in any::<u16>(),
    ) {
        let desc = schema(&fields);
        let cols = columns(&fields);
        let opts = MappingOptions { flatten_join: Some("_".into()), ..MappingOptions::default() };
        let mut enc = ProtoRowEncoder::fixed(&desc, Framing::Plain, cols.clone(), opts, "t.proto")
            .expect("the generated columns plan");
        let mut bytes = encode_ops(&fields, &ops);
        // Sometimes cut the message short.
        if cut % 5 == 0 && !bytes.is_empty() {
            bytes.truncate(usize::from(cut) % bytes.len());
        }
        let mut out = vec![0xAA];
        let got = enc.encode_message(&bytes, &mut out);
        match DynamicMessage::decode(desc.clone(), bytes.as_slice()) {
            Err(e) => {
                let got = got.expect_err("prost-reflect refused it");
                prop_assert_eq!(got.kind, RecordErrorKind::Decode, "{} vs {}", got, e);
            }
            Ok(m) => match oracle_row(&m, &cols) {
                Err(column) => {
                    let got = got.expect_err("a value cannot be written");
                    prop_assert_eq!(got.column.as_deref(), Some(column.as_str()), "{}", got);
                }
                Ok(want) => {
                    got.map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    prop_assert_eq!(out[0], 0xAA);
                    let mut rest = &out[1..];
                    for (c, w) in cols.iter().zip(want) {
                        let v = rowbinary::decode::decode(&c.ty, &mut rest)
                            .map_err(|e| TestCaseError::fail(format!("{}: {e}", c.name)))?;
                        let (mut a, mut b) = (Vec::new(), Vec::new());
                        rowbinary::encode(&c.ty, &canon(v.clone()), &mut a).unwrap();
                        rowbinary::encode(&c.ty, &canon(w.clone()), &mut b)
                            .map_err(|e| TestCaseError::fail(format!("{}: {e}", c.name)))?;
                        prop_assert_eq!(a, b, "column {}: got {:?}, want {:?}", c.name, v, w);
                    }
                    prop_assert!(rest.is_empty(), "trailing bytes");
                }
            },
        }
    }
}

#[test]
fn sensor_rows_land_as_the_formulas_say() {
    let file = compile_proto("sensor.proto", sensor::SENSOR_PROTO, &[]).unwrap();
    let msg = file
        .parent_pool()
        .get_message_by_name(sensor::SENSOR_MESSAGE)
        .unwrap();
    let cols = sensor::sensor_columns();
    let mut enc = ProtoRowEncoder::fixed(
        &msg,
        Framing::Plain,
        cols.clone(),
        MappingOptions::default(),
        "sensor.proto",
    )
    .unwrap();
    let (mut m, mut scratch, mut out) = (Vec::new(), Vec::new(), Vec::new());
    for (i, j) in [(0u64, 0u64), (1, 4), (10, 5), (13, 99), (4, 0), (9_999, 37)] {
        m.clear();
        sensor::sensor_row(i, j, &mut m, &mut scratch);
        // prost-reflect reads the generator's bytes as the message.
        let dm = DynamicMessage::decode(msg.clone(), m.as_slice()).unwrap();
        assert_eq!(dm.get_field_by_name("batch_id").unwrap().as_u64(), Some(i));
        out.clear();
        enc.encode_message(&m, &mut out).unwrap();
        let k = i * 100 + j;
        let produced_at = 1_700_000_000_000 + i * 10;
        let unit = if k % 8 == 0 {
            "drop"
        } else {
            ["C", "hPa", "pct"][(k % 3) as usize]
        };
        let int = |v: u64| Value::Int(Wide::from_u128(u128::from(v)));
        let want = [
            int(i),
            Value::String(format!("gw-{}", i % 16).into_bytes()),
            Value::String(
                if i % 10 == 0 {
                    "unknown".into()
                } else {
                    format!("eu-{}", i % 4)
                }
                .into_bytes(),
            ),
            int(produced_at),
            int(j),
            int(k % 1024),
            Value::String(format!("sensor-{}", k % 1024).into_bytes()),
            Value::Float64((k % 4000) as f64 * 0.25 - 100.0),
            if j % 5 == 0 {
                Value::Null
            } else {
                Value::Int(Wide::from_i128(i128::from((j % 3) as i32)))
            },
            Value::String(unit.as_bytes().to_vec()),
            int(produced_at * 1000 + j),
        ];
        let mut expect = Vec::new();
        for (c, v) in cols.iter().zip(&want) {
            rowbinary::encode(&c.ty, v, &mut expect).unwrap();
        }
        assert_eq!(out, expect, "batch {i} event {j}");
    }
}

#[test]
fn varints_of_every_length_read_back() {
    // Field 1 (int64) through the one-word path (up to 8 bytes with 8 at
    // hand), the ten-byte path and the byte loop near the end.
    let msg = event();
    let mut enc = encoder(&msg, vec![col("id", "Int64", MissingValue::Reject)]);
    for shift in 0..64 {
        for v in [1u64 << shift, (1u64 << shift) - 1, u64::MAX >> shift] {
            for pad in [0usize, 12] {
                let mut m = vec![0x08];
                put_varint(&mut m, v);
                // An unknown field after it, so the word load has bytes.
                if pad > 0 {
                    put_len(&mut m, 99, &vec![0xff; pad]);
                }
                let mut out = Vec::new();
                enc.encode_message(&m, &mut out).unwrap();
                assert_eq!(out, v.to_le_bytes(), "{v:#x} pad {pad}");
            }
        }
    }
    // An 11-byte varint is refused, as is a 10th byte above 1.
    let mut m = vec![0x08];
    m.extend_from_slice(&[0xff; 10]);
    m.push(0x01);
    assert!(enc.encode_message(&m, &mut Vec::new()).is_err());
    let mut m = vec![0x08];
    m.extend_from_slice(&[0xff; 9]);
    m.push(0x02);
    let e = enc.encode_message(&m, &mut Vec::new()).unwrap_err();
    assert!(e.reason.contains("longer than 64 bits"), "{e}");
    assert!(DynamicMessage::decode(msg, m.as_slice()).is_err());
}

#[test]
fn server_defaults_write_row_binary_with_defaults_markers() {
    let msg = event();
    let cols = vec![
        col("id", "Int64", MissingValue::Reject),
        col("level", "Int32", MissingValue::ServerDefault),
        col("note", "Nullable(String)", MissingValue::Null),
        col("name", "String", MissingValue::ServerDefault),
    ];
    let mut enc = encoder(&msg, cols);
    assert!(enc.with_defaults());
    // level absent (explicit presence): the server's DEFAULT; name absent
    // (implicit presence): its value "", never the DEFAULT.
    let mut out = Vec::new();
    enc.encode_message(&[0x08, 0x02], &mut out).unwrap();
    let mut want = vec![0];
    want.extend_from_slice(&2i64.to_le_bytes());
    want.push(1); // level: DEFAULT marker, no value
    want.extend_from_slice(&[0, 1]); // note: a value (marker 0) that is NULL
    want.extend_from_slice(&[0, 0]); // name: marker 0, ""
    assert_eq!(out, want);
    let mut m = vec![0x08, 0x02, 0x18, 0x05];
    put_len(&mut m, 5, &[]);
    out.clear();
    enc.encode_message(&m, &mut out).unwrap();
    let mut want = vec![0];
    want.extend_from_slice(&2i64.to_le_bytes());
    want.push(0);
    want.extend_from_slice(&5i32.to_le_bytes());
    want.extend_from_slice(&[0, 0, 0]); // note: marker, not NULL, ""
    want.extend_from_slice(&[0, 0]);
    assert_eq!(out, want);
}

const WKT_PROTO: &str = r#"
syntax = "proto3";
package w;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message W {
  google.protobuf.Timestamp at = 1;
  google.protobuf.Int64Value i64 = 2;
  google.protobuf.UInt32Value u32 = 3;
  google.protobuf.StringValue s = 4;
  google.protobuf.BoolValue b = 5;
  google.protobuf.DoubleValue d = 6;
  google.protobuf.BytesValue by = 7;
}
"#;

/// (field number, value wire type, column type) of W's fields.
const WKT_FIELDS: [(u32, Type, &str); 7] = [
    (1, Type::Message, "Nullable(DateTime64(9))"),
    (2, Type::Int64, "Nullable(Int64)"),
    (3, Type::Uint32, "Nullable(UInt64)"),
    (4, Type::String, "Nullable(String)"),
    (5, Type::Bool, "Nullable(Bool)"),
    (6, Type::Double, "Nullable(Float64)"),
    (7, Type::Bytes, "Nullable(String)"),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Timestamps and wrappers: occurrences merge, an empty one is the
    /// default value, an absent one NULL, as prost-reflect decodes them;
    /// a Timestamp prost-reflect holds but DateTime64(9) cannot (nanos out
    /// of range, ticks beyond Int64) fails its column.
    #[test]
    fn well_known_types_agree_with_dynamic_message(ops in proptest::collection::vec(gen_op(), 0..12)) {
        let file = compile_proto("w.proto", WKT_PROTO, &[]).unwrap();
        let desc = file.parent_pool().get_message_by_name("w.W").unwrap();
        let names = ["at", "i64", "u32", "s", "b", "d", "by"];
        let cols = simple_columns(names.iter().zip(WKT_FIELDS).map(|(n, f)| (*n, ty(f.2))));
        let mut enc = ProtoRowEncoder::fixed(&desc, Framing::Plain, cols.clone(), MappingOptions::default(), "w")
            .unwrap();
        let mut bytes = Vec::new();
        for op in &ops {
            let (number, t, _) = WKT_FIELDS[usize::from(op.sel) % 7];
            let mut sub = Vec::new();
            for k in 0..(op.mode % 3) {
                let v = op.v.rotate_left(u32::from(k) * 11);
                if t == Type::Message {
                    // seconds or nanos, mostly in range.
                    if v % 2 == 0 {
                        put_key(&mut sub, 1, 0);
                        put_varint(&mut sub, if op.mode % 4 == 0 { v } else { (v >> 30) % 4_000_000_000 });
                    } else {
                        put_key(&mut sub, 2, 0);
                        put_varint(&mut sub, if op.mode % 5 == 0 { v } else { v % 1_000_000_000 });
                    }
                } else if v % 7 == 0 {
                    put_len(&mut sub, 9, b"unknown");
                } else {
                    put_key(&mut sub, 1, wire_type(t));
                    put_scalar_value(&mut sub, t, v, &op.bytes, op.mode);
                }
            }
            put_len(&mut bytes, number, &sub);
        }
        // Twice: the scratch carries nothing from one message to the next.
        let first = enc.encode_message(&bytes, &mut Vec::new()).is_ok();
        let mut out = Vec::new();
        let got_row = enc.encode_message(&bytes, &mut out);
        prop_assert_eq!(first, got_row.is_ok());
        let m = match DynamicMessage::decode(desc.clone(), bytes.as_slice()) {
            Err(_) => {
                let e = got_row.expect_err("prost-reflect refused it");
                prop_assert_eq!(e.kind, RecordErrorKind::Decode);
                return Ok(());
            }
            Ok(m) => m,
        };
        let mut want = Vec::new();
        let mut failing = None;
        for (c, name) in cols.iter().zip(names) {
            let f = desc.get_field_by_name(name).unwrap();
            if !m.has_field(&f) {
                want.push(Value::Null);
                continue;
            }
            let inner = m.get_field(&f).as_message().unwrap().clone();
            if name == "at" {
                let s = inner.get_field_by_name("seconds").unwrap().as_i64().unwrap();
                let ns = inner.get_field_by_name("nanos").unwrap().as_i32().unwrap();
                let ticks = s.checked_mul(1_000_000_000).and_then(|t| t.checked_add(i64::from(ns)));
                match ticks {
                    Some(t) if (0..1_000_000_000).contains(&ns) => want.push(Value::DateTime64(t)),
                    _ => {
                        failing.get_or_insert(c.name.clone());
                        want.push(Value::Null);
                    }
                }
                continue;
            }
            let v = inner.get_field_by_name("value").unwrap();
            want.push(expect_value(&v, &c.ty).unwrap());
        }
        match failing {
            Some(col) => {
                let e = got_row.expect_err("the Timestamp does not fit");
                prop_assert_eq!(e.column.as_deref(), Some(col.as_str()));
            }
            None => {
                got_row.map_err(|e| TestCaseError::fail(format!("{e}")))?;
                let mut expect = Vec::new();
                for (c, v) in cols.iter().zip(&want) {
                    rowbinary::encode(&c.ty, v, &mut expect).unwrap();
                }
                prop_assert_eq!(out, expect, "{:?}", want);
            }
        }
    }
}
