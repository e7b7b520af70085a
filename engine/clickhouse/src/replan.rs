//! The live INSERT plan: what the pipeline threads encode and the writer
//! writes, re-planned while spate runs when the table's columns change
//! (issue 19 item 1; ADR 0005).
//!
//! One [`LivePlan`] is shared by the writer and every pipeline thread. The
//! writer, on finding the table's columns changed in a way every old value
//! carries over exactly ([`crate::native::carry`]), publishes a new
//! [`MappingPlan`] under a new layout number ([`spate_core::sink::Layout`]):
//! the plan is stored, then its number in an atomic. Each thread's
//! [`LiveEncoder`] compares that atomic with its own number once per poll
//! batch ([`spate_core::pipeline::chain::Encoder::replan`]) and, when it
//! moved, rebuilds its encoder from the new plan; the terminal seals the
//! rows of the old layout first, so a chunk and a batch hold one layout.
//! No lock and no allocation per record; one atomic load per poll batch,
//! the lock and the rebuild once per plan change.
//!
//! What the plan does not do: decide whether a change carries (the writer
//! does, [`crate::writer`]), or read the table (the writer's schema re-read).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError};
use spate_core::record::Payload;
use spate_core::sink::Layout;

use crate::mapping::explode::{ExplodeEncoder, JsonElement};
use crate::mapping::{ColumnSpec, JsonRowEncoder, MappingOptions, MissingValue};
use crate::schema::{InsertOptions, RowFormat, TableSchema, plan_insert, row_format};

/// One generation of the INSERT plan.
#[derive(Clone, Debug)]
pub struct MappingPlan {
    /// Its layout number: 0 for the plan made at start, then one more per
    /// published change (numbers the writer hands out).
    pub layout: Layout,
    /// The table as read when the plan was made.
    pub schema: TableSchema,
    /// The INSERT's columns in order, with their JSON sources.
    pub columns: Vec<ColumnSpec>,
}

impl MappingPlan {
    /// `(name, server type text)` of each INSERT column.
    pub fn typed_columns(&self) -> Vec<(String, String)> {
        typed_columns(&self.schema, &self.columns)
    }

    /// The rows' format ([`row_format`]).
    pub fn row_format(&self) -> RowFormat {
        row_format(&self.columns)
    }

    /// Whether a record without column `name`'s field gets a value (NULL,
    /// a DEFAULT) rather than a record error; `false` for a column the
    /// plan does not name.
    pub fn fills_missing(&self, name: &str) -> bool {
        self.columns
            .iter()
            .find(|c| c.name == name)
            .is_some_and(|c| c.missing != MissingValue::Reject)
    }
}

/// `(name, server type text)` of each of `columns`, from `schema`.
pub fn typed_columns(schema: &TableSchema, columns: &[ColumnSpec]) -> Vec<(String, String)> {
    columns
        .iter()
        .map(|c| {
            let ty = schema
                .columns
                .iter()
                .find(|t| t.name == c.name)
                .map(|t| t.type_text.clone())
                .unwrap_or_default();
            (c.name.clone(), ty)
        })
        .collect()
}

/// The plan shared by the writer and the pipeline threads.
#[derive(Debug)]
pub struct LivePlan {
    /// The current plan's layout, stored after `current` (Release) and read
    /// once per poll batch (Acquire).
    generation: AtomicU64,
    current: Mutex<Arc<MappingPlan>>,
    insert: InsertOptions,
    options: MappingOptions,
}

impl LivePlan {
    /// The plan made at start (layout 0): `columns` planned from `schema`
    /// with `insert`, encoded with `options`.
    pub fn new(
        schema: TableSchema,
        columns: Vec<ColumnSpec>,
        insert: InsertOptions,
        options: MappingOptions,
    ) -> Arc<LivePlan> {
        Arc::new(LivePlan {
            generation: AtomicU64::new(0),
            current: Mutex::new(Arc::new(MappingPlan {
                layout: 0,
                schema,
                columns,
            })),
            insert,
            options,
        })
    }

    /// The current plan's layout (one atomic load).
    #[inline]
    pub fn generation(&self) -> Layout {
        self.generation.load(Ordering::Acquire)
    }

