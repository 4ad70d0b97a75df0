//! corral-ipam in agent mode on a pool of the node's own scope (`"agent"` with no ranges, and
//! `"pool"` or the default `default`): the real binary against the real agent, whose pool gets
//! its ranges through the API as the cluster's grants would give them. One address per family
//! the pool has, idempotent ADD, DEL, CHECK, GC that keeps other networks' attachments, and a
//! pool without ranges answered "try again later".

use std::path::Path;

use corral_agent::{AgentConfig, Running};
use corral_api as api;
use corral_store::{PoolSpec, ScopeConfig};
use serde_json::{Value, json};

use crate::common;

use common::Outcome;

fn run(command: &str, container: &str, stdin: &[u8]) -> Outcome {
    common::run(command, container, "eth0", &[], stdin)
}

/// The network `name` on the node pool `pool` (the default when `None`) of the agent at
/// `socket`; `extra` goes at the top level (GC's attachments).
fn conf(socket: &Path, data: &Path, name: &str, pool: Option<&str>, extra: Value) -> Vec<u8> {
    let mut ipam = json!({
        "type": "corral-ipam",
        "agent": socket,
        "dataDir": data,
    });
    if let Some(pool) = pool {
        ipam["pool"] = json!(pool);
    }
    let mut config = json!({
        "cniVersion": "1.1.0",
        "name": name,
        "type": "bridge",
        "ipam": ipam
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    serde_json::to_vec(&config).unwrap()
}

fn add_range(socket: &Path, range: &str) {
    corral_client::Client::unix(socket)
        .add_range(&api::RangeRequest {
            scope: api::NODE_SCOPE.into(),
            pool: "default".into(),
            range: range.into(),
        })
        .unwrap();
}

#[test]
fn a_node_pool_serves_one_address_per_family_and_every_verb() {
    let dir = tempfile::tempdir().unwrap();
    // The agent's file declares an empty pool and no `default` pool at all.
    let mut config = AgentConfig::in_dir(dir.path());
    config.pools = ScopeConfig {
        pools: vec![PoolSpec::new(
            &corral_core::PoolName::new("empty").unwrap(),
            std::time::Duration::ZERO,
            corral_core::ReusePolicy::NextFit,
            &[],
            &[],
        )],
    };
    let agent = Running::start(config).expect("the agent starts");
    let socket = dir.path().join("agent.sock");
    let data = dir.path().join("cni");
    let podnet = |extra: Value| conf(&socket, &data, "podnet", None, extra);

    // Nothing granted yet: try again later, naming the pool.
    for (pool, what) in [(None, "default"), (Some("empty"), "empty")] {
        let out = run(
            "ADD",
            "c1",
            &conf(&socket, &data, "podnet", pool, json!({})),
        );
        assert_eq!(out.error_code(), 11, "{}", out.stdout);
        let msg = out.json()["msg"].as_str().unwrap().to_owned();
        assert!(msg.contains(&format!("pool {what} ")), "{msg}");
    }
    let out = run("STATUS", "", &podnet(json!({})));
    assert_eq!(out.error_code(), 50, "{}", out.stdout);

    add_range(&socket, "10.77.0.0/24,gateway=10.77.0.1");
    add_range(&socket, "fd77::/120");

    let first = run("ADD", "c1", &podnet(json!({})));
    let addresses = first.addresses();
    assert_eq!(addresses.len(), 2, "{}", first.stdout);
    assert!(addresses[0].starts_with("10.77.0.") && addresses[0].ends_with("/24"));
    assert!(addresses[1].starts_with("fd77::") && addresses[1].ends_with("/120"));
    assert_eq!(first.json()["ips"][0]["gateway"], json!("10.77.0.1"));
    assert_eq!(first.json()["ips"][1].get("gateway"), None);
    let again = run("ADD", "c1", &podnet(json!({})));
    assert_eq!(
        again.stdout, first.stdout,
        "a repeated ADD answers the same"
    );
    let second = run("ADD", "c2", &podnet(json!({})));
    assert_eq!(second.addresses().len(), 2);
    assert_ne!(second.addresses(), addresses);
    assert_eq!(run("CHECK", "c1", &podnet(json!({}))).code, 0);
    assert_eq!(run("STATUS", "", &podnet(json!({}))).code, 0);

    // Another network on the same pool.
    let other = conf(&socket, &data, "othernet", Some("default"), json!({}));
    assert_eq!(run("ADD", "o1", &other).addresses().len(), 2);

    // GC of podnet keeps c1 (listed) and othernet's o1, releases c2 at the first GC (no
    // grace period here: one observation is enough).
    let mut config: Value = serde_json::from_slice(&podnet(
        json!({"cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]}),
    ))
    .unwrap();
    config["ipam"]["gcGracePeriodSeconds"] = json!(0);
    let gc = run("GC", "", &serde_json::to_vec(&config).unwrap());
    assert_eq!(gc.code, 0, "{}", gc.stdout);
    assert_eq!(run("CHECK", "c1", &podnet(json!({}))).code, 0);
    assert_eq!(run("CHECK", "c2", &podnet(json!({}))).error_code(), 105);
    assert_eq!(run("CHECK", "o1", &other).code, 0);

    // DEL releases; a second DEL is fine.
    assert_eq!(run("DEL", "c1", &podnet(json!({}))).code, 0);
    assert_eq!(run("CHECK", "c1", &podnet(json!({}))).error_code(), 105);
    assert_eq!(run("DEL", "c1", &podnet(json!({}))).code, 0);
    let held: Vec<String> = corral_client::Client::unix(&socket)
        .dump(Some(api::NODE_SCOPE))
        .unwrap()
        .scopes
        .iter()
        .flat_map(|s| &s.pools)
        .flat_map(|p| &p.allocations)
        .filter_map(|a| a.key.as_ref().map(|k| k.network.clone()))
        .collect();
    assert_eq!(held, ["othernet", "othernet"]);
    agent.stop().unwrap();
}
