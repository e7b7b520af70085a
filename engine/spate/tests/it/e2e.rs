//! End to end, as a user runs it: the real `spate` binary as a child process
//! (`spate run -c FILE`), an embedded Kafka broker (librdkafka's mock
//! cluster) in this test process, and the real ClickHouse at
//! `SPATE_CLICKHOUSE_URL` (ci/test.sh starts one; without it each test prints
//! `skipped: SPATE_CLICKHOUSE_URL not set` and passes). With
//! `SPATE_E2E_KAFKA=real` the same tests run against the real Apache Kafka
//! cluster at `SPATE_KAFKA_BROKERS` instead (`common::Broker`; ci/test.sh
//! runs this file both ways). The replicated
//! cluster's tests are in `e2e_cluster.rs`; shared helpers in `common/`.
//!
//! Each test owns its table (named by process id and test), its topic and
//! its consumer group, so the tests run in parallel and leave nothing behind.
//! Properties checked: every produced row lands at least once (D1: count of
//! distinct ids equals produced), committed offsets reach the end offsets,
//! SIGTERM drains and exits 0; a kill -9 after commits resumes from them;
//! a hung shard at SIGTERM exits in time with code 2 (D5); a second signal
//! exits at once with 130; poison records are skipped by policy, counted by
//! reason and dead-lettered with their bytes (D6), or, under `fail`, stop the
//! pipeline without a commit past them; the admin endpoints answer.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use spate::kafka_tools;

#[test]
fn flights_land_at_least_once_and_sigterm_exits_clean() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "clean");
    let rows = 4_000u64;
    let feed = Feed::start("flights", 8, "e2e-clean");
    feed.produce_flights(0..rows);
    let spate = Spate::start("clean", &feed.config(&url, &table.name, "{ policy: fail }"));
    feed.await_commits(&spate);
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

/// The poison records of the issue, each with the reason label spate
/// counts it under: invalid JSON, wrong types ("abc" into a UInt32, a string
/// id, an unreadable date), not an object, an empty message, and a 2 MiB
/// message (a 2 MiB string into the UInt64 id).
fn poison() -> Vec<(Vec<u8>, &'static str)> {
    let row = |id: &str, distance: &str| {
        format!(
            r#"{{"id":{id},"date":"2001/01/01 00:47","delay":1,"distance":{distance},"origin":"A","destination":"B"}}"#
        )
        .into_bytes()
    };
    let big = format!("\"{}\"", "7".repeat(2 << 20));
    vec![
        (b"{not json".to_vec(), "decode"),
        (Vec::new(), "decode"),
        (row("5001", "\"abc\""), "encode"),
        (row("\"seven\"", "2"), "encode"),
        (
            r#"{"id":5002,"date":"yesterday","delay":1,"distance":2,"origin":"A","destination":"B"}"#
                .as_bytes()
                .to_vec(),
            "encode",
        ),
        (b"[1, 2]".to_vec(), "decode"),
        (row(&big, "2"), "encode"),
    ]
}

/// `spate_records_skipped_total{reason="..."}` per reason that counted
/// anything, from the Prometheus text.
fn skipped_by_reason(metrics: &str) -> std::collections::BTreeMap<String, u64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("spate_records_skipped_total{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once("} ")?;
            let reason = labels
                .split(',')
                .find_map(|kv| kv.strip_prefix("reason=\""))?
                .trim_end_matches('"');
            Some((reason.to_owned(), value.trim().parse().ok()?))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// D6 under `on_error: skip`: every poison record is skipped, counted by
