//! The REST API (axum): JSON in and out, every failure an [`api::ErrorResponse`] with the
//! status its code carries. Bodies are limited to [`api::MAX_BODY_BYTES`]; malformed JSON,
//! a body that is not a JSON object, unknown fields and wrong types are 400s that name the
//! problem (quoting at most a prefix of the input); nothing a client sends can make a handler
//! panic or answer 5xx (503 only while restoring or when the store fails).
//!
//! Each handler carries its OpenAPI operation (`#[utoipa::path]`, the error statuses it can
//! answer named by the sets of `error_statuses!` below); [`routes()`] routes each on the method
//! and path given there and collects the operations for `openapi.rs`.

use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use corral_api::openapi::AnyObject;
use corral_api::{self as api, ErrorCode, paths};
use corral_core::{
    AttachmentKey, DEFAULT_GC_GRACE, DEFAULT_GC_MAX_RELEASED, Echo, Exclusion, Family, GcPolicy,
    InterfaceId, IpNet, MacAddr, PoolName, RangeSpec, Timestamp,
};
use corral_http::respond;
use corral_store::{PoolSpec, RangeEntry, RangeSource, RangeState, ScopeConfig, StoreHealth};
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::committer::Committer;
use crate::metrics::{Metrics, Operation, Outcome};
use crate::node::{self, OpError};

/// The OpenAPI document, as committed at the repository root.
pub const OPENAPI: &str = include_str!("../../../openapi.json");

corral_api::error_statuses! {
    /// A change with a JSON body: 400, 413 and 415 for the body, 404 and 409 from the
    /// engine, 503 while restoring or when the store fails.
    Change = [400, 404, 409, 413, 415, 503];
    /// A read of one scope or all (`?scope=`), or of one interface.
    Read = [400, 404, 503];
    /// A change with a JSON body that the engine cannot refuse (only a bad body, or not now).
    BodyErrors = [400, 413, 415, 503];
    /// A removal by path and query, without a body.
    Removal = [400, 404, 409, 503];
    /// Only while restoring, or once the store failed.
    Unavailable = [503];
}

/// What every handler shares.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Set once the state on disk is restored; until then requests get 503.
    pub committer: Arc<OnceLock<Committer>>,
    pub ready: Arc<AtomicBool>,
    /// Woken once `ready` is set (`AppState::set_ready`): ADDs and DELs that arrived while
    /// the agent restored wait for it.
    pub became_ready: Arc<tokio::sync::Notify>,
    /// Whether the store can still write: once a sync of its log failed, `/healthz` and
    /// `/readyz` answer 503 (a restart recovers from what the disk holds).
    pub store_health: StoreHealth,
    pub metrics: Arc<Metrics>,
    /// Scopes that could not be read back from the store after a failed commit (retried on
    /// use); `/readyz` answers 503 while there are any.
    pub broken_scopes: Arc<std::sync::atomic::AtomicUsize>,
    /// How long a request's body may take to arrive after its head.
    pub body_timeout: Duration,
    /// The agent's link to a cluster, when it runs with one (`corral agent --etcd`).
    pub cluster: Option<crate::link::SharedClusterState>,
    /// In a cluster, how long a CNI ADD to a node pool with nothing free waits for a grant.
    pub pool_wait: Duration,
    /// The latest CNI ADDs on node pools: the pool each used and why (`/v1/status`'s `adds`).
    pub adds: Arc<crate::adds::AddLog>,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError(pub OpError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.code.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let body = api::ErrorResponse { error: self.0.0 };
        (status, Json(body)).into_response()
    }
}

fn error(code: ErrorCode, message: impl Into<String>) -> ApiError {
    ApiError(OpError::new(code, message))
}

/// A JSON body, which must be an object; its rejections are API errors.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        // A client that sends a head and then the body slowly, or never, holds a connection
        // of its listener; the header timeout does not cover the body.
        let body = Json::<JsonObject<T>>::from_request(req, state);
        match tokio::time::timeout(state.body_timeout, body).await {
            Ok(Ok(Json(JsonObject(value)))) => Ok(Body(value)),
            Ok(Err(rejection)) => Err(json_rejection(rejection)),
            Err(_) => Err(error(
                ErrorCode::BadRequest,
                format!(
                    "the body did not arrive within {} ms of the request's head",
                    state.body_timeout.as_millis()
                ),
            )),
        }
    }
}

/// A value that must be sent as a JSON object. serde fills a struct from a JSON array too,
/// field by field in order, so `["pod-a"]` would pass for `{"owner": "pod-a"}`; every body
/// of the API is an object, and anything else is refused.
pub(crate) struct JsonObject<T>(pub(crate) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for JsonObject<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ObjectVisitor(PhantomData))
            .map(JsonObject)
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<T, A::Error> {
        Err(de::Error::custom(
            "the body must be a JSON object, not an array",
        ))
    }

    // serde's own message for a string quotes it whole.
    fn visit_str<E: de::Error>(self, _: &str) -> Result<T, E> {
        Err(de::Error::custom(
            "the body must be a JSON object, not a string",
        ))
    }
}

pub(crate) fn json_rejection(rejection: JsonRejection) -> ApiError {
    let code = match rejection.status() {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::TooLarge,
        _ => ErrorCode::BadRequest,
    };
    let message = match code {
        ErrorCode::UnsupportedMediaType => {
            "the body must be JSON, sent with Content-Type: application/json".to_owned()
        }
        ErrorCode::TooLarge => format!("the body is larger than {} bytes", api::MAX_BODY_BYTES),
        _ => shortened(rejection.body_text()),
    };
    error(code, message)
}

/// Longest rejection message, in characters: serde quotes an unknown variant or a value of a
/// wrong type whole, and a body may be a megabyte.
const MAX_REJECTION_CHARS: usize = 512;

fn shortened(mut message: String) -> String {
    if let Some((cut, _)) = message.char_indices().nth(MAX_REJECTION_CHARS) {
        message.truncate(cut);
        message.push_str("...");
    }
    message
}

/// The `?scope=` of a GET.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ScopeQuery {
    /// Only this scope (the agent's own pools are in scope `node`); all scopes when absent
    scope: Option<String>,
}

/// A query string, whose rejections are API errors.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(query_rejection(rejection)),
        }
    }
}

fn query_rejection(rejection: QueryRejection) -> ApiError {
    error(ErrorCode::BadRequest, shortened(rejection.body_text()))
}

impl AppState {
    /// The agent is ready: requests are served, and those waiting for it go on.
    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
        self.became_ready.notify_waiters();
    }

    /// Waits until the agent is ready, or `deadline` passes (then `false`): a CNI ADD or DEL
    /// that arrives while the agent restores its state (in a cluster, until it holds the
    /// node's liveness key) is held rather than refused at once.
    async fn wait_ready(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let woken = self.became_ready.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.ready.load(Ordering::Acquire) && self.committer.get().is_some() {
                return true;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return self.ready.load(Ordering::Acquire);
            }
        }
    }

    /// Runs one request through the committer, uncounted.
    async fn submit<R: node::Request>(&self, request: R) -> Result<R::Answer, OpError> {
        match self.committer.get() {
            Some(committer) if self.ready.load(Ordering::Acquire) => committer.call(request).await,
            _ => Err(OpError::new(
                ErrorCode::RetryLater,
                "the agent is restoring its state; retry shortly",
            )),
        }
    }

    /// Runs one request through the committer: durable when this returns `Ok`.
    async fn run<R: node::Request>(
        &self,
        operation: &'static str,
        request: R,
    ) -> Result<R::Answer, ApiError> {
        let started = Instant::now();
        let result = self.submit(request).await;
        self.count(operation, started, result.as_ref().err());
        result.map_err(ApiError)
    }

    /// Runs a request the API checked and turned into the node state's: a refusal of the
    /// check is answered, and counted, as the operation's.
    async fn run_checked<R: node::Request>(
        &self,
        operation: &'static str,
        request: Result<R, OpError>,
    ) -> Result<R::Answer, ApiError> {
        match request {
            Ok(request) => self.run(operation, request).await,
            Err(error) => {
                self.count(operation, Instant::now(), Some(&error));
                Err(ApiError(error))
            }
        }
    }

    /// Counts a request's outcome and latency, and logs a refusal: at debug level (a client's
    /// business), at error level when the store failed (the agent is broken until restarted).
    fn count(&self, operation: &'static str, started: Instant, failed: Option<&OpError>) {
        if let Some(error) = failed {
            if error.code == ErrorCode::StoreFailed {
                tracing::error!(operation, error = %error.message, "the store failed");
            } else {
                tracing::debug!(operation, code = ?error.code, error = %error.message, "refused");
            }
        }
        let counter = match operation {
            "allocate" | "cni_add" => Some(&self.metrics.allocations),
            "release" | "cni_del" | "cni_gc" | "gc" => Some(&self.metrics.releases),
            _ => None,
        };
        self.metrics
            .latency
            .get_or_create(&Operation {
                operation: operation.to_owned(),
            })
            .observe(started.elapsed().as_secs_f64());
        if let Some(counter) = counter {
            let outcome = match failed {
                None => "ok".to_owned(),
                Some(e) => serde_json::to_value(e.code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "error".into()),
            };
            counter.get_or_create(&Outcome { outcome }).inc();
        }
    }

    /// A CNI network on a node pool: the pool the agent chooses (see
    /// [`crate::link::blocks::resolve_pool`]), with the cluster's configuration when it has one.
    fn resolve_network(&self, network: &mut api::CniNetwork) -> Option<corral_cluster::PoolRule> {
        let sent = network.node_pool.clone()?;
        let config = self.cluster.as_ref().and_then(|c| c.blocks.config());
        // An older plugin sends only `node_pool` (its own choice): that is the configured
        // pool, unless it is the plugin's fallback.
        let configured = network
            .configured_pool
            .clone()
            .or_else(|| (sent != DEFAULT_NODE_POOL).then_some(sent));
        let (pool, rule) = crate::link::blocks::choose_pool(
            config.as_deref(),
            network.requested_pool.as_deref(),
            network.namespace.as_deref(),
            configured.as_deref(),
        );
        network.node_pool = Some(pool);
        Some(rule)
    }

    /// Something local changed that the demand of block pools follows.
    fn touch(&self) {
        if let Some(cluster) = &self.cluster {
            cluster.blocks.touch();
        }
    }
}

