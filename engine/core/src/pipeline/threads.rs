//! Where drivers run: inline in the controller task (one-thread mode, D7) or
//! on `pipeline.threads` OS threads (thread mode).
//!
//! Both implement [`LaneHost`], so the controller is the same code in the
//! simulator and the service. New lanes go to the host's least-loaded driver
//! (ties to the lowest index, so placement is deterministic); a lane stays on
//! its driver until revoked.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::mpsc::{self, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use crate::ack::AckIssuer;
use crate::pipeline::driver::{Driver, Processor, RecordCounters, Step};
use crate::pipeline::eo::LanePlan;
use crate::pipeline::terminal::{ChunkBuffers, Flush};
use crate::pipeline::{DeadLetter, IdleBackoff, OnError, PipelineError};
use crate::record::{Epoch, TopicPartition};
use crate::sink::DRAIN_GRACE;
use crate::source::Lane;

/// How often a stopping host checks its threads, and a stopping thread
/// retries a flush the in-flight budget refused: short, so the idle backoff
/// (up to 1 s) does not eat into the drain deadline (D5).
const SHUTDOWN_POLL: Duration = Duration::from_millis(1);

/// What drivers tell the controller.
#[derive(Debug)]
pub(crate) enum LaneEvent<L> {
    /// A revoke was carried out: the lane is gone, its chunks sealed; it had
    /// issued `issued` ack handles (`None`: no driver owned it).
    Revoked {
        partition: TopicPartition,
        epoch: Epoch,
        issued: Option<u64>,
    },
    /// A driver stopped on an error.
    Failed(PipelineError),
    /// A thread gave up a lane so it can move to a less loaded thread; the
    /// controller hands it back through [`LaneHost::arrive`].
    Surrendered(L, AckIssuer),
}

/// Hosts the drivers; the controller's only way to reach lanes.
pub(crate) trait LaneHost<L> {
    /// Hands a new lane to the least-loaded driver, with its range plan in
    /// `delivery: effectively_once`.
    fn assign(&mut self, lane: L, issuer: AckIssuer, plan: Option<LanePlan>);
    /// Asks the owning driver to drop the lane; answered by
    /// [`LaneEvent::Revoked`].
    fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch);
    /// Inline mode: one step of every driver; `true` if any was busy. Thread
    /// mode: checks the threads are alive; `false`.
    fn step(&mut self, now: Instant) -> bool;
    /// Stops intake, seals partial chunks and hands pending chunks to the sink
    /// until all are handed over or `deadline`; then drops the lanes (acks of
    /// anything left fail, D1). `service` runs between rounds: the
    /// controller records sealed ranges there (effectively_once, D9).
    fn shutdown(
        &mut self,
        deadline: Instant,
        service: &mut (dyn FnMut() + Send),
    ) -> impl Future<Output = ()>;
    /// Moves lanes from the most to the least loaded driver until their lane
    /// counts differ by at most one (after a revoke left them uneven).
    fn balance(&mut self);
    /// Takes back a lane a thread surrendered for [`LaneHost::balance`].
    fn arrive(&mut self, lane: L, issuer: AckIssuer);
}

/// Shared construction inputs of every driver.
#[derive(Clone)]
pub(crate) struct DriverParts {
    pub(crate) on_error: OnError,
    pub(crate) dead_letter: Option<Arc<dyn DeadLetter>>,
    pub(crate) counters: Arc<RecordCounters>,
    pub(crate) idle: Duration,
    pub(crate) idle_max: Duration,
    /// The pipeline's metrics scope, entered by each pipeline thread.
    pub(crate) metrics: crate::metrics::Scope,
}

/// One-thread mode: drivers stepped by the controller task.
pub(crate) struct InlineHost<L, P> {
    drivers: Vec<Driver<L, P>>,
    events: UnboundedSender<LaneEvent<L>>,
    idle: Duration,
}

