//! The plan compiler: a message descriptor and the table's [`ColumnSpec`]s
//! become a [`Plan`], the tables the hot-path decoder (`decode`)
//! follows.
//!
//! **Fields by name**, as the JSON mapper finds them: a column reads the
//! field of its name, or its [`ColumnSpec::path`] (`/meta/source`: through
//! nested messages), or with a flatten join every split of its name; of the
//! candidate paths, the one the message has is taken (two is a plan error:
//! ambiguous). A column whose path the message lacks always takes its
//! [`MissingValue`]; with [`MissingValue::Reject`] that is a plan error
//! naming the schema, the path and the column.
//!
//! **Types that carry exactly** (a proto type into a column type that holds
//! every value of it; anything else is a plan error naming message, field
//! and column):
//!
//! | proto | ClickHouse |
//! |---|---|
//! | int32, sint32, sfixed32 | Int32, Int64, Int128, Int256 |
//! | int64, sint64, sfixed64 | Int64, Int128, Int256 |
//! | uint32, fixed32 | UInt32, UInt64, UInt128, UInt256, Int64, Int128, Int256 |
//! | uint64, fixed64 | UInt64, UInt128, UInt256, Int128, Int256 |
//! | bool | Bool, any integer type (0 or 1) |
//! | float | Float32, Float64 |
//! | double | Float64 |
//! | string, bytes | String |
//! | enum | String (the value's name), Enum8/16 (by name: every proto value's name must be in the column's enum), Int32 and wider (the number) |
//! | repeated T | Array(T) (also Array(Nullable(T))) |
//! | map<K, V> (scalar K, V) | Map(K, V) |
//! | google.protobuf.Timestamp | DateTime64(p) (a value with nanoseconds below 10^-p s is a record error, never truncated), DateTime (a fraction is a record error, as the JSON mapper does) |
//! | google.protobuf.*Value wrappers | the wrapped type's columns, Nullable for an absent one |
//!
//! Nullable(T) and LowCardinality(T) take what T takes.
//!
//! **Absent fields.** A proto3 scalar without `optional` has implicit
//! presence: absent on the wire *is* its default value (0, "", false, the
//! enum's 0), so the column gets that value, never its
//! [`ColumnSpec::missing`] (that would replace a value Protobuf says is
//! there). A field with explicit presence (proto3 `optional`, a oneof
//! member, a message such as Timestamp or a wrapper, proto2 `optional`)
//! that is absent is missing: NULL, the DEFAULT, the server's DEFAULT, or a
//! record error, exactly as the JSON mapper does. An absent repeated field
//! or map is empty. A column under a nested message that is absent is
//! missing too (its implicit default applies only inside a message that is
//! there).
//!
//! A proto2 `optional` field has explicit presence too: absent, it is
//! missing (its `[default = ...]` is not applied; give the column the same
//! DEFAULT).
//!
//! Not supported (plan errors): a column on a repeated message or a map
//! with message values, a path through a oneof member message, proto2
//! groups as columns, an integer into DateTime64 (use a Timestamp).

use std::collections::BTreeMap;

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};

use super::conv::conv_for;
pub(crate) use super::conv::{Conv, Dst, Fast, Src, TimeDst, Wire};
use spate_row::spec::{ColumnSpec, MappingError, MappingOptions, MissingValue};
use spate_row::types::ChType;

/// A plan that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The column list is unusable (empty, bad DEFAULT literal).
    #[error(transparent)]
    Mapping(#[from] MappingError),
    /// A column that cannot be fed from this message.
    #[error("{schema}, message `{message}`, field `{field}`, column `{column}`: {reason}")]
    Column {
        /// The schema as errors name it: `Protobuf schema id 7`, or
        /// `Protobuf schema `file``.
        schema: String,
        /// The message's full name.
        message: String,
        /// The field path (`meta.source`), or the path looked for.
        field: String,
        /// The column.
        column: String,
        /// Why.
        reason: String,
    },
}

/// How a column is filled.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ColKind {
    /// A singular scalar; `implicit`: absent means its default value.
    Scalar { conv: Conv, implicit: bool },
    /// A wrapper message's `value` (field 1).
    Wrapper { conv: Conv },
    /// A Timestamp.
    Time { dst: TimeDst, nullable: bool },
    /// A repeated scalar into Array.
    List { conv: Conv },
    /// A map into Map.
    Map { key: Conv, value: Conv },
    /// The message has no such field: always missing.
    Absent,
}

