//! Row mapping: a message's top-level object read into its columns.
//!
//! [`Scanner::object`] matches keys against the mapping's key tree (the
//! in-order loop first, for fields in their usual order), and
//! [`Scanner::column`] writes one column's value: its fast path when the
//! column has one and the value fits it, else the general path
//! ([`Scanner::top_value`], then [`super::composite`] for arrays, maps
//! and tuples). Each column's span is recorded for the reorder pass.

use crate::json::fast::{Fast, plain_decimal, plain_float, plain_int, ticks};
use crate::json::{EMPTY_IS_MISSING, NULL_IS_MISSING, Node, UNSET, u128_or_tail};
use spate_row::coerce::{Put, Tok, looks_numeric, parse_uuid, plain_ipv4, put_scalar};
use spate_row::rowbinary::{put_fixed_string, put_input_string, put_ipv4, put_string, put_uuid};
use spate_row::time::parse_iso_fixed;
use spate_row::types::ChType;

use super::lex::{Scanner, Str, describe};
use super::{RowTarget, Stop};

impl Scanner<'_> {
    /// An object at `{`, its keys matched against `node`.
    pub(super) fn object(&mut self, node: &Node, t: &mut RowTarget<'_, '_>) -> Result<(), Stop> {
        self.enter()?;
        self.i += 1;
        let mut hint = 0usize;
        // Fields in key order, compact (`"key":` then the value, then `,`
        // or `}`), into columns without nested ones: the loop below with
        // its cases taken out. It reads as that loop reads; anything else
        // (whitespace before a key, another key, an escape) leaves it for
        // that loop at the same place.
        while let Some(e) = node.keys.get(hint) {
            let Some(col) = e.direct else { break };
            if u128_or_tail(self.s, self.i) & e.word.mask != e.word.head {
                break;
            }
            self.i += usize::from(e.word.head_len);
            hint += 1;
            self.ws();
            self.column(col, t)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    self.depth -= 1;
                    return Ok(());
                }
                _ => {
                    self.ws();
                    if self.eat(b'}') {
                        self.depth -= 1;
                        return Ok(());
                    }
                    if !self.eat(b',') {
                        return Err(self.bad("expected `,` or `}`"));
                    }
                }
            }
        }
        if hint == 0 {
            self.ws();
            if self.eat(b'}') {
                self.depth -= 1;
                return Ok(());
            }
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(self.bad("expected a key"));
            }
            let (slot, colon) =
                if let Some((slot, after, colon)) = node.expect(hint, self.s, self.i) {
                    self.i = after;
                    hint += 1;
                    (Some(slot), colon)
                } else {
                    let slot = match self.string(t.key)? {
                        Str::Input(s, e) => node.find(&self.s[s..e], &mut hint),
                        Str::Scratch => node.find(t.key, &mut hint),
                    };
                    (slot, false)
                };
            if !colon {
                self.ws();
                if !self.eat(b':') {
                    return Err(self.bad("expected `:`"));
                }
            }
            self.ws();
            match slot {
                None => self.skip_value(t.text)?,
                Some(slot) => {
                    let at = self.i;
                    if let Some(col) = slot.column {
                        self.column(col, t)?;
                    }
                    if let Some(child) = &slot.child {
                        // Nested columns read inside the same value.
                        let end = self.i;
                        self.i = at;
                        match self.peek() {
                            Some(b'{') => self.object(child, t)?,
                            Some(b'n') => self.literal(b"null")?,
                            _ if slot.column.is_some() => {}
                            found => {
                                return Err(Stop::Refused(
                                    child.any_column,
                                    format!(
                                        "expected a JSON object on the path to this column, found {}",
                                        describe(found)
                                    ),
                                ));
                            }
                        }
                        if slot.column.is_some() {
                            self.i = end;
                        }
                    }
                }
            }
            self.ws();
            if self.eat(b'}') {
                break;
            }
            if !self.eat(b',') {
                return Err(self.bad("expected `,` or `}`"));
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// One column's value; records its span, or leaves it unset for null into
    /// a non-Nullable column (the missing-value rule applies).
    pub(super) fn column(&mut self, col: usize, t: &mut RowTarget<'_, '_>) -> Result<(), Stop> {
        let start = t.buf.len();
        let columns = t.columns;
        // By reference: copying the enum costs more than the match.
        let fasts = t.fast;
        let fast = &fasts[col];
        if self.fast_value(fast, t)?
            || self.fast_null(fast, t)?
            || self.top_value(&columns[col].ty, col, t)?
        {
            let span = ((start - t.base) as u32, (t.buf.len() - t.base) as u32);
            t.spans[col] = span;
            if col == t.in_order && span.0 == t.in_order_end {
                t.in_order += 1;
                t.in_order_end = span.1;
            }
        } else {
            t.buf.truncate(start);
            t.spans[col] = UNSET;
            t.in_order_end = u32::MAX;
        }
        Ok(())
    }

    /// The column's fast path: `Ok(true)` when it wrote the value, `Ok(false)`
    /// (nothing consumed, nothing written) when the general path must run.
    #[inline]
    fn fast_value(&mut self, fast: &Fast, t: &mut RowTarget<'_, '_>) -> Result<bool, Stop> {
        match *fast {
            Fast::General => Ok(false),
            Fast::Float { .. }
            | Fast::Decimal { .. }
            | Fast::Bool { .. }
            | Fast::Uuid { .. }
            | Fast::FixedString { .. }
            | Fast::Ipv4 { .. } => self.fast_other(fast, t),
            Fast::Int {
                bytes,
                min,
                max,
                nullable,
            } => {
                let Some((v, len)) = plain_int(&self.s[self.i..]) else {
                    return Ok(false);
                };
                if v < min || v > max {
                    return Ok(false);
                }
                self.i += len;
                if nullable {
                    t.buf.push(0);
                }
                put_low_bytes(t.buf, v, bytes);
                Ok(true)
            }
            Fast::Str { nullable } => self.fast_str(nullable, t),
            Fast::Time { .. } => self.fast_time(fast, t),
        }
    }

    /// The String fast path: a quoted string, short ones in one word; same contract as [`Self::fast_value`].
    #[inline(always)]
    fn fast_str(&mut self, nullable: bool, t: &mut RowTarget<'_, '_>) -> Result<bool, Stop> {
        if self.peek() != Some(b'"') {
            return Ok(false);
        }
        if nullable {
            t.buf.push(0);
        }
        if let Some((v, k)) = self.short_string() {
            // As put_string: the one-byte length, then the
            // string, written as the word moved up a byte (its top
            // byte, past the string, drops out) and cut back to
            // the string's end. (Measured: through put_low_bytes
            // the 8-byte append is inlined, a plain
            // extend_from_slice here was a call.)
            let end = t.buf.len() + 1 + k;
            put_low_bytes(t.buf, ((v << 8) | k as u64) as i64, 8);
            t.buf.truncate(end);
            return Ok(true);
        }
        match self.string(t.text)? {
            Str::Input(s, e) => put_input_string(t.buf, self.s, s, e),
            Str::Scratch => put_string(t.buf, t.text),
        }
        Ok(true)
    }

    /// The DateTime/DateTime64 fast path: ISO or the first format's fixed layout; same contract as [`Self::fast_value`].
    #[inline(always)]
    fn fast_time(&mut self, fast: &Fast, t: &mut RowTarget<'_, '_>) -> Result<bool, Stop> {
        let Fast::Time {
            precision,
            wide,
            naive_offset,
            fixed_len,
            nullable,
        } = *fast
        else {
            unreachable!("fast_value dispatches Fast::Time here")
        };
        if self.peek() != Some(b'"') {
            return Ok(false);
        }
        let at = self.i;
        // The first format's fixed layout, read straight from the
        // input when its closing quote is where the layout ends: a
        // match is a plain string (no escapes), not numeric, and
        // not RFC 3339 (TimeFormat::fixed_json_len), so it is what
        // the scan below would decide.
        let body = at + 1;
        let end = body + usize::from(fixed_len);
        let quick = match (self.s.get(end), t.rules.formats.first()) {
            (Some(b'"'), Some(f)) if fixed_len > 0 => f.parse_fixed(&self.s[body..end]),
            _ => None,
        };
        let parsed = if quick.is_some() {
            self.i = end + 1;
            quick
        } else {
            let Str::Input(s, e) = self.string(t.text)? else {
                self.i = at;
                return Ok(false);
            };
            let text = &self.s[s..e];
            // Numeric-looking text is an epoch (time_ticks' first
            // rule).
            if looks_numeric(text) {
                None
            } else {
                parse_iso_fixed(text)
                    .or_else(|| t.rules.formats.first().and_then(|f| f.parse_fixed(text)))
            }
        };
        let ticks = parsed.and_then(|p| {
            let offset = p.offset_secs.or(naive_offset)?;
            ticks(&p, offset, precision)
        });
        let Some(ticks) = ticks else {
            self.i = at;
            return Ok(false);
        };
        if wide {
            if !spate_row::coerce::datetime64_in_range(i128::from(ticks), precision) {
                self.i = at;
                return Ok(false);
            }
            if nullable {
                t.buf.push(0);
            }
            t.buf.extend_from_slice(&ticks.to_le_bytes());
        } else {
            let Ok(secs) = u32::try_from(ticks) else {
                self.i = at;
                return Ok(false);
            };
            if nullable {
                t.buf.push(0);
            }
            t.buf.extend_from_slice(&secs.to_le_bytes());
        }
        Ok(true)
    }

    /// The fast paths of the other scalar types (Float, Decimal, Bool,
    /// UUID, FixedString, IPv4); same contract as [`Self::fast_value`].
    #[inline]
    fn fast_other(&mut self, fast: &Fast, t: &mut RowTarget<'_, '_>) -> Result<bool, Stop> {
        match *fast {
            Fast::Float { wide, nullable } => {
                if !matches!(self.peek(), Some(b'-' | b'0'..=b'9')) {
                    return Ok(false);
                }
                let at = self.i;
                let Some(f) = plain_float(self.number()?, wide) else {
                    self.i = at;
                    return Ok(false);
                };
                if nullable {
                    t.buf.push(0);
                }
                if wide {
                    t.buf.extend_from_slice(&f.to_le_bytes());
                } else {
                    t.buf.extend_from_slice(&(f as f32).to_le_bytes());
                }
                Ok(true)
            }
            Fast::Decimal {
                precision,
                scale,
                bytes,
                nullable,
            } => {
                let at = self.i;
                let src = self.s;
                let text = match self.peek() {
                    Some(b'-' | b'0'..=b'9') => self.number()?,
                    Some(b'"') => match self.string(t.text)? {
                        Str::Input(s, e) => &src[s..e],
                        Str::Scratch => {
                            self.i = at;
                            return Ok(false);
                        }
                    },
                    _ => return Ok(false),
                };
                let Some(v) = plain_decimal(text, scale, precision) else {
                    self.i = at;
                    return Ok(false);
                };
                if nullable {
                    t.buf.push(0);
                }
                put_low_bytes(t.buf, v, bytes);
                Ok(true)
            }
            Fast::Bool { nullable } => {
                let b = match self.peek() {
                    Some(b't') => {
                        self.literal(b"true")?;
                        1
                    }
                    Some(b'f') => {
                        self.literal(b"false")?;
                        0
                    }
                    _ => return Ok(false),
                };
                if nullable {
                    t.buf.push(0);
                }
                t.buf.push(b);
                Ok(true)
            }
            Fast::Uuid { nullable }
            | Fast::FixedString { nullable, .. }
            | Fast::Ipv4 { nullable } => {
                if self.peek() != Some(b'"') {
                    return Ok(false);
                }
                let at = self.i;
                let src = self.s;
                let text = match self.string(t.text)? {
                    Str::Input(s, e) => &src[s..e],
                    Str::Scratch => t.text.as_slice(),
                };
                let start = t.buf.len();
                if nullable {
                    t.buf.push(0);
                }
                let written = match *fast {
                    Fast::Uuid { .. } => parse_uuid(text).map(|u| put_uuid(t.buf, u)),
                    Fast::FixedString { n, .. } => {
                        (text.len() <= n).then(|| put_fixed_string(t.buf, text, n))
                    }
                    _ => plain_ipv4(text).map(|ip| put_ipv4(t.buf, ip)),
                };
                if written.is_none() {
                    t.buf.truncate(start);
                    self.i = at;
                    return Ok(false);
                }
                Ok(true)
            }
            Fast::General | Fast::Int { .. } | Fast::Str { .. } | Fast::Time { .. } => Ok(false),
        }
    }

    /// `null` into a Nullable column with a fast path: its marker alone, as
    /// put_scalar writes it. `Ok(false)` (nothing consumed) otherwise: into
    /// other columns the general path applies the missing-value rule.
    #[inline]
    fn fast_null(&mut self, fast: &Fast, t: &mut RowTarget<'_, '_>) -> Result<bool, Stop> {
        if self.peek() != Some(b'n') || fast.nullable() != Some(true) {
            return Ok(false);
        }
        self.literal(b"null")?;
        t.buf.push(1);
        Ok(true)
    }

    /// A column's own value on the general path: `""` counts as null
    /// when the column's `empty_as_null` applies, else [`Self::value`].
    /// Not inlined: inlined into [`Self::column`] it cost the fast paths
    /// about 10 instructions per flight row (callgrind), by code layout
    /// alone.
    #[inline(never)]
    fn top_value(
        &mut self,
        ty: &ChType,
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<bool, Stop> {
        let flags = t.empty_null[col];
        if flags & NULL_IS_MISSING != 0 && self.s.get(self.i..self.i + 4) == Some(b"null") {
            // Coalesce (mapping.defaults): the literal fills it.
            self.i += 4;
            return Ok(false);
        }
        if flags & EMPTY_IS_MISSING != 0 && self.s.get(self.i..self.i + 2) == Some(b"\"\"") {
            self.i += 2;
            if flags & NULL_IS_MISSING != 0 {
                return Ok(false);
            }
            return match put_scalar(ty, Tok::Null, &t.col_rules[col], t.buf) {
                Ok(Put::Written) => Ok(true),
                Ok(Put::NullForNonNullable) => Ok(false),
                Err(reason) => Err(Stop::Refused(col, reason)),
            };
        }
        self.value(ty, &t.elem_fast[col], col, t)
    }
}

/// Appends the low `bytes` (1, 2, 4 or 8) bytes of `v`, little-endian, as
/// one fixed 8-byte copy cut back to length: a copy of a run-time length is
/// a `memcpy` call.
#[inline]
fn put_low_bytes(buf: &mut Vec<u8>, v: i64, bytes: u8) {
    debug_assert!(matches!(bytes, 1 | 2 | 4 | 8), "integer width");
    let end = buf.len() + usize::from(bytes);
    buf.extend_from_slice(&v.to_le_bytes());
    buf.truncate(end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_bytes_are_the_integers_little_endian_prefix() {
        for v in [
            0i64,
            -1,
            1,
            127,
            -128,
            0x1234,
            -0x1234_5678,
            i64::MIN,
            i64::MAX,
        ] {
            for bytes in [1u8, 2, 4, 8] {
                let mut buf = vec![9];
                put_low_bytes(&mut buf, v, bytes);
                let mut want = vec![9];
                want.extend_from_slice(&v.to_le_bytes()[..usize::from(bytes)]);
                assert_eq!(buf, want, "{v} in {bytes}");
            }
        }
    }
}
