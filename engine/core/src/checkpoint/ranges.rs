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
//! Tests: the round trip, the size bound and the refusals are proptests below.

use crate::record::Offset;

/// Kafka's default `offset.metadata.max.bytes`: the broker refuses a commit
/// whose metadata is longer (`OFFSET_METADATA_TOO_LARGE`).
pub const MAX_METADATA_BYTES: usize = 4_096;

/// The prefix naming the format and its version.
pub const PREFIX: &str = "spate1:";

/// Longest base-36 rendering of a non-negative `i64` (`i64::MAX` is
/// `1y2p0ij32e8e7`, 13 digits).
const MAX_DIGITS: usize = 13;

/// The most bytes one range can take: two numbers, a `.` and a `,`.
const MAX_RANGE_BYTES: usize = 2 * MAX_DIGITS + 2;

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
    /// Ours by its prefix, but not well formed.
    #[error("commit metadata {found:?} is a malformed spate range list: {reason}")]
    Malformed {
        /// The start of the metadata (at most 40 bytes).
        found: String,
        /// What is wrong.
        reason: String,
    },
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

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
}
