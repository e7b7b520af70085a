//! Against a real ClickHouse server (opt-in): set `SPATE_CLICKHOUSE_URL` to
//! its HTTP URL, e.g. from `ci/clickhouse.sh start 1`. Without it every test
//! here prints `skipped: SPATE_CLICKHOUSE_URL not set` (on stderr, past the
//! test harness's capture) and returns.
//!
//! Each test creates its own database, maps JSON rows through the schema
//! probe, the INSERT plan and the JSON encoder, inserts them with the HTTP
//! writer, and reads them back with `SELECT ... FORMAT JSONEachRow`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Value, json};
use spate_clickhouse::writer::{
    Compression, HttpWriter, HttpWriterConfig, InsertFormat, TlsOptions, tls,
};
use spate_core::ack::{AckIssuer, AckSet, Outcome, ack_channel};
use spate_core::budget::BudgetPermit;
use spate_core::record::TopicPartition;
use spate_core::sink::{Chunk, RunNonce, SinkConfig, SinkPool, Writer};
use spate_formats::json::JsonRowEncoder;
use spate_row::coerce::{EpochUnit, TimeRules};
use spate_row::schema::{
    InsertOptions, RowFormat, per_row_defaults_refused, plan_insert, row_format,
};
use spate_row::spec::{ColumnOptions, MappingOptions, MissingValue};

use crate::common::{TestDb, endpoint, plan, server};

const FLIGHTS: &str = spate_testkit::fixtures::FLIGHTS_50;

/// Probes the table, plans the INSERT, encodes `json_rows` and returns the
/// encoder's writer config plus the encoded body.
async fn encode_for(db: &TestDb, table: &str, json_rows: &[&str]) -> (HttpWriter, Bytes) {
    encode_as(db, table, json_rows, InsertFormat::Native).await
}

/// [`encode_for`] with a writer for `format`; the writer's columns carry the
/// server's type text, as the service's plan does.
async fn encode_as(
    db: &TestDb,
    table: &str,
    json_rows: &[&str],
    format: InsertFormat,
) -> (HttpWriter, Bytes) {
    let (mut enc, writer_columns) = plan(db, table).await;
    let mut buf = Vec::new();
    for row in json_rows {
        enc.encode_json(row.as_bytes(), &mut buf)
            .unwrap_or_else(|e| panic!("{e}: {row}"));
    }
    let mut config = HttpWriterConfig::new(&db.name, table, writer_columns);
    config.format = format;
    (HttpWriter::new(config), Bytes::from(buf))
}

#[tokio::test]
async fn types_round_trip_through_a_real_server() {
    types_round_trip(InsertFormat::Native, "types").await;
}

#[tokio::test]
async fn types_round_trip_as_rowbinary() {
    types_round_trip(InsertFormat::RowBinary, "types_rb").await;
}

