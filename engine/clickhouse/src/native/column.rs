//! Column builders: one per INSERT column, fed one RowBinary value per row
//! and written out as that column's Native serialization.
//!
//! Layout sources (ClickHouse documentation):
//! - <https://clickhouse.com/docs/interfaces/formats/Native> ("Data types
//!   wire format": simple types as in RowBinary, one value after another;
//!   Nullable, LowCardinality, Array and Map differ);
//! - <https://clickhouse.com/docs/native-protocol/columns> (the column
//!   encodings table: Nullable = UInt8 null mask then the values with the
//!   same row count; Array = UInt64 cumulative offsets then the flattened
//!   elements; Map(K, V) = offsets, then all keys, then all values; Tuple =
//!   its element columns one after another; LowCardinality = a dictionary of
//!   unique keys and an index column of UInt8/16/32/64).
//!
//! LowCardinality in detail (the docs page gives the two columns but not
//! their framing; this is the framing of ClickHouse's
//! `DataTypeLowCardinality` bulk serialization, the same in 18.16 and
//! current releases): a per-column prefix UInt64 `1` (keys version
//! "shared dictionaries with additional keys"), written before any data of
//! the block; then, for a non-empty column, UInt64 flags (the index width
//! 0..=3 for UInt8..UInt64, plus bit 9 "has additional keys"), UInt64 key
//! count, the keys as a column of the dictionary type without Nullable,
//! UInt64 row count, and the indexes. For `LowCardinality(Nullable(T))` key
//! 0 stands for NULL (its value is T's default). Prefixes of nested columns
//! (an Array's or Tuple's LowCardinality elements) all come before the
//! column's data.
//!
//! A builder allocates per batch (its buffers grow amortised), never per
//! row; a LowCardinality dictionary borrows its keys from the column's own
//! value buffer when the block is written.

use std::collections::HashMap;

use spate_row::rowbinary::{decimal_width, int_shape, put_leb128};
use spate_row::types::ChType;

/// Flag of the LowCardinality index header: the keys follow in this block.
const LC_HAS_ADDITIONAL_KEYS: u64 = 1 << 9;
/// LowCardinality keys serialization version "shared dictionaries with
/// additional keys", the only one ClickHouse defines.
const LC_KEYS_VERSION: u64 = 1;
/// A NULL row of a `LowCardinality(Nullable(T))` column in [`Builder::LowCardinality`]'s spans.
const LC_NULL: (u32, u32) = (u32::MAX, 0);

/// Why a column cannot be built or a value did not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ColumnError {
    /// The type has no Native builder (LowCardinality of a non-scalar type).
    Unsupported(String),
    /// The RowBinary input ended inside a value or holds a byte the layout
    /// does not allow.
    Malformed(&'static str),
}

/// What a LowCardinality key is in RowBinary: a String or a fixed width.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KeyShape {
    String,
    Fixed(usize),
}

/// A column being filled, one RowBinary value per row.
#[derive(Clone, Debug)]
pub(crate) enum Builder {
    /// Numbers, Bool, Date/Date32, DateTime/DateTime64, UUID, IPv4/IPv6,
    /// Decimal, Enum8/16, FixedString(N): `width` bytes per value, the same
    /// in RowBinary and Native.
    Fixed { width: usize, data: Vec<u8> },
    /// String: LEB128 length and bytes per value, as in RowBinary.
    String { data: Vec<u8> },
    /// Null mask, then the inner column (a default value for NULL rows).
    Nullable { nulls: Vec<u8>, inner: Box<Builder> },
    /// Cumulative element counts, then the flattened elements.
    Array {
        offsets: Vec<u64>,
        inner: Box<Builder>,
    },
    /// Cumulative entry counts, then all keys, then all values.
    Map {
        offsets: Vec<u64>,
        keys: Box<Builder>,
        values: Box<Builder>,
    },
    /// The element columns in order.
    Tuple(Vec<Builder>),
    /// Raw key bytes of every row and each row's span of them
    /// ([`LC_NULL`] for NULL).
    LowCardinality {
        nullable: bool,
        shape: KeyShape,
        /// The key type's default value in RowBinary (key 0 of a nullable one).
        default: Vec<u8>,
        values: Vec<u8>,
        spans: Vec<(u32, u32)>,
    },
}

