//! Several pipelines in one `spate run` (the `pipelines:` form, issue 17
//! part 1) and topic-to-table routing inside one (`tables:`, part 2, the
//! last test): the real binary, an embedded Kafka broker (librdkafka's mock
//! cluster) with one topic per pipeline, and the real ClickHouse at
//! `SPATE_CLICKHOUSE_URL` (ci/test.sh starts one; without it the test
//! prints `skipped: ...` and passes).
//!
//! Properties checked: three topics land in three tables of different
//! schemas, each row in its own table with its own values; every `spate_`
//! series on `/metrics` carries a `pipeline` label, with each pipeline's
//! rows counted under its own; when one table is dropped while running,
//! that pipeline stops committing at the failed rows (D1) and `/readyz`
//! names it, while the other two keep landing and committing; SIGTERM
//! drains the two healthy ones to their ends and the exit status is the
//! worst of the three (3). With `fail_process: true` on the failing one,
//! its failure stops the whole process by itself. A pipeline that cannot
//! start is reported while the others run (or, with `fail_process`, stops
//! the process before any runs); `spate check` shows every pipeline's
//! mapping.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use spate::kafka_tools;

/// Rows per topic and phase.
const ROWS: u64 = 1_500;
/// Rows of the routing test's `events.b` its table's `mapping.filter`
/// drops (ids below it).
const FILTERED: u64 = 100;
/// Partitions per topic.
const PARTITIONS: i32 = 4;

/// One pipeline of the test: its topic, group, table and row shape.
struct Lane {
    name: &'static str,
    topic: String,
    group: String,
    table: String,
    /// The table's columns (after `id`), for CREATE TABLE.
    columns: &'static str,
    /// Message `id` of this topic.
    row: fn(u64) -> String,
}

