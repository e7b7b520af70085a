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

use crate::config::{Delivery, FaultKind};
use crate::planted::{SimBug, planted};
use crate::schema::{FIELDS, Plan, Schema, record_values};
use crate::world::{FNV_BASIS, QueuedInsert, Shared, WRONG_VALUES_KEPT, World, fnv1a};

/// spate's mapping stand-in: encodes a record as its identity (partition,
/// offset, record id: 12 bytes) and, when the table has value columns, the
/// declared types' fingerprint and the record's values in the layout it
/// probed ([`crate::schema`]).
#[derive(Clone, Debug)]
pub struct SimEncoder {
    plan: Plan,
}

impl SimEncoder {
    /// An encoder writing the layout `plan` (the schema probed at start).
    pub fn new(plan: Plan) -> Self {
        Self { plan }
    }
}

impl<'a> Encoder<Payload<'a>> for SimEncoder {
    fn encode(
        &mut self,
        record: &Payload<'a>,
        _cx: &RecordCx<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        // The payload is the record id, then its values (`schema::payload`).
        let value = record.value.unwrap_or_default();
        let bad = || {
            RecordError::decode(format!(
                "offset {}: payload is not a sim record",
                record.offset
            ))
        };
        let id = value.get(..4).ok_or_else(bad)?;
        buf.extend_from_slice(&(record.partition.partition() as u32).to_le_bytes());
        buf.extend_from_slice(&(record.offset as u32).to_le_bytes());
        buf.extend_from_slice(id);
        if self.plan.columns.is_empty() {
            return Ok(());
        }
        let values = value.get(4..4 + 2 * FIELDS).ok_or_else(bad)?;
        let field = |f: usize| u16::from_le_bytes([values[2 * f], values[2 * f + 1]]);
        // Planted: RowBinary, which declares no types (fingerprint 0).
        let declared = if planted(SimBug::IgnoreSchemaChange) {
            0
        } else {
            self.plan.fingerprint()
        };
        buf.extend_from_slice(&declared.to_le_bytes());
        let positional = planted(SimBug::PositionalColumns);
        for (k, c) in self.plan.columns.iter().enumerate() {
            let f = if positional { k % FIELDS } else { c.field };
            c.ty.encode(field(f), buf);
        }
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
    /// The columns every insert names (`INSERT INTO t (cols)`): the schema
    /// the incarnation probed, the one its [`SimEncoder`] writes.
    named: Plan,
}

impl SimWriter {
    /// The cluster of `world`, written to by an incarnation whose inserts
    /// name the columns of `named` (the schema it probed).
    pub fn new(world: Shared, named: Plan) -> Self {
        Self { world, named }
    }
}

/// What a write attempt will do, decided when it arrives.
enum Attempt {
    Refuse(&'static str),
    Write,
    WriteThenHang,
    LateWrite(Duration),
    Queue(Duration),
    Zombie(Duration),
}

fn plan(w: &mut World, shard: usize, replica: usize) -> Attempt {
    let (shards, replicas) = (w.cfg.shards, w.cfg.replicas);
    let this = |t: usize, t2: usize| t % shards == shard && t2 % replicas == replica;
    if w.fault_active(FaultKind::ShardDown, |t, _| t % shards == shard) {
        return Attempt::Refuse("shard down");
    }
    if w.fault_active(FaultKind::ReplicaDown, this) {
        return Attempt::Refuse("replica down");
    }
    if w.fault_active(FaultKind::ZombieWrite, |_, _| true) {
        // The member is a zombie (evicted, not knowing it yet): the server
        // takes its insert and runs it after the member has rejoined and
        // re-formed the range (the end of the eviction plus 0.2-2 s).
        let now = w.now();
        let rejoin = w
            .cfg
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::ZombieWrite && f.active(now))
            .map(|f| f.start + f.duration)
            .max()
            .unwrap_or(now);
        return Attempt::Zombie(rejoin + Duration::from_millis(w.rng_range(200..=2_000)));
    }
    if w.fault_active(FaultKind::WriteErrors, this) && w.rng_bool(0.5) {
        return Attempt::Refuse("write error before write");
    }
    if w.fault_active(FaultKind::AmbiguousWrites, this) && w.rng_bool(0.5) {
        return Attempt::WriteThenHang;
    }
    if w.fault_active(FaultKind::QueuedRequests, this) {
        // Frozen: the request waits until the replica thaws.
        let now = w.now();
        let thaw = w
            .cfg
            .faults
            .iter()
            .filter(|f| {
                f.kind == FaultKind::QueuedRequests && f.active(now) && this(f.target, f.target2)
            })
            .map(|f| f.start + f.duration)
            .max()
            .unwrap_or(now);
        return Attempt::Queue(thaw);
    }
    if w.fault_active(FaultKind::SlowReplica, this) {
        return Attempt::LateWrite(Duration::from_millis(w.rng_range(1_000..=3_000)));
    }
    Attempt::Write
}

/// Whether this insert fails part-way (a partial-insert fault on the
/// shard and more than one block): the number of blocks it writes first.
fn partial(w: &mut World, shard: usize, body_len: usize) -> Option<usize> {
    let shards = w.cfg.shards;
    // Every replica of the shard: the shard's table is what fails.
    let this = |t: usize, _: usize| t % shards == shard;
    let width = w.schema.row_bytes();
    let blocks = (body_len / width).div_ceil(w.cfg.block_rows.max(1));
    if blocks < 2 || !w.fault_active(FaultKind::PartialInsert, this) || !w.rng_bool(0.7) {
        return None;
    }
    Some(w.rng_range(1..=(blocks as u64 - 1)) as usize)
}

/// The identity columns (partition, offset, record id) of `body`'s rows,
/// in the layout the incarnation probed.
fn identities(w: &World, body: &[u8]) -> Vec<[u32; 3]> {
    let word = |row: &[u8], i: usize| u32::from_le_bytes(row[i..i + 4].try_into().expect("4"));
    body.chunks_exact(w.plan_row_bytes)
        .map(|row| [word(row, 0), word(row, 4), word(row, 8)])
        .collect()
}

/// Whether a range token's new body differs from its first only as D4
/// allows in `effectively_once`: the same rows in a re-probed layout (the
/// table's schema changed between the two), or rows that differ only by
/// records the log no longer holds at their offsets (compacted, deleted by
/// retention, removed by an unclean election) or offsets the oracles do not
/// demand after such an election. Any other difference (another row of a
/// record still in the log, the same layout with other bytes) is a D4
/// violation.
fn rebodied(w: &World, token: &str, body: &[u8]) -> bool {
    let Some((version, first)) = w.range_rows.get(token) else {
        return false;
    };
    let now = identities(w, body);
    if now == *first {
        return *version != w.plan_version;
    }
    let gone = |&[p, o, id]: &[u32; 3]| {
        let (p, o) = (p as usize, i64::from(o));
        p >= w.cfg.partitions || w.not_demanded(p, o) || w.ids[p].get(o as usize) != Some(&id)
    };
    let only_in = |a: &[[u32; 3]], b: &[[u32; 3]]| a.iter().filter(|r| !b.contains(r)).all(gone);
    only_in(first, &now) && only_in(&now, first)
}

/// D9's write-ahead fact, at every `effectively_once` write attempt: the
/// batch holds one partition's rows, and their offsets `[first, last]` lie
/// below the partition's committed offset or inside one range its committed
/// metadata records (`spate_core::checkpoint::ranges`). A batch recorded
/// only after its insert was sent (or never) is a breach: a crash between
/// the two would replay it under other boundaries and another token.
fn write_ahead(w: &mut World, token: &str, body: &[u8]) {
    let width = w.plan_row_bytes;
    let word = |row: &[u8], i: usize| u32::from_le_bytes(row[i..i + 4].try_into().expect("4"));
    let mut rows = body.chunks_exact(width);
    let Some(head) = rows.next() else { return };
    let p = word(head, 0) as usize;
    let (mut first, mut last) = (i64::from(word(head, 4)), i64::from(word(head, 4)));
    let mut mixed = false;
    for row in rows {
        mixed |= word(row, 0) as usize != p;
        let o = i64::from(word(row, 4));
        first = first.min(o);
        last = last.max(o);
    }
    let recorded = !mixed
        && p < w.cfg.partitions
        && (w.committed[p].is_some_and(|c| c > last)
            || spate_core::checkpoint::ranges::decode(&w.committed_meta[p])
                .is_ok_and(|rs| rs.iter().any(|&(a, b)| a <= first && last <= b)));
    if recorded {
        return;
    }
    w.unrecorded += 1;
    if w.unrecorded_inserts.len() < MISSES_KEPT {
        let at = w.now().as_millis();
        let what = if mixed {
            "holds rows of more than one partition".to_owned()
        } else {
            format!(
                "p{p} [{first}, {last}] sent at {at} ms while the group held offset {:?} metadata `{}`",
                w.committed.get(p).copied().flatten(),
                w.committed_meta.get(p).map_or("", String::as_str)
            )
        };
        w.unrecorded_inserts.push(format!("{token} {what}"));
    }
}

/// How many dedup misses a run keeps described (the rest are counted).
pub const MISSES_KEPT: usize = 4;

/// Runs the inserts a zombie sent that are due by now (all of them when
/// `all`: the end of a run), each as it arrives at the server. A zombie's
/// insert carries the token of the range it had recorded, so a new owner
/// that re-formed the range got it in first and the window drops this one.
pub fn run_zombies(w: &mut World, all: bool) {
    if w.zombie_queue.is_empty() {
        return;
    }
    let now = if all { w.base } else { w.now() };
    let mut i = 0;
    while i < w.zombie_queue.len() {
        if !all && w.zombie_queue[i].due > now {
            i += 1;
            continue;
        }
        let q = w.zombie_queue.remove(i);
        w.trace(format!(
            "s{}r{} zombie insert {} lands late",
            q.shard, q.replica, q.token
        ));
        let drops = w.dedup_drops;
        if apply(w, q.shard, q.replica, &q.token, &q.named, &q.body, None).is_ok() {
            w.zombie_landed += 1;
            if w.dedup_drops > drops {
                w.zombie_dropped += 1;
            }
        }
    }
}

/// Runs the inserts a thawed replica held (in order, each as it arrives at
/// the server: refused if the schema changed meanwhile). Called every tick.
pub fn run_queued(w: &mut World) {
    let now = w.now();
    while w.server_queue.front().is_some_and(|q| q.due <= now) {
        let q = w.server_queue.pop_front().expect("front");
        if apply(w, q.shard, q.replica, &q.token, &q.named, &q.body, None).is_ok() {
            w.ambiguous_writes += 1;
        }
    }
}

/// Why the server refused an insert before writing any of it.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// The declared column types differ from the table's (Native format).
    Types,
    /// The bytes are not whole rows of the table's layout (RowBinary).
    Layout,
    /// The value columns the insert names are not the table's (one was
    /// added or dropped since the incarnation probed).
    Columns,
}

