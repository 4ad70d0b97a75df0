//! Block-mode pools in the view: block proposals (many blocks per node, pool and family), the
//! release handshake's transactions as values, and what the node manager's decision
//! (`crate::blocks::plan`) rests on.
//!
//! As for node CIDRs, the view decides nothing about etcd: every value here says what a
//! transaction compares, puts and deletes, and the leader adds the fence.
//!
//! The release handshake, end to end: (1) the leader puts `release/…` = `marked` (compares: key
//! absent, the grant's create revision = `grant_revision`, the fence); (2) the agent, in one local
//! commit, surrenders the block if it holds no allocation and then compare-and-swaps `ready`, else
//! `refused` with a reason, changing nothing; (3) on `ready` and still in excess, one transaction
//! deletes `grants/`, `owned/` and `release/` and puts `quarantine/` on a lease (compares: the
//! release key's mod revision, the grant's create revision, the fence); (4) a `refused` key is
//! deleted and the excess clock restarts; (5) a block that stopped being excess before (3) is
//! un-marked by deleting the key, and the agent takes the block back. Release keys naming no
//! current grant of their node are deleted as stale. Crash safety: the agent surrenders before it
//! says `ready` and re-sends `ready` after a restart, and the leader deletes a grant only on
//! `ready` at the revision it read, so no block holding an allocation is ever released. A `ready`
//! block is held but not available: it completes only while the excess counted with it covers it,
//! else it is un-marked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use super::{ClusterView, ProposeError, WaitUnit};
use crate::blocks::{self, BlockInput, HeldBlock, Statistics};
use crate::check::block_capacity;
use crate::keys::{
    GrantRecord, Keys, NodeName, OwnedRecord, QuarantineRecord, ReleaseRecord, ReleaseState,
    ValueError, encode_value,
};

/// The most blocks one grant transaction carries (2 compares and 2 puts each, well inside
/// etcd's 128 operations).
pub const MAX_BLOCKS_PER_TXN: usize = 25;

/// What a transaction compares, as a value (the leader turns it into corral-kv's compares).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// The key does not exist (version 0).
    Absent(String),
    /// The key exists with this create revision.
    CreatedAt(String, i64),
    /// The key exists with this mod revision.
    ModifiedAt(String, i64),
}

/// Blocks of one pool and family proposed to one node, to commit in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockProposal {
    /// The node.
    pub node: NodeName,
    /// Its uid as registered.
    pub uid: String,
    /// The create revision of `nodes/<node>`.
    pub node_revision: i64,
    /// The pool.
    pub pool: PoolName,
    /// The family.
    pub family: Family,
    /// The blocks, lowest first (at most [`MAX_BLOCKS_PER_TXN`]).
    pub blocks: Vec<IpNet>,
    /// The mod revision of `config` the proposal was made under.
    pub config_revision: i64,
    /// When it is granted, in milliseconds since the epoch (the grants' `granted_ms`).
    pub granted_ms: Option<u64>,
}

impl BlockProposal {
    /// The transaction's compares (without the fence): per block its `grants/` and
    /// `quarantine/` keys absent, the node's registration created at `node_revision`, the
    /// configuration at `config_revision`. No `owned/` prefix compare: a node holds many
    /// blocks, and equal-size aligned keys are the same key or disjoint, so "absent" is
    /// "free".
    pub fn conditions(&self, keys: &Keys) -> Vec<Condition> {
        let mut conditions = vec![
            Condition::ModifiedAt(keys.config(), self.config_revision),
            Condition::CreatedAt(keys.node(&self.node), self.node_revision),
        ];
        for block in &self.blocks {
            conditions.push(Condition::Absent(keys.grant(
                &self.pool,
                self.family,
                block,
            )));
            conditions.push(Condition::Absent(keys.quarantine(
                &self.pool,
                self.family,
                block,
            )));
        }
        conditions
    }

