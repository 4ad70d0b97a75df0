//! Fenced transactions whose writes are logged, so a task can lay what it wrote over the
//! shared view at once (the watch repeats it later): shared by the cloud node manager and the
//! to-cloud delegations. [`Term`] is what every such task needs to write behind the fence.

use std::sync::Arc;

use corral_cluster::Keys;
use corral_kv::{Kv, KvError, Revision, Txn, TxnOp};

use crate::election::Fence;
use crate::state::Shared;

/// What every task of a leadership term needs to write behind the fence: the store, its keys,
/// the fence, and the state the API reads (the view among it).
#[derive(Clone)]
pub(crate) struct Term<K> {
    pub(crate) kv: K,
    pub(crate) keys: Keys,
    pub(crate) fence: Fence,
    pub(crate) shared: Arc<Shared>,
}

/// A write to apply to the view at once: (key, value or deletion, revision).
pub(crate) type Write = (String, Option<Vec<u8>>, Revision);

/// Why a logged transaction wrote nothing.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// A compare failed: the fence (leading lost) or a record changed meanwhile.
    Refused,
    /// The store failed; the write may or may not have been applied.
    Uncertain(KvError),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Refused => f.write_str("refused (a compare failed)"),
            WriteError::Uncertain(error) => write!(f, "{error}"),
        }
    }
}

impl<K: Kv> Term<K> {
    /// Runs `txn` behind the fence; when it succeeds, logs its puts and deletes into `writes`
    /// at its revision and answers the revision.
    pub(crate) async fn fenced_txn(
        &self,
        txn: Txn,
        writes: &mut Vec<Write>,
    ) -> Result<Revision, WriteError> {
        let txn = self.fence.guard(txn);
        let logged: Vec<(String, Option<Vec<u8>>)> = txn
            .success
            .iter()
            .filter_map(|op| match op {
                TxnOp::Put { key, value, .. } => Some((
                    String::from_utf8_lossy(key).into_owned(),
                    Some(value.clone()),
                )),
                TxnOp::Delete { key } => Some((String::from_utf8_lossy(key).into_owned(), None)),
                TxnOp::Get { .. } => None,
            })
            .collect();
        match self.kv.txn(txn).await {
            Ok(response) if response.succeeded => {
                writes.extend(
                    logged
                        .into_iter()
                        .map(|(key, value)| (key, value, response.revision)),
                );
                Ok(response.revision)
            }
            Ok(_) => Err(WriteError::Refused),
            Err(error) => Err(WriteError::Uncertain(error)),
        }
    }
}
