//! Cloud pools on the agent's side, on `MemKv` with a real agent in-process (`tests/common`), the
//! test playing the operator by writing `interfaces/` and `release/` records: records become
//! interfaces served with the right device number, MAC, gateway and routes; an attaching record is
//! not served; the release handshake per address (a free one surrendered and answered `ready`, a
//! used one `refused`, never both; a withdrawn one taken back; the marker forgotten once the record
//! drops the address); an address dropped from its record while in use stays frozen and is
//! reported; a restart keeps everything and answers a `marked` key again; an ADD waits for a
//! record; garbage records change nothing; the instance ID in the registration; and under pod
//! churn, no surrendered address is ever handed out.
//!
//! Paused clock (`tests/common/paused.rs`: the agent over a `MemoryStore`, in-process), so
//! the pool waits, the demand's spacing and the link's rechecks run in virtual time; the two
//! tests that restart the agent on its state directory run on a real agent (SQLite, socket) in
//! real time.

use std::path::Path;
use std::time::Duration;

use corral_agent::AgentConfig;
use corral_agent::link::ClusterOptions;
use corral_api::{CniAddRequest, CniKeyRequest, ErrorCode};
use corral_client::Client;
use corral_cluster::{
    CloudAttachment, CloudId, CloudInterfaceRecord, DemandRecord, NodeName, NodeRecord, PoolName,
    ReleaseRecord, ReleaseState, decode_value, encode_value,
};
use corral_kv::{Kv, MemKv, Txn, TxnOp};
use corral_store::MemoryStore;
use tempfile::TempDir;

const NODE: &str = "node-1";
const POOL: &str = "vpc";

const CONFIG: &str = include_str!("configs/cloud.toml");

/// The three single addresses of `eni-a` most tests put in its record.
const ENI_A: [&str; 3] = ["10.0.1.10/32", "10.0.1.11/32", "10.0.1.12/32"];
use crate::common;

use common::paused::{Api, MemAgent, wait_for};
use common::{LinkedAgent as Agent, key, keys, network, put, runtime, wait_until};

fn node() -> NodeName {
    common::node_name(NODE)
}

/// The options of the agent of `instance_id`.
fn options(instance_id: Option<&str>) -> ClusterOptions {
    ClusterOptions {
        demand_refresh: Duration::from_secs(1),
        instance_id: instance_id.map(str::to_owned),
        ..common::options(NODE, "uid-1", Duration::from_secs(600))
    }
}

/// A real agent (SQLite, socket) of instance `i-1`, registered.
fn start(runtime: &tokio::runtime::Runtime, kv: &MemKv, dir: &Path, pool_wait: Duration) -> Agent {
    start_as(runtime, kv, dir, pool_wait, Some("i-1")).wait_registered()
}

/// A real agent of `instance_id`, ready (registered or not).
fn start_as(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    dir: &Path,
    pool_wait: Duration,
    instance_id: Option<&str>,
) -> Agent {
    let config = AgentConfig {
        pool_wait,
        ..common::config(dir)
    };
    Agent::start(runtime, kv, config, options(instance_id))
}

/// A `MemKv` holding the configuration and a real agent on it (SQLite in `dir`, real time,
/// `pool_wait`).
fn configured_real(pool_wait: Duration) -> (tokio::runtime::Runtime, MemKv, TempDir, Agent) {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start(&runtime, &kv, dir.path(), pool_wait);
    (runtime, kv, dir, agent)
}

/// A `MemKv` holding the configuration and an agent on it on the paused clock (`pool_wait`),
/// with its API.
async fn configured_paused(pool_wait: Duration) -> (MemKv, MemAgent, Api) {
    let kv = MemKv::new();
    put_config(&kv).await;
    let agent = start_paused(&kv, pool_wait).await;
    let api = agent.api();
    (kv, agent, api)
}

/// An in-memory agent of instance `i-1` on the paused clock, registered.
async fn start_paused(kv: &MemKv, pool_wait: Duration) -> MemAgent {
    let config = AgentConfig {
        pool_wait,
        ..common::paused::config()
    };
    MemAgent::start(kv, &MemoryStore::new(), config, options(Some("i-1")))
        .await
        .wait_registered()
        .await
}

