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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use corral_cloud::{
    Action, Amount, CloudError, CloudProvider, CreateInterface, InstanceState, InterfaceFilter,
    InterfaceStatus, Ipv4Assign, Ipv4Set, Ipv6Assign, Ipv6Set, NetworkInterface, Subnet,
    SubnetFilter,
};
use corral_cluster::cloud::{
    self as decide, CloudAction, CloudPlan, GcPlan, InstanceLimits, InterfaceView, LeakCandidate,
    NodeCloudInput, ObservedInterface, PrefixFallback, Releasing, Replay, ServeKey, SubnetView,
};
use corral_cluster::{
    CloudAttachment, CloudEntry, CloudId, CloudIntentRecord, CloudInterfaceRecord, CloudOp,
    ClusterView, Family, IpNet, Key, Keys, NodeName, PoolName, ReleaseRecord, ReleaseState, Resync,
    RetryState, encode_value,
};
use corral_kv::{Compare, Kv, Revision, Txn, TxnOp};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::logged::{Write, WriteError, fenced_txn};
use super::pending::PendingNodes;
use crate::election::Fence;
use crate::state::{CloudNodeFigures, Shared};
use crate::{CloudOptions, WallClock};

/// Tags corral puts on every interface it creates.
pub const TAG_CLUSTER: &str = "corral.io/cluster";
pub const TAG_NODE: &str = "corral.io/node";
pub const TAG_INTENT: &str = "corral.io/intent";
pub const TAG_CREATED_AT: &str = "corral.io/created-at";

/// Attach tries at successive device indexes when the cloud says an index is taken.
const ATTACH_TRIES: usize = 5;

/// How soon a node is looked at again while an interface it got is attaching.
const ATTACH_POLL: Duration = Duration::from_secs(2);

/// How soon an intent the cloud could not settle yet (`Replay::Wait`) is replayed again.
const REPLAY_WAIT: Duration = Duration::from_secs(3);

/// How long a node waits after a compare failed on a stale view (the watch catches up).
const STALE_WAIT: Duration = Duration::from_millis(200);

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

/// What every task needs.
struct Ctx<K, P> {
    kv: K,
    keys: Keys,
    fence: Fence,
    shared: Arc<Shared>,
    provider: Arc<P>,
    cluster: String,
    clock: WallClock,
    /// Interface records being written by running tasks (not in the view yet): each checked
    /// with the view's against a new record, so two tasks never record one interface or
    /// address for two nodes; a node's go when its task's writes are applied to the view.
    claims: Arc<std::sync::Mutex<Vec<(NodeName, CloudId, CloudInterfaceRecord)>>>,
}

impl<K: Clone, P> Clone for Ctx<K, P> {
    fn clone(&self) -> Self {
        Ctx {
            kv: self.kv.clone(),
            keys: self.keys.clone(),
            fence: self.fence.clone(),
            shared: Arc::clone(&self.shared),
            provider: Arc::clone(&self.provider),
            cluster: self.cluster.clone(),
            clock: Arc::clone(&self.clock),
            claims: Arc::clone(&self.claims),
        }
    }
}

/// A node's instance as described.
#[derive(Debug, Clone)]
struct InstanceInfo {
    instance_type: String,
    state: InstanceState,
    zone: String,
    vpc_id: String,
    subnet_id: String,
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
    retry: RetryState,
    /// Not served before then (backoff, an intent waiting, an attachment being polled).
    not_before: Option<Instant>,
    /// Planned again then (a release delay running out); unlike `not_before` it holds no
    /// plan back: a demand change meanwhile is planned at once (and may end the excess).
    wake_at: Option<Instant>,
    /// Excess clocks per pool and family.
    excess_since: HashMap<(PoolName, Family), u64>,
    /// Per pool, since when each empty managed interface has been empty (given back once it
    /// stayed so for the release delay).
    empty_since: HashMap<PoolName, HashMap<CloudId, u64>>,
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

struct Described {
    instance: InstanceInfo,
    limits: Option<InstanceLimits>,
    /// `None`: not described (the last full resync's are used).
    interfaces: Option<Vec<NetworkInterface>>,
}

/// How a node's step ended.
enum Outcome {
    /// Done; the node is planned again at once (it may need more).
    Ok,
    /// The plan changed (a prefix refused, a release withdrawn): planned again at once.
    Replan,
    /// Wait this long, without counting an error (an intent not settled, an attachment).
    Wait(Duration),
    /// Failed: the node backs off.
    Failed(String),
    /// Leading is gone (a fenced write refused): nothing more.
    Fenced,
}

/// The manager of the cloud view and its loop's state.
struct Manager<K, P> {
    ctx: Ctx<K, P>,
    workers: usize,
    resync_every: Duration,
    signal: Arc<CloudSignal>,
    running: JoinSet<Done>,
    /// The first full resync succeeded: mutations may run.
    ready: bool,
    resync_running: bool,
    resync_state: RetryState,
    resync_at: Instant,
    gc_running: bool,
    gc_at: Option<Instant>,
    gc_seen: BTreeMap<CloudId, u64>,
    limits: HashMap<String, InstanceLimits>,
    subnets: Vec<Subnet>,
    /// The last full resync's interfaces by the instance they are attached to.
    resync_interfaces: HashMap<String, Vec<NetworkInterface>>,
    nodes: HashMap<NodeName, NodeCloud>,
    busy: HashSet<NodeName>,
    pending: BTreeSet<NodeName>,
    /// Planned nodes waiting for a worker, the next at the end.
    queue: Vec<(ServeKey, NodeName)>,
    /// Interfaces whose prefix request was refused, and when (also kept in their records:
    /// learnt again by a new leader from them).
    secondaries_only: HashMap<String, u64>,
    /// Subnets that refused a new interface's prefixes, and when (kept in the records of
    /// interfaces corral created there after a refusal).
    no_free_prefix: HashMap<String, u64>,
    occupied: HashMap<String, BTreeSet<u32>>,
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
    let mut manager = Manager {
        ctx: Ctx {
            kv,
            keys,
            fence,
            shared,
            provider,
            cluster,
            clock: options.clock,
            claims: Arc::default(),
        },
        workers: options.workers.max(1),
        resync_every: options.resync,
        signal,
        running: JoinSet::new(),
        ready: false,
        resync_running: false,
        resync_state: RetryState::default(),
        resync_at: Instant::now(),
        gc_running: false,
        gc_at: None,
        gc_seen: BTreeMap::new(),
        limits: HashMap::new(),
        subnets: Vec::new(),
        resync_interfaces: HashMap::new(),
        nodes: HashMap::new(),
        busy: HashSet::new(),
        pending: BTreeSet::new(),
        queue: Vec::new(),
        secondaries_only: HashMap::new(),
        no_free_prefix: HashMap::new(),
        occupied: HashMap::new(),
        orphans_running: false,
        next_intent: 0,
        idle: false,
        missing: BTreeMap::new(),
        missing_unconfirmed: false,
    };
    manager.signal.all();
    loop {
        if manager.turn().is_none() {
            return;
        }
        let wake = manager.next_wake();
        tokio::select! {
            () = manager.signal.pending.notified() => {}
            Some(done) = manager.running.join_next(), if !manager.running.is_empty() => {
                if let Ok(done) = done {
                    manager.finish(done);
                }
            }
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

impl<K: Kv, P: CloudProvider + 'static> Manager<K, P> {
    fn now_ms(&self) -> u64 {
        (self.ctx.clock)()
    }

    /// The next moment something is due (a resync, the collector, a node's backoff).
    fn next_wake(&self) -> Instant {
        let mut wake = Instant::now() + Duration::from_secs(3600);
        if self.idle {
            // No cloud pool: the resync (due since the start) waits for one, and a configuration
            // with one comes as a signal (regression: the manager spun on a past resync time).
            return wake;
        }
        if !self.resync_running {
            wake = wake.min(self.resync_at);
        }
        if let (Some(at), false) = (self.gc_at, self.gc_running) {
            wake = wake.min(at);
        }
        for state in self.nodes.values() {
            if let Some(at) = state.not_before {
                wake = wake.min(at);
            }
            if let Some(at) = state.wake_at {
                wake = wake.min(at);
            }
        }
        wake
    }

    /// One turn: take the signal, start what is due. `None` when the view is gone.
    fn turn(&mut self) -> Option<()> {
        let (nodes, all) = self.signal.pending.take();
        let now = Instant::now();
        let shared = Arc::clone(&self.ctx.shared);
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
                if state.not_before.is_some_and(|at| at <= now) {
                    state.not_before = None;
                    self.pending.insert(node.clone());
                }
                if state.wake_at.is_some_and(|at| at <= now) {
                    state.wake_at = None;
                    self.pending.insert(node.clone());
                }
            }
            if !self.resync_running && self.resync_at <= now {
                self.start_resync();
            }
            if !self.ready || shared.regression_unsettled() {
                // Describes may run (they change nothing); mutations wait (also while etcd,
                // gone back in time, may have forgotten records the cloud still has: the
                // agents assert what they hold first).
                self.start_describes(view);
                return;
            }
            if self.gc_at.is_none() {
                let interval = gc_interval(&cloud_pools);
                self.gc_at = Some(now + interval);
            }
            self.start_orphans(view);
            self.start_nodes(view);
            if !self.gc_running
                && self.gc_at.is_some_and(|at| at <= now)
                && self.running.len() < self.workers + 2
            {
                self.start_gc(view, &cloud_pools);
            }
        })
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

    fn start_resync(&mut self) {
        self.resync_running = true;
        let ctx = self.ctx.clone();
        self.running.spawn(async move {
            let interfaces = call(
                &ctx.shared,
                Action::DescribeNetworkInterfaces,
                ctx.provider
                    .describe_interfaces(&InterfaceFilter::default()),
            )
            .await;
            let result = match interfaces {
                Ok(interfaces) => call(
                    &ctx.shared,
                    Action::DescribeSubnets,
                    ctx.provider.describe_subnets(&SubnetFilter::default()),
                )
                .await
                .map(|subnets| (interfaces, subnets)),
                Err(error) => Err(error),
            };
            Done::Resync(result)
        });
    }

