//! The agent's cluster link on `MemKv` (`tests/common`): registration, grants becoming
//! `cluster` ranges and draining, zero store requests per CNI ADD/DEL, degraded mode during
//! an outage, and the liveness key on the agent's lease. The tests bound by the link's timers
//! (the outage, the liveness key with 1–2 s lease TTLs) run on the paused clock
//! (`tests/common/paused.rs`: the agent over a `MemoryStore`, in-process); the others on a
//! real agent (SQLite, socket) in real time, waiting for events.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;
use corral_agent::link::ClusterOptions;
use corral_api::{
    AllocateRequest, AttachmentKey, CniAddRequest, CniKeyRequest, CniNetwork, RangeSource,
};
use corral_cluster::{NodeName, NodeRecord, encode_value};
use corral_kv::{Kv, MemKv, Txn, TxnOp};
use corral_store::MemoryStore;

use common::paused::{Api, MemAgent, wait_for};
use common::{LinkedAgent, keys, runtime, wait_until};

fn start(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    dir: &Path,
    node: &str,
    uid: &str,
    ttl: Duration,
) -> LinkedAgent {
    start_with(runtime, kv, dir, node, uid, ttl, |_| {})
}

/// [`start`] node-1 as machine uid-1.
fn start_node_1(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    dir: &Path,
    ttl: Duration,
) -> LinkedAgent {
    start(runtime, kv, dir, "node-1", "uid-1", ttl)
}

fn start_with_epoch(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    dir: &Path,
    node: &str,
    uid: &str,
    ttl: Duration,
    epoch_file: Option<PathBuf>,
) -> LinkedAgent {
    start_with(runtime, kv, dir, node, uid, ttl, |options| {
        options.epoch_file = epoch_file
    })
}

fn start_with(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    dir: &Path,
    node: &str,
    uid: &str,
    ttl: Duration,
    edit: impl FnOnce(&mut ClusterOptions),
) -> LinkedAgent {
    let mut options = common::options(node, uid, ttl);
    edit(&mut options);
    LinkedAgent::start(runtime, kv, common::config(dir), options)
}

/// The node scope's cluster ranges, as `(range, draining)`.
fn ranges_of(pools: &corral_api::PoolsResponse) -> Vec<(String, bool)> {
    let mut ranges: Vec<(String, bool)> = pools
        .pools
        .iter()
        .flat_map(|p| p.ranges.iter())
        .filter(|r| r.source == RangeSource::Cluster)
        .map(|r| {
            (
                r.range.split(',').next().unwrap_or_default().to_owned(),
                r.draining,
            )
        })
        .collect();
    ranges.sort();
    ranges
}

/// [`ranges_of`] a real agent.
fn cluster_ranges(agent: &LinkedAgent) -> Vec<(String, bool)> {
    ranges_of(&agent.client().pools(Some("node")).unwrap())
}

/// [`ranges_of`] an in-memory agent.
async fn ranges(api: &Api) -> Vec<(String, bool)> {
    ranges_of(&api.pools(Some("node")).await.unwrap())
}

/// An in-memory agent on the paused clock, registered as `node-1` with its liveness on a
/// lease of `ttl`.
async fn start_paused(kv: &MemKv, ttl: Duration) -> MemAgent {
    let options = common::options("node-1", "uid-1", ttl);
    MemAgent::start(kv, &MemoryStore::new(), common::paused::config(), options)
        .await
        .wait_registered()
        .await
}

/// Grants `cidr` (`10.192.1.0/24`) of pool `default` to `node`, as the operator writes it.
async fn grant(kv: &MemKv, node: &str, cidr: &str) {
    common::grant(kv, node, "default", cidr).await;
}

/// Grants `cidr` to node-1 and waits until it is `agent`'s one cluster range, active.
fn grant_first(runtime: &tokio::runtime::Runtime, kv: &MemKv, agent: &LinkedAgent, cidr: &str) {
    runtime.block_on(grant(kv, "node-1", cidr));
    wait_until("the grant arrives", Duration::from_secs(10), || {
        cluster_ranges(agent) == [(cidr.to_owned(), false)]
    });
}

async fn revoke_grant(kv: &MemKv, node: &str, cidr: &str) {
    let keys = keys();
    let name = NodeName::new(node).unwrap();
    let cidr: corral_cluster::IpNet = cidr.parse().unwrap();
    let family = if cidr.addr().is_ipv4() {
        corral_cluster::Family::V4
    } else {
        corral_cluster::Family::V6
    };
    let pool = corral_cluster::PoolName::new("default").unwrap();
    kv.txn(Txn {
        compares: vec![],
        success: vec![
            TxnOp::delete(keys.grant(&pool, family, &cidr)),
            TxnOp::delete(keys.owned(&name, &pool, family, &cidr)),
        ],
        failure: vec![],
    })
    .await
    .unwrap();
}

/// One address of pool `default` of the node scope for `owner`.
fn allocate_request(owner: &str) -> AllocateRequest {
    AllocateRequest {
        scope: "node".into(),
        pool: "default".into(),
        family: None,
        address: None,
        owner: owner.into(),
        key: None,
        lease_ms: None,
    }
}

fn allocate(agent: &LinkedAgent, owner: &str) -> Result<std::net::IpAddr, corral_client::Error> {
    let response = agent.client().allocate(&allocate_request(owner))?;
    Ok(response.allocations[0].address)
}

/// [`grant_first`] on an in-memory agent.
async fn grant_first_paused(kv: &MemKv, api: &Api, cidr: &str) {
    grant(kv, "node-1", cidr).await;
    wait_for("the grant arrives", Duration::from_secs(10), async || {
        ranges(api).await == [(cidr.to_owned(), false)]
    })
    .await;
}

/// [`allocate`] on an in-memory agent.
async fn allocate_paused(api: &Api, owner: &str) -> Result<std::net::IpAddr, corral_client::Error> {
    let response = api.allocate(&allocate_request(owner)).await?;
    Ok(response.allocations[0].address)
}

