//! `spate demo`: the main job on one machine. An embedded broker is filled
//! with flight rows (the repository fixture repeated with distinct ids), the
//! demo table is created if missing, the real pipeline (the same assembly as
//! `spate run`) moves the rows into ClickHouse, and a summary says what
//! landed: the delivery mode (`--delivery`), rows produced, rows in
//! ClickHouse, distinct ids, duplicates (with the mode again), committed
//! offsets, a sample query, and the measured rates.
//!
//! The broker is pre-filled before the pipeline starts, so the rate measures
//! spate, not the producer. The mock broker keeps at most 5 MiB per
//! partition (shared/ENVIRONMENT.md), so the demo raises the partition count
//! to keep each under [`MAX_BYTES_PER_PARTITION`], and checks the low
//! watermarks before it counts.

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use spate::config::Config;
use spate::service;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
use spate_core::pipeline::Shutdown;
use spate_kafka::tools as kafka_tools;

use crate::{EXIT_FAILED, chain, current_thread, progress_bar};

/// The flight rows shipped with the repository (20,000 rows).
const FIXTURE: &str = include_str!("../fixtures/flights-20k.ndjson");
/// Preload bound per partition, under the mock broker's 5 MiB retention.
const MAX_BYTES_PER_PARTITION: u64 = 4 << 20;
/// How long the demo waits for everything to be committed.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(600);

/// `spate demo` flags.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// ClickHouse HTTP URL.
    #[arg(long, default_value = "http://127.0.0.1:8123")]
    clickhouse_url: String,
    /// Rows to produce (the fixture repeated with distinct ids).
    #[arg(long, default_value_t = 100_000)]
    rows: u64,
    /// Topic partitions (raised when needed to stay under the broker's
    /// retention).
    #[arg(long, default_value_t = 16)]
    partitions: i32,
    /// Pipeline threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Target table in database `default` (created if missing).
    #[arg(long, default_value = "spate_demo_flights")]
    table: String,
    /// Admin server address (`off` disables it).
    #[arg(long, default_value = "off")]
    admin: String,
    /// `pipeline.delivery`: `at_least_once` or `effectively_once` (then
    /// a table the demo creates gets `non_replicated_deduplication_window
    /// = 1000` where the server has that setting; on ClickHouse 18.16 the
    /// plain MergeTree is refused, with the fix, as `spate run` would).
    #[arg(long, default_value = "at_least_once", value_parser = ["at_least_once", "effectively_once"])]
    delivery: String,
}

/// CPU seconds (user + system) this process has used so far.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall (11th and 12th after the name).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds per thread group (thread name without trailing digits and
/// `#id`): which part of the process spent the CPU.
fn cpu_by_thread() -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close]
            .trim_end_matches(|c: char| c.is_ascii_digit() || c == '#' || c == '-' || c == '/')
            .to_owned();
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        *out.entry(name).or_insert(0.0) += (ticks(11) + ticks(12)) / 100.0;
    }
    out
}

/// Peak resident set size in MiB (`VmHWM`).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The sum of `spate_records_polled_total` over its labels in Prometheus
/// text.
fn polled(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(spate_core::metrics::RECORDS_POLLED))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Fixture line `i % 20k` with `"id":i` as its first field.
fn flight_row(lines: &[&str], id: u64) -> String {
    let line = lines[(id % lines.len() as u64) as usize];
    format!("{{\"id\":{id},{}", &line[1..])
}

pub(crate) fn demo(args: &DemoArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("spate demo: {}", chain(&*e));
            ExitCode::from(EXIT_FAILED)
        }
    }
}

type DemoError = Box<dyn std::error::Error>;

