//! Cooldowns in the SQLite store: rows of their own, of which a CNI call reads only those it
//! acts on, kept in step with the snapshots; and a schema-1 database (every cooldown in the
//! state row) keeps its cooldowns when it is migrated.

use crate::common;

use common::{attached, one_pool};

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, PoolName, Request, ReusePolicy, Target, Timestamp,
};
use corral_store::{
    DB_FILE, EXPIRED_PER_BUILD, Need, SCHEMA_VERSION, ScopeConfig, SqliteStore, Store, StoreError,
    StoredCooldown, Txn, build_engine, save_engine,
};

const SCOPE: &str = "net";
const T0: u64 = 1_700_000_000_000;

fn at(millis_after_t0: u64) -> Timestamp {
    Timestamp::from_unix_millis(T0 + millis_after_t0)
}

fn pool() -> PoolName {
    PoolName::new("net").unwrap()
}

fn config(ranges: &[&str], cooldown: Duration) -> ScopeConfig {
    one_pool(&pool(), ranges, cooldown)
}

fn key(name: &str) -> AttachmentKey {
    AttachmentKey::new("net", name, "eth0").unwrap()
}

/// The engine a CNI call builds at `now` for one attachment.
fn partial_for(
    txn: &mut impl Txn,
    desired: &ScopeConfig,
    attachment: &AttachmentKey,
    now: Timestamp,
) -> Result<Engine, StoreError> {
    let keys = [attachment.clone()];
    let need = Need::Partial {
        keys: &keys,
        addrs: &[],
        now,
    };
    let (engine, full) = build_engine(txn, SCOPE, desired, EngineConfig::default(), need)?;
    assert!(!full, "the stored state fits: a partial build");
    Ok(engine)
}

/// One CNI-style ADD of `family` at `now`, as corral-ipam makes it.
fn add(
    store: &mut SqliteStore,
    desired: &ScopeConfig,
    name: &str,
    family: Family,
    now: Timestamp,
) -> Result<IpAddr, StoreError> {
    let attachment = key(name);
    let mut txn = store.begin()?;
    let (mut engine, _) = if txn.scope_state(SCOPE)?.0.is_some() {
        (partial_for(&mut txn, desired, &attachment, now)?, false)
    } else {
        build_engine(
            &mut txn,
            SCOPE,
            desired,
            EngineConfig::default(),
            Need::Full,
        )?
    };
    let request = Request {
        pool: &pool(),
        owner: name,
        key: Some(&attachment),
        lease: None,
    };
    let allocation = engine.allocate(&request, Target::Next(family), now)?;
    assert!(!allocation.existing);
    txn.put_allocation(
        SCOPE,
        &attached(
            pool(),
            (allocation.addr, allocation.generation),
            name.to_owned(),
            attachment,
        ),
    )?;
    save_engine(&mut txn, SCOPE, desired, &engine)?;
    txn.commit()?;
    Ok(allocation.addr)
}

/// One CNI-style DEL at `now`.
fn del(
    store: &mut SqliteStore,
    desired: &ScopeConfig,
    name: &str,
    now: Timestamp,
) -> Result<Vec<IpAddr>, StoreError> {
    let attachment = key(name);
    let mut txn = store.begin()?;
    let mut engine = partial_for(&mut txn, desired, &attachment, now)?;
    let released = engine.release_key(&attachment, now);
    for r in &released {
        txn.delete_allocation(SCOPE, r.addr)?;
    }
    save_engine(&mut txn, SCOPE, desired, &engine)?;
    txn.commit()?;
    Ok(released.iter().map(|r| r.addr).collect())
}

fn stored_cooldowns(store: &mut SqliteStore) -> Vec<StoredCooldown> {
    let mut txn = store.begin().unwrap();
    let cooldowns = txn.cooldowns(SCOPE).unwrap();
    txn.finish().unwrap();
    cooldowns
}

/// The stored snapshots and cooldowns say what the rows say: a full engine built from every
/// allocation and cooldown row has the stored snapshots, and its invariants hold.
fn assert_in_step(store: &mut SqliteStore, desired: &ScopeConfig) -> Engine {
    let mut txn = store.begin().unwrap();
    let (state, corrupt) = txn.scope_state(SCOPE).unwrap();
    assert_eq!(corrupt, None);
    let state = state.expect("stored state");
    let (full, was_full) = build_engine(
        &mut txn,
        SCOPE,
        desired,
        EngineConfig::default(),
        Need::Full,
    )
    .unwrap();
    assert!(was_full);
    full.check_invariants().unwrap();
    for (name, snapshot) in &state.snapshots {
        assert_eq!(
            &full.pool_snapshot(name).unwrap(),
            snapshot,
            "stored snapshot of {name} differs from the rows"
        );
    }
    let cooling: Vec<(IpAddr, Timestamp)> = txn
        .cooldowns(SCOPE)
        .unwrap()
        .iter()
        .map(|c| (c.addr, c.released_at))
        .collect();
    let mut known = full.cooling(&pool()).unwrap();
    known.sort_by_key(|&(addr, at)| (at, Family::of(addr), addr));
    assert_eq!(known, cooling, "every cooldown row is a cooldown, and back");
    txn.finish().unwrap();
    full
}

