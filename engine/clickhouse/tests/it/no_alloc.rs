//! The mapper allocates nothing per row once its buffers have grown (issue
//! 6: "no per-row allocation"; STYLE: hot paths allocate nothing per
//! record). A counting global allocator, counting only on the test's own
//! thread (flag and counter both thread-local), watches the Avro path
//! (decoder with explode and encoder, `avro_fan_out_allocates_nothing_per_record`),
//! `JsonRowEncoder::encode_json` over the flights fixture and a 15-column
//! event, and the writer's Native transcode (`native::BlockPlan`), which
//! allocates per batch (its column buffers grow), never per row. The
//! allocator is the whole test binary's (tests/it), but it counts only on
//! a thread whose flag is set, so no other test is counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use spate_clickhouse::native::BlockPlan;
use spate_formats::json::JsonRowEncoder;
use spate_row::coerce::TimeRules;
use spate_row::spec::{MappingOptions, simple_columns};
use spate_row::time::TimeFormat;
use spate_row::types::ChType;
use spate_testkit::fixtures::{EVENT15, FLIGHTS};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    // Per thread: the tests run in parallel, and one test's first pass must
    // not count against another's second.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// wrapper only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread while `f` runs.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get) - before
}

/// Encodes every row once to grow the buffers, then counts a second pass
/// into a buffer that already has room.
fn assert_no_allocation_per_row(enc: &mut JsonRowEncoder, rows: &[String]) {
    let mut buf = Vec::new();
    let first = allocations_in(|| {
        for r in rows {
            enc.encode_json(r.as_bytes(), &mut buf).unwrap();
        }
    });
    // The counter sees the encoder: the first pass grows the buffers.
    assert!(first > 0, "the counting allocator saw the first pass");
    let grown = buf.len();
    buf.clear();
    buf.reserve(grown);
    let n = allocations_in(|| {
        for r in rows {
            enc.encode_json(r.as_bytes(), &mut buf).unwrap();
        }
    });
    assert_eq!(buf.len(), grown, "the second pass wrote the same rows");
    assert_eq!(n, 0, "{n} allocations over {} rows", rows.len());
}

#[test]
fn flights_rows_allocate_nothing_per_row() {
    let rows: Vec<String> = spate_testkit::fixtures::FLIGHTS_50
        .lines()
        .map(str::to_owned)
        .collect();
    let cols = simple_columns(
        FLIGHTS
            .iter()
            .map(|&(name, ty)| (name, ChType::parse(ty).unwrap())),
    );
    let options = MappingOptions {
        time: TimeRules {
            formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    let mut enc = JsonRowEncoder::new(cols, options).unwrap();
    assert_no_allocation_per_row(&mut enc, &rows);
}

#[test]
fn event_rows_allocate_nothing_per_row() {
    let cols = simple_columns(
        EVENT15
            .iter()
            .map(|&(name, ty)| (name, ChType::parse(ty).unwrap())),
    );
    // Fields out of column order on odd rows (the permutation path), an
    // escaped string, and a missing Nullable field on every third row.
    let rows: Vec<String> = (0..200)
        .map(|i| {
            let referrer = if i % 3 == 0 {
                String::new()
            } else {
                r#""referrer":"https:\/\/example.com\/a\"b","#.to_owned()
            };
            let head = format!(
                r#""ts":"2024-05-01T12:{:02}:{:02}.{:03}Z","user_id":{},"session":"61f0c404-5cb3-11e7-907b-a6006ad3{:04x}""#,
                i % 60,
                i % 59,
                i % 1000,
                1_000_000 + i,
                i
            );
            let tail = format!(
                r#""event":"click","page":"/p/{i}",{referrer}"country":"DE","ip":"10.0.{}.{}","duration_ms":{},"price":"{}.99","qty":{},"is_mobile":{},"score":{}.5,"tags":["a","b"],"version":3"#,
                i % 256,
                i % 250,
                i * 7,
                i % 500,
                i % 20,
                i % 2 == 0,
                i % 100
            );
            if i % 2 == 0 {
                format!("{{{head},{tail}}}")
            } else {
                format!("{{{tail},{head}}}")
            }
        })
        .collect();
    let mut enc = JsonRowEncoder::new(cols, MappingOptions::default()).unwrap();
    assert_no_allocation_per_row(&mut enc, &rows);
}

#[test]
fn metadata_columns_allocate_nothing_per_row() {
    use spate_core::record::{Header, Headers, Payload, TimestampKind, TopicPartition};
    use spate_row::meta::MetaSource;
    use spate_row::spec::{ColumnOptions, ColumnSpec, MissingValue};
    let meta = [
        ("_topic", "LowCardinality(String)"),
        ("_partition", "Int32"),
        ("_offset", "UInt64"),
        ("_timestamp", "DateTime64(3)"),
        ("_timestamp_type", "String"),
        ("_key", "Nullable(String)"),
        ("_headers", "Map(String, Nullable(String))"),
        ("_headers.name", "Array(String)"),
        ("_header.trace", "Nullable(String)"),
        ("_header.n", "Int32"),
    ];
    let mut cols = simple_columns([("id", ChType::UInt64), ("name", ChType::String)]);
    cols.extend(meta.map(|(source, ty)| ColumnSpec {
        name: source.to_owned(),
        ty: ChType::parse(ty).unwrap(),
        path: None,
        meta: MetaSource::parse(source),
        missing: MissingValue::Null,
        options: ColumnOptions::default(),
    }));
    let mut enc = JsonRowEncoder::new(cols, MappingOptions::default()).unwrap();
    let tp = TopicPartition::new("events", 4);
    let headers = [
        Header {
            name: b"trace",
            value: Some(b"t-1"),
        },
        Header {
            name: b"n",
            value: Some(b"12"),
        },
        Header {
            name: b"trace",
            value: None,
        },
    ];
    let rows: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"id":{i},"name":"n{i}"}}"#))
        .collect();
    let pass = |enc: &mut JsonRowEncoder, buf: &mut Vec<u8>| {
        for (i, r) in rows.iter().enumerate() {
            let p = Payload {
                value: Some(r.as_bytes()),
                key: (i % 2 == 0).then_some(&b"key"[..]),
                partition: &tp,
                offset: i as i64,
                timestamp_ms: Some(1_700_000_000_000 + i as i64),
                timestamp_kind: TimestampKind::CreateTime,
                headers: Headers::from_slice(&headers),
            };
            enc.encode_message(&p, buf).unwrap();
        }
    };
    let mut buf = Vec::new();
    let first = allocations_in(|| pass(&mut enc, &mut buf));
    assert!(first > 0, "the counting allocator saw the first pass");
    let grown = buf.len();
    buf.clear();
    buf.reserve(grown);
    let n = allocations_in(|| pass(&mut enc, &mut buf));
    assert_eq!(buf.len(), grown, "the second pass wrote the same rows");
    assert_eq!(n, 0, "{n} allocations over {} rows", rows.len());
}

