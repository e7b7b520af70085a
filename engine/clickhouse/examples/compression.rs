//! What insert body compression costs and saves, on flight rows: for each
//! codec and level, the compressed size, the compression CPU time, and the
//! wall and client CPU time of inserting the rows into a real ClickHouse
//! through the HTTP writer (so loopback networking is included).
//!
//! ```text
//! export SPATE_CLICKHOUSE_URL=$(ci/clickhouse.sh start 1 | head -n1)
//! cargo run --release -p spate-clickhouse --example compression [flights.ndjson]
//! ```
//!
//! Without an argument it uses the crate's 50-row flights fixture. Rows are
//! repeated to `ROWS` (default 1,000,000) and sent as inserts of `BATCH` rows
//! (default 200,000), each batch in 8 segments as the sink pool sends them.
//! The table `spate_compression_bench` in `default` is recreated each run and
//! dropped at the end.

use std::time::Instant;

use bytes::Bytes;
use spate_clickhouse::writer::{Compression, HttpWriter, HttpWriterConfig};
use spate_core::sink::Endpoint;
use spate_formats::json::JsonRowEncoder;
use spate_row::coerce::TimeRules;
use spate_row::schema::{InsertOptions, plan_insert};
use spate_row::spec::MappingOptions;
use spate_row::time::TimeFormat;

const FIXTURE: &str = spate_testkit::fixtures::FLIGHTS_50;
const TABLE: &str = "spate_compression_bench";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User plus system CPU seconds of this process so far (Linux
/// `/proc/self/stat`, fields 14 and 15, in clock ticks of 1/100 s).
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let url = std::env::var("SPATE_CLICKHOUSE_URL").expect("set SPATE_CLICKHOUSE_URL");
    let text = match std::env::args().nth(1) {
        Some(p) => std::fs::read_to_string(&p).expect("read the ndjson file"),
        None => FIXTURE.to_owned(),
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let rows = env_usize("ROWS", 1_000_000);
    let batch = env_usize("BATCH", 200_000);

    let admin = HttpWriter::new(HttpWriterConfig::new("default", TABLE, Vec::new()));
    admin
        .query(&url, &format!("DROP TABLE IF EXISTS default.{TABLE}"))
        .await
        .unwrap();
    admin
        .query(
            &url,
            &format!(
                "CREATE TABLE default.{TABLE} (date DateTime('UTC'), delay Int32, \
                 distance UInt32, origin String, destination String) \
                 ENGINE = MergeTree ORDER BY date"
            ),
        )
        .await
        .unwrap();
    let schema = admin.table_schema(&url).await.unwrap();
    let columns = plan_insert(&schema, &InsertOptions::default()).unwrap();
    let typed: Vec<(String, String)> = columns
        .iter()
        .map(|c| (c.name.clone(), c.ty.to_string()))
        .collect();
    let options = MappingOptions {
        time: TimeRules {
            formats: vec![TimeFormat::compile("%Y/%m/%d %H:%M").unwrap()],
            ..TimeRules::default()
        },
        ..MappingOptions::default()
    };
    let mut enc = JsonRowEncoder::new(columns, options).unwrap();

    // Batches of `batch` rows, each in 8 segments.
    let mut batches: Vec<Vec<Bytes>> = Vec::new();
    let per_segment = batch.div_ceil(8);
    let mut seg = Vec::new();
    let mut cur: Vec<Bytes> = Vec::new();
    for i in 0..rows {
        enc.encode_json(lines[i % lines.len()].as_bytes(), &mut seg)
            .unwrap();
        let in_batch = i % batch + 1;
        if in_batch % per_segment == 0 || in_batch == batch || i + 1 == rows {
            cur.push(Bytes::from(std::mem::take(&mut seg)));
        }
        if in_batch == batch || i + 1 == rows {
            batches.push(std::mem::take(&mut cur));
        }
    }
    let raw: usize = batches.iter().flatten().map(Bytes::len).sum();
    println!(
        "{rows} flight rows, {} batches, {:.1} MiB RowBinary ({:.1} B/row)",
        batches.len(),
        raw as f64 / 1048576.0,
        raw as f64 / rows as f64
    );
    println!(
        "{:<10} {:>9} {:>7} {:>16} {:>15} {:>11} {:>13}",
        "codec",
        "MiB sent",
        "ratio",
        "compress CPU s",
        "CPU ns/in byte",
        "insert wall",
        "client CPU s"
    );
    let ep = Endpoint {
        shard: 0,
        replica: 0,
        url: url.as_str().into(),
    };
    for c in [
        Compression::None,
        Compression::Gzip { level: 1 },
        Compression::Gzip { level: 6 },
        Compression::Deflate { level: 1 },
    ] {
        // Compression alone, single core.
        // CPU, not wall: on a busy machine wall time says little.
        let cpu0 = cpu_secs();
        let mut sent = 0usize;
        for b in &batches {
            sent += c.apply(b.clone()).iter().map(Bytes::len).sum::<usize>();
        }
        let compress = cpu_secs() - cpu0;
        // Inserts through the writer (compressing again inside, as it does).
        let mut config = HttpWriterConfig::new("default", TABLE, typed.clone());
        config.compression = c;
        let writer = HttpWriter::new(config);
        writer.caps(&ep).await.unwrap();
        let (cpu0, t) = (cpu_secs(), Instant::now());
        for (i, b) in batches.iter().enumerate() {
            writer
                .insert(&ep, b.clone(), &format!("bench-{i}"))
                .await
                .unwrap();
        }
        let wall = t.elapsed().as_secs_f64();
        let cpu = cpu_secs() - cpu0;
        let name = match c {
            Compression::None => "none".to_owned(),
            Compression::Gzip { level } => format!("gzip/{level}"),
            Compression::Deflate { level } => format!("deflate/{level}"),
        };
        println!(
            "{:<10} {:>9.1} {:>7.3} {:>16.2} {:>15.1} {:>10.3}s {:>13.2}",
            name,
            sent as f64 / 1048576.0,
            sent as f64 / raw as f64,
            compress,
            compress * 1e9 / raw as f64,
            wall,
            cpu
        );
    }
    let n = admin
        .query(&url, &format!("SELECT count() FROM default.{TABLE}"))
        .await
        .unwrap();
    assert_eq!(
        n.trim().parse::<usize>().unwrap(),
        rows * 4,
        "every insert landed"
    );
    admin
        .query(&url, &format!("DROP TABLE default.{TABLE}"))
        .await
        .unwrap();
}
