//! Scalar coercions: one JSON scalar ([`Tok`]) into one column type, written
//! as RowBinary. The rules users expect, and no more (issue 6):
//!
//! - numbers into numeric columns with range checks: never wrap, never
//!   truncate (`1.5` into Int32 and `300` into UInt8 are errors); strings of
//!   digits count as numbers;
//! - Float columns also take `"NaN"`, `"inf"`, `"-inf"`, `"Infinity"` as
//!   strings (JSON has no literal for them);
//! - Decimal from a number or a string, exactly (no binary floating point);
//! - Bool from `true`/`false`/`0`/`1` (also as strings);
//! - String from a string, and from a number, bool, array or object as its
//!   JSON text (a title that is sometimes a number still lands);
//! - Date from `YYYY-MM-DD` (or any accepted date-time text: its written date);
//! - DateTime and DateTime64 from RFC 3339, `YYYY-MM-DD HH:MM:SS[.fff]`, the
//!   configured formats, or an epoch number (unit: [`EpochUnit`], fractional
//!   allowed) scaled to the column's precision; digits finer than the column
//!   keeps are dropped (text: the written digits are cut, as ClickHouse's
//!   parser does; numbers: toward zero, as ClickHouse converts numbers);
//!   DateTime takes 1970-01-01..2106-02-07 06:28:15, DateTime64
//!   1900-01-01..2299-12-31 (outside: an error);
//! - UUID, IPv4, IPv6 from their text forms; Enum from a declared name or
//!   value;
//! - JSON from an object only, as its text (the server parses it).
//!
//! Anything else is an error with a reason; the caller names the column.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::num::{DecimalText, NumError, Rounding, Wide, fast_i64};
use crate::rowbinary::{
    DATE_MAX_DAYS, DATE32_MAX_DAYS, DATE32_MIN_DAYS, int_shape, put_decimal, put_fixed_string,
    put_ipv4, put_ipv6, put_string, put_uuid,
};
use crate::time::{ParsedTime, TimeFormat, parse_datetime};
use crate::types::ChType;

/// One JSON scalar, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tok<'a> {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as written.
    Number(&'a [u8]),
    /// A string's content, unescaped.
    Str(&'a [u8]),
    /// An array or object, as written (only String columns take it).
    Composite(&'a [u8]),
}

impl Tok<'_> {
    fn describe(&self) -> &'static str {
        match self {
            Tok::Null => "null",
            Tok::Bool(_) => "a bool",
            Tok::Number(_) => "a number",
            Tok::Str(_) => "a string",
            Tok::Composite(_) => "an array or object",
        }
    }
}

/// How epoch numbers (JSON numbers, or strings holding only a number) are
/// read into DateTime and DateTime64 columns (`time.epoch_unit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EpochUnit {
    /// Guessed from the magnitude of the number's integer part `|n|`:
    /// `|n| < 10^11` seconds, `10^11 <= |n| < 10^14` milliseconds,
    /// `10^14 <= |n| < 10^17` microseconds, `|n| >= 10^17` nanoseconds.
    /// (10^11 s is the year 5138; 10^11 ms is 1973-03-03T09:46:40Z, so
    /// millisecond epochs before March 1973, such as 86400000 for
    /// 1970-01-02, read as seconds: give the unit when it is known.)
    #[default]
    Auto,
    /// Seconds (`s`).
    Seconds,
    /// Milliseconds (`ms`).
    Millis,
    /// Microseconds (`us`).
    Micros,
    /// Nanoseconds (`ns`).
    Nanos,
}

impl EpochUnit {
    /// Reads `auto`, `s`, `ms`, `us` or `ns`.
    pub fn parse(s: &str) -> Option<EpochUnit> {
        Some(match s {
            "auto" => EpochUnit::Auto,
            "s" => EpochUnit::Seconds,
            "ms" => EpochUnit::Millis,
            "us" => EpochUnit::Micros,
            "ns" => EpochUnit::Nanos,
            _ => return None,
        })
    }

