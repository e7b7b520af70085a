//! Kafka metadata as columns, end to end (issue 17 part 3): the `spate`
//! binary reads two topics of a real Apache Kafka broker (`ci/kafka.sh`, at
//! `SPATE_KAFKA_BROKERS`) into one table of the real ClickHouse 18.16 (at
//! `SPATE_CLICKHOUSE_URL`), and every metadata column lands with the value
//! the broker reported to the producer: partition, offset and timestamp
//! from the delivery reports (a `CreateTime` topic with producer-set
//! millisecond timestamps, and a `LogAppendTime` topic whose timestamps the
//! broker sets), the topic and timestamp type, the key (null on some
//! messages) and the headers (repeated names, a null value, none at all).
//!
//! 18.16 has neither Map nor DateTime64, and stores an `Array(Tuple(..))`
//! column as Nested subcolumns (`hs.1`, `hs.2`), so the timestamp lands in
//! a UInt64 (milliseconds) and as whole seconds in a DateTime
//! (`_timestamp_s`), and the headers as the Kafka engine's Nested
//! `_headers.name`/`_headers.value`; the mapper's byte-level tests cover
//! Map, Array(Tuple) and DateTime64 (`mapping::meta` unit tests).
//!
//! Without either component the test prints why and passes, except that
//! `SPATE_KAFKA_REQUIRED=1` (ci/test.sh) makes a missing broker a failure.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::message::{Header, Message, OwnedHeaders, Timestamp};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

use common::real::RealKafka;
use common::*;

/// What the broker reported for one produced message.
#[derive(Clone, Debug, PartialEq)]
struct Delivered {
    topic: String,
    partition: i32,
    offset: i64,
    timestamp: Timestamp,
}

/// Delivery reports by message id.
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<BTreeMap<u64, Result<Delivered, String>>>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<u64>;
    fn delivery(&self, result: &DeliveryResult<'_>, id: Box<u64>) {
        let r = match result {
            Ok(m) => Ok(Delivered {
                topic: m.topic().to_owned(),
                partition: m.partition(),
                offset: m.offset(),
                timestamp: m.timestamp(),
            }),
            Err((e, _)) => Err(e.to_string()),
        };
        self.0.lock().unwrap().insert(*id, r);
    }
}

/// Messages per topic.
const N: u64 = 60;
/// The first CreateTime timestamp (ms, not a whole second).
const T0: i64 = 1_700_000_000_123;

/// Message `id`'s key: none on every fifth.
fn key_of(id: u64) -> Option<String> {
    (id % 5 != 0).then(|| format!("k{id}"))
}

/// Message `id`'s headers: none, a repeated name, or a null value.
fn headers_of(id: u64) -> Vec<(&'static str, Option<String>)> {
    match id % 3 {
        0 => vec![],
        1 => vec![
            ("h", Some("a".into())),
            ("x", Some(format!("v{id}"))),
            ("h", Some("b".into())),
        ],
        _ => vec![("x", None), ("y", Some(format!("{id}")))],
    }
}

fn table_sql(name: &str) -> String {
    format!(
        "CREATE TABLE default.{name} (\
           id UInt64, \
           _topic String, \
           _partition Int32, \
           _offset UInt64, \
           _timestamp UInt64, \
           ts_s DateTime('UTC'), \
           _timestamp_type String, \
           _key Nullable(String), \
           _headers Nested(name String, value Nullable(String)), \
           hx Nullable(String), \
           hh String DEFAULT 'none', \
           hy Nullable(Int32)\
         ) ENGINE = MergeTree ORDER BY (_topic, id)"
    )
}

const MAPPING: &str = r#"
mapping:
  columns:
    ts_s: _timestamp_s
    hx: _header.x
    hh: _header.h
    hy: _header.y
"#;