/// The addresses of interface `id` on the node (empty if it is not there).
fn addresses_of(interfaces: Option<corral_api::InterfacesResponse>, id: &str) -> Vec<String> {
    interfaces
        .map(|r| {
            r.pools
                .iter()
                .flat_map(|p| &p.interfaces)
                .filter(|i| i.id == id)
                .flat_map(|i| i.addresses.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// [`addresses_of`] a real agent.
fn addresses_on(agent: &Agent, id: &str) -> Vec<String> {
    addresses_of(agent.client().interfaces(None).ok(), id)
}

/// [`addresses_of`] an in-memory agent.
async fn addresses(api: &Api, id: &str) -> Vec<String> {
    addresses_of(api.interfaces().await.ok(), id)
}

async fn put_config(kv: &MemKv) {
    common::put_config(kv, CONFIG).await;
}

fn record(device: u32, subnet: &str, addresses: &[&str]) -> CloudInterfaceRecord {
    CloudInterfaceRecord {
        pool: PoolName::new(POOL).unwrap(),
        instance_id: "i-1".into(),
        device_index: device,
        subnet_id: format!("subnet-{device}"),
        subnets: vec![subnet.parse().unwrap()],
        mac: format!("02:00:00:00:00:{device:02x}"),
        primary_ipv4: None,
        addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        assigned_ms: Default::default(),
        attachment: CloudAttachment::Attached,
        managed: true,
        prefixes_refused_ms: None,
    }
}

fn if_key(id: &str) -> String {
    keys().cloud_interface(&node(), &CloudId::new(id).unwrap())
}

/// Writes `interfaces/<node>/<id>` as the leader does; answers the key's create revision.
async fn write_record(kv: &MemKv, id: &str, record: &CloudInterfaceRecord) -> i64 {
    put(kv, if_key(id), encode_value(record).unwrap()).await;
    kv.get(if_key(id).as_bytes())
        .await
        .unwrap()
        .unwrap()
        .create_revision
}

fn release_key(cidr: &str) -> String {
    common::release_key(NODE, POOL, cidr)
}

/// The leader withdraws its mark of `cidr` (deletes the release key).
async fn withdraw(kv: &MemKv, cidr: &str) {
    let key = release_key(cidr);
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::delete(key)],
        failure: vec![],
    })
    .await
    .unwrap();
}

/// The leader's step 1: `marked`, naming the `interfaces/` key's create revision.
async fn mark(kv: &MemKv, cidr: &str, grant_revision: i64) {
    common::mark(kv, NODE, POOL, cidr, grant_revision).await;
}

async fn release_record(kv: &MemKv, cidr: &str) -> Option<ReleaseRecord> {
    common::release_record(kv, NODE, POOL, cidr).await
}

/// The agent's answer to the mark of `cidr`, once it is there (virtual time).
async fn answered(kv: &MemKv, cidr: &str) -> ReleaseRecord {
    let mut answer = None;
    wait_for("the agent's answer", Duration::from_secs(10), async || {
        answer = release_record(kv, cidr)
            .await
            .filter(|r| r.state != ReleaseState::Marked);
        answer.is_some()
    })
    .await;
    answer.unwrap()
}

/// [`answered`], on real time.
fn answered_real(runtime: &tokio::runtime::Runtime, kv: &MemKv, cidr: &str) -> ReleaseRecord {
    let mut answer = None;
    wait_until("the agent's answer", Duration::from_secs(10), || {
        answer = runtime
            .block_on(release_record(kv, cidr))
            .filter(|r| r.state != ReleaseState::Marked);
        answer.is_some()
    });
    answer.unwrap()
}

/// The leader completes the releases of `released` on `eni-a`: its record becomes `kept` and
/// their keys go, in one txn.
async fn complete(kv: &MemKv, kept: &CloudInterfaceRecord, released: &[&str]) {
    let mut success = vec![TxnOp::put(if_key("eni-a"), encode_value(kept).unwrap())];
    success.extend(released.iter().map(|cidr| TxnOp::delete(release_key(cidr))));
    kv.txn(Txn {
        compares: vec![],
        success,
        failure: vec![],
    })
    .await
    .unwrap();
}

/// Waits until the node scope's pools exclude nothing (the surrender markers forgotten).
fn wait_markers_forgotten(agent: &Agent) {
    wait_until("the markers forgotten", Duration::from_secs(10), || {
        agent
            .client()
            .pools(Some("node"))
            .unwrap()
            .pools
            .iter()
            .flat_map(|p| &p.exclusions)
            .next()
            .is_none()
    });
}

async fn demand(kv: &MemKv) -> Option<DemandRecord> {
    common::demand(kv, NODE, POOL).await
}

fn add_request(i: usize) -> CniAddRequest {
    CniAddRequest {
        network: network(Some(POOL), None),
        key: key(i),
        owner: format!("pod-{i}"),
        sets: vec![],
    }
}

fn del_request(i: usize) -> CniKeyRequest {
    CniKeyRequest {
        network: network(Some(POOL), None),
        key: key(i),
    }
}

/// A CNI ADD to a real agent.
fn add_by(client: &mut Client, i: usize) -> Result<corral_api::Allocated, corral_client::Error> {
    let added = client.cni_add(&add_request(i))?;
    Ok(added.allocations[0].clone())
}

/// A CNI ADD to an in-memory agent.
async fn add(api: &Api, i: usize) -> Result<corral_api::Allocated, corral_client::Error> {
    let added = api.cni_add(&add_request(i)).await?;
    Ok(added.allocations[0].clone())
}

async fn del(api: &Api, i: usize) {
    api.cni_del(&del_request(i)).await.unwrap();
}

fn assert_retry_later(result: Result<corral_api::Allocated, corral_client::Error>) {
    match result {
        Err(corral_client::Error::Api { error, .. }) => {
            assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
            assert_eq!(error.pool.as_deref(), Some(POOL), "{error:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn records_become_interfaces_served_with_their_device_mac_gateway_and_routes() {
    let (kv, agent, api) = configured_paused(Duration::from_millis(500)).await;
    // The registration carries the instance ID.
    let registered: NodeRecord = kv
        .get(keys().node(&node()).as_bytes())
        .await
        .unwrap()
        .map(|e| decode_value(&e.value).unwrap())
        .unwrap();
    assert_eq!(registered.instance_id.as_deref(), Some("i-1"));
    assert_eq!(
        agent.cluster_status().await.instance_id.as_deref(),
        Some("i-1")
    );
    write_record(
        &kv,
        "eni-a",
        &record(1, "10.0.1.0/24", &["10.0.1.10/32", "10.0.1.11/32"]),
    )
    .await;
    let mut attaching = record(2, "10.0.2.0/24", &["10.0.2.10/32"]);
    attaching.attachment = CloudAttachment::Attaching;
    write_record(&kv, "eni-b", &attaching).await;
    wait_for("eni-a served", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.len() == 2
    })
    .await;
    let mut got = Vec::new();
    for i in 0..2 {
        let allocated = add(&api, i).await.unwrap();
        let interface = allocated.interface.clone().unwrap();
        assert_eq!(interface.id, "eni-a");
        assert_eq!(interface.device_number, 1);
        assert_eq!(interface.mac, "02:00:00:00:00:01");
        assert_eq!(interface.subnet, "10.0.1.0/24");
        assert_eq!(interface.gateway, Some("10.0.1.1".parse().unwrap()));
        assert_eq!(interface.routes, vec!["10.0.0.0/16".to_owned()]);
        got.push(allocated.address.to_string());
    }
    got.sort();
    assert_eq!(got, ["10.0.1.10", "10.0.1.11"]);
    // eni-b is attaching: not served; the ADD waits and gives up naming the pool.
    assert!(addresses(&api, "eni-b").await.is_empty());
    assert_retry_later(add(&api, 2).await);
    // The demand: 2 used, nothing free, nothing empty.
    wait_for("the demand", Duration::from_secs(5), async || {
        demand(&kv)
            .await
            .is_some_and(|d| d.ipv4.is_some_and(|f| f.used == 2 && f.pending == 0))
    })
    .await;
    let v4 = demand(&kv).await.unwrap().ipv4.unwrap();
    assert_eq!((v4.free, v4.blocks), (0, 2));
    assert!(v4.empty.is_empty());
    // Attached now: served from device 2.
    write_record(&kv, "eni-b", &record(2, "10.0.2.0/24", &["10.0.2.10/32"])).await;
    wait_for("eni-b served", Duration::from_secs(10), async || {
        addresses(&api, "eni-b").await.len() == 1
    })
    .await;
    let allocated = add(&api, 3).await.unwrap();
    assert_eq!(allocated.address.to_string(), "10.0.2.10");
    assert_eq!(allocated.interface.unwrap().device_number, 2);
    // ADD and DEL make no store request: only the demand writes that follow them.
    let before = kv.requests();
    del(&api, 3).await;
    let again = add(&api, 3).await.unwrap();
    assert_eq!(again.address.to_string(), "10.0.2.10");
    assert!(
        kv.requests() - before <= 2,
        "{} requests",
        kv.requests() - before
    );
    let problems = agent.cluster_status().await.problems;
    assert!(problems.is_empty(), "{problems:?}");
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_free_marked_address_is_surrendered_a_used_one_refused_and_a_withdrawn_one_taken_back() {
    let (kv, agent, api) = configured_paused(Duration::from_millis(300)).await;
    let all = ENI_A;
    let revision = write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &all)).await;
    wait_for("eni-a served", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.len() == 3
    })
    .await;
    let used = add(&api, 0).await.unwrap().address.to_string();
    let used_cidr = format!("{used}/32");
    let free: Vec<&str> = all.iter().copied().filter(|a| *a != used_cidr).collect();
    // The demand lists the two free ones, highest first.
    wait_for("the demand", Duration::from_secs(5), async || {
        demand(&kv)
            .await
            .is_some_and(|d| d.ipv4.is_some_and(|f| f.used == 1))
    })
    .await;
    let empty: Vec<String> = demand(&kv)
        .await
        .unwrap()
        .ipv4
        .unwrap()
        .empty
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(empty, [free[1], free[0]]);
    // In use: refused with the reason, nothing changed.
    mark(&kv, &used_cidr, revision).await;
    let answer = answered(&kv, &used_cidr).await;
    assert_eq!(answer.state, ReleaseState::Refused);
    assert!(answer.reason.unwrap().contains("allocation"));
    assert!(addresses(&api, "eni-a").await.contains(&used_cidr));
    // Under another record revision: refused.
    mark(&kv, free[0], revision + 1000).await;
    assert_eq!(answered(&kv, free[0]).await.state, ReleaseState::Refused);
    // Free: surrendered, answered ready, and never handed out again.
    mark(&kv, free[0], revision).await;
    assert_eq!(answered(&kv, free[0]).await.state, ReleaseState::Ready);
    assert!(!addresses(&api, "eni-a").await.contains(&free[0].to_owned()));
    let other = add(&api, 1).await.unwrap().address.to_string();
    assert_eq!(format!("{other}/32"), free[1]);
    assert_retry_later(add(&api, 2).await);
    // Withdrawn (the leader deletes the key while the record still lists it): taken back.
    withdraw(&kv, free[0]).await;
    wait_for("taken back", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.contains(&free[0].to_owned())
    })
    .await;
    let back = add(&api, 2).await.unwrap().address.to_string();
    assert_eq!(format!("{back}/32"), free[0]);
    // Completed: surrendered again, then the leader drops it from the record and deletes the
    // key in one txn; the address is gone and its marker forgotten.
    del(&api, 2).await;
    // (Cooling after the DEL: refused until the cooldown ends.)
    mark(&kv, free[0], revision).await;
    let cooling = answered(&kv, free[0]).await;
    assert_eq!(cooling.state, ReleaseState::Refused);
    assert!(cooling.reason.unwrap().contains("cool"));
    agent.stop().await;
}

