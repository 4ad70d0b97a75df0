//! Grants their agents refused (`ClusterView::refused_grants`): etcd handed a node back a grant
//! it had given up (restored from a snapshot), which its agent does not take up; the leader
//! deletes the grant and its `owned/` key (and records its end in the grants' history) in one
//! fenced transaction whose compares are both
//! keys' create revisions, so only the grant that was refused goes. The space is free again
//! unless another node asserts it (then it stays occupied as that node's holding), and the
//! node is granted anew like any node without a grant.

use corral_cluster::{GrantEnd, Keys, Revocation};
use corral_kv::{Compare, Kv, KvError, Revision, Txn, TxnOp};

use super::txn::{TxnFailure, run, wall_ms};
use crate::election::Fence;

/// Revokes one node's refused grants; answers the transaction's revision.
pub(super) async fn revoke<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    revocations: &[Revocation],
) -> Result<Revision, TxnFailure> {
    let mut txn = Txn::default();
    let now_ms = wall_ms();
    for revocation in revocations {
        for key in &revocation.keys {
            txn.compares
                .push(Compare::created_at(key.clone(), revocation.revision));
            txn.success.push(TxnOp::delete(key.clone()));
        }
        // A node CIDR's or block's end, recorded in the transaction that deletes it.
        if let Some(ending) = &revocation.ending {
            let ended = ending.ended(now_ms, GrantEnd::Revoked);
            let puts = corral_cluster::history::puts(keys, &ended)
                .map_err(|e| TxnFailure::Uncertain(KvError::Refused(e.to_string())))?;
            for (key, value) in puts {
                txn.success.push(TxnOp::put(key, value));
            }
        }
    }
    run(kv, fence.guard(txn)).await
}

/// The log line of a revocation done.
pub(super) fn describe(revocations: &[Revocation]) -> String {
    let grants: Vec<String> = revocations.iter().map(|r| r.what.clone()).collect();
    format!(
        "node {}'s agent refused its grant(s) {} (made before the highest revision it had seen, \
         of space it does not hold: etcd handed back what it had given up); revoked",
        revocations
            .first()
            .map(|r| r.node.as_str())
            .unwrap_or_default(),
        grants.join(", ")
    )
}