    /// The unit as a power of ten below a second (0, 3, 6, 9) for `value`.
    fn exponent(self, value: &DecimalText) -> i32 {
        match self {
            EpochUnit::Seconds => 0,
            EpochUnit::Millis => 3,
            EpochUnit::Micros => 6,
            EpochUnit::Nanos => 9,
            EpochUnit::Auto => {
                let whole = value
                    .scaled(0, Rounding::TowardZero)
                    .ok()
                    .and_then(Wide::to_i128)
                    .map_or(u128::MAX, i128::unsigned_abs);
                match whole {
                    0..100_000_000_000 => 0,
                    100_000_000_000..100_000_000_000_000 => 3,
                    100_000_000_000_000..100_000_000_000_000_000 => 6,
                    _ => 9,
                }
            }
        }
    }
}

/// DateTime64's range in seconds since the epoch: 1900-01-01 00:00:00 to
/// 2299-12-31 23:59:59 UTC (ClickHouse's documented range; precision 9
/// also ends where Int64 nanoseconds end, 2262-04-11, checked by the
/// Int64 conversion).
pub const DATETIME64_MIN_SECS: i64 = -2_208_988_800;
/// See [`DATETIME64_MIN_SECS`].
pub const DATETIME64_MAX_SECS: i64 = 10_413_791_999;

/// Whether `ticks` of `10^-precision` s lie in DateTime64's range.
#[inline]
pub fn datetime64_in_range(ticks: i128, precision: u8) -> bool {
    let scale = 10i128.pow(u32::from(precision.min(9)));
    (i128::from(DATETIME64_MIN_SECS) * scale..(i128::from(DATETIME64_MAX_SECS) + 1) * scale)
        .contains(&ticks)
}

/// Time settings shared by every column of a mapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimeRules {
    /// Formats tried, in order, after RFC 3339 and `YYYY-MM-DD HH:MM:SS`.
    pub formats: Vec<TimeFormat>,
    /// How epoch numbers are read.
    pub epoch_unit: EpochUnit,
    /// The UTC offset (seconds) naive text (no `Z` or `±HH:MM`) is read at.
    /// `None`: UTC for columns without a time zone or with a UTC one, and an
    /// error for columns with another zone (no zone database is built in, and
    /// guessing would shift every timestamp).
    pub naive_offset_secs: Option<i32>,
}

/// Whether a column time zone name means UTC.
pub fn is_utc(tz: &str) -> bool {
    matches!(
        tz,
        "UTC"
            | "Etc/UTC"
            | "GMT"
            | "Etc/GMT"
            | "UCT"
            | "Etc/UCT"
            | "Universal"
            | "Zulu"
            | "Etc/Zulu"
    )
}

/// What [`put_scalar`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// Appended one value.
    Written,
    /// The token was null and the type is not Nullable: nothing appended;
    /// the caller applies the missing-value rule.
    NullForNonNullable,
}