/// Restarts the agent on its state directory: the real store (SQLite), real time.
#[test]
fn a_completed_release_forgets_the_address_and_a_restart_answers_ready_again() {
    let (runtime, kv, dir, agent) = configured_real(Duration::from_millis(300));
    let all = ["10.0.1.10/32", "10.0.1.11/32", "10.0.1.32/28"];
    let revision = runtime.block_on(write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &all)));
    wait_until("eni-a served", Duration::from_secs(10), || {
        addresses_on(&agent, "eni-a").len() == 3
    });
    let mut client = agent.client();
    let pod = add_by(&mut client, 0).unwrap().address;
    // A prefix and a single address surrendered.
    runtime.block_on(mark(&kv, "10.0.1.32/28", revision));
    assert_eq!(
        answered_real(&runtime, &kv, "10.0.1.32/28").state,
        ReleaseState::Ready
    );
    let single = if pod.to_string() == "10.0.1.10" {
        "10.0.1.11/32"
    } else {
        "10.0.1.10/32"
    };
    runtime.block_on(mark(&kv, single, revision));
    assert_eq!(
        answered_real(&runtime, &kv, single).state,
        ReleaseState::Ready
    );
    // A restart: the pod's address, the interface and the surrenders are kept; a `marked` key
    // (the `ready` lost) is answered `ready` again, and nothing surrendered comes back.
    agent.stop(&runtime);
    runtime.block_on(mark(&kv, single, revision));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_millis(300));
    assert_eq!(
        answered_real(&runtime, &kv, single).state,
        ReleaseState::Ready
    );
    assert_eq!(addresses_on(&agent, "eni-a"), [format!("{pod}/32")]);
    let mut client = agent.client();
    assert_eq!(
        add_by(&mut client, 0).unwrap().address,
        pod,
        "the same pod keeps its address"
    );
    assert_retry_later(add_by(&mut client, 1));
    // Completed: the leader takes both off the record and deletes their keys in one txn.
    let mut kept = record(1, "10.0.1.0/24", &[]);
    kept.addresses = vec![format!("{pod}/32").parse().unwrap()];
    runtime.block_on(complete(&kv, &kept, &[single, "10.0.1.32/28"]));
    wait_markers_forgotten(&agent);
    // The cloud gives the prefix back to the node later: served again.
    kept.addresses.push("10.0.1.32/28".parse().unwrap());
    runtime.block_on(write_record(&kv, "eni-a", &kept));
    wait_until("the prefix again", Duration::from_secs(10), || {
        addresses_on(&agent, "eni-a").len() == 2
    });
    assert!(add_by(&mut client, 1).is_ok());
    agent.stop(&runtime);
}

