//! `delivery: effectively_once` end to end (D9): scripted source -> chain ->
//! capture writer on a paused tokio clock (D7).
//!
//! - a crash (the run dropped, acks never committed) and a restart from the
//!   committed offset and metadata replay the same batches: same tokens,
//!   same bytes, even with other poll batch sizes;
//! - nothing is written before the commit recording its range returned Ok;
//! - a full range list pauses the lane (polled on, D2);
//! - D1 holds: what the last commit says is pending covers every range not
//!   acknowledged.

use std::collections::BTreeMap;
use std::time::Duration;

use spate_core::checkpoint::ranges::{self, MAX_PENDING_RANGES};
use spate_core::pipeline::chain::{Encoder, PayloadDecoder, RecordCx, Router};
use spate_core::pipeline::driver::{ChainProcessor, Processor};
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::pipeline::{Delivery, ExitStatus, Pipeline, PipelineConfig, RunReport, Shutdown};
use spate_core::record::{Offset, TopicPartition};
use spate_core::sink::{RunNonce, SinkConfig, range_token};
use spate_testkit::{
    Attempt, CaptureWriter, LineEncoder, ScriptHandle, ScriptedSource, WriterMode,
};

fn tp() -> TopicPartition {
    TopicPartition::new("t", 0)
}

/// Routes by offset: a function of the record, as effectively_once needs.
struct ByOffset;

impl<T> Router<T> for ByOffset {
    fn route(&mut self, _record: &T, cx: &RecordCx<'_>, shards: usize) -> usize {
        cx.payload.offset as usize % shards
    }
}

fn chain(buffers: ChunkBuffers) -> impl Processor {
    ChainProcessor::new(
        PayloadDecoder,
        Terminal::new(LineEncoder, ByOffset, buffers),
    )
}

/// Two shards, parts of at most `rows` rows, watermark commits every 50 ms.
fn config(rows: u64) -> PipelineConfig {
    let mut sink = SinkConfig::new("eo", vec![vec!["mem://s0".into()], vec!["mem://s1".into()]]);
    sink.batch.max_rows = rows;
    sink.batch.linger = Duration::from_millis(20);
    sink.write_timeout = Duration::from_secs(3600);
    let mut c = PipelineConfig::new(sink);
    c.delivery = Delivery::EffectivelyOnce;
    c.table = "db.t".into();
    c.checkpoint_interval = Duration::from_millis(50);
    c.shutdown_drain_timeout = Duration::from_secs(2);
    c
}

fn fill(script: &ScriptHandle, n: usize) {
    for _ in 0..n {
        let next = script.end_offset(&tp());
        script.append(&tp(), format!("0-{next}"));
    }
}

/// Runs for `time` of tokio time, then drops the run without a shutdown:
/// a crash (whatever was not committed is lost; writes in flight may land).
async fn crash_after(
    source: ScriptedSource,
    writer: &CaptureWriter,
    c: PipelineConfig,
    time: Duration,
) {
    let pipeline = Pipeline::builder(c, source, writer.clone(), chain)
        .nonce(RunNonce::from_u64(1))
        .build()
        .expect("valid config");
    let run = tokio::spawn(pipeline.run_inline(Shutdown::new()));
    tokio::time::sleep(time).await;
    run.abort();
    let _ = run.await;
}

