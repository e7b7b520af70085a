//! Byte-exact Native layouts for small hand-computed cases; the decoders of
//! a current engine (chdb, `tests/it/chdb_fixtures.rs`) and of 18.16
//! (`tests/it/real_server.rs`) check every type end to end.

use super::*;
use spate_row::num::Wide;
use spate_row::rowbinary::{Value, encode};

fn plan(cols: &[(&str, &str)]) -> BlockPlan {
    let cols: Vec<(String, String)> = cols
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    BlockPlan::new(&cols).unwrap()
}

/// RowBinary of rows of values for `cols`.
fn rowbinary(cols: &[(&str, &str)], rows: &[Vec<Value>]) -> Vec<u8> {
    let mut out = Vec::new();
    for row in rows {
        for ((_, t), v) in cols.iter().zip(row) {
            encode(&ChType::parse(t).unwrap(), v, &mut out).unwrap();
        }
    }
    out
}

fn header(out: &mut Vec<u8>, name: &str, ty: &str) {
    put_string(out, name.as_bytes());
    put_string(out, ty.as_bytes());
}

fn s(v: &str) -> Value {
    Value::String(v.as_bytes().to_vec())
}

fn int(v: i128) -> Value {
    Value::Int(Wide::from_i128(v))
}

#[test]
fn scalars_and_strings_are_columns_of_rowbinary_values() {
    let cols = [("id", "UInt64"), ("s", "String")];
    let rb = rowbinary(&cols, &[vec![int(1), s("ab")], vec![int(2), s("")]]);
    let mut out = Vec::new();
    assert_eq!(plan(&cols).transcode([&rb[..]], &mut out).unwrap(), 2);
    let mut want = vec![2, 2];
    header(&mut want, "id", "UInt64");
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&2u64.to_le_bytes());
    header(&mut want, "s", "String");
    want.extend_from_slice(&[2, b'a', b'b', 0]);
    assert_eq!(out, want);
}

#[test]
fn nullable_is_a_null_map_then_values_with_defaults() {
    let cols = [("n", "Nullable(UInt16)"), ("ns", "Nullable(String)")];
    let rb = rowbinary(
        &cols,
        &[vec![int(7), Value::Null], vec![Value::Null, s("x")]],
    );
    let mut out = Vec::new();
    plan(&cols).transcode([&rb[..]], &mut out).unwrap();
    let mut want = vec![2, 2];
    header(&mut want, "n", "Nullable(UInt16)");
    want.extend_from_slice(&[0, 1, 7, 0, 0, 0]);
    header(&mut want, "ns", "Nullable(String)");
    want.extend_from_slice(&[1, 0, 0, 1, b'x']);
    assert_eq!(out, want);
}

#[test]
fn arrays_and_maps_are_cumulative_offsets_then_elements() {
    let cols = [("a", "Array(UInt8)"), ("m", "Map(String, UInt8)")];
    let rb = rowbinary(
        &cols,
        &[
            vec![
                Value::Array(vec![int(1), int(2)]),
                Value::Map(vec![(s("k"), int(9))]),
            ],
            vec![Value::Array(vec![]), Value::Map(vec![])],
            vec![
                Value::Array(vec![int(3)]),
                Value::Map(vec![(s("a"), int(1)), (s("b"), int(2))]),
            ],
        ],
    );
    let mut out = Vec::new();
    plan(&cols).transcode([&rb[..]], &mut out).unwrap();
    let mut want = vec![2, 3];
    header(&mut want, "a", "Array(UInt8)");
    for o in [2u64, 2, 3] {
        want.extend_from_slice(&o.to_le_bytes());
    }
    want.extend_from_slice(&[1, 2, 3]);
    header(&mut want, "m", "Map(String, UInt8)");
    for o in [1u64, 1, 3] {
        want.extend_from_slice(&o.to_le_bytes());
    }
    want.extend_from_slice(&[1, b'k', 1, b'a', 1, b'b']);
    want.extend_from_slice(&[9, 1, 2]);
    assert_eq!(out, want);
}