    /// The current plan.
    pub fn current(&self) -> Arc<MappingPlan> {
        Arc::clone(&self.current.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The INSERT columns `schema` would get at start-up with this run's
    /// options, checked by building their encoder.
    ///
    /// # Errors
    /// Why they cannot be planned or encoded, in words.
    pub fn plan_for(&self, schema: &TableSchema) -> Result<Vec<ColumnSpec>, String> {
        let columns = plan_insert(schema, &self.insert).map_err(|e| e.to_string())?;
        JsonRowEncoder::new(columns.clone(), self.options.clone()).map_err(|e| e.to_string())?;
        Ok(columns)
    }

    /// Makes `plan` current: pipeline threads pick it up at their next poll
    /// batch. Its layout must be new.
    pub fn publish(&self, plan: MappingPlan) {
        let layout = plan.layout;
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert_ne!(current.layout, layout, "a published plan has a new layout");
        *current = Arc::new(plan);
        self.generation.store(layout, Ordering::Release);
    }

    /// An encoder for a pipeline thread, of the current plan.
    ///
    /// # Errors
    /// The mapper's error (cannot happen for a plan [`LivePlan::plan_for`]
    /// or the start-up checked).
    pub fn encoder(self: &Arc<Self>) -> Result<LiveEncoder, crate::mapping::MappingError> {
        let plan = self.current();
        Ok(LiveEncoder {
            inner: JsonRowEncoder::new(plan.columns.clone(), self.options.clone())?,
            layout: plan.layout,
            live: Arc::clone(self),
        })
    }
}

impl LivePlan {
    /// A fan-out encoder for a pipeline thread (`mapping.explode` at
    /// `path`), of the current plan.
    ///
    /// # Errors
    /// The mapper's error (cannot happen for a plan the start-up checked).
    pub fn explode_encoder(
        self: &Arc<Self>,
        path: Vec<String>,
    ) -> Result<LiveExplodeEncoder, crate::mapping::MappingError> {
        let plan = self.current();
        Ok(LiveExplodeEncoder {
            inner: self.build_explode(&plan.columns, &path)?,
            layout: plan.layout,
            live: Arc::clone(self),
            path,
            refused: None,
        })
    }

    fn build_explode(
        &self,
        columns: &[ColumnSpec],
        path: &[String],
    ) -> Result<ExplodeEncoder, crate::mapping::MappingError> {
        let pointed = self.insert.pointers.keys().cloned().collect();
        ExplodeEncoder::new(columns.to_vec(), self.options.clone(), path, &pointed)
    }
}

/// [`LiveEncoder`] for fan-out records ([`JsonElement`]): the
/// [`ExplodeEncoder`] of the plan it last saw.
#[derive(Debug)]
pub struct LiveExplodeEncoder {
    inner: ExplodeEncoder,
    layout: Layout,
    live: Arc<LivePlan>,
    path: Vec<String>,
    /// A published layout this encoder could not follow (not retried).
    refused: Option<Layout>,
}

impl LiveExplodeEncoder {
    /// The current plan's fan-out encoder.
    pub fn encoder(&mut self) -> &mut ExplodeEncoder {
        &mut self.inner
    }
}

impl<'a> Encoder<JsonElement<'a>> for LiveExplodeEncoder {
    #[inline]
    fn encode(
        &mut self,
        record: &JsonElement<'a>,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.inner.encode(record, cx, buf)
    }

    fn replan(&mut self) -> Option<Layout> {
        if self.live.generation() == self.layout {
            return None;
        }
        let plan = self.live.current();
        if self.refused == Some(plan.layout) {
            return None;
        }
        // The writer checked a one-row encoder of these columns; their
        // fan-out split can still fail (a new column reading the element
        // path a pointed one reads). Then keep encoding the old layout,
        // whose batches the writer re-seals into the new one (ADR 0005),
        // rather than stop the thread; say so once.
        match self.live.build_explode(&plan.columns, &self.path) {
            Ok(inner) => {
                self.inner = inner;
                self.layout = plan.layout;
                self.refused = None;
                Some(plan.layout)
            }
            Err(e) => {
                tracing::error!(
                    layout = plan.layout,
                    error = %e,
                    "mapping.explode cannot follow the new INSERT plan; rows keep the old layout"
                );
                self.refused = Some(plan.layout);
                None
            }
        }
    }
}

impl crate::filter::RowColumns for LiveExplodeEncoder {
    fn row_columns(&self) -> &[ColumnSpec] {
        self.inner.columns()
    }

    fn row_format(&self) -> RowFormat {
        row_format(self.inner.columns())
    }
}

impl crate::filter::RowColumns for ExplodeEncoder {
    fn row_columns(&self) -> &[ColumnSpec] {
        self.columns()
    }

    fn row_format(&self) -> RowFormat {
        row_format(self.columns())
    }
}

/// A pipeline thread's encoder that follows the [`LivePlan`]: the JSON
/// mapper of the plan it last saw, and that plan's layout.
#[derive(Debug)]
pub struct LiveEncoder {
    inner: JsonRowEncoder,
    layout: Layout,
    live: Arc<LivePlan>,
}

impl LiveEncoder {
    /// The layout of the rows it writes now.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The mapper of the current plan.
    pub fn mapper(&mut self) -> &mut JsonRowEncoder {
        &mut self.inner
    }

    /// The current plan's INSERT columns.
    pub fn columns(&self) -> &[ColumnSpec] {
        self.inner.columns()
    }

    /// Whether the current plan's rows are `RowBinaryWithDefaults`.
    pub fn with_defaults(&self) -> bool {
        self.inner.with_defaults()
    }
}

impl<'a> Encoder<Payload<'a>> for LiveEncoder {
    #[inline]
    fn encode(
        &mut self,
        record: &Payload<'a>,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.inner.encode(record, cx, buf)
    }

    #[inline]
    fn replan(&mut self) -> Option<Layout> {
        if self.live.generation() == self.layout {
            return None;
        }
        let plan = self.live.current();
        // plan_for() built this encoder once before publishing it.
        self.inner = JsonRowEncoder::new(plan.columns.clone(), self.live.options.clone())
            .expect("a published plan's encoder was checked");
        self.layout = plan.layout;
        tracing::debug!(
            layout = plan.layout,
            "pipeline thread encodes under the new INSERT plan"
        );
        Some(plan.layout)
    }
}
