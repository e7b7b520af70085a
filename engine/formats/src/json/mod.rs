//! JSON to RowBinary: one JSON object per message becomes one row of the
//! INSERT's columns, written straight into the shard's chunk buffer.
//!
//! **Which field feeds which column.** Each [`ColumnSpec`] names a JSON path:
//! by default the column's own name; a rename or a JSON pointer
//! ([`spate_row::spec::parse_pointer`]) gives another. With a flatten join (say `"_"`), nested
//! objects are read as if flattened: the column `properties_mag` also takes
//! `{"properties": {"mag": 2}}` (every way of splitting the name at the join
//! is a path). A column may also take a whole object or array as JSON text
//! (String columns) while nested columns read inside it.
//!
//! **Kafka metadata.** A column with [`ColumnSpec::meta`] takes the
//! message's topic, partition, offset, timestamp, key or headers instead
//! of a field ([`spate_row::meta`]); the scanner never meets it, and the finishing
//! pass writes it ([`JsonRowEncoder::encode_message`]), so a mapping
//! without such columns keeps its hot path.
//!
//! **Missing fields and nulls** ([`MissingValue`]): NULL for Nullable
//! columns; for a column with a DEFAULT (always in the INSERT, so a field
//! present in the record lands) the constant DEFAULT encoded here, or the
//! server's per-row DEFAULT through `RowBinaryWithDefaults`'s marker byte
//! where the server has that format ([`JsonRowEncoder::with_defaults`]);
//! otherwise a record error naming the column ([`spate_row::schema`] decides
//! which). A JSON `null` into a non-Nullable column counts as missing. With
//! [`MappingOptions::empty_as_null`] a `""` counts as missing too.
//!
//! **Coercions**: see [`spate_row::coerce`]. A value that cannot map is a
//! [`RecordError`] (kind Encode) naming the column and the reason; it is never
//! replaced by a type's default (D6). The lane driver adds topic, partition
//! and offset.
//!
//! **Performance.** The payload is read once by a JSON scanner (the `scan` module
//! docs say why not serde_json's visitor API, which stays the test
//! oracle): no `serde_json::Value` tree, no allocation per row once buffers
//! have grown. Object keys are matched against a small table that first tries
//! the key after the previous match (messages usually keep their field
//! order). Scalars are borrowed slices, so numbers keep every digit (Decimal,
//! DateTime64(9), Int256) and strings are copied once, into the row. Values
//! are encoded in the order the fields arrive, directly into the chunk
//! buffer; only when that order differs from the column order are the row's
//! bytes permuted (one copy through a scratch buffer). The key the field
//! order predicts is compared, with its quotes and the colon, in one
//! 16-byte load; compact fields in key order take a loop of their own
//! before the general one. Each column has a
//! fast path for its usual token (plain integers, strings, fixed-shape time
//! text, plain floats and decimals, bools, UUIDs, fixed strings, dotted
//! quads, null into a Nullable) that declines to the general coercions for
//! anything else (the `fast` module). spate-clickhouse's `tests/it/no_alloc.rs` counts allocations per row (zero).
//! Measure with `cargo run --release -p spate-formats --example throughput`
//! (`ID_COLUMN=1` with rows carrying `"id"` first, as `spate run` maps them).

pub mod explode;
mod fast;
pub mod live;
pub mod route;
mod scan;
mod tuple;
#[cfg(test)]
mod visit;

use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError};
use spate_core::record::Payload;
use spate_row::coerce::TimeRules;
use spate_row::meta::{MetaPut, encode_meta};
use spate_row::spec::{ColumnSpec, MappingError, MappingOptions, MissingValue, encode_literal};
use spate_row::types::ChType;

pub(crate) use scan::unescape;

/// [`JsonRowEncoder`]'s per-column flag: a `""` counts as missing.
pub(crate) const EMPTY_IS_MISSING: u8 = 1;
/// [`JsonRowEncoder`]'s per-column flag: a `null` counts as missing.
pub(crate) const NULL_IS_MISSING: u8 = 2;

/// A key table entry: the column a key feeds and/or the nested keys under it.
#[derive(Debug, Default)]
struct Slot {
    column: Option<usize>,
    child: Option<Box<Node>>,
}

