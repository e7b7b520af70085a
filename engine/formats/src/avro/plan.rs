//! The plan compiler: a writer schema and the table's columns become a
//! decode program ([`Plan`]) that the hot path runs over each datum.
//!
//! A program is a list of [`Op`]s in the writer schema's field order
//! (Avro's binary encoding writes a record's fields in schema order with
//! no tags or lengths, nested records inline: Avro specification,
//! "Binary Encoding", <https://avro.apache.org/docs/1.11.1/specification/#binary-encoding>):
//! skip a field no column reads, decode a field into its column
//! ([`Conv`], chosen once here so no type test is left for the hot path),
//! branch on a union that holds a nested record whose fields feed columns,
//! write a column's missing value, or (with `explode`) run the element's
//! program over one array element and resume the parent after the array.
//!
//! What carries exactly, and nothing else (anything else is a
//! [`PlanError`] naming the schema id, the field and the column):
//!
//! | Avro | ClickHouse |
//! |---|---|
//! | boolean | Bool, UInt8, Int8 |
//! | int, long (and time-millis/micros, date, timestamps as plain numbers) | any (U)Int8..256: wider ones exactly, narrower ones range-checked per value (a record error, as the JSON mapper's); Float64 (long: per value, exact up to 2^53); Float32 (per value, up to 2^24); Decimal (per value) |
//! | float | Float32, Float64 |
//! | double | Float64 |
//! | string, bytes | String, FixedString(N) (per value: at most N bytes); string also Enum8/16 by name (per value) and UUID (per value, 8-4-4-4-12 text) |
//! | uuid (string / fixed 16 / bytes) | UUID; the string form also String |
//! | fixed(n) | FixedString(N) with n <= N, String |
//! | enum | String, Enum8/16 (every symbol must be one of the column's names) |
//! | date | Date, Date32 (per value: in range) |
//! | timestamp-millis/micros/nanos | DateTime (per value: whole seconds, else a record error; in range), DateTime64(p) (scaled exactly; a finer value into a coarser p must divide exactly), and the integer types |
//! | decimal(p, s) bytes or fixed | Decimal(P, S) with S >= s and P - S >= p - s |
//! | array | Array(T) |
//! | map | Map(String, V) (ClickHouse 18.16 has no Map type: such a field can go nowhere there) |
//! | union with null | Nullable(T); into a non-Nullable column a null is the column's missing value ([`MissingValue`]) |
//! | other unions | a column every non-null branch carries into |
//! | record | its fields, by path (`/a/b`) or flatten join |
//!
//! LowCardinality(T) is T throughout. A column no field feeds follows its
//! [`ColumnSpec::missing`]: NULL, a constant DEFAULT, the server's DEFAULT
//! marker, or (Reject) a plan error: the writer schema cannot fill it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use apache_avro::Schema;
use apache_avro::schema::{DecimalSchema, InnerDecimalSchema, Name, RecordSchema, UuidSchema};

use spate_row::coerce::TimeRules;
use spate_row::spec::{ColumnSpec, MissingValue};
use spate_row::types::ChType;

/// Settings of an Avro mapping beyond the columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AvroOptions {
    /// Read nested records as flattened with this join (`"_"`): the column
    /// `location_lat` also takes the field `lat` of the record `location`.
    pub flatten_join: Option<String>,
    /// Fan out: the path of an array-of-records field (`["events"]` for
    /// `/events`, through plain records only). Each element becomes one
    /// row carrying the parent's fields and the element's; an empty array
    /// none.
    pub explode: Option<Vec<String>>,
}

/// A writer schema that cannot fill the table's columns exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    /// The writer schema's registry id, when it has one.
    pub schema_id: Option<u32>,
    /// The Avro field concerned (a `/`-joined path), when there is one.
    pub field: Option<String>,
    /// The column concerned, when there is one.
    pub column: Option<String>,
    /// Why, in words a user can act on.
    pub reason: String,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.schema_id {
            Some(id) => write!(f, "Avro writer schema id {id}")?,
            None => write!(f, "Avro writer schema (from a file)")?,
        }
        if let Some(field) = &self.field {
            write!(f, ", field `{field}`")?;
        }
        if let Some(column) = &self.column {
            write!(f, ", column `{column}`")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for PlanError {}

/// How to decode past a value.
#[derive(Clone, Debug)]
pub(crate) enum Skip {
    /// null: nothing.
    Zero,
    /// A varint (int, long, enum index).
    Var,
    /// `n` bytes (boolean 1, float 4, double 8, fixed n).
    Bytes(usize),
    /// A length-prefixed run (string, bytes).
    Len,
    /// A union: the branch index, then that branch.
    Union(Box<[Skip]>),
    /// Array blocks of items.
    Array(Box<Skip>),
    /// Map blocks of (string key, value).
    Map(Box<Skip>),
    /// A record's fields in order.
    Record(Box<[Skip]>),
}

impl Skip {
    /// The fewest bytes a value takes (0 for null and empty records):
    /// bounds an array's claimed item count against the bytes left.
    pub(crate) fn min_len(&self) -> usize {
        match self {
            Skip::Zero => 0,
            Skip::Var | Skip::Len | Skip::Union(_) | Skip::Array(_) | Skip::Map(_) => 1,
            Skip::Bytes(n) => *n,
            Skip::Record(fields) => fields.iter().map(Skip::min_len).sum(),
        }
    }
}

/// An integer column's width and signedness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IntDst {
    pub bits: u32,
    pub signed: bool,
}

/// The ClickHouse time type a timestamp goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeTo {
    /// UInt32 seconds.
    DateTime,
    /// Int64 ticks of 10^-p s.
    DateTime64(u8),
}

/// How a string key of a map is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyConv {
    /// String.
    Str,
    /// FixedString(n).
    Fixed(usize),
}

/// One branch of a union conversion.
#[derive(Clone, Debug)]
pub(crate) enum UBranch {
    /// null into a Nullable column: the NULL byte.
    Null,
    /// null into a non-Nullable column: the column's missing value.
    Missing,
    /// A value.
    Val(Conv),
}

