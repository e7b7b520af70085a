//! A Confluent-compatible schema registry client: the writer schemas that
//! Confluent-framed Avro and Protobuf messages name by id.
//!
//! A Confluent-framed message starts with magic byte 0 and a big-endian u32
//! schema id ([wire format]); the decoder asks this client for the schema of
//! an id it has not seen (`GET /schemas/ids/{id}`, [API reference]) and keeps
//! its own per-lane plan per id, so the client is on the miss path only:
//! once per schema id and process, then [`RegistryClient::get`] answers from
//! its cache without a request.
//!
//! - **Where requests run.** Lanes are std threads; [`RegistryClient::get`]
//!   blocks the calling thread while the request runs on the client's own
//!   one-worker tokio runtime (`spate-registry`): the pipeline's I/O runtime
//!   is made inside `Pipeline::run` and is not reachable from a chain
//!   factory. Called from inside an async context, `get` runs the request
//!   on a scoped helper thread instead of panicking.
//! - **HTTP and TLS** are the ClickHouse writer's: the same hyper client and
//!   connector ([`spate_http::tls`]: the system's roots, a CA file, or
//!   `insecure`), HTTP Basic auth from [`Credentials`].
//! - **Retries.** A transport error (refused, reset, timed out), HTTP 5xx,
//!   408 and 429 are retried with doubling backoff up to
//!   [`RegistryRetry::attempts`]; then [`RegistryError::Unavailable`]. Any
//!   other answer is final: 404 on an id is [`RegistryError::UnknownId`]
//!   (remembered for [`NOT_FOUND_TTL`], so a run of messages with a bad id
//!   costs one request, not one each), 401/403 and other 4xx are
//!   [`RegistryError::Refused`], a 200 that is not a schema is
//!   [`RegistryError::BadAnswer`].
//! - **Errors name the schema id and the registry URL.** A decoder turns one
//!   into the record's error with [`RegistryError::record_error`]; the lane
//!   driver adds topic/partition/offset and applies `on_error` (skip ->
//!   dead letter, or fail). Nothing is decoded under a schema the registry
//!   did not give.
//!
//! Also here, for the start-up check and the producer tools:
//! [`RegistryClient::check`] (`GET /subjects`), [`RegistryClient::latest`]
//! (`GET /subjects/{s}/versions/latest`), [`RegistryClient::versions`] and
//! [`RegistryClient::register`] (`POST /subjects/{s}/versions`).
//!
//! **Schema sources.** The client implements `crate::avro`'s
//! `SchemaSource` (the schema JSON parsed by apache-avro; a schema with
//! references is refused, naming them) and `crate::protobuf`'s
//! `ProtoSchemaSource` (the `.proto` text compiled with the files its
//! references name, fetched transitively by subject and version).
//!
//! Not done: contexts and `GET /schemas/ids/{id}?subject=` are not used.
//!
//! [wire format]: https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format
//! [API reference]: https://docs.confluent.io/platform/current/schema-registry/develop/api.html

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use spate_core::pipeline::chain::RecordError;

use spate_http::{Credentials, https_connector, percent_encode};

/// The media type Confluent's API speaks (JSON is accepted too).
const MEDIA_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// Answers kept: at most this many bytes (a schema is rarely past 1 MiB).
const MAX_ANSWER_BYTES: usize = 16 << 20;
/// How long a 404 for a schema id is remembered before it is asked again.
pub const NOT_FOUND_TTL: Duration = Duration::from_secs(30);

/// How requests that fail transiently are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistryRetry {
    /// Attempts in all, the first included (at least 1). Default 5.
    pub attempts: u32,
    /// Wait before the second attempt; doubled after each failure. Default
    /// 200 ms.
    pub first_backoff: Duration,
    /// Longest wait between two attempts. Default 2 s.
    pub max_backoff: Duration,
}

