//! The SQLite store on real files in temporary directories: schema, durability, exclusivity,
//! and engines built from what it holds.

use crate::common;

use common::{attached, one_pool};

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, PoolName, Request, Target, Timestamp,
};
use corral_store::{
    Need, SCHEMA_VERSION, ScopeConfig, SqliteStore, Store, StoreError, StoredAllocation, Txn,
    build_engine, save_engine,
};

const SCOPE: &str = "net";

fn config(ranges: &[&str]) -> ScopeConfig {
    one_pool(&PoolName::default_pool(), ranges, Duration::ZERO)
}

fn key(i: usize) -> AttachmentKey {
    AttachmentKey::new("net", &format!("container{i}"), "eth0").unwrap()
}

/// The engine a CNI call builds: the snapshot plus one attachment's rows.
fn partial_for(
    txn: &mut impl Txn,
    desired: &ScopeConfig,
    attachment: &AttachmentKey,
) -> Result<Engine, StoreError> {
    let keys = [attachment.clone()];
    let need = Need::Partial {
        keys: &keys,
        addrs: &[],
        now: Timestamp::ZERO,
    };
    Ok(build_engine(txn, SCOPE, desired, EngineConfig::default(), need)?.0)
}

/// One CNI-style ADD: partial engine, allocate, write the row and the state, commit.
fn add(store: &mut SqliteStore, desired: &ScopeConfig, i: usize) -> Result<IpAddr, StoreError> {
    let attachment = key(i);
    let mut txn = store.begin()?;
    let mut engine = partial_for(&mut txn, desired, &attachment)?;
    let pool = PoolName::default_pool();
    let owner = format!("pod-{i}");
    let request = Request {
        pool: &pool,
        owner: &owner,
        key: Some(&attachment),
        lease: None,
    };
    let allocation = engine.allocate(&request, Target::Next(Family::V4), Timestamp::ZERO)?;
    if !allocation.existing {
        txn.put_allocation(
            SCOPE,
            &attached(
                pool.clone(),
                (allocation.addr, allocation.generation),
                owner,
                attachment,
            ),
        )?;
        save_engine(&mut txn, SCOPE, desired, &engine)?;
    }
    txn.commit()?;
    Ok(allocation.addr)
}

/// A store in a directory of its own holding the allocations of containers `0..n` in a pool
/// of `ranges` (the directory, the scope's configuration, the store).
fn store_with(ranges: &[&str], n: usize) -> (tempfile::TempDir, ScopeConfig, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let desired = config(ranges);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    for i in 0..n {
        add(&mut store, &desired, i).unwrap();
    }
    (dir, desired, store)
}

/// The scope's whole engine (and whether it was built whole: always).
fn full_engine(txn: &mut impl Txn, desired: &ScopeConfig) -> Result<(Engine, bool), StoreError> {
    build_engine(txn, SCOPE, desired, EngineConfig::default(), Need::Full)
}

fn del(store: &mut SqliteStore, desired: &ScopeConfig, i: usize) -> Result<usize, StoreError> {
    let attachment = key(i);
    let mut txn = store.begin()?;
    let mut engine = partial_for(&mut txn, desired, &attachment)?;
    let released = engine.release_key(&attachment, Timestamp::ZERO);
    for r in &released {
        txn.delete_allocation(SCOPE, r.addr)?;
    }
    save_engine(&mut txn, SCOPE, desired, &engine)?;
    txn.commit()?;
    Ok(released.len())
}

#[test]
fn a_new_directory_gets_the_current_schema_and_reopening_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    drop(store);
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn a_database_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open(dir.path()).unwrap());
    let conn = rusqlite_open(dir.path());
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    match SqliteStore::open(dir.path()) {
        Err(StoreError::SchemaTooNew { found, .. }) => assert_eq!(found, SCHEMA_VERSION + 1),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

fn rusqlite_open(dir: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.join(corral_store::DB_FILE)).unwrap()
}

