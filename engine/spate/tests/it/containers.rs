//! End to end on containers (opt-in): the real `spate` binary between a
//! Redpanda broker and a current ClickHouse, both in Docker containers
//! started by testcontainers. Built with the `containers` feature (which
//! `bash ci/test.sh` always enables); runs only with `SPATE_CONTAINERS=1`
//! (`bash ci/test.sh --containers`, on a machine with a Docker engine),
//! otherwise it prints `skipped: SPATE_CONTAINERS not set to 1`.
//!
//! Why: the local servers of the other tests are ClickHouse 18.16 (no
//! `insert_deduplication_token`) and librdkafka's mock cluster. Here the
//! server knows the token, so the scenario checks what 18.16 cannot show:
//! every insert carries spate's batch token (D4, seen in `system.query_log`)
//! and a plain MergeTree with `non_replicated_deduplication_window` keeps
//! exactly one copy of every row (count equals produced), besides every row
//! landing and the offsets being committed to the end (D1).
//!
//! Images: `CLICKHOUSE_IMAGE` (default below) and `REDPANDA_IMAGE`, each
//! `name:tag`.

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spate::kafka_tools;
use spate_clickhouse::writer::{Credentials, HttpWriter, HttpWriterConfig};
use testcontainers::core::{ExecCommand, IntoContainerPort, WaitFor};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/flights-20k.ndjson"
));
const CLICKHOUSE_IMAGE: &str = "clickhouse/clickhouse-server:24.8";
const REDPANDA_IMAGE: &str = "docker.redpanda.com/redpandadata/redpanda:v24.2.7";
const RPC: Duration = Duration::from_secs(10);
const START: Duration = Duration::from_secs(120);
const DELIVERY: Duration = Duration::from_secs(120);
const USER: &str = "spate";
const PASSWORD: &str = "spate-secret";