fn take<'a>(input: &mut &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], ColumnError> {
    if input.len() < n {
        return Err(ColumnError::Malformed(what));
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

fn leb128(input: &mut &[u8]) -> Result<u64, ColumnError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = take(input, 1, "a length")?[0];
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ColumnError::Malformed("a length longer than 64 bits"))
}

/// The width of a type whose RowBinary and Native value is a fixed number
/// of bytes, `None` for the others.
fn fixed_width(ty: &ChType) -> Option<usize> {
    if let Some((bits, _)) = int_shape(ty) {
        return Some(bits as usize / 8);
    }
    Some(match ty {
        ChType::Float32 | ChType::Date32 | ChType::DateTime(_) | ChType::Ipv4 => 4,
        ChType::Float64 | ChType::DateTime64 { .. } => 8,
        ChType::Bool | ChType::Enum8(_) => 1,
        ChType::Enum16(_) | ChType::Date => 2,
        ChType::Uuid | ChType::Ipv6 => 16,
        ChType::FixedString(n) => *n,
        ChType::Decimal { precision, .. } => decimal_width(*precision),
        _ => return None,
    })
}

impl Builder {
    /// An empty builder for `ty`.
    pub(crate) fn new(ty: &ChType) -> Result<Builder, ColumnError> {
        if let Some(width) = fixed_width(ty) {
            return Ok(Builder::Fixed {
                width,
                data: Vec::new(),
            });
        }
        Ok(match ty {
            ChType::String => Builder::String { data: Vec::new() },
            ChType::Nullable(inner) => Builder::Nullable {
                nulls: Vec::new(),
                inner: Box::new(Builder::new(inner)?),
            },
            ChType::Array(inner) => Builder::Array {
                offsets: Vec::new(),
                inner: Box::new(Builder::new(inner)?),
            },
            ChType::Map(k, v) => Builder::Map {
                offsets: Vec::new(),
                keys: Box::new(Builder::new(k)?),
                values: Box::new(Builder::new(v)?),
            },
            ChType::Tuple(elements) => Builder::Tuple(
                elements
                    .iter()
                    .map(|e| Builder::new(&e.ty))
                    .collect::<Result<_, _>>()?,
            ),
            ChType::LowCardinality(inner) => {
                let (nullable, key) = match inner.as_ref() {
                    ChType::Nullable(t) => (true, t.as_ref()),
                    t => (false, t),
                };
                let shape = match (key, fixed_width(key)) {
                    (ChType::String, _) => KeyShape::String,
                    (_, Some(w)) => KeyShape::Fixed(w),
                    _ => return Err(ColumnError::Unsupported(ty.to_string())),
                };
                let default = match shape {
                    KeyShape::String => vec![0],
                    KeyShape::Fixed(w) => vec![0; w],
                };
                Builder::LowCardinality {
                    nullable,
                    shape,
                    default,
                    values: Vec::new(),
                    spans: Vec::new(),
                }
            }
            other => return Err(ColumnError::Unsupported(other.to_string())),
        })
    }

