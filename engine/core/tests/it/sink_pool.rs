//! Integration tests of the sink pool against scripted fake writers.
//!
//! Every test but one runs on a current-thread tokio runtime with paused time,
//! so "later" means simulated time and every run replays (D7). The fake writer
//! records each attempt (endpoint, token, the concatenated bytes of
//! `batch.segments()`, rows, the tokio instant) and answers as the test's
//! script says: ok, retryable, fatal, never, after a gate opens, after a sleep,
//! or after blocking its OS thread.
//!
//! Chunks carry real acks: each chunk is one poll batch issued by an
//! [`AckIssuer`], so the resolutions on the [`AckReceiver`] show exactly which
//! data the pool delivered or failed (D1).
//!
//! Properties: D4 (same bytes and token on retry, distinct tokens across
//! batches and pools), D1 (acks delivered once on success, failed on abandon
//! or drain abort), D5 (bounded drain, also with a writer that never answers
//! or blocks its thread), D2/D8 (a stalled shard turns into `PushError::Full`
//! and a bounded budget), breaker rotation, sealing by rows, bytes, linger
//! and drain, and the drain report's and metrics' counts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use spate_core::ack::{AckIssuer, AckReceiver, AckSet, Outcome, Resolution, ack_channel};
use spate_core::budget::{Budget, BudgetPermit};
use spate_core::checkpoint::Tracker;
use spate_core::record::{Offset, TopicPartition};
use spate_core::sink::{
    BatchConfig, BreakerConfig, Chunk, DRAIN_GRACE, Endpoint, PushError, RetryConfig, RunNonce,
    SealedBatch, SinkConfig, SinkPool, WriteError, Writer,
};
use tokio::runtime::Handle;
use tokio::time::{Instant, sleep};

// ---------------------------------------------------------------------------
// The scripted fake writer.

/// One write attempt as the writer saw it.
#[derive(Clone, Debug)]
struct Attempt {
    endpoint: Endpoint,
    token: String,
    /// `batch.segments()` concatenated: the insert body.
    bytes: Vec<u8>,
    rows: u64,
    segments: usize,
    /// Tokio time of the call.
    at: Instant,
    /// Earlier attempts with the same token (0 for the first).
    retry: usize,
    /// The batch's layout.
    layout: u64,
}

/// How the writer answers one attempt.
#[derive(Clone, Debug)]
enum Step {
    Ok,
    Fail(WriteError),
    /// Never answers.
    Hang,
    /// Answers `Ok` once the gate opens.
    Gate,
    /// Answers `Ok` after this much tokio time.
    Sleep(Duration),
    /// Blocks its OS thread until the thread gate opens, then fails fatally
    /// (a writer doing blocking I/O inside an async fn).
    BlockThread,
}

type Script = dyn Fn(&Attempt) -> Step + Send + Sync;

struct FakeWriter {
    attempts: Mutex<Vec<Attempt>>,
    script: Box<Script>,
    /// `Some(l)`: [`Writer::reseal`] re-seals into layout `l` with the bytes
    /// upper-cased; `None`: the trait's default (refused).
    reseal_to: Option<u64>,
    gate: tokio::sync::watch::Sender<bool>,
    thread_gate: Arc<(Mutex<bool>, Condvar)>,
    /// While true, [`Writer::probe`] fails; every probe is counted.
    probe_down: std::sync::atomic::AtomicBool,
    probes: std::sync::atomic::AtomicUsize,
}

