//! Readiness: what `/readyz` answers, and why not.
//!
//! The controller evaluates readiness once per loop (started, every shard
//! has a replica whose breaker is closed, the consumer has no error
//! standing) and publishes it here: a flag any thread reads without a lock,
//! the reason it is not ready (written before the flag drops, refreshed at
//! most every [`REASON_REFRESH`] while it stays down, so the loop formats no
//! string per round), and the `spate_ready` gauge.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::metrics::Gauge;

/// How often the controller rewrites the not-ready reason while readiness
/// stays down (each refresh formats the shards' last errors).
pub const REASON_REFRESH: Duration = Duration::from_millis(250);

/// How often the controller rewrites the consumer's status text
/// ([`Readiness::status`]).
pub const STATUS_REFRESH: Duration = Duration::from_secs(1);

/// A pipeline's readiness, shared with the admin server (cheap to clone).
#[derive(Clone, Debug)]
pub struct Readiness {
    flag: Arc<AtomicBool>,
    reason: Arc<Mutex<String>>,
    status: Arc<Mutex<String>>,
    gauge: Gauge,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Not ready, "starting"; registers the `spate_ready` gauge at 0.
    pub fn new() -> Self {
        let gauge = ::metrics::gauge!(crate::metrics::READY);
        gauge.set(0.0);
        Self {
            flag: Arc::new(AtomicBool::new(false)),
            reason: Arc::new(Mutex::new(
                "starting: probing every replica of every shard".to_owned(),
            )),
            status: Arc::new(Mutex::new(String::new())),
            gauge,
        }
    }

    /// Whether the pipeline is ready now.
    pub fn is_ready(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Why it is not ready (the last reason recorded; meaningless while
    /// [`Readiness::is_ready`]).
    pub fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What the consumer is doing (`Source::consumer_status`, refreshed
    /// every [`STATUS_REFRESH`]): joining since when, the partitions
    /// assigned, the lag and the time without progress; empty when the
    /// source says nothing.
    pub fn status(&self) -> String {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_status(&self, status: String) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
    }

    /// `Ok(())` when ready, else `Err(reason)`: one consistent reading for
    /// an HTTP answer.
    pub fn check(&self) -> Result<(), String> {
        if self.is_ready() {
            Ok(())
        } else {
            Err(self.reason())
        }
    }

    /// The flag alone (what [`crate::pipeline::Pipeline::ready_flag`]
    /// returns).
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.flag)
    }

    pub(crate) fn set_ready(&self) {
        if !self.flag.swap(true, Ordering::AcqRel) {
            self.gauge.set(1.0);
        }
    }

    /// Records `reason`, then drops the flag: a reader that sees it down
    /// finds this reason (or a newer one).
    pub(crate) fn set_not_ready(&self, reason: String) {
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner) = reason;
        if self.flag.swap(false, Ordering::AcqRel) {
            self.gauge.set(0.0);
        }
    }
}
