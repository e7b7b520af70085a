//! [`KafkaSource`]: one rdkafka `BaseConsumer` per process, subscribed to the
//! configured topics, handing out one [`KafkaLane`] per assigned partition and
//! committing the offsets the controller gives it.
//!
//! # Rebalance: the controller commits before the rebalance completes
//!
//! librdkafka's rebalance events are served by the consumer poll in
//! [`KafkaSource::poll_event`]; the context (`context.rs`) only records them.
//! librdkafka then waits, still heart-beating, until the application calls
//! `assign`/`unassign` (its "wait assign call" states). spate uses that wait:
//!
//! - **Assign** (epoch `n + 1` for each partition): split the partition's
//!   queue first ([`BaseConsumer::split_partition_queue`], so not one message
//!   reaches the shared consumer queue), then call `assign` (eager) or
//!   `incremental_assign` (cooperative). Fetching starts at the committed
//!   offset, or at `auto.offset.reset` when there is none. Then the committed
//!   offsets are checked against the partitions' watermarks: one out of range
//!   is logged at error level and counted (`offsets.rs`), never reset
//!   silently.
//! - **Revoke**: emit [`AssignmentEvent::Revoked`] for every revoked partition
//!   and do *not* unassign. The controller stops the lanes, waits (bounded by
//!   `rebalance.drain_timeout`) for their acks, commits what is committable
//!   through [`Source::commit`] (the member still belongs to the old
//!   generation, so the broker accepts it), and calls [`Source::release`] for
//!   each partition. When the last revoked partition is released, the source
//!   calls `unassign` (eager) or `incremental_unassign` (cooperative) and the
//!   rebalance completes.
//!
//! **D1.** The source commits only what the controller passes, which the
//! tracker derived from acknowledged data; it refuses offsets of an epoch it
//! does not own ([`SourceError::CommitRejected`]), and it never commits on its
//! own (auto-commit and offset store are owned off, `config.rs`). What did not
//! settle within the drain timeout is simply not committed: the next owner
//! re-reads it.
//!
//! **Limits.** The deferral holds the whole group's rebalance for the drain
//! (eager protocol: every member stops; cooperative: only the moved
//! partitions), so `rebalance.drain_timeout` must stay well below
//! `max.poll.interval.ms` (librdkafka's rebalance timeout, 300 s by default),
//! or the broker evicts this member; its later commits are then rejected,
//! which costs re-reads, never loss. A lost assignment (session timeout) is
//! revoked the same way, and its commits fail as rejected.
//!
//! # Shutdown
//!
//! Dropping the source closes the consumer: it marks the context as closing
//! (from then on rebalances are applied at once), finishes a pending revoke,
//! and serves the consumer queue until librdkafka reports the consumer closed,
//! for at most [`CLOSE_TIMEOUT`]. With nothing assigned (empty topic, group
//! never joined) that takes milliseconds.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram};
use rdkafka::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::topic_partition_list::{Offset as KafkaOffset, TopicPartitionList};
use spate_core::record::{Epoch, Offset, TopicPartition};
use spate_core::source::{AssignmentEvent, CommitOffset, Committed, Source, SourceError};

use crate::config::{ConfigError, KafkaSourceConfig};
use crate::context::{Rebalance, Shared, SpateContext};
use crate::errors;
use crate::lag::LagReader;
use crate::lane::KafkaLane;
use crate::offsets;
use crate::{ASSIGNED, ASSIGNED_PARTITIONS, LAST_PROGRESS, REBALANCES, SOURCE_ERRORS};

/// Bound on the consumer-queue events one [`KafkaSource::poll_event`] serves
/// before returning, so the controller's loop keeps turning even when
/// librdkafka has a backlog of statistics or errors.
const MAX_EVENTS_PER_POLL: usize = 64;

/// How long dropping a [`KafkaSource`] waits for librdkafka to close the
/// consumer (leave the group, finish the last rebalance) before giving up and
/// leaving the rest to librdkafka's own destructor.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`Source::commit`] waits for the group coordinator's answer.
/// librdkafka's own synchronous commit waits without bound: with every
/// broker down it held the controller (and so `/readyz`, the error metrics
/// and the ack channel) for as long as the outage, up to
/// `socket.timeout.ms`. After this the commit counts as failed
/// ([`SourceError::Transient`], retried next interval) and no other commit
/// is sent until librdkafka answers it (each later call fails at once
/// instead of waiting again); librdkafka may still complete it, which
/// commits an offset that was safe to commit (D1).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a transient consumer error keeps [`Source::consumer_ready`]
/// false unless an assignment arrives first: librdkafka's default
/// `reconnect.backoff.max.ms` (10 s), so a broker that stays away keeps
/// reporting within the window and readiness stays off, while one error
/// that librdkafka recovered from clears by itself.
pub const CONSUMER_ERROR_HOLD: Duration = Duration::from_secs(10);

/// How much longer than `session.timeout.ms` a join (from the subscribe,
/// or from the end of a revoke that left nothing assigned, to the next
/// assignment) may take before [`Source::consumer_ready`] reads false: a
/// join normally ends within one session timeout (a member that left
/// without a LeaveGroup is dropped by then), so one that takes longer is
/// stuck, and `/readyz` says so (issue 31).
pub const JOIN_GRACE: Duration = Duration::from_secs(15);

