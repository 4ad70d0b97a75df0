//! The OpenAPI 3.1 document of the REST API, built from the code so it cannot drift.
//!
//! The schemas of the bodies are derived from `corral-api`'s types (utoipa's `ToSchema`,
//! behind corral-api's `openapi` feature); the operations are listed here once per route of
//! [`api::router`](crate::api::router), with the error statuses each can answer. The error
//! responses' `code` values are derived from [`ErrorCode::status`], so a response schema
//! promises exactly the codes a status can carry. `tests/openapi.rs` keeps the committed
//! `openapi.json` (the file the agent serves at `/openapi.json`) equal to [`render`]`(`
//! [`document`]`())`, and checks every path of `corral_api::paths` is described.

use std::collections::BTreeMap;

use corral_api::openapi::{self, Schemas, error_response_name, name, schema_ref, unsigned_64};
pub use corral_api::openapi::{Success, render};
use corral_api::{self as api, ErrorCode, paths};
use serde_json::{Map, Value, json};

/// One operation: a method on a path, as `api::router` routes it.
#[derive(Clone, Copy, Debug)]
pub struct Operation {
    pub method: &'static str,
    pub path: &'static str,
    pub operation_id: &'static str,
    pub summary: &'static str,
    /// The component schema of the JSON body (always required), or `Some("")` for any JSON
    /// object.
    pub request: Option<&'static str>,
    /// Whether the operation takes the optional `?scope=` query parameter.
    pub scope_query: bool,
    /// Its other parameters (path and query).
    pub params: &'static [Param],
    pub success: Success,
    /// The error statuses the handler can answer besides 401 (every operation, on the TCP
    /// listener without the token).
    pub errors: &'static [u16],
}

/// A path or query parameter: name, where (`path`, `query`), its JSON type (`string`,
/// `boolean`), whether required, and what it is.
#[derive(Clone, Copy, Debug)]
pub struct Param(
    pub &'static str,
    pub &'static str,
    pub &'static str,
    pub bool,
    pub &'static str,
);

const ID: Param = Param("id", "path", "string", true, "The interface's ID");
const FORCE: Param = Param(
    "force",
    "query",
    "boolean",
    false,
    "Also when it holds allocations (released) or is the primary or a trunk interface",
);

/// An operation on the engines with a JSON body: 400, 413 and 415 for the body, 404 and
/// 409 from the engine, 503 while restoring or when the store fails.
const CHANGE: &[u16] = &[400, 404, 409, 413, 415, 503];
/// A read of one scope or all (`?scope=`).
const READ: &[u16] = &[400, 404, 503];