impl Refusal {
    fn message(self) -> &'static str {
        match self {
            Refusal::Types => {
                "Code: 368: the block's column types differ from the table's (schema changed)"
            }
            Refusal::Layout => "Code: 27: Cannot parse input: rows do not match the table's layout",
            Refusal::Columns => {
                "Code: 20: the insert's columns are not the table's (schema changed)"
            }
        }
    }
}

/// Checks an insert naming the columns of `named` and carrying `body`
/// against the table's current schema, as the server parses an insert.
///
/// spate's INSERT names its columns (`INSERT INTO t (cols) FORMAT Native`,
/// `engine/clickhouse/src/writer/mod.rs`) and a Native block carries each
/// column's name and type (ADR 0003), so ClickHouse (18.16 and current)
/// reads the body by the insert's own column list and never re-slices it
/// under the table's: rows of identity columns only stay rows of identity
/// columns after an `ADD COLUMN`. The model refuses an insert whose named
/// value columns are not the table's ([`Refusal::Columns`]), as it refuses
/// a stale type (stricter than a real server, which fills an added column
/// the insert does not name with its default, docs:
/// <https://clickhouse.com/docs/en/sql-reference/statements/insert-into>;
/// the engine's real writer then re-plans live, ADR 0005, which this model
/// does not: its incarnations keep the plan they probed). Either way no row
/// lands with bytes read as another column. The checks run in the order the model always ran them (width,
/// then declared types), the column list last, so a refusal the earlier
/// checks gave keeps its message.
fn admit(w: &World, named: &Plan, body: &[u8]) -> Result<(), Refusal> {
    let width = w.schema.row_bytes();
    if body.len() % width != 0 {
        return Err(Refusal::Layout);
    }
    if !w.schema.columns.is_empty() {
        let fp = w.schema.fingerprint();
        for row in body.chunks_exact(width) {
            let declared = u32::from_le_bytes(row[12..16].try_into().expect("4 bytes"));
            // 0: RowBinary, which declares nothing and is parsed as is.
            if declared != 0 && declared != fp {
                return Err(Refusal::Types);
            }
        }
    }
    let fields = |s: &Schema| s.columns.iter().map(|c| c.field).collect::<Vec<_>>();
    if fields(named) != fields(&w.schema) {
        return Err(Refusal::Columns);
    }
    Ok(())
}

