//! Re-sealing: a sealed batch's RowBinary rows, encoded under one INSERT
//! plan, carried over to the table's new columns when every value keeps its
//! meaning exactly (issue 19 item 1, "live re-plan"; ADR 0005).
//!
//! A [`Carry`] is planned once per pair of layouts ([`Carry::plan`]) and
//! applied to a batch's bytes ([`Carry::apply`]), a pure function of them:
//! the re-sealed batch is a new immutable batch whose every attempt sends
//! the same bytes (D4). Each value is delimited by the Native transcoder's
//! own RowBinary reader ([`Builder::read`]), so re-seal and transcode agree
//! on where a value ends.
//!
//! What carries exactly, column by column (old type -> new type):
//! - the same type; `T` <-> `LowCardinality(T)` (RowBinary is the same);
//! - a wider integer of the same signedness, or unsigned into a wider
//!   signed one (`UInt32 -> UInt64`, `UInt32 -> Int64`, `Int8 -> Int32`):
//!   zero or sign extension; `Float32 -> Float64` (every f32 is an f64);
//! - `T -> Nullable(U)` where `T` carries into `U` (no row is NULL), and
//!   `Nullable(T) -> Nullable(U)` likewise;
//! - a column dropped from the table: its values are not written (the
//!   table no longer has them: the table's choice), and named in the log;
//! - a column added that the old rows lack: left out of the re-sealed
//!   INSERT, so the server gives it its DEFAULT, as it did for the rows
//!   already in the table when the column was added; only where the plan
//!   would give a record without the field a value too (a DEFAULT, or
//!   NULL). A column added without one would make such a record an error,
//!   and a row encoded before the change cannot say whether its record had
//!   the field: not carried.
//!
//! Everything else (narrowing, signed into unsigned, String into a number,
//! a Nullable made non-Nullable, a time zone or scale changed, Array or
//! Tuple element types changed, rows with per-row DEFAULT markers) is not
//! exact: [`Carry::plan`] says which column and why, and the batch fails
//! as before the live re-plan existed. Never a value that changes meaning.

use crate::native::column::{Builder, ColumnError};
use spate_row::rowbinary::int_shape;
use spate_row::types::ChType;

/// How one old column's value becomes the new column's.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// The bytes as they are.
    Copy,
    /// A little-endian integer of `from` bytes extended to `to` bytes, with
    /// its sign bit when `signed`.
    Widen {
        from: usize,
        to: usize,
        signed: bool,
    },
    /// An f32 as the same f64.
    Float32To64,
    /// A not-NULL flag, then the inner step.
    WrapNullable(Box<Step>),
    /// The null flag as it is; a value after a 0 flag by the inner step.
    InNullable(Box<Step>),
    /// Not written (the column was dropped).
    Drop,
}

/// Why an old column does not carry into the new table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotCarried {
    /// The column.
    pub column: String,
    /// Its type in the old layout (`None`: it is new).
    pub was: Option<String>,
    /// Its type in the new table (`None`: dropped).
    pub now: Option<String>,
    /// Why not, in words.
    pub why: &'static str,
}

impl std::fmt::Display for NotCarried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.was, &self.now) {
            (Some(was), Some(now)) => write!(
                f,
                "column `{}` was {was} when the INSERT was planned, is now {now} ({})",
                self.column, self.why
            ),
            (None, Some(now)) => write!(
                f,
                "column `{}` ({now}) was added ({})",
                self.column, self.why
            ),
            (Some(was), None) => {
                write!(f, "column `{}` ({was}) is gone ({})", self.column, self.why)
            }
            (None, None) => write!(f, "column `{}` ({})", self.column, self.why),
        }
    }
}

/// A planned re-seal from one layout's columns to the table's new ones.
#[derive(Clone, Debug)]
pub struct Carry {
    /// Per old column: its reader (delimits one value) and its step.
    columns: Vec<(String, String, Builder, Step)>,
    /// The re-sealed INSERT's columns: the old ones still in the table, in
    /// old order, with the new type text.
    output: Vec<(String, String)>,
    /// Old columns gone from the table: (name, old type text).
    dropped: Vec<(String, String)>,
}

