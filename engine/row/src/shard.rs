//! Shard keys and the routing hash: what a record's shard is computed from
//! and how (DESIGN "Chain": encode the row into the chunk of the shard the
//! router picks). Each format's router (spate-formats: `json::route`,
//! `avro::route`) finds the key's value in its records; the hash of it, the
//! key types and the shard weights are here, once, so every format routes a
//! value to the same shard.
//!
//! # The hash, and how to reproduce it in SQL
//!
//! ```text
//! shard = XXH64(key_bytes, seed = 0) mod shards
//! ```
//!
//! where `XXH64` is xxHash's 64-bit hash (Yann Collet's XXH64, seed 0, as the
//! result is read as an unsigned 64-bit integer) and `mod` is unsigned. This is
//! exactly ClickHouse's `xxHash64(s)` for one `String` argument (checked
//! against chdb-core 26.9, see the fixed vectors in the tests; 18.16 does not
//! have `xxHash64` yet, so there compare with the ids spate reports), so
//!
//! ```sql
//! SELECT xxHash64(user_id) % 2 AS shard, count() FROM events GROUP BY shard
//! ```
//!
//! shows where spate put each row of a `String` column `user_id`, and a
//! `Distributed` table over the same shards (in the same order, every weight 1)
//! with the sharding key `xxHash64(user_id)` routes rows the same way. For a
//! **numeric** column this default hashes the number's JSON text, so the
//! `Distributed` equivalent is `xxHash64(toString(id))`, not `xxHash64(id)`
//! (which hashes the binary value): use [`KeyHash::Typed`] for the latter.
//!
//! Why XXH64: it is fast (a few GB/s, so negligible per row), specified
//! independently of any implementation (the xxHash spec), stable across
//! versions and platforms, implemented by the maintained `xxhash-rust` crate
//! (pure Rust, no C), and available as a ClickHouse SQL function. ClickHouse's
//! own favourite, `cityHash64`, is CityHash v1.0.2, which later CityHash
//! releases changed; no well-kept pure-Rust crate pins that exact version, and
//! for integer arguments `cityHash64` hashes the binary integer (through
//! `intHash64`), not its text, so it could not match a JSON field anyway.
//!
//! # Which bytes are hashed
//!
//! - Kafka key: the key's bytes as produced.
//! - JSON string field: the string's content after JSON unescaping, as UTF-8
//!   (what a ClickHouse `String` column holds), without quotes.
//! - JSON number, `true`, `false`: the literal text as written in the message
//!   (`42`, `4.20e1` and `42.0` are different keys). For a numeric column,
//!   reproduce with `xxHash64(toString(col))` only where ClickHouse prints the
//!   number the way the producer wrote it (plain integers do).
//! - JSON object or array: its raw text as written, including whitespace.
//!
//! # Typed hashing: the shard a `Distributed` table would pick
//!
//! With [`KeyHash::Text`] (the default, above) a `Distributed` table whose
//! sharding key is `xxHash64(id)` over a numeric `id` does **not** route
//! like spate: ClickHouse hashes the number's binary value, spate its text;
//! use `xxHash64(toString(id))` there, or switch spate to one of
//!
//! - [`KeyHash::Typed`]: the JSON value is read as the ClickHouse type given
//!   ([`KeyType`]) and hashed as ClickHouse's `xxHash64(col)` hashes a value
//!   of that type: an integer's fixed-width little-endian bytes (`UInt64` 5
//!   hashes the 8 bytes `05 00 .. 00`; ClickHouse's `FunctionsHashing`
//!   hashes the column's memory, little-endian on every platform it
//!   supports), a `String`'s bytes. Checked against chdb-core 26.9
//!   (`xxHash64(toUInt64(5))` = 9925382920258869565, see the tests).
//!   18.16 has no `xxHash64` at all.
//! - [`KeyHash::Value`]: the integer value itself (a `Distributed` table with
//!   the sharding key `col` for an integer column); a negative value counts
//!   as the unsigned integer of the same width and bits (an `Int32` -1 as
//!   2^32 - 1, an `Int64` -1 as 2^64 - 1), as 18.16's `Distributed` takes it
//!   (measured, spate-clickhouse's `tests/it/distributed_routing.rs`).
//!
//! A value that does not fit the type (a string for `UInt64`, `-1` for
//! `UInt32`, `1.5`) is a record error naming the field.
//!
//! # Shard weights
//!
//! As the `Distributed` engine does ("the remainder of dividing the sharding
//! expression by the total weight of the shards": ClickHouse docs, Table
//! engines, Distributed, "Writing data"): with weights `w0, w1, ..` the
//! remainder `r = hash mod (w0 + w1 + ..)` picks the shard `i` whose range
//! `[w0 + .. + w(i-1), w0 + .. + wi)` holds `r`. Without weights each is 1,
//! which is `hash mod shards`. Checked against 18.16's `Distributed` in
//! spate-clickhouse's `tests/it/real_server.rs`.
//!

