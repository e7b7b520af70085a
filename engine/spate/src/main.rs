//! The `spate` binary: `run` (the service), `check` (config, brokers,
//! replicas, column mapping), `broker` (an embedded Kafka broker), `produce`
//! (NDJSON into a topic) and `demo` (all of it on one machine). `check`
//! lives in `check.rs`, `demo` in `demo.rs`.
//!
//! Exit codes: 0 clean; 1 bad usage or config; 2 shutdown abandoned data (it
//! replays on the next start); 3 the pipeline or a check failed; 4 clean,
//! but a committed offset was out of range and reset (the summary's
//! `offset_resets` names it).

mod check;
mod demo;

/// The binary's allocator (feature `jemalloc`, on by default): also serves
/// librdkafka's malloc/free, see `Cargo.toml`.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use spate::admin::{self, AdminState};
use spate::config::Config;
use spate::config::pipelines::ProcessConfig;
use spate::service;
pub(crate) use spate_core::error::chain;
use spate_core::pipeline::wait_for_signal;
use spate_kafka::tools as kafka_tools;

/// Exit code for bad usage or an unusable config.
const EXIT_CONFIG: u8 = 1;
/// Exit code for a failed check or start-up (the pipeline's own failure code).
const EXIT_FAILED: u8 = 3;
/// Exit code when a second SIGINT/SIGTERM cut the drain short (nothing past
/// unwritten data was committed, so it replays: D1).
const EXIT_SECOND_SIGNAL: i32 = 130;
/// Bound on each broker round trip `check`, `produce` and `broker` make.
const KAFKA_RPC: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(
    name = "spate",
    version,
    about = "Kafka topics into ClickHouse, fast: inserts as FORMAT Native (RowBinary where Native \
             cannot carry the rows; sink.clickhouse.format), delivery at_least_once or \
             effectively_once (pipeline.delivery)"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the pipeline until SIGINT or SIGTERM.
    Run {
        /// The config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate the config, reach the brokers and every replica, print the
    /// column mapping.
    Check {
        /// The config file.
        #[arg(short, long)]
        config: PathBuf,
        /// Also read up to N messages (from the group's committed offsets,
        /// or the beginning; never committing), run them through decode,
        /// mapping and routing without inserting, and report per column
        /// how many values were missing, null, defaulted or refused, the
        /// first errors and the shard distribution.
        #[arg(long, value_name = "N")]
        sample: Option<usize>,
    },
    /// An embedded Kafka broker (librdkafka's mock cluster) until Ctrl-C.
    Broker {
        /// Also accept bootstrap connections on 127.0.0.1:PORT (forwarded
        /// to the broker, which advertises its own port in metadata).
        #[arg(long)]
        port: Option<u16>,
        /// Topic to create.
        #[arg(long, default_value = "flights")]
        topic: String,
        /// Its partitions.
        #[arg(long, default_value_t = 8)]
        partitions: i32,
    },
    /// Load an NDJSON file into a topic, one message per line, keys spread
    /// evenly over the partitions; or, with `--sensor N`, register the Avro
    /// sensor workload's schema and produce N Confluent-framed SensorBatch
    /// messages.
    Produce {
        /// Bootstrap brokers.
        #[arg(long)]
        brokers: String,
        /// Target topic (must exist).
        #[arg(long)]
        topic: String,
        /// The NDJSON file (not with --sensor).
        #[arg(required_unless_present = "sensor", conflicts_with = "sensor")]
        file: Option<PathBuf>,
        /// Produce N SensorBatch messages (100 events each; message i has
        /// key `b{i}` and goes to partition i % partitions) instead of a
        /// file; needs --registry.
        #[arg(long, value_name = "N", requires = "registry")]
        sensor: Option<u64>,
        /// The first message index (default 0): `--first 5000 --sensor
        /// 5000` continues a run of 5000.
        #[arg(long, default_value_t = 0, requires = "sensor")]
        first: u64,
        /// The writer schema version: 1, or 2 (adds `firmware` with a
        /// default: a compatible evolution).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2), requires = "sensor")]
        schema_version: u8,
        /// The schema registry the schema is registered with.
        #[arg(long, value_name = "URL")]
        registry: Option<String>,
        /// The subject (default `{topic}-value`).
        #[arg(long, requires = "registry")]
        subject: Option<String>,
        /// HTTP Basic auth user for the registry.
        #[arg(long, requires = "registry")]
        registry_user: Option<String>,
        /// Its password.
        #[arg(long, requires = "registry_user")]
        registry_password: Option<String>,
    },
    /// Embedded broker, flight rows, a ClickHouse table, the pipeline, and a
    /// summary of what landed.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo draws progress bars: only warnings by default.
    let default_filter = match cli.command {
        Command::Demo(_) => "warn",
        _ => "info",
    };
    init_tracing(cli.log_format, default_filter);
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Check { config, sample } => check::check(&config, sample),
        Command::Broker {
            port,
            topic,
            partitions,
        } => broker(port, &topic, partitions),
        Command::Produce {
            brokers,
            topic,
            file,
            sensor: Some(n),
            first,
            schema_version,
            registry,
            subject,
            registry_user,
            registry_password,
        } => {
            debug_assert!(file.is_none(), "clap: file conflicts with --sensor");
            let mut rc = spate_formats::registry::RegistryConfig::new(
                registry.expect("clap: --sensor requires --registry"),
            );
            rc.credentials = registry_user.map(|user| spate_clickhouse::writer::Credentials {
                user,
                password: registry_password.unwrap_or_default(),
            });
            let subject = subject.unwrap_or_else(|| format!("{topic}-value"));
            produce_sensor(
                &brokers,
                &topic,
                rc,
                &subject,
                first,
                n,
                schema_version == 2,
            )
        }
        Command::Produce {
            brokers,
            topic,
            file,
            ..
        } => produce(
            &brokers,
            &topic,
            &file.expect("clap: the file is required without --sensor"),
        ),
        Command::Demo(args) => demo::demo(&args),
    }
}

