//! The operator's REST API (axum), with the agent's conventions: a unix socket (mode 0660)
//! and optionally a loopback TCP listener behind a bearer token; JSON bodies of
//! `corral_api::operator`, every failure a `corral_api::ErrorResponse`; the OpenAPI document
//! (`openapi-operator.json` at the repository root) served verbatim at `/openapi.json`.
//!
//! Read-only: every change goes through etcd (`corral cluster`, `corral node remove`).
//! Answers come from the leader's view; a standby answers the view's routes with 503 naming
//! itself, and `/v1/status`, `/healthz` and `/metrics` with what it knows. Unknown paths are
//! 404, other methods 405, a node name that is not a DNS-1123 subdomain 400; nothing a client
//! sends makes a handler panic.
//!
//! The dashboard's page (`dashboard.rs`) is served beside the API on both listeners, on TCP
//! without the token (it holds no data; its script sends the token with every API call).
//!
//! Each handler carries its OpenAPI operation (`#[utoipa::path]`); `routes` routes each on
//! the path given there and collects the operations for `openapi.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use corral_api::openapi::AnyObject;
use corral_api::operator::{self as body, paths};
use corral_api::{ErrorCode, ErrorResponse};
use corral_cluster::{ClusterView, NodeName};
/// The token type of [`ApiConfig`], read with its file checks (`BearerToken::read_file`).
pub use corral_http::BearerToken;
use corral_http::respond;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::listen;
use crate::state::Shared;

/// The OpenAPI document, as committed at the repository root.
pub const OPENAPI: &str = include_str!("../../../openapi-operator.json");

corral_api::error_statuses! {
    /// A route of the view, on a standby (or before the view is built).
    NotLeading = [503];
    /// A node by name: a name that is not a DNS-1123 subdomain, an unknown node, or a standby.
    NodeErrors = [400, 404, 503];
    /// A node's plan: also 409 when its node ID does not fit the plan.
    PlanErrors = [400, 404, 409, 503];
}

/// Where the API listens.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// The unix socket (no authentication; mode 0660).
    pub socket: PathBuf,
    /// A loopback TCP address, served only with `token`.
    pub tcp: Option<SocketAddr>,
    /// The bearer token the TCP listener requires (`Debug` shows `***`).
    pub token: Option<BearerToken>,
}

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("api socket {path}: {message}")]
    Socket { path: String, message: String },
    #[error("api tcp listener {addr}: {message}")]
    Tcp { addr: String, message: String },
}

/// The API serving; `stop` ends it and removes the socket.
#[derive(Debug)]
pub struct Api {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    socket: PathBuf,
    identity: corral_http::FileIdentity,
    tcp: Option<SocketAddr>,
}

impl Api {
    /// The TCP listener's address (its port, when bound to port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// Stops the listeners (connections finish their answers) and removes the socket, if
    /// the path still names the one bound.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        corral_http::remove_socket(&self.socket, self.identity);
    }
}

