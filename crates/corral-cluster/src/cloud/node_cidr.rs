//! Node CIDRs synced with the cloud, as values: nodeipam's `IPAMFromCloud` (`CloudAllocator`),
//! where a node's CIDRs are the prefixes the cloud delegated to its instance's primary
//! interface (`cloud_sync = "from-cloud"` on a node-cidr pool).
//!
//! The operator (`corral-operator`'s `leader/node_cidr_sync.rs`) describes the primary
//! interfaces, feeds what it saw here with the pool's grants from its view, and carries out the
//! plan: each grant one fenced transaction proving the CIDR's grant, owned and quarantine keys
//! absent (etcd arbitrates), each withdrawal one fenced transaction that deletes the grant and
//! quarantines the CIDR as a node removal does.
//!
//! Rules [`plan_from_cloud`] keeps:
//! - nothing is granted that the view knows held, quarantined or reserved, and a prefix the
//!   cloud shows on two instances (a move seen through lagging describes) is proposed for one
//!   node at most;
//! - a grant is withdrawn only when the node's primary interface was described without it twice,
//!   the second describe at least the describe-lag bound after the first (describes lag: one
//!   stale describe never withdraws anything);
//! - nothing is withdrawn because a node went silent: a node without an instance ID, or whose
//!   instance or primary interface is not found, keeps what it holds (a terminated instance's
//!   grants go with the node's removal);
//! - a prefix of another length than the family's node prefix length, outside its cluster
//!   CIDRs, reserved, quarantined or held by another node is reported and not granted.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use crate::keys::NodeName;
use crate::net::family_of;
use crate::space::CidrSpace;

/// What the last describe showed of a node's instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sight {
    /// The node registered without an instance ID.
    NoInstance,
    /// Not described yet, or its instance or primary interface (device index 0) not found.
    Unseen,
    /// Its primary interface as described at `at_ms` (when the describe was sent), with the
    /// prefixes delegated to it (both families; other entries are not looked at).
    Primary {
        /// When the describe was sent, in milliseconds (any epoch, the same for every sight).
        at_ms: u64,
        /// The delegated prefixes.
        prefixes: Vec<IpNet>,
    },
}

/// One pool and family of a from-cloud pool, with the cloud's sights of its nodes.
#[derive(Debug, Clone, Copy)]
pub struct FromCloudInput<'a> {
    /// The pool.
    pub pool: &'a PoolName,
    /// The family.
    pub family: Family,
    /// The view's space of the pool and family (cluster CIDRs, node prefix length, reserved
    /// ranges, and what is granted and quarantined).
    pub space: &'a CidrSpace,
    /// Every grant of the pool and family, by CIDR.
    pub granted: &'a BTreeMap<IpNet, NodeName>,
    /// The quarantined CIDRs of the pool and family.
    pub quarantined: &'a BTreeSet<IpNet>,
    /// The registered nodes and what the cloud showed of each.
    pub nodes: &'a BTreeMap<NodeName, Sight>,
    /// The withdrawal clocks (the last plan's [`FromCloudPlan::absent_since`]): a granted
    /// CIDR's first describe that showed its node's primary interface without it.
    pub absent_since: &'a BTreeMap<(NodeName, IpNet), u64>,
    /// How long a change may take to show in describes ([`super::DESCRIBE_LAG_BOUND_MS`]).
    pub lag_bound_ms: u64,
}

