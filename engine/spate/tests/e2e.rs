//! End to end, as a user runs it: the real `spate` binary as a child process
//! (`spate run -c FILE`), an embedded Kafka broker (librdkafka's mock
//! cluster) in this test process, and the real ClickHouse at
//! `SPATE_CLICKHOUSE_URL` (ci/test.sh starts one; without it each test prints
//! `skipped: SPATE_CLICKHOUSE_URL not set` and passes).
//!
//! Each test owns its table (named by process id and test), its topic and
//! its consumer group, so the tests run in parallel and leave nothing behind.
//! Properties checked: every produced row lands at least once (D1: count of
//! distinct ids equals produced), committed offsets reach the end offsets,
//! SIGTERM drains and exits 0, poison records are skipped by policy, counted
//! and dead-lettered (D6), and the admin endpoints answer during the run.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spate::kafka_tools;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};

const FIXTURE: &str = include_str!("../fixtures/flights-20k.ndjson");
const RPC: Duration = Duration::from_secs(10);
/// Bound on delivery (includes the mock broker's ~3 s group join).
const DELIVERY: Duration = Duration::from_secs(90);
/// Bound on the drain after SIGTERM (the config's drain_timeout is 10 s).
const EXIT: Duration = Duration::from_secs(30);

fn clickhouse_url() -> Option<String> {
    match std::env::var("SPATE_CLICKHOUSE_URL") {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ => {
            println!("skipped: SPATE_CLICKHOUSE_URL not set");
            None
        }
    }
}

fn flight_row(id: u64) -> String {
    let lines: Vec<&str> = FIXTURE.lines().take(1000).collect();
    let line = lines[(id % lines.len() as u64) as usize];
    format!("{{\"id\":{id},{}", &line[1..])
}

struct Table {
    url: String,
    name: String,
    rt: tokio::runtime::Runtime,
    ch: HttpWriter,
}

impl Table {
    fn create(url: &str, test: &str) -> Table {
        let name = format!("spate_e2e_{test}_{}", std::process::id());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ch = HttpWriter::new(HttpWriterConfig::new("default", &name, Vec::new()));
        let t = Table {
            url: url.to_owned(),
            name,
            rt,
            ch,
        };
        t.query(&format!("DROP TABLE IF EXISTS default.{}", t.name));
        t.query(&format!(
            "CREATE TABLE default.{} (id UInt64, date DateTime, delay Int32, distance UInt32, \
             origin String, destination String) ENGINE = MergeTree ORDER BY id",
            t.name
        ));
        t
    }

