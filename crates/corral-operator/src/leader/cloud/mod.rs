//! The cloud node manager of cloud pools, beside the leading loop (Cilium's ENI `NodeManager`
//! on etcd): it keeps a view of the cloud (each node's instance and interfaces, the VPC's
//! subnets, instance types' limits), plans each node with `corral_cluster::cloud::plan_node`,
//! and carries the plan out, one node in at most one task at a time, up to `workers` tasks.
//!
//! Rules it keeps:
//! - no mutation before the first successful resync of the cloud view (Cilium's
//!   `InstancesAPIIsReady`);
//! - every cloud mutation is preceded by a fenced `intents/<id>` put (a deposed leader's
//!   put fails, so it calls nothing) and followed by one fenced transaction that records the
//!   outcome (`interfaces/<node>/<id>`, compared at its mod revision) and deletes the intent; an
//!   intent left open (a crash, an answer lost) is replayed by `replay_intent` before the node
//!   is served again, and every open intent is replayed by a new leader;
//! - a node at its instance's limits gets no call (it is reported at capacity);
//! - addresses go back only through the release handshake (block mode's `release/` keys): the
//!   agent surrenders a free address before the cloud is asked to unassign it;
//! - leaked interfaces (corral-tagged, available, named by no record or intent) are deleted
//!   only when seen so on two collector runs at least the interval apart;
//! - a removed node's interfaces and empty ones are detached and deleted only if corral created
//!   them (never the primary), behind a `Delete` intent written with their record's deletion;
//! - an unassign answer that does not say which addresses went ("not assigned") changes no
//!   record: the intent's replay reads the interface, past the describe lag of its last call.
//!
//! The manager's own memory (the cloud view, first sightings of leaks, excess clocks,
//! backoffs) is lost with the lead; a new leader resyncs before it mutates anything.
//!
//! This file is the manager's loop (a [`NodeManager`] on the leader's runner): what is due, the
//! plan of each node and the finished tasks taken in. The decisions it asks are pure and live
//! in `corral_cluster::cloud` (`first_step`, the ladder before a node's pools are planned;
//! `plan_node`; the serve order, the leak plan). Beside it: `ctx.rs` (what every task shares,
//! the one door for cloud calls), `describe.rs` (describes and the views built from them, the
//! full resync), `step.rs` (a node's step carried out behind intents) and `orphans.rs` (intents
//! of no node, the leak collector). The files form layers: each one uses only those listed
//! before it.
//!
//! No interface and no address is ever recorded for two nodes: a transaction cannot compare "this
//! interface under any node" (etcd compares keys, not patterns), but the fence makes the leader the
//! only writer of `interfaces/` (agents never write them, a removal only deletes), so the view plus
//! the records running tasks are writing (`claims`) is every record, and `record_conflicts` refuses
//! a conflicting record before it is written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use corral_cloud::{
    CloudError, CloudProvider, InstanceState, InterfaceFilter, NetworkInterface, Subnet,
};
use corral_cluster::cloud::{
    self as decide, CloudAction, CloudPlan, GcPlan, InstanceLimits, InterfaceView, NodeCloudInput,
    Releasing, ServeKey, SubnetView,
};
use corral_cluster::{
    CloudAttachment, CloudEntry, CloudId, CloudIntentRecord, CloudInterfaceRecord, CloudOp,
    ClusterView, Family, IpNet, Key, Keys, NodeName, PoolName, ReleaseRecord, ReleaseState, Resync,
    encode_value,
};
use corral_kv::Kv;
use tokio::time::Instant;

use crate::CloudOptions;
use crate::election::Fence;
use crate::leader::logged::{Term, Write};
use crate::leader::pending::PendingNodes;
use crate::leader::runner::{self, NodeManager, Runner};
use crate::state::{CloudNodeFigures, Shared};

mod ctx;
pub(super) mod describe;
mod orphans;
mod step;

use ctx::{Ctx, InstanceInfo, instance_of};
use describe::{Described, FullResync, describe_node, family_of, interface_views, subnet_view};
use orphans::{LeakContext, collect_leaks, replay_orphan};
use step::{ATTACH_POLL, AttemptContext, HandshakeStep, Outcome, Step, StepRun};

/// What the leading loop tells the manager: which nodes an event concerns.
#[derive(Debug, Default)]
pub(crate) struct CloudSignal {
    pending: PendingNodes,
    /// The to-cloud delegations' own signal (`leader/to_cloud.rs`), fed by the same events.
    pub(crate) to_cloud: Arc<super::to_cloud::Signal>,
}

impl CloudSignal {
    /// Notes a key that changed.
    pub(crate) fn note(&self, key: &Key) {
        self.to_cloud.note(key);
        match key {
            Key::Node { node }
            | Key::Demand { node, .. }
            | Key::Release { node, .. }
            | Key::CloudInterface { node, .. }
            | Key::Removal { node } => self.pending.node(node),
            // Intents are this leader's own (its tasks follow them) or found at the start
            // (every node is planned then): an intent's event plans nobody.
            Key::Config => self.all(),
            _ => {}
        }
    }

    /// Every node must be planned again (a new view, a configuration change).
    pub(crate) fn all(&self) {
        self.to_cloud.all();
        self.pending.all();
    }
}

/// The manager's memory of one node.
#[derive(Debug, Default)]
struct NodeCloud {
    instance_id: String,
    instance: Option<InstanceInfo>,
    /// Interfaces attached (or attaching) to the instance, as last described.
    interfaces: Vec<NetworkInterface>,
    /// Describe the node's interfaces before planning it.
    stale: bool,
    /// Planned again then (a release delay running out); unlike a wait in the runner (a
    /// backoff, an intent waiting, an attachment being polled) it holds no plan back: a demand change meanwhile is planned at once (and may end the excess).
    wake_at: Option<Instant>,
    /// Excess clocks per pool and family.
    excess_since: BTreeMap<(PoolName, Family), u64>,
    /// Per pool, since when each empty managed interface has been empty (given back once it
    /// stayed so for the release delay).
    empty_since: BTreeMap<PoolName, BTreeMap<CloudId, u64>>,
    /// Describe the instance itself again (it may have been terminated).
    check_instance: bool,
}

