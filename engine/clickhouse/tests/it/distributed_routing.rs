//! spate's router picks the shard a real `Distributed` table would (opt-in:
//! `SPATE_CLICKHOUSE_SHARDS`, the replicated layout of `ci/clickhouse.sh
//! start-replicated 2 2`, whose instances know the cluster `spate_weighted`:
//! shard s weighs 3s+2). Rows are inserted through `Distributed` tables with
//! the sharding keys `id` (UInt64), `v` (Int64) and `w` (Int32, negatives
//! included: each counts as the unsigned integer of its width), and
//! each row's shard is compared with [`ShardRouter`] in `hash: value` mode
//! with the same weights. Where the server has `xxHash64` (not 18.16) the
//! sharding key `xxHash64(id)` is compared with `hash: xxhash64` too; on
//! 18.16 the typed hash is checked by the fixed vectors in spate-row's `shard.rs` and spate-formats' `json/route.rs`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use spate_clickhouse::writer::{HttpWriter, HttpWriterConfig};
use spate_formats::json::route::ShardRouter;
use spate_row::shard::{KeyHash, KeyType, ShardKey, ShardSpec};

fn shards() -> Option<Vec<Vec<String>>> {
    let Ok(spec) = std::env::var("SPATE_CLICKHOUSE_SHARDS") else {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: SPATE_CLICKHOUSE_SHARDS not set"
        );
        return None;
    };
    Some(
        spec.split(';')
            .map(|s| s.split(',').map(|u| u.trim().to_owned()).collect())
            .collect(),
    )
}

async fn sql(ch: &HttpWriter, url: &str, q: &str) -> String {
    ch.query(url, q)
        .await
        .unwrap_or_else(|e| panic!("{url}: {q}: {e}"))
}

/// The shard of each `col` value of local table `local`, from every replica.
async fn placed(
    ch: &HttpWriter,
    shards: &[Vec<String>],
    local: &str,
    col: &str,
) -> BTreeMap<i64, usize> {
    let mut at = BTreeMap::new();
    for (s, replicas) in shards.iter().enumerate() {
        for url in replicas {
            let text = sql(ch, url, &format!("SELECT toInt64({col}) FROM {local}")).await;
            for line in text.lines() {
                let v: i64 = line.parse().unwrap();
                assert_eq!(at.insert(v, s), None, "{col} = {v} stored twice");
            }
        }
    }
    at
}

fn spec(field: &str, hash: KeyHash, shards: usize) -> ShardSpec {
    ShardSpec {
        key: ShardKey::field(field),
        hash,
        weights: (0..shards as u64).map(|s| 3 * s + 2).collect(),
        ..ShardSpec::default()
    }
}

#[tokio::test]
async fn rows_land_where_the_distributed_engine_puts_them() {
    let Some(shards) = shards() else { return };
    let ch = HttpWriter::new(HttpWriterConfig::new("default", "", Vec::new()));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let t = format!("spate_dist_{}_{nanos}", std::process::id());
    let first = &shards[0][0];
    let has_xxhash = sql(
        &ch,
        first,
        "SELECT count() FROM system.functions WHERE name = 'xxHash64'",
    )
    .await
    .trim()
        == "1";
    let mut keys = vec![("id", "id", KeyHash::Value(KeyType::UInt64))];
    keys.push(("v", "v", KeyHash::Value(KeyType::Int64)));
    keys.push(("w", "w", KeyHash::Value(KeyType::Int32)));
    if has_xxhash {
        keys.push(("xid", "xxHash64(id)", KeyHash::Typed(KeyType::UInt64)));
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "this server has no xxHash64: the typed hash is checked by router.rs's vectors"
        );
    }
    for (name, _, _) in &keys {
        for url in shards.iter().flatten() {
            sql(
                &ch,
                url,
                &format!(
                    "CREATE TABLE default.{t}_{name} (id UInt64, v Int64, w Int32) \
                     ENGINE = MergeTree ORDER BY id"
                ),
            )
            .await;
        }
    }
    let n = 300i64;
    let rows: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"id":{i},"v":{0},"w":{0}}}"#, i - 150))
        .collect();
    for (name, key, hash) in &keys {
        sql(
            &ch,
            first,
            &format!(
                "CREATE TABLE default.{t}_d{name} (id UInt64, v Int64, w Int32) \
                 ENGINE = Distributed(spate_weighted, default, {t}_{name}, {key})"
            ),
        )
        .await;
        let mut insert = HttpWriterConfig::new("default", "", Vec::new());
        insert
            .settings
            .push(("insert_distributed_sync".into(), "1".into()));
        let values: Vec<String> = (0..n).map(|i| format!("({i},{0},{0})", i - 150)).collect();
        sql(
            &HttpWriter::new(insert),
            first,
            &format!(
                "INSERT INTO default.{t}_d{name} VALUES {}",
                values.join(",")
            ),
        )
        .await;
        let field = match *name {
            "v" | "w" => *name,
            _ => "id",
        };
        let at = placed(&ch, &shards, &format!("default.{t}_{name}"), field).await;
        assert_eq!(at.len(), n as usize, "{name}: every row stored once");
        let mut router = ShardRouter::with_spec(spec(field, *hash, shards.len()));
        let mut per_shard = vec![0u32; shards.len()];
        for (i, row) in rows.iter().enumerate() {
            let want = router
                .try_shard_for(None, row.as_bytes(), shards.len())
                .unwrap();
            let value = if field == "id" {
                i as i64
            } else {
                i as i64 - 150
            };
            assert_eq!(
                at[&value], want,
                "sharding key {key}: row {row} went to shard {} but spate routes it to {want}",
                at[&value]
            );
            per_shard[want] += 1;
        }
        assert!(
            per_shard.iter().all(|&c| c > 0),
            "{name}: both shards used: {per_shard:?}"
        );
        sql(&ch, first, &format!("DROP TABLE default.{t}_d{name}")).await;
        for url in shards.iter().flatten() {
            sql(&ch, url, &format!("DROP TABLE default.{t}_{name}")).await;
        }
    }
}
