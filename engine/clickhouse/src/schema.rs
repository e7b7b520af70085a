//! The target table's schema, as the server describes it, and the plan of
//! which columns an INSERT names.
//!
//! [`TableSchema`] holds `system.columns` rows (name, type text, default
//! kind, default expression); [`TableSchema::from_json_each_row`] reads the
//! answer of [`columns_query`]. The writer's schema probe runs that query
//! against a replica ([`crate::writer::HttpWriter::table_schema`]).
//!
//! [`plan_insert`] decides the INSERT column list (D6: nothing is silently
//! filled with a type default):
//!
//! - MATERIALIZED and ALIAS columns are never named (the server refuses them),
//!   nor EPHEMERAL ones.
//! - A column with a DEFAULT is named only when the mapping gives it an
//!   explicit source (a rename or a JSON pointer) or
//!   [`InsertOptions::include_default_columns`] is set; otherwise it is left
//!   to the server, which computes it for every row. When it is named, a row
//!   missing the field gets the DEFAULT if it is a constant literal, NULL if
//!   the column is Nullable, else a record error (RowBinary on 18.16 has no
//!   per-value "use the default" marker; RowBinaryWithDefaults came later).
//! - Every other column is named; a missing field is NULL for Nullable
//!   columns, else a record error.
//! - A named column whose type string does not parse (a type this crate
//!   cannot encode) stops the plan with an error naming column and type.
//!
//! The INSERT always names its columns, so a column added to the table while
//! spate runs does not shift bytes.

use std::collections::BTreeMap;

use crate::mapping::{ColumnSpec, MissingValue, parse_pointer};
use crate::types::{ChType, TypeParseError};

/// How a column's value is produced when an INSERT does not give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultKind {
    /// No default: the type's zero value if omitted (we never omit such a column).
    None,
    /// `DEFAULT expr`.
    Default,
    /// `MATERIALIZED expr`: never inserted.
    Materialized,
    /// `ALIAS expr`: not stored, never inserted.
    Alias,
    /// `EPHEMERAL`: insert-only helper columns; not named by spate.
    Ephemeral,
}

impl DefaultKind {
    /// Reads `system.columns.default_kind` (empty means none).
    pub fn parse(s: &str) -> Option<DefaultKind> {
        Some(match s {
            "" => DefaultKind::None,
            "DEFAULT" => DefaultKind::Default,
            "MATERIALIZED" => DefaultKind::Materialized,
            "ALIAS" => DefaultKind::Alias,
            "EPHEMERAL" => DefaultKind::Ephemeral,
            _ => return None,
        })
    }
}

/// One row of `system.columns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableColumn {
    /// Column name.
    pub name: String,
    /// Type as the server prints it.
    pub type_text: String,
    /// Default kind.
    pub default_kind: DefaultKind,
    /// Default expression text (empty when none).
    pub default_expression: String,
}

/// A table's columns in table order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSchema {
    /// Database name.
    pub database: String,
    /// Table name.
    pub table: String,
    /// Columns in table order.
    pub columns: Vec<TableColumn>,
}

/// A schema probe or plan that failed.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The table has no columns: it does not exist (system.columns is empty).
    #[error("table {database}.{table} does not exist (no rows in system.columns)")]
    NoSuchTable {
        /// Database.
        database: String,
        /// Table.
        table: String,
    },
    /// The server's answer did not parse.
    #[error("cannot read system.columns answer: {0}")]
    BadAnswer(String),
    /// A column the INSERT would name has a type this crate cannot encode.
    #[error("column `{column}` has type `{type_text}`, which spate cannot encode: {source}")]
    UnsupportedType {
        /// The column.
        column: String,
        /// Its type text.
        type_text: String,
        /// The parser's error.
        #[source]
        source: TypeParseError,
    },
    /// A rename or pointer names a column the table lacks.
    #[error("mapping names column `{0}`, which the table does not have")]
    UnknownColumn(String),
    /// A rename or pointer targets a column the INSERT cannot name.
    #[error("mapping gives a source to column `{0}`, which is {1:?} and cannot be inserted")]
    NotInsertable(String, DefaultKind),
    /// A bad JSON pointer.
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
}

/// Quotes an identifier for ClickHouse SQL: back quotes, with `` ` `` and `\`
/// escaped by a backslash.
pub fn quote_ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('`');
    for c in name.chars() {
        if c == '`' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('`');
    out
}

