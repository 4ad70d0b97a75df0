//! The agent's part in a cluster (`corral agent --etcd URL --node NAME`): register the node,
//! keep its liveness key on a lease, watch its own grants, and hand them to the host as the
//! `node` scope's cluster ranges (recorded durably before anything is allocated from them).
//!
//! Pod allocations never touch etcd: this task only moves address space. While etcd cannot
//! be reached the agent keeps serving from what it holds and says so in its status
//! (`degraded`, since when); nothing it holds is dropped for want of etcd, only a grant that
//! etcd says is gone (a node removal) drains.

use std::collections::BTreeMap;
use std::sync::{Arc, LockResult, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_cluster::{
    ClusterConfig, ClusterName, DemandRecord, Family, IpNet, Key, Keys, LiveRecord,
    NodeIdOfNodeRecord, NodeIdPlanConfig, NodeName, NodePlan, NodeRecord, ReleaseRecord,
    ReleaseState, decode_value, encode_value,
};
use corral_core::{PoolName, RangeSpec};

use corral_kv::{Compare, Event, Kv, KvError, LeaseId, Revision, Txn, TxnOp};
use tokio::time::Instant;

use crate::blocks::{BlockSignals, demand_records, is_urgent, same_demand};
use crate::cloud_pool::{self, CloudEntry};
use crate::committer::Committer;
use crate::host::{ClusterRanges, Op, Reply, Surrender};

pub mod holdings;

/// How the agent joins a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterOptions {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// The cluster's name (keys under `/corral/<cluster>/v1/`).
    pub cluster: String,
    /// This node's name.
    pub node: String,
    /// This machine's identity: a node name registered under another uid is refused (a
    /// reinstalled machine must be removed first).
    pub uid: String,
    /// The liveness lease's TTL.
    pub lease_ttl: Duration,
    /// How long a change of a block pool's demand that is not urgent (free above the
    /// pre-allocate watermark, no ADD waiting) may wait before it is written (default 1 s:
    /// every change is written within a second, so the leader sees excess as it arises; a
    /// longer time trades write rate for a later release).
    pub demand_refresh: Duration,
    /// The cloud instance this node runs on (`--instance-id`, `CORRAL_INSTANCE_ID`), written
    /// into its registration: the operator manages this instance's interfaces for cloud
    /// pools. On EC2 it is the instance metadata service's `instance-id`; the agent takes it
    /// as a value (it does not query the metadata service itself), so whatever starts it
    /// passes it in. A node registered with another instance ID is refused, as a node
    /// registered under another machine uid is.
    pub instance_id: Option<String>,
    /// The most pods this node runs (`--max-pods`, as the kubelet's), written into its
    /// registration: block and cloud pools never grow its holdings past it.
    pub max_pods: Option<u64>,
    /// Where the agent remembers the highest etcd revision and the cluster ID it saw
    /// (`etcd-epoch` in the state directory, beside `cluster-uid`; `None`: in memory only).
    /// A store that answers from an earlier time (restored, wiped) is then noticed across
    /// restarts of the agent ([`holdings::EpochGuard`]).
    pub epoch_file: Option<std::path::PathBuf>,
}

impl ClusterOptions {
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(20);
    pub const DEFAULT_DEMAND_REFRESH: Duration = Duration::from_secs(1);
    /// At most one demand write per node in this time.
    pub const DEMAND_MIN_INTERVAL: Duration = Duration::from_secs(1);
    /// The local pool a node-ID plan's pod subnet goes to.
    pub const PLAN_POOL: &'static str = "default";
}

/// What the agent shows of its cluster link (`status`, metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterState {
    pub node: String,
    pub registered: bool,
    /// Since when etcd could not be reached (milliseconds since the epoch), if it cannot.
    pub degraded_since_ms: Option<u64>,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// The grants held: pool → ranges.
    pub grants: BTreeMap<String, Vec<String>>,
    pub node_id: Option<u32>,
    /// The instance ID the node registered with.
    pub instance_id: Option<String>,
    /// Cloud records skipped and cloud addresses frozen, one sentence each.
    pub problems: Vec<String>,
    /// Grants the node does not take up (`screen`): asserted in its holdings record, for the
    /// leader to revoke.
    pub refused: Vec<corral_cluster::RefusedGrant>,
    /// A node ID it does not take up, on the same grounds.
    pub refused_node_id: Option<corral_cluster::RefusedNodeId>,
}

/// The cluster link's counters (registered with the agent's metrics).
#[derive(Clone, Debug, Default)]
pub struct ClusterMetrics {
    /// `demand/` writes.
    pub demand_writes: prometheus_client::metrics::counter::Counter,
    /// Release handshakes answered, by outcome (`ready`, `refused`).
    pub handshakes: prometheus_client::metrics::family::Family<
        crate::metrics::Outcome,
        prometheus_client::metrics::counter::Counter,
    >,
    /// Blocks surrendered and not yet released by the cluster.
    pub surrendered: prometheus_client::metrics::gauge::Gauge,
    /// Cloud addresses gone from their interface record while in use (frozen).
    pub cloud_frozen: prometheus_client::metrics::gauge::Gauge,
    /// Cloud interface records the agent could not apply.
    pub cloud_bad_records: prometheus_client::metrics::gauge::Gauge,
    /// Cloud addresses surrendered in a release handshake, not yet off their record.
    pub cloud_surrendered: prometheus_client::metrics::gauge::Gauge,
}

/// Whether the agent may serve yet, as far as the cluster link knows: the agent becomes ready
/// only once the link holds the node's liveness key, or could not get as far as asking (etcd
/// unreachable, the registration refused); while another process may hold the key it waits,
/// and when another live agent holds it the agent stops with this error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Gate {
    #[default]
    Pending,
    Open,
    /// Another live agent serves the node: the agent exits with this message.
    Fatal(String),
}

/// What the cluster task shares with the API: the state it shows, and the block signals.
#[derive(Debug, Default)]
pub struct ClusterShared {
    state: Mutex<ClusterState>,
    /// Set once the node was removed from the cluster: ADDs on its cluster pools are refused
    /// (it takes no new pods while it drains); only a restart of the agent clears it.
    removed: std::sync::atomic::AtomicBool,
    pub blocks: Arc<BlockSignals>,
    pub metrics: ClusterMetrics,
    gate: tokio::sync::watch::Sender<Gate>,
}

impl ClusterShared {
    pub fn new(metrics: ClusterMetrics) -> ClusterShared {
        ClusterShared {
            metrics,
            ..ClusterShared::default()
        }
    }

    /// Whether the node was removed from the cluster (it drains and takes no new pods).
    pub fn is_removed(&self) -> bool {
        self.removed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The state the API shows.
    pub fn lock(&self) -> LockResult<MutexGuard<'_, ClusterState>> {
        self.state.lock()
    }

    /// Lets the agent serve (unless it must stop).
    pub fn open_gate(&self) {
        self.gate.send_if_modified(|gate| {
            let pending = *gate == Gate::Pending;
            if pending {
                *gate = Gate::Open;
            }
            pending
        });
    }

    /// Whether the agent serves (the gate opened).
    pub fn serving(&self) -> bool {
        *self.gate.borrow() == Gate::Open
    }

    /// The agent must stop, with this message.
    pub fn fail(&self, message: String) {
        self.gate.send_replace(Gate::Fatal(message));
    }

    /// etcd could not be reached before the link got going (the binary's connection): the
    /// agent serves what it holds meanwhile, degraded.
    pub fn unreachable(&self, error: &str) {
        update_shared(self, |s| {
            s.last_error = Some(error.to_owned());
            if s.degraded_since_ms.is_none() {
                s.degraded_since_ms = Some(now_ms());
            }
        });
        self.open_gate();
    }

    /// Waits until the agent may serve (`Ok`) or must stop (`Err`, why).
    pub async fn wait_gate(&self) -> Result<(), String> {
        let mut gate = self.gate.subscribe();
        loop {
            match &*gate.borrow_and_update() {
                Gate::Open => return Ok(()),
                Gate::Fatal(message) => return Err(message.clone()),
                Gate::Pending => {}
            }
            if gate.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// Completes once the agent must stop, with why.
    pub async fn wait_fatal(&self) -> String {
        let mut gate = self.gate.subscribe();
        loop {
            if let Gate::Fatal(message) = &*gate.borrow_and_update() {
                return message.clone();
            }
            if gate.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

fn update_shared(state: &ClusterShared, f: impl FnOnce(&mut ClusterState)) {
    let mut guard = state.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard);
}

/// Shared between the cluster task and the API.
pub type SharedClusterState = Arc<ClusterShared>;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn update(state: &SharedClusterState, f: impl FnOnce(&mut ClusterState)) {
    let mut guard = state.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard);
}

/// Why one round of the cluster link ended.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("{0}")]
    Kv(#[from] KvError),
    #[error(
        "node {node} is registered with another machine uid ({found}); remove it first (corral node remove {node})"
    )]
    UidMismatch { node: String, found: String },
    #[error(
        "node {node} is registered with cloud instance {registered}, this agent runs on {ours}; \
         remove it first (corral node remove {node})"
    )]
    InstanceMismatch {
        node: String,
        registered: String,
        ours: String,
    },
    #[error("node {0} was removed from the cluster; restart the agent to register it again")]
    Removed(String),
    /// The registration this process made is gone (or replaced) with no removal recorded for
    /// it: etcd forgot it (restored from a snapshot, wiped) or it was deleted by hand. Not a
    /// removal: the node asserts what it holds and registers again.
    #[error(
        "etcd no longer has node {0}'s registration and no removal was recorded for it (etcd \
         restored from a snapshot or wiped, or the key deleted by hand)"
    )]
    Forgotten(String),
    #[error(
        "node {node} is served by another live agent ({holder}); this agent does not serve the \
         node's cluster ranges: stop the other agent, or give this machine its own node name and \
         state directory (a cloned machine or a copied state directory)"
    )]
    Held { node: String, holder: String },
    #[error("recording the grants in the local store: {0}")]
    Record(String),
    #[error("the agent stopped")]
    Stopped,
}

