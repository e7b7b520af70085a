//! Fan-out: the rows of an exploded record are exactly the one-row mapper's
//! rows of "the record's fields plus one element's", element by element.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use spate_core::ack::{AckIssuer, ack_channel};
use spate_core::record::TopicPartition;

use super::*;
use spate_row::spec::{ColumnOptions, apply_renames, simple_columns};
use spate_row::types::ChType;

fn ty(t: &str) -> ChType {
    ChType::parse(t).unwrap()
}

/// Encodes every element pushed to it; stops at the first error.
struct Rows<'e> {
    enc: &'e mut ExplodeEncoder,
    rows: Vec<Vec<u8>>,
}

impl<'a> Stage<JsonElement<'a>> for Rows<'_> {
    fn push(&mut self, el: JsonElement<'a>, _cx: &RecordCx<'_>) -> Result<(), RecordError> {
        let mut buf = Vec::new();
        self.enc.encode_element(&el, &mut buf)?;
        self.rows.push(buf);
        Ok(())
    }
}

/// Decodes `messages` with `dec` and encodes with `enc`: rows per message.
fn run(
    dec: &mut ExplodeDecoder,
    enc: &mut ExplodeEncoder,
    messages: &[&[u8]],
) -> Vec<Result<Vec<Vec<u8>>, RecordError>> {
    let tp = TopicPartition::new("t", 0);
    let (tx, _rx) = ack_channel();
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let ack = issuer.issue(i as i64, i as i64);
            let cx = RecordCx {
                payload: Payload {
                    value: Some(m),
                    key: None,
                    partition: &tp,
                    offset: i as i64,
                    timestamp_ms: None,
                    timestamp_kind: spate_core::record::TimestampKind::None,
                    headers: spate_core::record::Headers::NONE,
                },
                ack: &ack,
            };
            let mut out = Rows {
                enc: &mut *enc,
                rows: Vec::new(),
            };
            dec.decode(&cx, &mut out).map(|()| out.rows)
        })
        .collect()
}

/// The one-row mapper's row for `json`.
fn one_row(columns: &[ColumnSpec], json: &str) -> Vec<u8> {
    let mut enc = JsonRowEncoder::new(columns.to_vec(), MappingOptions::default()).unwrap();
    let mut buf = Vec::new();
    enc.encode_json(json.as_bytes(), &mut buf).unwrap();
    buf
}

fn sensor_columns() -> Vec<ColumnSpec> {
    let mut cols = simple_columns([
        ("batch_id", ty("UInt64")),
        ("source", ty("String")),
        ("region", ty("String")),
        ("event_seq", ty("UInt32")),
        ("name", ty("LowCardinality(String)")),
        ("value", ty("Float64")),
        ("quality", ty("Nullable(Int32)")),
    ]);
    cols[2].missing = MissingValue::Literal("'unknown'".into());
    cols
}

fn explode(
    path: &[&str],
    columns: Vec<ColumnSpec>,
    ndjson: bool,
) -> (ExplodeDecoder, ExplodeEncoder) {
    let path: Vec<String> = path.iter().map(|s| (*s).to_owned()).collect();
    let pointed: BTreeSet<String> = columns
        .iter()
        .filter(|c| {
            c.path
                .as_ref()
                .is_some_and(|p| p.len() > 1 || p.first() != Some(&c.name))
        })
        .map(|c| c.name.clone())
        .collect();
    let enc = ExplodeEncoder::new(columns, MappingOptions::default(), &path, &pointed).unwrap();
    (ExplodeDecoder::new(path, ndjson), enc)
}

