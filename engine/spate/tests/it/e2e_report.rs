//! What `spate run` tells a user when something went wrong (issue 19, "a
//! user cannot tell what happened"): the real binary against an embedded
//! broker (librdkafka's mock cluster) in this process and the real
//! ClickHouse at `SPATE_CLICKHOUSE_URL` (skipped without it, as `e2e.rs`).
//! Each test asserts on the summary line (stdout) and the exit status:
//!
//! - a sink failure mid-run (the table dropped: ClickHouse code 60) names
//!   the server's reason after "stopped committing", exit 3;
//! - a wrong password (code 193) and a misspelt database at start: a
//!   "schema probe error", and "database ... does not exist", exit 3;
//! - a committed offset out of range: `status=OffsetReset` with partition,
//!   committed offset and where it reset to, exit 4;
//! - paced skip warnings say how many they suppressed, at the pacing points
//!   and when the run ends;
//! - a `^pattern` matching no topic yet: the run waits, then reads the
//!   topic once it is created, exit 0.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};

/// `config(...)` with `extra` lines added to `sink.clickhouse`.
fn with_sink_lines(yaml: &str, table: &str, extra: &str) -> String {
    let from = format!("    table: {table}\n");
    let out = yaml.replace(&from, &format!("{from}{extra}"));
    assert_ne!(out, yaml, "sink lines added");
    out
}

/// Commits `offset` for `topic`/`partition` as `group` (no member yet: the
/// mock accepts it).
fn commit_as_group(brokers: &str, group: &str, topic: &str, partition: i32, offset: i64) {
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .unwrap();
    c.commit(&tpl, CommitMode::Sync).expect("commit");
}

/// Issue 19: after a sink failure the summary said only "N partition(s)
/// stopped committing"; the server's reason was on stderr alone. Dropping
/// the table mid-run makes the next insert fail with code 60: the summary
/// names it, exit 3.
#[test]
fn a_sink_failure_names_the_servers_reason_in_the_summary() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "sinkcause");
    let feed = Feed::mock("sinkcause", 2, "e2e-sinkcause");
    feed.produce_flights(0..100);
    let mut spate = Spate::start(
        "sinkcause",
        &feed.config(&url, &table.name, "{ policy: fail }"),
    );
    feed.await_commits(&spate);
    table.query(&format!("DROP TABLE default.{}", table.name));
    feed.produce_flights(100..200);
    let (code, out) = spate.wait_exit(DELIVERY);
    println!("{out}");
    let logs = spate.logs();
    assert_eq!(code, Some(3), "stdout: {out}\nlog: {logs}");
    for part in [
        "status=Failed",
        "stopped committing at a failed batch",
        "cause: shard 0: fatal write error: ",
        &table.name,
        "attempt(s))",
    ] {
        assert!(
            out.contains(part),
            "`{part}` missing from the summary: {out}"
        );
    }
    // The server's code 60 where the insert reached it; on 18.16 the schema
    // re-read before each insert (Native without a type check) finds the
    // table gone first and says so.
    assert!(
        out.contains("ClickHouse code 60")
            || out.contains("does not exist (no rows in system.columns)"),
        "the summary names the missing table: {out}"
    );
}

