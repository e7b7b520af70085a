//! `format.avro`: Avro messages, Confluent-framed with writer schemas from a
//! schema registry, or plain datums of one schema file; and its
//! `registry` section, which becomes a
//! [`spate_formats::registry::RegistryConfig`].
//!
//! Checked at load ([`AvroFormat::validate`], errors naming the key):
//! `framing: confluent` needs `registry` and takes no `schema_file`;
//! `framing: plain` needs `schema_file` and takes no `registry`; the URL is
//! `http(s)://`; `password` needs `user`; `tls.insecure` excludes
//! `tls.ca_file`; `retry.attempts` >= 1; timeouts and backoffs > 0. The
//! schema file is read, and the registry reached, when the pipeline is
//! planned (`spate check`, `spate run`), not here.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use spate_clickhouse::writer::{Credentials, TlsOptions, tls};
use spate_formats::registry::{RegistryConfig, RegistryRetry};

use super::{ConfigError, Dur, TlsSection, invalid};

/// `format.avro`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AvroFormat {
    /// `confluent`: magic byte 0, the schema id (big-endian u32), the datum;
    /// the writer schema comes from `registry` by that id. `plain`: the
    /// message is the datum alone, written with `schema_file`'s schema.
    /// Default: `plain` when only `schema_file` is set, else `confluent`.
    #[serde(default)]
    pub framing: Option<Framing>,
    /// `format.avro.registry`: the Confluent-compatible schema registry.
    #[serde(default)]
    pub registry: Option<RegistrySection>,
    /// `format.avro.schema_file`: the `.avsc` writer schema of plain datums.
    #[serde(default)]
    pub schema_file: Option<PathBuf>,
}

/// `format.avro.framing`, `format.protobuf.framing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// The Confluent wire format.
    Confluent,
    /// A bare datum.
    Plain,
}

impl Framing {
    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Framing::Confluent => "confluent",
            Framing::Plain => "plain",
        }
    }
}

impl AvroFormat {
    /// The framing, with the default applied.
    pub fn framing(&self) -> Framing {
        match (self.framing, &self.registry, &self.schema_file) {
            (Some(f), _, _) => f,
            (None, None, Some(_)) => Framing::Plain,
            _ => Framing::Confluent,
        }
    }

    /// The load-time checks (see the module doc).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.framing() {
            Framing::Confluent => {
                if self.schema_file.is_some() {
                    return Err(invalid(
                        "format.avro.schema_file",
                        "with `framing: confluent` each message names its writer schema by \
                         id and the registry gives it; a schema file is for `framing: plain`",
                    ));
                }
                let Some(r) = &self.registry else {
                    return Err(invalid(
                        "format.avro.registry",
                        "`framing: confluent` needs a schema registry (`registry: {url: ...}`); \
                         for bare datums of one schema set `framing: plain` and `schema_file`",
                    ));
                };
                r.validate("format.avro.registry")
            }
            Framing::Plain => {
                if self.registry.is_some() {
                    return Err(invalid(
                        "format.avro.registry",
                        "`framing: plain` messages carry no schema id, so a registry is never \
                         asked; remove it or set `framing: confluent`",
                    ));
                }
                match &self.schema_file {
                    None => Err(invalid(
                        "format.avro.schema_file",
                        "`framing: plain` needs the writer schema's .avsc file",
                    )),
                    Some(p) if p.as_os_str().is_empty() => {
                        Err(invalid("format.avro.schema_file", "must not be empty"))
                    }
                    Some(_) => Ok(()),
                }
            }
        }
    }
}

