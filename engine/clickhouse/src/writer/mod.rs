//! The HTTP insert writer: `spate_core::sink::Writer` over ClickHouse's HTTP
//! interface (hyper 1 client, HTTP/1.1, plain TCP).
//!
//! A write is one `POST {replica}/?query=INSERT INTO db.table (cols) FORMAT
//! Native` (or `RowBinary`, [`InsertFormat`]). The sealed batch holds
//! RowBinary rows; for Native the writer transcodes them into Native blocks
//! that name each column's server type ([`crate::native`]), so a table
//! whose column type changed refuses the insert. For RowBinary the body is
//! the batch's segments, streamed as they are with an exact
//! `Content-Length` (no copy). Either way every attempt sends the same
//! bytes (D4: the transcode is a pure function of the batch). A body is
//! compressed into one buffer when [`HttpWriterConfig::compression`]
//! asks for `gzip` or `deflate` ([`compress`]). The batch token goes along as `insert_deduplication_token` only
//! where the server knows that setting: each endpoint is asked once
//! (`system.settings`), and an endpoint that does not know it (18.16) is
//! logged at warn level, since retries there rely on the server's block-hash
//! deduplication of identical bytes (Replicated*MergeTree only). The token is
//! also sent as the insert's `query_id` on every server: while an earlier
//! attempt of the batch still runs there (a stalled server that timed the
//! client out, then resumed), the server refuses the next one with code 216,
//! which the retry loop waits out instead of storing the batch again. A
//! retry on *another* replica of the shard cannot be stopped that way (a
//! different server does not know the running id).
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
//! Schema changes ([`watch`]): the writer re-reads the table's columns
//! every [`HttpWriterConfig::schema_refresh`] before an insert and at once
//! after an insert error in [`SCHEMA_CHANGE_CODES`]; a planned column whose
//! type changed or that is gone fails the batch fatally with an error
//! naming the table and both types, so nothing is written under the old
//! plan once the change is known.
//!
//! `https://` URLs go over rustls ([`tls`]); `http://` URLs over plain TCP,
//! through the same client.

mod body;
mod classify;
pub mod compress;
pub mod tls;
pub mod watch;

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
pub use classify::{RETRYABLE_CODES, SCHEMA_CHANGE_CODES, classify, exception_code};
pub use compress::Compression;
pub use tls::{TlsError, TlsOptions};

use crate::dedup::{Dedup, InsertRate};
use crate::native::BlockPlan;
use crate::schema::{TableSchema, columns_query};
use watch::{SchemaVerdict, SchemaWatch, compare, stale_message};

/// The insert body's format (`sink.clickhouse.format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InsertFormat {
    /// `FORMAT Native`: columnar blocks that name each column's type, so a
    /// block whose types are not the table's is refused (the default).
    /// <https://clickhouse.com/docs/interfaces/formats/Native>
    #[default]
    Native,
    /// `FORMAT RowBinary`: rows without types; a column type changed under
    /// a running plan is caught only by the schema re-read
    /// ([`HttpWriterConfig::schema_refresh`]).
    /// <https://clickhouse.com/docs/interfaces/formats/RowBinary>
    RowBinary,
}

impl InsertFormat {
    /// The format's name in `INSERT ... FORMAT name`.
    pub fn name(self) -> &'static str {
        match self {
            InsertFormat::Native => "Native",
            InsertFormat::RowBinary => "RowBinary",
        }
    }
}