/// Appends `tok` as a value of `ty`. `ty` must not be Array, Map or Tuple
/// (the mapper walks those itself).
///
/// # Errors
/// The reason, in words, when the token cannot map (the caller adds the
/// column).
pub fn put_scalar(
    ty: &ChType,
    tok: Tok<'_>,
    rules: &TimeRules,
    out: &mut Vec<u8>,
) -> Result<Put, String> {
    match ty {
        ChType::LowCardinality(inner) => return put_scalar(inner, tok, rules, out),
        ChType::Nullable(inner) => {
            if tok == Tok::Null {
                out.push(1);
                return Ok(Put::Written);
            }
            out.push(0);
            return match put_scalar(inner, tok, rules, out)? {
                Put::Written => Ok(Put::Written),
                Put::NullForNonNullable => Err("null inside a Nullable".into()),
            };
        }
        _ if tok == Tok::Null => return Ok(Put::NullForNonNullable),
        _ => {}
    }
    let refuse = || format!("cannot put {} into {ty}", tok.describe());
    match ty {
        t if int_shape(t).is_some() => {
            let (bits, signed) = int_shape(t).unwrap_or((64, true));
            let text = match tok {
                Tok::Number(t) | Tok::Str(t) => t,
                _ => return Err(refuse()),
            };
            put_int(text, tok, bits, signed, ty, out)?;
        }
        ChType::Float32 | ChType::Float64 => put_float_tok(ty, tok, out)?,
        ChType::Bool => put_bool_tok(tok, out)?,
        // JSON: an object's text as a String (the insert carries
        // input_format_binary_read_json_as_string = 1); anything else would
        // fail the whole insert on the server, so it is this record's error.
        ChType::Json(_) => match tok {
            Tok::Composite(s) if s.first() == Some(&b'{') => put_string(out, s),
            _ => return Err(format!("{} is not a JSON object", show(tok))),
        },
        ChType::String => match tok {
            Tok::Str(s) | Tok::Number(s) | Tok::Composite(s) => put_string(out, s),
            Tok::Bool(b) => put_string(out, if b { b"true" } else { b"false" }),
            Tok::Null => return Err(refuse()),
        },
        ChType::FixedString(n) => put_fixed_tok(ty, tok, *n, out)?,
        ChType::Date | ChType::Date32 => put_date(ty, tok, rules, out)?,
        ChType::DateTime(tz) => put_datetime_tok(tok, tz.as_deref(), rules, out)?,
        ChType::DateTime64 { precision, tz } => {
            put_datetime64_tok(ty, tok, *precision, tz.as_deref(), rules, out)?;
        }
        ChType::Decimal { precision, scale } => {
            put_decimal_tok(ty, tok, *precision, *scale, out)?;
        }
        ChType::Uuid => {
            let Tok::Str(s) = tok else {
                return Err(refuse());
            };
            put_uuid(
                out,
                parse_uuid(s).ok_or_else(|| format!("{} is not a UUID", show(tok)))?,
            );
        }
        ChType::Ipv4 => put_ipv4_tok(ty, tok, out)?,
        ChType::Ipv6 => put_ipv6_tok(ty, tok, out)?,
        ChType::Enum8(_) | ChType::Enum16(_) => put_enum_tok(ty, tok, out)?,
        _ => return Err(refuse()),
    }
    Ok(Put::Written)
}

/// A FixedString(`n`) from a string or number's text, refused when longer.
#[inline(always)]
fn put_fixed_tok(ty: &ChType, tok: Tok<'_>, n: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let s = match tok {
        Tok::Str(s) | Tok::Number(s) => s,
        _ => return Err(format!("cannot put {} into {ty}", tok.describe())),
    };
    if s.len() > n {
        return Err(format!("{} bytes do not fit {ty}", s.len()));
    }
    put_fixed_string(out, s, n);
    Ok(())
}

/// An Enum8/Enum16 value from its name or number.
#[inline(always)]
fn put_enum_tok(ty: &ChType, tok: Tok<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    match ty {
        ChType::Enum8(pairs) => {
            let v = enum_value(
                tok,
                pairs.iter().map(|(n, v)| (n.as_str(), i16::from(*v))),
                ty,
            )?;
            out.push(v as i8 as u8);
        }
        ChType::Enum16(pairs) => {
            let v = enum_value(tok, pairs.iter().map(|(n, v)| (n.as_str(), *v)), ty)?;
            out.extend_from_slice(&v.to_le_bytes());
        }
        _ => unreachable!("put_scalar dispatches enums here"),
    }
    Ok(())
}

/// A Float32/Float64 from a number or a special float string (`inf`, `nan`, ...).
#[inline(always)]
fn put_float_tok(ty: &ChType, tok: Tok<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let text = match tok {
        Tok::Number(t) => t,
        Tok::Str(t) => match special_float(t) {
            Some(f) => {
                put_float(ty, f, out);
                return Ok(());
            }
            None => t,
        },
        _ => return Err(format!("cannot put {} into {ty}", tok.describe())),
    };
    let f = parse_float(text, ty)?;
    put_float(ty, f, out);
    Ok(())
}

/// A Bool from `true`/`false` or `0`/`1` (number or string).
#[inline(always)]
fn put_bool_tok(tok: Tok<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let b = match tok {
        Tok::Bool(b) => b,
        Tok::Number(b"0") | Tok::Str(b"0" | b"false") => false,
        Tok::Number(b"1") | Tok::Str(b"1" | b"true") => true,
        _ => return Err(format!("{} is not a bool (true/false/0/1)", show(tok))),
    };
    out.push(u8::from(b));
    Ok(())
}

