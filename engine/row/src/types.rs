//! ClickHouse column types: a parser from the type strings the server prints
//! (in `system.columns.type`, `DESCRIBE TABLE`) into a [`ChType`] tree, and a
//! renderer back to that text ([`ChType`]'s `Display`).
//!
//! The tree covers every type the RowBinary encoder ([`crate::rowbinary`])
//! can write: (U)Int8..256, Float32/64, Bool, String, FixedString(N), Date,
//! Date32, DateTime[('tz')], DateTime64(p[, 'tz']), UUID, IPv4, IPv6,
//! Decimal(P, S) and Decimal32/64/128/256(S), Enum8/16, Nullable(T),
//! LowCardinality(T), Array(T), Map(K, V) and Tuple(...) with or without
//! element names. Anything else (`JSON`, `Variant`, `AggregateFunction`, ...)
//! is an error naming the type string and the byte position, so a table with
//! a column we cannot encode stops start-up instead of corrupting rows.
//!
//! Normalisation: `Decimal32(S)` parses to `Decimal { precision: 9, scale: S }`
//! (likewise 64 -> 18, 128 -> 38, 256 -> 76), as the server itself reports
//! it, so `render(parse(s))` may differ from `s` textually while
//! `parse(render(t)) == t` holds for every tree (tested by proptest below).
//!
//! What this module does not do: check which types a given server version
//! knows (18.16 lacks IPv4/IPv6, DateTime64, Map, Bool, Date32, Int128/256);
//! that is the schema probe's job, against the real server.

use std::fmt;

/// A parsed ClickHouse column type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ChType {
    /// Signed integer of 8 bits.
    Int8,
    /// Signed integer of 16 bits.
    Int16,
    /// Signed integer of 32 bits.
    Int32,
    /// Signed integer of 64 bits.
    Int64,
    /// Signed integer of 128 bits.
    Int128,
    /// Signed integer of 256 bits.
    Int256,
    /// Unsigned integer of 8 bits.
    UInt8,
    /// Unsigned integer of 16 bits.
    UInt16,
    /// Unsigned integer of 32 bits.
    UInt32,
    /// Unsigned integer of 64 bits.
    UInt64,
    /// Unsigned integer of 128 bits.
    UInt128,
    /// Unsigned integer of 256 bits.
    UInt256,
    /// IEEE 754 binary32.
    Float32,
    /// IEEE 754 binary64.
    Float64,
    /// Boolean, one byte 0 or 1.
    Bool,
    /// Arbitrary bytes (not necessarily UTF-8).
    String,
    /// Exactly `N` bytes, zero padded.
    FixedString(usize),
    /// Days since 1970-01-01 as UInt16 (1970-01-01 ..= 2149-06-06).
    Date,
    /// Days since 1970-01-01 as Int32 (1900-01-01 ..= 2299-12-31).
    Date32,
    /// Seconds since the Unix epoch as UInt32, with an optional display time
    /// zone (IANA name).
    DateTime(Option<String>),
    /// Ticks of `10^-precision` seconds since the Unix epoch as Int64.
    DateTime64 {
        /// Digits after the second, 0..=9.
        precision: u8,
        /// Display time zone (IANA name), if the column names one.
        tz: Option<String>,
    },
    /// A 128-bit UUID.
    Uuid,
    /// The current `JSON` type (ClickHouse 24.8+), with its arguments' text
    /// as the server prints them (`max_dynamic_paths = 8, a.b UInt32`) when
    /// it has any. spate sends its values as JSON text in a RowBinary
    /// String, which the server reads with the setting
    /// `input_format_binary_read_json_as_string = 1`
    /// (<https://clickhouse.com/docs/interfaces/formats/RowBinary>, format
    /// settings); only JSON objects are accepted.
    Json(Option<String>),
    /// An IPv4 address.
    Ipv4,
    /// An IPv6 address.
    Ipv6,
    /// Fixed point: `precision` decimal digits in all, `scale` of them after
    /// the point; stored as a 32/64/128/256-bit integer by precision.
    Decimal {
        /// Total digits, 1..=76.
        precision: u8,
        /// Digits after the point, 0..=precision.
        scale: u8,
    },
    /// An enum stored as Int8: (name, value) pairs in declaration order.
    Enum8(Vec<(String, i8)>),
    /// An enum stored as Int16: (name, value) pairs in declaration order.
    Enum16(Vec<(String, i16)>),
    /// `T` or NULL.
    Nullable(Box<ChType>),
    /// A dictionary-encoded `T`; RowBinary writes it as plain `T`.
    LowCardinality(Box<ChType>),
    /// A variable-length array of `T`.
    Array(Box<ChType>),
    /// A map from `K` to `V`.
    Map(Box<ChType>, Box<ChType>),
    /// A fixed sequence of typed elements, each optionally named.
    Tuple(Vec<TupleElement>),
}

