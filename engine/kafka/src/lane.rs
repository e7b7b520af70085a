//! A lane: one assigned partition's own librdkafka queue, polled by one
//! pipeline thread, handing out payloads that borrow librdkafka's message
//! memory (zero copy, DESIGN "Lanes").
//!
//! **How the borrow works.** A poll takes a batch of messages from the
//! partition's queue with librdkafka's batch call (`native.rs`, the crate's
//! only `unsafe`, says why rdkafka's one-message poll was too slow). The lane
//! keeps the batch's messages until the batch is used up, then destroys them
//! and takes the next: no payload or key byte is copied and nothing is
//! allocated per message. The batch a poll returns borrows the lane (the
//! seam's generic associated type), so the borrow checker rejects any payload
//! used after the next poll:
//!
//! ```compile_fail,E0499
//! use std::time::Duration;
//! use spate_core::source::{Lane, PollBatch};
//!
//! fn keeps_a_payload(lane: &mut spate_kafka::KafkaLane) {
//!     let batch = lane.poll(Duration::ZERO).unwrap();
//!     let payload = batch.payload(0);
//!     let _next = lane.poll(Duration::ZERO); // error[E0499]: `*lane` is already borrowed
//!     let _ = payload.bytes();
//! }
//! ```
//!
//! Copying what is kept before the next poll compiles, which shows the
//! example above fails for the borrow and nothing else:
//!
//! ```
//! use std::time::Duration;
//! use spate_core::source::{Lane, PollBatch};
//!
//! fn copies_a_payload(lane: &mut spate_kafka::KafkaLane) -> Vec<u8> {
//!     let batch = lane.poll(Duration::ZERO).unwrap();
//!     let kept = batch.payload(0).bytes().to_vec();
//!     let _next = lane.poll(Duration::ZERO);
//!     kept
//! }
//! ```
//!
//! **Offsets** within a lane strictly increase (the seam's contract); a
//! message at or below the last one delivered means librdkafka rewound the
//! partition under the lane, which spate cannot reconcile with the acks
//! already issued, so the lane reports a fatal error instead of delivering it.
//!
//! **Backpressure (D2):** [`Lane::pause`] pauses fetching for the lane's one
//! partition ([`rd_kafka_pause_partitions`]); librdkafka then drops what it had
//! pre-fetched for it and, on resume, fetches again from the last message the
//! lane polled, so a pause never loses or duplicates a message.
//!
//! [`rd_kafka_pause_partitions`]: https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::TopicPartitionList;
use spate_core::record::{Epoch, Headers, Offset, Payload, TopicPartition};
use spate_core::source::{Lane, PollBatch, SourceError};

use crate::context::SpateContext;
use crate::errors::source_error;
use crate::native::{Messages, PartitionHandle};

/// One assigned partition's queue: a [`Lane`] of [`crate::KafkaSource`].
///
/// Created by the source when the partition is assigned (one epoch); dropped
/// by the pipeline when the partition is revoked. Polls never wait longer than
/// the timeout given, and the pipeline passes zero (D2).
pub struct KafkaLane {
    // Field order is drop order: the messages go before the queue handles,
    // and those before the consumer.
    /// The last batch taken from the queue; `cursor` is the first of its
    /// messages not yet handed out.
    messages: Messages,
    cursor: usize,
    handle: PartitionHandle,
    /// rdkafka's split queue: keeps the partition's queue from forwarding to
    /// the consumer's queue while the lane lives.
    _split: PartitionQueue<SpateContext>,
    consumer: Arc<BaseConsumer<SpateContext>>,
    partition: TopicPartition,
    /// The lane's partition as a one-element list, for pause and resume.
    list: TopicPartitionList,
    epoch: Epoch,
    max_batch: usize,
    last_offset: Option<Offset>,
    /// The highest offset carried by an error message this lane took
    /// (librdkafka's batch call moves its application position to an error
    /// message's offset + 1 as for data, see [`Lane::position`]).
    error_offset: Option<Offset>,
    /// Calls of [`Lane::position`] since the lane last returned a message:
    /// librdkafka is asked at the first and every [`POSITION_EVERY`]th.
    idle_asks: u32,
}

