//! Dedup tokens (D4): `{pipeline}-{run nonce}-{shard}-{seq}`, and in
//! `delivery: effectively_once` the nonce-free [`range_token`] (D9).
//!
//! The run nonce is 64 random bits drawn once per pool from the operating
//! system (or given by the simulator), printed as 16 hex digits; `seq` counts
//! the batches a shard worker has sealed in this run. So two different batches
//! never share a token within a run (distinct `(shard, seq)`) or across runs
//! (distinct nonce), and a retry reuses the sealed batch's token verbatim.
//! ClickHouse reads it as the `insert_deduplication_token` setting
//! (<https://clickhouse.com/docs/operations/settings/settings#insert_deduplication_token>).

use std::fmt;
use std::fmt::Write as _;

use crate::record::{Offset, TopicPartition};

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

/// Appends `text` with `%` and `:` percent-escaped, so `:` separates the
/// token's fields unambiguously.
fn push_escaped(out: &mut String, text: &str) {
    let start = out.len();
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    debug_assert!(
        !out[start..].contains(':'),
        "D4: the escaped field {text:?} holds a raw `:`, so two tokens could meet"
    );
    debug_assert!(
        out.len() - start >= text.len(),
        "D4: escaping {text:?} dropped characters"
    );
}

/// The token of one shard's part of a range in `delivery: effectively_once`:
/// `{pipeline}:{table}:{topic}:{partition}:{first}-{last}:{shard}`, with
/// `%` and `:` in `pipeline` and `table` (`database.table`) escaped as
/// `%25` and `%3A` (Kafka topic names cannot hold either).
///
/// A pure function of its arguments, with no run nonce: a replay of the
/// range after a crash or a rebalance computes the same token, so the server
/// drops what it already has (D9). It is injective, so two different parts
/// never share one (D4 across runs holds because a range's rows are the same
/// function of the log in every run). spate also sends it as the insert's
/// ClickHouse `query_id` (any string;
/// <https://clickhouse.com/docs/interfaces/http#setting-query-id>).
pub fn range_token(
    pipeline: &str,
    table: &str,
    partition: &TopicPartition,
    first: Offset,
    last: Offset,
    shard: usize,
) -> String {
    debug_assert!(first <= last, "D9: range {first}..={last} is empty");
    let mut out = String::with_capacity(pipeline.len() + table.len() + 64);
    push_escaped(&mut out, pipeline);
    out.push(':');
    push_escaped(&mut out, table);
    use crate::planted::{Bug, active};
    let p = if active(Bug::RangeTokenWithoutPartition) {
        0
    } else {
        partition.partition()
    };
    let shard = if active(Bug::RangeTokenWithoutShard) {
        0
    } else {
        shard
    };
    debug_assert!(
        !partition.topic().contains(':'),
        "D4: topic {:?} holds a `:`, which Kafka topic names cannot",
        partition.topic()
    );
    write!(out, ":{}:{p}:{first}-{last}:{shard}", partition.topic()).expect("writing to a String");
    debug_assert_eq!(
        out.matches(':').count(),
        5,
        "D4: range token {out} is not six `:`-separated fields"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_token_layout_and_escapes() {
        let tp = TopicPartition::new("flights", 3);
        assert_eq!(
            range_token("p", "db.t", &tp, 100, 199, 1),
            "p:db.t:flights:3:100-199:1"
        );
        assert_eq!(
            range_token("a:b%", "d.t", &tp, 0, 0, 0),
            "a%3Ab%25:d.t:flights:3:0-0:0"
        );
        // Different fields never meet in one token.
        assert_ne!(
            range_token("a:b", "c", &tp, 0, 0, 0),
            range_token("a", "b:c", &tp, 0, 0, 0)
        );
        assert_ne!(
            range_token("p", "t", &tp, 0, 0, 0),
            range_token("p", "t", &TopicPartition::new("flights", 4), 0, 0, 0)
        );
        assert_ne!(
            range_token("p", "t", &tp, 0, 0, 0),
            range_token("p", "t", &tp, 0, 0, 1)
        );
    }

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
