//! A table's insert-deduplication window, and the insert rate that uses it up.
//!
//! `delivery: effectively_once` (docs/DESIGN.md D9) rests on the server
//! dropping a replayed batch it already has. Which inserts it remembers is a
//! property of the table, read here:
//!
//! - `Replicated*MergeTree`: the last `replicated_deduplication_window`
//!   inserted blocks, and only those younger than
//!   `replicated_deduplication_window_seconds` (18.16: 100 blocks, 604,800 s);
//!   a block matches by its `insert_deduplication_token` where the server
//!   knows that setting, else by the hash of its bytes (18.16).
//!   <https://clickhouse.com/docs/operations/settings/merge-tree-settings#replicated_deduplication_window>
//! - plain `*MergeTree`: the last `non_replicated_deduplication_window`
//!   blocks (default 0: none) on servers that have the setting; a server
//!   without it (18.16) cannot deduplicate a plain MergeTree at all.
//!   <https://clickhouse.com/docs/operations/settings/merge-tree-settings#non_replicated_deduplication_window>
//! - any other engine (Distributed, Memory, Buffer, ...): nothing.
//!
//! The table's own `SETTINGS` (from `system.tables.engine_full`) win over
//! the server's defaults (`system.merge_tree_settings`, which includes the
//! server config's `<merge_tree>` overrides). [`assess`] is the pure
//! decision; [`crate::writer::HttpWriter::dedup`] asks a server.
//!
//! The window counts inserts per table *on that shard* (a shard's replicas
//! share one ZooKeeper block list; plain MergeTree keeps it per server):
//! every partition and pipeline writing there shares it. [`InsertRate`]
//! measures a shard's inserts per second so the writer can warn while the
//! rate outruns the window.

use std::fmt;
use std::time::Duration;

/// How the server recognises a replayed insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupMatch {
    /// By `insert_deduplication_token` (current servers; spate sends the
    /// batch token): the same token drops the insert whatever its bytes.
    Token,
    /// By the hash of the block's bytes (ClickHouse 18.16, which lacks the
    /// token): the replay must carry identical bytes, which spate's
    /// deterministic batches and encoding give.
    IdenticalBytes,
}

/// What a table's deduplication window covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupWindow {
    /// The table's engine (`ReplicatedMergeTree`, `MergeTree`, ...).
    pub engine: String,
    /// The setting that bounds the window in inserts
    /// (`replicated_deduplication_window` or
    /// `non_replicated_deduplication_window`).
    pub setting: &'static str,
    /// How many of the latest inserts (blocks) the server remembers; > 0.
    pub inserts: u64,
    /// How long it remembers them, in seconds
    /// (`replicated_deduplication_window_seconds`); `None`: no time bound
    /// (plain MergeTree).
    pub seconds: Option<u64>,
    /// How a replay is recognised.
    pub by: DedupMatch,
    /// Whether the value came from the table's own `SETTINGS` (else the
    /// server default).
    pub from_table: bool,
}

impl DedupWindow {
    /// Seconds of inserts the window holds at `per_sec` inserts a second
    /// into this table on one shard: `inserts / per_sec`, capped by
    /// [`seconds`](Self::seconds). `None` when the rate is 0 (only the time
    /// bound, if any, applies).
    pub fn covers_secs(&self, per_sec: f64) -> Option<f64> {
        let by_count = (per_sec > 0.0).then(|| self.inserts as f64 / per_sec);
        match (by_count, self.seconds) {
            (Some(c), Some(s)) => Some(c.min(s as f64)),
            (Some(c), None) => Some(c),
            (None, s) => s.map(|s| s as f64),
        }
    }
}

impl fmt::Display for DedupWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}) remembers the last {} inserts",
            self.engine, self.setting, self.inserts
        )?;
        if let Some(s) = self.seconds {
            write!(f, " younger than {s} s")?;
        }
        write!(
            f,
            ", matched by {}{}",
            match self.by {
                DedupMatch::Token => "insert_deduplication_token",
                DedupMatch::IdenticalBytes =>
                    "identical block bytes (no insert_deduplication_token)",
            },
            if self.from_table {
                "; from the table's SETTINGS"
            } else {
                "; server default"
            }
        )
    }
}