/// Runs an insert naming the columns of `named` with `body` on replica
/// `replica` of `shard`: refused whole if it does not fit the table's
/// schema now ([`admit`]); else split into blocks of
/// `block_rows` rows, each applied unless its token (the insert's token,
/// `#i` for block `i > 0`) is in the dedup window. With `fail_after`, only
/// that many blocks are written. Returns the refusal, if any.
fn apply(
    w: &mut World,
    shard: usize,
    replica: usize,
    batch_token: &str,
    named: &Plan,
    body: &[u8],
    fail_after: Option<usize>,
) -> Result<(), Refusal> {
    if let Err(r) = admit(w, named, body) {
        w.schema_refusals += 1;
        w.trace(format!(
            "s{shard}r{replica} refuse {batch_token}: {} (table {})",
            r.message(),
            w.schema.describe()
        ));
        return Err(r);
    }
    let width = w.schema.row_bytes();
    let block_bytes = w.cfg.block_rows.saturating_mul(width);
    for (i, block) in body.chunks(block_bytes.max(width)).enumerate() {
        if fail_after.is_some_and(|k| i >= k) {
            break;
        }
        let token = if i == 0 {
            batch_token.to_owned()
        } else {
            format!("{batch_token}#{i}")
        };
        apply_block(w, shard, replica, &token, block, width);
    }
    Ok(())
}

