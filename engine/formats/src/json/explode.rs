//! Fan-out for JSON (`mapping.explode: /events`): one record becomes one
//! row per element of the array at a JSON pointer, each row carrying the
//! record's fields and the element's, like ClickHouse's `ARRAY JOIN`.
//!
//! [`ExplodeDecoder`] finds the array in each message (or each NDJSON line)
//! and pushes one [`JsonElement`] per element down the chain: the record
//! borrows the payload (the message's bytes and the element's byte range),
//! nothing is copied. The chain's contract is unchanged: the encoder writes
//! exactly one row per record. An empty array pushes nothing: the message
//! yields no row, still commits (D1) and is counted as filtered
//! (`spate_records_filtered_total{reason="explode_empty"}`, D6). A record
//! without the field, or with something other than an array there, is a
//! decode error naming the pointer (the driver applies `on_error`).
//!
//! [`ExplodeEncoder`] maps a [`JsonElement`] to a row. **Which field feeds
//! which column:** a column whose `mapping.columns` pointer starts with the
//! explode pointer (`/events/name`) reads the element (at the rest of the
//! pointer); a column with another pointer (`/meta/host`) reads the record,
//! from its root. Any other column (its own name, a `rename`, a flatten
//! join) reads whichever of the two has the field; a field present in both
//! is a record error naming the column (point it at one side with
//! `mapping.columns`): JSON has no schema to decide this at plan time, so
//! the error is per record, never a silent pick. A field missing from both
//! follows the column's [`MissingValue`] as in the one-row mapper
//! (`mapping.defaults`, the table's DEFAULT, NULL, or a record error).
//!
//! Cost: the decoder walks the array once; the record's own columns are
//! scanned once per record (cached by the record's sequence number), with
//! the array elided (replaced by `[]` in a scratch copy of the record's
//! other bytes, unless a record column may read into it), and the
//! element's columns once per row; the row is then assembled in column
//! order from the two scans (one copy of each value). About 6,000
//! instructions per candidate row on the sensor workload, filter included
//! (`examples/sensor_json.rs`). The one-row mapper's fast path is not
//! involved.
//!
//! A live re-plan whose columns cannot be split (a new column reading the
//! element path a pointed one reads) leaves the thread on the old layout,
//! logged once ([`crate::json::live::LiveExplodeEncoder`]); the start-up plan
//! refuses the same split.

use std::collections::BTreeSet;

use spate_core::metrics::Counter;
use spate_core::pipeline::chain::{Decoder, Encoder, RecordCx, RecordError, Router, Stage};
use spate_core::pipeline::lines::LinesDecoder;
use spate_core::record::Payload;

use super::JsonRowEncoder;
use crate::json::route::ShardRouter;
use spate_row::spec::{ColumnSpec, MappingError, MappingOptions, MissingValue};

/// One element of an exploded record: what the encoder maps to one row.
#[derive(Clone, Copy, Debug)]
pub struct JsonElement<'a> {
    /// The whole record (the message, or its NDJSON line).
    pub record: &'a [u8],
    /// The element's JSON text, a slice of `record`.
    pub element: &'a [u8],
    /// The decoder's number for the record, the same for all its elements
    /// and different for the next record: the encoder's cache key.
    pub seq: u64,
    /// The element's index in the array (0-based), for error messages.
    pub index: u32,
    /// The whole array's byte range in `record` (`[` to after `]`), so the
    /// encoder can read the record's own fields without walking it again.
    pub array: (u32, u32),
}

/// Splits each record at the array `path` points to and pushes one
/// [`JsonElement`] per element.
#[derive(Debug)]
pub struct ExplodeDecoder {
    path: Vec<String>,
    pointer: String,
    ndjson: bool,
    seq: u64,
    empty: Counter,
    empties: u64,
    key: Vec<u8>,
    /// The current record's element spans (reused: no allocation per
    /// record once grown).
    spans: Vec<(u32, u32)>,
}

