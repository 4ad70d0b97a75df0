//! The cloud node manager's scenarios on the fake EC2 (CLUSTER-DESIGN 7), laptop tier: operator
//! replicas in-process on `MemKv`, `FakeEc2` with its real limits, latencies, buckets and
//! describe lag, tokio's paused clock; the agents played by the test by the protocol. Each
//! scenario ends with `corral_cluster::check` and the invariants of `Rig::assert_invariants`.

mod common;

use std::time::Duration;

use common::cloud::*;
use common::*;
use corral_cloud::Action;

fn names(n: usize) -> Vec<(String, &'static str)> {
    (0..n)
        .map(|i| (format!("node-{i:04}"), "m5.large"))
        .collect()
}

async fn leads(replica: &Replica) {
    wait_until("a replica leads", Duration::from_secs(30), || async {
        replica.leading()
    })
    .await;
}

/// A small start: three nodes get pre-allocate 8 on their primary interface, pods come and
/// the agents' demand moves the watermarks, excess goes back through the handshake.
#[tokio::test(start_paused = true)]
async fn three_nodes_get_their_spare_addresses_and_give_back_the_excess() {
    let config = cloud_config(
        "release_delay_secs = 10\n[pools.watermarks]\npre_allocate = 8",
        "first_interface_index = 0",
    );
    let ec2 = fake_builder(1).build().unwrap();
    let rig = Rig::new(&config, ec2, &names(3)).await;
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(rig.options()));
    leads(&a).await;
    wait_until(
        "every node has 8 spare",
        Duration::from_secs(60),
        || async { (0..3).all(|i| rig.free_of(&format!("node-{i:04}")) == 8) },
    )
    .await;
    // 5 pods: 3 more addresses wanted to keep 8 spare.
    rig.set_pods("node-0000", 5);
    wait_until("node-0000 grows", Duration::from_secs(60), || async {
        rig.agent("node-0000").pods.len() == 5 && rig.free_of("node-0000") == 8
    })
    .await;
    assert_eq!(rig.agent("node-0000").pods.len(), 5);
    // All pods gone: 5 excess released through the handshake after the release delay.
    rig.set_pods("node-0000", 0);
    wait_until("node-0000 shrinks", Duration::from_secs(120), || async {
        let agent = rig.agent("node-0000");
        agent.pods.is_empty() && agent.entries().len() == 8
    })
    .await;
    assert!(a.shared.cloud_calls("UnassignPrivateIpAddresses", "ok") >= 1);
    rig.assert_invariants().await;
}

/// Scenario 1: 1,000 m5.large nodes scale out to 8 spare addresses each from one interface
/// each; the virtual time and the fake's RequestLimitExceeded share are printed.
#[tokio::test(start_paused = true)]
async fn scenario_1_a_thousand_nodes_scale_out_within_the_assign_bucket() {
    let config = cloud_config(
        "[pools.watermarks]\npre_allocate = 8",
        "first_interface_index = 0",
    );
    let ec2 = fake_builder(11).build().unwrap();
    let n = 1000;
    let rig = Rig::new(&config, ec2, &names(n)).await;
    rig.ec2.reset_counters();
    let started = tokio::time::Instant::now();
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(rig.options()));
    leads(&a).await;
    let took = wait_every(
        "every node has 8 spare addresses",
        Duration::from_secs(600),
        Duration::from_millis(500),
        || {
            let state = rig.agents.lock().unwrap();
            state.nodes.values().all(|agent| agent.entries().len() >= 8)
        },
    )
    .await;
    let took = took.max(started.elapsed());
    let counters = rig.ec2.counters();
    let calls = counters.total_calls();
    let throttled = counters.total_throttled();
    let assigns = counters.calls(Action::AssignPrivateIpAddresses);
    eprintln!(
        "scenario 1: {n} nodes in {:.1} s virtual; {calls} calls ({assigns} assigns), {throttled} throttled ({:.2}%)",
        took.as_secs_f64(),
        100.0 * throttled as f64 / calls.max(1) as f64
    );
    // One interface each, the primary: no interface created.
    assert_eq!(counters.calls(Action::CreateNetworkInterface), 0);
    assert!(took <= Duration::from_secs(198), "took {took:?}");
    assert!(throttled * 100 < calls, "{throttled} of {calls} throttled");
    rig.assert_invariants().await;
}
