//! Node CIDRs of `to-cloud` pools delegated to each node's instance in the cloud (nodeipam's
//! `IPAMFromCluster`), beside the leading loop and the cloud node manager: the leading loop
//! grants node CIDRs as for any node-cidr pool; this task puts each grant on the node's
//! primary interface (EC2: an explicit `Ipv4Prefixes` /28 or `Ipv6Prefixes` /80) and takes
//! back what corral delegated once the grant is gone (a removed node's too, while its instance
//! runs). The decisions are `corral_cluster::cloud::to_cloud`'s.
//!
//! Rules it keeps, as the cloud node manager does:
//! - no mutation before the first successful resync of its cloud view (every interface and
//!   subnet: two describe calls, then every `resync`);
//! - every mutation is preceded by a fenced `intents/<id>` put (`DelegatePrefix`,
//!   `UndelegatePrefix`) and followed by one fenced txn that writes (or deletes) the
//!   `delegations/` key and deletes the intent; an intent left open is replayed
//!   (`replay_delegation`) before the node is served again, by this leader or the next;
//! - one task per node at a time, at most `workers`; a refused call backs the node off with
//!   nodeipam's timing (250 ms doubling to 10 s by default), then it is retried;
//! - after convergence no call is made but the periodic resync's two describes.
//!
//! Its memory (the cloud view, backoffs, problems reported) is lost with the lead; a new leader
//! resyncs before it mutates anything.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use corral_cloud::{
    Amount, CloudError, CloudProvider, InstanceState, InterfaceFilter, Ipv4Assign, Ipv4Set,
    Ipv6Assign, Ipv6Set, NetworkInterface, Subnet,
};
use corral_cluster::cloud::to_cloud::{
    self as decide, Delegated, DelegationInput, DelegationReplay, DelegationStep, InstanceSight,
    PrimarySight, ToCloudPool,
};
use corral_cluster::{
    CloudEntry, CloudId, CloudIntentRecord, CloudOp, ClusterView, DelegationRecord, Family, IpNet,
    Key, Keys, NodeName, PoolName, Resync, encode_value,
};
use corral_kv::{Compare, Kv, Revision, Txn, TxnOp};
use tokio::time::Instant;

use super::logged::{Term, Write, WriteError};
use super::pending::PendingNodes;
use super::runner::{self, NodeManager, Runner};
use crate::WallClock;
use crate::election::Fence;
use crate::leader::cloud::describe::FullResync;
use crate::state::Shared;

/// How soon an intent the cloud's view could not settle yet is replayed again.
const REPLAY_WAIT: Duration = Duration::from_secs(3);

/// How long after the manager's own change a resync must begin to be trusted over it (EC2's
/// describes lag).
const OWN_CHANGES_KEPT: Duration =
    Duration::from_millis(corral_cluster::cloud::DESCRIBE_LAG_BOUND_MS);

/// What the leading loop tells the task: which nodes an event concerns.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    pending: PendingNodes,
}

impl Signal {
    /// Notes a key that changed.
    pub(crate) fn note(&self, key: &Key) {
        match key {
            Key::Node { node }
            | Key::Owned { node, .. }
            | Key::Removal { node }
            | Key::Delegation { node, .. } => self.pending.node(node),
            Key::Config => self.all(),
            _ => {}
        }
    }

    /// Every node must be looked at again.
    pub(crate) fn all(&self) {
        self.pending.all();
    }
}

/// What every task needs.
struct Ctx<K, P> {
    term: Term<K>,
    provider: Arc<P>,
    clock: WallClock,
}

impl<K: Clone, P> Clone for Ctx<K, P> {
    fn clone(&self) -> Self {
        Ctx {
            term: self.term.clone(),
            provider: Arc::clone(&self.provider),
            clock: Arc::clone(&self.clock),
        }
    }
}

/// One node's step, as planned.
enum Step {
    Replay(CloudId, CloudEntry<CloudIntentRecord>),
    Plan(DelegationStep),
}

/// How a node's step ended.
enum Outcome {
    Ok,
    Wait(Duration),
    Failed(String),
    Fenced,
}