/// reason on /metrics and dead-lettered with its original bytes and the
/// reason; every good row lands and everything is committed.
#[test]
fn poison_messages_are_skipped_counted_by_reason_and_dead_lettered() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "poison");
    let feed = Feed::start("flights", 4, "e2e-poison");
    let dlq = feed.broker.topic_name("flights-dlq");
    feed.broker.create_topic(&dlq, 1);
    let dlq = dlq.as_str();
    let good = 1_000u64;
    let poison = poison();
    let mut lines: Vec<Vec<u8>> = (0..good).map(|i| flight_row(i).into_bytes()).collect();
    for (i, (p, _)) in poison.iter().enumerate() {
        lines.insert(100 + i * 130, p.clone());
    }
    kafka_tools::produce_lines(
        &feed.brokers,
        &feed.topic,
        feed.partitions,
        lines.iter().map(Vec::as_slice),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    let on_error = format!("{{ policy: skip, dead_letter: {{ topic: {dlq} }} }}");
    let spate = Spate::start("poison", &feed.config(&url, &table.name, &on_error));
    feed.await_commits(&spate);
    let metrics = get(feed.port, "/metrics")
        .map(|(_, m)| m)
        .unwrap_or_default();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("skipped={}", poison.len())),
        "summary: {out}"
    );
    let mut expected = std::collections::BTreeMap::new();
    for (_, reason) in &poison {
        *expected.entry((*reason).to_owned()).or_insert(0u64) += 1;
    }
    // The single form labels every series of its pipeline too (issue 17).
    let label = format!("pipeline=\"{}\"", feed.group);
    let unlabelled: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("spate_") && !l.starts_with("spate_build_info"))
        .filter(|l| !l.contains(&label))
        .collect();
    assert!(
        unlabelled.is_empty(),
        "series without {label}: {unlabelled:?}"
    );
    let counted = skipped_by_reason(&metrics);
    println!("skipped by reason: {counted:?}");
    assert_eq!(counted, expected, "{metrics}");
    let (_, distinct) = table.landed();
    assert_eq!(distinct, good);
    let dead = consume(&feed.brokers, "e2e-dead-letter-reader", dlq, poison.len());
    assert_eq!(dead.len(), poison.len(), "dead-letter topic");
    for (payload, headers) in &dead {
        let (_, reason) = poison
            .iter()
            .find(|(p, _)| p == payload)
            .unwrap_or_else(|| {
                panic!("dead letter of {} bytes is no poison record", payload.len())
            });
        let why = headers
            .iter()
            .find(|(k, _)| k == "spate.reason")
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no spate.reason header: {headers:?}"));
        assert!(!why.is_empty(), "empty reason for a {reason} record");
        assert!(
            headers.iter().any(|(k, _)| k == "spate.offset"),
            "{headers:?}"
        );
    }
}

/// `on_error: fail`: the first poison record stops the pipeline with an
/// error naming its partition and offset, and no commit passes it (D1).
#[test]
fn a_poison_record_under_fail_stops_without_committing_past_it() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "poisonfail");
    let feed = Feed::start("flights", 2, "e2e-poisonfail");
    let topic = feed.topic.as_str();
    let mut lines: Vec<String> = (0..400).map(flight_row).collect();
    // Line i goes to partition i % 2 at offset i / 2: this is flights/1 offset 50.
    let (bad_partition, bad_offset) = (1, 50i64);
    lines.insert(
        (bad_offset * 2 + 1) as usize,
        String::from_utf8(poison()[2].0.clone()).unwrap(),
    );
    feed.produce(&lines);
    let mut spate = Spate::start(
        "poisonfail",
        &feed.config(&url, &table.name, "{ policy: fail }"),
    );
    let (code, out) = spate.wait_exit(DELIVERY);
    let logs = spate.logs();
    println!("on_error fail: exit {code:?}: {}", out.trim());
    assert_eq!(code, Some(3), "stdout: {out}\n{logs}");
    assert!(
        out.contains(&format!(
            "record {topic}/{bad_partition} offset {bad_offset} refused"
        )),
        "stdout: {out}"
    );
    let at = feed.committed()[&bad_partition];
    assert!(
        at.is_none_or(|o| o <= bad_offset),
        "committed {at:?} past the refused record at offset {bad_offset} (D1)"
    );
}

