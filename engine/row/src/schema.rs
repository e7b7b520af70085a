//! The target table's schema, as the server describes it, and the plan of
//! which columns an INSERT names.
//!
//! [`TableSchema`] holds `system.columns` rows (name, type text, default
//! kind, default expression); [`TableSchema::from_json_each_row`] reads the
//! answer of [`columns_query`]. The writer's schema probe runs that query
//! against a replica (spate-clickhouse's `HttpWriter::table_schema`).
//!
//! [`plan_insert`] decides the INSERT column list (D6: nothing is silently
//! filled with a type default):
//!
//! - MATERIALIZED and ALIAS columns are never named (the server refuses them),
//!   nor EPHEMERAL ones.
//! - A column with a DEFAULT is always named (a field present in the record
//!   lands: issue 19). A row missing the field (or with `null` in a
//!   non-Nullable column) gets:
//!   - the DEFAULT written by spate when it is a constant: a number, a
//!     quoted string, `NULL`, or such a literal inside `CAST(lit, 'Type')`
//!     where `Type` is the column's type (18.16 shows `UInt32 DEFAULT 0`
//!     as `CAST(0, 'UInt32')`); the literal must encode as the column's
//!     type, else the plan fails naming the column;
//!   - otherwise (a per-row DEFAULT such as `now()` or `id + 1`) the
//!     server's DEFAULT through `RowBinaryWithDefaults`'s per-cell marker
//!     when the server accepts that format
//!     ([`InsertOptions::server_defaults`], probed in `system.formats`;
//!     <https://clickhouse.com/docs/interfaces/formats/RowBinaryWithDefaults>);
//!   - else a record error under `on_error` ([`MissingValue::Reject`], also
//!     for a Nullable column: NULL would not be the DEFAULT). Such columns
//!     are listed by [`per_row_defaults_refused`] so the caller says so at
//!     start.
//! - Every other column is named; a missing field is NULL for Nullable
//!   columns, else a record error.
//! - A column named like a Kafka metadata source (`_offset`, `_key`,
//!   `_headers`, ...: [`crate::meta`]) takes that source, unless
//!   `renames` maps it to a record field; `pointers` may also name a
//!   source (`{col: _offset}`). Its type must hold the source's values
//!   ([`MetaSource::check_type`]), else the plan fails naming the column.
//! - A named column whose type string does not parse (a type this crate
//!   cannot encode) stops the plan with an error naming column and type.
//!
//! The INSERT always names its columns, so a column added to the table while
//! spate runs does not shift bytes.

use std::collections::BTreeMap;

use crate::meta::MetaSource;
use crate::spec::{ColumnOptions, ColumnSource, ColumnSpec, MissingValue, parse_source};
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
    /// The database does not exist (not in `system.databases`): a
    /// misspelt `sink.clickhouse.database`, told apart from a missing table.
    #[error(
        "database {database} does not exist (not in system.databases; check sink.clickhouse.database)"
    )]
    NoSuchDatabase {
        /// Database.
        database: String,
    },
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
    /// A per-column option set for a column of a type it does not apply to.
    #[error(
        "column `{column}` has type `{type_text}`: option `{option}` applies only to {applies_to}"
    )]
    OptionNotApplicable {
        /// The column.
        column: String,
        /// Its type text.
        type_text: String,
        /// The option.
        option: &'static str,
        /// The types it applies to.
        applies_to: &'static str,
    },
    /// A bad JSON pointer.
    #[error(transparent)]
    Mapping(#[from] crate::spec::MappingError),
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
    /// Kept for old configs: DEFAULT columns are now always named (see the
    /// module docs); this has no effect.
    pub include_default_columns: bool,
    /// The server accepts `INSERT ... FORMAT RowBinaryWithDefaults`
    /// ([`formats_query`]): per-row DEFAULTs are then left to the server
    /// for rows missing the field ([`MissingValue::ServerDefault`]).
    pub server_defaults: bool,
    /// Column -> per-column mapping options.
    pub column_options: BTreeMap<String, ColumnOptions>,
    /// Column -> the SQL literal (`'unknown'`, `0`) a record without the
    /// field gets (`mapping.defaults`): [`MissingValue::Literal`], which
    /// wins over the table's DEFAULT and a Nullable column's NULL. Checked
    /// against the column's type when the encoder is built
    /// ([`crate::spec::MappingError::BadDefault`], naming the column).
    pub defaults: BTreeMap<String, String>,
}