/// Checks the TCP settings (a loopback address, with a non-empty token), binds the socket (a
/// stale one is replaced; a live one refused) and the TCP listener, and serves.
pub async fn bind(config: ApiConfig, shared: Arc<Shared>) -> Result<Api, BindError> {
    let tcp_fail = |addr: &SocketAddr, message: String| BindError::Tcp {
        addr: addr.to_string(),
        message,
    };
    let token = match (
        &config.tcp,
        config.token.as_ref().map(|t| t.as_str().trim()),
    ) {
        (Some(addr), _) if !addr.ip().is_loopback() => {
            return Err(tcp_fail(
                addr,
                "not a loopback address; the API listens on 127.0.0.1 or ::1 only".into(),
            ));
        }
        (Some(addr), None | Some("")) => {
            return Err(tcp_fail(addr, "needs a bearer token (--token-file)".into()));
        }
        (_, token) => token.map(Arc::<str>::from),
    };
    let (unix, identity) =
        corral_http::bind_socket(&config.socket, "process").map_err(|message| {
            BindError::Socket {
                path: config.socket.display().to_string(),
                message,
            }
        })?;
    let tcp = match config.tcp {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| tcp_fail(&addr, e.to_string()))?,
        ),
        None => None,
    };
    let router = router(shared);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = vec![tokio::spawn(corral_http::serve(
        unix,
        format!("api socket {}", config.socket.display()),
        router.clone().merge(crate::dashboard::routes()),
        listen::MAX_UNIX_CONNECTIONS,
        listen::HEADER_TIMEOUT,
        stop_rx.clone(),
    ))];
    let mut tcp_addr = None;
    if let (Some(listener), Some(token)) = (tcp, token) {
        let addr = listener.local_addr().ok();
        tcp_addr = addr;
        tasks.push(tokio::spawn(corral_http::serve(
            listener,
            addr.map_or_else(|| "api tcp".to_owned(), |addr| format!("api tcp {addr}")),
            // The dashboard's page and assets hold no data: served without the token.
            crate::dashboard::routes().merge(with_token(router, token)),
            listen::MAX_TCP_CONNECTIONS,
            listen::HEADER_TIMEOUT,
            stop_rx,
        )));
    }
    Ok(Api {
        stop,
        tasks,
        socket: config.socket,
        identity,
        tcp: tcp_addr,
    })
}

#[derive(Clone)]
pub(crate) struct ApiState {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
}

/// The API's routes over `shared`.
pub fn router(shared: Arc<Shared>) -> Router {
    let mut registry = Registry::default();
    shared.register(&mut registry);
    let state = ApiState {
        shared,
        registry: Arc::new(registry),
    };
    Router::from(routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// The API's routes, each handler on the path its `#[utoipa::path]` gives: the router and the
/// OpenAPI document's operations (see `openapi.rs`) come from this one list.
pub(crate) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::default()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .routes(routes!(status))
        .routes(routes!(nodes))
        .routes(routes!(node))
        .routes(routes!(plan))
        .routes(routes!(pools))
        .routes(routes!(grants))
        .routes(routes!(history))
}

/// The routes behind a bearer token (the TCP listener); see `corral_http::with_token`.
pub fn with_token(router: Router, token: Arc<str>) -> Router {
    corral_http::with_token(router, token, || answer(ErrorResponse::unauthorized()))
}

fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    answer(ErrorResponse::new(code, message))
}

/// An error answer, with the status of its code.
fn answer(body: ErrorResponse) -> Response {
    let status =
        StatusCode::from_u16(body.error.code.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (status, Json(body)).into_response()
}

/// A refused request: its code and what was wrong (a `Response` is too large to pass around
/// in a `Result`).
pub(crate) struct Refusal(ErrorCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn not_leading(shared: &Shared) -> Response {
    error(ErrorCode::RetryLater, not_leading_message(shared))
}

/// `replica op-b does not lead (or has not built its view yet); ask the leader, op-a (its
/// election key's holder, as last read)`; `... no replica leads now` without one.
fn not_leading_message(shared: &Shared) -> String {
    let leader = match shared.leader_seen() {
        Some(leader) if leader == shared.replica => {
            "this replica leads but has not built its view yet; ask again".to_owned()
        }
        Some(leader) => {
            format!("ask the leader, {leader} (its election key's holder, as last read)")
        }
        None => "ask the leader (no replica leads now, as last read)".to_owned(),
    };
    format!(
        "replica {} does not lead (or has not built its view yet); {leader}",
        shared.replica
    )
}

async fn not_found() -> Response {
    error(ErrorCode::NotFound, respond::NO_SUCH_PATH)
}

async fn method_not_allowed() -> Response {
    error(ErrorCode::MethodNotAllowed, respond::OTHER_METHOD)
}

#[utoipa::path(
    get,
    path = paths::HEALTHZ,
    summary = "Liveness: `ok` as long as the process serves",
    responses((status = 200, description = "`ok`", body = String, content_type = "text/plain")),
)]
async fn healthz() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "ok\n",
    )
        .into_response()
}

