//! The shard router: picks the shard of each record (DESIGN "Chain": encode
//! the row into the chunk of the shard the router picks).
//!
//! [`ShardRouter`] implements `spate_core::pipeline::chain::Router<Payload>`.
//! It shards by a hash of a **sharding key**, which is one of
//!
//! - [`ShardKey::KafkaKey`]: the Kafka message key, byte for byte;
//! - [`ShardKey::Field`]: one JSON field of the message value, found by a path
//!   of object keys (a top-level name, or a JSON pointer such as
//!   `/user/id`);
//! - [`ShardKey::None`]: no key: plain round robin, record by record.
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
//! with the sharding key `xxHash64(user_id)` routes rows the same way.
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
//! A record whose key is absent (no Kafka key, a missing field, a JSON `null`,
//! or a value that is not one JSON object) goes round robin, like an unkeyed
//! record; [`ShardRouter::unkeyed`] counts them. Such a record has no
//! affinity to keep, and a value that cannot be read is refused by the
//! encoder right after routing anyway.
//!
//! Reading a field scans the message once up to the field (skipping other
//! values without building anything) and allocates nothing per record once
//! the unescape buffer has grown.

use spate_core::pipeline::chain::{RecordCx, Router};
use spate_core::record::Payload;

use crate::mapping::{MappingError, parse_pointer, unescape};

/// What a [`ShardRouter`] hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardKey {
    /// No sharding key: round robin over shards, record by record.
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

/// Routes records to shards by a hash of their [`ShardKey`], round robin when
/// there is no key (see the module docs for the formula).
#[derive(Clone, Debug)]
pub struct ShardRouter {
    key: ShardKey,
    next: usize,
    unkeyed: u64,
    scratch: Vec<u8>,
}

impl ShardRouter {
    /// A router hashing `key`.
    pub fn new(key: ShardKey) -> Self {
        Self {
            key,
            next: 0,
            unkeyed: 0,
            scratch: Vec::new(),
        }
    }

    /// A router without a key: round robin.
    pub fn round_robin() -> Self {
        Self::new(ShardKey::None)
    }

    /// The key this router hashes.
    pub fn key(&self) -> &ShardKey {
        &self.key
    }

    /// Records that had a sharding key configured but no key value (no Kafka
    /// key, a missing or null field, an unreadable message) and went round
    /// robin instead.
    pub fn unkeyed(&self) -> u64 {
        self.unkeyed
    }

    /// The shard for a message with Kafka key `key` and value `value`, among
    /// `shards` (at least 1). What [`Router::route`] does with a payload.
    pub fn shard_for(&mut self, key: Option<&[u8]>, value: &[u8], shards: usize) -> usize {
        let hashed = match &self.key {
            ShardKey::None => return self.round(shards),
            ShardKey::KafkaKey => key.map(key_hash),
            ShardKey::Field(path) => field_value(value, path, &mut self.scratch).map(|v| match v {
                Found::Input(a, b) => key_hash(&value[a..b]),
                Found::Scratch => key_hash(&self.scratch),
            }),
        };
        match hashed {
            Some(h) => (h % shards as u64) as usize,
            None => {
                self.unkeyed += 1;
                self.round(shards)
            }
        }
    }

    fn round(&mut self, shards: usize) -> usize {
        let s = self.next % shards;
        self.next = s + 1;
        s
    }
}

impl<'a> Router<Payload<'a>> for ShardRouter {
    fn route(&mut self, record: &Payload<'a>, _cx: &RecordCx<'_>, shards: usize) -> usize {
        self.shard_for(record.key, record.bytes(), shards)
    }
}

/// Where the key bytes of a field are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    /// `value[a..b]`.
    Input(usize, usize),
    /// The unescaped string now in the scratch buffer.
    Scratch,
}

/// Finds the value at `path` in the JSON object `json`: a string's unescaped
/// content, any other value's raw text; `None` when absent, `null`, or the
/// input is not a well-formed object up to that point.
fn field_value(json: &[u8], path: &[String], scratch: &mut Vec<u8>) -> Option<Found> {
    let mut sc = Scan { s: json, i: 0 };
    let (last, parents) = path.split_last()?;
    for seg in parents {
        sc.find_key(seg, scratch)?;
        // The parent must be an object; find_key checks the `{`.
    }
    sc.find_key(last, scratch)?;
    sc.ws();
    match sc.peek()? {
        b'"' => {
            let (a, b, escaped) = sc.string()?;
            if escaped {
                unescape(&json[a..b], scratch).ok()?;
                Some(Found::Scratch)
            } else {
                Some(Found::Input(a, b))
            }
        }
        b'n' => None,
        _ => {
            let a = sc.i;
            sc.skip_value(0)?;
            Some(Found::Input(a, sc.i))
        }
    }
}

