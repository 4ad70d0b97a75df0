//! Node CIDRs of `to-cloud` pools delegated to each node's instance in the cloud (nodeipam's
//! `IPAMFromCluster`), as values: the cluster grants node CIDRs as for any node-cidr pool, and
//! the operator puts each one on the node's primary interface where the provider can take a
//! range of that length (EC2: an IPv4 /28, an IPv6 /80), and takes back what corral delegated
//! once the grant is gone.
//!
//! Who may touch what:
//! - a `delegations/<node>/<pool>/<family>/<cidr>` key is the evidence that corral put the
//!   prefix there (a prefix carries no tag); it is written when the cloud confirmed the
//!   delegation (or found the node's own grant already there), and deleted when the prefix was
//!   taken back or the instance is gone. It outlives the grant and the node's registration, so
//!   a removed node's prefix is still taken back;
//! - a prefix on an interface inside a to-cloud pool's CIDRs that no key names and that is not
//!   the node's grant is reported and never touched (not corral's);
//! - a CIDR is delegated only while no other node's key or open intent names it, so corral
//!   never puts one prefix on two instances (the cloud refuses it as well within a subnet).
//!
//! Nothing here does I/O or reads a clock; `now_ms` and the cloud's view come in as values.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use super::replay::DESCRIBE_LAG_BOUND_MS;
use crate::config::{ClusterConfig, NodeCidrSync};
use crate::keys::{CloudId, CloudOp, DelegationRecord, NodeName};
use crate::net::family_of;

/// One family of a `to-cloud` pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToCloudPool {
    /// The pool.
    pub pool: PoolName,
    /// The family.
    pub family: Family,
    /// Its cluster CIDRs.
    pub cidrs: Vec<IpNet>,
    /// The length of every node CIDR.
    pub node_prefix_len: u8,
}

impl ToCloudPool {
    /// Whether `net` lies in the pool's CIDRs (same family).
    pub fn covers(&self, net: &IpNet) -> bool {
        family_of(net) == self.family && self.cidrs.iter().any(|c| c.contains(net))
    }
}

/// Every family of the configuration's `to-cloud` node-cidr pools.
pub fn to_cloud_pools(config: &ClusterConfig) -> Vec<ToCloudPool> {
    config
        .pools
        .iter()
        .filter(|p| p.cloud_sync() == Some(NodeCidrSync::ToCloud))
        .flat_map(|p| {
            p.families().map(|(family, f)| ToCloudPool {
                pool: p.name.clone(),
                family,
                cidrs: f.cidrs.clone(),
                node_prefix_len: f.node_prefix_len,
            })
        })
        .collect()
}

/// The problem of a pool family whose node prefix length the provider cannot take
/// (`delegable`: the provider's length for the family, `None` if it takes no range), if any.
pub fn length_problem(pool: &ToCloudPool, delegable: Option<u8>) -> Option<String> {
    match delegable {
        Some(len) if len == pool.node_prefix_len => None,
        Some(len) => Some(format!(
            "pool {} {}: node CIDRs are /{}, the cloud provider delegates only /{len}: nothing \
             is delegated",
            pool.pool, pool.family, pool.node_prefix_len
        )),
        None => Some(format!(
            "pool {} {}: the cloud provider delegates no {} range: nothing is delegated",
            pool.pool, pool.family, pool.family
        )),
    }
}

/// An instance's primary interface (device index 0) as the cloud shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimarySight {
    /// The interface.
    pub interface: CloudId,
    /// Its subnet's CIDRs (IPv4, and IPv6 if it has one): a delegated prefix must lie inside.
    pub subnet_cidrs: Vec<IpNet>,
    /// The prefixes delegated to it (both families).
    pub prefixes: Vec<IpNet>,
}

/// What the operator knows of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceSight {
    /// Running (or at least holding its primary interface), with that interface.
    Primary(PrimarySight),
    /// Terminated or not found: the cloud freed its prefixes with it.
    Gone,
}

/// One `delegations/` key of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegated {
    /// The pool.
    pub pool: PoolName,
    /// The family.
    pub family: Family,
    /// The delegated CIDR.
    pub cidr: IpNet,
    /// The value (`None`: it did not decode; such a key is left alone and reported).
    pub record: Option<DelegationRecord>,
    /// The key's mod revision.
    pub revision: i64,
}