impl Default for RegistryRetry {
    fn default() -> Self {
        Self {
            attempts: 5,
            first_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// Settings of a [`RegistryClient`].
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Base URL: `http(s)://host:port`, with a path prefix where the
    /// registry serves the API under one (Apicurio:
    /// `.../apis/ccompat/v7`). A trailing `/` is ignored.
    pub url: String,
    /// HTTP Basic auth (Confluent Cloud: API key and secret).
    pub credentials: Option<Credentials>,
    /// The rustls config for `https://` ([`spate_http::tls::client_config`]);
    /// `None`: the system's root certificates.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Bound on establishing a TCP connection. Default 2 s.
    pub connect_timeout: Duration,
    /// Bound on one request, answer included. Default 5 s.
    pub request_timeout: Duration,
    /// Retries of transient failures.
    pub retry: RegistryRetry,
}

impl RegistryConfig {
    /// A config for `url` with the defaults above.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            credentials: None,
            tls: None,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            retry: RegistryRetry::default(),
        }
    }
}

/// A schema's kind, as the registry's `schemaType` names it (absent: AVRO).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemaType {
    /// `AVRO` (the default when the answer has no `schemaType`).
    Avro,
    /// `PROTOBUF`.
    Protobuf,
    /// `JSON` (JSON Schema).
    Json,
}

impl SchemaType {
    /// The registry's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaType::Avro => "AVRO",
            SchemaType::Protobuf => "PROTOBUF",
            SchemaType::Json => "JSON",
        }
    }

    fn parse(text: &str) -> Option<SchemaType> {
        match text {
            "AVRO" => Some(SchemaType::Avro),
            "PROTOBUF" => Some(SchemaType::Protobuf),
            "JSON" => Some(SchemaType::Json),
            _ => None,
        }
    }
}

impl std::fmt::Display for SchemaType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reference from one schema to another (a Protobuf import, an Avro named
/// type defined elsewhere), as the registry lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaReference {
    /// The name the referring schema uses (an import path, a full name).
    pub name: String,
    /// The subject the referenced schema is registered under.
    pub subject: String,
    /// Its version in that subject.
    pub version: i64,
}

/// One schema as the registry gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredSchema {
    /// Its global id (the one in the message's framing).
    pub id: u32,
    /// Its kind.
    pub schema_type: SchemaType,
    /// Its text: Avro schema JSON, a `.proto` file, a JSON Schema.
    pub schema: String,
    /// The schemas it references (not fetched by this client).
    pub references: Vec<SchemaReference>,
}

/// A subject's version as `GET /subjects/{s}/versions/{v}` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubjectVersion {
    /// The subject.
    pub subject: String,
    /// The version number (1-based).
    pub version: i64,
    /// The schema, with its global id.
    pub schema: RegisteredSchema,
}

/// Why the registry gave no schema.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The URL is not an `http(s)://host[:port][/prefix]` URL.
    #[error("schema registry URL `{url}`: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The registry answered 404 for this schema id.
    #[error("schema id {id} is unknown to the schema registry {url}: {message}")]
    UnknownId {
        /// The schema id from the message's framing.
        id: u32,
        /// The registry's base URL.
        url: String,
        /// The registry's message (`error_code` and text).
        message: String,
    },
    /// Every attempt failed transiently (unreachable, timed out, 5xx).
    #[error("schema registry {url} unavailable for {what} after {attempts} attempt(s): {last}")]
    Unavailable {
        /// The registry's base URL.
        url: String,
        /// What was asked (`schema id 7`, `GET /subjects`).
        what: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's failure.
        last: String,
    },
    /// The registry refused the request (401/403: check the credentials;
    /// other 4xx).
    #[error("schema registry {url} refused {what}: HTTP {status}: {message}")]
    Refused {
        /// The registry's base URL.
        url: String,
        /// What was asked.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The registry's message.
        message: String,
    },
    /// A 200 answer that is not what the API promises.
    #[error("schema registry {url}: {what}: unexpected answer: {reason}")]
    BadAnswer {
        /// The registry's base URL.
        url: String,
        /// What was asked.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl RegistryError {
    /// The schema id the error is about, when it is about one.
    pub fn schema_id(&self) -> Option<u32> {
        match self {
            RegistryError::UnknownId { id, .. } => Some(*id),
            RegistryError::Unavailable { what, .. }
            | RegistryError::Refused { what, .. }
            | RegistryError::BadAnswer { what, .. } => {
                what.strip_prefix("schema id ").and_then(|s| s.parse().ok())
            }
            RegistryError::BadUrl { .. } => None,
        }
    }

    /// Whether the failure was transient (the registry was unreachable or
    /// answered 5xx on every attempt): the same request may work later.
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Unavailable { .. })
    }

    /// The record error of a message whose schema this error kept from the
    /// decoder: kind Decode, the reason naming the schema id and the
    /// registry (the lane driver adds topic/partition/offset).
    pub fn record_error(&self) -> RecordError {
        RecordError::decode(self.to_string())
    }
}