/// librdkafka's default `session.timeout.ms`.
const DEFAULT_SESSION_TIMEOUT_MS: u64 = 45_000;

/// How long closing a source that has not yet been given its first
/// assignment waits for the join to end before it closes the consumer. A
/// LeaveGroup sent while the JoinGroup is outstanding is held back behind
/// it and times out, so the group keeps the departed member until its
/// session expires and the next start waits that long for its partitions;
/// once the join has ended, the close leaves the group cleanly. Bounded:
/// a stop never waits longer than this for it (issue 31).
pub const JOIN_WAIT_AT_CLOSE: Duration = Duration::from_secs(5);

/// A revoke waiting for the controller to release its partitions.
#[derive(Debug)]
struct Revoking {
    /// Partitions (and the epochs being revoked) not yet released.
    waiting: BTreeSet<(TopicPartition, Epoch)>,
    /// The revoked partitions as librdkafka listed them.
    partitions: TopicPartitionList,
    cooperative: bool,
}

/// The Kafka [`Source`]: one consumer, a lane per assigned partition.
///
/// Build it with [`KafkaSource::new`]; hand it to
/// `spate_core::pipeline::Pipeline::builder`. Semantics of the underlying
/// consumer: [librdkafka's consumer
/// API](https://github.com/confluentinc/librdkafka/blob/master/INTRODUCTION.md#high-level-kafkaconsumer).
pub struct KafkaSource {
    /// A commit that got no answer within [`COMMIT_TIMEOUT`], and when it
    /// was sent: no other is sent until it answers. First, so its queue is
    /// destroyed before the consumer.
    unanswered: Option<(crate::native::Commit, Instant)>,
    consumer: Arc<BaseConsumer<SpateContext>>,
    shared: Arc<Shared>,
    max_batch: usize,
    group: String,
    /// Events ready for the controller, oldest first.
    ready: VecDeque<AssignmentEvent<KafkaLane>>,
    /// The last epoch issued per partition; never forgotten, so epochs only
    /// grow for the life of the process.
    epochs: BTreeMap<TopicPartition, Epoch>,
    /// Partitions owned now (assigned, and not yet released after a revoke).
    owned: BTreeMap<TopicPartition, Epoch>,
    revoking: Option<Revoking>,
    /// D1 guard: offsets a commit of the partition may not pass (a message
    /// that reached the shared queue instead of its lane, never delivered).
    ceilings: BTreeMap<TopicPartition, Offset>,
    transient_errors: Counter,
    /// `spate_consumer_rebalances_total{kind="assigned"}` and
    /// `{kind="revoked"}`.
    assigned_events: Counter,
    revoked_events: Counter,
    /// `spate_consumer_assigned_partitions`: `owned.len()`.
    assigned_partitions: Gauge,
    /// `spate_commit_duration_seconds`: one record per successful commit.
    commit_duration: Histogram,
    /// `spate_last_commit_timestamp_seconds{topic,partition}`, registered
    /// at a partition's first successful commit.
    commit_stamps: BTreeMap<TopicPartition, Gauge>,
    /// The text of the last transient consumer error, for `/readyz`.
    last_error_text: String,
    /// When the consumer last reported a transient error; cleared by an
    /// assignment. Read by [`Source::consumer_ready`].
    last_error: Option<std::time::Instant>,
    /// A fatal error met outside `poll_event` (in `release`, whose errors the
    /// controller only logs), reported by the next `poll_event`.
    deferred: Option<SourceError>,
    /// The subscription's `^regex` entries: one that matches no topic yet
    /// is waited for, not an error (see [`pattern_waiting`]).
    patterns: Vec<String>,
    /// `topic.metadata.refresh.interval.ms` as configured (librdkafka's
    /// default otherwise): how often a pattern is re-evaluated.
    metadata_refresh: String,
    /// `auto.offset.reset` as librdkafka applies it (its default `largest`
    /// when unset), for the out-of-range report.
    reset_policy: String,
    /// Out-of-range committed offsets not yet taken by the controller.
    offset_resets: Vec<spate_core::source::OffsetReset>,
    /// [`crate::KafkaSourceConfig::committed_required`].
    committed_required: bool,
    closed: bool,
    /// The group's lag from the brokers' side (`lag.rs`), when
    /// `lag_interval` is set; published on each `poll_event`.
    lag: Option<LagReader>,
    /// Since when this member waits for an assignment: from the subscribe,
    /// and again from a revoke that left it nothing; `None` once assigned.
    joining_since: Option<Instant>,
    /// Whether any assignment (an empty one included) ever arrived.
    ever_assigned: bool,
    /// `session.timeout.ms` + [`JOIN_GRACE`]: a longer join is not ready.
    join_limit: Duration,
    /// `spate_last_progress_timestamp_seconds`, and when that was.
    progress: Gauge,
    last_progress: Instant,
    /// The last committed offset per partition known here (the group's at
    /// assignment, then each commit): a commit past it is progress.
    progress_offsets: BTreeMap<TopicPartition, i64>,
    /// `spate_assigned_partitions`: `owned.len()`.
    assigned: Gauge,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("group", &self.group)
            .field("owned", &self.owned)
            .field("revoking", &self.revoking)
            .field("ready", &self.ready.len())
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Validates `config`, creates the consumer and subscribes. Joining the
    /// group happens in the background and is observed through
    /// [`Source::poll_event`] (about 3 s against librdkafka's mock cluster).
    ///
    /// # Errors
    /// [`ConfigError`] for an invalid config (an owned key, a missing
    /// `bootstrap.servers` or `group.id`), or when librdkafka refuses a
    /// property or the subscription.
    pub fn new(config: KafkaSourceConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut client = ClientConfig::new();
        for (key, value) in config.client_properties() {
            client.set(key, value);
        }
        let shared = Arc::new(Shared::default());
        if config
            .properties
            .get("debug")
            .is_some_and(|d| !d.trim().is_empty())
        {
            // rdkafka sets librdkafka's log level after creating the client,
            // from the `log` crate's level (info here): that would drop
            // every debug line the `debug` property asks for once start-up
            // is over (see `context.rs`).
            client.set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
            shared.set_debug_requested();
        }
        let consumer: BaseConsumer<SpateContext> =
            client.create_with_context(SpateContext::new(Arc::clone(&shared)))?;
        let lag = match config.lag_interval {
            Some(interval) if !interval.is_zero() => Some(LagReader::spawn(&config, interval)?),
            _ => None,
        };
        let session_ms = config
            .properties
            .get("session.timeout.ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_SESSION_TIMEOUT_MS);
        let progress = metrics::gauge!(LAST_PROGRESS);
        progress.set(unix_now().floor());
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        tracing::info!(group = config.group_id(), ?topics, "subscribed");
        Ok(Self {
            unanswered: None,
            consumer: Arc::new(consumer),
            shared,
            max_batch: config.max_batch,
            group: config.group_id().to_owned(),
            ready: VecDeque::new(),
            epochs: BTreeMap::new(),
            owned: BTreeMap::new(),
            revoking: None,
            ceilings: BTreeMap::new(),
            transient_errors: metrics::counter!(SOURCE_ERRORS, "kind" => "transient"),
            assigned_events: metrics::counter!(REBALANCES, "kind" => "assigned"),
            revoked_events: metrics::counter!(REBALANCES, "kind" => "revoked"),
            assigned_partitions: metrics::gauge!(ASSIGNED_PARTITIONS),
            commit_duration: metrics::histogram!(spate_core::metrics::COMMIT_DURATION),
            commit_stamps: BTreeMap::new(),
            last_error_text: String::new(),
            last_error: None,
            deferred: None,
            patterns: config
                .topics
                .iter()
                .filter(|t| t.starts_with('^'))
                .cloned()
                .collect(),
            metadata_refresh: config
                .properties
                .get("topic.metadata.refresh.interval.ms")
                .cloned()
                .unwrap_or_else(|| "300000".into()),
            reset_policy: config
                .properties
                .get("auto.offset.reset")
                .cloned()
                .unwrap_or_else(|| "largest".into()),
            offset_resets: Vec::new(),
            committed_required: config.committed_required,
            closed: false,
            lag,
            joining_since: Some(Instant::now()),
            ever_assigned: false,
            join_limit: Duration::from_millis(session_ms) + JOIN_GRACE,
            progress,
            last_progress: Instant::now(),
            progress_offsets: BTreeMap::new(),
            assigned: metrics::gauge!(ASSIGNED),
        })
    }

    /// The partitions this source owns now, with their epochs (assigned and
    /// not yet released).
    pub fn owned(&self) -> &BTreeMap<TopicPartition, Epoch> {
        &self.owned
    }

    /// Carries out the rebalances the context recorded.
    fn apply_rebalances(&mut self) -> Result<(), SourceError> {
        for op in self.shared.take_rebalances() {
            match op {
                Rebalance::Assign {
                    partitions,
                    cooperative,
                } => self.assign(&partitions, cooperative)?,
                Rebalance::Revoke {
                    partitions,
                    cooperative,
                    lost,
                } => self.revoke(partitions, cooperative, lost)?,
                Rebalance::Error(code) => {
                    return Err(SourceError::Fatal {
                        context: format!("rebalance of group {}", self.group),
                        message: RDKafkaErrorCode::from(code).to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Sets `spate_last_commit_timestamp_seconds` of every partition in
    /// `list` (just committed) to now, in unix seconds. Once per commit.
    fn stamp_commits(&mut self, list: &TopicPartitionList) {
        let now = unix_now();
        let mut advanced = false;
        for elem in list.elements() {
            let tp = TopicPartition::new(elem.topic(), elem.partition());
            if let KafkaOffset::Offset(offset) = elem.offset() {
                let before = self.progress_offsets.insert(tp.clone(), offset);
                advanced |= before.is_none_or(|b| offset > b);
            }
            self.commit_stamps
                .entry(tp)
                .or_insert_with(|| {
                    metrics::gauge!(spate_core::metrics::LAST_COMMIT_TIMESTAMP,
                        "topic" => elem.topic().to_owned(),
                        "partition" => elem.partition().to_string())
                })
                .set(now.floor());
        }
        if advanced {
            self.progress.set(now.floor());
            self.last_progress = Instant::now();
        }
    }

    /// The owned-partition gauges (`spate_consumer_assigned_partitions`
    /// and `spate_assigned_partitions`).
    fn set_assigned_gauges(&self) {
        self.assigned_partitions.set(self.owned.len() as f64);
        self.assigned.set(self.owned.len() as f64);
    }

    fn assign(
        &mut self,
        partitions: &TopicPartitionList,
        cooperative: bool,
    ) -> Result<(), SourceError> {
        // The group handed out partitions: whatever failed before is over,
        // and so is the join.
        self.last_error = None;
        self.joining_since = None;
        self.ever_assigned = true;
        // The group's committed offsets and metadata, before the lanes are
        // handed out: effectively_once re-forms the ranges the metadata
        // records (D9). One OffsetFetch, reused by the range check below.
        let fetched = self.fetch_committed(partitions)?;
        let committed = committed_by_partition(fetched.as_ref());
        if partitions.count() > 0 {
            self.assigned_events.increment(1);
        }
        for (tp, c) in &committed {
            self.progress_offsets.insert(tp.clone(), c.offset);
        }
        self.open_lanes(partitions, committed, cooperative)?;
        self.set_assigned_gauges();
        let result = if cooperative {
            self.consumer.incremental_assign(partitions)
        } else {
            self.consumer.assign(partitions)
        };
        // A refused assign leaves the group's rebalance hanging: fatal.
        result.map_err(|e| SourceError::Fatal {
            context: format!("assign in group {}", self.group),
            message: e.to_string(),
        })?;
        // After the assign, so the rebalance is not held for it; librdkafka's
        // reset of an out-of-range offset needs a fetch round trip first.
        self.check_committed(partitions, fetched);
        Ok(())
    }

    /// The group's committed offsets of `partitions` (one OffsetFetch);
    /// `None` when there are none to ask for, or when the fetch failed and
    /// the delivery mode can do without them.
    ///
    /// # Errors
    /// The fetch failed under `delivery: effectively_once`, which needs
    /// each partition's recorded ranges before reading it (D9).
    fn fetch_committed(
        &self,
        partitions: &TopicPartitionList,
    ) -> Result<Option<TopicPartitionList>, SourceError> {
        if partitions.count() == 0 {
            return Ok(None);
        }
        match self
            .consumer
            .committed_offsets(partitions.clone(), offsets::RANGE_CHECK_TIMEOUT)
        {
            Ok(list) => Ok(Some(list)),
            Err(e) if self.committed_required => Err(SourceError::Fatal {
                context: format!("read committed offsets of group {}", self.group),
                message: format!(
                    "{e}; delivery: effectively_once needs each partition's recorded \
                     ranges before reading it"
                ),
            }),
            Err(e) => {
                tracing::debug!(group = %self.group, error = %e, "committed offsets unavailable at assignment");
                Ok(None)
            }
        }
    }

    /// One lane per assigned partition, under the partition's next epoch,
    /// queued as an [`AssignmentEvent::Assigned`] with what the group had
    /// committed for it.
    fn open_lanes(
        &mut self,
        partitions: &TopicPartitionList,
        mut committed: BTreeMap<TopicPartition, Committed>,
        cooperative: bool,
    ) -> Result<(), SourceError> {
        for elem in partitions.elements() {
            let tp = TopicPartition::new(elem.topic(), elem.partition());
            debug_assert!(!self.owned.contains_key(&tp), "{tp} assigned twice");
            // Split before assigning: fetching starts only after the queue is
            // the lane's, so no message of it lands in the shared queue.
            let queue = self
                .consumer
                .split_partition_queue(elem.topic(), elem.partition())
                .ok_or_else(|| SourceError::Fatal {
                    context: format!("assign {tp}"),
                    message: "librdkafka has no queue for this partition".into(),
                })?;
            let epoch = self.epochs.entry(tp.clone()).or_insert(0);
            *epoch += 1;
            let epoch = *epoch;
            self.owned.insert(tp.clone(), epoch);
            self.ceilings.remove(&tp);
            tracing::info!(partition = %tp, epoch, cooperative, "assigned");
            let lane = KafkaLane::new(
                queue,
                Arc::clone(&self.consumer),
                tp.clone(),
                epoch,
                self.max_batch,
            )?;
            self.ready.push_back(AssignmentEvent::Assigned {
                committed: committed.remove(&tp),
                partition: tp,
                epoch,
                lane,
            });
        }
        Ok(())
    }

    /// Checks the committed offsets against the partitions' ranges
    /// ([`offsets::check_committed`]) and publishes each as
    /// `spate_committed_offset`, so the gauge shows the group's offset from
    /// the start, not 0 until this run's first commit (issue 19); an
    /// out-of-range one too: it is what the group holds, the report says
    /// the rest.
    fn check_committed(
        &mut self,
        partitions: &TopicPartitionList,
        fetched: Option<TopicPartitionList>,
    ) {
        let checked = offsets::check_committed(
            &self.consumer,
            &self.group,
            partitions,
            fetched,
            &self.reset_policy,
        );
        for (tp, offset) in &checked.committed {
            metrics::gauge!(spate_core::metrics::COMMITTED_OFFSET,
                "topic" => tp.topic().to_owned(),
                "partition" => tp.partition().to_string())
            .set(*offset as f64);
        }
        self.offset_resets.extend(checked.resets);
    }

    fn revoke(
        &mut self,
        partitions: TopicPartitionList,
        cooperative: bool,
        lost: bool,
    ) -> Result<(), SourceError> {
        let mut waiting = BTreeSet::new();
        if partitions.count() > 0 {
            self.revoked_events.increment(1);
        }
        for elem in partitions.elements() {
            let tp = TopicPartition::new(elem.topic(), elem.partition());
            let Some(&epoch) = self.owned.get(&tp) else {
                continue;
            };
            if lost {
                tracing::warn!(partition = %tp, epoch, "assignment lost; its commits will be rejected and its data re-read");
            } else {
                tracing::info!(partition = %tp, epoch, "revoking; waiting for the drain");
            }
            waiting.insert((tp.clone(), epoch));
            self.ready.push_back(AssignmentEvent::Revoked {
                partition: tp,
                epoch,
            });
        }
        match &mut self.revoking {
            // librdkafka does not start another rebalance before the pending
            // one is answered; merge rather than assume it.
            Some(r) => {
                r.waiting.extend(waiting);
                for elem in partitions.elements() {
                    r.partitions.add_partition(elem.topic(), elem.partition());
                }
            }
            None => {
                self.revoking = Some(Revoking {
                    waiting,
                    partitions,
                    cooperative,
                });
            }
        }
        self.finish_revoke_if_released()
    }

    /// Completes the pending revoke once every revoked partition is released.
    fn finish_revoke_if_released(&mut self) -> Result<(), SourceError> {
        if self.revoking.as_ref().is_none_or(|r| !r.waiting.is_empty()) {
            return Ok(());
        }
        let r = self.revoking.take().expect("checked above");
        for elem in r.partitions.elements() {
            self.owned
                .remove(&TopicPartition::new(elem.topic(), elem.partition()));
        }
        self.set_assigned_gauges();
        if self.owned.is_empty() && !self.closed {
            // Eager: the member rejoins now, and waits for its next
            // assignment.
            self.joining_since = Some(Instant::now());
        }
        let result = if r.cooperative {
            self.consumer.incremental_unassign(&r.partitions)
        } else {
            self.consumer.unassign()
        };
        tracing::info!(
            partitions = r.partitions.count(),
            cooperative = r.cooperative,
            "revoke complete; rebalance may proceed"
        );
        // A refused unassign leaves the group's rebalance hanging: fatal.
        result.map_err(|e| SourceError::Fatal {
            context: format!("unassign in group {}", self.group),
            message: e.to_string(),
        })
    }

    /// Serves one consumer-queue event, waiting at most `timeout`; `true` if
    /// there may be more.
    fn serve_one(&mut self, timeout: Duration) -> Result<bool, SourceError> {
        // Take what the poll returned into owned data at once: a message
        // borrows the consumer.
        let polled = match self.consumer.poll(timeout) {
            None => None,
            Some(Ok(m)) => Some(Ok((
                TopicPartition::new(m.topic(), m.partition()),
                m.offset(),
            ))),
            Some(Err(e)) => Some(Err(e)),
        };
        let recorded = self.apply_rebalances();
        let more = match polled {
            None => false,
            Some(Ok((tp, offset))) => {
                // Cannot happen while every assigned partition is split before
                // assign; if it does, the message is not delivered, so never
                // commit past it (D1) and stop.
                let ceiling = self.ceilings.entry(tp.clone()).or_insert(offset);
                *ceiling = (*ceiling).min(offset);
                return Err(SourceError::Fatal {
                    context: format!("poll group {}", self.group),
                    message: format!(
                        "message {tp}@{offset} arrived on the consumer queue instead of its lane"
                    ),
                });
            }
            Some(Err(e)) if self.pattern_waiting(&e) => true,
            Some(Err(e)) => {
                let mut error = errors::source_error(format!("poll group {}", self.group), &e);
                // librdkafka's poll error does not say which topic is
                // unknown; the error callback's text does.
                if let SourceError::Fatal { message, .. } = &mut error
                    && e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition)
                    && let Some(reason) = self.shared.take_unknown_topic()
                {
                    message.push_str(&format!(" ({reason})"));
                }
                match error {
                    SourceError::Fatal { .. } => return Err(error),
                    _ => {
                        self.transient_errors.increment(1);
                        self.last_error = Some(std::time::Instant::now());
                        self.last_error_text = error.to_string();
                        tracing::warn!(%error, "transient consumer error; librdkafka retries");
                        true
                    }
                }
            }
        };
        recorded?;
        Ok(more || !self.ready.is_empty())
    }

    /// Whether `e` is librdkafka's report that a subscribed `^regex` matches
    /// no topic (yet): an `UnknownTopicOrPartition` whose text names the
    /// pattern. That is a wait, not a failure: librdkafka re-evaluates the
    /// pattern on every metadata refresh and assigns a matching topic when
    /// one appears, while the consumer stays in its group. Logged at INFO
    /// (librdkafka reports it once per pattern until it changes). A plain
    /// topic that does not exist stays fatal (`errors.rs`).
    fn pattern_waiting(&self, e: &KafkaError) -> bool {
        if self.patterns.is_empty()
            || e.rdkafka_error_code() != Some(RDKafkaErrorCode::UnknownTopicOrPartition)
        {
            return false;
        }
        let Some(reason) = self.shared.take_unknown_topic() else {
            return false;
        };
        let Some(pattern) = self
            .patterns
            .iter()
            .find(|p| reason.contains(&format!(": {p}: ")))
        else {
            return false;
        };
        tracing::info!(
            group = %self.group,
            pattern = %pattern,
            "subscription pattern {pattern} matches no topic yet; waiting in the group for one \
             (re-checked every topic.metadata.refresh.interval.ms = {} ms)",
            self.metadata_refresh
        );
        true
    }

    /// Closes the consumer: see the module docs. Idempotent.
    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.shared.set_closing();
        if let Some(r) = self.revoking.as_mut() {
            tracing::info!(
                waiting = r.waiting.len(),
                "closing with a revoke pending; completing it"
            );
            r.waiting.clear();
        }
        if let Err(e) = self.finish_revoke_if_released() {
            tracing::warn!(error = %e, "completing the pending revoke at close failed");
        }
        self.wait_for_first_join();
        // Lanes not yet handed out hold queue handles; drop them first.
        self.ready.clear();
        if let Err(e) = self.consumer.close_queue() {
            tracing::warn!(error = %e, "closing the consumer queue failed");
            return;
        }
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        while !self.consumer.closed() {
            if Instant::now() >= deadline {
                tracing::warn!(timeout = ?CLOSE_TIMEOUT, "consumer did not close in time");
                return;
            }
            // Serves the closing rebalance (applied at once by the context).
            let _ = self.consumer.poll(Duration::from_millis(50));
            let _ = self.shared.take_rebalances();
        }
        tracing::info!(group = %self.group, "consumer closed");
    }

    /// At close, before the first assignment: serves the consumer for at
    /// most [`JOIN_WAIT_AT_CLOSE`] until the join ends, so the close that
    /// follows can leave the group (see there). The context applies the
    /// assignment at once while closing.
    fn wait_for_first_join(&mut self) {
        // Nothing to leave when the brokers were unreachable a moment ago:
        // the wait would only delay the exit.
        if self.ever_assigned || self.last_error.is_some() {
            return;
        }
        let started = Instant::now();
        let deadline = started + JOIN_WAIT_AT_CLOSE;
        loop {
            // An assignment recorded before the close began: apply it now.
            for op in self.shared.take_rebalances() {
                if let Rebalance::Assign {
                    partitions,
                    cooperative,
                } = op
                {
                    let applied = if cooperative {
                        self.consumer.incremental_assign(&partitions)
                    } else {
                        self.consumer.assign(&partitions)
                    };
                    if let Err(e) = applied {
                        tracing::warn!(error = %e, "applying the first assignment at close failed");
                    }
                    self.shared.note_assigned_while_closing();
                }
            }
            if self.shared.take_assigned_while_closing() {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    waited = ?JOIN_WAIT_AT_CLOSE,
                    "closing during the first group join, which did not end in time; the \
                     group may keep this member until its session.timeout.ms expires"
                );
                return;
            }
            if let Some(Err(e)) = self.consumer.poll(Duration::from_millis(50)) {
                // A broker unreachable: no join to wait for, nothing to leave.
                tracing::info!(error = %e, "closing during the first group join; the consumer reports an error, not waiting for the join");
                return;
            }
        }
        self.ever_assigned = true;
        tracing::info!(
            waited = ?started.elapsed(),
            "closing during the first group join: waited for it to end so the close leaves the group"
        );
    }

    /// What `/readyz` and `/healthz?verbose` add about the consumer:
    /// joining since when, the partitions assigned, the group's lag and
    /// the time since the last progress (a commit that advanced).
    fn status_text(&self) -> String {
        let mut parts = Vec::new();
        match self.joining_since {
            Some(at) => parts.push(format!(
                "joining the group since {:.1} s ago (not ready after {} s)",
                at.elapsed().as_secs_f64(),
                self.join_limit.as_secs()
            )),
            None => parts.push(format!("assigned {} partition(s)", self.owned.len())),
        }
        if let Some(lag) = &self.lag
            && let (Some(reading), Some(age)) = (lag.last(), lag.age())
        {
            parts.push(lag_text(reading.total(), age, self.last_progress.elapsed()));
        }
        parts.join("; ")
    }

    /// Whether the join has lasted longer than `session.timeout.ms` +
    /// [`JOIN_GRACE`].
    fn join_stuck(&self) -> bool {
        self.joining_since
            .is_some_and(|at| at.elapsed() >= self.join_limit)
    }
}

/// The lag part of the consumer's status line: the group's `total` lag read
/// `age` ago, and `idle`, the time since this process last committed an
/// advance. "No progress while lag is L" only when L was read after the last
/// progress: an older reading says nothing about now.
fn lag_text(total: i64, age: Duration, idle: Duration) -> String {
    if total > 0 && age < idle {
        format!(
            "no progress for {:.0} s while lag is {total}",
            idle.as_secs_f64()
        )
    } else {
        format!(
            "group lag {total} as read {:.0} s ago; last progress {:.0} s ago",
            age.as_secs_f64(),
            idle.as_secs_f64()
        )
    }
}

/// Unix time in seconds (for the timestamp gauges; this crate is not the
/// deterministic core).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.close();
    }
}

impl Source for KafkaSource {
    type Lane = KafkaLane;

    /// True unless a transient consumer error (a broker unreachable, the
    /// coordinator away) was reported within [`CONSUMER_ERROR_HOLD`] and no
    /// assignment has arrived since. Fatal errors stop the pipeline instead
    /// (and with it readiness).
    fn consumer_ready(&self) -> bool {
        self.last_error
            .is_none_or(|at| at.elapsed() >= CONSUMER_ERROR_HOLD)
            && !self.join_stuck()
    }

    fn consumer_status(&self) -> String {
        self.status_text()
    }

    /// The standing transient error, how long ago it came and when
    /// readiness returns without another, e.g. `transient error 2.1 s ago
    /// (ready 10 s after the last one, or at an assignment): poll group g:
    /// ... all brokers are down`; with the partitions held.
    fn consumer_not_ready_reason(&self) -> String {
        let held = self.owned.len();
        if self.join_stuck() && self.last_error.is_none() {
            return format!(
                "stuck in the group join: {} (a member that left without a LeaveGroup holds \
                 the rebalance until its session expires)",
                self.status_text()
            );
        }
        match self.last_error {
            Some(at) => format!(
                "transient error {:.1} s ago (ready {} s after the last one, or at an \
                 assignment): {}; {held} partition(s) assigned",
                at.elapsed().as_secs_f64(),
                CONSUMER_ERROR_HOLD.as_secs(),
                self.last_error_text
            ),
            None => format!("no error standing; {held} partition(s) assigned"),
        }
    }

    /// Serves the consumer queue (group membership, rebalances, statistics,
    /// errors) for at most `timeout` and returns the next assignment change.
    ///
    /// # Errors
    /// [`SourceError::Fatal`] for a fatal consumer error (see `errors.rs`) or
    /// a rebalance error; transient errors are logged and counted
    /// (`spate_source_errors_total{kind="transient"}`), not returned.
    fn poll_event(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<AssignmentEvent<KafkaLane>>, SourceError> {
        if let Some(lag) = self.lag.as_mut() {
            lag.publish();
        }
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        if let Some(ev) = self.ready.pop_front() {
            return Ok(Some(ev));
        }
        let mut wait = timeout;
        for _ in 0..MAX_EVENTS_PER_POLL {
            let more = self.serve_one(wait)?;
            wait = Duration::ZERO;
            if !more || !self.ready.is_empty() {
                break;
            }
        }
        Ok(self.ready.pop_front())
    }

    /// Marks the revoked `partition` at `epoch` as drained and committed; when
    /// it is the last of the pending revoke, completes the rebalance
    /// (`unassign` / `incremental_unassign`). Releasing something not pending
    /// is a no-op.
    ///
    /// # Errors
    /// [`SourceError::Fatal`] when librdkafka refuses the unassign (the
    /// rebalance could not complete); the next [`Source::poll_event`] returns
    /// it again, so the pipeline stops.
    fn release(&mut self, partition: &TopicPartition, epoch: Epoch) -> Result<(), SourceError> {
        let Some(r) = self.revoking.as_mut() else {
            tracing::debug!(%partition, epoch, "release without a pending revoke");
            return Ok(());
        };
        if !r.waiting.remove(&(partition.clone(), epoch)) {
            tracing::debug!(%partition, epoch, "release of a partition not being revoked");
        }
        self.finish_revoke_if_released().inspect_err(|e| {
            // The controller only logs release errors; make sure the pipeline
            // stops: the next poll_event reports it.
            self.deferred = Some(SourceError::Fatal {
                context: format!("release {partition}"),
                message: e.to_string(),
            });
        })
    }

    /// Committed offsets found out of range on assignment (logged and
    /// counted there too, `offsets.rs`).
    fn take_offset_resets(&mut self) -> Vec<spate_core::source::OffsetReset> {
        std::mem::take(&mut self.offset_resets)
    }

    /// Commits `offsets` and waits for the answer, at most
    /// [`COMMIT_TIMEOUT`] (blocks the calling (controller) thread for one
    /// broker round trip normally), see
    /// [`rd_kafka_commit_queue`](https://github.com/confluentinc/librdkafka/blob/master/src/rdkafka.h).
    ///
    /// Offsets of an epoch this source does not own (any more) are not sent.
    ///
    /// # Errors
    /// [`SourceError::CommitRejected`] when the group refused the commit
    /// (evicted, fenced, rebalanced: the epoch has ended; reported for the
    /// first partition of the call) or an offset was for an epoch not owned;
    /// [`SourceError::Transient`] when it may succeed on the next try (no
    /// answer within [`COMMIT_TIMEOUT`] included).
    fn commit(&mut self, offsets: &[CommitOffset]) -> Result<(), SourceError> {
        let CommitList { list, first, stale } = self.commit_list(offsets)?;
        if let Some(first) = first {
            self.send_commit(&list, first)?;
        }
        match stale {
            Some(c) => Err(SourceError::CommitRejected {
                partition: c.partition.clone(),
                epoch: c.epoch,
                message: format!(
                    "epoch {} of {} is not owned by this consumer (owned: {:?})",
                    c.epoch,
                    c.partition,
                    self.owned.get(&c.partition)
                ),
            }),
            None => Ok(()),
        }
    }
}

/// One commit's partition list, built from the pipeline's offsets.
struct CommitList<'c> {
    list: TopicPartitionList,
    /// The first offset listed (a rejection names its partition).
    first: Option<&'c CommitOffset>,
    /// The first offset left out: of an epoch this consumer does not own.
    stale: Option<&'c CommitOffset>,
}

impl KafkaSource {
    /// The commit's list: each offset of an epoch this consumer owns,
    /// capped at the partition's ceiling, with its range metadata
    /// (effectively_once, D9).
    fn commit_list<'c>(&self, offsets: &'c [CommitOffset]) -> Result<CommitList<'c>, SourceError> {
        let mut list = TopicPartitionList::with_capacity(offsets.len());
        let mut first: Option<&CommitOffset> = None;
        let mut stale: Option<&CommitOffset> = None;
        for c in offsets {
            debug_assert!(
                c.offset >= 0,
                "commit of a negative offset for {}",
                c.partition
            );
            if self.owned.get(&c.partition) != Some(&c.epoch) {
                stale.get_or_insert(c);
                continue;
            }
            let offset = match self.ceilings.get(&c.partition) {
                Some(&ceiling) if c.offset > ceiling => ceiling,
                _ => c.offset,
            };
            let mut elem = list.add_partition(c.partition.topic(), c.partition.partition());
            elem.set_offset(KafkaOffset::Offset(offset))
                .map_err(|e| errors::source_error(format!("commit {}", c.partition), &e))?;
            // effectively_once: the partition's pending ranges (D9).
            if let Some(metadata) = &c.metadata {
                elem.set_metadata(metadata.as_str());
            }
            first.get_or_insert(c);
        }
        Ok(CommitList { list, first, stale })
    }