impl ExplodeDecoder {
    /// A decoder exploding the array at `path` (pointer segments) of each
    /// message, or of each line when `ndjson`. Registers its counter
    /// (`spate_records_filtered_total{reason="explode_empty"}`) once, here.
    pub fn new(path: Vec<String>, ndjson: bool) -> Self {
        let pointer = pointer_text(&path);
        Self {
            path,
            pointer,
            ndjson,
            seq: 0,
            empty: spate_core::metrics::records_filtered("explode_empty"),
            empties: 0,
            key: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Records whose array was empty, so far.
    pub fn empties(&self) -> u64 {
        self.empties
    }

    fn explode<'a, S>(
        &mut self,
        record: &'a [u8],
        cx: &RecordCx<'_>,
        next: &mut S,
    ) -> Result<(), RecordError>
    where
        S: Stage<JsonElement<'a>>,
    {
        self.seq += 1;
        let start = locate(record, &self.path, &mut self.key).map_err(|why| {
            RecordError::decode(format!("mapping.explode {}: {why}", self.pointer))
        })?;
        // Walk the array once (every element checked before any row is
        // written), then push the elements.
        self.spans.clear();
        let mut at = ws(record, start + 1);
        if record.get(at) != Some(&b']') {
            loop {
                let Some(e) = skip_value(record, at, 0) else {
                    return Err(RecordError::decode(format!(
                        "mapping.explode {}: element {} is not valid JSON",
                        self.pointer,
                        self.spans.len()
                    )));
                };
                self.spans.push((at as u32, e as u32));
                at = ws(record, e);
                match record.get(at) {
                    Some(b',') => at = ws(record, at + 1),
                    Some(b']') => break,
                    _ => {
                        return Err(RecordError::decode(format!(
                            "mapping.explode {}: the array is not valid JSON after element {}",
                            self.pointer,
                            self.spans.len() - 1
                        )));
                    }
                }
            }
        }
        let array = (start as u32, at as u32 + 1);
        if self.spans.is_empty() {
            // No element: nothing to write; the message still commits. Its
            // whole text must still be one JSON object.
            let mut sc = Json {
                s: record,
                key: &mut self.key,
            };
            if !sc.whole_object() {
                return Err(RecordError::decode("not one JSON object"));
            }
            self.empties += 1;
            self.empty.increment(1);
            return Ok(());
        }
        for (index, &(a, e)) in self.spans.iter().enumerate() {
            next.push(
                JsonElement {
                    record,
                    element: &record[a as usize..e as usize],
                    seq: self.seq,
                    index: index as u32,
                    array,
                },
                cx,
            )?;
        }
        Ok(())
    }
}

impl Decoder for ExplodeDecoder {
    type Record<'a> = JsonElement<'a>;

    fn decode<'a, S>(&mut self, cx: &RecordCx<'a>, next: &mut S) -> Result<(), RecordError>
    where
        S: Stage<JsonElement<'a>>,
    {
        if self.ndjson {
            return LinesDecoder.decode(
                cx,
                &mut Lines {
                    decoder: self,
                    next,
                },
            );
        }
        match cx.payload.value {
            Some(record) => self.explode(record, cx, next),
            None => Err(RecordError::decode("tombstone: the message has no value")),
        }
    }
}

/// Explodes each NDJSON line the lines decoder pushes.
struct Lines<'d, 'n, S> {
    decoder: &'d mut ExplodeDecoder,
    next: &'n mut S,
}

impl<'a, S: Stage<JsonElement<'a>>> Stage<Payload<'a>> for Lines<'_, '_, S> {
    fn push(&mut self, line: Payload<'a>, cx: &RecordCx<'_>) -> Result<(), RecordError> {
        let record = line.value.unwrap_or_default();
        let line_cx = RecordCx {
            payload: line,
            ack: cx.ack,
        };
        self.decoder.explode(record, &line_cx, self.next)
    }
}

fn pointer_text(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        s.push('/');
        s.push_str(&seg.replace('~', "~0").replace('/', "~1"));
    }
    s
}

// ---------------------------------------------------------------------------
// Finding the array: a structural JSON walk (no values decoded).
// ---------------------------------------------------------------------------

