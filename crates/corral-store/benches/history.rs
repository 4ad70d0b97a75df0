//! The allocation history's queries over 1,000,000 events (`cargo bench -p corral-store
//! --bench history`): each query shape the agent's `GET /v1/history` asks, timed in its own
//! transaction on the agent's kind of store (owned), p50 and max of 50 asks with different
//! targets. Without `--bench` (as under `cargo test --benches`) the history holds 20,000
//! events, as a smoke run.
//!
//! The history: allocations and releases in turn over 60,000 addresses of 10.64.0.0/16, each
//! allocation a new pod (`ns-N/pod-I`, 50 namespaces) with its own container, one event every
//! 2.6 s over 30 days, written in transactions of 10,000 events, each pruning as the agent's
//! commits do (which summarises the log's chunks).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use corral_core::{AttachmentKey, PoolName, Timestamp};
use corral_store::{
    HistoryEvent, HistoryKind, HistoryLimits, HistoryQuery, SqliteStore, Store, StoredAllocation,
    Txn,
};

const BASE_MS: u64 = 1_790_000_000_000;
const STEP_MS: u64 = 2_592;
const ADDRESSES: u64 = 60_000;

fn addr(i: u64) -> IpAddr {
    let host = 2 + i % ADDRESSES;
    IpAddr::from([10, 64, (host / 256) as u8, (host % 256) as u8])
}

/// Event `i`: allocation `i / 2`, allocated when `i` is even, released when odd.
fn event(i: u64) -> HistoryEvent {
    let allocation = i / 2;
    let row = StoredAllocation {
        pool: PoolName::default_pool(),
        addr: addr(allocation),
        owner: format!("ns-{}/pod-{allocation}", allocation % 50),
        key: Some(AttachmentKey::new("podnet", &format!("c{allocation:016x}"), "eth0").unwrap()),
        generation: allocation + 1,
        lease: None,
    };
    let kind = if i.is_multiple_of(2) {
        HistoryKind::Allocated
    } else {
        HistoryKind::Released
    };
    HistoryEvent::of(
        Timestamp::from_unix_millis(BASE_MS + i * STEP_MS),
        kind,
        "node",
        &row,
    )
}

fn time(
    store: &mut SqliteStore,
    asks: u64,
    ask: impl Fn(&mut <SqliteStore as Store>::Txn<'_>, u64) -> usize,
) -> (Duration, Duration, usize) {
    let mut samples = Vec::new();
    let mut found = 0;
    for n in 0..asks {
        let started = Instant::now();
        let mut txn = store.begin().unwrap();
        found += ask(&mut txn, n);
        drop(txn);
        samples.push(started.elapsed());
    }
    samples.sort();
    (samples[samples.len() / 2], *samples.last().unwrap(), found)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let events: u64 = if full { 1_000_000 } else { 20_000 };
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let mut store = SqliteStore::open_owned(dir.path(), &dir.path().join("bench.sock")).unwrap();
    let started = Instant::now();
    let mut i = 0;
    while i < events {
        let mut txn = store.begin().unwrap();
        for _ in 0..10_000.min(events - i) {
            txn.record_history(&event(i)).unwrap();
            i += 1;
        }
        // As every commit of the agent: the bounds, and the chunks of the log summarised.
        txn.prune_history(&HistoryLimits::default(), event(i - 1).at)
            .unwrap();
        txn.commit().unwrap();
    }
    println!(
        "history of {events} events written in {:.1} s ({} bytes of database and log)",
        started.elapsed().as_secs_f64(),
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum::<u64>()
    );
    let span = events * STEP_MS;
    let at = |n: u64| Timestamp::from_unix_millis(BASE_MS + (n * 7_919 % events) * STEP_MS);
    let query = |limit: usize| HistoryQuery {
        limit,
        ..HistoryQuery::default()
    };
    let allocations = events / 2;
    let rows: Vec<(&str, (Duration, Duration, usize))> = vec![
        (
            "newest 100, no filter",
            time(&mut store, 50, |txn, _| {
                txn.history(&query(100)).unwrap().len()
            }),
        ),
        (
            "one address, newest 100",
            time(&mut store, 50, |txn, n| {
                let q = HistoryQuery {
                    addr: Some(addr(n * 1_237)),
                    ..query(100)
                };
                txn.history(&q).unwrap().len()
            }),
        ),
        (
            "who held an address at an instant (address + at)",
            time(&mut store, 50, |txn, n| {
                txn.held_at(addr(n * 1_237), at(n)).unwrap().len()
            }),
        ),
        (
            "one pod (owner)",
            time(&mut store, 50, |txn, n| {
                let pod = (n * 4_999) % allocations;
                let q = HistoryQuery {
                    owner: Some(format!("ns-{}/pod-{pod}", pod % 50)),
                    ..query(100)
                };
                txn.history(&q).unwrap().len()
            }),
        ),
        (
            "one attachment (container ID)",
            time(&mut store, 50, |txn, n| {
                let pod = (n * 4_999) % allocations;
                let q = HistoryQuery {
                    container_id: Some(format!("c{pod:016x}")),
                    ..query(100)
                };
                txn.history(&q).unwrap().len()
            }),
        ),
        (
            "a one-hour span (since + until), newest 100",
            time(&mut store, 50, |txn, n| {
                let since = at(n);
                let q = HistoryQuery {
                    since: Some(since),
                    until: Some(since.saturating_add(Duration::from_secs(3600))),
                    ..query(100)
                };
                txn.history(&q).unwrap().len()
            }),
        ),
        (
            "everything since the start, newest 10,000",
            time(&mut store, 10, |txn, _| {
                let q = HistoryQuery {
                    since: Some(Timestamp::from_unix_millis(BASE_MS)),
                    ..query(10_000)
                };
                txn.history(&q).unwrap().len()
            }),
        ),
        (
            "one address before a time (address + until)",
            time(&mut store, 50, |txn, n| {
                let q = HistoryQuery {
                    addr: Some(addr(n * 1_237)),
                    until: Some(at(n)),
                    ..query(100)
                };
                txn.history(&q).unwrap().len()
            }),
        ),
    ];
    println!(
        "span of the history: {:.1} days",
        span as f64 / 86_400_000.0
    );
    println!("| query over {events} events | p50 (ms) | max (ms) | events answered |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, (p50, max, found)) in rows {
        println!(
            "| {name} | {:.3} | {:.3} | {found} |",
            p50.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3
        );
    }
}
