//! What the leading replica does: rebuild the cluster view from one read of the prefix, keep
//! it current from a watch, and turn the view's proposals into fenced transactions (grants to
//! registered nodes, removals asked for by `corral node remove`).
//!
//! The loop owns the view; transactions run concurrently (up to `workers` at once) and their
//! outcomes come back to the loop, which applies them. A proposal marks what it proposes as
//! in flight in the view, so two concurrent proposals never name the same CIDR or node ID;
//! and etcd decides anyway: every grant transaction compares every key it creates absent, the
//! node's registration unchanged, the configuration unchanged, and the fence.
//!
//! Beside the loop, while leading lasts: the cloud node manager (`cloud/`), the to-cloud
//! delegations (`to_cloud.rs`) and the node CIDR sync from the cloud (`node_cidr_sync.rs`).
//! All four loops run on one runner (`runner.rs`): each is a `Reconciler`, and the runner keeps
//! the tasks in flight, one per node, and each node's backoff.
//!
//! When a transaction's outcome is unknown (the store failed mid-call), or the watch meets a
//! compaction, the view is rebuilt from a fresh read before anything else, so a retry is never made
//! from the same stale cache; a refused batch is sent again node by node (`solo`), and a refused
//! single grant backs its node off with nodeipam's timing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use corral_cluster::{
    ClusterView, GrantEnd, Keys, NodeName, Proposal, ProposeError, Removal, RemovalRecord, Resync,
    RetryState, encode_value,
};
use corral_kv::{Compare, Event, Kv, KvError, Revision, Scan, Txn, TxnOp, Watch};
use tokio::time::Instant;

use crate::election::Fence;
use crate::state::{Shared, TxnOutcome};

mod block_state;
mod blocks;
pub(crate) mod cloud;
mod drain;
mod history;
mod logged;
pub(crate) mod node_cidr_sync;
mod pending;
mod revoke;
mod runner;
mod txn;
mod waiting;
mod work;

pub use history::{TRIM_EVERY as HISTORY_TRIM_EVERY, TrimError, trim as trim_history};
use runner::{Reconciler, Runner};
use txn::{TxnFailure, run};
use work::{Done, Work, backoff, node_span};
pub(crate) mod to_cloud;

/// How much a leader does at once: transactions in flight, and keys per range request of a
/// rebuild.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Transactions in flight at once.
    pub workers: usize,
    /// Keys per range request of a rebuild.
    pub page: usize,
    /// Operations a grant transaction may hold (etcd's `--max-txn-ops`).
    pub txn_ops: usize,
}

/// How often the leader asks etcd for its header (its cluster ID and revision).
const EPOCH_PROBE: Duration = Duration::from_secs(2);

/// Refused grants revoked per transaction (two deletes and three history puts each, two
/// compares).
const REVOCATIONS_PER_TXN: usize = 25;

/// Why leading ended.
#[derive(Debug, thiserror::Error)]
pub enum LeadError {
    #[error("leadership lost")]
    Lost,
    #[error("etcd went back in time: the term ends, the next one reads the store again")]
    Regressed,
    #[error("cluster store: {0}")]
    Kv(#[from] KvError),
}

/// Leads until the lease is lost or `stop` fires. With `cloud`, the cloud node manager runs
/// beside the loop; it ends (every cloud call in flight dropped) when leading ends.
#[allow(clippy::too_many_arguments)]
pub async fn lead<K: Kv, P: corral_cloud::CloudProvider + 'static>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    lost: &mut tokio::sync::watch::Receiver<bool>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    shared: &Arc<Shared>,
    sizes: Sizes,
    cloud: Option<(&crate::CloudOptions<P>, &corral_cloud::Scheduled<Arc<P>>)>,
) -> Result<(), LeadError> {
    let started = Instant::now();
    // etcd's time first: a store that went back (restored, wiped) is noticed before anything
    // is read from it; and every term waits for the live agents' holdings (`epoch.rs`).
    // Asked to stop meanwhile (`stop`), it ends as a term does: the caller resigns. The read
    // waits while no configuration was ever installed (before `cluster init`), so it must
    // hear the stop too.
    tokio::select! {
        biased;
        probed = shared.probe_epoch(kv) => { probed?; }
        _ = lost.changed() => return Err(LeadError::Lost),
        () = crate::stopped(stop) => return Ok(()),
    }
    shared.begin_term();
    let (view, revision) = tokio::select! {
        biased;
        rebuilt = rebuild(kv, keys, shared, sizes.page) => rebuilt?,
        _ = lost.changed() => return Err(LeadError::Lost),
        () = crate::stopped(stop) => {
            shared.end_term();
            return Ok(());
        }
    };
    shared.install(view, revision);
    shared.set_leading(true, started.elapsed());
    // Node CIDRs synced with the cloud (`cloud_sync`): beside the loop, with or without a
    // provider (without one it only reports).
    let sync_signal = Arc::new(node_cidr_sync::SyncSignal::default());
    // The grants' history trimmed beside the loop, off the grant path.
    let trim = history::trim_loop(kv.clone(), keys.clone(), fence.clone(), Arc::clone(shared));
    let result = match cloud {
        None => {
            let sync = node_cidr_sync::run::<K, P>(
                kv.clone(),
                keys.clone(),
                fence.clone(),
                Arc::clone(shared),
                None,
                Arc::clone(&sync_signal),
            );
            // Polled in a fixed order (`biased`: each is polled on every wake-up, only the order
            // is fixed), so a seeded run on a paused clock repeats itself.
            tokio::select! {
                biased;
                result = serve(kv, keys, fence, lost, stop, shared, sizes, None, &sync_signal) => result,
                () = sync => Err(LeadError::Lost),
                () = trim => Err(LeadError::Lost),
            }
        }
        Some((options, scheduler)) => {
            let signal = Arc::new(cloud::CloudSignal::default());
            // This term's calls: shut down when the lead ends, so no call waiting for a token
            // or a backoff is sent by a replica that no longer leads.
            let session = scheduler.session();
            let manager = cloud::manage(
                kv.clone(),
                keys.clone(),
                fence.clone(),
                Arc::clone(shared),
                Arc::new(session.clone()),
                options.clone(),
                Arc::clone(&signal),
            );
            let sync = node_cidr_sync::run(
                kv.clone(),
                keys.clone(),
                fence.clone(),
                Arc::clone(shared),
                Some(node_cidr_sync::SyncCloud {
                    provider: Arc::new(session.clone()),
                    resync: options.resync,
                    clock: Arc::clone(&options.clock),
                    workers: options.workers,
                }),
                Arc::clone(&sync_signal),
            );
            // To-cloud node-cidr pools: their grants delegated to the nodes' instances.
            let delegations = to_cloud::manage(
                kv.clone(),
                keys.clone(),
                fence.clone(),
                Arc::clone(shared),
                Arc::new(session.clone()),
                options.workers,
                options.resync,
                Arc::clone(&options.clock),
                Arc::clone(&signal.to_cloud),
            );
            // In a fixed order, as above.
            let result = tokio::select! {
                biased;
                result = serve(kv, keys, fence, lost, stop, shared, sizes, Some(signal), &sync_signal) => result,
                // The manager and the sync run until dropped here; they return only if the
                // lead is gone (the view removed).
                () = manager => Err(LeadError::Lost),
                () = sync => Err(LeadError::Lost),
                () = delegations => Err(LeadError::Lost),
                () = trim => Err(LeadError::Lost),
            };
            session.shutdown();
            result
        }
    };
    shared.set_leading(false, Duration::ZERO);
    shared.clear_cloud();
    shared.end_term();
    result
}

