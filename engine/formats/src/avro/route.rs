//! The shard router for Avro records: [`ShardKey::Field`] names an Avro
//! field (a path through records; under `explode` an element's field too,
//! as the columns resolve them), [`ShardKey::KafkaKey`] and
//! [`ShardKey::None`] route as every router does ([`ShardPicker`]). The hash
//! is the one [`spate_row::shard`] documents: XXH64 of a string's bytes, of an int or
//! long's decimal text (what a JSON producer would have written), of an
//! enum's symbol ([`KeyHash::Text`]); or the integer read as the key type
//! ([`KeyHash::Typed`], [`KeyHash::Value`]).

use spate_core::pipeline::chain::{RecordCx, RecordError, Router};

use apache_avro::Schema;
use apache_avro::schema::RecordSchema;

use spate_row::shard::{
    KeyHash, KeyType, MissingKey, ShardKey, ShardPicker, ShardSpec, key_hash, weighted_shard,
};

use super::exec::{Cur, skip};
use super::plan::{Plan, Skip};
use super::{AvroMapping, AvroRecord, LocalPlans};

/// Where the key's value starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seg {
    /// The datum's start.
    Start,
    /// The element's start.
    Element,
    /// Right after the exploded array.
    After,
}

/// How the key's value is read.
#[derive(Clone, Debug)]
enum KeyKind {
    Int {
        src32: bool,
    },
    Bytes,
    Enum(Box<[Box<[u8]>]>),
    /// A union: `None` is a null branch.
    Union(Box<[Option<KeyKind>]>),
}

#[derive(Clone, Debug)]
struct KeyLoc {
    seg: Seg,
    skips: Box<[Skip]>,
    kind: KeyKind,
}

/// Routes [`AvroRecord`]s (see the module docs).
pub struct AvroRouter {
    inner: ShardPicker,
    spec: ShardSpec,
    plans: LocalPlans,
    /// Key locators per schema id (the last one first).
    keys: Vec<(Option<u32>, Result<KeyLoc, String>)>,
}

impl AvroMapping {
    /// A router for one pipeline thread, by `spec`.
    pub fn router(self: &std::sync::Arc<Self>, spec: ShardSpec) -> AvroRouter {
        AvroRouter {
            inner: ShardPicker::new(spec.clone()),
            spec,
            plans: LocalPlans::new(self),
            keys: Vec::new(),
        }
    }
}

enum Found<'a> {
    Int(i64),
    Bytes(&'a [u8]),
    Null,
}

fn key_kind(s: &Schema, names: &NameMap<'_>) -> Result<KeyKind, String> {
    let s = resolve(s, names)?;
    Ok(match s {
        Schema::Int | Schema::Date | Schema::TimeMillis => KeyKind::Int { src32: true },
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => KeyKind::Int { src32: false },
        Schema::String | Schema::Bytes | Schema::Uuid(apache_avro::schema::UuidSchema::String) => {
            KeyKind::Bytes
        }
        Schema::Enum(e) => KeyKind::Enum(e.symbols.iter().map(|s| s.as_bytes().into()).collect()),
        Schema::Union(u) => KeyKind::Union(
            u.variants()
                .iter()
                .map(|v| match resolve(v, names) {
                    Ok(Schema::Null) => Ok(None),
                    Ok(Schema::Union(_)) => Err("a union inside a union".to_owned()),
                    Ok(other) => key_kind(other, names).map(Some),
                    Err(e) => Err(e),
                })
                .collect::<Result<_, _>>()?,
        ),
        _ => {
            return Err(
                "a shard key field must be an int, long, string, bytes or enum (or a union of \
                 one with null)"
                    .into(),
            );
        }
    })
}

type NameMap<'s> = std::collections::HashMap<apache_avro::schema::Name, &'s Schema>;

fn resolve<'a>(s: &'a Schema, names: &NameMap<'a>) -> Result<&'a Schema, String> {
    let mut s = s;
    for _ in 0..64 {
        match s {
            Schema::Ref { name } => {
                s = names
                    .get(name)
                    .copied()
                    .ok_or_else(|| format!("`{name}` is never defined"))?;
            }
            other => return Ok(other),
        }
    }
    Err("a reference cycle".into())
}

