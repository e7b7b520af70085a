//! spate-sim: a deterministic simulator of Kafka brokers and ClickHouse shard
//! replicas that drives spate-core's **real** pipeline (controller, drivers,
//! checkpointer, sink pool, drain), not a model of it (DESIGN "Simulation").
//!
//! Only the edges are simulated: [`broker::SimSource`] implements the source
//! seam (partitions with append-only logs, a producer, a consumer group with
//! rebalance and eviction, a commit store that survives crashes) and
//! [`clickhouse::SimWriter`] implements the writer seam (shards with a
//! table and a dedup window shared by their replicas, as ReplicatedMergeTree
//! keeps block ids in ZooKeeper; replicas that go down, fail, time out after
//! writing, or answer too late).
//!
//! Issue 16 added the faults real clusters have (offset gaps, truncation,
//! retention, a slow coordinator; partial inserts, schema changes, a frozen
//! replica running every queued retry: [`config::FaultKind`]), a table with
//! typed value columns ([`schema`]) whose rows the value oracle checks, and
//! planted simulator bugs ([`planted`]).
//!
//! One `u64` seed decides the workload, the fault schedule and every random
//! choice ([`config::SimConfig::from_seed`]). Each process incarnation runs on
//! a current-thread tokio runtime with paused time, so a run is a pure function
//! of its seed (D7): [`harness::run_seed`] returns the same trace hash every
//! time. A crash drops the runtime mid-run (engine state lost; logs, commits
//! and tables kept) and starts a new incarnation.
//!
//! The simulator records facts (commits with the durable prefix at that
//! instant, tokens with the bytes they carried, drain durations, landings);
//! `spate-verify` judges them against D1, D4, D5, D6 and liveness.

pub mod broker;
pub mod clickhouse;
pub mod config;
pub mod harness;
pub mod planted;
pub mod schema;
pub mod world;