#[test]
fn check_prints_the_mapping_and_fails_on_an_unreachable_replica() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "check");
    let feed = Feed::start("flights", 2, "chk");
    let topic = &feed.topic;
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
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let good = feed.config(&url, &table.name, "{ policy: fail }");
    let (code, out) = run_check(&good);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("topic {topic}: 2 partitions")),
        "{out}"
    );
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
    // A librdkafka property librdkafka does not know: a config error
    // (exit 1) naming it, from `check` as from `run`.
    let typo = good.replace("session.timeout.ms:", "session.timeout.msx:");
    assert_ne!(typo, good, "the property was rewritten");
    let (code, out) = run_check(&typo);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("session.timeout.msx"), "{out}");
    // A dead-letter topic the broker does not have: a problem.
    let no_dlq = good.replace(
        "{ policy: fail }",
        "{ policy: skip, dead_letter: { topic: no-such-dlq } }",
    );
    assert_ne!(no_dlq, good, "the policy was rewritten");
    let (code, out) = run_check(&no_dlq);
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains("PROBLEM: dead-letter topic") && out.contains("no-such-dlq"),
        "{out}"
    );
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
    let rows = 2_000u64;
    let feed = Feed::start("flights", 4, "e2e-hung");
    feed.produce_flights(0..rows);
    let port = feed.port;
    // Shard 0 writes straight to the server, shard 1 through the gate (the
    // same server and table: distinct ids still tell what landed).
    let gate = Gate::start(&url);
    let yaml = feed
        .config(&url, &table.name, "{ policy: fail }")
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
    feed.await_commits(&spate);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    let distinct = table.number(&format!("SELECT uniqExact(id) FROM default.{}", table.name));
    assert_eq!(distinct, rows);
}

/// D1 across a crash after commits: spate is killed with SIGKILL while
/// rows beyond its committed offsets are being written; the restart in the
/// same group resumes from those commits (so the replay, and with it the
/// duplicates, is bounded by the rows after them), and nothing is lost.
#[test]
fn kill_9_after_a_commit_then_restart_resumes_from_the_commits() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "kill9");
    let (first, rows) = (2_000u64, 12_000u64);
    let feed = Feed::start("flights", 8, "e2e-kill9");
    feed.produce_flights(0..first);
    // Small batches, one insert at a time, commits every 100 ms: the second
    // part of the stream takes a while to write, so the kill lands in it.
    let yaml = feed
        .config(&url, &table.name, "{ policy: fail }")
        .replace("interval: 200ms", "interval: 100ms")
        .replace("max_rows: 100000,", "max_rows: 100,")
        .replace(
            "linger: 100ms }",
            "linger: 100ms }\n    inflight: { max_inflight: 1 }",
        )
        .replace("group_id:", "max_batch: 100\n    group_id:");
    assert!(yaml.contains("max_inflight: 1"), "{yaml}");
    let count_sql = format!("SELECT count() FROM default.{}", table.name);

    // First run: wait for a commit, then add the rest of the stream and
    // SIGKILL as soon as rows of it are in ClickHouse.
    let mut spate = Spate::start("kill9", &yaml);
    let deadline = Instant::now() + DELIVERY;
    while feed.committed_sum() == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing committed within {DELIVERY:?}\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    feed.produce_flights(first..rows);
    let second_sql = format!("{count_sql} WHERE id >= {first}");
    while table.number(&second_sql) == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing of the second part written within {DELIVERY:?}\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    spate.child.kill().expect("SIGKILL spate");
    let status = spate.child.wait().unwrap();
    assert_eq!(status.code(), None, "killed by a signal: {status:?}");
    let at_kill = table.number(&count_sql);
    let committed_at_kill = feed.committed_sum() as u64;
    println!(
        "kill -9: {at_kill} of {rows} rows in ClickHouse, {committed_at_kill} records behind \
         committed offsets"
    );
    assert!(committed_at_kill > 0, "the kill came after a commit");
    drop(spate);

    // Second run, same config and group: resumes from the committed offsets.
    let spate = Spate::start("kill9", &yaml);
    feed.await_commits(&spate);
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "stdout: {out}\nlog: {logs}");
    let (count, distinct) = table.landed();
    let duplicates = count - distinct;
    println!("rows {rows}, in ClickHouse {count}, duplicates from the replay {duplicates}");
    assert_eq!(distinct, rows, "rows lost across kill -9 (D1)");
    // Only records at or after a committed offset are read again; a restart
    // from zero would duplicate the committed ones too.
    assert!(
        duplicates <= rows - committed_at_kill,
        "{duplicates} duplicates, but only {} records were not committed: the restart \
         did not resume from the committed offsets",
        rows - committed_at_kill
    );
}