/// Runs the cluster link until `stop` fires, reconnecting with jittered backoff (1 s doubling
/// to 30 s) after any failure. The agent's gate ([`Gate`]) opens once the first round holds
/// the node's liveness key or ends for another reason; another live agent holding it is fatal
/// for an agent that never held it (it exits), and ends the link of one that did.
pub async fn run<K: Kv>(
    kv: K,
    options: ClusterOptions,
    committer: Committer,
    state: SharedClusterState,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    run_link(kv, options, committer, &state, stop).await;
    // However the link ended, the agent is not kept waiting by it.
    state.open_gate();
}

async fn run_link<K: Kv>(
    kv: K,
    options: ClusterOptions,
    committer: Committer,
    state: &SharedClusterState,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let state = state.clone();
    let (keys, node) = match (
        ClusterName::new(&options.cluster),
        NodeName::new(&options.node),
    ) {
        (Ok(cluster), Ok(node)) => (Keys::new(cluster), node),
        (Err(error), _) | (_, Err(error)) => {
            update(&state, |s| s.last_error = Some(error.to_string()));
            return;
        }
    };
    update(&state, |s| s.node = options.node.clone());
    let mut failures: u32 = 0;
    // The node's assertion of what it holds: published beside the link for the agent's whole
    // life (a removed node keeps asserting while it drains), until `stop`.
    let guard = Arc::new(holdings::EpochGuard::load(options.epoch_file.clone()));
    tokio::spawn(holdings::publish(
        kv.clone(),
        keys.clone(),
        node.clone(),
        options.uid.clone(),
        committer.clone(),
        Arc::clone(&state),
        Arc::clone(&guard),
        stop.clone(),
    ));
    // What outlives a round: the registration this process made or found (a later round
    // that finds it gone or replaced means the node was removed meanwhile), and the last
    // node ID and plan that could be read (one that cannot be read later keeps them).
    let mut across = AcrossRounds {
        epoch: Some(Arc::clone(&guard)),
        identity: crate::liveness::ProcessIdentity::current(),
        ..AcrossRounds::default()
    };
    loop {
        // etcd went back in time (restored, wiped): the holdings are asserted again first,
        // and the registration etcd forgot is made again (not taken for a removal).
        let before = guard.floor();
        if holdings::round_start(&kv, &keys, &node, &committer, &state, &options.uid, &guard).await
        {
            across.registration = None;
        }
        across.seen_before = before.min(guard.floor());
        let outcome = link(
            &kv,
            &keys,
            &node,
            &options,
            &committer,
            &state,
            &mut stop,
            &mut across,
        )
        .await;
        if across.served {
            failures = 0;
            across.served = false;
        }
        match outcome {
            Err(LinkError::Stopped) | Ok(()) => return,
            Err(error @ LinkError::Held { .. }) => {
                // Another live agent serves the node (a cloned machine, a copied state
                // directory): this one serves none of the node's cluster ranges (those it
                // recorded drain: its pods keep their addresses, nothing new is handed out
                // from them, also after a restart, until it holds the liveness itself), and
                // does not fight for the key.
                let message = error.to_string();
                eprintln!("corral agent: cluster: {message}");
                // Said before the ranges drain, so whoever sees them drained sees why.
                update(&state, |s| {
                    s.registered = false;
                    s.grants.clear();
                    s.node_id = None;
                    s.last_error = Some(message.clone());
                });
                if let Err(e) = committer
                    .submit(Op::SetClusterRanges(ClusterRanges::default()))
                    .await
                {
                    update(&state, |s| {
                        s.last_error =
                            Some(format!("{message}; draining its cluster ranges: {e:?}"))
                    });
                }
                if !across.live {
                    state.fail(message);
                }
                return;
            }
            Err(error @ LinkError::Forgotten(_)) => {
                // What the node holds is asserted before it registers again, so nothing it
                // serves is granted around it; then the next round at once.
                eprintln!(
                    "corral agent: cluster: {error}: asserting what the node holds and \
                     registering it again"
                );
                update(&state, |s| s.last_error = Some(error.to_string()));
                across.registration = None;
                if let Err(error) = holdings::assert_now(
                    &kv,
                    &keys,
                    &node,
                    &committer,
                    &state,
                    &options.uid,
                    &guard,
                )
                .await
                {
                    eprintln!("corral agent: cluster: asserting the node's holdings: {error}");
                }
            }
            Err(LinkError::Removed(_)) => {
                // An administrator removed the node while it runs: its grants are gone, so it
                // drains here (pods keep their addresses, nothing new is handed out, ADDs on
                // its cluster pools are refused), and the node does not register again behind
                // the administrator's back: a restart of the agent does. What it still holds
                // waits in etcd until it gives it up (`while_removed`).
                state
                    .removed
                    .store(true, std::sync::atomic::Ordering::Release);
                eprintln!(
                    "corral agent: cluster: node {} was removed from the cluster; its ranges drain; \
                     restart the agent to register it again",
                    options.node
                );
                // Said before the ranges drain, so whoever sees them drained sees why.
                update(&state, |s| {
                    s.registered = false;
                    s.grants.clear();
                    s.node_id = None;
                    s.last_error = Some(format!(
                        "node {} was removed from the cluster; restart the agent to register it again",
                        options.node
                    ));
                });
                if let Err(error) = committer
                    .submit(Op::SetClusterRanges(ClusterRanges::default()))
                    .await
                {
                    update(&state, |s| {
                        s.last_error = Some(format!("draining after the node's removal: {error:?}"))
                    });
                }
                while_removed(
                    &kv,
                    &keys,
                    &node,
                    &options,
                    &committer,
                    &state,
                    &mut stop,
                    across.live_lease.take(),
                    &across.identity,
                )
                .await;
                return;
            }
            Err(error) => {
                eprintln!("corral agent: cluster: {error}");
                // The first round could not get as far as the liveness key: the agent serves
                // what it holds meanwhile.
                state.open_gate();
                let unreachable = matches!(&error, LinkError::Kv(e) if e.is_retryable());
                update(&state, |s| {
                    s.last_error = Some(error.to_string());
                    if unreachable && s.degraded_since_ms.is_none() {
                        s.degraded_since_ms = Some(now_ms());
                    }
                });
                failures = failures.saturating_add(1);
                let seed = u64::from(std::process::id())
                    ^ u64::from(
                        SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.subsec_nanos()),
                    );
                tokio::select! {
                    _ = tokio::time::sleep(backoff(failures, seed)) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// The cluster ranges the node scope still holds (granted or draining), with their pools and
/// allocations; `None` if the host could not answer.
async fn cluster_ranges_held(
    committer: &Committer,
) -> Option<Vec<(String, corral_api::RangeInfo)>> {
    match committer.submit(Op::Pools(Some("node".into()))).await {
        Ok(Reply::Pools(pools)) => Some(
            pools
                .pools
                .into_iter()
                .flat_map(|p| {
                    let name = p.name;
                    p.ranges
                        .into_iter()
                        .filter(|r| r.source == corral_api::RangeSource::Cluster)
                        .map(move |r| (name.clone(), r))
                })
                .collect(),
        ),
        _ => None,
    }
}

/// How often a removed node looks at what it still holds.
const REMOVED_TICK: Duration = Duration::from_secs(1);

/// After the node's removal: the agent stays live (its `live/<node>` key on a lease it keeps
/// alive: a removed node that shows no liveness for the quarantine time is taken for gone)
/// and keeps asserting what it holds until its cluster ranges drained, then revokes its lease
/// and ends. Stops with the agent.
#[allow(clippy::too_many_arguments)]
async fn while_removed<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    options: &ClusterOptions,
    committer: &Committer,
    state: &SharedClusterState,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    mut lease: Option<LeaseId>,
    identity: &crate::liveness::ProcessIdentity,
) {
    let keep_alive_every = (options.lease_ttl / 3)
        .max(Duration::from_millis(200))
        .min(REMOVED_TICK);
    let mut tick = tokio::time::interval(keep_alive_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {
                if let Some(lease) = lease {
                    let _ = kv.lease_revoke(lease).await;
                }
                return;
            }
        }
        // The liveness key: kept alive, or put again on a new lease (etcd was unreachable
        // for longer than the TTL, or the round that found the removal had none).
        let alive = match lease {
            Some(id) => kv.lease_keep_alive(id).await.is_ok(),
            None => false,
        };
        if !alive {
            lease = live_again(kv, keys, node, options.lease_ttl, identity)
                .await
                .ok();
        }
        let Some(held) = cluster_ranges_held(committer).await else {
            continue;
        };
        // What is still held is asserted by the holdings publisher (`holdings.rs`), which
        // runs for the agent's whole life: the leader quarantines a removed range only once
        // that record drops it.
        let pods: u64 = held.iter().map(|(_, r)| r.allocated).sum();
        update(state, |s| {
            s.last_error = Some(format!(
                "node {} was removed from the cluster; it takes no new pods and drains \
                 ({} range(s), {pods} pod address(es) left); restart the agent to register it again",
                options.node,
                held.len()
            ));
        });
        if held.is_empty() {
            eprintln!(
                "corral agent: cluster: node {} drained after its removal: it holds nothing",
                options.node
            );
            if let Some(lease) = lease {
                let _ = kv.lease_revoke(lease).await;
            }
            return;
        }
    }
}

/// Puts `live/<node>` on a new lease of the agent's TTL, only if no key is there (one live
/// agent per node: another process's key, or this one's on a lease it lost track of, is left
/// alone; the next turn tries again once it is gone).
async fn live_again<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    ttl: Duration,
    identity: &crate::liveness::ProcessIdentity,
) -> Result<LeaseId, KvError> {
    let lease = kv.lease_grant(ttl).await?;
    let live = identity.record(now_ms(), ttl);
    let key = keys.live(node);
    let response = kv
        .txn(Txn {
            compares: vec![Compare::absent(key.as_str())],
            success: vec![TxnOp::put_on_lease(
                key.as_str(),
                encode_value(&live).unwrap_or_default(),
                lease,
            )],
            failure: vec![],
        })
        .await;
    match response {
        Ok(response) if response.succeeded => Ok(lease),
        Ok(_) => {
            let _ = kv.lease_revoke(lease).await;
            Err(KvError::Unavailable(format!(
                "{key} is held by another lease"
            )))
        }
        Err(error) => {
            let _ = kv.lease_revoke(lease).await;
            Err(error)
        }
    }
}

/// The wait before the next round after `failures` failed rounds in a row: 1 s doubling to
/// 30 s, with up to a quarter of jitter (`seed`, any number) so that agents cut off together
/// do not come back together: added below the cap, taken off at it.
pub fn backoff(failures: u32, seed: u64) -> Duration {
    const CAP_MS: u64 = 30_000;
    let base = (1_000u64 << failures.saturating_sub(1).min(5)).min(CAP_MS);
    let jitter = seed % (base / 4).max(1);
    Duration::from_millis(if base < CAP_MS {
        base + jitter
    } else {
        base - jitter
    })
}

/// What the link keeps from one round to the next.
#[derive(Default)]
struct AcrossRounds {
    /// The create revision of the registration this process made or found.
    registration: Option<Revision>,
    /// The node ID and plan last read.
    node_id: Option<u32>,
    /// The create revision of the node ID's grant (with `node_id`).
    node_id_revision: Revision,
    plan: Option<NodeIdPlanConfig>,
    config: Option<Arc<ClusterConfig>>,
    /// Whether the round got as far as serving (its backoff then starts again).
    served: bool,
    /// Whether this process ever held the node's liveness key.
    live: bool,
    /// This process, as its liveness key names it.
    identity: crate::liveness::ProcessIdentity,
    /// The liveness lease of the round that found the node removed: the drain keeps it.
    live_lease: Option<LeaseId>,
    /// The agent's memory of etcd's time (`holdings.rs`), fed the revisions the link reads.
    epoch: Option<Arc<holdings::EpochGuard>>,
    /// The highest revision the agent had seen before this round reached etcd (the one a
    /// regression showed, if lower), raised to the `reassert` key's mod revision when the
    /// round reads one: a grant made at or before it that the node does not hold is one it
    /// gave up, or one etcd may have handed back after another node got its space (`screen`).
    seen_before: Revision,
    /// Grants this process took up (`owned/` key, create revision): taken up again whatever
    /// the host holds now.
    accepted: std::collections::BTreeSet<(String, Revision)>,
}

/// One connected round: register, go live, read and watch the grants.
#[allow(clippy::too_many_arguments)]
async fn link<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    options: &ClusterOptions,
    committer: &Committer,
    state: &SharedClusterState,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    across: &mut AcrossRounds,
) -> Result<(), LinkError> {
    let registration = register(kv, keys, node, options, across.registration).await?;
    across.registration = Some(registration);
    let lease = kv.lease_grant(options.lease_ttl).await?;
    // The liveness key is created only if no other process holds it (liveness.rs): a second
    // agent under the node's name is refused, naming the holder.
    let live_key = keys.live(node);
    let live: LiveRecord = across.identity.record(now_ms(), options.lease_ttl);
    let report = |message: &str| update(state, |s| s.last_error = Some(message.to_owned()));
    let mut claimed = crate::liveness::claim(
        kv,
        &live_key,
        &live,
        lease,
        &across.identity,
        options.lease_ttl,
        stop,
        state.serving(),
        report,
    )
    .await;
    if let Err(crate::liveness::ClaimError::MustWait(message)) = &claimed {
        // Serving already (a later round, or started while etcd was unreachable): the node's
        // ranges drain while the holder is waited for, so two never serve them; the grants
        // come back with the key.
        report(message);
        let drained = committer
            .submit(Op::SetClusterRanges(ClusterRanges::default()))
            .await;
        if let Err(error) = drained {
            eprintln!("corral agent: cluster: draining the node's ranges: {error:?}");
        }
        update(state, |s| {
            s.registered = false;
            s.grants.clear();
        });
        claimed = crate::liveness::claim(
            kv,
            &live_key,
            &live,
            lease,
            &across.identity,
            options.lease_ttl,
            stop,
            false,
            report,
        )
        .await;
    }
    let claimed = match claimed {
        Ok(claimed) => claimed,
        Err(error) => {
            let _ = kv.lease_revoke(lease).await;
            return Err(match error {
                crate::liveness::ClaimError::Held(holder) => LinkError::Held {
                    node: options.node.clone(),
                    holder,
                },
                crate::liveness::ClaimError::Kv(error) => LinkError::Kv(error),
                crate::liveness::ClaimError::Stopped => LinkError::Stopped,
                crate::liveness::ClaimError::MustWait(message) => {
                    LinkError::Kv(KvError::Unavailable(message))
                }
            });
        }
    };
    across.live = true;
    state.open_gate();
    let result = tokio::select! {
        result = follow(
            kv,
            keys,
            node,
            options,
            committer,
            state,
            stop,
            registration,
            lease,
            across,
        ) => result,
        // Another process took the key (after this one's lease lapsed, or overwriting it):
        // the round ends, and the node's ranges are not served by two.
        lost = crate::liveness::guard(kv, &live_key, &live, lease, claimed) => Err(match lost {
            crate::liveness::Lost::Taken(holder) => LinkError::Held {
                node: options.node.clone(),
                holder,
            },
            crate::liveness::Lost::Kv(error) => LinkError::Kv(error),
        }),
    };
    if matches!(result, Err(LinkError::Stopped)) {
        // A clean stop says so at once; a crash leaves the key to its lease. Revoking the
        // lease deletes only what is on it: the key this process created (never another
        // agent's, which is on that agent's lease).
        let _ = kv.lease_revoke(lease).await;
    }
    if matches!(result, Err(LinkError::Removed(_))) {
        // The node stays live while it drains (`while_removed`).
        across.live_lease = Some(lease);
    }
    result
}

