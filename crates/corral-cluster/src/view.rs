//! `ClusterView`: the operator's in-memory cache of the cluster, fed by etcd's puts and deletes, and the grants it proposes.
//!
//! The view decides nothing about etcd. It answers which nodes still need grants and proposes
//! them as values (`Proposal`); the operator commits a proposal in one transaction whose
//! compares prove every grant, owned and quarantine key absent, the node's owned prefix of
//! each pool and family empty, the node's registration current and the leader still leading. A stale view therefore costs a retry, never a
//! duplicate. Garbage keys and values, overlapping grants and the like are reported as
//! problems and skipped; nothing fed to the view panics it.
//!
//! Why an absence compare is enough: equal-size aligned CIDRs are either the same key or disjoint,
//! and a pool's node prefix length cannot change (`check_change`), so "this exact key is absent"
//! means "this CIDR is free"; a grant key not aligned at its pool's node prefix length is reported
//! and not counted as occupying anything (the operator never writes one). The grant transaction
//! also compares `config` at the mod revision the view saw, so nothing is granted under a
//! configuration the view did not see.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName};
use ipnet::IpNet;
use thiserror::Error;

use crate::config::{AppliedConfigRecord, ClusterConfig};
use crate::keys::{
    CloudId, CloudIntentRecord, CloudInterfaceRecord, DelegationRecord, DemandRecord, GrantRecord,
    HeldRange, HoldingsRecord, Key, Keys, NodeIdOfNodeRecord, NodeIdRecord, NodeName, NodeRecord,
    OwnedRecord, QuarantineRecord, ReleaseRecord, RemovalRecord, SCHEMA_VERSION, SchemaRecord,
    ValueError, WaitingRecord, decode_value, encode_value,
};
use crate::space::{CidrSpace, NodeIdSpace, SpaceError, SpaceStats};

mod block_view;
mod config_install;
mod from_cloud;
mod waiting;
pub use block_view::{
    BlockProposal, Condition, MAX_BLOCKS_PER_TXN, NodeBlockStats, ReleaseChange, ReleaseKind,
};
pub use config_install::is_config_key;
pub(crate) use waiting::full_of;
pub use waiting::{NodeWait, WaitReason, WaitUnit};

/// A cloud record the view holds: its revisions, and its value if it decodes (one that does
/// not is reported, and kept as `None`: the key still exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEntry<T> {
    /// The key's create revision.
    pub create_revision: i64,
    /// The key's mod revision (the compare of a change to it).
    pub mod_revision: i64,
    /// The value.
    pub record: Option<T>,
}

/// The most apply-time problems kept; older ones are dropped (and counted).
pub const MAX_PROBLEMS: usize = 1024;

/// A pool and family: the unit of node CIDR grants.
pub type PoolFamily = (PoolName, Family);

/// Something wrong found in what etcd holds, reported and skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key concerned.
    pub key: String,
    /// The revision of the event (0 for problems found by `consistency_problems`).
    pub revision: i64,
    /// What is wrong, lower-case.
    pub message: String,
}

/// Why no proposal was made; nothing was marked.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProposeError {
    /// The node is not registered (no `nodes/<node>` seen).
    #[error("node {node} is not registered")]
    UnknownNode {
        /// The node.
        node: NodeName,
    },
    /// A proposal for the node is already in flight.
    #[error("a proposal for node {node} is already in flight")]
    InFlight {
        /// The node.
        node: NodeName,
    },
    /// The node already holds everything the configuration grants.
    #[error("node {node} needs no grant")]
    NothingNeeded {
        /// The node.
        node: NodeName,
    },
    /// A pool and family has no free node CIDR.
    #[error("pool {pool} has no free {} node CIDR", family.name())]
    Full {
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
    },
    /// Every node ID is granted, quarantined or in flight.
    #[error("no free node ID (the plan has {max})")]
    NodeIdsFull {
        /// The plan's largest node ID.
        max: u32,
    },
}

/// A node CIDR of a proposal or of a node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeCidr {
    /// The pool.
    pub pool: PoolName,
    /// The family.
    pub family: Family,
    /// The node CIDR.
    pub cidr: IpNet,
}

/// What one node is to be granted, to commit in one transaction (all or nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The node.
    pub node: NodeName,
    /// Its uid as registered.
    pub uid: String,
    /// The create revision of `nodes/<node>` (the txn compares it).
    pub node_revision: i64,
    /// One node CIDR per configured pool and family the node lacks.
    pub cidrs: Vec<NodeCidr>,
    /// A node ID, if the plan is configured and the node lacks one.
    pub node_id: Option<u32>,
    /// When it is granted, in milliseconds since the epoch (the grants' `granted_ms`).
    pub granted_ms: Option<u64>,
    /// Pools of `cidrs` in which the view saw the node hold nothing (no grant, no `owned/`
    /// key, in any family): the transaction proves the node's whole `owned/<node>/<pool>/`
    /// empty with one compare instead of one per family.
    pub empty_pools: Vec<PoolName>,
}

impl Proposal {
    /// Keys the transaction must prove absent: every grant, owned and quarantine key of the
    /// CIDRs, and the node-ID keys and the ID's quarantine key.
    pub fn absent_keys(&self, keys: &Keys) -> Vec<String> {
        let mut absent = Vec::new();
        for c in &self.cidrs {
            absent.push(keys.grant(&c.pool, c.family, &c.cidr));
            absent.push(keys.owned(&self.node, &c.pool, c.family, &c.cidr));
            absent.push(keys.quarantine(&c.pool, c.family, &c.cidr));
        }
        if let Some(id) = self.node_id {
            absent.push(keys.node_id(id));
            absent.push(keys.node_id_of_node(&self.node));
            absent.push(keys.quarantine_id(id));
        }
        absent
    }

    /// Key prefixes the transaction must prove empty (an etcd compare `version == 0` with a
    /// range end): the node's `owned/<node>/<pool>/<family>/` of each CIDR, so a replica whose
    /// view missed a committed grant cannot give the node a second CIDR of the same pool and
    /// family; one `owned/<node>/<pool>/` for a pool of `empty_pools` (a stronger compare in
    /// fewer operations, so more nodes fit in one transaction).
    pub fn absent_prefixes(&self, keys: &Keys) -> Vec<String> {
        let owned = keys.owned_prefix(&self.node);
        let mut prefixes: Vec<String> = Vec::new();
        for c in &self.cidrs {
            let prefix = if self.empty_pools.contains(&c.pool) {
                format!("{owned}{}/", c.pool)
            } else {
                format!(
                    "{owned}{}/{}/",
                    c.pool,
                    crate::keys::family_segment(c.family)
                )
            };
            if !prefixes.contains(&prefix) {
                prefixes.push(prefix);
            }
        }
        prefixes
    }

    /// The compares and puts of the node's part of a grant transaction: its registration,
    /// the absent keys no prefix covers (grant and quarantine keys, node-ID keys), the
    /// prefixes; the grant, owned and node-ID records.
    pub fn txn_size(&self) -> (usize, usize) {
        let pooled = self
            .cidrs
            .iter()
            .filter(|c| !self.empty_pools.contains(&c.pool))
            .count();
        let ids = usize::from(self.node_id.is_some());
        (
            1 + 2 * self.cidrs.len() + pooled + self.empty_pools.len() + 3 * ids,
            2 * self.cidrs.len() + 2 * ids,
        )
    }

    /// The key whose create revision the transaction compares with `node_revision`.
    pub fn registration_key(&self, keys: &Keys) -> String {
        keys.node(&self.node)
    }

    /// The puts of the transaction: grant and owned records, node-ID records.
    pub fn puts(&self, keys: &Keys) -> Result<Vec<(String, Vec<u8>)>, ValueError> {
        let mut puts = Vec::new();
        let grant = GrantRecord {
            node: self.node.clone(),
            uid: self.uid.clone(),
            node_revision: self.node_revision,
            granted_ms: self.granted_ms,
        };
        let owned = OwnedRecord {
            node_revision: self.node_revision,
        };
        for c in &self.cidrs {
            puts.push((
                keys.grant(&c.pool, c.family, &c.cidr),
                encode_value(&grant)?,
            ));
            puts.push((
                keys.owned(&self.node, &c.pool, c.family, &c.cidr),
                encode_value(&owned)?,
            ));
        }
        if let Some(id) = self.node_id {
            let record = NodeIdRecord {
                node: self.node.clone(),
                uid: self.uid.clone(),
                node_revision: self.node_revision,
            };
            puts.push((keys.node_id(id), encode_value(&record)?));
            puts.push((
                keys.node_id_of_node(&self.node),
                encode_value(&NodeIdOfNodeRecord { id })?,
            ));
        }
        Ok(puts)
    }
}

/// A grant a node removal deletes and quarantines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedGrant {
    /// The node CIDR.
    pub cidr: NodeCidr,
    /// Its `grants/...` key (deleted).
    pub grant_key: String,
    /// Its `quarantine/...` key (put, on the quarantine lease).
    pub quarantine_key: String,
    /// The grant as it ends (its history record, written with the delete).
    pub ending: crate::history::EndingGrant,
}

/// A node ID a node removal deletes and quarantines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedNodeId {
    /// The node ID.
    pub id: u32,
    /// `nodeids/id/<n>` (deleted, when it names the node).
    pub id_key: Option<String>,
    /// `quarantine-ids/<n>` (put, on the quarantine lease).
    pub quarantine_key: String,
}

/// What removing a node must delete and quarantine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The node.
    pub node: NodeName,
    /// `nodes/<node>` (deleted).
    pub node_key: String,
    /// The node's grants.
    pub grants: Vec<RemovedGrant>,
    /// Every `owned/<node>/...` key seen (deleted).
    pub owned_keys: Vec<String>,
    /// `nodeids/node/<node>` (deleted), if seen.
    pub node_id_of_node_key: Option<String>,
    /// The node's node IDs (normally at most one).
    pub node_ids: Vec<RemovedNodeId>,
    /// Block pools: the node's `demand/` and `release/` keys seen (deleted), whatever their
    /// values.
    pub block_keys: Vec<String>,
}

impl Removal {
    /// Every key to delete.
    pub fn deletes(&self) -> Vec<String> {
        let mut keys = vec![self.node_key.clone()];
        keys.extend(self.grants.iter().map(|g| g.grant_key.clone()));
        keys.extend(self.owned_keys.iter().cloned());
        keys.extend(self.node_id_of_node_key.iter().cloned());
        keys.extend(self.node_ids.iter().filter_map(|n| n.id_key.clone()));
        keys.extend(self.block_keys.iter().cloned());
        keys
    }

    /// Every quarantine key to put.
    pub fn quarantines(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .grants
            .iter()
            .map(|g| g.quarantine_key.clone())
            .collect();
        keys.extend(self.node_ids.iter().map(|n| n.quarantine_key.clone()));
        keys
    }

