//! Cloud interface records stay disjoint, and agree with the cloud: the leader's decisions
//! before it writes an `interfaces/<node>/<id>` record, and after a full resync.
//!
//! - [`record_conflicts`]: a record may be written only if no other record (of any node) names
//!   the same interface, and none of its addresses, prefixes or its primary address overlaps
//!   another record's. A record that would is refused and reported, never written: two agents
//!   serving one address is the one thing corral promises never happens, and a cloud that
//!   answers so (a reset or second fake cloud, an account shared with another cluster) is not
//!   believed over etcd.
//! - [`missing_in_cloud`] and [`confirm_missing`]: records of interfaces (and recorded
//!   addresses) the cloud does not have, seen on two full resyncs at least
//!   [`DESCRIBE_LAG_BOUND_MS`] apart (a describe lags behind a change), are reported.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ipnet::IpNet;

use super::DESCRIBE_LAG_BOUND_MS;
use crate::check::CloudTruth;
use crate::keys::{CloudId, CloudInterfaceRecord, NodeName};

/// Why a cloud interface record may not be written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RecordConflict {
    /// The interface is recorded for another node already.
    InterfaceOfOtherNode {
        interface: CloudId,
        node: NodeName,
        other: NodeName,
    },
    /// An address (or prefix, or the primary address) of the record overlaps one on another
    /// record (of this node or another).
    AddressOnOtherRecord {
        node: NodeName,
        interface: CloudId,
        address: IpNet,
        other_node: NodeName,
        other_interface: CloudId,
        other_address: IpNet,
    },
}

impl fmt::Display for RecordConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordConflict::InterfaceOfOtherNode {
                interface,
                node,
                other,
            } => write!(
                f,
                "cloud interface {interface} is recorded for node {other}; not recording it for \
                 node {node}"
            ),
            RecordConflict::AddressOnOtherRecord {
                node,
                interface,
                address,
                other_node,
                other_interface,
                other_address,
            } => write!(
                f,
                "address {address} of cloud interface {interface} (node {node}) overlaps \
                 {other_address} recorded on interface {other_interface} of node {other_node}; \
                 not recording it"
            ),
        }
    }
}

/// Everything a record holds: its addresses and prefixes, and its primary address.
fn footprint(record: &CloudInterfaceRecord) -> impl Iterator<Item = IpNet> + '_ {
    record.addresses.iter().copied().chain(
        record
            .primary_ipv4
            .map(|a| IpNet::from(std::net::IpAddr::V4(a))),
    )
}

fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// What stands against writing `record` as `interfaces/<node>/<interface>`, given every record
/// in the store (`existing`; the one it replaces, same node and interface, is skipped): the
/// interface recorded for another node, or an address of it on another record. Empty: it may
/// be written.
pub fn record_conflicts<'a>(
    existing: impl IntoIterator<Item = (&'a NodeName, &'a CloudId, &'a CloudInterfaceRecord)>,
    node: &NodeName,
    interface: &CloudId,
    record: &CloudInterfaceRecord,
) -> Vec<RecordConflict> {
    let mut conflicts = BTreeSet::new();
    let mine: Vec<IpNet> = footprint(record).collect();
    for (other_node, other_interface, other) in existing {
        if other_node == node && other_interface == interface {
            continue;
        }
        if other_interface == interface {
            conflicts.insert(RecordConflict::InterfaceOfOtherNode {
                interface: interface.clone(),
                node: node.clone(),
                other: other_node.clone(),
            });
        }
        for other_address in footprint(other) {
            for address in mine.iter().filter(|a| overlap(a, &other_address)) {
                conflicts.insert(RecordConflict::AddressOnOtherRecord {
                    node: node.clone(),
                    interface: interface.clone(),
                    address: *address,
                    other_node: other_node.clone(),
                    other_interface: other_interface.clone(),
                    other_address,
                });
            }
        }
    }
    conflicts.into_iter().collect()
}

/// A net's first and last address, with its family (0 IPv4, 1 IPv6).
fn span(net: &IpNet) -> (usize, u128, u128) {
    match net {
        IpNet::V4(n) => (
            0,
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        ),
        IpNet::V6(n) => (1, u128::from(n.network()), u128::from(n.broadcast())),
    }
}

/// An index of the `interfaces/` records (kept by the view beside them), so the check before a
/// write looks at the few records that could conflict, not at every record of the cluster: by
/// interface ID, and by the first address of every address, prefix and primary address.
#[derive(Debug, Clone, Default)]
pub struct RecordIndex {
    by_interface: BTreeMap<CloudId, BTreeSet<NodeName>>,
    by_start: BTreeMap<(usize, u128), BTreeSet<(NodeName, CloudId)>>,
    /// The widest net indexed per family, less one (never shrinks: a wider search is only
    /// slower).
    widest: [u128; 2],
}

