//! The ClickHouse Native insert format: a sealed batch's RowBinary rows
//! transcoded column-wise into Native blocks, each of which names every
//! column's type.
//!
//! Why: a RowBinary body carries no types, so a column whose type changed
//! while spate runs (`ALTER TABLE m MODIFY COLUMN x UInt64` under a plan
//! built for UInt32) reads our bytes with the new layout and stores garbage
//! (issue 19). A Native block declares `x UInt32`, and the server refuses
//! a block whose column type is not the table's (measured on 18.16: code
//! 368 "Bad cast", see shared/ENVIRONMENT.md). The type text written is the
//! exact string the schema probe read from `system.columns`, never a
//! rendering of our parse.
//!
//! Where: the pipeline threads keep writing RowBinary rows into chunk
//! buffers (the mapper's hot path is unchanged); the writer transcodes a
//! sealed batch's segments into Native right before each insert attempt
//! ([`BlockPlan::transcode`]). The transcode is a pure function of the
//! batch's bytes and the plan, so every attempt of one batch sends identical
//! bytes with the identical token (D4), and a server's block-hash
//! deduplication sees the same blocks on a retry.
//!
//! Block layout (<https://clickhouse.com/docs/interfaces/formats/Native>,
//! "Block structure", over plain HTTP, without the TCP protocol's
//! `BlockInfo`): LEB128 column count, LEB128 row count, then per column its
//! name and type as Strings (LEB128 length, bytes), then the column's
//! serialization ([`column`] has the per-type layouts and their sources).
//! Blocks follow each other with nothing between; a batch over
//! [`MAX_BLOCK_ROWS`] rows becomes several blocks.
//!
//! What this module does not do: decide which columns the INSERT names
//! (`schema::plan_insert`) or check values (the mapper did).

pub mod carry;
mod column;

use column::{Builder, ColumnError, put_count};

use spate_row::rowbinary::put_string;
use spate_row::types::{ChType, TypeParseError};

/// Rows per Native block at most: ClickHouse's default
/// `max_insert_block_size`, the block size the server itself cuts a
/// RowBinary insert into, so both formats make blocks of the same size.
pub const MAX_BLOCK_ROWS: usize = 1_048_576;

/// A Native plan or transcode that failed.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// A column's type text does not parse.
    #[error("column `{column}`: {source}")]
    Type {
        /// The column.
        column: String,
        /// The parser's error.
        #[source]
        source: TypeParseError,
    },
    /// A column's type has no Native encoder here.
    #[error("column `{column}` has type `{type_text}`, which spate cannot write as Native")]
    Unsupported {
        /// The column.
        column: String,
        /// Its type text.
        type_text: String,
    },
    /// The batch's bytes are not whole RowBinary rows of the plan's columns
    /// (a bug: the mapper and the writer disagree on the columns).
    #[error(
        "the batch's RowBinary does not read as the INSERT's columns: row {row}, \
         column `{column}` ({type_text}): {reason}"
    )]
    Malformed {
        /// 0-based row in the batch.
        row: u64,
        /// The column being read.
        column: String,
        /// Its type text.
        type_text: String,
        /// What was wrong.
        reason: &'static str,
    },
}

/// One INSERT column: its name, the server's type text, the builder.
#[derive(Clone, Debug)]
struct PlannedColumn {
    name: String,
    type_text: String,
    builder: Builder,
}

/// The columns of a Native insert, in INSERT order, with the type text each
/// block declares. Build once per writer; [`BlockPlan::transcode`] per
/// insert attempt.
///
/// The plan keeps up to [`SPARE_BUILDER_SETS`] emptied sets of column
/// builders from earlier transcodes, so a steady stream of batches reuses
/// column buffers already grown to a batch's size instead of growing fresh
/// ones by doubling on every insert (each doubling copies the column and
/// touches new pages: on the sensor workload with 1M-row batches those
/// copies and page faults were about an eighth of spate's perf samples
/// before the reuse). The buffers a plan keeps are bounded by that many
/// batches' column data.
#[derive(Debug)]
pub struct BlockPlan {
    columns: Vec<PlannedColumn>,
    /// Emptied builder sets, one builder per column, capacity kept. The
    /// lock is taken twice per transcode (per batch), never per row.
    spare: std::sync::Mutex<Vec<Vec<Builder>>>,
}

/// How many emptied builder sets a [`BlockPlan`] keeps: one per insert that
/// can transcode at once on a typical writer (two in flight per shard).
pub const SPARE_BUILDER_SETS: usize = 2;

