//! `corral cluster check` for cloud pools: the `interfaces/` records against the configuration,
//! the registered nodes and each other (from etcd alone), release keys of cloud addresses
//! against the records, and — given the cloud's own view — the records against the cloud.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use super::parse::{Entry, Parsed, overlapping, parse, span};
use crate::config::NodeCidrSync;
use crate::keys::{CloudAttachment, CloudId, CloudOp, Keys, NodeName, ReleaseRecord};
use crate::net::family_of;

/// The cloud's view of its interfaces, as plain data: interface ID → (the instance it is
/// attached to, if any; its secondary addresses and prefixes, both families).
pub type CloudTruth = BTreeMap<String, (Option<String>, Vec<IpNet>)>;

/// The problems of `delegations/` keys (to-cloud pools), from etcd alone: each names a
/// to-cloud node-cidr pool and a CIDR of its family at the node prefix length inside the
/// pool's CIDRs, and no CIDR is recorded delegated twice (corral delegates a CIDR only once
/// no other key names it).
pub(super) fn delegation_problems(parsed: &Parsed) -> Vec<String> {
    let mut problems = Vec::new();
    let config = parsed.config.as_ref();
    let mut seen: BTreeMap<(&PoolName, IpNet), &NodeName> = BTreeMap::new();
    for (node, pool, family, cidr, _) in &parsed.delegations {
        let pool_config = config.and_then(|c| c.pool(pool));
        let family_config = pool_config
            .filter(|p| p.cloud_sync() == Some(NodeCidrSync::ToCloud))
            .and_then(|p| p.family(*family));
        match family_config {
            None => problems.push(format!(
                "node CIDR {cidr} of node {node} is recorded delegated in pool {pool} {family}, \
                 which is not a to-cloud node-cidr pool of that family"
            )),
            Some(f) => {
                let inside = f.cidrs.iter().any(|c| c.contains(cidr));
                if family_of(cidr) != *family || cidr.prefix_len() != f.node_prefix_len || !inside {
                    problems.push(format!(
                        "node CIDR {cidr} of node {node} is recorded delegated in pool {pool} \
                         but is not one of its {family} node CIDRs"
                    ));
                }
            }
        }
        if let Some(other) = seen.insert((pool, *cidr), node) {
            problems.push(format!(
                "node CIDR {cidr} (pool {pool}) is recorded delegated for {other} and for {node}"
            ));
        }
    }
    problems
}

/// The problems of the cloud interface records and intents, from etcd alone.
pub(super) fn record_problems(parsed: &Parsed) -> Vec<String> {
    let mut problems = Vec::new();
    let config = parsed.config.as_ref();
    let mut owners: BTreeMap<&CloudId, &NodeName> = BTreeMap::new();
    let mut indexes: BTreeMap<(&NodeName, u32), &CloudId> = BTreeMap::new();
    let mut addresses: Vec<(IpNet, String)> = Vec::new();
    for (node, interface, _, record) in &parsed.cloud_interfaces {
        let pool = &record.pool;
        match config.and_then(|c| c.pool(pool)) {
            None => problems.push(format!(
                "cloud interface {interface} (node {node}) is in pool {pool}, which the \
                 configuration does not have"
            )),
            Some(p) if !p.is_cloud() => problems.push(format!(
                "cloud interface {interface} (node {node}) is in pool {pool}, which is not a \
                 cloud pool"
            )),
            Some(p) => {
                for address in &record.addresses {
                    let family = family_of(address);
                    let (first, last) = span(address);
                    let inside = p.family(family).is_some_and(|f| {
                        f.cidrs.iter().any(|c| {
                            let (c0, c1) = span(c);
                            c0 <= first && last <= c1
                        })
                    });
                    if !inside {
                        problems.push(format!(
                            "address {address} of cloud interface {interface} (node {node}) is \
                             outside pool {pool}'s {family} CIDRs"
                        ));
                    }
                }
            }
        }
        if !parsed.nodes.contains_key(node) {
            problems.push(format!(
                "cloud interface {interface} names node {node}, which is not registered"
            ));
        }
        if let Some(other) = owners.insert(interface, node) {
            problems.push(format!(
                "cloud interface {interface} is recorded for nodes {other} and {node}"
            ));
        }
        if let Some(other) = indexes.insert((node, record.device_index), interface) {
            problems.push(format!(
                "cloud interfaces {other} and {interface} of node {node} both have device \
                 index {}",
                record.device_index
            ));
        }
        addresses.extend(
            record
                .addresses
                .iter()
                .map(|a| (*a, format!("interface {interface} of node {node}"))),
        );
    }
    let labelled = addresses
        .iter()
        .map(|(net, label)| (family_of(net), net, label.as_str()));
    for (a, a_label, b, b_label) in overlapping(labelled) {
        problems.push(format!(
            "cloud address {a} ({a_label}) and {b} ({b_label}) overlap"
        ));
    }
    for (id, intent) in &parsed.cloud_intents {
        let pool = config.and_then(|c| c.pool(&intent.pool));
        if intent.op.is_delegation() {
            if !pool.is_some_and(|p| p.cloud_sync() == Some(NodeCidrSync::ToCloud)) {
                problems.push(format!(
                    "cloud intent {id} delegates a prefix of pool {}, which is not a to-cloud \
                     node-cidr pool",
                    intent.pool
                ));
            }
        } else if !pool.is_some_and(|p| p.is_cloud()) {
            problems.push(format!(
                "cloud intent {id} is for pool {}, which is not a cloud pool",
                intent.pool
            ));
        }
    }
    problems
}

