//! Node CIDRs from the cloud with real processes: etcd on 127.0.0.1, `corral operator --cloud
//! fake --fake-cloud FILE` (the fake seeded with a /80 and two /28s delegated to the instance's
//! primary interface) and a `corral agent --instance-id`: the operator grants the delegated
//! prefixes, the agent serves them (an IPv6 pod address comes from the /80), and `corral cluster
//! check` with the agent holds.
//!
//! Needs Debian's etcd (`make deps`); ignored by a plain `cargo test`.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use corral_api::{AllocateRequest, FamilyChoice};
use corral_client::Client;

use crate::cluster_common;
use crate::common;

use cluster_common::*;
use common::Agent;

const FROM_CLOUD: &str = include_str!("configs/from_cloud.toml");

const FAKE_CLOUD: &str = r#"{
  "seed": 7,
  "subnets": [{"id": "subnet-a", "vpc": "vpc-1", "zone": "us-east-1a",
               "ipv4": "10.0.0.0/18", "ipv6": "2600:1f14:0:1::/64"}],
  "instances": [{"id": "i-0abc", "type": "m5.large", "subnet": "subnet-a",
                 "ipv4_prefixes": 2, "ipv6_prefixes": 1}]
}"#;

fn operator(etcd: &corral_etcd::testing::EtcdCluster, dir: &Path) -> Operator {
    let seed = dir.join("cloud.json");
    std::fs::write(&seed, FAKE_CLOUD).unwrap();
    Operator::start_fake_cloud(etcd, dir, "op-a", &seed)
}

fn agent(etcd: &corral_etcd::testing::EtcdCluster, dir: &Path) -> Agent {
    start_agent_with(etcd, dir, "node-a", &["--instance-id", "i-0abc"])
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn the_agent_serves_the_prefixes_delegated_to_its_instance() {
    let (dir, etcd) = initialized_in_tempdir(1, FROM_CLOUD);
    let _operator = operator(&etcd, dir.path());
    let agent_dir = dir.path().join("node-a");
    let _agent = agent(&etcd, &agent_dir);
    let socket = agent_dir.join("agent.sock");
    // The fake's describes lag up to 5 s behind the seeding; the sync passes sooner while the
    // node waits.
    wait_until(
        "the agent serves one /80 and two /28s",
        Duration::from_secs(60),
        || {
            let ranges = agent_ranges(&socket);
            ranges.iter().filter(|r| r.contains("/80")).count() == 1
                && ranges.iter().filter(|r| r.contains("/28")).count() == 2
        },
    );
    let ranges = agent_ranges(&socket);
    assert!(ranges.iter().all(|r| r.starts_with("pods ")), "{ranges:?}");
    let granted = grants(&etcd);
    assert_eq!(granted["node-a"].len(), 3, "{granted:?}");
    // A pod's IPv6 address comes from the /80 the cloud delegated.
    let response = Client::unix(&socket)
        .allocate(&AllocateRequest {
            pool: "pods".into(),
            ..node_request(FamilyChoice::Ipv6, "pod-1")
        })
        .unwrap();
    let address = response.allocations[0].address;
    let v6 = ranges.iter().find(|r| r.contains("/80")).unwrap();
    assert!(matches!(address, IpAddr::V6(_)));
    assert!(
        contains(v6.trim_start_matches("pods "), address),
        "{address} in {v6}"
    );
    assert_check(&etcd, &[&socket]);
}
