//! The allocation history in both stores: written in the transaction of the change it
//! records, kept across a reopen, bounded by count and age, answered by each filter, and
//! added to a database of the previous schema by its migration.

mod common;

use common::attached;

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{AttachmentKey, PoolName, Timestamp};
use corral_store::{
    HistoryEvent, HistoryKind, HistoryLimits, HistoryQuery, MemoryStore, PRUNE_BATCH,
    SCHEMA_VERSION, SqliteStore, Store, StoredAllocation, Txn,
};

fn at(millis: u64) -> Timestamp {
    Timestamp::from_unix_millis(millis)
}

fn row(addr: &str, owner: &str, container: &str, generation: u64) -> StoredAllocation {
    attached(
        PoolName::default_pool(),
        (addr.parse().unwrap(), generation),
        owner.to_owned(),
        AttachmentKey::new("net", container, "eth0").unwrap(),
    )
}

fn event(millis: u64, kind: HistoryKind, row: &StoredAllocation) -> HistoryEvent {
    HistoryEvent::of(at(millis), kind, "net", row)
}

fn all(limit: usize) -> HistoryQuery {
    HistoryQuery {
        limit,
        ..HistoryQuery::default()
    }
}

/// Records `events` in one committed transaction.
fn record(store: &mut impl Store, events: &[HistoryEvent]) {
    let mut txn = store.begin().unwrap();
    for event in events {
        txn.record_history(event).unwrap();
    }
    txn.commit().unwrap();
}

fn query(store: &mut impl Store, query: &HistoryQuery) -> Vec<HistoryEvent> {
    store.begin().unwrap().history(query).unwrap()
}

fn held_at(store: &mut impl Store, addr: &str, millis: u64) -> Vec<String> {
    let mut txn = store.begin().unwrap();
    txn.held_at(addr.parse().unwrap(), at(millis))
        .unwrap()
        .into_iter()
        .map(|event| event.owner)
        .collect()
}

/// 10.0.0.5 held by ns/a from 1000 to 2000, then by ns/b from 3000; 10.0.0.6 by ns/a from 1500.
fn a_story() -> Vec<HistoryEvent> {
    let a = row("10.0.0.5", "ns/a", "ca", 1);
    let b = row("10.0.0.5", "ns/b", "cb", 2);
    let a6 = row("10.0.0.6", "ns/a", "ca", 3);
    vec![
        event(1000, HistoryKind::Allocated, &a),
        event(1500, HistoryKind::Allocated, &a6),
        event(2000, HistoryKind::Released, &a),
        event(3000, HistoryKind::Allocated, &b),
    ]
}

fn answers_every_filter(store: &mut impl Store) {
    record(store, &a_story());
    let kinds = |events: Vec<HistoryEvent>| -> Vec<(u64, HistoryKind)> {
        events
            .into_iter()
            .map(|e| (e.at.as_unix_millis(), e.kind))
            .collect()
    };
    assert_eq!(
        kinds(query(store, &all(10))),
        [
            (3000, HistoryKind::Allocated),
            (2000, HistoryKind::Released),
            (1500, HistoryKind::Allocated),
            (1000, HistoryKind::Allocated)
        ],
        "newest first"
    );
    assert_eq!(query(store, &all(2)).len(), 2, "at most the limit");
    let by_addr = HistoryQuery {
        addr: Some("10.0.0.5".parse().unwrap()),
        ..all(10)
    };
    assert_eq!(
        kinds(query(store, &by_addr)),
        [
            (3000, HistoryKind::Allocated),
            (2000, HistoryKind::Released),
            (1000, HistoryKind::Allocated)
        ]
    );
    let by_owner = HistoryQuery {
        owner: Some("ns/a".into()),
        until: Some(at(1800)),
        ..all(10)
    };
    assert_eq!(
        kinds(query(store, &by_owner)),
        [
            (1500, HistoryKind::Allocated),
            (1000, HistoryKind::Allocated)
        ]
    );
    let by_container = HistoryQuery {
        container_id: Some("cb".into()),
        ifname: Some("eth0".into()),
        ..all(10)
    };
    let found = query(store, &by_container);
    assert_eq!(kinds(found.clone()), [(3000, HistoryKind::Allocated)]);
    assert_eq!(found[0].owner, "ns/b");
    assert_eq!(found[0].generation, 2);
    assert_eq!(found[0].key.as_ref().unwrap().network(), "net");
    let since = HistoryQuery {
        since: Some(at(2000)),
        ..all(10)
    };
    assert_eq!(query(store, &since).len(), 2, "since is inclusive");
    // Who held 10.0.0.5 at each instant.
    assert!(held_at(store, "10.0.0.5", 999).is_empty(), "before anyone");
    assert_eq!(held_at(store, "10.0.0.5", 1000), ["ns/a"]);
    assert_eq!(held_at(store, "10.0.0.5", 1999), ["ns/a"]);
    assert!(held_at(store, "10.0.0.5", 2500).is_empty(), "released");
    assert_eq!(held_at(store, "10.0.0.5", 99_999), ["ns/b"]);
    assert_eq!(held_at(store, "10.0.0.6", 2500), ["ns/a"]);
    assert!(held_at(store, "10.0.0.7", 2500).is_empty());
}

#[test]
fn sqlite_answers_every_filter() {
    let dir = tempfile::tempdir().unwrap();
    answers_every_filter(&mut SqliteStore::open(dir.path()).unwrap());
}

#[test]
fn memory_answers_every_filter() {
    answers_every_filter(&mut MemoryStore::new());
}