/// Reads the whole prefix at one revision and builds the view from it.
async fn rebuild<K: Kv>(
    kv: &K,
    keys: &Keys,
    shared: &Arc<Shared>,
    page: usize,
) -> Result<(ClusterView, Revision), LeadError> {
    loop {
        let started = Instant::now();
        let config_key = keys.config();
        let applied_key = keys.config_applied();
        let floor = shared.epoch_floor();
        // `config` and `config-applied` first (they sort side by side), then every other key
        // at that revision, kind by kind in bounded ranges, each page applied as it comes:
        // the keys are never all in memory beside the view, and etcd walks about as many
        // keys as are read (`corral_kv::Scan`).
        let mut span_end = applied_key.clone().into_bytes();
        span_end.push(0);
        let first = kv
            .range_span(config_key.as_bytes(), &span_end, 2, None)
            .await?;
        let revision = first.revision;
        shared.observe_revision(floor, revision);
        let value_of = |key: &str| {
            first
                .kvs
                .iter()
                .find(|e| e.key == key.as_bytes())
                .map(|e| (e.value.clone(), e.mod_revision))
        };
        let stored = value_of(&config_key);
        let applied = value_of(&applied_key);
        // The view starts under the last configuration installed; the stored one is judged
        // after every other key is read (the grants must be known): one path with the watch.
        // A resync or restart keeps the configuration in force if `config-applied` does not
        // read (not written yet, or deleted around the CLI).
        let last = shared
            .with_view(|view, _| {
                view.config_in_force()
                    .then(|| (view.config().clone(), view.installed_revision()))
            })
            .flatten();
        let mut view = match ClusterView::for_read_after(
            keys.clone(),
            stored.as_ref().map(|(v, _)| v.as_slice()),
            applied.as_ref().map(|(v, _)| v.as_slice()),
            last,
        ) {
            Ok(view) => {
                shared.resolve("config", "unreadable");
                view
            }
            Err(problem) => {
                // A configuration this build cannot read grants nothing; a fixed one
                // (`corral cluster apply --force`) is picked up by the watch below.
                shared.raise("config", "unreadable", problem);
                wait_for_change(kv, config_key.as_bytes(), revision).await?;
                continue;
            }
        };
        // The grants' history is no part of the view (and may be most of the keys): the read
        // leaves it out.
        let mut scan = Scan::new(keys.prefix().as_bytes(), page)
            .at(revision)
            .skipping(keys.history_prefix().as_bytes())
            .by_segments(&keys.kinds());
        // The next page is asked for before this one is applied: etcd reads while the view
        // takes the page in.
        let mut page = scan.next(kv).await?;
        while let Some(current) = page {
            let apply = async {
                apply_read_page(&mut view, keys, &current.kvs);
            };
            let (next, ()) = tokio::join!(scan.next(kv), apply);
            page = next?;
        }
        view.finish_read(stored.as_ref().map(|(v, r)| (v.as_slice(), *r)));
        if !view.config_in_force() {
            // No configuration was ever installed and the stored one does not fit the
            // grants: nothing is granted until one that fits is applied.
            shared.set_key_problems(view.take_problems());
            wait_for_change(kv, config_key.as_bytes(), revision).await?;
            continue;
        }
        // A full read: the keys' problems are what it found.
        shared.set_key_problems(view.take_problems());
        shared.note_rebuild(scan.stats(), started.elapsed());
        return Ok((view, revision));
    }
}

/// Applies one page of a rebuild's read to the view: every key but the configuration's (read
/// first, and judged once the read is done). The rebuild bench times it alone.
pub fn apply_read_page(view: &mut ClusterView, keys: &Keys, page: &[corral_kv::KeyValue]) -> usize {
    let mut applied = 0;
    for entry in page {
        let key = entry.key_str();
        if corral_cluster::is_config_key(keys, &key) {
            continue;
        }
        view.apply_put(
            &key,
            &entry.value,
            entry.create_revision,
            entry.mod_revision,
        );
        applied += 1;
    }
    applied
}

/// Waits until `key` changes after `revision`.
async fn wait_for_change<K: Kv>(kv: &K, key: &[u8], revision: Revision) -> Result<(), LeadError> {
    let mut watch = kv.watch(key, revision + 1).await?;
    loop {
        if watch.next().await?.iter().any(|e| e.key() == key) {
            return Ok(());
        }
    }
}

/// The loop's view: the one in `shared` (the API reads it), changed in short sections.
fn with_view<T>(
    shared: &Shared,
    f: impl FnOnce(&mut ClusterView, &mut Revision) -> T,
) -> Result<T, LeadError> {
    // `lead` installs the view before serving and removes it after: absent means the lead
    // is being given up.
    shared.with_view_mut(f).ok_or(LeadError::Lost)
}

/// Why serving ended: asked to stop, or leading ended.
enum Ended {
    Stopped,
    Failed(LeadError),
}

impl From<LeadError> for Ended {
    fn from(error: LeadError) -> Self {
        Ended::Failed(error)
    }
}