#[test]
fn each_element_is_a_row_with_the_record_fields_and_its_own() {
    let cols = sensor_columns();
    let (mut dec, mut enc) = explode(&["events"], cols.clone(), false);
    let m1: &[u8] = br#"{"batch_id":7,"source":"gw-7","region":null,"events":[
        {"event_seq":0,"name":"sensor-1","value":-1.5,"quality":null},
        {"event_seq":1,"name":"sensor-2","value":0.25,"quality":2}],"produced_at":1}"#;
    let m2: &[u8] = br#"{"events":[{"name":"s","value":1,"event_seq":5}],"batch_id":8,"source":"gw-8","region":"eu-0"}"#;
    let got = run(&mut dec, &mut enc, &[m1, m2]);
    let want1 = vec![
        one_row(
            &cols,
            r#"{"batch_id":7,"source":"gw-7","event_seq":0,"name":"sensor-1","value":-1.5,"quality":null}"#,
        ),
        one_row(
            &cols,
            r#"{"batch_id":7,"source":"gw-7","event_seq":1,"name":"sensor-2","value":0.25,"quality":2}"#,
        ),
    ];
    assert_eq!(got[0].as_ref().unwrap(), &want1);
    // The next message's record fields, not the cached ones.
    let want2 = vec![one_row(
        &cols,
        r#"{"batch_id":8,"source":"gw-8","region":"eu-0","event_seq":5,"name":"s","value":1}"#,
    )];
    assert_eq!(got[1].as_ref().unwrap(), &want2);
    // region null -> mapping.defaults' 'unknown' (bytes of the literal).
    let mut region = vec![7u8];
    region.extend_from_slice(b"unknown");
    assert!(want1[0].windows(8).any(|w| w == region.as_slice()));
}

