//! The format-neutral INSERT plan: the columns an INSERT names, of which
//! table, under which layout number, and the live plan the writer re-plans
//! when the table's columns change (issue 19 item 1; ADR 0005).
//!
//! One [`LivePlan`] is shared by the writer and every pipeline thread. The
//! writer, on finding the table's columns changed in a way every old value
//! carries over exactly (spate-clickhouse's `native::carry`), publishes a new
//! [`InsertPlan`] under a new layout number ([`spate_core::sink::Layout`]):
//! the plan is stored, then its number in an atomic. Each thread's encoder
//! (spate-formats' `json::live`) compares that atomic with its own number
//! once per poll batch ([`spate_core::pipeline::chain::Encoder::replan`])
//! and, when it moved, rebuilds itself from the new plan. One atomic load
//! per poll batch, the lock and the rebuild once per plan change.
//!
//! What the plan does not do: decide whether a change carries (the writer
//! does), read the table (the writer's schema re-read), or encode a row
//! (the formats do; the plan only asks the encoder's [`EncoderCheck`]
//! whether it can be built for new columns).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate_core::sink::Layout;

use crate::schema::{InsertOptions, RowFormat, TableSchema, plan_insert, row_format};
use crate::spec::{ColumnSpec, MappingOptions, MissingValue};

/// Whether an encoder can be built for a plan's columns with the mapping's
/// options: `Err` says why not, in words. A [`LivePlan`] publishes no plan
/// its encoder would refuse.
pub type EncoderCheck = fn(&[ColumnSpec], &MappingOptions) -> Result<(), String>;

/// One generation of the INSERT plan.
#[derive(Clone, Debug)]
pub struct InsertPlan {
    /// Its layout number: 0 for the plan made at start, then one more per
    /// published change (numbers the writer hands out).
    pub layout: Layout,
    /// The table as read when the plan was made.
    pub schema: TableSchema,
    /// The INSERT's columns in order, with their JSON sources.
    pub columns: Vec<ColumnSpec>,
}

impl InsertPlan {
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
    current: Mutex<Arc<InsertPlan>>,
    insert: InsertOptions,
    options: MappingOptions,
    /// The encoder's own check of a plan's columns ([`EncoderCheck`]).
    check: EncoderCheck,
}

impl LivePlan {
    /// The plan made at start (layout 0): `columns` planned from `schema`
    /// with `insert`, encoded with `options` by an encoder that `check`
    /// accepts a plan for (the JSON mapper's: spate-formats'
    /// `json::live::check_columns`).
    pub fn new(
        schema: TableSchema,
        columns: Vec<ColumnSpec>,
        insert: InsertOptions,
        options: MappingOptions,
        check: EncoderCheck,
    ) -> Arc<LivePlan> {
        Arc::new(LivePlan {
            generation: AtomicU64::new(0),
            current: Mutex::new(Arc::new(InsertPlan {
                layout: 0,
                schema,
                columns,
            })),
            insert,
            options,
            check,
        })
    }

    /// The current plan's layout (one atomic load).
    #[inline]
    pub fn generation(&self) -> Layout {
        self.generation.load(Ordering::Acquire)
    }

    /// The current plan.
    pub fn current(&self) -> Arc<InsertPlan> {
        Arc::clone(&self.current.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The INSERT columns `schema` would get at start-up with this run's
    /// options, checked by building their encoder.
    ///
    /// # Errors
    /// Why they cannot be planned or encoded, in words.
    pub fn plan_for(&self, schema: &TableSchema) -> Result<Vec<ColumnSpec>, String> {
        let columns = plan_insert(schema, &self.insert).map_err(|e| e.to_string())?;
        (self.check)(&columns, &self.options)?;
        Ok(columns)
    }

    /// Makes `plan` current: pipeline threads pick it up at their next poll
    /// batch. Its layout must be new.
    pub fn publish(&self, plan: InsertPlan) {
        let layout = plan.layout;
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert_ne!(current.layout, layout, "a published plan has a new layout");
        *current = Arc::new(plan);
        self.generation.store(layout, Ordering::Release);
    }

    /// How the columns are planned from a table ([`plan_insert`]'s options).
    pub fn insert(&self) -> &InsertOptions {
        &self.insert
    }

    /// The options every encoder of this plan is built with.
    pub fn options(&self) -> &MappingOptions {
        &self.options
    }
}