/// One column's plan.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ColPlan {
    pub name: String,
    pub kind: ColKind,
    /// The node (message level) the field sits in; its `seen` flag says
    /// whether the enclosing message was there.
    pub node: u32,
    pub missing: MissingValue,
    /// The encoded DEFAULT literal for [`MissingValue::Literal`].
    pub default: Option<Vec<u8>>,
    /// The field path, for errors.
    pub field: String,
}

/// What a field number does in one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Skip the value (a field no column reads); `clears` the columns of
    /// its oneof's other members.
    Skip { clears: (u32, u32) },
    /// A singular scalar into column `col`.
    Scalar {
        col: u32,
        wire: Wire,
        utf8: bool,
        clears: (u32, u32),
    },
    /// A repeated scalar (packed or not).
    List { col: u32, wire: Wire, utf8: bool },
    /// A map entry.
    Map { col: u32 },
    /// A nested message holding columns.
    Node { node: u32 },
    /// A Timestamp.
    Time { col: u32, clears: (u32, u32) },
    /// A wrapper.
    Wrapper {
        col: u32,
        wire: Wire,
        utf8: bool,
        clears: (u32, u32),
    },
}

/// One message level of the plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Node {
    /// Field number -> action index + 1 (0: skip), for numbers below
    /// [`DENSE_LIMIT`].
    pub dense: Vec<u16>,
    /// `(number, action)` for larger numbers, sorted.
    pub sparse: Vec<(u32, u16)>,
    pub actions: Vec<Action>,
}

/// Field numbers below this are looked up in a table.
const DENSE_LIMIT: u32 = 256;

impl Node {
    #[inline]
    pub(crate) fn action(&self, number: u32) -> Option<&Action> {
        let i = if number < DENSE_LIMIT {
            *self.dense.get(number as usize)?
        } else {
            let k = self.sparse.binary_search_by_key(&number, |e| e.0).ok()?;
            self.sparse[k].1 + 1
        };
        if i == 0 {
            None
        } else {
            self.actions.get(usize::from(i - 1))
        }
    }

    fn set(&mut self, number: u32, action: Action) {
        self.actions.push(action);
        let i = self.actions.len() as u16;
        if number < DENSE_LIMIT {
            if self.dense.len() <= number as usize {
                self.dense.resize(number as usize + 1, 0);
            }
            self.dense[number as usize] = i;
        } else {
            self.sparse.push((number, i - 1));
            self.sparse.sort_unstable();
        }
    }
}

/// The compiled plan for one message type and one table.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub(crate) nodes: Vec<Node>,
    pub(crate) cols: Vec<ColPlan>,
    /// Column indexes a oneof member clears (ranges into this).
    pub(crate) clear_lists: Vec<u32>,
    /// Rows are `RowBinaryWithDefaults`.
    pub(crate) with_defaults: bool,
    /// The schema named in errors (registry id or file).
    pub(crate) schema: String,
    /// The message's full name.
    pub(crate) message: String,
}

impl Plan {
    /// Whether rows are `RowBinaryWithDefaults` (some column has
    /// [`MissingValue::ServerDefault`]); the INSERT must name that format.
    pub fn with_defaults(&self) -> bool {
        self.with_defaults
    }

    /// The message's full name.
    pub fn message(&self) -> &str {
        &self.message
    }
}

fn well_known(msg: &MessageDescriptor) -> Option<&'static str> {
    let n = msg.full_name();
    n.strip_prefix("google.protobuf.").and_then(|s| {
        Some(match s {
            "Timestamp" => "Timestamp",
            "DoubleValue" | "FloatValue" | "Int64Value" | "UInt64Value" | "Int32Value"
            | "UInt32Value" | "BoolValue" | "StringValue" | "BytesValue" => "Wrapper",
            _ => return None,
        })
    })
}

