//! Exact integer and decimal arithmetic for values up to 256 bits, so that
//! numbers reach ClickHouse without ever passing through binary floating
//! point: `0.1` into `Decimal(18, 4)` is exactly `1000`, an epoch of
//! `1517966773.840123456` into `DateTime64(9)` keeps all nine digits, and an
//! Int256 from a 70-digit string is exact.
//!
//! - [`U256`]: an unsigned 256-bit magnitude (four little-endian `u64` limbs).
//! - [`Wide`]: sign and magnitude, range checks against any (U)IntN width and
//!   two's complement little-endian output (what RowBinary wants).
//! - [`DecimalText`]: `digits * 10^exp` parsed from JSON number text or a
//!   digit string, then scaled to a target scale exactly (or floored, for
//!   times, which ClickHouse itself truncates to the column's precision).
//!
//! Nothing here allocates.

use std::cmp::Ordering;

/// An unsigned 256-bit integer: little-endian `u64` limbs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct U256(pub [u64; 4]);

impl U256 {
    /// Zero.
    pub const ZERO: U256 = U256([0; 4]);
    /// The largest value, 2^256 - 1.
    pub const MAX: U256 = U256([u64::MAX; 4]);

    /// The value of `v`.
    pub const fn from_u128(v: u128) -> U256 {
        U256([v as u64, (v >> 64) as u64, 0, 0])
    }

    /// The value if it fits in a `u128`.
    pub fn to_u128(self) -> Option<u128> {
        if self.0[2] != 0 || self.0[3] != 0 {
            return None;
        }
        Some(u128::from(self.0[0]) | (u128::from(self.0[1]) << 64))
    }

    /// Whether the value is zero.
    pub fn is_zero(self) -> bool {
        self.0 == [0; 4]
    }

    /// The number of significant bits (0 for zero).
    pub fn bits(self) -> u32 {
        for i in (0..4).rev() {
            if self.0[i] != 0 {
                return 64 * i as u32 + (64 - self.0[i].leading_zeros());
            }
        }
        0
    }

    /// `self * m`, or `None` on overflow.
    pub fn checked_mul_small(self, m: u64) -> Option<U256> {
        let mut out = [0u64; 4];
        let mut carry = 0u128;
        for (o, &limb) in out.iter_mut().zip(self.0.iter()) {
            let p = u128::from(limb) * u128::from(m) + carry;
            *o = p as u64;
            carry = p >> 64;
        }
        (carry == 0).then_some(U256(out))
    }

    /// `self + a`, or `None` on overflow.
    pub fn checked_add_small(self, a: u64) -> Option<U256> {
        let mut out = self.0;
        let mut carry = a;
        for limb in &mut out {
            if carry == 0 {
                break;
            }
            let (s, c) = limb.overflowing_add(carry);
            *limb = s;
            carry = u64::from(c);
        }
        (carry == 0).then_some(U256(out))
    }

    /// `(self / d, self % d)`; `d` must not be zero.
    pub fn div_rem_small(self, d: u64) -> (U256, u64) {
        debug_assert!(d != 0, "division by zero");
        let mut out = [0u64; 4];
        let mut rem = 0u128;
        for i in (0..4).rev() {
            let cur = (rem << 64) | u128::from(self.0[i]);
            out[i] = (cur / u128::from(d)) as u64;
            rem = cur % u128::from(d);
        }
        (U256(out), rem as u64)
    }

    /// `10^n`, or `None` when it exceeds 256 bits (n > 77).
    pub fn pow10(n: u32) -> Option<U256> {
        let mut v = U256::from_u128(1);
        for _ in 0..n {
            v = v.checked_mul_small(10)?;
        }
        Some(v)
    }

    /// Two's complement negation modulo 2^256.
    fn wrapping_neg(self) -> U256 {
        let mut out = [0u64; 4];
        let mut carry = 1u64;
        for (o, &limb) in out.iter_mut().zip(self.0.iter()) {
            let (s, c) = (!limb).overflowing_add(carry);
            *o = s;
            carry = u64::from(c);
        }
        U256(out)
    }
}