#[test]
fn registration_records_the_uid_and_a_second_machine_is_refused() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    let a = start(
        &runtime,
        &kv,
        &dir.path().join("a"),
        "node-1",
        "uid-a",
        Duration::from_secs(3),
    );
    wait_until("node-1 registered", Duration::from_secs(10), || {
        a.cluster_status().registered
    });
    let entry = runtime
        .block_on(kv.get(keys().node(&NodeName::new("node-1").unwrap()).as_bytes()))
        .unwrap()
        .expect("nodes/node-1 exists");
    let record: NodeRecord = corral_cluster::decode_value(&entry.value).unwrap();
    assert_eq!(record.uid, "uid-a");
    wait_until("node-1 asserted by a", Duration::from_secs(10), || {
        holdings(&runtime, &kv, "node-1").is_some_and(|r| r.uid == "uid-a")
    });
    let before_b = runtime
        .block_on(kv.range(b"-", None, 1, None))
        .unwrap()
        .revision;
    // Another machine under the same name: refused, and it says why.
    let b = start(
        &runtime,
        &kv,
        &dir.path().join("b"),
        "node-1",
        "uid-b",
        Duration::from_secs(3),
    );
    wait_until("node-1 on b refused", Duration::from_secs(10), || {
        b.cluster_status()
            .last_error
            .is_some_and(|e| e.contains("another machine uid"))
    });
    let status = b.cluster_status();
    assert!(!status.registered, "{status:?}");
    assert!(
        status.last_error.as_deref().unwrap().contains("uid-a"),
        "{status:?}"
    );
    // The first keeps its registration.
    let after = runtime
        .block_on(kv.get(keys().node(&NodeName::new("node-1").unwrap()).as_bytes()))
        .unwrap()
        .unwrap();
    assert_eq!(after.create_revision, entry.create_revision);
    assert!(a.cluster_status().registered);
    b.stop(&runtime);
    // b never asserted the node's holdings in a's place (review, 2026-12-01: a refused
    // machine's record replaced the node's own, and the two rewrote each other without end).
    for record in holdings_since(&runtime, &kv, before_b) {
        assert_eq!(record.uid, "uid-a", "{record:?}");
    }
    a.stop(&runtime);
}

#[test]
fn a_grant_becomes_a_cluster_range_and_drains_when_it_goes() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_node_1(&runtime, &kv, dir.path(), Duration::from_secs(3)).wait_registered();
    grant_first(&runtime, &kv, &agent, "10.192.1.0/24");
    let address = allocate(&agent, "pod-1").unwrap();
    assert!(common::within("10.192.1.0/24", address), "{address}");
    assert_eq!(
        agent.cluster_status().grants,
        ["default 10.192.1.0/24,gateway=10.192.1.1"],
        "a node CIDR is served with its first host as the gateway"
    );
    assert_ne!(
        address.to_string(),
        "10.192.1.1",
        "the gateway is not handed out"
    );
    // The grant goes: the range drains (it holds pod-1), nothing new comes from it.
    runtime.block_on(revoke_grant(&kv, "node-1", "10.192.1.0/24"));
    wait_until("the range drains", Duration::from_secs(10), || {
        cluster_ranges(&agent) == [("10.192.1.0/24".to_owned(), true)]
    });
    assert!(
        allocate(&agent, "pod-2").is_err(),
        "nothing is allocated from a draining range"
    );
    agent.stop(&runtime);
}

#[test]
fn cni_add_and_del_make_no_store_requests() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    // A long lease: no keep-alive falls in the measured window.
    let agent = start_node_1(&runtime, &kv, dir.path(), Duration::from_secs(600)).wait_registered();
    runtime.block_on(grant(&kv, "node-1", "10.192.1.0/24"));
    runtime.block_on(grant(&kv, "node-1", "fd00:200::/64"));
    wait_until("both grants arrive", Duration::from_secs(10), || {
        cluster_ranges(&agent).len() == 2
    });
    // The node asserts what it now holds (one write, soon after the grants): measured after
    // it, so the window holds CNI calls only.
    wait_until(
        "the holdings list both grants",
        Duration::from_secs(10),
        || holdings(&runtime, &kv, "node-1").is_some_and(|h| h.ranges.len() == 2),
    );
    let network = CniNetwork::on_node_pool("podnet", "default");
    let before = kv.requests();
    let mut client = agent.client();
    for i in 0..100 {
        let key = AttachmentKey {
            network: "podnet".into(),
            container_id: format!("c{i}"),
            ifname: "eth0".into(),
        };
        let added = client
            .cni_add(&CniAddRequest {
                network: network.clone(),
                key: key.clone(),
                owner: format!("pod-{i}"),
                // A node pool's families decide: one address per family it has ranges in.
                sets: vec![],
            })
            .unwrap();
        assert_eq!(added.allocations.len(), 2);
        if i % 2 == 0 {
            client
                .cni_del(&CniKeyRequest {
                    network: network.clone(),
                    key,
                })
                .unwrap();
        }
    }
    assert_eq!(kv.requests(), before, "CNI ADD/DEL made store requests");
    agent.stop(&runtime);
}