/// Owns the client's runtime; shut down in the background on drop, so the
/// client may be dropped inside an async context too.
struct Io(Option<tokio::runtime::Runtime>);

impl Drop for Io {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The registry client: cached, blocking [`get`](Self::get) for lane
/// threads. Cheap to share behind an `Arc`.
pub struct RegistryClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    config: RegistryConfig,
    /// `config.url` without a trailing `/`.
    base: String,
    auth: Option<HeaderValue>,
    cache: RwLock<HashMap<u32, Arc<RegisteredSchema>>>,
    /// 404s by id: when they were answered, and the error.
    not_found: Mutex<HashMap<u32, (tokio::time::Instant, RegistryError)>>,
    io: Io,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &self.base)
            .field("credentials", &self.config.credentials)
            .finish_non_exhaustive()
    }
}

/// One attempt's outcome before interpretation.
enum Attempt {
    /// An answer: status and body.
    Answer(StatusCode, Bytes),
    /// A transient failure, in words.
    Transient(String),
}

impl RegistryClient {
    /// A client for `config`. Makes no request (see [`check`](Self::check)).
    ///
    /// # Errors
    /// [`RegistryError::BadUrl`] when the URL is not `http(s)://host...`;
    /// [`RegistryError::Unavailable`] naming the runtime when its thread
    /// cannot start.
    pub fn new(config: RegistryConfig) -> Result<Self, RegistryError> {
        let base = config.url.trim_end_matches('/').to_owned();
        let bad = |reason: &str| RegistryError::BadUrl {
            url: config.url.clone(),
            reason: reason.to_owned(),
        };
        let uri: Uri = base.parse().map_err(|e| bad(&format!("{e}")))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(bad("the scheme must be http:// or https://")),
        }
        if uri.authority().is_none() {
            return Err(bad("no host"));
        }
        if uri.query().is_some() {
            return Err(bad("a query string is not allowed"));
        }
        let auth = match &config.credentials {
            Some(c) => Some(
                HeaderValue::from_str(&c.basic_auth())
                    .map_err(|_| bad("the credentials do not fit an HTTP header"))?,
            ),
            None => None,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("spate-registry")
            .enable_all()
            .build()
            .map_err(|e| RegistryError::Unavailable {
                url: base.clone(),
                what: "the client's runtime".into(),
                attempts: 0,
                last: e.to_string(),
            })?;
        let connector = https_connector(config.connect_timeout, config.tls.clone());
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            client,
            config,
            base,
            auth,
            cache: RwLock::new(HashMap::new()),
            not_found: Mutex::new(HashMap::new()),
            io: Io(Some(rt)),
        })
    }

    /// The registry's base URL (as configured, without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The schema with global id `id`, from the cache or the registry.
    /// Blocks the calling thread for the request (retries included: at most
    /// about `attempts * request_timeout` plus the backoffs).
    ///
    /// # Errors
    /// [`RegistryError::UnknownId`] (404, also while remembered),
    /// [`RegistryError::Unavailable`] after the retries,
    /// [`RegistryError::Refused`], [`RegistryError::BadAnswer`].
    pub fn get(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        if let Some(s) = self.cached(id) {
            return Ok(s);
        }
        self.block(self.fetch(id))
    }

    /// The schema of `id` if it is in the cache (no request).
    pub fn cached(&self, id: u32) -> Option<Arc<RegisteredSchema>> {
        self.cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// [`get`](Self::get) for async callers: the cache, else the request on
    /// the caller's runtime.
    ///
    /// # Errors
    /// As [`get`](Self::get).
    pub async fn get_async(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        if let Some(s) = self.cached(id) {
            return Ok(s);
        }
        self.fetch(id).await
    }

    async fn fetch(&self, id: u32) -> Result<Arc<RegisteredSchema>, RegistryError> {
        let now = tokio::time::Instant::now();
        {
            let mut nf = self
                .not_found
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match nf.get(&id) {
                Some((at, e)) if now.duration_since(*at) < NOT_FOUND_TTL => return Err(e.clone()),
                Some(_) => {
                    nf.remove(&id);
                }
                None => {}
            }
        }
        let what = format!("schema id {id}");
        let (status, body) = self
            .call(Method::GET, &format!("/schemas/ids/{id}"), None, &what)
            .await?;
        if status == StatusCode::NOT_FOUND {
            let e = RegistryError::UnknownId {
                id,
                url: self.base.clone(),
                message: error_message(&body),
            };
            self.not_found
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(id, (tokio::time::Instant::now(), e.clone()));
            return Err(e);
        }
        self.expect_ok(status, &body, &what)?;
        let json = self.json(&body, &what)?;
        let schema = Arc::new(self.schema_of(id, &json, &what)?);
        self.cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, Arc::clone(&schema));
        Ok(schema)
    }

    /// `GET /subjects`: that the registry answers and accepts the
    /// credentials; the subjects it lists. With the retries, so a registry
    /// that is starting is waited for up to the retry bound.
    ///
    /// # Errors
    /// [`RegistryError::Unavailable`] when it does not answer,
    /// [`RegistryError::Refused`] for bad credentials.
    pub fn check(&self) -> Result<Vec<String>, RegistryError> {
        self.block(async {
            let what = "GET /subjects";
            let (status, body) = self.call(Method::GET, "/subjects", None, what).await?;
            self.expect_ok(status, &body, what)?;
            let json = self.json(&body, what)?;
            json.as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|s| s.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| self.bad_answer(what, "not a list of subject names"))
        })
    }

    /// `GET /subjects/{subject}/versions/latest`; `None` when the subject
    /// is unknown (404). The schema goes into the id cache.
    ///
    /// # Errors
    /// As [`get`](Self::get), for the subject.
    pub fn latest(&self, subject: &str) -> Result<Option<SubjectVersion>, RegistryError> {
        self.version(subject, "latest")
    }

    /// `GET /subjects/{subject}/versions/{version}` (`version`: a number
    /// or `latest`); `None` when the subject or version is unknown.
    ///
    /// # Errors
    /// As [`get`](Self::get), for the subject.
    pub fn version(
        &self,
        subject: &str,
        version: &str,
    ) -> Result<Option<SubjectVersion>, RegistryError> {
        self.block(async {
            let what = format!("subject `{subject}` version {version}");
            let path = format!(
                "/subjects/{}/versions/{}",
                percent_encode(subject),
                percent_encode(version)
            );
            let (status, body) = self.call(Method::GET, &path, None, &what).await?;
            if status == StatusCode::NOT_FOUND {
                return Ok(None);
            }
            self.expect_ok(status, &body, &what)?;
            let json = self.json(&body, &what)?;
            let id = json
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.bad_answer(&what, "no u32 `id`"))?;
            let version = json
                .get("version")
                .and_then(Value::as_i64)
                .ok_or_else(|| self.bad_answer(&what, "no `version`"))?;
            let schema = self.schema_of(id, &json, &what)?;
            self.cache
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(id, Arc::new(schema.clone()));
            Ok(Some(SubjectVersion {
                subject: subject.to_owned(),
                version,
                schema,
            }))
        })
    }

    /// `GET /subjects/{subject}/versions`: the subject's version numbers;
    /// empty when the subject is unknown.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn versions(&self, subject: &str) -> Result<Vec<i64>, RegistryError> {
        self.block(async {
            let what = format!("versions of subject `{subject}`");
            let path = format!("/subjects/{}/versions", percent_encode(subject));
            let (status, body) = self.call(Method::GET, &path, None, &what).await?;
            if status == StatusCode::NOT_FOUND {
                return Ok(Vec::new());
            }
            self.expect_ok(status, &body, &what)?;
            let json = self.json(&body, &what)?;
            json.as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| self.bad_answer(&what, "not a list of version numbers"))
        })
    }

    /// `POST /subjects/{subject}/versions`: registers `schema` with its
    /// `references` (or finds it registered) and returns its global id. Registering the same
    /// schema again returns the same id, so a retry is harmless.
    ///
    /// # Errors
    /// [`RegistryError::Refused`] for a schema the registry refuses (422
    /// invalid, 409 incompatible), else as [`check`](Self::check).
    pub fn register(
        &self,
        subject: &str,
        schema_type: SchemaType,
        schema: &str,
        references: &[SchemaReference],
    ) -> Result<u32, RegistryError> {
        self.block(async {
            let what = format!("registering a schema under subject `{subject}`");
            let mut req = serde_json::Map::new();
            req.insert("schema".into(), Value::String(schema.to_owned()));
            if schema_type != SchemaType::Avro {
                req.insert(
                    "schemaType".into(),
                    Value::String(schema_type.as_str().into()),
                );
            }
            if !references.is_empty() {
                let refs = references
                    .iter()
                    .map(|r| {
                        serde_json::json!({"name": r.name, "subject": r.subject, "version": r.version})
                    })
                    .collect();
                req.insert("references".into(), Value::Array(refs));
            }
            let body = Bytes::from(Value::Object(req).to_string());
            let path = format!("/subjects/{}/versions", percent_encode(subject));
            let (status, answer) = self.call(Method::POST, &path, Some(body), &what).await?;
            self.expect_ok(status, &answer, &what)?;
            let json = self.json(&answer, &what)?;
            json.get("id")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.bad_answer(&what, "no u32 `id`"))
        })
    }

    /// Runs `fut` to completion on the client's runtime, from a plain
    /// thread or (on a scoped helper thread) from inside an async context.
    fn block<F>(&self, fut: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        let rt = self
            .io
            .0
            .as_ref()
            .expect("the runtime lives as long as the client");
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                std::thread::Builder::new()
                    .name("spate-registry-call".into())
                    .spawn_scoped(s, || rt.block_on(fut))
                    .expect("a registry request thread starts")
                    .join()
                    .expect("a registry request does not panic")
            })
        } else {
            rt.block_on(fut)
        }
    }

    /// One request with the retries: the final answer (any status but the
    /// transient ones), or [`RegistryError::Unavailable`].
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        what: &str,
    ) -> Result<(StatusCode, Bytes), RegistryError> {
        let retry = self.config.retry;
        let attempts = retry.attempts.max(1);
        let mut backoff = retry.first_backoff;
        let mut last = String::new();
        for attempt in 1..=attempts {
            match self.once(method.clone(), path, body.clone()).await {
                Attempt::Answer(status, answer) if transient_status(status) => {
                    last = format!("HTTP {}: {}", status.as_u16(), error_message(&answer));
                }
                Attempt::Answer(status, answer) => return Ok((status, answer)),
                Attempt::Transient(reason) => last = reason,
            }
            if attempt < attempts {
                tracing::warn!(
                    registry = %self.base,
                    what,
                    attempt,
                    of = attempts,
                    retry_in = ?backoff,
                    "schema registry request failed: {last}"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(retry.max_backoff);
            }
        }
        Err(RegistryError::Unavailable {
            url: self.base.clone(),
            what: what.to_owned(),
            attempts,
            last,
        })
    }

    async fn once(&self, method: Method, path: &str, body: Option<Bytes>) -> Attempt {
        let uri = format!("{}{path}", self.base);
        let mut req = Request::builder()
            .method(method)
            .uri(&uri)
            .header(header::ACCEPT, format!("{MEDIA_TYPE}, application/json"));
        if let Some(auth) = &self.auth {
            req = req.header(header::AUTHORIZATION, auth.clone());
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, MEDIA_TYPE);
        }
        let req = match req.body(Full::new(body.unwrap_or_default())) {
            Ok(r) => r,
            // The base URL was checked at new(); a path that makes it
            // invalid is a bug, reported rather than retried forever.
            Err(e) => return Attempt::Transient(format!("request for {uri}: {e}")),
        };
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| {
                let mut why = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    why.push_str(": ");
                    why.push_str(&s.to_string());
                    src = s.source();
                }
                why
            })?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        match tokio::time::timeout(self.config.request_timeout, exchange).await {
            Ok(Ok((status, body))) => Attempt::Answer(status, body),
            Ok(Err(why)) => Attempt::Transient(why),
            Err(_) => Attempt::Transient(format!(
                "no answer within {:?} (format.*.registry.timeout)",
                self.config.request_timeout
            )),
        }
    }

    fn expect_ok(&self, status: StatusCode, body: &Bytes, what: &str) -> Result<(), RegistryError> {
        if status.is_success() {
            return Ok(());
        }
        let mut message = error_message(body);
        if matches!(status.as_u16(), 401 | 403) {
            message.push_str(" (check the registry user and password)");
        }
        Err(RegistryError::Refused {
            url: self.base.clone(),
            what: what.to_owned(),
            status: status.as_u16(),
            message,
        })
    }

    fn json(&self, body: &Bytes, what: &str) -> Result<Value, RegistryError> {
        serde_json::from_slice(body)
            .map_err(|e| self.bad_answer(what, &format!("not JSON ({e}): {}", snippet(body))))
    }

    fn bad_answer(&self, what: &str, reason: &str) -> RegistryError {
        RegistryError::BadAnswer {
            url: self.base.clone(),
            what: what.to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// The schema in a `/schemas/ids/{id}` or subject-version answer.
    fn schema_of(
        &self,
        id: u32,
        json: &Value,
        what: &str,
    ) -> Result<RegisteredSchema, RegistryError> {
        let schema = json
            .get("schema")
            .and_then(Value::as_str)
            .ok_or_else(|| self.bad_answer(what, "no `schema` text"))?
            .to_owned();
        let schema_type = match json.get("schemaType") {
            None | Some(Value::Null) => SchemaType::Avro,
            Some(Value::String(t)) => SchemaType::parse(t).ok_or_else(|| {
                self.bad_answer(
                    what,
                    &format!("schemaType `{t}` is not AVRO, PROTOBUF or JSON"),
                )
            })?,
            Some(other) => {
                return Err(self.bad_answer(what, &format!("schemaType {other} is not a string")));
            }
        };
        let references = match json.get("references") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(refs)) => refs
                .iter()
                .map(|r| {
                    Some(SchemaReference {
                        name: r.get("name")?.as_str()?.to_owned(),
                        subject: r.get("subject")?.as_str()?.to_owned(),
                        version: r.get("version")?.as_i64()?,
                    })
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    self.bad_answer(what, "a reference lacks name, subject or version")
                })?,
            Some(_) => return Err(self.bad_answer(what, "`references` is not a list")),
        };
        Ok(RegisteredSchema {
            id,
            schema_type,
            schema,
            references,
        })
    }
}

