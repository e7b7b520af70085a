//! Kafka metadata as columns: a column may take the message's topic,
//! partition, offset, timestamp, key or headers instead of a field of the
//! record ([`MetaSource`]), written straight into the row as RowBinary by
//! [`encode_meta`], the one function every encoder (JSON here, Avro,
//! Protobuf) calls for such a column.
//!
//! **Names** follow the ClickHouse Kafka engine's virtual columns
//! (<https://clickhouse.com/docs/engines/table-engines/integrations/kafka#virtual-columns>:
//! `_topic`, `_key`, `_offset`, `_timestamp`, `_timestamp_ms`, `_partition`,
//! `_headers.name`, `_headers.value`), plus `_headers` (all headers as one
//! Map or Array of pairs), `_header.NAME` (one header), `_timestamp_type`
//! and `_timestamp_s`.
//!
//! **Nothing silently truncated** (DESIGN "Nothing lost, nothing wrong"):
//! `_timestamp` is Kafka's millisecond timestamp; a DateTime64 of precision
//! 3 or more keeps it exactly, and a `DateTime` (whole seconds) or a
//! DateTime64 of precision below 3 takes it only when no digit is lost,
//! else the record is an error naming the column. Dropping the
//! milliseconds on purpose is `_timestamp_s` (the timestamp floored to
//! whole seconds). The Kafka engine's `_timestamp` is a `DateTime` that
//! drops them silently; here that needs the explicit name. Integers are
//! range-checked (`_offset` into UInt32 fails the record past 2^32-1).
//!
//! **Absent values** (a null key, no header of that name or a null one,
//! no timestamp): [`encode_meta`] writes nothing and returns
//! [`MetaPut::Absent`]; the caller applies the column's missing-value rule
//! as for a missing field (NULL, the DEFAULT, or a record error).
//!
//! **Cost.** No allocation: every value is borrowed from the payload and
//! written into the row buffer. Reading headers makes the Kafka lane parse
//! the message's headers (inside librdkafka) the first time they are read;
//! a mapping without header columns never does. Types are checked once,
//! when the mapping is planned ([`MetaSource::check_type`]).

use std::fmt;

use spate_core::pipeline::chain::RecordError;
use spate_core::record::Payload;

use crate::coerce::{DATETIME64_MAX_SECS, DATETIME64_MIN_SECS, Put, TimeRules, Tok, put_scalar};
use crate::rowbinary::{int_shape, put_leb128, put_string};
use crate::types::ChType;

/// Where a column's value comes from when it is not the record: one piece
/// of the Kafka message's metadata. See the module docs for the names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MetaSource {
    /// `_topic`: the topic name. String, FixedString or Enum columns.
    Topic,
    /// `_partition`: the partition number. Integer columns.
    Partition,
    /// `_offset`: the message's offset. Integer columns (UInt64 or Int64
    /// hold every offset).
    Offset,
    /// `_timestamp` (also spelled `_timestamp_ms`): milliseconds since the
    /// Unix epoch. DateTime64 (exact at precision >= 3), DateTime (only
    /// whole seconds, else a record error) or an integer column (the
    /// milliseconds).
    Timestamp,
    /// `_timestamp_s`: the timestamp floored to whole seconds, the explicit
    /// choice to drop its milliseconds. DateTime, DateTime64 or an integer
    /// column (the seconds).
    TimestampSeconds,
    /// `_timestamp_type`: `CreateTime`, `LogAppendTime` or
    /// `NoTimestampType` into String, FixedString or Enum columns; 0, 1 or
    /// -1 (Kafka's ids) into integer columns.
    TimestampType,
    /// `_key`: the message key's bytes. A String column stores them as
    /// they are; another scalar type reads them as a JSON string holding
    /// that text would be read (`"42"` into UInt64, a date text into
    /// DateTime, default time rules). A null key is absent.
    Key,
    /// `_headers`: every header as (name, value) pairs in the producer's
    /// order, repeated names kept: `Map(String, String)` (where the server
    /// has Map) or `Array(Tuple(String, String))`; the value type may be
    /// Nullable (a null value is NULL; into a non-Nullable value type it is
    /// a record error).
    Headers,
    /// `_headers.name`: the header names in order, `Array(String)` (with
    /// `_headers.value`, the Kafka engine's Nested `_headers`).
    HeaderNames,
    /// `_headers.value`: the header values in order, `Array(String)` or
    /// `Array(Nullable(String))`.
    HeaderValues,
    /// `_header.NAME`: the value of the header named `NAME` (the last one
    /// when the name repeats, as Kafka's `Headers.lastHeader`; every one
    /// is in `_headers`), read as [`MetaSource::Key`] reads the key. No
    /// such header, or a null value, is absent.
    Header(String),
}

