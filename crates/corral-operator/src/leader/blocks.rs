//! The node manager of block-mode pools, in the leading loop: per node, pool and family it runs
//! `corral_cluster::blocks::plan` and carries the plan out as fenced transactions, one node at
//! a time per transaction, nodes in order of need (largest deficit first, releases last:
//! Cilium's `GetNodesByIPWatermarkLocked`).
//!
//! A node's steps run in one task, one transaction after the other (un-marks and forgotten
//! refusals, then at most one grant of up to 25 blocks in the first pool and family that needs
//! blocks and has a free one, then completed releases, then marks);
//! the first refused or failed step ends the task, and the node is planned again from the
//! view. The leader's own memory here (first sight of each block, since when a node is in
//! excess, wake-ups) is lost on a leader change: a new leader starts the clocks again, which
//! only delays releases.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use corral_cluster::blocks::{self, BlockPlan};
use corral_cluster::{
    BlockProposal, ClusterView, Condition, Family, IpNet, Keys, NodeName, PoolName, ProposeError,
    ReleaseChange, ReleaseKind,
};
use corral_kv::{Compare, Kv, KvError, LeaseId, Revision, Txn, TxnOp};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::block_state::{BlockClock, BlockStep, StepsDone};
use super::runner::Runner;
use super::txn::{TxnFailure, run, wall_ms};
use super::work::{Done, Work, backoff, node_span};
use crate::election::Fence;
use crate::state::{Shared, TxnOutcome};

/// A node's plans in every block pool and family, with what they ask for.
struct NodePlans {
    node: NodeName,
    plans: Vec<(PoolName, Family, BlockPlan)>,
    stale: Vec<(PoolName, Family, IpNet)>,
}

impl NodePlans {
    fn is_idle(&self) -> bool {
        self.stale.is_empty() && self.plans.iter().all(|(_, _, p)| p.is_idle())
    }

    /// Where the node goes in line: growing nodes first by deficit (largest first), then
    /// handshakes to end or complete, releases (marks) last.
    fn order(&self) -> (u8, std::cmp::Reverse<u64>) {
        let deficit: u64 = self
            .plans
            .iter()
            .filter(|(_, _, p)| p.grant > 0)
            .fold(0u64, |sum, (_, _, p)| {
                sum.saturating_add(p.stats.needed.max(1))
            });
        if deficit > 0 {
            return (0, std::cmp::Reverse(deficit));
        }
        let releasing_only =
            self.plans.iter().all(|(_, _, p)| {
                p.unmark.is_empty() && p.forget.is_empty() && p.complete.is_empty()
            }) && self.stale.is_empty();
        (if releasing_only { 2 } else { 1 }, std::cmp::Reverse(0))
    }
}

/// Plans one node in every block pool and family, updating the leader's clocks.
fn plan_node(view: &ClusterView, clock: &mut BlockClock, node: &NodeName) -> NodePlans {
    let now = clock.now_ms();
    let mut plans = Vec::new();
    let mut wake: Option<u64> = None;
    for (pool, family) in view.block_pool_families() {
        let triple = (node.clone(), pool.clone(), family);
        let old_seen = clock.seen.remove(&triple).unwrap_or_default();
        let mut seen = BTreeMap::new();
        let held = view.held_blocks(node, &pool, family, |cidr| {
            let at = old_seen.get(cidr).copied().unwrap_or(now);
            seen.insert(*cidr, at);
            at
        });
        if !seen.is_empty() {
            clock.seen.insert(triple.clone(), seen);
        }
        let since = clock.excess_since.get(&triple).copied();
        let Some(input) = view.block_input(node, &pool, family, &held, since, now) else {
            continue;
        };
        let plan = blocks::plan(&input);
        match plan.excess_since_ms {
            Some(at) => {
                clock.excess_since.insert(triple, at);
                // Marks wait for the release delay of the excess and of each block's first
                // sight: wake up when the next of those runs out.
                let delay = input.release_delay_ms;
                let candidates = std::iter::once(at.saturating_add(delay)).chain(
                    held.iter()
                        .filter(|b| b.release.is_none())
                        .map(|b| b.seen_ms.saturating_add(delay)),
                );
                if let Some(t) = candidates.filter(|t| *t > now).min() {
                    wake = Some(wake.map_or(t, |w| w.min(t)));
                }
            }
            None => {
                clock.excess_since.remove(&triple);
            }
        }
        plans.push((pool, family, plan));
    }
    match wake {
        Some(t) => {
            clock.wake.insert(node.clone(), t);
        }
        None => {
            clock.wake.remove(node);
        }
    }
    NodePlans {
        node: node.clone(),
        plans,
        // Release keys of cloud pools name addresses of cloud interfaces, not grants: the
        // cloud node manager keeps them.
        stale: view
            .stale_releases(node)
            .into_iter()
            .filter(|(pool, ..)| view.is_block_pool(pool))
            .collect(),
    }
}