/// Everything [`plan_delegations`] needs about one node.
#[derive(Debug, Clone)]
pub struct DelegationInput<'a> {
    /// The node (the name its keys are filed under).
    pub node: &'a NodeName,
    /// The instance of its current registration, if registered with one.
    pub instance_id: Option<&'a str>,
    /// The to-cloud pools' families.
    pub pools: &'a [ToCloudPool],
    /// The provider's delegable prefix length per family (IPv4, IPv6).
    pub delegable: [Option<u8>; 2],
    /// The node's grants: (pool, family, CIDR), any pools (others are ignored).
    pub grants: &'a [(PoolName, Family, IpNet)],
    /// The node's `delegations/` keys.
    pub delegations: &'a [Delegated],
    /// CIDRs another node's key or open intent names, by pool.
    pub taken_elsewhere: &'a BTreeSet<(PoolName, IpNet)>,
    /// What is known of the instances concerned (missing: describe it first).
    pub sights: &'a BTreeMap<String, InstanceSight>,
    /// Now, in milliseconds since the epoch.
    pub now_ms: u64,
}

/// One thing to do for a node, in the order returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelegationStep {
    /// Describe the instance (and its primary interface) first.
    Describe {
        /// The instance.
        instance_id: String,
    },
    /// Take back a prefix corral delegated whose grant is gone (a fenced intent, the unassign,
    /// then the key deleted with the intent).
    Undelegate {
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The prefix.
        cidr: IpNet,
        /// The instance.
        instance_id: String,
        /// The interface holding it.
        interface: CloudId,
        /// The key's mod revision.
        revision: i64,
    },
    /// Delete a key whose prefix is no longer in the cloud (taken back, or the instance gone):
    /// no call.
    Forget {
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The prefix.
        cidr: IpNet,
        /// The key's mod revision.
        revision: i64,
    },
    /// The node's grant is on its primary interface already but no key says so (an earlier
    /// delegation whose record was lost with a leader): write the key, no call.
    Adopt {
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The node CIDR.
        cidr: IpNet,
        /// The instance.
        instance_id: String,
        /// The interface.
        interface: CloudId,
    },
    /// Delegate the node's grant to its primary interface (a fenced intent, the explicit
    /// assign, then the key written with the intent deleted).
    Delegate {
        /// The pool.
        pool: PoolName,
        /// The family.
        family: Family,
        /// The node CIDR.
        cidr: IpNet,
        /// The instance.
        instance_id: String,
        /// The primary interface.
        interface: CloudId,
        /// The mod revision of a key of this CIDR whose prefix vanished from the cloud (it is
        /// overwritten), or 0 (absent).
        revision: i64,
    },
}

/// What [`plan_delegations`] decided for a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelegationPlan {
    /// What to do, first things first; empty: the node is in sync.
    pub steps: Vec<DelegationStep>,
    /// Problems to report (one sentence each).
    pub problems: Vec<String>,
    /// Look again at this time (a delegation just made not yet visible in the cloud's view).
    pub recheck_at_ms: Option<u64>,
}

fn delegable_of(delegable: [Option<u8>; 2], family: Family) -> Option<u8> {
    match family {
        Family::V4 => delegable[0],
        Family::V6 => delegable[1],
    }
}