/// What [`encode_meta`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaPut {
    /// Appended the value.
    Written,
    /// The message has no value for the source (null key, no such header
    /// or a null one, no timestamp); nothing was appended and the caller
    /// applies the column's missing-value rule.
    Absent,
}

impl MetaSource {
    /// Reads a source name: `_topic`, `_partition`, `_offset`,
    /// `_timestamp`, `_timestamp_ms`, `_timestamp_s`, `_timestamp_type`,
    /// `_key`, `_headers`, `_headers.name`, `_headers.value` or
    /// `_header.NAME` (NAME non-empty, taken as written); `None` for
    /// anything else.
    pub fn parse(name: &str) -> Option<MetaSource> {
        Some(match name {
            "_topic" => MetaSource::Topic,
            "_partition" => MetaSource::Partition,
            "_offset" => MetaSource::Offset,
            "_timestamp" | "_timestamp_ms" => MetaSource::Timestamp,
            "_timestamp_s" => MetaSource::TimestampSeconds,
            "_timestamp_type" => MetaSource::TimestampType,
            "_key" => MetaSource::Key,
            "_headers" => MetaSource::Headers,
            "_headers.name" => MetaSource::HeaderNames,
            "_headers.value" => MetaSource::HeaderValues,
            other => match other.strip_prefix("_header.") {
                Some(header) if !header.is_empty() => MetaSource::Header(header.to_owned()),
                _ => return None,
            },
        })
    }

    /// Whether `ty` can hold this source's values; `Err` says which types
    /// can. Checked when a mapping is planned, so [`encode_meta`] meets
    /// only types it accepts.
    ///
    /// # Errors
    /// The accepted types, in words, when `ty` is not one of them.
    pub fn check_type(&self, ty: &ChType) -> Result<(), String> {
        let (inner, _) = scalar(ty);
        let text_like = matches!(
            inner,
            ChType::String | ChType::FixedString(_) | ChType::Enum8(_) | ChType::Enum16(_)
        );
        let int = int_shape(inner).is_some();
        let ok = match self {
            MetaSource::Topic => text_like,
            MetaSource::Partition | MetaSource::Offset => int,
            MetaSource::Timestamp | MetaSource::TimestampSeconds => {
                int || matches!(inner, ChType::DateTime(_) | ChType::DateTime64 { .. })
            }
            MetaSource::TimestampType => text_like || int,
            MetaSource::Key | MetaSource::Header(_) => !matches!(
                inner,
                ChType::Array(_) | ChType::Map(..) | ChType::Tuple(_) | ChType::Json(_)
            ),
            MetaSource::Headers => pair_types(ty).is_some(),
            MetaSource::HeaderNames => {
                matches!(ty, ChType::Array(e) if is_string(e))
            }
            MetaSource::HeaderValues => {
                matches!(ty, ChType::Array(e) if value_type(e).is_some())
            }
        };
        if ok {
            return Ok(());
        }
        Err(format!(
            "{self} cannot go into {ty}: it takes {}",
            match self {
                MetaSource::Topic => "String, FixedString or Enum",
                MetaSource::Partition | MetaSource::Offset => "an integer type",
                MetaSource::Timestamp => {
                    "DateTime64 (exact at precision 3 or more), DateTime (whole seconds only) \
                     or an integer type (milliseconds)"
                }
                MetaSource::TimestampSeconds => {
                    "DateTime, DateTime64 or an integer type (seconds)"
                }
                MetaSource::TimestampType => "String, FixedString, Enum or an integer type",
                MetaSource::Key | MetaSource::Header(_) => {
                    "a scalar type (String keeps the bytes; others parse them)"
                }
                MetaSource::Headers => {
                    "Map(String, String) or Array(Tuple(String, String)) (the value may be \
                     Nullable(String))"
                }
                MetaSource::HeaderNames => "Array(String)",
                MetaSource::HeaderValues => "Array(String) or Array(Nullable(String))",
            }
        ))
    }
}