/// What a task did, for the loop.
enum Done {
    /// A full resync of the cloud view.
    Resync(Result<(Vec<NetworkInterface>, Vec<Subnet>), CloudError>),
    /// A node's instance and interfaces described.
    Described {
        node: NodeName,
        instance_id: String,
        result: Result<Described, CloudError>,
    },
    /// A node's step: a cloud action, a release step, a replayed intent, a confirmation.
    Node {
        node: NodeName,
        outcome: Outcome,
        /// Records written, to apply to the view at once.
        writes: Vec<Write>,
        /// The node's interfaces described after a mutation (per-node resync).
        interfaces: Option<Vec<NetworkInterface>>,
        /// Interfaces that refused a prefix (take single addresses from now on).
        secondaries_only: Vec<String>,
        /// Subnets that refused a prefix.
        no_free_prefix: Vec<String>,
        /// Device indexes the cloud said are taken.
        occupied: Vec<u32>,
    },
    /// A leaked-interface collector run.
    Gc {
        result: Result<(GcPlan, usize), CloudError>,
        writes: Vec<Write>,
    },
    /// An intent of no node replayed.
    Orphan { writes: Vec<Write> },
}

/// The manager of the cloud view and its loop's state.
struct Manager<K, P> {
    ctx: Ctx<K, P>,
    resync_every: Duration,
    signal: Arc<CloudSignal>,
    /// The first full resync succeeded: mutations may run.
    ready: bool,
    resync: FullResync,
    gc_running: bool,
    gc_at: Option<Instant>,
    gc_seen: BTreeMap<CloudId, u64>,
    limits: BTreeMap<String, InstanceLimits>,
    subnets: Vec<Subnet>,
    /// The last full resync's interfaces by the instance they are attached to.
    resync_interfaces: BTreeMap<String, Vec<NetworkInterface>>,
    nodes: BTreeMap<NodeName, NodeCloud>,
    pending: BTreeSet<NodeName>,
    /// Planned nodes waiting for a worker, the next at the end.
    queue: Vec<(ServeKey, NodeName)>,
    /// Interfaces whose prefix request was refused, and when (also kept in their records:
    /// learnt again by a new leader from them).
    secondaries_only: BTreeMap<String, u64>,
    /// Subnets that refused a new interface's prefixes, and when (kept in the records of
    /// interfaces corral created there after a refusal).
    no_free_prefix: BTreeMap<String, u64>,
    occupied: BTreeMap<String, BTreeSet<u32>>,
    /// Intents of no node being replayed (the collector's deletions).
    orphans_running: bool,
    next_intent: u64,
    /// The configuration has no cloud pool: nothing is due but a signal.
    idle: bool,
    /// Records the cloud contradicted on a full resync, since when (wall ms): reported once a
    /// resync past the describe lag bound confirms them.
    missing: BTreeMap<decide::MissingInCloud, u64>,
    /// Some of them are not confirmed yet: the next resync comes after the lag bound.
    missing_unconfirmed: bool,
}

/// Runs the cloud node manager until it is dropped (leading ended) or the view is gone.
pub(crate) async fn manage<K: Kv, P: CloudProvider + 'static, O>(
    kv: K,
    keys: Keys,
    fence: Fence,
    shared: Arc<Shared>,
    provider: Arc<P>,
    options: CloudOptions<O>,
    signal: Arc<CloudSignal>,
) {
    let cluster = keys
        .prefix()
        .trim_start_matches("/corral/")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let manager = Manager {
        ctx: Ctx {
            term: Term {
                kv,
                keys,
                fence,
                shared,
            },
            provider,
            cluster,
            clock: options.clock,
            claims: Arc::default(),
        },
        resync_every: options.resync,
        signal,
        ready: false,
        resync: FullResync::new(),
        gc_running: false,
        gc_at: None,
        gc_seen: BTreeMap::new(),
        limits: BTreeMap::new(),
        subnets: Vec::new(),
        resync_interfaces: BTreeMap::new(),
        nodes: BTreeMap::new(),
        pending: BTreeSet::new(),
        queue: Vec::new(),
        secondaries_only: BTreeMap::new(),
        no_free_prefix: BTreeMap::new(),
        occupied: BTreeMap::new(),
        orphans_running: false,
        next_intent: 0,
        idle: false,
        missing: BTreeMap::new(),
        missing_unconfirmed: false,
    };
    manager.signal.all();
    runner::manage(manager, options.workers).await;
}