/// Decides what to do for one node's to-cloud node CIDRs, from its grants, its
/// `delegations/` keys and the cloud's view of the instances concerned:
///
/// - a key of an earlier instance, of a grant gone, or of a pool no longer to-cloud: its
///   instance gone → `Forget`; its prefix still on the key's interface → `Undelegate`; not
///   there (any more) → `Forget`, unless the key is younger than the describe lag bound;
/// - the node's grant, where the provider takes its length: on the primary interface → in sync
///   (`Adopt` if no key says so); missing → `Delegate`, unless it lies outside the primary's
///   subnet (reported: the cloud would refuse it), another node's key or intent names it
///   (reported: taken back there first), or its key is younger than the describe lag bound
///   (a delegation just made; looked at again then);
/// - a prefix on the primary interface inside a to-cloud pool's CIDRs, neither the node's
///   grant nor named by one of its keys: reported, left alone.
pub fn plan_delegations(input: &DelegationInput<'_>) -> DelegationPlan {
    let mut plan = DelegationPlan::default();
    let node = input.node;
    let settled = |at_ms: u64| input.now_ms.saturating_sub(at_ms) >= DESCRIBE_LAG_BOUND_MS;
    let recheck = |plan: &mut DelegationPlan, at_ms: u64| {
        let at = at_ms.saturating_add(DESCRIBE_LAG_BOUND_MS);
        plan.recheck_at_ms = Some(plan.recheck_at_ms.map_or(at, |t| t.min(at)));
    };
    let pool_of = |pool: &PoolName, family: Family| {
        input
            .pools
            .iter()
            .find(|p| p.pool == *pool && p.family == family)
    };
    let grants: Vec<(&ToCloudPool, IpNet)> = input
        .grants
        .iter()
        .filter_map(|(pool, family, cidr)| pool_of(pool, *family).map(|p| (p, *cidr)))
        .collect();
    let mut describe: BTreeSet<String> = BTreeSet::new();
    // Keys first: what must leave the cloud before anything is added.
    for key in input.delegations {
        let Some(record) = &key.record else {
            plan.problems.push(format!(
                "delegation key of {} (node {node}, pool {}) does not decode: left alone",
                key.cidr, key.pool
            ));
            continue;
        };
        let current = input.instance_id == Some(record.instance_id.as_str())
            && grants
                .iter()
                .any(|(p, cidr)| p.pool == key.pool && p.family == key.family && *cidr == key.cidr);
        if current {
            continue;
        }
        match input.sights.get(&record.instance_id) {
            None => {
                describe.insert(record.instance_id.clone());
            }
            Some(InstanceSight::Gone) => plan.steps.push(DelegationStep::Forget {
                pool: key.pool.clone(),
                family: key.family,
                cidr: key.cidr,
                revision: key.revision,
            }),
            Some(InstanceSight::Primary(primary)) => {
                let there =
                    primary.interface == record.interface && primary.prefixes.contains(&key.cidr);
                if there {
                    plan.steps.push(DelegationStep::Undelegate {
                        pool: key.pool.clone(),
                        family: key.family,
                        cidr: key.cidr,
                        instance_id: record.instance_id.clone(),
                        interface: record.interface.clone(),
                        revision: key.revision,
                    });
                } else if settled(record.at_ms) || primary.interface != record.interface {
                    plan.steps.push(DelegationStep::Forget {
                        pool: key.pool.clone(),
                        family: key.family,
                        cidr: key.cidr,
                        revision: key.revision,
                    });
                } else {
                    // Delegated moments ago: the view may not show it yet.
                    recheck(&mut plan, record.at_ms);
                }
            }
        }
    }
    // Then the node's grants.
    if let Some(instance_id) = input.instance_id {
        let sight = input.sights.get(instance_id);
        for (pool, cidr) in &grants {
            if let Some(problem) = length_problem(pool, delegable_of(input.delegable, pool.family))
            {
                plan.problems.push(problem);
                continue;
            }
            let primary = match sight {
                None => {
                    describe.insert(instance_id.to_owned());
                    continue;
                }
                Some(InstanceSight::Gone) => continue,
                Some(InstanceSight::Primary(primary)) => primary,
            };
            let key = input.delegations.iter().find(|k| {
                k.pool == pool.pool
                    && k.family == pool.family
                    && k.cidr == *cidr
                    && k.record
                        .as_ref()
                        .is_some_and(|r| r.instance_id == instance_id)
            });
            if primary.prefixes.contains(cidr) {
                if key.is_none() {
                    plan.steps.push(DelegationStep::Adopt {
                        pool: pool.pool.clone(),
                        family: pool.family,
                        cidr: *cidr,
                        instance_id: instance_id.to_owned(),
                        interface: primary.interface.clone(),
                    });
                }
                continue;
            }
            if let Some(key) = key {
                let at_ms = key.record.as_ref().map_or(0, |r| r.at_ms);
                if !settled(at_ms) {
                    recheck(&mut plan, at_ms);
                    continue;
                }
            }
            if !primary.subnet_cidrs.iter().any(|s| s.contains(cidr)) {
                plan.problems.push(format!(
                    "node CIDR {cidr} of node {node} (pool {}) is outside the subnet of its \
                     primary interface {}: not delegated",
                    pool.pool, primary.interface
                ));
                continue;
            }
            // Held by another node (or still by this node's earlier instance: its key is taken
            // back first).
            let earlier = input.delegations.iter().any(|k| {
                k.cidr == *cidr
                    && k.record
                        .as_ref()
                        .is_none_or(|r| r.instance_id != instance_id)
            });
            if earlier {
                continue;
            }
            if input.taken_elsewhere.contains(&(pool.pool.clone(), *cidr)) {
                plan.problems.push(format!(
                    "node CIDR {cidr} of node {node} (pool {}) is still delegated to another \
                     instance: delegated once it is taken back there",
                    pool.pool
                ));
                continue;
            }
            plan.steps.push(DelegationStep::Delegate {
                pool: pool.pool.clone(),
                family: pool.family,
                cidr: *cidr,
                instance_id: instance_id.to_owned(),
                interface: primary.interface.clone(),
                revision: key.map_or(0, |k| k.revision),
            });
        }
        // Prefixes of the pools on the primary that are not corral's.
        if let Some(InstanceSight::Primary(primary)) = sight {
            for prefix in &primary.prefixes {
                let pool = input.pools.iter().find(|p| p.covers(prefix));
                let Some(pool) = pool else {
                    continue;
                };
                let granted = grants.iter().any(|(_, c)| c == prefix);
                let keyed = input.delegations.iter().any(|k| k.cidr == *prefix);
                if !granted && !keyed {
                    plan.problems.push(format!(
                        "{prefix} is delegated to {} (node {node}) inside pool {} but not \
                         granted to the node, and corral did not put it there: left alone",
                        primary.interface, pool.pool
                    ));
                }
            }
        }
    }
    // Describes go first: nothing is decided on an instance not seen yet.
    let mut steps: Vec<DelegationStep> = describe
        .into_iter()
        .map(|instance_id| DelegationStep::Describe { instance_id })
        .collect();
    steps.append(&mut plan.steps);
    plan.steps = steps;
    plan
}

