//! The hot path: runs a [`Plan`]'s program over one datum, writing the
//! row's RowBinary straight into the chunk buffer.
//!
//! Avro's binary encoding (Avro specification, "Binary Encoding",
//! <https://avro.apache.org/docs/1.11.1/specification/#binary-encoding>):
//! int and long are zig-zag varints; float and double 4 and 8 bytes
//! little-endian; boolean one byte; bytes and string a long length then
//! the bytes; fixed its size in bytes; enum the symbol's index as an int;
//! union the branch index as a long, then the branch's value; array and
//! map a series of blocks, each a long item count (negative: its absolute
//! value, then the block's size in bytes) and the items (a map's as a
//! string key then the value), until a count of 0; a record its fields in
//! order; decimal the unscaled value's two's-complement big-endian bytes
//! (as bytes or fixed); uuid, date and the timestamps as their
//! underlying string, fixed, int or long.
//!
//! No allocation: values are read from the datum slice and appended to
//! the caller's buffer; the only scratch (column spans and the permutation
//! buffer, for a schema whose field order differs from the columns') is
//! owned by the encoder and reused.

use spate_core::pipeline::chain::RecordError;
use spate_core::record::Payload;

use spate_row::meta::{MetaPut, encode_meta};
use spate_row::num::{U256, Wide};
use spate_row::rowbinary::{put_decimal, put_leb128, put_string, put_uuid};
use spate_row::types::ChType;

use super::plan::{Conv, IntDst, KeyConv, MissingCell, Op, Plan, Skip, TimeTo, UBranch};

/// Why a value could not be decoded or converted (no allocation: the
/// encoder renders it with the column, field and schema id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fail {
    /// The datum ended inside a value.
    Truncated,
    /// A varint longer than 10 bytes or beyond 64 bits.
    BadVarint,
    /// An int outside i32.
    IntRange(i64),
    /// A string that is not UTF-8.
    BadUtf8,
    /// A union branch index the union does not have.
    BadBranch(i64),
    /// A negative length or an array/map count that cannot fit the datum.
    BadLength(i64),
    /// An enum index the enum does not have.
    BadEnum(i64),
    /// A value outside the column type's range.
    OutOfRange(i64),
    /// A decimal or scaled value beyond the column's digits.
    TooManyDigits,
    /// A timestamp finer than the column holds.
    Fraction { value: i64, unit: u8 },
    /// A string longer than a FixedString(n).
    TooLong { len: usize, n: usize },
    /// A string that is not one of the Enum's names.
    NotAnEnumName,
    /// Not UUID text, or not 16 bytes.
    BadUuid,
    /// Null into a column that rejects missing values.
    Rejected,
    /// A float value that the column cannot hold exactly.
    Inexact(i64),
    /// Bytes left after the datum.
    Trailing(usize),
    /// The element range of a fanned-out record is not an element.
    BadElement,
    /// A Kafka metadata column, encoded without the message.
    NoMessage,
}

impl Fail {
    /// Whether the datum itself is malformed (a Decode error) rather than
    /// a value that does not fit its column (Encode).
    pub(crate) fn is_decode(self) -> bool {
        matches!(
            self,
            Fail::Truncated
                | Fail::BadVarint
                | Fail::IntRange(_)
                | Fail::BadUtf8
                | Fail::BadBranch(_)
                | Fail::BadLength(_)
                | Fail::BadEnum(_)
                | Fail::Trailing(_)
                | Fail::BadElement
        )
    }

    /// The reason in words, for a column of type `ty` (if any).
    pub(crate) fn describe(self, ty: Option<&ChType>) -> String {
        let ty = ty
            .map(|t| t.to_string())
            .unwrap_or_else(|| "the column".into());
        match self {
            Fail::Truncated => "the datum ends inside this value (truncated)".into(),
            Fail::BadVarint => "a varint longer than 64 bits".into(),
            Fail::IntRange(v) => format!("an int of {v}, outside 32 bits"),
            Fail::BadUtf8 => "a string that is not UTF-8".into(),
            Fail::BadBranch(i) => format!("union branch {i}, which the union does not have"),
            Fail::BadLength(n) => format!("a length or count of {n}, beyond the datum"),
            Fail::BadEnum(i) => format!("enum index {i}, which the enum does not have"),
            Fail::OutOfRange(v) => format!("{v} is out of range for {ty}"),
            Fail::TooManyDigits => format!("the value has more digits than {ty} holds"),
            Fail::Fraction { value, unit } => format!(
                "{value} {} has a fraction of what {ty} holds; it is not rounded (use a \
                 DateTime64 of enough precision)",
                match unit {
                    3 => "ms",
                    6 => "us",
                    _ => "ns",
                }
            ),
            Fail::TooLong { len, n } => format!("{len} bytes do not fit FixedString({n})"),
            Fail::NotAnEnumName => format!("the string is not one of {ty}'s names"),
            Fail::BadUuid => "not a UUID (8-4-4-4-12 hex text, or 16 bytes)".into(),
            Fail::Rejected => "null, and the column is not Nullable and has no DEFAULT spate \
                               can apply"
                .into(),
            Fail::Inexact(v) => format!("{v} does not carry exactly into {ty}"),
            Fail::Trailing(n) => {
                format!("{n} bytes are left after the datum (written with another schema?)")
            }
            Fail::BadElement => "the fanned-out element is not one of the array's".into(),
            Fail::NoMessage => "a Kafka metadata column needs the message (encode through the \
                                chain's Encoder)"
                .into(),
        }
    }
}