fn row_a(id: u64) -> String {
    format!(r#"{{"id":{id},"city":"a-{id}"}}"#)
}

fn row_b(id: u64) -> String {
    format!(r#"{{"id":{id},"score":{}.5,"ok":{}}}"#, id * 2, id % 2)
}

fn row_c(id: u64) -> String {
    format!(r#"{{"id":{id},"tags":["c","{id}"]}}"#)
}

fn lanes(test: &str) -> Vec<Lane> {
    let pid = std::process::id();
    let lane = |name, columns, row| Lane {
        name,
        topic: format!("{test}-{name}"),
        group: format!("spate-{test}-{name}-{pid}"),
        table: format!("spate_multi_{test}_{name}_{pid}"),
        columns,
        row,
    };
    vec![
        lane("a", "city String", row_a as fn(u64) -> String),
        lane("b", "score Float64, ok UInt8", row_b),
        lane("c", "tags Array(String)", row_c),
    ]
}

/// The tables, dropped on drop.
struct Tables {
    url: String,
    names: Vec<String>,
    ch: Table,
}

impl Tables {
    fn create(url: &str, lanes: &[Lane]) -> Tables {
        // A flight table only to borrow its client; the lanes' own tables
        // follow.
        let ch = Table::create(
            url,
            &format!("multi_client_{}", lanes[0].topic.replace('-', "_")),
        );
        for l in lanes {
            ch.query(&format!("DROP TABLE IF EXISTS default.{}", l.table));
            ch.query(&format!(
                "CREATE TABLE default.{} (id UInt64, {}) ENGINE = MergeTree ORDER BY id",
                l.table, l.columns
            ));
        }
        Tables {
            url: url.to_owned(),
            names: lanes.iter().map(|l| l.table.clone()).collect(),
            ch,
        }
    }

    fn query(&self, sql: &str) -> String {
        self.ch.query_at(&self.url, sql)
    }

    fn number(&self, sql: &str) -> u64 {
        self.query(sql).parse().unwrap()
    }
}

impl Drop for Tables {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Keep the tables to look at; a panic in a drop would abort.
            return;
        }
        for t in &self.names {
            self.ch
                .query_at(&self.url, &format!("DROP TABLE IF EXISTS default.{t}"));
        }
    }
}

/// The multi-pipeline config: shared brokers, shards, commit interval and
/// drain at the top level; one small entry per lane.
fn config(brokers: &str, url: &str, port: u16, lanes: &[Lane], fail_process: &str) -> String {
    let mut yaml = format!(
        r#"
admin: {{ listen: "127.0.0.1:{port}" }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    # statistics.interval.ms: the lag gauge is registered in librdkafka's
    # statistics callback; it must carry the label too.
    properties: {{ session.timeout.ms: "6000", heartbeat.interval.ms: "500", statistics.interval.ms: "200" }}
sink:
  clickhouse:
    shards: [["{url}"]]
    batch: {{ max_rows: 100000, linger: 100ms }}
    retry: {{ initial: 50ms, max: 200ms, max_attempts: 3 }}
shutdown: {{ drain_timeout: 10s }}
pipelines:
"#
    );
    for l in lanes {
        let extra = if l.name == "c" { fail_process } else { "" };
        yaml.push_str(&format!(
            "  - {{ pipeline: {{ name: {} }}, source: {{ kafka: {{ topics: [{}], group_id: \"{}\" }} }}, \
             sink: {{ clickhouse: {{ table: {} }} }}{extra} }}\n",
            l.name, l.topic, l.group, l.table
        ));
    }
    yaml
}

fn produce_phase(brokers: &str, lanes: &[Lane], ids: std::ops::Range<u64>) {
    for l in lanes {
        let lines: Vec<String> = ids.clone().map(l.row).collect();
        produce(brokers, &l.topic, PARTITIONS, &lines);
    }
}

fn ends(brokers: &str, topic: &str) -> std::collections::BTreeMap<i32, i64> {
    kafka_tools::end_offsets(brokers, topic, PARTITIONS, RPC).unwrap()
}

/// Whether `lane`'s group has committed every partition's end.
fn at_end(brokers: &str, lane: &Lane) -> bool {
    let ends = ends(brokers, &lane.topic);
    let c = committed(brokers, &lane.group, &lane.topic, PARTITIONS);
    ends.iter().all(|(p, e)| c.get(p) == Some(&Some(*e)))
}

fn await_until(spate: &Spate, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DELIVERY;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {DELIVERY:?}\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every row of `lane`'s table is one of its topic's rows, and every id
/// in `ids` is there: nothing lost, nothing from another topic.
fn assert_landed(t: &Tables, lane: &Lane, ids: std::ops::Range<u64>) {
    let table = &lane.table;
    let distinct = t.number(&format!("SELECT uniqExact(id) FROM default.{table}"));
    assert_eq!(distinct, ids.end - ids.start, "{table}: distinct ids");
    let (lo, hi) = (ids.start, ids.end - 1);
    let range = t.number(&format!(
        "SELECT count() FROM default.{table} WHERE id < {lo} OR id > {hi}"
    ));
    assert_eq!(range, 0, "{table}: ids outside {ids:?}");
    // The values are this topic's own (each schema's columns checked).
    let wrong = match lane.name {
        "a" => t.number(&format!(
            "SELECT count() FROM default.{table} WHERE city != concat('a-', toString(id))"
        )),
        "b" => t.number(&format!(
            "SELECT count() FROM default.{table} WHERE score != id * 2 + 0.5 OR ok != id % 2"
        )),
        _ => t.number(&format!(
            "SELECT count() FROM default.{table} WHERE tags != ['c', toString(id)]"
        )),
    };
    assert_eq!(wrong, 0, "{table}: rows with another row's values");
}

#[test]
fn three_pipelines_land_apart_one_failing_leaves_the_others_and_sigterm_drains_all() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let lanes = lanes("three");
    let mock = kafka_tools::start_broker(&lanes[0].topic, PARTITIONS).unwrap();
    for l in &lanes[1..] {
        mock.create_topic(&l.topic, PARTITIONS, 1).unwrap();
    }
    let brokers = mock.bootstrap_servers();
    let tables = Tables::create(&url, &lanes);
    produce_phase(&brokers, &lanes, 0..ROWS);
    let port = free_port();
    let mut spate = Spate::start("multi-three", &config(&brokers, &url, port, &lanes, ""));

    // Phase 1: all three land and commit; /readyz is 200 (all ready).
    await_until(&spate, "phase 1 commits", || {
        lanes.iter().all(|l| at_end(&brokers, l))
    });
    await_readyz(&spate, port, 200, DELIVERY);
    for l in &lanes {
        assert_landed(&tables, l, 0..ROWS);
    }

    // Every spate_ series carries a pipeline label; each pipeline's rows
    // are counted under its own.
    let (_, text) = get(port, "/metrics").expect("/metrics");
    // spate_build_info is the process's own series (no pipeline label).
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("spate_") && !l.starts_with("spate_build_info"))
        .collect();
    assert!(series.len() > 10, "few series: {text}");
    assert!(
        series.iter().any(|s| s.starts_with("spate_consumer_lag{")),
        "no lag gauge: {text}"
    );
    let unlabelled: Vec<&&str> = series
        .iter()
        .filter(|l| !l.contains("pipeline=\""))
        .collect();
    assert!(
        unlabelled.is_empty(),
        "series without a pipeline label: {unlabelled:?}"
    );
    for l in &lanes {
        let rows: f64 = series
            .iter()
            .filter(|s| s.starts_with("spate_sink_rows_written_total{"))
            .filter(|s| s.contains(&format!("pipeline=\"{}\"", l.name)))
            .filter_map(|s| s.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        assert!(
            rows >= ROWS as f64,
            "pipeline {}: rows_written {rows}\n{text}",
            l.name
        );
    }

    // Phase 2: pipeline c's table is dropped while it runs; a and b keep
    // landing and committing, c never commits past its first phase (D1).
    let c_ends = ends(&brokers, &lanes[2].topic);
    tables.query(&format!("DROP TABLE default.{}", lanes[2].table));
    produce_phase(&brokers, &lanes, ROWS..2 * ROWS);
    await_until(&spate, "phase 2 commits of a and b", || {
        lanes[..2].iter().all(|l| at_end(&brokers, l))
    });
    for l in &lanes[..2] {
        assert_landed(&tables, l, 0..2 * ROWS);
    }
    await_until(&spate, "/readyz naming pipeline c", || {
        get(port, "/readyz").is_some_and(|(s, body)| {
            let why = body.lines().next().unwrap_or("");
            s == 503 && why.contains("pipeline c") && !why.contains("pipeline a")
        })
    });
    let c = &lanes[2];
    let c_committed = committed(&brokers, &c.group, &c.topic, PARTITIONS);
    for (p, e) in &c_ends {
        let at = c_committed[p].unwrap_or(0);
        assert!(
            at <= *e,
            "pipeline c committed {at} past its failed rows at {e} (partition {p})"
        );
    }

    // Phase 3: a and b still take new rows after c's failure.
    produce_phase(&brokers, &lanes[..2], 2 * ROWS..3 * ROWS);
    await_until(&spate, "phase 3 commits of a and b", || {
        lanes[..2].iter().all(|l| at_end(&brokers, l))
    });

    // SIGTERM drains everything; the exit status is the worst (c: 3).
    let logs = spate.logs();
    spate.signal("-TERM");
    let (code, out) = spate.wait_exit(EXIT);
    println!("{out}");
    assert_eq!(code, Some(3), "stdout: {out}\nlog: {logs}");
    assert!(out.contains("pipeline=a status=Clean"), "{out}");
    assert!(out.contains("pipeline=b status=Clean"), "{out}");
    assert!(out.contains("pipeline=c status=Failed"), "{out}");
    assert!(
        out.contains("status=Failed (the worst of 3 pipelines)"),
        "{out}"
    );
    for l in &lanes[..2] {
        assert_landed(&tables, l, 0..3 * ROWS);
        assert!(at_end(&brokers, l), "pipeline {} not drained", l.name);
    }
}

/// `fail_process: true`: the failing pipeline stops the others (no signal
/// sent), each drained, exit 3.
#[test]
fn a_fail_process_pipeline_stops_the_others_when_it_fails() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let lanes = lanes("failp");
    let mock = kafka_tools::start_broker(&lanes[0].topic, PARTITIONS).unwrap();
    for l in &lanes[1..] {
        mock.create_topic(&l.topic, PARTITIONS, 1).unwrap();
    }
    let brokers = mock.bootstrap_servers();
    let tables = Tables::create(&url, &lanes);
    produce_phase(&brokers, &lanes, 0..ROWS);
    let port = free_port();
    let yaml = config(&brokers, &url, port, &lanes, ", fail_process: true");
    let mut spate = Spate::start("multi-failp", &yaml);
    await_until(&spate, "commits", || {
        lanes.iter().all(|l| at_end(&brokers, l))
    });
    tables.query(&format!("DROP TABLE default.{}", lanes[2].table));
    produce_phase(&brokers, &lanes[2..], ROWS..2 * ROWS);
    let (code, out) = spate.wait_exit(DELIVERY);
    let logs = spate.logs();
    assert_eq!(code, Some(3), "stdout: {out}\nlog: {logs}");
    assert!(
        logs.contains("fail_process: true: shutting every pipeline down"),
        "{logs}"
    );
    assert!(out.contains("pipeline=a status=Clean"), "{out}");
    assert!(out.contains("pipeline=b status=Clean"), "{out}");
    assert!(out.contains("pipeline=c status=Failed"), "{out}");
}

/// `spate check` on the `pipelines:` form checks every pipeline and prints
/// each one's header and column mapping (each table's own columns); a
/// pipeline whose table is missing is a problem (exit 3) and the others
/// are still checked.
#[test]
fn check_shows_every_pipelines_mapping() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let lanes = lanes("check");
    let mock = kafka_tools::start_broker(&lanes[0].topic, PARTITIONS).unwrap();
    for l in &lanes[1..] {
        mock.create_topic(&l.topic, PARTITIONS, 1).unwrap();
    }
    let brokers = mock.bootstrap_servers();
    let tables = Tables::create(&url, &lanes);
    let yaml = config(&brokers, &url, free_port(), &lanes, "");
    let path = std::env::temp_dir().join(format!("spate-multi-check-{}.yaml", std::process::id()));
    std::fs::write(&path, &yaml).unwrap();
    let check = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["check", "-c"])
            .arg(&path)
            .output()
            .expect("spawn spate check");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = check();
    assert_eq!(code, Some(0), "{out}");
    for (l, column) in lanes.iter().zip(["city", "score", "tags"]) {
        let header = format!(
            "== pipeline {} (topics {}, group {}, table default.{}) ==",
            l.name, l.topic, l.group, l.table
        );
        let at = out
            .find(&header)
            .unwrap_or_else(|| panic!("no `{header}` in\n{out}"));
        let rest = &out[at..];
        let mapping = format!("column mapping into default.{}:", l.table);
        assert!(rest.contains(&mapping), "{out}");
        // This table's own column, before the next pipeline's header.
        let own = rest[header.len()..].split("== pipeline").next().unwrap();
        assert!(
            own.contains(column),
            "pipeline {}: no column {column} in\n{own}",
            l.name
        );
    }
    tables.query(&format!("DROP TABLE default.{}", lanes[1].table));
    let (code, out) = check();
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("check: 1 problem(s)"), "{out}");
    assert!(
        out.contains(&format!("column mapping into default.{}:", lanes[2].table)),
        "{out}"
    );
}

