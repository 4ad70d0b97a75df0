//! The grants' history with real processes (issue 23, "History", cluster side): etcd, two
//! `corral operator`s and two `corral agent`s on a block pool of one block. node-a holds the
//! block and gives a pod address X from it; node-a dies and is removed (`--force`); after its
//! silence and the quarantine the block goes to node-b. `corral cluster history X --at T1`
//! names node-a, `--at T2` names node-b (T1 and T2 taken from the events themselves, as an
//! operator reads them with `-o json`), `--node node-a` lists what node-a held and why it
//! ended, and `corral cluster check` passes with the history beside the grants. Then node-b
//! gives X to another pod, and `corral history X --at T --etcd` on node-b answers both halves
//! cluster-wide: whose block held X (etcd) and which of node-b's pods held it (its agent).
//!
//! Needs Debian's etcd (`make deps`); ignored by a plain `cargo test`.

use std::net::IpAddr;
use std::time::Duration;

use corral_api::operator::{GrantEvent, GrantHistory};

use crate::cluster_common;
use crate::common;

use cluster_common::*;

/// One IPv4 /28 block in the whole pool; 2 s quarantine.
fn one_block() -> String {
    block_pool(2, "10.82.0.0/28")
}

/// `corral cluster history ARGS` (exit code, stdout, stderr).
fn history(etcd: &corral_etcd::testing::EtcdCluster, args: &[&str]) -> (i32, String, String) {
    cluster_command(etcd, "history", args)
}

/// `corral cluster history ARGS -o json`'s events.
fn events(etcd: &corral_etcd::testing::EtcdCluster, args: &[&str]) -> Vec<GrantEvent> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let (code, out, err) = history(etcd, &all);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str::<GrantHistory>(&out)
        .unwrap_or_else(|e| panic!("{e}: {out}"))
        .events
}

/// A time in milliseconds as RFC 3339 in UTC with milliseconds (`2026-11-27T14:02:00.123Z`).
fn rfc3339(ms: u64) -> String {
    corral_api::history::format_time(ms)
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn cluster_history_names_who_held_an_address_before_and_after_the_block_moved() {
    let (dir, etcd) = initialized_in_tempdir(1, &one_block());
    let _operators = leader_and_standby(&etcd, dir.path());
    let a = start_agent(&etcd, &dir.path().join("a"), "node-a");
    let response = common::pod_add_at(&a.socket, "pods", "p1").expect("node-a gets the block");
    let x: IpAddr = response.allocations[0].address;
    assert!(x.to_string().starts_with("10.82.0."), "{x}");
    // node-b waits: the pool's one block is node-a's.
    let b = start_agent(&etcd, &dir.path().join("b"), "node-b");
    let held = events(&etcd, &[&x.to_string()]);
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (
            held[0].node.as_str(),
            held[0].cidr.as_str(),
            held[0].to_ms,
            held[0].why.as_deref()
        ),
        ("node-a", "10.82.0.0/28", None, None)
    );
    let t1 = held[0].from_ms.expect("the grant names its start");
    // node-a's machine dies; it is removed by force; after its silence and the quarantine
    // the block is node-b's.
    a.kill();
    let (code, output) = remove(&etcd, "node-a", &["--force"]);
    assert_eq!(code, 0, "{output}");
    wait_until("node-b holds the block", Duration::from_secs(60), || {
        grants(&etcd).contains_key("node-b")
    });
    let moved = events(&etcd, &[&x.to_string()]);
    let names: Vec<&str> = moved.iter().map(|e| e.node.as_str()).collect();
    assert_eq!(names, ["node-b", "node-a"], "newest first: {moved:?}");
    let (b_now, a_then) = (&moved[0], &moved[1]);
    assert_eq!(
        (a_then.from_ms, a_then.why.as_deref()),
        (Some(t1), Some("node_removed"))
    );
    let a_end = a_then.to_ms.expect("node-a's grant ended");
    let t2 = b_now.from_ms.expect("node-b's grant names its start");
    assert!(t1 < a_end && a_end <= t2, "{moved:?}");
    // Who held X at T1 (milliseconds) and at T2 (RFC 3339): node-a, then node-b.
    let (code, out, err) = history(&etcd, &[&x.to_string(), "--at", &t1.to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("node-a") && !out.contains("node-b"), "{out}");
    assert!(out.contains("node_removed"), "{out}");
    let (code, out, err) = history(&etcd, &[&x.to_string(), "--at", &rfc3339(t2)]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("node-b") && !out.contains("node-a"), "{out}");
    assert!(out.contains("held"), "{out}");
    // The same through the block's CIDR, and node-a's own history.
    assert_eq!(events(&etcd, &["10.82.0.0/28"]), moved);
    assert_eq!(
        events(&etcd, &["--node", "node-a"]),
        std::slice::from_ref(a_then)
    );
    // Nobody held X before node-a; bad input is a usage error.
    let (code, out, _) = history(&etcd, &[&x.to_string(), "--at", &(t1 - 1).to_string()]);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            format!("no grant of {x} at {} in the cluster's history\n", t1 - 1).as_str()
        )
    );
    let (code, _, err) = history(&etcd, &["10.82.0.1", "--at", "noon"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--at"), "{err}");
    wait_ranges("node-b serves the block", &b.socket, 1, 30);

    // X again, on node-b: `corral history --etcd` joins the cluster's grants and the agent's.
    let again = common::pod_add_at(&b.socket, "pods", "p2").expect("node-b gives an address");
    assert_eq!(
        again.allocations[0].address, x,
        "the block's first address again"
    );
    // `corral history X --at AT` through node-b's agent: the cluster's part names `node` (and
    // not `other`), the agent's says the address is `held`.
    let on_b = |at: &str, node: &str, other: &str, held: &str| {
        let socket = b.socket.display().to_string();
        let x = x.to_string();
        let (code, out, err) = on_cluster(
            &etcd,
            &["--socket", &socket, "history", &x, "--at", at],
            &[],
        );
        assert_eq!(code, 0, "{out}{err}");
        let (cluster, agent) = out.split_once("this node's agent").expect(&out);
        assert!(cluster.contains(node) && !cluster.contains(other), "{out}");
        assert!(agent.contains(held), "{out}");
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let now = rfc3339(u64::try_from(now.as_millis()).unwrap());
    on_b(&now, "node-b", "node-a", "held by pod/p2");
    // At T1 the block was node-a's; node-b's agent held nothing then.
    on_b(&t1.to_string(), "node-a", "node-b", "held by nobody");
    // --node needs etcd, and asks no agent.
    let (code, _, err) = corral(&["history", "--node", "node-a"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--etcd"), "{err}");
    let (code, out, err) = on_cluster(&etcd, &["history", "--node", "node-a", "-o", "json"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect(&out);
    assert_eq!(json["cluster"]["events"][0]["why"], "node_removed", "{out}");
    assert!(json.get("events").is_none(), "no agent was asked: {out}");
    assert_check(&etcd, &[&b.socket]);
}
