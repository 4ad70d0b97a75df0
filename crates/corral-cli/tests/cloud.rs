//! Cloud pools with real processes: etcd started here on 127.0.0.1 and a `corral agent` child
//! process given `--instance-id`; the test plays the operator by writing the node's
//! `interfaces/` records. A CNI ADD (as corral-ipam sends it in agent mode) gets an address of the
//! interface with its device number; the agent SIGKILLed and restarted keeps the pod's address
//! and the interface, and serves the rest; `corral node show` prints the interface; an address
//! the cloud took away while in use stays frozen, `corral status` reports it, and `corral cluster
//! check` (given the agent) holds throughout.
//!
//! Needs Debian's etcd (`make deps`); ignored by a plain `cargo test`.

use std::path::Path;
use std::time::Duration;

use corral_client::Client;
use corral_cluster::{
    CloudAttachment, CloudId, CloudInterfaceRecord, ClusterName, Keys, NodeName, NodeRecord,
    PoolName, decode_value, encode_value,
};
use corral_kv::{Kv, TxnOp};

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::{Agent, pod_add_at, pod_key, podnet};

const CLOUD: &str = include_str!("configs/cloud.toml");

fn add(socket: &Path, container: &str) -> Result<corral_api::Allocated, corral_client::Error> {
    let response = pod_add_at(socket, "vpc", container)?;
    Ok(response.allocations[0].clone())
}