impl<K: Kv, P: CloudProvider + 'static> NodeManager for Manager<K, P> {
    type Done = Done;

    /// One turn: take the signal, start what is due. `None` when the view is gone.
    fn turn(&mut self, runner: &mut Runner<NodeName, Done>) -> Option<()> {
        let (nodes, all) = self.signal.pending.take();
        let now = Instant::now();
        let shared = Arc::clone(&self.ctx.term.shared);
        shared.with_view(|view, _| {
            let cloud_pools = cloud_pools(view);
            self.idle = cloud_pools.is_empty();
            if self.idle {
                self.pending.clear();
                return;
            }
            if all {
                // Prefix refusals kept in the records (a new leader's first view).
                for ((_, id), entry) in view.cloud_interfaces() {
                    if let Some(record) = &entry.record
                        && let Some(at) = record.prefixes_refused_ms
                    {
                        self.learn_refusal(id.as_str(), record, at);
                    }
                }
                self.pending.extend(
                    view.nodes()
                        .filter(|(_, e)| e.record.instance_id.is_some())
                        .map(|(n, _)| n.clone()),
                );
                // Records and open intents of nodes removed meanwhile.
                self.pending
                    .extend(view.cloud_interfaces().map(|((node, _), _)| node.clone()));
                self.pending.extend(
                    view.cloud_intents()
                        .filter_map(|(_, e)| e.record.as_ref().and_then(|r| r.node.clone())),
                );
            }
            self.pending.extend(nodes);
            // Nodes whose wait ran out.
            for (node, state) in &mut self.nodes {
                if state.wake_at.is_some_and(|at| at <= now) {
                    state.wake_at = None;
                    self.pending.insert(node.clone());
                }
            }
            self.resync
                .start_if_due(now, runner, &self.ctx.provider, Done::Resync);
            if !self.ready || shared.regression_unsettled() {
                // Describes may run (they change nothing); mutations wait (also while etcd,
                // gone back in time, may have forgotten records the cloud still has: the
                // agents assert what they hold first).
                self.start_describes(runner, view);
                return;
            }
            if self.gc_at.is_none() {
                let interval = gc_interval(&cloud_pools);
                self.gc_at = Some(now + interval);
            }
            self.start_orphans(runner, view);
            self.start_nodes(runner, view);
            if !self.gc_running
                && self.gc_at.is_some_and(|at| at <= now)
                && runner.in_flight() < runner.workers() + 2
            {
                self.start_gc(runner, view, &cloud_pools);
            }
        })
    }

    /// Applies a finished task.
    fn finish(&mut self, runner: &mut Runner<NodeName, Done>, done: Done) {
        match done {
            Done::Resync(result) => {
                let timing = Resync {
                    resync: self.resync_every,
                    ..self
                        .ctx
                        .term
                        .shared
                        .with_view(|view, _| Resync::from(&view.config().resync))
                        .unwrap_or_default()
                };
                match result {
                    Ok((interfaces, subnets)) => {
                        self.subnets = subnets;
                        self.report_missing(&interfaces);
                        // Prefix refusals and occupied indexes are re-learnt: the subnet may
                        // have been defragmented, the attachment may be visible now.
                        let now_ms = self.now_ms();
                        self.no_free_prefix
                            .retain(|_, at| decide::prefix_refusal_holds(Some(*at), now_ms));
                        self.secondaries_only
                            .retain(|_, at| decide::prefix_refusal_holds(Some(*at), now_ms));
                        self.occupied.clear();
                        let mut by_instance: BTreeMap<String, Vec<NetworkInterface>> =
                            BTreeMap::new();
                        for ni in interfaces {
                            if let Some(a) = &ni.attachment {
                                by_instance
                                    .entry(a.instance_id.clone())
                                    .or_default()
                                    .push(ni);
                            }
                        }
                        for (node, state) in &mut self.nodes {
                            if runner.is_busy(node) {
                                continue;
                            }
                            if state.instance.is_some()
                                && !by_instance.contains_key(&state.instance_id)
                            {
                                // Not even its primary interface is attached: the instance
                                // may be gone. Described again before it is planned.
                                state.stale = true;
                                state.check_instance = true;
                            }
                            state.interfaces = by_instance
                                .get(&state.instance_id)
                                .cloned()
                                .unwrap_or_default();
                        }
                        self.resync_interfaces = by_instance;
                        if !self.ready {
                            self.ready = true;
                            self.ctx.term.shared.set_cloud_ready(true);
                        }
                        self.resync.succeeded(&timing, timing.resync);
                        self.ctx.term.shared.resolve("cloud", "cloud resync");
                        if self.missing_unconfirmed {
                            // Suspects wait for a confirming resync past the describe lag.
                            let confirm = Instant::now()
                                + Duration::from_millis(decide::DESCRIBE_LAG_BOUND_MS + 1_000);
                            self.resync.come_back_by(confirm);
                        }
                        self.signal.all();
                    }
                    Err(error) => {
                        self.resync
                            .failed(&self.ctx.term.shared, "cloud resync", &error, &timing);
                    }
                }
            }
            Done::Described {
                node,
                instance_id,
                result,
            } => {
                self.pending.insert(node.clone());
                match result {
                    Ok(described) => {
                        self.ctx
                            .term
                            .shared
                            .resolve("cloud", &format!("describing {node}"));
                        if let Some(limits) = described.limits {
                            self.limits
                                .insert(described.instance.instance_type.clone(), limits);
                        }
                        let interfaces = described.interfaces.unwrap_or_else(|| {
                            self.resync_interfaces
                                .get(&instance_id)
                                .cloned()
                                .unwrap_or_default()
                        });
                        let state = self.node_state(runner, &node, &instance_id);
                        state.instance = Some(described.instance);
                        state.interfaces = interfaces;
                        state.stale = false;
                        state.check_instance = false;
                    }
                    Err(CloudError::InstanceNotFound { .. }) => {
                        // Gone for good (terminated long ago): as terminated.
                        let state = self.node_state(runner, &node, &instance_id);
                        state.instance = Some(InstanceInfo {
                            instance_type: String::new(),
                            state: InstanceState::Terminated,
                            zone: String::new(),
                            vpc_id: String::new(),
                            subnet_id: String::new(),
                        });
                        state.stale = false;
                        state.check_instance = false;
                    }
                    Err(error) => {
                        self.ctx.term.shared.raise(
                            "cloud",
                            format!("describing {node}"),
                            format!("describing {node} ({instance_id}): {error}"),
                        );
                        self.backoff(runner, &node);
                    }
                }
            }
            Done::Node {
                node,
                outcome,
                writes,
                interfaces,
                secondaries_only,
                no_free_prefix,
                occupied,
            } => {
                self.apply_writes(&writes);
                self.ctx
                    .claims
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(n, ..)| *n != node);
                let now_ms = self.now_ms();
                self.secondaries_only
                    .extend(secondaries_only.into_iter().map(|id| (id, now_ms)));
                self.no_free_prefix
                    .extend(no_free_prefix.into_iter().map(|id| (id, now_ms)));
                let instance_id = self
                    .nodes
                    .get(&node)
                    .map(|s| s.instance_id.clone())
                    .unwrap_or_default();
                if !occupied.is_empty() {
                    self.occupied
                        .entry(instance_id)
                        .or_default()
                        .extend(occupied);
                }
                if let Some(state) = self.nodes.get_mut(&node)
                    && let Some(interfaces) = interfaces
                {
                    state.interfaces = interfaces;
                }
                match outcome {
                    Outcome::Ok | Outcome::Replan => {
                        runner.reset_backoff(&node);
                        self.pending.insert(node);
                    }
                    Outcome::Wait(wait) => runner.wait(&node, wait),
                    Outcome::Failed(problem) => {
                        self.ctx
                            .term
                            .shared
                            .note_problem(format!("cloud {node}: {problem}"));
                        self.backoff(runner, &node);
                    }
                    Outcome::Fenced => {}
                }
            }
            Done::Gc { result, writes } => {
                self.gc_running = false;
                self.apply_writes(&writes);
                match result {
                    Ok((plan, deleted)) => {
                        self.gc_seen = plan.seen;
                        self.ctx.term.shared.note_cloud_gc_deleted(deleted as u64);
                        self.ctx.term.shared.resolve("cloud", "leak collector");
                        if plan.over_cap > 0 {
                            self.ctx.term.shared.note_problem(format!(
                                "cloud leak collector: {} leaked interfaces left for the next run",
                                plan.over_cap
                            ));
                        }
                    }
                    Err(error) => {
                        self.ctx.term.shared.raise(
                            "cloud",
                            "leak collector",
                            format!("cloud leak collector: {error}"),
                        );
                    }
                }
            }
            Done::Orphan { writes } => {
                self.orphans_running = false;
                self.apply_writes(&writes);
            }
        }
    }

    /// The next moment something is due (a resync, the collector, a node's release delay; the
    /// runner keeps the nodes' waits).
    fn next_wake(&self) -> Instant {
        let mut wake = Instant::now() + Duration::from_secs(3600);
        if self.idle {
            // No cloud pool: the resync (due since the start) waits for one, and a configuration
            // with one comes as a signal (a past resync time would wake the manager at once, again
            // and again).
            return wake;
        }
        if let Some(at) = self.resync.next_due() {
            wake = wake.min(at);
        }
        if let (Some(at), false) = (self.gc_at, self.gc_running) {
            wake = wake.min(at);
        }
        for state in self.nodes.values() {
            if let Some(at) = state.wake_at {
                wake = wake.min(at);
            }
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

impl<K: Kv, P: CloudProvider + 'static> Manager<K, P> {
    fn now_ms(&self) -> u64 {
        (self.ctx.clock)()
    }

    /// A prefix refusal found in a record: the interface takes single addresses, and its
    /// subnet (if corral created the interface there after a refusal) is not chosen for a new
    /// interface's prefixes, until the refusal expires.
    fn learn_refusal(&mut self, interface: &str, record: &CloudInterfaceRecord, at: u64) {
        let known = self
            .secondaries_only
            .entry(interface.to_owned())
            .or_insert(at);
        *known = (*known).max(at);
        if record.managed {
            let known = self
                .no_free_prefix
                .entry(record.subnet_id.clone())
                .or_insert(at);
            *known = (*known).max(at);
        }
    }

    /// Before the first resync: describe nodes' instances (they need their limits anyway).
    fn start_describes(&mut self, runner: &mut Runner<NodeName, Done>, view: &ClusterView) {
        let pending: Vec<NodeName> = self.pending.iter().cloned().collect();
        for node in pending {
            if runner.is_full() {
                return;
            }
            if !runner.is_due(&node, Instant::now()) {
                continue;
            }
            let Some(instance_id) = instance_of(view, &node) else {
                self.pending.remove(&node);
                continue;
            };
            let state = self.node_state(runner, &node, &instance_id);
            if state.instance.is_some() {
                continue;
            }
            self.pending.remove(&node);
            self.spawn_describe(runner, node, instance_id);
        }
    }

    fn node_state(
        &mut self,
        runner: &mut Runner<NodeName, Done>,
        node: &NodeName,
        instance_id: &str,
    ) -> &mut NodeCloud {
        let state = self.nodes.entry(node.clone()).or_default();
        if state.instance_id != instance_id {
            // A new registration on another instance: nothing known carries over.
            runner.forget(node);
            *state = NodeCloud {
                instance_id: instance_id.to_owned(),
                ..NodeCloud::default()
            };
        }
        state
    }

    fn spawn_describe(
        &mut self,
        runner: &mut Runner<NodeName, Done>,
        node: NodeName,
        instance_id: String,
    ) {
        let ctx = self.ctx.clone();
        let need_instance = self
            .nodes
            .get(&node)
            .is_none_or(|s| s.instance.is_none() || s.check_instance);
        // After a full resync a node's interfaces are known; only a node whose interfaces
        // changed (a mutation, an attachment polled) is described again.
        let need_interfaces =
            !self.ready || !need_instance || !self.resync_interfaces.contains_key(&instance_id);
        let known: BTreeMap<String, InstanceLimits> = self.limits.clone();
        runner.spawn([node.clone()], async move {
            let result = describe_node(&ctx, &instance_id, need_interfaces, &known).await;
            Done::Described {
                node,
                instance_id,
                result,
            }
        });
    }

    /// Intents of no node (the collector's deletions) left open: replayed one task at a time.
    fn start_orphans(&mut self, runner: &mut Runner<NodeName, Done>, view: &ClusterView) {
        if self.orphans_running || self.gc_running {
            return;
        }
        let orphans: Vec<(CloudId, CloudEntry<CloudIntentRecord>)> = view
            .cloud_intents()
            .filter(|(_, e)| e.record.as_ref().is_none_or(|r| r.node.is_none()))
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        if orphans.is_empty() {
            return;
        }
        self.orphans_running = true;
        let ctx = self.ctx.clone();
        runner.spawn([], async move {
            let mut writes = Vec::new();
            for (id, entry) in orphans {
                let _ = replay_orphan(&ctx, &id, &entry, &mut writes).await;
            }
            Done::Orphan { writes }
        });
    }

    /// Plans the pending nodes into the queue (in order of need), then starts tasks from its
    /// head while fewer than `workers` run. A node is planned once when it becomes pending and
    /// again when it leaves the queue (its step from a fresh view), so a turn costs the nodes
    /// that changed, not every node waiting for a worker.
    fn start_nodes(&mut self, runner: &mut Runner<NodeName, Done>, view: &ClusterView) {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.queue.retain(|(_, node)| !pending.contains(node));
            for node in pending {
                if let Some((order, _)) = self.plan_ready(runner, view, &node) {
                    self.queue.push((order, node));
                }
            }
            let orders: Vec<ServeKey> = self.queue.iter().map(|(order, _)| *order).collect();
            let mut slots: Vec<Option<(ServeKey, NodeName)>> = std::mem::take(&mut self.queue)
                .into_iter()
                .map(Some)
                .collect();
            self.queue = decide::serve_order(&orders)
                .into_iter()
                .filter_map(|index| slots.get_mut(index).and_then(Option::take))
                .collect();
            // Served from the head: kept reversed, so the head is popped from the end.
            self.queue.reverse();
        }
        while !runner.is_full() {
            let Some((_, node)) = self.queue.pop() else {
                break;
            };
            if let Some((_, step)) = self.plan_ready(runner, view, &node) {
                self.spawn_step(runner, node, step);
            }
        }
    }

    /// The node's step if it may be served now.
    fn plan_ready(
        &mut self,
        runner: &mut Runner<NodeName, Done>,
        view: &ClusterView,
        node: &NodeName,
    ) -> Option<(ServeKey, Step)> {
        if !runner.is_due(node, Instant::now()) {
            // Planned again when its task ends or its wait runs out.
            return None;
        }
        let Some(instance_id) = instance_of(view, node) else {
            // Nothing of the node's state is kept but its backoff (a teardown that keeps
            // failing backs off as any step does).
            self.nodes.remove(node);
            self.ctx
                .term
                .shared
                .note_cloud_node(node.as_str(), Vec::new());
            // Removed (or registered without an instance): its open intents are replayed (as
            // for a node present, the node counting as gone: a created interface unattached is
            // deleted, a removed node's interface detached and deleted); then its records go,
            // each managed interface still on its instance behind a `Delete` intent written in
            // the same transaction (the agent's addresses leave with the record before the
            // interface is detached), the others (the primary, untagged ones) simply deleted.
            let intents = open_intents(view, node);
            let records = records_of(view, node);
            if intents.is_empty() && records.is_empty() {
                runner.forget(node);
                return None;
            }
            self.nodes.insert(node.clone(), NodeCloud::default());
            let ctx = self.ctx.clone();
            let node = node.clone();
            let intent_base = self.intent_id();
            runner.spawn([node.clone()], async move {
                let mut run = StepRun {
                    ctx: &ctx,
                    node: &node,
                    instance_id: "",
                    intent_base,
                    intents: 0,
                    writes: Vec::new(),
                    secondaries_only: Vec::new(),
                    no_free_prefix: Vec::new(),
                    occupied: Vec::new(),
                    mutated: false,
                    limits: None,
                    subnets: Vec::new(),
                    known: Vec::new(),
                    prefixes_refused: BTreeMap::new(),
                    created_refused_ms: None,
                };
                let outcome = if intents.is_empty() {
                    run.teardown(records).await
                } else {
                    run.replay(intents).await
                };
                let writes = run.writes;
                Done::Node {
                    node,
                    outcome,
                    writes,
                    interfaces: None,
                    secondaries_only: Vec::new(),
                    no_free_prefix: Vec::new(),
                    occupied: Vec::new(),
                }
            });
            return None;
        };
        if view.removals_requested().iter().any(|(n, ..)| n == node) {
            return None;
        }
        let (order, step) = self.plan(runner, view, node, &instance_id);
        step.map(|step| (order, step))
    }

    fn intent_id(&mut self) -> String {
        self.next_intent += 1;
        format!(
            "ci-{:x}-{:x}-{:x}",
            self.ctx.term.fence.revision,
            self.now_ms(),
            self.next_intent
        )
    }

    /// What to do next for one node, and its place in line.
    fn plan(
        &mut self,
        runner: &mut Runner<NodeName, Done>,
        view: &ClusterView,
        node: &NodeName,
        instance_id: &str,
    ) -> (ServeKey, Option<Step>) {
        let none = ServeKey::default();
        let intents = open_intents(view, node);
        let now_ms = self.now_ms();
        let limits_known = self.limits.clone();
        let secondaries_only: BTreeSet<String> = self
            .secondaries_only
            .iter()
            .filter(|(_, at)| decide::prefix_refusal_holds(Some(**at), now_ms))
            .map(|(id, _)| id.clone())
            .collect();
        let no_free_prefix: BTreeSet<String> = self
            .no_free_prefix
            .iter()
            .filter(|(_, at)| decide::prefix_refusal_holds(Some(**at), now_ms))
            .map(|(id, _)| id.clone())
            .collect();
        let subnets = self.subnets.clone();
        let occupied: Vec<u32> = self
            .occupied
            .get(instance_id)
            .map(|o| o.iter().copied().collect())
            .unwrap_or_default();
        let cluster = self.ctx.cluster.clone();
        let state = self.node_state(runner, node, instance_id);
        let records = records_of(view, node);
        // Records of an earlier instance of the node (registered again on a new one, the
        // old one's end not seen): not its interfaces (kept, they stood for capacity the node
        // lacks); torn down as a removed node's.
        let earlier: Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)> = records
            .iter()
            .filter(|(_, e)| {
                e.record
                    .as_ref()
                    .is_some_and(|r| !r.instance_id.is_empty() && r.instance_id != instance_id)
            })
            .cloned()
            .collect();
        let attaching: Vec<decide::Attaching> = records
            .iter()
            .filter(|(_, e)| {
                e.record
                    .as_ref()
                    .is_some_and(|r| r.attachment == CloudAttachment::Attaching)
            })
            .map(|(id, _)| decide::Attaching {
                interface: id.clone(),
                attached: state.interfaces.iter().any(|ni| {
                    ni.id == id.as_str()
                        && ni.attachment.as_ref().is_some_and(|a| {
                            a.status == corral_cloud::AttachmentStatus::Attached
                                && a.instance_id == instance_id
                        })
                }),
            })
            .collect();
        let limits = state
            .instance
            .as_ref()
            .and_then(|i| limits_known.get(&i.instance_type).copied());
        let ladder = decide::first_step(&decide::NodeFacts {
            open_intent: !intents.is_empty(),
            instance: state.instance.as_ref().map(|i| match i.state {
                InstanceState::Running => decide::InstanceLife::Running,
                InstanceState::ShuttingDown | InstanceState::Terminated => {
                    decide::InstanceLife::Gone
                }
                _ => decide::InstanceLife::NotRunning,
            }),
            stale: state.stale,
            earlier_records: !earlier.is_empty(),
            limits_known: limits.is_some(),
            attaching: &attaching,
        });
        if ladder.poll_attaching {
            // An attachment in progress: the node is described again soon.
            state.stale = true;
            runner.wait(node, ATTACH_POLL);
        }
        let (decide::FirstStep::PlanPools, Some(instance), Some(limits)) =
            (&ladder.step, state.instance.clone(), limits)
        else {
            let step = rung_step(view, node, ladder.step, intents, earlier, &records);
            return (none, step);
        };
        let subnet_views: Vec<SubnetView> = subnets
            .iter()
            .filter(|s| s.vpc_id == instance.vpc_id)
            .map(|s| subnet_view(s, no_free_prefix.contains(&s.id)))
            .collect();
        let pools = cloud_pools(view);
        let mut figures = Vec::new();
        let mut order = ServeKey::default();
        let mut chosen: Option<Step> = None;
        for (index, pool) in pools.iter().enumerate() {
            let Some(cloud_pool) = pool.cloud() else {
                continue;
            };
            let (cloud, demand_config) = (cloud_pool.settings(), &cloud_pool.demand);
            let interfaces = interface_views(
                &records,
                &state.interfaces,
                pool,
                &cloud,
                index == 0,
                &secondaries_only,
                &cluster,
            );
            let mut pool_plans: Vec<CloudPlan> = Vec::new();
            let mut reported = true;
            for (family, _) in pool.families() {
                let demand = view.demand(node, &pool.name).and_then(|d| d.family(family));
                reported &= demand.is_some();
                let releases: Vec<(IpNet, i64, ReleaseRecord)> = view
                    .releases_of(node)
                    .filter(|((_, p, f, _), _)| *p == pool.name && *f == family)
                    .map(|((.., cidr), (rev, record))| (*cidr, *rev, record.clone()))
                    .collect();
                let releasing: Vec<Releasing> = releases
                    .iter()
                    .map(|(cidr, _, r)| Releasing {
                        address: *cidr,
                        state: r.state,
                        marked_ms: r.marked_ms,
                    })
                    .collect();
                let key = (pool.name.clone(), family);
                let input = NodeCloudInput {
                    family,
                    watermarks: demand_config.capped_watermarks_for(
                        node.as_str(),
                        view.registration(node).and_then(|e| e.record.max_pods),
                    ),
                    cloud: &cloud,
                    limits,
                    zone: &instance.zone,
                    node_subnet: &instance.subnet_id,
                    interfaces: &interfaces,
                    subnets: &subnet_views,
                    occupied_indexes: &occupied,
                    demand,
                    releasing: &releasing,
                    excess_since_ms: state.excess_since.get(&key).copied(),
                    now_ms,
                    release_delay_ms: demand_config.release_delay_ms(),
                };
                let plan = decide::plan_node(&input);
                match plan.excess_since_ms {
                    Some(at) => {
                        state.excess_since.insert(key.clone(), at);
                        // The release delay runs out: planned again then.
                        let delay = demand_config.release_delay_ms();
                        let due = at.saturating_add(delay);
                        if due > now_ms && plan.action == CloudAction::Nothing {
                            let wait = Instant::now() + Duration::from_millis(due - now_ms + 10);
                            state.wake_at = Some(state.wake_at.map_or(wait, |t| t.min(wait)));
                        }
                    }
                    None => {
                        state.excess_since.remove(&key);
                    }
                }
                figures.push(CloudNodeFigures {
                    pool: pool.name.to_string(),
                    family,
                    stats: plan.stats,
                    at_capacity: plan.at_capacity,
                });
                match family {
                    Family::V4 => {
                        order.needed_v4 = order.needed_v4.saturating_add(plan.stats.needed)
                    }
                    Family::V6 => {
                        order.needed_v6 = order.needed_v6.saturating_add(plan.stats.needed)
                    }
                }
                order.excess = order.excess.saturating_add(plan.stats.excess);
                if chosen.is_none() {
                    chosen = release_or_act(
                        view,
                        node,
                        &pool.name,
                        family,
                        &plan,
                        &records,
                        &releases,
                        &instance,
                        &interfaces,
                        &state.interfaces,
                        &cloud,
                        &subnet_views,
                        now_ms,
                    );
                }
                pool_plans.push(plan);
            }
            // Nothing else to do, the agent reporting: an empty interface corral created is
            // given back (detached and deleted behind a `Delete` intent written with its
            // record's deletion).
            let since = state.empty_since.entry(pool.name.clone()).or_default();
            decide::track_empty(since, &interfaces, cloud.first_interface_index, now_ms);
            // An emptiness delay runs out: planned again then.
            if let Some(due) = since
                .values()
                .map(|at| at.saturating_add(demand_config.release_delay_ms()))
                .filter(|due| *due > now_ms)
                .min()
            {
                let wait = Instant::now() + Duration::from_millis(due - now_ms + 10);
                state.wake_at = Some(state.wake_at.map_or(wait, |t| t.min(wait)));
            }
            if chosen.is_none() && reported {
                let plans: Vec<&CloudPlan> = pool_plans.iter().collect();
                if let Some(empty) = decide::empty_interface_to_delete(
                    &interfaces,
                    cloud.first_interface_index,
                    &plans,
                    &state.empty_since[&pool.name],
                    now_ms,
                    demand_config.release_delay_ms(),
                ) && let Some((id, entry)) = records
                    .iter()
                    .find(|(id, e)| *id == empty && e.record.as_ref().is_some_and(|r| r.managed))
                {
                    chosen = Some(Step::Teardown(vec![(id.clone(), entry.clone())]));
                }
            }
        }
        self.ctx.term.shared.note_cloud_node(node.as_str(), figures);
        (order, chosen)
    }

    fn spawn_step(&mut self, runner: &mut Runner<NodeName, Done>, node: NodeName, step: Step) {
        let instance_id = match self.nodes.get(&node) {
            Some(state) => state.instance_id.clone(),
            None => return,
        };
        if let Step::Describe = step {
            self.spawn_describe(runner, node, instance_id);
            return;
        }
        let intent_id = self.intent_id();
        let ctx = self.ctx.clone();
        let limits = self
            .nodes
            .get(&node)
            .and_then(|s| s.instance.as_ref())
            .and_then(|i| self.limits.get(&i.instance_type))
            .copied();
        let subnets = self.subnets.clone();
        let known = self
            .nodes
            .get(&node)
            .map(|s| s.interfaces.clone())
            .unwrap_or_default();
        let now_ms = self.now_ms();
        let prefixes_refused: BTreeMap<String, u64> = known
            .iter()
            .filter_map(|ni| {
                let at = *self.secondaries_only.get(&ni.id)?;
                decide::prefix_refusal_holds(Some(at), now_ms).then(|| (ni.id.clone(), at))
            })
            .collect();
        runner.spawn([node.clone()], async move {
            let mut run = StepRun {
                ctx: &ctx,
                node: &node,
                instance_id: &instance_id,
                intent_base: intent_id,
                intents: 0,
                writes: Vec::new(),
                secondaries_only: Vec::new(),
                no_free_prefix: Vec::new(),
                occupied: Vec::new(),
                mutated: false,
                limits,
                subnets,
                known,
                prefixes_refused,
                created_refused_ms: None,
            };
            let outcome = run.run(step).await;
            let StepRun {
                writes,
                secondaries_only,
                no_free_prefix,
                occupied,
                mutated,
                ..
            } = run;
            let interfaces = if mutated && !matches!(outcome, Outcome::Fenced) {
                // Per-node resync after a mutation.
                ctx.provider
                    .describe_interfaces(&InterfaceFilter::instance(&instance_id))
                    .await
                    .ok()
            } else {
                None
            };
            Done::Node {
                node,
                outcome,
                writes,
                interfaces,
                secondaries_only,
                no_free_prefix,
                occupied,
            }
        });
    }

    fn start_gc(
        &mut self,
        runner: &mut Runner<NodeName, Done>,
        view: &ClusterView,
        pools: &[corral_cluster::PoolConfig],
    ) {
        // Interfaces a record or an open intent names, or that a node's task may be creating
        // now, are never leaks.
        let mut recorded: BTreeSet<String> = view
            .cloud_interfaces()
            .map(|((_, id), _)| id.to_string())
            .collect();
        let mut intents: BTreeSet<String> = BTreeSet::new();
        for (id, entry) in view.cloud_intents() {
            intents.insert(id.to_string());
            if let Some(record) = &entry.record {
                match &record.op {
                    CloudOp::Assign { interface, .. }
                    | CloudOp::Unassign { interface, .. }
                    | CloudOp::Delete { interface }
                    | CloudOp::DelegatePrefix { interface, .. }
                    | CloudOp::UndelegatePrefix { interface, .. } => {
                        recorded.insert(interface.to_string());
                    }
                    CloudOp::CreateAttach { .. } => {}
                }
            }
        }
        let busy: BTreeSet<String> = runner.busy().map(|n| n.to_string()).collect();
        let interval = gc_interval(pools);
        let cap = pools
            .iter()
            .filter_map(|p| p.cloud())
            .map(|c| c.settings().gc_max_per_run as usize)
            .min()
            .unwrap_or(25);
        let pool = pools[0].name.clone();
        let seen = self.gc_seen.clone();
        self.gc_running = true;
        self.gc_at = Some(Instant::now() + interval);
        let ctx = self.ctx.clone();
        let base = self.intent_id();
        runner.spawn([], async move {
            let mut writes = Vec::new();
            let result = collect_leaks(
                &ctx,
                &pool,
                LeakContext {
                    recorded,
                    intents,
                    busy,
                    seen,
                    interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
                    cap,
                    base,
                },
                &mut writes,
            )
            .await;
            Done::Gc { result, writes }
        });
    }

    /// Compares the records with a full describe (`interfaces`): those the cloud lacks (an
    /// interface, or an address on it) become suspects, and are reported once a resync at
    /// least the describe lag bound later still lacks them (`/v1/status` problems, the gauge
    /// `corral_operator_cloud_records_missing`). A new leader's first resync starts this, so
    /// a cloud that lost what the last leader recorded is reported within seconds.
    fn report_missing(&mut self, interfaces: &[NetworkInterface]) {
        let truth: corral_cluster::CloudTruth = interfaces
            .iter()
            .map(|ni| {
                (
                    ni.id.clone(),
                    (
                        ni.attachment.as_ref().map(|a| a.instance_id.clone()),
                        ni.secondary_nets(),
                    ),
                )
            })
            .collect();
        let now_ms = self.now_ms();
        let missing = self.ctx.term.shared.with_view(|view, _| {
            let busy: BTreeSet<CloudId> = view
                .cloud_intents()
                .filter_map(|(_, e)| e.record.as_ref())
                .filter_map(|intent| match &intent.op {
                    CloudOp::Assign { interface, .. }
                    | CloudOp::Unassign { interface, .. }
                    | CloudOp::Delete { interface }
                    | CloudOp::DelegatePrefix { interface, .. }
                    | CloudOp::UndelegatePrefix { interface, .. } => Some(interface.clone()),
                    CloudOp::CreateAttach { .. } => None,
                })
                .collect();
            let records = view
                .cloud_interfaces()
                .filter_map(|((node, id), e)| e.record.as_ref().map(|r| (node, id, r)));
            decide::missing_in_cloud(records, &truth, &busy, |node, record, address| {
                view.releases_of(node)
                    .any(|((_, pool, _, cidr), _)| *pool == record.pool && cidr == address)
            })
        });
        let Some(missing) = missing else {
            return;
        };
        let (kept, reported) = decide::confirm_missing(&self.missing, missing, now_ms);
        self.missing_unconfirmed = kept.len() > reported.len();
        self.missing = kept;
        self.ctx
            .term
            .shared
            .set_cloud_records_missing(reported.iter().map(ToString::to_string).collect());
    }

    fn backoff(&self, runner: &mut Runner<NodeName, Done>, node: &NodeName) {
        let timing = self
            .ctx
            .term
            .shared
            .with_view(|view, _| Resync::from(&view.config().resync))
            .unwrap_or_default();
        runner.back_off(node, &timing);
    }

    /// Puts what a task wrote into the view at once (the watch repeats it later), unless the
    /// view already holds the key at a later revision.
    fn apply_writes(&self, writes: &[Write]) {
        if writes.is_empty() {
            return;
        }
        self.ctx.term.shared.with_view_mut(|view, _| {
            for (key, value, revision) in writes {
                // A put keeps the key's create revision if the view has the key (the marks of
                // its addresses name it).
                let mut created = *revision;
                let newer = match self.ctx.term.keys.parse(key) {
                    Ok(Key::CloudInterface { node, interface }) => {
                        let existing = view
                            .cloud_interfaces_of(&node)
                            .find(|(id, _)| **id == interface)
                            .map(|(_, e)| (e.create_revision, e.mod_revision));
                        if let Some((create_revision, _)) = existing {
                            created = create_revision;
                        }
                        existing.is_some_and(|(_, m)| m > *revision)
                    }
                    Ok(Key::CloudIntent { id }) => view
                        .cloud_intents()
                        .any(|(i, e)| *i == id && e.mod_revision > *revision),
                    Ok(Key::Release {
                        node,
                        pool,
                        family,
                        cidr,
                    }) => view.releases_of(&node).any(|((_, p, f, c), (rev, _))| {
                        *p == pool && *f == family && *c == cidr && *rev > *revision
                    }),
                    _ => false,
                };
                if newer {
                    continue;
                }
                match value {
                    Some(value) => view.apply_put(key, value, created, *revision),
                    None => view.apply_delete(key, *revision),
                }
            }
        });
    }
}

