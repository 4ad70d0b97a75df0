//! Cloud records stay disjoint, and records the cloud lacks are reported (issue 20), on the
//! laptop tier (the harness of `tests/cloud.rs`: the real operator library on `MemKv`,
//! `FakeEc2` behind `Audited`, tokio's paused clock).
//!
//! The scenario is the one `--cloud fake` with two replicas used to produce: the leader serves
//! node-0000 on one cloud and dies; the next leader runs on a *reset* cloud (another fake
//! built from the same seed, with the same instances), which knows nothing of node-0000's
//! interface and hands its addresses out again for node-0001. The new leader must refuse to
//! record them for node-0001 (reported in status and a metric, never written), and its first
//! full resyncs must report node-0000's record as missing from the cloud.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::cloud::*;
use common::*;
use corral_cloud::FakeEc2;
use corral_cloud::fake::InstanceSpec;
use corral_cluster::IpNet;

const SEED: u64 = 20;

/// node-0000 served by `op-a` on the rig's cloud (2 addresses on an interface it created),
/// `op-a` killed, node-0001 registered, and `op-b` leading on a reset cloud with both
/// instances: (rig, op-b, the reset cloud).
async fn failover_onto_a_reset_cloud() -> (Rig, Replica, FakeEc2) {
    let (mut rig, a) = Scenario::new(SEED)
        .pool("[pools.watermarks]\npre_allocate = 2")
        .nodes(1, "m5.large")
        .start()
        .await;
    rig.wait_entries("node-0000 is served", "node-0000", 2)
        .await;
    // Past the next full resync (60 s): one cloud, nothing reported missing.
    tokio::time::sleep(Duration::from_secs(70)).await;
    assert_eq!(a.shared.cloud_records_missing(), Vec::<String>::new());
    assert_eq!(a.shared.cloud_record_conflicts(), 0);
    a.kill();
    rig.add_node("node-0001", "m5.large").await;
    // The reset cloud: the same seed and subnets, the same instances, nothing else.
    let reset = fake_builder(SEED).build().unwrap();
    for name in ["node-0000", "node-0001"] {
        reset
            .launch_instance(InstanceSpec::new("m5.large", "subnet-a").id(&rig.instances[name]))
            .unwrap();
    }
    let provider = Arc::new(Audited {
        ec2: reset.clone(),
        ..(*rig.provider).clone()
    });
    let mut options = corral_operator::CloudOptions::new(provider);
    options.clock = Arc::clone(&rig.clock);
    let b = Replica::start_with_cloud(&rig.kv, "op-b", Some(options));
    leads(&b).await;
    (rig, b, reset)
}

/// No interface, and no address or prefix, recorded for two nodes (or twice).
async fn assert_records_disjoint(rig: &Rig) {
    let mut interfaces: BTreeMap<String, String> = BTreeMap::new();
    let mut nets: Vec<(IpNet, String)> = Vec::new();
    for (node, interface, record) in records(&rig.kv).await {
        if let Some(other) = interfaces.insert(interface.clone(), node.clone()) {
            panic!("{interface} is recorded for {other} and for {node}");
        }
        let primary = record
            .primary_ipv4
            .map(|a| IpNet::from(std::net::IpAddr::V4(a)));
        for net in record.addresses.iter().copied().chain(primary) {
            for (seen, owner) in &nets {
                assert!(
                    !(seen.contains(&net.network()) || net.contains(&seen.network())),
                    "{net} of {node}'s {interface} overlaps {seen} of {owner}"
                );
            }
            nets.push((net, format!("{node}'s {interface}")));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_record_naming_another_nodes_address_is_refused_and_reported() {
    let (rig, b, reset) = failover_onto_a_reset_cloud().await;
    // The reset cloud hands node-0000's addresses out again for node-0001: refused.
    wait_soon("node-0001's interface is recorded or refused", || {
        b.shared.cloud_record_conflicts() > 0
            || rig.agent("node-0001").records.values().next().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_records_disjoint(&rig).await;
    assert!(b.shared.cloud_record_conflicts() > 0);
    let problems = b.shared.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("recorded on interface") && p.contains("node-0000")),
        "{problems:#?}"
    );
    let metrics = b.shared.cloud_metrics_text();
    assert!(
        metrics.contains("corral_operator_cloud_record_conflicts_total ")
            && !metrics.contains("corral_operator_cloud_record_conflicts_total 0\n"),
        "{metrics}"
    );
    // Nothing of node-0001 was written over node-0000's addresses, and node-0000's record is
    // as op-a left it.
    let recorded = records(&rig.kv).await;
    assert!(
        recorded.iter().all(|(node, ..)| node == "node-0000"),
        "{recorded:#?}"
    );
    assert!(reset.interfaces().len() > 2, "the reset cloud did create");
    assert_consistent(&rig.kv).await;
}

#[tokio::test(start_paused = true)]
async fn a_new_leaders_resyncs_report_records_the_cloud_does_not_have() {
    let (rig, b, _reset) = failover_onto_a_reset_cloud().await;
    // The first full resync only suspects (a describe lags behind a record just written);
    // the one after the lag bound reports.
    let recorded = records(&rig.kv).await;
    let (_, interface, _) = recorded
        .iter()
        .find(|(node, ..)| node == "node-0000")
        .expect("node-0000's record")
        .clone();
    wait_every(
        "node-0000's record is reported missing",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || !b.shared.cloud_records_missing().is_empty(),
    )
    .await;
    let missing = b.shared.cloud_records_missing();
    assert_eq!(
        missing,
        vec![format!(
            "cloud interface {interface} is recorded for node node-0000, the cloud does not \
             have it"
        )],
    );
    assert!(b.shared.problems().contains(&missing[0]));
    let metrics = b.shared.cloud_metrics_text();
    assert!(
        metrics.contains("corral_operator_cloud_records_missing 1\n"),
        "{metrics}"
    );
    // It stays reported on later resyncs (not flapping), and was reported once.
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(b.shared.cloud_records_missing(), missing);
    assert_eq!(
        b.shared
            .problems()
            .iter()
            .filter(|p| **p == missing[0])
            .count(),
        1
    );
}