#[tokio::test(start_paused = true)]
async fn an_outage_degrades_the_agent_which_keeps_serving_what_it_holds() {
    let kv = MemKv::new();
    let agent = start_paused(&kv, Duration::from_secs(1)).await;
    let api = agent.api();
    grant_first_paused(&kv, &api, "10.192.1.0/24").await;
    allocate_paused(&api, "before").await.unwrap();
    kv.set_unavailable(true);
    wait_for("degraded", Duration::from_secs(5), async || {
        agent.cluster_status().await.degraded
    })
    .await;
    let status = agent.cluster_status().await;
    assert!(status.degraded_since_ms.is_some(), "{status:?}");
    // Nothing held is dropped; pods keep getting addresses from it.
    assert_eq!(ranges(&api).await, [("10.192.1.0/24".to_owned(), false)]);
    for i in 0..10 {
        let address = allocate_paused(&api, &format!("during-{i}")).await.unwrap();
        assert!(common::within("10.192.1.0/24", address), "{address}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ranges(&api).await, [("10.192.1.0/24".to_owned(), false)]);
    kv.set_unavailable(false);
    wait_for("no longer degraded", Duration::from_secs(15), async || {
        let status = agent.cluster_status().await;
        !status.degraded && status.degraded_since_ms.is_none() && status.registered
    })
    .await;
    // New grants arrive again.
    grant(&kv, "node-1", "fd00:200::/64").await;
    wait_for(
        "the new grant arrives",
        Duration::from_secs(10),
        async || ranges(&api).await.len() == 2,
    )
    .await;
    agent.stop().await;
}

/// `live/node-1` as it is now.
async fn live_entry(kv: &MemKv) -> corral_kv::KeyValue {
    let key = keys().live(&NodeName::new("node-1").unwrap());
    kv.get(key.as_bytes()).await.unwrap().expect("live/node-1")
}

/// A keep-alive that fails while the lease still runs (etcd slow or briefly without a
/// leader) does not end the link's round: the agent says it is degraded, tries again, and
/// keeps its lease and liveness key; ending the round at once made every agent of a starved
/// etcd register, claim and watch again, and load it more (issue 25's 5,000 agents). Past the
/// TTL without a renewal, the round ends.
#[tokio::test(start_paused = true)]
async fn a_keep_alive_failing_within_the_ttl_keeps_the_round_and_past_it_ends_it() {
    let kv = MemKv::new();
    let agent = start_paused(&kv, Duration::from_secs(3)).await;
    let api = agent.api();
    grant_first_paused(&kv, &api, "10.192.1.0/24").await;
    let before = live_entry(&kv).await;
    // Keep-alives every second; unavailable for 1.5 s (under the 3 s TTL): one or two fail.
    kv.set_unavailable(true);
    wait_for(
        "degraded by a failed keep-alive",
        Duration::from_secs(2),
        async || agent.cluster_status().await.degraded,
    )
    .await;
    let status = agent.cluster_status().await;
    let error = status.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("keeping the liveness lease alive failed"),
        "{status:?}"
    );
    assert!(status.registered, "the round goes on: {status:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    kv.set_unavailable(false);
    wait_for(
        "a keep-alive succeeds again",
        Duration::from_secs(2),
        async || {
            let status = agent.cluster_status().await;
            !status.degraded && status.last_error.is_none()
        },
    )
    .await;
    let after = live_entry(&kv).await;
    assert_eq!(
        (after.lease, after.create_revision),
        (before.lease, before.create_revision),
        "the same lease and key: no new round"
    );
    assert_eq!(ranges(&api).await, [("10.192.1.0/24".to_owned(), false)]);
    // Past the TTL without a renewal the round ends (the lease may be gone): the agent links
    // again on a new lease once etcd answers.
    let before = after;
    kv.set_unavailable(true);
    // Keep-alives fail for a TTL (3 s), then the round ends with the store's error.
    wait_for("the round ends", Duration::from_secs(5), async || {
        let status = agent.cluster_status().await;
        status.last_error.as_deref()
            == Some("cluster store unavailable: in-memory store set unavailable")
    })
    .await;
    kv.set_unavailable(false);
    wait_for("linked again", Duration::from_secs(40), async || {
        let status = agent.cluster_status().await;
        status.registered && !status.degraded && status.last_error.is_none()
    })
    .await;
    let after = live_entry(&kv).await;
    assert_ne!(after.lease, before.lease, "a new round, on a new lease");
    assert_eq!(ranges(&api).await, [("10.192.1.0/24".to_owned(), false)]);
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_liveness_key_lives_on_the_agents_lease_and_its_expiry_removes_no_grant() {
    let kv = MemKv::new();
    let agent = start_paused(&kv, Duration::from_secs(1)).await;
    let api = agent.api();
    grant_first_paused(&kv, &api, "10.192.1.0/24").await;
    let live_key = keys().live(&NodeName::new("node-1").unwrap());
    let live = kv
        .get(live_key.as_bytes())
        .await
        .unwrap()
        .expect("live/node-1 while running");
    assert!(live.lease.is_some(), "on a lease");
    // Kept alive past several TTLs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(kv.get(live_key.as_bytes()).await.unwrap().is_some());
    // The link dies without revoking: the key goes with the lease, within its TTL of the
    // last keep-alive (virtual time makes that exact; the 100 ms are `wait_for`'s looks), and
    // the grant stays.
    agent.kill_link();
    wait_for(
        "live/node-1 expires",
        Duration::from_millis(1100),
        async || kv.get(live_key.as_bytes()).await.unwrap().is_none(),
    )
    .await;
    let grants = corral_kv::read_all(&kv, keys().grants_prefix().as_bytes(), 100)
        .await
        .unwrap()
        .0;
    assert_eq!(grants.len(), 1, "a lease expiry frees nothing");
    assert!(
        kv.get(keys().node(&NodeName::new("node-1").unwrap()).as_bytes())
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(ranges(&api).await, [("10.192.1.0/24".to_owned(), false)]);
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_liveness_key_deleted_by_hand_is_put_back_and_one_another_process_takes_drains_the_ranges()
 {
    let kv = MemKv::new();
    let agent = start_paused(&kv, Duration::from_secs(2)).await;
    let api = agent.api();
    grant_first_paused(&kv, &api, "10.192.1.0/24").await;
    allocate_paused(&api, "pod-1").await.unwrap();
    let live_key = keys().live(&NodeName::new("node-1").unwrap());
    let get = async || kv.get(live_key.as_bytes()).await.unwrap();
    let first = get().await.expect("live/node-1");
    let record: corral_cluster::LiveRecord = corral_cluster::decode_value(&first.value).unwrap();
    assert_eq!(record.pid, std::process::id());
    assert!(!record.boot_id.is_empty() && record.process_start > 0 && record.ttl_ms == 2_000);
    // Deleted by hand: put back on the same lease, the ranges served on.
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::delete(live_key.as_str())],
        failure: vec![],
    })
    .await
    .unwrap();
    wait_for("the key is back", Duration::from_secs(10), async || {
        get()
            .await
            .is_some_and(|e| e.create_revision > first.create_revision && e.lease == first.lease)
    })
    .await;
    assert_eq!(ranges(&api).await, [("10.192.1.0/24".to_owned(), false)]);
    // Another process's key over it (on its own lease): the agent drains and says who.
    let lease = kv.lease_grant(Duration::from_secs(30)).await.unwrap();
    let other = corral_cluster::LiveRecord {
        pid: 4242,
        host: "elsewhere".into(),
        ..Default::default()
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::put_on_lease(
            live_key.as_str(),
            encode_value(&other).unwrap(),
            lease,
        )],
        failure: vec![],
    })
    .await
    .unwrap();
    wait_for("the range drains", Duration::from_secs(10), async || {
        ranges(&api).await == [("10.192.1.0/24".to_owned(), true)]
    })
    .await;
    let status = agent.cluster_status().await;
    assert!(!status.registered, "{status:?}");
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("another live agent (host elsewhere, pid 4242")),
        "{status:?}"
    );
    // It does not fight: the other's key stays.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(get().await.unwrap().lease, Some(lease));
    agent.stop().await;
    // A clean stop left the other's key alone.
    assert_eq!(get().await.unwrap().lease, Some(lease));
}