/// How often the writer re-reads the table's columns by default.
pub const DEFAULT_SCHEMA_REFRESH: Duration = Duration::from_secs(60);

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
    /// The insert body's format (default Native). A plan whose rows carry
    /// per-row DEFAULT markers ([`Self::row_format`]
    /// `RowBinaryWithDefaults`) is sent in that format instead: Native has
    /// no per-row defaults.
    pub format: InsertFormat,
    /// Re-read the table's columns before an insert when the last read of
    /// that replica is older than this (`Some(ZERO)`: before every insert;
    /// `None`: only after an insert error that means the schema changed).
    /// Default [`DEFAULT_SCHEMA_REFRESH`].
    pub schema_refresh: Option<Duration>,
    /// The rows' format, as the plan decided it
    /// ([`crate::schema::row_format`]; default RowBinary).
    pub row_format: crate::schema::RowFormat,
    /// `delivery: effectively_once` (docs/DESIGN.md D9): the probe and the
    /// first insert into each replica refuse a table that cannot
    /// deduplicate inserts ([`crate::dedup::Dedup::Cannot`], with the fix
    /// in the error), and `async_insert` or `insert_deduplicate = 0` in
    /// [`insert_settings`](Self::insert_settings); every insert carries
    /// `insert_deduplicate=1` (and `async_insert=0` where the server knows
    /// it), so a user profile cannot turn deduplication off; the writer
    /// warns while a shard's insert rate outruns its window
    /// ([`dedup_horizon`](Self::dedup_horizon)). Default false.
    pub effectively_once: bool,
    /// How long of a shard's inserts its dedup window should hold before the
    /// writer warns that the insert rate outruns it (effectively_once only;
    /// default [`crate::dedup::DEFAULT_DEDUP_HORIZON`]).
    pub dedup_horizon: Duration,
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
            format: InsertFormat::Native,
            schema_refresh: Some(DEFAULT_SCHEMA_REFRESH),
            row_format: crate::schema::RowFormat::RowBinary,
            effectively_once: false,
            dedup_horizon: crate::dedup::DEFAULT_DEDUP_HORIZON,
        }
    }
}

/// What one endpoint supports, learned once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerCaps {
    /// Whether the server knows `insert_deduplication_token`.
    pub dedup_token: bool,
    /// Whether the server knows `input_format_native_allow_types_conversion`
    /// (current releases): spate sends it as 0 with Native inserts, so a
    /// block whose column types are not the table's is refused rather than
    /// converted. A server without it (18.16) does not compare a Native
    /// block's types with the table's before it writes the part: a UInt32
    /// block into a UInt64 column fails there (code 368), but one into a
    /// `Nullable(UInt32)` column crashed the 18.16 server (measured,
    /// SIGSEGV in `ColumnNullable::checkConsistency`). Against such a server
    /// the writer re-reads the table's columns before every insert.
    pub native_type_check: bool,
    /// Whether the server knows `async_insert` (current releases; 18.16
    /// does not): in effectively_once spate sends it as 0.
    pub async_insert: bool,
}

/// The setting that makes a current server refuse, not convert, a Native
/// block whose column types differ from the table's
/// (<https://clickhouse.com/docs/operations/settings/formats#input_format_native_allow_types_conversion>).
const NATIVE_TYPES_CONVERSION: &str = "input_format_native_allow_types_conversion";

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
    /// The Native block plan; `None` when the rows go as they were encoded
    /// (RowBinary or RowBinaryWithDefaults, see [`native_plan`]).
    native: Option<Arc<BlockPlan>>,
    /// When each replica's columns were last read (schema refresh).
    schema_read: Mutex<HashMap<Arc<str>, tokio::time::Instant>>,
    watch: SchemaWatch,
    /// Each replica's dedup window, asked once ([`HttpWriter::dedup`]).
    dedup: Mutex<HashMap<Arc<str>, Arc<Dedup>>>,
    /// Each shard's insert rate (per batch, not per record).
    rates: Mutex<HashMap<usize, InsertRate>>,
}

/// A failed request: the classified error and the ClickHouse code, if any.
#[derive(Debug)]
struct Failure {
    error: WriteError,
    code: Option<u32>,
}

impl From<WriteError> for Failure {
    fn from(error: WriteError) -> Self {
        Failure { error, code: None }
    }
}

/// The Native block plan for `config`, or `None` with `config.format` set
/// to RowBinary where Native cannot carry the rows: a plan with per-row
/// server DEFAULTs (the rows go as RowBinaryWithDefaults), or a column
/// without a Native encoder here (JSON). Either way the table's columns are
/// then re-read before every insert, which guards the rows instead of the
/// server's type check; the reason is logged once at start.
fn native_plan(config: &mut HttpWriterConfig) -> Option<Arc<BlockPlan>> {
    if config.format != InsertFormat::Native {
        return None;
    }
    let table = format!("{}.{}", config.database, config.table);
    if config.row_format == crate::schema::RowFormat::RowBinaryWithDefaults {
        tracing::info!(
            %table,
            "a column takes the server's per-row DEFAULT: inserting as \
             RowBinaryWithDefaults (Native cannot carry per-row defaults), with the \
             table's columns re-read before every insert"
        );
        config.format = InsertFormat::RowBinary;
        return None;
    }
    match BlockPlan::new(&config.columns) {
        Ok(plan) => Some(Arc::new(plan)),
        Err(e) => {
            tracing::warn!(
                %table,
                "{e}: inserting as {} instead, with the table's columns re-read before \
                 every insert",
                config.row_format.name()
            );
            config.format = InsertFormat::RowBinary;
            None
        }
    }
}

