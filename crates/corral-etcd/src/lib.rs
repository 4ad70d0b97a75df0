//! corral's cluster store on etcd: `EtcdKv`, the `corral_kv::Kv` trait over etcd-client. This
//! is the only crate that links etcd-client.
//!
//! Every call is bounded by a request timeout (a timeout is `KvError::Unavailable`: the request
//! may or may not have been applied). etcd's errors become `KvError`s: no quorum, a lost
//! connection or a timeout `Unavailable`, a compacted revision `Compacted` (with the compaction
//! point, which etcd's read error does not carry: a watch from revision 1 asks for it), an
//! unknown lease `LeaseNotFound`, a malformed or oversized request `Refused`.
//!
//! Failover is done here, not by etcd-client: its balanced channel over several endpoints
//! keeps sending a share of the requests to a killed member (connection refused) or a frozen
//! one (timeouts), measured in `tests/etcd.rs`. So `EtcdKv` keeps one connection per member
//! and sends each request to the member that last answered; on a connection failure it moves
//! to the next member. A request that was certainly not sent (connection refused) is sent
//! again to the next member at once; one that may have been applied (a timeout, a broken
//! connection) is retried on the next member only if repeating it is harmless (reads,
//! watches, lease calls), else answered `Unavailable` (a txn), and the next call goes to the
//! next member.
//!
//! A repeatable request that every member answers "no leader" asks them again, at short
//! pauses, until its timeout: an election after the leader was killed or frozen ends in well
//! under a request timeout, and the request succeeds instead of failing the caller.
//!
//! A request no member could serve is answered with the most telling failure (a member's answer
//! before a timeout, before a refused connection), and a lost quorum is named as such: "etcd has
//! lost quorum (no leader)" when a member answers "no leader", or when the members that take
//! connections are a minority and do not answer in time.
//!
//! With credentials (`EtcdOptions::credentials`), each member's connection authenticates before
//! its first request, not at `connect` (which stays lazy), and again whenever etcd answers that
//! the token is invalid (a simple token expires after etcd's `--auth-token-ttl` without use) or
//! that a user is needed (auth was enabled since): the request is then sent once more. A wrong
//! password is its own `Refused` error naming the user, never "unavailable"; the password is in
//! no message and no `Debug`. `auth` creates etcd's roles and users.
//!
//! TLS (`tls.rs`): `https://` endpoints with a CA bundle and optionally a client certificate,
//! the files checked before any connection (`ConnectError::Tls` names the file). The files are
//! read again every `EtcdTls::reload_interval`; when they changed and still check, the member
//! clients are rebuilt from them (new connections use the new files; a call in flight finishes
//! on the old ones), and `EtcdKv::tls_reloads` tells of each reload or refused change.
//!
//! With the `testing` feature, `testing` runs real etcd members as child processes for tests
//! and benchmarks (over TLS too, with a test PKI).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use corral_kv::{
    Event, KeyValue, Kv, KvError, LeaseId, RangePage, Revision, Target, Txn, TxnOp, TxnResponse,
    Watch,
};
use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, PutOptions, TxnOpResponse, WatchOptions,
};
use tokio::sync::{mpsc, watch};

pub mod auth;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

pub use tls::{DEFAULT_RELOAD_INTERVAL, EtcdTls, TlsError};

/// How many batches a watch buffers before its forwarding task waits for the reader.
const WATCH_BUFFER: usize = 64;

/// How long a repeatable request waits before asking the members again after they all
/// answered "no leader" (an election takes an election timeout or two: 1 s by default).
const ELECTION_PAUSE: Duration = Duration::from_millis(50);

/// How `EtcdKv` talks to etcd.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// The longest any call may take; past it the call fails with `Unavailable`.
    pub request_timeout: Duration,
    /// The longest a connection attempt to one member may take.
    pub connect_timeout: Duration,
    /// TLS to `https://` endpoints: the CA bundle, and a client certificate if etcd asks for
    /// one. None: plaintext `http://` endpoints only.
    pub tls: Option<EtcdTls>,
    /// The etcd user to authenticate as (`None`: no authentication).
    pub credentials: Option<Credentials>,
}

/// An etcd user and its password. `Debug` shows the password as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user's name.
    pub user: String,
    /// The user's password.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

/// Why a password file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The file could not be read.
    #[error("cannot read the etcd password file {path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no password.
    #[error("the etcd password file {path} is empty")]
    Empty {
        /// The file.
        path: std::path::PathBuf,
    },
}

impl Credentials {
    /// `user` with the password in the file at `path`: its first line, without the line end.
    pub fn from_file(user: &str, path: &std::path::Path) -> Result<Credentials, CredentialsError> {
        let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
            path: path.to_owned(),
            source,
        })?;
        let password = text.lines().next().unwrap_or("").to_owned();
        if password.is_empty() {
            return Err(CredentialsError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Credentials {
            user: user.to_owned(),
            password,
        })
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            tls: None,
            credentials: None,
        }
    }
}

