//! Starving nodes with real processes (issue 23): etcd started here on 127.0.0.1, `corral
//! operator` replicas `op-a` (the leader) and `op-b` (its standby), and four `corral agent`s as
//! child processes, on a block pool of two blocks. Two nodes get a block; the other two, whose
//! watermarks ask for one, starve — and say so everywhere: `corral node list` (table and
//! JSON), `node show`, the operator's `/v1/nodes`, `/metrics`, `/v1/status` `full` and `corral
//! cluster status`. Then the pool is widened through `corral cluster apply`: every node is
//! served and nothing waits any more. The standby's 503 names the leader.
//!
//! Needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use corral_client::Client;
use corral_etcd::testing::EtcdCluster;
use corral_kv::Kv as _;

use crate::cluster_common;

use cluster_common::*;

/// Two /28 blocks (14 addresses each) of IPv4; a node's watermarks (pre-allocate 4) ask for
/// one block.
fn two_blocks() -> String {
    block_pool(2, "10.90.0.0/27")
}

const NODES: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];

const EXHAUSTED: &str = "no free block: the pool is exhausted";

/// Whether every node's agent holds its liveness key (a node without one is `degraded`).
fn all_live(etcd: &EtcdCluster) -> bool {
    let kv = kv(etcd);
    NODES.iter().all(|node| {
        block_on(kv.get(format!("/corral/t/v1/live/{node}").as_bytes()))
            .ok()
            .flatten()
            .is_some()
    })
}

/// The nodes etcd says hold a block.
fn served(etcd: &EtcdCluster) -> BTreeSet<String> {
    grants(etcd).into_keys().collect()
}

fn node_list(etcd: &EtcdCluster, json: bool) -> String {
    let flags: &[&str] = if json { &["-o", "json"] } else { &[] };
    let (code, out, err) = on_cluster(etcd, &["node", "list"], flags);
    assert_eq!(code, 0, "node list: {out}{err}");
    out
}

fn cluster_status(etcd: &EtcdCluster) -> String {
    let (code, out, err) = cluster_command(etcd, "status", &[]);
    assert_eq!(code, 0, "cluster status: {out}{err}");
    out
}