/// A pipeline that cannot start (its table is missing) is reported and the
/// others run (`/readyz` names it, exit 3 at SIGTERM); with `fail_process:
/// true` the process stops before any pipeline runs.
#[test]
fn a_pipeline_that_cannot_start_is_reported_and_the_others_run() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let lanes = lanes("nostart");
    let mock = kafka_tools::start_broker(&lanes[0].topic, PARTITIONS).unwrap();
    for l in &lanes[1..] {
        mock.create_topic(&l.topic, PARTITIONS, 1).unwrap();
    }
    let brokers = mock.bootstrap_servers();
    let tables = Tables::create(&url, &lanes);
    tables.query(&format!("DROP TABLE default.{}", lanes[2].table));
    produce_phase(&brokers, &lanes[..2], 0..ROWS);

    let port = free_port();
    let yaml = config(&brokers, &url, port, &lanes, ", fail_process: true");
    let mut spate = Spate::start("multi-nostart-fail", &yaml);
    let (code, out) = spate.wait_exit(EXIT);
    assert_eq!(code, Some(3), "stdout: {out}\nlog: {}", spate.logs());
    assert!(
        out.contains(
            "status=Failed polled=0 error: pipeline c (fail_process: true) could not start"
        ),
        "{out}"
    );
    for l in &lanes[..2] {
        let c = committed(&brokers, &l.group, &l.topic, PARTITIONS);
        assert!(
            c.values().all(Option::is_none),
            "pipeline {} ran: {c:?}",
            l.name
        );
    }

    let port = free_port();
    let mut spate = Spate::start("multi-nostart", &config(&brokers, &url, port, &lanes, ""));
    await_until(&spate, "commits of a and b", || {
        lanes[..2].iter().all(|l| at_end(&brokers, l))
    });
    for l in &lanes[..2] {
        assert_landed(&tables, l, 0..ROWS);
    }
    let (status, body) = get(port, "/readyz").expect("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready: pipeline c: could not start: ")
            && !body.lines().next().unwrap_or("").contains("; "),
        "{body}"
    );
    // The gauge alerts and the dashboard read agrees: c is not ready.
    let (_, metrics) = get(port, "/metrics").expect("/metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with("spate_ready{")
            && l.contains(r#"pipeline="c""#)
            && l.ends_with(" 0")),
        "spate_ready of the pipeline that could not start must read 0: {metrics}"
    );
    spate.signal("-TERM");
    let (code, out) = spate.wait_exit(EXIT);
    assert_eq!(code, Some(3), "stdout: {out}\nlog: {}", spate.logs());
    assert!(out.contains("pipeline=a status=Clean"), "{out}");
    assert!(
        out.contains("pipeline=c status=Failed polled=0 error:"),
        "{out}"
    );
}