/// Most schemas one Protobuf schema may pull in through references
/// (transitively); a longer chain is refused, naming the id.
pub const MAX_REFERENCES: usize = 64;

#[cfg(feature = "protobuf")]
impl RegistryClient {
    /// The texts of the schemas `schema` references (by reference name:
    /// the import path of a `.proto` file, the full name of an Avro named
    /// type), fetched with `GET /subjects/{s}/versions/{v}`, transitively,
    /// each name once, at most [`MAX_REFERENCES`].
    fn referenced(
        &self,
        schema: &RegisteredSchema,
    ) -> Result<Vec<(String, String)>, RegistryError> {
        let what = format!("schema id {}", schema.id);
        let mut out: Vec<(String, String)> = Vec::new();
        let mut todo: Vec<SchemaReference> = schema.references.clone();
        while let Some(r) = todo.pop() {
            if out.iter().any(|(n, _)| *n == r.name) {
                continue;
            }
            if out.len() >= MAX_REFERENCES {
                return Err(self.bad_answer(
                    &what,
                    &format!("more than {MAX_REFERENCES} referenced schemas"),
                ));
            }
            let v = self
                .version(&r.subject, &r.version.to_string())?
                .ok_or_else(|| RegistryError::Refused {
                    url: self.base.clone(),
                    what: what.clone(),
                    status: 404,
                    message: format!(
                        "its reference `{}` names subject `{}` version {}, which the registry \
                         does not have",
                        r.name, r.subject, r.version
                    ),
                })?;
            todo.extend(v.schema.references.iter().cloned());
            out.push((r.name.clone(), v.schema.schema));
        }
        Ok(out)
    }
}

