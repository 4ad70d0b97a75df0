//! What the cluster link shares with the rest of the agent: its options, its state as
//! `/v1/status` and readiness see it ([`ClusterShared`]), the backoff between rounds, and the
//! machine's identity.

use std::collections::BTreeMap;
use std::sync::{Arc, LockResult, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_cluster::{Keys, NodeName};
use corral_kv::KvError;

use crate::committer::Committer;
use crate::link::blocks::BlockSignals;
use crate::metrics::ClusterMetrics;

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
    /// restarts of the agent (`holdings::EpochGuard`).
    pub epoch_file: Option<std::path::PathBuf>,
}

impl ClusterOptions {
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(20);
    pub const DEFAULT_DEMAND_REFRESH: Duration = Duration::from_secs(1);
    /// At most one demand write per node in this time (more apart in a cluster whose demand
    /// write budget it would exceed: `corral_cluster::demand_interval`).
    pub const DEMAND_MIN_INTERVAL: Duration = corral_cluster::census::DEMAND_MIN_INTERVAL;
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
    /// Whether the link has read the cluster's `election/` keys in its current round (then
    /// `leader` says who leads, `None` when no operator campaigns).
    pub election_read: bool,
    /// The leading operator's name: the value of the candidate with the lowest create
    /// revision under `election/` (a dead leader stays until its lease expires).
    pub leader: Option<String>,
    /// Why the leader cannot serve the node now, as it published it (`owned/<node>/waiting`,
    /// read from the watch on the node's grants): `None` while it serves the node.
    pub waiting: Option<corral_cluster::WaitingRecord>,
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
    pub(super) state: Mutex<ClusterState>,
    /// Set once the node was removed from the cluster: ADDs on its cluster pools are refused
    /// (it takes no new pods while it drains); only a restart of the agent clears it.
    pub(super) removed: std::sync::atomic::AtomicBool,
    /// The lease of the node's liveness key this process's link holds (0: none yet): the
    /// holdings publisher asserts the node's holdings only while the key is on it.
    pub(super) live_lease: std::sync::atomic::AtomicI64,
    pub blocks: Arc<BlockSignals>,
    pub metrics: ClusterMetrics,
    pub(super) gate: tokio::sync::watch::Sender<Gate>,
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

    /// The lease of the liveness key this process's link holds or last held, if any.
    pub(super) fn live_lease(&self) -> Option<corral_kv::LeaseId> {
        let lease = self.live_lease.load(std::sync::atomic::Ordering::Acquire);
        (lease != 0).then_some(corral_kv::LeaseId(lease))
    }

    /// Records the lease the link's liveness key is on.
    pub(super) fn set_live_lease(&self, lease: corral_kv::LeaseId) {
        self.live_lease
            .store(lease.0, std::sync::atomic::Ordering::Release);
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
        update(self, |s| {
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

/// Shared between the cluster task and the API.
pub type SharedClusterState = Arc<ClusterShared>;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Changes the state the API shows (`state` may be a [`SharedClusterState`]).
pub(super) fn update(state: &ClusterShared, f: impl FnOnce(&mut ClusterState)) {
    let mut guard = state.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard);
}

/// A call the link tries again when etcd does not answer it, instead of ending its round (a
/// lease keep-alive, a demand write): while it fails the link is degraded, saying why and
/// since when; its next success takes that back, unless something else has said more since.
#[derive(Debug, Default)]
pub(super) struct Retrying {
    /// What it said, while it fails.
    said: Option<String>,
    since_ms: u64,
}

impl Retrying {
    /// It failed again: `why`, in a sentence.
    pub(super) fn failed(&mut self, state: &SharedClusterState, why: String) {
        if self.said.is_none() {
            self.since_ms = now_ms();
        }
        let since = self.since_ms;
        update(state, |s| {
            s.degraded_since_ms.get_or_insert(since);
            s.last_error = Some(why.clone());
        });
        self.said = Some(why);
    }

    /// It succeeded.
    pub(super) fn succeeded(&mut self, state: &SharedClusterState) {
        if let Some(said) = self.said.take() {
            update(state, |s| {
                if s.last_error.as_ref() == Some(&said) {
                    s.degraded_since_ms = None;
                    s.last_error = None;
                }
            });
        }
    }
}

/// Why one round of the cluster link ended.
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
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

/// What every step of a link round works with: the store, the node's keys, its options, the
/// way into the node state and the state the link shares (one value, not six parameters).
pub(super) struct Cx<'a, K> {
    pub(super) kv: &'a K,
    pub(super) keys: &'a Keys,
    pub(super) node: &'a NodeName,
    pub(super) options: &'a ClusterOptions,
    pub(super) committer: &'a Committer,
    pub(super) state: &'a SharedClusterState,
}

impl<K> Clone for Cx<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Cx<'_, K> {}

impl<'a, K> Cx<'a, K> {
    /// Its parts, for a step that uses them by name.
    #[allow(clippy::type_complexity)]
    pub(super) fn parts(
        self,
    ) -> (
        &'a K,
        &'a Keys,
        &'a NodeName,
        &'a ClusterOptions,
        &'a Committer,
        &'a SharedClusterState,
    ) {
        (
            self.kv,
            self.keys,
            self.node,
            self.options,
            self.committer,
            self.state,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ClusterShared, Retrying, SharedClusterState, backoff};

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

    #[test]
    fn a_retried_call_says_it_fails_until_it_succeeds_and_takes_back_only_its_own_words() {
        let state: SharedClusterState = std::sync::Arc::new(ClusterShared::default());
        let seen = || {
            let s = state.lock().unwrap();
            (s.degraded_since_ms.is_some(), s.last_error.clone())
        };
        let (mut keep_alive, mut demand) = (Retrying::default(), Retrying::default());
        keep_alive.failed(&state, "keep-alive late".into());
        assert_eq!(seen(), (true, Some("keep-alive late".into())));
        let since = state.lock().unwrap().degraded_since_ms;
        demand.failed(&state, "demand late".into());
        assert_eq!(
            state.lock().unwrap().degraded_since_ms,
            since,
            "since the first"
        );
        // The keep-alive's success does not hide the demand's failure.
        keep_alive.succeeded(&state);
        assert_eq!(seen(), (true, Some("demand late".into())));
        demand.succeeded(&state);
        assert_eq!(seen(), (false, None));
        // A success with nothing said changes nothing.
        state.lock().unwrap().last_error = Some("another".into());
        demand.succeeded(&state);
        assert_eq!(seen(), (false, Some("another".into())));
    }
}
