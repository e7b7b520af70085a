//! The range list of `delivery: effectively_once` (D9): the sealed ranges of
//! one partition that the committed offset has not passed yet, encoded into
//! that partition's Kafka offset-commit metadata.
//!
//! A range `(first, last)` is inclusive: the offsets of one partition whose
//! rows make up one batch per shard. A lane records a range here (a commit
//! whose metadata lists it) before any shard's part of it is written, and a
//! lane assigned later re-forms exactly the listed ranges before forming new
//! ones, so a replay rebuilds the same batches with the same tokens.
//!
//! Wire format, version 1 (ASCII; compact so that [`MAX_PENDING_RANGES`]
//! fit Kafka's default `offset.metadata.max.bytes` of 4,096 bytes,
//! <https://kafka.apache.org/documentation/#brokerconfigs_offset.metadata.max.bytes>):
//!
//! ```text
//! spate1:<first>.<len>[,<gap>.<len>]*
//! ```
//!
//! numbers in lower-case base 36; `len = last - first`; `gap = first -
//! previous last - 1`. Ranges are sorted and disjoint, so every number is
//! non-negative. The empty list is the empty string (what Kafka stores when
//! nothing is given).
//!
//! Decoding is strict: the empty string is "no ranges"; anything else must be
//! our version 1 exactly, or it is an error. A metadata string written by
//! another tool is never taken as "no ranges": a lane that ignored a range
//! list it could not read would form new batches over recorded ones and
//! insert them twice (D9). The caller names the partition.
//!
//! Version 2 (ADR 0007) adds **range groups**: a range that is one member of
//! an insert carrying the ranges of several partitions. Every member's record
//! names the whole group, so the owner of any member can re-form it:
//!
//! ```text
//! spate2:<topic>[|<topic>]*;<item>[,<item>]*;
//! item   = <lead>.<len>[@<member>]*
//! member = <topic index>.<partition>.<first>.<len>
//! ```
//!
//! `<lead>.<len>` is this partition's own range as in version 1; the members
//! after it are the group's other partitions, sorted by (topic, partition),
//! never this one; topics are indices into the table, which lists the
//! topics the members use, sorted, each once. An item with no member is a
//! solo range. The closing `;` makes a truncated record an error. A record
//! with no group is written as version 1 (so a solo's record, and its
//! token, are what an older spate wrote: the upgrade path); version 1 still
//! decodes, as solos. [`decode_record`] refuses, naming the metadata, a
//! record that is not ours, malformed, truncated, or longer than
//! [`MAX_METADATA_BYTES`].
//!
//! Tests: the round trip, the size bound and the refusals are proptests below.

use crate::record::{Offset, TopicPartition};

/// Kafka's default `offset.metadata.max.bytes`: the broker refuses a commit
/// whose metadata is longer (`OFFSET_METADATA_TOO_LARGE`).
pub const MAX_METADATA_BYTES: usize = 4_096;

/// The prefix naming the format and its version.
pub const PREFIX: &str = "spate1:";

/// The prefix of version 2: a record that holds range groups (ADR 0007).
pub const PREFIX_V2: &str = "spate2:";

/// Longest base-36 rendering of a non-negative `i64` (`i64::MAX` is
/// `1y2p0ij32e8e7`, 13 digits).
const MAX_DIGITS: usize = 13;

/// The most bytes one range can take: two numbers, a `.` and a `,`.
pub(crate) const MAX_RANGE_BYTES: usize = 2 * MAX_DIGITS + 2;

/// The most bytes one other member of a group adds to an item of version 2:
/// `@`, a topic index (at most 2 base-36 digits: groups name fewer than
/// 1,296 topics), a partition (an `i32`: at most 6), two numbers and three
/// `.`.
pub(crate) const MAX_MEMBER_BYTES: usize = 1 + 2 + 6 + 2 * MAX_DIGITS + 3;

