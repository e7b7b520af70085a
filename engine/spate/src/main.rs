//! The `spate` binary: `run` (the service), `check` (config, brokers,
//! replicas, column mapping), `broker` (an embedded Kafka broker), `produce`
//! (NDJSON into a topic) and `demo` (all of it on one machine).
//!
//! Exit codes: 0 clean; 1 bad usage or config; 2 shutdown abandoned data (it
//! replays on the next start); 3 the pipeline or a check failed; 4 clean,
//! but a committed offset was out of range and reset (the summary's
//! `offset_resets` names it).

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
use spate::kafka_tools;
use spate::service;
use spate_clickhouse::writer::HttpWriter;
pub(crate) use spate_core::error::chain;
use spate_core::sink::{Endpoint, Writer};

/// Exit code for bad usage or an unusable config.
const EXIT_CONFIG: u8 = 1;
/// Exit code for a failed check or start-up (the pipeline's own failure code).
const EXIT_FAILED: u8 = 3;
/// Exit code when a second SIGINT/SIGTERM cut the drain short (nothing past
/// unwritten data was committed, so it replays: D1).
const EXIT_SECOND_SIGNAL: i32 = 130;
/// Bound on reading the sample of `check --sample`.
const SAMPLE_WITHIN: Duration = Duration::from_secs(15);
/// Bound on each broker round trip `check`, `produce` and `broker` make.
const KAFKA_RPC: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(
    name = "spate",
    version,
    about = "Kafka topics into ClickHouse, fast, at least once"
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
        Command::Check { config, sample } => check(&config, sample),
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

fn check(path: &std::path::Path, sample: Option<usize>) -> ExitCode {
    let process = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    println!("config {}: ok", path.display());
    if !process.multi {
        return match check_entry(&process.pipelines[0], sample) {
            Some(problems) => check_verdict(problems),
            None => {
                println!("check: failed");
                ExitCode::from(EXIT_FAILED)
            }
        };
    }
    // Every pipeline, each with its own header; one that cannot be
    // planned counts as one problem and the next is still checked.
    let mut problems = 0;
    for entry in &process.pipelines {
        let ch = &entry.config.sink.clickhouse;
        println!(
            "\n== pipeline {} (topics {}, group {}, table {}.{}) ==",
            entry.name(),
            entry.config.source.kafka.topics.join(", "),
            entry.config.source.kafka.group_id,
            ch.database,
            ch.table
        );
        problems += check_entry(entry, sample).unwrap_or(1);
    }
    println!();
    check_verdict(problems)
}

/// `check` of one pipeline entry: [`check_pipeline`], or with `tables:`
/// the topics once and each table's mapping and replicas under its own
/// header, and with `--sample` each sampled message analyzed with its
/// topic's table.
fn check_entry(
    entry: &spate::config::pipelines::PipelineEntry,
    sample: Option<usize>,
) -> Option<usize> {
    if entry.tables.is_empty() {
        return check_pipeline(&entry.config, sample);
    }
    let (mut problems, partitions) = check_topics(&entry.config);
    let rt = current_thread();
    let mut plans = Vec::with_capacity(entry.tables.len());
    for r in &entry.tables {
        let ch = &r.config.sink.clickhouse;
        println!(
            "\n-- table route {} -> {}.{} --",
            r.key, ch.database, ch.table
        );
        let plan = match rt.block_on(service::plan(&r.config)) {
            Ok(p) => p,
            Err(e) => {
                println!("clickhouse: PROBLEM: {}", chain(&e));
                problems += 1;
                plans.push(None);
                continue;
            }
        };
        print_mapping(&r.config, &plan);
        match service::writer_config(&r.config, plan.typed_columns()) {
            Ok(w) => {
                problems += probe_replicas(&rt, &r.config, &HttpWriter::new(w), partitions);
            }
            Err(e) => {
                println!("clickhouse: PROBLEM: {}", chain(&e));
                problems += 1;
            }
        }
        plans.push(Some(plan));
    }
    if let Some(n) = sample {
        problems += check_routed_sample(entry, &plans, n);
    }
    Some(problems)
}

/// `check --sample N` with `tables:`: one read of the plain topics, each
/// message analyzed with its topic's table's plan (a report per table); a
/// message whose topic matches no entry is a problem.
fn check_routed_sample(
    entry: &spate::config::pipelines::PipelineEntry,
    plans: &[Option<service::Plan>],
    n: usize,
) -> usize {
    let messages = match spate::sample::read(&entry.config, n, SAMPLE_WITHIN) {
        Ok(m) => m,
        Err(e) => {
            println!("sample: PROBLEM: {}", chain(&e));
            return 1;
        }
    };
    let route = |m: &spate::sample::SampledMessage| {
        spate::config::tables::route_of(&entry.tables, &m.topic)
    };
    let mut problems = 0;
    let unrouted = messages.iter().filter(|m| route(m).is_none()).count();
    if unrouted > 0 {
        problems += 1;
        println!(
            "sample: PROBLEM: {unrouted} of {} sampled message(s) from topics matching no entry \
             of `tables` (record errors at run time)",
            messages.len()
        );
    }
    for (t, (r, plan)) in entry.tables.iter().zip(plans).enumerate() {
        let Some(plan) = plan else {
            continue;
        };
        if plan.explode.is_some() || plan.filter.is_some() {
            println!(
                "\nsample of table route {}: not analysed: --sample does not model \
                 mapping.explode / mapping.filter yet",
                r.key
            );
            continue;
        }
        let mine: Vec<_> = messages
            .iter()
            .filter(|m| route(m) == Some(t))
            .cloned()
            .collect();
        println!(
            "\nsample of table route {} ({} message(s)):",
            r.key,
            mine.len()
        );
        problems += analyze_sample(&r.config, plan, &mine);
    }
    problems
}

/// `check` of one pipeline: topics, mapping, replicas, the sample. The
/// number of problems, or `None` when it could not be planned (the
/// problem is printed).
fn check_pipeline(config: &Config, sample: Option<usize>) -> Option<usize> {
    let (mut problems, partitions) = check_topics(config);

    // Replicas: plan from the first that answers, then probe every one.
    let rt = current_thread();
    let plan = match rt.block_on(service::plan(config)) {
        Ok(p) => p,
        Err(e) => {
            let part = match &e {
                service::ServiceError::Registry { .. } => "registry",
                service::ServiceError::Config(_) => "config",
                _ => "clickhouse",
            };
            println!("{part}: PROBLEM: {}", chain(&e));
            return None;
        }
    };
    print_mapping(config, &plan);
    let writer = match service::writer_config(config, plan.typed_columns()) {
        Ok(w) => HttpWriter::new(w),
        Err(e) => {
            println!("clickhouse: PROBLEM: {}", chain(&e));
            return None;
        }
    };
    problems += probe_replicas(&rt, config, &writer, partitions);
    if let Some(n) = sample {
        println!();
        problems += check_sample(config, &plan, n);
    }
    Some(problems)
}

/// `check`'s last line and exit code for `problems`.
fn check_verdict(problems: usize) -> ExitCode {
    if problems == 0 {
        println!("check: ok");
        ExitCode::SUCCESS
    } else {
        println!("check: {problems} problem(s)");
        ExitCode::from(EXIT_FAILED)
    }
}

/// `check`'s Kafka part: each plain topic's partitions (one metadata fetch
/// each) and the dead-letter topic's; prints a line per topic and returns
/// the number of problems.
fn check_topics(config: &Config) -> (usize, usize) {
    let mut problems = 0usize;
    let mut partitions = 0usize;
    // Brokers: one metadata fetch, then each plain topic's partitions.
    let brokers = config.source.kafka.brokers.joined();
    for topic in &config.source.kafka.topics {
        if topic.starts_with('^') {
            println!(
                "kafka {brokers}: topic pattern {topic} (not checked; `spate run` waits for a matching topic)"
            );
            continue;
        }
        match kafka_tools::partition_count_with(
            &brokers,
            &config.source.kafka.properties,
            topic,
            KAFKA_RPC,
        ) {
            Ok(n) => {
                partitions += n as usize;
                println!("kafka {brokers}: topic {topic}: {n} partitions");
            }
            Err(e) => {
                problems += 1;
                println!("kafka {brokers}: PROBLEM: {}", chain(&e));
            }
        }
    }

    // The dead-letter topic, on the same brokers: a skipped record must
    // have somewhere to go.
    if let Some(dl) = &config.on_error.dead_letter {
        match kafka_tools::partition_count_with(
            &brokers,
            &config.source.kafka.properties,
            &dl.topic,
            KAFKA_RPC,
        ) {
            Ok(n) => println!(
                "kafka {brokers}: dead-letter topic {}: {n} partitions",
                dl.topic
            ),
            Err(e) => {
                problems += 1;
                println!(
                    "kafka {brokers}: PROBLEM: dead-letter topic (on_error.dead_letter.topic): {}",
                    chain(&e)
                );
            }
        }
    }
    (problems, partitions)
}

/// `check`'s mapping report: each column's type, source field and rule,
/// the server-computed columns left out, the missing-value rule per
/// column, the row format and the DEFAULTs this server cannot apply.
fn print_mapping(config: &Config, plan: &service::Plan) {
    let ch = &config.sink.clickhouse;
    println!("\ncolumn mapping into {}.{}:", ch.database, ch.table);
    let rows: Vec<[String; 4]> = plan
        .columns
        .iter()
        .zip(plan.typed_columns())
        .map(|(c, (_, ty))| {
            let (field, rule) = plan.describe(c);
            [c.name.clone(), ty, field, rule.to_owned()]
        })
        .collect();
    print_table(&["column", "type", "source field", "rule"], &rows);
    let skipped: Vec<&str> = plan
        .schema
        .columns
        .iter()
        .filter(|t| !plan.columns.iter().any(|c| c.name == t.name))
        .map(|t| t.name.as_str())
        .collect();
    if !skipped.is_empty() {
        println!(
            "not in the INSERT (the server computes them): {}",
            skipped.join(", ")
        );
    }
    println!("a record without the field gets:");
    for c in &plan.columns {
        use spate_row::meta::MetaSource;
        match &c.meta {
            None => println!("  {}: {}", c.name, plan.when_missing(c)),
            Some(MetaSource::Key) => println!(
                "  {}: (kafka metadata _key) a message with a null key gets {}",
                c.name,
                plan.when_missing(c)
            ),
            Some(m @ MetaSource::Header(_)) => println!(
                "  {}: (kafka metadata {m}) a message without that header (or with a null value) \
                 gets {}",
                c.name,
                plan.when_missing(c)
            ),
            Some(m @ (MetaSource::Timestamp | MetaSource::TimestampSeconds)) => println!(
                "  {}: (kafka metadata {m}) a message without a timestamp gets {}",
                c.name,
                plan.when_missing(c)
            ),
            Some(m) => println!("  {}: (kafka metadata {m}) always set", c.name),
        }
    }
    println!("rows sent as {}", plan.row_format.name());
    if let Some(path) = &plan.explode {
        println!(
            "explode: /{} (one row per element; an empty array writes no row and counts as              filtered)",
            path.join("/")
        );
    }
    if let Some(f) = &plan.filter {
        println!("filter (on each row as encoded, after explode): keep rows where {f}");
    }
    for line in plan.format.describe() {
        println!("{line}");
    }
    for (column, expr) in plan.refused_defaults() {
        println!(
            "clickhouse: NOTE: column {column} has DEFAULT {expr}, computed per row; this server \
             has no RowBinaryWithDefaults, so a record without `{column}` is a record error (on_error)"
        );
    }
    println!();
}

/// `check`'s replica part: probes every replica of every shard and reads
/// its capabilities and the table's engine; prints a line per replica and
/// returns the number of problems.
fn probe_replicas(
    rt: &tokio::runtime::Runtime,
    config: &Config,
    writer: &HttpWriter,
    partitions: usize,
) -> usize {
    let ch = &config.sink.clickhouse;
    let mut problems = 0usize;
    for (s, shard) in ch.shards.iter().enumerate() {
        for (r, url) in shard.iter().enumerate() {
            let endpoint = Endpoint {
                shard: s,
                replica: r,
                url: url.as_str().into(),
            };
            let result = rt.block_on(async {
                writer.probe(&endpoint).await?;
                let caps = writer.caps(&endpoint).await?;
                let engine = writer
                    .query(
                        url,
                        &format!(
                            "SELECT engine FROM system.tables WHERE database = {} AND name = {}",
                            spate_row::schema::quote_literal(&ch.database),
                            spate_row::schema::quote_literal(&ch.table)
                        ),
                    )
                    .await?;
                let dedup = writer.dedup(&endpoint).await?;
                Ok::<_, spate_core::sink::WriteError>((caps, engine.trim().to_owned(), dedup))
            });
            match result {
                Ok((caps, engine, dedup)) => {
                    let lacks = lacks(caps.dedup_token, &engine);
                    println!("{endpoint}: ok, engine {engine}; lacks: {lacks}");
                    println!(
                        "{endpoint}: {}",
                        dedup_line(
                            &dedup,
                            partitions,
                            config.pipeline_config().sink.batch.linger,
                            service::effectively_once(config)
                        )
                    );
                }
                Err(e) => {
                    problems += 1;
                    println!("{endpoint}: PROBLEM: {}", e.describe("probe"));
                }
            }
        }
    }
    problems
}

/// What a replica lacks for effectively-once retries, in words ("nothing"
/// when it has both): the dedup token setting, and a Replicated* engine's
/// block deduplication.
fn lacks(dedup_token: bool, engine: &str) -> String {
    let mut lacks = Vec::new();
    if !dedup_token {
        lacks.push("insert_deduplication_token (retries rely on block-hash deduplication)");
    }
    if !engine.starts_with("Replicated") {
        lacks.push(
            "block deduplication (the engine is not Replicated*: a retried batch may be stored twice)",
        );
    }
    if lacks.is_empty() {
        "nothing".to_owned()
    } else {
        lacks.join("; ")
    }
}

/// `check`'s line on a replica's dedup window: what it holds, and how long
/// that lasts when each of `partitions` partitions seals a batch into this
/// shard every `linger` (the most effectively_once makes: one partition's
/// range per batch and shard).
fn dedup_line(
    dedup: &spate_clickhouse::dedup::Dedup,
    partitions: usize,
    linger: Duration,
    effectively_once: bool,
) -> String {
    use spate_clickhouse::dedup::Dedup;
    let mode = if effectively_once {
        "effectively_once"
    } else {
        "at_least_once"
    };
    match dedup {
        Dedup::Window(w) => {
            let mut line = format!("dedup window: {w}");
            if partitions > 0 && !linger.is_zero() {
                let per_sec = partitions as f64 / linger.as_secs_f64();
                if let Some(secs) = w.covers_secs(per_sec) {
                    line.push_str(&format!(
                        "; at up to {per_sec:.0} inserts/s ({partitions} partitions sealing every \
                         {linger:?}) that is {secs:.1} s of inserts (delivery: {mode})"
                    ));
                }
            }
            line
        }
        Dedup::Cannot { reason, fix } => format!(
            "dedup window: none: {reason}; delivery: effectively_once refuses this table \
             (fix: {fix}); delivery: {mode}"
        ),
    }
}

/// `check --sample N`: reads, maps and routes up to `n` messages; prints the
/// report; returns the number of problems.
fn check_sample(config: &Config, plan: &service::Plan, n: usize) -> usize {
    if !matches!(plan.format, spate::formats::FormatPlan::Json) {
        println!(
            "sample: NOTE: --sample reads JSON messages only; not run for format.{}",
            plan.format.name()
        );
        return 0;
    }
    if plan.explode.is_some() || plan.filter.is_some() {
        // The sample maps one row per record without the filter; its
        // per-column counts would describe rows the pipeline never writes.
        println!(
            "sample: not analysed: --sample does not model mapping.explode / mapping.filter              yet (the plan above is checked against the table)"
        );
        return 0;
    }
    // A bad shard key is reported before anything is read.
    if let Err(e) = config.sink.clickhouse.shard_spec() {
        println!("sample: PROBLEM: {e}");
        return 1;
    }
    let messages = match spate::sample::read(config, n, SAMPLE_WITHIN) {
        Ok(m) => m,
        Err(e) => {
            println!("sample: PROBLEM: {}", chain(&e));
            return 1;
        }
    };
    analyze_sample(config, plan, &messages)
}

/// Analyzes `messages` with `plan` (routed by `config`'s shard key) and
/// prints the report; returns the number of problems.
fn analyze_sample(
    config: &Config,
    plan: &service::Plan,
    messages: &[spate::sample::SampledMessage],
) -> usize {
    let spec = match config.sink.clickhouse.shard_spec() {
        Ok(s) => s,
        Err(e) => {
            println!("sample: PROBLEM: {e}");
            return 1;
        }
    };
    let report = spate::sample::analyze(
        plan,
        &spec,
        config.sink.clickhouse.shards.len(),
        config.format.json().mode,
        messages,
    );
    print!("{}", report.render());
    let problems = report.problems();
    for p in &problems {
        println!("sample: PROBLEM: {p}");
    }
    problems.len()
}

fn print_table(header: &[&str; 4], rows: &[[String; 4]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: [&str; 4]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("  {}", parts.join("  ").trim_end());
    };
    line(*header);
    for row in rows {
        line([&row[0], &row[1], &row[2], &row[3]]);
    }
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

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
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
    let result = kafka_tools::produce_sensor(
        brokers,
        topic,
        partitions,
        first,
        n,
        id,
        v2,
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
