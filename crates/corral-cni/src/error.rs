//! CNI error results: the spec's well-known codes, corral's own codes (100 and up), and the
//! mapping from the engine's errors.
//!
//! | code | meaning |
//! | ---: | --- |
//! | 1 | incompatible CNI version (details list the supported versions) |
//! | 2 | unsupported field in the network configuration (the message names key and value) |
//! | 3 | container unknown or does not exist |
//! | 4 | invalid or missing environment variable (the message names the variable) |
//! | 5 | I/O failure (reading stdin, a `resolvConf` file that cannot be read) |
//! | 6 | cannot decode the input: bad JSON, a field of the wrong type, input too large |
//! | 7 | invalid network configuration: a bad CIDR, overlapping ranges, a bad network name, a `resolvConf` that is not a regular file or is over 64 KiB, a `dataDir` that is not a directory |
//! | 11 | try again later: the state is being restored, or the agent is away (never for DEL, which is then recorded for the agent) |
//! | 50 | STATUS: the plugin cannot serve ADD |
//! | 51 | STATUS: the plugin cannot serve ADD, and existing containers may lose connectivity |
//! | 100 | the pool has no free address of the family (or no capacity of it at all) |
//! | 101 | a requested address is held by another attachment |
//! | 102 | a requested address is not available: outside the ranges, excluded, reserved (network, broadcast, gateway) or in a draining range |
//! | 103 | the state store failed (database, state directory, lock) |
//! | 104 | the node agent could not be reached or refused the request |
//! | 105 | CHECK: the attachment does not hold the addresses its previous result lists |
//! | 106 | the attachment already holds a different address than the one requested |
//! | 999 | internal error: a state corral should never reach (the code libcni uses for untyped errors) |

use std::fmt;
use std::str::FromStr;

use corral_core::{AllocError, SpecError, cni_code};
use serde::Serialize;

use crate::version::{CniVersion, supported_versions_text};