#[test]
fn tuples_are_element_columns_and_prefixes_come_first() {
    let cols = [("t", "Tuple(LowCardinality(String), UInt8)")];
    let rb = rowbinary(
        &cols,
        &[
            vec![Value::Tuple(vec![s("x"), int(1)])],
            vec![Value::Tuple(vec![s("x"), int(2)])],
        ],
    );
    let mut out = Vec::new();
    plan(&cols).transcode([&rb[..]], &mut out).unwrap();
    let mut want = vec![1, 2];
    header(&mut want, "t", "Tuple(LowCardinality(String), UInt8)");
    want.extend_from_slice(&1u64.to_le_bytes()); // keys version prefix
    want.extend_from_slice(&(1u64 << 9).to_le_bytes()); // UInt8 indexes, keys follow
    want.extend_from_slice(&1u64.to_le_bytes()); // one key
    want.extend_from_slice(&[1, b'x']);
    want.extend_from_slice(&2u64.to_le_bytes()); // two rows
    want.extend_from_slice(&[0, 0]);
    want.extend_from_slice(&[1, 2]);
    assert_eq!(out, want);
}

#[test]
fn low_cardinality_nullable_reserves_key_zero_for_null() {
    let cols = [("lc", "LowCardinality(Nullable(String))")];
    let rows: Vec<Vec<Value>> = [Some("b"), None, Some(""), Some("b")]
        .iter()
        .map(|v| vec![v.map_or(Value::Null, s)])
        .collect();
    let rb = rowbinary(&cols, &rows);
    let mut out = Vec::new();
    plan(&cols).transcode([&rb[..]], &mut out).unwrap();
    let mut want = vec![1, 4];
    header(&mut want, "lc", "LowCardinality(Nullable(String))");
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&(1u64 << 9).to_le_bytes());
    want.extend_from_slice(&3u64.to_le_bytes()); // NULL, "b", ""
    want.extend_from_slice(&[0, 1, b'b', 0]);
    want.extend_from_slice(&4u64.to_le_bytes());
    want.extend_from_slice(&[1, 0, 2, 1]);
    assert_eq!(out, want);
}

#[test]
fn low_cardinality_index_width_grows_with_the_dictionary() {
    let cols = [("lc", "LowCardinality(UInt16)")];
    let rows: Vec<Vec<Value>> = (0..300).map(|i| vec![int(i)]).collect();
    let rb = rowbinary(&cols, &rows);
    let mut out = Vec::new();
    plan(&cols).transcode([&rb[..]], &mut out).unwrap();
    let mut head = vec![1, 0xac, 0x02]; // 300 rows as LEB128
    header(&mut head, "lc", "LowCardinality(UInt16)");
    head.extend_from_slice(&1u64.to_le_bytes());
    head.extend_from_slice(&(1u64 | (1 << 9)).to_le_bytes()); // UInt16 indexes
    head.extend_from_slice(&300u64.to_le_bytes());
    assert_eq!(&out[..head.len()], &head[..]);
    // 300 keys of 2 bytes, the row count, 300 indexes of 2 bytes.
    assert_eq!(out.len(), head.len() + 600 + 8 + 600);
    assert_eq!(&out[out.len() - 2..], &299u16.to_le_bytes());
}

#[test]
fn an_array_of_only_empty_low_cardinality_arrays_writes_no_dictionary() {
    let cols = [("a", "Array(LowCardinality(String))")];
    let rb = rowbinary(&cols, &[vec![Value::Array(vec![])]]);
    let mut out = Vec::new();
    plan(&cols).transcode([&rb[..]], &mut out).unwrap();
    let mut want = vec![1, 1];
    header(&mut want, "a", "Array(LowCardinality(String))");
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(out, want);
}