/// Compiles the plan for `message` and `columns` (INSERT order).
/// `schema` names the schema in errors (`Protobuf schema id 7`, or
/// ``Protobuf schema `event.pb` ``).
///
/// # Errors
/// [`PlanError`]: no columns, a bad DEFAULT literal, a column whose field
/// is absent and may not be missing, a type that does not carry exactly,
/// an ambiguous flattened path.
pub fn compile(
    message: &MessageDescriptor,
    columns: &[ColumnSpec],
    options: &MappingOptions,
    schema: &str,
) -> Result<Plan, PlanError> {
    if columns.is_empty() {
        return Err(MappingError::NoColumns.into());
    }
    let mut plan = Plan {
        nodes: vec![Node::default()],
        cols: Vec::with_capacity(columns.len()),
        clear_lists: Vec::new(),
        with_defaults: columns
            .iter()
            .any(|c| c.missing == MissingValue::ServerDefault),
        schema: schema.to_owned(),
        message: message.full_name().to_owned(),
    };
    let mut tables = Tables {
        node_msgs: vec![message.clone()],
        child_nodes: BTreeMap::new(),
        leaves: BTreeMap::new(),
    };
    for ci in 0..columns.len() {
        plan_column(
            &mut plan,
            &mut tables,
            message,
            columns,
            ci,
            options,
            schema,
        )?;
    }
    fill_nodes(&mut plan, &tables);
    Ok(plan)
}

/// (node, field number) -> column or node, to build each node's table.
struct Tables {
    /// Each node's message.
    node_msgs: Vec<MessageDescriptor>,
    /// (node, field number) -> the child node it descends into.
    child_nodes: BTreeMap<(u32, u32), u32>,
    /// (node, field number) -> the column it feeds and its field.
    leaves: BTreeMap<(u32, u32), (u32, FieldDescriptor)>,
}

/// The error for column `c` at `field`.
fn column_err(
    schema: &str,
    message: &MessageDescriptor,
    c: &ColumnSpec,
    field: &str,
    reason: String,
) -> PlanError {
    PlanError::Column {
        schema: schema.to_owned(),
        message: message.full_name().to_owned(),
        field: field.to_owned(),
        column: c.name.clone(),
        reason,
    }
}

/// Plans column `ci`: finds its field, walks nodes to it and pushes its [`ColPlan`].
fn plan_column(
    plan: &mut Plan,
    tables: &mut Tables,
    message: &MessageDescriptor,
    columns: &[ColumnSpec],
    ci: usize,
    options: &MappingOptions,
    schema: &str,
) -> Result<(), PlanError> {
    let c = &columns[ci];
    let err = |field: &str, reason: String| column_err(schema, message, c, field, reason);
    // Kafka metadata columns (`_offset`, ...: `spate_row::meta`) are
    // written by the JSON mappers only so far; refusing them here keeps
    // a Nullable one from landing as NULL.
    if let Some(source) = &c.meta {
        return Err(err(
            &source.to_string(),
            format!(
                "the column takes Kafka metadata ({source}), which the Protobuf encoder \
                 does not write yet; rename it, or read a field with `mapping.rename`"
            ),
        ));
    }
    let candidates = c.source_paths(options.flatten_join.as_deref());
    let found = column_field(message, &candidates, &err)?;
    let default = match &c.missing {
        MissingValue::Literal(lit) => Some(spate_row::spec::encode_literal(c, lit, &options.time)?),
        _ => None,
    };
    let Some((fields, field_name)) = found else {
        return push_absent(plan, c, &candidates, default, &err);
    };
    let (leaf, parents) = fields.split_last().expect("paths are non-empty");
    let node = walk_nodes(plan, tables, parents, &field_name, &err)?;
    let key = (node, leaf.number());
    if tables.child_nodes.contains_key(&key) {
        return Err(err(
            &field_name,
            format!("`{}` is a message other columns read into", leaf.name()),
        ));
    }
    if let Some((other, _)) = tables.leaves.get(&key) {
        return Err(MappingError::DuplicatePath {
            first: columns[*other as usize].name.clone(),
            second: c.name.clone(),
            path: field_name.split('.').map(str::to_owned).collect(),
        }
        .into());
    }
    let kind = leaf_kind(leaf, &c.ty).map_err(|r| err(&field_name, r))?;
    tables.leaves.insert(key, (ci as u32, leaf.clone()));
    plan.cols.push(ColPlan {
        name: c.name.clone(),
        kind,
        node,
        missing: c.missing.clone(),
        default,
        field: field_name,
    });
    Ok(())
}

/// Plans column `c` that no field feeds, or errors when it may not be missing.
fn push_absent(
    plan: &mut Plan,
    c: &ColumnSpec,
    candidates: &[Vec<String>],
    default: Option<Vec<u8>>,
    err: &impl Fn(&str, String) -> PlanError,
) -> Result<(), PlanError> {
    if c.missing == MissingValue::Reject {
        return Err(err(
            &candidates[0].join("."),
            "the message has no such field, and the column is not Nullable and has no DEFAULT spate can apply"
                .into(),
        ));
    }
    plan.cols.push(ColPlan {
        name: c.name.clone(),
        kind: ColKind::Absent,
        node: 0,
        missing: c.missing.clone(),
        default,
        field: candidates[0].join("."),
    });
    Ok(())
}