/// A key as the scanner expects to meet it in the input, for a one-load
/// comparison: the key between its quotes, then the colon (`"id":`), when
/// the key is plain and those fit 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct KeyWord {
    /// `"`, the key, `"` and `:`, little-endian, zero-padded.
    head: u128,
    /// Ones over `head_len` bytes.
    mask: u128,
    /// The key's length plus 3; 0 when the key is not plain or is longer
    /// than 13 bytes (then compared as a slice).
    head_len: u8,
    /// Whether the key has no byte JSON must escape (`"`, `\\`, below
    /// 0x20), so that its raw input text equals the key itself.
    plain: bool,
}

impl KeyWord {
    fn of(key: &[u8]) -> KeyWord {
        let plain = key.iter().all(|&c| c >= 0x20 && c != b'"' && c != b'\\');
        let n = key.len() + 3;
        if !plain || n > 16 {
            return KeyWord {
                plain,
                ..KeyWord::default()
            };
        }
        let mut bytes = [0u8; 16];
        bytes[0] = b'"';
        bytes[1..=key.len()].copy_from_slice(key);
        bytes[key.len() + 1] = b'"';
        bytes[key.len() + 2] = b':';
        KeyWord {
            head: u128::from_le_bytes(bytes),
            mask: if n == 16 {
                u128::MAX
            } else {
                (1u128 << (8 * n)) - 1
            },
            head_len: n as u8,
            plain,
        }
    }
}

/// One key of a [`Node`].
#[derive(Debug)]
struct Entry {
    name: Box<str>,
    slot: Slot,
    /// [`KeyWord::of`] `name`.
    word: KeyWord,
    /// The slot's column when it has no nested columns and the key its
    /// one-load head: the scanner's in-order loop takes such keys
    /// ([`Node::seal`] sets it).
    direct: Option<usize>,
}

/// The keys of one JSON object level.
#[derive(Debug, Default)]
struct Node {
    keys: Vec<Entry>,
    /// A column read through this object (named in errors about its shape).
    any_column: usize,
}

/// What [`Node::expect`] found: the slot, the offset after the key's
/// closing quote or after the colon, and which of the two.
type Expected<'n> = (&'n Slot, usize, bool);

impl Node {
    fn insert(
        &mut self,
        path: &[String],
        column: usize,
        names: &[ColumnSpec],
    ) -> Result<(), MappingError> {
        let (first, rest) = path.split_first().expect("paths are non-empty");
        self.any_column = column;
        let i = match self.keys.iter().position(|e| *e.name == **first) {
            Some(i) => i,
            None => {
                self.keys.push(Entry {
                    name: first.as_str().into(),
                    slot: Slot::default(),
                    word: KeyWord::of(first.as_bytes()),
                    direct: None,
                });
                self.keys.len() - 1
            }
        };
        let slot = &mut self.keys[i].slot;
        if rest.is_empty() {
            if let Some(other) = slot.column
                && other != column
            {
                return Err(MappingError::DuplicatePath {
                    first: names[other].name.clone(),
                    second: names[column].name.clone(),
                    path: path.to_vec(),
                });
            }
            slot.column = Some(column);
            Ok(())
        } else {
            slot.child
                .get_or_insert_with(Box::default)
                .insert(rest, column, names)
        }
    }

    /// Sets every entry's `direct` column, here and below (once the tree
    /// is built).
    fn seal(&mut self) {
        for e in &mut self.keys {
            e.direct = match (&e.slot.column, &mut e.slot.child) {
                (Some(col), None) if e.word.head_len != 0 => Some(*col),
                (_, Some(child)) => {
                    child.seal();
                    None
                }
                _ => None,
            };
        }
    }