    /// The transaction's puts: a `grants/` and an `owned/` key per block.
    pub fn puts(&self, keys: &Keys) -> Result<Vec<(String, Vec<u8>)>, ValueError> {
        let grant = encode_value(&GrantRecord {
            node: self.node.clone(),
            uid: self.uid.clone(),
            node_revision: self.node_revision,
            granted_ms: self.granted_ms,
        })?;
        let owned = encode_value(&OwnedRecord {
            node_revision: self.node_revision,
        })?;
        let mut puts = Vec::with_capacity(2 * self.blocks.len());
        for block in &self.blocks {
            puts.push((keys.grant(&self.pool, self.family, block), grant.clone()));
            puts.push((
                keys.owned(&self.node, &self.pool, self.family, block),
                owned.clone(),
            ));
        }
        Ok(puts)
    }
}

/// A step of the release handshake the leader takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReleaseKind {
    /// End a handshake the block no longer needs (delete the release key).
    Unmark,
    /// Forget a refusal, or a release key that names no current grant (delete it); its metric
    /// label is `refused`.
    Forget,
    /// The agent surrendered the block: delete the grant, quarantine the block.
    Complete,
    /// Ask for the block back (put the release key `marked`).
    Mark,
}

impl ReleaseKind {
    /// The step's name (a metric label).
    pub fn name(self) -> &'static str {
        match self {
            ReleaseKind::Unmark => "unmarked",
            ReleaseKind::Forget => "refused",
            ReleaseKind::Complete => "released",
            ReleaseKind::Mark => "marked",
        }
    }
}

/// One step of a release handshake as a transaction (the leader adds the fence, and puts
/// `quarantine_puts` on a lease of the quarantine time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseChange {
    /// The step.
    pub kind: ReleaseKind,
    /// The node.
    pub node: NodeName,
    /// The pool.
    pub pool: PoolName,
    /// The family.
    pub family: Family,
    /// The block.
    pub cidr: IpNet,
    /// What the transaction compares.
    pub conditions: Vec<Condition>,
    /// Keys put.
    pub puts: Vec<(String, Vec<u8>)>,
    /// Keys deleted.
    pub deletes: Vec<String>,
    /// Keys put on the quarantine lease.
    pub quarantine_puts: Vec<(String, Vec<u8>)>,
}

/// One node's block statistics in one pool and family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBlockStats {
    /// The pool.
    pub pool: PoolName,
    /// The family.
    pub family: Family,
    /// Cilium's statistics (addresses).
    pub stats: Statistics,
    /// Blocks held.
    pub blocks: u64,
    /// Blocks in a release handshake (marked, ready or refused).
    pub in_handshake: u64,
    /// At max-allocate and still needing addresses.
    pub at_capacity: bool,
    /// Whether the agent reported demand.
    pub has_demand: bool,
}

impl ClusterView {
    /// Whether any configured pool is in block mode.
    pub fn has_block_pools(&self) -> bool {
        self.config.pools.iter().any(|p| p.is_blocks())
    }

    /// Every (pool, family) in block mode.
    pub fn block_pool_families(&self) -> Vec<(PoolName, Family)> {
        self.config
            .pools
            .iter()
            .filter(|p| p.is_blocks())
            .flat_map(|p| p.families().map(|(family, _)| (p.name.clone(), family)))
            .collect()
    }

    /// Whether the node's liveness key exists.
    pub fn is_live(&self, node: &NodeName) -> bool {
        self.live.contains(node)
    }

    /// Addresses an agent hands out from one block of the pool and family (0 when the pool
    /// or family is not configured).
    pub fn block_size(&self, pool: &PoolName, family: Family) -> u64 {
        let Some(config) = self.config.pool(pool).and_then(|p| p.family(family)) else {
            return 0;
        };
        let Some(first) = config.cidrs.first() else {
            return 0;
        };
        IpNet::new(first.network(), config.node_prefix_len)
            .map_or(0, |net| block_capacity(net.trunc()))
    }

    /// Proposes the `n` lowest free aligned blocks (at most [`MAX_BLOCKS_PER_TXN`]) of a block
    /// pool to `node`, and marks them in flight so no other proposal picks them. Fewer are
    /// proposed if fewer are free; none free is `Full`.
    pub fn propose_blocks(
        &mut self,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        n: usize,
    ) -> Result<BlockProposal, ProposeError> {
        self.propose_blocks_at(node, pool, family, n, None)
    }