/// One element of a [`ChType::Tuple`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TupleElement {
    /// The element's name in `Tuple(name Type, ...)`, if it has one.
    pub name: Option<String>,
    /// The element's type.
    pub ty: ChType,
}

/// The largest Decimal precision ClickHouse accepts (Decimal256).
pub const MAX_DECIMAL_PRECISION: u8 = 76;
/// The largest DateTime64 precision (nanoseconds).
pub const MAX_DATETIME64_PRECISION: u8 = 9;
/// Nesting bound for the parser, so a hostile type string cannot overflow the
/// stack. Real schemas nest a handful of levels.
pub const MAX_TYPE_DEPTH: usize = 32;

/// A type string that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse ClickHouse type `{input}` at byte {position}: {reason}")]
pub struct TypeParseError {
    /// The whole type string.
    pub input: String,
    /// Byte offset in `input` where parsing stopped.
    pub position: usize,
    /// What was expected or found.
    pub reason: String,
}

impl ChType {
    /// Parses a ClickHouse type string such as `Nullable(DateTime64(3, 'UTC'))`.
    ///
    /// # Errors
    /// [`TypeParseError`] naming the string, the byte position and the reason
    /// (unknown type, bad argument, trailing text, nesting deeper than
    /// [`MAX_TYPE_DEPTH`]).
    pub fn parse(input: &str) -> Result<ChType, TypeParseError> {
        let mut p = Parser { s: input, pos: 0 };
        let ty = p.ty(0)?;
        p.ws();
        if p.pos != input.len() {
            return Err(p.err("unexpected text after the type"));
        }
        Ok(ty)
    }

    /// Whether the type is or contains the `JSON` type (an insert into
    /// it needs `input_format_binary_read_json_as_string = 1`).
    pub fn contains_json(&self) -> bool {
        match self {
            ChType::Json(_) => true,
            ChType::Nullable(t) | ChType::LowCardinality(t) | ChType::Array(t) => t.contains_json(),
            ChType::Map(k, v) => k.contains_json() || v.contains_json(),
            ChType::Tuple(elements) => elements.iter().any(|e| e.ty.contains_json()),
            _ => false,
        }
    }

    /// Whether the type is `Nullable(_)`, directly or under LowCardinality
    /// (`LowCardinality(Nullable(String))`).
    pub fn is_nullable(&self) -> bool {
        match self {
            ChType::Nullable(_) => true,
            ChType::LowCardinality(inner) => inner.is_nullable(),
            _ => false,
        }
    }

    /// The type with LowCardinality wrappers removed (RowBinary writes a
    /// `LowCardinality(T)` value exactly as `T`).
    pub fn without_low_cardinality(&self) -> &ChType {
        match self {
            ChType::LowCardinality(inner) => inner.without_low_cardinality(),
            other => other,
        }
    }
}

struct Parser<'s> {
    s: &'s str,
    pos: usize,
}