fn start(etcd: &corral_etcd::testing::EtcdCluster, dir: &Path) -> Agent {
    start_agent_with(
        etcd,
        dir,
        "node-a",
        &["--instance-id", "i-0abc", "--pool-wait", "300"],
    )
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn an_interface_record_serves_pods_through_a_sigkill() {
    let (dir, etcd) = initialized_in_tempdir(1, CLOUD);
    let agent_dir = dir.path().join("node-a");
    let agent = start(&etcd, &agent_dir);
    let kv = kv(&etcd);
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let node = NodeName::new("node-a").unwrap();
    let registered = || -> Option<NodeRecord> {
        block_on(kv.get(keys.node(&node).as_bytes()))
            .unwrap()
            .map(|e| decode_value(&e.value).unwrap())
    };
    wait_until("registered", Duration::from_secs(10), || {
        registered().is_some()
    });
    assert_eq!(registered().unwrap().instance_id.as_deref(), Some("i-0abc"));
    // The operator's record: eni-1 at device 1 with two secondary addresses.
    let record = CloudInterfaceRecord {
        pool: PoolName::new("vpc").unwrap(),
        instance_id: "i-0abc".into(),
        device_index: 1,
        subnet_id: "subnet-1".into(),
        subnets: vec!["10.0.32.0/20".parse().unwrap()],
        mac: "02:aa:bb:cc:dd:01".into(),
        primary_ipv4: Some("10.0.32.9".parse().unwrap()),
        addresses: vec![
            "10.0.32.10/32".parse().unwrap(),
            "10.0.32.11/32".parse().unwrap(),
        ],
        assigned_ms: Default::default(),
        attachment: CloudAttachment::Attached,
        managed: true,
        prefixes_refused_ms: None,
    };
    apply(
        &kv,
        vec![TxnOp::put(
            keys.cloud_interface(&node, &CloudId::new("eni-1").unwrap()),
            encode_value(&record).unwrap(),
        )],
    );
    let socket = agent_dir.join("agent.sock");
    let mut first = None;
    wait_until(
        "an address from the interface",
        Duration::from_secs(10),
        || {
            first = add(&socket, "c1").ok();
            first.is_some()
        },
    );
    let first = first.unwrap();
    let interface = first.interface.clone().unwrap();
    assert_eq!(
        (interface.id.as_str(), interface.device_number),
        ("eni-1", 1)
    );
    assert_eq!(interface.gateway, Some("10.0.32.1".parse().unwrap()));
    assert!(["10.0.32.10", "10.0.32.11"].contains(&first.address.to_string().as_str()));
    // SIGKILL and restart: the pod keeps its address, the other one is served next.
    agent.kill();
    let _agent = start(&etcd, &agent_dir);
    let held = Client::unix(&socket)
        .cni_check(&corral_api::CniKeyRequest {
            network: podnet("vpc"),
            key: pod_key("c1"),
        })
        .unwrap();
    assert_eq!(held.allocations[0].address, first.address);
    let second = add(&socket, "c2").unwrap();
    assert_ne!(second.address, first.address);
    assert_eq!(second.interface.unwrap().device_number, 1);
    // Both handed out: the next ADD waits, then fails naming the pool.
    match add(&socket, "c3") {
        Err(corral_client::Error::Api { error, .. }) => {
            assert_eq!(error.pool.as_deref(), Some("vpc"), "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    // `corral node show` prints the node's cloud interfaces.
    let (code, out, err) = on_cluster(&etcd, &["node", "show", "node-a"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("eni-1 pool vpc device 1 attached subnet subnet-1 mac 02:aa:bb:cc:dd:01: 10.0.32.10/32, 10.0.32.11/32"),
        "{out}"
    );
    // And the cluster's invariants hold, the agent's interfaces included.
    assert_check(&etcd, &[&socket]);
    // The cloud takes the first pod's address away (an administrator, say): the pod keeps it,
    // frozen, `corral status` says so, and the check still holds.
    let mut forced = record.clone();
    forced.addresses.retain(|a| a.addr() != first.address);
    apply(
        &kv,
        vec![TxnOp::put(
            keys.cloud_interface(&node, &CloudId::new("eni-1").unwrap()),
            encode_value(&forced).unwrap(),
        )],
    );
    let socket_text = socket.display().to_string();
    wait_until("reported frozen", Duration::from_secs(10), || {
        let (_, out, _) = corral(&["--socket", &socket_text, "status"]);
        out.contains("cluster problem") && out.contains(&first.address.to_string())
    });
    assert_check(&etcd, &[&socket]);
}

/// `corral cluster check --cloud fake` compares the `interfaces/` records with the cloud's own
/// view (DescribeNetworkInterfaces): a record of an interface the cloud has, with the cloud's
/// addresses, passes; an address the cloud does not show on it, or an interface it does not
/// have, is a problem (exit code 5). The fake is rebuilt from its seed file in each process,
/// the same in the test as in the command: the instance's primary interface is the one the
/// records name.
#[test]
#[ignore = "needs etcd (make deps)"]
fn cluster_check_compares_the_records_with_the_clouds_view() {
    use corral_cloud::CloudProvider;
    let (dir, etcd) = initialized_in_tempdir(1, CLOUD);
    let _agent = start(&etcd, &dir.path().join("node-a"));
    let seed = dir.path().join("cloud.json");
    std::fs::write(
        &seed,
        r#"{"seed": 7,
            "subnets": [{"id": "subnet-1", "vpc": "vpc-1", "zone": "z1", "ipv4": "10.0.32.0/20"}],
            "instances": [{"id": "i-0abc", "type": "m5.large", "subnet": "subnet-1"}]}"#,
    )
    .unwrap();
    let fake = corral_cloud::FakeEc2::builder()
        .seed(7)
        .subnet(corral_cloud::fake::SubnetSpec::new(
            "subnet-1",
            "vpc-1",
            "z1",
            "10.0.32.0/20".parse().unwrap(),
        ))
        .instance(corral_cloud::fake::InstanceSpec::new("m5.large", "subnet-1").id("i-0abc"))
        .build()
        .unwrap();
    let instance = block_on(fake.describe_instance("i-0abc")).unwrap();
    let primary = &instance.interfaces[0];
    let kv = kv(&etcd);
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let node = NodeName::new("node-a").unwrap();
    let record = |addresses: &[&str]| CloudInterfaceRecord {
        pool: PoolName::new("vpc").unwrap(),
        instance_id: "i-0abc".into(),
        device_index: 0,
        subnet_id: "subnet-1".into(),
        subnets: vec!["10.0.32.0/20".parse().unwrap()],
        mac: primary.mac.to_string(),
        primary_ipv4: Some(primary.primary_ipv4),
        addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        assigned_ms: Default::default(),
        attachment: CloudAttachment::Attached,
        managed: false,
        prefixes_refused_ms: None,
    };
    let put = |id: &str, record: &CloudInterfaceRecord| {
        apply(
            &kv,
            vec![TxnOp::put(
                keys.cloud_interface(&node, &CloudId::new(id).unwrap()),
                encode_value(record).unwrap(),
            )],
        );
    };
    let seed_text = seed.display().to_string();
    let check = || check_with(&etcd, &["--cloud", "fake", "--fake-cloud", &seed_text], &[]);
    let id = primary.interface_id.as_str();
    put(id, &record(&[]));
    let (code, out) = check();
    assert_eq!(code, 0, "{out}");
    // Without --cloud the cloud is not asked; with it, an address not on the interface.
    put(id, &record(&["10.0.32.10/32"]));
    assert_check(&etcd, &[]);
    let (code, out) = check();
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains(&format!(
            "address 10.0.32.10/32 of cloud interface {id} (node node-a) is not on it in the cloud"
        )),
        "{out}"
    );
    // An interface the cloud does not have.
    put(id, &record(&[]));
    let mut gone = record(&[]);
    gone.device_index = 2;
    put("eni-gone", &gone);
    let (code, out) = check();
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains("cloud interface eni-gone of node node-a is not in the cloud"),
        "{out}"
    );
}