/// Why a node has not (or not all) of what the cloud shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromCloudProblem {
    /// Registered without an instance ID: nothing to read from the cloud.
    NoInstance,
    /// Its instance or primary interface was not found (yet): what it holds stays.
    Unseen,
    /// Its primary interface has no delegated prefix of the family: waiting for one.
    NoPrefix,
    /// A delegated prefix of another length than the family's node prefix length.
    WrongLength {
        /// The prefix.
        cidr: IpNet,
        /// The family's node prefix length.
        want: u8,
    },
    /// A delegated prefix outside the family's cluster CIDRs.
    OutsidePool {
        /// The prefix.
        cidr: IpNet,
    },
    /// A delegated prefix that overlaps a reserved range (or a key the view could not place).
    Reserved {
        /// The prefix.
        cidr: IpNet,
    },
    /// A delegated prefix still in quarantine (withdrawn from a node lately): granted after it.
    Quarantined {
        /// The prefix.
        cidr: IpNet,
    },
    /// A delegated prefix granted to another node (the cloud moved it, or shows it twice):
    /// granted here only once the other's grant is withdrawn and quarantined.
    HeldByOther {
        /// The prefix.
        cidr: IpNet,
        /// The node holding it.
        holder: NodeName,
    },
    /// A prefix the cloud shows on this node's instance and another's, granted to neither yet:
    /// the other is proposed (its describe is the newer one).
    ShownTwice {
        /// The prefix.
        cidr: IpNet,
        /// The node it is proposed for.
        other: NodeName,
    },
    /// A granted CIDR the node's primary interface no longer shows: withdrawn once a describe
    /// at least the lag bound after `since_ms` still does not show it.
    Withdrawing {
        /// The CIDR.
        cidr: IpNet,
        /// The first describe that did not show it.
        since_ms: u64,
    },
}

impl FromCloudProblem {
    /// A short name for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            FromCloudProblem::NoInstance => "no_instance",
            FromCloudProblem::Unseen => "unseen",
            FromCloudProblem::NoPrefix => "no_prefix",
            FromCloudProblem::WrongLength { .. } => "wrong_length",
            FromCloudProblem::OutsidePool { .. } => "outside_pool",
            FromCloudProblem::Reserved { .. } => "reserved",
            FromCloudProblem::Quarantined { .. } => "quarantined",
            FromCloudProblem::HeldByOther { .. } => "held_by_other",
            FromCloudProblem::ShownTwice { .. } => "shown_twice",
            FromCloudProblem::Withdrawing { .. } => "withdrawing",
        }
    }

    /// Every kind, for metrics that list each one (zero included).
    pub const KINDS: [&'static str; 10] = [
        "no_instance",
        "unseen",
        "no_prefix",
        "wrong_length",
        "outside_pool",
        "reserved",
        "quarantined",
        "held_by_other",
        "shown_twice",
        "withdrawing",
    ];
}

impl fmt::Display for FromCloudProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FromCloudProblem::NoInstance => {
                f.write_str("registered without an instance ID: waiting for one")
            }
            FromCloudProblem::Unseen => {
                f.write_str("its instance's primary interface is not found (yet); grants kept")
            }
            FromCloudProblem::NoPrefix => {
                f.write_str("its primary interface has no delegated prefix: waiting for one")
            }
            FromCloudProblem::WrongLength { cidr, want } => {
                write!(f, "delegated prefix {cidr} is not a /{want}: not granted")
            }
            FromCloudProblem::OutsidePool { cidr } => {
                write!(
                    f,
                    "delegated prefix {cidr} is outside the pool's CIDRs: not granted"
                )
            }
            FromCloudProblem::Reserved { cidr } => {
                write!(
                    f,
                    "delegated prefix {cidr} overlaps a reserved range: not granted"
                )
            }
            FromCloudProblem::Quarantined { cidr } => {
                write!(
                    f,
                    "delegated prefix {cidr} is quarantined: granted once it ends"
                )
            }
            FromCloudProblem::HeldByOther { cidr, holder } => write!(
                f,
                "delegated prefix {cidr} is granted to node {holder}: granted here once withdrawn there"
            ),
            FromCloudProblem::ShownTwice { cidr, other } => write!(
                f,
                "delegated prefix {cidr} is shown on node {other}'s instance too: proposed there"
            ),
            FromCloudProblem::Withdrawing { cidr, since_ms } => write!(
                f,
                "granted {cidr} is gone from its primary interface since {since_ms} ms: \
                 withdrawn if a describe after the lag bound agrees"
            ),
        }
    }
}

/// A node and one of its problems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromCloudReport {
    /// The node.
    pub node: NodeName,
    /// What is wrong or awaited.
    pub problem: FromCloudProblem,
}

