//! Batch consumption from one partition's librdkafka queue: the only
//! `unsafe` in this crate: the batch poll, the lane's position and a
//! bounded commit.
//!
//! **Why not rdkafka's safe `PartitionQueue::poll`.** It pops one message per
//! call through librdkafka's event API: per message it reads the clock four
//! times (`Instant::now` in rdkafka, `rd_timeout_init`, `rd_kafka_app_poll_start`,
//! `rd_kafka_app_polled`), takes the queue lock and allocates an `Arc` for the
//! event. In a profile of `spate demo --rows 1000000` that was 60% of the
//! pipeline threads' CPU, twice the JSON -> RowBinary work. librdkafka's batch
//! call [`rd_kafka_consume_batch_queue`] pops up to N messages with one clock
//! read and one application-position update per call, and hands out the
//! messages themselves (`rd_kafka_message_t`), which stay valid until
//! [`rd_kafka_message_destroy`]. See the librdkafka API reference,
//! <https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html>
//! ("rd_kafka_consume_batch_queue").
//!
//! **Ownership.** [`PartitionHandle`] is a reference of its own on the
//! partition's queue (librdkafka counts them; the queue's forwarding was
//! already disabled by rdkafka's `split_partition_queue`, which the lane keeps
//! alive next to it). [`Messages`] owns the messages of the last batch and
//! destroys them when it is refilled or dropped; every view it hands out
//! borrows it, so no payload outlives its message.
#![allow(unsafe_code)]

use std::ffi::{CString, c_int};
use std::ptr::NonNull;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use spate_core::record::{Header, HeaderSource, TimestampKind};

/// A reference on one partition's fetch queue.
pub(crate) struct PartitionHandle {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
}

// SAFETY: librdkafka queues are internally locked and may be used from any
// thread; the handle is only a counted reference to one.
unsafe impl Send for PartitionHandle {}

impl PartitionHandle {
    /// A new reference on the queue of `topic` / `partition` of `consumer`,
    /// or `None` when librdkafka knows no such partition (or the topic name
    /// holds a NUL byte).
    pub(crate) fn new<C: ConsumerContext>(
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
    ) -> Option<Self> {
        let topic = CString::new(topic).ok()?;
        // SAFETY: the client pointer is valid while `consumer` is borrowed;
        // librdkafka copies nothing from `topic` past the call.
        let queue = unsafe {
            rdsys::rd_kafka_queue_get_partition(
                consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
            )
        };
        NonNull::new(queue).map(|queue| Self { queue })
    }
}

impl Drop for PartitionHandle {
    fn drop(&mut self) {
        // SAFETY: the pointer came from rd_kafka_queue_get_partition and is
        // released exactly once, here.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

/// The messages of the last batch taken from a [`PartitionHandle`].
pub(crate) struct Messages {
    batch: Vec<NonNull<rdsys::rd_kafka_message_t>>,
}

// SAFETY: the messages are owned by this value alone (librdkafka does not touch
// a message between handing it out and its destroy); librdkafka allows
// destroying a message from any thread.
unsafe impl Send for Messages {}

/// One message of a batch as the lane reads it, borrowing [`Messages`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct MessageView<'a> {
    pub(crate) payload: Option<&'a [u8]>,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) offset: i64,
    /// Milliseconds since the epoch (create or log-append time), `None` when
    /// the broker sent none.
    pub(crate) timestamp_ms: Option<i64>,
    /// Which time `timestamp_ms` is.
    pub(crate) timestamp_kind: TimestampKind,
    /// The message itself, for its headers (parsed on first read).
    pub(crate) headers: &'a MessageHeaders,
}

/// A librdkafka message seen as its headers: librdkafka parses a message's
/// headers on the first `rd_kafka_message_headers` call and keeps them with
/// the message (that parse allocates inside librdkafka), so a mapping that
/// reads no header never pays for it. See the librdkafka API reference,
/// <https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html>
/// ("rd_kafka_message_headers", "rd_kafka_header_get_all").
#[repr(transparent)]
pub(crate) struct MessageHeaders(rdsys::rd_kafka_message_t);

impl MessageHeaders {
    fn of(message: &rdsys::rd_kafka_message_t) -> &MessageHeaders {
        // SAFETY: `MessageHeaders` is a transparent wrapper of the message
        // struct, so the reference keeps its layout and lifetime.
        unsafe { &*std::ptr::from_ref(message).cast::<MessageHeaders>() }
    }

    fn list(&self) -> *const rdsys::rd_kafka_headers_t {
        let mut list: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: the message is alive for the borrow of `self` (it is owned
        // by `Messages`, which only a `&mut` borrow destroys); librdkafka
        // writes `list` (or leaves it null) and keeps the parsed list with
        // the message. Only the lane's thread reads its messages (the type
        // is not Sync), so the lazy parse is never concurrent.
        let err = unsafe { rdsys::rd_kafka_message_headers(&self.0, &mut list) };
        if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            list
        } else {
            // RD_KAFKA_RESP_ERR__NOENT: the message has no headers.
            std::ptr::null()
        }
    }
}

impl std::fmt::Debug for MessageHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageHeaders")
            .field("count", &self.count())
            .finish()
    }
}