impl From<KvError> for Ended {
    fn from(error: KvError) -> Self {
        Ended::Failed(error.into())
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    lost: &mut tokio::sync::watch::Receiver<bool>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    shared: &Arc<Shared>,
    sizes: Sizes,
    cloud: Option<Arc<cloud::CloudSignal>>,
    sync: &Arc<node_cidr_sync::SyncSignal>,
) -> Result<(), LeadError> {
    let (from, timing) = with_view(shared, |view, revision| {
        (*revision + 1, Resync::from(&view.config().resync))
    })?;
    let watch = kv.watch(keys.prefix().as_bytes(), from).await?;
    // etcd's time, read every few seconds: a regression in the term (the watch, from a
    // revision the restored store has not reached, says nothing) ends it, and the next term
    // reads the store as it is now.
    let mut epoch_tick = tokio::time::interval(EPOCH_PROBE);
    epoch_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The lead's own full read spaces out the first resync as a resync's would.
    let mut sync_state = RetryState::default();
    let lead_read = shared
        .last_rebuild()
        .map_or(Duration::ZERO, |(_, took)| took);
    let resync_at = Instant::now() + sync_state.read_all(&timing, lead_read);
    let mut leading = Leading {
        kv,
        keys,
        fence,
        lost,
        stop,
        shared,
        page: sizes.page,
        watch,
        work: Work {
            pending: Default::default(),
            rescan: true,
            waiting_for_space: Default::default(),
            solo: Default::default(),
            block_pending: Default::default(),
            block_rescan: true,
            clock: block_state::BlockClock::new(),
            cloud,
            sync: Arc::clone(sync),
            drain_wait: HashMap::new(),
            recover: false,
            lost: Vec::new(),
            txn_ops: sizes.txn_ops,
        },
        dirty: true,
        timers_first: false,
        sync_state,
        read_at: Instant::now(),
        resync_at,
        applied_tried: None,
        regressions: shared.regressions(),
        epoch_tick,
        publisher: waiting::Publisher::new(),
    };
    match runner::run(&mut leading, &mut Runner::new(sizes.workers)).await {
        Ended::Stopped => Ok(()),
        Ended::Failed(error) => Err(error),
    }
}

/// The leading loop: the view's watch in, fenced transactions out.
struct Leading<'a, K> {
    kv: &'a K,
    keys: &'a Keys,
    fence: &'a Fence,
    lost: &'a mut tokio::sync::watch::Receiver<bool>,
    stop: &'a mut tokio::sync::watch::Receiver<bool>,
    shared: &'a Arc<Shared>,
    /// Keys per range request of a rebuild.
    page: usize,
    watch: Watch,
    work: Work,
    /// The view changed since the last turn: look for work.
    dirty: bool,
    /// The periodic resync (nodeipam's `Timeout`): `Resync` after a success, `InitialRetry`
    /// doubling to `MaxBackoff` after failures. The watch keeps the view current; the resync
    /// re-reads everything at one revision and reports any drift, as a backstop.
    sync_state: RetryState,
    resync_at: Instant,
    /// When the view was last read whole (the lead's rebuild, the last resync).
    read_at: Instant,
    /// The `config-applied` write last tried, as (its compare, the configuration's revision):
    /// tried again only once the view has changed (or after a resync).
    applied_tried: Option<(Revision, Revision)>,
    /// etcd's regressions seen when the term began: another one ends the term.
    regressions: u64,
    epoch_tick: tokio::time::Interval,
    /// The nodes' waiting records (`waiting.rs`).
    publisher: waiting::Publisher,
    /// `wait` polls the timers before the watch on every other wake-up, so a watch that
    /// always has events cannot hold the timers off, and the order is still fixed.
    timers_first: bool,
}

/// What the leading loop woke for besides its transactions and its nodes' backoffs.
enum Wake {
    Watch(Result<Vec<Event>, KvError>),
    EpochTick,
    EpochSettled,
    ReleaseDelay,
    /// A pass over the nodes' waiting records is owed and its time came.
    Publish,
    Resync,
    Lost,
    Stop,
}