impl Ord for U256 {
    fn cmp(&self, other: &Self) -> Ordering {
        for i in (0..4).rev() {
            match self.0[i].cmp(&other.0[i]) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        Ordering::Equal
    }
}

impl PartialOrd for U256 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A signed integer of up to 256 bits of magnitude, as sign and magnitude.
/// Zero is never negative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Wide {
    negative: bool,
    magnitude: U256,
}

impl Wide {
    /// Zero.
    pub const ZERO: Wide = Wide {
        negative: false,
        magnitude: U256::ZERO,
    };

    /// `-magnitude` if `negative`, else `magnitude` (a negative zero becomes zero).
    pub fn new(negative: bool, magnitude: U256) -> Wide {
        Wide {
            negative: negative && !magnitude.is_zero(),
            magnitude,
        }
    }

    /// The value of `v`.
    pub fn from_i128(v: i128) -> Wide {
        Wide::new(v < 0, U256::from_u128(v.unsigned_abs()))
    }

    /// The value of `v`.
    pub fn from_u128(v: u128) -> Wide {
        Wide::new(false, U256::from_u128(v))
    }

    /// Whether the value is below zero.
    pub fn is_negative(self) -> bool {
        self.negative
    }

    /// The absolute value.
    pub fn magnitude(self) -> U256 {
        self.magnitude
    }

    /// The value if it fits an `i128`.
    pub fn to_i128(self) -> Option<i128> {
        let m = self.magnitude.to_u128()?;
        if self.negative {
            0i128.checked_sub_unsigned(m)
        } else {
            i128::try_from(m).ok()
        }
    }

    /// Whether the value fits a ClickHouse integer of `bits` bits (8..=256),
    /// signed (`IntN`: -2^(bits-1) ..= 2^(bits-1)-1) or unsigned (`UIntN`:
    /// 0 ..= 2^bits - 1).
    pub fn fits(self, bits: u32, signed: bool) -> bool {
        debug_assert!((8..=256).contains(&bits), "integer width in bits");
        let mbits = self.magnitude.bits();
        if !signed {
            return !self.negative && mbits <= bits;
        }
        if !self.negative {
            return mbits < bits;
        }
        // -2^(bits-1) is the one negative value whose magnitude has `bits` bits.
        mbits < bits
            || (mbits == bits && self.magnitude.0.iter().map(|l| l.count_ones()).sum::<u32>() == 1)
    }

    /// Appends the low `bytes` bytes of the two's complement representation,
    /// little-endian (RowBinary's integer layout). The caller has checked
    /// [`Wide::fits`].
    pub fn put_le(self, bytes: usize, out: &mut Vec<u8>) {
        debug_assert!(bytes <= 32, "at most 256 bits");
        let v = if self.negative {
            self.magnitude.wrapping_neg()
        } else {
            self.magnitude
        };
        let mut le = [0u8; 32];
        for (i, limb) in v.0.iter().enumerate() {
            le[i * 8..i * 8 + 8].copy_from_slice(&limb.to_le_bytes());
        }
        out.extend_from_slice(&le[..bytes]);
    }

    /// Reads `bytes` little-endian two's complement bytes (signed) or plain
    /// bytes (unsigned).
    pub fn from_le(le: &[u8], signed: bool) -> Wide {
        debug_assert!(le.len() <= 32, "at most 256 bits");
        let negative = signed && le.last().is_some_and(|b| b & 0x80 != 0);
        let mut full = [if negative { 0xff } else { 0 }; 32];
        full[..le.len()].copy_from_slice(le);
        let mut limbs = [0u64; 4];
        for (i, limb) in limbs.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&full[i * 8..i * 8 + 8]);
            *limb = u64::from_le_bytes(b);
        }
        let v = U256(limbs);
        if negative {
            Wide::new(true, v.wrapping_neg())
        } else {
            Wide::new(false, v)
        }
    }
}