#[tokio::test(start_paused = true)]
async fn an_address_dropped_from_its_record_while_in_use_stays_frozen_and_is_reported() {
    let (kv, agent, api) = configured_paused(Duration::from_millis(300)).await;
    write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &ENI_A)).await;
    write_record(&kv, "eni-b", &record(2, "10.0.2.0/24", &["10.0.2.10/32"])).await;
    wait_for("served", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.len() == 3 && addresses(&api, "eni-b").await.len() == 1
    })
    .await;
    let mut pods = Vec::new();
    for i in 0..4 {
        pods.push(add(&api, i).await.unwrap().address.to_string());
    }
    del(&api, 2).await; // one address of eni-a cooling, not in use
    del(&api, 1).await;
    let in_use = pods[0].clone();
    // The operator forces two addresses off eni-a (one in use, one cooling) and deletes eni-b
    // (its address in use).
    let remaining: Vec<&str> = ENI_A
        .into_iter()
        .filter(|a| *a != format!("{in_use}/32") && *a != format!("{}/32", pods[2]))
        .collect();
    write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &remaining)).await;
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::delete(if_key("eni-b"))],
        failure: vec![],
    })
    .await
    .unwrap();
    wait_for("frozen and reported", Duration::from_secs(10), async || {
        let problems = agent.cluster_status().await.problems;
        problems
            .iter()
            .any(|p| p.contains(&in_use) && p.contains("frozen"))
            && problems.iter().any(|p| p.contains("eni-b"))
    })
    .await;
    // Still on the node (the pods keep their addresses), handed out to nobody new.
    assert!(
        addresses(&api, "eni-a")
            .await
            .contains(&format!("{in_use}/32"))
    );
    assert_eq!(addresses(&api, "eni-b").await, ["10.0.2.10/32"]);
    let metrics = api.metrics().await.unwrap();
    assert!(
        metrics.contains("corral_cloud_frozen_addresses 2"),
        "{pods:?} {:?} {:?}",
        agent.cluster_status().await.problems,
        addresses(&api, "eni-a").await
    );
    assert_eq!(
        add(&api, 5).await.unwrap().address.to_string(),
        remaining[0].trim_end_matches("/32")
    );
    assert_retry_later(add(&api, 6).await);
    // The cooling address, with nothing allocated in it, left at once.
    assert!(
        !addresses(&api, "eni-a")
            .await
            .contains(&format!("{}/32", pods[2]))
    );
    // The pods keep their addresses; once the pod on eni-b is gone, eni-b leaves (the
    // recheck while something is frozen), and the pod on eni-a's frozen address stays.
    del(&api, 3).await;
    wait_for("eni-b gone", Duration::from_secs(15), async || {
        api.interfaces()
            .await
            .unwrap()
            .pools
            .iter()
            .flat_map(|p| &p.interfaces)
            .all(|i| i.id != "eni-b")
    })
    .await;
    assert!(
        addresses(&api, "eni-a")
            .await
            .contains(&format!("{in_use}/32"))
    );
    let check = api.cni_check(&del_request(0)).await.unwrap();
    assert_eq!(check.allocations[0].address.to_string(), in_use);
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_add_waits_for_a_record_and_garbage_records_change_nothing() {
    let (kv, agent, api) = configured_paused(Duration::from_secs(8)).await;
    let waiting = tokio::spawn({
        let api = api.clone();
        async move { add(&api, 0).await }
    });
    wait_for(
        "the pending ADD in the demand",
        Duration::from_secs(5),
        async || {
            demand(&kv)
                .await
                .is_some_and(|d| d.ipv4.is_some_and(|f| f.pending == 1))
        },
    )
    .await;
    write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &["10.0.1.10/32"])).await;
    let allocated = waiting.await.unwrap().unwrap();
    assert_eq!(allocated.address.to_string(), "10.0.1.10");
    // Garbage: a value that does not decode, a record for another instance, one with an
    // address outside its subnet, and eni-a overwritten with garbage. Nothing changes.
    put(&kv, if_key("eni-x"), b"{not json".to_vec()).await;
    let mut other = record(3, "10.0.3.0/24", &["10.0.3.10/32"]);
    other.instance_id = "i-9".into();
    write_record(&kv, "eni-y", &other).await;
    write_record(&kv, "eni-z", &record(4, "10.0.4.0/24", &["10.0.5.10/32"])).await;
    put(&kv, if_key("eni-a"), b"garbage".to_vec()).await;
    wait_for("reported", Duration::from_secs(10), async || {
        agent.cluster_status().await.problems.len() == 4
    })
    .await;
    let problems = agent.cluster_status().await.problems;
    assert!(
        problems
            .iter()
            .any(|p| p.contains("eni-y") && p.contains("i-9")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("eni-z") && p.contains("10.0.5.10")),
        "{problems:?}"
    );
    assert_eq!(addresses(&api, "eni-a").await, ["10.0.1.10/32"]);
    for id in ["eni-x", "eni-y", "eni-z"] {
        assert!(addresses(&api, id).await.is_empty());
    }
    let metrics = api.metrics().await.unwrap();
    assert!(metrics.contains("corral_cloud_bad_records 4"), "{metrics}");
    let check = api.cni_check(&del_request(0)).await.unwrap();
    assert_eq!(check.allocations.len(), 1);
    agent.stop().await;
}

