//! Writing one converted value into the row: the plain copies inline
//! ([`put_cell`]), the general conversions, and Timestamps exactly (never
//! truncated: a finer value is an error).

use super::plan::{Conv, Dst, Fast, Src, TimeDst};
use spate_row::rowbinary::{put_input_string, put_string};

/// The integer a raw wire value stands for.
#[inline]
pub(super) fn int_value(src: Src, raw: u64) -> i128 {
    match src {
        Src::Int32 | Src::Enum => i128::from(raw as i32),
        Src::Int64 | Src::Sfixed64 => i128::from(raw as i64),
        Src::Uint32 | Src::Fixed32 => i128::from(raw as u32),
        Src::Uint64 | Src::Fixed64 => i128::from(raw),
        Src::Sint32 => {
            let u = raw as u32;
            i128::from(((u >> 1) as i32) ^ -((u & 1) as i32))
        }
        Src::Sint64 => i128::from(((raw >> 1) as i64) ^ -((raw & 1) as i64)),
        Src::Sfixed32 => i128::from(raw as u32 as i32),
        Src::Bool => i128::from(raw != 0),
        Src::Float | Src::Double | Src::String | Src::Bytes => 0,
    }
}

#[inline]
fn put_int(out: &mut Vec<u8>, v: i128, bytes: u8) {
    match bytes {
        1 => out.push(v as u8),
        2 => out.extend_from_slice(&(v as i16).to_le_bytes()),
        4 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        8 => out.extend_from_slice(&(v as i64).to_le_bytes()),
        16 => out.extend_from_slice(&v.to_le_bytes()),
        _ => {
            out.extend_from_slice(&v.to_le_bytes());
            let fill = if v < 0 { 0xff } else { 0 };
            out.extend_from_slice(&[fill; 16]);
        }
    }
}

/// Writes one scalar: `(a, e)` as [`Slot`] holds it; the plain copies
/// inline, the rest through [`put_scalar`].
#[inline(always)]
pub(super) fn put_cell(
    conv: &Conv,
    a: u64,
    e: u64,
    b: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    match conv.fast {
        Fast::Le4 => {
            if conv.nullable {
                out.push(0);
            }
            out.extend_from_slice(&(a as u32).to_le_bytes());
        }
        Fast::Le8 => {
            if conv.nullable {
                out.push(0);
            }
            out.extend_from_slice(&a.to_le_bytes());
        }
        Fast::Str => {
            if conv.nullable {
                out.push(0);
            }
            put_input_string(out, b, a as usize, e as usize);
        }
        Fast::No => put_scalar(conv, a, e, b, out)?,
    }
    Ok(())
}

/// The general conversion of one scalar.
#[inline(never)]
fn put_scalar(conv: &Conv, a: u64, e: u64, b: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    if conv.nullable {
        out.push(0);
    }
    match &conv.dst {
        Dst::Int { bytes } => put_int(out, int_value(conv.src, a), *bytes),
        Dst::Bool => out.push(u8::from(a != 0)),
        Dst::Float32 => out.extend_from_slice(&(a as u32).to_le_bytes()),
        Dst::Float64 => {
            let f = if conv.src == Src::Float {
                f64::from(f32::from_bits(a as u32))
            } else {
                f64::from_bits(a)
            };
            out.extend_from_slice(&f.to_le_bytes());
        }
        Dst::Str => put_string(out, &b[a as usize..e as usize]),
        Dst::EnumName(names) => {
            let n = a as i32;
            match names.binary_search_by_key(&n, |p| p.0) {
                Ok(i) => put_string(out, names[i].1.as_bytes()),
                Err(_) => return Err(format!("enum number {n} has no name in the schema")),
            }
        }
        Dst::EnumMap { map, wide } => {
            let n = a as i32;
            match map.binary_search_by_key(&n, |p| p.0) {
                Ok(i) if *wide => out.extend_from_slice(&map[i].1.to_le_bytes()),
                Ok(i) => out.push(map[i].1 as i8 as u8),
                Err(_) => return Err(format!("enum number {n} has no value in the column's Enum")),
            }
        }
    }
    Ok(())
}

const POW10: [i64; 10] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
];

/// Writes a Timestamp (`seconds`, `nanos` raw) as `dst`.
pub(super) fn put_time(
    dst: TimeDst,
    nullable: bool,
    seconds: u64,
    nanos: u64,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let (s, ns) = (seconds as i64, nanos as i32);
    if !(0..=999_999_999).contains(&ns) {
        return Err(format!("Timestamp nanos {ns} outside 0..=999999999"));
    }
    if nullable {
        out.push(0);
    }
    match dst {
        TimeDst::Ticks { precision } => {
            let div = POW10[9 - usize::from(precision)];
            if i64::from(ns) % div != 0 {
                return Err(format!(
                    "Timestamp {s}s + {ns}ns has digits below DateTime64({precision})'s resolution (it would be truncated)"
                ));
            }
            let ticks = s
                .checked_mul(POW10[usize::from(precision)])
                .and_then(|t| t.checked_add(i64::from(ns) / div))
                .ok_or_else(|| {
                    format!("Timestamp {s}s is out of DateTime64({precision})'s range")
                })?;
            out.extend_from_slice(&ticks.to_le_bytes());
        }
        TimeDst::Seconds => {
            if ns != 0 {
                return Err(format!(
                    "Timestamp {s}s + {ns}ns has a fraction of a second; DateTime holds whole seconds"
                ));
            }
            let s = u32::try_from(s)
                .map_err(|_| format!("Timestamp {s}s is out of DateTime's range"))?;
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
    Ok(())
}