    /// The slot of entry `hint` when the input `s` at `at` (a key's opening
    /// quote) holds exactly that key, unescaped, between its quotes: the
    /// common case of fields in their usual order, decided without
    /// scanning the key. A key of at most 13 bytes is compared together
    /// with its quotes and a colon right after them (`"id":`) in one
    /// 16-byte load; on a match the offset returned is past the colon and
    /// the flag is true. A longer key is compared as a slice, and the
    /// offset is past its closing quote (flag false). Any other
    /// input (escapes, whitespace before the colon) is `None`: the caller
    /// scans the key.
    #[inline]
    fn expect(&self, hint: usize, s: &[u8], at: usize) -> Option<Expected<'_>> {
        let e = self.keys.get(hint)?;
        let w = &e.word;
        if w.head_len != 0 {
            if u128_or_tail(s, at) & w.mask != w.head {
                return None;
            }
            return Some((&e.slot, at + usize::from(w.head_len), true));
        }
        let name = e.name.as_bytes();
        let end = at + 1 + name.len();
        if !w.plain || s.get(at + 1..end) != Some(name) || s.get(end) != Some(&b'"') {
            return None;
        }
        Some((&e.slot, end + 1, false))
    }

    /// The slot for `key`, trying the entry after `*hint` first.
    #[inline]
    fn find(&self, key: &[u8], hint: &mut usize) -> Option<&Slot> {
        let n = self.keys.len();
        let start = if *hint < n { *hint } else { 0 };
        for k in 0..n {
            let i = if start + k < n {
                start + k
            } else {
                start + k - n
            };
            let e = &self.keys[i];
            if e.name.len() == key.len() && e.name.as_bytes() == key {
                *hint = i + 1;
                return Some(&e.slot);
            }
        }
        None
    }
}

/// The 16 bytes of `s` from `at` as a little-endian word; near the end,
/// the bytes left, zero-padded (a key head has no zero byte, so a pad never
/// matches one).
#[inline]
pub(super) fn u128_or_tail(s: &[u8], at: usize) -> u128 {
    if let Some(w) = s.get(at..at + 16) {
        return u128::from_le_bytes(w.try_into().expect("16 bytes"));
    }
    tail_u128(s, at)
}

#[cold]
fn tail_u128(s: &[u8], at: usize) -> u128 {
    let mut v = 0u128;
    for (k, &b) in s.get(at..).unwrap_or_default().iter().enumerate() {
        v |= u128::from(b) << (8 * k);
    }
    v
}

/// The JSON-to-RowBinary encoder for one table's INSERT columns.
///
/// Implements the chain's `Encoder<Payload>`: each call appends exactly one
/// row or returns a [`RecordError`] (the chain truncates a failed row).
#[derive(Debug)]
pub struct JsonRowEncoder {
    columns: Vec<ColumnSpec>,
    /// Encoded DEFAULT literal per column (empty when none).
    defaults: Vec<Option<Vec<u8>>>,
    /// Each column's scanner fast path.
    fast: Vec<fast::Fast>,
    /// Each Array column's element fast path (General for other columns;
    /// the scanner takes only its String case, see `Scanner::fast_element`).
    elem_fast: Vec<fast::Fast>,
    root: Node,
    rules: TimeRules,
    /// Each column's time rules: `rules` with the column's epoch unit.
    col_rules: Vec<TimeRules>,
    /// Each column's tokens that count as missing: [`EMPTY_IS_MISSING`]
    /// (its resolved `empty_as_null`, set only where it changes something:
    /// Nullable, or a DEFAULT spate applies) and [`NULL_IS_MISSING`]
    /// (`null_as_missing` on a Nullable column with a literal).
    empty_null: Vec<u8>,
    /// Rows are written as `RowBinaryWithDefaults` (a marker byte before
    /// every cell): some column has [`MissingValue::ServerDefault`].
    with_defaults: bool,
    /// The in-order count at which a row is complete as scanned: the
    /// column count, or `usize::MAX` with defaults (every row then takes
    /// the finishing pass that adds the markers), so the hot path's test
    /// is the same compare either way.
    complete_at: usize,
    /// When the metadata columns are the last ones (and rows are plain
    /// RowBinary): the index of the first, so a row whose record columns
    /// arrived in order gets them appended without the finishing pass;
    /// `usize::MAX` otherwise.
    meta_tail: usize,
    /// Where each column's bytes start and end in the row, relative to the
    /// row start; `UNSET` when the field has not been seen.
    spans: Vec<(u32, u32)>,
    /// Unescaped string values and keys, and the permutation buffer.
    text: Vec<u8>,
    key: Vec<u8>,
    reorder: Vec<u8>,
    /// The entries of the Map cells being read (a repeated key's last
    /// value wins).
    marks: Vec<spate_row::rowbinary::MapEntryMark>,
}

const UNSET: (u32, u32) = (u32::MAX, u32::MAX);
/// A span standing for "the server's DEFAULT" (marker `0x01`, no bytes).
const SERVER_DEFAULT: (u32, u32) = (u32::MAX - 1, u32::MAX - 1);

