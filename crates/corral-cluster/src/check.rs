//! `corral cluster check`: the cluster invariant verified from the keys alone, by code that
//! shares nothing with the operator's view (a checker built on the code it checks proves
//! little): every key parses and every value decodes; granted CIDRs are pairwise disjoint,
//! inside their pool at its node prefix length, clear of reserved and quarantined ranges;
//! `grants/` and `owned/` match both ways; every grant names a registered node under its
//! current registration; a node holds at most one CIDR per pool and family (any number of
//! blocks of a block-mode pool); node IDs are one-to-one, inside the plan and not quarantined.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName, RangeSpec};
use ipnet::IpNet;

use crate::config::ClusterConfig;
use crate::keys::{
    GrantRecord, Key, Keys, NodeIdOfNodeRecord, NodeIdRecord, NodeName, NodeRecord,
    QuarantineRecord, decode_value,
};
use crate::net::net_range;
use crate::plan::NodePlan;

/// Everything the check reads, parsed: what it could not parse is a problem already.
#[derive(Default)]
struct Parsed {
    config: Option<ClusterConfig>,
    /// Registered nodes: create revision and uid.
    nodes: BTreeMap<NodeName, (i64, String)>,
    grants: Vec<(PoolName, Family, IpNet, GrantRecord)>,
    owned: BTreeSet<(NodeName, PoolName, Family, IpNet)>,
    quarantined: Vec<(PoolName, Family, IpNet)>,
    ids: BTreeMap<u32, NodeName>,
    id_of_node: BTreeMap<NodeName, u32>,
    quarantined_ids: BTreeSet<u32>,
}

/// One key as read: its name, value and create revision.
pub type Entry = (String, Vec<u8>, i64);

fn parse(keys: &Keys, entries: &[Entry], problems: &mut Vec<String>) -> Parsed {
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
                Ok(config) => parsed.config = Some(config),
                Err(error) => bad(error.to_string()),
            },
            Key::Node { node } => match decode_value::<NodeRecord>(value) {
                Ok(record) => {
                    parsed.nodes.insert(node, (*create_revision, record.uid));
                }
                Err(error) => bad(error.to_string()),
            },
            Key::Grant { pool, family, cidr } => match decode_value::<GrantRecord>(value) {
                Ok(record) => parsed.grants.push((pool, family, cidr, record)),
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
            _ => {}
        }
    }
    parsed
}

fn span(net: &IpNet) -> (u128, u128) {
    net_range(net)
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    let (a0, a1) = span(a);
    let (b0, b1) = span(b);
    a.addr().is_ipv4() == b.addr().is_ipv4() && a0 <= b1 && b0 <= a1
}

