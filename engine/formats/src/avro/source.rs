//! Where writer schemas come from: the [`SchemaSource`] trait (the schema
//! registry client implements it over HTTP, `crate::registry`), and
//! [`FileSchemaSource`], schemas read from `.avsc` files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use apache_avro::Schema;

/// Why a schema id has no schema.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Avro schema id {id}: {kind}: {reason}")]
pub struct SchemaError {
    /// The schema id asked for.
    pub id: u32,
    /// What went wrong.
    pub kind: SchemaErrorKind,
    /// Details a user can act on (the registry's answer, the file's path).
    pub reason: String,
}

/// What kind of [`SchemaError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaErrorKind {
    /// The source does not know the id.
    Unknown,
    /// The source could not be asked (registry down, file unreadable).
    Unavailable,
    /// The source answered something that is not an Avro schema.
    Invalid,
}

impl std::fmt::Display for SchemaErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SchemaErrorKind::Unknown => "unknown schema id",
            SchemaErrorKind::Unavailable => "schema source unavailable",
            SchemaErrorKind::Invalid => "not a valid Avro schema",
        })
    }
}

/// Writer schemas by id. Called on a plan-cache miss only (once per new
/// schema id and pipeline thread), from the pipeline thread: it may block
/// (an HTTP request); it must be safe to share between threads.
pub trait SchemaSource: Send + Sync {
    /// The writer schema registered under `id`.
    ///
    /// # Errors
    /// [`SchemaError`] naming the id: unknown, unavailable, or invalid.
    fn schema(&self, id: u32) -> Result<Arc<Schema>, SchemaError>;
}

/// Schemas from files: one schema under one id, a fixed set, or a
/// directory holding `{id}.avsc` files (read on first use of an id and
/// kept).
#[derive(Debug)]
pub struct FileSchemaSource {
    fixed: HashMap<u32, Arc<Schema>>,
    dir: Option<PathBuf>,
    read: Mutex<HashMap<u32, Arc<Schema>>>,
}

/// Parses an Avro schema from its JSON text.
///
/// # Errors
/// apache-avro's parse error, as text.
pub fn parse_schema(text: &str) -> Result<Schema, String> {
    Schema::parse_str(text).map_err(|e| e.to_string())
}

/// Reads and parses the `.avsc` file at `path`.
///
/// # Errors
/// The file's path and the I/O or parse error, as text.
pub fn read_schema_file(path: &Path) -> Result<Schema, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_schema(&text).map_err(|e| format!("{}: {e}", path.display()))
}

impl FileSchemaSource {
    /// Answers `id` with `schema`, every other id unknown.
    pub fn one(id: u32, schema: Schema) -> Self {
        Self::from_schemas([(id, schema)])
    }

    /// Answers each id of `schemas`, every other id unknown.
    pub fn from_schemas(schemas: impl IntoIterator<Item = (u32, Schema)>) -> Self {
        Self {
            fixed: schemas
                .into_iter()
                .map(|(id, s)| (id, Arc::new(s)))
                .collect(),
            dir: None,
            read: Mutex::new(HashMap::new()),
        }
    }

    /// Answers id `N` with the schema in `dir/N.avsc`.
    pub fn dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            fixed: HashMap::new(),
            dir: Some(dir.into()),
            read: Mutex::new(HashMap::new()),
        }
    }
}

impl SchemaSource for FileSchemaSource {
    fn schema(&self, id: u32) -> Result<Arc<Schema>, SchemaError> {
        if let Some(s) = self.fixed.get(&id) {
            return Ok(Arc::clone(s));
        }
        let Some(dir) = &self.dir else {
            return Err(SchemaError {
                id,
                kind: SchemaErrorKind::Unknown,
                reason: "not among the schemas given from files".into(),
            });
        };
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = read.get(&id) {
            return Ok(Arc::clone(s));
        }
        let path = dir.join(format!("{id}.avsc"));
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SchemaError {
                    id,
                    kind: SchemaErrorKind::Unknown,
                    reason: format!("no file {}", path.display()),
                });
            }
            Err(e) => {
                return Err(SchemaError {
                    id,
                    kind: SchemaErrorKind::Unavailable,
                    reason: format!("{}: {e}", path.display()),
                });
            }
        };
        let schema = parse_schema(&text).map_err(|e| SchemaError {
            id,
            kind: SchemaErrorKind::Invalid,
            reason: format!("{}: {e}", path.display()),
        })?;
        let schema = Arc::new(schema);
        read.insert(id, Arc::clone(&schema));
        Ok(schema)
    }
}
