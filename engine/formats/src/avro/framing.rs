//! The Confluent wire format around an Avro datum.
//!
//! Source: Confluent Schema Registry, "Formats, Serializers and
//! Deserializers", section *Wire format*
//! (<https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format>):
//!
//! | bytes | what |
//! |---|---|
//! | 0 | magic byte, always `0` |
//! | 1..=4 | the schema id, a big-endian 32-bit integer, as the registry returned it |
//! | 5.. | the datum, in Avro's binary encoding for that writer schema |
//!
//! A plain datum (no framing, the schema from a file) is the whole payload.

use std::fmt;

/// The magic byte of the Confluent wire format.
pub const MAGIC: u8 = 0;
/// The header length: magic byte and schema id.
pub const HEADER_LEN: usize = 5;

/// A payload that is not a Confluent-framed datum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FramingError {
    /// Fewer than [`HEADER_LEN`] bytes.
    Short(usize),
    /// The first byte is not [`MAGIC`].
    BadMagic(u8),
}

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FramingError::Short(n) => write!(
                f,
                "not a Confluent-framed Avro message: {n} bytes, the header alone \
                 (magic byte 0 and a 4-byte schema id) takes 5"
            ),
            FramingError::BadMagic(b) => write!(
                f,
                "not a Confluent-framed Avro message: magic byte {b:#04x}, expected 0x00"
            ),
        }
    }
}

impl std::error::Error for FramingError {}

/// Splits a Confluent-framed payload into its schema id and datum.
///
/// # Errors
/// [`FramingError`] for a payload shorter than the header or with another
/// magic byte.
#[inline]
pub fn parse(payload: &[u8]) -> Result<(u32, &[u8]), FramingError> {
    let Some((head, datum)) = payload.split_first_chunk::<HEADER_LEN>() else {
        return Err(FramingError::Short(payload.len()));
    };
    if head[0] != MAGIC {
        return Err(FramingError::BadMagic(head[0]));
    }
    let id = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    Ok((id, datum))
}

/// Appends the Confluent header for `schema_id` to `out` (then append the
/// datum): what a producer writes, for tests and the sensor generator.
pub fn put_header(out: &mut Vec<u8>, schema_id: u32) {
    out.push(MAGIC);
    out.extend_from_slice(&schema_id.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_header() {
        let mut m = Vec::new();
        put_header(&mut m, 0x0102_0304);
        m.extend_from_slice(b"xyz");
        assert_eq!(m[..5], [0, 1, 2, 3, 4]);
        assert_eq!(parse(&m), Ok((0x0102_0304, &b"xyz"[..])));
        assert_eq!(parse(&m[..5]), Ok((0x0102_0304, &b""[..])));
        assert_eq!(parse(&m[..4]), Err(FramingError::Short(4)));
        m[0] = 1;
        assert_eq!(parse(&m), Err(FramingError::BadMagic(1)));
        assert!(
            FramingError::BadMagic(1)
                .to_string()
                .contains("magic byte 0x01, expected 0x00")
        );
    }
}