    /// The value of each quarantine key: `waiting` (not on a lease), so nothing is proposed
    /// there and the quarantine begins only when the node gave it up or was proven gone.
    pub fn quarantine_record(&self, reason: &str, now_ms: u64) -> QuarantineRecord {
        QuarantineRecord {
            from_node: self.node.clone(),
            reason: reason.to_owned(),
            since_ms: now_ms,
            state: crate::keys::QuarantineState::Waiting,
        }
    }
}

/// A quarantine key in state `waiting` (see [`ClusterView::waiting_quarantines`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingQuarantine {
    /// The key.
    pub key: String,
    /// Its mod revision (the leader's compare).
    pub mod_revision: i64,
    /// Its value (`from_node` is the holder).
    pub record: QuarantineRecord,
    /// What it keeps.
    pub held: WaitingOn,
}

/// A quarantine key a node's space is under (see [`ClusterView::quarantines_from`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedFrom {
    /// The pool of a range (`None` for a node ID).
    pub pool: Option<PoolName>,
    /// What it keeps.
    pub held: WaitingOn,
    /// Its value: its state, and since when.
    pub record: QuarantineRecord,
}

/// What a waiting quarantine key keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingOn {
    /// A node CIDR or block.
    Range(IpNet),
    /// A node ID.
    NodeId(u32),
}

/// A registered node as the view knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    /// Its registration record.
    pub record: NodeRecord,
    /// The create revision of `nodes/<node>` (the registration fence).
    pub create_revision: i64,
    /// The mod revision of `nodes/<node>`.
    pub mod_revision: i64,
}

/// One node's holdings, for status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node.
    pub node: NodeName,
    /// Its registration, if seen.
    pub registration: Option<NodeEntry>,
    /// Its node CIDRs.
    pub grants: Vec<NodeCidr>,
    /// Its node ID.
    pub node_id: Option<u32>,
}

/// What a node still lacks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Needs {
    /// Pool and family pairs with no node CIDR for the node.
    pub cidrs: Vec<PoolFamily>,
    /// Whether it lacks a node ID (only when the plan is configured).
    pub node_id: bool,
}

impl Needs {
    /// Whether nothing is lacking.
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty() && !self.node_id
    }
}

#[derive(Debug, Clone)]
struct GrantEntry {
    /// None when the value does not decode: the CIDR is still occupied.
    record: Option<GrantRecord>,
    counted: bool,
    /// The key's create revision (a release handshake names it).
    create_revision: i64,
}

/// A grant to revoke: its node's agent refused it ([`ClusterView::refused_grants`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub node: NodeName,
    /// What it grants, in words: `10.0.1.0/24 of pool default`, `node ID 5`.
    pub what: String,
    /// The keys that make the grant (`grants/` and `owned/`; `node-ids/` and
    /// `node-id-of-node/`), all created by one transaction.
    pub keys: Vec<String>,
    /// Their create revision.
    pub revision: i64,
    /// A node CIDR or block revoked, as it ends (its history record, written with the
    /// delete); `None` for a node ID.
    pub ending: Option<crate::history::EndingGrant>,
}

#[derive(Debug, Clone)]
struct QuarantineEntry {
    counted: bool,
    /// None when the value does not decode (occupied anyway).
    record: Option<QuarantineRecord>,
    mod_revision: i64,
}

#[derive(Debug, Clone)]
struct NodeIdEntry {
    /// None when the value does not decode: the ID is still occupied.
    record: Option<NodeIdRecord>,
    counted: bool,
    /// The key's create revision (a refusal names it).
    create_revision: i64,
}

type CidrKey = (PoolName, Family, IpNet);

/// A kind of key that occupies a node CIDR: how it is named, how its space takes it, and how
/// the problem reads where its pool is not configured.
struct CidrOccupant {
    key: fn(&Keys, &PoolName, Family, &IpNet) -> String,
    occupy: fn(&mut CidrSpace, &IpNet) -> Result<(), SpaceError>,
    kind: &'static str,
    unconfigured_tail: &'static str,
}

const GRANT: CidrOccupant = CidrOccupant {
    key: Keys::grant,
    occupy: CidrSpace::occupy_granted,
    kind: "grant",
    unconfigured_tail: ": held, never granted again",
};

const QUARANTINE: CidrOccupant = CidrOccupant {
    key: Keys::quarantine,
    occupy: CidrSpace::occupy_quarantined,
    kind: "quarantine",
    unconfigured_tail: "",
};

/// A kind of key that occupies a node ID: how it is named, how the ID space takes it, and
/// how it holds the ID (in the problem where no plan is configured).
struct IdOccupant {
    key: fn(&Keys, u32) -> String,
    occupy: fn(&mut NodeIdSpace, u32) -> Result<(), SpaceError>,
    held_as: &'static str,
}

const NODE_ID: IdOccupant = IdOccupant {
    key: Keys::node_id,
    occupy: NodeIdSpace::occupy_granted,
    held_as: "granted",
};

const QUARANTINED_ID: IdOccupant = IdOccupant {
    key: Keys::quarantine_id,
    occupy: NodeIdSpace::occupy_quarantined,
    held_as: "quarantined",
};

/// The operator's cache of one cluster.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// A full read in progress (`for_read_after` to `finish_read`): every key comes once,
    /// so a put has no old value to forget.
    reading: bool,
    keys: Keys,
    config: ClusterConfig,
    nodes: BTreeMap<NodeName, NodeEntry>,
    grants: BTreeMap<CidrKey, GrantEntry>,
    grants_by_node: BTreeMap<NodeName, BTreeSet<CidrKey>>,
    owned: BTreeSet<(NodeName, PoolName, Family, IpNet)>,
    quarantines: BTreeMap<CidrKey, QuarantineEntry>,
    node_ids: BTreeMap<u32, NodeIdEntry>,
    /// The IDs whose `nodeids/id/` record names each node: `node_id_of`'s fallback, found
    /// by node rather than by reading every ID's record.
    node_ids_by_holder: BTreeMap<NodeName, BTreeSet<u32>>,
    node_id_of_node: BTreeMap<NodeName, u32>,
    quarantined_ids: BTreeMap<u32, QuarantineEntry>,
    spaces: BTreeMap<PoolFamily, CidrSpace>,
    id_space: Option<NodeIdSpace>,
    in_flight: BTreeMap<NodeName, Proposal>,
    /// Removals asked for: node → (the request key's mod revision, its record).
    removals: BTreeMap<NodeName, (i64, RemovalRecord)>,
    /// Block pools: each node's last demand report per pool.
    demands: BTreeMap<(NodeName, PoolName), DemandRecord>,
    /// Block pools: open release handshakes → (the key's mod revision, its record).
    releases: BTreeMap<(NodeName, PoolName, Family, IpNet), (i64, ReleaseRecord)>,
    /// Block pools: every `demand/` key seen, whatever its value (a removal deletes them).
    demand_keys: BTreeSet<(NodeName, PoolName)>,
    /// `interfaces/` records: (create revision, mod revision, value if it decodes).
    cloud_interfaces: BTreeMap<(NodeName, CloudId), CloudEntry<CloudInterfaceRecord>>,
    /// Those records by interface ID and address (the check before a record is written).
    cloud_index: crate::cloud::RecordIndex,
    /// `intents/` records.
    cloud_intents: BTreeMap<CloudId, CloudEntry<CloudIntentRecord>>,
    /// `delegations/` keys (to-cloud node-cidr pools), whatever their value.
    delegations: BTreeMap<(NodeName, PoolName, Family, IpNet), CloudEntry<DelegationRecord>>,
    /// Block pools: every `release/` key seen with its mod revision, whatever its value.
    release_keys: BTreeMap<(NodeName, PoolName, Family, IpNet), i64>,
    /// Block proposals in flight, one per node at most.
    block_in_flight: BTreeMap<NodeName, BlockProposal>,
    /// Nodes whose liveness key exists.
    live: BTreeSet<NodeName>,
    /// `silence/<node>` keys: node → mod revision.
    silences: BTreeMap<NodeName, i64>,
    /// `owned/<node>/waiting` records as stored: the leader's last published decision per
    /// node (`None`: a value that does not decode).
    waiting_records: BTreeMap<NodeName, Option<WaitingRecord>>,
    /// `holdings/` records: what each node's agent asserts it holds (a value that does not
    /// decode is reported and the last readable one kept; `record: None` if there is none).
    holdings: BTreeMap<NodeName, CloudEntry<HoldingsRecord>>,
    /// The nodes whose assertion refuses a grant or a node ID: what `refused_grants` looks
    /// at on every turn of the leader, instead of every assertion.
    refusing: BTreeSet<NodeName>,
    /// Held ranges no grant to their holder covers, each blocked (`block_foreign`) in every
    /// space of its family: by node, (pool, family, range).
    held_blocked: BTreeMap<NodeName, BTreeSet<(PoolName, Family, IpNet)>>,
    /// Node IDs an agent serves without holding their grant, each blocked in the ID space.
    held_ids_blocked: BTreeSet<(NodeName, u32)>,
    /// `owned/` keys no grant to their node covers (written around the leader, or their grant
    /// deleted by hand), each blocked in every space of its family: the node's agent takes
    /// such a key up, so its range is not granted to another node meanwhile.
    owned_blocked: BTreeSet<(NodeName, PoolName, Family, IpNet)>,
    /// The mod revision of the `config` key (0 before it was seen), whether its value was
    /// installed or refused: a grant txn compares it, so the view has judged what is stored.
    config_revision: i64,
    /// The mod revision of the `config` key whose value is in force (0: not known).
    installed_revision: i64,
    /// The configuration is not installed yet (a fresh read without a readable
    /// `config-applied`): the stored one is judged against the grants alone.
    provisional: bool,
    /// Why the stored configuration is not in force (refused or unreadable), if it is not.
    config_refusal: Option<String>,
    /// `config-applied` as seen: its mod revision and its configuration (None: unreadable).
    applied: Option<(i64, Option<ClusterConfig>)>,
    problems: Vec<Problem>,
    problems_dropped: u64,
}