/// The step a rung of the ladder (`decide::first_step`) other than planning the pools asks
/// for.
fn rung_step(
    view: &ClusterView,
    node: &NodeName,
    rung: decide::FirstStep,
    intents: Vec<(CloudId, CloudEntry<CloudIntentRecord>)>,
    earlier: Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)>,
    records: &[(CloudId, CloudEntry<CloudInterfaceRecord>)],
) -> Option<Step> {
    match rung {
        decide::FirstStep::Replay => Some(Step::Replay(intents)),
        decide::FirstStep::Describe => Some(Step::Describe),
        // As a removed node's: corral's interfaces still on the old instance (if it runs
        // on) are detached and deleted behind intents.
        decide::FirstStep::TeardownEarlier => Some(Step::Teardown(earlier)),
        decide::FirstStep::ForgetGone => {
            // The instance is gone: its records (and handshakes) go; its interfaces,
            // detached by the cloud, are the leak collector's (two sightings, 5 minutes
            // apart).
            let mut deletes: Vec<HandshakeStep> = records
                .iter()
                .map(|(id, e)| HandshakeStep::Delete {
                    key: view.keys().cloud_interface(node, id),
                    revision: e.mod_revision,
                })
                .collect();
            deletes.extend(
                view.releases_of(node)
                    .map(
                        |((_, pool, family, cidr), (rev, _))| HandshakeStep::Delete {
                            key: view.keys().release(node, pool, *family, cidr),
                            revision: *rev,
                        },
                    ),
            );
            (!deletes.is_empty()).then_some(Step::Handshake(deletes))
        }
        // Nothing is attached to an instance that is not running.
        decide::FirstStep::Nothing => None,
        decide::FirstStep::Confirm(interface) => {
            let entry = records.iter().find(|(id, _)| *id == interface)?.1.clone();
            Some(Step::Confirm { interface, entry })
        }
        decide::FirstStep::PlanPools => None,
    }
}