async fn run_until(
    source: ScriptedSource,
    writer: &CaptureWriter,
    c: PipelineConfig,
    mut done: impl FnMut() -> bool,
) -> RunReport {
    let pipeline = Pipeline::builder(c, source, writer.clone(), chain)
        .nonce(RunNonce::from_u64(2))
        .build()
        .expect("valid config");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    for _ in 0..6_000 {
        if done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(done(), "not reached within 60 s of tokio time");
    shutdown.trigger();
    run.await.expect("pipeline task")
}

/// `(first, last)` of a range token `eo:db.t:t:0:{first}-{last}:{shard}`.
fn bounds(token: &str) -> (Offset, Offset) {
    let f: Vec<&str> = token.split(':').collect();
    let (a, b) = f[4].split_once('-').expect("first-last");
    (a.parse().unwrap(), b.parse().unwrap())
}

/// D9: after a crash the restarted run re-forms the recorded ranges: every
/// batch written twice carries the same token and the same bytes; keeping
/// one copy per token, every offset lands exactly once.
#[tokio::test(start_paused = true)]
async fn a_replay_after_a_crash_rewrites_the_same_tokens_and_bytes() {
    const N: usize = 195;
    let (source, script) = ScriptedSource::new(7);
    script.assign(&tp());
    let writer = CaptureWriter::new();
    // The first write never answers: the watermark stays at 0 and every
    // later range stays pending in the metadata.
    writer.script([WriterMode::Hang]);
    // Records arrive in waves of 13: the first run seals a range at each
    // idle pause, where the restarted run (all records there at once)
    // would seal by size (10 rows per shard part): only the recorded
    // boundaries make the replay's batches the same.
    let feeder = {
        let script = script.clone();
        tokio::spawn(async move {
            for _ in 0..N / 13 {
                fill(&script, 13);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    crash_after(source, &writer, config(10), Duration::from_millis(600)).await;
    feeder.await.expect("feeder");
    assert_eq!(script.end_offset(&tp()), N as Offset);
    let first: Vec<Attempt> = writer.attempts();
    assert!(
        first.len() > 4,
        "the first run wrote its ranges: {}",
        first.len()
    );
    let pending = ranges::decode(&script.committed_metadata(&tp())).expect("ours");
    assert!(pending.len() > 4, "ranges recorded: {pending:?}");
    assert_eq!(
        script.committed(&tp()),
        Some(0),
        "the hanging range holds the watermark"
    );

    // Restart with other poll batch sizes (boundaries fall inside them).
    let (source, script) = ScriptedSource::restarted(&script, 5);
    script.assign(&tp());
    let report = run_until(source, &writer, config(10), || {
        script.committed(&tp()) == Some(N as Offset)
    })
    .await;
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    let all = writer.attempts();
    let second = &all[first.len()..];
    let by_token: BTreeMap<&str, &Attempt> = first.iter().map(|a| (a.token.as_str(), a)).collect();
    let mut replayed = 0;
    for a in second {
        if let Some(before) = by_token.get(a.token.as_str()) {
            assert_eq!(a.body, before.body, "{}: same token, same bytes", a.token);
            replayed += 1;
        } else {
            // A new range starts after every recorded one.
            let (f, _) = bounds(&a.token);
            assert!(
                pending.iter().all(|r| f > r.1),
                "{} overlaps a recorded range",
                a.token
            );
        }
    }
    assert!(
        replayed >= first.len() - 1,
        "{replayed} of {} replayed",
        first.len()
    );
    // Each token once (the server's dedup): every offset exactly once.
    let mut seen: BTreeMap<String, &Attempt> = BTreeMap::new();
    for a in all.iter().filter(|a| a.accepted) {
        seen.entry(a.token.clone()).or_insert(a);
    }
    let mut offsets: Vec<Offset> = seen
        .values()
        .flat_map(|a| {
            a.body
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    std::str::from_utf8(l).unwrap()[2..]
                        .parse::<Offset>()
                        .unwrap()
                })
        })
        .collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (0..N as Offset).collect::<Vec<_>>());
    // The tokens are the range tokens of their bounds and shard.
    for a in &all {
        let (f, l) = bounds(&a.token);
        assert_eq!(
            a.token,
            range_token("eo", "db.t", &tp(), f, l, a.endpoint.shard)
        );
    }
}

/// D9: a range reaches the writer only after the commit recording it
/// returned Ok: while every commit fails nothing is written; once they
/// succeed, everything is.
#[tokio::test(start_paused = true)]
async fn nothing_is_written_before_its_range_is_recorded() {
    let (source, script) = ScriptedSource::new(16);
    fill(&script, 100);
    script.assign(&tp());
    script.fail_commits(u32::MAX);
    let writer = CaptureWriter::new();
    let pipeline = Pipeline::builder(config(10), source, writer.clone(), chain)
        .build()
        .expect("valid config");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(script.polls() > 0);
    assert!(
        writer.attempts().is_empty(),
        "written before recorded: {:?}",
        writer.attempts()
    );
    script.fail_commits(0);
    for _ in 0..500 {
        if script.committed(&tp()) == Some(100) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(script.committed(&tp()), Some(100));
    // Every commit in this mode carries the pending ranges; the last has none.
    assert!(script.commits().iter().all(|c| c.metadata.is_some()));
    assert_eq!(script.committed_metadata(&tp()), "");
    shutdown.trigger();
    let report = run.await.expect("pipeline task");
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
}

/// D9 + D2: a lane whose pending range list is as long as the metadata
/// fits seals no more ranges and pauses, polled on; the list never passes
/// the bound.
#[tokio::test(start_paused = true)]
async fn a_full_range_list_pauses_the_lane_and_keeps_polling() {
    let (source, script) = ScriptedSource::new(4);
    fill(&script, 3 * MAX_PENDING_RANGES);
    script.assign(&tp());
    let writer = CaptureWriter::new();
    writer.script([WriterMode::Hang]);
    let pipeline = Pipeline::builder(config(1), source, writer.clone(), chain)
        .build()
        .expect("valid config");
    let run = tokio::spawn(pipeline.run_inline(Shutdown::new()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let polls = script.polls();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(script.polls() > polls, "the paused lane is polled on (D2)");
    let longest = script
        .commits()
        .iter()
        .map(|c| {
            ranges::decode(c.metadata.as_deref().unwrap_or(""))
                .unwrap()
                .len()
        })
        .max()
        .unwrap_or(0);
    assert_eq!(
        longest, MAX_PENDING_RANGES,
        "the list fills up to its bound, never past it"
    );
    let tokens: std::collections::BTreeSet<(Offset, Offset)> =
        writer.attempts().iter().map(|a| bounds(&a.token)).collect();
    assert!(
        tokens.len() <= MAX_PENDING_RANGES,
        "{} ranges written",
        tokens.len()
    );
    assert!(script.committed_metadata(&tp()).len() <= ranges::MAX_METADATA_BYTES);
    run.abort();
}

/// D9 + D1: a member whose commits are rejected (fenced) records nothing,
/// so it writes nothing; after the revoke releases the epoch, what it held
/// is dropped without stopping the run, and nothing was committed.
#[tokio::test(start_paused = true)]
async fn a_fenced_member_writes_nothing_and_the_revoke_drops_what_it_held() {
    let (source, script) = ScriptedSource::new(16);
    fill(&script, 100);
    script.assign(&tp());
    script.reject_commits(true);
    let writer = CaptureWriter::new();
    let mut c = config(10);
    c.rebalance_drain_timeout = Duration::from_millis(200);
    let pipeline = Pipeline::builder(c, source, writer.clone(), chain)
        .build()
        .expect("valid config");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(script.polls() > 0);
    script.revoke(&tp());
    for _ in 0..200 {
        if !script.released().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(script.released().len(), 1, "the revoke completed");
    tokio::time::sleep(Duration::from_millis(100)).await;
    shutdown.trigger();
    let report = run.await.expect("pipeline task");
    assert!(
        writer.attempts().is_empty(),
        "a fenced member wrote: {:?}",
        writer.attempts()
    );
    assert!(script.commits().is_empty());
    assert!(report.error.is_none(), "{}", report.summary());
    assert!(report.frozen.is_empty(), "{}", report.summary());
}

/// Thread mode: ranges sealed by the shutdown itself are recorded while the
/// threads drain (the controller records between its drain rounds), so a
/// stop right after the data arrived is clean: what was polled is written
/// once per range token and committed to the end of what was written.
#[test]
fn shutdown_in_thread_mode_records_and_writes_the_ranges_it_seals() {
    let (source, script) = ScriptedSource::new(9);
    let tps: Vec<TopicPartition> = (0..3).map(|p| TopicPartition::new("t", p)).collect();
    for tp in &tps {
        for i in 0..300 {
            script.append(tp, format!("{}-{i}", tp.partition()));
        }
        script.assign(tp);
    }
    let writer = CaptureWriter::new();
    let mut c = config(1_000);
    c.threads = 2;
    c.sink.batch.linger = Duration::from_secs(30);
    let pipeline = Pipeline::builder(c, source, writer.clone(), chain)
        .build()
        .expect("valid config");
    let shutdown = Shutdown::new();
    let watcher = {
        let (shutdown, script) = (shutdown.clone(), script.clone());
        std::thread::spawn(move || {
            while script.polls() < 3 {
                std::thread::sleep(Duration::from_millis(1));
            }
            shutdown.trigger();
        })
    };
    let report = pipeline.run_threaded(shutdown, 1);
    watcher.join().expect("watcher");
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    let attempts = writer.attempts();
    assert!(!attempts.is_empty(), "the shutdown's ranges were written");
    let tokens: std::collections::BTreeSet<&str> =
        attempts.iter().map(|a| a.token.as_str()).collect();
    assert_eq!(tokens.len(), attempts.len(), "each range part written once");
    for tp in &tps {
        let mut offsets: Vec<Offset> = writer
            .accepted_lines()
            .iter()
            .filter_map(|l| {
                let s = std::str::from_utf8(l).unwrap();
                let (p, o) = s.split_once('-').unwrap();
                (p.parse::<i32>().unwrap() == tp.partition()).then(|| o.parse().unwrap())
            })
            .collect();
        offsets.sort_unstable();
        let n = offsets.len() as Offset;
        assert_eq!(
            offsets,
            (0..n).collect::<Vec<_>>(),
            "{tp}: a prefix, once each"
        );
        assert_eq!(
            script.committed(tp).unwrap_or(0),
            n,
            "{tp}: committed what was written"
        );
        if n > 0 {
            assert_eq!(
                script.committed_metadata(tp),
                "",
                "{tp}: nothing left pending"
            );
        }
    }
}

/// D8: an open range takes budget as it grows, so a stalled sink stalls
/// intake, not memory: with every write hanging and ranges that would
/// otherwise grow to the whole log (no size or linger seal), what is polled
/// stays near the in-flight budget.
#[tokio::test(start_paused = true)]
async fn open_ranges_take_budget_as_they_grow_so_a_stalled_sink_stalls_intake() {
    let (source, script) = ScriptedSource::new(16);
    // Rows "0-NNNN\n": 7 bytes.
    for i in 1000..3000 {
        script.append(&tp(), format!("0-{i}"));
    }
    script.assign(&tp());
    let writer = CaptureWriter::new();
    writer.set_mode(WriterMode::Hang);
    let mut c = config(1_000_000);
    c.sink.batch.max_bytes = 1 << 30;
    c.sink.batch.linger = Duration::from_secs(3600);
    c.chunk.max_bytes = 256;
    c.budget_bytes = 2048;
    c.shutdown_drain_timeout = Duration::from_millis(100);
    let pipeline = Pipeline::builder(c, source, writer.clone(), chain)
        .build()
        .expect("valid config");
    let budget = pipeline.budget();
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(budget.bytes_in_use() <= 2048, "{}", budget.bytes_in_use());
    let polls = script.polls();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(script.polls() > polls, "the paused lane is polled on (D2)");
    shutdown.trigger();
    let report = run.await.expect("pipeline task");
    // The budget (2048 bytes, about 290 rows) plus a chunk's worth and a
    // poll batch, not the 2,000 records of the log.
    assert!(report.polled < 400, "{}", report.summary());
}

/// Encodes as [`LineEncoder`]; refuses (on the encoded bytes) the rows of
/// offsets divisible by 3.
struct KeepLines;

impl<'a> Encoder<spate_core::record::Payload<'a>> for KeepLines {
    fn encode(
        &mut self,
        record: &spate_core::record::Payload<'a>,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), spate_core::pipeline::chain::RecordError> {
        LineEncoder.encode(record, cx, buf)
    }

    fn keep(&mut self, row: &[u8]) -> bool {
        let text = std::str::from_utf8(row).unwrap().trim_end();
        let offset: u64 = text.rsplit('-').next().unwrap().parse().unwrap();
        offset % 3 != 0
    }
}

/// effectively_once with rows refused by Encoder::keep (mapping.filter's
/// hook): the kept rows land once each, the refused ones never, and the
/// committed offset reaches the end past the filtered ones (D1, D6, D9).
#[tokio::test(start_paused = true)]
async fn rows_refused_by_keep_are_left_out_of_their_ranges_and_still_commit() {
    const N: usize = 300;
    let (source, script) = ScriptedSource::new(7);
    fill(&script, N);
    script.assign(&tp());
    let writer = CaptureWriter::new();
    let chain = |buffers: ChunkBuffers| {
        ChainProcessor::new(PayloadDecoder, Terminal::new(KeepLines, ByOffset, buffers))
    };
    let pipeline = Pipeline::builder(config(40), source, writer.clone(), chain)
        .nonce(RunNonce::from_u64(3))
        .build()
        .expect("valid config");
    let shutdown = Shutdown::new();
    let run = tokio::spawn(pipeline.run_inline(shutdown.clone()));
    for _ in 0..6_000 {
        if script.committed(&tp()) == Some(N as Offset) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(script.committed(&tp()), Some(N as Offset));
    shutdown.trigger();
    let report = run.await.expect("pipeline task");
    assert_eq!(report.status, ExitStatus::Clean, "{}", report.summary());
    let mut got: Vec<String> = writer
        .accepted_lines()
        .iter()
        .map(|l| String::from_utf8(l.to_vec()).unwrap())
        .collect();
    got.sort();
    got.dedup();
    let mut want: Vec<String> = (0..N)
        .filter(|o| o % 3 != 0)
        .map(|o| format!("0-{o}"))
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(
        writer.accepted_lines().len(),
        want.len(),
        "each kept row once"
    );
}

/// The scripted source's range lane (issue 38, ADR 0007's seam): off by
/// default (as for Kafka: refused), and when on it reads `first..=last` of a
/// partition this member was never assigned, in poll batches of its size,
/// then nothing, also as the log grows; its epoch names no assignment.
#[test]
fn a_scripted_range_lane_reads_its_range_outside_the_assignment() {
    use spate_core::source::{Lane, PollBatch, RANGE_LANE_EPOCH, Source};
    fn offsets(lane: &mut impl Lane) -> Vec<Offset> {
        let mut got = Vec::new();
        loop {
            let b = lane.poll(Duration::ZERO).expect("poll");
            if b.is_empty() {
                return got;
            }
            got.extend((0..b.len()).map(|i| b.payload(i).offset));
        }
    }
    let (mut source, script) = ScriptedSource::new(2);
    let other = TopicPartition::new("t", 7);
    for i in 0..10 {
        script.append(&other, format!("r{i}"));
    }
    assert!(!source.reads_ranges());
    assert!(source.read_range(&other, 2, 6).is_err());
    script.read_ranges(true);
    assert!(source.reads_ranges());
    let mut lane = source.read_range(&other, 2, 6).expect("range lane");
    assert_eq!(lane.epoch(), RANGE_LANE_EPOCH);
    assert_eq!(offsets(&mut lane), vec![2, 3, 4, 5, 6]);
    script.append(&other, "r10");
    assert!(offsets(&mut lane).is_empty());
    assert!(source.read_range(&other, 6, 2).is_err());
}