    /// Before the first resync: describe nodes' instances (they need their limits anyway).
    fn start_describes(&mut self, view: &ClusterView) {
        let pending: Vec<NodeName> = self.pending.iter().cloned().collect();
        for node in pending {
            if self.running.len() >= self.workers {
                return;
            }
            if self.busy.contains(&node) || !self.due(&node) {
                continue;
            }
            let Some(instance_id) = instance_of(view, &node) else {
                self.pending.remove(&node);
                continue;
            };
            let state = self.node_state(&node, &instance_id);
            if state.instance.is_some() {
                continue;
            }
            self.pending.remove(&node);
            self.spawn_describe(node, instance_id);
        }
    }

    fn due(&self, node: &NodeName) -> bool {
        self.nodes
            .get(node)
            .is_none_or(|s| s.not_before.is_none_or(|at| at <= Instant::now()))
    }

    fn node_state(&mut self, node: &NodeName, instance_id: &str) -> &mut NodeCloud {
        let state = self.nodes.entry(node.clone()).or_default();
        if state.instance_id != instance_id {
            // A new registration on another instance: nothing known carries over.
            *state = NodeCloud {
                instance_id: instance_id.to_owned(),
                ..NodeCloud::default()
            };
        }
        state
    }

    fn spawn_describe(&mut self, node: NodeName, instance_id: String) {
        self.busy.insert(node.clone());
        let ctx = self.ctx.clone();
        let need_instance = self
            .nodes
            .get(&node)
            .is_none_or(|s| s.instance.is_none() || s.check_instance);
        // After a full resync a node's interfaces are known; only a node whose interfaces
        // changed (a mutation, an attachment polled) is described again.
        let need_interfaces =
            !self.ready || !need_instance || !self.resync_interfaces.contains_key(&instance_id);
        let known: HashMap<String, InstanceLimits> = self.limits.clone();
        self.running.spawn(async move {
            let result = describe_node(&ctx, &instance_id, need_interfaces, &known).await;
            Done::Described {
                node,
                instance_id,
                result,
            }
        });
    }

    /// Intents of no node (the collector's deletions) left open: replayed one task at a time.
    fn start_orphans(&mut self, view: &ClusterView) {
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
        self.running.spawn(async move {
            let mut writes = Vec::new();
            for (id, entry) in orphans {
                let _ = replay_orphan(&ctx, &id, &entry, &mut writes).await;
            }
            Done::Orphan { writes }
        });
    }

