//! Helpers shared by the end-to-end targets (`e2e.rs` on one plain server,
//! `e2e_cluster.rs` on 2 shards x 2 ReplicatedMergeTree replicas): the real
//! `spate` binary as a child process, its config, tables, the admin
//! endpoints, committed offsets, and freezing ClickHouse servers with
//! SIGSTOP (always undone by a guard).
//!
//! Each target uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod real;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use spate::kafka_tools;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
pub use spate_testkit::serial::Resource;

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/flights-20k.ndjson"
));
/// Bound on one broker or ClickHouse round trip from the test.
pub const RPC: Duration = Duration::from_secs(10);
/// Bound on delivery (includes the mock broker's ~3 s group join).
pub const DELIVERY: Duration = Duration::from_secs(90);
/// Bound on the drain after SIGTERM (the config's drain_timeout is 10 s).
pub const EXIT: Duration = Duration::from_secs(30);

/// `SPATE_CLICKHOUSE_URL`, or `None` after printing why the test is skipped.
/// The test holds a shared claim on the server from here on
/// ([`spate_testkit::serial::shared`]).
pub fn clickhouse_url() -> Option<String> {
    match std::env::var("SPATE_CLICKHOUSE_URL") {
        Ok(u) if !u.trim().is_empty() => {
            spate_testkit::serial::shared(Resource::ClickHouse);
            Some(u)
        }
        _ => {
            println!("skipped: SPATE_CLICKHOUSE_URL not set");
            None
        }
    }
}

/// The replica URLs per shard from `SPATE_CLICKHOUSE_SHARDS`
/// (`a1,a2;b1,b2`, as ci/test.sh exports it), or `None` after printing why
/// the test is skipped. The test holds a shared claim on the cluster from
/// here on ([`spate_testkit::serial::shared`]).
pub fn clickhouse_shards() -> Option<Vec<Vec<String>>> {
    spate_testkit::env::clickhouse_shards()
        .inspect(|_| spate_testkit::serial::shared(Resource::Replicas))
        .inspect_err(|why| println!("skipped: {why}"))
        .ok()
}

/// Flight row `id`: a fixture row (the first 1,000 repeat) with its id.
pub fn flight_row(id: u64) -> String {
    static LINES: OnceLock<Vec<&'static str>> = OnceLock::new();
    let lines = LINES.get_or_init(|| FIXTURE.lines().take(1000).collect());
    let line = lines[(id % lines.len() as u64) as usize];
    format!("{{\"id\":{id},{}", &line[1..])
}