impl<'s> Parser<'s> {
    fn err(&self, reason: impl Into<String>) -> TypeParseError {
        TypeParseError {
            input: self.s.to_owned(),
            position: self.pos,
            reason: reason.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), TypeParseError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err(format!("expected `{}`", c as char)))
        }
    }

    fn ident(&mut self) -> Result<&'s str, TypeParseError> {
        self.ws();
        let start = self.pos;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err("expected a type name"));
        }
        Ok(&self.s[start..self.pos])
    }

    /// An element name in a named tuple: an identifier or a back-quoted name.
    fn element_name(&mut self) -> Result<String, TypeParseError> {
        self.ws();
        if self.peek() == Some(b'`') {
            self.pos += 1;
            let start = self.pos;
            while let Some(c) = self.peek() {
                if c == b'`' {
                    let name = self.s[start..self.pos].to_owned();
                    self.pos += 1;
                    return Ok(name);
                }
                self.pos += 1;
            }
            return Err(self.err("unterminated back-quoted name"));
        }
        Ok(self.ident()?.to_owned())
    }

    fn uint(&mut self) -> Result<u64, TypeParseError> {
        self.ws();
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err("expected an unsigned integer"));
        }
        self.s[start..self.pos]
            .parse()
            .map_err(|_| self.err("integer out of range"))
    }

    fn int(&mut self) -> Result<i64, TypeParseError> {
        let negative = self.eat(b'-');
        let magnitude = self.uint()?;
        let magnitude = i64::try_from(magnitude).map_err(|_| self.err("integer out of range"))?;
        Ok(if negative { -magnitude } else { magnitude })
    }

    /// A single-quoted string with `\\` escapes (`\'`, `\\`), as the server
    /// prints enum names and time zones.
    fn quoted(&mut self) -> Result<String, TypeParseError> {
        self.ws();
        if self.peek() != Some(b'\'') {
            return Err(self.err("expected a single-quoted string"));
        }
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.s[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\'' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, e)) => out.push(e),
                    None => break,
                },
                c => out.push(c),
            }
        }
        self.pos = self.s.len();
        Err(self.err("unterminated quoted string"))
    }

    fn args_of<T>(
        &mut self,
        depth: usize,
        one: impl FnMut(&mut Self, usize) -> Result<T, TypeParseError>,
    ) -> Result<Vec<T>, TypeParseError> {
        let mut one = one;
        self.expect(b'(')?;
        let mut out = Vec::new();
        if self.eat(b')') {
            return Ok(out);
        }
        loop {
            out.push(one(self, depth + 1)?);
            if self.eat(b')') {
                return Ok(out);
            }
            self.expect(b',')?;
        }
    }

    /// The text between `(` and its matching `)` (quotes and back quotes
    /// respected), trimmed; the position ends after the `)`.
    fn balanced_args(&mut self) -> Result<String, TypeParseError> {
        self.expect(b'(')?;
        let start = self.pos;
        let bytes = self.s.as_bytes();
        let mut depth = 1usize;
        while let Some(&c) = bytes.get(self.pos) {
            self.pos += 1;
            match c {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(self.s[start..self.pos - 1].trim().to_owned());
                    }
                }
                b'\'' | b'`' => {
                    while let Some(&q) = bytes.get(self.pos) {
                        self.pos += 1;
                        if q == b'\\' {
                            self.pos += 1;
                        } else if q == c {
                            break;
                        }
                    }
                }
                _ => {}
            }
        }
        Err(self.err("unbalanced parentheses"))
    }

    fn inner(&mut self, depth: usize) -> Result<Box<ChType>, TypeParseError> {
        self.expect(b'(')?;
        let t = self.ty(depth + 1)?;
        self.expect(b')')?;
        Ok(Box::new(t))
    }

    fn ty(&mut self, depth: usize) -> Result<ChType, TypeParseError> {
        if depth > MAX_TYPE_DEPTH {
            return Err(self.err(format!("types nest deeper than {MAX_TYPE_DEPTH}")));
        }
        let start = {
            self.ws();
            self.pos
        };
        let name = self.ident()?;
        if let Some(ty) = plain_type(name) {
            return Ok(ty);
        }
        let ty = match name {
            "JSON" => self.json_args()?,
            "FixedString" => self.fixed_string_args()?,
            "DateTime" => self.datetime_args()?,
            "DateTime64" => self.datetime64_args()?,
            "Decimal" | "Decimal32" | "Decimal64" | "Decimal128" | "Decimal256" => {
                self.decimal_args(name)?
            }
            "Enum8" => {
                let pairs = self.enum_pairs(depth, i64::from(i8::MIN), i64::from(i8::MAX))?;
                ChType::Enum8(pairs.into_iter().map(|(n, v)| (n, v as i8)).collect())
            }
            "Enum16" => {
                let pairs = self.enum_pairs(depth, i64::from(i16::MIN), i64::from(i16::MAX))?;
                ChType::Enum16(pairs.into_iter().map(|(n, v)| (n, v as i16)).collect())
            }
            "Nullable" => ChType::Nullable(self.inner(depth)?),
            "LowCardinality" => ChType::LowCardinality(self.inner(depth)?),
            "Array" => ChType::Array(self.inner(depth)?),
            "Map" => self.map_args(depth)?,
            "Tuple" => self.tuple_args(depth)?,
            other => {
                self.pos = start;
                return Err(self.err(format!("unknown or unsupported type `{other}`")));
            }
        };
        Ok(ty)
    }

    /// `JSON`'s optional `(...)` settings, kept as text.
    fn json_args(&mut self) -> Result<ChType, TypeParseError> {
        self.ws();
        Ok(if self.peek() == Some(b'(') {
            ChType::Json(Some(self.balanced_args()?))
        } else {
            ChType::Json(None)
        })
    }

    /// `FixedString`'s `(N)`, N at least 1.
    fn fixed_string_args(&mut self) -> Result<ChType, TypeParseError> {
        self.expect(b'(')?;
        let n = self.uint()?;
        if n == 0 {
            return Err(self.err("FixedString length must be at least 1"));
        }
        let n = usize::try_from(n).map_err(|_| self.err("FixedString length too large"))?;
        self.expect(b')')?;
        Ok(ChType::FixedString(n))
    }

    /// `DateTime`'s optional `('zone')`.
    fn datetime_args(&mut self) -> Result<ChType, TypeParseError> {
        Ok(if self.eat(b'(') {
            let tz = self.quoted()?;
            self.expect(b')')?;
            ChType::DateTime(Some(tz))
        } else {
            ChType::DateTime(None)
        })
    }

    /// `DateTime64`'s `(precision[, 'zone'])`.
    fn datetime64_args(&mut self) -> Result<ChType, TypeParseError> {
        self.expect(b'(')?;
        let p = self.uint()?;
        if p > u64::from(MAX_DATETIME64_PRECISION) {
            return Err(self.err(format!(
                "DateTime64 precision must be 0..={MAX_DATETIME64_PRECISION}"
            )));
        }
        let tz = if self.eat(b',') {
            Some(self.quoted()?)
        } else {
            None
        };
        self.expect(b')')?;
        Ok(ChType::DateTime64 {
            precision: p as u8,
            tz,
        })
    }

    /// The arguments of `Decimal(P[, S])` or `DecimalN(S)` (`name` says which).
    fn decimal_args(&mut self, name: &str) -> Result<ChType, TypeParseError> {
        self.expect(b'(')?;
        let (p, s) = if name == "Decimal" {
            let p = self.uint()?;
            let s = if self.eat(b',') { self.uint()? } else { 0 };
            (p, s)
        } else {
            let p = match name {
                "Decimal32" => 9,
                "Decimal64" => 18,
                "Decimal128" => 38,
                _ => 76,
            };
            (p, self.uint()?)
        };
        self.expect(b')')?;
        self.decimal(p, s)
    }

    /// `Map`'s `(K, V)`.
    fn map_args(&mut self, depth: usize) -> Result<ChType, TypeParseError> {
        self.expect(b'(')?;
        let k = self.ty(depth + 1)?;
        self.expect(b',')?;
        let v = self.ty(depth + 1)?;
        self.expect(b')')?;
        Ok(ChType::Map(Box::new(k), Box::new(v)))
    }

    /// `Tuple`'s elements: at least one, all named or all unnamed.
    fn tuple_args(&mut self, depth: usize) -> Result<ChType, TypeParseError> {
        let elements = self.args_of(depth, |p, d| p.tuple_element(d))?;
        if elements.is_empty() {
            return Err(self.err("Tuple needs at least one element"));
        }
        let named = elements.iter().filter(|e| e.name.is_some()).count();
        if named != 0 && named != elements.len() {
            return Err(self.err("Tuple elements must be all named or all unnamed"));
        }
        Ok(ChType::Tuple(elements))
    }

    fn decimal(&self, p: u64, s: u64) -> Result<ChType, TypeParseError> {
        if p == 0 || p > u64::from(MAX_DECIMAL_PRECISION) {
            return Err(self.err(format!(
                "Decimal precision must be 1..={MAX_DECIMAL_PRECISION}"
            )));
        }
        if s > p {
            return Err(self.err("Decimal scale must not exceed its precision"));
        }
        Ok(ChType::Decimal {
            precision: p as u8,
            scale: s as u8,
        })
    }

    fn enum_pairs(
        &mut self,
        depth: usize,
        min: i64,
        max: i64,
    ) -> Result<Vec<(String, i64)>, TypeParseError> {
        let pairs = self.args_of(depth, |p, _| {
            let name = p.quoted()?;
            p.expect(b'=')?;
            let v = p.int()?;
            if v < min || v > max {
                return Err(p.err(format!("enum value {v} out of range {min}..={max}")));
            }
            Ok((name, v))
        })?;
        if pairs.is_empty() {
            return Err(self.err("an Enum needs at least one value"));
        }
        for (i, (name, value)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|(n, _)| n == name) {
                return Err(self.err(format!("duplicate enum name '{name}'")));
            }
            if pairs[..i].iter().any(|(_, v)| v == value) {
                return Err(self.err(format!("duplicate enum value {value}")));
            }
        }
        Ok(pairs)
    }

    fn tuple_element(&mut self, depth: usize) -> Result<TupleElement, TypeParseError> {
        self.ws();
        let start = self.pos;
        if self.peek() == Some(b'`') {
            let name = self.element_name()?;
            let ty = self.ty(depth)?;
            return Ok(TupleElement {
                name: Some(name),
                ty,
            });
        }
        // `name Type` or `Type`: an identifier followed by another identifier
        // is a name; followed by `(`, `,` or `)` it is a type.
        self.ident()?;
        self.ws();
        let named =
            matches!(self.peek(), Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b'`');
        self.pos = start;
        if named {
            let name = self.element_name()?;
            let ty = self.ty(depth)?;
            Ok(TupleElement {
                name: Some(name),
                ty,
            })
        } else {
            Ok(TupleElement {
                name: None,
                ty: self.ty(depth)?,
            })
        }
    }
}