/// Regression (issue 10, item 9): every CNI call decoded, restored and re-encoded every
/// cooling address of the network, so with 5% of a /16 cooling an ADD cost three times
/// as much. A partial build now reads the oldest cooldown (and those that ran out, a
/// batch at a time), whatever the length of the queue.
#[test]
fn a_cni_call_does_not_read_every_cooling_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let desired = config(&["10.0.0.0/24"], Duration::from_secs(30));
    for i in 0..200 {
        add(&mut store, &desired, &format!("c{i}"), Family::V4, at(0)).unwrap();
    }
    let mut released = Vec::new();
    for i in 0..100 {
        released.extend(del(&mut store, &desired, &format!("c{i}"), at(1 + i)).unwrap());
    }
    assert_eq!(stored_cooldowns(&mut store).len(), 100);
    assert_in_step(&mut store, &desired);

    // While they cool, a call knows only the oldest.
    let mut txn = store.begin().unwrap();
    let engine = partial_for(&mut txn, &desired, &key("new"), at(10_000)).unwrap();
    assert!(engine.is_partial());
    assert_eq!(engine.stats(&pool(), Family::V4).unwrap().cooling, 1);
    assert_eq!(
        engine.oldest_cooling(&pool(), Family::V4).unwrap(),
        Some((released[0], at(1)))
    );
    drop(txn);

    // Once they ran out, each call ends a batch of them and leaves the rest blocked; next-fit
    // meanwhile hands out the addresses never used.
    let mut remaining = 100;
    let mut i = 0;
    while remaining > 0 {
        let addr = add(
            &mut store,
            &desired,
            &format!("late{i}"),
            Family::V4,
            at(60_000),
        )
        .unwrap();
        assert!(
            !released.contains(&addr),
            "{addr} came back before the unused ones"
        );
        remaining -= remaining.min(EXPIRED_PER_BUILD);
        assert_eq!(stored_cooldowns(&mut store).len(), remaining);
        assert_in_step(&mut store, &desired);
        i += 1;
    }
    assert_eq!(i, 100usize.div_ceil(EXPIRED_PER_BUILD));
}

/// When nothing else is free, ADD takes the oldest cooling address, one row each, and the
/// database never holds a cooldown for an allocated address.
#[test]
fn an_exhausted_pool_hands_out_its_cooling_addresses_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let desired = config(&["10.0.0.0/28", "fd00::/125"], Duration::from_secs(30));
    for i in 0..14 {
        add(&mut store, &desired, &format!("c{i}"), Family::V4, at(0)).unwrap();
    }
    for i in 0..7 {
        add(&mut store, &desired, &format!("c{i}"), Family::V6, at(0)).unwrap();
    }
    let mut released = Vec::new();
    for (n, i) in [5, 2, 9, 0].into_iter().enumerate() {
        released.push(del(&mut store, &desired, &format!("c{i}"), at(100 * n as u64)).unwrap());
    }
    assert_eq!(stored_cooldowns(&mut store).len(), 4 + 3);
    for (n, addrs) in released.iter().enumerate() {
        let v4 = addrs.iter().find(|a| a.is_ipv4()).unwrap();
        let got = add(
            &mut store,
            &desired,
            &format!("again{n}"),
            Family::V4,
            at(1_000),
        )
        .unwrap();
        assert_eq!(got, *v4, "the oldest cooling address first");
        assert_in_step(&mut store, &desired);
    }
    // The IPv6 cooldowns stay, and the IPv4 pool is exhausted.
    assert_eq!(stored_cooldowns(&mut store).len(), 3);
    let error = add(&mut store, &desired, "one-more", Family::V4, at(1_000)).unwrap_err();
    assert!(
        error.to_string().contains("no free ipv4 address"),
        "{error}"
    );
}

