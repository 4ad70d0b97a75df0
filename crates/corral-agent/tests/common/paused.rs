//! The paused-clock tier of the agent's cluster tests: the agent over a `MemoryStore` with its
//! committer inline (`corral_agent::testing::InMemoryAgent`), its link on a shared `MemKv`,
//! all on one current-thread runtime whose clock is paused (`#[tokio::test(start_paused =
//! true)]`), and requests made in-process to its router ([`Api`]), so nothing is ever in
//! progress off the runtime while tokio moves its clock to the next timer. The link's
//! timers, the pool wait and the lease TTLs run in virtual time: a test that waits 3 s takes
//! none, and a bound on how long something took is exact, so it cannot flake.

use std::time::Duration;

use corral_agent::AgentConfig;
use corral_agent::link::ClusterOptions;
use corral_agent::testing::InMemoryAgent;
use corral_api::{
    AllocateRequest, AllocateResponse, CniAddRequest, CniKeyRequest, DumpResponse, ErrorResponse,
    InterfacesResponse, PoolsResponse, ReleaseRequest, ReleaseResponse, StatusResponse, paths,
};
use corral_client::Error;
use corral_kv::MemKv;

use super::{LinkSlot, link_task};
use corral_store::MemoryStore;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An agent configuration with no pools of its own (the cluster grants them); its paths are
/// not used.
pub fn config() -> AgentConfig {
    super::config(std::path::Path::new("/nonexistent"))
}

/// A running in-memory agent with its cluster link.
pub struct MemAgent {
    agent: InMemoryAgent,
    link: LinkSlot,
}

impl MemAgent {
    /// Starts the agent on `store` and returns once it is ready (which says nothing of the
    /// link: see [`MemAgent::wait_registered`]).
    pub async fn start(
        kv: &MemKv,
        store: &MemoryStore,
        config: AgentConfig,
        options: ClusterOptions,
    ) -> MemAgent {
        let mut agent = MemAgent::spawn(kv, store, config, options);
        agent.ready().await;
        agent
    }

    /// [`MemAgent::start`] without waiting until it is ready: its API answers at once, as
    /// the socket does while the agent restores.
    pub fn spawn(
        kv: &MemKv,
        store: &MemoryStore,
        config: AgentConfig,
        options: ClusterOptions,
    ) -> MemAgent {
        let (task, link) = link_task(kv, options);
        let agent = InMemoryAgent::spawn(&config, store.clone(), Some(task))
            .expect("the agent starts restoring");
        MemAgent { agent, link }
    }

    /// Waits until the agent is ready.
    pub async fn ready(&mut self) {
        self.agent.ready().await.expect("the agent gets ready");
    }

    /// Waits until the link has registered the node.
    pub async fn wait_registered(self) -> MemAgent {
        let api = self.api();
        wait_for("registered", Duration::from_secs(10), async || {
            api.status(None)
                .await
                .unwrap()
                .cluster
                .is_some_and(|c| c.registered)
        })
        .await;
        self
    }

    pub fn api(&self) -> Api {
        Api {
            router: self.agent.router(),
        }
    }

    pub async fn cluster_status(&self) -> corral_api::ClusterStatus {
        self.api()
            .status(None)
            .await
            .unwrap()
            .cluster
            .expect("the agent reports its cluster link")
    }

    /// Waits (virtual time, up to 10 s) until the link's last error contains `needle`.
    pub async fn wait_last_error(&self, what: &str, needle: &str) {
        wait_for(what, Duration::from_secs(10), async || {
            self.cluster_status()
                .await
                .last_error
                .is_some_and(|e| e.contains(needle))
        })
        .await;
    }

    /// Ends the cluster link's task at once, as a crash of the link alone would.
    pub fn kill_link(&self) {
        self.link.abort();
    }

    /// Stops the agent cleanly and waits for it to finish.
    pub async fn stop(self) {
        self.agent.stop().await.unwrap();
    }
}

