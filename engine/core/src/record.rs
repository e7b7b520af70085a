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
    /// What `timestamp_ms` is: the producer's create time or the broker's
    /// log-append time ([`TimestampKind::None`] when there is none).
    pub timestamp_kind: TimestampKind,
    /// The message's headers, borrowed like the value ([`Headers::NONE`]
    /// for sources without headers).
    pub headers: Headers<'a>,
}

/// Which clock a message timestamp comes from: the topic's
/// `message.timestamp.type` (Kafka's record batch attribute bit 3,
/// <https://kafka.apache.org/documentation/#recordbatch>).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimestampKind {
    /// No timestamp (a pre-0.10 message format, or a source without one).
    #[default]
    None,
    /// Set by the producer (`CreateTime`).
    CreateTime,
    /// Set by the broker when it appended the message (`LogAppendTime`).
    LogAppendTime,
}

impl TimestampKind {
    /// Kafka's name for it, as the Java client's `TimestampType` prints it:
    /// `NoTimestampType`, `CreateTime`, `LogAppendTime`.
    pub fn name(self) -> &'static str {
        match self {
            TimestampKind::None => "NoTimestampType",
            TimestampKind::CreateTime => "CreateTime",
            TimestampKind::LogAppendTime => "LogAppendTime",
        }
    }

    /// Kafka's number for it (the Java client's `TimestampType.id`): -1, 0, 1.
    pub fn id(self) -> i8 {
        match self {
            TimestampKind::None => -1,
            TimestampKind::CreateTime => 0,
            TimestampKind::LogAppendTime => 1,
        }
    }
}

/// One message header: a name and a value that Kafka allows to be null
/// (<https://kafka.apache.org/documentation/#recordheader>). Names are
/// UTF-8 in Kafka; they are kept as bytes here, as sources hand them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    /// The header's name (key).
    pub name: &'a [u8],
    /// Its value; `None` for a null value.
    pub value: Option<&'a [u8]>,
}

/// A source's own header storage, read through [`Headers`]: the Kafka lane
/// implements it over librdkafka's message, so headers are only parsed when
/// someone reads them.
pub trait HeaderSource {
    /// How many headers the message has.
    fn count(&self) -> usize;
    /// Header `index` (`0..count()`), in the order the producer added
    /// them; `None` past the end.
    fn get(&self, index: usize) -> Option<Header<'_>>;
}

/// The headers of one message, borrowed from the source (no copy, no
/// allocation by spate; a message with repeated names keeps them all, in
/// order). Cheap to copy.
#[derive(Clone, Copy)]
pub struct Headers<'a> {
    repr: HeadersRepr<'a>,
}

#[derive(Clone, Copy)]
enum HeadersRepr<'a> {
    None,
    Slice(&'a [Header<'a>]),
    Source(&'a dyn HeaderSource),
}

impl<'a> Headers<'a> {
    /// No headers.
    pub const NONE: Headers<'static> = Headers {
        repr: HeadersRepr::None,
    };

    /// Headers held in a slice (tests, copying sources).
    pub fn from_slice(headers: &'a [Header<'a>]) -> Self {
        Headers {
            repr: HeadersRepr::Slice(headers),
        }
    }

    /// Headers read through a source's own storage.
    pub fn from_source(source: &'a dyn HeaderSource) -> Self {
        Headers {
            repr: HeadersRepr::Source(source),
        }
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        match self.repr {
            HeadersRepr::None => 0,
            HeadersRepr::Slice(s) => s.len(),
            HeadersRepr::Source(s) => s.count(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Header `index`, in the producer's order.
    pub fn get(&self, index: usize) -> Option<Header<'a>> {
        match self.repr {
            HeadersRepr::None => None,
            HeadersRepr::Slice(s) => s.get(index).copied(),
            HeadersRepr::Source(s) => s.get(index),
        }
    }

    /// The headers in the producer's order.
    pub fn iter(&self) -> impl Iterator<Item = Header<'a>> + 'a {
        let this = *self;
        (0..this.len()).map_while(move |i| this.get(i))
    }

    /// The last header named `name` (Kafka's `Headers.lastHeader`), if any.
    pub fn last(&self, name: &[u8]) -> Option<Header<'a>> {
        (0..self.len())
            .rev()
            .filter_map(|i| self.get(i))
            .find(|h| h.name == name)
    }
}

impl Default for Headers<'_> {
    fn default() -> Self {
        Headers::NONE
    }
}

impl fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Payload<'_> {
    /// The value bytes, or an empty slice for a tombstone.
    pub fn bytes(&self) -> &[u8] {
        self.value.unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that counts its reads, as the Kafka lane's lazy headers.
    struct Counted<'h>(&'h [Header<'h>], std::cell::Cell<usize>);

    impl HeaderSource for Counted<'_> {
        fn count(&self) -> usize {
            self.1.set(self.1.get() + 1);
            self.0.len()
        }
        fn get(&self, index: usize) -> Option<Header<'_>> {
            self.0.get(index).copied()
        }
    }

    #[test]
    fn headers_keep_order_and_repeats_and_find_the_last_by_name() {
        let hs = [
            Header {
                name: b"a",
                value: Some(b"1"),
            },
            Header {
                name: b"b",
                value: None,
            },
            Header {
                name: b"a",
                value: Some(b"2"),
            },
        ];
        let counted = Counted(&hs, std::cell::Cell::new(0));
        for h in [Headers::from_slice(&hs), Headers::from_source(&counted)] {
            assert_eq!(h.len(), 3);
            assert_eq!(h.iter().collect::<Vec<_>>(), hs);
            assert_eq!(h.last(b"a").and_then(|h| h.value), Some(&b"2"[..]));
            assert_eq!(h.last(b"b").map(|h| h.value), Some(None));
            assert_eq!(h.last(b"c"), None);
            assert_eq!(h.get(3), None);
        }
        assert!(counted.1.get() > 0, "read through the source");
        assert!(Headers::NONE.is_empty());
        assert_eq!(Headers::NONE.iter().count(), 0);
        assert_eq!(Headers::default().last(b"a"), None);
        assert_eq!(format!("{:?}", Headers::NONE), "[]");
    }

    #[test]
    fn timestamp_kinds_use_kafkas_names_and_ids() {
        assert_eq!(TimestampKind::None.name(), "NoTimestampType");
        assert_eq!(TimestampKind::CreateTime.name(), "CreateTime");
        assert_eq!(TimestampKind::LogAppendTime.name(), "LogAppendTime");
        assert_eq!(
            [
                TimestampKind::None,
                TimestampKind::CreateTime,
                TimestampKind::LogAppendTime
            ]
            .map(TimestampKind::id),
            [-1, 0, 1]
        );
    }
}