use spate_core::pipeline::chain::RecordError;

use crate::spec::{MappingError, parse_pointer};

/// What a shard router hashes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ShardKey {
    /// No sharding key: round robin over shards, record by record.
    #[default]
    None,
    /// The Kafka message key.
    KafkaKey,
    /// A JSON field of the message value: the path of object keys from the
    /// top-level object (one element for a top-level field).
    Field(Vec<String>),
}

impl ShardKey {
    /// The top-level JSON field `name`.
    pub fn field(name: impl Into<String>) -> Self {
        ShardKey::Field(vec![name.into()])
    }

    /// The JSON field at `pointer` (RFC 6901, e.g. `/user/id`).
    ///
    /// # Errors
    /// [`MappingError::BadPointer`] for a malformed pointer.
    pub fn pointer(pointer: &str) -> Result<Self, MappingError> {
        Ok(ShardKey::Field(parse_pointer(pointer)?))
    }
}

/// How the key's value becomes the 64-bit number the shard is picked by
/// (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyHash {
    /// XXH64 of the key's bytes: a string's content, any other JSON value's
    /// text (ClickHouse: `xxHash64(toString(col))` for plain integers).
    #[default]
    Text,
    /// XXH64 of the value read as this ClickHouse type, as ClickHouse's
    /// `xxHash64(col)` computes it.
    Typed(KeyType),
    /// The integer value itself (ClickHouse: sharding key `col`).
    Value(KeyType),
}

/// The ClickHouse type a key value is read as for [`KeyHash::Typed`] and
/// [`KeyHash::Value`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    /// `UInt8`.
    UInt8,
    /// `UInt16`.
    UInt16,
    /// `UInt32`.
    UInt32,
    /// `UInt64`.
    UInt64,
    /// `Int8`.
    Int8,
    /// `Int16`.
    Int16,
    /// `Int32`.
    Int32,
    /// `Int64`.
    Int64,
    /// `String` (typed hashing only).
    String,
}

impl KeyType {
    /// The type named by `name` as ClickHouse spells it (`UInt64`, `String`).
    pub fn parse(name: &str) -> Option<KeyType> {
        Some(match name {
            "UInt8" => KeyType::UInt8,
            "UInt16" => KeyType::UInt16,
            "UInt32" => KeyType::UInt32,
            "UInt64" => KeyType::UInt64,
            "Int8" => KeyType::Int8,
            "Int16" => KeyType::Int16,
            "Int32" => KeyType::Int32,
            "Int64" => KeyType::Int64,
            "String" => KeyType::String,
            _ => return None,
        })
    }

    /// The integer `v` as ClickHouse holds it in a column of this type:
    /// its little-endian bytes at the type's width, written to `out`; the
    /// byte count. What [`KeyHash::Typed`] hashes and [`KeyHash::Value`]
    /// reads (zero-extended). Every format's router reads an integer key
    /// through this one function.
    ///
    /// # Errors
    /// `v` outside the type's range, or the type is `String` (no integer).
    pub fn int_bytes(self, v: i128, out: &mut [u8; 8]) -> Result<usize, &'static str> {
        let range = "not an integer in the type's range";
        macro_rules! int {
            ($t:ty) => {{
                let x = <$t>::try_from(v).map_err(|_| range)?;
                let b = x.to_le_bytes();
                out[..b.len()].copy_from_slice(&b);
                Ok(b.len())
            }};
        }
        match self {
            KeyType::UInt8 => int!(u8),
            KeyType::UInt16 => int!(u16),
            KeyType::UInt32 => int!(u32),
            KeyType::UInt64 => int!(u64),
            KeyType::Int8 => int!(i8),
            KeyType::Int16 => int!(i16),
            KeyType::Int32 => int!(i32),
            KeyType::Int64 => int!(i64),
            KeyType::String => Err("a String has no integer value"),
        }
    }

    /// Whether the type is an unsigned integer.
    pub fn is_unsigned(self) -> bool {
        matches!(
            self,
            KeyType::UInt8 | KeyType::UInt16 | KeyType::UInt32 | KeyType::UInt64
        )
    }
}

