//! Node CIDRs from the cloud (`cloud_sync = "from-cloud"`, nodeipam's `IPAMFromCloud`), laptop
//! tier: operator replicas in-process on `MemKv`, the fake EC2 (its limits, latencies, buckets,
//! describe lag) delegating /80s and /28s to instances' primary interfaces, tokio's paused clock.
//! Each scenario ends with `corral_cluster::check` (every node-cidr rule) and an auditor that saw
//! no CIDR granted while held.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::cloud::*;
use common::*;
use corral_cloud::{Action, Amount, CloudProvider, FakeEc2, Ipv4Assign, Ipv6Assign};
use corral_cluster::cloud::DESCRIBE_LAG_BOUND_MS;
use corral_cluster::{IpNet, Key, QuarantineRecord, decode_value};
use corral_kv::Kv;

/// The VPC's IPv6 /56 and the subnet's /64 inside it.
const VPC_V6: &str = "2600:1f14:0::/56";
const SUBNET_V6: &str = "2600:1f14:0:1::/64";

/// A dual-stack from-cloud pool: IPv4 /28s of the VPC's 10.0.0.0/16, IPv6 /80s of its /56.
fn from_cloud_config(v4_len: u8, v6_cidr: &str) -> String {
    synced_config("from-cloud", 5, ("10.0.0.0/16", v4_len), v6_cidr, "")
}

/// The fake with a dual-stack `subnet-a`.
fn fake(seed: u64) -> FakeEc2 {
    dual_stack_fake(seed, SUBNET_V6)
}

/// `n` m5.large nodes named `node-00`...
fn names(n: usize) -> Vec<(String, &'static str)> {
    names_padded(n, 2)
}

/// The primary interface (device index 0) of an instance, as the cloud holds it now.
/// The prefixes delegated to a node's primary interface now (the cloud's truth).
fn delegated(rig: &Rig, name: &str) -> BTreeSet<IpNet> {
    let ni = primary(rig, name);
    ni.prefixes().into_iter().collect()
}

/// The first /80 delegated to node `name`'s primary interface.
fn delegated_v6(rig: &Rig, name: &str) -> ipnet::Ipv6Net {
    let v6 = delegated(rig, name)
        .into_iter()
        .find(|c| c.addr().is_ipv6());
    let Some(IpNet::V6(v6)) = v6 else {
        unreachable!()
    };
    v6
}

/// `n` nodes on fake cloud `seed` in a from-cloud pool of /28s (and the VPC's /56), each
/// primary interface carrying `v6` /80s and `v4` /28s.
async fn delegated_nodes(
    n: usize,
    seed: u64,
    v6: u32,
    v4: u32,
) -> (Vec<(String, &'static str)>, Rig) {
    let nodes = names(n);
    let rig = Rig::new(&from_cloud_config(28, VPC_V6), fake(seed), &nodes).await;
    for (name, _) in &nodes {
        delegate(&rig, name, v6, v4).await;
    }
    (nodes, rig)
}

/// Replica op-a on the rig's cloud, once it leads and every node is in sync within `limit`.
async fn lead_in_sync(rig: &Rig, nodes: &[(String, &str)], limit: Duration) -> Replica {
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(rig.options()));
    leads(&a).await;
    all_in_sync(rig, nodes, limit).await;
    a
}

/// Delegates `v6` /80s and `v4` /28s to a node's primary interface.
async fn delegate(rig: &Rig, name: &str, v6: u32, v4: u32) {
    let id = primary(rig, name).id;
    if v6 > 0 {
        rig.ec2
            .assign_ipv6(&id, &Ipv6Assign::Prefixes(Amount::Count(v6)))
            .await
            .unwrap();
    }
    if v4 > 0 {
        rig.ec2
            .assign_ipv4(&id, &Ipv4Assign::Prefixes(Amount::Count(v4)))
            .await
            .unwrap();
    }
}

/// The CIDRs a node's agent is given: its `owned/<node>/` keys.
async fn owned(rig: &Rig, name: &str) -> BTreeSet<IpNet> {
    under(&rig.kv, &format!("owned/{name}/"))
        .await
        .into_iter()
        .filter_map(|e| match keys().parse(&e.key_str()) {
            Ok(Key::Owned { cidr, .. }) => Some(cidr),
            _ => None,
        })
        .collect()
}