impl<K: Kv> Reconciler for Leading<'_, K> {
    type Key = NodeName;
    type Done = Done;
    type Wake = Wake;
    type End = Ended;

    async fn turn(&mut self, runner: &mut Runner<NodeName, Done>) -> Result<(), Ended> {
        let (kv, keys, fence, shared) = (self.kv, self.keys, self.fence, self.shared);
        if *self.lost.borrow() {
            return Err(LeadError::Lost.into());
        }
        if shared.regressions() != self.regressions {
            drain(runner, &mut self.work, shared).await;
            return Err(LeadError::Regressed.into());
        }
        if !std::mem::take(&mut self.dirty) {
            return Ok(());
        }
        // etcd went back in time: every agent is asked to assert what it holds again.
        shared.reassert(kv, keys, fence).await;
        let work = &mut self.work;
        let applied = with_view(shared, |view, _| {
            start_work(kv, keys, fence, shared, view, runner, work);
            for problem in view.take_problems() {
                let message = format!("{}: {}", problem.key, problem.message);
                shared.raise("key", problem.key, message);
            }
            view.applied_to_write()
                .map(|record| (record, view.applied_revision(), view.config_revision()))
        })?;
        if let Some((record, applied_revision, config_revision)) = applied
            && self.applied_tried != Some((applied_revision, record.config_revision))
        {
            self.applied_tried = Some((applied_revision, record.config_revision));
            write_applied(
                kv,
                keys,
                fence,
                shared,
                &record,
                applied_revision,
                config_revision,
            )
            .await;
        }
        // Why each node it cannot serve waits, published where its agent watches.
        waiting::publish(kv, keys, fence, shared, &mut self.publisher).await;
        Ok(())
    }

    async fn wait(&mut self) -> Wake {
        let next_wake = self
            .work
            .clock
            .next_wake()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let epoch_wake = self
            .shared
            .epoch_wake()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let publish_wake = self
            .publisher
            .due()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        // In a fixed order (`biased`), so a seeded run on a paused clock repeats itself: the
        // end of the term first, then the store's events and the timers, taking turns at
        // going first (neither can hold the other off).
        self.timers_first = !self.timers_first;
        let timers = async {
            tokio::select! {
                biased;
                _ = self.epoch_tick.tick() => Wake::EpochTick,
                () = tokio::time::sleep_until(epoch_wake) => Wake::EpochSettled,
                () = tokio::time::sleep_until(next_wake) => Wake::ReleaseDelay,
                () = tokio::time::sleep_until(publish_wake) => Wake::Publish,
                () = tokio::time::sleep_until(self.resync_at) => Wake::Resync,
            }
        };
        let watch = self.watch.next();
        tokio::pin!(timers, watch);
        if self.timers_first {
            tokio::select! {
                biased;
                _ = self.lost.changed() => Wake::Lost,
                _ = self.stop.changed() => Wake::Stop,
                wake = &mut timers => wake,
                batch = &mut watch => Wake::Watch(batch),
            }
        } else {
            tokio::select! {
                biased;
                _ = self.lost.changed() => Wake::Lost,
                _ = self.stop.changed() => Wake::Stop,
                batch = &mut watch => Wake::Watch(batch),
                wake = &mut timers => wake,
            }
        }
    }

    async fn woke(&mut self, runner: &mut Runner<NodeName, Done>, wake: Wake) -> Result<(), Ended> {
        let (kv, keys, shared) = (self.kv, self.keys, self.shared);
        match wake {
            Wake::Watch(Ok(events)) => {
                if let Some(last) = events.iter().map(Event::revision).max() {
                    shared.observe_revision(0, last);
                }
                let work = &mut self.work;
                with_view(shared, |view, revision| {
                    for event in events {
                        *revision = (*revision).max(event.revision());
                        apply_event(view, &event);
                        work.note(runner, keys, &event);
                    }
                    work.drain_wait.retain(|_, at| *at > *revision);
                })?;
                if std::mem::take(&mut self.work.recover) {
                    let regression = shared.request_recover();
                    shared.note_problem(format!(
                        "`corral cluster recover --yes`: granting resumes without waiting \
                         for the agents' assertions{}",
                        regression.map(|r| format!(" ({r})")).unwrap_or_default()
                    ));
                }
                self.dirty = true;
            }
            Wake::Watch(Err(KvError::Compacted { .. })) => {
                // The watch fell behind the store's history: read everything again.
                let at = restart(kv, keys, shared, self.page, runner, &mut self.work).await?;
                self.watch = kv.watch(keys.prefix().as_bytes(), at + 1).await?;
                self.dirty = true;
            }
            Wake::Watch(Err(error)) => return Err(error.into()),
            Wake::EpochTick => {
                if let Err(error) = shared.probe_epoch(kv).await
                    && !error.is_retryable()
                {
                    return Err(error.into());
                }
            }
            Wake::EpochSettled => {
                // The settle time of a wait for the agents' assertions ran out.
                self.dirty = true;
            }
            Wake::Publish => {
                waiting::publish(kv, keys, self.fence, shared, &mut self.publisher).await;
            }
            Wake::ReleaseDelay => {
                // A release delay ran out: those nodes may mark blocks now.
                for node in self.work.clock.take_due() {
                    self.work.block_pending.insert(node);
                }
                self.dirty = true;
            }
            Wake::Resync => {
                let timing = with_view(shared, |view, _| Resync::from(&view.config().resync))?;
                let backlog = !self.work.pending.is_empty();
                if let Some(wait) = timing.deferral(self.read_at.elapsed(), backlog) {
                    self.resync_at = Instant::now() + wait;
                    return Ok(());
                }
                drain(runner, &mut self.work, shared).await;
                let started = Instant::now();
                match rebuild(kv, keys, shared, self.page).await {
                    Ok((fresh, at)) => {
                        let took = started.elapsed();
                        self.read_at = Instant::now();
                        shared.resolve("etcd", "resync");
                        match shared.probe_epoch(kv).await {
                            Ok(_) => shared.resolve("etcd", "resync: etcd's header"),
                            Err(error) => shared.raise(
                                "etcd",
                                "resync: etcd's header",
                                format!("resync: reading etcd's header: {error}"),
                            ),
                        }
                        let drift = with_view(shared, |view, _| drift(view, &fresh))?;
                        if !drift.is_empty() {
                            shared.note_problem(format!(
                                "resync at revision {at} found the view behind: {}",
                                drift.join("; ")
                            ));
                        }
                        shared.install(fresh, at);
                        self.applied_tried = None;
                        self.watch = kv.watch(keys.prefix().as_bytes(), at + 1).await?;
                        shared.note_resync(true);
                        self.resync_at = Instant::now() + self.sync_state.read_all(&timing, took);
                    }
                    Err(LeadError::Kv(error)) if error.is_retryable() => {
                        shared.raise("etcd", "resync", format!("resync: {error}"));
                        shared.note_resync(false);
                        self.resync_at = Instant::now() + self.sync_state.error(&timing);
                    }
                    Err(error) => return Err(error.into()),
                }
                self.dirty = true;
            }
            Wake::Lost => return Err(LeadError::Lost.into()),
            Wake::Stop => {
                drain(runner, &mut self.work, shared).await;
                return Err(Ended::Stopped);
            }
        }
        Ok(())
    }

    async fn finish(
        &mut self,
        runner: &mut Runner<NodeName, Done>,
        done: Done,
    ) -> Result<(), Ended> {
        let (kv, keys, shared) = (self.kv, self.keys, self.shared);
        let work = &mut self.work;
        let uncertain = with_view(shared, |view, revision| {
            let uncertain = finish(view, shared, runner, work, done);
            // A step the watch delivered already waits for nothing.
            work.drain_wait.retain(|_, at| *at > *revision);
            uncertain
        })?;
        // A grant batch whose answer was lost: one read before anything else is proposed.
        // The first read that fails settles it: the store is read whole, which answers the rest.
        let mut resolved = true;
        for batch in std::mem::take(&mut self.work.lost) {
            if !resolve_lost(kv, keys, shared, runner, &mut self.work, batch).await? {
                resolved = false;
                break;
            }
        }
        if uncertain || !resolved {
            // The store may or may not have applied it: the view is rebuilt from what
            // the store holds before anything else is proposed.
            let at = restart(kv, keys, shared, self.page, runner, &mut self.work).await?;
            self.watch = kv.watch(keys.prefix().as_bytes(), at + 1).await?;
        }
        self.dirty = true;
        Ok(())
    }

    fn due(&mut self, nodes: Vec<NodeName>) {
        // Their backoff ran out (it is kept: a failure again waits longer).
        for node in nodes {
            self.work.block_pending.insert(node.clone());
            self.work.pending.insert(node);
        }
        self.dirty = true;
    }
}

