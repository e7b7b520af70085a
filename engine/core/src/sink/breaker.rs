//! Replica rotation with a circuit breaker per replica.
//!
//! Writes go round robin over a shard's replicas, skipping any whose breaker is
//! open. A breaker opens after `failure_threshold` consecutive failures and
//! stays open for `cooldown`; after that the replica is tried again
//! (half-open): one success closes it, one failure reopens it for another
//! cooldown. When every breaker is open, [`ReplicaSet::pick`] says how long to
//! wait for the first to cool down. Time comes in as an argument (D7).

use tokio::time::Instant;

use crate::sink::BreakerConfig;

/// What [`ReplicaSet::pick`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// Write to the replica with this index.
    Replica(usize),
    /// Every breaker is open; the first closes (half-opens) at this instant.
    WaitUntil(Instant),
}

#[derive(Clone, Debug, Default)]
struct Breaker {
    consecutive_failures: u32,
    open_until: Option<Instant>,
}

/// The replicas of one shard: rotation cursor and breakers.
#[derive(Clone, Debug)]
pub struct ReplicaSet {
    breakers: Vec<Breaker>,
    cursor: usize,
    config: BreakerConfig,
}

impl ReplicaSet {
    /// `replicas` replicas (> 0), all breakers closed.
    pub fn new(replicas: usize, config: BreakerConfig) -> Self {
        assert!(replicas > 0, "a shard needs a replica");
        Self {
            breakers: vec![Breaker::default(); replicas],
            cursor: 0,
            config,
        }
    }

    /// The next replica in rotation whose breaker is closed (or whose cooldown
    /// ended by `now`), advancing the rotation past it.
    pub fn pick(&mut self, now: Instant) -> Pick {
        let n = self.breakers.len();
        for step in 0..n {
            let i = (self.cursor + step) % n;
            if self.breakers[i].open_until.is_none_or(|until| until <= now) {
                self.cursor = (i + 1) % n;
                return Pick::Replica(i);
            }
        }
        let first = self
            .breakers
            .iter()
            .filter_map(|b| b.open_until)
            .min()
            .expect("all breakers open means each has an open_until");
        Pick::WaitUntil(first)
    }

    /// Records a successful write to `replica`: its breaker closes.
    pub fn success(&mut self, replica: usize) {
        self.breakers[replica] = Breaker::default();
    }

    /// Records a failed write to `replica` at `now`; opens its breaker once the
    /// consecutive failures reach the threshold.
    pub fn failure(&mut self, replica: usize, now: Instant) {
        let b = &mut self.breakers[replica];
        b.consecutive_failures = b.consecutive_failures.saturating_add(1);
        if b.consecutive_failures >= self.config.failure_threshold {
            b.open_until = Some(now + self.config.cooldown);
        }
    }

    /// Whether `replica`'s breaker is open in the sense readiness and the
    /// `spate_sink_replica_breaker_open` gauge report: its consecutive
    /// failures reached the threshold and no write succeeded since. Unlike
    /// [`ReplicaSet::is_open`] this stays true after the cooldown, while
    /// the replica waits for (or runs) its half-open trial: a replica that
    /// keeps failing reads as down steadily, not as up for the moment
    /// between a cooldown's end and its trial's failure.
    pub fn is_tripped(&self, replica: usize) -> bool {
        self.breakers[replica].consecutive_failures >= self.config.failure_threshold
    }

    /// Whether `replica`'s breaker is open at `now`.
    pub fn is_open(&self, replica: usize, now: Instant) -> bool {
        self.breakers[replica]
            .open_until
            .is_some_and(|until| until > now)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn set(n: usize) -> ReplicaSet {
        ReplicaSet::new(
            n,
            BreakerConfig {
                failure_threshold: 2,
                cooldown: Duration::from_secs(5),
            },
        )
    }

    #[test]
    fn rotates_and_skips_open_breakers() {
        let now = Instant::now();
        let mut s = set(3);
        assert_eq!(s.pick(now), Pick::Replica(0));
        assert_eq!(s.pick(now), Pick::Replica(1));
        s.failure(2, now);
        s.failure(2, now);
        assert!(s.is_open(2, now));
        assert_eq!(s.pick(now), Pick::Replica(0));
        assert_eq!(s.pick(now), Pick::Replica(1));
        let later = now + Duration::from_secs(5);
        assert_eq!(s.pick(later), Pick::Replica(2), "half-open after cooldown");
    }

    #[test]
    fn tripped_stays_through_the_cooldown_until_a_success() {
        let mut s = set(1);
        let t0 = Instant::now();
        s.failure(0, t0);
        assert!(!s.is_tripped(0), "below the threshold");
        s.failure(0, t0);
        assert!(s.is_tripped(0));
        let later = t0 + Duration::from_secs(3600);
        assert!(!s.is_open(0, later), "cooled down: half-open");
        assert!(s.is_tripped(0), "still tripped until a trial succeeds");
        s.failure(0, later);
        assert!(s.is_tripped(0), "a failed trial keeps it tripped");
        s.success(0);
        assert!(!s.is_tripped(0));
    }

    #[test]
    fn all_open_waits_for_the_first_cooldown() {
        let now = Instant::now();
        let mut s = set(2);
        for r in 0..2 {
            s.failure(r, now + Duration::from_secs(r as u64));
            s.failure(r, now + Duration::from_secs(r as u64));
        }
        assert_eq!(s.pick(now), Pick::WaitUntil(now + Duration::from_secs(5)));
        s.success(1);
        assert_eq!(s.pick(now), Pick::Replica(1));
    }
}
