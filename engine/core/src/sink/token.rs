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

/// One member of a range group as its token names it: the partition, its
/// inclusive range and the range's gap digest (`0`: the log held every
/// offset of it; see `pipeline::eo`'s `range_gaps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupMember<'a> {
    /// The member's partition.
    pub partition: &'a TopicPartition,
    /// Its first offset.
    pub first: Offset,
    /// Its last offset (inclusive).
    pub last: Offset,
    /// Its gap digest (`0`: no gaps).
    pub gaps: u64,
}

/// One splitmix64 step folding `v` into `h`: pure and stable across
/// versions and platforms, as a token must be.
fn mix(h: u64, v: u64) -> u64 {
    let mut h = (h ^ v).wrapping_add(0x9E37_79B9_7F4A_7C15);
    h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// The 64-bit digest of a group's composition: every member's topic,
/// partition, bounds and gap digest, in member order.
fn composition_digest(members: &[GroupMember<'_>]) -> u64 {
    let mut h = mix(0, members.len() as u64);
    for m in members {
        let topic = m.partition.topic().as_bytes();
        h = mix(h, topic.len() as u64);
        for chunk in topic.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            h = mix(h, u64::from_le_bytes(word));
        }
        h = mix(h, m.partition.partition() as u64);
        h = mix(h, m.first as u64);
        h = mix(h, m.last as u64);
        h = mix(h, m.gaps);
    }
    h
}

/// The token of one shard's part of a range group (ADR 0007) of two or more
/// members, sorted by (topic, partition):
/// `{pipeline}:{table}:{anchor topic}:{anchor partition}:{first}-{last}+g{n}.{digest}:{shard}`,
/// the anchor being the first member and `digest` 16 hex digits of a stable
/// hash over every member's topic, partition, bounds and gap digest.
///
/// A pure function of the composition (no run nonce), so a re-formed group
/// gets the token it was first written with (D9). Injective where it must
/// be: a partition's recorded ranges are disjoint, so the anchor's exact
/// range names one recorded group of a pipeline and table; the digest tells
/// apart compositions with the same anchor (a re-formation that lost a
/// member, a log that lost records), so such an insert is another insert,
/// never dropped as the first one's duplicate (ADR 0007, C6). A group of
/// one member is a range: use [`range_token`].
pub fn group_token(
    pipeline: &str,
    table: &str,
    members: &[GroupMember<'_>],
    shard: usize,
) -> String {
    debug_assert!(members.len() >= 2, "D9: a group of one member is a range");
    debug_assert!(
        members.windows(2).all(|w| w[0].partition < w[1].partition),
        "D9: group members are not sorted by partition, or repeat one"
    );
    debug_assert!(
        members.iter().all(|m| m.first <= m.last),
        "D9: a group member's range is empty"
    );
    let anchor = &members[0];
    let mut out = range_token(
        pipeline,
        table,
        anchor.partition,
        anchor.first,
        anchor.last,
        shard,
    );
    // Insert the group's suffix before the shard, keeping six fields.
    let cut = out.rfind(':').expect("a range token has fields");
    let digest = composition_digest(members);
    let suffix = format!("+g{}.{digest:016x}", members.len());
    out.insert_str(cut, &suffix);
    debug_assert_eq!(
        out.matches(':').count(),
        5,
        "D4: group token {out} is not six `:`-separated fields"
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
    fn group_token_layout_and_composition() {
        let a = TopicPartition::new("flights", 0);
        let b = TopicPartition::new("flights", 1);
        let c = TopicPartition::new("other", 1);
        let m = |p, first, last, gaps| GroupMember {
            partition: p,
            first,
            last,
            gaps,
        };
        let g = [m(&a, 10, 19, 0), m(&b, 0, 4, 0)];
        let t = group_token("p", "db.t", &g, 1);
        assert!(t.starts_with("p:db.t:flights:0:10-19+g2."), "{t}");
        assert!(t.ends_with(":1"), "{t}");
        assert_eq!(t.len(), "p:db.t:flights:0:10-19+g2.:1".len() + 16, "{t}");
        assert_eq!(t, group_token("p", "db.t", &g, 1), "pure");
        assert_ne!(t, group_token("p", "db.t", &g, 0), "the shard");
        // Every part of the composition changes the token.
        for other in [
            vec![m(&a, 10, 19, 0), m(&b, 0, 5, 0)],
            vec![m(&a, 10, 19, 0), m(&b, 1, 4, 0)],
            vec![m(&a, 10, 19, 0), m(&b, 0, 4, 7)],
            vec![m(&a, 10, 19, 0), m(&c, 0, 4, 0)],
            vec![m(&a, 10, 19, 0), m(&b, 0, 4, 0), m(&c, 0, 0, 0)],
        ] {
            assert_ne!(t, group_token("p", "db.t", &other, 1), "{other:?}");
        }
        // Never the token of the anchor's range alone.
        assert_ne!(t, range_token("p", "db.t", &a, 10, 19, 1));
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
