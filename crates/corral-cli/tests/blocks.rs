//! Block mode with real processes: etcd started here on 127.0.0.1, `corral operator` replicas
//! and 20 `corral agent`s as child processes under pod churn (CNI ADD and DEL through the
//! agents' API, as corral-ipam sends them), the leader and agents SIGKILLed meanwhile; every
//! test ends with `corral cluster check` against every agent, and with the invariant checked
//! from the agents' own allocations: no address held twice, each inside a block its node holds
//! in etcd.
//!
//! Every test needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corral_client::Client;
use corral_etcd::testing::EtcdCluster;

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::{Agent, pod_add_at, pod_del};

/// /28 IPv4 blocks (14 addresses each) and /124 IPv6 blocks; pre-allocate 4; a 2 s release
/// delay and quarantine, so the handshake runs within the test.
const BLOCKS: &str = include_str!("configs/blocks.toml");

/// A CNI ADD through the agent's API: the attachment's addresses, or the error.
fn add(socket: &Path, container: &str) -> Result<Vec<IpAddr>, corral_client::Error> {
    let response = pod_add_at(socket, "pods", container)?;
    Ok(response.allocations.iter().map(|a| a.address).collect())
}

fn del(socket: &Path, container: &str) -> Result<(), corral_client::Error> {
    pod_del(&mut Client::unix(socket), "pods", container)?;
    Ok(())
}

/// Whether an agent's error is one a runtime retries (CNI 11: no block yet, or the agent not
/// reachable because the test killed it).
fn retryable(error: &corral_client::Error) -> bool {
    match error {
        corral_client::Error::Api { error, .. } => error.code == corral_api::ErrorCode::RetryLater,
        corral_client::Error::Unreachable { .. }
        | corral_client::Error::Io { .. }
        | corral_client::Error::Timeout { .. } => true,
        corral_client::Error::Protocol(_) | corral_client::Error::Status { .. } => false,
    }
}

/// The blocks etcd says each node holds: node → block CIDRs.
fn blocks_by_node(etcd: &EtcdCluster) -> BTreeMap<String, Vec<ipnet::IpNet>> {
    grants(etcd)
        .into_iter()
        .map(|(node, keys)| {
            let cidrs = keys
                .iter()
                .map(|k| {
                    let segment = k.rsplit('/').next().unwrap();
                    corral_cluster::keys::parse_cidr_segment(segment).unwrap()
                })
                .collect();
            (node, cidrs)
        })
        .collect()
}

fn quarantined(etcd: &EtcdCluster) -> usize {
    let kv = kv(etcd);
    let (keys, _) = block_on(corral_kv::read_all(&kv, b"/corral/t/v1/quarantine/", 1000)).unwrap();
    keys.len()
}

/// Every address the agents hold in pool `pods`, checked unique across agents and inside a
/// block its node holds in etcd.
fn assert_invariant(etcd: &EtcdCluster, agents: &[(String, PathBuf)]) {
    let blocks = blocks_by_node(etcd);
    let mut seen: BTreeMap<IpAddr, String> = BTreeMap::new();
    for (node, dir) in agents {
        let dump = Client::unix(dir.join("agent.sock"))
            .dump(Some("node"))
            .unwrap();
        let held = blocks.get(node).cloned().unwrap_or_default();
        for pool in dump.scopes.iter().flat_map(|s| &s.pools) {
            if pool.pool != "pods" {
                continue;
            }
            for allocation in &pool.allocations {
                let address = allocation.address;
                if let Some(other) = seen.insert(address, node.clone()) {
                    panic!("{address} is held by {other} and by {node}");
                }
                assert!(
                    held.iter().any(|b| b.contains(&address)),
                    "{node} holds {address}, outside every block etcd grants it ({held:?})"
                );
            }
        }
    }
}