#[utoipa::path(
    get,
    path = paths::READYZ,
    summary = "Readiness: `ready` while this replica leads and has built its view; 503 otherwise",
    responses(
        (status = 200, description = "`ready`", body = String, content_type = "text/plain"),
        NotLeading,
    ),
)]
async fn readyz(State(state): State<ApiState>) -> Response {
    let shared = &state.shared;
    if shared.leading() && shared.with_view(|_, _| ()).is_some() {
        (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "ready\n",
        )
            .into_response()
    } else {
        not_leading(shared)
    }
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

/// The registry's metrics, then the view's (nodes and CIDRs by state), one `# EOF` at the
/// end.
#[utoipa::path(
    get,
    path = paths::METRICS,
    summary = "Prometheus metrics in the OpenMetrics text format",
    responses(
        (
            status = 200,
            description = "OpenMetrics text",
            body = String,
            content_type = "application/openmetrics-text",
        ),
        NotLeading,
    ),
)]
async fn metrics(State(state): State<ApiState>) -> Response {
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode_registry(&mut text, &state.registry) {
        return error(ErrorCode::RetryLater, format!("metrics do not encode: {e}"));
    }
    if let Some(extra) = state.shared.with_view(|view, _| {
        let mut extra = view.metrics_text();
        extra.push_str(&view.block_metrics_text());
        extra.push_str(&crate::epoch::holdings_metrics_text(view));
        extra
    }) {
        text.push_str(&extra);
    }
    text.push_str(&state.shared.epoch_metrics_text());
    text.push_str(&state.shared.cloud_metrics_text());
    text.push_str(&state.shared.from_cloud_metrics_text());
    text.push_str(&state.shared.conditions.metrics_text());
    text.push_str("# EOF\n");
    respond::openmetrics(text)
}

#[utoipa::path(
    get,
    path = paths::STATUS,
    summary = "This replica (leading or not, problems) and, while it leads, the cluster: pools \
        with capacity, granted, quarantined and free node CIDRs per family, node counts",
    responses((status = 200, description = "Success", body = body::OperatorStatus)),
)]
async fn status(State(state): State<ApiState>) -> Json<body::OperatorStatus> {
    let shared = &state.shared;
    let cluster = shared.with_view(|view, revision| {
        let report = view.status_report(revision, Some(shared.replica.clone()));
        let full = report.full.clone();
        let status = body::ClusterStatus {
            revision: report.revision,
            leader: report.leader,
            nodes: report.nodes as u64,
            nodes_served: report.nodes_served as u64,
            nodes_waiting: report.nodes_waiting as u64,
            pools: report.pools.into_iter().map(pool_status).collect(),
            node_ids: report.node_ids.map(pool_status),
            removals_pending: report.removals_pending as u64,
            // Current problems first (recomputed from the view at each read): granting
            // paused, holdings without grants; then what applying keys ran into.
            problems: shared
                .granting_paused()
                .into_iter()
                .chain(crate::epoch::holdings_problems(view))
                .chain(report.problems)
                .collect(),
        };
        (status, full)
    });
    // Every starving node by pool and family, from the leader's view; a standby knows none.
    let (cluster, full) = match cluster {
        Some((status, full)) => (Some(status), full),
        None => (None, std::collections::BTreeMap::new()),
    };
    Json(body::OperatorStatus {
        replica: shared.replica.clone(),
        leading: shared.leading() && cluster.is_some(),
        took_lead_ms: shared.took_lead_in().map(|d| millis(d.as_millis())),
        last_rebuild: shared.last_rebuild().map(|(cost, took)| body::Rebuild {
            keys: cost.keys,
            requests: cost.requests,
            walked: cost.walked,
            ms: millis(took.as_millis()),
        }),
        full,
        problems: shared.problems(),
        current: shared
            .conditions
            .conditions()
            .into_iter()
            .map(|c| body::Problem {
                kind: c.kind.to_owned(),
                subject: c.subject,
                message: c.message,
                since_ms: c.since_ms,
                last_seen_ms: c.last_seen_ms,
            })
            .collect(),
        events: shared
            .conditions
            .events()
            .into_iter()
            .map(|e| body::ProblemEvent {
                at_ms: e.at_ms,
                kind: e.kind.to_owned(),
                subject: e.subject,
                message: e.message,
                resolved: e.resolved,
            })
            .collect(),
        cluster,
    })
}