#[test]
fn an_empty_array_yields_no_row_and_is_counted() {
    let (mut dec, mut enc) = explode(&["events"], sensor_columns(), false);
    let got = run(
        &mut dec,
        &mut enc,
        &[br#"{"batch_id":1,"events":[ ]}"#, br#"{"events":[],"x":1}"#],
    );
    assert!(got.iter().all(|r| r.as_ref().unwrap().is_empty()));
    assert_eq!(dec.empties(), 2);
    // An empty array in a message that is not valid JSON is still an error.
    let got = run(&mut dec, &mut enc, &[br#"{"events":[]"#]);
    assert!(got[0].is_err());
}

#[test]
fn a_missing_or_non_array_field_is_a_decode_error_naming_the_pointer() {
    let (mut dec, mut enc) = explode(&["events"], sensor_columns(), false);
    for (m, says) in [
        (&br#"{"batch_id":1}"#[..], "missing"),
        (br#"{"events":{"a":1}}"#, "is an object, not an array"),
        (br#"{"events":"x"}"#, "is a string, not an array"),
        (br#"{"events":null}"#, "is null, not an array"),
        (br#"[1,2]"#, "not a JSON object"),
        (br#"{"events":[1,}"#, "not valid JSON"),
    ] {
        let e = run(&mut dec, &mut enc, &[m]).remove(0).unwrap_err();
        assert_eq!(e.kind, spate_core::pipeline::chain::RecordErrorKind::Decode);
        assert!(e.reason.contains("mapping.explode /events"), "{e}");
        assert!(
            e.reason.contains(says),
            "{}: {e}",
            String::from_utf8_lossy(m)
        );
    }
}

#[test]
fn a_nested_pointer_and_ndjson_lines_explode_each_record() {
    let mut cols = simple_columns([("id", ty("UInt32")), ("x", ty("Int64"))]);
    cols[0].path = Some(vec!["meta".into(), "id".into()]);
    let (mut dec, mut enc) = explode(&["data", "items"], cols.clone(), true);
    let msg: &[u8] = b"{\"meta\":{\"id\":1},\"data\":{\"items\":[{\"x\":-1},{\"x\":2}]}}\n\
        \n{\"data\":{\"items\":[]},\"meta\":{\"id\":2}}\r\n{\"meta\":{\"id\":3},\"data\":{\"items\":[{\"x\":9}]}}";
    let rows = run(&mut dec, &mut enc, &[msg]).remove(0).unwrap();
    let plain = simple_columns([("id", ty("UInt32")), ("x", ty("Int64"))]);
    let want = vec![
        one_row(&plain, r#"{"id":1,"x":-1}"#),
        one_row(&plain, r#"{"id":1,"x":2}"#),
        one_row(&plain, r#"{"id":3,"x":9}"#),
    ];
    assert_eq!(rows, want);
    assert_eq!(dec.empties(), 1);
}

#[test]
fn a_field_in_both_is_a_record_error_unless_a_pointer_picks_a_side() {
    let cols = simple_columns([("name", ty("String")), ("v", ty("Int32"))]);
    let (mut dec, mut enc) = explode(&["events"], cols.clone(), false);
    let m: &[u8] = br#"{"name":"rec","events":[{"name":"el","v":1}]}"#;
    let e = run(&mut dec, &mut enc, &[m]).remove(0).unwrap_err();
    assert_eq!(e.column.as_deref(), Some("name"));
    assert!(e.reason.contains("in both the element"), "{e}");
    // mapping.columns: name -> /events/name reads the element only ...
    let mut el = cols.clone();
    el[0].path = Some(vec!["events".into(), "name".into()]);
    let (mut dec, mut enc) = explode(&["events"], el, false);
    let rows = run(&mut dec, &mut enc, &[m]).remove(0).unwrap();
    assert_eq!(rows, vec![one_row(&cols, r#"{"name":"el","v":1}"#)]);
    // ... and name -> /name the record only (a rename reads either side).
    let mut rec = cols.clone();
    rec[0].path = Some(vec!["name".into()]);
    let pointed: BTreeSet<String> = ["name".to_owned()].into();
    let mut enc =
        ExplodeEncoder::new(rec, MappingOptions::default(), &["events".into()], &pointed).unwrap();
    let mut dec = ExplodeDecoder::new(vec!["events".into()], false);
    let rows = run(&mut dec, &mut enc, &[m]).remove(0).unwrap();
    assert_eq!(rows, vec![one_row(&cols, r#"{"name":"rec","v":1}"#)]);
    let mut renamed = cols.clone();
    apply_renames(
        &mut renamed,
        &BTreeMap::from([("v".to_owned(), "w".to_owned())]),
    );
    let (mut dec, mut enc) = explode(&["events"], renamed, false);
    let rows = run(&mut dec, &mut enc, &[br#"{"w":4,"events":[{"name":"a"}]}"#])
        .remove(0)
        .unwrap();
    assert_eq!(rows, vec![one_row(&cols, r#"{"name":"a","v":4}"#)]);
    // A field in neither follows the column's missing rule (here: error).
    let e = run(&mut dec, &mut enc, &[br#"{"events":[{"name":"a"}]}"#])
        .remove(0)
        .unwrap_err();
    assert_eq!(e.column.as_deref(), Some("v"));
    let _ = ColumnOptions::default();
}

/// Server DEFAULT columns: rows carry RowBinaryWithDefaults markers in the
/// same layout as the one-row mapper's.
#[test]
fn rows_with_defaults_markers_match_the_one_row_mapper() {
    let mut cols = simple_columns([
        ("a", ty("UInt8")),
        ("b", ty("String")),
        ("c", ty("Nullable(UInt8)")),
    ]);
    cols[1].missing = MissingValue::ServerDefault;
    let (mut dec, mut enc) = explode(&["e"], cols.clone(), false);
    let rows = run(&mut dec, &mut enc, &[br#"{"a":1,"e":[{"c":2},{"b":"x"}]}"#])
        .remove(0)
        .unwrap();
    assert_eq!(
        rows,
        vec![
            one_row(&cols, r#"{"a":1,"c":2}"#),
            one_row(&cols, r#"{"a":1,"b":"x"}"#)
        ]
    );
}

fn arb_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (-1000i64..1000).prop_map(|v| v.to_string()),
        "[a-z]{0,6}".prop_map(|s| format!("\"{s}\"")),
        Just("null".to_owned()),
        Just("\"\\u00e9\\n\"".to_owned()),
    ]
}

proptest! {
    /// Whatever fields the record and its elements hold (disjoint names,
    /// any order, nulls, missing ones), each row is the one-row mapper's
    /// row of the record's fields merged with that element's.
    #[test]
    fn rows_equal_the_one_row_mapping_of_the_merged_object(
        record in prop::collection::btree_map(0usize..4, arb_value(), 0..4),
        elements in prop::collection::vec(prop::collection::btree_map(4usize..8, arb_value(), 0..4), 0..5),
        events_first in any::<bool>(),
    ) {
        // Columns r0..r3 (record) and e4..e7 (element): a String, an Int64,
        // a Nullable(String), a Nullable(Int64) each; every column
        // Nullable or with a DEFAULT so any subset maps.
        let types = ["String", "Int64", "Nullable(String)", "Nullable(Int64)"];
        let mut cols = Vec::new();
        for i in 0..8 {
            let name = if i < 4 { format!("r{i}") } else { format!("e{i}") };
            let mut c = simple_columns([(name.as_str(), ty(types[i % 4]))]).remove(0);
            if !c.ty.is_nullable() {
                c.missing = MissingValue::Literal(if i % 4 == 0 { "'d'".into() } else { "-7".into() });
            }
            cols.push(c);
        }
        // Interleave the columns' INSERT order.
        let order = [0, 4, 1, 5, 2, 6, 3, 7];
        let cols: Vec<ColumnSpec> = order.iter().map(|&i| cols[i].clone()).collect();
        let field = |k: usize| if k < 4 { format!("r{k}") } else { format!("e{k}") };
        let obj = |m: &BTreeMap<usize, String>| {
            m.iter().map(|(k, v)| format!("\"{}\":{v}", field(*k))).collect::<Vec<_>>().join(",")
        };
        let events = format!("[{}]", elements.iter().map(|e| format!("{{{}}}", obj(e))).collect::<Vec<_>>().join(", "));
        let rec = obj(&record);
        let msg = match (events_first, rec.is_empty()) {
            (_, true) => format!("{{\"events\":{events}}}"),
            (true, false) => format!("{{\"events\":{events},{rec}}}"),
            (false, false) => format!("{{{rec}, \"events\" : {events}}}"),
        };
        // A one-row mapper cannot reject a typed value here unless the
        // merged object would be rejected too: compare results, not only Ok.
        let (mut dec, mut enc) = explode(&["events"], cols.clone(), false);
        let got = run(&mut dec, &mut enc, &[msg.as_bytes()]).remove(0);
        let mut one = JsonRowEncoder::new(cols.clone(), MappingOptions::default()).unwrap();
        let want: Result<Vec<Vec<u8>>, RecordError> = elements
            .iter()
            .map(|e| {
                let merged = [rec.clone(), obj(e)].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>().join(",");
                let mut buf = Vec::new();
                one.encode_json(format!("{{{merged}}}").as_bytes(), &mut buf).map(|()| buf)
            })
            .collect();
        match (got, want) {
            (Ok(g), Ok(w)) => prop_assert_eq!(g, w, "{}", msg),
            (Err(g), Err(w)) => prop_assert_eq!(g.column, w.column, "{}", msg),
            (g, w) => prop_assert!(false, "{}: exploded {:?} vs merged {:?}", msg, g.err(), w.err()),
        }
        prop_assert_eq!(dec.empties(), u64::from(elements.is_empty()));
    }
}

/// A fan-out row is routed by the element's key field when it has one,
/// else by the record's.
#[test]
fn rows_route_by_the_elements_key_else_the_records() {
    use spate_row::shard::ShardKey;
    let tp = TopicPartition::new("t", 0);
    let (tx, _rx) = ack_channel();
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let ack = issuer.issue(0, 0);
    let record: &[u8] = br#"{"host":"h1","events":[{"id":1},{"id":2},{"x":0}]}"#;
    let cx = RecordCx {
        payload: Payload {
            value: Some(record),
            key: None,
            partition: &tp,
            offset: 0,
            timestamp_ms: None,
            timestamp_kind: spate_core::record::TimestampKind::None,
            headers: spate_core::record::Headers::NONE,
        },
        ack: &ack,
    };
    for (field, element, from_record) in [
        ("id", &br#"{"id":1}"#[..], false),
        ("id", br#"{"id":2}"#, false),
        ("host", br#"{"id":1}"#, true),
    ] {
        let mut router = ShardRouter::new(ShardKey::field(field));
        let el = JsonElement {
            record,
            element,
            seq: 1,
            index: 0,
            array: (0, 0),
        };
        let got = router.try_route(&el, &cx, 16).unwrap();
        let want = ShardRouter::new(ShardKey::field(field))
            .try_shard_for(None, if from_record { record } else { element }, 16)
            .unwrap();
        assert_eq!(got, want, "{field}");
    }
    // Neither has it: the record error names the key.
    let mut router = ShardRouter::new(ShardKey::field("nope"));
    let el = JsonElement {
        record,
        element: br#"{"x":0}"#,
        seq: 1,
        index: 2,
        array: (0, 0),
    };
    assert!(router.try_route(&el, &cx, 16).is_err());
}

/// A record column that reads the exploded array itself still gets its
/// text (the record is then scanned whole, not with the array elided).
#[test]
fn a_column_reading_the_array_itself_gets_its_text() {
    let cols = simple_columns([("n", ty("Int32")), ("events", ty("String"))]);
    let (mut dec, mut enc) = explode(&["events"], cols.clone(), false);
    let m: &[u8] = br#"{"events":[{"n":1},{"n":2}]}"#;
    let rows = run(&mut dec, &mut enc, &[m]).remove(0).unwrap();
    let want: Vec<Vec<u8>> = [1, 2]
        .iter()
        .map(|n| {
            one_row(
                &cols,
                &format!(r#"{{"n":{n},"events":[{{"n":1}},{{"n":2}}]}}"#),
            )
        })
        .collect();
    assert_eq!(rows, want);
}

/// Kafka metadata columns in a fan-out: every row of a message carries the
/// message's metadata (read through the chain's payload), and an absent
/// value (a null key) takes the column's missing-value rule.
#[test]
fn exploded_rows_carry_their_messages_metadata() {
    use spate_row::meta::MetaSource;
    use spate_row::rowbinary::Value;
    use spate_row::rowbinary::decode::decode;

    struct MetaRows<'e> {
        enc: &'e mut ExplodeEncoder,
        rows: Vec<Vec<u8>>,
    }
    impl<'a> Stage<JsonElement<'a>> for MetaRows<'_> {
        fn push(&mut self, el: JsonElement<'a>, cx: &RecordCx<'_>) -> Result<(), RecordError> {
            let mut buf = Vec::new();
            Encoder::encode(&mut *self.enc, &el, cx, &mut buf)?;
            self.rows.push(buf);
            Ok(())
        }
    }
    let mut columns = simple_columns([
        ("batch_id", ty("UInt64")),
        ("name", ty("String")),
        ("_offset", ty("UInt64")),
        ("k", ty("String")),
    ]);
    columns[2].meta = MetaSource::parse("_offset");
    columns[3].meta = MetaSource::parse("_key");
    columns[3].missing = MissingValue::Literal("'none'".into());
    let types: Vec<ChType> = columns.iter().map(|c| c.ty.clone()).collect();
    let (mut dec, mut enc) = explode(&["events"], columns, false);
    let tp = TopicPartition::new("t", 0);
    let (tx, _rx) = ack_channel();
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let json = br#"{"batch_id":7,"events":[{"name":"a"},{"name":"b"}]}"#;
    let mut got = Vec::new();
    for (offset, key) in [(40i64, Some(&b"k-1"[..])), (41, None)] {
        let ack = issuer.issue(offset, offset);
        let cx = RecordCx {
            payload: Payload {
                value: Some(json),
                key,
                partition: &tp,
                offset,
                timestamp_ms: None,
                timestamp_kind: spate_core::record::TimestampKind::None,
                headers: spate_core::record::Headers::NONE,
            },
            ack: &ack,
        };
        let mut out = MetaRows {
            enc: &mut enc,
            rows: Vec::new(),
        };
        dec.decode(&cx, &mut out).unwrap();
        for row in out.rows {
            let mut input = &row[..];
            let values: Vec<Value> = types
                .iter()
                .map(|t| decode(t, &mut input).unwrap())
                .collect();
            assert!(input.is_empty());
            got.push(values);
        }
    }
    let int = |v: i128| Value::Int(spate_row::num::Wide::from_i128(v));
    let s = |v: &str| Value::String(v.as_bytes().to_vec());
    assert_eq!(
        got,
        [
            vec![int(7), s("a"), int(40), s("k-1")],
            vec![int(7), s("b"), int(40), s("k-1")],
            vec![int(7), s("a"), int(41), s("none")],
            vec![int(7), s("b"), int(41), s("none")],
        ]
    );
    // Without the message (encode_element) a metadata column cannot be
    // filled: an error, never a silent NULL or DEFAULT.
    let (mut dec, mut enc2) = explode(
        &["events"],
        {
            let mut c =
                simple_columns([("name", ty("String")), ("_offset", ty("Nullable(UInt64)"))]);
            c[1].meta = MetaSource::parse("_offset");
            c
        },
        false,
    );
    let results = run(&mut dec, &mut enc2, &[json]);
    let e = results[0].as_ref().unwrap_err();
    assert!(e.reason.contains("no message"), "{e}");
}
