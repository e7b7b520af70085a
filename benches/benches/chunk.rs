//! Chunk push per row: what the chain's terminal stage does for every row
//! (DESIGN "Chain" and "Sink pool").
//!
//! Per row: append an encoded row of [`ROW_BYTES`] bytes (an 8-byte offset and
//! a fixed 92-byte body) to the shard's chunk buffer and [`AckSet::push`] the
//! poll batch's handle. Every [`BATCH_RECORDS`] rows a new poll batch handle is
//! issued (one `Arc` allocation), as the lane driver does per poll.
//!
//! Hand-rolled terminal (`SimTerminal`), so each step's cost shows on its own;
//! every `N` rows the chunk is sealed:
//!
//! - `encode_ack/N`: the buffer is cleared and the acks delivered; no budget,
//!   no `Chunk`. The per-row floor.
//! - `local_seal/N`: [`Budget::try_acquire`], [`Chunk::new`], and the chunk
//!   dropped on the spot (its acks fail, its permit returns). Everything on the
//!   pipeline thread except the queue.
//! - `to_pool/N`: the chunk goes to [`PoolHandle::try_send`] of a real
//!   [`SinkPool`] (one shard, one replica) whose [`Writer`] discards every
//!   batch.
//!
//! The engine's own terminal stage:
//!
//! - `chunk_buffers/N`: [`ChunkBuffers::append`] per row with a
//!   [`RecordCx`] borrowing the batch handle, then per poll batch
//!   [`ChunkBuffers::seal_lingering`] and [`ChunkBuffers::flush`], as the lane
//!   driver runs them, into the same kind of discarding pool. `N` is
//!   `ChunkConfig::max_rows`; `default` is [`ChunkConfig::default`] (256 KiB,
//!   so about 2,600 of these rows).
//!
//! Pools run on a tokio multi-thread runtime with one worker thread (the
//! machine the first numbers were taken on has two cores: one for this thread,
//! one for the runtime). A full queue or budget is retried after
//! `thread::yield_now` (a real pipeline thread pauses its lanes and keeps
//! polling, D2), so the `to_pool` and `chunk_buffers` numbers are the sustained
//! rate of pipeline thread plus shard worker, bounded by the slower of the two
//! and sensitive to how promptly the OS runs the worker. Waits are counted and
//! printed to stderr after each pool bench.
//!
//! Throughput is in rows; [`ROWS_PER_ITER`] rows per iteration.

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use criterion::{BenchmarkId, Criterion, Throughput};
use spate_core::ack::{AckHandle, AckIssuer, AckReceiver, AckSet, ack_channel};
use spate_core::budget::Budget;
use spate_core::pipeline::chain::RecordCx;
use spate_core::pipeline::terminal::{ChunkBuffers, ChunkConfig, Flush};
use spate_core::record::{Payload, TopicPartition};
use spate_core::sink::{
    Chunk, Endpoint, PoolHandle, PushError, RunNonce, SealedBatch, SinkConfig, SinkPool,
    WriteError, Writer,
};

/// Encoded size of one row.
const ROW_BYTES: usize = 100;
/// Records per poll batch (one ack handle each).
const BATCH_RECORDS: i64 = 500;
/// Rows pushed per timed iteration; a multiple of every chunk size below so no
/// partial chunk is left at the end.
const ROWS_PER_ITER: u64 = 10_000;
/// Chunk sizes in rows.
const CHUNK_ROWS: [u64; 2] = [100, 1000];
/// In-flight budget: room for the open batch, two batches in flight and a
/// full queue.
const BUDGET_BYTES: u64 = 64 << 20;
/// In-flight row budget.
const BUDGET_ROWS: u64 = 1 << 20;

/// A writer that acknowledges every batch without looking at it.
#[derive(Debug, Default)]
struct DiscardWriter {
    rows: AtomicU64,
}

impl Writer for DiscardWriter {
    fn write(
        &self,
        _endpoint: &Endpoint,
        batch: &SealedBatch,
    ) -> impl Future<Output = Result<(), WriteError>> + Send {
        self.rows.fetch_add(batch.rows(), Ordering::Relaxed);
        std::future::ready(Ok(()))
    }