/// Why `EtcdKv::connect` could not make a client.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TLS options or files (named) cannot be used.
    #[error("etcd TLS: {0}")]
    Tls(#[from] TlsError),
    /// The endpoints are malformed, or connecting failed.
    #[error(transparent)]
    Store(#[from] KvError),
}

impl From<ConnectError> for KvError {
    fn from(error: ConnectError) -> KvError {
        match error {
            ConnectError::Tls(_) => KvError::Refused(error.to_string()),
            ConnectError::Store(error) => error,
        }
    }
}

/// What the TLS reload task did so far: how many times it rebuilt the clients from changed
/// files, and why it refused the last change it saw, if it did (the clients in use stay).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsReload {
    pub reloads: u64,
    pub refused: Option<String>,
}

/// The cluster store on etcd. Clones share the connections (one per member), the member in
/// use and the request count.
#[derive(Clone)]
pub struct EtcdKv {
    /// One client per member, replaced whole when the TLS files change.
    members: Arc<RwLock<Arc<Members>>>,
    /// The TLS reload task's news (never changes without TLS).
    reloads: watch::Receiver<TlsReload>,
    /// The member requests go to (the last that answered).
    current: Arc<AtomicUsize>,
    options: EtcdOptions,
    requests: Arc<AtomicU64>,
    /// The TTL etcd granted each lease this client created (keep-alive answers it).
    granted: Arc<Mutex<HashMap<i64, Duration>>>,
}

impl fmt::Debug for EtcdKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdKv")
            .field("options", &self.options)
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

impl EtcdKv {
    /// A client of the etcd members at `endpoints` (`http://host:port`, or `https://host:port`
    /// with `options.tls`). Connections are made lazily, so this succeeds while etcd is down
    /// (calls then fail with `Unavailable`); malformed endpoints, endpoints that do not go with
    /// the TLS options, and TLS files that cannot be used are refused.
    pub async fn connect(
        endpoints: &[String],
        options: EtcdOptions,
    ) -> Result<EtcdKv, ConnectError> {
        if endpoints.is_empty() {
            return Err(KvError::Refused("no etcd endpoints given".into()).into());
        }
        check_schemes(endpoints, options.tls.is_some())?;
        let loaded = options.tls.as_ref().map(EtcdTls::load).transpose()?;
        let members = Members::new(endpoints, &options, loaded.clone()).await?;
        let members = Arc::new(RwLock::new(Arc::new(members)));
        let (sender, reloads) = watch::channel(TlsReload::default());
        if let (Some(tls), Some(loaded)) = (&options.tls, loaded) {
            tokio::spawn(reload_tls(
                Arc::downgrade(&members),
                endpoints.to_vec(),
                options.clone(),
                tls.clone(),
                loaded.contents,
                sender,
            ));
        }
        Ok(EtcdKv {
            members,
            reloads,
            current: Arc::new(AtomicUsize::new(0)),
            options,
            requests: Arc::new(AtomicU64::new(0)),
            granted: Arc::default(),
        })
    }

    /// The TLS reload task's news: each rebuild of the clients from changed files, or the
    /// refusal of a change (the clients in use stay).
    pub fn tls_reloads(&self) -> watch::Receiver<TlsReload> {
        self.reloads.clone()
    }

    /// When TLS is on and `member` closed or broke the connection (as etcd does to a client
    /// certificate it refuses, after a TLS 1.3 handshake: the alert may be lost with the
    /// connection), asks the member itself over a TLS connection of its own: a refusal
    /// replaces `error` with what etcd said.
    async fn explain_closed(
        &self,
        member: usize,
        members: &Members,
        error: etcd_client::Error,
    ) -> etcd_client::Error {
        let closed = matches!(&error, etcd_client::Error::GRpcStatus(status)
            if matches!(status.code(), tonic::Code::Cancelled | tonic::Code::Unknown))
            && tls_failure(&error).is_none();
        let Some(tls) = members.tls.as_ref().filter(|_| closed) else {
            return error;
        };
        match tls::probe(
            &members.endpoints[member],
            tls,
            self.options.connect_timeout,
        )
        .await
        {
            Some(refusal) => etcd_client::Error::GRpcStatus(tonic::Status::unavailable(refusal)),
            None => error,
        }
    }

