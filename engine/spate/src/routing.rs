//! Topic-to-table routing inside one pipeline (`tables:`, see
//! `config/tables.rs`): one consumer, one set of pipeline threads, one sink
//! pool, several tables.
//!
//! How: the sink pool's shards are **table shards**. With `T` tables over
//! the pipeline's `S` shards the pool has `T x S` shards; pool shard
//! `t * S + s` is shard `s` of table `t`. [`RoutedRouter`] sends a record to
//! its topic's table's block of shards (its own shard key inside it),
//! [`RoutedEncoder`] encodes it with its table's INSERT plan, and
//! [`RoutedWriter`] hands pool shard `t * S + s` to table `t`'s own
//! [`HttpWriter`] as shard `s`. So each table has its own schema probe,
//! encoder and writer, and a batch only ever holds one table's rows (a
//! shard's chunks and batches are one pool shard's): rows never cross
//! tables. Acks are the engine's as for several shards: a poll batch
//! resolves when every chunk holding its rows is acknowledged (D1, ADR
//! 0001); a lane is one partition, so one topic and one table, but nothing
//! here relies on it.
//!
//! The topic of a record is resolved per record against the last topic seen
//! (one string comparison), then a per-thread cache (one hash lookup), then
//! the routes in order (once per topic and thread). A topic matching no
//! route is a record error (kind `encode`, no column) for `on_error`.
//!
//! Each table's `mapping.filter` applies to its rows ([`Filtered`] per
//! table) and its `mapping.defaults` are in its plan.
//!
//! Not with routing (refused or off): `pipeline.delivery: effectively_once`
//! and `mapping.explode` (refused at load: explode is a decoder of its own,
//! one per pipeline thread, not per table) and the live re-plan of a table changed while running
//! (ADR 0005; here a change stops the run with exit 3, and the restart
//! re-plans, as in effectively_once). The `shard` metric label is the pool
//! shard `t * S + s`; `spate run` logs which table each block is.

use std::collections::HashMap;
use std::sync::Arc;

use spate_clickhouse::writer::HttpWriter;
use spate_core::pipeline::Pipeline;
use spate_core::pipeline::chain::{Encoder, RecordCx, RecordError, RecordErrorKind, Router};
use spate_core::pipeline::driver::ChainProcessor;
use spate_core::pipeline::terminal::{ChunkBuffers, Terminal};
use spate_core::record::Payload;
use spate_core::sink::{Endpoint, SealedBatch, WriteError, Writer};
use spate_formats::json::JsonRowEncoder;
use spate_formats::json::route::ShardRouter;
use spate_kafka::{KafkaDeadLetter, KafkaSource};
use spate_row::filter::{FilterExpr, Filtered};
use spate_row::spec::{ColumnSpec, MappingOptions};

use crate::config::Config;
use crate::config::tables::{TableRoute, TopicMatch};
use crate::service::{self, MessageDecoder, Plan, ServiceError};

/// Resolves a record's topic to its route index, per thread.
#[derive(Clone, Debug)]
pub struct TopicRoutes {
    routes: Arc<[TopicMatch]>,
    last: Option<(Arc<str>, Option<usize>)>,
    seen: HashMap<Arc<str>, Option<usize>>,
}

impl TopicRoutes {
    /// Routes in config order (the first match wins).
    pub fn new(routes: &[TableRoute]) -> Self {
        Self {
            routes: routes.iter().map(|r| r.matcher.clone()).collect(),
            last: None,
            seen: HashMap::new(),
        }
    }

    /// The route of `topic`, or the record error of a topic matching none.
    ///
    /// # Errors
    /// A [`RecordError`] naming the topic when no route matches it.
    #[inline]
    pub fn resolve(&mut self, topic: &str) -> Result<usize, RecordError> {
        let found = match &self.last {
            Some((t, found)) if &**t == topic => *found,
            _ => self.miss(topic),
        };
        found.ok_or_else(|| RecordError {
            kind: RecordErrorKind::Encode,
            column: None,
            reason: format!("topic `{topic}` matches no entry of `tables`"),
        })
    }

    #[cold]
    fn miss(&mut self, topic: &str) -> Option<usize> {
        let found = match self.seen.get(topic) {
            Some(f) => *f,
            None => {
                let f = self.routes.iter().position(|m| m.matches(topic));
                self.seen.insert(topic.into(), f);
                f
            }
        };
        let key = self
            .seen
            .get_key_value(topic)
            .map(|(k, _)| Arc::clone(k))
            .expect("inserted above");
        self.last = Some((key, found));
        found
    }
}