/// How often an idle lane asks librdkafka for its position (one
/// `rd_kafka_position` is about 210 ns, an empty poll 150 ns, measured in a
/// release build): at the first empty poll after data and every this many
/// after, so the cost per empty poll stays near 15 ns while a trailing
/// transaction marker is still seen within a few idle rounds.
const POSITION_EVERY: u32 = 16;

impl fmt::Debug for KafkaLane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaLane")
            .field("partition", &self.partition)
            .field("epoch", &self.epoch)
            .field("last_offset", &self.last_offset)
            .field("held", &(self.messages.len() - self.cursor))
            .finish_non_exhaustive()
    }
}

impl KafkaLane {
    /// # Errors
    /// A fatal [`SourceError`] when librdkafka has no queue for the partition.
    pub(crate) fn new(
        split: PartitionQueue<SpateContext>,
        consumer: Arc<BaseConsumer<SpateContext>>,
        partition: TopicPartition,
        epoch: Epoch,
        max_batch: usize,
    ) -> Result<Self, SourceError> {
        assert!(max_batch > 0, "max_batch must be positive");
        let handle = PartitionHandle::new(&consumer, partition.topic(), partition.partition())
            .ok_or_else(|| SourceError::Fatal {
                context: format!("assign {partition}"),
                message: "librdkafka has no queue for this partition".into(),
            })?;
        let mut list = TopicPartitionList::with_capacity(1);
        list.add_partition(partition.topic(), partition.partition());
        Ok(Self {
            messages: Messages::with_capacity(max_batch),
            cursor: 0,
            handle,
            _split: split,
            consumer,
            partition,
            list,
            epoch,
            max_batch,
            last_offset: None,
            error_offset: None,
            idle_asks: 0,
        })
    }

    /// The offset of the last message this lane delivered, if any.
    pub fn last_offset(&self) -> Option<Offset> {
        self.last_offset
    }
}

/// What [`next_run`] reads of a batch: librdkafka's [`Messages`], or a list
/// in the tests.
trait Batch {
    fn len(&self) -> usize;
    fn error(&self, index: usize) -> Option<KafkaError>;
    fn offset(&self, index: usize) -> Offset;
}

impl Batch for Messages {
    fn len(&self) -> usize {
        Messages::len(self)
    }
    fn error(&self, index: usize) -> Option<KafkaError> {
        Messages::error(self, index)
    }
    fn offset(&self, index: usize) -> Offset {
        Messages::offset(self, index)
    }
}

/// From `cursor`, the run of data messages of `batch` up to the next error
/// (or the batch's end), advancing `cursor` past it; an error at `cursor` is
/// returned instead, and `cursor` moves past it so the messages after it
/// follow. An offset at or below `last_offset` is a fatal error.
///
/// `error_offset` is raised to the offset of each error message met (the
/// error is in front of the run when it is returned).
fn next_run(
    batch: &impl Batch,
    cursor: &mut usize,
    last_offset: &mut Option<Offset>,
    error_offset: &mut Option<Offset>,
    partition: &TopicPartition,
) -> Result<Range<usize>, SourceError> {
    let start = *cursor;
    let mut end = start;
    while end < batch.len() {
        let failure = match batch.error(end) {
            Some(e) => {
                if end == start {
                    let at = batch.offset(end);
                    *error_offset = Some(error_offset.map_or(at, |e| e.max(at)));
                }
                Some(source_error(format!("poll {partition}"), &e))
            }
            None => {
                let offset = batch.offset(end);
                match *last_offset {
                    Some(last) if offset <= last => Some(SourceError::Fatal {
                        context: format!("poll {partition}"),
                        message: format!(
                            "offset went backwards within one assignment: {offset} after {last}"
                        ),
                    }),
                    _ => {
                        *last_offset = Some(offset);
                        None
                    }
                }
            }
        };
        if let Some(e) = failure {
            if end == start {
                *cursor = end + 1;
                return Err(e);
            }
            // The run before it goes first; the next poll meets it again.
            break;
        }
        end += 1;
    }
    *cursor = end;
    Ok(start..end)
}