/// The type a bare name stands for when it takes no arguments (`None`: it does, or is unknown).
fn plain_type(name: &str) -> Option<ChType> {
    Some(match name {
        "Int8" => ChType::Int8,
        "Int16" => ChType::Int16,
        "Int32" => ChType::Int32,
        "Int64" => ChType::Int64,
        "Int128" => ChType::Int128,
        "Int256" => ChType::Int256,
        "UInt8" => ChType::UInt8,
        "UInt16" => ChType::UInt16,
        "UInt32" => ChType::UInt32,
        "UInt64" => ChType::UInt64,
        "UInt128" => ChType::UInt128,
        "UInt256" => ChType::UInt256,
        "Float32" => ChType::Float32,
        "Float64" => ChType::Float64,
        "Bool" => ChType::Bool,
        "String" => ChType::String,
        "UUID" => ChType::Uuid,
        "IPv4" => ChType::Ipv4,
        "IPv6" => ChType::Ipv6,
        "Date" => ChType::Date,
        "Date32" => ChType::Date32,
        _ => return None,
    })
}

fn write_quoted(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("'")?;
    for c in s.chars() {
        if c == '\'' || c == '\\' {
            f.write_str("\\")?;
        }
        write!(f, "{c}")?;
    }
    f.write_str("'")
}

