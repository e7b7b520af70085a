//! Against real ClickHouse replicas (opt-in): set `SPATE_CLICKHOUSE_SHARDS` to
//! the replica URLs, shards separated by `;` and the replicas of a shard by
//! `,` (`url1a,url1b;url2a,url2b`), e.g. from
//! `ci/clickhouse.sh start-replicated 2 2 | paste -sd';'`. At least 2 shards
//! of at least 2 replicas each; the replicas of a shard must be real
//! `ReplicatedMergeTree` replicas (shared ZooKeeper, `{shard}` and
//! `{replica}` macros). Without it every test prints `skipped: ...` (on
//! stderr) and returns.
//!
//! What is checked, through the real `SinkPool` and `HttpWriter`:
//! - rows split by the shard router land on the shard the documented hash
//!   names, and nowhere else;
//! - a write whose reply is lost (a local proxy forwards the INSERT and
//!   swallows the answer, so the client times out after the server
//!   committed) is retried on the other replica with identical bytes, and
//!   the replicated table keeps one copy (18.16 has no
//!   `insert_deduplication_token`; the block hash deduplication does it);
//! - a replica that hangs (accepts connections, never answers, as a
//!   SIGSTOPped server does) and a replica on a dead port are each tried once,
//!   then skipped by their breakers, and every row lands;
//! - a real replica frozen with SIGSTOP (the local process listening on its
//!   port, found through `/proc`) is tried once, skipped, and after SIGCONT
//!   catches up by replication;
//! - on a plain MergeTree the same lost-reply retry lands twice: the test
//!   prints it as a possible duplicate.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
use spate_core::ack::{AckIssuer, AckReceiver, AckSet, Outcome, ack_channel};
use spate_core::budget::BudgetPermit;
use spate_core::record::TopicPartition;
use spate_core::sink::{
    BatchConfig, BreakerConfig, Chunk, DrainReport, RetryConfig, RunNonce, SinkConfig, SinkPool,
};
use spate_formats::json::JsonRowEncoder;
use spate_formats::json::route::ShardRouter;
use spate_row::schema::{InsertOptions, plan_insert};
use spate_row::shard::{ShardKey, shard_of_key};
use spate_row::spec::MappingOptions;
use spate_testkit::process::{Frozen, server_pid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The replica URLs per shard, or `None` (and a `skipped:` line).
fn cluster() -> Option<Vec<Vec<String>>> {
    spate_testkit::env::clickhouse_shards()
        .inspect_err(|why| {
            // Straight to stderr: the harness captures print macros only.
            let _ = writeln!(std::io::stderr(), "skipped: {why}");
        })
        .ok()
}

/// The SIGSTOP test freezes a server every other test uses: it takes this
/// for writing, the others for reading, so it runs alone.
static SERVERS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A database of its own on every instance, dropped at the end.
struct Db {
    admin: HttpWriter,
    shards: Vec<Vec<String>>,
    name: String,
}

impl Db {
    async fn create(shards: &[Vec<String>], tag: &str) -> Db {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("spate_repl_{tag}_{}_{nanos}", std::process::id());
        let admin = HttpWriter::new(HttpWriterConfig::new(&name, "", Vec::new()));
        let db = Db {
            admin,
            shards: shards.to_vec(),
            name,
        };
        for url in db.urls() {
            db.sql(&url, &format!("CREATE DATABASE {}", db.name)).await;
        }
        db
    }

    fn urls(&self) -> Vec<String> {
        self.shards.iter().flatten().cloned().collect()
    }

    async fn sql(&self, url: &str, sql: &str) -> String {
        self.admin
            .query(url, sql)
            .await
            .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"))
    }

    /// `CREATE TABLE db.t (id UInt32, user String)` on every instance, as a
    /// replicated table (one ZooKeeper path per shard) or a plain MergeTree.
    async fn create_table(&self, replicated: bool) {
        let engine = if replicated {
            format!(
                "ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{}_t', '{{replica}}')",
                self.name
            )
        } else {
            "MergeTree".to_owned()
        };
        for url in self.urls() {
            self.sql(
                &url,
                &format!(
                    "CREATE TABLE {}.t (id UInt32, user String) ENGINE = {engine} ORDER BY id",
                    self.name
                ),
            )
            .await;
        }
    }

    /// Sorted ids in `t` on `url`, after catching up with its shard's log.
    async fn ids(&self, url: &str, replicated: bool) -> Vec<u32> {
        if replicated {
            self.sql(url, &format!("SYSTEM SYNC REPLICA {}.t", self.name))
                .await;
        }
        self.sql(url, &format!("SELECT id FROM {}.t ORDER BY id", self.name))
            .await
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    async fn drop(self) {
        for url in self.urls() {
            self.sql(&url, &format!("DROP DATABASE {}", self.name))
                .await;
        }
    }
}

/// The JSON encoder for `db.t` (schema probed on `url`) and the writer.
async fn encoder_and_writer(db: &Db, url: &str) -> (JsonRowEncoder, HttpWriter) {
    let probe = HttpWriter::new(HttpWriterConfig::new(&db.name, "t", Vec::new()));
    let columns = plan_insert(
        &probe.table_schema(url).await.unwrap(),
        &InsertOptions::default(),
    )
    .unwrap();
    let writer_columns = columns
        .iter()
        .map(|c| (c.name.clone(), c.ty.to_string()))
        .collect();
    let enc = JsonRowEncoder::new(columns, MappingOptions::default()).unwrap();
    let mut config = HttpWriterConfig::new(&db.name, "t", writer_columns);
    config.connect_timeout = Duration::from_secs(1);
    (enc, HttpWriter::new(config))
}

fn row(id: u32) -> String {
    format!(r#"{{"id":{id},"user":"user-{}"}}"#, id % 37)
}

/// A sink config for tests: small batches sealed at once, short timeouts.
fn sink_config(shards: Vec<Vec<String>>, rows_per_batch: u64) -> SinkConfig {
    let mut c = SinkConfig::new("repl-it", shards);
    c.batch = BatchConfig {
        max_rows: rows_per_batch,
        max_bytes: 16 << 20,
        linger: Duration::ZERO,
    };
    c.max_inflight = 1;
    c.write_timeout = Duration::from_secs(2);
    c.retry = RetryConfig {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(200),
        max_attempts: 6,
    };
    c.breaker = BreakerConfig {
        failure_threshold: 1,
        cooldown: Duration::from_secs(60),
    };
    c
}

/// Sends `chunks` (shard, encoded rows, row count), one ack each, drains
/// and returns the report after checking that every ack was delivered.
async fn run_pool(
    config: SinkConfig,
    writer: HttpWriter,
    chunks: Vec<(usize, Vec<u8>, u64)>,
) -> DrainReport {
    let pool = SinkPool::start(
        config,
        Arc::new(writer),
        RunNonce::from_u64(11),
        &tokio::runtime::Handle::current(),
    )
    .unwrap();
    let (tx, rx) = ack_channel();
    let mut issuer = AckIssuer::new(TopicPartition::new("repl", 0), 1, tx);
    let n = chunks.len();
    for (i, (shard, buf, rows)) in chunks.into_iter().enumerate() {
        let ack = issuer.issue(i as i64, i as i64);
        let mut acks = AckSet::new();
        acks.push(&ack);
        drop(ack);
        let chunk = Chunk::new(Bytes::from(buf), rows, acks, BudgetPermit::unbounded());
        pool.handle().try_send(shard, chunk).unwrap();
    }
    drop(issuer);
    let report = pool
        .drain(tokio::time::Instant::now() + Duration::from_secs(30))
        .await;
    assert_eq!(delivered(rx).await, n, "{report:?}");
    report
}

async fn delivered(mut rx: AckReceiver) -> usize {
    let mut n = 0;
    while let Some(r) = rx.recv().await {
        assert_eq!(r.outcome, Outcome::Delivered, "{r:?}");
        n += 1;
    }
    n
}

/// A TCP proxy to `upstream` that forwards everything, except that the
/// replies to the first `swallow` INSERT requests are read from the server
/// and never passed on: the server commits, the client hears nothing and
/// times out (the ambiguous write).
struct LostReplyProxy {
    url: String,
    swallowed: Arc<AtomicU32>,
}

impl LostReplyProxy {
    async fn start(upstream: &str, swallow: u32) -> LostReplyProxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let swallowed = Arc::new(AtomicU32::new(0));
        let budget = Arc::new(AtomicU32::new(swallow));
        let count = Arc::clone(&swallowed);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let budget = Arc::clone(&budget);
                let count = Arc::clone(&count);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        proxy_conn(client, server, budget, count).await;
                    }
                });
            }
        });
        LostReplyProxy { url, swallowed }
    }
}