/// Every operation of the API, in the order `api::router` declares them.
pub fn operations() -> Vec<Operation> {
    let op = |method, path, operation_id, summary, request, success, errors| Operation {
        method,
        path,
        operation_id,
        summary,
        request,
        scope_query: false,
        params: &[],
        success,
        errors,
    };
    let read = |path, operation_id, summary, schema| Operation {
        scope_query: true,
        ..op(
            "get",
            path,
            operation_id,
            summary,
            None,
            Success::Json(schema),
            READ,
        )
    };
    vec![
        op(
            "get",
            paths::HEALTHZ,
            "healthz",
            "Liveness: answers `ok` as soon as the socket is bound; 503 once a sync of the \
             state's log has failed (the agent refuses every change until restarted)",
            None,
            Success::Text("text/plain", "`ok`"),
            &[503],
        ),
        op(
            "get",
            paths::READYZ,
            "readyz",
            "Readiness: `ready` once the state on disk is restored, else 503 (also once a \
             sync of the state's log has failed)",
            None,
            Success::Text("text/plain", "`ready`"),
            &[503],
        ),
        op(
            "get",
            paths::METRICS,
            "metrics",
            "Prometheus metrics in the OpenMetrics text format",
            None,
            Success::Text("application/openmetrics-text", "OpenMetrics text"),
            &[],
        ),
        op(
            "get",
            paths::OPENAPI,
            "openapi",
            "This document",
            None,
            Success::AnyObject("the OpenAPI document"),
            &[],
        ),
        op(
            "post",
            paths::ALLOCATE,
            "allocate",
            "Allocates the next free address (or a given one) of one family or both",
            Some(name::<api::AllocateRequest>()),
            Success::Json(name::<api::AllocateResponse>()),
            CHANGE,
        ),
        op(
            "post",
            paths::RELEASE,
            "release",
            "Releases by key, by address (optionally at a generation) or by owner",
            Some(name::<api::ReleaseRequest>()),
            Success::Json(name::<api::ReleaseResponse>()),
            CHANGE,
        ),
        op(
            "post",
            paths::LEASE_START,
            "lease_start",
            "Starts an expiration timer on an allocated address",
            Some(name::<api::LeaseStartRequest>()),
            Success::Json(name::<api::Lease>()),
            CHANGE,
        ),
        op(
            "post",
            paths::LEASE_STOP,
            "lease_stop",
            "Stops an address's expiration timer; the address stays allocated",
            Some(name::<api::LeaseStopRequest>()),
            Success::Json(name::<api::Done>()),
            CHANGE,
        ),
        read(
            paths::DUMP,
            "dump",
            "Every allocation, per scope and pool",
            name::<api::DumpResponse>(),
        ),
        read(
            paths::STATUS,
            "status",
            "Capacity and use per scope, pool and family",
            name::<api::StatusResponse>(),
        ),
        read(
            paths::POOLS,
            "pools",
            "The pools with their ranges and exclusions",
            name::<api::PoolsResponse>(),
        ),
        op(
            "post",
            paths::POOL_RANGES_ADD,
            "add_range",
            "Adds a range to a pool, creating the pool if it does not exist",
            Some(name::<api::RangeRequest>()),
            Success::Json(name::<api::Done>()),
            CHANGE,
        ),
        op(
            "post",
            paths::POOL_RANGES_REMOVE,
            "remove_range",
            "Removes a range; one that still holds allocations drains",
            Some(name::<api::RangeRequest>()),
            Success::Json(name::<api::RangeRemoved>()),
            CHANGE,
        ),
        op(
            "post",
            paths::POOL_EXCLUSIONS_ADD,
            "add_exclusion",
            "Excludes an address or a network from a pool",
            Some(name::<api::ExclusionRequest>()),
            Success::Json(name::<api::Done>()),
            CHANGE,
        ),
        op(
            "post",
            paths::POOL_EXCLUSIONS_REMOVE,
            "remove_exclusion",
            "Removes an exclusion (its `reason` is ignored)",
            Some(name::<api::ExclusionRequest>()),
            Success::Json(name::<api::Done>()),
            CHANGE,
        ),
        op(
            "post",
            paths::POOL_RESERVE_LOCAL_ROUTES,
            "reserve_local_routes",
            "Excludes from the pools every address the node's routes and interface addresses \
             cover that is not the pool's own, replacing the previous reservation's exclusions; \
             allocated addresses are reported as conflicts, never excluded or released",
            Some(name::<api::ReserveLocalRoutesRequest>()),
            Success::Json(name::<api::ReserveLocalRoutesResponse>()),
            &[400, 413, 415, 503],
        ),
        op(
            "get",
            paths::CHECKPOINT,
            "export_checkpoint",
            "Exports every scope as a checkpoint document (`corral-checkpoint/1`)",
            None,
            Success::AnyObject("the checkpoint document"),
            &[503],
        ),
        op(
            "post",
            paths::CHECKPOINT,
            "import_checkpoint",
            "Imports a checkpoint document into scopes that hold no allocations",
            Some(""),
            Success::Json(name::<api::Done>()),
            CHANGE,
        ),
        op(
            "post",
            paths::CNI_ADD,
            "cni_add",
            "CNI ADD: one address per set, all or nothing; idempotent per attachment",
            Some(name::<api::CniAddRequest>()),
            Success::Json(name::<api::AllocateResponse>()),
            CHANGE,
        ),
        op(
            "post",
            paths::CNI_DEL,
            "cni_del",
            "CNI DEL: releases the attachment's addresses",
            Some(name::<api::CniKeyRequest>()),
            Success::Json(name::<api::ReleaseResponse>()),
            CHANGE,
        ),
        op(
            "post",
            paths::CNI_CHECK,
            "cni_check",
            "CNI CHECK: the attachment's addresses (none if the network is unknown)",
            Some(name::<api::CniKeyRequest>()),
            Success::Json(name::<api::AllocateResponse>()),
            &[400, 413, 415, 503],
        ),
        op(
            "post",
            paths::CNI_GC,
            "cni_gc",
            "CNI GC: the leak collector over the network's attachments (see gc)",
            Some(name::<api::CniGcRequest>()),
            Success::Json(name::<api::GcResponse>()),
            CHANGE,
        ),
        op(
            "post",
            paths::CNI_STATUS,
            "cni_status",
            "CNI STATUS: the network's pools with their use",
            Some(name::<api::CniStatusRequest>()),
            Success::Json(name::<api::ScopeStatus>()),
            CHANGE,
        ),
        op(
            "post",
            paths::GC,
            "gc",
            "The leak collector over a scope's attachments: an allocation whose attachment is \
             not live is recorded as a suspect, and released by a later run past the grace \
             period that finds it still missing and unchanged, whole, within the cap",
            Some(name::<api::GcRequest>()),
            Success::Json(name::<api::GcResponse>()),
            CHANGE,
        ),
        Operation {
            params: &[Param(
                "pool",
                "query",
                "string",
                false,
                "Only this pool; every interface-backed pool of the node when absent",
            )],
            ..op(
                "get",
                paths::INTERFACES,
                "interfaces",
                "The node's interface-backed pools: each interface with its addresses and \
                 prefixes, how many are assigned and cooling, and which are freeable",
                None,
                Success::Json(name::<api::InterfacesResponse>()),
                READ,
            )
        },
        op(
            "post",
            paths::INTERFACES,
            "add_interface",
            "Adds an interface (and its addresses, all or nothing) to a pool of the node, which \
             becomes interface-backed; a pool with plain ranges is refused",
            Some(name::<api::InterfaceRequest>()),
            Success::Json(name::<api::InterfaceInfo>()),
            CHANGE,
        ),
        op(
            "post",
            paths::IMPORT_IPAMD,
            "import_ipamd",
            "Imports AWS VPC CNI's ipamd checkpoint (vpc-cni-ipam/1) into an interface-backed \
             pool: each allocation under its CNI key, all or nothing",
            Some(name::<api::IpamdImportRequest>()),
            Success::Json(name::<api::IpamdImportResponse>()),
            CHANGE,
        ),
        Operation {
            params: &[ID],
            ..op(
                "get",
                paths::INTERFACE,
                "interface",
                "One interface with its addresses, their use, and the freeable ones",
                None,
                Success::Json(name::<api::InterfaceInfo>()),
                READ,
            )
        },
        Operation {
            params: &[ID, FORCE],
            ..op(
                "delete",
                paths::INTERFACE,
                "remove_interface",
                "Removes an interface and its addresses from its pool; refused while it holds \
                 allocations, or is the primary or a trunk interface, unless forced",
                None,
                Success::Json(name::<api::InterfaceRemoved>()),
                &[400, 404, 409, 503],
            )
        },
        Operation {
            params: &[ID],
            ..op(
                "post",
                paths::INTERFACE_ADDRESSES,
                "add_interface_address",
                "Adds a secondary address (/32, /128) or delegated prefix (/28, /80) to an \
                 interface",
                Some(name::<api::InterfaceAddressRequest>()),
                Success::Json(name::<api::InterfaceInfo>()),
                CHANGE,
            )
        },
        Operation {
            params: &[
                ID,
                Param(
                    "address",
                    "query",
                    "string",
                    true,
                    "The secondary address or delegated prefix",
                ),
                FORCE,
            ],
            ..op(
                "delete",
                paths::INTERFACE_ADDRESSES,
                "remove_interface_address",
                "Removes an address or prefix from an interface; refused while it holds \
                 allocations unless forced",
                None,
                Success::Json(name::<api::InterfaceInfo>()),
                &[400, 404, 409, 503],
            )
        },
    ]
}