/// Why a number text could not become the wanted integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NumError {
    /// Not a number in the accepted grammar `-?digits[.digits][e[+-]digits]`.
    #[error("not a number")]
    NotANumber,
    /// Needs more than 256 bits.
    #[error("number too large")]
    Overflow,
    /// Has non-zero digits below the target scale (would be truncated).
    #[error("has more fractional digits than the column keeps")]
    Inexact,
}

/// How [`DecimalText::scaled`] treats digits below the target scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Refuse them ([`NumError::Inexact`]): numbers are never truncated.
    Exact,
    /// Round toward negative infinity.
    Floor,
    /// Drop them: round toward zero (epoch numbers into a time column, as
    /// ClickHouse converts a number to DateTime64).
    TowardZero,
}

/// A number as written: `(-1)^negative * digits * 10^exp`, exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecimalText {
    /// Whether a minus sign was written (and the value is not zero).
    pub negative: bool,
    /// The significant digits.
    pub digits: U256,
    /// The power of ten they are scaled by.
    pub exp: i32,
}

/// Exponents beyond this are refused outright (no real value needs them, and
/// it keeps the arithmetic bounded).
const MAX_EXP: i32 = 10_000;

impl DecimalText {
    /// Parses `-?digits[.digits][(e|E)[+-]digits]` (JSON's number grammar,
    /// also accepting a leading `+` and leading zeros, for strings of
    /// digits). No whitespace.
    ///
    /// # Errors
    /// [`NumError::NotANumber`] for other text; [`NumError::Overflow`] for
    /// more than 77 significant digits or an exponent beyond ±10000.
    pub fn parse(text: &[u8]) -> Result<DecimalText, NumError> {
        let mut i = 0;
        let negative = match text.first() {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let mut digits = U256::ZERO;
        let mut pending_zeros: u32 = 0;
        let mut frac_digits: i64 = 0;
        let mut any_digit = false;
        let mut in_fraction = false;
        while i < text.len() {
            let c = text[i];
            match c {
                b'0'..=b'9' => {
                    any_digit = true;
                    if in_fraction {
                        frac_digits += 1;
                    }
                    let d = u64::from(c - b'0');
                    if d == 0 {
                        if !digits.is_zero() {
                            pending_zeros += 1;
                            if pending_zeros > 100_000 {
                                return Err(NumError::Overflow);
                            }
                        }
                    } else {
                        digits = if pending_zeros < 19 {
                            // the common case: one limb-wise multiply
                            digits.checked_mul_small(10u64.pow(pending_zeros + 1))
                        } else {
                            U256::pow10(pending_zeros + 1).and_then(|scale| mul(digits, scale))
                        }
                        .and_then(|v| v.checked_add_small(d))
                        .ok_or(NumError::Overflow)?;
                        pending_zeros = 0;
                    }
                }
                b'.' if !in_fraction && any_digit => in_fraction = true,
                b'e' | b'E' if any_digit => break,
                _ => return Err(NumError::NotANumber),
            }
            i += 1;
        }
        if !any_digit || text.last() == Some(&b'.') {
            return Err(NumError::NotANumber);
        }
        let mut exp: i64 = 0;
        if i < text.len() {
            // exponent part: text[i] is e/E
            i += 1;
            let exp_negative = match text.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            if i >= text.len() {
                return Err(NumError::NotANumber);
            }
            for &c in &text[i..] {
                if !c.is_ascii_digit() {
                    return Err(NumError::NotANumber);
                }
                exp = (exp * 10 + i64::from(c - b'0')).min(i64::from(MAX_EXP) * 10);
            }
            if exp_negative {
                exp = -exp;
            }
        }
        let exp = exp - frac_digits + i64::from(pending_zeros);
        if digits.is_zero() {
            return Ok(DecimalText {
                negative: false,
                digits,
                exp: 0,
            });
        }
        if exp.abs() > i64::from(MAX_EXP) {
            return Err(NumError::Overflow);
        }
        Ok(DecimalText {
            negative,
            digits,
            exp: exp as i32,
        })
    }

    /// The value times `10^scale` as an integer: `0.1` at scale 4 is `1000`.
    ///
    /// # Errors
    /// [`NumError::Overflow`] beyond 256 bits; [`NumError::Inexact`] when
    /// `rounding` is [`Rounding::Exact`] and non-zero digits fall below the
    /// scale.
    pub fn scaled(self, scale: i32, rounding: Rounding) -> Result<Wide, NumError> {
        let e = self.exp + scale;
        if self.digits.is_zero() {
            return Ok(Wide::ZERO);
        }
        if e >= 0 {
            let f = U256::pow10(e as u32).ok_or(NumError::Overflow)?;
            let m = mul(self.digits, f).ok_or(NumError::Overflow)?;
            return Ok(Wide::new(self.negative, m));
        }
        let mut q = self.digits;
        let mut lost = false;
        let mut left = -e;
        while left > 0 && !q.is_zero() {
            let step = left.min(19);
            let (nq, r) = q.div_rem_small(10u64.pow(step as u32));
            lost |= r != 0;
            q = nq;
            left -= step;
        }
        if lost {
            match rounding {
                Rounding::Exact => return Err(NumError::Inexact),
                Rounding::Floor if self.negative => {
                    q = q.checked_add_small(1).ok_or(NumError::Overflow)?;
                }
                Rounding::Floor | Rounding::TowardZero => {}
            }
        }
        Ok(Wide::new(self.negative, q))
    }
}

/// `a * b`, or `None` on overflow past 256 bits.
fn mul(a: U256, b: U256) -> Option<U256> {
    let mut out = [0u64; 8];
    for i in 0..4 {
        let mut carry = 0u128;
        for j in 0..4 {
            // (2^64-1)^2 + 2 * (2^64-1) = 2^128 - 1: never overflows u128.
            let cur = u128::from(a.0[i]) * u128::from(b.0[j]) + u128::from(out[i + j]) + carry;
            out[i + j] = cur as u64;
            carry = cur >> 64;
        }
        out[i + 4] = carry as u64;
    }
    if out[4..].iter().any(|&limb| limb != 0) {
        return None;
    }
    Some(U256([out[0], out[1], out[2], out[3]]))
}

/// Parses a plain decimal integer (`-?digits`, at most 18 digits) without
/// the general machinery: the fast path for the common JSON integer.
#[inline]
pub fn fast_i64(text: &[u8]) -> Option<i64> {
    let (neg, digits) = match text.first()? {
        b'-' => (true, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + i64::from(d);
    }
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> DecimalText {
        DecimalText::parse(s.as_bytes()).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn scaled_i128(s: &str, scale: i32, r: Rounding) -> Result<i128, NumError> {
        dec(s)
            .scaled(scale, r)
            .map(|w| w.to_i128().expect("fits i128"))
    }

    #[test]
    fn parses_exactly() {
        assert_eq!(scaled_i128("0.1", 4, Rounding::Exact), Ok(1000));
        assert_eq!(
            scaled_i128("12345.6789", 4, Rounding::Exact),
            Ok(123_456_789)
        );
        assert_eq!(scaled_i128("-1.5e2", 0, Rounding::Exact), Ok(-150));
        assert_eq!(scaled_i128("1200", 0, Rounding::Exact), Ok(1200));
        assert_eq!(scaled_i128("1.50", 1, Rounding::Exact), Ok(15));
        assert_eq!(scaled_i128("0.001", 3, Rounding::Exact), Ok(1));
        assert_eq!(scaled_i128("5.0", 0, Rounding::Exact), Ok(5));
        assert_eq!(scaled_i128("+7", 0, Rounding::Exact), Ok(7));
        assert_eq!(scaled_i128("-0", 0, Rounding::Exact), Ok(0));
        assert_eq!(scaled_i128("1E3", 0, Rounding::Exact), Ok(1000));
        assert_eq!(
            scaled_i128("1.25", 1, Rounding::Exact),
            Err(NumError::Inexact)
        );
        assert_eq!(scaled_i128("1.25", 1, Rounding::Floor), Ok(12));
        assert_eq!(scaled_i128("-1.25", 1, Rounding::Floor), Ok(-13));
        assert_eq!(
            scaled_i128("1517966773.840123456", 9, Rounding::Exact),
            Ok(1_517_966_773_840_123_456)
        );
        assert_eq!(
            scaled_i128("1517966773840", -3, Rounding::Floor),
            Ok(1_517_966_773)
        );
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "", "-", "1.", ".5", "1e", "1e+", "abc", "1,5", " 1", "1 ", "0x10", "1.2.3", "--1",
        ] {
            assert_eq!(
                DecimalText::parse(bad.as_bytes()),
                Err(NumError::NotANumber),
                "{bad:?}"
            );
        }
        assert_eq!(DecimalText::parse(b"1e99999"), Err(NumError::Overflow));
        assert_eq!(
            DecimalText::parse("9".repeat(78).as_bytes()),
            Err(NumError::Overflow)
        );
    }

    #[test]
    fn range_checks_every_width() {
        let w = |s: &str| dec(s).scaled(0, Rounding::Exact).unwrap();
        assert!(w("127").fits(8, true));
        assert!(!w("128").fits(8, true));
        assert!(w("-128").fits(8, true));
        assert!(!w("-129").fits(8, true));
        assert!(w("255").fits(8, false));
        assert!(!w("256").fits(8, false));
        assert!(!w("-1").fits(8, false));
        assert!(w("18446744073709551615").fits(64, false));
        assert!(!w("18446744073709551616").fits(64, false));
        let max256 =
            "115792089237316195423570985008687907853269984665640564039457584007913129639935";
        assert!(w(max256).fits(256, false));
        assert!(!w(max256).fits(256, true));
        let min_i256 =
            "-57896044618658097711785492504343953926634992332820282019728792003956564819968";
        assert!(w(min_i256).fits(256, true));
    }

    #[test]
    fn twos_complement_round_trips() {
        for v in [0i128, 1, -1, 127, -128, i128::MIN, i128::MAX, -300] {
            let mut out = Vec::new();
            Wide::from_i128(v).put_le(16, &mut out);
            assert_eq!(out, v.to_le_bytes());
            assert_eq!(Wide::from_le(&out, true).to_i128(), Some(v));
        }
        let mut out = Vec::new();
        Wide::from_i128(-2).put_le(32, &mut out);
        assert_eq!(
            out,
            [0xfe].into_iter().chain([0xff; 31]).collect::<Vec<_>>()
        );
        assert_eq!(Wide::from_le(&out, true), Wide::from_i128(-2));
    }

    #[test]
    fn multiplication_matches_u128() {
        let a = U256::from_u128(0xffff_ffff_ffff_ffff_ffff);
        let b = U256::from_u128(0x1_0000_0001);
        assert_eq!(
            mul(a, b).and_then(U256::to_u128),
            Some(0xffff_ffff_ffff_ffff_ffffu128 * 0x1_0000_0001)
        );
        assert_eq!(mul(U256::MAX, U256::from_u128(2)), None);
    }

    #[test]
    fn fast_path_agrees() {
        assert_eq!(fast_i64(b"-42"), Some(-42));
        assert_eq!(fast_i64(b"42.0"), None);
        assert_eq!(fast_i64(b"1234567890123456789"), None);
        assert_eq!(fast_i64(b"-"), None);
    }
}
