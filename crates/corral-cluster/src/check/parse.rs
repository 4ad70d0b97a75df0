//! The cluster's keys parsed once for the checks (`check.rs`, `check/cloud.rs`): every record
//! decoded, with what could not be decoded reported as a problem, and the span arithmetic the
//! overlap checks share.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use crate::config::{AppliedConfigRecord, ClusterConfig, HeldGrant, PoolConfig};
use crate::keys::{
    CloudId, CloudIntentRecord, CloudInterfaceRecord, DelegationRecord, GrantRecord, Key, Keys,
    NodeIdOfNodeRecord, NodeIdRecord, NodeName, NodeRecord, QuarantineRecord, ReleaseRecord,
    WaitingRecord, decode_value,
};
use crate::net::net_range;

/// Everything the check reads, parsed: what it could not parse is a problem already.
#[derive(Default)]
pub(super) struct Parsed {
    /// The configuration in force: the stored one if it passes `check_install` against the
    /// applied one and the grants, else the applied one.
    pub(super) config: Option<ClusterConfig>,
    /// `config` as read (an error when it does not read).
    pub(super) stored: Option<Result<ClusterConfig, String>>,
    /// `config-applied`'s configuration as read.
    pub(super) applied: Option<Result<ClusterConfig, String>>,
    /// Registered nodes: create revision and uid.
    pub(super) nodes: BTreeMap<NodeName, (i64, String)>,
    pub(super) grants: Vec<(PoolName, Family, IpNet, GrantRecord)>,
    /// Each grant's create revision, by its pool, family and CIDR.
    pub(super) grant_revisions: BTreeMap<(PoolName, Family, IpNet), i64>,
    /// Release handshakes: (node, pool, family, block) → record.
    pub(super) releases: BTreeMap<(NodeName, PoolName, Family, IpNet), ReleaseRecord>,
    pub(super) owned: BTreeSet<(NodeName, PoolName, Family, IpNet)>,
    pub(super) quarantined: Vec<(PoolName, Family, IpNet)>,
    pub(super) ids: BTreeMap<u32, NodeName>,
    pub(super) id_of_node: BTreeMap<NodeName, u32>,
    pub(super) quarantined_ids: BTreeSet<u32>,
    /// Cloud interface records: node, interface, create revision, record.
    pub(super) cloud_interfaces: Vec<(NodeName, CloudId, i64, CloudInterfaceRecord)>,
    /// Open cloud intents.
    pub(super) cloud_intents: Vec<(CloudId, CloudIntentRecord)>,
    /// Node CIDRs delegated in the cloud (to-cloud pools): node, pool, family, CIDR, record.
    pub(super) delegations: Vec<(NodeName, PoolName, Family, IpNet, DelegationRecord)>,
}

impl Parsed {
    /// `pool` in the configuration in force.
    pub(super) fn pool(&self, pool: &PoolName) -> Option<&PoolConfig> {
        self.config.as_ref().and_then(|c| c.pool(pool))
    }
}

/// One key as read: its name, value and create revision.
pub type Entry = (String, Vec<u8>, i64);

pub(super) fn parse(keys: &Keys, entries: &[Entry], problems: &mut Vec<String>) -> Parsed {
    let mut parsed = Parsed::default();
    for (key, value, create_revision) in entries {
        let parsed_key = match keys.parse(key) {
            Ok(k) => k,
            Err(error) => {
                problems.push(format!("garbage key {key}: {error}"));
                continue;
            }
        };
        let mut bad = |error: String| problems.push(format!("garbage value at {key}: {error}"));
        match parsed_key {
            Key::Config => match ClusterConfig::from_json(value) {
                Ok(config) => parsed.stored = Some(Ok(config)),
                Err(error) => {
                    parsed.stored = Some(Err(error.to_string()));
                    bad(error.to_string());
                }
            },
            Key::ConfigApplied => {
                // Decoding checks the configuration: one that breaks a rule does not decode.
                let applied = decode_value::<AppliedConfigRecord>(value)
                    .map(|r| r.config)
                    .map_err(|e| e.to_string());
                if let Err(error) = &applied {
                    bad(error.clone());
                }
                parsed.applied = Some(applied);
            }
            Key::Node { node } => match decode_value::<NodeRecord>(value) {
                Ok(record) => {
                    parsed.nodes.insert(node, (*create_revision, record.uid));
                }
                Err(error) => bad(error.to_string()),
            },
            Key::Grant { pool, family, cidr } => match decode_value::<GrantRecord>(value) {
                Ok(record) => {
                    parsed
                        .grant_revisions
                        .insert((pool.clone(), family, cidr), *create_revision);
                    parsed.grants.push((pool, family, cidr, record));
                }
                Err(error) => bad(error.to_string()),
            },
            Key::Release {
                node,
                pool,
                family,
                cidr,
            } => match decode_value::<ReleaseRecord>(value) {
                Ok(record) => {
                    parsed.releases.insert((node, pool, family, cidr), record);
                }
                Err(error) => bad(error.to_string()),
            },
            Key::Owned {
                node,
                pool,
                family,
                cidr,
            } => {
                parsed.owned.insert((node, pool, family, cidr));
            }
            // The leader's record of why a node waits: it must read (the node's agent names
            // its cause in an ADD's error from it).
            Key::Waiting { .. } => {
                if let Err(error) = decode_value::<WaitingRecord>(value) {
                    bad(error.to_string());
                }
            }
            // The node count the agents pace their demand by: it must read.
            Key::Census => {
                if let Err(error) = decode_value::<crate::census::CensusRecord>(value) {
                    bad(error.to_string());
                }
            }
            Key::Quarantine { pool, family, cidr } => {
                match decode_value::<QuarantineRecord>(value) {
                    Ok(_) => parsed.quarantined.push((pool, family, cidr)),
                    Err(error) => bad(error.to_string()),
                }
            }
            Key::NodeId { id } => match decode_value::<NodeIdRecord>(value) {
                Ok(record) => {
                    parsed.ids.insert(id, record.node);
                }
                Err(error) => bad(error.to_string()),
            },
            Key::NodeIdOfNode { node } => match decode_value::<NodeIdOfNodeRecord>(value) {
                Ok(record) => {
                    parsed.id_of_node.insert(node, record.id);
                }
                Err(error) => bad(error.to_string()),
            },
            Key::QuarantineId { id } => {
                parsed.quarantined_ids.insert(id);
            }
            Key::CloudInterface { node, interface } => {
                match decode_value::<CloudInterfaceRecord>(value) {
                    Ok(record) => {
                        parsed
                            .cloud_interfaces
                            .push((node, interface, *create_revision, record));
                    }
                    Err(error) => bad(error.to_string()),
                }
            }
            Key::CloudIntent { id } => match decode_value::<CloudIntentRecord>(value) {
                Ok(record) => parsed.cloud_intents.push((id, record)),
                Err(error) => bad(error.to_string()),
            },
            Key::Delegation {
                node,
                pool,
                family,
                cidr,
            } => match decode_value::<DelegationRecord>(value) {
                Ok(record) => parsed.delegations.push((node, pool, family, cidr, record)),
                Err(error) => bad(error.to_string()),
            },
            _ => {}
        }
    }
    settle_config(keys, &mut parsed, problems);
    parsed
}

