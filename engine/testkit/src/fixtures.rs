//! Shared event fixtures.
//!
//! [`FLIGHTS`] is the flights table the mapping tests and examples read the
//! `flights-*.ndjson` fixtures into.
//!
//! The fixture files live in `engine/testkit/fixtures/` ([`dir`]); the
//! NDJSON samples are here as text too ([`FLIGHTS_50`], [`EARTHQUAKES_20`],
//! [`MOVIES_33`]) so every crate's tests and examples read the same bytes.
//!
//! [`EVENT15`] is the 15-column clickstream event that the no-allocation
//! mapping test (`engine/formats/tests/it/no_alloc.rs`), the throughput
//! example (`engine/formats/examples/throughput.rs`) and the encode bench
//! (`benches/benches/encode.rs`) all use, so a column changed here changes
//! every measurement of it at once. Types are ClickHouse type names as
//! `system.columns.type` prints them (the form `ChType::parse` reads).

/// The directory of the fixture files (`engine/testkit/fixtures`).
pub fn dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// `fixtures/flights-50.ndjson`: 50 flight rows ([`FLIGHTS`]' columns).
pub const FLIGHTS_50: &str = include_str!("../fixtures/flights-50.ndjson");
/// `fixtures/earthquakes-20.ndjson`: 20 USGS earthquake features (nested
/// objects and arrays).
pub const EARTHQUAKES_20: &str = include_str!("../fixtures/earthquakes-20.ndjson");
/// `fixtures/movies-33.ndjson`: 33 movie records (arrays of strings).
pub const MOVIES_33: &str = include_str!("../fixtures/movies-33.ndjson");

/// The flights table of `fixtures/flights-*.ndjson` (dates as
/// [`FLIGHT_TIME_FORMAT`]), `origin` as `LowCardinality(String)`:
/// `(column name, ClickHouse type)`, in table order.
pub const FLIGHTS: [(&str, &str); 5] = [
    ("date", "DateTime"),
    ("delay", "Int32"),
    ("distance", "UInt32"),
    ("origin", "LowCardinality(String)"),
    ("destination", "String"),
];

/// The strftime format of the flights fixtures' `date` field.
pub const FLIGHT_TIME_FORMAT: &str = "%Y/%m/%d %H:%M";

/// The 15-column event: `(column name, ClickHouse type)`, in table order.
pub const EVENT15: [(&str, &str); 15] = [
    ("ts", "DateTime64(3, 'UTC')"),
    ("user_id", "UInt64"),
    ("session", "UUID"),
    ("event", "LowCardinality(String)"),
    ("page", "String"),
    ("referrer", "Nullable(String)"),
    ("country", "FixedString(2)"),
    ("ip", "IPv4"),
    ("duration_ms", "UInt32"),
    ("price", "Decimal(18, 4)"),
    ("qty", "UInt16"),
    ("is_mobile", "Bool"),
    ("score", "Float64"),
    ("tags", "Array(String)"),
    ("version", "Int32"),
];

/// Row `i` of the [`EVENT15`] stream as one JSON object, fields in column
/// order, every field present (`referrer` is `null`). Deterministic in `i`;
/// values vary with `i` so no two neighbouring rows are alike.
pub fn event15_row(i: usize) -> String {
    format!(
        r#"{{"ts":"2024-05-01T12:{:02}:{:02}.{:03}Z","user_id":{},"session":"61f0c404-5cb3-11e7-907b-a6006ad3{:04x}","event":"click","page":"/p/{}","referrer":null,"country":"DE","ip":"10.0.{}.{}","duration_ms":{},"price":"{}.99","qty":{},"is_mobile":{},"score":{}.5,"tags":["a","b"],"version":3}}"#,
        i % 60,
        i % 59,
        i % 1000,
        1_000_000 + i,
        i % 65536,
        i % 1000,
        i % 256,
        i % 250,
        i * 7 % 100_000,
        i % 500,
        i % 20,
        i % 2 == 0,
        i % 100
    )
}

/// The Kafka message the metadata-column tests read (spate-row's
/// `meta/tests.rs`, spate-formats' `json/tests/meta.rs`): its timestamp
/// [`META_TS`], a key, offset 42, and the headers it is given.
pub mod meta {
    use spate_core::record::{Header, Headers, Payload, TimestampKind, TopicPartition};

    /// The message's CreateTime: 2023-11-14T22:13:20.123Z, in milliseconds
    /// since the epoch.
    pub const META_TS: i64 = 1_700_000_000_123;

    /// Four headers: `trace` twice (`t-1`, then `t-2`), `empty` with an empty
    /// value, and `gone` with no value (a null header).
    pub const HEADERS: [Header<'static>; 4] = [
        Header {
            name: b"trace",
            value: Some(b"t-1"),
        },
        Header {
            name: b"empty",
            value: Some(b""),
        },
        Header {
            name: b"trace",
            value: Some(b"t-2"),
        },
        Header {
            name: b"gone",
            value: None,
        },
    ];

    /// A message of `tp` at offset 42 with key `user-7`, value `{}`, CreateTime
    /// [`META_TS`] and `headers`.
    pub fn message<'a>(tp: &'a TopicPartition, headers: &'a [Header<'a>]) -> Payload<'a> {
        Payload {
            value: Some(b"{}"),
            key: Some(b"user-7"),
            partition: tp,
            offset: 42,
            timestamp_ms: Some(META_TS),
            timestamp_kind: TimestampKind::CreateTime,
            headers: Headers::from_slice(headers),
        }
    }
}