/// The pool corral-ipam names when neither the call nor the network names one.
const DEFAULT_NODE_POOL: &str = "default";

/// Whether an ADD's refusal says the node pool has nothing free now (no range yet, or every
/// range full): in a cluster, a grant may come.
fn waits_for_grant(error: &OpError) -> bool {
    match error.code {
        ErrorCode::Exhausted => true,
        ErrorCode::RetryLater => error.pool.is_some(),
        _ => false,
    }
}

/// The refusal of an ADD on a cluster pool of a node removed from the cluster.
fn removed_error(cluster: &crate::link::SharedClusterState, pool: &str) -> OpError {
    let node = cluster
        .lock()
        .map(|s| s.node.clone())
        .unwrap_or_else(|e| e.into_inner().node.clone());
    OpError::new(
        ErrorCode::Unavailable,
        format!(
            "node {node} is being removed from the cluster: it takes no new pods (pool \
                 {pool}); schedule the pod on another node"
        ),
    )
    .with_pool(pool)
}

/// Why the cluster has granted the node nothing in `pool`, as far as the agent can know: etcd
/// out of reach (the link's last error), the node not registered yet, no operator campaigning
/// (the `election/` keys the link follows), or, when none of these, only how long the pool
/// has waited: the agent watches its own grants, not the cluster's pool, so it cannot tell a
/// full pool from a leader's delay, and points to what can.
fn why_no_grant(cluster: &crate::link::ClusterShared, pool: &str) -> String {
    let waited = cluster.blocks.waited_in(pool).as_secs();
    let link = cluster.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let node = &link.node;
    let last_error = link.last_error.as_deref().unwrap_or("none recorded");
    if let Some(since) = link.degraded_since_ms {
        let for_s = crate::link::now_ms().saturating_sub(since) / 1000;
        return format!(
            "etcd cannot be reached (for {for_s} s; the link's last error: {last_error}), so \
             no grant can arrive"
        );
    }
    if !link.registered {
        return format!(
            "node {node} is not registered in the cluster yet (the link's last error: \
             {last_error})"
        );
    }
    // The leader's published decision (`owned/<node>/waiting`, read from the link's watch):
    // the pool exhausted, only quarantined space, granting paused, the instance at its limit.
    if let Some(cause) = link.waiting.as_ref().and_then(|w| {
        w.cause_of_pool(pool, crate::link::utc)
            .map(|cause| (cause, w.since_ms))
    }) {
        let (cause, since) = cause;
        return format!(
            "{cause} (the leader's decision about node {node} since {}); `corral explain node \
             {node}` says more",
            crate::link::utc(since)
        );
    }
    if link.election_read && link.leader.is_none() {
        return format!(
            "no operator is leading the cluster (none campaigns under its election/ keys), so \
             nothing grants node {node} space in pool {pool}; is `corral operator` running?"
        );
    }
    let leader = link
        .leader
        .as_deref()
        .map(|l| format!(" (operator {l} leads)"))
        .unwrap_or_default();
    format!(
        "the cluster has not granted node {node} space in pool {pool} for {waited} s{leader}; \
         `corral node show {node}` / `corral cluster status` say why"
    )
}

/// A CNI ADD on a node pool of an agent in a cluster: when the pool has nothing free, it
/// waits up to `pool_wait` for a grant (counted as pending in the pool's demand, which goes
/// out as soon as the once-a-second spacing of demand writes allows), trying again whenever the ranges change and every half second, outside the
/// committer, so other requests go on meanwhile; then it fails with `retry_later` naming the
/// pool (CNI code 11).
async fn cni_add_waiting(
    state: &AppState,
    cluster: &crate::link::SharedClusterState,
    pool: String,
    request: api::CniAddRequest,
    deadline: tokio::time::Instant,
) -> Result<api::AllocateResponse, OpError> {
    let started = Instant::now();
    let request = match node::CniAdd::try_from(request) {
        Ok(request) => request,
        Err(error) => {
            pool_outcome(state, &pool, "error");
            state.count("cni_add", started, Some(&error));
            return Err(error);
        }
    };
    allocate_waiting(state, cluster, pool, "cni_add", request, deadline).await
}

/// Counts an allocation's outcome in a cluster pool.
fn pool_outcome(state: &AppState, pool: &str, name: &str) {
    state
        .metrics
        .pool_allocations
        .get_or_create(&crate::metrics::PoolOutcome {
            pool: pool.to_owned(),
            outcome: name.to_owned(),
        })
        .inc();
}

/// An allocation (a CNI ADD, or `/v1/allocate`) in a pool of the cluster: waits for a grant
/// as [`cni_add_waiting`] says, then fails naming why none came.
async fn allocate_waiting<R>(
    state: &AppState,
    cluster: &crate::link::SharedClusterState,
    pool: String,
    operation: &'static str,
    request: R,
    deadline: tokio::time::Instant,
) -> Result<api::AllocateResponse, OpError>
where
    R: node::Request<Answer = api::AllocateResponse> + Clone,
{
    let started = Instant::now();
    let mut ranges = cluster.blocks.subscribe_ranges();
    ranges.borrow_and_update();
    let mut waiting = None;
    // `corral_pool_allocations_total` counts CNI ADDs only.
    let outcome = |name: &str| {
        if operation == "cni_add" {
            pool_outcome(state, &pool, name);
        }
    };
    loop {
        let result = state.submit(request.clone()).await;
        match result {
            Ok(reply) => {
                outcome(if waiting.is_some() { "waited_ok" } else { "ok" });
                drop(waiting);
                state.touch();
                state.count(operation, started, None);
                return Ok(reply);
            }
            // `/v1/allocate` finds no pool where the node has no range yet; an ADD says so
            // as `retry_later` (`waits_for_grant`).
            Err(error)
                if waits_for_grant(&error)
                    || (error.code == ErrorCode::NotFound
                        && error.pool.as_deref() == Some(pool.as_str())) =>
            {
                if cluster.is_removed() {
                    // Removed while it waited: no grant will come.
                    outcome("removed");
                    drop(waiting);
                    let error = removed_error(cluster, &pool);
                    state.count(operation, started, Some(&error));
                    return Err(error);
                }
                if tokio::time::Instant::now() >= deadline {
                    outcome("timeout");
                    // While this ADD still counts as waiting in the pool.
                    let why = why_no_grant(cluster, &pool);
                    drop(waiting);
                    let error = OpError::new(
                        ErrorCode::RetryLater,
                        format!(
                            "pool {pool} has no free address, and the cluster granted it \
                                 none within {} ms: {}; try again later",
                            state.pool_wait.as_millis(),
                            why
                        ),
                    )
                    .with_pool(&pool);
                    tracing::warn!(
                        %pool,
                        operation,
                        waited_ms = u64::try_from(state.pool_wait.as_millis()).unwrap_or(u64::MAX),
                        why = %why,
                        "an allocation found no free address and the cluster granted none in time"
                    );
                    state.count(operation, started, Some(&error));
                    return Err(error);
                }
                if waiting.is_none() {
                    waiting = Some(cluster.blocks.wait_in(&pool));
                }
                tokio::select! {
                    _ = ranges.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
            Err(error) => {
                outcome(if error.code == ErrorCode::Exhausted {
                    "exhausted"
                } else {
                    "error"
                });
                state.count(operation, started, Some(&error));
                return Err(error);
            }
        }
    }
}

macro_rules! answer {
    ($state:expr, $name:literal, $request:expr) => {
        $state.run($name, $request).await.map(Json)
    };
}

/// The answer of both probes once the store cannot write: the agent is alive but useless
/// until restarted, so liveness fails too and a supervisor restarts it.
fn store_failed() -> ApiError {
    error(
        ErrorCode::StoreFailed,
        "a sync of the state's write-ahead log failed (see the agent's log and the disk): \
         every change is refused until the agent is restarted, which recovers what is durable",
    )
}

#[utoipa::path(
    get,
    path = paths::HEALTHZ,
    summary = "Liveness: answers `ok` as soon as the socket is bound; 503 once a sync of the \
        state's log has failed (the agent refuses every change until restarted)",
    responses(
        (status = 200, description = "`ok`", body = String, content_type = "text/plain"),
        Unavailable,
    ),
)]
async fn healthz(State(state): State<AppState>) -> Response {
    if state.store_health.sync_failed() {
        return store_failed().into_response();
    }
    (StatusCode::OK, "ok\n").into_response()
}

