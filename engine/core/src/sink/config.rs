//! Sink pool configuration, validated at construction: every bad value is a
//! [`ConfigError`] naming its config key (for example `sink.inflight.max_inflight`).

use std::time::Duration;

/// When a shard worker seals the batch it is filling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Seal once the batch holds this many rows (`sink.batch.max_rows`, > 0).
    pub max_rows: u64,
    /// Seal once the batch holds this many encoded bytes
    /// (`sink.batch.max_bytes`, > 0).
    pub max_bytes: u64,
    /// Seal a non-empty batch this long after its first chunk arrived
    /// (`sink.batch.linger`; 0 seals as soon as the shard's queue is
    /// momentarily empty, merging only the chunks already waiting).
    pub linger: Duration,
}

impl Default for BatchConfig {
    /// 100,000 rows, 16 MiB, 1 s: large parts, as ClickHouse prefers.
    fn default() -> Self {
        Self {
            max_rows: 100_000,
            max_bytes: 16 << 20,
            linger: Duration::from_secs(1),
        }
    }
}

/// Retries of a failed write: capped, jittered exponential backoff.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// Backoff after the first failure (`sink.retry.initial`, > 0).
    pub initial: Duration,
    /// Ceiling of the backoff (`sink.retry.max`, >= initial).
    pub max: Duration,
    /// Attempts before the batch is abandoned and its acks fail
    /// (`sink.retry.max_attempts`); 0 retries until the drain deadline.
    pub max_attempts: u32,
}

impl Default for RetryConfig {
    /// 100 ms doubling to 10 s, 10 attempts (about a minute of trying).
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_attempts: 10,
        }
    }
}

/// The per-replica circuit breaker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open a replica's breaker
    /// (`sink.breaker.failure_threshold`, > 0).
    pub failure_threshold: u32,
    /// How long an open breaker keeps the replica out of rotation before one
    /// trial write (`sink.breaker.cooldown`).
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    /// Open after 3 consecutive failures, for 5 s.
    fn default() -> Self {
        Self {
            failure_threshold: 3,
            cooldown: Duration::from_secs(5),
        }
    }
}

/// Everything the sink pool needs to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkConfig {
    /// The pipeline name, the first part of every dedup token (`pipeline.name`:
    /// 1..=64 characters of `[A-Za-z0-9_.-]`).
    pub pipeline: String,
    /// Replica URLs per shard (`sink.shards`): at least one shard, each with at
    /// least one replica.
    pub shards: Vec<Vec<String>>,
    /// Batch sealing thresholds.
    pub batch: BatchConfig,
    /// Concurrent writes per shard (`sink.inflight.max_inflight`, > 0).
    pub max_inflight: usize,
    /// Chunks a shard's queue holds before `try_send` reports it full
    /// (`sink.queue_chunks`, > 0).
    pub queue_chunks: usize,
    /// A write attempt without an answer after this long counts as a retryable
    /// failure (`sink.write_timeout`, > 0). The write may still have landed:
    /// the retry carries the same token, so the server can drop it (D4).
    pub write_timeout: Duration,
    /// Retry policy.
    pub retry: RetryConfig,
    /// Circuit breaker policy.
    pub breaker: BreakerConfig,
    /// Seed of the backoff jitter (D7). `None` derives it from the run nonce.
    pub seed: Option<u64>,
    /// Whether a replica whose breaker tripped is probed in the background
    /// (the writer's cheap probe, once per `breaker.cooldown`), so its
    /// breaker, the `spate_sink_replica_breaker_open` gauge and readiness
    /// follow the replica rather than the last write to it: without it a
    /// replica that no write happens to pick stays open to the end (issue
    /// 31). A probe that answers closes the breaker as a successful write
    /// does; one that fails re-arms the cooldown. Off by default (the
    /// simulator's schedules assume only writes reach a replica); the
    /// `spate` binary turns it on.
    pub probe_tripped: bool,
}

impl SinkConfig {
    /// A config for `pipeline` writing to `shards` (replica URLs per shard),
    /// with every other setting at its default.
    pub fn new(pipeline: impl Into<String>, shards: Vec<Vec<String>>) -> Self {
        Self {
            pipeline: pipeline.into(),
            shards,
            batch: BatchConfig::default(),
            max_inflight: 2,
            queue_chunks: 16,
            write_timeout: Duration::from_secs(30),
            retry: RetryConfig::default(),
            breaker: BreakerConfig::default(),
            seed: None,
            probe_tripped: false,
        }
    }