#[tokio::test(start_paused = true)]
async fn a_serving_agent_that_finds_its_key_held_after_its_lease_lapsed_drains_while_it_waits() {
    let kv = MemKv::new();
    let agent = start_paused(&kv, Duration::from_secs(2)).await;
    let api = agent.api();
    grant_first_paused(&kv, &api, "10.192.1.0/24").await;
    let live_key = keys().live(&NodeName::new("node-1").unwrap());
    let get = async || kv.get(live_key.as_bytes()).await.unwrap();
    allocate_paused(&api, "pod-1").await.unwrap();
    let ours = get().await.unwrap().lease.unwrap();
    // The agent's lease lapses (its round ends), then another machine's agent takes the key
    // (its lease of 2 s, not kept alive: that agent is gone again).
    kv.lease_revoke(ours).await.unwrap();
    agent.wait_last_error("the round ends", "not found").await;
    let lease = kv.lease_grant(Duration::from_secs(2)).await.unwrap();
    let other = corral_cluster::LiveRecord {
        pid: 4242,
        host: "elsewhere".into(),
        boot_id: "another-boot".into(),
        ttl_ms: 2_000,
        ..Default::default()
    };
    let taken = kv
        .txn(Txn {
            compares: vec![corral_kv::Compare::absent(live_key.as_str())],
            success: vec![TxnOp::put_on_lease(
                live_key.as_str(),
                encode_value(&other).unwrap(),
                lease,
            )],
            failure: vec![],
        })
        .await
        .unwrap();
    assert!(taken.succeeded);
    // While it waits for that key, the node's range drains here.
    wait_for(
        "the range drains while waiting",
        Duration::from_secs(10),
        async || ranges(&api).await == [("10.192.1.0/24".to_owned(), true)],
    )
    .await;
    let status = agent.cluster_status().await;
    assert!(
        status
            .last_error
            .as_ref()
            .is_some_and(|e| e.contains("host elsewhere, pid 4242") && e.contains("waiting up to")),
        "{status:?}"
    );
    // The other's lease expires: the agent takes the key and serves its grant again.
    wait_for("served again", Duration::from_secs(20), async || {
        ranges(&api).await == [("10.192.1.0/24".to_owned(), false)]
            && get()
                .await
                .is_some_and(|e| e.lease.is_some_and(|l| l != lease))
    })
    .await;
    let status = agent.cluster_status().await;
    assert!(
        status.registered && status.last_error.is_none(),
        "{status:?}"
    );
    agent.stop().await;
}