async fn types_round_trip(format: InsertFormat, tag: &str) {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", tag).await;
    db.sql(&format!(
        "CREATE TABLE {}.t (id UInt32, i8 Int8, u8 UInt8, i64 Int64, u64 UInt64, f32 Float32, \
         f64 Float64, s String, fs FixedString(3), d Date, dt DateTime('UTC'), dec Decimal(18, 4), \
         u UUID, e Enum8('a' = 1, 'b' = -2), n Nullable(Int32), an Array(Nullable(Float64)), \
         lc LowCardinality(String), lcn LowCardinality(Nullable(String)), tup Tuple(UInt8, String), \
         def String DEFAULT 'dflt', ins DateTime MATERIALIZED now()) ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let rows = [
        r#"{"id":1,"i8":-128,"u8":255,"i64":"-9223372036854775808","u64":18446744073709551615,
            "f32":"NaN","f64":"-Infinity","s":"","fs":"ab","d":"2000-03-01","dt":1517966773840,
            "dec":"12345.6789","u":"61f0c404-5cb3-11e7-907b-a6006ad3dba0","e":"b","n":null,
            "an":[1.5,null],"lc":"h\u00e9llo \u2713","lcn":null,"tup":[1,"a"]}"#,
        r#"{"id":2,"i8":127,"u8":0,"i64":9223372036854775807,"u64":0,"f32":1.5,"f64":"inf",
            "s":"unicode: 日本語 🎉","fs":"abc","d":"2149-06-06","dt":"2018-02-07T01:26:13Z",
            "dec":0.1,"u":"00000000000000000000000000000001","e":"a","n":-5,"an":[],"lc":"",
            "lcn":"x","tup":[0,""]}"#,
        r#"{"tup":[2,"z"],"id":3,"i8":0,"u8":1,"i64":0,"u64":"42","f32":0,"f64":1e-300,"s":"tab\tquote\"",
            "fs":"xyz","d":"1970-01-01","dt":"2106-02-07 06:28:15","dec":-0.0001,
            "u":"FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF","e":1,"an":[null],"lc":"z"}"#,
    ];
    let (writer, body) = encode_as(&db, "t", &rows, format).await;
    let ep = endpoint(&url);
    writer.probe(&ep).await.unwrap();
    // The token is also the query id: the two formats run side by side.
    let token = format!("it-{tag}-1");
    writer.insert(&ep, vec![body], &token).await.unwrap();

    // Dates and times compare as stored numbers: 18.16 stores Date 65535
    // (2149-06-06) and DateTime 2^32-1 (2106-02-07 06:28:15) but prints them
    // wrongly (its date table ends in February 2106).
    let got = db
        .rows(&format!(
            "SELECT id, i8, u8, toString(i64) AS i64, toString(u64) AS u64, toString(f32) AS f32, \
             toString(f64) AS f64, s, fs, toUInt16(d) AS d, toUInt32(dt) AS dt, toString(dec) AS dec, \
             toString(u) AS u, toString(e) AS e, n, an, lc, lcn, tup, def, ins > 0 AS ins_set \
             FROM {}.t ORDER BY id FORMAT JSONEachRow",
            db.name
        ))
        .await;
    let want = [
        json!({"id":1,"i8":-128,"u8":255,"i64":"-9223372036854775808","u64":"18446744073709551615",
            "f32":"nan","f64":"-inf","s":"","fs":"ab\u{0}","d":11017,"dt":1517966773,
            "dec":"12345.6789","u":"61f0c404-5cb3-11e7-907b-a6006ad3dba0","e":"b","n":null,
            "an":[1.5,null],"lc":"héllo ✓","lcn":null,"tup":[1,"a"],"def":"dflt","ins_set":1}),
        json!({"id":2,"i8":127,"u8":0,"i64":"9223372036854775807","u64":"0","f32":"1.5","f64":"inf",
            "s":"unicode: 日本語 🎉","fs":"abc","d":65535,"dt":1517966773,
            "dec":"0.1000","u":"00000000-0000-0000-0000-000000000001","e":"a","n":-5,"an":[],"lc":"",
            "lcn":"x","tup":[0,""],"def":"dflt","ins_set":1}),
        json!({"id":3,"i8":0,"u8":1,"i64":"0","u64":"42","f32":"0","f64":"1e-300","s":"tab\tquote\"",
            "fs":"xyz","d":0,"dt":4_294_967_295u32,"dec":"-0.0001",
            "u":"ffffffff-ffff-ffff-ffff-ffffffffffff","e":"a","n":null,"an":[null],"lc":"z",
            "lcn":null,"tup":[2,"z"],"def":"dflt","ins_set":1}),
    ];
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w);
    }
    db.drop().await;
}

