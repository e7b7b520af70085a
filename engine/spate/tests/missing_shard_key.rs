//! A record without its shard key is a record error under the policy
//! (issue 19 item 4): with `on_error: skip` it is skipped, counted (reason
//! `encode`) and dead-lettered with a reason naming the shard key, while the
//! other rows land. The real binary, an embedded broker, and the ClickHouse
//! at `SPATE_CLICKHOUSE_URL` as two shards (skipped without it).

mod common;

use std::time::{Duration, Instant};

use common::*;
use spate::kafka_tools;

/// `spate.reason` of every message of `topic` partition 0, up to `n`.
fn dead_letter_reasons(brokers: &str, topic: &str, n: usize) -> Vec<String> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Headers;
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "missing-key-dlq-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + DELIVERY;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        let reason = m
            .headers()
            .and_then(|h| {
                h.iter()
                    .find(|h| h.key == "spate.reason")
                    .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
            })
            .unwrap_or_default();
        out.push(reason);
    }
    out
}

#[test]
fn a_record_without_its_shard_key_is_skipped_counted_and_dead_lettered() {
    let Some(url) = clickhouse_url() else { return };
    let table = Table::create(&url, "nokey");
    let (topic, dlq, partitions) = ("flights", "flights-dlq", 2);
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    mock.create_topic(dlq, 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let mut lines: Vec<String> = (0..500).map(flight_row).collect();
    // Five rows with the key misspelled: `idd` instead of `id`.
    for i in 0..5 {
        let row = flight_row(1_000 + i).replacen("\"id\":", "\"idd\":", 1);
        lines.insert(50 + 90 * i as usize, row);
    }
    produce(&brokers, topic, partitions, &lines);
    let port = free_port();
    let group = format!("e2e-nokey-{}", std::process::id());
    let yaml = with_shards(
        &config(
            &group,
            &brokers,
            topic,
            &url,
            &table.name,
            port,
            &format!("{{ policy: skip, dead_letter: {{ topic: {dlq} }} }}"),
        ),
        &url,
        &[vec![url.clone()], vec![url.clone()]],
    );
    let spate = Spate::start("nokey", &yaml);
    await_commits(&spate, &brokers, &group, topic, partitions, port);
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
    let reasons = dead_letter_reasons(&brokers, dlq, 5);
    assert_eq!(reasons.len(), 5, "dead letters: {reasons:?}");
    for r in &reasons {
        assert!(
            r.contains("shard key field `id`"),
            "the dead letter names the shard key: {r}"
        );
    }
}
