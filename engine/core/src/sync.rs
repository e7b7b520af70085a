//! Synchronisation primitives, swapped for loom's under `--cfg loom` so the
//! loom models in `tests/loom_models.rs` explore every interleaving of the ack
//! path and the in-flight budget with the very code production runs.

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