/// The demo's steps: the table, the rows into an embedded broker, the
/// pipeline run while its commits are watched, then what landed.
fn run(args: &DemoArgs) -> Result<ExitCode, DemoError> {
    let rt = current_thread();
    let table = &args.table;
    let ch = HttpWriter::new(HttpWriterConfig::new("default", table, Vec::new()));
    let url = args.clickhouse_url.as_str();
    let base = prepare_table(&rt, &ch, url, table, args.delivery == "effectively_once")?;
    let topic = "flights";
    let flights = produce_flights(args, base, topic)?;
    let group = format!("spate-demo-{base}");
    let yaml = demo_yaml(args, base, &flights.brokers, topic, &group, url);
    let config = Config::from_yaml(&yaml, |_| None)?;
    // Always recorded: the demo reads the polled count to time the run from
    // the first polled row (after the group join).
    let metrics = spate::telemetry::install()?;
    let plan = rt.block_on(service::plan(&config))?;
    let (pipeline, _) = service::build(&config, &plan)?;
    if args.admin != "off" {
        serve_admin(&config, &metrics, &pipeline)?;
    }
    let shutdown = Shutdown::new();
    let ready = pipeline.ready_flag();
    let cpu_before = cpu_seconds();
    let threads_before = cpu_by_thread();
    let started = Instant::now();
    let runner = {
        let shutdown = shutdown.clone();
        std::thread::spawn(move || pipeline.run_threaded(shutdown, config.pipeline.io_threads))
    };
    {
        let shutdown = shutdown.clone();
        std::thread::spawn(move || {
            current_thread().block_on(spate_core::pipeline::wait_for_signal());
            shutdown.trigger();
        });
    }
    let watch = watch_commits(
        &flights, &group, topic, &shutdown, &runner, started, &metrics,
    )?;
    let cpu_pipeline = cpu_seconds() - cpu_before;
    let threads_after = cpu_by_thread();
    let was_ready = ready.load(Ordering::Acquire);
    shutdown.trigger();
    let report = runner.join().map_err(|_| "the pipeline thread panicked")?;
    println!("\nspate: {}", report.summary());
    let landed = Landed::read(&rt, &ch, url, table, base)?;
    let produced = flights.produced;
    landed.print(args, produced, &watch, was_ready);
    let distinct = landed.distinct;
    if let Some(done) = watch.done_at {
        print_speed(
            produced,
            started,
            done,
            watch.first_poll,
            cpu_pipeline,
            &threads_before,
            &threads_after,
        );
    } else {
        println!("not everything was committed before the pipeline stopped");
    }
    let ok = watch.done_at.is_some() && distinct == produced && report.status.code() == 0;
    drop(flights);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    })
}

/// The admin server on `admin.listen` for the demo's one pipeline.
fn serve_admin(
    config: &Config,
    metrics: &metrics_exporter_prometheus::PrometheusHandle,
    pipeline: &service::SpatePipeline,
) -> Result<(), DemoError> {
    let bound = spate::admin::spawn(
        config.admin.listen.parse()?,
        spate::admin::AdminState {
            metrics: metrics.clone(),
            ready: pipeline.readiness(),
            pipelines: Vec::new(),
            collectors: vec![
                spate::telemetry::process_collector(),
                spate::telemetry::budget_collector(pipeline.budget()),
            ],
        },
    )?;
    eprintln!("admin server on http://{bound}");
    Ok(())
}

/// What this run's rows (`id >= base`) left in the table.
struct Landed {
    rows: u64,
    distinct: u64,
    /// The top origins, as ClickHouse prints them.
    sample: String,
}

impl Landed {
    /// Counts this run's rows in `table`.
    fn read(
        rt: &tokio::runtime::Runtime,
        ch: &HttpWriter,
        url: &str,
        table: &str,
        base: u64,
    ) -> Result<Self, DemoError> {
        let count = |sql: &str| -> Result<String, DemoError> {
            Ok(rt.block_on(ch.query(url, sql))?.trim().to_owned())
        };
        let rows: u64 = count(&format!(
            "SELECT count() FROM default.{table} WHERE id >= {base}"
        ))?
        .parse()?;
        let distinct: u64 = count(&format!(
            "SELECT uniqExact(id) FROM default.{table} WHERE id >= {base}"
        ))?
        .parse()?;
        let sample = count(&format!(
            "SELECT origin, count() AS flights, round(avg(delay), 1) AS avg_delay FROM default.{table} \
             WHERE id >= {base} GROUP BY origin ORDER BY flights DESC LIMIT 5 FORMAT PrettyCompactNoEscapes"
        ))?;
        Ok(Self {
            rows,
            distinct,
            sample,
        })
    }

    /// The demo's summary lines: produced, landed, duplicates, committed.
    fn print(&self, args: &DemoArgs, produced: u64, watch: &Watch, was_ready: bool) {
        let committed_text: Vec<String> = watch
            .committed
            .iter()
            .map(|(p, o)| format!("{p}={}", o.map_or("-".to_owned(), |o| o.to_string())))
            .collect();
        println!("delivery mode:        {}", args.delivery);
        println!("rows produced:        {produced}");
        println!("rows in ClickHouse:   {}", self.rows);
        println!("distinct ids:         {}", self.distinct);
        println!(
            "duplicates:           {} (delivery: {})",
            self.rows.saturating_sub(self.distinct),
            args.delivery
        );
        println!("committed offsets:    {}", committed_text.join(" "));
        println!("ready before the end: {was_ready}");
        println!("sample query (top origins):\n{}", self.sample);
    }
}

