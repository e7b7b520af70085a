//! End to end against a real Apache Kafka 4.4 cluster (issue 14): the
//! `spate` binary as child processes, the 3-node KRaft cluster of
//! `ci/kafka.sh` (replication factor 3, `min.insync.replicas` 2) at
//! `SPATE_KAFKA_BROKERS`, and the real ClickHouse at `SPATE_CLICKHOUSE_URL`.
//! Without either, each test prints why it is skipped and passes, except
//! that `SPATE_KAFKA_REQUIRED=1` (set by ci/test.sh) makes a missing broker
//! a failure.
//!
//! What the mock cluster cannot show, a few larger scenarios each:
//! - volume: a large preload over 12 partitions through one `spate run`;
//! - broker failure: `kill -9` of the node leading most partitions
//!   mid-stream, then its restart, spate running throughout; and every
//!   node down for longer than `session.timeout.ms`, then all back;
//! - scale out and in: several `spate run` processes in one group joining,
//!   leaving (SIGTERM) and crashing (`kill -9`, restart) while a producer
//!   writes, under the eager, cooperative-sticky and KIP-848 protocols;
//! - transactions: committed and aborted transactions interleaved, and a
//!   compacted topic whose offsets have gaps: the commits reach the log end
//!   (the lanes' position steps over markers and gaps, D1);
//! - retention: DeleteRecords past the committed offset while spate is
//!   stopped;
//! - dead letters read back from a real topic, and a commit's metadata
//!   string read back from the group coordinator;
//! - rebalance metrics: each process's `spate_consumer_rebalances_total`
//!   and `spate_consumer_assigned_partitions` in the scale-out scenario.
//!
//! Properties checked, as in `e2e.rs`: no produced id missing in ClickHouse
//! (D1), the group's committed offsets at the log end of every partition,
//! SIGTERM exits 0; duplicates are printed, not asserted (at least once).
//!
//! The scenarios share one cluster, each on its own topic, group and table.
//! Two locks, each taken before anything else, keep at most two of them
//! running: one that moves the group or the cluster (scale out and in, the
//! broker failures) and one steady one. The two that kill brokers also run
//! alone on the cluster (`spate_testkit::serial::alone`: no other test on it
//! meanwhile).

use crate::common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::real::{RealKafka, Steady, kafka_sh};
use common::*;

/// The scenarios that move the group or the cluster (scale out and in,
/// broker failures): one at a time.
static SERIAL: Mutex<()> = Mutex::new(());
/// The steady scenarios (volume, transactions, compaction, retention, dead
/// letters): one at a time, beside at most one of [`SERIAL`]'s.
static STEADY: Mutex<()> = Mutex::new(());

fn lock(chain: &'static Mutex<()>) -> std::sync::MutexGuard<'static, ()> {
    chain.lock().unwrap_or_else(|p| p.into_inner())
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    lock(&SERIAL)
}

fn steady() -> std::sync::MutexGuard<'static, ()> {
    lock(&STEADY)
}

/// Both real components, or `None` after printing why the test is skipped.
fn components() -> Option<(RealKafka, String)> {
    let kafka = RealKafka::from_env()?;
    let url = clickhouse_url()?;
    Some((kafka, url))
}

/// A name unique to this test process.
fn unique(what: &str) -> String {
    format!("real-{what}-{}", std::process::id())
}

/// One test's real-cluster setup, or `None` when skipped (as
/// [`components`]): both components, the guard of `chain` ([`SERIAL`] or
/// [`STEADY`]), topic [`unique`]`(what)` of `partitions` partitions (RF 3)
/// and table `table`.
fn setup(
    chain: &'static Mutex<()>,
    what: &str,
    partitions: i32,
    table: &str,
) -> Option<(
    RealKafka,
    String,
    std::sync::MutexGuard<'static, ()>,
    String,
    Table,
)> {
    let serial = lock(chain);
    let (kafka, url) = components()?;
    let topic = unique(what);
    kafka.create_topic(&topic, partitions, 3, &[]);
    let table = Table::create(&url, table);
    Some((kafka, url, serial, topic, table))
}