/// Creates the node's registration if absent, else checks it is this machine's. Answers the
/// registration's create revision. Once this process registered (`known`), only that
/// registration will do: gone or replaced means the node was removed while the link was
/// down, and only a restart of the agent registers it again.
async fn register<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    options: &ClusterOptions,
    known: Option<Revision>,
) -> Result<Revision, LinkError> {
    let node_key = keys.node(node);
    let node_key = node_key.as_str();
    loop {
        let existing = kv.get(node_key.as_bytes()).await?;
        if let Some(known) = known
            && existing.as_ref().is_none_or(|e| e.create_revision != known)
        {
            return Err(gone_why(kv, keys, node, known, None).await?);
        }
        if let Some(existing) = existing {
            let record: Option<NodeRecord> = decode_value(&existing.value).ok();
            return match record {
                Some(record) if record.uid == options.uid => {
                    match (&record.instance_id, &options.instance_id) {
                        (Some(registered), Some(ours)) if registered != ours => {
                            Err(LinkError::InstanceMismatch {
                                node: options.node.clone(),
                                registered: registered.clone(),
                                ours: ours.clone(),
                            })
                        }
                        (registered, ours)
                            if (registered.is_none() && ours.is_some())
                                || record.max_pods != options.max_pods =>
                        {
                            // Registered before it knew its instance (an older agent), or with
                            // another pod cap (`--max-pods` changed): the record is brought up
                            // to date, the registration (create revision) kept.
                            let updated = NodeRecord {
                                instance_id: ours.clone().or(record.instance_id.clone()),
                                max_pods: options.max_pods,
                                ..record
                            };
                            let response = kv
                                .txn(Txn {
                                    compares: vec![Compare::modified_at(
                                        node_key,
                                        existing.mod_revision,
                                    )],
                                    success: vec![TxnOp::put(
                                        node_key,
                                        encode_value(&updated).unwrap_or_default(),
                                    )],
                                    failure: vec![],
                                })
                                .await?;
                            if !response.succeeded {
                                continue;
                            }
                            Ok(existing.create_revision)
                        }
                        _ => Ok(existing.create_revision),
                    }
                }
                Some(record) => Err(LinkError::UidMismatch {
                    node: options.node.clone(),
                    found: record.uid,
                }),
                None => Err(LinkError::UidMismatch {
                    node: options.node.clone(),
                    found: "an unreadable record".into(),
                }),
            };
        }
        let record = NodeRecord {
            uid: options.uid.clone(),
            addresses: Vec::new(),
            registered_ms: now_ms(),
            instance_id: options.instance_id.clone(),
            max_pods: options.max_pods,
        };
        let response = kv
            .txn(Txn {
                compares: vec![Compare::absent(node_key)],
                success: vec![TxnOp::put(
                    node_key,
                    encode_value(&record).unwrap_or_default(),
                )],
                failure: vec![],
            })
            .await?;
        if response.succeeded {
            eprintln!("corral agent: cluster: registered node {}", options.node);
            return Ok(response.revision);
        }
        // Someone registered it meanwhile (a previous attempt of ours that timed out): look
        // again.
    }
}