impl FakeWriter {
    fn new(script: impl Fn(&Attempt) -> Step + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            attempts: Mutex::new(Vec::new()),
            script: Box::new(script),
            reseal_to: None,
            gate: tokio::sync::watch::channel(false).0,
            thread_gate: Arc::new((Mutex::new(false), Condvar::new())),
            probe_down: std::sync::atomic::AtomicBool::new(false),
            probes: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn ok() -> Arc<Self> {
        Self::new(|_| Step::Ok)
    }

    fn attempts(&self) -> Vec<Attempt> {
        self.attempts.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.attempts.lock().unwrap().len()
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    fn open_thread_gate(&self) {
        let (open, cv) = &*self.thread_gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
}

impl Writer for FakeWriter {
    fn write(
        &self,
        endpoint: &Endpoint,
        batch: &SealedBatch,
    ) -> impl Future<Output = Result<(), WriteError>> + Send {
        let step = {
            let mut log = self.attempts.lock().unwrap();
            let attempt = Attempt {
                endpoint: endpoint.clone(),
                token: batch.token().to_owned(),
                bytes: batch.segments().iter().flat_map(|s| s.to_vec()).collect(),
                rows: batch.rows(),
                segments: batch.segments().len(),
                at: Instant::now(),
                retry: log.iter().filter(|a| a.token == batch.token()).count(),
                layout: batch.layout(),
            };
            assert_eq!(attempt.bytes.len() as u64, batch.bytes());
            assert_eq!(batch.to_contiguous().as_ref(), attempt.bytes.as_slice());
            let step = (self.script)(&attempt);
            log.push(attempt);
            step
        };
        let mut gate = self.gate.subscribe();
        let thread_gate = Arc::clone(&self.thread_gate);
        async move {
            match step {
                Step::Ok => Ok(()),
                Step::Fail(e) => Err(e),
                Step::Hang => std::future::pending().await,
                Step::Gate => {
                    gate.wait_for(|open| *open)
                        .await
                        .expect("gate sender alive");
                    Ok(())
                }
                Step::Sleep(d) => {
                    sleep(d).await;
                    Ok(())
                }
                Step::BlockThread => {
                    let (open, cv) = &*thread_gate;
                    let mut g = open.lock().unwrap();
                    while !*g {
                        g = cv.wait(g).unwrap();
                    }
                    Err(WriteError::fatal("blocked writer gave up"))
                }
            }
        }
    }

    fn probe(&self, _endpoint: &Endpoint) -> impl Future<Output = Result<(), WriteError>> + Send {
        use std::sync::atomic::Ordering;
        self.probes.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if self.probe_down.load(Ordering::SeqCst) {
            Err(WriteError::retryable("probe: still down"))
        } else {
            Ok(())
        })
    }

    fn reseal(&self, batch: &SealedBatch) -> Result<SealedBatch, WriteError> {
        let Some(layout) = self.reseal_to else {
            return Err(WriteError::fatal("cannot re-seal"));
        };
        let upper: Vec<u8> = batch
            .segments()
            .iter()
            .flat_map(|s| s.to_ascii_uppercase())
            .collect();
        Ok(batch.resealed(layout, vec![Bytes::from(upper)]))
    }
}

// ---------------------------------------------------------------------------
// Rig: config, chunks with real acks, waiting in tokio time.

/// A config with `shards` x `replicas`, a batch per chunk (`max_rows` 1), no
/// linger in practice, fast retries and a fixed jitter seed (D7).
fn config(shards: usize, replicas: usize) -> SinkConfig {
    let urls = (0..shards)
        .map(|s| (0..replicas).map(|r| format!("http://s{s}r{r}")).collect())
        .collect();
    let mut c = SinkConfig::new("pipe", urls);
    c.batch = BatchConfig {
        max_rows: 1,
        max_bytes: 1 << 20,
        linger: Duration::from_secs(3600),
    };
    c.retry = RetryConfig {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(100),
        max_attempts: 5,
    };
    c.breaker = BreakerConfig {
        failure_threshold: 100,
        cooldown: Duration::from_secs(10),
    };
    c.max_inflight = 1;
    c.queue_chunks = 4;
    c.write_timeout = Duration::from_secs(3600);
    c.seed = Some(7);
    c
}

fn start(config: SinkConfig, writer: &Arc<FakeWriter>) -> SinkPool<FakeWriter> {
    SinkPool::start(
        config,
        Arc::clone(writer),
        RunNonce::from_u64(0xfeed),
        &Handle::current(),
    )
    .expect("valid config")
}

/// One partition's poll batches, one per chunk, plus the ack channel.
struct Feed {
    tp: TopicPartition,
    issuer: AckIssuer,
    rx: AckReceiver,
    next: Offset,
}

impl Feed {
    fn new(partition: i32) -> Self {
        let (tx, rx) = ack_channel();
        let tp = TopicPartition::new("t", partition);
        Self {
            issuer: AckIssuer::new(tp.clone(), 1, tx),
            tp,
            rx,
            next: 0,
        }
    }

    /// A chunk of `rows` rows encoded as `data`, holding the ack of a fresh
    /// poll batch of `rows` offsets (its only holder is the chunk's `AckSet`).
    fn chunk_with(&mut self, data: &[u8], rows: u64, permit: BudgetPermit) -> Chunk {
        let first = self.next;
        self.next += rows as Offset;
        let handle = self.issuer.issue(first, self.next - 1);
        let mut acks = AckSet::new();
        acks.push(&handle);
        Chunk::new(Bytes::copy_from_slice(data), rows, acks, permit)
    }

    fn chunk(&mut self, data: &[u8], rows: u64) -> Chunk {
        self.chunk_with(data, rows, BudgetPermit::unbounded())
    }

    /// Every resolution queued so far.
    fn resolutions(&mut self) -> Vec<Resolution> {
        std::iter::from_fn(|| self.rx.try_recv()).collect()
    }
}

/// Outcome per poll batch seq; panics if one resolved twice (D1).
fn outcomes(resolutions: &[Resolution]) -> BTreeMap<u64, Outcome> {
    let mut out = BTreeMap::new();
    for r in resolutions {
        assert!(
            out.insert(r.seq, r.outcome).is_none(),
            "poll batch {} resolved twice",
            r.seq
        );
    }
    out
}

/// Sleeps in small steps of tokio time until `cond` holds; fails after an
/// hour of tokio time (instant in paused time).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(3600);
    while !cond() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        sleep(Duration::from_millis(1)).await;
    }
}

fn send(pool: &SinkPool<FakeWriter>, shard: usize, chunk: Chunk) {
    pool.handle()
        .try_send(shard, chunk)
        .expect("queue has room");
}

// ---------------------------------------------------------------------------
// D4: tokens and bytes.