/// A DateTime (seconds, UInt32) from time text or a number, in its range.
#[inline(always)]
fn put_datetime_tok(
    tok: Tok<'_>,
    tz: Option<&str>,
    rules: &TimeRules,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let secs = time_ticks(tok, 0, tz, rules)?;
    let secs = u32::try_from(secs)
        .map_err(|_| format!("{} is outside DateTime's range 1970..2106", show(tok)))?;
    out.extend_from_slice(&secs.to_le_bytes());
    Ok(())
}

/// A DateTime64(`precision`) (ticks, Int64) from time text or a number, in its range.
#[inline(always)]
fn put_datetime64_tok(
    ty: &ChType,
    tok: Tok<'_>,
    precision: u8,
    tz: Option<&str>,
    rules: &TimeRules,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let ticks = time_ticks(tok, i32::from(precision), tz, rules)?;
    let ticks = i64::try_from(ticks)
        .ok()
        .filter(|&t| datetime64_in_range(i128::from(t), precision))
        .ok_or_else(|| {
            format!(
                "{} is outside {ty}'s range 1900-01-01 00:00:00..2299-12-31 23:59:59",
                show(tok)
            )
        })?;
    out.extend_from_slice(&ticks.to_le_bytes());
    Ok(())
}

/// A Decimal(`precision`, `scale`) from decimal text, exactly (no rounding).
#[inline(always)]
fn put_decimal_tok(
    ty: &ChType,
    tok: Tok<'_>,
    precision: u8,
    scale: u8,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let text = match tok {
        Tok::Number(t) | Tok::Str(t) => t,
        _ => return Err(format!("cannot put {} into {ty}", tok.describe())),
    };
    let scaled = DecimalText::parse(text)
        .and_then(|d| d.scaled(i32::from(scale), Rounding::Exact))
        .map_err(|e| num_reason(e, tok, ty))?;
    put_decimal(ty, precision, scaled, out).map_err(|_| {
        format!(
            "{} has more than {} digits before the point for {ty}",
            show(tok),
            precision - scale
        )
    })
}

/// An IPv4 from dotted text or its UInt32 number.
#[inline(always)]
fn put_ipv4_tok(ty: &ChType, tok: Tok<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let ip = match tok {
        Tok::Str(s) => plain_ipv4(s).or_else(|| {
            std::str::from_utf8(s)
                .ok()
                .and_then(|s| s.parse::<Ipv4Addr>().ok())
        }),
        Tok::Number(t) => fast_i64(t)
            .and_then(|v| u32::try_from(v).ok())
            .map(Ipv4Addr::from),
        _ => return Err(format!("cannot put {} into {ty}", tok.describe())),
    };
    put_ipv4(
        out,
        ip.ok_or_else(|| format!("{} is not an IPv4 address", show(tok)))?,
    );
    Ok(())
}

/// An IPv6 from IPv6 text, or IPv4 text mapped into IPv6.
#[inline(always)]
fn put_ipv6_tok(ty: &ChType, tok: Tok<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let refuse = || format!("cannot put {} into {ty}", tok.describe());
    let Tok::Str(s) = tok else {
        return Err(refuse());
    };
    let s = std::str::from_utf8(s).map_err(|_| refuse())?;
    let ip = s
        .parse::<Ipv6Addr>()
        .ok()
        .or_else(|| s.parse::<Ipv4Addr>().ok().map(|v4| v4.to_ipv6_mapped()));
    put_ipv6(
        out,
        ip.ok_or_else(|| format!("{} is not an IPv6 address", show(tok)))?,
    );
    Ok(())
}

/// A Date (days since 1970-01-01 as UInt16) or Date32 (as Int32) from
/// date text, in its type's range (ClickHouse's ranges: Date
/// 1970-01-01..2149-06-06, Date32 1900-01-01..2299-12-31).
fn put_date(ty: &ChType, tok: Tok<'_>, rules: &TimeRules, out: &mut Vec<u8>) -> Result<(), String> {
    let Tok::Str(s) = tok else {
        return Err(format!(
            "{ty} takes date text (YYYY-MM-DD), not {}",
            tok.describe()
        ));
    };
    let days = parse_time_text(s, rules)?.wall_days();
    if matches!(ty, ChType::Date) {
        if !(0..=DATE_MAX_DAYS).contains(&days) {
            return Err(format!(
                "{} is outside Date's range 1970-01-01..2149-06-06",
                show(tok)
            ));
        }
        out.extend_from_slice(&(days as u16).to_le_bytes());
    } else {
        if !(DATE32_MIN_DAYS..=DATE32_MAX_DAYS).contains(&days) {
            return Err(format!(
                "{} is outside Date32's range 1900-01-01..2299-12-31",
                show(tok)
            ));
        }
        out.extend_from_slice(&(days as i32).to_le_bytes());
    }
    Ok(())
}