fn skip_of(s: &Schema, names: &NameMap<'_>, depth: usize) -> Result<Skip, String> {
    if depth > 48 {
        return Err("the schema nests too deep".into());
    }
    let s = resolve(s, names)?;
    Ok(match s {
        Schema::Record(r) => Skip::Record(
            r.fields
                .iter()
                .map(|f| skip_of(&f.schema, names, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Schema::Union(u) => Skip::Union(
            u.variants()
                .iter()
                .map(|v| skip_of(v, names, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Schema::Array(a) => Skip::Array(Box::new(skip_of(&a.items, names, depth + 1)?)),
        Schema::Map(m) => Skip::Map(Box::new(skip_of(&m.types, names, depth + 1)?)),
        Schema::Null => Skip::Zero,
        Schema::Boolean => Skip::Bytes(1),
        Schema::Float => Skip::Bytes(4),
        Schema::Double => Skip::Bytes(8),
        Schema::Bytes | Schema::String | Schema::BigDecimal => Skip::Len,
        Schema::Uuid(apache_avro::schema::UuidSchema::Fixed(f))
        | Schema::Fixed(f)
        | Schema::Duration(f) => Skip::Bytes(f.size),
        Schema::Uuid(_) => Skip::Len,
        Schema::Decimal(d) => match &d.inner {
            apache_avro::schema::InnerDecimalSchema::Bytes => Skip::Len,
            apache_avro::schema::InnerDecimalSchema::Fixed(f) => Skip::Bytes(f.size),
        },
        _ => Skip::Var,
    })
}

/// Walks `rec` for `path`, pushing skips for the fields before it; passing
/// the exploded array (`explode`, relative to `rec`) restarts the skips
/// after it. Returns the key field's schema.
fn walk<'a>(
    rec: &'a RecordSchema,
    path: &[String],
    explode: Option<&[String]>,
    names: &NameMap<'a>,
    skips: &mut Vec<Skip>,
    seg: &mut Seg,
) -> Result<Option<&'a Schema>, String> {
    for f in &rec.fields {
        let on_path = path.first() == Some(&f.name);
        let on_explode = explode.is_some_and(|e| e.first() == Some(&f.name));
        if on_path {
            if path.len() == 1 {
                return Ok(Some(&f.schema));
            }
            let Schema::Record(r) = resolve(&f.schema, names)? else {
                return Err(format!("`{}` is not a record", f.name));
            };
            let ex = explode.filter(|_| on_explode).map(|e| &e[1..]);
            return walk(r, &path[1..], ex, names, skips, seg);
        }
        if on_explode {
            let e = explode.expect("on_explode");
            if e.len() == 1 {
                skips.clear();
                *seg = Seg::After;
                continue;
            }
            let Schema::Record(r) = resolve(&f.schema, names)? else {
                return Err("the explode path goes through a non-record".into());
            };
            // Skip the rest of this record after the array.
            if walk(r, &[], Some(&e[1..]), names, skips, seg)?.is_some() {
                unreachable!("an empty path finds nothing");
            }
            continue;
        }
        skips.push(skip_of(&f.schema, names, 1)?);
    }
    Ok(None)
}

fn locate(plan: &Plan, path: &[String]) -> Result<KeyLoc, String> {
    let resolved = apache_avro::schema::ResolvedSchema::new(&plan.schema)
        .map_err(|e| format!("the schema does not resolve: {e}"))?;
    let names = resolved.get_names();
    let Schema::Record(root) = resolve(&plan.schema, names)? else {
        return Err("the top-level schema is not a record".into());
    };
    let explode = plan_explode_path(plan);
    // Through the exploded array: the element's field.
    let try_element = |rel: &[String]| -> Result<Option<KeyLoc>, String> {
        let Some(ex) = &explode else {
            return Ok(None);
        };
        let mut rec = root;
        for (k, seg) in ex.iter().enumerate() {
            let i = rec.lookup[seg];
            let s = resolve(&rec.fields[i].schema, names)?;
            if k + 1 == ex.len() {
                let Schema::Array(a) = s else { return Ok(None) };
                let Schema::Record(el) = resolve(&a.items, names)? else {
                    return Ok(None);
                };
                let mut skips = Vec::new();
                let mut seg = Seg::Element;
                return match walk(el, rel, None, names, &mut skips, &mut seg)? {
                    Some(s) => Ok(Some(KeyLoc {
                        seg,
                        skips: skips.into(),
                        kind: key_kind(s, names)?,
                    })),
                    None => Ok(None),
                };
            }
            let Schema::Record(r) = s else {
                return Ok(None);
            };
            rec = r;
        }
        Ok(None)
    };
    if let Some(ex) = &explode
        && path.len() > ex.len()
        && path[..ex.len()] == ex[..]
        && let Some(loc) = try_element(&path[ex.len()..])?
    {
        return Ok(loc);
    }
    let mut skips = Vec::new();
    let mut seg = Seg::Start;
    if let Some(s) = walk(root, path, explode.as_deref(), names, &mut skips, &mut seg)? {
        return Ok(KeyLoc {
            seg,
            skips: skips.into(),
            kind: key_kind(s, names)?,
        });
    }
    if let Some(loc) = try_element(path)? {
        return Ok(loc);
    }
    Err(format!(
        "the writer schema has no field /{}",
        path.join("/")
    ))
}

fn plan_explode_path(plan: &Plan) -> Option<Vec<String>> {
    plan.explode
        .as_ref()
        .map(|e| e.field.split('/').map(str::to_owned).collect())
}

fn read_key<'x>(loc: &'x KeyLoc, rec: &AvroRecord<'x>) -> Result<Found<'x>, String> {
    let start = match loc.seg {
        Seg::Start => 0,
        Seg::Element => rec
            .element
            .map(|e| e.start as usize)
            .ok_or("not fanned out")?,
        Seg::After => rec
            .element
            .map(|e| e.after as usize)
            .ok_or("not fanned out")?,
    };
    let end = match loc.seg {
        Seg::Element => rec.element.map(|e| e.end as usize).unwrap_or(0),
        _ => rec.datum.len(),
    };
    let mut c = Cur::new(rec.datum.get(..end).ok_or("bad element")?, start);
    for s in loc.skips.iter() {
        skip(s, &mut c).map_err(|f| f.describe(None))?;
    }
    read_kind(&loc.kind, &mut c).map_err(|f| f.describe(None))
}

fn read_kind<'x>(kind: &'x KeyKind, c: &mut Cur<'x>) -> Result<Found<'x>, super::exec::Fail> {
    Ok(match kind {
        KeyKind::Int { src32: true } => Found::Int(c.int()?),
        KeyKind::Int { src32: false } => Found::Int(c.long()?),
        KeyKind::Bytes => {
            let (a, b) = c.len_bytes()?;
            Found::Bytes(&c.s[a..b])
        }
        KeyKind::Enum(symbols) => {
            let i = c.int()?;
            let s = usize::try_from(i)
                .ok()
                .and_then(|i| symbols.get(i))
                .ok_or(super::exec::Fail::BadEnum(i))?;
            return Ok(Found::Bytes(s));
        }
        KeyKind::Union(branches) => {
            let i = c.long()?;
            let b = usize::try_from(i)
                .ok()
                .and_then(|i| branches.get(i))
                .ok_or(super::exec::Fail::BadBranch(i))?;
            match b {
                None => Found::Null,
                Some(k) => return read_kind(k, c),
            }
        }
    })
}

impl AvroRouter {
    fn key_value(&mut self, record: &AvroRecord<'_>) -> Result<Option<u64>, RecordError> {
        let ShardKey::Field(path) = &self.spec.key else {
            unreachable!("only for field keys");
        };
        let id = record.schema_id;
        if self.keys.first().is_none_or(|(i, _)| *i != id) {
            match self.keys.iter().position(|(i, _)| *i == id) {
                Some(p) => self.keys.swap(0, p),
                None => {
                    let plan = self.plans.get(id)?;
                    let loc = locate(plan, path);
                    self.keys.push((id, loc));
                    let n = self.keys.len() - 1;
                    self.keys.swap(0, n);
                }
            }
        }
        let name = path.join("/");
        let loc = match &self.keys[0].1 {
            Ok(l) => l,
            Err(e) => {
                return Err(RecordError::encode(
                    &name,
                    format!(
                        "{}: the shard key field `{name}` (sink.clickhouse.shard_key): {e}",
                        super::schema_name(id)
                    ),
                ));
            }
        };
        let found = read_key(loc, record).map_err(|e| {
            RecordError::decode(format!(
                "{}: the shard key field `{name}`: {e}",
                super::schema_name(id)
            ))
        })?;
        let bad = |why: &str| {
            RecordError::encode(
                &name,
                format!(
                    "the shard key `{name}` does not fit sink.clickhouse.shard_key.type: {why}"
                ),
            )
        };
        let h = match (found, self.spec.hash) {
            (Found::Null, _) => return Ok(None),
            (Found::Bytes(b), KeyHash::Text | KeyHash::Typed(KeyType::String)) => key_hash(b),
            (Found::Bytes(_), _) => return Err(bad("a string where an integer is expected")),
            (Found::Int(v), KeyHash::Text | KeyHash::Typed(KeyType::String)) => {
                let mut buf = [0u8; 20];
                key_hash(itoa(v, &mut buf))
            }
            (Found::Int(v), KeyHash::Typed(t)) => {
                let mut b = [0u8; 8];
                let n = t.int_bytes(i128::from(v), &mut b).map_err(bad)?;
                key_hash(&b[..n])
            }
            (Found::Int(v), KeyHash::Value(t)) => {
                let mut b = [0u8; 8];
                t.int_bytes(i128::from(v), &mut b).map_err(bad)?;
                u64::from_le_bytes(b)
            }
        };
        Ok(Some(h))
    }
}

/// `v`'s decimal text in `buf`.
fn itoa(v: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let neg = v < 0;
    let mut m = v.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if neg {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}

impl<'a> Router<AvroRecord<'a>> for AvroRouter {
    fn route(&mut self, record: &AvroRecord<'a>, cx: &RecordCx<'_>, shards: usize) -> usize {
        match self.try_route(record, cx, shards) {
            Ok(s) => s,
            Err(_) => self.inner.unkeyed_round(shards),
        }
    }

    fn try_route(
        &mut self,
        record: &AvroRecord<'a>,
        cx: &RecordCx<'_>,
        shards: usize,
    ) -> Result<usize, RecordError> {
        match &self.spec.key {
            ShardKey::None | ShardKey::KafkaKey => self
                .inner
                .pick_unfielded(cx.payload.key, shards)
                .map_err(|e| self.inner.record_error(&e)),
            ShardKey::Field(_) => match self.key_value(record)? {
                Some(h) => Ok(weighted_shard(h, shards, &self.spec.weights)),
                None if self.spec.missing == MissingKey::RoundRobin => {
                    Ok(self.inner.unkeyed_round(shards))
                }
                None => {
                    let name = match &self.spec.key {
                        ShardKey::Field(p) => p.join("/"),
                        _ => unreachable!(),
                    };
                    Err(RecordError::encode(
                        &name,
                        format!("the shard key field `{name}` (sink.clickhouse.shard_key) is null"),
                    ))
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::itoa;

    #[test]
    fn itoa_writes_decimal_text() {
        let mut b = [0u8; 20];
        assert_eq!(itoa(0, &mut b), b"0");
        assert_eq!(itoa(-42, &mut b), b"-42");
        assert_eq!(itoa(i64::MIN, &mut b), b"-9223372036854775808");
        assert_eq!(itoa(i64::MAX, &mut b), b"9223372036854775807");
    }
}