/// The bytes a lane's pending items may take in its record: what
/// [`MAX_PENDING_RANGES`] solos take, so a lane of solos holds as many as
/// before groups existed.
pub(crate) const RECORD_CAPACITY: usize = MAX_PENDING_RANGES * MAX_RANGE_BYTES;

/// The most bytes an item of a group of `members` partitions takes in each
/// member's record (a solo: `members == 1`).
pub(crate) const fn item_weight(members: usize) -> usize {
    MAX_RANGE_BYTES + members.saturating_sub(1) * MAX_MEMBER_BYTES
}

/// How many ranges a partition may hold pending: the most whose encoding
/// fits [`MAX_METADATA_BYTES`] whatever their offsets (146). A lane with this
/// many pending ranges seals no new one and pauses (D2: pause and keep
/// polling) until the committed offset passes some.
pub const MAX_PENDING_RANGES: usize = (MAX_METADATA_BYTES - PREFIX.len()) / MAX_RANGE_BYTES;

/// Why a metadata string is not a range list we can use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangesError {
    /// Not empty and not ours (another tool's metadata, or a later version).
    #[error(
        "commit metadata {found:?} is not a spate range list (expected empty or `{PREFIX}...`): \
         another consumer of this group wrote it, or a newer spate; refusing to guess its batches"
    )]
    Foreign {
        /// The start of the metadata (at most 40 bytes).
        found: String,
    },
    /// Longer than the broker's default limit: not a record spate wrote.
    #[error(
        "commit metadata {found:?}... is {len} bytes, over the {MAX_METADATA_BYTES}-byte \
         limit spate writes within: not a spate range record; refusing to guess its batches"
    )]
    TooLarge {
        /// The start of the metadata (at most 40 bytes).
        found: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A version 2 record holding a range group, read by a build whose
    /// pipeline forms no groups yet (ADR 0007): re-forming only this
    /// partition's member would write part of the group under another
    /// token (C7), so the partition stops instead.
    #[error(
        "commit metadata {found:?} records a range group (ADR 0007), written by a newer spate; \
         this build cannot re-form groups, refusing to replay part of one"
    )]
    GroupNotReformed {
        /// The start of the metadata (at most 40 bytes).
        found: String,
    },
    /// Ours by its prefix, but not well formed.
    #[error("commit metadata {found:?} is a malformed spate range list: {reason}")]
    Malformed {
        /// The start of the metadata (at most 40 bytes).
        found: String,
        /// What is wrong.
        reason: String,
    },
}

/// One member of a recorded range group: a partition's inclusive range.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// The member's partition.
    pub partition: TopicPartition,
    /// Its first offset.
    pub first: Offset,
    /// Its last offset (inclusive).
    pub last: Offset,
}

/// One item of a partition's record: its own range and, when that range is
/// a member of a range group, the group's composition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The partition's own range.
    pub first: Offset,
    /// Its last offset (inclusive).
    pub last: Offset,
    /// Empty for a solo range; else every member of the group, sorted by
    /// partition, this partition's own range among them.
    pub group: Vec<Member>,
}

impl Recorded {
    /// A solo range (version 1's only kind).
    pub fn solo(first: Offset, last: Offset) -> Self {
        Self {
            first,
            last,
            group: Vec::new(),
        }
    }
}

