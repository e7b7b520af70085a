//! `/metrics` and `/readyz` of a running `spate run` (issue 18, part 3):
//! the `spate` binary as a child process, librdkafka's mock cluster in this
//! process, ClickHouse 18.16 at `SPATE_CLICKHOUSE_URL` (ci/test.sh starts it;
//! without it the test prints `skipped: ...` and passes).
//!
//! Two shards on the one server: shard 0 directly, shard 1 through a
//! [`Gate`] in this process, a TCP forwarder that can turn into a black
//! hole (it accepts, reads and discards, never answers: a frozen replica
//! as the sink sees it) and back.
//!
//! Checked: every series has `# HELP` and `# TYPE` lines; the series
//! `docs/METRICS.md` lists as new are served (histograms with their
//! buckets, counting the batches and rows the counters count),
//! `spate_build_info`, the `process_*` series, the lag without
//! `statistics.interval.ms` in the config; two scrapes list the series in
//! the same order; with shard 1 frozen `/readyz` answers 503 at every poll
//! for longer than two breaker cooldowns, its body naming shard 1 and its
//! replica, the breaker and readiness gauges follow; after the thaw it
//! answers 200, every row lands and the backoff gauge reads exactly `0`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use spate::kafka_tools;

/// A TCP forwarder to `upstream` that can be frozen: while frozen, bytes
/// either way are read and dropped, and a connection that dropped any is
/// closed after the thaw (so no stale request lands late).
struct Gate {
    port: u16,
    frozen: Arc<AtomicBool>,
}

impl Gate {
    fn start(upstream: &str) -> Gate {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = Arc::clone(&frozen);
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let poisoned = Arc::new(AtomicBool::new(false));
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let (f, poisoned) = (Arc::clone(&f), Arc::clone(&poisoned));
                    thread::spawn(move || pump(from, to, &f, &poisoned));
                }
            }
        });
        Gate { port, frozen }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn freeze(&self, on: bool) {
        self.frozen.store(on, Ordering::SeqCst);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool, poisoned: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            poisoned.store(true, Ordering::SeqCst);
            continue;
        }
        if poisoned.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// One sample line: (series key `name{labels}`, value text).
fn samples(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((without_pipeline(k), v.to_owned()))
        })
        .collect()
}

/// `key` without its `pipeline="NAME"` label: every series of a pipeline
/// carries one (issue 17, `spate_core::metrics::Scope`); the keys this file
/// asserts on are written without it.
fn without_pipeline(key: &str) -> String {
    let Some(at) = key.find("pipeline=\"") else {
        return key.to_owned();
    };
    let value_end = key[at + 10..]
        .find('"')
        .map_or(key.len(), |e| at + 10 + e + 1);
    let k = format!("{}{}", &key[..at], &key[value_end..]);
    let k = k.replace(",,", ",").replace("{,", "{").replace(",}", "}");
    k.strip_suffix("{}").map_or(k.clone(), str::to_owned)
}

/// The value of the series `key` exactly (`name{labels}` as rendered).
fn value(text: &str, key: &str) -> Option<String> {
    samples(text)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// Sum of every sample of family member `name` (`name` or `name{...}`).
fn sum(text: &str, name: &str) -> f64 {
    samples(text)
        .into_iter()
        .filter(|(k, _)| k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

fn scrape(port: u16) -> String {
    let (status, text) = get(port, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    text
}

/// Every sample's family has a `# HELP` and a `# TYPE` line (a histogram's
/// `_bucket`, `_sum` and `_count` belong to its family).
fn check_help_and_type(text: &str) {
    let mut help = BTreeSet::new();
    let mut kind = BTreeMap::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# HELP ") {
            let (name, desc) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(!desc.trim().is_empty(), "empty HELP: {l}");
            help.insert(name.to_owned());
        } else if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').unwrap();
            kind.insert(name.to_owned(), t.to_owned());
        }
    }
    for (key, _) in samples(text) {
        let name = key.split('{').next().unwrap();
        let family = if kind.contains_key(name) {
            name
        } else {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| kind.contains_key(*f)))
                .unwrap_or_else(|| panic!("no # TYPE for {key}"))
        };
        assert!(help.contains(family), "no # HELP for {family}");
    }
}