/// Logs to stderr; `RUST_LOG` overrides `default_filter`.
fn init_tracing(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colour only on a terminal: redirected logs stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn load(path: &std::path::Path) -> Result<ProcessConfig, ExitCode> {
    let process = ProcessConfig::load(path).map_err(|e| {
        eprintln!("spate: {}: {}", path.display(), chain(&e));
        ExitCode::from(EXIT_CONFIG)
    })?;
    // librdkafka's own check of the pass-through properties: a typo there
    // is a config error (exit 1) for `check` and `run` alike.
    for (i, entry) in process.pipelines.iter().enumerate() {
        if let Err(e) = entry.config.kafka_config().check_client() {
            let at = if process.multi {
                format!("pipelines[{i}].")
            } else {
                String::new()
            };
            eprintln!(
                "spate: {}: config key `{at}source.kafka.properties`: {}",
                path.display(),
                chain(&e)
            );
            return Err(ExitCode::from(EXIT_CONFIG));
        }
    }
    Ok(process)
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread tokio runtime starts")
}

fn run(path: &std::path::Path) -> ExitCode {
    let process = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if process.multi || !process.pipelines[0].tables.is_empty() {
        return run_pipelines(&process);
    }
    match run_config(&process.pipelines[0].config) {
        Ok(code) => code,
        Err(e) => {
            let why = chain(&*e);
            eprintln!("spate: {why}");
            // The same status line on stdout as after a run, so a failed
            // start is read where a finished run is.
            println!("spate: status=Failed polled=0 error: {why}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Runs the pipeline of `config` until a signal; the exit code of its
/// report. Shared by `run` and `demo`.
pub(crate) fn run_config(config: &Config) -> Result<ExitCode, Box<dyn std::error::Error>> {
    // Every series of the pipeline carries `pipeline="NAME"`, as in the
    // `pipelines:` form (spate::process).
    let (metrics, recorder) = spate::process::install_metrics()?;
    let scope = spate::process::scope(recorder, &config.pipeline.name);
    let (mut pipeline, dead_letter) = scope.run(|| {
        let plan = current_thread().block_on(service::plan(config))?;
        for c in &plan.columns {
            let (field, rule) = plan.describe(c);
            tracing::info!(column = %c.name, source = %field, rule, "mapping");
        }
        service::build(config, &plan)
    })?;
    pipeline.set_metrics_scope(scope.clone());
    if config.admin.listen != "off" {
        let addr = config.admin.listen.parse()?;
        let bound = admin::spawn(
            addr,
            AdminState {
                metrics,
                ready: pipeline.readiness(),
                pipelines: Vec::new(),
                collectors: vec![
                    spate::telemetry::process_collector(),
                    // In the pipeline's scope: its budget gauges carry its label.
                    scope.run(|| spate::telemetry::budget_collector(pipeline.budget())),
                ],
            },
        )?;
        tracing::info!("admin server on http://{bound} (/metrics /healthz /readyz)");
    }
    tracing::info!(
        pipeline = %config.pipeline.name,
        table = %format!("{}.{}", config.sink.clickhouse.database, config.sink.clickhouse.table),
        delivery = config.pipeline_config().delivery.as_str(),
        "starting"
    );
    spawn_second_signal_exit()?;
    let report = pipeline.run_until_signal(config.pipeline.io_threads);
    if let Some(dl) = dead_letter {
        dl.flush(Duration::from_secs(5));
    }
    println!("spate: {}", report.summary());
    Ok(ExitCode::from(report.status.code() as u8))
}

/// Runs the pipelines of the `pipelines:` form (`spate::process`): a
/// status line per pipeline on stdout, then the worst status, which is the
/// exit code.
fn run_pipelines(process: &ProcessConfig) -> ExitCode {
    if let Err(e) = spawn_second_signal_exit() {
        eprintln!("spate: signal listener: {e}");
        return ExitCode::from(EXIT_FAILED);
    }
    match spate::process::run(process) {
        Ok(report) => {
            for o in &report.outcomes {
                println!("spate: {}", o.summary());
            }
            println!(
                "spate: status={:?} (the worst of {} pipelines)",
                report.status,
                report.outcomes.len()
            );
            ExitCode::from(report.status.code() as u8)
        }
        Err(e) => {
            let why = chain(&e);
            eprintln!("spate: {why}");
            println!("spate: status=Failed polled=0 error: {why}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// The first SIGINT/SIGTERM starts the drain (the pipeline's own listener);
/// this thread exits the process at once on the second.
fn spawn_second_signal_exit() -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("spate-second-signal".into())
        .spawn(|| {
            current_thread().block_on(async {
                wait_for_signal().await;
                wait_for_signal().await;
            });
            eprintln!(
                "spate: second signal: exiting now without draining; uncommitted data replays"
            );
            std::process::exit(EXIT_SECOND_SIGNAL);
        })
        .map(drop)
}

fn broker(port: Option<u16>, topic: &str, partitions: i32) -> ExitCode {
    let mock = match kafka_tools::start_broker(topic, partitions) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("spate broker: {}", chain(&e));
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let upstream = mock.bootstrap_servers();
    let rt = current_thread();
    let bootstrap = match port {
        None => upstream.clone(),
        Some(p) => {
            let listener = match rt.block_on(tokio::net::TcpListener::bind(("127.0.0.1", p))) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("spate broker: cannot listen on 127.0.0.1:{p}: {e}");
                    return ExitCode::from(EXIT_FAILED);
                }
            };
            rt.spawn(forward(listener, upstream.clone()));
            format!("127.0.0.1:{p}")
        }
    };
    println!("{bootstrap}");
    eprintln!(
        "spate broker: embedded broker on {bootstrap} (broker {upstream}) with topic {topic} \
         ({partitions} partitions); it keeps at most 5 MiB per partition; Ctrl-C stops it"
    );
    rt.block_on(wait_for_signal());
    eprintln!("spate broker: stopped");
    ExitCode::SUCCESS
}

/// Forwards every connection accepted on `listener` to `upstream`
/// (bootstrap only: clients then connect to the advertised broker address).
async fn forward(listener: tokio::net::TcpListener, upstream: String) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect(&upstream).await {
                Ok(mut server) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
                Err(e) => tracing::warn!("spate broker: forward to {upstream}: {e}"),
            }
        });
    }
}

/// A progress bar counting rows toward `total` with rows/s.
pub(crate) fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what} [{{bar:40}}] {{human_pos}}/{{human_len}} rows {{per_sec}} eta {{eta}} {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

/// `spate produce --sensor N`: registers the workload's writer schema (v1
/// or v2) under `subject` and produces messages `first..first + n`.
/// The Avro sensor workload's messages `first..first + count`, as
/// `(index, message)`: each a Confluent-framed `SensorBatch` under
/// `schema_id` (writer schema version 2, with `firmware`, when `v2`).
fn sensor_messages(
    first: u64,
    count: u64,
    schema_id: u32,
    v2: bool,
) -> impl Iterator<Item = (u64, Vec<u8>)> {
    use spate_testkit::sensor::avro as sensor;
    let mut buf = Vec::new();
    (first..first + count).map(move |i| {
        buf.clear();
        if v2 {
            sensor::message_v2(i, schema_id, &mut buf);
        } else {
            sensor::message(i, schema_id, &mut buf);
        }
        (i, buf.clone())
    })
}

fn produce_sensor(
    brokers: &str,
    topic: &str,
    registry: spate_formats::registry::RegistryConfig,
    subject: &str,
    first: u64,
    n: u64,
    v2: bool,
) -> ExitCode {
    use spate_formats::registry::{RegistryClient, SchemaType};
    use spate_testkit::sensor::avro as sensor;
    let (version, text) = if v2 {
        (2, sensor::SCHEMA_V2)
    } else {
        (1, sensor::SCHEMA_V1)
    };
    let partitions = match kafka_tools::partition_count(brokers, topic, KAFKA_RPC) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("spate produce: {}", chain(&e));
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let id = match RegistryClient::new(registry)
        .and_then(|c| c.register(subject, SchemaType::Avro, text, &[]))
    {
        Ok(id) => id,
        Err(e) => {
            eprintln!("spate produce: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    println!("registered SensorBatch schema v{version} under subject {subject}: schema id {id}");
    let bar = progress_bar(n, "produce");
    let result = kafka_tools::produce_indexed(
        brokers,
        topic,
        partitions,
        sensor_messages(first, n, id, v2),
        "b",
        Duration::from_secs(60),
        |k| bar.set_position(k),
    );
    bar.finish();
    match result {
        Ok(k) => {
            println!(
                "produced {k} SensorBatch messages ({} candidate rows) to {topic} over \
                 {partitions} partitions, batch_id {first}..{}",
                k * sensor::EVENTS,
                first + k
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("spate produce: {}", chain(&e));
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn produce(brokers: &str, topic: &str, file: &std::path::Path) -> ExitCode {
    let text = match std::fs::read(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("spate produce: cannot read {}: {e}", file.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let partitions = match kafka_tools::partition_count(brokers, topic, KAFKA_RPC) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("spate produce: {}", chain(&e));
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let lines: Vec<&[u8]> = text
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .collect();
    let bar = progress_bar(lines.len() as u64, "produce");
    let result = kafka_tools::produce_lines(
        brokers,
        topic,
        partitions,
        lines.iter().copied(),
        "k",
        Duration::from_secs(60),
        |n| bar.set_position(n),
    );
    bar.finish();
    match result {
        Ok(n) => {
            println!("produced {n} messages to {topic} over {partitions} partitions");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("spate produce: {}", chain(&e));
            ExitCode::from(EXIT_FAILED)
        }
    }
}
