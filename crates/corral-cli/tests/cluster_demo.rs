//! `scripts/cluster-demo.sh`, the cluster on one machine of docs/cluster.md, run as written
//! (once pasted, it failed: nothing waited for the daemons, so `node list` was empty and
//! `alloc`, `check` and `node remove` failed). Needs Debian's etcd and etcdctl (`make deps`).

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

/// A client port whose next port (etcd's peer port) is free too.
fn two_free_ports() -> u16 {
    loop {
        let client = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = client.local_addr().unwrap().port();
        if port < u16::MAX && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn the_cluster_demo_script_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let etcd = corral_etcd::testing::etcd_binary().expect("etcd (make deps)");
    let etcdctl = corral_etcd::testing::etcdctl_binary().expect("etcdctl (make deps)");
    let output = Command::new("sh")
        .arg("scripts/cluster-demo.sh")
        .current_dir(&root)
        .env("CORRAL", env!("CARGO_BIN_EXE_corral"))
        .env("DEMO_DIR", dir.path())
        .env("ETCD_PORT", two_free_ports().to_string())
        .env("ETCD", etcd)
        .env("ETCDCTL", etcdctl)
        .env_remove("CORRAL_SOCKET")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    // Each step in order, with what it printed.
    let mut rest = stdout.as_ref();
    for expected in [
        "# ready: etcd answers\n",
        "cluster default: configuration written",
        "# ready: an operator leads\n",
        "# ready: node-a serves its CIDRs\n",
        "# ready: node-b serves its CIDRs\n",
        "$ corral node list",
        "node-a                   yes         - default ipv4 10.244.",
        "node-b                   yes         - default ipv4 10.244.",
        "$ corral --socket a/agent.sock alloc --owner pod-1 --family dual\n",
        "10.244.",
        "fd00:10:244:",
        "$ corral cluster check",
        ": ok\n",
        "# refused (exit 1): node-a is live and has pod-1\n",
        "node node-a: removal requested (drain: it takes no new pods)",
        "$ corral node show node-a",
        "node node-a: removed, removal draining (drain, asked ",
        "waiting",
        "$ corral --socket a/agent.sock release --owner pod-1",
        "node node-a: removed, removal done",
        "quarantined",
        "$ corral cluster status",
        "1 node (1 served, 0 waiting)",
        "# done:",
    ] {
        let Some(at) = rest.find(expected) else {
            panic!("missing, in order: {expected:?}\n{stdout}{stderr}");
        };
        rest = &rest[at + expected.len()..];
    }
    assert!(
        stderr.contains("corral: node node-a is live and holds 2 allocation(s)"),
        "{stderr}"
    );
    // No node line of the list waits for anything.
    let list = stdout
        .split("$ corral node list")
        .nth(1)
        .and_then(|s| s.split("$ corral").next())
        .unwrap();
    for line in list.lines().filter(|l| l.starts_with("node-")) {
        assert!(line.trim_end().ends_with("/64"), "{line}");
    }
}
