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
//! # A record without its key
//!
//! A record whose message is a well-formed JSON object without the field (or
//! with `null` there), or which has no Kafka key when the key is the Kafka
//! key, is refused: [`ShardRouter::try_route`] returns a record error naming
//! the key, which the pipeline's `on_error` policy skips (counted,
//! dead-lettered) or fails on. A mistyped field name thus shows at once
//! instead of spreading the rows evenly. With
//! [`spate_row::shard::MissingKey::RoundRobin`] such records go round robin
//! instead (counted by [`ShardRouter::unkeyed`]). A message that is not one
//! well-formed JSON object (malformed before the field, or not an object at
//! all) goes round robin and is refused by the encoder right after routing,
//! with the decode error.
//!
//! Reading a field scans the message once up to the field with the mapper's
//! lexer (`scan::field`: values before it skipped with their grammar
//! checked, keys of up to 7 bytes compared as one word) and allocates
//! nothing per record once the unescape buffer has grown. Measured against
//! the router's former scan of its own (callgrind, `examples/route_cost.rs`,
//! instructions per record): flights rows keyed by `origin` 1,232 against
//! 1,274, the 15-column event keyed by `country` 1,869 against 2,426.

use spate_core::pipeline::chain::{RecordCx, Router};
use spate_core::record::Payload;

use spate_core::pipeline::chain::RecordError;

use super::scan::{Found, NotFound, find_field, is_one_object};
use spate_row::shard::{KeyHash, KeyType, RouteError, ShardKey, ShardPicker, ShardSpec};

/// Routes records to shards by a hash of their [`ShardKey`] (see
/// [`spate_row::shard`] for the formula, the typed modes and weights): finds
/// a field's value in the JSON message, the [`ShardPicker`] does the rest.
#[derive(Clone, Debug)]
pub struct ShardRouter {
    picker: ShardPicker,
    scratch: Vec<u8>,
}

impl ShardRouter {
    /// A router hashing `key`'s text, every shard weighing 1, records
    /// without the key refused.
    pub fn new(key: ShardKey) -> Self {
        Self::with_spec(ShardSpec {
            key,
            ..ShardSpec::default()
        })
    }

    /// A router per `spec`.
    pub fn with_spec(spec: ShardSpec) -> Self {
        Self {
            picker: ShardPicker::new(spec),
            scratch: Vec::new(),
        }
    }

    /// A router without a key: round robin.
    pub fn round_robin() -> Self {
        Self::new(ShardKey::None)
    }

    /// The key this router hashes.
    pub fn key(&self) -> &ShardKey {
        &self.picker.spec().key
    }

    /// Records that had a sharding key configured but no key value and went
    /// round robin instead ([`spate_row::shard::MissingKey::RoundRobin`], or a message that is
    /// not a JSON object).
    pub fn unkeyed(&self) -> u64 {
        self.picker.unkeyed()
    }

    /// The shard for a message with Kafka key `key` and value `value`, among
    /// `shards` (at least 1); a record without its key goes round robin
    /// whatever the spec says (see [`ShardRouter::try_shard_for`]).
    pub fn shard_for(&mut self, key: Option<&[u8]>, value: &[u8], shards: usize) -> usize {
        match self.try_shard_for(key, value, shards) {
            Ok(s) => s,
            Err(_) => self.picker.unkeyed_round(shards),
        }
    }

    /// The shard for a message, or why it has none: [`RouteError::Missing`]
    /// when the record is a JSON object without the field (or `null` there),
    /// or has no Kafka key, and the spec says [`spate_row::shard::MissingKey::Error`];
    /// [`RouteError::BadValue`] when the value does not fit a typed mode.
    ///
    /// # Errors
    /// As above.
    pub fn try_shard_for(
        &mut self,
        key: Option<&[u8]>,
        value: &[u8],
        shards: usize,
    ) -> Result<usize, RouteError> {
        let ShardKey::Field(path) = &self.picker.spec().key else {
            return self.picker.pick_unfielded(key, shards);
        };
        let h = match find_field(value, path, &mut self.scratch) {
            Ok(Found::Input(a, b, string)) => Some(self.hash_of(&value[a..b], string)),
            Ok(Found::Scratch) => Some(self.hash_of(&self.scratch, true)),
            Err(NotFound::Absent) if is_one_object(value, &mut self.scratch) => None,
            Err(_) => {
                // Not one JSON object: the encoder refuses it right after,
                // with the reason.
                return Ok(self.picker.unkeyed_round(shards));
            }
        };
        self.picker.settle(h, shards)
    }

