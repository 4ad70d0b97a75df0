//! One path installs a configuration (issue 20), with real processes: etcd, `corral operator` replicas and `corral agent`s as child processes.
//!
//! A configuration written around the CLI (a raw etcd put, as etcdctl or a GitOps tool would)
//! is held to `cluster apply`'s rules by the watch, a restart and a failover; `cluster apply`
//! refuses what would free held space and the limits etcd imposes; node IDs never wrap. Every
//! test ends with `corral cluster check --agent` and the independent invariant check.
//!
//! Every test needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::path::Path;
use std::time::Duration;

use corral_cluster::ClusterConfig;
use corral_etcd::testing::EtcdCluster;
use corral_kv::{Kv, TxnOp};

use crate::cluster_common;
use crate::common;

use cluster_common::*;

const CONFIG: &str = include_str!("configs/config_paths.toml");

fn renamed() -> String {
    CONFIG.replace("\"default\"", "\"pods\"")
}

fn longer_prefix() -> String {
    CONFIG.replace("node_prefix_len = 24", "node_prefix_len = 25")
}

/// Puts `value` under the cluster's `config` key with a raw etcd put, as etcdctl would.
fn put_config_raw(etcd: &EtcdCluster, value: &[u8]) {
    let kv = kv(etcd);
    apply(&kv, vec![TxnOp::put("/corral/t/v1/config", value.to_vec())]);
}

fn put_toml_raw(etcd: &EtcdCluster, toml: &str) {
    let json = ClusterConfig::from_toml(toml).unwrap().to_json().unwrap();
    put_config_raw(etcd, json.as_bytes());
}

/// The `config` key's value.
fn stored(etcd: &EtcdCluster) -> Option<Vec<u8>> {
    let kv = kv(etcd);
    block_on(kv.get(b"/corral/t/v1/config"))
        .unwrap()
        .map(|e| e.value)
}

/// `corral cluster <verb> --config FILE [extra]` with `toml` written to FILE.
fn cluster_config(
    etcd: &EtcdCluster,
    dir: &Path,
    verb: &str,
    toml: &str,
    extra: &[&str],
) -> (i32, String) {
    let path = dir.join(format!("{verb}.toml"));
    std::fs::write(&path, toml).unwrap();
    let mut args = vec!["--config", path.to_str().unwrap()];
    args.extend(extra);
    let (code, out, err) = cluster_command(etcd, verb, &args);
    (code, format!("{out}{err}"))
}

fn status(etcd: &EtcdCluster) -> String {
    let (code, out, err) = cluster_command(etcd, "status", &[]);
    assert_eq!(code, 0, "{out}{err}");
    out
}

/// The agents' cluster ranges as `pool range`, both agents together.
fn ranges_of(agents: &[&common::Agent]) -> Vec<String> {
    agents
        .iter()
        .flat_map(|a| agent_ranges(&a.socket))
        .collect()
}

/// Agents `[a, b]` (nodes node-a and node-0) after three resyncs' worth of time for anything to
/// be granted: no address twice, a range each and each as `expected` says, and node-0 hands
/// out an address that is not node-a's `pod_a`.
fn settled(
    etcd: &EtcdCluster,
    [a, b]: [&common::Agent; 2],
    pod_a: std::net::IpAddr,
    expected: impl Fn(&String) -> bool,
) {
    std::thread::sleep(Duration::from_secs(3));
    let agents = [
        ("node-a", a.socket.as_path()),
        ("node-0", b.socket.as_path()),
    ];
    assert_invariant(etcd, &agents, true);
    let ranges = ranges_of(&[a, b]);
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert!(ranges.iter().all(expected), "{ranges:?}");
    let pod_b = alloc_v4(&b.socket, "pod-b");
    assert_ne!(pod_a, pod_b);
    assert_invariant(etcd, &agents, true);
}

/// `cluster apply` of `CONFIG` again: the problem goes from the status, `cluster check` of
/// agents `[a, b]` (node-a, node-0) finds nothing and no address is held twice.
fn put_back(etcd: &EtcdCluster, dir: &Path, [a, b]: [&common::Agent; 2]) {
    let (code, out) = cluster_config(etcd, dir, "apply", CONFIG, &[]);
    assert_eq!(code, 0, "{out}");
    wait_until("the problem is gone", Duration::from_secs(30), || {
        !status(etcd).contains("not applied")
    });
    assert_check(etcd, &[&a.socket, &b.socket]);
    let agents = [
        ("node-a", a.socket.as_path()),
        ("node-0", b.socket.as_path()),
    ];
    assert_invariant(etcd, &agents, true);
}