#[tokio::test]
async fn fatal_errors_carry_the_servers_message() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "fatal").await;
    db.sql(&format!(
        "CREATE TABLE {}.t (id UInt32) ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let ep = endpoint(&url);

    let nope = HttpWriter::new(HttpWriterConfig::new(
        &db.name,
        "nope",
        vec![("id".into(), "UInt32".into())],
    ));
    let e = nope
        .insert(&ep, vec![Bytes::from_static(&[1, 0, 0, 0])], "it-fatal-1")
        .await
        .unwrap_err();
    assert!(e.is_fatal(), "{e}");
    // The schema re-read before the first insert finds no table.
    assert!(e.message.contains("nope does not exist"), "{e}");
    let e = nope.probe(&ep).await.unwrap_err();
    assert!(e.is_fatal() && e.message.contains("does not exist"), "{e}");

    let wrong_type = HttpWriter::new(HttpWriterConfig::new(
        &db.name,
        "t",
        vec![("id".into(), "String".into())],
    ));
    let e = wrong_type.probe(&ep).await.unwrap_err();
    assert!(e.is_fatal() && e.message.contains("UInt32"), "{e}");

    let unknown_column = HttpWriter::new(HttpWriterConfig::new(
        &db.name,
        "t",
        vec![("nope".into(), "UInt32".into())],
    ));
    let e = unknown_column
        .insert(&ep, vec![Bytes::from_static(&[1, 0, 0, 0])], "it-fatal-2")
        .await
        .unwrap_err();
    assert!(e.is_fatal(), "{e}");
    assert!(e.message.contains("nope"), "{e}");

    // Half a row: the server cannot read it; no retry will help.
    let ok = HttpWriter::new(HttpWriterConfig::new(
        &db.name,
        "t",
        vec![("id".into(), "UInt32".into())],
    ));
    let e = ok
        .insert(&ep, vec![Bytes::from_static(&[1, 0])], "it-fatal-3")
        .await
        .unwrap_err();
    assert!(e.is_fatal(), "{e}");
    assert_eq!(
        db.sql(&format!("SELECT count() FROM {}.t", db.name))
            .await
            .trim(),
        "0"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_refused_connection_is_retryable() {
    let Some(_url) = server() else { return };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let w = HttpWriter::new(HttpWriterConfig::new(
        "db",
        "t",
        vec![("id".into(), "UInt32".into())],
    ));
    let e = w.probe(&endpoint(&url)).await.unwrap_err();
    assert!(!e.is_fatal(), "{e}");
    let e = w
        .insert(
            &endpoint(&url),
            vec![Bytes::from_static(&[1, 0, 0, 0])],
            "x",
        )
        .await
        .unwrap_err();
    assert!(!e.is_fatal(), "{e}");
}

#[tokio::test]
async fn flights_flow_through_the_sink_pool() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "pool").await;
    db.sql(&format!(
        "CREATE TABLE {}.flights (date DateTime('UTC'), delay Int32, distance UInt32, \
         origin String, destination String) ENGINE = MergeTree ORDER BY date",
        db.name
    ))
    .await;
    let probe = HttpWriter::new(HttpWriterConfig::new(&db.name, "flights", Vec::new()));
    let columns = plan_insert(
        &probe.table_schema(&url).await.unwrap(),
        &InsertOptions::default(),
    )
    .unwrap();
    let writer_columns = columns
        .iter()
        .map(|c| (c.name.clone(), c.ty.to_string()))
        .collect();
    let options = MappingOptions {
        time: spate_row::coerce::TimeRules {
            formats: vec![spate_row::time::TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..Default::default()
        },
        ..MappingOptions::default()
    };
    let mut enc = JsonRowEncoder::new(columns, options).unwrap();

    let writer = Arc::new(HttpWriter::new(HttpWriterConfig::new(
        &db.name,
        "flights",
        writer_columns,
    )));
    let pool = SinkPool::start(
        SinkConfig::new("it", vec![vec![url.clone()]]),
        writer,
        RunNonce::from_u64(7),
        &tokio::runtime::Handle::current(),
    )
    .unwrap();
    for report in pool.probe(Duration::from_secs(10)).await {
        report.result.unwrap();
    }
    let (tx, mut rx) = ack_channel();
    let tp = TopicPartition::new("flights", 0);
    let mut issuer = AckIssuer::new(tp, 1, tx);
    let lines: Vec<&str> = FLIGHTS.lines().collect();
    for (i, chunk_lines) in lines.chunks(10).enumerate() {
        let first = (i * 10) as i64;
        let ack = issuer.issue(first, first + chunk_lines.len() as i64 - 1);
        let mut buf = Vec::new();
        for l in chunk_lines {
            enc.encode_json(l.as_bytes(), &mut buf).unwrap();
        }
        let mut acks = AckSet::new();
        acks.push(&ack);
        drop(ack);
        let chunk = Chunk::new(
            Bytes::from(buf),
            chunk_lines.len() as u64,
            acks,
            BudgetPermit::unbounded(),
        );
        pool.handle().try_send(0, chunk).unwrap();
    }
    drop(issuer);
    let report = pool
        .drain(tokio::time::Instant::now() + Duration::from_secs(20))
        .await;
    assert!(report.is_clean(), "{report:?}");
    let mut delivered = 0;
    while let Some(r) = rx.recv().await {
        assert_eq!(r.outcome, Outcome::Delivered);
        delivered += 1;
    }
    assert_eq!(delivered, 5);
    let got = db
        .rows(&format!(
            "SELECT count() AS n, sum(delay) AS delay, toString(min(date)) AS first FROM {}.flights FORMAT JSONEachRow",
            db.name
        ))
        .await;
    let want_delay: i64 = lines
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["delay"]
                .as_i64()
                .unwrap()
        })
        .sum();
    assert_eq!(got[0]["n"], json!("50"));
    assert_eq!(got[0]["delay"], json!(want_delay.to_string()));
    assert_eq!(got[0]["first"], json!("2001-01-01 00:47:00"));
    db.drop().await;
}

