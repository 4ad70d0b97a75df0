//! The operator on `MemKv`, in-process, on tokio's paused clock: grants, fencing, failover,
//! removal and quarantine, garbage, full pools, compaction and store outages. Leases and
//! backoff are moved by virtual time, never by sleeping; every scenario ends with
//! `corral_cluster::check` (the checker `corral cluster check` runs) finding nothing.

use crate::common;

use std::time::Duration;

use common::*;
use corral_kv::{Kv, MemKv, Txn, TxnOp};
use corral_operator::election::Fence;

/// Registers `names` and waits until each holds one IPv4 and one IPv6 CIDR and a node ID.
async fn register_and_wait<K: Kv>(kv: &K, names: &[&str]) {
    for name in names {
        register(kv, name).await;
    }
    wait_until("every node is served", Duration::from_secs(30), || async {
        for name in names {
            if !served_with_id(kv, name).await {
                return false;
            }
        }
        true
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn one_replica_grants_lowest_free_dual_stack_cidrs_and_node_ids() {
    let (kv, auditor) = audited(DUAL).await;
    let _a = Replica::start(&kv, "op-a");
    register_and_wait(&kv, &["node-a", "node-b", "node-c"]).await;
    let grants = grants(&kv).await;
    let mut all: Vec<String> = grants.values().flatten().cloned().collect();
    all.sort();
    // The reserved 10.192.0.0/24 is skipped; the lowest free ones go first, one per family.
    assert_eq!(
        all,
        [
            "default/ipv4/10.192.1.0-24",
            "default/ipv4/10.192.2.0-24",
            "default/ipv4/10.192.3.0-24",
            "default/ipv6/fd00:200:0:1::-64",
            "default/ipv6/fd00:200:0:2::-64",
            "default/ipv6/fd00:200::-64",
        ]
    );
    for name in ["node-a", "node-b", "node-c"] {
        let mine = &grants[name];
        assert!(
            mine.iter().any(|g| g.contains("/ipv4/")) && mine.iter().any(|g| g.contains("/ipv6/")),
            "{name}: {mine:?}"
        );
    }
    let mut ids = vec![];
    for name in ["node-a", "node-b", "node-c"] {
        ids.push(node_id(&kv, name).await.unwrap());
    }
    ids.sort();
    assert_eq!(ids, [1, 2, 3]);
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_fence_whose_key_is_gone_or_recreated_lets_no_write_through() {
    let kv = MemKv::new();
    let candidate = join_election(&kv).await;
    let fence = Fence {
        key: candidate.key.clone(),
        revision: candidate.revision,
    };
    let write = |key: &str| Txn {
        compares: vec![],
        success: vec![TxnOp::put(key, "x")],
        failure: vec![],
    };
    assert!(
        kv.txn(fence.guard(write("/probe/1")))
            .await
            .unwrap()
            .succeeded,
        "the live fence lets writes through"
    );
    // The key gone (lease revoked): nothing passes.
    candidate.resign(&kv).await;
    assert!(
        !kv.txn(fence.guard(write("/probe/2")))
            .await
            .unwrap()
            .succeeded
    );
    // The same key written again (another lease's holder, another revision): nothing passes.
    kv.txn(write(std::str::from_utf8(&fence.key).unwrap()))
        .await
        .unwrap();
    assert!(
        !kv.txn(fence.guard(write("/probe/3")))
            .await
            .unwrap()
            .succeeded
    );
    assert!(kv.get(b"/probe/2").await.unwrap().is_none());
    assert!(kv.get(b"/probe/3").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_grants_nothing_and_the_standby_takes_over() {
    let (kv, auditor) = audited(DUAL).await;
    let a = start_leading(&kv, "op-a").await;
    let b = Replica::start(&kv, "op-b");
    register_and_wait(&kv, &["node-1", "node-2"]).await;
    // Nodes arrive while the leader's lease is revoked under it: it still believes it leads
    // until its keep-alive hears otherwise, and every write it tries meanwhile is fenced.
    let (name, lease, ..) = leader_key(&kv).await.unwrap();
    assert_eq!(name, "op-a");
    for i in 3..10 {
        register(&kv, &format!("node-{i}")).await;
    }
    kv.lease_revoke(lease).await.unwrap();
    let took = wait_until("op-b leads", TTL + Duration::from_secs(3), || async {
        b.leading()
    })
    .await;
    assert!(took <= TTL + Duration::from_secs(3), "{took:?}");
    let names: Vec<String> = (1..14).map(|i| format!("node-{i}")).collect();
    for name in &names[9..] {
        register(&kv, name).await;
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    register_and_wait(&kv, &refs).await;
    assert_eq!(leader_key(&kv).await.unwrap().0, "op-b");
    assert!(!a.finished() && !b.finished());
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_standby_leads_within_the_lease_ttl_after_the_leader_dies() {
    let kv = initialized(DUAL).await;
    let a = start_leading(&kv, "op-a").await;
    let b = Replica::start(&kv, "op-b");
    register_and_wait(&kv, &["node-a"]).await;
    // The process dies: no resignation, the election key stays until its lease runs out.
    a.kill();
    let took = wait_until("op-b leads", TTL + Duration::from_secs(2), || async {
        b.leading()
    })
    .await;
    assert!(
        took <= TTL + Duration::from_secs(1),
        "op-b took {took:?} of virtual time"
    );
    register_and_wait(&kv, &["node-b"]).await;
    assert_consistent(&kv).await;
}

#[tokio::test(start_paused = true)]
async fn a_removed_nodes_cidrs_and_id_are_quarantined_then_reused() {
    let (kv, auditor) = audited(DUAL).await;
    let _a = Replica::start(&kv, "op-a");
    let a_revision = register(&kv, "node-a").await;
    register_and_wait(&kv, &["node-a"]).await;
    register_and_wait(&kv, &["node-b"]).await;
    let a_grants = grants(&kv).await["node-a"].clone();
    let a_id = node_id(&kv, "node-a").await.unwrap();
    assert_eq!(a_id, 1);

    request_removal(&kv, "node-a", a_revision).await;
    wait_until("node-a removed", Duration::from_secs(5), || async {
        registration(&kv, "node-a").await.is_none()
    })
    .await;
    assert!(!grants(&kv).await.contains_key("node-a"));
    assert!(under(&kv, "owned/node-a/").await.is_empty());
    assert!(node_id(&kv, "node-a").await.is_none());
    // No agent asserts holdings here: what node-a held is given up at once, and the request
    // goes once nothing of it waits.
    wait_until("the removal is done", Duration::from_secs(5), || async {
        under(&kv, "removals/").await.is_empty()
    })
    .await;
    let quarantined = under(&kv, "quarantine/").await;
    let mut quarantined_keys: Vec<String> = quarantined
        .iter()
        .map(|e| {
            e.key_str()
                .strip_prefix(&format!("{}quarantine/", keys().prefix()))
                .unwrap()
                .to_owned()
        })
        .collect();
    quarantined_keys.sort();
    let mut expected = a_grants.clone();
    expected.sort();
    assert_eq!(quarantined_keys, expected);
    let quarantined_ids = under(&kv, "quarantine-ids/").await;
    assert_eq!(quarantined_ids.len(), 1);
    assert!(
        quarantined_ids[0]
            .key_str()
            .ends_with(&format!("/quarantine-ids/{a_id}"))
    );
    assert!(
        quarantined
            .iter()
            .chain(&quarantined_ids)
            .all(|e| e.lease.is_some()),
        "quarantine is on a lease"
    );
    assert_consistent(&kv).await;

    // A node registered meanwhile does not get what is quarantined.
    register_and_wait(&kv, &["node-c"]).await;
    let c_grants = grants(&kv).await["node-c"].clone();
    assert!(
        c_grants.iter().all(|g| !a_grants.contains(g)),
        "{c_grants:?} vs quarantined {a_grants:?}"
    );
    assert_eq!(node_id(&kv, "node-c").await, Some(3));

    // After the quarantine (5 s) the lowest-free rule hands them out again.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(under(&kv, "quarantine/").await.is_empty());
    assert!(under(&kv, "quarantine-ids/").await.is_empty());
    register_and_wait(&kv, &["node-d"]).await;
    let mut d_grants = grants(&kv).await["node-d"].clone();
    d_grants.sort();
    assert_eq!(d_grants, expected);
    assert_eq!(node_id(&kv, "node-d").await, Some(a_id));

    // A request naming an older registration only goes itself.
    let e_revision = register(&kv, "node-e").await;
    register_and_wait(&kv, &["node-e"]).await;
    request_removal(&kv, "node-e", e_revision - 1).await;
    wait_until(
        "the stale request is dropped",
        Duration::from_secs(5),
        || async { under(&kv, "removals/").await.is_empty() },
    )
    .await;
    assert!(
        kv.get(keys().node(&node("node-e")).as_bytes())
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(grants(&kv).await["node-e"].len(), 2);
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn garbage_is_reported_and_skipped_and_the_operator_keeps_serving() {
    let kv = MemKv::new();
    // A configuration that does not decode: nothing is granted, the problem is reported.
    put(&kv, &keys().config(), b"{not a config").await;
    let a = Replica::start(&kv, "op-a");
    register(&kv, "node-a").await;
    wait_until(
        "the bad configuration is reported",
        Duration::from_secs(5),
        || async { a.shared.problems().iter().any(|p| p.contains("/config")) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(grants(&kv).await.is_empty());
    // Garbage keys and values under grants/ and nodes/.
    let prefix = keys().prefix().to_owned();
    let garbage: [(&str, &[u8]); 7] = [
        ("grants/default/ipv4/not-a-cidr", b"{}"),
        ("grants/default/ipv4/10.192.1.0-24", b"\xff garbage"),
        ("grants/nopool/ipv4/10.192.9.0-24", b"[]"),
        ("nodes/Not_A_Name", b"{}"),
        ("nodes/node-garbage", b"garbage"),
        ("owned/node-x/default/ipv4/10.192.7.3-24", b"{}"),
        ("whatever/else", b""),
    ];
    for (key, value) in garbage {
        put(&kv, &format!("{prefix}{key}"), value).await;
    }
    // A configuration that reads: served, the garbage skipped.
    init(&kv, DUAL).await;
    register_and_wait(&kv, &["node-a", "node-b"]).await;
    let problems = a.shared.problems();
    for needle in ["not-a-cidr", "Not_A_Name", "node-garbage", "whatever/else"] {
        assert!(
            problems.iter().any(|p| p.contains(needle)),
            "{needle} not reported: {problems:#?}"
        );
    }
    // A garbage value still occupies its CIDR (its presence fails the absence compare anyway).
    let all: Vec<String> = grants(&kv).await.values().flatten().cloned().collect();
    assert!(
        !all.contains(&"default/ipv4/10.192.1.0-24".to_owned()),
        "{all:?}"
    );
    assert!(!a.finished(), "the operator never stops over garbage");
    // `check` reports only the garbage itself.
    let problems = check(&kv).await;
    assert!(!problems.is_empty());
    assert!(
        problems
            .iter()
            .all(|p| p.starts_with("garbage") || p.contains("node-x")),
        "{problems:#?}"
    );
}

const TINY: &str = include_str!("configs/tiny.toml");

/// `TINY` full: `node-1` and `node-2` served by `op-a` and `node-3` waiting, the full pool
/// reported; answers `node-1`'s registration too.
async fn tiny_pool_full() -> (MemKv, Replica, i64) {
    let kv = initialized(TINY).await;
    let a = Replica::start(&kv, "op-a");
    let first = register(&kv, "node-1").await;
    register(&kv, "node-2").await;
    wait_until("two nodes served", Duration::from_secs(10), || async {
        grants(&kv).await.len() == 2
    })
    .await;
    register(&kv, "node-3").await;
    wait_until(
        "the full pool is reported",
        Duration::from_secs(10),
        || async { a.shared.full_pools().contains_key("default/ipv4") },
    )
    .await;
    (kv, a, first)
}

#[tokio::test(start_paused = true)]
async fn a_full_pool_is_reported_and_the_waiting_node_is_served_once_space_frees() {
    let (kv, a, first) = tiny_pool_full().await;
    // The leader publishes why node-3 waits, where its agent watches (issue 23).
    let waiting = keys().waiting(&node("node-3"));
    wait_until(
        "node-3's waiting record",
        Duration::from_secs(10),
        || async {
            kv.get(waiting.as_bytes()).await.unwrap().is_some_and(|e| {
                corral_cluster::decode_value::<corral_cluster::WaitingRecord>(&e.value)
                    .is_ok_and(|r| r.waits[0].cause == corral_cluster::WaitingCause::Exhausted)
            })
        },
    )
    .await;
    // It keeps retrying with backoff, granting nothing meanwhile.
    let txns_before = kv.requests();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!grants(&kv).await.contains_key("node-3"));
    assert!(
        kv.requests() - txns_before < 100,
        "backoff, not a busy loop: {}",
        kv.requests() - txns_before
    );
    assert_consistent(&kv).await;
    request_removal(&kv, "node-1", first).await;
    // Served after the quarantine (3 s) plus at most one backoff (2 s).
    wait_until("node-3 served", Duration::from_secs(7), || async {
        grants(&kv).await.contains_key("node-3")
    })
    .await;
    assert!(
        a.shared.full_pools().is_empty(),
        "{:?}",
        a.shared.full_pools()
    );
    // Served: its record goes.
    wait_until(
        "node-3's record deleted",
        Duration::from_secs(10),
        || async { kv.get(waiting.as_bytes()).await.unwrap().is_none() },
    )
    .await;
    assert_consistent(&kv).await;
}

/// Regression: a node whose retry came due went back to the queue with a deadline a year
/// away, so a pool grown by `corral cluster apply` never served the nodes waiting for it
/// (nor a node whose grant was refused once).
#[tokio::test(start_paused = true)]
async fn a_node_waiting_on_a_full_pool_is_served_when_the_pool_grows() {
    let kv = initialized(TINY).await;
    let _a = Replica::start(&kv, "op-a");
    for node in ["node-1", "node-2", "node-3"] {
        register(&kv, node).await;
    }
    wait_until("two nodes served", Duration::from_secs(10), || async {
        grants(&kv).await.len() == 2
    })
    .await;
    // Several backoff rounds pass: the node is retried, and stays unserved.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!grants(&kv).await.contains_key("node-3"));
    // Another cluster CIDR: nothing is deleted, so only the retry (or the configuration's
    // event) can serve the waiting node.
    init(
        &kv,
        &TINY.replace(r#"["10.9.0.0/29"]"#, r#"["10.9.0.0/29", "10.9.1.0/30"]"#),
    )
    .await;
    wait_until(
        "node-3 served from the new CIDR",
        Duration::from_secs(5),
        || async { grants(&kv).await.contains_key("node-3") },
    )
    .await;
    assert_consistent(&kv).await;
}

#[tokio::test(start_paused = true)]
async fn compaction_past_the_leaders_watch_makes_it_read_again() {
    let kv = FaultyKv::new(MemKv::new());
    init(&kv, DUAL).await;
    let auditor = Auditor::start(&kv.inner).await;
    register(&kv, "node-a").await;
    // Between the leader's read of the prefix and its watch, two nodes register and the store
    // is compacted past the watch's start: the watch cannot deliver them, a re-read must.
    kv.faults.lock().unwrap().compact_before_prefix_watch =
        Some(vec!["node-b".into(), "node-c".into()]);
    let a = Replica::start(&kv, "op-a");
    register_and_wait(&kv, &["node-a", "node-b", "node-c"]).await;
    assert_eq!(kv.faults.lock().unwrap().compacted_watches, 1);
    assert!(
        a.shared.metrics.rebuilds.get() >= 2,
        "it read the prefix again"
    );
    assert_eq!(
        leader_key(&kv).await.unwrap().0,
        "op-a",
        "without losing the lead"
    );
    // Compactions of a live watch's past change nothing.
    for i in 0..5 {
        register(&kv, &format!("late-{i}")).await;
        let (_, revision) = corral_kv::read_all(&kv, b"/", 10).await.unwrap();
        kv.compact(revision).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    register_and_wait(&kv, &["late-0", "late-1", "late-2", "late-3", "late-4"]).await;
    assert!(
        a.shared
            .reported()
            .iter()
            .all(|p| !p.contains("stopped leading")),
        "{:?}",
        a.shared.reported()
    );
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn an_outage_during_grants_loses_and_doubles_nothing() {
    let (kv, auditor) = audited(DUAL).await;
    let a = Replica::start(&kv, "op-a");
    let b = Replica::start(&kv, "op-b");
    wait_until("a leader", Duration::from_secs(5), || async {
        a.leading() || b.leading()
    })
    .await;
    let names: Vec<String> = (0..30).map(|i| format!("node-{i}")).collect();
    for name in &names[..15] {
        register(&kv, name).await;
    }
    // Let some grants land, then cut the store off mid-stream.
    tokio::time::sleep(Duration::from_millis(1)).await;
    kv.set_unavailable(true);
    tokio::time::sleep(Duration::from_secs(8)).await;
    kv.set_unavailable(false);
    for name in &names[15..] {
        register(&kv, name).await;
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    register_and_wait(&kv, &refs).await;
    assert_clean_end(&kv, &auditor).await;
}

/// Ten dual-stack nodes granted while the next three grant transactions fail as `lost`
/// says (`Faults::lose_answers` or `lose_requests`): the leader must not guess; it reads back
/// a key each wrote, without reading the whole store again, and every node ends granted once.
async fn ten_nodes_granted_with_three_lost(lost: fn(&mut Faults) -> &mut usize) {
    let kv = FaultyKv::new(MemKv::new());
    init(&kv, DUAL).await;
    let auditor = Auditor::start(&kv.inner).await;
    let a = start_leading(&kv, "op-a").await;
    *lost(&mut kv.faults.lock().unwrap()) = 3;
    let names: Vec<String> = (0..10).map(|i| format!("node-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    register_and_wait(&kv, &refs).await;
    assert_eq!(*lost(&mut kv.faults.lock().unwrap()), 0);
    assert_eq!(
        a.shared.metrics.rebuilds.get(),
        1,
        "a lost answer is read back, not the whole store"
    );
    let grants = grants(&kv).await;
    assert_eq!(grants.len(), 10, "{grants:#?}");
    assert!(grants.values().all(|g| g.len() == 2), "{grants:#?}");
    // Every grant written once: 10 nodes, 2 CIDRs and 1 ID each.
    assert_eq!(*auditor.grants_written.lock().unwrap(), 30);
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_grant_applied_whose_answer_is_lost_is_not_granted_again() {
    // Applied, and the leader hears `Unavailable`: the read back finds them granted.
    ten_nodes_granted_with_three_lost(|faults| &mut faults.lose_answers).await;
}

#[tokio::test(start_paused = true)]
async fn a_grant_lost_on_its_way_is_granted_again_once() {
    // Never applied, and the leader hears `Unavailable`: the read back finds nothing
    // written, and the nodes are tried again.
    ten_nodes_granted_with_three_lost(|faults| &mut faults.lose_requests).await;
}

/// Regression: a node that waited for space (a retry entry) and then stopped needing anything
/// (its registration deleted) left its past-due retry time in the leader's timer, which then
/// fired at once on every turn of the loop: 100% CPU on real time, and on a paused clock time
/// never moved again. Run on a thread of its own, so a spinning leader fails the test instead
/// of hanging it.
#[test]
fn a_retry_for_a_node_that_needs_nothing_does_not_spin_the_leader() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = paused_runtime();
        runtime.block_on(async {
            let (kv, _a, first) = tiny_pool_full().await;
            // node-3's registration goes (an administrator deleted it): it needs nothing now.
            apply(&kv, vec![TxnOp::delete(keys().node(&node("node-3")))]).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            register(&kv, "node-4").await;
            request_removal(&kv, "node-1", first).await;
            wait_until("node-4 served", Duration::from_secs(10), || async {
                grants(&kv).await.contains_key("node-4")
            })
            .await;
            assert_consistent(&kv).await;
        });
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("virtual time moves on: the leader does not spin on a past-due retry");
}

/// 100 dual-stack nodes with node IDs, registered before the leader starts, granted by a
/// leader whose transactions may hold `leader_ops` operations on a store that takes
/// `store_ops`; answers how many transactions the grants took (their distinct revisions) and
/// the problems the leader raised.
async fn hundred_nodes_granted(leader_ops: usize, store_ops: usize) -> (usize, Vec<String>) {
    let (kv, auditor) = audited(DUAL).await;
    kv.set_max_txn_ops(store_ops);
    let names: Vec<String> = (0..100).map(|i| format!("node-{i:03}")).collect();
    for name in &names {
        register(&kv, name).await;
    }
    let replica = Replica::start_sized::<_, corral_cloud::FakeEc2>(
        &kv,
        "op-a",
        corral_operator::OperatorConfig::DEFAULT_PAGE,
        leader_ops,
        None,
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    register_and_wait(&kv, &names).await;
    let revisions: std::collections::BTreeSet<i64> = under(&kv, "grants/")
        .await
        .iter()
        .map(|entry| entry.mod_revision)
        .collect();
    let problems = replica.shared.problems();
    assert_clean_end(&kv, &auditor).await;
    (revisions.len(), problems)
}

/// `--max-txn-ops 512` on an etcd that takes 512: the burst is granted in transactions of
/// 56 nodes (nine compares each with their node IDs), two instead of eight.
#[tokio::test(start_paused = true)]
async fn a_burst_fills_transactions_up_to_max_txn_ops() {
    assert_eq!(hundred_nodes_granted(128, 128).await, (8, vec![]));
    assert_eq!(hundred_nodes_granted(512, 512).await, (2, vec![]));
}

/// `--max-txn-ops 512` on an etcd that takes 128: etcd refuses the first batch, the leader
/// grants every node in transactions of 128 operations and says why.
#[tokio::test(start_paused = true)]
async fn max_txn_ops_above_etcds_falls_back_to_128_and_says_so() {
    let (transactions, problems) = hundred_nodes_granted(512, 128).await;
    assert_eq!(transactions, 8);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("--max-txn-ops is above etcd's own")),
        "{problems:?}"
    );
}