fn node_waiting(wait: corral_cluster::WaitReport) -> body::NodeWaiting {
    body::NodeWaiting {
        what: wait.what,
        unit: wait.unit,
        reason: wait.reason,
        starving: wait.starving,
    }
}

fn millis(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}

fn pool_status(report: corral_cluster::report::PoolReport) -> body::PoolStatus {
    body::PoolStatus {
        pool: report.pool,
        family: report.family,
        node_prefix_len: report.node_prefix_len,
        capacity: report.capacity,
        granted: report.granted,
        quarantined: report.quarantined,
        reserved: report.reserved,
        blocked: report.blocked,
        free: report.free,
    }
}

/// Runs `f` on the view, or answers 503 on a standby.
fn on_view<T: serde::Serialize>(
    shared: &Shared,
    f: impl FnOnce(&ClusterView) -> Result<T, Refusal>,
) -> Response {
    match shared.with_view(|view, _| f(view)) {
        None => not_leading(shared),
        Some(Ok(value)) => Json(value).into_response(),
        Some(Err(refusal)) => refusal.into_response(),
    }
}

fn node_status(
    shared: &Shared,
    view: &ClusterView,
    report: corral_cluster::NodeReport,
) -> body::NodeStatus {
    let name = NodeName::new(&report.name).ok();
    let cloud = shared
        .cloud_node(&report.name)
        .into_iter()
        .map(|f| body::NodeCloud {
            pool: f.pool,
            family: f.family.name().to_owned(),
            used: f.stats.used.to_string(),
            available: f.stats.available.to_string(),
            capacity: f.stats.capacity.to_string(),
            needed: f.stats.needed.to_string(),
            excess: f.stats.excess.to_string(),
            at_capacity: f.at_capacity,
        })
        .collect();
    let cloud_interfaces = name
        .as_ref()
        .map(|name| {
            view.cloud_interfaces_of(name)
                .filter_map(|(id, entry)| {
                    let record = entry.record.as_ref()?;
                    Some(body::NodeCloudInterface {
                        id: id.to_string(),
                        pool: record.pool.to_string(),
                        device_index: record.device_index,
                        subnet_id: record.subnet_id.clone(),
                        attachment: match record.attachment {
                            corral_cluster::CloudAttachment::Attaching => "attaching",
                            corral_cluster::CloudAttachment::Attached => "attached",
                        }
                        .to_owned(),
                        managed: record.managed,
                        addresses: record.addresses.iter().map(ToString::to_string).collect(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let grants = NodeName::new(&report.name)
        .map(|name| {
            view.grants_of(&name)
                .into_iter()
                .map(|grant| body::NodeGrant {
                    pool: grant.pool.to_string(),
                    family: grant.family.name().to_owned(),
                    cidr: grant.cidr.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    let record = name
        .as_ref()
        .and_then(|name| view.holdings_of(name))
        .and_then(|entry| entry.record.as_ref());
    let holdings = record
        .map(|record| {
            record
                .ranges
                .iter()
                .map(|r| body::NodeHolding {
                    pool: r.pool.to_string(),
                    family: r.family().name().to_owned(),
                    cidr: r.cidr.to_string(),
                    allocated: r.allocations.to_string(),
                    size: range_size(&r.cidr).to_string(),
                    draining: r.draining,
                })
                .collect()
        })
        .unwrap_or_default();
    let (held, uncovered) = name
        .as_ref()
        .map(|name| {
            let held: Vec<String> = record
                .map(|record| {
                    record
                        .ranges
                        .iter()
                        .map(|r| {
                            format!(
                                "{} {}{} ({} allocated)",
                                r.pool,
                                r.cidr,
                                if r.draining { " draining" } else { "" },
                                r.allocations
                            )
                        })
                        .chain(record.node_ids().map(|id| format!("node-id {id}")))
                        .collect()
                })
                .unwrap_or_default();
            let uncovered: Vec<String> = view
                .uncovered_holdings()
                .into_iter()
                .filter(|(node, ..)| node == name)
                .map(|(_, pool, cidr)| format!("{pool} {cidr}"))
                .chain(
                    view.uncovered_node_ids()
                        .into_iter()
                        .filter(|(node, _)| node == name)
                        .map(|(_, id)| format!("node-id {id}")),
                )
                .collect();
            (held, uncovered)
        })
        .unwrap_or_default();
    body::NodeStatus {
        held,
        uncovered,
        holdings,
        name: report.name,
        uid: report.uid,
        registered_revision: report.registered_revision,
        grants,
        node_id: report.node_id,
        waiting_for: report.waiting_for,
        waiting: report.waiting.into_iter().map(node_waiting).collect(),
        removal_requested: report.removal_requested,
        blocks: report
            .blocks
            .into_iter()
            .map(|b| body::NodeBlocks {
                pool: b.pool,
                family: b.family,
                used: b.used.to_string(),
                available: b.available.to_string(),
                capacity: b.capacity.to_string(),
                needed: b.needed.to_string(),
                excess: b.excess.to_string(),
                blocks: b.blocks,
                in_handshake: b.in_handshake,
                at_capacity: b.at_capacity,
                has_demand: b.has_demand,
            })
            .collect(),
        cloud,
        cloud_interfaces,
    }
}

/// The addresses in `cidr` (2^128 for ::/0 does not fit: saturated).
fn range_size(cidr: &ipnet::IpNet) -> u128 {
    let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
    1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
}

#[utoipa::path(
    get,
    path = paths::NODES,
    summary = "Every registered node with its grants, node ID and what it still waits for",
    responses((status = 200, description = "Success", body = body::NodesResponse), NotLeading),
)]
async fn nodes(State(state): State<ApiState>) -> Response {
    on_view(&state.shared, |view| {
        let nodes = view
            .node_reports(None)
            .into_iter()
            .map(|report| node_status(&state.shared, view, report))
            .collect();
        Ok(body::NodesResponse { nodes })
    })
}

/// The node name of the path, validated: 400 naming the problem otherwise.
fn node_name(name: Result<UrlPath<String>, PathRejection>) -> Result<NodeName, Refusal> {
    let UrlPath(name) = name.map_err(|rejection| {
        Refusal(
            ErrorCode::BadRequest,
            format!("node name in the path: {}", rejection.body_text()),
        )
    })?;
    NodeName::new(&name).map_err(|e| Refusal(ErrorCode::BadRequest, e.to_string()))
}

#[utoipa::path(
    get,
    path = paths::NODE,
    summary = "One registered node",
    params(NodePath),
    responses((status = 200, description = "Success", body = body::NodeStatus), NodeErrors),
)]
async fn node(
    State(state): State<ApiState>,
    name: Result<UrlPath<String>, PathRejection>,
) -> Result<Response, Refusal> {
    let name = node_name(name)?;
    Ok(on_view(&state.shared, |view| {
        view.node_reports(None)
            .into_iter()
            .find(|report| report.name == name.as_str())
            .map(|report| node_status(&state.shared, view, report))
            .ok_or_else(|| not_registered(&name))
    }))
}

/// The path parameter of the routes of one node, for the API's document (the handlers take
/// the name as a string and check it with `node_name`).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct NodePath {
    /// The node's name (a DNS-1123 subdomain; anything else is 400)
    name: String,
}

fn not_registered(name: &NodeName) -> Refusal {
    Refusal(
        ErrorCode::NotFound,
        format!("node {name} is not registered"),
    )
}

#[utoipa::path(
    get,
    path = paths::NODE_PLAN,
    operation_id = "node_plan",
    summary = "The node's addresses under the node-ID plan (404 without a plan, an unknown node \
        or one without a node ID yet)",
    params(NodePath),
    responses((status = 200, description = "Success", body = body::NodePlan), PlanErrors),
)]
async fn plan(
    State(state): State<ApiState>,
    name: Result<UrlPath<String>, PathRejection>,
) -> Result<Response, Refusal> {
    let name = node_name(name)?;
    Ok(on_view(&state.shared, |view| {
        let Some(config) = view.config().node_ids.clone() else {
            return Err(Refusal(
                ErrorCode::NotFound,
                "the cluster has no node-ID plan ([node_ids]), so no node has a plan".into(),
            ));
        };
        if view.registration(&name).is_none() {
            return Err(not_registered(&name));
        }
        let Some(id) = view.node_id_of(&name) else {
            return Err(Refusal(
                ErrorCode::NotFound,
                format!("node {name} has no node ID yet"),
            ));
        };
        let plan = corral_cluster::NodePlan::derive(&config, id).map_err(|e| {
            Refusal(
                ErrorCode::Conflict,
                format!("plan of node {name} (node ID {id}): {e}"),
            )
        })?;
        Ok(body::NodePlan {
            node_id: plan.node_id,
            pod_subnet: plan.pod_subnet.to_string(),
            pod_gateway: plan.pod_gateway.to_string(),
            nat_loopback: plan.nat_loopback.to_string(),
            pod_range_start: plan.pod_range_start.to_string(),
            pod_range_end: plan.pod_range_end.to_string(),
            host_interconnect: plan.host_interconnect.to_string(),
            host_interconnect_vpp: plan.host_interconnect_vpp.to_string(),
            host_interconnect_linux: plan.host_interconnect_linux.to_string(),
            node_ip: plan.node_ip.to_string(),
            node_interconnect: plan.node_interconnect.to_string(),
            vxlan_ip: plan.vxlan_ip.to_string(),
            vxlan: plan.vxlan.to_string(),
            service: plan.service.to_string(),
        })
    }))
}

#[utoipa::path(
    get,
    path = paths::POOLS,
    summary = "The configured pools: each family's CIDRs, node prefix length, reserved ranges \
        and use",
    responses((status = 200, description = "Success", body = body::ClusterPools), NotLeading),
)]
async fn pools(State(state): State<ApiState>) -> Response {
    on_view(&state.shared, |view| {
        let pools = view
            .config()
            .pools
            .iter()
            .map(|pool| body::ClusterPool {
                name: pool.name.to_string(),
                families: pool
                    .families()
                    .map(|(family, config)| {
                        let stats = view.space(&pool.name, family).map(|space| space.stats());
                        let count = |f: fn(&corral_cluster::SpaceStats) -> u128| {
                            stats.as_ref().map_or(0, f).to_string()
                        };
                        body::ClusterPoolFamily {
                            family: family.name().to_owned(),
                            cidrs: config.cidrs.iter().map(ToString::to_string).collect(),
                            node_prefix_len: config.node_prefix_len,
                            reserved: config.reserved.iter().map(ToString::to_string).collect(),
                            capacity: count(|s| s.capacity),
                            granted: count(|s| s.granted),
                            quarantined: count(|s| s.quarantined),
                            reserved_cidrs: count(|s| s.reserved),
                            blocked: count(|s| s.blocked),
                            free: count(|s| s.free),
                        }
                    })
                    .collect(),
            })
            .collect();
        Ok(body::ClusterPools { pools })
    })
}

#[utoipa::path(
    get,
    path = paths::GRANTS,
    summary = "Every node CIDR and node ID granted to a registered node",
    responses((status = 200, description = "Success", body = body::GrantsResponse), NotLeading),
)]
async fn grants(State(state): State<ApiState>) -> Response {
    on_view(&state.shared, |view| {
        let mut grants = Vec::new();
        let mut node_ids = Vec::new();
        for (name, _) in view.nodes() {
            grants.extend(view.grants_of(name).into_iter().map(|grant| body::Grant {
                pool: grant.pool.to_string(),
                family: grant.family.name().to_owned(),
                cidr: grant.cidr.to_string(),
                node: name.to_string(),
            }));
            if let Some(id) = view.node_id_of(name) {
                node_ids.push(body::NodeIdGrant {
                    node: name.to_string(),
                    id,
                });
            }
        }
        Ok(body::GrantsResponse { grants, node_ids })
    })
}

