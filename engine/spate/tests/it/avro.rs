//! Avro through a schema registry, end to end (issue 21): the real `spate`
//! binary, a real Kafka broker (`SPATE_KAFKA_BROKERS`, `ci/kafka.sh`), the
//! real ClickHouse (`SPATE_CLICKHOUSE_URL`, 18.16 in CI) and a registry:
//! `SPATE_REGISTRY_URL` (`ci/registry.sh`: the Confluent REST test fixture,
//! or a real registry) for the workload, and a fixture of the test's own
//! (`ci/registry_fixture.py`) where a test breaks the registry.
//!
//! - the sensor workload (docs: shared spec): 10,000 `SensorBatch` messages
//!   produced by `spate produce --sensor`, exploded into 1,000,000
//!   candidate rows, filtered (`unit != "drop"`, `value >= 0`), `region`
//!   defaulted; every kept row checked against the closed form computed
//!   here from the spec's formulas (count, loss and duplicates on
//!   `(batch_id, event_seq)`, sum of value, name_upper, the null pattern of
//!   quality, ...);
//! - schema evolution: writer schema v2 (adds `firmware` with a default)
//!   registered and produced mid-stream; both versions land;
//! - bad input: an unknown schema id and a truncated datum are skipped by
//!   policy and dead-lettered with reasons naming the schema id, every other
//!   row lands, the offsets commit past them;
//! - the registry down at start (`spate run` fails naming the URL) and
//!   mid-stream (a new schema id is retried, then dead-lettered by policy;
//!   after recovery new messages land; nothing is lost).
//!
//! Without Kafka or ClickHouse each test prints why it is skipped and
//! passes, except that `SPATE_KAFKA_REQUIRED=1` (ci/test.sh) makes a
//! missing broker a failure; `SPATE_REGISTRY_REQUIRED=1` makes a missing
//! `SPATE_REGISTRY_URL` one. The tests share the broker: one at a time.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::real::RealKafka;
use common::*;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
use spate_testkit::sensor::avro as sensor;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registry fixture of the test's own (`ci/registry_fixture.py` on a
/// free port), killed on drop.
struct OwnRegistry {
    child: Child,
    url: String,
}

impl OwnRegistry {
    fn start() -> OwnRegistry {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ci/registry_fixture.py");
        let mut child = Command::new("python3")
            .args([script, "--port", "0", "--exit-with-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs ci/registry_fixture.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("http://"), "fixture said {line:?}");
        OwnRegistry {
            child,
            url: line.trim().to_owned(),
        }
    }

    fn control(&self, what: &str) {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-f",
                "-X",
                "POST",
                &format!("{}/_fixture/{what}", self.url),
            ])
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "registry control {what}: {out:?}");
    }
}

impl Drop for OwnRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workload's registry: `SPATE_REGISTRY_URL`, else one of our own.
enum Registry {
    Shared(String),
    Own(OwnRegistry),
}

impl Registry {
    fn get() -> Registry {
        match std::env::var("SPATE_REGISTRY_URL") {
            Ok(u) if !u.trim().is_empty() => Registry::Shared(u.trim().to_owned()),
            _ => {
                assert!(
                    std::env::var("SPATE_REGISTRY_REQUIRED").as_deref() != Ok("1"),
                    "SPATE_REGISTRY_REQUIRED=1 but SPATE_REGISTRY_URL is not set: \
                     ci/registry.sh start did not run or failed"
                );
                println!("SPATE_REGISTRY_URL not set: starting ci/registry_fixture.py");
                Registry::Own(OwnRegistry::start())
            }
        }
    }

    fn url(&self) -> &str {
        match self {
            Registry::Shared(u) => u,
            Registry::Own(o) => &o.url,
        }
    }
}

/// Kafka, ClickHouse and the serial guard, or `None` after printing why.
fn components() -> Option<(RealKafka, String, std::sync::MutexGuard<'static, ()>)> {
    let kafka = RealKafka::from_env()?;
    let url = clickhouse_url()?;
    Some((kafka, url, serial()))
}

