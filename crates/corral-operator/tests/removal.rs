//! Removal is a handshake (issue 20), on `MemKv` with tokio's paused clock: a removed node's
//! ranges and node ID wait (quarantine keys in state `waiting`, not on a lease) while its
//! agent asserts it holds them and is live; they enter quarantine once its holdings drop
//! them, or once it showed no liveness for a whole quarantine; a node that comes back keeps
//! them. The leader is killed mid-removal and the next one finishes from etcd alone.
//!
//! The agents are simulated: the test writes `live/<node>` and `holdings/<node>` as an agent
//! does.

use crate::common;

use std::time::Duration;

use common::*;
use corral_cluster::{
    HeldRange, HoldingsRecord, IpNet, PoolName, QuarantineRecord, QuarantineState, RemovalMode,
    RemovalPhase, RemovalRecord, decode_value, encode_value,
};
use corral_kv::{Kv, MemKv, Revision, TxnOp};

async fn register_and_wait<K: Kv>(kv: &K, name: &str) -> Revision {
    register_served(kv, name).await
}

async fn request<K: Kv>(kv: &K, name: &str, node_revision: Revision, mode: RemovalMode) {
    let value = encode_value(&RemovalRecord {
        node_revision,
        requested_ms: 0,
        mode,
        phase: RemovalPhase::Requested,
    })
    .unwrap();
    put(kv, &keys().removal(&node(name)), &value).await;
}

/// `default/ipv4/10.192.1.0-24` → the CIDR.
fn cidr_of(grant: &str) -> IpNet {
    let last = grant.rsplit('/').next().unwrap();
    let (net, len) = last.rsplit_once('-').unwrap();
    format!("{net}/{len}").parse().unwrap()
}

/// The holdings record an agent writes: `ranges` with `allocations` each, and its node ID.
fn holdings(name: &str, ranges: &[String], allocations: u64, node_id: Option<u32>) -> Vec<u8> {
    encode_value(&HoldingsRecord {
        uid: format!("uid-{name}"),
        ranges: ranges
            .iter()
            .map(|g| HeldRange {
                pool: PoolName::new("default").unwrap(),
                cidr: cidr_of(g),
                draining: true,
                allocations,
            })
            .collect(),
        node_id,
        other_node_ids: vec![],
        cloud: vec![],
        refused: vec![],
        refused_node_id: None,
        written_ms: 0,
    })
    .unwrap()
}

async fn put_holdings<K: Kv>(kv: &K, name: &str, value: &[u8]) {
    put(kv, &keys().holdings(&node(name)), value).await;
}

/// The node's liveness key on a lease of `ttl` (not kept alive: it runs out).
async fn live_for<K: Kv>(kv: &K, name: &str, ttl: Duration) {
    let lease = kv.lease_grant(ttl).await.unwrap();
    apply(
        kv,
        vec![TxnOp::put_on_lease(
            keys().live(&node(name)),
            b"{}".to_vec(),
            lease,
        )],
    )
    .await;
}

/// The node's liveness key with no lease (live until deleted).
async fn live<K: Kv>(kv: &K, name: &str) {
    put(kv, &keys().live(&node(name)), b"{}").await;
}