/// The fast path for a JSON integer (already parsed by serde) into an
/// integer column of up to 64 bits, maybe Nullable or LowCardinality:
/// `None` when `ty` is not such a column (use [`put_scalar`]).
#[inline]
pub fn put_integer(ty: &ChType, v: i128, out: &mut Vec<u8>) -> Option<Result<(), String>> {
    let (inner, nullable) = match ty {
        ChType::Nullable(inner) => (&**inner, true),
        ChType::LowCardinality(inner) => match &**inner {
            ChType::Nullable(inner) => (&**inner, true),
            other => (other, false),
        },
        other => (other, false),
    };
    let (bits, signed) = int_shape(inner).filter(|(bits, _)| *bits <= 64)?;
    let (min, max) = if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    };
    if !(min..=max).contains(&v) {
        return Some(Err(format!("{v} is out of range for {inner}")));
    }
    if nullable {
        out.push(0);
    }
    out.extend_from_slice(&v.to_le_bytes()[..bits as usize / 8]);
    Some(Ok(()))
}

/// A token shown in an error: its text, cut at 64 bytes.
pub fn show(tok: Tok<'_>) -> String {
    let (text, quote) = match tok {
        Tok::Null => return "null".into(),
        Tok::Bool(b) => return b.to_string(),
        Tok::Number(t) | Tok::Composite(t) => (t, ""),
        Tok::Str(t) => (t, "\""),
    };
    let cut = &text[..text.len().min(64)];
    let more = if text.len() > 64 { "..." } else { "" };
    format!("{quote}{}{more}{quote}", String::from_utf8_lossy(cut))
}

fn num_reason(e: NumError, tok: Tok<'_>, ty: &ChType) -> String {
    match e {
        NumError::NotANumber => format!("{} is not a number", show(tok)),
        NumError::Overflow => format!("{} is out of range for {ty}", show(tok)),
        NumError::Inexact => format!("{} would be truncated by {ty}", show(tok)),
    }
}

#[inline]
fn put_int(
    text: &[u8],
    tok: Tok<'_>,
    bits: u32,
    signed: bool,
    ty: &ChType,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    // Fast path: a plain integer that fits i64, into a column of <= 64 bits.
    if bits <= 64
        && let Some(v) = fast_i64(text)
    {
        let ok = if signed {
            let half = 1i128 << (bits - 1);
            (-half..half).contains(&i128::from(v))
        } else {
            v >= 0 && (bits == 64 || v < (1i64 << bits))
        };
        if !ok {
            return Err(format!("{} is out of range for {ty}", show(tok)));
        }
        out.extend_from_slice(&v.to_le_bytes()[..bits as usize / 8]);
        return Ok(());
    }
    let w = DecimalText::parse(text)
        .and_then(|d| d.scaled(0, Rounding::Exact))
        .map_err(|e| match e {
            NumError::Inexact => format!(
                "{} is not an integer (would be truncated by {ty})",
                show(tok)
            ),
            e => num_reason(e, tok, ty),
        })?;
    if !w.fits(bits, signed) {
        return Err(format!("{} is out of range for {ty}", show(tok)));
    }
    w.put_le(bits as usize / 8, out);
    Ok(())
}

fn special_float(s: &[u8]) -> Option<f64> {
    let lower = |a: &[u8], b: &[u8]| a.eq_ignore_ascii_case(b);
    if lower(s, b"nan") {
        Some(f64::NAN)
    } else if lower(s, b"inf")
        || lower(s, b"+inf")
        || lower(s, b"infinity")
        || lower(s, b"+infinity")
    {
        Some(f64::INFINITY)
    } else if lower(s, b"-inf") || lower(s, b"-infinity") {
        Some(f64::NEG_INFINITY)
    } else {
        None
    }
}

