//! `corral operator`: the cluster authority on etcd. Replicas elect a leader through the
//! store; the leader hands node CIDRs and node IDs to registered nodes and carries out node
//! removals, every write a transaction fenced by its election key (see `election.rs`), the
//! decisions made by `corral-cluster`'s view (see `leader.rs`). Given a cloud provider, the
//! leader also manages the cloud interfaces and addresses of cloud pools (`leader/cloud/`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use corral_cloud::{CloudProvider, Scheduled, SchedulerConfig};
use corral_cluster::{ClusterName, Keys};
use corral_kv::{Kv, KvError};

pub mod api;
pub mod config;
pub mod dashboard;
pub mod election;
pub mod epoch;
pub mod fuzz;
pub mod history;
mod leader;
mod listen;
pub mod openapi;
pub mod problems;
pub mod state;

pub use leader::{TrimError, apply_read_page, trim_history};
/// How often the leader trims the grants' history.
pub const HISTORY_TRIM_EVERY: Duration = leader::HISTORY_TRIM_EVERY;
pub use state::{Shared, TxnOutcome};

/// How an operator replica runs.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// The cluster's name: its keys live under `/corral/<cluster>/v1/`.
    pub cluster: String,
    /// This replica's name, shown as the leader.
    pub replica: String,
    /// The election lease's TTL: a standby takes over within about this long after the
    /// leader died.
    pub lease_ttl: Duration,
    /// Transactions in flight at once.
    pub workers: usize,
    /// Keys per range request when a new leader (or a resync) reads the whole prefix: fewer,
    /// larger pages cost etcd fewer requests (a page is cut to about `corral_kv::PAGE_BYTES`
    /// whatever this says).
    pub page: usize,
    /// Operations a transaction may hold: etcd's `--max-txn-ops` (128 by default). Grant
    /// batches fill it; one etcd refuses makes the leader fall back to 128.
    pub max_txn_ops: usize,
}

impl OperatorConfig {
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
    /// 64 transactions in flight keep a 3-member etcd's pipeline full: at 30,000 nodes,
    /// 17% more grants a second than 32, 28% more than 16 (BENCHMARKS.md).
    pub const DEFAULT_WORKERS: usize = 64;
    pub const DEFAULT_PAGE: usize = 10_000;
}

/// The wall clock of the cloud node manager, in milliseconds since the epoch: intents,
/// creation tags, the leak collector's ages and the release delay are measured on it. Tests on
/// tokio's paused clock give one that follows virtual time.
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system's wall clock.
pub fn system_clock() -> WallClock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

/// The cloud node manager's settings: it runs on the leader only, and only when the
/// configuration has cloud pools.
pub struct CloudOptions<P> {
    /// The cloud account (EC2, or the fake of `corral_cloud`'s `fake` feature); the manager
    /// schedules every call through per-action token buckets of its own.
    pub provider: Arc<P>,
    /// Nodes served at once (each node in at most one task).
    pub workers: usize,
    /// Full resync of the cloud view (every interface, subnet): Cilium's 1 minute.
    pub resync: Duration,
    /// Milliseconds since the epoch.
    pub clock: WallClock,
    /// The cloud call scheduler: per-action token buckets (EC2's by default), retries.
    pub scheduler: SchedulerConfig,
}

impl<P> CloudOptions<P> {
    pub const DEFAULT_WORKERS: usize = 16;
    pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);

    /// Defaults: 16 workers, a full resync every 60 s, the system clock.
    pub fn new(provider: Arc<P>) -> CloudOptions<P> {
        CloudOptions {
            provider,
            workers: Self::DEFAULT_WORKERS,
            resync: Self::DEFAULT_RESYNC,
            clock: system_clock(),
            scheduler: SchedulerConfig::default(),
        }
    }
}

