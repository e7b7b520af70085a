//! A table changed while spate runs (issue 19 item 1), against a real
//! ClickHouse (opt-in, `SPATE_CLICKHOUSE_URL`, as `real_server.rs`).
//!
//! The repro: `m (id UInt64, x UInt32, y UInt32)`, rows 0..9 written, then
//! `ALTER TABLE m MODIFY COLUMN x UInt64` (or `Nullable(UInt32)`), then rows
//! 10..14 under the old plan. Through the real sink pool, so the acks show
//! what the checkpointer would commit (D1: a failed ack freezes the
//! partition's watermark, tested in spate-core). Each format and refresh
//! setting is one case:
//!
//! - Native, no schema re-read, `MODIFY COLUMN x UInt64`: the server
//!   refuses the block (18.16: code 368, its types are not the table's);
//!   nothing of rows 10..14 lands; their ack fails; the error names the
//!   table and the old and new types (the writer re-reads the columns after
//!   the refusal).
//! - Native with the default settings, `Nullable(UInt32)`: 18.16 does not
//!   check a Native block's types (such a block crashed it, see
//!   `ServerCaps::native_type_check`), so the writer re-reads the columns
//!   before every insert there; the re-read finds the change and the batch
//!   fails before anything is sent.
//! - RowBinary with the default settings: likewise re-read before every
//!   insert, refused before sending.
//! - RowBinary without any re-read (the old behaviour): garbage lands and is
//!   acknowledged. Kept as a test so the hazard the other two close is
//!   shown to be real on this server.
//!
//! And a column added mid-run: the run goes on (the INSERT names its
//! columns), the new column gets its default until a restart re-plans; after
//! the restart a record without the field fails when the column has no
//! DEFAULT.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use spate_clickhouse::mapping::JsonRowEncoder;
use spate_clickhouse::writer::{
    DEFAULT_SCHEMA_REFRESH, HttpWriter, HttpWriterConfig, InsertFormat,
};
use spate_core::ack::{AckIssuer, AckSet, Outcome, ack_channel};
use spate_core::budget::BudgetPermit;
use spate_core::record::TopicPartition;
use spate_core::sink::{Chunk, RunNonce, SinkConfig, SinkPool, Writer};

mod common;

use common::{TestDb, endpoint, plan, server};