/// What a task did, for the loop.
enum Done {
    Resync(Result<(Vec<NetworkInterface>, Vec<Subnet>), CloudError>),
    Node {
        node: NodeName,
        outcome: Outcome,
        writes: Vec<Write>,
        /// An instance described: its sight.
        described: Option<(String, Option<InstanceSight>)>,
        /// A prefix this step put on (true) or took off (false) an interface.
        changed: Option<(CloudId, IpNet, bool)>,
    },
}

#[derive(Debug, Default)]
struct NodeSync {
    /// Problems reported at the last plan (reported again only when they change).
    reported: Vec<String>,
}

struct Manager<K, P> {
    ctx: Ctx<K, P>,
    resync_every: Duration,
    signal: Arc<Signal>,
    ready: bool,
    resync: FullResync,
    /// Subnets' CIDRs by ID, from the last resync.
    subnets: BTreeMap<String, Vec<IpNet>>,
    /// Instances as the last resync showed them (only those with a primary interface).
    resynced: BTreeMap<String, PrimarySight>,
    /// Instances described since (over the resync's view until the next one).
    described: BTreeMap<String, InstanceSight>,
    /// This manager's own changes, over both views while a describe may not show them yet.
    own: BTreeMap<(CloudId, IpNet), (bool, Instant)>,
    nodes: BTreeMap<NodeName, NodeSync>,
    pending: BTreeSet<NodeName>,
    next_intent: u64,
    /// Pool-wide problems reported (a length the provider cannot take), once each.
    pool_problems: Vec<String>,
    /// Nothing to sync: nothing is due until the signal says otherwise.
    idle: bool,
}

/// Runs the to-cloud delegations until dropped (leading ended) or the view is gone.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn manage<K: Kv, P: CloudProvider + 'static>(
    kv: K,
    keys: Keys,
    fence: Fence,
    shared: Arc<Shared>,
    provider: Arc<P>,
    workers: usize,
    resync_every: Duration,
    clock: WallClock,
    signal: Arc<Signal>,
) {
    let manager = Manager {
        ctx: Ctx {
            term: Term {
                kv,
                keys,
                fence,
                shared,
            },
            provider,
            clock,
        },
        resync_every,
        signal,
        ready: false,
        resync: FullResync::new(),
        subnets: BTreeMap::new(),
        resynced: BTreeMap::new(),
        described: BTreeMap::new(),
        own: BTreeMap::new(),
        nodes: BTreeMap::new(),
        pending: BTreeSet::new(),
        next_intent: 0,
        pool_problems: Vec::new(),
        idle: false,
    };
    manager.signal.all();
    runner::manage(manager, workers).await;
}

