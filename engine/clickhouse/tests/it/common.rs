//! Helpers shared by the real-server modules (`real_server.rs`,
//! `schema_change.rs`, `query_id.rs`): the opt-in server URL, an endpoint on
//! it, a database of a test's own, and the INSERT plan as the service's
//! start-up makes it.
//!
//! Each module uses a subset, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
use spate_core::sink::Endpoint;
use spate_formats::json::JsonRowEncoder;
use spate_row::schema::{InsertOptions, plan_insert};
use spate_row::spec::MappingOptions;

/// The real server's HTTP URL from `SPATE_CLICKHOUSE_URL`; `None` (after
/// printing `skipped: SPATE_CLICKHOUSE_URL not set`) when it is not set.
pub fn server() -> Option<String> {
    match std::env::var("SPATE_CLICKHOUSE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            // Straight to stderr: the harness captures print macros only.
            let _ = writeln!(std::io::stderr(), "skipped: SPATE_CLICKHOUSE_URL not set");
            None
        }
    }
}

/// Shard 0, replica 0 at `url`.
pub fn endpoint(url: &str) -> Endpoint {
    Endpoint {
        shard: 0,
        replica: 0,
        url: url.into(),
    }
}

/// A name no other test run uses: `{prefix}_{tag}_{pid}_{nanos}`.
pub fn unique_name(prefix: &str, tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{tag}_{}_{nanos}", std::process::id())
}

/// A database of its own for one test, dropped at the end.
pub struct TestDb {
    /// Runs the test's DDL and reads (LowCardinality allowed, as 18.16 needs).
    pub admin: HttpWriter,
    /// The server.
    pub url: String,
    /// The database, `{prefix}_{tag}_{pid}_{nanos}`.
    pub name: String,
}

impl TestDb {
    /// Creates database [`unique_name`]`(prefix, tag)` on `url`.
    pub async fn create(url: &str, prefix: &str, tag: &str) -> TestDb {
        Self::create_with(
            url,
            prefix,
            tag,
            vec![("allow_experimental_low_cardinality_type".into(), "1".into())],
        )
        .await
    }

    /// As [`TestDb::create`], without 18.16's LowCardinality setting, which a
    /// current engine (chdb) does not know (code 115).
    pub async fn create_current(url: &str, prefix: &str, tag: &str) -> TestDb {
        Self::create_with(url, prefix, tag, Vec::new()).await
    }

    async fn create_with(
        url: &str,
        prefix: &str,
        tag: &str,
        settings: Vec<(String, String)>,
    ) -> TestDb {
        let name = unique_name(prefix, tag);
        let mut config = HttpWriterConfig::new(&name, "", Vec::new());
        config.settings = settings;
        let admin = HttpWriter::new(config);
        admin
            .query(url, &format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        TestDb {
            admin,
            url: url.to_owned(),
            name,
        }
    }

    /// Runs `sql`; panics naming it on an error.
    pub async fn sql(&self, sql: &str) -> String {
        self.admin
            .query(&self.url, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs a `... FORMAT JSONEachRow` query: one value per row.
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        self.sql(sql)
            .await
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Drops the database.
    pub async fn drop(self) {
        self.sql(&format!("DROP DATABASE {}", self.name)).await;
    }
}

/// The plan for `db.table` as the start-up makes it: the probe, the INSERT
/// plan, its encoder (default mapping options) and the writer's `(name,
/// server type text)` columns.
pub async fn plan(db: &TestDb, table: &str) -> (JsonRowEncoder, Vec<(String, String)>) {
    let probe = HttpWriter::new(HttpWriterConfig::new(&db.name, table, Vec::new()));
    let schema = probe.table_schema(&db.url).await.unwrap();
    let columns = plan_insert(&schema, &InsertOptions::default()).unwrap();
    let typed = columns
        .iter()
        .map(|c| {
            let t = schema.columns.iter().find(|t| t.name == c.name).unwrap();
            (c.name.clone(), t.type_text.clone())
        })
        .collect();
    (
        JsonRowEncoder::new(columns, MappingOptions::default()).unwrap(),
        typed,
    )
}
