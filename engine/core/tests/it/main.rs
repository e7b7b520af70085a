//! spate-core's integration tests, one test binary (each module was a test
//! binary of its own). The loom models stay a binary of their own
//! (`tests/loom_models.rs`): ci/test.sh builds them with `--cfg loom` in a
//! separate target directory.
//!
//! Run one module with a filter: `cargo test -p spate-core --test it -- pipeline::`.

mod effectively_once;
mod ndjson_lines;
mod pipeline;
mod pipeline_smoke;
mod possible_duplicates;
mod readiness;
mod replan;
mod sink_pool;
mod tracker_props;