/// README "Exit codes": a second SIGTERM/SIGINT during the drain exits at
/// once with 130 instead of waiting for `drain_timeout` (what it leaves
/// unwritten was not committed and replays, D1).
#[test]
fn a_second_signal_during_the_drain_exits_at_once() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "second");
    let feed = Feed::start("flights", 2, "e2e-second");
    let port = feed.port;
    let gate = Gate::start(&url);
    let yaml = feed
        .config(&url, &table.name, "{ policy: fail }")
        .replace(
            &format!("[[\"${{SPATE_CLICKHOUSE_URL:-{url}}}\"]]"),
            &format!("[[\"{}\"]]", gate.url()),
        )
        .replace("drain_timeout: 10s", "drain_timeout: 60s")
        .replace("linger: 100ms }", "linger: 100ms }\n    write_timeout: 60s");
    assert!(yaml.contains(&gate.url()), "{yaml}");
    let mut spate = Spate::start("second", &yaml);
    await_readyz(&spate, port, 200, DELIVERY);
    // The start-up probe passed; from now on inserts hang in the gate.
    gate.set_open(false);
    feed.produce_flights(0..200);
    let deadline = Instant::now() + DELIVERY;
    while metric(port, "spate_sink_inflight_writes") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "no insert in flight\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    spate.signal("-TERM");
    // The drain is under way (it would wait up to 60 s for the hung insert).
    std::thread::sleep(Duration::from_millis(500));
    assert!(spate.child.try_wait().unwrap().is_none(), "still draining");
    let second = Instant::now();
    spate.signal("-INT");
    let (code, out) = spate.wait_exit(Duration::from_secs(10));
    let took = second.elapsed();
    let logs = spate.logs();
    println!("second signal: exit {code:?} after {took:?}");
    assert_eq!(code, Some(130), "stdout: {out}\n{logs}");
    assert!(logs.contains("second signal"), "{logs}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    gate.set_open(true);
    assert_eq!(
        feed.committed_sum(),
        0,
        "nothing was written, so nothing may be committed (D1)"
    );
}