/// Quotes a string literal for ClickHouse SQL: single quotes, with `'` and
/// `\` escaped by a backslash.
pub fn quote_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// The query whose JSONEachRow answer [`TableSchema::from_json_each_row`]
/// reads. Works on 18.16 (which has `default_kind` and `default_expression`).
pub fn columns_query(database: &str, table: &str) -> String {
    format!(
        "SELECT name, type, default_kind, default_expression FROM system.columns \
         WHERE database = {} AND table = {} FORMAT JSONEachRow",
        quote_literal(database),
        quote_literal(table)
    )
}

impl TableSchema {
    /// Reads the JSONEachRow answer of [`columns_query`]. Table order is the
    /// answer's order (system.columns lists columns in table order).
    ///
    /// # Errors
    /// [`SchemaError::NoSuchTable`] for an empty answer,
    /// [`SchemaError::BadAnswer`] for lines that do not parse.
    pub fn from_json_each_row(
        database: &str,
        table: &str,
        body: &str,
    ) -> Result<Self, SchemaError> {
        let mut columns = Vec::new();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| SchemaError::BadAnswer(format!("{e}: {line}")))?;
            let field = |k: &str| {
                v.get(k)
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| SchemaError::BadAnswer(format!("no string `{k}` in {line}")))
            };
            let kind_text = field("default_kind")?;
            columns.push(TableColumn {
                name: field("name")?,
                type_text: field("type")?,
                default_kind: DefaultKind::parse(&kind_text).ok_or_else(|| {
                    SchemaError::BadAnswer(format!("unknown default_kind `{kind_text}`"))
                })?,
                default_expression: field("default_expression")?,
            });
        }
        if columns.is_empty() {
            return Err(SchemaError::NoSuchTable {
                database: database.to_owned(),
                table: table.to_owned(),
            });
        }
        Ok(TableSchema {
            database: database.to_owned(),
            table: table.to_owned(),
            columns,
        })
    }
}

/// How the mapping sources columns (the parts the INSERT plan needs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InsertOptions {
    /// Column -> top-level JSON field, for fields named unlike their column.
    pub renames: BTreeMap<String, String>,
    /// Column -> JSON pointer (`/properties/mag`).
    pub pointers: BTreeMap<String, String>,
    /// Name DEFAULT columns in the INSERT even without an explicit source
    /// (read from the field of their name; a missing field then needs a
    /// constant DEFAULT or Nullable).
    pub include_default_columns: bool,
}

/// Plans the INSERT: the columns it names, in table order, with their JSON
/// sources and missing-value rules (see the module docs).
///
/// # Errors
/// [`SchemaError`] for a type that cannot be encoded, a source for an
/// unknown or non-insertable column, or a bad pointer.
pub fn plan_insert(
    schema: &TableSchema,
    options: &InsertOptions,
) -> Result<Vec<ColumnSpec>, SchemaError> {
    for name in options.renames.keys().chain(options.pointers.keys()) {
        match schema.columns.iter().find(|c| &c.name == name) {
            None => return Err(SchemaError::UnknownColumn(name.clone())),
            Some(c) if !matches!(c.default_kind, DefaultKind::None | DefaultKind::Default) => {
                return Err(SchemaError::NotInsertable(name.clone(), c.default_kind));
            }
            Some(_) => {}
        }
    }
    let mut out = Vec::new();
    for c in &schema.columns {
        let path = match (options.pointers.get(&c.name), options.renames.get(&c.name)) {
            (Some(p), _) => Some(parse_pointer(p)?),
            (None, Some(field)) => Some(vec![field.clone()]),
            (None, None) => None,
        };
        let named = match c.default_kind {
            DefaultKind::None => true,
            DefaultKind::Default => path.is_some() || options.include_default_columns,
            DefaultKind::Materialized | DefaultKind::Alias | DefaultKind::Ephemeral => false,
        };
        if !named {
            continue;
        }
        let ty = ChType::parse(&c.type_text).map_err(|source| SchemaError::UnsupportedType {
            column: c.name.clone(),
            type_text: c.type_text.clone(),
            source,
        })?;
        let missing = if c.default_kind == DefaultKind::Default
            && is_constant_literal(&c.default_expression)
        {
            MissingValue::Literal(c.default_expression.clone())
        } else if ty.is_nullable() {
            MissingValue::Null
        } else {
            MissingValue::Reject
        };
        out.push(ColumnSpec {
            name: c.name.clone(),
            ty,
            path,
            missing,
        });
    }
    Ok(out)
}