/// Every place a node's waiting shows, checked for `starving` (the others served).
fn assert_reported(etcd: &EtcdCluster, leader: &Path, starving: &[&str]) {
    let served: Vec<&str> = NODES
        .iter()
        .copied()
        .filter(|n| !starving.contains(n))
        .collect();
    // `corral node list`, a table: the WAITING FOR column, with why.
    let table = node_list(etcd, false);
    for line in table.lines().skip(1) {
        let name = line.split_whitespace().next().unwrap();
        let waits = line.contains(&format!("pods ipv4 ({EXHAUSTED})"));
        assert_eq!(waits, starving.contains(&name), "{name}:\n{table}");
    }
    // ... and JSON.
    let nodes: serde_json::Value = serde_json::from_str(&node_list(etcd, true)).unwrap();
    for node in nodes.as_array().unwrap() {
        let name = node["name"].as_str().unwrap();
        if starving.contains(&name) {
            assert_eq!(
                node["waiting_for"],
                serde_json::json!(["pods ipv4"]),
                "{node}"
            );
            assert_eq!(node["waiting"][0]["reason"], EXHAUSTED, "{node}");
            assert_eq!(node["waiting"][0]["starving"], true, "{node}");
        } else {
            assert_eq!(node["waiting_for"], serde_json::json!([]), "{node}");
            assert!(node.get("waiting").is_none(), "{node}");
        }
    }
    // `corral node show`.
    for name in starving {
        let (code, out, err) = on_cluster(etcd, &["node", "show", name], &[]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(EXHAUSTED), "{out}");
    }
    // The operator's `/v1/nodes`.
    let (code, nodes) = operator_get(leader, "/v1/nodes");
    assert_eq!(code, 200, "{nodes}");
    for node in nodes["nodes"].as_array().unwrap() {
        let name = node["name"].as_str().unwrap();
        let waiting_for = node["waiting_for"].as_array().unwrap();
        assert_eq!(!waiting_for.is_empty(), starving.contains(&name), "{node}");
        if starving.contains(&name) {
            assert_eq!(node["waiting"][0]["reason"], EXHAUSTED, "{node}");
        }
    }
    // Its metrics.
    let metrics = Client::unix(leader).metrics().unwrap();
    for line in [
        format!(
            "corral_operator_nodes{{state=\"waiting\"}} {}",
            starving.len()
        ),
        format!("corral_operator_nodes{{state=\"served\"}} {}", served.len()),
        format!(
            "corral_operator_block_nodes{{category=\"starving\"}} {}",
            starving.len()
        ),
        format!(
            "corral_operator_block_nodes{{category=\"ok\"}} {}",
            served.len()
        ),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    // `/v1/status`: the counts, and `full` naming every starving node, as blocks.
    let (code, status) = operator_get(leader, "/v1/status");
    assert_eq!(code, 200, "{status}");
    let cluster = &status["cluster"];
    assert_eq!(
        (&cluster["nodes_served"], &cluster["nodes_waiting"]),
        (
            &serde_json::json!(served.len()),
            &serde_json::json!(starving.len())
        ),
        "{status}"
    );
    let full = status["full"].as_object().unwrap();
    if starving.is_empty() {
        assert!(full.is_empty(), "{status}");
    } else {
        let text = full["pods/ipv4"].as_str().unwrap();
        assert!(text.starts_with("no free block for"), "{text}");
        assert!(!text.contains("CIDR"), "{text}");
        for name in starving {
            assert!(text.contains(name), "{name} in {text}");
        }
    }
    // `corral cluster status`, read from etcd.
    let text = cluster_status(etcd);
    let counts = format!(
        "4 nodes ({} served, {} waiting)",
        served.len(),
        starving.len()
    );
    assert!(text.contains(&counts), "{counts} in\n{text}");
    let full_line = text.lines().find(|l| l.starts_with("full: pods/ipv4: "));
    if starving.is_empty() {
        assert!(full_line.is_none(), "{text}");
    } else {
        let line = full_line.unwrap_or_else(|| panic!("no full line in\n{text}"));
        for name in starving {
            assert!(line.contains(name), "{name} in {line}");
        }
    }
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn nodes_starving_in_an_exhausted_block_pool_are_waiting_everywhere_until_the_pool_grows() {
    let (dir, etcd) = initialized_in_tempdir(1, &two_blocks());
    let (op_a, op_b) = leader_and_standby(&etcd, dir.path());
    let agents = start_agents(&etcd, dir.path(), &NODES);
    wait_until(
        "two nodes hold the two blocks, the other two are waiting",
        Duration::from_secs(30),
        || {
            served(&etcd).len() == 2
                && all_live(&etcd)
                && operator_get(&op_a.socket, "/v1/status").1["cluster"]["nodes_waiting"] == 2
        },
    );
    let held = served(&etcd);
    let starving: Vec<&str> = NODES
        .iter()
        .copied()
        .filter(|n| !held.contains(*n))
        .collect();
    assert_eq!(starving.len(), 2);
    assert_reported(&etcd, &op_a.socket, &starving);

    // The standby answers 503 naming the leader (its election key's holder).
    wait_until(
        "the standby's 503 names op-a",
        Duration::from_secs(20),
        || {
            let (code, body) = operator_get(&op_b.socket, "/v1/nodes");
            code == 503
                && body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("ask the leader, op-a"))
        },
    );

    // Space comes back: the pool grows by a cluster CIDR through `corral cluster apply`.
    widen(
        &etcd,
        dir.path(),
        &two_blocks(),
        "10.90.0.0/27",
        "10.90.0.32/27",
    );
    wait_until("every node holds a block", Duration::from_secs(30), || {
        served(&etcd).len() == NODES.len()
            && all_live(&etcd)
            && operator_get(&op_a.socket, "/v1/status").1["cluster"]["nodes_waiting"] == 0
    });
    assert_reported(&etcd, &op_a.socket, &[]);
    let sockets: Vec<&Path> = agents.iter().map(|a| a.socket.as_path()).collect();
    assert_check(&etcd, &sockets);
}