/// Produces `lines` to `topic` (line i to partition i % partitions);
/// returns how many.
pub fn produce(brokers: &str, topic: &str, partitions: i32, lines: &[String]) -> u64 {
    let n = kafka_tools::produce_lines(
        brokers,
        topic,
        partitions,
        lines.iter().map(String::as_bytes),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    assert_eq!(n, lines.len() as u64);
    n
}

/// One test's Kafka side: a broker holding `topic`, the consumer group the
/// test's spate joins (`{group}-{pid}`, so runs never meet) and a free admin
/// port. Built by [`Feed::mock`] (always the embedded mock cluster) or
/// [`Feed::start`] (the broker [`Broker::start`] picks: mock, or the real
/// cluster under `SPATE_E2E_KAFKA=real`).
pub struct Feed {
    /// The broker (kept alive for the test's length).
    pub broker: Broker,
    /// Its bootstrap list.
    pub brokers: String,
    /// The topic's name on that broker.
    pub topic: String,
    /// The topic's partition count.
    pub partitions: i32,
    /// The group id spate uses (the config's `pipeline.name` too).
    pub group: String,
    /// spate's admin port.
    pub port: u16,
}

impl Feed {
    /// `topic` of `partitions` on an embedded mock cluster.
    pub fn mock(topic: &str, partitions: i32, group: &str) -> Feed {
        let mock = kafka_tools::start_broker(topic, partitions).unwrap();
        Feed::on(Broker::Mock(mock), topic.to_owned(), partitions, group)
    }

    /// `topic` of `partitions` on the broker [`Broker::start`] picks.
    pub fn start(topic: &str, partitions: i32, group: &str) -> Feed {
        let (broker, topic) = Broker::start(topic, partitions);
        Feed::on(broker, topic, partitions, group)
    }

    /// `topic` (already there) of `partitions` on `broker`.
    pub fn on(broker: Broker, topic: String, partitions: i32, group: &str) -> Feed {
        Feed {
            brokers: broker.bootstrap_servers(),
            broker,
            topic,
            partitions,
            group: format!("{group}-{}", std::process::id()),
            port: free_port(),
        }
    }

    /// Produces `lines` ([`produce`]: line i to partition i % partitions).
    pub fn produce(&self, lines: &[String]) -> u64 {
        produce(&self.brokers, &self.topic, self.partitions, lines)
    }

    /// Produces flight rows `ids` ([`flight_row`]).
    pub fn produce_flights(&self, ids: std::ops::Range<u64>) -> u64 {
        self.produce(&ids.map(flight_row).collect::<Vec<_>>())
    }

    /// [`config`] for this feed, writing to `table` at `url`.
    pub fn config(&self, url: &str, table: &str, on_error: &str) -> String {
        config(
            &self.group,
            &self.brokers,
            &self.topic,
            url,
            table,
            self.port,
            on_error,
        )
    }

    /// [`await_commits`]: every partition's end committed by the group.
    pub fn await_commits(&self, spate: &Spate) {
        await_commits(
            spate,
            &self.brokers,
            &self.group,
            &self.topic,
            self.partitions,
            self.port,
        );
    }

    /// [`committed`] offsets of the group per partition.
    pub fn committed(&self) -> BTreeMap<i32, Option<i64>> {
        committed(&self.brokers, &self.group, &self.topic, self.partitions)
    }

    /// [`committed_sum`]: records behind the group's commits.
    pub fn committed_sum(&self) -> i64 {
        committed_sum(&self.brokers, &self.group, &self.topic, self.partitions)
    }
}

/// A consumed message: (payload, headers as (key, value text)).
pub type Consumed = (Vec<u8>, Vec<(String, String)>);

/// The first `n` messages of `topic` partition 0 (fewer after [`DELIVERY`]),
/// read without a commit by consumer group `reader`.
pub fn consume(brokers: &str, reader: &str, topic: &str, n: usize) -> Vec<Consumed> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", reader)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + DELIVERY;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        out.push((m.payload().unwrap_or_default().to_vec(), headers_text(&m)));
    }
    out
}

