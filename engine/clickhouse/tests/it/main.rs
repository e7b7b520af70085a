//! spate-clickhouse's integration tests, one binary (one link of the crate
//! graph) with a module per area:
//!
//! - [`real_server`], [`schema_change`], [`query_id`]: the writer against a
//!   real ClickHouse (opt-in, `SPATE_CLICKHOUSE_URL`; helpers in [`common`]).
//! - [`replicated`], [`distributed_routing`]: replicas and `Distributed`
//!   tables (opt-in, `SPATE_CLICKHOUSE_SHARDS`).
//! - [`chdb_fixtures`]: rows and Native blocks for the modern-engine check
//!   (`ci/chdb_check.py`).
//! - [`no_alloc`]: no allocation per row on the decoders' and the Native
//!   transcode's hot paths (this binary's global allocator counts).
//!
//! Rows are encoded with spate-formats' JSON mapper (a dev-dependency: the
//! sink itself knows no format).

mod chdb_fixtures;
mod common;
mod distributed_routing;
mod no_alloc;
mod query_id;
mod real_server;
mod replicated;
mod schema_change;