/// Restarts the agent on its state directory: the real store (SQLite), real time.
#[test]
fn a_node_registered_with_another_instance_is_refused_naming_both() {
    let (runtime, kv, dir, agent) = configured_real(Duration::from_millis(300));
    agent.stop(&runtime);
    let agent = start_as(
        &runtime,
        &kv,
        dir.path(),
        Duration::from_millis(300),
        Some("i-2"),
    );
    wait_until("refused", Duration::from_secs(10), || {
        agent
            .cluster_status()
            .last_error
            .is_some_and(|e| e.contains("i-1") && e.contains("i-2"))
    });
    assert!(!agent.cluster_status().registered);
    agent.stop(&runtime);
    // Without an instance ID, the same machine is let in (it does not know better).
    let agent =
        start_as(&runtime, &kv, dir.path(), Duration::from_millis(300), None).wait_registered();
    agent.stop(&runtime);
}

/// Marks under pod churn: every `ready` finds the address with no allocation, and no ADD gets
/// it until the handshake is withdrawn; every `refused` leaves it on the interface.
#[tokio::test(start_paused = true)]
async fn under_churn_a_surrendered_address_is_never_also_handed_out() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let (kv, agent, api) = configured_paused(Duration::from_millis(20)).await;
    let all: Vec<String> = (10..18).map(|i| format!("10.0.1.{i}/32")).collect();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let revision = write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &refs)).await;
    wait_for("served", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.len() == 8
    })
    .await;
    // The churn: 6 keys, ADD or DEL at random, one a millisecond (virtual); every ADD answer
    // in the order they came (one runtime thread: an answer is recorded before anything else
    // runs, so the order is exact).
    let answers: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (api, answers, stop) = (api.clone(), Arc::clone(&answers), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut state = 0x2545_f491_4f6c_dd1du64;
            while !stop.load(Ordering::Acquire) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let i = (state % 6) as usize;
                if state.is_multiple_of(3) {
                    del(&api, i).await;
                } else if let Ok(got) = add(&api, i).await {
                    answers.lock().unwrap().push(format!("{}/32", got.address));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let (mut ready, mut refused) = (0, 0);
    for round in 0..24 {
        let address = all[round % all.len()].as_str();
        mark(&kv, address, revision).await;
        let answer = answered(&kv, address).await;
        let seen = answers.lock().unwrap().len();
        match answer.state {
            ReleaseState::Ready => {
                ready += 1;
                let dump = api.dump(Some("node")).await.unwrap();
                let allocated: Vec<String> = dump
                    .scopes
                    .iter()
                    .flat_map(|s| &s.pools)
                    .flat_map(|p| &p.allocations)
                    .map(|a| format!("{}/32", a.address))
                    .collect();
                assert!(
                    !allocated.contains(&address.to_owned()),
                    "{address} ready and allocated"
                );
                assert!(!addresses(&api, "eni-a").await.contains(&address.to_owned()));
                tokio::time::sleep(Duration::from_millis(100)).await;
                let withdrawn = answers.lock().unwrap().len();
                withdraw(&kv, address).await;
                let handed = answers.lock().unwrap()[seen..withdrawn]
                    .iter()
                    .any(|a| a == address);
                assert!(!handed, "{address} handed out while surrendered");
                wait_for("taken back", Duration::from_secs(10), async || {
                    addresses(&api, "eni-a").await.contains(&address.to_owned())
                })
                .await;
            }
            ReleaseState::Refused => {
                refused += 1;
                assert!(addresses(&api, "eni-a").await.contains(&address.to_owned()));
                withdraw(&kv, address).await;
            }
            ReleaseState::Marked => unreachable!(),
        }
    }
    stop.store(true, Ordering::Release);
    churn.await.unwrap();
    assert!(ready > 0 && refused > 0, "ready {ready}, refused {refused}");
    assert!(answers.lock().unwrap().len() > 20);
    agent.stop().await;
}

/// A store outage: the agent says `degraded`, keeps its interfaces and serves from them; once
/// the store is back it reads the records again and follows them.
#[tokio::test(start_paused = true)]
async fn an_outage_keeps_the_interfaces_and_the_records_are_followed_after_it() {
    let (kv, agent, api) = configured_paused(Duration::from_millis(200)).await;
    write_record(
        &kv,
        "eni-a",
        &record(1, "10.0.1.0/24", &["10.0.1.10/32", "10.0.1.11/32"]),
    )
    .await;
    wait_for("served", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.len() == 2
    })
    .await;
    add(&api, 0).await.unwrap();
    kv.set_unavailable(true);
    wait_for("degraded", Duration::from_secs(10), async || {
        agent.cluster_status().await.degraded
    })
    .await;
    assert_eq!(addresses(&api, "eni-a").await.len(), 2);
    add(&api, 1).await.unwrap();
    kv.set_unavailable(false);
    wait_for("back", Duration::from_secs(10), async || {
        !agent.cluster_status().await.degraded
    })
    .await;
    write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &ENI_A)).await;
    wait_for("the new address", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.len() == 3
    })
    .await;
    assert_eq!(add(&api, 2).await.unwrap().address.to_string(), "10.0.1.12");
    agent.stop().await;
}

