//! `Engine::allocate_all`: one address from each of several pools, or none. This is what a
//! long-lived engine (the agent) needs for a CNI ADD with several range sets, where a failure
//! in the last set must leave no trace of the earlier ones.

use corral_core::{
    AllocError, AttachmentKey, Engine, EngineConfig, Family, PoolConfig, PoolName, Request, Target,
    Timestamp,
};

fn engine() -> (Engine, PoolName, PoolName) {
    let mut engine = Engine::new(EngineConfig::default());
    let a = PoolName::new("a").unwrap();
    let b = PoolName::new("b").unwrap();
    engine.add_pool(&a, PoolConfig::default()).unwrap();
    engine.add_pool(&b, PoolConfig::default()).unwrap();
    engine
        .add_range(&a, "10.0.0.0/29".parse().unwrap())
        .unwrap();
    engine
        .add_range(&b, "10.1.0.0/30".parse().unwrap())
        .unwrap();
    engine.add_range(&b, "fd00::/126".parse().unwrap()).unwrap();
    (engine, a, b)
}

/// Why `engine` refuses all of `wanted` at once (it must), changing nothing.
fn refusal(engine: &mut Engine, wanted: &[(Request<'_>, Target)]) -> AllocError {
    let before = engine.dump();
    let error = engine.allocate_all(wanted, Timestamp::ZERO).unwrap_err();
    assert_eq!(engine.dump(), before, "nothing may change");
    error
}

fn request<'a>(pool: &'a PoolName, key: &'a AttachmentKey) -> Request<'a> {
    Request {
        pool,
        owner: "pod",
        key: Some(key),
        lease: None,
    }
}

#[test]
fn takes_one_address_from_each_pool_and_is_idempotent_per_key() {
    let (mut engine, a, b) = engine();
    let key = AttachmentKey::new("net", "c1", "eth0").unwrap();
    let wanted = [
        (request(&a, &key), Target::Next(Family::V4)),
        (request(&b, &key), Target::Next(Family::V6)),
    ];
    let first = engine.allocate_all(&wanted, Timestamp::ZERO).unwrap();
    let addrs: Vec<String> = first.iter().map(|a| a.addr.to_string()).collect();
    assert_eq!(addrs, ["10.0.0.1", "fd00::1"]);
    assert!(first.iter().all(|a| !a.existing));
    let again = engine.allocate_all(&wanted, Timestamp::ZERO).unwrap();
    assert_eq!(
        again.iter().map(|a| a.addr).collect::<Vec<_>>(),
        first.iter().map(|a| a.addr).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|a| a.existing));
    engine.check_invariants().unwrap();
}

#[test]
fn a_failure_in_any_pool_leaves_every_pool_as_it_was() {
    let (mut engine, a, b) = engine();
    // Pool b's IPv4 range (10.1.0.0/30) has two usable addresses: take both.
    for i in 0..2 {
        let key = AttachmentKey::new("net", &format!("fill{i}"), "eth0").unwrap();
        engine
            .allocate(
                &request(&b, &key),
                Target::Next(Family::V4),
                Timestamp::ZERO,
            )
            .unwrap();
    }
    let key = AttachmentKey::new("net", "c1", "eth0").unwrap();
    let err = refusal(
        &mut engine,
        &[
            (request(&a, &key), Target::Next(Family::V4)),
            (request(&b, &key), Target::Next(Family::V4)),
        ],
    );
    assert!(matches!(err, AllocError::PoolExhausted { .. }), "{err}");
    // A specific address that is taken fails the same way, after a good first request.
    let err = refusal(
        &mut engine,
        &[
            (request(&a, &key), Target::Next(Family::V4)),
            (
                request(&b, &key),
                Target::Specific("10.1.0.1".parse().unwrap()),
            ),
        ],
    );
    assert!(matches!(err, AllocError::AddressInUse { .. }), "{err}");
    // And the first pool still hands out the address it would have before.
    let next = engine
        .allocate(
            &request(&a, &key),
            Target::Next(Family::V4),
            Timestamp::ZERO,
        )
        .unwrap();
    assert_eq!(next.addr.to_string(), "10.0.0.1");
    engine.check_invariants().unwrap();
}

#[test]
fn two_requests_for_one_pool_and_family_are_refused() {
    let (mut engine, a, _) = engine();
    let k1 = AttachmentKey::new("net", "c1", "eth0").unwrap();
    let k2 = AttachmentKey::new("net", "c2", "eth0").unwrap();
    let err = refusal(
        &mut engine,
        &[
            (request(&a, &k1), Target::Next(Family::V4)),
            (
                request(&a, &k2),
                Target::Specific("10.0.0.1".parse().unwrap()),
            ),
        ],
    );
    assert!(matches!(err, AllocError::DuplicateTarget { .. }), "{err}");
}
