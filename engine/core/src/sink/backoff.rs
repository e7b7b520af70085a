//! Retry backoff: capped exponential with "equal jitter".
//!
//! After the n-th consecutive failure the base delay is
//! `min(retry.max, retry.initial * 2^(n-1))`; the delay slept is
//! `base/2 + jitter * base/2` with `jitter` in `[0, 1)` drawn from the shard
//! worker's seeded RNG (D7). Jitter spreads retries of many batches that
//! failed together; the lower half keeps a floor so a retry never fires
//! immediately.

use std::time::Duration;

use crate::sink::RetryConfig;

/// The delay before the retry that follows `failures` consecutive failures
/// (`failures >= 1`), given `jitter` in `[0, 1)`. Never exceeds `retry.max`.
pub fn backoff_delay(retry: &RetryConfig, failures: u32, jitter: f64) -> Duration {
    debug_assert!(failures >= 1, "backoff before any failure");
    debug_assert!(
        (0.0..1.0).contains(&jitter),
        "jitter {jitter} outside [0, 1)"
    );
    let exp = failures.saturating_sub(1).min(32);
    let base = retry
        .initial
        .checked_mul(1u32 << exp.min(31))
        .map_or(retry.max, |d| d.min(retry.max));
    let half = base / 2;
    (half + half.mul_f64(jitter.clamp(0.0, 1.0))).min(retry.max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RetryConfig {
        RetryConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            max_attempts: 0,
        }
    }

    #[test]
    fn doubles_then_caps() {
        let c = cfg();
        assert_eq!(backoff_delay(&c, 1, 0.0), Duration::from_millis(50));
        assert_eq!(backoff_delay(&c, 2, 0.0), Duration::from_millis(100));
        assert_eq!(backoff_delay(&c, 3, 0.0), Duration::from_millis(200));
        assert_eq!(backoff_delay(&c, 10, 0.0), Duration::from_secs(1));
        assert!(backoff_delay(&c, 10, 0.999) <= c.max);
        assert!(backoff_delay(&c, u32::MAX, 0.5) <= c.max);
    }

    #[test]
    fn jitter_stays_in_upper_half() {
        let c = cfg();
        for j in [0.0, 0.25, 0.5, 0.99] {
            let d = backoff_delay(&c, 3, j);
            // third failure: base 400 ms, so the delay lies in [200 ms, 400 ms]
            assert!(
                d >= Duration::from_millis(200) && d <= Duration::from_millis(400),
                "{d:?}"
            );
        }
    }
}