/// What a success hands to later operations (OpenAPI links): the address `allocate` returns
/// is what `release` and `lease_start` take, the lease id is what `lease_stop` takes, a
/// CNI network and key go on from ADD to CHECK, DEL, GC and STATUS. Each link gives the
/// whole body of the next request; `x-schemathesis` tells schemathesis' stateful phase to
/// send it as it is rather than merged into a generated one.
fn links(operation_id: &str) -> Vec<(&'static str, &'static str, Value)> {
    let network = "$request.body#/network";
    let key = "$request.body#/key";
    match operation_id {
        "allocate" => vec![
            (
                "StartLease",
                "lease_start",
                json!({"address": "$response.body#/allocations/0/address", "duration_ms": 60000}),
            ),
            (
                "ReleaseAddress",
                "release",
                json!({
                    "address": "$response.body#/allocations/0/address",
                    "generation": "$response.body#/allocations/0/generation"
                }),
            ),
            (
                "ReleaseOwner",
                "release",
                json!({"owner": "$request.body#/owner"}),
            ),
        ],
        "lease_start" => vec![(
            "StopLease",
            "lease_stop",
            json!({"address": "$request.body#/address", "id": "$response.body#/id"}),
        )],
        "add_range" => vec![
            (
                "RemoveRange",
                "remove_range",
                json!({"pool": "$request.body#/pool", "range": "$request.body#/range"}),
            ),
            (
                "AllocateFromPool",
                "allocate",
                json!({"owner": "linked", "pool": "$request.body#/pool"}),
            ),
        ],
        "add_interface" => vec![(
            "AllocateFromInterfaces",
            "allocate",
            json!({"owner": "linked", "pool": "$request.body#/pool"}),
        )],
        "add_exclusion" => vec![(
            "RemoveExclusion",
            "remove_exclusion",
            json!({"pool": "$request.body#/pool", "network": "$request.body#/network"}),
        )],
        "export_checkpoint" => vec![("Import", "import_checkpoint", json!("$response.body"))],
        "cni_add" => vec![
            (
                "Check",
                "cni_check",
                json!({"network": network, "key": key}),
            ),
            ("Del", "cni_del", json!({"network": network, "key": key})),
            (
                "Gc",
                "cni_gc",
                json!({"network": network, "valid_attachments": []}),
            ),
            ("Status", "cni_status", json!({"network": network})),
        ],
        _ => Vec::new(),
    }
}