/// Every grant of the store: CIDR → node.
async fn grant_map(rig: &Rig) -> BTreeMap<IpNet, String> {
    under(&rig.kv, "grants/")
        .await
        .into_iter()
        .filter_map(|e| {
            let Ok(Key::Grant { cidr, .. }) = keys().parse(&e.key_str()) else {
                return None;
            };
            let record = decode_value::<corral_cluster::GrantRecord>(&e.value).ok()?;
            Some((cidr, record.node.to_string()))
        })
        .collect()
}

/// Waits until every node's owned keys are exactly its primary interface's prefixes.
async fn all_in_sync(rig: &Rig, nodes: &[(String, &str)], limit: Duration) -> Duration {
    wait_until("every node holds its delegated prefixes", limit, || async {
        for (name, _) in nodes {
            if owned(rig, name).await != delegated(rig, name) {
                return false;
            }
        }
        true
    })
    .await
}

/// 50 nodes whose primary interfaces carry one /80 and two /28s each: every node is granted
/// exactly its prefixes (grant and owned keys, what its agent serves), nothing else; prefixes
/// delegated later come with the next pass; a removed node's grants go to quarantine.
#[tokio::test(start_paused = true)]
async fn fifty_nodes_get_exactly_their_delegated_prefixes() {
    let (nodes, rig) = delegated_nodes(50, 1, 1, 2).await;
    let auditor = Auditor::start(&rig.kv).await;
    rig.ec2.reset_counters();
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(rig.options()));
    leads(&a).await;
    let took = all_in_sync(&rig, &nodes, Duration::from_secs(60)).await;
    let describes = rig.ec2.counters().calls(Action::DescribeNetworkInterfaces);
    eprintln!("50 nodes in sync after {took:?} virtual, {describes} describe calls");
    // Full passes (one call each) served everyone: the first ones while the delegations were
    // not visible yet (describe lag), sooner than `resync` while nodes waited.
    assert!(took <= Duration::from_secs(15), "{took:?}");
    assert!(describes <= 10, "{describes} describe calls");
    for (name, _) in &nodes {
        let held = owned(&rig, name).await;
        assert_eq!(held.iter().filter(|c| c.addr().is_ipv4()).count(), 2);
        assert_eq!(held.iter().filter(|c| c.addr().is_ipv6()).count(), 1);
        assert!(a.shared.from_cloud_reports(name).is_empty(), "{name}");
    }
    assert_eq!(grant_map(&rig).await.len(), 150);
    assert_consistent(&rig.kv).await;
    // A /80 delegated later to node-07 (nobody waits: passes every `resync`, 60 s): granted
    // by the next pass.
    tokio::time::sleep(Duration::from_secs(30)).await;
    delegate(&rig, "node-07", 1, 0).await;
    assert_eq!(delegated(&rig, "node-07").len(), 4);
    let later = all_in_sync(&rig, &nodes, Duration::from_secs(90)).await;
    assert!(later <= Duration::from_secs(62), "{later:?}");
    // A new node registered with a delegated prefix is described at once, not at the next pass.
    let mut rig = rig;
    rig.add_node("node-50", "m5.large").await;
    delegate(&rig, "node-50", 1, 1).await;
    wait_until(
        "node-50 holds its prefixes",
        Duration::from_secs(20),
        || async { owned(&rig, "node-50").await.len() == 2 },
    )
    .await;
    // A removal: its grants deleted and quarantined (the removal path), never withdrawn by the sync.
    let registration = registration(&rig.kv, "node-03").await.unwrap();
    let held = owned(&rig, "node-03").await;
    request_removal(&rig.kv, "node-03", registration).await;
    wait_until("node-03 removed", Duration::from_secs(10), || async {
        owned(&rig, "node-03").await.is_empty()
    })
    .await;
    let quarantined: BTreeSet<IpNet> = under(&rig.kv, "quarantine/")
        .await
        .into_iter()
        .filter_map(|e| match keys().parse(&e.key_str()) {
            Ok(Key::Quarantine { cidr, .. }) => Some(cidr),
            _ => None,
        })
        .collect();
    assert_eq!(quarantined, held);
    // Its instance still carries the prefixes, the node is gone: nothing granted again.
    tokio::time::sleep(Duration::from_secs(70)).await;
    assert!(grant_map(&rig).await.keys().all(|c| !held.contains(c)));
    auditor.assert_clean();
    assert_consistent(&rig.kv).await;
    let metrics = a.shared.from_cloud_metrics_text();
    assert!(metrics.is_empty(), "{metrics}");
}

