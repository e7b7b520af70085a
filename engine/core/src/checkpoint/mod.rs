//! Checkpointing: from ack resolutions to committable offsets.
//!
//! [`Tracker`] is the synchronous, single-owner state machine (loom and
//! proptest drive it directly). [`Checkpointer`] owns a tracker and the
//! receiving end of the ack channel, counts ack failures and keeps the
//! per-partition committed-offset gauge; the pipeline controller asks it for
//! commit points on every `checkpoint.interval`, on revoke and at shutdown.
//! [`ranges`] is the commit-metadata codec of the range list of
//! `delivery: effectively_once` (D9).

mod checkpointer;
pub mod ranges;
mod tracker;

pub use checkpointer::Checkpointer;
pub use tracker::{Applied, FailedBatch, Tracker};