    fn probe(&self, _endpoint: &Endpoint) -> impl Future<Output = Result<(), WriteError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// The row body after the 8-byte offset: printable filler.
fn row_body() -> [u8; ROW_BYTES - 8] {
    let mut body = [0u8; ROW_BYTES - 8];
    for (i, b) in body.iter_mut().enumerate() {
        *b = b"spate-bench-row "[i % 16];
    }
    body
}

/// Where sealed chunks go.
enum Seal {
    /// Clear the buffer, deliver the acks.
    Discard,
    /// Budget + `Chunk::new`, then drop the chunk.
    Local,
    /// Budget + `Chunk::new` + `try_send` to shard 0.
    Pool(PoolHandle),
}

/// Waits the pipeline thread had to make.
#[derive(Debug, Default)]
struct Waits {
    chunks: u64,
    queue_full: u64,
    budget_full: u64,
}

/// A hand-rolled terminal stage for one shard, fed by one lane: the same
/// per-row work as the real one, with each step separable.
struct SimTerminal {
    issuer: AckIssuer,
    rx: AckReceiver,
    ack: Option<AckHandle>,
    next_offset: i64,
    body: [u8; ROW_BYTES - 8],
    buf: BytesMut,
    rows: u64,
    acks: AckSet,
    chunk_rows: u64,
    budget: Arc<Budget>,
    seal: Seal,
    waits: Waits,
    resolutions: u64,
}

impl SimTerminal {
    fn new(chunk_rows: u64, seal: Seal) -> Self {
        let (tx, rx) = ack_channel();
        Self {
            issuer: AckIssuer::new(TopicPartition::new("bench-topic", 0), 1, tx),
            rx,
            ack: None,
            next_offset: 0,
            body: row_body(),
            buf: BytesMut::with_capacity(chunk_rows as usize * ROW_BYTES),
            rows: 0,
            acks: AckSet::new(),
            chunk_rows,
            budget: Budget::new(BUDGET_BYTES, BUDGET_ROWS),
            seal,
            waits: Waits::default(),
            resolutions: 0,
        }
    }

    /// One record through the terminal stage.
    #[inline]
    fn push_row(&mut self) {
        let offset = self.next_offset;
        if offset % BATCH_RECORDS == 0 {
            // A new poll batch: the source issues its handle (dropping the
            // previous batch's lane-side handle).
            self.ack = Some(self.issuer.issue(offset, offset + BATCH_RECORDS - 1));
        }
        self.next_offset += 1;
        self.buf.put_i64_le(offset);
        self.buf.extend_from_slice(&self.body);
        self.acks.push(self.ack.as_ref().expect("issued above"));
        self.rows += 1;
        if self.rows == self.chunk_rows {
            self.seal();
        }
    }

    fn seal(&mut self) {
        let rows = std::mem::replace(&mut self.rows, 0);
        let acks = std::mem::take(&mut self.acks);
        if matches!(self.seal, Seal::Discard) {
            black_box(&self.buf);
            self.buf.clear();
            acks.deliver();
            return;
        }
        let bytes = self.buf.len() as u64;
        let permit = loop {
            if let Some(p) = Budget::try_acquire(&self.budget, bytes, rows) {
                break p;
            }
            self.waits.budget_full += 1;
            std::thread::yield_now();
        };
        let cap = self.chunk_rows as usize * ROW_BYTES;
        let data = std::mem::replace(&mut self.buf, BytesMut::with_capacity(cap)).freeze();
        let mut chunk = Chunk::new(data, rows, acks, permit);
        self.waits.chunks += 1;
        match &self.seal {
            Seal::Discard => unreachable!(),
            Seal::Local => drop(black_box(chunk)),
            Seal::Pool(pool) => loop {
                match pool.try_send(0, chunk) {
                    Ok(()) => break,
                    Err(PushError::Full(c)) => {
                        chunk = c;
                        self.waits.queue_full += 1;
                        std::thread::yield_now();
                    }
                    Err(PushError::Closed(_)) => panic!("sink pool closed during the bench"),
                }
            },
        }
    }

    /// The checkpointer's side, off the row path: take what resolved.
    fn drain_acks(&mut self) {
        while self.rx.try_recv().is_some() {
            self.resolutions += 1;
        }
    }
}

/// A one-worker multi-thread runtime with a one-shard discarding pool on it.
fn start_pool() -> (
    tokio::runtime::Runtime,
    SinkPool<DiscardWriter>,
    Arc<DiscardWriter>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .expect("tokio runtime");
    let writer = Arc::new(DiscardWriter::default());
    let config = SinkConfig::new("bench", vec![vec!["discard://shard0".into()]]);
    let pool = SinkPool::start(
        config,
        Arc::clone(&writer),
        RunNonce::from_u64(1),
        rt.handle(),
    )
    .expect("valid sink config");
    (rt, pool, writer)
}

/// Drains `pool` and checks that every row sent was written and every permit
/// returned; returns the batches written.
fn drain_pool(
    rt: &tokio::runtime::Runtime,
    pool: SinkPool<DiscardWriter>,
    writer: &DiscardWriter,
    budget: &Budget,
    sent: u64,
) -> u64 {
    let report = rt.block_on(pool.drain(tokio::time::Instant::now() + Duration::from_secs(10)));
    assert!(report.is_clean(), "drain not clean: {report:?}");
    assert_eq!(report.rows_flushed(), sent);
    assert_eq!(writer.rows.load(Ordering::Relaxed), sent);
    assert_eq!(budget.bytes_in_use(), 0, "budget not returned");
    report.batches_flushed()
}

fn group(c: &mut Criterion) -> criterion::BenchmarkGroup<'_, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group("chunk");
    g.throughput(Throughput::Elements(ROWS_PER_ITER));
    g.sample_size(30);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    g
}

