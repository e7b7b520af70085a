//! spate's integration tests, one test binary (each module was a test
//! binary of its own; one binary links once instead of nineteen times).
//!
//! Tests of different modules run side by side in this one process, so what
//! they share is guarded ([`spate_testkit::serial`]): every test on a real
//! server holds a shared claim on it, taken by the helper that hands it the
//! server ([`common::clickhouse_url`], [`common::clickhouse_shards`],
//! [`common::real::RealKafka::from_env`], the chdb modules' `chdb_urls`);
//! a test that freezes a ClickHouse server or kills brokers runs alone on
//! that server (`stalled_replica`, `e2e_cluster`, `ops_prometheus`, two of
//! `real_kafka`), and the `effectively_once` runs that need both cores run
//! alone on all of them. Every name a test creates on a server (tables,
//! topics, groups, files) is unique to its module.
//!
//! Run one module with a filter: `cargo test -p spate --test it -- e2e::`.

mod common;

mod avro;
mod chdb;
mod check_sample;
mod cli_text;
// Needs the `containers` feature (testcontainers); `bash ci/test.sh` always
// enables it.
#[cfg(feature = "containers")]
mod containers;
mod e2e;
mod e2e_cluster;
mod e2e_report;
mod effectively_once;
mod metrics;
mod missing_shard_key;
mod multi;
mod ndjson;
mod ops_manifests;
mod ops_prometheus;
mod real_kafka;
mod real_meta;
mod sensor;
mod stalled_replica;