    /// The sharding value of a field: `text` is a string's content when
    /// `string`, else a JSON value's raw text. A string is no integer for
    /// the typed modes (even `"5"`).
    fn hash_of(&self, text: &[u8], string: bool) -> Result<u64, RouteError> {
        if string
            && let KeyHash::Typed(t) | KeyHash::Value(t) = self.picker.spec().hash
            && t != KeyType::String
        {
            return Err(RouteError::BadValue(
                "a JSON string where an integer is expected",
            ));
        }
        self.picker.hash_text(text)
    }

    /// Whether the JSON `value` holds this router's key field (non-null):
    /// always false for a key that is not a field. The fan-out router asks
    /// it to pick the element or the record ([`crate::json::explode`]).
    pub(crate) fn has_field(&mut self, value: &[u8]) -> bool {
        match &self.picker.spec().key {
            ShardKey::Field(path) => find_field(value, path, &mut self.scratch).is_ok(),
            _ => false,
        }
    }

    /// The record error for a route error, naming the key.
    pub fn record_error(&self, e: &RouteError) -> RecordError {
        self.picker.record_error(e)
    }
}

impl<'a> Router<Payload<'a>> for ShardRouter {
    fn route(&mut self, record: &Payload<'a>, _cx: &RecordCx<'_>, shards: usize) -> usize {
        self.shard_for(record.key, record.bytes(), shards)
    }