/// A random run of CNI calls through the store, with time passing: the partial builds decide
/// exactly as one full engine does (the batch is larger than anything that runs out here),
/// and after each call the stored snapshots and cooldowns are in step with the rows.
#[test]
fn partial_builds_with_cooldown_rows_decide_as_a_full_engine() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let desired = config(&["10.0.0.0/29", "fd00::/126"], Duration::from_secs(5));
    let mut reference = Engine::new(EngineConfig::default());
    let pool = pool();
    reference
        .add_pool(
            &pool,
            corral_core::PoolConfig {
                cooldown: Duration::from_secs(5),
                reuse: ReusePolicy::NextFit,
            },
        )
        .unwrap();
    for range in ["10.0.0.0/29", "fd00::/126"] {
        reference.add_range(&pool, range.parse().unwrap()).unwrap();
    }
    // The first call creates the scope (a full build).
    let first = add(&mut store, &desired, "c0", Family::V4, at(0)).unwrap();
    let want = reference
        .allocate(
            &Request {
                pool: &pool,
                owner: "c0",
                key: Some(&key("c0")),
                lease: None,
            },
            Target::Next(Family::V4),
            at(0),
        )
        .unwrap();
    assert_eq!(first, want.addr);
    let mut held: Vec<String> = vec!["c0".into()];
    let mut now = 0u64;
    let mut seed = 0x1234_5678_u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    for step in 0..400 {
        now += next() % 3_000;
        let name = format!("k{step}");
        match next() % 3 {
            0 | 1 => {
                let family = if next() % 3 == 0 {
                    Family::V6
                } else {
                    Family::V4
                };
                let request = Request {
                    pool: &pool,
                    owner: &name,
                    key: Some(&key(&name)),
                    lease: None,
                };
                let want = reference.allocate(&request, Target::Next(family), at(now));
                let got = add(&mut store, &desired, &name, family, at(now));
                match (want, got) {
                    (Ok(want), Ok(got)) => {
                        assert_eq!(got, want.addr, "step {step}");
                        held.push(name);
                    }
                    (Err(_), Err(_)) => {}
                    (want, got) => panic!("step {step}: {want:?} against {got:?}"),
                }
            }
            _ if !held.is_empty() => {
                let name = held.remove(next() as usize % held.len());
                let want: Vec<IpAddr> = reference
                    .release_key(&key(&name), at(now))
                    .iter()
                    .map(|r| r.addr)
                    .collect();
                assert_eq!(del(&mut store, &desired, &name, at(now)).unwrap(), want);
            }
            _ => {}
        }
        let full = assert_in_step(&mut store, &desired);
        assert_eq!(full.n_allocations(), reference.n_allocations());
    }
}

/// Copies the schema-1 fixture into a fresh directory (see `fixtures/README.md`).
fn schema_1_store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema-1-cooldowns.db"),
        dir.path().join(DB_FILE),
    )
    .unwrap();
    dir
}

fn addr(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A database written by the schema-1 store (cooldowns in the state row) is migrated: every
/// cooldown becomes a row, keeps its release time, and is still honoured.
#[test]
fn a_schema_1_database_keeps_its_cooldowns() {
    let dir = schema_1_store();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    // c3, c1 and c4 were released 1, 2 and 3 s after T0, from both families.
    let cooldown = |text: &str, after: u64| StoredCooldown {
        pool: pool(),
        addr: addr(text),
        released_at: at(after),
    };
    let expected = vec![
        cooldown("10.0.0.4", 1_000),
        cooldown("fd00::4", 1_000),
        cooldown("10.0.0.2", 2_000),
        cooldown("fd00::2", 2_000),
        cooldown("10.0.0.5", 3_000),
        cooldown("fd00::5", 3_000),
    ];
    assert_eq!(stored_cooldowns(&mut store), expected);
    let desired = config(&["10.0.0.0/29", "fd00::/125"], Duration::from_secs(30));
    let full = assert_in_step(&mut store, &desired);
    assert_eq!(full.n_allocations(), 6);

    // Still cooling 10 s later: every other IPv4 address is held, so ADD hands out the
    // cooling ones, oldest first, and then none.
    let now = at(13_000);
    let got: Vec<IpAddr> = (0..3)
        .map(|i| add(&mut store, &desired, &format!("n{i}"), Family::V4, now).unwrap())
        .collect();
    assert_eq!(got, [addr("10.0.0.4"), addr("10.0.0.2"), addr("10.0.0.5")]);
    assert!(add(&mut store, &desired, "n3", Family::V4, now).is_err());
    assert_in_step(&mut store, &desired);
    assert_eq!(stored_cooldowns(&mut store).len(), 3);
    // Once run out, the IPv6 cooldowns end (next-fit continues after fd00::6).
    let got = add(&mut store, &desired, "v6", Family::V6, at(40_000)).unwrap();
    assert_eq!(got, addr("fd00::7"));
    assert_in_step(&mut store, &desired);
    assert!(stored_cooldowns(&mut store).is_empty());
}

/// A schema-1 state row whose cooldowns do not decode is rebuilt from the allocations, as it
/// always was: its snapshot must not keep blocking addresses whose cooldowns are lost.
#[test]
fn a_schema_1_state_row_with_unreadable_cooldowns_is_rebuilt() {
    let dir = schema_1_store();
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    conn.execute("UPDATE scopes SET cooling = x'01ffffffff'", [])
        .unwrap();
    drop(conn);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let mut txn = store.begin().unwrap();
    let (state, corrupt) = txn.scope_state(SCOPE).unwrap();
    assert!(state.is_none() && corrupt.is_some(), "{corrupt:?}");
    assert!(txn.cooldowns(SCOPE).unwrap().is_empty());
    assert_eq!(txn.all_allocations(SCOPE).unwrap().len(), 6);
    txn.finish().unwrap();
    let desired = config(&["10.0.0.0/29", "fd00::/125"], Duration::from_secs(30));
    // The next call rebuilds from the rows: every address not held is free.
    let got = add(&mut store, &desired, "n", Family::V4, at(13_000)).unwrap();
    assert!(["10.0.0.2", "10.0.0.4", "10.0.0.5"].contains(&got.to_string().as_str()));
    assert_in_step(&mut store, &desired);
}
