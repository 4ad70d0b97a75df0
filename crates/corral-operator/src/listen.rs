//! The API's listeners, with the agent's conventions: the unix socket (mode 0660; a stale
//! socket replaced, a live one or a path that is not a socket refused) and the optional
//! loopback TCP listener, each served with hyper's HTTP/1.1 connection builder under its own
//! cap of connections, a header-read (and idle) timeout, a write timeout, accept errors that
//! back off, and graceful shutdown.
//!
//! A small copy of `corral-agent`'s `listen.rs` and socket binding: linking corral-agent
//! would bring SQLite into the operator.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};

/// Connections served at once on the socket and on TCP (which anyone on the host can open
/// without the token, so it gets fewer).
pub const MAX_UNIX_CONNECTIONS: usize = 256;
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// A connection that sends no complete request head within this long (from its opening or
/// its previous answer) is closed; an answer that cannot be written within it, too.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a listener waits after an accept error that is not one connection's own.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// At most one message about failing accepts per listener in this time.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How long a stopping listener waits for its connections to finish their answers.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A file's device and inode: which file a path named at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileIdentity {
    device: u64,
    inode: u64,
}

impl FileIdentity {
    fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
        }
    }
}

/// Binds the unix socket at `path`: only a stale socket (one nobody answers on) is removed;
/// a live socket and a path that is not a socket are refused and left as they are. Sets mode
/// 0660 (owner and group may call the API). Answers the listener and the socket file's
/// identity, so shutdown removes this socket and nothing that replaced it.
pub(crate) fn bind_socket(path: &Path) -> Result<(UnixListener, FileIdentity), String> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err("another process is listening on it".into()),
                // Refused: nobody listens; the socket is a dead process's and can go.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)
                        .map_err(|e| format!("cannot remove the stale socket: {e}"))?;
                }
                Err(e) => {
                    return Err(format!(
                        "cannot tell whether another process listens on it: {e}"
                    ));
                }
            }
        }
        Ok(_) => {
            return Err(
                "it exists and is not a socket; refusing to replace it (name a socket path \
                 that does not exist yet)"
                    .into(),
            );
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.to_string()),
    }
    let listener = UnixListener::bind(path).map_err(|e| e.to_string())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| format!("cannot set its mode: {e}"))?;
    let identity = std::fs::symlink_metadata(path)
        .map(|metadata| FileIdentity::of(&metadata))
        .map_err(|e| e.to_string())?;
    Ok((listener, identity))
}

/// Removes the socket bound, unless the path names another file by now.
pub(crate) fn remove_socket(path: &Path, bound: FileIdentity) {
    if std::fs::symlink_metadata(path).is_ok_and(|metadata| FileIdentity::of(&metadata) == bound) {
        let _ = std::fs::remove_file(path);
    }
}

/// A listener's connections.
pub(crate) trait Acceptor: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    fn accept(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Acceptor for UnixListener {
    type Stream = UnixStream;

    async fn accept(&self) -> io::Result<UnixStream> {
        UnixListener::accept(self).await.map(|(stream, _)| stream)
    }
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;

    async fn accept(&self) -> io::Result<TcpStream> {
        TcpListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// Serves `router` on `acceptor` (named `name` in messages) until `stop` turns true, then
/// lets the connections finish what they are answering and returns.
pub(crate) async fn serve<A: Acceptor>(
    acceptor: A,
    name: String,
    router: Router,
    max_connections: usize,
    mut stop: watch::Receiver<bool>,
) {
    let connections = Arc::new(Semaphore::new(max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let service = TowerToHyperService::new(router);
    let mut last_logged: Option<Instant> = None;
    loop {
        // A connection slot first: past the cap, new connections wait in the kernel's queue.
        let permit = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            accepted = acceptor.accept() => accepted,
        };
        match accepted {
            Ok(stream) => {
                // A client that never reads its answers would hold its slot for ever.
                let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
                stream.set_write_timeout(Some(HEADER_TIMEOUT));
                let io = TokioIo::new(Box::pin(stream));
                let connection = graceful.watch(http.serve_connection(io, service.clone()));
                tokio::spawn(async move {
                    // A client that goes away or times out is no error of the operator's.
                    let _ = connection.await;
                    drop(permit);
                });
            }
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                if last_logged.is_none_or(|at| at.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL) {
                    eprintln!(
                        "corral operator: {name}: cannot accept a connection: {error}; \
                         retrying every {} ms",
                        ACCEPT_BACKOFF.as_millis()
                    );
                    last_logged = Some(Instant::now());
                }
                tokio::select! {
                    _ = stop.wait_for(|stopped| *stopped) => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
    drop(acceptor);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_is_replaced_a_live_one_and_a_file_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("op.sock");
        let (live, _) = bind_socket(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let error = bind_socket(&path).unwrap_err();
        assert!(error.contains("another process is listening"), "{error}");
        // Dropping the listener leaves the socket file behind, as a killed process would.
        drop(live);
        let (_again, again) = bind_socket(&path).unwrap();
        remove_socket(&path, again);
        assert!(!path.exists());
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "x").unwrap();
        let error = bind_socket(&file).unwrap_err();
        assert!(error.contains("not a socket"), "{error}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    }
}