impl<L: Lane, P: Processor> InlineHost<L, P> {
    pub(crate) fn new(
        processors: Vec<P>,
        parts: DriverParts,
        events: UnboundedSender<LaneEvent<L>>,
    ) -> Self {
        let drivers = processors
            .into_iter()
            .map(|p| {
                Driver::new(
                    p,
                    parts.on_error,
                    parts.dead_letter.clone(),
                    Arc::clone(&parts.counters),
                )
            })
            .collect();
        Self {
            drivers,
            events,
            idle: parts.idle,
        }
    }
}

fn least_loaded(loads: impl Iterator<Item = usize>) -> usize {
    loads
        .enumerate()
        .min_by_key(|&(i, n)| (n, i))
        .map_or(0, |(i, _)| i)
}

impl<L: Lane, P: Processor> LaneHost<L> for InlineHost<L, P> {
    fn assign(&mut self, lane: L, issuer: AckIssuer, plan: Option<LanePlan>) {
        let i = least_loaded(self.drivers.iter().map(Driver::lanes));
        self.drivers[i].assign_with(lane, issuer, plan);
    }

    fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch) {
        let issued = self
            .drivers
            .iter_mut()
            .find_map(|d| d.revoke(partition, epoch));
        let _ = self.events.send(LaneEvent::Revoked {
            partition: partition.clone(),
            epoch,
            issued,
        });
    }

    fn step(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for d in &mut self.drivers {
            match d.step(now) {
                Ok(Step::Busy) => busy = true,
                Ok(Step::Idle) => {}
                Err(e) => {
                    let _ = self.events.send(LaneEvent::Failed(e));
                }
            }
        }
        busy
    }

    async fn shutdown(&mut self, deadline: Instant, service: &mut (dyn FnMut() + Send)) {
        loop {
            let mut clear = true;
            for d in &mut self.drivers {
                clear &= d.flush_all() == Flush::Clear;
            }
            if clear || Instant::now() >= deadline {
                break;
            }
            service();
            tokio::time::sleep(self.idle).await;
        }
        // Dropping the drivers drops pending chunks: their acks fail (D1).
        self.drivers.clear();
    }

    fn balance(&mut self) {
        loop {
            let loads: Vec<usize> = self.drivers.iter().map(Driver::lanes).collect();
            let (Some(&max), Some(&min)) = (loads.iter().max(), loads.iter().min()) else {
                return;
            };
            if max - min <= 1 {
                return;
            }
            let from = loads.iter().position(|&n| n == max).expect("max exists");
            let to = least_loaded(loads.iter().copied());
            let (lane, issuer) = self.drivers[from].take_last_lane().expect("max > 0");
            self.drivers[to].assign(lane, issuer);
        }
    }

    fn arrive(&mut self, lane: L, issuer: AckIssuer) {
        self.assign(lane, issuer, None);
    }
}

enum Command<L> {
    Assign(L, AckIssuer, Option<LanePlan>),
    Revoke(TopicPartition, Epoch),
    Surrender(TopicPartition, Epoch),
    Shutdown(Instant),
}

struct ThreadSlot<L> {
    tx: mpsc::Sender<Command<L>>,
    join: Option<JoinHandle<()>>,
    owned: BTreeSet<(TopicPartition, Epoch)>,
}

impl<L> ThreadSlot<L> {
    /// Sends `command` and wakes the thread from an idle park, so a lane,
    /// revoke or shutdown does not wait out its idle backoff. `Err`: the
    /// thread is gone.
    fn command(&self, command: Command<L>) -> Result<(), mpsc::SendError<Command<L>>> {
        self.tx.send(command)?;
        if let Some(join) = &self.join {
            join.thread().unpark();
        }
        Ok(())
    }
}

/// Thread mode: each driver on its own OS thread, commanded over a channel
/// it polls without waiting (D2).
pub(crate) struct ThreadHost<L> {
    threads: Vec<ThreadSlot<L>>,
    events: UnboundedSender<LaneEvent<L>>,
    /// Lanes surrendered by one thread and not yet handed to another; a revoke
    /// that arrives meanwhile is carried out when the lane does.
    in_transit: BTreeSet<(TopicPartition, Epoch)>,
    revoke_on_arrival: BTreeSet<(TopicPartition, Epoch)>,
}

