//! Request body compression: the sealed batch's RowBinary bytes sent as
//! `Content-Encoding: gzip` or `deflate`.
//!
//! Those two are what every ClickHouse version since at least 18.16 decodes
//! on the HTTP interface (checked against 18.16.1: `gzip` and `deflate`, the
//! zlib-wrapped stream RFC 9110 section 8.4.1.2 names, are accepted; `br`,
//! `zstd`, `lz4` and `xz` are refused there with code 89, "Unknown
//! Content-Encoding of HTTP request"; newer servers accept more). The
//! ClickHouse-native `compress=1` framing (LZ4 blocks with a CityHash128
//! checksum) is not used: it is not an HTTP standard and needs the exact
//! CityHash 1.0.2 variant.
//!
//! Compression is deterministic for the same bytes and level, so a retry
//! sends the same compressed body (D4); the server deduplicates on the
//! decompressed block in any case.

use std::io::Write as _;

use bytes::Bytes;
use flate2::Compression as Level;
use flate2::write::{GzEncoder, ZlibEncoder};

/// How an insert's body is compressed on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Sent as it is (the default: on loopback, gzip level 1 doubled the
    /// insert time of flight rows and cost 0.3 s of client CPU per million
    /// rows; README "Performance").
    #[default]
    None,
    /// `Content-Encoding: gzip` (RFC 1952) at `level` 1 (fastest) to 9.
    Gzip {
        /// zlib compression level, 1..=9.
        level: u32,
    },
    /// `Content-Encoding: deflate`: a zlib stream (RFC 1950) at `level`
    /// 1 to 9.
    Deflate {
        /// zlib compression level, 1..=9.
        level: u32,
    },
}

/// The level used when none is configured: 1, the fastest. On flight rows
/// it sends 54% of the RowBinary bytes for about 15 ns of CPU per input
/// byte; level 6 sends 43% for about 8 times the CPU (README
/// "Performance", `examples/compression.rs`).
pub const DEFAULT_LEVEL: u32 = 1;

impl Compression {
    /// Parses a codec name (`none`, `gzip`, `deflate`) with `level` (1..=9,
    /// [`DEFAULT_LEVEL`] when `None`).
    ///
    /// # Errors
    /// A message naming the allowed values, for an unknown name or a level
    /// outside 1..=9.
    pub fn parse(name: &str, level: Option<u32>) -> Result<Compression, String> {
        let level = level.unwrap_or(DEFAULT_LEVEL);
        if !(1..=9).contains(&level) {
            return Err(format!(
                "level {level}: expected 1 (fastest) to 9 (smallest)"
            ));
        }
        match name {
            "none" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip { level }),
            "deflate" => Ok(Compression::Deflate { level }),
            other => Err(format!(
                "`{other}`: expected none, gzip or deflate (what ClickHouse 18.16 decodes)"
            )),
        }
    }

    /// The `Content-Encoding` header value, `None` for no compression.
    pub fn content_encoding(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Gzip { .. } => Some("gzip"),
            Compression::Deflate { .. } => Some("deflate"),
        }
    }

    /// `segments` compressed into one buffer (`segments` unchanged for
    /// [`Compression::None`]). CPU-bound (about 15 ns per input byte at
    /// level 1), so the writer runs it off the I/O threads.
    pub fn apply(self, segments: Vec<Bytes>) -> Vec<Bytes> {
        let input: usize = segments.iter().map(Bytes::len).sum();
        // Row data compresses well; a quarter of the input is a fair first
        // guess that avoids most regrowth.
        let out = Vec::with_capacity(input / 4 + 64);
        let written = match self {
            Compression::None => return segments,
            Compression::Gzip { level } => {
                let mut e = GzEncoder::new(out, Level::new(level));
                for s in &segments {
                    e.write_all(s).expect("writing into a Vec cannot fail");
                }
                e.finish()
            }
            Compression::Deflate { level } => {
                let mut e = ZlibEncoder::new(out, Level::new(level));
                for s in &segments {
                    e.write_all(s).expect("writing into a Vec cannot fail");
                }
                e.finish()
            }
        };
        vec![Bytes::from(
            written.expect("finishing into a Vec cannot fail"),
        )]
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn segments() -> Vec<Bytes> {
        vec![
            Bytes::from_static(b"hello "),
            Bytes::new(),
            Bytes::from(b"world ".repeat(1000)),
        ]
    }

    fn plain() -> Vec<u8> {
        segments().concat()
    }

    #[test]
    fn gzip_decodes_back_to_the_segments() {
        let out = Compression::Gzip { level: 1 }.apply(segments());
        assert_eq!(out.len(), 1);
        assert!(out[0].len() < plain().len() / 10, "repetitive data shrinks");
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&out[0][..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, plain());
    }

    #[test]
    fn deflate_is_a_zlib_stream() {
        let out = Compression::Deflate { level: 9 }.apply(segments());
        // RFC 1950: CMF 0x78 (deflate, 32 KiB window).
        assert_eq!(out[0][0], 0x78);
        let mut back = Vec::new();
        flate2::read::ZlibDecoder::new(&out[0][..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, plain());
    }

    #[test]
    fn same_input_gives_the_same_bytes() {
        // D4: a retry sends the same body.
        let c = Compression::Gzip { level: 1 };
        assert_eq!(c.apply(segments()), c.apply(segments()));
    }

    #[test]
    fn none_passes_segments_through() {
        assert_eq!(Compression::None.apply(segments()), segments());
        assert_eq!(Compression::None.content_encoding(), None);
    }

    #[test]
    fn parse_names_the_allowed_values() {
        assert_eq!(
            Compression::parse("gzip", None),
            Ok(Compression::Gzip {
                level: DEFAULT_LEVEL
            })
        );
        assert_eq!(
            Compression::parse("deflate", Some(6)),
            Ok(Compression::Deflate { level: 6 })
        );
        assert!(
            Compression::parse("zstd", None)
                .unwrap_err()
                .contains("gzip")
        );
        assert!(
            Compression::parse("gzip", Some(0))
                .unwrap_err()
                .contains("1")
        );
        assert!(Compression::parse("gzip", Some(10)).is_err());
    }
}
