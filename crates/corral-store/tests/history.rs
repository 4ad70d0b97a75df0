//! The allocation history in both stores: written in the transaction of the change it
//! records, kept across a reopen, bounded by count and age, answered by each filter, and
//! added to a database of the previous schema by its migration.

use crate::common;

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
/// Two tests of one check: on SQLite (in a temporary directory) and on the memory store.
macro_rules! on_both_stores {
    ($check:ident: $sqlite:ident, $memory:ident) => {
        #[test]
        fn $sqlite() {
            let dir = tempfile::tempdir().unwrap();
            $check(&mut SqliteStore::open(dir.path()).unwrap());
        }

        #[test]
        fn $memory() {
            $check(&mut MemoryStore::new());
        }
    };
}

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

on_both_stores!(answers_every_filter: sqlite_answers_every_filter, memory_answers_every_filter);

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

on_both_stores!(prunes_by_count_in_batches: sqlite_prunes_by_count_in_batches, memory_prunes_by_count_in_batches);

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

on_both_stores!(prunes_by_age: sqlite_prunes_by_age, memory_prunes_by_age);

/// A state directory whose store holds one allocation (in network `net`), closed.
fn holding_one_allocation() -> (tempfile::TempDir, StoredAllocation) {
    let dir = tempfile::tempdir().unwrap();
    let allocation = row("10.0.0.5", "ns/a", "ca", 1);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let mut txn = store.begin().unwrap();
    txn.put_allocation("net", &allocation).unwrap();
    txn.commit().unwrap();
    (dir, allocation)
}

/// Drops what `limits` drop at `now`, in one commit; returns how many went.
fn prune_once(store: &mut impl Store, limits: &HistoryLimits, now: Timestamp) -> u64 {
    let mut txn = store.begin().unwrap();
    let dropped = txn.prune_history(limits, now).unwrap();
    txn.commit().unwrap();
    dropped
}

/// SQLite keeps a commit's events in one row (up to 256): pruning by count or by age that
/// ends within a row drops exactly the events it names, as the memory store does; the rest
/// keep their order, and events recorded later follow them, also after a reopen.
#[test]
fn pruning_within_a_row_drops_exactly_its_events() {
    let year = Duration::from_secs(3600 * 24 * 365);
    let by_count = HistoryLimits {
        max_events: 100,
        max_age: year,
    };
    let by_age = HistoryLimits {
        max_events: 1_000_000,
        max_age: Duration::from_secs(10),
    };
    // 300 events at 0..300 ms: by count, 200 over the 100 kept; by age at 10.05 s, those
    // before 50 ms are past it and those before 150 ms (1% of the age ahead) go.
    for (limits, now, gone) in [(by_count, at(300), 200), (by_age, at(10_050), 150)] {
        let dir = tempfile::tempdir().unwrap();
        let socket = std::path::Path::new("/x.sock");
        let mut sqlite = SqliteStore::open_owned(dir.path(), socket).unwrap();
        let mut memory = MemoryStore::new();
        record(&mut sqlite, &many(0, 300));
        record(&mut memory, &many(0, 300));
        assert_eq!(prune_once(&mut sqlite, &limits, now), gone, "{limits:?}");
        assert_eq!(prune_once(&mut memory, &limits, now), gone, "{limits:?}");
        let kept = query(&mut sqlite, &all(usize::MAX));
        assert_eq!(kept, query(&mut memory, &all(usize::MAX)), "{limits:?}");
        assert_eq!(kept.len(), 300 - gone as usize);
        record(&mut sqlite, &many(300, 10));
        record(&mut memory, &many(300, 10));
        drop(sqlite);
        let mut sqlite = SqliteStore::open_owned(dir.path(), socket).unwrap();
        for q in [all(usize::MAX), all(5)] {
            assert_eq!(query(&mut sqlite, &q), query(&mut memory, &q), "{limits:?}");
        }
        assert_eq!(
            held_at(&mut sqlite, "10.1.1.0", 10_000),
            held_at(&mut memory, "10.1.1.0", 10_000)
        );
        assert_eq!(held_at(&mut sqlite, "10.1.1.0", 10_000), ["ns/p250"]);
    }
}

