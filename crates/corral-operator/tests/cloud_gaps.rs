//! The cloud node manager's known gaps, closed (laptop tier, the harness of `tests/cloud.rs`:
//! the real operator library on `MemKv`, `FakeEc2` behind `Audited`, tokio's paused clock):
//! a removed node's attached interfaces, empty managed interfaces, the memory of refused
//! prefixes across a failover, an unassign answered "not assigned", and a replayed unassign
//! while describes lag.

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::cloud::*;
use common::*;
use corral_cluster::{CloudInterfaceRecord, IpNet};

async fn open_intents(kv: &corral_kv::MemKv) -> usize {
    intents(kv).await.len()
}

/// The IPv4 entries the cloud's truth holds on an interface.
fn held(rig: &Rig, interface: &str) -> BTreeSet<IpNet> {
    let truth = rig.ec2.interface(interface).expect("the interface exists");
    truth
        .secondary_ipv4
        .iter()
        .map(|a| IpNet::from(std::net::IpAddr::V4(*a)))
        .chain(truth.ipv4_prefixes.iter().map(|p| IpNet::V4(*p)))
        .collect()
}

fn unassign_calls(rig: &Rig) -> u64 {
    rig.ec2
        .counters()
        .calls(corral_cloud::Action::UnassignPrivateIpAddresses)
}

/// Two m5.large nodes with `pre_allocate` 8, a leader `op-a`, both served (8 addresses each).
async fn two_served_nodes(seed: u64) -> (Rig, Replica) {
    let (rig, a) = Scenario::new(seed)
        .pool("[pools.watermarks]\npre_allocate = 8")
        .nodes(2, "m5.large")
        .start()
        .await;
    wait_soon("both nodes are served", || {
        rig.instances
            .keys()
            .all(|n| rig.agent(n).entries().len() == 8)
    })
    .await;
    (rig, a)
}

/// One m5.large node with `pre_allocate` 8 on its primary, grown by 6 pods to 14 addresses,
/// then emptied: 6 excess to release after the 10 s release delay.
async fn node_with_six_excess(seed: u64, lag: Duration) -> (Rig, Replica) {
    // A mean far above the cap: nearly every change shows exactly `lag` late.
    let (rig, a) = Scenario::new(seed)
        .pool("release_delay_secs = 10\n[pools.watermarks]\npre_allocate = 8")
        .cloud("first_interface_index = 0")
        .fake(fake_builder(seed).consistency_lag(lag * 20, lag))
        .nodes(1, "m5.large")
        .start()
        .await;
    rig.set_pods("node-0000", 6);
    wait_soon("6 pods and 8 spare", || {
        let agent = rig.agent("node-0000");
        agent.pods.len() == 6 && rig.free_of("node-0000") == 8
    })
    .await;
    (rig, a)
}

/// Gap 5: an unassign applied whose answer is lost (a timeout) is replayed while the describes
/// lag 5 s behind it: the replay waits within the describe lag bound of the call and then finds
/// the addresses gone, instead of unassigning again at once (refused "not assigned") and
/// again, until the describe caught up.
#[tokio::test(start_paused = true)]
async fn a_replayed_unassign_waits_out_the_describe_lag() {
    let (rig, _a) = node_with_six_excess(51, Duration::from_secs(5)).await;
    assert_eq!(unassign_calls(&rig), 0);
    rig.provider.timeout_unassigns.store(1, Ordering::SeqCst);
    rig.set_pods("node-0000", 0);
    rig.wait_entries("the excess is unassigned and recorded", "node-0000", 8)
        .await;
    // Settle: nothing is still open.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(open_intents(&rig.kv).await, 0);
    assert_eq!(
        unassign_calls(&rig),
        1,
        "one unassign call, its lost answer reconciled by describing"
    );
    assert_records_match_the_cloud(&rig).await;
    rig.assert_invariants().await;
}

/// Gap 4: an unassign naming an address the interface no longer has (removed behind the
/// record's back, as by an earlier call whose answer was lost) is refused whole by EC2 and the
/// fake ("not assigned"); the others are still assigned. The record drops none of them on
/// that answer: the intent's replay reads the interface, unassigns what is still there, and
/// only then records them all gone (before: all dropped from the record, five left assigned in
/// the cloud, unrecorded).
#[tokio::test(start_paused = true)]
async fn an_unassign_refused_as_not_assigned_drops_nothing_the_cloud_still_has() {
    let (rig, _a) = node_with_six_excess(52, Duration::from_millis(500)).await;
    let all = records(&rig.kv).await;
    assert_eq!(
        all.iter().map(|(.., r)| r.addresses.len()).sum::<usize>(),
        14
    );
    // The primary holds 9, a second interface 5: the marks go to the interface with most free
    // entries, highest first (the agent's report), so the primary's highest goes behind the
    // record's back.
    let (_, interface, record) = all.into_iter().find(|(.., r)| r.device_index == 0).unwrap();
    assert_eq!(record.addresses.len(), 9);
    let highest = *record.addresses.iter().max().unwrap();
    assert!(matches!(highest, IpNet::V4(_)), "IPv4");
    unassign_out_of_band(&rig.ec2, &interface, highest).await;
    rig.set_pods("node-0000", 0);
    rig.wait_entries("the excess leaves the record", "node-0000", 8)
        .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(open_intents(&rig.kv).await, 0);
    assert_eq!(held(&rig, &interface).len(), 3);
    assert_records_match_the_cloud(&rig).await;
    rig.assert_invariants().await;
}

