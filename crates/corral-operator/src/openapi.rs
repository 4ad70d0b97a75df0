//! The OpenAPI 3.1 document of the operator's API, built from the code so it cannot drift.
//!
//! The schemas are derived from `corral_api::operator`'s types (utoipa's `ToSchema`, behind
//! corral-api's `openapi` feature); the operations are listed here once per route of
//! [`api::router`](crate::api::router), with the error statuses each can answer, and each
//! error status promises exactly the codes the operator answers with it.
//! `tests/openapi.rs` keeps the committed `openapi-operator.json` (the file served at
//! `/openapi.json`) equal to [`render`]`(`[`document`]`())`.

use std::collections::BTreeMap;

use corral_api::openapi::{self, Schemas, error_response_name, name, unsigned_64};
pub use corral_api::openapi::{Success, render};
use corral_api::operator::{self as body, paths};
use corral_api::{ErrorCode, ErrorResponse};
use serde_json::{Map, Value, json};

/// One operation: `GET` on a path, as `api::router` routes it.
#[derive(Clone, Copy, Debug)]
pub struct Operation {
    pub path: &'static str,
    pub operation_id: &'static str,
    pub summary: &'static str,
    /// Whether the path has the `{name}` parameter.
    pub node_name: bool,
    pub success: Success,
    /// The error statuses the handler can answer besides 401 (every operation, on the TCP
    /// listener without the token).
    pub errors: &'static [u16],
}

/// Every operation of the API, in the order `api::router` declares them.
pub fn operations() -> Vec<Operation> {
    let op = |path, operation_id, summary, success, errors| Operation {
        path,
        operation_id,
        summary,
        node_name: false,
        success,
        errors,
    };
    vec![
        op(
            paths::HEALTHZ,
            "healthz",
            "Liveness: `ok` as long as the process serves",
            Success::Text("text/plain", "`ok`"),
            &[],
        ),
        op(
            paths::READYZ,
            "readyz",
            "Readiness: `ready` while this replica leads and has built its view; 503 otherwise",
            Success::Text("text/plain", "`ready`"),
            &[503],
        ),
        op(
            paths::METRICS,
            "metrics",
            "Prometheus metrics in the OpenMetrics text format",
            Success::Text("application/openmetrics-text", "OpenMetrics text"),
            &[503],
        ),
        op(
            paths::OPENAPI,
            "openapi",
            "This document",
            Success::AnyObject("the OpenAPI document"),
            &[],
        ),
        op(
            paths::STATUS,
            "status",
            "This replica (leading or not, problems) and, while it leads, the cluster: pools \
             with capacity, granted, quarantined and free node CIDRs per family, node counts",
            Success::Json(name::<body::OperatorStatus>()),
            &[],
        ),
        op(
            paths::NODES,
            "nodes",
            "Every registered node with its grants, node ID and what it still waits for",
            Success::Json(name::<body::NodesResponse>()),
            &[503],
        ),
        Operation {
            node_name: true,
            ..op(
                paths::NODE,
                "node",
                "One registered node",
                Success::Json(name::<body::NodeStatus>()),
                &[400, 404, 503],
            )
        },
        Operation {
            node_name: true,
            ..op(
                paths::NODE_PLAN,
                "node_plan",
                "The node's addresses under the node-ID plan (404 without a plan, an unknown \
                 node or one without a node ID yet)",
                Success::Json(name::<body::NodePlan>()),
                &[400, 404, 409, 503],
            )
        },
        op(
            paths::POOLS,
            "pools",
            "The configured pools: each family's CIDRs, node prefix length, reserved ranges \
             and use",
            Success::Json(name::<body::ClusterPools>()),
            &[503],
        ),
        op(
            paths::GRANTS,
            "grants",
            "Every node CIDR and node ID granted to a registered node",
            Success::Json(name::<body::GrantsResponse>()),
            &[503],
        ),
    ]
}

/// The codes the operator answers with each error status.
fn codes(status: u16) -> &'static [ErrorCode] {
    match status {
        400 => &[ErrorCode::BadRequest],
        401 => &[ErrorCode::Unauthorized],
        404 => &[ErrorCode::NotFound],
        405 => &[ErrorCode::MethodNotAllowed],
        409 => &[ErrorCode::Conflict],
        503 => &[ErrorCode::RetryLater],
        _ => &[],
    }
}

