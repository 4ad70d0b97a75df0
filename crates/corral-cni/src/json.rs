//! Typed reads from a decoded JSON document, with errors that name the field.
//!
//! CNI configurations carry keys for every plugin in a chain, so unknown keys are ignored;
//! the keys corral reads are type-checked here, and a wrong type is code 6 with the path of
//! the field (`ipam.ranges[0][1].rangeStart: expected a string, found a number`). A JSON
//! `null` reads as an absent field, as Go's decoder treats it.

use serde_json::{Map, Value};

use crate::error::CniError;

/// How a value's type reads in a message.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Code 6: `path` holds a value of the wrong type.
pub(crate) fn wrong_type(path: &str, expected: &str, value: &Value) -> CniError {
    CniError::decoding(format!(
        "{path}: expected {expected}, found {}",
        kind(value)
    ))
}

/// The path of `key` inside the object at `path`.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// The path of element `index` of the array at `path`.
pub(crate) fn index(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

/// A JSON object and where it sits in the document.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Obj<'a> {
    pub path: &'a str,
    pub map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    /// Reads `value` at `path` as an object.
    pub fn of(path: &'a str, value: &'a Value) -> Result<Obj<'a>, CniError> {
        match value {
            Value::Object(map) => Ok(Obj { path, map }),
            other => Err(wrong_type(display_path(path), "an object", other)),
        }
    }

    pub fn path_of(&self, key: &str) -> String {
        join(self.path, key)
    }

    /// The value of `key`, or `None` when it is absent or `null`.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>, CniError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(&self.path_of(key), "a string", other)),
        }
    }

    /// A string field where `""` means absent, as Go's decoders read empty addresses and
    /// paths.
    pub fn non_empty_str(&self, key: &str) -> Result<Option<&'a str>, CniError> {
        Ok(self.str(key)?.filter(|s| !s.is_empty()))
    }

    pub fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, CniError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(wrong_type(&self.path_of(key), "an array", other)),
        }
    }

    /// A non-negative integer no larger than `max`.
    pub fn uint(&self, key: &str, max: u64) -> Result<Option<u64>, CniError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => {
                let n = value.as_u64().ok_or_else(|| {
                    wrong_type(&self.path_of(key), "a non-negative integer", value)
                })?;
                if n > max {
                    return Err(CniError::invalid_config(format!(
                        "{}: {n} is more than the maximum {max}",
                        self.path_of(key)
                    )));
                }
                Ok(Some(n))
            }
        }
    }
}

/// The path as it reads in a message; the document itself is "the network config".
fn display_path(path: &str) -> &str {
    if path.is_empty() {
        "network config"
    } else {
        path
    }
}

/// Reads `value` at `path` as a string.
pub(crate) fn as_str<'a>(path: &str, value: &'a Value) -> Result<&'a str, CniError> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(wrong_type(path, "a string", other)),
    }
}

/// Reads `value` at `path` as an array.
pub(crate) fn as_array<'a>(path: &str, value: &'a Value) -> Result<&'a Vec<Value>, CniError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(wrong_type(path, "an array", other)),
    }
}