/// The node's open intents, but a to-cloud delegation's (`to_cloud` replays those).
fn open_intents(
    view: &ClusterView,
    node: &NodeName,
) -> Vec<(CloudId, CloudEntry<CloudIntentRecord>)> {
    view.cloud_intents()
        .filter(|(_, e)| {
            e.record
                .as_ref()
                .is_some_and(|r| r.node.as_ref() == Some(node) && !r.op.is_delegation())
        })
        .map(|(id, e)| (id.clone(), e.clone()))
        .collect()
}

/// The node's interface records.
fn records_of(
    view: &ClusterView,
    node: &NodeName,
) -> Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)> {
    view.cloud_interfaces_of(node)
        .map(|(id, e)| (id.clone(), e.clone()))
        .collect()
}

/// The configuration's cloud pools.
fn cloud_pools(view: &ClusterView) -> Vec<corral_cluster::PoolConfig> {
    view.config()
        .pools
        .iter()
        .filter(|p| p.is_cloud())
        .cloned()
        .collect()
}

fn gc_interval(pools: &[corral_cluster::PoolConfig]) -> Duration {
    let secs = pools
        .iter()
        .filter_map(|p| p.cloud())
        .map(|c| c.settings().gc_interval_secs)
        .min()
        .unwrap_or(300);
    Duration::from_secs(secs.max(1))
}

