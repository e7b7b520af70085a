//! Column specs: the vocabulary every format's encoder and the sink share.
//!
//! A [`ColumnSpec`] is one column of the INSERT: its name and type, which
//! record field feeds it (a path of field names, [`parse_pointer`]; with a
//! flatten join every split of the name, [`flattened_paths`]) or which Kafka
//! metadata ([`crate::meta`]), what a missing field or a null means
//! ([`MissingValue`]) and its per-column options. [`MappingOptions`] holds
//! the settings of a whole mapping; [`MappingError`] is why one cannot be
//! built. The JSON, Avro and Protobuf encoders (spate-formats) each compile
//! these into their own plan; nothing here reads a message.

use std::collections::BTreeMap;

use crate::coerce::{EpochUnit, Put, TimeRules, Tok};
use crate::meta::MetaSource;
use crate::types::ChType;

/// What a column gets when its field is missing or null.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MissingValue {
    /// NULL (the column is Nullable).
    Null,
    /// The column's constant DEFAULT, as its SQL literal text (`0`, `'n/a'`,
    /// `-1.5`); encoded once when the encoder is built.
    Literal(String),
    /// The server's DEFAULT, computed per row: the row is sent with
    /// `RowBinaryWithDefaults` and this cell is the marker byte `0x01`
    /// (<https://clickhouse.com/docs/interfaces/formats/RowBinaryWithDefaults>).
    /// Only planned for servers that accept that input format
    /// ([`crate::schema::InsertOptions::server_defaults`]).
    ServerDefault,
    /// A record error: the column has no DEFAULT we can apply and is not
    /// Nullable (or its DEFAULT is per-row and the server cannot compute it
    /// for a row that names the column).
    Reject,
}

/// Per-column mapping settings that override the mapping-wide ones
/// ([`MappingOptions`]); `None` keeps the mapping-wide value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColumnOptions {
    /// How epoch numbers are read into this DateTime/DateTime64 column.
    pub epoch_unit: Option<EpochUnit>,
    /// Whether a JSON `""` counts as missing for this column (see
    /// [`MappingOptions::empty_as_null`]).
    pub empty_as_null: Option<bool>,
    /// A null counts as missing, so a Nullable column takes its
    /// [`MissingValue::Literal`] for a null too (coalesce): set by
    /// `mapping.defaults` ([`crate::schema::InsertOptions::defaults`]).
    /// Every encoder honours it as it honours `missing`. A non-Nullable
    /// column already treats a null as missing.
    pub null_as_missing: bool,
}

/// One column of the INSERT, in INSERT order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnSpec {
    /// The column's name in the table.
    pub name: String,
    /// Its type.
    pub ty: ChType,
    /// Its JSON path; `None` means the column's name (and, with a flatten
    /// join, every split of it). Not read when `meta` is set.
    pub path: Option<Vec<String>>,
    /// The Kafka metadata the column takes instead of a record field
    /// (`_offset`, `_key`, `_headers`, ...: [`crate::meta`]); encoders write it with
    /// [`crate::meta::encode_meta`]. [`crate::schema::plan_insert`] sets it for a column
    /// named like a source and for `mapping.columns: {col: _source}`.
    pub meta: Option<MetaSource>,
    /// What a missing field or a null means.
    pub missing: MissingValue,
    /// Per-column overrides of the mapping's options.
    pub options: ColumnOptions,
}

/// Settings of a mapping beyond the columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MappingOptions {
    /// Read nested objects as flattened with this join (`"_"`, `"."`).
    pub flatten_join: Option<String>,
    /// Time parsing rules (the epoch unit may be overridden per column,
    /// [`ColumnOptions::epoch_unit`]).
    pub time: TimeRules,
    /// A JSON `""` (exactly the empty string, at the column's own path, not
    /// inside an array) counts as missing: NULL in a Nullable column
    /// (even one with a DEFAULT), the DEFAULT in a non-Nullable column
    /// whose DEFAULT spate can apply ([`MissingValue::Literal`] or
    /// [`MissingValue::ServerDefault`]); in any other column the `""` is
    /// mapped as usual (a String column stores it, a number column refuses
    /// it). Per column: [`ColumnOptions::empty_as_null`]. Such a column takes
    /// the general path (no fast path).
    pub empty_as_null: bool,
}

/// Splits a JSON pointer (RFC 6901: `/properties/mag`, `~1` is `/`, `~0` is
/// `~`) into its path segments.
///
/// # Errors
/// [`MappingError::BadPointer`] when it does not start with `/` or has a bad
/// `~` escape.
pub fn parse_pointer(pointer: &str) -> Result<Vec<String>, MappingError> {
    let bad = || MappingError::BadPointer(pointer.to_owned());
    let rest = pointer.strip_prefix('/').ok_or_else(bad)?;
    rest.split('/')
        .map(|seg| {
            let mut out = String::with_capacity(seg.len());
            let mut chars = seg.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(bad()),
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

/// A mapping that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// A JSON pointer that does not parse.
    #[error("bad JSON pointer `{0}` (expected /a/b with ~0 and ~1 escapes)")]
    BadPointer(String),
    /// A column's DEFAULT literal does not encode as its type.
    #[error("column `{column}`: DEFAULT {literal} does not encode as {ty}: {reason}")]
    BadDefault {
        /// The column.
        column: String,
        /// Its type.
        ty: String,
        /// The literal.
        literal: String,
        /// Why not.
        reason: String,
    },
    /// Two columns read the same path.
    #[error("columns `{first}` and `{second}` read the same JSON path {path:?}")]
    DuplicatePath {
        /// One column.
        first: String,
        /// The other.
        second: String,
        /// The path.
        path: Vec<String>,
    },
    /// No columns.
    #[error("a mapping needs at least one column")]
    NoColumns,
    /// A column source that is neither a JSON pointer nor a metadata source.
    #[error(
        "`{0}` is neither a JSON pointer (/a/b) nor a Kafka metadata source (_topic, \
         _partition, _offset, _timestamp, _timestamp_ms, _timestamp_s, _timestamp_type, _key, \
         _headers, _headers.name, _headers.value, _header.NAME)"
    )]
    BadSource(String),
    /// A metadata column of a type that cannot hold the source's values.
    #[error("column `{column}`: {reason}")]
    MetaType {
        /// The column.
        column: String,
        /// Which types the source takes.
        reason: String,
    },
}