/// D4: a retry carries the identical bytes and the identical token, and goes
/// to the next replica in rotation.
#[tokio::test(start_paused = true)]
async fn retry_sends_identical_bytes_and_token() {
    let writer = FakeWriter::new(|a| {
        if a.retry == 0 {
            Step::Fail(WriteError::retryable("connection reset"))
        } else {
            Step::Ok
        }
    });
    let mut c = config(1, 2);
    c.batch.max_rows = 3;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"row-a;", 1));
    send(&pool, 0, feed.chunk(b"row-b;row-c;", 2));
    until("two attempts", || writer.count() == 2).await;

    let a = writer.attempts();
    assert_eq!(a[0].bytes, b"row-a;row-b;row-c;", "first attempt body");
    assert_eq!(a[0].segments, 2, "the batch merges both chunks");
    assert_eq!(a[1].bytes, a[0].bytes, "D4: retry changed the bytes");
    assert_eq!(a[1].token, a[0].token, "D4: retry changed the token");
    assert_eq!(a[0].token, "pipe-000000000000feed-0-0");
    assert_eq!((a[0].endpoint.replica, a[1].endpoint.replica), (0, 1));

    let report = pool.drain(Instant::now() + Duration::from_secs(5)).await;
    assert_eq!(report.batches_flushed(), 1);
    assert_eq!(report.shards[0].retries, 1);
    assert_eq!(writer.count(), 2, "no attempt after the success");
}

/// D4: two different batches never share a token, within a pool (shards and
/// sequence numbers) and across two pools of the same pipeline in one process
/// (each with its own `RunNonce::from_os()`); every token maps to one body.
#[tokio::test(start_paused = true)]
async fn different_batches_never_share_a_token_even_across_pools() {
    let writer = FakeWriter::ok();
    let pools: Vec<_> = (0..2)
        .map(|_| {
            SinkPool::start(
                config(2, 1),
                Arc::clone(&writer),
                RunNonce::from_os().expect("OS randomness"),
                &Handle::current(),
            )
            .unwrap()
        })
        .collect();
    assert_ne!(pools[0].nonce(), pools[1].nonce());
    let mut feed = Feed::new(0);
    let mut sent = 0;
    for (p, pool) in pools.iter().enumerate() {
        for shard in 0..2 {
            for i in 0..3 {
                // Distinct bodies, so a shared token would show as one token
                // with two bodies.
                let body = format!("pool{p}-shard{shard}-row{i};");
                send(pool, shard, feed.chunk(body.as_bytes(), 1));
                sent += 1;
            }
        }
    }
    until("every batch written", || writer.count() == sent).await;

    let attempts = writer.attempts();
    let mut body_of: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for a in &attempts {
        let prev = body_of.insert(&a.token, &a.bytes);
        assert!(prev.is_none(), "D4: token {} used twice", a.token);
        assert!(a.token.starts_with("pipe-"), "{}", a.token);
    }
    let bodies: BTreeSet<_> = attempts.iter().map(|a| a.bytes.clone()).collect();
    assert_eq!(bodies.len(), sent, "each batch written once");
    for pool in pools {
        let nonce = pool.nonce().to_string();
        let mine = attempts.iter().filter(|a| a.token.contains(&nonce)).count();
        assert_eq!(mine, 6, "tokens of pool {nonce}");
        let report = pool.drain(Instant::now() + Duration::from_secs(1)).await;
        assert!(report.is_clean(), "{report:?}");
    }
}

// ---------------------------------------------------------------------------
// D1: acks.

/// D1: a batch that fails, is retried and then succeeds resolves each of its
/// poll batches exactly once, Delivered, and the tracker commits past it.
#[tokio::test(start_paused = true)]
async fn batch_failing_then_succeeding_delivers_its_acks_exactly_once() {
    let writer = FakeWriter::new(|a| {
        if a.retry < 2 {
            Step::Fail(WriteError::retryable("overloaded"))
        } else {
            Step::Ok
        }
    });
    let mut c = config(1, 2);
    c.batch.max_rows = 5;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"aa", 2));
    send(&pool, 0, feed.chunk(b"bbb", 3));
    let mut resolved = Vec::new();
    until("the first attempt", || writer.count() == 1).await;
    sleep(Duration::from_millis(1)).await;
    assert!(
        feed.rx.try_recv().is_none(),
        "D1: acks resolved while the batch was still being retried"
    );
    until("three attempts", || writer.count() == 3).await;
    let mut tracker = Tracker::new();
    tracker.assign(feed.tp.clone(), 1);
    until("the acks to resolve", || {
        while let Some(r) = feed.rx.try_recv() {
            resolved.push(r);
        }
        resolved.len() == 2
    })
    .await;
    let report = pool.drain(Instant::now() + Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.shards[0].retries, 2);
    assert_eq!(
        outcomes(&resolved),
        BTreeMap::from([(0, Outcome::Delivered), (1, Outcome::Delivered)])
    );
    for r in &resolved {
        tracker.apply(r);
    }
    assert_eq!(tracker.committable(&feed.tp, 1), Some(5));
    drop(writer);
    assert!(feed.resolutions().is_empty(), "an ack resolved twice");
}

/// D1: a batch abandoned after `max_attempts` retryable failures fails its
/// acks, after exactly `max_attempts` attempts, and the report counts it.
#[tokio::test(start_paused = true)]
async fn batch_abandoned_after_max_attempts_fails_its_acks() {
    let writer = FakeWriter::new(|_| Step::Fail(WriteError::retryable("down")));
    let mut c = config(1, 2);
    c.retry.max_attempts = 3;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"lost", 4));
    let mut resolved = Vec::new();
    until("the ack to resolve", || {
        resolved.extend(feed.resolutions());
        !resolved.is_empty()
    })
    .await;
    assert_eq!(outcomes(&resolved), BTreeMap::from([(0, Outcome::Failed)]));
    // Give it time to (wrongly) try again.
    sleep(Duration::from_secs(60)).await;
    assert_eq!(writer.count(), 3, "attempts of a batch with max_attempts 3");
    let report = pool.drain(Instant::now() + Duration::from_secs(5)).await;
    let s = &report.shards[0];
    assert_eq!((s.batches_abandoned, s.rows_abandoned), (1, 4));
    assert_eq!((s.batches_flushed, s.rows_flushed, s.retries), (0, 0, 2));
    assert!(feed.resolutions().is_empty(), "an ack resolved twice");
}