/// The wire format of the INSERT's rows, decided by the plan: the writer
/// names it in the INSERT and the mapper writes its rows
/// (spate-formats' `JsonRowEncoder::with_defaults`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowFormat {
    /// Plain RowBinary.
    #[default]
    RowBinary,
    /// RowBinary with a marker byte before each cell (`0x01`: the column's
    /// DEFAULT, nothing follows; `0x00`: the value follows):
    /// <https://clickhouse.com/docs/interfaces/formats/RowBinaryWithDefaults>.
    RowBinaryWithDefaults,
}

impl RowFormat {
    /// The format's name in `FORMAT ...`.
    pub fn name(self) -> &'static str {
        match self {
            RowFormat::RowBinary => "RowBinary",
            RowFormat::RowBinaryWithDefaults => "RowBinaryWithDefaults",
        }
    }

    /// `RowBinaryWithDefaults` when an encoder writes a marker byte before
    /// each cell (`with_defaults`), else RowBinary.
    pub fn of(with_defaults: bool) -> RowFormat {
        if with_defaults {
            RowFormat::RowBinaryWithDefaults
        } else {
            RowFormat::RowBinary
        }
    }
}

/// The row format a plan needs: `RowBinaryWithDefaults` when some column
/// takes the server's DEFAULT per row, else RowBinary.
pub fn row_format(columns: &[ColumnSpec]) -> RowFormat {
    if columns
        .iter()
        .any(|c| c.missing == MissingValue::ServerDefault)
    {
        RowFormat::RowBinaryWithDefaults
    } else {
        RowFormat::RowBinary
    }
}

/// The query whose answer (`1` or `0`) says whether the server accepts
/// `RowBinaryWithDefaults` input. `system.formats` exists on 18.16 (which
/// answers 0).
pub fn formats_query() -> &'static str {
    "SELECT count() FROM system.formats WHERE name = 'RowBinaryWithDefaults' AND is_input"
}