/// Decides the configuration in force as the leader does (`ClusterConfig::check_install`):
/// the stored one if it fits the applied one and the grants, else the applied one; a stored
/// configuration not in force is a problem, and so is none at all.
pub(super) fn settle_config(keys: &Keys, parsed: &mut Parsed, problems: &mut Vec<String>) {
    let grants: Vec<HeldGrant> = parsed
        .grants
        .iter()
        .map(|(pool, family, cidr, record)| HeldGrant {
            pool: pool.clone(),
            family: *family,
            cidr: *cidr,
            node: Some(record.node.to_string()),
        })
        .collect();
    let ids: Vec<u32> = parsed.ids.keys().copied().collect();
    let applied = match &parsed.applied {
        Some(Ok(config)) => Some(config.clone()),
        _ => None,
    };
    let key = keys.config();
    parsed.config = match (&parsed.stored, applied) {
        (None, applied) => {
            problems.push(format!("the cluster has no configuration ({key})"));
            applied
        }
        (Some(Err(_)), applied) => applied,
        (Some(Ok(stored)), applied) => {
            match ClusterConfig::check_install(applied.as_ref(), stored, &grants, &ids) {
                Ok(()) => Some(stored.clone()),
                // With no configuration applied before, the grants are checked against the
                // stored one below, each misfit a problem of its own.
                Err(_) if applied.is_none() => Some(stored.clone()),
                Err(error) => {
                    problems.push(format!(
                        "the stored configuration at {key} is not applied: {error}; the last \
                         applied configuration stays in force"
                    ));
                    applied
                }
            }
        }
    };
}

/// Pairs of overlapping CIDRs among `items` (each with its family and a label), per family:
/// sorted by start, each must begin after the furthest end seen so far (so a CIDR inside a
/// bigger one is caught, not only neighbours).
pub(super) fn overlapping<'a, L: Copy + Ord>(
    items: impl IntoIterator<Item = (Family, &'a IpNet, L)>,
) -> Vec<(&'a IpNet, L, &'a IpNet, L)> {
    let items: Vec<(Family, &IpNet, L)> = items.into_iter().collect();
    let mut found = Vec::new();
    for family in [Family::V4, Family::V6] {
        let mut spans: Vec<(u128, u128, &IpNet, L)> = items
            .iter()
            .filter(|item| item.0 == family)
            .map(|&(_, net, label)| {
                let (first, last) = span(net);
                (first, last, net, label)
            })
            .collect();
        spans.sort();
        let mut furthest: Option<(u128, &IpNet, L)> = None;
        for (first, last, net, label) in spans {
            if let Some((end, other, other_label)) = furthest
                && first <= end
            {
                found.push((other, other_label, net, label));
            }
            if furthest.is_none_or(|(end, ..)| last > end) {
                furthest = Some((last, net, label));
            }
        }
    }
    found
}

pub(super) fn span(net: &IpNet) -> (u128, u128) {
    net_range(net)
}

pub(super) fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    let (a0, a1) = span(a);
    let (b0, b1) = span(b);
    a.addr().is_ipv4() == b.addr().is_ipv4() && a0 <= b1 && b0 <= a1
}