/// D1: a fatal error abandons the batch at once, without a retry, and fails
/// its acks.
#[tokio::test(start_paused = true)]
async fn fatal_error_abandons_the_batch_at_once_and_fails_its_acks() {
    let writer = FakeWriter::new(|_| Step::Fail(WriteError::fatal("no such table")));
    let pool = start(config(1, 2), &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"bad", 1));
    let mut resolved = Vec::new();
    until("the ack to resolve", || {
        resolved.extend(feed.resolutions());
        !resolved.is_empty()
    })
    .await;
    assert_eq!(outcomes(&resolved), BTreeMap::from([(0, Outcome::Failed)]));
    sleep(Duration::from_secs(60)).await;
    assert_eq!(writer.count(), 1, "a fatal error was retried");
    let report = pool.drain(Instant::now() + Duration::from_secs(5)).await;
    let s = &report.shards[0];
    assert_eq!(
        (s.batches_abandoned, s.rows_abandoned, s.retries),
        (1, 1, 0)
    );
}

// ---------------------------------------------------------------------------
// D5: bounded drain.

/// D5: a writer that never answers (and a write timeout far away) still lets
/// `drain(deadline)` return by `deadline + 1.5 s` of tokio time; the batch is
/// reported abandoned and its acks fail (D1).
#[tokio::test(start_paused = true)]
async fn drain_returns_by_deadline_when_writer_never_returns() {
    let writer = FakeWriter::new(|_| Step::Hang);
    let mut c = config(1, 1);
    c.retry.max_attempts = 0;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"stuck", 3));
    until("the write to start", || writer.count() == 1).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    let report = pool.drain(deadline).await;
    let returned = Instant::now();
    assert!(
        returned <= deadline + Duration::from_millis(1500),
        "D5: drain returned {:?} after its deadline",
        returned - deadline
    );
    assert!(DRAIN_GRACE <= Duration::from_millis(1500));
    let s = &report.shards[0];
    assert_eq!((s.batches_abandoned, s.rows_abandoned), (1, 3), "{s:?}");
    assert_eq!(s.batches_flushed, 0);
    assert!(!report.is_clean());
    assert_eq!(
        outcomes(&feed.resolutions()),
        BTreeMap::from([(0, Outcome::Failed)])
    );
}

/// D5: a worker that cannot stop because its writer blocks the OS thread (sync
/// I/O inside an async fn) is aborted after the grace: drain returns, reports
/// `forced_abort`, and the batch's acks fail once the thread comes back (D1).
///
/// The only test on a multi-thread runtime with real time (about 1.1 s): a
/// blocked thread cannot be simulated with paused time. It asserts outcomes,
/// not durations; the outer timeout only turns a hang into a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_blocked_past_the_grace_is_force_aborted() {
    let writer = FakeWriter::new(|_| Step::BlockThread);
    let pool = start(config(1, 1), &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"blocked", 2));
    let start_wait = Instant::now();
    while writer.count() == 0 {
        assert!(start_wait.elapsed() < Duration::from_secs(30), "no attempt");
        sleep(Duration::from_millis(1)).await;
    }
    let deadline = Instant::now() + Duration::from_millis(50);
    let report = tokio::time::timeout(Duration::from_secs(30), pool.drain(deadline))
        .await
        .expect("D5: drain did not return");
    assert!(report.shards[0].forced_abort, "{report:?}");
    assert_eq!(report.shards[0].rows_abandoned, 2);
    assert_eq!(report.shards[0].batches_flushed, 0);
    assert!(!report.is_clean());
    writer.open_thread_gate();
    let r = tokio::time::timeout(Duration::from_secs(30), feed.rx.recv())
        .await
        .expect("the aborted batch's ack never resolved")
        .expect("ack channel open");
    assert_eq!((r.seq, r.outcome), (0, Outcome::Failed));
}

// ---------------------------------------------------------------------------
// Rotation and breakers.