/// A histogram family's buckets per label set are cumulative, end in
/// `+Inf` equal to `_count`; returns (count, sum) over its label sets.
fn check_histogram(text: &str, name: &str) -> (f64, f64) {
    assert!(
        text.contains(&format!("# TYPE {name} histogram")),
        "{name} is not a histogram:\n{text}"
    );
    let mut last: BTreeMap<String, (f64, bool)> = BTreeMap::new();
    for (key, v) in samples(text) {
        let Some(labels) = key.strip_prefix(&format!("{name}_bucket{{")) else {
            continue;
        };
        let v: f64 = v.parse().unwrap();
        let (le_part, others) = match labels.split_once("le=\"") {
            Some((before, after)) => (after, before.to_owned()),
            None => panic!("bucket without le: {key}"),
        };
        let le = le_part.split('"').next().unwrap();
        let entry = last.entry(others).or_insert((0.0, false));
        assert!(v >= entry.0, "{key}: buckets not cumulative");
        *entry = (v, le == "+Inf");
    }
    assert!(!last.is_empty(), "{name} has no buckets");
    for (labels, (inf, ended)) in &last {
        assert!(ended, "{name}{{{labels}}}: last bucket is not +Inf");
        let labels = labels.trim_end_matches(',');
        let count_key = if labels.is_empty() {
            format!("{name}_count")
        } else {
            format!("{name}_count{{{labels}}}")
        };
        let count: f64 = value(text, &count_key)
            .unwrap_or_else(|| panic!("no {count_key}"))
            .parse()
            .unwrap();
        assert_eq!(*inf, count, "{name}{{{labels}}}: +Inf bucket vs _count");
    }
    (
        sum(text, &format!("{name}_count")),
        sum(text, &format!("{name}_sum")),
    )
}

