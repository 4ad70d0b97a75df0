//! The leak collector on the SQLite store: suspects are durable, and an allocation goes only
//! when a run past the grace period sees its attachment missing again, holding exactly what
//! was recorded, whole, within the run's cap.

use crate::common;

use common::{attached, one_pool};

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, GcHeld, GcPolicy, GcRefusal, GcSuspect, PoolName,
    Request, Target, Timestamp, release_suspect,
};
use corral_store::{
    GcOutcome, Need, ScopeConfig, SqliteStore, Store, Txn, build_engine, collect_garbage,
    save_engine,
};

const SCOPE: &str = "net";

fn desired() -> ScopeConfig {
    one_pool(
        &PoolName::default_pool(),
        &["10.1.0.0/24", "fd01::/120"],
        Duration::ZERO,
    )
}

fn key(container: &str) -> AttachmentKey {
    AttachmentKey::new("net", container, "eth0").unwrap()
}

fn at(seconds: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_700_000_000_000 + seconds * 1000)
}

fn policy(grace_s: u64, max_released: usize) -> GcPolicy {
    GcPolicy {
        grace: Duration::from_secs(grace_s),
        max_released,
    }
}

fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(dir.path()).unwrap()
}

/// A new store in a new temporary directory; bound as `let (dir, store) = ...`, the store
/// closes before the directory goes.
fn open_new() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    (dir, store)
}

fn full(txn: &mut impl Txn) -> Engine {
    build_engine(txn, SCOPE, &desired(), EngineConfig::default(), Need::Full)
        .unwrap()
        .0
}

/// Allocates one address of each family in `families` for `container`.
fn add(store: &mut SqliteStore, container: &str, families: &[Family]) -> Vec<IpAddr> {
    let attachment = key(container);
    let pool = PoolName::default_pool();
    let mut txn = store.begin().unwrap();
    let mut engine = full(&mut txn);
    let mut addrs = Vec::new();
    for family in families {
        let request = Request {
            pool: &pool,
            owner: container,
            key: Some(&attachment),
            lease: None,
        };
        let allocation = engine
            .allocate(&request, Target::Next(*family), at(0))
            .unwrap();
        txn.put_allocation(
            SCOPE,
            &attached(
                pool.clone(),
                (allocation.addr, allocation.generation),
                container.to_owned(),
                attachment.clone(),
            ),
        )
        .unwrap();
        addrs.push(allocation.addr);
    }
    save_engine(&mut txn, SCOPE, &desired(), &engine).unwrap();
    txn.commit().unwrap();
    addrs
}

/// Releases one address and allocates again for the same attachment in its family: the
/// attachment holds a new allocation (a new generation) in that family.
fn replace(store: &mut SqliteStore, container: &str, addr: IpAddr) {
    let mut txn = store.begin().unwrap();
    let mut engine = full(&mut txn);
    engine.release(addr, None, at(0)).unwrap();
    txn.delete_allocation(SCOPE, addr).unwrap();
    save_engine(&mut txn, SCOPE, &desired(), &engine).unwrap();
    txn.commit().unwrap();
    add(store, container, &[Family::of(addr)]);
}

fn gc(store: &mut SqliteStore, live: &[&str], now: Timestamp, policy: &GcPolicy) -> GcOutcome {
    run(store, live, now, policy, false)
}

fn run(
    store: &mut SqliteStore,
    live: &[&str],
    now: Timestamp,
    policy: &GcPolicy,
    dry_run: bool,
) -> GcOutcome {
    let live: HashSet<AttachmentKey> = live.iter().map(|c| key(c)).collect();
    let mut txn = store.begin().unwrap();
    let mut engine = full(&mut txn);
    let outcome = collect_garbage(
        &mut txn,
        SCOPE,
        &mut engine,
        |k| k.network() == "net",
        &live,
        now,
        policy,
        dry_run,
    )
    .unwrap();
    save_engine(&mut txn, SCOPE, &desired(), &engine).unwrap();
    txn.commit().unwrap();
    outcome
}

fn held_by(store: &mut SqliteStore, container: &str) -> Vec<IpAddr> {
    let mut txn = store.begin().unwrap();
    let rows = txn.allocations_by_key(SCOPE, &key(container)).unwrap();
    txn.finish().unwrap();
    rows.into_iter().map(|r| r.addr).collect()
}

fn suspects(store: &mut SqliteStore) -> Vec<GcSuspect> {
    let mut txn = store.begin().unwrap();
    let suspects = txn.gc_suspects(SCOPE).unwrap();
    txn.finish().unwrap();
    suspects
}

fn keys(suspects: &[GcSuspect]) -> Vec<String> {
    suspects.iter().map(|s| s.key.to_string()).collect()
}