/// `GET /v1/history`'s query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryParams {
    /// An address (who held the node CIDR or block containing it) or a CIDR
    address: Option<String>,
    /// Only grants held at this time: milliseconds since the epoch or RFC 3339 in UTC
    at: Option<String>,
    /// Everything this node held and holds
    node: Option<String>,
    /// At most this many events, newest first (default 100, at most 10000)
    limit: Option<usize>,
}

/// The history's events at most per answer.
const HISTORY_MAX_LIMIT: usize = 10_000;

/// The request a query asks for, or why it is refused.
pub(crate) fn history_request(
    params: HistoryParams,
) -> Result<crate::history::HistoryRequest, Refusal> {
    use crate::history::{HistoryQuery, HistoryRequest};
    let bad = |message: String| Refusal(ErrorCode::BadRequest, message);
    let query = match (params.address, params.node) {
        (Some(_), Some(_)) => return Err(bad("give address or node, not both".into())),
        (Some(address), None) => HistoryQuery::address_or_cidr(&address).ok_or_else(|| {
            bad(format!(
                "invalid address {:?}: an IP address or a CIDR",
                address.chars().take(64).collect::<String>()
            ))
        })?,
        (None, Some(node)) => {
            HistoryQuery::Node(NodeName::new(&node).map_err(|e| bad(e.to_string()))?)
        }
        (None, None) => HistoryQuery::Newest,
    };
    let at_ms = params
        .at
        .as_deref()
        .map(body::parse_at)
        .transpose()
        .map_err(bad)?;
    let limit = params.limit.unwrap_or(100);
    if limit == 0 || limit > HISTORY_MAX_LIMIT {
        return Err(bad(format!(
            "invalid limit {limit}: 1 to {HISTORY_MAX_LIMIT}"
        )));
    }
    Ok(HistoryRequest {
        query,
        at_ms,
        limit,
    })
}

