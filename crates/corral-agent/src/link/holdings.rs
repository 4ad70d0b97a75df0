//! The agent's assertion of what it holds (`holdings/<node>`), and its memory of
//! etcd's time.
//!
//! etcd decides who *gets* space; the agent that holds it decides when it is given up. So the
//! agent publishes every cluster range its node scope holds (granted or draining: node CIDRs,
//! blocks, from-cloud prefixes), the node IDs whose plan it serves and its cloud interface
//! addresses, read from the node state ([`Op::BlockReport`](crate::node::Op::BlockReport), [`Op::CloudReport`](crate::node::Op::CloudReport)), and puts the record
//! back whenever it goes missing or says something else (at most once a second after another
//! writer). The leader counts every asserted range as occupied whatever the grants say. A
//! record is read by the cluster's configuration (the plan's pod ranges are node IDs), read
//! from etcd until the link applied one. Only the process that holds the node's liveness key
//! writes it (or, while no process holds the key, one the node is registered to): a clone, a
//! reinstall or a machine that took a removed node's name never replaces it.
//!
//! [`publish`] runs beside the cluster link for the agent's whole life (spawned by
//! `cluster::run`, ended only by the agent's stop): a removed node, a link that fails or
//! backs off, keep their assertion current while the node drains. Order: a range is served
//! once granted, so asserting it after serving is safe while the grant lasts; a range leaves
//! the record only once the node state's report (read through the committer, after the batch that
//! dropped it committed) no longer lists it.
//!
//! [`EpochGuard`] remembers the highest etcd revision and the cluster ID the agent saw, in the
//! state directory (`etcd-epoch`, beside `cluster-uid`). A regression (etcd restored from a
//! snapshot, wiped and made again) is logged loudly; the agent asserts its holdings again at
//! once, and registers again (etcd forgot the registration: that is not a removal).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_cluster::{
    AppliedConfigRecord, CloudId, ClusterConfig, Epoch, EpochMemory, HeldCloudAddress, HeldRange,
    HoldingsRecord, KeptEpoch, Keys, NodeIdPlanConfig, NodeName, NodeRecord, Regression,
    decode_value, encode_value,
};
use corral_core::PoolName;
use corral_kv::{Event, Kv, KvError, Revision, Txn, TxnOp};
use tokio::time::Instant;

use super::state::{ClusterOptions, SharedClusterState, backoff, now_ms, update};
use crate::committer::Committer;
use crate::node::{BlockReport, CloudReport, ReportBlocks, ReportCloud};

/// How often the node state's holdings are looked at when nothing signalled a change (a range that
/// drained and left, allocations that came and went).
pub const LOOK_EVERY: Duration = Duration::from_secs(5);
/// A change of allocation counts alone (no range, state or emptiness changed) is written at
/// most this often: the counts inform, the ranges protect.
pub const COUNTS_REFRESH: Duration = Duration::from_secs(30);
/// A record someone else overwrote is put back at most this often after the agent's last write.
pub const REWRITE_EVERY: Duration = Duration::from_secs(1);
/// The highest etcd revision and the cluster ID the agent saw, kept durably.
#[derive(Debug)]
pub struct EpochGuard {
    path: Option<PathBuf>,
    inner: Mutex<KeptEpoch>,
    /// Bumped at each regression: the publisher asserts again at once.
    regressed: tokio::sync::watch::Sender<u64>,
    /// The regressions the link has taken into account (whoever saw them: the publisher
    /// often sees one first).
    link_seen: std::sync::atomic::AtomicU64,
    /// The highest etcd revision at which this process saw a regression (0: none): what a
    /// restore brought back was written at or before it.
    restored_up_to: std::sync::atomic::AtomicI64,
}

