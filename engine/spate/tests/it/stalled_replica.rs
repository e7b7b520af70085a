//! The stalled-replica repro of issue 19 (item 3), against the real plain
//! MergeTree at `SPATE_CLICKHOUSE_URL` (skipped without it): the server is
//! SIGSTOPped longer than `sink.write_timeout` with batches in flight, so
//! several attempts of each batch time out and wait in its socket queue;
//! after SIGCONT the server runs what it finds. Because each insert carries
//! the batch token as its `query_id`, attempts of a batch that meet a still
//! running one are refused (code 216) and waited out instead of landing.
//!
//! Checked: every row lands (D1); the rows stored more than once are no more
//! than spate's `spate_sink_possible_duplicate_rows_total` (one copy per
//! attempt whose outcome was unknown); the log says "up to N times"; and
//! fewer copies landed than attempts timed out (the query id refused some):
//! without the query id every queued attempt lands.
//!
//! It runs alone on the server (`spate_testkit::serial::alone`): it freezes
//! the shared server, which no other test may be using meanwhile.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn a_stalled_server_stores_each_batch_at_most_once_per_unknown_attempt() {
    let Some(url) = clickhouse_url() else { return };
    let _alone = spate_testkit::serial::alone(&[Resource::ClickHouse]);
    let table = Table::create(&url, "stall");
    let feed = Feed::mock("flights", 2, "e2e-stall");
    let yaml = feed
        .config(&url, &table.name, "{ policy: fail }")
        .replace(
            "    batch: {",
            "    write_timeout: 1s\n    retry: { initial: 200ms, max: 400ms, max_attempts: 0 }\n    batch: {",
        );
    feed.produce_flights(0..1_000);
    let spate = Spate::start("stall", &yaml);
    feed.await_commits(&spate);

    // Batches in flight while the server is stopped for 5 write timeouts.
    let frozen = Frozen::stop(std::slice::from_ref(&url));
    feed.produce_flights(1_000..3_000);
    std::thread::sleep(Duration::from_secs(5));
    drop(frozen);
    feed.await_commits(&spate);
    // Let whatever the server still runs finish before counting.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = (0, 0);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let now = table.landed();
        if now == last {
            break;
        }
        last = now;
    }
    let (rows, distinct) = table.landed();
    let extra_rows = metric(feed.port, "spate_sink_possible_duplicate_rows_total") as u64;
    let extra_batches = metric(feed.port, "spate_sink_possible_duplicate_batches_total") as u64;
    let logs = spate.logs();
    let (code, out) = spate.terminate();
    println!(
        "rows {rows}, distinct {distinct}, duplicate rows {}, possible extra copies: \
         {extra_batches} batch(es), {extra_rows} rows; 216 waits in the log: {}",
        rows - distinct,
        logs.matches("still runs on the replica").count()
    );
    assert_eq!(code, Some(0), "{out}\n{logs}");
    assert_eq!(distinct, 3_000, "every row landed (D1)");
    assert!(
        rows - distinct <= extra_rows,
        "{} duplicate rows but spate counted at most {extra_rows} possible\n{logs}",
        rows - distinct
    );
    if extra_batches == 0 {
        // Where the server lacks a Native type check (18.16), each attempt
        // first re-reads the table's columns; when that read is what meets
        // the stopped server, no insert was sent, nothing is ambiguous, and
        // nothing may be stored twice.
        assert_eq!(
            rows, distinct,
            "no attempt was unknown, yet rows repeat\n{logs}"
        );
        println!("the stop met only schema re-reads: no insert was in flight");
        return;
    }
    assert!(logs.contains("up to "), "the log names the copies: {logs}");
    assert!(
        rows - distinct < extra_rows,
        "every timed-out attempt landed: the query id refused none\n{logs}"
    );
}