/// The step that carries a value of `from` into `to` exactly, if any.
fn step(from: &ChType, to: &ChType) -> Option<Step> {
    if from == to {
        return Some(Step::Copy);
    }
    match (from, to) {
        // RowBinary writes LowCardinality(T) as T.
        (ChType::LowCardinality(f), t) => return step(f, t),
        (f, ChType::LowCardinality(t)) => return step(f, t),
        (ChType::Nullable(f), ChType::Nullable(t)) => {
            return step(f, t).map(|s| Step::InNullable(Box::new(s)));
        }
        (ChType::Nullable(_), _) => return None,
        (f, ChType::Nullable(t)) => return step(f, t).map(|s| Step::WrapNullable(Box::new(s))),
        (ChType::Float32, ChType::Float64) => return Some(Step::Float32To64),
        _ => {}
    }
    let (fb, fs) = int_shape(from)?;
    let (tb, ts) = int_shape(to)?;
    // Same signedness and wider, or unsigned into a wider signed type.
    (tb > fb && (fs == ts || (!fs && ts))).then_some(Step::Widen {
        from: fb as usize / 8,
        to: tb as usize / 8,
        signed: fs,
    })
}

impl Carry {
    /// Plans the re-seal of rows of `from` (`(name, type text)` in row
    /// order, plain RowBinary) into a table whose INSERT columns are now
    /// `to`; `added_has_value(name)` says whether the new plan gives a
    /// record without column `name`'s field a value (a DEFAULT or NULL).
    ///
    /// # Errors
    /// Every column that does not carry exactly ([`NotCarried`]).
    pub fn plan(
        from: &[(String, String)],
        to: &[(String, String)],
        added_has_value: impl Fn(&str) -> bool,
    ) -> Result<Carry, Vec<NotCarried>> {
        let mut refused = Vec::new();
        let mut columns = Vec::with_capacity(from.len());
        let mut output = Vec::new();
        let mut dropped = Vec::new();
        for (name, was) in from {
            let not = |now: Option<&String>, why| NotCarried {
                column: name.clone(),
                was: Some(was.clone()),
                now: now.cloned(),
                why,
            };
            let Ok(from_ty) = ChType::parse(was) else {
                refused.push(not(None, "its old type does not parse"));
                continue;
            };
            let Ok(reader) = Builder::new(&from_ty) else {
                refused.push(not(None, "no RowBinary reader for its old type"));
                continue;
            };
            let Some((_, now)) = to.iter().find(|(n, _)| n == name) else {
                dropped.push((name.clone(), was.clone()));
                columns.push((name.clone(), was.clone(), reader, Step::Drop));
                continue;
            };
            let s = ChType::parse(now)
                .ok()
                .and_then(|to_ty| step(&from_ty, &to_ty));
            match s {
                Some(s) => {
                    columns.push((name.clone(), was.clone(), reader, s));
                    output.push((name.clone(), now.clone()));
                }
                None => refused.push(not(
                    Some(now),
                    "not an exact widening: an old value could change meaning",
                )),
            }
        }
        for (name, now) in to {
            if !from.iter().any(|(n, _)| n == name) && !added_has_value(name) {
                refused.push(NotCarried {
                    column: name.clone(),
                    was: None,
                    now: Some(now.clone()),
                    why: "without a DEFAULT: a row encoded before the change cannot say \
                          whether its record had the field",
                });
            }
        }
        if !refused.is_empty() {
            return Err(refused);
        }
        if output.is_empty() {
            refused.push(NotCarried {
                column: from
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                was: None,
                now: None,
                why: "every column of the old rows is gone from the table",
            });
            return Err(refused);
        }
        Ok(Carry {
            columns,
            output,
            dropped,
        })
    }

    /// The re-sealed INSERT's `(name, new type text)` columns.
    pub fn output(&self) -> &[(String, String)] {
        &self.output
    }