/// Why the registration this process made (create revision `known`) is gone or replaced, as
/// etcd says at `at` (the revision the change was seen at; the latest if `None` or compacted):
/// a removal records itself (`removals/<node>` naming that registration, put before the
/// registration is deleted and kept while the node still holds anything), so without one
/// etcd forgot it ([`LinkError::Forgotten`]).
async fn gone_why<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    known: Revision,
    at: Option<Revision>,
) -> Result<LinkError, KvError> {
    let key = keys.removal(node);
    let page = match kv.range(key.as_bytes(), None, 2, at).await {
        Err(KvError::Compacted { .. }) if at.is_some() => {
            kv.range(key.as_bytes(), None, 2, None).await?
        }
        page => page?,
    };
    let removed = page
        .kvs
        .iter()
        .find(|e| e.key == key.as_bytes())
        .is_some_and(|e| {
            // One that cannot be read is taken at its word: the node drains.
            decode_value::<corral_cluster::RemovalRecord>(&e.value)
                .map_or(true, |r| r.node_revision == known)
        });
    Ok(if removed {
        LinkError::Removed(node.to_string())
    } else {
        LinkError::Forgotten(node.to_string())
    })
}

/// One grant of the node, as read from `owned/<node>/...`.
#[derive(Clone, Debug)]
struct Grant {
    pool: PoolName,
    family: Family,
    cidr: IpNet,
    /// The create revision of the `owned/` key, which the grant txn created with `grants/`.
    revision: Revision,
}

/// One release handshake of the node, as read from `release/<node>/...`.
#[derive(Clone, Debug)]
struct Release {
    pool: PoolName,
    family: Family,
    cidr: IpNet,
    /// `None`: a value that cannot be read (answered as refused).
    record: Option<ReleaseRecord>,
    mod_revision: Revision,
}

/// What the node holds in the cluster, as read from etcd.
#[derive(Default)]
struct Held {
    /// `owned/` key → grant.
    grants: BTreeMap<String, Grant>,
    /// `release/` key → handshake.
    releases: BTreeMap<String, Release>,
    /// `interfaces/<node>/` records, by interface ID.
    cloud: BTreeMap<String, CloudEntry>,
    node_id: Option<u32>,
    plan: Option<NodeIdPlanConfig>,
    config: Option<Arc<ClusterConfig>>,
    /// Whether `config-applied` (the configuration the leader installed) was read: it is
    /// followed from then on, and `config` (what someone stored, maybe refused) no more.
    applied: bool,
    /// Grants not taken up (`screen`), by `owned/` key: not served.
    refused: BTreeMap<String, corral_cluster::RefusedGrant>,
    /// The create revision of `node-id-of-node/<node>` (with `node_id`).
    node_id_revision: Revision,
    /// The node ID not taken up (`screen`): its plan is not served.
    refused_node_id: Option<corral_cluster::RefusedNodeId>,
}

impl Held {
    fn apply(
        &mut self,
        keys: &Keys,
        node: &NodeName,
        key: &str,
        value: Option<&corral_kv::KeyValue>,
    ) {
        match keys.parse(key) {
            Ok(Key::Owned {
                node: owner,
                pool,
                family,
                cidr,
            }) if &owner == node => match value {
                Some(entry) => {
                    self.grants.insert(
                        key.to_owned(),
                        Grant {
                            pool,
                            family,
                            cidr,
                            revision: entry.create_revision,
                        },
                    );
                }
                None => {
                    self.grants.remove(key);
                }
            },
            Ok(Key::Release {
                node: owner,
                pool,
                family,
                cidr,
            }) if &owner == node => match value {
                Some(entry) => {
                    let record = match decode_value::<ReleaseRecord>(&entry.value) {
                        Ok(record) => Some(record),
                        Err(error) => {
                            eprintln!("corral agent: cluster: {key}: {error}");
                            None
                        }
                    };
                    self.releases.insert(
                        key.to_owned(),
                        Release {
                            pool,
                            family,
                            cidr,
                            record,
                            mod_revision: entry.mod_revision,
                        },
                    );
                }
                None => {
                    self.releases.remove(key);
                }
            },
            Ok(Key::CloudInterface {
                node: owner,
                interface,
            }) if &owner == node => match value {
                Some(entry) => {
                    let record = decode_value::<corral_cluster::CloudInterfaceRecord>(&entry.value)
                        .map_err(|e| e.to_string());
                    if let Err(error) = &record {
                        eprintln!("corral agent: cluster: {key}: {error}");
                    }
                    self.cloud.insert(
                        interface.as_str().to_owned(),
                        CloudEntry {
                            record,
                            create_revision: entry.create_revision,
                        },
                    );
                }
                None => {
                    self.cloud.remove(interface.as_str());
                }
            },
            Ok(Key::NodeIdOfNode { node: owner }) if &owner == node => match value {
                None => self.node_id = None,
                Some(v) => match decode_value::<NodeIdOfNodeRecord>(&v.value) {
                    Ok(record) => {
                        self.node_id = Some(record.id);
                        self.node_id_revision = v.create_revision;
                    }
                    // Unreadable: what was held stays (its pod range is not dropped for it).
                    Err(error) => eprintln!("corral agent: cluster: {key}: {error}"),
                },
            },
            Ok(Key::ConfigApplied) => match value
                .map(|v| decode_value::<corral_cluster::AppliedConfigRecord>(&v.value))
            {
                Some(Ok(record)) if record.config.validate().is_ok() => {
                    self.applied = true;
                    self.plan = record.config.node_ids.clone();
                    self.config = Some(Arc::new(record.config));
                }
                Some(Ok(_)) => eprintln!("corral agent: cluster: {key}: not a valid configuration"),
                // Unreadable or deleted: what was held stays.
                Some(Err(error)) => eprintln!("corral agent: cluster: {key}: {error}"),
                None => {}
            },
            // Before the leader installed one (a new cluster), the stored configuration; once
            // `config-applied` exists, a configuration written around the CLI that the leader
            // refused never moves this node's plan.
            Ok(Key::Config) if self.applied => {}
            Ok(Key::Config) => match value.map(|v| ClusterConfig::from_json(&v.value)) {
                Some(Ok(config)) => {
                    self.plan = config.node_ids.clone();
                    self.config = Some(Arc::new(config));
                }
                // A configuration this build cannot read changes nothing held.
                Some(Err(error)) => eprintln!("corral agent: cluster: {key}: {error}"),
                None => {}
            },
            _ => {}
        }
    }

    fn is_cloud_pool(&self, pool: &PoolName) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.pool(pool))
            .is_some_and(|p| p.is_cloud())
    }

    fn is_block_pool(&self, pool: &PoolName) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.pool(pool))
            .is_some_and(|p| p.is_blocks())
    }

    /// The range the agent serves from a grant: a block pool's whole block, else the node
    /// CIDR with its gateway.
    fn range_of(&self, grant: &Grant) -> Result<RangeSpec, corral_core::SpecError> {
        if self.is_block_pool(&grant.pool) {
            corral_cluster::block_range(grant.cidr)
        } else {
            corral_cluster::node_range(grant.cidr)
        }
    }

    /// The ranges the node's pools must hold.
    fn ranges(&self) -> Vec<(PoolName, RangeSpec)> {
        let mut ranges: Vec<(PoolName, RangeSpec)> = Vec::new();
        for (key, grant) in &self.grants {
            if self.refused.contains_key(key) {
                continue;
            }
            match self.range_of(grant) {
                Ok(range) => ranges.push((grant.pool.clone(), range)),
                Err(error) => eprintln!("corral agent: cluster: ignoring grant {key}: {error}"),
            }
        }
        if let (Some(id), Some(plan)) = (self.node_id, &self.plan)
            && self.refused_node_id.is_none()
            && let Ok(derived) = NodePlan::derive(plan, id)
            && let Ok(range) = derived.pod_range()
            && let Ok(pool) = PoolName::new(ClusterOptions::PLAN_POOL)
        {
            ranges.push((pool, range));
        }
        ranges
    }

    /// The families of each block pool of the configuration.
    fn block_families(&self) -> BTreeMap<PoolName, Vec<Family>> {
        self.config
            .iter()
            .flat_map(|c| &c.pools)
            .filter(|p| p.is_blocks())
            .map(|p| (p.name.clone(), p.families().map(|(f, _)| f).collect()))
            .collect()
    }

    /// The grant of `pool` whose served range is `range`.
    fn grant_of(&self, pool: &PoolName, range: &RangeSpec) -> Option<(&String, &Grant)> {
        self.grants.iter().find(|(_, g)| {
            &g.pool == pool
                && self
                    .range_of(g)
                    .is_ok_and(|r| r.start() == range.start() && r.end() == range.end())
        })
    }
}