#[cfg(feature = "protobuf")]
/// Protobuf writer schemas by id (`crate::protobuf`): the registry's
/// `.proto` text compiled with the files its references name. A schema
/// that is not `PROTOBUF` is refused naming its type; every failure names
/// the schema id and the registry (`SchemaError::Fetch`), a registry that
/// is down included (the encoder does not cache that, so the id is asked
/// again on the next record).
impl crate::protobuf::ProtoSchemaSource for RegistryClient {
    fn descriptor(
        &self,
        id: u32,
    ) -> Result<prost_reflect::FileDescriptor, crate::protobuf::SchemaError> {
        let fetch = |reason: String| crate::protobuf::SchemaError::Fetch { id, reason };
        let schema = self.get(id).map_err(|e| fetch(e.to_string()))?;
        if schema.schema_type != SchemaType::Protobuf {
            return Err(fetch(format!(
                "the schema registry {} has it as {}, not PROTOBUF",
                self.base, schema.schema_type
            )));
        }
        let imports = self.referenced(&schema).map_err(|e| fetch(e.to_string()))?;
        crate::protobuf::source::compile_proto(
            &format!("schema-{id}.proto"),
            &schema.schema,
            &imports,
        )
    }
}

#[cfg(feature = "avro")]
/// Avro writer schemas by id (`crate::avro`): the registry's schema JSON
/// parsed by apache-avro. A schema with references (named types defined
/// in other subjects) is refused naming them: the plan compiler resolves
/// names within one schema. 404 is `Unknown`, a registry that
/// cannot be asked (after the retries, or refusing) `Unavailable`, a schema
/// that is not `AVRO` or does not parse `Invalid`; each names the schema id
/// and the registry. `crate::avro` keeps a plan per id, so a schema is
/// parsed once per id; a source error is not kept (the registry may come
/// back) but a 404 is remembered here for [`NOT_FOUND_TTL`].
impl crate::avro::SchemaSource for RegistryClient {
    fn schema(&self, id: u32) -> Result<Arc<apache_avro::Schema>, crate::avro::SchemaError> {
        use crate::avro::{SchemaError, SchemaErrorKind};
        let fail = |kind, e: &RegistryError| SchemaError {
            id,
            kind,
            reason: e.to_string(),
        };
        let schema = self.get(id).map_err(|e| match e {
            RegistryError::UnknownId { .. } => fail(SchemaErrorKind::Unknown, &e),
            RegistryError::BadAnswer { .. } => fail(SchemaErrorKind::Invalid, &e),
            _ => fail(SchemaErrorKind::Unavailable, &e),
        })?;
        let invalid = |reason: String| SchemaError {
            id,
            kind: SchemaErrorKind::Invalid,
            reason: format!("from the schema registry {}: {reason}", self.base),
        };
        if schema.schema_type != SchemaType::Avro {
            return Err(invalid(format!(
                "the registry has it as {}, not AVRO",
                schema.schema_type
            )));
        }
        if !schema.references.is_empty() {
            // apache-avro can parse them (`parse_str_with_list`), but the
            // plan compiler resolves names within the writer schema only:
            // refused here, naming them, rather than planned wrongly.
            let names: Vec<&str> = schema.references.iter().map(|r| r.name.as_str()).collect();
            return Err(invalid(format!(
                "it references other schemas ({}); Avro schema references are not supported \
                 yet: register the schema with its named types inlined",
                names.join(", ")
            )));
        }
        let parsed = apache_avro::Schema::parse_str(&schema.schema);
        parsed.map(Arc::new).map_err(|e| invalid(e.to_string()))
    }
}