    fn query(&self, sql: &str) -> String {
        self.rt
            .block_on(self.ch.query(&self.url, sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .trim()
            .to_owned()
    }

    fn number(&self, sql: &str) -> u64 {
        self.query(sql).parse().unwrap()
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.ch.query(
            &self.url,
            &format!("DROP TABLE IF EXISTS default.{}", self.name),
        ));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.0 GET (test-side only): (status, body).
fn get(port: u16, path: &str) -> Option<(u16, String)> {
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

struct Spate {
    child: Child,
    log: PathBuf,
}

impl Spate {
    fn start(test: &str, yaml: &str) -> Spate {
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

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits: (exit code, stdout).
    fn terminate(mut self) -> (Option<i32>, String) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM");
        let deadline = Instant::now() + EXIT;
        let code = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("spate did not exit within {EXIT:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out).unwrap();
        }
        (code, out)
    }
}

impl Drop for Spate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(
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

/// Waits until `group` has committed every partition's end offset, checking
/// the admin endpoints on the way; panics with spate's log otherwise.
fn await_commits(
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
        let committed =
            kafka_tools::committed_offsets(brokers, group, topic, partitions, RPC).unwrap();
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

#[test]
fn flights_land_at_least_once_and_sigterm_exits_clean() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "clean");
    let (topic, partitions, rows) = ("flights", 8, 4_000u64);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    let brokers = mock.bootstrap_servers();
    let lines: Vec<String> = (0..rows).map(flight_row).collect();
    let produced = kafka_tools::produce_lines(
        &brokers,
        topic,
        partitions,
        lines.iter().map(String::as_bytes),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    assert_eq!(produced, rows);
    let port = free_port();
    let group = format!("e2e-clean-{}", std::process::id());
    let spate = Spate::start(
        "clean",
        &config(
            &group,
            &brokers,
            topic,
            &url,
            &table.name,
            port,
            "{ policy: fail }",
        ),
    );
    await_commits(&spate, &brokers, &group, topic, partitions, port);
    let logs_before = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "stdout: {out}\nlog: {logs_before}");
    assert!(out.contains("status=Clean"), "{out}");
    let distinct = table.number(&format!("SELECT uniqExact(id) FROM default.{}", table.name));
    let count = table.number(&format!("SELECT count() FROM default.{}", table.name));
    println!(
        "rows {rows}, in ClickHouse {count}, duplicates {}",
        count - distinct
    );
    assert_eq!(distinct, rows);
}

#[test]
fn poison_messages_are_skipped_counted_and_dead_lettered() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "poison");
    let (topic, dlq, partitions) = ("flights", "flights-dlq", 4);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    mock.create_topic(dlq, 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let good = 1_000u64;
    let mut lines: Vec<String> = (0..good).map(flight_row).collect();
    let poison = [
        "{not json".to_owned(),
        String::new(),
        r#"{"id":"seven","date":"2001/01/01 00:47","delay":1,"distance":2,"origin":"A","destination":"B"}"#.to_owned(),
        r#"{"id":5000,"date":"yesterday","delay":1,"distance":2,"origin":"A","destination":"B"}"#.to_owned(),
        "[1, 2]".to_owned(),
    ];
    for (i, p) in poison.iter().enumerate() {
        lines.insert(100 + i * 150, p.clone());
    }
    kafka_tools::produce_lines(
        &brokers,
        topic,
        partitions,
        lines.iter().map(String::as_bytes),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    let port = free_port();
    let group = format!("e2e-poison-{}", std::process::id());
    let spate = Spate::start(
        "poison",
        &config(
            &group,
            &brokers,
            topic,
            &url,
            &table.name,
            port,
            &format!("{{ policy: skip, dead_letter: {{ topic: {dlq} }} }}"),
        ),
    );
    await_commits(&spate, &brokers, &group, topic, partitions, port);
    let metrics = get(port, "/metrics").map(|(_, m)| m).unwrap_or_default();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("skipped={}", poison.len())),
        "summary: {out}"
    );
    assert!(metrics.contains("spate_records_skipped_total"), "{metrics}");
    let distinct = table.number(&format!("SELECT uniqExact(id) FROM default.{}", table.name));
    assert_eq!(distinct, good);
    let dead = kafka_tools::end_offsets(&brokers, dlq, 1, RPC).unwrap();
    assert_eq!(dead[&0], poison.len() as i64, "dead-letter topic");
}

#[test]
fn check_prints_the_mapping_and_fails_on_an_unreachable_replica() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "check");
    let mock = kafka_tools::start_broker("flights", 2).unwrap();
    let brokers = mock.bootstrap_servers();
    let run_check = |yaml: &str| {
        let path =
            std::env::temp_dir().join(format!("spate-e2e-check-{}.yaml", std::process::id()));
        std::fs::write(&path, yaml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["check", "-c"])
            .arg(&path)
            .output()
            .expect("spawn spate check");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let good = config(
        "chk",
        &brokers,
        "flights",
        &url,
        &table.name,
        free_port(),
        "{ policy: fail }",
    );
    let (code, out) = run_check(&good);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("topic flights: 2 partitions"), "{out}");
    for column in ["id", "date", "delay", "distance", "origin", "destination"] {
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(column)),
            "no mapping line for {column}: {out}"
        );
    }
    assert!(out.contains("lacks:"), "{out}");
    // A second replica nobody listens on: a problem, non-zero exit.
    let dead = free_port();
    let bad = good.replace(
        &format!("[\"${{SPATE_CLICKHOUSE_URL:-{url}}}\"]"),
        &format!("[\"{url}\", \"http://127.0.0.1:{dead}\"]"),
    );
    assert_ne!(bad, good, "the replica list was rewritten");
    let (code, out) = run_check(&bad);
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("PROBLEM"), "{out}");
}

/// A TCP gate in front of ClickHouse: forwards while open; once closed, it
/// stops forwarding (connections hang, as with a SIGSTOPped server), and
/// data caught in a closed gate is dropped, never delivered late.
struct Gate {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    port: u16,
}

impl Gate {
    fn start(upstream: &str) -> Gate {
        use std::sync::atomic::Ordering;
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let gate = std::sync::Arc::clone(&open);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let gate = std::sync::Arc::clone(&gate);
                let upstream = upstream.clone();
                std::thread::spawn(move || {
                    while !gate.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let Ok(server) = TcpStream::connect(&upstream) else {
                        return;
                    };
                    let pump = |mut from: TcpStream, mut to: TcpStream, gate: std::sync::Arc<std::sync::atomic::AtomicBool>| {
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if !gate.load(Ordering::Acquire) {
                                // Hang until reopened, then drop what was caught.
                                while !gate.load(Ordering::Acquire) {
                                    std::thread::sleep(Duration::from_millis(20));
                                }
                                break;
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    };
                    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    let g2 = std::sync::Arc::clone(&gate);
                    let up = std::thread::spawn(move || pump(c2, s2, g2));
                    pump(server, client, gate);
                    let _ = up.join();
                });
            }
        });
        Gate { open, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn set_open(&self, open: bool) {
        self.open.store(open, std::sync::atomic::Ordering::Release);
    }
}

