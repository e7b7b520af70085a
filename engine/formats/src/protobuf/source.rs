//! Where Protobuf descriptors come from: a descriptor-set file
//! (`FileDescriptorSet`, as `protoc --include_imports --descriptor_set_out`
//! writes it, loaded by `prost-reflect`), or a registry's schema, which for
//! `schemaType: PROTOBUF` is `.proto` source text (compiled here by
//! `protox`, a pure-Rust protobuf compiler; the well-known types such as
//! `google/protobuf/timestamp.proto` are built in).
//!
//! [`ProtoSchemaSource`] is the seam a registry client implements: a
//! blocking lookup by schema id, called from a lane thread on a plan-cache
//! miss only (never per record). [`FileSchemaSource`] serves ids from files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use prost_reflect::{DescriptorPool, FileDescriptor, MessageDescriptor};

/// A schema that cannot be had or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A file could not be read.
    #[error("cannot read `{path}`: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// Bytes that are not a valid `FileDescriptorSet`.
    #[error("`{what}` is not a valid protobuf descriptor set: {reason}")]
    BadDescriptorSet {
        /// The file or schema id it came from.
        what: String,
        /// prost-reflect's reason.
        reason: String,
    },
    /// `.proto` text that does not compile.
    #[error("schema `{what}`: the .proto text does not compile: {reason}")]
    BadProto {
        /// The schema (file name or id).
        what: String,
        /// protox's reason.
        reason: String,
    },
    /// A descriptor set without the file or message asked for.
    #[error("`{what}` has no {kind} `{name}`")]
    NotFound {
        /// The file or schema id searched.
        what: String,
        /// "file" or "message".
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// The source knows no schema of this id.
    #[error("Protobuf schema id {id}: unknown to the schema source")]
    UnknownId {
        /// The id.
        id: u32,
    },
    /// The source could not fetch the schema (a registry that is down); the
    /// registry client names the endpoint in `reason`.
    #[error("Protobuf schema id {id}: {reason}")]
    Fetch {
        /// The id.
        id: u32,
        /// Why.
        reason: String,
    },
}

/// A source of Protobuf schemas by registry id.
///
/// `descriptor` returns the `.proto` file the id stands for (its messages
/// are what the Confluent message indexes point into, [`message_at`]); it
/// may block (HTTP) and is called only when a lane meets an id it has no
/// plan for. Implementations cache as they see fit.
pub trait ProtoSchemaSource: Send + Sync {
    /// The schema file registered under `id`.
    ///
    /// # Errors
    /// [`SchemaError`]: unknown id, fetch failure, schema text that does
    /// not compile.
    fn descriptor(&self, id: u32) -> Result<FileDescriptor, SchemaError>;
}

