//! The consumer's context: librdkafka's callbacks, turned into data the
//! source acts on later.
//!
//! librdkafka calls [`ConsumerContext::rebalance`] from inside the consumer
//! poll, i.e. from [`crate::KafkaSource`]'s `poll_event` on the controller's
//! thread. The callback cannot reach the controller, and the controller must
//! drain and commit a revoked partition *before* the rebalance completes (D1).
//! So, outside shutdown, the callback only records the rebalance: librdkafka
//! then waits (in its "wait assign/unassign call" state, still heart-beating)
//! until spate calls `assign`/`unassign` itself, which the source does after
//! splitting the new partitions' queues (assign) or after the controller
//! released every revoked partition (revoke). See `source.rs`.
//!
//! While the source is closing nobody will release anything, so the callback
//! applies the rebalance at once, as librdkafka's default handler would.
//!
//! The statistics callback publishes `spate_consumer_lag{topic,partition}`
//! with `spate_consumer_lag_stale` and
//! `spate_consumer_lag_updated_timestamp_seconds` (every
//! `statistics.interval.ms`, which spate sets to 5 s unless configured; see
//! [`crate::CONSUMER_LAG_STALE`]); librdkafka's log lines go to
//! `tracing` under the target `librdkafka`. rdkafka forwards them through
//! the client's main queue, which the consumer poll serves (the main queue
//! is forwarded to the consumer queue), so they keep flowing for the whole
//! run. With the `debug` property set (`debug: cgrp,fetch`), the source
//! raises librdkafka's own log level to debug (rdkafka otherwise derives it
//! from the `log` crate's level at creation and applies it *after*
//! `rd_kafka_new`, which silenced every debug line past start-up) and its
//! debug lines are logged at INFO.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use metrics::Gauge;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;

use crate::{CONSUMER_LAG, CONSUMER_LAG_STALE, CONSUMER_LAG_UPDATED};

/// A rebalance recorded by the callback, for the source to carry out.
#[derive(Debug)]
pub(crate) enum Rebalance {
    /// Partitions to assign (the whole assignment under the eager protocol,
    /// the added partitions under the cooperative one).
    Assign {
        partitions: TopicPartitionList,
        cooperative: bool,
    },
    /// Partitions to revoke; `lost` when the assignment was lost (session
    /// timeout, eviction) rather than handed over in order.
    Revoke {
        partitions: TopicPartitionList,
        cooperative: bool,
        lost: bool,
    },
    /// librdkafka reported a rebalance error.
    Error(RDKafkaRespErr),
}

/// The lag series of one partition, registered at its first lag report.
#[derive(Debug)]
struct LagGauges {
    lag: Gauge,
    stale: Gauge,
    updated: Gauge,
}

impl LagGauges {
    fn register(topic: &str, partition: i32) -> Self {
        let labels = || {
            [
                ("topic", topic.to_owned()),
                ("partition", partition.to_string()),
            ]
        };
        Self {
            lag: metrics::gauge!(CONSUMER_LAG, &labels()),
            stale: metrics::gauge!(CONSUMER_LAG_STALE, &labels()),
            updated: metrics::gauge!(CONSUMER_LAG_UPDATED, &labels()),
        }
    }
}

/// Whether a partition's lag in a statistics report is current: its leader
/// broker is known and `UP` in the same report (librdkafka keeps the last
/// high watermark it fetched while the leader is away, so the lag it
/// reports then is a frozen old value), and the lag is known (>= 0).
pub(crate) fn lag_is_current(leader: i32, consumer_lag: i64, up_brokers: &[i32]) -> bool {
    leader >= 0 && consumer_lag >= 0 && up_brokers.contains(&leader)
}

/// State shared by the context (librdkafka's callbacks) and the source.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    rebalances: Mutex<Vec<Rebalance>>,
    closing: AtomicBool,
    /// An assignment arrived (and was applied at once) while closing.
    assigned_while_closing: AtomicBool,
    lag: Mutex<BTreeMap<(String, i32), LagGauges>>,
    /// librdkafka's text of the last `UnknownTopicOrPartition` error (it
    /// names the topic or pattern: "Subscribed topic not available:
    /// ^logs\..*: Broker: Unknown topic or partition"), which the error
    /// callback sees and the consumer poll's error value does not.
    unknown_topic: Mutex<Option<String>>,
    /// The `debug` property is set: librdkafka's debug lines were asked for
    /// and are logged at INFO (see [`SpateContext`]'s `log`).
    debug_requested: AtomicBool,
}

impl Shared {
    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        // A panic while holding these locks leaves plain data behind; keep going.
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the rebalances recorded since the last call, oldest first.
    pub(crate) fn take_rebalances(&self) -> Vec<Rebalance> {
        std::mem::take(&mut *Self::lock(&self.rebalances))
    }