fn excerpt(s: &str) -> String {
    let mut end = s.len().min(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn push_base36(out: &mut String, mut n: u64) {
    let mut digits = [0u8; MAX_DIGITS];
    let mut i = MAX_DIGITS;
    loop {
        i -= 1;
        let d = (n % 36) as u8;
        digits[i] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[i..]).expect("ascii digits"));
}

/// Encodes `ranges` (sorted by offset, disjoint, each `first <= last`, all
/// offsets >= 0); the empty list encodes as `""`.
///
/// Panics when the list breaks those rules (the caller's bug: lanes seal
/// ranges in offset order).
pub fn encode(ranges: &[(Offset, Offset)]) -> String {
    if ranges.is_empty() {
        return String::new();
    }
    let mut out = String::with_capacity(PREFIX.len() + ranges.len() * 8);
    out.push_str(PREFIX);
    let mut prev_last: Option<Offset> = None;
    for &(first, last) in ranges {
        assert!(first >= 0, "range {first}..={last} starts below 0");
        assert!(first <= last, "range {first}..={last} is empty");
        let lead = match prev_last {
            None => first,
            Some(p) => {
                assert!(
                    first > p,
                    "range {first}..={last} overlaps the one ending at {p}"
                );
                out.push(',');
                first - p - 1
            }
        };
        push_base36(&mut out, lead as u64);
        out.push('.');
        push_base36(&mut out, (last - first) as u64);
        prev_last = Some(last);
    }
    debug_assert!(
        out.len() <= PREFIX.len() + ranges.len() * MAX_RANGE_BYTES,
        "D9: {} ranges took {} bytes, past the bound the pending limit is sized by",
        ranges.len(),
        out.len()
    );
    debug_assert_eq!(
        decode(&out).as_deref(),
        Ok(ranges),
        "D9: the range list does not decode to the ranges it records"
    );
    out
}

fn parse_base36(s: &str, whole: &str) -> Result<i64, RangesError> {
    let bad = |reason: String| RangesError::Malformed {
        found: excerpt(whole),
        reason,
    };
    if s.is_empty() || s.len() > MAX_DIGITS {
        return Err(bad(format!(
            "number {s:?} has 0 or more than {MAX_DIGITS} digits"
        )));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(bad(format!("number {s:?} has a leading zero")));
    }
    let mut n: u64 = 0;
    for c in s.bytes() {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'z' => c - b'a' + 10,
            _ => return Err(bad(format!("{:?} is not a base-36 digit", c as char))),
        };
        n = n
            .checked_mul(36)
            .and_then(|n| n.checked_add(u64::from(d)))
            .ok_or_else(|| bad(format!("number {s:?} overflows")))?;
    }
    i64::try_from(n).map_err(|_| bad(format!("number {s:?} is beyond i64")))
}

/// Decodes a partition's commit metadata: `""` is no ranges; our version 1
/// is its ranges, in offset order.
///
/// # Errors
/// [`RangesError::Foreign`] for any other string, [`RangesError::Malformed`]
/// for ours with bad syntax or offsets beyond `i64`. Never "no ranges" for a
/// string it cannot read (D9).
pub fn decode(metadata: &str) -> Result<Vec<(Offset, Offset)>, RangesError> {
    if metadata.is_empty() {
        return Ok(Vec::new());
    }
    let Some(body) = metadata.strip_prefix(PREFIX) else {
        return Err(RangesError::Foreign {
            found: excerpt(metadata),
        });
    };
    let bad = |reason: &str| RangesError::Malformed {
        found: excerpt(metadata),
        reason: reason.to_owned(),
    };
    let mut out = Vec::new();
    let mut prev_last: Option<Offset> = None;
    for item in body.split(',') {
        let (lead, len) = item
            .split_once('.')
            .ok_or_else(|| bad("a range is not `<number>.<number>`"))?;
        let lead = parse_base36(lead, metadata)?;
        let len = parse_base36(len, metadata)?;
        let first = match prev_last {
            None => lead,
            Some(p) => p
                .checked_add(1)
                .and_then(|n| n.checked_add(lead))
                .ok_or_else(|| bad("offsets overflow i64"))?,
        };
        let last = first
            .checked_add(len)
            .ok_or_else(|| bad("offsets overflow i64"))?;
        out.push((first, last));
        prev_last = Some(last);
    }
    debug_assert!(
        !out.is_empty(),
        "D9: metadata {metadata:?} that is not empty decoded to no ranges"
    );
    debug_assert!(
        out.windows(2).all(|w| w[0].1 < w[1].0),
        "D9: decoded ranges are not sorted and disjoint"
    );
    Ok(out)
}

