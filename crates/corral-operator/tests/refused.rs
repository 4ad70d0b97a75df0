//! Grants an agent refused (issue 20), on `MemKv` with tokio's paused clock: etcd restored from
//! a snapshot hands a node back a grant it had given up (another node's since, which asserts
//! it); the node's agent does not take it up and lists it as refused in `holdings/<node>`; the
//! leader revokes exactly that grant (same node, same create revision), grants the node anew,
//! and never grants the space while the other node asserts it.
//!
//! The agents are simulated: the test writes `holdings/<node>` as an agent does.

use crate::common;

use std::time::Duration;

use common::*;
use corral_cluster::{
    Family, HeldRange, HoldingsRecord, IpNet, PoolName, RefusedGrant, encode_value,
};
use corral_kv::Kv;

const LONG: Duration = Duration::from_secs(30);

/// `default/ipv4/10.192.1.0-24` → the CIDR.
fn cidr_of(grant: &str) -> IpNet {
    let last = grant.rsplit('/').next().unwrap();
    let (net, len) = last.rsplit_once('-').unwrap();
    format!("{net}/{len}").parse().unwrap()
}

fn v4_grant(grants: &[String]) -> IpNet {
    grants
        .iter()
        .map(|g| cidr_of(g))
        .find(|c| matches!(c, IpNet::V4(_)))
        .expect("an IPv4 grant")
}

async fn put_holdings<K: Kv>(kv: &K, name: &str, held: &[IpNet], refused: Vec<RefusedGrant>) {
    let record = HoldingsRecord {
        uid: format!("uid-{name}"),
        ranges: held
            .iter()
            .map(|cidr| HeldRange {
                pool: PoolName::new("default").unwrap(),
                cidr: *cidr,
                draining: false,
                allocations: 1,
            })
            .collect(),
        refused,
        ..HoldingsRecord::default()
    };
    put(
        kv,
        &keys().holdings(&node(name)),
        &encode_value(&record).unwrap(),
    )
    .await;
}

/// The create revision of `key`, which must exist.
async fn create_revision<K: Kv>(kv: &K, key: &str) -> i64 {
    kv.get(key.as_bytes())
        .await
        .unwrap()
        .unwrap()
        .create_revision
}

#[tokio::test(start_paused = true)]
async fn a_refused_grant_is_revoked_and_the_node_granted_anew_around_space_another_node_asserts() {
    let kv = initialized(DUAL).await;
    let op = Replica::start(&kv, "op-a");
    register(&kv, "node-a").await;
    wait_until("node-a is served", LONG, || dual_served(&kv, "node-a")).await;
    let old = v4_grant(&grants(&kv).await["node-a"]);
    let pool = PoolName::new("default").unwrap();
    let grant_key = keys().grant(&pool, Family::V4, &old);
    let revision = create_revision(&kv, &grant_key).await;
    // node-b holds that CIDR (etcd forgot: restored from a snapshot), and node-a's agent
    // refuses the grant etcd handed back.
    register(&kv, "node-b").await;
    put_holdings(&kv, "node-b", &[old], vec![]).await;
    // A refusal of another grant (an older create revision) revokes nothing.
    let refusal = |grant_revision| {
        vec![RefusedGrant {
            pool: pool.clone(),
            cidr: old,
            grant_revision,
        }]
    };
    put_holdings(&kv, "node-a", &[], refusal(revision - 1)).await;
    wait_until("node-b is served", LONG, || dual_served(&kv, "node-b")).await;
    assert!(kv.get(grant_key.as_bytes()).await.unwrap().is_some());
    put_holdings(&kv, "node-a", &[], refusal(revision)).await;
    wait_until("node-a is granted anew", LONG, || async {
        grants(&kv)
            .await
            .get("node-a")
            .is_some_and(|g| g.len() == 2 && v4_grant(g) != old)
    })
    .await;
    let owned = keys().owned(&node("node-a"), &pool, Family::V4, &old);
    assert!(kv.get(owned.as_bytes()).await.unwrap().is_none());
    // The space node-b asserts goes to nobody.
    let all = grants(&kv).await;
    assert!(all.values().flatten().all(|g| cidr_of(g) != old), "{all:?}");
    assert_reported(&op.shared, &["refused its grant", &old.to_string()]);
    op.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_node_id_is_revoked_and_the_node_given_one_anew() {
    let kv = initialized(DUAL).await;
    let op = Replica::start(&kv, "op-a");
    register(&kv, "node-a").await;
    wait_until("node-a has its node ID", LONG, || async {
        node_id(&kv, "node-a").await.is_some()
    })
    .await;
    let id = node_id(&kv, "node-a").await.unwrap();
    let of_node = keys().node_id_of_node(&node("node-a"));
    let revision = create_revision(&kv, &of_node).await;
    let record = HoldingsRecord {
        uid: "uid-node-a".into(),
        refused_node_id: Some(corral_cluster::RefusedNodeId { id, revision }),
        ..HoldingsRecord::default()
    };
    put(
        &kv,
        &keys().holdings(&node("node-a")),
        &encode_value(&record).unwrap(),
    )
    .await;
    wait_until("node-a has a node ID granted anew", LONG, || async {
        kv.get(of_node.as_bytes())
            .await
            .unwrap()
            .is_some_and(|e| e.create_revision > revision)
    })
    .await;
    assert_reported(&op.shared, &["refused", &format!("node ID {id}")]);
    op.stop().await;
}
