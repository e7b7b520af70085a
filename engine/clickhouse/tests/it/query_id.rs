//! Against a real ClickHouse server (opt-in, `SPATE_CLICKHOUSE_URL`, as
//! `real_server.rs`): the insert carries the batch token as its `query_id`,
//! so while a query with that id still runs the server refuses the insert
//! (code 216) and the writer says [`WriteErrorKind::AlreadyRunning`]; once it
//! ended, the same token inserts. This is what stops a stalled server from
//! running every queued retry of a batch at once (issue 19 item 3).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
use spate_core::sink::{Endpoint, WriteErrorKind};

use crate::common::server;

#[tokio::test]
async fn an_insert_whose_token_is_a_running_query_id_is_refused_as_already_running() {
    let Some(url) = server() else { return };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let table = format!("spate_qid_{}_{nanos}", std::process::id());
    let admin = HttpWriter::new(HttpWriterConfig::new("default", "", Vec::new()));
    admin
        .query(
            &url,
            &format!("CREATE TABLE default.{table} (id UInt64) ENGINE = MergeTree ORDER BY id"),
        )
        .await
        .unwrap();
    let writer = HttpWriter::new(HttpWriterConfig::new(
        "default",
        table.as_str(),
        vec![("id".into(), "UInt64".into())],
    ));
    let endpoint = Endpoint {
        shard: 0,
        replica: 0,
        url: url.as_str().into(),
    };
    let token = format!("spate-qid-test-{nanos}");
    // A query holding the id for ~2 s (18.16 caps sleep() at 3 s), standing
    // in for an earlier attempt of the batch still running on the server.
    let holder = {
        let url = url.clone();
        let token = token.clone();
        tokio::spawn(async move {
            // `query_id` as a URL parameter of the holder's own request.
            let mut config = HttpWriterConfig::new("default", "", Vec::new());
            config.settings.push(("query_id".into(), token));
            HttpWriter::new(config).query(&url, "SELECT sleep(2)").await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let row = Bytes::from(7u64.to_le_bytes().to_vec());
    let err = writer
        .insert(&endpoint, vec![row.clone()], &token)
        .await
        .expect_err("the id is running: the insert must be refused");
    assert_eq!(err.kind, WriteErrorKind::AlreadyRunning, "{err}");
    assert!(err.message.contains("216"), "{err}");
    holder
        .await
        .unwrap()
        .expect("the holder query ends normally");
    // The holder ended: the same token inserts now.
    writer.insert(&endpoint, vec![row], &token).await.unwrap();
    let count = admin
        .query(&url, &format!("SELECT count() FROM default.{table}"))
        .await
        .unwrap();
    assert_eq!(count.trim(), "1");
    admin
        .query(&url, &format!("DROP TABLE default.{table}"))
        .await
        .unwrap();
}