fn ws(s: &[u8], mut i: usize) -> usize {
    while matches!(s.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Nesting bound of the structural walk (as the mapper's).
const MAX_DEPTH: usize = 128;

/// The offset after the string starting at `i` (its opening quote), and
/// whether it holds an escape.
fn skip_string(s: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut j = i + 1;
    let mut escaped = false;
    loop {
        match *s.get(j)? {
            b'"' => return Some((j + 1, escaped)),
            b'\\' => {
                escaped = true;
                j += 2;
            }
            c if c < 0x20 => return None,
            _ => j += 1,
        }
    }
}

/// The offset after the JSON value starting at `i`.
fn skip_value(s: &[u8], i: usize, depth: usize) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    match *s.get(i)? {
        b'"' => skip_string(s, i).map(|(e, _)| e),
        b'{' | b'[' => {
            let close = if s[i] == b'{' { b'}' } else { b']' };
            let mut j = ws(s, i + 1);
            if s.get(j) == Some(&close) {
                return Some(j + 1);
            }
            loop {
                if close == b'}' {
                    if s.get(j) != Some(&b'"') {
                        return None;
                    }
                    j = ws(s, skip_string(s, j)?.0);
                    if s.get(j) != Some(&b':') {
                        return None;
                    }
                    j = ws(s, j + 1);
                }
                j = ws(s, skip_value(s, j, depth + 1)?);
                match *s.get(j)? {
                    b',' => j = ws(s, j + 1),
                    c if c == close => return Some(j + 1),
                    _ => return None,
                }
            }
        }
        b't' => s[i..].starts_with(b"true").then_some(i + 4),
        b'f' => s[i..].starts_with(b"false").then_some(i + 5),
        b'n' => s[i..].starts_with(b"null").then_some(i + 4),
        b'-' | b'0'..=b'9' => {
            let mut j = i + 1;
            while matches!(
                s.get(j),
                Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
            ) {
                j += 1;
            }
            Some(j)
        }
        _ => None,
    }
}

struct Json<'s, 'k> {
    s: &'s [u8],
    key: &'k mut Vec<u8>,
}

impl Json<'_, '_> {
    /// Whether the whole input is one object (whitespace around it).
    fn whole_object(&mut self) -> bool {
        let i = ws(self.s, 0);
        self.s.get(i) == Some(&b'{')
            && skip_value(self.s, i, 0).is_some_and(|e| ws(self.s, e) == self.s.len())
    }

    /// The value of key `name` in the object at `i`: its start, or why not.
    fn member(&mut self, i: usize, name: &str) -> Result<Option<usize>, &'static str> {
        let s = self.s;
        if s.get(i) != Some(&b'{') {
            return Err("not an object");
        }
        let mut j = ws(s, i + 1);
        if s.get(j) == Some(&b'}') {
            return Ok(None);
        }
        loop {
            if s.get(j) != Some(&b'"') {
                return Err("not valid JSON");
            }
            let (after, escaped) = skip_string(s, j).ok_or("not valid JSON")?;
            let raw = &s[j + 1..after - 1];
            let hit = if escaped {
                super::unescape(raw, self.key).map_err(|_| "not valid JSON")?;
                self.key.as_slice() == name.as_bytes()
            } else {
                raw == name.as_bytes()
            };
            j = ws(s, after);
            if s.get(j) != Some(&b':') {
                return Err("not valid JSON");
            }
            j = ws(s, j + 1);
            if hit {
                return Ok(Some(j));
            }
            j = ws(s, skip_value(s, j, 1).ok_or("not valid JSON")?);
            match s.get(j) {
                Some(b',') => j = ws(s, j + 1),
                Some(b'}') => return Ok(None),
                _ => return Err("not valid JSON"),
            }
        }
    }
}

/// The array at `path` in the object `record`: its `[` offset, or why not
/// (in words, for the decode error).
fn locate(record: &[u8], path: &[String], key: &mut Vec<u8>) -> Result<usize, String> {
    let mut json = Json { s: record, key };
    let mut at = ws(record, 0);
    if record.get(at) != Some(&b'{') {
        return Err("the record is not a JSON object".into());
    }
    for (depth, seg) in path.iter().enumerate() {
        match json.member(at, seg) {
            Ok(Some(v)) => at = v,
            Ok(None) => return Err("missing (the record has no such field)".into()),
            Err(why) if depth == 0 => return Err(format!("the record is {why}")),
            Err(why) => return Err(format!("a parent of the field is {why}")),
        }
    }
    let kind = match record.get(at) {
        Some(b'[') => None,
        Some(b'{') => Some("an object"),
        Some(b'"') => Some("a string"),
        Some(b'n') => Some("null"),
        Some(b't' | b'f') => Some("a bool"),
        Some(_) => Some("a number"),
        None => Some("nothing"),
    };
    if let Some(kind) = kind {
        return Err(format!("is {kind}, not an array"));
    }
    // The elements' own walk checks the array (a second full walk here
    // would cost ~1,600 instructions per row on the sensor workload).
    Ok(at)
}

// ---------------------------------------------------------------------------
// The encoder
// ---------------------------------------------------------------------------

/// Where a column's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// The element's sub-encoder column `e`, or the record's `r`, whichever
    /// has the field.
    Either { e: usize, r: usize },
    /// The element only (a pointer under the explode pointer).
    Element(usize),
    /// The record only (another pointer).
    Record(usize),
    /// Kafka metadata ([`ColumnSpec::meta`], written by
    /// [`super::encode_meta`] from the message); `usize` is the column in
    /// the record's sub-encoder, which holds its encoded DEFAULT.
    Meta(usize),
}