/// Chooses the node's step for one pool and family from its plan.
#[allow(clippy::too_many_arguments)]
fn release_or_act(
    view: &ClusterView,
    node: &NodeName,
    pool: &PoolName,
    family: Family,
    plan: &CloudPlan,
    records: &[(CloudId, CloudEntry<CloudInterfaceRecord>)],
    releases: &[(IpNet, i64, ReleaseRecord)],
    instance: &InstanceInfo,
    interfaces: &[InterfaceView],
    described: &[NetworkInterface],
    cloud: &corral_cluster::CloudPoolConfig,
    subnets: &[SubnetView],
    now_ms: u64,
) -> Option<Step> {
    let keys = view.keys();
    // Where each address is recorded: (interface, its record).
    let holder = |cidr: &IpNet| {
        records.iter().find(|(_, e)| {
            e.record
                .as_ref()
                .is_some_and(|r| r.pool == *pool && r.addresses.contains(cidr))
        })
    };
    // Stale keys (naming no current record of the node), refusals to forget, handshakes no
    // longer excess: deleted first, each at its mod revision.
    let mut deletes = Vec::new();
    for (cidr, revision, record) in releases {
        let current = holder(cidr).is_some_and(|(_, e)| e.create_revision == record.grant_revision);
        if !current || plan.forget.contains(cidr) || plan.unmark.contains(cidr) {
            deletes.push(HandshakeStep::Delete {
                key: keys.release(node, pool, family, cidr),
                revision: *revision,
            });
        }
    }
    if !deletes.is_empty() {
        return Some(Step::Handshake(deletes));
    }
    if let CloudAction::Unassign {
        interface,
        addresses,
    } = &plan.action
    {
        let entry = records
            .iter()
            .find(|(id, _)| id == interface)
            .map(|(_, e)| e.clone())?;
        let addresses: Vec<(IpNet, i64)> = addresses
            .iter()
            .filter_map(|a| {
                releases
                    .iter()
                    .find(|(c, _, r)| c == a && r.state == ReleaseState::Ready)
                    .map(|(c, rev, _)| (*c, *rev))
            })
            .collect();
        if addresses.is_empty() {
            return None;
        }
        return Some(Step::Unassign {
            pool: pool.clone(),
            family,
            interface: interface.clone(),
            entry,
            addresses,
        });
    }
    let security_groups = if cloud.security_groups.is_empty() {
        described
            .iter()
            .find(|ni| ni.attachment.as_ref().is_some_and(|a| a.device_index == 0))
            .map(|ni| ni.security_groups.clone())
            .unwrap_or_default()
    } else {
        cloud.security_groups.clone()
    };
    let attempt = AttemptContext {
        cloud: cloud.clone(),
        zone: instance.zone.clone(),
        subnets: subnets.to_vec(),
        interfaces: interfaces.to_vec(),
        security_groups,
    };
    match &plan.action {
        CloudAction::Nothing | CloudAction::Unassign { .. } => None,
        CloudAction::Assign {
            interface,
            count,
            prefixes,
        } => {
            let record = records
                .iter()
                .find(|(id, _)| id == interface)
                .map(|(_, e)| e.clone());
            let described = described
                .iter()
                .find(|ni| ni.id == interface.as_str())
                .cloned();
            if record.is_none() && described.is_none() {
                return None;
            }
            Some(Step::Assign {
                pool: pool.clone(),
                family,
                interface: interface.clone(),
                count: *count,
                prefixes: *prefixes,
                record,
                described,
                attempt,
            })
        }
        CloudAction::Create {
            subnet_id,
            device_index,
            count,
            prefixes,
        } => Some(Step::Create {
            pool: pool.clone(),
            family,
            subnet_id: subnet_id.clone(),
            device_index: *device_index,
            count: *count,
            prefixes: *prefixes,
            attempt,
        }),
        CloudAction::Mark {
            interface,
            addresses,
        } => {
            let (record_key, entry) = records
                .iter()
                .find(|(id, _)| id == interface)
                .map(|(id, e)| (keys.cloud_interface(node, id), e))?;
            let now = now_ms;
            let steps: Vec<HandshakeStep> = addresses
                .iter()
                .filter(|cidr| family_of(cidr) == family)
                .filter(|cidr| !releases.iter().any(|(c, ..)| c == *cidr))
                .filter_map(|cidr| {
                    let record = ReleaseRecord {
                        state: ReleaseState::Marked,
                        grant_revision: entry.create_revision,
                        marked_ms: now,
                        answered_ms: 0,
                        reason: None,
                    };
                    Some(HandshakeStep::Mark {
                        key: keys.release(node, pool, family, cidr),
                        record_key: record_key.clone(),
                        record_revision: entry.create_revision,
                        value: encode_value(&record).ok()?,
                    })
                })
                .collect();
            (!steps.is_empty()).then_some(Step::Handshake(steps))
        }
    }
}