/// Loads a descriptor set file into a pool.
///
/// # Errors
/// [`SchemaError::Io`] or [`SchemaError::BadDescriptorSet`].
pub fn load_descriptor_set(path: &Path) -> Result<DescriptorPool, SchemaError> {
    let bytes = std::fs::read(path).map_err(|e| SchemaError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    DescriptorPool::decode(bytes.as_slice()).map_err(|e| SchemaError::BadDescriptorSet {
        what: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// The message `name` (fully qualified, `spate.bench.SensorRow`; a leading
/// `.` is accepted) in `pool`.
///
/// # Errors
/// [`SchemaError::NotFound`] naming `what` (the pool's origin).
pub fn message_by_name(
    pool: &DescriptorPool,
    name: &str,
    what: &str,
) -> Result<MessageDescriptor, SchemaError> {
    pool.get_message_by_name(name.trim_start_matches('.'))
        .ok_or_else(|| SchemaError::NotFound {
            what: what.to_owned(),
            kind: "message",
            name: name.to_owned(),
        })
}

/// Compiles `.proto` source text (a registry's `schema` for `schemaType:
/// PROTOBUF`) named `name`, with the texts of the files it imports
/// (`references`: import name and text; the well-known
/// `google/protobuf/*.proto` files need none), into its file descriptor.
///
/// # Errors
/// [`SchemaError::BadProto`] with protox's reason (syntax error, unknown
/// type, missing import).
pub fn compile_proto(
    name: &str,
    text: &str,
    references: &[(String, String)],
) -> Result<FileDescriptor, SchemaError> {
    let bad = |reason: String| SchemaError::BadProto {
        what: name.to_owned(),
        reason,
    };
    let mut files = HashMap::new();
    files.insert(name.to_owned(), text.to_owned());
    for (n, t) in references {
        files.insert(n.clone(), t.clone());
    }
    let mut chain = protox::file::ChainFileResolver::new();
    chain.add(MemoryResolver(files));
    chain.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.include_imports(true);
    compiler.open_file(name).map_err(|e| bad(e.to_string()))?;
    let pool = compiler.descriptor_pool();
    pool.get_file_by_name(name)
        .ok_or_else(|| bad("the compiled pool lacks the file".into()))
}

/// `.proto` files held in memory, by import name.
struct MemoryResolver(HashMap<String, String>);

impl protox::file::FileResolver for MemoryResolver {
    fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
        match self.0.get(name) {
            Some(text) => protox::file::File::from_source(name, text),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

/// The message a Confluent index path names in `file`: the first index
/// picks a top-level message in declaration order, each further one a
/// message nested in the previous. `None` when an index is out of range.
pub fn message_at(file: &FileDescriptor, indexes: &[i32]) -> Option<MessageDescriptor> {
    let (first, rest) = indexes.split_first()?;
    let mut msg = file.messages().nth(usize::try_from(*first).ok()?)?;
    for &i in rest {
        let next = msg.child_messages().nth(usize::try_from(i).ok()?)?;
        msg = next;
    }
    Some(msg)
}

/// Schemas by id from files: a descriptor set (with the name of the file in
/// it that the id stands for) or a `.proto` file. Read when added, so a bad
/// file fails at start-up, not on the first record.
#[derive(Clone, Debug, Default)]
pub struct FileSchemaSource {
    by_id: HashMap<u32, FileDescriptor>,
}

impl FileSchemaSource {
    /// No schemas.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `id` as the file `file_name` of the descriptor set at `path`.
    ///
    /// # Errors
    /// [`SchemaError`] when the set does not load or lacks the file.
    pub fn add_descriptor_set(
        &mut self,
        id: u32,
        path: &Path,
        file_name: &str,
    ) -> Result<&mut Self, SchemaError> {
        let pool = load_descriptor_set(path)?;
        let file = pool
            .get_file_by_name(file_name)
            .ok_or_else(|| SchemaError::NotFound {
                what: path.display().to_string(),
                kind: "file",
                name: file_name.to_owned(),
            })?;
        self.by_id.insert(id, file);
        Ok(self)
    }

    /// Serves `id` as the `.proto` file at `path` (its imports other than
    /// the well-known types are not resolved).
    ///
    /// # Errors
    /// [`SchemaError`] when it cannot be read or does not compile.
    pub fn add_proto_file(&mut self, id: u32, path: &Path) -> Result<&mut Self, SchemaError> {
        let text = std::fs::read_to_string(path).map_err(|e| SchemaError::Io {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "schema.proto".into());
        let file = compile_proto(&name, &text, &[])?;
        self.by_id.insert(id, file);
        Ok(self)
    }

    /// Serves `id` as `file` (built by the caller).
    pub fn insert(&mut self, id: u32, file: FileDescriptor) -> &mut Self {
        self.by_id.insert(id, file);
        self
    }
}

impl ProtoSchemaSource for FileSchemaSource {
    fn descriptor(&self, id: u32) -> Result<FileDescriptor, SchemaError> {
        self.by_id
            .get(&id)
            .cloned()
            .ok_or(SchemaError::UnknownId { id })
    }
}