impl JsonRowEncoder {
    /// Builds the encoder for `columns` (in INSERT order).
    ///
    /// # Errors
    /// [`MappingError`] for an empty column list, a bad DEFAULT literal, or
    /// two columns reading one path.
    pub fn new(columns: Vec<ColumnSpec>, options: MappingOptions) -> Result<Self, MappingError> {
        if columns.is_empty() {
            return Err(MappingError::NoColumns);
        }
        let mut root = Node::default();
        for (i, c) in columns.iter().enumerate() {
            if let Some(source) = &c.meta {
                source
                    .check_type(&c.ty)
                    .map_err(|reason| MappingError::MetaType {
                        column: c.name.clone(),
                        reason,
                    })?;
                continue;
            }
            for p in c.source_paths(options.flatten_join.as_deref()) {
                root.insert(&p, i, &columns)?;
            }
        }
        root.seal();
        let mut defaults = Vec::with_capacity(columns.len());
        for c in &columns {
            defaults.push(match &c.missing {
                MissingValue::Literal(lit) => Some(encode_literal(c, lit, &options.time)?),
                _ => None,
            });
        }
        let n = columns.len();
        let col_rules: Vec<TimeRules> = columns
            .iter()
            .map(|c| TimeRules {
                epoch_unit: c.options.epoch_unit.unwrap_or(options.time.epoch_unit),
                ..options.time.clone()
            })
            .collect();
        let empty_null: Vec<u8> = columns
            .iter()
            .map(|c| {
                let empty = c.options.empty_as_null.unwrap_or(options.empty_as_null)
                    && (c.ty.is_nullable()
                        || matches!(
                            c.missing,
                            MissingValue::Literal(_) | MissingValue::ServerDefault
                        ));
                let null = c.options.null_as_missing
                    && c.ty.is_nullable()
                    && matches!(c.missing, MissingValue::Literal(_));
                (u8::from(empty) * EMPTY_IS_MISSING) | (u8::from(null) * NULL_IS_MISSING)
            })
            .collect();
        let with_defaults = columns
            .iter()
            .any(|c| c.missing == MissingValue::ServerDefault);
        // Metadata columns are never met by the scanner: their rows always
        // take the finishing pass, which writes them (a no-metadata
        // mapping's hot path is untouched).
        let has_meta = columns.iter().any(|c| c.meta.is_some());
        let first_meta = columns.iter().position(|c| c.meta.is_some()).unwrap_or(n);
        let meta_tail =
            if has_meta && !with_defaults && columns[first_meta..].iter().all(|c| c.meta.is_some())
            {
                first_meta
            } else {
                usize::MAX
            };
        // A column whose `""` means missing takes the general path, which
        // alone checks for it (no cost for the other columns).
        let fast = columns
            .iter()
            .zip(&empty_null)
            .map(|(c, &empty)| {
                if empty != 0 {
                    fast::Fast::General
                } else {
                    fast::Fast::for_type(&c.ty, &options.time)
                }
            })
            .collect();
        let elem_fast = columns
            .iter()
            .map(|c| match c.ty.without_low_cardinality() {
                ChType::Array(elem) => fast::Fast::for_type(elem, &options.time),
                ChType::Nullable(inner) => match inner.without_low_cardinality() {
                    ChType::Array(elem) => fast::Fast::for_type(elem, &options.time),
                    _ => fast::Fast::General,
                },
                _ => fast::Fast::General,
            })
            .collect();
        Ok(Self {
            columns,
            defaults,
            fast,
            elem_fast,
            root,
            rules: options.time,
            col_rules,
            empty_null,
            with_defaults,
            complete_at: if with_defaults || has_meta {
                usize::MAX
            } else {
                n
            },
            meta_tail,
            spans: vec![UNSET; n],
            text: Vec::new(),
            key: Vec::new(),
            reorder: Vec::new(),
            marks: Vec::new(),
        })
    }

    /// The INSERT's columns, in order.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Whether rows are written as `RowBinaryWithDefaults` (a marker byte
    /// before each cell, `0x01` for the server's DEFAULT, `0x00` before a
    /// value) rather than plain RowBinary: true when some column has
    /// [`MissingValue::ServerDefault`]. The INSERT must name the same
    /// format ([`spate_row::schema::row_format`]).
    pub fn with_defaults(&self) -> bool {
        self.with_defaults
    }

