//! spate-kafka's integration tests against librdkafka's in-process mock
//! cluster, one test binary (each module was a test binary of its own).
//!
//! `mock_metrics` installs a process-wide `metrics` recorder and reads an
//! unlabeled counter that any pipeline in this process would add to, so its
//! tests run alone on it ([`spate_testkit::serial::alone`] on
//! [`Resource::Recorder`](spate_testkit::serial::Resource::Recorder)) and
//! every test that starts a pipeline holds a shared claim ([`common::spawn`]).
//!
//! Run one module with a filter: `cargo test -p spate-kafka --test it -- mock_faults::`.

mod common;

mod mock_cluster;
mod mock_commits;
mod mock_faults;
mod mock_join;
mod mock_metrics;
mod mock_report;
mod throughput;
