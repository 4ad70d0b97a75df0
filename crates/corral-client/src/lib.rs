//! corral-client: a lean blocking client of the corral agent's REST API ([`corral_api`]),
//! for the `corral` command line and for corral-ipam in agent mode.
//!
//! It starts no threads and needs no async runtime: one [`Client`] holds one connection
//! (HTTP/1.1 on the agent's unix socket, or on its TCP listener with a bearer token) and
//! reuses it for its requests, one at a time. Responses are parsed with `httparse`, bodies
//! framed by `Content-Length`, the chunked coding, or the end of the stream.
//!
//! ```no_run
//! use corral_client::Client;
//!
//! let mut client = Client::unix("/run/corral/agent.sock");
//! let status = client.status(Some(corral_api::NODE_SCOPE))?;
//! for line in &status.summary {
//!     println!("{line}");
//! }
//! # Ok::<(), corral_client::Error>(())
//! ```
//!
//! Failures are typed ([`Error`]): the agent not running ([`Error::Unreachable`]) is told
//! apart from a slow one ([`Error::Timeout`]), a broken answer ([`Error::Protocol`]) and a
//! refusal with the API's error body ([`Error::Api`]).

mod error;
pub mod fuzz;
mod http;
mod transport;

#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use corral_api::{
    AllocateRequest, AllocateResponse, CniAddRequest, CniGcRequest, CniKeyRequest,
    CniStatusRequest, Done, DumpResponse, ErrorResponse, ExclusionRequest, GcRequest, GcResponse,
    Lease, LeaseStartRequest, LeaseStopRequest, PoolsResponse, RangeRemoved, RangeRequest,
    ReleaseRequest, ReleaseResponse, ScopeStatus, StatusResponse, paths,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::{Error, code_name};
pub use transport::Endpoint;

use http::{Method, ReadError};
use transport::Stream;

/// The default connect and read timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How much of a non-API error body [`Error::Status`] keeps.
const MAX_ERROR_TEXT: usize = 512;

/// A blocking client of one agent, holding at most one open connection.
#[derive(Debug)]
pub struct Client {
    endpoint: Endpoint,
    connect_timeout: Option<Duration>,
    read_timeout: Option<Duration>,
    connection: Option<Stream>,
}

/// A bearer token that cannot be sent in a header.
#[derive(Debug, thiserror::Error)]
#[error("the bearer token must be non-empty visible ASCII, without spaces")]
pub struct BadToken;

impl Client {
    /// A client of the agent listening on the unix socket at `socket`. Nothing is connected
    /// until the first request.
    pub fn unix(socket: impl Into<PathBuf>) -> Client {
        Client::new(Endpoint::Unix(socket.into()))
    }

