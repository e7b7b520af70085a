//! The sink seam and the sink pool (DESIGN "Sink pool").
//!
//! - [`Writer`]: writes one [`SealedBatch`] (bytes plus dedup token) to one
//!   replica [`Endpoint`], and probes an endpoint. `spate-clickhouse` implements
//!   it over HTTP; the simulator implements it in memory.
//! - [`SinkPool`]: one bounded queue and one async worker per shard. Pipeline
//!   threads `try_send` [`Chunk`]s through a [`PoolHandle`] and never wait (D2).
//!   A worker merges chunks up to `max_rows` / `max_bytes` / `linger`, seals a
//!   batch with the token `{pipeline}-{run nonce}-{shard}-{seq}` (D4) and
//!   writes it with up to `max_inflight` concurrent inserts, round robin over
//!   the replicas whose circuit breaker is closed, retrying the same bytes and
//!   token with capped, jittered exponential backoff. Rows are never rerouted to
//!   another shard.
//! - [`SinkPool::drain`] returns by `deadline + DRAIN_GRACE` whatever the
//!   writers do (D5); whatever was not written fails its acks (D1).

mod backoff;
mod breaker;
mod chunk;
mod config;
mod events;
mod pool;
mod token;
mod worker;
mod writer;

pub use backoff::backoff_delay;
pub use breaker::{Pick, ReplicaSet};
pub use chunk::{BatchRange, Chunk, Layout, SealedBatch};
pub use config::{BatchConfig, BreakerConfig, ConfigError, ConfigWarning, RetryConfig, SinkConfig};
pub use events::ShardReport;
pub use pool::{DRAIN_GRACE, DrainReport, PoolHandle, ProbeReport, PushError, SinkPool};
pub use token::{GroupMember, RunNonce, batch_token, group_token, range_token};
pub use writer::{Endpoint, WriteError, WriteErrorKind, Writer};