/// Events are written by the transaction of the change: a dropped transaction leaves none,
/// a committed one survives a reopen (and the events are in no separate commit).
#[test]
fn events_are_durable_with_their_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open_owned(dir.path(), std::path::Path::new("/x.sock")).unwrap();
    let allocation = row("10.0.0.5", "ns/a", "ca", 1);
    {
        let mut txn = store.begin().unwrap();
        txn.put_allocation("net", &allocation).unwrap();
        txn.record_history(&event(1000, HistoryKind::Allocated, &allocation))
            .unwrap();
        // Dropped: rolled back.
    }
    assert!(query(&mut store, &all(10)).is_empty());
    let mut txn = store.begin().unwrap();
    txn.put_allocation("net", &allocation).unwrap();
    txn.record_history(&event(1000, HistoryKind::Allocated, &allocation))
        .unwrap();
    txn.commit().unwrap();
    drop(store);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(
        query(&mut store, &all(10)),
        [event(1000, HistoryKind::Allocated, &allocation)]
    );
    assert_eq!(held_at(&mut store, "10.0.0.5", 1000), ["ns/a"]);
}

fn many(from: u64, n: u64) -> Vec<HistoryEvent> {
    (from..from + n)
        .map(|i| {
            let addr = IpAddr::from([10, 1, (i / 250) as u8, (i % 250) as u8]);
            let allocation = StoredAllocation {
                addr,
                ..row("10.0.0.1", &format!("ns/p{i}"), "c", i)
            };
            event(i, HistoryKind::Allocated, &allocation)
        })
        .collect()
}

fn prunes_by_count_in_batches(store: &mut impl Store) {
    let limits = HistoryLimits {
        max_events: 1000,
        max_age: Duration::from_secs(3600 * 24 * 365),
    };
    record(store, &many(0, 1000 + PRUNE_BATCH - 1));
    let mut txn = store.begin().unwrap();
    assert_eq!(
        txn.prune_history(&limits, at(5000)).unwrap(),
        0,
        "fewer than a batch over: nothing dropped yet"
    );
    txn.record_history(&many(5000, 1)[0]).unwrap();
    assert_eq!(
        txn.prune_history(&limits, at(5000)).unwrap(),
        PRUNE_BATCH,
        "a batch over: one batch dropped"
    );
    txn.commit().unwrap();
    let kept = query(store, &all(usize::MAX));
    assert_eq!(kept.len(), 1000);
    // The oldest went.
    assert_eq!(kept.last().unwrap().at, at(PRUNE_BATCH));
}

#[test]
fn sqlite_prunes_by_count_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    prunes_by_count_in_batches(&mut SqliteStore::open(dir.path()).unwrap());
}

#[test]
fn memory_prunes_by_count_in_batches() {
    prunes_by_count_in_batches(&mut MemoryStore::new());
}

fn prunes_by_age(store: &mut impl Store) {
    let limits = HistoryLimits {
        max_events: 1_000_000,
        max_age: Duration::from_millis(100_000),
    };
    // Events at 0..2000 ms; at 100_000 ms none is past the age, at 101_000 ms those before
    // 1000 are.
    record(store, &many(0, 2000));
    let mut txn = store.begin().unwrap();
    assert_eq!(
        txn.prune_history(&limits, at(100_000)).unwrap(),
        0,
        "nothing past the age yet"
    );
    // Past the bound: those older than the cutoff go, and a little (1% of the age) ahead.
    let dropped = txn.prune_history(&limits, at(101_000)).unwrap();
    assert_eq!(dropped, PRUNE_BATCH.min(2000));
    txn.commit().unwrap();
    let kept = query(store, &all(usize::MAX));
    assert_eq!(kept.len() as u64, 2000 - dropped);
    assert!(kept.iter().all(|e| e.at >= at(dropped)));
    // Later commits drop the rest past the age, a batch at a time (up to 1% past it).
    let mut txn = store.begin().unwrap();
    while txn.prune_history(&limits, at(101_000)).unwrap() > 0 {}
    txn.commit().unwrap();
    let kept = query(store, &all(usize::MAX));
    assert!(kept.iter().all(|e| e.at >= at(1000)), "none past the age");
    assert!(kept.len() >= 1000 - 1000 / 100 - PRUNE_BATCH as usize);
}

#[test]
fn sqlite_prunes_by_age() {
    let dir = tempfile::tempdir().unwrap();
    prunes_by_age(&mut SqliteStore::open(dir.path()).unwrap());
}

#[test]
fn memory_prunes_by_age() {
    prunes_by_age(&mut MemoryStore::new());
}

/// A database of schema 4 (the one before the history) is migrated: what it held stays, and
/// the history starts empty.
#[test]
fn a_schema_4_database_gets_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let allocation = row("10.0.0.5", "ns/a", "ca", 1);
    {
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let mut txn = store.begin().unwrap();
        txn.put_allocation("net", &allocation).unwrap();
        txn.commit().unwrap();
    }
    // What schema 4 was: this one without the history.
    let conn = rusqlite::Connection::open(dir.path().join(corral_store::DB_FILE)).unwrap();
    conn.execute_batch("DROP TABLE history; PRAGMA user_version = 4;")
        .unwrap();
    drop(conn);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(SCHEMA_VERSION, 5);
    assert_eq!(store.schema_version().unwrap(), 5);
    let mut txn = store.begin().unwrap();
    assert_eq!(
        txn.all_allocations("net").unwrap(),
        std::slice::from_ref(&allocation)
    );
    assert!(txn.history(&all(10)).unwrap().is_empty());
    txn.record_history(&event(1000, HistoryKind::Allocated, &allocation))
        .unwrap();
    txn.commit().unwrap();
    assert_eq!(query(&mut store, &all(10)).len(), 1);
}