#[allow(clippy::too_many_arguments)]
async fn follow<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    options: &ClusterOptions,
    committer: &Committer,
    state: &SharedClusterState,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    registration: Revision,
    lease: LeaseId,
    across: &mut AcrossRounds,
) -> Result<(), LinkError> {
    let owned_prefix = keys.owned_prefix(node);
    let release_prefix = keys.release_of_node_prefix(node);
    let id_key = keys.node_id_of_node(node);
    let config_key = keys.config();
    let node_key = keys.node(node);
    let mut held = Held {
        node_id: across.node_id,
        node_id_revision: across.node_id_revision,
        plan: across.plan.clone(),
        config: across.config.clone(),
        ..Held::default()
    };
    let (owned, revision) = corral_kv::read_all(kv, owned_prefix.as_bytes(), 1000).await?;
    if let Some(guard) = &across.epoch {
        // Only advances: the link's reads and the publisher's answers interleave.
        guard.observe_revision(0, revision);
    }
    for entry in &owned {
        held.apply(keys, node, &entry.key_str(), Some(entry));
    }
    // The registration, the node ID and the configuration at the same revision as the
    // grants, so the watches below miss nothing: a removal that landed since `register`
    // read the registration is seen here.
    let reassert_key = keys.reassert();
    for key in [&node_key, &id_key, &config_key, &reassert_key] {
        if key == &reassert_key {
            // A leader that saw etcd go back in time put it: a grant made before it may be
            // one etcd handed back after its space went to another node, which an agent
            // that was away (its own memory of etcd's time older than the grant) cannot
            // tell from a grant made while it was away. Such grants are refused unless the
            // host holds their space; the leader revokes them and grants anew.
            let page = kv.range(key.as_bytes(), None, 1, Some(revision)).await?;
            if let Some(entry) = page.kvs.iter().find(|e| e.key == key.as_bytes()) {
                across.seen_before = across.seen_before.max(entry.mod_revision);
            }
            continue;
        }
        if key == &config_key {
            // `config` and `config-applied` (one prefix; `config-applied` applied first, so
            // the stored `config` is followed only while there is none).
            let page = kv.range(key.as_bytes(), None, 2, Some(revision)).await?;
            for entry in page.kvs.iter().rev() {
                held.apply(keys, node, &entry.key_str(), Some(entry));
            }
            continue;
        }
        let page = kv.range(key.as_bytes(), None, 1, Some(revision)).await?;
        let entry = page.kvs.into_iter().find(|e| e.key == key.as_bytes());
        if key == &node_key {
            if entry.is_none_or(|e| e.create_revision != registration) {
                return Err(gone_why(kv, keys, node, registration, Some(revision)).await?);
            }
            continue;
        }
        match entry {
            Some(entry) => held.apply(keys, node, key, Some(&entry)),
            None if key == &id_key => held.node_id = None,
            None => {}
        }
    }
    let (releases, release_revision) =
        corral_kv::read_all(kv, release_prefix.as_bytes(), 1000).await?;
    for entry in &releases {
        held.apply(keys, node, &entry.key_str(), Some(entry));
    }
    // The node's cloud interface records, read at one revision and watched from the next
    // (a compaction breaks the watch, and the next round reads them all again).
    let cloud_prefix = keys.cloud_interfaces_of_node_prefix(node);
    let (clouds, cloud_revision) = corral_kv::read_all(kv, cloud_prefix.as_bytes(), 1000).await?;
    for entry in &clouds {
        held.apply(keys, node, &entry.key_str(), Some(entry));
    }
    // What the host holds before this round hands it anything.
    let local = held_locally(committer).await?;
    screen(&mut held, across, &local);
    apply(committer, state, &held).await?;
    let mut frozen = apply_cloud(kv, keys, node, options, committer, state, &held).await?;
    across.node_id = held.node_id;
    across.node_id_revision = held.node_id_revision;
    across.plan = held.plan.clone();
    across.config = held.config.clone();
    across.served = true;
    update(state, |s| {
        s.registered = true;
        s.instance_id = options.instance_id.clone();
        s.degraded_since_ms = None;
        s.last_error = None;
    });
    // The local store is reconciled with the grants: the handshakes, then the first demand.
    handshake(kv, keys, node, committer, state, &mut held).await?;
    let mut demand = DemandWriter::new(options);
    let mut grants = kv.watch(owned_prefix.as_bytes(), revision + 1).await?;
    let mut ids = kv.watch(id_key.as_bytes(), revision + 1).await?;
    let mut config = kv.watch(config_key.as_bytes(), revision + 1).await?;
    let mut registrations = kv.watch(node_key.as_bytes(), revision + 1).await?;
    let mut release_watch = kv
        .watch(release_prefix.as_bytes(), release_revision + 1)
        .await?;
    let mut cloud_watch = kv
        .watch(cloud_prefix.as_bytes(), cloud_revision + 1)
        .await?;
    // While an address is frozen, the records are applied again every few seconds: it leaves
    // once its pods and its cooldown are gone.
    let mut cloud_tick = tokio::time::interval(CLOUD_FROZEN_RECHECK);
    cloud_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let keep_alive_every = (options.lease_ttl / 3).max(Duration::from_millis(200));
    let mut keep_alive = tokio::time::interval(keep_alive_every);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let signals = Arc::clone(&state.blocks);
    loop {
        let due = demand.due;
        let events = tokio::select! {
            batch = grants.next() => batch?,
            batch = ids.next() => batch?,
            batch = config.next() => batch?,
            batch = release_watch.next() => batch?,
            batch = cloud_watch.next() => batch?,
            _ = cloud_tick.tick(), if frozen => {
                frozen = apply_cloud(kv, keys, node, options, committer, state, &held).await?;
                demand.touched(Instant::now());
                continue;
            }
            batch = registrations.next() => {
                let batch = batch?;
                for event in &batch {
                    let gone = match event {
                        Event::Delete { key, mod_revision } => {
                            (key == node_key.as_bytes()).then_some(*mod_revision)
                        }
                        Event::Put(entry) => (entry.key == node_key.as_bytes()
                            && entry.create_revision != registration)
                            .then_some(entry.mod_revision),
                    };
                    if let Some(at) = gone {
                        update(state, |s| s.registered = false);
                        return Err(gone_why(kv, keys, node, registration, Some(at)).await?);
                    }
                }
                continue;
            }
            _ = keep_alive.tick() => {
                kv.lease_keep_alive(lease).await?;
                continue;
            }
            () = signals.touched() => {
                demand.touched(Instant::now());
                continue;
            }
            () = sleep_until_due(due) => {
                demand.publish(kv, keys, node, committer, state, &held).await?;
                continue;
            }
            _ = stop.changed() => return Err(LinkError::Stopped),
        };
        for event in &events {
            let key = String::from_utf8_lossy(event.key()).into_owned();
            match event {
                Event::Put(entry) => held.apply(keys, node, &key, Some(entry)),
                Event::Delete { .. } => held.apply(keys, node, &key, None),
            }
        }
        screen(&mut held, across, &local);
        apply(committer, state, &held).await?;
        frozen = apply_cloud(kv, keys, node, options, committer, state, &held).await?;
        handshake(kv, keys, node, committer, state, &mut held).await?;
        across.node_id = held.node_id;
        across.node_id_revision = held.node_id_revision;
        across.plan = held.plan.clone();
        across.config = held.config.clone();
        demand.touched(Instant::now());
    }
}

/// How often the cloud records are applied again while an address is frozen.
const CLOUD_FROZEN_RECHECK: Duration = Duration::from_secs(5);

