//! The harness the agent's cluster tests share (`add_waits.rs`, `blocks.rs`, `cloud.rs`,
//! `cluster_link.rs`): a real agent started in-process (`serve_with` on a temporary directory
//! and socket) whose `ClusterTask` runs `corral_agent::link::run` on a shared `MemKv`, driven
//! over its socket with corral-client, and the small helpers around it (the cluster's keys as
//! the leader writes them, the CNI requests).
//!
//! That agent runs SQLite commits on threads of its own, so its clock cannot be paused: tests
//! on it run on real time. They wait for events ([`wait_until`] polls a condition, with a
//! generous limit that only turns a hang into a failure) and never assert that something
//! took less than some time. Tests that need no disk nor socket use [`paused`] instead: the
//! agent over a `MemoryStore` on a paused clock, in virtual time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_agent::AgentConfig;
use corral_agent::link::ClusterOptions;
use corral_api::{AttachmentKey, CniNetwork};
use corral_client::Client;
use corral_cluster::{
    ClusterConfig, ClusterName, DemandRecord, Family, GrantRecord, IpNet, Keys, NodeName,
    OwnedRecord, PoolName, ReleaseRecord, ReleaseState, decode_value, encode_value,
};
use corral_kv::{Kv, MemKv, Txn, TxnOp};

pub mod paused;

/// The cluster every test here runs in.
pub const CLUSTER: &str = "t";

pub fn keys() -> Keys {
    Keys::new(ClusterName::new(CLUSTER).unwrap())
}

pub fn node_name(name: &str) -> NodeName {
    NodeName::new(name).unwrap()
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An agent configuration in `dir` with no pools of its own (the cluster grants them).
pub fn config(dir: &Path) -> AgentConfig {
    AgentConfig {
        pools: corral_agent::config::pools(&[]).unwrap(),
        ..AgentConfig::in_dir(dir)
    }
}

/// The cluster link's options for `node`, registered with machine ID `uid`, its liveness on
/// a lease of `ttl`.
pub fn options(node: &str, uid: &str, ttl: Duration) -> ClusterOptions {
    ClusterOptions {
        endpoints: vec![],
        cluster: CLUSTER.into(),
        node: node.into(),
        uid: uid.into(),
        lease_ttl: ttl,
        demand_refresh: ClusterOptions::DEFAULT_DEMAND_REFRESH,
        instance_id: None,
        max_pods: None,
        epoch_file: None,
    }
}

/// Where a test agent's cluster link task is, once it started (for `kill_link`).
#[derive(Clone, Default)]
pub struct LinkSlot(Arc<Mutex<Option<tokio::task::AbortHandle>>>);

impl LinkSlot {
    /// Ends the link's task at once.
    pub fn abort(&self) {
        self.0
            .lock()
            .unwrap()
            .as_ref()
            .expect("the link started")
            .abort();
    }
}

/// The agent's cluster link on `kv` with `options`, as `corral agent --etcd` runs it, and the
/// slot its task's handle goes into when the agent starts it.
pub fn link_task(kv: &MemKv, options: ClusterOptions) -> (corral_agent::ClusterTask, LinkSlot) {
    let link = LinkSlot::default();
    let slot = link.clone();
    let kv = kv.clone();
    let task: corral_agent::ClusterTask = Box::new(move |committer, state, stop| {
        Box::pin(async move {
            let task = tokio::spawn(corral_agent::link::run(kv, options, committer, state, stop));
            *slot.0.lock().unwrap() = Some(task.abort_handle());
            let _ = task.await;
        })
    });
    (task, link)
}

/// A running agent with its cluster link.
pub struct LinkedAgent {
    pub socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<Result<(), corral_agent::AgentError>>>,
}

impl LinkedAgent {
    /// Starts the agent and returns once it is ready (which says nothing of the link: see
    /// [`LinkedAgent::wait_registered`]).
    pub fn start(
        runtime: &tokio::runtime::Runtime,
        kv: &MemKv,
        config: AgentConfig,
        options: ClusterOptions,
    ) -> LinkedAgent {
        let socket = config.socket.clone();
        let (task, _) = link_task(kv, options);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let served = runtime.spawn(corral_agent::serve_with(
            config,
            Some(task),
            async move {
                let _ = stopped.await;
            },
            move || {
                let _ = ready_tx.send(());
            },
        ));
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the agent gets ready");
        LinkedAgent {
            socket,
            stop: Some(stop),
            served: Some(served),
        }
    }

    /// Waits until the link has registered the node.
    pub fn wait_registered(self) -> LinkedAgent {
        wait_until("registered", Duration::from_secs(10), || {
            self.client()
                .status(None)
                .unwrap()
                .cluster
                .is_some_and(|c| c.registered)
        });
        self
    }

    pub fn client(&self) -> Client {
        Client::unix(&self.socket)
    }

    pub fn cluster_status(&self) -> corral_api::ClusterStatus {
        self.client()
            .status(None)
            .unwrap()
            .cluster
            .expect("the agent reports its cluster link")
    }

    /// Stops the agent cleanly and waits for it to finish.
    pub fn stop(mut self, runtime: &tokio::runtime::Runtime) {
        let _ = self.stop.take().unwrap().send(());
        runtime
            .block_on(self.served.take().unwrap())
            .unwrap()
            .unwrap();
    }
}

impl Drop for LinkedAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Polls `done` until it holds; fails naming `what` if it does not within `limit` (a bound
/// that only turns a hang into a failure, far above what the event takes).
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Grants `cidr` of `pool` to the registered `node` as the leader does (its `grants/` and
/// `owned/` keys, naming the registration); returns the revision.
pub async fn grant(kv: &MemKv, node: &str, pool: &str, cidr: &str) -> i64 {
    let keys = keys();
    let node = node_name(node);
    let pool = PoolName::new(pool).unwrap();
    let cidr: IpNet = cidr.parse().unwrap();
    let family = Family::of(cidr.addr());
    let registration = kv.get(keys.node(&node).as_bytes()).await.unwrap().unwrap();
    let record = GrantRecord {
        node: node.clone(),
        uid: String::new(),
        node_revision: registration.create_revision,
        granted_ms: None,
    };
    let owned = OwnedRecord {
        node_revision: registration.create_revision,
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![
            TxnOp::put(
                keys.grant(&pool, family, &cidr),
                encode_value(&record).unwrap(),
            ),
            TxnOp::put(
                keys.owned(&node, &pool, family, &cidr),
                encode_value(&owned).unwrap(),
            ),
        ],
        failure: vec![],
    })
    .await
    .unwrap()
    .revision
}

/// Puts `value` at `key`; returns the revision.
pub async fn put(kv: &MemKv, key: String, value: Vec<u8>) -> i64 {
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::put(key, value)],
        failure: vec![],
    })
    .await
    .unwrap()
    .revision
}

