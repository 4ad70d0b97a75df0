//! The operator's REST API on a unix socket (mode 0660): status, nodes, a node's plan, pools,
//! and Prometheus metrics. Read-only: every change goes through etcd (`corral cluster`,
//! `corral node remove`). Answers come from the leader's view; a standby answers 503 naming
//! itself, except `/v1/status`, `/healthz` and `/metrics`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use corral_cluster::NodePlan;
use corral_kv::Kv;
use prometheus_client::registry::Registry;

use crate::state::Shared;

#[derive(Clone)]
struct ApiState {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
}

/// The API serving on its socket; `stop` ends it and removes the socket.
#[derive(Debug)]
pub struct Api {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
}

impl Api {
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket (a stale one is replaced; a live one refused) and serves.
pub async fn bind<K: Kv>(
    path: &Path,
    shared: Arc<Shared>,
    _kv: K,
    _cluster: String,
) -> std::io::Result<Api> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::other(format!(
            "{}: another process is listening on it",
            path.display()
        )));
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    let mut registry = Registry::default();
    shared.register(&mut registry);
    let state = ApiState {
        shared,
        registry: Arc::new(registry),
    };
    let router = axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/v1/nodes", get(nodes))
        .route("/v1/nodes/{name}", get(node))
        .route("/v1/nodes/{name}/plan", get(plan))
        .with_state(state);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    Ok(Api {
        stop,
        task,
        path: path.to_owned(),
    })
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

fn not_leading(shared: &Shared) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("replica {} does not lead; ask the leader", shared.replica),
    )
}

async fn metrics(State(state): State<ApiState>) -> Response {
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    if let Some(extra) = state.shared.with_view(|view, _| view.metrics_text()) {
        text = text.trim_end_matches("# EOF\n").to_owned();
        text.push_str(&extra);
        text.push_str("# EOF\n");
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn status(State(state): State<ApiState>) -> Response {
    let shared = &state.shared;
    let view = shared.with_view(|view, revision| {
        serde_json::to_value(view.status_report(revision, Some(shared.replica.clone())))
            .unwrap_or_default()
    });
    Json(serde_json::json!({
        "replica": shared.replica,
        "leading": shared.leading(),
        "took_lead_ms": shared.took_lead_in().map(|d| d.as_millis() as u64),
        "last_rebuild": shared.last_rebuild().map(|(keys, took)| serde_json::json!({
            "keys": keys, "ms": took.as_millis() as u64,
        })),
        "full": shared.full_pools(),
        "problems": shared.problems(),
        "cluster": view,
    }))
    .into_response()
}

async fn nodes(State(state): State<ApiState>) -> Response {
    match state
        .shared
        .with_view(|view, _| serde_json::to_value(view.node_reports(None)).unwrap_or_default())
    {
        Some(nodes) => Json(nodes).into_response(),
        None => not_leading(&state.shared),
    }
}

async fn node(State(state): State<ApiState>, UrlPath(name): UrlPath<String>) -> Response {
    let found = state.shared.with_view(|view, _| {
        view.node_reports(None)
            .into_iter()
            .find(|n| n.name == name)
            .map(|n| serde_json::to_value(n).unwrap_or_default())
    });
    match found {
        None => not_leading(&state.shared),
        Some(None) => error(
            StatusCode::NOT_FOUND,
            format!("node {name} is not registered"),
        ),
        Some(Some(node)) => Json(node).into_response(),
    }
}

#[allow(clippy::result_large_err)]
async fn plan(State(state): State<ApiState>, UrlPath(name): UrlPath<String>) -> Response {
    let found = state.shared.with_view(|view, _| {
        let Some(config) = view.config().node_ids.clone() else {
            return Err(error(
                StatusCode::NOT_FOUND,
                "the cluster has no node-ID plan ([node_ids])".into(),
            ));
        };
        let Some(id) = corral_cluster::NodeName::new(&name)
            .ok()
            .and_then(|node| view.node_id_of(&node))
        else {
            return Err(error(
                StatusCode::NOT_FOUND,
                format!("node {name} has no node ID"),
            ));
        };
        NodePlan::derive(&config, id)
            .map(|plan| serde_json::to_value(plan).unwrap_or_default())
            .map_err(|e| error(StatusCode::CONFLICT, e.to_string()))
    });
    match found {
        None => not_leading(&state.shared),
        Some(Err(response)) => response,
        Some(Ok(plan)) => Json(plan).into_response(),
    }
}