    /// Sends `list` as one commit and waits up to [`COMMIT_TIMEOUT`] for
    /// its answer. Never sends while an earlier commit is unanswered; one
    /// that times out is kept as that earlier commit. A rejection (fenced,
    /// evicted) names `first`'s partition and epoch.
    fn send_commit(
        &mut self,
        list: &TopicPartitionList,
        first: &CommitOffset,
    ) -> Result<(), SourceError> {
        if let Some((earlier, sent)) = &self.unanswered {
            if earlier.answer(Duration::ZERO).is_none() {
                return Err(SourceError::Transient {
                    context: format!("commit in group {}", self.group),
                    message: format!(
                        "the commit sent {:.1?} ago is still unanswered (group coordinator \
                         unreachable?); not sending another",
                        sent.elapsed()
                    ),
                });
            }
            // Answered: whatever it said, this newer commit decides.
            self.unanswered = None;
        }
        let sent_at = Instant::now();
        let result = match crate::native::Commit::send(&self.consumer, list) {
            Ok(commit) => match commit.answer(COMMIT_TIMEOUT) {
                Some(result) => result,
                None => {
                    self.unanswered = Some((commit, Instant::now()));
                    Err(KafkaError::ConsumerCommit(
                        RDKafkaErrorCode::OperationTimedOut,
                    ))
                }
            },
            Err(e) => Err(e),
        };
        match result {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {
                self.commit_duration.record(sent_at.elapsed().as_secs_f64());
                self.stamp_commits(list);
                Ok(())
            }
            Err(KafkaError::ConsumerCommit(code)) if errors::commit_rejected(code) => {
                Err(SourceError::CommitRejected {
                    partition: first.partition.clone(),
                    epoch: first.epoch,
                    message: code.to_string(),
                })
            }
            Err(e) => Err(SourceError::Transient {
                context: format!("commit in group {}", self.group),
                message: e.to_string(),
            }),
        }
    }
}