    /// Appends the row for one JSON object (`json`) to `buf`.
    ///
    /// # Errors
    /// [`RecordError`]: Decode for bytes that are not one JSON object, Encode
    /// naming the column for a value that cannot map or a missing field.
    /// `buf` may then hold part of the row; truncate it to its length before
    /// the call.
    #[inline]
    pub fn encode_json(&mut self, json: &[u8], buf: &mut Vec<u8>) -> Result<(), RecordError> {
        self.encode_row(json, None, buf)
    }

    /// Appends the row for `message`'s value (one JSON object), its
    /// metadata columns ([`ColumnSpec::meta`]) read from `message`.
    ///
    /// # Errors
    /// As [`JsonRowEncoder::encode_json`], and Decode for a tombstone;
    /// Encode naming the column for metadata that does not fit it
    /// ([`encode_meta`]).
    #[inline]
    pub fn encode_message(
        &mut self,
        message: &Payload<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        match message.value {
            Some(json) => self.encode_row(json, Some(message), buf),
            None => Err(RecordError::decode("tombstone: the message has no value")),
        }
    }

    /// Both entry points' one body (so the scanner is inlined once): the
    /// row for `json`, metadata columns read from `message` (`None`: a
    /// metadata column is a record error).
    fn encode_row(
        &mut self,
        json: &[u8],
        message: Option<&Payload<'_>>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let base = buf.len();
        self.spans.fill(UNSET);
        let mut target = scan::RowTarget {
            root: &self.root,
            columns: &self.columns,
            fast: &self.fast,
            elem_fast: &self.elem_fast,
            rules: &self.rules,
            col_rules: &self.col_rules,
            empty_null: &self.empty_null,
            base,
            buf,
            spans: &mut self.spans,
            text: &mut self.text,
            key: &mut self.key,
            marks: &mut self.marks,
            in_order: 0,
            in_order_end: 0,
        };
        scan::read_row(json, &mut target)?;
        let (in_order, in_order_end) = (target.in_order, target.in_order_end);
        // Every column arrived, in column order, back to back, and nothing
        // else was written: the row is complete as it stands.
        if in_order == self.complete_at && in_order_end as usize == buf.len() - base {
            debug_assert!(
                self.spans.iter().all(|&s| s != UNSET),
                "an in-order row sets every span"
            );
            return Ok(());
        }
        // The record's columns all arrived in order and the metadata
        // columns come last: append them.
        if let Some(message) = message
            && in_order == self.meta_tail
            && in_order_end as usize == buf.len() - base
        {
            return self.put_meta_tail(base, message, buf);
        }
        self.finish_row(base, message, buf)
    }

    /// Scans one JSON object into `buf` (cleared first) without finishing
    /// the row: each column's value bytes (raw RowBinary, no
    /// RowBinaryWithDefaults marker) at its span, [`None`] for a column
    /// whose field is missing (or null into a non-Nullable column). The
    /// fan-out encoder merges two such scans (explode).
    pub(crate) fn scan_cells(
        &mut self,
        json: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<impl Iterator<Item = Option<(u32, u32)>> + '_, RecordError> {
        buf.clear();
        self.spans.fill(UNSET);
        let mut target = scan::RowTarget {
            root: &self.root,
            columns: &self.columns,
            fast: &self.fast,
            elem_fast: &self.elem_fast,
            rules: &self.rules,
            col_rules: &self.col_rules,
            empty_null: &self.empty_null,
            base: 0,
            buf,
            spans: &mut self.spans,
            text: &mut self.text,
            key: &mut self.key,
            marks: &mut self.marks,
            in_order: 0,
            in_order_end: 0,
        };
        scan::read_row(json, &mut target)?;
        Ok(self.spans.iter().map(|&s| (s != UNSET).then_some(s)))
    }

    /// Column `i`'s DEFAULT literal as encoded bytes, when it has one
    /// ([`MissingValue::Literal`]).
    pub(crate) fn default_bytes(&self, i: usize) -> Option<&[u8]> {
        self.defaults[i].as_deref()
    }