fn parse_float(text: &[u8], ty: &ChType) -> Result<f64, String> {
    // Validate the grammar first: Rust's float parser also takes "inf" and
    // "1_0"-free forms we do not want from a digit string.
    DecimalText::parse(text).map_err(|e| num_reason(e, Tok::Number(text), ty))?;
    let s = std::str::from_utf8(text).map_err(|_| "not UTF-8".to_string())?;
    let f: f64 = if matches!(ty, ChType::Float32) {
        f64::from(s.parse::<f32>().map_err(|e| e.to_string())?)
    } else {
        s.parse::<f64>().map_err(|e| e.to_string())?
    };
    if f.is_infinite() {
        return Err(format!("{s} is out of range for {ty}"));
    }
    Ok(f)
}

#[inline]
fn put_float(ty: &ChType, f: f64, out: &mut Vec<u8>) {
    if matches!(ty, ChType::Float32) {
        out.extend_from_slice(&(f as f32).to_le_bytes());
    } else {
        out.extend_from_slice(&f.to_le_bytes());
    }
}

fn parse_time_text(s: &[u8], rules: &TimeRules) -> Result<ParsedTime, String> {
    // The first format's fixed layout answers only for text RFC 3339
    // cannot read, so the order below (RFC 3339, then the formats in turn)
    // is kept.
    if let Some(t) = rules.formats.first().and_then(|f| f.parse_fixed(s)) {
        return Ok(t);
    }
    match parse_datetime(s) {
        Ok(t) => Ok(t),
        Err(first) => {
            for f in &rules.formats {
                if let Ok(t) = f.parse(s) {
                    return Ok(t);
                }
            }
            Err(format!(
                "\"{}\" is not a time ({first}; formats tried: RFC 3339, YYYY-MM-DD HH:MM:SS{})",
                String::from_utf8_lossy(&s[..s.len().min(64)]),
                rules
                    .formats
                    .iter()
                    .map(|f| format!(", {}", f.as_str()))
                    .collect::<String>()
            ))
        }
    }
}

/// Ticks of `10^-precision` s since the epoch for a time token, as i128 so
/// the caller range-checks once.
fn time_ticks(
    tok: Tok<'_>,
    precision: i32,
    tz: Option<&str>,
    rules: &TimeRules,
) -> Result<i128, String> {
    let number = match tok {
        Tok::Number(t) => t,
        Tok::Str(s) if looks_numeric(s) && DecimalText::parse(s).is_ok() => s,
        Tok::Str(s) => {
            let t = parse_time_text(s, rules)?;
            let offset = match (t.offset_secs, rules.naive_offset_secs, tz) {
                (Some(o), _, _) => o,
                (None, Some(o), _) => o,
                (None, None, None) => 0,
                (None, None, Some(z)) if is_utc(z) => 0,
                (None, None, Some(z)) => {
                    return Err(format!(
                        "\"{}\" has no UTC offset and the column's zone is {z}; \
                         give the offset in the text (`Z`, `+02:00`)",
                        String::from_utf8_lossy(s)
                    ));
                }
            };
            // precision is 0..=9 (the type parser's bound): the scale and
            // the divisor fit i64 and u32, so no 128-bit division per row.
            debug_assert!((0..=9).contains(&precision), "DateTime64 precision");
            let secs = i128::from(t.epoch_secs(offset));
            let scale = 10i64.pow(precision as u32);
            let sub = t.nanos / 10u32.pow(9 - precision as u32);
            return Ok(secs * i128::from(scale) + i128::from(sub));
        }
        _ => return Err(format!("cannot put {} into a time column", tok.describe())),
    };
    let d =
        DecimalText::parse(number).map_err(|e| format!("{} is not an epoch: {e}", show(tok)))?;
    let unit = rules.epoch_unit.exponent(&d);
    // Digits below the column's precision are dropped toward zero, as
    // ClickHouse converts a number to DateTime64 (-1.2345 into
    // DateTime64(3) is -1234 ms, 1969-12-31 23:59:58.766).
    let w = d
        .scaled(precision - unit, Rounding::TowardZero)
        .map_err(|e| format!("{} is not an epoch: {e}", show(tok)))?;
    w.to_i128()
        .ok_or_else(|| format!("{} is out of range", show(tok)))
}

