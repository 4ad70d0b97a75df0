//! The cluster side with real processes: etcd (one member and three) started here on
//! 127.0.0.1, `corral operator` replicas and `corral agent`s as child processes, killed
//! (SIGKILL), paused (SIGSTOP) and cut off at the worst moments; every test ends with
//! `corral cluster check` (and the agents' ranges against their grants).
//!
//! Every test needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use corral_client::Client;
use corral_kv::{Kv, TxnOp};

use crate::cluster_common;
use crate::common;

use cluster_common::*;

const NEEDS: &str = "needs etcd (make deps)";

#[test]
#[ignore = "needs etcd (make deps)"]
fn agents_get_disjoint_dual_stack_cidrs_and_allocate_pods_from_them() {
    let _ = NEEDS;
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let a = start_agent(&etcd, &dir.path().join("a"), "node-a");
    let b = start_agent(&etcd, &dir.path().join("b"), "node-b");
    wait_until(
        "both agents hold two cluster ranges",
        Duration::from_secs(20),
        || agent_ranges(&a.socket).len() == 2 && agent_ranges(&b.socket).len() == 2,
    );
    let ranges_a = agent_ranges(&a.socket);
    let ranges_b = agent_ranges(&b.socket);
    // The lowest free CIDRs, the reserved /24 skipped.
    assert!(
        ranges_a
            .iter()
            .chain(&ranges_b)
            .any(|r| r.contains(" 10.192.1.0/24,gateway=10.192.1.1")),
        "{ranges_a:?} {ranges_b:?}"
    );
    assert!(ranges_a.iter().all(|r| !ranges_b.contains(r)));
    assert!(
        !ranges_a
            .iter()
            .chain(&ranges_b)
            .any(|r| r.contains("10.192.0.0/24"))
    );
    // Pods come from the node's CIDRs, never the first host (the gateway, as host-local's).
    let pod = alloc_dual(&a.socket, "pod-1");
    assert_eq!(pod.len(), 2);
    assert!(
        pod.iter().all(|a| match a {
            IpAddr::V4(v4) => v4.octets()[3] != 1,
            IpAddr::V6(v6) => v6.segments()[7] != 1,
        }),
        "{pod:?}"
    );
    for address in &pod {
        assert!(
            ranges_a
                .iter()
                .any(|r| contains(r.split(' ').nth(1).unwrap(), *address)),
            "{address} outside {ranges_a:?}"
        );
    }
    let status = Client::unix(&a.socket).status(None).unwrap();
    let cluster = status.cluster.expect("the agent reports its cluster link");
    assert!(cluster.registered && !cluster.degraded, "{cluster:?}");
    assert_eq!(cluster.grants.len(), 2);
    assert_check(&etcd, &[&a.socket, &b.socket]);
    let (code, out, _) = on_cluster(&etcd, &["node", "list"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("node-a") && out.contains("node-b"), "{out}");
    assert_counts_readable(&etcd, &a.socket);
}

/// A node's /64 once printed its capacity as a 20-digit number: tables print counts readably
/// (`2^64-…`), JSON keeps them exact (decimal strings past 2^53).
fn assert_counts_readable(etcd: &corral_etcd::testing::EtcdCluster, socket: &std::path::Path) {
    let socket = socket.to_str().unwrap();
    let too_long = |text: &str| {
        text.split(|c: char| !c.is_ascii_digit())
            .any(|digits| digits.len() > 12)
    };
    let (code, table, err) = corral(&["--socket", socket, "status"]);
    assert_eq!(code, 0, "{err}");
    let ipv6 = table
        .lines()
        .find(|l| l.contains("ipv6"))
        .expect("an ipv6 row");
    assert!(ipv6.contains(" 2^64-"), "{table}");
    assert!(!too_long(&table), "{table}");
    let (code, json, err) = corral(&["status", "--socket", socket, "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&json).unwrap();
    let capacity = status["scopes"][0]["pools"][0]["families"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["family"] == "ipv6")
        .map(|f| f["capacity"].as_str().unwrap().parse::<u128>().unwrap())
        .unwrap();
    assert!(capacity > 1 << 63, "{json}");
    for command in [&["cluster", "status"][..], &["node", "show", "node-a"]] {
        let (code, out, err) = on_cluster(etcd, command, &[]);
        assert_eq!(code, 0, "{command:?}: {err}");
        assert!(!too_long(&out), "{command:?}: {out}");
    }
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_removed_node_drains_its_cidrs_into_quarantine_and_they_come_back_later() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let a = agent_holding(&etcd, dir.path(), "a", "node-a", 2);
    let held = grants(&etcd).remove("node-a").unwrap();
    let pod = alloc_dual(&a.socket, "pod-1");
    // The agent's holdings record counts the pod (the publisher looks every few seconds).
    wait_until(
        "node-a asserts a range in use",
        Duration::from_secs(20),
        || {
            block_on(kv(&etcd).get(b"/corral/t/v1/holdings/node-a"))
                .unwrap()
                .and_then(|e| {
                    corral_cluster::decode_value::<corral_cluster::HoldingsRecord>(&e.value).ok()
                })
                .is_some_and(|r| r.ranges.iter().any(|h| h.allocations > 0))
        },
    );
    // Live with a pod: a plain removal is refused; `--drain` it is.
    let remove = |flags: &[&str]| on_cluster(&etcd, &["node", "remove", "node-a"], flags);
    let (code, out, err) = remove(&[]);
    assert_eq!(code, 1, "{out}{err}");
    let (code, out, err) = remove(&["--drain"]);
    assert_eq!(code, 0, "{out}{err}");
    wait_until("the grants are gone", Duration::from_secs(20), || {
        grants(&etcd).is_empty()
    });
    // Quarantined (or waiting for node-a to give them up): a new node does not get them.
    let kv = kv(&etcd);
    let (quarantined, _) =
        block_on(corral_kv::read_all(&kv, b"/corral/t/v1/quarantine/", 100)).unwrap();
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    // The agent drains: the pod keeps its addresses, nothing new comes from there.
    wait_until("node-a's ranges drain", Duration::from_secs(20), || {
        agent_ranges(&a.socket).is_empty()
    });
    // The agent does not register the node again behind the administrator's back (its link
    // sees the registration's deletion on its own watch, maybe after the grants').
    wait_until(
        "node-a's agent says it was removed",
        Duration::from_secs(20),
        || link_status(&a.socket).is_some_and(|c| !c.registered),
    );
    let cluster = link_status(&a.socket).unwrap();
    assert!(!cluster.registered, "{cluster:?}");
    assert!(
        cluster
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("removed"),
        "{cluster:?}"
    );
    let still = node_addresses(&a.socket);
    assert!(pod.iter().all(|p| still.contains(p)));
    register(&etcd, ["node-c".to_owned()]);
    wait_until("node-c is granted", Duration::from_secs(20), || {
        grants(&etcd).contains_key("node-c")
    });
    let c_grants = grants(&etcd).remove("node-c").unwrap();
    assert!(
        c_grants.iter().all(|g| !held.contains(g)),
        "granted from quarantine: {c_grants:?}"
    );
    // The pod goes: node-a gives its ranges up, and after the quarantine (3 s) the keys
    // expire and the space is free again.
    let mut released = Client::unix(&a.socket);
    released
        .release(&corral_api::ReleaseRequest {
            scope: "node".into(),
            address: None,
            owner: Some("pod-1".into()),
            key: None,
            generation: None,
        })
        .unwrap();
    // After the quarantine (3 s) the keys expire and the space is free again.
    wait_until("the quarantine expires", Duration::from_secs(20), || {
        block_on(corral_kv::read_all(&kv, b"/corral/t/v1/quarantine/", 100))
            .unwrap()
            .0
            .is_empty()
    });
    // node-a still holds its pod in its draining ranges and asserts them (`holdings/`): they
    // stay occupied after the quarantine until it gives them up (issue 20). Its pod goes, the
    // ranges drain and leave, and the space is free again.
    Client::unix(&a.socket)
        .release(&corral_api::ReleaseRequest {
            scope: "node".into(),
            key: None,
            address: None,
            generation: None,
            owner: Some("pod-1".into()),
        })
        .unwrap();
    wait_until(
        "node-a no longer asserts its old ranges",
        Duration::from_secs(30),
        || {
            block_on(kv.get(b"/corral/t/v1/holdings/node-a"))
                .unwrap()
                .and_then(|e| {
                    corral_cluster::decode_value::<corral_cluster::HoldingsRecord>(&e.value).ok()
                })
                // Empty, or deleted by the leader once the removal was done.
                .is_none_or(|r| r.ranges.is_empty())
        },
    );
    register(&etcd, ["node-d".to_owned()]);
    wait_until("node-d is granted", Duration::from_secs(20), || {
        grants(&etcd).contains_key("node-d")
    });
    let d_grants = grants(&etcd).remove("node-d").unwrap();
    assert_eq!(
        d_grants, held,
        "the lowest free CIDRs are node-a's old ones"
    );
    assert_check(&etcd, &[]);
    assert_invariant(&etcd, &[("node-a", &a.socket)], true);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn sigkill_of_the_leader_during_500_registrations() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    let (first, second) = leader_and_standby(&etcd, dir.path());
    let names: Vec<String> = (0..500).map(|i| format!("n{i:03}")).collect();
    let registering = {
        let endpoints = etcd.endpoints();
        let names = names.clone();
        std::thread::spawn(move || {
            let kv =
                block_on(corral_etcd::EtcdKv::connect(&endpoints, Default::default())).unwrap();
            block_on(async {
                for name in names {
                    kv.txn(registration(&name)).await.unwrap();
                }
            });
        })
    };
    wait_until("some grants landed", Duration::from_secs(30), || {
        grants(&etcd).len() >= 50
    });
    drop(first); // SIGKILL mid-burst
    registering.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while grants(&etcd).len() < 500 {
        assert!(
            Instant::now() < deadline,
            "op-b did not finish: {} of 500 granted; its log:\n{}",
            grants(&etcd).len(),
            second.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(leader(&etcd).as_deref(), Some("op-b"));
    for (node, held) in grants(&etcd) {
        assert_eq!(held.len(), 2, "{node} holds {held:?}");
    }
    assert_check(&etcd, &[]);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_paused_leader_resumed_after_a_standby_took_over_cannot_write() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    let (first, _second) = leader_and_standby(&etcd, dir.path());
    register(&etcd, (0..20).map(|i| format!("early{i}")));
    wait_until("early nodes granted", Duration::from_secs(20), || {
        grants(&etcd).len() == 20
    });
    first.signal(rustix::process::Signal::STOP);
    let paused = Instant::now();
    // Nodes registered while op-a sleeps: op-a's view (from before the pause) will propose
    // them too when it wakes, with CIDRs op-b may have granted meanwhile.
    register(&etcd, (0..50).map(|i| format!("late{i}")));
    wait_leads(&etcd, "op-b", Duration::from_secs(20));
    let took_over = paused.elapsed();
    assert!(
        took_over < Duration::from_secs(2 + 5),
        "standby took {took_over:?}"
    );
    wait_until("late nodes granted", Duration::from_secs(20), || {
        grants(&etcd).len() == 70
    });
    first.signal(rustix::process::Signal::CONT);
    register(&etcd, (0..20).map(|i| format!("after{i}")));
    wait_until("after nodes granted", Duration::from_secs(20), || {
        grants(&etcd).len() == 90
    });
    std::thread::sleep(Duration::from_secs(1));
    for (node, held) in grants(&etcd) {
        assert_eq!(held.len(), 2, "{node} holds {held:?}");
    }
    assert_check(&etcd, &[]);
    // The resumed replica noticed it lost the lead instead of writing.
    wait_until(
        "op-a says it stopped leading",
        Duration::from_secs(10),
        || first.log().contains("stopped leading"),
    );
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn one_etcd_member_of_three_killed_mid_burst() {
    let (dir, mut etcd) = initialized_in_tempdir(3, DUAL);
    let (_a, _b) = two_operators(&etcd, dir.path());
    register(&etcd, (0..100).map(|i| format!("n{i}")));
    etcd.kill(0).unwrap();
    register(&etcd, (100..200).map(|i| format!("n{i}")));
    wait_until("every node granted", Duration::from_secs(60), || {
        grants(&etcd).len() == 200
    });
    assert_check(&etcd, &[]);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn quorum_lost_agents_keep_serving_and_everything_resumes() {
    let (dir, mut etcd) = initialized_in_tempdir(3, DUAL);
    let _operator = Operator::start(&etcd, dir.path(), "op-a");
    let a = agent_holding(&etcd, dir.path(), "a", "node-a", 2);
    let before = grants(&etcd);
    etcd.kill(1).unwrap();
    etcd.kill(2).unwrap();
    // Pods keep coming and going from what the node holds.
    let mut pods = Vec::new();
    for i in 0..20 {
        pods.extend(alloc_dual(&a.socket, &format!("pod-{i}")));
    }
    assert_eq!(pods.len(), 40);
    wait_until("the agent says degraded", Duration::from_secs(30), || {
        link_status(&a.socket).is_some_and(|c| c.degraded)
    });
    assert_eq!(
        agent_ranges(&a.socket).len(),
        2,
        "nothing is dropped while etcd is away"
    );
    etcd.restart(1).unwrap();
    etcd.restart(2).unwrap();
    block_on(etcd.wait_ready_all(Duration::from_secs(30))).unwrap();
    wait_until(
        "the agent is connected again",
        Duration::from_secs(60),
        || link_status(&a.socket).is_some_and(|c| !c.degraded && c.registered),
    );
    assert_eq!(grants(&etcd), before, "nothing was granted or reclaimed");
    register(&etcd, ["node-b".to_owned()]);
    wait_until("grants resume", Duration::from_secs(60), || {
        grants(&etcd).contains_key("node-b")
    });
    assert_check(&etcd, &[&a.socket]);
}

/// The operator's `/v1/status` over its API socket, as JSON (`Null` if it does not answer).
fn operator_status(socket: &std::path::Path) -> serde_json::Value {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) else {
        return serde_json::Value::Null;
    };
    let request = "GET /v1/status HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n";
    let mut response = String::new();
    if stream.write_all(request.as_bytes()).is_err()
        || stream.read_to_string(&mut response).is_err()
    {
        return serde_json::Value::Null;
    }
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

/// The messages of the operator's current problems.
fn current_problems(operator: &Operator) -> Vec<String> {
    operator_status(&operator.socket)["current"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["message"].as_str().map(str::to_owned))
        .collect()
}

/// Issue 23: with 1 etcd member of 3 running, `cluster status` and `cluster check` asked "is
/// etcd running?" and the operator reported "tcp connect error": each names the lost quorum
/// now, and the operator's problem goes once quorum is back.
#[test]
#[ignore = "needs etcd (make deps)"]
fn a_lost_quorum_is_named_by_cluster_status_check_and_the_operator() {
    let (dir, mut etcd) = initialized_in_tempdir(3, DUAL);
    let operator = Operator::start(&etcd, dir.path(), "op-a");
    wait_leads(&etcd, "op-a", Duration::from_secs(20));
    etcd.kill(1).unwrap();
    etcd.kill(2).unwrap();
    // The survivor knows it has no leader after an election timeout; each command ends
    // within its request timeout.
    let mut answers = Vec::new();
    for subcommand in ["status", "check"] {
        loop {
            let (code, out, err) = cluster_command(&etcd, subcommand, &[]);
            assert_ne!(code, 0, "cluster {subcommand} without quorum: {out}");
            assert!(
                !err.contains("is etcd running"),
                "cluster {subcommand}: {err}"
            );
            if err.contains("etcd has lost quorum (no leader)") {
                break;
            }
            answers.push(err);
            assert!(
                answers.len() < 20,
                "never named the lost quorum: {answers:#?}"
            );
        }
    }
    wait_until(
        "the operator names the lost quorum",
        Duration::from_secs(60),
        || {
            current_problems(&operator)
                .iter()
                .any(|p| p.contains("etcd has lost quorum (no leader)"))
        },
    );
    etcd.restart(1).unwrap();
    etcd.restart(2).unwrap();
    block_on(etcd.wait_ready_all(Duration::from_secs(30))).unwrap();
    wait_until(
        "the operator leads again, its problem over",
        Duration::from_secs(60),
        || {
            let status = operator_status(&operator.socket);
            status["leading"] == serde_json::Value::Bool(true)
                && current_problems(&operator).is_empty()
        },
    );
    let events = operator_status(&operator.socket)["events"].clone();
    assert!(
        events
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["resolved"] == serde_json::Value::Bool(true)
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("lost quorum"))),
        "{events:#}"
    );
    // `cluster status --operator-socket` lists the operator's current problems with since
    // when, not the past: the lost quorum is over, a garbage key stands.
    let socket = operator.socket.to_str().unwrap().to_owned();
    let status = || cluster_command(&etcd, "status", &["--operator-socket", &socket]);
    let (code, out, err) = status();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("operator op-a: no problems\n"), "{out}");
    let garbage = "/corral/t/v1/grants/default/ipv4/not-a-cidr";
    apply(&kv(&etcd), vec![TxnOp::put(garbage, "{{{")]);
    wait_until(
        "cluster status lists the garbage key",
        Duration::from_secs(20),
        || status().1.contains("operator op-a: 1 problem\n"),
    );
    let out = status().1;
    let line = out
        .lines()
        .find(|l| l.starts_with("  since "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("Z (") && line.contains("s ago): ") && line.contains(garbage),
        "{line}"
    );
    assert!(!out.contains("lost quorum"), "{out}");
    apply(&kv(&etcd), vec![TxnOp::delete(garbage)]);
    assert_check(&etcd, &[]);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn an_agent_killed_and_restarted_keeps_its_cidrs_and_pods() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let agent_dir = dir.path().join("a");
    let a = agent_holding(&etcd, dir.path(), "a", "node-a", 2);
    let ranges = agent_ranges(&a.socket);
    let pods: BTreeSet<IpAddr> = (0..10)
        .flat_map(|i| alloc_dual(&a.socket, &format!("pod-{i}")))
        .collect();
    a.kill();
    let a = start_agent(&etcd, &agent_dir, "node-a");
    assert_eq!(
        agent_ranges(&a.socket),
        ranges,
        "the ranges are back before etcd is asked"
    );
    let held = node_addresses(&a.socket);
    assert!(pods.is_subset(&held));
    wait_until("registered again", Duration::from_secs(20), || {
        link_status(&a.socket).is_some_and(|c| c.registered)
    });
    assert_eq!(agent_ranges(&a.socket), ranges);
    assert_eq!(grants(&etcd).len(), 1);
    assert_check(&etcd, &[&a.socket]);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn a_full_pool_is_reported_and_a_garbage_key_is_skipped() {
    let (dir, etcd) = initialized_in_tempdir(
        1,
        "quarantine_secs = 2\n[[pools]]\nname = \"default\"\n[pools.ipv4]\ncidrs = [\"10.9.0.0/29\"]\nnode_prefix_len = 30\n",
    );
    // Garbage where grants live: reported, skipped, never a crash loop.
    apply(
        &kv(&etcd),
        vec![TxnOp::put(
            "/corral/t/v1/grants/default/ipv4/not-a-cidr",
            "{{{",
        )],
    );
    let operator = Operator::start(&etcd, dir.path(), "op-a");
    register(&etcd, ["n1", "n2", "n3"].map(str::to_owned));
    wait_until("two nodes granted", Duration::from_secs(20), || {
        grants(&etcd).len() == 2
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(grants(&etcd).len(), 2, "a /29 holds two /30s");
    let (code, output) = check(&etcd, &[]);
    assert_eq!(code, 5, "the garbage key is a problem: {output}");
    assert!(output.contains("not-a-cidr"), "{output}");
    apply(
        &kv(&etcd),
        vec![TxnOp::delete("/corral/t/v1/grants/default/ipv4/not-a-cidr")],
    );
    let (code, out, err) = on_cluster(&etcd, &["node", "remove", "n1"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    wait_until(
        "n3 gets n1's CIDR after the quarantine",
        Duration::from_secs(30),
        || grants(&etcd).contains_key("n3"),
    );
    assert!(
        operator.log().contains("not-a-cidr"),
        "the operator reported the garbage key"
    );
    assert_check(&etcd, &[]);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn node_ids_are_the_smallest_free_and_the_agent_uses_its_plan() {
    let (dir, etcd) = initialized_in_tempdir(1, include_str!("configs/cluster_node_ids.toml"));
    let _operator = Operator::start(&etcd, dir.path(), "op-a");
    let a = agent_holding(&etcd, dir.path(), "a", "node-a", 1);
    let ranges = agent_ranges(&a.socket);
    assert!(ranges[0].starts_with("default 10.1.1.0/24"), "{ranges:?}");
    let (code, out, err) = on_cluster(&etcd, &["node", "plan", "node-a"], &["-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["node_id"], 1, "{plan}");
    let address = alloc_v4(&a.socket, "pod").to_string();
    assert!(
        address.starts_with("10.1.1.") && address != "10.1.1.1",
        "{address}"
    );
    register(&etcd, ["node-b".to_owned(), "node-c".to_owned()]);
    wait_until("ids for b and c", Duration::from_secs(20), || {
        let kv = kv(&etcd);
        block_on(corral_kv::read_all(&kv, b"/corral/t/v1/nodeids/id/", 100))
            .unwrap()
            .0
            .len()
            == 3
    });
    let (code, out, err) = on_cluster(&etcd, &["node", "remove", "node-b"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    register(&etcd, ["node-d".to_owned()]);
    wait_until("node-d gets an id", Duration::from_secs(20), || {
        block_on(kv(&etcd).get(b"/corral/t/v1/nodeids/node/node-d"))
            .unwrap()
            .is_some()
    });
    let d = block_on(kv(&etcd).get(b"/corral/t/v1/nodeids/node/node-d"))
        .unwrap()
        .unwrap();
    let d: serde_json::Value = serde_json::from_slice(&d.value).unwrap();
    assert_eq!(
        d["id"], 4,
        "node-b's id 2 is quarantined, not reused at once"
    );
    assert_check(&etcd, &[&a.socket]);
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn the_configuration_is_written_once_and_changes_grants_rest_on_are_refused() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    let path = dir.path().join("changed.toml");
    let write = |text: &str| std::fs::write(&path, text).unwrap();
    let run = |verb: &str| cluster_command(&etcd, verb, &["--config", path.to_str().unwrap()]);
    // A second init is refused; apply is the way to change it.
    write(DUAL);
    let (code, _, err) = run("init");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("already has a configuration"), "{err}");
    // A node prefix length grants rest on cannot change.
    write(&DUAL.replace("node_prefix_len = 24", "node_prefix_len = 25"));
    let (code, _, err) = run("apply");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("node_prefix_len"),
        "the message names the field: {err}"
    );
    // A bad configuration is refused before etcd is asked, naming the field.
    write(&DUAL.replace("node_prefix_len = 64", "node_prefix_len = 129"));
    let (code, _, err) = run("apply");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("pools[0].ipv6.node_prefix_len"), "{err}");
    // What may change does: another reserved range.
    write(&DUAL.replace(
        r#"reserved = ["10.192.0.0/24"]"#,
        r#"reserved = ["10.192.0.0/24", "10.192.2.0/24"]"#,
    ));
    let (code, out, err) = run("apply");
    assert_eq!(code, 0, "{out}{err}");
    // etcd unreachable: exit code 3.
    let (code, _, err) = corral(&[
        "cluster",
        "status",
        "--etcd",
        "http://127.0.0.1:9",
        "--cluster",
        "t",
    ]);
    assert_eq!(code, 3, "{err}");
}

/// `corral operator --api-socket` naming a regular file (a configuration, say): the replica
/// reaches etcd, then refuses to bind there: exit 4 ("failed"), the API's own message after
/// `corral: operator: `, and the file left byte for byte.
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_operator_whose_api_socket_is_a_regular_file_stops_naming_it_and_keeps_it() {
    let (dir, etcd) = initialized_in_tempdir(1, DUAL);
    let path = dir.path().join("operator.toml");
    std::fs::write(&path, b"keep me\n").unwrap();
    let output = std::process::Command::new(common::BINARY)
        .args(["operator", "--etcd", &endpoints(&etcd), "--cluster", "t"])
        .arg("--api-socket")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("corral: operator: ") && last.contains(&path.display().to_string()),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me\n");
}

/// The agent's configuration file may name the cluster it joins (`[cluster]` `endpoints` and
/// `name`, the operator's table): without `--etcd` and `--cluster` it registers and is
/// granted its ranges; without `--node` it refuses to start, naming the file's table.
#[test]
#[ignore = "needs etcd (make deps)"]
fn an_agent_joins_the_cluster_its_configuration_file_names() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(DUAL);
    let agent_dir = dir.path().join("a");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let config = agent_config(&agent_dir);
    let text = std::fs::read_to_string(&config).unwrap();
    let table = format!(
        "\n[cluster]\nendpoints = {:?}\nname = \"t\"\n",
        etcd.endpoints()
    );
    std::fs::write(&config, text + &table).unwrap();
    let (code, _, err) = corral(&["agent", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("the configuration file's [cluster] endpoints need --node NAME"),
        "{err}"
    );
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--node".as_ref(),
        "node-a".as_ref(),
    ];
    let a = common::Agent::start(&args, &agent_dir.join("agent.sock"));
    wait_ranges("node-a holds its ranges", &a.socket, 2, 20);
    assert_eq!(grants(&etcd)["node-a"].len(), 2, "{:?}", grants(&etcd));
    assert_check(&etcd, &[&a.socket]);
}