/// Issue 20 (a configuration written around the CLI): once the leader installed a
/// configuration (`config-applied`), the agent follows it, not a `config` someone stored
/// since (which the leader refuses): a pool turned into a block pool with etcdctl does not
/// change how this node serves its node CIDR.
#[test]
fn the_agent_follows_the_installed_configuration_not_one_written_around_the_cli() {
    let runtime = runtime();
    let kv = MemKv::new();
    let keys = keys();
    let installed = corral_cluster::ClusterConfig::from_toml(
        "[[pools]]\nname = \"default\"\n[pools.ipv4]\ncidrs = [\"10.192.0.0/12\"]\nnode_prefix_len = 24\n",
    )
    .unwrap();
    let written_around = corral_cluster::ClusterConfig::from_toml(
        "[[pools]]\nname = \"default\"\nmode = \"blocks\"\n[pools.ipv4]\ncidrs = [\"10.192.0.0/12\"]\nblock_prefix_len = 24\n",
    )
    .unwrap();
    runtime.block_on(async {
        let applied = corral_cluster::AppliedConfigRecord {
            config_revision: 1,
            config: installed.clone(),
        };
        kv.txn(Txn {
            compares: vec![],
            success: vec![
                TxnOp::put(keys.config(), written_around.to_json().unwrap()),
                TxnOp::put(keys.config_applied(), encode_value(&applied).unwrap()),
            ],
            failure: vec![],
        })
        .await
        .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let agent = start_node_1(&runtime, &kv, dir.path(), Duration::from_secs(3)).wait_registered();
    grant_first(&runtime, &kv, &agent, "10.192.1.0/24");
    assert_eq!(
        agent.cluster_status().grants,
        ["default 10.192.1.0/24,gateway=10.192.1.1"],
        "served as the installed configuration's node CIDR (a block would have no gateway)"
    );
    agent.stop(&runtime);
}

/// The create revision of the node's registration, if it has one.
fn registration(runtime: &tokio::runtime::Runtime, kv: &MemKv, node: &str) -> Option<i64> {
    let key = keys().node(&NodeName::new(node).unwrap());
    runtime
        .block_on(kv.get(key.as_bytes()))
        .unwrap()
        .map(|e| e.create_revision)
}

#[test]
fn a_registration_etcd_forgot_is_made_again_and_only_a_recorded_removal_drains_the_node() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_node_1(&runtime, &kv, dir.path(), Duration::from_secs(3)).wait_registered();
    let first = registration(&runtime, &kv, "node-1").unwrap();
    // The registration goes with no removal recorded (etcd restored from a snapshot taken
    // before the node registered, or `etcdctl del`): the node is not taken for removed, it
    // registers again and takes grants and pods as before.
    let node_key = keys().node(&NodeName::new("node-1").unwrap());
    runtime
        .block_on(kv.txn(Txn {
            compares: vec![],
            success: vec![TxnOp::delete(node_key.clone())],
            failure: vec![],
        }))
        .unwrap();
    wait_until("registered again", Duration::from_secs(10), || {
        registration(&runtime, &kv, "node-1").is_some_and(|r| r != first)
            && agent.cluster_status().registered
    });
    grant_first(&runtime, &kv, &agent, "10.192.1.0/24");
    allocate(&agent, "pod-1").expect("a node etcd forgot is not a removed node");
    // A removal records itself with the deletion (`corral node remove`, carried out by the
    // leader): the node drains and does not register again.
    let second = registration(&runtime, &kv, "node-1").unwrap();
    let removal = corral_cluster::RemovalRecord {
        node_revision: second,
        requested_ms: 0,
        mode: corral_cluster::RemovalMode::Drain,
        phase: corral_cluster::RemovalPhase::Draining,
    };
    let removal_key = keys().removal(&NodeName::new("node-1").unwrap());
    runtime
        .block_on(kv.txn(Txn {
            compares: vec![],
            success: vec![
                TxnOp::put(removal_key, encode_value(&removal).unwrap()),
                TxnOp::delete(node_key.clone()),
            ],
            failure: vec![],
        }))
        .unwrap();
    // Said before the range drains (the status first, then the node state): both waited for.
    wait_until("the node drains", Duration::from_secs(10), || {
        agent
            .cluster_status()
            .last_error
            .is_some_and(|e| e.contains("was removed from the cluster"))
            && cluster_ranges(&agent) == [("10.192.1.0/24".to_owned(), true)]
    });
    assert_eq!(registration(&runtime, &kv, "node-1"), None);
    assert!(
        allocate(&agent, "pod-2").is_err(),
        "a removed node takes no new pods"
    );
    agent.stop(&runtime);
}

/// The node's `holdings/` record, if it has one.
fn holdings(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    node: &str,
) -> Option<corral_cluster::HoldingsRecord> {
    let key = keys().holdings(&NodeName::new(node).unwrap());
    runtime
        .block_on(kv.get(key.as_bytes()))
        .unwrap()
        .and_then(|e| corral_cluster::decode_value(&e.value).ok())
}

/// Writes `nodes/<node>` as an agent of machine `uid` would have before this test's agent runs.
async fn register_record(kv: &MemKv, node: &NodeName, uid: &str) {
    let record = NodeRecord {
        uid: uid.into(),
        addresses: Vec::new(),
        registered_ms: 0,
        instance_id: None,
        max_pods: None,
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::put(
            keys().node(node),
            encode_value(&record).unwrap(),
        )],
        failure: vec![],
    })
    .await
    .unwrap();
}

#[test]
fn a_grant_made_before_what_the_agent_had_seen_of_space_it_does_not_hold_is_refused() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    // The agent remembers having seen etcd at revision 1,000,000; etcd answers from an earlier
    // time (restored from a snapshot) with a grant to the node, of space the node does not
    // hold: one it gave up since (another node's by now, maybe).
    let epoch = dir.path().join("etcd-epoch");
    let mut memory = corral_cluster::EpochMemory::default();
    memory.observe(corral_cluster::Epoch {
        cluster_id: MemKv::CLUSTER_ID,
        revision: 1_000_000,
    });
    std::fs::write(&epoch, memory.to_json()).unwrap();
    let name = NodeName::new("node-1").unwrap();
    runtime.block_on(async {
        register_record(&kv, &name, "uid-1").await;
        grant(&kv, "node-1", "10.192.1.0/24").await;
    });
    let grant_revision = runtime
        .block_on(
            kv.get(
                keys()
                    .grant(
                        &corral_cluster::PoolName::new("default").unwrap(),
                        corral_cluster::Family::V4,
                        &"10.192.1.0/24".parse().unwrap(),
                    )
                    .as_bytes(),
            ),
        )
        .unwrap()
        .unwrap()
        .create_revision;
    let agent = start_with_epoch(
        &runtime,
        &kv,
        dir.path(),
        "node-1",
        "uid-1",
        Duration::from_secs(3),
        Some(epoch),
    );
    // Not taken up, and asserted as refused for the leader to revoke.
    wait_until("the grant is refused", Duration::from_secs(10), || {
        holdings(&runtime, &kv, "node-1").is_some_and(|h| {
            h.refused.len() == 1
                && h.refused[0].cidr.to_string() == "10.192.1.0/24"
                && h.refused[0].grant_revision == grant_revision
        })
    });
    assert!(agent.cluster_status().registered);
    assert_eq!(cluster_ranges(&agent), []);
    assert!(
        allocate(&agent, "pod-1").is_err(),
        "nothing is served from it"
    );
    // The leader revokes it and grants anew: a grant made now is taken up.
    runtime.block_on(revoke_grant(&kv, "node-1", "10.192.1.0/24"));
    runtime.block_on(grant(&kv, "node-1", "10.192.2.0/24"));
    wait_until("the new grant is served", Duration::from_secs(10), || {
        cluster_ranges(&agent) == [("10.192.2.0/24".to_owned(), false)]
    });
    allocate(&agent, "pod-1").unwrap();
    wait_until("nothing refused any more", Duration::from_secs(10), || {
        holdings(&runtime, &kv, "node-1")
            .is_some_and(|h| h.refused.is_empty() && h.ranges.len() == 1)
    });
    agent.stop(&runtime);
}