impl ClusterView {
    /// An empty view of the cluster of `keys` under `config`.
    pub fn new(keys: Keys, config: ClusterConfig) -> ClusterView {
        let mut view = ClusterView {
            reading: false,
            keys,
            config,
            nodes: BTreeMap::new(),
            grants: BTreeMap::new(),
            grants_by_node: BTreeMap::new(),
            owned: BTreeSet::new(),
            quarantines: BTreeMap::new(),
            node_ids: BTreeMap::new(),
            node_ids_by_holder: BTreeMap::new(),
            node_id_of_node: BTreeMap::new(),
            quarantined_ids: BTreeMap::new(),
            spaces: BTreeMap::new(),
            id_space: None,
            in_flight: BTreeMap::new(),
            removals: BTreeMap::new(),
            demands: BTreeMap::new(),
            releases: BTreeMap::new(),
            demand_keys: BTreeSet::new(),
            cloud_interfaces: BTreeMap::new(),
            cloud_index: Default::default(),
            cloud_intents: BTreeMap::new(),
            delegations: BTreeMap::new(),
            release_keys: BTreeMap::new(),
            block_in_flight: BTreeMap::new(),
            live: BTreeSet::new(),
            silences: BTreeMap::new(),
            waiting_records: BTreeMap::new(),
            holdings: BTreeMap::new(),
            refusing: BTreeSet::new(),
            held_blocked: BTreeMap::new(),
            held_ids_blocked: BTreeSet::new(),
            owned_blocked: BTreeSet::new(),
            config_revision: 0,
            installed_revision: 0,
            provisional: false,
            config_refusal: None,
            applied: None,
            problems: Vec::new(),
            problems_dropped: 0,
        };
        view.rebuild_spaces();
        view
    }

