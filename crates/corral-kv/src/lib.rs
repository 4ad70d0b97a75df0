//! The cluster store as corral's cluster side sees it: etcd's data model (revisions, leases,
//! transactions with compares, watches from a revision) behind one trait, so the operator and
//! the agent's cluster client run on real etcd (`corral-etcd`) or on `MemKv` in tests.
//!
//! Only what corral needs is here. Keys and values are bytes; corral writes UTF-8 keys and JSON
//! values. Every method is async and cancel-safe to drop (a dropped call may or may not have
//! been applied, as with any network request).

use std::fmt;
use std::future::Future;
use std::time::Duration;

pub mod conformance;
mod mem;
mod scan;

pub use mem::MemKv;
pub use scan::{PAGE_BYTES, Scan, ScanStats, prefix_end};

/// The most compares, or operations in one branch, a transaction may have (etcd's default
/// `--max-txn-ops`); more is `KvError::Refused`.
pub const MAX_TXN_OPS: usize = 128;

/// An etcd revision: a cluster-wide counter that every successful write advances.
pub type Revision = i64;

/// An etcd lease id (0 means no lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub i64);

/// One key as stored, with its revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The revision of the write that created the key (since its last deletion).
    pub create_revision: Revision,
    /// The revision of the last write to the key.
    pub mod_revision: Revision,
    /// Writes since creation (1 after the create).
    pub version: i64,
    /// The lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

impl KeyValue {
    /// The key as text (lossy for non-UTF-8 keys, which corral never writes).
    pub fn key_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.key)
    }
}

/// What a compare looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The key's create revision (0 when absent).
    CreateRevision(Revision),
    /// The key's last modification revision (0 when absent).
    ModRevision(Revision),
    /// The key's version (0 when absent).
    Version(i64),
    /// The key's value (an absent key compares unequal to every value, as in etcd: the
    /// compare fails).
    Value(Vec<u8>),
}

/// How a compare compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Less,
    Greater,
}

/// One condition of a transaction on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub op: CompareOp,
    pub target: Target,
    /// Whether the compare covers every key under `key` as a prefix (etcd's range compare):
    /// it holds when it holds for each of them, and an empty prefix compares as an absent key.
    pub prefix: bool,
}

impl Compare {
    /// The key does not exist (version 0).
    pub fn absent(key: impl Into<Vec<u8>>) -> Compare {
        Compare {
            key: key.into(),
            op: CompareOp::Equal,
            target: Target::Version(0),
            prefix: false,
        }
    }
    /// No key exists under `prefix`.
    pub fn prefix_empty(prefix: impl Into<Vec<u8>>) -> Compare {
        Compare {
            key: prefix.into(),
            op: CompareOp::Equal,
            target: Target::Version(0),
            prefix: true,
        }
    }
    /// The key exists and was created at `revision` (the fence of a leader or a registration).
    pub fn created_at(key: impl Into<Vec<u8>>, revision: Revision) -> Compare {
        Compare {
            key: key.into(),
            op: CompareOp::Equal,
            target: Target::CreateRevision(revision),
            prefix: false,
        }
    }
    /// The key was last written at `revision` (compare-and-swap).
    pub fn modified_at(key: impl Into<Vec<u8>>, revision: Revision) -> Compare {
        Compare {
            key: key.into(),
            op: CompareOp::Equal,
            target: Target::ModRevision(revision),
            prefix: false,
        }
    }
    /// The key holds exactly `value`.
    pub fn value_is(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Compare {
        Compare {
            key: key.into(),
            op: CompareOp::Equal,
            target: Target::Value(value.into()),
            prefix: false,
        }
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// Reads one key (its result comes back in `TxnResponse::gets`, in order).
    Get {
        key: Vec<u8>,
    },
}

impl TxnOp {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }
    pub fn put_on_lease(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: LeaseId,
    ) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: Some(lease),
        }
    }
    pub fn delete(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Delete { key: key.into() }
    }
    pub fn get(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Get { key: key.into() }
    }
}

/// A transaction: if every compare holds, the success operations run, else the failure ones;
/// atomically, at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl Txn {
    /// Reads `keys` together, at one revision (their values come back in `gets`, in order).
    pub fn reads<K: Into<Vec<u8>>>(keys: impl IntoIterator<Item = K>) -> Txn {
        Txn {
            success: keys.into_iter().map(TxnOp::get).collect(),
            ..Txn::default()
        }
    }
}

