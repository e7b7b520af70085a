//! The record seam: what a source hands the chain.
//!
//! A [`Payload`] borrows its bytes from the lane that polled it and stays valid
//! until that lane's next poll (zero copy, DESIGN "Lanes"). Offsets are
//! Kafka-style `i64` positions within one partition; epochs number the
//! assignments of a partition to this process, so acks from an earlier
//! assignment can never move a later one's watermark (D1).

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// A position in one partition's log, as Kafka numbers it (`i64`, starting at 0).
pub type Offset = i64;

/// The number of one assignment of a partition to this process. A partition that
/// is revoked and assigned again gets a larger epoch; acks carry the epoch they
/// were issued under.
pub type Epoch = u64;

/// A topic and a partition number: the unit Kafka assigns, orders and commits.
///
/// Cloning is cheap (the topic name is shared). Ordering is by topic, then
/// partition, so maps keyed by it iterate deterministically (D7).
#[derive(Clone, Debug)]
pub struct TopicPartition {
    topic: Arc<str>,
    partition: i32,
}

impl TopicPartition {
    /// A topic-partition pair; `partition` is Kafka's partition number (>= 0).
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        let topic = topic.into();
        debug_assert!(partition >= 0, "Kafka partition numbers are non-negative");
        Self { topic, partition }
    }

    /// The topic name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partition number within the topic.
    pub fn partition(&self) -> i32 {
        self.partition
    }
}

impl PartialEq for TopicPartition {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for TopicPartition {}

impl std::hash::Hash for TopicPartition {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.topic.hash(state);
        self.partition.hash(state);
    }
}

impl PartialOrd for TopicPartition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TopicPartition {
    /// By topic, then partition. Handles of one topic usually share the name's
    /// allocation, so the common case compares a pointer instead of bytes
    /// (the tracker looks a partition up on every ack).
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        let topic = if Arc::ptr_eq(&self.topic, &other.topic) {
            Ordering::Equal
        } else {
            self.topic.cmp(&other.topic)
        };
        topic.then(self.partition.cmp(&other.partition))
    }
}

impl fmt::Display for TopicPartition {
    /// Formats as `topic/partition`, the form used in logs and error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}

/// One message as polled from a lane, borrowed from the lane's memory.
///
/// Valid until the next poll of the lane that produced it; the chain must copy
/// (encode) what it keeps before then.
#[derive(Clone, Copy, Debug)]
pub struct Payload<'a> {
    /// The message value; `None` for a Kafka tombstone (null value).
    pub value: Option<&'a [u8]>,
    /// The message key, if the producer set one.
    pub key: Option<&'a [u8]>,
    /// The partition the message was read from.
    pub partition: &'a TopicPartition,
    /// The message's offset in its partition.
    pub offset: Offset,
    /// The message timestamp in milliseconds since the Unix epoch, if present.
    pub timestamp_ms: Option<i64>,
}

impl Payload<'_> {
    /// The value bytes, or an empty slice for a tombstone.
    pub fn bytes(&self) -> &[u8] {
        self.value.unwrap_or(&[])
    }
}
