//! Planted bugs, for proving the simulator's oracles can fail
//! (`spate-verify`'s `planted_bugs_are_caught` test).
//!
//! With the `planted-bugs` cargo feature, a test may `plant` one bug at a
//! time; the engine then misbehaves at exactly one site. Without the feature
//! [`active`] is a constant `false` and every site compiles away. Never enable
//! the feature in a build that ships.

/// The bugs that can be planted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Bug {
    /// Acks are delivered when a batch is sealed, before its write is
    /// acknowledged (breaks D1).
    CommitBeforeAck = 1,
    /// Every run uses the same nonce, so tokens repeat after a restart
    /// (breaks D4).
    TokenReusedAfterRestart = 2,
    /// Tokens leave out the run nonce, so they repeat across pools (breaks D4).
    TokenWithoutNonce = 3,
    /// Drain drops the open partial batch instead of sealing it (breaks D5/D6:
    /// a healthy drain abandons data).
    DrainDropsPartialBatch = 4,
    /// A revoked partition is never released from the tracker, so its old
    /// epoch keeps being committed after the group moved on.
    CommitReleasedEpoch = 5,
    /// A write that times out (ambiguous) is taken as a success and its acks
    /// delivered (breaks D1 when the write lands late or never).
    TimeoutIsSuccess = 6,
    /// The in-flight budget admits everything (breaks D8).
    BudgetIgnored = 7,
    /// `effectively_once`: a range's parts are written before the commit
    /// recording the range has succeeded (breaks D9's write-ahead rule: a
    /// crash in between replays the rows under other boundaries).
    InsertBeforeRecord = 8,
    /// `effectively_once`: on assignment the lane ignores the ranges the
    /// committed metadata records and forms new ones from the committed
    /// offset (breaks D9: a replay gets other tokens and lands twice).
    ReplayIgnoresRanges = 9,
    /// `effectively_once`: the range token leaves out the partition, so two
    /// partitions' parts of the same offsets share one (breaks D4, and the
    /// server drops one of them: D1).
    RangeTokenWithoutPartition = 10,
    /// `effectively_once`: the range token leaves out the shard, so the
    /// shard parts of one range share one (breaks D4).
    RangeTokenWithoutShard = 11,
}

impl Bug {
    /// Every bug, in declaration order.
    pub const ALL: [Bug; 11] = [
        Bug::CommitBeforeAck,
        Bug::TokenReusedAfterRestart,
        Bug::TokenWithoutNonce,
        Bug::DrainDropsPartialBatch,
        Bug::CommitReleasedEpoch,
        Bug::TimeoutIsSuccess,
        Bug::BudgetIgnored,
        Bug::InsertBeforeRecord,
        Bug::ReplayIgnoresRanges,
        Bug::RangeTokenWithoutPartition,
        Bug::RangeTokenWithoutShard,
    ];

    /// Whether the bug sits on the `effectively_once` path (it shows only
    /// in runs of that mode).
    pub fn effectively_once(self) -> bool {
        matches!(
            self,
            Bug::InsertBeforeRecord
                | Bug::ReplayIgnoresRanges
                | Bug::RangeTokenWithoutPartition
                | Bug::RangeTokenWithoutShard
        )
    }
}

#[cfg(feature = "planted-bugs")]
static ACTIVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Plants `bug` (or none) process-wide.
#[cfg(feature = "planted-bugs")]
pub fn plant(bug: Option<Bug>) {
    ACTIVE.store(
        bug.map_or(0, |b| b as u8),
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// Whether `bug` is planted.
#[inline(always)]
pub fn active(bug: Bug) -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        ACTIVE.load(std::sync::atomic::Ordering::Relaxed) == bug as u8
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        let _ = bug;
        false
    }
}