/// Maps [`JsonElement`]s to rows of the INSERT's columns (see the module
/// docs for which field feeds which column).
#[derive(Debug)]
pub struct ExplodeEncoder {
    columns: Vec<ColumnSpec>,
    sides: Vec<Side>,
    element: Option<JsonRowEncoder>,
    record: Option<JsonRowEncoder>,
    with_defaults: bool,
    pointer: String,
    /// The record scan of message `record_seq`: its bytes and cells.
    record_seq: Option<u64>,
    /// Whether the record's own columns are scanned with the exploded array
    /// replaced by `[]` (saves a walk over it per record): unless a record
    /// column may read into it (its name or path starts with the array's
    /// first segment, or a flatten join is set).
    elide: bool,
    record_text: Vec<u8>,
    record_row: Vec<u8>,
    record_cells: Vec<Option<(u32, u32)>>,
    element_row: Vec<u8>,
    element_cells: Vec<Option<(u32, u32)>>,
}

impl ExplodeEncoder {
    /// The encoder for `columns` (INSERT order) exploding at `path`;
    /// `pointed` names the columns given a `mapping.columns` pointer (they
    /// read one side only, see the module docs).
    ///
    /// # Errors
    /// [`MappingError`] as [`JsonRowEncoder::new`] (an empty column list, a
    /// bad DEFAULT literal, two columns reading one path).
    pub fn new(
        columns: Vec<ColumnSpec>,
        options: MappingOptions,
        path: &[String],
        pointed: &BTreeSet<String>,
    ) -> Result<Self, MappingError> {
        if columns.is_empty() {
            return Err(MappingError::NoColumns);
        }
        let (mut ecols, mut rcols) = (Vec::new(), Vec::new());
        let mut sides = Vec::with_capacity(columns.len());
        for c in &columns {
            if c.meta.is_some() {
                // In the record's encoder only for its type check and
                // DEFAULT; the scanner never fills it.
                rcols.push(c.clone());
                sides.push(Side::Meta(rcols.len() - 1));
                continue;
            }
            let explicit = pointed.contains(&c.name);
            let under = c
                .path
                .as_ref()
                .filter(|p| explicit && p.len() > path.len() && p.starts_with(path));
            let side = match under {
                Some(p) => {
                    ecols.push(ColumnSpec {
                        path: Some(p[path.len()..].to_vec()),
                        ..c.clone()
                    });
                    Side::Element(ecols.len() - 1)
                }
                None if explicit => {
                    rcols.push(c.clone());
                    Side::Record(rcols.len() - 1)
                }
                None => {
                    ecols.push(c.clone());
                    rcols.push(c.clone());
                    Side::Either {
                        e: ecols.len() - 1,
                        r: rcols.len() - 1,
                    }
                }
            };
            sides.push(side);
        }
        let build = |cols: Vec<ColumnSpec>| -> Result<Option<JsonRowEncoder>, MappingError> {
            if cols.is_empty() {
                Ok(None)
            } else {
                JsonRowEncoder::new(cols, options.clone()).map(Some)
            }
        };
        let element = build(ecols)?;
        let record = build(rcols)?;
        let with_defaults = columns
            .iter()
            .any(|c| c.missing == MissingValue::ServerDefault);
        let elide = options.flatten_join.is_none()
            && record.as_ref().is_none_or(|r| {
                r.columns().iter().all(|c| match &c.path {
                    Some(p) => p.first() != path.first(),
                    None => Some(&c.name) != path.first(),
                })
            });
        let n_e = element.as_ref().map_or(0, |e| e.columns().len());
        let n_r = record.as_ref().map_or(0, |e| e.columns().len());
        Ok(Self {
            columns,
            sides,
            element,
            record,
            with_defaults,
            pointer: pointer_text(path),
            record_seq: None,
            elide,
            record_text: Vec::new(),
            record_row: Vec::new(),
            record_cells: vec![None; n_r],
            element_row: Vec::new(),
            element_cells: vec![None; n_e],
        })
    }