    /// Plans the pending nodes and starts tasks in order of need, up to `workers`.
    /// Plans the pending nodes into the queue (in order of need), then starts tasks from its
    /// head while fewer than `workers` run. A node is planned once when it becomes pending and
    /// again when it leaves the queue (its step from a fresh view), so a turn costs the nodes
    /// that changed, not every node waiting for a worker.
    fn start_nodes(&mut self, view: &ClusterView) {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            self.queue.retain(|(_, node)| !pending.contains(node));
            for node in pending {
                if let Some((order, _)) = self.plan_ready(view, &node) {
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
        while self.running.len() < self.workers {
            let Some((_, node)) = self.queue.pop() else {
                break;
            };
            if let Some((_, step)) = self.plan_ready(view, &node) {
                self.spawn_step(node, step);
            }
        }
    }

    /// The node's step if it may be served now.
    fn plan_ready(&mut self, view: &ClusterView, node: &NodeName) -> Option<(ServeKey, Step)> {
        if self.busy.contains(node) || !self.due(node) {
            // Planned again when its task ends or its wait runs out.
            return None;
        }
        let Some(instance_id) = instance_of(view, node) else {
            // Nothing of the node's state is kept but its backoff (a teardown that keeps
            // failing backs off as any step does).
            let retry = self.nodes.remove(node).map(|s| s.retry).unwrap_or_default();
            self.ctx.shared.note_cloud_node(node.as_str(), Vec::new());
            // Removed (or registered without an instance): its open intents are replayed (as
            // for a node present, the node counting as gone: a created interface unattached is
            // deleted, a removed node's interface detached and deleted); then its records go,
            // each managed interface still on its instance behind a `Delete` intent written in
            // the same transaction (the agent's addresses leave with the record before the
            // interface is detached), the others (the primary, untagged ones) simply deleted.
            let intents: Vec<(CloudId, CloudEntry<CloudIntentRecord>)> = view
                .cloud_intents()
                .filter(|(_, e)| {
                    e.record
                        .as_ref()
                        // A delegation's intent (to-cloud pools) is `to_cloud`'s to replay.
                        .is_some_and(|r| r.node.as_ref() == Some(node) && !r.op.is_delegation())
                })
                .map(|(id, e)| (id.clone(), e.clone()))
                .collect();
            let records: Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)> = view
                .cloud_interfaces_of(node)
                .map(|(id, e)| (id.clone(), e.clone()))
                .collect();
            if intents.is_empty() && records.is_empty() {
                return None;
            }
            self.nodes.insert(
                node.clone(),
                NodeCloud {
                    retry,
                    ..NodeCloud::default()
                },
            );
            self.busy.insert(node.clone());
            let ctx = self.ctx.clone();
            let node = node.clone();
            let intent_base = self.intent_id();
            self.running.spawn(async move {
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
                    prefixes_refused: HashMap::new(),
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
        let (order, step) = self.plan(view, node, &instance_id);
        step.map(|step| (order, step))
    }

    fn intent_id(&mut self) -> String {
        self.next_intent += 1;
        format!(
            "ci-{:x}-{:x}-{:x}",
            self.ctx.fence.revision,
            self.now_ms(),
            self.next_intent
        )
    }

    /// What to do next for one node, and its place in line.
    fn plan(
        &mut self,
        view: &ClusterView,
        node: &NodeName,
        instance_id: &str,
    ) -> (ServeKey, Option<Step>) {
        let none = ServeKey::default();
        // An open intent of the node is replayed before anything else.
        let intents: Vec<(CloudId, CloudEntry<CloudIntentRecord>)> = view
            .cloud_intents()
            .filter(|(_, e)| {
                e.record
                    .as_ref()
                    .is_some_and(|r| r.node.as_ref() == Some(node) && !r.op.is_delegation())
            })
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        let now_ms = self.now_ms();
        let limits_known = self.limits.clone();
        let secondaries_only: HashSet<String> = self
            .secondaries_only
            .iter()
            .filter(|(_, at)| decide::prefix_refusal_holds(Some(**at), now_ms))
            .map(|(id, _)| id.clone())
            .collect();
        let no_free_prefix: HashSet<String> = self
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
        let state = self.node_state(node, instance_id);
        if !intents.is_empty() {
            return (none, Some(Step::Replay(intents)));
        }
        let Some(instance) = state.instance.clone() else {
            return (none, Some(Step::Describe));
        };
        if state.stale {
            return (none, Some(Step::Describe));
        }
        // Records of an earlier instance of the node (registered again on a new one, the
        // old one's end not seen): not its interfaces (kept, they stood for capacity the node
        // lacks); torn down as a removed node's.
        let earlier: Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)> = view
            .cloud_interfaces_of(node)
            .filter(|(_, e)| {
                e.record
                    .as_ref()
                    .is_some_and(|r| !r.instance_id.is_empty() && r.instance_id != instance_id)
            })
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        if !earlier.is_empty() {
            // As a removed node's: corral's interfaces still on the old instance (if it runs
            // on) are detached and deleted behind intents.
            return (none, Some(Step::Teardown(earlier)));
        }
        if matches!(
            instance.state,
            InstanceState::ShuttingDown | InstanceState::Terminated
        ) {
            // The instance is gone: its records (and handshakes) go; its interfaces, detached
            // by the cloud, are the leak collector's (two sightings, 5 minutes apart).
            let mut deletes: Vec<HandshakeStep> = view
                .cloud_interfaces_of(node)
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
            return (
                none,
                (!deletes.is_empty()).then_some(Step::Handshake(deletes)),
            );
        }
        if instance.state != InstanceState::Running {
            // Nothing is attached to an instance that is not running.
            return (none, None);
        }
        let Some(limits) = limits_known.get(&instance.instance_type).copied() else {
            return (none, Some(Step::Describe));
        };
        let records: Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)> = view
            .cloud_interfaces_of(node)
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        // An attachment confirmed by the cloud is recorded; one still attaching is polled.
        for (id, entry) in &records {
            let Some(record) = &entry.record else {
                continue;
            };
            if record.attachment != CloudAttachment::Attaching {
                continue;
            }
            let attached = state.interfaces.iter().any(|ni| {
                ni.id == id.as_str()
                    && ni.attachment.as_ref().is_some_and(|a| {
                        a.status == corral_cloud::AttachmentStatus::Attached
                            && a.instance_id == instance_id
                    })
            });
            if attached {
                return (
                    none,
                    Some(Step::Confirm {
                        interface: id.clone(),
                        entry: entry.clone(),
                    }),
                );
            }
            state.stale = true;
            state.not_before = Some(Instant::now() + ATTACH_POLL);
        }
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
            let cloud = pool.cloud_config().unwrap_or_default();
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
                    watermarks: pool.capped_watermarks_for(
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
                    release_delay_ms: pool.release_delay_ms(),
                };
                let plan = decide::plan_node(&input);
                match plan.excess_since_ms {
                    Some(at) => {
                        state.excess_since.insert(key.clone(), at);
                        // The release delay runs out: planned again then.
                        let delay = pool.release_delay_ms();
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
                .map(|at| at.saturating_add(pool.release_delay_ms()))
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
                    pool.release_delay_ms(),
                ) && let Some((id, entry)) = records
                    .iter()
                    .find(|(id, e)| *id == empty && e.record.as_ref().is_some_and(|r| r.managed))
                {
                    chosen = Some(Step::Teardown(vec![(id.clone(), entry.clone())]));
                }
            }
        }
        self.ctx.shared.note_cloud_node(node.as_str(), figures);
        (order, chosen)
    }

    fn spawn_step(&mut self, node: NodeName, step: Step) {
        let instance_id = match self.nodes.get(&node) {
            Some(state) => state.instance_id.clone(),
            None => return,
        };
        if let Step::Describe = step {
            self.spawn_describe(node, instance_id);
            return;
        }
        let intent_id = self.intent_id();
        let ctx = self.ctx.clone();
        self.busy.insert(node.clone());
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
        let prefixes_refused: HashMap<String, u64> = known
            .iter()
            .filter_map(|ni| {
                let at = *self.secondaries_only.get(&ni.id)?;
                decide::prefix_refusal_holds(Some(at), now_ms).then(|| (ni.id.clone(), at))
            })
            .collect();
        self.running.spawn(async move {
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
                call(
                    &ctx.shared,
                    Action::DescribeNetworkInterfaces,
                    ctx.provider
                        .describe_interfaces(&InterfaceFilter::instance(&instance_id)),
                )
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

    fn start_gc(&mut self, view: &ClusterView, pools: &[corral_cluster::PoolConfig]) {
        // Interfaces a record or an open intent names, or that a node's task may be creating
        // now, are never leaks.
        let mut recorded: HashSet<String> = view
            .cloud_interfaces()
            .map(|((_, id), _)| id.to_string())
            .collect();
        let mut intents: HashSet<String> = HashSet::new();
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
        let busy: HashSet<String> = self.busy.iter().map(|n| n.to_string()).collect();
        let interval = gc_interval(pools);
        let cap = pools
            .iter()
            .filter_map(|p| p.cloud_config())
            .map(|c| c.gc_max_per_run as usize)
            .min()
            .unwrap_or(25);
        let pool = pools[0].name.clone();
        let seen = self.gc_seen.clone();
        self.gc_running = true;
        self.gc_at = Some(Instant::now() + interval);
        let ctx = self.ctx.clone();
        let base = self.intent_id();
        self.running.spawn(async move {
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

    /// Applies a finished task.
    fn finish(&mut self, done: Done) {
        match done {
            Done::Resync(result) => {
                self.resync_running = false;
                let timing = Resync {
                    resync: self.resync_every,
                    ..self
                        .ctx
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
                        let mut by_instance: HashMap<String, Vec<NetworkInterface>> =
                            HashMap::new();
                        for ni in interfaces {
                            if let Some(a) = &ni.attachment {
                                by_instance
                                    .entry(a.instance_id.clone())
                                    .or_default()
                                    .push(ni);
                            }
                        }
                        for (node, state) in &mut self.nodes {
                            if self.busy.contains(node) {
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
                            self.ctx.shared.set_cloud_ready(true);
                        }
                        self.resync_at =
                            Instant::now() + self.resync_state.success(&timing).max(timing.resync);
                        if self.missing_unconfirmed {
                            // Suspects wait for a confirming resync past the describe lag.
                            let confirm = Instant::now()
                                + Duration::from_millis(decide::DESCRIBE_LAG_BOUND_MS + 1_000);
                            self.resync_at = self.resync_at.min(confirm);
                        }
                        self.signal.all();
                    }
                    Err(error) => {
                        self.ctx
                            .shared
                            .note_problem(format!("cloud resync: {error}"));
                        self.resync_at = Instant::now() + self.resync_state.error(&timing);
                    }
                }
            }
            Done::Described {
                node,
                instance_id,
                result,
            } => {
                self.busy.remove(&node);
                self.pending.insert(node.clone());
                match result {
                    Ok(described) => {
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
                        let state = self.node_state(&node, &instance_id);
                        state.instance = Some(described.instance);
                        state.interfaces = interfaces;
                        state.stale = false;
                        state.check_instance = false;
                    }
                    Err(CloudError::InstanceNotFound { .. }) => {
                        // Gone for good (terminated long ago): as terminated.
                        let state = self.node_state(&node, &instance_id);
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
                        self.ctx
                            .shared
                            .note_problem(format!("describing {node} ({instance_id}): {error}"));
                        self.backoff(&node);
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
                self.busy.remove(&node);
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
                        if let Some(state) = self.nodes.get_mut(&node) {
                            state.retry = RetryState::default();
                        }
                        self.pending.insert(node);
                    }
                    Outcome::Wait(wait) => {
                        // A removed node has no state left: one is made to hold its wait.
                        self.nodes.entry(node).or_default().not_before =
                            Some(Instant::now() + wait);
                    }
                    Outcome::Failed(problem) => {
                        self.ctx
                            .shared
                            .note_problem(format!("cloud {node}: {problem}"));
                        self.backoff(&node);
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
                        self.ctx.shared.note_cloud_gc_deleted(deleted as u64);
                        if plan.over_cap > 0 {
                            self.ctx.shared.note_problem(format!(
                                "cloud leak collector: {} leaked interfaces left for the next run",
                                plan.over_cap
                            ));
                        }
                    }
                    Err(error) => {
                        self.ctx
                            .shared
                            .note_problem(format!("cloud leak collector: {error}"));
                    }
                }
            }
            Done::Orphan { writes } => {
                self.orphans_running = false;
                self.apply_writes(&writes);
            }
        }
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
                        addresses_of(ni),
                    ),
                )
            })
            .collect();
        let now_ms = self.now_ms();
        let missing = self.ctx.shared.with_view(|view, _| {
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
            .shared
            .set_cloud_records_missing(reported.iter().map(ToString::to_string).collect());
    }

    fn backoff(&mut self, node: &NodeName) {
        let timing = self
            .ctx
            .shared
            .with_view(|view, _| Resync::from(&view.config().resync))
            .unwrap_or_default();
        let state = self.nodes.entry(node.clone()).or_default();
        let wait = state.retry.error(&timing);
        state.not_before = Some(Instant::now() + wait);
    }

    /// Puts what a task wrote into the view at once (the watch repeats it later), unless the
    /// view already holds the key at a later revision.
    fn apply_writes(&self, writes: &[Write]) {
        if writes.is_empty() {
            return;
        }
        self.ctx.shared.with_view_mut(|view, _| {
            for (key, value, revision) in writes {
                // A put keeps the key's create revision if the view has the key (the marks of
                // its addresses name it).
                let mut created = *revision;
                let newer = match self.ctx.keys.parse(key) {
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
        .filter_map(|p| p.cloud_config())
        .map(|c| c.gc_interval_secs)
        .min()
        .unwrap_or(300);
    Duration::from_secs(secs.max(1))
}

fn instance_of(view: &ClusterView, node: &NodeName) -> Option<String> {
    view.registration(node)
        .and_then(|e| e.record.instance_id.clone())
}

/// Every cloud call of the manager, named by its action where it is made (the scheduler under
/// the provider counts calls by action and outcome for the metrics).
async fn call<T>(
    _shared: &Shared,
    _action: Action,
    future: impl Future<Output = Result<T, CloudError>>,
) -> Result<T, CloudError> {
    future.await
}

async fn describe_node<K, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    instance_id: &str,
    need_interfaces: bool,
    known: &HashMap<String, InstanceLimits>,
) -> Result<Described, CloudError> {
    let described = call(
        &ctx.shared,
        Action::DescribeInstances,
        ctx.provider.describe_instance(instance_id),
    )
    .await?;
    let limits = if known.contains_key(&described.instance_type) {
        None
    } else {
        let types = call(
            &ctx.shared,
            Action::DescribeInstanceTypes,
            ctx.provider
                .describe_instance_types(std::slice::from_ref(&described.instance_type)),
        )
        .await?;
        types.first().map(|t| InstanceLimits {
            max_interfaces: t.max_interfaces,
            ipv4_per_interface: t.ipv4_per_interface,
            ipv6_per_interface: t.ipv6_per_interface,
            prefix_delegation: t.prefix_delegation,
        })
    };
    let interfaces = if need_interfaces {
        Some(
            call(
                &ctx.shared,
                Action::DescribeNetworkInterfaces,
                ctx.provider
                    .describe_interfaces(&InterfaceFilter::instance(instance_id)),
            )
            .await?,
        )
    } else {
        None
    };
    Ok(Described {
        instance: InstanceInfo {
            instance_type: described.instance_type,
            state: described.state,
            zone: described.availability_zone,
            vpc_id: described.vpc_id,
            subnet_id: described.subnet_id,
        },
        limits,
        interfaces,
    })
}

fn subnet_view(subnet: &Subnet, no_free_prefix: bool) -> SubnetView {
    let mut cidrs = vec![IpNet::V4(subnet.ipv4_cidr)];
    if let Some(v6) = subnet.ipv6_cidr {
        cidrs.push(IpNet::V6(v6));
    }
    SubnetView {
        id: subnet.id.clone(),
        zone: subnet.availability_zone.clone(),
        cidrs,
        free_ipv4: subnet.available_ipv4,
        tags: subnet.tags.clone(),
        no_free_prefix,
    }
}

/// An interface's secondary addresses and prefixes, both families, as networks.
fn addresses_of(ni: &NetworkInterface) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = Vec::new();
    out.extend(
        ni.secondary_ipv4
            .iter()
            .map(|a| IpNet::from(IpAddr::V4(*a))),
    );
    out.extend(ni.ipv4_prefixes.iter().map(|p| IpNet::V4(*p)));
    out.extend(
        ni.ipv6_addresses
            .iter()
            .map(|a| IpNet::from(IpAddr::V6(*a))),
    );
    out.extend(ni.ipv6_prefixes.iter().map(|p| IpNet::V6(*p)));
    out
}

fn family_of(net: &IpNet) -> Family {
    match net {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    }
}

/// The node's interfaces as the decision sees them for one pool: recorded ones with the
/// addresses recorded (the agent serves exactly those; a describe may lag behind them), the
/// others as described. Interfaces of another pool, below the first interface index, or
/// corral's own without a record (an intent being replayed) are excluded.
fn interface_views(
    records: &[(CloudId, CloudEntry<CloudInterfaceRecord>)],
    described: &[NetworkInterface],
    pool: &corral_cluster::PoolConfig,
    cloud: &corral_cluster::CloudPoolConfig,
    first_pool: bool,
    secondaries_only: &HashSet<String>,
    cluster: &str,
) -> Vec<InterfaceView> {
    let mut out = Vec::new();
    for (id, entry) in records {
        let Some(record) = &entry.record else {
            continue;
        };
        out.push(InterfaceView {
            id: id.clone(),
            device_index: record.device_index,
            subnet_id: record.subnet_id.clone(),
            managed: record.managed,
            excluded: record.pool != pool.name,
            attached: record.attachment == CloudAttachment::Attached,
            addresses: record.addresses.clone(),
            secondaries_only: secondaries_only.contains(id.as_str()),
        });
    }
    for ni in described {
        if records.iter().any(|(id, _)| id.as_str() == ni.id) {
            continue;
        }
        let Ok(id) = CloudId::new(&ni.id) else {
            continue;
        };
        let Some(attachment) = &ni.attachment else {
            continue;
        };
        let managed = ni.tags.get(TAG_CLUSTER).is_some_and(|c| c == cluster);
        let detaching = matches!(
            attachment.status,
            corral_cloud::AttachmentStatus::Detaching | corral_cloud::AttachmentStatus::Detached
        );
        out.push(InterfaceView {
            id,
            device_index: attachment.device_index,
            subnet_id: ni.subnet_id.clone(),
            managed,
            excluded: !first_pool
                || managed
                || detaching
                || attachment.device_index < cloud.first_interface_index,
            attached: attachment.status == corral_cloud::AttachmentStatus::Attached,
            addresses: addresses_of(ni),
            secondaries_only: secondaries_only.contains(&ni.id),
        });
    }
    out.sort_by_key(|i| i.device_index);
    out
}

/// One node's next step.
// A step lives from its planning to its task's end, one per busy node: its size does not
// matter, and boxing would only add noise.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// Describe the node's instance and interfaces.
    Describe,
    /// Replay the node's open intents.
    Replay(Vec<(CloudId, CloudEntry<CloudIntentRecord>)>),
    /// Record that an attachment completed.
    Confirm {
        interface: CloudId,
        entry: CloudEntry<CloudInterfaceRecord>,
    },
    /// Release handshake steps (etcd only).
    Handshake(Vec<HandshakeStep>),
    /// Records to delete, a managed interface's with a `Delete` intent (a removed node's
    /// interfaces, an empty one).
    Teardown(Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)>),
    /// Unassign addresses the agent surrendered (`ready`), then record it.
    Unassign {
        pool: PoolName,
        family: Family,
        interface: CloudId,
        entry: CloudEntry<CloudInterfaceRecord>,
        /// (address, release key's mod revision).
        addresses: Vec<(IpNet, i64)>,
    },
    /// Assign addresses to an attached interface.
    Assign {
        pool: PoolName,
        family: Family,
        interface: CloudId,
        count: u32,
        prefixes: bool,
        /// The interface's record, or what describe showed of it (unrecorded: the primary).
        record: Option<CloudEntry<CloudInterfaceRecord>>,
        described: Option<NetworkInterface>,
        attempt: AttemptContext,
    },
    /// Create an interface with addresses and attach it.
    Create {
        pool: PoolName,
        family: Family,
        subnet_id: String,
        device_index: u32,
        count: u32,
        prefixes: bool,
        attempt: AttemptContext,
    },
}

/// What a create or assign needs beside the action for its fallbacks.
#[derive(Clone)]
struct AttemptContext {
    cloud: corral_cluster::CloudPoolConfig,
    zone: String,
    subnets: Vec<SubnetView>,
    interfaces: Vec<InterfaceView>,
    security_groups: Vec<String>,
}

/// One etcd step of a release handshake.
enum HandshakeStep {
    /// Put `marked` (the key absent, the interface record's create revision).
    Mark {
        key: String,
        record_key: String,
        record_revision: i64,
        value: Vec<u8>,
    },
    /// Delete a release key at its mod revision (un-mark, forget a refusal, a stale key).
    Delete { key: String, revision: i64 },
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

/// A node's step being carried out.
struct StepRun<'a, K, P> {
    ctx: &'a Ctx<K, P>,
    node: &'a NodeName,
    instance_id: &'a str,
    intent_base: String,
    intents: u32,
    writes: Vec<Write>,
    secondaries_only: Vec<String>,
    no_free_prefix: Vec<String>,
    occupied: Vec<u32>,
    /// A cloud mutation was made (the node's interfaces are described after).
    mutated: bool,
    limits: Option<InstanceLimits>,
    subnets: Vec<Subnet>,
    /// The node's interfaces as last described.
    known: Vec<NetworkInterface>,
    /// Interfaces whose prefix request was refused, and when: written into their records.
    prefixes_refused: HashMap<String, u64>,
    /// The create fell back to single addresses after its subnet refused prefixes, then: the
    /// new interface's record keeps it.
    created_refused_ms: Option<u64>,
}

impl<K: Kv, P: CloudProvider> StepRun<'_, K, P> {
    fn next_intent(&mut self) -> CloudId {
        self.intents += 1;
        CloudId::new(&format!("{}-{}", self.intent_base, self.intents))
            .unwrap_or_else(|_| CloudId::min())
    }

    /// Runs a fenced transaction; answers its revision.
    async fn txn(&mut self, txn: Txn) -> Result<Revision, WriteError> {
        fenced_txn(&self.ctx.kv, &self.ctx.fence, txn, &mut self.writes).await
    }

    /// Writes the intent (fenced, the key absent) before a cloud mutation.
    async fn open_intent(
        &mut self,
        id: &CloudId,
        pool: &PoolName,
        op: CloudOp,
    ) -> Result<(String, Revision), Outcome> {
        self.open_intent_if(id, pool, op, Vec::new()).await
    }

    /// Writes the intent as [`Self::open_intent`], only if `also` holds too (the records the
    /// call relies on are still as planned). A refusal with `also` is waited out: the view was
    /// behind, or leading is gone and every later write is refused as well.
    async fn open_intent_if(
        &mut self,
        id: &CloudId,
        pool: &PoolName,
        op: CloudOp,
        also: Vec<Compare>,
    ) -> Result<(String, Revision), Outcome> {
        let guarded = !also.is_empty();
        let record = CloudIntentRecord {
            node: Some(self.node.clone()),
            pool: pool.clone(),
            instance_id: Some(self.instance_id.to_owned()),
            op,
            started_ms: (self.ctx.clock)(),
        };
        let key = self.ctx.keys.cloud_intent(id);
        let value = encode_value(&record).map_err(|e| Outcome::Failed(e.to_string()))?;
        let mut compares = vec![Compare::absent(key.clone())];
        compares.extend(also);
        let txn = Txn {
            compares,
            success: vec![TxnOp::put(key.clone(), value)],
            failure: vec![],
        };
        match self.txn(txn).await {
            Ok(revision) => {
                self.ctx.shared.note_cloud_intent();
                Ok((key, revision))
            }
            Err(WriteError::Refused) if guarded => Err(Outcome::Wait(STALE_WAIT)),
            // The fence failed (or, impossibly, the ID is taken): no call is made.
            Err(WriteError::Refused) => Err(Outcome::Fenced),
            // Perhaps written: it is replayed (nothing was called, so it is forgotten).
            Err(WriteError::Uncertain(error)) => {
                Err(Outcome::Failed(format!("writing intent {id}: {error}")))
            }
        }
    }

    /// Rewrites an open intent, fenced and at the revision seen, before a replay's cloud call:
    /// the call is made only by the leader, and only while the intent is still open (not
    /// finished meanwhile by another leader or an earlier replay). Its `started_ms` becomes
    /// now, so the next replay measures the describe lag from this call (a describe behind
    /// it is waited for, not answered by calling again). Answers its new revision.
    async fn touch_intent(
        &mut self,
        key: &str,
        entry: &CloudEntry<CloudIntentRecord>,
        intent: &CloudIntentRecord,
    ) -> Result<Revision, Outcome> {
        let mut intent = intent.clone();
        intent.started_ms = (self.ctx.clock)();
        let value = encode_value(&intent).map_err(|e| Outcome::Failed(e.to_string()))?;
        let txn = Txn {
            compares: vec![Compare::modified_at(key.to_owned(), entry.mod_revision)],
            success: vec![TxnOp::put(key.to_owned(), value)],
            failure: vec![],
        };
        match self.txn(txn).await {
            Ok(revision) => Ok(revision),
            // Fenced, or the view was behind (the intent is gone or newer): no call.
            Err(WriteError::Refused) => Err(Outcome::Wait(STALE_WAIT)),
            Err(error) => Err(Outcome::Failed(format!("touching intent {key}: {error}"))),
        }
    }

    /// Deletes an intent whose call surely changed nothing.
    async fn drop_intent(&mut self, key: &str, revision: Revision) {
        let txn = Txn {
            compares: vec![Compare::modified_at(key.to_owned(), revision)],
            success: vec![TxnOp::delete(key.to_owned())],
            failure: vec![],
        };
        let _ = self.txn(txn).await;
    }

    async fn run(&mut self, step: Step) -> Outcome {
        match step {
            Step::Describe => Outcome::Ok,
            Step::Replay(intents) => self.replay(intents).await,
            Step::Confirm { interface, entry } => self.confirm(&interface, &entry).await,
            Step::Handshake(steps) => self.handshake(steps).await,
            Step::Teardown(records) => self.teardown(records).await,
            Step::Unassign {
                pool,
                family,
                interface,
                entry,
                addresses,
            } => {
                self.unassign(&pool, family, &interface, &entry, &addresses)
                    .await
            }
            Step::Assign {
                pool,
                family,
                interface,
                count,
                prefixes,
                record,
                described,
                attempt,
            } => {
                self.assign(
                    &pool, family, &interface, count, prefixes, record, described, &attempt,
                )
                .await
            }
            Step::Create {
                pool,
                family,
                subnet_id,
                device_index,
                count,
                prefixes,
                attempt,
            } => {
                self.create(
                    &pool,
                    family,
                    subnet_id,
                    device_index,
                    count,
                    prefixes,
                    &attempt,
                )
                .await
            }
        }
    }

    async fn handshake(&mut self, steps: Vec<HandshakeStep>) -> Outcome {
        for step in steps {
            let txn = match step {
                HandshakeStep::Mark {
                    key,
                    record_key,
                    record_revision,
                    value,
                } => Txn {
                    compares: vec![
                        Compare::absent(key.clone()),
                        Compare::created_at(record_key, record_revision),
                    ],
                    success: vec![TxnOp::put(key, value)],
                    failure: vec![],
                },
                HandshakeStep::Delete { key, revision } => Txn {
                    compares: vec![Compare::modified_at(key.clone(), revision)],
                    success: vec![TxnOp::delete(key)],
                    failure: vec![],
                },
            };
            match self.txn(txn).await {
                Ok(_) => {}
                // The view was behind (the agent answered meanwhile): planned again once the
                // watch caught up.
                Err(WriteError::Refused) => return Outcome::Wait(STALE_WAIT),
                Err(error) => return Outcome::Failed(format!("release handshake: {error}")),
            }
        }
        Outcome::Ok
    }

    /// Records to delete (a removed node's, an empty interface's): a managed interface still
    /// on an instance (not the primary) gets a `Delete` intent in the transaction that deletes
    /// its record (its replay detaches and deletes it); the others' records are deleted. Each
    /// at the record's mod revision.
    async fn teardown(
        &mut self,
        records: Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)>,
    ) -> Outcome {
        for (id, entry) in records {
            let key = self.ctx.keys.cloud_interface(self.node, &id);
            let mut txn = Txn {
                compares: vec![Compare::modified_at(key.clone(), entry.mod_revision)],
                success: vec![TxnOp::delete(key)],
                failure: vec![],
            };
            let detach = entry
                .record
                .as_ref()
                .filter(|r| r.managed && !r.instance_id.is_empty() && r.device_index != 0);
            if let Some(record) = detach {
                let intent = CloudIntentRecord {
                    node: Some(self.node.clone()),
                    pool: record.pool.clone(),
                    instance_id: Some(record.instance_id.clone()),
                    op: CloudOp::Delete {
                        interface: id.clone(),
                    },
                    started_ms: (self.ctx.clock)(),
                };
                let Ok(value) = encode_value(&intent) else {
                    return Outcome::Failed("encoding a cloud intent".to_owned());
                };
                let intent_key = self.ctx.keys.cloud_intent(&self.next_intent());
                txn.compares.push(Compare::absent(intent_key.clone()));
                txn.success.push(TxnOp::put(intent_key, value));
            }
            match self.txn(txn).await {
                Ok(_) => {
                    if detach.is_some() {
                        self.ctx.shared.note_cloud_intent();
                    }
                }
                Err(WriteError::Refused) => return Outcome::Wait(STALE_WAIT),
                Err(error) => return Outcome::Failed(format!("removing {id}'s record: {error}")),
            }
        }
        // Planned again at once: the intents are replayed.
        Outcome::Ok
    }

    async fn confirm(
        &mut self,
        interface: &CloudId,
        entry: &CloudEntry<CloudInterfaceRecord>,
    ) -> Outcome {
        let Some(record) = &entry.record else {
            return Outcome::Ok;
        };
        let mut record = record.clone();
        record.attachment = CloudAttachment::Attached;
        let key = self.ctx.keys.cloud_interface(self.node, interface);
        let Ok(value) = encode_value(&record) else {
            return Outcome::Ok;
        };
        let txn = Txn {
            compares: vec![Compare::modified_at(key.clone(), entry.mod_revision)],
            success: vec![TxnOp::put(key, value)],
            failure: vec![],
        };
        match self.txn(txn).await {
            Ok(_) => Outcome::Ok,
            Err(WriteError::Refused) => Outcome::Wait(STALE_WAIT),
            Err(error) => Outcome::Failed(format!("recording attachment of {interface}: {error}")),
        }
    }

    /// The subnet CIDRs of a record.
    fn subnet_cidrs(&self, subnet_id: &str) -> Vec<IpNet> {
        self.subnets
            .iter()
            .find(|s| s.id == subnet_id)
            .map(|s| subnet_view(s, false).cidrs)
            .unwrap_or_default()
    }

    #[allow(clippy::too_many_arguments)]
    async fn assign(
        &mut self,
        pool: &PoolName,
        family: Family,
        interface: &CloudId,
        count: u32,
        prefixes: bool,
        record: Option<CloudEntry<CloudInterfaceRecord>>,
        described: Option<NetworkInterface>,
        attempt: &AttemptContext,
    ) -> Outcome {
        let before: Vec<IpNet> = match (&record, &described) {
            (Some(entry), _) => entry
                .record
                .as_ref()
                .map(|r| r.addresses.clone())
                .unwrap_or_default(),
            (None, Some(ni)) => addresses_of(ni),
            (None, None) => return Outcome::Ok,
        };
        let id = self.next_intent();
        let op = CloudOp::Assign {
            interface: interface.clone(),
            count,
            prefixes,
            ipv6: family == Family::V6,
            before: before.clone(),
        };
        let (intent_key, intent_revision) = match self.open_intent(&id, pool, op).await {
            Ok(opened) => opened,
            Err(outcome) => return outcome,
        };
        self.mutated = true;
        let provider = &self.ctx.provider;
        let result: Result<Vec<IpNet>, CloudError> = match family {
            Family::V4 => {
                let request = if prefixes {
                    Ipv4Assign::Prefixes(Amount::Count(count))
                } else {
                    Ipv4Assign::Addresses(Amount::Count(count))
                };
                call(
                    &self.ctx.shared,
                    Action::AssignPrivateIpAddresses,
                    provider.assign_ipv4(interface.as_str(), &request),
                )
                .await
                .map(ipv4_nets)
            }
            Family::V6 => {
                let request = if prefixes {
                    Ipv6Assign::Prefixes(Amount::Count(count))
                } else {
                    Ipv6Assign::Addresses(Amount::Count(count))
                };
                call(
                    &self.ctx.shared,
                    Action::AssignIpv6Addresses,
                    provider.assign_ipv6(interface.as_str(), &request),
                )
                .await
                .map(ipv6_nets)
            }
        };
        let added = match result {
            Ok(added) => added,
            Err(error) => {
                if error.is_ambiguous() {
                    // Perhaps assigned: the intent stays, and is replayed (by describing)
                    // before the node is served again.
                    return Outcome::Wait(REPLAY_WAIT);
                }
                self.drop_intent(&intent_key, intent_revision).await;
                if matches!(error, CloudError::InsufficientCidrBlocks { .. }) && prefixes {
                    let action = CloudAction::Assign {
                        interface: interface.clone(),
                        count,
                        prefixes,
                    };
                    let fallback = decide::prefix_fallback(
                        &action,
                        &attempt.cloud,
                        &attempt.zone,
                        family,
                        &attempt.subnets,
                        &[],
                    );
                    if let PrefixFallback::Secondaries = fallback {
                        self.secondaries_only.push(interface.to_string());
                        // Kept in the record (if there is one yet; else written with the
                        // record the next assign makes) so a new leader does not ask again.
                        if let Some(entry) = &record
                            && let Some(mut kept) = entry.record.clone()
                        {
                            kept.prefixes_refused_ms = Some((self.ctx.clock)());
                            let key = self.ctx.keys.cloud_interface(self.node, interface);
                            if let Ok(value) = encode_value(&kept) {
                                let txn = Txn {
                                    compares: vec![Compare::modified_at(
                                        key.clone(),
                                        entry.mod_revision,
                                    )],
                                    success: vec![TxnOp::put(key, value)],
                                    failure: vec![],
                                };
                                let _ = self.txn(txn).await;
                            }
                        }
                    }
                    return Outcome::Replan;
                }
                return Outcome::Failed(format!("assigning to {interface}: {error}"));
            }
        };
        // Recorded with the addresses: one transaction, the record compared at the revision
        // the plan saw, the intent deleted.
        let key = self.ctx.keys.cloud_interface(self.node, interface);
        let mut addresses = before;
        for net in added {
            if !addresses.contains(&net) {
                addresses.push(net);
            }
        }
        let (record, compare) = match (record, described) {
            (Some(entry), _) => {
                let Some(mut record) = entry.record else {
                    return Outcome::Ok;
                };
                record.addresses = addresses;
                record.prefixes_refused_ms = record
                    .prefixes_refused_ms
                    .max(self.prefixes_refused.get(interface.as_str()).copied());
                (
                    record,
                    Compare::modified_at(key.clone(), entry.mod_revision),
                )
            }
            (None, Some(ni)) => (
                CloudInterfaceRecord {
                    pool: pool.clone(),
                    instance_id: self.instance_id.to_owned(),
                    device_index: ni.attachment.as_ref().map_or(0, |a| a.device_index),
                    subnet_id: ni.subnet_id.clone(),
                    subnets: self.subnet_cidrs(&ni.subnet_id),
                    mac: ni.mac.to_string(),
                    primary_ipv4: Some(ni.primary_ipv4),
                    addresses,
                    attachment: if ni
                        .attachment
                        .as_ref()
                        .is_some_and(|a| a.status == corral_cloud::AttachmentStatus::Attached)
                    {
                        CloudAttachment::Attached
                    } else {
                        CloudAttachment::Attaching
                    },
                    managed: ni
                        .tags
                        .get(TAG_CLUSTER)
                        .is_some_and(|c| *c == self.ctx.cluster),
                    prefixes_refused_ms: self.prefixes_refused.get(interface.as_str()).copied(),
                },
                Compare::absent(key.clone()),
            ),
            (None, None) => return Outcome::Ok,
        };
        self.record(key, record, compare, &intent_key, intent_revision, &[])
            .await
    }

    /// Checks a record about to be written against every other record (the view's and those
    /// other tasks are writing) and, if nothing stands against it, claims it until this task's
    /// writes are in the view: what stands against it, else nothing. The fence makes this
    /// leader the only writer of `interfaces/` (agents never write them; a removal only
    /// deletes), so its view plus the claims is every record; etcd cannot compare a key
    /// pattern (the same interface under any node), and a compare per node would not fit
    /// etcd's 128 operations per transaction.
    fn claim(
        &self,
        interface: &CloudId,
        record: &CloudInterfaceRecord,
    ) -> Vec<decide::RecordConflict> {
        let mut claims = self.ctx.claims.lock().unwrap_or_else(|e| e.into_inner());
        let conflicts = self
            .ctx
            .shared
            .with_view(|view, _| {
                let in_view = view
                    .cloud_record_candidates(interface, record)
                    .filter(|(n, i, _)| !claims.iter().any(|(cn, ci, _)| cn == *n && ci == *i));
                let claimed = claims.iter().map(|(n, i, r)| (n, i, r));
                decide::record_conflicts(in_view.chain(claimed), self.node, interface, record)
            })
            .unwrap_or_default();
        if conflicts.is_empty() {
            claims.retain(|(n, i, _)| !(n == self.node && i == interface));
            claims.push((self.node.clone(), interface.clone(), record.clone()));
        }
        conflicts
    }

    /// The one transaction after a mutation: the record put, the intent deleted (and release
    /// keys completed with it deleted).
    async fn record(
        &mut self,
        key: String,
        record: CloudInterfaceRecord,
        compare: Compare,
        intent_key: &str,
        intent_revision: Revision,
        release_deletes: &[(String, i64)],
    ) -> Outcome {
        let Ok(value) = encode_value(&record) else {
            return Outcome::Failed("encoding a cloud interface record".to_owned());
        };
        // Disjoint records: never one interface or address for two nodes (the intent stays
        // open; its replay meets the same refusal until the other record goes).
        if let Ok(Key::CloudInterface { interface, .. }) = self.ctx.keys.parse(&key) {
            let conflicts = self.claim(&interface, &record);
            if let Some(first) = conflicts.first() {
                for conflict in &conflicts {
                    self.ctx
                        .shared
                        .note_cloud_record_conflict(conflict.to_string());
                }
                return Outcome::Failed(first.to_string());
            }
        }
        let mut txn = Txn {
            compares: vec![
                compare,
                Compare::modified_at(intent_key.to_owned(), intent_revision),
            ],
            success: vec![TxnOp::put(key, value), TxnOp::delete(intent_key.to_owned())],
            failure: vec![],
        };
        for (release_key, revision) in release_deletes {
            txn.compares
                .push(Compare::modified_at(release_key.clone(), *revision));
            txn.success.push(TxnOp::delete(release_key.clone()));
        }
        match self.txn(txn).await {
            Ok(_) => Outcome::Ok,
            // The intent stays open: the next leader (or this one, once the view shows it)
            // replays it from what the cloud shows.
            Err(WriteError::Refused) => Outcome::Wait(REPLAY_WAIT),
            Err(error) => Outcome::Failed(format!("recording: {error}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn create(
        &mut self,
        pool: &PoolName,
        family: Family,
        mut subnet_id: String,
        device_index: u32,
        mut count: u32,
        mut prefixes: bool,
        attempt: &AttemptContext,
    ) -> Outcome {
        let mut tried: Vec<String> = Vec::new();
        loop {
            let id = self.next_intent();
            let op = CloudOp::CreateAttach {
                subnet_id: subnet_id.clone(),
                device_index,
            };
            let (intent_key, intent_revision) = match self.open_intent(&id, pool, op).await {
                Ok(opened) => opened,
                Err(outcome) => return outcome,
            };
            self.mutated = true;
            let now = (self.ctx.clock)();
            let mut tags = attempt.cloud.tags.clone();
            tags.insert(TAG_CLUSTER.to_owned(), self.ctx.cluster.clone());
            tags.insert(TAG_NODE.to_owned(), self.node.to_string());
            tags.insert(TAG_INTENT.to_owned(), id.to_string());
            tags.insert(TAG_CREATED_AT.to_owned(), now.to_string());
            let mut request = CreateInterface {
                subnet_id: subnet_id.clone(),
                description: Some(format!("corral {} {}", self.ctx.cluster, self.node)),
                tags,
                security_groups: attempt.security_groups.clone(),
                client_token: Some(id.to_string()),
                ..CreateInterface::default()
            };
            match (family, prefixes) {
                (Family::V4, false) => request.secondary_ipv4 = Some(Amount::Count(count)),
                (Family::V4, true) => request.ipv4_prefixes = Some(Amount::Count(count)),
                (Family::V6, false) => request.ipv6_addresses = Some(Amount::Count(count)),
                (Family::V6, true) => request.ipv6_prefixes = Some(Amount::Count(count)),
            }
            let created = call(
                &self.ctx.shared,
                Action::CreateNetworkInterface,
                self.ctx.provider.create_interface(&request),
            )
            .await;
            let created = match created {
                Ok(created) => created,
                Err(error) if error.is_ambiguous() => {
                    // Perhaps created: the intent (the client token and tag) finds it.
                    return Outcome::Wait(REPLAY_WAIT);
                }
                Err(error) => {
                    self.drop_intent(&intent_key, intent_revision).await;
                    if matches!(error, CloudError::InsufficientCidrBlocks { .. }) && prefixes {
                        tried.push(subnet_id.clone());
                        self.no_free_prefix.push(subnet_id.clone());
                        let action = CloudAction::Create {
                            subnet_id: subnet_id.clone(),
                            device_index,
                            count,
                            prefixes,
                        };
                        match decide::prefix_fallback(
                            &action,
                            &attempt.cloud,
                            &attempt.zone,
                            family,
                            &attempt.subnets,
                            &tried,
                        ) {
                            PrefixFallback::Sibling {
                                subnet_id: sibling,
                                count: sibling_count,
                            } => {
                                subnet_id = sibling;
                                count = sibling_count.max(1);
                            }
                            PrefixFallback::Secondaries => {
                                // Single addresses in that subnet: as many as the prefixes
                                // would have given, within the interface's limit. The new
                                // interface's record keeps the refusal.
                                prefixes = false;
                                self.created_refused_ms = Some((self.ctx.clock)());
                                let per = self.limits.map_or(count.saturating_mul(16), |l| {
                                    l.ipv4_per_interface.saturating_sub(1)
                                });
                                let count_now = count.saturating_mul(16).min(per.max(1));
                                return Box::pin(self.create(
                                    pool,
                                    family,
                                    subnet_id,
                                    device_index,
                                    count_now,
                                    prefixes,
                                    attempt,
                                ))
                                .await;
                            }
                        }
                        if tried.len() > attempt.subnets.len() {
                            return Outcome::Failed("no subnet has a free prefix".to_owned());
                        }
                        continue;
                    }
                    return Outcome::Failed(format!("creating an interface: {error}"));
                }
            };
            return self
                .attach(
                    pool,
                    &created,
                    device_index,
                    &intent_key,
                    intent_revision,
                    attempt,
                )
                .await;
        }
    }

    /// Attaches a created interface at `device_index` (the next free one on an occupied
    /// index, up to 5 tries), then records it; deletes it if attaching fails.
    async fn attach(
        &mut self,
        pool: &PoolName,
        created: &NetworkInterface,
        mut device_index: u32,
        intent_key: &str,
        intent_revision: Revision,
        attempt: &AttemptContext,
    ) -> Outcome {
        let max_interfaces = self.limits.map_or(u32::MAX, |l| l.max_interfaces);
        let mut attached = None;
        let mut last_error = None;
        for _ in 0..ATTACH_TRIES {
            match call(
                &self.ctx.shared,
                Action::AttachNetworkInterface,
                self.ctx
                    .provider
                    .attach_interface(&created.id, self.instance_id, device_index),
            )
            .await
            {
                Ok(_) => {
                    attached = Some(device_index);
                    break;
                }
                Err(CloudError::DeviceIndexInUse { .. }) => {
                    self.occupied.push(device_index);
                    let occupied = self.occupied.clone();
                    match decide::next_device_index(
                        &attempt.interfaces,
                        attempt.cloud.first_interface_index,
                        max_interfaces,
                        &occupied,
                        Some(device_index),
                    ) {
                        Some(next) => device_index = next,
                        None => {
                            last_error = Some("no free device index".to_owned());
                            break;
                        }
                    }
                }
                Err(error) if error.is_ambiguous() => {
                    // Perhaps attached: the intent is replayed from what the cloud shows.
                    return Outcome::Wait(REPLAY_WAIT);
                }
                Err(error) => {
                    last_error = Some(error.to_string());
                    break;
                }
            }
        }
        let Some(device_index) = attached else {
            // Not attached: the interface is deleted (best effort; the intent stays open if
            // that fails, and its replay deletes it).
            let deleted = call(
                &self.ctx.shared,
                Action::DeleteNetworkInterface,
                self.ctx.provider.delete_interface(&created.id),
            )
            .await;
            if deleted.is_ok() || deleted.as_ref().is_err_and(CloudError::is_not_found) {
                self.drop_intent(intent_key, intent_revision).await;
            }
            return Outcome::Failed(format!(
                "attaching {}: {}",
                created.id,
                last_error.unwrap_or_default()
            ));
        };
        let Ok(interface) = CloudId::new(&created.id) else {
            return Outcome::Failed(format!("the cloud named an interface {:?}", created.id));
        };
        let key = self.ctx.keys.cloud_interface(self.node, &interface);
        let record = CloudInterfaceRecord {
            pool: pool.clone(),
            instance_id: self.instance_id.to_owned(),
            device_index,
            subnet_id: created.subnet_id.clone(),
            subnets: self.subnet_cidrs(&created.subnet_id),
            mac: created.mac.to_string(),
            primary_ipv4: Some(created.primary_ipv4),
            addresses: addresses_of(created),
            attachment: CloudAttachment::Attaching,
            managed: true,
            prefixes_refused_ms: self.created_refused_ms,
        };
        self.record(
            key.clone(),
            record,
            Compare::absent(key),
            intent_key,
            intent_revision,
            &[],
        )
        .await
    }

    async fn unassign(
        &mut self,
        pool: &PoolName,
        family: Family,
        interface: &CloudId,
        entry: &CloudEntry<CloudInterfaceRecord>,
        addresses: &[(IpNet, i64)],
    ) -> Outcome {
        let Some(record) = &entry.record else {
            return Outcome::Ok;
        };
        let nets: Vec<IpNet> = addresses.iter().map(|(net, _)| *net).collect();
        let id = self.next_intent();
        let op = CloudOp::Unassign {
            interface: interface.clone(),
            addresses: nets.clone(),
        };
        // Only while each `ready` is still the one seen (at its mod revision) and the record
        // still holds the addresses: a view behind must not unassign what was re-granted.
        let key = self.ctx.keys.cloud_interface(self.node, interface);
        let mut also = vec![Compare::modified_at(key, entry.mod_revision)];
        for (net, revision) in addresses {
            also.push(Compare::modified_at(
                self.ctx.keys.release(self.node, pool, family, net),
                *revision,
            ));
        }
        let (intent_key, intent_revision) = match self.open_intent_if(&id, pool, op, also).await {
            Ok(opened) => opened,
            Err(outcome) => return outcome,
        };
        self.mutated = true;
        let result = unassign_call(self.ctx, interface.as_str(), &nets).await;
        match result {
            Ok(()) => {}
            // Some are not on the interface: EC2 (and the fake) refuse the whole call, so the
            // others are still assigned; moto drops what is there and answers success. Either
            // way the answer does not say which are gone: the intent stays open and its replay
            // reads the interface (after the describe lag bound) before the record drops any.
            Err(error) if is_not_assigned(&error) => return Outcome::Wait(REPLAY_WAIT),
            Err(error) if error.is_ambiguous() => return Outcome::Wait(REPLAY_WAIT),
            Err(error) => {
                self.drop_intent(&intent_key, intent_revision).await;
                return Outcome::Failed(format!("unassigning from {interface}: {error}"));
            }
        }
        let mut record = record.clone();
        record.addresses.retain(|a| !nets.contains(a));
        let key = self.ctx.keys.cloud_interface(self.node, interface);
        let release_deletes: Vec<(String, i64)> = addresses
            .iter()
            .map(|(net, revision)| {
                (
                    self.ctx.keys.release(self.node, pool, family, net),
                    *revision,
                )
            })
            .collect();
        self.record(
            key.clone(),
            record,
            Compare::modified_at(key, entry.mod_revision),
            &intent_key,
            intent_revision,
            &release_deletes,
        )
        .await
    }

    /// Finishes or undoes the node's open intents from what the cloud shows.
    async fn replay(&mut self, intents: Vec<(CloudId, CloudEntry<CloudIntentRecord>)>) -> Outcome {
        for (id, entry) in intents {
            let intent_key = self.ctx.keys.cloud_intent(&id);
            let Some(intent) = entry.record.clone() else {
                self.drop_intent(&intent_key, entry.mod_revision).await;
                continue;
            };
            let found = match find_intent_interface(self.ctx, &id, &intent).await {
                Ok(found) => found,
                Err(error) => return Outcome::Failed(format!("replaying intent {id}: {error}")),
            };
            let observed = found.as_ref().map(|ni| observe(ni, &self.ctx.cluster));
            let record_entry = found.as_ref().and_then(|ni| {
                let iid = CloudId::new(&ni.id).ok()?;
                self.ctx
                    .shared
                    .with_view(|view, _| {
                        view.cloud_interfaces_of(self.node)
                            .find(|(i, _)| **i == iid)
                            .map(|(_, e)| e.clone())
                    })
                    .flatten()
            });
            let node_present = self
                .ctx
                .shared
                .with_view(|view, _| {
                    instance_of(view, self.node).as_deref() == intent.instance_id.as_deref()
                })
                .unwrap_or(false);
            let age = (self.ctx.clock)().saturating_sub(intent.started_ms);
            let index_free = match &intent.op {
                CloudOp::CreateAttach { device_index, .. } => !self.known.iter().any(|ni| {
                    ni.attachment
                        .as_ref()
                        .is_some_and(|a| a.device_index == *device_index)
                        && found.as_ref().is_none_or(|f| f.id != ni.id)
                }),
                _ => true,
            };
            let replay = decide::replay_intent(
                &intent,
                observed.as_ref(),
                record_entry.as_ref().and_then(|e| e.record.as_ref()),
                node_present,
                index_free,
                age,
            );
            let outcome = self
                .carry_out_replay(
                    &intent_key,
                    &entry,
                    &intent,
                    replay,
                    found.as_ref(),
                    record_entry.as_ref(),
                )
                .await;
            match outcome {
                Outcome::Ok | Outcome::Replan => {}
                other => return other,
            }
        }
        Outcome::Ok
    }

    async fn carry_out_replay(
        &mut self,
        intent_key: &str,
        entry: &CloudEntry<CloudIntentRecord>,
        intent: &CloudIntentRecord,
        replay: Replay,
        found: Option<&NetworkInterface>,
        record_entry: Option<&CloudEntry<CloudInterfaceRecord>>,
    ) -> Outcome {
        match replay {
            Replay::Forget => {
                // An unassign that went through (its addresses are not on the interface any
                // more): they leave the record with the intent, with their release keys (left
                // in the record, a later unassign naming them with others would be refused
                // as "not assigned" and drop the others from the record while still assigned).
                if let CloudOp::Unassign {
                    interface,
                    addresses,
                } = &intent.op
                    && found.is_some()
                    && let Some(e) = record_entry
                    && let Some(record) = &e.record
                    && record.addresses.iter().any(|a| addresses.contains(a))
                {
                    let mut record = record.clone();
                    record.addresses.retain(|a| !addresses.contains(a));
                    let release_deletes = self
                        .ctx
                        .shared
                        .with_view(|view, _| {
                            view.releases_of(self.node)
                                .filter(|((_, p, _, c), _)| {
                                    *p == intent.pool && addresses.contains(c)
                                })
                                .map(|((_, p, f, c), (rev, _))| {
                                    (view.keys().release(self.node, p, *f, c), *rev)
                                })
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default();
                    let key = self.ctx.keys.cloud_interface(self.node, interface);
                    return self
                        .record(
                            key.clone(),
                            record,
                            Compare::modified_at(key, e.mod_revision),
                            intent_key,
                            entry.mod_revision,
                            &release_deletes,
                        )
                        .await;
                }
                self.drop_intent(intent_key, entry.mod_revision).await;
                Outcome::Ok
            }
            Replay::Wait => Outcome::Wait(REPLAY_WAIT),
            Replay::Record(observed) => {
                let Some(ni) = found else {
                    return Outcome::Wait(REPLAY_WAIT);
                };
                self.record_observed(intent_key, entry, intent, ni, &observed, record_entry)
                    .await
            }
            Replay::Attach {
                interface,
                device_index,
            } => {
                let Some(ni) = found else {
                    return Outcome::Wait(REPLAY_WAIT);
                };
                let revision = match self.touch_intent(intent_key, entry, intent).await {
                    Ok(revision) => revision,
                    Err(outcome) => return outcome,
                };
                self.mutated = true;
                let attempt = AttemptContext {
                    cloud: self
                        .ctx
                        .shared
                        .with_view(|view, _| {
                            view.config()
                                .pool(&intent.pool)
                                .and_then(|p| p.cloud_config())
                        })
                        .flatten()
                        .unwrap_or_default(),
                    zone: ni.availability_zone.clone(),
                    subnets: Vec::new(),
                    interfaces: Vec::new(),
                    security_groups: Vec::new(),
                };
                let _ = interface;
                self.attach(
                    &intent.pool,
                    ni,
                    device_index,
                    intent_key,
                    revision,
                    &attempt,
                )
                .await
            }
            Replay::Delete { interface } => {
                let revision = match self.touch_intent(intent_key, entry, intent).await {
                    Ok(revision) => revision,
                    Err(outcome) => return outcome,
                };
                self.mutated = true;
                match call(
                    &self.ctx.shared,
                    Action::DeleteNetworkInterface,
                    self.ctx.provider.delete_interface(interface.as_str()),
                )
                .await
                {
                    Ok(()) => {
                        self.drop_intent(intent_key, revision).await;
                        Outcome::Ok
                    }
                    Err(error) if error.is_not_found() => {
                        self.drop_intent(intent_key, revision).await;
                        Outcome::Ok
                    }
                    // Still detaching (shown unattached a moment early): asked again soon.
                    Err(CloudError::InterfaceInUse { .. }) => Outcome::Wait(ATTACH_POLL),
                    Err(error) => Outcome::Failed(format!("deleting {interface}: {error}")),
                }
            }
            Replay::Detach { interface } => {
                let Some(attachment) = found.and_then(|ni| ni.attachment.as_ref()) else {
                    return Outcome::Wait(REPLAY_WAIT);
                };
                if let Err(outcome) = self.touch_intent(intent_key, entry, intent).await {
                    return outcome;
                }
                self.mutated = true;
                // Not forced: the instance is running and the interface leaves cleanly (its
                // addresses left the agent with its record before this call).
                match call(
                    &self.ctx.shared,
                    Action::DetachNetworkInterface,
                    self.ctx.provider.detach_interface(&attachment.id, false),
                )
                .await
                {
                    // Deleted once a replay shows it unattached.
                    Ok(()) => Outcome::Wait(ATTACH_POLL),
                    Err(error) if error.is_not_found() || error.is_ambiguous() => {
                        Outcome::Wait(ATTACH_POLL)
                    }
                    Err(error) => Outcome::Failed(format!("detaching {interface}: {error}")),
                }
            }
            Replay::Unassign {
                interface,
                addresses,
            } => {
                if let Err(outcome) = self.touch_intent(intent_key, entry, intent).await {
                    return outcome;
                }
                self.mutated = true;
                // Done or not, the next replay reads the interface again (waiting within the
                // describe lag of this call) before anything is recorded.
                match unassign_call(self.ctx, interface.as_str(), &addresses).await {
                    Ok(()) => Outcome::Wait(REPLAY_WAIT),
                    Err(error) if is_not_assigned(&error) || error.is_ambiguous() => {
                        Outcome::Wait(REPLAY_WAIT)
                    }
                    Err(error) => Outcome::Failed(format!("unassigning from {interface}: {error}")),
                }
            }
        }
    }

    /// Records what the cloud shows of an intent's interface, deleting the intent (and, for
    /// an unassign, the release keys of addresses gone).
    async fn record_observed(
        &mut self,
        intent_key: &str,
        entry: &CloudEntry<CloudIntentRecord>,
        intent: &CloudIntentRecord,
        ni: &NetworkInterface,
        observed: &ObservedInterface,
        record_entry: Option<&CloudEntry<CloudInterfaceRecord>>,
    ) -> Outcome {
        let key = self.ctx.keys.cloud_interface(self.node, &observed.id);
        let (record, compare) =
            match record_entry.and_then(|e| e.record.clone().map(|r| (e, r))) {
                Some((e, mut record)) => {
                    record.addresses = observed.addresses.clone();
                    if let Some((_, index)) = &observed.attached_to {
                        record.device_index = *index;
                    }
                    (record, Compare::modified_at(key.clone(), e.mod_revision))
                }
                None => {
                    let Some((attached_to, device_index)) = observed.attached_to.clone() else {
                        return Outcome::Wait(REPLAY_WAIT);
                    };
                    (
                        CloudInterfaceRecord {
                            pool: intent.pool.clone(),
                            // The instance it is on (the intent's, perhaps not the node's
                            // current one: then the record is dropped, never served there).
                            instance_id: attached_to,
                            device_index,
                            subnet_id: ni.subnet_id.clone(),
                            subnets: self.subnet_cidrs(&ni.subnet_id),
                            mac: ni.mac.to_string(),
                            primary_ipv4: Some(ni.primary_ipv4),
                            addresses: observed.addresses.clone(),
                            attachment: if ni.attachment.as_ref().is_some_and(|a| {
                                a.status == corral_cloud::AttachmentStatus::Attached
                            }) {
                                CloudAttachment::Attached
                            } else {
                                CloudAttachment::Attaching
                            },
                            managed: ni
                                .tags
                                .get(TAG_CLUSTER)
                                .is_some_and(|c| *c == self.ctx.cluster),
                            prefixes_refused_ms: None,
                        },
                        Compare::absent(key.clone()),
                    )
                }
            };
        // An unassign that went through: its release keys go with the intent.
        let mut release_deletes = Vec::new();
        if let CloudOp::Unassign { addresses, .. } = &intent.op {
            let gone: Vec<IpNet> = addresses
                .iter()
                .filter(|a| !observed.addresses.contains(a))
                .copied()
                .collect();
            release_deletes = self
                .ctx
                .shared
                .with_view(|view, _| {
                    view.releases_of(self.node)
                        .filter(|((_, p, _, c), _)| *p == intent.pool && gone.contains(c))
                        .map(|((_, p, f, c), (rev, _))| {
                            (view.keys().release(self.node, p, *f, c), *rev)
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
        }
        self.record(
            key,
            record,
            compare,
            intent_key,
            entry.mod_revision,
            &release_deletes,
        )
        .await
    }
}

fn ipv4_nets(set: Ipv4Set) -> Vec<IpNet> {
    set.addresses
        .into_iter()
        .map(|a| IpNet::from(IpAddr::V4(a)))
        .chain(set.prefixes.into_iter().map(IpNet::V4))
        .collect()
}

fn ipv6_nets(set: Ipv6Set) -> Vec<IpNet> {
    set.addresses
        .into_iter()
        .map(|a| IpNet::from(IpAddr::V6(a)))
        .chain(set.prefixes.into_iter().map(IpNet::V6))
        .collect()
}

/// An unassign whose addresses were not on the interface any more (a repeat).
fn is_not_assigned(error: &CloudError) -> bool {
    matches!(error, CloudError::InvalidParameterValue { message } if message.contains("not assigned"))
}

/// Unassigns addresses and prefixes of both families (one call per family present).
async fn unassign_call<K, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    interface: &str,
    nets: &[IpNet],
) -> Result<(), CloudError> {
    let mut v4 = Ipv4Set::default();
    let mut v6 = Ipv6Set::default();
    for net in nets {
        match net {
            IpNet::V4(n) if n.prefix_len() == 32 => v4.addresses.push(n.addr()),
            IpNet::V4(n) => v4.prefixes.push(*n),
            IpNet::V6(n) if n.prefix_len() == 128 => v6.addresses.push(n.addr()),
            IpNet::V6(n) => v6.prefixes.push(*n),
        }
    }
    if !v4.addresses.is_empty() || !v4.prefixes.is_empty() {
        call(
            &ctx.shared,
            Action::UnassignPrivateIpAddresses,
            ctx.provider.unassign_ipv4(interface, &v4),
        )
        .await?;
    }
    if !v6.addresses.is_empty() || !v6.prefixes.is_empty() {
        call(
            &ctx.shared,
            Action::UnassignIpv6Addresses,
            ctx.provider.unassign_ipv6(interface, &v6),
        )
        .await?;
    }
    Ok(())
}

fn observe(ni: &NetworkInterface, cluster: &str) -> ObservedInterface {
    ObservedInterface {
        managed: ni.tags.get(TAG_CLUSTER).is_some_and(|c| c == cluster),
        id: CloudId::new(&ni.id).unwrap_or_else(|_| CloudId::min()),
        attached_to: ni.attachment.as_ref().and_then(|a| {
            matches!(
                a.status,
                corral_cloud::AttachmentStatus::Attached
                    | corral_cloud::AttachmentStatus::Attaching
            )
            .then(|| (a.instance_id.clone(), a.device_index))
        }),
        addresses: addresses_of(ni),
    }
}

/// The interface an intent is about, as the cloud shows it now: for a create, the one
/// carrying the intent's tag; otherwise the one it names (`None`: not found).
async fn find_intent_interface<K, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    id: &CloudId,
    intent: &CloudIntentRecord,
) -> Result<Option<NetworkInterface>, CloudError> {
    let interface = match &intent.op {
        CloudOp::CreateAttach { .. } => {
            let mut filter = InterfaceFilter::default();
            filter
                .tags
                .insert(TAG_INTENT.to_owned(), Some(id.to_string()));
            let found = call(
                &ctx.shared,
                Action::DescribeNetworkInterfaces,
                ctx.provider.describe_interfaces(&filter),
            )
            .await?;
            return Ok(found.into_iter().next());
        }
        CloudOp::Assign { interface, .. }
        | CloudOp::Unassign { interface, .. }
        | CloudOp::Delete { interface }
        | CloudOp::DelegatePrefix { interface, .. }
        | CloudOp::UndelegatePrefix { interface, .. } => interface,
    };
    match call(
        &ctx.shared,
        Action::DescribeNetworkInterfaces,
        ctx.provider
            .describe_interfaces(&InterfaceFilter::id(interface.as_str())),
    )
    .await
    {
        Ok(found) => Ok(found.into_iter().next()),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(error),
    }
}

/// Replays an intent of no node (a collector's deletion): delete the interface if it is
/// still there and available, then the intent.
async fn replay_orphan<K: Kv, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    id: &CloudId,
    entry: &CloudEntry<CloudIntentRecord>,
    writes: &mut Vec<Write>,
) -> Result<(), String> {
    let key = ctx.keys.cloud_intent(id);
    let mut revision = entry.mod_revision;
    if let Some(
        record @ CloudIntentRecord {
            op: CloudOp::Delete { interface },
            ..
        },
    ) = &entry.record
    {
        // Rewritten fenced first: a deposed leader, or a view behind, makes no call.
        let value = encode_value(record).map_err(|e| e.to_string())?;
        let txn = Txn {
            compares: vec![Compare::modified_at(key.clone(), revision)],
            success: vec![TxnOp::put(key.clone(), value)],
            failure: vec![],
        };
        revision = match fenced_txn(&ctx.kv, &ctx.fence, txn, writes).await {
            Ok(revision) => revision,
            Err(WriteError::Refused) => {
                return Err(format!("intent {id} refused (fenced or changed)"));
            }
            Err(WriteError::Uncertain(error)) => return Err(error.to_string()),
        };
        match call(
            &ctx.shared,
            Action::DeleteNetworkInterface,
            ctx.provider.delete_interface(interface.as_str()),
        )
        .await
        {
            Ok(()) => {}
            Err(error) if error.is_not_found() => {}
            // Attached again (in use): not a leak after all; the intent goes.
            Err(CloudError::InterfaceInUse { .. }) => {}
            Err(error) => return Err(error.to_string()),
        }
    }
    let txn = Txn {
        compares: vec![Compare::modified_at(key.clone(), revision)],
        success: vec![TxnOp::delete(key)],
        failure: vec![],
    };
    // Refused or uncertain: the intent stays and is replayed again.
    let _ = fenced_txn(&ctx.kv, &ctx.fence, txn, writes).await;
    Ok(())
}

struct LeakContext {
    recorded: HashSet<String>,
    intents: HashSet<String>,
    busy: HashSet<String>,
    seen: BTreeMap<CloudId, u64>,
    interval_ms: u64,
    cap: usize,
    base: String,
}

/// One collector run: corral-tagged available interfaces of this cluster, planned by
/// `plan_leak_gc`, each deletion behind an intent.
async fn collect_leaks<K: Kv, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    pool: &PoolName,
    leaks: LeakContext,
    writes: &mut Vec<Write>,
) -> Result<(GcPlan, usize), CloudError> {
    let mut filter = InterfaceFilter::default();
    filter
        .tags
        .insert(TAG_CLUSTER.to_owned(), Some(ctx.cluster.clone()));
    filter.status = Some(InterfaceStatus::Available);
    let found = call(
        &ctx.shared,
        Action::DescribeNetworkInterfaces,
        ctx.provider.describe_interfaces(&filter),
    )
    .await?;
    let candidates: Vec<LeakCandidate> = found
        .iter()
        .filter_map(|ni| {
            let id = CloudId::new(&ni.id).ok()?;
            let named_by_intent = ni
                .tags
                .get(TAG_INTENT)
                .is_some_and(|i| leaks.intents.contains(i));
            let node_busy = ni
                .tags
                .get(TAG_NODE)
                .is_some_and(|n| leaks.busy.contains(n));
            Some(LeakCandidate {
                id,
                tagged: ni.tags.get(TAG_CLUSTER).is_some_and(|c| *c == ctx.cluster),
                available: ni.status == InterfaceStatus::Available && ni.attachment.is_none(),
                created_ms: ni
                    .tags
                    .get(TAG_CREATED_AT)
                    .and_then(|t| t.parse::<u64>().ok()),
                recorded: leaks.recorded.contains(&ni.id) || named_by_intent || node_busy,
            })
        })
        .collect();
    let now = (ctx.clock)();
    let plan = decide::plan_leak_gc(&candidates, &leaks.seen, now, leaks.interval_ms, leaks.cap);
    let mut deleted = 0;
    for (n, interface) in plan.delete.iter().enumerate() {
        let Ok(id) = CloudId::new(&format!("{}-gc{n}", leaks.base)) else {
            continue;
        };
        let key = ctx.keys.cloud_intent(&id);
        let record = CloudIntentRecord {
            node: None,
            pool: pool.clone(),
            instance_id: None,
            op: CloudOp::Delete {
                interface: interface.clone(),
            },
            started_ms: now,
        };
        let Ok(value) = encode_value(&record) else {
            continue;
        };
        let txn = Txn {
            compares: vec![Compare::absent(key.clone())],
            success: vec![TxnOp::put(key.clone(), value)],
            failure: vec![],
        };
        let Ok(revision) = fenced_txn(&ctx.kv, &ctx.fence, txn, writes).await else {
            // Fenced or failed: no call.
            break;
        };
        ctx.shared.note_cloud_intent();
        let result = call(
            &ctx.shared,
            Action::DeleteNetworkInterface,
            ctx.provider.delete_interface(interface.as_str()),
        )
        .await;
        match result {
            Ok(()) => deleted += 1,
            Err(error) if error.is_not_found() => {}
            Err(CloudError::InterfaceInUse { .. }) => {}
            // Perhaps deleted, or not: the intent stays and is replayed.
            Err(_) => continue,
        }
        let txn = Txn {
            compares: vec![Compare::modified_at(key.clone(), revision)],
            success: vec![TxnOp::delete(key)],
            failure: vec![],
        };
        // Refused or uncertain: the intent stays and is replayed.
        let _ = fenced_txn(&ctx.kv, &ctx.fence, txn, writes).await;
    }
    Ok((plan, deleted))
}
