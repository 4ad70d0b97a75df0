//! Test support (feature `testing`, which this crate's own tests enable): the agent over a
//! [`MemoryStore`], on tokio's clock, with its committer inline, driven in-process through its
//! router. This is what lets the agent's tests run on a paused clock (`start_paused`).
//!
//! Tokio's paused clock jumps to the next timer whenever the runtime is idle, also while
//! work is in progress off the runtime (a SQLite commit on the committer's thread, a request
//! on a real socket), so timeouts would fire early in virtual time. Here nothing leaves the
//! runtime: the store is memory, every batch runs on the caller's task
//! (`Committer::start_inline`), requests go to the router as calls, not over a socket, and
//! the node state reads its [`Clock`] from tokio's, so cooldowns and quarantine follow the
//! test's time. What the socket, SQLite and the restart after a crash do is the real-parts
//! tier's (`serve_with`), not this.
//!
//! Also ipamd's checkpoint as the AWS VPC CNI writes it ([`ipamd_entry`],
//! [`ipamd_checkpoint`]), for the import's tests here and in the command line's.

use corral_core::Timestamp;
use corral_store::{MemoryStore, StoreHealth};
use tokio::time::Instant;

use crate::committer::Committer;
use crate::config::AgentConfig;
use crate::node::{Clock, NodeState};
use crate::server::{AgentError, ClusterTask, app_state, run_started};

/// Tokio's clock, in the engine's time: the system's time when it was made, plus the time
/// tokio counts since (virtual on a paused runtime).
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    start: Instant,
    at_start: Timestamp,
}

impl TokioClock {
    /// A clock that reads the system's time now, and moves with tokio's from here.
    pub fn new() -> TokioClock {
        TokioClock {
            start: Instant::now(),
            at_start: crate::node::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Timestamp::from_unix_millis(self.at_start.as_unix_millis().saturating_add(elapsed))
    }
}

/// An agent over a [`MemoryStore`] running on the current runtime (see the module's doc):
/// what `serve_with` runs once its state is restored, with no socket, no local routes read
/// from the host and no DELs recorded by corral-ipam.
#[derive(Debug)]
pub struct InMemoryAgent {
    router: axum::Router,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<Result<(), AgentError>>>,
    /// Until [`InMemoryAgent::ready`] has seen it: fires once the agent is ready.
    is_ready: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl InMemoryAgent {
    /// Restores the agent from `store` (`config` gives its pools, `pool_wait` and timeouts;
    /// its paths are not used), starts it with its link to a cluster if any, and returns once
    /// it is ready (or failed).
    pub async fn start(
        config: &AgentConfig,
        store: MemoryStore,
        cluster: Option<ClusterTask>,
    ) -> Result<InMemoryAgent, AgentError> {
        let mut agent = InMemoryAgent::spawn(config, store, cluster)?;
        agent.ready().await?;
        Ok(agent)
    }

    /// [`InMemoryAgent::start`] without waiting until it is ready: its router answers at once,
    /// as the socket does while the agent restores (in a cluster, until the link holds the
    /// node's liveness key). [`InMemoryAgent::ready`] waits for the rest.
    pub fn spawn(
        config: &AgentConfig,
        store: MemoryStore,
        cluster: Option<ClusterTask>,
    ) -> Result<InMemoryAgent, AgentError> {
        let state = app_state(config, StoreHealth::default(), cluster.is_some());
        let router = crate::api::router(state.clone());
        let node = NodeState::restore_with(store, &config.pools, TokioClock::new())?
            .with_broken_gauge(std::sync::Arc::clone(&state.broken_scopes))
            .with_interface_counters(state.metrics.interface_counters.clone())
            .with_history(config.history);
        let committer = Committer::start_inline(node);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, is_ready) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let fatal = run_started(
                &state,
                &committer,
                cluster,
                false,
                tokio::sync::watch::channel(false),
                async move {
                    let _ = stopped.await;
                },
                move || {
                    let _ = ready.send(());
                },
            )
            .await;
            committer.close();
            match fatal {
                Some(message) => Err(AgentError::Cluster(message)),
                None => Ok(()),
            }
        });
        Ok(InMemoryAgent {
            router,
            stop: Some(stop),
            served: Some(served),
            is_ready: Some(is_ready),
        })
    }

    /// Waits until the agent is ready (at once if it was already), or failed.
    pub async fn ready(&mut self) -> Result<(), AgentError> {
        let Some(is_ready) = self.is_ready.take() else {
            return Ok(());
        };
        if is_ready.await.is_err() {
            return Err(self.join().await.err().unwrap_or_else(|| {
                AgentError::Io(std::io::Error::other(
                    "the agent stopped before it was ready",
                ))
            }));
        }
        Ok(())
    }

    /// The agent's API, to call as a service (`tower::Service`), as its socket would.
    pub fn router(&self) -> axum::Router {
        self.router.clone()
    }

    /// One request to the agent's API, as its socket would take it: the answer's status and
    /// body ([`call`]).
    pub async fn call(&self, method: &str, path: &str, json: Option<Vec<u8>>) -> (u16, Vec<u8>) {
        call(self.router(), method, path, json).await
    }

    /// Stops the agent (as SIGTERM would) and waits until it has.
    pub async fn stop(mut self) -> Result<(), AgentError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join().await
    }

    async fn join(&mut self) -> Result<(), AgentError> {
        match self.served.take() {
            Some(served) => served.await.unwrap_or_else(|error| {
                Err(AgentError::Io(std::io::Error::other(error.to_string())))
            }),
            None => Ok(()),
        }
    }
}

impl Drop for InMemoryAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// One request to an agent's API `router` (an [`InMemoryAgent::router`]), as its socket would
/// take it: `method` on `path` with a JSON body if any; the answer's status and body.
pub async fn call(
    mut router: axum::Router,
    method: &str,
    path: &str,
    json: Option<Vec<u8>>,
) -> (u16, Vec<u8>) {
    use tower_service::Service as _;
    let mut request = axum::http::Request::builder().method(method).uri(path);
    if json.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(axum::body::Body::from(json.unwrap_or_default()))
        .expect("a method and a path make a request");
    let response = router
        .call(request)
        .await
        .unwrap_or_else(|never| match never {});
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("an answer's body is in memory");
    (status, body.to_vec())
}

/// One allocation of ipamd's checkpoint, flat as the AWS VPC CNI writes it: container
/// `container` on `eth0` of network `aws-cni` holds `ipv4`, for pod `default/pod-<container>`.
pub fn ipamd_entry(container: &str, ipv4: &str) -> serde_json::Value {
    serde_json::json!({
        "networkName": "aws-cni",
        "containerID": container,
        "ifName": "eth0",
        "ipv4": ipv4,
        "allocationTimestamp": 1_700_000_000_000_000_000u64,
        "metadata": {"k8sPodNamespace": "default", "k8sPodName": format!("pod-{container}")}
    })
}

/// ipamd's checkpoint file (version `vpc-cni-ipam/1`) holding `entries`.
pub fn ipamd_checkpoint(entries: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({"version": "vpc-cni-ipam/1", "allocations": entries})
}
