//! Why a pod has no address, with real processes (issue 23): etcd started here on 127.0.0.1,
//! `corral operator` and `corral agent`s as child processes. The leader publishes why it
//! cannot serve a node (`owned/<node>/waiting`), the agent's ADD error names that cause, and
//! `corral explain` walks the chain to the first broken link: the exhausted pool for a pod
//! that failed, the quarantine for a node waiting on one, the failover for a node waiting
//! through one, etcd's quorum for a degraded agent.
//!
//! Needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use std::path::Path;
use std::time::Duration;

use corral_etcd::testing::EtcdCluster;
use corral_kv::Kv as _;

use crate::cluster_common;
use crate::common;

use cluster_common::*;

/// Two /28 blocks of IPv4, a long quarantine; a node's watermarks ask for one block.
fn two_blocks() -> String {
    block_pool(300, "10.91.0.0/27")
}

/// The leader's record of why node waits, if there is one.
fn waiting_record(etcd: &EtcdCluster, node: &str) -> Option<String> {
    let kv = kv(etcd);
    block_on(kv.get(format!("/corral/t/v1/owned/{node}/waiting").as_bytes()))
        .ok()
        .flatten()
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
}

/// `corral explain ARGS --etcd E --cluster t EXTRA`: (exit code, stdout, stderr).
fn explain(etcd: &EtcdCluster, args: &[&str], extra: &[&str]) -> (i32, String, String) {
    let endpoints = endpoints(etcd);
    let mut all = vec!["explain"];
    all.extend(args);
    all.extend(["--etcd", &endpoints, "--cluster", "t"]);
    all.extend(extra);
    corral(&all)
}

/// The line of `link` in explain's table (after its subject line).
fn link_line<'a>(table: &'a str, link: &str) -> &'a str {
    table
        .lines()
        .skip(1)
        .find(|l| l.trim_start().starts_with(&format!("{link} ")))
        .unwrap_or_else(|| panic!("no {link} line in\n{table}"))
}

/// A CNI ADD of `container` to pool `pods`, with a client that waits as long as corral-ipam.
fn add(
    socket: &Path,
    container: &str,
) -> Result<corral_api::AllocateResponse, corral_client::Error> {
    let mut client =
        corral_client::Client::unix(socket).with_read_timeout(Some(Duration::from_secs(60)));
    common::pod_add(&mut client, "pods", container, format!("pod/{container}"))
}