/// What a transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether every compare held (the success branch ran).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: Revision,
    /// The results of the branch's `Get`s, in order (`None` for an absent key).
    pub gets: Vec<Option<KeyValue>>,
}

/// What the store says of itself with every answer (etcd's response header): which cluster
/// answered, at which revision. corral remembers the highest revision and the cluster ID it
/// saw, so a store that went back in time (restored from a snapshot, wiped and made again)
/// is noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The etcd cluster's ID (0: the store does not say).
    pub cluster_id: u64,
    /// The store's current revision.
    pub revision: Revision,
}

/// One page of a range read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangePage {
    /// Keys in byte order.
    pub kvs: Vec<KeyValue>,
    /// Whether keys past this page remain under the prefix (or in the span).
    pub more: bool,
    /// How many keys the range held at the revision, this page's and the rest (etcd walks
    /// them all to count them: what the read cost).
    pub count: u64,
    /// The revision the page was read at (pass it back to read the next page at the same
    /// revision).
    pub revision: Revision,
}

/// One change a watch reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Put(KeyValue),
    /// A deletion (by request or by lease expiry); `mod_revision` is the deletion's revision.
    Delete {
        key: Vec<u8>,
        mod_revision: Revision,
    },
}

impl Event {
    pub fn key(&self) -> &[u8] {
        match self {
            Event::Put(kv) => &kv.key,
            Event::Delete { key, .. } => key,
        }
    }
    pub fn revision(&self) -> Revision {
        match self {
            Event::Put(kv) => kv.mod_revision,
            Event::Delete { mod_revision, .. } => *mod_revision,
        }
    }
}

/// A watch on a prefix: batches of events in revision order, every event at most once.
pub struct Watch {
    receiver: tokio::sync::mpsc::Receiver<Result<Vec<Event>, KvError>>,
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl Watch {
    /// A watch fed by an implementation through the sender.
    pub fn new(receiver: tokio::sync::mpsc::Receiver<Result<Vec<Event>, KvError>>) -> Watch {
        Watch { receiver }
    }

    /// The next batch of events. `Err(KvError::Compacted { .. })` means the start revision was
    /// compacted away: re-read the prefix and watch again from the read's revision + 1. Any
    /// error ends the watch (later calls return `KvError::Closed`).
    pub async fn next(&mut self) -> Result<Vec<Event>, KvError> {
        match self.receiver.recv().await {
            Some(batch) => batch,
            None => Err(KvError::Closed),
        }
    }
}

/// Why a store call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The store could not be reached or did not answer in time (no quorum, partition,
    /// timeout). The request may or may not have been applied.
    #[error("cluster store unavailable: {0}")]
    Unavailable(String),
    /// The revision asked for was compacted; `compact_revision` is the oldest still kept.
    #[error("revision compacted (oldest kept {compact_revision})")]
    Compacted { compact_revision: Revision },
    /// The lease is unknown (expired or revoked).
    #[error("lease {:x} not found", .0.0)]
    LeaseNotFound(LeaseId),
    /// The store refused the request as malformed (a bug) or not allowed.
    #[error("cluster store refused the request: {0}")]
    Refused(String),
    /// A transaction held more compares or operations in a branch than the store takes
    /// (etcd's `--max-txn-ops`, 128 by default: [`MAX_TXN_OPS`]). Not applied.
    #[error("cluster store refused a transaction this large: {0}")]
    TooManyOps(String),
    /// The watch or client was closed.
    #[error("cluster store connection closed")]
    Closed,
}

impl KvError {
    /// Whether trying again later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, KvError::Unavailable(_) | KvError::Closed)
    }
}