fn sim_terminal(c: &mut Criterion) {
    let mut g = group(c);
    for chunk_rows in CHUNK_ROWS {
        for kind in ["encode_ack", "local_seal"] {
            let seal = if kind == "encode_ack" {
                Seal::Discard
            } else {
                Seal::Local
            };
            let mut t = SimTerminal::new(chunk_rows, seal);
            g.bench_function(BenchmarkId::new(kind, chunk_rows), |b| {
                b.iter(|| {
                    for _ in 0..ROWS_PER_ITER {
                        t.push_row();
                    }
                    t.drain_acks();
                });
            });
            assert_eq!(t.budget.bytes_in_use(), 0);
        }

        let (rt, pool, writer) = start_pool();
        let mut t = SimTerminal::new(chunk_rows, Seal::Pool(pool.handle()));
        g.bench_function(BenchmarkId::new("to_pool", chunk_rows), |b| {
            b.iter(|| {
                for _ in 0..ROWS_PER_ITER {
                    t.push_row();
                }
                t.drain_acks();
            });
        });
        let sent = t.next_offset as u64;
        let batches = drain_pool(&rt, pool, &writer, &t.budget, sent);
        drop(t.ack.take());
        t.drain_acks();
        assert_eq!(
            t.resolutions,
            t.issuer.issued(),
            "a poll batch did not resolve"
        );
        eprintln!(
            "chunk/to_pool/{chunk_rows}: {sent} rows, {} chunks, {batches} batches written; \
             pipeline thread waited {} times on a full queue, {} on the budget",
            t.waits.chunks, t.waits.queue_full, t.waits.budget_full,
        );
    }
    g.finish();
}

/// The engine's terminal stage buffers for one shard, fed by one lane.
struct RealTerminal {
    partition: TopicPartition,
    issuer: AckIssuer,
    rx: AckReceiver,
    next_offset: i64,
    body: [u8; ROW_BYTES - 8],
    buffers: ChunkBuffers,
    budget: Arc<Budget>,
    blocked_flushes: u64,
}

impl RealTerminal {
    /// One poll batch of [`BATCH_RECORDS`] records through the terminal stage,
    /// then the driver's end-of-round seal and flush.
    fn poll_batch(&mut self) {
        let first = self.next_offset;
        let last = first + BATCH_RECORDS - 1;
        self.next_offset = last + 1;
        let ack = self.issuer.issue(first, last);
        for offset in first..=last {
            let cx = RecordCx {
                payload: Payload {
                    value: Some(&self.body),
                    key: None,
                    partition: &self.partition,
                    offset,
                    timestamp_ms: None,
                    timestamp_kind: spate_core::record::TimestampKind::None,
                    headers: spate_core::record::Headers::NONE,
                },
                ack: &ack,
            };
            self.buffers
                .append(0, &cx, |buf| {
                    buf.extend_from_slice(&cx.payload.offset.to_le_bytes());
                    buf.extend_from_slice(cx.payload.bytes());
                    Ok(())
                })
                .expect("encode never fails");
        }
        drop(ack);
        self.buffers.seal_lingering(tokio::time::Instant::now());
        while self.buffers.flush() == Flush::Blocked {
            self.blocked_flushes += 1;
            std::thread::yield_now();
        }
    }
}

fn chunk_buffers(c: &mut Criterion) {
    let mut g = group(c);
    let configs = [
        (
            "1000",
            ChunkConfig {
                max_rows: 1000,
                max_bytes: 1 << 20,
                linger: Duration::from_secs(3600),
            },
        ),
        ("default", ChunkConfig::default()),
    ];
    for (name, config) in configs {
        let (rt, pool, writer) = start_pool();
        let budget = Budget::new(BUDGET_BYTES, BUDGET_ROWS);
        let (tx, rx) = ack_channel();
        let partition = TopicPartition::new("bench-topic", 0);
        let mut t = RealTerminal {
            issuer: AckIssuer::new(partition.clone(), 1, tx),
            partition,
            rx,
            next_offset: 0,
            body: row_body(),
            buffers: ChunkBuffers::new(pool.handle(), Arc::clone(&budget), config),
            budget,
            blocked_flushes: 0,
        };
        g.bench_function(BenchmarkId::new("chunk_buffers", name), |b| {
            b.iter(|| {
                for _ in 0..ROWS_PER_ITER / BATCH_RECORDS as u64 {
                    t.poll_batch();
                }
                while t.rx.try_recv().is_some() {}
            });
        });
        t.buffers.seal_all();
        while t.buffers.flush() == Flush::Blocked {
            std::thread::yield_now();
        }
        let sent = t.next_offset as u64;
        assert_eq!(t.buffers.rows_encoded(), sent);
        let batches = drain_pool(&rt, pool, &writer, &t.budget, sent);
        eprintln!(
            "chunk/chunk_buffers/{name}: {sent} rows, {batches} batches written; \
             {} flushes found the queue or budget full",
            t.blocked_flushes,
        );
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    sim_terminal(&mut c);
    chunk_buffers(&mut c);
    c.final_summary();
}