/// `format.protobuf`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProtobufFormat {
    /// `confluent`: magic byte 0, the schema id, the message indexes, the
    /// message; the schema comes from `registry` by id and the indexes
    /// pick the message in it. `plain`: the value is the message alone, of
    /// type `message` in `descriptor_set`. Default: `plain` when only
    /// `descriptor_set` is set, else `confluent`.
    #[serde(default)]
    pub framing: Option<Framing>,
    /// `format.protobuf.registry`: the Confluent-compatible schema registry
    /// (same keys as `format.avro.registry`).
    #[serde(default)]
    pub registry: Option<RegistrySection>,
    /// `format.protobuf.descriptor_set`: a `FileDescriptorSet` file
    /// (`protoc --include_imports --descriptor_set_out=FILE`).
    #[serde(default)]
    pub descriptor_set: Option<PathBuf>,
    /// `format.protobuf.message`: the fully qualified message name in the
    /// descriptor set (`spate.bench.SensorRow`).
    #[serde(default)]
    pub message: Option<String>,
}

impl ProtobufFormat {
    /// The framing, with the default applied.
    pub fn framing(&self) -> Framing {
        match (self.framing, &self.registry, &self.descriptor_set) {
            (Some(f), _, _) => f,
            (None, None, Some(_)) => Framing::Plain,
            _ => Framing::Confluent,
        }
    }