/// How one Avro value becomes one ClickHouse value (chosen at plan time).
#[derive(Clone, Debug)]
pub(crate) enum Conv {
    /// boolean -> one byte 0/1.
    Bool,
    /// int (`src32`) or long into an integer column.
    Int { src32: bool, dst: IntDst },
    /// int/long into Float64 (`limit`: the largest magnitude carried exactly).
    IntF64 { src32: bool },
    /// int/long into Float32, magnitudes up to 2^24.
    IntF32 { src32: bool },
    /// int/long into Decimal(P, S): times 10^S, at most P digits.
    IntDecimal { src32: bool, ty: ChType },
    /// float -> Float32.
    F32,
    /// float -> Float64.
    F32F64,
    /// double -> Float64.
    F64,
    /// string (UTF-8 checked) or bytes into String.
    Str { utf8: bool },
    /// string or bytes into FixedString(n).
    StrFixed { utf8: bool, n: usize },
    /// string into Enum8/16 by name.
    StrEnum {
        names: Box<[(Box<[u8]>, i16)]>,
        w8: bool,
    },
    /// string text into UUID.
    StrUuid,
    /// fixed(size) into FixedString(n) (`size <= n`) or String (`n == 0`).
    Fixed { size: usize, n: usize, string: bool },
    /// 16 bytes (fixed or bytes) into UUID.
    BinUuid { fixed: bool },
    /// enum index into String (the symbol).
    EnumStr { symbols: Box<[Box<[u8]>]> },
    /// enum index into Enum8/16 (the value of the symbol's name).
    EnumVal { values: Box<[i16]>, w8: bool },
    /// date (days) into Date or Date32.
    Date { date32: bool },
    /// A timestamp of 10^-unit s into DateTime/DateTime64.
    Time { unit: u8, to: TimeTo },
    /// decimal bytes (`fixed == 0`) or fixed(n) into Decimal(P, S), times
    /// 10^`up`.
    Decimal { fixed: usize, up: u32, ty: ChType },
    /// A value into a Nullable column: 0, then the value.
    Nullable(Box<Conv>),
    /// A null schema: always NULL (Nullable) or missing.
    Null { nullable: bool },
    /// A union: the branch index picks the conversion.
    Union(Box<[UBranch]>),
    /// An array into Array(T).
    Array { item: Box<Conv>, min_len: usize },
    /// A map into Map(K, V).
    Map { key: KeyConv, value: Box<Conv> },
}

/// What a column gets when it has no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MissingCell {
    /// NULL: the byte 1.
    Null,
    /// A constant DEFAULT's encoded bytes.
    Bytes(Box<[u8]>),
    /// The server's DEFAULT marker (RowBinaryWithDefaults).
    ServerDefault,
    /// A record error.
    Reject,
}

/// One step of a decode program.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// Decode past a field (index into [`Plan::fields`] for errors).
    Skip(Skip, u32),
    /// Decode a field into column `col`.
    Put { col: u32, conv: Conv },
    /// A union holding a record whose fields feed columns: the branch
    /// index picks the ops (every branch writes the same columns in the
    /// same order; a null branch writes their missing values).
    Branch {
        branches: Box<[Box<[Op]>]>,
        field: u32,
    },
    /// Column `col`'s missing value.
    Missing { col: u32 },
    /// Column `col`'s Kafka metadata ([`ColumnSpec::meta`], written by
    /// [`spate_row::meta::encode_meta`]; an absent value is the column's
    /// missing value).
    Meta { col: u32 },
    /// Where the exploded array is: run the element's program over the
    /// record's element, resume after the array.
    Explode,
}

/// Where the exploded array sits and how to walk it.
#[derive(Clone, Debug)]
pub(crate) struct ExplodePlan {
    /// Skips for every parent field before the array (nested records
    /// flattened).
    pub pre: Box<[Skip]>,
    /// The element record's skip.
    pub item: Skip,
    /// The array's path, `/`-joined.
    pub field: String,
}

/// A compiled plan: one writer schema onto one table's INSERT columns.
#[derive(Debug)]
pub struct Plan {
    pub(crate) schema_id: Option<u32>,
    pub(crate) schema: Arc<Schema>,
    pub(crate) parent: Box<[Op]>,
    pub(crate) element: Box<[Op]>,
    pub(crate) explode: Option<ExplodePlan>,
    /// The index of `Op::Explode` in `parent`.
    pub(crate) explode_at: Option<usize>,
    /// Whether the cells before the exploded array depend on the datum's
    /// bytes before it alone (direct, no metadata column among them), so
    /// an encoder may reuse them for the next element of the message.
    pub(crate) prefix_cache: bool,
    /// Columns are written in INSERT order as decoded (no permutation).
    pub(crate) direct: bool,
    /// RowBinaryWithDefaults: a marker byte before every cell.
    pub(crate) marker: bool,
    pub(crate) missing: Box<[MissingCell]>,
    pub(crate) columns: Box<[ColumnSpec]>,
    /// The field feeding each column (`/`-joined), for errors.
    pub(crate) col_fields: Box<[Option<String>]>,
    /// Field paths named by `Op::Skip` / `Op::Branch`.
    pub(crate) fields: Box<[String]>,
}

impl Plan {
    /// The writer schema's registry id (`None` for a schema file).
    pub fn schema_id(&self) -> Option<u32> {
        self.schema_id
    }

    /// The writer schema.
    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    /// The INSERT's columns, in order.
    pub fn columns(&self) -> &[ColumnSpec] {
        &self.columns
    }

    /// Whether rows are `RowBinaryWithDefaults` (some column has
    /// [`MissingValue::ServerDefault`]).
    pub fn with_defaults(&self) -> bool {
        self.marker
    }

    /// Whether decoded values land in INSERT order as they are decoded
    /// (the schema's field order matches the columns'), so a row is
    /// written once with no permutation.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether the plan fans out (`explode`).
    pub fn explodes(&self) -> bool {
        self.explode.is_some()
    }
}

/// The path-resolution namespace of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ns {
    Parent,
    Element,
}

struct Ctx<'s> {
    id: Option<u32>,
    names: &'s HashMap<Name, &'s Schema>,
    columns: &'s [ColumnSpec],
    fields: Vec<String>,
    explode: Option<Vec<String>>,
    /// (namespace, path) -> column.
    assigned: Vec<(Ns, Vec<String>, usize)>,
}

