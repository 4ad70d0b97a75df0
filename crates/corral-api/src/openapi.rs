//! What both daemons' OpenAPI documents are built from (feature `openapi`): schemas collected
//! from the types, the corrections utoipa's output needs, the shapes of success and error
//! responses, the committed document's text, and the check that the committed file is the
//! generated one.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value, json};
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;

/// The component name of a type's schema: naming schemas through their types makes a
/// renamed or removed type a compile error where it is named.
pub fn name<T: ToSchema>() -> &'static str {
    match T::name() {
        Cow::Borrowed(name) => name,
        Cow::Owned(name) => name.leak(),
    }
}

/// A reference to a component schema.
pub fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// The JSON Schemas of body types, by name, with the types they refer to.
#[derive(Default)]
pub struct Schemas(Vec<(String, RefOr<Schema>)>);

impl std::fmt::Debug for Schemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(n, _)| n))
            .finish()
    }
}

impl Schemas {
    /// Adds `T`'s schema and those it refers to.
    pub fn add<T: ToSchema>(mut self) -> Schemas {
        self.0.push((T::name().into_owned(), T::schema()));
        T::schemas(&mut self.0);
        self
    }

    /// The schemas as JSON, each corrected by `fix` (e.g. [`unsigned_64`]).
    pub fn into_json(self, fix: impl Fn(&mut Value)) -> BTreeMap<String, Value> {
        self.0
            .into_iter()
            .map(|(name, schema)| {
                let mut value = serde_json::to_value(schema).expect("a schema is JSON");
                fix(&mut value);
                (name, value)
            })
            .collect()
    }
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
pub fn error_response(description: &str, codes: &[&str]) -> Value {
    json!({
        "description": description,
        "content": {
            "application/json": {
                "schema": {
                    "allOf": [
                        schema_ref(name::<crate::ErrorResponse>()),
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

/// What a successful response carries.
#[derive(Clone, Copy, Debug)]
pub enum Success {
    /// JSON, of the named component schema.
    Json(&'static str),
    /// A JSON object whose shape the document does not describe (a checkpoint, the document
    /// itself).
    AnyObject(&'static str),
    /// Text of this media type.
    Text(&'static str, &'static str),
}

impl Success {
    /// The `200` response of an operation.
    pub fn response(self) -> Value {
        match self {
            Success::Json(name) => json!({
                "description": "Success",
                "content": {"application/json": {"schema": schema_ref(name)}}
            }),
            Success::AnyObject(what) => json!({
                "description": what,
                "content": {"application/json": {"schema": {"type": "object"}}}
            }),
            Success::Text(media_type, what) => json!({
                "description": what,
                "content": {media_type: {"schema": {"type": "string"}}}
            }),
        }
    }
}

/// The component name of a status's error response.
pub fn error_response_name(status: u16) -> String {
    format!("Error{status}")
}

/// Adds to an operation's `responses` a reference to the error response of each of `errors`
/// and of 401, which every operation answers on the TCP listener without the token.
pub fn insert_error_refs(responses: &mut Map<String, Value>, errors: &[u16]) {
    let mut errors = errors.to_vec();
    errors.push(401);
    errors.sort_unstable();
    errors.dedup();
    for status in errors {
        responses.insert(
            status.to_string(),
            json!({"$ref": format!("#/components/responses/{}", error_response_name(status))}),
        );
    }
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

/// For the daemons' tests: fails, naming the first differing line, unless the file at `path`
/// holds `expected`; with `UPDATE_EXPECT` set it writes `expected` there instead. Answers
/// the committed text.
pub fn check_committed(path: &Path, expected: &str) -> String {
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(path, expected).expect("the document is written");
        return expected.to_owned();
    }
    let committed = std::fs::read_to_string(path).expect("the committed document is read");
    if committed != expected {
        let line = committed
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(expected.lines().count()));
        panic!(
            "{} differs from the generated document from line {}:\n  committed: {:?}\n  \
             generated: {:?}\nrerun with UPDATE_EXPECT=1 to rewrite it after a deliberate change",
            path.display(),
            line + 1,
            committed.lines().nth(line).unwrap_or("<end of file>"),
            expected.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
    committed
}