/// The one field path among `candidates` the message has (`None`: none), or an ambiguity error.
fn column_field(
    message: &MessageDescriptor,
    candidates: &[Vec<String>],
    err: &impl Fn(&str, String) -> PlanError,
) -> Result<Option<(Vec<FieldDescriptor>, String)>, PlanError> {
    let mut found: Vec<(Vec<FieldDescriptor>, String)> = Vec::new();
    for p in candidates {
        if let Some(fields) = resolve(message, p) {
            found.push((fields, p.join(".")));
        }
    }
    if found.len() > 1 {
        return Err(err(
            &found[0].1,
            format!(
                "ambiguous: the flattened name matches the paths {}",
                found
                    .iter()
                    .map(|f| f.1.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok(found.pop())
}

/// Walks the message fields `parents` down from the root, making nodes; returns the leaf's node.
fn walk_nodes(
    plan: &mut Plan,
    tables: &mut Tables,
    parents: &[FieldDescriptor],
    field_name: &str,
    err: &impl Fn(&str, String) -> PlanError,
) -> Result<u32, PlanError> {
    let mut node = 0u32;
    for f in parents {
        if f.is_list() || f.is_map() {
            return Err(err(
                field_name,
                format!(
                    "`{}` is repeated: a column cannot read into a repeated message",
                    f.name()
                ),
            ));
        }
        // A proto3 `optional` message sits in a synthetic oneof of
        // its own: nothing to clear, so a path through it is fine.
        if f.containing_oneof().is_some() && !f.field_descriptor_proto().proto3_optional() {
            return Err(err(
                field_name,
                format!(
                    "`{}` is a oneof member: paths through oneof messages are not supported",
                    f.name()
                ),
            ));
        }
        let key = (node, f.number());
        if tables.leaves.contains_key(&key) {
            return Err(err(
                field_name,
                format!("`{}` is also read whole by another column", f.name()),
            ));
        }
        node = match tables.child_nodes.get(&key) {
            Some(&n) => n,
            None => {
                let n = plan.nodes.len() as u32;
                plan.nodes.push(Node::default());
                let Kind::Message(m) = f.kind() else {
                    unreachable!("resolve walks messages")
                };
                tables.node_msgs.push(m);
                tables.child_nodes.insert(key, n);
                n
            }
        };
    }
    Ok(node)
}

/// Fills every node's field table from `tables`.
fn fill_nodes(plan: &mut Plan, tables: &Tables) {
    // The field tables: every field of every node's message, so oneof
    // members that feed no column still clear the ones that do.
    for (ni, msg) in tables.node_msgs.iter().enumerate() {
        let ni = ni as u32;
        for f in msg.fields() {
            if let Some(action) = field_action(plan, tables, ni, &f) {
                plan.nodes[ni as usize].set(f.number(), action);
            }
        }
    }
}

/// The action for field `f` of node `ni` (`None`: the field is skipped and clears nothing).
fn field_action(plan: &mut Plan, tables: &Tables, ni: u32, f: &FieldDescriptor) -> Option<Action> {
    let clears = oneof_clears(&mut plan.clear_lists, ni, f, &tables.leaves);
    Some(
        if let Some(&child) = tables.child_nodes.get(&(ni, f.number())) {
            Action::Node { node: child }
        } else if let Some((col, _)) = tables.leaves.get(&(ni, f.number())) {
            let col = *col;
            match &plan.cols[col as usize].kind {
                ColKind::Scalar { conv, .. } => Action::Scalar {
                    col,
                    wire: conv.src.wire(),
                    utf8: conv.src == Src::String,
                    clears,
                },
                ColKind::Wrapper { conv } => Action::Wrapper {
                    col,
                    wire: conv.src.wire(),
                    utf8: conv.src == Src::String,
                    clears,
                },
                ColKind::Time { .. } => Action::Time { col, clears },
                ColKind::List { conv } => Action::List {
                    col,
                    wire: conv.src.wire(),
                    utf8: conv.src == Src::String,
                },
                ColKind::Map { .. } => Action::Map { col },
                ColKind::Absent => unreachable!("absent columns have no leaf"),
            }
        } else if clears.0 != clears.1 {
            Action::Skip { clears }
        } else {
            return None;
        },
    )
}

/// The columns a oneof member's arrival clears: those fed by the other
/// members of its oneof in the same node.
fn oneof_clears(
    lists: &mut Vec<u32>,
    node: u32,
    f: &FieldDescriptor,
    leaves: &BTreeMap<(u32, u32), (u32, FieldDescriptor)>,
) -> (u32, u32) {
    let start = lists.len() as u32;
    if let Some(oneof) = f.containing_oneof() {
        for other in oneof.fields() {
            if other.number() == f.number() {
                continue;
            }
            if let Some((col, _)) = leaves.get(&(node, other.number())) {
                lists.push(*col);
            }
        }
    }
    (start, lists.len() as u32)
}

/// The fields along `path` from `message`, `None` when one is missing or a
/// non-last one is not a message.
fn resolve(message: &MessageDescriptor, path: &[String]) -> Option<Vec<FieldDescriptor>> {
    let mut out = Vec::with_capacity(path.len());
    let mut msg = message.clone();
    for (i, seg) in path.iter().enumerate() {
        let f = msg.get_field_by_name(seg)?;
        if i + 1 < path.len() {
            match f.kind() {
                Kind::Message(m) if !f.is_map() && well_known(&m).is_none() => msg = m,
                _ => return None,
            }
        }
        out.push(f);
    }
    Some(out)
}

/// How the leaf field `f` fills a column of type `ty`.
fn leaf_kind(f: &FieldDescriptor, ty: &ChType) -> Result<ColKind, String> {
    let bare = ty.without_low_cardinality();
    if f.is_map() {
        let ChType::Map(kt, vt) = bare else {
            return Err(format!("a map field goes into a Map column, not {ty}"));
        };
        let Kind::Message(entry) = f.kind() else {
            unreachable!("maps are messages")
        };
        let (kf, vf) = (entry.map_entry_key_field(), entry.map_entry_value_field());
        let scalar = |f: &FieldDescriptor, t: &ChType| {
            let k = f.kind();
            let src = Src::of(&k).ok_or_else(|| {
                format!(
                    "map values of message type are not supported (`{}`)",
                    f.full_name()
                )
            })?;
            conv_for(src, k.as_enum(), t)
        };
        return Ok(ColKind::Map {
            key: scalar(&kf, kt)?,
            value: scalar(&vf, vt)?,
        });
    }
    if f.is_list() {
        let ChType::Array(elem) = bare else {
            return Err(format!(
                "a repeated field goes into an Array column, not {ty}"
            ));
        };
        let k = f.kind();
        let src = Src::of(&k)
            .ok_or_else(|| "repeated messages are not supported as columns".to_owned())?;
        return Ok(ColKind::List {
            conv: conv_for(src, k.as_enum(), elem)?,
        });
    }
    if f.is_group() {
        return Err("proto2 groups are not supported".into());
    }
    match f.kind() {
        Kind::Message(m) => match well_known(&m) {
            Some("Timestamp") => {
                let (nullable, t) = match bare {
                    ChType::Nullable(inner) => (true, inner.without_low_cardinality()),
                    t => (false, t),
                };
                let dst = match t {
                    ChType::DateTime64 { precision, .. } => TimeDst::Ticks {
                        precision: *precision,
                    },
                    ChType::DateTime(_) => TimeDst::Seconds,
                    _ => {
                        return Err(format!(
                            "a google.protobuf.Timestamp goes into DateTime64 or DateTime, not {ty}"
                        ));
                    }
                };
                Ok(ColKind::Time { dst, nullable })
            }
            Some(_) => {
                let v = m.get_field(1).ok_or("a wrapper without its value field")?;
                let k = v.kind();
                let src = Src::of(&k).ok_or("a wrapper of a message")?;
                Ok(ColKind::Wrapper {
                    conv: conv_for(src, k.as_enum(), ty)?,
                })
            }
            None => Err(format!(
                "`{}` is a message: map its fields with paths (`/{}/<field>`)",
                m.full_name(),
                f.name()
            )),
        },
        k => {
            let src = Src::of(&k).expect("non-message kinds are scalars");
            Ok(ColKind::Scalar {
                conv: conv_for(src, k.as_enum(), ty)?,
                implicit: !f.supports_presence(),
            })
        }
    }
}
