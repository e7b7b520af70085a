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
use crate::pipeline::terminal::{ChunkBuffers, Flush};
use crate::pipeline::{DeadLetter, OnError, PipelineError};
use crate::record::{Epoch, TopicPartition};
use crate::sink::DRAIN_GRACE;
use crate::source::Lane;

/// What drivers tell the controller.
#[derive(Debug)]
pub(crate) enum LaneEvent {
    /// A revoke was carried out: the lane is gone, its chunks sealed; it had
    /// issued `issued` ack handles (`None`: no driver owned it).
    Revoked {
        partition: TopicPartition,
        epoch: Epoch,
        issued: Option<u64>,
    },
    /// A driver stopped on an error.
    Failed(PipelineError),
}

/// Hosts the drivers; the controller's only way to reach lanes.
pub(crate) trait LaneHost<L> {
    /// Hands a new lane to the least-loaded driver.
    fn assign(&mut self, lane: L, issuer: AckIssuer);
    /// Asks the owning driver to drop the lane; answered by
    /// [`LaneEvent::Revoked`].
    fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch);
    /// Inline mode: one step of every driver; `true` if any was busy. Thread
    /// mode: checks the threads are alive; `false`.
    fn step(&mut self, now: Instant) -> bool;
    /// Stops intake, seals partial chunks and hands pending chunks to the sink
    /// until all are handed over or `deadline`; then drops the lanes (acks of
    /// anything left fail, D1).
    fn shutdown(&mut self, deadline: Instant) -> impl Future<Output = ()>;
}

/// Shared construction inputs of every driver.
#[derive(Clone)]
pub(crate) struct DriverParts {
    pub(crate) on_error: OnError,
    pub(crate) dead_letter: Option<Arc<dyn DeadLetter>>,
    pub(crate) counters: Arc<RecordCounters>,
    pub(crate) idle: Duration,
}

/// One-thread mode: drivers stepped by the controller task.
pub(crate) struct InlineHost<L, P> {
    drivers: Vec<Driver<L, P>>,
    events: UnboundedSender<LaneEvent>,
    idle: Duration,
}

impl<L: Lane, P: Processor> InlineHost<L, P> {
    pub(crate) fn new(
        processors: Vec<P>,
        parts: DriverParts,
        events: UnboundedSender<LaneEvent>,
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
    fn assign(&mut self, lane: L, issuer: AckIssuer) {
        let i = least_loaded(self.drivers.iter().map(Driver::lanes));
        self.drivers[i].assign(lane, issuer);
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

    async fn shutdown(&mut self, deadline: Instant) {
        loop {
            let mut clear = true;
            for d in &mut self.drivers {
                clear &= d.flush_all() == Flush::Clear;
            }
            if clear || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(self.idle).await;
        }
        // Dropping the drivers drops pending chunks: their acks fail (D1).
        self.drivers.clear();
    }
}

enum Command<L> {
    Assign(L, AckIssuer),
    Revoke(TopicPartition, Epoch),
    Shutdown(Instant),
}

struct ThreadSlot<L> {
    tx: mpsc::Sender<Command<L>>,
    join: Option<JoinHandle<()>>,
    owned: BTreeSet<(TopicPartition, Epoch)>,
}

/// Thread mode: each driver on its own OS thread, commanded over a channel
/// it polls without waiting (D2).
pub(crate) struct ThreadHost<L> {
    threads: Vec<ThreadSlot<L>>,
    events: UnboundedSender<LaneEvent>,
    idle: Duration,
}

impl<L: Lane + 'static> ThreadHost<L> {
    /// Spawns `buffers.len()` threads; thread `i` builds its processor from
    /// `buffers[i]` with `factory`, on the thread itself.
    pub(crate) fn spawn<P, F>(
        buffers: Vec<ChunkBuffers>,
        factory: Arc<F>,
        parts: DriverParts,
        events: UnboundedSender<LaneEvent>,
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
                    let driver = Driver::new(
                        factory(b),
                        parts.on_error,
                        parts.dead_letter,
                        parts.counters,
                    );
                    thread_main(driver, rx, events, parts.idle);
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
            idle: parts.idle,
        })
    }
}

fn thread_main<L: Lane, P: Processor>(
    mut driver: Driver<L, P>,
    rx: mpsc::Receiver<Command<L>>,
    events: UnboundedSender<LaneEvent>,
    idle: Duration,
) {
    let mut failed = false;
    loop {
        loop {
            match rx.try_recv() {
                Ok(Command::Assign(lane, issuer)) => driver.assign(lane, issuer),
                Ok(Command::Revoke(partition, epoch)) => {
                    let issued = driver.revoke(&partition, epoch);
                    let _ = events.send(LaneEvent::Revoked {
                        partition,
                        epoch,
                        issued,
                    });
                }
                Ok(Command::Shutdown(deadline)) => {
                    while driver.flush_all() == Flush::Blocked && Instant::now() < deadline {
                        std::thread::sleep(idle);
                    }
                    return;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        if failed {
            std::thread::sleep(idle);
            continue;
        }
        match driver.step(Instant::now()) {
            Ok(Step::Busy) => {}
            Ok(Step::Idle) => std::thread::sleep(idle),
            Err(e) => {
                let _ = events.send(LaneEvent::Failed(e));
                failed = true;
            }
        }
    }
}

impl<L: Lane + 'static> LaneHost<L> for ThreadHost<L> {
    fn assign(&mut self, lane: L, issuer: AckIssuer) {
        let i = least_loaded(self.threads.iter().map(|t| t.owned.len()));
        let key = (lane.partition().clone(), lane.epoch());
        let slot = &mut self.threads[i];
        slot.owned.insert(key);
        // A send error means the thread died; step() reports it.
        let _ = slot.tx.send(Command::Assign(lane, issuer));
    }

    fn revoke(&mut self, partition: &TopicPartition, epoch: Epoch) {
        let key = (partition.clone(), epoch);
        match self.threads.iter_mut().find(|t| t.owned.contains(&key)) {
            Some(slot) => {
                slot.owned.remove(&key);
                if slot.tx.send(Command::Revoke(key.0, key.1)).is_err() {
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

    async fn shutdown(&mut self, deadline: Instant) {
        for slot in &self.threads {
            let _ = slot.tx.send(Command::Shutdown(deadline));
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
            tokio::time::sleep(self.idle.max(Duration::from_millis(1))).await;
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
