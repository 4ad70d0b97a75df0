//! The harness the agent's cluster tests share (`blocks.rs`, `cloud.rs`, `cluster_link.rs`):
//! a real agent started in-process (`serve_with` on a temporary directory and socket) whose
//! `ClusterTask` runs `corral_agent::link::run` on a shared `MemKv`, driven over its socket
//! with corral-client, and the small helpers around it.
//!
//! That agent runs SQLite commits on threads of its own, so its clock cannot be paused: tests
//! on it run on real time. They wait for events ([`wait_until`] polls a condition, with a
//! generous limit that only turns a hang into a failure) and never assert that something
//! took less than some time. Tests that need no disk nor socket use [`paused`] instead: the
//! agent over a `MemoryStore` on a paused clock, in virtual time.

#![allow(dead_code)] // each test file uses its part of the harness

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_agent::AgentConfig;
use corral_agent::link::ClusterOptions;
use corral_client::Client;
use corral_cluster::{
    ClusterName, Family, GrantRecord, IpNet, Keys, NodeName, OwnedRecord, PoolName, encode_value,
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
    link: LinkSlot,
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
        let (task, link) = link_task(kv, options);
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
            link,
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

    /// Ends the cluster link's task at once, as a crash of the link alone would.
    pub fn kill_link(&self) {
        self.link.abort();
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