/// The answer of the dedup probe: a window, or why there is none and how to
/// get one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dedup {
    /// The table drops replayed inserts within this window.
    Window(DedupWindow),
    /// The table cannot deduplicate inserts.
    Cannot {
        /// Why (engine, setting and value).
        reason: String,
        /// What to do about it (a statement to run, or the engine to use).
        fix: String,
    },
}

impl Dedup {
    /// The window, if any.
    pub fn window(&self) -> Option<&DedupWindow> {
        match self {
            Dedup::Window(w) => Some(w),
            Dedup::Cannot { .. } => None,
        }
    }
}

impl fmt::Display for Dedup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dedup::Window(w) => w.fmt(f),
            Dedup::Cannot { reason, fix } => {
                write!(f, "cannot deduplicate inserts: {reason}; fix: {fix}")
            }
        }
    }
}

/// `replicated_deduplication_window`.
pub const REPLICATED_WINDOW: &str = "replicated_deduplication_window";
/// `replicated_deduplication_window_seconds`.
pub const REPLICATED_WINDOW_SECONDS: &str = "replicated_deduplication_window_seconds";
/// `non_replicated_deduplication_window`.
pub const NON_REPLICATED_WINDOW: &str = "non_replicated_deduplication_window";

/// The window the fix messages suggest (inserts).
pub const SUGGESTED_WINDOW: u64 = 1000;

/// The `SELECT` of the server defaults [`assess`] needs, answered as
/// `JSONEachRow` `{"name":..,"value":..}` lines.
pub fn merge_tree_settings_query() -> String {
    format!(
        "SELECT name, value FROM system.merge_tree_settings WHERE name IN \
         ('{REPLICATED_WINDOW}', '{REPLICATED_WINDOW_SECONDS}', '{NON_REPLICATED_WINDOW}') \
         FORMAT JSONEachRow"
    )
}

/// The table's own `SETTINGS name = value, ...` from its `engine_full`
/// (`system.tables`), in order; empty when it has none. Values keep their
/// SQL spelling (a string stays quoted).
pub fn table_settings(engine_full: &str) -> Vec<(String, String)> {
    // The table-level SETTINGS clause closes engine_full; a quoted engine
    // argument could contain the word, so take the last one outside quotes.
    let mut at = None;
    let mut quoted = false;
    let bytes = engine_full.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'\'' => quoted = !quoted,
            b'S' if !quoted
                && engine_full[i..].starts_with("SETTINGS ")
                && (i == 0 || bytes[i - 1] == b' ') =>
            {
                at = Some(i + "SETTINGS ".len());
            }
            _ => {}
        }
        i += 1;
    }
    let Some(start) = at else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut item = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in engine_full[start..].chars() {
        if escaped {
            escaped = false;
            item.push(c);
            continue;
        }
        match c {
            '\\' if quoted => {
                escaped = true;
                item.push(c);
            }
            '\'' => {
                quoted = !quoted;
                item.push(c);
            }
            ',' if !quoted => {
                push_setting(&mut out, &item);
                item.clear();
            }
            _ => item.push(c),
        }
    }
    push_setting(&mut out, &item);
    out
}

fn push_setting(out: &mut Vec<(String, String)>, item: &str) {
    if let Some((k, v)) = item.split_once('=') {
        out.push((k.trim().to_owned(), v.trim().to_owned()));
    }
}