/// Issue 19 item 1, the issue's repro through the binary, live (ADR 0005):
/// `MODIFY COLUMN distance UInt64` while spate runs. No restart: the next
/// insert finds the change and spate re-plans; rows produced after that
/// carry distances only UInt64 holds; every row lands right and everything
/// is committed; SIGTERM exits 0.
#[test]
fn a_column_widened_while_running_is_replanned_without_a_restart() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "widened");
    let feed = Feed::mock("flights", 1, "e2e-widened");
    let before: Vec<String> = (0..300).map(flight_row).collect();
    feed.produce(&before);
    let spate = Spate::start(
        "widened",
        &feed.config(&url, &table.name, "{ policy: fail }"),
    );
    feed.await_commits(&spate);
    table.query(&format!(
        "ALTER TABLE default.{} MODIFY COLUMN distance UInt64",
        table.name
    ));
    // Rows 300..349 as before: the first insert after the ALTER finds the
    // change (18.16: the re-read before every insert) and re-plans.
    let mut after: Vec<String> = (300..350).map(flight_row).collect();
    feed.produce(&after);
    let deadline = Instant::now() + DELIVERY;
    while !spate.logs().contains("re-planned the INSERT live") {
        assert!(
            Instant::now() < deadline,
            "not re-planned:\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Rows 350..399 carry distances only the new type holds: encoded under
    // the new plan (a record polled before the change was seen is encoded
    // under the old one, where such a value is a record error).
    let wide: Vec<String> = (350..400)
        .map(|i| {
            let mut v: serde_json::Value = serde_json::from_str(&flight_row(i)).unwrap();
            v["distance"] = serde_json::json!(5_000_000_000u64 + i);
            v.to_string()
        })
        .collect();
    feed.produce(&wide);
    after.extend(wide);
    feed.await_commits(&spate);
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "no restart, a clean exit: {out}\n{logs}");
    assert!(
        logs.contains("re-planned the INSERT live: before [")
            && logs.contains("distance UInt32")
            && logs.contains("distance UInt64"),
        "the old and new column lists are logged:\n{logs}"
    );
    assert_eq!(
        table.number(&format!("SELECT count() FROM default.{}", table.name)),
        400
    );
    let want_distance: u64 = before
        .iter()
        .chain(&after)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["distance"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(
        table.number(&format!("SELECT sum(distance) FROM default.{}", table.name)),
        want_distance,
        "every distance as produced"
    );
}

/// What the live plan does not carry still stops (ADR 0005): `MODIFY COLUMN
/// distance UInt16` (a narrowing, whatever the values) while spate runs.
/// The batch fails naming the table, the column and both types, nothing is
/// committed past the rows before the change (D1), spate exits 3, and only
/// the rows of the old schema are in the table, each as produced.
#[test]
fn a_column_narrowed_while_running_stops_without_wrong_rows_or_commits() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "narrowed");
    let feed = Feed::mock("flights", 1, "e2e-narrowed");
    let before: Vec<String> = (0..300).map(flight_row).collect();
    feed.produce(&before);
    let mut spate = Spate::start(
        "narrowed",
        &feed.config(&url, &table.name, "{ policy: fail }"),
    );
    feed.await_commits(&spate);
    table.query(&format!(
        "ALTER TABLE default.{} MODIFY COLUMN distance UInt16",
        table.name
    ));
    feed.produce_flights(300..400);
    let (code, out) = spate.wait_exit(DELIVERY);
    let logs = spate.logs();
    println!("column narrowed: exit {code:?}: {}", out.trim());
    assert_eq!(code, Some(3), "stdout: {out}\n{logs}");
    assert!(
        logs.contains(&format!("{} changed while spate runs", table.name))
            && logs.contains("`distance` was UInt32")
            && logs.contains("now UInt16"),
        "the error names the table, the column and both types:\n{logs}"
    );
    assert!(
        logs.contains("table columns changed: before ["),
        "the change is logged with both column lists:\n{logs}"
    );
    assert_eq!(
        feed.committed()[&0],
        Some(300),
        "D1: nothing committed past the rows before the change"
    );
    assert_eq!(
        table.number(&format!("SELECT count() FROM default.{}", table.name)),
        300
    );
    let want_distance: u64 = before
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["distance"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(
        table.number(&format!("SELECT sum(distance) FROM default.{}", table.name)),
        want_distance
    );
}