#[utoipa::path(
    get,
    path = paths::READYZ,
    summary = "Readiness: `ready` once the state on disk is restored, else 503 (also once a \
        sync of the state's log has failed)",
    responses(
        (status = 200, description = "`ready`", body = String, content_type = "text/plain"),
        Unavailable,
    ),
)]
async fn readyz(State(state): State<AppState>) -> Response {
    let broken = state.broken_scopes.load(Ordering::Acquire);
    if state.store_health.sync_failed() {
        store_failed().into_response()
    } else if broken > 0 {
        error(
            ErrorCode::RetryLater,
            format!(
                "{broken} scope(s) could not be read back from the store after a failed \
                 commit; they are retried on use"
            ),
        )
        .into_response()
    } else if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else if let Some(waiting) = state.cluster.as_ref().and_then(|shared| {
        // Restored, waiting for the node's liveness key (another process holds it).
        shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_error
            .clone()
    }) {
        error(ErrorCode::RetryLater, format!("not serving yet: {waiting}")).into_response()
    } else {
        error(ErrorCode::RetryLater, "restoring state").into_response()
    }
}

#[utoipa::path(
    get,
    path = paths::METRICS,
    summary = "Prometheus metrics in the OpenMetrics text format",
    responses((
        status = 200,
        description = "OpenMetrics text",
        body = String,
        content_type = "application/openmetrics-text",
    )),
)]
async fn metrics(State(state): State<AppState>) -> Response {
    state
        .metrics
        .sync_failed
        .set(i64::from(state.store_health.sync_failed()));
    if let Some(cluster) = &state.cluster {
        let cluster = cluster.lock().unwrap_or_else(|e| e.into_inner());
        state
            .metrics
            .cluster_degraded
            .set(i64::from(cluster.degraded_since_ms.is_some()));
        state
            .metrics
            .cluster_registered
            .set(i64::from(cluster.registered));
    }
    let gauges = state
        .run("metrics", node::Gauges {})
        .await
        .unwrap_or_default();
    let interfaces = state
        .run("metrics", node::InterfaceGauges {})
        .await
        .unwrap_or_default();
    respond::openmetrics(state.metrics.render_with(&gauges, &interfaces))
}

#[utoipa::path(
    get,
    path = paths::OPENAPI,
    summary = "This document",
    responses((status = 200, description = "the OpenAPI document", body = inline(AnyObject))),
)]
async fn openapi() -> Response {
    respond::json_document(OPENAPI)
}

#[utoipa::path(
    post,
    path = paths::ALLOCATE,
    summary = "Allocates the next free address (or a given one) of one family or both",
    request_body = api::AllocateRequest,
    responses(
        (status = 200, description = "Success", body = api::AllocateResponse, links(
            ("StartLease" = (operation_id = "lease_start", request_body = json!({
                "address": "$response.body#/allocations/0/address",
                "duration_ms": 60000,
            }))),
            ("ReleaseAddress" = (operation_id = "release", request_body = json!({
                "address": "$response.body#/allocations/0/address",
                "generation": "$response.body#/allocations/0/generation",
            }))),
            ("ReleaseOwner" = (operation_id = "release", request_body = json!({
                "owner": "$request.body#/owner",
            }))),
        )),
        Change,
    ),
)]
async fn allocate(
    State(state): State<AppState>,
    Body(request): Body<api::AllocateRequest>,
) -> Result<Json<api::AllocateResponse>, ApiError> {
    let request = node::Allocate::try_from(request);
    // In a pool the cluster grants, the node's own scope: it waits for a grant as a CNI ADD
    // does (up to --pool-wait), and a refusal names why none came.
    let cluster = state.cluster.clone().filter(|cluster| {
        request.as_ref().is_ok_and(|allocate| {
            allocate.scope == api::NODE_SCOPE
                && cluster.blocks.config().is_some_and(|config| {
                    config
                        .pools
                        .iter()
                        .any(|p| p.name.as_str() == allocate.pool.as_str())
                })
        })
    });
    if let (Some(cluster), Ok(allocate)) = (cluster, &request) {
        if cluster.is_removed() {
            // As a CNI ADD: a removed node drains and takes no new pods (its cloud interfaces
            // are still there while the leader takes them away).
            let error = removed_error(&cluster, allocate.pool.as_str());
            state.count("allocate", Instant::now(), Some(&error));
            return Err(ApiError(error));
        }
        let deadline = tokio::time::Instant::now() + state.pool_wait;
        state.wait_ready(deadline).await;
        let pool = allocate.pool.as_str().to_owned();
        let answer = allocate_waiting(
            &state,
            &cluster,
            pool,
            "allocate",
            allocate.clone(),
            deadline,
        )
        .await
        .map(Json)
        .map_err(ApiError);
        state.touch();
        return answer;
    }
    let answer = state.run_checked("allocate", request).await.map(Json);
    // A block or cloud pool's demand follows what the API allocates too, not only CNI ADDs.
    state.touch();
    answer
}

#[utoipa::path(
    post,
    path = paths::RELEASE,
    summary = "Releases by key, by address (optionally at a generation) or by owner",
    request_body = api::ReleaseRequest,
    responses((status = 200, description = "Success", body = api::ReleaseResponse), Change),
)]
async fn release(
    State(state): State<AppState>,
    Body(request): Body<api::ReleaseRequest>,
) -> Result<Json<api::ReleaseResponse>, ApiError> {
    let request = node::Release::try_from(request);
    let answer = state.run_checked("release", request).await.map(Json);
    state.touch();
    answer
}

#[utoipa::path(
    post,
    path = paths::LEASE_START,
    summary = "Starts an expiration timer on an allocated address",
    request_body = api::LeaseStartRequest,
    responses(
        (status = 200, description = "Success", body = api::Lease, links(
            ("StopLease" = (operation_id = "lease_stop", request_body = json!({
                "address": "$request.body#/address",
                "id": "$response.body#/id",
            }))),
        )),
        Change,
    ),
)]
async fn lease_start(
    State(state): State<AppState>,
    Body(request): Body<api::LeaseStartRequest>,
) -> Result<Json<api::Lease>, ApiError> {
    let request = Ok(node::LeaseStart::from(request));
    let answer = state.run_checked("lease_start", request).await.map(Json);
    state.touch();
    answer
}

#[utoipa::path(
    post,
    path = paths::LEASE_STOP,
    summary = "Stops an address's expiration timer; the address stays allocated",
    request_body = api::LeaseStopRequest,
    responses((status = 200, description = "Success", body = api::Done), Change),
)]
async fn lease_stop(
    State(state): State<AppState>,
    Body(request): Body<api::LeaseStopRequest>,
) -> Result<Json<api::Done>, ApiError> {
    let request = node::LeaseStop::try_from(request);
    let answer = done(state.run_checked("lease_stop", request).await?);
    state.touch();
    answer
}

/// The answer of a change that answers nothing but that it is done.
fn done((): ()) -> Result<Json<api::Done>, ApiError> {
    Ok(Json(api::Done { ok: true }))
}

#[utoipa::path(
    get,
    path = paths::DUMP,
    summary = "Every allocation, per scope and pool",
    params(ScopeQuery),
    responses((status = 200, description = "Success", body = api::DumpResponse), Read),
)]
async fn dump(
    State(state): State<AppState>,
    Query(query): Query<ScopeQuery>,
) -> Result<Json<api::DumpResponse>, ApiError> {
    answer!(state, "dump", node::Dump(query.scope))
}