/// A read position in a datum.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cur<'a> {
    pub s: &'a [u8],
    pub i: usize,
}

impl<'a> Cur<'a> {
    #[inline]
    pub(crate) fn new(s: &'a [u8], i: usize) -> Self {
        Cur { s, i }
    }

    /// A zig-zag varint long.
    #[inline(always)]
    pub(crate) fn long(&mut self) -> Result<i64, Fail> {
        let b = *self.s.get(self.i).ok_or(Fail::Truncated)?;
        if b < 0x80 {
            self.i += 1;
            return Ok(i64::from(b >> 1) ^ -i64::from(b & 1));
        }
        self.long_multi()
    }

    /// A varint of 2..=8 bytes with 8 bytes readable: one load, the stop
    /// byte found from the continuation bits, the 7-bit groups merged
    /// without a loop; anything else byte by byte.
    #[inline(always)]
    fn long_multi(&mut self) -> Result<i64, Fail> {
        if let Some(w) = self.s.get(self.i..self.i + 8) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            let stop = !w & 0x8080_8080_8080_8080;
            if stop != 0 {
                let n = (stop.trailing_zeros() / 8 + 1) as usize;
                let x = if n == 8 {
                    w
                } else {
                    w & ((1u64 << (8 * n)) - 1)
                };
                let x = x & 0x7f7f_7f7f_7f7f_7f7f;
                let v = (x & 0x7f)
                    | ((x >> 1) & (0x7f << 7))
                    | ((x >> 2) & (0x7f << 14))
                    | ((x >> 3) & (0x7f << 21))
                    | ((x >> 4) & (0x7f << 28))
                    | ((x >> 5) & (0x7f << 35))
                    | ((x >> 6) & (0x7f << 42))
                    | ((x >> 7) & (0x7f << 49));
                self.i += n;
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        self.long_slow()
    }

    #[inline(never)]
    fn long_slow(&mut self) -> Result<i64, Fail> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = *self.s.get(self.i).ok_or(Fail::Truncated)?;
            self.i += 1;
            if shift == 63 && b > 1 {
                return Err(Fail::BadVarint);
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return Err(Fail::BadVarint);
            }
        }
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// A zig-zag varint int (checked to fit 32 bits).
    #[inline(always)]
    pub(crate) fn int(&mut self) -> Result<i64, Fail> {
        let v = self.long()?;
        if i32::try_from(v).is_err() {
            return Err(Fail::IntRange(v));
        }
        Ok(v)
    }

    #[inline(always)]
    pub(crate) fn take_array<const N: usize>(&mut self) -> Result<[u8; N], Fail> {
        let b = self.s.get(self.i..self.i + N).ok_or(Fail::Truncated)?;
        self.i += N;
        Ok(b.try_into().expect("N bytes"))
    }

    #[inline(always)]
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Fail> {
        let end = self.i.checked_add(n).ok_or(Fail::Truncated)?;
        let b = self.s.get(self.i..end).ok_or(Fail::Truncated)?;
        self.i = end;
        Ok(b)
    }

    /// A length (non-negative long) and that many bytes.
    #[inline(always)]
    pub(crate) fn len_bytes(&mut self) -> Result<(usize, usize), Fail> {
        let n = self.long()?;
        if n < 0 {
            return Err(Fail::BadLength(n));
        }
        let start = self.i;
        let end = start.checked_add(n as usize).ok_or(Fail::BadLength(n))?;
        if end > self.s.len() {
            return Err(Fail::Truncated);
        }
        self.i = end;
        Ok((start, end))
    }

    /// A block count: `Some(count)` (after reading a negative count's byte
    /// size), `None` at the end marker; checked against the bytes left
    /// when each item takes at least `min_len`.
    #[inline]
    fn block(&mut self, min_len: usize) -> Result<Option<u64>, Fail> {
        let mut n = self.long()?;
        if n == 0 {
            return Ok(None);
        }
        if n < 0 {
            n = n.checked_neg().ok_or(Fail::BadLength(n))?;
            let size = self.long()?;
            if size < 0 {
                return Err(Fail::BadLength(size));
            }
        }
        let left = (self.s.len() - self.i) as u64;
        let cap = if min_len == 0 {
            1 << 24
        } else {
            left / min_len as u64
        };
        if n as u64 > cap {
            return Err(Fail::BadLength(n));
        }
        Ok(Some(n as u64))
    }
}