/// An agent that was away while its node was granted space cannot tell a grant made meanwhile
/// from one a restored snapshot handed back after that space went to another node (its own
/// memory of etcd's time is older than both). Once a leader saw etcd go back in time and put
/// `reassert`, a grant made before it is refused unless the host holds its space; one the
/// host holds (taken up before a restart) is served still, and one made after is taken up.
#[test]
fn a_grant_made_before_a_reassert_that_the_node_never_took_up_is_refused() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir_1 = tempfile::tempdir().unwrap();
    let dir_2 = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        for (node, cidr) in [("node-1", "10.192.1.0/24"), ("node-2", "10.192.2.0/24")] {
            let uid = format!("uid-{}", &node[5..]);
            register_record(&kv, &NodeName::new(node).unwrap(), &uid).await;
            grant(&kv, node, cidr).await;
        }
    });
    let ttl = Duration::from_secs(3);
    // Before any reassert, a grant made while the agent was away is taken up.
    let first = start_node_1(&runtime, &kv, dir_1.path(), ttl);
    wait_until("node-1 serves its grant", Duration::from_secs(10), || {
        cluster_ranges(&first) == [("10.192.1.0/24".to_owned(), false)]
    });
    allocate(&first, "pod-1").unwrap();
    first.stop(&runtime);
    // A leader saw etcd go back in time.
    let reassert = corral_cluster::ReassertRecord {
        requested_ms: 1,
        replica: "op-a".into(),
        reason: "etcd went back in time".into(),
    };
    runtime.block_on(async {
        kv.txn(Txn {
            compares: vec![],
            success: vec![TxnOp::put(
                keys().reassert(),
                encode_value(&reassert).unwrap(),
            )],
            failure: vec![],
        })
        .await
        .unwrap();
    });
    // node-2 never took its grant up: refused, asserted as refused, nothing served.
    let second = start(&runtime, &kv, dir_2.path(), "node-2", "uid-2", ttl);
    wait_until("node-2's grant is refused", Duration::from_secs(10), || {
        holdings(&runtime, &kv, "node-2").is_some_and(|h| {
            h.refused.len() == 1 && h.refused[0].cidr.to_string() == "10.192.2.0/24"
        })
    });
    assert_eq!(cluster_ranges(&second), []);
    assert!(allocate(&second, "pod-2").is_err(), "nothing is served");
    // node-1's host holds its space: served again after a restart, nothing refused.
    let first = start_node_1(&runtime, &kv, dir_1.path(), ttl);
    wait_until(
        "node-1 serves its grant again",
        Duration::from_secs(10),
        || {
            holdings(&runtime, &kv, "node-1")
                .is_some_and(|h| h.refused.is_empty() && h.ranges.len() == 1)
                && cluster_ranges(&first) == [("10.192.1.0/24".to_owned(), false)]
        },
    );
    // The leader revokes node-2's grant and grants anew: taken up.
    runtime.block_on(revoke_grant(&kv, "node-2", "10.192.2.0/24"));
    runtime.block_on(grant(&kv, "node-2", "10.192.3.0/24"));
    wait_until(
        "node-2's new grant is served",
        Duration::from_secs(10),
        || cluster_ranges(&second) == [("10.192.3.0/24".to_owned(), false)],
    );
    allocate(&second, "pod-2").unwrap();
    second.stop(&runtime);
    first.stop(&runtime);
}

/// A node's pod cap (`--max-pods`, as the kubelet's) is written into its registration, and a
/// restart with another cap brings the record up to date, the registration (its create
/// revision, which every grant is fenced on) kept.
#[test]
fn the_nodes_max_pods_is_in_its_registration_and_follows_a_restart() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    let registration = |kv: &MemKv| {
        runtime
            .block_on(kv.get(keys().node(&NodeName::new("node-1").unwrap()).as_bytes()))
            .unwrap()
            .map(|e| {
                let record: NodeRecord = corral_cluster::decode_value(&e.value).unwrap();
                (record.max_pods, e.create_revision)
            })
    };
    let ttl = Duration::from_secs(3);
    let agent = start_with(&runtime, &kv, dir.path(), "node-1", "uid-1", ttl, |o| {
        o.max_pods = Some(110)
    });
    wait_until("registered with its cap", Duration::from_secs(10), || {
        registration(&kv).is_some_and(|(max, _)| max == Some(110))
    });
    let (_, created) = registration(&kv).unwrap();
    agent.stop(&runtime);
    let agent = start_with(&runtime, &kv, dir.path(), "node-1", "uid-1", ttl, |o| {
        o.max_pods = Some(58)
    });
    wait_until("the record follows", Duration::from_secs(10), || {
        registration(&kv) == Some((Some(58), created))
    });
    wait_until("serving under it", Duration::from_secs(10), || {
        agent.cluster_status().registered
    });
    agent.stop(&runtime);
    // Without a cap, the record's goes.
    let agent = start_node_1(&runtime, &kv, dir.path(), ttl);
    wait_until("no cap", Duration::from_secs(10), || {
        registration(&kv) == Some((None, created))
    });
    agent.stop(&runtime);
}