/// Decides what `table`'s deduplication covers: `engine` and `engine_full`
/// from `system.tables`, `defaults` the server's `(name, value)` rows from
/// [`merge_tree_settings_query`], `token` whether the server knows
/// `insert_deduplication_token`. Pure; see the module docs for the rules.
/// A window setting that is present but not a number is reported as
/// [`Dedup::Cannot`] naming it (never guessed).
pub fn assess(
    table: &str,
    engine: &str,
    engine_full: &str,
    defaults: &[(String, String)],
    token: bool,
) -> Dedup {
    let own = table_settings(engine_full);
    let lookup = |name: &str| -> Option<(String, bool)> {
        own.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| (v.clone(), true))
            .or_else(|| {
                defaults
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| (v.clone(), false))
            })
    };
    let number = |name: &str, text: &str| -> Result<u64, Dedup> {
        text.trim_matches('\'')
            .parse::<u64>()
            .map_err(|_| Dedup::Cannot {
                reason: format!("{table}: {name} is `{text}`, not a number of inserts"),
                fix: format!("ALTER TABLE {table} MODIFY SETTING {name} = {SUGGESTED_WINDOW}"),
            })
    };
    // Servers that have non_replicated_deduplication_window also have
    // ALTER TABLE ... MODIFY SETTING; 18.16 has neither.
    let modern = defaults.iter().any(|(k, _)| k == NON_REPLICATED_WINDOW);
    let by = if token {
        DedupMatch::Token
    } else {
        DedupMatch::IdenticalBytes
    };
    if !engine.ends_with("MergeTree") {
        return Dedup::Cannot {
            reason: format!("{table} has engine {engine}, which does not deduplicate inserts"),
            fix: "point sink.clickhouse.table at the *MergeTree table each shard stores \
                  (spate routes rows to shards itself), e.g. a ReplicatedMergeTree"
                .to_owned(),
        };
    }
    if engine.starts_with("Replicated") {
        let Some((text, from_table)) = lookup(REPLICATED_WINDOW) else {
            return Dedup::Cannot {
                reason: format!(
                    "{table}: the server reports no {REPLICATED_WINDOW} (system.merge_tree_settings)"
                ),
                fix: format!("set {REPLICATED_WINDOW} in the table's SETTINGS"),
            };
        };
        let inserts = match number(REPLICATED_WINDOW, &text) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let seconds = match lookup(REPLICATED_WINDOW_SECONDS) {
            Some((t, _)) => match number(REPLICATED_WINDOW_SECONDS, &t) {
                Ok(s) => Some(s),
                Err(e) => return e,
            },
            None => None,
        };
        let fix_for = |name: &str, value: &str| {
            if modern {
                format!("ALTER TABLE {table} MODIFY SETTING {name} = {value}")
            } else {
                format!(
                    "this server has no ALTER TABLE ... MODIFY SETTING: create the table again with \
                     SETTINGS {name} = {value} and move the data (INSERT INTO new SELECT * FROM old)"
                )
            }
        };
        if inserts == 0 {
            return Dedup::Cannot {
                reason: format!("{table}: {REPLICATED_WINDOW} = 0 turns deduplication off"),
                fix: fix_for(REPLICATED_WINDOW, &SUGGESTED_WINDOW.to_string()),
            };
        }
        if seconds == Some(0) {
            return Dedup::Cannot {
                reason: format!(
                    "{table}: {REPLICATED_WINDOW_SECONDS} = 0 forgets every insert at once"
                ),
                fix: fix_for(REPLICATED_WINDOW_SECONDS, "3600"),
            };
        }
        return Dedup::Window(DedupWindow {
            engine: engine.to_owned(),
            setting: REPLICATED_WINDOW,
            inserts,
            seconds,
            by,
            from_table,
        });
    }
    // A plain *MergeTree.
    if !modern {
        return Dedup::Cannot {
            reason: format!(
                "{table} is a plain {engine} on a server without {NON_REPLICATED_WINDOW} \
                 (ClickHouse 18.16 and others before it deduplicate only Replicated*MergeTree)"
            ),
            fix: format!(
                "use a Replicated{engine} table (ENGINE = Replicated{engine}('/clickhouse/tables/{{shard}}/<db>_<table>', \
                 '{{replica}}'), one replica is enough), whose block deduplication drops a replay \
                 with identical bytes"
            ),
        };
    }
    let Some((text, from_table)) = lookup(NON_REPLICATED_WINDOW) else {
        unreachable!("modern means the server lists {NON_REPLICATED_WINDOW}");
    };
    let inserts = match number(NON_REPLICATED_WINDOW, &text) {
        Ok(n) => n,
        Err(e) => return e,
    };
    if inserts == 0 {
        return Dedup::Cannot {
            reason: format!(
                "{table} is a plain {engine} with {NON_REPLICATED_WINDOW} = 0 (the default: no deduplication)"
            ),
            fix: format!(
                "ALTER TABLE {table} MODIFY SETTING {NON_REPLICATED_WINDOW} = {SUGGESTED_WINDOW}"
            ),
        };
    }
    Dedup::Window(DedupWindow {
        engine: engine.to_owned(),
        setting: NON_REPLICATED_WINDOW,
        inserts,
        seconds: None,
        by,
        from_table,
    })
}

