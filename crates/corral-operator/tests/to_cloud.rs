//! `to-cloud` node-cidr pools (nodeipam's `IPAMFromCluster`) on the fake EC2, laptop tier:
//! the operator grants node CIDRs and delegates each to its node's primary interface (an IPv4
//! /28, an IPv6 /80); crashes between the intent and the call and between the call and its
//! record, a throttling storm, refusals, removals and a length the cloud cannot take. Each
//! scenario ends with `check`, the cloud's truth against the records, and no prefix on two
//! interfaces.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::cloud::*;
use common::*;
use corral_cloud::{
    Action, AttachInterface, CloudError, CloudProvider, CreateInterface, FakeEc2, Ipv4Assign,
    Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface, Tags,
};
use corral_cluster::IpNet;
use corral_operator::CloudOptions;

/// A to-cloud pool: IPv4 /28s from 10.0.32.0/19 (inside `subnet-a`), IPv6 /80s from the
/// subnet's /64 (its first /80 reserved: EC2 never delegates it).
fn config(v4_len: u8, quarantine_secs: u64) -> String {
    synced_config(
        "to-cloud",
        quarantine_secs,
        ("10.0.32.0/19", v4_len),
        "2600:1f14:1:100::/64",
        "reserved = [\"2600:1f14:1:100::/80\"]\n",
    )
}

fn ec2(seed: u64) -> FakeEc2 {
    dual_stack_fake(seed, "2600:1f14:1:100::/64")
}

/// `n` m5.large nodes named `node-000`...
fn names(n: usize) -> Vec<(String, &'static str)> {
    names_padded(n, 3)
}

async fn leads(replica: &Replica) {
    wait_leading(replica, Duration::from_secs(60)).await;
}

/// The node CIDRs granted, by node.
async fn granted(rig: &Rig) -> BTreeMap<String, BTreeSet<IpNet>> {
    let mut out: BTreeMap<String, BTreeSet<IpNet>> = BTreeMap::new();
    for kv in under(&rig.kv, "owned/").await {
        if let Ok(corral_cluster::Key::Owned { node, cidr, .. }) = keys().parse(&kv.key_str()) {
            out.entry(node.to_string()).or_default().insert(cidr);
        }
    }
    out
}

/// The prefixes on each node's primary interface, in the cloud's truth.
fn delegated(rig: &Rig) -> BTreeMap<String, BTreeSet<IpNet>> {
    let interfaces = rig.ec2.interfaces();
    rig.instances
        .iter()
        .map(|(name, instance)| {
            let prefixes = interfaces
                .iter()
                .filter(|ni| {
                    ni.attachment
                        .as_ref()
                        .is_some_and(|a| a.instance_id == *instance && a.device_index == 0)
                })
                .flat_map(|ni| ni.prefixes())
                .collect();
            (name.clone(), prefixes)
        })
        .collect()
}

fn mutations(rig: &Rig) -> u64 {
    let c = rig.ec2.counters();
    [
        Action::AssignPrivateIpAddresses,
        Action::UnassignPrivateIpAddresses,
        Action::AssignIpv6Addresses,
        Action::UnassignIpv6Addresses,
    ]
    .into_iter()
    .map(|a| c.calls(a))
    .sum()
}

/// Every node with its two grants, each on its primary interface and nothing else there.
async fn in_sync(rig: &Rig) -> bool {
    let granted = granted(rig).await;
    let delegated = delegated(rig);
    granted.len() == rig.instances.len()
        && granted.values().all(|g| g.len() == 2)
        && rig
            .instances
            .keys()
            .all(|n| granted.get(n) == delegated.get(n))
}

/// The end: `check`, the records against the truth (no prefix on two interfaces), every
/// `delegations/` key naming a grant of its node, no intent open.
async fn assert_end(rig: &Rig) {
    rig.assert_invariants().await;
    let mut seen: BTreeMap<IpNet, String> = BTreeMap::new();
    for ni in rig.ec2.interfaces() {
        for p in ni.prefixes() {
            if let Some(other) = seen.insert(p, ni.id.clone()) {
                panic!("{p} on {other} and {}", ni.id);
            }
        }
    }
    assert!(under(&rig.kv, "intents/").await.is_empty(), "intents open");
}

async fn delegation_keys(rig: &Rig) -> usize {
    under(&rig.kv, "delegations/").await.len()
}

/// 50 dual-stack nodes: each primary interface ends with exactly its /28 and /80, one explicit
/// assign per family and node, and no call but the resync's describes after that.
/// Replica op-a on the rig's cloud, once it leads and every node is in sync (`what`, within
/// `limit`); how long the sync took.
async fn lead_in_sync(rig: &Rig, what: &str, limit: Duration) -> (Replica, Duration) {
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(rig.options()));
    leads(&a).await;
    let took = wait_until(what, limit, || async { in_sync(rig).await }).await;
    (a, took)
}

