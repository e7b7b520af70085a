//! Schema change detection: is the table still what the INSERT was planned
//! for?
//!
//! The writer knows the INSERT's columns and the type text each had when
//! the plan was made ([`super::HttpWriterConfig::columns`]). It re-reads
//! `system.columns` every [`super::HttpWriterConfig::schema_refresh`]
//! before an insert, and at once when an insert fails with an error that
//! means "the table is not what the bytes say" ([`super::SCHEMA_CHANGE_CODES`]).
//! [`compare`] then decides:
//!
//! - a planned column gone, or its type text changed: the plan is stale.
//!   With a live plan the writer re-plans when every old value carries
//!   (ADR 0005, `HttpWriter::replan`); otherwise the batch fails fatally
//!   with an error naming the table and the old and new types, so no row is
//!   written under the old plan once the change is known; its acks fail,
//!   the watermark freezes (D1) and the process exits non-zero; a restart
//!   re-plans against the new schema and replays from the last commit.
//! - columns added that the INSERT does not name: the plan still writes
//!   correct rows (the INSERT names its columns). With a live plan the
//!   writer re-plans so that they are filled from the records; without
//!   one the run goes on and the new column gets its DEFAULT (or its
//!   type's default) until a restart re-plans.
//!
//! Either way the old and new column lists are logged at INFO once per
//! change ([`SchemaWatch::observe`]).

use std::sync::Mutex;

use spate_row::schema::{DefaultKind, TableSchema};

/// What a re-read of the table's columns found, against the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaVerdict {
    /// Every planned column is there with its planned type.
    Unchanged,
    /// The plan still writes correct rows; these columns the INSERT does not
    /// name were added (name, type text).
    Added(Vec<(String, String)>),
    /// A planned column is gone or has another type: (column, planned type,
    /// type now or `None` when gone).
    Stale(Vec<(String, String, Option<String>)>),
}

/// Compares the INSERT's planned `(name, type text)` columns with `schema`.
pub fn compare(planned: &[(String, String)], schema: &TableSchema) -> SchemaVerdict {
    let mut stale = Vec::new();
    for (name, ty) in planned {
        match schema.columns.iter().find(|c| &c.name == name) {
            None => stale.push((name.clone(), ty.clone(), None)),
            Some(c) if &c.type_text != ty => {
                stale.push((name.clone(), ty.clone(), Some(c.type_text.clone())));
            }
            Some(_) => {}
        }
    }
    if !stale.is_empty() {
        return SchemaVerdict::Stale(stale);
    }
    // MATERIALIZED, ALIAS and EPHEMERAL columns are never named by an
    // INSERT (the server computes them): a table that has them is not one
    // with columns the INSERT misses, and a restart would plan the same.
    let added: Vec<(String, String)> = schema
        .columns
        .iter()
        .filter(|c| {
            !matches!(
                c.default_kind,
                DefaultKind::Materialized | DefaultKind::Alias | DefaultKind::Ephemeral
            )
        })
        .filter(|c| !planned.iter().any(|(n, _)| n == &c.name))
        .map(|c| (c.name.clone(), c.type_text.clone()))
        .collect();
    if added.is_empty() {
        SchemaVerdict::Unchanged
    } else {
        SchemaVerdict::Added(added)
    }
}

/// The error text for a stale plan: names the table and each column's
/// planned and current type.
pub fn stale_message(schema: &TableSchema, stale: &[(String, String, Option<String>)]) -> String {
    let changes: Vec<String> = stale
        .iter()
        .map(|(name, was, now)| match now {
            Some(now) => {
                format!("column `{name}` was {was} when the INSERT was planned, is now {now}")
            }
            None => format!("column `{name}` ({was}) is gone"),
        })
        .collect();
    format!(
        "table {}.{} changed while spate runs: {}; no row is written under the old plan: \
         this batch fails, its offsets are not committed, and a restart re-plans the INSERT \
         against the new schema and replays them",
        schema.database,
        schema.table,
        changes.join("; ")
    )
}

/// Renders columns as `name Type, ...` for the INFO log.
pub(crate) fn column_list<'a>(cols: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    cols.map(|(n, t)| format!("{n} {t}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The last column list seen, so each change is logged once.
#[derive(Debug, Default)]
pub struct SchemaWatch {
    last: Mutex<Option<Vec<(String, String)>>>,
}