/// Issue 20: a renamed pool written with etcdctl was refused by the watch ("not applied"), but
/// a restarted operator installed it from its full read: 10.244.0.0/24 was granted again to a
/// second node and both agents handed out 10.244.0.2.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_renamed_pool_written_around_the_cli_is_not_installed_when_the_operator_restarts() {
    let (dir, etcd, operator) = cluster_with_operator_in_tempdir(CONFIG);
    let a = agent_holding(&etcd, dir.path(), "a", "node-a", 1);
    assert!(agent_ranges(&a.socket)[0].contains("10.244.0.0/24"));
    let pod_a = alloc_v4(&a.socket, "pod-a");
    // `cluster apply` refuses the rename, naming the grant.
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &renamed(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("10.244.0.0/24 (node node-a)"), "{out}");
    // Written around the CLI; node-0 (first in the leader's order) comes meanwhile.
    put_toml_raw(&etcd, &renamed());
    let b = agent_holding(&etcd, dir.path(), "b", "node-0", 1);
    // The operator restarts: a full read.
    drop(operator);
    let _operator = Operator::start(&etcd, dir.path(), "op-b");
    wait_leads(&etcd, "op-b", Duration::from_secs(30));
    settled(&etcd, [&a, &b], pod_a, |r| r.starts_with("default "));
    assert!(status(&etcd).contains("not applied"));
    // `cluster check` names the refused configuration (exit 5); `status` shows it.
    let (code, output) = check(&etcd, &[&a.socket, &b.socket]);
    assert_eq!(code, 5, "{output}");
    assert!(output.contains("is not applied"), "{output}");
    assert!(
        output.contains("pool default ipv4 is not configured"),
        "{output}"
    );
    // Putting the configuration back with `cluster apply` clears it.
    put_back(&etcd, dir.path(), [&a, &b]);
}

/// The same with a changed node prefix length, three etcd members and two operators: the
/// standby that takes over after the leader is killed keeps the last good configuration
/// (`config-applied`), and a node registered after the failover gets a /24.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_changed_node_prefix_length_is_not_installed_by_a_failover() {
    let (dir, etcd) = initialized_in_tempdir(3, CONFIG);
    let (op_a, op_b) = leader_and_standby(&etcd, dir.path());
    let a = agent_holding(&etcd, dir.path(), "a", "node-a", 1);
    let pod_a = alloc_v4(&a.socket, "pod-a");
    put_toml_raw(&etcd, &longer_prefix());
    wait_until("the leader refuses it", Duration::from_secs(20), || {
        op_a.log().contains("not applied")
    });
    op_a.signal(rustix::process::Signal::KILL);
    wait_leads(&etcd, "op-b", Duration::from_secs(30));
    let b = start_agent(&etcd, &dir.path().join("b"), "node-0");
    wait_ranges("node-0 holds its CIDR", &b.socket, 1, 30);
    settled(&etcd, [&a, &b], pod_a, |r| r.contains("/24"));
    wait_until("op-b reports the refusal", Duration::from_secs(30), || {
        op_b.log().contains("node_prefix_len")
    });
    put_back(&etcd, dir.path(), [&a, &b]);
    drop(op_a);
}