/// Issue 19: a schema probe failure at start said "write error", and a
/// misspelt database "table does not exist". A wrong password (code 193)
/// is a schema probe error; a database the server lacks is named as such
/// (system.databases); both exit 3 with the status line on stdout.
#[test]
fn a_wrong_password_and_a_missing_database_are_named_at_start() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "startcause");
    let feed = Feed::mock("startcause", 1, "e2e-startcause");
    let base = feed.config(&url, &table.name, "{ policy: fail }");

    let yaml = with_sink_lines(
        &base,
        &table.name,
        "    user: default\n    password: not-the-password\n",
    );
    let (code, out) = Spate::start("startcause-pw", &yaml).wait_exit(EXIT);
    println!("{out}");
    assert_eq!(code, Some(3), "{out}");
    for part in ["status=Failed", "schema probe error", "ClickHouse code 193"] {
        assert!(out.contains(part), "`{part}` missing: {out}");
    }
    assert!(
        !out.contains("write error"),
        "a probe is not a write: {out}"
    );

    let db = format!("nodb_{}", std::process::id());
    let yaml = with_sink_lines(&base, &table.name, &format!("    database: {db}\n"));
    let (code, out) = Spate::start("startcause-db", &yaml).wait_exit(EXIT);
    println!("{out}");
    assert_eq!(code, Some(3), "{out}");
    assert!(
        out.contains(&format!("database {db} does not exist")),
        "the database is named: {out}"
    );
    assert!(
        !out.contains("system.columns"),
        "not a missing table: {out}"
    );
}

/// Issue 19: an out-of-range committed offset was logged and counted while
/// the summary said `status=Clean` and the exit was 0. The group committed
/// 500 on a partition holding 20 messages: librdkafka resets to `earliest`,
/// every row lands, and the summary names partition, committed offset,
/// range and where it reset to, with `status=OffsetReset` and exit 4.
#[test]
fn an_out_of_range_committed_offset_is_named_and_exits_4() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "oor");
    let feed = Feed::mock("oor", 1, "e2e-oor");
    feed.produce_flights(0..20);
    commit_as_group(&feed.brokers, &feed.group, &feed.topic, 0, 500);
    let spate = Spate::start("oor", &feed.config(&url, &table.name, "{ policy: fail }"));
    feed.await_commits(&spate);
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    println!("{out}");
    assert_eq!(code, Some(4), "stdout: {out}\nlog: {logs}");
    assert!(out.contains("status=OffsetReset"), "{out}");
    assert!(
        out.contains(
            "offset_resets=[oor/0 committed 500 outside [0, 20] (beyond the log end): reset to 0 \
             (auto.offset.reset=earliest)]"
        ),
        "{out}"
    );
    let distinct = table.number(&format!("SELECT uniqExact(id) FROM default.{}", table.name));
    assert_eq!(distinct, 20);
}

/// Issue 19: skipped-record warnings were paced without saying so. 30 bad
/// records on one partition (one pipeline thread): WARN lines for skips
/// 1..=10 and 16 (which says 5 more were suppressed), and at the end of the
/// run a line for the 14 after it.
#[test]
fn paced_skip_warnings_say_how_many_were_suppressed() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "paced");
    let feed = Feed::mock("paced", 1, "e2e-paced");
    let mut lines: Vec<String> = (0..30).map(|i| format!("{{not json {i}")).collect();
    lines.push(flight_row(1));
    feed.produce(&lines);
    let spate = Spate::start("paced", &feed.config(&url, &table.name, "{ policy: skip }"));
    feed.await_commits(&spate);
    let (code, out) = spate_terminate_with_logs(spate);
    let (code, logs) = (code, out.1);
    assert_eq!(code, Some(0), "stdout: {}\nlog: {logs}", out.0);
    assert!(out.0.contains("skipped=30"), "{}", out.0);
    let warned = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("record skipped (on_error: skip)"))
        .count();
    assert_eq!(warned, 11, "{logs}");
    assert!(
        logs.contains("5 more suppressed since the last one logged"),
        "{logs}"
    );
    assert!(
        logs.contains("14 more skipped record(s) suppressed since the last one logged"),
        "{logs}"
    );
}

/// SIGTERM, wait, then the log as well: ((exit code), (stdout, log)).
fn spate_terminate_with_logs(mut spate: Spate) -> (Option<i32>, (String, String)) {
    spate.signal("-TERM");
    let (code, out) = spate.wait_exit(EXIT);
    (code, (out, spate.logs()))
}