/// Quarantine keys (CIDRs and IDs) from `from`: (key suffix, state, on a lease).
async fn quarantines_from<K: Kv>(kv: &K, from: &str) -> Vec<(String, QuarantineState, bool)> {
    let mut out = Vec::new();
    for rest in ["quarantine/", "quarantine-ids/"] {
        for entry in under(kv, rest).await {
            let record: QuarantineRecord = decode_value(&entry.value).unwrap();
            if record.from_node.as_str() == from {
                let key = entry.key_str();
                let suffix = key.strip_prefix(keys().prefix()).unwrap().to_owned();
                out.push((suffix, record.state, entry.lease.is_some()));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

async fn removal_phase<K: Kv>(kv: &K, name: &str) -> Option<RemovalPhase> {
    let entry = kv
        .get(keys().removal(&node(name)).as_bytes())
        .await
        .unwrap()?;
    Some(decode_value::<RemovalRecord>(&entry.value).unwrap().phase)
}

async fn has<K: Kv>(kv: &K, key: String) -> bool {
    kv.get(key.as_bytes()).await.unwrap().is_some()
}

fn waiting(q: &[(String, QuarantineState, bool)]) -> bool {
    !q.is_empty()
        && q.iter()
            .all(|(_, s, l)| *s == QuarantineState::Waiting && !l)
}

/// `op-a` leading, `op-b` standing by, and `node-a` served: answers them, `node-a`'s
/// registration, its grants (sorted) and its node ID.
async fn node_a_served(kv: &MemKv) -> (Replica, Replica, Revision, Vec<String>, u32) {
    let a = start_leading(kv, "op-a").await;
    let b = Replica::start(kv, "op-b");
    let revision = register_and_wait(kv, "node-a").await;
    let mut a_grants = grants(kv).await["node-a"].clone();
    a_grants.sort();
    let a_id = node_id(kv, "node-a").await.unwrap();
    (a, b, revision, a_grants, a_id)
}

#[tokio::test(start_paused = true)]
async fn a_drained_node_keeps_its_space_until_its_holdings_drop_it_across_failovers() {
    let (kv, auditor) = audited(DUAL).await;
    let (a, b, revision, a_grants, a_id) = node_a_served(&kv).await;
    live(&kv, "node-a").await;
    put_holdings(&kv, "node-a", &holdings("node-a", &a_grants, 3, Some(a_id))).await;

    request(&kv, "node-a", revision, RemovalMode::Drain).await;
    wait_until(
        "node-a's registration is gone",
        Duration::from_secs(5),
        || async { !has(&kv, keys().node(&node("node-a"))).await },
    )
    .await;
    let held = quarantines_from(&kv, "node-a").await;
    assert_eq!(held.len(), 3, "{held:?}");
    assert!(waiting(&held), "waiting, on no lease: {held:?}");
    assert_eq!(
        removal_phase(&kv, "node-a").await,
        Some(RemovalPhase::Draining)
    );

    // The leader dies mid-removal; past the quarantine time nothing of node-a's moves while
    // it is live and holds it, and a node registered meanwhile gets none of it.
    a.kill();
    wait_until("op-b leads", TTL * 3, || async { b.leading() }).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(waiting(&quarantines_from(&kv, "node-a").await));
    register_and_wait(&kv, "node-b").await;
    let b_grants = grants(&kv).await["node-b"].clone();
    assert!(
        b_grants.iter().all(|g| !a_grants.contains(g)),
        "{b_grants:?}"
    );
    assert_ne!(node_id(&kv, "node-b").await, Some(a_id));
    assert_consistent(&kv).await;

    // Its IPv4 range empties and leaves the agent: that one enters quarantine (on a lease);
    // the rest keeps waiting.
    let v4: Vec<String> = a_grants
        .iter()
        .filter(|g| g.contains("ipv4"))
        .cloned()
        .collect();
    let v6: Vec<String> = a_grants
        .iter()
        .filter(|g| g.contains("ipv6"))
        .cloned()
        .collect();
    put_holdings(&kv, "node-a", &holdings("node-a", &v6, 1, Some(a_id))).await;
    wait_until(
        "the IPv4 range enters quarantine",
        Duration::from_secs(5),
        || async {
            quarantines_from(&kv, "node-a")
                .await
                .iter()
                .any(|(k, s, l)| k.contains("ipv4") && *s == QuarantineState::Quarantined && *l)
        },
    )
    .await;
    let q = quarantines_from(&kv, "node-a").await;
    assert!(
        q.iter()
            .filter(|(k, ..)| !k.contains("ipv4"))
            .all(|(_, s, l)| *s == QuarantineState::Waiting && !l),
        "{q:?}"
    );

    // Another failover, then the node drains completely: its holdings say nothing is left.
    let c = Replica::start(&kv, "op-c");
    b.kill();
    wait_until("op-c leads", TTL * 3, || async { c.leading() }).await;
    put_holdings(&kv, "node-a", &holdings("node-a", &[], 0, None)).await;
    wait_until("the removal is done", Duration::from_secs(10), || async {
        removal_phase(&kv, "node-a").await.is_none()
    })
    .await;
    assert!(
        !has(&kv, keys().holdings(&node("node-a"))).await,
        "an empty holdings record of a removed node goes with the removal"
    );
    assert!(
        quarantines_from(&kv, "node-a")
            .await
            .iter()
            .all(|(_, s, l)| *s == QuarantineState::Quarantined && *l)
    );
    // After the quarantine the space is free again: the next node gets node-a's IPv4 range
    // (the lowest free).
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(quarantines_from(&kv, "node-a").await.is_empty());
    register_and_wait(&kv, "node-c").await;
    let c_grants = grants(&kv).await["node-c"].clone();
    assert!(c_grants.contains(&v4[0]), "{c_grants:?} vs {v4:?}");
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_forced_dead_nodes_space_comes_back_after_no_liveness_for_the_whole_quarantine() {
    let (kv, auditor) = audited(DUAL).await;
    let (a, b, revision, a_grants, a_id) = node_a_served(&kv).await;
    // The agent's last word before it died: it holds pods; its liveness runs out.
    put_holdings(&kv, "node-a", &holdings("node-a", &a_grants, 5, Some(a_id))).await;
    live_for(&kv, "node-a", Duration::from_secs(2)).await;

    request(&kv, "node-a", revision, RemovalMode::Force).await;
    wait_until(
        "node-a is taken for silent",
        Duration::from_secs(10),
        || async {
            removal_phase(&kv, "node-a").await == Some(RemovalPhase::Silent)
                && has(&kv, keys().silence(&node("node-a"))).await
        },
    )
    .await;
    assert!(waiting(&quarantines_from(&kv, "node-a").await));
    // The leader dies while the silence runs; the next one goes on from etcd.
    a.kill();
    wait_until("op-b leads", TTL * 3, || async { b.leading() }).await;
    // Not before a whole quarantine without liveness: a node registered meanwhile gets none
    // of it.
    register_and_wait(&kv, "node-b").await;
    let b_grants = grants(&kv).await["node-b"].clone();
    assert!(
        b_grants.iter().all(|g| !a_grants.contains(g)),
        "{b_grants:?}"
    );
    wait_until("node-a is proven gone", Duration::from_secs(15), || async {
        quarantines_from(&kv, "node-a").await.is_empty()
            && removal_phase(&kv, "node-a").await.is_none()
    })
    .await;
    assert!(
        !has(&kv, keys().holdings(&node("node-a"))).await,
        "a node proven gone loses its holdings record"
    );
    register_and_wait(&kv, "node-c").await;
    let c_grants = grants(&kv).await["node-c"].clone();
    assert!(
        c_grants.iter().any(|g| a_grants.contains(g)),
        "{c_grants:?} gets node-a's space back, {a_grants:?}"
    );
    assert_eq!(node_id(&kv, "node-c").await, Some(a_id));
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_forced_node_that_comes_back_keeps_its_space_until_it_gives_it_up() {
    let kv = initialized(DUAL).await;
    let _a = Replica::start(&kv, "op-a");
    let revision = register_and_wait(&kv, "node-a").await;
    let mut a_grants = grants(&kv).await["node-a"].clone();
    a_grants.sort();
    let a_id = node_id(&kv, "node-a").await.unwrap();
    put_holdings(&kv, "node-a", &holdings("node-a", &a_grants, 5, Some(a_id))).await;
    request(&kv, "node-a", revision, RemovalMode::Force).await;
    wait_until(
        "node-a is taken for silent",
        Duration::from_secs(10),
        || async { removal_phase(&kv, "node-a").await == Some(RemovalPhase::Silent) },
    )
    .await;
    // It comes back before the quarantine time passed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    live(&kv, "node-a").await;
    wait_until(
        "node-a is draining again",
        Duration::from_secs(5),
        || async {
            removal_phase(&kv, "node-a").await == Some(RemovalPhase::Draining)
                && !has(&kv, keys().silence(&node("node-a"))).await
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        waiting(&quarantines_from(&kv, "node-a").await),
        "it keeps its space"
    );
    assert!(has(&kv, keys().holdings(&node("node-a"))).await);
    register_and_wait(&kv, "node-b").await;
    let b_grants = grants(&kv).await["node-b"].clone();
    assert!(
        b_grants.iter().all(|g| !a_grants.contains(g)),
        "{b_grants:?}"
    );
    // It gives everything up: quarantined, then free.
    put_holdings(&kv, "node-a", &holdings("node-a", &[], 0, None)).await;
    wait_until("the removal is done", Duration::from_secs(10), || async {
        removal_phase(&kv, "node-a").await.is_none()
    })
    .await;
    assert!(
        quarantines_from(&kv, "node-a")
            .await
            .iter()
            .all(|(_, s, l)| *s == QuarantineState::Quarantined && *l)
    );
    assert_consistent(&kv).await;
}
