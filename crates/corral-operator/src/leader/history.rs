//! Trimming the grants' history (`corral_cluster::history`): beside the leading loop, off
//! the grant path, the leader reads the `history/at/` index (oldest end first) at the start of
//! its term and every [`TRIM_EVERY`], and deletes the events past the configuration's bounds
//! (`history_max_events`, `history_max_age_secs`) with their other two keys, in fenced
//! transactions of [`corral_cluster::history::TRIM_BATCH`] events: a deposed leader deletes
//! nothing. The events themselves are written by the transactions that end grants.

use std::sync::Arc;
use std::time::Duration;

use corral_cluster::history::{Bounds, TRIM_BATCH, record_keys, trim_plan};
use corral_cluster::{HistoryRecord, Key, Keys, decode_value};
use corral_kv::{Kv, KvError, Txn, TxnOp};

use super::txn::{TxnFailure, run, wall_ms};
use crate::election::Fence;
use crate::state::Shared;

/// How often the leader trims the history.
pub const TRIM_EVERY: Duration = Duration::from_secs(600);

/// Trims now and every [`TRIM_EVERY`] while the term lasts; returns when the view is gone
/// (leading ended).
pub(super) async fn trim_loop<K: Kv>(kv: K, keys: Keys, fence: Fence, shared: Arc<Shared>) {
    loop {
        let Some(bounds) = shared.with_view(|view, _| view.config().history.bounds()) else {
            return;
        };
        match trim(&kv, &keys, &fence, bounds, wall_ms()).await {
            Ok(_) => shared.resolve("etcd", "history: trim"),
            Err(error) => shared.raise(
                "etcd",
                "history: trim",
                format!("grants' history: trim: {error}"),
            ),
        }
        tokio::time::sleep(TRIM_EVERY).await;
    }
}

/// Why a trim stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrimError {
    #[error("{0}")]
    Kv(#[from] KvError),
    #[error("refused (leading lost)")]
    Refused,
}

/// Deletes the events past `bounds` at `now_ms`, oldest first; answers how many.
pub async fn trim<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    bounds: Bounds,
    now_ms: u64,
) -> Result<usize, TrimError> {
    let (all, _) = corral_kv::read_all(kv, keys.history_at_prefix().as_bytes(), 2000).await?;
    // Each event's end (from its key) and the keys it is stored under (from its value; only
    // the key itself when the value does not decode).
    let events: Vec<(u64, Vec<String>)> = all
        .iter()
        .filter_map(|entry| {
            let key = entry.key_str();
            let Ok(Key::History { to_ms, .. }) = keys.parse(&key) else {
                return None;
            };
            let stored = match decode_value::<HistoryRecord>(&entry.value) {
                Ok(record) => record_keys(keys, &record).to_vec(),
                Err(_) => vec![key.into_owned()],
            };
            Some((to_ms, stored))
        })
        .collect();
    let times: Vec<u64> = events.iter().map(|(to, _)| *to).collect();
    let n = trim_plan(&times, bounds, now_ms);
    for chunk in events[..n].chunks(TRIM_BATCH) {
        let mut txn = Txn::default();
        for key in chunk.iter().flat_map(|(_, stored)| stored) {
            txn.success.push(TxnOp::delete(key.clone()));
        }
        match run(kv, fence.guard(txn)).await {
            Ok(_) => {}
            Err(TxnFailure::Refused) => return Err(TrimError::Refused),
            Err(TxnFailure::Uncertain(error)) => return Err(error.into()),
        }
    }
    Ok(n)
}
