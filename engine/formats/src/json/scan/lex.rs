//! The lexer: JSON tokens (RFC 8259) read from one message at a cursor.
//!
//! Strings (borrowed from the input, or unescaped into a scratch buffer),
//! numbers exactly as written, literals, whitespace, whole values skipped
//! with their grammar checked, and the bracketed-sequence loop every
//! array and object reader shares ([`Scanner::bracketed`]). Also the
//! word-at-a-time helpers the string reader and the ASCII test use (SWAR
//! over 8-byte words).
//!
//! Not here: what a value means for a column (the row mapping in
//! [`super::row`] and [`super::composite`], the coercions in
//! [`spate_row::coerce`]).

use spate_row::coerce::Tok;

use super::Stop;

/// Nesting bound (objects and arrays), as serde_json's default recursion
/// limit.
pub const MAX_DEPTH: u32 = 128;

/// A string's content: borrowed from the input, or unescaped into a scratch
/// buffer.
#[derive(Clone, Copy)]
pub(super) enum Str {
    Input(usize, usize),
    Scratch,
}

pub(super) struct Scanner<'a> {
    pub(super) s: &'a [u8],
    pub(super) i: usize,
    pub(super) depth: u32,
}

impl<'a> Scanner<'a> {
    /// A decode error `what` at the cursor's byte. Cold and outlined: only
    /// malformed input gets here, and its formatting inlined into the
    /// readers cost the row's object and column readers registers.
    #[cold]
    #[inline(never)]
    pub(super) fn bad(&self, what: &str) -> Stop {
        Stop::Decode(format!("{what} at byte {}", self.i))
    }

    #[inline]
    pub(super) fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    #[inline]
    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    #[inline]
    pub(super) fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    pub(super) fn enter(&mut self) -> Result<(), Stop> {
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
    pub(super) fn string(&mut self, scratch: &mut Vec<u8>) -> Result<Str, Stop> {
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
    pub(super) fn short_string(&mut self) -> Option<(u64, usize)> {
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
    pub(super) fn long_string(&mut self, scratch: &mut Vec<u8>) -> Result<Str, Stop> {
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
    pub(super) fn number(&mut self) -> Result<&'a [u8], Stop> {
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

    pub(super) fn literal(&mut self, word: &[u8]) -> Result<(), Stop> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.bad("bad literal"))
        }
    }

    /// Skips one value of any kind, checking its grammar.
    pub(super) fn skip_value(&mut self, scratch: &mut Vec<u8>) -> Result<(), Stop> {
        match self.peek() {
            Some(b'"') => self.string(scratch).map(drop),
            Some(b'{') => self
                .bracketed(b'}', |sc| {
                    sc.key(scratch)?;
                    sc.colon()?;
                    sc.skip_value(scratch)
                })
                .map(drop),
            Some(b'[') => self.bracketed(b']', |sc| sc.skip_value(scratch)).map(drop),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number().map(drop),
            Some(_) => Err(self.bad("expected a value")),
            None => Err(self.bad("unexpected end")),
        }
    }

    /// A bracketed sequence at its opening `[` or `{`, through `close`
    /// (`]` or `}`): `each` reads one element at a time, whitespace around
    /// it skipped, elements separated by `,`. One nesting level
    /// ([`MAX_DEPTH`]). Returns how many elements were read.
    ///
    /// # Errors
    /// Too deep, a missing `,` or `close` (at its byte), or whatever
    /// `each` returns.
    #[inline]
    pub(super) fn bracketed(
        &mut self,
        close: u8,
        mut each: impl FnMut(&mut Self) -> Result<(), Stop>,
    ) -> Result<u64, Stop> {
        debug_assert!(matches!(close, b']' | b'}'), "a closing bracket");
        self.enter()?;
        self.i += 1;
        let mut n = 0u64;
        self.ws();
        if !self.eat(close) {
            loop {
                self.ws();
                each(self)?;
                n += 1;
                self.ws();
                if self.eat(close) {
                    break;
                }
                if !self.eat(b',') {
                    return Err(self.bad(if close == b']' {
                        "expected `,` or `]`"
                    } else {
                        "expected `,` or `}`"
                    }));
                }
            }
        }
        self.depth -= 1;
        Ok(n)
    }

    /// An object member's key at the cursor (a string, else "expected a
    /// key"): its content, borrowed from the input or unescaped into
    /// `scratch`.
    #[inline]
    pub(super) fn key<'k>(&mut self, scratch: &'k mut Vec<u8>) -> Result<&'k [u8], Stop>
    where
        'a: 'k,
    {
        if self.peek() != Some(b'"') {
            return Err(self.bad("expected a key"));
        }
        Ok(match self.string(scratch)? {
            Str::Input(s, e) => &self.s[s..e],
            Str::Scratch => scratch.as_slice(),
        })
    }

    /// The `:` after a member's key, and the whitespace around it.
    #[inline]
    pub(super) fn colon(&mut self) -> Result<(), Stop> {
        self.ws();
        if !self.eat(b':') {
            return Err(self.bad("expected `:`"));
        }
        self.ws();
        Ok(())
    }

    /// One scalar as a token (arrays and objects as their raw text).
    #[inline]
    pub(super) fn scalar<'t>(&mut self, text: &'t mut Vec<u8>) -> Result<Tok<'t>, Stop>
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
}

/// Whether every byte is below 0x80 (no early exit: messages are short and
/// mostly ASCII).
#[inline]
pub(super) fn all_ascii(bytes: &[u8]) -> bool {
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

pub(super) fn describe(first: Option<u8>) -> &'static str {
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
}
