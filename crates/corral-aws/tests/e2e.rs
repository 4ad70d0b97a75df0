//! The end-to-end run against moto (issue 14, deliverable 4): every part real but the cloud.
//! `moto_server` and a one-member etcd on 127.0.0.1; `corral-aws cluster init` with a cloud
//! pool on the VPC's CIDR; the `corral-aws operator --cloud aws` process (the SDK adapter,
//! configured from the environment as on EC2, pointed at moto by `--cloud-endpoint`); the
//! `corral-aws agent` process of the node on moto's instance (`--instance-id`); and the real
//! `corral-ipam` binary in agent mode, run with the CNI variables a runtime sets.
//!
//! The node registers; the operator creates an interface with its addresses and attaches it
//! (moto shows it attached to the instance, with the addresses) and records it under
//! `interfaces/<node>/`; the agent serves it; a pod gets one of its addresses and a DEL frees
//! it; `corral-aws cluster check --cloud aws` passes. The operator SIGKILLed and started again
//! creates no second interface (its own call counters say so, and moto's view), and the check
//! still passes; an address taken off the interface behind corral's back makes it fail.
//!
//! What differs from EC2 (moto 5.2): moto answers AssignPrivateIpAddresses with every address
//! of the interface, the primary included, where EC2 answers the new ones (see `tests/moto.rs`);
//! the pool's `max_allocate` is set to the interface's first two addresses so the operator never
//! assigns on an existing interface here (that path is proven on the fake). Moto attaches at
//! once (no `attaching` phase) and ignores client tokens. Moto picks private addresses from
//! the whole subnet, the gateway included, which corral refuses to serve: the tests run it
//! with EC2's rule (`common/moto_server.py`).
//!
//! Needs moto (`target/moto-venv/bin/moto_server`, or `MOTO_SERVER`) and etcd (`make deps`);
//! `corral-ipam` is found beside this build's `corral-aws` (a workspace build makes both) or
//! at `CORRAL_IPAM_BIN`. Every wait has a deadline; only the processes started here are
//! killed, by their PIDs.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_cloud::{CloudProvider, InterfaceFilter, Ipv4Set};
use corral_cluster::{
    CloudAttachment, CloudInterfaceRecord, ClusterName, Key, Keys, NodeName, decode_value,
};
use corral_cni::testing::cni_call;
use corral_etcd::testing::{EtcdCluster, block_on};
use corral_kv::Kv;
use serde_json::{Value, json};

use crate::common;

use common::{Moto, create_fixture};

const CORRAL_AWS: &str = env!("CARGO_BIN_EXE_corral-aws");

/// How long any one wait may take before the test fails (each takes about a second).
const DEADLINE: Duration = Duration::from_secs(90);

/// Polls `done` every 100 ms until it holds; fails the test after [`DEADLINE`].
fn wait_until(what: &str, done: impl FnMut() -> bool) {
    wait_showing(what, done, String::new);
}