impl HttpWriter {
    /// A writer for `config`. Needs a tokio runtime when used, not when built.
    pub fn new(mut config: HttpWriterConfig) -> Self {
        let native = native_plan(&mut config);
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
            "INSERT INTO {}.{} ({}) FORMAT {}",
            crate::schema::quote_ident(&config.database),
            crate::schema::quote_ident(&config.table),
            cols.join(", "),
            match config.format {
                InsertFormat::Native => InsertFormat::Native.name(),
                InsertFormat::RowBinary => config.row_format.name(),
            }
        );
        Self {
            client,
            insert_query: percent_encode(&insert),
            config,
            caps: Mutex::new(HashMap::new()),
            native,
            schema_read: Mutex::new(HashMap::new()),
            watch: SchemaWatch::default(),
            dedup: Mutex::new(HashMap::new()),
            rates: Mutex::new(HashMap::new()),
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

    /// Sends one request; `Ok(body)` for a success, else the classified
    /// error with the ClickHouse code.
    async fn send(&self, where_: &str, req: Request<SegmentsBody>) -> Result<Bytes, Failure> {
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
        let code = header_code.or_else(|| exception_code(&text));
        Err(Failure {
            error: classify(status.as_u16(), code, &format!("{where_}: {}", text.trim())),
            code,
        })
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
            })?
            .map_err(|f| f.error)?;
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
                &format!(
                    "SELECT name FROM system.settings WHERE name IN \
                     ('insert_deduplication_token', '{NATIVE_TYPES_CONVERSION}', 'async_insert')"
                ),
            )
            .await?;
        let known: Vec<&str> = answer.lines().map(str::trim).collect();
        let caps = ServerCaps {
            dedup_token: known.contains(&"insert_deduplication_token"),
            native_type_check: known.contains(&NATIVE_TYPES_CONVERSION),
            async_insert: known.contains(&"async_insert"),
        };
        if self.config.format == InsertFormat::Native
            && !caps.native_type_check
            && !self.config.columns.is_empty()
        {
            tracing::warn!(
                endpoint = %endpoint,
                "ClickHouse at {} does not check a Native block's column types against the \
                 table's (it lacks {NATIVE_TYPES_CONVERSION}): spate re-reads the table's \
                 columns before every insert there, so a column type changed while spate runs \
                 stops the batch instead of reaching the server",
                endpoint.url
            );
        }
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
    /// [`SchemaProbeError`]: the query failed, or the answer names no table
    /// (then `system.databases` tells a missing database,
    /// [`SchemaError::NoSuchDatabase`](crate::schema::SchemaError::NoSuchDatabase),
    /// from a missing table).
    pub async fn table_schema(&self, url: &str) -> Result<TableSchema, SchemaProbeError> {
        let answer = self
            .query(
                url,
                &columns_query(&self.config.database, &self.config.table),
            )
            .await?;
        match TableSchema::from_json_each_row(&self.config.database, &self.config.table, &answer) {
            Err(crate::schema::SchemaError::NoSuchTable { database, table }) => {
                // No columns: the table is missing, or its whole database.
                let known = self
                    .query(
                        url,
                        &format!(
                            "SELECT count() FROM system.databases WHERE name = {}",
                            crate::schema::quote_literal(&database)
                        ),
                    )
                    .await?;
                Err(if known.trim() == "0" {
                    crate::schema::SchemaError::NoSuchDatabase { database }
                } else {
                    crate::schema::SchemaError::NoSuchTable { database, table }
                }
                .into())
            }
            other => Ok(other?),
        }
    }

    /// Whether the server at `url` accepts `RowBinaryWithDefaults` input
    /// ([`crate::schema::formats_query`]; 18.16 does not).
    ///
    /// # Errors
    /// [`SchemaProbeError`] when the query fails or its answer is not a count.
    pub async fn accepts_row_binary_with_defaults(
        &self,
        url: &str,
    ) -> Result<bool, SchemaProbeError> {
        let answer = self.query(url, crate::schema::formats_query()).await?;
        match answer.trim() {
            "0" => Ok(false),
            "1" => Ok(true),
            other => Err(crate::schema::SchemaError::BadAnswer(format!(
                "system.formats count: `{other}`"
            ))
            .into()),
        }
    }

    /// Inserts `segments` (whole RowBinary rows for the configured columns,
    /// in order) into `endpoint`, with `token` as
    /// `insert_deduplication_token` where the endpoint knows it. What
    /// [`Writer::write`] does with a sealed batch.
    ///
    /// Before sending, re-reads the table's columns when the last read of
    /// this replica is older than [`HttpWriterConfig::schema_refresh`]; for
    /// Native, transcodes the rows into Native blocks. After a failure whose
    /// code is in [`SCHEMA_CHANGE_CODES`], re-reads the columns at once.
    ///
    /// # Errors
    /// [`WriteError`], classified (see the module docs); fatal, naming the
    /// table and the old and new types, when the table changed under the
    /// plan.
    pub async fn insert(
        &self,
        endpoint: &Endpoint,
        segments: Vec<Bytes>,
        token: &str,
    ) -> Result<(), WriteError> {
        debug_assert!(!segments.is_empty(), "an insert has rows");
        let caps = self.caps(endpoint).await?;
        if self.schema_read_due(endpoint, caps) {
            self.check_schema(endpoint).await?;
        }
        // The token is also the query id: a server still running an earlier
        // attempt of this batch refuses this one (code 216) instead of
        // storing it a second time. Another replica cannot know it.
        let mut extra: Vec<(&str, &str)> = self
            .config
            .insert_settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        extra.push(("query_id", token));
        if self.config.effectively_once {
            self.check_delivery(endpoint).await?;
            // A user profile may turn these off; this insert's own settings win.
            extra.push(("insert_deduplicate", "1"));
            if caps.async_insert {
                extra.push(("async_insert", "0"));
            }
        }
        if caps.dedup_token {
            extra.push(("insert_deduplication_token", token));
        }
        if self.native.is_some() && caps.native_type_check {
            extra.push((NATIVE_TYPES_CONVERSION, "0"));
        }
        let uri = self.uri(&endpoint.url, &self.insert_query, &extra)?;
        let compression = self.config.compression;
        let segments = match (&self.native, compression) {
            (None, Compression::None) => segments,
            (Some(plan), _) => {
                // CPU-bound (milliseconds per MiB): off the I/O threads, so
                // other shards' inserts and probes keep moving.
                let plan = Arc::clone(plan);
                tokio::task::spawn_blocking(move || {
                    let mut body = Vec::with_capacity(segments.iter().map(|s| s.len()).sum());
                    plan.transcode(segments.iter().map(|s| &s[..]), &mut body)
                        .map(|_| compression.apply(vec![Bytes::from(body)]))
                })
                .await
                .map_err(|e| WriteError::fatal(format!("{endpoint}: transcoding: {e}")))?
                .map_err(|e| WriteError::fatal(format!("{endpoint}: {e}")))?
            }
            (None, c) => tokio::task::spawn_blocking(move || c.apply(segments))
                .await
                .map_err(|e| WriteError::fatal(format!("{endpoint}: compressing: {e}")))?,
        };
        let req = self.request(
            uri,
            SegmentsBody::new(segments),
            compression.content_encoding(),
        )?;
        match self.send(&endpoint.to_string(), req).await {
            Ok(_) => {
                self.count_insert(endpoint);
                Ok(())
            }
            Err(f) if f.code.is_some_and(|c| SCHEMA_CHANGE_CODES.contains(&c)) => {
                // The server could not take our bytes as its columns: did
                // the table change? A stale plan's error names the types.
                match self.check_schema(endpoint).await {
                    Err(stale) if stale.is_fatal() => Err(WriteError::fatal(format!(
                        "{}; the server said: {}",
                        stale.message, f.error.message
                    ))),
                    _ => Err(f.error),
                }
            }
            Err(f) => Err(f.error),
        }
    }

    /// What the table's deduplication covers at `endpoint`
    /// ([`crate::dedup::assess`] over `system.tables` and
    /// `system.merge_tree_settings`), asked once per replica URL and cached;
    /// logged at INFO the first time.
    ///
    /// # Errors
    /// [`WriteError`] when the server cannot be asked; fatal when the table
    /// is not in `system.tables` or the answer is not JSONEachRow.
    pub async fn dedup(&self, endpoint: &Endpoint) -> Result<Arc<Dedup>, WriteError> {
        if let Some(d) = self
            .dedup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&endpoint.url)
        {
            return Ok(Arc::clone(d));
        }
        let caps = self.caps(endpoint).await?;
        let table = format!("{}.{}", self.config.database, self.config.table);
        let answer = self
            .query(
                &endpoint.url,
                &format!(
                    "SELECT engine, engine_full FROM system.tables WHERE database = {} AND name = {} \
                     FORMAT JSONEachRow",
                    crate::schema::quote_literal(&self.config.database),
                    crate::schema::quote_literal(&self.config.table)
                ),
            )
            .await?;
        let bad =
            |what: &str| WriteError::fatal(format!("{endpoint}: dedup probe of {table}: {what}"));
        let row: serde_json::Value = match answer.lines().find(|l| !l.trim().is_empty()) {
            Some(l) => serde_json::from_str(l)
                .map_err(|e| bad(&format!("system.tables answered {l:?}: {e}")))?,
            None => return Err(bad("the table is not in system.tables")),
        };
        let field = |k: &str| {
            row.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let (engine, engine_full) = (field("engine"), field("engine_full"));
        let answer = self
            .query(&endpoint.url, &crate::dedup::merge_tree_settings_query())
            .await?;
        let mut defaults = Vec::new();
        for l in answer.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(l)
                .map_err(|e| bad(&format!("system.merge_tree_settings answered {l:?}: {e}")))?;
            let s = |k: &str| {
                v.get(k)
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
                    .to_owned()
            };
            defaults.push((s("name"), s("value")));
        }
        let d = Arc::new(crate::dedup::assess(
            &table,
            &engine,
            &engine_full,
            &defaults,
            caps.dedup_token,
        ));
        tracing::info!(endpoint = %endpoint, "dedup window of {table}: {d}");
        self.dedup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(endpoint.url.clone(), Arc::clone(&d));
        Ok(d)
    }

    /// effectively_once's refusals ([`HttpWriterConfig::effectively_once`]):
    /// `async_insert` on or `insert_deduplicate` off in
    /// [`HttpWriterConfig::insert_settings`], and a table at `endpoint`
    /// that cannot deduplicate inserts.
    ///
    /// # Errors
    /// A fatal [`WriteError`] naming the setting, or the table with the
    /// reason and the fix; the dedup probe's own error when it fails.
    pub async fn check_delivery(&self, endpoint: &Endpoint) -> Result<(), WriteError> {
        for (k, v) in &self.config.insert_settings {
            let on = !matches!(v.trim(), "0" | "false" | "False" | "FALSE");
            if k == "async_insert" && on {
                return Err(WriteError::fatal(format!(
                    "sink.clickhouse.settings.async_insert = {v}: delivery: effectively_once refuses \
                     asynchronous inserts (the server buffers them and forms its own blocks, so a \
                     replayed batch is not recognised as the original); remove the setting"
                )));
            }
            if k == "insert_deduplicate" && !on {
                return Err(WriteError::fatal(format!(
                    "sink.clickhouse.settings.insert_deduplicate = {v}: delivery: effectively_once \
                     needs the server's insert deduplication; remove the setting"
                )));
            }
        }
        match &*self.dedup(endpoint).await? {
            Dedup::Window(_) => Ok(()),
            Dedup::Cannot { reason, fix } => Err(WriteError::fatal(format!(
                "{endpoint}: delivery: effectively_once needs a table that deduplicates inserts, \
                 and {reason}. Fix: {fix} (or set delivery: at_least_once)"
            ))),
        }
    }

    /// Counts a successful insert into `endpoint`'s shard; in
    /// effectively_once, warns (at most every
    /// [`crate::dedup::WARN_EVERY`] per shard) while the shard's rate
    /// outruns the window of `endpoint`'s table.
    fn count_insert(&self, endpoint: &Endpoint) {
        let window = self
            .dedup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&endpoint.url)
            .cloned();
        let Some(window) = window else {
            return;
        };
        let Dedup::Window(w) = &*window else {
            return;
        };
        let now = tokio::time::Instant::now();
        let reading = self
            .rates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(endpoint.shard)
            .or_insert_with(|| InsertRate::new(now))
            .record(now, w, self.config.dedup_horizon);
        let Some(r) = reading else {
            return;
        };
        tracing::debug!(shard = endpoint.shard, per_sec = r.per_sec, "insert rate");
        if r.warn && self.config.effectively_once {
            tracing::warn!(
                shard = endpoint.shard,
                "{}.{} on shard {}: {:.1} inserts/s; its dedup window ({} = {}) holds only {:.1} s \
                 of them (under the {:?} replay horizon): a batch replayed later than that may be \
                 stored twice. Raise {} on the table, or seal fewer, larger batches \
                 (sink.clickhouse.batch.linger)",
                self.config.database,
                self.config.table,
                endpoint.shard,
                r.per_sec,
                w.setting,
                w.inserts,
                r.covers_secs,
                self.config.dedup_horizon,
                w.setting,
            );
        }
    }

    /// Each shard's insert rate over the last full
    /// [`crate::dedup::RATE_INTERVAL`] (inserts per second), for shards
    /// with a known dedup window.
    pub fn insert_rates(&self) -> Vec<(usize, f64)> {
        let mut out: Vec<(usize, f64)> = self
            .rates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(s, r)| r.per_sec().map(|x| (*s, x)))
            .collect();
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// Whether `endpoint`'s columns are due for a re-read before an insert:
    /// always where the server does not check the body's types itself
    /// (RowBinary, or Native without [`ServerCaps::native_type_check`]),
    /// else when the last read is older than the refresh; never when the
    /// refresh is `None`.
    fn schema_read_due(&self, endpoint: &Endpoint, caps: ServerCaps) -> bool {
        let Some(refresh) = self.config.schema_refresh else {
            return false;
        };
        if self.config.columns.is_empty() {
            return false;
        }
        if self.native.is_none() || !caps.native_type_check {
            return true;
        }
        let read = self.schema_read.lock().unwrap_or_else(|p| p.into_inner());
        read.get(&endpoint.url)
            .is_none_or(|t| t.elapsed() >= refresh)
    }

    /// Re-reads `endpoint`'s columns and compares them with the plan
    /// ([`watch`]); logs a change at INFO.
    ///
    /// # Errors
    /// Fatal when the plan is stale (a planned column gone or of another
    /// type) or the table is gone; the probe query's error when it fails.
    pub async fn check_schema(&self, endpoint: &Endpoint) -> Result<(), WriteError> {
        let schema = match self.table_schema(&endpoint.url).await {
            Ok(s) => s,
            Err(SchemaProbeError::Query(e)) => return Err(e),
            Err(SchemaProbeError::Schema(e)) => {
                return Err(WriteError::fatal(format!("{endpoint}: {e}")));
            }
        };
        self.schema_read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(endpoint.url.clone(), tokio::time::Instant::now());
        self.watch.observe(&self.config.columns, &schema);
        match compare(&self.config.columns, &schema) {
            SchemaVerdict::Stale(stale) => Err(WriteError::fatal(format!(
                "{endpoint}: {}",
                stale_message(&schema, &stale)
            ))),
            SchemaVerdict::Unchanged | SchemaVerdict::Added(_) => Ok(()),
        }
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
        // What the window covers, logged once per replica; refused here in
        // effectively_once when there is none.
        if self.config.effectively_once {
            self.check_delivery(endpoint).await?;
        } else if let Err(e) = self.dedup(endpoint).await {
            tracing::warn!(endpoint = %endpoint, "cannot read the table's dedup window: {e}");
        }
        // Fatal when a planned column is missing or of another type.
        self.check_schema(endpoint).await
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
            "http://h:1/?query=INSERT%20INTO%20%60db%60.%60t%60%20%28%60a%60%29%20FORMAT%20Native\
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
