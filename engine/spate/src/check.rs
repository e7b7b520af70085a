//! `spate check`: validates the config, reaches the brokers (every plain
//! topic and the dead-letter topic), plans the INSERT from the first
//! replica that answers and prints the column mapping, probes every
//! replica (capabilities, engine, dedup window), and with `--sample N`
//! reads, maps and routes up to N messages without inserting or
//! committing ([`spate::sample`]). With `pipelines:` each pipeline is
//! checked under its own header, with `tables:` each table route.
//!
//! Output: one line per fact, `PROBLEM:` on each that would stop or hurt
//! `spate run`; the last line is `check: ok` (exit 0) or `check: N
//! problem(s)` (exit 3). It never writes a row and never commits.

use std::process::ExitCode;
use std::time::Duration;

use spate::config::Config;
use spate::service;
use spate_clickhouse::writer::HttpWriter;
use spate_core::sink::{Endpoint, Writer};
use spate_kafka::tools as kafka_tools;

use crate::{EXIT_FAILED, KAFKA_RPC, chain, current_thread, load};

/// Bound on reading the sample of `check --sample`.
const SAMPLE_WITHIN: Duration = Duration::from_secs(15);

/// `spate check --config PATH [--sample N]`.
pub(crate) fn check(path: &std::path::Path, sample: Option<usize>) -> ExitCode {
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
    print_when_missing(plan);
    match service::insert_format(config, plan) {
        Ok(format) => println!("{}", service::run_summary_line(config, format)),
        Err(e) => println!("clickhouse: PROBLEM: {}", chain(&e)),
    }
    if let Some(path) = &plan.explode {
        println!(
            "explode: /{} (one row per element; an empty array writes no row and counts as filtered)",
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

/// `check`'s lines on what a record without a column's field gets.
fn print_when_missing(plan: &service::Plan) {
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
    if !matches!(plan.format, spate::schema_formats::FormatPlan::Json) {
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
            "sample: not analysed: --sample does not model mapping.explode / mapping.filter yet (the plan above is checked against the table)"
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
