//! The mapper's JSON reader: a single-pass scanner over one message (RFC 8259
//! grammar) that writes each mapped field's value straight into the chunk
//! buffer.
//!
//! Why not serde_json's visitor API: measured with instruction counts
//! (cachegrind, 100k flights rows), a serde `DeserializeSeed` walk with
//! per-field dynamic dispatch cost as much as parsing into a
//! `serde_json::Value` tree (about 4,700 vs 5,200 instructions per row),
//! because each field crosses several generic layers and exact number text
//! needs `RawValue`'s second scan. This scanner reads scalars as borrowed
//! slices (numbers exactly as written, strings borrowed unless escaped) and
//! skips unmapped fields without building anything. serde_json stays the
//! reference: a test-only serde reader ([`super::visit`]) must agree with this
//! one on random rows (`scan_agrees_with_serde` in the tests).
//!
//! Guarantees: input is validated as UTF-8 once up front; strings reject
//! control characters and bad escapes (lone surrogates included); numbers
//! follow JSON's grammar (no leading zeros, no `+`, no `.5`); nesting is
//! bounded by [`MAX_DEPTH`]; exactly one object and trailing whitespace are
//! accepted. Nothing is allocated per row once the scratch buffers have grown.

use spate_core::pipeline::chain::RecordError;

use super::coerce::{Put, TimeRules, Tok, looks_numeric, parse_uuid, plain_ipv4, put_scalar};
use super::fast::{Fast, plain_decimal, plain_float, plain_int, ticks};
use super::tuple::Arrivals;
use super::{ColumnSpec, Node, UNSET, u128_or_tail};
use crate::rowbinary::{
    put_fixed_string, put_input_string, put_ipv4, put_leb128, put_string, put_uuid,
};
use crate::time::parse_iso_fixed;
use crate::types::ChType;

/// Nesting bound (objects and arrays), as serde_json's default recursion
/// limit.
pub const MAX_DEPTH: u32 = 128;

/// Why reading stopped.
enum Stop {
    /// Not valid JSON, or not one object.
    Decode(String),
    /// A value refused for a column (its index).
    Refused(usize, String),
}

/// What the row is read against and where it goes.
pub(super) struct RowTarget<'p, 'b> {
    pub root: &'p Node,
    pub columns: &'p [ColumnSpec],
    /// Each column's fast path (same order as `columns`).
    pub fast: &'p [Fast],
    /// Each Array column's element fast path ([`Fast::General`] for other
    /// columns; same order as `columns`).
    pub elem_fast: &'p [Fast],
    /// The mapping's time rules (the fast paths read its formats).
    pub rules: &'p TimeRules,
    /// Each column's time rules (its epoch unit), for the general path.
    pub col_rules: &'p [TimeRules],
    /// Each column's resolved `empty_as_null` (such columns have no fast
    /// path, so only the general path tests it).
    pub empty_null: &'p [bool],
    pub base: usize,
    pub buf: &'b mut Vec<u8>,
    pub spans: &'b mut [(u32, u32)],
    /// Unescaped string values.
    pub text: &'b mut Vec<u8>,
    /// Unescaped keys.
    pub key: &'b mut Vec<u8>,
    /// How many columns, from the first, arrived in column order with each
    /// value right after the previous one (the row then needs no reorder
    /// and no missing-value pass).
    pub in_order: usize,
    /// Where the last of those ends, relative to the row start; `u32::MAX`
    /// once a column is left unset (a null into a non-Nullable column), so
    /// the row takes the full pass.
    pub in_order_end: u32,
}

/// A string's content: borrowed from the input, or unescaped into a scratch
/// buffer.
#[derive(Clone, Copy)]
enum Str {
    Input(usize, usize),
    Scratch,
}

struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
    depth: u32,
}