/// As [`wait_until`], the failure also saying what `show` finds then.
fn wait_showing(what: &str, mut done: impl FnMut() -> bool, show: impl FnOnce() -> String) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        if Instant::now() >= deadline {
            panic!("timed out waiting for {what}\n{}", show());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// corral-ipam: `CORRAL_IPAM_BIN`, else beside this build's `corral-aws`.
fn corral_ipam() -> PathBuf {
    let path = std::env::var_os("CORRAL_IPAM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(CORRAL_AWS).with_file_name("corral-ipam"));
    assert!(
        path.exists(),
        "{} is missing: build it (`cargo build -p corral-cni --bin corral-ipam`, as a workspace \
         build does) or set CORRAL_IPAM_BIN",
        path.display()
    );
    path
}

/// The AWS environment of every `corral-aws` process: moto's region and dummy credentials, and
/// nothing from this machine's own AWS configuration.
fn aws_env(command: &mut Command) -> &mut Command {
    command
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_EC2")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("CORRAL_ETCD")
        .env_remove("CORRAL_SOCKET")
}

/// Runs `corral-aws <args>` to completion; answers (exit code, stdout and stderr).
fn corral_aws(args: &[&str], endpoint_env: Option<&str>) -> (i32, String) {
    let mut command = Command::new(CORRAL_AWS);
    aws_env(&mut command).args(args);
    if let Some(url) = endpoint_env {
        command.env("AWS_ENDPOINT_URL", url);
    }
    let output = command.output().expect("corral-aws runs");
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// A daemon started here (`corral-aws operator` or `agent`), SIGKILLed by its PID on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(args: &[&str], log: PathBuf) -> Daemon {
        let mut command = Command::new(CORRAL_AWS);
        aws_env(&mut command)
            .args(args)
            // The link's and the cloud manager's steps, for a failure to say why.
            .env(
                "CORRAL_LOG",
                "corral_agent::link=debug,corral_operator::leader::cloud=debug",
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = command.spawn().expect("corral-aws starts");
        Daemon { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test if the process has exited.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}):\n{}", self.log.display(), self.log());
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log());
        }
        // `Child::kill` is SIGKILL to this child's PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cloud node manager's call counter of one action and outcome (`sent`: every attempt),
/// from the operator's metrics on its API socket; `None` while the API does not answer.
fn cloud_calls(api_socket: &Path, action: &str, outcome: &str) -> Option<u64> {
    let text = corral_client::Client::unix(api_socket).metrics().ok()?;
    let wanted =
        format!("corral_operator_cloud_calls_total{{action=\"{action}\",outcome=\"{outcome}\"}} ");
    Some(
        text.lines()
            .find_map(|line| line.strip_prefix(&wanted))
            .map_or(0, |n| n.trim().parse().unwrap()),
    )
}

/// Runs corral-ipam as a container runtime does: the CNI variables, the network's
/// configuration on stdin; answers (exit code, the result or error as JSON).
fn cni(command: &str, container: &str, config: &Value) -> (i32, Value) {
    let mut child = cni_call(&mut Command::new(corral_ipam()), command, container)
        .stderr(Stdio::null())
        .spawn()
        .expect("corral-ipam starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(config).unwrap())
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("corral-ipam {command} {container} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = reader.join().unwrap();
    let value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    };
    (status.code().unwrap_or(-1), value)
}

/// The node's `interfaces/` records, by interface id.
fn records(
    kv: &corral_etcd::EtcdKv,
    keys: &Keys,
    node: &NodeName,
) -> Vec<(String, CloudInterfaceRecord)> {
    let prefix = keys.cloud_interfaces_of_node_prefix(node);
    let (entries, _) = block_on(corral_kv::read_all(kv, prefix.as_bytes(), 100)).unwrap();
    entries
        .iter()
        .filter_map(|e| match keys.parse(&e.key_str()) {
            Ok(Key::CloudInterface { interface, .. }) => Some((
                interface.as_str().to_owned(),
                decode_value(&e.value).unwrap(),
            )),
            _ => None,
        })
        .collect()
}

/// The secondary addresses of one of moto's interfaces, as the records write them.
fn addresses(interface: &corral_cloud::NetworkInterface) -> BTreeSet<ipnet::IpNet> {
    interface
        .secondary_ipv4
        .iter()
        .map(|a| ipnet::IpNet::from(IpAddr::V4(*a)))
        .collect()
}

#[test]
#[ignore = "needs moto_server and etcd (make deps)"]
fn a_node_on_moto_gets_an_interface_and_a_pod_an_address_through_corral_ipam() {
    let moto = Moto::start();
    let ec2 = moto.provider();
    let (subnet_id, instance_id) = block_on(create_fixture(&ec2, "m5.large"));
    let etcd = block_on(EtcdCluster::start(1)).expect("etcd starts (make deps installs it)");
    let endpoints = etcd.endpoints().join(",");
    let dir = tempfile::tempdir().unwrap();

    // The cluster: one cloud pool on the VPC's CIDR; the node holds its interface's first two
    // addresses (moto's assign answers are not EC2's: see the module documentation).
    let cluster_toml = dir.path().join("cluster.toml");
    std::fs::write(
        &cluster_toml,
        r#"
[[pools]]
name = "vpc"
mode = "cloud"
[pools.watermarks]
pre_allocate = 2
max_allocate = 2
[pools.ipv4]
cidrs = ["10.0.0.0/16"]
"#,
    )
    .unwrap();
    let etcd_args = ["--etcd", endpoints.as_str(), "--cluster", "t"];
    let (code, out) = corral_aws(
        &[
            &["cluster", "init"][..],
            &etcd_args,
            &["--config", cluster_toml.to_str().unwrap()],
        ]
        .concat(),
        None,
    );
    assert_eq!(code, 0, "cluster init: {out}");

    let operator = |name: &str| {
        let socket = dir.path().join(format!("{name}.sock"));
        let daemon = Daemon::start(
            &[
                &["operator"][..],
                &etcd_args,
                &["--replica", name, "--lease-ttl", "2"],
                &["--api-socket", socket.to_str().unwrap()],
                &["--cloud", "aws", "--cloud-endpoint", &moto.endpoint],
            ]
            .concat(),
            dir.path().join(format!("{name}.log")),
        );
        (daemon, socket)
    };
    let (mut op1, _op1_socket) = operator("op1");

    // The node's agent on moto's instance.
    let node_dir = dir.path().join("node-a");
    std::fs::create_dir_all(&node_dir).unwrap();
    let agent_socket = node_dir.join("agent.sock");
    let agent_toml = node_dir.join("agent.toml");
    std::fs::write(
        &agent_toml,
        format!(
            "data_dir = {:?}\nsocket = {:?}\ncni_data_dirs = []\n",
            node_dir.join("state"),
            agent_socket,
        ),
    )
    .unwrap();
    let mut agent = Daemon::start(
        &[
            &["agent", "--config", agent_toml.to_str().unwrap()][..],
            &etcd_args,
            &["--node", "node-a", "--lease-ttl", "3"],
            &["--instance-id", &instance_id, "--pool-wait", "300"],
        ]
        .concat(),
        dir.path().join("agent.log"),
    );

    // The node registers with its instance.
    let kv = block_on(etcd.client(Default::default())).unwrap();
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let node = NodeName::new("node-a").unwrap();
    wait_until("the node's registration", || {
        agent.assert_running();
        block_on(kv.get(keys.node(&node).as_bytes()))
            .unwrap()
            .is_some()
    });

    // The operator creates and attaches an interface with two addresses, and records it.
    wait_until("an attached interface recorded with two addresses", || {
        op1.assert_running();
        let records = records(&kv, &keys, &node);
        records.len() == 1
            && records[0].1.attachment == CloudAttachment::Attached
            && records[0].1.addresses.len() == 2
    });
    let (eni, record) = records(&kv, &keys, &node).remove(0);
    assert_eq!(record.instance_id, instance_id);
    assert_eq!(record.subnet_id, subnet_id);
    assert_eq!(record.device_index, 1);
    assert!(record.managed);
    // Moto's own view: the interface attached to the instance at device 1, with the addresses.
    let in_moto = block_on(ec2.describe_interfaces(&InterfaceFilter::id(&eni))).unwrap();
    assert_eq!(in_moto.len(), 1);
    let attachment = in_moto[0].attachment.as_ref().expect("attached in moto");
    assert_eq!(
        (attachment.instance_id.as_str(), attachment.device_index),
        (instance_id.as_str(), 1)
    );
    let recorded: BTreeSet<ipnet::IpNet> = record.addresses.iter().copied().collect();
    assert_eq!(addresses(&in_moto[0]), recorded);
    assert_eq!(record.primary_ipv4, Some(in_moto[0].primary_ipv4));

    // The agent serves the interface.
    wait_showing(
        "the agent serving the interface",
        || {
            agent.assert_running();
            corral_client::Client::unix(&agent_socket)
                .interfaces(Some("vpc"))
                .is_ok_and(|listed| {
                    listed.pools.iter().flat_map(|p| &p.interfaces).any(|i| {
                        i.id == eni
                            && i.total == 2
                            && i.addresses
                                .iter()
                                .map(|a| a.parse().unwrap())
                                .collect::<BTreeSet<_>>()
                                == recorded
                    })
                })
        },
        // What the agent and etcd show, to say why (the daemons' logs follow on drop).
        || {
            let mut client = corral_client::Client::unix(&agent_socket);
            format!(
                "{eni} with {recorded:?}\ninterfaces: {:?}\nstatus: {:?}\nrecords: {:?}",
                client.interfaces(Some("vpc")),
                client.status(None),
                records(&kv, &keys, &node),
            )
        },
    );

    // A pod's address through corral-ipam in agent mode: one moto shows on the interface.
    let podnet = json!({
        "cniVersion": "1.0.0",
        "name": "podnet",
        "type": "bridge",
        "ipam": {
            "type": "corral-ipam",
            "agent": agent_socket,
            "pool": "vpc",
            "dataDir": node_dir.join("cni"),
        }
    });
    let (code, result) = cni("ADD", "pod-1", &podnet);
    assert_eq!(code, 0, "ADD: {result}");
    let address: IpAddr = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("an address in {result}"));
    assert!(
        recorded.contains(&ipnet::IpNet::from(address)),
        "{address} is not among {recorded:?}"
    );
    assert_eq!(
        result["corral"]["interfaces"][0]["id"],
        json!(eni),
        "{result}"
    );
    let assigned = || {
        corral_client::Client::unix(&agent_socket)
            .interface(&eni)
            .unwrap()
            .assigned
    };
    assert_eq!(assigned(), 1);
    // DEL frees it.
    let (code, result) = cni("DEL", "pod-1", &podnet);
    assert_eq!(code, 0, "DEL: {result}");
    assert_eq!(assigned(), 0);

    // The cluster check with the cloud's view (the endpoint from the environment this time).
    let agent_arg = agent_socket.to_str().unwrap();
    let check = || {
        corral_aws(
            &[
                &["cluster", "check"][..],
                &etcd_args,
                &["--agent", agent_arg, "--cloud", "aws"],
            ]
            .concat(),
            Some(&moto.endpoint),
        )
    };
    let (code, out) = check();
    assert_eq!(code, 0, "cluster check --cloud aws: {out}");
    assert!(out.contains("cluster t at revision"), "{out}");

    // SIGKILL the operator, start another: it takes over, resyncs, and creates nothing.
    drop(op1);
    let (mut op2, op2_socket) = operator("op2");
    wait_until("op2's resync of the cloud and the node", || {
        op2.assert_running();
        cloud_calls(&op2_socket, "DescribeNetworkInterfaces", "ok").unwrap_or(0) >= 2
            && cloud_calls(&op2_socket, "DescribeInstances", "ok").unwrap_or(0) >= 1
    });
    // A few more seconds of the new leader's passes before counting what it did.
    std::thread::sleep(Duration::from_secs(3));
    op2.assert_running();
    assert_eq!(
        cloud_calls(&op2_socket, "CreateNetworkInterface", "sent"),
        Some(0),
        "op2 created an interface:\n{}",
        op2.log()
    );
    let attached = block_on(ec2.describe_interfaces(&InterfaceFilter {
        attached_instance: Some(instance_id.clone()),
        ..InterfaceFilter::default()
    }))
    .unwrap();
    let ids: BTreeSet<&str> = attached.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(attached.len(), 2, "the primary and {eni} only: {ids:?}");
    assert!(ids.contains(eni.as_str()));
    assert_eq!(
        records(&kv, &keys, &node)
            .into_iter()
            .map(|(id, r)| (id, r.addresses))
            .collect::<Vec<_>>(),
        [(eni.clone(), record.addresses.clone())]
    );
    let (code, out) = check();
    assert_eq!(code, 0, "cluster check after the failover: {out}");

    // The check can fail: with the operator gone, an address taken off the interface behind
    // corral's back is found (exit code 5, naming it).
    drop(op2);
    let taken = match record.addresses[0].addr() {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => unreachable!("an IPv4 pool"),
    };
    block_on(ec2.unassign_ipv4(
        &eni,
        &Ipv4Set {
            addresses: vec![taken],
            prefixes: vec![],
        },
    ))
    .unwrap();
    let (code, out) = check();
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains(&format!("address {taken}/32 of cloud interface {eni}")),
        "{out}"
    );
    drop(agent);
}