/// What to do for one pool and family.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FromCloudPlan {
    /// Grant these (node, CIDR): each CIDR at most once, none the view knows occupied.
    pub grant: Vec<(NodeName, IpNet)>,
    /// Withdraw these grants (delete and quarantine).
    pub withdraw: Vec<(NodeName, IpNet)>,
    /// Nodes waiting or with prefixes not granted, and why.
    pub reports: Vec<FromCloudReport>,
    /// The withdrawal clocks to keep for the next plan.
    pub absent_since: BTreeMap<(NodeName, IpNet), u64>,
}

/// Plans one pool and family of a from-cloud pool (see the module's rules).
pub fn plan_from_cloud(input: &FromCloudInput<'_>) -> FromCloudPlan {
    let mut plan = FromCloudPlan::default();
    let want = input.space.node_prefix_len();
    // Candidates: each valid, unheld prefix with the nodes showing it (newest describe first).
    let mut candidates: BTreeMap<IpNet, Vec<(u64, &NodeName)>> = BTreeMap::new();
    let mut report = |node: &NodeName, problem: FromCloudProblem| {
        plan.reports.push(FromCloudReport {
            node: node.clone(),
            problem,
        });
    };
    for (node, sight) in input.nodes {
        let (at_ms, prefixes) = match sight {
            Sight::NoInstance => {
                report(node, FromCloudProblem::NoInstance);
                continue;
            }
            Sight::Unseen => {
                report(node, FromCloudProblem::Unseen);
                continue;
            }
            Sight::Primary { at_ms, prefixes } => (*at_ms, prefixes),
        };
        let mine: BTreeSet<IpNet> = prefixes
            .iter()
            .filter(|p| family_of(p) == input.family)
            .map(IpNet::trunc)
            .collect();
        if mine.is_empty() {
            report(node, FromCloudProblem::NoPrefix);
        }
        for cidr in mine {
            if cidr.prefix_len() != want {
                report(node, FromCloudProblem::WrongLength { cidr, want });
            } else if !input.space.contains(&cidr) {
                report(node, FromCloudProblem::OutsidePool { cidr });
            } else if let Some(holder) = input.granted.get(&cidr) {
                if holder != node {
                    report(
                        node,
                        FromCloudProblem::HeldByOther {
                            cidr,
                            holder: holder.clone(),
                        },
                    );
                }
            } else if input.quarantined.contains(&cidr) {
                report(node, FromCloudProblem::Quarantined { cidr });
            } else if !input.space.is_free(&cidr) {
                report(node, FromCloudProblem::Reserved { cidr });
            } else {
                candidates.entry(cidr).or_default().push((at_ms, node));
            }
        }
    }
    for (cidr, mut shown) in candidates {
        // The newest describe wins (the cloud's latest word), then the lowest name; etcd
        // arbitrates anyway, this only keeps one plan from proposing a CIDR twice.
        shown.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let chosen = shown[0].1;
        for (_, other) in &shown[1..] {
            report(
                other,
                FromCloudProblem::ShownTwice {
                    cidr,
                    other: chosen.clone(),
                },
            );
        }
        plan.grant.push((chosen.clone(), cidr));
    }
    for (cidr, holder) in input.granted {
        let Some(Sight::Primary { at_ms, prefixes }) = input.nodes.get(holder) else {
            // Not registered (its removal deletes the grant) or silent: kept, and a clock
            // that ran keeps its start (the next sight must still be the bound after it).
            if let Some(since) = input.absent_since.get(&(holder.clone(), *cidr)) {
                plan.absent_since.insert((holder.clone(), *cidr), *since);
            }
            continue;
        };
        if prefixes.iter().any(|p| p.trunc() == *cidr) {
            continue;
        }
        let since = input
            .absent_since
            .get(&(holder.clone(), *cidr))
            .copied()
            .unwrap_or(*at_ms)
            .min(*at_ms);
        if at_ms.saturating_sub(since) >= input.lag_bound_ms {
            plan.withdraw.push((holder.clone(), *cidr));
        } else {
            plan.absent_since.insert((holder.clone(), *cidr), since);
            report(
                holder,
                FromCloudProblem::Withdrawing {
                    cidr: *cidr,
                    since_ms: since,
                },
            );
        }
    }
    plan
}

#[cfg(test)]
mod tests;