#[test]
fn a_suspect_is_recorded_durably_and_survives_a_reopen() {
    let (dir, mut store) = open_new();
    let addrs = add(&mut store, "gone", &[Family::V4, Family::V6]);
    add(&mut store, "kept", &[Family::V4]);
    let outcome = gc(&mut store, &["kept"], at(0), &policy(60, 64));
    assert_eq!(keys(&outcome.recorded), ["net/gone/eth0"]);
    assert_eq!(outcome.live, 1);
    assert!(outcome.released.is_empty());
    drop(store);

    let mut store = open(&dir);
    let stored = suspects(&mut store);
    assert_eq!(keys(&stored), ["net/gone/eth0"]);
    assert_eq!(stored[0].first_seen, at(0));
    let mut recorded: Vec<IpAddr> = stored[0].held.iter().map(|h| h.addr).collect();
    recorded.sort();
    let mut expected = addrs.clone();
    expected.sort();
    assert_eq!(recorded, expected);
    // The reopened store goes on from that observation.
    let outcome = gc(&mut store, &["kept"], at(60), &policy(60, 64));
    assert_eq!(keys(&outcome.released), ["net/gone/eth0"]);
    assert_eq!(outcome.freed.len(), 2);
    assert!(held_by(&mut store, "gone").is_empty());
    assert_eq!(held_by(&mut store, "kept").len(), 1);
    assert!(suspects(&mut store).is_empty());
}

#[test]
fn before_the_grace_period_ends_nothing_is_released() {
    let (_dir, mut store) = open_new();
    add(&mut store, "gone", &[Family::V4]);
    gc(&mut store, &[], at(0), &policy(60, 64));
    let outcome = gc(&mut store, &[], at(59), &policy(60, 64));
    assert!(outcome.released.is_empty());
    assert_eq!(outcome.waiting.len(), 1);
    assert_eq!(outcome.waiting[0].1, at(60));
    assert_eq!(held_by(&mut store, "gone").len(), 1);
    // The waiting run does not restart the grace period.
    let outcome = gc(&mut store, &[], at(60), &policy(60, 64));
    assert_eq!(keys(&outcome.released), ["net/gone/eth0"]);
}

#[test]
fn one_run_alone_never_releases_with_a_grace_period() {
    let (_dir, mut store) = open_new();
    add(&mut store, "gone", &[Family::V4]);
    let outcome = gc(&mut store, &[], at(0), &policy(1, 64));
    assert!(outcome.released.is_empty());
    assert_eq!(held_by(&mut store, "gone").len(), 1);
    let outcome = gc(&mut store, &[], at(1), &policy(1, 64));
    assert_eq!(keys(&outcome.released), ["net/gone/eth0"]);
}

/// The CNI spec's model (one GC call, stale reservations freed): with no grace period the
/// first run releases, durably, and records nothing.
#[test]
fn with_no_grace_period_one_run_releases() {
    let (dir, mut store) = open_new();
    add(&mut store, "gone", &[Family::V4, Family::V6]);
    add(&mut store, "kept", &[Family::V4]);
    let outcome = gc(&mut store, &["kept"], at(0), &policy(0, 64));
    assert_eq!(keys(&outcome.released), ["net/gone/eth0"]);
    assert_eq!(outcome.freed.len(), 2, "both families");
    assert!(outcome.recorded.is_empty());
    assert!(held_by(&mut store, "gone").is_empty());
    assert_eq!(held_by(&mut store, "kept").len(), 1);
    assert!(suspects(&mut store).is_empty());
    drop(store);
    let mut store = open(&dir);
    assert!(held_by(&mut store, "gone").is_empty(), "durable");
}

#[test]
fn an_attachment_live_again_is_cleared_and_starts_over() {
    let (_dir, mut store) = open_new();
    add(&mut store, "back", &[Family::V4]);
    gc(&mut store, &[], at(0), &policy(60, 64));
    let outcome = gc(&mut store, &["back"], at(60), &policy(60, 64));
    assert!(outcome.released.is_empty());
    assert_eq!(outcome.cleared, vec![key("back")]);
    assert!(suspects(&mut store).is_empty());
    // Missing again: a new first observation, not a release.
    let outcome = gc(&mut store, &[], at(120), &policy(60, 64));
    assert!(outcome.released.is_empty());
    assert_eq!(keys(&outcome.recorded), ["net/back/eth0"]);
    assert_eq!(held_by(&mut store, "back").len(), 1);
}

#[test]
fn an_allocation_replaced_between_observations_is_not_released() {
    let (_dir, mut store) = open_new();
    let addrs = add(&mut store, "reused", &[Family::V4]);
    gc(&mut store, &[], at(0), &policy(60, 64));
    replace(&mut store, "reused", addrs[0]);
    let outcome = gc(&mut store, &[], at(60), &policy(60, 64));
    assert!(outcome.released.is_empty());
    assert_eq!(outcome.cleared, vec![key("reused")]);
    // The new allocation is a new suspect, first seen now.
    assert_eq!(keys(&outcome.recorded), ["net/reused/eth0"]);
    assert_eq!(suspects(&mut store)[0].first_seen, at(60));
    assert_eq!(held_by(&mut store, "reused").len(), 1);
}