#[test]
fn allocations_survive_reopening_and_continue_where_they_left_off() {
    let dir = tempfile::tempdir().unwrap();
    let desired = config(&["10.0.0.0/29"]);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let first: Vec<IpAddr> = (0..3)
        .map(|i| add(&mut store, &desired, i).unwrap())
        .collect();
    assert_eq!(
        first,
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"].map(|a| a.parse::<IpAddr>().unwrap())
    );
    drop(store);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    // The same key again: the same address, nothing written.
    assert_eq!(add(&mut store, &desired, 1).unwrap(), first[1]);
    assert_eq!(del(&mut store, &desired, 0).unwrap(), 1);
    assert_eq!(del(&mut store, &desired, 0).unwrap(), 0);
    // Next-fit continues after .3 although .1 is free again.
    assert_eq!(
        add(&mut store, &desired, 9).unwrap().to_string(),
        "10.0.0.4"
    );
    let mut txn = store.begin().unwrap();
    let rows = txn.all_allocations(SCOPE).unwrap();
    assert_eq!(rows.len(), 3);
}

/// An allocation of 10.0.0.9 without a key.
fn unkeyed_row() -> StoredAllocation {
    StoredAllocation {
        pool: PoolName::default_pool(),
        addr: "10.0.0.9".parse().unwrap(),
        owner: "x".into(),
        key: None,
        generation: 1,
        lease: None,
    }
}

#[test]
fn an_uncommitted_transaction_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    {
        let mut txn = store.begin().unwrap();
        txn.put_allocation(SCOPE, &unkeyed_row()).unwrap();
    }
    let mut txn = store.begin().unwrap();
    assert!(txn.all_allocations(SCOPE).unwrap().is_empty());
}

#[test]
fn the_database_refuses_one_address_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let mut txn = store.begin().unwrap();
    let row = unkeyed_row();
    txn.put_allocation(SCOPE, &row).unwrap();
    match txn.put_allocation(SCOPE, &row) {
        Err(StoreError::Taken { addr, .. }) => assert_eq!(addr, row.addr),
        other => panic!("expected Taken, got {other:?}"),
    }
}

#[test]
fn partial_and_full_engines_agree_and_a_changed_configuration_rebuilds() {
    let (_dir, desired, mut store) = store_with(&["10.0.0.0/28"], 6);
    del(&mut store, &desired, 2).unwrap();
    let mut txn = store.begin().unwrap();
    let (partial, was_full) = build_engine(
        &mut txn,
        SCOPE,
        &desired,
        EngineConfig::default(),
        Need::Partial {
            keys: &[],
            addrs: &[],
            now: Timestamp::ZERO,
        },
    )
    .unwrap();
    assert!(!was_full);
    let (full, was_full) = full_engine(&mut txn, &desired).unwrap();
    assert!(was_full);
    let pool = PoolName::default_pool();
    assert_eq!(
        partial.pool_snapshot(&pool).unwrap(),
        full.pool_snapshot(&pool).unwrap()
    );
    assert_eq!(full.n_allocations(), 5);
    full.check_invariants().unwrap();
    drop(txn);

    // A wider range: the next call rebuilds from the rows and keeps every allocation.
    let wider = config(&["10.0.0.0/27"]);
    let addr = add(&mut store, &wider, 20).unwrap();
    assert_eq!(addr.to_string(), "10.0.0.7");
    let mut txn = store.begin().unwrap();
    let (full, _) = full_engine(&mut txn, &wider).unwrap();
    assert_eq!(full.n_allocations(), 6);
    full.check_invariants().unwrap();
}

#[test]
fn a_corrupt_state_row_is_rebuilt_from_the_allocations() {
    let (dir, desired, mut store) = store_with(&["10.0.0.0/28"], 4);
    let conn = rusqlite_open(dir.path());
    conn.execute("UPDATE scopes SET snapshots = x'01ff'", [])
        .unwrap();
    drop(conn);
    // The snapshot is unreadable: the store reports it, and the next ADD rebuilds from rows
    // instead of handing out a held address.
    let mut txn = store.begin().unwrap();
    let (state, reason) = txn.scope_state(SCOPE).unwrap();
    assert!(state.is_none());
    assert!(reason.unwrap().contains("corrupt"));
    drop(txn);
    assert_eq!(
        add(&mut store, &desired, 10).unwrap().to_string(),
        "10.0.0.5"
    );
}