    /// Checks every setting.
    ///
    /// # Errors
    /// The first invalid setting, as [`ConfigError::Invalid`] with its key.
    /// Returns the warnings a valid but risky config deserves.
    pub fn validate(&self) -> Result<Vec<ConfigWarning>, ConfigError> {
        let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        if self.pipeline.is_empty()
            || self.pipeline.len() > 64
            || !self.pipeline.chars().all(name_ok)
        {
            return invalid(
                "pipeline.name",
                format!(
                    "{:?} must be 1 to 64 characters of A-Z a-z 0-9 _ . - (it starts every dedup token)",
                    self.pipeline
                ),
            );
        }
        if self.shards.is_empty() {
            return invalid(
                "sink.shards",
                "no shards: list at least one shard of replica URLs",
            );
        }
        for (s, replicas) in self.shards.iter().enumerate() {
            if replicas.is_empty() {
                return invalid(format!("sink.shards[{s}]"), "shard has no replica");
            }
            for (r, url) in replicas.iter().enumerate() {
                if url.trim().is_empty() {
                    return invalid(format!("sink.shards[{s}][{r}]"), "replica URL is empty");
                }
            }
        }
        positive("sink.batch.max_rows", self.batch.max_rows)?;
        positive("sink.batch.max_bytes", self.batch.max_bytes)?;
        positive("sink.inflight.max_inflight", self.max_inflight as u64)?;
        positive("sink.queue_chunks", self.queue_chunks as u64)?;
        positive(
            "sink.breaker.failure_threshold",
            u64::from(self.breaker.failure_threshold),
        )?;
        if self.write_timeout.is_zero() {
            return invalid("sink.write_timeout", "must be greater than 0");
        }
        if self.retry.initial.is_zero() {
            return invalid("sink.retry.initial", "must be greater than 0");
        }
        if self.retry.max < self.retry.initial {
            return invalid(
                "sink.retry.max",
                format!(
                    "{:?} is below sink.retry.initial {:?}",
                    self.retry.max, self.retry.initial
                ),
            );
        }
        let mut warnings = Vec::new();
        if self.retry.max_attempts == 0 && self.retry.max >= LONG_BACKOFF_CEILING {
            warnings.push(ConfigWarning {
                key: "sink.retry.max_attempts",
                message: format!(
                    "retries are unbounded (0) and the backoff ceiling sink.retry.max is {:?}: \
                     a shard that stays down holds its batches and the in-flight budget \
                     until shutdown, and a recovered shard may wait up to that long for its next try",
                    self.retry.max
                ),
            });
        }
        Ok(warnings)
    }
}

/// A backoff ceiling at or above this, combined with unbounded retries, earns a
/// startup warning: a minute without a try hides a recovered shard.
pub(crate) const LONG_BACKOFF_CEILING: Duration = Duration::from_secs(60);

fn positive(key: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return invalid(key, "must be greater than 0");
    }
    Ok(())
}

fn invalid<T>(key: impl Into<String>, reason: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    })
}

/// A configuration value the sink pool cannot run with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `key` holds a value that is out of range or inconsistent.
    #[error("config key `{key}`: {reason}")]
    Invalid {
        /// The offending config key, e.g. `sink.inflight.max_inflight` or `sink.shards[1]`.
        key: String,
        /// Why it is rejected.
        reason: String,
    },
}

impl ConfigError {
    /// The offending config key.
    pub fn key(&self) -> &str {
        match self {
            ConfigError::Invalid { key, .. } => key,
        }
    }
}

/// A valid but risky setting, logged at startup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The config key the warning is about.
    pub key: &'static str,
    /// What the risk is.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> SinkConfig {
        SinkConfig::new("p", vec![vec!["http://a".into()]])
    }

    #[test]
    fn default_config_is_valid() {
        assert_eq!(ok().validate(), Ok(vec![]));
    }

    #[test]
    fn bad_values_name_their_key() {
        type Mutation = fn(&mut SinkConfig);
        let cases: &[(&str, Mutation)] = &[
            ("sink.inflight.max_inflight", |c| c.max_inflight = 0),
            ("sink.shards", |c| c.shards.clear()),
            ("sink.shards[1]", |c| c.shards.push(vec![])),
            ("sink.shards[0][0]", |c| c.shards[0][0] = " ".into()),
            ("sink.batch.max_rows", |c| c.batch.max_rows = 0),
            ("sink.batch.max_bytes", |c| c.batch.max_bytes = 0),
            ("sink.queue_chunks", |c| c.queue_chunks = 0),
            ("sink.write_timeout", |c| c.write_timeout = Duration::ZERO),
            ("sink.retry.initial", |c| c.retry.initial = Duration::ZERO),
            ("sink.retry.max", |c| c.retry.max = Duration::from_millis(1)),
            ("sink.breaker.failure_threshold", |c| {
                c.breaker.failure_threshold = 0
            }),
            ("pipeline.name", |c| c.pipeline = "has space".into()),
            ("pipeline.name", |c| c.pipeline.clear()),
        ];
        for &(key, mutate) in cases {
            let mut c = ok();
            mutate(&mut c);
            let err = c.validate().expect_err(key);
            assert_eq!(err.key(), key, "{err}");
        }
    }

    #[test]
    fn unbounded_retries_with_long_ceiling_warn() {
        let mut c = ok();
        c.retry.max_attempts = 0;
        c.retry.max = Duration::from_secs(300);
        let w = c.validate().unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].key, "sink.retry.max_attempts");
        c.retry.max = Duration::from_secs(5);
        assert!(c.validate().unwrap().is_empty());
    }
}