/// The messages of one [`KafkaLane`] poll, borrowing the lane.
pub struct KafkaBatch<'a> {
    messages: &'a Messages,
    run: Range<usize>,
    partition: &'a TopicPartition,
}

impl fmt::Debug for KafkaBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaBatch")
            .field("partition", self.partition)
            .field("messages", &self.run.len())
            .finish()
    }
}

impl<'a> PollBatch<'a> for KafkaBatch<'a> {
    fn len(&self) -> usize {
        self.run.len()
    }

    fn payload(&self, index: usize) -> Payload<'a> {
        assert!(index < self.run.len(), "payload index out of the batch");
        let message = self.messages.view(self.run.start + index);
        Payload {
            value: message.payload,
            key: message.key,
            partition: self.partition,
            offset: message.offset,
            timestamp_ms: message.timestamp_ms,
            timestamp_kind: message.timestamp_kind,
            headers: Headers::from_source(message.headers),
        }
    }
}

impl Lane for KafkaLane {
    type Batch<'a> = KafkaBatch<'a>;

    fn partition(&self) -> &TopicPartition {
        &self.partition
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Returns up to `max_batch` messages: waits at most `timeout` for the
    /// first, then takes what is already queued.
    ///
    /// # Errors
    /// [`SourceError::Transient`] or [`SourceError::Fatal`] per the
    /// classification in `errors.rs`; an error met after some messages is
    /// returned by the following poll, and the messages after it by the
    /// polls after that.
    fn poll(&mut self, timeout: Duration) -> Result<KafkaBatch<'_>, SourceError> {
        if self.cursor >= self.messages.len() {
            self.cursor = 0;
            self.messages
                .refill(&self.handle, timeout, self.max_batch)
                .map_err(|e| source_error(format!("poll {}", self.partition), &e))?;
        }
        let run = next_run(
            &self.messages,
            &mut self.cursor,
            &mut self.last_offset,
            &mut self.error_offset,
            &self.partition,
        )?;
        debug_assert!(run.len() <= self.max_batch, "a poll exceeded max_batch");
        if !run.is_empty() {
            self.idle_asks = 0;
        }
        Ok(KafkaBatch {
            messages: &self.messages,
            run,
            partition: &self.partition,
        })
    }

    /// Pauses fetching for this lane's partition.
    ///
    /// # Errors
    /// [`SourceError::Transient`] when librdkafka refuses (the partition is
    /// not assigned).
    fn pause(&mut self) -> Result<(), SourceError> {
        self.consumer
            .pause(&self.list)
            .map_err(|e| SourceError::Transient {
                context: format!("pause {}", self.partition),
                message: e.to_string(),
            })
    }

    /// Resumes fetching for this lane's partition.
    ///
    /// # Errors
    /// [`SourceError::Transient`] when librdkafka refuses.
    fn resume(&mut self) -> Result<(), SourceError> {
        self.consumer
            .resume(&self.list)
            .map_err(|e| SourceError::Transient {
                context: format!("resume {}", self.partition),
                message: e.to_string(),
            })
    }