/// Every error status the operator answers.
const STATUSES: &[u16] = &[400, 401, 404, 405, 409, 503];

fn error_description(status: u16) -> &'static str {
    match status {
        400 => "The node name is not a DNS-1123 subdomain",
        401 => "The TCP listener needs `Authorization: Bearer <token>`",
        404 => "No such node, plan or path",
        405 => "The path exists with another method (every path takes GET only)",
        409 => "The node's node ID does not fit the plan",
        503 => "This replica does not lead (or has not built its view yet); ask the leader",
        _ => "An error",
    }
}

/// The JSON Schemas of every body type, by name, with the types they refer to.
fn component_schemas() -> BTreeMap<String, Value> {
    Schemas::default()
        .add::<body::OperatorStatus>()
        .add::<body::Rebuild>()
        .add::<body::ClusterStatus>()
        .add::<body::PoolStatus>()
        .add::<body::NodesResponse>()
        .add::<body::NodeStatus>()
        .add::<body::NodeGrant>()
        .add::<body::NodeBlocks>()
        .add::<body::NodeCloud>()
        .add::<body::NodeCloudInterface>()
        .add::<body::ClusterPools>()
        .add::<body::ClusterPool>()
        .add::<body::ClusterPoolFamily>()
        .add::<body::GrantsResponse>()
        .add::<body::Grant>()
        .add::<body::NodeIdGrant>()
        .add::<body::NodePlan>()
        .add::<ErrorResponse>()
        .into_json(unsigned_64)
}

fn code_name(code: ErrorCode) -> String {
    serde_json::to_value(code)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .expect("an error code is a JSON string")
}

/// The error response of a status: an `ErrorResponse` whose code is one of those the
/// operator answers with it.
fn error_response(status: u16) -> Value {
    let names: Vec<String> = codes(status).iter().map(|c| code_name(*c)).collect();
    assert!(!names.is_empty(), "no error code for status {status}");
    for code in codes(status) {
        assert_eq!(code.status(), status, "{code:?} is not a {status}");
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    openapi::error_response(error_description(status), &names)
}

fn operation(operation: &Operation) -> Value {
    let mut out = Map::new();
    out.insert("operationId".into(), operation.operation_id.into());
    out.insert("summary".into(), operation.summary.into());
    if operation.node_name {
        out.insert(
            "parameters".into(),
            json!([{
                "name": "name",
                "in": "path",
                "required": true,
                "description": "The node's name (a DNS-1123 subdomain; anything else is 400)",
                "schema": {"type": "string"}
            }]),
        );
    }
    let success = operation.success.response();
    let mut responses = Map::new();
    responses.insert("200".into(), success);
    openapi::insert_error_refs(&mut responses, operation.errors);
    out.insert("responses".into(), Value::Object(responses));
    Value::Object(out)
}

/// The OpenAPI document of the operator's API.
pub fn document() -> Value {
    let mut responses = Map::new();
    for &status in STATUSES {
        responses.insert(error_response_name(status), error_response(status));
    }
    let mut path_items: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for op in operations() {
        let item = path_items.entry(op.path).or_default();
        let previous = item.insert("get".into(), operation(&op));
        assert!(previous.is_none(), "{} listed twice", op.path);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "corral operator API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The REST API of `corral operator`, on its unix socket (no \
                authentication) and optionally on a loopback TCP address (with a bearer \
                token). Every route is a GET: changes go through etcd. The view's routes \
                answer 503 on a standby replica. Every error answers an ErrorResponse with the \
                status of its code; a path that does not exist answers 404 and a path with a \
                method it does not take answers 405 (see the components Error404 and \
                Error405). Counts that can pass 2^53 are decimal strings.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}
        },
        "security": [{}, {"bearer": []}],
        "paths": path_items,
        "components": {
            "schemas": component_schemas(),
            "responses": responses,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Needed on the TCP listener only"
                }
            }
        }
    })
}
