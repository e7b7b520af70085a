//! The compiled filter: where each cell of a row starts (a walk over the
//! RowBinary layout of the columns it needs) and typed comparisons with
//! constants encoded once as their column's type.

use std::cmp::Ordering;

use spate_core::pipeline::chain::RecordError;

use super::expr::{CmpOp, Constant, FilterExpr};
use crate::coerce::TimeRules;
use crate::coerce::{Put, Tok, put_scalar};
use crate::schema::RowFormat;
use crate::spec::{ColumnSpec, MissingValue};
use crate::types::ChType;

/// A filter that cannot be compiled against the INSERT columns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("mapping.filter: column `{column}`: {reason}")]
pub struct FilterError {
    /// The column (or name) concerned.
    pub column: String,
    /// Why.
    pub reason: String,
}

impl FilterError {
    fn new(column: &str, reason: impl Into<String>) -> Self {
        Self {
            column: column.to_owned(),
            reason: reason.into(),
        }
    }

    /// The same as a record error (a filter that broke under a live
    /// re-plan).
    pub fn record_error(&self) -> RecordError {
        RecordError::encode(&self.column, format!("mapping.filter: {}", self.reason))
    }
}

/// How many bytes a cell takes, for walking a row.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cell {
    Fixed(usize),
    /// LEB128 length, then that many bytes.
    Var,
    Nullable(Box<Cell>),
    Array(Box<Cell>),
    Map(Box<Cell>, Box<Cell>),
    Tuple(Vec<Cell>),
}

fn cell_of(ty: &ChType) -> Cell {
    use ChType as T;
    match ty {
        T::Int8 | T::UInt8 | T::Bool | T::Enum8(_) => Cell::Fixed(1),
        T::Int16 | T::UInt16 | T::Date | T::Enum16(_) => Cell::Fixed(2),
        T::Int32 | T::UInt32 | T::Float32 | T::Date32 | T::DateTime(_) | T::Ipv4 => Cell::Fixed(4),
        T::Int64 | T::UInt64 | T::Float64 | T::DateTime64 { .. } => Cell::Fixed(8),
        T::Int128 | T::UInt128 | T::Uuid | T::Ipv6 => Cell::Fixed(16),
        T::Int256 | T::UInt256 => Cell::Fixed(32),
        T::Decimal { precision, .. } => Cell::Fixed(decimal_width(*precision)),
        T::String | T::Json(_) => Cell::Var,
        T::FixedString(n) => Cell::Fixed(*n),
        T::Nullable(inner) => Cell::Nullable(Box::new(cell_of(inner))),
        T::LowCardinality(inner) => cell_of(inner),
        T::Array(inner) => Cell::Array(Box::new(cell_of(inner))),
        T::Map(k, v) => Cell::Map(Box::new(cell_of(k)), Box::new(cell_of(v))),
        T::Tuple(elems) => Cell::Tuple(elems.iter().map(|e| cell_of(&e.ty)).collect()),
    }
}

fn decimal_width(precision: u8) -> usize {
    match precision {
        0..=9 => 4,
        10..=18 => 8,
        19..=38 => 16,
        _ => 32,
    }
}

/// LEB128 at `s[at..]`: `(value, bytes used)`.
#[inline]
fn leb128(s: &[u8], at: usize) -> Option<(usize, usize)> {
    // One byte: strings under 128 bytes (nearly all).
    if let Some(&b) = s.get(at)
        && b < 0x80
    {
        return Some((usize::from(b), 1));
    }
    let mut v = 0usize;
    for (k, &b) in s.get(at..)?.iter().take(10).enumerate() {
        v |= usize::from(b & 0x7f).checked_shl(7 * k as u32)?;
        if b & 0x80 == 0 {
            return Some((v, k + 1));
        }
    }
    None
}

/// The offset after the cell at `at`.
fn skip(cell: &Cell, s: &[u8], at: usize) -> Option<usize> {
    match cell {
        Cell::Fixed(n) => Some(at + n).filter(|&e| e <= s.len()),
        Cell::Var => {
            let (n, k) = leb128(s, at)?;
            Some(at + k + n).filter(|&e| e <= s.len())
        }
        Cell::Nullable(inner) => match *s.get(at)? {
            0 => skip(inner, s, at + 1),
            _ => Some(at + 1),
        },
        Cell::Array(inner) => {
            let (n, k) = leb128(s, at)?;
            let mut p = at + k;
            for _ in 0..n {
                p = skip(inner, s, p)?;
            }
            Some(p)
        }
        Cell::Map(kc, vc) => {
            let (n, k) = leb128(s, at)?;
            let mut p = at + k;
            for _ in 0..n {
                p = skip(kc, s, p)?;
                p = skip(vc, s, p)?;
            }
            Some(p)
        }
        Cell::Tuple(elems) => elems.iter().try_fold(at, |p, c| skip(c, s, p)),
    }
}

