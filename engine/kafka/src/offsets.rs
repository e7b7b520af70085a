//! The committed-offset range check: on every assignment, compare each
//! partition's committed offset with the partition's valid range and say so
//! loudly when it lies outside.
//!
//! Why: librdkafka answers a fetch at an offset the broker does not have
//! (`OFFSET_OUT_OF_RANGE`: committed beyond the log end after a topic was
//! re-created, or below the low watermark after retention deleted the data)
//! by resetting to `auto.offset.reset`, and tells the application nothing but
//! one log line. A reset to `earliest` re-reads data (duplicates); a reset to
//! `latest` skips data that was never written (a silent gap). Either way an
//! operator must hear of it, naming topic, partition, the committed offset
//! and the valid range: a `warn!` line and the counter
//! [`crate::COMMITTED_OUT_OF_RANGE`]. spate does not reset anything itself;
//! the reset stays librdkafka's, per `auto.offset.reset` (`error` makes it
//! a lane error instead).
//!
//! What it costs: after each assignment, on the controller's thread, one
//! `OffsetFetch` for the assigned partitions and one watermark query (two
//! `ListOffsets`) per partition that has a committed offset, all bounded by
//! [`RANGE_CHECK_TIMEOUT`]. A check that cannot complete is logged at debug
//! and skipped; it never fails the assignment.
//!
//! The pure decision is [`out_of_range`], unit-tested below; the end-to-end
//! test is `committed_offset_beyond_the_log_end_is_reported` in
//! `tests/it/mock_faults.rs`.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset as KafkaOffset, TopicPartitionList};

use spate_core::record::TopicPartition;
use spate_core::source::OffsetReset;

use crate::COMMITTED_OUT_OF_RANGE;
use crate::context::SpateContext;

/// Bound on the whole range check of one assignment (all broker round trips).
pub(crate) const RANGE_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a committed offset lies relative to the partition's valid range
/// `[low, high]` (a committed offset equal to `high` is valid: nothing new).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutOfRange {
    /// Below the low watermark: the data from the committed offset up to
    /// `low` was deleted (retention) before it was read.
    BelowLow,
    /// Beyond the high watermark: the log is shorter than what was committed
    /// (topic re-created, unclean leader election, offsets copied).
    AboveHigh,
}

/// Whether `committed` lies outside `[low, high]`.
pub(crate) fn out_of_range(committed: i64, low: i64, high: i64) -> Option<OutOfRange> {
    debug_assert!(low <= high, "watermarks inverted: {low} > {high}");
    if committed < low {
        Some(OutOfRange::BelowLow)
    } else if committed > high {
        Some(OutOfRange::AboveHigh)
    } else {
        None
    }
}

/// Where librdkafka resumes a partition whose committed offset is out of
/// `[low, high]`, per `auto.offset.reset` (`policy`, librdkafka's default
/// `largest` when unset): `low` for smallest/earliest/beginning, `high` for
/// largest/latest/end, `None` for `error` (a lane error instead) or a value
/// librdkafka would have refused.
pub(crate) fn reset_target(policy: &str, low: i64, high: i64) -> Option<i64> {
    match policy {
        "smallest" | "earliest" | "beginning" => Some(low),
        "largest" | "latest" | "end" => Some(high),
        _ => None,
    }
}

/// What [`check_committed`] found for each partition of an assignment.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    /// The group's committed offset per partition, where it has one.
    pub(crate) committed: Vec<(TopicPartition, i64)>,
    /// Those outside the partition's range.
    pub(crate) resets: Vec<OffsetReset>,
}

/// Checks the committed offsets of `partitions` (just assigned) in `group`
/// against their watermarks (`fetched`: the group's committed offsets if the
/// caller already read them, else they are read here); logs and counts every one out of range
/// (`policy` is `auto.offset.reset`, naming where the partition resumes).
pub(crate) fn check_committed(
    consumer: &BaseConsumer<SpateContext>,
    group: &str,
    partitions: &TopicPartitionList,
    fetched: Option<TopicPartitionList>,
    policy: &str,
) -> Checked {
    let mut checked = Checked::default();
    if partitions.count() == 0 {
        return checked;
    }
    let deadline = Instant::now() + RANGE_CHECK_TIMEOUT;
    let committed = match fetched {
        Some(c) => c,
        None => match consumer.committed_offsets(partitions.clone(), RANGE_CHECK_TIMEOUT) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(group, error = %e, "committed-offset range check skipped");
                return checked;
            }
        },
    };
    for elem in committed.elements() {
        let KafkaOffset::Offset(offset) = elem.offset() else {
            continue; // nothing committed: auto.offset.reset applies, as documented
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let (topic, partition) = (elem.topic(), elem.partition());
        checked
            .committed
            .push((TopicPartition::new(topic, partition), offset));
        let (low, high) = match consumer.fetch_watermarks(topic, partition, left) {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(topic, partition, error = %e, "watermarks for the range check unavailable");
                continue;
            }
        };
        let Some(side) = out_of_range(offset, low, high) else {
            continue;
        };
        let reset = OffsetReset {
            partition: TopicPartition::new(topic, partition),
            committed: offset,
            low,
            high,
            reset_to: reset_target(policy, low, high),
            policy: format!("auto.offset.reset={policy}"),
        };
        report_out_of_range(group, &reset, side, policy);
        checked.resets.push(reset);
    }
    checked
}

/// Logs and counts one committed offset found out of range (the error line
/// and `spate_committed_offset_out_of_range_total` together).
fn report_out_of_range(group: &str, reset: &OffsetReset, side: OutOfRange, policy: &str) {
    let what = match side {
        OutOfRange::BelowLow => {
            "below the low watermark: the data between was deleted before it was read"
        }
        OutOfRange::AboveHigh => "beyond the log end: the log is shorter than what was committed",
    };
    let (topic, partition) = (reset.partition.topic(), reset.partition.partition());
    let (offset, low, high) = (reset.committed, reset.low, reset.high);
    tracing::error!(
        group,
        topic,
        partition,
        committed = offset,
        low,
        high,
        "committed offset {offset} of {topic}/{partition} is out of range [{low}, {high}] ({what}); \
         librdkafka resets it per auto.offset.reset={policy} (to {})",
        reset
            .reset_to
            .map_or_else(|| "none: a lane error".to_owned(), |o| o.to_string())
    );
    metrics::counter!(COMMITTED_OUT_OF_RANGE,
        "topic" => topic.to_owned(),
        "partition" => partition.to_string())
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_is_inclusive_at_both_ends() {
        assert_eq!(out_of_range(0, 0, 10), None);
        assert_eq!(out_of_range(10, 0, 10), None, "committed == end: caught up");
        assert_eq!(out_of_range(5, 5, 5), None);
    }

    #[test]
    fn the_reset_target_follows_the_policy() {
        for p in ["smallest", "earliest", "beginning"] {
            assert_eq!(reset_target(p, 4, 10), Some(4), "{p}");
        }
        for p in ["largest", "latest", "end"] {
            assert_eq!(reset_target(p, 4, 10), Some(10), "{p}");
        }
        assert_eq!(reset_target("error", 4, 10), None);
    }

    #[test]
    fn below_low_and_above_high_are_told_apart() {
        assert_eq!(out_of_range(3, 4, 10), Some(OutOfRange::BelowLow));
        assert_eq!(out_of_range(11, 0, 10), Some(OutOfRange::AboveHigh));
        assert_eq!(out_of_range(100, 0, 0), Some(OutOfRange::AboveHigh));
    }
}