#[utoipa::path(
    get,
    path = paths::STATUS,
    summary = "Capacity and use per scope, pool and family",
    params(ScopeQuery),
    responses((status = 200, description = "Success", body = api::StatusResponse), Read),
)]
async fn status(
    State(state): State<AppState>,
    Query(query): Query<ScopeQuery>,
) -> Result<Json<api::StatusResponse>, ApiError> {
    let Json(mut status) = answer!(state, "status", node::Status(query.scope))?;
    status.cluster = state.cluster.as_ref().map(|shared| {
        let cluster = shared.lock().unwrap_or_else(|e| e.into_inner()).clone();
        crate::link::api_status(&cluster)
    });
    status.adds = state.adds.list();
    Ok(Json(status))
}

#[utoipa::path(
    get,
    path = paths::POOLS,
    summary = "The pools with their ranges and exclusions",
    params(ScopeQuery),
    responses((status = 200, description = "Success", body = api::PoolsResponse), Read),
)]
async fn pools(
    State(state): State<AppState>,
    Query(query): Query<ScopeQuery>,
) -> Result<Json<api::PoolsResponse>, ApiError> {
    answer!(state, "pools", node::Pools(query.scope))
}

#[utoipa::path(
    post,
    path = paths::POOL_RANGES_ADD,
    summary = "Adds a range to a pool, creating the pool if it does not exist",
    request_body = api::RangeRequest,
    responses(
        (status = 200, description = "Success", body = api::Done, links(
            ("RemoveRange" = (operation_id = "remove_range", request_body = json!({
                "pool": "$request.body#/pool",
                "range": "$request.body#/range",
            }))),
            ("AllocateFromPool" = (operation_id = "allocate", request_body = json!({
                "owner": "linked",
                "pool": "$request.body#/pool",
            }))),
        )),
        Change,
    ),
)]
async fn add_range(
    State(state): State<AppState>,
    Body(request): Body<api::RangeRequest>,
) -> Result<Json<api::Done>, ApiError> {
    let request = node::PoolRange::try_from(request).map(node::AddRange);
    done(state.run_checked("add_range", request).await?)
}

#[utoipa::path(
    post,
    path = paths::POOL_RANGES_REMOVE,
    summary = "Removes a range; one that still holds allocations drains",
    request_body = api::RangeRequest,
    responses((status = 200, description = "Success", body = api::RangeRemoved), Change),
)]
async fn remove_range(
    State(state): State<AppState>,
    Body(request): Body<api::RangeRequest>,
) -> Result<Json<api::RangeRemoved>, ApiError> {
    let request = node::PoolRange::try_from(request).map(node::RemoveRange);
    state.run_checked("remove_range", request).await.map(Json)
}

#[utoipa::path(
    post,
    path = paths::POOL_EXCLUSIONS_ADD,
    summary = "Excludes an address or a network from a pool",
    request_body = api::ExclusionRequest,
    responses(
        (status = 200, description = "Success", body = api::Done, links(
            ("RemoveExclusion" = (operation_id = "remove_exclusion", request_body = json!({
                "pool": "$request.body#/pool",
                "network": "$request.body#/network",
            }))),
        )),
        Change,
    ),
)]
async fn add_exclusion(
    State(state): State<AppState>,
    Body(request): Body<api::ExclusionRequest>,
) -> Result<Json<api::Done>, ApiError> {
    let request = node::AddExclusion::try_from(request);
    done(state.run_checked("add_exclusion", request).await?)
}

#[utoipa::path(
    post,
    path = paths::POOL_EXCLUSIONS_REMOVE,
    summary = "Removes an exclusion (its `reason` is ignored)",
    request_body = api::ExclusionRequest,
    responses((status = 200, description = "Success", body = api::Done), Change),
)]
async fn remove_exclusion(
    State(state): State<AppState>,
    Body(request): Body<api::ExclusionRequest>,
) -> Result<Json<api::Done>, ApiError> {
    let request = node::RemoveExclusion::try_from(request);
    done(state.run_checked("remove_exclusion", request).await?)
}

/// Reads the node's routes and addresses first (off the async threads), then reserves them
/// through the committer like any change.
#[utoipa::path(
    post,
    path = paths::POOL_RESERVE_LOCAL_ROUTES,
    summary = "Excludes from the pools every address the node's routes and interface addresses \
        cover that is not the pool's own, replacing the previous reservation's exclusions; \
        allocated addresses are reported as conflicts, never excluded or released",
    request_body = api::ReserveLocalRoutesRequest,
    responses(
        (status = 200, description = "Success", body = api::ReserveLocalRoutesResponse),
        BodyErrors,
    ),
)]
async fn reserve_local_routes(
    State(state): State<AppState>,
    Body(request): Body<api::ReserveLocalRoutesRequest>,
) -> Result<Json<api::ReserveLocalRoutesResponse>, ApiError> {
    crate::local_routes::check_scope(&request.scope).map_err(ApiError)?;
    let host = crate::netlink::read_host_networks_off_thread()
        .await
        .map_err(ApiError)?;
    let reserve = crate::local_routes::LocalRoutesRequest {
        scope: request.scope,
        host,
    };
    let response = state.run("reserve_local_routes", reserve).await?;
    crate::local_routes::log(&response);
    Ok(Json(response))
}

#[utoipa::path(
    get,
    path = paths::CHECKPOINT,
    operation_id = "export_checkpoint",
    summary = "Exports every scope as a checkpoint document (`corral-checkpoint/1`)",
    responses(
        (status = 200, description = "the checkpoint document", body = inline(AnyObject), links(
            ("Import" = (operation_id = "import_checkpoint", request_body = "$response.body")),
        )),
        Unavailable,
    ),
)]
async fn export(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    answer!(state, "export", node::Export {})
}

#[utoipa::path(
    post,
    path = paths::CHECKPOINT,
    operation_id = "import_checkpoint",
    summary = "Imports a checkpoint document into scopes that hold no allocations",
    request_body = inline(AnyObject),
    responses((status = 200, description = "Success", body = api::Done), Change),
)]
async fn import(
    State(state): State<AppState>,
    Body(document): Body<serde_json::Value>,
) -> Result<Json<api::Done>, ApiError> {
    let checkpoint = serde_json::from_value(document)
        .map(node::Import)
        .map_err(|e| OpError::bad_request(format!("checkpoint: {e}")));
    done(state.run_checked("import", checkpoint).await?)
}

#[utoipa::path(
    post,
    path = paths::CNI_ADD,
    summary = "CNI ADD: one address per set, all or nothing; idempotent per attachment",
    request_body = api::CniAddRequest,
    responses(
        (status = 200, description = "Success", body = api::AllocateResponse, links(
            ("Check" = (operation_id = "cni_check", request_body = json!({
                "network": "$request.body#/network",
                "key": "$request.body#/key",
            }))),
            ("Del" = (operation_id = "cni_del", request_body = json!({
                "network": "$request.body#/network",
                "key": "$request.body#/key",
            }))),
            ("Gc" = (operation_id = "cni_gc", request_body = json!({
                "network": "$request.body#/network",
                "valid_attachments": [],
            }))),
            ("Status" = (operation_id = "cni_status", request_body = json!({
                "network": "$request.body#/network",
            }))),
        )),
        Change,
    ),
)]
async fn cni_add(
    State(state): State<AppState>,
    Body(mut request): Body<api::CniAddRequest>,
) -> Result<Json<api::AllocateResponse>, ApiError> {
    record_attachment(&request.key);
    // One bound for the whole wait, from arrival: the restore, then a grant.
    let deadline = tokio::time::Instant::now() + state.pool_wait;
    state.wait_ready(deadline).await;
    let rule = state.resolve_network(&mut request.network);
    let tracked = match (rule, &request.network.node_pool) {
        (Some(rule), Some(pool)) if request.network.pools.is_empty() => {
            Some(state.adds.track(api::AddRecord {
                key: request.key.clone(),
                owner: request.owner.clone(),
                pool: pool.clone(),
                rule: rule.as_str().to_owned(),
                namespace: request.network.namespace.clone(),
                at_ms: crate::link::now_ms(),
                outcome: "waiting".to_owned(),
                error: None,
            }))
        }
        _ => None,
    };
    let reply = cni_add_to(&state, request, deadline).await;
    if let Some(tracked) = tracked {
        tracked.end(reply.as_ref().map(drop).map_err(|e| e.0.message.as_str()));
    }
    reply.map(Json)
}

