//! Row filters (`mapping.filter`): predicates evaluated on each row **as
//! encoded**, after fan-out, so every format (JSON, Avro, Protobuf) gets
//! them with no code of its own and a filter sees exactly the value the
//! table would store.
//!
//! A [`FilterExpr`] is the parsed predicate tree (`all:` / `any:` of
//! comparisons such as `unit != "drop"`, `value >= 0`, `region in ["eu-0"]`,
//! `quality is null`). [`RowFilter::compile`] turns it into a plan against
//! the INSERT's columns: each constant is encoded once as its column's
//! RowBinary value with the JSON mapper's own coercions
//! ([`crate::coerce::put_scalar`]), so `value >= 0` on a `Float64`
//! compares with the double `0.0` and `ts >= "2024-01-01 00:00:00"` on a
//! `DateTime` with its seconds. [`RowFilter::keep`] then walks one row's
//! RowBinary bytes to the cells it needs and compares typed values: no
//! allocation, no lookup by name, per row.
//!
//! [`Filtered`] plugs a filter into any encoder of the chain: it implements
//! [`Encoder::keep`], which the terminal stage asks after each row; a row
//! refused there is truncated and counted as filtered
//! (`spate_records_filtered_total{reason="filter"}`), and its message still
//! commits (D1, D6).
//!
//! **Semantics** (SQL's, as ClickHouse evaluates a `WHERE` on the stored
//! row): a comparison with a NULL cell is false, whatever the operator
//! (`!=` too), so `unit != "drop"` drops a row whose `unit` is NULL; use
//! `any: [unit is null, unit != "drop"]` to keep them. Floats compare as
//! IEEE 754 (`NaN` is unequal to everything and in no order). Strings and
//! FixedStrings compare bytewise. Enums compare by their numeric value (a
//! constant may name the member). UUIDs take `==`, `!=` and `in` only.
//!
//! **What cannot be filtered** (a [`FilterError`] when the filter is
//! compiled, naming the column): a name that is not an INSERT column (a
//! MATERIALIZED/ALIAS column or a field that feeds no column: filter only
//! what lands), composite columns (Array, Map, Tuple, JSON), a column whose
//! value may be left to the server's per-row DEFAULT (the row does not
//! carry it), `is null` on a non-Nullable column, and a constant the
//! column's type cannot hold.
//!
//! Wire format read: RowBinary and RowBinaryWithDefaults
//! (<https://clickhouse.com/docs/interfaces/formats/RowBinary>,
//! <https://clickhouse.com/docs/interfaces/formats/RowBinaryWithDefaults>).

mod expr;
mod row;
#[cfg(test)]
mod tests;

pub use expr::{CmpOp, Constant, FilterExpr, ParseError};
pub use row::{FilterError, RowFilter};

use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError};
use spate_core::sink::Layout;

use crate::coerce::TimeRules;
use crate::schema::RowFormat;
use crate::spec::ColumnSpec;

/// An encoder that knows the INSERT columns its rows follow, so a
/// [`Filtered`] can (re)compile its filter against them.
pub trait RowColumns {
    /// The INSERT columns of the rows it appends now, in order.
    fn row_columns(&self) -> &[ColumnSpec];

    /// The rows' wire format.
    fn row_format(&self) -> RowFormat;
}

/// An encoder with a row filter: rows are encoded by `E`, then kept only if
/// the filter holds on their bytes ([`Encoder::keep`]). Without a filter it
/// is `E` itself plus one `None` test per row.
///
/// When `E` switches to a new plan ([`Encoder::replan`]) the filter is
/// compiled again against the new columns; should that fail (a live schema
/// change made a constant unrepresentable), every later row is an encode
/// error naming the column, never a row let through unfiltered.
#[derive(Debug)]
pub struct Filtered<E> {
    inner: E,
    expr: Option<FilterExpr>,
    rules: TimeRules,
    filter: Option<RowFilter>,
    broken: Option<FilterError>,
}

impl<E: RowColumns> Filtered<E> {
    /// `inner` with `expr` (none: keep every row) compiled against its
    /// columns; `rules` read time constants as the mapper reads time text.
    ///
    /// # Errors
    /// [`FilterError`] naming the column or constant that does not fit.
    pub fn new(inner: E, expr: Option<FilterExpr>, rules: TimeRules) -> Result<Self, FilterError> {
        let filter = match &expr {
            Some(e) => Some(RowFilter::compile(
                e,
                inner.row_columns(),
                inner.row_format(),
                &rules,
            )?),
            None => None,
        };
        Ok(Self {
            inner,
            expr,
            rules,
            filter,
            broken: None,
        })
    }
}

impl<E> Filtered<E> {
    /// The wrapped encoder.
    pub fn inner(&mut self) -> &mut E {
        &mut self.inner
    }

    /// The compiled filter, if any.
    pub fn filter(&self) -> Option<&RowFilter> {
        self.filter.as_ref()
    }
}

impl<T, E: Encoder<T> + RowColumns> Encoder<T> for Filtered<E> {
    #[inline]
    fn encode(
        &mut self,
        record: &T,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        if let Some(e) = &self.broken {
            return Err(e.record_error());
        }
        self.inner.encode(record, cx, buf)
    }

    #[inline]
    fn keep(&mut self, row: &[u8]) -> bool {
        let kept = match &mut self.filter {
            Some(f) => f.keep(row),
            None => true,
        };
        kept && self.inner.keep(row)
    }

    fn replan(&mut self) -> Option<Layout> {
        let layout = self.inner.replan()?;
        if let Some(e) = &self.expr {
            match RowFilter::compile(
                e,
                self.inner.row_columns(),
                self.inner.row_format(),
                &self.rules,
            ) {
                Ok(f) => {
                    self.filter = Some(f);
                    self.broken = None;
                }
                Err(err) => {
                    tracing::error!(error = %err, "mapping.filter does not fit the new INSERT plan; rows are refused");
                    self.broken = Some(err);
                }
            }
        }
        Some(layout)
    }
}