/// Checks the cluster's keys (as read at one revision); answers one sentence per problem.
pub fn check(keys: &Keys, entries: &[Entry]) -> Vec<String> {
    let mut problems = Vec::new();
    let parsed = parse(keys, entries, &mut problems);
    // Pairwise disjoint per family, whatever the pool: sorted by start, each must begin after
    // the furthest end seen so far (so a CIDR inside a bigger one is caught, not only
    // neighbours).
    for family in [Family::V4, Family::V6] {
        let mut spans: Vec<(u128, u128, &IpNet, &NodeName)> = parsed
            .grants
            .iter()
            .filter(|g| g.1 == family)
            .map(|g| {
                let (first, last) = span(&g.2);
                (first, last, &g.2, &g.3.node)
            })
            .collect();
        spans.sort();
        let mut furthest: Option<(u128, &IpNet, &NodeName)> = None;
        for (first, last, cidr, node) in spans {
            if let Some((end, other, other_node)) = furthest
                && first <= end
            {
                problems.push(format!(
                    "{other} (node {other_node}) and {cidr} (node {node}) overlap"
                ));
            }
            if furthest.is_none_or(|(end, ..)| last > end) {
                furthest = Some((last, cidr, node));
            }
        }
    }
    let mut per_node: BTreeMap<(&NodeName, &PoolName, Family), usize> = BTreeMap::new();
    for (pool, family, cidr, record) in &parsed.grants {
        *per_node.entry((&record.node, pool, *family)).or_default() += 1;
        match parsed
            .config
            .as_ref()
            .and_then(|c| c.pool(pool))
            .and_then(|p| p.family(*family))
        {
            None => problems.push(format!(
                "grant {cidr} is in pool {pool} {family}, which the configuration does not have"
            )),
            Some(config) => {
                if cidr.prefix_len() != config.node_prefix_len {
                    problems.push(format!(
                        "grant {cidr} is not a /{} of pool {pool}",
                        config.node_prefix_len
                    ));
                }
                let (first, last) = span(cidr);
                if !config.cidrs.iter().any(|c| {
                    let (c0, c1) = span(c);
                    c0 <= first && last <= c1
                }) {
                    problems.push(format!(
                        "grant {cidr} is outside pool {pool}'s cluster CIDRs"
                    ));
                }
                for reserved in &config.reserved {
                    if overlaps(cidr, reserved) {
                        problems.push(format!("grant {cidr} overlaps reserved {reserved}"));
                    }
                }
            }
        }
        for (q_pool, q_family, q_cidr) in &parsed.quarantined {
            if q_family == family && overlaps(cidr, q_cidr) {
                problems.push(format!(
                    "grant {cidr} (node {}) overlaps {q_cidr}, quarantined in pool {q_pool}",
                    record.node
                ));
            }
        }
        match parsed.nodes.get(&record.node) {
            None => problems.push(format!(
                "grant {cidr} names node {}, which is not registered",
                record.node
            )),
            Some((revision, uid)) if *revision != record.node_revision || *uid != record.uid => {
                problems.push(format!(
                    "grant {cidr} was made for an earlier registration of node {} \
                     (revision {}, uid {}; now revision {revision}, uid {uid})",
                    record.node, record.node_revision, record.uid
                ))
            }
            Some(_) => {}
        }
        if !parsed
            .owned
            .contains(&(record.node.clone(), pool.clone(), *family, *cidr))
        {
            problems.push(format!(
                "grant {cidr} of node {} has no owned key",
                record.node
            ));
        }
    }
    // A node holds any number of blocks of a block-mode pool.
    let is_blocks = |pool: &PoolName| {
        parsed
            .config
            .as_ref()
            .and_then(|c| c.pool(pool))
            .is_some_and(|p| p.is_blocks())
    };
    for ((node, pool, family), count) in per_node {
        if count > 1 && !is_blocks(pool) {
            problems.push(format!(
                "node {node} holds {count} CIDRs of pool {pool} {family}"
            ));
        }
    }
    let granted: BTreeSet<(&NodeName, &PoolName, Family, &IpNet)> = parsed
        .grants
        .iter()
        .map(|(pool, family, cidr, record)| (&record.node, pool, *family, cidr))
        .collect();
    for (node, pool, family, cidr) in &parsed.owned {
        if !granted.contains(&(node, pool, *family, cidr)) {
            problems.push(format!("owned key {cidr} of node {node} has no grant"));
        }
    }
    let max_id = parsed.config.as_ref().map(ClusterConfig::max_node_id);
    for (id, node) in &parsed.ids {
        if parsed.id_of_node.get(node) != Some(id) {
            problems.push(format!(
                "node ID {id} names node {node}, whose own key says otherwise"
            ));
        }
        if !parsed.nodes.contains_key(node) {
            problems.push(format!(
                "node ID {id} names node {node}, which is not registered"
            ));
        }
        if parsed.quarantined_ids.contains(id) {
            problems.push(format!("node ID {id} is granted and quarantined at once"));
        }
        if *id == 0 || max_id.is_some_and(|max| *id > max) {
            problems.push(format!("node ID {id} is outside the plan"));
        }
    }
    for (node, id) in &parsed.id_of_node {
        if parsed.ids.get(id) != Some(node) {
            problems.push(format!(
                "node {node} says it has ID {id}, which is not granted to it"
            ));
        }
    }
    problems
}

/// The ranges an agent of `node` must hold as its cluster ranges: its grants, and its plan's
/// pod range (in pool `plan_pool`) in a node-ID cluster.
pub fn expected_ranges(
    keys: &Keys,
    entries: &[Entry],
    node: &str,
    plan_pool: &PoolName,
) -> Vec<(PoolName, RangeSpec)> {
    let mut ignored = Vec::new();
    let parsed = parse(keys, entries, &mut ignored);
    let mut ranges: Vec<(PoolName, RangeSpec)> = parsed
        .grants
        .iter()
        .filter(|g| g.3.node.as_str() == node)
        .filter_map(|(pool, _, cidr, _)| Some((pool.clone(), node_range(*cidr).ok()?)))
        .collect();
    let plan = parsed.config.as_ref().and_then(|c| c.node_ids.as_ref());
    let id = parsed
        .id_of_node
        .iter()
        .find(|(n, _)| n.as_str() == node)
        .map(|(_, id)| *id);
    if let (Some(plan), Some(id)) = (plan, id)
        && let Ok(derived) = NodePlan::derive(plan, id)
        && let Ok(range) = derived.pod_range()
    {
        ranges.push((plan_pool.clone(), range));
    }
    ranges
}

