//! The Kafka source's configuration: what to subscribe to, librdkafka
//! properties passed through as strings, and the settings spate owns.
//!
//! spate owns three librdkafka properties because at-least-once (D1) depends
//! on them: offsets are committed only by the controller, behind acknowledged
//! data, so librdkafka must neither commit nor store offsets by itself, and a
//! partition reaching its end is not an event the pipeline acts on. A config
//! that sets one of them, to any value, is rejected naming the key
//! ([`ConfigError::OwnedKey`]). Queue forwarding (one queue per partition, the
//! lanes) is owned too, but is not a property: [`crate::KafkaSource`] sets it up.
//!
//! Every other property passes through unchanged; see librdkafka's
//! [CONFIGURATION.md](https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md).
//!
//! ```
//! use std::collections::BTreeMap;
//! use spate_kafka::KafkaSourceConfig;
//!
//! let mut config = KafkaSourceConfig::new(["flights"]);
//! config.set("bootstrap.servers", "kafka-1:9092,kafka-2:9092")
//!     .set("group.id", "spate-flights")
//!     // where a partition with no committed offset starts
//!     .set("auto.offset.reset", "earliest")
//!     // eager (`range`, `roundrobin`) or incremental (`cooperative-sticky`)
//!     .set("partition.assignment.strategy", "cooperative-sticky")
//!     // statistics every 5 s feed `spate_consumer_lag{topic,partition}`
//!     .set("statistics.interval.ms", "5000");
//! assert!(config.validate().is_ok());
//!
//! config.set("enable.auto.commit", "true");
//! let err = config.validate().unwrap_err();
//! assert!(err.to_string().contains("enable.auto.commit"));
//! ```

use std::collections::BTreeMap;

/// librdkafka properties spate sets itself and a config may not set, with the
/// value spate uses and why.
///
/// See librdkafka's
/// [CONFIGURATION.md](https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)
/// for each property's meaning.
pub const OWNED_PROPERTIES: [(&str, &str, &str); 3] = [
    (
        "enable.auto.commit",
        "false",
        "offsets are committed by the controller behind acknowledged rows (D1)",
    ),
    (
        "enable.auto.offset.store",
        "false",
        "librdkafka must not store offsets of messages that were only polled (D1)",
    ),
    (
        "enable.partition.eof",
        "false",
        "reaching a partition's end is not an event the pipeline acts on",
    ),
];

/// Default for [`KafkaSourceConfig::max_batch`]: messages per lane poll. One
/// ack handle covers one poll, so this bounds the work behind one handle
/// while keeping per-batch overhead small.
pub const DEFAULT_MAX_BATCH: usize = 1024;

/// Settings of a [`crate::KafkaSource`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaSourceConfig {
    /// Topics to subscribe to. A name starting with `^` is a regular
    /// expression, as in librdkafka's
    /// `rd_kafka_subscribe` ([rdkafka.h](https://github.com/confluentinc/librdkafka/blob/master/src/rdkafka.h)).
    pub topics: Vec<String>,
    /// librdkafka properties, passed through as strings (`bootstrap.servers`
    /// and `group.id` are required; the keys in [`OWNED_PROPERTIES`] are
    /// refused).
    pub properties: BTreeMap<String, String>,
    /// Most messages one lane poll returns (> 0); one poll batch gets one ack
    /// handle. Default [`DEFAULT_MAX_BATCH`].
    pub max_batch: usize,
    /// Whether an assignment whose committed offsets and metadata cannot be
    /// read from the group coordinator fails (`true`, what
    /// `delivery: effectively_once` needs: a lane that did not know its
    /// recorded ranges would form new batches over them, D9) or goes on
    /// without them (`false`, the default: `at_least_once` only uses them for
    /// the out-of-range report).
    pub committed_required: bool,
    /// How often the group's lag is read from the brokers for every
    /// partition of the subscription (`spate_group_lag`, `lag.rs`), by a
    /// client and thread of its own; `None` (the default here; spate's
    /// `source.kafka.lag_interval` defaults to
    /// [`crate::DEFAULT_LAG_INTERVAL`]) reads nothing.
    pub lag_interval: Option<std::time::Duration>,
}

impl KafkaSourceConfig {
    /// A config subscribing to `topics`, with no properties yet and the
    /// default [`KafkaSourceConfig::max_batch`].
    pub fn new<I, T>(topics: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Self {
            topics: topics.into_iter().map(Into::into).collect(),
            properties: BTreeMap::new(),
            max_batch: DEFAULT_MAX_BATCH,
            committed_required: false,
            lag_interval: None,
        }
    }