#[test]
fn writers_in_many_threads_never_lose_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let desired = config(&["10.0.0.0/24"]);
    drop(SqliteStore::open(dir.path()).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let path = dir.path().to_path_buf();
            let desired = desired.clone();
            std::thread::spawn(move || {
                let mut store = SqliteStore::open(&path).unwrap();
                (0..10)
                    .map(|i| add(&mut store, &desired, t * 100 + i).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all: Vec<IpAddr> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 80, "an address was handed out twice");
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let mut txn = store.begin().unwrap();
    assert_eq!(txn.all_allocations(SCOPE).unwrap().len(), 80);
    let (full, _) = full_engine(&mut txn, &desired).unwrap();
    full.check_invariants().unwrap();
}

#[test]
fn a_checkpoint_moves_a_store_to_another_and_bad_ones_change_nothing() {
    use corral_store::{CHECKPOINT_FORMAT, Checkpoint, export_checkpoint, import_checkpoint};
    let (_source_dir, desired, mut source) = store_with(&["10.0.0.0/28"], 5);
    del(&mut source, &desired, 1).unwrap();
    let mut txn = source.begin().unwrap();
    let checkpoint = export_checkpoint(&mut txn).unwrap();
    drop(txn);
    assert_eq!(checkpoint.format, CHECKPOINT_FORMAT);
    let text = serde_json::to_string_pretty(&checkpoint).unwrap();
    assert!(text.contains("\"containerId\": \"container0\""), "{text}");

    let target_dir = tempfile::tempdir().unwrap();
    let mut target = SqliteStore::open(target_dir.path()).unwrap();
    let parsed: Checkpoint = serde_json::from_str(&text).unwrap();
    let mut txn = target.begin().unwrap();
    import_checkpoint(&mut txn, &parsed).unwrap();
    txn.commit().unwrap();
    // Both stores now make the same next decision.
    assert_eq!(
        add(&mut source, &desired, 7).unwrap(),
        add(&mut target, &desired, 7).unwrap()
    );

    // Importing again (the scope now holds allocations), a wrong format, or a broken row:
    // refused, and the target is as it was.
    let before = {
        let mut txn = target.begin().unwrap();
        txn.all_allocations(SCOPE).unwrap()
    };
    let mut wrong_format = parsed.clone();
    wrong_format.format = "corral-checkpoint/99".into();
    let mut broken = parsed.clone();
    broken.scopes[0].allocations[0].address = "10.0.0.999".into();
    for bad in [&parsed, &wrong_format, &broken] {
        let mut txn = target.begin().unwrap();
        assert!(import_checkpoint(&mut txn, bad).is_err());
    }
    for bad in [&wrong_format, &broken] {
        let empty_dir = tempfile::tempdir().unwrap();
        let mut empty = SqliteStore::open(empty_dir.path()).unwrap();
        let mut txn = empty.begin().unwrap();
        assert!(import_checkpoint(&mut txn, bad).is_err());
    }
    let mut txn = target.begin().unwrap();
    assert_eq!(txn.all_allocations(SCOPE).unwrap(), before);
    // A scope listed twice is refused, not merged.
    let mut doubled = parsed.clone();
    doubled.scopes.push(parsed.scopes[0].clone());
    let fresh_dir = tempfile::tempdir().unwrap();
    let mut fresh = SqliteStore::open(fresh_dir.path()).unwrap();
    let mut txn = fresh.begin().unwrap();
    assert!(import_checkpoint(&mut txn, &doubled).is_err());
    drop(txn);
    // A checkpoint holding one address twice is refused too.
    let mut twice = parsed.clone();
    let first = twice.scopes[0].allocations[0].clone();
    let mut copy = first.clone();
    copy.container_id = Some("someone-else".into());
    twice.scopes[0].allocations.push(copy);
    let empty_dir = tempfile::tempdir().unwrap();
    let mut empty = SqliteStore::open(empty_dir.path()).unwrap();
    let mut txn = empty.begin().unwrap();
    assert!(import_checkpoint(&mut txn, &twice).is_err());
}

/// An owner (the agent) holds the directory for as long as it runs: a second owner is refused
/// at once, a one-shot store (a CNI call) is told which agent holds it instead of waiting for
/// ever, and both work again once the owner is gone — also when it was killed and left its
/// agent file behind.
#[test]
fn an_owned_directory_refuses_other_owners_and_names_the_agent_to_cni_calls() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    // The agent's socket answers (a CNI call checks that the agent file is not stale).
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let mut owner = SqliteStore::open_owned(dir.path(), &socket).unwrap();
    let desired = config(&["10.0.0.0/29"]);
    assert_eq!(
        add(&mut owner, &desired, 1).unwrap().to_string(),
        "10.0.0.1"
    );
    match SqliteStore::open_owned(dir.path(), &socket) {
        Err(StoreError::Held { .. }) => {}
        other => panic!("a second owner: {other:?}"),
    }
    match SqliteStore::open_one_shot(dir.path()) {
        Err(StoreError::Held { holder, .. }) => {
            assert!(holder.contains("agent.sock"), "{holder}")
        }
        other => panic!("a CNI call while the agent runs: {other:?}"),
    }
    owner.close().unwrap();
    drop(listener);
    assert!(!dir.path().join(corral_store::AGENT_FILE).exists());
    // A killed agent leaves its file; the lock died with it, so calls go on and clear it.
    std::fs::write(dir.path().join(corral_store::AGENT_FILE), "/gone.sock").unwrap();
    let held = SqliteStore::open_one_shot(dir.path()).unwrap();
    // Another call meanwhile: the file names a dead socket, so it waits for the lock
    // instead of being told an agent holds the directory.
    std::fs::write(dir.path().join(corral_store::AGENT_FILE), "/gone.sock").unwrap();
    let path = dir.path().to_path_buf();
    let waiter = std::thread::spawn(move || SqliteStore::open_one_shot(&path).map(drop));
    std::thread::sleep(Duration::from_millis(200));
    held.close().unwrap();
    waiter.join().unwrap().unwrap();
    let mut call = SqliteStore::open_one_shot(dir.path()).unwrap();
    assert!(!dir.path().join(corral_store::AGENT_FILE).exists());
    assert_eq!(add(&mut call, &desired, 2).unwrap().to_string(), "10.0.0.2");
    call.close().unwrap();
    let mut owner = SqliteStore::open_owned(dir.path(), &socket).unwrap();
    let mut txn = owner.begin().unwrap();
    assert_eq!(txn.all_allocations(SCOPE).unwrap().len(), 2);
}

/// Regression: something else keeping the database open (the sqlite3 shell a user inspects
/// it with, a shared store) must not stall CNI calls. A one-shot store then cannot lock the
/// database exclusively and falls back to SQLite's shared-memory index at once; a fold that
/// meets a reader waits a moment, not the connection's 30 s.
#[test]
fn another_open_connection_does_not_stall_one_shot_stores() {
    let dir = tempfile::tempdir().unwrap();
    let desired = config(&["10.0.0.0/16"]);
    let mut first = SqliteStore::open_one_shot(dir.path()).unwrap();
    add(&mut first, &desired, 0).unwrap();
    first.close().unwrap();
    // An idle reader, as the sqlite3 shell after a query, and one in a read transaction.
    let idle = rusqlite_open(dir.path());
    let _: i64 = idle
        .query_row("SELECT count(*) FROM allocations", [], |r| r.get(0))
        .unwrap();
    let reading = rusqlite_open(dir.path());
    reading.execute_batch("BEGIN").unwrap();
    let _: i64 = reading
        .query_row("SELECT count(*) FROM allocations", [], |r| r.get(0))
        .unwrap();
    let started = std::time::Instant::now();
    // Enough commits to pass the fold threshold at least once.
    for i in 1..40 {
        let mut store = SqliteStore::open_one_shot(dir.path()).unwrap();
        add(&mut store, &desired, i).unwrap();
        store.close().unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    reading.execute_batch("COMMIT").unwrap();
    let n: i64 = idle
        .query_row("SELECT count(*) FROM allocations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 40);
}
