//! The client's error type: one variant per way a request can fail, so callers can decide
//! whether to retry (the CNI plugin maps [`Error::Unreachable`] to CNI's "try again later").

use std::io;

use corral_api::{ErrorBody, ErrorCode};

/// Why a request to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing listens there: the socket file is missing, or it refused the connection (the
    /// agent is not running, or is restarting).
    #[error("cannot reach the agent at {socket}")]
    Unreachable {
        /// The socket path, or the TCP address.
        socket: String,
        #[source]
        source: io::Error,
    },
    /// The agent did not answer (or accept the connection) within the timeout.
    #[error("the agent at {socket} did not answer in time")]
    Timeout { socket: String },
    /// Connecting, sending or receiving failed otherwise (permission denied, connection reset).
    #[error("cannot talk to the agent at {socket}")]
    Io {
        socket: String,
        #[source]
        source: io::Error,
    },
    /// The answer is not the HTTP or the JSON the API describes.
    #[error("malformed answer from the agent: {0}")]
    Protocol(String),
    /// The agent refused or failed the request, with its error body.
    #[error("the agent answered {status} {}: {}", code_name(error.code), error.message)]
    Api { status: u16, error: ErrorBody },
    /// A non-2xx answer whose body is not the API's error body (a proxy, or a broken agent);
    /// `body` is its start, as text.
    #[error("the agent answered {status}: {body}")]
    Status { status: u16, body: String },
}

impl Error {
    /// The HTTP status of an answer that reported failure, if that is what happened.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } | Error::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the same request may succeed later without changing it: the agent was not
    /// there, was too slow, the connection broke, or it said to retry (503).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::Timeout { .. } | Error::Io { .. } => true,
            Error::Api { status, .. } | Error::Status { status, .. } => *status == 503,
            Error::Protocol(_) => false,
        }
    }
}

/// The snake_case name the API gives an error code (`in_use`, `exhausted`, ...).
pub fn code_name(code: ErrorCode) -> String {
    match serde_json::to_value(code) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{code:?}"),
    }
}