/// The cloud moves a /80 from node A's instance to node B's, describes lagging 5 s: A keeps
/// it until two describes at least the lag bound apart no longer show it, then it waits in
/// quarantine, and only then B is granted it; never both; the other prefixes stay put.
#[tokio::test(start_paused = true)]
async fn a_moved_prefix_is_withdrawn_after_the_lag_rule_and_quarantine_then_granted_to_the_other() {
    let (nodes, rig) = delegated_nodes(4, 2, 2, 1).await;
    rig.ec2
        .set_consistency_lag(Duration::from_secs(5), Duration::from_secs(5));
    let auditor = Auditor::start(&rig.kv).await;
    let mut options = rig.options();
    options.resync = Duration::from_secs(3);
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(options));
    leads(&a).await;
    all_in_sync(&rig, &nodes, Duration::from_secs(60)).await;
    let before = grant_map(&rig).await;
    let moved_v6 = delegated_v6(&rig, "node-00");
    let moved = IpNet::V6(moved_v6);
    let from = primary(&rig, "node-00").id;
    let to = primary(&rig, "node-01").id;
    unassign_out_of_band(&rig.ec2, &from, moved).await;
    rig.ec2
        .assign_ipv6(&to, &Ipv6Assign::Prefixes(Amount::Explicit(vec![moved_v6])))
        .await
        .unwrap();
    let moved_at = tokio::time::Instant::now();
    // Poll the store every 50 ms of virtual time: when A lost it, when B got it, never both.
    let mut withdrawn_at = None;
    let granted_at = loop {
        assert!(
            moved_at.elapsed() < Duration::from_secs(60),
            "the prefix never reached node-01"
        );
        let grants = grant_map(&rig).await;
        let a_holds = owned(&rig, "node-00").await.contains(&moved);
        let b_holds = owned(&rig, "node-01").await.contains(&moved);
        assert!(!(a_holds && b_holds), "both hold {moved}");
        if !a_holds && withdrawn_at.is_none() {
            withdrawn_at = Some(tokio::time::Instant::now());
        }
        if b_holds {
            assert_eq!(grants.get(&moved).map(String::as_str), Some("node-01"));
            break tokio::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let withdrawn_at = withdrawn_at.unwrap();
    let lag_bound = Duration::from_millis(DESCRIBE_LAG_BOUND_MS);
    eprintln!(
        "withdrawn {:?} after the move, granted to node-01 {:?} after the withdrawal",
        withdrawn_at - moved_at,
        granted_at - withdrawn_at
    );
    assert!(withdrawn_at - moved_at >= lag_bound, "withdrawn too soon");
    assert!(
        granted_at - withdrawn_at >= Duration::from_secs(5),
        "granted before the quarantine ended"
    );
    // The quarantine key named node-00 and the withdrawal.
    // Nothing else moved: every other grant is as before.
    let after = grant_map(&rig).await;
    for (cidr, node) in &before {
        if *cidr != moved {
            assert_eq!(after.get(cidr), Some(node), "{cidr}");
        }
    }
    all_in_sync(&rig, &nodes, Duration::from_secs(30)).await;
    auditor.assert_clean();
    assert_consistent(&rig.kv).await;
}

/// A prefix of the wrong length (a pool of IPv4 /27s: the cloud delegates /28s) or outside the
/// pool's CIDRs (IPv6 /80s of another /56) is reported and not granted; so are a node without an
/// instance ID and one whose primary interface has no prefix (waiting).
#[tokio::test(start_paused = true)]
async fn prefixes_of_the_wrong_length_or_outside_the_pool_are_reported_not_granted() {
    let nodes = names(2);
    let mut rig = Rig::new(&from_cloud_config(27, "2600:1f99::/56"), fake(3), &nodes).await;
    delegate(&rig, "node-00", 1, 1).await;
    // node-01: no prefix. And a node registered without an instance ID.
    register(&rig.kv, "bare").await;
    let a = Replica::start_with_cloud(&rig.kv, "op-a", Some(rig.options()));
    leads(&a).await;
    // Waiting at first (the delegations not visible yet), then the prefixes are reported.
    wait_until("node-00 reported", Duration::from_secs(30), || async {
        let reports = a.shared.from_cloud_reports("node-00");
        reports.len() == 2 && reports.iter().all(|r| !r.contains("waiting"))
    })
    .await;
    let reports = a.shared.from_cloud_reports("node-00");
    assert!(
        reports.iter().any(|r| r.contains("is not a /27")),
        "{reports:?}"
    );
    assert!(
        reports
            .iter()
            .any(|r| r.contains("outside the pool's CIDRs")),
        "{reports:?}"
    );
    let waiting = a.shared.from_cloud_reports("node-01");
    assert!(
        waiting.iter().all(|r| r.contains("no delegated prefix")) && waiting.len() == 2,
        "{waiting:?}"
    );
    let bare = a.shared.from_cloud_reports("bare");
    assert!(
        bare.iter().all(|r| r.contains("without an instance ID")) && bare.len() == 2,
        "{bare:?}"
    );
    let metrics = a.shared.from_cloud_metrics_text();
    for kind in ["wrong_length", "outside_pool", "no_prefix", "no_instance"] {
        assert!(
            metrics.contains(&format!(
                "corral_operator_from_cloud_reports{{kind=\"{kind}\"}}"
            )),
            "{metrics}"
        );
    }
    assert_reported(&a.shared, &["is not a /27"]);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(grant_map(&rig).await.is_empty());
    // The leader's own allocator carves nothing from a from-cloud pool either.
    rig.add_node("node-02", "m5.large").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(grant_map(&rig).await.is_empty());
    assert_consistent(&rig.kv).await;
}

/// Without a cloud provider a from-cloud pool grants nothing and every node is reported.
#[tokio::test(start_paused = true)]
async fn without_a_cloud_provider_nothing_is_granted_and_every_node_is_reported() {
    let (nodes, rig) = delegated_nodes(3, 4, 1, 1).await;
    let a = Replica::start(&rig.kv, "op-a");
    leads(&a).await;
    wait_until("every node reported", Duration::from_secs(10), || async {
        nodes
            .iter()
            .all(|(name, _)| !a.shared.from_cloud_reports(name).is_empty())
    })
    .await;
    assert_eq!(
        a.shared.from_cloud_reports("node-00"),
        vec![
            "pool pods takes node CIDRs from the cloud; this operator has no cloud provider"
                .to_owned()
        ]
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(grant_map(&rig).await.is_empty());
    assert_consistent(&rig.kv).await;
}

/// `MemKv` whose grant transactions answer 100 ms after they were applied: a leader killed
/// meanwhile leaves grants written whose answers it never heard.
#[derive(Clone)]
struct SlowKv {
    inner: corral_kv::MemKv,
}

impl Kv for SlowKv {
    forward_kv!(inner);

    async fn txn(&self, txn: corral_kv::Txn) -> Result<corral_kv::TxnResponse, corral_kv::KvError> {
        let grant = txn.success.iter().any(|op| match op {
            corral_kv::TxnOp::Put { key, .. } => {
                String::from_utf8_lossy(key).contains("/v1/grants/")
            }
            _ => false,
        });
        let response = self.inner.txn(txn).await;
        if grant {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        response
    }
    async fn watch(
        &self,
        prefix: &[u8],
        from: corral_kv::Revision,
    ) -> Result<corral_kv::Watch, corral_kv::KvError> {
        self.inner.watch(prefix, from).await
    }
}

/// The leader dropped mid-sync (a SIGKILL: nothing resigns) while 50 nodes are being granted,
/// grants applied whose answers it never heard: the standby finishes; no CIDR granted twice,
/// none lost, `check` clean.
#[tokio::test(start_paused = true)]
async fn a_leader_killed_mid_sync_leaves_no_duplicate_and_no_loss() {
    let (nodes, rig) = delegated_nodes(50, 5, 1, 2).await;
    let auditor = Auditor::start(&rig.kv).await;
    let slow = SlowKv {
        inner: rig.kv.clone(),
    };
    let a = Replica::start_with_cloud(&slow, "op-a", Some(rig.options()));
    leads(&a).await;
    let b = Replica::start_with_cloud(&rig.kv, "op-b", Some(rig.options()));
    wait_until("some grants made", Duration::from_secs(60), || async {
        !grant_map(&rig).await.is_empty()
    })
    .await;
    let granted_before = grant_map(&rig).await.len();
    a.kill();
    leads(&b).await;
    all_in_sync(&rig, &nodes, Duration::from_secs(90)).await;
    eprintln!("{granted_before} of 150 granted when the leader was killed");
    assert!(granted_before < 150, "killed too late to test anything");
    assert_eq!(grant_map(&rig).await.len(), 150);
    // Nothing was withdrawn: no quarantine key.
    let quarantined: Vec<QuarantineRecord> = under(&rig.kv, "quarantine/")
        .await
        .into_iter()
        .filter_map(|e| decode_value(&e.value).ok())
        .collect();
    assert!(quarantined.is_empty(), "{quarantined:?}");
    auditor.assert_clean();
    assert_consistent(&rig.kv).await;
}

/// A granted /80 gone from its primary starts a withdrawal clock; when the recheck at the lag
/// bound cannot describe the instance (describes failing), the node waits for the next full
/// pass: the sync does not describe it again turn after turn without pause.
#[tokio::test(start_paused = true)]
async fn a_failed_recheck_waits_for_the_next_pass_rather_than_spinning() {
    let (nodes, rig) = delegated_nodes(2, 6, 2, 1).await;
    let a = lead_in_sync(&rig, &nodes, Duration::from_secs(60)).await;
    let gone_v6 = delegated_v6(&rig, "node-00");
    let gone = IpNet::V6(gone_v6);
    unassign_out_of_band(&rig.ec2, &primary(&rig, "node-00").id, gone).await;
    // The next full pass (`resync`, 60 s) sees it gone: the clock runs.
    wait_until(
        "the withdrawal clock runs",
        Duration::from_secs(90),
        || async {
            a.shared
                .from_cloud_reports("node-00")
                .iter()
                .any(|line| line.contains("is gone from"))
        },
    )
    .await;
    rig.ec2.fail_next(
        Action::DescribeNetworkInterfaces,
        1_000_000,
        corral_cloud::CloudError::UnauthorizedOperation {
            message: "describes refused".to_owned(),
        },
    );
    rig.ec2.reset_counters();
    // Past the recheck, before the next full pass.
    tokio::time::sleep(Duration::from_millis(DESCRIBE_LAG_BOUND_MS) + Duration::from_secs(20))
        .await;
    let describes = rig.ec2.counters().calls(Action::DescribeNetworkInterfaces);
    eprintln!("{describes} describe calls while describes fail");
    assert!(
        describes <= 5,
        "{describes} describe calls: the recheck spins"
    );
    // Nothing withdrawn on a failed describe.
    assert!(owned(&rig, "node-00").await.contains(&gone));
}

/// etcd went back in time (here: answers under another cluster ID) while the cloud's
/// delegations changed: a /80 delegated to node-01 and a /28 taken off node-00. Grants,
/// delegations and records made since the snapshot are forgotten, so the sync plans nothing
/// until granting resumes (the regression settled): no grant made or withdrawn meanwhile;
/// then the new /80 is granted and the /28 withdrawn, as without a regression.
#[tokio::test(start_paused = true)]
async fn nothing_is_granted_or_withdrawn_while_etcd_went_back_in_time_is_unsettled() {
    let (nodes, rig) = delegated_nodes(2, 7, 1, 2).await;
    let a = lead_in_sync(&rig, &nodes, Duration::from_secs(60)).await;
    regression_seen(&rig, &a).await;
    let before = grant_map(&rig).await;
    delegate(&rig, "node-01", 1, 0).await;
    let taken = delegated(&rig, "node-00")
        .into_iter()
        .find_map(|c| match c {
            IpNet::V4(p) => Some(p),
            IpNet::V6(_) => None,
        })
        .unwrap();
    unassign_out_of_band(&rig.ec2, &primary(&rig, "node-00").id, IpNet::V4(taken)).await;
    let mut waited = Duration::ZERO;
    while a.shared.regression_unsettled() {
        assert_eq!(
            grant_map(&rig).await,
            before,
            "a grant changed while unsettled"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        waited += Duration::from_secs(1);
    }
    // The sync had passes to act on (it describes every `resync` and sooner while nodes wait).
    assert!(waited >= Duration::from_secs(10), "{waited:?}");
    all_in_sync(&rig, &nodes, Duration::from_secs(300)).await;
    let after = grant_map(&rig).await;
    assert!(!after.contains_key(&IpNet::V4(taken)));
    assert_eq!(
        after.keys().filter(|c| c.addr().is_ipv6()).count(),
        before.keys().filter(|c| c.addr().is_ipv6()).count() + 1
    );
    assert_consistent(&rig.kv).await;
}