/// Makes the cloud pools' interfaces match the node's `interfaces/` records (`host/cloud.rs`),
/// after judging each surrendered address: kept out while its handshake is open (`marked` or
/// `ready`); taken back (served again) when the handshake is gone while a record still lists
/// it, judged on the record and the release key read at one revision (the leader takes an
/// address off its record no later than it deletes the release key, and the two watches may
/// deliver those apart); forgotten when no record lists it. Answers whether an address is
/// frozen (gone from its record while in use). A failure to record ends the round.
async fn apply_cloud<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    options: &ClusterOptions,
    committer: &Committer,
    state: &SharedClusterState,
    held: &Held,
) -> Result<bool, LinkError> {
    let Some(config) = held.config.as_ref() else {
        return Ok(false);
    };
    if !config.pools.iter().any(|p| p.is_cloud()) {
        update(state, |s| s.problems.clear());
        return Ok(false);
    }
    let report = match committer.submit(Op::CloudReport).await {
        Ok(Reply::Cloud(report)) => report,
        other => {
            return Err(LinkError::Record(format!(
                "reading the cloud pools: {other:?}"
            )));
        }
    };
    let open = |r: Option<&ReleaseRecord>| {
        r.is_some_and(|r| matches!(r.state, ReleaseState::Marked | ReleaseState::Ready))
    };
    let mut keep = std::collections::BTreeSet::new();
    for (pool, address) in &report.surrendered {
        let family = Family::of(address.addr());
        let release_key = keys.release(node, pool, family, address);
        if open(
            held.releases
                .get(&release_key)
                .and_then(|r| r.record.as_ref()),
        ) {
            keep.insert((pool.clone(), *address));
            continue;
        }
        let Some((interface, _)) = cloud_pool::record_listing(&held.cloud, pool, address) else {
            // On no record: nothing to take back (the marker goes).
            continue;
        };
        let Ok(id) = corral_cluster::CloudId::new(interface) else {
            keep.insert((pool.clone(), *address));
            continue;
        };
        let record_key = keys.cloud_interface(node, &id);
        let response = kv
            .txn(Txn {
                compares: vec![],
                success: vec![
                    TxnOp::get(record_key.as_str()),
                    TxnOp::get(release_key.as_str()),
                ],
                failure: vec![],
            })
            .await?;
        let listed_now = response
            .gets
            .first()
            .cloned()
            .flatten()
            .and_then(|e| decode_value::<corral_cluster::CloudInterfaceRecord>(&e.value).ok())
            .is_some_and(|r| {
                &r.pool == pool
                    && r.attachment == corral_cluster::CloudAttachment::Attached
                    && r.addresses.contains(address)
            });
        let release_open = response
            .gets
            .get(1)
            .cloned()
            .flatten()
            .is_some_and(|e| open(decode_value::<ReleaseRecord>(&e.value).ok().as_ref()));
        if listed_now && !release_open {
            eprintln!(
                "corral agent: cluster: {address} of pool {pool} taken back (its release was withdrawn)"
            );
        } else {
            keep.insert((pool.clone(), *address));
        }
    }
    let (wanted, errors) =
        cloud_pool::wanted(config, &held.cloud, options.instance_id.as_deref(), keep);
    let outcome = match committer.submit(Op::SetCloudInterfaces(wanted)).await {
        Ok(Reply::CloudInterfaces(outcome)) => outcome,
        Ok(other) => return Err(LinkError::Record(format!("unexpected answer {other:?}"))),
        Err(error) => return Err(LinkError::Record(format!("{error:?}"))),
    };
    let mut problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
    problems.extend(outcome.problems.iter().cloned());
    // Logged when they first show (they are applied again on every change).
    let before = state
        .lock()
        .map(|s| s.problems.clone())
        .unwrap_or_else(|e| e.into_inner().problems.clone());
    for problem in problems.iter().filter(|p| !before.contains(p)) {
        eprintln!("corral agent: cluster: {problem}");
    }
    state
        .metrics
        .cloud_frozen
        .set(i64::try_from(outcome.frozen.len()).unwrap_or(i64::MAX));
    state
        .metrics
        .cloud_bad_records
        .set(i64::try_from(errors.len()).unwrap_or(i64::MAX));
    let surrendered = report
        .surrendered
        .len()
        .saturating_sub(outcome.reclaimed.len());
    state
        .metrics
        .cloud_surrendered
        .set(i64::try_from(surrendered).unwrap_or(i64::MAX));
    update(state, |s| s.problems = problems);
    if outcome.changed() {
        state.blocks.ranges_changed();
    }
    Ok(!outcome.frozen.is_empty())
}

async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// When and what the demand of the node's block pools is written (`demand/<node>/<pool>`):
/// at most once per [`ClusterOptions::DEMAND_MIN_INTERVAL`], only what changed (`at_ms`
/// aside), as soon as allowed when urgent ([`is_urgent`]), else within `demand_refresh`.
struct DemandWriter {
    refresh: Duration,
    /// What this round wrote (each round writes its first demand once reconciled).
    written: BTreeMap<PoolName, DemandRecord>,
    last_write: Option<Instant>,
    last_look: Option<Instant>,
    /// When to look next; `None`: when something changes.
    due: Option<Instant>,
}

impl DemandWriter {
    fn new(options: &ClusterOptions) -> DemandWriter {
        DemandWriter {
            refresh: options.demand_refresh,
            written: BTreeMap::new(),
            last_write: None,
            last_look: None,
            // The first look at once: the local store is reconciled.
            due: Some(Instant::now()),
        }
    }

    /// Something changed: look again as soon as allowed.
    fn touched(&mut self, now: Instant) {
        let allowed = self
            .last_look
            .map_or(now, |t| t + ClusterOptions::DEMAND_MIN_INTERVAL)
            .max(now);
        self.due = Some(self.due.map_or(allowed, |due| due.min(allowed)));
    }

    #[allow(clippy::too_many_arguments)]
    async fn publish<K: Kv>(
        &mut self,
        kv: &K,
        keys: &Keys,
        node: &NodeName,
        committer: &Committer,
        state: &SharedClusterState,
        held: &Held,
    ) -> Result<(), LinkError> {
        let now = Instant::now();
        self.due = None;
        self.last_look = Some(now);
        let Some(config) = held.config.as_ref() else {
            return Ok(());
        };
        let blocks = config.pools.iter().any(|p| p.is_blocks());
        let clouds = config.pools.iter().any(|p| p.is_cloud());
        if !blocks && !clouds {
            return Ok(());
        }
        let mut block_report = None;
        if blocks {
            let report = match committer.submit(Op::BlockReport).await {
                Ok(Reply::Blocks(report)) => report,
                other => {
                    eprintln!("corral agent: cluster: reading the pools for the demand: {other:?}");
                    self.due = Some(now + ClusterOptions::DEMAND_MIN_INTERVAL);
                    return Ok(());
                }
            };
            state
                .metrics
                .surrendered
                .set(i64::try_from(report.surrendered.len()).unwrap_or(i64::MAX));
            block_report = Some(report);
        }
        let mut cloud_report = None;
        if clouds {
            let report = match committer.submit(Op::CloudReport).await {
                Ok(Reply::Cloud(report)) => report,
                other => {
                    eprintln!(
                        "corral agent: cluster: reading the cloud pools for the demand: {other:?}"
                    );
                    self.due = Some(now + ClusterOptions::DEMAND_MIN_INTERVAL);
                    return Ok(());
                }
            };
            cloud_report = Some(report);
        }
        // As ever: the urgency taken, then the waiting ADDs read, after the pools were.
        let urgent_add = state.blocks.take_urgent();
        let pending = state.blocks.pending();
        let mut records = block_report
            .map(|report| demand_records(config, &report, &pending))
            .unwrap_or_default();
        if let Some(report) = cloud_report {
            records.extend(cloud_pool::demand_records(config, &report, &pending));
        }
        let mut changed = Vec::new();
        let mut urgent = urgent_add;
        for (pool, record) in &records {
            let written = self.written.get(pool);
            if written.is_some_and(|w| same_demand(w, record)) {
                continue;
            }
            urgent |= is_urgent(config, node.as_str(), pool, record, written);
            changed.push(pool.clone());
        }
        if changed.is_empty() {
            return Ok(());
        }
        let refresh_at = self.last_write.map_or(now, |t| t + self.refresh);
        if !urgent && now < refresh_at {
            // Not urgent: it goes with the periodic refresh (or sooner, if something urgent
            // comes up meanwhile).
            self.due = Some(refresh_at);
            return Ok(());
        }
        let at_ms = now_ms();
        let mut puts = Vec::new();
        for pool in &changed {
            let record = DemandRecord {
                at_ms,
                ..records[pool].clone()
            };
            puts.push(TxnOp::put(
                keys.demand(node, pool),
                encode_value(&record).unwrap_or_default(),
            ));
        }
        for chunk in puts.chunks(corral_kv::MAX_TXN_OPS) {
            kv.txn(Txn {
                compares: vec![],
                success: chunk.to_vec(),
                failure: vec![],
            })
            .await?;
        }
        state.metrics.demand_writes.inc();
        self.last_write = Some(now);
        for pool in changed {
            let record = records[&pool].clone();
            self.written.insert(pool, record);
        }
        Ok(())
    }
}