/// Review (2026-12-01): a removed node takes no new pods, through `/v1/allocate` as through a
/// CNI ADD. Its cloud interfaces stay until the leader takes them away, and the API handed
/// their addresses out still.
#[tokio::test(start_paused = true)]
async fn a_removed_node_allocates_no_cloud_address_through_the_api() {
    let (kv, agent, api) = configured_paused(Duration::from_millis(500)).await;
    write_record(&kv, "eni-a", &record(1, "10.0.1.0/24", &ENI_A)).await;
    wait_for("eni-a served", Duration::from_secs(10), async || {
        addresses(&api, "eni-a").await.len() == 3
    })
    .await;
    let request = corral_api::AllocateRequest {
        scope: "node".into(),
        pool: POOL.into(),
        family: None,
        address: None,
        owner: "pod-before".into(),
        key: None,
        lease_ms: None,
    };
    api.allocate(&request)
        .await
        .expect("served before the removal");
    // Removed (as the leader carries out `corral node remove`).
    let registration = kv
        .get(keys().node(&node()).as_bytes())
        .await
        .unwrap()
        .unwrap()
        .create_revision;
    let removal = corral_cluster::RemovalRecord {
        node_revision: registration,
        requested_ms: 0,
        mode: corral_cluster::RemovalMode::Drain,
        phase: corral_cluster::RemovalPhase::Draining,
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![
            TxnOp::put(keys().removal(&node()), encode_value(&removal).unwrap()),
            TxnOp::delete(keys().node(&node())),
        ],
        failure: vec![],
    })
    .await
    .unwrap();
    wait_for("taken for removed", Duration::from_secs(10), async || {
        agent
            .cluster_status()
            .await
            .last_error
            .is_some_and(|e| e.contains("was removed from the cluster"))
    })
    .await;
    assert_eq!(
        addresses(&api, "eni-a").await.len(),
        3,
        "the interface stays"
    );
    let refused = api
        .allocate(&corral_api::AllocateRequest {
            owner: "pod-after".into(),
            ..request
        })
        .await
        .expect_err("a removed node takes no new pods");
    assert!(
        refused
            .to_string()
            .contains("is being removed from the cluster"),
        "{refused}"
    );
}

