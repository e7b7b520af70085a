//! spate's integration tests, one test binary (each module was a test
//! binary of its own; one binary links once instead of nineteen times).
//!
//! Tests of different modules run side by side in this one process, so what
//! they share is guarded: the real servers through
//! [`spate_testkit::serial`] (a test that freezes or kills a shared server,
//! or needs the machine to itself, runs alone; every test on a shared server
//! holds a shared claim, taken by [`common::clickhouse_url`],
//! [`common::clickhouse_shards`] and [`common::real::RealKafka::from_env`]),
//! and every name a test creates on a server (tables, topics, groups, files)
//! is unique to its module.
//!
//! Run one module with a filter: `cargo test -p spate --test it -- e2e::`.

mod common;

mod avro;
mod chdb;
mod check_sample;
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