    /// The member clients in use now.
    fn members(&self) -> Arc<Members> {
        Arc::clone(
            &self
                .members
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// How many requests this client (and its clones) sent to etcd: one per unary call, one
    /// per watch or keep-alive stream opened.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// How long `lease` has left and the TTL it was granted, as etcd says (whole seconds, the
    /// remaining rounded down); `None` once it expired (or never was). A lease its holder
    /// renews has nearly its granted TTL left; one its holder stopped renewing counts down.
    pub async fn lease_time_left(
        &self,
        lease: LeaseId,
    ) -> Result<Option<(Duration, Duration)>, KvError> {
        let time_to_live =
            |client: Client| async move { client.lease_client().time_to_live(lease.0, None).await };
        match self.call("lease time-to-live", true, time_to_live).await {
            Ok(response) if response.ttl() < 0 => Ok(None),
            Ok(response) => {
                let secs = |s: i64| Duration::from_secs(u64::try_from(s).unwrap_or(0));
                Ok(Some((secs(response.ttl()), secs(response.granted_ttl()))))
            }
            Err(error) => match self.error(error, Some(lease)).await {
                KvError::LeaseNotFound(_) => Ok(None),
                error => Err(error),
            },
        }
    }

    /// The options the client was made with.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    /// Sends a request to the current member, and on a connection failure to the next ones
    /// (see the crate's documentation for when), all within the request timeout; counts every
    /// request sent.
    async fn call<T, F, Fut>(
        &self,
        what: &str,
        retry_if_sent: bool,
        request: F,
    ) -> Result<T, etcd_client::Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.options.request_timeout;
        let members = self.members();
        let n_members = members.clients.len();
        // The most telling failure so far, and how many members refused the connection (in
        // the last round).
        let mut best: Option<(u8, etcd_client::Error)> = None;
        let mut refused;
        loop {
            let first = self.current.load(Ordering::Relaxed) % n_members;
            refused = 0;
            for attempt in 0..n_members {
                let member = (first + attempt) % n_members;
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                if remaining.is_zero() {
                    break;
                }
                // Leave a retryable request time for another member if this one hangs (frozen).
                let budget = if retry_if_sent && attempt + 1 < n_members {
                    remaining / 2
                } else {
                    remaining
                };
                self.requests.fetch_add(1, Ordering::Relaxed);
                let outcome =
                    match tokio::time::timeout(budget, self.send(&members, member, &request)).await
                    {
                        Ok(outcome) => outcome,
                        Err(_) => Err(etcd_client::Error::Internal(format!(
                            "{what} timed out after {budget:?}"
                        ))),
                    };
                match outcome {
                    Ok(answer) => {
                        self.current.store(member, Ordering::Relaxed);
                        return Ok(answer);
                    }
                    Err(error) if is_connection_failure(&error) => {
                        let error = self.explain_closed(member, &members, error).await;
                        // Later calls start at the next member.
                        let _ = self.current.compare_exchange(
                            member,
                            (member + 1) % n_members,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        let not_sent = is_not_sent(&error);
                        refused += usize::from(not_sent);
                        let weight = telling(&error);
                        if best.as_ref().is_none_or(|(w, _)| weight >= *w) {
                            best = Some((weight, error));
                        }
                        if !(not_sent || retry_if_sent) {
                            break;
                        }
                    }
                    Err(error) => return Err(error),
                }
            }
            // Members answered "no leader": an election is under way (the leader was killed
            // or frozen) or quorum is lost. A repeatable request waits for the election within
            // its timeout, as etcd's own client does; a lost quorum is named at the deadline.
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let electing = matches!(&best, Some((_, error)) if is_no_leader(error));
            if !(retry_if_sent && electing) || remaining.is_zero() {
                break;
            }
            tokio::time::sleep(remaining.min(ELECTION_PAUSE)).await;
        }
        let error = best.map(|(_, error)| error).unwrap_or_else(|| {
            etcd_client::Error::Internal(format!(
                "{what} timed out after {:?}",
                self.options.request_timeout
            ))
        });
        Err(quorum_lost(error, refused, n_members))
    }

    /// Sends a request to one member, authenticating its connection first if it has not yet,
    /// and again (sending the request once more) when etcd says its token is no good.
    async fn send<T, F, Fut>(
        &self,
        members: &Members,
        member: usize,
        request: &F,
    ) -> Result<T, etcd_client::Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let client = members.clients[member].clone();
        if self.options.credentials.is_none() {
            return request(client).await;
        }
        if !members.authenticated[member].load(Ordering::Acquire) {
            self.authenticate(members, member).await?;
        }
        match request(client.clone()).await {
            Err(error) if needs_token(&error) => {
                self.authenticate(members, member).await?;
                request(client).await
            }
            outcome => outcome,
        }
    }

    /// Authenticates one member's connection with the credentials (auth disabled on etcd
    /// counts as done: requests need no token then). A wrong user or password is a
    /// `PermissionDenied` status naming the user.
    async fn authenticate(
        &self,
        members: &Members,
        member: usize,
    ) -> Result<(), etcd_client::Error> {
        let Some(credentials) = &self.options.credentials else {
            return Ok(());
        };
        let mut client = members.clients[member].clone();
        let outcome = client
            .update_user(Some((
                credentials.user.clone(),
                credentials.password.clone(),
            )))
            .await;
        match outcome {
            Ok(()) => {}
            Err(etcd_client::Error::GRpcStatus(status))
                if status.message().contains("authentication is not enabled") => {}
            Err(etcd_client::Error::GRpcStatus(status))
                if status.message().contains("authentication failed") =>
            {
                return Err(etcd_client::Error::GRpcStatus(
                    tonic::Status::permission_denied(format!(
                        "etcd refused the credentials of user {:?}: wrong user name or password",
                        credentials.user
                    )),
                ));
            }
            Err(error) => return Err(error),
        }
        members.authenticated[member].store(true, Ordering::Release);
        Ok(())
    }

    /// Maps an error, asking etcd for the compaction point when the error is "compacted".
    async fn error(&self, error: etcd_client::Error, lease: Option<LeaseId>) -> KvError {
        match map_error(error, lease) {
            KvError::Compacted { .. } => match self.compact_revision().await {
                Ok(compact_revision) => KvError::Compacted { compact_revision },
                Err(error) => error,
            },
            other => other,
        }
    }

    /// The oldest revision etcd keeps: a watch from revision 1 is cancelled with it.
    async fn compact_revision(&self) -> Result<Revision, KvError> {
        let probe = |client: Client| async move {
            let options = WatchOptions::new().with_start_revision(1);
            let mut stream = client
                .watch_client()
                .watch(&b"\0corral/compaction-probe"[..], Some(options))
                .await?;
            loop {
                match stream.message().await? {
                    Some(response) if response.compact_revision() > 0 => {
                        return Ok(response.compact_revision());
                    }
                    Some(response) if response.canceled() => {
                        return Err(etcd_client::Error::WatchError(format!(
                            "compaction probe cancelled: {}",
                            response.cancel_reason()
                        )));
                    }
                    Some(_) => continue,
                    None => {
                        return Err(etcd_client::Error::WatchError(
                            "compaction probe stream ended".into(),
                        ));
                    }
                }
            }
        };
        self.call("compaction probe", true, probe)
            .await
            .map_err(|error| map_error(error, None))
    }
}

/// Checks, without connecting, what `EtcdKv::connect` checks before it connects: the endpoints
/// go with the TLS options, and the TLS files can be used.
pub fn check_tls(endpoints: &[String], tls: Option<&EtcdTls>) -> Result<(), TlsError> {
    check_schemes(endpoints, tls.is_some())?;
    tls.map(EtcdTls::load).transpose().map(drop)
}

/// Refuses endpoints that do not go with the TLS options: `http://` with TLS (the files would
/// be ignored), `https://` without (no CA bundle to verify etcd with).
fn check_schemes(endpoints: &[String], tls: bool) -> Result<(), TlsError> {
    for endpoint in endpoints {
        if tls && endpoint.starts_with("http://") {
            return Err(TlsError::Options(format!(
                "{endpoint} is plaintext but TLS files are given: use an https:// URL"
            )));
        }
        if !tls && endpoint.starts_with("https://") {
            return Err(TlsError::Options(format!(
                "{endpoint} needs the CA certificate that signs etcd's certificate \
                 (--etcd-cacert, or etcd_cacert in the configuration file)"
            )));
        }
    }
    Ok(())
}

/// One client per member (connecting lazily), the TLS files they were made with, and
/// whether each connection authenticated (a rebuilt client logs in again).
struct Members {
    clients: Vec<Client>,
    endpoints: Vec<String>,
    tls: Option<tls::Loaded>,
    authenticated: Vec<AtomicBool>,
}

impl Members {
    async fn new(
        endpoints: &[String],
        options: &EtcdOptions,
        tls: Option<tls::Loaded>,
    ) -> Result<Members, KvError> {
        let mut connect = ConnectOptions::new()
            .with_timeout(options.request_timeout)
            .with_connect_timeout(options.connect_timeout)
            // Finds a member that stopped answering on a long-lived stream (a watch).
            .with_keep_alive(options.request_timeout, options.request_timeout)
            .with_keep_alive_while_idle(true)
            // Watches on a member cut off from the leader are cancelled instead of going quiet.
            .with_require_leader(true);
        if let Some(tls) = &tls {
            connect = connect.with_tls(tls.options.clone());
        }
        let mut clients = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let client = tokio::time::timeout(
                options.request_timeout,
                Client::connect([endpoint], Some(connect.clone())),
            )
            .await
            .map_err(|_| KvError::Unavailable(format!("connecting to {endpoint} timed out")))?
            .map_err(|error| map_error(error, None))?;
            clients.push(client);
        }
        Ok(Members {
            authenticated: clients.iter().map(|_| AtomicBool::new(false)).collect(),
            clients,
            endpoints: endpoints.to_vec(),
            tls,
        })
    }
}

