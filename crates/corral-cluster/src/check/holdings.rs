//! The agents' assertions (`holdings/<node>`) against the grants, from etcd alone: a holding
//! no grant to its holder covers (a node removed while alive, a grant etcd forgot in a
//! restore, a pool renamed), a range or node ID asserted by two nodes, a cloud address one node
//! asserts that another asserts or has on an interface record, and a grant a live node does not
//! assert although it wrote its record after the grant.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use super::parse::overlapping;
use super::{Entry, parse, span};
use crate::keys::{HoldingsRecord, Key, Keys, NodeName, ReleaseState, decode_value};
use crate::net::family_of;

/// The problems of the `holdings/` records in `entries`; `mod_revisions` gives each key's mod
/// revision (the holdings keys' at least: a grant is judged unasserted only when its node's
/// record was written after the grant was created).
pub fn holdings_problems(
    keys: &Keys,
    entries: &[Entry],
    mod_revisions: &BTreeMap<String, i64>,
) -> Vec<String> {
    let mut ignored = Vec::new();
    let parsed = parse(keys, entries, &mut ignored);
    let mut problems = Vec::new();
    let mut live: BTreeSet<NodeName> = BTreeSet::new();
    // node → (key, mod revision, record)
    let mut records: BTreeMap<NodeName, (String, i64, HoldingsRecord)> = BTreeMap::new();
    let mut id_revision: BTreeMap<NodeName, i64> = BTreeMap::new();
    for (key, value, create_revision) in entries {
        match keys.parse(key) {
            Ok(Key::Live { node }) => {
                live.insert(node);
            }
            Ok(Key::NodeIdOfNode { node }) => {
                id_revision.insert(node, *create_revision);
            }
            Ok(Key::Holdings { node }) => match decode_value::<HoldingsRecord>(value) {
                Ok(record) => {
                    let revision = mod_revisions.get(key).copied().unwrap_or(0);
                    records.insert(node, (key.clone(), revision, record));
                }
                Err(error) => problems.push(format!("{key}: {error}")),
            },
            _ => {}
        }
    }
    // Holdings without a grant to their holder (looked up: a scan of every grant per held
    // range took minutes at 100,000 nodes).
    let granted: BTreeSet<(&PoolName, &IpNet, &NodeName)> = parsed
        .grants
        .iter()
        .map(|(pool, _, cidr, grant)| (pool, cidr, &grant.node))
        .collect();
    for (node, (key, _, record)) in &records {
        for range in &record.ranges {
            let covered = granted.contains(&(&range.pool, &range.cidr, node));
            if !covered {
                problems.push(format!(
                    "{key}: node {node} holds {} of pool {} ({} allocated{}) without a grant to \
                     it (kept occupied until given up or granted back)",
                    range.cidr,
                    range.pool,
                    range.allocations,
                    if range.draining { ", draining" } else { "" }
                ));
            }
        }
        for id in record.node_ids() {
            if parsed.id_of_node.get(node) != Some(&id) {
                problems.push(format!(
                    "{key}: node {node} serves node ID {id} without its grant"
                ));
            }
        }
    }
    // A range or node ID asserted by two nodes: a sweep per family over the ranges sorted by
    // their first address.
    let mut by_family: BTreeMap<Family, Vec<(u128, u128, &NodeName, IpNet)>> = BTreeMap::new();
    for (node, (_, _, record)) in &records {
        for range in &record.ranges {
            let (start, end) = span(&range.cidr);
            by_family
                .entry(range.family())
                .or_default()
                .push((start, end, node, range.cidr));
        }
    }
    for ranges in by_family.values_mut() {
        ranges.sort();
        let mut reach: Option<(u128, &NodeName, IpNet)> = None;
        for &(start, end, node, cidr) in ranges.iter() {
            if let Some((far, other, other_cidr)) = reach
                && start <= far
                && other != node
            {
                problems.push(format!(
                    "{cidr} asserted by node {node} overlaps {other_cidr} asserted by node {other}: \
                     held by two nodes"
                ));
            }
            if reach.is_none_or(|(far, ..)| end > far) {
                reach = Some((end, node, cidr));
            }
        }
    }
    // A cloud address asserted by one node and asserted by, or on an interface record of,
    // another (a record a restore brought back listed an address its node had given up, which
    // the cloud has given to another node since). Two records sharing an address are the
    // records' own check (`check/cloud.rs`).
    let asserted = records.iter().flat_map(|(node, (_, _, record))| {
        record
            .cloud
            .iter()
            .map(move |held| (family_of(&held.address), &held.address, (node, true)))
    });
    let recorded = parsed
        .cloud_interfaces
        .iter()
        .flat_map(|(node, _, _, record)| {
            record
                .addresses
                .iter()
                .map(move |address| (family_of(address), address, (node, false)))
        });
    for (a, (a_node, a_held), b, (b_node, b_held)) in overlapping(asserted.chain(recorded)) {
        if a_node == b_node || !(a_held || b_held) {
            continue;
        }
        let said = |node: &NodeName, held: bool, net: &IpNet| {
            if held {
                format!("cloud address {net} asserted by node {node}")
            } else {
                format!("cloud address {net} on an interface record of node {node}")
            }
        };
        problems.push(format!(
            "{} overlaps {}: held by two nodes",
            said(b_node, b_held, b),
            said(a_node, a_held, a)
        ));
    }
    let mut ids: BTreeMap<u32, &NodeName> = BTreeMap::new();
    for (node, (_, _, record)) in &records {
        for id in record.node_ids() {
            if let Some(other) = ids.insert(id, node)
                && other != node
            {
                problems.push(format!(
                    "node ID {id} is asserted by node {other} and by node {node}"
                ));
            }
        }
    }
    // Grants a live node does not assert, although it wrote its record after the grant.
    for (pool, family, cidr, grant) in &parsed.grants {
        let node = &grant.node;
        let Some((key, written, record)) = records.get(node) else {
            continue;
        };
        let created = parsed
            .grant_revisions
            .get(&(pool.clone(), *family, *cidr))
            .copied()
            .unwrap_or(i64::MAX);
        let in_handshake = parsed
            .releases
            .get(&(node.clone(), pool.clone(), *family, *cidr))
            .is_some_and(|r| matches!(r.state, ReleaseState::Marked | ReleaseState::Ready));
        if !live.contains(node) || *written <= created || in_handshake {
            continue;
        }
        if !record
            .ranges
            .iter()
            .any(|r| &r.pool == pool && &r.cidr == cidr)
        {
            problems.push(format!(
                "node {node} is live and does not assert its grant of {cidr} in pool {pool} \
                 ({key} was written after the grant)"
            ));
        }
    }
    for (node, id) in &parsed.id_of_node {
        let Some((key, written, record)) = records.get(node) else {
            continue;
        };
        let created = id_revision.get(node).copied().unwrap_or(i64::MAX);
        if live.contains(node) && *written > created && !record.node_ids().any(|held| held == *id) {
            problems.push(format!(
                "node {node} is live and does not assert its node ID {id} ({key} was written \
                 after the grant)"
            ));
        }
    }
    problems
}