/// Records the configuration in force as `config-applied` (fenced; the key and `config` as the
/// view saw them), so the last good configuration survives a restart or a failover. A failed
/// write is reported; the watch brings whatever changed, and the next change of the view (or
/// the next resync) tries again.
async fn write_applied<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    shared: &Shared,
    record: &corral_cluster::AppliedConfigRecord,
    applied_revision: Revision,
    config_revision: Revision,
) {
    let key = keys.config_applied();
    let value = match encode_value(record) {
        Ok(value) => value,
        Err(error) => {
            shared.raise("key", &key, format!("{key}: {error}"));
            return;
        }
    };
    let txn = Txn {
        compares: vec![
            Compare::modified_at(key.clone(), applied_revision),
            Compare::modified_at(keys.config(), config_revision),
        ],
        success: vec![TxnOp::put(key.clone(), value)],
        failure: vec![],
    };
    match kv.txn(fence.guard(txn)).await {
        Ok(_) => shared.resolve("etcd", &key),
        Err(error) => shared.raise("etcd", &key, format!("{key}: not written: {error}")),
    }
}

/// What a fresh read holds that the view did not (or the other way round), per node: empty
/// when the watch kept the view current, as it should.
fn drift(view: &ClusterView, fresh: &ClusterView) -> Vec<String> {
    let held: BTreeMap<String, (Vec<String>, Option<u32>)> = view
        .node_reports(None)
        .into_iter()
        .map(|n| (n.name, (n.grants, n.node_id)))
        .collect();
    let read: BTreeMap<String, (Vec<String>, Option<u32>)> = fresh
        .node_reports(None)
        .into_iter()
        .map(|n| (n.name, (n.grants, n.node_id)))
        .collect();
    let mut drift = Vec::new();
    for (node, holdings) in &read {
        if held.get(node) != Some(holdings) {
            drift.push(format!(
                "node {node}: view {:?}, store {holdings:?}",
                held.get(node)
            ));
        }
    }
    for node in held.keys().filter(|n| !read.contains_key(*n)) {
        drift.push(format!("node {node}: in the view, not in the store"));
    }
    drift
}

/// Waits for the transactions in flight, then reads everything again and installs the new
/// view; answers its revision.
async fn restart<K: Kv>(
    kv: &K,
    keys: &Keys,
    shared: &Arc<Shared>,
    page: usize,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
) -> Result<Revision, LeadError> {
    drain(runner, work, shared).await;
    let (view, revision) = rebuild(kv, keys, shared, page).await?;
    shared.install(view, revision);
    Ok(revision)
}

fn apply_event(view: &mut ClusterView, event: &Event) {
    match event {
        Event::Put(kv) => view.apply_put(
            &kv.key_str(),
            &kv.value,
            kv.create_revision,
            kv.mod_revision,
        ),
        Event::Delete { key, mod_revision } => {
            view.apply_delete(&String::from_utf8_lossy(key), *mod_revision)
        }
    }
}

/// A grant batch whose answer was lost (the store failed mid-call, or a timeout): etcd applied
/// all of it or none, so one linearizable read of a key it writes, with the value it wrote,
/// tells which, where a rebuild would read every key (600,000 at 100,000 nodes, seconds of
/// etcd's time, just when etcd is slow). Applied, the view takes it as if the answer had come
/// (counted granted as well as failed); not applied, the batch stays abandoned, and should it
/// still apply later, the watch brings it and etcd's compares refuse anything that would
/// collide with it meanwhile. `Ok(false)` if the read failed too: the caller rebuilds.
async fn resolve_lost<K: Kv>(
    kv: &K,
    keys: &Keys,
    shared: &Arc<Shared>,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
    batch: Vec<Proposal>,
) -> Result<bool, LeadError> {
    let probe = batch
        .first()
        .and_then(|proposal| proposal.puts(keys).ok())
        .and_then(|puts| puts.into_iter().next());
    let Some((key, written)) = probe else {
        return Ok(true);
    };
    let found = match kv.get(key.as_bytes()).await {
        Ok(found) => found,
        Err(_) => return Ok(false),
    };
    let Some(found) = found.filter(|found| found.value == written) else {
        return Ok(true);
    };
    with_view(shared, |view, _| {
        for proposal in &batch {
            tracing::info!(
                parent: &node_span(&proposal.node),
                revision = found.mod_revision,
                "granted (the answer was lost; read back from etcd)"
            );
            view.commit(proposal, found.mod_revision);
            shared.note_grant(TxnOutcome::Granted);
            shared.resolve("grant", proposal.node.as_str());
            work.solo.remove(&proposal.node);
            backoff(view, runner, &proposal.node, true);
        }
    })?;
    shared.observe_revision(0, found.mod_revision);
    Ok(true)
}

/// Waits for every transaction in flight, forgetting their proposals (the caller rebuilds or
/// stops).
async fn drain(runner: &mut Runner<NodeName, Done>, work: &mut Work, shared: &Shared) {
    runner
        .drain(|done| match done {
            Done::Grant { proposals, .. } => {
                shared.with_view_mut(|view, _| {
                    for proposal in &proposals {
                        view.abandon(proposal);
                    }
                });
            }
            Done::Blocks { done, .. } => {
                shared.with_view_mut(|view, _| {
                    let steps = done.ran.iter().map(|(step, ..)| step).chain(&done.not_run);
                    for step in steps {
                        if let block_state::BlockStep::Grant(proposal) = step {
                            view.abandon_blocks(proposal);
                        }
                    }
                });
            }
            _ => {}
        })
        .await;
    work.drain_wait.clear();
    work.rescan = true;
    work.block_rescan = true;
    if let Some(signal) = &work.cloud {
        // A new view: every cloud node is planned again.
        signal.all();
    }
    work.sync.all();
}