fn is_plain_ident(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

impl fmt::Display for ChType {
    /// Renders the type as ClickHouse prints it (`Nullable(Decimal(18, 4))`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChType::Int8 => f.write_str("Int8"),
            ChType::Int16 => f.write_str("Int16"),
            ChType::Int32 => f.write_str("Int32"),
            ChType::Int64 => f.write_str("Int64"),
            ChType::Int128 => f.write_str("Int128"),
            ChType::Int256 => f.write_str("Int256"),
            ChType::UInt8 => f.write_str("UInt8"),
            ChType::UInt16 => f.write_str("UInt16"),
            ChType::UInt32 => f.write_str("UInt32"),
            ChType::UInt64 => f.write_str("UInt64"),
            ChType::UInt128 => f.write_str("UInt128"),
            ChType::UInt256 => f.write_str("UInt256"),
            ChType::Float32 => f.write_str("Float32"),
            ChType::Float64 => f.write_str("Float64"),
            ChType::Bool => f.write_str("Bool"),
            ChType::String => f.write_str("String"),
            ChType::FixedString(n) => write!(f, "FixedString({n})"),
            ChType::Date => f.write_str("Date"),
            ChType::Date32 => f.write_str("Date32"),
            ChType::DateTime(None) => f.write_str("DateTime"),
            ChType::DateTime(Some(tz)) => {
                f.write_str("DateTime(")?;
                write_quoted(f, tz)?;
                f.write_str(")")
            }
            ChType::DateTime64 { precision, tz } => {
                write!(f, "DateTime64({precision}")?;
                if let Some(tz) = tz {
                    f.write_str(", ")?;
                    write_quoted(f, tz)?;
                }
                f.write_str(")")
            }
            ChType::Uuid => f.write_str("UUID"),
            ChType::Json(None) => f.write_str("JSON"),
            ChType::Json(Some(args)) => write!(f, "JSON({args})"),
            ChType::Ipv4 => f.write_str("IPv4"),
            ChType::Ipv6 => f.write_str("IPv6"),
            ChType::Decimal { precision, scale } => write!(f, "Decimal({precision}, {scale})"),
            ChType::Enum8(pairs) => {
                write_enum(f, "Enum8", pairs.iter().map(|(n, v)| (n, i64::from(*v))))
            }
            ChType::Enum16(pairs) => {
                write_enum(f, "Enum16", pairs.iter().map(|(n, v)| (n, i64::from(*v))))
            }
            ChType::Nullable(t) => write!(f, "Nullable({t})"),
            ChType::LowCardinality(t) => write!(f, "LowCardinality({t})"),
            ChType::Array(t) => write!(f, "Array({t})"),
            ChType::Map(k, v) => write!(f, "Map({k}, {v})"),
            ChType::Tuple(elements) => {
                f.write_str("Tuple(")?;
                for (i, e) in elements.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    match &e.name {
                        Some(n) if is_plain_ident(n) => write!(f, "{n} ")?,
                        Some(n) => write!(f, "`{n}` ")?,
                        None => {}
                    }
                    write!(f, "{}", e.ty)?;
                }
                f.write_str(")")
            }
        }
    }
}