/// How a scalar compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Unsigned little-endian integer of this many bytes (1, 2, 4, 8, 16, 32).
    UInt(usize),
    /// Signed little-endian two's complement of this many bytes.
    Int(usize),
    F32,
    F64,
    /// LEB128 length + bytes, compared bytewise.
    Str,
    /// Exactly this many bytes, compared bytewise (FixedString, IPv6).
    Bytes(usize),
    /// Exactly this many bytes, equality only (UUID).
    EqOnly(usize),
}

fn kind_of(ty: &ChType) -> Option<Kind> {
    use ChType as T;
    Some(match ty {
        T::UInt8 | T::Bool => Kind::UInt(1),
        T::UInt16 | T::Date => Kind::UInt(2),
        T::UInt32 | T::DateTime(_) | T::Ipv4 => Kind::UInt(4),
        T::UInt64 => Kind::UInt(8),
        T::UInt128 => Kind::UInt(16),
        T::UInt256 => Kind::UInt(32),
        T::Int8 | T::Enum8(_) => Kind::Int(1),
        T::Int16 | T::Enum16(_) => Kind::Int(2),
        T::Int32 | T::Date32 => Kind::Int(4),
        T::Int64 | T::DateTime64 { .. } => Kind::Int(8),
        T::Int128 => Kind::Int(16),
        T::Int256 => Kind::Int(32),
        T::Decimal { precision, .. } => Kind::Int(decimal_width(*precision)),
        T::Float32 => Kind::F32,
        T::Float64 => Kind::F64,
        T::String => Kind::Str,
        T::FixedString(n) => Kind::Bytes(*n),
        T::Ipv6 => Kind::Bytes(16),
        T::Uuid => Kind::EqOnly(16),
        T::LowCardinality(inner) => return kind_of(inner),
        T::Json(_) | T::Nullable(_) | T::Array(_) | T::Map(..) | T::Tuple(_) => return None,
    })
}

/// The value bytes of a scalar cell (a String without its length).
#[inline]
fn value_bytes(kind: Kind, cell: &[u8]) -> &[u8] {
    match kind {
        Kind::Str => match leb128(cell, 0) {
            Some((n, k)) => cell.get(k..k + n).unwrap_or_default(),
            None => &[],
        },
        _ => cell,
    }
}

#[inline]
fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(a)
}

#[inline]
fn le_i64(b: &[u8]) -> i64 {
    let shift = 64 - 8 * b.len() as u32;
    ((le_u64(b) << shift) as i64) >> shift
}

/// Compares little-endian integers of any equal width by their top bytes
/// first (`signed`: the top bit flipped).
fn cmp_wide(a: &[u8], b: &[u8], signed: bool) -> Ordering {
    let n = a.len();
    for i in (0..n).rev() {
        let (mut x, mut y) = (a[i], b[i]);
        if signed && i == n - 1 {
            x ^= 0x80;
            y ^= 0x80;
        }
        match x.cmp(&y) {
            Ordering::Equal => {}
            o => return o,
        }
    }
    Ordering::Equal
}

/// `a` against `b`, both value bytes of `kind`; `None` when unordered (NaN).
#[inline]
fn compare(kind: Kind, a: &[u8], b: &[u8]) -> Option<Ordering> {
    match kind {
        Kind::UInt(n) if n <= 8 => Some(le_u64(a).cmp(&le_u64(b))),
        Kind::Int(n) if n <= 8 => Some(le_i64(a).cmp(&le_i64(b))),
        Kind::UInt(_) => Some(cmp_wide(a, b, false)),
        Kind::Int(_) => Some(cmp_wide(a, b, true)),
        Kind::F32 => {
            let x = f32::from_le_bytes(a.try_into().ok()?);
            let y = f32::from_le_bytes(b.try_into().ok()?);
            x.partial_cmp(&y)
        }
        Kind::F64 => {
            let x = f64::from_le_bytes(a.try_into().ok()?);
            let y = f64::from_le_bytes(b.try_into().ok()?);
            x.partial_cmp(&y)
        }
        Kind::Str | Kind::Bytes(_) | Kind::EqOnly(_) => Some(a.cmp(b)),
    }
}

#[derive(Clone, Debug)]
enum Node {
    All(Vec<Node>),
    Any(Vec<Node>),
    Cmp {
        col: usize,
        nullable: bool,
        kind: Kind,
        op: CmpOp,
        value: Vec<u8>,
    },
    In {
        col: usize,
        nullable: bool,
        kind: Kind,
        values: Vec<Vec<u8>>,
    },
    IsNull {
        col: usize,
        negated: bool,
    },
}

