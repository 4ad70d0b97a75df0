//! Cloud records stay disjoint across a failover, with real processes: etcd on 127.0.0.1, two
//! `corral operator --cloud fake --fake-cloud FILE` replicas and `corral agent --instance-id`s.
//! The leader makes node-a's interface and addresses, is SIGKILLed, and the standby makes
//! node-b's: never the same interface or address recorded for both nodes (issue 20: each
//! replica used to build its own fake cloud from the seed, so the standby's cloud handed out
//! node-a's interface ID and addresses again), `corral cluster check --cloud fake` holds, and no
//! pod address is on two agents or outside its own node's records.
//!
//! Needs Debian's etcd (`make deps`); ignored by a plain `cargo test`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_client::Client;
use corral_cluster::{CloudInterfaceRecord, decode_value};
use corral_etcd::testing::EtcdCluster;
use ipnet::IpNet;

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::{Agent, pod_add_at};

const CLOUD: &str = include_str!("configs/cloud.toml");

const FAKE_CLOUD: &str = r#"{
  "seed": 11,
  "subnets": [{"id": "subnet-a", "vpc": "vpc-1", "zone": "us-east-1a", "ipv4": "10.0.0.0/18"}],
  "instances": [{"id": "i-0a", "type": "m5.large", "subnet": "subnet-a"},
                {"id": "i-0b", "type": "m5.large", "subnet": "subnet-a"}]
}"#;

/// Waits (60 s at most) until `node`'s interface is recorded with two addresses or more.
fn wait_recorded(etcd: &EtcdCluster, node: &str) {
    wait_until(
        &format!("{node}'s interface is recorded with its addresses"),
        Duration::from_secs(60),
        || addresses_of(&records(etcd), node) >= 2,
    );
}

/// `corral operator --cloud fake` replica `name`.
fn operator(etcd: &EtcdCluster, dir: &Path, seed: &Path, name: &str) -> Operator {
    Operator::start_fake_cloud(etcd, dir, name, seed)
}

fn agent(etcd: &EtcdCluster, dir: &Path, node: &str, instance: &str) -> Agent {
    start_agent_with(
        etcd,
        dir,
        node,
        &["--instance-id", instance, "--pool-wait", "2000"],
    )
}

/// Every `interfaces/` record: (node, interface ID, record).
fn records(etcd: &EtcdCluster) -> Vec<(String, String, CloudInterfaceRecord)> {
    let kv = kv(etcd);
    let prefix = "/corral/t/v1/interfaces/";
    let (keys, _) = block_on(corral_kv::read_all(&kv, prefix.as_bytes(), 1000)).unwrap();
    keys.into_iter()
        .map(|entry| {
            let key = entry.key_str().into_owned();
            let (node, id) = key[prefix.len()..].split_once('/').unwrap();
            let record: CloudInterfaceRecord = decode_value(&entry.value).unwrap();
            (node.to_owned(), id.to_owned(), record)
        })
        .collect()
}