impl<K: Kv, P: CloudProvider + 'static> NodeManager for Manager<K, P> {
    type Done = Done;

    /// One turn: take the signal, start what is due. `None` when the view is gone.
    fn turn(&mut self, runner: &mut Runner<NodeName, Done>) -> Option<()> {
        let (nodes, all) = self.signal.pending.take();
        let now = Instant::now();
        let shared = Arc::clone(&self.ctx.term.shared);
        shared.with_view(|view, _| {
            let pools = decide::to_cloud_pools(view.config());
            if all || !self.ready || self.idle {
                let concerned = concerned(view, &pools);
                self.idle = concerned.is_empty();
                if self.idle {
                    // Nothing to sync: no call at all (not even a resync) until the signal
                    // names a node.
                    self.pending.clear();
                    self.nodes.clear();
                    runner.forget_all();
                    return;
                }
                self.pending.extend(concerned);
            }
            self.pending.extend(nodes);
            self.resync
                .start_if_due(now, runner, &self.ctx.provider, Done::Resync);
            let delegable = [
                self.ctx.provider.delegable_prefix_len(false),
                self.ctx.provider.delegable_prefix_len(true),
            ];
            let pool_problems: Vec<String> = pools
                .iter()
                .filter_map(|p| {
                    let len = match p.family {
                        Family::V4 => delegable[0],
                        Family::V6 => delegable[1],
                    };
                    decide::length_problem(p, len)
                })
                .collect();
            for problem in &pool_problems {
                shared.raise("to-cloud", problem, format!("to-cloud: {problem}"));
            }
            for gone in self
                .pool_problems
                .iter()
                .filter(|p| !pool_problems.contains(p))
            {
                shared.resolve("to-cloud", gone);
            }
            self.pool_problems = pool_problems;
            // Nothing before the first resync, nor while etcd went back in time and granting
            // has not resumed (delegation records made since the snapshot are forgotten).
            if !self.ready || shared.regression_unsettled() {
                return;
            }
            let pending: Vec<NodeName> = self.pending.iter().cloned().collect();
            for node in pending {
                if runner.is_full() {
                    break;
                }
                if !runner.is_due(&node, now) {
                    continue;
                }
                self.pending.remove(&node);
                if let Some(step) = self.plan(runner, view, &pools, &node) {
                    self.spawn(runner, node, step);
                }
            }
        })
    }

    /// Takes in a finished task.
    fn finish(&mut self, runner: &mut Runner<NodeName, Done>, done: Done) {
        match done {
            Done::Resync(result) => {
                let timing = self.timing();
                match result {
                    Ok((interfaces, subnets)) => {
                        self.subnets = subnets
                            .iter()
                            .map(|s| {
                                let mut cidrs = vec![IpNet::V4(s.ipv4_cidr)];
                                cidrs.extend(s.ipv6_cidr.map(IpNet::V6));
                                (s.id.clone(), cidrs)
                            })
                            .collect();
                        self.resynced = interfaces
                            .iter()
                            .filter_map(|ni| {
                                let a = ni.attachment.as_ref()?;
                                (a.device_index == 0)
                                    .then(|| (a.instance_id.clone(), self.primary_sight(ni)))
                            })
                            .collect();
                        self.described.clear();
                        // Own changes stay over the view until a resync that began well after
                        // them (its describe may lag them by up to the bound).
                        let started = self.resync.started();
                        self.own
                            .retain(|_, (_, at)| *at + OWN_CHANGES_KEPT > started);
                        if !self.ready {
                            self.ready = true;
                        }
                        self.resync.succeeded(&timing, self.resync_every);
                        self.signal.all();
                    }
                    Err(error) => {
                        self.resync.failed(
                            &self.ctx.term.shared,
                            "to-cloud resync",
                            &error,
                            &timing,
                        );
                    }
                }
            }
            Done::Node {
                node,
                outcome,
                writes,
                described,
                changed,
            } => {
                self.apply_writes(&writes);
                if let Some((instance, sight)) = described {
                    match sight {
                        Some(sight) => {
                            self.described.insert(instance, sight);
                        }
                        None => {
                            self.described.remove(&instance);
                        }
                    }
                }
                if let Some((interface, prefix, present)) = changed {
                    self.own
                        .insert((interface, prefix), (present, Instant::now()));
                }
                let timing = self.timing();
                match outcome {
                    Outcome::Ok => {
                        runner.reset_backoff(&node);
                        self.pending.insert(node);
                    }
                    Outcome::Wait(wait) => runner.wait(&node, wait),
                    Outcome::Failed(problem) => {
                        self.ctx
                            .term
                            .shared
                            .note_problem(format!("to-cloud {node}: {problem}"));
                        runner.back_off(&node, &timing);
                    }
                    Outcome::Fenced => {}
                }
            }
        }
    }

    fn next_wake(&self) -> Instant {
        let mut wake = Instant::now() + Duration::from_secs(3600);
        if self.idle {
            return wake;
        }
        if let Some(at) = self.resync.next_due().filter(|_| self.ready) {
            wake = wake.min(at);
        }
        wake
    }

    fn signal(&self) -> &PendingNodes {
        &self.signal.pending
    }

    fn pending(&mut self) -> &mut BTreeSet<NodeName> {
        &mut self.pending
    }
}

/// Nodes with anything to sync: grants in to-cloud pools, `delegations/` keys, open
/// delegation intents.
fn concerned(view: &ClusterView, pools: &[ToCloudPool]) -> BTreeSet<NodeName> {
    let mut nodes: BTreeSet<NodeName> = BTreeSet::new();
    if !pools.is_empty() {
        for (node, _) in view.nodes() {
            let granted = view.grants_of(node).iter().any(|g| {
                pools
                    .iter()
                    .any(|p| p.pool == g.pool && p.family == g.family)
            });
            if granted {
                nodes.insert(node.clone());
            }
        }
    }
    nodes.extend(view.delegations().map(|((node, ..), _)| node.clone()));
    nodes.extend(delegation_intents(view).filter_map(|(_, e)| e.record.as_ref()?.node.clone()));
    nodes
}