impl HeaderSource for MessageHeaders {
    fn count(&self) -> usize {
        let list = self.list();
        if list.is_null() {
            return 0;
        }
        // SAFETY: a live header list of a live message.
        unsafe { rdsys::rd_kafka_header_cnt(list) }
    }

    fn get(&self, index: usize) -> Option<Header<'_>> {
        let list = self.list();
        if list.is_null() {
            return None;
        }
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut value: *const std::ffi::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: a live header list; librdkafka writes the three outputs,
        // which point into the list (alive with the message).
        let err = unsafe {
            rdsys::rd_kafka_header_get_all(list, index, &mut name, &mut value, &mut size)
        };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return None;
        }
        // SAFETY: librdkafka's header names are NUL-terminated and live
        // with the list.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
        Some(Header {
            name,
            // SAFETY: `size` bytes at `value`, alive with the list; null
            // for a null value.
            value: unsafe { bytes(value.cast(), size) },
        })
    }
}

impl Messages {
    /// Room for `capacity` messages per batch.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            batch: Vec::with_capacity(capacity),
        }
    }

    /// Messages in the current batch, error messages included.
    pub(crate) fn len(&self) -> usize {
        self.batch.len()
    }

    /// Destroys the current batch.
    pub(crate) fn clear(&mut self) {
        for message in self.batch.drain(..) {
            // SAFETY: each pointer came from rd_kafka_consume_batch_queue and
            // is destroyed once; the views borrowing it ended with the borrow
            // of `self` that `clear` needs.
            unsafe { rdsys::rd_kafka_message_destroy(message.as_ptr()) }
        }
    }

    /// Destroys the current batch and takes up to `max` messages (at most the
    /// capacity) from `queue`: waits at most `timeout` for the first, then
    /// takes only what is already there.
    ///
    /// # Errors
    /// The librdkafka error when the call itself fails (the batch is then
    /// empty); errors about the partition arrive as messages, see
    /// [`Messages::error`].
    pub(crate) fn refill(
        &mut self,
        queue: &PartitionHandle,
        timeout: Duration,
        max: usize,
    ) -> Result<(), KafkaError> {
        self.clear();
        let max = max.min(self.batch.capacity());
        if max == 0 {
            return Ok(());
        }
        // librdkafka's batch call waits up to its timeout until the batch is
        // full, so a wait is spent on the first message alone.
        if !timeout.is_zero() {
            self.take(queue, timeout, 1)?;
            if self.batch.is_empty() {
                return Ok(());
            }
        }
        self.take(queue, Duration::ZERO, max)
    }

    /// Appends up to `max - len` messages.
    fn take(
        &mut self,
        queue: &PartitionHandle,
        timeout: Duration,
        max: usize,
    ) -> Result<(), KafkaError> {
        let have = self.batch.len();
        let room = max.saturating_sub(have);
        if room == 0 {
            return Ok(());
        }
        let timeout_ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: the spare capacity holds at least `room` pointers (`max` is
        // at most the capacity); librdkafka writes at most `room` of them and
        // returns how many it wrote, or -1 having written none.
        let got = unsafe {
            let out = self
                .batch
                .as_mut_ptr()
                .add(have)
                .cast::<*mut rdsys::rd_kafka_message_t>();
            rdsys::rd_kafka_consume_batch_queue(queue.queue.as_ptr(), timeout_ms, out, room)
        };
        if got < 0 {
            // SAFETY: reads librdkafka's thread-local last error; no pointers.
            let code = unsafe { rdsys::rd_kafka_last_error() };
            return Err(KafkaError::MessageConsumption(RDKafkaErrorCode::from(code)));
        }
        let got = usize::try_from(got).unwrap_or(0).min(room);
        // SAFETY: librdkafka initialised `got` non-null message pointers right
        // after the `have` already there (NonNull has the pointer's layout).
        unsafe { self.batch.set_len(have + got) };
        Ok(())
    }

    fn raw(&self, index: usize) -> &rdsys::rd_kafka_message_t {
        // SAFETY: the message is alive until `clear`, which needs `&mut self`,
        // so it outlives this shared borrow.
        unsafe { self.batch[index].as_ref() }
    }

    /// The error carried by message `index` in place of data, if any, as
    /// rdkafka reports it from its own poll (`PartitionEOF` for the end of
    /// the partition, `MessageConsumption` otherwise).
    pub(crate) fn error(&self, index: usize) -> Option<KafkaError> {
        let message = self.raw(index);
        match message.err {
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => None,
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                Some(KafkaError::PartitionEOF(message.partition))
            }
            code => Some(KafkaError::MessageConsumption(code.into())),
        }
    }

    /// Message `index`'s offset (also set on most error messages).
    pub(crate) fn offset(&self, index: usize) -> i64 {
        self.raw(index).offset
    }

    /// Message `index` (which must carry no error) as borrowed bytes.
    pub(crate) fn view(&self, index: usize) -> MessageView<'_> {
        let message = self.raw(index);
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: the message is alive (see `raw`); librdkafka writes `kind`.
        let timestamp = unsafe { rdsys::rd_kafka_message_timestamp(message, &mut kind) };
        let timestamp_ms = (kind
            != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
            && timestamp != -1)
            .then_some(timestamp);
        let timestamp_kind = match (timestamp_ms, kind) {
            (None, _) => TimestampKind::None,
            (Some(_), rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME) => {
                TimestampKind::LogAppendTime
            }
            (Some(_), _) => TimestampKind::CreateTime,
        };
        MessageView {
            // SAFETY: librdkafka's payload and key are `len` / `key_len` bytes
            // owned by the message, alive as long as the borrow of `self`.
            payload: unsafe { bytes(message.payload.cast_const().cast(), message.len) },
            // SAFETY: as above.
            key: unsafe { bytes(message.key.cast_const().cast(), message.key_len) },
            offset: message.offset,
            timestamp_ms,
            timestamp_kind,
            headers: MessageHeaders::of(message),
        }
    }
}