#[test]
fn every_metadata_column_lands_as_the_broker_reported_it() {
    let Some(kafka) = RealKafka::from_env() else {
        return;
    };
    let Some(url) = clickhouse_url() else {
        return;
    };
    let rf = kafka.brokers.split(',').count().min(3) as i32;
    let pid = std::process::id();
    let (create, append) = (format!("meta-ct-{pid}"), format!("meta-lat-{pid}"));
    kafka.create_topic(&create, 2, rf, &[]);
    kafka.create_topic(
        &append,
        2,
        rf,
        &[("message.timestamp.type", "LogAppendTime")],
    );
    let table = Table::create(&url, "meta");
    table.query(&format!("DROP TABLE default.{}", table.name));
    table.query(&table_sql(&table.name));

    // Produce, keeping what the broker reported for every message.
    let reports = Reports::default();
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create_with_context(reports.clone())
        .unwrap();
    let mut sent = BTreeMap::new();
    for (t, topic) in [&create, &append].into_iter().enumerate() {
        for i in 0..N {
            let id = t as u64 * 1000 + i;
            let payload = format!(r#"{{"id":{id}}}"#);
            let mut headers = OwnedHeaders::new();
            for (name, value) in headers_of(i) {
                headers = headers.insert(Header {
                    key: name,
                    value: value.as_deref(),
                });
            }
            let key = key_of(i);
            let mut record = BaseRecord::with_opaque_to(topic, Box::new(id))
                .payload(&payload)
                .partition((i % 2) as i32)
                .headers(headers)
                .timestamp(T0 + i as i64 * 1001);
            if let Some(k) = &key {
                record = record.key(k);
            }
            producer
                .send(record)
                .unwrap_or_else(|(e, _)| panic!("produce {id}: {e}"));
            sent.insert(id, (topic.clone(), key, headers_of(i)));
        }
    }
    producer.flush(RPC).expect("flush");
    let reports = reports.0.lock().unwrap().clone();
    assert_eq!(reports.len(), sent.len(), "a delivery report per message");

    // spate reads both topics into the table.
    let port = free_port();
    let group = format!("meta-{pid}");
    let yaml = config(
        &group,
        &kafka.brokers,
        &format!("{create}, {append}"),
        &url,
        &table.name,
        port,
        "{ policy: fail }",
    ) + MAPPING;
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["check", "--sample", "200", "-c"])
        .arg({
            let p = std::env::temp_dir().join(format!("spate-meta-check-{pid}.yaml"));
            std::fs::write(&p, &yaml).unwrap();
            p
        })
        .output()
        .unwrap();
    let check_out = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        check.status.success() && !check_out.contains("PROBLEM"),
        "spate check --sample maps every record, metadata included:\n{check_out}"
    );
    for want in [
        "0 refused",
        "_offset",
        "kafka metadata (by name)",
        "_timestamp_s",
        "_header.x",
        "_headers.value",
    ] {
        assert!(
            check_out.contains(want),
            "spate check shows {want}:\n{check_out}"
        );
    }
    println!("{check_out}");
    let spate = Spate::start("meta", &yaml);
    let deadline = Instant::now() + DELIVERY;
    while table.number(&format!("SELECT count() FROM default.{}", table.name)) < 2 * N {
        assert!(
            Instant::now() < deadline,
            "not every row landed\n{}",
            spate.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (code, out) = spate.terminate();
    assert_eq!(code, Some(0), "{out}");

    let rows = table.query(&format!(
        "SELECT id, _topic, _partition, _offset, _timestamp, toUnixTimestamp(ts_s) AS ts_s, \
         _timestamp_type, _key, _headers.name, _headers.value, hx, hh, hy \
         FROM default.{} ORDER BY id FORMAT JSONEachRow",
        table.name
    ));
    let rows: Vec<serde_json::Value> = rows
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len() as u64, 2 * N, "each message once");
    println!(
        "metadata rows, e.g.:\n{}\n{}",
        rows[1],
        rows[N as usize + 2]
    );
    let mut seen_append = 0;
    for row in &rows {
        let id: u64 = row["id"].as_str().and_then(|s| s.parse().ok()).unwrap();
        let (topic, key, headers) = &sent[&id];
        let d = reports[&id]
            .as_ref()
            .unwrap_or_else(|e| panic!("message {id} not delivered: {e}"));
        let what = format!("message {id} ({d:?}): {row}");
        assert_eq!(&d.topic, topic);
        assert_eq!(row["_topic"], *topic, "{what}");
        assert_eq!(row["_partition"], d.partition, "{what}");
        // UInt64 and Int64 come as quoted numbers in JSONEachRow.
        assert_eq!(row["_offset"], d.offset.to_string(), "{what}");
        let (ms, kind) = match d.timestamp {
            Timestamp::CreateTime(ms) => (ms, "CreateTime"),
            Timestamp::LogAppendTime(ms) => (ms, "LogAppendTime"),
            Timestamp::NotAvailable => panic!("{what}: no timestamp reported"),
        };
        if topic == &append {
            seen_append += 1;
            assert_eq!(kind, "LogAppendTime", "{what}");
            assert_ne!(ms, T0 + (id % 1000) as i64 * 1001, "the broker's time");
        } else {
            assert_eq!(ms, T0 + id as i64 * 1001, "{what}");
        }
        assert_eq!(row["_timestamp"], ms.to_string(), "{what}");
        assert_eq!(row["ts_s"], ms.div_euclid(1000), "{what}");
        assert_eq!(row["_timestamp_type"], kind, "{what}");
        match key {
            Some(k) => assert_eq!(row["_key"], k.as_str(), "{what}"),
            None => assert!(row["_key"].is_null(), "{what}"),
        }
        let names: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
        assert_eq!(row["_headers.name"], serde_json::json!(names), "{what}");
        let values: Vec<Option<&str>> = headers.iter().map(|(_, v)| v.as_deref()).collect();
        assert_eq!(row["_headers.value"], serde_json::json!(values), "{what}");
        let last = |name: &str| {
            headers
                .iter()
                .rev()
                .find(|(n, _)| *n == name)
                .and_then(|(_, v)| v.clone())
        };
        assert_eq!(row["hx"], serde_json::json!(last("x")), "{what}");
        assert_eq!(
            row["hh"],
            last("h").unwrap_or_else(|| "none".into()),
            "{what}: the last `h`, else the DEFAULT"
        );
        let y: Option<i32> = last("y").map(|y| y.parse().unwrap());
        assert_eq!(row["hy"], serde_json::json!(y), "{what}");
    }
    assert_eq!(seen_append, N, "rows from the LogAppendTime topic");
    kafka.delete_topic(&create);
    kafka.delete_topic(&append);
}