/// Encodes each record with its topic's table's plan, and keeps or drops
/// the row by that table's `mapping.filter`.
pub struct RoutedEncoder {
    routes: TopicRoutes,
    encoders: Vec<Filtered<JsonRowEncoder>>,
    /// The table of the row `encode` appended last: `keep` is asked about
    /// that row right after it (`Encoder::keep`).
    current: usize,
}

impl<'a> Encoder<Payload<'a>> for RoutedEncoder {
    #[inline]
    fn encode(
        &mut self,
        record: &Payload<'a>,
        cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let t = self.routes.resolve(cx.payload.partition.topic())?;
        self.current = t;
        self.encoders[t].encode(record, cx, buf)
    }

    #[inline]
    fn keep(&mut self, row: &[u8]) -> bool {
        self.encoders[self.current].keep(row)
    }
}

/// Routes each record to shard `t * shards + s`: its table `t`, and `s`
/// from that table's shard key.
pub struct RoutedRouter {
    routes: TopicRoutes,
    routers: Vec<ShardRouter>,
    shards: usize,
}

impl<'a> Router<Payload<'a>> for RoutedRouter {
    /// Only for callers that cannot take a record error; the terminal
    /// stage calls [`Router::try_route`]. A record with no table (its topic
    /// matches no route, or it lacks its shard key) has no right answer, so
    /// this panics rather than guess one (a guessed table would be wrong
    /// data).
    fn route(&mut self, record: &Payload<'a>, cx: &RecordCx<'_>, shards: usize) -> usize {
        match self.try_route(record, cx, shards) {
            Ok(shard) => shard,
            Err(e) => panic!("RoutedRouter::route without a table or shard: {e}"),
        }
    }

    #[inline]
    fn try_route(
        &mut self,
        record: &Payload<'a>,
        cx: &RecordCx<'_>,
        shards: usize,
    ) -> Result<usize, RecordError> {
        debug_assert_eq!(shards, self.shards * self.routers.len(), "pool shards");
        let t = self.routes.resolve(cx.payload.partition.topic())?;
        let s = self.routers[t].try_route(record, cx, self.shards)?;
        debug_assert!(s < self.shards, "shard {s} of table {t}");
        Ok(t * self.shards + s)
    }
}

/// Hands pool shard `t * shards + s` to table `t`'s writer as shard `s`.
pub struct RoutedWriter {
    writers: Vec<HttpWriter>,
    shards: usize,
}

impl RoutedWriter {
    /// Table `t`'s writer and the endpoint as it knows it.
    fn split(&self, endpoint: &Endpoint) -> (&HttpWriter, Endpoint) {
        let t = endpoint.shard / self.shards;
        debug_assert!(t < self.writers.len(), "pool shard {}", endpoint.shard);
        let local = Endpoint {
            shard: endpoint.shard % self.shards,
            replica: endpoint.replica,
            url: Arc::clone(&endpoint.url),
        };
        (&self.writers[t], local)
    }
}

impl Writer for RoutedWriter {
    async fn write(&self, endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        let (w, local) = self.split(endpoint);
        w.write(&local, batch).await
    }

    async fn probe(&self, endpoint: &Endpoint) -> Result<(), WriteError> {
        let (w, local) = self.split(endpoint);
        w.probe(&local).await
    }
}

/// The chain of one pipeline thread with routing.
pub type RoutedChain = ChainProcessor<MessageDecoder, Terminal<RoutedEncoder, RoutedRouter>>;

/// A pipeline with topic-to-table routing, ready to run.
pub type RoutedPipeline =
    Pipeline<KafkaSource, RoutedWriter, Box<dyn Fn(ChunkBuffers) -> RoutedChain + Send + Sync>>;

/// Each route's INSERT plan ([`service::plan`] on its config), in order.
///
/// # Errors
/// The first route's [`ServiceError`] (its table missing, a column that
/// cannot be mapped), naming the table.
pub async fn plans(routes: &[TableRoute]) -> Result<Vec<Plan>, ServiceError> {
    let mut plans = Vec::with_capacity(routes.len());
    for r in routes {
        plans.push(service::plan(&r.config).await?);
    }
    Ok(plans)
}

/// The routed pipeline's config: `config`'s, over the pool shards of every
/// table (`t * S + s`), its table named as every route's, `,`-joined. Logs
/// which block of pool shards each table is.
fn pool_config(
    config: &Config,
    routes: &[TableRoute],
    pool_shards: Vec<Vec<String>>,
) -> spate_core::pipeline::PipelineConfig {
    let shards = config.sink.clickhouse.shards.len();
    let mut pc = config.pipeline_config();
    pc.sink.shards = pool_shards;
    pc.table = routes
        .iter()
        .map(|r| {
            let ch = &r.config.sink.clickhouse;
            format!("{}.{}", ch.database, ch.table)
        })
        .collect::<Vec<_>>()
        .join(",");
    for (t, r) in routes.iter().enumerate() {
        let ch = &r.config.sink.clickhouse;
        tracing::info!(
            route = %r.key,
            table = %format!("{}.{}", ch.database, ch.table),
            pool_shards = %format!("{}..{}", t * shards, (t + 1) * shards),
            "table route (the `shard` metric label is the pool shard)"
        );
    }
    pc
}