/// Decodes `own`'s record into the solo ranges a lane re-forms, refusing a
/// record that holds a group ([`RangesError::GroupNotReformed`]) as well as
/// everything [`decode_record`] refuses.
///
/// # Errors
/// As [`decode_record`], and a group in the record.
pub fn decode_solos(
    metadata: &str,
    own: &TopicPartition,
) -> Result<Vec<(Offset, Offset)>, RangesError> {
    let items = decode_record(metadata, own)?;
    if items.iter().any(|i| !i.group.is_empty()) {
        return Err(RangesError::GroupNotReformed {
            found: excerpt(metadata),
        });
    }
    Ok(items.into_iter().map(|i| (i.first, i.last)).collect())
}

/// Kafka's longest topic name.
const MAX_TOPIC_LEN: usize = 249;

fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= MAX_TOPIC_LEN
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Encodes `own`'s record: `items` sorted by offset and disjoint, each a
/// solo or a group holding `own`'s range among its sorted members. A record
/// with no group is version 1 ([`encode`]); else version 2. The caller keeps
/// the result within [`MAX_METADATA_BYTES`] (checked in debug builds).
///
/// Panics when the items break those rules (the caller's bug).
pub fn encode_record(own: &TopicPartition, items: &[Recorded]) -> String {
    if items.iter().all(|i| i.group.is_empty()) {
        let solos: Vec<(Offset, Offset)> = items.iter().map(|i| (i.first, i.last)).collect();
        return encode(&solos);
    }
    let mut topics: Vec<&str> = items
        .iter()
        .flat_map(|i| i.group.iter())
        .filter(|m| m.partition != *own)
        .map(|m| m.partition.topic())
        .collect();
    topics.sort_unstable();
    topics.dedup();
    let mut out = String::with_capacity(256);
    out.push_str(PREFIX_V2);
    out.push_str(&topics.join("|"));
    out.push(';');
    let mut prev_last: Option<Offset> = None;
    for item in items {
        assert!(
            0 <= item.first && item.first <= item.last,
            "range {}..={} is empty or below 0",
            item.first,
            item.last
        );
        let lead = match prev_last {
            None => item.first,
            Some(p) => {
                assert!(
                    item.first > p,
                    "range {}.. overlaps the one ending at {p}",
                    item.first
                );
                out.push(',');
                item.first - p - 1
            }
        };
        push_base36(&mut out, lead as u64);
        out.push('.');
        push_base36(&mut out, (item.last - item.first) as u64);
        push_members(&mut out, own, item, &topics);
        prev_last = Some(item.last);
    }
    out.push(';');
    debug_assert_eq!(
        decode_record(&out, own).as_deref(),
        Ok(items),
        "D9: the record does not decode to the items it records"
    );
    out
}

/// Appends the members of `item`'s group other than `own` (`@ti.p.first.len`).
fn push_members(out: &mut String, own: &TopicPartition, item: &Recorded, topics: &[&str]) {
    if item.group.is_empty() {
        return;
    }
    assert!(
        item.group
            .windows(2)
            .all(|w| w[0].partition < w[1].partition),
        "group members are not sorted by partition, or repeat one"
    );
    assert!(
        item.group
            .iter()
            .any(|m| m.partition == *own && (m.first, m.last) == (item.first, item.last)),
        "a group recorded for {own} does not hold its range {}..={}",
        item.first,
        item.last
    );
    for m in item.group.iter().filter(|m| m.partition != *own) {
        assert!(0 <= m.first && m.first <= m.last, "member range is empty");
        let ti = topics
            .binary_search(&m.partition.topic())
            .expect("in the table");
        out.push('@');
        push_base36(out, ti as u64);
        out.push('.');
        push_base36(out, m.partition.partition() as u64);
        out.push('.');
        push_base36(out, m.first as u64);
        out.push('.');
        push_base36(out, (m.last - m.first) as u64);
    }
}

