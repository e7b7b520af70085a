//! The reference reader (tests only): the mapping through serde_json's
//! streaming visitor API. The production reader is [`super::scan`]; a
//! proptest checks that both write the same bytes and refuse the same
//! malformed input. Differences by design: this reader writes floats into
//! String columns in shortest round-trip form and arrays/objects as compact
//! re-serialised JSON, where the scanner keeps the text as written.
//!
//! Objects are walked with `MapAccess`, keys matched against the key table
//! (`Node`); scalars are taken as `&RawValue` (raw text, no float parse) and
//! handed to [`super::coerce::put_scalar`]; arrays, maps and tuples are walked
//! with `SeqAccess`/`MapAccess` so every element goes through the same path
//! (Nullable elements get their own null byte). A refused value stores its
//! [`RecordError`] in the context and aborts the parse with a placeholder
//! serde error, which [`read_row`] swaps back.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use spate_core::pipeline::chain::RecordError;

use super::scan::{insert_leb128, unescape};
use super::{Node, Slot, UNSET};
use spate_row::coerce::{Put, TimeRules, Tok, put_integer, put_scalar};
use spate_row::spec::ColumnSpec;
use spate_row::types::ChType;

/// What the row is read against.
pub(super) struct Row<'p> {
    pub root: &'p Node,
    pub columns: &'p [ColumnSpec],
    /// Each column's time rules.
    pub rules: &'p [TimeRules],
    /// Each column's resolved `empty_as_null`.
    pub empty_null: &'p [u8],
}

/// Where the row goes.
pub(super) struct RowOut<'b> {
    pub base: usize,
    pub buf: &'b mut Vec<u8>,
    pub spans: &'b mut [(u32, u32)],
    pub text: &'b mut Vec<u8>,
    /// The entries of the Maps being read, innermost last.
    pub marks: &'b mut Vec<spate_row::rowbinary::MapEntryMark>,
}

struct Ctx<'c, 'p, 'b> {
    row: &'c Row<'p>,
    out: &'c mut RowOut<'b>,
    error: Option<RecordError>,
}

impl Ctx<'_, '_, '_> {
    fn fail<E: de::Error>(&mut self, col: usize, reason: impl Into<String>) -> E {
        self.error = Some(RecordError::encode(&self.row.columns[col].name, reason));
        E::custom("refused")
    }

    fn fail_decode<E: de::Error>(&mut self, reason: impl Into<String>) -> E {
        self.error = Some(RecordError::decode(reason));
        E::custom("refused")
    }
}