/// Nesting bound while skipping values, as the mapper's.
const MAX_DEPTH: u32 = 128;

struct Scan<'a> {
    s: &'a [u8],
    i: usize,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// At an object: moves past the key `want` and its `:`, leaving the
    /// cursor before its value.
    fn find_key(&mut self, want: &str, scratch: &mut Vec<u8>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            self.ws();
            if self.peek()? != b'"' {
                return None;
            }
            let (a, b, escaped) = self.string()?;
            let hit = if escaped {
                unescape(&self.s[a..b], scratch).ok()?;
                scratch.as_slice() == want.as_bytes()
            } else {
                &self.s[a..b] == want.as_bytes()
            };
            self.eat(b':')?;
            if hit {
                return Some(());
            }
            self.ws();
            self.skip_value(0)?;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                _ => return None,
            }
        }
    }

    /// At a `"`: moves past the string; returns its content's range and
    /// whether it holds escapes.
    fn string(&mut self) -> Option<(usize, usize, bool)> {
        self.i += 1;
        let a = self.i;
        let mut escaped = false;
        loop {
            match self.peek()? {
                b'"' => {
                    let b = self.i;
                    self.i += 1;
                    return Some((a, b, escaped));
                }
                b'\\' => {
                    escaped = true;
                    self.i += 2;
                }
                _ => self.i += 1,
            }
        }
    }

    /// Moves past one value (of any kind) without checking scalars closely.
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match self.peek()? {
            b'"' => self.string().map(drop),
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                self.i += 1;
                self.ws();
                if self.peek()? == close {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    if open == b'{' {
                        self.ws();
                        if self.peek()? != b'"' {
                            return None;
                        }
                        self.string()?;
                        self.eat(b':')?;
                    }
                    self.skip_value(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        c if c == close => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            _ => {
                let a = self.i;
                while let Some(c) = self.peek() {
                    if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.i += 1;
                }
                (self.i > a).then_some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(r: &mut ShardRouter, key: Option<&str>, value: &str, shards: usize) -> usize {
        r.shard_for(key.map(str::as_bytes), value.as_bytes(), shards)
    }

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

    #[test]
    fn field_strings_hash_their_unescaped_content() {
        let mut r = ShardRouter::new(ShardKey::field("u"));
        for shards in [2, 3, 5, 16] {
            let want = shard_of_key("h\u{e9}llo \"x\"".as_bytes(), shards);
            for v in [
                r#"{"u":"héllo \"x\""}"#,
                r#"{"a":[1,{"u":2}],"u":"h\u00e9llo \"x\"","z":null}"#,
                r#" { "b" : {"c":"}"} , "u" :  "h\u00E9llo \u0022x\u0022" } "#,
                r#"{"\u0075":"héllo \"x\""}"#,
            ] {
                assert_eq!(route(&mut r, None, v, shards), want, "{v}");
            }
        }
        assert_eq!(r.unkeyed(), 0);
        // A surrogate pair unescapes to the 4-byte character.
        let want = shard_of_key("😀".as_bytes(), 16);
        assert_eq!(route(&mut r, None, r#"{"u":"\ud83d\ude00"}"#, 16), want);
    }

    #[test]
    fn field_scalars_hash_their_text() {
        let mut r = ShardRouter::new(ShardKey::field("id"));
        for (v, key) in [
            (r#"{"id":42}"#, "42"),
            (r#"{"id":-4.2e1,"x":1}"#, "-4.2e1"),
            (r#"{"id":true}"#, "true"),
            (r#"{"id":[1, 2]}"#, "[1, 2]"),
            (r#"{"id":{"a":"]"}}"#, r#"{"a":"]"}"#),
        ] {
            assert_eq!(
                route(&mut r, None, v, 1 << 20),
                shard_of_key(key.as_bytes(), 1 << 20),
                "{v}"
            );
        }
    }

    #[test]
    fn nested_fields_by_pointer() {
        let mut r = ShardRouter::new(ShardKey::pointer("/user/id").unwrap());
        let v = r#"{"id":"no","user":{"name":"x","id":"u-7"},"id2":1}"#;
        assert_eq!(route(&mut r, None, v, 97), shard_of_key(b"u-7", 97));
        assert!(ShardKey::pointer("user").is_err());
    }

    #[test]
    fn kafka_keys_hash_their_bytes() {
        let mut r = ShardRouter::new(ShardKey::KafkaKey);
        assert_eq!(route(&mut r, Some("user-3"), "{}", 4), STABLE_4[2]);
        assert_eq!(r.unkeyed(), 0);
    }

    #[test]
    fn missing_keys_go_round_robin_and_are_counted() {
        let mut r = ShardRouter::new(ShardKey::field("u"));
        let got: Vec<usize> = [
            r#"{"a":1}"#,
            r#"{"u":null}"#,
            "not json",
            r#"{"a":"unterminated"#,
            "",
            r#"{"v":{"u":"nested, not top level"}}"#,
        ]
        .iter()
        .map(|v| route(&mut r, None, v, 3))
        .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
        assert_eq!(r.unkeyed(), 6);
        let mut k = ShardRouter::new(ShardKey::KafkaKey);
        assert_eq!(route(&mut k, None, "{}", 2), 0);
        assert_eq!(route(&mut k, None, "{}", 2), 1);
        assert_eq!(k.unkeyed(), 2);
    }

    #[test]
    fn no_key_is_round_robin() {
        let mut r = ShardRouter::round_robin();
        let got: Vec<usize> = (0..7).map(|_| route(&mut r, Some("k"), "{}", 3)).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(r.unkeyed(), 0, "no key configured is not a missing key");
    }

    use proptest::prelude::*;
    use serde_json::Value;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-c\"\\\\é]{0,2}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The scanner agrees with serde_json on which bytes a top-level
        /// field's key is, for random objects, compact or pretty.
        #[test]
        fn field_lookup_agrees_with_serde(
            fields in proptest::collection::btree_map("[a-c\"\\\\é]{0,2}", json_value(), 0..6),
            want in "[a-c\"\\\\é]{0,2}",
            pretty in any::<bool>(),
        ) {
            let obj: serde_json::Map<String, Value> = fields.into_iter().collect();
            let text = if pretty {
                serde_json::to_string_pretty(&obj).unwrap()
            } else {
                serde_json::to_string(&obj).unwrap()
            };
            let mut r = ShardRouter::new(ShardKey::field(want.clone()));
            let got = r.shard_for(None, text.as_bytes(), 1 << 30);
            match obj.get(&want) {
                None | Some(Value::Null) => prop_assert_eq!(r.unkeyed(), 1),
                Some(Value::String(s)) => {
                    prop_assert_eq!(got, shard_of_key(s.as_bytes(), 1 << 30));
                }
                Some(v) => {
                    let raw = if pretty {
                        serde_json::to_string_pretty(v).unwrap()
                    } else {
                        v.to_string()
                    };
                    // Pretty nested values are indented by their depth;
                    // compare compact ones exactly and pretty scalars.
                    if !pretty || !(v.is_array() || v.is_object()) {
                        prop_assert_eq!(got, shard_of_key(raw.as_bytes(), 1 << 30));
                    }
                    prop_assert_eq!(r.unkeyed(), 0);
                }
            }
        }
    }

    #[test]
    fn routes_through_the_chain_seam() {
        use spate_core::ack::{AckIssuer, ack_channel};
        use spate_core::record::TopicPartition;
        let (tx, _rx) = ack_channel();
        let tp = TopicPartition::new("t", 0);
        let mut issuer = AckIssuer::new(tp.clone(), 1, tx);
        let ack = issuer.issue(0, 0);
        let payload = Payload {
            value: Some(br#"{"u":"user-4"}"#),
            key: Some(b"user-1"),
            partition: &tp,
            offset: 0,
            timestamp_ms: None,
        };
        let cx = RecordCx { payload, ack: &ack };
        let mut by_field = ShardRouter::new(ShardKey::field("u"));
        let mut by_key = ShardRouter::new(ShardKey::KafkaKey);
        assert_eq!(by_field.route(&payload, &cx, 4), STABLE_4[3]);
        assert_eq!(by_key.route(&payload, &cx, 4), STABLE_4[0]);
    }
}
