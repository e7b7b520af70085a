//! Dedup tokens (D4): `{pipeline}-{run nonce}-{shard}-{seq}`.
//!
//! The run nonce is 64 random bits drawn once per pool from the operating
//! system (or given by the simulator), printed as 16 hex digits; `seq` counts
//! the batches a shard worker has sealed in this run. So two different batches
//! never share a token within a run (distinct `(shard, seq)`) or across runs
//! (distinct nonce), and a retry reuses the sealed batch's token verbatim.
//! ClickHouse reads it as the `insert_deduplication_token` setting
//! (<https://clickhouse.com/docs/operations/settings/settings#insert_deduplication_token>).

use std::fmt;

/// The per-run part of every dedup token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunNonce(u64);

impl RunNonce {
    /// 64 random bits from the operating system: a fresh nonce per process run
    /// (and per pool within a process).
    ///
    /// # Errors
    /// The OS randomness source failed (`getrandom::Error`).
    pub fn from_os() -> Result<Self, getrandom::Error> {
        getrandom::u64().map(Self)
    }

    /// A given nonce, for the simulator and tests (D7: replayable runs).
    pub const fn from_u64(value: u64) -> Self {
        Self(value)
    }

    /// The nonce's value.
    pub const fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RunNonce {
    /// 16 lower-case hex digits, fixed width, so a token splits unambiguously
    /// from the right.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The token of batch `seq` of `shard` in the run `nonce` of `pipeline`.
pub fn batch_token(pipeline: &str, nonce: RunNonce, shard: usize, seq: u64) -> String {
    format!("{pipeline}-{nonce}-{shard}-{seq}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_layout() {
        let n = RunNonce::from_u64(0xab);
        assert_eq!(
            batch_token("flights", n, 2, 17),
            "flights-00000000000000ab-2-17"
        );
    }

    #[test]
    fn os_nonces_differ() {
        let a = RunNonce::from_os().unwrap();
        let b = RunNonce::from_os().unwrap();
        assert_ne!(a, b);
    }
}