/// Routing inside one pipeline (`tables:`, issue 17 part 2): one consumer
/// subscribed to `^events\..*` routes `events.a` and `events.b` by regex
/// into two tables of different schemas. Every row carries the topic and
/// offset it came from, and every row of each table is checked: its origin
/// is that table's topic (rows never cross), all ids land, and the values
/// are its topic's; table b's own `mapping.filter` drops its rows below
/// id 100 while table a keeps all. A third topic matching no entry is a
/// record error:
/// under `skip` each of its records is dead-lettered with the reason and
/// counted, none lands anywhere. `spate check` shows both tables'
/// mappings; every series has the pipeline label.
#[test]
fn routing_by_regex_lands_each_topic_in_its_table_and_rows_never_cross() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let pid = std::process::id();
    let (ta, tb) = (
        format!("spate_route_a_{pid}"),
        format!("spate_route_b_{pid}"),
    );
    let (topic_a, topic_b, topic_c) = (
        format!("events.a{pid}"),
        format!("events.b{pid}"),
        format!("events.c{pid}"),
    );
    let dlq = format!("route-dead-{pid}");
    let mock = kafka_tools::start_broker(&topic_a, PARTITIONS).unwrap();
    mock.create_topic(&topic_b, PARTITIONS, 1).unwrap();
    mock.create_topic(&topic_c, PARTITIONS, 1).unwrap();
    mock.create_topic(&dlq, 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let client = Table::create(&url, "route_client");
    let _tables = Tables {
        url: url.clone(),
        names: vec![ta.clone(), tb.clone()],
        ch: client,
    };
    let t = &_tables;
    t.query(&format!(
        "CREATE TABLE default.{ta} (id UInt64, src String, off UInt64, city String) \
         ENGINE = MergeTree ORDER BY id"
    ));
    t.query(&format!(
        "CREATE TABLE default.{tb} (id UInt64, src String, off UInt64, score Float64, tags Array(String)) \
         ENGINE = MergeTree ORDER BY id"
    ));
    // `src` and `off` name each row's origin: its topic and its position
    // in the produced sequence (line i goes to partition i % PARTITIONS).
    let rows = |topic: &str, extra: &dyn Fn(u64) -> String| -> Vec<String> {
        (0..ROWS)
            .map(|i| format!(r#"{{"id":{i},"src":"{topic}","off":{i},{}}}"#, extra(i)))
            .collect()
    };
    produce(
        &brokers,
        &topic_a,
        PARTITIONS,
        &rows(&topic_a, &|i| format!(r#""city":"a-{i}""#)),
    );
    produce(
        &brokers,
        &topic_b,
        PARTITIONS,
        &rows(&topic_b, &|i| {
            format!(r#""score":{i}.25,"tags":["b","{i}"]"#)
        }),
    );
    let strays = 40u64;
    let stray_lines: Vec<String> = (0..strays)
        .map(|i| format!(r#"{{"id":{i},"src":"{topic_c}","off":{i},"city":"c"}}"#))
        .collect();
    produce(&brokers, &topic_c, PARTITIONS, &stray_lines);

    let port = free_port();
    let group = format!("spate-route-{pid}");
    let yaml = format!(
        r#"
pipeline: {{ name: routed, threads: 2 }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: ["^events\\..*"]
    group_id: "{group}"
    properties: {{ session.timeout.ms: "6000", heartbeat.interval.ms: "500", topic.metadata.refresh.interval.ms: "1000" }}
on_error: {{ policy: skip, dead_letter: {{ topic: {dlq} }} }}
sink:
  clickhouse:
    shards: [["{url}"]]
    batch: {{ max_rows: 100000, linger: 100ms }}
tables:
  "^events\\.a": {ta}
  "^events\\.b": {{ table: {tb}, mapping: {{ filter: "id >= {FILTERED}" }} }}
shutdown: {{ drain_timeout: 10s }}
admin: {{ listen: "127.0.0.1:{port}" }}
"#
    );
    let path = std::env::temp_dir().join(format!("spate-route-check-{pid}.yaml"));
    std::fs::write(&path, &yaml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("spawn spate check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let at_a = text.find(&format!("-- table route ^events\\.a -> default.{ta} --"));
    let at_b = text.find(&format!("-- table route ^events\\.b -> default.{tb} --"));
    let (Some(at_a), Some(at_b)) = (at_a, at_b) else {
        panic!("no route headers in\n{text}");
    };
    assert!(text[at_a..at_b].contains("city"), "{text}");
    assert!(text[at_b..].contains("tags"), "{text}");
    // `check --sample` over the plain topics: each message analyzed with
    // its own table's mapping (nothing refused: every row fits its table).
    let check_with = |topics: &str, args: &[&str]| {
        let plain = yaml.replace(
            r#"topics: ["^events\\..*"]"#,
            &format!("topics: [{topics}]"),
        );
        assert_ne!(plain, yaml);
        std::fs::write(&path, &plain).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["check", "-c"])
            .arg(&path)
            .args(args)
            .output()
            .expect("spawn spate check");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = check_with(&format!("{topic_a}, {topic_b}"), &["--sample", "400"]);
    assert_eq!(code, Some(0), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("sample of table route ^events\\.a ("))
        .unwrap_or_else(|| panic!("no sample of table a in\n{text}"));
    assert!(!line.contains("(0 message(s))"), "{line}\n{text}");
    // Table b has a mapping.filter, which --sample does not model yet.
    assert!(
        text.contains("sample of table route ^events\\.b: not analysed"),
        "{text}"
    );
    assert!(!text.contains("PROBLEM"), "{text}");
    // A plain topic of the subscription that matches no entry: a config
    // error at load (exit 1) naming it.
    let (code, text) = check_with(&format!("{topic_a}, {topic_c}"), &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("source.kafka.topics[1]") && text.contains("matches no entry"),
        "{text}"
    );

    let spate = Spate::start("route", &yaml);
    let all_committed = || {
        [&topic_a, &topic_b, &topic_c].iter().all(|topic| {
            let ends = ends(&brokers, topic);
            let c = committed(&brokers, &group, topic, PARTITIONS);
            ends.iter().all(|(p, e)| c.get(p) == Some(&Some(*e)))
        })
    };
    await_until(&spate, "commits of every topic", all_committed);
    let (_, metrics) = get(port, "/metrics").expect("/metrics");
    let unlabelled: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("spate_") && !l.starts_with("spate_build_info"))
        .filter(|l| !l.contains("pipeline=\"routed\""))
        .collect();
    assert!(unlabelled.is_empty(), "{unlabelled:?}");
    // Two tables over one shard: pool shards 0 (table a) and 1 (table b).
    let written = |shard: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("spate_sink_rows_written_total{"))
            .filter(|l| l.contains(&format!("shard=\"{shard}\"")))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        (written("0"), written("1")),
        (ROWS as f64, (ROWS - FILTERED) as f64),
        "{metrics}"
    );
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("skipped={strays}")), "{out}");

    // Every row of each table, checked: origin, completeness, values.
    // Table b's own filter dropped its rows below FILTERED; a kept all.
    for (table, topic, first) in [(&ta, &topic_a, 0), (&tb, &topic_b, FILTERED)] {
        let crossed = t.number(&format!(
            "SELECT count() FROM default.{table} WHERE src != '{topic}' OR off != id"
        ));
        assert_eq!(crossed, 0, "{table}: rows from another topic");
        let distinct = t.number(&format!("SELECT uniqExact(id) FROM default.{table}"));
        assert_eq!(distinct, ROWS - first, "{table}");
        let (min, max) = (
            t.number(&format!("SELECT min(id) FROM default.{table}")),
            t.number(&format!("SELECT max(id) FROM default.{table}")),
        );
        assert_eq!((min, max), (first, ROWS - 1), "{table}");
    }
    let wrong_a = t.number(&format!(
        "SELECT count() FROM default.{ta} WHERE city != concat('a-', toString(id))"
    ));
    let wrong_b = t.number(&format!(
        "SELECT count() FROM default.{tb} WHERE score != id + 0.25 OR tags != ['b', toString(id)]"
    ));
    assert_eq!((wrong_a, wrong_b), (0, 0));
    // The topic matching no entry: every record dead-lettered, with the
    // reason; none landed.
    let dead = consume(
        &brokers,
        &format!("route-dlq-reader-{pid}"),
        &dlq,
        strays as usize,
    );
    assert_eq!(dead.len() as u64, strays, "dead letters");
    for (payload, headers) in &dead {
        assert!(
            String::from_utf8_lossy(payload).contains(&topic_c),
            "a dead letter not from {topic_c}"
        );
        let reason = header(&(payload.clone(), headers.clone()), "spate.reason").to_owned();
        assert!(reason.contains("matches no entry of `tables`"), "{reason}");
    }
}