/// No interface, and no address or prefix, recorded for two nodes (or twice for one).
fn disjointness_problems(records: &[(String, String, CloudInterfaceRecord)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut interfaces: BTreeMap<&str, &str> = BTreeMap::new();
    let mut nets: Vec<(IpNet, &str, &str)> = Vec::new();
    for (node, id, record) in records {
        if let Some(other) = interfaces.insert(id, node) {
            problems.push(format!(
                "interface {id} is recorded for {other} and for {node}"
            ));
        }
        for net in &record.addresses {
            for (seen, other_node, other_id) in &nets {
                if seen.contains(&net.network()) || net.contains(&seen.network()) {
                    problems.push(format!(
                        "{net} of {node}'s {id} overlaps {seen} of {other_node}'s {other_id}"
                    ));
                }
            }
            nets.push((*net, node, id));
        }
    }
    problems
}

/// The node's recorded addresses (for waiting on them).
fn addresses_of(records: &[(String, String, CloudInterfaceRecord)], node: &str) -> usize {
    records
        .iter()
        .filter(|(n, ..)| n == node)
        .map(|(_, _, r)| r.addresses.len())
        .sum()
}

/// A CNI ADD on the cloud pool, retried until the interface is attached and served.
fn add(socket: &Path, container: &str) -> IpAddr {
    let mut address = None;
    wait_until(
        &format!("ADD {container} is answered"),
        Duration::from_secs(60),
        || {
            address = try_add(socket, container).ok();
            address.is_some()
        },
    );
    address.unwrap()
}

fn try_add(socket: &Path, container: &str) -> Result<IpAddr, corral_client::Error> {
    let response = pod_add_at(socket, "vpc", container)?;
    Ok(response.allocations[0].address)
}

/// The promise, checked apart from `corral cluster check`: no pod address on two agents, each
/// inside a record of its own node, and the records disjoint.
fn assert_invariant(etcd: &EtcdCluster, agents: &[(&str, PathBuf)]) {
    let records = records(etcd);
    let problems = disjointness_problems(&records);
    assert!(problems.is_empty(), "{problems:#?}");
    let mut seen: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for (node, socket) in agents {
        let dump = Client::unix(socket).dump(Some("node")).unwrap();
        for pool in dump.scopes.iter().flat_map(|s| &s.pools) {
            if pool.pool != "vpc" {
                continue;
            }
            for allocation in &pool.allocations {
                let address = allocation.address;
                if let Some(other) = seen.insert(address, node) {
                    panic!("{address} is held by {other} and by {node}");
                }
                assert!(
                    records
                        .iter()
                        .filter(|(n, ..)| n == node)
                        .any(|(_, _, r)| r.addresses.iter().any(|net| net.contains(&address))),
                    "{node} holds {address}, on no record of its own"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_failover_between_fake_cloud_replicas_never_records_an_address_for_two_nodes() {
    let (dir, etcd) = initialized_in_tempdir(1, CLOUD);
    let seed = dir.path().join("cloud.json");
    std::fs::write(&seed, FAKE_CLOUD).unwrap();
    let op_a = operator(&etcd, dir.path(), &seed, "op-a");
    wait_leads(&etcd, "op-a", Duration::from_secs(20));
    let _op_b = operator(&etcd, dir.path(), &seed, "op-b");
    let a_dir = dir.path().join("node-a");
    let _a = agent(&etcd, &a_dir, "node-a", "i-0a");
    wait_recorded(&etcd, "node-a");

    // The leader dies; the standby takes over and serves a node that registers now.
    op_a.signal(rustix::process::Signal::KILL);
    drop(op_a);
    wait_leads(&etcd, "op-b", Duration::from_secs(30));
    let b_dir = dir.path().join("node-b");
    let _b = agent(&etcd, &b_dir, "node-b", "i-0b");
    wait_recorded(&etcd, "node-b");
    let problems = disjointness_problems(&records(&etcd));
    assert!(
        problems.is_empty(),
        "records for two nodes: {problems:#?}\n{:#?}",
        records(&etcd)
    );

    // A pod on each node, from its own interface.
    let sockets = [
        ("node-a", a_dir.join("agent.sock")),
        ("node-b", b_dir.join("agent.sock")),
    ];
    for (node, socket) in &sockets {
        let address = add(socket, &format!("{node}-pod"));
        assert!(matches!(address, IpAddr::V4(_)), "{address}");
    }
    assert_invariant(&etcd, &sockets);
    // The pods made the leader grow the nodes' interfaces: the check's describes lag behind
    // those records for up to 5 s (the fake's consistency lag), so it holds once they settle.
    let agents = [sockets[0].1.as_path(), sockets[1].1.as_path()];
    let mut last = (0, String::new());
    wait_until(
        "corral cluster check --cloud fake holds",
        Duration::from_secs(60),
        || {
            last = check_cloud(&etcd, &seed, &agents);
            last.0 == 0
        },
    );
    assert_eq!(last.0, 0, "corral cluster check --cloud fake:\n{}", last.1);
    assert_invariant(&etcd, &sockets);
}

/// `corral cluster check --cloud fake --fake-cloud SEED` with the agents.
fn check_cloud(etcd: &EtcdCluster, seed: &Path, agents: &[&Path]) -> (i32, String) {
    let seed = seed.display().to_string();
    check_with(etcd, &["--cloud", "fake", "--fake-cloud", &seed], agents)
}

/// The fake cloud's state lives beside its seed (`FILE.state`): a seed file changed under an
/// existing state is refused (usage error, naming the state file and what to do), never
/// silently replaced by a fresh cloud. The cloud is connected before etcd is asked.
#[test]
fn a_fake_cloud_state_of_another_seed_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("cloud.json");
    std::fs::write(&seed, FAKE_CLOUD).unwrap();
    let run = || {
        corral(&[
            "cluster",
            "check",
            "--etcd",
            "http://127.0.0.1:1",
            "--cluster",
            "t",
            "--cloud",
            "fake",
            "--fake-cloud",
            seed.to_str().unwrap(),
        ])
    };
    let (code, _, err) = run();
    assert_eq!(code, 3, "etcd is unreachable, the cloud was fine: {err}");
    let state = dir.path().join("cloud.json.state");
    assert!(state.exists(), "the state is kept beside the seed");
    std::fs::write(&seed, FAKE_CLOUD.replace("\"seed\": 11", "\"seed\": 12")).unwrap();
    let (code, _, err) = run();
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&state.display().to_string()) && err.contains("another seed"),
        "{err}"
    );
}