/// Reads one JSON object from `json` into `out` against `row`.
pub(super) fn read_row(
    json: &[u8],
    row: &Row<'_>,
    out: &mut RowOut<'_>,
) -> Result<(), RecordError> {
    let mut ctx = Ctx {
        row,
        out,
        error: None,
    };
    // Validate UTF-8 once for the whole message (RFC 8259 JSON is UTF-8), so
    // the parser need not check every string again.
    let json = std::str::from_utf8(json)
        .map_err(|e| RecordError::decode(format!("not one JSON object: not UTF-8 ({e})")))?;
    let mut de = serde_json::Deserializer::from_str(json);
    let res = ObjectSeed {
        node: row.root,
        ctx: &mut ctx,
        top: true,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match res {
        Ok(()) => Ok(()),
        Err(e) => Err(ctx
            .error
            .take()
            .unwrap_or_else(|| RecordError::decode(format!("not one JSON object: {e}")))),
    }
}

struct ObjectSeed<'x, 'c, 'p, 'b> {
    node: &'p Node,
    ctx: &'x mut Ctx<'c, 'p, 'b>,
    top: bool,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, '_, '_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, '_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        if self.top {
            Err(self
                .ctx
                .fail_decode("the message is JSON null, not an object"))
        } else {
            // A null nested object: every field under it is missing.
            Ok(())
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut hint = 0usize;
        let node = self.node;
        let ctx = self.ctx;
        while let Some(slot) = map.next_key_seed(KeySeed {
            node,
            hint: &mut hint,
        })? {
            match slot {
                None
                | Some(Slot {
                    column: None,
                    child: None,
                }) => {
                    map.next_value::<IgnoredAny>()?;
                }
                Some(Slot {
                    column: Some(col),
                    child: None,
                }) => map.next_value_seed(ColumnSeed {
                    col: *col,
                    ctx: &mut *ctx,
                })?,
                Some(Slot {
                    column: None,
                    child: Some(child),
                }) => map.next_value_seed(ObjectSeed {
                    node: child,
                    ctx: &mut *ctx,
                    top: false,
                })?,
                Some(Slot {
                    column: Some(col),
                    child: Some(child),
                }) => {
                    // The field feeds a column and nested columns: take its
                    // text once and read it twice.
                    let raw: &'de RawValue = map.next_value()?;
                    let text = raw.get();
                    let mut de = serde_json::Deserializer::from_str(text);
                    ColumnSeed {
                        col: *col,
                        ctx: &mut *ctx,
                    }
                    .deserialize(&mut de)
                    .map_err(de::Error::custom)?;
                    if text.starts_with('{') {
                        let mut de = serde_json::Deserializer::from_str(text);
                        ObjectSeed {
                            node: child,
                            ctx: &mut *ctx,
                            top: false,
                        }
                        .deserialize(&mut de)
                        .map_err(de::Error::custom)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<(), A::Error> {
        Err(self.wrong("an array"))
    }

    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<(), E> {
        Err(self.wrong("a bool"))
    }

    fn visit_i64<E: de::Error>(self, _v: i64) -> Result<(), E> {
        Err(self.wrong("a number"))
    }

    fn visit_u64<E: de::Error>(self, _v: u64) -> Result<(), E> {
        Err(self.wrong("a number"))
    }

    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<(), E> {
        Err(self.wrong("a number"))
    }

    fn visit_str<E: de::Error>(self, _v: &str) -> Result<(), E> {
        Err(self.wrong("a string"))
    }
}

impl ObjectSeed<'_, '_, '_, '_> {
    /// A non-object where an object was expected: a decode error for the
    /// message itself, else an error naming a column read through it.
    fn wrong<E: de::Error>(self, found: &str) -> E {
        if self.top {
            self.ctx
                .fail_decode(format!("expected a JSON object, found {found}"))
        } else {
            self.ctx.fail(
                self.node.any_column,
                format!("expected a JSON object on the path to this column, found {found}"),
            )
        }
    }
}

struct KeySeed<'p, 'h> {
    node: &'p Node,
    hint: &'h mut usize,
}

impl<'de, 'p> DeserializeSeed<'de> for KeySeed<'p, '_> {
    type Value = Option<&'p Slot>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de, 'p> Visitor<'de> for KeySeed<'p, '_> {
    type Value = Option<&'p Slot>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    #[inline]
    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.node.find(key.as_bytes(), self.hint))
    }
}

/// One column's value: written, then its span recorded (or left unset for
/// null into a non-Nullable column, so the missing-value rule applies).
struct ColumnSeed<'x, 'c, 'p, 'b> {
    col: usize,
    ctx: &'x mut Ctx<'c, 'p, 'b>,
}

impl<'de> DeserializeSeed<'de> for ColumnSeed<'_, '_, '_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        let col = self.col;
        let ctx = self.ctx;
        let start = ctx.out.buf.len();
        let ty = &ctx.row.columns[col].ty;
        let flags = ctx.row.empty_null[col];
        let written = if flags != 0 {
            // `""` counts as null (or missing); a null as missing; anything
            // else is read again from its text.
            let raw: &RawValue = de::Deserialize::deserialize(de)?;
            let null = flags & super::NULL_IS_MISSING != 0;
            if null
                && (raw.get() == "null"
                    || raw.get() == "\"\"" && flags & super::EMPTY_IS_MISSING != 0)
            {
                false
            } else if flags & super::EMPTY_IS_MISSING != 0 && raw.get() == "\"\"" {
                match put_scalar(ty, Tok::Null, &ctx.row.rules[col], ctx.out.buf) {
                    Ok(Put::Written) => true,
                    Ok(Put::NullForNonNullable) => false,
                    Err(reason) => return Err(ctx.fail(col, reason)),
                }
            } else {
                let mut inner = serde_json::Deserializer::from_str(raw.get());
                put_value(ty, col, &mut inner, ctx).map_err(<D::Error as de::Error>::custom)?
            }
        } else {
            put_value(ty, col, de, ctx)?
        };
        let base = ctx.out.base;
        if written {
            ctx.out.spans[col] = ((start - base) as u32, (ctx.out.buf.len() - base) as u32);
        } else {
            ctx.out.buf.truncate(start);
            ctx.out.spans[col] = UNSET;
        }
        Ok(())
    }
}