/// Applies one block unless its token is in the dedup window, and judges
/// each row's values (the value oracle's facts).
fn apply_block(
    w: &mut World,
    shard: usize,
    replica: usize,
    token: &str,
    block: &[u8],
    width: usize,
) {
    let window = w.cfg.dedup_window;
    if window > 0 && w.dedup[shard].contains(token) {
        w.dedup_drops += 1;
        if w.applied_tokens[shard]
            .get(token)
            .is_some_and(|&i| i < w.incarnations)
        {
            w.replay_drops += 1;
        }
        w.trace(format!("s{shard}r{replica} dedup drop {token}"));
        return;
    }
    if window > 0 {
        w.dedup[shard].insert(token, window);
    }
    // A block this shard applied before, which the window no longer holds
    // (or never could): the replay was not covered. Not traced (the trace of
    // at-least-once runs stays as it was); counted for the D9 oracle.
    let incarnation = w.incarnations;
    if w.applied_tokens[shard]
        .insert(token.to_owned(), incarnation)
        .is_some()
    {
        w.dedup_misses += 1;
        if w.dedup_miss_examples.len() < MISSES_KEPT {
            let why = if window == 0 {
                "the table does not deduplicate".to_owned()
            } else {
                format!("it left the window of {window} inserts")
            };
            let at = w.now().as_millis();
            w.dedup_miss_examples
                .push(format!("s{shard} applied {token} again at {at} ms: {why}"));
        }
    }
    let reformed = w.cfg.delivery == Delivery::EffectivelyOnce && w.reformed_range(token);
    for row in block.chunks_exact(width) {
        let word = |i: usize| u32::from_le_bytes(row[i..i + 4].try_into().expect("4 bytes"));
        let (p, o, id) = (word(0) as usize, i64::from(word(4)), word(8));
        let known = w.records.len();
        if reformed {
            w.land_reformed(p, o, id);
        } else {
            w.land(p, o, id);
        }
        if (id as usize) < known && !w.schema.columns.is_empty() {
            check_values(w, p, o, id, &row[16..]);
        }
    }
    w.insert_part(shard, replica, (block.len() / width) as u64);
    w.trace(format!(
        "s{shard}r{replica} insert {token} rows={}",
        block.len() / width
    ));
}

/// The value oracle's fact: `values` (a row's value columns) decode under
/// the table's current schema to exactly record `id`'s values.
fn check_values(w: &mut World, p: usize, o: i64, id: u32, values: &[u8]) {
    let want = record_values(id);
    let mut at = 0;
    let mut wrong = None;
    for c in &w.schema.columns {
        let got = c.ty.decode(&values[at..]);
        at += c.ty.width();
        if got != f64::from(want[c.field]) {
            wrong = Some((c.field, c.ty, got, want[c.field]));
            break;
        }
    }
    if let Some((f, ty, got, want)) = wrong {
        w.wrong_value_rows += 1;
        if w.wrong_values.len() < WRONG_VALUES_KEPT {
            let schema = w.schema.describe();
            w.wrong_values.push(format!(
                "p{p} offset {o} (record {id}): column f{f} {ty:?} reads {got}, the record held {want} (table {schema})"
            ));
        }
    }
}

