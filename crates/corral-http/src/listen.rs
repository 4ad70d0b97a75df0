//! Serving one listener with hyper: a cap on the connections served at once, a header-read
//! (and idle) timeout, a write timeout, accept errors that back off instead of spinning, and
//! graceful shutdown.
//!
//! Every request runs in a span of its own (`request`, at debug level: method, path, a request
//! id unique in the process, and `container_id` and `ifname` left for a CNI verb's handler to
//! record) and is logged when answered: at debug level, at warn level (with its method and
//! path) for a 5xx answer other than 503 (not ready yet, a standby).
//!
//! Each listener has its own cap, so connections that never send a request (anyone can open
//! them on TCP, without the token) wait only on their own listener: the unix socket keeps
//! being served.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tracing::Instrument as _;

/// How long a listener waits after an accept error that is not one connection's own
/// (EMFILE, ENFILE, ENOBUFS, ENOMEM): the pending connection stays queued and the listener
/// stays readable, so retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// At most one message about failing accepts per listener in this time.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How long a stopping listener waits for its connections to finish their answers.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A listener's connections.
pub trait Acceptor: Send + 'static {
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

/// Serves `router` on `acceptor` until `stop` turns true, then lets the connections finish
/// what they are answering and returns.
///
/// `name` is the listener's, as its messages say it (the `listener` field: `socket
/// /run/corral/agent.sock`, `tcp 127.0.0.1:9000`). At most `max_connections` are served at
/// once; a connection that sends no complete request head within `header_timeout` (from its
/// opening or its previous answer) is closed, and so is one whose answer cannot be written
/// within it.
pub async fn serve<A: Acceptor>(
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
    let service = TowerToHyperService::new(router.layer(middleware::from_fn(in_request_span)));
    let mut last_logged: Option<Instant> = None;
    loop {
        // A connection slot first: past the cap, new connections wait in the kernel's queue
        // and take no file descriptor of the daemon's.
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
                    // A client that goes away or times out is no error of the daemon's.
                    let _ = connection.await;
                    drop(permit);
                });
            }
            // One connection's own failure: the next one may be fine.
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                if last_logged.is_none_or(|at| at.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL) {
                    tracing::error!(
                        listener = %name,
                        %error,
                        retry_ms = ACCEPT_BACKOFF.as_millis(),
                        "cannot accept a connection"
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
    // left to the runtime's end rather than holding the daemon half-stopped.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

/// The id of the process's next request (its span's `request_id`).
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

/// Runs a request inside its span and logs its answer: the status and how long it took.
///
/// The span is at debug level, as the answers are: at the default level neither costs the
/// request anything (the allocation benchmarks run there), and a failed answer, logged at
/// warn, names its method and path itself.
async fn in_request_span(request: Request, next: Next) -> Response {
    let span = tracing::debug_span!(
        "request",
        method = %request.method(),
        path = request.uri().path(),
        request_id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed),
        container_id = tracing::field::Empty,
        ifname = tracing::field::Empty,
    );
    let (method, uri) = (request.method().clone(), request.uri().clone());
    async move {
        let started = Instant::now();
        let response = next.run(request).await;
        let status = response.status().as_u16();
        let took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        // A 503 is a daemon not ready yet or a standby, as designed; other 5xx are failures.
        let failed = response.status().is_server_error()
            && response.status() != axum::http::StatusCode::SERVICE_UNAVAILABLE;
        if failed {
            tracing::warn!(%method, path = uri.path(), status, took_us, "answered");
        } else {
            tracing::debug!(status, took_us, "answered");
        }
        response
    }
    .instrument(span)
    .await
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
    use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// A writer of log lines into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What `uri` answered by `status` logs, at `level` and above.
    async fn logged(status: u16, level: tracing::Level) -> String {
        use tower::ServiceExt as _;
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let router = Router::new()
            .route(
                "/v1/thing",
                axum::routing::get(move || async move {
                    axum::http::StatusCode::from_u16(status).unwrap()
                }),
            )
            .layer(middleware::from_fn(in_request_span));
        let request = Request::builder()
            .uri("/v1/thing")
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = router.oneshot(request).await.unwrap();
        assert_eq!(answer.status().as_u16(), status);
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    #[tokio::test]
    async fn a_request_is_answered_in_its_span_and_a_failure_names_itself_at_warn() {
        // At debug level: the answer inside the request's span.
        let log = logged(200, tracing::Level::DEBUG).await;
        assert!(
            log.starts_with("DEBUG request{method=GET path=\"/v1/thing\" request_id=")
                && log.contains("}: corral_http::listen: answered status=200 took_us="),
            "{log}"
        );
        // At the default level: nothing for a request that went well, nor for a 503 (a
        // daemon not ready yet, a standby)...
        assert_eq!(logged(200, tracing::Level::INFO).await, "");
        assert_eq!(logged(503, tracing::Level::INFO).await, "");
        // ...and a failure names its method and path itself.
        let log = logged(500, tracing::Level::INFO).await;
        assert!(
            log.starts_with(
                " WARN corral_http::listen: answered method=GET path=\"/v1/thing\" status=500 took_us="
            ),
            "{log}"
        );
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
