//! RowBinary: the byte layout of one row as ClickHouse reads it after
//! `INSERT INTO t (cols) FORMAT RowBinary`.
//!
//! Source for every layout here: ClickHouse's RowBinary format documentation,
//! <https://clickhouse.com/docs/interfaces/formats/RowBinary> ("Data types wire
//! format"), and the IPv6 type page. Rows and values follow each other with no
//! separators, in the column order the INSERT names:
//!
//! | type | bytes |
//! |---|---|
//! | (U)Int8..256 | little-endian, two's complement for signed |
//! | Float32/64 | IEEE 754 little-endian |
//! | Bool | one byte, 0 or 1 |
//! | String | unsigned LEB128 length, then the bytes |
//! | FixedString(N) | exactly N bytes (we zero-pad shorter values) |
//! | Date | UInt16 days since 1970-01-01 |
//! | Date32 | Int32 days since 1970-01-01 |
//! | DateTime | UInt32 seconds since the epoch |
//! | DateTime64(p) | Int64 ticks of 10^-p s since the epoch |
//! | Decimal(P, S) | the value times 10^S as Int32/64/128/256 (P <= 9/18/38/76) |
//! | Enum8/16 | the value as Int8/Int16 |
//! | UUID | two UInt64 little-endian: the high half (first 16 hex digits) then the low half |
//! | IPv4 | UInt32 little-endian (`1.2.3.4` is `0x01020304`) |
//! | IPv6 | 16 bytes in network (big-endian) order |
//! | Nullable(T) | one byte: 1 = NULL (nothing follows), 0 = a T follows |
//! | LowCardinality(T) | exactly as T |
//! | Array(T) | LEB128 element count, then the elements |
//! | Map(K, V) | LEB128 entry count, then key, value, key, value... |
//! | Tuple(T1, ..) | the elements in order, no header |
//!
//! Nullable inside Array and Map values gets its null byte per element.
//!
//! This module holds the primitive writers (`put_*`, used by the JSON mapper
//! on its hot path: no allocation, append only), a generic owned [`Value`] with
//! [`encode`] for callers that have values rather than JSON, and in
//! [`decode`] the inverse, which tests, the proptest round trip and the
//! simulator use. On error an encoder may have appended part of a value; the
//! caller truncates (the chain's terminal stage does, see
//! `spate_core::pipeline::chain::Encoder`).

pub mod decode;

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::num::Wide;
use crate::types::ChType;

