//! What block mode keeps between turns of the leading loop: the leader's clocks (first
//! sights, excess, wake-ups), a step of a node's plans, and what a node's task did. Below
//! both the loop's state (`work.rs`) and the planner (`blocks.rs`), which share them.

use std::collections::BTreeMap;
use std::time::Duration;

use corral_cluster::{BlockProposal, Family, IpNet, NodeName, PoolName, ReleaseChange};
use corral_kv::Revision;
use tokio::time::Instant;

use super::txn::TxnFailure;

pub(super) type Triple = (NodeName, PoolName, Family);

/// The leader's clocks of block pools, on its own monotonic clock (milliseconds since it
/// started leading).
pub(super) struct BlockClock {
    pub(super) epoch: Instant,
    /// First sight of each block a node holds.
    pub(super) seen: BTreeMap<Triple, BTreeMap<IpNet, u64>>,
    /// Since when a node has been in excess by at least one block.
    pub(super) excess_since: BTreeMap<Triple, u64>,
    /// When a node's plan may change by time alone (a release delay running out).
    pub(super) wake: BTreeMap<NodeName, u64>,
}

impl BlockClock {
    pub(super) fn new() -> BlockClock {
        BlockClock {
            epoch: Instant::now(),
            seen: BTreeMap::new(),
            excess_since: BTreeMap::new(),
            wake: BTreeMap::new(),
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn instant(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// Forgets a node (its registration deleted).
    pub(super) fn forget_node(&mut self, node: &NodeName) {
        self.seen.retain(|(n, ..), _| n != node);
        self.excess_since.retain(|(n, ..), _| n != node);
        self.wake.remove(node);
    }

    /// The earliest wake-up, if any.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        self.wake.values().min().map(|ms| self.instant(*ms))
    }

    /// Nodes whose wake-up came, removed from the list.
    pub(super) fn take_due(&mut self) -> Vec<NodeName> {
        let now = self.now_ms();
        let due: Vec<NodeName> = self
            .wake
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(node, _)| node.clone())
            .collect();
        for node in &due {
            self.wake.remove(node);
        }
        due
    }
}

/// One transaction of a node's task.
pub(super) enum BlockStep {
    Grant(BlockProposal),
    Release(ReleaseChange),
}

/// What a node's task did: each step run with its outcome, then the steps not run.
pub(super) struct StepsDone {
    pub(super) ran: Vec<(BlockStep, Result<Revision, TxnFailure>, Duration)>,
    pub(super) not_run: Vec<BlockStep>,
}
