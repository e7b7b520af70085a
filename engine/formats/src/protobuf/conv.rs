//! Scalar conversions: which proto scalar goes into which ClickHouse type
//! exactly (the table in [`super::plan`]), and how the decoder writes it.

use prost_reflect::{EnumDescriptor, Kind};

use spate_row::rowbinary::int_shape;
use spate_row::types::ChType;

/// A wire type (<https://protobuf.dev/programming-guides/encoding/#structure>).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Wire {
    Varint = 0,
    I64 = 1,
    Len = 2,
    I32 = 5,
}

/// How a scalar's wire value is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Src {
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Bool,
    Float,
    Double,
    String,
    Bytes,
    Enum,
}

impl Src {
    pub(crate) fn of(kind: &Kind) -> Option<Src> {
        Some(match kind {
            Kind::Int32 => Src::Int32,
            Kind::Int64 => Src::Int64,
            Kind::Uint32 => Src::Uint32,
            Kind::Uint64 => Src::Uint64,
            Kind::Sint32 => Src::Sint32,
            Kind::Sint64 => Src::Sint64,
            Kind::Fixed32 => Src::Fixed32,
            Kind::Fixed64 => Src::Fixed64,
            Kind::Sfixed32 => Src::Sfixed32,
            Kind::Sfixed64 => Src::Sfixed64,
            Kind::Bool => Src::Bool,
            Kind::Float => Src::Float,
            Kind::Double => Src::Double,
            Kind::String => Src::String,
            Kind::Bytes => Src::Bytes,
            Kind::Enum(_) => Src::Enum,
            Kind::Message(_) => return None,
        })
    }

    pub(crate) fn wire(self) -> Wire {
        match self {
            Src::Int32
            | Src::Int64
            | Src::Uint32
            | Src::Uint64
            | Src::Sint32
            | Src::Sint64
            | Src::Bool
            | Src::Enum => Wire::Varint,
            Src::Fixed64 | Src::Sfixed64 | Src::Double => Wire::I64,
            Src::Fixed32 | Src::Sfixed32 | Src::Float => Wire::I32,
            Src::String | Src::Bytes => Wire::Len,
        }
    }

    /// The value range of an integer-like source.
    fn range(self) -> Option<(i128, i128)> {
        Some(match self {
            Src::Int32 | Src::Sint32 | Src::Sfixed32 | Src::Enum => {
                (i128::from(i32::MIN), i128::from(i32::MAX))
            }
            Src::Int64 | Src::Sint64 | Src::Sfixed64 => {
                (i128::from(i64::MIN), i128::from(i64::MAX))
            }
            Src::Uint32 | Src::Fixed32 => (0, i128::from(u32::MAX)),
            Src::Uint64 | Src::Fixed64 => (0, i128::from(u64::MAX)),
            Src::Bool => (0, 1),
            _ => return None,
        })
    }
}

/// What a scalar becomes in the row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Dst {
    /// An integer of `bytes` bytes (4, 8, 16, 32; 1 and 2 for bool).
    Int {
        bytes: u8,
    },
    /// Bool: one byte 0 or 1.
    Bool,
    Float32,
    /// Float64 (from a float: widened; from a double: as is).
    Float64,
    /// String bytes (UTF-8 checked for proto `string`).
    Str,
    /// The enum value's name: `(number, name)` sorted by number.
    EnumName(Vec<(i32, Box<str>)>),
    /// The ClickHouse enum's value: `(proto number, ch value)` sorted by
    /// number; `wide` for Enum16.
    EnumMap {
        map: Vec<(i32, i16)>,
        wide: bool,
    },
}

/// A scalar conversion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conv {
    pub src: Src,
    pub dst: Dst,
    /// The value is written with a Nullable prefix byte `0`.
    pub nullable: bool,
    /// The decoder's shortcut for the common cases.
    pub fast: Fast,
}

/// A conversion that is a plain copy of the raw wire value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fast {
    /// The raw value's low 4 bytes, little-endian (uint32, fixed32 into
    /// UInt32; int32, sfixed32, enum into Int32; float into Float32).
    Le4,
    /// The raw value's 8 bytes (uint64, fixed64 into UInt64; int64,
    /// sfixed64 into Int64; double into Float64).
    Le8,
    /// The byte range as a String.
    Str,
    /// Anything else: the general conversion.
    No,
}