impl EpochGuard {
    /// The guard remembering in `path` (`None`: in memory only). A file that cannot be read
    /// is reported and treated as empty (nothing remembered yet).
    pub fn load(path: Option<PathBuf>) -> EpochGuard {
        let memory = match path.as_ref().map(std::fs::read) {
            None => EpochMemory::default(),
            Some(Ok(bytes)) => EpochMemory::from_json(&bytes).unwrap_or_else(|error| {
                tracing::warn!(
                    path = %path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                    %error,
                    "the etcd epoch file cannot be read; the etcd revision seen is remembered anew"
                );
                EpochMemory::default()
            }),
            Some(Err(error)) if error.kind() == std::io::ErrorKind::NotFound => {
                EpochMemory::default()
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "reading the etcd epoch");
                EpochMemory::default()
            }
        };
        EpochGuard {
            path,
            inner: Mutex::new(KeptEpoch::new(memory)),
            regressed: tokio::sync::watch::Sender::new(0),
            link_seen: std::sync::atomic::AtomicU64::new(0),
            restored_up_to: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// Whether a regression was seen (by anyone) since the link last asked.
    fn regressed_since_link_asked(&self) -> bool {
        let now = *self.regressed.borrow();
        self.link_seen
            .swap(now, std::sync::atomic::Ordering::SeqCst)
            != now
    }

    /// What it remembers now.
    pub fn memory(&self) -> EpochMemory {
        self.lock().memory
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptEpoch> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Feeds a revision etcd answered at now (cluster ID 0 when the answer did not say);
    /// answers the regression it shows, if any (logged here, and the publisher woken).
    pub fn observe(&self, found: Epoch) -> Option<Regression> {
        let floor = self.floor();
        self.observe_after(floor, found)
    }

    /// The highest etcd revision at which this process saw etcd go back in time (0: never):
    /// a record written at or before it may be one the restore brought back.
    pub fn restored_up_to(&self) -> Revision {
        self.restored_up_to
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The highest revision seen: taken before a request, passed with its answer to
    /// [`EpochGuard::observe_after`].
    pub fn floor(&self) -> Revision {
        self.lock().memory.floor()
    }

    /// Feeds the answer of a request sent when the highest revision seen was `floor` (0: it
    /// only advances; answers of concurrent requests arrive in any order).
    pub fn observe_after(&self, floor: Revision, found: Epoch) -> Option<Regression> {
        let (regression, save) = self
            .lock()
            .observe_after(floor, found, std::time::Instant::now());
        if let Some(memory) = save {
            self.write(&memory);
        }
        if let Some(regression) = regression {
            self.restored_up_to.fetch_max(
                regression.found.revision,
                std::sync::atomic::Ordering::AcqRel,
            );
            tracing::warn!(%regression, "asserting what this node holds again");
            self.regressed.send_modify(|n| *n = n.wrapping_add(1));
        }
        regression
    }

    /// Feeds a revision of an answer sent when the highest revision seen was `floor` (no
    /// cluster ID; 0 only advances).
    pub fn observe_revision(&self, floor: Revision, revision: Revision) -> Option<Regression> {
        self.observe_after(floor, Epoch::at_revision(revision))
    }

    /// Asks etcd for its header and feeds it; `Ok(Some)` on a regression.
    pub async fn probe<K: Kv>(&self, kv: &K) -> Result<Option<Regression>, KvError> {
        let floor = self.floor();
        let header = kv.header().await?;
        Ok(self.observe_after(
            floor,
            Epoch {
                cluster_id: header.cluster_id,
                revision: header.revision,
            },
        ))
    }

    /// Writes what is remembered now if it changed since the last write (not waiting for
    /// `EPOCH_SAVE_EVERY`): once what the node holds changed, the revision it had reached must
    /// survive a crash, or a grant it gave up and etcd hands back after a restore would look
    /// newer than anything it had seen (`cluster.rs` `screen`).
    pub fn flush(&self) {
        let save = self.lock().flush(std::time::Instant::now());
        if let Some(memory) = save {
            self.write(&memory);
        }
    }

    /// Writes `memory` to the guard's file, if it has one (a failure is logged).
    fn write(&self, memory: &EpochMemory) {
        if let Some(path) = &self.path
            && let Err(error) = write_atomically(path, &memory.to_json())
        {
            tracing::warn!(path = %path.display(), %error, "writing the etcd epoch");
        }
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.regressed.subscribe()
    }
}

/// What asserting the node's holdings works with: etcd, its key layout, the node (its name
/// and uid), the node state (through the committer), the link's shared state and the guard
/// of etcd's time.
#[derive(Debug)]
pub struct Asserter<'a, K> {
    pub kv: &'a K,
    pub keys: &'a Keys,
    pub node: &'a NodeName,
    pub uid: &'a str,
    pub committer: &'a Committer,
    pub state: &'a SharedClusterState,
    pub guard: &'a EpochGuard,
    /// This process, as a liveness key names it.
    pub identity: &'a super::liveness::ProcessIdentity,
}

impl<K: Kv> Asserter<'_, K> {
    /// At the start of each round of the cluster link: asks etcd for its header; on a regression
    /// asserts the node's holdings at once (before the link registers again) and answers true
    /// (etcd forgot the registration: the link registers the node again rather than taking it
    /// for a removal). A failure answers false (the round fails on its own).
    pub async fn round_start(&self) -> bool {
        let Asserter {
            kv, state, guard, ..
        } = *self;
        if let Ok(Some(regression)) = guard.probe(kv).await {
            update(state, |s| s.last_error = Some(regression.to_string()));
        }
        // Seen here or by the publisher (or the last round) since the last round started.
        if !guard.regressed_since_link_asked() {
            return false;
        }
        if let Err(error) = self.assert_now().await {
            tracing::warn!(%error, "asserting the node's holdings");
        }
        true
    }

    /// Whether this process may assert the node's holdings: while the node's liveness key is
    /// on the lease its link holds; with no key on a lease (none, or one written by hand) or
    /// one naming this process (an earlier round's, brought back by a restore), unless the
    /// node is registered under another machine uid. So a second process under the
    /// node's name (a clone, a reinstall, a machine that took the name of a node removed while
    /// it runs) never replaces the record of the one that holds the node, which may still
    /// serve pods from what it asserts, and the two never overwrite each other.
    async fn may_assert(&self) -> Result<bool, KvError> {
        let live = self.kv.get(self.keys.live(self.node).as_bytes()).await?;
        if let Some(entry) = live
            && let Some(lease) = entry.lease
        {
            if self.state.live_lease() == Some(lease) {
                return Ok(true);
            }
            // Another lease: this process's earlier round's (a restore brought the key back),
            // if the key names it; then the registration decides, as with no key.
            let this_process =
                decode_value::<corral_cluster::LiveRecord>(&entry.value).is_ok_and(|record| {
                    super::liveness::judge(&record, self.identity, super::liveness::process_start)
                        == super::liveness::Holder::ThisProcess
                });
            if !this_process {
                tracing::debug!("the node's liveness key is another process's: not asserting");
                return Ok(false);
            }
        }
        let registration = self.kv.get(self.keys.node(self.node).as_bytes()).await?;
        let other = registration
            .and_then(|e| decode_value::<NodeRecord>(&e.value).ok())
            .filter(|r| r.uid != self.uid);
        if let Some(other) = &other {
            tracing::debug!(
                registered = %other.uid,
                ours = %self.uid,
                "the node is registered under another machine uid: not asserting its holdings"
            );
        }
        Ok(other.is_none())
    }

    /// Asserts what the node state holds now unless the key already says it (a cheap read when it
    /// does). The link calls it before registering after a regression: the node's space is
    /// asserted before anything can be granted to it or around it.
    pub async fn assert_now(&self) -> Result<(), KvError> {
        let Asserter {
            kv,
            keys,
            node,
            uid,
            committer,
            state,
            guard,
            ..
        } = *self;
        let key = keys.holdings(node);
        let config = config_in_force(kv, keys, state).await?;
        let Ok(record) = read_host(committer, state, uid, config).await else {
            return Ok(());
        };
        let current = kv.get(key.as_bytes()).await?;
        let same = current
            .as_ref()
            .and_then(|e| decode_value::<HoldingsRecord>(&e.value).ok())
            .is_some_and(|found| difference(&found, &record) == Difference::Same);
        if !same && self.may_assert().await? {
            let floor = guard.floor();
            let revision = put(kv, &key, &record).await?;
            guard.observe_revision(floor, revision);
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` through a temporary file, synced, renamed, the directory synced.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let temporary = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// What the node asserts, from the node state's reports: the node scope's cluster ranges (the
/// node-ID plan's pod ranges as the node IDs they derive from, not as ranges), and its cloud
/// addresses. Sorted, so two assertions compare equal when they say the same.
pub fn assertion(
    uid: &str,
    blocks: &BlockReport,
    cloud: Option<&CloudReport>,
    plan: Option<&NodeIdPlanConfig>,
) -> HoldingsRecord {
    let plan_pool = PoolName::new(ClusterOptions::PLAN_POOL).ok();
    let mut record = HoldingsRecord {
        uid: uid.to_owned(),
        ..HoldingsRecord::default()
    };
    // The ID of each plan pod range.
    let mut plan_ids: Vec<u32> = Vec::new();
    for range in &blocks.ranges {
        let cidr = range.spec.subnet_net();
        let plan_id = plan
            .filter(|_| plan_pool.as_ref() == Some(&range.pool))
            .and_then(|plan| {
                let id = corral_cluster::node_id_of_pod_ip(plan, range.spec.start())?;
                (corral_cluster::pod_subnet_of(plan, id) == Some(cidr)).then_some(id)
            });
        if let Some(id) = plan_id {
            plan_ids.push(id);
            continue;
        }
        record.ranges.push(HeldRange {
            pool: range.pool.clone(),
            cidr,
            draining: range.draining,
            allocations: range.n_allocated,
        });
    }
    // Every ID whose pod range it serves is asserted: the highest in `node_id` (as ever, so a
    // leader that reads only `node_id` keeps it), the rest in `other_node_ids`.
    plan_ids.sort_unstable();
    plan_ids.dedup();
    if let Some(id) = plan_ids.pop() {
        record.node_id = Some(id);
        record.other_node_ids = plan_ids;
    }
    for address in cloud.iter().flat_map(|c| &c.addresses) {
        let Ok(interface) = CloudId::new(address.interface.as_str()) else {
            continue;
        };
        record.cloud.push(HeldCloudAddress {
            pool: address.pool.clone(),
            interface,
            address: address.address,
            allocations: address.n_allocated,
        });
    }
    record.ranges.sort();
    record.cloud.sort();
    record
}

/// How two assertions differ: `Same` (the time aside), only in allocation counts (none
/// becoming or ceasing to be zero), or in what is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Difference {
    Same,
    Counts,
    Held,
}

/// How `new` differs from `old`.
pub fn difference(old: &HoldingsRecord, new: &HoldingsRecord) -> Difference {
    let held_ranges = |r: &HoldingsRecord| -> Vec<_> {
        r.ranges
            .iter()
            .map(|h| (h.pool.clone(), h.cidr, h.draining, h.allocations == 0))
            .collect()
    };
    let held_cloud = |r: &HoldingsRecord| -> Vec<_> {
        r.cloud
            .iter()
            .map(|c| {
                (
                    c.pool.clone(),
                    c.interface.clone(),
                    c.address,
                    c.allocations == 0,
                )
            })
            .collect()
    };
    if old.uid != new.uid
        || old.node_id != new.node_id
        || old.other_node_ids != new.other_node_ids
        || held_ranges(old) != held_ranges(new)
        || held_cloud(old) != held_cloud(new)
        || old.refused != new.refused
        || old.refused_node_id != new.refused_node_id
    {
        return Difference::Held;
    }
    let timeless = |r: &HoldingsRecord| HoldingsRecord {
        written_ms: 0,
        ..r.clone()
    };
    if timeless(old) == timeless(new) {
        Difference::Same
    } else {
        Difference::Counts
    }
}

/// The cluster's configuration to read the node state's ranges by (the node-ID plan, the cloud
/// pools): the link's once it applied one; before that (the agent just started, its link
/// registering or waiting for the liveness key a killed process left) the one etcd holds, read
/// as the link reads it (`config-applied`, else `config`), so no record reads the plan's pod
/// range as a plain range and leaves out the node ID.
async fn config_in_force<K: Kv>(
    kv: &K,
    keys: &Keys,
    state: &SharedClusterState,
) -> Result<Option<Arc<ClusterConfig>>, KvError> {
    if let Some(config) = state.blocks.config() {
        return Ok(Some(config));
    }
    if let Some(entry) = kv.get(keys.config_applied().as_bytes()).await?
        && let Ok(record) = decode_value::<AppliedConfigRecord>(&entry.value)
    {
        return Ok(Some(Arc::new(record.config)));
    }
    let stored = kv.get(keys.config().as_bytes()).await?;
    Ok(stored
        .and_then(|e| ClusterConfig::from_json(&e.value).ok())
        .map(Arc::new))
}

/// Reads the node state's holdings through the committer (after every earlier batch
/// committed), read by `config` ([`config_in_force`]).
async fn read_host(
    committer: &Committer,
    state: &SharedClusterState,
    uid: &str,
    config: Option<Arc<ClusterConfig>>,
) -> Result<HoldingsRecord, String> {
    let blocks = committer
        .call(ReportBlocks {})
        .await
        .map_err(|error| format!("reading the node's ranges: {error:?}"))?;
    let clouds = config
        .as_ref()
        .is_some_and(|c| c.pools.iter().any(|p| p.is_cloud()));
    let cloud = if clouds {
        let report = committer
            .call(ReportCloud {})
            .await
            .map_err(|error| format!("reading the cloud pools: {error:?}"))?;
        Some(report)
    } else {
        None
    };
    let plan = config.as_ref().and_then(|c| c.node_ids.clone());
    let mut record = assertion(uid, &blocks, cloud.as_ref(), plan.as_ref());
    // The grants the link does not take up, for the leader to revoke.
    (record.refused, record.refused_node_id) = state
        .lock()
        .map(|s| (s.refused.clone(), s.refused_node_id))
        .unwrap_or_default();
    record.refused.sort();
    Ok(record)
}

/// What the publisher knows of the key: the record it last wrote (or found there, its own)
/// and that write's revision.
#[derive(Default)]
struct Written {
    record: Option<HoldingsRecord>,
    mod_revision: Revision,
    at: Option<Instant>,
    /// The key is known to be absent (a removed node that drained holds nothing: its empty
    /// record, deleted by the leader, is not put back).
    absent: bool,
}

/// Puts `record` at the node's key; answers the write's revision.
async fn put<K: Kv>(kv: &K, key: &str, record: &HoldingsRecord) -> Result<Revision, KvError> {
    let value = encode_value(&HoldingsRecord {
        written_ms: now_ms(),
        ..record.clone()
    })
    .map_err(|e| KvError::Refused(e.to_string()))?;
    let response = kv
        .txn(Txn {
            compares: vec![],
            success: vec![TxnOp::put(key, value)],
            failure: vec![],
        })
        .await?;
    Ok(response.revision)
}

/// Publishes the node's holdings until `stop` fires, whatever the cluster link does:
/// reconnects with backoff (1 s doubling to 30 s) after a failure.
#[allow(clippy::too_many_arguments)]
pub async fn publish<K: Kv>(
    kv: K,
    keys: Keys,
    node: NodeName,
    uid: String,
    committer: Committer,
    state: SharedClusterState,
    guard: Arc<EpochGuard>,
    identity: super::liveness::ProcessIdentity,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let asserter = Asserter {
        identity: &identity,
        kv: &kv,
        keys: &keys,
        node: &node,
        uid: &uid,
        committer: &committer,
        state: &state,
        guard: &guard,
    };
    let mut failures: u32 = 0;
    loop {
        let outcome = asserter.publish_round(&mut stop).await;
        match outcome {
            Ok(()) => return,
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(%error, failures, "asserting the node's holdings");
                }
                let wait = backoff(failures, u64::from(std::process::id()));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// One connected round of the publisher: reads the key, watches it, and writes the node state's
/// holdings whenever they or the key differ. Answers `Ok` on stop.
impl<K: Kv> Asserter<'_, K> {
    async fn publish_round(
        &self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), KvError> {
        let Asserter {
            kv,
            keys,
            node,
            uid,
            state,
            guard,
            ..
        } = *self;
        let key = keys.holdings(node);
        guard.probe(kv).await?;
        let floor = guard.floor();
        let page = kv.range(key.as_bytes(), None, 1, None).await?;
        guard.observe_revision(floor, page.revision);
        let mut written = Written::default();
        let entry = page.kvs.into_iter().find(|e| e.key == key.as_bytes());
        written.absent = entry.is_none();
        if let Some(entry) = entry
            && let Ok(found) = decode_value::<HoldingsRecord>(&entry.value)
            && found.uid == uid
        {
            written.record = Some(found);
            written.mod_revision = entry.mod_revision;
        }
        // A leader that saw etcd go back in time puts `reassert`: a record older than it is put
        // again (the leader counts only assertions made since).
        let reassert_key = keys.reassert();
        let mut requested = kv
            .range(reassert_key.as_bytes(), None, 1, Some(page.revision))
            .await?
            .kvs
            .into_iter()
            .find(|e| e.key == reassert_key.as_bytes())
            .map_or(0, |e| e.mod_revision);
        let mut watch = kv.watch(key.as_bytes(), page.revision + 1).await?;
        let mut reasserts = kv.watch(reassert_key.as_bytes(), page.revision + 1).await?;
        let mut ranges = state.blocks.subscribe_ranges();
        let mut regressed = guard.subscribe();
        let mut look_at = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(look_at) => {
                    look_at = self.look(&key, &mut written, requested).await?;
                }
                batch = watch.next() => {
                    for event in batch? {
                        match event {
                            Event::Delete { mod_revision, .. } => {
                                guard.observe_revision(0, mod_revision);
                                written.record = None;
                                written.absent = true;
                                look_at = Instant::now();
                            }
                            Event::Put(entry) if entry.mod_revision != written.mod_revision => {
                                // Written by someone else (etcdctl, a restored snapshot, a second
                                // process under this name): put back what this node holds, at
                                // most once per `REWRITE_EVERY` (two writers never fight at
                                // etcd's speed).
                                guard.observe_revision(0, entry.mod_revision);
                                written.record = None;
                                written.absent = false;
                                let now = Instant::now();
                                look_at = written.at.map_or(now, |at| (at + REWRITE_EVERY).max(now));
                            }
                            Event::Put(_) => {}
                        }
                    }
                }
                batch = reasserts.next() => {
                    for event in batch? {
                        if let Event::Put(entry) = event
                            && entry.key == reassert_key.as_bytes()
                        {
                            guard.observe_revision(0, entry.mod_revision);
                            requested = entry.mod_revision;
                            look_at = Instant::now();
                        }
                    }
                }
                changed = ranges.changed() => {
                    if changed.is_ok() {
                        look_at = Instant::now();
                    }
                }
                _ = regressed.changed() => {
                    written.record = None;
                    look_at = Instant::now();
                }
                _ = stop.changed() => return Ok(()),
            }
        }
    }

    /// Looks at the node state's holdings and writes them if they differ from the key (what is held:
    /// at once; counts alone: at most every [`COUNTS_REFRESH`]) or the key was written before
    /// `requested` (the `reassert` key's mod revision, 0 if none). Answers when to look next.
    async fn look(
        &self,
        key: &str,
        written: &mut Written,
        requested: Revision,
    ) -> Result<Instant, KvError> {
        let Asserter {
            kv,
            keys,
            uid,
            committer,
            state,
            guard,
            ..
        } = *self;
        let now = Instant::now();
        let config = config_in_force(kv, keys, state).await?;
        let record = match read_host(committer, state, uid, config).await {
            Ok(record) => record,
            Err(error) => {
                tracing::warn!(%error, "reading what the node holds");
                return Ok(now + LOOK_EVERY);
            }
        };
        let difference = written
            .record
            .as_ref()
            .map_or(Difference::Held, |old| difference(old, &record));
        let write = match difference {
            // A removed node that drained holds nothing and its key is gone (the leader deleted
            // the empty record when the removal was done): absence already says so. (A node in
            // the cluster writes even an empty record: a new term waits for live nodes' records.)
            Difference::Held if written.absent && record.is_empty() && state.is_removed() => false,
            // Written before a leader asked for every record again (etcd went back in time).
            _ if written.mod_revision <= requested => true,
            Difference::Same => false,
            Difference::Held => true,
            Difference::Counts => written.at.is_none_or(|at| now >= at + COUNTS_REFRESH),
        };
        if !write {
            let next = match (difference, written.at) {
                (Difference::Counts, Some(at)) => (at + COUNTS_REFRESH).min(now + LOOK_EVERY),
                _ => now + LOOK_EVERY,
            };
            return Ok(next);
        }
        if !self.may_assert().await? {
            return Ok(now + LOOK_EVERY);
        }
        let floor = guard.floor();
        let revision = put(kv, key, &record).await?;
        guard.observe_revision(floor, revision);
        if difference == Difference::Held {
            guard.flush();
        }
        *written = Written {
            record: Some(record),
            mod_revision: revision,
            at: Some(now),
            absent: false,
        };
        Ok(now + LOOK_EVERY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::HeldRange as HostRange;
    use corral_core::RangeSpec;

    fn pool(name: &str) -> PoolName {
        PoolName::new(name).unwrap()
    }

    #[test]
    fn a_flush_writes_the_revision_reached_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd-epoch");
        let guard = EpochGuard::load(Some(path.clone()));
        let at = |revision| Epoch {
            cluster_id: 7,
            revision,
        };
        let remembered = || {
            EpochMemory::from_json(&std::fs::read(&path).unwrap())
                .unwrap()
                .floor()
        };
        guard.observe(at(10));
        assert_eq!(remembered(), 10);
        // Advancing alone is written at most every few seconds...
        guard.observe(at(20));
        assert_eq!(remembered(), 10);
        // ...a flush writes it now, and nothing when nothing changed.
        guard.flush();
        assert_eq!(remembered(), 20);
        guard.flush();
        assert_eq!(remembered(), 20);
        assert_eq!(EpochGuard::load(Some(path)).floor(), 20);
    }

    /// Review (2026-12-01): a node whose node ID changed (a restore lost its grant, or it was
    /// removed and registered again) serves the new ID and drains the old one's pod range while
    /// pods still use it. Only the highest ID was asserted, so a lower one (here the new) was
    /// given up in the record while the node still served it.
    #[test]
    fn the_assertion_names_every_node_id_whose_pod_range_the_node_serves() {
        let plan = corral_cluster::testing::node_id_plan();
        let plan_range = |id: u32, draining: bool| HostRange {
            pool: pool("default"),
            spec: RangeSpec::subnet(corral_cluster::pod_subnet_of(&plan, id).unwrap()).unwrap(),
            n_allocated: 1,
            draining,
        };
        let report = |ranges: Vec<HostRange>| BlockReport {
            stats: vec![],
            ranges,
            surrendered: vec![],
        };
        // The old ID (5) drains, the new one (2) serves new pods: the highest in `node_id`
        // (what a leader that reads only `node_id` keeps), the other beside it.
        let record = assertion(
            "uid-1",
            &report(vec![plan_range(5, true), plan_range(2, false)]),
            None,
            Some(&plan),
        );
        assert_eq!(record.node_id, Some(5));
        assert_eq!(record.other_node_ids, vec![2]);
        assert_eq!(record.node_ids().collect::<Vec<_>>(), vec![5, 2]);
        assert!(record.ranges.is_empty());
        // The old one drained away: only the new one is left.
        let drained = assertion(
            "uid-1",
            &report(vec![plan_range(2, false)]),
            None,
            Some(&plan),
        );
        assert_eq!(drained.node_id, Some(2));
        assert!(drained.other_node_ids.is_empty());
        assert_eq!(difference(&record, &drained), Difference::Held);
        // Both draining (the node lost its ID): both still held, the highest first.
        let both = assertion(
            "uid-1",
            &report(vec![plan_range(2, true), plan_range(5, true)]),
            None,
            Some(&plan),
        );
        assert_eq!(both.node_ids().collect::<Vec<_>>(), vec![5, 2]);
    }

    #[test]
    fn the_assertion_lists_cluster_ranges_and_the_plans_pod_range_as_its_node_id() {
        let plan = corral_cluster::testing::node_id_plan();
        let id = 3;
        let pod = corral_cluster::pod_subnet_of(&plan, id).unwrap();
        let report = BlockReport {
            stats: vec![],
            ranges: vec![
                HostRange {
                    pool: pool("default"),
                    spec: RangeSpec::subnet(pod).unwrap(),
                    n_allocated: 2,
                    draining: false,
                },
                HostRange {
                    pool: pool("pods"),
                    spec: corral_cluster::node_range("10.244.1.0/24".parse().unwrap()).unwrap(),
                    n_allocated: 0,
                    draining: true,
                },
            ],
            surrendered: vec![],
        };
        let record = assertion("uid-1", &report, None, Some(&plan));
        assert_eq!(record.node_id, Some(id));
        assert_eq!(record.ranges.len(), 1);
        assert_eq!(record.ranges[0].cidr.to_string(), "10.244.1.0/24");
        assert!(record.ranges[0].draining);
        // Without the plan the pod range is a range like any other.
        let without = assertion("uid-1", &report, None, None);
        assert_eq!(without.node_id, None);
        assert_eq!(without.ranges.len(), 2);
        // Counts alone differ less than what is held.
        let mut more = record.clone();
        more.ranges[0].allocations = 5;
        assert_eq!(difference(&record, &more), Difference::Held);
        let mut five = more.clone();
        five.ranges[0].allocations = 6;
        assert_eq!(difference(&more, &five), Difference::Counts);
        let later = HoldingsRecord {
            written_ms: 99,
            ..five.clone()
        };
        assert_eq!(difference(&five, &later), Difference::Same);
    }

    #[test]
    fn the_guard_remembers_across_restarts_and_reports_a_regression() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd-epoch");
        let guard = EpochGuard::load(Some(path.clone()));
        let at = |cluster_id, revision| Epoch {
            cluster_id,
            revision,
        };
        assert_eq!(guard.observe(at(5, 40)), None);
        drop(guard);
        let again = EpochGuard::load(Some(path.clone()));
        assert_eq!(again.memory().highest, Some(at(5, 40)));
        assert!(again.observe(at(5, 12)).is_some());
        let third = EpochGuard::load(Some(path));
        assert_eq!(third.memory().highest, Some(at(5, 12)));
    }
}