/// The 50 flight rows through `writer` (compressed or over TLS as it is
/// configured) at `url`; returns the rows' summed delay, for the read-back.
async fn insert_flights(db: &TestDb, url: &str, writer: &HttpWriter, token: &str) -> i64 {
    let probe = HttpWriter::new(HttpWriterConfig::new(&db.name, "flights", Vec::new()));
    let columns = plan_insert(
        &probe.table_schema(&db.url).await.unwrap(),
        &InsertOptions::default(),
    )
    .unwrap();
    let options = MappingOptions {
        time: spate_row::coerce::TimeRules {
            formats: vec![spate_row::time::TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..Default::default()
        },
        ..MappingOptions::default()
    };
    let mut enc = JsonRowEncoder::new(columns, options).unwrap();
    // Two segments, as a sealed batch of two chunks would be.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut delay = 0;
    for (i, l) in FLIGHTS.lines().enumerate() {
        enc.encode_json(l.as_bytes(), if i < 20 { &mut a } else { &mut b })
            .unwrap();
        delay += serde_json::from_str::<Value>(l).unwrap()["delay"]
            .as_i64()
            .unwrap();
    }
    let ep = endpoint(url);
    writer.probe(&ep).await.unwrap();
    writer
        .insert(&ep, vec![Bytes::from(a), Bytes::from(b)], token)
        .await
        .unwrap();
    delay
}

async fn flights_table(db: &TestDb) -> Vec<(String, String)> {
    db.sql(&format!(
        "CREATE TABLE {}.flights (date DateTime('UTC'), delay Int32, distance UInt32, \
         origin String, destination String) ENGINE = MergeTree ORDER BY date",
        db.name
    ))
    .await;
    let probe = HttpWriter::new(HttpWriterConfig::new(&db.name, "flights", Vec::new()));
    let schema = probe.table_schema(&db.url).await.unwrap();
    plan_insert(&schema, &InsertOptions::default())
        .unwrap()
        .iter()
        .map(|c| (c.name.clone(), c.ty.to_string()))
        .collect()
}

async fn flights_summary(db: &TestDb) -> Value {
    db.rows(&format!(
        "SELECT count() AS n, sum(delay) AS delay FROM {}.flights FORMAT JSONEachRow",
        db.name
    ))
    .await
    .remove(0)
}

#[tokio::test]
async fn compressed_inserts_land_as_sent() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "compress").await;
    let columns = flights_table(&db).await;
    let mut delay = 0;
    for (i, c) in [
        Compression::Gzip { level: 1 },
        Compression::Deflate { level: 9 },
    ]
    .into_iter()
    .enumerate()
    {
        let mut config = HttpWriterConfig::new(&db.name, "flights", columns.clone());
        config.compression = c;
        let writer = HttpWriter::new(config);
        delay += insert_flights(&db, &url, &writer, &format!("it-compress-{i}")).await;
        // Each insert adds exactly its 50 rows: the server decoded the body
        // (a body it could not inflate would fail the insert, code 354).
        let got = flights_summary(&db).await;
        assert_eq!(got["n"], json!(((i + 1) * 50).to_string()), "{c:?}");
        assert_eq!(got["delay"], json!(delay.to_string()), "{c:?}");
    }
    db.drop().await;
}