/// The rest of [`cni_add`], once its pool is chosen.
async fn cni_add_to(
    state: &AppState,
    request: api::CniAddRequest,
    deadline: tokio::time::Instant,
) -> Result<api::AllocateResponse, ApiError> {
    let reply = match (&state.cluster, &request.network.node_pool) {
        (Some(cluster), Some(pool)) if request.network.pools.is_empty() => {
            if cluster.is_removed() {
                // Removed from the cluster: it drains and takes no new pods.
                let error = removed_error(cluster, pool);
                state.count("cni_add", Instant::now(), Some(&error));
                return Err(ApiError(error));
            }
            let pool = pool.clone();
            let cluster = Arc::clone(cluster);
            cni_add_waiting(state, &cluster, pool, request, deadline)
                .await
                .map_err(ApiError)?
        }
        _ => {
            let request = node::CniAdd::try_from(request);
            let reply = state.run_checked("cni_add", request).await?;
            state.touch();
            reply
        }
    };
    Ok(reply)
}

/// Names the CNI verb's attachment in its request's span (`corral_http`'s `request` span
/// leaves `container_id` and `ifname` for this).
fn record_attachment(key: &api::AttachmentKey) {
    let span = tracing::Span::current();
    span.record("container_id", key.container_id.as_str());
    span.record("ifname", key.ifname.as_str());
}

#[utoipa::path(
    post,
    path = paths::CNI_DEL,
    summary = "CNI DEL: releases the attachment's addresses",
    request_body = api::CniKeyRequest,
    responses((status = 200, description = "Success", body = api::ReleaseResponse), Change),
)]
async fn cni_del(
    State(state): State<AppState>,
    Body(mut request): Body<api::CniKeyRequest>,
) -> Result<Json<api::ReleaseResponse>, ApiError> {
    record_attachment(&request.key);
    // A DEL refused while restoring would be recorded by corral-ipam, and applied only at
    // the agent's next start or the attachment's next ADD: it waits for the agent instead.
    state
        .wait_ready(tokio::time::Instant::now() + state.pool_wait)
        .await;
    state.resolve_network(&mut request.network);
    let request = node::CniDel::try_from(request);
    let answer = state.run_checked("cni_del", request).await.map(Json);
    state.touch();
    answer
}

#[utoipa::path(
    post,
    path = paths::CNI_CHECK,
    summary = "CNI CHECK: the attachment's addresses (none if the network is unknown)",
    request_body = api::CniKeyRequest,
    responses((status = 200, description = "Success", body = api::AllocateResponse), BodyErrors),
)]
async fn cni_check(
    State(state): State<AppState>,
    Body(mut request): Body<api::CniKeyRequest>,
) -> Result<Json<api::AllocateResponse>, ApiError> {
    record_attachment(&request.key);
    state.resolve_network(&mut request.network);
    let request = node::CniCheck::try_from(request);
    state.run_checked("cni_check", request).await.map(Json)
}

#[utoipa::path(
    post,
    path = paths::CNI_GC,
    summary = "CNI GC: the leak collector over the network's attachments (see gc)",
    request_body = api::CniGcRequest,
    responses((status = 200, description = "Success", body = api::GcResponse), Change),
)]
async fn cni_gc(
    State(state): State<AppState>,
    Body(mut request): Body<api::CniGcRequest>,
) -> Result<Json<api::GcResponse>, ApiError> {
    state.resolve_network(&mut request.network);
    let request = node::CniGc::try_from(request);
    let answer = state.run_checked("cni_gc", request).await.map(Json);
    state.touch();
    answer
}

#[utoipa::path(
    post,
    path = paths::GC,
    summary = "The leak collector over a scope's attachments: an allocation whose attachment is \
        not live is recorded as a suspect, and released by a later run past the grace period \
        that finds it still missing and unchanged, whole, within the cap",
    request_body = api::GcRequest,
    responses((status = 200, description = "Success", body = api::GcResponse), Change),
)]
async fn gc(
    State(state): State<AppState>,
    Body(request): Body<api::GcRequest>,
) -> Result<Json<api::GcResponse>, ApiError> {
    let request = node::Gc::try_from(request);
    let answer = state.run_checked("gc", request).await.map(Json);
    state.touch();
    answer
}

#[utoipa::path(
    post,
    path = paths::CNI_STATUS,
    summary = "CNI STATUS: the network's pools with their use",
    request_body = api::CniStatusRequest,
    responses((status = 200, description = "Success", body = api::ScopeStatus), Change),
)]
async fn cni_status(
    State(state): State<AppState>,
    Body(mut request): Body<api::CniStatusRequest>,
) -> Result<Json<api::ScopeStatus>, ApiError> {
    state.resolve_network(&mut request.network);
    let request = node::CniStatus::try_from(request);
    state.run_checked("cni_status", request).await.map(Json)
}

#[utoipa::path(
    get,
    path = paths::INTERFACES,
    summary = "The node's interface-backed pools: each interface with its addresses and \
        prefixes, how many are assigned and cooling, and which are freeable",
    params(api::PoolQuery),
    responses((status = 200, description = "Success", body = api::InterfacesResponse), Read),
)]
async fn interfaces(
    State(state): State<AppState>,
    Query(query): Query<api::PoolQuery>,
) -> Result<Json<api::InterfacesResponse>, ApiError> {
    let pool = query.pool.as_deref().map(pool_name).transpose();
    let request = pool.map(node::Interfaces);
    state.run_checked("interfaces", request).await.map(Json)
}

/// The query of `GET /v1/history`; every filter given must match.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// Only events of this address
    address: Option<String>,
    /// With `address`: who held it at this instant, answered in `held` (RFC 3339, e.g.
    /// `2026-11-27T14:02:00Z`, UTC when the zone is left out, or milliseconds since the epoch)
    at: Option<String>,
    /// Only events of this owner: a pod as `NAMESPACE/NAME`, or the owner of an allocation
    /// through the API
    pod: Option<String>,
    /// Only events of this attachment: `CONTAINER_ID` or `CONTAINER_ID/IFNAME`
    key: Option<String>,
    /// Only events at or after this time (as `at`)
    since: Option<String>,
    /// Only events at or before this time (as `at`)
    until: Option<String>,
    /// At most this many events, newest first (default 100, at most 10000)
    limit: Option<u64>,
}

impl TryFrom<HistoryParams> for node::History {
    type Error = OpError;

    fn try_from(params: HistoryParams) -> Result<node::History, OpError> {
        let time = |name: &str, text: Option<&String>| {
            text.map(|text| {
                api::history::parse_time(text)
                    .map(Timestamp::from_unix_millis)
                    .map_err(|e| OpError::bad_request(format!("{name}: {e}")))
            })
            .transpose()
        };
        let addr = params
            .address
            .as_deref()
            .map(|text| {
                text.parse::<IpAddr>().map_err(|_| {
                    OpError::bad_request(format!("address {}: not an IP address", Echo(text)))
                })
            })
            .transpose()?;
        let at = time("at", params.at.as_ref())?;
        let since = time("since", params.since.as_ref())?;
        let until = time("until", params.until.as_ref())?;
        let held_at = match (addr, at) {
            (Some(addr), Some(at)) => Some((addr, at)),
            (None, Some(_)) => return Err(OpError::bad_request("at goes with address")),
            (_, None) => None,
        };
        if let (Some(since), Some(until)) = (since, until)
            && since > until
        {
            return Err(OpError::bad_request("since is after until"));
        }
        let limit = params.limit.unwrap_or(api::history::DEFAULT_HISTORY_LIMIT);
        if limit == 0 || limit > api::history::MAX_HISTORY_LIMIT {
            return Err(OpError::bad_request(format!(
                "limit {limit}: give 1 to {}",
                api::history::MAX_HISTORY_LIMIT
            )));
        }
        let (container_id, ifname) = match params.key.as_deref() {
            None => (None, None),
            Some(key) => {
                let (id, ifname) = match key.split_once('/') {
                    Some((id, ifname)) => (id, Some(ifname)),
                    None => (key, None),
                };
                if id.is_empty() || ifname.is_some_and(str::is_empty) {
                    return Err(OpError::bad_request(format!(
                        "key {}: give CONTAINER_ID or CONTAINER_ID/IFNAME",
                        Echo(key)
                    )));
                }
                (Some(id.to_owned()), ifname.map(str::to_owned))
            }
        };
        if params.pod.as_deref() == Some("") {
            return Err(OpError::bad_request("pod is empty"));
        }
        Ok(node::History {
            query: corral_store::HistoryQuery {
                addr,
                owner: params.pod,
                container_id,
                ifname,
                since,
                until,
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
            },
            held_at,
        })
    }
}