impl RecordIndex {
    /// Indexes a record (`None`: a value that does not decode, indexed by its ID only).
    pub fn insert(
        &mut self,
        node: &NodeName,
        interface: &CloudId,
        record: Option<&CloudInterfaceRecord>,
    ) {
        self.by_interface
            .entry(interface.clone())
            .or_default()
            .insert(node.clone());
        for net in record.into_iter().flat_map(footprint) {
            let (family, first, last) = span(&net);
            self.widest[family] = self.widest[family].max(last - first);
            self.by_start
                .entry((family, first))
                .or_default()
                .insert((node.clone(), interface.clone()));
        }
    }

    /// Forgets a record, as it was indexed.
    pub fn remove(
        &mut self,
        node: &NodeName,
        interface: &CloudId,
        record: Option<&CloudInterfaceRecord>,
    ) {
        if let Some(nodes) = self.by_interface.get_mut(interface) {
            nodes.remove(node);
            if nodes.is_empty() {
                self.by_interface.remove(interface);
            }
        }
        for net in record.into_iter().flat_map(footprint) {
            let (family, first, _) = span(&net);
            if let Some(keys) = self.by_start.get_mut(&(family, first)) {
                keys.retain(|(n, i)| !(n == node && i == interface));
                if keys.is_empty() {
                    self.by_start.remove(&(family, first));
                }
            }
        }
    }

    /// The records that may conflict with `record` as `interface`: those of the same interface
    /// ID, and those with a net starting where one of its nets could overlap (a superset;
    /// [`record_conflicts`] decides).
    pub fn candidates(
        &self,
        interface: &CloudId,
        record: &CloudInterfaceRecord,
    ) -> BTreeSet<(NodeName, CloudId)> {
        let mut found: BTreeSet<(NodeName, CloudId)> = self
            .by_interface
            .get(interface)
            .into_iter()
            .flatten()
            .map(|node| (node.clone(), interface.clone()))
            .collect();
        for net in footprint(record) {
            let (family, first, last) = span(&net);
            let from = first.saturating_sub(self.widest[family]);
            for (_, keys) in self.by_start.range((family, from)..=(family, last)) {
                found.extend(keys.iter().cloned());
            }
        }
        found
    }
}

/// A record the cloud contradicts: its interface, or one of its addresses, is not there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum MissingInCloud {
    /// The cloud has no such interface.
    Interface { node: NodeName, interface: CloudId },
    /// The interface lacks this recorded address (or prefix).
    Address {
        node: NodeName,
        interface: CloudId,
        address: IpNet,
    },
}

impl fmt::Display for MissingInCloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MissingInCloud::Interface { node, interface } => write!(
                f,
                "cloud interface {interface} is recorded for node {node}, the cloud does not \
                 have it"
            ),
            MissingInCloud::Address {
                node,
                interface,
                address,
            } => write!(
                f,
                "address {address} is recorded on cloud interface {interface} of node {node}, \
                 the cloud does not have it there"
            ),
        }
    }
}

/// The records `truth` (a full describe) contradicts: interfaces it lacks, and recorded
/// addresses their interface lacks. An interface with an open intent (`busy`) is in flux and
/// skipped, and so is an address in a release handshake (`releasing`: the cloud may have taken
/// it already).
pub fn missing_in_cloud<'a>(
    records: impl IntoIterator<Item = (&'a NodeName, &'a CloudId, &'a CloudInterfaceRecord)>,
    truth: &CloudTruth,
    busy: &BTreeSet<CloudId>,
    releasing: impl Fn(&NodeName, &CloudInterfaceRecord, &IpNet) -> bool,
) -> BTreeSet<MissingInCloud> {
    let mut missing = BTreeSet::new();
    for (node, interface, record) in records {
        if busy.contains(interface) {
            continue;
        }
        let Some((_, addresses)) = truth.get(interface.as_str()) else {
            missing.insert(MissingInCloud::Interface {
                node: node.clone(),
                interface: interface.clone(),
            });
            continue;
        };
        for address in &record.addresses {
            if !addresses.contains(address) && !releasing(node, record, address) {
                missing.insert(MissingInCloud::Address {
                    node: node.clone(),
                    interface: interface.clone(),
                    address: *address,
                });
            }
        }
    }
    missing
}