/// A TLS-terminating proxy (rustls) in front of the plain server: accepts
/// TLS on a local port with a certificate made at test time for
/// `127.0.0.1` and `localhost`, and pipes the plain bytes to `upstream`.
struct TlsProxy {
    url: String,
    ca_file: std::path::PathBuf,
    handshakes: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    async fn start(upstream: &str) -> TlsProxy {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
                .unwrap();
        let dir = std::env::temp_dir().join(format!(
            "spate-tls-it-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, cert.pem()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(signing_key.serialize_der())),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        let handshakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&handshakes);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let upstream = upstream.clone();
                let count = Arc::clone(&count);
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mut plain = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsProxy {
            url,
            ca_file,
            handshakes,
            task,
        }
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(dir) = self.ca_file.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[tokio::test]
async fn https_replicas_work_with_a_ca_file_and_refuse_unknown_certificates() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "tls").await;
    let columns = flights_table(&db).await;
    let proxy = TlsProxy::start(&url).await;
    let ep = endpoint(&proxy.url);

    // The system's roots do not know the test certificate: refused at
    // connect (nothing reached the server), so retryable, naming the cause.
    let untrusting = HttpWriter::new(HttpWriterConfig::new(&db.name, "flights", columns.clone()));
    let e = untrusting.probe(&ep).await.unwrap_err();
    assert!(!e.is_fatal(), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
    assert_eq!(proxy.handshakes(), 0);

    // Trusting the CA file: the real writer inserts through TLS.
    let mut config = HttpWriterConfig::new(&db.name, "flights", columns.clone());
    config.tls = Some(
        tls::client_config(&TlsOptions {
            ca_file: Some(proxy.ca_file.clone()),
            insecure: false,
        })
        .unwrap(),
    );
    config.compression = Compression::Gzip { level: 1 };
    let writer = HttpWriter::new(config);
    let delay = insert_flights(&db, &proxy.url, &writer, "it-tls-1").await;
    assert!(proxy.handshakes() >= 1, "the insert went through the proxy");
    let got = flights_summary(&db).await;
    assert_eq!(got["n"], json!("50"));
    assert_eq!(got["delay"], json!(delay.to_string()));

    // `insecure` skips verification: also lands.
    let mut config = HttpWriterConfig::new(&db.name, "flights", columns);
    config.tls = Some(
        tls::client_config(&TlsOptions {
            ca_file: None,
            insecure: true,
        })
        .unwrap(),
    );
    let before = proxy.handshakes();
    insert_flights(&db, &proxy.url, &HttpWriter::new(config), "it-tls-2").await;
    assert!(proxy.handshakes() > before);
    assert_eq!(flights_summary(&db).await["n"], json!("100"));
    db.drop().await;
}

#[tokio::test]
async fn named_tuples_round_trip_from_objects_and_arrays() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "tuples").await;
    // 18.16 knows top-level named tuples (with Nullable elements); it
    // refuses named tuples nested in Array (syntax error), so those are
    // covered by the unit tests only.
    db.sql(&format!(
        "CREATE TABLE {}.t (id UInt32, t Tuple(a UInt8, b String, c Nullable(Int16))) \
         ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let rows = [
        r#"{"id":1,"t":{"a":1,"b":"x","c":-2}}"#,
        r#"{"id":2,"t":{"c":7,"extra":[1],"b":"y","a":255}}"#,
        r#"{"id":3,"t":{"b":"","a":0}}"#,
        r#"{"id":4,"t":[9,"pos",null]}"#,
    ];
    let (writer, body) = encode_for(&db, "t", &rows).await;
    let ep = endpoint(&url);
    writer.probe(&ep).await.unwrap();
    writer.insert(&ep, vec![body], "it-tuples-1").await.unwrap();
    let got = db
        .rows(&format!(
            "SELECT id, t FROM {}.t ORDER BY id FORMAT JSONEachRow",
            db.name
        ))
        .await;
    assert_eq!(
        got,
        [
            json!({"id":1,"t":[1,"x",-2]}),
            json!({"id":2,"t":[255,"y",7]}),
            json!({"id":3,"t":[0,"",null]}),
            json!({"id":4,"t":[9,"pos",null]}),
        ]
    );
    db.drop().await;
}

/// The Native layouts that differ from RowBinary, nested, on 18.16: arrays
/// of arrays, arrays of LowCardinality and of Nullable, Nested columns,
/// tuples holding LowCardinality, Enum16, FixedString, Decimal widths.
#[tokio::test]
async fn nested_native_layouts_land_on_a_real_server() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "nested").await;
    db.sql(&format!(
        "CREATE TABLE {}.t (id UInt32, i16 Int16, u32 UInt32, e16 Enum16('x' = 1000, 'y' = -1000), \
         fs FixedString(2), d9 Decimal(9, 2), d38 Decimal(38, 10), dt DateTime, ns Nullable(String), \
         aa Array(Array(UInt8)), alc Array(LowCardinality(String)), ans Array(Nullable(String)), \
         tup Tuple(LowCardinality(String), Nullable(UInt8)), lcd LowCardinality(UInt32), \
         n Nested(a UInt8, b String)) ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let rows = [
        r#"{"id":1,"i16":-32768,"u32":4294967295,"e16":"y","fs":"ab","d9":"1.5","d38":"-12345.0000000001",
            "dt":"2018-02-07 01:26:13","ns":null,"aa":[[1,2],[],[3]],"alc":["a","b","a"],"ans":[null,"x"],
            "tup":["k",null],"lcd":7,"n.a":[1,2],"n.b":["p","q"]}"#,
        r#"{"id":2,"i16":0,"u32":0,"e16":"x","fs":"","d9":0,"d38":0,"dt":0,"ns":"","aa":[],"alc":[],
            "ans":[],"tup":["",0],"lcd":7,"n.a":[],"n.b":[]}"#,
        r#"{"id":3,"i16":32767,"u32":1,"e16":1000,"fs":"z","d9":"-9999999.99","d38":"1e-10","dt":1,"ns":"s",
            "aa":[[]],"alc":[""],"ans":[""],"tup":["k",255],"lcd":8,"n.a":[9],"n.b":[""]}"#,
    ];
    let (writer, body) = encode_for(&db, "t", &rows).await;
    let ep = endpoint(&url);
    writer.probe(&ep).await.unwrap();
    writer.insert(&ep, vec![body], "it-nested-1").await.unwrap();
    let got = db
        .rows(&format!(
            "SELECT id, i16, u32, toString(e16) AS e16, fs, toString(d9) AS d9, toString(d38) AS d38, \
             toUInt32(dt) AS dt, ns, aa, alc, ans, tup, lcd, n.a, n.b FROM {}.t ORDER BY id \
             FORMAT JSONEachRow",
            db.name
        ))
        .await;
    let want = [
        json!({"id":1,"i16":-32768,"u32":4294967295u32,"e16":"y","fs":"ab","d9":"1.50",
            "d38":"-12345.0000000001","dt":1517966773,"ns":null,"aa":[[1,2],[],[3]],"alc":["a","b","a"],
            "ans":[null,"x"],"tup":["k",null],"lcd":7,"n.a":[1,2],"n.b":["p","q"]}),
        json!({"id":2,"i16":0,"u32":0,"e16":"x","fs":"\u{0}\u{0}","d9":"0.00","d38":"0.0000000000",
            "dt":0,"ns":"","aa":[],"alc":[],"ans":[],"tup":["",0],"lcd":7,"n.a":[],"n.b":[]}),
        json!({"id":3,"i16":32767,"u32":1,"e16":"x","fs":"z\u{0}","d9":"-9999999.99",
            "d38":"0.0000000001","dt":1,"ns":"s","aa":[[]],"alc":[""],"ans":[""],"tup":["k",255],
            "lcd":8,"n.a":[9],"n.b":[""]}),
    ];
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w);
    }
    db.drop().await;
}

