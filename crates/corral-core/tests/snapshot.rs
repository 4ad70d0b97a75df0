//! A partial engine (pool snapshot + one attachment's records + cooldowns) decides exactly as
//! the full engine does, and leaves the same snapshot behind.
//!
//! This is what lets the CNI plugin, a process per call, allocate without reading every
//! allocation: the store keeps the snapshot beside the records.

use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, PoolConfig, PoolName, Request, RestoredAllocation,
    ReusePolicy, Target, Timestamp,
};
use proptest::prelude::*;

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

/// The engine a short-lived process would build: configuration, the pool snapshot, the
/// records of one attachment, and the cooldowns.
fn partial(full: &Engine, config: EngineConfig, attachment: &AttachmentKey) -> Engine {
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
    for (addr, at) in full.cooling(&pool).unwrap() {
        engine.restore_cooling(&pool, addr, at).unwrap();
    }
    engine.restore_generation(full.next_generation());
    engine.finish_restore();
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
        let mut full = Engine::new(config);
        for range in RANGES {
            full.add_range(&pool, range.parse().unwrap()).unwrap();
        }
        let mut now = Timestamp::ZERO;
        for op in ops {
            match op {
                Op::Tick { secs } => now = now.saturating_add(Duration::from_secs(secs)),
                Op::Add { key: k, family } => {
                    let attachment = key(k);
                    let mut part = partial(&full, config, &attachment);
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
                    let mut part = partial(&full, config, &attachment);
                    let want = full.release_key(&attachment, now);
                    let got = part.release_key(&attachment, now);
                    prop_assert_eq!(&got, &want);
                    part.advance(now);
                    full.advance(now);
                    prop_assert_eq!(part.pool_snapshot(&pool).unwrap(), full.pool_snapshot(&pool).unwrap());
                    prop_assert_eq!(part.cooling(&pool).unwrap(), full.cooling(&pool).unwrap());
                }
            }
            full.check_invariants().map_err(TestCaseError::fail)?;
        }
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