/// What a record without its key becomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissingKey {
    /// A record error (the `on_error` policy decides).
    #[default]
    Error,
    /// Round robin, counted by the router (the JSON router's `unkeyed`).
    RoundRobin,
}

/// Everything a shard router routes by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardSpec {
    /// What is hashed.
    pub key: ShardKey,
    /// How.
    pub hash: KeyHash,
    /// Shard weights as the `Distributed` engine's (one per shard, each > 0);
    /// empty: every shard weighs 1.
    pub weights: Vec<u64>,
    /// What a record without its key becomes.
    pub missing: MissingKey,
}

/// The shard of a 64-bit sharding value among `shards`, with `weights` as
/// the `Distributed` engine's (empty: all 1; else one per shard, each > 0):
/// `r = value mod total weight`, the shard whose cumulative weight range
/// holds `r`.
#[inline]
pub fn weighted_shard(value: u64, shards: usize, weights: &[u64]) -> usize {
    if weights.is_empty() {
        return (value % shards as u64) as usize;
    }
    debug_assert_eq!(weights.len(), shards, "one weight per shard");
    let total: u64 = weights.iter().sum();
    let mut r = value % total;
    for (i, &w) in weights.iter().enumerate() {
        if r < w {
            return i;
        }
        r -= w;
    }
    unreachable!("r < total")
}

/// The shard of a key: `XXH64(key, 0) mod shards` (see the module docs).
/// `shards` must be at least 1.
#[inline]
pub fn shard_of_key(key: &[u8], shards: usize) -> usize {
    debug_assert!(shards > 0, "at least one shard");
    (key_hash(key) % shards as u64) as usize
}

/// The 64-bit hash spate shards by: XXH64 with seed 0, as ClickHouse's
/// `xxHash64` computes it for a `String`.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(key, 0)
}

/// Why a record has no shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// The record lacks its key.
    Missing,
    /// The key's value does not fit the typed mode's type.
    BadValue(&'static str),
}

/// The integer in `text` (decimal ASCII, as Rust reads an integer of the
/// key type: an optional sign, `-` only for a signed type) as
/// [`KeyType::int_bytes`] writes it.
fn text_int_bytes(t: KeyType, text: &[u8], out: &mut [u8; 8]) -> Result<usize, &'static str> {
    if t == KeyType::String {
        return Err("a String has no integer value");
    }
    let range = "not an integer in the type's range";
    let s = std::str::from_utf8(text).map_err(|_| "not UTF-8")?;
    if t.is_unsigned() && s.starts_with('-') {
        return Err(range);
    }
    let v: i128 = s.parse().map_err(|_| range)?;
    t.int_bytes(v, out)
}

/// The format-neutral half of every shard router: round robin, the Kafka
/// key, the weights and the missing-key policy, and the record error naming
/// the key. A format's router finds a field's value in its records and
/// hands its sharding value here (spate-formats' `json::route` and
/// `avro::route`), so every format routes alike.
#[derive(Clone, Debug)]
pub struct ShardPicker {
    spec: ShardSpec,
    next: usize,
    unkeyed: u64,
}

impl ShardPicker {
    /// A picker per `spec`, starting its round robin at shard 0.
    pub fn new(spec: ShardSpec) -> Self {
        Self {
            spec,
            next: 0,
            unkeyed: 0,
        }
    }

    /// What it routes by.
    pub fn spec(&self) -> &ShardSpec {
        &self.spec
    }