/// Whether `s` has only the bytes of a number (a cheap test before the
/// exact parse, so date text fails fast).
pub fn looks_numeric(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'-' | b'+' | b'e' | b'E'))
}

/// A dotted quad of plain octets (`0` or 1-3 digits without a leading zero,
/// at most 255): a subset of what std's `Ipv4Addr` parser takes, read
/// without UTF-8 checks; `None` leaves the text to std.
pub fn plain_ipv4(s: &[u8]) -> Option<Ipv4Addr> {
    // One pass over the bytes (no split iterator: this runs once per row
    // for an IPv4 column).
    let mut octets = [0u8; 4];
    let mut k = 0;
    let mut v = 0u32;
    let mut len = 0;
    let mut lead_zero = false;
    for &c in s {
        if c == b'.' {
            if len == 0 || k == 3 {
                return None;
            }
            octets[k] = u8::try_from(v).ok()?;
            k += 1;
            (v, len) = (0, 0);
            continue;
        }
        let d = c.wrapping_sub(b'0');
        if d > 9 || len == 3 || lead_zero && len == 1 {
            return None;
        }
        if len == 0 {
            lead_zero = d == 0;
        }
        v = v * 10 + u32::from(d);
        len += 1;
    }
    if len == 0 || k != 3 {
        return None;
    }
    octets[3] = u8::try_from(v).ok()?;
    Some(Ipv4Addr::from(octets))
}

/// Each byte's hex digit value, or 0xff for a byte that is not a hex digit
/// (`0-9`, `a-f`, `A-F`).
const HEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut c = 0;
    while c < 10 {
        t[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        t[b'a' as usize + c] = 10 + c as u8;
        t[b'A' as usize + c] = 10 + c as u8;
        c += 1;
    }
    t
};

/// `acc` followed by the hex digits of `s`, and the OR of every digit's
/// [`HEX`] entry (a high nibble set means a non-hex byte). No branch per
/// byte: the caller checks the flags once.
#[inline]
fn hex_digits(mut acc: u64, s: &[u8], flags: &mut u8) -> u64 {
    for &c in s {
        let d = HEX[usize::from(c)];
        *flags |= d;
        acc = (acc << 4) | u64::from(d & 0x0f);
    }
    acc
}

/// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` or 32 bare hex digits into
/// the UUID's 128-bit number.
pub fn parse_uuid(s: &[u8]) -> Option<u128> {
    // Two 64-bit halves (16 hex digits each), read by position with a
    // table per byte and one validity test at the end: this runs once per
    // row for a UUID column.
    let mut flags = 0u8;
    let (hi, lo) = match s.len() {
        36 => {
            if s[8] != b'-' || s[13] != b'-' || s[18] != b'-' || s[23] != b'-' {
                return None;
            }
            let hi = hex_digits(0, &s[..8], &mut flags);
            let hi = hex_digits(hi, &s[9..13], &mut flags);
            let hi = hex_digits(hi, &s[14..18], &mut flags);
            let lo = hex_digits(0, &s[19..23], &mut flags);
            (hi, hex_digits(lo, &s[24..], &mut flags))
        }
        32 => (
            hex_digits(0, &s[..16], &mut flags),
            hex_digits(0, &s[16..], &mut flags),
        ),
        _ => return None,
    };
    (flags & 0xf0 == 0).then(|| (u128::from(hi) << 64) | u128::from(lo))
}