    /// The load-time checks: `confluent` needs `registry` and takes no
    /// `descriptor_set`/`message` (the id in each message names its schema;
    /// decoding every id as one fixed message would take a schema spate
    /// did not check as data); `plain` needs both `descriptor_set` and
    /// `message` and takes no `registry`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.framing() {
            Framing::Confluent => {
                for (key, set) in [
                    ("descriptor_set", self.descriptor_set.is_some()),
                    ("message", self.message.is_some()),
                ] {
                    if set {
                        return Err(invalid(
                            format!("format.protobuf.{key}"),
                            "with `framing: confluent` each message names its schema by id \
                             and the registry gives it; a descriptor set and message name are \
                             for `framing: plain`",
                        ));
                    }
                }
                let Some(r) = &self.registry else {
                    return Err(invalid(
                        "format.protobuf.registry",
                        "`framing: confluent` needs a schema registry (`registry: {url: ...}`); \
                         for bare messages set `framing: plain`, `descriptor_set` and `message`",
                    ));
                };
                r.validate("format.protobuf.registry")
            }
            Framing::Plain => {
                if self.registry.is_some() {
                    return Err(invalid(
                        "format.protobuf.registry",
                        "`framing: plain` messages carry no schema id, so a registry is never \
                         asked; remove it or set `framing: confluent`",
                    ));
                }
                if self
                    .descriptor_set
                    .as_ref()
                    .is_none_or(|p| p.as_os_str().is_empty())
                {
                    return Err(invalid(
                        "format.protobuf.descriptor_set",
                        "`framing: plain` needs the descriptor set file of the message type",
                    ));
                }
                if self.message.as_deref().is_none_or(|m| m.trim().is_empty()) {
                    return Err(invalid(
                        "format.protobuf.message",
                        "`framing: plain` needs the fully qualified message name",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// `format.avro.registry`: a Confluent-compatible schema registry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegistrySection {
    /// Base URL, `http(s)://host:port` (plus the API's path prefix where
    /// the registry has one, e.g. Apicurio's `/apis/ccompat/v7`).
    pub url: String,
    /// HTTP Basic auth user (Confluent Cloud: the API key).
    #[serde(default)]
    pub user: Option<String>,
    /// Its password (the API secret). Use `${ENV}` rather than the text.
    #[serde(default)]
    pub password: Option<String>,
    /// TLS for an `https://` URL: `ca_file`, `insecure`.
    #[serde(default)]
    pub tls: TlsSection,
    /// Bound on one request, answer included (default 5s).
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Bound on establishing a connection (default 2s).
    #[serde(default)]
    pub connect_timeout: Option<Dur>,
    /// How a request that fails transiently (unreachable, timed out,
    /// HTTP 5xx/408/429) is retried.
    #[serde(default)]
    pub retry: RegistryRetrySection,
    /// The subject whose latest schema `spate check` and the start-up plan
    /// compile against the table (default `{topic}-value` of the first
    /// topic, Confluent's TopicNameStrategy); a subject that does not exist
    /// is only noted.
    #[serde(default)]
    pub subject: Option<String>,
}

/// `format.avro.registry.retry`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegistryRetrySection {
    /// Attempts in all, the first included (default 5).
    #[serde(default)]
    pub attempts: Option<u32>,
    /// Wait before the second attempt, doubled after each (default 200ms).
    #[serde(default)]
    pub backoff: Option<Dur>,
    /// Longest wait between attempts (default 2s).
    #[serde(default)]
    pub max_backoff: Option<Dur>,
}

impl RegistrySection {
    /// The load-time checks, keys under `key`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let url = self.url.trim();
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        match rest {
            Some(r) if !r.is_empty() && !r.starts_with('/') => {}
            _ => {
                return Err(invalid(
                    format!("{key}.url"),
                    format!(
                        "`{}`: expected an http:// or https:// URL",
                        super::secrets::redact(&self.url)
                    ),
                ));
            }
        }
        if url.contains('?') {
            return Err(invalid(
                format!("{key}.url"),
                "a query string is not allowed",
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(invalid(format!("{key}.password"), "set without `user`"));
        }
        if self.tls.insecure && self.tls.ca_file.is_some() {
            return Err(invalid(
                format!("{key}.tls.insecure"),
                "verification is skipped, so `ca_file` would be ignored; set one of them",
            ));
        }
        if self.retry.attempts == Some(0) {
            return Err(invalid(
                format!("{key}.retry.attempts"),
                "at least 1 (the first attempt counts)",
            ));
        }
        for (name, d) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            ("retry.backoff", self.retry.backoff),
            ("retry.max_backoff", self.retry.max_backoff),
        ] {
            if d.is_some_and(|d| d.0.is_zero()) {
                return Err(invalid(format!("{key}.{name}"), "must be greater than 0"));
            }
        }
        if let (Some(b), Some(m)) = (self.retry.backoff, self.retry.max_backoff)
            && m.0 < b.0
        {
            return Err(invalid(
                format!("{key}.retry.max_backoff"),
                "shorter than `retry.backoff`",
            ));
        }
        if self.subject.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(invalid(format!("{key}.subject"), "must not be empty"));
        }
        Ok(())
    }

    /// The client config; reads the CA file (`{key}.tls.ca_file` names it
    /// when it cannot be used).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `{key}.tls.ca_file`.
    pub fn client_config(&self, key: &str) -> Result<RegistryConfig, ConfigError> {
        let mut c = RegistryConfig::new(self.url.trim());
        c.credentials = self.user.as_ref().map(|user| Credentials {
            user: user.clone(),
            password: self.password.clone().unwrap_or_default(),
        });
        if self.tls != TlsSection::default() {
            let options = TlsOptions {
                ca_file: self.tls.ca_file.clone(),
                insecure: self.tls.insecure,
            };
            c.tls = Some(
                tls::client_config(&options)
                    .map_err(|e| invalid(format!("{key}.tls.ca_file"), e.to_string()))?,
            );
            if self.tls.insecure {
                tracing::warn!(
                    "{key}.tls.insecure is set: the registry's certificate is not verified"
                );
            }
        }
        if let Some(d) = self.timeout {
            c.request_timeout = d.0;
        }
        if let Some(d) = self.connect_timeout {
            c.connect_timeout = d.0;
        }
        let d = RegistryRetry::default();
        c.retry = RegistryRetry {
            attempts: self.retry.attempts.unwrap_or(d.attempts),
            first_backoff: self.retry.backoff.map_or(d.first_backoff, |b| b.0),
            max_backoff: self.retry.max_backoff.map_or(
                d.max_backoff
                    .max(self.retry.backoff.map_or(Duration::ZERO, |b| b.0)),
                |b| b.0,
            ),
        };
        Ok(c)
    }

    /// The subject the start-up plan reads (see [`Self::subject`]).
    pub fn subject_for(&self, first_topic: &str) -> String {
        self.subject
            .clone()
            .unwrap_or_else(|| format!("{first_topic}-value"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const MINIMAL: &str = "
pipeline: {name: p}
source: {kafka: {brokers: 'b:1', topics: [sensors], group_id: g}}
sink: {clickhouse: {shards: [[http://c:8123]], table: t}}
";

    fn load(format: &str) -> Result<Config, ConfigError> {
        Config::from_yaml(&format!("{MINIMAL}format: {format}\n"), |_| None)
    }

    fn err(format: &str) -> String {
        load(format).unwrap_err().to_string()
    }

    #[test]
    fn a_registry_section_loads_into_the_client_config() {
        let c = load(
            "{avro: {registry: {url: 'https://sr:8081/apis/ccompat/v7', user: u, password: p, \
             timeout: 3s, connect_timeout: 1s, retry: {attempts: 7, backoff: 50ms, \
             max_backoff: 1s}, tls: {insecure: true}}}}",
        )
        .unwrap();
        let avro = c.format.avro().unwrap();
        assert_eq!(avro.framing(), Framing::Confluent);
        let r = avro.registry.as_ref().unwrap();
        assert_eq!(r.subject_for("sensors"), "sensors-value");
        let rc = r.client_config("format.avro.registry").unwrap();
        assert_eq!(rc.url, "https://sr:8081/apis/ccompat/v7");
        assert_eq!(rc.credentials.as_ref().unwrap().user, "u");
        assert_eq!(rc.request_timeout, Duration::from_secs(3));
        assert_eq!(rc.connect_timeout, Duration::from_secs(1));
        assert_eq!(
            rc.retry,
            RegistryRetry {
                attempts: 7,
                first_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(1),
            }
        );
        assert!(rc.tls.is_some());
        // Defaults.
        let c = load("{avro: {registry: {url: 'http://sr:8081'}}}").unwrap();
        let rc = c.format.avro().unwrap().registry.as_ref().unwrap();
        let rc = rc.client_config("k").unwrap();
        assert_eq!(rc.retry, RegistryRetry::default());
        assert!(rc.credentials.is_none() && rc.tls.is_none());
        // The JSON default is untouched.
        assert!(c.format.json().time_formats.is_empty());
    }

    /// `examples/avro-sensor.yaml` loads: the workload's pipeline.
    #[test]
    fn the_avro_sensor_example_loads() {
        let text = include_str!("../../../../examples/avro-sensor.yaml");
        let c = Config::from_yaml(text, |_| None).unwrap();
        let avro = c.format.avro().unwrap();
        assert_eq!(avro.framing(), Framing::Confluent);
        assert_eq!(avro.registry.as_ref().unwrap().url, "http://127.0.0.1:8081");
        assert_eq!(
            c.mapping.explode_path().unwrap(),
            Some(vec!["events".to_owned()])
        );
        assert_eq!(
            c.mapping.filter_expr().unwrap().unwrap().to_string(),
            r#"all(unit != "drop", value >= 0)"#
        );
        assert_eq!(c.mapping.default_literals().unwrap()["region"], "'unknown'");
    }

    #[test]
    fn plain_framing_takes_a_schema_file() {
        let c = load("{avro: {schema_file: /x/s.avsc}}").unwrap();
        assert_eq!(c.format.avro().unwrap().framing(), Framing::Plain);
        let e = err("{avro: {framing: plain}}");
        assert!(e.contains("format.avro.schema_file"), "{e}");
        let e = err("{avro: {framing: plain, schema_file: s.avsc, registry: {url: 'http://r'}}}");
        assert!(e.contains("format.avro.registry"), "{e}");
    }

    #[test]
    fn bad_avro_keys_are_named() {
        for (format, key) in [
            ("{avro: {}}", "format.avro.registry"),
            ("{avro: {framing: confluent}}", "format.avro.registry"),
            (
                "{avro: {registry: {url: 'http://r'}, schema_file: s.avsc}}",
                "format.avro.schema_file",
            ),
            (
                "{avro: {registry: {url: 'sr:8081'}}}",
                "format.avro.registry.url",
            ),
            (
                "{avro: {registry: {url: 'http://'}}}",
                "format.avro.registry.url",
            ),
            (
                "{avro: {registry: {url: 'http://r?x=1'}}}",
                "format.avro.registry.url",
            ),
            (
                "{avro: {registry: {url: 'http://r', password: p}}}",
                "format.avro.registry.password",
            ),
            (
                "{avro: {registry: {url: 'http://r', tls: {insecure: true, ca_file: c.pem}}}}",
                "format.avro.registry.tls.insecure",
            ),
            (
                "{avro: {registry: {url: 'http://r', retry: {attempts: 0}}}}",
                "format.avro.registry.retry.attempts",
            ),
            (
                "{avro: {registry: {url: 'http://r', timeout: 0s}}}",
                "format.avro.registry.timeout",
            ),
            (
                "{avro: {registry: {url: 'http://r', retry: {backoff: 2s, max_backoff: 1s}}}}",
                "format.avro.registry.retry.max_backoff",
            ),
            (
                "{avro: {registry: {url: 'http://r', subject: ''}}}",
                "format.avro.registry.subject",
            ),
            (
                "{avro: {registry: {url: 'http://r', usr: u}}}",
                "format.avro.registry",
            ),
            (
                "{avro: {framing: framed, schema_file: s}}",
                "format.avro.framing",
            ),
            (
                "{avro: {schema_file: s.avsc}, json: {mode: ndjson}}",
                "format",
            ),
            ("{avro: {schema_file: s.avsc, registy: {}}}", "format.avro"),
        ] {
            let e = err(format);
            assert!(e.contains(&format!("`{key}")), "{format}: {e}");
        }
    }

    #[test]
    fn protobuf_keys_load_and_bad_ones_are_named() {
        let c = load("{protobuf: {registry: {url: 'http://r:8081'}}}").unwrap();
        let p = c.format.protobuf().unwrap();
        assert_eq!(p.framing(), Framing::Confluent);
        let c = load("{protobuf: {descriptor_set: d.pb, message: m.M}}").unwrap();
        assert_eq!(c.format.protobuf().unwrap().framing(), Framing::Plain);
        for (format, key) in [
            ("{protobuf: {}}", "format.protobuf.registry"),
            (
                "{protobuf: {descriptor_set: d.pb}}",
                "format.protobuf.message",
            ),
            (
                "{protobuf: {framing: plain, message: m.M}}",
                "format.protobuf.descriptor_set",
            ),
            (
                "{protobuf: {registry: {url: 'http://r'}, message: m.M}}",
                "format.protobuf.message",
            ),
            (
                "{protobuf: {framing: confluent, registry: {url: 'http://r'}, descriptor_set: d}}",
                "format.protobuf.descriptor_set",
            ),
            (
                "{protobuf: {framing: plain, descriptor_set: d, message: m, registry: {url: 'http://r'}}}",
                "format.protobuf.registry",
            ),
            (
                "{protobuf: {registry: {url: 'ftp://r'}}}",
                "format.protobuf.registry.url",
            ),
            (
                "{protobuf: {registry: {url: 'http://r'}}, avro: {registry: {url: 'http://r'}}}",
                "format",
            ),
        ] {
            let e = err(format);
            assert!(e.contains(&format!("`{key}")), "{format}: {e}");
        }
    }

    #[test]
    fn a_missing_ca_file_is_named_when_the_client_is_built() {
        let c = load("{avro: {registry: {url: 'https://r', tls: {ca_file: /nonexistent.pem}}}}")
            .unwrap();
        let r = c.format.avro().unwrap().registry.as_ref().unwrap();
        let e = r
            .client_config("format.avro.registry")
            .unwrap_err()
            .to_string();
        assert!(e.contains("format.avro.registry.tls.ca_file"), "{e}");
        assert!(e.contains("/nonexistent.pem"), "{e}");
    }
}
