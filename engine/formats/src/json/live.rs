//! The JSON mapper that follows the live INSERT plan
//! ([`spate_row::plan::LivePlan`], ADR 0005): each pipeline thread's
//! [`LiveEncoder`] (or [`LiveExplodeEncoder`] under `mapping.explode`)
//! compares the plan's layout with its own once per poll batch
//! ([`spate_core::pipeline::chain::Encoder::replan`]) and, when it moved,
//! rebuilds its mapper from the new plan; the terminal seals the rows of
//! the old layout first, so a chunk and a batch hold one layout. No lock and
//! no allocation per record.
//!
//! [`check_columns`] is the [`spate_row::plan::EncoderCheck`] a JSON
//! pipeline's live plan is made with: the writer publishes no plan the
//! mapper would refuse. [`JsonLive`] builds the encoders from a plan.

use std::sync::Arc;

use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError};
use spate_core::record::Payload;
use spate_core::sink::Layout;
use spate_row::filter::RowColumns;
use spate_row::plan::LivePlan;
use spate_row::schema::{RowFormat, row_format};
use spate_row::spec::{ColumnSpec, MappingError, MappingOptions};

use super::JsonRowEncoder;
use super::explode::{ExplodeEncoder, JsonElement};

/// The JSON mapper's check of a plan's columns: whether
/// [`JsonRowEncoder::new`] builds for them (a [`spate_row::plan::EncoderCheck`]).
///
/// # Errors
/// The mapper's error, in words.
pub fn check_columns(columns: &[ColumnSpec], options: &MappingOptions) -> Result<(), String> {
    JsonRowEncoder::new(columns.to_vec(), options.clone())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The JSON encoders of a [`LivePlan`], for the pipeline threads.
pub trait JsonLive {
    /// An encoder for a pipeline thread, of the current plan.
    ///
    /// # Errors
    /// The mapper's error (cannot happen for a plan [`LivePlan::plan_for`]
    /// or the start-up checked).
    fn encoder(self: &Arc<Self>) -> Result<LiveEncoder, MappingError>;

    /// A fan-out encoder for a pipeline thread (`mapping.explode` at
    /// `path`), of the current plan.
    ///
    /// # Errors
    /// The mapper's error (cannot happen for a plan the start-up checked).
    fn explode_encoder(
        self: &Arc<Self>,
        path: Vec<String>,
    ) -> Result<LiveExplodeEncoder, MappingError>;
}

impl JsonLive for LivePlan {
    fn encoder(self: &Arc<Self>) -> Result<LiveEncoder, MappingError> {
        let plan = self.current();
        Ok(LiveEncoder {
            inner: JsonRowEncoder::new(plan.columns.clone(), self.options().clone())?,
            layout: plan.layout,
            live: Arc::clone(self),
        })
    }

    fn explode_encoder(
        self: &Arc<Self>,
        path: Vec<String>,
    ) -> Result<LiveExplodeEncoder, MappingError> {
        let plan = self.current();
        Ok(LiveExplodeEncoder {
            inner: build_explode(self, &plan.columns, &path)?,
            layout: plan.layout,
            live: Arc::clone(self),
            path,
            refused: None,
        })
    }
}

/// The fan-out encoder of `columns` under `live`'s options.
fn build_explode(
    live: &LivePlan,
    columns: &[ColumnSpec],
    path: &[String],
) -> Result<ExplodeEncoder, MappingError> {
    let pointed = live.insert().pointers.keys().cloned().collect();
    ExplodeEncoder::new(columns.to_vec(), live.options().clone(), path, &pointed)
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
        match build_explode(&self.live, &plan.columns, &self.path) {
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

impl RowColumns for LiveExplodeEncoder {
    fn row_columns(&self) -> &[ColumnSpec] {
        self.inner.columns()
    }

    fn row_format(&self) -> RowFormat {
        row_format(self.inner.columns())
    }
}

impl RowColumns for ExplodeEncoder {
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
        self.inner = JsonRowEncoder::new(plan.columns.clone(), self.live.options().clone())
            .expect("a published plan's encoder was checked");
        self.layout = plan.layout;
        tracing::debug!(
            layout = plan.layout,
            "pipeline thread encodes under the new INSERT plan"
        );
        Some(plan.layout)
    }
}

impl RowColumns for LiveEncoder {
    fn row_columns(&self) -> &[ColumnSpec] {
        self.columns()
    }

    fn row_format(&self) -> RowFormat {
        RowFormat::of(self.with_defaults())
    }
}