/// The problem of one release key of a cloud pool, if any: it must name an address (or
/// prefix) of one of the node's interface records in that pool, and that record's create
/// revision as its `grant_revision`.
pub(super) fn release_problem(
    parsed: &Parsed,
    node: &NodeName,
    pool: &PoolName,
    family: Family,
    cidr: &IpNet,
    record: &ReleaseRecord,
) -> Option<String> {
    let holder = parsed
        .cloud_interfaces
        .iter()
        .find(|(n, _, _, r)| n == node && r.pool == *pool && r.addresses.contains(cidr));
    match holder {
        _ if family_of(cidr) != family => Some(format!(
            "release key of {cidr} (node {node}) is filed under {family}"
        )),
        None => Some(format!(
            "release key of {cidr} (node {node}, {}) names no address of that node's cloud \
             interfaces in pool {pool}",
            record.state.name()
        )),
        Some((_, interface, revision, _)) if *revision != record.grant_revision => Some(format!(
            "release key of {cidr} (node {node}) names grant revision {}, the record of \
             interface {interface} was created at {revision}",
            record.grant_revision
        )),
        Some(_) => None,
    }
}

/// Compares the cloud interface records (as read at one revision) with the cloud's own view:
/// every recorded interface exists, is attached to the recorded instance once recorded
/// attached, and carries every recorded address; every address on a recorded interface is in
/// its record; no address is on two interfaces of the cloud. An interface with an open intent
/// is in flux and skipped; an address in an open release handshake may already be gone from
/// the cloud. One sentence per problem.
pub fn cloud_problems(keys: &Keys, entries: &[Entry], truth: &CloudTruth) -> Vec<String> {
    let mut problems = Vec::new();
    let mut ignored = Vec::new();
    let parsed = parse(keys, entries, &mut ignored);
    let busy: BTreeSet<&CloudId> = parsed
        .cloud_intents
        .iter()
        .filter_map(|(_, intent)| match &intent.op {
            CloudOp::Assign { interface, .. }
            | CloudOp::Unassign { interface, .. }
            | CloudOp::Delete { interface }
            | CloudOp::DelegatePrefix { interface, .. }
            | CloudOp::UndelegatePrefix { interface, .. } => Some(interface),
            CloudOp::CreateAttach { .. } => None,
        })
        .collect();
    // Delegated node CIDRs (to-cloud pools) are on their interface, unless an intent on it is
    // open (a delegation being made or taken back).
    for (node, pool, _, cidr, record) in &parsed.delegations {
        if busy.contains(&record.interface) {
            continue;
        }
        let on = truth
            .get(record.interface.as_str())
            .is_some_and(|(_, addresses)| addresses.contains(cidr));
        if !on {
            problems.push(format!(
                "node CIDR {cidr} of node {node} (pool {pool}) is recorded delegated to \
                 interface {} of {}, the cloud does not have it there",
                record.interface, record.instance_id
            ));
        }
    }
    for (node, interface, _, record) in &parsed.cloud_interfaces {
        if busy.contains(interface) {
            continue;
        }
        let Some((attached, addresses)) = truth.get(interface.as_str()) else {
            problems.push(format!(
                "cloud interface {interface} of node {node} is not in the cloud"
            ));
            continue;
        };
        // Recorded attached: the cloud has it on that instance. Recorded attaching: at least
        // not on another one (the same interface recorded for two nodes, one of them wrong).
        let elsewhere = attached
            .as_deref()
            .is_some_and(|at| at != record.instance_id.as_str());
        if (record.attachment == CloudAttachment::Attached
            && attached.as_deref() != Some(record.instance_id.as_str()))
            || elsewhere
        {
            problems.push(format!(
                "cloud interface {interface} of node {node} is recorded attached to {}, the \
                 cloud has it {}",
                record.instance_id,
                attached
                    .as_ref()
                    .map_or("unattached".to_owned(), |i| format!("attached to {i}"))
            ));
        }
        for address in &record.addresses {
            let releasing = parsed.releases.contains_key(&(
                node.clone(),
                record.pool.clone(),
                family_of(address),
                *address,
            ));
            if !addresses.contains(address) && !releasing {
                problems.push(format!(
                    "address {address} of cloud interface {interface} (node {node}) is not on \
                     it in the cloud"
                ));
            }
        }
        for address in addresses {
            if !record.addresses.contains(address) {
                problems.push(format!(
                    "address {address} is on cloud interface {interface} (node {node}) but not \
                     in its record"
                ));
            }
        }
    }
    let on_interfaces = truth.iter().flat_map(|(id, (_, addresses))| {
        addresses
            .iter()
            .map(move |a| (family_of(a), a, id.as_str()))
    });
    for (a, a_id, b, b_id) in overlapping(on_interfaces) {
        problems.push(format!(
            "the cloud has {a} on interface {a_id} and {b} on interface {b_id}"
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{CloudIntentRecord, CloudInterfaceRecord, ReleaseState, encode_value};
    use crate::tests::{Cluster, assert_reported, id, interface_record, net, node, pool_toml};

    const CONFIG: &str = concat!(
        pool_toml!("pods", mode = "cloud", "10.0.0.0/16"),
        pool_toml!(
            "blocks",
            mode = "blocks",
            "10.9.0.0/24",
            block_prefix_len = 28
        ),
    );

    fn cluster() -> Cluster {
        let mut c = Cluster::with_config(CONFIG);
        for name in ["a", "b"] {
            c.node(name, Some(format!("i-{name}")));
        }
        c
    }

    impl Cluster {
        fn interface(&mut self, n: &str, eni: &str, index: u32, addresses: &[&str]) -> i64 {
            self.interface_in(n, eni, index, addresses, "pods")
        }

        fn interface_in(
            &mut self,
            n: &str,
            eni: &str,
            index: u32,
            addresses: &[&str],
            pool: &str,
        ) -> i64 {
            let record = CloudInterfaceRecord {
                device_index: index,
                ..interface_record(pool, &format!("i-{n}"), addresses)
            };
            self.add(
                self.keys.cloud_interface(&node(n), &id(eni)),
                encode_value(&record).unwrap(),
            )
        }

        fn intent(&mut self, intent_id: &str, op: CloudOp) {
            let record = CloudIntentRecord {
                node: Some(node("a")),
                pool: PoolName::new("pods").unwrap(),
                instance_id: Some("i-a".to_owned()),
                op,
                started_ms: 0,
            };
            self.add(
                self.keys.cloud_intent(&id(intent_id)),
                encode_value(&record).unwrap(),
            );
        }
    }

    #[test]
    fn consistent_records_pass() {
        let mut c = cluster();
        let rev = c.interface("a", "eni-1", 1, &["10.0.1.5/32", "10.0.1.16/28"]);
        c.interface("a", "eni-2", 2, &["10.0.2.5/32"]);
        c.interface("b", "eni-3", 1, &["10.0.3.5/32"]);
        c.release("a", "pods", "10.0.1.16/28", ReleaseState::Marked, rev);
        assert_eq!(c.check(), Vec::<String>::new());
    }

    #[test]
    fn record_problems_are_found() {
        let mut c = cluster();
        let rev = c.interface("a", "eni-1", 1, &["10.0.1.5/32", "10.1.0.5/32"]);
        c.interface("a", "eni-2", 1, &["10.0.1.0/28"]);
        c.interface("ghost", "eni-3", 1, &[]);
        c.interface_in("b", "eni-4", 1, &["10.9.0.5/32"], "blocks");
        c.release("a", "pods", "10.0.1.5/32", ReleaseState::Marked, rev + 1000);
        c.release("a", "pods", "10.0.7.7/32", ReleaseState::Marked, rev);
        c.intent(
            "intent-1",
            CloudOp::Delete {
                interface: id("eni-9"),
            },
        );
        let problems = c.check();
        assert_reported(
            &problems,
            &[
                "10.1.0.5/32 of cloud interface eni-1",
                "both have device index 1",
                "overlap",
                "names node ghost, which is not registered",
                "which is not a cloud pool",
                "names grant revision",
                "names no address",
            ],
        );
        assert_eq!(problems.len(), 7, "{problems:#?}");
        // Garbage values are reported, not skipped.
        let mut c = cluster();
        c.add(
            c.keys.cloud_interface(&node("a"), &id("eni-1")),
            b"{".to_vec(),
        );
        assert!(c.check()[0].contains("garbage value"));
    }

    #[test]
    fn records_against_the_cloud() {
        let mut c = cluster();
        let rev = c.interface("a", "eni-1", 1, &["10.0.1.5/32", "10.0.1.6/32"]);
        c.interface("a", "eni-2", 2, &["10.0.2.5/32"]);
        let truth = |pairs: &[(&str, Option<&str>, &[&str])]| -> CloudTruth {
            pairs
                .iter()
                .map(|(eni, at, addrs)| {
                    (
                        (*eni).to_owned(),
                        (
                            at.map(str::to_owned),
                            addrs.iter().map(|a| net(a)).collect(),
                        ),
                    )
                })
                .collect()
        };
        let good = truth(&[
            ("eni-1", Some("i-a"), &["10.0.1.5/32", "10.0.1.6/32"]),
            ("eni-2", Some("i-a"), &["10.0.2.5/32"]),
            ("eni-other", None, &["10.0.9.9/32"]),
        ]);
        assert!(cloud_problems(&c.keys, &c.entries, &good).is_empty());
        let bad = truth(&[
            ("eni-1", None, &["10.0.1.5/32", "10.0.1.7/32"]),
            ("eni-other", None, &["10.0.1.7/32"]),
        ]);
        let problems = cloud_problems(&c.keys, &c.entries, &bad);
        assert_reported(
            &problems,
            &[
                "eni-2 of node a is not in the cloud",
                "the cloud has it unattached",
                "10.0.1.6/32 of cloud interface eni-1",
                "10.0.1.7/32 is on cloud interface eni-1",
                "the cloud has 10.0.1.7/32 on interface eni-1",
            ],
        );
        assert_eq!(problems.len(), 5, "{problems:#?}");
        // An address in a release handshake may be gone; an interface with an open intent is
        // in flux.
        c.release("a", "pods", "10.0.1.6/32", ReleaseState::Marked, rev);
        c.intent(
            "intent-2",
            CloudOp::Delete {
                interface: id("eni-2"),
            },
        );
        let gone = truth(&[("eni-1", Some("i-a"), &["10.0.1.5/32"])]);
        assert!(cloud_problems(&c.keys, &c.entries, &gone).is_empty());
    }

    /// Issue 20: one interface and its addresses recorded for two nodes (a reset cloud handed
    /// them out again) is found from etcd alone, and against the cloud the record of the node
    /// whose instance does not have it is named, attaching or attached.
    #[test]
    fn an_interface_recorded_for_two_nodes_is_found_with_and_without_the_cloud() {
        for attachment in [CloudAttachment::Attaching, CloudAttachment::Attached] {
            let mut c = cluster();
            for n in ["a", "b"] {
                let record = CloudInterfaceRecord {
                    mac: "02:00:00:00:00:05".to_owned(),
                    attachment,
                    ..interface_record("pods", &format!("i-{n}"), &["10.0.0.7/32", "10.0.0.8/32"])
                };
                c.add(
                    c.keys.cloud_interface(&node(n), &id("eni-5")),
                    encode_value(&record).unwrap(),
                );
            }
            let problems = c.check();
            let has = |text: &str| problems.iter().any(|p| p.contains(text));
            assert!(
                has("cloud interface eni-5 is recorded for nodes a and b"),
                "{problems:#?}"
            );
            assert!(has("10.0.0.7/32") && has("overlap"), "{problems:#?}");
            let truth: CloudTruth = [(
                "eni-5".to_owned(),
                (
                    Some("i-b".to_owned()),
                    vec![net("10.0.0.7/32"), net("10.0.0.8/32")],
                ),
            )]
            .into_iter()
            .collect();
            let problems = cloud_problems(&c.keys, &c.entries, &truth);
            assert_eq!(
                problems,
                vec![
                    "cloud interface eni-5 of node a is recorded attached to i-a, the cloud has \
                     it attached to i-b"
                        .to_owned()
                ],
                "{attachment:?}"
            );
        }
    }
}