#[test]
fn the_native_transcode_allocates_per_batch_not_per_row() {
    let lines: Vec<&str> = spate_testkit::fixtures::FLIGHTS_50.lines().collect();
    let types = [
        ("date", "DateTime"),
        ("delay", "Int32"),
        ("distance", "UInt32"),
        ("origin", "LowCardinality(String)"),
        ("destination", "String"),
    ];
    let cols = simple_columns(types.map(|(n, t)| (n, ChType::parse(t).unwrap())));
    let options = MappingOptions {
        time: TimeRules {
            formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    let mut enc = JsonRowEncoder::new(cols, options).unwrap();
    let mut small = Vec::new();
    for l in &lines {
        enc.encode_json(l.as_bytes(), &mut small).unwrap();
    }
    let big: Vec<u8> = small.repeat(100);
    let plan = BlockPlan::new(&types.map(|(n, t)| (n.to_owned(), t.to_owned()))).unwrap();
    let mut out = Vec::new();
    let a_small = allocations_in(|| {
        plan.transcode([&small[..]], &mut out).unwrap();
    });
    let mut out = Vec::new();
    let a_big = allocations_in(|| {
        plan.transcode([&big[..]], &mut out).unwrap();
    });
    assert!(a_small > 0, "the counting allocator saw the transcode");
    // 5000 rows against 50: buffer doubling adds a few allocations per
    // column buffer; one per row would add thousands.
    assert!(
        a_big < a_small + 100,
        "{a_big} allocations for 5000 rows, {a_small} for 50"
    );
}

/// The Avro path with fan-out allocates nothing per record either: the
/// chain's `Decoder` (framing, plan cache by schema id, element ranges)
/// and `Encoder` (the row, direct or permuted), over sensor messages of
/// two writer schema ids, 100 rows each.
#[test]
fn avro_fan_out_allocates_nothing_per_record() {
    use std::sync::Arc;

    use spate_core::ack::{AckIssuer, ack_channel};
    use spate_core::pipeline::chain::{Decoder, Encoder, RecordCx, RecordError, Stage};
    use spate_core::record::{Payload, TopicPartition};
    use spate_formats::avro::{
        AvroMapping, AvroOptions, AvroRecord, AvroRowEncoder, FileSchemaSource,
    };
    use spate_testkit::sensor::avro as sensor;

    struct Rows<'e> {
        enc: &'e mut AvroRowEncoder,
        buf: &'e mut Vec<u8>,
        rows: usize,
    }
    impl<'a> Stage<AvroRecord<'a>> for Rows<'_> {
        fn push(&mut self, r: AvroRecord<'a>, cx: &RecordCx<'_>) -> Result<(), RecordError> {
            self.rows += 1;
            self.enc.encode(&r, cx, self.buf)
        }
    }

    let messages: Vec<Vec<u8>> = (0..40u64)
        .map(|i| {
            let mut m = Vec::new();
            if i % 2 == 0 {
                sensor::message(i, 7, &mut m);
            } else {
                sensor::message_v2(i, 8, &mut m);
            }
            m
        })
        .collect();
    let (tx, _rx) = ack_channel();
    let tp = TopicPartition::new("sensor", 0);
    let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
    let ack = issuer.issue(0, 0);
    for reversed in [false, true] {
        let mut columns = sensor::columns();
        if reversed {
            columns.reverse();
        }
        let source =
            FileSchemaSource::from_schemas([(7, sensor::schema_v1()), (8, sensor::schema_v2())]);
        let options = AvroOptions {
            explode: Some(vec!["events".into()]),
            ..AvroOptions::default()
        };
        let mapping = AvroMapping::confluent(columns, options, Arc::new(source)).unwrap();
        let mut dec = mapping.decoder();
        let mut enc = mapping.encoder();
        let mut buf = Vec::new();
        let mut pass = |buf: &mut Vec<u8>| {
            let mut rows = Rows {
                enc: &mut enc,
                buf,
                rows: 0,
            };
            for (off, m) in messages.iter().enumerate() {
                let cx = RecordCx {
                    payload: Payload {
                        value: Some(m),
                        key: None,
                        partition: &tp,
                        offset: off as i64,
                        timestamp_ms: None,
                        timestamp_kind: spate_core::record::TimestampKind::None,
                        headers: spate_core::record::Headers::NONE,
                    },
                    ack: &ack,
                };
                dec.decode(&cx, &mut rows).unwrap();
            }
            rows.rows
        };
        let mut rows = 0;
        let first = allocations_in(|| rows = pass(&mut buf));
        assert!(first > 0, "the counting allocator saw the first pass");
        assert_eq!(rows, 4000);
        let grown = buf.len();
        buf.clear();
        buf.reserve(grown);
        let n = allocations_in(|| rows = pass(&mut buf));
        assert_eq!((rows, buf.len()), (4000, grown), "the same rows again");
        assert_eq!(
            n, 0,
            "{n} allocations over {rows} rows (reversed: {reversed})"
        );
    }
}