/// What a Timestamp becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeDst {
    /// DateTime64(p): ticks of 10^-p s.
    Ticks { precision: u8 },
    /// DateTime: UInt32 seconds.
    Seconds,
}

/// The value range of a ClickHouse integer type (128 and 256 bits are cut
/// to i128, which holds every proto integer).
fn int_range(bits: u32, signed: bool) -> (i128, i128) {
    match (bits >= 128, signed) {
        (true, true) => (i128::MIN, i128::MAX),
        (true, false) => (0, i128::MAX),
        (false, true) => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
        (false, false) => (0, (1i128 << bits) - 1),
    }
}

/// The conversion of `src` into column type `ty`, or why it does not carry.
pub(crate) fn conv_for(
    src: Src,
    enum_desc: Option<&EnumDescriptor>,
    ty: &ChType,
) -> Result<Conv, String> {
    let ty = ty.without_low_cardinality();
    let (nullable, ty) = match ty {
        ChType::Nullable(inner) => (true, inner.without_low_cardinality()),
        t => (false, t),
    };
    let no = || {
        Err(format!(
            "a proto {src:?} does not carry exactly into {ty} (see the table in crate::protobuf::plan)"
        ))
    };
    let dst = match (src, ty) {
        (Src::Bool, ChType::Bool) => Dst::Bool,
        (Src::Float, ChType::Float32) => Dst::Float32,
        (Src::Float | Src::Double, ChType::Float64) => Dst::Float64,
        (Src::String | Src::Bytes, ChType::String) => Dst::Str,
        (Src::Enum, ChType::String) => {
            let e = enum_desc.ok_or("enum without descriptor")?;
            let mut names: Vec<(i32, Box<str>)> =
                e.values().map(|v| (v.number(), v.name().into())).collect();
            names.sort_by_key(|p| p.0);
            names.dedup_by_key(|p| p.0);
            Dst::EnumName(names)
        }
        (Src::Enum, ChType::Enum8(_) | ChType::Enum16(_)) => {
            let e = enum_desc.ok_or("enum without descriptor")?;
            let ch: Vec<(String, i16)> = match ty {
                ChType::Enum8(p) => p.iter().map(|(n, v)| (n.clone(), i16::from(*v))).collect(),
                ChType::Enum16(p) => p.clone(),
                _ => unreachable!("matched Enum8/16"),
            };
            let mut map = Vec::new();
            for v in e.values() {
                let Some((_, chv)) = ch.iter().find(|(n, _)| n == v.name()) else {
                    return Err(format!(
                        "the proto enum value `{}` has no value of that name in {ty}",
                        v.name()
                    ));
                };
                map.push((v.number(), *chv));
            }
            map.sort_by_key(|p| p.0);
            map.dedup_by_key(|p| p.0);
            Dst::EnumMap {
                map,
                wide: matches!(ty, ChType::Enum16(_)),
            }
        }
        (s, t) => {
            let (Some((lo, hi)), Some((bits, signed))) = (s.range(), int_shape(t)) else {
                return no();
            };
            let (tlo, thi) = int_range(bits, signed);
            if lo < tlo || hi > thi {
                return no();
            }
            Dst::Int {
                bytes: (bits / 8) as u8,
            }
        }
    };
    let fast = match (src, &dst) {
        (
            Src::Uint32 | Src::Fixed32 | Src::Int32 | Src::Sfixed32 | Src::Enum,
            Dst::Int { bytes: 4 },
        )
        | (Src::Float, Dst::Float32) => Fast::Le4,
        (Src::Uint64 | Src::Fixed64 | Src::Int64 | Src::Sfixed64, Dst::Int { bytes: 8 })
        | (Src::Double, Dst::Float64) => Fast::Le8,
        (Src::String | Src::Bytes, Dst::Str) => Fast::Str,
        _ => Fast::No,
    };
    Ok(Conv {
        src,
        dst,
        nullable,
        fast,
    })
}
