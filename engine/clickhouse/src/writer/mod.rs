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
//! every [`HttpWriterConfig::schema_refresh`] before an insert (before
//! every insert where the server does not check the body's types) and at
//! once after an insert error in [`SCHEMA_CHANGE_CODES`]. With a live plan
//! ([`HttpWriterConfig::live`], ADR 0005) a change that every old value
//! carries over exactly ([`crate::native::carry`]) is re-planned: the new
//! plan is published to the pipeline threads, and a batch of an older
//! layout answers `replanned` so the shard worker re-seals it
//! ([`Writer::reseal`]). Any other change to a planned column (and every
//! change without a live plan) fails the batch fatally with an error naming
//! the table, the column and both types, so nothing is written under the
//! old plan once the change is known.
//!
//! `https://` URLs go over rustls ([`tls`]); `http://` URLs over plain TCP,
//! through the same client.

mod body;
mod classify;
pub mod compress;
pub mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use spate_core::sink::{Endpoint, Layout, SealedBatch, WriteError, Writer};

pub use body::SegmentsBody;
pub use classify::{RETRYABLE_CODES, SCHEMA_CHANGE_CODES, classify, exception_code};
pub use compress::Compression;
// The writer's config names these; they live in spate-http, shared with
// the schema registry client.
pub use spate_http::{Credentials, TlsError, TlsOptions, tls};
use spate_http::{https_connector, percent_encode};

use crate::dedup::{Dedup, InsertRate};
use crate::native::BlockPlan;
use crate::native::carry::Carry;
use spate_row::plan::{InsertPlan, LivePlan, typed_columns};
use spate_row::schema::{RowFormat, TableSchema, columns_query};
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
    /// ([`spate_row::schema::row_format`]; default RowBinary).
    pub row_format: spate_row::schema::RowFormat,
    /// The live INSERT plan shared with the pipeline threads' encoders
    /// (spate-formats' `json::live`): with it, a change of the table's columns that
    /// every old value carries over exactly is re-planned while running
    /// (ADR 0005); without it (`None`, the default) any change to a planned
    /// column fails the batch and a restart re-plans. Its plan at start
    /// must be the one [`Self::columns`] describes.
    pub live: Option<Arc<LivePlan>>,
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
            row_format: spate_row::schema::RowFormat::RowBinary,
            live: None,
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
    /// The format asked for (`config.format` may have fallen back for the
    /// start-up layout): what a new layout is planned with.
    requested: InsertFormat,
    caps: Mutex<HashMap<Arc<str>, ServerCaps>>,
    /// Every layout a batch may be in: the start-up plan (0), each plan
    /// re-planned live, each re-seal's ([`WriterLayout`]). One entry per
    /// schema change seen (and per pair of layouts re-sealed), kept for the
    /// run: a handful.
    layouts: Mutex<HashMap<Layout, Arc<WriterLayout>>>,
    /// Re-seal layouts by (from, to), so each pair gets one number.
    carried: Mutex<HashMap<(Layout, Layout), Layout>>,
    next_layout: AtomicU64,
    /// Held while a re-plan is decided and published (no await inside).
    replanning: Mutex<()>,
    /// When each replica's columns were last read (schema refresh).
    schema_read: Mutex<HashMap<Arc<str>, tokio::time::Instant>>,
    watch: SchemaWatch,
    /// Each replica's dedup window, asked once ([`HttpWriter::dedup`]).
    dedup: Mutex<HashMap<Arc<str>, Arc<Dedup>>>,
    /// Each shard's insert rate (per batch, not per record).
    rates: Mutex<HashMap<usize, InsertRate>>,
}

/// How the rows of one [`Layout`] are inserted.
#[derive(Debug)]
struct WriterLayout {
    /// The plan's layout it writes into: itself for a plan, the plan it was
    /// carried into for a re-seal's.
    target: Layout,
    /// The INSERT's `(name, server type text)` columns, in row order.
    columns: Vec<(String, String)>,
    /// The rows' format.
    row_format: RowFormat,
    /// The Native block plan; `None` when the rows go as they were encoded
    /// (RowBinary or RowBinaryWithDefaults, see [`native_plan`]).
    native: Option<Arc<BlockPlan>>,
    /// `INSERT INTO db.t (cols) FORMAT f`, percent-encoded.
    insert_query: String,
}