    /// [`Self::propose_blocks`], its grants stamped `granted_ms` (the history's start).
    pub fn propose_blocks_at(
        &mut self,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        n: usize,
        granted_ms: Option<u64>,
    ) -> Result<BlockProposal, ProposeError> {
        let Some(entry) = self.nodes.get(node) else {
            return Err(ProposeError::UnknownNode { node: node.clone() });
        };
        if self.in_flight.contains_key(node) || self.block_in_flight.contains_key(node) {
            return Err(ProposeError::InFlight { node: node.clone() });
        }
        let n = n.min(MAX_BLOCKS_PER_TXN);
        if n == 0 || !self.is_block_pool(pool) {
            return Err(ProposeError::NothingNeeded { node: node.clone() });
        }
        let (uid, node_revision) = (entry.record.uid.clone(), entry.create_revision);
        let Some(space) = self.spaces.get_mut(&(pool.clone(), family)) else {
            return Err(ProposeError::Full {
                pool: pool.clone(),
                family,
            });
        };
        let mut blocks = Vec::with_capacity(n);
        while blocks.len() < n {
            let Some(block) = space.lowest_free() else {
                break;
            };
            // Free just above: marking cannot fail; in flight, the next one is another.
            if space.propose(&block).is_err() {
                break;
            }
            blocks.push(block);
        }
        if blocks.is_empty() {
            return Err(ProposeError::Full {
                pool: pool.clone(),
                family,
            });
        }
        let proposal = BlockProposal {
            node: node.clone(),
            uid,
            node_revision,
            pool: pool.clone(),
            family,
            blocks,
            config_revision: self.config_revision,
            granted_ms,
        };
        self.block_in_flight.insert(node.clone(), proposal.clone());
        Ok(proposal)
    }

    /// Un-marks a block proposal (after its commit or its failure); harmless if forgotten.
    pub fn abandon_blocks(&mut self, proposal: &BlockProposal) {
        if self.block_in_flight.get(&proposal.node) != Some(proposal) {
            return;
        }
        self.block_in_flight.remove(&proposal.node);
        if let Some(space) = self
            .spaces
            .get_mut(&(proposal.pool.clone(), proposal.family))
        {
            for block in &proposal.blocks {
                let _ = space.abandon(block);
            }
        }
    }

    /// Marks a block proposal committed at `revision`: its puts are applied at once.
    pub fn commit_blocks(&mut self, proposal: &BlockProposal, revision: i64) {
        self.abandon_blocks(proposal);
        match proposal.puts(&self.keys) {
            Ok(puts) => {
                for (key, value) in puts {
                    self.apply_put(&key, &value, revision, revision);
                }
            }
            Err(e) => self.problem(&self.keys.node(&proposal.node), revision, e.to_string()),
        }
    }

    /// The block proposals in flight.
    pub fn blocks_in_flight(&self) -> impl Iterator<Item = &BlockProposal> {
        self.block_in_flight.values()
    }

    /// The blocks a node holds in a pool and family: (block, its grant's create revision).
    pub fn blocks_of(&self, node: &NodeName, pool: &PoolName, family: Family) -> Vec<(IpNet, i64)> {
        self.grants_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter(|(p, f, _)| p == pool && *f == family)
            .filter_map(|id| {
                let entry = self.grants.get(id)?;
                Some((id.2, entry.create_revision))
            })
            .collect()
    }

    /// A node's blocks of a pool and family as the node manager takes them, with their open
    /// handshake (a release key naming another grant of the block counts as none; see
    /// [`Self::stale_releases`]); `seen_ms` gives each block's first sight on the leader's
    /// clock.
    pub fn held_blocks(
        &self,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        mut seen_ms: impl FnMut(&IpNet) -> u64,
    ) -> Vec<HeldBlock> {
        self.blocks_of(node, pool, family)
            .into_iter()
            .map(|(cidr, grant_revision)| {
                let release = self
                    .releases
                    .get(&(node.clone(), pool.clone(), family, cidr))
                    .filter(|(_, record)| record.grant_revision == grant_revision)
                    .map(|(_, record)| (record.state, record.marked_ms));
                HeldBlock {
                    cidr,
                    size: block_capacity(cidr),
                    seen_ms: seen_ms(&cidr),
                    release,
                }
            })
            .collect()
    }