#[utoipa::path(
    get,
    path = paths::HISTORY,
    summary = "The allocation history, newest first: allocations and releases with their time, \
        address, pool, attachment, owner and generation; with `address` and `at`, who held the \
        address at that instant",
    params(HistoryParams),
    responses((status = 200, description = "Success", body = api::HistoryResponse), Read),
)]
async fn history(
    State(state): State<AppState>,
    Query(params): Query<HistoryParams>,
) -> Result<Json<api::HistoryResponse>, ApiError> {
    let request = node::History::try_from(params);
    state.run_checked("history", request).await.map(Json)
}

/// The `{id}` of an interface path; what it must look like is the node state's to say (400).
fn interface_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|rejection| error(ErrorCode::BadRequest, shortened(rejection.body_text())))
}

#[utoipa::path(
    get,
    path = paths::INTERFACE,
    summary = "One interface with its addresses, their use, and the freeable ones",
    params(("id" = String, Path, description = "The interface's ID")),
    responses((status = 200, description = "Success", body = api::InterfaceInfo), Read),
)]
async fn interface(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<api::InterfaceInfo>, ApiError> {
    let id = interface_id(id)?;
    let request = checked_interface_id(&id).map(node::Interface);
    state.run_checked("interface", request).await.map(Json)
}

#[utoipa::path(
    post,
    path = paths::INTERFACES,
    summary = "Adds an interface (and its addresses, all or nothing) to a pool of the node, \
        which becomes interface-backed; a pool with plain ranges is refused",
    request_body = api::InterfaceRequest,
    responses(
        (status = 200, description = "Success", body = api::InterfaceInfo, links(
            ("AllocateFromInterfaces" = (operation_id = "allocate", request_body = json!({
                "owner": "linked",
                "pool": "$request.body#/pool",
            }))),
        )),
        Change,
    ),
)]
async fn add_interface(
    State(state): State<AppState>,
    Body(request): Body<api::InterfaceRequest>,
) -> Result<Json<api::InterfaceInfo>, ApiError> {
    let request = node::AddInterface::try_from(request);
    state.run_checked("add_interface", request).await.map(Json)
}

#[utoipa::path(
    delete,
    path = paths::INTERFACE,
    summary = "Removes an interface and its addresses from its pool; refused while it holds \
        allocations, or is the primary or a trunk interface, unless forced",
    params(("id" = String, Path, description = "The interface's ID"), api::ForceQuery),
    responses((status = 200, description = "Success", body = api::InterfaceRemoved), Removal),
)]
async fn remove_interface(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    Query(query): Query<api::ForceQuery>,
) -> Result<Json<api::InterfaceRemoved>, ApiError> {
    let id = interface_id(id)?;
    let op = checked_interface_id(&id).map(|id| node::RemoveInterface {
        id,
        force: query.force,
    });
    state.run_checked("remove_interface", op).await.map(Json)
}

#[utoipa::path(
    post,
    path = paths::INTERFACE_ADDRESSES,
    summary = "Adds a secondary address (/32, /128) or delegated prefix (/28, /80) to an interface",
    params(("id" = String, Path, description = "The interface's ID")),
    request_body = api::InterfaceAddressRequest,
    responses((status = 200, description = "Success", body = api::InterfaceInfo), Change),
)]
async fn add_interface_address(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    Body(request): Body<api::InterfaceAddressRequest>,
) -> Result<Json<api::InterfaceInfo>, ApiError> {
    let id = interface_id(id)?;
    let op = interface_address(&id, &request.address)
        .map(|(id, address)| node::AddInterfaceAddress { id, address });
    state
        .run_checked("add_interface_address", op)
        .await
        .map(Json)
}

#[utoipa::path(
    delete,
    path = paths::INTERFACE_ADDRESSES,
    summary = "Removes an address or prefix from an interface; refused while it holds \
        allocations unless forced",
    params(
        ("id" = String, Path, description = "The interface's ID"),
        api::InterfaceAddressQuery,
    ),
    responses((status = 200, description = "Success", body = api::InterfaceInfo), Removal),
)]
async fn remove_interface_address(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    Query(query): Query<api::InterfaceAddressQuery>,
) -> Result<Json<api::InterfaceInfo>, ApiError> {
    let id = interface_id(id)?;
    let op =
        interface_address(&id, &query.address).map(|(id, address)| node::RemoveInterfaceAddress {
            id,
            address,
            force: query.force,
        });
    state
        .run_checked("remove_interface_address", op)
        .await
        .map(Json)
}

#[utoipa::path(
    post,
    path = paths::IMPORT_IPAMD,
    summary = "Imports AWS VPC CNI's ipamd checkpoint (vpc-cni-ipam/1) into an interface-backed \
        pool: each allocation under its CNI key, all or nothing",
    request_body = api::IpamdImportRequest,
    responses((status = 200, description = "Success", body = api::IpamdImportResponse), Change),
)]
async fn import_ipamd(
    State(state): State<AppState>,
    Body(request): Body<api::IpamdImportRequest>,
) -> Result<Json<api::IpamdImportResponse>, ApiError> {
    let request = node::ImportIpamd::try_from(request);
    state.run_checked("import_ipamd", request).await.map(Json)
}

async fn not_found() -> ApiError {
    error(ErrorCode::NotFound, respond::NO_SUCH_PATH)
}

async fn method_not_allowed() -> ApiError {
    error(ErrorCode::MethodNotAllowed, respond::OTHER_METHOD)
}

/// The API's routes, each handler on the method and path its `#[utoipa::path]` gives: the
/// router and the OpenAPI document's operations (see `openapi.rs`) come from this one list.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::default()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .routes(routes!(allocate))
        .routes(routes!(release))
        .routes(routes!(lease_start))
        .routes(routes!(lease_stop))
        .routes(routes!(dump))
        .routes(routes!(status))
        .routes(routes!(pools))
        .routes(routes!(add_range))
        .routes(routes!(remove_range))
        .routes(routes!(add_exclusion))
        .routes(routes!(remove_exclusion))
        .routes(routes!(reserve_local_routes))
        .routes(routes!(export, import))
        .routes(routes!(cni_add))
        .routes(routes!(cni_del))
        .routes(routes!(cni_check))
        .routes(routes!(cni_gc))
        .routes(routes!(cni_status))
        .routes(routes!(gc))
        .routes(routes!(interfaces, add_interface))
        .routes(routes!(import_ipamd))
        .routes(routes!(interface, remove_interface))
        .routes(routes!(add_interface_address, remove_interface_address))
        .routes(routes!(history))
}