// The pipeline moves the source to the controller and lanes to pipeline
// threads.
const _: () = {
    const fn is_send<T: Send>() {}
    is_send::<KafkaSource>();
    is_send::<KafkaLane>();
};

/// The committed offset and metadata of each partition in `fetched` that
/// has one (a partition the group never committed is left out).
fn committed_by_partition(
    fetched: Option<&TopicPartitionList>,
) -> BTreeMap<TopicPartition, Committed> {
    let mut committed = BTreeMap::new();
    for elem in fetched.iter().flat_map(|l| l.elements()) {
        if let KafkaOffset::Offset(offset) = elem.offset() {
            committed.insert(
                TopicPartition::new(elem.topic(), elem.partition()),
                Committed {
                    offset,
                    metadata: elem.metadata().to_owned(),
                },
            );
        }
    }
    committed
}

#[cfg(test)]
mod tests {
    use super::lag_text;
    use std::time::Duration;

    /// "No progress while lag is L" needs a reading taken after the last
    /// progress; a reading from before it, or no lag, says when each was.
    #[test]
    fn no_progress_is_said_only_on_a_lag_read_after_the_last_progress() {
        let s = Duration::from_secs;
        assert_eq!(
            lag_text(1200, s(3), s(40)),
            "no progress for 40 s while lag is 1200"
        );
        assert_eq!(
            lag_text(1500, s(8), s(0)),
            "group lag 1500 as read 8 s ago; last progress 0 s ago"
        );
        assert_eq!(
            lag_text(0, s(1), s(30)),
            "group lag 0 as read 1 s ago; last progress 30 s ago"
        );
    }
}
