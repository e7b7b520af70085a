//! The Protobuf decoder allocates nothing per record once its scratch has
//! grown (issue 21; STYLE: hot paths allocate nothing per record), on the
//! plain path and on the chain's framed path (decoder and encoder plan
//! caches warm). A counting global allocator, counting only on the test's
//! own thread, as `no_alloc.rs` does for the JSON mapper; its own binary,
//! so the allocator touches no other test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use spate_clickhouse::mapping::MappingOptions;

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

/// The Protobuf decoder (issue 21) allocates nothing per row either: the
/// sensor workload's flat rows, once the scratch has grown.
#[test]
fn protobuf_rows_allocate_nothing() {
    use spate_clickhouse::protobuf::{Framing, ProtoRowEncoder, sensor};
    let file = sensor::sensor_file().expect("compiles");
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
    let mut src = spate_clickhouse::protobuf::FileSchemaSource::new();
    src.insert(5, file);
    let mapping = spate_clickhouse::protobuf::ProtoMapping::confluent(
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
            spate_clickhouse::protobuf::framing::write_header(&mut f, 5, &[0]);
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