impl<L: Lane + 'static> ThreadHost<L> {
    /// Spawns `buffers.len()` threads; thread `i` builds its processor from
    /// `buffers[i]` with `factory`, on the thread itself.
    pub(crate) fn spawn<P, F>(
        buffers: Vec<ChunkBuffers>,
        factory: Arc<F>,
        parts: DriverParts,
        events: UnboundedSender<LaneEvent<L>>,
    ) -> Result<Self, PipelineError>
    where
        P: Processor + 'static,
        F: Fn(ChunkBuffers) -> P + Send + Sync + 'static,
    {
        let mut threads = Vec::with_capacity(buffers.len());
        for (i, b) in buffers.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            let factory = Arc::clone(&factory);
            let parts = parts.clone();
            let events = events.clone();
            let join = std::thread::Builder::new()
                .name(format!("spate-pipe-{i}"))
                .spawn(move || {
                    parts.metrics.enter_for_thread();
                    let driver = Driver::new(
                        factory(b),
                        parts.on_error,
                        parts.dead_letter,
                        parts.counters,
                    );
                    let backoff = IdleBackoff::new(parts.idle, parts.idle_max);
                    thread_main(driver, rx, events, parts.idle, backoff);
                })
                .map_err(|e| PipelineError::Thread(format!("spawn spate-pipe-{i}: {e}")))?;
            threads.push(ThreadSlot {
                tx,
                join: Some(join),
                owned: BTreeSet::new(),
            });
        }
        Ok(Self {
            threads,
            events,
            in_transit: BTreeSet::new(),
            revoke_on_arrival: BTreeSet::new(),
        })
    }
}

