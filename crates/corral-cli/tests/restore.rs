//! etcd going back in time, with real processes (issue 20): etcd restored from a snapshot taken
//! earlier (3 members, `etcdctl snapshot save` / `snapshot restore`), and etcd wiped and
//! `corral cluster init`ed again (1 member). Agents assert what they hold (`holdings/<node>`),
//! operators and agents remember the highest revision and the cluster ID they saw: the leader
//! stops granting, reports the regression, and grants again once the live agents' assertions
//! were read back; no address is ever on two nodes.
//!
//! Every test needs Debian's etcd and etcdctl (`make deps`) and is ignored by a plain
//! `cargo test`.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use corral_api::{FamilyChoice, ReleaseRequest};
use corral_client::Client;

use crate::cluster_common;

use cluster_common::*;

const V4: &str = include_str!("configs/restore.toml");

/// Allocates `n` IPv4 pod addresses from the node's cluster pool, owned by `owner`.
fn pods(socket: &Path, owner: &str, n: usize) -> Vec<IpAddr> {
    let mut client = Client::unix(socket);
    (0..n)
        .map(|_| {
            client
                .allocate(&node_request(FamilyChoice::Ipv4, owner))
                .unwrap()
                .allocations[0]
                .address
        })
        .collect()
}

fn release_owner(socket: &Path, owner: &str) {
    Client::unix(socket)
        .release(&ReleaseRequest {
            scope: "node".into(),
            key: None,
            address: None,
            generation: None,
            owner: Some(owner.into()),
        })
        .unwrap();
}

/// The node's active cluster CIDRs.
fn active(socket: &Path) -> Vec<String> {
    agent_ranges(socket)
        .iter()
        .map(|r| r.split([' ', ',']).nth(1).unwrap_or_default().to_owned())
        .collect()
}

/// The cluster ranges an agent holds, draining ones too, as CIDRs.
fn held(socket: &Path) -> Vec<String> {
    let Ok(pools) = Client::unix(socket).pools(Some("node")) else {
        return Vec::new();
    };
    pools
        .pools
        .iter()
        .flat_map(|p| &p.ranges)
        .filter(|r| r.source == corral_api::RangeSource::Cluster)
        .map(|r| r.range.split(',').next().unwrap_or_default().to_owned())
        .collect()
}

/// The CIDRs `holdings/<node>` lists (empty without a record).
fn holdings(etcd: &corral_etcd::testing::EtcdCluster, node: &str) -> Vec<String> {
    let key = format!("/corral/t/v1/holdings/{node}");
    block_on(corral_kv::Kv::get(&kv(etcd), key.as_bytes()))
        .ok()
        .flatten()
        .and_then(|e| corral_cluster::decode_value::<corral_cluster::HoldingsRecord>(&e.value).ok())
        .map(|r| r.ranges.iter().map(|r| r.cidr.to_string()).collect())
        .unwrap_or_default()
}

fn wait_for_a_cidr(socket: &Path, what: &str) -> String {
    wait_until(what, Duration::from_secs(60), || active(socket).len() == 1);
    active(socket).remove(0)
}