    /// Sets librdkafka property `key` to `value` (checked by
    /// [`KafkaSourceConfig::validate`], not here).
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`ConfigError::OwnedKey`] naming the first owned key set (in key
    /// order), [`ConfigError::Missing`] for a missing `bootstrap.servers` or
    /// `group.id`, [`ConfigError::NoTopics`], [`ConfigError::MaxBatch`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some((key, _, why)) = OWNED_PROPERTIES
            .iter()
            .find(|(key, _, _)| self.properties.contains_key(*key))
        {
            return Err(ConfigError::OwnedKey {
                key: (*key).to_owned(),
                reason: why,
            });
        }
        for key in ["bootstrap.servers", "group.id"] {
            if self.properties.get(key).is_none_or(|v| v.trim().is_empty()) {
                return Err(ConfigError::Missing(key));
            }
        }
        if self.topics.is_empty() || self.topics.iter().any(|t| t.trim().is_empty()) {
            return Err(ConfigError::NoTopics);
        }
        if self.max_batch == 0 {
            return Err(ConfigError::MaxBatch);
        }
        Ok(())
    }

    /// Has librdkafka accept the full property set, as
    /// [`crate::KafkaSource::new`] will, by creating (and dropping) a
    /// consumer that subscribes to nothing and contacts no broker: catches
    /// a misspelt or out-of-range pass-through property before a run.
    ///
    /// # Errors
    /// What [`KafkaSourceConfig::validate`] returns, or
    /// [`ConfigError::Client`] with librdkafka's message naming the
    /// property.
    pub fn check_client(&self) -> Result<(), ConfigError> {
        self.validate()?;
        let mut client = rdkafka::ClientConfig::new();
        for (key, value) in self.client_properties() {
            client.set(key, value);
        }
        let _: rdkafka::consumer::BaseConsumer = client.create()?;
        Ok(())
    }

    /// The full property set handed to librdkafka: the pass-through
    /// properties plus [`OWNED_PROPERTIES`]. Call after
    /// [`KafkaSourceConfig::validate`].
    pub(crate) fn client_properties(&self) -> BTreeMap<String, String> {
        debug_assert!(self.validate().is_ok(), "client_properties before validate");
        let mut props = self.properties.clone();
        // The lag series without a setting (an explicit value, 0 included,
        // is kept).
        props
            .entry("statistics.interval.ms".to_owned())
            .or_insert_with(|| crate::DEFAULT_STATISTICS_INTERVAL_MS.to_owned());
        for (key, value, _) in OWNED_PROPERTIES {
            props.insert(key.to_owned(), value.to_owned());
        }
        props
    }

    /// The group id (present after [`KafkaSourceConfig::validate`]).
    pub(crate) fn group_id(&self) -> &str {
        self.properties.get("group.id").map_or("", String::as_str)
    }
}

/// A [`KafkaSourceConfig`] that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The config sets a property spate owns (see [`OWNED_PROPERTIES`]).
    #[error("librdkafka property `{key}` is owned by spate and cannot be set: {reason}")]
    OwnedKey {
        /// The refused key.
        key: String,
        /// Why spate owns it.
        reason: &'static str,
    },
    /// A required property is missing or empty.
    #[error("librdkafka property `{0}` is required")]
    Missing(&'static str),
    /// No topic to subscribe to, or an empty topic name.
    #[error("`topics` must list at least one non-empty topic name or ^regex")]
    NoTopics,
    /// `max_batch` is zero.
    #[error("`max_batch` must be positive")]
    MaxBatch,
    /// librdkafka refused the configuration or the subscription.
    #[error("librdkafka refused the configuration: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> KafkaSourceConfig {
        let mut c = KafkaSourceConfig::new(["t"]);
        c.set("bootstrap.servers", "localhost:9092")
            .set("group.id", "g");
        c
    }

    #[test]
    fn every_owned_key_is_refused_by_name() {
        for (key, _, _) in OWNED_PROPERTIES {
            let mut c = base();
            c.set(key, "false");
            match c.validate() {
                Err(ConfigError::OwnedKey { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}: {other:?}"),
            }
        }
    }

    #[test]
    fn check_client_names_a_property_librdkafka_does_not_know() {
        base().check_client().expect("a valid set");
        let mut c = base();
        c.set("session.timeout.msx", "10000");
        let err = c.check_client().expect_err("misspelt").to_string();
        assert!(err.contains("session.timeout.msx"), "{err}");
        let mut c = base();
        c.set("fetch.max.bytes", "lots");
        let err = c.check_client().expect_err("not a number").to_string();
        assert!(err.contains("fetch.max.bytes"), "{err}");
    }

    #[test]
    fn owned_values_override_nothing_else() {
        let mut c = base();
        c.set("auto.offset.reset", "earliest");
        c.validate().unwrap();
        let props = c.client_properties();
        assert_eq!(props["auto.offset.reset"], "earliest");
        for (key, value, _) in OWNED_PROPERTIES {
            assert_eq!(props[key], value);
        }
    }

    #[test]
    fn statistics_default_to_5_s_and_an_explicit_value_is_kept() {
        let c = base();
        c.validate().unwrap();
        assert_eq!(c.client_properties()["statistics.interval.ms"], "5000");
        let mut c = base();
        c.set("statistics.interval.ms", "0");
        c.validate().unwrap();
        assert_eq!(c.client_properties()["statistics.interval.ms"], "0");
    }

    #[test]
    fn required_keys_and_topics() {
        let mut c = KafkaSourceConfig::new(["t"]);
        assert_eq!(c.validate(), Err(ConfigError::Missing("bootstrap.servers")));
        c.set("bootstrap.servers", "x:1");
        assert_eq!(c.validate(), Err(ConfigError::Missing("group.id")));
        c.set("group.id", "g");
        c.validate().unwrap();
        c.topics.clear();
        assert_eq!(c.validate(), Err(ConfigError::NoTopics));
        c.topics.push("t".into());
        c.max_batch = 0;
        assert_eq!(c.validate(), Err(ConfigError::MaxBatch));
    }
}