/// Issue 19 items 2, 5, 6 through the binary and its config: on 18.16 a
/// field present for a DEFAULT column lands (it was replaced by the
/// DEFAULT), `CAST(0, 'UInt32')` is a constant DEFAULT (a record missing it
/// failed), `mapping.column_options.<col>.epoch_unit: ms` reads 86400000
/// as 1970-01-02 (auto: 1972-09-27), `mapping.empty_as_null` makes `""`
/// NULL; `spate check` says what a missing field gets and names the
/// per-row DEFAULT the server cannot apply.
#[test]
fn default_columns_epoch_units_and_empty_strings_through_the_binary() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "defaults");
    table.query(&format!(
        "ALTER TABLE default.{} ADD COLUMN withdef UInt32 DEFAULT 7, \
         ADD COLUMN z UInt32 DEFAULT 0, ADD COLUMN ms DateTime DEFAULT now(), \
         ADD COLUMN note Nullable(String)",
        table.name
    ));
    let rows = 200u64;
    let feed = Feed::mock("flights", 2, "e2e-defaults");
    let lines: Vec<String> = (0..rows)
        .map(|id| {
            let row = flight_row(id);
            let extra = if id % 2 == 0 {
                r#""withdef":99,"note":"","#
            } else {
                r#""note":"n","#
            };
            format!("{{{extra}\"ms\":86400000,{}", &row[1..])
        })
        .collect();
    feed.produce(&lines);
    let yaml = feed.config(&url, &table.name, "{ policy: fail }")
        + "mapping: { empty_as_null: true, column_options: { ms: { epoch_unit: ms } } }\n";

    let path = std::env::temp_dir().join(format!("spate-e2e-defaults-{}.yaml", std::process::id()));
    std::fs::write(&path, &yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("spawn spate check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_file(&path);
    assert!(
        text.contains("withdef: DEFAULT 7 (written by spate)"),
        "{text}"
    );
    assert!(text.contains("z: DEFAULT 0 (written by spate)"), "{text}");
    assert!(text.contains("ms: record error (on_error)"), "{text}");
    assert!(
        text.contains("column ms has DEFAULT now(), computed per row"),
        "{text}"
    );
    // Issue 31: check says what the run does (the insert's FORMAT and the
    // delivery mode), and the run logs the same line at start.
    let claim = text
        .lines()
        .find(|l| l.starts_with("inserts: FORMAT "))
        .unwrap_or_else(|| panic!("no inserts line: {text}"))
        .to_owned();
    assert!(claim.contains("delivery: at_least_once"), "{claim}");

    let spate = Spate::start("defaults", &yaml);
    feed.await_commits(&spate);
    let logs = spate.logs();
    assert!(
        logs.contains(&claim),
        "check said `{claim}`; the run logged otherwise: {logs}"
    );
    assert!(
        logs.contains("DEFAULT is computed per row") && logs.contains("ms"),
        "the start-up warning names the column: {logs}"
    );
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "stdout: {out}\nlog: {logs}");
    let q = |sql: &str| table.number(&format!("{sql} FROM default.{}", table.name));
    assert_eq!(q("SELECT uniqExact(id)"), rows);
    assert_eq!(q("SELECT countIf(withdef = 99 AND id % 2 = 0)"), rows / 2);
    assert_eq!(q("SELECT countIf(withdef = 7 AND id % 2 = 1)"), rows / 2);
    assert_eq!(q("SELECT countIf(z = 0)"), rows);
    assert_eq!(q("SELECT countIf(toUInt32(ms) = 86400)"), rows);
    assert_eq!(q("SELECT countIf(isNull(note) AND id % 2 = 0)"), rows / 2);
    assert_eq!(q("SELECT countIf(note = 'n' AND id % 2 = 1)"), rows / 2);
}

/// A replica URL written with credentials (`http://user:secret@host`, as
/// clickhouse-client accepts) never shows its password: not in `spate
/// check`'s report, not in `spate run`'s errors, log lines or summary.
#[test]
fn a_password_in_a_replica_url_is_never_printed() {
    const SECRET: &str = "s3cret-in-url";
    let feed = Feed::start("flights", 1, "pwurl");
    let placeholder = "http://127.0.0.1:1";
    let dead = free_port();
    let yaml = feed
        .config(placeholder, "t_pwurl", "{ policy: fail }")
        .replace(
            &format!("\"${{SPATE_CLICKHOUSE_URL:-{placeholder}}}\""),
            &format!("\"http://spate:{SECRET}@127.0.0.1:{dead}\""),
        );
    assert!(yaml.contains(SECRET), "the replica URL was rewritten");
    let path = std::env::temp_dir().join(format!("spate-e2e-pwurl-{}.yaml", std::process::id()));
    std::fs::write(&path, &yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("spawn spate check");
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "an unreachable replica: {report}"
    );
    assert!(
        report.contains(&format!("127.0.0.1:{dead}")),
        "the replica is named: {report}"
    );
    assert!(
        !report.contains(SECRET),
        "spate check printed the password: {report}"
    );
    let mut spate = Spate::start("pwurl", &yaml);
    let (code, summary) = spate.wait_exit(EXIT);
    let logs = spate.logs();
    assert_ne!(code, Some(0), "no replica answers: {logs}");
    assert!(
        logs.contains(&format!("127.0.0.1:{dead}")),
        "the replica is named: {logs}"
    );
    assert!(
        !logs.contains(SECRET),
        "spate run logged the password: {logs}"
    );
    assert!(
        !summary.contains(SECRET),
        "the summary printed the password: {summary}"
    );
}
