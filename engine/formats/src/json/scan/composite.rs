//! Composite values: arrays, maps and tuples (and the scalars inside
//! them), written as ClickHouse's RowBinary lays them out (an Array or Map
//! is its element count as LEB128, then its elements; a Tuple its
//! elements in order).
//!
//! Arrays, maps and named tuples read their elements through the one
//! bracketed-sequence loop ([`Scanner::bracketed`]); a positional tuple
//! counts its elements against the type as it goes.

use crate::json::fast::Fast;
use crate::json::tuple::Arrivals;
use spate_row::coerce::{Put, Tok, put_scalar};
use spate_row::rowbinary::{put_input_string, put_leb128, put_string};
use spate_row::types::ChType;

use super::lex::{Scanner, Str, describe};
use super::{RowTarget, Stop};

impl Scanner<'_> {
    /// One value of `ty`; `Ok(false)` for null into a non-Nullable type.
    /// `elem_fast` is the element fast path when `ty` is an Array
    /// ([`Fast::General`] otherwise, and for nested arrays).
    pub(super) fn value(
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
        not_null(nullable, t.buf);
        match self.string(t.text)? {
            Str::Input(s, e) => put_input_string(t.buf, self.s, s, e),
            Str::Scratch => put_string(t.buf, t.text),
        }
        Ok(true)
    }

    /// An Array, Map or Tuple value of `ty` (wrappers already taken off;
    /// `nullable` when it was Nullable), or null: decides by the value's
    /// first byte and the type which reader below writes it. `Ok(false)`
    /// for null into a non-Nullable type.
    fn composite(
        &mut self,
        ty: &ChType,
        nullable: bool,
        elem_fast: &Fast,
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<bool, Stop> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            if nullable {
                t.buf.push(1);
            }
            return Ok(nullable);
        }
        // Not null: the marker first (a refusal leaves the row in error,
        // and the caller drops its bytes).
        not_null(nullable, t.buf);
        match (self.peek(), ty) {
            (Some(b'['), ChType::Array(elem)) => self.counted(b']', t, |sc, t| {
                // An element takes its fast path as a column does (same
                // contract: nothing consumed when declined).
                if !sc.fast_element(elem_fast, t)? {
                    sc.element(elem, col, t)?;
                }
                Ok(())
            })?,
            (Some(b'['), ChType::Tuple(elements)) => self.tuple(ty, elements, col, t)?,
            (Some(b'{'), ChType::Map(k, v)) => self.map(k, v, col, t)?,
            (Some(b'{'), ChType::Tuple(elements)) => self.named_tuple(ty, elements, col, t)?,
            (found, _) => {
                // Check the grammar first: bad JSON is a decode error.
                let mut scratch = Vec::new();
                self.skip_value(&mut scratch)?;
                return Err(Stop::Refused(
                    col,
                    format!("cannot put {} into {ty}", describe(found)),
                ));
            }
        }
        Ok(true)
    }

    /// A sequence written as its element count (LEB128) and then its
    /// elements, as RowBinary lays out an Array or a Map: `each` reads one
    /// element (see [`Scanner::bracketed`]).
    fn counted(
        &mut self,
        close: u8,
        t: &mut RowTarget<'_, '_>,
        mut each: impl FnMut(&mut Self, &mut RowTarget<'_, '_>) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        let start = t.buf.len();
        let n = self.bracketed(close, |sc| each(sc, t))?;
        insert_leb128(t.buf, start, n);
        Ok(())
    }

    /// A Map from a JSON object: its count (LEB128), then its entries in
    /// input order, a repeated key keeping its last value at its first place
    /// (docs/CONFIG.md, "a key repeated in one object").
    fn map(
        &mut self,
        k: &ChType,
        v: &ChType,
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<(), Stop> {
        let start = t.buf.len();
        let first = t.marks.len();
        let read = self.bracketed(b'}', |sc| sc.map_entry(k, v, col, t));
        let kept = read
            .map(|_| spate_row::rowbinary::keep_last_map_entries(t.buf, &t.marks[first..], t.text));
        t.marks.truncate(first);
        insert_leb128(t.buf, start, kept?);
        Ok(())
    }

    /// One member of a Map's object: the key (a scalar of type `k` read
    /// from the member's key), `:`, the value; its place goes to
    /// `t.marks`.
    fn map_entry(
        &mut self,
        k: &ChType,
        v: &ChType,
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<(), Stop> {
        let key = self.key(t.key)?;
        let at = t.buf.len();
        match put_scalar(k, Tok::Str(key), &t.col_rules[col], t.buf) {
            Ok(Put::Written) => {}
            Ok(Put::NullForNonNullable) => {
                return Err(Stop::Refused(col, "null map key".into()));
            }
            Err(reason) => {
                return Err(Stop::Refused(col, format!("map key: {reason}")));
            }
        }
        t.marks.push((at, t.buf.len()));
        self.colon()?;
        self.element(v, col, t)
    }

    /// A Tuple from a JSON array, its elements in order: exactly as many
    /// as the type has (fewer or more is the column's refusal).
    fn tuple(
        &mut self,
        ty: &ChType,
        elements: &[spate_row::types::TupleElement],
        col: usize,
        t: &mut RowTarget<'_, '_>,
    ) -> Result<(), Stop> {
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
        Ok(())
    }

    /// A named tuple from an object, fields in any order (see
    /// [`super::tuple`]).
    fn named_tuple(
        &mut self,
        ty: &ChType,
        elements: &[spate_row::types::TupleElement],
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
        let start = t.buf.len();
        self.bracketed(b'}', |sc| {
            let key = sc.key(t.key)?;
            let k = arrivals
                .element(elements, key)
                .map_err(|reason| Stop::Refused(col, reason))?;
            sc.colon()?;
            match k {
                Some(k) => {
                    let at = t.buf.len();
                    sc.element(&elements[k].ty, col, t)?;
                    arrivals.arrived(k, t.buf.len() - at);
                }
                None => sc.skip_value(t.text)?,
            }
            Ok(())
        })?;
        arrivals
            .finish(elements, t.buf, start)
            .map_err(|reason| Stop::Refused(col, reason))
    }
}

/// The Nullable marker of a value that is not null (written before the
/// value; nothing for a type that is not Nullable).
#[inline]
fn not_null(nullable: bool, buf: &mut Vec<u8>) {
    if nullable {
        buf.push(0);
    }
}

/// Inserts the LEB128 of `n` at `at` (a count goes before the elements,
/// which are only counted once written).
pub(in crate::json) fn insert_leb128(buf: &mut Vec<u8>, at: usize, n: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