    /// Reads one RowBinary value from the front of `input` into the column.
    pub(crate) fn read(&mut self, input: &mut &[u8]) -> Result<(), ColumnError> {
        match self {
            Builder::Fixed { width, data } => {
                data.extend_from_slice(take(input, *width, "a value")?)
            }
            Builder::String { data } => {
                let before = *input;
                let n = leb128(input)?;
                let n = usize::try_from(n).map_err(|_| ColumnError::Malformed("a string"))?;
                take(input, n, "a string")?;
                data.extend_from_slice(&before[..before.len() - input.len()]);
            }
            Builder::Nullable { nulls, inner } => match take(input, 1, "a null flag")?[0] {
                0 => {
                    nulls.push(0);
                    inner.read(input)?;
                }
                1 => {
                    nulls.push(1);
                    inner.push_default();
                }
                _ => return Err(ColumnError::Malformed("a null flag other than 0 or 1")),
            },
            Builder::Array { offsets, inner } => {
                let n = leb128(input)?;
                for _ in 0..n {
                    inner.read(input)?;
                }
                let last = offsets.last().copied().unwrap_or(0);
                offsets.push(last + n);
            }
            Builder::Map {
                offsets,
                keys,
                values,
            } => {
                let n = leb128(input)?;
                for _ in 0..n {
                    keys.read(input)?;
                    values.read(input)?;
                }
                let last = offsets.last().copied().unwrap_or(0);
                offsets.push(last + n);
            }
            Builder::Tuple(elements) => {
                for e in elements {
                    e.read(input)?;
                }
            }
            Builder::LowCardinality {
                nullable,
                shape,
                values,
                spans,
                ..
            } => {
                if *nullable {
                    match take(input, 1, "a null flag")?[0] {
                        0 => {}
                        1 => {
                            spans.push(LC_NULL);
                            return Ok(());
                        }
                        _ => return Err(ColumnError::Malformed("a null flag other than 0 or 1")),
                    }
                }
                let before = *input;
                match shape {
                    KeyShape::String => {
                        let n = leb128(input)?;
                        let n =
                            usize::try_from(n).map_err(|_| ColumnError::Malformed("a string"))?;
                        take(input, n, "a string")?;
                    }
                    KeyShape::Fixed(w) => {
                        take(input, *w, "a value")?;
                    }
                }
                let raw = &before[..before.len() - input.len()];
                let start = u32::try_from(values.len())
                    .map_err(|_| ColumnError::Malformed("a LowCardinality column over 4 GiB"))?;
                values.extend_from_slice(raw);
                spans.push((start, raw.len() as u32));
            }
        }
        Ok(())
    }

    /// Appends the type's default value (the placeholder under a NULL).
    fn push_default(&mut self) {
        match self {
            Builder::Fixed { width, data } => data.resize(data.len() + *width, 0),
            Builder::String { data } => data.push(0),
            Builder::Nullable { nulls, inner } => {
                nulls.push(1);
                inner.push_default();
            }
            Builder::Array { offsets, .. } | Builder::Map { offsets, .. } => {
                let last = offsets.last().copied().unwrap_or(0);
                offsets.push(last);
            }
            Builder::Tuple(elements) => elements.iter_mut().for_each(Builder::push_default),
            Builder::LowCardinality {
                nullable,
                default,
                values,
                spans,
                ..
            } => {
                if *nullable {
                    spans.push(LC_NULL);
                } else {
                    let start = values.len() as u32;
                    values.extend_from_slice(default);
                    spans.push((start, default.len() as u32));
                }
            }
        }
    }

    /// Writes the column's serialization prefix (LowCardinality keys
    /// versions, depth first), which precedes its data.
    pub(crate) fn write_prefix(&self, out: &mut Vec<u8>) {
        match self {
            Builder::Fixed { .. } | Builder::String { .. } => {}
            Builder::Nullable { inner, .. } | Builder::Array { inner, .. } => {
                inner.write_prefix(out);
            }
            Builder::Map { keys, values, .. } => {
                keys.write_prefix(out);
                values.write_prefix(out);
            }
            Builder::Tuple(elements) => elements.iter().for_each(|e| e.write_prefix(out)),
            Builder::LowCardinality { .. } => out.extend_from_slice(&LC_KEYS_VERSION.to_le_bytes()),
        }
    }

    /// Writes the column's data (everything read since the last clear).
    pub(crate) fn write_data(&self, out: &mut Vec<u8>) {
        match self {
            Builder::Fixed { data, .. } | Builder::String { data } => out.extend_from_slice(data),
            Builder::Nullable { nulls, inner } => {
                out.extend_from_slice(nulls);
                inner.write_data(out);
            }
            Builder::Array { offsets, inner } => {
                put_offsets(offsets, out);
                inner.write_data(out);
            }
            Builder::Map {
                offsets,
                keys,
                values,
            } => {
                put_offsets(offsets, out);
                keys.write_data(out);
                values.write_data(out);
            }
            Builder::Tuple(elements) => elements.iter().for_each(|e| e.write_data(out)),
            Builder::LowCardinality {
                nullable,
                default,
                values,
                spans,
                ..
            } => write_low_cardinality(*nullable, default, values, spans, out),
        }
    }