/// Writes one value of `ty`; `Ok(false)` for null into a non-Nullable type
/// (nothing written).
fn put_value<'de, D: Deserializer<'de>>(
    ty: &ChType,
    col: usize,
    de: D,
    ctx: &mut Ctx<'_, '_, '_>,
) -> Result<bool, D::Error> {
    let (inner, nullable) = match ty.without_low_cardinality() {
        ChType::Nullable(inner) => (inner.without_low_cardinality(), true),
        other => (other, false),
    };
    if matches!(inner, ChType::Array(_) | ChType::Map(..) | ChType::Tuple(_)) {
        return de.deserialize_any(Composite {
            ty: inner,
            nullable,
            col,
            ctx,
        });
    }
    if !needs_exact_text(inner) {
        return de.deserialize_any(Scalar { ty, col, ctx });
    }
    let raw: &'de RawValue = de::Deserialize::deserialize(de)?;
    let res = {
        let RowOut { buf, text, .. } = &mut *ctx.out;
        match classify(raw.get().as_bytes(), text) {
            Ok(tok) => put_scalar(ty, tok, &ctx.row.rules[col], buf),
            Err(reason) => Err(reason),
        }
    };
    match res {
        Ok(Put::Written) => Ok(true),
        Ok(Put::NullForNonNullable) => Ok(false),
        Err(reason) => Err(ctx.fail(col, reason)),
    }
}

/// Types whose values must be read from the number's exact text (serde's
/// `f64` would round): floats (serde_json's default float parser is not
/// always correctly rounded; Rust's is), Decimals, DateTime64 (fractional
/// epochs to the nanosecond) and integers wider than 64 bits. Every other
/// scalar goes through the cheaper typed visitor ([`Scalar`]).
fn needs_exact_text(ty: &ChType) -> bool {
    matches!(
        ty,
        ChType::Float32
            | ChType::Float64
            | ChType::Decimal { .. }
            | ChType::DateTime64 { .. }
            | ChType::Int128
            | ChType::Int256
            | ChType::UInt128
            | ChType::UInt256
    )
}

/// A number rendered on the stack (no allocation): the longest `f64`
/// `Display` output is about 330 bytes.
struct NumText {
    buf: [u8; 400],
    len: usize,
}