impl WriterLayout {
    /// The layout of `columns` in `row_format`, inserted as `format` asks
    /// where it can ([`native_plan`]).
    fn new(
        config: &HttpWriterConfig,
        format: InsertFormat,
        target: Layout,
        columns: Vec<(String, String)>,
        row_format: RowFormat,
    ) -> WriterLayout {
        let mut c = HttpWriterConfig::new(&config.database, &config.table, columns);
        c.format = format;
        c.row_format = row_format;
        let native = native_plan(&mut c);
        let cols: Vec<String> = c
            .columns
            .iter()
            .map(|(n, _)| spate_row::schema::quote_ident(n))
            .collect();
        let insert = format!(
            "INSERT INTO {}.{} ({}) FORMAT {}",
            spate_row::schema::quote_ident(&c.database),
            spate_row::schema::quote_ident(&c.table),
            cols.join(", "),
            match c.format {
                InsertFormat::Native => InsertFormat::Native.name(),
                InsertFormat::RowBinary => c.row_format.name(),
            }
        );
        WriterLayout {
            target,
            columns: c.columns,
            row_format,
            native,
            insert_query: percent_encode(&insert),
        }
    }
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
    if config.row_format == spate_row::schema::RowFormat::RowBinaryWithDefaults {
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
        let requested = config.format;
        let start = WriterLayout::new(
            &config,
            requested,
            0,
            config.columns.clone(),
            config.row_format,
        );
        // What the start-up layout fell back to, for the probe's warnings.
        config.format = if start.native.is_some() {
            InsertFormat::Native
        } else {
            InsertFormat::RowBinary
        };
        let connector = https_connector(config.connect_timeout, config.tls.clone());
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        if let Some(live) = &config.live {
            debug_assert_eq!(
                live.generation(),
                0,
                "a writer starts at the plan made at start"
            );
            debug_assert_eq!(
                live.current().typed_columns(),
                config.columns,
                "the live plan at start is the writer's columns"
            );
        }
        Self {
            client,
            config,
            requested,
            caps: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::from([(0, Arc::new(start))])),
            carried: Mutex::new(HashMap::new()),
            next_layout: AtomicU64::new(1),
            replanning: Mutex::new(()),
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

    /// The `FORMAT` of this writer's inserts as planned at start: `Native`,
    /// or `RowBinary` / `RowBinaryWithDefaults` where Native cannot carry
    /// the rows (see `sink.clickhouse.format`). What `spate check` reports
    /// and `spate run` logs at start (issue 31).
    pub fn insert_format(&self) -> &'static str {
        match self.config.format {
            InsertFormat::Native => InsertFormat::Native.name(),
            InsertFormat::RowBinary => self.config.row_format.name(),
        }
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
            .map(|(k, _)| spate_row::schema::quote_literal(k))
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
    /// [`SchemaError::NoSuchDatabase`](spate_row::schema::SchemaError::NoSuchDatabase),
    /// from a missing table).
    pub async fn table_schema(&self, url: &str) -> Result<TableSchema, SchemaProbeError> {
        let answer = self
            .query(
                url,
                &columns_query(&self.config.database, &self.config.table),
            )
            .await?;
        match TableSchema::from_json_each_row(&self.config.database, &self.config.table, &answer) {
            Err(spate_row::schema::SchemaError::NoSuchTable { database, table }) => {
                // No columns: the table is missing, or its whole database.
                let known = self
                    .query(
                        url,
                        &format!(
                            "SELECT count() FROM system.databases WHERE name = {}",
                            spate_row::schema::quote_literal(&database)
                        ),
                    )
                    .await?;
                Err(if known.trim() == "0" {
                    spate_row::schema::SchemaError::NoSuchDatabase { database }
                } else {
                    spate_row::schema::SchemaError::NoSuchTable { database, table }
                }
                .into())
            }
            other => Ok(other?),
        }
    }

    /// Whether the server at `url` accepts `RowBinaryWithDefaults` input
    /// ([`spate_row::schema::formats_query`]; 18.16 does not).
    ///
    /// # Errors
    /// [`SchemaProbeError`] when the query fails or its answer is not a count.
    pub async fn accepts_row_binary_with_defaults(
        &self,
        url: &str,
    ) -> Result<bool, SchemaProbeError> {
        let answer = self.query(url, spate_row::schema::formats_query()).await?;
        match answer.trim() {
            "0" => Ok(false),
            "1" => Ok(true),
            other => Err(spate_row::schema::SchemaError::BadAnswer(format!(
                "system.formats count: `{other}`"
            ))
            .into()),
        }
    }

    /// Inserts `segments` (whole RowBinary rows of the current INSERT plan's
    /// columns, in order) into `endpoint`, with `token` as
    /// `insert_deduplication_token` where the endpoint knows it (see
    /// [`HttpWriter::insert_layout`]).
    ///
    /// # Errors
    /// As [`HttpWriter::insert_layout`].
    pub async fn insert(
        &self,
        endpoint: &Endpoint,
        segments: Vec<Bytes>,
        token: &str,
    ) -> Result<(), WriteError> {
        let layout = self.config.live.as_ref().map_or(0, |l| l.generation());
        self.insert_layout(endpoint, layout, segments, token).await
    }

    /// Inserts `segments`, whole RowBinary rows of `layout`, into
    /// `endpoint`: what [`Writer::write`] does with a sealed batch.
    ///
    /// Before sending, re-reads the table's columns when the last read of
    /// this replica is older than [`HttpWriterConfig::schema_refresh`]
    /// (always where the server does not check the body's types); for
    /// Native, transcodes the rows into Native blocks. After a failure whose
    /// code is in [`SCHEMA_CHANGE_CODES`], re-reads the columns at once.
    ///
    /// # Errors
    /// [`WriteError`], classified (see the module docs); fatal, naming the
    /// table and the old and new types, when the table changed under the
    /// plan in a way that is not re-planned live; `replanned` (nothing
    /// sent, or refused by the server) when the table changed and the plan
    /// was re-planned: the batch is then re-sealed ([`Writer::reseal`]).
    pub async fn insert_layout(
        &self,
        endpoint: &Endpoint,
        layout: Layout,
        segments: Vec<Bytes>,
        token: &str,
    ) -> Result<(), WriteError> {
        debug_assert!(!segments.is_empty(), "an insert has rows");
        self.writes_current(layout)?;
        let plan = self.layout(layout)?;
        let caps = self.caps(endpoint).await?;
        if self.schema_read_due(endpoint, caps, &plan) {
            self.check_schema(endpoint).await?;
            // The re-read may have re-planned: re-seal before sending.
            self.writes_current(layout)?;
        }
        let uri = self.insert_uri(endpoint, caps, &plan, token).await?;
        let compression = self.config.compression;
        let segments = encode_body(endpoint, &plan, segments, compression).await?;
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
                // the table change? A stale plan's error names the types; a
                // re-planned one re-seals the batch (nothing was stored).
                match self.check_schema(endpoint).await {
                    Err(stale) if stale.is_fatal() => Err(WriteError::fatal(format!(
                        "{}; the server said: {}",
                        stale.message, f.error.message
                    ))),
                    _ => match self.writes_current(layout) {
                        Err(replanned) => Err(WriteError::replanned(format!(
                            "{}; the server said: {}",
                            replanned.message, f.error.message
                        ))),
                        Ok(()) => Err(f.error),
                    },
                }
            }
            Err(f) => Err(f.error),
        }
    }

    /// The insert's URI for `plan` on `endpoint`: settings, the token as
    /// query id (and dedup token where known), Native's type check.
    async fn insert_uri(
        &self,
        endpoint: &Endpoint,
        caps: ServerCaps,
        plan: &WriterLayout,
        token: &str,
    ) -> Result<Uri, WriteError> {
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
        if plan.native.is_some() && caps.native_type_check {
            extra.push((NATIVE_TYPES_CONVERSION, "0"));
        }
        self.uri(&endpoint.url, &plan.insert_query, &extra)
    }

    /// The layout numbered `layout`.
    ///
    /// # Errors
    /// Fatal when this writer never planned it (a bug).
    fn layout(&self, layout: Layout) -> Result<Arc<WriterLayout>, WriteError> {
        self.layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&layout)
            .cloned()
            .ok_or_else(|| {
                WriteError::fatal(format!(
                    "{}.{}: a batch of layout {layout}, which this writer never planned",
                    self.config.database, self.config.table
                ))
            })
    }

    /// Whether rows of `layout` are what the table takes now.
    ///
    /// # Errors
    /// `replanned` when the INSERT was re-planned since `layout` was made.
    fn writes_current(&self, layout: Layout) -> Result<(), WriteError> {
        let Some(live) = &self.config.live else {
            return Ok(());
        };
        let now = live.generation();
        let target = self.layout(layout)?.target;
        if target == now {
            return Ok(());
        }
        Err(WriteError::replanned(format!(
            "{}.{}: the table's columns changed; the batch was encoded under INSERT plan \
             {target}, the plan is now {now}",
            self.config.database, self.config.table
        )))
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
                    spate_row::schema::quote_literal(&self.config.database),
                    spate_row::schema::quote_literal(&self.config.table)
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

    /// Whether `endpoint`'s columns are due for a re-read before an insert
    /// of `plan`: always where the server does not check the body's types
    /// itself (RowBinary, or Native without
    /// [`ServerCaps::native_type_check`]), else when the last read is older
    /// than the refresh; never when the refresh is `None`.
    fn schema_read_due(&self, endpoint: &Endpoint, caps: ServerCaps, plan: &WriterLayout) -> bool {
        let Some(refresh) = self.config.schema_refresh else {
            return false;
        };
        if self.config.columns.is_empty() {
            return false;
        }
        if plan.native.is_none() || !caps.native_type_check {
            return true;
        }
        let read = self.schema_read.lock().unwrap_or_else(|p| p.into_inner());
        read.get(&endpoint.url)
            .is_none_or(|t| t.elapsed() >= refresh)
    }

    /// The `(name, type)` columns the INSERT is planned for now.
    fn planned_columns(&self) -> Vec<(String, String)> {
        match &self.config.live {
            Some(live) => live.current().typed_columns(),
            None => self.config.columns.clone(),
        }
    }

    /// Re-reads `endpoint`'s columns and compares them with the plan
    /// ([`watch`]); logs a change at INFO. With a [`LivePlan`], a change
    /// that every old value carries over exactly is re-planned
    /// ([`HttpWriter::replan`]).
    ///
    /// # Errors
    /// Fatal when the plan is stale (a planned column gone or of another
    /// type) and not re-planned, or the table is gone; the probe query's
    /// error when it fails.
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
        let planned = self.planned_columns();
        self.watch
            .observe(&planned, &schema, self.config.live.is_some());
        match compare(&planned, &schema) {
            SchemaVerdict::Unchanged => Ok(()),
            _ if self.config.live.is_some() => self.replan(endpoint, &schema),
            SchemaVerdict::Stale(stale) => Err(WriteError::fatal(format!(
                "{endpoint}: {}",
                stale_message(&schema, &stale)
            ))),
            SchemaVerdict::Added(_) => Ok(()),
        }
    }

    /// The table now has `schema`'s columns, unlike the current plan's:
    /// plans the INSERT for them as the start-up would and, when every
    /// column of the current plan carries over exactly ([`Carry`]),
    /// publishes it to the pipeline threads. Logs the old and new INSERT
    /// columns at INFO and each dropped column.
    ///
    /// # Errors
    /// Fatal, naming the table and each column that does not carry (old
    /// and new type), when the change is not re-planned live: the batch
    /// fails as before the live re-plan existed, and a restart re-plans.
    fn replan(&self, endpoint: &Endpoint, schema: &TableSchema) -> Result<(), WriteError> {
        let live = self.config.live.as_ref().expect("checked by the caller");
        let _one = self.replanning.lock().unwrap_or_else(|p| p.into_inner());
        let current = live.current();
        let before = current.typed_columns();
        if compare(&before, schema) == SchemaVerdict::Unchanged {
            return Ok(()); // another write re-planned meanwhile
        }
        let table = format!("{}.{}", schema.database, schema.table);
        let stop = |changes: String| {
            WriteError::fatal(format!(
                "{endpoint}: table {table} changed while spate runs: {changes}; not re-planned \
                 live, since a row encoded before the change could not be written exactly: no \
                 row is written under the old plan: this batch fails, its offsets are not \
                 committed, and a restart re-plans the INSERT against the new schema and \
                 replays them"
            ))
        };
        let columns = live
            .plan_for(schema)
            .map_err(|why| stop(format!("cannot plan: {why}")))?;
        let now = typed_columns(schema, &columns);
        if now == before {
            return Ok(()); // the INSERT's columns are the same (say, a MATERIALIZED one added)
        }
        let from = self.layout(current.layout)?;
        let mut plan = InsertPlan {
            layout: 0,
            schema: schema.clone(),
            columns,
        };
        if from.row_format != RowFormat::RowBinary {
            return Err(stop(format!(
                "{}: rows with per-row DEFAULT markers are not re-sealed",
                watch::column_list(now.iter().map(|(n, t)| (n.as_str(), t.as_str())))
            )));
        }
        let carry = Carry::plan(&before, &now, |n| plan.fills_missing(n)).map_err(|not| {
            stop(
                not.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        let layout = self.next_layout.fetch_add(1, Ordering::Relaxed);
        let writer_layout = WriterLayout::new(
            &self.config,
            self.requested,
            layout,
            now.clone(),
            plan.row_format(),
        );
        self.layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(layout, Arc::new(writer_layout));
        plan.layout = layout;
        live.publish(plan);
        tracing::info!(
            table = %table,
            layout,
            "re-planned the INSERT live: before [{}], now [{}]; pipeline threads encode \
             under the new plan from their next poll batch, and batches encoded before are \
             re-sealed under it",
            watch::column_list(before.iter().map(|(n, t)| (n.as_str(), t.as_str()))),
            watch::column_list(now.iter().map(|(n, t)| (n.as_str(), t.as_str())))
        );
        for (name, ty) in carry.dropped() {
            tracing::info!(
                table = %table,
                column = %name,
                "column `{name}` ({ty}) was dropped from {table}: rows are no longer written \
                 with it, and its values in batches encoded before are not written (the table \
                 no longer has the column: the table's choice)"
            );
        }
        Ok(())
    }
}

/// The insert body for `plan`: the rows as they are, or their Native
/// transcode, compressed as configured. CPU-bound work (milliseconds per
/// MiB) runs off the I/O threads, so other shards' inserts keep moving.
async fn encode_body(
    endpoint: &Endpoint,
    plan: &WriterLayout,
    segments: Vec<Bytes>,
    compression: Compression,
) -> Result<Vec<Bytes>, WriteError> {
    match (&plan.native, compression) {
        (None, Compression::None) => Ok(segments),
        (Some(native), _) => {
            let native = Arc::clone(native);
            tokio::task::spawn_blocking(move || {
                // Not presized from the RowBinary length: a Native block is
                // longer where a Nullable value is NULL, and growing a
                // presized buffer copies all of it; the transcode reserves
                // each block's exact size.
                let mut body = Vec::new();
                native
                    .transcode(segments.iter().map(|s| &s[..]), &mut body)
                    .map(|_| compression.apply(vec![Bytes::from(body)]))
            })
            .await
            .map_err(|e| WriteError::fatal(format!("{endpoint}: transcoding: {e}")))?
            .map_err(|e| WriteError::fatal(format!("{endpoint}: {e}")))
        }
        (None, c) => tokio::task::spawn_blocking(move || c.apply(segments))
            .await
            .map_err(|e| WriteError::fatal(format!("{endpoint}: compressing: {e}"))),
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
    Schema(#[from] spate_row::schema::SchemaError),
}

impl Writer for HttpWriter {
    async fn write(&self, endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        self.insert_layout(
            endpoint,
            batch.layout(),
            batch.segments().to_vec(),
            batch.token(),
        )
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
        // Fatal when a planned column is missing or of another type (and,
        // with a live plan, the change does not carry).
        self.check_schema(endpoint).await
    }

    /// Re-encodes `batch`'s rows for the current plan ([`Carry`]): values
    /// of a widened column widened, of a column made Nullable flagged not
    /// NULL, of a dropped column left out (logged); a column added is left
    /// to the server's DEFAULT. The re-sealed batch names its own columns
    /// (a layout of its own unless they are the plan's).
    fn reseal(&self, batch: &SealedBatch) -> Result<SealedBatch, WriteError> {
        let table = format!("{}.{}", self.config.database, self.config.table);
        let Some(live) = &self.config.live else {
            return Err(WriteError::fatal(format!(
                "{table}: batch {}: no live plan to re-seal it under",
                batch.token()
            )));
        };
        let from = self.layout(batch.layout())?;
        let current = live.current();
        let to = self.layout(current.layout)?;
        let refuse = |why: String| {
            WriteError::fatal(format!(
                "table {table} changed while spate runs: {why}; batch {} (encoded before the \
                 change) is not re-sealed: no row is written under the old plan: it fails, its \
                 offsets are not committed, and a restart re-plans the INSERT against the new \
                 schema and replays them",
                batch.token()
            ))
        };
        if from.row_format != RowFormat::RowBinary {
            return Err(refuse("its rows carry per-row DEFAULT markers".into()));
        }
        let carry = Carry::plan(&from.columns, &to.columns, |n| current.fills_missing(n)).map_err(
            |not| {
                refuse(
                    not.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            },
        )?;
        let layout = self.carried_layout(batch.layout(), current.layout, &carry);
        let mut body = Vec::with_capacity(batch.bytes() as usize + 8 * batch.rows() as usize);
        let rows = carry
            .apply(batch.segments().iter().map(|s| &s[..]), &mut body)
            .map_err(|e| {
                WriteError::fatal(format!("{table}: re-sealing {}: {e}", batch.token()))
            })?;
        debug_assert_eq!(rows, batch.rows(), "a re-seal keeps every row");
        for (name, ty) in carry.dropped() {
            tracing::info!(
                table = %table,
                token = batch.token(),
                column = %name,
                rows,
                "batch {}: column `{name}` ({ty}) was dropped from {table}: its values in the \
                 batch's {rows} row(s), encoded before the change, are not written (the table \
                 no longer has the column: the table's choice)",
                batch.token()
            );
        }
        Ok(batch.resealed(layout, vec![Bytes::from(body)]))
    }
}

impl HttpWriter {
    /// The layout of `carry`'s output from `from` into plan `to`: the plan's
    /// own when the columns are the plan's, else one numbered once per pair.
    fn carried_layout(&self, from: Layout, to: Layout, carry: &Carry) -> Layout {
        let mut carried = self.carried.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&l) = carried.get(&(from, to)) {
            return l;
        }
        let plan_columns = self
            .layout(to)
            .map(|l| l.columns.clone())
            .unwrap_or_default();
        let layout = if carry.output() == plan_columns.as_slice() {
            to
        } else {
            let l = self.next_layout.fetch_add(1, Ordering::Relaxed);
            let wl = WriterLayout::new(
                &self.config,
                self.requested,
                to,
                carry.output().to_vec(),
                RowFormat::RowBinary,
            );
            self.layouts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(l, Arc::new(wl));
            l
        };
        carried.insert((from, to), layout);
        layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 31: what `spate check` and `spate run` report is the FORMAT
    /// the writer plans: Native by default, RowBinary when asked, and
    /// RowBinaryWithDefaults (not Native) when a column takes a per-row
    /// server DEFAULT.
    #[test]
    fn insert_format_is_what_the_writer_planned() {
        let columns = vec![("id".to_owned(), "UInt64".to_owned())];
        let c = HttpWriterConfig::new("db", "t", columns.clone());
        assert_eq!(HttpWriter::new(c).insert_format(), "Native");
        let mut c = HttpWriterConfig::new("db", "t", columns.clone());
        c.format = InsertFormat::RowBinary;
        assert_eq!(HttpWriter::new(c).insert_format(), "RowBinary");
        let mut c = HttpWriterConfig::new("db", "t", columns);
        c.row_format = spate_row::schema::RowFormat::RowBinaryWithDefaults;
        assert_eq!(HttpWriter::new(c).insert_format(), "RowBinaryWithDefaults");
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
                &w.layout(0).unwrap().insert_query,
                &[("insert_deduplication_token", "p-1-0-7")],
            )
            .unwrap();
        assert_eq!(
            uri.to_string(),
            "http://h:1/?query=INSERT%20INTO%20%60db%60.%60t%60%20%28%60a%60%29%20FORMAT%20Native\
             &insert_deduplication_token=p-1-0-7"
        );
    }
}
