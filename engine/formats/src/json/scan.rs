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
//! bounded by [`lex::MAX_DEPTH`]; exactly one object and trailing whitespace are
//! accepted. Nothing is allocated per row once the scratch buffers have grown.
//!
//! Layout: [`lex`] reads JSON tokens (strings, numbers, literals, skipped
//! values, the bracketed-sequence loop, the word-at-a-time helpers);
//! [`row`] reads the top-level object into columns (fast paths, then the
//! general path); [`composite`] reads arrays, maps and tuples; [`field`]
//! finds one field's value for the shard router. This file
//! holds the entry point ([`read_row`]), what it reads against
//! ([`RowTarget`]) and why it stops ([`Stop`]).

mod composite;
mod field;
mod lex;
mod row;

use spate_core::pipeline::chain::RecordError;

use super::Node;
use super::fast::Fast;
use lex::{Scanner, all_ascii};
use spate_row::coerce::TimeRules;
use spate_row::spec::ColumnSpec;

// The serde reference reader (test-only) writes counts the same way.
#[cfg(test)]
pub(super) use composite::insert_leb128;
pub(crate) use field::{Found, NotFound, find_field, is_one_object};
pub(crate) use lex::unescape;

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
    pub empty_null: &'p [u8],
    pub base: usize,
    pub buf: &'b mut Vec<u8>,
    pub spans: &'b mut [(u32, u32)],
    /// Unescaped string values.
    pub text: &'b mut Vec<u8>,
    /// Unescaped keys.
    pub key: &'b mut Vec<u8>,
    /// The entries of the Maps being read, innermost last
    /// ([`spate_row::rowbinary::keep_last_map_entries`]).
    pub marks: &'b mut Vec<spate_row::rowbinary::MapEntryMark>,
    /// How many columns, from the first, arrived in column order with each
    /// value right after the previous one (the row then needs no reorder
    /// and no missing-value pass).
    pub in_order: usize,
    /// Where the last of those ends, relative to the row start; `u32::MAX`
    /// once a column is left unset (a null into a non-Nullable column), so
    /// the row takes the full pass.
    pub in_order_end: u32,
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