impl SchemaWatch {
    /// Records `schema` as seen; logs the old and new column lists at INFO
    /// when they differ from the last seen (or, the first time, from the
    /// planned columns).
    /// With `live`, the writer re-plans added columns itself (no warning
    /// that they wait for a restart).
    pub fn observe(&self, planned: &[(String, String)], schema: &TableSchema, live: bool) {
        let now: Vec<(String, String)> = schema
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.type_text.clone()))
            .collect();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let before = last.as_deref().unwrap_or(planned);
        let changed = match last.as_deref() {
            Some(l) => l != now.as_slice(),
            None => compare(planned, schema) != SchemaVerdict::Unchanged,
        };
        if changed {
            tracing::info!(
                table = %format!("{}.{}", schema.database, schema.table),
                "table columns changed: before [{}], now [{}]",
                column_list(before.iter().map(|(n, t)| (n.as_str(), t.as_str()))),
                column_list(now.iter().map(|(n, t)| (n.as_str(), t.as_str())))
            );
            if let (false, SchemaVerdict::Added(added)) = (live, compare(planned, schema)) {
                tracing::warn!(
                    "table {}.{} has columns this run's INSERT does not name: [{}]; they get \
                     their DEFAULT (or their type's default) until spate restarts and re-plans",
                    schema.database,
                    schema.table,
                    column_list(added.iter().map(|(n, t)| (n.as_str(), t.as_str())))
                );
            }
        }
        *last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(cols: &[(&str, &str)]) -> TableSchema {
        let body: String = cols
            .iter()
            .map(|(n, t)| {
                format!(
                    "{{\"name\":\"{n}\",\"type\":\"{t}\",\"default_kind\":\"\",\"default_expression\":\"\"}}\n"
                )
            })
            .collect();
        TableSchema::from_json_each_row("db", "m", &body).unwrap()
    }

    fn planned() -> Vec<(String, String)> {
        vec![
            ("id".into(), "UInt64".into()),
            ("x".into(), "UInt32".into()),
        ]
    }

    #[test]
    fn a_changed_or_missing_planned_column_makes_the_plan_stale() {
        let p = planned();
        assert_eq!(
            compare(&p, &schema(&[("id", "UInt64"), ("x", "UInt32")])),
            SchemaVerdict::Unchanged
        );
        let s = schema(&[("id", "UInt64"), ("x", "UInt64")]);
        let SchemaVerdict::Stale(stale) = compare(&p, &s) else {
            panic!("stale expected")
        };
        assert_eq!(
            stale,
            [("x".into(), "UInt32".into(), Some("UInt64".into()))]
        );
        let msg = stale_message(&s, &stale);
        assert!(
            msg.contains("db.m") && msg.contains("`x` was UInt32") && msg.contains("now UInt64"),
            "{msg}"
        );
        let s = schema(&[("id", "UInt64"), ("x", "Nullable(UInt32)")]);
        assert!(matches!(compare(&p, &s), SchemaVerdict::Stale(_)));
        let s = schema(&[("id", "UInt64")]);
        let SchemaVerdict::Stale(stale) = compare(&p, &s) else {
            panic!("stale expected")
        };
        assert!(stale_message(&s, &stale).contains("`x` (UInt32) is gone"));
    }

    #[test]
    fn an_added_column_keeps_the_plan() {
        let s = schema(&[("id", "UInt64"), ("x", "UInt32"), ("z", "String")]);
        assert_eq!(
            compare(&planned(), &s),
            SchemaVerdict::Added(vec![("z".into(), "String".into())])
        );
    }

    /// Computed columns are never in the INSERT, so they are not "added"
    /// columns waiting for a restart (the warning a new user met on every
    /// start of the sensor example's MATERIALIZED name_upper/value_scaled).
    #[test]
    fn computed_columns_are_not_added_columns() {
        let body = "{\"name\":\"id\",\"type\":\"UInt64\",\"default_kind\":\"\",\"default_expression\":\"\"}\n\
                    {\"name\":\"x\",\"type\":\"UInt32\",\"default_kind\":\"\",\"default_expression\":\"\"}\n\
                    {\"name\":\"up\",\"type\":\"String\",\"default_kind\":\"MATERIALIZED\",\"default_expression\":\"upper(s)\"}\n\
                    {\"name\":\"al\",\"type\":\"UInt64\",\"default_kind\":\"ALIAS\",\"default_expression\":\"x * 2\"}\n";
        let s = TableSchema::from_json_each_row("db", "m", body).unwrap();
        assert_eq!(compare(&planned(), &s), SchemaVerdict::Unchanged);
    }
}
