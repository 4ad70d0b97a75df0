//! Node CIDRs synced with the cloud (`cloud_sync` on node-cidr pools; nodeipam's
//! `IPAMFromCloud`), beside the leading loop: it describes the primary interface (device index
//! 0) of every node's instance, plans each from-cloud pool and family with
//! `corral_cluster::cloud::plan_from_cloud`, and carries the plan out in fenced transactions:
//! a grant writes the `grants/` and `owned/` keys any node CIDR has (compares: the grant,
//! owned and quarantine keys absent, the registration and the configuration unchanged, no
//! removal asked for), a withdrawal deletes them and quarantines the CIDR on a lease, as a node
//! removal does. The agent serves the grants as it serves any node CIDR.
//!
//! Describes: a full pass (one unfiltered DescribeNetworkInterfaces: every instance's primary
//! at once) first and every `resync` after (nodeipam's backoff after failures); a node
//! registered (or given its instance ID) meanwhile is described alone at once, and so is a node
//! whose granted CIDR went missing, once the describe-lag bound has passed (a withdrawal needs
//! two describes that far apart). Nothing is granted before the first full pass succeeded.
//! Every call goes through the term's call scheduler (the cloud node manager's buckets).
//!
//! Without a cloud provider nothing is granted, and every node is reported.
//!
//! The primaries described are kept per node ([`PrimarySeen`]): the to-cloud direction reads
//! the same describes (one per node and pass serves both).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_cloud::{CloudError, CloudProvider, InterfaceFilter, NetworkInterface};
use corral_cluster::cloud::{
    DESCRIBE_LAG_BOUND_MS, FromCloudInput, FromCloudPlan, Sight, plan_from_cloud,
};
use corral_cluster::{
    Family, GrantRecord, IpNet, Key, Keys, NodeName, OwnedRecord, PoolName, QuarantineRecord,
    Resync, RetryState, encode_value,
};
use corral_kv::{Compare, Kv, LeaseId, Revision, Txn, TxnOp};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::logged::Term;
use super::runner::{self, Reconciler, Runner};
use crate::WallClock;
use crate::election::Fence;
use crate::state::Shared;

/// Nodes described one by one in a turn at most; more take a full pass instead (one call).
const MAX_NODE_DESCRIBES: usize = 8;

/// Grants per transaction (3 compares and 2 puts each, within etcd's 128).
const GRANTS_PER_TXN: usize = 25;

/// How long a node waits after a compare failed on a stale view (the watch catches up).
const STALE_WAIT: Duration = Duration::from_millis(200);

/// The report of every node of a from-cloud pool when the operator has no cloud provider.
pub(crate) fn no_provider(pool: &PoolName) -> String {
    format!("pool {pool} takes node CIDRs from the cloud; this operator has no cloud provider")
}

/// What the leading loop tells the sync: nodes to describe, or plan again.
#[derive(Debug, Default)]
pub(crate) struct SyncSignal {
    state: Mutex<SignalState>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct SignalState {
    /// Registered or changed: describe them.
    describe: BTreeSet<NodeName>,
    /// Grants, quarantines or registrations changed: plan again from what was described.
    replan: bool,
}

impl SyncSignal {
    /// Notes a key that changed.
    pub(crate) fn note(&self, key: &Key, deleted: bool) {
        {
            let mut state = self.lock();
            match key {
                Key::Node { node } if !deleted => {
                    state.describe.insert(node.clone());
                }
                Key::Config
                | Key::Node { .. }
                | Key::Removal { .. }
                | Key::Grant { .. }
                | Key::Quarantine { .. } => state.replan = true,
                _ => return,
            }
        }
        self.notify.notify_one();
    }