/// The steps of a node's plans: un-marks, forgotten refusals and stale release keys, at most
/// one grant (the first pool and family that needs blocks and has space; the rest next
/// time), completes, marks. When every pool it needs blocks of is full the node backs off
/// (why it waits is the view's to say: `waits`).
fn steps(
    view: &mut ClusterView,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
    plans: &NodePlans,
) -> Vec<BlockStep> {
    let node = &plans.node;
    let now = wall_ms();
    let mut out = Vec::new();
    let push = |view: &ClusterView, out: &mut Vec<BlockStep>, kind, pool, family, cidr| {
        if let Some(change) = view.release_change(kind, node, pool, family, cidr, now) {
            out.push(BlockStep::Release(change));
        }
    };
    for (pool, family, cidr) in &plans.stale {
        push(view, &mut out, ReleaseKind::Forget, pool, *family, cidr);
    }
    for (pool, family, plan) in &plans.plans {
        for cidr in &plan.unmark {
            push(view, &mut out, ReleaseKind::Unmark, pool, *family, cidr);
        }
        for cidr in &plan.forget {
            push(view, &mut out, ReleaseKind::Forget, pool, *family, cidr);
        }
    }
    // One grant per turn (the view holds one block proposal in flight per node): the first
    // pool and family, in the view's order, that needs blocks and has a free one. A full one
    // is passed over, so it never starves the others; the node backs off only when nothing
    // it needs can be granted.
    let mut all_full = false;
    for (pool, family, plan) in plans.plans.iter().filter(|(_, _, p)| p.grant > 0) {
        let n = usize::try_from(plan.grant).unwrap_or(usize::MAX);
        match view.propose_blocks_at(node, pool, *family, n, Some(now)) {
            Err(ProposeError::Full { .. }) => {
                // Planned again when space is freed.
                work.waiting_for_space.insert(node.clone());
                all_full = true;
                continue;
            }
            Ok(proposal) => {
                if proposal.blocks.len() < n.min(corral_cluster::view::MAX_BLOCKS_PER_TXN) {
                    work.waiting_for_space.insert(node.clone());
                }
                out.push(BlockStep::Grant(proposal));
            }
            Err(_) => {}
        }
        all_full = false;
        break;
    }
    if all_full {
        backoff(view, runner, node, false);
    }
    for (pool, family, plan) in &plans.plans {
        for cidr in &plan.complete {
            push(view, &mut out, ReleaseKind::Complete, pool, *family, cidr);
        }
        for cidr in &plan.mark {
            push(view, &mut out, ReleaseKind::Mark, pool, *family, cidr);
        }
    }
    out
}

