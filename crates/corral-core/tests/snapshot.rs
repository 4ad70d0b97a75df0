//! A partial engine (pool snapshot + one attachment's records + the few cooldowns a store
//! reads: those that ran out, and the oldest still running) decides exactly as the full engine
//! does, and leaves the same snapshot behind.
//!
//! This is what lets the CNI plugin, a process per call, allocate without reading every
//! allocation or every cooldown: the store keeps the snapshot beside the records.

use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, PoolConfig, PoolName, Request, RestoredAllocation,
    ReusePolicy, Target, Timestamp,
};
use proptest::prelude::*;
use std::net::IpAddr;

const RANGES: [&str; 3] = [
    "10.0.0.0/28,gateway=10.0.0.1",
    "10.0.1.0/24,range=10.0.1.10-10.0.1.13",
    "fd00::/64",
];

#[derive(Clone, Debug)]
enum Op {
    Add { key: usize, family: bool },
    Del { key: usize },
    Tick { secs: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..12usize, any::<bool>()).prop_map(|(key, family)| Op::Add { key, family }),
        2 => (0..12usize).prop_map(|key| Op::Del { key }),
        1 => (0..40u64).prop_map(|secs| Op::Tick { secs }),
    ]
}

fn key(i: usize) -> AttachmentKey {
    AttachmentKey::new("net", &format!("c{i}"), "eth0").unwrap()
}

fn config(cooldown: u64, lowest: bool) -> EngineConfig {
    EngineConfig {
        default_pool: PoolConfig {
            cooldown: Duration::from_secs(cooldown),
            reuse: if lowest {
                ReusePolicy::LowestFree
            } else {
                ReusePolicy::NextFit
            },
        },
        lease_id_seed: 1,
        ..EngineConfig::default()
    }
}

/// The cooldowns a store reads for a partial engine at `now` (see corral-store's `load.rs`):
/// per family, those that ran out (at most `limit`, oldest first), then the next one.
/// A full engine of the default pool over `RANGES`.
/// Runs `ops` on a full engine: a tick moves the clock, an ADD or DEL goes to `step` with the
/// full engine and the time, and the full engine's invariants hold after each operation.
fn walk(
    config: EngineConfig,
    ops: Vec<Op>,
    mut step: impl FnMut(&mut Engine, Op, Timestamp) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let mut full = full_engine(config);
    let mut now = Timestamp::ZERO;
    for op in ops {
        match op {
            Op::Tick { secs } => now = now.saturating_add(Duration::from_secs(secs)),
            op => step(&mut full, op, now)?,
        }
        full.check_invariants().map_err(TestCaseError::fail)?;
    }
    Ok(())
}

fn full_engine(config: EngineConfig) -> Engine {
    let pool = PoolName::default_pool();
    let mut full = Engine::new(config);
    for range in RANGES {
        full.add_range(&pool, range.parse().unwrap()).unwrap();
    }
    full
}

fn cooldowns_read(full: &Engine, now: Timestamp, limit: usize) -> Vec<(IpAddr, Timestamp)> {
    let pool = PoolName::default_pool();
    let cooldown = full.pool_config(&pool).unwrap().cooldown;
    let mut read = Vec::new();
    for family in Family::ALL {
        let mut ran_out = 0;
        for (addr, at) in full.cooling(&pool).unwrap() {
            if Family::of(addr) != family {
                continue;
            }
            if at.saturating_add(cooldown) <= now {
                if ran_out == limit {
                    break;
                }
                ran_out += 1;
                read.push((addr, at));
            } else {
                read.push((addr, at));
                break;
            }
        }
    }
    read
}