/// The group (named as the topic: [`unique`]), a free admin port, and the
/// [`config`] reading `topic` into `table` under `on_error`.
fn run_config(
    kafka: &RealKafka,
    topic: &str,
    url: &str,
    table: &Table,
    on_error: &str,
) -> (String, u16, String) {
    let group = topic.to_owned();
    let port = free_port();
    let yaml = config(
        &group,
        &kafka.brokers,
        topic,
        url,
        &table.name,
        port,
        on_error,
    );
    (group, port, yaml)
}

/// Waits until `group`'s committed offsets equal the log end of every
/// partition of `topic`; panics after `within` with the logs of `procs`.
fn await_end(
    kafka: &RealKafka,
    procs: &[&Spate],
    group: &str,
    topic: &str,
    partitions: i32,
    within: Duration,
) {
    let ends = kafka.ends(topic, partitions);
    await_offsets(kafka, procs, group, topic, &ends, within);
}

/// Waits until `group`'s committed offsets on `topic` equal `ends`.
fn await_offsets(
    kafka: &RealKafka,
    procs: &[&Spate],
    group: &str,
    topic: &str,
    ends: &std::collections::BTreeMap<i32, i64>,
    within: Duration,
) {
    let partitions = ends.len() as i32;
    let deadline = Instant::now() + within;
    loop {
        let committed = kafka.committed(group, topic, partitions);
        let behind: Vec<_> = ends
            .iter()
            .filter(|(p, e)| committed.get(p).and_then(|c| c.0) != Some(**e))
            .collect();
        if behind.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = procs.iter().map(|s| s.logs()).collect();
            panic!(
                "{group} not committed to the end within {within:?}: ends {ends:?}, \
                 committed {committed:?}\n{}",
                logs.join("\n-----\n")
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn count(table: &Table) -> u64 {
    table.number(&format!("SELECT count() FROM default.{}", table.name))
}

/// The sum of the samples of metric `name` whose labels include `label`
/// (e.g. `kind="assigned"`) on spate's `/metrics`; 0 when absent.
fn labelled(port: u16, name: &str, label: &str) -> f64 {
    let Some((200, text)) = get(port, "/metrics") else {
        return 0.0;
    };
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('{'))
                .and_then(|rest| rest.split_once('}'))
                .is_some_and(|(labels, _)| labels.split(',').any(|l| l == label))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A process's rebalance metrics: (assigned events, revoked events,
/// partitions owned now).
fn rebalances(port: u16) -> (f64, f64, f64) {
    (
        labelled(port, "spate_consumer_rebalances_total", "kind=\"assigned\""),
        labelled(port, "spate_consumer_rebalances_total", "kind=\"revoked\""),
        metric(port, "spate_consumer_assigned_partitions"),
    )
}

/// The id of a flight row payload (`{"id":N,...}`).
fn id_of(payload: &[u8]) -> u64 {
    let text = std::str::from_utf8(payload).expect("a flight row is UTF-8");
    text.strip_prefix("{\"id\":")
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a flight row: {text}"))
}

/// Checks no id in `0..produced` is missing and none beyond it landed;
/// prints and returns the duplicate count.
fn check_ids(table: &Table, produced: u64, what: &str) -> u64 {
    let (rows, distinct) = table.landed();
    let max = table.number(&format!("SELECT max(id) FROM default.{}", table.name));
    println!(
        "{what}: produced {produced}, in ClickHouse {rows} rows, {distinct} distinct ids, \
         duplicates {}",
        rows - distinct
    );
    assert_eq!(distinct, produced, "{what}: ids missing (D1)");
    assert_eq!(max + 1, produced, "{what}: an id beyond the produced ones");
    rows - distinct
}

/// Rows for the volume scenario: `SPATE_KAFKA_VOLUME_ROWS`, default
/// 2,000,000.
fn volume_rows() -> u64 {
    std::env::var("SPATE_KAFKA_VOLUME_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000)
}

#[test]
fn volume_over_12_partitions_rf3_lands_every_row_and_commits_the_log_end() {
    let _serial = steady();
    let Some((kafka, url)) = components() else {
        return;
    };
    let (topic, partitions, rows) = (unique("volume"), 12, volume_rows());
    kafka.create_topic(&topic, partitions, 3, &[]);
    let table = Table::create(&url, "realvolume");
    let t0 = Instant::now();
    let (p, failures) = common::real::producer(&kafka.brokers);
    for id in 0..rows {
        let row = flight_row(id);
        common::real::send(
            &p,
            &topic,
            (id % partitions as u64) as i32,
            &format!("k{id}"),
            row.as_bytes(),
        );
        if id % 10_000 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    rdkafka::producer::Producer::flush(&p, Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("flush the volume rows: {e}"));
    assert_eq!(failures.count(), 0, "rows not delivered to the broker");
    let produced_in = t0.elapsed();
    let ends = kafka.ends(&topic, partitions);
    assert_eq!(ends.values().sum::<i64>() as u64, rows, "log ends {ends:?}");
    let (group, _port, yaml) = run_config(&kafka, &topic, &url, &table, "{ policy: fail }");
    let t1 = Instant::now();
    let spate = Spate::start("realvolume", &yaml);
    await_end(
        &kafka,
        &[&spate],
        &group,
        &topic,
        partitions,
        Duration::from_secs(600),
    );
    let took = t1.elapsed();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    println!(
        "volume: {rows} rows produced (acks=all, RF 3) in {produced_in:?}; spate run to the \
         committed log end in {took:?} ({:.0} rows/s, group join included)",
        rows as f64 / took.as_secs_f64()
    );
    check_ids(&table, rows, "volume");
}

#[test]
fn kill_9_of_the_busiest_leader_mid_stream_loses_nothing_and_spate_keeps_going() {
    let partitions = 12;
    let Some((kafka, url, _serial, topic, table)) =
        setup(&SERIAL, "brokerfail", partitions, "realbrokerfail")
    else {
        return;
    };
    let _alone = spate_testkit::serial::alone(&[Resource::Kafka]);
    let (group, port, yaml) = run_config(&kafka, &topic, &url, &table, "{ policy: fail }");
    let producer = Steady::start(&kafka.brokers, &topic, partitions, 4_000);
    let mut spate = Spate::start("realbrokerfail", &yaml);
    await_readyz(&spate, port, 200, DELIVERY);
    let deadline = Instant::now() + DELIVERY;
    while count(&table) == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing landed\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let leaders = kafka.leaders(&topic);
    let mut per_node = std::collections::BTreeMap::<i32, usize>::new();
    for n in leaders.values() {
        *per_node.entry(*n).or_default() += 1;
    }
    let (&victim, &led) = per_node.iter().max_by_key(|(_, c)| **c).unwrap();
    let errors_before = metric(port, "spate_source_errors_total");
    println!("broker failure: node {victim} leads {led} of {partitions} partitions: kill -9");
    kafka_sh(&["kill-broker", &victim.to_string()]);
    // Watch /readyz while the node is down.
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(15) {
        let s = get(port, "/readyz").map_or(0, |r| r.0);
        *statuses.entry(s).or_default() += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let errors_down = metric(port, "spate_source_errors_total");
    kafka_sh(&["start-broker", &victim.to_string()]);
    std::thread::sleep(Duration::from_secs(3));
    let produced = producer.finish();
    await_end(
        &kafka,
        &[&spate],
        &group,
        &topic,
        partitions,
        Duration::from_secs(180),
    );
    let after = kafka.leaders(&topic);
    println!(
        "broker failure: /readyz samples while down {statuses:?}; \
         spate_source_errors_total {errors_before} before, {errors_down} while down; \
         leaders after the restart {after:?}"
    );
    assert!(
        spate.child.try_wait().unwrap().is_none(),
        "spate exited during the broker failure\n{}",
        spate.logs()
    );
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}\n{logs}");
    check_ids(&table, produced, "broker failure");
    assert!(
        errors_down > errors_before,
        "the source-error metric did not count the dead broker\n{logs}"
    );
    assert!(
        statuses.contains_key(&503),
        "/readyz never said 503 while a broker was down: {statuses:?}"
    );
}

/// Every node of the cluster killed (`kill -9`) for longer than the
/// consumer's `session.timeout.ms` (6 s in the test config), then all
/// started together (`ci/kafka.sh start-all`: no node answers before a
/// quorum is back). The same spate process rides it out: `/readyz` and the
/// source-error counter show the episode, the group takes the assignment
/// away and back, and once the brokers return every produced id lands and
/// the commits reach the log end.
#[test]
fn all_brokers_down_past_the_session_timeout_then_back_loses_nothing() {
    let _serial = serial();
    let Some((kafka, url)) = components() else {
        return;
    };
    let _alone = spate_testkit::serial::alone(&[Resource::Kafka]);
    let (topic, partitions) = (unique("alldown"), 6);
    kafka.create_topic(&topic, partitions, 3, &[]);
    let table = Table::create(&url, "realalldown");
    let group = unique("alldown");
    let port = free_port();
    let yaml = config(
        &group,
        &kafka.brokers,
        &topic,
        &url,
        &table.name,
        port,
        "{ policy: fail }",
    );
    assert!(
        yaml.contains(r#"session.timeout.ms: "6000""#),
        "the outage below is sized for a 6 s session timeout"
    );
    let producer = Steady::start(&kafka.brokers, &topic, partitions, 2_000);
    let mut spate = Spate::start("realalldown", &yaml);
    await_readyz(&spate, port, 200, DELIVERY);
    let deadline = Instant::now() + DELIVERY;
    while count(&table) == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing landed\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let nodes = kafka.brokers.split(',').count();
    let errors_before = metric(port, "spate_source_errors_total");
    let (assigned_before, _, _) = rebalances(port);
    for n in 1..=nodes {
        kafka_sh(&["kill-broker", &n.to_string()]);
    }
    println!("all brokers down: {nodes} nodes killed");
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(15) {
        let s = get(port, "/readyz").map_or(0, |r| r.0);
        *statuses.entry(s).or_default() += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let errors_down = metric(port, "spate_source_errors_total");
    let t = Instant::now();
    kafka_sh(&["start-all"]);
    println!("all brokers down: back after {:?}", t.elapsed());
    await_readyz(&spate, port, 200, Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(3));
    let produced = producer.finish();
    await_end(
        &kafka,
        &[&spate],
        &group,
        &topic,
        partitions,
        Duration::from_secs(180),
    );
    let (assigned_after, revoked_after, owned) = rebalances(port);
    println!(
        "all brokers down: /readyz samples while down {statuses:?}; \
         spate_source_errors_total {errors_before} before, {errors_down} while down; \
         rebalances assigned {assigned_before} before, {assigned_after} after, revoked \
         {revoked_after}; partitions owned {owned}"
    );
    assert!(
        spate.child.try_wait().unwrap().is_none(),
        "spate exited during the outage\n{}",
        spate.logs()
    );
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}\n{logs}");
    check_ids(&table, produced, "all brokers down");
    assert!(
        errors_down > errors_before,
        "the source-error metric did not count the outage\n{logs}"
    );
    assert!(
        statuses.contains_key(&503),
        "/readyz while every broker was down: {statuses:?}"
    );
}

/// Scale out and in under one group protocol / assignor: `props` replaces
/// the config's librdkafka properties.
/// `cooperative`: whether assignments must arrive incrementally (spate logs
/// `cooperative=true` per assigned partition), so the protocol in force is
/// the one asked for.
fn scale_out_and_in(what: &str, props: &str, cooperative: bool) {
    let _serial = serial();
    let Some((kafka, url)) = components() else {
        return;
    };
    let (topic, partitions) = (unique(&format!("scale-{what}")), 12);
    kafka.create_topic(&topic, partitions, 3, &[]);
    let table = Table::create(&url, &format!("realscale{}", what.replace('-', "")));
    let group = unique(&format!("scale-{what}"));
    let yaml = |port: u16| {
        let y = config(
            &group,
            &kafka.brokers,
            &topic,
            &url,
            &table.name,
            port,
            "{ policy: fail }",
        );
        let out = y.replace(
            r#"properties: { session.timeout.ms: "6000", heartbeat.interval.ms: "500" }"#,
            props,
        );
        assert_ne!(out, y, "properties rewritten");
        out
    };
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let producer = Steady::start(&kafka.brokers, &topic, partitions, 3_000);
    let a = Spate::start(&format!("scale-{what}-a"), &yaml(ports[0]));
    let deadline = Instant::now() + DELIVERY;
    while count(&table) == 0 {
        assert!(Instant::now() < deadline, "nothing landed\n{}", a.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    let b = Spate::start(&format!("scale-{what}-b"), &yaml(ports[1]));
    let c = Spate::start(&format!("scale-{what}-c"), &yaml(ports[2]));
    // Until both newcomers consumed something.
    let deadline = Instant::now() + DELIVERY;
    while metric(ports[1], "spate_records_polled_total") == 0.0
        || metric(ports[2], "spate_records_polled_total") == 0.0
    {
        assert!(
            Instant::now() < deadline,
            "the added members got no records\n{}\n-----\n{}",
            b.logs(),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (b_assigned, _, b_owned) = rebalances(ports[1]);
    let (code, out) = b.terminate();
    assert_eq!(code, Some(0), "member b after SIGTERM: {out}");
    std::thread::sleep(Duration::from_secs(3));
    let (c_assigned, _, c_owned) = rebalances(ports[2]);
    let mut c = c;
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    drop(c);
    std::thread::sleep(Duration::from_secs(1));
    let c2 = Spate::start(&format!("scale-{what}-c2"), &yaml(ports[2]));
    std::thread::sleep(Duration::from_secs(6));
    let produced = producer.finish();
    await_end(
        &kafka,
        &[&a, &c2],
        &group,
        &topic,
        partitions,
        Duration::from_secs(120),
    );
    let polled = [
        metric(ports[0], "spate_records_polled_total"),
        metric(ports[2], "spate_records_polled_total"),
    ];
    // The two members left own every partition once the group settled.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (a_metrics, c2_metrics) = loop {
        let (a_m, c2_m) = (rebalances(ports[0]), rebalances(ports[2]));
        if a_m.2 + c2_m.2 == f64::from(partitions) || Instant::now() > deadline {
            break (a_m, c2_m);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let logs_a = a.logs();
    let (code_a, out_a) = a.terminate();
    let (code_c, out_c) = c2.terminate();
    assert_eq!(code_a, Some(0), "{out_a}");
    assert_eq!(code_c, Some(0), "{out_c}");
    println!(
        "scale {what}: records polled by a {}, by the restarted c {}",
        polled[0], polled[1]
    );
    assert!(polled[1] > 0.0, "the restarted member got no partition");
    println!(
        "scale {what}: (assigned, revoked, owned) per process: a {a_metrics:?}, \
         b {b_assigned}/{b_owned} before SIGTERM, c {c_assigned}/{c_owned} before kill -9, \
         c2 {c2_metrics:?}"
    );
    // a was assigned at the start and again after b and c left; it gave
    // partitions up when b and c joined.
    assert!(a_metrics.0 >= 2.0, "a's assigned rebalances: {a_metrics:?}");
    assert!(a_metrics.1 >= 1.0, "a's revoked rebalances: {a_metrics:?}");
    assert!(
        b_assigned >= 1.0 && b_owned >= 1.0,
        "b: {b_assigned}/{b_owned}"
    );
    assert!(
        c_assigned >= 1.0 && c_owned >= 1.0,
        "c: {c_assigned}/{c_owned}"
    );
    assert!(
        c2_metrics.0 >= 1.0,
        "c2's assigned rebalances: {c2_metrics:?}"
    );
    assert_eq!(
        a_metrics.2 + c2_metrics.2,
        f64::from(partitions),
        "spate_consumer_assigned_partitions of a and c2: {a_metrics:?} {c2_metrics:?}"
    );
    let mode = format!("cooperative={cooperative}");
    assert!(
        logs_a.contains(&mode),
        "member a never logged {mode}\n{logs_a}"
    );
    assert!(
        !logs_a.contains(&format!("cooperative={}", !cooperative)),
        "{logs_a}"
    );
    check_ids(&table, produced, &format!("scale out/in ({what})"));
}

#[test]
fn scale_out_and_in_eager_range_assignor() {
    scale_out_and_in(
        "eager",
        r#"properties: { session.timeout.ms: "6000", heartbeat.interval.ms: "500", partition.assignment.strategy: "range" }"#,
        false,
    );
}

#[test]
fn scale_out_and_in_cooperative_sticky_assignor() {
    scale_out_and_in(
        "cooperative",
        r#"properties: { session.timeout.ms: "6000", heartbeat.interval.ms: "500", partition.assignment.strategy: "cooperative-sticky" }"#,
        true,
    );
}

/// KIP-848: the broker-side assignment (`group.protocol=consumer`), which
/// librdkafka 2.12 supports against a 4.x broker; the session timeout is
/// the broker's (`group.consumer.session.timeout.ms`, 45 s by default; 6 s
/// on ci/kafka.sh's cluster), so the killed member's partitions wait for it.
#[test]
fn scale_out_and_in_kip848_consumer_protocol() {
    scale_out_and_in(
        "kip848",
        r#"properties: { group.protocol: "consumer" }"#,
        true,
    );
}

#[test]
fn transactions_aborted_never_land_and_commits_step_over_control_records() {
    use rdkafka::producer::Producer;
    let partitions = 3;
    let Some((kafka, url, _serial, topic, table)) = setup(&STEADY, "txn", partitions, "realtxn")
    else {
        return;
    };
    let p: rdkafka::producer::BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("transactional.id", unique("txn-producer"))
        .create()
        .unwrap();
    p.init_transactions(Duration::from_secs(30)).unwrap();
    const ABORTED_BASE: u64 = 10_000_000;
    let (mut good, mut aborted) = (0u64, 0u64);
    let mut per_partition = [0i64; 3];
    for t in 0..30 {
        p.begin_transaction().unwrap();
        let abort = t % 3 == 1;
        for _ in 0..60 {
            let id = if abort { ABORTED_BASE + aborted } else { good };
            let part = (id % partitions as u64) as i32;
            common::real::send(
                &p,
                &topic,
                part,
                &format!("k{id}"),
                flight_row(id).as_bytes(),
            );
            if abort {
                aborted += 1;
            } else {
                good += 1;
                per_partition[part as usize] += 1;
            }
        }
        // Delivery reports are served by polling: flush before the end.
        p.flush(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("flush transaction {t}: {e}"));
        if abort {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    let ends = kafka.ends(&topic, partitions);
    println!(
        "transactions: {good} committed rows, {aborted} aborted, log ends {ends:?} \
         (committed rows per partition {per_partition:?})"
    );
    for (part, end) in &ends {
        assert!(
            *end > per_partition[*part as usize],
            "{topic}/{part}: the log end {end} has no gap for aborted records and markers"
        );
    }
    let (group, _port, yaml) = run_config(&kafka, &topic, &url, &table, "{ policy: fail }");
    // Every partition ends with the commit marker of the last transaction
    // (a committed one: t = 29), which no consumer is given (librdkafka
    // issue 3917). The lane's position steps over it once everything
    // before it was delivered (`Lane::position`, D1), so the commits reach
    // the log end, not end - 1.
    let spate = Spate::start("realtxn", &yaml);
    await_offsets(&kafka, &[&spate], &group, &topic, &ends, DELIVERY);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    let landed_aborted = table.number(&format!(
        "SELECT count() FROM default.{} WHERE id >= {ABORTED_BASE}",
        table.name
    ));
    assert_eq!(
        landed_aborted, 0,
        "rows of aborted transactions reached ClickHouse"
    );
    check_ids(&table, good, "transactions");
}

/// Every record of `topic` (`partitions` partitions) by partition: (offset,
/// flight id), read from the beginning with a plain consumer.
fn read_ids(
    kafka: &RealKafka,
    topic: &str,
    partitions: i32,
) -> std::collections::BTreeMap<i32, Vec<(i64, u64)>> {
    (0..partitions)
        .map(|p| {
            let got = kafka
                .read_partition(topic, p)
                .iter()
                .map(|(o, payload, _)| (*o, id_of(payload)))
                .collect();
            (p, got)
        })
        .collect()
}

/// A compacted topic (`cleanup.policy=compact`, `segment.ms` 100,
/// `min.cleanable.dirty.ratio` 0.01) written in rounds of repeated keys
/// plus one key per round that is never repeated, each round in a segment
/// of its own. Once the cleaner has removed the older versions (seen as
/// fewer records than offsets between the watermarks, and a read with
/// gaps), spate reads it: exactly the surviving records land and the
/// commits reach the log end.
#[test]
fn compacted_topic_with_gaps_lands_exactly_the_surviving_records() {
    use rdkafka::producer::Producer;
    let _serial = steady();
    let Some((kafka, url)) = components() else {
        return;
    };
    let (topic, partitions) = (unique("compact"), 2);
    kafka.create_topic(
        &topic,
        partitions,
        3,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("min.compaction.lag.ms", "0"),
        ],
    );
    let table = Table::create(&url, "realcompact");
    const ROUNDS: u64 = 6;
    const KEYS: u64 = 40;
    let (p, failures) = common::real::producer(&kafka.brokers);
    let mut id = 0u64;
    for round in 0..ROUNDS {
        for part in 0..partitions {
            for k in 0..KEYS {
                let row = flight_row(id);
                common::real::send(&p, &topic, part, &format!("k{part}-{k}"), row.as_bytes());
                id += 1;
            }
            let row = flight_row(id);
            common::real::send(
                &p,
                &topic,
                part,
                &format!("once{part}-{round}"),
                row.as_bytes(),
            );
            id += 1;
        }
        p.flush(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("flush round {round}: {e}"));
        // Past segment.ms: the next round's first append rolls the segment.
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(failures.count(), 0, "rows not delivered to the broker");
    let produced = id;
    // Until the cleaner removed offsets in every partition, and two reads
    // 2 s apart agree (a pass is over; nothing new rolls without appends).
    let deadline = Instant::now() + Duration::from_secs(90);
    let survivors = loop {
        let a = read_ids(&kafka, &topic, partitions);
        let gaps = a
            .values()
            .all(|recs| recs.windows(2).any(|w| w[1].0 > w[0].0 + 1));
        if gaps {
            std::thread::sleep(Duration::from_secs(2));
            let b = read_ids(&kafka, &topic, partitions);
            if a == b {
                break b;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: no compaction within 90 s: {:?}",
            a.iter().map(|(p, r)| (*p, r.len())).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let marks = kafka.watermarks(&topic, partitions);
    let mut surviving = std::collections::BTreeSet::new();
    for (part, recs) in &survivors {
        let (low, high) = marks[part];
        println!(
            "compacted: {topic}/{part} watermarks [{low}, {high}), {} records left of {}; \
             first offsets {:?}",
            recs.len(),
            high - low,
            recs.iter().take(8).map(|r| r.0).collect::<Vec<_>>()
        );
        assert!(
            (recs.len() as i64) < high - low,
            "{topic}/{part}: compaction removed nothing"
        );
        assert_eq!(
            recs.last().map(|r| r.0 + 1),
            Some(high),
            "{topic}/{part}: the last record survives compaction"
        );
        surviving.extend(recs.iter().map(|r| r.1));
    }
    assert!(surviving.len() < produced as usize);
    let group = unique("compact");
    let port = free_port();
    let yaml = config(
        &group,
        &kafka.brokers,
        &topic,
        &url,
        &table.name,
        port,
        "{ policy: fail }",
    );
    let spate = Spate::start("realcompact", &yaml);
    let ends = kafka.ends(&topic, partitions);
    await_offsets(&kafka, &[&spate], &group, &topic, &ends, DELIVERY);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    let ids = table.ids(0);
    let landed: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    println!(
        "compacted: produced {produced}, {} survived compaction, {} rows landed ({} distinct)",
        surviving.len(),
        ids.len(),
        landed.len()
    );
    assert_eq!(
        landed, surviving,
        "exactly the records that survived compaction land"
    );
}

#[test]
fn records_deleted_past_the_commit_while_stopped_are_logged_counted_and_reset() {
    let partitions = 2;
    let Some((kafka, url, _serial, topic, table)) =
        setup(&STEADY, "retention", partitions, "realretention")
    else {
        return;
    };
    let (group, port, yaml) = run_config(&kafka, &topic, &url, &table, "{ policy: fail }");
    let first: Vec<String> = (0..1_000).map(flight_row).collect();
    produce(&kafka.brokers, &topic, partitions, &first);
    let spate = Spate::start("realretention", &yaml);
    await_end(&kafka, &[&spate], &group, &topic, partitions, DELIVERY);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    // While stopped: more rows, then the log start moves past the commit.
    let second: Vec<String> = (1_000..2_000).map(flight_row).collect();
    produce(&kafka.brokers, &topic, partitions, &second);
    let committed = kafka.committed(&group, &topic, partitions);
    let upto: Vec<(i32, i64)> = (0..partitions).map(|p| (p, 900)).collect();
    kafka.delete_records(&topic, &upto);
    let marks = kafka.watermarks(&topic, partitions);
    println!("retention: committed {committed:?}, watermarks after DeleteRecords {marks:?}");
    let spate = Spate::start("realretention2", &yaml);
    await_end(&kafka, &[&spate], &group, &topic, partitions, DELIVERY);
    let counted = metric(port, "spate_committed_offset_out_of_range_total");
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    // A clean run that met an out-of-range commit says so: status
    // OffsetReset, exit 4 (engine/spate/README.md, "The run summary").
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains("status=OffsetReset") && out.contains("offset_resets=["),
        "the summary names the reset: {out}"
    );
    assert_eq!(
        counted, partitions as f64,
        "out-of-range commits counted\n{logs}"
    );
    for p in 0..partitions {
        let (low, high) = marks[&p];
        let c = committed[&p].0.unwrap();
        assert!(
            c < low,
            "the commit {c} of partition {p} is below the new log start {low}"
        );
        let line = format!("committed offset {c} of {topic}/{p} is out of range [{low}, {high}]");
        assert!(logs.contains(&line), "no `{line}` in the log\n{logs}");
    }
    // auto_offset_reset earliest: reads from the new log start; what the
    // broker deleted before spate read it is gone (that is retention).
    let readable: i64 = marks.values().map(|(l, h)| h - l).sum();
    let (_, distinct) = table.landed();
    assert_eq!(
        distinct,
        1_000 + readable as u64,
        "first run + what the broker still had"
    );
}

#[test]
fn dead_letters_read_back_with_headers_and_commit_metadata_round_trips() {
    use rdkafka::consumer::{CommitMode, Consumer};
    let _serial = steady();
    let Some((kafka, url)) = components() else {
        return;
    };
    let (topic, dlq, partitions) = (unique("dl"), unique("dl-dead"), 2);
    kafka.create_topic(&topic, partitions, 3, &[]);
    kafka.create_topic(&dlq, 1, 3, &[]);
    let table = Table::create(&url, "realdl");
    let poison: Vec<Vec<u8>> = vec![
        b"{not json".to_vec(),
        b"[1, 2]".to_vec(),
        br#"{"id":"seven","date":"2001/01/01 00:47","delay":1,"distance":2,"origin":"A","destination":"B"}"#.to_vec(),
    ];
    let mut lines: Vec<Vec<u8>> = (0..300).map(|i| flight_row(i).into_bytes()).collect();
    for (i, p) in poison.iter().enumerate() {
        lines.insert(50 + i * 90, p.clone());
    }
    spate::kafka_tools::produce_lines(
        &kafka.brokers,
        &topic,
        partitions,
        lines.iter().map(Vec::as_slice),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    let (group, _port, yaml) = run_config(
        &kafka,
        &topic,
        &url,
        &table,
        &format!("{{ policy: skip, dead_letter: {{ topic: {dlq} }} }}"),
    );
    let spate = Spate::start("realdl", &yaml);
    await_end(&kafka, &[&spate], &group, &topic, partitions, DELIVERY);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    check_ids(&table, 300, "dead letters");
    let dead = kafka.read_partition(&dlq, 0);
    assert_eq!(dead.len(), poison.len(), "dead letters in {dlq}");
    for (offset, payload, headers) in &dead {
        assert!(
            poison.contains(payload),
            "{dlq} offset {offset}: not a poison record"
        );
        for key in ["spate.reason", "spate.offset"] {
            let v = headers.iter().find(|(k, _)| k == key);
            assert!(
                v.is_some_and(|(_, v)| !v.is_empty()),
                "{dlq} offset {offset}: no {key} header in {headers:?}"
            );
        }
    }
    println!(
        "dead letters: {} read back from {dlq} with headers {:?}",
        dead.len(),
        dead[0].2
    );

    // Commit metadata through the real group coordinator.
    let meta_group = unique("meta");
    let text = "spate:v1 pending=[0,40) [40,77)";
    let c = kafka.client(Some(&meta_group));
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Offset(77))
        .unwrap();
    tpl.find_partition(&topic, 0).unwrap().set_metadata(text);
    c.commit(&tpl, CommitMode::Sync).unwrap();
    drop(c);
    let back = kafka.committed(&meta_group, &topic, partitions);
    assert_eq!(
        back[&0],
        (Some(77), text.to_owned()),
        "commit metadata round trip"
    );
    assert_eq!(back[&1].0, None);
}