/// Reads the TLS files every `reload_interval` while a client lives; when they changed and
/// still check, replaces the member clients with ones made from them.
async fn reload_tls(
    members: Weak<RwLock<Arc<Members>>>,
    endpoints: Vec<String>,
    options: EtcdOptions,
    tls: EtcdTls,
    mut seen: Vec<Vec<u8>>,
    news: watch::Sender<TlsReload>,
) {
    loop {
        tokio::time::sleep(tls.reload_interval).await;
        if members.strong_count() == 0 {
            return;
        }
        let now = tls.contents();
        if now == seen {
            continue;
        }
        seen = now;
        let rebuilt = match tls.load() {
            Ok(loaded) => Members::new(&endpoints, &options, Some(loaded))
                .await
                .map_err(|error| error.to_string()),
            Err(error) => Err(format!("etcd TLS: {error}")),
        };
        let Some(members) = members.upgrade() else {
            return;
        };
        match rebuilt {
            Ok(rebuilt) => {
                *members
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(rebuilt);
                news.send_modify(|news| {
                    news.reloads += 1;
                    news.refused = None;
                });
            }
            Err(error) => news.send_modify(|news| news.refused = Some(error)),
        }
    }
}

/// Whether an error says the member could not be reached or did not answer (as opposed to
/// an answer from etcd).
fn is_connection_failure(error: &etcd_client::Error) -> bool {
    matches!(map_error_ref(error), KvError::Unavailable(_))
}