/// # Safety
/// `ptr` is null or points to `len` initialised bytes that live for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: per this function's contract.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

impl Drop for Messages {
    fn drop(&mut self) {
        self.clear();
    }
}

/// librdkafka's application position ([`rd_kafka_position`]) of the
/// partitions in `list`, written into it; the first one's offset when it is
/// a real offset (not `OFFSET_INVALID`, no error). The lane passes its
/// one-element list, so nothing is allocated.
///
/// [`rd_kafka_position`]: https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html
pub(crate) fn position<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    list: &rdkafka::TopicPartitionList,
) -> Option<i64> {
    let native = list.ptr();
    // SAFETY: both pointers are valid while `consumer` and `list` are
    // borrowed; librdkafka writes only the offset, leader epoch and error of
    // the list's existing elements.
    let err = unsafe { rdsys::rd_kafka_position(consumer.client().native_ptr(), native) };
    if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return None;
    }
    // SAFETY: `native` points to a live list; `elems` holds `cnt` elements.
    let first = unsafe {
        let l = &*native;
        if l.cnt < 1 {
            return None;
        }
        &*l.elems
    };
    (first.err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && first.offset >= 0)
        .then_some(first.offset)
}

/// One offset commit sent with `rd_kafka_commit_queue` to a queue of our
/// own, whose answer is waited for with a timeout (librdkafka's synchronous
/// commit waits without one). See the librdkafka API reference
/// <https://docs.confluent.io/platform/current/clients/librdkafka/html/rdkafka_8h.html>
/// ("rd_kafka_commit_queue"). Dropping it destroys the queue; an answer
/// that arrives later is dropped by librdkafka, the commit itself goes on.
pub(crate) struct Commit {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
}

// SAFETY: librdkafka queues are internally locked and may be used from any
// thread; the handle is only our reference to one.
unsafe impl Send for Commit {}

impl Commit {
    /// Sends the commit of `list` (explicit offsets).
    ///
    /// # Errors
    /// [`KafkaError::ConsumerCommit`] when librdkafka refuses to send it
    /// (no consumer group).
    pub(crate) fn send<C: ConsumerContext>(
        consumer: &BaseConsumer<C>,
        list: &rdkafka::TopicPartitionList,
    ) -> Result<Commit, KafkaError> {
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is valid while `consumer` is borrowed; librdkafka
        // copies `list` inside the call.
        let queue = NonNull::new(unsafe { rdsys::rd_kafka_queue_new(rk) })
            .ok_or(KafkaError::ConsumerCommit(RDKafkaErrorCode::Fail))?;
        let commit = Commit { queue };
        // SAFETY: as above; the queue is ours until `commit` drops.
        let err = unsafe {
            rdsys::rd_kafka_commit_queue(rk, list.ptr(), queue.as_ptr(), None, std::ptr::null_mut())
        };
        if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(commit)
        } else {
            Err(KafkaError::ConsumerCommit(err.into()))
        }
    }

    /// Waits at most `timeout` for the answer: `None` when there is none
    /// yet; else the commit's error as `rd_kafka_commit` would return it
    /// synchronously (the same reply's error). Call it until it answers,
    /// not after.
    pub(crate) fn answer(&self, timeout: Duration) -> Option<Result<(), KafkaError>> {
        let timeout_ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: the queue is ours; the event, when one arrives, is ours
        // until destroyed here.
        let err = unsafe {
            let event = rdsys::rd_kafka_queue_poll(self.queue.as_ptr(), timeout_ms);
            if event.is_null() {
                return None;
            }
            let err = rdsys::rd_kafka_event_error(event);
            rdsys::rd_kafka_event_destroy(event);
            err
        };
        Some(
            if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                Ok(())
            } else {
                Err(KafkaError::ConsumerCommit(err.into()))
            },
        )
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        // SAFETY: the queue came from rd_kafka_queue_new and is destroyed once.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}