    /// Plan again (a new view).
    pub(crate) fn all(&self) {
        self.lock().replan = true;
        self.notify.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SignalState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> SignalState {
        std::mem::take(&mut *self.lock())
    }
}

/// The cloud side of the sync: the term's scheduled provider, the full-pass period, the clock.
pub(crate) struct SyncCloud<P> {
    pub provider: Arc<P>,
    pub resync: Duration,
    pub clock: WallClock,
    pub workers: usize,
}

/// A node's primary interface as last described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrimarySeen {
    /// The instance described (the node's registration names it).
    pub instance_id: String,
    /// When the describe was sent (wall clock, ms).
    pub at_ms: u64,
    /// The primary interface, if found.
    pub interface: Option<PrimaryInterface>,
}

impl PrimarySeen {
    /// What a describe sent at `at_ms` answered for `instance_id`, given the primary
    /// interfaces it found by instance.
    fn described(
        instance_id: String,
        at_ms: u64,
        primaries: &HashMap<String, PrimaryInterface>,
    ) -> PrimarySeen {
        let interface = primaries.get(&instance_id).cloned();
        PrimarySeen {
            instance_id,
            at_ms,
            interface,
        }
    }
}

/// The parts of a primary interface the sync reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrimaryInterface {
    /// The interface.
    pub id: String,
    /// Its delegated prefixes, both families.
    pub prefixes: Vec<IpNet>,
}

impl PrimaryInterface {
    fn of(ni: &NetworkInterface) -> PrimaryInterface {
        PrimaryInterface {
            id: ni.id.clone(),
            prefixes: ni.prefixes(),
        }
    }
}

/// Describes the primary interfaces: of every instance (one unfiltered call) or of one.
/// Answers (instance → primary) and when the call was sent.
pub(crate) async fn describe_primaries<P: CloudProvider>(
    provider: &P,
    clock: &WallClock,
    instance: Option<&str>,
) -> Result<(HashMap<String, PrimaryInterface>, u64), CloudError> {
    let at_ms = clock();
    let filter = instance.map_or_else(InterfaceFilter::default, InterfaceFilter::instance);
    let interfaces = provider.describe_interfaces(&filter).await?;
    let primaries = interfaces
        .iter()
        .filter_map(|ni| {
            let a = ni.attachment.as_ref()?;
            (a.device_index == 0).then(|| (a.instance_id.clone(), PrimaryInterface::of(ni)))
        })
        .collect();
    Ok((primaries, at_ms))
}

/// The node CIDR sync of one leadership term: what it described, its clocks and its pass
/// schedule (named apart from `std::marker::Sync`, which a bare `Sync` would shadow).
struct NodeCidrSync<K, P> {
    ctx: Term<K>,
    cloud: Option<SyncCloud<P>>,
    signal: Arc<SyncSignal>,
    /// The first full pass succeeded: grants may be made.
    ready: bool,
    pass_at: Instant,
    pass_retry: RetryState,
    /// The backoff of full passes while some node waits for a prefix.
    waiting_retry: RetryState,
    /// Primaries as last described, by node.
    seen: HashMap<NodeName, PrimarySeen>,
    /// Withdrawal clocks per pool and family.
    clocks: BTreeMap<(PoolName, Family), BTreeMap<(NodeName, IpNet), u64>>,
    /// Nodes whose withdrawal clock ran out (their wait in the runner): described alone on the
    /// next turn, with those the signal names.
    due: BTreeSet<NodeName>,
    /// The first turn plans from what it describes; every later one takes the signal first.
    started: bool,
    /// Nodes this turn tried to describe alone without a describe to show for it (the call
    /// failed, or no instance ID to describe): no recheck at once, the next full pass decides.
    undescribed: BTreeSet<NodeName>,
    /// Plan again then (a refused transaction: the watch catches up first).
    replan_at: Option<Instant>,
    /// The reports last published (node → sentences), to log only what is new.
    reported: BTreeMap<String, BTreeSet<String>>,
    /// No from-cloud pool is configured: nothing is due but a signal.
    idle: bool,
}

/// Runs the sync until the view is gone (leading ended; the caller drops it with the lead).
pub(crate) async fn run<K: Kv, P: CloudProvider + 'static>(
    kv: K,
    keys: Keys,
    fence: Fence,
    shared: Arc<Shared>,
    cloud: Option<SyncCloud<P>>,
    signal: Arc<SyncSignal>,
) {
    let mut sync = NodeCidrSync {
        ctx: Term {
            kv,
            keys,
            fence,
            shared,
        },
        cloud,
        signal,
        ready: false,
        pass_at: Instant::now(),
        pass_retry: RetryState::default(),
        waiting_retry: RetryState::default(),
        seen: HashMap::new(),
        clocks: BTreeMap::new(),
        due: BTreeSet::new(),
        started: false,
        undescribed: BTreeSet::new(),
        replan_at: None,
        reported: BTreeMap::new(),
        idle: true,
    };
    // The sync runs no task of its own beside its turn: the runner keeps the nodes' rechecks.
    runner::run(&mut sync, &mut Runner::<NodeName, ()>::new(1)).await;
}