    /// Records that had a sharding key configured but no key value and went
    /// round robin instead ([`ShardPicker::unkeyed_round`]).
    pub fn unkeyed(&self) -> u64 {
        self.unkeyed
    }

    /// The next shard of the round robin among `shards` (at least 1).
    pub fn round(&mut self, shards: usize) -> usize {
        debug_assert!(shards > 0, "at least one shard");
        let s = self.next % shards;
        self.next = s + 1;
        s
    }

    /// The next round-robin shard for a record without its key value,
    /// counted in [`ShardPicker::unkeyed`].
    pub fn unkeyed_round(&mut self, shards: usize) -> usize {
        self.unkeyed += 1;
        self.round(shards)
    }

    /// The shard for a record whose key is not a field: round robin for
    /// [`ShardKey::None`], the Kafka key's [`ShardPicker::hash_text`] for
    /// [`ShardKey::KafkaKey`].
    ///
    /// # Errors
    /// As [`ShardPicker::settle`].
    ///
    /// # Panics
    /// For a [`ShardKey::Field`] key: the format's router finds fields.
    pub fn pick_unfielded(
        &mut self,
        key: Option<&[u8]>,
        shards: usize,
    ) -> Result<usize, RouteError> {
        match &self.spec.key {
            ShardKey::None => Ok(self.round(shards)),
            ShardKey::KafkaKey => {
                let h = key.map(|k| self.hash_text(k));
                self.settle(h, shards)
            }
            ShardKey::Field(_) => unreachable!("a field key is found by the format's router"),
        }
    }

    /// The shard for a record's sharding value: `Some` picks by the weights
    /// ([`weighted_shard`]); `None` (the record lacks its key) goes round
    /// robin under [`MissingKey::RoundRobin`].
    ///
    /// # Errors
    /// The value's own error; [`RouteError::Missing`] for `None` under
    /// [`MissingKey::Error`].
    pub fn settle(
        &mut self,
        value: Option<Result<u64, RouteError>>,
        shards: usize,
    ) -> Result<usize, RouteError> {
        match value {
            Some(h) => Ok(weighted_shard(h?, shards, &self.spec.weights)),
            None if self.spec.missing == MissingKey::RoundRobin => Ok(self.unkeyed_round(shards)),
            None => Err(RouteError::Missing),
        }
    }

    /// The sharding value of a key given as text (a Kafka key's bytes, a
    /// JSON value's literal text, a string's content) per the spec's
    /// [`KeyHash`]: XXH64 of the text; in the typed modes the text read as
    /// a decimal integer of the key type ([`KeyType::int_bytes`]) and hashed
    /// ([`KeyHash::Typed`]) or taken as it is ([`KeyHash::Value`]: its bits
    /// as the unsigned integer of its own width, zero-extended, which is
    /// what 18.16's `Distributed` takes the remainder of: an Int32 -1 is
    /// 2^32 - 1, an Int64 -1 is 2^64 - 1; measured in spate-clickhouse's
    /// `tests/it/distributed_routing.rs`).
    ///
    /// # Errors
    /// [`RouteError::BadValue`] when the text is no integer of the type.
    pub fn hash_text(&self, text: &[u8]) -> Result<u64, RouteError> {
        match self.spec.hash {
            KeyHash::Text | KeyHash::Typed(KeyType::String) => Ok(key_hash(text)),
            KeyHash::Typed(t) => {
                let mut b = [0u8; 8];
                let n = text_int_bytes(t, text, &mut b).map_err(RouteError::BadValue)?;
                Ok(key_hash(&b[..n]))
            }
            KeyHash::Value(t) => {
                let mut b = [0u8; 8];
                text_int_bytes(t, text, &mut b).map_err(RouteError::BadValue)?;
                Ok(u64::from_le_bytes(b))
            }
        }
    }