fn image(var: &str, default: &str) -> GenericImage {
    let text = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    let (name, tag) = text.rsplit_once(':').expect("image as name:tag");
    GenericImage::new(name, tag)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Redpanda in dev-container mode, its Kafka API advertised on a host port
/// chosen here (the broker must know the address clients reach it by).
fn redpanda() -> (Container<GenericImage>, String) {
    let port = free_port();
    let container = image("REDPANDA_IMAGE", REDPANDA_IMAGE)
        .with_wait_for(WaitFor::message_on_stderr("Successfully started Redpanda!"))
        .with_mapped_port(port, 19092.tcp())
        .with_cmd([
            "redpanda".to_owned(),
            "start".to_owned(),
            "--mode".to_owned(),
            "dev-container".to_owned(),
            "--smp".to_owned(),
            "1".to_owned(),
            "--kafka-addr".to_owned(),
            "internal://0.0.0.0:9092,external://0.0.0.0:19092".to_owned(),
            "--advertise-kafka-addr".to_owned(),
            format!("internal://localhost:9092,external://127.0.0.1:{port}"),
        ])
        .with_startup_timeout(START)
        .start()
        .expect("start Redpanda (is a Docker engine running?)");
    (container, format!("127.0.0.1:{port}"))
}

/// A current ClickHouse with user `spate`; its HTTP URL once it answers.
fn clickhouse() -> (Container<GenericImage>, String) {
    let container = image("CLICKHOUSE_IMAGE", CLICKHOUSE_IMAGE)
        .with_exposed_port(8123.tcp())
        .with_env_var("CLICKHOUSE_USER", USER)
        .with_env_var("CLICKHOUSE_PASSWORD", PASSWORD)
        .with_startup_timeout(START)
        .start()
        .expect("start ClickHouse (is a Docker engine running?)");
    let port = container.get_host_port_ipv4(8123.tcp()).unwrap();
    (container, format!("http://127.0.0.1:{port}"))
}

struct Sql {
    rt: tokio::runtime::Runtime,
    ch: HttpWriter,
    url: String,
}

impl Sql {
    fn new(url: &str) -> Sql {
        let mut config = HttpWriterConfig::new("default", "", Vec::new());
        config.credentials = Some(Credentials {
            user: USER.into(),
            password: PASSWORD.into(),
        });
        Sql {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            ch: HttpWriter::new(config),
            url: url.to_owned(),
        }
    }

    fn query(&self, sql: &str) -> Result<String, String> {
        self.rt
            .block_on(self.ch.query(&self.url, sql))
            .map(|s| s.trim().to_owned())
            .map_err(|e| e.to_string())
    }

    fn number(&self, sql: &str) -> u64 {
        let text = self.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        text.parse().unwrap_or_else(|_| panic!("{sql}: {text}"))
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + START;
        while self.query("SELECT 1").as_deref() != Ok("1") {
            assert!(Instant::now() < deadline, "ClickHouse did not answer");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

struct Spate(Child, std::path::PathBuf);

impl Drop for Spate {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Spate {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

fn enabled() -> bool {
    if std::env::var("SPATE_CONTAINERS").as_deref() == Ok("1") {
        return true;
    }
    // Straight to stderr: the harness captures print macros only.
    let _ = writeln!(
        std::io::stderr(),
        "skipped: SPATE_CONTAINERS not set to 1 (bash ci/test.sh --containers; needs Docker)"
    );
    false
}

#[test]
fn flights_land_once_with_tokens_on_current_servers() {
    if !enabled() {
        return;
    }
    let (kafka, brokers) = redpanda();
    let (_ch, url) = clickhouse();
    let sql = Sql::new(&url);
    sql.wait_ready();
    let (topic, partitions, rows) = ("flights", 4, 20_000u64);

    let p = partitions.to_string();
    let create = kafka
        .exec(ExecCommand::new([
            "rpk",
            "topic",
            "create",
            topic,
            "-p",
            p.as_str(),
        ]))
        .expect("rpk topic create");
    drop(create);
    sql.query(
        "CREATE TABLE default.flights (id UInt64, date DateTime, delay Int32, \
         distance UInt32, origin String, destination String) ENGINE = MergeTree \
         ORDER BY id SETTINGS non_replicated_deduplication_window = 1000",
    )
    .unwrap();
    // D4 needs the token: this server must know it (18.16 does not).
    assert_eq!(
        sql.number("SELECT count() FROM system.settings WHERE name = 'insert_deduplication_token'"),
        1
    );

    let lines: Vec<String> = FIXTURE
        .lines()
        .enumerate()
        .take(rows as usize)
        .map(|(i, l)| format!("{{\"id\":{i},{}", &l[1..]))
        .collect();
    let produced = kafka_tools::produce_lines(
        &brokers,
        topic,
        partitions,
        lines.iter().map(|l| l.as_bytes()),
        "k",
        RPC,
        |_| {},
    )
    .unwrap();
    assert_eq!(produced, rows);

    let dir = std::env::temp_dir();
    let config = dir.join(format!("spate-containers-{}.yaml", std::process::id()));
    let log = dir.join(format!("spate-containers-{}.log", std::process::id()));
    std::fs::write(
        &config,
        format!(
            r#"
pipeline: {{ name: containers, threads: 2 }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: [{topic}]
    group_id: spate-containers
format: {{ json: {{ time_formats: ["%Y/%m/%d %H:%M"] }} }}
sink:
  clickhouse:
    shards: [["{url}"]]
    table: flights
    user: {USER}
    password: {PASSWORD}
    compression: gzip
    batch: {{ max_rows: 2000, linger: 100ms }}
admin: {{ listen: "off" }}
"#
        ),
    )
    .unwrap();
    let spate = Spate(
        Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["run", "-c"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn spate"),
        log,
    );

    let ends = kafka_tools::end_offsets(&brokers, topic, partitions, RPC).unwrap();
    let deadline = Instant::now() + DELIVERY;
    loop {
        assert!(
            Instant::now() < deadline,
            "not committed within {DELIVERY:?}\n{}",
            spate.logs()
        );
        let committed =
            kafka_tools::committed_offsets(&brokers, "spate-containers", topic, partitions, RPC)
                .unwrap();
        if ends
            .iter()
            .all(|(p, e)| committed.get(p) == Some(&Some(*e)))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(spate);

    // D1: every row landed; with tokens and the deduplication window, once.
    assert_eq!(
        sql.number("SELECT uniqExact(id) FROM default.flights"),
        rows
    );
    assert_eq!(sql.number("SELECT count() FROM default.flights"), rows);
    // D4: the inserts carried spate's batch token.
    sql.query("SYSTEM FLUSH LOGS").unwrap();
    let with_token = sql.number(
        "SELECT count() FROM system.query_log WHERE type = 'QueryFinish' \
         AND query_kind = 'Insert' AND query LIKE '%flights%' \
         AND Settings['insert_deduplication_token'] != ''",
    );
    assert!(
        with_token >= rows / 2000,
        "{with_token} inserts with a token"
    );
    let _ = std::fs::remove_file(&config);
}