    /// From now on the callback applies rebalances itself.
    pub(crate) fn set_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Whether an assignment was applied while closing since the last
    /// call.
    pub(crate) fn take_assigned_while_closing(&self) -> bool {
        self.assigned_while_closing.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn note_assigned_while_closing(&self) {
        self.assigned_while_closing.store(true, Ordering::Release);
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// librdkafka's `debug` property is set: log its debug lines at INFO.
    pub(crate) fn set_debug_requested(&self) {
        self.debug_requested.store(true, Ordering::Release);
    }

    /// Takes the text of the last unknown-topic error, if any.
    pub(crate) fn take_unknown_topic(&self) -> Option<String> {
        Self::lock(&self.unknown_topic).take()
    }
}

/// The [`ConsumerContext`] of spate's consumer.
///
/// See [rdkafka's `ConsumerContext`](https://docs.rs/rdkafka/0.39/rdkafka/consumer/trait.ConsumerContext.html).
#[derive(Clone, Debug, Default)]
pub struct SpateContext {
    shared: Arc<Shared>,
}

impl SpateContext {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

/// Whether the group runs the cooperative (incremental) rebalance protocol
/// (`partition.assignment.strategy=cooperative-sticky`).
pub(crate) fn is_cooperative(consumer: &BaseConsumer<SpateContext>) -> bool {
    matches!(
        consumer.rebalance_protocol(),
        RebalanceProtocol::Cooperative
    )
}

/// Applies a rebalance at once, as librdkafka's default handler does; used
/// while closing.
fn apply_now(consumer: &BaseConsumer<SpateContext>, err: RDKafkaRespErr, tpl: &TopicPartitionList) {
    let cooperative = is_cooperative(consumer);
    let result: KafkaResult<()> = match (err, cooperative) {
        (RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, true) => {
            consumer.incremental_assign(tpl)
        }
        (RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS, false) => consumer.assign(tpl),
        (_, true) => consumer.incremental_unassign(tpl),
        (_, false) => consumer.unassign(),
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, ?err, "applying a rebalance while closing failed");
    }
}

impl ClientContext for SpateContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{log_message}")
            }
            // Debug lines exist only when the `debug` property asks for
            // them: show them without a RUST_LOG change too.
            RDKafkaLogLevel::Debug if self.shared.debug_requested.load(Ordering::Acquire) => {
                tracing::info!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{log_message}")
            }
        }
    }

    fn stats(&self, statistics: Statistics) {
        // Once per statistics interval (5 s by default), not per record.
        let up: Vec<i32> = statistics
            .brokers
            .values()
            .filter(|b| b.state == "UP")
            .map(|b| b.nodeid)
            .collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut gauges = Shared::lock(&self.shared.lag);
        for (topic, t) in &statistics.topics {
            for (&partition, p) in &t.partitions {
                // -1 is librdkafka's internal "unassigned" partition.
                if partition < 0 {
                    continue;
                }
                let current = lag_is_current(p.leader, p.consumer_lag, &up);
                let key = (topic.clone(), partition);
                if !gauges.contains_key(&key) {
                    // A lag of -1 means unknown (not assigned here, or no
                    // offsets yet): nothing to show until one is known.
                    if !current {
                        continue;
                    }
                    gauges.insert(key.clone(), LagGauges::register(topic, partition));
                }
                let g = &gauges[&key];
                if current {
                    g.lag.set(p.consumer_lag as f64);
                    g.stale.set(0.0);
                    g.updated.set(now.floor());
                } else {
                    // Leader away or lag unknown (revoked): the lag keeps its
                    // last value, marked stale; its timestamp stops moving.
                    g.stale.set(1.0);
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // The same error reaches the source's poll, which classifies, logs
        // and counts it; here it is only a debug line, and the text of an
        // unknown topic is kept: only it says which topic or pattern.
        tracing::debug!(target: "librdkafka", %error, reason, "client error");
        if error.rdkafka_error_code()
            == Some(rdkafka::error::RDKafkaErrorCode::UnknownTopicOrPartition)
        {
            *Shared::lock(&self.shared.unknown_topic) = Some(reason.to_owned());
        }
    }
}

impl ConsumerContext for SpateContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        if self.shared.is_closing() {
            tracing::debug!(
                ?err,
                partitions = tpl.count(),
                "rebalance while closing; applied at once"
            );
            apply_now(consumer, err, tpl);
            if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS {
                self.shared
                    .assigned_while_closing
                    .store(true, Ordering::Release);
            }
            return;
        }
        let cooperative = is_cooperative(consumer);
        let op = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign {
                partitions: tpl.clone(),
                cooperative,
            },
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke {
                partitions: tpl.clone(),
                cooperative,
                lost: consumer.assignment_lost(),
            },
            other => Rebalance::Error(other),
        };
        tracing::debug!(?op, "rebalance recorded");
        Shared::lock(&self.shared.rebalances).push(op);
    }
}

#[cfg(test)]
mod tests {
    use super::lag_is_current;

    #[test]
    fn lag_is_current_only_with_an_up_leader_and_a_known_lag() {
        assert!(lag_is_current(1, 10, &[1, 2]));
        assert!(lag_is_current(2, 0, &[1, 2]));
        assert!(!lag_is_current(3, 10, &[1, 2]), "leader not up");
        assert!(!lag_is_current(-1, 10, &[1, 2]), "no leader");
        assert!(!lag_is_current(1, -1, &[1, 2]), "lag unknown");
        assert!(!lag_is_current(1, 10, &[]), "every broker down");
    }
}
