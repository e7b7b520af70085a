//! `format.json.mode: ndjson` end to end: the real `spate` binary reads
//! messages that each hold many NDJSON lines from an embedded broker
//! (librdkafka's mock cluster) and writes one row per line into the
//! ClickHouse at `SPATE_CLICKHOUSE_URL` (without it the test prints
//! `skipped: SPATE_CLICKHOUSE_URL not set` and passes).
//!
//! Checked: every good line lands, a message with a bad line is skipped as
//! one record (its other lines still land, D6), and the group's offsets
//! reach the end only behind durable rows (D1).

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spate::kafka_tools;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};

const FIXTURE: &str = include_str!("../fixtures/flights-20k.ndjson");
const RPC: Duration = Duration::from_secs(10);
const DELIVERY: Duration = Duration::from_secs(90);

fn flight_row(id: u64) -> String {
    let line = FIXTURE.lines().nth((id % 1000) as usize).unwrap();
    format!("{{\"id\":{id},{}", &line[1..])
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn ndjson_lines_become_rows_and_a_bad_line_skips_its_message() {
    let url = match std::env::var("SPATE_CLICKHOUSE_URL") {
        Ok(u) if !u.trim().is_empty() => u,
        _ => {
            let _ = writeln!(std::io::stderr(), "skipped: SPATE_CLICKHOUSE_URL not set");
            return;
        }
    };
    let table = format!("spate_ndjson_{}", std::process::id());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ch = HttpWriter::new(HttpWriterConfig::new("default", &table, Vec::new()));
    let sql = |q: &str| {
        rt.block_on(ch.query(&url, q))
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .trim()
            .to_owned()
    };
    sql(&format!("DROP TABLE IF EXISTS default.{table}"));
    sql(&format!(
        "CREATE TABLE default.{table} (id UInt64, date DateTime, delay Int32, \
         distance UInt32, origin String, destination String) ENGINE = MergeTree ORDER BY id"
    ));

    // 200 messages of 10 lines each (CRLF endings and a blank line mixed
    // in); message 77 has a bad second line.
    let (topic, partitions, per) = ("flights", 2, 10u64);
    let mut messages = Vec::new();
    for m in 0..200u64 {
        let mut lines: Vec<String> = (0..per).map(|l| flight_row(m * per + l)).collect();
        if m == 77 {
            lines[1] = lines[1].replace("\"delay\":", "\"delay\":\"abc\",\"x\":");
        }
        messages.push(format!("{}\r\n\n", lines.join("\n")));
    }
    let mock = kafka_tools::start_broker(topic, partitions).unwrap();
    let brokers = mock.bootstrap_servers();
    kafka_tools::produce_lines(
        &brokers,
        topic,
        partitions,
        messages.iter().map(String::as_bytes),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();

    let dir = std::env::temp_dir();
    let config = dir.join(format!("spate-ndjson-{}.yaml", std::process::id()));
    let log = dir.join(format!("spate-ndjson-{}.log", std::process::id()));
    let group = format!("ndjson-{}", std::process::id());
    std::fs::write(
        &config,
        format!(
            r#"
pipeline: {{ name: {group}, threads: 1 }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: [{topic}]
    group_id: "{group}"
format: {{ json: {{ mode: ndjson, time_formats: ["%Y/%m/%d %H:%M"] }} }}
on_error: {{ policy: skip }}
sink:
  clickhouse:
    shards: [["{url}"]]
    table: {table}
    batch: {{ max_rows: 500, linger: 100ms }}
admin: {{ listen: "off" }}
"#
        ),
    )
    .unwrap();
    let spate = Running(
        Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["run", "-c"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn spate"),
    );
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let ends = kafka_tools::end_offsets(&brokers, topic, partitions, RPC).unwrap();
    let deadline = Instant::now() + DELIVERY;
    loop {
        assert!(Instant::now() < deadline, "not committed\n{}", logs());
        let committed =
            kafka_tools::committed_offsets(&brokers, &group, topic, partitions, RPC).unwrap();
        if ends
            .iter()
            .all(|(p, e)| committed.get(p) == Some(&Some(*e)))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(spate);
    let _ = std::fs::remove_file(&config);

    // Every line but the bad one landed, each once.
    let want = 200 * per - 1;
    let count: u64 = sql(&format!("SELECT count() FROM default.{table}"))
        .parse()
        .unwrap();
    let distinct: u64 = sql(&format!("SELECT uniqExact(id) FROM default.{table}"))
        .parse()
        .unwrap();
    assert_eq!(distinct, want, "{}", logs());
    assert!(count >= want);
    assert_eq!(
        sql(&format!(
            "SELECT count() FROM default.{table} WHERE id = {}",
            77 * per + 1
        )),
        "0"
    );
    sql(&format!("DROP TABLE default.{table}"));
    let _ = std::fs::remove_file(&log);
}