/// 5xx, 408 and 429: the registry may answer later.
fn transient_status(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

/// The `message` (and `error_code`) of a Confluent error body, else the
/// start of the body.
fn error_message(body: &Bytes) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => match (
            v.get("error_code"),
            v.get("message").and_then(Value::as_str),
        ) {
            (Some(code), Some(msg)) => format!("{msg} (error_code {code})"),
            (None, Some(msg)) => msg.to_owned(),
            _ => snippet(body),
        },
        Err(_) => snippet(body),
    }
}

fn snippet(body: &Bytes) -> String {
    let text = String::from_utf8_lossy(body);
    let t = text.trim();
    if t.is_empty() {
        return "(empty body)".into();
    }
    match t.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_refused_naming_the_url() {
        for url in ["localhost:8081", "ftp://x", "http://", "http://h/?a=1"] {
            let e = RegistryClient::new(RegistryConfig::new(url)).unwrap_err();
            assert!(matches!(e, RegistryError::BadUrl { .. }), "{url}: {e}");
            assert!(e.to_string().contains(url), "{e}");
        }
        let c = RegistryClient::new(RegistryConfig::new("http://h:1/apis/ccompat/v7/")).unwrap();
        assert_eq!(c.url(), "http://h:1/apis/ccompat/v7");
    }

    #[test]
    fn errors_name_the_schema_id() {
        let e = RegistryError::Unavailable {
            url: "http://r".into(),
            what: "schema id 42".into(),
            attempts: 3,
            last: "connection refused".into(),
        };
        assert_eq!(e.schema_id(), Some(42));
        assert!(e.is_transient());
        let r = e.record_error();
        assert_eq!(r.kind, spate_core::pipeline::chain::RecordErrorKind::Decode);
        assert!(r.reason.contains("schema id 42"), "{r}");
        assert!(r.reason.contains("http://r"), "{r}");
    }

    #[test]
    fn confluent_error_bodies_are_read() {
        let b = Bytes::from_static(br#"{"error_code":40403,"message":"Schema 9 not found"}"#);
        assert_eq!(error_message(&b), "Schema 9 not found (error_code 40403)");
        assert_eq!(error_message(&Bytes::from_static(b"oops")), "oops");
        assert_eq!(error_message(&Bytes::new()), "(empty body)");
    }

    /// Nothing listens on port 1: every attempt is refused, the error says
    /// how many were made and names the id; the backoff is bounded.
    #[test]
    fn an_unreachable_registry_is_retried_then_unavailable() {
        let mut config = RegistryConfig::new("http://127.0.0.1:1");
        config.retry = RegistryRetry {
            attempts: 3,
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
        };
        let c = RegistryClient::new(config).unwrap();
        let e = c.get(7).unwrap_err();
        match &e {
            RegistryError::Unavailable { attempts, .. } => assert_eq!(*attempts, 3),
            other => panic!("{other}"),
        }
        assert_eq!(e.schema_id(), Some(7));
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    }

    /// `get` from inside an async context does not panic (it runs the
    /// request on a helper thread).
    #[test]
    fn get_inside_a_runtime_works() {
        let mut config = RegistryConfig::new("http://127.0.0.1:1");
        config.retry.attempts = 1;
        let c = RegistryClient::new(config).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt.block_on(async { c.get(3) }).unwrap_err();
        assert!(e.is_transient(), "{e}");
        drop(rt);
    }
}