fn socket_arg(socket: &Path) -> String {
    socket.to_str().unwrap().to_owned()
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn an_exhausted_pool_is_named_by_the_add_error_and_explain_then_the_quarantine() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(&two_blocks());
    let nodes = ["node-a", "node-b", "node-c"];
    let agents: Vec<_> = nodes
        .iter()
        .map(|node| {
            start_agent_with(
                &etcd,
                &dir.path().join(node),
                node,
                // Longer than the client's default 5 s timeout: `corral alloc` outlasts it.
                &["--pool-wait", "6000"],
            )
        })
        .collect();
    wait_until(
        "two nodes hold the two blocks, the third has the leader's record",
        Duration::from_secs(30),
        || {
            let served = grants(&etcd);
            served.len() == 2
                && nodes
                    .iter()
                    .any(|n| !served.contains_key(*n) && waiting_record(&etcd, n).is_some())
        },
    );
    let served = grants(&etcd);
    let (i, starving) = nodes
        .iter()
        .enumerate()
        .find(|(_, n)| !served.contains_key(**n))
        .unwrap();
    let record = waiting_record(&etcd, starving).unwrap();
    assert!(record.contains(r#""cause":"exhausted""#), "{record}");
    // The served nodes have no record.
    for node in served.keys() {
        assert_eq!(waiting_record(&etcd, node), None, "{node}");
    }
    // The ADD waits out its pool wait, then names the exhausted pool (code 11).
    let socket = &agents[i].socket;
    let error = add(socket, "web-1").unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("the cluster's pool pods (IPv4) is exhausted"),
        "{text}"
    );
    assert!(!text.contains("does not exist"), "{text}");
    // `corral alloc` in that pool waits as long (6 s, past the client's default 5 s) and
    // names the same cause; it does not time out.
    let (code, out, err) = corral(&[
        "alloc",
        "--socket",
        &socket_arg(socket),
        "--pool",
        "pods",
        "--owner",
        "cli",
    ]);
    assert_ne!(code, 0, "{out}");
    assert_ne!(code, 3, "timed out: {err}");
    assert!(
        err.contains("the cluster's pool pods (IPv4) is exhausted"),
        "{err}"
    );

    // `corral explain pod`: the pod holds nothing, the chain breaks at the leader's decision.
    let (code, out, err) = explain(
        &etcd,
        &["pod", "web-1", "--pool", "pods"],
        &["--socket", &socket_arg(socket)],
    );
    assert_eq!(code, 5, "{out}{err}");
    assert!(link_line(&out, "pod").contains("holds no address"), "{out}");
    assert!(link_line(&out, "pool").contains("pods"), "{out}");
    assert!(link_line(&out, "demand").contains("ok"), "{out}");
    assert!(
        link_line(&out, "leader").contains("operator op-a leads"),
        "{out}"
    );
    let decision = link_line(&out, "decision");
    assert!(decision.contains("BROKEN"), "{out}");
    assert!(
        decision.contains("the cluster's pool pods (IPv4) is exhausted"),
        "{out}"
    );
    assert!(out.contains("what to do: widen the pool"), "{out}");
    // ... and as JSON: the links up to the broken one.
    let (code, out, _) = explain(
        &etcd,
        &["node", starving, "-o", "json"],
        &["--socket", &socket_arg(socket)],
    );
    assert_eq!(code, 5, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["broken"], true, "{json}");
    let links = json["links"].as_array().unwrap();
    let last = links.last().unwrap();
    assert_eq!(
        (&last["link"], &last["state"]),
        (&serde_json::json!("decision"), &serde_json::json!("broken")),
        "{json}"
    );
    assert!(
        links[..links.len() - 1]
            .iter()
            .all(|l| l["state"] != "broken"),
        "{json}"
    );
    // A served node: nothing broken, exit 0.
    let (served_node, _) = served.iter().next().unwrap();
    let (code, out, err) = explain(&etcd, &["node", served_node], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("nothing broken"), "{out}");
    assert!(
        link_line(&out, "agent").contains("could not check"),
        "{out}"
    );
    // An address: the block that holds it and the node it is granted to; one outside every
    // pool is broken. (`grants` lists each node's grant keys, ending in `<cidr-with-dash>`.)
    let key = &served[served_node][0];
    let first = key
        .rsplit('/')
        .next()
        .and_then(|cidr| cidr.split('-').next())
        .unwrap_or_else(|| panic!("a block in {key:?}"));
    let (code, out, err) = explain(&etcd, &["address", first], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        link_line(&out, "grant").contains(&format!("granted to node {served_node}")),
        "{out}"
    );
    let (code, out, _) = explain(&etcd, &["address", "192.0.2.1"], &[]);
    assert_eq!(code, 5, "{out}");
    assert!(
        link_line(&out, "grant").contains("is in no pool of the cluster"),
        "{out}"
    );

    // A served node leaves: its block goes into quarantine (300 s), and the starving node
    // now waits on it, until a time.
    let (code, output) = remove(&etcd, served_node, &[]);
    assert_eq!(code, 0, "{output}");
    wait_until(
        "the leader's record names the quarantine",
        Duration::from_secs(30),
        || {
            waiting_record(&etcd, starving).is_some_and(|r| {
                r.contains(r#""cause":"quarantined""#) && r.contains(r#""until_ms""#)
            })
        },
    );
    let (code, out, err) = explain(&etcd, &["node", starving], &[]);
    assert_eq!(code, 5, "{out}{err}");
    let decision = link_line(&out, "decision");
    assert!(
        decision.contains(
            "the cluster's pool pods (IPv4) has no free block: its only space is in quarantine \
             (1 block) until 20"
        ),
        "{out}"
    );
    assert!(
        out.contains("what to do: wait for the quarantine to end"),
        "{out}"
    );
    let error = add(socket, "web-2").unwrap_err();
    assert!(
        error
            .to_string()
            .contains("its only space is in quarantine"),
        "{error}"
    );
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn explain_names_the_failover_for_a_node_waiting_through_one() {
    let (dir, etcd, operator) = cluster_with_operator_in_tempdir(&two_blocks());
    wait_leads(&etcd, "op-a", Duration::from_secs(20));
    // The leader dies; its election key goes with its lease (2 s), and no one takes over.
    operator.signal(rustix::process::Signal::KILL);
    wait_until("no operator campaigns", Duration::from_secs(20), || {
        leader(&etcd).is_none()
    });
    let agent = start_agent(&etcd, &dir.path().join("node-a"), "node-a");
    let (code, out, err) = explain(
        &etcd,
        &["node", "node-a"],
        &[
            "--socket",
            &socket_arg(&agent.socket),
            "--operator-socket",
            operator.socket.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 5, "{out}{err}");
    let line = link_line(&out, "leader");
    assert!(line.contains("BROKEN"), "{out}");
    assert!(line.contains("no operator leads the cluster"), "{out}");
    assert!(
        line.contains("the operator socket does not answer"),
        "{out}"
    );
    assert!(out.contains("a failover is in progress"), "{out}");
    // The chain stops there: no decision line.
    assert!(!out.contains("decision"), "{out}");
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn explain_names_etcds_lost_quorum_for_a_degraded_agent() {
    let (dir, mut etcd) = initialized_in_tempdir(3, &two_blocks());
    let _operator = Operator::start(&etcd, dir.path(), "op-a");
    wait_leads(&etcd, "op-a", Duration::from_secs(20));
    let agent = start_agent(&etcd, &dir.path().join("node-a"), "node-a");
    wait_until("node-a holds a block", Duration::from_secs(30), || {
        grants(&etcd).contains_key("node-a")
    });
    etcd.kill(1).unwrap();
    etcd.kill(2).unwrap();
    wait_until("the agent is degraded", Duration::from_secs(60), || {
        link_status(&agent.socket).is_some_and(|c| c.degraded)
    });
    let (code, out, err) = explain(
        &etcd,
        &["node", "node-a"],
        &["--socket", &socket_arg(&agent.socket)],
    );
    assert_eq!(code, 5, "{out}{err}");
    let line = link_line(&out, "agent's etcd link");
    assert!(line.contains("BROKEN"), "{out}");
    assert!(out.contains("etcd has lost quorum"), "{out}");
}

/// Two block pools, `pods` (the cluster's default) and `blue` (namespace `batch`'s).
fn two_pools() -> String {
    format!(
        "quarantine_secs = 300\ndefault_pool = \"pods\"\n[namespaces]\nbatch = \"blue\"\n{}{}",
        blocks_table("pods", "10.91.0.0/27", 28, None),
        blocks_table("blue", "10.92.0.0/27", 28, None)
    )
}

/// A CNI ADD as corral-ipam sends it: the call's pool (`runtimeConfig.pool`), the network's
/// `ipam.pool` and the pod's namespace, owner NAMESPACE/NAME.
fn add_as_plugin(
    socket: &Path,
    pod: &str,
    requested: Option<&str>,
    configured: &str,
) -> Result<corral_api::AllocateResponse, corral_client::Error> {
    let (namespace, _) = pod.split_once('/').unwrap();
    let container = format!("c-{}", pod.replace('/', "-"));
    let mut network = common::podnet(configured);
    network.requested_pool = requested.map(str::to_owned);
    network.namespace = Some(namespace.to_owned());
    corral_client::Client::unix(socket)
        .with_read_timeout(Some(Duration::from_secs(60)))
        .cni_add(&corral_api::CniAddRequest {
            network,
            key: common::pod_key(&container),
            owner: pod.to_owned(),
            sets: Vec::new(),
        })
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn explain_pod_names_the_pool_the_add_used_and_the_rule_that_chose_it() {
    let (dir, etcd, _operator) = cluster_with_operator_in_tempdir(&two_pools());
    let agent = start_agent_with(
        &etcd,
        &dir.path().join("node-a"),
        "node-a",
        &["--pool-wait", "2000"],
    );
    wait_ranges("node-a holds a block of each pool", &agent.socket, 2, 30);
    let socket = socket_arg(&agent.socket);
    let pool_of = |pod: &str, extra: &[&str]| {
        let mut args = vec!["pod", pod, "--socket", &socket];
        args.extend(extra);
        let (_, out, err) = explain(&etcd, &args, &[]);
        let line = link_line(&out, "pool").to_owned();
        (line, format!("{out}{err}"))
    };

    // The namespace's pool wins over the network's `ipam.pool`: the agent says so.
    let reply = add_as_plugin(&agent.socket, "batch/job-1", None, "pods").unwrap();
    assert!(
        reply
            .allocations
            .iter()
            .all(|a| a.pool == "blue" && contains("10.92.0.0/27", a.address)),
        "{reply:?}"
    );
    let (line, out) = pool_of("batch/job-1", &[]);
    assert!(link_line(&out, "pod").contains("(pool blue)"), "{out}");
    assert!(line.contains("blue: namespace batch maps to it"), "{out}");
    assert!(
        line.contains("the agent's record of the pod's ADD"),
        "{out}"
    );
    assert!(line.contains(", ok)"), "{out}");
    // The call's pool (runtimeConfig.pool) wins over the namespace's.
    add_as_plugin(&agent.socket, "batch/job-2", Some("pods"), "blue").unwrap();
    let (line, out) = pool_of("batch/job-2", &[]);
    assert!(
        line.contains("pods: the pod's CNI call named it (runtimeConfig.pool"),
        "{out}"
    );
    // The network's pool, when nothing else names one.
    add_as_plugin(&agent.socket, "web/front", None, "blue").unwrap();
    let (line, out) = pool_of("web/front", &[]);
    assert!(line.contains("blue: the network's pool"), "{out}");
    // An ADD that failed: the pool it asked for, and why it failed, from the agent.
    let error = add_as_plugin(&agent.socket, "web/lost", Some("nowhere"), "pods").unwrap_err();
    let (line, out) = pool_of("web/lost", &[]);
    assert!(
        line.contains("nowhere: the pod's CNI call named it"),
        "{out}"
    );
    assert!(line.contains(", failed)"), "{out}");
    // ... which names a pool that does not exist: the chain breaks there.
    assert!(
        out.contains("pool nowhere is not a pool of the cluster, nor of the node's agent"),
        "{out}"
    );
    let pod = link_line(&out, "pod");
    assert!(
        pod.contains("holds no address on this node (its ADD failed: "),
        "{out}"
    );
    let message = match &error {
        corral_client::Error::Api { error, .. } => error.message.clone(),
        other => other.to_string(),
    };
    assert!(pod.contains(&message), "{error}\n{out}");

    // A pod the agent has no record of: the pool worked out from the CNI configuration
    // (a file, or a network's name in a directory), the pod's namespace and --pool.
    let conf_dir = dir.path().join("net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let conflist = conf_dir.join("10-k8s.conflist");
    std::fs::write(
        &conflist,
        r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge",
            "ipam":{"type":"corral-ipam","agent":"/run/corral/agent.sock","pool":"blue"}}]}"#,
    )
    .unwrap();
    let conflist = conflist.to_str().unwrap();
    let conf_dir = conf_dir.to_str().unwrap();
    let (line, out) = pool_of("web/new", &["--cni-config", conflist]);
    assert!(
        line.contains("blue: the network's pool (ipam.pool of network k8s in "),
        "{out}"
    );
    let (line, out) = pool_of(
        "web/new",
        &["--cni-config", "k8s", "--cni-conf-dir", conf_dir],
    );
    assert!(
        line.contains("blue: the network's pool (ipam.pool of network k8s"),
        "{out}"
    );
    let (line, out) = pool_of("web/new", &[]);
    assert!(line.contains("pods: the cluster's default pool"), "{out}");
    let (line, out) = pool_of("batch/new", &["--cni-config", conflist]);
    assert!(line.contains("blue: namespace batch maps to it"), "{out}");
    let (line, out) = pool_of(
        "batch/new",
        &[
            "--pool",
            "pods",
            "--cni-config",
            "k8s",
            "--cni-conf-dir",
            conf_dir,
        ],
    );
    assert!(
        line.contains(
            "pods: the pod's CNI call named it (runtimeConfig.pool or args.cni.pool) (--pool)"
        ),
        "{out}"
    );
    let (line, out) = pool_of(
        "web/new",
        &["--cni-config", "nosuch", "--cni-conf-dir", conf_dir],
    );
    assert!(line.contains("could not check"), "{out}");
    assert!(line.contains("no network named nosuch"), "{out}");
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn explain_sees_a_failover_before_the_dead_leaders_key_expires() {
    let (dir, etcd) = initialized_in_tempdir(1, &two_blocks());
    // A long lease (15 s, renewed every 5 s), so its key outlives the leader for a while.
    let ttl: [&std::ffi::OsStr; 2] = ["--lease-ttl".as_ref(), "15".as_ref()];
    let op_a = Operator::with_state(&etcd, dir.path(), "op-a", &ttl);
    wait_leads(&etcd, "op-a", Duration::from_secs(30));
    let _standby = Operator::with_state(&etcd, dir.path(), "op-b", &ttl);
    let agent = start_agent(&etcd, &dir.path().join("node-a"), "node-a");
    wait_until("node-a holds a block", Duration::from_secs(30), || {
        grants(&etcd).contains_key("node-a")
    });
    let socket = socket_arg(&agent.socket);
    let explain_node = || explain(&etcd, &["node", "node-a"], &["--socket", &socket]);
    // A leader that renews its lease leads: nothing broken.
    let (code, out, err) = explain_node();
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        link_line(&out, "leader").contains("operator op-a leads"),
        "{out}"
    );

    // The leader dies; its election key stays until its lease runs out (15 s), and explain
    // says a failover is in progress before then.
    op_a.signal(rustix::process::Signal::KILL);
    let mut last = String::new();
    wait_until(
        "explain names the failover while op-a's key is still there",
        Duration::from_secs(60),
        || {
            assert_eq!(
                leader(&etcd).as_deref(),
                Some("op-a"),
                "op-a's key expired before explain saw the failover; last:\n{last}"
            );
            let (code, out, _) = explain_node();
            let seen = code == 5 && out.contains("failover in progress");
            last = out;
            seen
        },
    );
    let line = link_line(&last, "leader");
    assert!(line.contains("BROKEN"), "{last}");
    assert!(
        line.contains("failover in progress: the leader (op-a) stopped answering at about 20"),
        "{last}"
    );
    assert!(
        line.contains("a standby (1 campaign) takes over when its lease ends at 20"),
        "{last}"
    );
    assert!(last.contains("what to do: wait for the standby"), "{last}");
    // The standby takes over: the leader link is whole again.
    wait_leads(&etcd, "op-b", Duration::from_secs(60));
    wait_until("explain sees op-b lead", Duration::from_secs(30), || {
        let (code, out, _) = explain_node();
        code == 0 && link_line(&out, "leader").contains("operator op-b leads")
    });
}
