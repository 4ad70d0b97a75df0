//! Listening and running: the unix socket (mode 0660, its group `socket_group`), the optional
//! TCP listener, restore, the lease ticker, and shutdown on SIGINT / SIGTERM (one signal path,
//! [`shutdown_signal`], heard in every state: restoring, waiting for etcd, serving).

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use corral_store::{SqliteStore, StoreHealth};
use tokio::net::TcpListener;

use crate::api::{self, AppState};
use crate::committer::Committer;
use crate::config::AgentConfig;
use crate::listen;
use crate::local_routes::{self, LocalRoutesRequest};
use crate::metrics::Metrics;
use crate::node::{NodeState, Tick};

/// How often leases are expired and cooldowns ended.
const TICK: Duration = Duration::from_millis(500);

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("socket {path}: {message}")]
    Socket { path: String, message: String },
    #[error("tcp listener {addr}: {source}")]
    Tcp {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory: {0}")]
    Store(#[from] corral_store::StoreError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The cluster link found another live agent serving the node.
    #[error("cluster: {0}")]
    Cluster(String),
}

/// Runs the agent until `shutdown` completes. `on_ready` is called once the state is
/// restored and the API serves requests.
pub async fn serve(
    config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<(), AgentError> {
    serve_with(config, None, shutdown, on_ready).await
}

/// The agent's link to a cluster, started once the agent is ready: given the committer, the
/// state the API shows and a stop signal. The binary builds it on the cluster store it links
/// (`corral agent --etcd`), so this crate links no store client.
pub type ClusterTask = Box<
    dyn FnOnce(
            Committer,
            crate::link::SharedClusterState,
            tokio::sync::watch::Receiver<bool>,
        ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
        + Send,
>;

/// [`serve`], with the agent's link to a cluster, if any.
pub async fn serve_with(
    config: AgentConfig,
    cluster: Option<ClusterTask>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<(), AgentError> {
    // The directory first: a second agent on the same state must fail before it touches
    // the socket of the first.
    let store = SqliteStore::open_owned(&config.data_dir, &config.socket)?;
    let state = app_state(&config, store.health(), cluster.is_some());
    // Only a stale socket (a killed agent's) is replaced; a socket another agent answers on,
    // and anything that is not a socket (a configuration file given to `--socket` by
    // mistake), are refused and left as they are.
    let (unix, socket_identity) =
        corral_http::bind_socket(&config.socket, "agent").map_err(|message| {
            AgentError::Socket {
                path: config.socket.display().to_string(),
                message,
            }
        })?;
    // The socket's group (mode 0660: its members may connect); a failure leaves nothing
    // half served.
    if let Some(group) = &config.socket_group {
        let gid = rustix::fs::Gid::from_raw(group.gid);
        if let Err(error) = rustix::fs::chown(&config.socket, None, Some(gid)) {
            corral_http::remove_socket(&config.socket, socket_identity);
            return Err(AgentError::Socket {
                path: config.socket.display().to_string(),
                message: format!(
                    "cannot give it group {} (gid {}): {error}",
                    group.name, group.gid
                ),
            });
        }
    }
    let router = api::router(state.clone());
    let tcp = match config.tcp {
        Some(addr) => Some((
            TcpListener::bind(addr)
                .await
                .map_err(|source| AgentError::Tcp {
                    addr: addr.to_string(),
                    source,
                })?,
            api::with_token(
                router.clone(),
                Arc::from(config.token.as_ref().map_or("", |t| t.as_str())),
            ),
        )),
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let limits = config.connections;
    let caps = listen::fit_caps(&limits, listen::open_files_limit(), tcp.is_some());
    if caps.unix < limits.max_unix || (tcp.is_some() && caps.tcp < limits.max_tcp) {
        tracing::warn!(
            unix = caps.unix,
            tcp = caps.tcp,
            "serving fewer connections at once than asked, to fit the open files limit"
        );
    }
    let unix_task = tokio::spawn(corral_http::serve(
        unix,
        format!("socket {}", config.socket.display()),
        router,
        caps.unix,
        limits.header_timeout,
        stop_rx.clone(),
    ));
    let tcp_task = tcp.map(|(listener, router)| {
        let name = listener
            .local_addr()
            .map_or_else(|_| "tcp".to_owned(), |addr| format!("tcp {addr}"));
        tokio::spawn(corral_http::serve(
            listener,
            name,
            router,
            caps.tcp,
            limits.header_timeout,
            stop_rx.clone(),
        ))
    });
    // A signal from here on stops the start where it is (`stopped`): the restore, the DELs
    // recorded while the agent was away; the listeners stop and the socket goes either way.
    tokio::pin!(shutdown);
    // Restore off the async threads; requests meanwhile get 503.
    let declared = config.pools.clone();
    let broken_scopes = Arc::clone(&state.broken_scopes);
    let interface_counters = state.metrics.interface_counters.clone();
    let history = config.history;
    let restore = tokio::task::spawn_blocking(move || {
        hold_restore_for_tests();
        NodeState::restore(store, &declared).map(|node| {
            node.with_broken_gauge(broken_scopes)
                .with_interface_counters(interface_counters)
                .with_history(history)
        })
    });
    let node = tokio::select! {
        biased;
        () = &mut shutdown => None,
        node = restore => Some(node.map_err(|e| std::io::Error::other(e.to_string()))??),
    };
    let committer = match node {
        Some(node) => {
            // What the configuration file asked for that could not be applied: said at
            // start, and in `corral status` for as long as the agent runs.
            for warning in node.warnings() {
                tracing::warn!("{warning}");
            }
            Some(Committer::start(node)?)
        }
        None => None,
    };
    // DELs corral-ipam recorded while the agent was away are applied before anything is
    // served (requests meanwhile get 503), so none can follow an ADD of its attachment.
    let pending_applied = match &committer {
        Some(committer) => tokio::select! {
            biased;
            () = &mut shutdown => false,
            applied = crate::pending::apply_pending(committer, &config.socket, &config.cni_data_dirs) => {
                applied?;
                true
            }
        },
        None => false,
    };
    let fatal = match &committer {
        Some(committer) if pending_applied => {
            run_started(
                &state,
                committer,
                cluster,
                true,
                (stop_tx, stop_rx),
                shutdown,
                on_ready,
            )
            .await
        }
        _ => {
            tracing::info!("stopped before the agent was ready");
            let _ = stop_tx.send(true);
            None
        }
    };
    let _ = unix_task.await;
    if let Some(task) = tcp_task {
        let _ = task.await;
    }
    // The socket goes while the directory is still ours: a successor agent binds its own
    // socket only after it got the directory, so this cannot remove the successor's.
    corral_http::remove_socket(&config.socket, socket_identity);
    // The committer finishes its batch in progress and closes the store.
    if let Some(committer) = committer {
        let _ = tokio::task::spawn_blocking(move || committer.close()).await;
    }
    drop(state);
    match fatal {
        Some(message) => Err(AgentError::Cluster(message)),
        None => Ok(()),
    }
}

/// Debug builds only: with `CORRAL_AGENT_TEST_HOLD_RESTORE` set, the restore never ends, so
/// a test can signal an agent that is certainly restoring (answering 503) and see it stop
/// all the same (`tests/signals.rs`). A release build has no such switch.
fn hold_restore_for_tests() {
    #[cfg(debug_assertions)]
    if std::env::var_os("CORRAL_AGENT_TEST_HOLD_RESTORE").is_some() {
        tracing::warn!("the restore is held (CORRAL_AGENT_TEST_HOLD_RESTORE)");
        loop {
            std::thread::park();
        }
    }
}

/// The state the API serves from, before the node state is restored (requests get 503):
/// with a cluster link's shared state when `linked`.
pub(crate) fn app_state(config: &AgentConfig, store_health: StoreHealth, linked: bool) -> AppState {
    let metrics = Arc::new(Metrics::default());
    AppState {
        committer: Arc::new(OnceLock::new()),
        ready: Arc::new(AtomicBool::new(false)),
        became_ready: Arc::default(),
        store_health,
        cluster: linked.then(|| Arc::new(crate::link::ClusterShared::new(metrics.cluster.clone()))),
        metrics,
        broken_scopes: Arc::default(),
        body_timeout: config.connections.body_timeout,
        pool_wait: config.pool_wait,
        adds: Arc::default(),
    }
}

/// The agent from a started committer on: the first tick, the local routes reserved (when
/// `reserve_local_routes`), the cluster link started and its gate passed, ready (`on_ready`),
/// the lease ticker, until `shutdown` or the link's fatal error (returned); then `stop` is
/// sent and the ticker and the link are awaited. The rest of [`serve_with`], and the whole
/// of the in-memory agent's run in `testing.rs`.
pub(crate) async fn run_started(
    state: &AppState,
    committer: &Committer,
    cluster: Option<ClusterTask>,
    reserve_local_routes: bool,
    (stop_tx, stop_rx): (
        tokio::sync::watch::Sender<bool>,
        tokio::sync::watch::Receiver<bool>,
    ),
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(),
) -> Option<String> {
    let _ = state.committer.set(committer.clone());
    // The first tick releases what expired while the agent was down, now that the restore
    // has finished; then the agent is ready.
    if let Ok(n) = committer.call(Tick {}).await {
        state.metrics.leases_expired.inc_by(n as u64);
    }
    // What the node's routes and addresses cover is excluded before anything is handed out.
    if reserve_local_routes {
        reserve_local_routes_at_start(committer).await;
    }
    // In a cluster, nothing is served before the link holds the node's liveness key (or
    // could not ask: etcd unreachable): a second agent under the node's name (a cloned
    // machine, a copied state directory) must not hand out the node's addresses. Grants
    // arrive as they come, each recorded durably before it is used.
    let cluster_task = match (cluster, &state.cluster) {
        (Some(task), Some(shared)) => Some(tokio::spawn(task(
            committer.clone(),
            Arc::clone(shared),
            stop_rx.clone(),
        ))),
        _ => None,
    };
    tokio::pin!(shutdown);
    let mut fatal: Option<String> = None;
    let mut stopped = false;
    if let Some(shared) = &state.cluster {
        tokio::select! {
            gate = shared.wait_gate() => fatal = gate.err(),
            () = &mut shutdown => stopped = true,
        }
    }
    if fatal.is_none() && !stopped {
        state.set_ready();
        on_ready();
    }
    let ticker = {
        let committer = committer.clone();
        let metrics = Arc::clone(&state.metrics);
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            loop {
                tokio::select! {
                    _ = interval.tick() => {
                        if let Ok(n) = committer.call(Tick {}).await {
                            metrics.leases_expired.inc_by(n as u64);
                        }
                    }
                    _ = stop.changed() => break,
                }
            }
        })
    };
    if fatal.is_none() && !stopped {
        fatal = match &state.cluster {
            Some(shared) => tokio::select! {
                message = shared.wait_fatal() => Some(message),
                () = &mut shutdown => None,
            },
            None => {
                shutdown.await;
                None
            }
        };
    }
    let _ = stop_tx.send(true);
    let _ = ticker.await;
    if let Some(task) = cluster_task {
        let _ = task.await;
    }
    fatal
}

/// Runs the agent on its own runtime until SIGINT or SIGTERM. The process's soft open-files
/// limit is raised to its hard limit first (see `listen.rs`).
pub fn run(
    config: AgentConfig,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<(), AgentError> {
    run_with(config, None, on_ready)
}

/// [`run`], with the agent's link to a cluster, if any.
pub fn run_with(
    config: AgentConfig,
    cluster: Option<ClusterTask>,
    on_ready: impl FnOnce() + Send + 'static,
) -> Result<(), AgentError> {
    listen::raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("corral-agent")
        .build()?;
    let shutdown = {
        let _runtime = runtime.enter();
        shutdown_signal()?
    };
    let result = runtime.block_on(serve_with(config, cluster, shutdown, on_ready));
    // A restore or a store call still running on a blocking thread when a signal cut the
    // start short is not waited for: SQLite's journal makes its end as safe as a kill.
    runtime.shutdown_timeout(Duration::ZERO);
    result
}

/// The daemons' one signal path: SIGINT and SIGTERM are caught from this call on (it must run
/// inside a runtime), and the future it answers completes on the first of them. Installed
/// before anything else starts, so a signal during start-up (a restore, etcd unreachable, a
/// wait for `cluster init`) is never left to the default action or ignored; every wait loop
/// of the daemon then selects on it (`corral agent` and `corral operator` use it).
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stopping");
    })
}

/// An agent running on a thread of its own (with its own runtime), for embedding and tests.
#[derive(Debug)]
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), AgentError>>>,
}