/// `cluster apply` refuses a reserved range over grants (naming them) and a quarantine longer
/// than etcd's longest lease, replaces an unreadable stored configuration only with `--force`
/// (which still refuses what would free held space), and `cluster check` on a cluster without
/// a configuration exits 1 naming it. Every refusal changes nothing.
#[test]
#[ignore = "needs etcd (make deps)"]
fn apply_refuses_what_would_free_held_space_and_what_etcd_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = start_etcd(1);
    // A quarantine etcd cannot hold is refused at init, naming the field; nothing is written.
    let too_long = CONFIG.replace("quarantine_secs = 3", "quarantine_secs = 9000000001");
    let (code, out) = cluster_config(&etcd, dir.path(), "init", &too_long, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("quarantine_secs"), "{out}");
    assert!(out.contains("9000000000"), "{out}");
    assert_eq!(stored(&etcd), None);
    // `check` of a cluster without a configuration (a typo in --cluster) is an error.
    let (code, out, err) = corral(&[
        "cluster",
        "check",
        "--etcd",
        &endpoints(&etcd),
        "--cluster",
        "tpyo",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("cluster tpyo has no configuration"), "{err}");
    init(&etcd, dir.path(), CONFIG);
    let _operator = Operator::start(&etcd, dir.path(), "op-a");
    let a = start_agent(&etcd, &dir.path().join("a"), "node-a");
    let b = start_agent(&etcd, &dir.path().join("b"), "node-b");
    wait_until("both hold a CIDR", Duration::from_secs(20), || {
        agent_ranges(&a.socket).len() == 1 && agent_ranges(&b.socket).len() == 1
    });
    let before = stored(&etcd);
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &too_long, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("quarantine_secs"), "{out}");
    // A demand write budget of none (issue 25) is refused, naming the field.
    let no_budget = format!("demand_writes_per_sec = 0\n{CONFIG}");
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &no_budget, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("demand_writes_per_sec: must be at least 1"),
        "{out}"
    );
    assert_eq!(stored(&etcd), before);
    // A reserved range over both grants: refused, naming them.
    let reserved = format!("{CONFIG}reserved = [\"10.244.0.0/23\"]\n");
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &reserved, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("pools[0].ipv4.reserved[0]"), "{out}");
    assert!(out.contains("(node node-a)"), "{out}");
    assert!(out.contains("(node node-b)"), "{out}");
    assert_eq!(stored(&etcd), before);
    // One beside the grants is applied.
    let beside = format!("{CONFIG}reserved = [\"10.244.3.0/24\"]\n");
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &beside, &[]);
    assert_eq!(code, 0, "{out}");
    // An unreadable stored configuration: refused without --force, and --force still
    // refuses what would free held space.
    put_config_raw(&etcd, b"{\"pools\": garbage");
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &beside, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("--force"), "{out}");
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &renamed(), &["--force"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("pool default"), "{out}");
    assert_eq!(stored(&etcd).as_deref(), Some(&b"{\"pools\": garbage"[..]));
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &beside, &["--force"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = cluster_config(&etcd, dir.path(), "init", &beside, &["--force"]);
    assert_eq!(code, 2, "{out}");
    // The operator serves a third node under it.
    let c = agent_holding(&etcd, dir.path(), "c", "node-c", 1);
    for agent in [&a, &b, &c] {
        alloc_v4(&agent.socket, "pod");
    }
    assert_check(&etcd, &[&a.socket, &b.socket, &c.socket]);
    let agents = [
        ("node-a", a.socket.as_path()),
        ("node-b", b.socket.as_path()),
        ("node-c", c.socket.as_path()),
    ];
    assert_invariant(&etcd, &agents, true);
}

const NODE_IDS: &str = include_str!("configs/node_ids.toml");

/// Contiv's `TestExceededVxlanRange`: with a /28 VXLAN network node 17 got node 1's VXLAN IP.
/// A node-ID range beyond a network of the plan is refused by `init` and `apply` (exit 2,
/// naming the network and the numbers) and changes nothing; without `max_node_id` the range
/// is what every network holds (14 here).
#[test]
#[ignore = "needs etcd (make deps)"]
fn init_and_apply_refuse_a_node_id_range_beyond_a_network_of_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = start_etcd(1);
    let too_many = format!("{NODE_IDS}max_node_id = 20\n");
    let (code, out) = cluster_config(&etcd, dir.path(), "init", &too_many, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("node_ids.max_node_id"), "{out}");
    assert!(out.contains("node_ids.vxlan 192.168.30.0/28"), "{out}");
    assert!(out.contains("20 node IDs"), "{out}");
    assert!(out.contains("addresses for 14 nodes"), "{out}");
    assert_eq!(stored(&etcd), None);
    init(&etcd, dir.path(), &format!("{NODE_IDS}max_node_id = 14\n"));
    let before = stored(&etcd);
    let (code, out) = cluster_config(&etcd, dir.path(), "apply", &too_many, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("node_ids.vxlan"), "{out}");
    assert_eq!(stored(&etcd), before);
    let _operator = Operator::start(&etcd, dir.path(), "op-a");
    let a = agent_holding(&etcd, dir.path(), "a", "node-a", 1);
    let (code, out, err) = cluster_command(&etcd, "status", &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("node-ids"), "{out}");
    assert!(out.contains("14"), "{out}");
    alloc_v4(&a.socket, "pod");
    assert_check(&etcd, &[&a.socket]);
    // The plan's pod range is no `grants/` key: not strict.
    assert_invariant(&etcd, &[("node-a", a.socket.as_path())], false);
}