/// How long a window should hold a shard's inserts, by default, before
/// the writer warns that it is outrun: a replay (a restart after a crash, a
/// rebalance, a zombie's late write) normally comes within a group's
/// session timeout plus a restart, well under a minute.
pub const DEFAULT_DEDUP_HORIZON: Duration = Duration::from_secs(60);

/// Over how long [`InsertRate`] counts before it computes a rate.
pub const RATE_INTERVAL: Duration = Duration::from_secs(5);

/// The least time between two warnings about one shard.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// Inserts per second into one shard's table, measured over
/// [`RATE_INTERVAL`]s, and the warning (at most every [`WARN_EVERY`]) when
/// the window holds less than the horizon at that rate. Times are
/// `tokio::time::Instant`s passed in (D7: no clock read here).
#[derive(Debug)]
pub struct InsertRate {
    since: tokio::time::Instant,
    count: u64,
    last_rate: Option<f64>,
    last_warn: Option<tokio::time::Instant>,
}

/// What [`InsertRate::record`] saw at the end of an interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateReading {
    /// Inserts per second over the interval.
    pub per_sec: f64,
    /// Seconds of inserts the window holds at that rate
    /// ([`DedupWindow::covers_secs`]).
    pub covers_secs: f64,
    /// Whether this reading should be logged as a warning: the window
    /// holds less than the horizon, and no warning went out within
    /// [`WARN_EVERY`].
    pub warn: bool,
}

impl InsertRate {
    /// A rate counter starting at `now`.
    pub fn new(now: tokio::time::Instant) -> Self {
        Self {
            since: now,
            count: 0,
            last_rate: None,
            last_warn: None,
        }
    }

    /// The rate of the last full interval, if one has passed.
    pub fn per_sec(&self) -> Option<f64> {
        self.last_rate
    }

