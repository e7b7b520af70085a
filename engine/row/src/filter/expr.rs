//! The filter's predicate tree and the text form of one predicate
//! (`unit != "drop"`, `value >= 0`, `region in ["eu-0", "eu-1"]`,
//! `quality is null`, `quality is not null`).

use std::fmt;

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

impl CmpOp {
    /// The operator as written.
    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    /// Whether it needs an order (not only equality).
    pub fn is_order(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }
}

/// A constant of a predicate, before it is encoded as its column's type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Constant {
    /// A string (`"drop"` or `'drop'`), unescaped.
    Str(String),
    /// A number, as written (every digit kept: Decimal, Int256).
    Number(String),
    /// `true` / `false`.
    Bool(bool),
}

impl fmt::Display for Constant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constant::Str(s) => write!(f, "{}", serde_json::Value::String(s.clone())),
            Constant::Number(n) => f.write_str(n),
            Constant::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A filter: which rows are kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FilterExpr {
    /// Every one holds (`all:`; an empty list holds).
    All(Vec<FilterExpr>),
    /// At least one holds (`any:`; an empty list does not).
    Any(Vec<FilterExpr>),
    /// `column op constant`.
    Cmp {
        /// The INSERT column.
        column: String,
        /// The operator.
        op: CmpOp,
        /// The constant.
        value: Constant,
    },
    /// `column in [c1, c2, ...]`.
    In {
        /// The INSERT column.
        column: String,
        /// The constants (at least one).
        values: Vec<Constant>,
    },
    /// `column is null` (`negated`: `is not null`).
    IsNull {
        /// The INSERT column.
        column: String,
        /// `is not null`.
        negated: bool,
    },
}

/// A predicate's text that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}`: {reason}")]
pub struct ParseError {
    /// The predicate as written.
    pub text: String,
    /// What was expected.
    pub reason: String,
}

impl FilterExpr {
    /// Parses one predicate: `COLUMN OP CONSTANT`, `COLUMN in [C, ...]`,
    /// `COLUMN is null`, `COLUMN is not null`. `OP` is one of `==`, `!=`,
    /// `<`, `<=`, `>`, `>=`; `COLUMN` is a column name (letters, digits,
    /// `_`, `.`) or any name in backquotes; a constant is a JSON string,
    /// number or bool, or a single-quoted string (`'drop'`, `\'` escapes).
    ///
    /// # Errors
    /// [`ParseError`] saying what was expected where.
    pub fn parse_predicate(text: &str) -> Result<FilterExpr, ParseError> {
        let err = |reason: &str| ParseError {
            text: text.to_owned(),
            reason: reason.to_owned(),
        };
        let s = text.trim();
        let (column, rest) = take_column(s).ok_or_else(|| {
            err("expected a column name first (letters, digits, `_`, `.`, or `in backquotes`)")
        })?;
        let rest = rest.trim_start();
        if let Some(r) = strip_word(rest, "is") {
            let r = r.trim_start();
            let (negated, r) = match strip_word(r, "not") {
                Some(r) => (true, r.trim_start()),
                None => (false, r),
            };
            return match strip_word(r, "null") {
                Some(tail) if tail.trim().is_empty() => Ok(FilterExpr::IsNull { column, negated }),
                _ => Err(err("expected `is null` or `is not null`")),
            };
        }
        if let Some(r) = strip_word(rest, "in") {
            let v: serde_json::Value = serde_json::from_str(r.trim()).map_err(|_| {
                err("expected a JSON list after `in`: region in [\"eu-0\", \"eu-1\"]")
            })?;
            let items = v
                .as_array()
                .ok_or_else(|| err("expected a JSON list after `in`"))?;
            if items.is_empty() {
                return Err(err("`in` needs at least one constant"));
            }
            let values = items
                .iter()
                .map(|v| {
                    constant_of(v).ok_or_else(|| err("a list item is not a string, number or bool"))
                })
                .collect::<Result<_, _>>()?;
            return Ok(FilterExpr::In { column, values });
        }
        let ops = [
            ("==", CmpOp::Eq),
            ("!=", CmpOp::Ne),
            ("<=", CmpOp::Le),
            (">=", CmpOp::Ge),
            ("<", CmpOp::Lt),
            (">", CmpOp::Gt),
        ];
        let (op, r) = ops
            .iter()
            .find_map(|(t, op)| rest.strip_prefix(t).map(|r| (*op, r)))
            .ok_or_else(|| {
                err("expected an operator after the column: ==, !=, <, <=, >, >=, in, is null, is not null")
            })?;
        let c = r.trim();
        if c == "null" {
            return Err(err("compare with null using `is null` / `is not null`"));
        }
        let value = parse_constant(c).ok_or_else(|| {
            err("expected a constant after the operator: a JSON string (\"drop\") or 'drop', a number, true or false")
        })?;
        Ok(FilterExpr::Cmp { column, op, value })
    }