/// Whether etcd refused a request for its token: expired or unknown (a simple token lapses
/// after `--auth-token-ttl` without use, and a restarted member forgets it), older than the
/// auth store, or missing while auth is on (it was enabled after this connection
/// authenticated).
fn needs_token(error: &etcd_client::Error) -> bool {
    // A watch's refusal comes as the text of its cancel reason.
    let text = match error {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unauthenticated => {
            return true;
        }
        etcd_client::Error::GRpcStatus(status) => status.message().to_owned(),
        other => other.to_string(),
    };
    [
        "invalid auth token",
        "user name is empty",
        "revision of auth store is old",
    ]
    .iter()
    .any(|marker| text.contains(marker))
}

/// Whether a member answered that it has no leader (an election, or a lost quorum).
fn is_no_leader(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.message().contains("no leader"))
}

/// Whether an error says the request never left this process (the connection was refused):
/// sending it elsewhere cannot apply it twice.
fn is_not_sent(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable
                && status.message().starts_with("tcp connect error")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// How much a failure says about etcd: an answer from a member ("etcdserver: no leader") says
/// the most, then a member that took the request and did not answer in time, then a broken
/// connection; a refused connection says only that the member is down. A request sent to every
/// member is answered with the most telling failure, not the last one (1 member of 3 running
/// answers "no leader" and the two others refuse: the failure is the lost quorum).
fn telling(error: &etcd_client::Error) -> u8 {
    match error {
        _ if is_not_sent(error) => 0,
        etcd_client::Error::GRpcStatus(status) if status.message().starts_with("etcdserver:") => 3,
        etcd_client::Error::Internal(message) if message.contains("timed out") => 2,
        _ => 1,
    }
}

/// Names the lost quorum in `error` when it shows one: a member answered "no leader", or a
/// member took the request but did not answer while the members that answer at all (those
/// that did not refuse the connection) are not a majority of `members`.
fn quorum_lost(error: etcd_client::Error, refused: usize, members: usize) -> etcd_client::Error {
    let reachable = members.saturating_sub(refused);
    let text = match &error {
        etcd_client::Error::GRpcStatus(status) => status.message().to_owned(),
        other => other.to_string(),
    };
    let named = if text.contains("no leader") {
        format!("etcd has lost quorum (no leader): {text}")
    } else if telling(&error) == 2 && members > 1 && reachable <= members / 2 {
        format!(
            "etcd has lost quorum (no leader): {reachable} of {members} members reachable, \
             and they cannot serve a request: {text}"
        )
    } else {
        return error;
    };
    etcd_client::Error::GRpcStatus(tonic::Status::unavailable(named))
}

fn map_error_ref(error: &etcd_client::Error) -> KvError {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) => map_error(E::GRpcStatus(status.clone()), None),
        E::LeaseKeepAliveError(message) => map_error(E::LeaseKeepAliveError(message.clone()), None),
        E::InvalidArgs(message) => KvError::Refused(message.clone()),
        E::InvalidUri(error) => KvError::Refused(format!("invalid etcd endpoint: {error}")),
        other => KvError::Unavailable(other.to_string()),
    }
}

/// The largest range or watch answer taken (gRPC's default refuses more than 4 MiB): a scan's
/// page is cut to about `corral_kv::PAGE_BYTES` once its keys' sizes are known, and its first
/// page, of up to a page of keys, may hold more; a server that does not fragment watch answers
/// (etcd's gRPC proxy) sends a watch's backlog in one.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// True if etcd refused a read at a revision the member has not applied yet.
fn is_future_revision(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status)
        if status.code() == tonic::Code::OutOfRange && status.message().contains("future revision"))
}

/// etcd's errors as `KvError`s (a compacted revision with an unknown compaction point, 0).
fn map_error(error: etcd_client::Error, lease: Option<LeaseId>) -> KvError {
    use etcd_client::Error as E;
    use tonic::Code;
    if let Some(failure) = tls_failure(&error) {
        return KvError::Unavailable(failure);
    }
    match error {
        E::GRpcStatus(status) => {
            let message = status.message().to_string();
            match status.code() {
                Code::OutOfRange if message.contains("compacted") => KvError::Compacted {
                    compact_revision: 0,
                },
                Code::NotFound if message.contains("lease not found") => {
                    KvError::LeaseNotFound(lease.unwrap_or(LeaseId(0)))
                }
                Code::InvalidArgument if message.contains("too many operations") => {
                    KvError::TooManyOps(message)
                }
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Internal
                | Code::Unknown => KvError::Unavailable(message),
                _ => KvError::Refused(message),
            }
        }
        E::LeaseKeepAliveError(message) if message.contains("not found") => {
            KvError::LeaseNotFound(lease.unwrap_or(LeaseId(0)))
        }
        E::InvalidArgs(message) => KvError::Refused(message),
        E::InvalidUri(error) => KvError::Refused(format!("invalid etcd endpoint: {error}")),
        other => KvError::Unavailable(other.to_string()),
    }
}

