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

const FIXTURE: &str = include_str!("../../fixtures/flights-20k.ndjson");
/// Bound on one broker or ClickHouse round trip from the test.
pub const RPC: Duration = Duration::from_secs(10);
/// Bound on delivery (includes the mock broker's ~3 s group join).
pub const DELIVERY: Duration = Duration::from_secs(90);
/// Bound on the drain after SIGTERM (the config's drain_timeout is 10 s).
pub const EXIT: Duration = Duration::from_secs(30);

/// `SPATE_CLICKHOUSE_URL`, or `None` after printing why the test is skipped.
pub fn clickhouse_url() -> Option<String> {
    match std::env::var("SPATE_CLICKHOUSE_URL") {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ => {
            println!("skipped: SPATE_CLICKHOUSE_URL not set");
            None
        }
    }
}

/// The replica URLs per shard from `SPATE_CLICKHOUSE_SHARDS`
/// (`a1,a2;b1,b2`, as ci/test.sh exports it), or `None` after printing why
/// the test is skipped.
pub fn clickhouse_shards() -> Option<Vec<Vec<String>>> {
    let Ok(spec) = std::env::var("SPATE_CLICKHOUSE_SHARDS") else {
        println!("skipped: SPATE_CLICKHOUSE_SHARDS not set");
        return None;
    };
    let shards: Vec<Vec<String>> = spec
        .split(';')
        .map(|s| {
            s.split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|s| !s.is_empty())
        .collect();
    if shards.len() < 2 || shards.iter().any(|s| s.len() < 2) {
        println!("skipped: SPATE_CLICKHOUSE_SHARDS needs at least 2 shards of 2 replicas");
        return None;
    }
    Some(shards)
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

/// A free local TCP port (for `admin.listen`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// The pid of the process listening on `url`'s port on this machine, from
/// `/proc` (the listening socket's inode in `/proc/net/tcp*`, then the
/// process holding it among `/proc/<pid>/fd`); `None` when not found.
pub fn server_pid(url: &str) -> Option<u32> {
    let port: u16 = url.trim_end_matches('/').rsplit(':').next()?.parse().ok()?;
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(&state), Some(&inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if state == "0A" && local_port == Some(port) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc_entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc_entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// ClickHouse servers frozen with SIGSTOP; SIGCONT on drop (also when the
/// test panics), so no failure leaves a server stopped.
pub struct Frozen(Vec<u32>);

impl Frozen {
    /// SIGSTOPs the servers listening on `urls`; panics when one is not a
    /// local process (the guard still thaws those already stopped).
    pub fn stop(urls: &[String]) -> Frozen {
        let mut frozen = Frozen(Vec::new());
        for url in urls {
            let pid = server_pid(url)
                .unwrap_or_else(|| panic!("no local process listens on {url} (SIGSTOP)"));
            assert!(send(pid, "-STOP"), "kill -STOP {pid} ({url})");
            frozen.0.push(pid);
        }
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &pid in &self.0 {
            send(pid, "-CONT");
        }
    }
}

/// `kill SIG PID`; whether it succeeded. (Never asserts: it runs in a Drop,
/// where a panic while panicking aborts.)
fn send(pid: u32, sig: &str) -> bool {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("kill {sig} {pid} failed");
    }
    ok
}

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