async fn proxy_conn(
    client: TcpStream,
    server: TcpStream,
    budget: Arc<AtomicU32>,
    count: Arc<AtomicU32>,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let swallow = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&swallow);
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Requests on one connection are sequential: once an INSERT's
            // head passes, the next reply on this connection is its answer.
            let is_insert = buf[..n].windows(6).any(|w| w == b"INSERT");
            if is_insert
                && budget
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1))
                    .is_ok()
            {
                flag.store(true, Ordering::SeqCst);
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 64 << 10];
    let mut counted = false;
    loop {
        let n = match sr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if swallow.load(Ordering::SeqCst) {
            if !counted {
                counted = true;
                count.fetch_add(1, Ordering::SeqCst);
            }
            continue; // the reply is lost; the client keeps waiting
        }
        if cw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Keep the client's side open until it gives up.
    let _ = up.await;
}

#[tokio::test]
async fn rows_split_by_the_router_land_on_their_shards() {
    let Some(shards) = cluster() else { return };
    let _shared = SERVERS.read().await;
    let shards: Vec<Vec<String>> = shards.into_iter().take(2).collect();
    let db = Db::create(&shards, "split").await;
    db.create_table(true).await;
    let (mut enc, writer) = encoder_and_writer(&db, &shards[0][0]).await;

    let mut router = ShardRouter::new(ShardKey::field("user"));
    let mut bufs = vec![Vec::new(); 2];
    let mut rows = [0u64; 2];
    let mut want: Vec<Vec<u32>> = vec![Vec::new(); 2];
    for id in 0..1000u32 {
        let json = row(id);
        let shard = router.shard_for(None, json.as_bytes(), 2);
        // The documented formula, from the outside.
        assert_eq!(
            shard,
            shard_of_key(format!("user-{}", id % 37).as_bytes(), 2)
        );
        enc.encode_json(json.as_bytes(), &mut bufs[shard]).unwrap();
        rows[shard] += 1;
        want[shard].push(id);
    }
    assert!(
        rows.iter().all(|&r| r > 100),
        "both shards get rows: {rows:?}"
    );
    let chunks = bufs
        .into_iter()
        .zip(rows)
        .enumerate()
        .map(|(s, (b, r))| (s, b, r))
        .collect();
    let report = run_pool(sink_config(shards.clone(), 10_000), writer, chunks).await;
    assert!(report.is_clean(), "{report:?}");

    for (s, replicas) in shards.iter().enumerate() {
        for url in replicas {
            assert_eq!(db.ids(url, true).await, want[s], "shard {s} at {url}");
        }
    }
    say(&format!(
        "router split: shard 0 holds {} rows, shard 1 holds {} (xxHash64(user) % 2), on both replicas each",
        rows[0], rows[1]
    ));
    db.drop().await;
}

