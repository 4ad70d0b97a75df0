//! What the leading replica does: rebuild the cluster view from one read of the prefix, keep
//! it current from a watch, and turn the view's proposals into fenced transactions (grants to
//! registered nodes, removals asked for by `corral node remove`).
//!
//! The loop owns the view; transactions run concurrently (up to `workers` at once) and their
//! outcomes come back to the loop, which applies them. A proposal marks what it proposes as
//! in flight in the view, so two concurrent proposals never name the same CIDR or node ID;
//! and etcd decides anyway: every grant transaction compares every key it creates absent, the
//! node's registration unchanged, the configuration unchanged, and the fence.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use corral_cluster::{ClusterView, Keys, Proposal, ProposeError, Resync};
use corral_kv::{Compare, Event, Kv, KvError, LeaseId, Revision, Txn, TxnOp};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::election::Fence;
use crate::state::{Shared, TxnOutcome};

/// Keys per page when the prefix is read.
const PAGE: usize = 2000;

/// Why leading ended.
#[derive(Debug, thiserror::Error)]
pub enum LeadError {
    #[error("leadership lost")]
    Lost,
    #[error("cluster store: {0}")]
    Kv(#[from] KvError),
}

/// What a finished transaction tells the loop.
enum Done {
    Grant {
        proposal: Proposal,
        outcome: Result<Revision, TxnFailure>,
        took: Duration,
    },
    Removal {
        node: String,
        outcome: Result<Revision, TxnFailure>,
    },
}

enum TxnFailure {
    /// A compare failed: the view was stale (or the fence is gone).
    Refused,
    /// The store failed; the transaction may or may not have been applied.
    Uncertain(KvError),
}

/// Leads until the lease is lost or `stop` fires.
pub async fn lead<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    lost: &mut tokio::sync::watch::Receiver<bool>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    shared: &Arc<Shared>,
    workers: usize,
) -> Result<(), LeadError> {
    let started = Instant::now();
    let (mut view, mut revision) = rebuild(kv, keys, shared).await?;
    shared.set_leading(true, started.elapsed());
    let result = serve(kv, keys, fence, lost, stop, shared, workers, &mut view, &mut revision).await;
    shared.set_leading(false, Duration::ZERO);
    result
}

/// Reads the whole prefix at one revision and builds the view from it.
async fn rebuild<K: Kv>(
    kv: &K,
    keys: &Keys,
    shared: &Arc<Shared>,
) -> Result<(ClusterView, Revision), LeadError> {
    let started = Instant::now();
    let (all, revision) = corral_kv::read_all(kv, keys.prefix().as_bytes(), PAGE).await?;
    let mut view = ClusterView::new(keys.clone());
    for entry in &all {
        view.apply_put(
            &entry.key_str(),
            &entry.value,
            entry.create_revision,
            entry.mod_revision,
        );
    }
    shared.publish(&view, revision);
    shared.note_rebuild(all.len(), started.elapsed());
    Ok((view, revision))
}