/// The release handshakes of the node (ARCHITECTURE.md, "Block mode"): answers each
/// `marked` key, and reconciles the surrendered blocks with the keys and grants. Runs only
/// while etcd answers (a degraded link answers nothing).
async fn handshake<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    committer: &Committer,
    state: &SharedClusterState,
    held: &mut Held,
) -> Result<(), LinkError> {
    // A few passes: a lost compare-and-swap reads the key again and answers what it says now.
    for _ in 0..4 {
        let marked: Vec<(String, Release)> = held
            .releases
            .iter()
            .filter(|(_, r)| {
                r.record
                    .as_ref()
                    .is_none_or(|r| r.state == ReleaseState::Marked)
            })
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        if marked.is_empty() {
            break;
        }
        let mut lost = false;
        for (key, release) in marked {
            let answer = answer_for(committer, held, &release).await?;
            let Some(record) = release.record.clone() else {
                // Unreadable: nothing to answer in (the leader wrote it; it will fix it).
                continue;
            };
            let (state_now, reason) = match &answer {
                Ok(()) => (ReleaseState::Ready, None),
                Err(reason) => (ReleaseState::Refused, Some(reason.clone())),
            };
            let value = ReleaseRecord {
                state: state_now,
                answered_ms: now_ms(),
                reason,
                ..record
            };
            let response = kv
                .txn(Txn {
                    compares: vec![Compare::modified_at(key.as_str(), release.mod_revision)],
                    success: vec![TxnOp::put(
                        key.as_str(),
                        encode_value(&value).unwrap_or_default(),
                    )],
                    failure: vec![TxnOp::get(key.as_str())],
                })
                .await?;
            if response.succeeded {
                state
                    .metrics
                    .handshakes
                    .get_or_create(&crate::metrics::Outcome {
                        outcome: state_now.name().to_owned(),
                    })
                    .inc();
                if let Some(entry) = held.releases.get_mut(&key) {
                    entry.record = Some(value);
                    entry.mod_revision = response.revision;
                }
            } else {
                lost = true;
                let current = response.gets.into_iter().next().flatten();
                held.apply(keys, node, &key, current.as_ref());
            }
        }
        if !lost {
            break;
        }
    }
    reconcile_surrendered(kv, keys, node, committer, state, held).await
}

/// The answer to a `marked` key: `Ok` once the block is surrendered (now or before), else
/// why not (nothing changed locally).
async fn answer_for(
    committer: &Committer,
    held: &Held,
    release: &Release,
) -> Result<Result<(), String>, LinkError> {
    let Some(record) = &release.record else {
        return Ok(Err("the release record cannot be read".into()));
    };
    if held.is_cloud_pool(&release.pool) {
        return answer_cloud(committer, held, release, record).await;
    }
    let grant = held
        .grants
        .values()
        .find(|g| g.pool == release.pool && g.family == release.family && g.cidr == release.cidr);
    let Some(grant) = grant else {
        return Ok(Err(format!(
            "the node holds no grant of {} in pool {}",
            release.cidr, release.pool
        )));
    };
    if grant.revision != record.grant_revision {
        return Ok(Err(format!(
            "the node holds {} under grant revision {}, not {}",
            release.cidr, grant.revision, record.grant_revision
        )));
    }
    if !held.is_block_pool(&release.pool) {
        return Ok(Err(format!("pool {} is not a block pool", release.pool)));
    }
    let range = match held.range_of(grant) {
        Ok(range) => range,
        Err(error) => return Ok(Err(error.to_string())),
    };
    match committer
        .submit(Op::SurrenderBlock {
            pool: release.pool.clone(),
            range,
        })
        .await
    {
        Ok(Reply::Surrender(Surrender::Surrendered | Surrender::AlreadySurrendered)) => Ok(Ok(())),
        Ok(Reply::Surrender(Surrender::Refused(reason))) => Ok(Err(reason)),
        // Not recorded locally: no answer now (the next round asks again).
        Ok(other) => Err(LinkError::Record(format!("unexpected answer {other:?}"))),
        Err(error) => Err(LinkError::Record(format!("{error:?}"))),
    }
}

/// The answer to a `marked` key of a cloud address or prefix: it must be on the node's record
/// whose create revision the key names; then surrendered (now or before) if nothing is
/// allocated in it and nothing cooling, else why not (nothing changed locally).
async fn answer_cloud(
    committer: &Committer,
    held: &Held,
    release: &Release,
    record: &ReleaseRecord,
) -> Result<Result<(), String>, LinkError> {
    let listing = held.cloud.iter().find(|(_, entry)| {
        entry
            .record
            .as_ref()
            .is_ok_and(|r| r.pool == release.pool && r.addresses.contains(&release.cidr))
    });
    match listing {
        None => {
            return Ok(Err(format!(
                "no cloud interface record of the node lists {} in pool {}",
                release.cidr, release.pool
            )));
        }
        Some((interface, entry)) if entry.create_revision != record.grant_revision => {
            return Ok(Err(format!(
                "the node holds {} on interface {interface} under record revision {}, not {}",
                release.cidr, entry.create_revision, record.grant_revision
            )));
        }
        Some(_) => {}
    }
    match committer
        .submit(Op::SurrenderCloudAddress {
            pool: release.pool.clone(),
            address: release.cidr,
        })
        .await
    {
        Ok(Reply::Surrender(Surrender::Surrendered | Surrender::AlreadySurrendered)) => Ok(Ok(())),
        Ok(Reply::Surrender(Surrender::Refused(reason))) => Ok(Err(reason)),
        Ok(other) => Err(LinkError::Record(format!("unexpected answer {other:?}"))),
        Err(error) => Err(LinkError::Record(format!("{error:?}"))),
    }
}

/// Surrendered blocks whose handshake was withdrawn (the release key gone or not `marked`
/// or `ready`) while the grant lasts are taken back; the grant and the key are read at one
/// revision first, since the leader deletes both in one txn when it releases the block.
async fn reconcile_surrendered<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    committer: &Committer,
    state: &SharedClusterState,
    held: &Held,
) -> Result<(), LinkError> {
    let report = match committer.submit(Op::BlockReport).await {
        Ok(Reply::Blocks(report)) => report,
        other => return Err(LinkError::Record(format!("reading the blocks: {other:?}"))),
    };
    state
        .metrics
        .surrendered
        .set(i64::try_from(report.surrendered.len()).unwrap_or(i64::MAX));
    let mut reclaimed = false;
    for (pool, range) in &report.surrendered {
        let Some((owned_key, grant)) = held.grant_of(pool, range) else {
            // The grant is gone: the next set of grants forgets it.
            continue;
        };
        let release_key = keys.release(node, pool, grant.family, &grant.cidr);
        let open = |r: Option<&ReleaseRecord>| {
            r.is_some_and(|r| matches!(r.state, ReleaseState::Marked | ReleaseState::Ready))
        };
        if open(
            held.releases
                .get(&release_key)
                .and_then(|r| r.record.as_ref()),
        ) {
            continue;
        }
        let response = kv
            .txn(Txn {
                compares: vec![],
                success: vec![
                    TxnOp::get(owned_key.as_str()),
                    TxnOp::get(release_key.as_str()),
                ],
                failure: vec![],
            })
            .await?;
        let owned_now = response.gets.first().cloned().flatten();
        let release_now = response.gets.get(1).cloned().flatten();
        let release_open = release_now
            .as_ref()
            .is_some_and(|e| open(decode_value::<ReleaseRecord>(&e.value).ok().as_ref()));
        if owned_now.is_none_or(|e| e.create_revision != grant.revision) || release_open {
            continue;
        }
        match committer
            .submit(Op::ReclaimBlock {
                pool: pool.clone(),
                range: *range,
            })
            .await
        {
            Ok(_) => {
                eprintln!(
                    "corral agent: cluster: block {range} of pool {pool} taken back (its release was withdrawn)"
                );
                reclaimed = true;
            }
            Err(error) => return Err(LinkError::Record(format!("{error:?}"))),
        }
    }
    if reclaimed {
        state.blocks.ranges_changed();
    }
    Ok(())
}

/// The cluster ranges the host holds (granted or draining), as (pool, CIDR).
async fn held_locally(
    committer: &Committer,
) -> Result<std::collections::BTreeSet<(PoolName, IpNet)>, LinkError> {
    match committer.submit(Op::BlockReport).await {
        Ok(Reply::Blocks(report)) => Ok(report
            .ranges
            .iter()
            .map(|r| (r.pool.clone(), r.spec.subnet_net()))
            .collect()),
        other => Err(LinkError::Record(format!(
            "reading the node's ranges: {other:?}"
        ))),
    }
}

/// Which grants the node takes up: one this process took up before, one made after the
/// highest revision the agent had seen before this round or after the last `reassert`
/// (`seen_before`), or one of space the host holds (granted or draining: its own from before
/// a restart). Any other is space this node gave up that etcd handed back, or a grant from
/// before etcd went back in time that this node never took up (restored from a snapshot;
/// the space may be another node's by now): it is not served, and is asserted as refused
/// (`HoldingsRecord::refused`) for the leader to revoke.
fn screen(
    held: &mut Held,
    across: &mut AcrossRounds,
    local: &std::collections::BTreeSet<(PoolName, IpNet)>,
) {
    let mut refused = BTreeMap::new();
    for (key, grant) in &held.grants {
        if across.accepted.contains(&(key.clone(), grant.revision)) {
            continue;
        }
        if grant.revision > across.seen_before || local.contains(&(grant.pool.clone(), grant.cidr))
        {
            across.accepted.insert((key.clone(), grant.revision));
            continue;
        }
        if !held.refused.contains_key(key) {
            eprintln!(
                "corral agent: cluster: not taking up grant {} of pool {} (made at revision {}, \
                 before revision {} this agent had seen, of space it does not hold: etcd handed \
                 back a grant this node gave up); the leader revokes it",
                grant.cidr, grant.pool, grant.revision, across.seen_before
            );
        }
        refused.insert(
            key.clone(),
            corral_cluster::RefusedGrant {
                pool: grant.pool.clone(),
                cidr: grant.cidr,
                grant_revision: grant.revision,
            },
        );
    }
    held.refused = refused;
    // The node ID, judged the same way by its plan's pod range (unjudged until the plan is
    // known: nothing of it is served before).
    let mut node_id_key = None;
    held.refused_node_id = None;
    if let (Some(id), Some(plan)) = (held.node_id, &held.plan) {
        let key = format!("node-id/{id}");
        let revision = held.node_id_revision;
        let pod_range = corral_cluster::pod_subnet_of(plan, id);
        let holds = pod_range.is_some_and(|range| {
            PoolName::new(ClusterOptions::PLAN_POOL)
                .is_ok_and(|pool| local.contains(&(pool, range)))
        });
        if across.accepted.contains(&(key.clone(), revision))
            || revision > across.seen_before
            || holds
        {
            across.accepted.insert((key.clone(), revision));
        } else {
            eprintln!(
                "corral agent: cluster: not taking up node ID {id} (granted at revision \
                 {revision}, before revision {} this agent had seen, and its plan's pod range is \
                 not held here: etcd handed back an ID this node gave up); the leader revokes it",
                across.seen_before
            );
            held.refused_node_id = Some(corral_cluster::RefusedNodeId { id, revision });
        }
        node_id_key = Some((key, revision));
    }
    // Only grants that still stand are remembered.
    across.accepted.retain(|(key, revision)| {
        held.grants
            .get(key)
            .is_some_and(|g| g.revision == *revision)
            || node_id_key.as_ref() == Some(&(key.clone(), *revision))
    });
}