/// Replication factor for the test topics: up to 3, as many brokers as
/// there are.
fn rf(kafka: &RealKafka) -> i32 {
    (kafka.brokers.split(',').count() as i32).min(3)
}

/// A name unique to this test process.
fn unique(what: &str) -> String {
    format!("avro-{what}-{}", std::process::id())
}

/// The workload's table (`sensor::TABLE_DDL`, with `extra` columns) on the
/// one server; dropped on drop.
struct SensorTable {
    name: String,
    url: String,
    rt: tokio::runtime::Runtime,
    ch: HttpWriter,
}

impl SensorTable {
    fn create(url: &str, test: &str, extra: &str) -> SensorTable {
        let name = format!("spate_avro_{test}_{}", std::process::id());
        let t = SensorTable {
            name: name.clone(),
            url: url.to_owned(),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            ch: HttpWriter::new(HttpWriterConfig::new("default", &name, Vec::new())),
        };
        t.query(&format!("DROP TABLE IF EXISTS default.{name}"));
        let ddl = sensor::TABLE_DDL
            .replace(
                "CREATE TABLE sensor_events (",
                &format!("CREATE TABLE default.{name} ("),
            )
            .replace("ts UInt64,", &format!("ts UInt64,{extra}"));
        assert!(ddl.contains(&name), "{ddl}");
        t.query(&ddl);
        t
    }

    fn query(&self, sql: &str) -> String {
        self.rt
            .block_on(self.ch.query(&self.url, sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .trim()
            .to_owned()
    }

    /// One row of numbers, tab-separated, as text.
    fn row(&self, select: &str) -> Vec<String> {
        self.query(&format!("SELECT {select} FROM default.{}", self.name))
            .split('\t')
            .map(str::to_owned)
            .collect()
    }

    fn count(&self) -> u64 {
        self.row("count()")[0].parse().unwrap()
    }
}

impl Drop for SensorTable {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.ch.query(
            &self.url,
            &format!("DROP TABLE IF EXISTS default.{}", self.name),
        ));
    }
}

/// What the kept rows of messages `range` add up to, from the spec's
/// formulas (sensor::batch/event: the closed form of each field), with the
/// workload's filters applied here (`unit != "drop"`, `value >= 0`).
#[derive(Debug, Default, PartialEq)]
struct Expect {
    rows: u64,
    /// Sum of k = batch_id * 100 + event_seq, and of k * k (wrapping, as
    /// ClickHouse's UInt64 sum): with `rows` and the distinct count they
    /// pin the set of (batch_id, event_seq).
    sum_k: u64,
    sum_k2: u64,
    sum_value: f64,
    null_quality: u64,
    sum_quality: i64,
    unknown_region: u64,
    sum_name_upper_len: u64,
    sum_sensor_id: u64,
}

fn expect(range: std::ops::Range<u64>) -> Expect {
    let mut e = Expect::default();
    for i in range {
        let b = sensor::batch(i);
        for j in 0..sensor::EVENTS {
            let ev = sensor::event(i, j);
            if ev.unit == "drop" || ev.value < 0.0 {
                continue;
            }
            let k = b.batch_id as u64 * 100 + ev.event_seq as u64;
            e.rows += 1;
            e.sum_k = e.sum_k.wrapping_add(k);
            e.sum_k2 = e.sum_k2.wrapping_add(k.wrapping_mul(k));
            e.sum_value += ev.value;
            match ev.quality {
                None => e.null_quality += 1,
                Some(q) => e.sum_quality += i64::from(q),
            }
            if b.region.is_none() {
                e.unknown_region += 1;
            }
            e.sum_name_upper_len += ev.name.to_uppercase().len() as u64;
            e.sum_sensor_id += ev.sensor_id as u64;
        }
    }
    e
}