    /// The key layout.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The configuration in force.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Forgets everything seen (before a re-list), keeping the configuration; proposals in
    /// flight are forgotten too (abandoning them later is harmless).
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.grants.clear();
        self.grants_by_node.clear();
        self.owned.clear();
        self.owned_blocked.clear();
        self.quarantines.clear();
        self.node_ids.clear();
        self.node_ids_by_holder.clear();
        self.node_id_of_node.clear();
        self.quarantined_ids.clear();
        self.in_flight.clear();
        self.removals.clear();
        self.demands.clear();
        self.releases.clear();
        self.demand_keys.clear();
        self.cloud_interfaces.clear();
        self.cloud_index = Default::default();
        self.cloud_intents.clear();
        self.release_keys.clear();
        self.block_in_flight.clear();
        self.live.clear();
        self.silences.clear();
        self.waiting_records.clear();
        self.holdings.clear();
        self.refusing.clear();
        self.rebuild_spaces();
    }

    fn problem(&mut self, key: &str, revision: i64, message: String) {
        if self.problems.len() >= MAX_PROBLEMS {
            self.problems.remove(0);
            self.problems_dropped += 1;
        }
        self.problems.push(Problem {
            key: key.chars().take(300).collect(),
            revision,
            message,
        });
    }

    /// Problems met while applying events (the newest `MAX_PROBLEMS`).
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// How many older problems were dropped.
    pub fn problems_dropped(&self) -> u64 {
        self.problems_dropped
    }

    /// Empties the problem list.
    pub fn take_problems(&mut self) -> Vec<Problem> {
        std::mem::take(&mut self.problems)
    }

    /// Fresh spaces from the configuration, with every recorded grant, quarantine and node ID
    /// occupied again (a record refused now is reported).
    fn rebuild_spaces(&mut self) {
        self.spaces.clear();
        // A cloud pool's space is the cloud's: the view keeps none for it.
        for pool in self.config.pools.iter().filter(|p| !p.is_cloud()) {
            for (family, config) in pool.families() {
                self.spaces.insert(
                    (pool.name.clone(), family),
                    CidrSpace::from_config(family, config),
                );
            }
        }
        self.id_space = self
            .config
            .node_ids
            .as_ref()
            .map(|plan| NodeIdSpace::new(plan.max_node_id()));
        self.in_flight.clear();
        self.block_in_flight.clear();
        let grants: Vec<CidrKey> = self.grants.keys().cloned().collect();
        for key in grants {
            let counted = self.occupy_cidr(&GRANT, &key, 0);
            if let Some(entry) = self.grants.get_mut(&key) {
                entry.counted = counted;
            }
        }
        let quarantines: Vec<CidrKey> = self.quarantines.keys().cloned().collect();
        for key in quarantines {
            let counted = self.occupy_cidr(&QUARANTINE, &key, 0);
            if let Some(entry) = self.quarantines.get_mut(&key) {
                entry.counted = counted;
            }
        }
        let ids: Vec<u32> = self.node_ids.keys().copied().collect();
        for id in ids {
            let counted = self.occupy_id(&NODE_ID, id, 0);
            if let Some(entry) = self.node_ids.get_mut(&id) {
                entry.counted = counted;
            }
        }
        let ids: Vec<u32> = self.quarantined_ids.keys().copied().collect();
        for id in ids {
            let counted = self.occupy_id(&QUARANTINED_ID, id, 0);
            if let Some(entry) = self.quarantined_ids.get_mut(&id) {
                entry.counted = counted;
            }
        }
        // The spaces are new: nothing held is blocked in them yet.
        self.held_blocked.clear();
        self.held_ids_blocked.clear();
        let holders: Vec<NodeName> = self.holdings.keys().cloned().collect();
        for node in holders {
            self.refresh_holdings(&node);
        }
        for key in std::mem::take(&mut self.owned_blocked) {
            self.refresh_owned(&key);
        }
    }

    /// Blocks the range of the `owned/` key `key` in every space of its family while it exists
    /// and no grant to its node covers it, and unblocks it once one does or the key is gone.
    fn refresh_owned(&mut self, key: &(NodeName, PoolName, Family, IpNet)) {
        let (node, pool, family, cidr) = key;
        let uncovered = self.owned.contains(key)
            && self.grant_holder(&(pool.clone(), *family, *cidr)) != Some(node);
        if uncovered == self.owned_blocked.contains(key) {
            return;
        }
        if uncovered {
            self.owned_blocked.insert(key.clone());
            self.block_everywhere(*family, cidr);
        } else {
            self.owned_blocked.remove(key);
            self.unblock_everywhere(*family, cidr);
        }
    }

    /// Whether a grant to `node` of exactly `range` is counted in its pool's space (then the
    /// grant blocks the range, and the assertion needs no block of its own).
    fn grant_covers(&self, node: &NodeName, pool: &PoolName, range: &HeldRange) -> bool {
        self.grants
            .get(&(pool.clone(), range.family(), range.cidr))
            .is_some_and(|g| g.counted && g.record.as_ref().is_some_and(|r| &r.node == node))
    }

    /// [`Self::refresh_holdings`] for `node` if it asserts holdings (a key naming it changed).
    fn refresh_asserted_holdings(&mut self, node: Option<&NodeName>) {
        if let Some(node) = node
            && self.holdings.contains_key(node)
        {
            self.refresh_holdings(node);
        }
    }

    /// Makes the blocks of `node`'s assertions match its record and its grants: a held range
    /// no grant to the node covers is blocked in every space of its family (whatever pool it
    /// names: a pool renamed around the CLI still finds its space occupied), a node ID the
    /// node serves without its grant is blocked in the ID space.
    fn refresh_holdings(&mut self, node: &NodeName) {
        for (_, family, cidr) in self.held_blocked.remove(node).unwrap_or_default() {
            self.unblock_everywhere(family, &cidr);
        }
        let stale_ids: Vec<(NodeName, u32)> = self
            .held_ids_blocked
            .range((node.clone(), 0)..)
            .take_while(|(n, _)| n == node)
            .cloned()
            .collect();
        for entry in stale_ids {
            if let Some(space) = self.id_space.as_mut() {
                space.unblock_held(entry.1);
            }
            self.held_ids_blocked.remove(&entry);
        }
        let Some(record) = self.holdings.get(node).and_then(|e| e.record.clone()) else {
            return;
        };
        for range in &record.ranges {
            if self.grant_covers(node, &range.pool, range) {
                continue;
            }
            let family = range.family();
            let entry = (range.pool.clone(), family, range.cidr);
            if !self
                .held_blocked
                .entry(node.clone())
                .or_default()
                .insert(entry)
            {
                continue;
            }
            self.block_everywhere(family, &range.cidr);
        }
        for id in record.node_ids() {
            if !self.id_grant_covers(node, id)
                && self.held_ids_blocked.insert((node.clone(), id))
                && let Some(space) = self.id_space.as_mut()
            {
                space.block_held(id);
            }
        }
    }

    /// Whether `nodeids/id/<id>`, naming `node`, is counted in the ID space (then the grant
    /// blocks the ID, and the assertion needs no block of its own). Only that key occupies
    /// the ID: a `nodeids/node/<node>` index naming it (its `nodeids/id/` key deleted by hand)
    /// does not, so the ID stays blocked for the node serving it.
    fn id_grant_covers(&self, node: &NodeName, id: u32) -> bool {
        self.node_ids
            .get(&id)
            .is_some_and(|e| e.counted && e.record.as_ref().is_some_and(|r| &r.node == node))
    }

    /// The holder named by a grant key's entry, if its value decodes.
    fn grant_holder(&self, key: &CidrKey) -> Option<&NodeName> {
        self.grants
            .get(key)
            .and_then(|g| g.record.as_ref())
            .map(|r| &r.node)
    }

    /// Blocks `cidr` in every space of its family (a grant or quarantine its pool's space
    /// cannot count, or of a pool and family not configured: held all the same, never granted
    /// to anyone else).
    fn block_everywhere(&mut self, family: Family, cidr: &IpNet) {
        for ((_, f), space) in self.spaces.iter_mut() {
            if *f == family {
                space.block_foreign(cidr);
            }
        }
    }

    /// Undoes `block_everywhere`.
    fn unblock_everywhere(&mut self, family: Family, cidr: &IpNet) {
        for ((_, f), space) in self.spaces.iter_mut() {
            if *f == family {
                space.unblock_foreign(cidr);
            }
        }
    }

    /// Occupies the CIDR of `id` in its pool's space as `occupant` says, and reports what
    /// the key could not occupy.
    fn occupy_cidr(&mut self, occupant: &CidrOccupant, id: &CidrKey, revision: i64) -> bool {
        let (pool, family, cidr) = id;
        let space_key = (pool.clone(), *family);
        if !self.spaces.contains_key(&space_key) {
            self.block_everywhere(*family, cidr);
        }
        let result = match self.spaces.get_mut(&space_key) {
            None => Err(format!(
                "{} in pool {pool} {}, which is not configured{}",
                occupant.kind,
                family.name(),
                occupant.unconfigured_tail
            )),
            Some(space) => (occupant.occupy)(space, cidr).map_err(|e| e.to_string()),
        };
        if result.is_err() && self.spaces.contains_key(&space_key) {
            // Not counted, but its addresses stay blocked while the key exists, in every space
            // of its family: a key outside its pool's CIDRs (written by hand) may lie in
            // another pool's.
            self.block_everywhere(*family, cidr);
        }
        // The key is written only for a problem (a rebuild occupies every grant).
        self.report(
            |keys| (occupant.key)(keys, pool, *family, cidr),
            revision,
            result,
        )
    }

    /// Occupies node ID `id` as `occupant` says, and reports what the key could not occupy.
    fn occupy_id(&mut self, occupant: &IdOccupant, id: u32, revision: i64) -> bool {
        let result = match self.id_space.as_mut() {
            None => Err(format!(
                "node ID {} but no node_ids plan is configured",
                occupant.held_as
            )),
            Some(space) => (occupant.occupy)(space, id).map_err(|e| e.to_string()),
        };
        self.report(|keys| (occupant.key)(keys, id), revision, result)
    }

    fn report(
        &mut self,
        key: impl FnOnce(&Keys) -> String,
        revision: i64,
        result: Result<(), String>,
    ) -> bool {
        match result {
            Ok(()) => true,
            Err(message) => {
                let key = key(&self.keys);
                self.problem(&key, revision, message);
                false
            }
        }
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &mut self,
        key: &str,
        revision: i64,
        value: &[u8],
    ) -> Option<T> {
        match decode_value(value) {
            Ok(record) => Some(record),
            Err(e) => {
                self.problem(key, revision, e.to_string());
                None
            }
        }
    }

    /// Applies a put seen in etcd (from a range read or a watch).
    pub fn apply_put(&mut self, key: &str, value: &[u8], create_revision: i64, mod_revision: i64) {
        let parsed = match self.keys.parse(key) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.problem(key, mod_revision, e.to_string());
                return;
            }
        };
        // A put replaces what the key held: forget the old value first (an assertion of
        // holdings is replaced in its own arm: one that does not decode keeps the last).
        if !self.reading && !matches!(parsed, Key::Holdings { .. }) {
            self.forget(&parsed);
        }
        match parsed {
            Key::Schema => {
                if let Some(record) = self.decode::<SchemaRecord>(key, mod_revision, value)
                    && record.version != SCHEMA_VERSION
                {
                    self.problem(
                        key,
                        mod_revision,
                        format!(
                            "cluster schema is {}, this build knows {SCHEMA_VERSION}",
                            record.version
                        ),
                    );
                }
            }
            Key::Config => self.offer_config(key, value, mod_revision),
            Key::ConfigApplied => {
                // Decoding checks the configuration: one that breaks a rule does not decode.
                let applied = self
                    .decode::<AppliedConfigRecord>(key, mod_revision, value)
                    .map(|record| record.config);
                self.applied = Some((mod_revision, applied));
            }
            // The census is the agents' to read: the leader counts registrations itself.
            Key::Election { .. } | Key::Recover | Key::Reassert | Key::Census => {}
            Key::Live { node } => {
                self.live.insert(node);
            }
            Key::Node { node } => {
                if let Some(record) = self.decode::<NodeRecord>(key, mod_revision, value) {
                    self.nodes.insert(
                        node,
                        NodeEntry {
                            record,
                            create_revision,
                            mod_revision,
                        },
                    );
                }
            }
            Key::Grant { pool, family, cidr } => {
                // A grant key blocks its CIDR whatever its value: a garbage value is reported
                // and the CIDR occupied anyway (the txn's silence compare would fail on it).
                let record = self.decode::<GrantRecord>(key, mod_revision, value);
                let id = (pool, family, cidr);
                let counted = self.occupy_cidr(&GRANT, &id, mod_revision);
                if let Some(record) = &record {
                    self.grants_by_node
                        .entry(record.node.clone())
                        .or_default()
                        .insert(id.clone());
                }
                // Only a holder with an assertion is refreshed (in a rebuild, none yet: the
                // holdings are read after the grants).
                let holder = record
                    .as_ref()
                    .filter(|r| self.holdings.contains_key(&r.node))
                    .map(|r| r.node.clone());
                // A grant covers its node's `owned/` key: unblocked if it was blocked (none is in
                // a running cluster, nor in a rebuild, which reads the grants first).
                let owner = record
                    .as_ref()
                    .filter(|_| !self.owned_blocked.is_empty())
                    .map(|r| r.node.clone());
                self.grants.insert(
                    id.clone(),
                    GrantEntry {
                        record,
                        counted,
                        create_revision,
                    },
                );
                self.refresh_asserted_holdings(holder.as_ref());
                if let Some(owner) = owner {
                    let (pool, family, cidr) = id;
                    self.refresh_owned(&(owner, pool, family, cidr));
                }
            }
            Key::Owned {
                node,
                pool,
                family,
                cidr,
            } => {
                // Held whatever its value, as a grant: the node's agent takes an `owned/` key
                // up without reading it (a garbage value is reported).
                let _ = self.decode::<OwnedRecord>(key, mod_revision, value);
                let owned = (node, pool, family, cidr);
                self.owned.insert(owned.clone());
                self.refresh_owned(&owned);
            }
            Key::Quarantine { pool, family, cidr } => {
                // A quarantine key blocks reuse whatever its value: a garbage value is
                // reported and the CIDR occupied anyway.
                let record = self.decode::<QuarantineRecord>(key, mod_revision, value);
                let id = (pool, family, cidr);
                let counted = self.occupy_cidr(&QUARANTINE, &id, mod_revision);
                self.quarantines.insert(
                    id,
                    QuarantineEntry {
                        counted,
                        record,
                        mod_revision,
                    },
                );
            }
            Key::NodeId { id } => {
                // Occupied whatever its value, as grants.
                let record = self.decode::<NodeIdRecord>(key, mod_revision, value);
                let counted = self.occupy_id(&NODE_ID, id, mod_revision);
                let holder = record.as_ref().map(|r| r.node.clone());
                if let Some(holder) = &holder {
                    self.node_ids_by_holder
                        .entry(holder.clone())
                        .or_default()
                        .insert(id);
                }
                self.node_ids.insert(
                    id,
                    NodeIdEntry {
                        record,
                        counted,
                        create_revision,
                    },
                );
                // The node's ID may have changed (`node_id_of` falls back on this key).
                self.refresh_asserted_holdings(holder.as_ref());
            }
            Key::NodeIdOfNode { node } => {
                if let Some(record) = self.decode::<NodeIdOfNodeRecord>(key, mod_revision, value) {
                    self.node_id_of_node.insert(node.clone(), record.id);
                }
                self.refresh_asserted_holdings(Some(&node));
            }
            Key::Waiting { node } => {
                let record = self.decode::<WaitingRecord>(key, mod_revision, value);
                self.waiting_records.insert(node, record);
            }
            Key::Removal { node } => {
                if let Some(record) = self.decode::<RemovalRecord>(key, mod_revision, value) {
                    self.removals.insert(node, (mod_revision, record));
                }
            }
            Key::Demand { node, pool } => {
                self.demand_keys.insert((node.clone(), pool.clone()));
                if let Some(record) = self.decode::<DemandRecord>(key, mod_revision, value) {
                    self.demands.insert((node, pool), record);
                }
            }
            Key::Release {
                node,
                pool,
                family,
                cidr,
            } => {
                self.release_keys
                    .insert((node.clone(), pool.clone(), family, cidr), mod_revision);
                if let Some(record) = self.decode::<ReleaseRecord>(key, mod_revision, value) {
                    self.releases
                        .insert((node, pool, family, cidr), (mod_revision, record));
                }
            }
            Key::CloudInterface { node, interface } => {
                let record = self.decode::<CloudInterfaceRecord>(key, mod_revision, value);
                if let Some(old) = self
                    .cloud_interfaces
                    .get(&(node.clone(), interface.clone()))
                {
                    self.cloud_index
                        .remove(&node, &interface, old.record.as_ref());
                }
                self.cloud_index.insert(&node, &interface, record.as_ref());
                self.cloud_interfaces.insert(
                    (node, interface),
                    CloudEntry {
                        create_revision,
                        mod_revision,
                        record,
                    },
                );
            }
            Key::CloudIntent { id } => {
                let record = self.decode::<CloudIntentRecord>(key, mod_revision, value);
                self.cloud_intents.insert(
                    id,
                    CloudEntry {
                        create_revision,
                        mod_revision,
                        record,
                    },
                );
            }
            Key::Delegation {
                node,
                pool,
                family,
                cidr,
            } => {
                let record = self.decode::<DelegationRecord>(key, mod_revision, value);
                self.delegations.insert(
                    (node, pool, family, cidr),
                    CloudEntry {
                        create_revision,
                        mod_revision,
                        record,
                    },
                );
            }
            Key::Holdings { node } => {
                // A value that does not decode (written around the agent) is reported, and
                // the holder's last readable assertion stays in force: its agent puts its own
                // back when it sees the key changed.
                let record = self
                    .decode::<HoldingsRecord>(key, mod_revision, value)
                    .or_else(|| self.holdings.get(&node).and_then(|e| e.record.clone()));
                if record
                    .as_ref()
                    .is_some_and(|r| !r.refused.is_empty() || r.refused_node_id.is_some())
                {
                    self.refusing.insert(node.clone());
                } else {
                    self.refusing.remove(&node);
                }
                self.holdings.insert(
                    node.clone(),
                    CloudEntry {
                        create_revision,
                        mod_revision,
                        record,
                    },
                );
                self.refresh_holdings(&node);
            }
            Key::QuarantineId { id } => {
                // As for node CIDRs: occupied whatever its value.
                let record = self.decode::<QuarantineRecord>(key, mod_revision, value);
                let counted = self.occupy_id(&QUARANTINED_ID, id, mod_revision);
                self.quarantined_ids.insert(
                    id,
                    QuarantineEntry {
                        counted,
                        record,
                        mod_revision,
                    },
                );
            }
            Key::Silence { node } => {
                self.silences.insert(node, mod_revision);
            }
            // The grants' history is read by its readers, never by the view.
            Key::History { .. } => {}
        }
    }

    /// Applies a delete seen in etcd (a deleted or expired key).
    pub fn apply_delete(&mut self, key: &str, mod_revision: i64) {
        match self.keys.parse(key) {
            Ok(parsed) => self.forget(&parsed),
            Err(e) => self.problem(key, mod_revision, e.to_string()),
        }
    }

    /// Forgets what a key held (nothing if it held nothing).
    fn forget(&mut self, key: &Key) {
        match key {
            Key::Schema
            | Key::Config
            | Key::Election { .. }
            | Key::Recover
            | Key::Reassert
            | Key::Census
            | Key::History { .. } => {}
            Key::ConfigApplied => self.applied = None,
            Key::Holdings { node } => {
                self.refusing.remove(node);
                if self.holdings.remove(node).is_some() {
                    self.refresh_holdings(node);
                }
            }
            Key::Live { node } => {
                self.live.remove(node);
            }
            Key::Removal { node } => {
                self.removals.remove(node);
            }
            Key::Waiting { node } => {
                self.waiting_records.remove(node);
            }
            Key::Silence { node } => {
                self.silences.remove(node);
            }
            Key::CloudInterface { node, interface } => {
                if let Some(old) = self
                    .cloud_interfaces
                    .remove(&(node.clone(), interface.clone()))
                {
                    self.cloud_index
                        .remove(node, interface, old.record.as_ref());
                }
            }
            Key::CloudIntent { id } => {
                self.cloud_intents.remove(id);
            }
            Key::Delegation {
                node,
                pool,
                family,
                cidr,
            } => {
                self.delegations
                    .remove(&(node.clone(), pool.clone(), *family, *cidr));
            }
            Key::Demand { node, pool } => {
                self.demands.remove(&(node.clone(), pool.clone()));
                self.demand_keys.remove(&(node.clone(), pool.clone()));
            }
            Key::Release {
                node,
                pool,
                family,
                cidr,
            } => {
                let id = (node.clone(), pool.clone(), *family, *cidr);
                self.releases.remove(&id);
                self.release_keys.remove(&id);
            }
            Key::Node { node } => {
                self.nodes.remove(node);
            }
            Key::Grant { pool, family, cidr } => {
                let id = (pool.clone(), *family, *cidr);
                let holder = self.grant_holder(&id).cloned();
                if let Some(entry) = self.grants.remove(&id) {
                    match self.spaces.get_mut(&(pool.clone(), *family)) {
                        Some(space) if entry.counted => {
                            let _ = space.release_granted(cidr);
                        }
                        _ => self.unblock_everywhere(*family, cidr),
                    }
                    if let Some(record) = &entry.record
                        && let Some(set) = self.grants_by_node.get_mut(&record.node)
                    {
                        set.remove(&id);
                        if set.is_empty() {
                            self.grants_by_node.remove(&record.node);
                        }
                    }
                }
                // A holder that still asserts the range keeps it occupied, as does its `owned/`
                // key while it stays.
                self.refresh_asserted_holdings(holder.as_ref());
                if let Some(holder) = holder {
                    self.refresh_owned(&(holder, pool.clone(), *family, *cidr));
                }
            }
            Key::Owned {
                node,
                pool,
                family,
                cidr,
            } => {
                let owned = (node.clone(), pool.clone(), *family, *cidr);
                self.owned.remove(&owned);
                self.refresh_owned(&owned);
            }
            Key::Quarantine { pool, family, cidr } => {
                if let Some(entry) = self.quarantines.remove(&(pool.clone(), *family, *cidr)) {
                    match self.spaces.get_mut(&(pool.clone(), *family)) {
                        Some(space) if entry.counted => {
                            let _ = space.release_quarantined(cidr);
                        }
                        _ => self.unblock_everywhere(*family, cidr),
                    }
                }
            }
            Key::NodeId { id } => {
                let holder = self
                    .node_ids
                    .get(id)
                    .and_then(|e| e.record.as_ref())
                    .map(|r| r.node.clone());
                if let Some(holder) = &holder {
                    self.forget_id_holder(holder, *id);
                }
                if let Some(entry) = self.node_ids.remove(id)
                    && entry.counted
                    && let Some(space) = self.id_space.as_mut()
                {
                    let _ = space.release_granted(*id);
                }
                // A holder that still serves the ID keeps it occupied (`nodeids/node/<node>`
                // may be gone already: a removal deletes it first).
                self.refresh_asserted_holdings(holder.as_ref());
            }
            Key::NodeIdOfNode { node } => {
                self.node_id_of_node.remove(node);
                self.refresh_asserted_holdings(Some(node));
            }
            Key::QuarantineId { id } => {
                if let Some(entry) = self.quarantined_ids.remove(id)
                    && entry.counted
                    && let Some(space) = self.id_space.as_mut()
                {
                    let _ = space.release_quarantined(*id);
                }
            }
        }
    }

    /// The registered nodes.
    pub fn nodes(&self) -> impl Iterator<Item = (&NodeName, &NodeEntry)> {
        self.nodes.iter()
    }

    /// The node's node CIDRs (grants naming it).
    pub fn grants_of(&self, node: &NodeName) -> Vec<NodeCidr> {
        self.grants_by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|(pool, family, cidr)| NodeCidr {
                pool: pool.clone(),
                family: *family,
                cidr: *cidr,
            })
            .collect()
    }

    /// The grants held (whose records decoded) as history events, the newest `limit` by
    /// grant time ([`crate::history::newest_first`]): the held half of the history's newest
    /// events, from memory instead of a read of every `grants/` key.
    pub fn held_events(&self, limit: usize) -> Vec<crate::history::HistoryEvent> {
        let mut events: Vec<_> = self
            .grants
            .iter()
            .filter_map(|((pool, _, cidr), grant)| {
                grant
                    .record
                    .as_ref()
                    .map(|record| crate::history::HistoryEvent::held(pool, cidr, record))
            })
            .collect();
        crate::history::newest_first(&mut events, limit);
        events
    }

    /// The `grants/` value of a node CIDR or block, if granted and it decoded.
    pub fn grant_record(
        &self,
        pool: &PoolName,
        family: Family,
        cidr: &IpNet,
    ) -> Option<&GrantRecord> {
        self.grants
            .get(&(pool.clone(), family, *cidr))
            .and_then(|g| g.record.as_ref())
    }

    /// The grant of a node CIDR or block as it ends (its history record's makings), if the
    /// view knows it granted to `node`.
    pub fn ending_grant(
        &self,
        node: &NodeName,
        pool: &PoolName,
        family: Family,
        cidr: &IpNet,
    ) -> crate::history::EndingGrant {
        crate::history::EndingGrant {
            pool: pool.clone(),
            cidr: *cidr,
            node: node.clone(),
            record: self.grant_record(pool, family, cidr).cloned(),
        }
    }

    /// The node's node ID (from `nodeids/node/<node>`, else a `nodeids/id/<n>` naming it).
    pub fn node_id_of(&self, node: &NodeName) -> Option<u32> {
        self.node_id_of_node.get(node).copied().or_else(|| {
            self.node_ids_by_holder
                .get(node)
                .and_then(|ids| ids.first().copied())
        })
    }

    /// Drops `id` from the IDs whose record names `node`.
    fn forget_id_holder(&mut self, node: &NodeName, id: u32) {
        if let Some(ids) = self.node_ids_by_holder.get_mut(node) {
            ids.remove(&id);
            if ids.is_empty() {
                self.node_ids_by_holder.remove(node);
            }
        }
    }

    /// Whether `pool` is a block-mode pool (its grants follow demand, not [`Self::needs`]).
    pub fn is_block_pool(&self, pool: &PoolName) -> bool {
        self.config.pool(pool).is_some_and(|p| p.is_blocks())
    }

    /// The `interfaces/` records of one node, by interface ID (a value that does not decode is
    /// `record: None`, and was reported).
    pub fn cloud_interfaces_of(
        &self,
        node: &NodeName,
    ) -> impl Iterator<Item = (&CloudId, &CloudEntry<CloudInterfaceRecord>)> {
        self.cloud_interfaces
            .range((node.clone(), CloudId::min())..)
            .take_while(move |((n, _), _)| n == node)
            .map(|((_, id), entry)| (id, entry))
    }

    /// Every `interfaces/` record, by node and interface ID.
    pub fn cloud_interfaces(
        &self,
    ) -> impl Iterator<Item = (&(NodeName, CloudId), &CloudEntry<CloudInterfaceRecord>)> {
        self.cloud_interfaces.iter()
    }

    /// Every `holdings/` record: what each node's agent asserts it holds.
    pub fn holdings(&self) -> impl Iterator<Item = (&NodeName, &CloudEntry<HoldingsRecord>)> {
        self.holdings.iter()
    }

    /// What `node`'s agent asserts it holds, if it has a record.
    pub fn holdings_of(&self, node: &NodeName) -> Option<&CloudEntry<HoldingsRecord>> {
        self.holdings.get(node)
    }

    /// Held ranges that no grant to their holder covers (a holding without a grant: the node
    /// was removed while alive, etcd forgot the grant, or the pool was renamed): occupied,
    /// never proposed, and reported until adopted back or given up. By node, pool, range.
    pub fn uncovered_holdings(&self) -> Vec<(NodeName, PoolName, IpNet)> {
        self.held_blocked
            .iter()
            .flat_map(|(node, held)| {
                held.iter()
                    .map(move |(pool, _, cidr)| (node.clone(), pool.clone(), *cidr))
            })
            .collect()
    }

    /// Node IDs a node's agent serves without holding their grant: (node, ID).
    pub fn uncovered_node_ids(&self) -> Vec<(NodeName, u32)> {
        self.held_ids_blocked.iter().cloned().collect()
    }

    /// Grants their node's agent refused (`HoldingsRecord::refused`: made before the highest
    /// revision it had seen, of space it does not hold: etcd handed back a grant it had given
    /// up), still standing as refused (same node, same create revision): the leader revokes
    /// them. By node.
    pub fn refused_grants(&self) -> Vec<Revocation> {
        let mut revocations = Vec::new();
        for node in &self.refusing {
            let Some(record) = self.holdings.get(node).and_then(|e| e.record.as_ref()) else {
                continue;
            };
            for refused in &record.refused {
                let family = match refused.cidr {
                    IpNet::V4(_) => Family::V4,
                    IpNet::V6(_) => Family::V6,
                };
                let key = (refused.pool.clone(), family, refused.cidr);
                let standing = self.grants.get(&key).is_some_and(|grant| {
                    grant.create_revision == refused.grant_revision
                        && grant.record.as_ref().is_some_and(|r| &r.node == node)
                });
                if standing {
                    revocations.push(Revocation {
                        node: node.clone(),
                        what: format!("{} of pool {}", refused.cidr, refused.pool),
                        keys: vec![
                            self.keys.grant(&refused.pool, family, &refused.cidr),
                            self.keys.owned(node, &refused.pool, family, &refused.cidr),
                        ],
                        revision: refused.grant_revision,
                        ending: Some(self.ending_grant(node, &refused.pool, family, &refused.cidr)),
                    });
                }
            }
            if let Some(refused) = record.refused_node_id {
                let standing = self.node_ids.get(&refused.id).is_some_and(|entry| {
                    entry.create_revision == refused.revision
                        && entry.record.as_ref().is_some_and(|r| &r.node == node)
                });
                if standing {
                    revocations.push(Revocation {
                        node: node.clone(),
                        what: format!("node ID {}", refused.id),
                        keys: vec![
                            self.keys.node_id(refused.id),
                            self.keys.node_id_of_node(node),
                        ],
                        revision: refused.revision,
                        ending: None,
                    });
                }
            }
        }
        revocations
    }

    /// The records that may stand against writing `record` as `interface` (same interface ID,
    /// or a net that may overlap one of its nets): a superset of what
    /// [`crate::cloud::record_conflicts`] finds among all records, from an index.
    pub fn cloud_record_candidates<'a>(
        &'a self,
        interface: &CloudId,
        record: &CloudInterfaceRecord,
    ) -> impl Iterator<Item = (&'a NodeName, &'a CloudId, &'a CloudInterfaceRecord)> + 'a {
        self.cloud_index
            .candidates(interface, record)
            .into_iter()
            .filter_map(move |key| {
                let (key, entry) = self.cloud_interfaces.get_key_value(&key)?;
                Some((&key.0, &key.1, entry.record.as_ref()?))
            })
    }

    /// Every `intents/` record, by ID.
    pub fn cloud_intents(
        &self,
    ) -> impl Iterator<Item = (&CloudId, &CloudEntry<CloudIntentRecord>)> {
        self.cloud_intents.iter()
    }

    /// Every `delegations/` key (to-cloud pools: node CIDRs corral delegated in the cloud), by
    /// node, pool, family and CIDR (a value that does not decode is `record: None`).
    pub fn delegations(
        &self,
    ) -> impl Iterator<
        Item = (
            &(NodeName, PoolName, Family, IpNet),
            &CloudEntry<DelegationRecord>,
        ),
    > {
        self.delegations.iter()
    }

    /// Whether `pool` is a cloud pool (its addresses come from cloud interfaces).
    pub fn is_cloud_pool(&self, pool: &PoolName) -> bool {
        self.config.pool(pool).is_some_and(|p| p.is_cloud())
    }

    /// A node's last demand report in a block pool.
    pub fn demand(&self, node: &NodeName, pool: &PoolName) -> Option<&DemandRecord> {
        self.demands.get(&(node.clone(), pool.clone()))
    }

    /// Every demand report, by node and pool.
    pub fn demands(&self) -> impl Iterator<Item = (&(NodeName, PoolName), &DemandRecord)> {
        self.demands.iter()
    }

    /// The open release handshakes of one node: (pool, family, block) → (mod revision,
    /// record).
    pub fn releases_of(
        &self,
        node: &NodeName,
    ) -> impl Iterator<Item = (&(NodeName, PoolName, Family, IpNet), &(i64, ReleaseRecord))> {
        let node = node.clone();
        // Open handshakes are few (excess blocks waiting for an answer): a filter is enough.
        self.releases.iter().filter(move |((n, ..), _)| *n == node)
    }

    /// Every open release handshake.
    pub fn releases(
        &self,
    ) -> impl Iterator<Item = (&(NodeName, PoolName, Family, IpNet), &(i64, ReleaseRecord))> {
        self.releases.iter()
    }

    /// What a registered node still lacks under the configuration.
    pub fn needs(&self, node: &NodeName) -> Needs {
        let held: BTreeSet<PoolFamily> = self
            .grants_by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|(pool, family, _)| (pool.clone(), *family))
            .collect();
        let cidrs = self
            .spaces
            .keys()
            // Block pools follow demand; from-cloud pools take what the cloud delegated.
            .filter(|pf| {
                !held.contains(*pf) && !self.is_block_pool(&pf.0) && !self.is_from_cloud_pool(&pf.0)
            })
            .cloned()
            .collect();
        let node_id = self.id_space.is_some() && self.node_id_of(node).is_none();
        Needs { cidrs, node_id }
    }

    /// Whether the view saw `node` hold a grant or an `owned/` key of `pool`, in any family.
    fn holds_in_pool(&self, node: &NodeName, pool: &PoolName) -> bool {
        let granted = self
            .grants_by_node
            .get(node)
            .is_some_and(|held| held.iter().any(|(p, ..)| p == pool));
        granted
            || self
                .owned
                .range((node.clone(), pool.clone(), Family::V4, IpNet::default())..)
                .next()
                .is_some_and(|(n, p, ..)| n == node && p == pool)
    }

    /// Registered nodes that lack a node CIDR of some configured pool and family, or a node ID
    /// when the plan is configured, and have no proposal in flight.
    pub fn nodes_needing_grants(&self) -> Vec<NodeName> {
        self.nodes
            .keys()
            .filter(|node| !self.in_flight.contains_key(*node) && !self.needs(node).is_empty())
            .cloned()
            .collect()
    }

    /// Proposes what `node` lacks, lowest free first, all or nothing, and marks it in flight so
    /// no other proposal picks the same.
    pub fn propose(&mut self, node: &NodeName) -> Result<Proposal, ProposeError> {
        self.propose_at(node, None)
    }

    /// [`Self::propose`], its grants stamped `granted_ms` (the leader's; the history's start).
    pub fn propose_at(
        &mut self,
        node: &NodeName,
        granted_ms: Option<u64>,
    ) -> Result<Proposal, ProposeError> {
        let Some(entry) = self.nodes.get(node) else {
            return Err(ProposeError::UnknownNode { node: node.clone() });
        };
        if self.in_flight.contains_key(node) {
            return Err(ProposeError::InFlight { node: node.clone() });
        }
        let needs = self.needs(node);
        if needs.is_empty() {
            return Err(ProposeError::NothingNeeded { node: node.clone() });
        }
        // Choose everything before marking anything.
        let mut cidrs = Vec::new();
        for (pool, family) in &needs.cidrs {
            let free = self
                .spaces
                .get(&(pool.clone(), *family))
                .and_then(CidrSpace::lowest_free);
            let Some(cidr) = free else {
                return Err(ProposeError::Full {
                    pool: pool.clone(),
                    family: *family,
                });
            };
            cidrs.push(NodeCidr {
                pool: pool.clone(),
                family: *family,
                cidr,
            });
        }
        let mut node_id = None;
        if needs.node_id {
            let space = self.id_space.as_ref();
            match space.and_then(NodeIdSpace::lowest_free) {
                Some(id) => node_id = Some(id),
                None => {
                    return Err(ProposeError::NodeIdsFull {
                        max: space.map_or(0, NodeIdSpace::max),
                    });
                }
            }
        }
        let mut empty_pools: Vec<PoolName> = Vec::new();
        for c in &cidrs {
            if !empty_pools.contains(&c.pool) && !self.holds_in_pool(node, &c.pool) {
                empty_pools.push(c.pool.clone());
            }
        }
        let proposal = Proposal {
            node: node.clone(),
            uid: entry.record.uid.clone(),
            node_revision: entry.create_revision,
            cidrs,
            node_id,
            granted_ms,
            empty_pools,
        };
        for c in &proposal.cidrs {
            if let Some(space) = self.spaces.get_mut(&(c.pool.clone(), c.family)) {
                // Chosen free above, in distinct spaces: marking cannot fail.
                let _ = space.propose(&c.cidr);
            }
        }
        if let (Some(id), Some(space)) = (proposal.node_id, self.id_space.as_mut()) {
            let _ = space.propose(id);
        }
        self.in_flight.insert(node.clone(), proposal.clone());
        Ok(proposal)
    }

    /// Un-marks a proposal (after its commit or its failure); harmless if already forgotten.
    pub fn abandon(&mut self, proposal: &Proposal) {
        if self.in_flight.get(&proposal.node) != Some(proposal) {
            return;
        }
        self.in_flight.remove(&proposal.node);
        for c in &proposal.cidrs {
            if let Some(space) = self.spaces.get_mut(&(c.pool.clone(), c.family)) {
                let _ = space.abandon(&c.cidr);
            }
        }
        if let (Some(id), Some(space)) = (proposal.node_id, self.id_space.as_mut()) {
            let _ = space.abandon(id);
        }
    }

    /// Marks a proposal committed at `revision`: what its transaction wrote is applied at once
    /// (the watch delivers the same puts later, which changes nothing), so the next proposal
    /// builds on it even before the watch catches up.
    pub fn commit(&mut self, proposal: &Proposal, revision: i64) {
        self.abandon(proposal);
        match proposal.puts(&self.keys) {
            Ok(puts) => {
                for (key, value) in puts {
                    self.apply_put(&key, &value, revision, revision);
                }
            }
            Err(e) => self.problem(&self.keys.node(&proposal.node), revision, e.to_string()),
        }
    }

    /// The mod revision of the configuration key as last applied (0 before one was seen);
    /// a grant transaction compares it, so no grant lands under a configuration it did not
    /// see (a reserved range added meanwhile, say).
    pub fn config_revision(&self) -> i64 {
        self.config_revision
    }

    /// Nodes whose removal was asked for and is not done, with the request's mod revision and
    /// record.
    pub fn removals_requested(&self) -> Vec<(NodeName, i64, RemovalRecord)> {
        self.removals
            .iter()
            .filter(|(_, (_, record))| record.phase.is_requested())
            .map(|(node, (revision, record))| (node.clone(), *revision, record.clone()))
            .collect()
    }

    /// Every `removals/` record (any phase): node → (its mod revision, the record).
    pub fn removals(&self) -> &BTreeMap<NodeName, (i64, RemovalRecord)> {
        &self.removals
    }

    /// The mod revision of `silence/<node>`, if it exists.
    pub fn silence_of(&self, node: &NodeName) -> Option<i64> {
        self.silences.get(node).copied()
    }

    /// Every quarantine key in state `waiting` (a removed node may still serve from it):
    /// node CIDRs and blocks as `(node, key, mod revision, record, range)`, node IDs with
    /// `range: None` and the ID.
    pub fn waiting_quarantines(&self) -> Vec<WaitingQuarantine> {
        let waiting = |e: &QuarantineEntry| {
            e.record
                .clone()
                .filter(|r| r.state == crate::keys::QuarantineState::Waiting)
        };
        let mut out = Vec::new();
        for ((pool, family, cidr), entry) in &self.quarantines {
            if let Some(record) = waiting(entry) {
                out.push(WaitingQuarantine {
                    key: self.keys.quarantine(pool, *family, cidr),
                    mod_revision: entry.mod_revision,
                    record,
                    held: WaitingOn::Range(*cidr),
                });
            }
        }
        for (id, entry) in &self.quarantined_ids {
            if let Some(record) = waiting(entry) {
                out.push(WaitingQuarantine {
                    key: self.keys.quarantine_id(*id),
                    mod_revision: entry.mod_revision,
                    record,
                    held: WaitingOn::NodeId(*id),
                });
            }
        }
        out
    }

    /// Every quarantine key whose record names `node` as the space's holder, in either state
    /// (`corral node show` of a removed node): what it held that is not free again yet.
    pub fn quarantines_from(&self, node: &NodeName) -> Vec<QuarantinedFrom> {
        let from = |e: &QuarantineEntry| e.record.clone().filter(|r| &r.from_node == node);
        let mut out = Vec::new();
        for ((pool, _, cidr), entry) in &self.quarantines {
            if let Some(record) = from(entry) {
                out.push(QuarantinedFrom {
                    pool: Some(pool.clone()),
                    held: WaitingOn::Range(*cidr),
                    record,
                });
            }
        }
        for (id, entry) in &self.quarantined_ids {
            if let Some(record) = from(entry) {
                out.push(QuarantinedFrom {
                    pool: None,
                    held: WaitingOn::NodeId(*id),
                    record,
                });
            }
        }
        out
    }

    /// The registration of a node, if seen.
    pub fn registration(&self, node: &NodeName) -> Option<&NodeEntry> {
        self.nodes.get(node)
    }

    /// How many registered nodes hold everything the configuration grants them: no node CIDR
    /// or node ID lacking, no block the decision would grant them (see [`Self::waits`]).
    pub fn served_nodes(&self) -> usize {
        self.nodes.len() - self.waiting_nodes()
    }

    /// The proposals in flight.
    pub fn in_flight(&self) -> impl Iterator<Item = &Proposal> {
        self.in_flight.values()
    }

    /// What removing `node` must delete and quarantine, from what the view has seen.
    pub fn removal(&self, node: &NodeName) -> Removal {
        let keys = &self.keys;
        let grants = self
            .grants_of(node)
            .into_iter()
            .map(|c| RemovedGrant {
                grant_key: keys.grant(&c.pool, c.family, &c.cidr),
                quarantine_key: keys.quarantine(&c.pool, c.family, &c.cidr),
                ending: self.ending_grant(node, &c.pool, c.family, &c.cidr),
                cidr: c,
            })
            .collect();
        let owned_keys = self
            .owned
            .iter()
            .filter(|(n, ..)| n == node)
            .map(|(n, pool, family, cidr)| keys.owned(n, pool, *family, cidr))
            .collect();
        let mut ids: BTreeSet<u32> = self
            .node_ids
            .iter()
            .filter(|(_, e)| e.record.as_ref().is_some_and(|r| &r.node == node))
            .map(|(id, _)| *id)
            .collect();
        ids.extend(self.node_id_of_node.get(node));
        let node_ids = ids
            .into_iter()
            .map(|id| RemovedNodeId {
                id,
                id_key: self
                    .node_ids
                    .get(&id)
                    .filter(|e| e.record.as_ref().is_some_and(|r| &r.node == node))
                    .map(|_| keys.node_id(id)),
                quarantine_key: keys.quarantine_id(id),
            })
            .collect();
        Removal {
            node: node.clone(),
            node_key: keys.node(node),
            grants,
            owned_keys,
            node_id_of_node_key: self
                .node_id_of_node
                .contains_key(node)
                .then(|| keys.node_id_of_node(node)),
            node_ids,
            block_keys: self.block_keys_of(node),
        }
    }

    /// Counts per configured pool and family.
    pub fn space_stats(&self) -> Vec<(PoolName, Family, SpaceStats)> {
        self.spaces
            .iter()
            .map(|((pool, family), space)| (pool.clone(), *family, space.stats()))
            .collect()
    }

    /// The space of one pool and family.
    pub fn space(&self, pool: &PoolName, family: Family) -> Option<&CidrSpace> {
        self.spaces.get(&(pool.clone(), family))
    }

    /// Counts of node IDs, when the plan is configured.
    pub fn node_id_stats(&self) -> Option<SpaceStats> {
        self.id_space.as_ref().map(NodeIdSpace::stats)
    }

    /// One node's registration and holdings.
    pub fn node_info(&self, node: &NodeName) -> NodeInfo {
        NodeInfo {
            node: node.clone(),
            registration: self.nodes.get(node).cloned(),
            grants: self.grants_of(node),
            node_id: self.node_id_of(node),
        }
    }

    /// Inconsistencies between what the view holds, found now (events arrive in any order, so
    /// these are not judged while applying): grants and node IDs naming unregistered nodes or
    /// an older registration, grant and owned keys without each other, node-ID indexes that
    /// disagree.
    pub fn consistency_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut push = |key: String, message: String| {
            problems.push(Problem {
                key,
                revision: 0,
                message,
            });
        };
        for ((pool, family, cidr), entry) in &self.grants {
            let key = self.keys.grant(pool, *family, cidr);
            let Some(record) = &entry.record else {
                push(key, "grant value does not decode".to_owned());
                continue;
            };
            match self.nodes.get(&record.node) {
                None => push(
                    key.clone(),
                    format!("grant names unregistered node {}", record.node),
                ),
                Some(node) if node.create_revision != record.node_revision => push(
                    key.clone(),
                    format!(
                        "grant names node {} registration {}, current is {}",
                        record.node, record.node_revision, node.create_revision
                    ),
                ),
                Some(_) => {}
            }
            if !self
                .owned
                .contains(&(record.node.clone(), pool.clone(), *family, *cidr))
            {
                push(key, "grant without its owned key".to_owned());
            }
        }
        for (node, pool, family, cidr) in &self.owned {
            let matches = self
                .grants
                .get(&(pool.clone(), *family, *cidr))
                .and_then(|g| g.record.as_ref())
                .is_some_and(|r| &r.node == node);
            if !matches {
                push(
                    self.keys.owned(node, pool, *family, cidr),
                    "owned key without a grant to its node".to_owned(),
                );
            }
        }
        for (id, entry) in &self.node_ids {
            let key = self.keys.node_id(*id);
            let Some(record) = &entry.record else {
                push(key, "node ID value does not decode".to_owned());
                continue;
            };
            if !self.nodes.contains_key(&record.node) {
                push(
                    key.clone(),
                    format!("node ID names unregistered node {}", record.node),
                );
            }
            if self.node_id_of_node.get(&record.node) != Some(id) {
                push(
                    key,
                    format!("node ID index of node {} does not name {id}", record.node),
                );
            }
        }
        for (node, id) in &self.node_id_of_node {
            let named = self.node_ids.get(id).and_then(|e| e.record.as_ref());
            if named.is_none_or(|r| &r.node != node) {
                push(
                    self.keys.node_id_of_node(node),
                    format!("node ID index names {id}, whose nodeids/id/ key does not name {node}"),
                );
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::net;

    /// A grant record naming node `x`, encoded.
    fn grant_to_x() -> Vec<u8> {
        encode_value(&GrantRecord {
            node: NodeName::new("x").unwrap(),
            uid: "u".into(),
            node_revision: 1,
            granted_ms: None,
        })
        .unwrap()
    }

    /// Regression (review): a grant key of another prefix length was reported and left its
    /// addresses free, and the grant transaction's silence compare covers only the exact key,
    /// so the leader could grant a node CIDR inside it.
    #[test]
    fn a_grant_key_of_another_shape_blocks_its_addresses_until_deleted() {
        let config = ClusterConfig::from_toml(
            "[[pools]]\nname = \"default\"\n[pools.ipv4]\ncidrs = [\"10.0.0.0/16\"]\nnode_prefix_len = 24\n",
        )
        .unwrap();
        let keys = Keys::new(ClusterName::new("t").unwrap());
        let mut view = ClusterView::new(keys.clone(), config);
        let key = format!("{}grants/default/ipv4/10.0.0.0-23", keys.prefix());
        let record = grant_to_x();
        view.apply_put(&key, &record, 5, 5);
        assert!(!view.problems().is_empty(), "reported");
        let space = view
            .space(&PoolName::new("default").unwrap(), Family::V4)
            .unwrap();
        assert_eq!(space.lowest_free().unwrap().to_string(), "10.0.2.0/24");
        view.apply_delete(&key, 6);
        let space = view
            .space(&PoolName::new("default").unwrap(), Family::V4)
            .unwrap();
        assert_eq!(space.lowest_free().unwrap().to_string(), "10.0.0.0/24");
    }

    /// Review (2026-12-01): a grant written by hand in pool `a` of a CIDR that lies in pool
    /// `b` is not counted in `a`'s space; it was blocked only there, so `b` proposed the
    /// same CIDR to another node (the transaction compares only `b`'s exact grant key).
    #[test]
    fn a_grant_outside_its_pools_cidrs_blocks_every_pool_of_its_family_until_deleted() {
        let config = ClusterConfig::from_toml(concat!(
            pool_toml!("a", "10.0.0.0/24", node_prefix_len = 26),
            pool_toml!("b", "10.1.0.0/24", node_prefix_len = 26),
        ))
        .unwrap();
        let keys = Keys::new(ClusterName::new("t").unwrap());
        let mut view = ClusterView::new(keys.clone(), config);
        let b = PoolName::new("b").unwrap();
        let key = keys.grant(
            &PoolName::new("a").unwrap(),
            Family::V4,
            &"10.1.0.0/26".parse().unwrap(),
        );
        let record = grant_to_x();
        view.apply_put(&key, &record, 5, 5);
        assert!(!view.problems().is_empty(), "reported");
        let lowest = |view: &ClusterView| {
            view.space(&b, Family::V4)
                .unwrap()
                .lowest_free()
                .unwrap()
                .to_string()
        };
        assert_eq!(lowest(&view), "10.1.0.64/26");
        view.apply_delete(&key, 6);
        assert_eq!(lowest(&view), "10.1.0.0/26");
    }

    use crate::keys::ClusterName;
    use crate::tests::{ViewFixture, node_ids_toml, pool_toml};

    const CONFIG: &str = concat!(
        pool_toml!("default", "10.0.0.0/29", node_prefix_len = 30),
        r#"[pools.ipv6]
cidrs = ["fd00::/64"]
node_prefix_len = 80
"#,
        node_ids_toml!()
    );

    impl ViewFixture {
        /// Commits a proposal as the operator would (its puts, seen back by watch).
        fn commit(&mut self, proposal: &Proposal) {
            let puts = proposal.puts(self.view.keys()).unwrap();
            for (key, value) in puts {
                self.put(&key, &value);
            }
            self.view.abandon(proposal);
        }
    }

    #[test]
    fn proposals_are_dual_stack_all_or_nothing_and_never_shared() {
        let mut f = ViewFixture::of("test", CONFIG);
        let a = f.register("a");
        let b = f.register("b");
        let c = f.register("c");
        assert_eq!(
            f.view.nodes_needing_grants(),
            [a.clone(), b.clone(), c.clone()]
        );
        let pa = f.view.propose(&a).unwrap();
        let cidrs: Vec<IpNet> = pa.cidrs.iter().map(|c| c.cidr).collect();
        assert_eq!(cidrs, [net("10.0.0.0/30"), net("fd00::/80")]);
        assert_eq!(pa.node_id, Some(1));
        assert_eq!(
            f.view.propose(&a),
            Err(ProposeError::InFlight { node: a.clone() })
        );
        // In flight: b gets the next ones.
        let pb = f.view.propose(&b).unwrap();
        assert_eq!(pb.cidrs[0].cidr, net("10.0.0.4/30"));
        assert_eq!(pb.cidrs[1].cidr, net("fd00:0:0:0:1::/80"));
        assert_eq!(pb.node_id, Some(2));
        // IPv4 is full for c: nothing at all is proposed or marked.
        let before = f.view.space_stats();
        assert_eq!(
            f.view.propose(&c),
            Err(ProposeError::Full {
                pool: PoolName::new("default").unwrap(),
                family: Family::V4
            })
        );
        assert_eq!(f.view.space_stats(), before);
        // b's proposal fails and is abandoned: c gets its CIDRs.
        f.view.abandon(&pb);
        let pc = f.view.propose(&c).unwrap();
        assert_eq!(pc.cidrs[0].cidr, net("10.0.0.4/30"));
        f.commit(&pa);
        f.commit(&pc);
        assert_eq!(f.view.nodes_needing_grants(), [b]);
        assert!(f.view.needs(&a).is_empty());
        assert_eq!(f.view.node_info(&c).node_id, Some(2));
        let stats = f.view.space_stats();
        assert_eq!(stats[0].2.granted, 2);
        assert_eq!(f.view.node_id_stats().unwrap().granted, 2);
        assert!(
            f.view.consistency_problems().is_empty(),
            "{:?}",
            f.view.consistency_problems()
        );
        assert!(f.view.problems().is_empty(), "{:?}", f.view.problems());
        let absent = pa.absent_keys(f.view.keys());
        assert_eq!(absent.len(), 3 * 2 + 3);
        // `a` held nothing in the pool: one compare for both families.
        assert_eq!(
            pa.absent_prefixes(f.view.keys()),
            ["/corral/test/v1/owned/a/default/"]
        );
        // Registration, grant and quarantine keys of two CIDRs, one prefix, three node-ID
        // keys; two records per CIDR, two for the node ID.
        assert_eq!(pa.txn_size(), (1 + 2 * 2 + 1 + 3, 2 * 2 + 2));
    }

    #[test]
    fn a_pool_the_node_holds_something_of_is_proven_empty_family_by_family() {
        let mut f = ViewFixture::of("test", CONFIG);
        let a = f.register("a");
        // `a` holds its IPv4 node CIDR (grant and owned key) and its node ID.
        let first = f.view.propose(&a).unwrap();
        for (key, value) in first.puts(f.view.keys()).unwrap() {
            if !key.contains("ipv6") {
                f.put(&key, &value);
            }
        }
        f.view.abandon(&first);
        let second = f.view.propose(&a).unwrap();
        assert_eq!(second.cidrs.len(), 1);
        assert!(second.empty_pools.is_empty());
        assert_eq!(
            second.absent_prefixes(f.view.keys()),
            ["/corral/test/v1/owned/a/default/ipv6/"]
        );
        assert_eq!(second.txn_size(), (1 + 2 + 1, 2));
        f.view.abandon(&second);

        // `b` has only an `owned/` key of the pool (written around the operator, over `a`'s
        // CIDR: a stray key's range is blocked, so the one free CIDR must lie elsewhere): it
        // lacks both CIDRs, and each family is proven empty on its own, so the stray key
        // refuses only its own family's grant.
        let b = f.register("b");
        let owned = f.view.keys().owned(
            &b,
            &PoolName::new("default").unwrap(),
            Family::V4,
            &net("10.0.0.0/30"),
        );
        f.put(&owned, b"{\"node_revision\":1}");
        let proposal = f.view.propose(&b).unwrap();
        assert_eq!(proposal.cidrs.len(), 2);
        assert!(proposal.empty_pools.is_empty());
        assert_eq!(
            proposal.absent_prefixes(f.view.keys()),
            [
                "/corral/test/v1/owned/b/default/ipv4/",
                "/corral/test/v1/owned/b/default/ipv6/",
            ]
        );
        assert_eq!(proposal.txn_size(), (1 + 2 * 2 + 2 + 3, 2 * 2 + 2));
    }

    #[test]
    fn removal_lists_grants_owned_keys_and_node_ids() {
        let mut f = ViewFixture::of("test", CONFIG);
        let a = f.register("a");
        let p = f.view.propose(&a).unwrap();
        f.commit(&p);
        let removal = f.view.removal(&a);
        let deletes = removal.deletes();
        assert_eq!(deletes.len(), 1 + 2 + 2 + 1 + 1, "{deletes:?}");
        assert!(deletes.contains(&"/corral/test/v1/grants/default/ipv4/10.0.0.0-30".to_owned()));
        assert!(deletes.contains(&"/corral/test/v1/owned/a/default/ipv6/fd00::-80".to_owned()));
        assert!(deletes.contains(&"/corral/test/v1/nodeids/id/1".to_owned()));
        assert!(deletes.contains(&"/corral/test/v1/nodeids/node/a".to_owned()));
        assert_eq!(
            removal.quarantines(),
            [
                "/corral/test/v1/quarantine/default/ipv4/10.0.0.0-30",
                "/corral/test/v1/quarantine/default/ipv6/fd00::-80",
                "/corral/test/v1/quarantine-ids/1",
            ]
        );
        // Applying it: the CIDRs are quarantined, not free.
        let record = encode_value(&removal.quarantine_record("node removed", 5)).unwrap();
        for key in removal.deletes() {
            f.view.apply_delete(&key, 99);
        }
        for key in removal.quarantines() {
            f.put(&key, &record);
        }
        let b = f.register("b");
        let p = f.view.propose(&b).unwrap();
        assert_eq!(p.cidrs[0].cidr, net("10.0.0.4/30"));
        assert_eq!(p.node_id, Some(2));
        // Expiry frees them.
        f.view.abandon(&p);
        for key in removal.quarantines() {
            f.view.apply_delete(&key, 100);
        }
        let p = f.view.propose(&b).unwrap();
        assert_eq!(p.cidrs[0].cidr, net("10.0.0.0/30"));
        assert_eq!(p.node_id, Some(1));
    }

    /// Without its `nodeids/node/` index key, a node's ID is the lowest `nodeids/id/` record
    /// naming it, found by node (the lookup read every ID's record, on every proposal and
    /// report of a node without an ID: a square at scale).
    #[test]
    fn a_node_id_without_its_index_key_is_the_lowest_record_naming_the_node() {
        let mut f = ViewFixture::of("test", CONFIG);
        let a = f.register("a");
        let keys = f.view.keys().clone();
        let naming = |node: &NodeName| {
            encode_value(&NodeIdRecord {
                node: node.clone(),
                uid: "uid".into(),
                node_revision: 1,
            })
            .unwrap()
        };
        assert_eq!(f.view.node_id_of(&a), None);
        f.put(&keys.node_id(2), &naming(&a));
        f.put(&keys.node_id(1), &naming(&NodeName::new("b").unwrap()));
        assert_eq!(f.view.node_id_of(&a), Some(2));
        // A second record naming it, higher: the lowest still.
        f.put(&keys.node_id(3), &naming(&a));
        assert_eq!(f.view.node_id_of(&a), Some(2));
        // ID 1 now names a (replaced in place): the lowest again.
        f.put(&keys.node_id(1), &naming(&a));
        assert_eq!(f.view.node_id_of(&a), Some(1));
        f.view.apply_delete(&keys.node_id(1), 90);
        f.view.apply_delete(&keys.node_id(2), 91);
        assert_eq!(f.view.node_id_of(&a), Some(3));
        // The index key, when there is one, says.
        f.put(&keys.node_id_of_node(&a), b"{\"id\":7}");
        assert_eq!(f.view.node_id_of(&a), Some(7));
        f.view.apply_delete(&keys.node_id_of_node(&a), 92);
        f.view.apply_delete(&keys.node_id(3), 93);
        assert_eq!(f.view.node_id_of(&a), None);
    }

    #[test]
    fn garbage_is_reported_and_skipped() {
        let mut f = ViewFixture::of("test", CONFIG);
        let prefix = f.view.keys().prefix().to_owned();
        let a = f.register("a");
        let garbage: [(String, &[u8]); 8] = [
            (format!("{prefix}nope"), b"{}"),
            ("/elsewhere".to_owned(), b"{}"),
            (format!("{prefix}nodes/b"), b"\xff"),
            (format!("{prefix}grants/other/ipv4/10.0.0.0-30"), b"{}"),
            (format!("{prefix}grants/default/ipv4/10.9.0.0-30"), b"{}"),
            (format!("{prefix}grants/default/ipv4/10.0.0.0-29"), b"{}"),
            (format!("{prefix}nodeids/id/999"), b"{}"),
            (format!("{prefix}config"), b"{\"pools\":[]}"),
        ];
        for (key, value) in &garbage {
            f.put(key, value);
        }
        f.view.apply_delete("garbage", 1);
        for (key, _) in &garbage {
            assert!(
                f.view.problems().iter().any(|p| &p.key == key),
                "{key}: {:?}",
                f.view.problems()
            );
        }
        for problem in f.view.problems() {
            assert!(!problem.message.is_empty());
            assert!(
                !problem.message.chars().next().unwrap().is_uppercase(),
                "{problem:?}"
            );
        }
        // The wrong-shape key above (10.0.0.0/29) blocks its addresses while it exists (here
        // all of them), though it is not counted as a grant.
        assert!(matches!(f.view.propose(&a), Err(ProposeError::Full { .. })));
        f.view
            .apply_delete(&format!("{prefix}grants/default/ipv4/10.0.0.0-29"), 2);
        // A grant with a garbage value still occupies its CIDR.
        f.put(
            &format!("{prefix}grants/default/ipv4/10.0.0.0-30"),
            b"garbage",
        );
        let p = f.view.propose(&a).unwrap();
        assert_eq!(p.cidrs[0].cidr, net("10.0.0.4/30"));
        assert!(!f.view.consistency_problems().is_empty());
        // A grant for a node the view has not seen yet (etcd lists grants/ before nodes/).
        let z = NodeName::new("z").unwrap();
        let record = GrantRecord {
            node: z.clone(),
            uid: "u".into(),
            node_revision: 1,
            granted_ms: None,
        };
        f.view.abandon(&p);
        f.put(
            &f.view.keys().grant(
                &PoolName::new("default").unwrap(),
                Family::V6,
                &net("fd00::/80"),
            ),
            &encode_value(&record).unwrap(),
        );
        assert_eq!(f.view.grants_of(&z).len(), 1);
        assert!(
            f.view
                .consistency_problems()
                .iter()
                .any(|p| p.message.contains("unregistered node z"))
        );
    }

    #[test]
    fn config_changes_apply_or_are_reported() {
        let mut f = ViewFixture::of("test", CONFIG);
        let key = f.view.keys().config();
        let mut wider = f.view.config().clone();
        if let Some(v4) = wider.pools[0].ipv4.as_mut() {
            v4.cidrs.push(net("10.0.1.0/30"));
        }
        f.put(&key, wider.to_json().unwrap().as_bytes());
        assert!(f.view.problems().is_empty(), "{:?}", f.view.problems());
        assert_eq!(f.view.space_stats()[0].2.capacity, 3);
        let mut changed = wider.clone();
        if let Some(v4) = changed.pools[0].ipv4.as_mut() {
            v4.node_prefix_len = 31;
        }
        f.put(&key, changed.to_json().unwrap().as_bytes());
        assert_eq!(f.view.config(), &wider);
        assert!(
            f.view.problems()[0]
                .message
                .contains("cannot change once set"),
            "{:?}",
            f.view.problems()
        );
    }
}