#[test]
fn rows_split_across_segments_and_into_blocks() {
    let cols = [("id", "UInt32")];
    let rows: Vec<Vec<Value>> = (0..5).map(|i| vec![int(i)]).collect();
    let rb = rowbinary(&cols, &rows);
    let p = plan(&cols);
    let mut one = Vec::new();
    p.transcode([&rb[..8], &rb[8..]], &mut one).unwrap();
    let mut whole = Vec::new();
    p.transcode([&rb[..]], &mut whole).unwrap();
    assert_eq!(one, whole, "segments are concatenated rows");

    let mut blocks = Vec::new();
    assert_eq!(p.transcode_in_blocks([&rb[..]], 2, &mut blocks).unwrap(), 5);
    let mut want = Vec::new();
    for chunk in [&[0u32, 1][..], &[2, 3], &[4]] {
        want.extend_from_slice(&[1, chunk.len() as u8]);
        header(&mut want, "id", "UInt32");
        for v in chunk {
            want.extend_from_slice(&v.to_le_bytes());
        }
    }
    assert_eq!(blocks, want);
}

#[test]
fn the_block_declares_the_servers_type_text() {
    // Decimal32(2) parses to Decimal(9, 2); the block says what the server said.
    let cols = [("d", "Decimal32(2)")];
    let rb = rowbinary(&cols, &[vec![Value::Decimal(Wide::from_i128(125))]]);
    let mut out = Vec::new();
    plan(&cols).transcode([&rb[..]], &mut out).unwrap();
    let mut want = vec![1, 1];
    header(&mut want, "d", "Decimal32(2)");
    want.extend_from_slice(&125i32.to_le_bytes());
    assert_eq!(out, want);
}

#[test]
fn bytes_that_are_not_whole_rows_are_an_error_naming_the_column() {
    let cols = [("id", "UInt32"), ("s", "String")];
    let mut rb = rowbinary(&cols, &[vec![int(1), s("abc")]]);
    rb.truncate(rb.len() - 1);
    let e = plan(&cols)
        .transcode([&rb[..]], &mut Vec::new())
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("row 0") && msg.contains("`s`"), "{msg}");

    let e = BlockPlan::new(&[("j".into(), "JSON".into())]).unwrap_err();
    assert!(e.to_string().contains("`j`"), "{e}");
    let e = BlockPlan::new(&[("l".into(), "LowCardinality(Array(UInt8))".into())]).unwrap_err();
    assert!(matches!(e, NativeError::Unsupported { .. }), "{e}");
}

#[test]
fn a_plan_reusing_its_builders_writes_what_a_fresh_plan_writes() {
    // Nullable, LowCardinality, Array and String columns keep buffers
    // between transcodes: a large batch, a failed one and a small one in
    // turn must each read exactly as a fresh plan would write them.
    let cols = [
        ("q", "Nullable(Int32)"),
        ("lc", "LowCardinality(String)"),
        ("a", "Array(UInt16)"),
        ("s", "String"),
    ];
    let row = |i: i128| {
        vec![
            if i % 3 == 0 { Value::Null } else { int(i) },
            s(if i % 2 == 0 { "even" } else { "odd" }),
            Value::Array((0..i % 4).map(int).collect()),
            s(&"x".repeat(i as usize % 7)),
        ]
    };
    let big = rowbinary(&cols, &(0..500).map(row).collect::<Vec<_>>());
    let small = rowbinary(&cols, &(7..10).map(row).collect::<Vec<_>>());
    let fresh = |rb: &[u8]| {
        let mut out = Vec::new();
        plan(&cols).transcode([rb], &mut out).unwrap();
        out
    };
    let reused = plan(&cols);
    for rb in [&big, &small, &big] {
        let mut out = Vec::new();
        reused.transcode([&rb[..]], &mut out).unwrap();
        assert_eq!(out, fresh(rb));
        // A batch cut short mid-row fails, and what it read is not kept.
        let mut bad = Vec::new();
        assert!(reused.transcode([&rb[..rb.len() - 1]], &mut bad).is_err());
    }
    let mut out = Vec::new();
    reused.transcode([&small[..]], &mut out).unwrap();
    assert_eq!(out, fresh(&small));
}