/// Whether a default expression is a literal we can encode once: a number
/// or a single-quoted string.
fn is_constant_literal(expr: &str) -> bool {
    let e = expr.trim();
    (e.len() >= 2 && e.starts_with('\'') && e.ends_with('\''))
        || (!e.is_empty() && crate::num::DecimalText::parse(e.as_bytes()).is_ok())
}

/// The INSERT statement for `columns` of `database.table` in RowBinary.
pub fn insert_statement(database: &str, table: &str, columns: &[ColumnSpec]) -> String {
    let cols: Vec<String> = columns.iter().map(|c| quote_ident(&c.name)).collect();
    format!(
        "INSERT INTO {}.{} ({}) FORMAT RowBinary",
        quote_ident(database),
        quote_ident(table),
        cols.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> TableSchema {
        let body = r#"{"name":"id","type":"UInt64","default_kind":"","default_expression":""}
{"name":"mag","type":"Nullable(Float64)","default_kind":"","default_expression":""}
{"name":"status","type":"String","default_kind":"DEFAULT","default_expression":"'n/a'"}
{"name":"ingested","type":"DateTime","default_kind":"DEFAULT","default_expression":"now()"}
{"name":"day","type":"Date","default_kind":"MATERIALIZED","default_expression":"toDate(ingested)"}
{"name":"weird","type":"AggregateFunction(uniq, String)","default_kind":"ALIAS","default_expression":"x"}
"#;
        TableSchema::from_json_each_row("db", "t", body).unwrap()
    }

    #[test]
    fn default_columns_are_left_to_the_server_unless_sourced() {
        let plan = plan_insert(&schema(), &InsertOptions::default()).unwrap();
        let names: Vec<_> = plan.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "mag"]);
        assert_eq!(plan[0].missing, MissingValue::Reject);
        assert_eq!(plan[1].missing, MissingValue::Null);

        let mut opts = InsertOptions::default();
        opts.renames.insert("status".into(), "state".into());
        let plan = plan_insert(&schema(), &opts).unwrap();
        let names: Vec<_> = plan.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "mag", "status"]);
        assert_eq!(plan[2].path, Some(vec!["state".to_string()]));
        assert_eq!(plan[2].missing, MissingValue::Literal("'n/a'".into()));

        let opts = InsertOptions {
            include_default_columns: true,
            ..InsertOptions::default()
        };
        let plan = plan_insert(&schema(), &opts).unwrap();
        assert_eq!(plan.len(), 4);
        assert_eq!(
            plan[3].missing,
            MissingValue::Reject,
            "now() is not a constant"
        );
    }

    #[test]
    fn plan_errors_name_the_column() {
        let mut opts = InsertOptions::default();
        opts.pointers.insert("nope".into(), "/a".into());
        assert!(
            matches!(plan_insert(&schema(), &opts), Err(SchemaError::UnknownColumn(c)) if c == "nope")
        );
        let mut opts = InsertOptions::default();
        opts.renames.insert("day".into(), "d".into());
        assert!(matches!(
            plan_insert(&schema(), &opts),
            Err(SchemaError::NotInsertable(..))
        ));

        let body = r#"{"name":"j","type":"Dynamic","default_kind":"","default_expression":""}"#;
        let s = TableSchema::from_json_each_row("db", "t", body).unwrap();
        let e = plan_insert(&s, &InsertOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`j`") && msg.contains("`Dynamic`"), "{msg}");
        assert!(matches!(
            TableSchema::from_json_each_row("db", "t", "\n"),
            Err(SchemaError::NoSuchTable { .. })
        ));
    }

    #[test]
    fn statements_quote_names() {
        let plan = plan_insert(&schema(), &InsertOptions::default()).unwrap();
        assert_eq!(
            insert_statement("d b", "t`x", &plan),
            "INSERT INTO `d b`.`t\\`x` (`id`, `mag`) FORMAT RowBinary"
        );
        assert_eq!(
            columns_query("db", "it's"),
            "SELECT name, type, default_kind, default_expression FROM system.columns \
             WHERE database = 'db' AND table = 'it\\'s' FORMAT JSONEachRow"
        );
    }
}