/// A database of schema 4 (the one before the history) is migrated: what it held stays, and
/// the history starts empty.
#[test]
fn a_schema_4_database_gets_the_history() {
    let (dir, allocation) = holding_one_allocation();
    // What schema 4 was: this one without the history.
    let conn = rusqlite::Connection::open(dir.path().join(corral_store::DB_FILE)).unwrap();
    conn.execute_batch(
        "DROP TABLE history_events; DROP TABLE history_chunks; PRAGMA user_version = 4;",
    )
    .unwrap();
    drop(conn);
    let mut store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(SCHEMA_VERSION, 7);
    assert_eq!(store.schema_version().unwrap(), 7);
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

/// A varied history over several chunks: two scopes, 300 addresses, allocations and
/// releases in turn, and the clock stepped back 20 s half-way (times overlap across chunks).
fn varied(n: u64) -> Vec<HistoryEvent> {
    (0..n)
        .map(|i| {
            let allocation = i / 2;
            let addr = IpAddr::from([
                10,
                2,
                (allocation % 300 / 250) as u8,
                (allocation % 250) as u8,
            ]);
            let scope = if (allocation / 7).is_multiple_of(2) {
                "net"
            } else {
                "other"
            };
            let row = StoredAllocation {
                addr,
                ..row(
                    "10.0.0.1",
                    &format!("ns/p{}", allocation % 1_500),
                    &format!("c{allocation}"),
                    allocation,
                )
            };
            let millis = if i < n / 2 {
                1_000_000 + i * 10
            } else {
                980_000 + i * 10
            };
            let kind = if i.is_multiple_of(2) {
                HistoryKind::Allocated
            } else {
                HistoryKind::Released
            };
            HistoryEvent::of(at(millis), kind, scope, &row)
        })
        .collect()
}

/// Records `events` in commits of varied sizes, each pruning as the agent's do.
fn record_as_the_agent(store: &mut impl Store, events: &[HistoryEvent]) {
    let mut sizes = [1usize, 64, 3, 200, 17].into_iter().cycle();
    let mut rest = events;
    while !rest.is_empty() {
        let (now, later) = rest.split_at(sizes.next().unwrap().min(rest.len()));
        let mut txn = store.begin().unwrap();
        for event in now {
            txn.record_history(event).unwrap();
        }
        txn.prune_history(&HistoryLimits::default(), now.last().unwrap().at)
            .unwrap();
        txn.commit().unwrap();
        rest = later;
    }
}

/// Every query shape, over the log's chunks and its tail, answers exactly what the memory
/// store (the reference) answers, in the same order.
fn answers_like_memory(sqlite: &mut SqliteStore, memory: &mut MemoryStore, n: u64) {
    let mut queries = vec![all(1), all(10), all(100), all(usize::MAX)];
    for k in [0u64, 7, 123, 299] {
        let addr = IpAddr::from([10, 2, (k / 250) as u8, (k % 250) as u8]);
        queries.push(HistoryQuery {
            addr: Some(addr),
            ..all(5)
        });
        queries.push(HistoryQuery {
            addr: Some(addr),
            until: Some(at(1_000_000 + n * 4)),
            ..all(100)
        });
    }
    for p in [0u64, 10, 1_499] {
        queries.push(HistoryQuery {
            owner: Some(format!("ns/p{p}")),
            ..all(100)
        });
    }
    for c in [0u64, 1, n / 2 - 3, n / 2 - 1] {
        queries.push(HistoryQuery {
            container_id: Some(format!("c{c}")),
            ifname: Some("eth0".into()),
            ..all(100)
        });
        queries.push(HistoryQuery {
            container_id: Some(format!("c{c}")),
            ..all(100)
        });
    }
    queries.push(HistoryQuery {
        since: Some(at(1_000_000 + n * 3)),
        until: Some(at(1_000_000 + n * 4)),
        ..all(1_000)
    });
    queries.push(HistoryQuery {
        since: Some(at(990_000)),
        ..all(50)
    });
    for q in &queries {
        assert_eq!(query(sqlite, q), query(memory, q), "{q:?}");
    }
    for k in [0u64, 7, 123, 299, 300] {
        let addr = format!("10.2.{}.{}", k / 250, k % 250);
        for millis in [
            999_999,
            1_000_000 + n * 2,
            1_000_000 + n * 5,
            1_000_000 + n * 20,
        ] {
            assert_eq!(
                held_at(sqlite, &addr, millis),
                held_at(memory, &addr, millis),
                "{addr} at {millis}"
            );
        }
    }
}

#[test]
fn sqlite_answers_like_memory_over_many_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let mut sqlite = SqliteStore::open_owned(dir.path(), std::path::Path::new("/x.sock")).unwrap();
    let mut memory = MemoryStore::new();
    let events = varied(6_000);
    record_as_the_agent(&mut sqlite, &events);
    record_as_the_agent(&mut memory, &events);
    answers_like_memory(&mut sqlite, &mut memory, 6_000);
    // Again from a store opened afresh (the log's ends read from the database).
    drop(sqlite);
    let mut sqlite = SqliteStore::open(dir.path()).unwrap();
    answers_like_memory(&mut sqlite, &mut memory, 6_000);
}