/// A replica whose breaker opened (after `failure_threshold` consecutive
/// failures) gets no attempt during the cooldown; rotation sends every write
/// to the healthy replica, and the open replica is tried again (half-open)
/// only once the cooldown has passed.
#[tokio::test(start_paused = true)]
async fn rotation_skips_replica_whose_breaker_is_open() {
    let writer = FakeWriter::new(|a| {
        if a.endpoint.replica == 0 {
            Step::Fail(WriteError::retryable("replica 0 is down"))
        } else {
            Step::Ok
        }
    });
    let mut c = config(1, 2);
    c.breaker = BreakerConfig {
        failure_threshold: 2,
        cooldown: Duration::from_secs(10),
    };
    let cooldown = c.breaker.cooldown;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    let mut resolved = Vec::new();
    let mut write_one = async |feed: &mut Feed, i: usize| {
        send(&pool, 0, feed.chunk(format!("b{i}").as_bytes(), 1));
        until("the batch's ack", || {
            resolved.extend(feed.resolutions());
            resolved.len() == i + 1
        })
        .await;
    };
    for i in 0..6 {
        write_one(&mut feed, i).await;
    }
    let on_r0 = |attempts: &[Attempt]| -> Vec<Instant> {
        attempts
            .iter()
            .filter(|a| a.endpoint.replica == 0)
            .map(|a| a.at)
            .collect()
    };
    let first = on_r0(&writer.attempts());
    assert_eq!(first.len(), 2, "replica 0 tried after its breaker opened");
    let opened = first[1];
    assert!(
        Instant::now() < opened + cooldown,
        "test ran past the cooldown"
    );

    sleep_until_after(opened + cooldown).await;
    for i in 6..10 {
        write_one(&mut feed, i).await;
    }
    let later = on_r0(&writer.attempts());
    assert_eq!(later.len(), 3, "one half-open trial after the cooldown");
    assert!(later[2] >= opened + cooldown);
    assert!(
        outcomes(&resolved)
            .values()
            .all(|o| *o == Outcome::Delivered),
        "every batch landed on replica 1"
    );
    let report = pool.drain(Instant::now() + Duration::from_secs(1)).await;
    assert_eq!(report.batches_flushed(), 10);
    assert_eq!(
        report.shards[0].retries, 3,
        "one retry per replica-0 failure"
    );
}

/// Issue 31: with `probe_tripped`, a tripped breaker follows its replica
/// without any write going to it. Both replicas of the shard fail their
/// writes until both breakers trip (the shard unreachable); then no write
/// comes. While the probe fails too the shard stays unreachable and each
/// cooldown brings one probe per replica; once the probe answers, the next
/// cooldown closes both breakers and the shard reads reachable again. No
/// write was attempted meanwhile. Without `probe_tripped` nothing probes
/// and the shard stays unreachable for an hour.
#[tokio::test(start_paused = true)]
async fn a_tripped_breaker_is_probed_in_the_background_and_closes_when_the_replica_answers() {
    use std::sync::atomic::Ordering;
    for probe_tripped in [true, false] {
        let writer = FakeWriter::new(|_| Step::Fail(WriteError::retryable("down")));
        writer.probe_down.store(true, Ordering::SeqCst);
        let mut c = config(1, 2);
        c.breaker = BreakerConfig {
            failure_threshold: 1,
            cooldown: Duration::from_secs(5),
        };
        c.retry.max_attempts = 2;
        c.probe_tripped = probe_tripped;
        let pool = start(c, &writer);
        let mut feed = Feed::new(0);
        send(&pool, 0, feed.chunk(b"x", 1));
        until("the batch abandoned", || !feed.resolutions().is_empty()).await;
        let handle = pool.handle();
        assert!(!handle.reachable(), "both breakers tripped");
        let writes = writer.attempts().len();
        sleep(Duration::from_secs(12)).await;
        assert!(!handle.reachable(), "the probe fails: still unreachable");
        let probes = writer.probes.load(Ordering::SeqCst);
        if probe_tripped {
            assert!(probes >= 4, "one probe per replica and cooldown: {probes}");
        } else {
            assert_eq!(probes, 0);
        }
        writer.probe_down.store(false, Ordering::SeqCst);
        sleep(Duration::from_secs(6)).await;
        assert_eq!(
            handle.reachable(),
            probe_tripped,
            "probe_tripped={probe_tripped}: the breakers follow the replica"
        );
        if !probe_tripped {
            sleep(Duration::from_secs(3600)).await;
            assert!(!handle.reachable(), "no write, no probe: stale");
        }
        assert_eq!(writer.attempts().len(), writes, "no write was attempted");
        pool.drain(Instant::now() + Duration::from_secs(1)).await;
    }
}

async fn sleep_until_after(t: Instant) {
    tokio::time::sleep_until(t + Duration::from_millis(1)).await;
}

// ---------------------------------------------------------------------------
// Sealing.

/// `max_rows` seals a batch: a chunk that would overflow it seals the open
/// batch first, a batch that reaches it seals at once.
#[tokio::test(start_paused = true)]
async fn max_rows_seals_a_batch() {
    let writer = FakeWriter::ok();
    let mut c = config(1, 1);
    c.batch.max_rows = 10;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    let t0 = Instant::now();
    // 4 + 4 (+4 would be 12: seal at 8), then 4 + 6 = 10: seal at once.
    for (i, rows) in [4, 4, 4, 6].into_iter().enumerate() {
        send(&pool, 0, feed.chunk(format!("{i}").as_bytes(), rows));
    }
    until("two batches", || writer.count() == 2).await;
    let a = writer.attempts();
    assert_eq!((a[0].rows, a[0].bytes.as_slice()), (8, b"01".as_slice()));
    assert_eq!((a[1].rows, a[1].bytes.as_slice()), (10, b"23".as_slice()));
    assert!(
        a.iter().all(|a| a.at == t0),
        "sealed by rows, not by linger"
    );
    let report = pool.drain(Instant::now() + Duration::from_secs(1)).await;
    assert_eq!((report.batches_flushed(), report.rows_flushed()), (2, 18));
}