impl fmt::Display for MetaSource {
    /// The source's name as written in a mapping (`_offset`,
    /// `_header.trace-id`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            MetaSource::Topic => "_topic",
            MetaSource::Partition => "_partition",
            MetaSource::Offset => "_offset",
            MetaSource::Timestamp => "_timestamp",
            MetaSource::TimestampSeconds => "_timestamp_s",
            MetaSource::TimestampType => "_timestamp_type",
            MetaSource::Key => "_key",
            MetaSource::Headers => "_headers",
            MetaSource::HeaderNames => "_headers.name",
            MetaSource::HeaderValues => "_headers.value",
            MetaSource::Header(name) => return write!(f, "_header.{name}"),
        };
        f.write_str(name)
    }
}

/// Appends `source`'s value for `payload` to `buf` as RowBinary of `ty`
/// (the column `column`'s type; the value goes where the column's cell
/// goes, `ty` including any Nullable marker).
///
/// `ty` must have passed [`MetaSource::check_type`] (a mapping planned by
/// [`crate::schema::plan_insert`] or built by
/// a format's encoder has); another type is a record error.
///
/// Returns [`MetaPut::Absent`], having written nothing, when the message
/// has no value for the source: the caller applies the column's
/// missing-value rule ([`crate::spec::MissingValue`]).
///
/// # Errors
/// A [`RecordError`] (kind Encode) naming `column` when the value does not
/// fit `ty`: an integer out of the column's range, a timestamp with
/// milliseconds into DateTime or DateTime64 of precision below 3 (or out
/// of the type's range), a key or header value that does not parse as
/// `ty`, a null header value into a non-Nullable header value type.
/// `buf` may then hold part of the cell; the caller truncates the row.
pub fn encode_meta(
    source: &MetaSource,
    column: &str,
    ty: &ChType,
    payload: &Payload<'_>,
    buf: &mut Vec<u8>,
) -> Result<MetaPut, RecordError> {
    put_meta(source, ty, payload, buf).map_err(|reason| RecordError::encode(column, reason))
}

