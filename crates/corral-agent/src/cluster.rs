//! The agent's part in a cluster (`corral agent --etcd URL --node NAME`): register the node,
//! keep its liveness key on a lease, watch its own grants, and hand them to the host as the
//! `node` scope's cluster ranges (recorded durably before anything is allocated from them).
//!
//! Pod allocations never touch etcd: this task only moves address space. While etcd cannot
//! be reached the agent keeps serving from what it holds and says so in its status
//! (`degraded`, since when); nothing it holds is dropped for want of etcd, only a grant that
//! etcd says is gone (a node removal) drains.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_cluster::{
    ClusterConfig, ClusterName, Key, Keys, LiveRecord, NodeIdOfNodeRecord, NodeIdPlanConfig,
    NodeName, NodePlan, NodeRecord, decode_value, encode_value,
};
use corral_core::{PoolName, RangeSpec};

use corral_kv::{Compare, Event, Kv, KvError, LeaseId, Revision, Txn, TxnOp};

use crate::committer::Committer;
use crate::host::{ClusterRanges, Op};

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
}

impl ClusterOptions {
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(20);
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
}

/// Shared between the cluster task and the API.
pub type SharedClusterState = Arc<Mutex<ClusterState>>;

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
    #[error("node {0} was removed from the cluster; restart the agent to register it again")]
    Removed(String),
    #[error("recording the grants in the local store: {0}")]
    Record(String),
    #[error("the agent stopped")]
    Stopped,
}

