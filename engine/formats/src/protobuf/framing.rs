//! Confluent framing for Protobuf: what precedes the message bytes in a
//! Kafka value written by a Confluent-compatible Protobuf serializer.
//!
//! Layout (Confluent, "Wire format",
//! <https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format>):
//!
//! | bytes | meaning |
//! |---|---|
//! | 1 | magic byte, always `0` |
//! | 4 | schema id, big-endian u32 |
//! | varint.. | message indexes: a zig-zag varint count `n`, then `n` zig-zag varint indexes; the single byte `0` (count 0) stands for `[0]`, the file's first message |
//! | rest | the Protobuf message |
//!
//! The indexes are a path into the schema's `.proto` file: the first picks a
//! top-level message (declaration order), each next one a message nested in
//! the previous ([`super::source::message_at`]). Varints are Protobuf's base
//! 128 (<https://protobuf.dev/programming-guides/encoding/#varints>); zig-zag
//! maps `0, -1, 1, -2` to `0, 1, 2, 3`
//! (<https://protobuf.dev/programming-guides/encoding/#signed-ints>).
//!
//! Parsing allocates nothing: the indexes go into a caller's reused buffer.

/// Most message indexes a frame may carry (a path deeper than this is not
/// a nesting any schema has; refusing it bounds the work per record).
pub const MAX_MESSAGE_INDEXES: usize = 32;

/// A frame that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// Fewer than the 5 header bytes.
    #[error("Confluent frame too short: {len} bytes, the header needs 5 (magic byte 0, schema id)")]
    TooShort {
        /// The payload's length.
        len: usize,
    },
    /// The first byte is not the magic byte 0.
    #[error("Confluent frame starts with byte {byte:#04x}, not the magic byte 0x00")]
    BadMagic {
        /// The byte found.
        byte: u8,
    },
    /// The message-index array is cut short, negative or too long.
    #[error("schema id {schema_id}: bad message-index array: {reason}")]
    BadIndexes {
        /// The frame's schema id.
        schema_id: u32,
        /// What is wrong.
        reason: &'static str,
    },
}

/// A parsed Confluent Protobuf frame: the schema id and the message bytes;
/// the indexes went into the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The registry's schema id.
    pub schema_id: u32,
    /// The Protobuf message.
    pub message: &'a [u8],
}

/// Reads one zig-zag varint of at most 32 bits (the Confluent indexes are
/// Java ints).
fn zigzag_i32(input: &[u8], pos: &mut usize) -> Option<i32> {
    let mut v: u64 = 0;
    for shift in (0..35).step_by(7) {
        let b = *input.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            let u = u32::try_from(v).ok()?;
            return Some(((u >> 1) as i32) ^ -((u & 1) as i32));
        }
    }
    None
}

/// Parses a Confluent Protobuf frame, putting its message indexes into
/// `indexes` (cleared first; `[0]` for the one-byte shorthand).
///
/// # Errors
/// [`FramingError`] for a payload shorter than 5 bytes, a first byte other
/// than 0, or an index array that is truncated, has a negative count or
/// index, or more than [`MAX_MESSAGE_INDEXES`] entries.
pub fn parse_frame<'a>(
    payload: &'a [u8],
    indexes: &mut Vec<i32>,
) -> Result<Frame<'a>, FramingError> {
    indexes.clear();
    if payload.len() < 5 {
        return Err(FramingError::TooShort { len: payload.len() });
    }
    if payload[0] != 0 {
        return Err(FramingError::BadMagic { byte: payload[0] });
    }
    let schema_id = u32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]);
    let bad = |reason| FramingError::BadIndexes { schema_id, reason };
    let mut pos = 5;
    let count = zigzag_i32(payload, &mut pos).ok_or(bad("the count is truncated or too long"))?;
    if count < 0 {
        return Err(bad("negative count"));
    }
    if count == 0 {
        indexes.push(0);
    } else {
        if count as usize > MAX_MESSAGE_INDEXES {
            return Err(bad("more than 32 indexes"));
        }
        for _ in 0..count {
            let i = zigzag_i32(payload, &mut pos).ok_or(bad("an index is truncated"))?;
            if i < 0 {
                return Err(bad("negative index"));
            }
            indexes.push(i);
        }
    }
    Ok(Frame {
        schema_id,
        message: &payload[pos..],
    })
}

/// Writes a Confluent Protobuf frame header for `schema_id` and `indexes`
/// (`[0]` as the one-byte shorthand), for producers and tests.
pub fn write_header(out: &mut Vec<u8>, schema_id: u32, indexes: &[i32]) {
    out.push(0);
    out.extend_from_slice(&schema_id.to_be_bytes());
    let mut zz = |v: i32| {
        let mut u = ((v << 1) ^ (v >> 31)) as u32;
        loop {
            let b = (u & 0x7f) as u8;
            u >>= 7;
            if u == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    };
    if indexes == [0] {
        zz(0);
        return;
    }
    zz(indexes.len() as i32);
    for &i in indexes {
        zz(i);
    }
}
