//! spate-formats' integration tests, one binary with a module per area:
//!
//! - [`avro_prop`]: the Avro decoder against apache-avro's own decoding
//!   (property tests).
//! - [`registry`]: the schema registry client against the registry test
//!   fixture (`ci/registry_fixture.py`), plain and through TLS.

#[cfg(feature = "avro")]
mod avro_prop;
#[cfg(all(feature = "avro", feature = "protobuf"))]
mod registry;