/// What a failed TLS handshake says, if `error` is one: etcd's certificate did not verify, or
/// etcd refused this client's certificate (its alert), or another TLS failure.
fn tls_failure(error: &etcd_client::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match error {
        etcd_client::Error::GRpcStatus(status) => std::error::Error::source(status),
        etcd_client::Error::TransportError(error) => Some(error),
        _ => None,
    };
    while let Some(error) = source {
        let tls = error.downcast_ref::<rustls::Error>().or_else(|| {
            error
                .downcast_ref::<std::io::Error>()?
                .get_ref()?
                .downcast_ref::<rustls::Error>()
        });
        // hyper's read of the connection carries rustls's alert as text.
        if let Some(alert) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|error| error.get_ref())
            .and_then(|inner| {
                inner
                    .to_string()
                    .strip_prefix("received fatal alert: ")
                    .map(str::to_owned)
            })
        {
            return Some(tls::refused_client(&alert));
        }
        if let Some(tls) = tls {
            return Some(match tls {
                rustls::Error::InvalidCertificate(why) => format!(
                    "etcd's TLS certificate does not verify against the CA certificate given \
                     ({why:?}): is it the CA that signed etcd's --cert-file?"
                ),
                rustls::Error::AlertReceived(alert) => tls::refused_client(&format!("{alert:?}")),
                other => format!("TLS with etcd failed: {other}"),
            });
        }
        source = error.source();
    }
    None
}

/// etcd-client's key-value as corral's, its key and value bytes moved, not copied (a rebuild
/// reads every key of the cluster this way).
fn key_value(kv: etcd_client::KeyValue) -> KeyValue {
    let (create_revision, mod_revision, version, lease) = (
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease(),
    );
    let (key, value) = kv.into_key_value();
    KeyValue {
        key,
        value,
        create_revision,
        mod_revision,
        version,
        lease: (lease != 0).then_some(LeaseId(lease)),
    }
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match corral_kv::prefix_end(prefix) {
        // Every key: etcd reads "\0" as "to the end".
        end if end.is_empty() => vec![0],
        end => end,
    }
}

fn compare(compare: &corral_kv::Compare) -> etcd_client::Compare {
    use corral_kv::CompareOp as Op;
    use etcd_client::CompareOp as EtcdOp;
    let op = match compare.op {
        Op::Equal => EtcdOp::Equal,
        Op::NotEqual => EtcdOp::NotEqual,
        Op::Less => EtcdOp::Less,
        Op::Greater => EtcdOp::Greater,
    };
    let key = compare.key.clone();
    let single = match &compare.target {
        Target::CreateRevision(revision) => {
            etcd_client::Compare::create_revision(key, op, *revision)
        }
        Target::ModRevision(revision) => etcd_client::Compare::mod_revision(key, op, *revision),
        Target::Version(version) => etcd_client::Compare::version(key, op, *version),
        Target::Value(value) => etcd_client::Compare::value(key, op, value.clone()),
    };
    if compare.prefix {
        single.with_range(prefix_end(&compare.key))
    } else {
        single
    }
}

fn txn_op(op: &TxnOp) -> etcd_client::TxnOp {
    match op {
        TxnOp::Put { key, value, lease } => {
            let options = lease.map(|lease| PutOptions::new().with_lease(lease.0));
            etcd_client::TxnOp::put(key.clone(), value.clone(), options)
        }
        TxnOp::Delete { key } => etcd_client::TxnOp::delete(key.clone(), None),
        TxnOp::Get { key } => etcd_client::TxnOp::get(key.clone(), None),
    }
}

fn the_lease_of(txn: &Txn) -> Option<LeaseId> {
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            TxnOp::Put { lease, .. } => *lease,
            _ => None,
        })
}

/// Forwards one etcd watch stream into a `Watch` until either end goes away. The parts of a
/// fragmented answer (`fragment` set on all but its last) are joined into one batch, so a
/// batch never ends inside a revision (a grant transaction's keys come together).
async fn forward_watch(
    mut stream: etcd_client::WatchStream,
    sender: mpsc::Sender<Result<Vec<Event>, KvError>>,
) {
    let mut parts: Vec<Event> = Vec::new();
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            () = sender.closed() => return,
        };
        let batch = match message {
            Ok(Some(response)) if response.compact_revision() > 0 => Err(KvError::Compacted {
                compact_revision: response.compact_revision(),
            }),
            Ok(Some(response)) if response.canceled() => Err(KvError::Unavailable(format!(
                "etcd cancelled the watch: {}",
                response.cancel_reason()
            ))),
            Ok(Some(response)) => {
                parts.extend(response.events().iter().filter_map(|event| {
                    let kv = event.kv()?;
                    Some(match event.event_type() {
                        EventType::Put => Event::Put(key_value(kv.clone())),
                        EventType::Delete => Event::Delete {
                            key: kv.key().to_vec(),
                            mod_revision: kv.mod_revision(),
                        },
                    })
                }));
                if response.0.fragment {
                    continue;
                }
                Ok(std::mem::take(&mut parts))
            }
            Ok(None) => Err(KvError::Unavailable("etcd ended the watch stream".into())),
            Err(error) => Err(map_error(error, None)),
        };
        match batch {
            Ok(events) if events.is_empty() => {}
            Ok(events) => {
                if sender.send(Ok(events)).await.is_err() {
                    return;
                }
            }
            Err(error) => {
                let _ = sender.send(Err(error)).await;
                return;
            }
        }
    }
}