/// The lost-reply case on shard 0: replica 0 behind the proxy, retry on
/// `retry_to` (replica 1 for the replicated table). Returns the report, how
/// many replies the proxy swallowed, and the rows sent.
async fn lost_reply(
    db: &Db,
    shards: &[Vec<String>],
    retry_to: &str,
) -> (DrainReport, u32, Vec<u32>) {
    let proxy = LostReplyProxy::start(&shards[0][0], 1).await;
    let (mut enc, writer) = encoder_and_writer(db, &shards[0][0]).await;
    let ids: Vec<u32> = (0..500).collect();
    let mut buf = Vec::new();
    for &id in &ids {
        enc.encode_json(row(id).as_bytes(), &mut buf).unwrap();
    }
    let config = sink_config(
        vec![
            vec![proxy.url.clone(), retry_to.to_owned()],
            shards[1].clone(),
        ],
        10_000,
    );
    let report = run_pool(config, writer, vec![(0, buf, ids.len() as u64)]).await;
    (report, proxy.swallowed.load(Ordering::SeqCst), ids)
}

#[tokio::test]
async fn a_lost_reply_retried_on_the_other_replica_keeps_one_copy() {
    let Some(shards) = cluster() else { return };
    let _shared = SERVERS.read().await;
    let db = Db::create(&shards, "lost").await;
    db.create_table(true).await;
    let (report, swallowed, ids) = lost_reply(&db, &shards, &shards[0][1]).await;
    assert_eq!(swallowed, 1, "the proxy swallowed the first INSERT's reply");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.shards[0].retries, 1, "{report:?}");
    for url in &shards[0] {
        let got = db.ids(url, true).await;
        assert_eq!(got.len(), ids.len(), "{url}: one copy, not two");
        assert_eq!(got, ids, "{url}");
    }
    say(&format!(
        "lost reply: the insert committed on {} (reply swallowed), the retry on {} was \
         deduplicated by ReplicatedMergeTree: {} rows, one copy",
        shards[0][0],
        shards[0][1],
        ids.len()
    ));
    db.drop().await;
}

