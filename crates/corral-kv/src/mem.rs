//! `MemKv`: the `Kv` trait over memory with etcd's semantics, for tests above the store.
//!
//! It keeps every key's history (so ranges read at any kept revision), a log of events per
//! revision (so watches replay from any kept revision), and leases that expire on tokio's clock
//! (so a test with `tokio::time::pause()` moves them by advancing time). The conformance suite
//! (`crate::conformance`) runs the same cases against it and against real etcd.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::{
    Compare, CompareOp, Event, KeyValue, Kv, KvError, LeaseId, MAX_TXN_OPS, RangePage, Revision,
    Target, Txn, TxnOp, TxnResponse, Watch,
};

/// How many batches a watch buffers before the store waits for its reader.
const WATCH_BUFFER: usize = 128;

/// An in-memory cluster store with etcd's semantics. Clones share one store.
#[derive(Clone, Debug)]
pub struct MemKv {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// The current revision, for watches waiting for new writes.
    revision: watch::Sender<Revision>,
    requests: AtomicU64,
    unavailable: AtomicBool,
    /// The cluster ID `header` answers.
    cluster_id: AtomicU64,
    /// Operations a transaction may hold (etcd's `--max-txn-ops`).
    max_txn_ops: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    revision: Revision,
    /// Revisions below this one were compacted away (0: nothing compacted).
    compact_revision: Revision,
    /// Every key's kept versions, oldest first.
    keys: BTreeMap<Vec<u8>, Vec<Version>>,
    /// The events of every kept revision.
    log: BTreeMap<Revision, Vec<Event>>,
    leases: HashMap<LeaseId, Lease>,
    next_lease: i64,
}

#[derive(Debug)]
struct Version {
    revision: Revision,
    /// `None` for a deletion.
    kv: Option<KeyValue>,
}

#[derive(Debug)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<Vec<u8>>,
}

impl Default for MemKv {
    fn default() -> Self {
        MemKv::new()
    }
}