/// The same sums read from the table (rows with `batch_id` in `range`).
fn landed(t: &SensorTable, range: std::ops::Range<u64>) -> (Expect, u64) {
    let k = "(batch_id * 100 + event_seq)";
    let r = t.query(&format!(
        "SELECT count(), uniqExact(batch_id, event_seq), sum({k}), sum({k} * {k}), \
         sum(value), countIf(isNull(quality)), sum(ifNull(quality, 0)), \
         countIf(region = 'unknown'), sum(length(name_upper)), sum(sensor_id) \
         FROM default.{} WHERE batch_id >= {} AND batch_id < {}",
        t.name, range.start, range.end
    ));
    let f: Vec<&str> = r.split('\t').collect();
    assert_eq!(f.len(), 10, "{r}");
    (
        Expect {
            rows: f[0].parse().unwrap(),
            sum_k: f[2].parse().unwrap(),
            sum_k2: f[3].parse().unwrap(),
            sum_value: f[4].parse().unwrap(),
            null_quality: f[5].parse().unwrap(),
            sum_quality: f[6].parse().unwrap(),
            unknown_region: f[7].parse().unwrap(),
            sum_name_upper_len: f[8].parse().unwrap(),
            sum_sensor_id: f[9].parse().unwrap(),
        },
        f[1].parse().unwrap(),
    )
}

/// Rows whose columns disagree with their closed form, per column, as
/// (column, bad rows): each must be 0.
fn per_row_mismatches(t: &SensorTable) -> Vec<(String, u64)> {
    let k = "(batch_id * 100 + event_seq)";
    let checks = [
        (
            "source",
            "source != concat('gw-', toString(batch_id % 16))".to_owned(),
        ),
        (
            "region",
            "region != if(batch_id % 10 = 0, 'unknown', concat('eu-', toString(batch_id % 4)))"
                .to_owned(),
        ),
        (
            "produced_at",
            "produced_at != 1700000000000 + batch_id * 10".to_owned(),
        ),
        ("sensor_id", format!("sensor_id != {k} % 1024")),
        (
            "name",
            "name != concat('sensor-', toString(sensor_id))".to_owned(),
        ),
        (
            "name_upper",
            "name_upper != concat('SENSOR-', toString(sensor_id))".to_owned(),
        ),
        ("value", format!("value != ({k} % 4000) * 0.25 - 100.0")),
        ("value_scaled", "value_scaled != value * 10".to_owned()),
        (
            "quality",
            "if(event_seq % 5 = 0, isNotNull(quality), ifNull(quality, -1) != event_seq % 3)"
                .to_owned(),
        ),
        (
            "unit",
            format!("unit != arrayElement(['C', 'hPa', 'pct'], ({k} % 3) + 1)"),
        ),
        (
            "filter",
            format!("unit = 'drop' OR value < 0 OR {k} % 8 = 0"),
        ),
        ("ts", "ts != produced_at * 1000 + event_seq".to_owned()),
    ];
    let select: Vec<String> = checks
        .iter()
        .map(|(_, c)| format!("countIf({c})"))
        .collect();
    let r = t.row(&select.join(", "));
    checks
        .iter()
        .zip(r)
        .map(|((name, _), n)| ((*name).to_owned(), n.parse().unwrap()))
        .collect()
}