/// Grants `node` node ID `id` as the leader does (`nodeids/id/<id>` and `nodeids/node/<node>`,
/// one transaction), replacing any ID it had.
async fn grant_node_id(kv: &MemKv, node: &str, id: u32) {
    let keys = keys();
    let name = NodeName::new(node).unwrap();
    let record = corral_cluster::NodeIdRecord {
        node: name.clone(),
        uid: "uid-1".into(),
        node_revision: 0,
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![
            TxnOp::put(keys.node_id(id), encode_value(&record).unwrap()),
            TxnOp::put(
                keys.node_id_of_node(&name),
                encode_value(&corral_cluster::NodeIdOfNodeRecord { id }).unwrap(),
            ),
        ],
        failure: vec![],
    })
    .await
    .unwrap();
}

/// Puts the node-ID plan, starts node-1's agent in `dir`, grants it node ID `id` and waits
/// until its pod range (`10.1.<id>.0/24`) serves.
fn serving_node_id(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    dir: &Path,
    id: u32,
) -> LinkedAgent {
    runtime.block_on(common::put_config(kv, PLAN));
    let agent = start_node_1(runtime, kv, dir, Duration::from_secs(3)).wait_registered();
    runtime.block_on(grant_node_id(kv, "node-1", id));
    wait_until(
        "the node ID's pod range serves",
        Duration::from_secs(10),
        || cluster_ranges(&agent) == [(format!("10.1.{id}.0/24"), false)],
    );
    agent
}

/// The node IDs node-1's `holdings/` record asserts.
fn asserted_ids(runtime: &tokio::runtime::Runtime, kv: &MemKv) -> Vec<u32> {
    holdings(runtime, kv, "node-1").map_or_else(Vec::new, |r| r.node_ids().collect())
}

/// Every version of node-1's `holdings/` record written after `after`, oldest first.
fn holdings_since(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    after: i64,
) -> Vec<corral_cluster::HoldingsRecord> {
    let key = keys().holdings(&NodeName::new("node-1").unwrap());
    runtime.block_on(async {
        let head = kv
            .range(key.as_bytes(), None, 1, None)
            .await
            .unwrap()
            .revision;
        let mut seen = Vec::new();
        let mut last = 0;
        for revision in after + 1..=head {
            let page = kv
                .range(key.as_bytes(), None, 1, Some(revision))
                .await
                .unwrap();
            if let Some(entry) = page.kvs.into_iter().find(|e| e.key == key.as_bytes())
                && entry.mod_revision > after
                && entry.mod_revision != last
            {
                last = entry.mod_revision;
                seen.push(corral_cluster::decode_value(&entry.value).unwrap());
            }
        }
        seen
    })
}

/// The node-ID plan (pod subnet 10.1.0.0/16, a /24 a node) and nothing else.
const PLAN: &str = corral_cluster::testing::NODE_IDS_TOML;

/// Review (2026-12-01): a node whose node ID changed (here a restore lost its grant and the
/// leader granted another) serves the new ID's pod range and drains the old one's while pods
/// still use it. The agent asserted only the highest ID, so the leader took a lower one as
/// given up and could grant it to another node under the pods still using it.
#[test]
fn an_agent_asserts_the_old_node_id_while_pods_still_use_its_pod_range() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = serving_node_id(&runtime, &kv, dir.path(), 2);
    let pod = allocate(&agent, "pod-1").unwrap();
    assert!(common::within("10.1.2.0/24", pod));
    wait_until("ID 2 asserted", Duration::from_secs(10), || {
        asserted_ids(&runtime, &kv) == [2]
    });
    // etcd forgets ID 2 (restored); the leader grants the node ID 5 around the held 2.
    runtime.block_on(async {
        kv.txn(Txn {
            compares: vec![],
            success: vec![TxnOp::delete(keys().node_id(2))],
            failure: vec![],
        })
        .await
        .unwrap();
        grant_node_id(&kv, "node-1", 5).await;
    });
    wait_until("ID 5 serves, ID 2 drains", Duration::from_secs(10), || {
        let mut ranges = cluster_ranges(&agent);
        ranges.sort();
        ranges
            == [
                ("10.1.2.0/24".to_owned(), true),
                ("10.1.5.0/24".to_owned(), false),
            ]
    });
    wait_until("both IDs asserted", Duration::from_secs(10), || {
        asserted_ids(&runtime, &kv) == [5, 2]
    });
    // The last pod of ID 2 goes: its pod range drains away, and with it the assertion.
    agent
        .client()
        .release(&corral_api::ReleaseRequest {
            scope: "node".into(),
            owner: Some("pod-1".into()),
            ..corral_api::ReleaseRequest::default()
        })
        .unwrap();
    wait_until("ID 2 given up", Duration::from_secs(15), || {
        asserted_ids(&runtime, &kv) == [5]
    });
    agent.stop(&runtime);
}

/// Review (2026-12-01): a restarted agent's holdings publisher wrote before the link had read
/// the cluster configuration, so its first record read the plan's pod range as a plain range
/// and named no node ID; after a restore that record counted as the node's reassertion, and
/// the ID could be granted around it. The publisher now reads the configuration from etcd
/// when the link has not yet: every record names the ID.
#[test]
fn a_restarted_agents_first_assertion_names_its_node_id() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = serving_node_id(&runtime, &kv, dir.path(), 3);
    allocate(&agent, "pod-1").unwrap();
    wait_until("ID 3 asserted", Duration::from_secs(10), || {
        asserted_ids(&runtime, &kv) == [3]
    });
    agent.stop(&runtime);
    // etcd restored from before the node registered: its registration, ID and record gone;
    // and the agent was killed, so its liveness key stays until its lease runs out (the
    // restarted link waits for it, the publisher does not).
    let node = NodeName::new("node-1").unwrap();
    let before = runtime.block_on(async {
        let lease = kv.lease_grant(Duration::from_secs(2)).await.unwrap();
        let killed = corral_cluster::LiveRecord {
            pid: 4242,
            ..Default::default()
        };
        kv.txn(Txn {
            compares: vec![],
            success: vec![
                TxnOp::delete(keys().node(&node)),
                TxnOp::delete(keys().node_id(3)),
                TxnOp::delete(keys().node_id_of_node(&node)),
                TxnOp::delete(keys().holdings(&node)),
                TxnOp::put_on_lease(keys().live(&node), encode_value(&killed).unwrap(), lease),
            ],
            failure: vec![],
        })
        .await
        .unwrap()
        .revision
    });
    let agent = start_node_1(&runtime, &kv, dir.path(), Duration::from_secs(3)).wait_registered();
    wait_until("asserted again", Duration::from_secs(10), || {
        !holdings_since(&runtime, &kv, before).is_empty()
    });
    for record in holdings_since(&runtime, &kv, before) {
        assert_eq!(
            record.node_ids().collect::<Vec<_>>(),
            [3],
            "every record names the node ID it serves: {record:?}"
        );
        assert!(record.ranges.is_empty(), "{record:?}");
    }
    agent.stop(&runtime);
}