/// `max_bytes` seals a batch the same way.
#[tokio::test(start_paused = true)]
async fn max_bytes_seals_a_batch() {
    let writer = FakeWriter::ok();
    let mut c = config(1, 1);
    c.batch.max_rows = 1_000;
    c.batch.max_bytes = 100;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    let t0 = Instant::now();
    // 40 + 40 (+40 would be 120: seal at 80), then 40 + 60 = 100: seal.
    for (i, len) in [40usize, 40, 40, 60].into_iter().enumerate() {
        let data = vec![b'a' + i as u8; len];
        send(&pool, 0, feed.chunk(&data, 1));
    }
    until("two batches", || writer.count() == 2).await;
    let a = writer.attempts();
    assert_eq!((a[0].bytes.len(), a[0].rows), (80, 2));
    assert_eq!((a[1].bytes.len(), a[1].rows), (100, 2));
    assert_eq!(&a[1].bytes[..40], vec![b'c'; 40].as_slice(), "chunk order");
    assert!(
        a.iter().all(|a| a.at == t0),
        "sealed by bytes, not by linger"
    );
    let report = pool.drain(Instant::now() + Duration::from_secs(1)).await;
    assert_eq!(report.shards[0].bytes_flushed, 180);
}

/// `linger` seals a partial batch exactly `linger` after its first chunk.
#[tokio::test(start_paused = true)]
async fn linger_seals_a_partial_batch() {
    let writer = FakeWriter::ok();
    let mut c = config(1, 1);
    c.batch.max_rows = 1_000;
    c.batch.linger = Duration::from_secs(1);
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    let t0 = Instant::now();
    send(&pool, 0, feed.chunk(b"x", 1));
    sleep(Duration::from_millis(500)).await;
    send(&pool, 0, feed.chunk(b"y", 1));
    sleep(Duration::from_millis(400)).await;
    assert_eq!(writer.count(), 0, "sealed before linger");
    until("the lingering batch", || writer.count() == 1).await;
    let a = &writer.attempts()[0];
    assert_eq!(
        a.at - t0,
        Duration::from_secs(1),
        "sealed at first chunk + linger"
    );
    assert_eq!((a.rows, a.bytes.as_slice()), (2, b"xy".as_slice()));
    let report = pool.drain(Instant::now() + Duration::from_secs(1)).await;
    assert_eq!(report.batches_flushed(), 1);
}

/// Drain seals the partial batch (long linger, limits far away) and writes it
/// before the deadline; its acks are delivered.
#[tokio::test(start_paused = true)]
async fn drain_seals_and_delivers_a_partial_batch() {
    let writer = FakeWriter::ok();
    let mut c = config(1, 1);
    c.batch.max_rows = 1_000;
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"part", 3));
    sleep(Duration::from_secs(10)).await;
    assert_eq!(writer.count(), 0, "sealed before drain");
    let handle = pool.handle();
    let deadline = Instant::now() + Duration::from_secs(5);
    let report = pool.drain(deadline).await;
    assert!(Instant::now() < deadline, "drain waited for the deadline");
    assert!(
        matches!(
            handle.try_send(0, feed.chunk(b"late", 1)),
            Err(PushError::Closed(_))
        ),
        "drain stops intake"
    );
    assert_eq!(writer.count(), 1);
    assert_eq!(writer.attempts()[0].bytes, b"part");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.batches_flushed(), report.rows_flushed()), (1, 3));
    // The late chunk handed back by `try_send` was dropped: its ack fails.
    assert_eq!(
        outcomes(&feed.resolutions()),
        BTreeMap::from([(0, Outcome::Delivered), (1, Outcome::Failed)])
    );
}

// ---------------------------------------------------------------------------
// D2, D8: backpressure.

/// D2, D8: a stalled writer fills the shard (writes in flight, one sealed
/// batch waiting for a slot, the queue) and then `try_send` hands the chunk
/// back as `PushError::Full` instead of waiting; budget use stays bounded.
/// Once the writer recovers everything lands exactly once and the budget
/// returns to 0.
#[tokio::test(start_paused = true)]
async fn stalled_writer_makes_try_send_report_full_then_everything_lands() {
    let writer = FakeWriter::new(|_| Step::Gate);
    let mut c = config(1, 1);
    c.max_inflight = 2;
    c.queue_chunks = 3;
    let (inflight, queue) = (c.max_inflight, c.queue_chunks);
    let pool = start(c, &writer);
    let handle = pool.handle();
    let budget = Budget::new(1 << 20, 1 << 20);
    let mut feed = Feed::new(0);
    // Every body is 8 bytes: "chunkNN;".
    let body = |i: usize| format!("chunk{i:02};").into_bytes();
    let chunk = |feed: &mut Feed, i: usize| {
        let permit = Budget::try_acquire(&budget, 8, 1).expect("budget room");
        feed.chunk_with(&body(i), 1, permit)
    };
    let mut accepted = 0;
    let rejected = loop {
        match handle.try_send(0, chunk(&mut feed, accepted)) {
            Ok(()) => accepted += 1,
            Err(PushError::Full(c)) => break c,
            Err(PushError::Closed(_)) => panic!("pool closed"),
        }
        assert!(accepted <= 100, "D8: try_send never reported Full");
        // Let the worker take what it can.
        sleep(Duration::from_millis(1)).await;
    };
    // max_inflight writes + 1 sealed batch waiting + a full queue.
    assert_eq!(accepted, inflight + 1 + queue, "chunks accepted");
    assert_eq!(writer.count(), inflight, "writes in flight while stalled");
    assert_eq!(handle.queue_depth(0), queue);
    // D8: the accepted chunks plus the one handed back, nothing more.
    assert_eq!(budget.bytes_in_use(), 8 * (accepted as u64 + 1));
    assert!(feed.resolutions().is_empty(), "acks resolved while stalled");

    writer.open_gate();
    let mut retry = rejected;
    loop {
        match handle.try_send(0, retry) {
            Ok(()) => break,
            Err(e) => retry = e.into_chunk(),
        }
        sleep(Duration::from_millis(1)).await;
    }
    accepted += 1;
    for _ in 0..3 {
        let c = chunk(&mut feed, accepted);
        handle.try_send(0, c).expect("room after recovery");
        accepted += 1;
        sleep(Duration::from_millis(1)).await;
    }
    let report = pool.drain(Instant::now() + Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report:?}");
    let mut written: Vec<Vec<u8>> = writer.attempts().into_iter().map(|a| a.bytes).collect();
    written.sort();
    let sent: Vec<Vec<u8>> = (0..accepted).map(body).collect();
    assert_eq!(written, sent, "every chunk written exactly once");
    let resolved = outcomes(&feed.resolutions());
    assert_eq!(resolved.len(), accepted);
    assert!(resolved.values().all(|o| *o == Outcome::Delivered));
    assert_eq!(
        (budget.bytes_in_use(), budget.rows_in_use()),
        (0, 0),
        "D8: budget leaked"
    );
}