/// Appends `v` as unsigned LEB128 (7 bits per byte, low first, high bit set
/// on every byte but the last): the length prefix of String, Array and Map.
#[inline]
pub fn put_leb128(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Where one Map entry's bytes begin in a row buffer: `(key, value)`, the
/// positions of its key's first byte and its value's first byte. The entry
/// ends where the next one's key begins (the last: at the buffer's end).
pub type MapEntryMark = (usize, usize);

/// Keeps one entry per key among the Map entries just written at the end of
/// `buf` (`marks`, in the order written, the first at the Map's first entry
/// byte, not at its count): a key written again takes its last value, at
/// the place of its first entry. This is "the last one wins" of JSON's
/// repeated keys and Protobuf's map fields; ClickHouse itself would keep
/// every entry and `m[k]` would answer the first. Keys compare by their
/// RowBinary bytes, so two spellings of one value (`"1"`, `"01"` into an
/// integer key) are one key.
///
/// Returns the number of entries left, for the Map's LEB128 count. With no
/// repeated key (the usual case) `buf` is untouched; else its tail is
/// rewritten through `scratch` (cleared first; any contents are lost).
/// Quadratic in the entry count, as the Protobuf path is.
pub fn keep_last_map_entries(
    buf: &mut Vec<u8>,
    marks: &[MapEntryMark],
    scratch: &mut Vec<u8>,
) -> u64 {
    let n = marks.len();
    let end = |k: usize| marks.get(k + 1).map_or(buf.len(), |m| m.0);
    let key = |k: usize| &buf[marks[k].0..marks[k].1];
    let repeated = (1..n).any(|j| (0..j).any(|k| key(k) == key(j)));
    if !repeated {
        return n as u64;
    }
    scratch.clear();
    let mut kept = 0u64;
    for k in 0..n {
        if (0..k).any(|j| key(j) == key(k)) {
            continue; // written at its first entry
        }
        let last = (k..n).rev().find(|&l| key(l) == key(k)).unwrap_or(k);
        scratch.extend_from_slice(key(k));
        scratch.extend_from_slice(&buf[marks[last].1..end(last)]);
        kept += 1;
    }
    debug_assert!(kept < n as u64, "a repeated key leaves fewer entries");
    buf.truncate(marks[0].0);
    buf.extend_from_slice(scratch);
    kept
}

/// Appends a String: LEB128 length, then the bytes.
#[inline]
pub fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    put_leb128(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends the String `input[start..end]`. A string of at most 15 bytes in
/// an input of at least 16 (the usual case) goes as one fixed 16-byte
/// write: its one-byte length followed by the 16-byte input window that
/// holds it (from its start, or the input's last 16 bytes when fewer
/// follow), then the row cut back to the string's end. No `memcpy` call of
/// a run-time length and one capacity check; the other cases are
/// [`put_input_string_rest`]. The caller checks `start <= end <=
/// input.len()`. (Measured: forcing it inline into the scanner's object
/// loop cost about 40 instructions per flight row more than the call.)
#[inline]
pub fn put_input_string(out: &mut Vec<u8>, input: &[u8], start: usize, end: usize) {
    debug_assert!(start <= end, "string span start");
    debug_assert!(end <= input.len(), "string span end");
    let n = end - start;
    if n < 16
        && let Some(last) = input.len().checked_sub(16)
    {
        let from = start.min(last);
        let w = u128::from_le_bytes(input[from..from + 16].try_into().expect("16 bytes"));
        // The string sits `start - from` bytes into the window; an empty
        // one at the input's end has a shift of 16, which wraps to 0 and
        // leaves bytes that the truncate drops.
        let w = w.wrapping_shr(8 * (start - from) as u32);
        let at = out.len();
        out.extend_from_slice(&((w << 8) | n as u128).to_le_bytes());
        out.truncate(at + 1 + n);
        return;
    }
    put_input_string_rest(out, input, start, end);
}

/// [`put_input_string`] for a string of 16 bytes or more, or one within 16
/// bytes of the input's end: a short one as one fixed 16-byte move of the
/// input's last 16 bytes (its single-byte length, the 16 bytes, then the
/// row cut back to the string's end) rather than a `memcpy` call of its
/// length.
#[inline(never)]
fn put_input_string_rest(out: &mut Vec<u8>, input: &[u8], start: usize, end: usize) {
    let n = end - start;
    if n <= 16 {
        // The window: 16 bytes from the start, or the input's last 16 when
        // fewer follow (the string then sits `shift` bytes into it).
        let window = match input.get(start..start + 16) {
            Some(w) => Some(u128::from_le_bytes(w.try_into().expect("16 bytes"))),
            None => input.len().checked_sub(16).map(|from| {
                let w = u128::from_le_bytes(input[from..].try_into().expect("16 bytes"));
                // An empty string at the input's end has `shift` 16: the
                // wrapped shift leaves bytes that the truncate drops.
                w.wrapping_shr(8 * (start - from) as u32)
            }),
        };
        if let Some(w) = window {
            let at = out.len();
            out.push(n as u8);
            out.extend_from_slice(&w.to_le_bytes());
            out.truncate(at + 1 + n);
            return;
        }
    }
    put_string(out, &input[start..end]);
}

/// Appends a FixedString(n): `bytes` zero-padded to `n`. The caller checks
/// `bytes.len() <= n`.
#[inline]
pub fn put_fixed_string(out: &mut Vec<u8>, bytes: &[u8], n: usize) {
    debug_assert!(bytes.len() <= n, "FixedString value longer than N");
    out.extend_from_slice(bytes);
    out.resize(out.len() + (n - bytes.len()), 0);
}

/// Appends a UUID given as its 128-bit number (the 32 hex digits read as one
/// big-endian integer): high 64 bits little-endian, then low 64 bits
/// little-endian.
#[inline]
pub fn put_uuid(out: &mut Vec<u8>, uuid: u128) {
    out.extend_from_slice(&((uuid >> 64) as u64).to_le_bytes());
    out.extend_from_slice(&(uuid as u64).to_le_bytes());
}

/// Appends an IPv4 address as UInt32 little-endian.
#[inline]
pub fn put_ipv4(out: &mut Vec<u8>, ip: Ipv4Addr) {
    out.extend_from_slice(&u32::from(ip).to_le_bytes());
}

/// Appends an IPv6 address as 16 bytes in network order.
#[inline]
pub fn put_ipv6(out: &mut Vec<u8>, ip: Ipv6Addr) {
    out.extend_from_slice(&ip.octets());
}

/// The byte width of a Decimal of `precision` digits (4, 8, 16 or 32).
pub fn decimal_width(precision: u8) -> usize {
    match precision {
        0..=9 => 4,
        10..=18 => 8,
        19..=38 => 16,
        _ => 32,
    }
}

/// `(bits, signed)` of an integer type, `None` for other types.
pub fn int_shape(ty: &ChType) -> Option<(u32, bool)> {
    Some(match ty {
        ChType::Int8 => (8, true),
        ChType::Int16 => (16, true),
        ChType::Int32 => (32, true),
        ChType::Int64 => (64, true),
        ChType::Int128 => (128, true),
        ChType::Int256 => (256, true),
        ChType::UInt8 => (8, false),
        ChType::UInt16 => (16, false),
        ChType::UInt32 => (32, false),
        ChType::UInt64 => (64, false),
        ChType::UInt128 => (128, false),
        ChType::UInt256 => (256, false),
        _ => return None,
    })
}

/// Date range: UInt16 days.
pub const DATE_MAX_DAYS: i64 = u16::MAX as i64;
/// Date32 range: 1900-01-01 ..= 2299-12-31, as days since 1970-01-01.
pub const DATE32_MIN_DAYS: i64 = -25_567;
/// See [`DATE32_MIN_DAYS`].
pub const DATE32_MAX_DAYS: i64 = 120_529;

/// A value to encode, typed loosely: [`encode`] checks it against the
/// column's [`ChType`].
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// NULL (only for Nullable types).
    Null,
    /// Bool.
    Bool(bool),
    /// Any integer type, range-checked against it.
    Int(Wide),
    /// Float32.
    Float32(f32),
    /// Float64.
    Float64(f64),
    /// String or FixedString bytes.
    String(Vec<u8>),
    /// UUID as its 128-bit number (see [`put_uuid`]).
    Uuid(u128),
    /// IPv4.
    Ipv4(Ipv4Addr),
    /// IPv6.
    Ipv6(Ipv6Addr),
    /// Date or Date32: days since 1970-01-01.
    Date(i64),
    /// DateTime: seconds since the epoch.
    DateTime(i64),
    /// DateTime64: ticks of the column's precision since the epoch.
    DateTime64(i64),
    /// Decimal: the value times 10^scale.
    Decimal(Wide),
    /// Enum8/16: the numeric value (must be declared).
    Enum(i16),
    /// Array elements.
    Array(Vec<Value>),
    /// Map entries in order.
    Map(Vec<(Value, Value)>),
    /// Tuple elements.
    Tuple(Vec<Value>),
}

/// A value that does not fit its type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The value's kind does not match the type (a string for an Int32).
    #[error("a {value} value cannot encode as {ty}")]
    Mismatch {
        /// The type, rendered.
        ty: String,
        /// The value's kind.
        value: &'static str,
    },
    /// The value is outside the type's range.
    #[error("{value} is out of range for {ty}")]
    OutOfRange {
        /// The type, rendered.
        ty: String,
        /// The value, rendered.
        value: String,
    },
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Bool(_) => "Bool",
            Value::Int(_) => "integer",
            Value::Float32(_) => "Float32",
            Value::Float64(_) => "Float64",
            Value::String(_) => "string",
            Value::Uuid(_) => "UUID",
            Value::Ipv4(_) => "IPv4",
            Value::Ipv6(_) => "IPv6",
            Value::Date(_) => "date",
            Value::DateTime(_) => "DateTime",
            Value::DateTime64(_) => "DateTime64",
            Value::Decimal(_) => "decimal",
            Value::Enum(_) => "enum",
            Value::Array(_) => "array",
            Value::Map(_) => "map",
            Value::Tuple(_) => "tuple",
        }
    }
}