impl<P> Clone for CloudOptions<P> {
    fn clone(&self) -> Self {
        CloudOptions {
            provider: Arc::clone(&self.provider),
            workers: self.workers,
            resync: self.resync,
            clock: Arc::clone(&self.clock),
            scheduler: self.scheduler.clone(),
        }
    }
}

impl<P> std::fmt::Debug for CloudOptions<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudOptions")
            .field("workers", &self.workers)
            .field("resync", &self.resync)
            .finish_non_exhaustive()
    }
}

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("cluster name: {0}")]
    Cluster(String),
    #[error("cluster store: {0}")]
    Kv(#[from] KvError),
    #[error("cloud call scheduler: {0}")]
    Cloud(corral_cloud::CloudError),
}

/// Runs a replica until `shutdown` completes: campaigns, leads while it can, campaigns again
/// when it lost the lead. On shutdown a leader resigns, so a standby takes over at once.
pub async fn run<K: Kv>(
    kv: K,
    config: OperatorConfig,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), OperatorError> {
    run_with_cloud::<K, corral_cloud::NoCloud>(kv, config, shared, None, shutdown).await
}

/// [`run`], and with `cloud` the leader also runs the cloud node manager for the
/// configuration's cloud pools (none configured: it makes no call).
pub async fn run_with_cloud<K: Kv, P: CloudProvider + 'static>(
    kv: K,
    config: OperatorConfig,
    shared: Arc<Shared>,
    cloud: Option<CloudOptions<P>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), OperatorError> {
    let keys = Keys::new(
        ClusterName::new(&config.cluster).map_err(|e| OperatorError::Cluster(e.to_string()))?,
    );
    let election = keys.election_prefix();
    {
        let (kv, keys) = (kv.clone(), keys.clone());
        shared.set_history_reader(Arc::new(move |config, request, held| {
            let (kv, keys) = (kv.clone(), keys.clone());
            Box::pin(async move {
                let now_ms = (system_clock())();
                history::read_with_held(&kv, &keys, &config, &request, now_ms, held).await
            })
        }));
    }
    // One scheduler for the process (its buckets remember what the account was sent across
    // terms, its counters feed the metrics); a session of it per leadership term.
    let cloud = match cloud {
        Some(options) => {
            let scheduler =
                Scheduled::new(Arc::clone(&options.provider), options.scheduler.clone())
                    .map_err(OperatorError::Cloud)?;
            let stats = scheduler.clone();
            shared.set_cloud_stats(Box::new(move || stats.stats()));
            Some((options, scheduler))
        }
        None => None,
    };
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    // A standby keeps up with etcd's time too (one header read a second), so the replica
    // that takes over after a restore knows the revision the cluster had reached
    // (`epoch.rs`); the leader reads it in its loop.
    let probe = {
        let (kv, shared, mut stop) = (kv.clone(), Arc::clone(&shared), stop.clone());
        let every = config
            .lease_ttl
            .clamp(Duration::from_millis(500), Duration::from_secs(1));
        async move {
            loop {
                if !shared.leading() {
                    let _ = shared.probe_epoch(&kv).await;
                }
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(every) => {}
                    () = stopped(&mut stop) => return,
                }
            }
        }
    };
    let probe = tokio::spawn(probe);
    let work = async {
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            // etcd's time before this replica writes anything (its election key) to a store
            // that may have come back from a snapshot. Each call to etcd here selects on the
            // stop, so an unreachable etcd never holds a stopping replica for its timeouts (a
            // join cut short leaves at most a key on a lease that expires by itself).
            tokio::select! {
                biased;
                () = stopped(&mut stop) => return,
                _ = shared.probe_epoch(&kv) => {}
            }
            let joined = tokio::select! {
                biased;
                () = stopped(&mut stop) => return,
                joined = election::Candidate::join(
                    &kv,
                    election.as_bytes(),
                    &config.replica,
                    config.lease_ttl,
                ) => joined,
            };
            let mut candidate = match joined {
                Ok(candidate) => {
                    // A candidate again: the election's trouble is over.
                    shared.resolve("election", &config.replica);
                    candidate
                }
                Err(error) => {
                    failures += 1;
                    shared.raise(
                        "election",
                        &config.replica,
                        format!("joining the election: {error}"),
                    );
                    pause(failures, &mut stop).await;
                    continue;
                }
            };
            let fence = tokio::select! {
                biased;
                fence = candidate.wait_to_lead(&kv, election.as_bytes()) => fence,
                () = stopped(&mut stop) => {
                    candidate.resign(&kv).await;
                    return;
                }
            };
            let fence = match fence {
                Ok(fence) => fence,
                Err(error) => {
                    failures += 1;
                    shared.raise(
                        "election",
                        &config.replica,
                        format!("waiting to lead: {error}"),
                    );
                    candidate.resign(&kv).await;
                    pause(failures, &mut stop).await;
                    continue;
                }
            };
            failures = 0;
            tracing::info!(
                replica = %config.replica,
                fence_revision = fence.revision,
                "leading"
            );
            let mut lost = candidate.lost.clone();
            let outcome = leader::lead(
                &kv,
                &keys,
                &fence,
                &mut lost,
                &mut stop,
                &shared,
                leader::Sizes {
                    workers: config.workers.max(1),
                    page: config.page.max(1),
                    txn_ops: config.max_txn_ops.max(corral_kv::MAX_TXN_OPS),
                },
                cloud
                    .as_ref()
                    .map(|(options, scheduler)| (options, scheduler)),
            )
            .await;
            match outcome {
                Ok(()) => {
                    candidate.resign(&kv).await;
                    return;
                }
                Err(error) => {
                    shared.raise(
                        "election",
                        &config.replica,
                        format!("stopped leading: {error}"),
                    );
                    // Gone for good or not, the place is given up: a replica that cannot
                    // renew its lease must not keep a standby waiting for the TTL.
                    candidate.resign(&kv).await;
                    failures += 1;
                    pause(failures, &mut stop).await;
                }
            }
        }
    };
    // Every replica looks at the election keys about once a second and reports those that are
    // not candidates (a key written by hand): the election passes them over, people should
    // know. The lowest candidate's value names the leader (a standby's 503 names it).
    let monitor = async {
        let every = config
            .lease_ttl
            .clamp(Duration::from_millis(500), Duration::from_secs(1));
        loop {
            if let Ok((entries, _)) = corral_kv::read_all(&kv, election.as_bytes(), 1000).await {
                shared.set_election_problems(election::problems(election.as_bytes(), &entries));
                shared.set_leader_seen(corral_cluster::election_leader(
                    &keys,
                    entries.iter().map(|e| {
                        let lease = e.lease.map(|l| l.0);
                        (e.key_str(), lease, e.create_revision, e.value.as_slice())
                    }),
                ));
            }
            tokio::time::sleep(every).await;
        }
    };
    tokio::pin!(work);
    tokio::pin!(monitor);
    tokio::select! {
        biased;
        _ = &mut work => {}
        () = &mut monitor => {}
        _ = shutdown => {
            let _ = stop_tx.send(true);
            work.await;
        }
    }
    probe.abort();
    Ok(())
}

/// Jittered backoff between attempts, 1 s doubling to 30 s, cut short by `stop`.
async fn pause(failures: u32, stop: &mut tokio::sync::watch::Receiver<bool>) {
    let base = Duration::from_millis(500u64 << failures.min(6)).min(Duration::from_secs(30));
    let jitter = u64::from(std::process::id().wrapping_mul(2_654_435_761) ^ failures) % 500;
    let wait = base + Duration::from_millis(jitter);
    tokio::select! {
        biased;
        _ = tokio::time::sleep(wait) => {}
        () = stopped(stop) => {}
    }
}

/// Completes once `stop` is true (at once if it is already): what every wait of the replica
/// selects on. Holds no borrow of the value past its end, so a future that awaits after it
/// stays `Send`.
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