/// Reads one JSON object from `json` into `t`.
pub(super) fn read_row(json: &[u8], t: &mut RowTarget<'_, '_>) -> Result<(), RecordError> {
    // ASCII (the common case) is UTF-8, and an OR over 8-byte words tests
    // it for a fraction of full validation's instructions.
    if !all_ascii(json)
        && let Err(e) = std::str::from_utf8(json)
    {
        return Err(RecordError::decode(format!(
            "not one JSON object: not UTF-8 ({e})"
        )));
    }
    let mut sc = Scanner {
        s: json,
        i: 0,
        depth: 0,
    };
    let res = (|| {
        sc.ws();
        match sc.peek() {
            Some(b'{') => {}
            Some(b'n') if sc.s[sc.i..].starts_with(b"null") => {
                return Err(Stop::Decode(
                    "the message is JSON null, not an object".into(),
                ));
            }
            None => return Err(Stop::Decode("the message is empty".into())),
            Some(_) => return Err(sc.bad("expected a JSON object")),
        }
        sc.object(t.root, t)?;
        sc.ws();
        if sc.i != sc.s.len() {
            return Err(sc.bad("unexpected text after the object"));
        }
        Ok(())
    })();
    match res {
        Ok(()) => Ok(()),
        Err(Stop::Decode(reason)) => Err(RecordError::decode(format!(
            "not one JSON object: {reason}"
        ))),
        Err(Stop::Refused(col, reason)) => {
            // A refused value in a malformed message: report the message as
            // malformed (decode), whatever came first. Error path only.
            if let Err(Stop::Decode(bad)) = check_grammar(json) {
                return Err(RecordError::decode(format!("not one JSON object: {bad}")));
            }
            Err(RecordError::encode(&t.columns[col].name, reason))
        }
    }
}

/// Whether every byte is below 0x80 (no early exit: messages are short and
/// mostly ASCII).
#[inline]
fn all_ascii(bytes: &[u8]) -> bool {
    let mut acc = 0u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        acc |= u64::from_le_bytes(w.try_into().expect("8 bytes"));
    }
    if !words.remainder().is_empty() {
        // The last 8 bytes (overlapping words already read), or byte by
        // byte in an input shorter than 8.
        match bytes.len().checked_sub(8) {
            Some(last) => {
                acc |= u64::from_le_bytes(bytes[last..].try_into().expect("8 bytes"));
            }
            None => {
                for &b in bytes {
                    acc |= u64::from(b);
                }
            }
        }
    }
    acc & 0x8080_8080_8080_8080 == 0
}

/// Checks that `json` is exactly one JSON object (and whitespace).
fn check_grammar(json: &[u8]) -> Result<(), Stop> {
    let mut sc = Scanner {
        s: json,
        i: 0,
        depth: 0,
    };
    let mut scratch = Vec::new();
    sc.ws();
    if sc.peek() != Some(b'{') {
        return Err(sc.bad("expected a JSON object"));
    }
    sc.skip_value(&mut scratch)?;
    sc.ws();
    if sc.i != sc.s.len() {
        return Err(sc.bad("unexpected text after the object"));
    }
    Ok(())
}

/// Inserts the LEB128 of `n` at `at` (a count goes before the elements,
/// which are only counted once written).
pub(super) fn insert_leb128(buf: &mut Vec<u8>, at: usize, n: u64) {
    if n < 0x80 {
        buf.insert(at, n as u8);
        return;
    }
    let mut len = Vec::with_capacity(10);
    put_leb128(&mut len, n);
    buf.splice(at..at, len);
}

/// `ty` without LowCardinality and Nullable wrappers, and whether it was
/// Nullable.
fn unwrap(ty: &ChType) -> (&ChType, bool) {
    match ty.without_low_cardinality() {
        ChType::Nullable(inner) => (inner.without_low_cardinality(), true),
        other => (other, false),
    }
}