    /// The INSERT's columns, in order.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Whether rows are `RowBinaryWithDefaults`.
    pub fn with_defaults(&self) -> bool {
        self.with_defaults
    }

    /// Appends the row of `el` to `buf`.
    ///
    /// # Errors
    /// [`RecordError`]: a record or element that is not a JSON object, a
    /// value that cannot map, a field in both the element and the record, a
    /// missing field without a fallback.
    pub fn encode_element(
        &mut self,
        el: &JsonElement<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.encode_element_in(el, None, buf)
    }

    /// [`ExplodeEncoder::encode_element`] with the message the element came
    /// from, for Kafka metadata columns (every row of a message gets the
    /// message's metadata; `None`: such a column is a record error).
    ///
    /// # Errors
    /// As [`ExplodeEncoder::encode_element`], and metadata that does not
    /// fit its column ([`super::encode_meta`]).
    pub fn encode_element_in(
        &mut self,
        el: &JsonElement<'_>,
        message: Option<&Payload<'_>>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        if self.record_seq != Some(el.seq) {
            self.scan_record(el)?;
        }
        self.scan_element(el)?;
        for (i, side) in self.sides.iter().enumerate() {
            let (cell, from_record, sub) = match *side {
                Side::Meta(r) => {
                    let c = &self.columns[i];
                    let source = c.meta.as_ref().expect("a Meta side reads metadata");
                    let Some(message) = message else {
                        return Err(RecordError::encode(
                            &c.name,
                            format!("reads Kafka metadata ({source}), and no message was given"),
                        ));
                    };
                    let at = buf.len();
                    if self.with_defaults {
                        buf.push(0);
                    }
                    if super::encode_meta(source, &c.name, &c.ty, message, buf)?
                        == super::MetaPut::Written
                    {
                        continue;
                    }
                    buf.truncate(at);
                    (None, true, r)
                }
                Side::Element(e) => (self.element_cells[e], false, e),
                Side::Record(r) => (self.record_cells[r], true, r),
                Side::Either { e, r } => match (self.element_cells[e], self.record_cells[r]) {
                    (Some(_), Some(_)) => {
                        return Err(RecordError::encode(
                            &self.columns[i].name,
                            format!(
                                "the field is in both the element ({}/{}) and the record; \
                                 point the column at one with mapping.columns",
                                self.pointer, el.index
                            ),
                        ));
                    }
                    (Some(c), None) => (Some(c), false, e),
                    (None, c) => (c, true, r),
                },
            };
            if let Some((s, end)) = cell {
                if self.with_defaults {
                    buf.push(0);
                }
                let row = if from_record {
                    &self.record_row
                } else {
                    &self.element_row
                };
                buf.extend_from_slice(&row[s as usize..end as usize]);
                continue;
            }
            self.put_missing(i, from_record, sub, el, buf)?;
        }
        Ok(())
    }

    /// Scans the element's record (its array elided when so planned) into the record cells, once per record.
    #[inline]
    fn scan_record(&mut self, el: &JsonElement<'_>) -> Result<(), RecordError> {
        self.record_seq = None;
        if let Some(r) = &mut self.record {
            let text = if self.elide {
                let (a, e) = (el.array.0 as usize, el.array.1 as usize);
                self.record_text.clear();
                self.record_text.extend_from_slice(&el.record[..a]);
                self.record_text.extend_from_slice(b"[]");
                self.record_text.extend_from_slice(&el.record[e..]);
                &self.record_text
            } else {
                el.record
            };
            let cells = r.scan_cells(text, &mut self.record_row)?;
            for (slot, c) in self.record_cells.iter_mut().zip(cells) {
                *slot = c;
            }
        }
        self.record_seq = Some(el.seq);
        Ok(())
    }

    /// Scans the element into the element cells (errors name the element's pointer).
    #[inline(always)]
    fn scan_element(&mut self, el: &JsonElement<'_>) -> Result<(), RecordError> {
        if let Some(e) = &mut self.element {
            let cells = e
                .scan_cells(el.element, &mut self.element_row)
                .map_err(|mut err| {
                    err.reason = format!("{}/{}: {}", self.pointer, el.index, err.reason);
                    err
                })?;
            for (slot, c) in self.element_cells.iter_mut().zip(cells) {
                *slot = c;
            }
        }
        Ok(())
    }

    /// Column `i`'s cell when neither side has it: its missing value, or the record error.
    #[inline(always)]
    fn put_missing(
        &self,
        i: usize,
        from_record: bool,
        sub: usize,
        el: &JsonElement<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let c = &self.columns[i];
        match &c.missing {
            MissingValue::ServerDefault => buf.push(1),
            MissingValue::Null => {
                if self.with_defaults {
                    buf.push(0);
                }
                buf.push(1);
            }
            MissingValue::Literal(_) => {
                let enc = if from_record {
                    &self.record
                } else {
                    &self.element
                };
                let bytes = enc
                    .as_ref()
                    .and_then(|e| e.default_bytes(sub))
                    .expect("a Literal column has its encoded DEFAULT");
                if self.with_defaults {
                    buf.push(0);
                }
                buf.extend_from_slice(bytes);
            }
            MissingValue::Reject => {
                return Err(RecordError::encode(
                    &c.name,
                    format!(
                        "missing or null in both the element ({}/{}) and the record, and \
                         the column is not Nullable and has no DEFAULT spate can apply",
                        self.pointer, el.index
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl<'a> Encoder<JsonElement<'a>> for ExplodeEncoder {
    #[inline]
    fn encode(
        &mut self,
        record: &JsonElement<'a>,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.encode_element_in(record, Some(&cx.payload), buf)
    }
}

/// A fan-out row goes where its shard key says: the key field is looked up
/// in the element first, then in the record (so a per-element key such as
/// a sensor id spreads one message's rows, a per-record key keeps them
/// together); `kafka_key` and round robin as for one-row records.
impl<'a> Router<JsonElement<'a>> for ShardRouter {
    fn route(&mut self, record: &JsonElement<'a>, cx: &RecordCx<'_>, shards: usize) -> usize {
        let value = self.key_source(record);
        self.shard_for(cx.payload.key, value, shards)
    }

    fn try_route(
        &mut self,
        record: &JsonElement<'a>,
        cx: &RecordCx<'_>,
        shards: usize,
    ) -> Result<usize, RecordError> {
        let value = self.key_source(record);
        self.try_shard_for(cx.payload.key, value, shards)
            .map_err(|e| self.record_error(&e))
    }
}

impl ShardRouter {
    /// The JSON the key field is read from: the element when it has the
    /// field, else the record.
    fn key_source<'a>(&mut self, record: &JsonElement<'a>) -> &'a [u8] {
        if self.has_field(record.element) {
            record.element
        } else {
            record.record
        }
    }
}

#[cfg(test)]
mod tests;