// ---------------------------------------------------------------------------
// Drain report and metrics.

/// The drain report counts, per shard, flushed batches, rows and bytes and
/// abandoned batches (in flight, sealed and waiting) and rows (including
/// chunks still queued); the acks agree with it.
#[tokio::test(start_paused = true)]
async fn drain_report_counts_flushed_and_abandoned() {
    // Shard 0 writes; shard 1 never answers.
    let writer = FakeWriter::new(|a| {
        if a.endpoint.shard == 0 {
            Step::Ok
        } else {
            Step::Hang
        }
    });
    let mut c = config(2, 1);
    c.retry.max_attempts = 0;
    let pool = start(c, &writer);
    let mut ok_feed = Feed::new(0);
    let mut stuck_feed = Feed::new(1);
    send(&pool, 0, ok_feed.chunk(b"a", 2));
    send(&pool, 0, ok_feed.chunk(b"bb", 3));
    // Shard 1: one batch in flight, one sealed and waiting, one chunk queued.
    for (body, rows) in [(b"x".as_slice(), 1), (b"yy", 4), (b"zzz", 5)] {
        send(&pool, 1, stuck_feed.chunk(body, rows));
        sleep(Duration::from_millis(1)).await;
    }
    until("shard 0 written, shard 1 stuck", || writer.count() == 3).await;
    let report = pool.drain(Instant::now() + Duration::from_secs(1)).await;

    let s0 = &report.shards[0];
    assert_eq!(
        (s0.batches_flushed, s0.rows_flushed, s0.bytes_flushed),
        (2, 5, 3)
    );
    assert_eq!((s0.batches_abandoned, s0.rows_abandoned), (0, 0));
    let s1 = &report.shards[1];
    assert_eq!((s1.batches_flushed, s1.rows_flushed), (0, 0));
    assert_eq!(s1.batches_abandoned, 2, "in-flight and waiting batches");
    assert_eq!(s1.rows_abandoned, 10, "also the chunk still queued");
    assert!(!s1.forced_abort);
    assert_eq!(
        (report.batches_flushed(), report.batches_abandoned()),
        (2, 2)
    );
    assert_eq!((report.rows_flushed(), report.rows_abandoned()), (5, 10));
    assert!(!report.is_clean());

    let ok = outcomes(&ok_feed.resolutions());
    assert!(ok.len() == 2 && ok.values().all(|o| *o == Outcome::Delivered));
    let stuck = outcomes(&stuck_feed.resolutions());
    assert!(stuck.len() == 3 && stuck.values().all(|o| *o == Outcome::Failed));
}

/// A write that completes exactly at the drain deadline is counted once:
/// flushed (its acks delivered) or abandoned (its acks failed), never both;
/// the report agrees with the acks. (With tokio 1.54 the write wins the tie;
/// before the fix in `abandon_at_deadline` the batch was reported both
/// flushed and abandoned.)
#[tokio::test(start_paused = true)]
async fn write_finishing_at_the_deadline_is_counted_once() {
    let writer = FakeWriter::new(|_| Step::Sleep(Duration::from_secs(2)));
    let pool = start(config(1, 1), &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"edge", 1));
    until("the write to start", || writer.count() == 1).await;
    let started = writer.attempts()[0].at;
    let report = pool.drain(started + Duration::from_secs(2)).await;
    let s = &report.shards[0];
    assert_eq!(
        s.batches_flushed + s.batches_abandoned,
        1,
        "one batch counted {} times: {s:?}",
        s.batches_flushed + s.batches_abandoned
    );
    let acks = outcomes(&feed.resolutions());
    let want = if s.batches_flushed == 1 {
        Outcome::Delivered
    } else {
        Outcome::Failed
    };
    assert_eq!(acks, BTreeMap::from([(0, want)]));
}