/// Plans the nodes of `work.block_pending` and starts a task for each that has something to
/// do, in order of need, while the runner has room. Nodes not started stay
/// pending.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_block_work<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    view: &mut ClusterView,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
    removing: &std::collections::HashSet<NodeName>,
) {
    if !view.has_block_pools() {
        work.block_pending.clear();
        return;
    }
    if work.block_rescan {
        work.block_rescan = false;
        work.block_pending.extend(view.block_nodes());
    }
    if work.block_pending.is_empty() || runner.is_full() {
        return;
    }
    let now = Instant::now();
    let mut planned: Vec<NodePlans> = Vec::new();
    for node in std::mem::take(&mut work.block_pending) {
        if view.registration(&node).is_none() {
            work.clock.forget_node(&node);
            continue;
        }
        if removing.contains(&node) || !runner.is_due(&node, now) {
            // Planned again when its task ends, its backoff runs out or its removal is done.
            continue;
        }
        let plans = plan_node(view, &mut work.clock, &node);
        if !plans.is_idle() {
            planned.push(plans);
        }
    }
    planned.sort_by_key(NodePlans::order);
    let quarantine = Duration::from_secs(view.config().quarantine_secs.max(1));
    let mut rest = planned.into_iter();
    for plans in rest.by_ref() {
        if runner.is_full() {
            work.block_pending.insert(plans.node);
            break;
        }
        let node = plans.node.clone();
        let steps = steps(view, runner, work, &plans);
        if steps.is_empty() {
            continue;
        }
        let (kv, keys, fence) = (kv.clone(), keys.clone(), fence.clone());
        runner.spawn([node.clone()], async move {
            let done = run_steps(&kv, &keys, &fence, steps, quarantine).await;
            Done::Blocks { node, done }
        });
    }
    for plans in rest {
        work.block_pending.insert(plans.node);
    }
}

async fn run_steps<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    steps: Vec<BlockStep>,
    quarantine: Duration,
) -> StepsDone {
    let mut done = StepsDone {
        ran: Vec::new(),
        not_run: Vec::new(),
    };
    let mut steps = steps.into_iter();
    for step in steps.by_ref() {
        let started = Instant::now();
        let outcome = match &step {
            BlockStep::Grant(proposal) => {
                let span = tracing::info_span!(
                    "grant",
                    pool = %proposal.pool,
                    family = %proposal.family,
                    blocks = proposal.blocks.len()
                );
                async {
                    match grant_txn(keys, proposal) {
                        Ok(txn) => run(kv, fence.guard(txn)).await,
                        Err(error) => {
                            Err(TxnFailure::Uncertain(KvError::Refused(error.to_string())))
                        }
                    }
                }
                .instrument(span)
                .await
            }
            BlockStep::Release(change) => {
                let span = tracing::info_span!(
                    "release",
                    step = change.kind.name(),
                    pool = %change.pool,
                    cidr = %change.cidr
                );
                release(kv, fence, change, quarantine)
                    .instrument(span)
                    .await
            }
        };
        tracing::debug!(
            ok = outcome.is_ok(),
            took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "step ran"
        );
        let failed = outcome.is_err();
        done.ran.push((step, outcome, started.elapsed()));
        if failed {
            break;
        }
    }
    done.not_run.extend(steps);
    done
}

fn compare(condition: &Condition) -> Compare {
    match condition {
        Condition::Absent(key) => Compare::absent(key.clone()),
        Condition::CreatedAt(key, revision) => Compare::created_at(key.clone(), *revision),
        Condition::ModifiedAt(key, revision) => Compare::modified_at(key.clone(), *revision),
    }
}

fn grant_txn(keys: &Keys, proposal: &BlockProposal) -> Result<Txn, corral_cluster::ValueError> {
    let mut txn = Txn::default();
    txn.compares
        .extend(proposal.conditions(keys).iter().map(compare));
    for (key, value) in proposal.puts(keys)? {
        txn.success.push(TxnOp::put(key, value));
    }
    Ok(txn)
}