/// Puts the cluster configuration `toml` as `cluster apply` does.
pub async fn put_config(kv: &MemKv, toml: &str) {
    let config = ClusterConfig::from_toml(toml).unwrap();
    put(kv, keys().config(), config.to_json().unwrap().into()).await;
}

/// The CNI network `podnet`: the node's pool `pool` (`default` if none), requested if given,
/// in `namespace` if given.
pub fn network(pool: Option<&str>, namespace: Option<&str>) -> CniNetwork {
    CniNetwork {
        requested_pool: pool.map(str::to_owned),
        namespace: namespace.map(str::to_owned),
        ..CniNetwork::on_node_pool("podnet", pool.unwrap_or("default"))
    }
}

/// The attachment of container `c{i}`'s `eth0` on `podnet`.
pub fn key(i: usize) -> AttachmentKey {
    AttachmentKey {
        network: "podnet".into(),
        container_id: format!("c{i}"),
        ifname: "eth0".into(),
    }
}

/// The `releases/` key of block (or address range) `cidr` of `pool` on `node`.
pub fn release_key(node: &str, pool: &str, cidr: &str) -> String {
    let cidr: IpNet = cidr.parse().unwrap();
    keys().release(
        &node_name(node),
        &PoolName::new(pool).unwrap(),
        Family::of(cidr.addr()),
        &cidr,
    )
}

/// The leader's step 1 of a release: `marked`, naming the grant's (or the `interfaces/`
/// key's) create revision.
pub async fn mark(kv: &MemKv, node: &str, pool: &str, cidr: &str, grant_revision: i64) {
    let record = ReleaseRecord {
        state: ReleaseState::Marked,
        grant_revision,
        marked_ms: 1,
        answered_ms: 0,
        reason: None,
    };
    let key = release_key(node, pool, cidr);
    put(kv, key, encode_value(&record).unwrap()).await;
}

pub async fn release_record(
    kv: &MemKv,
    node: &str,
    pool: &str,
    cidr: &str,
) -> Option<ReleaseRecord> {
    kv.get(release_key(node, pool, cidr).as_bytes())
        .await
        .unwrap()
        .map(|e| decode_value(&e.value).unwrap())
}

/// The demand `node` publishes for `pool`, if any.
pub async fn demand(kv: &MemKv, node: &str, pool: &str) -> Option<DemandRecord> {
    let key = keys().demand(&node_name(node), &PoolName::new(pool).unwrap());
    kv.get(key.as_bytes())
        .await
        .unwrap()
        .map(|e| decode_value(&e.value).unwrap())
}

/// Whether `address` lies in `cidr`.
pub fn within(cidr: &str, address: std::net::IpAddr) -> bool {
    cidr.parse::<IpNet>().unwrap().contains(&address)
}
