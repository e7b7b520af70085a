//! spate-core: the engine's seams and its correctness-critical parts.
//!
//! This crate holds everything that decides *whether data is safe*, and nothing
//! that talks to a real Kafka broker or ClickHouse server:
//!
//! - [`record`] and [`source`]: the record seam (a zero-copy [`record::Payload`]
//!   borrowed from its lane) and the source seam ([`source::Lane`],
//!   [`source::Source`]) that the Kafka source and the simulator implement.
//! - [`ack`]: one [`ack::AckHandle`] per poll batch; the last clone dropped means
//!   delivered, [`ack::AckHandle::fail`] means failed. Resolutions travel over an
//!   unbounded channel (D3).
//! - [`checkpoint`]: the [`checkpoint::Tracker`] that turns resolutions into
//!   committable offsets per partition and epoch (D1).
//! - [`budget`]: the in-flight byte and row budget (D8), try-acquire only (D2).
//! - [`sink`]: the writer seam and the sink pool: per-shard queues, one worker
//!   per shard, sealing, dedup tokens (D4), retries, circuit breakers and a
//!   bounded drain (D5).
//! - [`metrics`]: metric names and pre-registered handles.
//! - [`pipeline`]: the runtime (chain, lanes on threads, controller), and in
//!   `pipeline::eo` the offset ranges recorded ahead in the commit metadata
//!   for `delivery: effectively_once` (D9).
//!
//! The invariants D1..D9 are numbered in `docs/DESIGN.md` (each with the
//! tests that check it) and cited by number throughout; in debug builds
//! `debug_assert!`s whose messages start with the number state them where
//! they could break (acks, the tracker, the checkpointer, the range list,
//! the tokens, `delivery: effectively_once`'s range formers and recorder).
//!
//! Time is read only through tokio's clock and randomness only through seeded
//! RNGs (D7), so the simulator can replay a run from one seed.
#![forbid(unsafe_code)]

pub mod ack;
pub mod budget;
pub mod checkpoint;
pub mod error;
pub mod metrics;
#[cfg(not(loom))]
pub mod pipeline;
pub mod planted;
pub mod record;
pub mod sink;
pub mod source;
mod sync;