/// Gap 1: a node removed (`corral node remove`) whose instance keeps running: its record goes
/// with a `Delete` intent, and the interface corral created for it is detached (not forced)
/// and deleted in seconds, not left attached forever (the collector only takes unattached
/// interfaces); the primary interface stays attached and untouched; nothing of the other
/// node changes.
#[tokio::test(start_paused = true)]
async fn a_removed_nodes_interfaces_on_a_running_instance_are_detached_and_deleted() {
    let (rig, _leader) = two_served_nodes(53).await;
    let name = "node-0001";
    let instance = rig.instances[name].clone();
    let theirs: Vec<String> = records(&rig.kv)
        .await
        .into_iter()
        .filter(|(n, ..)| n == name)
        .map(|(_, interface, record)| {
            assert!(record.managed && record.device_index >= 1);
            interface
        })
        .collect();
    assert_eq!(theirs.len(), 1);
    let primary = primary(&rig, name);
    let other: Vec<(String, CloudInterfaceRecord)> = records(&rig.kv)
        .await
        .into_iter()
        .filter(|(n, ..)| n != name)
        .map(|(_, i, r)| (i, r))
        .collect();
    let registration = registration(&rig.kv, name).await.unwrap();
    rig.agents.lock().unwrap().nodes.remove(&node(name));
    request_removal(&rig.kv, name, registration).await;
    let took = wait_soon("the removed node's interface is deleted", || {
        rig.ec2.interface(&theirs[0]).is_none()
    })
    .await;
    assert!(took < Duration::from_secs(60), "{took:?}");
    let deleted = rig.agents.lock().unwrap().deleted.clone();
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].node_tag.as_deref(), Some(name));
    // The primary is still attached to the running instance, with its own addresses.
    let still = rig.ec2.interface(&primary.id).unwrap();
    assert_eq!(
        still.attachment.as_ref().map(|a| a.instance_id.clone()),
        Some(instance)
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(records(&rig.kv).await.iter().all(|(n, ..)| n != name));
    assert_eq!(open_intents(&rig.kv).await, 0);
    let after: Vec<(String, CloudInterfaceRecord)> = records(&rig.kv)
        .await
        .into_iter()
        .map(|(_, i, r)| (i, r))
        .collect();
    assert_eq!(after, other);
    assert_consistent(&rig.kv).await;
}

/// Gap 2: an interface corral created that the release of excess left empty, on a node that
/// needs nothing, is detached and deleted (ipamd's `RemoveUnusedENIFromStore`) behind a
/// `Delete` intent, its addresses having gone back through the handshake first; and the node
/// does not create one again on the same demand (no flap).
#[tokio::test(start_paused = true)]
async fn an_empty_managed_interface_is_detached_and_deleted_without_flapping() {
    let name = "node-0000";
    let (rig, _leader) = Scenario::new(54)
        .pool("release_delay_secs = 10\n[pools.watermarks]\npre_allocate = 8")
        .nodes(1, "m5.large")
        .start()
        .await;
    // 10 pods and 8 spare: two managed interfaces of 9 (indexes 1 and 2).
    rig.set_pods(name, 10);
    wait_soon("10 pods and 8 spare", || {
        rig.agent(name).pods.len() == 10 && rig.free_of(name) == 8
    })
    .await;
    let before: Vec<String> = records(&rig.kv)
        .await
        .into_iter()
        .map(|(_, interface, record)| {
            assert!(record.managed);
            interface
        })
        .collect();
    assert_eq!(before.len(), 2);
    let creates = rig
        .ec2
        .counters()
        .calls(corral_cloud::Action::CreateNetworkInterface);
    rig.set_pods(name, 0);
    wait_every(
        "one interface left, with the 8 spare",
        Duration::from_secs(300),
        Duration::from_millis(100),
        || {
            let instance = &rig.instances[name];
            let on_instance = rig
                .ec2
                .interfaces()
                .into_iter()
                .filter(|ni| {
                    ni.attachment
                        .as_ref()
                        .is_some_and(|a| a.instance_id == *instance)
                })
                .count();
            on_instance == 2
                && rig.agent(name).entries().len() == 8
                && !rig.agents.lock().unwrap().deleted.is_empty()
        },
    )
    .await;
    let deleted = rig.agents.lock().unwrap().deleted.clone();
    assert_eq!(deleted.len(), 1);
    assert!(before.contains(&deleted[0].interface));
    // Settled: nothing created again, nothing open, the record and the cloud agree.
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(
        rig.ec2
            .counters()
            .calls(corral_cloud::Action::CreateNetworkInterface),
        creates
    );
    assert_eq!(rig.agents.lock().unwrap().deleted.len(), 1);
    assert_eq!(open_intents(&rig.kv).await, 0);
    assert_eq!(records(&rig.kv).await.len(), 1);
    assert_eq!(rig.free_of(name), 8);
    assert_records_match_the_cloud(&rig).await;
    rig.assert_invariants().await;
}