/// Runs the cluster link until `stop` fires, reconnecting with jittered backoff (1 s doubling
/// to 30 s) after any failure.
pub async fn run<K: Kv>(
    kv: K,
    options: ClusterOptions,
    committer: Committer,
    state: SharedClusterState,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
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
    // What outlives a round: the registration this process made or found (a later round
    // that finds it gone or replaced means the node was removed meanwhile), and the last
    // node ID and plan that could be read (one that cannot be read later keeps them).
    let mut across = AcrossRounds::default();
    loop {
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
            Err(LinkError::Removed(_)) => {
                // An administrator removed the node while it runs: what it was granted is
                // quarantined and will go to others, so it drains here (pods keep their
                // addresses, nothing new is handed out), and the node does not register
                // again behind the administrator's back: a restart of the agent does.
                let removed = committer
                    .submit(Op::SetClusterRanges(ClusterRanges { ranges: Vec::new() }))
                    .await;
                eprintln!(
                    "corral agent: cluster: node {} was removed from the cluster; its ranges drain; \
                     restart the agent to register it again",
                    options.node
                );
                update(&state, |s| {
                    s.registered = false;
                    s.grants.clear();
                    s.node_id = None;
                    s.last_error = Some(match removed {
                        Ok(_) => format!(
                            "node {} was removed from the cluster; restart the agent to register it again",
                            options.node
                        ),
                        Err(error) => format!("draining after the node's removal: {error:?}"),
                    });
                });
                return;
            }
            Err(error) => {
                eprintln!("corral agent: cluster: {error}");
                let unreachable = matches!(&error, LinkError::Kv(e) if e.is_retryable());
                update(&state, |s| {
                    s.last_error = Some(error.to_string());
                    if unreachable && s.degraded_since_ms.is_none() {
                        s.degraded_since_ms = Some(now_ms());
                    }
                });
                failures = failures.saturating_add(1);
                let base = Duration::from_secs(1 << failures.min(5).saturating_sub(1))
                    .min(Duration::from_secs(30));
                let jitter = Duration::from_millis(
                    u64::from(std::process::id() ^ failures.wrapping_mul(7919)) % 1000,
                );
                tokio::select! {
                    _ = tokio::time::sleep(base + jitter) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// What the link keeps from one round to the next.
#[derive(Default)]
struct AcrossRounds {
    /// The create revision of the registration this process made or found.
    registration: Option<Revision>,
    /// The node ID and plan last read.
    node_id: Option<u32>,
    plan: Option<NodeIdPlanConfig>,
    /// Whether the round got as far as serving (its backoff then starts again).
    served: bool,
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
    let node_key = keys.node(node);
    let registration = register(kv, &node_key, options, across.registration).await?;
    across.registration = Some(registration);
    let lease = kv.lease_grant(options.lease_ttl).await?;
    let live = LiveRecord {
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_ms: now_ms(),
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::put_on_lease(
            keys.live(node),
            encode_value(&live).unwrap_or_default(),
            lease,
        )],
        failure: vec![],
    })
    .await?;
    let result = follow(
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
    )
    .await;
    if matches!(result, Err(LinkError::Stopped)) {
        // A clean stop says so at once; a crash leaves the key to its lease.
        let _ = kv.lease_revoke(lease).await;
    }
    result
}

/// Creates the node's registration if absent, else checks it is this machine's. Answers the
/// registration's create revision. Once this process registered (`known`), only that
/// registration will do: gone or replaced means the node was removed while the link was
/// down, and only a restart of the agent registers it again.
async fn register<K: Kv>(
    kv: &K,
    node_key: &str,
    options: &ClusterOptions,
    known: Option<Revision>,
) -> Result<Revision, LinkError> {
    loop {
        let existing = kv.get(node_key.as_bytes()).await?;
        if let Some(known) = known
            && existing.as_ref().is_none_or(|e| e.create_revision != known)
        {
            return Err(LinkError::Removed(options.node.clone()));
        }
        if let Some(existing) = existing {
            let record: Option<NodeRecord> = decode_value(&existing.value).ok();
            return match record {
                Some(record) if record.uid == options.uid => Ok(existing.create_revision),
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

/// What the node holds in the cluster, as read from etcd.
#[derive(Default)]
struct Held {
    /// Grant key → (pool, range).
    grants: BTreeMap<String, (PoolName, RangeSpec)>,
    node_id: Option<u32>,
    plan: Option<NodeIdPlanConfig>,
}

impl Held {
    fn apply(&mut self, keys: &Keys, node: &NodeName, key: &str, value: Option<&[u8]>) {
        match keys.parse(key) {
            Ok(Key::Owned {
                node: owner,
                pool,
                cidr,
                ..
            }) if &owner == node => match value {
                Some(_) => match corral_cluster::node_range(cidr) {
                    Ok(range) => {
                        self.grants.insert(key.to_owned(), (pool, range));
                    }
                    Err(error) => eprintln!("corral agent: cluster: ignoring grant {key}: {error}"),
                },
                None => {
                    self.grants.remove(key);
                }
            },
            Ok(Key::NodeIdOfNode { node: owner }) if &owner == node => match value {
                None => self.node_id = None,
                Some(v) => match decode_value::<NodeIdOfNodeRecord>(v) {
                    Ok(record) => self.node_id = Some(record.id),
                    // Unreadable: what was held stays (its pod range is not dropped for it).
                    Err(error) => eprintln!("corral agent: cluster: {key}: {error}"),
                },
            },
            Ok(Key::Config) => match value.map(ClusterConfig::from_json) {
                Some(Ok(config)) => self.plan = config.node_ids.clone(),
                // A configuration this build cannot read changes nothing held.
                Some(Err(error)) => eprintln!("corral agent: cluster: {key}: {error}"),
                None => {}
            },
            _ => {}
        }
    }

    /// The ranges the node's pools must hold.
    fn ranges(&self) -> Vec<(PoolName, RangeSpec)> {
        let mut ranges: Vec<(PoolName, RangeSpec)> = self.grants.values().cloned().collect();
        if let (Some(id), Some(plan)) = (self.node_id, &self.plan)
            && let Ok(derived) = NodePlan::derive(plan, id)
            && let Ok(range) = derived.pod_range()
            && let Ok(pool) = PoolName::new(ClusterOptions::PLAN_POOL)
        {
            ranges.push((pool, range));
        }
        ranges
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
    let id_key = keys.node_id_of_node(node);
    let config_key = keys.config();
    let node_key = keys.node(node);
    let mut held = Held {
        grants: BTreeMap::new(),
        node_id: across.node_id,
        plan: across.plan.clone(),
    };
    let (owned, revision) = corral_kv::read_all(kv, owned_prefix.as_bytes(), 1000).await?;
    for entry in &owned {
        held.apply(keys, node, &entry.key_str(), Some(&entry.value));
    }
    // The registration, the node ID and the configuration at the same revision as the
    // grants, so the watches below miss nothing: a removal that landed since `register`
    // read the registration is seen here.
    for key in [&node_key, &id_key, &config_key] {
        let page = kv.range(key.as_bytes(), None, 1, Some(revision)).await?;
        let entry = page.kvs.into_iter().find(|e| e.key == key.as_bytes());
        if key == &node_key {
            if entry.is_none_or(|e| e.create_revision != registration) {
                return Err(LinkError::Removed(node.to_string()));
            }
            continue;
        }
        match entry {
            Some(entry) => held.apply(keys, node, key, Some(&entry.value)),
            None if key == &id_key => held.node_id = None,
            None => {}
        }
    }
    apply(committer, state, &held).await?;
    across.node_id = held.node_id;
    across.plan = held.plan.clone();
    across.served = true;
    update(state, |s| {
        s.registered = true;
        s.degraded_since_ms = None;
        s.last_error = None;
    });
    let mut grants = kv.watch(owned_prefix.as_bytes(), revision + 1).await?;
    let mut ids = kv.watch(id_key.as_bytes(), revision + 1).await?;
    let mut config = kv.watch(config_key.as_bytes(), revision + 1).await?;
    let mut registrations = kv.watch(node_key.as_bytes(), revision + 1).await?;
    let keep_alive_every = (options.lease_ttl / 3).max(Duration::from_millis(200));
    let mut keep_alive = tokio::time::interval(keep_alive_every);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let events = tokio::select! {
            batch = grants.next() => batch?,
            batch = ids.next() => batch?,
            batch = config.next() => batch?,
            batch = registrations.next() => {
                let batch = batch?;
                for event in &batch {
                    let gone = match event {
                        Event::Delete { key, .. } => key == node_key.as_bytes(),
                        Event::Put(kv) => kv.key == node_key.as_bytes() && kv.create_revision != registration,
                    };
                    if gone {
                        update(state, |s| s.registered = false);
                        return Err(LinkError::Removed(node.to_string()));
                    }
                }
                continue;
            }
            _ = keep_alive.tick() => {
                kv.lease_keep_alive(lease).await?;
                continue;
            }
            _ = stop.changed() => return Err(LinkError::Stopped),
        };
        for event in &events {
            let key = String::from_utf8_lossy(event.key()).into_owned();
            match event {
                Event::Put(entry) => held.apply(keys, node, &key, Some(&entry.value)),
                Event::Delete { .. } => held.apply(keys, node, &key, None),
            }
        }
        apply(committer, state, &held).await?;
        across.node_id = held.node_id;
        across.plan = held.plan.clone();
    }
}

/// Hands the held grants to the host (durable before it answers) and publishes them. A
/// failure ends the round: the next one reads the grants again and retries.
async fn apply(
    committer: &Committer,
    state: &SharedClusterState,
    held: &Held,
) -> Result<(), LinkError> {
    let ranges = held.ranges();
    let mut shown: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (pool, range) in &ranges {
        shown
            .entry(pool.to_string())
            .or_default()
            .push(range.to_string());
    }
    match committer
        .submit(Op::SetClusterRanges(ClusterRanges { ranges }))
        .await
    {
        Ok(_) => {
            update(state, |s| {
                s.grants = shown;
                s.node_id = held.node_id;
            });
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
    }
}
