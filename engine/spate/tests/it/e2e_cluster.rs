//! End to end on a real cluster: the `spate` binary as a child process, an
//! embedded Kafka broker (librdkafka's mock cluster) in this test process,
//! and 2 shards x 2 ReplicatedMergeTree replicas (four ClickHouse 18.16
//! servers and a ZooKeeper that ci/test.sh starts and names in
//! `SPATE_CLICKHOUSE_SHARDS`; without it each test prints `skipped: ...` and
//! passes). Rows are routed by `sink.clickhouse.shard_key: { field: id }`.
//!
//! Properties checked: every produced row lands at least once (D1: distinct
//! ids equal produced) on the shard the router computes for its id, on both
//! replicas; committed offsets reach the end offsets; `/readyz` is not ready
//! while every replica of a shard is frozen (SIGSTOP) and ready again after
//! SIGCONT; SIGTERM with a frozen shard exits within `drain_timeout` + 2 s
//! (D5) with the "abandoned" exit code and count, and a restart loses nothing.
//!
//! Freezing a shard disturbs every test on it, so the tests here take
//! [`servers`] and run alone on the cluster (no other test on it beside).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use spate::kafka_tools;
use spate_row::shard::shard_of_key;

/// One test at a time on the replicated cluster, and no test of another
/// module on it beside (see the module docs). A failed test leaves the
/// servers fine (Frozen thawed them).
fn servers() -> spate_testkit::serial::Alone {
    spate_testkit::serial::alone(&[Resource::Replicas])
}

/// The cluster config: [`config`] on `shards`, routed by `id`.
fn cluster_config(
    group: &str,
    brokers: &str,
    topic: &str,
    shards: &[Vec<String>],
    table: &str,
    port: u16,
) -> String {
    let base = config(
        group,
        brokers,
        topic,
        &shards[0][0],
        table,
        port,
        "{ policy: fail }",
    );
    with_shards(&base, &shards[0][0], shards)
}

/// Checks that each id on shard `s` is one the router sends to `s`, that
/// every shard got rows and every replica of a shard holds the same rows;
/// returns (rows, distinct ids) over the cluster.
fn check_routing(table: &Table) -> (u64, u64) {
    let n = table.shards.len();
    let mut all = std::collections::HashSet::new();
    let mut rows = 0u64;
    for s in 0..n {
        let ids = table.ids(s);
        assert!(!ids.is_empty(), "shard {s} got no rows");
        let misrouted: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| shard_of_key(id.to_string().as_bytes(), n) != s)
            .take(5)
            .collect();
        assert!(
            misrouted.is_empty(),
            "ids on shard {s} the router sends elsewhere: {misrouted:?}"
        );
        for url in &table.shards[s][1..] {
            table.query_at(url, &format!("SYSTEM SYNC REPLICA default.{}", table.name));
            let replica: u64 = table
                .query_at(url, &format!("SELECT count() FROM default.{}", table.name))
                .parse()
                .unwrap();
            assert_eq!(replica, ids.len() as u64, "replica {url} of shard {s}");
        }
        let distinct = ids.iter().collect::<std::collections::HashSet<_>>().len();
        println!("shard {s}: {} rows, {distinct} distinct ids", ids.len());
        rows += ids.len() as u64;
        all.extend(ids);
    }
    (rows, all.len() as u64)
}

/// Issue 7's main end-to-end run: 200,000 flight rows over 8 partitions into
/// 2 shards x 2 replicas. Every row lands at least once (D1), on the shard
/// its id routes to, committed offsets equal end offsets, and the
/// duplicates are counted.
#[test]
fn flights_200k_land_once_per_id_on_their_shard_of_a_replicated_cluster() {
    let Some(shards) = clickhouse_shards() else {
        return;
    };
    let _alone = servers();
    let table = Table::create_replicated(&shards, "c200k");
    let (topic, partitions, rows) = ("flights", 8, 200_000u64);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    let brokers = mock.bootstrap_servers();
    let lines: Vec<String> = (0..rows).map(flight_row).collect();
    produce(&brokers, topic, partitions, &lines);
    drop(lines);
    let group = format!("e2e-c200k-{}", std::process::id());
    let port = free_port();
    let started = Instant::now();
    let spate = Spate::start(
        "c200k",
        &cluster_config(&group, &brokers, topic, &shards, &table.name, port),
    );
    await_commits(&spate, &brokers, &group, topic, partitions, port);
    let took = started.elapsed();
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    let (count, distinct) = check_routing(&table);
    println!(
        "200k: {rows} produced, {count} rows in ClickHouse, {distinct} distinct ids, \
         duplicates {}, committed = end offsets after {took:?} (incl. start-up and group join)",
        count - distinct
    );
    assert_eq!(distinct, rows, "rows lost (D1)");
}