/// Decodes past one value (the primitive cases inline).
#[inline(always)]
pub(crate) fn skip(s: &Skip, c: &mut Cur<'_>) -> Result<(), Fail> {
    match s {
        Skip::Zero => Ok(()),
        Skip::Var => c.long().map(drop),
        Skip::Bytes(n) => c.take(*n).map(drop),
        Skip::Len => c.len_bytes().map(drop),
        other => skip_composite(other, c),
    }
}

#[inline(never)]
fn skip_composite(s: &Skip, c: &mut Cur<'_>) -> Result<(), Fail> {
    match s {
        Skip::Zero | Skip::Var | Skip::Bytes(_) | Skip::Len => skip(s, c),
        Skip::Union(branches) => {
            let i = c.long()?;
            let b = usize::try_from(i)
                .ok()
                .and_then(|i| branches.get(i))
                .ok_or(Fail::BadBranch(i))?;
            skip(b, c)
        }
        Skip::Array(item) => skip_blocks(c, item, false),
        Skip::Map(value) => skip_blocks(c, value, true),
        Skip::Record(fields) => {
            for f in fields.iter() {
                skip(f, c)?;
            }
            Ok(())
        }
    }
}

/// The most items one array or map may claim when its items take no
/// bytes (null, empty records): a bound on the work a malformed count can
/// cause.
const MAX_EMPTY_ITEMS: u64 = 1 << 24;

fn skip_blocks(c: &mut Cur<'_>, item: &Skip, map: bool) -> Result<(), Fail> {
    let min = item.min_len() + usize::from(map);
    let mut total = 0u64;
    loop {
        // A block with its byte size could be jumped whole; items are read
        // anyway so a bad size cannot hide a bad item.
        let Some(n) = c.block(min)? else {
            return Ok(());
        };
        total += n;
        if min == 0 && total > MAX_EMPTY_ITEMS {
            return Err(Fail::BadLength(total as i64));
        }
        for _ in 0..n {
            if map {
                c.len_bytes()?;
            }
            skip(item, c)?;
        }
    }
}

/// What a conversion wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cell {
    /// The value.
    Value,
    /// Nothing: the value is null and the column takes its missing value.
    Missing,
}

#[inline(always)]
fn put_int(v: i64, dst: IntDst, out: &mut Vec<u8>) -> Result<(), Fail> {
    let bad = || Fail::OutOfRange(v);
    match (dst.bits, dst.signed) {
        (64, true) => out.extend_from_slice(&v.to_le_bytes()),
        (32, true) => out.extend_from_slice(&i32::try_from(v).map_err(|_| bad())?.to_le_bytes()),
        (64, false) => out.extend_from_slice(&u64::try_from(v).map_err(|_| bad())?.to_le_bytes()),
        (32, false) => out.extend_from_slice(&u32::try_from(v).map_err(|_| bad())?.to_le_bytes()),
        (16, true) => out.extend_from_slice(&i16::try_from(v).map_err(|_| bad())?.to_le_bytes()),
        (16, false) => out.extend_from_slice(&u16::try_from(v).map_err(|_| bad())?.to_le_bytes()),
        (8, true) => out.push(i8::try_from(v).map_err(|_| bad())? as u8),
        (8, false) => out.push(u8::try_from(v).map_err(|_| bad())?),
        (bits, signed) => {
            if !signed && v < 0 {
                return Err(bad());
            }
            Wide::from_i128(i128::from(v)).put_le((bits / 8) as usize, out);
        }
    }
    Ok(())
}

fn pow10(n: u32) -> i64 {
    10i64.pow(n)
}

/// DateTime64's range (ClickHouse documents 1900-01-01 ..= 2299-12-31).
fn dt64_in_range(ticks: i64, p: u8) -> bool {
    use spate_row::coerce::{DATETIME64_MAX_SECS, DATETIME64_MIN_SECS};
    let scale = 10i128.pow(u32::from(p.min(9)));
    (i128::from(DATETIME64_MIN_SECS) * scale..(i128::from(DATETIME64_MAX_SECS) + 1) * scale)
        .contains(&i128::from(ticks))
}