fn put_meta(
    source: &MetaSource,
    ty: &ChType,
    payload: &Payload<'_>,
    buf: &mut Vec<u8>,
) -> Result<MetaPut, String> {
    let (inner, nullable) = scalar(ty);
    match source {
        MetaSource::Topic => text(ty, payload.partition.topic().as_bytes(), buf),
        MetaSource::Partition => {
            marker(nullable, buf);
            put_int(inner, i64::from(payload.partition.partition()), buf)
        }
        MetaSource::Offset => {
            marker(nullable, buf);
            put_int(inner, payload.offset, buf)
        }
        MetaSource::Timestamp | MetaSource::TimestampSeconds => {
            let Some(ms) = payload.timestamp_ms else {
                return Ok(MetaPut::Absent);
            };
            marker(nullable, buf);
            let floor = matches!(source, MetaSource::TimestampSeconds);
            put_time(inner, ms, floor, buf)
        }
        MetaSource::TimestampType => {
            let kind = payload.timestamp_kind;
            if int_shape(inner).is_some() {
                marker(nullable, buf);
                put_int(inner, i64::from(kind.id()), buf)
            } else {
                text(ty, kind.name().as_bytes(), buf)
            }
        }
        MetaSource::Key => match payload.key {
            Some(key) => text(ty, key, buf),
            None => Ok(MetaPut::Absent),
        },
        MetaSource::Header(name) => match payload.headers.last(name.as_bytes()) {
            Some(h) => match h.value {
                Some(v) => text(ty, v, buf),
                None => Ok(MetaPut::Absent),
            },
            None => Ok(MetaPut::Absent),
        },
        MetaSource::Headers => {
            let value_ty = pair_types(ty).ok_or_else(|| wrong_type(source, ty))?;
            put_leb128(buf, payload.headers.len() as u64);
            for h in payload.headers.iter() {
                put_string(buf, h.name);
                put_header_value(value_ty, h.name, h.value, buf)?;
            }
            Ok(MetaPut::Written)
        }
        MetaSource::HeaderNames => {
            put_leb128(buf, payload.headers.len() as u64);
            for h in payload.headers.iter() {
                put_string(buf, h.name);
            }
            Ok(MetaPut::Written)
        }
        MetaSource::HeaderValues => {
            let value_ty = match ty {
                ChType::Array(e) => value_type(e),
                _ => None,
            }
            .ok_or_else(|| wrong_type(source, ty))?;
            put_leb128(buf, payload.headers.len() as u64);
            for h in payload.headers.iter() {
                put_header_value(value_ty, h.name, h.value, buf)?;
            }
            Ok(MetaPut::Written)
        }
    }
}

/// A type [`MetaSource::check_type`] would have refused.
#[cold]
fn wrong_type(source: &MetaSource, ty: &ChType) -> String {
    source
        .check_type(ty)
        .err()
        .unwrap_or_else(|| format!("{source} cannot go into {ty}"))
}

/// The type without LowCardinality and Nullable wrappers, and whether it
/// was Nullable.
fn scalar(ty: &ChType) -> (&ChType, bool) {
    match ty.without_low_cardinality() {
        ChType::Nullable(inner) => (inner.without_low_cardinality(), true),
        other => (other, false),
    }
}

/// A Nullable column's "not null" marker.
#[inline]
fn marker(nullable: bool, buf: &mut Vec<u8>) {
    if nullable {
        buf.push(0);
    }
}

/// Bytes as a JSON string holding them would map into `ty` (String keeps
/// them as they are), with the default time rules.
fn text(ty: &ChType, bytes: &[u8], buf: &mut Vec<u8>) -> Result<MetaPut, String> {
    // The usual column first: a (Nullable, LowCardinality) String, written
    // as put_scalar would write it.
    if let (ChType::String, nullable) = scalar(ty) {
        marker(nullable, buf);
        put_string(buf, bytes);
        return Ok(MetaPut::Written);
    }
    match put_scalar(ty, Tok::Str(bytes), &TimeRules::default(), buf)? {
        Put::Written => Ok(MetaPut::Written),
        // A string token is never null.
        Put::NullForNonNullable => Ok(MetaPut::Absent),
    }
}

fn is_string(ty: &ChType) -> bool {
    matches!(ty.without_low_cardinality(), ChType::String)
}

/// A header value type: String, or Nullable(String) (`Some(true)`).
fn value_type(ty: &ChType) -> Option<bool> {
    match ty.without_low_cardinality() {
        ChType::String => Some(false),
        ChType::Nullable(inner) if is_string(inner) => Some(true),
        _ => None,
    }
}

/// For a `Map(String, V)` or `Array(Tuple(String, V))` with `V` a
/// [`value_type`]: whether `V` is Nullable.
fn pair_types(ty: &ChType) -> Option<bool> {
    let (k, v) = match ty {
        ChType::Map(k, v) => (&**k, &**v),
        ChType::Array(e) => match &**e {
            ChType::Tuple(elems) if elems.len() == 2 => (&elems[0].ty, &elems[1].ty),
            _ => return None,
        },
        _ => return None,
    };
    if !is_string(k) {
        return None;
    }
    value_type(v)
}