/// Checks that ClickHouse answers at `url`, creates the demo table if it
/// is not there and returns the first id of this run: ids continue after
/// what earlier demo runs left, so this run's rows are told apart by
/// `id >= base`.
fn prepare_table(
    rt: &tokio::runtime::Runtime,
    ch: &HttpWriter,
    url: &str,
    table: &str,
    effectively_once: bool,
) -> Result<u64, DemoError> {
    rt.block_on(ch.query(url, "SELECT 1"))
        .map_err(|e| format!("ClickHouse at {url} does not answer ({e}); `bash ci/demo.sh` starts one and runs the demo against it; or start one with `bash ci/clickhouse.sh start 1` and pass the URL it prints as --clickhouse-url"))?;
    // effectively_once needs a table that drops replays: a plain MergeTree
    // does so only with non_replicated_deduplication_window (servers that
    // have it; 18.16 does not, and the probe then refuses with the fix).
    let window = if effectively_once
        && rt
            .block_on(ch.query(
                url,
                "SELECT count() FROM system.merge_tree_settings \
                 WHERE name = 'non_replicated_deduplication_window'",
            ))?
            .trim()
            == "1"
    {
        " SETTINGS non_replicated_deduplication_window = 1000"
    } else {
        ""
    };
    rt.block_on(ch.query(
        url,
        &format!(
            "CREATE TABLE IF NOT EXISTS default.{table} (id UInt64, date DateTime, delay Int32, \
             distance UInt32, origin String, destination String) ENGINE = MergeTree ORDER BY id{window}"
        ),
    ))?;
    let base: u64 = rt
        .block_on(ch.query(url, &format!("SELECT max(id) + 1 FROM default.{table}")))?
        .trim()
        .parse()
        .unwrap_or(0);
    Ok(if base == 1 { 0 } else { base })
}

/// The demo's topic in an embedded broker, loaded with the run's rows.
struct Flights {
    /// Keeps the broker up; dropped at the end of the run.
    _mock: kafka_tools::MockBroker,
    brokers: String,
    partitions: i32,
    /// Rows produced.
    produced: u64,
    /// The sum of the partitions' end offsets.
    total: i64,
}

/// Starts an embedded broker with `topic` (enough partitions for its
/// retention) and produces `args.rows` flight rows with ids from `base`.
fn produce_flights(args: &DemoArgs, base: u64, topic: &str) -> Result<Flights, DemoError> {
    let lines: Vec<&str> = FIXTURE.lines().filter(|l| l.starts_with('{')).collect();
    let rows: Vec<String> = (base..base + args.rows)
        .map(|id| flight_row(&lines, id))
        .collect();
    let bytes: u64 = rows.iter().map(|r| r.len() as u64).sum();
    let partitions = args
        .partitions
        .max(bytes.div_ceil(MAX_BYTES_PER_PARTITION) as i32)
        .max(1);
    let mock = kafka_tools::start_broker(topic, partitions)?;
    let brokers = mock.bootstrap_servers();
    eprintln!(
        "embedded broker {brokers}: topic {topic}, {partitions} partitions; producing {} rows ({:.1} MB)",
        args.rows,
        bytes as f64 / 1e6
    );
    let bar = progress_bar(args.rows, "produce");
    let produced = kafka_tools::produce_lines(
        &brokers,
        topic,
        partitions,
        rows.iter().map(String::as_bytes),
        "k",
        Duration::from_secs(120),
        |n| bar.set_position(n),
    )?;
    bar.finish();
    drop(rows);
    let ends = kafka_tools::end_offsets(&brokers, topic, partitions, Duration::from_secs(10))?;
    Ok(Flights {
        _mock: mock,
        brokers,
        partitions,
        produced,
        total: ends.values().sum(),
    })
}