/// Starts transactions for the nodes that need one, up to the runner's `workers` in flight:
/// removals first (they free space others may wait for), then grants.
fn start_work<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    shared: &Arc<Shared>,
    view: &mut ClusterView,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
) {
    let now = Instant::now();
    let quarantine = Duration::from_secs(view.config().quarantine_secs.max(1));
    let removals = view.removals_requested();
    let removing: std::collections::HashSet<NodeName> =
        removals.iter().map(|(node, ..)| node.clone()).collect();
    for (node, request_revision, request) in removals {
        if runner.is_full() {
            return;
        }
        if !runner.is_due(&node, now) {
            continue;
        }
        let removal = view.removal(&node);
        let registration = view.registration(&node).map(|e| e.create_revision);
        let (kv, keys, fence) = (kv.clone(), keys.clone(), fence.clone());
        runner.spawn([node], async move {
            let outcome = remove(
                &kv,
                &keys,
                &fence,
                &removal,
                registration,
                request_revision,
                &request,
            )
            .await;
            Done::Removal {
                node: removal.node.clone(),
                outcome,
            }
        });
    }
    // Removed nodes' drains: what their agents gave up goes into quarantine, what they
    // still hold waits (`drain.rs`).
    for step in corral_cluster::removal_steps(view) {
        if runner.is_full() {
            return;
        }
        let node = step.node().clone();
        if !runner.is_due(&node, now) || work.drain_wait.contains_key(&node) {
            continue;
        }
        let (kv, keys, fence) = (kv.clone(), keys.clone(), fence.clone());
        runner.spawn([node], async move {
            let outcome = drain::carry_out(&kv, &keys, &fence, &step, quarantine).await;
            Done::Drain { step, outcome }
        });
    }
    // Grants agents refused (etcd handed back what they had given up): revoked, also while
    // granting waits, so each such node is granted anew once it may be.
    let mut refused: BTreeMap<NodeName, Vec<corral_cluster::Revocation>> = BTreeMap::new();
    for revocation in view.refused_grants() {
        refused
            .entry(revocation.node.clone())
            .or_default()
            .push(revocation);
    }
    for (node, mut revocations) in refused {
        if runner.is_full() {
            return;
        }
        if !runner.is_due(&node, now) || work.drain_wait.contains_key(&node) {
            continue;
        }
        // Five operations each, inside etcd's 128 per transaction.
        revocations.truncate(REVOCATIONS_PER_TXN);
        let (kv, keys, fence) = (kv.clone(), keys.clone(), fence.clone());
        runner.spawn([node], async move {
            let outcome = revoke::revoke(&kv, &keys, &fence, &revocations).await;
            Done::Revoke {
                revocations,
                outcome,
            }
        });
    }
    if !shared.may_grant(view) {
        // etcd went back in time, or a new term: nothing is granted until the live agents
        // asserted what they hold (`epoch.rs`); the pending nodes wait where they are.
        return;
    }
    if work.rescan {
        work.rescan = false;
        work.pending = view.nodes_needing_grants().into_iter().collect();
    }
    while !runner.is_full() {
        let Some(batch) = next_batch(view, runner, work, &removing, now) else {
            break;
        };
        let txn = match grant_txn(keys, view, &batch) {
            Ok(txn) => fence.guard(txn),
            Err(error) => {
                for proposal in &batch {
                    view.abandon(proposal);
                    shared.raise(
                        "grant",
                        proposal.node.to_string(),
                        format!("grant to {}: {error}", proposal.node),
                    );
                    backoff(view, runner, &proposal.node, false);
                }
                continue;
            }
        };
        let nodes: Vec<NodeName> = batch.iter().map(|p| p.node.clone()).collect();
        let kv = kv.clone();
        runner.spawn(nodes, async move {
            let started = Instant::now();
            let outcome = run(&kv, txn).await;
            Done::Grant {
                proposals: batch,
                outcome,
                took: started.elapsed(),
            }
        });
    }
    blocks::start_block_work(kv, keys, fence, view, runner, work, &removing);
}

/// The compares every grant transaction holds besides its nodes': the configuration's
/// revision (`grant_txn`) and the leader's fence (`Fence::guard`).
const GRANT_TXN_COMPARES: usize = 2;

/// The compares and puts of the grant transaction of `batch`, guarded by the fence.
fn grant_txn_size(batch: &[Proposal]) -> (usize, usize) {
    batch
        .iter()
        .map(Proposal::txn_size)
        .fold((GRANT_TXN_COMPARES, 0), |(c, p), (nc, np)| (c + nc, p + np))
}

/// Whether the grant transaction of `batch` holds more than etcd's default 128 compares or
/// puts.
fn past_etcds_default(batch: &[Proposal]) -> bool {
    let (compares, puts) = grant_txn_size(batch);
    compares.max(puts) > corral_kv::MAX_TXN_OPS
}

/// The next proposals to commit together: nodes of `pending` that may be tried now, up to
/// the transaction limits. A transaction's compares and puts are bounded by etcd's
/// `--max-txn-ops` (`Work::txn_ops`; 128 each by default), which cuts a batch (21 dual-stack
/// nodes at 128, 84 at 512); batching cuts the transactions a burst of registrations costs
/// (each a raft entry and a WAL fsync shared with whatever else is in flight). A node whose
/// last batch was refused goes alone (`solo`), so one stale proposal cannot keep refusing the
/// others.
fn next_batch(
    view: &mut ClusterView,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
    removing: &std::collections::HashSet<NodeName>,
    now: Instant,
) -> Option<Vec<Proposal>> {
    let mut batch: Vec<Proposal> = Vec::new();
    let (mut compares, mut puts) = (GRANT_TXN_COMPARES, 0);
    while let Some(node) = work.pending.first().cloned() {
        let solo = work.solo.contains(&node);
        if solo && !batch.is_empty() {
            break;
        }
        work.pending.pop_first();
        if !runner.is_due(&node, now) || removing.contains(&node) {
            // Looked at again when its transaction ends, its backoff timer fires or its
            // removal is done.
            continue;
        }
        let proposal = match view.propose_at(&node, Some(txn::wall_ms())) {
            Ok(proposal) => proposal,
            Err(ProposeError::Full { .. }) => {
                backoff(view, runner, &node, false);
                work.waiting_for_space.insert(node);
                continue;
            }
            Err(ProposeError::NodeIdsFull { .. }) => {
                backoff(view, runner, &node, false);
                work.waiting_for_space.insert(node);
                continue;
            }
            Err(ProposeError::NothingNeeded { .. } | ProposeError::InFlight { .. }) => continue,
            Err(ProposeError::UnknownNode { .. }) => {
                // Gone since it was queued (removed): nothing to retry.
                runner.forget(&node);
                continue;
            }
        };
        let (node_compares, node_puts) = proposal.txn_size();
        if !batch.is_empty()
            && (compares + node_compares > work.txn_ops || puts + node_puts > work.txn_ops)
        {
            // Next time, first in its own batch.
            view.abandon(&proposal);
            work.pending.insert(node);
            break;
        }
        compares += node_compares;
        puts += node_puts;
        batch.push(proposal);
        if solo {
            break;
        }
    }
    (!batch.is_empty()).then_some(batch)
}