#[tokio::test(start_paused = true)]
async fn fifty_dual_stack_nodes_get_their_node_cidrs_delegated_and_then_no_calls() {
    let rig = Rig::new(&config(28, 30), ec2(1), &names(50)).await;
    rig.ec2.reset_counters();
    let (a, took) = lead_in_sync(&rig, "every node in sync", Duration::from_secs(120)).await;
    let c = rig.ec2.counters();
    eprintln!(
        "50 dual-stack nodes delegated in {:.1} s virtual: {} v4 assigns, {} v6 assigns, {} describes",
        took.as_secs_f64(),
        c.calls(Action::AssignPrivateIpAddresses),
        c.calls(Action::AssignIpv6Addresses),
        c.calls(Action::DescribeNetworkInterfaces)
    );
    assert_eq!(c.calls(Action::AssignPrivateIpAddresses), 50);
    assert_eq!(c.calls(Action::AssignIpv6Addresses), 50);
    wait_until("keys written", Duration::from_secs(10), || async {
        delegation_keys(&rig).await == 100
    })
    .await;
    // Converged: ten minutes with nothing but the periodic resync.
    let before = mutations(&rig);
    let describes = rig.ec2.counters().calls(Action::DescribeNetworkInterfaces);
    let instances = rig.ec2.counters().calls(Action::DescribeInstances);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(mutations(&rig), before, "no mutation after convergence");
    assert_eq!(
        rig.ec2.counters().calls(Action::DescribeInstances),
        instances,
        "no per-node describe after convergence"
    );
    // One interface describe per resync (every 60 s), nothing per node.
    let resyncs = rig.ec2.counters().calls(Action::DescribeNetworkInterfaces) - describes;
    assert!(resyncs <= 11, "{resyncs} interface describes in 10 minutes");
    assert!(
        a.shared.reported().iter().all(|p| !p.contains("to-cloud")),
        "{:#?}",
        a.shared.reported()
    );
    assert_end(&rig).await;
}

/// A provider that stops an explicit prefix assign before it is sent (the leader "crashes"
/// between its intent and the call), or after it was applied (between the call and its record).
#[derive(Clone)]
struct Gate {
    inner: Audited,
    block_before: Arc<AtomicBool>,
    hang_after: Arc<AtomicBool>,
    stopped: Arc<AtomicU64>,
}