#[test]
fn sigterm_with_a_hung_shard_exits_in_time_with_abandoned_then_restart_loses_nothing() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "hung");
    let (topic, partitions, rows) = ("flights", 4, 2_000u64);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    let brokers = mock.bootstrap_servers();
    let lines: Vec<String> = (0..rows).map(flight_row).collect();
    kafka_tools::produce_lines(
        &brokers,
        topic,
        partitions,
        lines.iter().map(String::as_bytes),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    // Shard 0 writes straight to the server, shard 1 through the gate (the
    // same server and table: distinct ids still tell what landed).
    let gate = Gate::start(&url);
    let group = format!("e2e-hung-{}", std::process::id());
    let port = free_port();
    let yaml = config(&group, &brokers, topic, &url, &table.name, port, "{ policy: fail }")
        .replace(
            &format!("[[\"${{SPATE_CLICKHOUSE_URL:-{url}}}\"]]"),
            &format!("[[\"{url}\"], [\"{}\"]]", gate.url()),
        )
        .replace("drain_timeout: 10s", "drain_timeout: 3s")
        .replace("linger: 100ms }", "linger: 100ms }\n    write_timeout: 2s\n    retry: { initial: 100ms, max: 500ms, max_attempts: 1000 }");
    assert!(yaml.contains(&gate.url()), "{yaml}");
    let spate = Spate::start("hung", &yaml);
    // Close the gate once the start-up probe passed, before the group join
    // (about 3 s) lets any row through.
    let deadline = Instant::now() + DELIVERY;
    while get(port, "/readyz").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "never ready\n{}", spate.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    gate.set_open(false);
    // Wait until shard 0 wrote something, so the run is mid-stream.
    while table.number(&format!("SELECT count() FROM default.{}", table.name)) == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing written\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let stopping = Instant::now();
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    let took = stopping.elapsed();
    println!("hung shard: exit {code:?} after {took:?}: {}", out.trim());
    assert!(
        took < Duration::from_secs(3 + 2),
        "exit took {took:?} (D5)\n{logs}"
    );
    assert_eq!(code, Some(2), "stdout: {out}\n{logs}");
    assert!(!out.contains("abandoned_rows=0 "), "{out}");

    // Restart with the shard back: everything lands (D1).
    gate.set_open(true);
    let spate = Spate::start("hung2", &yaml);
    await_commits(&spate, &brokers, &group, topic, partitions, port);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    let distinct = table.number(&format!("SELECT uniqExact(id) FROM default.{}", table.name));
    assert_eq!(distinct, rows);
}

#[test]
fn kill_9_mid_stream_then_restart_loses_nothing() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "kill9");
    let (topic, partitions, rows) = ("flights", 8, 20_000u64);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    let brokers = mock.bootstrap_servers();
    let lines: Vec<String> = (0..rows).map(flight_row).collect();
    let produced = kafka_tools::produce_lines(
        &brokers,
        topic,
        partitions,
        lines.iter().map(String::as_bytes),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    assert_eq!(produced, rows);
    let group = format!("e2e-kill9-{}", std::process::id());
    let port = free_port();
    // Small batches, one insert at a time, commits every 100 ms, so rows
    // show up in ClickHouse before spate has caught up. (In practice the kill
    // comes before the first commit, and the restart replays from the start.)
    let yaml = config(
        &group,
        &brokers,
        topic,
        &url,
        &table.name,
        port,
        "{ policy: fail }",
    )
    .replace("interval: 200ms", "interval: 100ms")
    .replace("max_rows: 100000,", "max_rows: 100,")
    .replace(
        "linger: 100ms }",
        "linger: 100ms }\n    inflight: { max_inflight: 1 }",
    )
    .replace("group_id:", "max_batch: 100\n    group_id:");
    assert!(yaml.contains("max_inflight: 1"), "{yaml}");
    let count_sql = format!("SELECT count() FROM default.{}", table.name);
    let committed_sum = || {
        kafka_tools::committed_offsets(&brokers, &group, topic, partitions, RPC)
            .unwrap()
            .values()
            .map(|o| o.unwrap_or(0).max(0))
            .sum::<i64>()
    };

    // First run: SIGKILL as soon as the first rows are in ClickHouse.
    let mut spate = Spate::start("kill9", &yaml);
    let deadline = Instant::now() + DELIVERY;
    while table.number(&count_sql) == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing written within {DELIVERY:?}\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    spate.child.kill().expect("SIGKILL spate");
    let status = spate.child.wait().unwrap();
    assert_eq!(status.code(), None, "killed by a signal: {status:?}");
    let at_kill = table.number(&count_sql);
    let committed = committed_sum();
    println!("kill -9: {at_kill} of {rows} rows in ClickHouse, {committed} offsets committed");
    drop(spate);

    // Second run, same config and group: resumes from whatever was committed.
    let spate = Spate::start("kill9", &yaml);
    await_commits(&spate, &brokers, &group, topic, partitions, port);
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "stdout: {out}\nlog: {logs}");
    let distinct = table.number(&format!(
        "SELECT count(DISTINCT id) FROM default.{}",
        table.name
    ));
    let count = table.number(&count_sql);
    println!(
        "rows {rows}, in ClickHouse {count}, duplicates from the replay {}",
        count - distinct
    );
    assert_eq!(distinct, rows, "rows lost across kill -9 (D1)");
}