/// The cluster store. Cheap to clone (a handle); safe to use from many tasks at once.
pub trait Kv: Clone + Send + Sync + 'static {
    /// Reads one key at the current revision (linearizable).
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<KeyValue>, KvError>> + Send;

    /// Reads keys under `prefix` strictly after `after` (or from the first, for `None`), at
    /// most `limit`, at `revision` (or the current one, for `None`; the page says which). The
    /// range ends at the prefix's end: etcd walks to it to count (a whole read is [`Scan`]).
    fn range(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        revision: Option<Revision>,
    ) -> impl Future<Output = Result<RangePage, KvError>> + Send {
        // Strictly after `after` is from `after` and a zero byte on.
        let start = match after {
            Some(after) if after >= prefix => [after, &[0]].concat(),
            _ => prefix.to_vec(),
        };
        let end = prefix_end(prefix);
        async move { self.range_span(&start, &end, limit, revision).await }
    }

    /// Reads keys in `[start, end)` (an empty `end`: to the last key), at most `limit` (0:
    /// all), at `revision` (or the current one, for `None`). The page's `count` is how many
    /// keys the span holds: a store walks them all (what [`Scan`] keeps small).
    fn range_span(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        revision: Option<Revision>,
    ) -> impl Future<Output = Result<RangePage, KvError>> + Send;

    /// The last `limit` keys under `prefix` (the greatest, in key order), at the current
    /// revision, in key order. The default pages through every key; a store that can read a
    /// range backwards (etcd) reads only those.
    fn range_last(
        &self,
        prefix: &[u8],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<KeyValue>, KvError>> + Send {
        async move {
            let mut last = std::collections::VecDeque::with_capacity(limit.min(4096));
            let mut after: Option<Vec<u8>> = None;
            let mut revision = None;
            loop {
                let page = self.range(prefix, after.as_deref(), 1000, revision).await?;
                revision = Some(page.revision);
                after = page.kvs.last().map(|kv| kv.key.clone());
                for kv in page.kvs {
                    if last.len() == limit {
                        last.pop_front();
                    }
                    if limit > 0 {
                        last.push_back(kv);
                    }
                }
                if !page.more || after.is_none() {
                    return Ok(last.into());
                }
            }
        }
    }

    /// Runs a transaction atomically.
    fn txn(&self, txn: Txn) -> impl Future<Output = Result<TxnResponse, KvError>> + Send;

    /// Grants a lease of `ttl` (whole seconds, at least 1).
    fn lease_grant(&self, ttl: Duration) -> impl Future<Output = Result<LeaseId, KvError>> + Send;

    /// Renews a lease once; answers the TTL it now has (`LeaseNotFound` once it expired).
    fn lease_keep_alive(
        &self,
        lease: LeaseId,
    ) -> impl Future<Output = Result<Duration, KvError>> + Send;

    /// Revokes a lease, deleting its keys (an unknown lease is not an error).
    fn lease_revoke(&self, lease: LeaseId) -> impl Future<Output = Result<(), KvError>> + Send;

    /// Watches every key under `prefix` from revision `from` (inclusive; 0 for the next write).
    /// A `from` older than the last compaction gives a watch whose first `next` is
    /// `KvError::Compacted`, as etcd cancels such a watch right after creating it.
    fn watch(
        &self,
        prefix: &[u8],
        from: Revision,
    ) -> impl Future<Output = Result<Watch, KvError>> + Send;

    /// The store's cluster ID and current revision, from one read (the default asks an empty
    /// transaction for the revision and knows no cluster ID).
    fn header(&self) -> impl Future<Output = Result<Header, KvError>> + Send {
        async move {
            let response = self.txn(Txn::default()).await?;
            Ok(Header {
                cluster_id: 0,
                revision: response.revision,
            })
        }
    }

    /// Discards history before `revision`: reads at and watches from earlier revisions then fail
    /// with `KvError::Compacted`. A revision not after the last compaction is `Compacted`, one
    /// past the current revision `Refused`.
    fn compact(&self, revision: Revision) -> impl Future<Output = Result<(), KvError>> + Send;
}

/// Reads every key under `prefix` at one revision, `page` keys per request; answers the keys
/// and that revision (watch from it + 1).
pub async fn read_all<K: Kv>(
    kv: &K,
    prefix: &[u8],
    page: usize,
) -> Result<(Vec<KeyValue>, Revision), KvError> {
    read_all_but(kv, prefix, None, page).await
}

/// [`read_all`] without the keys under `skip` (keys inside `prefix`): no request reads them.
/// The pages are bounded ranges ([`Scan`]): what etcd walks stays in proportion to the keys.
pub async fn read_all_but<K: Kv>(
    kv: &K,
    prefix: &[u8],
    skip: Option<&[u8]>,
    page: usize,
) -> Result<(Vec<KeyValue>, Revision), KvError> {
    let mut scan = Scan::new(prefix, page);
    if let Some(skip) = skip {
        scan = scan.skipping(skip);
    }
    scan.read_all(kv).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_is_a_txn_of_gets_alone_in_order() {
        assert_eq!(
            Txn::reads(["a", "b"]),
            Txn {
                compares: vec![],
                success: vec![TxnOp::get("a"), TxnOp::get("b")],
                failure: vec![],
            }
        );
    }
}