fn operator_logs(operators: &[&Operator]) -> String {
    operators
        .iter()
        .map(|o| o.log())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_restored_snapshot_never_gives_a_held_cidr_to_another_node() {
    let (dir, mut etcd) = initialized_in_tempdir(3, V4);
    let (op_a, op_b) = two_operators(&etcd, dir.path());
    let a = start_agent(&etcd, &dir.path().join("a"), "node-a");
    let cidr_a = wait_for_a_cidr(&a.socket, "node-a holds a CIDR");
    pods(&a.socket, "pods-a", 3);
    // The backup, taken early.
    let snapshot = dir.path().join("backup.db");
    etcd.snapshot_save(&snapshot).unwrap();
    // More nodes register after it.
    let b = start_agent(&etcd, &dir.path().join("b"), "node-b");
    let cidr_b = wait_for_a_cidr(&b.socket, "node-b holds a CIDR");
    assert_ne!(cidr_a, cidr_b);
    let pods_b = pods(&b.socket, "pods-b", 3);
    wait_until(
        "node-b asserts what it holds",
        Duration::from_secs(30),
        || holdings(&etcd, "node-b").contains(&cidr_b),
    );
    // Time passes in etcd between a backup and its restore (here: writes outside the
    // cluster's prefix), as it does in any cluster that runs for a while.
    let elsewhere = kv(&etcd);
    block_on(async {
        let kv = elsewhere;
        for i in 0..200 {
            let txn = corral_kv::Txn {
                compares: vec![],
                success: vec![corral_kv::TxnOp::put(format!("/elsewhere/{i}"), "x")],
                failure: vec![],
            };
            corral_kv::Kv::txn(&kv, txn).await.unwrap();
        }
    });
    // The operators saw etcd's time go on (a standby reads etcd's header every second, the
    // leader every few seconds), as they would in a cluster that ran for a while.
    let latest = block_on(corral_kv::Kv::header(&kv(&etcd)))
        .unwrap()
        .revision;
    wait_until(
        "both operators saw etcd's latest revision",
        Duration::from_secs(30),
        || op_a.revision_seen() >= latest && op_b.revision_seen() >= latest,
    );
    // etcd is restored from the snapshot: node-b's registration and grant are forgotten.
    block_on(etcd.restore(&snapshot)).unwrap_or_else(|e| panic!("{e}"));
    // The next node registers.
    let c = start_agent(&etcd, &dir.path().join("c"), "node-c");
    let cidr_c = wait_for_a_cidr(&c.socket, "node-c holds a CIDR (granting resumed)");
    let pods_c = pods(&c.socket, "pods-c", 3);
    let agents = [
        ("node-a", a.socket.as_path()),
        ("node-b", b.socket.as_path()),
        ("node-c", c.socket.as_path()),
    ];
    assert_ne!(
        cidr_c, cidr_b,
        "node-c got node-b's CIDR: {pods_b:?} {pods_c:?}"
    );
    assert_invariant(&etcd, &agents, false);
    // The regression was seen and said, loudly.
    let logs = operator_logs(&[&op_a, &op_b]);
    assert!(logs.contains("etcd went back in time"), "{logs}");
    // node-b asserted its old CIDR (still serving its pods) and got a new grant; its old
    // range drains. Once its pods are gone it gives the range up, and the check is clean.
    wait_showing(
        "node-b holds a new grant beside its draining CIDR",
        Duration::from_secs(60),
        || active(&b.socket).len() == 1 && active(&b.socket)[0] != cidr_b,
        || {
            format!(
                "node-b holds {:?}\n--- node-b\n{}\n--- operators\n{}",
                held(&b.socket),
                b.log(),
                operator_logs(&[&op_a, &op_b])
            )
        },
    );
    assert!(held(&b.socket).contains(&cidr_b));
    assert_invariant(&etcd, &agents, false);
    // `cluster check`, from etcd alone, names the holding etcd forgot.
    let (code, output) = check(&etcd, &[]);
    assert_eq!(code, 5, "{output}");
    assert!(
        output.contains(&format!("holds {cidr_b} of pool default"))
            && output.contains("without a grant"),
        "{output}"
    );
    // `cluster recover` without --yes says what it would do and does nothing.
    let endpoints = endpoints(&etcd);
    let (code, out, err) = corral(&["cluster", "recover", "--etcd", &endpoints, "--cluster", "t"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("nothing done: run again with --yes"), "{out}");
    release_owner(&b.socket, "pods-b");
    wait_until(
        "node-b no longer asserts its old CIDR",
        Duration::from_secs(30),
        || !holdings(&etcd, "node-b").contains(&cidr_b),
    );
    let sockets = [a.socket.as_path(), b.socket.as_path(), c.socket.as_path()];
    wait_until("cluster check is clean", Duration::from_secs(30), || {
        check(&etcd, &sockets).0 == 0
    });
    assert_check(&etcd, &sockets);
    assert_invariant(&etcd, &agents, true);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_wiped_and_reinitialised_etcd_never_gives_a_held_cidr_to_another_node() {
    let (dir, mut etcd) = initialized_in_tempdir(1, V4);
    let op_a = Operator::start(&etcd, dir.path(), "op-a");
    let a = start_agent(&etcd, &dir.path().join("a"), "node-a");
    let cidr_a = wait_for_a_cidr(&a.socket, "node-a holds a CIDR");
    pods(&a.socket, "pods-a", 3);
    let b = start_agent(&etcd, &dir.path().join("b"), "node-b");
    let cidr_b = wait_for_a_cidr(&b.socket, "node-b holds a CIDR");
    pods(&b.socket, "pods-b", 3);
    // etcd is lost and made again from nothing, and the cluster initialised again.
    block_on(etcd.wipe()).unwrap_or_else(|e| panic!("{e}"));
    init(&etcd, dir.path(), V4);
    let c = start_agent(&etcd, &dir.path().join("c"), "node-c");
    let cidr_c = wait_for_a_cidr(&c.socket, "node-c holds a CIDR (granting resumed)");
    pods(&c.socket, "pods-c", 3);
    assert_ne!(cidr_c, cidr_a);
    assert_ne!(cidr_c, cidr_b);
    let agents = [
        ("node-a", a.socket.as_path()),
        ("node-b", b.socket.as_path()),
        ("node-c", c.socket.as_path()),
    ];
    assert_invariant(&etcd, &agents, false);
    let logs = op_a.log();
    assert!(logs.contains("etcd went back in time"), "{logs}");
    // Every old node asserted its CIDR again; once their pods are gone the check is clean.
    for (node, socket, owner) in [
        ("node-a", &a.socket, "pods-a"),
        ("node-b", &b.socket, "pods-b"),
    ] {
        wait_until(
            &format!("{node} holds a grant again"),
            Duration::from_secs(60),
            || active(socket).len() == 1,
        );
        release_owner(socket, owner);
    }
    let sockets = [a.socket.as_path(), b.socket.as_path(), c.socket.as_path()];
    wait_until("cluster check is clean", Duration::from_secs(60), || {
        check(&etcd, &sockets).0 == 0
    });
    assert_invariant(&etcd, &agents, true);
}
