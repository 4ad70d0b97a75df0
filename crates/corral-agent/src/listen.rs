//! Serving one listener with hyper: a cap on the connections served at once, a header-read
//! (and idle) timeout, accept errors that back off instead of spinning, and graceful shutdown.
//!
//! Each listener has its own cap, so connections that never send a request (anyone can open
//! them on TCP, without the token) wait only on their own listener: the unix socket keeps
//! being served. The caps are fitted under the open-files limit with a reserve, so accepting
//! never runs the process out of file descriptors.

use std::future::Future;
use std::io;
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

use crate::config::ConnectionLimits;

/// File descriptors kept out of the connection caps: stdio, SQLite's database, log, lock and
/// index files, the runtime's epoll and wake-up descriptors, the listeners, and a margin.
pub(crate) const RESERVED_FDS: u64 = 64;

/// How long a listener waits after an accept error that is not one connection's own
/// (EMFILE, ENFILE, ENOBUFS, ENOMEM): the pending connection stays queued and the listener
/// stays readable, so retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// At most one message about failing accepts per listener in this time.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

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

/// The caps of both listeners, fitted under the open-files limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    pub unix: usize,
    pub tcp: usize,
}

/// Fits the configured caps under `open_files_limit` (the soft RLIMIT_NOFILE): after
/// [`RESERVED_FDS`], TCP gets at most a quarter of what is left and the socket at most half,
/// so even both listeners full leave descriptors for the store and for what else the agent
/// opens. `None` is an unlimited limit.
pub(crate) fn fit_caps(
    limits: &ConnectionLimits,
    open_files_limit: Option<u64>,
    with_tcp: bool,
) -> Caps {
    let budget = open_files_limit.map_or(u64::MAX, |limit| limit.saturating_sub(RESERVED_FDS));
    let share = |divisor: u64| {
        usize::try_from(budget / divisor)
            .unwrap_or(usize::MAX)
            .max(1)
    };
    Caps {
        unix: limits.max_unix.min(share(2)),
        tcp: if with_tcp {
            limits.max_tcp.min(share(4))
        } else {
            0
        },
    }
}

/// Raises the soft open-files limit to the hard one, so the caps rarely need lowering, and
/// returns the soft limit in force (`None`: unlimited).
pub(crate) fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum)
        && current < maximum
    {
        let raised = Rlimit {
            current: Some(maximum),
            maximum: Some(maximum),
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                eprintln!("corral agent: open files limit raised from {current} to {maximum}");
                return Some(maximum);
            }
            Err(error) => eprintln!(
                "corral agent: cannot raise the open files limit from {current} to {maximum}: \
                 {error}"
            ),
        }
    }
    limit.current
}

/// The soft open-files limit in force (`None`: unlimited).
pub(crate) fn open_files_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Serves `router` on `acceptor` (named `name` in messages) until `stop` turns true, then
/// lets the connections finish what they are answering and returns.
pub(crate) async fn serve<A: Acceptor>(
    acceptor: A,
    name: String,
    router: Router,
    max_connections: usize,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let connections = Arc::new(Semaphore::new(max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let service = TowerToHyperService::new(router);
    let mut last_logged: Option<Instant> = None;
    loop {
        // A connection slot first: past the cap, new connections wait in the kernel's queue
        // and take no file descriptor of the agent's.
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
                // A client that sends requests but never reads the answers would hold its
                // slot for ever (and stall a graceful shutdown): an answer that cannot be
                // written for as long as a request head may take ends the connection.
                let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
                stream.set_write_timeout(Some(header_timeout));
                let io = TokioIo::new(Box::pin(stream));
                let connection = http.serve_connection(io, service.clone());
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    // A client that goes away or times out is no error of the agent's.
                    let _ = connection.await;
                    drop(permit);
                });
            }
            // One connection's own failure: the next one may be fine.
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                if last_logged.is_none_or(|at| at.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL) {
                    eprintln!(
                        "corral agent: {name}: cannot accept a connection: {error}; retrying \
                         every {} ms",
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
    // Connections finish the answer they are writing; one that cannot within the grace is
    // left to the runtime's end rather than holding the agent half-stopped.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

/// How long a stopping listener waits for its connections to finish their answers.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn caps_fit_under_the_open_files_limit_with_tcp_below_the_socket() {
        let limits = ConnectionLimits::default();
        assert_eq!(
            fit_caps(&limits, Some(1 << 20), true),
            Caps {
                unix: 512,
                tcp: 128
            }
        );
        assert_eq!(fit_caps(&limits, None, false), Caps { unix: 512, tcp: 0 });
        // The usual 1,024: both listeners full still leave a quarter of the budget free.
        let caps = fit_caps(&limits, Some(1024), true);
        assert_eq!(
            caps,
            Caps {
                unix: 480,
                tcp: 128
            }
        );
        assert!(caps.unix + caps.tcp + (RESERVED_FDS as usize) < 1024);
        // A tiny limit still serves one connection on each.
        assert_eq!(fit_caps(&limits, Some(10), true), Caps { unix: 1, tcp: 1 });
    }

    /// A listener whose accepts fail with EMFILE (the process is out of file descriptors):
    /// a few hundred spins a second would eat a core; the loop backs off and stays alive.
    struct OutOfFiles {
        accepts: Arc<AtomicUsize>,
    }

    impl Acceptor for OutOfFiles {
        type Stream = UnixStream;

        async fn accept(&self) -> io::Result<Self::Stream> {
            self.accepts.fetch_add(1, Ordering::Relaxed);
            Err(io::Error::from_raw_os_error(24))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn accept_errors_back_off_instead_of_spinning_and_do_not_end_the_listener() {
        let accepts = Arc::new(AtomicUsize::new(0));
        let (stop_tx, stop_rx) = watch::channel(false);
        let served = tokio::spawn(serve(
            OutOfFiles {
                accepts: Arc::clone(&accepts),
            },
            "test listener".into(),
            Router::new(),
            4,
            Duration::from_secs(1),
            stop_rx,
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let in_one_second = accepts.load(Ordering::Relaxed);
        assert!(
            (5..=11).contains(&in_one_second),
            "{in_one_second} accepts in one second"
        );
        assert!(!served.is_finished(), "the listener gave up");
        stop_tx.send(true).unwrap();
        served.await.unwrap();
    }
}