/// Review (2026-12-01): etcd restored from a snapshot brings back an interface record listing
/// an address the node gave up since (surrendered, taken off its record, the marker
/// forgotten), which the cloud may have given to another node meanwhile. The agent, which
/// sees etcd go back in time, serves from such a record only what it holds; the address waits
/// for a record written after the restore.
#[test]
fn a_restored_record_serves_only_what_the_node_holds() {
    let (runtime, kv, dir, agent) = configured_real(Duration::from_millis(300));
    let epoch = dir.path().join("etcd-epoch");
    let revision = runtime.block_on(write_record(
        &kv,
        "eni-a",
        &record(1, "10.0.1.0/24", &ENI_A),
    ));
    wait_until("eni-a served", Duration::from_secs(10), || {
        addresses_on(&agent, "eni-a").len() == 3
    });
    // 10.0.1.12 is given back: surrendered, taken off the record, its key deleted.
    let given_up = "10.0.1.12/32";
    runtime.block_on(mark(&kv, given_up, revision));
    assert_eq!(
        answered_real(&runtime, &kv, given_up).state,
        ReleaseState::Ready
    );
    let kept = record(1, "10.0.1.0/24", &ENI_A[..2]);
    runtime.block_on(complete(&kv, &kept, &[given_up]));
    wait_markers_forgotten(&agent);
    agent.stop(&runtime);
    // etcd restored: the record lists the address again, and etcd's revision is below what
    // the agent remembers (its epoch file).
    runtime.block_on(write_record(
        &kv,
        "eni-a",
        &record(1, "10.0.1.0/24", &ENI_A),
    ));
    let mut memory = corral_cluster::EpochMemory::default();
    memory.observe(corral_cluster::Epoch {
        cluster_id: MemKv::CLUSTER_ID,
        revision: 1_000_000,
    });
    std::fs::write(&epoch, memory.to_json()).unwrap();
    let config = AgentConfig {
        pool_wait: Duration::from_millis(300),
        ..common::config(dir.path())
    };
    let agent = Agent::start(
        &runtime,
        &kv,
        config,
        ClusterOptions {
            epoch_file: Some(epoch),
            ..options(Some("i-1"))
        },
    )
    .wait_registered();
    wait_until("the held addresses served", Duration::from_secs(10), || {
        addresses_on(&agent, "eni-a").len() == 2
    });
    assert!(!addresses_on(&agent, "eni-a").contains(&given_up.to_owned()));
    let problems = agent.cluster_status().problems;
    assert!(
        problems
            .iter()
            .any(|p| p.contains(given_up) && p.contains("not served until a newer record")),
        "{problems:?}"
    );
    // The leader's record written after the restore lists it: served again.
    runtime.block_on(write_record(
        &kv,
        "eni-a",
        &record(1, "10.0.1.0/24", &ENI_A),
    ));
    wait_until("served again", Duration::from_secs(10), || {
        addresses_on(&agent, "eni-a").len() == 3
    });
    agent.stop(&runtime);
}
