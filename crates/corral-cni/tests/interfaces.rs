//! corral-ipam in agent mode on an interface-backed pool of the node: the real binary against
//! the real agent. The result carries the interface's gateway in `ips[].gateway`, routes to
//! its routable CIDRs through that gateway (after the configuration's own), and the
//! interface (ID, device number, MAC) under the result's `corral` key, never under the
//! spec's `interfaces` (which IPAM plugins leave to the main plugin); ADD is idempotent, DEL
//! unassigns, and a released address cools before it is handed out again.

use std::path::{Path, PathBuf};

use corral_agent::{AgentConfig, Running};
use corral_api as api;
use corral_store::ScopeConfig;
use serde_json::json;

use crate::common;

use common::Outcome;

fn run(command: &str, container: &str, stdin: &[u8]) -> Outcome {
    common::run(command, container, "eth0", &[], stdin)
}

fn conf(socket: &Path, data: &Path) -> Vec<u8> {
    conf_of("1.0.0", socket, data)
}

fn conf_of(version: &str, socket: &Path, data: &Path) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "cniVersion": version,
        "name": "aws-cni",
        "type": "ptp",
        "ipam": {
            "type": "corral-ipam",
            "agent": socket,
            "dataDir": data,
            "pool": "eni",
            "routes": [{"dst": "0.0.0.0/0"}]
        }
    }))
    .unwrap()
}

fn interface(id: &str, device: u32, mac: &str, addresses: &[&str]) -> api::InterfaceRequest {
    api::InterfaceRequest {
        pool: "eni".into(),
        id: id.into(),
        device_number: device,
        mac: mac.into(),
        subnets: vec!["10.0.32.0/19".into()],
        gateways: vec![],
        routes: vec!["10.0.0.0/16".into(), "0.0.0.0/0".into()],
        primary: device == 0,
        primary_addresses: vec![],
        trunk: false,
        excluded: false,
        addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
    }
}

/// The `corral` entry of a result whose one address, 10.0.32.10, lies on eni-1.
fn eni_1_result() -> serde_json::Value {
    json!({"interfaces": [{
        "id": "eni-1",
        "deviceNumber": 1,
        "mac": "0a:00:00:00:00:01",
        "addresses": ["10.0.32.10/19"]
    }]})
}

/// An agent with no pool of its own in a directory of its own: the directory, the agent, its
/// socket and the plugin's data directory.
fn agent_without_pools() -> (tempfile::TempDir, Running, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::in_dir(dir.path());
    config.pools = ScopeConfig::default();
    let agent = Running::start(config).expect("the agent starts");
    let socket = dir.path().join("agent.sock");
    let data = dir.path().join("cni");
    (dir, agent, socket, data)
}

#[test]
fn an_add_on_an_interface_pool_routes_through_the_interface() {
    let (_dir, agent, socket, data) = agent_without_pools();
    let mut client = corral_client::Client::unix(&socket);
    client
        .add_interface(&interface(
            "eni-1",
            1,
            "0a:00:00:00:00:01",
            &["10.0.32.10", "10.0.32.11/32"],
        ))
        .unwrap();

    let first = run("ADD", "c1", &conf(&socket, &data));
    let result = first.json();
    assert_eq!(first.code, 0, "{}", first.stdout);
    assert_eq!(
        result,
        json!({
            "cniVersion": "1.0.0",
            "ips": [{"address": "10.0.32.10/19", "gateway": "10.0.32.1"}],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.0.0.0/16", "gw": "10.0.32.1"}],
            "dns": {},
            "corral": eni_1_result(),
        })
    );
    assert!(result.get("interfaces").is_none());
    assert!(result["ips"][0].get("interface").is_none());
    assert_eq!(
        run("ADD", "c1", &conf(&socket, &data)).stdout,
        first.stdout,
        "a repeated ADD answers the same"
    );
    assert_eq!(run("CHECK", "c1", &conf(&socket, &data)).code, 0);

    // The second address, then nothing left: the pool is exhausted, named.
    let second = run("ADD", "c2", &conf(&socket, &data));
    assert_eq!(second.addresses(), ["10.0.32.11/19"]);
    let full = run("ADD", "c3", &conf(&socket, &data));
    assert_ne!(full.code, 0);
    let msg = full.json()["msg"].as_str().unwrap().to_owned();
    assert!(msg.contains("eni"), "{msg}");

    // DEL unassigns; the address cools (30 s), so a new interface address comes first.
    assert_eq!(run("DEL", "c1", &conf(&socket, &data)).code, 0);
    client.add_interface_address("eni-1", "10.0.32.12").unwrap();
    let third = run("ADD", "c3", &conf(&socket, &data));
    assert_eq!(third.addresses(), ["10.0.32.12/19"]);
    let listed = client.interfaces(Some("eni")).unwrap();
    let eni = &listed.pools[0].interfaces[0];
    assert_eq!((eni.assigned, eni.cooling, eni.total), (2, 1, 3), "{eni:?}");
    drop(agent);
}

/// A 0.3.1 configuration (what AWS VPC CNI and many main plugins still write) gets a 0.3.1
/// result: `ips[].version`, the interface's gateway and routes, and the `corral` key beside
/// them. Only a plugin reading the raw IPAM output sees that key: a main plugin's
/// `NewResultFromResult` drops fields it does not know.
#[test]
fn a_0_3_1_add_on_an_interface_pool_gets_a_0_3_1_result() {
    let (_dir, agent, socket, data) = agent_without_pools();
    let mut client = corral_client::Client::unix(&socket);
    client
        .add_interface(&interface("eni-1", 1, "0a:00:00:00:00:01", &["10.0.32.10"]))
        .unwrap();
    let added = run("ADD", "c1", &conf_of("0.3.1", &socket, &data));
    assert_eq!(added.code, 0, "{}", added.stdout);
    assert_eq!(
        added.json(),
        json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.0.32.10/19", "gateway": "10.0.32.1"}],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.0.0.0/16", "gw": "10.0.32.1"}],
            "dns": {},
            "corral": eni_1_result(),
        })
    );
    // CHECK came with 0.4.0: a 0.3.1 configuration's is refused (code 1, incompatible version).
    let check = run("CHECK", "c1", &conf_of("0.3.1", &socket, &data));
    assert_ne!(check.code, 0, "{}", check.stdout);
    assert_eq!(check.json()["code"], 1, "{}", check.stdout);
    assert_eq!(run("DEL", "c1", &conf_of("0.3.1", &socket, &data)).code, 0);
    drop(agent);
}