/// The test's child process: appends one event per commit to the history in `dir`, as the
/// agent does (pruning, so chunks are written), says "acked N" after each commit and waits
/// for a line on its input before the next, until it is killed.
#[test]
#[ignore = "run only as a child of events_outlive_a_kill_before_their_chunk"]
fn history_writer_child() {
    use std::io::{BufRead, Write};
    let Some(dir) = std::env::var_os("CORRAL_HISTORY_WRITER_DIR") else {
        return;
    };
    let mut store =
        SqliteStore::open_owned(std::path::Path::new(&dir), std::path::Path::new("/x.sock"))
            .unwrap();
    let events = varied(100_000);
    let mut out = std::io::stdout().lock();
    let mut input = std::io::stdin().lock();
    for (n, event) in events.iter().enumerate() {
        let mut txn = store.begin().unwrap();
        txn.record_history(event).unwrap();
        txn.prune_history(&HistoryLimits::default(), event.at)
            .unwrap();
        txn.commit().unwrap();
        writeln!(out, "acked {}", n + 1).unwrap();
        out.flush().unwrap();
        let mut line = String::new();
        input.read_line(&mut line).unwrap();
    }
}

/// A kill (SIGKILL) while 500 events are appended but not yet summarised in a chunk (the
/// tail), after two chunks were written, loses no acknowledged event: after a reopen every
/// query answers as the memory store given the acknowledged events, and later commits go on
/// summarising.
#[test]
fn events_outlive_a_kill_before_their_chunk() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    // Two whole chunks and part of the third: the tail holds events, and more are coming.
    let kill_after = 2 * 1024 + 500;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "history::history_writer_child",
            "--include-ignored",
            "--nocapture",
        ])
        .env("CORRAL_HISTORY_WRITER_DIR", dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut acked = 0;
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let Some(n) = line.unwrap().strip_prefix("acked ").map(str::to_owned) else {
            continue;
        };
        acked = n.parse::<u64>().unwrap();
        if acked == kill_after {
            // The child waits for its next line: its last commit is acknowledged, its
            // events since the second chunk are in the tail.
            child.kill().unwrap();
            break;
        }
        writeln!(input, "next").unwrap();
    }
    child.wait().unwrap();
    assert_eq!(acked, kill_after, "the child acknowledged events");
    let mut sqlite = SqliteStore::open_owned(dir.path(), std::path::Path::new("/x.sock")).unwrap();
    let kept = query(&mut sqlite, &all(usize::MAX)).len() as u64;
    assert_eq!(kept, acked, "every acknowledged event, and no other");
    let events = varied(100_000);
    let mut memory = MemoryStore::new();
    record(&mut memory, &events[..kept as usize]);
    answers_like_memory(&mut sqlite, &mut memory, kept);
    // Commits after the restart go on: the tail is summarised, answers unchanged.
    let more = &events[kept as usize..kept as usize + 2_000];
    record_as_the_agent(&mut sqlite, more);
    record(&mut memory, more);
    answers_like_memory(&mut sqlite, &mut memory, kept + 2_000);
}