fn delegation_intents(
    view: &ClusterView,
) -> impl Iterator<Item = (&CloudId, &CloudEntry<CloudIntentRecord>)> {
    view.cloud_intents()
        .filter(|(_, e)| e.record.as_ref().is_some_and(|r| r.op.is_delegation()))
}

fn family_of(net: &IpNet) -> Family {
    match net {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    }
}

impl<K: Kv, P: CloudProvider + 'static> Manager<K, P> {
    fn now_ms(&self) -> u64 {
        (self.ctx.clock)()
    }

    /// The sights of every instance known, this manager's own recent changes on top.
    fn sights(&self) -> BTreeMap<String, InstanceSight> {
        let mut sights: BTreeMap<String, InstanceSight> = self
            .resynced
            .iter()
            .map(|(i, p)| (i.clone(), InstanceSight::Primary(p.clone())))
            .collect();
        for (instance, sight) in &self.described {
            sights.insert(instance.clone(), sight.clone());
        }
        if !self.own.is_empty() {
            for sight in sights.values_mut() {
                if let InstanceSight::Primary(primary) = sight {
                    for ((interface, prefix), (present, _)) in &self.own {
                        if *interface != primary.interface {
                            continue;
                        }
                        primary.prefixes.retain(|p| p != prefix);
                        if *present {
                            primary.prefixes.push(*prefix);
                        }
                    }
                }
            }
        }
        sights
    }

    /// The node's next step: an open intent first, else the plan's first step.
    fn plan(
        &mut self,
        runner: &mut Runner<NodeName, Done>,
        view: &ClusterView,
        pools: &[ToCloudPool],
        node: &NodeName,
    ) -> Option<Step> {
        if let Some((id, entry)) = delegation_intents(view)
            .find(|(_, e)| e.record.as_ref().and_then(|r| r.node.as_ref()) == Some(node))
        {
            return Some(Step::Replay(id.clone(), entry.clone()));
        }
        let instance_id = view
            .registration(node)
            .and_then(|e| e.record.instance_id.clone());
        let grants: Vec<(PoolName, Family, IpNet)> = view
            .grants_of(node)
            .into_iter()
            .map(|g| (g.pool, g.family, g.cidr))
            .collect();
        let delegations: Vec<Delegated> = view
            .delegations()
            .filter(|((n, ..), _)| n == node)
            .map(|((_, pool, family, cidr), e)| Delegated {
                pool: pool.clone(),
                family: *family,
                cidr: *cidr,
                record: e.record.clone(),
                revision: e.mod_revision,
            })
            .collect();
        let mut taken: BTreeSet<(PoolName, IpNet)> = view
            .delegations()
            .filter(|((n, ..), _)| n != node)
            .map(|((_, pool, _, cidr), _)| (pool.clone(), *cidr))
            .collect();
        for (_, entry) in delegation_intents(view) {
            if let Some(record) = &entry.record
                && record.node.as_ref() != Some(node)
                && let CloudOp::DelegatePrefix { prefix, .. }
                | CloudOp::UndelegatePrefix { prefix, .. } = &record.op
            {
                taken.insert((record.pool.clone(), *prefix));
            }
        }
        let sights = self.sights();
        let now_ms = self.now_ms();
        let provider = &self.ctx.provider;
        let plan = decide::plan_delegations(&DelegationInput {
            node,
            instance_id: instance_id.as_deref(),
            pools,
            delegable: [
                provider.delegable_prefix_len(false),
                provider.delegable_prefix_len(true),
            ],
            grants: &grants,
            delegations: &delegations,
            taken_elsewhere: &taken,
            sights: &sights,
            now_ms,
        });
        let state = self.nodes.entry(node.clone()).or_default();
        let mut plan = plan;
        // Pool-wide problems are reported once, not per node.
        plan.problems.retain(|p| !self.pool_problems.contains(p));
        if plan.problems != state.reported {
            let shared = &self.ctx.term.shared;
            for problem in &plan.problems {
                shared.raise("to-cloud", problem, format!("to-cloud: {problem}"));
            }
            for gone in state.reported.iter().filter(|p| !plan.problems.contains(p)) {
                shared.resolve("to-cloud", gone);
            }
            state.reported = plan.problems.clone();
        }
        if let Some(at) = plan.recheck_at_ms {
            let wait = Instant::now() + Duration::from_millis(at.saturating_sub(now_ms) + 10);
            runner.come_back_by(node, wait);
        }
        plan.steps.into_iter().next().map(Step::Plan)
    }

    fn spawn(&mut self, runner: &mut Runner<NodeName, Done>, node: NodeName, step: Step) {
        self.next_intent += 1;
        let intent = format!(
            "cd-{:x}-{:x}-{:x}",
            self.ctx.term.fence.revision,
            self.now_ms(),
            self.next_intent
        );
        let ctx = self.ctx.clone();
        let subnets = self.subnets.clone();
        runner.spawn([node.clone()], async move {
            let mut run = Run {
                ctx: &ctx,
                node: &node,
                writes: Vec::new(),
                described: None,
                changed: None,
            };
            let outcome = match step {
                Step::Replay(id, entry) => run.replay(&id, &entry).await,
                Step::Plan(step) => run.step(step, &intent, &subnets).await,
            };
            let Run {
                writes,
                described,
                changed,
                ..
            } = run;
            Done::Node {
                node,
                outcome,
                writes,
                described,
                changed,
            }
        });
    }

    fn primary_sight(&self, ni: &NetworkInterface) -> PrimarySight {
        PrimarySight {
            interface: CloudId::new(&ni.id).unwrap_or_else(|_| CloudId::min()),
            subnet_cidrs: self.subnets.get(&ni.subnet_id).cloned().unwrap_or_default(),
            prefixes: ni.prefixes(),
        }
    }

    fn timing(&self) -> Resync {
        self.ctx
            .term
            .shared
            .with_view(|view, _| Resync::from(&view.config().resync))
            .unwrap_or_default()
    }

    /// Puts what a task wrote into the view at once (the watch repeats it later), unless the
    /// view already holds the key at a later revision.
    fn apply_writes(&self, writes: &[Write]) {
        if writes.is_empty() {
            return;
        }
        self.ctx.term.shared.with_view_mut(|view, _| {
            for (key, value, revision) in writes {
                let newer = match self.ctx.term.keys.parse(key) {
                    Ok(Key::Delegation {
                        node,
                        pool,
                        family,
                        cidr,
                    }) => view.delegations().any(|((n, p, f, c), e)| {
                        *n == node
                            && *p == pool
                            && *f == family
                            && *c == cidr
                            && e.mod_revision > *revision
                    }),
                    Ok(Key::CloudIntent { id }) => view
                        .cloud_intents()
                        .any(|(i, e)| *i == id && e.mod_revision > *revision),
                    _ => false,
                };
                if newer {
                    continue;
                }
                match value {
                    Some(value) => view.apply_put(key, value, *revision, *revision),
                    None => view.apply_delete(key, *revision),
                }
            }
        });
    }
}