    /// The record error for a route error, naming the key.
    pub fn record_error(&self, e: &RouteError) -> RecordError {
        let name = match &self.spec.key {
            ShardKey::None => "shard_key".to_owned(),
            ShardKey::KafkaKey => "the Kafka key".to_owned(),
            ShardKey::Field(p) => p.join("/"),
        };
        let reason = match e {
            RouteError::Missing => match &self.spec.key {
                ShardKey::KafkaKey => {
                    "the message has no Kafka key, and sink.clickhouse.shard_key \
                                       is kafka_key"
                        .to_owned()
                }
                _ => format!(
                    "the shard key field `{name}` (sink.clickhouse.shard_key) is missing or null"
                ),
            },
            RouteError::BadValue(why) => {
                format!("the shard key `{name}` does not fit sink.clickhouse.shard_key.type: {why}")
            }
        };
        RecordError::encode(name, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// XXH64 reference values (seed 0), as published with xxHash and as
    /// ClickHouse's `xxHash64('...')` prints them.
    #[test]
    fn hash_is_xxh64_seed_0() {
        assert_eq!(key_hash(b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(key_hash(b"a"), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(key_hash(b"abc"), 0x44BC_2CF5_AD77_0999);
    }

    /// Fixed vectors: changing any of these moves users' rows to other
    /// shards; never change them without a migration note.
    #[test]
    fn shards_are_stable() {
        let got: Vec<usize> = ["user-1", "user-2", "user-3", "user-4", "user-5", "日本"]
            .iter()
            .map(|k| shard_of_key(k.as_bytes(), 4))
            .collect();
        assert_eq!(got, STABLE_4);
        let hashes: Vec<u64> = ["user-1", "42"]
            .iter()
            .map(|k| key_hash(k.as_bytes()))
            .collect();
        assert_eq!(hashes, STABLE_HASHES);
    }

    /// Checked against a current ClickHouse engine (chdb-core 26.9):
    /// `SELECT groupArray(xxHash64(k) % 4) FROM (SELECT arrayJoin(['user-1',
    /// 'user-2', 'user-3', 'user-4', 'user-5', '日本']) AS k)` and
    /// `hex(xxHash64('user-1'))`, `hex(xxHash64('42'))`.
    const STABLE_4: [usize; 6] = [0, 1, 2, 0, 3, 3];
    const STABLE_HASHES: [u64; 2] = [0xA173_746B_114C_6BE8, 0x6DE6_F5D0_76D7_42B9];

    #[test]
    fn keys_spread_evenly() {
        for shards in [2usize, 3, 4, 7] {
            let mut counts = vec![0u32; shards];
            let n = 70_000u32;
            for i in 0..n {
                counts[shard_of_key(format!("key-{i}").as_bytes(), shards)] += 1;
            }
            let expect = f64::from(n) / shards as f64;
            for (s, &c) in counts.iter().enumerate() {
                let dev = (f64::from(c) - expect).abs() / expect;
                assert!(dev < 0.03, "{shards} shards: shard {s} got {c} of {n}");
            }
        }
    }

    /// An integer key's text reads as Rust reads an integer of the key type
    /// (what the JSON router did with `str::parse` per type before the Avro
    /// and JSON routers shared `int_bytes`): `+` allowed, `-` only signed,
    /// the type's range exactly, little-endian at the type's width.
    #[test]
    fn integer_key_text_reads_as_the_type_does() {
        let mut b = [0u8; 8];
        assert_eq!(text_int_bytes(KeyType::UInt8, b"+5", &mut b), Ok(1));
        assert_eq!(b[0], 5);
        assert!(text_int_bytes(KeyType::UInt8, b"-0", &mut b).is_err());
        assert_eq!(text_int_bytes(KeyType::Int8, b"-0", &mut b), Ok(1));
        assert!(text_int_bytes(KeyType::UInt8, b"256", &mut b).is_err());
        assert_eq!(
            text_int_bytes(KeyType::UInt64, b"18446744073709551615", &mut b),
            Ok(8)
        );
        assert_eq!(b, [0xff; 8]);
        assert!(text_int_bytes(KeyType::UInt64, b"18446744073709551616", &mut b).is_err());
        assert_eq!(text_int_bytes(KeyType::Int32, b"-1", &mut b), Ok(4));
        assert_eq!(b[..4], [0xff; 4]);
        assert!(text_int_bytes(KeyType::Int64, b"1.5", &mut b).is_err());
        assert!(text_int_bytes(KeyType::String, b"5", &mut b).is_err());
        assert_eq!(KeyType::Int16.int_bytes(-2, &mut b), Ok(2));
        assert_eq!(b[..2], [0xfe, 0xff]);
    }
}