/// The agent's API called in-process, as corral-client calls it over the socket: the same
/// paths, bodies and errors.
#[derive(Clone)]
pub struct Api {
    router: axum::Router,
}

impl Api {
    /// The API of an agent started without a cluster link.
    pub fn of(agent: &InMemoryAgent) -> Api {
        Api {
            router: agent.router(),
        }
    }

    /// `GET /v1/history` with `query` (already encoded).
    pub async fn history(&self, query: &str) -> Result<corral_api::HistoryResponse, Error> {
        self.get(&format!("{}?{query}", paths::HISTORY)).await
    }

    /// Sends one request and returns the body of a 2xx answer.
    async fn call(
        &self,
        method: &str,
        path: &str,
        json: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, Error> {
        let (status, body) =
            corral_agent::testing::call(self.router.clone(), method, path, json).await;
        if (200..300).contains(&status) {
            return Ok(body);
        }
        Err(match serde_json::from_slice::<ErrorResponse>(&body) {
            Ok(response) => Error::Api {
                status,
                error: response.error,
            },
            Err(_) => Error::Status {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            },
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let body = self.call("GET", path, None).await?;
        Ok(serde_json::from_slice(&body).unwrap())
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        request: &B,
    ) -> Result<T, Error> {
        let json = serde_json::to_vec(request).unwrap();
        let body = self.call("POST", path, Some(json)).await?;
        Ok(serde_json::from_slice(&body).unwrap())
    }

    pub async fn metrics(&self) -> Result<String, Error> {
        let body = self.call("GET", paths::METRICS, None).await?;
        Ok(String::from_utf8(body).unwrap())
    }

    pub async fn status(&self, scope: Option<&str>) -> Result<StatusResponse, Error> {
        self.get(&with_scope(paths::STATUS, scope)).await
    }

    pub async fn pools(&self, scope: Option<&str>) -> Result<PoolsResponse, Error> {
        self.get(&with_scope(paths::POOLS, scope)).await
    }

    pub async fn lease_start(
        &self,
        request: &corral_api::LeaseStartRequest,
    ) -> Result<corral_api::Lease, Error> {
        self.post(paths::LEASE_START, request).await
    }

    pub async fn allocate(&self, request: &AllocateRequest) -> Result<AllocateResponse, Error> {
        self.post(paths::ALLOCATE, request).await
    }

    pub async fn release(&self, request: &ReleaseRequest) -> Result<ReleaseResponse, Error> {
        self.post(paths::RELEASE, request).await
    }

    pub async fn cni_add(&self, request: &CniAddRequest) -> Result<AllocateResponse, Error> {
        self.post(paths::CNI_ADD, request).await
    }

    pub async fn cni_del(&self, request: &CniKeyRequest) -> Result<ReleaseResponse, Error> {
        self.post(paths::CNI_DEL, request).await
    }

    pub async fn cni_check(&self, request: &CniKeyRequest) -> Result<AllocateResponse, Error> {
        self.post(paths::CNI_CHECK, request).await
    }

    pub async fn dump(&self, scope: Option<&str>) -> Result<DumpResponse, Error> {
        self.get(&with_scope(paths::DUMP, scope)).await
    }

    /// Every interface-backed pool (these tests filter by no pool).
    pub async fn interfaces(&self) -> Result<InterfacesResponse, Error> {
        self.get(paths::INTERFACES).await
    }
}

/// `path?scope=…` (the scope names these tests use need no escaping).
fn with_scope(path: &str, scope: Option<&str>) -> String {
    match scope {
        Some(scope) => format!("{path}?scope={scope}"),
        None => path.to_owned(),
    }
}

/// Polls `done` every 20 ms of virtual time until it holds; fails naming `what` if it does
/// not within `limit` of virtual time. On a paused clock that is no wall-clock bound: a
/// machine's load cannot make it fail, so `limit` may be as tight as the design says.
pub async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {limit:?} of virtual time: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