/// The engine a short-lived process would build at `now`: configuration, the pool snapshot,
/// the records of one attachment, and the cooldowns a store reads, after which time passes.
fn partial(
    full: &Engine,
    config: EngineConfig,
    attachment: &AttachmentKey,
    now: Timestamp,
    limit: usize,
) -> Engine {
    let pool = PoolName::default_pool();
    let mut engine = Engine::restoring(config);
    for range in RANGES {
        engine.add_range(&pool, range.parse().unwrap()).unwrap();
    }
    engine
        .restore_pool_snapshot(&pool, &full.pool_snapshot(&pool).unwrap())
        .unwrap();
    for info in full.lookup_key(attachment) {
        engine
            .restore_allocation_accounted(&RestoredAllocation {
                pool: info.pool,
                addr: info.entry.addr,
                owner: info.entry.owner,
                key: info.entry.key,
                generation: info.entry.generation,
                lease: info.entry.lease,
            })
            .unwrap();
    }
    for (addr, at) in cooldowns_read(full, now, limit) {
        engine.restore_cooling(&pool, addr, at).unwrap();
    }
    engine.restore_generation(full.next_generation());
    engine.finish_restore();
    assert!(engine.is_partial());
    engine.advance(now);
    engine
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_partial_engine_decides_as_the_full_one(
        ops in prop::collection::vec(op(), 1..60),
        cooldown in prop_oneof![Just(0u64), Just(30u64)],
        lowest in any::<bool>(),
    ) {
        let pool = PoolName::default_pool();
        let config = config(cooldown, lowest);
        walk(config, ops, |full, op, now| {
            match op {
                Op::Add { key: k, family } => {
                    let attachment = key(k);
                    let mut part = partial(full, config, &attachment, now, usize::MAX);
                    let request = Request { pool: &pool, owner: "pod", key: Some(&attachment), lease: None };
                    let target = Target::Next(if family { Family::V4 } else { Family::V6 });
                    let want = full.allocate(&request, target, now);
                    let got = part.allocate(&request, target, now);
                    prop_assert_eq!(&got, &want);
                    prop_assert_eq!(part.pool_snapshot(&pool).unwrap(), full.pool_snapshot(&pool).unwrap());
                    prop_assert_eq!(part.next_generation(), full.next_generation());
                }
                Op::Del { key: k } => {
                    let attachment = key(k);
                    let mut part = partial(full, config, &attachment, now, usize::MAX);
                    let want = full.release_key(&attachment, now);
                    let got = part.release_key(&attachment, now);
                    prop_assert_eq!(&got, &want);
                    full.advance(now);
                    prop_assert_eq!(part.pool_snapshot(&pool).unwrap(), full.pool_snapshot(&pool).unwrap());
                    // The partial engine knows the cooldowns it read and those it started,
                    // each as the full engine does.
                    let known = part.cooling(&pool).unwrap();
                    let all = full.cooling(&pool).unwrap();
                    prop_assert!(known.iter().all(|c| all.contains(c)), "{:?} not in {:?}", known, all);
                    for released in &got {
                        prop_assert_eq!(part.cooldown(released.addr), full.cooldown(released.addr));
                    }
                    for family in Family::ALL {
                        prop_assert_eq!(
                            part.oldest_cooling(&pool, family).unwrap(),
                            full.oldest_cooling(&pool, family).unwrap()
                        );
                    }
                }
                Op::Tick { .. } => {}
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// With fewer cooldowns read than ran out, the addresses left unread stay blocked: the
    /// partial engine may choose another free address than the full one, but never an
    /// allocated one, and a cooling one only when the full engine has nothing free either
    /// (then the oldest).
    #[test]
    fn a_partial_engine_reading_few_cooldowns_hands_out_only_what_the_full_one_may(
        ops in prop::collection::vec(op(), 1..60),
        lowest in any::<bool>(),
        limit in 1..3usize,
    ) {
        let pool = PoolName::default_pool();
        let config = config(30, lowest);
        walk(config, ops, |full, op, now| {
            match op {
                Op::Add { key: k, family } => {
                    let attachment = key(k);
                    let mut part = partial(full, config, &attachment, now, limit);
                    let request = Request { pool: &pool, owner: "pod", key: Some(&attachment), lease: None };
                    let family = if family { Family::V4 } else { Family::V6 };
                    full.advance(now);
                    let free = full.stats(&pool, family).unwrap().free;
                    let oldest = full.oldest_cooling(&pool, family).unwrap();
                    let Ok(got) = part.allocate(&request, Target::Next(family), now) else {
                        prop_assert!(free == 0 && oldest.is_none(), "refused with {} free", free);
                        return Ok(());
                    };
                    if got.existing {
                        return Ok(());
                    }
                    prop_assert!(full.lookup(got.addr).is_none(), "{} is allocated", got.addr);
                    if let Some((pool_name, _)) = full.cooldown(got.addr) {
                        prop_assert_eq!(pool_name, pool.clone());
                        prop_assert_eq!(free, 0, "{} is cooling while another is free", got.addr);
                        prop_assert_eq!(Some(got.addr), oldest.map(|(addr, _)| addr));
                    }
                    // The full engine takes the same address and stays the reference.
                    full.allocate(&request, Target::Specific(got.addr), now).unwrap();
                }
                Op::Del { key: k } => {
                    full.release_key(&key(k), now);
                }
                Op::Tick { .. } => {}
            }
            Ok(())
        })?;
    }
}

#[test]
fn a_snapshot_that_does_not_fit_is_refused_and_changes_nothing() {
    let pool = PoolName::default_pool();
    let mut source = Engine::new(EngineConfig::default());
    source
        .add_range(&pool, "10.0.0.0/24".parse().unwrap())
        .unwrap();
    let snapshot = source.pool_snapshot(&pool).unwrap();

    let mut other = Engine::restoring(EngineConfig::default());
    other
        .add_range(&pool, "10.0.0.0/25".parse().unwrap())
        .unwrap();
    let before = other.pool_snapshot(&pool).unwrap();
    let error = other.restore_pool_snapshot(&pool, &snapshot).unwrap_err();
    assert!(error.to_string().contains("does not fit"), "{error}");
    assert_eq!(other.pool_snapshot(&pool).unwrap(), before);

    let mut ready = Engine::new(EngineConfig::default());
    ready
        .add_range(&pool, "10.0.0.0/24".parse().unwrap())
        .unwrap();
    assert!(ready.restore_pool_snapshot(&pool, &snapshot).is_err());
}

/// Next-fit's position when the range it was in has been removed since: the running engine
/// goes on at the first range above the removed one, and an engine restored from its
/// snapshot (a short-lived process) does the same instead of starting over at the lowest range.
#[test]
fn a_next_fit_position_whose_range_was_removed_means_the_same_after_a_restore() {
    let pool = PoolName::default_pool();
    let (low, middle, high) = ("10.0.0.0/30", "10.0.1.0/30", "10.0.2.0/30");
    let request = Request {
        pool: &pool,
        owner: "pod",
        key: None,
        lease: None,
    };
    let now = Timestamp::ZERO;
    let mut running = Engine::new(EngineConfig::default());
    for range in [middle, high] {
        running.add_range(&pool, range.parse().unwrap()).unwrap();
    }
    // Next-fit continues in `middle`; then `middle` goes (its one address released first) and
    // `low` comes, below it.
    let got = running
        .allocate(&request, Target::Next(Family::V4), now)
        .unwrap();
    assert_eq!(got.addr, "10.0.1.1".parse::<IpAddr>().unwrap());
    running.release(got.addr, None, now).unwrap();
    running
        .remove_range(&pool, &middle.parse().unwrap())
        .unwrap();
    running.add_range(&pool, low.parse().unwrap()).unwrap();

    let mut restored = Engine::restoring(EngineConfig::default());
    for range in [low, high] {
        restored.add_range(&pool, range.parse().unwrap()).unwrap();
    }
    restored
        .restore_pool_snapshot(&pool, &running.pool_snapshot(&pool).unwrap())
        .unwrap();
    restored.finish_restore();
    assert_eq!(
        restored.pool_snapshot(&pool).unwrap(),
        running.pool_snapshot(&pool).unwrap()
    );

    let above: IpAddr = "10.0.2.1".parse().unwrap();
    for engine in [&mut running, &mut restored] {
        let got = engine
            .allocate(&request, Target::Next(Family::V4), now)
            .unwrap();
        assert_eq!(got.addr, above);
    }
}