/// Rows `ids` of the issue's repro, encoded.
fn encode(enc: &mut JsonRowEncoder, ids: std::ops::Range<u64>) -> Bytes {
    let mut buf = Vec::new();
    for i in ids {
        let row = format!(r#"{{"id":{i},"x":{},"y":{}}}"#, 1000 + i, 2000 + i);
        enc.encode_json(row.as_bytes(), &mut buf).unwrap();
    }
    Bytes::from(buf)
}

struct Repro {
    /// Ack outcome of the batch of rows 0..9 and of rows 10..14.
    outcomes: Vec<Outcome>,
    /// The table's rows, in id order.
    rows: Vec<Value>,
    /// The writer's error for rows 10..14 sent once more directly, if any.
    error: Option<String>,
}

/// Runs the issue's repro with `alter` between the two batches.
async fn repro(
    url: &str,
    tag: &str,
    format: InsertFormat,
    refresh: Option<Duration>,
    alter: &str,
) -> Repro {
    let db = TestDb::create(url, "spate_sc", tag).await;
    db.sql(&format!(
        "CREATE TABLE {}.m (id UInt64, x UInt32, y UInt32) ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let (mut enc, typed) = plan(&db, "m").await;
    let mut config = HttpWriterConfig::new(&db.name, "m", typed);
    config.format = format;
    config.schema_refresh = refresh;
    let writer = Arc::new(HttpWriter::new(config));
    let mut sink = SinkConfig::new("sc", vec![vec![url.to_owned()]]);
    sink.batch.linger = Duration::from_millis(1);
    sink.retry.max_attempts = 2;
    let pool = SinkPool::start(
        sink,
        Arc::clone(&writer),
        RunNonce::from_u64(19),
        &tokio::runtime::Handle::current(),
    )
    .unwrap();
    for report in pool.probe(Duration::from_secs(10)).await {
        report.result.unwrap();
    }
    let (tx, mut rx) = ack_channel();
    let mut issuer = AckIssuer::new(TopicPartition::new("m", 0), 1, tx);
    let mut send = |first: i64, rows: std::ops::Range<u64>, body: Bytes| {
        let ack = issuer.issue(first, first + (rows.end - rows.start) as i64 - 1);
        let mut acks = AckSet::new();
        acks.push(&ack);
        drop(ack);
        let chunk = Chunk::new(body, rows.end - rows.start, acks, BudgetPermit::unbounded());
        pool.handle().try_send(0, chunk).unwrap();
    };
    send(0, 0..10, encode(&mut enc, 0..10));
    let first = rx.recv().await.unwrap().outcome;
    db.sql(&format!("ALTER TABLE {}.m {alter}", db.name)).await;
    let late = encode(&mut enc, 10..15);
    send(10, 10..15, late.clone());
    let second = rx.recv().await.unwrap().outcome;
    drop(issuer);
    pool.drain(tokio::time::Instant::now() + Duration::from_secs(10))
        .await;
    let ep = endpoint(url);
    let error = writer
        .insert(&ep, vec![late], "sc-direct")
        .await
        .err()
        .map(|e| e.to_string());
    let rows = db
        .rows(&format!(
            "SELECT toString(id) AS sid, toString(x) AS sx, toString(y) AS sy FROM {}.m \
             ORDER BY id FORMAT JSONEachRow",
            db.name
        ))
        .await;
    db.drop().await;
    Repro {
        outcomes: vec![first, second],
        rows,
        error,
    }
}

fn first_ten() -> Vec<Value> {
    (0..10u64)
        .map(|i| {
            json!({"sid": i.to_string(), "sx": (1000 + i).to_string(), "sy": (2000 + i).to_string()})
        })
        .collect()
}

fn assert_refused(r: &Repro, new_type: &str) {
    assert_eq!(r.outcomes[0], Outcome::Delivered, "rows 0..9 land");
    assert_eq!(
        r.outcomes[1],
        Outcome::Failed,
        "D1: rows 10..14 must not be acknowledged"
    );
    assert_eq!(r.rows, first_ten(), "nothing of rows 10..14 lands");
    let e = r.error.as_deref().expect("the direct insert fails too");
    assert!(e.contains("fatal"), "{e}");
    assert!(
        e.contains(".m changed while spate runs")
            && e.contains("`x` was UInt32")
            && e.contains(&format!("now {new_type}")),
        "the error names the table and both types: {e}"
    );
}

#[tokio::test]
async fn native_refuses_rows_after_a_column_type_changes() {
    let Some(url) = server() else { return };
    let r = repro(
        &url,
        "n64",
        InsertFormat::Native,
        None,
        "MODIFY COLUMN x UInt64",
    )
    .await;
    assert_refused(&r, "UInt64");
    // The server's own refusal is in the message: Native alone caught it.
    let e = r.error.unwrap();
    assert!(e.contains("the server said"), "{e}");
}

#[tokio::test]
async fn native_refuses_rows_after_a_column_becomes_nullable() {
    let Some(url) = server() else { return };
    let r = repro(
        &url,
        "nnull",
        InsertFormat::Native,
        Some(DEFAULT_SCHEMA_REFRESH),
        "MODIFY COLUMN x Nullable(UInt32)",
    )
    .await;
    assert_refused(&r, "Nullable(UInt32)");
}

#[tokio::test]
async fn rowbinary_rereads_the_schema_before_every_insert() {
    let Some(url) = server() else { return };
    for (tag, alter, ty) in [
        ("r64", "MODIFY COLUMN x UInt64", "UInt64"),
        (
            "rnull",
            "MODIFY COLUMN x Nullable(UInt32)",
            "Nullable(UInt32)",
        ),
    ] {
        let r = repro(
            &url,
            tag,
            InsertFormat::RowBinary,
            Some(DEFAULT_SCHEMA_REFRESH),
            alter,
        )
        .await;
        assert_refused(&r, ty);
        let e = r.error.unwrap();
        assert!(
            !e.contains("the server said"),
            "refused before sending: {e}"
        );
    }
}

/// The hazard itself, on this server: RowBinary rows of the old layout under
/// the new column type are stored as other numbers and acknowledged.
#[tokio::test]
async fn rowbinary_without_a_reread_stores_garbage() {
    let Some(url) = server() else { return };
    let r = repro(
        &url,
        "rgarbage",
        InsertFormat::RowBinary,
        None,
        "MODIFY COLUMN x UInt64",
    )
    .await;
    assert_eq!(r.outcomes, [Outcome::Delivered, Outcome::Delivered]);
    assert_eq!(r.error, None, "the direct insert lands too");
    // 10 good rows, and rows 10..14 twice (the pool, the direct insert) read
    // with the new layout: fewer rows, each wrong.
    let first: Vec<&Value> = r
        .rows
        .iter()
        .filter(|row| first_ten().contains(row))
        .collect();
    assert_eq!(first.len(), 10, "{:?}", r.rows);
    let wrong: Vec<&Value> = r
        .rows
        .iter()
        .filter(|row| !first_ten().contains(row))
        .collect();
    assert!(!wrong.is_empty(), "expected misread rows: {:?}", r.rows);
    for row in wrong {
        let id: u64 = row["sid"].as_str().unwrap().parse().unwrap();
        assert!(
            row["sx"] != json!((1000 + id).to_string())
                || row["sy"] != json!((2000 + id).to_string()),
            "{row}"
        );
    }
}

#[tokio::test]
async fn a_column_added_mid_run_gets_its_default_until_a_restart_replans() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_sc", "add").await;
    db.sql(&format!(
        "CREATE TABLE {}.m (id UInt64, x UInt32, y UInt32) ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let (mut enc, typed) = plan(&db, "m").await;
    let mut config = HttpWriterConfig::new(&db.name, "m", typed);
    config.schema_refresh = Some(Duration::ZERO);
    let writer = HttpWriter::new(config);
    let ep = endpoint(&url);
    writer.probe(&ep).await.unwrap();
    writer
        .insert(&ep, vec![encode(&mut enc, 0..2)], "add-1")
        .await
        .unwrap();
    db.sql(&format!("ALTER TABLE {}.m ADD COLUMN z UInt32", db.name))
        .await;
    // The old plan still writes correct rows: the INSERT names id, x, y.
    let mut buf = Vec::new();
    enc.encode_json(br#"{"id":2,"x":1002,"y":2002,"z":7}"#, &mut buf)
        .unwrap();
    writer
        .insert(&ep, vec![Bytes::from(buf)], "add-2")
        .await
        .unwrap();
    let rows = db
        .rows(&format!(
            "SELECT toString(id) AS id, x, z FROM {}.m ORDER BY id FORMAT JSONEachRow",
            db.name
        ))
        .await;
    assert_eq!(
        rows,
        [
            json!({"id":"0","x":1000,"z":0}),
            json!({"id":"1","x":1001,"z":0}),
            // z is not filled from the record until a restart re-plans.
            json!({"id":"2","x":1002,"z":0}),
        ]
    );
    // After a restart the plan names z (no DEFAULT): a record with z maps,
    // an old record without it is a record error naming z.
    let (mut enc, typed) = plan(&db, "m").await;
    assert!(typed.iter().any(|(n, _)| n == "z"), "{typed:?}");
    let mut buf = Vec::new();
    enc.encode_json(br#"{"id":3,"x":1003,"y":2003,"z":7}"#, &mut buf)
        .unwrap();
    let e = enc
        .encode_json(br#"{"id":4,"x":1004,"y":2004}"#, &mut buf)
        .unwrap_err();
    assert!(e.to_string().contains('z'), "{e}");
    db.drop().await;
}