#[utoipa::path(
    get,
    path = paths::HISTORY,
    summary = "Grants of node CIDRs and blocks, held and ended (from, to, why), newest first: of an address or CIDR (optionally at a time), of a node, or the newest",
    params(HistoryParams),
    responses(
        (status = 200, description = "Success", body = body::GrantHistory),
        (status = 400, description = "An invalid address, node, time or limit", body = ErrorResponse),
        (status = 503, description = "Not leading, or etcd did not answer", body = ErrorResponse),
    ),
)]
async fn history(
    State(state): State<ApiState>,
    params: Result<axum::extract::Query<HistoryParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let params = match params {
        Ok(axum::extract::Query(params)) => params,
        Err(rejection) => return error(ErrorCode::BadRequest, rejection.body_text()),
    };
    let request = match history_request(params) {
        Ok(request) => request,
        Err(refusal) => return refusal.into_response(),
    };
    let shared = &state.shared;
    // The newest events (the dashboard's "recent", polled): the grants held come from the
    // leader's view, not from a read of every `grants/` key.
    let newest = request.query == crate::history::HistoryQuery::Newest;
    let held_limit = if request.at_ms.is_some() {
        usize::MAX
    } else {
        request.limit
    };
    let (Some((config, held)), Some(reader)) = (
        shared.with_view(|view, _| {
            let held = newest.then(|| view.held_events(held_limit));
            (view.config().clone(), held)
        }),
        shared.history_reader(),
    ) else {
        return not_leading(shared);
    };
    match reader(config, request, held).await {
        Ok(events) => Json(crate::history::to_wire(events)).into_response(),
        Err(e) => error(ErrorCode::RetryLater, format!("grants' history: etcd: {e}")),
    }
}