/// The planned DEFAULT columns whose DEFAULT neither spate nor the server
/// can apply to a row missing the field: `(column, default expression)`.
/// A record missing such a field is a record error (`on_error`).
pub fn per_row_defaults_refused(
    schema: &TableSchema,
    columns: &[ColumnSpec],
) -> Vec<(String, String)> {
    columns
        .iter()
        .filter(|c| c.missing == MissingValue::Reject)
        .filter_map(|c| {
            let t = schema.columns.iter().find(|t| t.name == c.name)?;
            (t.default_kind == DefaultKind::Default)
                .then(|| (c.name.clone(), t.default_expression.clone()))
        })
        .collect()
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
    for name in options
        .renames
        .keys()
        .chain(options.pointers.keys())
        .chain(options.column_options.keys())
        .chain(options.defaults.keys())
    {
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
        // A `mapping.columns` entry is a pointer or a metadata source; a
        // rename is always a record field; a column with neither takes the
        // metadata source it is named after, if any (as the Kafka engine's
        // virtual columns), else the field of its name.
        let (path, meta) = match (options.pointers.get(&c.name), options.renames.get(&c.name)) {
            (Some(p), _) => match parse_source(p)? {
                ColumnSource::Path(path) => (Some(path), None),
                ColumnSource::Meta(m) => (None, Some(m)),
            },
            (None, Some(field)) => (Some(vec![field.clone()]), None),
            (None, None) => (None, MetaSource::parse(&c.name)),
        };
        let named = match c.default_kind {
            DefaultKind::None => true,
            DefaultKind::Default => true,
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
        let column_options = options
            .column_options
            .get(&c.name)
            .cloned()
            .unwrap_or_default();
        if let Some(m) = &meta {
            m.check_type(&ty)
                .map_err(|reason| crate::spec::MappingError::MetaType {
                    column: c.name.clone(),
                    reason,
                })?;
            if column_options != ColumnOptions::default() {
                return Err(SchemaError::OptionNotApplicable {
                    column: c.name.clone(),
                    type_text: c.type_text.clone(),
                    option: "column_options",
                    applies_to: "columns read from the record (this one takes Kafka metadata)",
                });
            }
        }
        if column_options.epoch_unit.is_some() && !c.type_text.contains("DateTime") {
            return Err(SchemaError::OptionNotApplicable {
                column: c.name.clone(),
                type_text: c.type_text.clone(),
                option: "epoch_unit",
                applies_to: "DateTime and DateTime64 columns",
            });
        }
        let missing = if c.default_kind == DefaultKind::Default {
            match constant_default(&c.default_expression, &ty) {
                Some(lit) => MissingValue::Literal(lit.to_owned()),
                None if options.server_defaults => MissingValue::ServerDefault,
                None => MissingValue::Reject,
            }
        } else if ty.is_nullable() {
            MissingValue::Null
        } else {
            MissingValue::Reject
        };
        let mut column_options = column_options;
        let missing = match options.defaults.get(&c.name) {
            Some(lit) => {
                column_options.null_as_missing = true;
                MissingValue::Literal(lit.clone())
            }
            None => missing,
        };
        out.push(ColumnSpec {
            name: c.name.clone(),
            ty,
            path,
            meta,
            missing,
            options: column_options,
        });
    }
    Ok(out)
}

/// The literal of a constant DEFAULT expression, or `None` when it is not
/// one (it is then computed per row): a number, a single-quoted string or
/// `NULL`, bare or as `CAST(literal, 'Type')` with `Type` the column's own
/// type (how 18.16 stores a DEFAULT whose literal has another type:
/// `UInt32 DEFAULT 0` is `CAST(0, 'UInt32')`). Whether the literal encodes
/// as the column's type is checked when the encoder is built
/// ([`crate::spec::MappingError::BadDefault`]).
pub fn constant_default<'e>(expr: &'e str, ty: &ChType) -> Option<&'e str> {
    let e = expr.trim();
    if let Some(args) = e
        .strip_prefix("CAST(")
        .or_else(|| e.strip_prefix("cast("))
        .and_then(|r| r.strip_suffix(')'))
    {
        // The type argument is the last quoted string; the literal before
        // the comma that precedes it.
        let (lit, ty_arg) = args.rsplit_once(',')?;
        let ty_text = ty_arg.trim().strip_prefix('\'')?.strip_suffix('\'')?;
        let cast_ty = ChType::parse(&ty_text.replace("\\'", "'")).ok()?;
        if &cast_ty != ty {
            return None;
        }
        let lit = lit.trim();
        return is_literal(lit).then_some(lit);
    }
    is_literal(e).then_some(e)
}

/// A number, a single-quoted string (no unescaped quote inside) or `NULL`.
fn is_literal(e: &str) -> bool {
    if e == "NULL" {
        return true;
    }
    if let Some(inner) = e.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        let mut escaped = false;
        for c in inner.chars() {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '\'') => return false,
                _ => escaped = false,
            }
        }
        return !escaped;
    }
    !e.is_empty() && crate::num::DecimalText::parse(e.as_bytes()).is_ok()
}

