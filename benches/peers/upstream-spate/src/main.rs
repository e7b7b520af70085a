//! The sensor workload (issue 21's `SensorBatch`: 100 events a message) with
//! upstream spate 0.2.0, configured as its own fan-out example recommends for
//! throughput: Confluent-framed Avro through the registry, the single-pass
//! datum deserializer into borrowed records (`build_datum`), `flat_map` into
//! one row per event, `filter` for the workload's two filters, the region
//! coalesced in the flat_map, and the ClickHouse sink in the format the YAML
//! names (`rowbinary` or `native`). `name_upper` and `value_scaled` are
//! MATERIALIZED in the table, for every arm alike.
//!
//! `SPATE_CONFIG` names the YAML (ci/peer-bench.sh writes it).

use serde::{Deserialize, Serialize};
use spate::avro::AvroDeserializerBuilder;
use spate::clickhouse::{ClickHouseEncoder, NativeEncoder};
use spate::kafka::KafkaSource;
use spate::prelude::*;
use std::path::Path;

/// One message: a batch of sensor events (the writer schema's field order).
#[derive(Deserialize)]
struct SensorBatch<'a> {
    batch_id: i64,
    #[serde(borrow)]
    source: &'a str,
    #[serde(borrow)]
    region: Option<&'a str>,
    produced_at: i64,
    #[serde(borrow)]
    events: Vec<SensorEvent<'a>>,
}

/// One event of a batch.
#[derive(Deserialize)]
struct SensorEvent<'a> {
    event_seq: i32,
    sensor_id: i32,
    #[serde(borrow)]
    name: &'a str,
    value: f64,
    quality: Option<i32>,
    #[serde(borrow)]
    unit: &'a str,
    ts: i64,
}

/// One row of `sensor_events`, in the YAML's `columns` order.
#[derive(Serialize)]
struct SensorRow<'a> {
    batch_id: u64,
    source: &'a str,
    region: &'a str,
    produced_at: u64,
    event_seq: u32,
    sensor_id: u32,
    name: &'a str,
    value: f64,
    quality: Option<i32>,
    unit: &'a str,
    ts: u64,
}

struct BatchFam;
impl RecFamily for BatchFam {
    type Rec<'buf> = SensorBatch<'buf>;
}

struct RowFam;
impl RecFamily for RowFam {
    type Rec<'buf> = SensorRow<'buf>;
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config_path = std::env::var("SPATE_CONFIG")?;
    let native = std::env::var("UPSTREAM_FORMAT").as_deref() == Ok("native");
    let pipeline = Pipeline::from_path(Path::new(&config_path))?;
    let source = KafkaSource::from_component_config(&pipeline.config().source)?;
    let deser_section = pipeline
        .config()
        .deserializer
        .as_ref()
        .ok_or("this pipeline requires a `deserializer` section")?;
    let deserializer = AvroDeserializerBuilder::from_component(deser_section, &pipeline.io_handle())?
        .build_datum::<BatchFam>()?;
    let sink = spate::clickhouse::config::from_component_config(pipeline.config().sink_config("default")?)?;
    let explode = |batch: SensorBatch<'_>, out: &mut spate::ops::Emitter<'_, RowFam>| {
        let region = batch.region.unwrap_or("unknown");
        for e in batch.events {
            out.emit(SensorRow {
                batch_id: batch.batch_id as u64,
                source: batch.source,
                region,
                produced_at: batch.produced_at as u64,
                event_seq: e.event_seq as u32,
                sensor_id: e.sensor_id as u32,
                name: e.name,
                value: e.value,
                quality: e.quality,
                unit: e.unit,
                ts: e.ts as u64,
            });
        }
    };
    let keep = |r: &SensorRow<'_>| r.unit != "drop" && r.value >= 0.0;
    let report = if native {
        let schema = pipeline.block_on(sink.native_schema())?;
        let encoder = NativeEncoder::<RowFam>::new(schema);
        let router = KeyHashRouter;
        pipeline
            .sink(sink)?
            .chains(move |ctx| {
                let chunk_cfg = ctx.chunk();
                chain::<BatchFam, _>(deserializer.clone())
                    .with_metrics(ctx.pipeline, "main")
                    .flat_map::<RowFam, _>(explode)
                    .filter(keep)
                    .sink(encoder.clone(), router, chunk_cfg, ctx.queues, ctx.budget)
                    .build()
            })
            .run(source)?
    } else {
        let encoder = ClickHouseEncoder::<RowFam>::new();
        let router = KeyHashRouter;
        pipeline
            .sink(sink)?
            .chains(move |ctx| {
                let chunk_cfg = ctx.chunk();
                chain::<BatchFam, _>(deserializer.clone())
                    .with_metrics(ctx.pipeline, "main")
                    .flat_map::<RowFam, _>(explode)
                    .filter(keep)
                    .sink(encoder.clone(), router, chunk_cfg, ctx.queues, ctx.budget)
                    .build()
            })
            .run(source)?
    };
    report.log();
    std::process::exit(report.exit_code());
}