fn put_time(v: i64, unit: u8, to: TimeTo, out: &mut Vec<u8>) -> Result<(), Fail> {
    match to {
        TimeTo::DateTime => {
            let d = pow10(u32::from(unit));
            if v % d != 0 {
                return Err(Fail::Fraction { value: v, unit });
            }
            let secs = u32::try_from(v / d).map_err(|_| Fail::OutOfRange(v))?;
            out.extend_from_slice(&secs.to_le_bytes());
        }
        TimeTo::DateTime64(p) => {
            let ticks = if p >= unit {
                v.checked_mul(pow10(u32::from(p - unit)))
                    .ok_or(Fail::OutOfRange(v))?
            } else {
                let d = pow10(u32::from(unit - p));
                if v % d != 0 {
                    return Err(Fail::Fraction { value: v, unit });
                }
                v / d
            };
            if !dt64_in_range(ticks, p) {
                return Err(Fail::OutOfRange(v));
            }
            out.extend_from_slice(&ticks.to_le_bytes());
        }
    }
    Ok(())
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// 8-4-4-4-12 hex text as the UUID's 128-bit number.
pub(crate) fn parse_uuid(s: &[u8]) -> Option<u128> {
    if s.len() != 36 {
        return None;
    }
    let mut v: u128 = 0;
    for (k, &b) in s.iter().enumerate() {
        if matches!(k, 8 | 13 | 18 | 23) {
            if b != b'-' {
                return None;
            }
            continue;
        }
        v = (v << 4) | u128::from(hex(b)?);
    }
    Some(v)
}

/// Multiplies `w` by 10^`up` exactly.
fn scale_up(w: Wide, up: u32) -> Option<Wide> {
    let mut m: U256 = w.magnitude();
    let mut left = up;
    while left > 0 {
        let k = left.min(19);
        m = m.checked_mul_small(10u64.pow(k))?;
        left -= k;
    }
    Some(Wide::new(w.is_negative(), m))
}

fn put_be_decimal(bytes: &[u8], up: u32, ty: &ChType, out: &mut Vec<u8>) -> Result<(), Fail> {
    let ChType::Decimal { precision, .. } = ty else {
        unreachable!("planned for Decimal columns only");
    };
    // Strip sign-extension bytes beyond 32.
    let mut b = bytes;
    while b.len() > 32 {
        let lead = b[0];
        if (lead != 0 && lead != 0xff) || (b[1] & 0x80) != (lead & 0x80) {
            return Err(Fail::TooManyDigits);
        }
        b = &b[1..];
    }
    if b.is_empty() {
        return Err(Fail::TooManyDigits);
    }
    let mut le = [0u8; 32];
    for (k, &x) in b.iter().rev().enumerate() {
        le[k] = x;
    }
    let w = Wide::from_le(&le[..b.len()], true);
    let w = scale_up(w, up).ok_or(Fail::TooManyDigits)?;
    put_decimal(ty, *precision, w, out).map_err(|_| Fail::TooManyDigits)
}

/// Whether `s[a..b]` is UTF-8: a string of at most 16 bytes with 16
/// bytes readable from its start is ASCII when one masked load has no
/// high bit (the usual case, no call); anything else through std.
#[inline]
fn utf8_ok(s: &[u8], a: usize, b: usize) -> bool {
    let n = b - a;
    if n <= 16
        && let Some(w) = s.get(a..a + 16)
    {
        let w = u128::from_le_bytes(w.try_into().expect("16 bytes"));
        let mask = if n == 16 {
            u128::MAX
        } else {
            (1u128 << (8 * n)) - 1
        };
        if w & mask & 0x8080_8080_8080_8080_8080_8080_8080_8080 == 0 {
            return true;
        }
    }
    std::str::from_utf8(&s[a..b]).is_ok()
}

#[inline(always)]
fn put_str(c: &mut Cur<'_>, utf8: bool, out: &mut Vec<u8>) -> Result<(), Fail> {
    let (a, b) = c.len_bytes()?;
    if utf8 && !utf8_ok(c.s, a, b) {
        return Err(Fail::BadUtf8);
    }
    spate_row::rowbinary::put_input_string(out, c.s, a, b);
    Ok(())
}

#[inline(always)]
fn int_of(c: &mut Cur<'_>, src32: bool) -> Result<i64, Fail> {
    if src32 { c.int() } else { c.long() }
}

impl Conv {
    /// Decodes one value at `c` and appends it as the column's type: the
    /// usual cases inline, the others through [`Conv::put_other`].
    #[inline(always)]
    pub(crate) fn put(&self, c: &mut Cur<'_>, out: &mut Vec<u8>) -> Result<Cell, Fail> {
        match self {
            Conv::Int { src32, dst } => {
                let v = int_of(c, *src32)?;
                put_int(v, *dst, out)?;
            }
            Conv::Str { utf8 } => put_str(c, *utf8, out)?,
            Conv::F64 => out.extend_from_slice(&c.take_array::<8>()?),
            Conv::F32 => out.extend_from_slice(&c.take_array::<4>()?),
            other => return other.put_other(c, out),
        }
        Ok(Cell::Value)
    }

    #[inline(never)]
    fn put_other(&self, c: &mut Cur<'_>, out: &mut Vec<u8>) -> Result<Cell, Fail> {
        match self {
            Conv::Int { src32, dst } => {
                let v = int_of(c, *src32)?;
                put_int(v, *dst, out)?;
            }
            Conv::Str { utf8 } => put_str(c, *utf8, out)?,
            Conv::F64 => out.extend_from_slice(c.take(8)?),
            Conv::F32 => out.extend_from_slice(c.take(4)?),
            Conv::Union(branches) => return put_union(branches, c, out),
            Conv::Nullable(inner) => {
                out.push(0);
                return inner.put(c, out);
            }
            Conv::Bool => put_bool(c, out)?,
            Conv::IntF64 { src32 } => put_int_f64(c, *src32, out)?,
            Conv::IntF32 { src32 } => put_int_f32(c, *src32, out)?,
            Conv::IntDecimal { src32, ty } => put_int_decimal(c, *src32, ty, out)?,
            Conv::F32F64 => {
                let b = c.take(4)?;
                let f = f32::from_le_bytes(b.try_into().expect("4 bytes"));
                out.extend_from_slice(&f64::from(f).to_le_bytes());
            }
            Conv::StrFixed { utf8, n } => put_str_fixed(c, *utf8, *n, out)?,
            Conv::StrEnum { names, w8 } => put_str_enum(c, names, *w8, out)?,
            Conv::StrUuid => {
                let (a, b) = c.len_bytes()?;
                let u = parse_uuid(&c.s[a..b]).ok_or(Fail::BadUuid)?;
                put_uuid(out, u);
            }
            Conv::Fixed { size, n, string } => {
                let bytes = c.take(*size)?;
                if *string {
                    put_string(out, bytes);
                } else {
                    spate_row::rowbinary::put_fixed_string(out, bytes, *n);
                }
            }
            Conv::BinUuid { fixed } => put_bin_uuid(c, *fixed, out)?,
            Conv::EnumStr { symbols } => put_enum_str(c, symbols, out)?,
            Conv::EnumVal { values, w8 } => put_enum_val(c, values, *w8, out)?,
            Conv::Date { date32 } => put_date(c, *date32, out)?,
            Conv::Time { unit, to } => {
                let v = c.long()?;
                put_time(v, *unit, *to, out)?;
            }
            Conv::Decimal { fixed, up, ty } => {
                let bytes = if *fixed > 0 {
                    c.take(*fixed)?
                } else {
                    let (a, b) = c.len_bytes()?;
                    &c.s[a..b]
                };
                put_be_decimal(bytes, *up, ty, out)?;
            }
            Conv::Null { nullable } => {
                if !nullable {
                    return Ok(Cell::Missing);
                }
                out.push(1);
            }
            Conv::Array { item, min_len } => {
                put_blocks(c, out, *min_len, |c, out| item.put(c, out).map(drop))?
            }
            Conv::Map { key, value } => put_blocks(c, out, 1, |c, out| {
                put_map_key(c, key, out)?;
                value.put(c, out).map(drop)
            })?,
        }
        Ok(Cell::Value)
    }
}

/// A union's branch index, then that branch's value (a null, a missing cell or a value).
#[inline(always)]
fn put_union(branches: &[UBranch], c: &mut Cur<'_>, out: &mut Vec<u8>) -> Result<Cell, Fail> {
    let i = c.long()?;
    let b = usize::try_from(i)
        .ok()
        .and_then(|i| branches.get(i))
        .ok_or(Fail::BadBranch(i))?;
    match b {
        UBranch::Null => out.push(1),
        UBranch::Missing => return Ok(Cell::Missing),
        UBranch::Val(conv) => return conv.put(c, out),
    }
    Ok(Cell::Value)
}

/// An Avro boolean byte (0 or 1) as a Bool.
#[inline(always)]
fn put_bool(c: &mut Cur<'_>, out: &mut Vec<u8>) -> Result<(), Fail> {
    let b = c.take(1)?[0];
    if b > 1 {
        return Err(Fail::OutOfRange(i64::from(b)));
    }
    out.push(b);
    Ok(())
}

/// An int or long as a Float64, refused beyond 2^53 (inexact).
#[inline(always)]
fn put_int_f64(c: &mut Cur<'_>, src32: bool, out: &mut Vec<u8>) -> Result<(), Fail> {
    let v = int_of(c, src32)?;
    if v.unsigned_abs() > 1 << 53 {
        return Err(Fail::Inexact(v));
    }
    out.extend_from_slice(&(v as f64).to_le_bytes());
    Ok(())
}

/// An int or long as a Float32, refused beyond 2^24 (inexact).
#[inline(always)]
fn put_int_f32(c: &mut Cur<'_>, src32: bool, out: &mut Vec<u8>) -> Result<(), Fail> {
    let v = int_of(c, src32)?;
    if v.unsigned_abs() > 1 << 24 {
        return Err(Fail::Inexact(v));
    }
    out.extend_from_slice(&(v as f32).to_le_bytes());
    Ok(())
}

/// An int or long as a Decimal column's scaled integer.
#[inline(always)]
fn put_int_decimal(
    c: &mut Cur<'_>,
    src32: bool,
    ty: &ChType,
    out: &mut Vec<u8>,
) -> Result<(), Fail> {
    let v = int_of(c, src32)?;
    let ChType::Decimal { precision, scale } = ty else {
        unreachable!("planned for Decimal columns only");
    };
    let w =
        scale_up(Wide::from_i128(i128::from(v)), u32::from(*scale)).ok_or(Fail::TooManyDigits)?;
    put_decimal(ty, *precision, w, out).map_err(|_| Fail::TooManyDigits)
}

/// A string or bytes as a FixedString(`n`), refused when longer.
#[inline(always)]
fn put_str_fixed(c: &mut Cur<'_>, utf8: bool, n: usize, out: &mut Vec<u8>) -> Result<(), Fail> {
    let (a, b) = c.len_bytes()?;
    let bytes = &c.s[a..b];
    if utf8 && std::str::from_utf8(bytes).is_err() {
        return Err(Fail::BadUtf8);
    }
    if bytes.len() > n {
        return Err(Fail::TooLong {
            len: bytes.len(),
            n,
        });
    }
    spate_row::rowbinary::put_fixed_string(out, bytes, n);
    Ok(())
}

/// A string as the value of the enum name it equals.
#[inline(always)]
fn put_str_enum(
    c: &mut Cur<'_>,
    names: &[(Box<[u8]>, i16)],
    w8: bool,
    out: &mut Vec<u8>,
) -> Result<(), Fail> {
    let (a, b) = c.len_bytes()?;
    let bytes = &c.s[a..b];
    let v = names
        .iter()
        .find(|(n, _)| **n == *bytes)
        .map(|(_, v)| *v)
        .ok_or(Fail::NotAnEnumName)?;
    put_enum(v, w8, out);
    Ok(())
}

/// A 16-byte big-endian UUID (fixed or bytes) as a UUID.
#[inline(always)]
fn put_bin_uuid(c: &mut Cur<'_>, fixed: bool, out: &mut Vec<u8>) -> Result<(), Fail> {
    let bytes = if fixed {
        c.take(16)?
    } else {
        let (a, b) = c.len_bytes()?;
        &c.s[a..b]
    };
    let arr: [u8; 16] = bytes.try_into().map_err(|_| Fail::BadUuid)?;
    put_uuid(out, u128::from_be_bytes(arr));
    Ok(())
}

/// An Avro enum index as its symbol, a String.
#[inline(always)]
fn put_enum_str(c: &mut Cur<'_>, symbols: &[Box<[u8]>], out: &mut Vec<u8>) -> Result<(), Fail> {
    let i = c.int()?;
    let sym = usize::try_from(i)
        .ok()
        .and_then(|i| symbols.get(i))
        .ok_or(Fail::BadEnum(i))?;
    put_string(out, sym);
    Ok(())
}

/// An Avro enum index as the ClickHouse enum value planned for it.
#[inline(always)]
fn put_enum_val(c: &mut Cur<'_>, values: &[i16], w8: bool, out: &mut Vec<u8>) -> Result<(), Fail> {
    let i = c.int()?;
    let v = usize::try_from(i)
        .ok()
        .and_then(|i| values.get(i))
        .ok_or(Fail::BadEnum(i))?;
    put_enum(*v, w8, out);
    Ok(())
}

/// An Avro date (days) as a Date or Date32, refused out of range.
#[inline(always)]
fn put_date(c: &mut Cur<'_>, date32: bool, out: &mut Vec<u8>) -> Result<(), Fail> {
    let v = c.int()?;
    if date32 {
        if !(spate_row::rowbinary::DATE32_MIN_DAYS..=spate_row::rowbinary::DATE32_MAX_DAYS)
            .contains(&v)
        {
            return Err(Fail::OutOfRange(v));
        }
        out.extend_from_slice(&(v as i32).to_le_bytes());
    } else {
        let d = u16::try_from(v).map_err(|_| Fail::OutOfRange(v))?;
        out.extend_from_slice(&d.to_le_bytes());
    }
    Ok(())
}

/// An Avro map key (UTF-8 checked) as a String or FixedString key.
#[inline(always)]
fn put_map_key(c: &mut Cur<'_>, key: &KeyConv, out: &mut Vec<u8>) -> Result<(), Fail> {
    let (a, b) = c.len_bytes()?;
    let k = &c.s[a..b];
    if std::str::from_utf8(k).is_err() {
        return Err(Fail::BadUtf8);
    }
    match key {
        KeyConv::Str => put_string(out, k),
        KeyConv::Fixed(n) => {
            if k.len() > *n {
                return Err(Fail::TooLong {
                    len: k.len(),
                    n: *n,
                });
            }
            spate_row::rowbinary::put_fixed_string(out, k, *n);
        }
    }
    Ok(())
}

#[inline]
fn put_enum(v: i16, w8: bool, out: &mut Vec<u8>) {
    if w8 {
        out.push(v as i8 as u8);
    } else {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Array/map blocks into a LEB128 count and the items: the first block's
/// count is written before its items; when more blocks follow, the count
/// is rewritten (the items shifted once).
fn put_blocks(
    c: &mut Cur<'_>,
    out: &mut Vec<u8>,
    min_len: usize,
    mut item: impl FnMut(&mut Cur<'_>, &mut Vec<u8>) -> Result<(), Fail>,
) -> Result<(), Fail> {
    let at = out.len();
    let Some(first) = c.block(min_len)? else {
        out.push(0);
        return Ok(());
    };
    put_leb128(out, first);
    let items_at = out.len();
    let mut total = 0u64;
    let mut n = first;
    loop {
        for _ in 0..n {
            item(c, out)?;
        }
        total += n;
        match c.block(min_len)? {
            Some(k) => n = k,
            None => break,
        }
        if min_len == 0 && total + n > MAX_EMPTY_ITEMS {
            return Err(Fail::BadLength((total + n) as i64));
        }
    }
    if total != first {
        let mut leb = [0u8; 10];
        let mut len = 0;
        let mut v = total;
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                leb[len] = b;
                len += 1;
                break;
            }
            leb[len] = b | 0x80;
            len += 1;
        }
        let old = items_at - at;
        let end = out.len();
        if len > old {
            out.resize(end + (len - old), 0);
            out.copy_within(items_at..end, at + len);
        }
        out[at..at + len].copy_from_slice(&leb[..len]);
    }
    Ok(())
}

/// A failure with where it happened: a column index, or a field index
/// (into [`Plan::fields`]) for a skipped field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    Column(u32),
    Field(u32),
    Datum,
}

/// The row being written.
pub(crate) struct RowOut<'b> {
    pub buf: &'b mut Vec<u8>,
    pub base: usize,
    pub spans: &'b mut [(u32, u32)],
    /// The Kafka message, for metadata columns.
    pub message: Option<&'b Payload<'b>>,
    /// A metadata column's own error (its text comes from `encode_meta`).
    pub meta_error: Option<RecordError>,
}