/// The error statuses, each with the component response that describes it.
fn error_description(status: u16) -> &'static str {
    match status {
        400 => {
            "The body or query is malformed (not JSON, a field missing, unknown or of the wrong \
             type) or a value is invalid"
        }
        401 => "The TCP listener needs `Authorization: Bearer <token>`",
        404 => {
            "No such scope, pool, range, exclusion, allocation, lease, interface or interface \
             address"
        }
        405 => "The path exists with another method (any method not listed for a path)",
        409 => {
            "Refused: the address is held, unavailable or excluded, the pool is exhausted, or \
             the request conflicts with state"
        }
        413 => "The body is larger than the agent reads",
        415 => "The body is not declared as JSON (`Content-Type: application/json`)",
        503 => "The agent is restoring its state, or its store failed; retry later",
        _ => "An error",
    }
}

/// The JSON Schemas of every body type, by name, with the types they refer to.
fn component_schemas() -> BTreeMap<String, Value> {
    Schemas::default()
        .add::<api::AllocateRequest>()
        .add::<api::AllocateResponse>()
        .add::<api::ReleaseRequest>()
        .add::<api::ReleaseResponse>()
        .add::<api::LeaseStartRequest>()
        .add::<api::LeaseStopRequest>()
        .add::<api::Lease>()
        .add::<api::DumpResponse>()
        .add::<api::StatusResponse>()
        .add::<api::PoolsResponse>()
        .add::<api::RangeRequest>()
        .add::<api::RangeRemoved>()
        .add::<api::ExclusionRequest>()
        .add::<api::ReserveLocalRoutesRequest>()
        .add::<api::ReserveLocalRoutesResponse>()
        .add::<api::Done>()
        .add::<api::CniAddRequest>()
        .add::<api::CniKeyRequest>()
        .add::<api::CniGcRequest>()
        .add::<api::CniStatusRequest>()
        .add::<api::GcRequest>()
        .add::<api::GcResponse>()
        .add::<api::ScopeStatus>()
        .add::<api::InterfacesResponse>()
        .add::<api::InterfaceRequest>()
        .add::<api::InterfaceInfo>()
        .add::<api::InterfaceAddressRequest>()
        .add::<api::InterfaceRemoved>()
        .add::<api::IpamdImportRequest>()
        .add::<api::IpamdImportResponse>()
        .add::<api::ErrorResponse>()
        .into_json(|value| {
            ip_addresses(value);
            unsigned_64(value);
        })
}

/// corral-api marks its `IpAddr` fields with the format `ip` (utoipa knows no type for
/// them); here each becomes "an IPv4 or an IPv6 address" in standard formats, keeping a
/// `null` the field's type allows.
fn ip_addresses(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if object.get("format").and_then(Value::as_str) == Some("ip") {
                object.remove("format");
                let nullable = match object.remove("type") {
                    Some(Value::Array(types)) => types.iter().any(|t| t == "null"),
                    _ => false,
                };
                let mut any_of = vec![
                    json!({"type": "string", "format": "ipv4"}),
                    json!({"type": "string", "format": "ipv6"}),
                ];
                if nullable {
                    any_of.push(json!({"type": "null"}));
                }
                object.insert("anyOf".into(), Value::Array(any_of));
            }
            object.values_mut().for_each(ip_addresses);
        }
        Value::Array(items) => items.iter_mut().for_each(ip_addresses),
        _ => {}
    }
}