    fn try_route(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        shards: usize,
    ) -> Result<usize, RecordError> {
        self.try_shard_for(record.key, record.bytes(), shards)
            .map_err(|e| self.record_error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_row::shard::{MissingKey, shard_of_key, weighted_shard};

    fn route(r: &mut ShardRouter, key: Option<&str>, value: &str, shards: usize) -> usize {
        r.shard_for(key.map(str::as_bytes), value.as_bytes(), shards)
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
        assert_eq!(
            route(&mut r, Some("user-3"), "{}", 4),
            shard_of_key(b"user-3", 4)
        );
        assert_eq!(r.unkeyed(), 0);
    }

    #[test]
    fn missing_keys_are_record_errors() {
        let mut r = ShardRouter::new(ShardKey::field("u"));
        for v in [
            r#"{"a":1}"#,
            r#"{"u":null}"#,
            r#"{"v":{"u":"nested, not top level"}}"#,
        ] {
            assert_eq!(
                r.try_shard_for(None, v.as_bytes(), 3),
                Err(RouteError::Missing),
                "{v}"
            );
        }
        let e = r.record_error(&RouteError::Missing);
        assert_eq!(e.column.as_deref(), Some("u"));
        assert!(e.reason.contains("shard key field `u`"), "{}", e.reason);
        // Not a JSON object: round robin, for the encoder to refuse.
        let got: Vec<usize> = ["not json", r#"{"a":"unterminated"#, ""]
            .iter()
            .map(|v| r.try_shard_for(None, v.as_bytes(), 3).unwrap())
            .collect();
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(r.unkeyed(), 3);
        let mut k = ShardRouter::new(ShardKey::KafkaKey);
        assert_eq!(k.try_shard_for(None, b"{}", 2), Err(RouteError::Missing));
    }

    #[test]
    fn missing_keys_go_round_robin_when_asked_and_are_counted() {
        let mut r = ShardRouter::with_spec(ShardSpec {
            key: ShardKey::field("u"),
            missing: MissingKey::RoundRobin,
            ..ShardSpec::default()
        });
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

    /// `xxHash64(col)` of typed values, from a current ClickHouse engine
    /// (chdb-core 26.9): `SELECT xxHash64(toUInt64(5)), xxHash64(toInt32(-1)),
    /// xxHash64(toUInt8(200)), xxHash64(toInt64(-42)),
    /// xxHash64(toUInt16(1000)), xxHash64('5'), xxHash64(toUInt32(7))`.
    #[test]
    fn typed_hashes_match_clickhouse_xxhash64() {
        let cases: [(KeyType, &str, u64); 7] = [
            (KeyType::UInt64, "5", 9925382920258869565),
            (KeyType::Int32, "-1", 9185342943168159635),
            (KeyType::UInt8, "200", 164852255672563262),
            (KeyType::Int64, "-42", 15400679513160455156),
            (KeyType::UInt16, "1000", 11540459941412362131),
            (KeyType::String, "\"5\"", 7674613650421074157),
            (KeyType::UInt32, "7", 13243476881813409038),
        ];
        for (t, json, want) in cases {
            let shards = 1usize << 40;
            let mut r = ShardRouter::with_spec(ShardSpec {
                key: ShardKey::field("id"),
                hash: KeyHash::Typed(t),
                ..ShardSpec::default()
            });
            let v = format!(r#"{{"id":{json}}}"#);
            assert_eq!(
                r.try_shard_for(None, v.as_bytes(), shards),
                Ok((want % shards as u64) as usize),
                "{t:?} {json}"
            );
        }
    }

    #[test]
    fn typed_values_that_do_not_fit_are_refused() {
        for (t, json) in [
            (KeyType::UInt32, "-1"),
            (KeyType::UInt8, "256"),
            (KeyType::UInt64, "1.5"),
            (KeyType::UInt64, "\"5\""),
            (KeyType::Int64, "true"),
        ] {
            let mut r = ShardRouter::with_spec(ShardSpec {
                key: ShardKey::field("id"),
                hash: KeyHash::Typed(t),
                ..ShardSpec::default()
            });
            let v = format!(r#"{{"id":{json}}}"#);
            let got = r.try_shard_for(None, v.as_bytes(), 2);
            assert!(
                matches!(got, Err(RouteError::BadValue(_))),
                "{t:?} {json}: {got:?}"
            );
        }
    }

    #[test]
    fn weights_pick_by_cumulative_ranges_as_distributed_does() {
        // Weights 1, 2: remainder 0 -> shard 0; 1, 2 -> shard 1.
        let got: Vec<usize> = (0..6).map(|v| weighted_shard(v, 2, &[1, 2])).collect();
        assert_eq!(got, [0, 1, 1, 0, 1, 1]);
        let got: Vec<usize> = (0..7).map(|v| weighted_shard(v, 3, &[2, 0, 5])).collect();
        assert_eq!(got, [0, 0, 2, 2, 2, 2, 2]);
        assert_eq!(weighted_shard(u64::MAX, 3, &[]), (u64::MAX % 3) as usize);
        let mut r = ShardRouter::with_spec(ShardSpec {
            key: ShardKey::field("id"),
            hash: KeyHash::Value(KeyType::Int64),
            weights: vec![1, 2],
            ..ShardSpec::default()
        });
        // -1 as UInt64 is 2^64 - 1, and (2^64 - 1) mod 3 = 0.
        assert_eq!(r.try_shard_for(None, br#"{"id":-1}"#, 2), Ok(0));
        assert_eq!(r.try_shard_for(None, br#"{"id":4}"#, 2), Ok(1));
        // An Int32 -150 counts as 2^32 - 150 (mod 7 = 1: shard 0), not 2^64 - 150
        // (mod 7 = 6: shard 1).
        let mut r = ShardRouter::with_spec(ShardSpec {
            key: ShardKey::field("w"),
            hash: KeyHash::Value(KeyType::Int32),
            weights: vec![2, 5],
            ..ShardSpec::default()
        });
        assert_eq!(r.try_shard_for(None, br#"{"w":-150}"#, 2), Ok(0));
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
            timestamp_kind: spate_core::record::TimestampKind::None,
            headers: spate_core::record::Headers::NONE,
        };
        let cx = RecordCx { payload, ack: &ack };
        let mut by_field = ShardRouter::new(ShardKey::field("u"));
        let mut by_key = ShardRouter::new(ShardKey::KafkaKey);
        assert_eq!(by_field.route(&payload, &cx, 4), shard_of_key(b"user-4", 4));
        assert_eq!(by_key.route(&payload, &cx, 4), shard_of_key(b"user-1", 4));
    }
}