/// Applies a finished transaction to the view; true if its outcome is unknown.
fn finish(
    view: &mut ClusterView,
    shared: &Arc<Shared>,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
    done: Done,
) -> bool {
    match done {
        Done::Grant {
            proposals,
            outcome,
            took,
        } => {
            shared.note_txn(took);
            match outcome {
                Ok(revision) => {
                    // What the transaction wrote is in the view at once (the watch repeats
                    // it later, which changes nothing), so the next proposal builds on it.
                    for proposal in &proposals {
                        let _span = node_span(&proposal.node).entered();
                        for cidr in &proposal.cidrs {
                            tracing::info!(
                                pool = %cidr.pool,
                                family = %cidr.family,
                                cidr = %cidr.cidr,
                                revision,
                                "granted"
                            );
                        }
                        if let Some(node_id) = proposal.node_id {
                            tracing::info!(node_id, revision, "granted a node ID");
                        }
                        view.commit(proposal, revision);
                        shared.note_grant(TxnOutcome::Granted);
                        shared.resolve("grant", proposal.node.as_str());
                        work.solo.remove(&proposal.node);
                        backoff(view, runner, &proposal.node, true);
                    }
                    // Only advances (answers of concurrent transactions and the watch
                    // arrive in any order): the header read every few seconds judges.
                    shared.observe_revision(0, revision);
                    false
                }
                Err(TxnFailure::Refused) if proposals.len() > 1 => {
                    // Some proposal of the batch was stale: each goes again on its own, at
                    // once, and only the stale one backs off.
                    for proposal in &proposals {
                        view.abandon(proposal);
                        work.solo.insert(proposal.node.clone());
                        work.pending.insert(proposal.node.clone());
                    }
                    shared.note_grant(TxnOutcome::Conflict);
                    false
                }
                Err(TxnFailure::Refused) => {
                    for proposal in &proposals {
                        view.abandon(proposal);
                        work.solo.remove(&proposal.node);
                        shared.note_grant(TxnOutcome::Conflict);
                        backoff(view, runner, &proposal.node, false);
                    }
                    false
                }
                Err(TxnFailure::Uncertain(KvError::TooManyOps(message)))
                    if past_etcds_default(&proposals) =>
                {
                    // etcd takes fewer operations than `--max-txn-ops` said: not applied (a
                    // refused request), so the nodes go again at once, in batches of etcd's
                    // default limit (as do those of the other batches in flight when their
                    // refusals come), and the mismatch is shown until the next term.
                    if work.txn_ops > corral_kv::MAX_TXN_OPS {
                        let said = work.txn_ops;
                        work.txn_ops = corral_kv::MAX_TXN_OPS;
                        shared.raise(
                            "grant",
                            "max-txn-ops".to_owned(),
                            format!(
                                "etcd refused a grant transaction of up to {said} operations \
                                 ({message}): --max-txn-ops is above etcd's own; granting in \
                                 transactions of {} until the next term",
                                corral_kv::MAX_TXN_OPS
                            ),
                        );
                    }
                    for proposal in &proposals {
                        view.abandon(proposal);
                        work.pending.insert(proposal.node.clone());
                    }
                    shared.note_grant(TxnOutcome::Failed);
                    false
                }
                Err(TxnFailure::Uncertain(error)) => {
                    for proposal in &proposals {
                        view.abandon(proposal);
                        shared.note_grant(TxnOutcome::Failed);
                        shared.raise(
                            "grant",
                            proposal.node.to_string(),
                            format!("grant to {}: {error}", proposal.node),
                        );
                        backoff(view, runner, &proposal.node, false);
                    }
                    // Whether etcd applied it is read before anything else is proposed.
                    work.lost.push(proposals);
                    false
                }
            }
        }
        Done::Removal { node, outcome } => match outcome {
            Ok(revision) => {
                tracing::info!(
                    parent: &node_span(&node),
                    revision,
                    "removed; what it held waits until its agent gives it up (or it shows no \
                     liveness for the quarantine time)"
                );
                shared.resolve("removal", node.as_str());
                work.drain_wait.insert(node.clone(), revision);
                runner.forget(&node);
                work.block_pending.insert(node.clone());
                work.pending.insert(node);
                false
            }
            Err(TxnFailure::Refused) => {
                backoff(view, runner, &node, false);
                false
            }
            Err(TxnFailure::Uncertain(error)) => {
                shared.raise(
                    "removal",
                    node.to_string(),
                    format!("removal of {node}: {error}"),
                );
                backoff(view, runner, &node, false);
                true
            }
        },
        Done::Drain { step, outcome } => {
            if outcome.is_ok()
                && let Some(text) = drain::describe(&step)
            {
                tracing::info!(parent: &node_span(step.node()), "{text}");
            }
            let node = step.node().clone();
            finish_step(
                view,
                shared,
                runner,
                work,
                &node,
                outcome,
                "drain of removed node",
            )
        }
        Done::Revoke {
            revocations,
            outcome,
        } => {
            let Some(node) = revocations.first().map(|r| r.node.clone()) else {
                return false;
            };
            if outcome.is_ok() {
                shared.note_problem(revoke::describe(&revocations));
            }
            finish_step(
                view,
                shared,
                runner,
                work,
                &node,
                outcome,
                "revoking the refused grants of node",
            )
        }
        Done::Blocks { node, done } => {
            blocks::finish_blocks(view, shared, runner, work, node, done)
        }
    }
}

/// One transaction about `node` done (a drain step, a revocation): on success the node waits
/// until the watch delivered it; answers whether the store may or may not have applied it.
fn finish_step(
    view: &ClusterView,
    shared: &Shared,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
    node: &NodeName,
    outcome: Result<Revision, TxnFailure>,
    what: &str,
) -> bool {
    match outcome {
        Ok(revision) => {
            shared.resolve("step", &format!("{what} {node}"));
            work.drain_wait.insert(node.clone(), revision);
            backoff(view, runner, node, true);
            false
        }
        Err(TxnFailure::Refused) => {
            backoff(view, runner, node, false);
            false
        }
        Err(TxnFailure::Uncertain(error)) => {
            shared.raise(
                "step",
                format!("{what} {node}"),
                format!("{what} {node}: {error}"),
            );
            backoff(view, runner, node, false);
            true
        }
    }
}