/// Gap 3: a prefix refused (`InsufficientCidrBlocks`) is remembered in the interface's record,
/// so a new leader does not ask that interface for a prefix again: after a failover, the node
/// needing one more address gets it as a single address in one call (before: the new leader
/// asked for a prefix first, refused again).
#[tokio::test(start_paused = true)]
async fn a_refused_prefix_is_remembered_across_a_failover() {
    let name = "node-0000";
    let (rig, a) = Scenario::new(55)
        .pool("[pools.watermarks]\npre_allocate = 8")
        .cloud("prefix_delegation = true\nfirst_interface_index = 0")
        .fake(
            corral_cloud::FakeEc2::builder()
                .seed(55)
                .subnet(zone_subnet("subnet-a", "10.0.0.0/20").fragmented(1.0)),
        )
        .nodes(1, "m5.large")
        .start()
        .await;
    wait_soon("8 spare addresses on the primary", || {
        rig.free_of(name) >= 8
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let recorded = records(&rig.kv).await;
    assert_eq!(recorded.len(), 1);
    let primary = &recorded[0].2;
    assert!(primary.addresses.iter().all(|a| a.prefix_len() == 32));
    assert!(
        primary.prefixes_refused_ms.is_some(),
        "the refusal is kept in the record"
    );
    a.kill();
    let b = Replica::start_with_cloud(&rig.kv, "op-b", Some(rig.options()));
    leads(&b).await;
    let assigns = || {
        rig.ec2
            .counters()
            .calls(corral_cloud::Action::AssignPrivateIpAddresses)
    };
    let before = assigns();
    rig.set_pods(name, 1);
    wait_soon("1 pod and 8 spare", || {
        rig.agent(name).pods.len() == 1 && rig.free_of(name) == 8
    })
    .await;
    assert_eq!(
        assigns() - before,
        1,
        "one assign of a single address, no prefix asked again"
    );
    assert_records_match_the_cloud(&rig).await;
    rig.assert_invariants().await;
}

/// Gap 1, the same for a node registered again on a new instance while its old instance runs
/// on: the old instance's corral interface is detached and deleted, not left attached there.
#[tokio::test(start_paused = true)]
async fn a_node_moved_to_a_new_instance_gives_back_the_old_instances_interface() {
    let name = "node-0000";
    let (mut rig, _leader) = Scenario::new(56)
        .pool("[pools.watermarks]\npre_allocate = 8")
        .nodes(1, "m5.large")
        .start()
        .await;
    wait_soon("the node is served", || {
        rig.agent(name).entries().len() == 8
    })
    .await;
    let old: Vec<String> = records(&rig.kv)
        .await
        .into_iter()
        .map(|(_, interface, _)| interface)
        .collect();
    assert_eq!(old.len(), 1);
    rig.add_node(name, "m5.large").await;
    wait_soon("the old instance's interface is deleted", || {
        rig.ec2.interface(&old[0]).is_none()
    })
    .await;
    wait_soon("the node is served on its new instance", || {
        rig.agent(name).entries().len() == 8
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(open_intents(&rig.kv).await, 0);
    assert_records_match_the_cloud(&rig).await;
}

/// A removed node's teardown that keeps failing (the detach refused for good) backs off as any
/// node's step does (250 ms doubling to 10 s), instead of retrying at the first backoff forever:
/// the removed node's backoff state is kept while it has intents or records left.
#[tokio::test(start_paused = true)]
async fn a_removed_nodes_failing_teardown_backs_off() {
    let (rig, _leader) = two_served_nodes(59).await;
    let name = "node-0001";
    let registration = registration(&rig.kv, name).await.unwrap();
    rig.ec2.fail_next(
        corral_cloud::Action::DetachNetworkInterface,
        100_000,
        corral_cloud::CloudError::UnauthorizedOperation {
            message: "not allowed".to_owned(),
        },
    );
    rig.agents.lock().unwrap().nodes.remove(&node(name));
    request_removal(&rig.kv, name, registration).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    let refused = rig
        .ec2
        .counters()
        .faults(corral_cloud::Action::DetachNetworkInterface);
    // Backing off: 250 ms doubling to 10 s is about 17 tries in 120 s; at 250 ms, about 480.
    assert!(refused >= 1, "the detach was tried");
    assert!(refused <= 30, "{refused} detach calls in 120 s: no backoff");
}
