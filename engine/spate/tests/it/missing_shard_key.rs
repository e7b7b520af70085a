//! A record without its shard key is a record error under the policy
//! (issue 19 item 4): with `on_error: skip` it is skipped, counted (reason
//! `encode`) and dead-lettered with a reason naming the shard key, while the
//! other rows land. The real binary, an embedded broker, and the ClickHouse
//! at `SPATE_CLICKHOUSE_URL` as two shards (skipped without it).

use crate::common;

use common::*;

#[test]
fn a_record_without_its_shard_key_is_skipped_counted_and_dead_lettered() {
    let Some(url) = clickhouse_url() else { return };
    let table = Table::create(&url, "nokey");
    let dlq = "flights-dlq";
    let feed = Feed::mock("flights", 2, "e2e-nokey");
    feed.broker.create_topic(dlq, 1);
    let mut lines: Vec<String> = (0..500).map(flight_row).collect();
    // Five rows with the key misspelled: `idd` instead of `id`.
    for i in 0..5 {
        let row = flight_row(1_000 + i).replacen("\"id\":", "\"idd\":", 1);
        lines.insert(50 + 90 * i as usize, row);
    }
    feed.produce(&lines);
    let yaml = with_shards(
        &feed.config(
            &url,
            &table.name,
            &format!("{{ policy: skip, dead_letter: {{ topic: {dlq} }} }}"),
        ),
        &url,
        &[vec![url.clone()], vec![url.clone()]],
    );
    let spate = Spate::start("nokey", &yaml);
    feed.await_commits(&spate);
    let port = feed.port;
    let skipped = metric(port, "spate_records_skipped_total");
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("skipped=5"), "summary: {out}");
    assert_eq!(skipped, 5.0);
    let (_, distinct) = table.landed();
    assert_eq!(
        distinct, 500,
        "the keyed rows land (both shards are this table)"
    );
    let reasons: Vec<String> = consume(&feed.brokers, "missing-key-dlq-reader", dlq, 5)
        .iter()
        .map(|m| header(m, "spate.reason").to_owned())
        .collect();
    assert_eq!(reasons.len(), 5, "dead letters: {reasons:?}");
    for r in &reasons {
        assert!(
            r.contains("shard key field `id`"),
            "the dead letter names the shard key: {r}"
        );
    }
}
