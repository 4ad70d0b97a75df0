//! etcd's users and roles with real processes: `corral cluster rbac --enable-auth` and `corral
//! node credentials` on etcd started here; node-1's credentials refused by etcd itself on every
//! key node-10's agent writes (the agent's own key functions), node-1's own keys written, the
//! reader refused any write; then a whole cluster on per-node credentials: the operator on its
//! role, two agents on theirs, grants, a block pool with its release handshake, `node remove`,
//! and `cluster check` on the reader's.
//!
//! Every test needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::ffi::OsStr;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_client::Client;
use corral_cluster::{ClusterName, Keys, NodeName};
use corral_core::{Family, PoolName};
use corral_etcd::testing::EtcdCluster;
use corral_etcd::{Credentials, EtcdKv, EtcdOptions};
use corral_kv::{Kv, KvError, Txn, TxnOp};

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::{pod_add_at, pod_del};

/// Block mode: /28 IPv4 and /124 IPv6 blocks, a 2 s release delay and quarantine.
const BLOCKS: &str = include_str!("configs/blocks.toml");

/// The password file of etcd user `user` that `cluster rbac` or `node credentials` wrote.
fn password_file(dir: &Path, user: &str) -> PathBuf {
    dir.join("passwords").join(format!("{user}.password"))
}

/// `--etcd-user USER --etcd-password-file FILE`.
fn as_user(dir: &Path, user: &str) -> Vec<String> {
    vec![
        "--etcd-user".into(),
        user.into(),
        "--etcd-password-file".into(),
        password_file(dir, user).display().to_string(),
    ]
}

