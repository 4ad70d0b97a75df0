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

pub(super) async fn run<K: Kv>(kv: &K, txn: Txn) -> Result<Revision, TxnFailure> {
    match kv.txn(txn).await {
        Ok(response) if response.succeeded => Ok(response.revision),
        Ok(_) => Err(TxnFailure::Refused),
        Err(error) => Err(TxnFailure::Uncertain(error)),
    }
}
