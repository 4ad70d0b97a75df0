//! The OpenAPI 3.1 document of the operator's API, built from the code so it cannot drift.
//!
//! Each operation is described on its handler in [`api`](crate::api) (`#[utoipa::path]`:
//! path, summary, parameter, success and the error statuses it can answer), and
//! `api::routes` both routes the handlers and collects their operations, with the schemas of
//! their bodies (`corral_api::operator`'s types, utoipa's `ToSchema` behind corral-api's
//! `openapi` feature); [`corral_api::openapi::document`] builds the rest, with a response per
//! error status that promises exactly the codes the operator answers with it.
//! `tests/openapi.rs` keeps the committed `openapi-operator.json` (the file served at
//! `/openapi.json`) equal to [`render`]`(`[`document`]`())`.

use corral_api::ErrorCode;
pub use corral_api::openapi::render;
use corral_api::openapi::{self, Document, unsigned_64};
use serde_json::Value;

/// The codes the operator answers, one per error status.
const CODES: &[ErrorCode] = &[
    ErrorCode::BadRequest,
    ErrorCode::Unauthorized,
    ErrorCode::NotFound,
    ErrorCode::MethodNotAllowed,
    ErrorCode::Conflict,
    ErrorCode::RetryLater,
];

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

/// The OpenAPI document of the operator's API.
pub fn document() -> Value {
    openapi::document(Document {
        title: "corral operator API",
        description: "The REST API of `corral operator`, on its unix socket (no \
            authentication) and optionally on a loopback TCP address (with a bearer \
            token). Every route is a GET: changes go through etcd. The view's routes \
            answer 503 on a standby replica. Every error answers an ErrorResponse with the \
            status of its code; a path that does not exist answers 404 and a path with a \
            method it does not take answers 405 (see the components Error404 and \
            Error405). Counts that can pass 2^53 are decimal strings."
            .to_owned(),
        api: crate::api::routes().into_openapi(),
        fix_schema: unsigned_64,
        codes: CODES.to_vec(),
        error_description,
    })
}