/// The workload's pipeline (explode, filters, defaults) reading `topic`
/// through `registry` into `table`; `defaults` adds entries to
/// `mapping.defaults`.
#[allow(clippy::too_many_arguments)] // one test config, every part named
fn avro_config(
    group: &str,
    brokers: &str,
    topic: &str,
    url: &str,
    table: &str,
    port: u16,
    registry: &str,
    on_error: &str,
    defaults: &str,
) -> String {
    format!(
        r#"
pipeline: {{ name: {group}, threads: 2 }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: [{topic}]
    group_id: "{group}"
    properties: {{ session.timeout.ms: "6000", heartbeat.interval.ms: "500" }}
format:
  avro:
    registry: {{ url: "{registry}", retry: {{ attempts: 3, backoff: 100ms, max_backoff: 200ms }} }}
mapping:
  explode: /events
  filter: [unit != "drop", value >= 0]
  defaults: {{ region: unknown{defaults} }}
on_error: {on_error}
sink:
  clickhouse:
    shards: [["{url}"]]
    table: {table}
    batch: {{ max_rows: 200000, max_bytes: 16MiB, linger: 100ms }}
shutdown: {{ drain_timeout: 10s }}
admin: {{ listen: "127.0.0.1:{port}" }}
"#
    )
}

/// `spate produce --sensor N --first F [--schema-version 2]` through the
/// binary; its stdout.
fn produce_sensor(
    brokers: &str,
    topic: &str,
    registry: &str,
    first: u64,
    n: u64,
    v2: bool,
) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spate"));
    cmd.args(["produce", "--brokers", brokers, "--topic", topic])
        .args(["--sensor", &n.to_string(), "--first", &first.to_string()])
        .args(["--registry", registry]);
    if v2 {
        cmd.args(["--schema-version", "2"]);
    }
    let out = cmd.output().expect("spawn spate produce");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "spate produce failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The schema id `spate produce` registered (from its first line).
fn registered_id(stdout: &str) -> u32 {
    stdout
        .lines()
        .find_map(|l| {
            l.split_once("schema id ")
                .map(|(_, id)| id.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no schema id in {stdout}"))
}

/// Waits until the committed offsets of `group` reach the log end.
fn await_end(
    kafka: &RealKafka,
    spate: &Spate,
    group: &str,
    topic: &str,
    partitions: i32,
    within: Duration,
) {
    let ends = kafka.ends(topic, partitions);
    let deadline = Instant::now() + within;
    loop {
        let committed = kafka.committed(group, topic, partitions);
        if ends
            .iter()
            .all(|(p, e)| committed.get(p).and_then(|c| c.0) == Some(*e))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not committed to {ends:?} within {within:?}: {committed:?}\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The broker kept every message (low watermark 0), so a count below the
/// expectation is spate's loss, not retention.
fn assert_nothing_deleted(kafka: &RealKafka, topic: &str, partitions: i32) {
    for (p, (low, _)) in kafka.watermarks(topic, partitions) {
        assert_eq!(low, 0, "{topic}/{p}: the broker deleted data");
    }
}

/// The sensor workload: 10,000 messages -> 1,000,000 candidate rows; every
/// kept row lands once, as the closed form says.
#[test]
fn sensor_workload_lands_exactly_as_the_closed_form_says() {
    let Some((kafka, url, _serial)) = components() else {
        return;
    };
    let registry = Registry::get();
    let topic = unique("sensor");
    let partitions = 8;
    kafka.create_topic(&topic, partitions, rf(&kafka), &[]);
    let table = SensorTable::create(&url, "sensor", "");
    const N: u64 = 10_000;
    let out = produce_sensor(&kafka.brokers, &topic, registry.url(), 0, N, false);
    assert!(out.contains("1000000 candidate rows"), "{out}");
    let port = free_port();
    let yaml = avro_config(
        &topic,
        &kafka.brokers,
        &topic,
        &url,
        &table.name,
        port,
        registry.url(),
        "{ policy: fail }",
        "",
    );
    let started = Instant::now();
    let spate = Spate::start("avro-sensor", &yaml);
    await_end(
        &kafka,
        &spate,
        &topic,
        &topic,
        partitions,
        Duration::from_secs(240),
    );
    println!(
        "10,000 messages committed after {:?} (debug build)",
        started.elapsed()
    );
    let filtered = metric(port, "spate_records_filtered_total");
    let (code, summary) = spate.terminate();
    assert_eq!(code, Some(0), "{summary}");
    assert_nothing_deleted(&kafka, &topic, partitions);

    let want = expect(0..N);
    let (got, distinct) = landed(&table, 0..N);
    println!("expected {want:?}\nlanded   {got:?} (distinct {distinct})");
    assert_eq!(distinct, want.rows, "lost or extra (batch_id, event_seq)");
    assert_eq!(got, want);
    assert_eq!(table.count(), want.rows, "duplicates");
    for (column, bad) in per_row_mismatches(&table) {
        assert_eq!(bad, 0, "{bad} row(s) with a wrong {column}");
    }
    assert_eq!(
        filtered as u64,
        N * sensor::EVENTS - want.rows,
        "spate_records_filtered_total"
    );
    assert!(summary.contains("skipped=0"), "{summary}");
}

/// Writer schema v2 (adds `firmware`, default "unknown") registered and
/// produced while spate runs: v1 rows get the configured default, v2 rows
/// their value; both versions land.
#[test]
fn schema_evolution_mid_stream_lands_both_versions() {
    let Some((kafka, url, _serial)) = components() else {
        return;
    };
    let registry = Registry::get();
    let topic = unique("evolve");
    let partitions = 4;
    kafka.create_topic(&topic, partitions, rf(&kafka), &[]);
    let table = SensorTable::create(&url, "evolve", " firmware String,");
    let v1 = registered_id(&produce_sensor(
        &kafka.brokers,
        &topic,
        registry.url(),
        0,
        300,
        false,
    ));
    let port = free_port();
    let yaml = avro_config(
        &topic,
        &kafka.brokers,
        &topic,
        &url,
        &table.name,
        port,
        registry.url(),
        "{ policy: fail }",
        ", firmware: unknown",
    );
    let spate = Spate::start("avro-evolve", &yaml);
    await_end(&kafka, &spate, &topic, &topic, partitions, DELIVERY);
    assert_eq!(
        landed(&table, 0..300).0,
        expect(0..300),
        "v1 before the switch"
    );
    let v2 = registered_id(&produce_sensor(
        &kafka.brokers,
        &topic,
        registry.url(),
        300,
        300,
        true,
    ));
    assert_ne!(v1, v2, "v2 is a new writer schema");
    await_end(&kafka, &spate, &topic, &topic, partitions, DELIVERY);
    let (code, summary) = spate.terminate();
    assert_eq!(code, Some(0), "{summary}");

    assert_eq!(landed(&table, 0..600).0, expect(0..600));
    let r = table.row(
        "countIf(batch_id < 300 AND firmware != 'unknown'), \
         countIf(batch_id >= 300 AND firmware != concat('fw-', toString(batch_id % 3))), \
         countIf(batch_id >= 300)",
    );
    assert_eq!(r[0], "0", "v1 rows take the default");
    assert_eq!(r[1], "0", "v2 rows carry their firmware");
    assert_eq!(r[2].parse::<u64>().unwrap(), expect(300..600).rows);
    for (column, bad) in per_row_mismatches(&table) {
        assert_eq!(bad, 0, "{bad} row(s) with a wrong {column}");
    }
}

/// An unknown schema id and a truncated datum: skipped by policy, each
/// dead-lettered with a reason naming the schema id; the log names topic,
/// partition and offset; every other row lands; the offsets commit past
/// them (nothing silently lost: landed + dead-lettered = produced).
#[test]
fn bad_messages_are_dead_lettered_naming_the_schema_id() {
    let Some((kafka, url, _serial)) = components() else {
        return;
    };
    let registry = Registry::get();
    let topic = unique("bad");
    let dlq = unique("bad-dlq");
    kafka.create_topic(&topic, 1, rf(&kafka), &[]);
    kafka.create_topic(&dlq, 1, rf(&kafka), &[]);
    let table = SensorTable::create(&url, "bad", "");
    let id = registered_id(&produce_sensor(
        &kafka.brokers,
        &topic,
        registry.url(),
        0,
        50,
        false,
    ));
    // Offset 50: an id the registry never gave; 51: message 50 cut short.
    let unknown_id = 900_000 + std::process::id() % 1000;
    let mut unknown = Vec::new();
    sensor::message(50, unknown_id, &mut unknown);
    let mut truncated = Vec::new();
    sensor::message(50, id, &mut truncated);
    truncated.truncate(truncated.len() / 2);
    spate::kafka_tools::produce_indexed(
        &kafka.brokers,
        &topic,
        1,
        [(50u64, unknown.clone()), (51, truncated.clone())],
        "bad",
        RPC,
        |_| {},
    )
    .unwrap();
    produce_sensor(&kafka.brokers, &topic, registry.url(), 51, 49, false);
    let port = free_port();
    let on_error = format!("{{ policy: skip, dead_letter: {{ topic: {dlq} }} }}");
    let yaml = avro_config(
        &topic,
        &kafka.brokers,
        &topic,
        &url,
        &table.name,
        port,
        registry.url(),
        &on_error,
        "",
    );
    let spate = Spate::start("avro-bad", &yaml);
    await_end(&kafka, &spate, &topic, &topic, 1, DELIVERY);
    let logs = spate.logs();
    let (code, summary) = spate.terminate();
    assert_eq!(code, Some(0), "{summary}");
    assert!(summary.contains("skipped=2"), "{summary}");

    // The good messages: 0..50 and 51..100 (message 50 was only bad).
    let mut want = expect(0..50);
    let rest = expect(51..100);
    want.rows += rest.rows;
    assert_eq!(landed(&table, 0..100).0.rows, want.rows);
    assert_eq!(
        landed(&table, 50..51).0.rows,
        0,
        "nothing of the bad messages"
    );
    let dead = kafka.read_partition(&dlq, 0);
    assert_eq!(dead.len(), 2, "dead letters: {dead:?}");
    let reason = |m: &common::real::Consumed| {
        m.2.iter()
            .find(|(k, _)| k == "spate.reason")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let offset = |m: &common::real::Consumed| {
        m.2.iter()
            .find(|(k, _)| k == "spate.offset")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(dead[0].1, unknown, "the original bytes");
    assert_eq!(offset(&dead[0]), "50");
    assert!(
        reason(&dead[0]).contains(&format!("schema id {unknown_id}")),
        "{}",
        reason(&dead[0])
    );
    assert_eq!(dead[1].1, truncated);
    assert_eq!(offset(&dead[1]), "51");
    assert!(
        reason(&dead[1]).contains(&format!("schema id {id}")),
        "{}",
        reason(&dead[1])
    );
    // The log names topic/partition and offset with the reason.
    for (off, sid) in [(50, unknown_id), (51, id)] {
        assert!(
            logs.lines().any(|l| l.contains(&format!("{topic}/0"))
                && l.contains(&format!("offset={off}"))
                && l.contains(&format!("schema id {sid}"))),
            "no skip line for offset {off}:\n{logs}"
        );
    }
}

/// A registry that does not answer at start: `spate run` exits 3 (failed) with an
/// error naming the URL and the key, after the configured retries, and
/// `spate check` reports it as the registry's problem.
#[test]
fn registry_down_at_start_fails_naming_the_url() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let _serial = serial();
    let table = SensorTable::create(&url, "down", "");
    // A port nothing listens on (free_port binds and releases it).
    let dead = format!("http://127.0.0.1:{}", free_port());
    let yaml = avro_config(
        "avro-down",
        "127.0.0.1:1",
        "avro-down",
        &url,
        &table.name,
        free_port(),
        &dead,
        "{ policy: fail }",
        "",
    );
    let started = Instant::now();
    let mut spate = Spate::start("avro-down", &yaml);
    let (code, out) = spate.wait_exit(Duration::from_secs(60));
    let logs = spate.logs();
    assert_eq!(code, Some(3), "exit 3 (failed): {out}\n{logs}");
    for want in [dead.as_str(), "format.avro.registry", "after 3 attempt(s)"] {
        assert!(
            logs.contains(want) && out.contains(want),
            "{want}: {out}\n{logs}"
        );
    }
    println!("failed after {:?}: {out}", started.elapsed());

    let config = std::env::temp_dir().join(format!("spate-avro-down-{}.yaml", std::process::id()));
    std::fs::write(&config, &yaml).unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!(
            "registry: PROBLEM: format.avro.registry: schema registry {dead} unavailable"
        )),
        "{text}"
    );
}

/// The registry fails (HTTP 503) while spate runs: messages under a schema
/// id spate already planned keep landing; those under a new id are retried
/// (3 attempts), then skipped by policy into the dead-letter topic naming
/// the id; after the registry recovers, new messages under that id land.
/// Every produced message is either in the table or dead-lettered.
#[test]
fn registry_down_mid_stream_retries_then_applies_the_policy() {
    let Some((kafka, url, _serial)) = components() else {
        return;
    };
    let registry = OwnRegistry::start();
    let topic = unique("outage");
    let dlq = unique("outage-dlq");
    kafka.create_topic(&topic, 1, rf(&kafka), &[]);
    kafka.create_topic(&dlq, 1, rf(&kafka), &[]);
    let table = SensorTable::create(&url, "outage", " firmware String DEFAULT 'none',");
    let v1 = registered_id(&produce_sensor(
        &kafka.brokers,
        &topic,
        &registry.url,
        0,
        100,
        false,
    ));
    let port = free_port();
    let on_error = format!("{{ policy: skip, dead_letter: {{ topic: {dlq} }} }}");
    let yaml = avro_config(
        &topic,
        &kafka.brokers,
        &topic,
        &url,
        &table.name,
        port,
        &registry.url,
        &on_error,
        ", firmware: unknown",
    );
    let spate = Spate::start("avro-outage", &yaml);
    await_end(&kafka, &spate, &topic, &topic, 1, DELIVERY);
    // v2 registered (spate has not seen its id), then the registry fails.
    let client = spate_formats::registry::RegistryClient::new(
        spate_formats::registry::RegistryConfig::new(&registry.url),
    )
    .unwrap();
    let v2 = client
        .register(
            &format!("{topic}-value"),
            spate_formats::registry::SchemaType::Avro,
            sensor::SCHEMA_V2,
            &[],
        )
        .unwrap();
    assert_ne!(v1, v2);
    registry.control("fail?status=503");
    let mut items = Vec::new();
    for i in 100..103 {
        let mut m = Vec::new();
        sensor::message_v2(i, v2, &mut m);
        items.push((i, m));
    }
    for i in 103..106 {
        let mut m = Vec::new();
        sensor::message(i, v1, &mut m);
        items.push((i, m));
    }
    spate::kafka_tools::produce_indexed(&kafka.brokers, &topic, 1, items, "o", RPC, |_| {})
        .unwrap();
    await_end(&kafka, &spate, &topic, &topic, 1, DELIVERY);
    // Back: new v2 messages land.
    registry.control("recover");
    let mut items = Vec::new();
    for i in 106..110 {
        let mut m = Vec::new();
        sensor::message_v2(i, v2, &mut m);
        items.push((i, m));
    }
    spate::kafka_tools::produce_indexed(&kafka.brokers, &topic, 1, items, "r", RPC, |_| {})
        .unwrap();
    await_end(&kafka, &spate, &topic, &topic, 1, DELIVERY);
    let logs = spate.logs();
    let (code, summary) = spate.terminate();
    assert_eq!(code, Some(0), "{summary}");
    assert!(summary.contains("skipped=3"), "{summary}");

    let dead = kafka.read_partition(&dlq, 0);
    assert_eq!(dead.len(), 3, "{dead:?}");
    for (n, m) in dead.iter().enumerate() {
        assert_eq!(
            m.2.iter()
                .find(|(k, _)| k == "spate.offset")
                .map(|(_, v)| v.as_str()),
            Some((100 + n).to_string().as_str())
        );
        let why =
            m.2.iter()
                .find(|(k, _)| k == "spate.reason")
                .map(|(_, v)| v.as_str())
                .unwrap();
        assert!(
            why.contains(&format!("schema id {v2}")) && why.contains("unavailable"),
            "{why}"
        );
        assert!(
            why.contains(&registry.url) && why.contains("HTTP 503"),
            "{why}"
        );
    }
    assert!(
        logs.contains("schema registry request failed"),
        "retries logged:\n{logs}"
    );
    // Landed: 0..100 and 103..106 (v1), 106..110 (v2); not 100..103.
    let mut want = expect(0..100);
    for r in [103..106, 106..110] {
        want.rows += expect(r).rows;
    }
    assert_eq!(table.count(), want.rows);
    assert_eq!(landed(&table, 100..103).0.rows, 0);
    let r = table.row("countIf(batch_id >= 106 AND firmware != concat('fw-', toString(batch_id % 3))), countIf(batch_id < 106 AND firmware != 'unknown')");
    assert_eq!(r, vec!["0".to_owned(), "0".to_owned()]);
}

/// `format.protobuf` through the registry, end to end: the workload's flat
/// `SensorEventRow` (`spate_testkit::sensor::protobuf`, one row per
/// message) registered as PROTOBUF, Confluent-framed (message index [0]),
/// the same filters and default: every kept row lands as the closed form
/// says.
#[test]
fn protobuf_through_the_registry_lands_exactly() {
    use spate_formats::registry::{RegistryClient, RegistryConfig, SchemaType};
    use spate_testkit::sensor::protobuf as proto_sensor;
    let Some((kafka, url, _serial)) = components() else {
        return;
    };
    let registry = Registry::get();
    let topic = unique("proto");
    let partitions = 2;
    kafka.create_topic(&topic, partitions, rf(&kafka), &[]);
    let table = SensorTable::create(&url, "proto", "");
    let client = RegistryClient::new(RegistryConfig::new(registry.url())).unwrap();
    let id = client
        .register(
            &format!("{topic}-value"),
            SchemaType::Protobuf,
            proto_sensor::SENSOR_PROTO,
            &[],
        )
        .unwrap();
    const BATCHES: u64 = 20;
    let mut scratch = Vec::new();
    let items: Vec<(u64, Vec<u8>)> = (0..BATCHES)
        .flat_map(|i| (0..sensor::EVENTS).map(move |j| (i, j)))
        .map(|(i, j)| {
            // Confluent framing: magic 0, the id (big-endian u32), the
            // message indexes ([0] written as one 0 byte), the message.
            let mut m = vec![0u8];
            m.extend_from_slice(&id.to_be_bytes());
            m.push(0);
            proto_sensor::sensor_row(i, j, &mut m, &mut scratch);
            (i * sensor::EVENTS + j, m)
        })
        .collect();
    spate::kafka_tools::produce_indexed(
        &kafka.brokers,
        &topic,
        partitions,
        items,
        "p",
        RPC,
        |_| {},
    )
    .unwrap();
    let port = free_port();
    let yaml = avro_config(
        &topic,
        &kafka.brokers,
        &topic,
        &url,
        &table.name,
        port,
        registry.url(),
        "{ policy: fail }",
        "",
    )
    .replace("format:\n  avro:", "format:\n  protobuf:")
    .replace("  explode: /events\n", "");
    let spate = Spate::start("proto", &yaml);
    await_end(&kafka, &spate, &topic, &topic, partitions, DELIVERY);
    let (code, summary) = spate.terminate();
    assert_eq!(code, Some(0), "{summary}");
    let want = expect(0..BATCHES);
    let (got, distinct) = landed(&table, 0..BATCHES);
    println!("expected {want:?}\nlanded   {got:?}");
    assert!(want.rows > 0);
    assert_eq!(distinct, want.rows);
    assert_eq!(got, want);
    for (column, bad) in per_row_mismatches(&table) {
        assert_eq!(bad, 0, "{bad} row(s) with a wrong {column}");
    }
}
