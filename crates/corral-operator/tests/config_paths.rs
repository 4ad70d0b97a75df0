//! One path installs a configuration (issue 20): a configuration written around the CLI is held to `cluster apply`'s rules by the watch, the periodic resync, a restart and a failover alike, on `MemKv` with tokio's paused clock.
//!
//! The last configuration installed is kept in `config-applied`, so it survives the leader; a
//! stored one that fails is not installed, is reported, and no CIDR is granted twice.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use corral_cluster::{AppliedConfigRecord, ClusterConfig, Key, decode_value};
use corral_kv::{Kv, MemKv};

const CONFIG: &str = include_str!("configs/config_paths.toml");

fn renamed() -> String {
    CONFIG.replace("\"default\"", "\"pods\"")
}

fn longer_prefix() -> String {
    CONFIG.replace("node_prefix_len = 24", "node_prefix_len = 25")
}

/// Writes `toml` to the `config` key as etcdctl or a GitOps tool would: no checks.
async fn put_raw<K: Kv>(kv: &K, toml: &str) {
    let json = ClusterConfig::from_toml(toml).unwrap().to_json().unwrap();
    put(kv, &keys().config(), json.as_bytes()).await;
}

/// Every granted CIDR with the grant keys naming it: more than one is a CIDR held twice.
async fn cidrs_held_twice<K: Kv>(kv: &K) -> Vec<String> {
    let mut by_cidr: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in under(kv, "grants/").await {
        if let Ok(Key::Grant { cidr, .. }) = keys().parse(&entry.key_str()) {
            by_cidr
                .entry(cidr.to_string())
                .or_default()
                .push(entry.key_str().into_owned());
        }
    }
    by_cidr
        .into_iter()
        .filter(|(_, keys)| keys.len() > 1)
        .map(|(cidr, keys)| format!("{cidr}: {keys:?}"))
        .collect()
}

/// The configuration recorded in `config-applied`, if any.
async fn applied<K: Kv>(kv: &K) -> Option<ClusterConfig> {
    let entry = kv.get(keys().config_applied().as_bytes()).await.unwrap()?;
    Some(
        decode_value::<AppliedConfigRecord>(&entry.value)
            .ok()?
            .config,
    )
}

async fn served<K: Kv>(kv: &K, names: &[&str]) -> bool {
    let grants = grants(kv).await;
    names
        .iter()
        .all(|n| grants.get(*n).is_some_and(|g| g.len() == 1))
}

async fn wait_served<K: Kv>(kv: &K, names: &[&str]) {
    wait_until("the nodes are served", Duration::from_secs(30), || async {
        served(kv, names).await
    })
    .await;
}

/// Starts one replica on `CONFIG`, serves two nodes, and waits for `config-applied`.
async fn cluster_with_two_nodes(kv: &MemKv) -> Replica {
    init(kv, CONFIG).await;
    let a = Replica::start(kv, "op-a");
    register(kv, "node-a").await;
    register(kv, "node-b").await;
    wait_served(kv, &["node-a", "node-b"]).await;
    let expected = ClusterConfig::from_toml(CONFIG).unwrap();
    wait_until(
        "the leader records the configuration it installed",
        Duration::from_secs(10),
        || async { applied(kv).await.as_ref() == Some(&expected) },
    )
    .await;
    a
}

fn reported(replica: &Replica, needle: &str) -> bool {
    replica.shared.reported().iter().any(|p| p.contains(needle))
}

/// Issue 20: a renamed pool written with etcdctl was refused by the watch but installed by the
/// next restart's full read, which granted 10.244.1.0/24 again to a second node.
#[tokio::test(start_paused = true)]
async fn a_renamed_pool_written_around_the_cli_is_not_installed_by_a_failover() {
    let kv = MemKv::new();
    let a = cluster_with_two_nodes(&kv).await;
    put_raw(&kv, &renamed()).await;
    wait_until("the watch refuses it", Duration::from_secs(10), || async {
        reported(&a, "not applied")
    })
    .await;
    // The leader dies; a new one reads everything.
    a.kill();
    let b = Replica::start(&kv, "op-b");
    register(&kv, "node-c").await;
    wait_served(&kv, &["node-a", "node-b", "node-c"]).await;
    wait_until(
        "the new leader refuses it",
        Duration::from_secs(10),
        || async { reported(&b, "pool default ipv4 is not configured") },
    )
    .await;
    // Some time for anything more to be granted.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cidrs_held_twice(&kv).await, Vec::<String>::new());
    let all: Vec<String> = grants(&kv).await.values().flatten().cloned().collect();
    assert!(all.iter().all(|g| g.starts_with("default/")), "{all:?}");
    assert_eq!(all.len(), 3, "{all:?}");
    let status = b
        .shared
        .with_view(|view, revision| view.status_report(revision, None));
    assert!(
        status
            .unwrap()
            .problems
            .iter()
            .any(|p| p.contains("not applied")),
        "the refusal is in the operator's status"
    );
    // `cluster check` reports the stored configuration and nothing else.
    let problems = check(&kv).await;
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("is not applied"), "{problems:#?}");
    // The configuration put back (and grown) is installed; check is clean again.
    put_raw(
        &kv,
        &CONFIG.replace("10.192.0.0/20\"", "10.192.0.0/20\", \"10.200.0.0/20\""),
    )
    .await;
    wait_until("the fix is recorded", Duration::from_secs(10), || async {
        applied(&kv)
            .await
            .is_some_and(|c| c.pools[0].ipv4.as_ref().unwrap().cidrs.len() == 2)
    })
    .await;
    assert_consistent(&kv).await;
}