impl Gate {
    async fn gate_before(&self) {
        if self.block_before.load(Ordering::SeqCst) {
            self.stopped.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
    }
    /// `call`, stopped before it is sent or after it was applied as the gate says.
    async fn gated<T>(
        &self,
        call: impl Future<Output = Result<T, CloudError>>,
    ) -> Result<T, CloudError> {
        self.gate_before().await;
        let answer = call.await?;
        self.gate_after().await;
        Ok(answer)
    }
    async fn gate_after(&self) {
        if self.hang_after.load(Ordering::SeqCst) {
            self.stopped.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
    }
}

impl CloudProvider for Gate {
    forward_describes!(inner);
    async fn create_interface(
        &self,
        request: &CreateInterface,
    ) -> Result<NetworkInterface, CloudError> {
        self.inner.create_interface(request).await
    }
    async fn attach_interface(&self, request: AttachInterface<'_>) -> Result<String, CloudError> {
        self.inner.attach_interface(request).await
    }
    async fn detach_interface(&self, attachment: &str, force: bool) -> Result<(), CloudError> {
        self.inner.detach_interface(attachment, force).await
    }
    async fn delete_interface(&self, interface: &str) -> Result<(), CloudError> {
        self.inner.delete_interface(interface).await
    }
    async fn assign_ipv4(
        &self,
        interface: &str,
        request: &Ipv4Assign,
    ) -> Result<Ipv4Set, CloudError> {
        self.gated(self.inner.assign_ipv4(interface, request)).await
    }
    async fn unassign_ipv4(&self, interface: &str, release: &Ipv4Set) -> Result<(), CloudError> {
        self.gated(self.inner.unassign_ipv4(interface, release))
            .await
    }
    async fn assign_ipv6(
        &self,
        interface: &str,
        request: &Ipv6Assign,
    ) -> Result<Ipv6Set, CloudError> {
        self.gated(self.inner.assign_ipv6(interface, request)).await
    }
    async fn unassign_ipv6(&self, interface: &str, release: &Ipv6Set) -> Result<(), CloudError> {
        self.gated(self.inner.unassign_ipv6(interface, release))
            .await
    }
    async fn create_tags(&self, ids: &[String], tags: &Tags) -> Result<(), CloudError> {
        self.inner.create_tags(ids, tags).await
    }
    async fn delete_tags(&self, ids: &[String], tag_keys: &[String]) -> Result<(), CloudError> {
        self.inner.delete_tags(ids, tag_keys).await
    }
}

fn gated(rig: &Rig, before: bool, after: bool) -> (CloudOptions<Gate>, Arc<AtomicU64>) {
    let stopped: Arc<AtomicU64> = Arc::default();
    let gate = Gate {
        inner: (*rig.provider).clone(),
        block_before: Arc::new(AtomicBool::new(before)),
        hang_after: Arc::new(AtomicBool::new(after)),
        stopped: Arc::clone(&stopped),
    };
    let mut options = CloudOptions::new(Arc::new(gate));
    options.clock = Arc::clone(&rig.clock);
    (options, stopped)
}

/// Leaders killed, five times each, between the intent and the call and between the call and
/// its record (two nodes added before each round): the next leader replays every intent (an
/// unsent call forgotten and made again, an applied one recorded), no prefix is assigned twice
/// and nothing is left over.
#[tokio::test(start_paused = true)]
async fn crashes_between_intent_call_and_record_are_replayed_without_duplicates() {
    let mut rig = Rig::new(&config(28, 30), ec2(2), &names(2)).await;
    let mut n = 2;
    for round in 0..10 {
        let (before, after) = if round % 2 == 0 {
            (true, false)
        } else {
            (false, true)
        };
        for _ in 0..2 {
            rig.add_node(&format!("node-{n:03}"), "m5.large").await;
            n += 1;
        }
        let (options, stopped) = gated(&rig, before, after);
        let crashing = Replica::start_with_cloud(&rig.kv, &format!("op-{round}"), Some(options));
        leads(&crashing).await;
        wait_until(
            "calls stopped at the gate",
            Duration::from_secs(120),
            || async { stopped.load(Ordering::SeqCst) >= 2 },
        )
        .await;
        assert!(
            !under(&rig.kv, "intents/").await.is_empty(),
            "round {round}: intents are open at the crash"
        );
        crashing.kill();
    }
    let survivor = Replica::start_with_cloud(&rig.kv, "op-last", Some(rig.options()));
    leads(&survivor).await;
    wait_until("every node in sync", Duration::from_secs(300), || async {
        in_sync(&rig).await && under(&rig.kv, "intents/").await.is_empty()
    })
    .await;
    wait_until("keys written", Duration::from_secs(30), || async {
        delegation_keys(&rig).await == 2 * n
    })
    .await;
    // Nothing assigned twice: explicit prefixes land once; the fake refuses a second assign of
    // a prefix held, so every successful assign is one delegation.
    let before = mutations(&rig);
    tokio::time::sleep(Duration::from_secs(180)).await;
    assert_eq!(mutations(&rig), before, "no call after convergence");
    assert_end(&rig).await;
}

/// A throttling storm (half of all calls refused for 60 s) while 50 dual-stack nodes are
/// delegated: the calls sent per action stay within the bucket's burst plus its refill, and
/// everything converges.
#[tokio::test(start_paused = true)]
async fn a_throttling_storm_sends_no_more_than_the_refill() {
    let rig = Rig::new(&config(28, 30), ec2(3), &names(50)).await;
    rig.ec2.reset_counters();
    rig.ec2.throttle_storm(0.5, Duration::from_secs(60));
    let started = tokio::time::Instant::now();
    let (_a, _) = lead_in_sync(&rig, "every node in sync", Duration::from_secs(240)).await;
    let seconds = started.elapsed().as_secs();
    let c = rig.ec2.counters();
    for action in [
        Action::AssignPrivateIpAddresses,
        Action::AssignIpv6Addresses,
    ] {
        let sent = c.calls(action);
        eprintln!(
            "storm: {action:?} sent {sent}, {} throttled, in {seconds} s",
            c.throttled(action)
        );
        assert!(
            sent <= 100 + 5 * seconds,
            "{action:?}: {sent} in {seconds} s"
        );
        assert!(c.throttled(action) > 0, "the storm throttled {action:?}");
    }
    assert_end(&rig).await;
}

/// A delegation the cloud refuses is reported and retried with the node's backoff (250 ms,
/// 500 ms, 1 s, ...), then made.
#[tokio::test(start_paused = true)]
async fn a_refused_delegation_is_reported_and_retried_with_backoff() {
    let rig = Rig::new(&config(28, 30), ec2(4), &names(1)).await;
    let refusal = CloudError::InvalidParameterValue {
        message: "refused for the test".into(),
    };
    rig.ec2
        .fail_next(Action::AssignPrivateIpAddresses, 4, refusal);
    rig.ec2.reset_counters();
    let (a, took) = lead_in_sync(&rig, "in sync", Duration::from_secs(60)).await;
    let assigns = rig.ec2.counters().calls(Action::AssignPrivateIpAddresses);
    assert_eq!(assigns, 5, "four refusals, then the delegation");
    // 250 + 500 + 1000 + 2000 ms of backoff at least.
    assert!(took >= Duration::from_millis(3750), "took {took:?}");
    let problems = a.shared.reported();
    assert!(
        problems
            .iter()
            .filter(|p| p.contains("refused for the test"))
            .count()
            == 4,
        "{problems:#?}"
    );
    assert_end(&rig).await;
}

/// A removed node's prefixes are taken back from its still running instance before its CIDRs
/// leave quarantine; the keys go with them.
#[tokio::test(start_paused = true)]
async fn a_removed_node_s_prefixes_are_taken_back_before_the_quarantine_ends() {
    let rig = Rig::new(&config(28, 30), ec2(5), &names(3)).await;
    let (_a, _) = lead_in_sync(&rig, "in sync", Duration::from_secs(60)).await;
    wait_until("keys written", Duration::from_secs(30), || async {
        delegation_keys(&rig).await == 6
    })
    .await;
    let name = "node-001";
    let registration = under(&rig.kv, &format!("nodes/{name}"))
        .await
        .first()
        .unwrap()
        .create_revision;
    request_removal(&rig.kv, name, registration).await;
    let took = wait_until("taken back", Duration::from_secs(60), || async {
        delegated(&rig)[name].is_empty() && delegation_keys(&rig).await == 4
    })
    .await;
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(
        under(&rig.kv, "quarantine/").await.len(),
        2,
        "still quarantined when taken back"
    );
    // The instance still runs: only the prefixes left.
    let instance = &rig.instances[name];
    assert_eq!(
        rig.ec2.instance_state(instance),
        Some(corral_cloud::InstanceState::Running)
    );
    // The others keep theirs; the rest of the check ignores the removed node's instance.
    let delegated = delegated(&rig);
    for other in ["node-000", "node-002"] {
        assert_eq!(delegated[other].len(), 2);
    }
    assert_end(&rig).await;
}

/// A pool whose IPv4 node CIDRs are /26 (EC2 delegates only /28s): reported naming the pool
/// and both lengths, no IPv4 call; the /80s are delegated, the grants all made.
#[tokio::test(start_paused = true)]
async fn a_length_the_cloud_cannot_take_is_reported_and_never_called() {
    let rig = Rig::new(&config(26, 30), ec2(6), &names(3)).await;
    rig.ec2.reset_counters();
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(rig.options()));
    leads(&a).await;
    wait_until("v6 delegated", Duration::from_secs(60), || async {
        delegated(&rig).values().all(|d| d.len() == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        rig.ec2.counters().calls(Action::AssignPrivateIpAddresses),
        0
    );
    assert_eq!(
        granted(&rig)
            .await
            .values()
            .map(BTreeSet::len)
            .sum::<usize>(),
        6
    );
    assert!(
        a.shared.problems().iter().any(|p| p
            .contains("pool pods ipv4: node CIDRs are /26, the cloud provider delegates only /28")),
        "{:#?}",
        a.shared.problems()
    );
    assert_end(&rig).await;
}

/// etcd going back in time (issue 20): nothing is delegated or taken back while the regression
/// is unsettled (delegation records made since the snapshot are forgotten); once granting
/// resumes, the nodes are brought in sync.
#[tokio::test(start_paused = true)]
async fn no_delegation_while_etcd_went_back_in_time_is_unsettled() {
    let rig = Rig::new(&config(28, 30), ec2(3), &names(2)).await;
    let (a, _) = lead_in_sync(&rig, "every node in sync", Duration::from_secs(120)).await;
    regression_seen(&rig, &a).await;
    // Someone takes node-000's IPv4 prefix off its interface (out of band): the sync would
    // delegate it again, but waits for granting to resume.
    let primary = primary(&rig, "node-000");
    let (interface, prefix) = (primary.id.clone(), primary.ipv4_prefixes[0]);
    unassign_out_of_band(&rig.ec2, &interface, IpNet::V4(prefix)).await;
    let before = mutations(&rig);
    while a.shared.regression_unsettled() {
        assert_eq!(mutations(&rig), before, "a mutation while unsettled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(
        "every node in sync again",
        Duration::from_secs(300),
        || async { in_sync(&rig).await },
    )
    .await;
    assert!(mutations(&rig) > before);
}
