//! `corral operator`: the cluster authority on etcd. Replicas elect a leader through the
//! store; the leader hands node CIDRs and node IDs to registered nodes and carries out node
//! removals, every write a transaction fenced by its election key (see `election.rs`), the
//! decisions made by `corral-cluster`'s view (see `leader.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use corral_cluster::{ClusterName, Keys};
use corral_kv::{Kv, KvError};

pub mod api;
pub mod election;
mod leader;
mod listen;
pub mod openapi;
pub mod state;

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
}

impl OperatorConfig {
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
    pub const DEFAULT_WORKERS: usize = 16;
}

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("cluster name: {0}")]
    Cluster(String),
    #[error("cluster store: {0}")]
    Kv(#[from] KvError),
}

/// Runs a replica until `shutdown` completes: campaigns, leads while it can, campaigns again
/// when it lost the lead. On shutdown a leader resigns, so a standby takes over at once.
pub async fn run<K: Kv>(
    kv: K,
    config: OperatorConfig,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), OperatorError> {
    let keys = Keys::new(
        ClusterName::new(&config.cluster).map_err(|e| OperatorError::Cluster(e.to_string()))?,
    );
    let election = keys.election_prefix();
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let work = async {
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            let mut candidate = match election::Candidate::join(
                &kv,
                election.as_bytes(),
                &config.replica,
                config.lease_ttl,
            )
            .await
            {
                Ok(candidate) => candidate,
                Err(error) => {
                    failures += 1;
                    shared.note_problem(format!("joining the election: {error}"));
                    pause(failures, &mut stop).await;
                    continue;
                }
            };
            let fence = tokio::select! {
                fence = candidate.wait_to_lead(&kv, election.as_bytes()) => fence,
                _ = stop.changed() => {
                    candidate.resign(&kv).await;
                    return;
                }
            };
            let fence = match fence {
                Ok(fence) => fence,
                Err(error) => {
                    failures += 1;
                    shared.note_problem(format!("waiting to lead: {error}"));
                    candidate.resign(&kv).await;
                    pause(failures, &mut stop).await;
                    continue;
                }
            };
            failures = 0;
            eprintln!(
                "corral operator: {} leads (fence revision {})",
                config.replica, fence.revision
            );
            let mut lost = candidate.lost.clone();
            let outcome = leader::lead(
                &kv,
                &keys,
                &fence,
                &mut lost,
                &mut stop,
                &shared,
                config.workers.max(1),
            )
            .await;
            match outcome {
                Ok(()) => {
                    candidate.resign(&kv).await;
                    return;
                }
                Err(error) => {
                    shared.note_problem(format!("stopped leading: {error}"));
                    // Gone for good or not, the place is given up: a replica that cannot
                    // renew its lease must not keep a standby waiting for the TTL.
                    candidate.resign(&kv).await;
                    failures += 1;
                    pause(failures, &mut stop).await;
                }
            }
        }
    };
    tokio::pin!(work);
    tokio::select! {
        _ = &mut work => {}
        _ = shutdown => {
            let _ = stop_tx.send(true);
            work.await;
        }
    }
    Ok(())
}

/// Jittered backoff between attempts, 1 s doubling to 30 s, cut short by `stop`.
async fn pause(failures: u32, stop: &mut tokio::sync::watch::Receiver<bool>) {
    let base = Duration::from_millis(500u64 << failures.min(6)).min(Duration::from_secs(30));
    let jitter = u64::from(std::process::id().wrapping_mul(2_654_435_761) ^ failures) % 500;
    let wait = base + Duration::from_millis(jitter);
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = stop.changed() => {}
    }
}