/// Hands the held grants to the host (durable before it answers) and publishes them. A
/// failure ends the round: the next one reads the grants again and retries.
async fn apply(
    committer: &Committer,
    state: &SharedClusterState,
    held: &Held,
) -> Result<(), LinkError> {
    state.blocks.set_config(held.config.clone());
    let ranges = held.ranges();
    let block_families = held.block_families();
    let mut shown: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (pool, range) in &ranges {
        shown
            .entry(pool.to_string())
            .or_default()
            .push(range.to_string());
    }
    match committer
        .submit(Op::SetClusterRanges(ClusterRanges {
            ranges,
            block_families,
        }))
        .await
    {
        Ok(_) => {
            update(state, |s| {
                s.grants = shown;
                s.node_id = held.node_id.filter(|_| held.refused_node_id.is_none());
                s.refused = held.refused.values().cloned().collect();
                s.refused_node_id = held.refused_node_id;
            });
            state.blocks.ranges_changed();
            Ok(())
        }
        Err(error) => Err(LinkError::Record(format!("{error:?}"))),
    }
}

/// This machine's uid for the cluster: kept in the state directory (`cluster-uid`), made
/// once from a random UUID (the kernel's), so a reinstalled machine (a new state directory) is a new machine.
pub fn machine_uid(data_dir: &std::path::Path) -> std::io::Result<String> {
    let path = data_dir.join("cluster-uid");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_owned()),
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    std::fs::create_dir_all(data_dir)?;
    // The kernel's random UUID source: a fresh v4 UUID per read.
    let uid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")?
        .trim()
        .to_owned();
    let temporary = data_dir.join("cluster-uid.tmp");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(uid.as_bytes())?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, &path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(uid)
}

/// The link's state as the API shows it.
pub fn api_status(state: &ClusterState) -> corral_api::ClusterStatus {
    corral_api::ClusterStatus {
        node: state.node.clone(),
        registered: state.registered,
        degraded: state.degraded_since_ms.is_some(),
        degraded_since_ms: state.degraded_since_ms,
        last_error: state.last_error.clone(),
        grants: state
            .grants
            .iter()
            .flat_map(|(pool, ranges)| ranges.iter().map(move |r| format!("{pool} {r}")))
            .collect(),
        node_id: state.node_id,
        instance_id: state.instance_id.clone(),
        problems: state.problems.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(pool: &str, cidr: &str, revision: Revision) -> (String, Grant) {
        let cidr: IpNet = cidr.parse().unwrap();
        (
            format!("owned/n/{pool}/{cidr}"),
            Grant {
                pool: PoolName::new(pool).unwrap(),
                family: if cidr.addr().is_ipv4() {
                    Family::V4
                } else {
                    Family::V6
                },
                cidr,
                revision,
            },
        )
    }

    #[test]
    fn a_node_id_is_taken_up_on_the_same_grounds_as_a_grant() {
        let plan: NodeIdPlanConfig = serde_json::from_value(serde_json::json!({
            "pod_subnet": "10.1.0.0/16",
            "pod_subnet_node_prefix_len": 24,
            "host_interconnect_subnet": "172.30.0.0/16",
            "host_interconnect_node_prefix_len": 24,
            "node_interconnect": "192.168.16.0/24",
            "vxlan": "192.168.30.0/24",
            "service": "10.96.0.0/12",
        }))
        .unwrap();
        let mut across = AcrossRounds {
            seen_before: 100,
            ..AcrossRounds::default()
        };
        let mut held = Held {
            node_id: Some(5),
            node_id_revision: 60,
            plan: Some(plan.clone()),
            ..Held::default()
        };
        // Granted before revision 100, its pod range not held here: refused, its plan not
        // served.
        screen(&mut held, &mut across, &Default::default());
        assert_eq!(
            held.refused_node_id,
            Some(corral_cluster::RefusedNodeId {
                id: 5,
                revision: 60
            })
        );
        assert!(held.ranges().is_empty());
        // Its pod range held here (the node's own from before a restart): taken up.
        let pod_range = corral_cluster::pod_subnet_of(&plan, 5).unwrap();
        let local = [(PoolName::new(ClusterOptions::PLAN_POOL).unwrap(), pod_range)]
            .into_iter()
            .collect();
        screen(&mut held, &mut across, &local);
        assert_eq!(held.refused_node_id, None);
        assert_eq!(held.ranges().len(), 1);
        // Granted anew after what was seen: taken up.
        held.node_id = Some(7);
        held.node_id_revision = 150;
        screen(&mut held, &mut across, &Default::default());
        assert_eq!(held.refused_node_id, None);
    }

    #[test]
    fn a_grant_is_taken_up_if_taken_before_made_after_what_was_seen_or_of_space_held() {
        let mut across = AcrossRounds {
            seen_before: 100,
            ..AcrossRounds::default()
        };
        let mut held = Held::default();
        // Made after revision 100: new, taken up. Made before, of space the host holds (its
        // own from before a restart): taken up. Made before, of space not held: refused.
        for (key, g) in [
            grant("default", "10.0.1.0/24", 150),
            grant("default", "10.0.2.0/24", 40),
            grant("default", "10.0.3.0/24", 60),
        ] {
            held.grants.insert(key, g);
        }
        let local: std::collections::BTreeSet<(PoolName, IpNet)> = [(
            PoolName::new("default").unwrap(),
            "10.0.2.0/24".parse().unwrap(),
        )]
        .into_iter()
        .collect();
        screen(&mut held, &mut across, &local);
        let refused: Vec<String> = held.refused.values().map(|r| r.cidr.to_string()).collect();
        assert_eq!(refused, ["10.0.3.0/24"]);
        assert_eq!(held.refused.values().next().unwrap().grant_revision, 60);
        let served: Vec<String> = held
            .ranges()
            .iter()
            .map(|(_, r)| r.subnet_net().to_string())
            .collect();
        assert_eq!(served, ["10.0.1.0/24", "10.0.2.0/24"]);
        // A later round: what this process took up stays taken up, even if the host dropped
        // it meanwhile (a drain while another process held the liveness key), and even with a
        // higher revision seen.
        across.seen_before = 1_000;
        screen(&mut held, &mut across, &Default::default());
        let refused: Vec<String> = held.refused.values().map(|r| r.cidr.to_string()).collect();
        assert_eq!(refused, ["10.0.3.0/24"]);
        // A grant that goes is forgotten: made again at the same place, it is judged anew.
        let (key, _) = grant("default", "10.0.1.0/24", 150);
        held.grants.remove(&key);
        screen(&mut held, &mut across, &Default::default());
        assert!(!across.accepted.iter().any(|(k, _)| k == &key));
        let (key, again) = grant("default", "10.0.1.0/24", 900);
        held.grants.insert(key, again);
        screen(&mut held, &mut across, &Default::default());
        let refused: Vec<String> = held.refused.values().map(|r| r.cidr.to_string()).collect();
        assert_eq!(refused, ["10.0.1.0/24", "10.0.3.0/24"]);
    }

    #[test]
    fn the_backoff_doubles_from_one_second_to_thirty_with_jitter() {
        let seconds = |failures, seed| backoff(failures, seed).as_secs_f64();
        for seed in [0, 1, 77, 999, 123_456_789, u64::MAX] {
            let waits: Vec<f64> = (1..=10).map(|f| seconds(f, seed)).collect();
            assert!((1.0..1.25).contains(&waits[0]), "{waits:?}");
            assert!((2.0..2.5).contains(&waits[1]), "{waits:?}");
            assert!((16.0..20.0).contains(&waits[4]), "{waits:?}");
            for wait in &waits[5..] {
                assert!((22.5..=30.0).contains(wait), "{waits:?}");
            }
            assert!(waits.iter().all(|w| *w <= 30.0));
        }
        // Jittered: different seeds, different waits.
        assert_ne!(backoff(3, 1), backoff(3, 2));
        assert_ne!(backoff(9, 1), backoff(9, 2));
        assert_eq!(backoff(u32::MAX, 0), Duration::from_secs(30));
    }
}
