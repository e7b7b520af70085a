//! `mapping.explode`, `mapping.filter` and `mapping.defaults`: one record
//! into many rows, which rows are kept, and what a missing field becomes.
//!
//! The YAML shapes (validated at load, errors name the key):
//!
//! ```yaml
//! mapping:
//!   explode: /events            # JSON pointer to an array: one row per element
//!   filter:                     # a predicate, a list (all must hold), or all:/any:
//!     all:
//!       - unit != "drop"
//!       - value >= 0
//!       - any:
//!           - quality is null
//!           - quality in [1, 2]
//!   defaults:
//!     region: unknown           # column -> value for a missing or null field
//! ```
//!
//! A predicate is `COLUMN OP CONSTANT` (`==`, `!=`, `<`, `<=`, `>`, `>=`),
//! `COLUMN in [C, ...]`, `COLUMN is null` or `COLUMN is not null`
//! ([`FilterExpr::parse_predicate`]); what it means, on which value, is in
//! [`spate_row::filter`]. Whether the columns exist and the constants
//! fit their types is checked when the INSERT is planned (`spate check`),
//! naming the column.

use std::collections::BTreeMap;

use serde_norway::Value;
use spate_row::filter::FilterExpr;
use spate_row::spec::parse_pointer;

use super::{ConfigError, MappingSection, invalid};

/// Nesting bound of `all:`/`any:` groups (a config, not an attack surface,
/// but a bound keeps the recursion honest).
const MAX_FILTER_DEPTH: usize = 16;

impl MappingSection {
    /// `mapping.explode` as path segments, if set.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `mapping.explode` for a bad pointer.
    pub fn explode_path(&self) -> Result<Option<Vec<String>>, ConfigError> {
        let Some(p) = &self.explode else {
            return Ok(None);
        };
        let path = parse_pointer(p).map_err(|e| invalid("mapping.explode", e.to_string()))?;
        if path.iter().any(String::is_empty) {
            return Err(invalid(
                "mapping.explode",
                format!("`{p}`: a pointer to a field, like /events"),
            ));
        }
        Ok(Some(path))
    }

    /// `mapping.filter` as a predicate tree, if set.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key of the bad predicate or group
    /// (`mapping.filter.all[1]`).
    pub fn filter_expr(&self) -> Result<Option<FilterExpr>, ConfigError> {
        match &self.filter {
            None | Some(Value::Null) => Ok(None),
            Some(v) => filter_of(v, "mapping.filter", 0).map(Some),
        }
    }

    /// `mapping.defaults` as SQL literals (`'unknown'`, `0`, `-1.5`), the
    /// form [`spate_row::spec::MissingValue::Literal`] takes.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `mapping.defaults.<column>` for a
    /// value that is not a string, number or bool.
    pub fn default_literals(&self) -> Result<BTreeMap<String, String>, ConfigError> {
        self.defaults
            .iter()
            .map(|(col, v)| {
                let key = || format!("mapping.defaults.{col}");
                let lit = match v {
                    Value::String(s) => sql_string(s),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => sql_string(if *b { "true" } else { "false" }),
                    Value::Null => {
                        return Err(invalid(
                            key(),
                            "null is no default: a Nullable column is NULL when its field is \
                             missing already; remove the entry",
                        ));
                    }
                    _ => return Err(invalid(key(), "expected a string, number or bool")),
                };
                Ok((col.clone(), lit))
            })
            .collect()
    }

    /// Checks the three keys' shapes (the plan checks them against the
    /// table).
    pub(super) fn validate_transforms(&self) -> Result<(), ConfigError> {
        let explode = self.explode_path()?;
        self.filter_expr()?;
        self.default_literals()?;
        if let Some(path) = explode {
            for (col, ptr) in &self.columns {
                let p = parse_pointer(ptr).unwrap_or_default();
                if p == path {
                    return Err(invalid(
                        format!("mapping.columns.{col}"),
                        format!(
                            "`{ptr}` is the exploded array itself; point at a field of its \
                             elements (`{ptr}/name`)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `'text'` with `\` and `'` escaped, as the DEFAULT literal reader takes.
fn sql_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' | '\'' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            _ => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn filter_of(v: &Value, key: &str, depth: usize) -> Result<FilterExpr, ConfigError> {
    if depth > MAX_FILTER_DEPTH {
        return Err(invalid(
            key,
            format!("groups nest deeper than {MAX_FILTER_DEPTH} levels"),
        ));
    }
    match v {
        Value::String(text) => {
            FilterExpr::parse_predicate(text).map_err(|e| invalid(key, e.to_string()))
        }
        Value::Sequence(items) => Ok(FilterExpr::All(list_of(items, key, depth)?)),
        Value::Mapping(m) => {
            let mut entries = m.iter();
            let (Some((k, items)), None) = (entries.next(), entries.next()) else {
                return Err(invalid(
                    key,
                    "a group is a map with exactly one key, `all` or `any`, holding a list",
                ));
            };
            let name = k.as_str().unwrap_or_default();
            let sub = format!("{key}.{name}");
            let Value::Sequence(items) = items else {
                return Err(invalid(sub, "expected a list of predicates or groups"));
            };
            match name {
                "all" => Ok(FilterExpr::All(list_of(items, &sub, depth)?)),
                "any" => {
                    if items.is_empty() {
                        return Err(invalid(sub, "an empty `any` keeps no row"));
                    }
                    Ok(FilterExpr::Any(list_of(items, &sub, depth)?))
                }
                other => Err(invalid(
                    sub,
                    format!(
                        "unknown group `{other}`: expected `all` or `any` (a predicate is a \
                         string like `unit != \"drop\"`; quote it if it contains `: ` or ` #`)"
                    ),
                )),
            }
        }
        _ => Err(invalid(
            key,
            "expected a predicate string (`value >= 0`), a list, or an `all:`/`any:` group",
        )),
    }
}

fn list_of(items: &[Value], key: &str, depth: usize) -> Result<Vec<FilterExpr>, ConfigError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| filter_of(v, &format!("{key}[{i}]"), depth + 1))
        .collect()
}