fn out_of_range(ty: &ChType, value: impl std::fmt::Debug) -> EncodeError {
    EncodeError::OutOfRange {
        ty: ty.to_string(),
        value: format!("{value:?}"),
    }
}

/// Appends `value` as type `ty` in RowBinary.
///
/// # Errors
/// [`EncodeError`] when the value's kind does not match `ty` or is out of its
/// range; `out` may then hold part of the value (truncate it).
pub fn encode(ty: &ChType, value: &Value, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let mismatch = || EncodeError::Mismatch {
        ty: ty.to_string(),
        value: value.kind(),
    };
    match (ty, value) {
        (ChType::Nullable(inner), Value::Null) => {
            let _ = inner;
            out.push(1);
        }
        (ChType::Nullable(inner), v) => {
            out.push(0);
            encode(inner, v, out)?;
        }
        (ChType::LowCardinality(inner), v) => encode(inner, v, out)?,
        (_, Value::Null) => return Err(mismatch()),
        (ChType::Bool, Value::Bool(b)) => out.push(u8::from(*b)),
        (t, Value::Int(w)) if int_shape(t).is_some() => {
            let (bits, signed) = int_shape(t).unwrap_or((64, true));
            if !w.fits(bits, signed) {
                return Err(out_of_range(ty, w.to_i128()));
            }
            w.put_le(bits as usize / 8, out);
        }
        (ChType::Float32, Value::Float32(f)) => out.extend_from_slice(&f.to_le_bytes()),
        (ChType::Float64, Value::Float64(f)) => out.extend_from_slice(&f.to_le_bytes()),
        (ChType::String | ChType::Json(_), Value::String(s)) => put_string(out, s),
        (ChType::FixedString(n), Value::String(s)) => {
            if s.len() > *n {
                return Err(out_of_range(ty, String::from_utf8_lossy(s)));
            }
            put_fixed_string(out, s, *n);
        }
        (ChType::Uuid, Value::Uuid(u)) => put_uuid(out, *u),
        (ChType::Ipv4, Value::Ipv4(ip)) => put_ipv4(out, *ip),
        (ChType::Ipv6, Value::Ipv6(ip)) => put_ipv6(out, *ip),
        (ChType::Date, Value::Date(d)) => {
            if !(0..=DATE_MAX_DAYS).contains(d) {
                return Err(out_of_range(ty, d));
            }
            out.extend_from_slice(&(*d as u16).to_le_bytes());
        }
        (ChType::Date32, Value::Date(d)) => {
            if !(DATE32_MIN_DAYS..=DATE32_MAX_DAYS).contains(d) {
                return Err(out_of_range(ty, d));
            }
            out.extend_from_slice(&(*d as i32).to_le_bytes());
        }
        (ChType::DateTime(_), Value::DateTime(s)) => {
            let s = u32::try_from(*s).map_err(|_| out_of_range(ty, s))?;
            out.extend_from_slice(&s.to_le_bytes());
        }
        (ChType::DateTime64 { .. }, Value::DateTime64(t)) => {
            out.extend_from_slice(&t.to_le_bytes());
        }
        (ChType::Decimal { precision, .. }, Value::Decimal(w)) => {
            put_decimal(ty, *precision, *w, out)?;
        }
        (ChType::Enum8(pairs), Value::Enum(v)) => {
            let v8 = i8::try_from(*v).map_err(|_| out_of_range(ty, v))?;
            if !pairs.iter().any(|(_, p)| *p == v8) {
                return Err(out_of_range(ty, v));
            }
            out.push(v8 as u8);
        }
        (ChType::Enum16(pairs), Value::Enum(v)) => {
            if !pairs.iter().any(|(_, p)| p == v) {
                return Err(out_of_range(ty, v));
            }
            out.extend_from_slice(&v.to_le_bytes());
        }
        (ChType::Array(inner), Value::Array(items)) => {
            put_leb128(out, items.len() as u64);
            for item in items {
                encode(inner, item, out)?;
            }
        }
        (ChType::Map(k, v), Value::Map(entries)) => {
            put_leb128(out, entries.len() as u64);
            for (key, value) in entries {
                encode(k, key, out)?;
                encode(v, value, out)?;
            }
        }
        (ChType::Tuple(elements), Value::Tuple(items)) => {
            if elements.len() != items.len() {
                return Err(mismatch());
            }
            for (e, item) in elements.iter().zip(items) {
                encode(&e.ty, item, out)?;
            }
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// 10^0 ..= 10^38, every power of ten a u128 holds.
const POW10_U128: [u128; 39] = {
    let mut t = [1u128; 39];
    let mut i = 1;
    while i < 39 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// Appends a Decimal(`precision`, _) whose value times 10^scale is `scaled`,
/// checking `|scaled| < 10^precision`.
///
/// # Errors
/// [`EncodeError::OutOfRange`] when it has more than `precision` digits.
pub fn put_decimal(
    ty: &ChType,
    precision: u8,
    scaled: Wide,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    // The common case without 256-bit arithmetic: a magnitude within u128
    // against a precision whose 10^p fits u128 (p <= 38).
    let too_big = match (
        scaled.magnitude().to_u128(),
        POW10_U128.get(usize::from(precision)),
    ) {
        (Some(m), Some(&limit)) => m >= limit,
        _ => {
            let limit =
                crate::num::U256::pow10(u32::from(precision)).unwrap_or(crate::num::U256::MAX);
            scaled.magnitude() >= limit
        }
    };
    if too_big {
        return Err(out_of_range(ty, scaled.to_i128()));
    }
    scaled.put_le(decimal_width(precision), out);
    Ok(())
}

#[cfg(test)]
mod tests;