impl MemKv {
    /// An empty store at revision 1 (as a new etcd cluster).
    pub fn new() -> MemKv {
        let state = State {
            revision: 1,
            next_lease: 0x694d_0000_0000_0001,
            ..State::default()
        };
        MemKv {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                revision: watch::Sender::new(1),
                requests: AtomicU64::new(0),
                unavailable: AtomicBool::new(false),
                cluster_id: AtomicU64::new(MemKv::CLUSTER_ID),
                max_txn_ops: AtomicUsize::new(MAX_TXN_OPS),
            }),
        }
    }

    /// Takes transactions of up to `ops` compares and operations a branch, as etcd started
    /// with `--max-txn-ops ops` (128, etcd's default, until set).
    pub fn set_max_txn_ops(&self, ops: usize) {
        self.inner.max_txn_ops.store(ops, Ordering::SeqCst);
    }

    /// Makes every call fail with `Unavailable` (as etcd without quorum) or serve again. While
    /// unavailable, leases do not expire; when service comes back every lease runs its full TTL
    /// again, as etcd's new leader extends them.
    pub fn set_unavailable(&self, unavailable: bool) {
        let mut state = self.inner.lock();
        let was = self.inner.unavailable.swap(unavailable, Ordering::SeqCst);
        if was && !unavailable {
            let now = Instant::now();
            for lease in state.leases.values_mut() {
                lease.deadline = now + lease.ttl;
            }
        }
    }

    /// The cluster ID a new store answers in `header`.
    pub const CLUSTER_ID: u64 = 0x6d65_6d6b_7601;

    /// Answers `cluster_id` in `header` from now on (as a store made again from nothing).
    pub fn set_cluster_id(&self, cluster_id: u64) {
        self.inner.cluster_id.store(cluster_id, Ordering::SeqCst);
    }

    /// How many calls were made (served or refused), watches and compactions included.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::SeqCst)
    }

    /// The current revision (not counted as a request).
    pub fn revision(&self) -> Revision {
        self.inner.lock().revision
    }

    /// Counts a request and takes the state, or refuses while unavailable.
    fn begin(&self) -> Result<MutexGuard<'_, State>, KvError> {
        self.inner.requests.fetch_add(1, Ordering::SeqCst);
        if self.inner.unavailable.load(Ordering::SeqCst) {
            return Err(KvError::Unavailable(
                "in-memory store set unavailable".into(),
            ));
        }
        Ok(self.inner.lock())
    }

    /// Tells waiting watches about a new revision.
    fn published(&self, revision: Revision) {
        self.inner.revision.send_replace(revision);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-changed in a way later
        // calls would misread (every change is applied after its checks), so poisoning is
        // ignored rather than spread.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Keys ever written under `prefix` (some may be deleted now).
    fn keys_with_prefix(&self, prefix: &[u8]) -> Vec<Vec<u8>> {
        self.keys
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, _)| key.clone())
            .collect()
    }

    fn latest(&self, key: &[u8]) -> Option<&KeyValue> {
        self.keys
            .get(key)
            .and_then(|versions| versions.last())
            .and_then(|version| version.kv.as_ref())
    }

    fn at(&self, key: &[u8], revision: Revision) -> Option<&KeyValue> {
        let versions = self.keys.get(key)?;
        versions
            .iter()
            .rev()
            .find(|version| version.revision <= revision)
            .and_then(|version| version.kv.as_ref())
    }

    fn check_revision(&self, revision: Revision) -> Result<(), KvError> {
        if revision > self.revision {
            return Err(KvError::Refused(
                "mvcc: required revision is a future revision".into(),
            ));
        }
        if revision < self.compact_revision {
            return Err(KvError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        Ok(())
    }

    fn compare(&self, compare: &Compare) -> bool {
        if compare.prefix {
            let keys: Vec<Vec<u8>> = self
                .keys_with_prefix(&compare.key)
                .into_iter()
                .filter(|key| self.latest(key).is_some())
                .collect();
            if keys.is_empty() {
                return self.compare_one(compare, None);
            }
            return keys
                .iter()
                .all(|key| self.compare_one(compare, self.latest(key)));
        }
        self.compare_one(compare, self.latest(&compare.key))
    }

    fn compare_one(&self, compare: &Compare, current: Option<&KeyValue>) -> bool {
        let ordering = match (&compare.target, current) {
            // etcd: a value compare on an absent key fails, whatever the operator.
            (Target::Value(_), None) => return false,
            (Target::Value(value), Some(kv)) => kv.value.as_slice().cmp(value.as_slice()),
            (Target::CreateRevision(revision), kv) => {
                kv.map_or(0, |kv| kv.create_revision).cmp(revision)
            }
            (Target::ModRevision(revision), kv) => kv.map_or(0, |kv| kv.mod_revision).cmp(revision),
            (Target::Version(version), kv) => kv.map_or(0, |kv| kv.version).cmp(version),
        };
        match compare.op {
            CompareOp::Equal => ordering.is_eq(),
            CompareOp::NotEqual => ordering.is_ne(),
            CompareOp::Less => ordering.is_lt(),
            CompareOp::Greater => ordering.is_gt(),
        }
    }

    /// Applies one write at `revision` (the next one), recording its event.
    fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
        revision: Revision,
        events: &mut Vec<Event>,
    ) {
        let previous = self.latest(key).cloned();
        if let Some(old_lease) = previous.as_ref().and_then(|kv| kv.lease)
            && Some(old_lease) != lease
            && let Some(old) = self.leases.get_mut(&old_lease)
        {
            old.keys.remove(key);
        }
        if let Some(lease) = lease
            && let Some(new) = self.leases.get_mut(&lease)
        {
            new.keys.insert(key.to_vec());
        }
        let kv = KeyValue {
            key: key.to_vec(),
            value: value.to_vec(),
            create_revision: previous.as_ref().map_or(revision, |kv| kv.create_revision),
            mod_revision: revision,
            version: previous.as_ref().map_or(1, |kv| kv.version + 1),
            lease,
        };
        events.push(Event::Put(kv.clone()));
        self.keys.entry(key.to_vec()).or_default().push(Version {
            revision,
            kv: Some(kv),
        });
    }

    fn delete(&mut self, key: &[u8], revision: Revision, events: &mut Vec<Event>) {
        let Some(previous) = self.latest(key).cloned() else {
            return;
        };
        if let Some(lease) = previous.lease
            && let Some(lease) = self.leases.get_mut(&lease)
        {
            lease.keys.remove(key);
        }
        events.push(Event::Delete {
            key: key.to_vec(),
            mod_revision: revision,
        });
        self.keys
            .entry(key.to_vec())
            .or_default()
            .push(Version { revision, kv: None });
    }

    /// Makes the writes in `events` the next revision, if there are any.
    fn commit(&mut self, events: Vec<Event>) -> Option<Revision> {
        if events.is_empty() {
            return None;
        }
        self.revision += 1;
        self.log.insert(self.revision, events);
        Some(self.revision)
    }

    /// Removes a lease and deletes its keys in one revision.
    fn revoke(&mut self, lease: LeaseId) -> Option<Revision> {
        let lease = self.leases.remove(&lease)?;
        let revision = self.revision + 1;
        let mut events = Vec::new();
        for key in &lease.keys {
            self.delete(key, revision, &mut events);
        }
        self.commit(events)
    }

    fn compact(&mut self, revision: Revision) -> Result<(), KvError> {
        if revision <= self.compact_revision {
            return Err(KvError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        if revision > self.revision {
            return Err(KvError::Refused(
                "mvcc: required revision is a future revision".into(),
            ));
        }
        self.compact_revision = revision;
        self.log = self.log.split_off(&revision);
        self.keys.retain(|_, versions| {
            // Keep the version visible at `revision` (unless it is a deletion) and every later one.
            let visible = versions
                .iter()
                .rposition(|version| version.revision <= revision);
            if let Some(visible) = visible {
                let keep_from = if versions[visible].kv.is_some() {
                    visible
                } else {
                    visible + 1
                };
                versions.drain(..keep_from);
            }
            !versions.is_empty()
        });
        Ok(())
    }
}

/// etcd's checks of a transaction before it runs: at most `max_ops` compares and operations
/// per branch, and no branch putting a key twice or putting a key it deletes.
fn check_txn(txn: &Txn, max_ops: usize) -> Result<(), KvError> {
    if txn
        .compares
        .len()
        .max(txn.success.len())
        .max(txn.failure.len())
        > max_ops
    {
        return Err(KvError::TooManyOps(
            "etcdserver: too many operations in txn request".into(),
        ));
    }
    for branch in [&txn.success, &txn.failure] {
        let deletes: BTreeSet<&[u8]> = branch
            .iter()
            .filter_map(|op| match op {
                TxnOp::Delete { key } => Some(key.as_slice()),
                _ => None,
            })
            .collect();
        let mut puts = BTreeSet::new();
        for op in branch {
            if let TxnOp::Put { key, .. } = op
                && (deletes.contains(key.as_slice()) || !puts.insert(key.as_slice()))
            {
                return Err(KvError::Refused(
                    "etcdserver: duplicate key given in txn request".into(),
                ));
            }
        }
    }
    Ok(())
}

fn lease_ttl(ttl: Duration) -> Duration {
    let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Duration::from_secs(whole.max(1))
}

/// Expires one lease when its deadline passes (keep-alives move the deadline; while the store
/// is unavailable the lease runs its full TTL again).
async fn expire_lease(inner: Weak<Inner>, id: LeaseId, mut deadline: Instant) {
    loop {
        tokio::time::sleep_until(deadline).await;
        let Some(inner) = inner.upgrade() else { return };
        let revision = {
            let mut state = inner.lock();
            let now = Instant::now();
            let Some(lease) = state.leases.get_mut(&id) else {
                return;
            };
            if inner.unavailable.load(Ordering::SeqCst) {
                lease.deadline = now + lease.ttl;
            }
            if lease.deadline > now {
                deadline = lease.deadline;
                continue;
            }
            state.revoke(id)
        };
        if let Some(revision) = revision {
            inner.revision.send_replace(revision);
        }
        return;
    }
}

/// Feeds one watch: replays the log from `next`, then every new revision, one batch per
/// revision, until the reader goes away or the store is dropped.
async fn feed_watch(
    inner: Weak<Inner>,
    mut revisions: watch::Receiver<Revision>,
    prefix: Vec<u8>,
    mut next: Revision,
    sender: mpsc::Sender<Result<Vec<Event>, KvError>>,
) {
    loop {
        let batches = {
            let Some(inner) = inner.upgrade() else { return };
            let state = inner.lock();
            if next < state.compact_revision {
                Err(KvError::Compacted {
                    compact_revision: state.compact_revision,
                })
            } else {
                let batches: Vec<Vec<Event>> = state
                    .log
                    .range(next..)
                    .map(|(_, events)| {
                        events
                            .iter()
                            .filter(|event| event.key().starts_with(&prefix))
                            .cloned()
                            .collect()
                    })
                    .filter(|events: &Vec<Event>| !events.is_empty())
                    .collect();
                next = next.max(state.revision + 1);
                Ok(batches)
            }
        };
        match batches {
            Ok(batches) => {
                for batch in batches {
                    if sender.send(Ok(batch)).await.is_err() {
                        return;
                    }
                }
            }
            Err(error) => {
                let _ = sender.send(Err(error)).await;
                return;
            }
        }
        tokio::select! {
            biased;
            changed = revisions.changed() => if changed.is_err() { return },
            () = sender.closed() => return,
        }
    }
}

impl Kv for MemKv {
    async fn header(&self) -> Result<crate::Header, KvError> {
        let state = self.begin()?;
        Ok(crate::Header {
            cluster_id: self.inner.cluster_id.load(Ordering::SeqCst),
            revision: state.revision,
        })
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, KvError> {
        let state = self.begin()?;
        Ok(state.latest(key).cloned())
    }

    async fn range_span(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        revision: Option<Revision>,
    ) -> Result<RangePage, KvError> {
        let state = self.begin()?;
        let revision = match revision {
            Some(revision) if revision > 0 => revision,
            _ => state.revision,
        };
        state.check_revision(revision)?;
        let end = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end)
        };
        if matches!(end, Bound::Excluded(end) if end <= start) {
            return Ok(page(std::iter::empty(), limit, revision));
        }
        let visible = state
            .keys
            .range::<[u8], _>((Bound::Included(start), end))
            .filter_map(|(key, _)| state.at(key, revision));
        Ok(page(visible, limit, revision))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse, KvError> {
        let mut state = self.begin()?;
        check_txn(&txn, self.inner.max_txn_ops.load(Ordering::SeqCst))?;
        let succeeded = txn.compares.iter().all(|compare| state.compare(compare));
        let branch = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for op in branch {
            if let TxnOp::Put {
                lease: Some(lease), ..
            } = op
                && !state.leases.contains_key(lease)
            {
                return Err(KvError::LeaseNotFound(*lease));
            }
        }
        let revision = state.revision + 1;
        let mut events = Vec::new();
        let mut gets = Vec::new();
        for op in branch {
            match op {
                TxnOp::Put { key, value, lease } => {
                    state.put(key, value, *lease, revision, &mut events)
                }
                TxnOp::Delete { key } => state.delete(key, revision, &mut events),
                TxnOp::Get { key } => gets.push(state.latest(key).cloned()),
            }
        }
        let committed = state.commit(events);
        let response = TxnResponse {
            succeeded,
            revision: state.revision,
            gets,
        };
        drop(state);
        if let Some(revision) = committed {
            self.published(revision);
        }
        Ok(response)
    }

    async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId, KvError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            KvError::Unavailable("in-memory store used outside a tokio runtime".into())
        })?;
        let mut state = self.begin()?;
        let ttl = lease_ttl(ttl);
        let id = LeaseId(state.next_lease);
        state.next_lease += 1;
        let deadline = Instant::now() + ttl;
        state.leases.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys: BTreeSet::new(),
            },
        );
        drop(state);
        runtime.spawn(expire_lease(Arc::downgrade(&self.inner), id, deadline));
        Ok(id)
    }

    async fn lease_keep_alive(&self, lease: LeaseId) -> Result<Duration, KvError> {
        let mut state = self.begin()?;
        let Some(found) = state.leases.get_mut(&lease) else {
            return Err(KvError::LeaseNotFound(lease));
        };
        found.deadline = Instant::now() + found.ttl;
        Ok(found.ttl)
    }

    async fn lease_revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        let mut state = self.begin()?;
        let revision = state.revoke(lease);
        drop(state);
        if let Some(revision) = revision {
            self.published(revision);
        }
        Ok(())
    }

    async fn watch(&self, prefix: &[u8], from: Revision) -> Result<Watch, KvError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            KvError::Unavailable("in-memory store used outside a tokio runtime".into())
        })?;
        let state = self.begin()?;
        let from = if from <= 0 { state.revision + 1 } else { from };
        // Subscribed under the lock, so no revision committed after the first read is missed.
        let revisions = self.inner.revision.subscribe();
        drop(state);
        let (sender, receiver) = mpsc::channel(WATCH_BUFFER);
        runtime.spawn(feed_watch(
            Arc::downgrade(&self.inner),
            revisions,
            prefix.to_vec(),
            from,
            sender,
        ));
        Ok(Watch::new(receiver))
    }

    async fn compact(&self, revision: Revision) -> Result<(), KvError> {
        let mut state = self.begin()?;
        state.compact(revision)
    }
}

/// The first `limit` (0: all) of `visible`, and how many there are (as etcd counts them: every
/// key of the range).
fn page<'a>(
    visible: impl Iterator<Item = &'a KeyValue>,
    limit: usize,
    revision: Revision,
) -> RangePage {
    let limit = if limit == 0 { usize::MAX } else { limit };
    let mut kvs = Vec::new();
    let mut count = 0u64;
    for kv in visible {
        if kvs.len() < limit {
            kvs.push(kv.clone());
        }
        count += 1;
    }
    RangePage {
        more: count > kvs.len() as u64,
        kvs,
        count,
        revision,
    }
}