/// The Protobuf decoder (issue 21) allocates nothing per row either: the
/// sensor workload's flat rows, once the scratch has grown.
#[test]
fn protobuf_rows_allocate_nothing() {
    use spate_formats::protobuf::source::compile_proto;
    use spate_formats::protobuf::{Framing, ProtoRowEncoder};
    use spate_testkit::sensor::protobuf as sensor;
    let file = compile_proto("sensor.proto", sensor::SENSOR_PROTO, &[]).expect("compiles");
    let msg = file
        .parent_pool()
        .get_message_by_name(sensor::SENSOR_MESSAGE)
        .expect("message");
    let mut enc = ProtoRowEncoder::fixed(
        &msg,
        Framing::Plain,
        sensor::sensor_columns(),
        MappingOptions::default(),
        "sensor.proto",
    )
    .expect("plans");
    let mut scratch = Vec::new();
    let messages: Vec<Vec<u8>> = (0..300u64)
        .map(|n| {
            let mut m = Vec::new();
            sensor::sensor_row(n / 100, n % 100, &mut m, &mut scratch);
            m
        })
        .collect();
    let mut buf = Vec::with_capacity(1 << 20);
    for m in &messages {
        enc.encode_message(m, &mut buf).expect("encodes");
    }
    buf.clear();
    let n = allocations_in(|| {
        for m in &messages {
            enc.encode_message(m, &mut buf).expect("encodes");
        }
    });
    assert_eq!(n, 0, "allocations for {} protobuf rows", messages.len());

    // The chain's path: Confluent frames through the schema source, the
    // decoder's and the encoder's plan caches (warm), one record per row.
    let mut src = spate_formats::protobuf::FileSchemaSource::new();
    src.insert(5, file);
    let mapping = spate_formats::protobuf::ProtoMapping::confluent(
        std::sync::Arc::new(src),
        sensor::sensor_columns(),
        MappingOptions::default(),
    )
    .expect("columns");
    let (mut dec, mut enc) = (mapping.decoder(), mapping.encoder());
    let framed: Vec<Vec<u8>> = messages
        .iter()
        .map(|m| {
            let mut f = Vec::new();
            spate_formats::protobuf::framing::write_header(&mut f, 5, &[0]);
            f.extend_from_slice(m);
            f
        })
        .collect();
    let mut run = |buf: &mut Vec<u8>| {
        for m in &framed {
            let r = dec.decode_value(Some(m)).expect("decodes");
            enc.encode_record(&r, buf).expect("encodes");
        }
    };
    run(&mut buf);
    buf.clear();
    let n = allocations_in(|| run(&mut buf));
    assert_eq!(
        n,
        0,
        "allocations for {} framed protobuf records",
        framed.len()
    );
}