/// An encoder's reused buffers: each column's span in the row, the
/// permutation buffer, the parent-prefix cache.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub spans: Vec<(u32, u32)>,
    pub reorder: Vec<u8>,
    pub prefix: PrefixCache,
}

/// The last message's parent prefix (the cells of the parent's fields
/// before the exploded array), reused by the next element of the same
/// message: an encoder's scratch.
#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    valid: bool,
    id: Option<u32>,
    /// The datum bytes the cells were decoded from.
    src: Vec<u8>,
    /// The cells.
    out: Vec<u8>,
}

/// Why a row could not be written.
pub(crate) enum RowFail {
    /// Where and why.
    At(At, Fail),
    /// A metadata column's error, as `encode_meta` gave it.
    Meta(RecordError),
}

/// The element range and resume offset of a fanned-out record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Element {
    pub start: u32,
    pub end: u32,
    pub after: u32,
}

impl Plan {
    /// Writes the missing value of `col`.
    #[inline]
    fn put_missing(&self, col: u32, out: &mut Vec<u8>) -> Result<(), (At, Fail)> {
        match &self.missing[col as usize] {
            MissingCell::Null => {
                if self.marker {
                    out.push(0);
                }
                out.push(1);
            }
            MissingCell::Bytes(b) => {
                if self.marker {
                    out.push(0);
                }
                out.extend_from_slice(b);
            }
            MissingCell::ServerDefault => out.push(1),
            MissingCell::Reject => return Err((At::Column(col), Fail::Rejected)),
        }
        Ok(())
    }

