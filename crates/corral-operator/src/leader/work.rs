//! The leading loop's own state beside the view ([`Work`]: which nodes to look at, which
//! wait for space, the block clocks, the signals to the other managers), what a finished task
//! tells the loop ([`Done`]), and the per-node backoff. Below the files that act on it
//! (`blocks.rs`, `drain.rs`, `revoke.rs`) and the loop itself (`leader.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use corral_cluster::{ClusterView, Key, Keys, NodeName, Proposal, Resync};
use corral_kv::{Event, Revision};

use super::block_state::{BlockClock, StepsDone};
use super::runner::Runner;
use super::txn::TxnFailure;
use super::{cloud, node_cidr_sync};

/// What a finished transaction tells the loop.
pub(super) enum Done {
    /// One transaction granting to one or more nodes, all or nothing.
    Grant {
        proposals: Vec<Proposal>,
        outcome: Result<Revision, TxnFailure>,
        took: Duration,
    },
    Removal {
        node: NodeName,
        outcome: Result<Revision, TxnFailure>,
    },
    /// One step of a removed node's drain (`drain.rs`).
    Drain {
        step: corral_cluster::RemovalStep,
        outcome: Result<Revision, TxnFailure>,
    },
    /// Grants a node's agent refused, revoked (`revoke.rs`).
    Revoke {
        revocations: Vec<corral_cluster::Revocation>,
        outcome: Result<Revision, TxnFailure>,
    },
    /// A node's block-pool steps (grants and release handshakes), one transaction each.
    Blocks { node: NodeName, done: StepsDone },
}

/// The leading loop's own state beside the view (the runner keeps the transactions in flight,
/// one at a time per node, and each node's backoff).
pub(super) struct Work {
    /// Nodes that may lack something and may be tried now. Kept from the events (a node
    /// registered, a grant of it deleted) instead of scanning every node after each event:
    /// a scan costs O(nodes), and a burst of 10,000 grants would pay it 10,000 times.
    pub(super) pending: std::collections::BTreeSet<NodeName>,
    /// Every node must be looked at (after a rebuild or a configuration change).
    pub(super) rescan: bool,
    /// Nodes that found a pool or the node IDs full: tried again as soon as something is
    /// freed (a grant or quarantine deleted), besides their backoff.
    pub(super) waiting_for_space: std::collections::BTreeSet<NodeName>,
    /// Nodes whose last batch was refused: tried alone until they succeed.
    pub(super) solo: std::collections::BTreeSet<NodeName>,
    /// Block pools: nodes whose plan may have changed (their demand, release keys, grants,
    /// registration), planned on the next turn.
    pub(super) block_pending: std::collections::BTreeSet<NodeName>,
    /// Block pools: every node must be planned (after a rebuild or a configuration change).
    pub(super) block_rescan: bool,
    /// Block pools: the leader's clocks (first sights, excess, wake-ups).
    pub(super) clock: BlockClock,
    /// Cloud pools: tells the cloud node manager which nodes an event concerns.
    pub(super) cloud: Option<Arc<cloud::CloudSignal>>,
    /// From-cloud pools: tells the node CIDR sync what changed.
    pub(super) sync: Arc<node_cidr_sync::SyncSignal>,
    /// Removed nodes whose last drain step committed at a revision the view has not seen
    /// yet: no next step for them until the watch got that far.
    pub(super) drain_wait: HashMap<NodeName, Revision>,
    /// `corral cluster recover --yes` was written: stop waiting for the agents' assertions.
    pub(super) recover: bool,
    /// Grant batches whose answer was lost (the store failed mid-call), abandoned in the
    /// view: one read each tells whether etcd applied them (`leader::resolve_lost`).
    pub(super) lost: Vec<Vec<Proposal>>,
    /// Operations a grant transaction may hold (etcd's `--max-txn-ops`; 128 again once etcd
    /// refused more).
    pub(super) txn_ops: usize,
}

impl Work {
    /// Notes what an event may change for whom.
    pub(super) fn note(&mut self, runner: &mut Runner<NodeName, Done>, keys: &Keys, event: &Event) {
        let key = String::from_utf8_lossy(event.key());
        let deleted = matches!(event, Event::Delete { .. });
        let parsed = keys.parse(&key);
        if let (Some(signal), Ok(parsed)) = (&self.cloud, &parsed) {
            signal.note(parsed);
        }
        if let Ok(parsed) = &parsed {
            self.sync.note(parsed, deleted);
        }
        match parsed {
            Ok(Key::Recover) if !deleted => self.recover = true,
            Ok(Key::Config) => {
                // Another configuration: whatever failed may succeed now (a pool grown,
                // a grant refused for the configuration's revision).
                self.rescan = true;
                self.block_rescan = true;
                runner.end_waits();
            }
            Ok(Key::Removal { node }) if deleted => {
                // A removal done (or dropped): the node may be registered again and waiting.
                self.block_pending.insert(node.clone());
                self.pending.insert(node);
            }
            Ok(Key::Node { node }) if !deleted => {
                self.block_pending.insert(node.clone());
                self.pending.insert(node);
            }
            Ok(Key::Node { node }) => {
                // Gone: nothing of it is retried or waits any more.
                runner.forget(&node);
                self.solo.remove(&node);
                self.waiting_for_space.remove(&node);
                self.block_pending.remove(&node);
                self.clock.forget_node(&node);
            }
            Ok(Key::Owned { node, .. }) => {
                // A block granted or released (or a node CIDR deleted).
                self.block_pending.insert(node.clone());
                if deleted {
                    self.pending.insert(node);
                }
            }
            Ok(Key::NodeIdOfNode { node }) if deleted => {
                self.pending.insert(node);
            }
            Ok(Key::Demand { node, .. } | Key::Release { node, .. }) => {
                self.block_pending.insert(node);
            }
            Ok(
                Key::Grant { .. }
                | Key::Quarantine { .. }
                | Key::NodeId { .. }
                | Key::QuarantineId { .. },
            ) if deleted => {
                for node in std::mem::take(&mut self.waiting_for_space) {
                    runner.forget(&node);
                    self.block_pending.insert(node.clone());
                    self.pending.insert(node);
                }
            }
            _ => {}
        }
    }
}

/// The span of what the leader does about one node (a grant or a release step applied; its
/// task runs in the runner's span of the same shape): every event in it names the node.
pub(super) fn node_span(node: &NodeName) -> tracing::Span {
    tracing::info_span!("node", node = %node)
}

/// nodeipam's timing per node: a node that failed waits `InitialRetry`, then doubling up to
/// `MaxBackoff`; one that succeeded is not held back (it needs nothing until something
/// changes, and the watch says when).
pub(super) fn backoff(
    view: &ClusterView,
    runner: &mut Runner<NodeName, Done>,
    node: &NodeName,
    success: bool,
) {
    if success {
        runner.forget(node);
    } else {
        runner.back_off(node, &Resync::from(&view.config().resync));
    }
}