    /// A client of the agent's TCP listener, sending `token` as `Authorization: Bearer`.
    pub fn tcp(address: SocketAddr, token: impl Into<String>) -> Result<Client, BadToken> {
        let token = token.into();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(BadToken);
        }
        Ok(Client::new(Endpoint::Tcp { address, token }))
    }

    fn new(endpoint: Endpoint) -> Client {
        Client {
            endpoint,
            connect_timeout: Some(DEFAULT_TIMEOUT),
            read_timeout: Some(DEFAULT_TIMEOUT),
            connection: None,
        }
    }

    /// How long connecting to a TCP address may take (`None`: as long as the OS allows).
    /// Connecting to a unix socket does not wait.
    pub fn with_connect_timeout(mut self, timeout: Option<Duration>) -> Client {
        self.connect_timeout = timeout.filter(|timeout| !timeout.is_zero());
        self
    }

    /// How long to wait for each read of the answer and each write of the request (`None`:
    /// forever).
    pub fn with_read_timeout(mut self, timeout: Option<Duration>) -> Client {
        self.read_timeout = timeout.filter(|timeout| !timeout.is_zero());
        self.connection = None;
        self
    }

    /// Where the agent is expected.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    // ---- probes ------------------------------------------------------------------------

    /// `GET /healthz`: succeeds when the agent answers 2xx.
    pub fn healthz(&mut self) -> Result<(), Error> {
        self.call(Method::Get, paths::HEALTHZ, None).map(drop)
    }

    /// `GET /readyz`: succeeds once the agent has restored its state (before that, the agent
    /// answers 503, an [`Error::Api`] or [`Error::Status`]).
    pub fn readyz(&mut self) -> Result<(), Error> {
        self.call(Method::Get, paths::READYZ, None).map(drop)
    }

    /// `GET /metrics`: the Prometheus text exposition.
    pub fn metrics(&mut self) -> Result<String, Error> {
        let body = self.call(Method::Get, paths::METRICS, None)?;
        String::from_utf8(body)
            .map_err(|_| Error::Protocol(format!("{}: the text is not UTF-8", paths::METRICS)))
    }

    /// `GET /openapi.json`: the API's description.
    pub fn openapi(&mut self) -> Result<serde_json::Value, Error> {
        self.get(paths::OPENAPI)
    }

    // ---- addresses ---------------------------------------------------------------------

    /// `POST /v1/allocate`.
    pub fn allocate(&mut self, request: &AllocateRequest) -> Result<AllocateResponse, Error> {
        self.post(paths::ALLOCATE, request)
    }

    /// `POST /v1/release`.
    pub fn release(&mut self, request: &ReleaseRequest) -> Result<ReleaseResponse, Error> {
        self.post(paths::RELEASE, request)
    }

    /// `POST /v1/leases/start`.
    pub fn lease_start(&mut self, request: &LeaseStartRequest) -> Result<Lease, Error> {
        self.post(paths::LEASE_START, request)
    }

    /// `POST /v1/leases/stop`.
    pub fn lease_stop(&mut self, request: &LeaseStopRequest) -> Result<Done, Error> {
        self.post(paths::LEASE_STOP, request)
    }

    // ---- introspection -----------------------------------------------------------------

    /// `GET /v1/dump`: every allocation of `scope`, or of every scope.
    pub fn dump(&mut self, scope: Option<&str>) -> Result<DumpResponse, Error> {
        self.get(&with_scope(paths::DUMP, scope))
    }

    /// `GET /v1/status`: capacity and use of `scope`, or of every scope.
    pub fn status(&mut self, scope: Option<&str>) -> Result<StatusResponse, Error> {
        self.get(&with_scope(paths::STATUS, scope))
    }

    /// `GET /v1/history`: the allocation history `filter` selects, newest first.
    pub fn history(
        &mut self,
        filter: &corral_api::history::HistoryFilter,
    ) -> Result<corral_api::HistoryResponse, Error> {
        self.get(&filter.path())
    }

    /// The operator's `GET /v1/status` (a client of `corral operator`'s API socket).
    pub fn operator_status(&mut self) -> Result<corral_api::operator::OperatorStatus, Error> {
        self.get(corral_api::operator::paths::STATUS)
    }

    /// `GET /v1/pools`: the configuration of `scope`'s pools, or of every scope's.
    pub fn pools(&mut self, scope: Option<&str>) -> Result<PoolsResponse, Error> {
        self.get(&with_scope(paths::POOLS, scope))
    }

    // ---- pool configuration ------------------------------------------------------------

    /// `POST /v1/pools/ranges/add`.
    pub fn add_range(&mut self, request: &RangeRequest) -> Result<Done, Error> {
        self.post(paths::POOL_RANGES_ADD, request)
    }

    /// `POST /v1/pools/ranges/remove`.
    pub fn remove_range(&mut self, request: &RangeRequest) -> Result<RangeRemoved, Error> {
        self.post(paths::POOL_RANGES_REMOVE, request)
    }

    /// `POST /v1/pools/exclusions/add`.
    pub fn add_exclusion(&mut self, request: &ExclusionRequest) -> Result<Done, Error> {
        self.post(paths::POOL_EXCLUSIONS_ADD, request)
    }

    /// `POST /v1/pools/exclusions/remove`.
    pub fn remove_exclusion(&mut self, request: &ExclusionRequest) -> Result<Done, Error> {
        self.post(paths::POOL_EXCLUSIONS_REMOVE, request)
    }

    /// `POST /v1/pools/reserve-local-routes`: excludes what the node's routes and addresses
    /// cover, and says what that changed.
    pub fn reserve_local_routes(
        &mut self,
        request: &corral_api::ReserveLocalRoutesRequest,
    ) -> Result<corral_api::ReserveLocalRoutesResponse, Error> {
        self.post(paths::POOL_RESERVE_LOCAL_ROUTES, request)
    }

    // ---- checkpoints -------------------------------------------------------------------

    /// `GET /v1/checkpoint`: every scope as a checkpoint document.
    pub fn export_checkpoint(&mut self) -> Result<serde_json::Value, Error> {
        self.get(paths::CHECKPOINT)
    }

    /// `POST /v1/checkpoint`: restores a checkpoint document.
    pub fn import_checkpoint(&mut self, checkpoint: &serde_json::Value) -> Result<Done, Error> {
        self.post(paths::CHECKPOINT, checkpoint)
    }

    // ---- CNI ---------------------------------------------------------------------------

    /// `POST /v1/cni/add`.
    pub fn cni_add(&mut self, request: &CniAddRequest) -> Result<AllocateResponse, Error> {
        self.post(paths::CNI_ADD, request)
    }

    /// `POST /v1/cni/del`.
    pub fn cni_del(&mut self, request: &CniKeyRequest) -> Result<ReleaseResponse, Error> {
        self.post(paths::CNI_DEL, request)
    }

    /// `POST /v1/cni/check`: the attachment's addresses.
    pub fn cni_check(&mut self, request: &CniKeyRequest) -> Result<AllocateResponse, Error> {
        self.post(paths::CNI_CHECK, request)
    }

    /// `POST /v1/cni/gc`: the leak collector over a CNI network's attachments.
    pub fn cni_gc(&mut self, request: &CniGcRequest) -> Result<GcResponse, Error> {
        self.post(paths::CNI_GC, request)
    }

    /// `POST /v1/gc`: the leak collector over a scope's attachments (the node's by default).
    pub fn gc(&mut self, request: &GcRequest) -> Result<GcResponse, Error> {
        self.post(paths::GC, request)
    }

    /// `POST /v1/cni/status`.
    pub fn cni_status(&mut self, request: &CniStatusRequest) -> Result<ScopeStatus, Error> {
        self.post(paths::CNI_STATUS, request)
    }

    // ---- interfaces --------------------------------------------------------------------

    /// `GET /v1/interfaces[?pool=]`: the node's interface-backed pools.
    pub fn interfaces(
        &mut self,
        pool: Option<&str>,
    ) -> Result<corral_api::InterfacesResponse, Error> {
        let path = match pool {
            Some(pool) => format!(
                "{}?pool={}",
                paths::INTERFACES,
                corral_api::percent_encode(pool)
            ),
            None => paths::INTERFACES.to_owned(),
        };
        self.get(&path)
    }

    /// `GET /v1/interfaces/{id}`: one interface with its use and freeable addresses.
    pub fn interface(&mut self, id: &str) -> Result<corral_api::InterfaceInfo, Error> {
        self.get(&paths::interface(id))
    }

    /// `POST /v1/interfaces`.
    pub fn add_interface(
        &mut self,
        request: &corral_api::InterfaceRequest,
    ) -> Result<corral_api::InterfaceInfo, Error> {
        self.post(paths::INTERFACES, request)
    }

    /// `DELETE /v1/interfaces/{id}[?force=true]`.
    pub fn remove_interface(
        &mut self,
        id: &str,
        force: bool,
    ) -> Result<corral_api::InterfaceRemoved, Error> {
        let mut path = paths::interface(id);
        if force {
            path.push_str("?force=true");
        }
        let body = self.call(Method::Delete, &path, None)?;
        decode(&path, &body)
    }

    /// `POST /v1/interfaces/{id}/addresses`.
    pub fn add_interface_address(
        &mut self,
        id: &str,
        address: &str,
    ) -> Result<corral_api::InterfaceInfo, Error> {
        let request = corral_api::InterfaceAddressRequest {
            address: address.to_owned(),
        };
        self.post(&paths::interface_addresses(id), &request)
    }

    /// `DELETE /v1/interfaces/{id}/addresses?address=...[&force=true]`.
    pub fn remove_interface_address(
        &mut self,
        id: &str,
        address: &str,
        force: bool,
    ) -> Result<corral_api::InterfaceInfo, Error> {
        let mut path = format!(
            "{}?address={}",
            paths::interface_addresses(id),
            corral_api::percent_encode(address)
        );
        if force {
            path.push_str("&force=true");
        }
        let body = self.call(Method::Delete, &path, None)?;
        decode(&path, &body)
    }

    /// `POST /v1/import-ipamd`: AWS VPC CNI's ipamd checkpoint into a pool.
    pub fn import_ipamd(
        &mut self,
        request: &corral_api::IpamdImportRequest,
    ) -> Result<corral_api::IpamdImportResponse, Error> {
        self.post(paths::IMPORT_IPAMD, request)
    }

    // ---- plumbing ----------------------------------------------------------------------

    fn get<T: DeserializeOwned>(&mut self, path: &str) -> Result<T, Error> {
        let body = self.call(Method::Get, path, None)?;
        decode(path, &body)
    }

    fn post<B: Serialize, T: DeserializeOwned>(
        &mut self,
        path: &str,
        request: &B,
    ) -> Result<T, Error> {
        let json = serde_json::to_vec(request).map_err(|error| {
            Error::Protocol(format!("cannot encode the request to {path}: {error}"))
        })?;
        let body = self.call(Method::Post, path, Some(&json))?;
        decode(path, &body)
    }

    /// Sends one request and returns the body of a 2xx answer.
    fn call(
        &mut self,
        method: Method,
        path: &str,
        json_body: Option<&[u8]>,
    ) -> Result<Vec<u8>, Error> {
        let request = http::encode_request(
            method,
            path,
            &self.endpoint.host(),
            self.endpoint.bearer_token(),
            json_body,
        );
        let response = self.exchange(&request)?;
        if (200..300).contains(&response.status) {
            Ok(response.body)
        } else {
            Err(refusal(response.status, &response.body))
        }
    }

    /// Sends `request` and reads the answer. A kept-alive connection the agent closed while
    /// it was idle shows as a connection closed (or reset) before any byte of the answer:
    /// then, and only then, the request is sent once more on a new connection.
    fn exchange(&mut self, request: &[u8]) -> Result<http::Response, Error> {
        let reused = self.connection.is_some();
        match self.attempt(request) {
            Err(Failed::Transport { error, received: 0 }) if reused && closed_by_peer(&error) => {
                self.attempt(request)
                    .map_err(|failed| self.to_error(failed))
            }
            result => result.map_err(|failed| self.to_error(failed)),
        }
    }

    fn attempt(&mut self, request: &[u8]) -> Result<http::Response, Failed> {
        let mut stream = match self.connection.take() {
            Some(stream) => stream,
            None => self
                .endpoint
                .connect(self.connect_timeout, self.read_timeout)
                .map_err(Failed::Client)?,
        };
        if let Err(error) = stream.write_all(request) {
            return Err(Failed::Transport { error, received: 0 });
        }
        match http::read_response(&mut stream) {
            Ok(response) => {
                if response.reusable {
                    self.connection = Some(stream);
                }
                Ok(response)
            }
            Err(ReadError::Io { error, received }) => Err(Failed::Transport { error, received }),
            Err(ReadError::Malformed(message)) => Err(Failed::Client(Error::Protocol(message))),
        }
    }

    fn to_error(&self, failed: Failed) -> Error {
        let (error, received) = match failed {
            Failed::Client(error) => return error,
            Failed::Transport { error, received } => (error, received),
        };
        let socket = self.endpoint.to_string();
        match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout { socket },
            io::ErrorKind::UnexpectedEof if received == 0 => {
                Error::Protocol("the agent closed the connection without answering".to_owned())
            }
            io::ErrorKind::UnexpectedEof => Error::Protocol(format!(
                "the agent closed the connection after {received} bytes of its answer"
            )),
            _ => Error::Io {
                socket,
                source: error,
            },
        }
    }
}

/// How one attempt at a request failed.
enum Failed {
    Client(Error),
    /// The stream failed or ended after `received` bytes of the answer.
    Transport {
        error: io::Error,
        received: usize,
    },
}

/// Whether `error` means the other end closed the connection.
fn closed_by_peer(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The error a non-2xx answer stands for.
fn refusal(status: u16, body: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorResponse>(body) {
        Ok(response) => Error::Api {
            status,
            error: response.error,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let mut text = text.trim().to_owned();
            if let Some((cut, _)) = text.char_indices().nth(MAX_ERROR_TEXT) {
                text.truncate(cut);
                text.push('…');
            }
            Error::Status { status, body: text }
        }
    }
}

fn decode<T: DeserializeOwned>(path: &str, body: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(body).map_err(|error| {
        Error::Protocol(format!(
            "{path}: the body is not the expected JSON: {error}"
        ))
    })
}

/// `path?scope=<scope>`, the scope percent-encoded (RFC 3986: all but unreserved characters).
fn with_scope(path: &str, scope: Option<&str>) -> String {
    match scope {
        Some(scope) => format!("{path}?scope={}", corral_api::percent_encode(scope)),
        None => path.to_owned(),
    }
}
