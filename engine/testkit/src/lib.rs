//! spate's test kit: what spate's own tests, benches and examples share,
//! and what a library user needs to test a pipeline of their own.
//!
//! Dev-only (`publish = false`): depend on it under `[dev-dependencies]`
//! (`spate-testkit = { path = "engine/testkit" }`); spate's libraries never
//! link it. One exception: the `spate` binary links [`sensor::avro`] for
//! `spate produce --sensor`, which produces the benchmark workload.
//!
//! - [`scripted`]: a [`ScriptedSource`] (partitions with logs you append to,
//!   assignment events you script, a commit store you inspect), a
//!   [`CaptureWriter`] (records every write attempt; can be told to fail or
//!   hang) and a [`LineEncoder`] (one newline-terminated row per payload).
//!   `engine/core/tests/it/pipeline_smoke.rs` is a complete example.
//! - [`lane`]: the in-memory lane state machine ([`lane::MemLane`]) the
//!   scripted source and the simulator's `SimLane` share; each supplies a
//!   [`lane::LaneFeed`] (the simulator's adds its fault hooks).
//! - [`harness`]: a [`Harness`] builder over those three for paused-clock
//!   pipeline tests (partitions filled and assigned, the sink's shape, any
//!   setting), and the [`Run`] it starts (wait until committed, stop).
//! - [`fixtures`]: the 15-column event schema the mapping tests, the
//!   throughput example and the encode bench all measure, and the fixture
//!   files (`fixtures/`: NDJSON samples, the sensor Avro schemas).
//! - [`sensor`]: the sensor benchmark workload, as Avro batches and as flat
//!   Protobuf rows, with the closed form of every value.
//! - [`env`]: the replicated ClickHouse layout from `SPATE_CLICKHOUSE_SHARDS`.
//! - [`process`]: the pid of the local server behind a URL (the real-server
//!   tests freeze and kill ClickHouse replicas through it).
//! - [`serial`]: which tests of one test binary run alone (they freeze or kill
//!   a shared server, or install a process-wide recorder) and the shared
//!   claim the others hold.
//!
//! These doubles use mutexes freely: they are test code, not the record path.
//!
//! Under `--cfg loom` (ci/test.sh's loom step builds spate-core's dev
//! dependencies with it) spate-core leaves its pipeline out, so the kit is
//! empty there: the loom models do not use it.
#![cfg(not(loom))]

pub mod env;
pub mod fixtures;
pub mod harness;
pub mod lane;
pub mod process;
pub mod scripted;
pub mod sensor;
pub mod serial;

pub use harness::{Harness, Run};
pub use scripted::{
    Attempt, CaptureWriter, LineEncoder, ScriptFeed, ScriptHandle, ScriptedLane, ScriptedSource,
    WriterMode,
};