/// `corral COMMAND` on cluster `t` as etcd user `user` (none: no credentials).
fn run_as(
    etcd: &EtcdCluster,
    dir: &Path,
    user: Option<&str>,
    command: &[&str],
    extra: &[&str],
) -> (i32, String) {
    let mut args: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
    if let Some(user) = user {
        args.extend(as_user(dir, user));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = on_cluster(etcd, command, &args);
    (code, format!("{out}{err}"))
}

/// A client of etcd as `user`, its password from the file made for it.
fn kv_as(etcd: &EtcdCluster, dir: &Path, user: &str) -> EtcdKv {
    let credentials = Credentials::from_file(user, &password_file(dir, user)).unwrap();
    let options = EtcdOptions {
        credentials: Some(credentials),
        ..EtcdOptions::default()
    };
    block_on(EtcdKv::connect(&etcd.endpoints(), options)).unwrap()
}

/// etcd with the operator's and reader's roles and auth on, and node credentials for `nodes`.
fn secured(dir: &Path, nodes: &[&str]) -> EtcdCluster {
    // Tokens lapse after 1 s without use: every process renews its own.
    let etcd = block_on(EtcdCluster::start_with(
        1,
        &["--auth-token", "simple", "--auth-token-ttl", "1"],
    ))
    .expect("etcd starts (make deps installs it)");
    let passwords = dir.join("passwords");
    std::fs::create_dir_all(&passwords).unwrap();
    let passwords = passwords.display().to_string();
    let rbac = ["--password-dir", passwords.as_str(), "--enable-auth"];
    let (code, out) = run_as(&etcd, dir, None, &["cluster", "rbac"], &rbac);
    assert_eq!(code, 0, "{out}");
    for line in [
        "role corral-t-operator: created (readwrite /corral/t/v1/*, read \\0corral/*)",
        "role corral-t-reader: created (read /corral/t/v1/*, read \\0corral/*)",
        "user corral-t-reader: created, password in ",
        "user root: created, password in ",
        "auth: enabled",
    ] {
        assert!(out.contains(line), "{line:?} in:\n{out}");
    }
    let mode = std::fs::metadata(password_file(dir, "corral-t-operator"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Auth is on: without credentials etcd refuses, and says so (not "unreachable").
    let (code, out) = run_as(&etcd, dir, None, &["node", "list"], &[]);
    assert_ne!(code, 0);
    assert!(out.contains("user name is empty"), "{out}");
    // Again, as root: nothing changes.
    let (code, again) = run_as(&etcd, dir, Some("root"), &["cluster", "rbac"], &rbac);
    assert_eq!(code, 0, "{again}");
    assert!(
        !again.contains("created") && !again.contains("updated"),
        "{again}"
    );
    for node in nodes {
        let args = [*node, "--password-dir", passwords.as_str()];
        let (code, out) = run_as(&etcd, dir, Some("root"), &["node", "credentials"], &args);
        assert_eq!(code, 0, "{out}");
        let user = format!("corral-t-node-{node}");
        assert!(out.contains(&format!("user {user}: created")), "{out}");
        let written = std::fs::read_to_string(password_file(dir, &user)).unwrap();
        let (code, again) = run_as(&etcd, dir, Some("root"), &["node", "credentials"], &args);
        assert_eq!(code, 0, "{again}");
        assert!(
            again.contains(&format!("role {user}: unchanged"))
                && again.contains(&format!("user {user}: unchanged")),
            "{again}"
        );
        assert_eq!(
            std::fs::read_to_string(password_file(dir, &user)).unwrap(),
            written
        );
    }
    etcd
}

/// Every key an agent of `node` writes, built by the agent's own key functions.
fn agent_keys(keys: &Keys, node: &str) -> Vec<String> {
    let node = NodeName::new(node).unwrap();
    let pool = PoolName::new("pods").unwrap();
    let cidr: ipnet::IpNet = "10.80.0.0/28".parse().unwrap();
    vec![
        keys.node(&node),
        keys.live(&node),
        keys.holdings(&node),
        keys.demand(&node, &pool),
        keys.release(&node, &pool, Family::V4, &cidr),
    ]
}

fn put(key: &str) -> Txn {
    Txn {
        compares: vec![],
        success: vec![TxnOp::put(key, "{}")],
        failure: vec![],
    }
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_nodes_credentials_write_only_its_own_keys_and_the_reader_none() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = secured(dir.path(), &["node-1", "node-10"]);
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let node_1 = kv_as(&etcd, dir.path(), "corral-t-node-node-1");
    for key in agent_keys(&keys, "node-10") {
        for op in [TxnOp::put(key.as_str(), "{}"), TxnOp::delete(key.as_str())] {
            let txn = Txn {
                compares: vec![],
                success: vec![op],
                failure: vec![],
            };
            match block_on(node_1.txn(txn)) {
                Err(KvError::Refused(message)) => {
                    assert!(message.contains("permission denied"), "{key}: {message}")
                }
                other => panic!("node-1 wrote {key}: {other:?}"),
            }
        }
    }
    for key in agent_keys(&keys, "node-1") {
        block_on(node_1.txn(put(&key))).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(block_on(node_1.get(key.as_bytes())).unwrap().is_some());
    }
    // Nor anything of the leader's.
    for key in [
        keys.config(),
        keys.reassert(),
        format!("{}grants/x", keys.prefix()),
    ] {
        assert!(
            matches!(block_on(node_1.txn(put(&key))), Err(KvError::Refused(_))),
            "{key}"
        );
    }
    let reader = kv_as(&etcd, dir.path(), "corral-t-reader");
    let (all, _) = block_on(corral_kv::read_all(&reader, keys.prefix().as_bytes(), 100)).unwrap();
    assert_eq!(all.len(), agent_keys(&keys, "node-1").len());
    match block_on(reader.txn(put(&keys.node(&NodeName::new("node-1").unwrap())))) {
        Err(KvError::Refused(message)) => assert!(message.contains("permission denied")),
        other => panic!("the reader wrote: {other:?}"),
    }
    // The environment names them as the flags do: etcd answers (this cluster has no
    // configuration yet), where without them it refuses ("user name is empty").
    let output = std::process::Command::new(common::BINARY)
        .args([
            "node",
            "list",
            "--etcd",
            &endpoints(&etcd),
            "--cluster",
            "t",
        ])
        .env("CORRAL_ETCD_USER", "corral-t-reader")
        .env(
            "CORRAL_ETCD_PASSWORD_FILE",
            password_file(dir.path(), "corral-t-reader"),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cluster t has no configuration"),
        "{stderr}"
    );
    let wrong = dir.path().join("wrong.password");
    std::fs::write(&wrong, "not-the-password-42\n").unwrap();
    let wrong = wrong.display().to_string();
    // A wrong password: its own error, without the password; a user without its password
    // file, and a file that is not there.
    let missing = dir.path().join("missing.password").display().to_string();
    fn reader_args(file: Option<&str>) -> Vec<&str> {
        let mut args = vec!["--etcd-user", "corral-t-reader"];
        args.extend(
            file.into_iter()
                .flat_map(|file| ["--etcd-password-file", file]),
        );
        args
    }
    for (args, expected) in [
        (
            reader_args(Some(&wrong)),
            "etcd refused the credentials of user \"corral-t-reader\"".to_owned(),
        ),
        (
            reader_args(None),
            "--etcd-user needs --etcd-password-file".to_owned(),
        ),
        (
            reader_args(Some(&missing)),
            format!("cannot read the etcd password file {missing}"),
        ),
    ] {
        let (code, out) = run_as(&etcd, dir.path(), None, &["node", "list"], &args);
        assert_ne!(code, 0);
        assert!(out.contains(&expected), "{out}");
        assert!(!out.contains("not-the-password-42"), "{out}");
    }
    // An agent with a wrong password says so in its log, and keeps trying.
    let agent_dir = dir.path().join("agent");
    let args = [
        "--etcd-user",
        "corral-t-node-node-1",
        "--etcd-password-file",
        wrong.as_str(),
    ];
    let _agent = start_agent_with(&etcd, &agent_dir, "node-1", &args);
    let log = || std::fs::read_to_string(agent_dir.join("agent.log")).unwrap_or_default();
    wait_until(
        "the agent says its password is wrong",
        Duration::from_secs(20),
        || {
            log().lines().any(|line| {
                line.contains("etcd refused the credentials of user")
                    && line.contains("corral-t-node-node-1")
            })
        },
    );
    assert!(!log().contains("not-the-password-42"), "{}", log());
}

/// The blocks etcd says `node` holds, read as the reader.
fn blocks_of(reader: &EtcdKv, node: &str) -> usize {
    let (grants, _) = block_on(corral_kv::read_all(reader, b"/corral/t/v1/grants/", 1000)).unwrap();
    grants
        .iter()
        .filter(|e| {
            serde_json::from_slice::<serde_json::Value>(&e.value)
                .is_ok_and(|v| v["node"].as_str() == Some(node))
        })
        .count()
}

fn add(socket: &Path, container: &str) -> Vec<IpAddr> {
    let response = pod_add_at(socket, "pods", container).unwrap();
    response.allocations.iter().map(|a| a.address).collect()
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_cluster_runs_on_per_node_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = secured(dir.path(), &["node-1", "node-10"]);
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, BLOCKS).unwrap();
    let config = config.display().to_string();
    let (code, out) = run_as(
        &etcd,
        dir.path(),
        Some("corral-t-operator"),
        &["cluster", "init"],
        &["--config", config.as_str()],
    );
    assert_eq!(code, 0, "{out}");
    let operator_args = as_user(dir.path(), "corral-t-operator");
    let operator_args: Vec<&OsStr> = operator_args.iter().map(OsStr::new).collect();
    let operator = Operator::start_with(&etcd, dir.path(), "op-a", &operator_args);
    let mut agents = Vec::new();
    // node-1 on the flags, node-10 on its configuration file's `[cluster]` table.
    let path = dir.path().join("node-1");
    let args = as_user(dir.path(), "corral-t-node-node-1");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    agents.push((
        "node-1",
        path.clone(),
        start_agent_with(&etcd, &path, "node-1", &args),
    ));
    let path = dir.path().join("node-10");
    std::fs::create_dir_all(&path).unwrap();
    let agent_toml = agent_config(&path);
    let mut text = std::fs::read_to_string(&agent_toml).unwrap();
    text.push_str(&format!(
        "\n[cluster]\netcd_user = \"corral-t-node-node-10\"\netcd_password_file = {:?}\n",
        password_file(dir.path(), "corral-t-node-node-10")
    ));
    std::fs::write(&agent_toml, text).unwrap();
    let endpoints = endpoints(&etcd);
    let args: Vec<&OsStr> = [
        "--config".as_ref(),
        agent_toml.as_os_str(),
        "--etcd".as_ref(),
        endpoints.as_ref(),
        "--cluster".as_ref(),
        "t".as_ref(),
        "--node".as_ref(),
        "node-10".as_ref(),
        "--lease-ttl".as_ref(),
        "3".as_ref(),
    ]
    .to_vec();
    agents.push((
        "node-10",
        path.clone(),
        common::Agent::start(&args, &path.join("agent.sock")),
    ));
    let reader = kv_as(&etcd, dir.path(), "corral-t-reader");
    let socket = |i: usize| agents[i].1.join("agent.sock");
    // Grants: pods on both nodes get addresses from their blocks.
    assert_eq!(add(&socket(1), "other").len(), 2);
    let mut pods = Vec::new();
    for i in 0..40 {
        pods.push(format!("p{i}"));
        assert_eq!(add(&socket(0), &pods[i]).len(), 2);
    }
    let grown = blocks_of(&reader, "node-1");
    assert!(
        grown >= 6,
        "40 pods need several blocks per family ({grown})"
    );
    // The release handshake: deleted pods give their blocks back.
    for pod in &pods {
        pod_del(&mut Client::unix(socket(0)), "pods", pod).unwrap();
    }
    wait_until(
        "node-1's excess blocks are released",
        Duration::from_secs(60),
        || blocks_of(&reader, "node-1") <= 4,
    );
    // Removal: node-10's pod goes, then the node; its agent gives its space up.
    pod_del(&mut Client::unix(socket(1)), "pods", "other").unwrap();
    let (code, out) = run_as(
        &etcd,
        dir.path(),
        Some("corral-t-operator"),
        &["node", "remove", "node-10"],
        &["--drain"],
    );
    assert_eq!(code, 0, "{out}");
    let gone = |rest: &str| {
        let key = format!("/corral/t/v1/{rest}");
        block_on(reader.get(key.as_bytes())).unwrap().is_none()
    };
    wait_until(
        "node-10's removal is done and its agent no longer live",
        Duration::from_secs(60),
        || {
            blocks_of(&reader, "node-10") == 0
                && ["nodes", "removals", "holdings", "live"]
                    .iter()
                    .all(|kind| gone(&format!("{kind}/node-10")))
        },
    );
    // The reader serves check, status and node list.
    let as_reader = |command: &[&str], extra: &[&str]| {
        run_as(&etcd, dir.path(), Some("corral-t-reader"), command, extra)
    };
    let agent_1 = socket(0).display().to_string();
    let (code, out) = as_reader(&["cluster", "check"], &["--agent", agent_1.as_str()]);
    assert_eq!(code, 0, "{out}");
    for command in [
        &["cluster", "status"][..],
        &["node", "list"],
        &["node", "show", "node-1"],
    ] {
        let (code, out) = as_reader(command, &[]);
        assert_eq!(code, 0, "{command:?}: {out}");
    }
    // And refuses to write: etcd says no.
    let (code, out) = as_reader(&["cluster", "apply"], &["--config", config.as_str()]);
    assert_ne!(code, 0);
    assert!(out.contains("permission denied"), "{out}");
    // No agent logged a refusal: every key it touched was its own.
    for (node, path, _) in &agents {
        let log = std::fs::read_to_string(path.join("agent.log")).unwrap_or_default();
        assert!(!log.contains("permission denied"), "{node}:\n{log}");
    }
    assert!(
        !operator.log().contains("permission denied"),
        "{}",
        operator.log()
    );
}