/// One step of a release handshake; a completion puts the quarantine key on a lease of the
/// quarantine time (revoked only if the txn was refused, as a removal's).
async fn release<K: Kv>(
    kv: &K,
    fence: &Fence,
    change: &ReleaseChange,
    quarantine: Duration,
) -> Result<Revision, TxnFailure> {
    let mut txn = Txn::default();
    txn.compares.extend(change.conditions.iter().map(compare));
    for key in &change.deletes {
        txn.success.push(TxnOp::delete(key.clone()));
    }
    for (key, value) in &change.puts {
        txn.success.push(TxnOp::put(key.clone(), value.clone()));
    }
    let lease: Option<LeaseId> = if change.quarantine_puts.is_empty() {
        None
    } else {
        Some(
            kv.lease_grant(quarantine)
                .await
                .map_err(TxnFailure::Uncertain)?,
        )
    };
    if let Some(lease) = lease {
        for (key, value) in &change.quarantine_puts {
            txn.success
                .push(TxnOp::put_on_lease(key.clone(), value.clone(), lease));
        }
    }
    let outcome = run(kv, fence.guard(txn)).await;
    if let (Err(TxnFailure::Refused), Some(lease)) = (&outcome, lease) {
        let _ = kv.lease_revoke(lease).await;
    }
    outcome
}

/// Applies a node's finished task to the view; true if an outcome is unknown (the view is
/// rebuilt).
pub(super) fn finish_blocks(
    view: &mut ClusterView,
    shared: &Arc<Shared>,
    runner: &mut Runner<NodeName, Done>,
    work: &mut Work,
    node: NodeName,
    done: StepsDone,
) -> bool {
    let _span = node_span(&node).entered();
    let mut uncertain = false;
    let mut failed = false;
    for (step, outcome, took) in done.ran {
        match (step, outcome) {
            (BlockStep::Grant(proposal), Ok(revision)) => {
                for cidr in &proposal.blocks {
                    tracing::info!(
                        pool = %proposal.pool,
                        family = %proposal.family,
                        cidr = %cidr,
                        revision,
                        "granted"
                    );
                }
                shared.note_txn(took);
                view.commit_blocks(&proposal, revision);
                shared.note_grant(TxnOutcome::Granted);
                shared.note_blocks_granted(proposal.pool.as_str(), proposal.blocks.len() as u64);
            }
            (BlockStep::Release(change), Ok(revision)) => {
                let step = change.kind.name();
                if change.kind == ReleaseKind::Complete {
                    tracing::info!(
                        pool = %change.pool,
                        family = %change.family,
                        cidr = %change.cidr,
                        revision,
                        "released"
                    );
                } else {
                    tracing::debug!(
                        step,
                        pool = %change.pool,
                        cidr = %change.cidr,
                        revision,
                        "release step"
                    );
                }
                view.apply_release_change(&change, revision);
                shared.note_handshake(change.kind.name());
                if change.kind == ReleaseKind::Complete {
                    shared.note_blocks_released(change.pool.as_str(), 1);
                }
            }
            (step, Err(failure)) => {
                if let BlockStep::Grant(proposal) = &step {
                    view.abandon_blocks(proposal);
                }
                failed = true;
                let what = match &step {
                    BlockStep::Grant(_) => "block grant".to_owned(),
                    BlockStep::Release(change) => {
                        format!("release step {} of {}", change.kind.name(), change.cidr)
                    }
                };
                match failure {
                    TxnFailure::Refused => {
                        if matches!(step, BlockStep::Grant(_)) {
                            shared.note_grant(TxnOutcome::Conflict);
                        } else {
                            shared.note_handshake("conflict");
                        }
                    }
                    TxnFailure::Uncertain(error) => {
                        if matches!(step, BlockStep::Grant(_)) {
                            shared.note_grant(TxnOutcome::Failed);
                        }
                        shared.note_problem(format!("{what} for {node}: {error}"));
                        uncertain = true;
                    }
                }
            }
        }
    }
    for step in done.not_run {
        if let BlockStep::Grant(proposal) = step {
            view.abandon_blocks(&proposal);
        }
    }
    if failed {
        backoff(view, runner, &node, false);
    } else {
        backoff(view, runner, &node, true);
        // Planned again: a grant of more than 25 blocks goes on, another pool's turn comes.
        work.block_pending.insert(node);
    }
    uncertain
}