/// The demo's pipeline config: the embedded broker's topic into `table`
/// at `url`, group `group`.
fn demo_yaml(
    args: &DemoArgs,
    base: u64,
    brokers: &str,
    topic: &str,
    group: &str,
    url: &str,
) -> String {
    let table = &args.table;
    format!(
        r#"
pipeline: {{ name: "demo-{base}", threads: {threads}, io_threads: 2{delivery} }}
checkpoint: {{ interval: 200ms }}
source:
  kafka:
    brokers: "{brokers}"
    topics: [{topic}]
    group_id: "{group}"
    properties: {{ session.timeout.ms: "6000", heartbeat.interval.ms: "500" }}
format: {{ json: {{ time_formats: ["%Y/%m/%d %H:%M"] }} }}
on_error: {{ policy: fail }}
sink:
  clickhouse:
    shards: [["{url}"]]
    table: {table}
    batch: {{ max_rows: 1000000, max_bytes: 64MiB, linger: 200ms }}
    inflight: {{ max_inflight: 2, max_bytes: 256MiB }}
shutdown: {{ drain_timeout: 30s }}
admin: {{ listen: "{admin}" }}
"#,
        threads = args.threads,
        admin = args.admin,
        delivery = if args.delivery == "effectively_once" {
            ", delivery: effectively_once"
        } else {
            ""
        },
    )
}

/// What watching the group's commits saw.
struct Watch {
    /// When the pipeline first counted a polled record.
    first_poll: Option<Instant>,
    /// When the commits reached the end offsets (`None`: they did not).
    done_at: Option<Instant>,
    /// The last committed offsets read, per partition.
    committed: std::collections::BTreeMap<i32, Option<i64>>,
}

/// Watches `group`'s commits until they reach the end offsets, the
/// pipeline stops, a signal arrives or [`DELIVERY_DEADLINE`] passes.
fn watch_commits(
    flights: &Flights,
    group: &str,
    topic: &str,
    shutdown: &Shutdown,
    runner: &std::thread::JoinHandle<spate_core::pipeline::RunReport>,
    started: Instant,
    metrics: &metrics_exporter_prometheus::PrometheusHandle,
) -> Result<Watch, DemoError> {
    let (brokers, partitions, total) = (&flights.brokers, flights.partitions, flights.total);
    let bar = progress_bar(total as u64, "commit ");
    let mut first_poll: Option<Instant> = None;
    let mut done_at = None;
    let mut committed = Default::default();
    while !shutdown.is_triggered() && started.elapsed() < DELIVERY_DEADLINE {
        std::thread::sleep(Duration::from_millis(100));
        if runner.is_finished() {
            break;
        }
        committed = kafka_tools::committed_offsets(
            brokers,
            group,
            topic,
            partitions,
            Duration::from_secs(5),
        )?;
        let sum: i64 = committed
            .values()
            .map(|o: &Option<i64>| o.unwrap_or(0))
            .sum();
        bar.set_position(sum as u64);
        bar.set_message(format!("lag {}", total - sum));
        if first_poll.is_none() && polled(&metrics.render()) > 0 {
            first_poll = Some(Instant::now());
        }
        if sum >= total {
            done_at = Some(Instant::now());
            break;
        }
    }
    bar.finish();
    Ok(Watch {
        first_poll,
        done_at,
        committed,
    })
}

/// The run's speed: end to end, from the first polled row, CPU and peak
/// RSS, and CPU by thread.
fn print_speed(
    produced: u64,
    started: Instant,
    done: Instant,
    first_poll: Option<Instant>,
    cpu_pipeline: f64,
    threads_before: &std::collections::BTreeMap<String, f64>,
    threads_after: &std::collections::BTreeMap<String, f64>,
) {
    let wall = done.duration_since(started).as_secs_f64();
    println!(
        "end to end: {produced} rows in {wall:.2} s from start ({:.0} rows/s, includes the ~3 s group join)",
        produced as f64 / wall
    );
    if let Some(t0) = first_poll {
        let secs = done.duration_since(t0).as_secs_f64();
        println!(
            "from the first polled row to the last commit: {secs:.2} s ({:.0} rows/s end to end)",
            produced as f64 / secs
        );
    }
    println!(
        "process CPU during the run: {cpu_pipeline:.2} s ({:.2} s per million rows; includes the embedded broker), peak RSS {:.0} MiB",
        cpu_pipeline * 1e6 / produced as f64,
        peak_rss_mib()
    );
    let mut spent: Vec<(String, f64)> = threads_after
        .iter()
        .map(|(name, after)| {
            let before = threads_before.get(name).copied().unwrap_or(0.0);
            (name.clone(), after - before)
        })
        .filter(|(_, secs)| *secs >= 0.01)
        .collect();
    spent.sort_by(|a, b| b.1.total_cmp(&a.1));
    let spent: Vec<String> = spent
        .iter()
        .map(|(name, secs)| format!("{name} {secs:.2}"))
        .collect();
    println!("CPU seconds by thread: {}", spent.join(", "));
}