/// The INSERT statement for `columns` of `database.table` in their
/// [`row_format`].
pub fn insert_statement(database: &str, table: &str, columns: &[ColumnSpec]) -> String {
    let cols: Vec<String> = columns.iter().map(|c| quote_ident(&c.name)).collect();
    format!(
        "INSERT INTO {}.{} ({}) FORMAT {}",
        quote_ident(database),
        quote_ident(table),
        cols.join(", "),
        row_format(columns).name()
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
    fn default_columns_are_always_named() {
        // Issue 19: a field present in the record must land, so DEFAULT
        // columns are in the INSERT whatever include_default_columns says.
        for include in [false, true] {
            let opts = InsertOptions {
                include_default_columns: include,
                ..InsertOptions::default()
            };
            let plan = plan_insert(&schema(), &opts).unwrap();
            let names: Vec<_> = plan.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(names, ["id", "mag", "status", "ingested"]);
            assert_eq!(plan[0].missing, MissingValue::Reject);
            assert_eq!(plan[1].missing, MissingValue::Null);
            assert_eq!(plan[2].missing, MissingValue::Literal("'n/a'".into()));
            assert_eq!(plan[3].missing, MissingValue::Reject, "now() per row");
            assert_eq!(row_format(&plan), RowFormat::RowBinary);
            assert_eq!(
                per_row_defaults_refused(&schema(), &plan),
                [("ingested".to_string(), "now()".to_string())]
            );
        }
        let mut opts = InsertOptions::default();
        opts.renames.insert("status".into(), "state".into());
        let plan = plan_insert(&schema(), &opts).unwrap();
        assert_eq!(plan[2].path, Some(vec!["state".to_string()]));

        // A server with RowBinaryWithDefaults computes now() per row.
        let opts = InsertOptions {
            server_defaults: true,
            ..InsertOptions::default()
        };
        let plan = plan_insert(&schema(), &opts).unwrap();
        assert_eq!(plan[3].missing, MissingValue::ServerDefault);
        assert_eq!(plan[2].missing, MissingValue::Literal("'n/a'".into()));
        assert_eq!(row_format(&plan), RowFormat::RowBinaryWithDefaults);

        // mapping.defaults: a literal wins over the table's rule (a
        // per-row DEFAULT, a Nullable's NULL, none at all).
        let mut opts = InsertOptions::default();
        for c in ["id", "mag", "ingested"] {
            opts.defaults.insert(c.into(), "'x'".into());
        }
        let with = plan_insert(&schema(), &opts).unwrap();
        for i in [0, 1, 3] {
            assert_eq!(with[i].missing, MissingValue::Literal("'x'".into()));
        }
        assert_eq!(row_format(&with), RowFormat::RowBinary);
        let mut opts = InsertOptions::default();
        opts.defaults.insert("nope".into(), "1".into());
        assert!(matches!(
            plan_insert(&schema(), &opts),
            Err(SchemaError::UnknownColumn(c)) if c == "nope"
        ));
        assert!(per_row_defaults_refused(&schema(), &plan).is_empty());
        assert!(insert_statement("d", "t", &plan).ends_with("FORMAT RowBinaryWithDefaults"));
    }

    #[test]
    fn constant_defaults_include_18_16_casts() {
        let ty = |s: &str| ChType::parse(s).unwrap();
        for (expr, t, want) in [
            ("0", "UInt32", Some("0")),
            ("-1.5", "Float64", Some("-1.5")),
            ("'n/a'", "String", Some("'n/a'")),
            ("'it\\'s'", "String", Some("'it\\'s'")),
            ("NULL", "Nullable(UInt8)", Some("NULL")),
            ("CAST(0, 'UInt32')", "UInt32", Some("0")),
            ("CAST(-3, 'Int8')", "Int8", Some("-3")),
            ("CAST('2020-01-01', 'Date')", "Date", Some("'2020-01-01'")),
            (
                "CAST('2020-01-01 00:00:00', 'DateTime')",
                "DateTime",
                Some("'2020-01-01 00:00:00'"),
            ),
            ("CAST('a, b', 'String')", "String", Some("'a, b'")),
            (
                "CAST(NULL, 'Nullable(UInt8)')",
                "Nullable(UInt8)",
                Some("NULL"),
            ),
            // The cast's type must be the column's.
            ("CAST(0, 'UInt64')", "UInt32", None),
            ("CAST(now(), 'DateTime')", "DateTime", None),
            ("now()", "DateTime", None),
            ("id + 1", "UInt64", None),
            ("toDateTime('2020-01-01 00:00:00')", "DateTime", None),
            ("'a' || 'b'", "String", None),
            ("'a', 'b'", "String", None),
            ("", "String", None),
        ] {
            assert_eq!(constant_default(expr, &ty(t)), want, "{expr} as {t}");
        }
    }

    #[test]
    fn plan_errors_name_the_column() {
        let mut opts = InsertOptions::default();
        opts.pointers.insert("nope".into(), "/a".into());
        assert!(
            matches!(plan_insert(&schema(), &opts), Err(SchemaError::UnknownColumn(c)) if c == "nope")
        );
        let mut opts = InsertOptions::default();
        opts.column_options.insert(
            "status".into(),
            ColumnOptions {
                epoch_unit: Some(crate::coerce::EpochUnit::Millis),
                ..ColumnOptions::default()
            },
        );
        let e = plan_insert(&schema(), &opts).unwrap_err().to_string();
        assert!(e.contains("`status`") && e.contains("epoch_unit"), "{e}");
        opts.column_options.clear();
        opts.column_options
            .insert("nope".into(), ColumnOptions::default());
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
    fn metadata_columns_by_name_by_mapping_or_renamed_away() {
        let body = r#"{"name":"id","type":"UInt64","default_kind":"","default_expression":""}
{"name":"_offset","type":"UInt64","default_kind":"","default_expression":""}
{"name":"_key","type":"Nullable(String)","default_kind":"","default_expression":""}
{"name":"_timestamp","type":"DateTime64(3)","default_kind":"","default_expression":""}
{"name":"part","type":"Int32","default_kind":"","default_expression":""}
{"name":"_header.trace","type":"String","default_kind":"DEFAULT","default_expression":"''"}
"#;
        let s = TableSchema::from_json_each_row("db", "t", body).unwrap();
        let plan = plan_insert(&s, &InsertOptions::default()).unwrap();
        let metas: Vec<Option<String>> = plan
            .iter()
            .map(|c| c.meta.as_ref().map(MetaSource::to_string))
            .collect();
        let name = |n: &str| Some(n.to_string());
        assert_eq!(
            metas,
            [
                None,
                name("_offset"),
                name("_key"),
                name("_timestamp"),
                None,
                name("_header.trace")
            ]
        );
        assert_eq!(plan[5].missing, MissingValue::Literal("''".into()));
        // mapping.columns names a source; a rename keeps the record field.
        let mut opts = InsertOptions::default();
        opts.pointers.insert("part".into(), "_partition".into());
        opts.renames.insert("_offset".into(), "_offset".into());
        let plan = plan_insert(&s, &opts).unwrap();
        assert_eq!(plan[4].meta, Some(MetaSource::Partition));
        assert_eq!(plan[4].path, None);
        assert_eq!(plan[1].meta, None);
        assert_eq!(plan[1].path, Some(vec!["_offset".to_string()]));
        // Refusals name the column.
        let mut opts = InsertOptions::default();
        opts.pointers.insert("id".into(), "_topic".into());
        let e = plan_insert(&s, &opts).unwrap_err().to_string();
        assert!(e.contains("`id`") && e.contains("_topic"), "{e}");
        let mut opts = InsertOptions::default();
        opts.pointers.insert("id".into(), "_ofset".into());
        let e = plan_insert(&s, &opts).unwrap_err().to_string();
        assert!(e.contains("_ofset") && e.contains("metadata source"), "{e}");
        let mut opts = InsertOptions::default();
        opts.column_options.insert(
            "_timestamp".into(),
            ColumnOptions {
                epoch_unit: Some(crate::coerce::EpochUnit::Millis),
                ..ColumnOptions::default()
            },
        );
        let e = plan_insert(&s, &opts).unwrap_err().to_string();
        assert!(e.contains("`_timestamp`") && e.contains("metadata"), "{e}");
    }

    #[test]
    fn statements_quote_names() {
        let plan = plan_insert(&schema(), &InsertOptions::default()).unwrap();
        assert_eq!(
            insert_statement("d b", "t`x", &plan),
            "INSERT INTO `d b`.`t\\`x` (`id`, `mag`, `status`, `ingested`) FORMAT RowBinary"
        );
        assert_eq!(
            columns_query("db", "it's"),
            "SELECT name, type, default_kind, default_expression FROM system.columns \
             WHERE database = 'db' AND table = 'it\\'s' FORMAT JSONEachRow"
        );
    }
}