/// Plans `table` as `spate run` does (probing RowBinaryWithDefaults),
/// encodes `json_rows` under `options` and inserts them. Returns the
/// encoding errors by row index.
async fn insert_mapped(
    db: &TestDb,
    table: &str,
    insert: InsertOptions,
    options: MappingOptions,
    json_rows: &[&str],
) -> Vec<(usize, String)> {
    let probe = HttpWriter::new(HttpWriterConfig::new(&db.name, table, Vec::new()));
    let schema = probe.table_schema(&db.url).await.unwrap();
    let insert = InsertOptions {
        server_defaults: probe
            .accepts_row_binary_with_defaults(&db.url)
            .await
            .unwrap(),
        ..insert
    };
    let columns = plan_insert(&schema, &insert).unwrap();
    let mut config = HttpWriterConfig::new(
        &db.name,
        table,
        columns
            .iter()
            .map(|c| (c.name.clone(), c.ty.to_string()))
            .collect(),
    );
    config.row_format = row_format(&columns);
    let mut enc = JsonRowEncoder::new(columns, options).unwrap();
    let mut buf = Vec::new();
    let mut errors = Vec::new();
    for (i, row) in json_rows.iter().enumerate() {
        let len = buf.len();
        if let Err(e) = enc.encode_json(row.as_bytes(), &mut buf) {
            buf.truncate(len);
            errors.push((i, e.to_string()));
        }
    }
    let writer = HttpWriter::new(config);
    let ep = endpoint(&db.url);
    writer.probe(&ep).await.unwrap();
    if !buf.is_empty() {
        writer
            .insert(&ep, vec![Bytes::from(buf)], &format!("it-{table}-1"))
            .await
            .unwrap();
    }
    errors
}

