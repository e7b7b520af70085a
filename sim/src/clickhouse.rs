//! SimClickHouse: the writer seam over the simulated world.
//!
//! Shards x replicas. A shard is one table plus one dedup window of recent
//! tokens shared by its replicas (ReplicatedMergeTree keeps block ids in
//! ZooKeeper per table); a window of 0 models a plain MergeTree that ignores
//! tokens. A replica is an access point with its own faults: down (refuses
//! before writing), failing some writes, writing then never answering (the
//! client times out: the ambiguous case), or answering too late (it writes
//! after the client gave up). A shard restart forgets its dedup window. A
//! part inserted on one replica reaches the others after a replication lag
//! (later if they are down); deduplication is shard-wide at once.
//!
//! Rows are 12 bytes: partition, offset and record id (u32 LE each), as
//! [`SimEncoder`] writes them, so the world knows exactly which record
//! landed (after a truncation, a new record can sit at an old offset).

use std::time::Duration;

use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError, Router};
use spate_core::record::Payload;
use spate_core::sink::{Endpoint, SealedBatch, WriteError, Writer};

use crate::config::FaultKind;
use crate::world::{FNV_BASIS, Shared, World, fnv1a};

/// Encodes a record as its partition, offset and record id (12 bytes).
#[derive(Clone, Copy, Debug, Default)]
pub struct SimEncoder;

impl<'a> Encoder<Payload<'a>> for SimEncoder {
    fn encode(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        // The record's id is its payload (4 bytes LE, `World::append_record`).
        let id = record.value.and_then(|v| v.get(..4)).ok_or_else(|| {
            RecordError::decode(format!(
                "offset {}: payload is not a record id",
                record.offset
            ))
        })?;
        buf.extend_from_slice(&(record.partition.partition() as u32).to_le_bytes());
        buf.extend_from_slice(&(record.offset as u32).to_le_bytes());
        buf.extend_from_slice(id);
        Ok(())
    }
}

/// Routes a record by a stable mix of its partition and offset (a stand-in
/// for a sharding-key hash).
#[derive(Clone, Copy, Debug, Default)]
pub struct SimRouter;

impl<'a> Router<Payload<'a>> for SimRouter {
    fn route(&mut self, record: &Payload<'a>, _cx: &RecordCx<'_>, shards: usize) -> usize {
        let key = (record.partition.partition() as u64) << 40 ^ record.offset as u64;
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) as usize % shards
    }
}

/// The simulated ClickHouse cluster: implements [`Writer`].
#[derive(Clone, Debug)]
pub struct SimWriter {
    world: Shared,
}

impl SimWriter {
    /// The cluster of `world`.
    pub fn new(world: Shared) -> Self {
        Self { world }
    }
}

/// What a write attempt will do, decided when it arrives.
enum Plan {
    Refuse(&'static str),
    Write,
    WriteThenHang,
    LateWrite(Duration),
}

fn plan(w: &mut World, shard: usize, replica: usize) -> Plan {
    let (shards, replicas) = (w.cfg.shards, w.cfg.replicas);
    let this = |t: usize, t2: usize| t % shards == shard && t2 % replicas == replica;
    if w.fault_active(FaultKind::ShardDown, |t, _| t % shards == shard) {
        return Plan::Refuse("shard down");
    }
    if w.fault_active(FaultKind::ReplicaDown, this) {
        return Plan::Refuse("replica down");
    }
    if w.fault_active(FaultKind::WriteErrors, this) && w.rng_bool(0.5) {
        return Plan::Refuse("write error before write");
    }
    if w.fault_active(FaultKind::AmbiguousWrites, this) && w.rng_bool(0.5) {
        return Plan::WriteThenHang;
    }
    if w.fault_active(FaultKind::SlowReplica, this) {
        return Plan::LateWrite(Duration::from_millis(w.rng_range(1_000..=3_000)));
    }
    Plan::Write
}

/// Applies `batch` to `shard`'s table unless its token is in the dedup window.
fn apply(w: &mut World, shard: usize, replica: usize, batch_token: &str, body: &[u8]) {
    let window = w.cfg.dedup_window;
    if window > 0 && w.dedup[shard].contains(batch_token) {
        w.dedup_drops += 1;
        w.trace(format!("s{shard}r{replica} dedup drop {batch_token}"));
        return;
    }
    if window > 0 {
        w.dedup[shard].insert(batch_token, window);
    }
    for row in body.chunks_exact(12) {
        let word = |i: usize| u32::from_le_bytes(row[i..i + 4].try_into().expect("4 bytes"));
        w.land(word(0) as usize, i64::from(word(4)), word(8));
    }
    w.insert_part(shard, replica, (body.len() / 12) as u64);
    w.trace(format!(
        "s{shard}r{replica} insert {batch_token} rows={}",
        body.len() / 12
    ));
}

impl Writer for SimWriter {
    async fn write(&self, endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        let (shard, replica) = (endpoint.shard, endpoint.replica);
        let body = batch.to_contiguous();
        let latency = {
            let mut w = self.world.lock();
            w.sample_budget();
            // D4 fact: one token, one byte content, across every attempt and
            // every incarnation.
            let h = fnv1a(body.iter().copied(), FNV_BASIS);
            let seen = *w.tokens.entry(batch.token().to_owned()).or_insert(h);
            if seen != h {
                w.token_conflicts.push(batch.token().to_owned());
            }
            let (lo, hi) = w.cfg.write_latency_ms;
            Duration::from_millis(w.rng_range(lo..=hi))
        };
        tokio::time::sleep(latency).await;
        let plan = plan(&mut self.world.lock(), shard, replica);
        match plan {
            Plan::Refuse(why) => {
                self.world.lock().trace(format!(
                    "s{shard}r{replica} refuse {} ({why})",
                    batch.token()
                ));
                Err(WriteError::retryable(why))
            }
            Plan::Write => {
                apply(&mut self.world.lock(), shard, replica, batch.token(), &body);
                Ok(())
            }
            Plan::WriteThenHang => {
                {
                    let mut w = self.world.lock();
                    apply(&mut w, shard, replica, batch.token(), &body);
                    w.ambiguous_writes += 1;
                }
                std::future::pending().await
            }
            Plan::LateWrite(delay) => {
                // The server goes on after the client has given up.
                let world = self.world.clone();
                let token = batch.token().to_owned();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let mut w = world.lock();
                    apply(&mut w, shard, replica, &token, &body);
                    w.ambiguous_writes += 1;
                });
                std::future::pending().await
            }
        }
    }

    async fn probe(&self, endpoint: &Endpoint) -> Result<(), WriteError> {
        let mut w = self.world.lock();
        let shards = w.cfg.shards;
        let replicas = w.cfg.replicas;
        let (s, r) = (endpoint.shard, endpoint.replica);
        if w.fault_active(FaultKind::ShardDown, |t, _| t % shards == s)
            || w.fault_active(FaultKind::ReplicaDown, |t, t2| {
                t % shards == s && t2 % replicas == r
            })
        {
            return Err(WriteError::retryable("down"));
        }
        Ok(())
    }
}