fn write_enum<'a>(
    f: &mut fmt::Formatter<'_>,
    kind: &str,
    pairs: impl Iterator<Item = (&'a String, i64)>,
) -> fmt::Result {
    write!(f, "{kind}(")?;
    for (i, (name, value)) in pairs.enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write_quoted(f, name)?;
        write!(f, " = {value}")?;
    }
    f.write_str(")")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ChType {
        ChType::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_scalars() {
        assert_eq!(p("UInt8"), ChType::UInt8);
        assert_eq!(p("Int256"), ChType::Int256);
        assert_eq!(p(" Float64 "), ChType::Float64);
        assert_eq!(p("FixedString(16)"), ChType::FixedString(16));
        assert_eq!(p("DateTime"), ChType::DateTime(None));
        assert_eq!(p("DateTime('UTC')"), ChType::DateTime(Some("UTC".into())));
        assert_eq!(
            p("DateTime64(3, 'Europe/Moscow')"),
            ChType::DateTime64 {
                precision: 3,
                tz: Some("Europe/Moscow".into())
            }
        );
        assert_eq!(
            p("DateTime64(9)"),
            ChType::DateTime64 {
                precision: 9,
                tz: None
            }
        );
        assert_eq!(
            p("Decimal(18, 4)"),
            ChType::Decimal {
                precision: 18,
                scale: 4
            }
        );
        assert_eq!(
            p("Decimal(10)"),
            ChType::Decimal {
                precision: 10,
                scale: 0
            }
        );
        assert_eq!(
            p("Decimal128(3)"),
            ChType::Decimal {
                precision: 38,
                scale: 3
            }
        );
        assert_eq!(p("UUID"), ChType::Uuid);
        assert_eq!(p("JSON"), ChType::Json(None));
        let typed = "JSON(max_dynamic_paths = 8, a.b UInt32, SKIP `x)y`)";
        assert_eq!(
            p(typed),
            ChType::Json(Some("max_dynamic_paths = 8, a.b UInt32, SKIP `x)y`".into()))
        );
        assert_eq!(p(typed).to_string(), typed);
        assert!(p("Array(JSON)").contains_json());
        assert!(!p("Array(String)").contains_json());
        assert!(ChType::parse("JSON(a UInt8").is_err());
        assert_eq!(p("IPv6"), ChType::Ipv6);
    }

    #[test]
    fn parses_enums_with_escapes_and_negatives() {
        assert_eq!(
            p("Enum8('a' = 1, 'it\\'s' = -2)"),
            ChType::Enum8(vec![("a".into(), 1), ("it's".into(), -2)])
        );
        assert_eq!(
            p("Enum16('x' = 1000)"),
            ChType::Enum16(vec![("x".into(), 1000)])
        );
    }

    #[test]
    fn parses_nesting_and_named_tuples() {
        assert_eq!(
            p("Array(Nullable(Float64))"),
            ChType::Array(Box::new(ChType::Nullable(Box::new(ChType::Float64))))
        );
        assert_eq!(
            p("LowCardinality(Nullable(String))"),
            ChType::LowCardinality(Box::new(ChType::Nullable(Box::new(ChType::String))))
        );
        assert_eq!(
            p("Map(String, Array(UInt64))"),
            ChType::Map(
                Box::new(ChType::String),
                Box::new(ChType::Array(Box::new(ChType::UInt64)))
            )
        );
        assert_eq!(
            p("Tuple(a UInt8, `b c` String)"),
            ChType::Tuple(vec![
                TupleElement {
                    name: Some("a".into()),
                    ty: ChType::UInt8
                },
                TupleElement {
                    name: Some("b c".into()),
                    ty: ChType::String
                },
            ])
        );
        assert_eq!(
            p("Tuple(String, Nullable(Int8))"),
            ChType::Tuple(vec![
                TupleElement {
                    name: None,
                    ty: ChType::String
                },
                TupleElement {
                    name: None,
                    ty: ChType::Nullable(Box::new(ChType::Int8))
                },
            ])
        );
        assert!(p("LowCardinality(Nullable(String))").is_nullable());
        assert!(!p("Array(Nullable(String))").is_nullable());
    }

    #[test]
    fn errors_name_type_and_position() {
        let e = ChType::parse("Array(Nullable(Dynamic))").unwrap_err();
        assert_eq!(e.input, "Array(Nullable(Dynamic))");
        assert_eq!(e.position, 15);
        assert!(e.reason.contains("Dynamic"), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("Array(Nullable(Dynamic))") && msg.contains("byte 15"),
            "{msg}"
        );

        for bad in [
            "",
            "UInt8 x",
            "Array(UInt8",
            "FixedString(0)",
            "Decimal(77, 2)",
            "Decimal(5, 6)",
            "DateTime64(10)",
            "Enum8('a' = 200)",
            "Enum8('a' = 1, 'a' = 2)",
            "Enum8('a' = 1, 'b' = 1)",
            "Enum8('a = 1)",
            "Tuple()",
            "Tuple(a UInt8, String)",
            "Map(String)",
            "Nullable",
        ] {
            assert!(ChType::parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let deep = "Array(".repeat(100) + "UInt8" + &")".repeat(100);
        let e = ChType::parse(&deep).unwrap_err();
        assert!(e.reason.contains("deeper"), "{e}");
    }

    #[test]
    fn renders_as_the_server_prints() {
        for s in [
            "Nullable(Decimal(18, 4))",
            "DateTime64(3, 'UTC')",
            "Enum8('a' = 1, 'b' = -2)",
            "Map(String, Array(Nullable(Float64)))",
            "Tuple(a UInt8, `b c` String)",
            "LowCardinality(Nullable(String))",
        ] {
            assert_eq!(p(s).to_string(), s);
        }
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        fn name() -> impl Strategy<Value = String> {
            prop_oneof!["[a-z_][a-z0-9_]{0,6}", "[a-z '\\\\]{1,6}"]
        }

        fn leaf() -> impl Strategy<Value = ChType> {
            prop_oneof![
                Just(ChType::Int8),
                Just(ChType::Int64),
                Just(ChType::Int256),
                Just(ChType::UInt16),
                Just(ChType::UInt128),
                Just(ChType::Float32),
                Just(ChType::Bool),
                Just(ChType::String),
                Just(ChType::Date),
                Just(ChType::Date32),
                Just(ChType::Uuid),
                Just(ChType::Ipv4),
                Just(ChType::Ipv6),
                (1usize..64).prop_map(ChType::FixedString),
                proptest::option::of("[A-Za-z/_']{1,12}").prop_map(ChType::DateTime),
                (0u8..=9, proptest::option::of("[A-Za-z/_]{1,12}"))
                    .prop_map(|(precision, tz)| ChType::DateTime64 { precision, tz }),
                (1u8..=76)
                    .prop_flat_map(|p| (Just(p), 0..=p))
                    .prop_map(|(precision, scale)| ChType::Decimal { precision, scale }),
                proptest::collection::btree_map("[a-z' ]{0,5}", any::<i8>(), 1..4).prop_map(|m| {
                    let mut seen = std::collections::BTreeSet::new();
                    ChType::Enum8(m.into_iter().filter(|(_, v)| seen.insert(*v)).collect())
                }),
                proptest::collection::btree_map("[a-z]{1,5}", any::<i16>(), 1..4).prop_map(|m| {
                    let mut seen = std::collections::BTreeSet::new();
                    ChType::Enum16(m.into_iter().filter(|(_, v)| seen.insert(*v)).collect())
                }),
            ]
        }

        fn tree() -> impl Strategy<Value = ChType> {
            leaf().prop_recursive(4, 24, 4, |inner| {
                prop_oneof![
                    inner.clone().prop_map(|t| ChType::Nullable(Box::new(t))),
                    inner
                        .clone()
                        .prop_map(|t| ChType::LowCardinality(Box::new(t))),
                    inner.clone().prop_map(|t| ChType::Array(Box::new(t))),
                    (inner.clone(), inner.clone())
                        .prop_map(|(k, v)| ChType::Map(Box::new(k), Box::new(v))),
                    proptest::collection::vec(inner.clone(), 1..4).prop_map(|ts| ChType::Tuple(
                        ts.into_iter()
                            .map(|ty| TupleElement { name: None, ty })
                            .collect()
                    )),
                    proptest::collection::vec((name(), inner), 1..4).prop_map(|ts| ChType::Tuple(
                        ts.into_iter()
                            .map(|(n, ty)| TupleElement { name: Some(n), ty })
                            .collect()
                    )),
                ]
            })
        }

        proptest! {
            #[test]
            fn render_then_parse_is_identity(t in tree()) {
                let text = t.to_string();
                let back = ChType::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(back, t);
            }
        }
    }
}