impl NumText {
    fn new() -> Self {
        Self {
            buf: [0; 400],
            len: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl fmt::Write for NumText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Scalars read through serde's typed callbacks: strings borrowed, integers
/// as `i64`/`u64` (exact), other numbers as `f64` (only for types where the
/// `f64` is exact enough: see [`needs_exact_text`]).
struct Scalar<'t, 'x, 'c, 'p, 'b> {
    ty: &'t ChType,
    col: usize,
    ctx: &'x mut Ctx<'c, 'p, 'b>,
}

impl Scalar<'_, '_, '_, '_, '_> {
    fn put<E: de::Error>(self, tok: Tok<'_>) -> Result<bool, E> {
        match put_scalar(
            self.ty,
            tok,
            &self.ctx.row.rules[self.col],
            self.ctx.out.buf,
        ) {
            Ok(Put::Written) => Ok(true),
            Ok(Put::NullForNonNullable) => Ok(false),
            Err(reason) => Err(self.ctx.fail(self.col, reason)),
        }
    }

    #[inline]
    fn put_int<E: de::Error>(self, v: i128) -> Result<bool, E> {
        match put_integer(self.ty, v, self.ctx.out.buf) {
            Some(Ok(())) => Ok(true),
            Some(Err(reason)) => Err(self.ctx.fail(self.col, reason)),
            None => self.put_number(v),
        }
    }

    fn put_number<E: de::Error>(self, v: impl fmt::Display) -> Result<bool, E> {
        let mut t = NumText::new();
        if fmt::Write::write_fmt(&mut t, format_args!("{v}")).is_err() {
            return Err(self.ctx.fail(self.col, "number too long"));
        }
        self.put(Tok::Number(t.bytes()))
    }

    /// An array or object: only String (and JSON) columns take it, as
    /// compact JSON text (re-serialised, so object keys come out sorted).
    fn put_composite<E: de::Error>(self, v: serde_json::Value) -> Result<bool, E> {
        if !matches!(base_type(self.ty), ChType::String | ChType::Json(_)) {
            let ty = self.ty;
            return Err(self
                .ctx
                .fail(self.col, format!("cannot put an array or object into {ty}")));
        }
        let text = serde_json::to_vec(&v).map_err(E::custom)?;
        self.put(Tok::Composite(&text))
    }
}

/// `ty` without LowCardinality and Nullable wrappers.
fn base_type(ty: &ChType) -> &ChType {
    match ty {
        ChType::LowCardinality(inner) | ChType::Nullable(inner) => base_type(inner),
        other => other,
    }
}

impl<'de> Visitor<'de> for Scalar<'_, '_, '_, '_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON value for {}", self.ty)
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        self.put(Tok::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        self.put(Tok::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        self.put_int(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        self.put_int(i128::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        // Integer columns: a float literal (`5.0`, `1e3`) is exact only below
        // 2^53; above that the text's digits are already lost.
        const EXACT: f64 = 9_007_199_254_740_992.0;
        if spate_row::rowbinary::int_shape(base_type(self.ty)).is_some()
            && (EXACT..18_446_744_073_709_551_616.0).contains(&v.abs())
        {
            let ty = self.ty;
            return Err(self.ctx.fail(
                self.col,
                format!("{v} is a float literal too large to read exactly into {ty}; write it as an integer"),
            ));
        }
        self.put_number(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        self.put(Tok::Str(v.as_bytes()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        let v = de::Deserialize::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
        self.put_composite(v)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        let v = de::Deserialize::deserialize(de::value::MapAccessDeserializer::new(map))?;
        self.put_composite(v)
    }
}

/// Classifies raw JSON text; unescapes strings that need it into `text`.
fn classify<'r>(raw: &'r [u8], text: &'r mut Vec<u8>) -> Result<Tok<'r>, String> {
    Ok(match raw.first() {
        Some(b'"') => {
            let body = &raw[1..raw.len() - 1];
            if body.contains(&b'\\') {
                unescape(body, text).map_err(str::to_owned)?;
                Tok::Str(text.as_slice())
            } else {
                Tok::Str(body)
            }
        }
        Some(b't') => Tok::Bool(true),
        Some(b'f') => Tok::Bool(false),
        Some(b'n') => Tok::Null,
        Some(b'[' | b'{') => Tok::Composite(raw),
        Some(_) => Tok::Number(raw),
        None => return Err("empty value".into()),
    })
}

/// One element of an Array, a Map value or a Tuple element: like a column
/// value, but null into a non-Nullable type is an error.
struct ElemSeed<'t, 'x, 'c, 'p, 'b> {
    ty: &'t ChType,
    col: usize,
    ctx: &'x mut Ctx<'c, 'p, 'b>,
}

impl<'de> DeserializeSeed<'de> for ElemSeed<'_, '_, '_, '_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        if put_value(self.ty, self.col, de, self.ctx)? {
            Ok(())
        } else {
            Err(self.ctx.fail(
                self.col,
                format!(
                    "null element, and the element type {} is not Nullable",
                    self.ty
                ),
            ))
        }
    }
}

/// A Map key: JSON object keys are strings; they coerce like string values
/// (`"42"` into a UInt64 key).
struct KeyValueSeed<'t, 'x, 'c, 'p, 'b> {
    ty: &'t ChType,
    col: usize,
    ctx: &'x mut Ctx<'c, 'p, 'b>,
}

impl<'de> DeserializeSeed<'de> for KeyValueSeed<'_, '_, '_, '_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyValueSeed<'_, '_, '_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<(), E> {
        match put_scalar(
            self.ty,
            Tok::Str(key.as_bytes()),
            &self.ctx.row.rules[self.col],
            self.ctx.out.buf,
        ) {
            Ok(Put::Written) => Ok(()),
            Ok(Put::NullForNonNullable) => Err(self.ctx.fail(self.col, "null map key")),
            Err(reason) => Err(self.ctx.fail(self.col, format!("map key: {reason}"))),
        }
    }
}