/// A column's source as written in `mapping.columns`: a JSON pointer
/// (`/properties/mag`, [`parse_pointer`]) or a Kafka metadata source
/// (`_offset`, [`MetaSource::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnSource {
    /// A JSON path.
    Path(Vec<String>),
    /// Kafka metadata.
    Meta(MetaSource),
}

/// Reads a `mapping.columns` value: a JSON pointer when it starts with
/// `/`, else a metadata source name.
///
/// # Errors
/// [`MappingError::BadPointer`] for a bad pointer,
/// [`MappingError::BadSource`] for anything else that is no source.
pub fn parse_source(text: &str) -> Result<ColumnSource, MappingError> {
    if text.starts_with('/') {
        return parse_pointer(text).map(ColumnSource::Path);
    }
    MetaSource::parse(text)
        .map(ColumnSource::Meta)
        .ok_or_else(|| MappingError::BadSource(text.to_owned()))
}

impl ColumnSpec {
    /// The record paths that feed this column, as every format reads them:
    /// its explicit path when it has one; else, under a (non-empty) flatten
    /// join, every cut of its name at the join ([`flattened_paths`]); else
    /// its name as one top-level field.
    pub fn source_paths(&self, flatten_join: Option<&str>) -> Vec<Vec<String>> {
        match (&self.path, flatten_join) {
            (Some(p), _) => vec![p.clone()],
            (None, Some(join)) if !join.is_empty() => flattened_paths(&self.name, join),
            (None, _) => vec![vec![self.name.clone()]],
        }
    }
}

/// Every path a column name stands for under a flatten join: the name itself
/// and each way of cutting it at the join (at most 2^6 cuts considered).
pub fn flattened_paths(name: &str, join: &str) -> Vec<Vec<String>> {
    let cuts: Vec<usize> = name.match_indices(join).map(|(i, _)| i).take(6).collect();
    (0u32..(1 << cuts.len()))
        .map(|mask| {
            let mut path = Vec::new();
            let mut from = 0;
            for (bit, &at) in cuts.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    path.push(name[from..at].to_owned());
                    from = at + join.len();
                }
            }
            path.push(name[from..].to_owned());
            path
        })
        .filter(|p| p.iter().all(|seg| !seg.is_empty()))
        .collect()
}

/// Encodes a DEFAULT literal (`0`, `-1.5`, `'text'`) as the column's type
/// (every format's encoder encodes its constant DEFAULTs this way).
pub fn encode_literal(
    c: &ColumnSpec,
    literal: &str,
    rules: &TimeRules,
) -> Result<Vec<u8>, MappingError> {
    let bad = |reason: String| MappingError::BadDefault {
        column: c.name.clone(),
        ty: c.ty.to_string(),
        literal: literal.to_owned(),
        reason,
    };
    let lit = literal.trim();
    let unquoted;
    let tok = if let Some(inner) = lit.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        let mut s = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(ch) = chars.next() {
            if ch == '\\' {
                match chars.next() {
                    Some('n') => s.push('\n'),
                    Some('t') => s.push('\t'),
                    Some(e) => s.push(e),
                    None => return Err(bad("dangling escape".into())),
                }
            } else {
                s.push(ch);
            }
        }
        unquoted = s;
        Tok::Str(unquoted.as_bytes())
    } else if lit == "NULL" {
        Tok::Null
    } else if lit.starts_with(|ch: char| ch.is_ascii_digit() || ch == '-') {
        Tok::Number(lit.as_bytes())
    } else {
        return Err(bad("not a constant literal".into()));
    };
    let mut out = Vec::new();
    match crate::coerce::put_scalar(&c.ty, tok, rules, &mut out) {
        Ok(Put::Written) => Ok(out),
        Ok(Put::NullForNonNullable) => Err(bad("NULL for a non-Nullable column".into())),
        Err(reason) => Err(bad(reason)),
    }
}

/// Column specs for a plain table description: `(name, type)` pairs, every
/// column read from the field of its name, NULL when Nullable else required.
/// Handy for tests and for tables without defaults.
pub fn simple_columns<'s>(cols: impl IntoIterator<Item = (&'s str, ChType)>) -> Vec<ColumnSpec> {
    cols.into_iter()
        .map(|(name, ty)| ColumnSpec {
            name: name.to_owned(),
            options: ColumnOptions::default(),
            missing: if ty.is_nullable() {
                MissingValue::Null
            } else {
                MissingValue::Reject
            },
            ty,
            path: None,
            meta: None,
        })
        .collect()
}

/// Renames as a map from column to top-level JSON field, as [`ColumnSpec`]
/// paths.
pub fn apply_renames(columns: &mut [ColumnSpec], renames: &BTreeMap<String, String>) {
    for c in columns {
        if let Some(field) = renames.get(&c.name) {
            c.path = Some(vec![field.clone()]);
        }
    }
}