impl<'a> Scanner<'a> {
    fn bad(&self, what: &str) -> Stop {
        Stop::Decode(format!("{what} at byte {}", self.i))
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    #[inline]
    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn enter(&mut self) -> Result<(), Stop> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.bad("nesting deeper than 128"));
        }
        Ok(())
    }

    /// A string at `"`: its content, borrowed or unescaped into `scratch`.
    ///
    /// Short strings (the closing quote among the first 8 bytes after the
    /// opening one, nothing to unescape before it) are decided from one
    /// word here (measured: a second word cost more on flights rows than it
    /// saved), inlined into the caller; the rest go to
    /// [`Self::long_string`].
    #[inline]
    fn string(&mut self, scratch: &mut Vec<u8>) -> Result<Str, Stop> {
        let start = self.i + 1;
        if let Some((_, k)) = self.short_string() {
            return Ok(Str::Input(start, start + k));
        }
        self.long_string(scratch)
    }

    /// The short case of [`Self::string`], at `"`: when the closing quote
    /// is among the 8 bytes after the opening one with nothing to unescape
    /// before it, consumes the string and returns the 8-byte word read
    /// from its first byte (the string is its low `k` bytes) and its
    /// length `k` (at most 7). `None` (nothing consumed) otherwise.
    #[inline]
    fn short_string(&mut self) -> Option<(u64, usize)> {
        debug_assert_eq!(self.peek(), Some(b'"'));
        let start = self.i + 1;
        let v = word_or_tail(self.s, start);
        let m = special_mask(v);
        // The lowest flagged byte is exact; a flagged zero pad past the
        // input's end is not a quote, so an unterminated string goes on.
        let k = (m.trailing_zeros() / 8) as usize;
        if m != 0 && (v >> (8 * k)) as u8 == b'"' {
            debug_assert!(start + k < self.s.len(), "the quote is in the input");
            self.i = start + k + 1;
            return Some((v, k));
        }
        None
    }

    /// [`Self::string`] for strings with an escape, a control character, or
    /// more than 7 bytes.
    #[inline(never)]
    fn long_string(&mut self, scratch: &mut Vec<u8>) -> Result<Str, Stop> {
        debug_assert_eq!(self.peek(), Some(b'"'));
        self.i += 1;
        let start = self.i;
        let mut escaped = false;
        loop {
            // Eight bytes at a time to the next `"`, `\` or control
            // character (the lowest flagged byte is exact: the SWAR test
            // only has false positives above a true one).
            if let Some(word) = self.s.get(self.i..self.i + 8) {
                let v = u64::from_le_bytes([
                    word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
                ]);
                let m = special_mask(v);
                if m == 0 {
                    self.i += 8;
                    continue;
                }
                self.i += (m.trailing_zeros() / 8) as usize;
            }
            match self.s.get(self.i) {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    self.i += 2;
                }
                Some(c) if *c < 0x20 => return Err(self.bad("control character in a string")),
                Some(_) => self.i += 1,
                None => return Err(self.bad("unterminated string")),
            }
        }
        let end = self.i;
        if end > self.s.len() {
            return Err(self.bad("unterminated string"));
        }
        self.i += 1;
        if !escaped {
            return Ok(Str::Input(start, end));
        }
        unescape(&self.s[start..end], scratch)
            .map_err(|reason| Stop::Decode(format!("{reason} in the string at byte {start}")))?;
        Ok(Str::Scratch)
    }

    /// A number: its text, checked against JSON's grammar.
    fn number(&mut self) -> Result<&'a [u8], Stop> {
        let start = self.i;
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.bad("bad number")),
        }
        if self.eat(b'.') {
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.bad("bad number"));
            }
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.bad("bad number"));
            }
            self.digits();
        }
        Ok(&self.s[start..self.i])
    }

    #[inline]
    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Stop> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.bad("bad literal"))
        }
    }

    /// Skips one value of any kind, checking its grammar.
    fn skip_value(&mut self, scratch: &mut Vec<u8>) -> Result<(), Stop> {
        match self.peek() {
            Some(b'"') => self.string(scratch).map(drop),
            Some(b'{') => {
                self.enter()?;
                self.i += 1;
                self.ws();
                if !self.eat(b'}') {
                    loop {
                        self.ws();
                        if self.peek() != Some(b'"') {
                            return Err(self.bad("expected a key"));
                        }
                        self.string(scratch)?;
                        self.ws();
                        if !self.eat(b':') {
                            return Err(self.bad("expected `:`"));
                        }
                        self.ws();
                        self.skip_value(scratch)?;
                        self.ws();
                        if self.eat(b'}') {
                            break;
                        }
                        if !self.eat(b',') {
                            return Err(self.bad("expected `,` or `}`"));
                        }
                    }
                }
                self.depth -= 1;
                Ok(())
            }
            Some(b'[') => {
                self.enter()?;
                self.i += 1;
                self.ws();
                if !self.eat(b']') {
                    loop {
                        self.ws();
                        self.skip_value(scratch)?;
                        self.ws();
                        if self.eat(b']') {
                            break;
                        }
                        if !self.eat(b',') {
                            return Err(self.bad("expected `,` or `]`"));
                        }
                    }
                }
                self.depth -= 1;
                Ok(())
            }
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number().map(drop),
            Some(_) => Err(self.bad("expected a value")),
            None => Err(self.bad("unexpected end")),
        }
    }

    /// One scalar as a token (arrays and objects as their raw text).
    #[inline]
    fn scalar<'t>(&mut self, text: &'t mut Vec<u8>) -> Result<Tok<'t>, Stop>
    where
        'a: 't,
    {
        Ok(match self.peek() {
            Some(b'"') => match self.string(text)? {
                Str::Input(s, e) => Tok::Str(&self.s[s..e]),
                Str::Scratch => Tok::Str(text.as_slice()),
            },
            Some(b'-' | b'0'..=b'9') => Tok::Number(self.number()?),
            Some(b't') => {
                self.literal(b"true")?;
                Tok::Bool(true)
            }
            Some(b'f') => {
                self.literal(b"false")?;
                Tok::Bool(false)
            }
            Some(b'n') => {
                self.literal(b"null")?;
                Tok::Null
            }
            Some(b'[' | b'{') => {
                let start = self.i;
                self.skip_value(text)?;
                Tok::Composite(&self.s[start..self.i])
            }
            Some(_) => return Err(self.bad("expected a value")),
            None => return Err(self.bad("unexpected end")),
        })
    }

    /// An object at `{`, its keys matched against `node`.
    fn object(&mut self, node: &Node, t: &mut RowTarget<'_, '_>) -> Result<(), Stop> {
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
    fn column(&mut self, col: usize, t: &mut RowTarget<'_, '_>) -> Result<(), Stop> {
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
            Fast::Str { nullable } => {
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
            Fast::Time {
                precision,
                wide,
                naive_offset,
                fixed_len,
                nullable,
            } => {
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
                    if !super::coerce::datetime64_in_range(i128::from(ticks), precision) {
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
        }
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

    /// An Array element's fast path: only strings (the usual element
    /// type), so the object loop's inlined copy of [`Self::fast_value`]
    /// stays the only one; same contract.
    #[inline]
    fn fast_element(&mut self, fast: &Fast, t: &mut RowTarget<'_, '_>) -> Result<bool, Stop> {
        let Fast::Str { nullable } = *fast else {
            return Ok(false);
        };
        if self.peek() != Some(b'"') {
            return Ok(false);
        }
        if nullable {
            t.buf.push(0);
        }
        match self.string(t.text)? {
            Str::Input(s, e) => put_input_string(t.buf, self.s, s, e),
            Str::Scratch => put_string(t.buf, t.text),
        }
        Ok(true)
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
        if t.empty_null[col] && self.s.get(self.i..self.i + 2) == Some(b"\"\"") {
            self.i += 2;
            return match put_scalar(ty, Tok::Null, &t.col_rules[col], t.buf) {
                Ok(Put::Written) => Ok(true),
                Ok(Put::NullForNonNullable) => Ok(false),
                Err(reason) => Err(Stop::Refused(col, reason)),
            };
        }
        self.value(ty, &t.elem_fast[col], col, t)
    }

    /// One value of `ty`; `Ok(false)` for null into a non-Nullable type.
    /// `elem_fast` is the element fast path when `ty` is an Array
    /// ([`Fast::General`] otherwise, and for nested arrays).
    fn value(
        &mut self,
        ty: &ChType,
        elem_fast: &Fast,
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<bool, Stop> {
        let (inner, nullable) = unwrap(ty);
        if matches!(inner, ChType::Array(_) | ChType::Map(..) | ChType::Tuple(_)) {
            return self.composite(inner, nullable, elem_fast, col, t);
        }
        let tok = self.scalar(t.text)?;
        match put_scalar(ty, tok, &t.col_rules[col], t.buf) {
            Ok(Put::Written) => Ok(true),
            Ok(Put::NullForNonNullable) => Ok(false),
            Err(reason) => Err(Stop::Refused(col, reason)),
        }
    }

    /// An element of an Array, Tuple or Map value: null only if Nullable.
    fn element(&mut self, ty: &ChType, col: usize, t: &mut RowTarget<'_, '_>) -> Result<(), Stop> {
        if self.value(ty, &Fast::General, col, t)? {
            Ok(())
        } else {
            Err(Stop::Refused(
                col,
                format!("null element, and the element type {ty} is not Nullable"),
            ))
        }
    }

    fn composite(
        &mut self,
        ty: &ChType,
        nullable: bool,
        elem_fast: &Fast,
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<bool, Stop> {
        match (self.peek(), ty) {
            (Some(b'n'), _) => {
                self.literal(b"null")?;
                if nullable {
                    t.buf.push(1);
                }
                Ok(nullable)
            }
            (Some(b'['), ChType::Array(elem)) => {
                if nullable {
                    t.buf.push(0);
                }
                self.enter()?;
                self.i += 1;
                let start = t.buf.len();
                let mut n = 0u64;
                self.ws();
                if !self.eat(b']') {
                    loop {
                        self.ws();
                        // An element takes its fast path as a column does
                        // (same contract: nothing consumed when declined).
                        if !self.fast_element(elem_fast, t)? {
                            self.element(elem, col, t)?;
                        }
                        n += 1;
                        self.ws();
                        if self.eat(b']') {
                            break;
                        }
                        if !self.eat(b',') {
                            return Err(self.bad("expected `,` or `]`"));
                        }
                    }
                }
                self.depth -= 1;
                insert_leb128(t.buf, start, n);
                Ok(true)
            }
            (Some(b'['), ChType::Tuple(elements)) => {
                if nullable {
                    t.buf.push(0);
                }
                self.enter()?;
                self.i += 1;
                for (k, e) in elements.iter().enumerate() {
                    self.ws();
                    if k > 0 && !self.eat(b',') {
                        if self.peek() == Some(b']') {
                            return Err(Stop::Refused(
                                col,
                                format!("{ty} needs {} elements", elements.len()),
                            ));
                        }
                        return Err(self.bad("expected `,`"));
                    }
                    self.ws();
                    if self.peek() == Some(b']') {
                        return Err(Stop::Refused(
                            col,
                            format!("{ty} needs {} elements", elements.len()),
                        ));
                    }
                    self.element(&e.ty, col, t)?;
                }
                self.ws();
                if !self.eat(b']') {
                    if self.peek() == Some(b',') {
                        return Err(Stop::Refused(
                            col,
                            format!("{ty} takes only {} elements", elements.len()),
                        ));
                    }
                    return Err(self.bad("expected `]`"));
                }
                self.depth -= 1;
                Ok(true)
            }
            (Some(b'{'), ChType::Map(k, v)) => {
                if nullable {
                    t.buf.push(0);
                }
                self.enter()?;
                self.i += 1;
                let start = t.buf.len();
                let mut n = 0u64;
                self.ws();
                if !self.eat(b'}') {
                    loop {
                        self.ws();
                        if self.peek() != Some(b'"') {
                            return Err(self.bad("expected a key"));
                        }
                        let key = self.string(t.key)?;
                        let key_bytes = match key {
                            Str::Input(s, e) => &self.s[s..e],
                            Str::Scratch => t.key.as_slice(),
                        };
                        match put_scalar(k, Tok::Str(key_bytes), &t.col_rules[col], t.buf) {
                            Ok(Put::Written) => {}
                            Ok(Put::NullForNonNullable) => {
                                return Err(Stop::Refused(col, "null map key".into()));
                            }
                            Err(reason) => {
                                return Err(Stop::Refused(col, format!("map key: {reason}")));
                            }
                        }
                        self.ws();
                        if !self.eat(b':') {
                            return Err(self.bad("expected `:`"));
                        }
                        self.ws();
                        self.element(v, col, t)?;
                        n += 1;
                        self.ws();
                        if self.eat(b'}') {
                            break;
                        }
                        if !self.eat(b',') {
                            return Err(self.bad("expected `,` or `}`"));
                        }
                    }
                }
                self.depth -= 1;
                insert_leb128(t.buf, start, n);
                Ok(true)
            }
            (Some(b'{'), ChType::Tuple(elements)) => {
                self.named_tuple(ty, elements, nullable, col, t)?;
                Ok(true)
            }
            (found, _) => {
                // Check the grammar first: bad JSON is a decode error.
                let mut scratch = Vec::new();
                self.skip_value(&mut scratch)?;
                Err(Stop::Refused(
                    col,
                    format!("cannot put {} into {ty}", describe(found)),
                ))
            }
        }
    }
}

impl Scanner<'_> {
    /// A named tuple from an object, fields in any order (see
    /// [`super::tuple`]).
    fn named_tuple(
        &mut self,
        ty: &ChType,
        elements: &[crate::types::TupleElement],
        nullable: bool,
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<(), Stop> {
        let mut arrivals = match Arrivals::new(ty, elements) {
            Ok(a) => a,
            Err(reason) => {
                self.skip_value(t.text)?;
                return Err(Stop::Refused(col, reason));
            }
        };
        if nullable {
            t.buf.push(0);
        }
        self.enter()?;
        self.i += 1;
        let start = t.buf.len();
        self.ws();
        if !self.eat(b'}') {
            loop {
                self.ws();
                if self.peek() != Some(b'"') {
                    return Err(self.bad("expected a key"));
                }
                let key = self.string(t.key)?;
                let key_bytes = match key {
                    Str::Input(s, e) => &self.s[s..e],
                    Str::Scratch => t.key.as_slice(),
                };
                let k = arrivals
                    .element(elements, key_bytes)
                    .map_err(|reason| Stop::Refused(col, reason))?;
                self.ws();
                if !self.eat(b':') {
                    return Err(self.bad("expected `:`"));
                }
                self.ws();
                match k {
                    Some(k) => {
                        let at = t.buf.len();
                        self.element(&elements[k].ty, col, t)?;
                        arrivals.arrived(k, t.buf.len() - at);
                    }
                    None => self.skip_value(t.text)?,
                }
                self.ws();
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return Err(self.bad("expected `,` or `}`"));
                }
            }
        }
        self.depth -= 1;
        arrivals
            .finish(elements, t.buf, start)
            .map_err(|reason| Stop::Refused(col, reason))
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

/// The 8 bytes of `s` from `at` as a little-endian word; near the end, the
/// bytes left zero-padded (nothing past `s`, so a pad byte reads as a
/// control character to [`special_mask`]).
///
/// The tail is the input's last 8 bytes shifted down (the last string of
/// a message, say `"LAS"}`, is read there on every row), or byte by byte
/// in an input shorter than 8.
#[inline]
fn word_or_tail(s: &[u8], at: usize) -> u64 {
    if let Some(w) = s.get(at..at + 8) {
        return u64::from_le_bytes(w.try_into().expect("8 bytes"));
    }
    match s.len().checked_sub(8) {
        Some(last) if at <= s.len() => {
            let w = u64::from_le_bytes(s[last..].try_into().expect("8 bytes"));
            // `at - last` is 1..=8 here; 8 (nothing left) shifts all out.
            w.checked_shr(8 * (at - last) as u32).unwrap_or(0)
        }
        _ => short_tail(s, at),
    }
}

/// [`word_or_tail`] in an input shorter than 8 bytes.
#[cold]
fn short_tail(s: &[u8], at: usize) -> u64 {
    let mut v = 0u64;
    for (k, &b) in s.get(at..).unwrap_or_default().iter().enumerate() {
        v |= u64::from(b) << (8 * k);
    }
    v
}

/// The high bit of each byte of `v` that is `"`, `\\` or below 0x20, exact
/// up to the lowest flagged byte (SWAR: a byte equal to `c` becomes zero
/// after xor; `(x - 0x01..) & !x & 0x80..` flags zero bytes, and
/// `(v - 0x20..) & !v & 0x80..` flags bytes below 0x20; borrows only create
/// false flags above a true one).
#[inline]
fn special_mask(v: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let quote = zero(v ^ (ONES * u64::from(b'"')));
    let backslash = zero(v ^ (ONES * u64::from(b'\\')));
    let control = v.wrapping_sub(ONES * 0x20) & !v & HIGH;
    quote | backslash | control
}

fn describe(first: Option<u8>) -> &'static str {
    match first {
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        Some(b't' | b'f') => "a bool",
        Some(b'n') => "null",
        Some(b'-' | b'0'..=b'9') => "a number",
        _ => "nothing",
    }
}

/// JSON string unescaping (RFC 8259 section 7) into `out` (cleared first):
/// surrogate pairs combine, a lone surrogate is refused.
pub(crate) fn unescape(body: &[u8], out: &mut Vec<u8>) -> Result<(), &'static str> {
    out.clear();
    let hex4 = |at: usize| -> Result<u32, &'static str> {
        let h = body.get(at..at + 4).ok_or("bad \\u escape")?;
        let mut v = 0u32;
        for &c in h {
            v = (v << 4) | (c as char).to_digit(16).ok_or("bad \\u escape")?;
        }
        Ok(v)
    };
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let e = *body.get(i + 1).ok_or("dangling escape")?;
        i += 2;
        let simple = match e {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let mut cp = hex4(i)?;
                i += 4;
                if (0xd800..0xdc00).contains(&cp) {
                    if body.get(i..i + 2) != Some(b"\\u") {
                        return Err("lone surrogate in a \\u escape");
                    }
                    let low = hex4(i + 2)?;
                    if !(0xdc00..0xe000).contains(&low) {
                        return Err("lone surrogate in a \\u escape");
                    }
                    i += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
                }
                let ch = char::from_u32(cp).ok_or("lone surrogate in a \\u escape")?;
                let mut utf8 = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
                continue;
            }
            _ => return Err("bad escape"),
        };
        out.push(simple);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_json_strings() {
        let mut out = Vec::new();
        unescape(br#"a\"b\\c\/\n\u00e9\ud83d\ude00"#, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "a\"b\\c/\n\u{e9}\u{1f600}"
        );
        assert!(unescape(br"\ud83d", &mut out).is_err());
        assert!(unescape(br"\ud83dx", &mut out).is_err());
        assert!(unescape(br"\x", &mut out).is_err());
        assert!(unescape(br"\u12", &mut out).is_err());
    }

    #[test]
    fn special_bytes_are_found_in_every_lane() {
        for lane in 0..8 {
            for special in [b'"', b'\\', 0x00, 0x1f] {
                let mut w = [b'a'; 8];
                w[lane] = special;
                let m = special_mask(u64::from_le_bytes(w));
                assert_eq!(
                    m.trailing_zeros() / 8,
                    lane as u32,
                    "{special:#x} at {lane}"
                );
            }
            for plain in [b' ', b'~', 0x7f, 0x80, 0xc3, 0xff, b'!', b'#', b'[', b']'] {
                let mut w = [b'a'; 8];
                w[lane] = plain;
                assert_eq!(
                    special_mask(u64::from_le_bytes(w)),
                    0,
                    "{plain:#x} at {lane}"
                );
            }
        }
    }

    #[test]
    fn word_or_tail_is_the_bytes_left_zero_padded() {
        for len in 0..24usize {
            let s: Vec<u8> = (0..len).map(|k| (k * 37 + 11) as u8 | 1).collect();
            for at in 0..=len + 1 {
                let mut want = 0u64;
                for (k, &b) in s.get(at..).unwrap_or_default().iter().take(8).enumerate() {
                    want |= u64::from(b) << (8 * k);
                }
                assert_eq!(word_or_tail(&s, at), want, "{len} {at}");
            }
        }
    }

    #[test]
    fn ascii_test_sees_a_high_byte_anywhere() {
        for len in 0..20 {
            let mut b = vec![b'a'; len];
            assert!(all_ascii(&b));
            for at in 0..len {
                b[at] = 0x80;
                assert!(!all_ascii(&b), "{len} {at}");
                b[at] = 0x7f;
            }
        }
    }

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

    #[test]
    fn leb128_insertion() {
        let mut buf = vec![9, 1, 2];
        insert_leb128(&mut buf, 1, 2);
        assert_eq!(buf, [9, 2, 1, 2]);
        let mut buf = vec![9];
        insert_leb128(&mut buf, 1, 300);
        assert_eq!(buf, [9, 0xac, 0x02]);
    }
}