/// Every counter of shard `shard`, by name, from one snapshot (a snapshot
/// resets the debugging recorder's counters).
fn counters(snapshotter: &Snapshotter, shard: &str) -> BTreeMap<String, u64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let k = key.key();
            let mine = k.labels().any(|l| l.key() == "shard" && l.value() == shard);
            match value {
                DebugValue::Counter(n) if mine => Some((k.name().to_owned(), n)),
                _ => None,
            }
        })
        .collect()
}

/// The sink metrics count what happened: retries, flushed batches, rows and
/// bytes written, abandoned batches (D6: everything shows in metrics).
#[tokio::test(start_paused = true)]
async fn metrics_count_retries_flushes_and_abandons() {
    let writer = FakeWriter::new(|a| match (a.bytes.as_slice(), a.retry) {
        (b"good", 0) => Step::Fail(WriteError::retryable("blip")),
        (b"good", _) => Step::Ok,
        _ => Step::Fail(WriteError::fatal("rejected")),
    });
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let pool = metrics::with_local_recorder(&recorder, || start(config(1, 2), &writer));
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"good", 3));
    send(&pool, 0, feed.chunk(b"bad", 2));
    until("three attempts", || writer.count() == 3).await;
    let report = pool.drain(Instant::now() + Duration::from_secs(5)).await;
    let counted = counters(&snapshotter, "0");
    let m = |name: &str| {
        counted
            .get(name)
            .copied()
            .unwrap_or_else(|| panic!("no {name}"))
    };
    use spate_core::metrics as names;
    assert_eq!(m(names::RETRIES), 1);
    assert_eq!(m(names::BATCHES_FLUSHED), 1);
    assert_eq!(m(names::ROWS_WRITTEN), 3);
    assert_eq!(m(names::BYTES_WRITTEN), 4);
    assert_eq!(m(names::BATCHES_ABANDONED), 1);
    assert_eq!(report.shards[0].retries, m(names::RETRIES));
}

// ---------------------------------------------------------------------------
// Layouts and re-seals (ADR 0005).

/// A batch holds one layout: a chunk of another layout seals the open batch
/// first, even below `max_rows`.
#[tokio::test(start_paused = true)]
async fn a_chunk_of_another_layout_seals_the_open_batch() {
    let writer = FakeWriter::ok();
    let mut c = config(1, 1);
    c.batch.max_rows = 10;
    c.batch.linger = Duration::from_millis(50);
    let pool = start(c, &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"a", 1));
    send(&pool, 0, feed.chunk(b"b", 1));
    send(&pool, 0, feed.chunk(b"c", 1).with_layout(3));
    until("two batches", || writer.count() == 2).await;
    let a = writer.attempts();
    assert_eq!((a[0].layout, a[0].bytes.as_slice()), (0, b"ab".as_slice()));
    assert_eq!((a[1].layout, a[1].bytes.as_slice()), (3, b"c".as_slice()));
    pool.drain(Instant::now() + Duration::from_secs(1)).await;
}

/// A batch answered `replanned` is re-sealed once and the re-sealed batch
/// written from then on: same token, its own bytes, identical on its retry
/// (D4); the `replanned` answer is neither a retry nor a failure; the acks
/// are delivered once (D1).
#[tokio::test(start_paused = true)]
async fn a_replanned_batch_is_resealed_and_the_resealed_bytes_retried() {
    let mut writer = FakeWriter::new(|a| match (a.layout, a.retry) {
        (0, _) => Step::Fail(WriteError::replanned("table changed")),
        (_, 1) => Step::Fail(WriteError::retryable("connection reset")),
        _ => Step::Ok,
    });
    Arc::get_mut(&mut writer).unwrap().reseal_to = Some(9);
    let pool = start(config(1, 2), &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"abc", 1));
    until("three attempts", || writer.count() == 3).await;
    let report = pool.drain(Instant::now() + Duration::from_secs(5)).await;
    let a = writer.attempts();
    assert_eq!(a.len(), 3, "{a:?}");
    assert_eq!((a[0].layout, a[0].bytes.as_slice()), (0, b"abc".as_slice()));
    assert_eq!((a[1].layout, a[1].bytes.as_slice()), (9, b"ABC".as_slice()));
    assert_eq!(a[2].bytes, a[1].bytes, "D4: the re-sealed batch's retry");
    assert!(a.iter().all(|x| x.token == a[0].token), "one token: {a:?}");
    assert_eq!(report.batches_flushed(), 1);
    assert_eq!(report.shards[0].retries, 1, "only the reset is a retry");
    assert_eq!(
        outcomes(&feed.resolutions())
            .into_values()
            .collect::<Vec<_>>(),
        [Outcome::Delivered]
    );
}

/// A re-seal the writer refuses abandons the batch at once: its acks fail
/// (D1).
#[tokio::test(start_paused = true)]
async fn a_refused_reseal_abandons_the_batch() {
    let writer = FakeWriter::new(|_| Step::Fail(WriteError::replanned("table changed")));
    let pool = start(config(1, 1), &writer);
    let mut feed = Feed::new(0);
    send(&pool, 0, feed.chunk(b"abc", 1));
    let report = pool.drain(Instant::now() + Duration::from_secs(5)).await;
    assert_eq!(writer.count(), 1);
    assert_eq!(report.batches_abandoned(), 1);
    assert_eq!(
        outcomes(&feed.resolutions())
            .into_values()
            .collect::<Vec<_>>(),
        [Outcome::Failed]
    );
}