#[tokio::test]
async fn on_a_plain_merge_tree_the_same_retry_lands_twice() {
    let Some(shards) = cluster() else { return };
    let _shared = SERVERS.read().await;
    let db = Db::create(&shards, "plain").await;
    db.create_table(false).await;
    // The retry goes to the same server (no replica shares a plain table).
    let (report, swallowed, ids) = lost_reply(&db, &shards, &shards[0][0]).await;
    assert_eq!(swallowed, 1);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.shards[0].retries, 1, "{report:?}");
    let got = db.ids(&shards[0][0], false).await;
    assert_eq!(
        got.len(),
        2 * ids.len(),
        "a plain MergeTree keeps both copies of the retried batch"
    );
    say(&format!(
        "possible duplicate: shard 0 batch of {} rows retried after an ambiguous timeout \
         (write landed, reply lost) on a plain MergeTree without insert_deduplication_token: \
         {} rows stored, {} of them duplicates",
        ids.len(),
        got.len(),
        got.len() - ids.len()
    ));
    db.drop().await;
}

#[tokio::test]
async fn a_stopped_replica_is_skipped_by_its_breaker() {
    let Some(shards) = cluster() else { return };
    let _shared = SERVERS.read().await;
    let db = Db::create(&shards, "breaker").await;
    db.create_table(true).await;
    let (mut enc, writer) = encoder_and_writer(&db, &shards[0][0]).await;

    // Replica 0 of shard 0 hangs: the kernel accepts connections into the
    // backlog of a socket nobody accepts from, as for a SIGSTOPped server.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    // Replica 1 of shard 1 is on a dead port: connection refused.
    let dead_url = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let topology = vec![
        vec![hung_url, shards[0][1].clone()],
        vec![shards[1][0].clone(), dead_url],
    ];

    let mut router = ShardRouter::new(ShardKey::field("user"));
    let mut chunks = Vec::new();
    let mut want: Vec<Vec<u32>> = vec![Vec::new(); 2];
    // Ten chunks per shard, one batch each.
    for part in 0..10u32 {
        let mut bufs = vec![Vec::new(); 2];
        let mut rows = [0u64; 2];
        for id in part * 100..(part + 1) * 100 {
            let json = row(id);
            let s = router.shard_for(None, json.as_bytes(), 2);
            enc.encode_json(json.as_bytes(), &mut bufs[s]).unwrap();
            rows[s] += 1;
            want[s].push(id);
        }
        for (s, b) in bufs.into_iter().enumerate() {
            if rows[s] > 0 {
                chunks.push((s, b, rows[s]));
            }
        }
    }
    let batches: Vec<usize> = (0..2)
        .map(|s| chunks.iter().filter(|c| c.0 == s).count())
        .collect();
    // One chunk per batch: seal at the smallest chunk's rows.
    let min_rows = chunks.iter().map(|c| c.2).min().unwrap();
    let mut config = sink_config(topology, min_rows);
    config.batch.max_bytes = 1;
    let report = run_pool(config, writer, chunks).await;
    drop(hung);
    assert!(report.is_clean(), "{report:?}");
    for (s, &n) in batches.iter().enumerate() {
        assert_eq!(report.shards[s].batches_flushed, n as u64);
        // One failed try on the bad replica opens its breaker (threshold 1,
        // cooldown 60 s); every later batch goes to the good replica.
        assert_eq!(report.shards[s].retries, 1, "shard {s}: {report:?}");
    }
    // Shard 0's good replica and shard 1's good one hold every row; so do
    // their peers, by replication.
    for (s, replicas) in shards.iter().take(2).enumerate() {
        for url in replicas {
            assert_eq!(db.ids(url, true).await, want[s], "shard {s} at {url}");
        }
    }
    say(&format!(
        "breaker: a hung replica (shard 0) and a dead port (shard 1) were tried once each, \
         then skipped; {} + {} batches landed on the healthy replicas",
        batches[0], batches[1]
    ));
    db.drop().await;
}