/// Carries the suspects (each with when a resync first found it missing, wall ms) from one
/// full resync to the next: answers the suspects to keep and those to report (missing on a
/// resync at least [`DESCRIBE_LAG_BOUND_MS`] after the first that found them, so a describe
/// lagging behind a record just written is never reported). A suspect the cloud now has is
/// dropped.
pub fn confirm_missing(
    suspects: &BTreeMap<MissingInCloud, u64>,
    missing: BTreeSet<MissingInCloud>,
    now_ms: u64,
) -> (BTreeMap<MissingInCloud, u64>, Vec<MissingInCloud>) {
    let mut kept = BTreeMap::new();
    let mut reported = Vec::new();
    for item in missing {
        let since = suspects.get(&item).copied().unwrap_or(now_ms);
        if now_ms.saturating_sub(since) >= DESCRIBE_LAG_BOUND_MS {
            reported.push(item.clone());
        }
        kept.insert(item, since);
    }
    (kept, reported)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::CloudAttachment;
    use crate::tests::{id, node};
    use corral_core::PoolName;

    fn record(instance: &str, primary: &str, addresses: &[&str]) -> CloudInterfaceRecord {
        CloudInterfaceRecord {
            pool: PoolName::new("pods").unwrap(),
            instance_id: instance.into(),
            device_index: 1,
            subnet_id: "subnet-a".into(),
            subnets: vec!["10.0.0.0/18".parse().unwrap()],
            mac: "0a:00:00:00:00:03".into(),
            primary_ipv4: Some(primary.parse().unwrap()),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
            assigned_ms: Default::default(),
            attachment: CloudAttachment::Attached,
            managed: true,
            prefixes_refused_ms: None,
        }
    }

    /// node-a's eni-3 with two addresses and a /28.
    fn store() -> Vec<(NodeName, CloudId, CloudInterfaceRecord)> {
        vec![(
            node("node-a"),
            id("eni-3"),
            record(
                "i-a",
                "10.0.0.9",
                &["10.0.0.10/32", "10.0.0.11/32", "10.0.1.16/28"],
            ),
        )]
    }

    fn conflicts(
        store: &[(NodeName, CloudId, CloudInterfaceRecord)],
        n: &str,
        i: &str,
        r: &CloudInterfaceRecord,
    ) -> Vec<RecordConflict> {
        record_conflicts(store.iter().map(|(n, i, r)| (n, i, r)), &node(n), &id(i), r)
    }

    #[test]
    fn a_record_replacing_its_own_or_disjoint_from_all_may_be_written() {
        let store = store();
        // The same record grown: it replaces itself.
        let grown = record(
            "i-a",
            "10.0.0.9",
            &[
                "10.0.0.10/32",
                "10.0.0.11/32",
                "10.0.1.16/28",
                "10.0.0.12/32",
            ],
        );
        assert_eq!(conflicts(&store, "node-a", "eni-3", &grown), vec![]);
        // Another node's interface elsewhere.
        let other = record("i-b", "10.0.0.20", &["10.0.0.21/32", "10.0.1.32/28"]);
        assert_eq!(conflicts(&store, "node-b", "eni-4", &other), vec![]);
    }

    #[test]
    fn the_same_interface_for_another_node_is_refused() {
        let store = store();
        let again = record("i-b", "10.0.0.40", &["10.0.0.41/32"]);
        assert_eq!(
            conflicts(&store, "node-b", "eni-3", &again),
            vec![RecordConflict::InterfaceOfOtherNode {
                interface: id("eni-3"),
                node: node("node-b"),
                other: node("node-a"),
            }]
        );
        let text = conflicts(&store, "node-b", "eni-3", &again)[0].to_string();
        assert!(text.contains("eni-3") && text.contains("node-a"), "{text}");
    }

    #[test]
    fn an_address_a_prefix_or_a_primary_on_another_record_is_refused() {
        let store = store();
        // A /32 inside node-a's /28, node-a's secondary, and node-a's primary address.
        let overlapping = record(
            "i-b",
            "10.0.0.10",
            &["10.0.1.20/32", "10.0.0.11/32", "10.0.0.9/32"],
        );
        let found = conflicts(&store, "node-b", "eni-4", &overlapping);
        let pairs: Vec<(String, String)> = found
            .iter()
            .map(|c| match c {
                RecordConflict::AddressOnOtherRecord {
                    address,
                    other_address,
                    ..
                } => (address.to_string(), other_address.to_string()),
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("10.0.0.9/32".to_owned(), "10.0.0.9/32".to_owned()),
                ("10.0.0.10/32".to_owned(), "10.0.0.10/32".to_owned()),
                ("10.0.0.11/32".to_owned(), "10.0.0.11/32".to_owned()),
                ("10.0.1.20/32".to_owned(), "10.0.1.16/28".to_owned()),
            ]
        );
        // Also between two interfaces of one node.
        let twin = record("i-a", "10.0.0.50", &["10.0.1.16/28"]);
        assert_eq!(conflicts(&store, "node-a", "eni-9", &twin).len(), 1);
        // IPv6 never overlaps IPv4.
        let v6 = record("i-b", "10.0.0.60", &["2600:1f14::10/128"]);
        assert_eq!(conflicts(&store, "node-b", "eni-5", &v6), vec![]);
    }

    #[test]
    fn the_index_finds_every_record_that_conflicts() {
        let mut store = store();
        store.push((
            node("node-b"),
            id("eni-4"),
            record("i-b", "10.0.0.20", &["10.0.0.21/32", "10.0.2.0/28"]),
        ));
        store.push((
            node("node-c"),
            id("eni-6"),
            record("i-c", "10.0.0.30", &["2600:1f14::/80"]),
        ));
        let mut index = RecordIndex::default();
        for (n, i, r) in &store {
            index.insert(n, i, Some(r));
        }
        let candidates = |i: &str, r: &CloudInterfaceRecord| {
            let keys = index.candidates(&id(i), r);
            let found = record_conflicts(
                store
                    .iter()
                    .filter(|(n, i, _)| keys.contains(&(n.clone(), i.clone())))
                    .map(|(n, i, r)| (n, i, r)),
                &node("node-x"),
                &id(i),
                r,
            );
            let all = record_conflicts(
                store.iter().map(|(n, i, r)| (n, i, r)),
                &node("node-x"),
                &id(i),
                r,
            );
            assert_eq!(found, all);
            found.len()
        };
        // Inside node-a's /28, node-b's /28 holding a /32, an IPv6 /128 in node-c's /80, the
        // same interface ID, and nothing at all.
        assert_eq!(
            candidates("eni-9", &record("i-x", "10.0.0.99", &["10.0.1.20/32"])),
            1
        );
        assert_eq!(
            candidates("eni-9", &record("i-x", "10.0.0.99", &["10.0.2.5/32"])),
            1
        );
        assert_eq!(
            candidates("eni-9", &record("i-x", "10.0.0.99", &["2600:1f14::5/128"])),
            1
        );
        assert_eq!(candidates("eni-4", &record("i-x", "10.0.0.99", &[])), 1);
        assert_eq!(
            candidates("eni-9", &record("i-x", "10.0.0.99", &["10.0.3.1/32"])),
            0
        );
        // Removed: found no more.
        let (n, i, r) = &store[1];
        index.remove(n, i, Some(r));
        let left = index.candidates(&id("eni-4"), &record("i-x", "10.0.0.99", &["10.0.0.21/32"]));
        assert!(!left.contains(&(node("node-b"), id("eni-4"))), "{left:?}");
    }

    #[test]
    fn records_the_cloud_lacks_are_found_except_those_in_flux() {
        let store = store();
        let records = || store.iter().map(|(n, i, r)| (n, i, r));
        let mut truth = CloudTruth::new();
        assert_eq!(
            missing_in_cloud(records(), &truth, &BTreeSet::new(), |_, _, _| false),
            BTreeSet::from([MissingInCloud::Interface {
                node: node("node-a"),
                interface: id("eni-3"),
            }])
        );
        // With an open intent on it: in flux.
        assert!(
            missing_in_cloud(
                records(),
                &truth,
                &BTreeSet::from([id("eni-3")]),
                |_, _, _| false
            )
            .is_empty()
        );
        truth.insert(
            "eni-3".into(),
            (
                Some("i-a".into()),
                vec![
                    "10.0.0.10/32".parse().unwrap(),
                    "10.0.1.16/28".parse().unwrap(),
                ],
            ),
        );
        let missing = missing_in_cloud(records(), &truth, &BTreeSet::new(), |_, _, _| false);
        assert_eq!(
            missing,
            BTreeSet::from([MissingInCloud::Address {
                node: node("node-a"),
                interface: id("eni-3"),
                address: "10.0.0.11/32".parse().unwrap(),
            }])
        );
        // In a release handshake: the cloud may have taken it already.
        assert!(
            missing_in_cloud(records(), &truth, &BTreeSet::new(), |_, _, a| a.to_string()
                == "10.0.0.11/32")
            .is_empty()
        );
    }

    #[test]
    fn a_missing_record_is_reported_only_on_a_resync_past_the_lag_bound() {
        let item = MissingInCloud::Interface {
            node: node("node-a"),
            interface: id("eni-3"),
        };
        let (kept, reported) =
            confirm_missing(&BTreeMap::new(), BTreeSet::from([item.clone()]), 1_000);
        assert!(reported.is_empty());
        assert_eq!(kept[&item], 1_000);
        let (kept, reported) = confirm_missing(
            &kept,
            BTreeSet::from([item.clone()]),
            1_000 + DESCRIBE_LAG_BOUND_MS - 1,
        );
        assert!(reported.is_empty());
        let (kept, reported) = confirm_missing(
            &kept,
            BTreeSet::from([item.clone()]),
            1_000 + DESCRIBE_LAG_BOUND_MS,
        );
        assert_eq!(reported, vec![item.clone()]);
        // Found again: dropped.
        let (kept, reported) = confirm_missing(&kept, BTreeSet::new(), 100_000);
        assert!(kept.is_empty() && reported.is_empty());
    }
}