/// Every grant is still a /24 (the configuration in force), none held twice.
async fn assert_grants_still_24s(kv: &MemKv) {
    let all: Vec<String> = grants(kv).await.values().flatten().cloned().collect();
    assert!(all.iter().all(|g| g.ends_with("-24")), "{all:?}");
    assert_eq!(cidrs_held_twice(kv).await, Vec::<String>::new());
}

/// The periodic resync reads everything again: a changed node prefix length refused by the
/// watch stays refused there.
#[tokio::test(start_paused = true)]
async fn a_changed_node_prefix_length_is_not_installed_by_the_resync() {
    let kv = MemKv::new();
    let a = cluster_with_two_nodes(&kv).await;
    put_raw(&kv, &longer_prefix()).await;
    // Resyncs (every 2 s) read everything again.
    let before = a.shared.resyncs_ok();
    wait_until("two resyncs", Duration::from_secs(30), || async {
        a.shared.resyncs_ok() >= before + 2
    })
    .await;
    register(&kv, "node-c").await;
    wait_served(&kv, &["node-a", "node-b", "node-c"]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_grants_still_24s(&kv).await;
    assert!(reported(&a, "node_prefix_len"));
    assert_eq!(
        applied(&kv).await,
        Some(ClusterConfig::from_toml(CONFIG).unwrap())
    );
    // A restart (a clean stop, then a new replica) keeps the last good one too.
    a.stop().await;
    let b = Replica::start(&kv, "op-b");
    register(&kv, "node-d").await;
    wait_served(&kv, &["node-a", "node-b", "node-c", "node-d"]).await;
    assert_grants_still_24s(&kv).await;
    drop(b);
}

/// A cluster whose leader never recorded a configuration (a fresh cluster, or one from before
/// `config-applied`): the stored configuration is judged against the grants alone, and one
/// that does not fit them grants nothing until a fitting one is stored.
#[tokio::test(start_paused = true)]
async fn without_a_last_good_configuration_the_grants_judge_the_stored_one() {
    let kv = MemKv::new();
    let a = cluster_with_two_nodes(&kv).await;
    a.stop().await;
    // No record of what was installed, and a renamed pool stored.
    apply(&kv, vec![corral_kv::TxnOp::delete(keys().config_applied())]).await;
    put_raw(&kv, &renamed()).await;
    let b = Replica::start(&kv, "op-b");
    register(&kv, "node-c").await;
    wait_until(
        "the refusal is reported",
        Duration::from_secs(10),
        || async { reported(&b, "nothing is granted") },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!grants(&kv).await.contains_key("node-c"));
    assert_eq!(applied(&kv).await, None);
    // A configuration that fits the grants is installed, recorded, and serves.
    put_raw(&kv, CONFIG).await;
    wait_served(&kv, &["node-a", "node-b", "node-c"]).await;
    wait_until("it is recorded", Duration::from_secs(10), || async {
        applied(&kv).await.is_some()
    })
    .await;
    assert_eq!(cidrs_held_twice(&kv).await, Vec::<String>::new());
    assert_consistent(&kv).await;
}

/// `config-applied` deleted around the CLI while a leader runs: its resyncs keep the
/// configuration in force (a refused stored one is not installed for want of the record), and
/// it writes the record again.
#[tokio::test(start_paused = true)]
async fn a_leader_keeps_its_configuration_when_the_applied_record_is_deleted() {
    let kv = MemKv::new();
    let a = cluster_with_two_nodes(&kv).await;
    put_raw(&kv, &renamed()).await;
    apply(&kv, vec![corral_kv::TxnOp::delete(keys().config_applied())]).await;
    let before = a.shared.resyncs_ok();
    wait_until("two resyncs", Duration::from_secs(30), || async {
        a.shared.resyncs_ok() >= before + 2
    })
    .await;
    wait_until(
        "the record is written again",
        Duration::from_secs(10),
        || async { applied(&kv).await == Some(ClusterConfig::from_toml(CONFIG).unwrap()) },
    )
    .await;
    register(&kv, "node-c").await;
    wait_served(&kv, &["node-a", "node-b", "node-c"]).await;
    let all: Vec<String> = grants(&kv).await.values().flatten().cloned().collect();
    assert!(all.iter().all(|g| g.starts_with("default/")), "{all:?}");
    assert_eq!(cidrs_held_twice(&kv).await, Vec::<String>::new());
}