/// Schema 5's history as it was written (a table and four indexes, one row per event).
const SCHEMA_5_HISTORY: &str = "CREATE TABLE history (
        seq INTEGER PRIMARY KEY,
        at INTEGER NOT NULL,
        kind INTEGER NOT NULL,
        scope TEXT NOT NULL,
        pool TEXT NOT NULL,
        family INTEGER NOT NULL,
        addr BLOB NOT NULL,
        network TEXT,
        container_id TEXT,
        ifname TEXT,
        owner TEXT NOT NULL,
        generation INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX history_by_time ON history (at);
    CREATE INDEX history_by_addr ON history (family, addr, at);
    CREATE INDEX history_by_owner ON history (owner, at);
    CREATE INDEX history_by_container ON history (container_id, ifname, at);";

/// Opens the upgraded store in `dir` (a schema-5 or -6 one holding `events` and `allocation`):
/// it is at the current schema, answers `events` as the memory store does, and still holds
/// `allocation`. Answers both stores.
fn upgraded(
    dir: &std::path::Path,
    events: &[HistoryEvent],
    allocation: &StoredAllocation,
) -> (SqliteStore, MemoryStore) {
    let mut sqlite = SqliteStore::open_owned(dir, std::path::Path::new("/x.sock")).unwrap();
    assert_eq!(sqlite.schema_version().unwrap(), SCHEMA_VERSION);
    let mut memory = MemoryStore::new();
    record(&mut memory, events);
    answers_like_memory(&mut sqlite, &mut memory, events.len() as u64);
    {
        let mut txn = sqlite.begin().unwrap();
        assert_eq!(
            txn.all_allocations("net").unwrap(),
            std::slice::from_ref(allocation)
        );
    }
    (sqlite, memory)
}

/// New events follow the 3,000 of an upgraded store, which answers them all as `memory` does.
fn more_follow(mut sqlite: SqliteStore, memory: &mut MemoryStore) {
    let more = varied(5_000);
    record_as_the_agent(&mut sqlite, &more[3_000..]);
    record(memory, &more[3_000..]);
    answers_like_memory(&mut sqlite, memory, 5_000);
}

/// An agent's history of schema 5 (before the log) is read after the upgrade as it was
/// written, whole chunks of it summarised, and new events follow it.
#[test]
fn a_schema_5_history_is_readable_after_the_upgrade() {
    let (dir, allocation) = holding_one_allocation();
    let events = varied(3_000);
    let mut conn = rusqlite::Connection::open(dir.path().join(corral_store::DB_FILE)).unwrap();
    conn.execute_batch("DROP TABLE history_events; DROP TABLE history_chunks;")
        .unwrap();
    conn.execute_batch(SCHEMA_5_HISTORY).unwrap();
    let tx = conn.transaction().unwrap();
    for event in &events {
        let (v, bytes) = match event.addr {
            IpAddr::V4(a) => (4, u128::from(a.to_bits()).to_be_bytes()),
            IpAddr::V6(a) => (6, a.to_bits().to_be_bytes()),
        };
        let key = event.key.as_ref();
        tx.execute(
            "INSERT INTO history (at, kind, scope, pool, family, addr, network, container_id,
             ifname, owner, generation) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            rusqlite::params![
                event.at.as_unix_millis() as i64,
                HistoryKind::ALL
                    .iter()
                    .position(|k| *k == event.kind)
                    .unwrap() as i64
                    + 1,
                event.scope,
                event.pool.as_str(),
                v,
                &bytes[..],
                key.map(AttachmentKey::network),
                key.map(AttachmentKey::container_id),
                key.map(AttachmentKey::ifname),
                event.owner,
                event.generation as i64,
            ],
        )
        .unwrap();
    }
    tx.execute_batch("PRAGMA user_version = 5;").unwrap();
    tx.commit().unwrap();
    drop(conn);
    let (sqlite, mut memory) = upgraded(dir.path(), &events, &allocation);
    more_follow(sqlite, &mut memory);
}