impl Kv for EtcdKv {
    async fn header(&self) -> Result<corral_kv::Header, KvError> {
        // A read of a key corral never writes: its header says which cluster answered, and
        // at which revision.
        match self
            .call("header", true, |client| async move {
                let options = GetOptions::new().with_count_only();
                client
                    .kv_client()
                    .get(b"\0corral/header".to_vec(), Some(options))
                    .await
            })
            .await
        {
            Ok(response) => Ok(corral_kv::Header {
                cluster_id: response.header().map_or(0, |h| h.cluster_id()),
                revision: response.header().map_or(0, |h| h.revision()),
            }),
            Err(error) => Err(self.error(error, None).await),
        }
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, KvError> {
        match self
            .call("get", true, |client| async move {
                client.kv_client().get(key, None).await
            })
            .await
        {
            Ok(mut response) => Ok(response.take_kvs().into_iter().next().map(key_value)),
            Err(error) => Err(self.error(error, None).await),
        }
    }

    async fn range_span(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        revision: Option<Revision>,
    ) -> Result<RangePage, KvError> {
        // etcd's range end "\0" is every key from the start on.
        let end = if end.is_empty() {
            vec![0]
        } else {
            end.to_vec()
        };
        let mut options = GetOptions::new()
            .with_range(end)
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let at = revision.filter(|revision| *revision > 0);
        if let Some(revision) = at {
            options = options.with_revision(revision);
        }
        let request = |options: GetOptions| {
            move |client: Client| {
                let (start, options) = (start.to_vec(), options.clone());
                async move {
                    client
                        .kv_client()
                        .max_decoding_message_size(MAX_ANSWER_BYTES)
                        .get(start, Some(options))
                        .await
                }
            }
        };
        // A read at a given revision answers the same on every member that has applied it
        // (MVCC): it is served by the member itself, without a round of the leader's read
        // index per page. A member that has not applied the revision yet says so (a future
        // revision), and the read goes the linearizable way, which waits until it has.
        let answer = if at.is_some() {
            match self
                .call("range", true, request(options.clone().with_serializable()))
                .await
            {
                Err(error) if is_future_revision(&error) => {
                    self.call("range", true, request(options)).await
                }
                answer => answer,
            }
        } else {
            self.call("range", true, request(options)).await
        };
        match answer {
            Ok(mut response) => {
                let current = response.header().map_or(0, |header| header.revision());
                Ok(RangePage {
                    kvs: response.take_kvs().into_iter().map(key_value).collect(),
                    more: response.more(),
                    count: u64::try_from(response.count()).unwrap_or(0),
                    revision: at.unwrap_or(current),
                })
            }
            Err(error) => Err(self.error(error, None).await),
        }
    }

    async fn range_last(&self, prefix: &[u8], limit: usize) -> Result<Vec<KeyValue>, KvError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // One request: the range sorted by key, descending, cut at `limit`.
        let options = GetOptions::new()
            .with_range(prefix_end(prefix))
            .with_sort(
                etcd_client::SortTarget::Key,
                etcd_client::SortOrder::Descend,
            )
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let request = |client: Client| {
            let options = options.clone();
            async move { client.kv_client().get(prefix, Some(options)).await }
        };
        match self.call("range", true, request).await {
            Ok(mut response) => Ok(response
                .take_kvs()
                .into_iter()
                .rev()
                .map(key_value)
                .collect()),
            Err(error) => Err(self.error(error, None).await),
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, KvError> {
        let request = etcd_client::Txn::new()
            .when(txn.compares.iter().map(compare).collect::<Vec<_>>())
            .and_then(txn.success.iter().map(txn_op).collect::<Vec<_>>())
            .or_else(txn.failure.iter().map(txn_op).collect::<Vec<_>>());
        let send = |client: Client| {
            let request = request.clone();
            async move { client.kv_client().txn(request).await }
        };
        match self.call("txn", false, send).await {
            Ok(response) => Ok(TxnResponse {
                succeeded: response.succeeded(),
                revision: response.header().map_or(0, |header| header.revision()),
                gets: response
                    .op_responses()
                    .into_iter()
                    .filter_map(|op| match op {
                        TxnOpResponse::Get(mut get) => {
                            Some(get.take_kvs().into_iter().next().map(key_value))
                        }
                        _ => None,
                    })
                    .collect(),
            }),
            Err(error) => Err(self.error(error, the_lease_of(&txn)).await),
        }
    }

    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, KvError> {
        let seconds = i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            .unwrap_or(i64::MAX)
            .max(1);
        // A grant sent twice leaves a lease nobody keeps alive, which expires: harmless.
        match self
            .call("lease grant", true, |client| async move {
                client.lease_client().grant(seconds, None).await
            })
            .await
        {
            Ok(response) => {
                let granted = Duration::from_secs(u64::try_from(response.ttl()).unwrap_or(0));
                self.granted
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .insert(response.id(), granted);
                Ok(LeaseId(response.id()))
            }
            Err(error) => Err(self.error(error, None).await),
        }
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, KvError> {
        // etcd-client's keep_alive sends one keep-alive on a new stream and reads its answer
        // (a TTL of 0, an unknown lease, is its "lease not found" error); dropping the keeper
        // and stream ends the stream.
        let keep_alive = |client: Client| async move {
            client.lease_client().keep_alive(lease.0).await.map(drop)
        };
        if let Err(error) = self.call("lease keep-alive", true, keep_alive).await {
            let error = self.error(error, Some(lease)).await;
            if matches!(error, KvError::LeaseNotFound(_)) {
                self.granted
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .remove(&lease.0);
            }
            return Err(error);
        }
        let known = self
            .granted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&lease.0)
            .copied();
        if let Some(ttl) = known {
            return Ok(ttl);
        }
        // A lease another client granted: ask for its TTL.
        let time_to_live =
            |client: Client| async move { client.lease_client().time_to_live(lease.0, None).await };
        match self.call("lease time-to-live", true, time_to_live).await {
            Ok(response) if response.ttl() < 0 => Err(KvError::LeaseNotFound(lease)),
            Ok(response) => Ok(Duration::from_secs(
                u64::try_from(response.granted_ttl()).unwrap_or(0),
            )),
            Err(error) => Err(self.error(error, Some(lease)).await),
        }
    }

    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        self.granted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&lease.0);
        match self
            .call("lease revoke", true, |client| async move {
                client.lease_client().revoke(lease.0).await
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => match self.error(error, Some(lease)).await {
                KvError::LeaseNotFound(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn watch(&self, prefix: &[u8], from: Revision) -> Result<Watch, KvError> {
        // Fragmented: etcd splits an answer past its request limit and gRPC's overhead (2 MiB
        // by default) into parts, which `forward_watch` joins again, so a backlog of any size
        // is taken.
        let options = WatchOptions::new()
            .with_range(prefix_end(prefix))
            .with_start_revision(from.max(0))
            .with_fragment();
        // Wait for etcd to confirm the watch, so that a write made after `watch` returns is
        // seen by a watch from revision 0.
        let created = |client: Client| {
            let options = options.clone();
            async move {
                // A watch that fell behind gets its backlog in one answer (a leader granting
                // 64 transactions at once was sent 10 MiB): past gRPC's default 4 MiB the
                // stream failed and the leader's term ended. Fragmented, its parts are
                // smaller; the limit stays for a server that does not fragment (a proxy).
                let mut stream = client
                    .watch_client()
                    .max_decoding_message_size(MAX_ANSWER_BYTES)
                    .watch(prefix, Some(options))
                    .await?;
                match stream.message().await? {
                    Some(response) if response.created() && !response.canceled() => Ok(stream),
                    Some(response) => Err(etcd_client::Error::WatchError(format!(
                        "watch not created: {}",
                        response.cancel_reason()
                    ))),
                    None => Err(etcd_client::Error::WatchError(
                        "watch stream ended before creation".into(),
                    )),
                }
            }
        };
        let stream = match self.call("watch", true, created).await {
            Ok(stream) => stream,
            Err(error) => return Err(self.error(error, None).await),
        };
        let (sender, receiver) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(forward_watch(stream, sender));
        Ok(Watch::new(receiver))
    }

    async fn compact(&self, revision: Revision) -> Result<(), KvError> {
        match self
            .call("compact", true, |client| async move {
                client.kv_client().compact(revision, None).await
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(self.error(error, None).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Credentials, CredentialsError, KvError, map_error, prefix_end, quorum_lost, telling,
    };

    #[test]
    fn a_password_file_gives_its_first_line_and_an_empty_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("corral-etcd-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let credentials = Credentials::from_file("node-a", &file).unwrap();
        assert_eq!(credentials.password, "s3cret");
        assert_eq!(
            format!("{credentials:?}"),
            r#"Credentials { user: "node-a", password: "***" }"#
        );
        std::fs::write(&file, "\n").unwrap();
        assert!(matches!(
            Credentials::from_file("node-a", &file),
            Err(CredentialsError::Empty { .. })
        ));
        let missing = dir.join("missing");
        let error = Credentials::from_file("node-a", &missing).unwrap_err();
        assert!(error.to_string().contains("missing"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn prefix_end_is_the_first_key_after_the_prefix() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn a_lost_quorum_is_named_and_a_plain_failure_is_not() {
        let named = |error: etcd_client::Error, refused, members| match map_error(
            quorum_lost(error, refused, members),
            None,
        ) {
            KvError::Unavailable(message) => message,
            other => panic!("{other:?}"),
        };
        let no_leader =
            || etcd_client::Error::GRpcStatus(tonic::Status::unavailable("etcdserver: no leader"));
        let timeout = || etcd_client::Error::Internal("get timed out after 1s".into());
        assert_eq!(
            named(no_leader(), 0, 3),
            "etcd has lost quorum (no leader): etcdserver: no leader"
        );
        // A reachable member that does not answer while the two others refuse: no quorum.
        let lost = named(timeout(), 2, 3);
        assert!(
            lost.starts_with("etcd has lost quorum (no leader): 1 of 3 members reachable"),
            "{lost}"
        );
        // A frozen member among reachable ones, or the only member: nothing more is known.
        assert!(!named(timeout(), 1, 3).contains("quorum"));
        assert!(!named(timeout(), 0, 1).contains("quorum"));
        // A refused connection says only that the member is down; an answer says more.
        let refused =
            etcd_client::Error::GRpcStatus(tonic::Status::unavailable("tcp connect error"));
        assert!(telling(&refused) < telling(&timeout()));
        assert!(telling(&timeout()) < telling(&no_leader()));
    }
}