/// An attempt reaches the server: samples the in-flight budget, notes the
/// D4 fact (one token, one byte content, across every attempt and every
/// incarnation) and, in effectively_once, the range's rows and the
/// write-ahead fact (D9). Returns the attempt's latency.
fn note_attempt(w: &mut World, token: &str, body: &[u8]) -> Duration {
    w.sample_budget();
    let h = fnv1a(body.iter().copied(), FNV_BASIS);
    let seen = *w.tokens.entry(token.to_owned()).or_insert(h);
    let eo = w.cfg.delivery == Delivery::EffectivelyOnce;
    if seen != h {
        if eo && rebodied(w, token, body) {
            w.token_rebodied += 1;
        } else {
            w.token_conflicts.push(token.to_owned());
        }
    }
    if eo {
        if seen == h && !w.range_rows.contains_key(token) {
            let rows = (w.plan_version, identities(w, body));
            w.range_rows.insert(token.to_owned(), rows);
        }
        write_ahead(w, token, body);
    }
    let (lo, hi) = w.cfg.write_latency_ms;
    Duration::from_millis(w.rng_range(lo..=hi))
}

impl SimWriter {
    /// [`Attempt::Write`]: applies the insert now, or with a partial-insert
    /// fault only its first blocks, and then fails it (retryable).
    fn write_now(
        &self,
        shard: usize,
        replica: usize,
        token: &str,
        body: &[u8],
    ) -> Result<(), WriteError> {
        let mut w = self.world.lock();
        let fail_after = partial(&mut w, shard, body.len());
        apply(&mut w, shard, replica, token, &self.named, body, fail_after)
            .map_err(|r| WriteError::fatal(r.message()))?;
        if let Some(k) = fail_after {
            w.partial_inserts += 1;
            w.trace(format!(
                "s{shard}r{replica} insert {token} failed after {k} blocks"
            ));
            return Err(WriteError::retryable(
                "simulated failure after some blocks were written",
            ));
        }
        Ok(())
    }

    /// An insert the server runs later, at `due` (a zombie, or a frozen
    /// server's queue).
    fn queued(
        &self,
        due: Duration,
        shard: usize,
        replica: usize,
        token: &str,
        body: bytes::Bytes,
    ) -> QueuedInsert {
        QueuedInsert {
            due,
            shard,
            replica,
            token: token.to_owned(),
            named: self.named.clone(),
            body,
        }
    }
}

impl Writer for SimWriter {
    async fn write(&self, endpoint: &Endpoint, batch: &SealedBatch) -> Result<(), WriteError> {
        let (shard, replica) = (endpoint.shard, endpoint.replica);
        let body = batch.to_contiguous();
        let latency = note_attempt(&mut self.world.lock(), batch.token(), &body);
        tokio::time::sleep(latency).await;
        let attempt = plan(&mut self.world.lock(), shard, replica);
        let refused = |r: Refusal| WriteError::fatal(r.message());
        match attempt {
            Attempt::Refuse(why) => {
                self.world.lock().trace(format!(
                    "s{shard}r{replica} refuse {} ({why})",
                    batch.token()
                ));
                Err(WriteError::retryable(why))
            }
            Attempt::Write => self.write_now(shard, replica, batch.token(), &body),
            Attempt::WriteThenHang => {
                {
                    let mut w = self.world.lock();
                    apply(
                        &mut w,
                        shard,
                        replica,
                        batch.token(),
                        &self.named,
                        &body,
                        None,
                    )
                    .map_err(refused)?;
                    w.ambiguous_writes += 1;
                }
                std::future::pending().await
            }
            Attempt::LateWrite(delay) => {
                // The server goes on after the client has given up.
                let world = self.world.clone();
                let token = batch.token().to_owned();
                let named = self.named.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let mut w = world.lock();
                    if apply(&mut w, shard, replica, &token, &named, &body, None).is_ok() {
                        w.ambiguous_writes += 1;
                    }
                });
                std::future::pending().await
            }
            Attempt::Zombie(due) => {
                let zombie = self.queued(due, shard, replica, batch.token(), body);
                self.world.lock().hold_zombie(zombie);
                // The zombie hears nothing before its write timeout.
                std::future::pending().await
            }
            Attempt::Queue(thaw) => {
                {
                    let mut w = self.world.lock();
                    let due = thaw + Duration::from_millis(10 * w.server_queue.len() as u64);
                    w.trace(format!(
                        "s{shard}r{replica} frozen: queued {} to run at {} ms",
                        batch.token(),
                        due.as_millis()
                    ));
                    let queued = self.queued(due, shard, replica, batch.token(), body);
                    w.server_queue.push_back(queued);
                }
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