    /// librdkafka's application position of the partition
    /// ([`rd_kafka_position`]: "the offset of the last consumed message +
    /// 1"), when it is past the last offset this lane returned + 1.
    ///
    /// What that position is, from librdkafka 2.12's source
    /// (`rd_kafka_q_serve_rkmessages` in `rdkafka_queue.c`, the body of the
    /// batch call the lane polls with): only the application thread's
    /// dequeue moves it, to the offset + 1 of each message the call
    /// returns and of each transaction control record it dequeued and did
    /// not return (control records travel in the partition's queue in log
    /// order, `rd_kafka_op_new_ctrl_msg` in `rdkafka_msgset_reader.c`;
    /// librdkafka issue 2539, fixed in 1.4). Records of aborted transactions
    /// (under `read_committed`) and offsets removed by compaction are never
    /// queued, so the position steps over them too. Fetching, pausing and
    /// pre-fetched messages never move it; a fetch stop (revoke) and a seek
    /// reset it. So once the lane has returned every message it took, the
    /// offsets between its last one and the position hold no record this
    /// consumer will return.
    ///
    /// Two exceptions make it `None`: the lane still holds messages not
    /// returned (the position counts them), and an error message past the
    /// last returned offset (the batch call moves the position to an
    /// error's offset + 1 too, e.g. a message too large at offset X leaves
    /// it at X + 1 with X unread; a later record at or past X makes the
    /// position trustworthy again). `None` as well before the lane returned
    /// anything in this assignment (the gap's start is unknown). librdkafka
    /// is asked at the first call after the lane last returned a message and
    /// at every [`POSITION_EVERY`]th after (the others answer `None`).
    ///
    /// [`rd_kafka_position`]: https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html
    fn position(&mut self) -> Option<Offset> {
        let last = self.last_offset?;
        if self.cursor < self.messages.len() || self.error_offset.is_some_and(|e| e > last) {
            return None;
        }
        self.idle_asks = self.idle_asks.wrapping_add(1);
        if self.idle_asks != 1 && self.idle_asks % POSITION_EVERY != 0 {
            return None;
        }
        let next = crate::native::position(&self.consumer, &self.list)?;
        if next <= last + 1 {
            return None;
        }
        // Offsets below `next` are spoken for: one returned later is a
        // rewind (fatal in `next_run`), never silently delivered.
        self.last_offset = Some(next - 1);
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    /// A batch as a list: `Ok(offset)` for a message, `Err(code)` for an
    /// error message.
    struct List(Vec<Result<Offset, RDKafkaErrorCode>>);

    impl Batch for List {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn error(&self, index: usize) -> Option<KafkaError> {
            self.0[index].err().map(KafkaError::MessageConsumption)
        }
        fn offset(&self, index: usize) -> Offset {
            *self.0[index].as_ref().unwrap_or(&-1)
        }
    }

    fn runs(batch: &List, last: &mut Option<Offset>) -> Vec<Result<Range<usize>, SourceError>> {
        let tp = TopicPartition::new("t", 3);
        let mut cursor = 0;
        let mut out = Vec::new();
        while cursor < batch.len() {
            let run = next_run(batch, &mut cursor, last, &mut None, &tp);
            let fatal = matches!(run, Err(SourceError::Fatal { .. }));
            out.push(run);
            if fatal {
                break;
            }
        }
        out
    }

    #[test]
    fn an_error_inside_a_batch_comes_after_the_messages_before_it_and_before_those_after() {
        let batch = List(vec![
            Ok(10),
            Ok(11),
            Err(RDKafkaErrorCode::BrokerTransportFailure),
            Ok(12),
        ]);
        let mut last = Some(9);
        let got = runs(&batch, &mut last);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap(), &(0..2));
        match &got[1] {
            Err(SourceError::Transient { context, message }) => {
                assert_eq!(context, "poll t/3");
                assert!(!message.is_empty());
            }
            other => panic!("expected a transient error, got {other:?}"),
        }
        assert_eq!(got[2].as_ref().unwrap(), &(3..4));
        assert_eq!(last, Some(12));
    }

    #[test]
    fn an_error_first_and_a_fatal_error_are_reported_as_such() {
        let batch = List(vec![Err(RDKafkaErrorCode::TopicAuthorizationFailed), Ok(5)]);
        let got = runs(&batch, &mut None);
        assert!(matches!(got[0], Err(SourceError::Fatal { .. })), "{got:?}");
    }

    #[test]
    fn an_offset_going_backwards_is_fatal_after_the_run_before_it() {
        let batch = List(vec![Ok(7), Ok(8), Ok(8), Ok(9)]);
        let mut last = None;
        let got = runs(&batch, &mut last);
        assert_eq!(got[0].as_ref().unwrap(), &(0..2));
        match &got[1] {
            Err(SourceError::Fatal { message, .. }) => {
                assert!(message.contains("8 after 8"), "{message}");
            }
            other => panic!("expected fatal, got {other:?}"),
        }
        assert_eq!(last, Some(8));
    }
}