#[test]
fn a_dual_stack_attachment_goes_whole_or_not_at_all() {
    let (_dir, mut store) = open_new();
    let addrs = add(&mut store, "dual", &[Family::V4, Family::V6]);
    gc(&mut store, &[], at(0), &policy(60, 64));
    // Only the IPv6 allocation changes: the IPv4 one, unchanged, stays too.
    replace(&mut store, "dual", addrs[1]);
    let outcome = gc(&mut store, &[], at(60), &policy(60, 64));
    assert!(outcome.released.is_empty());
    assert!(outcome.freed.is_empty());
    let held = held_by(&mut store, "dual");
    assert_eq!(held.len(), 2);
    assert!(held.contains(&addrs[0]));
}

#[test]
fn a_run_releases_at_most_its_cap_and_the_rest_wait_for_the_next() {
    let (_dir, mut store) = open_new();
    for i in 0..5 {
        add(&mut store, &format!("c{i}"), &[Family::V4]);
    }
    gc(&mut store, &[], at(0), &policy(60, 2));
    let outcome = gc(&mut store, &[], at(60), &policy(60, 2));
    assert_eq!(outcome.released.len(), 2);
    assert_eq!(outcome.capped.len(), 3);
    let outcome = gc(&mut store, &[], at(61), &policy(60, 2));
    assert_eq!(outcome.released.len(), 2);
    assert_eq!(outcome.capped.len(), 1);
    let outcome = gc(&mut store, &[], at(62), &policy(60, 2));
    assert_eq!(outcome.released.len(), 1);
    assert!(outcome.capped.is_empty());
    for i in 0..5 {
        assert!(held_by(&mut store, &format!("c{i}")).is_empty());
    }
}

#[test]
fn a_dry_run_changes_nothing() {
    let (_dir, mut store) = open_new();
    add(&mut store, "gone", &[Family::V4]);
    let outcome = run(&mut store, &[], at(0), &policy(60, 64), true);
    assert_eq!(outcome.recorded.len(), 1);
    assert!(suspects(&mut store).is_empty());
    gc(&mut store, &[], at(0), &policy(60, 64));
    let outcome = run(&mut store, &[], at(60), &policy(60, 64), true);
    assert_eq!(keys(&outcome.released), ["net/gone/eth0"]);
    assert!(outcome.freed.is_empty());
    assert_eq!(held_by(&mut store, "gone").len(), 1);
    assert_eq!(suspects(&mut store).len(), 1);
    // With no grace period a dry run shows a first observation's release, and changes nothing.
    add(&mut store, "new", &[Family::V4]);
    let outcome = run(&mut store, &[], at(61), &policy(0, 64), true);
    assert_eq!(keys(&outcome.released), ["net/gone/eth0", "net/new/eth0"]);
    assert_eq!(held_by(&mut store, "new").len(), 1);
    assert_eq!(suspects(&mut store).len(), 1);
}

/// The check made when releasing, on the engine: a suspect that does not match what the
/// attachment holds now, or whose attachment is live, releases nothing.
#[test]
fn releasing_a_suspect_checks_the_engine_again() {
    let (_dir, mut store) = open_new();
    let addrs = add(&mut store, "c", &[Family::V4, Family::V6]);
    let mut txn = store.begin().unwrap();
    let mut engine = full(&mut txn);
    drop(txn);
    let generation = |addr| engine.lookup(addr).unwrap().entry.generation;
    let mut held: Vec<GcHeld> = addrs
        .iter()
        .map(|&addr| GcHeld {
            addr,
            generation: generation(addr),
        })
        .collect();
    held.sort_unstable();
    let stale = GcSuspect {
        key: key("c"),
        first_seen: at(0),
        held: vec![
            GcHeld {
                addr: held[0].addr,
                generation: held[0].generation + 100,
            },
            held[1],
        ],
    };
    assert!(matches!(
        release_suspect(&mut engine, &stale, &HashSet::new(), at(1)),
        Err(GcRefusal::Changed { .. })
    ));
    let right = GcSuspect {
        held,
        ..stale.clone()
    };
    let live = HashSet::from([key("c")]);
    assert!(matches!(
        release_suspect(&mut engine, &right, &live, at(1)),
        Err(GcRefusal::Live { .. })
    ));
    assert_eq!(engine.n_allocations(), 2);
    assert_eq!(
        release_suspect(&mut engine, &right, &HashSet::new(), at(1))
            .unwrap()
            .len(),
        2
    );
    assert_eq!(engine.n_allocations(), 0);
}