/// A filter compiled against one INSERT plan's columns.
#[derive(Clone, Debug)]
pub struct RowFilter {
    root: Node,
    /// The layout of columns `0..=last` (the last column the filter reads).
    cells: Vec<Cell>,
    /// RowBinaryWithDefaults: a marker byte before each cell.
    markers: bool,
    /// Where each of `cells` starts and ends in the row being checked.
    spans: Vec<(u32, u32)>,
    /// The filter's text, for `spate check` and logs.
    text: String,
}

impl RowFilter {
    /// Compiles `expr` against `columns` (the INSERT's, in order) for rows
    /// in `format`; time constants are read with `rules`.
    ///
    /// # Errors
    /// [`FilterError`] naming the column: not an INSERT column, not a
    /// scalar, possibly left to the server's DEFAULT, `is null` on a
    /// non-Nullable column, an order on a UUID, or a constant that does not
    /// encode as the column's type.
    pub fn compile(
        expr: &FilterExpr,
        columns: &[ColumnSpec],
        format: RowFormat,
        rules: &TimeRules,
    ) -> Result<RowFilter, FilterError> {
        let mut last = 0;
        let root = node_of(expr, columns, rules, &mut last)?;
        let cells: Vec<Cell> = columns
            .iter()
            .take(last + 1)
            .map(|c| cell_of(&c.ty))
            .collect();
        Ok(RowFilter {
            root,
            spans: vec![(0, 0); cells.len()],
            cells,
            markers: format == RowFormat::RowBinaryWithDefaults,
            text: expr.to_string(),
        })
    }

    /// The filter as text (`all(unit != "drop", value >= 0)`).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `row` (one row's bytes in the compiled format) passes. A row
    /// that does not walk (shorter than its layout: an encoder bug) is kept
    /// (the server then refuses the insert loudly) and asserts in debug.
    #[inline]
    pub fn keep(&mut self, row: &[u8]) -> bool {
        if !self.locate(row) {
            debug_assert!(false, "a row that does not follow its layout");
            return true;
        }
        eval(&self.root, row, &self.spans)
    }

    /// Fills `spans` with the cells' bounds; false if the row is short.
    #[inline]
    fn locate(&mut self, row: &[u8]) -> bool {
        let mut at = 0usize;
        for (cell, span) in self.cells.iter().zip(self.spans.iter_mut()) {
            if self.markers {
                match row.get(at) {
                    Some(0) => at += 1,
                    Some(_) => {
                        // The server's DEFAULT: no bytes (never a filtered
                        // column: compile refuses those).
                        at += 1;
                        *span = (at as u32, at as u32);
                        continue;
                    }
                    None => return false,
                }
            }
            // Scalars inline (most cells); composites walk.
            let end = match cell {
                Cell::Fixed(n) => at + n,
                Cell::Var => match leb128(row, at) {
                    Some((n, k)) => at + k + n,
                    None => return false,
                },
                Cell::Nullable(inner) if row.get(at) == Some(&0) => match **inner {
                    Cell::Fixed(n) => at + 1 + n,
                    _ => match skip(inner, row, at + 1) {
                        Some(e) => e,
                        None => return false,
                    },
                },
                Cell::Nullable(_) => at + 1,
                _ => match skip(cell, row, at) {
                    Some(e) => e,
                    None => return false,
                },
            };
            if end > row.len() {
                return false;
            }
            *span = (at as u32, end as u32);
            at = end;
        }
        true
    }
}

fn eval(node: &Node, row: &[u8], spans: &[(u32, u32)]) -> bool {
    let cell = |col: usize| {
        let (s, e) = spans[col];
        &row[s as usize..e as usize]
    };
    match node {
        Node::All(v) => v.iter().all(|n| eval(n, row, spans)),
        Node::Any(v) => v.iter().any(|n| eval(n, row, spans)),
        Node::IsNull { col, negated } => (cell(*col).first() == Some(&1)) != *negated,
        Node::Cmp {
            col,
            nullable,
            kind,
            op,
            value,
        } => {
            let mut c = cell(*col);
            if *nullable {
                if c.first() != Some(&0) {
                    return false; // NULL compares false (SQL)
                }
                c = &c[1..];
            }
            let o = compare(*kind, value_bytes(*kind, c), value_bytes(*kind, value));
            match (op, o) {
                (CmpOp::Ne, None) => true,
                (_, None) => false,
                (CmpOp::Eq, Some(o)) => o == Ordering::Equal,
                (CmpOp::Ne, Some(o)) => o != Ordering::Equal,
                (CmpOp::Lt, Some(o)) => o == Ordering::Less,
                (CmpOp::Le, Some(o)) => o != Ordering::Greater,
                (CmpOp::Gt, Some(o)) => o == Ordering::Greater,
                (CmpOp::Ge, Some(o)) => o != Ordering::Less,
            }
        }
        Node::In {
            col,
            nullable,
            kind,
            values,
        } => {
            let mut c = cell(*col);
            if *nullable {
                if c.first() != Some(&0) {
                    return false;
                }
                c = &c[1..];
            }
            let v = value_bytes(*kind, c);
            values
                .iter()
                .any(|k| compare(*kind, v, value_bytes(*kind, k)) == Some(Ordering::Equal))
        }
    }
}