/// Waits until every node holds its watermarks: for the test's pre-allocate of 4, one block
/// per family at least.
fn wait_for_blocks(etcd: &EtcdCluster, nodes: &[(String, PathBuf)], per_node: usize) {
    wait_until(
        "every node holds its first blocks",
        Duration::from_secs(30),
        || {
            let blocks = blocks_by_node(etcd);
            nodes
                .iter()
                .all(|(node, _)| blocks.get(node).is_some_and(|b| b.len() >= per_node))
        },
    );
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn twenty_agents_under_churn_with_the_leader_and_agents_killed() {
    churn(1, 20);
}

/// The same on three etcd members, one of them SIGKILLed with the agents.
#[test]
#[ignore = "needs etcd (make deps)"]
fn agents_under_churn_on_three_etcd_members_one_killed() {
    churn(3, 8);
}

fn churn(members: usize, agent_count: usize) {
    let (dir, mut etcd) = initialized_in_tempdir(members, BLOCKS);
    let (op_a, op_b) = leader_and_standby(&etcd, dir.path());
    let mut operators = vec![op_a, op_b];
    let nodes: Vec<(String, PathBuf)> = (0..agent_count)
        .map(|i| {
            (
                format!("node-{i:02}"),
                dir.path().join(format!("agent-{i:02}")),
            )
        })
        .collect();
    let mut agents: Vec<Option<Agent>> = nodes
        .iter()
        .map(|(node, path)| Some(start_agent(&etcd, path, node)))
        .collect();
    wait_for_blocks(&etcd, &nodes, 2);

    // Churn: 30 ADDs a second across the nodes, each pod deleted again after a while, for
    // 20 s; the leader SIGKILLed at 5 s, three agents SIGKILLed and restarted at 9 s (and, on
    // three members, one etcd member), the new leader SIGKILLed at 13 s (the first replica
    // restarted before).
    let mut live: Vec<BTreeMap<String, Vec<IpAddr>>> = vec![BTreeMap::new(); nodes.len()];
    let mut next = 0u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let started = Instant::now();
    let (mut adds, mut retried, mut dels) = (0u32, 0u32, 0u32);
    let mut faults = 0;
    while started.elapsed() < Duration::from_secs(20) {
        let tick = Instant::now();
        let at = started.elapsed();
        if faults == 0 && at > Duration::from_secs(5) {
            let leading = leader(&etcd).unwrap();
            let index = operators
                .iter()
                .position(|o| o.log.ends_with(format!("{leading}.log")))
                .unwrap();
            operators[index].signal(rustix::process::Signal::KILL);
            faults = 1;
        }
        if faults == 1 && at > Duration::from_secs(9) {
            if members == 3 {
                etcd.kill(0).unwrap();
            }
            for i in [1, 4, agent_count - 1] {
                agents[i].take().unwrap().kill();
                agents[i] = Some(start_agent(&etcd, &nodes[i].1, &nodes[i].0));
            }
            // The killed replica comes back as a standby.
            operators.retain_mut(|o| o.child.try_wait().unwrap().is_none());
            operators.push(Operator::start(&etcd, dir.path(), "op-c"));
            faults = 2;
        }
        if faults == 2 && at > Duration::from_secs(13) {
            let leading = leader(&etcd).unwrap();
            if let Some(op) = operators
                .iter()
                .find(|o| o.log.ends_with(format!("{leading}.log")))
            {
                op.signal(rustix::process::Signal::KILL);
            }
            faults = 3;
        }
        // Three ADDs and about as many DELs per 100 ms.
        for _ in 0..3 {
            let i = random(nodes.len() as u64) as usize;
            let socket = nodes[i].1.join("agent.sock");
            let container = format!("c{next}");
            next += 1;
            match add(&socket, &container) {
                Ok(addresses) => {
                    assert!(!addresses.is_empty(), "an ADD with no address");
                    live[i].insert(container, addresses);
                    adds += 1;
                }
                Err(error) if retryable(&error) => retried += 1,
                Err(error) => panic!("ADD on {}: {error}", nodes[i].0),
            }
            let j = random(nodes.len() as u64) as usize;
            if live[j].len() > 3 || (!live[j].is_empty() && random(3) == 0) {
                let victim = live[j].keys().next().unwrap().clone();
                let socket = nodes[j].1.join("agent.sock");
                match del(&socket, &victim) {
                    Ok(()) => {
                        live[j].remove(&victim);
                        dels += 1;
                    }
                    Err(error) if retryable(&error) => {}
                    Err(error) => panic!("DEL on {}: {error}", nodes[j].0),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed()));
    }
    eprintln!("churn: {adds} ADDs, {dels} DELs, {retried} retryable refusals");
    assert!(adds > 300, "the churn ran ({adds} ADDs)");
    // Blocks come ahead of the pods (pre-allocate), and an ADD that finds none free waits up
    // to 5 s for one, longer than a failover takes here: refusals are rare at worst.
    assert!(
        retried * 50 <= adds,
        "{retried} ADDs refused of {adds}: blocks did not come ahead of the pods"
    );
    assert_eq!(faults, 3, "every fault was injected");

    // Each pod the test holds is still held by its agent at the address it got.
    for (i, (node, path)) in nodes.iter().enumerate() {
        let dump = Client::unix(path.join("agent.sock"))
            .dump(Some("node"))
            .unwrap();
        let held = addresses(&dump);
        for (container, addresses) in &live[i] {
            for address in addresses {
                assert!(
                    held.contains(address),
                    "{node} lost {address} of {container}"
                );
            }
        }
    }
    assert_invariant(&etcd, &nodes);

    // Releases: every pod of the first five nodes deleted; each gives its excess blocks back
    // through the handshake (release delay 2 s) and keeps one block per family.
    for i in 0..5 {
        let socket = nodes[i].1.join("agent.sock");
        for container in std::mem::take(&mut live[i]).into_keys() {
            del(&socket, &container).unwrap();
        }
    }
    wait_until(
        "the emptied nodes are back to one block per family",
        Duration::from_secs(60),
        || {
            let blocks = blocks_by_node(&etcd);
            nodes[..5]
                .iter()
                .all(|(node, _)| blocks.get(node).is_some_and(|b| b.len() == 2))
        },
    );
    let sockets: Vec<PathBuf> = nodes.iter().map(|(_, p)| p.join("agent.sock")).collect();
    let sockets: Vec<&Path> = sockets.iter().map(PathBuf::as_path).collect();
    wait_until("cluster check is clean", Duration::from_secs(20), || {
        check(&etcd, &sockets).0 == 0
    });
    assert_invariant(&etcd, &nodes);
    drop(agents);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_cold_node_gets_its_first_pod_address_while_the_add_waits() {
    let (dir, etcd) = initialized_in_tempdir(1, BLOCKS);
    let _operators = leader_and_standby(&etcd, dir.path());
    let path = dir.path().join("agent");
    let started = Instant::now();
    let agent = start_agent(&etcd, &path, "cold");
    // The first ADD as soon as the agent answers: it waits for the node's first blocks.
    let addresses = add(&path.join("agent.sock"), "first").expect("the ADD waits for a block");
    eprintln!(
        "a cold node's first pod address {:?} after {:.0} ms (agent start included)",
        addresses,
        started.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(addresses.len(), 2, "one address per family");
    let nodes = vec![("cold".to_owned(), path.clone())];
    assert_invariant(&etcd, &nodes);
    assert_check(&etcd, &[&path.join("agent.sock")]);
    drop(agent);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_block_holding_a_pod_is_never_released_and_the_rest_go_to_quarantine() {
    let (dir, etcd) = initialized_in_tempdir(1, BLOCKS);
    let (op_a, op_b) = leader_and_standby(&etcd, dir.path());
    let mut operators = vec![op_a, op_b];
    let path = dir.path().join("agent");
    let agent = start_agent(&etcd, &path, "grower");
    let socket = path.join("agent.sock");
    let nodes = vec![("grower".to_owned(), path.clone())];
    // 60 pods: several blocks per family.
    let mut pods = Vec::new();
    for i in 0..60 {
        let container = format!("p{i}");
        let addresses = add(&socket, &container).unwrap();
        pods.push((container, addresses));
    }
    let grown = blocks_by_node(&etcd)["grower"].len();
    assert!(
        grown >= 9,
        "60 pods and 4 spare need 5 IPv4 /28s and 4 IPv6 /124s ({grown})"
    );
    // Keep the last pod (in the highest blocks), delete the rest.
    let (kept, kept_addresses) = pods.pop().unwrap();
    for (container, _) in &pods {
        del(&socket, container).unwrap();
    }
    // The leader SIGKILLed in the middle of the handshakes.
    std::thread::sleep(Duration::from_millis(2500));
    let leading = leader(&etcd).unwrap();
    for op in &operators {
        if op.log.ends_with(format!("{leading}.log")) {
            op.signal(rustix::process::Signal::KILL);
        }
    }
    operators.push(Operator::start(&etcd, dir.path(), "op-c"));
    // Down to the blocks of the kept pod (one per family), plus what pre-allocate 4 needs.
    wait_until(
        "the excess blocks are released",
        Duration::from_secs(60),
        || blocks_by_node(&etcd)["grower"].len() <= 4,
    );
    let blocks = blocks_by_node(&etcd)["grower"].clone();
    for address in &kept_addresses {
        assert!(
            blocks.iter().any(|b| b.contains(address)),
            "the block of {kept}'s {address} was released ({blocks:?})"
        );
    }
    assert!(quarantined(&etcd) > 0 || grown - blocks.len() > 0);
    // The kept pod is still there, at the same addresses.
    assert_eq!(add(&socket, &kept).unwrap(), kept_addresses);
    assert_invariant(&etcd, &nodes);
    assert_check(&etcd, &[&socket]);
    drop(agent);
}