    /// Old columns the table dropped: their values are not written.
    pub fn dropped(&self) -> &[(String, String)] {
        &self.dropped
    }

    /// Whether every old column is written unchanged (only added columns
    /// differ, or nothing).
    pub fn is_identity(&self) -> bool {
        self.columns.iter().all(|c| c.3 == Step::Copy)
    }

    /// Re-encodes whole RowBinary rows of the old layout (`segments`) as
    /// rows of [`Carry::output`], appended to `out`; returns the rows.
    /// Deterministic (D4).
    ///
    /// # Errors
    /// [`super::NativeError::Malformed`] when the bytes are not whole rows
    /// of the old layout.
    pub fn apply<'a>(
        &self,
        segments: impl IntoIterator<Item = &'a [u8]>,
        out: &mut Vec<u8>,
    ) -> Result<u64, super::NativeError> {
        let mut readers: Vec<Builder> = self.columns.iter().map(|c| c.2.clone()).collect();
        let mut rows = 0u64;
        for segment in segments {
            let mut input = segment;
            while !input.is_empty() {
                for (i, reader) in readers.iter_mut().enumerate() {
                    let before = input;
                    reader.read(&mut input).map_err(|e| {
                        let (name, was, ..) = &self.columns[i];
                        super::NativeError::Malformed {
                            row: rows,
                            column: name.clone(),
                            type_text: was.clone(),
                            reason: match e {
                                ColumnError::Malformed(r) => r,
                                ColumnError::Unsupported(_) => "unsupported type",
                            },
                        }
                    })?;
                    // The reader only delimits the value: keep no copy.
                    reader.clear();
                    let raw = &before[..before.len() - input.len()];
                    put(&self.columns[i].3, raw, out);
                }
                rows += 1;
            }
        }
        Ok(rows)
    }
}