/// Issue 19 item 2 on 18.16: a field present for a DEFAULT column lands
/// (it was replaced by the DEFAULT), a missing one gets the constant
/// DEFAULT, including 18.16's `CAST(0, 'UInt32')` form (it was a record
/// error), and a per-row DEFAULT the server cannot apply is a record error
/// naming the column, listed before any row.
#[tokio::test]
async fn default_columns_keep_present_fields_and_apply_constant_defaults() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "defaults").await;
    db.sql(&format!(
        "CREATE TABLE {}.t (id UInt32, withdef UInt32 DEFAULT 7, z UInt32 DEFAULT 0, \
         s String DEFAULT 'x', d Date DEFAULT '2020-01-01', i Int8 DEFAULT -3, \
         n Nullable(UInt8) DEFAULT NULL, f Float64 DEFAULT -1.5) ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let errors = insert_mapped(
        &db,
        "t",
        InsertOptions::default(),
        MappingOptions::default(),
        &[
            r#"{"id":1,"withdef":99}"#,
            r#"{"id":2}"#,
            r#"{"id":3,"withdef":1,"z":2,"s":"y","d":"2001-02-03","i":4,"n":5,"f":0.5}"#,
            r#"{"id":4,"withdef":null,"n":null,"s":null}"#,
        ],
    )
    .await;
    assert!(errors.is_empty(), "{errors:?}");
    let got = db
        .rows(&format!(
            "SELECT id, withdef, z, s, toString(d) AS d, i, n, f FROM {}.t ORDER BY id \
             FORMAT JSONEachRow",
            db.name
        ))
        .await;
    assert_eq!(
        got,
        [
            json!({"id":1,"withdef":99,"z":0,"s":"x","d":"2020-01-01","i":-3,"n":null,"f":-1.5}),
            json!({"id":2,"withdef":7,"z":0,"s":"x","d":"2020-01-01","i":-3,"n":null,"f":-1.5}),
            json!({"id":3,"withdef":1,"z":2,"s":"y","d":"2001-02-03","i":4,"n":5,"f":0.5}),
            json!({"id":4,"withdef":7,"z":0,"s":"x","d":"2020-01-01","i":-3,"n":null,"f":-1.5}),
        ]
    );

    // A per-row DEFAULT on a server without RowBinaryWithDefaults.
    db.sql(&format!(
        "CREATE TABLE {}.p (id UInt32, at DateTime DEFAULT now(), nx Nullable(UInt64) DEFAULT id + 1) \
         ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let probe = HttpWriter::new(HttpWriterConfig::new(&db.name, "p", Vec::new()));
    assert!(
        !probe.accepts_row_binary_with_defaults(&url).await.unwrap(),
        "18.16 has no RowBinaryWithDefaults"
    );
    let schema = probe.table_schema(&url).await.unwrap();
    let plan = plan_insert(&schema, &InsertOptions::default()).unwrap();
    assert_eq!(row_format(&plan), RowFormat::RowBinary);
    assert_eq!(
        per_row_defaults_refused(&schema, &plan),
        [
            ("at".to_string(), "now()".to_string()),
            // 18.16 wraps it in a cast to the column's type: a cast of a
            // non-literal stays per row.
            (
                "nx".to_string(),
                "CAST(id + 1, 'Nullable(UInt64)')".to_string()
            )
        ]
    );
    assert!(plan[1..].iter().all(|c| c.missing == MissingValue::Reject));
    let errors = insert_mapped(
        &db,
        "p",
        InsertOptions::default(),
        MappingOptions::default(),
        &[
            r#"{"id":1,"at":"2020-01-01 00:00:00","nx":9}"#,
            r#"{"id":2,"nx":9}"#,
            r#"{"id":3,"at":0}"#,
        ],
    )
    .await;
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].0 == 1 && errors[0].1.contains("`at`"),
        "{errors:?}"
    );
    assert!(
        errors[1].0 == 2 && errors[1].1.contains("`nx`"),
        "{errors:?}"
    );
    let got = db
        .rows(&format!(
            "SELECT id, toUInt32(at) AS at, nx FROM {}.p ORDER BY id FORMAT JSONEachRow",
            db.name
        ))
        .await;
    assert_eq!(got, [json!({"id":1,"at":1_577_836_800u32,"nx":"9"})]);
    db.drop().await;
}