/// Builds the routed pipeline of `config` (the first route's config) over
/// `routes` with their `plans`, and its dead-letter producer when one is
/// configured (flush it after the run).
///
/// # Errors
/// [`ServiceError`] from a writer's config, the Kafka client, the
/// dead-letter producer or the pipeline builder.
pub fn build(
    config: &Config,
    routes: &[TableRoute],
    plans: &[Plan],
) -> Result<(RoutedPipeline, Option<Arc<KafkaDeadLetter>>), ServiceError> {
    assert_eq!(routes.len(), plans.len(), "one plan per route");
    assert!(!routes.is_empty(), "routing needs a route");
    let shards = config.sink.clickhouse.shards.len();
    let mut writers = Vec::with_capacity(routes.len());
    let mut routers = Vec::with_capacity(routes.len());
    let mut pool_shards = Vec::with_capacity(routes.len() * shards);
    for (r, plan) in routes.iter().zip(plans) {
        let ch = &r.config.sink.clickhouse;
        debug_assert_eq!(ch.shards, config.sink.clickhouse.shards, "shared shards");
        let mut wc = service::writer_config(&r.config, plan.typed_columns())?;
        wc.row_format = plan.row_format;
        // No live re-plan: a table changed while running stops the run.
        wc.live = None;
        writers.push(HttpWriter::new(wc));
        routers.push(ShardRouter::with_spec(ch.shard_spec()?));
        pool_shards.extend(ch.shards.iter().cloned());
    }
    let pc = pool_config(config, routes, pool_shards);
    let writer = RoutedWriter { writers, shards };
    let source = KafkaSource::new(config.kafka_config())?;
    let decoder = MessageDecoder::of(config);
    type TableMapping = (Vec<ColumnSpec>, MappingOptions, Option<FilterExpr>);
    let mapping: Vec<TableMapping> = plans
        .iter()
        .map(|p| {
            debug_assert!(p.explode.is_none(), "refused with tables at load");
            (p.columns.clone(), p.options.clone(), p.filter.clone())
        })
        .collect();
    let topic_routes = TopicRoutes::new(routes);
    let factory: Box<dyn Fn(ChunkBuffers) -> RoutedChain + Send + Sync> =
        Box::new(move |buffers: ChunkBuffers| {
            // plan() built each encoder and filter once, so this cannot fail.
            let checked = "the encoder and filter were checked by plan()";
            let encoders = mapping
                .iter()
                .map(|(c, o, f)| {
                    let e = JsonRowEncoder::new(c.clone(), o.clone()).expect(checked);
                    Filtered::new(e, f.clone(), o.time.clone()).expect(checked)
                })
                .collect();
            let encoder = RoutedEncoder {
                routes: topic_routes.clone(),
                encoders,
                current: 0,
            };
            let router = RoutedRouter {
                routes: topic_routes.clone(),
                routers: routers.clone(),
                shards,
            };
            ChainProcessor::new(decoder, Terminal::new(encoder, router, buffers))
        });
    service::assemble(config, pc, source, writer, factory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::pipelines::ProcessConfig;

    #[test]
    fn topics_resolve_to_the_first_matching_route_and_unmatched_is_a_record_error() {
        let text = r#"
pipeline: {name: p}
source: {kafka: {brokers: 'b:1', group_id: g}}
sink: {clickhouse: {shards: [[http://c:8123]]}}
tables: {events.a: ta, "^events\\.": tb}
"#;
        let p = ProcessConfig::from_yaml(text, |_| None).unwrap();
        let mut r = TopicRoutes::new(&p.pipelines[0].tables);
        assert_eq!(r.resolve("events.a").unwrap(), 0);
        assert_eq!(r.resolve("events.a").unwrap(), 0);
        assert_eq!(r.resolve("events.b").unwrap(), 1);
        assert_eq!(r.resolve("events.a").unwrap(), 0);
        let e = r.resolve("other").unwrap_err();
        assert_eq!(e.kind, RecordErrorKind::Encode);
        assert!(e.reason.contains("`other` matches no entry"), "{e}");
        assert_eq!(r.resolve("events.b").unwrap(), 1);
        assert!(r.resolve("other").is_err());
    }
}