/// The API's routes, with the fallbacks for unknown paths (404) and methods (405).
pub fn router(state: AppState) -> Router {
    Router::from(routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .with_state(state)
}

/// The routes behind a bearer token (the TCP listener); see `corral_http::with_token`.
pub fn with_token(router: Router, token: Arc<str>) -> Router {
    corral_http::with_token(router, token, || {
        (
            StatusCode::UNAUTHORIZED,
            Json(api::ErrorResponse::unauthorized()),
        )
            .into_response()
    })
}

// ---- the edge: wire requests into the node state's --------------------------------------
//
// Each body is checked here, in the order the node state checked it before it took domain
// requests, so a bad one gets the same error and message; the node state parses no wire
// string. The pending DELs (`pending.rs`) are checked here too, as the DELs they stand for.

/// A family as the engine names it.
fn family_of(name: api::FamilyName) -> Family {
    match name {
        api::FamilyName::Ipv4 => Family::V4,
        api::FamilyName::Ipv6 => Family::V6,
    }
}

/// A pool's name, checked.
fn pool_name(text: &str) -> Result<PoolName, OpError> {
    PoolName::new(text).map_err(|e| OpError::invalid(&format!("pool {}", Echo(text)), &e))
}

/// An attachment's key, checked.
fn key_of(key: &api::AttachmentKey) -> Result<AttachmentKey, OpError> {
    AttachmentKey::new(&key.network, &key.container_id, &key.ifname)
        .map_err(|e| OpError::invalid("key", &e))
}

/// The configuration of a CNI network's own pools, as its scope stores it.
fn scope_config_of(pools: &[api::CniPool]) -> ScopeConfig {
    ScopeConfig {
        pools: pools
            .iter()
            .map(|p| PoolSpec {
                name: p.name.clone(),
                cooldown_ms: p.cooldown_ms,
                lowest_free: p.lowest_free,
                ranges: p
                    .ranges
                    .iter()
                    .map(|range| RangeEntry {
                        range: range.clone(),
                        source: RangeSource::Cni,
                        state: RangeState::Active,
                    })
                    .collect(),
                interfaces: Vec::new(),
                interface_backed: false,
                exclusions: p
                    .exclusions
                    .iter()
                    .map(|e| (e.network.clone(), e.reason.clone()))
                    .collect(),
            })
            .collect(),
    }
}

/// A configuration the plugin sent must at least parse; the engine refuses the rest.
fn validate_config(config: &ScopeConfig) -> Result<(), OpError> {
    for pool in &config.pools {
        pool_name(&pool.name)?;
        for range in &pool.ranges {
            range
                .range
                .parse::<RangeSpec>()
                .map_err(|e| OpError::bad_request(format!("range {}: {e}", Echo(&range.range))))?;
        }
        for (network, reason) in &pool.exclusions {
            Exclusion::parse(network, reason)
                .map_err(|e| OpError::bad_request(format!("exclusion {}: {e}", Echo(network))))?;
        }
    }
    Ok(())
}

/// The node pool a CNI network names, if it names one; with `pools` beside it, refused.
fn node_pool_of(network: &api::CniNetwork) -> Result<Option<PoolName>, OpError> {
    let Some(pool) = &network.node_pool else {
        return Ok(None);
    };
    if !network.pools.is_empty() {
        return Err(OpError::bad_request(format!(
            "network {:?}: node_pool and pools both given; a network allocates from a pool of \
             the agent's node scope or from its own pools, not both",
            network.name
        )));
    }
    pool_name(pool).map(Some)
}

/// The configuration of a network on its own pools, checked as its scope is built from it:
/// the network may not take the agent's own scope's name, and the configuration must parse.
fn own_network_config(network: &api::CniNetwork) -> Result<ScopeConfig, OpError> {
    if network.name == api::NODE_SCOPE {
        return Err(OpError::bad_request(format!(
            "network name {:?} is the agent's own scope",
            network.name
        )));
    }
    let config = scope_config_of(&network.pools);
    validate_config(&config)?;
    Ok(config)
}

/// The sets of an ADD on a node pool: only requested addresses, at most one per family (the
/// pool's families decide the rest).
fn node_pool_requested(
    pool: &PoolName,
    sets: &[api::CniSet],
) -> Result<Vec<(Family, IpAddr)>, OpError> {
    let mut requested: Vec<(Family, IpAddr)> = Vec::new();
    for set in sets {
        let Some(addr) = set.requested else {
            return Err(OpError::bad_request(
                "a network on a node pool takes sets only to request addresses; the pool's \
                 families decide the rest",
            ));
        };
        let family = Family::of(addr);
        if family != family_of(set.family) {
            return Err(OpError::bad_request(format!(
                "requested address {addr} is not of family {:?}",
                set.family
            )));
        }
        if requested.iter().any(|(f, _)| *f == family) {
            return Err(OpError::new(
                ErrorCode::Unavailable,
                format!(
                    "two {family} addresses requested from pool {pool}, which hands out one per \
                     family"
                ),
            ));
        }
        requested.push((family, addr));
    }
    Ok(requested)
}

/// The attachments a leak collection is told are live.
fn live_keys(keys: &[api::AttachmentKey]) -> Result<HashSet<AttachmentKey>, OpError> {
    keys.iter().map(key_of).collect()
}

/// A leak collection's policy, its defaults filled in.
fn gc_policy(grace_ms: Option<u64>, max_released: Option<u64>) -> Result<GcPolicy, OpError> {
    let max_released = match max_released {
        Some(0) => {
            return Err(OpError::bad_request(
                "max_released: 0 would release nothing; give at least 1",
            ));
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_GC_MAX_RELEASED,
    };
    Ok(GcPolicy {
        grace: grace_ms.map_or(DEFAULT_GC_GRACE, Duration::from_millis),
        max_released,
    })
}

/// An interface's address: a CIDR, or a bare address (as a /32 or /128).
fn net_or_addr(text: &str) -> Result<IpNet, OpError> {
    let net = if text.contains('/') {
        corral_core::parse_net(text)
    } else {
        corral_core::parse_addr(text).map(IpNet::from)
    };
    net.map_err(|e| OpError::bad_request(format!("address {}: {e}", Echo(text))))
}

/// An interface's id, checked.
fn checked_interface_id(text: &str) -> Result<InterfaceId, OpError> {
    InterfaceId::new(text).map_err(|e| OpError::bad_request(format!("interface id: {e}")))
}

impl TryFrom<api::AllocateRequest> for node::Allocate {
    type Error = OpError;

    fn try_from(request: api::AllocateRequest) -> Result<Self, OpError> {
        let pool = pool_name(&request.pool)?;
        let key = request.key.as_ref().map(key_of).transpose()?;
        let wanted = match (request.family, request.address) {
            (Some(api::FamilyChoice::Dual), Some(_)) => {
                return Err(OpError::bad_request(
                    "family dual allocates the next address of each family; it takes no address",
                ));
            }
            (Some(choice), Some(addr)) => {
                let wanted = match choice {
                    api::FamilyChoice::Ipv4 => Family::V4,
                    _ => Family::V6,
                };
                if Family::of(addr) != wanted {
                    return Err(OpError::bad_request(format!(
                        "address {addr} is not of family {choice:?}"
                    )));
                }
                node::Wanted::Address(addr)
            }
            (None, Some(addr)) => node::Wanted::Address(addr),
            (Some(api::FamilyChoice::Dual), None) => node::Wanted::Dual,
            (Some(api::FamilyChoice::Ipv6), None) => node::Wanted::Next(Family::V6),
            (Some(api::FamilyChoice::Ipv4) | None, None) => node::Wanted::Next(Family::V4),
        };
        Ok(node::Allocate {
            scope: request.scope,
            pool,
            owner: request.owner,
            key,
            wanted,
            lease: request.lease_ms.map(Duration::from_millis),
        })
    }
}

impl TryFrom<api::ReleaseRequest> for node::Release {
    type Error = OpError;

    fn try_from(request: api::ReleaseRequest) -> Result<Self, OpError> {
        let given = usize::from(request.key.is_some())
            + usize::from(request.address.is_some())
            + usize::from(request.owner.is_some());
        if given != 1 {
            return Err(OpError::bad_request(
                "give exactly one of key, address (with an optional generation) or owner",
            ));
        }
        if request.generation.is_some() && request.address.is_none() {
            return Err(OpError::bad_request("generation goes with address"));
        }
        let of = match (request.key, request.address, request.owner) {
            (Some(key), _, _) => node::ReleaseOf::Key(key_of(&key)?),
            (None, Some(address), _) => node::ReleaseOf::Address {
                address,
                generation: request.generation,
            },
            (None, None, owner) => node::ReleaseOf::Owner(owner.unwrap_or_default()),
        };
        Ok(node::Release {
            scope: request.scope,
            of,
        })
    }
}

/// A CNI network once its node pool (if any) and the verb's key are checked: a network on its
/// own pools must not take the node scope's name, and its configuration must parse.
fn cni_network(
    network: &api::CniNetwork,
    node_pool: Option<PoolName>,
) -> Result<node::CniNetwork, OpError> {
    let pools = match node_pool {
        Some(pool) => node::NetworkPools::Node(pool),
        None => node::NetworkPools::Own(own_network_config(network)?),
    };
    Ok(node::CniNetwork {
        name: network.name.clone(),
        pools,
    })
}

impl TryFrom<api::CniAddRequest> for node::CniAdd {
    type Error = OpError;

    fn try_from(request: api::CniAddRequest) -> Result<Self, OpError> {
        let node_pool = node_pool_of(&request.network)?;
        let key = key_of(&request.key)?;
        let sets = match node_pool {
            Some(pool) => {
                let requested = node_pool_requested(&pool, &request.sets)?;
                node::CniAddSets::Node { pool, requested }
            }
            None => {
                let sets = request
                    .sets
                    .iter()
                    .map(|set| {
                        Ok(node::CniSet {
                            pool: pool_name(&set.pool)?,
                            family: family_of(set.family),
                            requested: set.requested,
                        })
                    })
                    .collect::<Result<Vec<_>, OpError>>()?;
                let config = own_network_config(&request.network)?;
                node::CniAddSets::Own { config, sets }
            }
        };
        Ok(node::CniAdd {
            network: request.network.name,
            key,
            owner: request.owner,
            sets,
        })
    }
}

impl TryFrom<api::CniKeyRequest> for node::CniDel {
    type Error = OpError;

    fn try_from(request: api::CniKeyRequest) -> Result<Self, OpError> {
        let node_pool = node_pool_of(&request.network)?;
        let key = key_of(&request.key)?;
        Ok(node::CniDel {
            network: cni_network(&request.network, node_pool)?,
            key,
        })
    }
}

/// A CHECK reads the network's scope by name: its configuration is not checked.
impl TryFrom<api::CniKeyRequest> for node::CniCheck {
    type Error = OpError;

    fn try_from(request: api::CniKeyRequest) -> Result<Self, OpError> {
        let node_pool = node_pool_of(&request.network)?;
        let key = key_of(&request.key)?;
        Ok(node::CniCheck {
            network: request.network.name,
            node_pool,
            key,
        })
    }
}

impl TryFrom<api::CniStatusRequest> for node::CniStatus {
    type Error = OpError;

    fn try_from(request: api::CniStatusRequest) -> Result<Self, OpError> {
        let node_pool = node_pool_of(&request.network)?;
        Ok(node::CniStatus {
            network: cni_network(&request.network, node_pool)?,
        })
    }
}

impl TryFrom<api::CniGcRequest> for node::CniGc {
    type Error = OpError;

    fn try_from(request: api::CniGcRequest) -> Result<Self, OpError> {
        let live = live_keys(&request.valid_attachments)?;
        let policy = gc_policy(request.grace_ms, request.max_released)?;
        let node_pool = node_pool_of(&request.network)?;
        Ok(node::CniGc {
            network: cni_network(&request.network, node_pool)?,
            live,
            policy,
        })
    }
}

impl TryFrom<api::GcRequest> for node::Gc {
    type Error = OpError;

    fn try_from(request: api::GcRequest) -> Result<Self, OpError> {
        Ok(node::Gc {
            live: live_keys(&request.live)?,
            policy: gc_policy(request.grace_ms, request.max_released)?,
            scope: request.scope,
            dry_run: request.dry_run,
        })
    }
}

/// A lease's duration needs no check.
impl From<api::LeaseStartRequest> for node::LeaseStart {
    fn from(request: api::LeaseStartRequest) -> Self {
        node::LeaseStart {
            scope: request.scope,
            address: request.address,
            duration: Duration::from_millis(request.duration_ms),
        }
    }
}

impl TryFrom<api::LeaseStopRequest> for node::LeaseStop {
    type Error = OpError;

    fn try_from(request: api::LeaseStopRequest) -> Result<Self, OpError> {
        let id = corral_core::Uuid::parse_str(&request.id)
            .map_err(|e| OpError::bad_request(format!("lease id {}: {e}", Echo(&request.id))))?;
        Ok(node::LeaseStop {
            scope: request.scope,
            address: request.address,
            id,
        })
    }
}

impl TryFrom<api::RangeRequest> for node::PoolRange {
    type Error = OpError;

    fn try_from(request: api::RangeRequest) -> Result<Self, OpError> {
        let pool = pool_name(&request.pool)?;
        let range: RangeSpec = request
            .range
            .parse()
            .map_err(|e| OpError::bad_request(format!("range {}: {e}", Echo(&request.range))))?;
        Ok(node::PoolRange {
            scope: request.scope,
            pool,
            range,
        })
    }
}

impl TryFrom<api::ExclusionRequest> for node::AddExclusion {
    type Error = OpError;

    fn try_from(request: api::ExclusionRequest) -> Result<Self, OpError> {
        let pool = pool_name(&request.pool)?;
        let exclusion = Exclusion::parse(&request.network, &request.reason)
            .map_err(|e| OpError::bad_request(format!("exclusion: {e}")))?;
        Ok(node::AddExclusion {
            scope: request.scope,
            pool,
            exclusion,
        })
    }
}

impl TryFrom<api::ExclusionRequest> for node::RemoveExclusion {
    type Error = OpError;

    fn try_from(request: api::ExclusionRequest) -> Result<Self, OpError> {
        let pool = pool_name(&request.pool)?;
        let network = corral_core::parse_net(&request.network)
            .map_err(|e| OpError::bad_request(format!("network: {e}")))?;
        Ok(node::RemoveExclusion {
            scope: request.scope,
            pool,
            network,
        })
    }
}

/// An interface and one of its addresses, as the paths of its addresses name them.
fn interface_address(id: &str, address: &str) -> Result<(InterfaceId, IpNet), OpError> {
    Ok((checked_interface_id(id)?, net_or_addr(address)?))
}

impl TryFrom<api::InterfaceRequest> for node::AddInterface {
    type Error = OpError;

    fn try_from(request: api::InterfaceRequest) -> Result<Self, OpError> {
        let pool = pool_name(&request.pool)?;
        let id = checked_interface_id(&request.id)?;
        let mac: MacAddr = request
            .mac
            .parse()
            .map_err(|e| OpError::bad_request(format!("mac: {e}")))?;
        let parse_nets = |what: &str, texts: &[String]| -> Result<Vec<IpNet>, OpError> {
            texts
                .iter()
                .map(|text| {
                    corral_core::parse_net(text)
                        .map_err(|e| OpError::bad_request(format!("{what} {}: {e}", Echo(text))))
                })
                .collect()
        };
        let subnets = parse_nets("subnet", &request.subnets)?;
        if subnets.is_empty() {
            return Err(OpError::bad_request(
                "an interface needs its subnet (one per family)",
            ));
        }
        let routes = parse_nets("route", &request.routes)?;
        let addresses = request
            .addresses
            .iter()
            .map(|a| net_or_addr(a))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(node::AddInterface {
            pool,
            id,
            device_number: request.device_number,
            mac,
            subnets,
            gateways: request.gateways,
            routes,
            primary: request.primary,
            primary_addresses: request.primary_addresses,
            trunk: request.trunk,
            excluded: request.excluded,
            addresses,
        })
    }
}

impl TryFrom<api::IpamdImportRequest> for node::ImportIpamd {
    type Error = OpError;

    fn try_from(request: api::IpamdImportRequest) -> Result<Self, OpError> {
        let pool = pool_name(&request.pool)?;
        let allocations = crate::ipamd::parse_checkpoint(&request.checkpoint)
            .map_err(|e| OpError::bad_request(format!("ipamd checkpoint: {e}")))?;
        Ok(node::ImportIpamd { pool, allocations })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message<T: fmt::Debug>(checked: Result<T, OpError>) -> String {
        let error = checked.expect_err("refused");
        assert_eq!(error.code, ErrorCode::BadRequest, "{error:?}");
        error.0.message
    }

    fn allocate(family: Option<api::FamilyChoice>, address: Option<&str>) -> api::AllocateRequest {
        api::AllocateRequest {
            scope: api::NODE_SCOPE.into(),
            pool: "default".into(),
            owner: "pod".into(),
            key: None,
            family,
            address: address.map(|a| a.parse().unwrap()),
            lease_ms: None,
        }
    }

    fn network(node_pool: Option<&str>, name: &str) -> api::CniNetwork {
        match node_pool {
            Some(pool) => api::CniNetwork::on_node_pool(name, pool),
            None => api::CniNetwork::with_pools(name, vec![]),
        }
    }

    fn key() -> api::AttachmentKey {
        api::AttachmentKey {
            network: "net".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
        }
    }

    /// The edge refuses what the node state refused before it took domain requests, with the
    /// same messages.
    #[test]
    fn bad_bodies_are_refused_at_the_edge_with_their_messages() {
        let dual = allocate(Some(api::FamilyChoice::Dual), Some("10.0.0.1"));
        assert_eq!(
            message(node::Allocate::try_from(dual)),
            "family dual allocates the next address of each family; it takes no address"
        );
        let v6 = allocate(Some(api::FamilyChoice::Ipv6), Some("10.0.0.1"));
        assert_eq!(
            message(node::Allocate::try_from(v6)),
            "address 10.0.0.1 is not of family Ipv6"
        );
        let none = api::ReleaseRequest::default();
        assert_eq!(
            message(node::Release::try_from(none)),
            "give exactly one of key, address (with an optional generation) or owner"
        );
        let generation = api::ReleaseRequest {
            owner: Some("pod".into()),
            generation: Some(1),
            ..Default::default()
        };
        assert_eq!(
            message(node::Release::try_from(generation)),
            "generation goes with address"
        );
        let own_scope = api::CniKeyRequest {
            network: network(None, api::NODE_SCOPE),
            key: key(),
        };
        assert_eq!(
            message(node::CniDel::try_from(own_scope.clone())),
            "network name \"node\" is the agent's own scope"
        );
        // CHECK reads the scope by name: no configuration to check.
        assert!(node::CniCheck::try_from(own_scope).is_ok());
        let add = api::CniAddRequest {
            network: network(Some("pods"), "net"),
            key: key(),
            owner: "c1".into(),
            sets: vec![api::CniSet {
                pool: "pods".into(),
                family: api::FamilyName::Ipv4,
                requested: None,
            }],
        };
        assert_eq!(
            message(node::CniAdd::try_from(add)),
            "a network on a node pool takes sets only to request addresses; the pool's families \
             decide the rest"
        );
        let gc = api::GcRequest {
            scope: api::NODE_SCOPE.into(),
            live: vec![],
            grace_ms: None,
            max_released: Some(0),
            dry_run: false,
        };
        assert_eq!(
            message(node::Gc::try_from(gc)),
            "max_released: 0 would release nothing; give at least 1"
        );
    }
}