#[tokio::test]
async fn a_sigstopped_replica_is_skipped_and_catches_up() {
    let Some(shards) = cluster() else { return };
    let _alone = SERVERS.write().await;
    let Some(pid) = server_pid(&shards[1][0]) else {
        say(&format!(
            "skipped: no local process listens on {} (SIGSTOP needs the server on this machine)",
            shards[1][0]
        ));
        return;
    };
    let db = Db::create(&shards, "sigstop").await;
    db.create_table(true).await;
    let (mut enc, writer) = encoder_and_writer(&db, &shards[1][1]).await;
    let ids: Vec<u32> = (0..300).collect();
    let mut chunks = Vec::new();
    for part in ids.chunks(100) {
        let mut buf = Vec::new();
        for &id in part {
            enc.encode_json(row(id).as_bytes(), &mut buf).unwrap();
        }
        chunks.push((1, buf, part.len() as u64));
    }
    let mut config = sink_config(shards.clone(), 100);
    config.batch.max_bytes = 1;
    let report = {
        let _frozen = Frozen::stop(&shards[1][..1]);
        run_pool(config, writer, chunks).await
    };
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.shards[1].batches_flushed, 3);
    assert_eq!(report.shards[1].retries, 1, "{report:?}");
    // Resumed, the frozen replica fetches the parts it missed.
    for url in &shards[1] {
        assert_eq!(db.ids(url, true).await, ids, "{url}");
    }
    say(&format!(
        "sigstop: replica {} (pid {pid}) frozen: tried once, skipped by its breaker; 3 batches \
         landed on {}; after SIGCONT it caught up to {} rows",
        shards[1][0],
        shards[1][1],
        ids.len()
    ));
    db.drop().await;
}