/// The column `name` and its scalar type (Nullable/LowCardinality peeled).
fn column<'c>(
    name: &str,
    columns: &'c [ColumnSpec],
    last: &mut usize,
) -> Result<(usize, &'c ChType, bool), FilterError> {
    let Some(i) = columns.iter().position(|c| c.name == name) else {
        return Err(FilterError::new(
            name,
            "not a column of the INSERT (a filter reads the row as it lands: name a column the \
             table stores from the record; MATERIALIZED and ALIAS columns are computed by the \
             server and cannot be filtered here)",
        ));
    };
    let c = &columns[i];
    if c.missing == MissingValue::ServerDefault {
        return Err(FilterError::new(
            name,
            "its value may be the server's per-row DEFAULT, which the row does not carry; give \
             it a `mapping.defaults` value or filter another column",
        ));
    }
    *last = (*last).max(i);
    let ty = c.ty.without_low_cardinality();
    Ok(match ty {
        ChType::Nullable(inner) => (i, inner.without_low_cardinality(), true),
        t => (i, t, false),
    })
}

fn encode_constant(
    name: &str,
    ty: &ChType,
    value: &Constant,
    rules: &TimeRules,
) -> Result<Vec<u8>, FilterError> {
    let tok = match value {
        Constant::Str(s) => Tok::Str(s.as_bytes()),
        Constant::Number(n) => Tok::Number(n.as_bytes()),
        Constant::Bool(b) => Tok::Bool(*b),
    };
    let mut out = Vec::new();
    match put_scalar(ty, tok, rules, &mut out) {
        Ok(Put::Written) => Ok(out),
        Ok(Put::NullForNonNullable) => Err(FilterError::new(name, "a null constant")),
        Err(reason) => Err(FilterError::new(
            name,
            format!("the constant {value} does not fit {ty}: {reason}"),
        )),
    }
}

fn scalar_kind(name: &str, ty: &ChType) -> Result<Kind, FilterError> {
    kind_of(ty).ok_or_else(|| {
        FilterError::new(
            name,
            format!(
                "of type {ty}: only scalar columns can be filtered (not Array, Map, Tuple, JSON)"
            ),
        )
    })
}

fn node_of(
    expr: &FilterExpr,
    columns: &[ColumnSpec],
    rules: &TimeRules,
    last: &mut usize,
) -> Result<Node, FilterError> {
    Ok(match expr {
        FilterExpr::All(v) => Node::All(
            v.iter()
                .map(|e| node_of(e, columns, rules, last))
                .collect::<Result<_, _>>()?,
        ),
        FilterExpr::Any(v) => Node::Any(
            v.iter()
                .map(|e| node_of(e, columns, rules, last))
                .collect::<Result<_, _>>()?,
        ),
        FilterExpr::IsNull {
            column: name,
            negated,
        } => {
            let (col, _, nullable) = column(name, columns, last)?;
            if !nullable {
                return Err(FilterError::new(
                    name,
                    "is not Nullable, so `is null` is never true and `is not null` always",
                ));
            }
            Node::IsNull {
                col,
                negated: *negated,
            }
        }
        FilterExpr::Cmp {
            column: name,
            op,
            value,
        } => {
            let (col, ty, nullable) = column(name, columns, last)?;
            let kind = scalar_kind(name, ty)?;
            if op.is_order() && matches!(kind, Kind::EqOnly(_)) {
                return Err(FilterError::new(
                    name,
                    format!("of type {ty} takes ==, != and in only"),
                ));
            }
            Node::Cmp {
                col,
                nullable,
                kind,
                op: *op,
                value: encode_constant(name, ty, value, rules)?,
            }
        }
        FilterExpr::In {
            column: name,
            values,
        } => {
            let (col, ty, nullable) = column(name, columns, last)?;
            let kind = scalar_kind(name, ty)?;
            Node::In {
                col,
                nullable,
                kind,
                values: values
                    .iter()
                    .map(|v| encode_constant(name, ty, v, rules))
                    .collect::<Result<_, _>>()?,
            }
        }
    })
}
