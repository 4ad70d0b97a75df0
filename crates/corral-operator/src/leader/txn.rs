//! A fenced transaction's outcome as the leading loop judges it: applied (at a revision),
//! refused (a compare failed: the view was stale, or the fence is gone), or uncertain (the
//! store failed mid-call). A leaf every transaction-writing file of the leader shares.

use corral_kv::{Kv, KvError, Revision, Txn};

pub(super) enum TxnFailure {
    /// A compare failed: the view was stale (or the fence is gone).
    Refused,
    /// The store failed; the transaction may or may not have been applied.
    Uncertain(KvError),
}

/// The wall clock in milliseconds since the epoch: what grants, releases and the grants'
/// history are stamped with.
pub(super) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) async fn run<K: Kv>(kv: &K, txn: Txn) -> Result<Revision, TxnFailure> {
    match kv.txn(txn).await {
        Ok(response) if response.succeeded => Ok(response.revision),
        Ok(_) => Err(TxnFailure::Refused),
        Err(error) => Err(TxnFailure::Uncertain(error)),
    }
}