/// Issue 19 items 5 and 6 on 18.16: `time.epoch_unit` (86400000 ms is
/// 1970-01-02, auto reads it as seconds: 1972-09-27), per column too, and
/// `empty_as_null`.
#[tokio::test]
async fn epoch_units_and_empty_strings_land_as_configured() {
    let Some(url) = server() else { return };
    let db = TestDb::create(&url, "spate_it", "epochs").await;
    db.sql(&format!(
        "CREATE TABLE {}.t (id UInt32, a DateTime('UTC'), b DateTime('UTC'), \
         ns Nullable(String), sd String DEFAULT 'dflt', plain String) \
         ENGINE = MergeTree ORDER BY id",
        db.name
    ))
    .await;
    let mut insert = InsertOptions::default();
    insert.column_options.insert(
        "b".into(),
        ColumnOptions {
            epoch_unit: Some(EpochUnit::Seconds),
            ..ColumnOptions::default()
        },
    );
    let options = MappingOptions {
        time: TimeRules {
            epoch_unit: EpochUnit::Millis,
            ..TimeRules::default()
        },
        empty_as_null: true,
        ..MappingOptions::default()
    };
    let errors = insert_mapped(
        &db,
        "t",
        insert,
        options,
        &[
            r#"{"id":1,"a":86400000,"b":86400,"ns":"","sd":"","plain":""}"#,
            r#"{"id":2,"a":"86400999","b":"86400.9","ns":"v","sd":"w","plain":"p"}"#,
        ],
    )
    .await;
    assert!(errors.is_empty(), "{errors:?}");
    let got = db
        .rows(&format!(
            "SELECT id, toString(a) AS a, toString(b) AS b, ns, sd, plain FROM {}.t ORDER BY id \
             FORMAT JSONEachRow",
            db.name
        ))
        .await;
    assert_eq!(
        got,
        [
            json!({"id":1,"a":"1970-01-02 00:00:00","b":"1970-01-02 00:00:00","ns":null,"sd":"dflt","plain":""}),
            json!({"id":2,"a":"1970-01-02 00:00:00","b":"1970-01-02 00:00:00","ns":"v","sd":"w","plain":"p"}),
        ]
    );
    db.drop().await;
}