fn enum_value<'n>(
    tok: Tok<'_>,
    mut pairs: impl Iterator<Item = (&'n str, i16)> + Clone,
    ty: &ChType,
) -> Result<i16, String> {
    match tok {
        Tok::Str(s) => pairs
            .find(|(n, _)| n.as_bytes() == s)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("{} is not a value of {ty}", show(tok))),
        Tok::Number(t) => {
            let v = fast_i64(t).and_then(|v| i16::try_from(v).ok());
            v.filter(|v| pairs.any(|(_, p)| p == *v))
                .ok_or_else(|| format!("{} is not a value of {ty}", show(tok)))
        }
        _ => Err(format!("cannot put {} into {ty}", tok.describe())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ipv4_is_a_subset_of_std() {
        for text in [
            "10.0.3.250",
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "01.2.3.4",
            "1.2.3",
            "1.2.3.4.5",
            "1..3.4",
            "1.2.3.4 ",
            "a.b.c.d",
            "1.2.3.-4",
            "1000.1.1.1",
            "",
            "1.2.3.",
            ".1.2.3",
            "1.2.3.4.",
            "00.1.2.3",
            "0.0.0.00",
            "10.0.0.01",
            "255.255.255.256",
            "192.168.1.1",
            "1.2.3.4x",
        ] {
            let std = text.parse::<Ipv4Addr>().ok();
            if let Some(ip) = plain_ipv4(text.as_bytes()) {
                assert_eq!(Some(ip), std, "{text}");
            }
        }
        for common in ["10.0.3.250", "0.0.0.0", "255.255.255.255", "192.168.1.10"] {
            assert_eq!(
                plain_ipv4(common.as_bytes()),
                common.parse().ok(),
                "{common}"
            );
        }
        // Exhaustive over short texts of the relevant bytes: never accepts
        // what std refuses, and reads the same address.
        let alphabet = b"0129.";
        for len in 7..=9 {
            let mut idx = vec![0usize; len];
            loop {
                let text: Vec<u8> = idx.iter().map(|&i| alphabet[i]).collect();
                let std = std::str::from_utf8(&text).unwrap().parse::<Ipv4Addr>().ok();
                if let Some(ip) = plain_ipv4(&text) {
                    assert_eq!(Some(ip), std, "{}", String::from_utf8_lossy(&text));
                }
                let mut p = 0;
                while p < len && idx[p] + 1 == alphabet.len() {
                    idx[p] = 0;
                    p += 1;
                }
                if p == len {
                    break;
                }
                idx[p] += 1;
            }
        }
    }

    /// The digit-by-digit reading `parse_uuid` replaced, as the oracle.
    fn uuid_by_digits(s: &[u8]) -> Option<u128> {
        let dashed = s.len() == 36;
        if !dashed && s.len() != 32 {
            return None;
        }
        let mut v = 0u128;
        let mut n = 0;
        for (i, &c) in s.iter().enumerate() {
            if dashed && matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return None;
                }
                continue;
            }
            v = (v << 4) | u128::from((c as char).to_digit(16)?);
            n += 1;
        }
        (n == 32).then_some(v)
    }

    #[test]
    fn uuid_parse_agrees_with_digit_by_digit_reading() {
        let good = b"61f0c404-5cb3-11e7-907b-a6006ad3dba0";
        assert_eq!(
            parse_uuid(good),
            Some(0x61f0c404_5cb3_11e7_907b_a6006ad3dba0)
        );
        assert_eq!(
            parse_uuid(b"61F0C4045CB311E7907BA6006AD3DBA0"),
            Some(0x61f0c404_5cb3_11e7_907b_a6006ad3dba0)
        );
        let mut cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"61f0c404-5cb3-11e7-907b-a6006ad3dba".to_vec(),
            b"61f0c404-5cb3-11e7-907b-a6006ad3dba00".to_vec(),
            b"61f0c4045cb3-11e7-907b-a6006ad3dba00".to_vec(),
            b"{1f0c404-5cb3-11e7-907b-a6006ad3dba0}".to_vec(),
            b"ffffffff-ffff-ffff-ffff-ffffffffffff".to_vec(),
            b"00000000000000000000000000000000".to_vec(),
        ];
        // Every position replaced by every interesting byte, dashed and bare.
        for base in [&good[..], b"61f0c4045cb311e7907ba6006ad3dba0"] {
            for at in 0..base.len() {
                for c in [
                    b'-', b'g', b'G', b'/', b':', b'@', b'`', b'F', b'0', b'9', 0x80, 0xff, 0,
                ] {
                    let mut v = base.to_vec();
                    v[at] = c;
                    cases.push(v);
                }
            }
        }
        for c in cases {
            assert_eq!(
                parse_uuid(&c),
                uuid_by_digits(&c),
                "{:?}",
                String::from_utf8_lossy(&c)
            );
        }
    }
}