/// Array, Map and Tuple values (maybe Nullable).
struct Composite<'t, 'x, 'c, 'p, 'b> {
    ty: &'t ChType,
    nullable: bool,
    col: usize,
    ctx: &'x mut Ctx<'c, 'p, 'b>,
}

impl Composite<'_, '_, '_, '_, '_> {
    fn refuse<E: de::Error>(self, found: &str) -> E {
        let ty = self.ty;
        self.ctx
            .fail(self.col, format!("cannot put {found} into {ty}"))
    }
}

impl<'de> Visitor<'de> for Composite<'_, '_, '_, '_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a JSON value for {}", self.ty)
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        if self.nullable {
            self.ctx.out.buf.push(1);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let (ty, col, ctx) = (self.ty, self.col, self.ctx);
        if self.nullable {
            ctx.out.buf.push(0);
        }
        match ty {
            ChType::Array(inner) => {
                let start = ctx.out.buf.len();
                let mut n = 0u64;
                while seq
                    .next_element_seed(ElemSeed {
                        ty: inner,
                        col,
                        ctx: &mut *ctx,
                    })?
                    .is_some()
                {
                    n += 1;
                }
                insert_leb128(ctx.out.buf, start, n);
            }
            ChType::Tuple(elements) => {
                for e in elements {
                    let got = seq.next_element_seed(ElemSeed {
                        ty: &e.ty,
                        col,
                        ctx: &mut *ctx,
                    })?;
                    if got.is_none() {
                        return Err(
                            ctx.fail(col, format!("{ty} needs {} elements", elements.len()))
                        );
                    }
                }
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    return Err(
                        ctx.fail(col, format!("{ty} takes only {} elements", elements.len()))
                    );
                }
            }
            _ => return Err(ctx.fail(col, format!("cannot put an array into {ty}"))),
        }
        Ok(true)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let (ty, col, ctx) = (self.ty, self.col, self.ctx);
        let ChType::Map(k, v) = ty else {
            return Err(ctx.fail(col, format!("cannot put an object into {ty}")));
        };
        if self.nullable {
            ctx.out.buf.push(0);
        }
        let start = ctx.out.buf.len();
        let first = ctx.out.marks.len();
        loop {
            let at = ctx.out.buf.len();
            let key = map.next_key_seed(KeyValueSeed {
                ty: k,
                col,
                ctx: &mut *ctx,
            });
            match key {
                Ok(Some(())) => {}
                Ok(None) => break,
                Err(e) => {
                    ctx.out.marks.truncate(first);
                    return Err(e);
                }
            }
            let value_at = ctx.out.buf.len();
            ctx.out.marks.push((at, value_at));
            if let Err(e) = map.next_value_seed(ElemSeed {
                ty: v,
                col,
                ctx: &mut *ctx,
            }) {
                ctx.out.marks.truncate(first);
                return Err(e);
            }
        }
        // A repeated key: its last value, at its first place (as the
        // scanner).
        let out = &mut *ctx.out;
        let kept =
            spate_row::rowbinary::keep_last_map_entries(out.buf, &out.marks[first..], out.text);
        out.marks.truncate(first);
        insert_leb128(out.buf, start, kept);
        Ok(true)
    }

    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<bool, E> {
        Err(self.refuse("a bool"))
    }

    fn visit_i64<E: de::Error>(self, _v: i64) -> Result<bool, E> {
        Err(self.refuse("a number"))
    }

    fn visit_u64<E: de::Error>(self, _v: u64) -> Result<bool, E> {
        Err(self.refuse("a number"))
    }

    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<bool, E> {
        Err(self.refuse("a number"))
    }

    fn visit_str<E: de::Error>(self, _v: &str) -> Result<bool, E> {
        Err(self.refuse("a string"))
    }
}