/// Decodes `own`'s commit metadata: `""` is nothing recorded; version 1 is
/// its ranges as solos; version 2 its solos and groups, in offset order.
///
/// # Errors
/// [`RangesError::TooLarge`] past [`MAX_METADATA_BYTES`],
/// [`RangesError::Foreign`] for a string that is not ours,
/// [`RangesError::Malformed`] for ours with bad syntax, a truncated record,
/// or a group that does not hold `own`'s range. Never "nothing recorded"
/// for a string it cannot read (D9).
pub fn decode_record(metadata: &str, own: &TopicPartition) -> Result<Vec<Recorded>, RangesError> {
    if metadata.len() > MAX_METADATA_BYTES {
        return Err(RangesError::TooLarge {
            found: excerpt(metadata),
            len: metadata.len(),
        });
    }
    if let Some(body) = metadata.strip_prefix(PREFIX_V2) {
        let items = decode_v2(metadata, body, own)?;
        debug_assert!(
            items.iter().any(|i| !i.group.is_empty()),
            "D9: a version 2 record decoded without a group"
        );
        return Ok(items);
    }
    let solos = decode(metadata)?;
    Ok(solos
        .into_iter()
        .map(|(f, l)| Recorded::solo(f, l))
        .collect())
}

fn decode_v2(whole: &str, body: &str, own: &TopicPartition) -> Result<Vec<Recorded>, RangesError> {
    let bad = |reason: &str| RangesError::Malformed {
        found: excerpt(whole),
        reason: reason.to_owned(),
    };
    let body = body
        .strip_suffix(';')
        .ok_or_else(|| bad("truncated: no closing `;`"))?;
    let (table, list) = body
        .split_once(';')
        .ok_or_else(|| bad("no `;` after the topic table"))?;
    let topics: Vec<&str> = table.split('|').collect();
    if !topics.iter().all(|t| valid_topic(t)) || !topics.windows(2).all(|w| w[0] < w[1]) {
        return Err(bad(
            "the topic table is not sorted, distinct, valid topic names",
        ));
    }
    let mut used = vec![false; topics.len()];
    let mut out: Vec<Recorded> = Vec::new();
    for item in list.split(',') {
        let mut fields = item.split('@');
        let (lead, len) = fields
            .next()
            .and_then(|r| r.split_once('.'))
            .ok_or_else(|| bad("an item does not start with `<number>.<number>`"))?;
        let (lead, len) = (parse_base36(lead, whole)?, parse_base36(len, whole)?);
        let first = match out.last() {
            None => Some(lead),
            Some(p) => p.last.checked_add(1).and_then(|n| n.checked_add(lead)),
        }
        .ok_or_else(|| bad("offsets overflow i64"))?;
        let last = first
            .checked_add(len)
            .ok_or_else(|| bad("offsets overflow i64"))?;
        let mut group = Vec::new();
        for m in fields {
            group.push(parse_member(m, whole, &topics, &mut used)?);
        }
        if !group.windows(2).all(|w| w[0].partition < w[1].partition)
            || group.iter().any(|m| m.partition == *own)
        {
            return Err(bad(
                "group members are not sorted, repeat one, or name this partition",
            ));
        }
        if !group.is_empty() {
            let me = Member {
                partition: own.clone(),
                first,
                last,
            };
            let at = group.partition_point(|m| m.partition < me.partition);
            group.insert(at, me);
        }
        out.push(Recorded { first, last, group });
    }
    if !used.iter().all(|&u| u) || out.iter().all(|i| i.group.is_empty()) {
        return Err(bad("a topic of the table is unused, or no item is a group"));
    }
    Ok(out)
}

