//! etcd going back in time on the operator's side (issue 20), on `MemKv` with tokio's paused
//! clock: a store that answers as another cluster (made again) stops all granting until the
//! live nodes asserted their holdings, the settle time passed, or `corral cluster recover
//! --yes` wrote `recover`; a new term waits for the live nodes' holdings the same way.

use crate::common;

use std::time::Duration;

use common::*;
use corral_cluster::{
    HoldingsRecord, LiveRecord, ReassertRecord, RecoverRecord, decode_value, encode_value,
};
use corral_kv::{Kv, MemKv};

const LONG: Duration = Duration::from_secs(30);

async fn make_live<K: Kv>(kv: &K, name: &str) {
    let record = encode_value(&LiveRecord {
        pid: 1,
        version: "test".into(),
        started_ms: 0,
        ..Default::default()
    })
    .unwrap();
    put(kv, &keys().live(&node(name)), &record).await;
}

async fn assert_holdings<K: Kv>(kv: &K, name: &str) {
    let record = encode_value(&HoldingsRecord {
        uid: format!("uid-{name}"),
        ..HoldingsRecord::default()
    })
    .unwrap();
    put(kv, &keys().holdings(&node(name)), &record).await;
}

/// Waits until the replica pauses granting after the store changed its cluster ID.
async fn regress(kv: &MemKv, replica: &Replica) {
    kv.set_cluster_id(MemKv::CLUSTER_ID + 1);
    wait_until("the regression is seen", LONG, || async {
        replica.shared.regressions() == 1 && replica.shared.granting_paused().is_some()
    })
    .await;
}

/// Replica `op-a` serving the live node `node-a` (its assertion written), then etcd going back
/// in time under it.
async fn regressed_after_node_a() -> (MemKv, Replica) {
    let kv = initialized(DUAL).await;
    let op = Replica::start(&kv, "op-a");
    register(&kv, "node-a").await;
    make_live(&kv, "node-a").await;
    assert_holdings(&kv, "node-a").await;
    wait_until("node-a is served", LONG, || dual_served(&kv, "node-a")).await;
    regress(&kv, &op).await;
    (kv, op)
}

#[tokio::test(start_paused = true)]
async fn after_a_regression_granting_waits_for_the_live_nodes_assertions() {
    let (kv, op) = regressed_after_node_a().await;
    let paused = op.shared.granting_paused().unwrap();
    assert!(paused.contains("etcd went back in time"), "{paused}");
    assert!(paused.contains("node-a"), "{paused}");
    // Every agent is asked to put its record again (`reassert`, after node-a's record: a
    // record that came back with a snapshot is not an assertion).
    let holdings_revision = kv
        .get(keys().holdings(&node("node-a")).as_bytes())
        .await
        .unwrap()
        .unwrap()
        .mod_revision;
    wait_until("the leader asks for the assertions again", LONG, || async {
        kv.get(keys().reassert().as_bytes())
            .await
            .unwrap()
            .is_some()
    })
    .await;
    let reassert = kv.get(keys().reassert().as_bytes()).await.unwrap().unwrap();
    assert!(reassert.mod_revision > holdings_revision);
    let record: ReassertRecord = decode_value(&reassert.value).unwrap();
    assert_eq!(record.replica, "op-a");
    assert!(
        record.reason.contains("etcd went back in time"),
        "{record:?}"
    );
    // node-b registers: nothing is granted while node-a's assertion is owed.
    register(&kv, "node-b").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!dual_served(&kv, "node-b").await);
    // node-a asserts again: granting resumes.
    assert_holdings(&kv, "node-a").await;
    wait_until("node-b is served", LONG, || dual_served(&kv, "node-b")).await;
    assert_eq!(op.shared.granting_paused(), None);
    assert_reported(
        &op.shared,
        &["granting resumes", "every live agent asserted"],
    );
    assert_consistent(&kv).await;
    op.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_regression_waits_at_most_the_settle_time_or_until_recover() {
    let (kv, op) = regressed_after_node_a().await;
    register(&kv, "node-b").await;
    // `corral cluster recover --yes`: granting resumes without node-a's assertion.
    let record = encode_value(&RecoverRecord {
        requested_ms: 0,
        unasserted: vec!["node-a".into()],
    })
    .unwrap();
    put(&kv, &keys().recover(), &record).await;
    wait_until("node-b is served", LONG, || dual_served(&kv, "node-b")).await;
    // Another regression, and nobody asserts: the settle time (40 s) ends the wait.
    kv.set_cluster_id(MemKv::CLUSTER_ID + 2);
    wait_until("the second regression is seen", LONG, || async {
        op.shared.regressions() == 2
    })
    .await;
    register(&kv, "node-c").await;
    let waited = wait_until("node-c is served", Duration::from_secs(120), || {
        dual_served(&kv, "node-c")
    })
    .await;
    assert!(waited >= Duration::from_secs(20), "{waited:?}");
    assert_reported(&op.shared, &["settle time", "node-a"]);
    assert_consistent(&kv).await;
    op.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_new_term_waits_for_live_nodes_without_holdings_and_not_for_the_others() {
    let kv = initialized(DUAL).await;
    register(&kv, "node-a").await;
    make_live(&kv, "node-a").await;
    // node-a is live without a holdings record: the term waits for it.
    let op = Replica::start(&kv, "op-a");
    wait_until("op-a leads", LONG, || async { op.leading() }).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!dual_served(&kv, "node-a").await);
    let paused = op.shared.granting_paused().unwrap();
    assert!(paused.contains("a new term waits"), "{paused}");
    assert_holdings(&kv, "node-a").await;
    wait_until("node-a is served", LONG, || dual_served(&kv, "node-a")).await;
    op.stop().await;
    // The next term: every live node has a record, nothing waits.
    let op = Replica::start(&kv, "op-b");
    register(&kv, "node-b").await;
    let waited = wait_until("node-b is served", LONG, || dual_served(&kv, "node-b")).await;
    assert!(
        waited < Duration::from_secs(30),
        "well within the settle time: {waited:?}"
    );
    assert_eq!(op.shared.granting_paused(), None);
    assert_consistent(&kv).await;
    op.stop().await;
}