impl Running {
    /// Starts the agent and waits until it is ready (its state restored), or failed.
    pub fn start(config: AgentConfig) -> Result<Running, AgentError> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("corral-agent".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                runtime.block_on(serve(
                    config,
                    async move {
                        let _ = stopped.await;
                    },
                    move || {
                        let _ = ready_tx.send(());
                    },
                ))
            })?;
        let mut running = Running {
            stop: Some(stop),
            thread: Some(thread),
        };
        if ready_rx.recv().is_err() {
            // The thread ended before it was ready: its error says why.
            return Err(running.join().unwrap_or_else(|| {
                AgentError::Io(std::io::Error::other(
                    "the agent stopped before it was ready",
                ))
            }));
        }
        Ok(running)
    }

    /// Stops the agent (as SIGTERM would) and waits for it to close its state.
    pub fn stop(mut self) -> Result<(), AgentError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join().map_or(Ok(()), Err)
    }

    fn join(&mut self) -> Option<AgentError> {
        match self.thread.take()?.join() {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(_) => Some(AgentError::Io(std::io::Error::other(
                "the agent thread panicked",
            ))),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.join();
    }
}

/// The reservation the agent makes when it starts, before it is ready: a failure is logged
/// and the agent starts anyway (with the exclusions it kept from its last run).
async fn reserve_local_routes_at_start(committer: &Committer) {
    let outcome = match crate::netlink::read_host_networks_off_thread().await {
        Ok(host) => {
            let reserve = LocalRoutesRequest {
                scope: corral_api::NODE_SCOPE.to_owned(),
                host,
            };
            committer.call(reserve).await
        }
        Err(error) => Err(error),
    };
    match outcome {
        Ok(response) => {
            local_routes::log(&response);
        }
        Err(error) => tracing::warn!(
            error = %error.message,
            "local routes not reserved at start"
        ),
    }
}
