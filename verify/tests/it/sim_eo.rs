//! The simulator's pieces for effectively-once (issue 23), checked on their
//! own: the commit store keeps each partition's metadata with its offset and
//! hands both back at assignment; the group coordinator refuses commits of
//! a member that no longer owns the epoch, also when a slow coordinator gets
//! to a queued one late; the dedup window's misses (a block applied again
//! after its token left the window) are counted; a zombie's held inserts
//! land after the member rejoined.

use std::sync::Arc;
use std::time::Duration;

use spate_core::checkpoint::ranges;
use spate_core::record::TopicPartition;
use spate_core::source::{AssignmentEvent, CommitOffset, Committed, Source, SourceError};
use spate_sim::broker::{SimSource, TOPIC};
use spate_sim::config::{FaultKind, SimConfig};
use spate_sim::world::{QueuedCommit, Shared, World};
use spate_verify::{run_and_check, run_and_check_config, window_covered};

/// A world of seed 7's run with three partitions and no faults, whose
/// clock stands at 0 (no runtime needed).
fn world() -> World {
    let cfg = SimConfig {
        partitions: 3,
        ..SimConfig::with_faults(7, Vec::new())
    };
    let mut w = World::new(cfg);
    w.ended = true;
    w
}

fn commit(p: i32, epoch: u64, offset: i64, metadata: Option<&str>) -> CommitOffset {
    CommitOffset {
        partition: TopicPartition::new(Arc::<str>::from(TOPIC), p),
        epoch,
        offset,
        metadata: metadata.map(str::to_owned),
    }
}

#[test]
fn commit_metadata_is_stored_with_the_offset() {
    let mut w = world();
    w.assign(0);
    let e = w.epochs[0];
    w.apply_commit(0, 12, e, "v1;3-9", "");
    assert_eq!(w.committed[0], Some(12));
    assert_eq!(w.committed_meta[0], "v1;3-9");
    assert_eq!(
        w.commits.last().map(|c| c.metadata.as_str()),
        Some("v1;3-9")
    );
    assert!(
        w.trace
            .last()
            .is_some_and(|l| l.what.ends_with(" meta=v1;3-9"))
    );
    // A commit without metadata clears it (Kafka stores what each commit
    // sends), and its trace line reads as before metadata existed.
    w.apply_commit(0, 14, e, "", "");
    assert_eq!(w.committed_meta[0], "");
    assert!(
        w.trace
            .last()
            .is_some_and(|l| l.what.ends_with("(durable 0)"))
    );
}

#[test]
fn a_slow_coordinator_fences_queued_commits_it_gets_to_late() {
    let mut w = world();
    w.assign(0);
    let old = w.epochs[0];
    w.assign(0); // a new incarnation or a rebalance: a new epoch
    let new = w.epochs[0];
    for (epoch, offset) in [(old, 5), (new, 7)] {
        w.commit_queue.push_back(QueuedCommit {
            due: Duration::ZERO,
            partition: 0,
            offset,
            epoch,
            metadata: format!("m{offset}"),
        });
    }
    w.apply_due_commits();
    assert_eq!(w.late_commits_fenced, 1, "{:?}", w.trace);
    assert_eq!(w.committed[0], Some(7));
    assert_eq!(w.committed_meta[0], "m7");
    // While the member is evicted nothing queued applies.
    w.evicted = true;
    w.commit_queue.push_back(QueuedCommit {
        due: Duration::ZERO,
        partition: 0,
        offset: 9,
        epoch: new,
        metadata: "m9".into(),
    });
    w.apply_due_commits();
    assert_eq!(w.late_commits_fenced, 2);
    assert_eq!(w.committed[0], Some(7));
}

#[test]
fn an_evicted_member_cannot_commit() {
    let mut w = world();
    w.assign(0);
    let e = w.epochs[0];
    w.evicted = true;
    let shared = Shared::new(w);
    let mut source = SimSource::new(shared.clone());
    let err = source.commit(&[commit(0, e, 3, None)]).unwrap_err();
    assert!(matches!(err, SourceError::CommitRejected { .. }), "{err:?}");
    shared.lock().evicted = false;
    source
        .commit(&[commit(0, e, 3, None)])
        .expect("a member commits again");
    assert_eq!(shared.lock().committed[0], Some(3));
}

#[test]
fn assignment_returns_the_committed_offset_and_metadata() {
    let mut w = world();
    w.assign(0);
    w.assign(1);
    let (e0, e1) = (w.epochs[0], w.epochs[1]);
    w.group_events.clear();
    let shared = Shared::new(w);
    let mut source = SimSource::new(shared.clone());
    let meta = ranges::encode(&[(4, 9), (10, 12)]);
    source
        .commit(&[commit(0, e0, 4, Some(&meta)), commit(1, e1, 2, None)])
        .expect("commit");
    // A new incarnation: the group hands out both partitions again.
    {
        let mut w = shared.lock();
        w.assign(0);
        w.assign(1);
        w.assign(2);
    }
    let mut got = Vec::new();
    while let Some(ev) = source.poll_event(Duration::ZERO).expect("event") {
        if let AssignmentEvent::Assigned {
            partition,
            committed,
            ..
        } = ev
        {
            got.push((partition.partition(), committed));
        }
    }
    let c = |offset, metadata: &str| {
        Some(Committed {
            offset,
            metadata: metadata.to_owned(),
        })
    };
    assert_eq!(got, vec![(0, c(4, &meta)), (1, c(2, "")), (2, None)]);
    assert_eq!(
        ranges::decode(&shared.lock().committed_meta[0]).expect("ours"),
        vec![(4, 9), (10, 12)]
    );
}