    /// Counts one insert at `now`; at the end of an interval returns the
    /// reading against `window` and `horizon`.
    pub fn record(
        &mut self,
        now: tokio::time::Instant,
        window: &DedupWindow,
        horizon: Duration,
    ) -> Option<RateReading> {
        self.count += 1;
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < RATE_INTERVAL {
            return None;
        }
        let per_sec = self.count as f64 / elapsed.as_secs_f64();
        self.since = now;
        self.count = 0;
        self.last_rate = Some(per_sec);
        let covers_secs = window.covers_secs(per_sec).unwrap_or(f64::INFINITY);
        let short = covers_secs < horizon.as_secs_f64();
        let quiet = self
            .last_warn
            .is_some_and(|t| now.saturating_duration_since(t) < WARN_EVERY);
        let warn = short && !quiet;
        if warn {
            self.last_warn = Some(now);
        }
        Some(RateReading {
            per_sec,
            covers_secs,
            warn,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults(rows: &[(&str, &str)]) -> Vec<(String, String)> {
        rows.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// 18.16's system.merge_tree_settings (measured).
    fn old() -> Vec<(String, String)> {
        defaults(&[
            (REPLICATED_WINDOW, "100"),
            (REPLICATED_WINDOW_SECONDS, "604800"),
        ])
    }

    /// chdb-core 26.9's (measured).
    fn current() -> Vec<(String, String)> {
        defaults(&[
            (NON_REPLICATED_WINDOW, "0"),
            (REPLICATED_WINDOW, "10000"),
            (REPLICATED_WINDOW_SECONDS, "3600"),
        ])
    }

    #[test]
    fn table_settings_parse_the_last_settings_clause_outside_quotes() {
        // As 18.16 spells it (measured).
        let full = "ReplicatedMergeTree('/clickhouse/tables/{shard}/SETTINGS x', '{replica}') \
                    ORDER BY id SETTINGS replicated_deduplication_window = 7, \
                    replicated_deduplication_window_seconds = 60, index_granularity = 8192";
        assert_eq!(
            table_settings(full),
            defaults(&[
                (REPLICATED_WINDOW, "7"),
                (REPLICATED_WINDOW_SECONDS, "60"),
                ("index_granularity", "8192"),
            ])
        );
        assert_eq!(
            table_settings("MergeTree ORDER BY id SETTINGS storage_policy = 'a, b', x = 1"),
            defaults(&[("storage_policy", "'a, b'"), ("x", "1")])
        );
        assert!(table_settings("MergeTree ORDER BY id").is_empty());
        assert!(table_settings("Memory").is_empty());
    }

    #[test]
    fn replicated_on_18_16_matches_identical_bytes_with_the_table_window() {
        let full = "ReplicatedMergeTree('/p', '{replica}') ORDER BY id SETTINGS \
                    replicated_deduplication_window = 7, index_granularity = 8192";
        let d = assess("db.t", "ReplicatedMergeTree", full, &old(), false);
        assert_eq!(
            d,
            Dedup::Window(DedupWindow {
                engine: "ReplicatedMergeTree".into(),
                setting: REPLICATED_WINDOW,
                inserts: 7,
                seconds: Some(604_800),
                by: DedupMatch::IdenticalBytes,
                from_table: true,
            })
        );
        // Without a table setting: the server's default.
        let d = assess(
            "db.t",
            "ReplicatedMergeTree",
            "ReplicatedMergeTree('/p', 'r') ORDER BY id",
            &old(),
            false,
        );
        let w = d.window().unwrap();
        assert_eq!((w.inserts, w.from_table), (100, false));
    }

    #[test]
    fn plain_merge_tree_on_18_16_cannot_and_the_fix_is_replicated() {
        let d = assess(
            "db.t",
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS index_granularity = 8192",
            &old(),
            false,
        );
        let Dedup::Cannot { reason, fix } = d else {
            panic!("{d:?}")
        };
        assert!(reason.contains("plain MergeTree"), "{reason}");
        assert!(fix.contains("ReplicatedMergeTree("), "{fix}");
    }

    #[test]
    fn plain_merge_tree_on_a_current_server_needs_its_window_set() {
        let d = assess(
            "db.t",
            "MergeTree",
            "MergeTree ORDER BY id",
            &current(),
            true,
        );
        let Dedup::Cannot { fix, .. } = d else {
            panic!("{d:?}")
        };
        assert_eq!(
            fix,
            "ALTER TABLE db.t MODIFY SETTING non_replicated_deduplication_window = 1000"
        );
        let d = assess(
            "db.t",
            "ReplacingMergeTree",
            "ReplacingMergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 5, index_granularity = 8192",
            &current(),
            true,
        );
        assert_eq!(
            d,
            Dedup::Window(DedupWindow {
                engine: "ReplacingMergeTree".into(),
                setting: NON_REPLICATED_WINDOW,
                inserts: 5,
                seconds: None,
                by: DedupMatch::Token,
                from_table: true,
            })
        );
    }

    #[test]
    fn a_zero_window_or_other_engines_cannot_and_say_what_to_run() {
        let full = "ReplicatedMergeTree('/p', 'r') ORDER BY id SETTINGS replicated_deduplication_window = 0";
        let Dedup::Cannot { fix, .. } =
            assess("db.t", "ReplicatedMergeTree", full, &current(), true)
        else {
            panic!()
        };
        assert_eq!(
            fix,
            "ALTER TABLE db.t MODIFY SETTING replicated_deduplication_window = 1000"
        );
        // 18.16 has no MODIFY SETTING: the fix says to recreate.
        let Dedup::Cannot { fix, .. } = assess("db.t", "ReplicatedMergeTree", full, &old(), false)
        else {
            panic!()
        };
        assert!(fix.contains("create the table again"), "{fix}");
        let full = "ReplicatedMergeTree('/p', 'r') ORDER BY id SETTINGS replicated_deduplication_window_seconds = 0";
        assert!(
            assess("db.t", "ReplicatedMergeTree", full, &old(), false)
                .window()
                .is_none()
        );
        for engine in ["Distributed", "Memory", "Buffer", "Log"] {
            let d = assess("db.t", engine, engine, &current(), true);
            assert!(matches!(d, Dedup::Cannot { .. }), "{engine}: {d:?}");
        }
        let full = "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 'many'";
        let Dedup::Cannot { reason, .. } = assess("db.t", "MergeTree", full, &current(), true)
        else {
            panic!()
        };
        assert!(reason.contains("not a number"), "{reason}");
    }

    #[test]
    fn the_window_covers_inserts_over_the_rate_capped_by_its_seconds() {
        let mut w = DedupWindow {
            engine: "ReplicatedMergeTree".into(),
            setting: REPLICATED_WINDOW,
            inserts: 100,
            seconds: Some(604_800),
            by: DedupMatch::IdenticalBytes,
            from_table: false,
        };
        // 8 partitions sealing every 100 ms into one shard: 80 inserts/s.
        assert_eq!(w.covers_secs(80.0), Some(1.25));
        w.seconds = Some(1);
        assert_eq!(w.covers_secs(80.0), Some(1.0));
        assert_eq!(w.covers_secs(0.0), Some(1.0));
        w.seconds = None;
        assert_eq!(w.covers_secs(0.0), None);
    }

    #[test]
    fn the_rate_warning_fires_while_outrun_and_at_most_once_a_minute() {
        let w = DedupWindow {
            engine: "ReplicatedMergeTree".into(),
            setting: REPLICATED_WINDOW,
            inserts: 100,
            seconds: None,
            by: DedupMatch::IdenticalBytes,
            from_table: false,
        };
        let t0 = tokio::time::Instant::now();
        let mut r = InsertRate::new(t0);
        let horizon = Duration::from_secs(60);
        let mut readings = Vec::new();
        // 10 inserts a second for 130 s: the window holds 10 s < 60 s.
        for i in 1..=1300u64 {
            if let Some(x) = r.record(t0 + Duration::from_millis(i * 100), &w, horizon) {
                readings.push(x);
            }
        }
        assert_eq!(readings.len(), 26, "one reading per 5 s");
        assert!(
            readings
                .iter()
                .all(|x| (x.per_sec - 10.0).abs() < 0.01 && x.covers_secs < 11.0)
        );
        let warned: Vec<usize> = readings
            .iter()
            .enumerate()
            .filter(|(_, x)| x.warn)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(warned, vec![0, 12, 24], "at 5 s, 65 s, 125 s");
        assert!((r.per_sec().unwrap() - 10.0).abs() < 0.01);
        // 1 insert a second: the window holds 100 s, no warning.
        let mut r = InsertRate::new(t0);
        let quiet = (1..=20u64).filter_map(|i| r.record(t0 + Duration::from_secs(i), &w, horizon));
        assert!(quiet.into_iter().all(|x| !x.warn));
    }
}