fn is_not_assigned(error: &CloudError) -> bool {
    matches!(error, CloudError::InvalidParameterValue { message } if message.contains("not assigned"))
}

/// A prefix to delegate or take back: the fields a `Delegate` and an `Undelegate` step share.
struct Change {
    pool: PoolName,
    cidr: IpNet,
    instance_id: String,
    interface: CloudId,
    /// The record's revision (0: none yet).
    revision: Revision,
}

/// One node's task.
struct Run<'a, K, P> {
    ctx: &'a Ctx<K, P>,
    node: &'a NodeName,
    writes: Vec<Write>,
    described: Option<(String, Option<InstanceSight>)>,
    changed: Option<(CloudId, IpNet, bool)>,
}

impl<K: Kv, P: CloudProvider> Run<'_, K, P> {
    /// A fenced txn; `Err(None)` refused, `Err(Some(problem))` outcome unknown.
    async fn txn(&mut self, txn: Txn) -> Result<Revision, Option<String>> {
        self.ctx
            .term
            .fenced_txn(txn, &mut self.writes)
            .await
            .map_err(|error| match error {
                WriteError::Refused => None,
                WriteError::Uncertain(error) => Some(error.to_string()),
            })
    }

    fn key_of(&self, pool: &PoolName, cidr: &IpNet) -> String {
        self.ctx
            .term
            .keys
            .delegation(self.node, pool, family_of(cidr), cidr)
    }

    fn record_value(&self, instance_id: &str, interface: &CloudId) -> Vec<u8> {
        encode_value(&DelegationRecord {
            instance_id: instance_id.to_owned(),
            interface: interface.clone(),
            at_ms: (self.ctx.clock)(),
        })
        .unwrap_or_default()
    }

    async fn step(
        &mut self,
        step: DelegationStep,
        intent: &str,
        subnets: &BTreeMap<String, Vec<IpNet>>,
    ) -> Outcome {
        let delegate = matches!(step, DelegationStep::Delegate { .. });
        match step {
            DelegationStep::Describe { instance_id } => self.describe(&instance_id, subnets).await,
            DelegationStep::Forget {
                pool,
                cidr,
                revision,
                ..
            } => {
                let key = self.key_of(&pool, &cidr);
                self.write(
                    vec![Compare::modified_at(key.clone(), revision)],
                    vec![TxnOp::delete(key)],
                )
                .await
            }
            DelegationStep::Adopt {
                pool,
                cidr,
                instance_id,
                interface,
                ..
            } => {
                let key = self.key_of(&pool, &cidr);
                let value = self.record_value(&instance_id, &interface);
                self.write(
                    vec![Compare::absent(key.clone())],
                    vec![TxnOp::put(key, value)],
                )
                .await
            }
            DelegationStep::Delegate {
                pool,
                cidr,
                instance_id,
                interface,
                revision,
                ..
            }
            | DelegationStep::Undelegate {
                pool,
                cidr,
                instance_id,
                interface,
                revision,
                ..
            } => {
                let change = Change {
                    pool,
                    cidr,
                    instance_id,
                    interface,
                    revision,
                };
                self.change(intent, change, delegate).await
            }
        }
    }

    /// Delegates `change.cidr` to its interface (`delegate`) or takes it back, under an intent
    /// opened first: done, the record is written (or deleted) and the intent dropped in one
    /// transaction; refused, the intent is dropped; ambiguous, the intent stays to be replayed.
    async fn change(&mut self, intent: &str, change: Change, delegate: bool) -> Outcome {
        let Change {
            pool,
            cidr,
            instance_id,
            interface,
            revision,
        } = change;
        let op = if delegate {
            CloudOp::DelegatePrefix {
                interface: interface.clone(),
                prefix: cidr,
            }
        } else {
            CloudOp::UndelegatePrefix {
                interface: interface.clone(),
                prefix: cidr,
            }
        };
        let (intent_key, intent_revision) =
            match self.open_intent(intent, &pool, &instance_id, op).await {
                Ok(opened) => opened,
                Err(outcome) => return outcome,
            };
        let provider = &*self.ctx.provider;
        let done = if delegate {
            assign(provider, interface.as_str(), cidr).await
        } else {
            unassign(provider, interface.as_str(), cidr).await
        };
        let what = if delegate {
            format!("delegating {cidr} to {interface}")
        } else {
            format!("taking {cidr} back from {interface}")
        };
        match done {
            Ok(()) => {
                self.changed = Some((interface.clone(), cidr, delegate));
                let key = self.key_of(&pool, &cidr);
                let (compare, op) = if !delegate {
                    (
                        Compare::modified_at(key.clone(), revision),
                        TxnOp::delete(key),
                    )
                } else {
                    let value = self.record_value(&instance_id, &interface);
                    let compare = if revision == 0 {
                        Compare::absent(key.clone())
                    } else {
                        Compare::modified_at(key.clone(), revision)
                    };
                    (compare, TxnOp::put(key, value))
                };
                self.write(
                    vec![
                        compare,
                        Compare::modified_at(intent_key.clone(), intent_revision),
                    ],
                    vec![op, TxnOp::delete(intent_key)],
                )
                .await
            }
            Err(error) if error.is_ambiguous() => {
                Outcome::Failed(format!("{what}: {error} (replayed)"))
            }
            Err(error) => {
                self.drop_intent(&intent_key, intent_revision).await;
                Outcome::Failed(format!("{what}: {error}"))
            }
        }
    }

    async fn write(&mut self, compares: Vec<Compare>, success: Vec<TxnOp>) -> Outcome {
        match self
            .txn(Txn {
                compares,
                success,
                failure: vec![],
            })
            .await
        {
            Ok(_) => Outcome::Ok,
            // The view was behind, or leading is gone: looked at again shortly.
            Err(None) => Outcome::Wait(Duration::from_millis(200)),
            Err(Some(problem)) => Outcome::Failed(problem),
        }
    }

    async fn open_intent(
        &mut self,
        id: &str,
        pool: &PoolName,
        instance_id: &str,
        op: CloudOp,
    ) -> Result<(String, Revision), Outcome> {
        let id = CloudId::new(id).map_err(|e| Outcome::Failed(e.to_string()))?;
        let record = CloudIntentRecord {
            node: Some(self.node.clone()),
            pool: pool.clone(),
            instance_id: Some(instance_id.to_owned()),
            op,
            started_ms: (self.ctx.clock)(),
        };
        let key = self.ctx.term.keys.cloud_intent(&id);
        let value = encode_value(&record).map_err(|e| Outcome::Failed(e.to_string()))?;
        match self
            .txn(Txn {
                compares: vec![Compare::absent(key.clone())],
                success: vec![TxnOp::put(key.clone(), value)],
                failure: vec![],
            })
            .await
        {
            Ok(revision) => {
                self.ctx.term.shared.note_cloud_intent();
                Ok((key, revision))
            }
            // Fenced: no call.
            Err(None) => Err(Outcome::Fenced),
            Err(Some(problem)) => Err(Outcome::Failed(format!("writing intent {id}: {problem}"))),
        }
    }

    async fn drop_intent(&mut self, key: &str, revision: Revision) {
        let _ = self
            .txn(Txn {
                compares: vec![Compare::modified_at(key.to_owned(), revision)],
                success: vec![TxnOp::delete(key.to_owned())],
                failure: vec![],
            })
            .await;
    }

    async fn describe(
        &mut self,
        instance_id: &str,
        subnets: &BTreeMap<String, Vec<IpNet>>,
    ) -> Outcome {
        let instance = match self.ctx.provider.describe_instance(instance_id).await {
            Ok(instance) => instance,
            Err(CloudError::InstanceNotFound { .. }) => {
                self.described = Some((instance_id.to_owned(), Some(InstanceSight::Gone)));
                return Outcome::Ok;
            }
            Err(error) => return Outcome::Failed(format!("describing {instance_id}: {error}")),
        };
        if matches!(
            instance.state,
            InstanceState::Terminated | InstanceState::ShuttingDown
        ) {
            self.described = Some((instance_id.to_owned(), Some(InstanceSight::Gone)));
            return Outcome::Ok;
        }
        let interfaces = match self
            .ctx
            .provider
            .describe_interfaces(&InterfaceFilter::instance(instance_id))
            .await
        {
            Ok(interfaces) => interfaces,
            Err(error) => return Outcome::Failed(format!("describing {instance_id}: {error}")),
        };
        let primary = interfaces
            .iter()
            .find(|ni| ni.attachment.as_ref().is_some_and(|a| a.device_index == 0));
        match primary {
            Some(ni) => {
                self.described = Some((
                    instance_id.to_owned(),
                    Some(InstanceSight::Primary(PrimarySight {
                        interface: CloudId::new(&ni.id).unwrap_or_else(|_| CloudId::min()),
                        subnet_cidrs: subnets.get(&ni.subnet_id).cloned().unwrap_or_default(),
                        prefixes: ni.prefixes(),
                    })),
                ));
                Outcome::Ok
            }
            // Not visible yet (a describe lags): looked at again after a backoff.
            None => Outcome::Failed(format!(
                "instance {instance_id} shows no primary interface yet"
            )),
        }
    }

    /// Finishes (or undoes) an open delegation intent.
    async fn replay(&mut self, id: &CloudId, entry: &CloudEntry<CloudIntentRecord>) -> Outcome {
        let intent_key = self.ctx.term.keys.cloud_intent(id);
        let Some(intent) = &entry.record else {
            return Outcome::Wait(REPLAY_WAIT);
        };
        let (interface, prefix) = match &intent.op {
            CloudOp::DelegatePrefix { interface, prefix }
            | CloudOp::UndelegatePrefix { interface, prefix } => (interface.clone(), *prefix),
            _ => return Outcome::Wait(REPLAY_WAIT),
        };
        let on = match self
            .ctx
            .provider
            .describe_interfaces(&InterfaceFilter::id(interface.as_str()))
            .await
        {
            Ok(found) => found.first().map(|ni| ni.prefixes().contains(&prefix)),
            Err(error) if error.is_not_found() => None,
            Err(error) => return Outcome::Failed(format!("replaying intent {id}: {error}")),
        };
        let age = (self.ctx.clock)().saturating_sub(intent.started_ms);
        let key = self.key_of(&intent.pool, &prefix);
        let instance_id = intent.instance_id.clone().unwrap_or_default();
        let intent_compare = Compare::modified_at(intent_key.clone(), entry.mod_revision);
        match decide::replay_delegation(&intent.op, on, age) {
            DelegationReplay::Wait => Outcome::Wait(REPLAY_WAIT),
            DelegationReplay::Forget => {
                self.write(vec![intent_compare], vec![TxnOp::delete(intent_key)])
                    .await
            }
            DelegationReplay::Record => {
                self.changed = Some((interface.clone(), prefix, true));
                let value = self.record_value(&instance_id, &interface);
                self.write(
                    vec![intent_compare],
                    vec![TxnOp::put(key, value), TxnOp::delete(intent_key)],
                )
                .await
            }
            DelegationReplay::Undelegated => {
                self.changed = Some((interface.clone(), prefix, false));
                self.write(
                    vec![intent_compare],
                    vec![TxnOp::delete(key), TxnOp::delete(intent_key)],
                )
                .await
            }
            DelegationReplay::Undelegate => {
                // Rewritten at the revision seen first: only the leader calls, and only while
                // the intent is still open.
                let value = match encode_value(intent) {
                    Ok(value) => value,
                    Err(e) => return Outcome::Failed(e.to_string()),
                };
                let revision = match self
                    .txn(Txn {
                        compares: vec![intent_compare],
                        success: vec![TxnOp::put(intent_key.clone(), value)],
                        failure: vec![],
                    })
                    .await
                {
                    Ok(revision) => revision,
                    Err(None) => return Outcome::Wait(Duration::from_millis(200)),
                    Err(Some(problem)) => return Outcome::Failed(problem),
                };
                match unassign(&*self.ctx.provider, interface.as_str(), prefix).await {
                    Ok(()) => {
                        self.changed = Some((interface.clone(), prefix, false));
                        self.write(
                            vec![Compare::modified_at(intent_key.clone(), revision)],
                            vec![TxnOp::delete(key), TxnOp::delete(intent_key)],
                        )
                        .await
                    }
                    Err(error) => {
                        Outcome::Failed(format!("taking {prefix} back from {interface}: {error}"))
                    }
                }
            }
        }
    }
}