    /// Runs `ops` at `c`.
    pub(crate) fn run(
        &self,
        ops: &[Op],
        c: &mut Cur<'_>,
        row: &mut RowOut<'_>,
        element: Option<&Element>,
    ) -> Result<(), (At, Fail)> {
        for op in ops {
            match op {
                Op::Put { col, conv } => {
                    let start = row.buf.len();
                    if self.marker {
                        row.buf.push(0);
                    }
                    match conv.put(c, row.buf) {
                        Ok(Cell::Value) => {}
                        Ok(Cell::Missing) => {
                            row.buf.truncate(start);
                            self.put_missing(*col, row.buf)?;
                        }
                        Err(f) => return Err((At::Column(*col), f)),
                    }
                    if !self.direct {
                        row.spans[*col as usize] =
                            ((start - row.base) as u32, (row.buf.len() - row.base) as u32);
                    }
                }
                Op::Skip(s, field) => skip(s, c).map_err(|f| (At::Field(*field), f))?,
                Op::Meta { col } => {
                    let start = row.buf.len();
                    let c = &self.columns[*col as usize];
                    let source = c.meta.as_ref().expect("planned for metadata columns");
                    let msg = row.message.ok_or((At::Column(*col), Fail::NoMessage))?;
                    if self.marker {
                        row.buf.push(0);
                    }
                    match encode_meta(source, &c.name, &c.ty, msg, row.buf) {
                        Ok(MetaPut::Written) => {}
                        Ok(MetaPut::Absent) => {
                            row.buf.truncate(start);
                            self.put_missing(*col, row.buf)?;
                        }
                        Err(e) => {
                            row.meta_error = Some(e);
                            return Err((At::Column(*col), Fail::NoMessage));
                        }
                    }
                    if !self.direct {
                        row.spans[*col as usize] =
                            ((start - row.base) as u32, (row.buf.len() - row.base) as u32);
                    }
                }
                Op::Missing { col } => {
                    let start = row.buf.len();
                    self.put_missing(*col, row.buf)?;
                    if !self.direct {
                        row.spans[*col as usize] =
                            ((start - row.base) as u32, (row.buf.len() - row.base) as u32);
                    }
                }
                Op::Branch { branches, field } => {
                    let i = c.long().map_err(|f| (At::Field(*field), f))?;
                    let b = usize::try_from(i)
                        .ok()
                        .and_then(|i| branches.get(i))
                        .ok_or((At::Field(*field), Fail::BadBranch(i)))?;
                    self.run(b, c, row, element)?;
                }
                Op::Explode => {
                    let e = element.ok_or((At::Datum, Fail::BadElement))?;
                    let (start, end) = (e.start as usize, e.end as usize);
                    if start > end || end > c.s.len() {
                        return Err((At::Datum, Fail::BadElement));
                    }
                    let mut ec = Cur::new(&c.s[..end], start);
                    self.run(&self.element, &mut ec, row, element)?;
                    if ec.i != end {
                        return Err((At::Datum, Fail::BadElement));
                    }
                    c.i = e.after as usize;
                }
            }
        }
        Ok(())
    }

