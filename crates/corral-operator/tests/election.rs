//! Elections heal, on `MemKv` and tokio's paused clock: a leader whose election key is deleted
//! by hand steps down within one lease TTL and campaigns again; an election key not on a lease
//! (written by hand) is passed over by every replica and reported, while the fence keeps every
//! write safe. Every scenario ends with `corral_cluster::check` finding nothing and the auditor
//! clean.

use crate::common;

use common::*;
use corral_kv::{Kv, MemKv, TxnOp};
use corral_operator::election::is_candidate;

async fn serve_node<K: Kv>(kv: &K, name: &str) {
    register_served(kv, name).await;
}

async fn delete<K: Kv>(kv: &K, key: &[u8]) {
    apply(kv, vec![TxnOp::delete(key)]).await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_election_key_is_deleted_steps_down_within_its_ttl_and_campaigns_again() {
    let (kv, auditor) = audited(DUAL).await;
    let a = start_leading(&kv, "op-a").await;
    serve_node(&kv, "node-1").await;
    let (_, lease, key, _) = leader_key(&kv).await.unwrap();
    delete(&kv, &key).await;
    let took = wait_until("op-a steps down", TTL, || async { !a.leading() }).await;
    assert!(took < TTL, "{took:?}");
    // It campaigns again, under a new lease, and leads (the only replica).
    wait_until("op-a leads again", TTL * 5, || async {
        a.leading() && leader_key(&kv).await.is_some_and(|(_, l, ..)| l != lease)
    })
    .await;
    // And grants again.
    serve_node(&kv, "node-2").await;
    assert!(!a.finished());
    assert_reported(&a.shared, &["stopped leading"]);
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_when_the_leaders_key_is_deleted() {
    let (kv, auditor) = audited(DUAL).await;
    let a = start_leading(&kv, "op-a").await;
    let b = Replica::start(&kv, "op-b");
    serve_node(&kv, "node-1").await;
    let (_, _, key, _) = leader_key(&kv).await.unwrap();
    delete(&kv, &key).await;
    // op-b's key is now the lowest: it leads; op-a steps down and stands by.
    wait_until("op-b leads and op-a does not", TTL * 3, || async {
        b.leading() && !a.leading()
    })
    .await;
    assert_eq!(leader_key(&kv).await.unwrap().0, "op-b");
    serve_node(&kv, "node-2").await;
    assert!(!a.leading());
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn an_election_key_not_on_a_lease_blocks_no_replica_and_is_reported() {
    let (kv, auditor) = audited(DUAL).await;
    // Written by hand before any replica: the lowest key, on no lease, never going away.
    let rogue = format!("{}1", keys().election_prefix());
    put(&kv, &rogue, b"rogue").await;
    let a = Replica::start(&kv, "op-a");
    let b = Replica::start(&kv, "op-b");
    wait_until("a replica leads", TTL * 3, || async {
        a.leading() || b.leading()
    })
    .await;
    serve_node(&kv, "node-1").await;
    assert!(!(a.leading() && b.leading()));
    // Every replica reports it, naming the key.
    wait_until("both replicas report the key", TTL * 3, || async {
        [&a, &b].iter().all(|r| {
            r.shared
                .problems()
                .iter()
                .any(|p| p.contains(&rogue) && p.contains("not on a lease"))
        })
    })
    .await;
    // `corral cluster check` counts it too.
    let election: Vec<(String, Option<i64>)> = under(&kv, "election/")
        .await
        .iter()
        .map(|e| (e.key_str().into_owned(), e.lease.map(|l| l.0)))
        .collect();
    let problems = corral_cluster::election_problems(&keys(), &election);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains(&rogue));
    // The leader dies: the standby takes over past the rogue key.
    let (leader, standby) = if a.leading() { (a, b) } else { (b, a) };
    leader.kill();
    wait_until("the standby leads", TTL * 3, || async { standby.leading() }).await;
    serve_node(&kv, "node-2").await;
    // Deleted, it is no longer reported.
    delete(&kv, rogue.as_bytes()).await;
    wait_until("the report clears", TTL * 3, || async {
        !standby
            .shared
            .problems()
            .iter()
            .any(|p| p.contains("not on a lease"))
    })
    .await;
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn only_keys_on_the_lease_they_are_named_after_are_candidates() {
    let kv = MemKv::new();
    let candidate = join_election(&kv).await;
    let prefix = keys().election_prefix();
    let other = kv.lease_grant(TTL).await.unwrap();
    // On a lease, but not the one its name says.
    let misnamed = format!("{prefix}{:x}", other.0 + 1000);
    apply(
        &kv,
        vec![TxnOp::put_on_lease(misnamed.as_str(), "x", other)],
    )
    .await;
    put(&kv, &format!("{prefix}2"), b"hand").await;
    let entries = under(&kv, "election/").await;
    let candidates: Vec<&[u8]> = entries
        .iter()
        .filter(|e| is_candidate(prefix.as_bytes(), e))
        .map(|e| e.key.as_slice())
        .collect();
    assert_eq!(candidates, [candidate.key.as_slice()]);
    assert_eq!(
        corral_operator::election::problems(prefix.as_bytes(), &entries).len(),
        2
    );
}