/// An error result, printed on stdout as `{"cniVersion","code","msg","details"}` with a
/// non-zero exit status.
///
/// `msg` is short and names what was wrong; `details` (omitted from the JSON when empty)
/// carries what a person needs to act on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables.
    pub const INVALID_ENVIRONMENT: u32 = cni_code::INVALID_ENVIRONMENT;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODING_FAILURE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_NETWORK_CONFIG: u32 = cni_code::INVALID_NETWORK_CONFIG;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = cni_code::TRY_AGAIN_LATER;
    /// STATUS: the plugin is not available (cannot serve ADD).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// STATUS: not available, and existing containers may have limited connectivity.
    pub const PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY: u32 = 51;
    /// corral: no free address of the family in the pool.
    pub const POOL_EXHAUSTED: u32 = cni_code::POOL_EXHAUSTED;
    /// corral: a requested address is held by another attachment.
    pub const ADDRESS_IN_USE: u32 = cni_code::ADDRESS_IN_USE;
    /// corral: a requested address is outside the ranges, excluded, reserved or draining.
    pub const ADDRESS_UNAVAILABLE: u32 = cni_code::ADDRESS_UNAVAILABLE;
    /// corral: the state store failed.
    pub const STORE_FAILURE: u32 = 103;
    /// corral: the node agent could not be reached or refused the request.
    pub const AGENT_FAILURE: u32 = 104;
    /// corral: CHECK found the attachment without the addresses its previous result lists.
    pub const CHECK_FAILED: u32 = 105;
    /// corral: the attachment already holds a different address than the one requested.
    pub const ATTACHMENT_CONFLICT: u32 = cni_code::ATTACHMENT_CONFLICT;
    /// An internal error; libcni uses 999 for errors that carry no code.
    pub const INTERNAL: u32 = cni_code::INTERNAL;

    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The same error with `details` set.
    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// Code 1 for a `cniVersion` this plugin does not speak; details list the supported ones.
    pub fn unsupported_version(found: &str) -> CniError {
        CniError::new(
            CniError::INCOMPATIBLE_VERSION,
            format!("unsupported cniVersion {found:?}"),
            format!("supported versions: {}", supported_versions_text()),
        )
    }

    /// Code 1 for a command that the configured version does not have (CHECK before 0.4.0,
    /// GC and STATUS before 1.1.0).
    pub fn command_needs_version(
        command: &str,
        version: CniVersion,
        needed: CniVersion,
    ) -> CniError {
        CniError::new(
            CniError::INCOMPATIBLE_VERSION,
            format!("cniVersion {version} does not allow {command}"),
            format!("{command} needs cniVersion {needed} or later"),
        )
    }

    /// Code 2; the message names the key and its value, as the spec asks.
    pub fn unsupported_field(key: &str, value: &str) -> CniError {
        CniError::new(
            CniError::UNSUPPORTED_FIELD,
            format!("unsupported field {key} = {value}"),
            "",
        )
    }

    /// Code 3.
    pub fn unknown_container(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::UNKNOWN_CONTAINER, msg, "")
    }

    /// Code 4; the message must name the variable.
    pub fn invalid_environment(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::INVALID_ENVIRONMENT, msg, "")
    }

    /// Code 5.
    pub fn io(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::IO_FAILURE, msg, "")
    }

    /// Code 6.
    pub fn decoding(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::DECODING_FAILURE, msg, "")
    }

    /// Code 7; the message should name the field.
    pub fn invalid_config(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::INVALID_NETWORK_CONFIG, msg, "")
    }

    /// Code 11.
    pub fn try_again_later(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::TRY_AGAIN_LATER, msg, "")
    }

    /// Code 50 (STATUS).
    pub fn not_available(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::PLUGIN_NOT_AVAILABLE, msg, "")
    }

    /// Code 103, for any failure of the state store.
    pub fn store(err: impl fmt::Display) -> CniError {
        CniError::new(CniError::STORE_FAILURE, format!("state store: {err}"), "")
    }

    /// Code 104, for any failure to talk to the node agent.
    pub fn agent(err: impl fmt::Display) -> CniError {
        CniError::new(CniError::AGENT_FAILURE, format!("node agent: {err}"), "")
    }

    /// Code 105.
    pub fn check_failed(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::CHECK_FAILED, msg, "")
    }

    /// Code 999.
    pub fn internal(msg: impl Into<String>) -> CniError {
        CniError::new(CniError::INTERNAL, msg, "")
    }

    /// The same error with `context` (a field path, a range set) before its message.
    pub fn context(mut self, context: &str) -> CniError {
        self.msg = format!("{context}: {}", self.msg);
        self
    }

    /// One error for a teardown (DEL, GC) that met several failures and kept going.
    ///
    /// Returns `None` for no failures and the failure itself for one; several are joined in
    /// one message under the first failure's code, and each is kept in `details`.
    pub fn combine(errors: Vec<CniError>) -> Option<CniError> {
        let mut errors = errors.into_iter();
        let first = errors.next()?;
        let rest: Vec<CniError> = errors.collect();
        if rest.is_empty() {
            return Some(first);
        }
        let n_failures = rest.len() + 1;
        let code = first.code;
        let all: Vec<CniError> = std::iter::once(first).chain(rest).collect();
        let msg = format!(
            "{n_failures} failures: {}",
            all.iter()
                .map(|e| e.msg.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
        let details = all
            .iter()
            .map(|e| format!("code {}: {}", e.code, e))
            .collect::<Vec<_>>()
            .join("\n");
        Some(CniError::new(code, msg, details))
    }

    /// The error result as the spec prints it, for the given `cniVersion`.
    pub fn to_json(&self, cni_version: CniVersion) -> String {
        #[derive(Serialize)]
        struct ErrorOut<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        let out = ErrorOut {
            cni_version: cni_version.as_str(),
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        };
        // Serialising a struct of strings and integers cannot fail.
        serde_json::to_string(&out).unwrap_or_default()
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

impl From<SpecError> for CniError {
    /// A bad container ID or interface name came from the environment (code 4); everything
    /// else a `SpecError` reports came from the network configuration (code 7).
    fn from(err: SpecError) -> CniError {
        CniError::new(cni_code::of_spec(&err), err.to_string(), "")
    }
}

impl From<AllocError> for CniError {
    fn from(err: AllocError) -> CniError {
        let details = if err.is_retryable() {
            "the request may succeed later"
        } else {
            ""
        };
        CniError::new(cni_code::of_alloc(&err), err.to_string(), details)
    }
}

impl FromStr for CniVersion {
    type Err = CniError;

    /// Parses a version, refusing unsupported ones with code 1.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        CniVersion::parse(text).ok_or_else(|| CniError::unsupported_version(text))
    }
}