/// Schema 6's log as it was written: one row per event, keyed by its number.
const SCHEMA_6_EVENTS: &str = "CREATE TABLE history_events (
        seq INTEGER PRIMARY KEY,
        at INTEGER NOT NULL,
        event BLOB NOT NULL
    ) STRICT;";

/// Schema 7's rows of `conn` as (number, time, encoding) of each event, in order: each row
/// holds, from its `first` event on, entries of a gap from the number before (u32), the time
/// (i64), the encoding's length (u32) and the encoding.
fn events_of_rows(conn: &rusqlite::Connection) -> Vec<(i64, i64, Vec<u8>)> {
    let rows: Vec<(i64, Vec<u8>)> = conn
        .prepare("SELECT first, events FROM history_events ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut out = Vec::new();
    for (first, bytes) in rows {
        let (mut next, mut rest) = (first, &bytes[..]);
        while !rest.is_empty() {
            let gap = u32::from_le_bytes(rest[0..4].try_into().unwrap());
            let at = i64::from_le_bytes(rest[4..12].try_into().unwrap());
            let len = u32::from_le_bytes(rest[12..16].try_into().unwrap()) as usize;
            let seq = next + i64::from(gap);
            out.push((seq, at, rest[16..16 + len].to_vec()));
            (next, rest) = (seq + 1, &rest[16 + len..]);
        }
    }
    out
}

/// An agent's history of schema 6 (one row per event) is read after the upgrade as it was
/// written, with the same numbers and chunks, its rows grouped, and new events follow it.
#[test]
fn a_schema_6_history_is_readable_after_the_upgrade() {
    let (dir, allocation) = holding_one_allocation();
    let events = varied(3_000);
    let socket = std::path::Path::new("/x.sock");
    let mut sqlite = SqliteStore::open_owned(dir.path(), socket).unwrap();
    record_as_the_agent(&mut sqlite, &events);
    drop(sqlite);
    let chunks = chunks_of(dir.path());
    assert_eq!(chunks.len(), 2);
    // The same events and chunks as schema 6 wrote them: a row per event.
    let mut conn = rusqlite::Connection::open(dir.path().join(corral_store::DB_FILE)).unwrap();
    let written = events_of_rows(&conn);
    assert_eq!(written.len(), 3_000);
    let tx = conn.transaction().unwrap();
    tx.execute_batch("DROP TABLE history_events;").unwrap();
    tx.execute_batch(SCHEMA_6_EVENTS).unwrap();
    for (seq, at, event) in &written {
        tx.execute(
            "INSERT INTO history_events (seq, at, event) VALUES (?1, ?2, ?3)",
            rusqlite::params![seq, at, event],
        )
        .unwrap();
    }
    tx.execute_batch("PRAGMA user_version = 6;").unwrap();
    tx.commit().unwrap();
    drop(conn);
    let (sqlite, mut memory) = upgraded(dir.path(), &events, &allocation);
    // The same numbers, times and encodings, in rows of many events; the same chunks.
    drop(sqlite);
    let conn = rusqlite::Connection::open(dir.path().join(corral_store::DB_FILE)).unwrap();
    assert_eq!(events_of_rows(&conn), written);
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM history_events", [], |r| r.get(0))
        .unwrap();
    assert!(rows < 100, "{rows} rows for 3,000 events");
    drop(conn);
    assert!(chunks_of(dir.path()) == chunks);
    more_follow(
        SqliteStore::open_owned(dir.path(), socket).unwrap(),
        &mut memory,
    );
}

/// The chunks' summaries as `history_chunks` holds them, in order.
type ChunkRow = (i64, i64, i64, i64, Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

fn chunks_of(dir: &std::path::Path) -> Vec<ChunkRow> {
    let conn = rusqlite::Connection::open(dir.join(corral_store::DB_FILE)).unwrap();
    let mut statement = conn
        .prepare(
            "SELECT lo, hi, min_at, max_at, scopes, addrs, owners, containers
             FROM history_chunks ORDER BY lo",
        )
        .unwrap();
    statement
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The agent's store (owned) summarises a chunk from the events as it wrote them, not from
/// its rows read back: its chunks are exactly those of a store that reads them back (one
/// opened shared), given the same commits, through a restart mid-chunk (the open chunk made
/// again from the tail's rows), a commit of more than a chunk, and pruning by count or by
/// age that reaches the tail or stays behind it; and it answers as the memory store.
#[test]
fn chunks_summarised_as_written_are_those_of_their_rows() {
    let events = varied(7_000);
    let year = Duration::from_secs(3600 * 24 * 365);
    for limits in [
        HistoryLimits::default(),
        // Pruned by count within the tail (before any chunk) and behind it.
        HistoryLimits {
            max_events: 600,
            max_age: year,
        },
        HistoryLimits {
            max_events: 2_500,
            max_age: year,
        },
        // By age: 5 s holds 500 events, and the clock steps back half-way.
        HistoryLimits {
            max_events: 1_000_000,
            max_age: Duration::from_secs(5),
        },
    ] {
        let (owned_dir, shared_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let socket = std::path::Path::new("/x.sock");
        let mut owned = Some(SqliteStore::open_owned(owned_dir.path(), socket).unwrap());
        let mut shared = SqliteStore::open(shared_dir.path()).unwrap();
        let mut memory = MemoryStore::new();
        let mut sizes = [1usize, 64, 1_100, 3, 200, 17].into_iter().cycle();
        let (mut rest, mut written, mut restarted) = (&events[..], 0, false);
        while !rest.is_empty() {
            let (now, later) = rest.split_at(sizes.next().unwrap().min(rest.len()));
            commit(owned.as_mut().unwrap(), now, &limits);
            commit(&mut shared, now, &limits);
            commit(&mut memory, now, &limits);
            written += now.len();
            rest = later;
            // A restart with half a chunk in the tail.
            if !restarted && written > 1_024 + 512 {
                drop(owned.take());
                owned = Some(SqliteStore::open_owned(owned_dir.path(), socket).unwrap());
                restarted = true;
            }
        }
        let mut owned = owned.unwrap();
        let n = events.len() as u64;
        for q in [all(usize::MAX), all(10)] {
            assert_eq!(query(&mut owned, &q), query(&mut memory, &q), "{limits:?}");
        }
        if limits == HistoryLimits::default() {
            answers_like_memory(&mut owned, &mut memory, n);
        }
        drop((owned, shared));
        let chunks = chunks_of(owned_dir.path());
        assert!(
            limits.max_events < 1_024 || !chunks.is_empty(),
            "{limits:?}: {} chunks",
            chunks.len()
        );
        assert!(chunks == chunks_of(shared_dir.path()), "{limits:?}");
    }
}

/// Records `events` in one transaction, pruned to `limits` as the agent's are.
fn commit(store: &mut impl Store, events: &[HistoryEvent], limits: &HistoryLimits) {
    let mut txn = store.begin().unwrap();
    for event in events {
        txn.record_history(event).unwrap();
    }
    txn.prune_history(limits, events.last().unwrap().at)
        .unwrap();
    txn.commit().unwrap();
}