/// Delegates one prefix (explicit: the cloud assigns exactly it, once).
async fn assign<P: CloudProvider>(
    provider: &P,
    interface: &str,
    prefix: IpNet,
) -> Result<(), CloudError> {
    match prefix {
        IpNet::V4(p) => provider
            .assign_ipv4(interface, &Ipv4Assign::Prefixes(Amount::Explicit(vec![p])))
            .await
            .map(|_| ()),
        IpNet::V6(p) => provider
            .assign_ipv6(interface, &Ipv6Assign::Prefixes(Amount::Explicit(vec![p])))
            .await
            .map(|_| ()),
    }
}

/// Takes one prefix back; one not assigned (any more) counts as done.
async fn unassign<P: CloudProvider>(
    provider: &P,
    interface: &str,
    prefix: IpNet,
) -> Result<(), CloudError> {
    let result = match prefix {
        IpNet::V4(p) => {
            let set = Ipv4Set {
                prefixes: vec![p],
                ..Ipv4Set::default()
            };
            provider.unassign_ipv4(interface, &set).await
        }
        IpNet::V6(p) => {
            let set = Ipv6Set {
                prefixes: vec![p],
                ..Ipv6Set::default()
            };
            provider.unassign_ipv6(interface, &set).await
        }
    };
    match result {
        Err(error) if is_not_assigned(&error) || error.is_not_found() => Ok(()),
        other => other,
    }
}
