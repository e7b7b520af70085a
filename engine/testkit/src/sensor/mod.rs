//! The sensor benchmark workload (issues 21 and 22): deterministic
//! generators whose every value has a closed form, so tests compute their
//! expectations by iterating message and event indexes.
//!
//! - [`avro`]: Confluent-framed Avro `SensorBatch` messages (100 events
//!   each, fanned out with `explode`); `spate produce --sensor` produces
//!   them.
//! - [`protobuf`]: the same values as flat Protobuf `SensorEventRow`
//!   messages, one per row.

pub mod avro;
pub mod protobuf;