    /// Appends the trailing metadata columns ([`JsonRowEncoder::meta_tail`]
    /// onwards) to a row whose record columns are complete and in order; a
    /// source without a value sends the row through the finishing pass,
    /// which applies the column's missing-value rule.
    fn put_meta_tail(
        &mut self,
        base: usize,
        message: &Payload<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let tail = buf.len();
        for c in &self.columns[self.meta_tail..] {
            let source = c.meta.as_ref().expect("meta_tail columns read metadata");
            if encode_meta(source, &c.name, &c.ty, message, buf)? == MetaPut::Absent {
                buf.truncate(tail);
                return self.finish_row(base, Some(message), buf);
            }
        }
        Ok(())
    }

    /// Writes the metadata columns, fills missing columns and puts the
    /// row's values into column order.
    fn finish_row(
        &mut self,
        base: usize,
        message: Option<&Payload<'_>>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let mut in_order = true;
        let mut expect = 0u32;
        for (i, span) in self.spans.iter_mut().enumerate() {
            if *span == UNSET {
                let start = (buf.len() - base) as u32;
                let c = &self.columns[i];
                if let Some(source) = &c.meta {
                    let Some(message) = message else {
                        return Err(RecordError::encode(
                            &c.name,
                            format!("reads Kafka metadata ({source}), and no message was given"),
                        ));
                    };
                    if encode_meta(source, &c.name, &c.ty, message, buf)? == MetaPut::Written {
                        *span = (start, (buf.len() - base) as u32);
                        in_order &= span.0 == expect;
                        expect = span.1;
                        continue;
                    }
                }
                match (&c.missing, &self.defaults[i]) {
                    (MissingValue::Null, _) => buf.push(1),
                    (MissingValue::Literal(_), Some(bytes)) => buf.extend_from_slice(bytes),
                    (MissingValue::ServerDefault, _) => {
                        *span = SERVER_DEFAULT;
                        in_order = false;
                        continue;
                    }
                    _ => {
                        return Err(RecordError::encode(
                            &c.name,
                            if c.ty.is_nullable() {
                                "missing, and the column's DEFAULT is computed per row, \
                                 which this server cannot do for an INSERT that names the \
                                 column (no RowBinaryWithDefaults)"
                            } else {
                                "missing or null, and the column is not Nullable and has no \
                                 DEFAULT spate can apply (none, or one computed per row on a \
                                 server without RowBinaryWithDefaults)"
                            },
                        ));
                    }
                }
                *span = (start, (buf.len() - base) as u32);
            }
            in_order &= span.0 == expect;
            expect = span.1;
        }
        let row_len = buf.len() - base;
        if in_order && expect as usize == row_len && !self.with_defaults {
            return Ok(());
        }
        // Fields arrived out of column order (or a duplicate key left dead
        // bytes): permute through the scratch buffer.
        self.reorder.clear();
        self.reorder.extend_from_slice(&buf[base..]);
        buf.truncate(base);
        if self.with_defaults {
            for &(s, e) in &self.spans {
                if (s, e) == SERVER_DEFAULT {
                    buf.push(1);
                } else {
                    buf.push(0);
                    buf.extend_from_slice(&self.reorder[s as usize..e as usize]);
                }
            }
            return Ok(());
        }
        for &(s, e) in &self.spans {
            buf.extend_from_slice(&self.reorder[s as usize..e as usize]);
        }
        Ok(())
    }
}

impl JsonRowEncoder {
    /// The reference reader: the same mapping through serde_json's visitor
    /// API. Tests check the scanner against it.
    #[cfg(test)]
    fn encode_json_serde(&mut self, json: &[u8], buf: &mut Vec<u8>) -> Result<(), RecordError> {
        let base = buf.len();
        self.spans.fill(UNSET);
        visit::read_row(
            json,
            &visit::Row {
                root: &self.root,
                columns: &self.columns,
                rules: &self.col_rules,
                empty_null: &self.empty_null,
            },
            &mut visit::RowOut {
                base,
                buf,
                spans: &mut self.spans,
                text: &mut self.text,
                marks: &mut self.marks,
            },
        )?;
        self.finish_row(base, None, buf)
    }
}

impl<'a> Encoder<Payload<'a>> for JsonRowEncoder {
    fn encode(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.encode_message(record, buf)
    }
}

#[cfg(test)]
mod tests;

impl spate_row::filter::RowColumns for JsonRowEncoder {
    fn row_columns(&self) -> &[ColumnSpec] {
        self.columns()
    }

    fn row_format(&self) -> spate_row::schema::RowFormat {
        spate_row::schema::RowFormat::of(self.with_defaults())
    }
}