/// One header value into a String (`nullable` false) or Nullable(String).
fn put_header_value(
    nullable: bool,
    name: &[u8],
    value: Option<&[u8]>,
    buf: &mut Vec<u8>,
) -> Result<(), String> {
    match (value, nullable) {
        (Some(v), false) => put_string(buf, v),
        (Some(v), true) => {
            buf.push(0);
            put_string(buf, v);
        }
        (None, true) => buf.push(1),
        (None, false) => {
            return Err(format!(
                "header `{}` has a null value and the column's value type is not Nullable \
                 (use Nullable(String) to keep it as NULL)",
                String::from_utf8_lossy(name)
            ));
        }
    }
    Ok(())
}

/// `v` into the integer type `ty`, range-checked.
fn put_int(ty: &ChType, v: i64, buf: &mut Vec<u8>) -> Result<MetaPut, String> {
    let Some((bits, signed)) = int_shape(ty) else {
        return Err(format!("{v} cannot go into {ty} (not an integer type)"));
    };
    let fits = match (signed, bits) {
        (true, 64..) => true,
        (true, b) => (-(1i64 << (b - 1))..(1i64 << (b - 1))).contains(&v),
        (false, 64..) => v >= 0,
        (false, b) => (0..(1i64 << b)).contains(&v),
    };
    if !fits {
        return Err(format!("{v} is out of {ty}'s range"));
    }
    let bytes = (bits / 8) as usize;
    if bytes <= 8 {
        buf.extend_from_slice(&v.to_le_bytes()[..bytes]);
    } else {
        // Int128/Int256 and their unsigned kin: sign-extended little endian
        // (v is non-negative for the unsigned ones).
        buf.extend_from_slice(&v.to_le_bytes());
        let fill = if v < 0 { 0xff } else { 0 };
        buf.resize(buf.len() + bytes - 8, fill);
    }
    Ok(MetaPut::Written)
}

/// Milliseconds `ms` into a DateTime, DateTime64 or integer type; `floor`
/// takes the whole seconds (`_timestamp_s`), else every digit must be kept.
fn put_time(ty: &ChType, ms: i64, floor: bool, buf: &mut Vec<u8>) -> Result<MetaPut, String> {
    let secs = ms.div_euclid(1000);
    let sub_ms = ms.rem_euclid(1000);
    match ty {
        ChType::DateTime(_) => {
            if sub_ms != 0 && !floor {
                return Err(format!(
                    "timestamp {ms} ms has milliseconds, which {ty} would drop; use \
                     DateTime64(3) or an Int64 column (milliseconds) to keep them, or \
                     `_timestamp_s` to drop them on purpose"
                ));
            }
            let s = u32::try_from(secs)
                .map_err(|_| format!("timestamp {ms} ms is outside {ty}'s range"))?;
            buf.extend_from_slice(&s.to_le_bytes());
        }
        ChType::DateTime64 { precision, .. } => {
            let p = u32::from(*precision);
            if !(DATETIME64_MIN_SECS..=DATETIME64_MAX_SECS).contains(&secs) {
                return Err(format!("timestamp {ms} ms is outside {ty}'s range"));
            }
            let ticks = if floor {
                secs.checked_mul(10i64.pow(p))
            } else if p >= 3 {
                ms.checked_mul(10i64.pow(p - 3))
            } else {
                let div = 10i64.pow(3 - p);
                if ms.rem_euclid(div) != 0 {
                    return Err(format!(
                        "timestamp {ms} ms has digits {ty} would drop; use DateTime64(3) to \
                         keep them, or `_timestamp_s` to drop the milliseconds on purpose"
                    ));
                }
                Some(ms.div_euclid(div))
            }
            .ok_or_else(|| format!("timestamp {ms} ms is outside {ty}'s range"))?;
            buf.extend_from_slice(&ticks.to_le_bytes());
        }
        _ => return put_int(ty, if floor { secs } else { ms }, buf),
    }
    Ok(MetaPut::Written)
}

#[cfg(test)]
mod tests;