/// Every granted CIDR with the node holding it (for checking what agents hold against it).
pub fn granted_cidrs(keys: &Keys, entries: &[Entry]) -> Vec<(IpNet, String)> {
    let mut ignored = Vec::new();
    parse(keys, entries, &mut ignored)
        .grants
        .into_iter()
        .map(|(_, _, cidr, record)| (cidr, record.node.to_string()))
        .collect()
}

/// The range an agent serves from a granted node CIDR: the whole CIDR with its first host as
/// the gateway (host-local's default, and what a bridge on the node takes), handed out from
/// the host after it. A CIDR too small for a gateway (/31, /32; /127, /128) has none.
pub fn node_range(cidr: IpNet) -> Result<RangeSpec, corral_core::SpecError> {
    let (first, last) = net_range(&cidr);
    let family = crate::net::family_of(&cidr);
    if last.saturating_sub(first) < 3 {
        return RangeSpec::subnet(cidr);
    }
    RangeSpec::new(
        cidr,
        None,
        None,
        Some(crate::net::addr_of(family, first + 1)),
    )
}

/// The range an agent serves from a granted block of a block-mode pool: the whole block, no
/// gateway (pods of block pools are routed per address, as Calico's), every address but an
/// IPv4 block's network and broadcast address handed out.
pub fn block_range(cidr: IpNet) -> Result<RangeSpec, corral_core::SpecError> {
    RangeSpec::subnet(cidr)
}

/// How many addresses an agent hands out from a block ([`block_range`]'s size).
pub fn block_capacity(cidr: IpNet) -> u64 {
    block_range(cidr).map_or(0, |spec| u64::try_from(spec.size()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{ClusterName, OwnedRecord, encode_value};

    const CONFIG: &str = r#"
[[pools]]
name = "cidrs"
[pools.ipv4]
cidrs = ["10.1.0.0/16"]
node_prefix_len = 24
[[pools]]
name = "pods"
mode = "blocks"
[pools.ipv4]
cidrs = ["10.64.0.0/16"]
block_prefix_len = 28
"#;

    /// Two grants of one node in `pool` (found by the churn simulation: `check` counted a
    /// block pool's grants as node CIDRs).
    fn two_grants(pool: &str, first: &str, second: &str) -> Vec<String> {
        let keys = Keys::new(ClusterName::new("c").unwrap());
        let config = ClusterConfig::from_toml(CONFIG).unwrap();
        let node = NodeName::new("n1").unwrap();
        let pool = PoolName::new(pool).unwrap();
        let record = NodeRecord {
            uid: "u".into(),
            addresses: vec![],
            registered_ms: 0,
        };
        let grant = GrantRecord {
            node: node.clone(),
            uid: "u".into(),
            node_revision: 2,
        };
        let mut entries: Vec<Entry> = vec![
            (keys.config(), config.to_json().unwrap().into_bytes(), 1),
            (keys.node(&node), encode_value(&record).unwrap(), 2),
        ];
        for cidr in [first, second] {
            let cidr: IpNet = cidr.parse().unwrap();
            entries.push((
                keys.grant(&pool, Family::V4, &cidr),
                encode_value(&grant).unwrap(),
                3,
            ));
            entries.push((
                keys.owned(&node, &pool, Family::V4, &cidr),
                encode_value(&OwnedRecord { node_revision: 2 }).unwrap(),
                3,
            ));
        }
        check(&keys, &entries)
    }

    #[test]
    fn a_node_holds_any_number_of_blocks_but_one_node_cidr_per_pool() {
        assert_eq!(
            two_grants("pods", "10.64.0.0/28", "10.64.0.16/28"),
            Vec::<String>::new()
        );
        assert_eq!(
            two_grants("cidrs", "10.1.0.0/24", "10.1.1.0/24"),
            vec!["node n1 holds 2 CIDRs of pool cidrs ipv4".to_owned()]
        );
    }
}
