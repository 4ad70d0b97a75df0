//! What both daemons' OpenAPI documents are built from (feature `openapi`): the document
//! around the operations and body schemas utoipa collects from the handlers'
//! `#[utoipa::path]`, the corrections utoipa's output needs, the error statuses a handler
//! declares ([`error_statuses!`](crate::error_statuses)) and the error responses they refer
//! to, and the committed document's text ([`render`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
pub use utoipa;
use utoipa::openapi::response::Response;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{OpenApi, Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::{ErrorCode, ErrorResponse};

/// The component name of a type's schema: naming schemas through their types makes a
/// renamed or removed type a compile error where it is named.
fn name<T: ToSchema>() -> &'static str {
    match T::name() {
        Cow::Borrowed(name) => name,
        Cow::Owned(name) => name.leak(),
    }
}

/// A reference to a component schema.
fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// utoipa describes a `u64` as `format: int64` with `minimum: 0`, but `int64` means a signed
/// integer (at most 2^63 - 1) and the daemons read any `u64`: here the bound is the real one.
pub fn unsigned_64(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if object.get("format").and_then(Value::as_str) == Some("int64")
                && object.get("minimum") == Some(&json!(0))
            {
                object.remove("format");
                object.insert("maximum".into(), json!(u64::MAX));
            }
            object.values_mut().for_each(unsigned_64);
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_64),
        _ => {}
    }
}

/// The error response of a status: an `ErrorResponse` whose code is one of `codes`.
fn error_response(description: &str, codes: &[&str]) -> Value {
    json!({
        "description": description,
        "content": {
            "application/json": {
                "schema": {
                    "allOf": [
                        schema_ref(name::<ErrorResponse>()),
                        {
                            "type": "object",
                            "properties": {
                                "error": {
                                    "type": "object",
                                    "properties": {"code": {"enum": codes}}
                                }
                            }
                        }
                    ]
                }
            }
        }
    })
}

/// The component name of a status's error response.
fn error_response_name(status: u16) -> String {
    format!("Error{status}")
}

/// Any JSON object: a body whose shape the document does not describe (a checkpoint, the
/// document itself); `inline(AnyObject)` in a handler's `#[utoipa::path]`.
#[derive(Clone, Copy, Debug)]
pub struct AnyObject;

impl PartialSchema for AnyObject {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .build()
            .into()
    }
}

impl ToSchema for AnyObject {}

/// References to the document's error responses of `statuses`, for [`error_statuses!`](
/// crate::error_statuses).
pub fn error_refs(statuses: &[u16]) -> BTreeMap<String, RefOr<Response>> {
    statuses
        .iter()
        .map(|status| {
            let reference = Ref::from_response_name(error_response_name(*status));
            (status.to_string(), RefOr::Ref(reference))
        })
        .collect()
}

