//! The HTTP insert writer: `spate_core::sink::Writer` over ClickHouse's HTTP
//! interface (hyper 1 client, HTTP/1.1, plain TCP).
//!
//! A write is one `POST {replica}/?query=INSERT INTO db.table (cols) FORMAT
//! RowBinary` whose body is the sealed batch's segments, streamed as they are
//! with an exact `Content-Length` (no copy, D4: every attempt sends the same
//! bytes), or compressed into one buffer when [`HttpWriterConfig::compression`]
//! asks for `gzip` or `deflate` ([`compress`]). The batch token goes along as `insert_deduplication_token` only
//! where the server knows that setting: each endpoint is asked once
//! (`system.settings`), and an endpoint that does not know it (18.16) is
//! logged at warn level, since retries there rely on the server's block-hash
//! deduplication of identical bytes (Replicated*MergeTree only).
//!
//! Errors are classified for the retry loop ([`classify`]): connection
//! refused, reset or timed out, HTTP 5xx without a ClickHouse code, and the
//! transient ClickHouse codes in [`RETRYABLE_CODES`] are retryable; every
//! other ClickHouse code (syntax, type mismatch, unknown table or column,
//! authentication, ...) is fatal and carries the server's message. The code
//! is read from the `X-ClickHouse-Exception-Code` header when present (newer
//! servers) or from the `Code: N` at the start of the body (all servers).
//!
//! [`HttpWriter::probe`] checks `SELECT 1`, learns the endpoint's
//! capabilities and, when the writer knows the expected column types,
//! compares them with `system.columns`. [`HttpWriter::table_schema`] is the
//! schema probe the start-up uses to plan the INSERT.
//!
//! `https://` URLs go over rustls ([`tls`]); `http://` URLs over plain TCP,
//! through the same client.

mod body;
mod classify;
pub mod compress;
pub mod tls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spate_core::sink::{Endpoint, SealedBatch, WriteError, Writer};

pub use body::SegmentsBody;
pub use classify::{RETRYABLE_CODES, classify, exception_code};
pub use compress::Compression;
pub use tls::{TlsError, TlsOptions};

use crate::schema::{TableSchema, columns_query};

/// User and password for the HTTP interface (sent as HTTP Basic auth, which
/// every ClickHouse version accepts). `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The ClickHouse user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Reads the user from the environment variable `user_var` and the
    /// password from `password_var` (empty when unset); `None` when the user
    /// variable is unset.
    pub fn from_env(user_var: &str, password_var: &str) -> Option<Credentials> {
        let user = std::env::var(user_var).ok()?;
        Some(Credentials {
            user,
            password: std::env::var(password_var).unwrap_or_default(),
        })
    }

    fn basic_auth(&self) -> String {
        format!(
            "Basic {}",
            base64(format!("{}:{}", self.user, self.password).as_bytes())
        )
    }
}

/// Standard base64 with padding (RFC 4648 section 4), for Basic auth.
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Percent-encodes a query-string value (RFC 3986 unreserved bytes stay).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Settings of an [`HttpWriter`].
#[derive(Clone, Debug)]
pub struct HttpWriterConfig {
    /// Target database.
    pub database: String,
    /// Target table.
    pub table: String,
    /// The INSERT's columns in order, with the type text each is expected to
    /// have (what the encoder was built for). The probe compares them with
    /// `system.columns`.
    pub columns: Vec<(String, String)>,
    /// User and password, if the server needs them.
    pub credentials: Option<Credentials>,
    /// Bound on establishing a TCP connection.
    pub connect_timeout: Duration,
    /// Bound on one probe or query round trip. Inserts are bounded by the
    /// sink pool's `write_timeout` (it drops the future).
    pub query_timeout: Duration,
    /// Extra ClickHouse settings sent with every request as query-string
    /// parameters (`("max_insert_block_size", "1048576")`).
    pub settings: Vec<(String, String)>,
    /// ClickHouse settings sent with every INSERT only (after
    /// [`settings`](Self::settings), as query-string parameters):
    /// `sink.clickhouse.settings`. [`Writer::probe`] checks each name
    /// against the server's `system.settings` and fails naming the ones it
    /// does not know, so a typo stops the start, not the first insert.
    pub insert_settings: Vec<(String, String)>,
    /// How insert bodies are compressed (default none).
    pub compression: Compression,
    /// The rustls config for `https://` URLs (build it with
    /// [`tls::client_config`]); `None`: the system's root certificates.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl HttpWriterConfig {
    /// A config for `database.table` with the given INSERT columns (name,
    /// type text), no credentials, 5 s connect and 30 s query timeouts.
    pub fn new(
        database: impl Into<String>,
        table: impl Into<String>,
        columns: Vec<(String, String)>,
    ) -> Self {
        Self {
            database: database.into(),
            table: table.into(),
            columns,
            credentials: None,
            connect_timeout: Duration::from_secs(5),
            query_timeout: Duration::from_secs(30),
            settings: Vec::new(),
            insert_settings: Vec::new(),
            compression: Compression::None,
            tls: None,
        }
    }
}