/// A message's headers as (key, value text; lossy UTF-8, "" for a null).
pub fn headers_text(m: &impl rdkafka::Message) -> Vec<(String, String)> {
    use rdkafka::message::Headers;
    m.headers()
        .map(|h| {
            h.iter()
                .map(|h| {
                    let v = h.value.map(String::from_utf8_lossy).unwrap_or_default();
                    (h.key.to_owned(), v.into_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value of header `key` of a [`Consumed`] message ("" when absent).
pub fn header<'a>(message: &'a Consumed, key: &str) -> &'a str {
    message
        .1
        .iter()
        .find(|(k, _)| k == key)
        .map_or("", |(_, v)| v.as_str())
}

/// The test's flight table `(id, date, delay, distance, origin,
/// destination)` on every replica of every shard, dropped on drop.
pub struct Table {
    /// Replica URLs per shard.
    pub shards: Vec<Vec<String>>,
    /// Table name (in database `default`).
    pub name: String,
    replicated: bool,
    rt: tokio::runtime::Runtime,
    ch: HttpWriter,
}

impl Table {
    /// A plain MergeTree table on the one server at `url`.
    pub fn create(url: &str, test: &str) -> Table {
        Self::create_on(vec![vec![url.to_owned()]], test, false)
    }

    /// A ReplicatedMergeTree table on every replica of `shards` (one
    /// ZooKeeper path per shard).
    pub fn create_replicated(shards: &[Vec<String>], test: &str) -> Table {
        Self::create_on(shards.to_vec(), test, true)
    }

    fn create_on(shards: Vec<Vec<String>>, test: &str, replicated: bool) -> Table {
        let name = format!("spate_e2e_{test}_{}", std::process::id());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ch = HttpWriter::new(HttpWriterConfig::new("default", &name, Vec::new()));
        let t = Table {
            shards,
            name,
            replicated,
            rt,
            ch,
        };
        let engine = if replicated {
            format!(
                "ReplicatedMergeTree('/clickhouse/tables/{{shard}}/default_{}', '{{replica}}')",
                t.name
            )
        } else {
            "MergeTree".to_owned()
        };
        for url in t.shards.iter().flatten() {
            t.query_at(url, &format!("DROP TABLE IF EXISTS default.{}", t.name));
            t.query_at(
                url,
                &format!(
                    "CREATE TABLE default.{} (id UInt64, date DateTime, delay Int32, \
                     distance UInt32, origin String, destination String) ENGINE = {engine} \
                     ORDER BY id",
                    t.name
                ),
            );
        }
        t
    }

    /// Runs `sql` at `url`; panics with the statement on error.
    pub fn query_at(&self, url: &str, sql: &str) -> String {
        self.rt
            .block_on(self.ch.query(url, sql))
            .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"))
            .trim()
            .to_owned()
    }

    /// Runs `sql` on the first replica of the first shard.
    pub fn query(&self, sql: &str) -> String {
        self.query_at(&self.shards[0][0], sql)
    }

    /// `sql`'s single number, on the first replica of the first shard.
    pub fn number(&self, sql: &str) -> u64 {
        self.query(sql).parse().unwrap()
    }

    /// Every id in shard `shard` (duplicates included), read from its first
    /// replica after it caught up with its shard's replication log.
    pub fn ids(&self, shard: usize) -> Vec<u64> {
        let url = &self.shards[shard][0];
        if self.replicated {
            self.query_at(url, &format!("SYSTEM SYNC REPLICA default.{}", self.name));
        }
        self.query_at(url, &format!("SELECT id FROM default.{}", self.name))
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    /// (rows, distinct ids) over every shard.
    pub fn landed(&self) -> (u64, u64) {
        let mut all = std::collections::HashSet::new();
        let mut rows = 0u64;
        for s in 0..self.shards.len() {
            let ids = self.ids(s);
            rows += ids.len() as u64;
            all.extend(ids);
        }
        (rows, all.len() as u64)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        for url in self.shards.iter().flatten() {
            let _ = self.rt.block_on(
                self.ch
                    .query(url, &format!("DROP TABLE IF EXISTS default.{}", self.name)),
            );
        }
    }
}

/// A free local TCP port (for `admin.listen`), below the kernel's ephemeral
/// range (32768..60999 on Linux).
///
/// Why not `bind(":0")`: that hands out an ephemeral port, and between this
/// call and `spate run` binding it, any outgoing connection on the machine
/// (a Kafka client, an HTTP insert) may take the same port as its local
/// end: CI once saw `spate: admin server: cannot listen on 127.0.0.1:40411:
/// Address already in use`. Ports in 21000..28999 are never chosen for
/// outgoing connections; each test process walks them from its own offset
/// (by pid) so tests running side by side do not race for one port, and
/// skips any port some listener already holds (the ClickHouse and Kafka
/// test servers use 18123.. and 29092..).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 21_000;
    const SPAN: u32 = 8_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = (std::process::id() % 800) * 10;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (offset + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + SPAN);
}

/// A plain HTTP/1.0 GET (test-side only): (status, body).
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(RPC)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Some((status, body))
}

/// Polls `/readyz` on `port` until it answers `status`; panics with `spate`'s
/// log after `within`.
pub fn await_readyz(spate: &Spate, port: u16, status: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while get(port, "/readyz").map(|r| r.0) != Some(status) {
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {status} within {within:?}\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `spate run` child process; killed (SIGKILL) on drop.
pub struct Spate {
    /// The child.
    pub child: Child,
    log: PathBuf,
}

impl Spate {
    /// `spate run -c <yaml written to a temp file>`; stderr goes to a log
    /// file, stdout (the summary line) to a pipe.
    pub fn start(test: &str, yaml: &str) -> Spate {
        let dir = std::env::temp_dir();
        let config = dir.join(format!("spate-e2e-{test}-{}.yaml", std::process::id()));
        let log = dir.join(format!("spate-e2e-{test}-{}.log", std::process::id()));
        std::fs::write(&config, yaml).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["run", "-c"])
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn spate");
        Spate { child, log }
    }

    /// Everything spate logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` (as `kill` spells it: `-TERM`, `-INT`).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig}");
    }

    /// Waits up to `within` for the exit: (exit code, stdout). Panics with
    /// the log (after SIGKILL) when it does not exit in time.
    pub fn wait_exit(&mut self, within: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + within;
        let code = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("spate did not exit within {within:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out).unwrap();
        }
        (code, out)
    }

    /// SIGTERM, then waits: (exit code, stdout).
    pub fn terminate(mut self) -> (Option<i32>, String) {
        self.signal("-TERM");
        self.wait_exit(EXIT)
    }
}

impl Drop for Spate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test config: one shard of one replica at `url` (through
/// `${SPATE_CLICKHOUSE_URL}`), drain_timeout 10 s, commits every 200 ms.
pub fn config(
    name: &str,
    brokers: &str,
    topic: &str,
    url: &str,
    table: &str,
    port: u16,
    on_error: &str,
) -> String {
    format!(
        r#"
pipeline: {{ name: {name}, threads: 2 }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: [{topic}]
    group_id: "{name}"
    properties: {{ session.timeout.ms: "6000", heartbeat.interval.ms: "500" }}
format: {{ json: {{ time_formats: ["%Y/%m/%d %H:%M"] }} }}
on_error: {on_error}
sink:
  clickhouse:
    shards: [["${{SPATE_CLICKHOUSE_URL:-{url}}}"]]
    table: {table}
    batch: {{ max_rows: 100000, max_bytes: 8MiB, linger: 100ms }}
shutdown: {{ drain_timeout: 10s }}
admin: {{ listen: "127.0.0.1:{port}" }}
"#
    )
}

/// `yaml` (from [`config`] with `url`) writing to `shards` instead, routed
/// by the JSON field `id` (`sink.clickhouse.shard_key`).
pub fn with_shards(yaml: &str, url: &str, shards: &[Vec<String>]) -> String {
    let list: Vec<String> = shards
        .iter()
        .map(|s| {
            let quoted: Vec<String> = s.iter().map(|u| format!("\"{u}\"")).collect();
            format!("[{}]", quoted.join(", "))
        })
        .collect();
    let out = yaml.replace(
        &format!("shards: [[\"${{SPATE_CLICKHOUSE_URL:-{url}}}\"]]"),
        &format!(
            "shards: [{}]\n    shard_key: {{ field: id }}",
            list.join(", ")
        ),
    );
    assert_ne!(out, yaml, "the shard list was rewritten");
    out
}

/// Committed offsets of `group` per partition (`None`: nothing committed).
pub fn committed(
    brokers: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    // A real cluster answers NotCoordinator / CoordinatorLoadInProgress
    // while a group's coordinator moves or loads: ask again for a while.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match kafka_tools::committed_offsets(brokers, group, topic, partitions, RPC) {
            Ok(offsets) => return offsets,
            Err(e) if Instant::now() < deadline => {
                eprintln!("committed offsets of {group}: {e}; asking again");
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("committed offsets of {group} on {topic}: {e}"),
        }
    }
}

/// Sum of the committed offsets of `group` (records behind its commits).
pub fn committed_sum(brokers: &str, group: &str, topic: &str, partitions: i32) -> i64 {
    committed(brokers, group, topic, partitions)
        .values()
        .map(|o| o.unwrap_or(0).max(0))
        .sum()
}

/// Waits until `group` has committed every partition's end offset, checking
/// the admin endpoints on the way; panics with spate's log otherwise.
pub fn await_commits(
    spate: &Spate,
    brokers: &str,
    group: &str,
    topic: &str,
    partitions: i32,
    port: u16,
) {
    let ends = kafka_tools::end_offsets(brokers, topic, partitions, RPC).unwrap();
    let deadline = Instant::now() + DELIVERY;
    let mut admin_ok = false;
    loop {
        assert!(
            Instant::now() < deadline,
            "not committed within {DELIVERY:?}: ends {ends:?}\n{}",
            spate.logs()
        );
        if !admin_ok {
            let health = get(port, "/healthz");
            let ready = get(port, "/readyz");
            let metrics = get(port, "/metrics");
            if let (Some((200, _)), Some((200, _)), Some((200, m))) = (health, ready, metrics) {
                assert!(m.contains("spate_"), "metrics text: {m}");
                admin_ok = true;
            }
        }
        let committed = committed(brokers, group, topic, partitions);
        if admin_ok
            && ends
                .iter()
                .all(|(p, e)| committed.get(p) == Some(&Some(*e)))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[allow(unused_imports)] // each target uses a subset
pub use spate_testkit::process::{Frozen, server_pid};

/// The sum of every sample of metric `name` on spate's `/metrics` (0 when
/// absent or the endpoint does not answer).
pub fn metric(port: u16, name: &str) -> f64 {
    let Some((200, text)) = get(port, "/metrics") else {
        return 0.0;
    };
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The broker an e2e test runs against: librdkafka's mock cluster in this
/// process (the default), or the real cluster of `ci/kafka.sh` when
/// `SPATE_E2E_KAFKA=real` (then `SPATE_KAFKA_BROKERS` must be set: the
/// same test bodies, the broker chosen by the environment; ci/test.sh runs
/// `e2e.rs` both ways).
pub enum Broker {
    /// The embedded mock cluster.
    Mock(kafka_tools::MockBroker),
    /// The real cluster; topics are created with replication factor 3.
    Real(real::RealKafka),
}

impl Broker {
    /// A broker with topic `topic` of `partitions` partitions; returns the
    /// topic's name there (on the real cluster, suffixed with the process
    /// id, so concurrent tests and earlier runs do not meet).
    pub fn start(topic: &str, partitions: i32) -> (Broker, String) {
        if std::env::var("SPATE_E2E_KAFKA").is_ok_and(|v| v == "real") {
            let kafka = real::RealKafka::from_env()
                .expect("SPATE_E2E_KAFKA=real needs SPATE_KAFKA_BROKERS (ci/kafka.sh start)");
            let b = Broker::Real(kafka);
            let name = b.topic_name(topic);
            b.create_topic(&name, partitions);
            (b, name)
        } else {
            let mock = kafka_tools::start_broker(topic, partitions).unwrap();
            (Broker::Mock(mock), topic.to_owned())
        }
    }

    /// What topic `base` is called on this broker: on the real cluster
    /// suffixed with the process id and a counter (each call a new name).
    pub fn topic_name(&self, base: &str) -> String {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        match self {
            Broker::Mock(_) => base.to_owned(),
            Broker::Real(_) => format!(
                "{base}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
        }
    }

    /// Creates `topic` (a name from [`Broker::topic_name`]).
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        match self {
            Broker::Mock(m) => m.create_topic(topic, partitions, 1).unwrap(),
            Broker::Real(k) => k.create_topic(topic, partitions, 3, &[]),
        }
    }

    /// The bootstrap list.
    pub fn bootstrap_servers(&self) -> String {
        match self {
            Broker::Mock(m) => m.bootstrap_servers(),
            Broker::Real(k) => k.brokers.clone(),
        }
    }
}