impl Clone for BlockPlan {
    /// The same columns, with no spare builders (they are a cache).
    fn clone(&self) -> Self {
        BlockPlan {
            columns: self.columns.clone(),
            spare: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl BlockPlan {
    /// A plan for `(name, type text)` columns in INSERT order; the type
    /// text should be the server's (`system.columns.type`), since a block
    /// whose type differs from the table's is refused.
    ///
    /// # Errors
    /// [`NativeError::Type`] for a type that does not parse,
    /// [`NativeError::Unsupported`] for one without a Native encoder.
    pub fn new(columns: &[(String, String)]) -> Result<BlockPlan, NativeError> {
        let columns = columns
            .iter()
            .map(|(name, type_text)| {
                let ty = ChType::parse(type_text).map_err(|source| NativeError::Type {
                    column: name.clone(),
                    source,
                })?;
                let builder = Builder::new(&ty).map_err(|_| NativeError::Unsupported {
                    column: name.clone(),
                    type_text: type_text.clone(),
                })?;
                Ok(PlannedColumn {
                    name: name.clone(),
                    type_text: type_text.clone(),
                    builder,
                })
            })
            .collect::<Result<_, NativeError>>()?;
        Ok(BlockPlan {
            columns,
            spare: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// An emptied builder set: a spare one when there is one, else fresh.
    fn take_builders(&self) -> Vec<Builder> {
        let spare = self.spare.lock().ok().and_then(|mut s| s.pop());
        spare.unwrap_or_else(|| self.columns.iter().map(|c| c.builder.clone()).collect())
    }

    /// Keeps `builders` (every one emptied) for the next transcode, unless
    /// [`SPARE_BUILDER_SETS`] are kept already.
    fn give_back(&self, builders: Vec<Builder>) {
        if let Ok(mut s) = self.spare.lock()
            && s.len() < SPARE_BUILDER_SETS
        {
            s.push(builders);
        }
    }

    /// Transcodes RowBinary rows (`segments`, each holding whole rows of
    /// the plan's columns, concatenated in order) into Native blocks
    /// appended to `out`, and returns the number of rows. Blocks hold at
    /// most [`MAX_BLOCK_ROWS`] rows; no rows write nothing.
    ///
    /// Deterministic: the same segments give the same bytes (D4); a
    /// LowCardinality dictionary lists keys in order of first appearance.
    ///
    /// # Errors
    /// [`NativeError::Malformed`] when the bytes do not read as whole rows;
    /// `out` may then hold part of a block.
    pub fn transcode<'a>(
        &self,
        segments: impl IntoIterator<Item = &'a [u8]>,
        out: &mut Vec<u8>,
    ) -> Result<u64, NativeError> {
        self.transcode_in_blocks(segments, MAX_BLOCK_ROWS, out)
    }

    /// [`BlockPlan::transcode`] with blocks of at most `block_rows` rows.
    fn transcode_in_blocks<'a>(
        &self,
        segments: impl IntoIterator<Item = &'a [u8]>,
        block_rows: usize,
        out: &mut Vec<u8>,
    ) -> Result<u64, NativeError> {
        debug_assert!(block_rows > 0, "a block holds at least one row");
        let mut builders = self.take_builders();
        let result = self.transcode_into(&mut builders, segments, block_rows, out);
        // Flushes empty the builders; after an error some hold part of a
        // block and are dropped rather than kept.
        if result.is_ok() {
            self.give_back(builders);
        }
        result
    }

    /// The transcode loop over emptied `builders`, which it leaves empty
    /// when it returns Ok.
    fn transcode_into<'a>(
        &self,
        builders: &mut [Builder],
        segments: impl IntoIterator<Item = &'a [u8]>,
        block_rows: usize,
        out: &mut Vec<u8>,
    ) -> Result<u64, NativeError> {
        let mut rows: u64 = 0;
        let mut in_block: usize = 0;
        for segment in segments {
            let mut input = segment;
            while !input.is_empty() {
                for (i, b) in builders.iter_mut().enumerate() {
                    b.read(&mut input).map_err(|e| {
                        let c = &self.columns[i];
                        NativeError::Malformed {
                            row: rows,
                            column: c.name.clone(),
                            type_text: c.type_text.clone(),
                            reason: match e {
                                ColumnError::Malformed(r) => r,
                                ColumnError::Unsupported(_) => "unsupported type",
                            },
                        }
                    })?;
                }
                rows += 1;
                in_block += 1;
                if in_block == block_rows {
                    self.flush(builders, in_block, out);
                    in_block = 0;
                }
            }
        }
        if in_block > 0 {
            self.flush(builders, in_block, out);
        }
        Ok(rows)
    }

    /// Writes one block of `rows` rows from `builders` and clears them.
    fn flush(&self, builders: &mut [Builder], rows: usize, out: &mut Vec<u8>) {
        debug_assert!(rows > 0, "a Native block has rows");
        // One reservation a block: the block's bytes are known now, and a
        // body that grows by doubling copies itself on every step.
        let header: usize = self
            .columns
            .iter()
            .map(|c| c.name.len() + c.type_text.len() + 20)
            .sum();
        let data: usize = builders.iter().map(Builder::len_bound).sum();
        out.reserve(20 + header + data);
        put_count(out, self.columns.len() as u64);
        put_count(out, rows as u64);
        for (c, b) in self.columns.iter().zip(builders.iter_mut()) {
            put_string(out, c.name.as_bytes());
            put_string(out, c.type_text.as_bytes());
            b.write_prefix(out);
            b.write_data(out);
            b.clear();
        }
    }
}

#[cfg(test)]
mod tests;