#[allow(clippy::too_many_arguments)]
async fn serve<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    lost: &mut tokio::sync::watch::Receiver<bool>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    shared: &Arc<Shared>,
    workers: usize,
    view: &mut ClusterView,
    revision: &mut Revision,
) -> Result<(), LeadError> {
    let mut watch = kv.watch(keys.prefix().as_bytes(), *revision + 1).await?;
    let mut running: JoinSet<Done> = JoinSet::new();
    // Nodes being served (a grant or a removal in flight): never two at once for one node.
    let mut busy: std::collections::HashSet<String> = Default::default();
    // Per node: when to try again, and the backoff behind it.
    let mut retry: HashMap<String, (Instant, Resync)> = HashMap::new();
    let mut dirty = true;
    loop {
        if *lost.borrow() {
            return Err(LeadError::Lost);
        }
        if dirty {
            dirty = false;
            start_work(
                kv, keys, fence, shared, workers, view, &mut running, &mut busy, &mut retry,
            );
            shared.publish(view, *revision);
        }
        let next_retry = retry
            .values()
            .map(|(at, _)| *at)
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            batch = watch.next() => {
                match batch {
                    Ok(events) => {
                        for event in events {
                            *revision = (*revision).max(event.revision());
                            apply_event(view, &event);
                        }
                        dirty = true;
                    }
                    Err(KvError::Compacted { .. }) => {
                        // The watch fell behind the store's history: read everything again.
                        drain(&mut running, view, &mut busy).await;
                        let (fresh, at) = rebuild(kv, keys, shared).await?;
                        *view = fresh;
                        *revision = at;
                        watch = kv.watch(keys.prefix().as_bytes(), at + 1).await?;
                        dirty = true;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            Some(done) = running.join_next(), if !running.is_empty() => {
                let Ok(done) = done else { continue };
                let uncertain = finish(view, shared, &mut busy, &mut retry, done);
                if uncertain {
                    // The store may or may not have applied it: the view is rebuilt from what
                    // the store holds before anything else is proposed.
                    drain(&mut running, view, &mut busy).await;
                    let (fresh, at) = rebuild(kv, keys, shared).await?;
                    *view = fresh;
                    *revision = at;
                    watch = kv.watch(keys.prefix().as_bytes(), at + 1).await?;
                }
                dirty = true;
            }
            _ = tokio::time::sleep_until(next_retry) => {
                dirty = true;
            }
            _ = lost.changed() => return Err(LeadError::Lost),
            _ = stop.changed() => {
                drain(&mut running, view, &mut busy).await;
                return Ok(());
            }
        }
    }
}

fn apply_event(view: &mut ClusterView, event: &Event) {
    match event {
        Event::Put(kv) => {
            view.apply_put(&kv.key_str(), &kv.value, kv.create_revision, kv.mod_revision)
        }
        Event::Delete { key, .. } => view.apply_delete(&String::from_utf8_lossy(key)),
    }
}

/// Waits for every transaction in flight, forgetting their proposals (the caller rebuilds or
/// stops).
async fn drain(running: &mut JoinSet<Done>, view: &mut ClusterView, busy: &mut std::collections::HashSet<String>) {
    while let Some(done) = running.join_next().await {
        if let Ok(Done::Grant { proposal, .. }) = done {
            view.abandon(&proposal);
        }
    }
    busy.clear();
}

/// Starts transactions for the nodes that need one, the most urgent first, up to `workers`
/// in flight.
#[allow(clippy::too_many_arguments)]
fn start_work<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    shared: &Arc<Shared>,
    workers: usize,
    view: &mut ClusterView,
    running: &mut JoinSet<Done>,
    busy: &mut std::collections::HashSet<String>,
    retry: &mut HashMap<String, (Instant, Resync)>,
) {
    let now = Instant::now();
    // Removals first: they free space others may be waiting for.
    for node in view.removals_requested() {
        if running.len() >= workers {
            return;
        }
        if busy.contains(&node) || retry.get(&node).is_some_and(|(at, _)| *at > now) {
            continue;
        }
        let removal = view.removal(&node);
        busy.insert(node.clone());
        let kv = kv.clone();
        let fence = fence.clone();
        let keys = keys.clone();
        let quarantine = view.config().map(|c| c.quarantine()).unwrap_or(Duration::from_secs(300));
        running.spawn(async move {
            let outcome = remove(&kv, &keys, &fence, &removal, quarantine).await;
            Done::Removal { node: removal.node.clone(), outcome }
        });
    }
    for node in view.nodes_needing_grants() {
        if running.len() >= workers {
            return;
        }
        if busy.contains(&node) || retry.get(&node).is_some_and(|(at, _)| *at > now) {
            continue;
        }
        let proposal = match view.propose(&node) {
            Ok(proposal) => proposal,
            Err(ProposeError::Full { pool, family }) => {
                shared.note_full(&node, &pool, family);
                backoff(view, retry, &node, false);
                continue;
            }
            Err(other) => {
                shared.note_problem(format!("node {node}: {other}"));
                backoff(view, retry, &node, false);
                continue;
            }
        };
        busy.insert(node.clone());
        let txn = fence.guard(grant_txn(keys, view, &proposal));
        let kv = kv.clone();
        running.spawn(async move {
            let started = Instant::now();
            let outcome = run(&kv, txn).await;
            Done::Grant { proposal, outcome, took: started.elapsed() }
        });
    }
}

/// Applies a finished transaction to the view; true if its outcome is unknown.
fn finish(
    view: &mut ClusterView,
    shared: &Arc<Shared>,
    busy: &mut std::collections::HashSet<String>,
    retry: &mut HashMap<String, (Instant, Resync)>,
    done: Done,
) -> bool {
    match done {
        Done::Grant { proposal, outcome, took } => {
            busy.remove(&proposal.node);
            shared.note_txn(took);
            match outcome {
                Ok(revision) => {
                    // What the transaction wrote is in the view at once (the watch repeats
                    // it later, which changes nothing), so the next proposal builds on it.
                    view.commit(&proposal, revision);
                    shared.note_grant(TxnOutcome::Granted);
                    backoff(view, retry, &proposal.node, true);
                    false
                }
                Err(TxnFailure::Refused) => {
                    view.abandon(&proposal);
                    shared.note_grant(TxnOutcome::Conflict);
                    backoff(view, retry, &proposal.node, false);
                    false
                }
                Err(TxnFailure::Uncertain(error)) => {
                    view.abandon(&proposal);
                    shared.note_grant(TxnOutcome::Failed);
                    shared.note_problem(format!("grant to {}: {error}", proposal.node));
                    backoff(view, retry, &proposal.node, false);
                    true
                }
            }
        }
        Done::Removal { node, outcome } => {
            busy.remove(&node);
            match outcome {
                Ok(_) => {
                    retry.remove(&node);
                    false
                }
                Err(TxnFailure::Refused) => {
                    backoff(view, retry, &node, false);
                    false
                }
                Err(TxnFailure::Uncertain(error)) => {
                    shared.note_problem(format!("removal of {node}: {error}"));
                    backoff(view, retry, &node, false);
                    true
                }
            }
        }
    }
}

/// Records a node's attempt: after a success the node is looked at again a resync period
/// later (nothing happens unless it needs something); after failures, nodeipam's backoff.
fn backoff(
    view: &ClusterView,
    retry: &mut HashMap<String, (Instant, Resync)>,
    node: &str,
    success: bool,
) {
    let timing = view.config().map(|c| c.resync()).unwrap_or_default();
    let entry = retry
        .entry(node.to_owned())
        .or_insert_with(|| (Instant::now(), Resync::new(timing)));
    let wait = if success {
        entry.1.success()
    } else {
        entry.1.failure()
    };
    if success {
        // A granted node needs nothing until something changes; it is not held back.
        retry.remove(node);
    } else {
        entry.0 = Instant::now() + wait;
    }
}

/// The grant as one transaction: every key it creates compared absent (so a stale view never
/// grants twice), every quarantine key of what it grants absent, the node's registration
/// unchanged, the configuration unchanged.
fn grant_txn(keys: &Keys, view: &ClusterView, proposal: &Proposal) -> Txn {
    let mut txn = Txn::default();
    txn.compares
        .push(Compare::created_at(keys.node(&proposal.node), proposal.node_revision));
    if let Some(config_revision) = view.config_revision() {
        txn.compares
            .push(Compare::modified_at(keys.config(), config_revision));
    }
    for (key, value) in proposal.puts(keys) {
        txn.compares.push(Compare::absent(key.clone()));
        txn.success.push(TxnOp::put(key, value));
    }
    for key in proposal.must_be_absent(keys) {
        txn.compares.push(Compare::absent(key));
    }
    txn
}

async fn run<K: Kv>(kv: &K, txn: Txn) -> Result<Revision, TxnFailure> {
    match kv.txn(txn).await {
        Ok(response) if response.succeeded => Ok(response.revision),
        Ok(_) => Err(TxnFailure::Refused),
        Err(error) => Err(TxnFailure::Uncertain(error)),
    }
}

/// Removes a node: its registration, grants and node ID go, and what it held is quarantined
/// (keys on a lease of the quarantine time: etcd deletes them when it runs out).
async fn remove<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    removal: &corral_cluster::Removal,
    quarantine: Duration,
) -> Result<Revision, TxnFailure> {
    let lease: Option<LeaseId> = if removal.quarantine.is_empty() {
        None
    } else {
        Some(
            kv.lease_grant(quarantine)
                .await
                .map_err(TxnFailure::Uncertain)?,
        )
    };
    let mut txn = Txn::default();
    txn.compares.push(Compare::modified_at(
        keys.removal(&removal.node),
        removal.request_revision,
    ));
    for (key, revision) in &removal.delete {
        txn.compares.push(Compare::modified_at(key.clone(), *revision));
        txn.success.push(TxnOp::delete(key.clone()));
    }
    for (key, value) in &removal.quarantine {
        txn.compares.push(Compare::absent(key.clone()));
        txn.success
            .push(TxnOp::put_on_lease(key.clone(), value.clone(), lease.expect("lease granted above")));
    }
    txn.success.push(TxnOp::delete(keys.removal(&removal.node)));
    let outcome = run(kv, fence.guard(txn)).await;
    if outcome.is_err() {
        if let Some(lease) = lease {
            let _ = kv.lease_revoke(lease).await;
        }
    }
    outcome
}