#[test]
fn replays_outside_the_window_are_counted_as_misses() {
    // A table with no dedup (window 0) and a retried ambiguous write: the
    // retry is a miss; the run is not covered and its duplicates show.
    let mut found = None;
    for seed in 0..2_000 {
        let cfg = SimConfig::from_seed(seed);
        if cfg.dedup_window != 0 || cfg.faults_of(FaultKind::AmbiguousWrites).next().is_none() {
            continue;
        }
        let (o, r) = run_and_check(seed);
        if o.world.ambiguous_writes > 0 && o.world.dedup_misses > 0 {
            found = Some(seed);
            assert!(!r.covered && !window_covered(&o.world));
            assert!(r.duplicates > 0, "seed {seed}: a miss lands a block twice");
            assert!(!o.world.dedup_miss_examples.is_empty());
            break;
        }
    }
    assert!(
        found.is_some(),
        "no seed with window 0 re-sent an ambiguous write"
    );
    // With no fault at all nothing is re-sent: covered, whatever the window.
    let (o, r) = run_and_check_config(SimConfig::with_faults(3, Vec::new()));
    assert!(r.covered && o.world.dedup_misses == 0, "{:?}", r);
}

#[test]
fn a_zombies_inserts_land_after_it_rejoined() {
    // The first seed whose zombie had an insert in flight (a zombie window
    // can fall where nothing is written).
    let (seed, zombie, o, r) = (0..2_000)
        .filter_map(|s| {
            let cfg = SimConfig::from_seed(s);
            let zombie = cfg.faults_of(FaultKind::ZombieWrite).next()?.clone();
            let (o, r) = run_and_check_config(cfg);
            o.world
                .hit
                .contains(&FaultKind::ZombieWrite)
                .then_some((s, zombie, o, r))
        })
        .next()
        .expect("a seed whose zombie held an insert");
    assert!(r.violations.is_empty(), "seed {seed}: {:?}", r.violations);
    let w = &o.world;
    assert!(
        w.hit.contains(&FaultKind::ZombieWrite),
        "seed {seed}: no insert held"
    );
    assert!(w.zombie_landed > 0 && w.zombie_queue.is_empty());
    let end = (zombie.start + zombie.duration).as_millis() as u64;
    let landed: Vec<u64> = w
        .trace
        .iter()
        .filter(|l| l.what.contains("zombie insert") && l.what.ends_with("lands late"))
        .map(|l| l.at_ms)
        .collect();
    assert!(!landed.is_empty());
    assert!(
        landed.iter().all(|&t| t >= end + 200),
        "seed {seed}: a zombie insert landed before the member rejoined (+200 ms): {landed:?}, eviction ends {end}"
    );
    // Its commits were refused while it was a zombie.
    assert!(
        w.trace
            .iter()
            .any(|l| l.what.starts_with("commit refused (evicted)")),
        "seed {seed}: the zombie never tried to commit"
    );
}

/// Polls `lane` until a poll returns nothing, collecting the offsets.
fn drain_offsets(lane: &mut spate_sim::broker::SimLane) -> Vec<i64> {
    use spate_core::source::{Lane, PollBatch};
    let mut got = Vec::new();
    loop {
        let batch = lane.poll(Duration::ZERO).expect("poll");
        if batch.is_empty() {
            return got;
        }
        got.extend((0..batch.len()).map(|i| batch.payload(i).offset));
    }
}

#[test]
fn a_range_lane_reads_exactly_the_range_outside_the_assignment() {
    use spate_core::source::{Lane, RANGE_LANE_EPOCH};
    let mut w = world();
    for o in 0..12 {
        if o == 5 {
            w.append_gap(1);
        } else {
            w.append_record(1);
        }
    }
    // Partition 1 is not assigned to this member: a range lane reads it
    // all the same (issue 38, ADR 0007: a split group's missing member).
    let shared = Shared::new(w);
    let mut source = SimSource::new(shared.clone());
    assert!(source.reads_ranges());
    let p1 = TopicPartition::new(Arc::<str>::from(TOPIC), 1);
    let mut lane = source.read_range(&p1, 3, 8).expect("range lane");
    assert_eq!(lane.epoch(), RANGE_LANE_EPOCH);
    assert_eq!(drain_offsets(&mut lane), vec![3, 4, 6, 7, 8]);
    // Past its last offset it returns nothing, also as the log grows.
    shared.lock().append_record(1);
    assert!(drain_offsets(&mut lane).is_empty());
    // A paused range lane reads nothing until resumed (D8 backpressure).
    let mut lane = source.read_range(&p1, 0, 2).expect("range lane");
    lane.pause().expect("pause");
    assert!(drain_offsets(&mut lane).is_empty());
    lane.resume().expect("resume");
    assert_eq!(drain_offsets(&mut lane), vec![0, 1, 2]);
    // Offsets retention removed are never returned; an empty range is
    // refused.
    shared.lock().log_start[1] = 7;
    let mut lane = source.read_range(&p1, 3, 9).expect("range lane");
    assert_eq!(drain_offsets(&mut lane), vec![7, 8, 9]);
    assert!(source.read_range(&p1, 4, 3).is_err());
}