/// What one endpoint supports, learned once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerCaps {
    /// Whether the server knows `insert_deduplication_token`.
    pub dedup_token: bool,
}

/// Response bodies kept for error messages and query answers: at most this
/// many bytes (a schema of thousands of columns fits).
const MAX_ANSWER_BYTES: usize = 16 << 20;
/// Idle pooled connections are dropped after this; ClickHouse closes idle
/// keep-alive connections after 3 s (its `keep_alive_timeout` default), and
/// reusing one it is closing fails the request.
const POOL_IDLE: Duration = Duration::from_secs(2);

/// The ClickHouse HTTP insert writer. Cheap to share (`&self` everywhere).
#[derive(Debug)]
pub struct HttpWriter {
    client: Client<HttpsConnector<HttpConnector>, SegmentsBody>,
    config: HttpWriterConfig,
    insert_query: String,
    caps: Mutex<HashMap<Arc<str>, ServerCaps>>,
}

impl HttpWriter {
    /// A writer for `config`. Needs a tokio runtime when used, not when built.
    pub fn new(config: HttpWriterConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        // The TLS layer below needs to see https:// URLs.
        connector.enforce_http(false);
        let tls = config.tls.clone().or_else(tls::system_default);
        let connector = match tls {
            Some(tls) => hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(Arc::unwrap_or_clone(tls))
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector),
            // No roots anywhere: https:// URLs fail at connect with rustls'
            // "no trust anchors" error, http:// ones work.
            None => hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(
                    rustls::ClientConfig::builder_with_provider(Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_safe_default_protocol_versions()
                    .expect("ring supports the default protocol versions")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
                )
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        let cols: Vec<String> = config
            .columns
            .iter()
            .map(|(n, _)| crate::schema::quote_ident(n))
            .collect();
        let insert = format!(
            "INSERT INTO {}.{} ({}) FORMAT RowBinary",
            crate::schema::quote_ident(&config.database),
            crate::schema::quote_ident(&config.table),
            cols.join(", ")
        );
        Self {
            client,
            insert_query: percent_encode(&insert),
            config,
            caps: Mutex::new(HashMap::new()),
        }
    }

    /// The config.
    pub fn config(&self) -> &HttpWriterConfig {
        &self.config
    }

    fn uri(&self, base: &str, query: &str, extra: &[(&str, &str)]) -> Result<Uri, WriteError> {
        let mut s = String::with_capacity(base.len() + query.len() + 64);
        s.push_str(base.trim_end_matches('/'));
        s.push_str("/?query=");
        s.push_str(query);
        for (k, v) in self
            .config
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(extra.iter().copied())
        {
            s.push('&');
            s.push_str(&percent_encode(k));
            s.push('=');
            s.push_str(&percent_encode(v));
        }
        s.parse()
            .map_err(|e| WriteError::fatal(format!("bad endpoint URL `{base}`: {e}")))
    }

    fn request(
        &self,
        uri: Uri,
        body: SegmentsBody,
        encoding: Option<&'static str>,
    ) -> Result<Request<SegmentsBody>, WriteError> {
        let mut b = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/octet-stream");
        if let Some(e) = encoding {
            b = b.header(header::CONTENT_ENCODING, e);
        }
        if let Some(c) = &self.config.credentials {
            b = b.header(header::AUTHORIZATION, c.basic_auth());
        }
        b.body(body)
            .map_err(|e| WriteError::fatal(format!("cannot build request: {e}")))
    }

    /// Sends one request; `Ok(body)` for a success, else the classified error.
    async fn send(&self, where_: &str, req: Request<SegmentsBody>) -> Result<Bytes, WriteError> {
        let resp = self.client.request(req).await.map_err(|e| {
            // A failed connect never reached the server; anything later
            // (reset, closed mid-request) may have inserted the batch.
            let message = format!("{where_}: {}", spate_core::error::chain(&e));
            if e.is_connect() {
                WriteError::retryable(message)
            } else {
                WriteError::ambiguous(message)
            }
        })?;
        let status = resp.status();
        let header_code = resp
            .headers()
            .get("X-ClickHouse-Exception-Code")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u32>().ok());
        let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| WriteError::ambiguous(format!("{where_}: reading the response: {e}")))?
            .to_bytes();
        if status.is_success() && header_code.is_none() {
            return Ok(body);
        }
        let text = String::from_utf8_lossy(&body);
        Err(classify(
            status.as_u16(),
            header_code.or_else(|| exception_code(&text)),
            &format!("{where_}: {}", text.trim()),
        ))
    }

    /// Runs one SQL statement on `url` and returns the answer's text.
    ///
    /// # Errors
    /// [`WriteError`] classified as for inserts; retryable when the query
    /// timeout ([`HttpWriterConfig::query_timeout`]) passes.
    pub async fn query(&self, url: &str, sql: &str) -> Result<String, WriteError> {
        let uri = self.uri(url, "", &[])?;
        let req = self.request(
            uri,
            SegmentsBody::new(vec![Bytes::from(sql.to_owned())]),
            None,
        )?;
        let fut = self.send(url, req);
        let body = tokio::time::timeout(self.config.query_timeout, fut)
            .await
            .map_err(|_| {
                WriteError::retryable(format!(
                    "{url}: query timed out after {:?}",
                    self.config.query_timeout
                ))
            })??;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// What `endpoint` supports, asked once per endpoint URL and cached. Logs
    /// a warning when the server lacks `insert_deduplication_token`.
    ///
    /// # Errors
    /// [`WriteError`] when the server cannot be asked.
    pub async fn caps(&self, endpoint: &Endpoint) -> Result<ServerCaps, WriteError> {
        if let Some(c) = self
            .caps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&endpoint.url)
        {
            return Ok(*c);
        }
        let answer = self
            .query(
                &endpoint.url,
                "SELECT name FROM system.settings WHERE name = 'insert_deduplication_token'",
            )
            .await?;
        let caps = ServerCaps {
            dedup_token: answer.trim() == "insert_deduplication_token",
        };
        if !caps.dedup_token {
            tracing::warn!(
                endpoint = %endpoint,
                "ClickHouse at {} does not know the setting insert_deduplication_token: \
                 inserts go without spate's batch token; a retried batch is dropped only by \
                 Replicated*MergeTree's deduplication of identical blocks, and a plain MergeTree \
                 may store it twice",
                endpoint.url
            );
        }
        self.caps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(endpoint.url.clone(), caps);
        Ok(caps)
    }

    /// Checks that `endpoint` knows every name in
    /// [`HttpWriterConfig::insert_settings`] (`system.settings`).
    ///
    /// # Errors
    /// A fatal [`WriteError`] naming every unknown setting; the query's
    /// own error when the server cannot be asked.
    pub async fn check_insert_settings(&self, endpoint: &Endpoint) -> Result<(), WriteError> {
        if self.config.insert_settings.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = self
            .config
            .insert_settings
            .iter()
            .map(|(k, _)| crate::schema::quote_literal(k))
            .collect();
        let answer = self
            .query(
                &endpoint.url,
                &format!(
                    "SELECT name FROM system.settings WHERE name IN ({})",
                    names.join(", ")
                ),
            )
            .await?;
        let known: Vec<&str> = answer.lines().map(str::trim).collect();
        let unknown: Vec<&str> = self
            .config
            .insert_settings
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !known.contains(k))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        Err(WriteError::fatal(format!(
            "{endpoint}: sink.clickhouse.settings: the server does not know {} \
             (not in its system.settings)",
            unknown
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// Reads `database.table`'s columns from `system.columns` on `url` (the
    /// schema probe).
    ///
    /// # Errors
    /// [`SchemaProbeError`]: the query failed, or the answer names no table.
    pub async fn table_schema(&self, url: &str) -> Result<TableSchema, SchemaProbeError> {
        let answer = self
            .query(
                url,
                &columns_query(&self.config.database, &self.config.table),
            )
            .await?;
        Ok(TableSchema::from_json_each_row(
            &self.config.database,
            &self.config.table,
            &answer,
        )?)
    }

    /// Inserts `segments` (whole RowBinary rows for the configured columns)
    /// into `endpoint`, with `token` as `insert_deduplication_token` where the
    /// endpoint knows it. What [`Writer::write`] does with a sealed batch.
    ///
    /// # Errors
    /// [`WriteError`], classified (see the module docs).
    pub async fn insert(
        &self,
        endpoint: &Endpoint,
        segments: Vec<Bytes>,
        token: &str,
    ) -> Result<(), WriteError> {
        debug_assert!(!segments.is_empty(), "an insert has rows");
        let caps = self.caps(endpoint).await?;
        let mut extra: Vec<(&str, &str)> = self
            .config
            .insert_settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if caps.dedup_token {
            extra.push(("insert_deduplication_token", token));
        }
        let uri = self.uri(&endpoint.url, &self.insert_query, &extra)?;
        let compression = self.config.compression;
        let segments = match compression {
            Compression::None => segments,
            // CPU-bound (milliseconds per MiB): off the I/O threads, so other
            // shards' inserts and probes keep moving.
            c => tokio::task::spawn_blocking(move || c.apply(segments))
                .await
                .map_err(|e| WriteError::fatal(format!("{endpoint}: compressing: {e}")))?,
        };
        let req = self.request(
            uri,
            SegmentsBody::new(segments),
            compression.content_encoding(),
        )?;
        self.send(&endpoint.to_string(), req).await.map(drop)
    }
}

/// A schema probe that failed.
#[derive(Debug, thiserror::Error)]
pub enum SchemaProbeError {
    /// The query failed.
    #[error(transparent)]
    Query(#[from] WriteError),
    /// The answer was unusable or named no table.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
}

impl Writer for HttpWriter {
    async fn write(&self, endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        self.insert(endpoint, batch.segments().to_vec(), batch.token())
            .await
    }

    async fn probe(&self, endpoint: &Endpoint) -> Result<(), WriteError> {
        let one = self.query(&endpoint.url, "SELECT 1").await?;
        if one.trim() != "1" {
            return Err(WriteError::fatal(format!(
                "{endpoint}: SELECT 1 answered {:?}; is this a ClickHouse HTTP port?",
                one.chars().take(64).collect::<String>()
            )));
        }
        self.caps(endpoint).await?;
        self.check_insert_settings(endpoint).await?;
        if self.config.columns.is_empty() {
            return Ok(());
        }
        let schema = match self.table_schema(&endpoint.url).await {
            Ok(s) => s,
            Err(SchemaProbeError::Query(e)) => return Err(e),
            Err(SchemaProbeError::Schema(e)) => {
                return Err(WriteError::fatal(format!("{endpoint}: {e}")));
            }
        };
        for (name, ty) in &self.config.columns {
            match schema.columns.iter().find(|c| &c.name == name) {
                None => {
                    return Err(WriteError::fatal(format!(
                        "{endpoint}: table {}.{} has no column `{name}`",
                        schema.database, schema.table
                    )));
                }
                Some(c) if &c.type_text != ty => {
                    return Err(WriteError::fatal(format!(
                        "{endpoint}: column `{name}` is {} on the server, the encoder was built for {ty}",
                        c.type_text
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }

    #[test]
    fn query_strings_are_percent_encoded() {
        assert_eq!(percent_encode("a b=`c`&d"), "a%20b%3D%60c%60%26d");
        let w = HttpWriter::new(HttpWriterConfig::new(
            "db",
            "t",
            vec![("a".into(), "UInt8".into())],
        ));
        let uri = w
            .uri(
                "http://h:1/",
                &w.insert_query,
                &[("insert_deduplication_token", "p-1-0-7")],
            )
            .unwrap();
        assert_eq!(
            uri.to_string(),
            "http://h:1/?query=INSERT%20INTO%20%60db%60.%60t%60%20%28%60a%60%29%20FORMAT%20RowBinary\
             &insert_deduplication_token=p-1-0-7"
        );
    }

    #[test]
    fn credentials_do_not_leak_in_debug() {
        let c = Credentials {
            user: "u".into(),
            password: "secret".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
        assert_eq!(c.basic_auth(), "Basic dTpzZWNyZXQ=");
    }
}