/// How to finish a delegation intent a leader left open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelegationReplay {
    /// A delegation that went through: write the key, delete the intent.
    Record,
    /// Nothing was applied (or the interface is gone): delete the intent.
    Forget,
    /// The cloud's view may lag: look again later, change nothing.
    Wait,
    /// An undelegation not (yet) applied: unassign again (the prefix is corral's: its key).
    Undelegate,
    /// An undelegation that went through (or the interface is gone): delete the key with the
    /// intent.
    Undelegated,
}

/// Decides how to finish an open delegation intent from the interface as described now:
/// `on_interface` is whether the prefix is on the intent's interface (`None`: the interface is
/// gone), `age_ms` how long ago the intent was written.
///
/// - `DelegatePrefix`: there → `Record`; not there → `Wait` within the describe lag bound, then
///   `Forget` (the plan delegates again if the grant still stands: an explicit prefix can be
///   assigned once only, so a late-landing first call is adopted, never doubled); gone →
///   `Forget`.
/// - `UndelegatePrefix`: there → `Undelegate` (repeating it is harmless); not there or gone →
///   `Undelegated` (a describe never shows a prefix gone before it is).
/// - any other op is not a delegation's: `Wait` (never acted on here).
pub fn replay_delegation(
    op: &CloudOp,
    on_interface: Option<bool>,
    age_ms: u64,
) -> DelegationReplay {
    match op {
        CloudOp::DelegatePrefix { .. } => match on_interface {
            Some(true) => DelegationReplay::Record,
            Some(false) if age_ms < DESCRIBE_LAG_BOUND_MS => DelegationReplay::Wait,
            Some(false) | None => DelegationReplay::Forget,
        },
        CloudOp::UndelegatePrefix { .. } => match on_interface {
            Some(true) => DelegationReplay::Undelegate,
            Some(false) | None => DelegationReplay::Undelegated,
        },
        _ => DelegationReplay::Wait,
    }
}

#[cfg(test)]
mod tests;