/// Issue 19: a `^pattern` subscription matching no topic yet exited 3 at
/// once ("UnknownTopicOrPartition") while `spate check` passed. Now the run
/// waits in its group (an INFO line says so), reads the topic once it is
/// created, and exits 0 on SIGTERM.
#[test]
fn a_pattern_matching_no_topic_yet_waits_for_one() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    let table = Table::create(&url, "pattern");
    let feed = Feed::mock("unrelated", 1, "e2e-pattern");
    let yaml = feed
        .config(&url, &table.name, "{ policy: fail }")
        .replace("topics: [unrelated]", "topics: [\"^later\\\\..*\"]")
        .replace(
            "properties: {",
            "properties: { topic.metadata.refresh.interval.ms: \"500\",",
        );
    let mut spate = Spate::start("pattern", &yaml);
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        assert!(
            spate.child.try_wait().unwrap().is_none(),
            "spate exited while waiting for a topic: {}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        spate.logs().contains("matches no topic yet"),
        "{}",
        spate.logs()
    );
    feed.broker.create_topic("later.a", 2);
    let later = Feed {
        topic: "later.a".into(),
        partitions: 2,
        ..feed
    };
    later.produce_flights(0..50);
    later.await_commits(&spate);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        table.number(&format!("SELECT uniqExact(id) FROM default.{}", table.name)),
        50
    );
}

/// Issue 19: a process restarted after a crash waited for the old member's
/// session to expire (45 s by default). With static membership
/// (`group.instance.id` in `source.kafka.properties`) the restart replaces
/// the old member at once. `session.timeout.ms` is 45 s here; the restart
/// must commit the new data well before that (25 s covers the join and a
/// round of commits on a real broker).
///
/// Needs a real Kafka broker at `SPATE_KAFKA_BROKERS`: librdkafka's mock
/// cluster matches a rejoining member by member id only, never by
/// `group.instance.id` (librdkafka 2.12 `rdkafka_mock_cgrp.c`), so there a
/// restart always waits for the old session. Skipped (with a line saying
/// so) without it.
#[test]
fn a_restart_with_static_membership_rejoins_without_waiting_for_the_session() {
    let Some(url) = clickhouse_url() else {
        return;
    };
    if std::env::var("SPATE_KAFKA_BROKERS").is_err() {
        println!(
            "skipped: SPATE_KAFKA_BROKERS not set (static membership needs a real broker; \
             the mock cluster does not implement it)"
        );
        return;
    }
    let table = Table::create(&url, "static");
    let kafka = real::RealKafka::from_env().expect("SPATE_KAFKA_BROKERS is set");
    let topic = format!("spate-static-{}", std::process::id());
    kafka.create_topic(&topic, 2, 1, &[]);
    let feed = Feed::on(Broker::Real(kafka), topic, 2, "e2e-static");
    feed.produce_flights(0..100);
    let yaml = feed.config(&url, &table.name, "{ policy: fail }").replace(
        "properties: { session.timeout.ms: \"6000\", heartbeat.interval.ms: \"500\" }",
        "properties: { session.timeout.ms: \"45000\", heartbeat.interval.ms: \"1000\", \
             group.instance.id: \"spate-static-1\" }",
    );
    assert!(yaml.contains("group.instance.id"), "{yaml}");
    let mut first = Spate::start("static", &yaml);
    feed.await_commits(&first);
    // A crash: no LeaveGroup (a static member sends none anyway).
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    feed.produce_flights(100..200);
    let restarted_at = Instant::now();
    let second = Spate::start("static", &yaml);
    feed.await_commits(&second);
    let took = restarted_at.elapsed();
    println!("restart with group.instance.id committed the new data after {took:?}");
    assert!(
        took < Duration::from_secs(25),
        "the restart waited {took:?}: the old member's session (45 s) was waited out\n{}",
        second.logs()
    );
    let (code, out) = second.terminate();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        table.number(&format!("SELECT uniqExact(id) FROM default.{}", table.name)),
        200
    );
}
