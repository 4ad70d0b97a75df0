//! End to end with Debian's real `bridge` plugin delegating to corral-ipam, inside network
//! namespaces this test creates and removes.
//!
//! Needs root, iproute2 and containernetworking-plugins (`make test` installs them); without
//! them the test fails and says what is missing, it never passes quietly.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::Command;

use corral_store::{Store, Txn};
use serde_json::{Value, json};

const PLUGIN_DIR: &str = "/usr/lib/cni";

fn require(ok: bool, what: &str) {
    assert!(
        ok,
        "this test needs {what}; run `make test`, which installs it (as root)"
    );
}

fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"))
}

fn is_root() -> bool {
    String::from_utf8_lossy(&sh(&["id", "-u"]).stdout).trim() == "0"
}

/// Removes what the test created even when an assertion fails.
struct Cleanup {
    netns: Vec<String>,
    bridge: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for ns in &self.netns {
            let _ = sh(&["ip", "netns", "delete", ns]);
        }
        let _ = sh(&["ip", "link", "delete", &self.bridge]);
    }
}

fn bridge_plugin(
    command: &str,
    container: &str,
    netns: &str,
    cni_path: &str,
    config: &[u8],
) -> (i32, String) {
    let mut plugin = Command::new(Path::new(PLUGIN_DIR).join("bridge"));
    common::cni_env(&mut plugin, command, container, netns, "eth0")
        .env("CNI_PATH", cni_path)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let mut child = common::spawn_piped(&mut plugin, "the bridge plugin");
    child.stdin.take().unwrap().write_all(config).unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

fn addresses_in(netns: &str) -> Vec<String> {
    let out = sh(&["ip", "-n", netns, "-j", "addr", "show", "dev", "eth0"]);
    if !out.status.success() {
        return Vec::new();
    }
    let value: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    value
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] == "global")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect()
}

/// The bridge plugin delegating to corral-ipam in two fresh namespaces: ADD, CHECK, DEL.
/// `ipam` adds keys to the ipam section; `tag` keeps names apart between tests; `held`
/// reads what the network holds afterwards.
fn bridge_end_to_end(tag: u32, ipam: Value, held: impl Fn() -> Vec<String>) {
    require(is_root(), "root (to create network namespaces)");
    require(sh(&["ip", "-V"]).status.success(), "iproute2 (`ip`)");
    require(
        Path::new(PLUGIN_DIR).join("bridge").exists(),
        "Debian's containernetworking-plugins (/usr/lib/cni/bridge)",
    );
    let id = std::process::id();
    let bridge = format!("crl{tag}{}", id % 100_000);
    let namespaces: Vec<String> = (0..2)
        .map(|i| format!("corral-test-{id}-{tag}-{i}"))
        .collect();
    let _cleanup = Cleanup {
        netns: namespaces.clone(),
        bridge: bridge.clone(),
    };
    for ns in &namespaces {
        let out = sh(&["ip", "netns", "add", ns]);
        assert!(
            out.status.success(),
            "ip netns add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The bridge plugin finds its IPAM plugin by type name in CNI_PATH.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(common::binary(), plugins.path().join("corral-ipam")).unwrap();
    let cni_path = format!("{}:{PLUGIN_DIR}", plugins.path().display());
    let subnet = format!("10.123.{tag}.0/24");
    let mut ipam_section = json!({
        "type": "corral-ipam",
        "ranges": [[{"subnet": subnet}]],
        "routes": [{"dst": "0.0.0.0/0"}]
    });
    for (key, value) in ipam.as_object().unwrap() {
        ipam_section[key] = value.clone();
    }
    let config = serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "e2e",
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipam": ipam_section
    }))
    .unwrap();

    let mut results: Vec<(String, String)> = Vec::new();
    for (i, ns) in namespaces.iter().enumerate() {
        let container = format!("e2e-{i}");
        let (code, output) = bridge_plugin("ADD", &container, ns, &cni_path, &config);
        assert_eq!(code, 0, "bridge ADD failed: {output}");
        let result: Value = serde_json::from_str(&output).expect("ADD result is JSON");
        let address = result["ips"][0]["address"].as_str().unwrap().to_owned();
        assert_eq!(
            addresses_in(ns),
            vec![address.clone()],
            "eth0 in {ns} does not carry the reported address"
        );
        results.push((container, output));
    }
    let first = format!("10.123.{tag}.2/24");
    let second = format!("10.123.{tag}.3/24");
    assert!(results[0].1.contains(&first), "{}", results[0].1);
    assert!(results[1].1.contains(&second), "{}", results[1].1);

    // CHECK with the previous result passes (bridge checks the interface, corral the store).
    let mut check: Value = serde_json::from_slice(&config).unwrap();
    check["prevResult"] = serde_json::from_str(&results[0].1).unwrap();
    let (code, output) = bridge_plugin(
        "CHECK",
        &results[0].0,
        &namespaces[0],
        &cni_path,
        &serde_json::to_vec(&check).unwrap(),
    );
    assert_eq!(code, 0, "bridge CHECK failed: {output}");

    // DEL removes the interface and releases the address; a second DEL is fine too.
    for _ in 0..2 {
        let (code, output) =
            bridge_plugin("DEL", &results[0].0, &namespaces[0], &cni_path, &config);
        assert_eq!(code, 0, "bridge DEL failed: {output}");
    }
    assert!(addresses_in(&namespaces[0]).is_empty(), "eth0 survived DEL");
    assert_eq!(held(), vec![format!("10.123.{tag}.3")]);
}

#[test]
#[ignore = "needs root, network namespaces and Debian's bridge plugin; `make test` runs it"]
fn bridge_delegates_to_corral_ipam_in_real_network_namespaces() {
    let data = tempfile::tempdir().unwrap();
    bridge_end_to_end(0, json!({"dataDir": data.path()}), || {
        let mut store = corral_store::SqliteStore::open(data.path()).unwrap();
        let mut txn = store.begin().unwrap();
        let rows = txn.all_allocations("e2e").unwrap();
        rows.iter().map(|r| r.addr.to_string()).collect()
    });
}

/// The same through the agent: corral-ipam in agent mode, the agent in this process.
#[test]
#[ignore = "needs root, network namespaces and Debian's bridge plugin; `make test` runs it"]
fn bridge_delegates_to_corral_ipam_in_agent_mode() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let agent = corral_agent::Running::start(corral_agent::AgentConfig::in_dir(dir.path()))
        .expect("the agent starts");
    bridge_end_to_end(1, json!({"agent": socket}), || {
        let dump = corral_client::Client::unix(&socket)
            .dump(Some("e2e"))
            .expect("dump");
        dump.scopes[0]
            .pools
            .iter()
            .flat_map(|p| &p.allocations)
            .map(|a| a.address.to_string())
            .collect()
    });
    agent.stop().unwrap();
}