/// The grants of a batch as one transaction: for each node every key it creates compared
/// absent (its `grants/` and `quarantine/` keys, and its `owned/<node>/<pool>/<family>/`
/// prefix empty, which covers the `owned/` key and any second CIDR of a pool and family; one
/// `owned/<node>/<pool>/` for a pool the node held nothing of),
/// its registration unchanged (a node removed and registered again gets nothing meant for
/// the old one); for the batch, the configuration unchanged. So a stale view never grants
/// twice, and a batch is all or nothing.
fn grant_txn(
    keys: &Keys,
    view: &ClusterView,
    batch: &[Proposal],
) -> Result<Txn, corral_cluster::ValueError> {
    let mut txn = Txn::default();
    txn.compares
        .push(Compare::modified_at(keys.config(), view.config_revision()));
    for proposal in batch {
        txn.compares.push(Compare::created_at(
            proposal.registration_key(keys),
            proposal.node_revision,
        ));
        let prefixes = proposal.absent_prefixes(keys);
        for key in proposal.absent_keys(keys) {
            if !prefixes
                .iter()
                .any(|prefix| key.starts_with(prefix.as_str()))
            {
                txn.compares.push(Compare::absent(key));
            }
        }
        for prefix in prefixes {
            txn.compares.push(Compare::prefix_empty(prefix));
        }
        for (key, value) in proposal.puts(keys)? {
            txn.success.push(TxnOp::put(key, value));
        }
    }
    // `next_batch` sized the batch by `Proposal::txn_size`: the two must agree, or etcd
    // refuses a full batch (the fence's compare comes with `Fence::guard`).
    debug_assert_eq!(
        (txn.compares.len() + 1, txn.success.len()),
        grant_txn_size(batch),
    );
    Ok(txn)
}

/// Removes a node: its registration, grants and node ID go, and what it held waits for its
/// agent (quarantine keys in state `waiting`, not on a lease: nothing is proposed there, and
/// the quarantine begins only when the agent gave it up or the node was proven gone:
/// `drain.rs`); the request stays as the removal's record, in phase `draining`. The request
/// names the registration it is about: a node registered again since is not removed by it
/// (the request is dropped).
async fn remove<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    removal: &Removal,
    registration: Option<Revision>,
    request_revision: Revision,
    request: &RemovalRecord,
) -> Result<Revision, TxnFailure> {
    let request_key = keys.removal(&removal.node);
    let mut txn = Txn::default();
    txn.compares
        .push(Compare::modified_at(request_key.clone(), request_revision));
    if registration != Some(request.node_revision) {
        // Not the registration the request was about (gone already, or a new one): only the
        // request goes (waiting keys of an earlier removal get their record back: `drain.rs`).
        txn.success.push(TxnOp::delete(request_key));
        return run(kv, fence.guard(txn)).await;
    }
    txn.compares.push(Compare::created_at(
        removal.node_key.clone(),
        request.node_revision,
    ));
    let mut removal = removal.clone();
    let now_ms = txn::wall_ms();
    // Each grant's end goes into the transaction that deletes it (three keys each).
    let history = |grant: &corral_cluster::RemovedGrant| {
        corral_cluster::history::puts(keys, &grant.ending.ended(now_ms, GrantEnd::NodeRemoved))
            .map_err(|e| TxnFailure::Uncertain(KvError::Refused(e.to_string())))
    };
    let value = encode_value(&removal.quarantine_record("node removed", now_ms))
        .map_err(|e| TxnFailure::Uncertain(KvError::Refused(e.to_string())))?;
    let record = encode_value(&RemovalRecord {
        phase: corral_cluster::RemovalPhase::Draining,
        ..request.clone()
    })
    .map_err(|e| TxnFailure::Uncertain(KvError::Refused(e.to_string())))?;
    // A node of block pools may hold more blocks than one transaction can delete and
    // quarantine (etcd's 128 operations): its blocks go first, in chunks, each under the same
    // compares (the request and the registration unchanged), then the rest in the last one.
    while !removal.grants.is_empty()
        && removal.deletes().len() + removal.quarantines().len() + 3 * removal.grants.len() + 1
            > corral_kv::MAX_TXN_OPS
    {
        let n = removal.grants.len().min(REMOVAL_CHUNK);
        let chunk: Vec<_> = removal.grants.drain(..n).collect();
        let mut part = Txn {
            compares: txn.compares.clone(),
            ..Txn::default()
        };
        for grant in &chunk {
            let c = &grant.cidr;
            let owned = keys.owned(&removal.node, &c.pool, c.family, &c.cidr);
            let release = keys.release(&removal.node, &c.pool, c.family, &c.cidr);
            removal.owned_keys.retain(|k| *k != owned);
            let had_release = removal.block_keys.contains(&release);
            removal.block_keys.retain(|k| *k != release);
            part.compares
                .push(Compare::absent(grant.quarantine_key.clone()));
            part.success.push(TxnOp::delete(grant.grant_key.clone()));
            part.success.push(TxnOp::delete(owned));
            if had_release {
                part.success.push(TxnOp::delete(release));
            }
            part.success
                .push(TxnOp::put(grant.quarantine_key.clone(), value.clone()));
            for (key, value) in history(grant)? {
                part.success.push(TxnOp::put(key, value));
            }
        }
        run(kv, fence.guard(part)).await?;
    }
    let quarantines = removal.quarantines();
    for grant in &removal.grants {
        for (key, value) in history(grant)? {
            txn.success.push(TxnOp::put(key, value));
        }
    }
    for key in removal.deletes() {
        txn.success.push(TxnOp::delete(key));
    }
    for key in quarantines {
        txn.compares.push(Compare::absent(key.clone()));
        txn.success.push(TxnOp::put(key, value.clone()));
    }
    txn.success.push(TxnOp::put(request_key, record));
    run(kv, fence.guard(txn)).await
}

/// Grants a removal quarantines per transaction when one transaction cannot hold them all
/// (block pools): 18 grants take at most 126 operations (4 keys and 3 history keys each) and
/// 20 compares, inside etcd's 128.
const REMOVAL_CHUNK: usize = 18;
