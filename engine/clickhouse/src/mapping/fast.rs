//! Per-column fast paths of the scanner, chosen once when the encoder is
//! built.
//!
//! A fast path handles only the token a column usually gets (a plain JSON
//! integer for an integer column, a string for a String column) and writes
//! exactly the bytes [`super::coerce::put_scalar`] would write for it. For
//! anything else (another token kind, a fraction or exponent, more than 18
//! digits, a value out of range) it declines before writing a byte, and the
//! scanner takes the general path, so every coercion rule and error message
//! stays with `put_scalar`. `fast_paths_agree_with_put_scalar` and the
//! differential test (`scan_agrees_with_serde`) check that equivalence.

use super::coerce::{TimeRules, is_utc};
use crate::rowbinary::int_shape;
use crate::time::ParsedTime;
use crate::types::ChType;

/// A column's fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fast {
    /// No fast path: always the general walk.
    General,
    /// An integer column of at most 64 bits (maybe Nullable and/or
    /// LowCardinality) taking a plain JSON integer.
    Int {
        /// Bytes written: 1, 2, 4 or 8.
        bytes: u8,
        /// The column's range, within i64 (UInt64's top half is left to
        /// the general path, which a plain 18-digit integer never reaches).
        min: i64,
        /// See `min`.
        max: i64,
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// A String column (maybe Nullable and/or LowCardinality) taking a JSON
    /// string.
    Str {
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// A DateTime or DateTime64 column (maybe Nullable and/or
    /// LowCardinality) taking time text of a fixed shape: RFC 3339 read by
    /// [`crate::time::parse_iso_fixed`], or the first user format's fixed
    /// layout ([`crate::time::TimeFormat::parse_fixed`]).
    Time {
        /// Digits below the second (0 for DateTime).
        precision: u8,
        /// DateTime64 (Int64 ticks) rather than DateTime (UInt32 seconds).
        wide: bool,
        /// The UTC offset naive text is read at, as `time_ticks` decides
        /// it; `None` when naive text is refused (left to the general path).
        naive_offset: Option<i32>,
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
}

/// Ticks of `10^-precision` s for a parsed time at `offset`, within i64
/// (`None` on overflow: the general path explains).
#[inline]
pub(super) fn ticks(t: &ParsedTime, offset: i32, precision: u8) -> Option<i64> {
    let scale = 10i64.checked_pow(u32::from(precision))?;
    let sub = i64::from(t.nanos / 10u32.checked_pow(9u32.checked_sub(u32::from(precision))?)?);
    t.epoch_secs(offset).checked_mul(scale)?.checked_add(sub)
}

impl Fast {
    /// The fast path for a column of type `ty` under `rules`.
    pub(super) fn for_type(ty: &ChType, rules: &TimeRules) -> Fast {
        let (inner, nullable) = match ty.without_low_cardinality() {
            ChType::Nullable(inner) => (inner.without_low_cardinality(), true),
            other => (other, false),
        };
        if matches!(inner, ChType::String) {
            return Fast::Str { nullable };
        }
        let time = match inner {
            ChType::DateTime(tz) => Some((0, false, tz)),
            ChType::DateTime64 { precision, tz } if *precision <= 9 => Some((*precision, true, tz)),
            _ => None,
        };
        if let Some((precision, wide, tz)) = time {
            // As time_ticks: the configured naive offset, else UTC for a
            // column without a zone or with a UTC one.
            let naive_offset = match (rules.naive_offset_secs, tz.as_deref()) {
                (Some(o), _) => Some(o),
                (None, None) => Some(0),
                (None, Some(z)) if is_utc(z) => Some(0),
                (None, Some(_)) => None,
            };
            return Fast::Time {
                precision,
                wide,
                naive_offset,
                nullable,
            };
        }
        match int_shape(inner) {
            Some((bits, signed)) if bits <= 64 => {
                let (min, max) = match (bits, signed) {
                    (64, true) => (i64::MIN, i64::MAX),
                    (64, false) => (0, i64::MAX),
                    (b, true) => (-(1i64 << (b - 1)), (1i64 << (b - 1)) - 1),
                    (b, false) => (0, (1i64 << b) - 1),
                };
                Fast::Int {
                    bytes: (bits / 8) as u8,
                    min,
                    max,
                    nullable,
                }
            }
            _ => Fast::General,
        }
    }
}

/// The value of a plain JSON integer at the start of `s` (`-?(0|[1-9][0-9]*)`
/// with at most 18 digits) and its length in bytes, when the number ends
/// there (no fraction or exponent follows). `None` means: take the general
/// path (which also reports bad grammar).
#[inline]
pub(super) fn plain_int(s: &[u8]) -> Option<(i64, usize)> {
    let neg = s.first() == Some(&b'-');
    let digits_at = usize::from(neg);
    let mut i = digits_at;
    let mut v: i64 = 0;
    while let Some(&c) = s.get(i) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        if i - digits_at == 18 {
            // A 19th digit: may not fit i64; the general path decides.
            return None;
        }
        v = v * 10 + i64::from(d);
        i += 1;
    }
    let n = i - digits_at;
    if n == 0 || (n > 1 && s[digits_at] == b'0') {
        return None;
    }
    if matches!(s.get(i), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    Some((if neg { -v } else { v }, i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::coerce::{Put, Tok, put_scalar};

    #[test]
    fn plain_ints_are_exactly_json_integers() {
        assert_eq!(plain_int(b"0,"), Some((0, 1)));
        assert_eq!(plain_int(b"-0}"), Some((0, 2)));
        assert_eq!(plain_int(b"1750}"), Some((1750, 4)));
        assert_eq!(plain_int(b"-66"), Some((-66, 3)));
        assert_eq!(
            plain_int(b"999999999999999999"),
            Some((999_999_999_999_999_999, 18))
        );
        for declined in [
            &b"1999999999999999999"[..],
            b"01",
            b"-",
            b"-x",
            b"1.5",
            b"1e3",
            b"2E1",
            b"",
            b"\"1\"",
        ] {
            assert_eq!(plain_int(declined), None, "{declined:?}");
        }
    }

    #[test]
    fn fast_paths_agree_with_put_scalar() {
        let types = [
            "Int8",
            "Int16",
            "Int32",
            "Int64",
            "UInt8",
            "UInt16",
            "UInt32",
            "UInt64",
            "Nullable(Int32)",
            "LowCardinality(Nullable(UInt16))",
        ];
        let numbers = [
            "0",
            "-0",
            "1",
            "-1",
            "127",
            "128",
            "-128",
            "-129",
            "255",
            "256",
            "32767",
            "-32768",
            "65535",
            "65536",
            "2147483647",
            "-2147483648",
            "4294967295",
            "4294967296",
            "999999999999999999",
            "-999999999999999999",
        ];
        for ty in types {
            let ty = ChType::parse(ty).unwrap();
            let fast = Fast::for_type(&ty, &TimeRules::default());
            let Fast::Int {
                bytes,
                min,
                max,
                nullable,
            } = fast
            else {
                panic!("{ty} has no integer fast path");
            };
            for n in numbers {
                let (v, len) = plain_int(n.as_bytes()).unwrap();
                assert_eq!(len, n.len());
                let mut want = Vec::new();
                let general = put_scalar(
                    &ty,
                    Tok::Number(n.as_bytes()),
                    &TimeRules::default(),
                    &mut want,
                );
                if (min..=max).contains(&v) {
                    let mut got = Vec::new();
                    if nullable {
                        got.push(0);
                    }
                    got.extend_from_slice(&v.to_le_bytes()[..usize::from(bytes)]);
                    assert_eq!(general, Ok(Put::Written), "{n} into {ty}");
                    assert_eq!(got, want, "{n} into {ty}");
                } else {
                    assert!(general.is_err(), "{n} into {ty} must be refused");
                }
            }
        }
        for ty in [
            "String",
            "Nullable(String)",
            "LowCardinality(String)",
            "LowCardinality(Nullable(String))",
        ] {
            let ty = ChType::parse(ty).unwrap();
            assert_eq!(
                Fast::for_type(&ty, &TimeRules::default()),
                Fast::Str {
                    nullable: ty.is_nullable()
                }
            );
        }
        for ty in ["Int128", "UInt256", "Float64", "Date", "Array(String)"] {
            let ty = ChType::parse(ty).unwrap();
            assert_eq!(
                Fast::for_type(&ty, &TimeRules::default()),
                Fast::General,
                "{ty}"
            );
        }
    }
}