#[test]
fn metrics_are_described_and_complete_and_readyz_is_steady_while_a_shard_is_frozen() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "metrics");
    let gate = Gate::start(&url);
    let (topic, partitions, part) = ("flights", 4, 1_000u64);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    let brokers = mock.bootstrap_servers();
    let lines: Vec<String> = (0..2 * part).map(flight_row).collect();
    let group = format!("e2e-metrics-{}", std::process::id());
    let port = free_port();
    let shards = vec![vec![url.clone()], vec![gate.url()]];
    let base = config(
        &group,
        &brokers,
        topic,
        &url,
        &table.name,
        port,
        "{ policy: fail }",
    );
    assert!(
        !base.contains("statistics.interval.ms"),
        "lag needs no setting"
    );
    let yaml = with_shards(&base, &url, &shards).replace(
        "linger: 100ms }",
        "linger: 100ms }\n    write_timeout: 500ms\n    \
         retry: { initial: 100ms, max: 300ms, max_attempts: 0 }",
    );
    assert!(yaml.contains("write_timeout: 500ms"), "{yaml}");

    produce(&brokers, topic, partitions, &lines[..part as usize]);
    let spate = Spate::start("metrics", &yaml);
    await_commits(&spate, &brokers, &group, topic, partitions, port);

    // The lag comes from librdkafka's statistics (spate's 5 s default).
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(port);
        let lag = format!("spate_consumer_lag{{topic=\"{topic}\",partition=\"0\"}}");
        if value(&text, &lag).as_deref() == Some("0") {
            break text;
        }
        assert!(Instant::now() < deadline, "no lag of 0 in 30 s:\n{text}");
        thread::sleep(Duration::from_millis(250));
    };
    check_help_and_type(&text);
    for name in [
        "spate_sink_batches_flushed_total",
        "spate_sink_rows_written_total",
        "spate_sink_backoff_seconds",
        "spate_sink_replica_breaker_open",
        "spate_sink_shard_ready",
        "spate_committed_offset",
        "spate_last_commit_timestamp_seconds",
        "spate_consumer_lag",
        "spate_consumer_lag_stale",
        "spate_consumer_lag_updated_timestamp_seconds",
        "spate_consumer_assigned_partitions",
        "spate_consumer_rebalances_total",
        "spate_records_polled_total",
        "spate_budget_bytes_in_use",
        "spate_budget_bytes_max",
        "spate_budget_rows_in_use",
        "spate_budget_rows_max",
        "spate_ready",
        "spate_build_info",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{text}"
        );
    }
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        text.lines().any(|l| l.starts_with(&format!(
            "spate_build_info{{version=\"{version}\",librdkafka=\""
        )) && l.ends_with("} 1")),
        "build_info:\n{text}"
    );
    assert!(sum(&text, "process_resident_memory_bytes") > 1e6);
    assert!(sum(&text, "process_open_fds") >= 3.0);
    // metrics-process counts CPU in whole seconds (a u64 counter).
    assert!(text.contains("# TYPE process_cpu_seconds_total counter"));
    assert!(value(&text, "process_cpu_seconds_total").is_some());
    assert_eq!(sum(&text, "spate_ready"), 1.0);
    assert_eq!(sum(&text, "spate_consumer_assigned_partitions"), 4.0);
    assert_eq!(sum(&text, "spate_consumer_lag_stale"), 0.0);
    assert_eq!(sum(&text, "spate_sink_replica_breaker_open"), 0.0);
    assert_eq!(
        value(&text, "spate_sink_shard_ready{shard=\"1\"}").as_deref(),
        Some("1")
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let stamp: f64 = value(
        &text,
        &format!("spate_last_commit_timestamp_seconds{{topic=\"{topic}\",partition=\"0\"}}"),
    )
    .expect("commit timestamp of partition 0")
    .parse()
    .unwrap();
    assert!(
        (now - stamp).abs() < 120.0,
        "commit stamp {stamp} vs now {now}"
    );

    // Histograms count what the counters count: one record per batch.
    let batches = sum(&text, "spate_sink_batches_flushed_total");
    let rows = sum(&text, "spate_sink_rows_written_total");
    let bytes = sum(&text, "spate_sink_bytes_written_total");
    assert_eq!(rows, part as f64);
    assert_eq!(
        check_histogram(&text, "spate_sink_batch_rows"),
        (batches, rows)
    );
    assert_eq!(
        check_histogram(&text, "spate_sink_batch_bytes"),
        (batches, bytes)
    );
    assert_eq!(
        check_histogram(&text, "spate_sink_insert_duration_seconds").0,
        batches
    );
    let (e2e_count, e2e_sum) = check_histogram(&text, "spate_end_to_end_latency_seconds");
    assert_eq!(e2e_count, batches, "the mock broker stamps every message");
    assert!(
        e2e_sum > 0.0 && e2e_sum < batches * 120.0,
        "e2e sum {e2e_sum}"
    );
    let (commits, _) = check_histogram(&text, "spate_commit_duration_seconds");
    assert!(commits >= 1.0);

    // Stable order: a second scrape lists the same series in the same order.
    let keys = |t: &str| samples(t).into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(keys(&scrape(port)), keys(&scrape(port)));

    // Shard 1 frozen: /readyz 503 at every poll for 12 s (beyond two 5 s
    // breaker cooldowns, where it used to answer 200 during each half-open
    // trial), naming the shard and its replica.
    gate.freeze(true);
    produce(&brokers, topic, partitions, &lines[part as usize..]);
    await_readyz(&spate, port, 503, Duration::from_secs(30));
    let mut saw_backoff = false;
    let end = Instant::now() + Duration::from_secs(12);
    while Instant::now() < end {
        let (status, body) = get(port, "/readyz").expect("/readyz answers");
        assert_eq!(status, 503, "ready during a steady fault: {body}");
        let want = format!(
            "not ready: shard 1: every replica's breaker open (r0 {}: ",
            gate.url()
        );
        assert!(body.starts_with(&want), "{body}");
        let text = scrape(port);
        saw_backoff |= value(&text, "spate_sink_backoff_seconds{shard=\"1\"}")
            .is_some_and(|v| v.parse::<f64>().unwrap() > 0.0);
        thread::sleep(Duration::from_millis(100));
    }
    assert!(saw_backoff, "shard 1 backed off while frozen");
    let text = scrape(port);
    assert_eq!(
        value(
            &text,
            "spate_sink_replica_breaker_open{shard=\"1\",replica=\"0\"}"
        )
        .as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        value(&text, "spate_sink_shard_ready{shard=\"1\"}").as_deref(),
        Some("0")
    );
    assert_eq!(value(&text, "spate_ready").as_deref(), Some("0"));

    // Thawed: ready again, every row lands, and the backoff gauge is 0
    // exactly (not 2.77e-17).
    gate.freeze(false);
    await_readyz(&spate, port, 200, Duration::from_secs(30));
    await_commits(&spate, &brokers, &group, topic, partitions, port);
    let (_, distinct) = table.landed();
    assert_eq!(distinct, 2 * part, "every row landed");
    let text = scrape(port);
    assert_eq!(
        value(&text, "spate_sink_backoff_seconds{shard=\"1\"}").as_deref(),
        Some("0"),
        "{text}"
    );
    assert!(sum(&text, "spate_sink_retries_total") > 0.0);
    assert_eq!(
        value(
            &text,
            "spate_sink_replica_breaker_open{shard=\"1\",replica=\"0\"}"
        )
        .as_deref(),
        Some("0")
    );
    assert_eq!(value(&text, "spate_ready").as_deref(), Some("1"));
    let readyz = get(port, "/readyz").map(|r| r.1).unwrap_or_default();
    assert!(readyz.starts_with("ready\n"), "{readyz}");
    // Issue 31: the body says what the consumer does.
    assert!(readyz.contains("assigned "), "{readyz}");
    let verbose = get(port, "/healthz?verbose")
        .map(|r| r.1)
        .unwrap_or_default();
    assert!(verbose.starts_with("ok\nreadiness: ready\n"), "{verbose}");
    assert!(verbose.contains(" partition(s)"), "{verbose}");
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
}
