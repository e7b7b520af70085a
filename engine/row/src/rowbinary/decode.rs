//! The inverse of [`super::encode`]: reads one RowBinary value of a given
//! type back into a [`Value`]. Used by tests (byte-exact checks, the proptest
//! round trip) and by simulators that keep rows as ClickHouse would.
//!
//! Same layout source as the encoder: ClickHouse's RowBinary format
//! documentation, <https://clickhouse.com/docs/interfaces/formats/RowBinary>.
//! Not on any hot path; it allocates freely.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{Value, decimal_width, int_shape};
use crate::num::Wide;
use crate::types::ChType;

/// Why bytes did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a value.
    #[error("input ends inside a {0} value")]
    Truncated(String),
    /// A byte that the layout does not allow (a null flag of 2, a bool of 7).
    #[error("invalid {ty} value: {reason}")]
    Invalid {
        /// The type, rendered.
        ty: String,
        /// What was wrong.
        reason: String,
    },
}

fn take<'a>(input: &mut &'a [u8], n: usize, ty: &ChType) -> Result<&'a [u8], DecodeError> {
    if input.len() < n {
        return Err(DecodeError::Truncated(ty.to_string()));
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

fn array<const N: usize>(input: &mut &[u8], ty: &ChType) -> Result<[u8; N], DecodeError> {
    let mut a = [0u8; N];
    a.copy_from_slice(take(input, N, ty)?);
    Ok(a)
}

/// Reads an unsigned LEB128 length.
///
/// # Errors
/// [`DecodeError`] when the input ends or the number exceeds 64 bits.
pub fn read_leb128(input: &mut &[u8], ty: &ChType) -> Result<u64, DecodeError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = take(input, 1, ty)?[0];
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(DecodeError::Invalid {
        ty: ty.to_string(),
        reason: "LEB128 length longer than 64 bits".into(),
    })
}

fn length(input: &mut &[u8], ty: &ChType) -> Result<usize, DecodeError> {
    let n = read_leb128(input, ty)?;
    // Every element takes at least one byte... except zero-width ones, which
    // RowBinary has none of; bounding by the input length stops a hostile
    // length from allocating gigabytes.
    usize::try_from(n)
        .ok()
        .filter(|&n| n <= input.len())
        .ok_or_else(|| DecodeError::Truncated(ty.to_string()))
}

/// Reads one value of type `ty` from the front of `input`, advancing it.
///
/// # Errors
/// [`DecodeError`] for truncated input or bytes the layout does not allow.
pub fn decode(ty: &ChType, input: &mut &[u8]) -> Result<Value, DecodeError> {
    let invalid = |reason: String| DecodeError::Invalid {
        ty: ty.to_string(),
        reason,
    };
    Ok(match ty {
        ChType::Nullable(inner) => match take(input, 1, ty)?[0] {
            0 => decode(inner, input)?,
            1 => Value::Null,
            b => return Err(invalid(format!("null flag {b}"))),
        },
        ChType::LowCardinality(inner) => decode(inner, input)?,
        t if int_shape(t).is_some() => {
            let (bits, signed) = int_shape(t).unwrap_or((64, true));
            Value::Int(Wide::from_le(take(input, bits as usize / 8, ty)?, signed))
        }
        ChType::Float32 => Value::Float32(f32::from_le_bytes(array(input, ty)?)),
        ChType::Float64 => Value::Float64(f64::from_le_bytes(array(input, ty)?)),
        ChType::Bool => match take(input, 1, ty)?[0] {
            b @ (0 | 1) => Value::Bool(b == 1),
            b => return Err(invalid(format!("bool byte {b}"))),
        },
        ChType::String | ChType::Json(_) => {
            let n = length(input, ty)?;
            Value::String(take(input, n, ty)?.to_vec())
        }
        ChType::FixedString(n) => Value::String(take(input, *n, ty)?.to_vec()),
        ChType::Date => Value::Date(i64::from(u16::from_le_bytes(array(input, ty)?))),
        ChType::Date32 => Value::Date(i64::from(i32::from_le_bytes(array(input, ty)?))),
        ChType::DateTime(_) => Value::DateTime(i64::from(u32::from_le_bytes(array(input, ty)?))),
        ChType::DateTime64 { .. } => Value::DateTime64(i64::from_le_bytes(array(input, ty)?)),
        ChType::Uuid => {
            let high = u64::from_le_bytes(array(input, ty)?);
            let low = u64::from_le_bytes(array(input, ty)?);
            Value::Uuid((u128::from(high) << 64) | u128::from(low))
        }
        ChType::Ipv4 => Value::Ipv4(Ipv4Addr::from(u32::from_le_bytes(array(input, ty)?))),
        ChType::Ipv6 => Value::Ipv6(Ipv6Addr::from(array::<16>(input, ty)?)),
        ChType::Decimal { precision, .. } => Value::Decimal(Wide::from_le(
            take(input, decimal_width(*precision), ty)?,
            true,
        )),
        ChType::Enum8(_) => Value::Enum(i16::from(take(input, 1, ty)?[0] as i8)),
        ChType::Enum16(_) => Value::Enum(i16::from_le_bytes(array(input, ty)?)),
        ChType::Array(inner) => {
            let n = length(input, ty)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(decode(inner, input)?);
            }
            Value::Array(items)
        }
        ChType::Map(k, v) => {
            let n = length(input, ty)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let key = decode(k, input)?;
                entries.push((key, decode(v, input)?));
            }
            Value::Map(entries)
        }
        ChType::Tuple(elements) => Value::Tuple(
            elements
                .iter()
                .map(|e| decode(&e.ty, input))
                .collect::<Result<_, _>>()?,
        ),
        _ => return Err(invalid("no decoder for this type".into())),
    })
}
