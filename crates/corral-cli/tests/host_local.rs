//! `corral host-local export`: corral's state for a network written as host-local's files.
//! The state is made through the agent's CNI API (the scope corral-ipam's agent mode uses; a
//! standalone corral-ipam keeps the same scope in its own `dataDir`), then read offline.

use std::path::Path;
use std::process::{Command, Output};

use corral_api as api;
use serde_json::{Value, json};

use crate::common;

use common::Agent;

fn network() -> api::CniNetwork {
    api::CniNetwork::with_pools(
        "back",
        vec![api::CniPool {
            name: "back".into(),
            cooldown_ms: 30_000,
            lowest_free: false,
            ranges: vec![
                "10.77.0.0/24,gateway=10.77.0.1".into(),
                "fd77::/120,gateway=fd77::1".into(),
            ],
            exclusions: Vec::new(),
        }],
    )
}

fn key(container: &str) -> api::AttachmentKey {
    api::AttachmentKey {
        network: "back".into(),
        container_id: container.into(),
        ifname: "eth0".into(),
    }
}

/// Dual-stack ADDs and one DEL through a real agent on `dir/state`, which is then killed.
fn state_with_allocations(dir: &Path) -> Vec<(String, Vec<String>)> {
    let socket = dir.join("agent.sock");
    let state = dir.join("state");
    let agent = Agent::serve(&state, &socket);
    let mut client = corral_client::Client::unix(&socket);
    let mut held = Vec::new();
    for container in ["c1", "c2", "c3"] {
        let answer = client
            .cni_add(&api::CniAddRequest {
                network: network(),
                key: key(container),
                owner: container.into(),
                sets: vec![
                    api::CniSet {
                        pool: "back".into(),
                        family: api::FamilyName::Ipv4,
                        requested: None,
                    },
                    api::CniSet {
                        pool: "back".into(),
                        family: api::FamilyName::Ipv6,
                        requested: None,
                    },
                ],
            })
            .unwrap();
        held.push((
            container.to_owned(),
            answer
                .allocations
                .iter()
                .map(|a| a.address.to_string())
                .collect(),
        ));
    }
    client
        .cni_del(&api::CniKeyRequest {
            network: network(),
            key: key("c2"),
        })
        .unwrap();
    held.remove(1);
    agent.kill();
    held
}

fn corral(args: &[&str]) -> Output {
    Command::new(common::BINARY).args(args).output().unwrap()
}

/// `corral host-local export` of network `back` from `state`, with `extra` arguments.
fn export_of(state: &Path, extra: &[&str]) -> Output {
    let data_dir = ["--data-dir", state.to_str().unwrap(), "--network", "back"];
    corral(&[&["host-local", "export"], &data_dir[..], extra].concat())
}

/// `corral host-local export` of network `back` from `state` to `to`, which must succeed.
fn export(state: &Path, to: &Path) -> Output {
    let out = export_of(state, &["--to", to.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn export_writes_host_locals_files_and_refuses_while_the_agent_owns_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let held = state_with_allocations(dir.path());
    assert_eq!(
        held,
        [
            (
                "c1".to_owned(),
                vec!["10.77.0.2".to_owned(), "fd77::2".to_owned()]
            ),
            (
                "c3".to_owned(),
                vec!["10.77.0.4".to_owned(), "fd77::4".to_owned()]
            ),
        ]
    );
    let state = dir.path().join("state");
    let to = dir.path().join("cni");
    // A stale file of host-local's own, for an address corral released.
    std::fs::create_dir_all(to.join("back")).unwrap();
    std::fs::write(to.join("back").join("10.77.0.3"), "c2\r\neth0").unwrap();
    let out = export(&state, &to);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("wrote 4 address files"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let files = to.join("back");
    for (container, addrs) in &held {
        for addr in addrs {
            assert_eq!(
                std::fs::read_to_string(files.join(addr)).unwrap(),
                format!("{container}\r\neth0")
            );
        }
    }
    // corral released it, but host-local may have handed it out since: left as it is.
    assert!(
        files.join("10.77.0.3").exists(),
        "a file corral does not hold is kept"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("kept 1"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(files.join("last_reserved_ip.0")).unwrap(),
        "10.77.0.4"
    );
    assert_eq!(
        std::fs::read_to_string(files.join("last_reserved_ip.1")).unwrap(),
        "fd77::4"
    );
    assert!(files.join("lock").exists());

    // While an agent owns the directory, the export refuses (exit 2) and says why.
    let socket = dir.path().join("agent.sock");
    let _agent = Agent::serve(&state, &socket);
    let out = export_of(&state, &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stop the agent first") && stderr.contains(&*socket.to_string_lossy()),
        "{stderr}"
    );
    // A directory without corral's state is not taken for an empty one.
    let out = corral(&[
        "host-local",
        "export",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--network",
        "back",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no corral state"));
}

fn host_local(command: &str, container: &str, data_dir: &Path) -> Value {
    let config = json!({
        "cniVersion": "1.0.0",
        "name": "back",
        "ipam": {
            "type": "host-local",
            "dataDir": data_dir,
            "ranges": [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd77::/120"}]]
        }
    });
    corral_cni::testing::host_local(command, container, &serde_json::to_vec(&config).unwrap())
}

/// The way back: after the export, Debian's host-local neither hands out what corral holds
/// nor keeps it after the container's DEL.
#[test]
#[ignore = "needs Debian's containernetworking-plugins (host-local); `make test` runs it"]
fn after_the_export_host_local_sees_corrals_addresses_as_taken() {
    let dir = tempfile::tempdir().unwrap();
    let held = state_with_allocations(dir.path());
    let state = dir.path().join("state");
    let to = dir.path().join("cni");
    export(&state, &to);
    // host-local continues after corral's last address, and never hands out a held one.
    let mut given = Vec::new();
    for container in ["h1", "h2", "h3"] {
        let result = host_local("ADD", container, &to);
        for ip in result["ips"].as_array().unwrap() {
            let address = ip["address"].as_str().unwrap();
            given.push(address.split('/').next().unwrap().to_owned());
        }
    }
    assert_eq!(&given[..2], ["10.77.0.5", "fd77::5"], "{given:?}");
    for (_, addrs) in &held {
        for addr in addrs {
            assert!(
                !given.contains(addr),
                "host-local handed out {addr}: {given:?}"
            );
        }
    }
    // host-local's DEL of a container corral served frees its addresses.
    host_local("DEL", "c1", &to);
    assert!(!to.join("back").join("10.77.0.2").exists());
    assert!(!to.join("back").join("fd77::2").exists());
    assert!(to.join("back").join("10.77.0.4").exists());
}