impl<K: Kv, P: CloudProvider + 'static> Reconciler for NodeCidrSync<K, P> {
    type Key = NodeName;
    type Done = ();
    type Wake = ();
    /// The view is gone (leading ended).
    type End = ();

    async fn turn(&mut self, runner: &mut Runner<NodeName, ()>) -> Result<(), ()> {
        let (mut describe, replan) = if std::mem::replace(&mut self.started, true) {
            let state = self.signal.take();
            (state.describe, state.replan)
        } else {
            (BTreeSet::new(), true)
        };
        describe.append(&mut self.due);
        self.take_turn(runner, describe, replan).await.ok_or(())
    }

    async fn wait(&mut self) {
        let wake = self.next_wake();
        tokio::select! {
            biased;
            () = self.signal.notify.notified() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }

    async fn woke(&mut self, _: &mut Runner<NodeName, ()>, (): ()) -> Result<(), ()> {
        Ok(())
    }

    async fn finish(&mut self, _: &mut Runner<NodeName, ()>, (): ()) -> Result<(), ()> {
        Ok(())
    }

    fn due(&mut self, nodes: Vec<NodeName>) {
        self.due.extend(nodes);
    }
}

impl<K: Kv, P: CloudProvider + 'static> NodeCidrSync<K, P> {
    fn next_wake(&self) -> Instant {
        let mut wake = Instant::now() + Duration::from_secs(3600);
        if self.idle {
            return wake;
        }
        if self.cloud.is_some() {
            wake = wake.min(self.pass_at);
        }
        if let Some(at) = self.replan_at {
            wake = wake.min(at);
        }
        wake
    }

    /// One turn: describe what is due, plan, carry out. `None` when the view is gone.
    async fn take_turn(
        &mut self,
        runner: &mut Runner<NodeName, ()>,
        describe: BTreeSet<NodeName>,
        mut replan: bool,
    ) -> Option<()> {
        let families = self
            .ctx
            .shared
            .with_view(|view, _| view.from_cloud_families())?;
        self.idle = families.is_empty();
        if self.idle {
            self.publish(BTreeMap::new());
            self.clocks.clear();
            runner.forget_all();
            return Some(());
        }
        let Some(cloud) = &self.cloud else {
            let reports = self.ctx.shared.with_view(|view, _| {
                let mut pools: Vec<&PoolName> = families.iter().map(|(p, _)| p).collect();
                pools.dedup();
                view.nodes()
                    .map(|(node, _)| {
                        let lines = pools
                            .iter()
                            .map(|p| ("no_provider", no_provider(p)))
                            .collect();
                        (node.to_string(), lines)
                    })
                    .collect()
            })?;
            self.publish(reports);
            return Some(());
        };
        let now = Instant::now();
        if self.replan_at.is_some_and(|at| at <= now) {
            self.replan_at = None;
            replan = true;
        }
        // The nodes the signal named and those whose recheck came (handed back by the runner).
        let alone: BTreeSet<NodeName> = describe;
        self.undescribed.clear();
        let described = if self.pass_at <= now || (self.ready && alone.len() > MAX_NODE_DESCRIBES) {
            let timing = Resync {
                resync: cloud.resync,
                ..self
                    .ctx
                    .shared
                    .with_view(|view, _| Resync::from(&view.config().resync))?
            };
            match describe_primaries(&*cloud.provider, &cloud.clock, None).await {
                Ok((primaries, at_ms)) => {
                    self.ctx.shared.resolve("cloud", "node CIDRs: describe");
                    self.absorb_pass(&primaries, at_ms)?;
                    self.ready = true;
                    self.pass_at = Instant::now() + self.pass_retry.success(&timing);
                    true
                }
                Err(error) => {
                    self.ctx.shared.raise(
                        "cloud",
                        "node CIDRs: describe",
                        format!("node CIDRs from the cloud: describe: {error}"),
                    );
                    self.pass_at = Instant::now() + self.pass_retry.error(&timing);
                    false
                }
            }
        } else if self.ready && !alone.is_empty() {
            let described = self.describe_alone(alone.clone()).await?;
            self.undescribed = alone.difference(&described).cloned().collect();
            true
        } else {
            false
        };
        if !self.ready || !(described || replan) {
            return Some(());
        }
        if self.ctx.shared.regression_unsettled() {
            // etcd went back in time: grants, delegations and their records made since the
            // snapshot are forgotten; nothing is planned until granting resumes.
            return Some(());
        }
        // Hook of the to-cloud direction (`leader/to_cloud.rs`): `self.seen` holds this turn's
        // describes of the primaries (`PrimarySeen`), the same ones the plan below reads.
        self.plan_and_carry_out(runner).await
    }

    /// A full pass: every registered node with an instance ID gets a sight.
    fn absorb_pass(
        &mut self,
        primaries: &HashMap<String, PrimaryInterface>,
        at_ms: u64,
    ) -> Option<()> {
        let instances: Vec<(NodeName, String)> = self.ctx.shared.with_view(|view, _| {
            view.nodes()
                .filter_map(|(node, e)| Some((node.clone(), e.record.instance_id.clone()?)))
                .collect()
        })?;
        self.seen.clear();
        for (node, instance_id) in instances {
            let seen = PrimarySeen::described(instance_id, at_ms, primaries);
            self.seen.insert(node, seen);
        }
        Some(())
    }

    /// Describes these nodes' instances one call each (at most `workers` at once); answers the
    /// nodes described.
    async fn describe_alone(&mut self, nodes: BTreeSet<NodeName>) -> Option<BTreeSet<NodeName>> {
        let cloud = self.cloud.as_ref()?;
        let instances: Vec<(NodeName, String)> = self.ctx.shared.with_view(|view, _| {
            nodes
                .iter()
                .filter_map(|node| {
                    let id = view.registration(node)?.record.instance_id.clone()?;
                    Some((node.clone(), id))
                })
                .collect()
        })?;
        let results = runner::all_bounded(
            cloud.workers,
            instances.into_iter().map(|(node, instance_id)| {
                let provider = Arc::clone(&cloud.provider);
                let clock = Arc::clone(&cloud.clock);
                async move {
                    let result = describe_primaries(&*provider, &clock, Some(&instance_id)).await;
                    (node, instance_id, result)
                }
            }),
        )
        .await;
        let mut described = BTreeSet::new();
        for (node, instance_id, result) in results {
            match result {
                Ok((primaries, at_ms)) => {
                    described.insert(node.clone());
                    let seen = PrimarySeen::described(instance_id, at_ms, &primaries);
                    self.seen.insert(node, seen);
                }
                Err(error) => {
                    // The next full pass describes it anyway.
                    self.ctx.shared.note_problem(format!(
                        "node CIDRs from the cloud: describe of node {node}'s instance: {error}"
                    ));
                }
            }
        }
        Some(described)
    }

    /// Plans every from-cloud pool and family and carries the plans out.
    async fn plan_and_carry_out(&mut self, runner: &mut Runner<NodeName, ()>) -> Option<()> {
        let now_ms = self.cloud.as_ref().map_or(0, |c| (c.clock)());
        let mut grants: BTreeMap<NodeName, Vec<(PoolName, Family, IpNet)>> = BTreeMap::new();
        let mut withdrawals: Vec<(NodeName, PoolName, Family, IpNet, i64)> = Vec::new();
        let mut reports: BTreeMap<String, BTreeSet<(&'static str, String)>> = BTreeMap::new();
        let mut registrations: HashMap<NodeName, (String, i64)> = HashMap::new();
        let seen = &self.seen;
        let clocks = &mut self.clocks;
        let config_revision = self.ctx.shared.with_view(|view, _| {
            // A cloud pool's prefixes on the same interface are its own (pools never overlap, so
            // they lie outside this pool anyway): those recorded are left out rather than
            // reported.
            let recorded: BTreeSet<IpNet> = view
                .cloud_interfaces()
                .filter_map(|(_, e)| e.record.as_ref())
                .flat_map(|r| r.addresses.iter().copied())
                .collect();
            let sights: BTreeMap<NodeName, Sight> = view
                .nodes()
                .map(|(node, entry)| {
                    registrations.insert(
                        node.clone(),
                        (entry.record.uid.clone(), entry.create_revision),
                    );
                    let sight = match (&entry.record.instance_id, seen.get(node)) {
                        (None, _) => Sight::NoInstance,
                        (Some(id), Some(s)) if *id == s.instance_id => match &s.interface {
                            Some(primary) => Sight::Primary {
                                at_ms: s.at_ms,
                                prefixes: primary
                                    .prefixes
                                    .iter()
                                    .filter(|p| !recorded.contains(p))
                                    .copied()
                                    .collect(),
                            },
                            None => Sight::Unseen,
                        },
                        (Some(_), _) => Sight::Unseen,
                    };
                    (node.clone(), sight)
                })
                .collect();
            for (pool, family) in view.from_cloud_families() {
                let Some(space) = view.space(&pool, family) else {
                    continue;
                };
                let held = view.pool_grants(&pool, family);
                let granted: BTreeMap<IpNet, NodeName> = held
                    .iter()
                    .map(|(cidr, (node, _))| (*cidr, node.clone()))
                    .collect();
                let quarantined = view.quarantined_cidrs(&pool, family);
                let key = (pool.clone(), family);
                let plan: FromCloudPlan = plan_from_cloud(&FromCloudInput {
                    pool: &pool,
                    family,
                    space,
                    granted: &granted,
                    quarantined: &quarantined,
                    nodes: &sights,
                    absent_since: clocks.get(&key).unwrap_or(&BTreeMap::new()),
                    lag_bound_ms: DESCRIBE_LAG_BOUND_MS,
                });
                for (node, cidr) in plan.grant {
                    grants
                        .entry(node)
                        .or_default()
                        .push((pool.clone(), family, cidr));
                }
                for (node, cidr) in plan.withdraw {
                    let revision = held.get(&cidr).map_or(0, |(_, r)| *r);
                    withdrawals.push((node, pool.clone(), family, cidr, revision));
                }
                for report in plan.reports {
                    reports.entry(report.node.to_string()).or_default().insert((
                        report.problem.kind(),
                        format!("pool {pool} {}: {}", family.name(), report.problem),
                    ));
                }
                clocks.insert(key, plan.absent_since);
            }
            view.config_revision()
        })?;
        // A running clock: the node is described alone once the bound has passed (unless a
        // describe that late was made already: a silent node waits for the next pass). A node
        // this turn could not describe (the call failed, no instance ID, no registration) waits
        // for the next full pass too, not a recheck at once turn after turn.
        let undescribed = std::mem::take(&mut self.undescribed);
        for clock in self.clocks.values() {
            for ((node, _), since) in clock {
                let due_ms = since.saturating_add(DESCRIBE_LAG_BOUND_MS);
                if undescribed.contains(node)
                    || self.seen.get(node).is_some_and(|s| s.at_ms >= due_ms)
                {
                    continue;
                }
                let wait = Duration::from_millis(due_ms.saturating_sub(now_ms));
                runner.come_back_by(node, Instant::now() + wait);
            }
        }
        // Nodes waiting for a prefix (none delegated yet, or not found: describes lag behind
        // a launch): the next full pass comes sooner, nodeipam's backoff from `InitialRetry`
        // to `MaxBackoff`, back to `resync` once nobody waits.
        let waiting = reports
            .values()
            .flatten()
            .any(|(kind, _)| matches!(*kind, "no_prefix" | "unseen"));
        if let Some(timing) = self
            .ctx
            .shared
            .with_view(|view, _| Resync::from(&view.config().resync))
        {
            if waiting {
                let soon = Instant::now() + self.waiting_retry.error(&timing);
                self.pass_at = self.pass_at.min(soon);
            } else {
                self.waiting_retry.success(&timing);
            }
        }
        self.publish(
            reports
                .into_iter()
                .map(|(node, lines)| (node, lines.into_iter().collect()))
                .collect(),
        );
        let refused = self
            .carry_out(grants, withdrawals, &registrations, config_revision, now_ms)
            .await?;
        if refused {
            self.replan_at = Some(Instant::now() + STALE_WAIT);
        }
        Some(())
    }

    /// Runs the grants (one transaction per node) and withdrawals; answers whether any
    /// transaction was refused or failed (the view was stale: plan again soon).
    async fn carry_out(
        &mut self,
        grants: BTreeMap<NodeName, Vec<(PoolName, Family, IpNet)>>,
        withdrawals: Vec<(NodeName, PoolName, Family, IpNet, i64)>,
        registrations: &HashMap<NodeName, (String, i64)>,
        config_revision: Revision,
        now_ms: u64,
    ) -> Option<bool> {
        let workers = self.cloud.as_ref().map_or(1, |c| c.workers.max(1));
        let mut txns: Vec<(Txn, Option<LeaseId>)> = Vec::new();
        let keys = &self.ctx.keys;
        for (node, cidrs) in grants {
            let Some((uid, node_revision)) = registrations.get(&node) else {
                continue;
            };
            for chunk in cidrs.chunks(GRANTS_PER_TXN) {
                match grant_txn(
                    keys,
                    &node,
                    uid,
                    *node_revision,
                    chunk,
                    config_revision,
                    now_ms,
                ) {
                    Ok(txn) => txns.push((self.ctx.fence.guard(txn), None)),
                    Err(error) => self
                        .ctx
                        .shared
                        .note_problem(format!("grant to {node}: {error}")),
                }
            }
        }
        if !withdrawals.is_empty() {
            let quarantine = self
                .ctx
                .shared
                .with_view(|view, _| view.config().quarantine_secs.max(1))?;
            match self
                .ctx
                .kv
                .lease_grant(Duration::from_secs(quarantine))
                .await
            {
                Ok(lease) => {
                    self.ctx
                        .shared
                        .resolve("etcd", "node CIDRs: quarantine lease");
                    for (node, pool, family, cidr, revision) in &withdrawals {
                        let record = QuarantineRecord {
                            from_node: node.clone(),
                            reason: "withdrawn: the cloud no longer delegates it to the node's \
                                     instance"
                                .to_owned(),
                            since_ms: now_ms,
                            state: Default::default(),
                        };
                        // The grant's end, recorded in the transaction that deletes it.
                        let ended = self
                            .ctx
                            .shared
                            .with_view(|view, _| view.ending_grant(node, pool, *family, cidr))
                            .unwrap_or_else(|| corral_cluster::history::EndingGrant {
                                pool: pool.clone(),
                                cidr: *cidr,
                                node: node.clone(),
                                record: None,
                            })
                            .ended(now_ms, corral_cluster::GrantEnd::Withdrawn);
                        match withdraw_txn(
                            keys, node, pool, *family, cidr, *revision, &record, lease, &ended,
                        ) {
                            Ok(txn) => txns.push((self.ctx.fence.guard(txn), Some(lease))),
                            Err(error) => self
                                .ctx
                                .shared
                                .note_problem(format!("withdrawal from {node}: {error}")),
                        }
                    }
                }
                Err(error) => {
                    self.ctx.shared.raise(
                        "etcd",
                        "node CIDRs: quarantine lease",
                        format!("node CIDRs from the cloud: quarantine lease: {error}"),
                    );
                    return Some(true);
                }
            }
        }
        let mut refused = false;
        let done = runner::all_bounded(
            workers,
            txns.into_iter().map(|(txn, _)| {
                let kv = self.ctx.kv.clone();
                async move {
                    let outcome = match kv.txn(txn.clone()).await {
                        Ok(response) if response.succeeded => Ok(response.revision),
                        Ok(_) => Err(None),
                        Err(error) => Err(Some(error)),
                    };
                    (txn, outcome)
                }
            }),
        )
        .await;
        for (txn, outcome) in done {
            match outcome {
                Ok(revision) => {
                    self.ctx.shared.resolve("etcd", "node CIDRs: txn");
                    self.apply(&txn, revision);
                }
                Err(None) => refused = true,
                Err(Some(error)) => {
                    // Applied or not, the watch tells; the lease is kept (its keys may be on it).
                    self.ctx.shared.raise(
                        "etcd",
                        "node CIDRs: txn",
                        format!("node CIDRs from the cloud: {error}"),
                    );
                    refused = true;
                }
            }
        }
        Some(refused)
    }

    /// Applies a committed transaction's writes to the view at once (the watch repeats them).
    fn apply(&self, txn: &Txn, revision: Revision) {
        self.ctx.shared.with_view_mut(|view, _| {
            for op in &txn.success {
                match op {
                    TxnOp::Put { key, value, .. } => {
                        let key = String::from_utf8_lossy(key);
                        view.apply_put(&key, value, revision, revision);
                    }
                    TxnOp::Delete { key } => {
                        view.apply_delete(&String::from_utf8_lossy(key), revision);
                    }
                    _ => {}
                }
            }
        });
    }

    /// Publishes the nodes' reports: status and metrics; a sentence not reported last time is
    /// logged as a problem.
    fn publish(&mut self, reports: BTreeMap<String, Vec<(&'static str, String)>>) {
        let mut now: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (node, lines) in &reports {
            let set: BTreeSet<String> = lines.iter().map(|(_, line)| line.clone()).collect();
            let before = self.reported.get(node);
            for line in &set {
                if before.is_none_or(|b| !b.contains(line)) {
                    self.ctx.shared.raise(
                        "from-cloud",
                        format!("{node}: {line}"),
                        format!("node {node}: {line}"),
                    );
                }
            }
            now.insert(node.clone(), set);
        }
        for (node, lines) in &self.reported {
            for line in lines {
                if now.get(node).is_none_or(|n| !n.contains(line)) {
                    self.ctx
                        .shared
                        .resolve("from-cloud", &format!("{node}: {line}"));
                }
            }
        }
        self.reported = now;
        self.ctx.shared.set_from_cloud_reports(reports);
    }
}

/// One node's grants as one transaction: for each CIDR the grant, owned and quarantine keys
/// absent; the registration, the configuration unchanged; no removal asked for.
fn grant_txn(
    keys: &Keys,
    node: &NodeName,
    uid: &str,
    node_revision: i64,
    cidrs: &[(PoolName, Family, IpNet)],
    config_revision: Revision,
    granted_ms: u64,
) -> Result<Txn, corral_cluster::ValueError> {
    let grant = encode_value(&GrantRecord {
        node: node.clone(),
        uid: uid.to_owned(),
        node_revision,
        granted_ms: Some(granted_ms),
    })?;
    let owned = encode_value(&OwnedRecord { node_revision })?;
    let mut txn = Txn::default();
    txn.compares
        .push(Compare::modified_at(keys.config(), config_revision));
    txn.compares
        .push(Compare::created_at(keys.node(node), node_revision));
    // A removal asked for lists the node's grants from the view: none may land after it.
    txn.compares.push(Compare::absent(keys.removal(node)));
    for (pool, family, cidr) in cidrs {
        let grant_key = keys.grant(pool, *family, cidr);
        let owned_key = keys.owned(node, pool, *family, cidr);
        txn.compares.push(Compare::absent(grant_key.clone()));
        txn.compares.push(Compare::absent(owned_key.clone()));
        txn.compares
            .push(Compare::absent(keys.quarantine(pool, *family, cidr)));
        txn.success.push(TxnOp::put(grant_key, grant.clone()));
        txn.success.push(TxnOp::put(owned_key, owned.clone()));
    }
    Ok(txn)
}

/// A withdrawal as one transaction: the grant (still the one planned on, by its create
/// revision) and its owned key deleted, the CIDR quarantined on the lease.
#[allow(clippy::too_many_arguments)]
fn withdraw_txn(
    keys: &Keys,
    node: &NodeName,
    pool: &PoolName,
    family: Family,
    cidr: &IpNet,
    grant_revision: i64,
    record: &QuarantineRecord,
    lease: LeaseId,
    ended: &corral_cluster::HistoryRecord,
) -> Result<Txn, corral_cluster::ValueError> {
    let grant_key = keys.grant(pool, family, cidr);
    let quarantine_key = keys.quarantine(pool, family, cidr);
    let mut txn = Txn::default();
    txn.compares
        .push(Compare::created_at(grant_key.clone(), grant_revision));
    txn.compares.push(Compare::absent(quarantine_key.clone()));
    txn.success.push(TxnOp::delete(grant_key));
    txn.success
        .push(TxnOp::delete(keys.owned(node, pool, family, cidr)));
    txn.success.push(TxnOp::put_on_lease(
        quarantine_key,
        encode_value(record)?,
        lease,
    ));
    for (key, value) in corral_cluster::history::puts(keys, ended)? {
        txn.success.push(TxnOp::put(key, value));
    }
    Ok(txn)
}