/// Every error code's serde name, with its status.
fn error_codes(schemas: &BTreeMap<String, Value>) -> Vec<(String, u16)> {
    let names = schemas[name::<ErrorCode>()]["enum"]
        .as_array()
        .expect("ErrorCode is an enum of strings");
    names
        .iter()
        .map(|name| {
            let code: ErrorCode =
                serde_json::from_value(name.clone()).expect("an ErrorCode schema name parses");
            (name.as_str().unwrap_or_default().to_owned(), code.status())
        })
        .collect()
}

/// The error response of a status: an [`api::ErrorResponse`] whose code is one of those
/// [`ErrorCode::status`] maps to it.
fn error_response(status: u16, codes: &[(String, u16)]) -> Value {
    let codes: Vec<&str> = codes
        .iter()
        .filter(|(_, s)| *s == status)
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(!codes.is_empty(), "no error code has status {status}");
    openapi::error_response(error_description(status), &codes)
}

fn operation(operation: &Operation) -> Value {
    let mut out = Map::new();
    out.insert("operationId".into(), operation.operation_id.into());
    out.insert("summary".into(), operation.summary.into());
    let mut parameters = Vec::new();
    if operation.scope_query {
        parameters.push(json!({
            "name": "scope",
            "in": "query",
            "required": false,
            "description": "Only this scope (the agent's own pools are in scope `node`); \
                            all scopes when absent",
            "schema": {"type": "string"}
        }));
    }
    for Param(name, location, kind, required, description) in operation.params {
        parameters.push(json!({
            "name": name,
            "in": location,
            "required": required,
            "description": description,
            "schema": {"type": kind}
        }));
    }
    if !parameters.is_empty() {
        out.insert("parameters".into(), Value::Array(parameters));
    }
    match operation.request {
        Some("") => {
            out.insert(
                "requestBody".into(),
                json!({
                    "required": true,
                    "content": {"application/json": {"schema": {"type": "object"}}}
                }),
            );
        }
        Some(name) => {
            out.insert(
                "requestBody".into(),
                json!({
                    "required": true,
                    "content": {"application/json": {"schema": schema_ref(name)}}
                }),
            );
        }
        None => {}
    }
    let mut responses = Map::new();
    let mut success = operation.success.response();
    let links: Map<String, Value> = links(operation.operation_id)
        .into_iter()
        .map(|(name, target, body)| {
            let link = json!({
                "operationId": target,
                "requestBody": body,
                "x-schemathesis": {"merge_body": false}
            });
            (name.to_owned(), link)
        })
        .collect();
    if !links.is_empty() {
        success["links"] = Value::Object(links);
    }
    responses.insert("200".into(), success);
    openapi::insert_error_refs(&mut responses, operation.errors);
    out.insert("responses".into(), Value::Object(responses));
    Value::Object(out)
}

/// The OpenAPI document of the agent's API.
pub fn document() -> Value {
    let schemas = component_schemas();
    let codes = error_codes(&schemas);
    let mut responses = Map::new();
    let mut statuses: Vec<u16> = codes.iter().map(|(_, status)| *status).collect();
    statuses.sort_unstable();
    statuses.dedup();
    for status in statuses {
        responses.insert(error_response_name(status), error_response(status, &codes));
    }
    let mut path_items: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for op in operations() {
        let item = path_items.entry(op.path).or_default();
        let previous = item.insert(op.method.into(), operation(&op));
        assert!(previous.is_none(), "{} {} listed twice", op.method, op.path);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "corral agent API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "The REST API of corral-agent, on its unix socket (no authentication) and \
                 optionally on a loopback TCP address (with a bearer token). Every body is \
                 a JSON object of at most {} bytes; unknown fields are refused. Every error answers \
                 an ErrorResponse with the status of its code; a path that does not exist \
                 answers 404 and a path with a method it does not take answers 405 (see \
                 the components Error404 and Error405).",
                api::MAX_BODY_BYTES
            ),
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}
        },
        "security": [{}, {"bearer": []}],
        "paths": path_items,
        "components": {
            "schemas": schemas,
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