/// `abandoned_rows=N` from spate's summary line.
fn abandoned_rows(summary: &str) -> u64 {
    summary
        .split_whitespace()
        .find_map(|w| w.strip_prefix("abandoned_rows="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no abandoned_rows in {summary}"))
}

/// A shard whose every replica is frozen (SIGSTOP): `/readyz` says not
/// ready, and ready again after SIGCONT; SIGTERM while it is frozen exits
/// within `drain_timeout` + 2 s (D5) with exit code 2 and the abandoned
/// count in the summary, and a restart with the shard back loses nothing
/// (D1).
#[test]
fn a_frozen_shard_turns_readyz_off_and_sigterm_abandons_in_time_then_nothing_is_lost() {
    let Some(shards) = clickhouse_shards() else {
        return;
    };
    let _alone = servers();
    let table = Table::create_replicated(&shards, "cfrozen");
    let (topic, partitions, part) = ("flights", 4, 1_000u64);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    let brokers = mock.bootstrap_servers();
    let lines: Vec<String> = (0..3 * part).map(flight_row).collect();
    let phase = |i: u64| &lines[(i * part) as usize..((i + 1) * part) as usize];
    let group = format!("e2e-cfrozen-{}", std::process::id());
    let port = free_port();
    let drain = Duration::from_secs(3);
    let yaml = cluster_config(&group, &brokers, topic, &shards, &table.name, port)
        .replace("drain_timeout: 10s", "drain_timeout: 3s")
        .replace(
            "linger: 100ms }",
            "linger: 100ms }\n    write_timeout: 500ms\n    \
             retry: { initial: 100ms, max: 500ms, max_attempts: 1000 }",
        );
    assert!(yaml.contains("write_timeout: 500ms"), "{yaml}");

    // Part 1 lands with every server up.
    produce(&brokers, topic, partitions, phase(0));
    let spate = Spate::start("cfrozen", &yaml);
    await_commits(&spate, &brokers, &group, topic, partitions, port);

    // Part 2 with shard 1 frozen: its breakers open, /readyz says not ready;
    // thawed, a replica answers again and /readyz says ready.
    {
        let _frozen = Frozen::stop(&shards[1]);
        produce(&brokers, topic, partitions, phase(1));
        await_readyz(&spate, port, 503, Duration::from_secs(30));
    }
    await_readyz(&spate, port, 200, Duration::from_secs(30));
    println!("frozen shard: /readyz 503 while frozen, 200 after SIGCONT");

    // Part 3 with shard 1 frozen again, then SIGTERM: the drain gives up on
    // shard 1 at the deadline.
    let frozen = Frozen::stop(&shards[1]);
    produce(&brokers, topic, partitions, phase(2));
    let deadline = Instant::now() + DELIVERY;
    let shard0_part3 = format!(
        "SELECT count() FROM default.{} WHERE id >= {}",
        table.name,
        2 * part
    );
    while table.query_at(&shards[0][0], &shard0_part3) == "0" {
        assert!(
            Instant::now() < deadline,
            "part 3 never reached shard 0\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = spate.logs();
    let stopping = Instant::now();
    let (code, out) = spate.terminate();
    let took = stopping.elapsed();
    drop(frozen);
    println!(
        "frozen shard: SIGTERM -> exit {code:?} after {took:?}: {}",
        out.trim()
    );
    assert!(
        took < drain + Duration::from_secs(2),
        "exit took {took:?}, drain_timeout {drain:?} (D5)\n{logs}"
    );
    assert_eq!(code, Some(2), "stdout: {out}\n{logs}");
    assert!(abandoned_rows(&out) > 0, "{out}");

    // Restart with the shard back: everything lands (D1).
    let spate = Spate::start("cfrozen2", &yaml);
    await_commits(&spate, &brokers, &group, topic, partitions, port);
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    let (count, distinct) = check_routing(&table);
    println!(
        "frozen shard: {} produced, {count} rows, {distinct} distinct ids",
        3 * part
    );
    assert_eq!(distinct, 3 * part, "rows lost across the frozen shard (D1)");
}