/// Review (2026-12-01): a record someone else keeps overwriting (a second process under the
/// node's name, a script) is put back at most once a second, not at etcd's speed; once the
/// other writer stops, the node's own record is back.
#[tokio::test(start_paused = true)]
async fn a_record_someone_keeps_overwriting_is_put_back_at_most_once_a_second() {
    let kv = MemKv::new();
    let agent = start_paused(&kv, Duration::from_secs(3)).await;
    let key = keys().holdings(&NodeName::new("node-1").unwrap());
    let ours = async || {
        kv.get(key.as_bytes())
            .await
            .unwrap()
            .and_then(|e| {
                corral_cluster::decode_value::<corral_cluster::HoldingsRecord>(&e.value).ok()
            })
            .is_some_and(|r| r.uid == "uid-1")
    };
    wait_for("asserted", Duration::from_secs(10), ours).await;
    let start = kv.range(b"-", None, 1, None).await.unwrap().revision;
    let foreign = encode_value(&corral_cluster::HoldingsRecord {
        uid: "someone-else".into(),
        ..Default::default()
    })
    .unwrap();
    // Overwritten every 10 ms for 3 s.
    for _ in 0..300 {
        common::put(&kv, key.clone(), foreign.clone()).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let head = kv.range(b"-", None, 1, None).await.unwrap().revision;
    let mut put_back = 0;
    let mut last = 0;
    for revision in start + 1..=head {
        let page = kv
            .range(key.as_bytes(), None, 1, Some(revision))
            .await
            .unwrap();
        if let Some(entry) = page.kvs.into_iter().find(|e| e.key == key.as_bytes())
            && entry.mod_revision != last
        {
            last = entry.mod_revision;
            let record: corral_cluster::HoldingsRecord =
                corral_cluster::decode_value(&entry.value).unwrap();
            if record.uid == "uid-1" {
                put_back += 1;
            }
        }
    }
    assert!(
        (1..=4).contains(&put_back),
        "put back {put_back} times in 3 s"
    );
    wait_for(
        "put back once the other stops",
        Duration::from_secs(5),
        ours,
    )
    .await;
    agent.stop().await;
}

/// Review (2026-12-01): a machine that registers a node's free name (the node was removed while
/// its agent, on another machine, runs and drains: that agent keeps the liveness key) waits
/// for the key, and writes no holdings record meanwhile. Its record (empty, its own uid) once
/// replaced the live agent's, which then stopped asserting; the leader took the ranges that
/// agent still serves pods from for given up.
#[tokio::test(start_paused = true)]
async fn an_agent_waiting_for_another_machines_liveness_key_writes_no_holdings() {
    let kv = MemKv::new();
    let name = NodeName::new("node-1").unwrap();
    // The node's agent elsewhere: its liveness key on a lease, and its record.
    let lease = kv.lease_grant(Duration::from_secs(600)).await.unwrap();
    let elsewhere = corral_cluster::LiveRecord {
        pid: 4242,
        host: "elsewhere".into(),
        boot_id: "another-boot".into(),
        pid_namespace: "another-namespace".into(),
        process_start: 7,
        ttl_ms: 600_000,
        ..Default::default()
    };
    let record = corral_cluster::HoldingsRecord {
        uid: "uid-elsewhere".into(),
        ranges: vec![corral_cluster::HeldRange {
            pool: corral_cluster::PoolName::new("default").unwrap(),
            cidr: "10.192.1.0/24".parse().unwrap(),
            draining: true,
            allocations: 1,
        }],
        ..Default::default()
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![
            TxnOp::put_on_lease(keys().live(&name), encode_value(&elsewhere).unwrap(), lease),
            TxnOp::put(keys().holdings(&name), encode_value(&record).unwrap()),
        ],
        failure: vec![],
    })
    .await
    .unwrap();
    // This machine starts under the name: it registers (the name is free), then waits for
    // the key (another machine's holder is waited for up to 1.5 times its TTL).
    let agent = MemAgent::spawn(
        &kv,
        &MemoryStore::new(),
        common::paused::config(),
        common::options("node-1", "uid-1", Duration::from_secs(3)),
    );
    wait_for(
        "registered under uid-1",
        Duration::from_secs(10),
        async || {
            kv.get(keys().node(&name).as_bytes())
                .await
                .unwrap()
                .and_then(|e| corral_cluster::decode_value::<NodeRecord>(&e.value).ok())
                .is_some_and(|r| r.uid == "uid-1")
        },
    )
    .await;
    // Several of the publisher's looks later, the record is still the live agent's.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let now: corral_cluster::HoldingsRecord = corral_cluster::decode_value(
        &kv.get(keys().holdings(&name).as_bytes())
            .await
            .unwrap()
            .unwrap()
            .value,
    )
    .unwrap();
    assert_eq!(now.uid, "uid-elsewhere", "{now:?}");
    agent.stop().await;
}