impl<'s> Ctx<'s> {
    fn err(&self, field: Option<&[String]>, column: Option<usize>, reason: String) -> PlanError {
        PlanError {
            schema_id: self.id,
            field: field.map(|p| p.join("/")),
            column: column.map(|c| self.columns[c].name.clone()),
            reason,
        }
    }

    fn resolve<'a>(&self, s: &'a Schema, depth: usize) -> Result<&'a Schema, PlanError>
    where
        's: 'a,
    {
        let mut s = s;
        let mut hops = 0;
        while let Schema::Ref { name } = s {
            s = self.names.get(name).copied().ok_or_else(|| {
                self.err(
                    None,
                    None,
                    format!("the schema names `{name}`, never defined"),
                )
            })?;
            hops += 1;
            if hops > 64 {
                return Err(self.err(None, None, "a reference cycle".into()));
            }
        }
        if depth > 48 {
            return Err(self.err(
                None,
                None,
                "the schema nests deeper than 48 levels (a recursive type?): not supported".into(),
            ));
        }
        Ok(s)
    }

    fn field_idx(&mut self, path: &[String]) -> u32 {
        self.fields.push(path.join("/"));
        (self.fields.len() - 1) as u32
    }

    fn skip_of(&self, s: &Schema, depth: usize) -> Result<Skip, PlanError> {
        let s = self.resolve(s, depth)?;
        Ok(match s {
            Schema::Null => Skip::Zero,
            Schema::Boolean => Skip::Bytes(1),
            Schema::Int
            | Schema::Long
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos
            | Schema::Enum(_) => Skip::Var,
            Schema::Float => Skip::Bytes(4),
            Schema::Double => Skip::Bytes(8),
            Schema::Bytes | Schema::String | Schema::BigDecimal => Skip::Len,
            Schema::Uuid(UuidSchema::String) | Schema::Uuid(UuidSchema::Bytes) => Skip::Len,
            Schema::Uuid(UuidSchema::Fixed(f)) | Schema::Fixed(f) | Schema::Duration(f) => {
                Skip::Bytes(f.size)
            }
            Schema::Decimal(d) => match &d.inner {
                InnerDecimalSchema::Bytes => Skip::Len,
                InnerDecimalSchema::Fixed(f) => Skip::Bytes(f.size),
            },
            Schema::Array(a) => Skip::Array(Box::new(self.skip_of(&a.items, depth + 1)?)),
            Schema::Map(m) => Skip::Map(Box::new(self.skip_of(&m.types, depth + 1)?)),
            Schema::Union(u) => Skip::Union(
                u.variants()
                    .iter()
                    .map(|v| self.skip_of(v, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Schema::Record(r) => Skip::Record(
                r.fields
                    .iter()
                    .map(|f| self.skip_of(&f.schema, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Schema::Ref { .. } => unreachable!("resolved above"),
        })
    }

    /// The record a path segment descends into: a record, or the record
    /// branch of a union with null (`conditional`).
    fn record_of<'a>(&self, s: &'a Schema, depth: usize) -> Option<(&'a RecordSchema, bool)>
    where
        's: 'a,
    {
        match self.resolve(s, depth).ok()? {
            Schema::Record(r) => Some((r, false)),
            Schema::Union(u) => {
                let mut rec = None;
                for v in u.variants() {
                    match self.resolve(v, depth).ok()? {
                        Schema::Null => {}
                        Schema::Record(r) if rec.is_none() => rec = Some(r),
                        _ => return None,
                    }
                }
                rec.map(|r| (r, true))
            }
            _ => None,
        }
    }

    /// Whether `path` names a field under `root`.
    fn exists(&self, root: &RecordSchema, path: &[String]) -> bool {
        let mut rec = root;
        for (k, seg) in path.iter().enumerate() {
            let Some(&i) = rec.lookup.get(seg) else {
                return false;
            };
            if k + 1 == path.len() {
                return true;
            }
            match self.record_of(&rec.fields[i].schema, k) {
                Some((r, _)) => rec = r,
                None => return false,
            }
        }
        false
    }
}

/// Every path a column name stands for under a flatten join (as every
/// format reads it, [`ColumnSpec::source_paths`]), and whether the column
/// names its path explicitly.
fn candidate_paths(c: &ColumnSpec, join: Option<&str>) -> (Vec<Vec<String>>, bool) {
    (c.source_paths(join), c.path.is_some())
}

/// Compiles the plan of writer schema `schema` (registry id `id`) onto
/// `columns` (INSERT order), per `options`.
///
/// # Errors
/// [`PlanError`] naming schema id, field and column: a field that cannot
/// carry exactly into its column, a column no field feeds whose
/// [`ColumnSpec::missing`] is Reject, a column matching two fields, a
/// parent/element name clash under `explode`, a bad explode path, a bad
/// DEFAULT literal, a schema that is not a record.
pub fn compile(
    id: Option<u32>,
    schema: Arc<Schema>,
    columns: &[ColumnSpec],
    options: &AvroOptions,
) -> Result<Plan, PlanError> {
    let resolved = apache_avro::schema::ResolvedSchema::new(&schema).map_err(|e| PlanError {
        schema_id: id,
        field: None,
        column: None,
        reason: format!("the schema does not resolve: {e}"),
    })?;
    let names = resolved.get_names();
    let mut cx = Ctx {
        id,
        names,
        columns,
        fields: Vec::new(),
        explode: options.explode.clone(),
        assigned: Vec::new(),
    };
    if columns.is_empty() {
        return Err(cx.err(None, None, "a mapping needs at least one column".into()));
    }
    let root = root_record(&cx, &schema)?;
    // The element record under explode.
    let element: Option<&RecordSchema> = match &options.explode {
        None => None,
        Some(path) => Some(explode_element(&cx, root, path)?),
    };
    // Which field feeds which column.
    assign_columns(&mut cx, root, element, options)?;
    let mut parent = compile_record(&mut cx, root, &[], Ns::Parent, 0)?;
    let mut element_ops = match element {
        Some(e) => compile_record(&mut cx, e, &[], Ns::Element, 0)?,
        None => Vec::new(),
    };
    let explode = explode_plan(&cx, root, element, options)?;
    // Missing values, and the columns no field feeds.
    let missing = missing_cells(&cx)?;
    let col_fields = column_fields(&cx, options);
    let unfed = unfed_columns(&cx, &col_fields, &missing)?;
    let direct = check_writes(&cx, &parent, &element_ops, &unfed)?;
    place_unfed(&mut parent, &mut element_ops, &unfed, columns, direct);
    let marker = columns
        .iter()
        .any(|c| c.missing == MissingValue::ServerDefault);
    let fields = std::mem::take(&mut cx.fields);
    drop(resolved);
    let explode_at = parent.iter().position(|o| matches!(o, Op::Explode));
    let prefix_cache = direct
        && explode_at.is_some_and(|k| !parent[..k].iter().any(|o| matches!(o, Op::Meta { .. })));
    Ok(Plan {
        explode_at,
        prefix_cache,
        schema_id: id,
        schema,
        parent: parent.into(),
        element: element_ops.into(),
        explode,
        direct,
        marker,
        missing: missing.into(),
        columns: columns.into(),
        col_fields: col_fields.into(),
        fields: fields.into(),
    })
}

/// The top-level record of the writer schema, or the error for a non-record.
fn root_record<'a>(cx: &Ctx<'a>, schema: &'a Schema) -> Result<&'a RecordSchema, PlanError> {
    match cx.resolve(schema, 0)? {
        Schema::Record(r) => Ok(r),
        other => Err(cx.err(
            None,
            None,
            format!(
                "the top-level schema is {}, not a record: columns need named fields",
                kind(other)
            ),
        )),
    }
}

/// Records in `cx.assigned` which field feeds each non-metadata column.
fn assign_columns(
    cx: &mut Ctx<'_>,
    root: &RecordSchema,
    element: Option<&RecordSchema>,
    options: &AvroOptions,
) -> Result<(), PlanError> {
    let columns = cx.columns;
    let join = options.flatten_join.as_deref();
    for (ci, c) in columns.iter().enumerate() {
        if let Some(source) = &c.meta {
            source
                .check_type(&c.ty)
                .map_err(|reason| cx.err(None, Some(ci), format!("Kafka metadata: {reason}")))?;
            continue;
        }
        let found = column_matches(cx, root, element, options, ci, join)?;
        assign_match(cx, ci, found)?;
    }
    Ok(())
}

/// Every (namespace, path) of a field column `ci` names, parent or element.
fn column_matches(
    cx: &Ctx<'_>,
    root: &RecordSchema,
    element: Option<&RecordSchema>,
    options: &AvroOptions,
    ci: usize,
    join: Option<&str>,
) -> Result<Vec<(Ns, Vec<String>)>, PlanError> {
    let (paths, explicit) = candidate_paths(&cx.columns[ci], join);
    let mut found: Vec<(Ns, Vec<String>)> = Vec::new();
    for p in &paths {
        let mut in_parent = None;
        if let Some(ex) = &options.explode
            && p.len() > ex.len()
            && p[..ex.len()] == ex[..]
        {
            let rest = p[ex.len()..].to_vec();
            if element.is_some_and(|e| cx.exists(e, &rest)) {
                found.push((Ns::Element, rest));
                continue;
            }
        }
        if cx.exists(root, p) {
            in_parent = Some(p.clone());
        }
        let in_element = element.filter(|e| cx.exists(e, p)).map(|_| p.clone());
        match (in_parent, in_element) {
            (Some(a), Some(_)) if !explicit => {
                let ex = options
                    .explode
                    .as_ref()
                    .map(|e| e.join("/"))
                    .unwrap_or_default();
                return Err(cx.err(
                    Some(p),
                    Some(ci),
                    format!(
                        "the name is both a field of the record and of each `{ex}` element \
                         (`{ex}/{}`): say which with a pointer in mapping.columns \
                         (`/{}` for the record's, `/{ex}/{}` for the element's) or a rename",
                        p.join("/"),
                        a.join("/"),
                        p.join("/")
                    ),
                ));
            }
            (Some(a), _) => found.push((Ns::Parent, a)),
            (None, Some(e)) => found.push((Ns::Element, e)),
            (None, None) => {}
        }
    }
    Ok(found)
}

/// Assigns column `ci` its one matched field, or errors on a clash or ambiguity.
fn assign_match(
    cx: &mut Ctx<'_>,
    ci: usize,
    mut found: Vec<(Ns, Vec<String>)>,
) -> Result<(), PlanError> {
    match found.len() {
        0 => {}
        1 => {
            let (ns, p) = found.pop().expect("one");
            if let Some((_, _, other)) = cx.assigned.iter().find(|(n, q, _)| *n == ns && *q == p) {
                return Err(cx.err(
                    Some(&p),
                    Some(ci),
                    format!(
                        "the field already feeds column `{}`; one field feeds one column",
                        cx.columns[*other].name
                    ),
                ));
            }
            cx.assigned.push((ns, p, ci));
        }
        _ => {
            let list: Vec<String> = found.iter().map(|(_, p)| p.join("/")).collect();
            return Err(cx.err(
                None,
                Some(ci),
                format!(
                    "the column matches several fields ({}) under the flatten join: \
                     give it a pointer in mapping.columns",
                    list.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// The fan-out plan: skips before the exploded array and over one element.
fn explode_plan(
    cx: &Ctx<'_>,
    root: &RecordSchema,
    element: Option<&RecordSchema>,
    options: &AvroOptions,
) -> Result<Option<ExplodePlan>, PlanError> {
    Ok(match (&options.explode, element) {
        (Some(path), Some(e)) => Some(ExplodePlan {
            pre: pre_skips(cx, root, path, 0)?,
            item: Skip::Record(
                e.fields
                    .iter()
                    .map(|f| cx.skip_of(&f.schema, 1))
                    .collect::<Result<_, _>>()?,
            ),
            field: path.join("/"),
        }),
        _ => None,
    })
}

/// What each column gets when no field feeds it (DEFAULT literals encoded).
fn missing_cells(cx: &Ctx<'_>) -> Result<Vec<MissingCell>, PlanError> {
    let mut missing = Vec::with_capacity(cx.columns.len());
    for c in cx.columns {
        missing.push(match &c.missing {
            MissingValue::Null => MissingCell::Null,
            MissingValue::Literal(lit) => {
                let bytes = spate_row::spec::encode_literal(c, lit, &TimeRules::default())
                    .map_err(|e| cx.err(None, None, e.to_string()))?;
                MissingCell::Bytes(bytes.into())
            }
            MissingValue::ServerDefault => MissingCell::ServerDefault,
            MissingValue::Reject => MissingCell::Reject,
        });
    }
    Ok(missing)
}

/// The field path (`/`-joined) feeding each column, for errors.
fn column_fields(cx: &Ctx<'_>, options: &AvroOptions) -> Vec<Option<String>> {
    let mut col_fields: Vec<Option<String>> = vec![None; cx.columns.len()];
    for (ns, p, c) in &cx.assigned {
        col_fields[*c] = Some(match (ns, &options.explode) {
            (Ns::Element, Some(ex)) => format!("{}/{}", ex.join("/"), p.join("/")),
            _ => p.join("/"),
        });
    }
    col_fields
}

/// The columns no field feeds (metadata ones included), or the error for a Reject one.
fn unfed_columns(
    cx: &Ctx<'_>,
    col_fields: &[Option<String>],
    missing: &[MissingCell],
) -> Result<Vec<u32>, PlanError> {
    let columns = cx.columns;
    let mut unfed = Vec::new();
    for (c, f) in col_fields.iter().enumerate() {
        if columns[c].meta.is_some() {
            unfed.push(c as u32);
            continue;
        }
        if f.is_none() {
            if missing[c] == MissingCell::Reject {
                return Err(cx.err(
                    None,
                    Some(c),
                    format!(
                        "no field of the writer schema feeds it ({}), and it is not Nullable \
                         and has no DEFAULT spate can apply",
                        match &columns[c].path {
                            Some(p) => format!("looked for /{}", p.join("/")),
                            None => format!("looked for `{}`", columns[c].name),
                        }
                    ),
                ));
            }
            unfed.push(c as u32);
        }
    }
    Ok(unfed)
}

/// Checks every column is written once per row; returns whether the ops write in INSERT order.
fn check_writes(
    cx: &Ctx<'_>,
    parent: &[Op],
    element_ops: &[Op],
    unfed: &[u32],
) -> Result<bool, PlanError> {
    // Direct when the columns come out in INSERT order.
    let mut seq = Vec::new();
    for op in parent {
        if matches!(op, Op::Explode) {
            element_ops.iter().for_each(|o| cols_of(o, &mut seq));
        } else {
            cols_of(op, &mut seq);
        }
    }
    // Every column is written exactly once per row (a plan that broke this
    // would misalign the row): checked here, so it is a plan error, never
    // a bad row.
    let mut writes = vec![0u32; cx.columns.len()];
    for &c in &seq {
        writes[c as usize] += 1;
    }
    for &c in unfed {
        writes[c as usize] += 1;
    }
    if let Some(c) = writes.iter().position(|&n| n != 1) {
        return Err(cx.err(
            None,
            Some(c),
            format!(
                "the plan writes the column {} times per row (one field per column)",
                writes[c]
            ),
        ));
    }
    Ok(seq.windows(2).all(|w| w[0] < w[1]))
}

/// Adds the unfed columns' ops: in INSERT order when `direct`, else at the end.
fn place_unfed(
    parent: &mut Vec<Op>,
    element_ops: &mut Vec<Op>,
    unfed: &[u32],
    columns: &[ColumnSpec],
    direct: bool,
) {
    let metas: Vec<bool> = columns.iter().map(|c| c.meta.is_some()).collect();
    let unfed_op = |col: u32| {
        if metas[col as usize] {
            Op::Meta { col }
        } else {
            Op::Missing { col }
        }
    };
    if direct {
        let mut next = 0usize;
        let mut out_parent = Vec::with_capacity(parent.len() + unfed.len());
        for op in parent.drain(..) {
            if matches!(op, Op::Explode) {
                let mut out_el = Vec::with_capacity(element_ops.len() + unfed.len());
                for eop in element_ops.drain(..) {
                    insert_missing(&eop, unfed, &mut next, &mut out_el, &unfed_op);
                    out_el.push(eop);
                }
                *element_ops = out_el;
                out_parent.push(op);
                continue;
            }
            insert_missing(&op, unfed, &mut next, &mut out_parent, &unfed_op);
            out_parent.push(op);
        }
        out_parent.extend(unfed[next..].iter().map(|&col| unfed_op(col)));
        *parent = out_parent;
    } else {
        parent.extend(unfed.iter().map(|&col| unfed_op(col)));
    }
}

/// The first column an op writes.
fn first_col(op: &Op) -> Option<u32> {
    let mut v = Vec::new();
    cols_of(op, &mut v);
    v.first().copied()
}

fn insert_missing(
    op: &Op,
    unfed: &[u32],
    next: &mut usize,
    out: &mut Vec<Op>,
    unfed_op: &impl Fn(u32) -> Op,
) {
    if let Some(f) = first_col(op) {
        while *next < unfed.len() && unfed[*next] < f {
            out.push(unfed_op(unfed[*next]));
            *next += 1;
        }
    }
}

/// The columns an op writes, in order (a branch: its first branch's).
fn cols_of(op: &Op, out: &mut Vec<u32>) {
    match op {
        Op::Put { col, .. } | Op::Missing { col } | Op::Meta { col } => out.push(*col),
        Op::Branch { branches, .. } => {
            if let Some(b) = branches.first() {
                b.iter().for_each(|o| cols_of(o, out));
            }
        }
        Op::Skip(..) | Op::Explode => {}
    }
}

fn kind(s: &Schema) -> &'static str {
    match s {
        Schema::Null => "null",
        Schema::Boolean => "boolean",
        Schema::Int => "int",
        Schema::Long => "long",
        Schema::Float => "float",
        Schema::Double => "double",
        Schema::Bytes => "bytes",
        Schema::String => "string",
        Schema::Array(_) => "an array",
        Schema::Map(_) => "a map",
        Schema::Union(_) => "a union",
        Schema::Record(_) => "a record",
        Schema::Enum(_) => "an enum",
        Schema::Fixed(_) => "fixed",
        Schema::Decimal(_) => "decimal",
        Schema::BigDecimal => "big-decimal",
        Schema::Uuid(_) => "uuid",
        Schema::Date => "date",
        Schema::TimeMillis => "time-millis",
        Schema::TimeMicros => "time-micros",
        Schema::TimestampMillis => "timestamp-millis",
        Schema::TimestampMicros => "timestamp-micros",
        Schema::TimestampNanos => "timestamp-nanos",
        Schema::LocalTimestampMillis => "local-timestamp-millis",
        Schema::LocalTimestampMicros => "local-timestamp-micros",
        Schema::LocalTimestampNanos => "local-timestamp-nanos",
        Schema::Duration(_) => "duration",
        Schema::Ref { .. } => "a reference",
    }
}

fn explode_element<'a>(
    cx: &Ctx<'a>,
    root: &'a RecordSchema,
    path: &[String],
) -> Result<&'a RecordSchema, PlanError> {
    let bad = |reason: String| cx.err(Some(path), None, format!("mapping.explode: {reason}"));
    if path.is_empty() {
        return Err(bad("an empty path".into()));
    }
    let mut rec = root;
    for (k, seg) in path.iter().enumerate() {
        let i = *rec
            .lookup
            .get(seg)
            .ok_or_else(|| bad(format!("no field `{seg}` in record `{}`", rec.name)))?;
        let s = cx.resolve(&rec.fields[i].schema, k)?;
        if k + 1 == path.len() {
            let Schema::Array(a) = s else {
                return Err(bad(format!("the field is {}, not an array", kind(s))));
            };
            return match cx.resolve(&a.items, k + 1)? {
                Schema::Record(r) => Ok(r),
                other => Err(bad(format!(
                    "the array's items are {}, not records (each element's fields become \
                     columns)",
                    kind(other)
                ))),
            };
        }
        match s {
            Schema::Record(r) => rec = r,
            other => {
                return Err(bad(format!(
                    "the path goes through `{seg}`, which is {}, not a record \
                     (explode goes through plain records only)",
                    kind(other)
                )));
            }
        }
    }
    unreachable!("the loop returns at the last segment")
}

/// Skips for the fields before the exploded array, nested records flattened.
fn pre_skips(
    cx: &Ctx<'_>,
    rec: &RecordSchema,
    path: &[String],
    depth: usize,
) -> Result<Box<[Skip]>, PlanError> {
    let mut out = Vec::new();
    let i = rec.lookup[&path[0]];
    for f in &rec.fields[..i] {
        out.push(cx.skip_of(&f.schema, depth + 1)?);
    }
    if path.len() > 1 {
        let Schema::Record(r) = cx.resolve(&rec.fields[i].schema, depth)? else {
            unreachable!("checked by explode_element");
        };
        out.extend(pre_skips(cx, r, &path[1..], depth + 1)?);
    }
    Ok(out.into())
}

fn compile_record(
    cx: &mut Ctx<'_>,
    rec: &RecordSchema,
    prefix: &[String],
    ns: Ns,
    depth: usize,
) -> Result<Vec<Op>, PlanError> {
    let mut ops = Vec::new();
    for f in &rec.fields {
        let mut p = prefix.to_vec();
        p.push(f.name.clone());
        if ns == Ns::Parent && cx.explode.as_deref() == Some(&p[..]) {
            check_explode_unread(cx, &p)?;
            ops.push(Op::Explode);
            continue;
        }
        let exact = cx
            .assigned
            .iter()
            .find(|(n, q, _)| *n == ns && *q == p)
            .map(|(_, _, c)| *c);
        let under = cx
            .assigned
            .iter()
            .any(|(n, q, _)| *n == ns && q.len() > p.len() && q[..p.len()] == p[..]);
        let explode_under = ns == Ns::Parent
            && cx
                .explode
                .as_ref()
                .is_some_and(|e| e.len() > p.len() && e[..p.len()] == p[..]);
        if let Some(col) = exact {
            if under {
                let c = &cx.columns[col];
                return Err(cx.err(
                    Some(&p),
                    Some(col),
                    format!(
                        "the field is a record, which cannot go into a {} column while its \
                         own fields feed other columns",
                        c.ty
                    ),
                ));
            }
            let conv = column_conv(cx, &f.schema, col, &p, depth)?;
            ops.push(Op::Put {
                col: col as u32,
                conv,
            });
        } else if under || explode_under {
            compile_nested(cx, &f.schema, &p, ns, depth, explode_under, &mut ops)?;
        } else {
            let skip = cx.skip_of(&f.schema, depth + 1)?;
            let field = cx.field_idx(&p);
            ops.push(Op::Skip(skip, field));
        }
    }
    Ok(ops)
}

/// Errors when a parent column reads the exploded array at `p` (or into it).
fn check_explode_unread(cx: &Ctx<'_>, p: &[String]) -> Result<(), PlanError> {
    if let Some((_, q, c)) = cx
        .assigned
        .iter()
        .find(|(n, q, _)| *n == Ns::Parent && q.len() >= p.len() && q[..p.len()] == p[..])
    {
        return Err(cx.err(
            Some(q),
            Some(*c),
            "the column reads the exploded array itself (or a path into it that \
             is not an element's field); each row carries one element's fields"
                .into(),
        ));
    }
    Ok(())
}

/// Compiles the ops of field `p` whose own fields feed columns (a record or nullable record).
fn compile_nested(
    cx: &mut Ctx<'_>,
    schema: &Schema,
    p: &[String],
    ns: Ns,
    depth: usize,
    explode_under: bool,
    ops: &mut Vec<Op>,
) -> Result<(), PlanError> {
    let s = cx.resolve(schema, depth)?;
    match s {
        Schema::Record(r) => ops.extend(compile_record(cx, r, p, ns, depth + 1)?),
        Schema::Union(u) if !explode_under => {
            let Some((r, _)) = cx.record_of(s, depth) else {
                return Err(cx.err(
                    Some(p),
                    None,
                    "a union of a record with other non-null types: its fields cannot \
                     feed columns"
                        .into(),
                ));
            };
            let inner = compile_record(cx, r, p, ns, depth + 1)?;
            let mut cols = Vec::new();
            inner.iter().for_each(|o| cols_of(o, &mut cols));
            let branches: Vec<Box<[Op]>> = u
                .variants()
                .iter()
                .map(|v| match cx.resolve(v, depth) {
                    Ok(Schema::Null) => cols
                        .iter()
                        .map(|&col| Op::Missing { col })
                        .collect::<Vec<_>>()
                        .into(),
                    _ => inner.clone().into(),
                })
                .collect();
            let field = cx.field_idx(p);
            ops.push(Op::Branch {
                branches: branches.into(),
                field,
            });
        }
        other => {
            let col = cx
                .assigned
                .iter()
                .find(|(n, q, _)| *n == ns && q.len() > p.len() && q[..p.len()] == p[..])
                .map(|(_, _, c)| *c);
            return Err(cx.err(
                Some(p),
                col,
                format!("the path goes into {}, which has no fields", kind(other)),
            ));
        }
    }
    Ok(())
}

/// The conversion of a field into column `col` (its Nullable wrapper and
/// null branches).
fn column_conv(
    cx: &Ctx<'_>,
    s: &Schema,
    col: usize,
    path: &[String],
    depth: usize,
) -> Result<Conv, PlanError> {
    let ty = &cx.columns[col].ty;
    conv(cx, s, ty, true, depth).map_err(|mut reason| {
        if reason.is_empty() {
            reason = "there is no exact conversion".into();
        }
        cx.err(
            Some(path),
            Some(col),
            format!("{} cannot go into {ty} exactly: {reason}", describe(cx, s)),
        )
    })
}

fn describe(cx: &Ctx<'_>, s: &Schema) -> String {
    match cx.resolve(s, 0) {
        Ok(Schema::Union(u)) => {
            let parts: Vec<&str> = u
                .variants()
                .iter()
                .map(|v| cx.resolve(v, 0).map(kind).unwrap_or("?"))
                .collect();
            format!("the union [{}]", parts.join(", "))
        }
        Ok(other) => format!("Avro {}", kind(other)),
        Err(_) => "an unresolved reference".into(),
    }
}

/// A value of schema `s` into type `ty`; `top`: a null may be the column's
/// missing value (not inside arrays and maps).
fn conv(cx: &Ctx<'_>, s: &Schema, ty: &ChType, top: bool, depth: usize) -> Result<Conv, String> {
    let s = cx.resolve(s, depth).map_err(|e| e.reason)?;
    let ty = ty.without_low_cardinality();
    let (nullable, inner) = match ty {
        ChType::Nullable(t) => (true, t.without_low_cardinality()),
        t => (false, t),
    };
    match s {
        Schema::Union(u) => {
            let mut branches = Vec::new();
            for v in u.variants() {
                let v = cx.resolve(v, depth).map_err(|e| e.reason)?;
                branches.push(match v {
                    Schema::Null if nullable => UBranch::Null,
                    Schema::Null if top => UBranch::Missing,
                    Schema::Null => {
                        return Err(format!(
                            "a null element needs a Nullable element type, not {ty}"
                        ));
                    }
                    Schema::Union(_) => return Err("a union inside a union".into()),
                    other => UBranch::Val(if nullable {
                        Conv::Nullable(Box::new(value(cx, other, inner, depth)?))
                    } else {
                        value(cx, other, inner, depth)?
                    }),
                });
            }
            Ok(Conv::Union(branches.into()))
        }
        Schema::Null if nullable || top => Ok(Conv::Null { nullable }),
        other if nullable => Ok(Conv::Nullable(Box::new(value(cx, other, inner, depth)?))),
        other => value(cx, other, inner, depth),
    }
}

fn int_dst(ty: &ChType) -> Option<IntDst> {
    spate_row::rowbinary::int_shape(ty).map(|(bits, signed)| IntDst { bits, signed })
}

/// A non-union, non-null value into a non-Nullable type.
fn value(cx: &Ctx<'_>, s: &Schema, ty: &ChType, depth: usize) -> Result<Conv, String> {
    use ChType as T;
    let none = || Err::<Conv, String>(String::new());
    let r = match (s, ty) {
        (Schema::Boolean, T::Bool | T::UInt8 | T::Int8) => Conv::Bool,
        (
            Schema::Int
            | Schema::Long
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos,
            _,
        ) => return int_value(s, ty),
        (Schema::Float, T::Float32) => Conv::F32,
        (Schema::Float, T::Float64) => Conv::F32F64,
        (Schema::Double, T::Float64) => Conv::F64,
        (Schema::Double, T::Float32) => {
            return Err("Float32 would round a double".into());
        }
        (
            Schema::String | Schema::Bytes | Schema::Uuid(_) | Schema::Fixed(_) | Schema::Enum(_),
            _,
        ) => return text_value(s, ty),
        (Schema::Decimal(d), T::Decimal { precision, scale }) => {
            decimal(d, *precision, *scale, ty)?
        }
        (Schema::Array(a), T::Array(elem)) => {
            let item = conv(cx, &a.items, elem, false, depth + 1)?;
            let min_len = cx
                .skip_of(&a.items, depth + 1)
                .map_err(|e| e.reason)?
                .min_len();
            Conv::Array {
                item: Box::new(item),
                min_len,
            }
        }
        (Schema::Map(m), T::Map(k, v)) => map_value(cx, &m.types, k, v, depth)?,
        (Schema::Map(_), _) => {
            return Err(
                "an Avro map needs a Map(String, V) column (ClickHouse 18.16 has no Map type: \
                 there such a field can only be skipped)"
                    .into(),
            );
        }
        (Schema::Record(_), _) => {
            return Err("a record goes into columns field by field: map its fields \
                        (pointer paths /record/field or mapping.flatten)"
                .into());
        }
        _ => return none(),
    };
    Ok(r)
}

/// An Avro int, long or time logical type into `ty`.
fn int_value(s: &Schema, ty: &ChType) -> Result<Conv, String> {
    use ChType as T;
    let src32 = matches!(s, Schema::Int | Schema::Date | Schema::TimeMillis);
    let unit = match s {
        Schema::TimestampMillis => Some(3),
        Schema::TimestampMicros => Some(6),
        Schema::TimestampNanos => Some(9),
        _ => None,
    };
    Ok(match ty {
        t if int_dst(t).is_some() => Conv::Int {
            src32,
            dst: int_dst(t).expect("checked"),
        },
        T::Float64 if !matches!(s, Schema::Date) && unit.is_none() => Conv::IntF64 { src32 },
        T::Float32 if !matches!(s, Schema::Date) && unit.is_none() => Conv::IntF32 { src32 },
        T::Decimal { .. } if matches!(s, Schema::Int | Schema::Long) => Conv::IntDecimal {
            src32,
            ty: ty.clone(),
        },
        T::Date | T::Date32 if matches!(s, Schema::Date) => Conv::Date {
            date32: matches!(ty, T::Date32),
        },
        T::DateTime(_) if unit.is_some() => Conv::Time {
            unit: unit.expect("some"),
            to: TimeTo::DateTime,
        },
        T::DateTime64 { precision, .. } if unit.is_some() => Conv::Time {
            unit: unit.expect("some"),
            to: TimeTo::DateTime64(*precision),
        },
        T::DateTime(_) | T::DateTime64 { .. } | T::Date | T::Date32 => {
            return Err(format!(
                "a time column takes only the matching logical type (date into \
                 Date/Date32, timestamp-millis/micros/nanos into DateTime/DateTime64); \
                 a plain or local {} could be read in more than one way",
                kind(s)
            ));
        }
        _ => return Err(String::new()),
    })
}

/// An Avro string, bytes, uuid, fixed or enum into `ty`.
fn text_value(s: &Schema, ty: &ChType) -> Result<Conv, String> {
    use ChType as T;
    Ok(match (s, ty) {
        (Schema::String | Schema::Bytes, T::String) => Conv::Str {
            utf8: matches!(s, Schema::String),
        },
        (Schema::String | Schema::Bytes, T::FixedString(n)) => Conv::StrFixed {
            utf8: matches!(s, Schema::String),
            n: *n,
        },
        (Schema::String, T::Enum8(names)) => Conv::StrEnum {
            names: names
                .iter()
                .map(|(n, v)| (n.as_bytes().into(), i16::from(*v)))
                .collect(),
            w8: true,
        },
        (Schema::String, T::Enum16(names)) => Conv::StrEnum {
            names: names
                .iter()
                .map(|(n, v)| (n.as_bytes().into(), *v))
                .collect(),
            w8: false,
        },
        (Schema::String | Schema::Uuid(UuidSchema::String), T::Uuid) => Conv::StrUuid,
        (Schema::Uuid(UuidSchema::String), T::String) => Conv::Str { utf8: true },
        (Schema::Uuid(UuidSchema::Fixed(f)), T::Uuid) if f.size == 16 => {
            Conv::BinUuid { fixed: true }
        }
        (Schema::Uuid(UuidSchema::Bytes), T::Uuid) => Conv::BinUuid { fixed: false },
        (Schema::Fixed(f), T::FixedString(n)) if f.size <= *n => Conv::Fixed {
            size: f.size,
            n: *n,
            string: false,
        },
        (Schema::Fixed(f), T::FixedString(n)) => {
            return Err(format!("fixed({}) is longer than FixedString({n})", f.size));
        }
        (Schema::Fixed(f), T::String) => Conv::Fixed {
            size: f.size,
            n: 0,
            string: true,
        },
        (Schema::Enum(e), T::String) => Conv::EnumStr {
            symbols: e.symbols.iter().map(|s| s.as_bytes().into()).collect(),
        },
        (Schema::Enum(e), T::Enum8(names)) => Conv::EnumVal {
            values: enum_values(&e.symbols, names.iter().map(|(n, v)| (n, i16::from(*v))))?,
            w8: true,
        },
        (Schema::Enum(e), T::Enum16(names)) => Conv::EnumVal {
            values: enum_values(&e.symbols, names.iter().map(|(n, v)| (n, *v)))?,
            w8: false,
        },
        _ => return Err(String::new()),
    })
}

/// An Avro map (values of schema `vs`) into `Map(k, v)`.
fn map_value(
    cx: &Ctx<'_>,
    vs: &Schema,
    k: &ChType,
    v: &ChType,
    depth: usize,
) -> Result<Conv, String> {
    let key = match k.without_low_cardinality() {
        ChType::String => KeyConv::Str,
        ChType::FixedString(n) => KeyConv::Fixed(*n),
        other => {
            return Err(format!(
                "an Avro map's keys are strings; the column's keys are {other}"
            ));
        }
    };
    Ok(Conv::Map {
        key,
        value: Box::new(conv(cx, vs, v, false, depth + 1)?),
    })
}

fn enum_values<'n>(
    symbols: &[String],
    names: impl Iterator<Item = (&'n String, i16)> + Clone,
) -> Result<Box<[i16]>, String> {
    symbols
        .iter()
        .map(|sym| {
            names
                .clone()
                .find(|(n, _)| *n == sym)
                .map(|(_, v)| v)
                .ok_or_else(|| format!("the symbol `{sym}` is not one of the column's names"))
        })
        .collect()
}

fn decimal(d: &DecimalSchema, precision: u8, scale: u8, ty: &ChType) -> Result<Conv, String> {
    let (p, s) = (d.precision, d.scale);
    if usize::from(scale) < s {
        return Err(format!(
            "decimal({p}, {s}) has {s} digits after the point, the column {scale}"
        ));
    }
    if usize::from(precision - scale) < p.saturating_sub(s) {
        return Err(format!(
            "decimal({p}, {s}) has up to {} digits before the point, the column {}",
            p.saturating_sub(s),
            precision - scale
        ));
    }
    let fixed = match &d.inner {
        InnerDecimalSchema::Bytes => 0,
        InnerDecimalSchema::Fixed(f) => {
            if f.size == 0 {
                return Err("a decimal in fixed(0)".into());
            }
            f.size
        }
    };
    Ok(Conv::Decimal {
        fixed,
        up: u32::from(scale) - s as u32,
        ty: ty.clone(),
    })
}
