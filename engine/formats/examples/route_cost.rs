//! The JSON shard router's cost per record: `ShardRouter::shard_for` on the
//! flights fixture (key `origin`, the 4th of 5 fields) and on the 15-column
//! event (key `country`, the 7th of 15, after strings, a null and numbers),
//! hashed as text, 4 shards. The router scans each message up to the key
//! field, so this is the price of that scan plus one XXH64.
//!
//! `cargo run --profile ci -p spate-formats --example route_cost`
//! (`ROWS=n`, default 2,000,000 per workload; `ONLY=flights` or
//! `ONLY=event` runs one, for callgrind: instructions per record = the
//! difference of two runs' totals over the difference of their `ROWS`,
//! which leaves out building the fixtures).
//!
//! Measured (callgrind, ROWS 100,000 and 300,000): flights 1,232
//! instructions per record, the event 1,869, with the mapper's lexer
//! (`json/scan/field.rs`); the router's former scan of its own took 1,274
//! and 2,426.

use std::hint::black_box;
use std::time::Instant;

use spate_formats::json::route::ShardRouter;
use spate_row::shard::ShardKey;
use spate_testkit::fixtures::{FLIGHTS_50, event15_row};

fn rows() -> usize {
    std::env::var("ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000)
}

/// Routes `n` records cycling over `messages`; prints ns per record.
fn run(what: &str, messages: &[String], key: &str, n: usize) {
    let mut router = ShardRouter::new(ShardKey::field(key));
    let mut per_shard = [0u64; 4];
    let t = Instant::now();
    for i in 0..n {
        let m = &messages[i % messages.len()];
        per_shard[router.shard_for(None, black_box(m.as_bytes()), 4)] += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(router.unkeyed(), 0, "every record has its key");
    println!(
        "{what:<10} key {key:<8} {:>6.1} ns/record  ({n} records, shards {per_shard:?})",
        secs * 1e9 / n as f64
    );
}

fn main() {
    let n = rows();
    let only = std::env::var("ONLY").unwrap_or_default();
    if only.is_empty() || only == "flights" {
        let flights: Vec<String> = FLIGHTS_50.lines().map(str::to_owned).collect();
        run("flights", &flights, "origin", n);
    }
    if only.is_empty() || only == "event" {
        let events: Vec<String> = (0..64).map(event15_row).collect();
        run("event15", &events, "country", n);
    }
}