    /// An upper bound of the bytes [`Builder::write_prefix`] and
    /// [`Builder::write_data`] write for the values read so far, so a
    /// block's output is reserved once.
    pub(crate) fn len_bound(&self) -> usize {
        match self {
            Builder::Fixed { data, .. } | Builder::String { data } => data.len(),
            Builder::Nullable { nulls, inner } => nulls.len() + inner.len_bound(),
            Builder::Array { offsets, inner } => offsets.len() * 8 + inner.len_bound(),
            Builder::Map {
                offsets,
                keys,
                values,
            } => offsets.len() * 8 + keys.len_bound() + values.len_bound(),
            Builder::Tuple(elements) => elements.iter().map(Builder::len_bound).sum(),
            // Version, header, dictionary (at most every value once), and
            // an index of at most 8 bytes a row.
            Builder::LowCardinality {
                values,
                spans,
                default,
                ..
            } => 64 + default.len() + values.len() + spans.len() * 8,
        }
    }

    /// Empties the column, keeping its buffers' capacity.
    pub(crate) fn clear(&mut self) {
        match self {
            Builder::Fixed { data, .. } | Builder::String { data } => data.clear(),
            Builder::Nullable { nulls, inner } => {
                nulls.clear();
                inner.clear();
            }
            Builder::Array { offsets, inner } => {
                offsets.clear();
                inner.clear();
            }
            Builder::Map {
                offsets,
                keys,
                values,
            } => {
                offsets.clear();
                keys.clear();
                values.clear();
            }
            Builder::Tuple(elements) => elements.iter_mut().for_each(Builder::clear),
            Builder::LowCardinality { values, spans, .. } => {
                values.clear();
                spans.clear();
            }
        }
    }
}

fn put_offsets(offsets: &[u64], out: &mut Vec<u8>) {
    out.reserve(offsets.len() * 8);
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
}

/// Writes a LowCardinality column's data: header, keys in order of first
/// appearance (key 0 NULL for a nullable one), row count, indexes of the
/// narrowest width that holds them. Nothing for a column without rows
/// (ClickHouse writes nothing then either; an Array of only empty arrays).
fn write_low_cardinality(
    nullable: bool,
    default: &[u8],
    values: &[u8],
    spans: &[(u32, u32)],
    out: &mut Vec<u8>,
) {
    if spans.is_empty() {
        return;
    }
    let mut dict: HashMap<&[u8], u64> = HashMap::new();
    let mut keys: Vec<&[u8]> = Vec::new();
    if nullable {
        // Key 0 is NULL; its value is the type's default.
        keys.push(default);
    }
    let mut index: Vec<u64> = Vec::with_capacity(spans.len());
    for &(start, len) in spans {
        if (start, len) == LC_NULL {
            index.push(0);
            continue;
        }
        let v = &values[start as usize..start as usize + len as usize];
        let next = keys.len() as u64;
        let k = *dict.entry(v).or_insert_with(|| {
            keys.push(v);
            next
        });
        index.push(k);
    }
    let (width, tag) = match keys.len() {
        0..=0x100 => (1, 0u64),
        0x101..=0x1_0000 => (2, 1),
        0x1_0001..=0x1_0000_0000 => (4, 2),
        _ => (8, 3),
    };
    out.extend_from_slice(&(tag | LC_HAS_ADDITIONAL_KEYS).to_le_bytes());
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for k in &keys {
        out.extend_from_slice(k);
    }
    out.extend_from_slice(&(index.len() as u64).to_le_bytes());
    for i in index {
        out.extend_from_slice(&i.to_le_bytes()[..width]);
    }
}

/// Appends a Native block header's count (LEB128).
pub(crate) fn put_count(out: &mut Vec<u8>, n: u64) {
    put_leb128(out, n);
}