/// Parses one `<topic index>.<partition>.<first>.<len>` member.
fn parse_member(
    text: &str,
    whole: &str,
    topics: &[&str],
    used: &mut [bool],
) -> Result<Member, RangesError> {
    let bad = |reason: &str| RangesError::Malformed {
        found: excerpt(whole),
        reason: reason.to_owned(),
    };
    let mut n = [0i64; 4];
    let mut fields = text.split('.');
    for slot in &mut n {
        let f = fields
            .next()
            .ok_or_else(|| bad("a group member has fewer than 4 numbers"))?;
        *slot = parse_base36(f, whole)?;
    }
    if fields.next().is_some() {
        return Err(bad("a group member has more than 4 numbers"));
    }
    let [ti, partition, first, len] = n;
    let topic = usize::try_from(ti)
        .ok()
        .filter(|&t| t < topics.len())
        .ok_or_else(|| bad("a group member's topic index is past the table"))?;
    let partition =
        i32::try_from(partition).map_err(|_| bad("a group member's partition is beyond i32"))?;
    let last = first
        .checked_add(len)
        .ok_or_else(|| bad("offsets overflow i64"))?;
    used[topic] = true;
    Ok(Member {
        partition: TopicPartition::new(topics[topic], partition),
        first,
        last,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// [`item_weight`] bounds what an item takes in the worst case: the
    /// largest offsets, partitions and topic indices a group can have.
    #[test]
    fn an_item_never_takes_more_than_its_weight() {
        let topics: Vec<String> = (0..40).map(|i| format!("t{i:02}")).collect();
        let own = TopicPartition::new(topics[0].as_str(), i32::MAX);
        let far = i64::MAX - 1;
        let mut group: Vec<Member> = (1..17)
            .map(|i| Member {
                partition: TopicPartition::new(topics[39 - i % 2].as_str(), i32::MAX - i as i32),
                first: 0,
                last: far,
            })
            .collect();
        group.push(Member {
            partition: own.clone(),
            first: 0,
            last: far,
        });
        group.sort();
        let n = group.len();
        let item = Recorded {
            first: 0,
            last: far,
            group,
        };
        let record = encode_record(&own, std::slice::from_ref(&item));
        let table = record[PREFIX_V2.len()..].find(';').unwrap();
        let items = record.len() - PREFIX_V2.len() - table - 2;
        assert!(
            items <= item_weight(n),
            "{items} bytes for {n} members, weight {}",
            item_weight(n)
        );
    }

    /// Sorted, disjoint ranges, offsets anywhere in `0..=i64::MAX`.
    fn ranges(max: usize) -> impl Strategy<Value = Vec<(Offset, Offset)>> {
        prop::collection::vec((0u64..=u64::MAX >> 1, 0u64..1 << 20), 0..max).prop_map(|raw| {
            let mut v: Vec<(Offset, Offset)> = Vec::new();
            let mut next: i64 = 0;
            for (gap, len) in raw {
                // Small gaps mostly, sometimes a huge jump; stop at i64::MAX.
                let gap = if gap % 4 == 0 { gap >> 20 } else { gap % 1_000 } as i64;
                let Some(first) = next.checked_add(gap) else {
                    break;
                };
                let Some(last) = first.checked_add(len as i64) else {
                    break;
                };
                v.push((first, last));
                let Some(n) = last.checked_add(1) else { break };
                next = n;
            }
            v
        })
    }

    proptest! {
        #[test]
        fn ranges_round_trip_through_the_metadata(list in ranges(200)) {
            let text = encode(&list);
            prop_assert_eq!(decode(&text).unwrap(), list);
        }

        #[test]
        fn any_text_decodes_to_its_ranges_or_an_error_never_to_nothing(s in ".{1,60}") {
            // Non-empty metadata is never silently "no ranges" (D9).
            if let Ok(list) = decode(&s) {
                prop_assert!(!list.is_empty());
                prop_assert_eq!(encode(&list), s);
            }
        }
    }

    #[test]
    fn the_worst_case_list_fits_the_broker_limit() {
        let mut max = String::new();
        push_base36(&mut max, i64::MAX as u64);
        assert_eq!(max, "1y2p0ij32e8e7");
        assert_eq!(max.len(), MAX_DIGITS);
        assert_eq!(format!("{max}.{max},").len(), MAX_RANGE_BYTES);
        assert_eq!(MAX_PENDING_RANGES, 146);
        // As many ranges as allowed, spread over all of i64 with the widest
        // gaps and lengths that fit.
        let step = i64::MAX / (2 * MAX_PENDING_RANGES as i64 + 1);
        let list: Vec<(Offset, Offset)> = (0..MAX_PENDING_RANGES as i64)
            .map(|i| (step * (2 * i + 1), step * (2 * i + 2)))
            .collect();
        let text = encode(&list);
        assert!(text.len() <= MAX_METADATA_BYTES, "{}", text.len());
        assert_eq!(decode(&text).unwrap(), list);
    }

    #[test]
    fn layout_is_as_documented() {
        assert_eq!(encode(&[]), "");
        assert_eq!(encode(&[(0, 99)]), "spate1:0.2r");
        assert_eq!(
            encode(&[(100, 199), (200, 200), (36, 36)][..2]),
            "spate1:2s.2r,0.0"
        );
        assert_eq!(
            decode("spate1:2s.2r,0.0").unwrap(),
            [(100, 199), (200, 200)]
        );
    }

    #[test]
    fn foreign_and_malformed_metadata_are_errors() {
        for s in ["{\"offset\":3}", "spate2:0.1", " ", "spate1"] {
            assert!(
                matches!(decode(s), Err(RangesError::Foreign { .. })),
                "{s:?}: {:?}",
                decode(s)
            );
        }
        for s in [
            "spate1:",
            "spate1:0.1,",
            "spate1:01.1",
            "spate1:A.1",
            "spate1:0",
            "spate1:zzzzzzzzzzzzzz.0",
        ] {
            assert!(
                matches!(decode(s), Err(RangesError::Malformed { .. })),
                "{s:?}: {:?}",
                decode(s)
            );
        }
    }

    /// A record for partition `flights/1`: items of sorted, disjoint own
    /// ranges, some of them groups with members of other partitions.
    fn records() -> impl Strategy<Value = Vec<Recorded>> {
        let member = (0usize..3, 0i32..6, 0i64..1 << 40, 0i64..1 << 20);
        let item = (
            0i64..1_000,
            0i64..1_000,
            prop::collection::vec(member, 0..5),
        );
        prop::collection::vec(item, 0..8).prop_map(|raw| {
            let own = own();
            let mut next = 0;
            let mut out = Vec::new();
            for (gap, len, members) in raw {
                let (first, last) = (next + gap, next + gap + len);
                next = last + 1;
                let mut group: Vec<Member> = members
                    .into_iter()
                    .map(|(t, p, f, l)| Member {
                        partition: TopicPartition::new(["flights", "a.b-c_d", "zz"][t], p),
                        first: f,
                        last: f + l,
                    })
                    .filter(|m| m.partition != own)
                    .collect();
                group.sort();
                group.dedup_by(|a, b| a.partition == b.partition);
                if !group.is_empty() {
                    group.push(Member {
                        partition: own.clone(),
                        first,
                        last,
                    });
                    group.sort();
                }
                out.push(Recorded { first, last, group });
            }
            out
        })
    }

    fn own() -> TopicPartition {
        TopicPartition::new("flights", 1)
    }

    proptest! {
        /// D9 with ADR 0007: a record round trips, solos as version 1.
        #[test]
        fn records_round_trip_through_the_metadata(items in records()) {
            let text = encode_record(&own(), &items);
            prop_assert!(text.len() <= MAX_METADATA_BYTES);
            if items.iter().all(|i| i.group.is_empty()) {
                prop_assert!(text.is_empty() || text.starts_with(PREFIX), "{}", text);
            } else {
                prop_assert!(text.starts_with(PREFIX_V2), "{}", text);
            }
            prop_assert_eq!(decode_record(&text, &own()).unwrap(), items);
        }

        /// Any non-empty prefix of a group record (Kafka or a tool cut it) is
        /// an error, never fewer items (D9: a lost member would be re-formed
        /// short). The empty string stays "nothing recorded": it is what
        /// Kafka stores when a commit gives no metadata.
        #[test]
        fn a_truncated_group_record_is_an_error(items in records(), cut in 0.0f64..1.0) {
            let text = encode_record(&own(), &items);
            prop_assume!(text.starts_with(PREFIX_V2));
            let at = 1 + ((text.len() - 2) as f64 * cut) as usize;
            prop_assert!(decode_record(&text[..at], &own()).is_err(), "{:?}", &text[..at]);
        }

        #[test]
        fn any_text_decodes_to_its_record_or_an_error_never_to_nothing(s in "spate2:.{0,60}") {
            if let Ok(items) = decode_record(&s, &own()) {
                prop_assert!(!items.is_empty());
                prop_assert_eq!(encode_record(&own(), &items), s);
            }
        }
    }

    #[test]
    fn group_record_layout_and_refusals() {
        let me = own();
        let other = |t: &str, p, first, last| Member {
            partition: TopicPartition::new(t, p),
            first,
            last,
        };
        let items = [
            Recorded::solo(0, 9),
            Recorded {
                first: 10,
                last: 19,
                group: vec![
                    other("flights", 0, 36, 40),
                    other("flights", 1, 10, 19),
                    other("hot", 7, 0, 0),
                ],
            },
        ];
        let text = encode_record(&me, &items);
        assert_eq!(text, "spate2:flights|hot;0.9,0.9@0.0.10.4@1.7.0.0;");
        assert_eq!(decode_record(&text, &me).unwrap(), items);
        // The upgrade path: today's records read as solos.
        assert_eq!(
            decode_record("spate1:2s.2r,0.0", &me).unwrap(),
            [Recorded::solo(100, 199), Recorded::solo(200, 200)]
        );
        assert_eq!(decode_record("", &me).unwrap(), []);
        // Another partition's record does not name `me` where it should.
        let other_tp = TopicPartition::new("flights", 0);
        assert!(decode_record(&text, &other_tp).is_err());
        let long = format!("{PREFIX_V2}{}", "a".repeat(MAX_METADATA_BYTES));
        assert!(matches!(
            decode_record(&long, &me),
            Err(RangesError::TooLarge { len, .. }) if len == long.len()
        ));
        assert!(matches!(
            decode_record("connect-state", &me),
            Err(RangesError::Foreign { .. })
        ));
        for s in [
            "spate2:flights|hot;0.9,0.9@0.0.10.4@1.7.0.0",
            "spate2:flights|hot;0.9,0.9@0.0.10.4;",
            "spate2:hot|flights;0.9@0.7.0.0@1.0.1.1;",
            "spate2:hot;0.9;",
            "spate2:;0.9@0.0.0.0;",
            "spate2:hot;0.9@0.7.0.0@0.7.0.0;",
            "spate2:hot;0.9@0.7.0;",
            "spate2:hot;0.9@1.7.0.0;",
            "spate2:flights;0.9@0.1.0.0;",
            "spate2:hot;",
        ] {
            assert!(
                matches!(decode_record(s, &me), Err(RangesError::Malformed { .. })),
                "{s:?}: {:?}",
                decode_record(s, &me)
            );
        }
        // The error names the metadata (the caller names the partition).
        let e = decode_record("spate2:hot;0.9@0.7.0;", &me).unwrap_err();
        assert!(e.to_string().contains("spate2:hot;0.9@0.7.0;"), "{e}");
    }
}
