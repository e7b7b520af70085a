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

use spate_row::coerce::{TimeRules, is_utc};
use spate_row::rowbinary::int_shape;
use spate_row::time::ParsedTime;
use spate_row::types::ChType;

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
    /// [`spate_row::time::parse_iso_fixed`], or the first user format's fixed
    /// layout ([`spate_row::time::TimeFormat::parse_fixed`]).
    Time {
        /// Digits below the second (0 for DateTime).
        precision: u8,
        /// DateTime64 (Int64 ticks) rather than DateTime (UInt32 seconds).
        wide: bool,
        /// The UTC offset naive text is read at, as `time_ticks` decides
        /// it; `None` when naive text is refused (left to the general path).
        naive_offset: Option<i32>,
        /// The first user format's [`spate_row::time::TimeFormat::fixed_json_len`]
        /// (0 when none): a string of exactly this length is read by
        /// the format's layout without scanning it first.
        fixed_len: u8,
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// A Float32 or Float64 column (maybe Nullable) taking a JSON number
    /// read by [`plain_float`].
    Float {
        /// Float64 rather than Float32.
        wide: bool,
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// A Decimal column of at most 18 digits (maybe Nullable) taking a
    /// number or a string read by [`plain_decimal`].
    Decimal {
        /// Digits in all.
        precision: u8,
        /// Digits after the point.
        scale: u8,
        /// Bytes written: 4 or 8.
        bytes: u8,
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// A Bool column (maybe Nullable) taking `true` or `false`.
    Bool {
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// A UUID column (maybe Nullable) taking its text.
    Uuid {
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// A FixedString(N) column (maybe Nullable and/or LowCardinality)
    /// taking a string of at most N bytes.
    FixedString {
        /// N.
        n: usize,
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
    /// An IPv4 column (maybe Nullable) taking a plain dotted quad.
    Ipv4 {
        /// Whether a 0 null marker goes first.
        nullable: bool,
    },
}

/// Ticks of `10^-precision` s for a parsed time at `offset`, within i64
/// (`None` on overflow: the general path explains).
#[inline]
pub(super) fn ticks(t: &ParsedTime, offset: i32, precision: u8) -> Option<i64> {
    // Table look-ups rather than checked_pow's loop: this runs per row.
    // The divisor stays u32: a 32-bit division is several times cheaper
    // than a 64-bit one on common x86 cores (same instruction count, so
    // callgrind does not show it; wall clock did).
    debug_assert!(t.nanos < 1_000_000_000, "nanos within the second");
    if precision == 0 {
        // DateTime: whole seconds; the nanos floor away.
        return Some(t.epoch_secs(offset));
    }
    let p = usize::from(precision);
    let scale = *POW10.get(p)?;
    let divisor = u32::try_from(*POW10.get(9usize.checked_sub(p)?)?).ok()?;
    let sub = i64::from(t.nanos / divisor);
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
            let fixed_len = rules
                .formats
                .first()
                .and_then(|f| f.fixed_json_len())
                .and_then(|n| u8::try_from(n).ok())
                .unwrap_or(0);
            return Fast::Time {
                precision,
                wide,
                naive_offset,
                fixed_len,
                nullable,
            };
        }
        match inner {
            ChType::Float32 | ChType::Float64 => {
                return Fast::Float {
                    wide: matches!(inner, ChType::Float64),
                    nullable,
                };
            }
            ChType::Decimal { precision, scale } if *precision <= 18 && scale <= precision => {
                return Fast::Decimal {
                    precision: *precision,
                    scale: *scale,
                    bytes: if *precision <= 9 { 4 } else { 8 },
                    nullable,
                };
            }
            ChType::Bool => return Fast::Bool { nullable },
            ChType::Uuid => return Fast::Uuid { nullable },
            ChType::FixedString(n) => return Fast::FixedString { n: *n, nullable },
            ChType::Ipv4 => return Fast::Ipv4 { nullable },
            _ => {}
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

impl Fast {
    /// Whether the column is Nullable, for a column with a fast path
    /// (`None` for [`Fast::General`], which leaves null to the general path).
    #[inline]
    pub(super) fn nullable(&self) -> Option<bool> {
        match *self {
            Fast::General => None,
            Fast::Int { nullable, .. }
            | Fast::Str { nullable }
            | Fast::Time { nullable, .. }
            | Fast::Float { nullable, .. }
            | Fast::Decimal { nullable, .. }
            | Fast::Bool { nullable }
            | Fast::Uuid { nullable }
            | Fast::FixedString { nullable, .. }
            | Fast::Ipv4 { nullable } => Some(nullable),
        }
    }
}

/// `10^k` for `k` in 0..=18.
const POW10: [i64; 19] = {
    let mut t = [1i64; 19];
    let mut k = 1;
    while k < 19 {
        t[k] = t[k - 1] * 10;
        k += 1;
    }
    t
};

/// The value of `text` scaled by `10^scale`, when `text` is exactly
/// `-?[0-9]+(\.[0-9]+)?` with at most 18 digits in all and at most `scale`
/// after the point, and the scaled magnitude is below `10^precision`
/// (`precision` and `scale` at most 18). Leading zeros are taken, as
/// [`spate_row::num::DecimalText::parse`] takes them in strings (the scanner has
/// already refused them in JSON numbers). `None` means: take the general
/// path (exponents, a leading `+`, more digits, trailing non-zero digits
/// past the scale, out of range, bad text).
#[inline]
pub(super) fn plain_decimal(text: &[u8], scale: u8, precision: u8) -> Option<i64> {
    debug_assert!(precision <= 18, "Decimal fast path precision");
    debug_assert!(scale <= precision, "Decimal fast path scale");
    let (neg, body) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    let mut v: i64 = 0;
    let mut n = 0usize;
    let mut point = None;
    for (i, &c) in body.iter().enumerate() {
        let d = c.wrapping_sub(b'0');
        if d <= 9 {
            if n == 18 {
                return None;
            }
            v = v * 10 + i64::from(d);
            n += 1;
        } else if c == b'.' && point.is_none() && i > 0 {
            point = Some(i);
        } else {
            return None;
        }
    }
    let frac = match point {
        // Digits on both sides of the point.
        Some(at) if at + 1 == body.len() => return None,
        Some(at) => body.len() - at - 1,
        None if n == 0 => return None,
        None => 0,
    };
    let up = usize::from(scale).checked_sub(frac)?;
    let v = v.checked_mul(POW10[up])?;
    if v >= POW10[usize::from(precision)] {
        return None;
    }
    Some(if neg { -v } else { v })
}

/// The value of a JSON number's text (already checked against JSON's
/// grammar by the scanner) as a float, for a number without an exponent
/// beyond three digits and at most 40 bytes long (so the general path's
/// exact parse would accept it too), and finite as the column's width
/// (Float32 when not `wide`). `None` means: take the general path.
#[inline]
pub(super) fn plain_float(text: &[u8], wide: bool) -> Option<f64> {
    if text.len() > 40 {
        return None;
    }
    if wide && let Some(f) = short_decimal_f64(text) {
        return Some(f);
    }
    if let Some(e) = text.iter().position(|&c| c == b'e' || c == b'E') {
        let digits = text[e + 1..].iter().filter(|c| c.is_ascii_digit()).count();
        if digits > 3 {
            return None;
        }
    }
    let s = std::str::from_utf8(text).ok()?;
    let f = if wide {
        s.parse::<f64>().ok()?
    } else {
        f64::from(s.parse::<f32>().ok()?)
    };
    f.is_finite().then_some(f)
}

/// Exact powers of ten as f64 (every `10^k` for k <= 22 is a double).
const POW10_F64: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// `-?digits[.digits]` with at most 15 digits in all, as the nearest f64
/// (Clinger's fast path: the digits as an integer below 2^53 and `10^k`
/// are both exact doubles, so one correctly rounded division gives the
/// correctly rounded value, as std's parser returns). `None` for any other
/// text (std decides).
#[inline]
fn short_decimal_f64(text: &[u8]) -> Option<f64> {
    let (neg, body) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    let mut m: u64 = 0;
    let mut n = 0usize;
    let mut frac = None;
    for (i, &c) in body.iter().enumerate() {
        let d = c.wrapping_sub(b'0');
        if d <= 9 {
            if n == 15 {
                return None;
            }
            m = m * 10 + u64::from(d);
            n += 1;
        } else if c == b'.' && frac.is_none() && i > 0 {
            frac = Some(body.len() - i - 1);
        } else {
            return None;
        }
    }
    let k = frac.unwrap_or(0);
    if n == 0 || frac == Some(0) {
        return None;
    }
    // m < 10^15 < 2^53: exact as f64; k <= 15 digits after the point.
    let f = m as f64 / POW10_F64[k];
    Some(if neg { -f } else { f })
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
    use spate_row::coerce::{Put, Tok, put_scalar};

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
        for ty in [
            "Int128",
            "UInt256",
            "Decimal(19, 2)",
            "Decimal(38, 10)",
            "Date",
            "Array(String)",
        ] {
            let ty = ChType::parse(ty).unwrap();
            assert_eq!(
                Fast::for_type(&ty, &TimeRules::default()),
                Fast::General,
                "{ty}"
            );
        }
    }

    #[test]
    fn plain_decimals_read_exactly_or_decline() {
        // (text, scale, precision, value)
        for (text, scale, precision, want) in [
            ("0", 2, 9, Some(0)),
            ("-0", 2, 9, Some(0)),
            ("12.5", 2, 9, Some(1250)),
            ("-12.50", 2, 9, Some(-1250)),
            ("007.25", 2, 9, Some(725)),
            ("9999999.99", 2, 9, Some(999_999_999)),
            ("10000000", 2, 9, None),
            ("-10000000", 2, 9, None),
            ("999999999999999999", 0, 18, Some(999_999_999_999_999_999)),
            ("99999999999999.9999", 4, 18, Some(999_999_999_999_999_999)),
            ("999999999999999.9999", 4, 18, None),
            ("100000000000000", 4, 18, None),
            ("99999999999999.999", 4, 18, Some(999_999_999_999_999_990)),
            ("1.234", 2, 9, None),
            ("1.20", 1, 9, None),
            ("1.", 2, 9, None),
            (".5", 2, 9, None),
            ("-", 2, 9, None),
            ("", 2, 9, None),
            ("+1", 2, 9, None),
            ("1e2", 2, 9, None),
            ("1.2.3", 2, 9, None),
            ("1 ", 2, 9, None),
            ("1234567890123456789", 0, 18, None),
        ] {
            assert_eq!(
                plain_decimal(text.as_bytes(), scale, precision),
                want,
                "{text} as Decimal({precision}, {scale})"
            );
        }
    }

    #[test]
    fn decimal_fast_path_agrees_with_put_scalar() {
        let texts = [
            "0",
            "-0",
            "1",
            "-1",
            "0.5",
            "-0.05",
            "00012.3400",
            "123456789",
            "12345678.9",
            "-99999.9999",
            "100000",
            "99999.99995",
            "1e3",
            "1.5E-1",
            "+7",
            "0x1",
            "",
        ];
        for ty in [
            "Decimal(9, 4)",
            "Nullable(Decimal(18, 4))",
            "Decimal(18, 0)",
            "Decimal(5, 5)",
        ] {
            let ty = ChType::parse(ty).unwrap();
            let Fast::Decimal {
                precision,
                scale,
                bytes,
                nullable,
            } = Fast::for_type(&ty, &TimeRules::default())
            else {
                panic!("{ty} has no Decimal fast path");
            };
            for text in texts {
                let Some(v) = plain_decimal(text.as_bytes(), scale, precision) else {
                    continue;
                };
                for tok in [Tok::Number(text.as_bytes()), Tok::Str(text.as_bytes())] {
                    let mut want = Vec::new();
                    let general = put_scalar(&ty, tok, &TimeRules::default(), &mut want);
                    let mut got = Vec::new();
                    if nullable {
                        got.push(0);
                    }
                    got.extend_from_slice(&v.to_le_bytes()[..usize::from(bytes)]);
                    assert_eq!(general, Ok(Put::Written), "{text} into {ty}");
                    assert_eq!(got, want, "{text} into {ty}");
                }
            }
        }
    }

    #[test]
    fn float_fast_path_agrees_with_put_scalar() {
        let texts = [
            "0",
            "-0",
            "1.5",
            "-2.25e-3",
            "1E+308",
            "1e309",
            "-1e309",
            "3.4028235e38",
            "3.4028236e38",
            "1e-45",
            "1e-999",
            "1e-1000",
            "0.1",
            "123456789012345678901234567890",
            "1234567890123456789012345678901234567890123",
            "4.9e-324",
        ];
        for ty in ["Float64", "Float32", "Nullable(Float64)"] {
            let ty = ChType::parse(ty).unwrap();
            let Fast::Float { wide, nullable } = Fast::for_type(&ty, &TimeRules::default()) else {
                panic!("{ty} has no Float fast path");
            };
            for text in texts {
                let mut want = Vec::new();
                let general = put_scalar(
                    &ty,
                    Tok::Number(text.as_bytes()),
                    &TimeRules::default(),
                    &mut want,
                );
                let Some(f) = plain_float(text.as_bytes(), wide) else {
                    continue;
                };
                let mut got = Vec::new();
                if nullable {
                    got.push(0);
                }
                if wide {
                    got.extend_from_slice(&f.to_le_bytes());
                } else {
                    got.extend_from_slice(&(f as f32).to_le_bytes());
                }
                assert_eq!(general, Ok(Put::Written), "{text} into {ty}");
                assert_eq!(got, want, "{text} into {ty}");
            }
        }
        assert_eq!(plain_float(b"1e309", true), None);
        assert_eq!(plain_float(b"3.4028236e38", false), None);
        assert_eq!(plain_float(b"1e-1000", true), None);
        assert_eq!(plain_float(b"-2.5e-3", true), Some(-0.0025));
    }

    #[test]
    fn short_decimals_round_as_std_does() {
        let mut texts: Vec<String> = [
            "0",
            "-0",
            "-0.0",
            "0.1",
            "0.2",
            "0.3",
            "1.5",
            "-66.25",
            "123456789012345",
            "1234567890123456",
            "0.000000000000001",
            "0.0000000000000001",
            "99999999999999.9",
            "9007199254740993",
            "1.",
            ".5",
            "1.2.3",
            "-",
            "",
            "1e5",
            "01.5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // A deterministic spread of short decimals (no RNG needed).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let digits = (x % 1_000_000_000_000_000) as f64;
            let point = (x >> 50) as usize % 16;
            let mut t = format!("{digits}");
            if point > 0 && point < t.len() {
                t.insert(t.len() - point, '.');
            }
            texts.push(t);
        }
        for t in texts {
            if let Some(f) = short_decimal_f64(t.as_bytes()) {
                assert_eq!(f.to_bits(), t.parse::<f64>().unwrap().to_bits(), "{t}");
            }
        }
        assert_eq!(short_decimal_f64(b"1234567890123456"), None);
        assert_eq!(short_decimal_f64(b"1."), None);
        assert_eq!(short_decimal_f64(b".5"), None);
        assert_eq!(short_decimal_f64(b"1e5"), None);
        assert!(short_decimal_f64(b"-0.0").unwrap().is_sign_negative());
    }

    #[test]
    fn ticks_scale_and_floor_every_precision() {
        let t = ParsedTime {
            wall_secs: 1_700_000_000,
            nanos: 123_456_789,
            offset_secs: None,
        };
        for p in 0..=9u8 {
            let scale = 10i64.pow(u32::from(p));
            let sub = i64::from(t.nanos) / 10i64.pow(9 - u32::from(p));
            assert_eq!(
                ticks(&t, 3600, p),
                Some((1_700_000_000 - 3600) * scale + sub),
                "{p}"
            );
        }
        assert_eq!(ticks(&t, 0, 10), None);
        let far = ParsedTime {
            wall_secs: i64::MAX / 10,
            ..t
        };
        assert_eq!(ticks(&far, 0, 9), None);
    }
}
