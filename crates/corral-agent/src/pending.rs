//! Pending DELs: releases corral-ipam recorded under a CNI `dataDir` while the agent was away
//! (see `corral_store::PendingDel`), applied when the agent starts, before it serves anything.
//!
//! Each record meant for this agent's socket is claimed (renamed, so corral-ipam settling the
//! same attachment cannot apply it too), sent through the committer as the DEL it stands for,
//! and removed, durably, only once the release is committed. A record the agent could not
//! apply (its store refused) is put back for the next start or the attachment's next ADD. A
//! malformed record, or one for another agent's socket, is reported and left as it is.
//!
//! A claimed record that cannot be removed or put back stops the start: serving an ADD of
//! its attachment while it lingers would let the next start release what that ADD obtained.

use std::path::{Path, PathBuf};

use corral_api as api;
use corral_store::{Claimed, PendingDel, PendingFile, claim_all_for_agent};

use crate::committer::Committer;
use crate::node::CniDel;

/// What a start found and did, for its report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingReport {
    pub applied: usize,
    /// Records put back because the agent refused them, with why.
    pub refused: Vec<String>,
    /// Malformed records, or records for another agent, left as they are.
    pub left: Vec<String>,
}

/// Whether a record's socket is this agent's, however either path is spelled.
fn same_socket(recorded: &Path, socket: &Path) -> bool {
    recorded == socket
        || matches!(
            (recorded.canonicalize(), socket.canonicalize()),
            (Ok(a), Ok(b)) if a == b
        )
}

/// The DEL a record stands for, as corral-ipam would have sent it.
///
/// A network that allocates from a pool of the node's own scope (`"pool"` without ranges in
/// agent mode) is recorded as that one pool without ranges, a form no network with ranges
/// takes; its DEL goes to that node pool.
fn request(record: &PendingDel) -> api::CniKeyRequest {
    let node_pool = match record.pools.as_slice() {
        [pool] if pool.ranges.is_empty() => Some(pool.name.clone()),
        _ => None,
    };
    let network = match node_pool {
        Some(pool) => api::CniNetwork::on_node_pool(&record.network, pool),
        None => api::CniNetwork::with_pools(
            &record.network,
            record
                .pools
                .iter()
                .map(|pool| api::CniPool {
                    name: pool.name.clone(),
                    cooldown_ms: pool.cooldown_ms,
                    lowest_free: pool.lowest_free,
                    ranges: pool.ranges.iter().map(|r| r.range.clone()).collect(),
                    exclusions: pool
                        .exclusions
                        .iter()
                        .map(|(network, reason)| api::ExclusionInfo {
                            network: network.clone(),
                            reason: reason.clone(),
                        })
                        .collect(),
                })
                .collect(),
        ),
    };
    api::CniKeyRequest {
        network,
        key: api::AttachmentKey {
            network: record.network.clone(),
            container_id: record.container_id.clone(),
            ifname: record.ifname.clone(),
        },
    }
}

/// Applies every pending DEL for `socket` under `data_dirs`. Reports are logged as they
/// happen; an error means a claimed record could not be removed or put back, and the agent
/// must not serve.
pub async fn apply_pending(
    committer: &Committer,
    socket: &Path,
    data_dirs: &[PathBuf],
) -> Result<PendingReport, std::io::Error> {
    let mut report = PendingReport::default();
    for data_dir in data_dirs {
        // Small files, once, before anything is served: read on this thread.
        let files = match claim_all_for_agent(data_dir, |recorded| same_socket(recorded, socket)) {
            Ok(files) => files,
            Err(error) => {
                let note = format!("pending DELs in {}: {error}", data_dir.display());
                tracing::warn!(data_dir = %data_dir.display(), %error, "pending DELs not read");
                report.left.push(note);
                continue;
            }
        };
        for file in files {
            match file {
                PendingFile::Claimed(claimed) => apply(committer, claimed, &mut report).await?,
                PendingFile::OtherAgent { path, agent } => {
                    let note = format!(
                        "{}: a pending DEL for the agent at {}, left as it is",
                        path.display(),
                        agent.display()
                    );
                    tracing::warn!(
                        path = %path.display(),
                        agent = %agent.display(),
                        "a pending DEL for another agent, left as it is"
                    );
                    report.left.push(note);
                }
                PendingFile::Malformed { path, reason } => {
                    let note = format!(
                        "{}: not a pending DEL record ({reason}), left as it is",
                        path.display()
                    );
                    tracing::warn!(
                        path = %path.display(),
                        reason,
                        "not a pending DEL record, left as it is"
                    );
                    report.left.push(note);
                }
            }
        }
    }
    if report.applied > 0 {
        tracing::info!(
            applied = report.applied,
            "applied the pending DELs recorded while the agent was away"
        );
    }
    Ok(report)
}

async fn apply(
    committer: &Committer,
    claimed: Claimed,
    report: &mut PendingReport,
) -> Result<(), std::io::Error> {
    // A record is what corral-ipam would have sent: checked as the API checks a DEL.
    let outcome = match CniDel::try_from(request(&claimed.record)) {
        Ok(del) => committer.call(del).await,
        Err(error) => Err(error),
    };
    let path = claimed.path().display().to_string();
    match outcome {
        Ok(_) => {
            claimed.remove().map_err(std::io::Error::other)?;
            report.applied += 1;
        }
        Err(error) => {
            let note = format!("{path}: the pending DEL was refused: {}", error.message);
            tracing::warn!(
                path,
                error = %error.message,
                "the pending DEL was refused; kept for a later attempt"
            );
            report.refused.push(note);
            claimed.put_back().map_err(std::io::Error::other)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use corral_core::{AttachmentKey, PoolName, ReusePolicy};
    use corral_store::{PoolSpec, ScopeConfig};

    use super::*;

    fn record(ranges: &[&str]) -> PendingDel {
        let ranges: Vec<corral_core::RangeSpec> =
            ranges.iter().map(|r| r.parse().unwrap()).collect();
        let config = ScopeConfig {
            pools: vec![PoolSpec::new(
                &PoolName::new("pods").unwrap(),
                Duration::ZERO,
                ReusePolicy::NextFit,
                &ranges,
                &[],
            )],
        };
        let key = AttachmentKey::new("podnet", "c1", "eth0").unwrap();
        PendingDel::new(Path::new("/run/corral/agent.sock"), &key, &config)
    }

    /// A network on a node pool is recorded as that pool without ranges; its DEL goes there.
    #[test]
    fn a_record_of_one_pool_without_ranges_is_a_del_on_that_node_pool() {
        let network = request(&record(&[])).network;
        assert_eq!(network.node_pool.as_deref(), Some("pods"));
        assert!(network.pools.is_empty());
        let network = request(&record(&["10.5.0.0/24"])).network;
        assert_eq!(network.node_pool, None);
        assert_eq!(network.pools[0].ranges, ["10.5.0.0/24"]);
    }
}