    /// The columns the filter reads, in the order they appear.
    pub fn columns(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.visit_columns(&mut |c| {
            if !out.contains(&c) {
                out.push(c);
            }
        });
        out
    }

    fn visit_columns<'s>(&'s self, f: &mut impl FnMut(&'s str)) {
        match self {
            FilterExpr::All(v) | FilterExpr::Any(v) => v.iter().for_each(|e| e.visit_columns(f)),
            FilterExpr::Cmp { column, .. }
            | FilterExpr::In { column, .. }
            | FilterExpr::IsNull { column, .. } => f(column),
        }
    }
}

impl fmt::Display for FilterExpr {
    /// One line: `all(unit != "drop", value >= 0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FilterExpr::All(v) | FilterExpr::Any(v) => {
                f.write_str(if matches!(self, FilterExpr::All(_)) {
                    "all("
                } else {
                    "any("
                })?;
                for (i, e) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                f.write_str(")")
            }
            FilterExpr::Cmp { column, op, value } => write!(f, "{column} {} {value}", op.as_str()),
            FilterExpr::In { column, values } => {
                write!(f, "{column} in [")?;
                for (i, v) in values.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            FilterExpr::IsNull { column, negated } => {
                write!(f, "{column} is {}null", if *negated { "not " } else { "" })
            }
        }
    }
}

/// The column name at the front of `s` and the rest.
fn take_column(s: &str) -> Option<(String, &str)> {
    if let Some(r) = s.strip_prefix('`') {
        let end = r.find('`')?;
        if end == 0 {
            return None;
        }
        return Some((r[..end].to_owned(), &r[end + 1..]));
    }
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    Some((s[..end].to_owned(), &s[end..]))
}

/// `s` without the leading keyword `word` (followed by a space, a `[`, or
/// the end), case-insensitive.
fn strip_word<'s>(s: &'s str, word: &str) -> Option<&'s str> {
    let head = s.get(..word.len())?;
    if !head.eq_ignore_ascii_case(word) {
        return None;
    }
    let rest = &s[word.len()..];
    match rest.chars().next() {
        None => Some(rest),
        Some(c) if c.is_whitespace() || c == '[' => Some(rest),
        _ => None,
    }
}

fn constant_of(v: &serde_json::Value) -> Option<Constant> {
    match v {
        serde_json::Value::String(s) => Some(Constant::Str(s.clone())),
        serde_json::Value::Number(n) => Some(Constant::Number(n.to_string())),
        serde_json::Value::Bool(b) => Some(Constant::Bool(*b)),
        _ => None,
    }
}

/// A constant's text: JSON string/number/bool, or a single-quoted string.
fn parse_constant(c: &str) -> Option<Constant> {
    if let Some(inner) = c.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(ch) = chars.next() {
            match ch {
                '\\' => out.push(chars.next()?),
                '\'' => return None,
                _ => out.push(ch),
            }
        }
        return Some(Constant::Str(out));
    }
    // Numbers keep their text as written (serde_json would round a long
    // decimal); check the shape with serde_json first.
    let v: serde_json::Value = serde_json::from_str(c).ok()?;
    match v {
        serde_json::Value::Number(_) => Some(Constant::Number(c.to_owned())),
        other => constant_of(&other),
    }
}
