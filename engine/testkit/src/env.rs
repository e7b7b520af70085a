//! The real servers the opt-in tests find in the environment (ci/test.sh
//! exports these; docs/VERIFICATION.md "Environment variables").

/// The replica URLs per shard from `SPATE_CLICKHOUSE_SHARDS`
/// (`a1,a2;b1,b2`: shards split by `;`, replicas by `,`, blanks dropped).
///
/// # Errors
/// Why a test needing a replicated cluster is skipped: the variable is not
/// set, or it names fewer than 2 shards of at least 2 replicas each.
pub fn clickhouse_shards() -> Result<Vec<Vec<String>>, &'static str> {
    let Ok(spec) = std::env::var("SPATE_CLICKHOUSE_SHARDS") else {
        return Err("SPATE_CLICKHOUSE_SHARDS not set");
    };
    let shards: Vec<Vec<String>> = spec
        .split(';')
        .map(|s| {
            s.split(',')
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|s| !s.is_empty())
        .collect();
    if shards.len() < 2 || shards.iter().any(|s| s.len() < 2) {
        return Err("SPATE_CLICKHOUSE_SHARDS needs at least 2 shards of at least 2 replicas");
    }
    Ok(shards)
}