/// Declares types that stand for sets of error statuses in a handler's
/// `#[utoipa::path(responses(...))]`: each answers references to the document's `ErrorNNN`
/// responses (which [`document`] builds, with the codes each status carries).
///
/// ```
/// use corral_api::openapi::utoipa::IntoResponses;
///
/// corral_api::error_statuses! {
///     /// A read: a bad query, no such thing, or not now.
///     Read = [400, 404, 503];
/// }
///
/// let refs = serde_json::to_value(Read::responses()).unwrap();
/// assert_eq!(refs["404"]["$ref"], "#/components/responses/Error404");
/// ```
#[macro_export]
macro_rules! error_statuses {
    ($($(#[$meta:meta])* $name:ident = [$($status:literal),* $(,)?];)*) => {$(
        $(#[$meta])*
        struct $name;

        impl $crate::openapi::utoipa::IntoResponses for $name {
            fn responses() -> ::std::collections::BTreeMap<
                ::std::string::String,
                $crate::openapi::utoipa::openapi::RefOr<
                    $crate::openapi::utoipa::openapi::response::Response,
                >,
            > {
                $crate::openapi::error_refs(&[$($status),*])
            }
        }
    )*};
}

/// Every error code, in the order `ErrorCode` declares them.
pub fn every_error_code() -> Vec<ErrorCode> {
    let schema = serde_json::to_value(ErrorCode::schema()).expect("a schema is JSON");
    schema["enum"]
        .as_array()
        .expect("ErrorCode is an enum of strings")
        .iter()
        .map(|name| serde_json::from_value(name.clone()).expect("an ErrorCode schema name parses"))
        .collect()
}

fn code_name(code: ErrorCode) -> String {
    match serde_json::to_value(code) {
        Ok(Value::String(name)) => name,
        _ => unreachable!("an error code is a JSON string"),
    }
}

/// What a daemon's document says besides its operations.
pub struct Document {
    pub title: &'static str,
    pub description: String,
    /// The operations, as utoipa collects them from the handlers' `#[utoipa::path]`, with the
    /// schemas of their bodies.
    pub api: OpenApi,
    /// The correction each schema needs (e.g. [`unsigned_64`]).
    pub fix_schema: fn(&mut Value),
    /// The codes the daemon answers: each status of one has an `ErrorNNN` response whose
    /// `code` is one of those of that status, in this order.
    pub codes: Vec<ErrorCode>,
    /// What each error status means.
    pub error_description: fn(u16) -> &'static str,
}

impl std::fmt::Debug for Document {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Document")
            .field("title", &self.title)
            .field("codes", &self.codes)
            .finish_non_exhaustive()
    }
}

/// The OpenAPI 3.1 document: utoipa's operations and schemas (with [`crate::ErrorResponse`]'s,
/// which the error responses refer to), each also answering the 401 of the TCP
/// listener without the token, with every link marked for schemathesis (a link gives the
/// whole body of the next request; `x-schemathesis` tells its stateful phase to send it as
/// it is rather than merged into a generated one), and a response per error status whose
/// `code` is one of those [`ErrorCode::status`] maps to it.
pub fn document(document: Document) -> Value {
    let mut schemas: Vec<(String, RefOr<Schema>)> = (document.api.components)
        .map(|components| components.schemas.into_iter().collect())
        .unwrap_or_default();
    schemas.push((name::<ErrorResponse>().to_owned(), ErrorResponse::schema()));
    ErrorResponse::schemas(&mut schemas);
    let schemas: BTreeMap<String, Value> = schemas
        .into_iter()
        .map(|(name, schema)| {
            let mut value = serde_json::to_value(schema).expect("a schema is JSON");
            (document.fix_schema)(&mut value);
            (name, value)
        })
        .collect();
    let mut paths = serde_json::to_value(&document.api.paths).expect("the paths are JSON");
    for item in paths.as_object_mut().into_iter().flat_map(Map::values_mut) {
        for operation in item.as_object_mut().into_iter().flat_map(Map::values_mut) {
            // utoipa tags every operation with its handler's module.
            operation
                .as_object_mut()
                .expect("an operation is an object")
                .remove("tags");
            let responses = operation["responses"]
                .as_object_mut()
                .expect("an operation has responses");
            for (status, response) in error_refs(&[401]) {
                let response = serde_json::to_value(response).expect("a response is JSON");
                responses.insert(status, response);
            }
            let links = responses
                .values_mut()
                .filter_map(|response| response.get_mut("links")?.as_object_mut())
                .flat_map(Map::values_mut);
            for link in links {
                link["x-schemathesis"] = json!({"merge_body": false});
            }
        }
    }
    let mut statuses: Vec<u16> = document.codes.iter().map(|code| code.status()).collect();
    statuses.sort_unstable();
    statuses.dedup();
    let responses: Map<String, Value> = statuses
        .into_iter()
        .map(|status| {
            let codes: Vec<String> = document
                .codes
                .iter()
                .filter(|code| code.status() == status)
                .map(|code| code_name(*code))
                .collect();
            let codes: Vec<&str> = codes.iter().map(String::as_str).collect();
            let response = error_response((document.error_description)(status), &codes);
            (error_response_name(status), response)
        })
        .collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": document.title,
            "version": env!("CARGO_PKG_VERSION"),
            "description": document.description,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}
        },
        "security": [{}, {"bearer": []}],
        "paths": paths,
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

/// A document as committed: keys sorted, two-space indentation, a final newline. Sorting here
/// keeps the text the same whether or not serde_json's `preserve_order` feature is on in a
/// build.
pub fn render(document: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(object) => {
                let mut keys: Vec<&String> = object.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&object[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let mut text = serde_json::to_string_pretty(&sorted(document)).expect("JSON renders");
    text.push('\n');
    text
}
