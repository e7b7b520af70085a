//! The simulated table's value columns, the values a record holds, and the
//! row layout spate's stand-in mapping writes (issue 16's value oracle).
//!
//! A record holds [`FIELDS`] small unsigned values (its payload: the record
//! id, then one `u16` LE per field). The table has the three identity
//! columns (partition, offset, record id: `u32` LE each) and zero or more
//! value columns, each naming one field and a [`ColType`]. A row is the
//! identity, then (when the table has value columns) the 4-byte
//! fingerprint of the column types the writer declares ([`Schema::fingerprint`],
//! standing in for a Native block's header), then each column's value in
//! the declared order and type. Every field value is below 2^16, so every
//! type holds it exactly: a value read back different from the record's is
//! a wrong layout, never a narrowing.
//!
//! The server refuses a block whose declared fingerprint differs from the
//! table's current one, as ClickHouse's Native format refuses a block whose
//! column types differ from the table's (`Code: 368 ... Bad cast`, measured
//! on 18.16; docs: <https://clickhouse.com/docs/en/interfaces/formats#native>).
//! The insert also names its columns (`INSERT INTO t (cols)`: the plan's),
//! and the server refuses one whose value columns are not the table's, so
//! identity-only rows (which carry no fingerprint) are never re-sliced under
//! a layout that gained a column (`clickhouse::admit`).

use std::sync::Arc;

/// Fields a record holds.
pub const FIELDS: usize = 4;
/// Bytes of a row's identity (partition, offset, record id).
pub const IDENTITY_BYTES: usize = 12;

/// A value column's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColType {
    /// `UInt16`.
    UInt16,
    /// `UInt32`.
    UInt32,
    /// `Int32`.
    Int32,
    /// `Float32`.
    Float32,
    /// `UInt64`.
    UInt64,
    /// `Float64`.
    Float64,
}

impl ColType {
    /// Every type, in a fixed order.
    pub const ALL: [ColType; 6] = [
        ColType::UInt16,
        ColType::UInt32,
        ColType::Int32,
        ColType::Float32,
        ColType::UInt64,
        ColType::Float64,
    ];

    /// Bytes of one value.
    pub fn width(self) -> usize {
        match self {
            ColType::UInt16 => 2,
            ColType::UInt32 | ColType::Int32 | ColType::Float32 => 4,
            ColType::UInt64 | ColType::Float64 => 8,
        }
    }

    /// Appends `v` in this type (little endian, as RowBinary and Native).
    pub fn encode(self, v: u16, buf: &mut Vec<u8>) {
        match self {
            ColType::UInt16 => buf.extend_from_slice(&v.to_le_bytes()),
            ColType::UInt32 => buf.extend_from_slice(&u32::from(v).to_le_bytes()),
            ColType::Int32 => buf.extend_from_slice(&i32::from(v).to_le_bytes()),
            ColType::Float32 => buf.extend_from_slice(&f32::from(v).to_le_bytes()),
            ColType::UInt64 => buf.extend_from_slice(&u64::from(v).to_le_bytes()),
            ColType::Float64 => buf.extend_from_slice(&f64::from(v).to_le_bytes()),
        }
    }

    /// Reads one value of this type from the front of `b` (at least
    /// [`ColType::width`] bytes), as a number.
    pub fn decode(self, b: &[u8]) -> f64 {
        let a = |n: usize| -> [u8; 8] {
            let mut x = [0; 8];
            x[..n].copy_from_slice(&b[..n]);
            x
        };
        match self {
            ColType::UInt16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            ColType::UInt32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ColType::Int32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ColType::Float32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ColType::UInt64 => u64::from_le_bytes(a(8)) as f64,
            ColType::Float64 => f64::from_le_bytes(a(8)),
        }
    }
}

/// A value column: which record field it holds, in which type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Column {
    /// The record field (`0..FIELDS`), i.e. the column's name `f{field}`.
    pub field: usize,
    /// Its type.
    pub ty: ColType,
}

/// The table's value columns, in table order, with a version that counts
/// the ALTERs applied.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Schema {
    /// Value columns in table order.
    pub columns: Vec<Column>,
    /// ALTERs applied so far.
    pub version: u32,
}

impl Schema {
    /// Bytes of one row under this schema.
    pub fn row_bytes(&self) -> usize {
        if self.columns.is_empty() {
            IDENTITY_BYTES
        } else {
            IDENTITY_BYTES + 4 + self.columns.iter().map(|c| c.ty.width()).sum::<usize>()
        }
    }

    /// A stable 32-bit hash of the column names and types, in order.
    pub fn fingerprint(&self) -> u32 {
        let mut h: u32 = 0x811C_9DC5;
        for c in &self.columns {
            for b in [c.field as u8, c.ty as u8] {
                h ^= u32::from(b);
                h = h.wrapping_mul(0x0100_0193);
            }
        }
        h
    }

    /// A one-line description, e.g. `f2 UInt32, f0 Float64`.
    pub fn describe(&self) -> String {
        let cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("f{} {:?}", c.field, c.ty))
            .collect();
        format!("v{} ({})", self.version, cols.join(", "))
    }
}

/// The values record `id` holds (all in `1..=65535`).
pub fn record_values(id: u32) -> [u16; FIELDS] {
    let mut out = [0; FIELDS];
    for (i, v) in out.iter_mut().enumerate() {
        let h = (u64::from(id) << 8 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48;
        *v = (h as u16).max(1);
    }
    out
}

/// The payload of record `id`: the id, then its values (u16 LE each).
pub fn payload(id: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + 2 * FIELDS);
    b.extend_from_slice(&id.to_le_bytes());
    for v in record_values(id) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// What the mapping stand-in writes: the schema it probed (shared by the
/// incarnation's drivers).
pub type Plan = Arc<Schema>;