fn thread_main<L: Lane, P: Processor>(
    mut driver: Driver<L, P>,
    rx: mpsc::Receiver<Command<L>>,
    events: UnboundedSender<LaneEvent<L>>,
    idle: Duration,
    mut backoff: IdleBackoff,
) {
    let mut failed = false;
    loop {
        loop {
            match rx.try_recv() {
                Ok(Command::Assign(lane, issuer, plan)) => {
                    backoff.busy();
                    driver.assign_with(lane, issuer, plan);
                }
                Ok(Command::Revoke(partition, epoch)) => {
                    let issued = driver.revoke(&partition, epoch);
                    let _ = events.send(LaneEvent::Revoked {
                        partition,
                        epoch,
                        issued,
                    });
                }
                Ok(Command::Surrender(partition, epoch)) => {
                    if let Some((lane, issuer)) = driver.take_lane(&partition, epoch) {
                        let _ = events.send(LaneEvent::Surrendered(lane, issuer));
                    }
                }
                Ok(Command::Shutdown(deadline)) => {
                    // Waiting: sealed ranges wait for their record, which
                    // the controller makes meanwhile (effectively_once).
                    while driver.flush_all() != Flush::Clear && Instant::now() < deadline {
                        std::thread::sleep(idle.min(SHUTDOWN_POLL));
                    }
                    return;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        if failed {
            std::thread::park_timeout(backoff.idle());
            continue;
        }
        match driver.step(Instant::now()) {
            Ok(Step::Busy) => backoff.busy(),
            // A park, not a wait on the command channel (D2 keeps these
            // threads off channels): the host unparks the thread after each
            // command (`ThreadSlot::command`); new data waits at most the
            // cap. An early or spurious wake just polls again.
            Ok(Step::Idle) => std::thread::park_timeout(backoff.idle()),
            Err(e) => {
                let _ = events.send(LaneEvent::Failed(e));
                failed = true;
            }
        }
    }
}

impl<L: Lane + 'static> LaneHost<L> for ThreadHost<L> {
    fn assign(&mut self, lane: L, issuer: AckIssuer, plan: Option<LanePlan>) {
        let i = least_loaded(self.threads.iter().map(|t| t.owned.len()));
        let key = (lane.partition().clone(), lane.epoch());
        let slot = &mut self.threads[i];
        slot.owned.insert(key);
        // A send error means the thread died; step() reports it.
        let _ = slot.command(Command::Assign(lane, issuer, plan));
    }

    fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch) {
        let key = (partition.clone(), epoch);
        if self.in_transit.contains(&key) {
            self.revoke_on_arrival.insert(key);
            return;
        }
        match self.threads.iter_mut().find(|t| t.owned.contains(&key)) {
            Some(slot) => {
                slot.owned.remove(&key);
                if slot.command(Command::Revoke(key.0, key.1)).is_err() {
                    let _ = self.events.send(LaneEvent::Revoked {
                        partition: partition.clone(),
                        epoch,
                        issued: None,
                    });
                }
            }
            None => {
                let _ = self.events.send(LaneEvent::Revoked {
                    partition: partition.clone(),
                    epoch,
                    issued: None,
                });
            }
        }
    }

    fn step(&mut self, _now: Instant) -> bool {
        for (i, slot) in self.threads.iter_mut().enumerate() {
            if slot.join.as_ref().is_some_and(JoinHandle::is_finished) {
                let join = slot.join.take().expect("checked");
                let why = match join.join() {
                    Ok(()) => "exited".to_owned(),
                    Err(p) => panic_message(&p),
                };
                let _ = self
                    .events
                    .send(LaneEvent::Failed(PipelineError::Thread(format!(
                        "spate-pipe-{i} stopped unexpectedly: {why}"
                    ))));
            }
        }
        false
    }

    fn balance(&mut self) {
        loop {
            let loads: Vec<usize> = self.threads.iter().map(|t| t.owned.len()).collect();
            let (Some(&max), Some(&min)) = (loads.iter().max(), loads.iter().min()) else {
                return;
            };
            // Lanes in transit land on the least loaded thread: count them there.
            if max <= min + self.in_transit.len() + 1 {
                return;
            }
            let from = loads.iter().position(|&n| n == max).expect("max exists");
            let slot = &mut self.threads[from];
            let key = slot.owned.pop_last().expect("max > 0");
            if slot
                .command(Command::Surrender(key.0.clone(), key.1))
                .is_err()
            {
                return;
            }
            self.in_transit.insert(key);
        }
    }

    fn arrive(&mut self, lane: L, issuer: AckIssuer) {
        let key = (lane.partition().clone(), lane.epoch());
        self.in_transit.remove(&key);
        if self.revoke_on_arrival.remove(&key) {
            // Revoked while moving: nothing polls it any more; its batches
            // settle on their own.
            let _ = self.events.send(LaneEvent::Revoked {
                partition: key.0,
                epoch: key.1,
                issued: Some(issuer.issued()),
            });
            return;
        }
        self.assign(lane, issuer, None);
    }

    async fn shutdown(&mut self, deadline: Instant, service: &mut (dyn FnMut() + Send)) {
        for slot in &self.threads {
            let _ = slot.command(Command::Shutdown(deadline));
        }
        let hard = deadline + DRAIN_GRACE;
        loop {
            let running = self
                .threads
                .iter()
                .filter(|t| t.join.as_ref().is_some_and(|j| !j.is_finished()))
                .count();
            if running == 0 {
                break;
            }
            if Instant::now() >= hard {
                tracing::error!(
                    running,
                    "pipeline threads did not stop by the drain deadline + grace; leaving them"
                );
                return;
            }
            service();
            // Not the idle sleep (up to 1 s): a stop should not wait on it.
            tokio::time::sleep(SHUTDOWN_POLL).await;
        }
        for (i, slot) in self.threads.iter_mut().enumerate() {
            if let Some(join) = slot.join.take() {
                if let Err(p) = join.join() {
                    tracing::error!(
                        thread = i,
                        "pipeline thread panicked: {}",
                        panic_message(&p)
                    );
                }
            }
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ack::ack_channel;
    use crate::budget::Budget;
    use crate::pipeline::chain::{Encoder, PayloadDecoder, RecordCx, RecordError, RoundRobin};
    use crate::pipeline::driver::ChainProcessor;
    use crate::pipeline::terminal::{ChunkConfig, Terminal};
    use crate::record::Payload;
    use crate::sink::{Endpoint, RunNonce, SealedBatch, SinkConfig, SinkPool, WriteError, Writer};
    use crate::source::{BufferedBatch, SourceError};

    // The scripted source and capture writer live in the spate-testkit crate,
    // which a unit test cannot use (it links its own spate-core); this test
    // only moves lanes between drivers, so lanes that never yield a record,
    // an encoder that writes nothing and a writer that accepts suffice.

    /// A lane that polls empty batches.
    struct IdleLane(TopicPartition);

    impl Lane for IdleLane {
        type Batch<'a> = BufferedBatch<'a>;

        fn partition(&self) -> &TopicPartition {
            &self.0
        }

        fn epoch(&self) -> Epoch {
            1
        }

        fn poll(&mut self, _timeout: Duration) -> Result<BufferedBatch<'_>, SourceError> {
            Ok(BufferedBatch {
                values: &[],
                partition: &self.0,
                first: 0,
            })
        }

        fn pause(&mut self) -> Result<(), SourceError> {
            Ok(())
        }

        fn resume(&mut self) -> Result<(), SourceError> {
            Ok(())
        }
    }

    struct NoRows;

    impl<'a> Encoder<Payload<'a>> for NoRows {
        fn encode(
            &mut self,
            _record: &Payload<'a>,
            _cx: &RecordCx<'_>,
            _buf: &mut Vec<u8>,
        ) -> Result<(), RecordError> {
            Ok(())
        }
    }

    struct Accept;

    impl Writer for Accept {
        async fn write(
            &self,
            _endpoint: &Endpoint,
            _batch: &SealedBatch,
        ) -> Result<(), WriteError> {
            Ok(())
        }

        async fn probe(&self, _endpoint: &Endpoint) -> Result<(), WriteError> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn balance_evens_out_lanes_after_a_revoke() {
        let pool = SinkPool::start(
            SinkConfig::new("t", vec![vec!["a".into()]]),
            Arc::new(Accept),
            RunNonce::from_u64(1),
            &tokio::runtime::Handle::current(),
        )
        .expect("pool");
        let budget = Budget::new(1 << 20, 1 << 20);
        let processor = || {
            let buffers =
                ChunkBuffers::new(pool.handle(), Arc::clone(&budget), ChunkConfig::default());
            ChainProcessor::new(
                PayloadDecoder,
                Terminal::new(NoRows, RoundRobin::default(), buffers),
            )
        };
        let (events_tx, _events) = tokio::sync::mpsc::unbounded_channel();
        let parts = DriverParts {
            on_error: OnError::Skip,
            dead_letter: None,
            counters: Arc::default(),
            idle: Duration::from_millis(1),
            idle_max: Duration::from_millis(1),
            metrics: crate::metrics::Scope::none(),
        };
        let mut host = InlineHost::new(vec![processor(), processor()], parts, events_tx);
        let loads = |h: &InlineHost<_, _>| h.drivers.iter().map(Driver::lanes).collect::<Vec<_>>();
        let tp = |p| TopicPartition::new("t", p);
        let (ack_tx, _ack_rx) = ack_channel();
        for p in 0..4 {
            host.assign(
                IdleLane(tp(p)),
                AckIssuer::new(tp(p), 1, ack_tx.clone()),
                None,
            );
        }
        assert_eq!(loads(&host), [2, 2], "assignment spreads lanes");
        // Partitions 0 and 2 went to driver 0 (least loaded, lowest index).
        host.revoke(&tp(0), 1);
        host.revoke(&tp(2), 1);
        assert_eq!(loads(&host), [0, 2]);
        host.balance();
        assert_eq!(loads(&host), [1, 1], "a lane moved to the idle driver");
        host.balance();
        assert_eq!(loads(&host), [1, 1], "balanced hosts stay put");
    }
}
