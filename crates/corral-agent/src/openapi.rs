//! The OpenAPI 3.1 document of the REST API, built from the code so it cannot drift.
//!
//! Each operation is described on its handler in [`api`](crate::api) (`#[utoipa::path]`:
//! method, path, summary, parameters, body, success with its links, and the error statuses
//! it can answer), and [`api::routes`](crate::api::routes) both routes the handlers and
//! collects their operations, so no route goes undescribed, with the schemas of their
//! bodies: `corral-api`'s types (utoipa's `ToSchema`, behind corral-api's `openapi` feature),
//! corrected here. [`corral_api::openapi::document`] builds the rest, with error
//! responses whose `code` values are derived from
//! [`ErrorCode::status`](corral_api::ErrorCode::status), so a response schema promises
//! exactly the codes a status can carry. `tests/openapi.rs` keeps the committed
//! `openapi.json` (the file the agent serves at `/openapi.json`) equal to
//! [`render`]`(`[`document`]`())`, and checks every path of `corral_api::paths` is described
//! and every described operation is routed.

use corral_api as api;
pub use corral_api::openapi::render;
use corral_api::openapi::{self, Document, every_error_code, unsigned_64};
use serde_json::{Value, json};

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

/// The corrections of the schemas: addresses, and `u64`s.
fn fix_schema(value: &mut Value) {
    ip_addresses(value);
    unsigned_64(value);
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

/// The OpenAPI document of the agent's API.
pub fn document() -> Value {
    openapi::document(Document {
        title: "corral agent API",
        description: format!(
            "The REST API of corral-agent, on its unix socket (no authentication) and \
             optionally on a loopback TCP address (with a bearer token). Every body is \
             a JSON object of at most {} bytes; unknown fields are refused. Every error answers \
             an ErrorResponse with the status of its code; a path that does not exist \
             answers 404 and a path with a method it does not take answers 405 (see \
             the components Error404 and Error405).",
            api::MAX_BODY_BYTES
        ),
        api: crate::api::routes().into_openapi(),
        fix_schema,
        codes: every_error_code(),
        error_description,
    })
}
