//! The synthetic pipeline on one pipeline thread (issue 3): an in-memory lane
//! of 100-byte payloads -> `PayloadDecoder` -> a RowBinary-like encoder (LEB128
//! length + bytes, as RowBinary writes a String) -> round-robin over 2 shards
//! -> the real terminal stage, sink pool and shard workers -> a writer that
//! discards. Driven through the engine's own [`Driver::step`], so it measures
//! the lane driver, the chain, chunk sealing, budget and queue hand-off.
//!
//! The sink pool runs on a one-worker tokio runtime (the second core); the
//! pipeline thread is the bench thread. Throughput is in rows.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use spate_core::ack::{AckIssuer, ack_channel};
use spate_core::budget::Budget;
use spate_core::pipeline::OnError;
use spate_core::pipeline::chain::{Encoder, PayloadDecoder, RecordCx, RecordError, RoundRobin};
use spate_core::pipeline::driver::{ChainProcessor, Driver, RecordCounters};
use spate_core::pipeline::terminal::{ChunkBuffers, ChunkConfig, Terminal};
use spate_core::record::{Epoch, Offset, Payload, TopicPartition};
use spate_core::sink::{Endpoint, RunNonce, SealedBatch, SinkConfig, SinkPool, WriteError, Writer};
use spate_core::source::{Lane, PollBatch, SourceError};

const PAYLOAD: usize = 100;
const POLL: usize = 500;
const ROWS_PER_ITER: u64 = 200_000;

/// A lane over one shared buffer of fixed-size payloads, endlessly.
struct MemLane {
    tp: TopicPartition,
    data: Arc<Vec<u8>>,
    records: usize,
    position: Offset,
    batch_start: Offset,
    batch_len: usize,
}

struct MemBatch<'a> {
    lane: &'a MemLane,
}

impl<'a> PollBatch<'a> for MemBatch<'a> {
    fn len(&self) -> usize {
        self.lane.batch_len
    }

    fn payload(&self, index: usize) -> Payload<'a> {
        let offset = self.lane.batch_start + index as Offset;
        let i = offset as usize % self.lane.records;
        Payload {
            value: Some(&self.lane.data[i * PAYLOAD..(i + 1) * PAYLOAD]),
            key: None,
            partition: &self.lane.tp,
            offset,
            timestamp_ms: None,
            timestamp_kind: spate_core::record::TimestampKind::None,
            headers: spate_core::record::Headers::NONE,
        }
    }
}

impl Lane for MemLane {
    type Batch<'a> = MemBatch<'a>;

    fn partition(&self) -> &TopicPartition {
        &self.tp
    }

    fn epoch(&self) -> Epoch {
        1
    }

    fn poll(&mut self, _timeout: Duration) -> Result<MemBatch<'_>, SourceError> {
        self.batch_start = self.position;
        self.batch_len = POLL;
        self.position += POLL as Offset;
        Ok(MemBatch { lane: self })
    }

    fn pause(&mut self) -> Result<(), SourceError> {
        Ok(())
    }

    fn resume(&mut self) -> Result<(), SourceError> {
        Ok(())
    }
}

/// RowBinary's String layout: LEB128 length, then the bytes.
#[derive(Clone, Copy)]
struct StringRow;

impl<'a> Encoder<Payload<'a>> for StringRow {
    #[inline]
    fn encode(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let bytes = record.bytes();
        let mut n = bytes.len();
        while n >= 0x80 {
            buf.push((n as u8) | 0x80);
            n >>= 7;
        }
        buf.push(n as u8);
        buf.extend_from_slice(bytes);
        Ok(())
    }
}

struct Discard;

impl Writer for Discard {
    async fn write(&self, _endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        black_box(batch.bytes());
        Ok(())
    }

    async fn probe(&self, _endpoint: &Endpoint) -> Result<(), WriteError> {
        Ok(())
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut sink = SinkConfig::new("bench", vec![vec!["a".into()], vec!["b".into()]]);
    sink.queue_chunks = 64;
    sink.max_inflight = 4;
    let pool =
        SinkPool::start(sink, Arc::new(Discard), RunNonce::from_u64(1), rt.handle()).expect("pool");
    let budget = Budget::new(1 << 30, 1 << 30);
    let buffers = ChunkBuffers::new(pool.handle(), budget, ChunkConfig::default());
    let processor = ChainProcessor::new(
        PayloadDecoder,
        Terminal::new(StringRow, RoundRobin::default(), buffers),
    );
    let counters = Arc::new(RecordCounters::default());
    let mut driver = Driver::new(processor, OnError::Fail, None, Arc::clone(&counters));
    let tp = TopicPartition::new("bench", 0);
    let (tx, mut rx) = ack_channel();
    let records = 4_096;
    let data: Vec<u8> = (0..records * PAYLOAD)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    driver.assign(
        MemLane {
            tp: tp.clone(),
            data: Arc::new(data),
            records,
            position: 0,
            batch_start: 0,
            batch_len: 0,
        },
        AckIssuer::new(tp, 1, tx),
    );
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(ROWS_PER_ITER));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("synthetic_one_thread_100B", |b| {
        b.iter(|| {
            let target = counters.polled.load(std::sync::atomic::Ordering::Relaxed) + ROWS_PER_ITER;
            while counters.polled.load(std::sync::atomic::Ordering::Relaxed) < target {
                driver.step(tokio::time::Instant::now()).expect("step");
                while rx.try_recv().is_some() {}
                if driver.is_paused() {
                    std::thread::yield_now();
                }
            }
        })
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
