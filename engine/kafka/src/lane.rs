//! A lane: one assigned partition's own librdkafka queue, polled by one
//! pipeline thread, handing out payloads that borrow librdkafka's message
//! memory (zero copy, DESIGN "Lanes").
//!
//! **How the borrow works.** rdkafka's [`PartitionQueue::poll`] returns a
//! [`BorrowedMessage`] that borrows the queue. The lane keeps the messages of
//! its last poll in a `Vec<BorrowedMessage<'q>>` next to the queue they borrow
//! from, in one [`self_cell`] (a small, widely used crate for exactly this
//! owner-plus-borrower pair), so this crate needs no `unsafe`. Each poll first
//! clears the vector, which destroys the previous poll's messages (their
//! librdkafka events), then fills it again, reusing its allocation: no payload
//! or key byte is copied, and the only per-message cost is rdkafka's own event
//! handle. The batch a poll returns borrows the lane (the seam's generic
//! associated type), so the borrow checker rejects any payload used after the
//! next poll:
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
//! [`PartitionQueue::poll`]: rdkafka::consumer::base_consumer::PartitionQueue::poll
//! [`rd_kafka_pause_partitions`]: https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::topic_partition_list::TopicPartitionList;
use spate_core::record::{Epoch, Offset, Payload, TopicPartition};
use spate_core::source::{Lane, PollBatch, SourceError};

use crate::context::SpateContext;
use crate::errors::source_error;

/// The messages of one poll, borrowing the queue they came from.
type Polled<'q> = Vec<BorrowedMessage<'q>>;

self_cell::self_cell!(
    /// A partition queue and the messages of its last poll.
    struct Held {
        owner: PartitionQueue<SpateContext>,
        #[covariant]
        dependent: Polled,
    }
);

/// One assigned partition's queue: a [`Lane`] of [`crate::KafkaSource`].
///
/// Created by the source when the partition is assigned (one epoch); dropped
/// by the pipeline when the partition is revoked. Polls never wait longer than
/// the timeout given, and the pipeline passes zero (D2).
pub struct KafkaLane {
    held: Held,
    consumer: Arc<BaseConsumer<SpateContext>>,
    partition: TopicPartition,
    /// The lane's partition as a one-element list, for pause and resume.
    list: TopicPartitionList,
    epoch: Epoch,
    max_batch: usize,
    last_offset: Option<Offset>,
    /// An error met after some messages were collected; reported by the next
    /// poll so the messages before it are delivered first.
    pending_error: Option<SourceError>,
}

impl fmt::Debug for KafkaLane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaLane")
            .field("partition", &self.partition)
            .field("epoch", &self.epoch)
            .field("last_offset", &self.last_offset)
            .field("held", &self.held.borrow_dependent().len())
            .finish_non_exhaustive()
    }
}

impl KafkaLane {
    pub(crate) fn new(
        queue: PartitionQueue<SpateContext>,
        consumer: Arc<BaseConsumer<SpateContext>>,
        partition: TopicPartition,
        epoch: Epoch,
        max_batch: usize,
    ) -> Self {
        assert!(max_batch > 0, "max_batch must be positive");
        let mut list = TopicPartitionList::with_capacity(1);
        list.add_partition(partition.topic(), partition.partition());
        Self {
            held: Held::new(queue, |_| Vec::with_capacity(max_batch)),
            consumer,
            partition,
            list,
            epoch,
            max_batch,
            last_offset: None,
            pending_error: None,
        }
    }

    /// The offset of the last message this lane delivered, if any.
    pub fn last_offset(&self) -> Option<Offset> {
        self.last_offset
    }
}

/// Clears `polled` (destroying the previous poll's messages) and fills it with
/// up to `max` messages, waiting at most `timeout` for the first one. Returns
/// the error that stopped it early, if any.
fn fill<'q>(
    queue: &'q PartitionQueue<SpateContext>,
    polled: &mut Polled<'q>,
    timeout: Duration,
    max: usize,
    partition: &TopicPartition,
    last_offset: &mut Option<Offset>,
) -> Option<SourceError> {
    polled.clear();
    let mut wait = timeout;
    while polled.len() < max {
        match queue.poll(wait) {
            None => break,
            Some(Ok(message)) => {
                let offset = message.offset();
                if let Some(last) = *last_offset {
                    if offset <= last {
                        return Some(SourceError::Fatal {
                            context: format!("poll {partition}"),
                            message: format!(
                                "offset went backwards within one assignment: {offset} after {last}"
                            ),
                        });
                    }
                }
                *last_offset = Some(offset);
                polled.push(message);
            }
            Some(Err(e)) => return Some(source_error(format!("poll {partition}"), &e)),
        }
        wait = Duration::ZERO;
    }
    None
}

/// The messages of one [`KafkaLane`] poll, borrowing the lane.
#[derive(Debug)]
pub struct KafkaBatch<'a> {
    messages: &'a [BorrowedMessage<'a>],
    partition: &'a TopicPartition,
}

impl<'a> PollBatch<'a> for KafkaBatch<'a> {
    fn len(&self) -> usize {
        self.messages.len()
    }

    fn payload(&self, index: usize) -> Payload<'a> {
        let message: &'a BorrowedMessage<'a> = &self.messages[index];
        Payload {
            value: message.payload(),
            key: message.key(),
            partition: self.partition,
            offset: message.offset(),
            timestamp_ms: message.timestamp().to_millis(),
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
    /// classification in `errors.rs`; an error met after some messages were
    /// collected is returned by the following poll.
    fn poll(&mut self, timeout: Duration) -> Result<KafkaBatch<'_>, SourceError> {
        if let Some(e) = self.pending_error.take() {
            self.held.with_dependent_mut(|_, polled| polled.clear());
            return Err(e);
        }
        let (max, partition, last_offset) =
            (self.max_batch, &self.partition, &mut self.last_offset);
        let error = self.held.with_dependent_mut(|queue, polled| {
            fill(queue, polled, timeout, max, partition, last_offset)
        });
        if let Some(e) = error {
            if self.held.borrow_dependent().is_empty() {
                return Err(e);
            }
            self.pending_error = Some(e);
        }
        let messages = self.held.borrow_dependent();
        debug_assert!(
            messages.len() <= self.max_batch,
            "a poll exceeded max_batch"
        );
        Ok(KafkaBatch {
            messages,
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
}