    /// Appends the row of `datum` (with `element` when fanned out, the
    /// Kafka `message` for metadata columns) to `buf`, in INSERT order.
    pub(crate) fn write_row(
        &self,
        datum: &[u8],
        element: Option<&Element>,
        buf: &mut Vec<u8>,
        scratch: &mut Scratch,
        message: Option<&Payload<'_>>,
    ) -> Result<(), RowFail> {
        let base = buf.len();
        let mut c = Cur::new(datum, 0);
        let mut row = RowOut {
            buf,
            base,
            spans: &mut scratch.spans,
            message,
            meta_error: None,
        };
        let r = self.write_in(
            datum,
            element,
            &mut c,
            &mut row,
            &mut scratch.reorder,
            &mut scratch.prefix,
        );
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(match row.meta_error.take() {
                Some(m) => RowFail::Meta(m),
                None => RowFail::At(e.0, e.1),
            }),
        }
    }

    fn write_in(
        &self,
        datum: &[u8],
        element: Option<&Element>,
        c: &mut Cur<'_>,
        row: &mut RowOut<'_>,
        reorder: &mut Vec<u8>,
        prefix: &mut PrefixCache,
    ) -> Result<(), (At, Fail)> {
        let base = row.base;
        match (self.explode_at, element) {
            (Some(k), Some(_)) if self.prefix_cache => {
                // The parent's fields before the array are the same bytes
                // for every element of a message, and decoding reads only
                // them: when the datum starts with the bytes the cached
                // prefix was decoded from, its cells are copied.
                let n = prefix.src.len();
                if prefix.valid
                    && prefix.id == self.schema_id
                    && datum.get(..n) == Some(&prefix.src[..])
                {
                    row.buf.extend_from_slice(&prefix.out);
                    c.i = n;
                } else {
                    prefix.valid = false;
                    self.run(&self.parent[..k], c, row, element)?;
                    prefix.src.clear();
                    prefix.src.extend_from_slice(&datum[..c.i]);
                    prefix.out.clear();
                    prefix.out.extend_from_slice(&row.buf[base..]);
                    prefix.id = self.schema_id;
                    prefix.valid = true;
                }
                self.run(&self.parent[k..], c, row, element)?;
            }
            _ => self.run(&self.parent, c, row, element)?,
        }
        if c.i != datum.len() {
            return Err((At::Datum, Fail::Trailing(datum.len() - c.i)));
        }
        if self.direct {
            return Ok(());
        }
        reorder.clear();
        reorder.extend_from_slice(&row.buf[base..]);
        row.buf.truncate(base);
        for &(s, e) in row.spans.iter() {
            row.buf.extend_from_slice(&reorder[s as usize..e as usize]);
        }
        Ok(())
    }

    /// The element ranges of the exploded array in `datum` into `out`
    /// (cleared first), and the offset after the array.
    pub(crate) fn elements(&self, datum: &[u8], out: &mut Vec<Element>) -> Result<(), Fail> {
        out.clear();
        let ex = self.explode.as_ref().expect("called for exploding plans");
        let mut c = Cur::new(datum, 0);
        for s in ex.pre.iter() {
            skip(s, &mut c)?;
        }
        let min = ex.item.min_len();
        let Skip::Record(fields) = &ex.item else {
            unreachable!("explode items are records");
        };
        while let Some(n) = c.block(min)? {
            for _ in 0..n {
                let start = c.i;
                for f in fields.iter() {
                    skip(f, &mut c)?;
                }
                out.push(Element {
                    start: start as u32,
                    end: c.i as u32,
                    after: 0,
                });
            }
        }
        let after = c.i as u32;
        for e in out.iter_mut() {
            e.after = after;
        }
        Ok(())
    }
}
