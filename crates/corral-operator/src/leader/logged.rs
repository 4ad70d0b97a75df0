//! Fenced transactions whose writes are logged, so a task can lay what it wrote over the
//! shared view at once (the watch repeats it later): shared by the cloud node manager and the
//! to-cloud delegations.

use corral_kv::{Kv, KvError, Revision, Txn, TxnOp};

use crate::election::Fence;

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

/// Runs `txn` behind the fence; when it succeeds, logs its puts and deletes into `writes` at
/// its revision and answers the revision.
pub(crate) async fn fenced_txn<K: Kv>(
    kv: &K,
    fence: &Fence,
    txn: Txn,
    writes: &mut Vec<Write>,
) -> Result<Revision, WriteError> {
    let txn = fence.guard(txn);
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
    match kv.txn(txn).await {
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