    /// The input of `blocks::plan` for one node, pool and family (`None` unless the pool is a
    /// block pool with that family): watermarks for the node, the block size, the node's last
    /// demand of the family.
    pub fn block_input<'a>(
        &'a self,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        blocks: &'a [HeldBlock],
        excess_since_ms: Option<u64>,
        now_ms: u64,
    ) -> Option<BlockInput<'a>> {
        let config = self.config.pool(pool)?;
        let demand = config.blocks()?;
        config.family(family)?;
        let node_max_pods = self.nodes.get(node).and_then(|e| e.record.max_pods);
        Some(BlockInput {
            watermarks: demand.capped_watermarks_for(node.as_str(), node_max_pods),
            block_size: self.block_size(pool, family),
            blocks,
            demand: self.demand(node, pool).and_then(|d| d.family(family)),
            excess_since_ms,
            now_ms,
            release_delay_ms: demand.release_delay_ms(),
        })
    }

    /// Release keys of a node that name no current grant of it (the grant gone, another
    /// node's, or granted again since), or whose value does not decode: the leader deletes
    /// them.
    pub fn stale_releases(&self, node: &NodeName) -> Vec<(PoolName, Family, IpNet)> {
        self.release_keys
            .keys()
            .filter(|(n, ..)| n == node)
            .filter(|id| {
                let (_, pool, family, cidr) = id;
                let grant = self
                    .grants
                    .get(&(pool.clone(), *family, *cidr))
                    .filter(|g| g.record.as_ref().is_some_and(|r| &r.node == node));
                match (grant, self.releases.get(*id)) {
                    (Some(grant), Some((_, record))) => {
                        record.grant_revision != grant.create_revision
                    }
                    _ => true,
                }
            })
            .map(|(_, pool, family, cidr)| (pool.clone(), *family, *cidr))
            .collect()
    }

    /// One step of a block's release handshake as a transaction, if the view knows what it
    /// needs (`None`: nothing to do, e.g. no such grant or release key).
    pub fn release_change(
        &self,
        kind: ReleaseKind,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        cidr: &IpNet,
        now_ms: u64,
    ) -> Option<ReleaseChange> {
        let keys = &self.keys;
        let id = (node.clone(), pool.clone(), family, *cidr);
        let release_key = keys.release(node, pool, family, cidr);
        let grant_key = keys.grant(pool, family, cidr);
        let grant_revision = self
            .grants
            .get(&(pool.clone(), family, *cidr))
            .filter(|g| g.record.as_ref().is_some_and(|r| &r.node == node))
            .map(|g| g.create_revision);
        let mut change = ReleaseChange {
            kind,
            node: node.clone(),
            pool: pool.clone(),
            family,
            cidr: *cidr,
            conditions: Vec::new(),
            puts: Vec::new(),
            deletes: Vec::new(),
            quarantine_puts: Vec::new(),
        };
        match kind {
            ReleaseKind::Mark => {
                let grant_revision = grant_revision?;
                if self.release_keys.contains_key(&id) {
                    return None;
                }
                let record = ReleaseRecord {
                    state: ReleaseState::Marked,
                    grant_revision,
                    marked_ms: now_ms,
                    answered_ms: 0,
                    reason: None,
                };
                change
                    .conditions
                    .push(Condition::Absent(release_key.clone()));
                change
                    .conditions
                    .push(Condition::CreatedAt(grant_key, grant_revision));
                change.puts.push((release_key, encode_value(&record).ok()?));
            }
            ReleaseKind::Unmark | ReleaseKind::Forget => {
                let revision = *self.release_keys.get(&id)?;
                change
                    .conditions
                    .push(Condition::ModifiedAt(release_key.clone(), revision));
                change.deletes.push(release_key);
            }
            ReleaseKind::Complete => {
                let (revision, record) = self.releases.get(&id)?;
                if record.state != ReleaseState::Ready || grant_revision? != record.grant_revision {
                    return None;
                }
                change
                    .conditions
                    .push(Condition::ModifiedAt(release_key.clone(), *revision));
                change.conditions.push(Condition::CreatedAt(
                    grant_key.clone(),
                    record.grant_revision,
                ));
                change.deletes.push(grant_key);
                change.deletes.push(keys.owned(node, pool, family, cidr));
                change.deletes.push(release_key);
                // The grant's end, recorded in the transaction that deletes it.
                let grant = self.grant_record(pool, family, cidr);
                let ended = crate::history::ended(
                    pool,
                    cidr,
                    node,
                    grant,
                    now_ms,
                    crate::keys::GrantEnd::Released,
                );
                change.puts.extend(crate::history::puts(keys, &ended).ok()?);
                let quarantine = QuarantineRecord {
                    from_node: node.clone(),
                    reason: "block released".to_owned(),
                    since_ms: now_ms,
                    state: Default::default(),
                };
                change.quarantine_puts.push((
                    keys.quarantine(pool, family, cidr),
                    encode_value(&quarantine).ok()?,
                ));
            }
        }
        Some(change)
    }

    /// Applies what a committed release step wrote at `revision` at once (the watch repeats
    /// it later, which changes nothing).
    pub fn apply_release_change(&mut self, change: &ReleaseChange, revision: i64) {
        for key in &change.deletes {
            if !self.seen_after(key, revision) {
                self.apply_delete(key, revision);
            }
        }
        for (key, value) in change.puts.iter().chain(&change.quarantine_puts) {
            if !self.seen_after(key, revision) {
                self.apply_put(key, value, revision, revision);
            }
        }
    }

    /// Whether the watch already showed `key` written after `revision`: a step's outcome
    /// applied late (its task ended after the watch delivered newer events, such as the
    /// agent's `ready` over the leader's own `marked`) must not put the older state back.
    fn seen_after(&self, key: &str, revision: i64) -> bool {
        match self.keys.parse(key) {
            Ok(crate::keys::Key::Release {
                node,
                pool,
                family,
                cidr,
            }) => self
                .releases
                .get(&(node, pool, family, cidr))
                .is_some_and(|(mod_revision, _)| *mod_revision > revision),
            Ok(
                crate::keys::Key::Grant { pool, family, cidr }
                | crate::keys::Key::Owned {
                    pool, family, cidr, ..
                },
            ) => self
                .grants
                .get(&(pool, family, cidr))
                .is_some_and(|grant| grant.create_revision > revision),
            _ => false,
        }
    }

    /// The node's `demand/` and `release/` keys seen, whatever their values.
    pub(super) fn block_keys_of(&self, node: &NodeName) -> Vec<String> {
        let mut keys: Vec<String> = self
            .demand_keys
            .iter()
            .filter(|(n, _)| n == node)
            .map(|(n, pool)| self.keys.demand(n, pool))
            .collect();
        keys.extend(
            self.release_keys
                .keys()
                .filter(|(n, ..)| n == node)
                .map(|(n, pool, family, cidr)| self.keys.release(n, pool, *family, cidr)),
        );
        keys
    }

    /// A node's statistics in every block pool and family (the decision's numbers, without
    /// the leader's clocks).
    pub fn node_block_stats(&self, node: &NodeName) -> Vec<NodeBlockStats> {
        let mut out = Vec::new();
        for (pool, family) in self.block_pool_families() {
            let held = self.held_blocks(node, &pool, family, |_| 0);
            let Some(input) = self.block_input(node, &pool, family, &held, None, 0) else {
                continue;
            };
            let plan = blocks::plan(&input);
            let in_handshake = self
                .releases_of(node)
                .filter(|((_, p, f, _), _)| *p == pool && *f == family)
                .count() as u64;
            out.push(NodeBlockStats {
                has_demand: input.demand.is_some(),
                pool,
                family,
                stats: plan.stats,
                blocks: held.len() as u64,
                in_handshake,
                at_capacity: plan.at_capacity,
            });
        }
        out
    }

    /// Every registered node when block pools are configured (none otherwise): the node
    /// manager's candidates after a rebuild or a configuration change.
    pub fn block_nodes(&self) -> BTreeSet<NodeName> {
        if !self.has_block_pools() {
            return BTreeSet::new();
        }
        self.nodes.keys().cloned().collect()
    }

    /// Prometheus text (without `# EOF`) of block pools for the operator's `/metrics`: free
    /// addresses per pool and family (the sum of the nodes' last demand reports), and
    /// registered nodes by category: `degraded` (no liveness key: its agent is down or cannot
    /// reach etcd, so its demand may be stale), `at_capacity` (at max-allocate and still
    /// needing addresses), `starving` (needing blocks the pool has none free for: exhausted,
    /// or its only space in quarantine), `ok`. Empty without block pools.
    pub fn block_metrics_text(&self) -> String {
        let mut text = String::new();
        if !self.has_block_pools() {
            return text;
        }
        let mut available: BTreeMap<(PoolName, Family), u64> = self
            .block_pool_families()
            .into_iter()
            .map(|pf| (pf, 0))
            .collect();
        for ((_, pool), record) in &self.demands {
            for family in [Family::V4, Family::V6] {
                if let (Some(sum), Some(demand)) = (
                    available.get_mut(&(pool.clone(), family)),
                    record.family(family),
                ) {
                    *sum = sum.saturating_add(demand.free);
                }
            }
        }
        let _ = writeln!(
            text,
            "# HELP corral_operator_block_addresses_available Free addresses per block pool and family, as the nodes last reported"
        );
        let _ = writeln!(
            text,
            "# TYPE corral_operator_block_addresses_available gauge"
        );
        for ((pool, family), free) in &available {
            let _ = writeln!(
                text,
                "corral_operator_block_addresses_available{{pool=\"{pool}\",family=\"{}\"}} {free}",
                family.name()
            );
        }
        let (mut ok, mut at_capacity, mut degraded, mut starving) = (0u64, 0u64, 0u64, 0u64);
        let waits = self.all_waits();
        for node in self.nodes.keys() {
            if !self.is_live(node) {
                degraded += 1;
            } else if self.node_block_stats(node).iter().any(|s| s.at_capacity) {
                at_capacity += 1;
            } else if waits.get(node).is_some_and(|waits| {
                waits
                    .iter()
                    .any(|w| w.unit == WaitUnit::Block && w.is_starving())
            }) {
                starving += 1;
            } else {
                ok += 1;
            }
        }
        let _ = writeln!(
            text,
            "# HELP corral_operator_block_nodes Registered nodes by category (degraded: no liveness key; at_capacity: at max-allocate and still needing addresses; starving: needing blocks none are free for)"
        );
        let _ = writeln!(text, "# TYPE corral_operator_block_nodes gauge");
        for (category, n) in [
            ("ok", ok),
            ("at_capacity", at_capacity),
            ("starving", starving),
            ("degraded", degraded),
        ] {
            let _ = writeln!(
                text,
                "corral_operator_block_nodes{{category=\"{category}\"}} {n}"
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{DemandRecord, FamilyDemand};
    use crate::tests::{ViewFixture, net, pods, pool_toml};

    const CONFIG: &str = pool_toml!(
        "pods",
        mode = "blocks",
        "10.0.0.0/26",
        block_prefix_len = 28,
        reserved = ["10.0.0.16/28"]
    );

    impl ViewFixture {
        fn apply(&mut self, change: &ReleaseChange) {
            self.revision += 1;
            self.view.apply_release_change(change, self.revision);
        }

        /// Node `name`, registered and granted `n` blocks of pods' IPv4 at revision 7.
        fn node_with_blocks(&mut self, name: &str, n: usize) -> (NodeName, Vec<IpNet>) {
            let node = self.register(name);
            let proposal = self
                .view
                .propose_blocks(&node, &pods(), Family::V4, n)
                .unwrap();
            self.view.commit_blocks(&proposal, 7);
            (node, proposal.blocks)
        }

        /// The step `kind` of the release of pods' IPv4 `block` of `node`, marked at 1 ms.
        fn change(
            &self,
            kind: ReleaseKind,
            node: &NodeName,
            block: &IpNet,
        ) -> Option<ReleaseChange> {
            self.view
                .release_change(kind, node, &pods(), Family::V4, block, 1)
        }

        /// The agent's `ready` answer to the mark at `release_key` (of the grant at revision
        /// 7), written; its revision.
        fn put_ready(&mut self, release_key: &str) -> i64 {
            let record = ReleaseRecord {
                state: ReleaseState::Ready,
                grant_revision: 7,
                marked_ms: 1,
                answered_ms: 2,
                reason: None,
            };
            self.put(release_key, &encode_value(&record).unwrap())
        }
    }

    #[test]
    fn block_proposals_take_the_lowest_free_aligned_blocks_and_never_share() {
        let mut f = ViewFixture::new(CONFIG);
        let a = f.register("a");
        let b = f.register("b");
        // Four /28s, the second reserved: three free.
        let pa = f.view.propose_blocks(&a, &pods(), Family::V4, 2).unwrap();
        assert_eq!(pa.blocks, [net("10.0.0.0/28"), net("10.0.0.32/28")]);
        assert_eq!(
            f.view.propose_blocks(&a, &pods(), Family::V4, 1),
            Err(ProposeError::InFlight { node: a.clone() })
        );
        // In flight: b gets the one left, fewer than it asked for.
        let pb = f.view.propose_blocks(&b, &pods(), Family::V4, 5).unwrap();
        assert_eq!(pb.blocks, [net("10.0.0.48/28")]);
        // b's fails: its block is free again; a's commits.
        f.view.abandon_blocks(&pb);
        f.view.commit_blocks(&pa, 10);
        assert_eq!(f.view.blocks_of(&a, &pods(), Family::V4).len(), 2);
        let pb = f.view.propose_blocks(&b, &pods(), Family::V4, 5).unwrap();
        assert_eq!(pb.blocks, [net("10.0.0.48/28")]);
        f.view.commit_blocks(&pb, 11);
        assert_eq!(
            f.view.propose_blocks(&a, &pods(), Family::V4, 1),
            Err(ProposeError::Full {
                pool: pods(),
                family: Family::V4
            })
        );
        // The txn: config, registration, and per block grant and quarantine absent; no owned
        // prefix compare; two puts a block.
        let keys = f.view.keys().clone();
        let conditions = pa.conditions(&keys);
        assert_eq!(conditions.len(), 2 + 2 * 2);
        assert!(conditions.contains(&Condition::Absent(
            "/corral/t/v1/quarantine/pods/ipv4/10.0.0.32-28".into()
        )));
        assert!(conditions.contains(&Condition::CreatedAt("/corral/t/v1/nodes/a".into(), 2)));
        assert_eq!(pa.puts(&keys).unwrap().len(), 4);
        assert!(f.view.consistency_problems().is_empty());
        // At most 25 a proposal, whatever is asked for.
        let c = f.register("c");
        let mut wide = f.view.config().clone();
        wide.pools[0]
            .ipv4
            .as_mut()
            .unwrap()
            .cidrs
            .push(net("10.1.0.0/16"));
        let config_key = keys.config();
        f.put(&config_key, wide.to_json().unwrap().as_bytes());
        let pc = f.view.propose_blocks(&c, &pods(), Family::V4, 100).unwrap();
        assert_eq!(pc.blocks.len(), MAX_BLOCKS_PER_TXN);
    }

    /// A mark's outcome applied after the watch delivered the agent's `ready` (the leader's
    /// task ended late) keeps `ready`: found by the block bench, where two ready blocks then
    /// waited for the next resync.
    #[test]
    fn a_late_step_outcome_does_not_undo_what_the_watch_showed_since() {
        let mut f = ViewFixture::new(CONFIG);
        let (a, blocks) = f.node_with_blocks("a", 1);
        let block = blocks[0];
        let release_key = f.view.keys().release(&a, &pods(), Family::V4, &block);
        let mark = f.change(ReleaseKind::Mark, &a, &block).unwrap();
        // The mark committed at revision 8; the watch shows the agent's ready at 9 first.
        f.revision = 8;
        f.put_ready(&release_key);
        f.view.apply_release_change(&mark, 8);
        let held = f.view.held_blocks(&a, &pods(), Family::V4, |_| 0);
        assert!(
            matches!(held[0].release, Some((ReleaseState::Ready, _))),
            "{held:?}"
        );
    }

    #[test]
    fn release_steps_compare_what_the_protocol_says_and_removal_takes_block_keys() {
        let mut f = ViewFixture::new(CONFIG);
        let (a, _) = f.node_with_blocks("a", 2);
        let keys = f.view.keys().clone();
        let block = net("10.0.0.32/28");
        let release_key = keys.release(&a, &pods(), Family::V4, &block);
        let grant_key = keys.grant(&pods(), Family::V4, &block);
        // Nothing to un-mark or complete before a mark.
        for kind in [ReleaseKind::Unmark, ReleaseKind::Complete] {
            assert!(f.change(kind, &a, &block).is_none());
        }
        let mark = f.change(ReleaseKind::Mark, &a, &block).unwrap();
        assert_eq!(
            mark.conditions,
            [
                Condition::Absent(release_key.clone()),
                Condition::CreatedAt(grant_key.clone(), 7)
            ]
        );
        f.apply(&mark);
        let held = f.view.held_blocks(&a, &pods(), Family::V4, |_| 0);
        assert_eq!(
            held.iter().filter(|b| b.release.is_some()).count(),
            1,
            "{held:?}"
        );
        // Marked twice is nothing; the agent answers ready by CAS.
        assert!(f.change(ReleaseKind::Mark, &a, &block).is_none());
        let ready_revision = f.put_ready(&release_key);
        let unmark = f.change(ReleaseKind::Unmark, &a, &block).unwrap();
        assert_eq!(
            unmark.conditions,
            [Condition::ModifiedAt(release_key.clone(), ready_revision)]
        );
        assert_eq!(unmark.deletes, std::slice::from_ref(&release_key));
        let complete = f.change(ReleaseKind::Complete, &a, &block).unwrap();
        assert_eq!(
            complete.conditions,
            [
                Condition::ModifiedAt(release_key.clone(), ready_revision),
                Condition::CreatedAt(grant_key.clone(), 7)
            ]
        );
        assert_eq!(complete.deletes.len(), 3);
        assert_eq!(complete.quarantine_puts.len(), 1);
        // Demand and release keys (a garbage one too) go with a removal.
        let demand = encode_value(&DemandRecord {
            ipv4: Some(FamilyDemand::default()),
            ipv6: None,
            at_ms: 0,
        })
        .unwrap();
        f.put(&keys.demand(&a, &pods()), &demand);
        let garbage = keys.release(&a, &pods(), Family::V4, &net("10.0.0.48/28"));
        f.put(&garbage, b"garbage");
        assert_eq!(
            f.view.stale_releases(&a),
            [(pods(), Family::V4, net("10.0.0.48/28"))]
        );
        let deletes = f.view.removal(&a).deletes();
        for key in [keys.demand(&a, &pods()), release_key.clone(), garbage] {
            assert!(deletes.contains(&key), "{key} in {deletes:?}");
        }
        // Completed: the grant is gone and the block quarantined, not free.
        f.apply(&complete);
        assert_eq!(f.view.blocks_of(&a, &pods(), Family::V4).len(), 1);
        let b = f.register("b");
        let p = f.view.propose_blocks(&b, &pods(), Family::V4, 1).unwrap();
        assert_eq!(p.blocks, [net("10.0.0.48/28")]);
    }
}