/// Writes one value's `raw` RowBinary bytes through `step`.
fn put(step: &Step, raw: &[u8], out: &mut Vec<u8>) {
    match step {
        Step::Copy => out.extend_from_slice(raw),
        Step::Drop => {}
        Step::Widen { from, to, signed } => {
            debug_assert_eq!(raw.len(), *from, "an integer of its width");
            out.extend_from_slice(raw);
            let negative = *signed && raw[from - 1] & 0x80 != 0;
            out.resize(out.len() + (to - from), if negative { 0xff } else { 0 });
        }
        Step::Float32To64 => {
            let v = f32::from_le_bytes(raw.try_into().expect("4 bytes"));
            out.extend_from_slice(&f64::from(v).to_le_bytes());
        }
        Step::WrapNullable(inner) => {
            out.push(0);
            put(inner, raw, out);
        }
        Step::InNullable(inner) => {
            out.push(raw[0]);
            if raw[0] == 0 {
                put(inner, &raw[1..], out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_row::types::ChType;

    fn cols(c: &[(&str, &str)]) -> Vec<(String, String)> {
        c.iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    fn carry(from: &[(&str, &str)], to: &[(&str, &str)]) -> Result<Carry, Vec<NotCarried>> {
        Carry::plan(&cols(from), &cols(to), |_| true)
    }

    #[test]
    fn widening_and_nullable_carry_every_value_exactly() {
        let c = carry(
            &[
                ("id", "UInt64"),
                ("x", "UInt32"),
                ("n", "Int8"),
                ("f", "Float32"),
            ],
            &[
                ("id", "UInt64"),
                ("x", "UInt64"),
                ("n", "Nullable(Int32)"),
                ("f", "Float64"),
            ],
        )
        .unwrap();
        let mut rows = Vec::new();
        rows.extend_from_slice(&7u64.to_le_bytes());
        rows.extend_from_slice(&u32::MAX.to_le_bytes());
        rows.extend_from_slice(&(-2i8).to_le_bytes());
        rows.extend_from_slice(&1.5f32.to_le_bytes());
        let mut out = Vec::new();
        assert_eq!(c.apply([&rows[..]], &mut out).unwrap(), 1);
        let mut want = Vec::new();
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&u64::from(u32::MAX).to_le_bytes());
        want.push(0);
        want.extend_from_slice(&(-2i32).to_le_bytes());
        want.extend_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(out, want);
        assert!(!c.is_identity());
    }

    #[test]
    fn a_dropped_column_is_skipped_and_named() {
        let c = carry(
            &[("id", "UInt64"), ("s", "String"), ("y", "UInt32")],
            &[("id", "UInt64"), ("y", "UInt32")],
        )
        .unwrap();
        assert_eq!(c.dropped(), cols(&[("s", "String")]));
        assert_eq!(c.output(), cols(&[("id", "UInt64"), ("y", "UInt32")]));
        let mut rows = Vec::new();
        for i in 0..2u64 {
            rows.extend_from_slice(&i.to_le_bytes());
            rows.extend_from_slice(&[3, b'a', b'b', b'c']);
            rows.extend_from_slice(&(10 + i as u32).to_le_bytes());
        }
        let mut out = Vec::new();
        assert_eq!(c.apply([&rows[..]], &mut out).unwrap(), 2);
        let mut want = Vec::new();
        for i in 0..2u64 {
            want.extend_from_slice(&i.to_le_bytes());
            want.extend_from_slice(&(10 + i as u32).to_le_bytes());
        }
        assert_eq!(out, want);
    }

    #[test]
    fn nothing_that_could_change_meaning_carries() {
        for (was, now) in [
            ("UInt64", "UInt32"),
            ("Int32", "UInt64"),
            ("UInt64", "Int64"),
            ("String", "UInt32"),
            ("UInt32", "String"),
            ("Nullable(UInt32)", "UInt32"),
            ("Float64", "Float32"),
            ("DateTime", "DateTime('UTC')"),
            ("Array(UInt32)", "Array(UInt64)"),
            ("Decimal(9, 2)", "Decimal(18, 4)"),
        ] {
            let e = carry(&[("x", was)], &[("x", now)]).unwrap_err();
            assert_eq!(e.len(), 1, "{was} -> {now}");
            assert!(e[0].to_string().contains(&format!("was {was}")), "{}", e[0]);
            assert!(e[0].to_string().contains(&format!("now {now}")), "{}", e[0]);
        }
        let ok = |was: &str, now: &str| carry(&[("x", was)], &[("x", now)]).is_ok();
        assert!(ok("UInt8", "Int16"));
        assert!(ok("Nullable(UInt32)", "Nullable(UInt64)"));
        assert!(ok("String", "LowCardinality(String)"));
        assert!(ok("LowCardinality(String)", "String"));
        let _ = ChType::parse("UInt8").unwrap();
    }

    #[test]
    fn an_added_column_carries_only_where_a_record_without_it_has_a_value() {
        let from = cols(&[("id", "UInt64")]);
        let to = cols(&[("id", "UInt64"), ("z", "UInt32")]);
        let c = Carry::plan(&from, &to, |n| n == "z").unwrap();
        assert_eq!(c.output(), from, "z is left to the server's DEFAULT");
        assert!(c.is_identity());
        let e = Carry::plan(&from, &to, |_| false).unwrap_err();
        assert!(
            e[0].to_string()
                .contains("`z` (UInt32) was added (without a DEFAULT"),
            "{}",
            e[0]
        );
    }

    #[test]
    fn negative_integers_are_sign_extended() {
        let c = carry(&[("x", "Int16")], &[("x", "Int64")]).unwrap();
        let mut out = Vec::new();
        c.apply([&(-300i16).to_le_bytes()[..]], &mut out).unwrap();
        assert_eq!(out, (-300i64).to_le_bytes());
        let mut out = Vec::new();
        let c = carry(&[("x", "UInt16")], &[("x", "Int64")]).unwrap();
        c.apply([&u16::MAX.to_le_bytes()[..]], &mut out).unwrap();
        assert_eq!(out, i64::from(u16::MAX).to_le_bytes());
    }
}
