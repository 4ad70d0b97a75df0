//! How many node IDs each network of Contiv's node-ID plan gives distinct addresses, so that no node ID wraps onto another's addresses in any of them.
//!
//! Contiv derives a node's addresses from its ID in four networks: the pod subnet and the host
//! interconnect subnet (split per node), the node interconnect network and the VXLAN network
//! (one host address per node, `n & (2^b − 1)`). Where a network holds fewer node IDs than the
//! plan's range, node `n + 2^b` gets node `n`'s address (Contiv's `TestExceededVxlanRange` /
//! `TestExceededNodeIPRange`). So the plan's largest node ID is bounded by every network.

use ipnet::IpNet;

use super::{ConfigError, NodeIdPlanConfig, invalid, split_count};
use crate::net::{addr_u128, family_of, net_range};
use corral_core::Family;

/// One network of the plan and the node IDs it gives distinct addresses (1..=`node_ids`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdBound {
    /// The configuration field naming the network (`node_ids.vxlan`).
    pub field: &'static str,
    /// The network.
    pub network: IpNet,
    /// How many node IDs it holds.
    pub node_ids: u128,
}

/// The last address of `network` a node may take: an IPv4 network of 4 addresses or more
/// keeps its broadcast address (the last) from nodes.
pub(crate) fn last_node_address(network: &IpNet) -> u128 {
    let (_, end) = net_range(network);
    match family_of(network) {
        Family::V4 if network.prefix_len() <= 30 => end - 1,
        _ => end,
    }
}

impl NodeIdPlanConfig {
    /// `node_interconnect_excluded` as numbers, sorted, each once.
    pub(crate) fn excluded_node_addresses(&self) -> Vec<u128> {
        let mut excluded: Vec<u128> = self
            .node_interconnect_excluded
            .iter()
            .map(|a| addr_u128(*a))
            .collect();
        excluded.sort_unstable();
        excluded.dedup();
        excluded
    }

    /// Every network of the plan that bounds the node IDs, with how many node IDs it holds:
    /// the pod subnet and host interconnect subnet split per node (2^(P−s) subnets; node
    /// 2^(P−s) takes subnet 0), the node interconnect network (its hosts after the network
    /// address, less excluded addresses and an IPv4 broadcast) and the VXLAN network (likewise,
    /// nothing excluded).
    pub fn bounds(&self) -> Vec<NodeIdBound> {
        let hosts = |network: &IpNet, excluded: &[u128]| -> u128 {
            let (start, _) = net_range(network);
            let last = last_node_address(network);
            let taken = excluded.iter().filter(|e| **e <= last).count() as u128;
            (last - start).saturating_sub(taken)
        };
        let excluded = self.excluded_node_addresses();
        vec![
            NodeIdBound {
                field: "node_ids.pod_subnet",
                network: self.pod_subnet,
                node_ids: split_count(&self.pod_subnet, self.pod_subnet_node_prefix_len),
            },
            NodeIdBound {
                field: "node_ids.host_interconnect_subnet",
                network: self.host_interconnect_subnet,
                node_ids: split_count(
                    &self.host_interconnect_subnet,
                    self.host_interconnect_node_prefix_len,
                ),
            },
            NodeIdBound {
                field: "node_ids.node_interconnect",
                network: self.node_interconnect,
                node_ids: hosts(&self.node_interconnect, &excluded),
            },
            NodeIdBound {
                field: "node_ids.vxlan",
                network: self.vxlan,
                node_ids: hosts(&self.vxlan, &[]),
            },
        ]
    }

    /// Refuses a plan some network of which holds no node at all, or a `max_node_id` beyond
    /// what a network holds, naming the network and both numbers.
    pub(super) fn validate_bounds(&self) -> Result<(), ConfigError> {
        let bounds = self.bounds();
        if let Some(empty) = bounds.iter().find(|b| b.node_ids == 0) {
            return Err(invalid(
                empty.field,
                format!("{} has no address for any node", empty.network),
            ));
        }
        if let Some(max) = self.max_node_id {
            if max == 0 {
                return Err(invalid("node_ids.max_node_id", "must be at least 1"));
            }
            if let Some(short) = bounds.iter().find(|b| u128::from(max) > b.node_ids) {
                return Err(invalid(
                    "node_ids.max_node_id",
                    format!(
                        "{max} node IDs do not fit {} {}, which has addresses for {} nodes \
                         (a node ID beyond would share another node's)",
                        short.field, short.network, short.node_ids
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::IpAddr;

    use proptest::prelude::*;

    use super::*;
    use crate::config::ClusterConfig;
    use crate::plan::NodePlan;

    fn plan(node_interconnect: &str, vxlan: &str, max: Option<u32>) -> NodeIdPlanConfig {
        NodeIdPlanConfig {
            pod_subnet: "10.1.0.0/16".parse().unwrap(),
            pod_subnet_node_prefix_len: 24,
            host_interconnect_subnet: "172.30.0.0/16".parse().unwrap(),
            host_interconnect_node_prefix_len: 24,
            node_interconnect: node_interconnect.parse().unwrap(),
            node_interconnect_excluded: vec![],
            vxlan: vxlan.parse().unwrap(),
            service: "10.96.0.0/12".parse().unwrap(),
            max_node_id: max,
        }
    }

    fn config(plan: NodeIdPlanConfig) -> ClusterConfig {
        ClusterConfig {
            quarantine_secs: 300,
            resync: Default::default(),
            pools: vec![],
            node_ids: Some(plan),
            default_pool: None,
            namespaces: BTreeMap::new(),
            history: Default::default(),
            demand_writes_per_sec: crate::config::DEFAULT_DEMAND_WRITES_PER_SEC,
        }
    }

    /// Contiv's `TestExceededNodeIPRange`: a /28 node interconnect holds 14 nodes (hosts 1 to
    /// 14; 15 is the broadcast): node 17 would take node 1's address.
    #[test]
    fn a_small_node_interconnect_bounds_the_node_ids() {
        let small = plan("192.168.16.0/28", "192.168.30.0/24", None);
        assert_eq!(small.max_node_id(), 14);
        config(small.clone()).validate().unwrap();
        assert!(NodePlan::derive(&small, 14).is_ok());
        assert!(NodePlan::derive(&small, 17).is_err());
        let too_many = plan("192.168.16.0/28", "192.168.30.0/24", Some(20));
        let error = config(too_many).validate().unwrap_err().to_string();
        assert!(error.contains("node_ids.max_node_id"), "{error}");
        assert!(
            error.contains("node_ids.node_interconnect 192.168.16.0/28"),
            "{error}"
        );
        assert!(error.contains("20 node IDs"), "{error}");
        assert!(error.contains("addresses for 14 nodes"), "{error}");
    }

    /// Contiv's `TestExceededVxlanRange`.
    #[test]
    fn a_small_vxlan_network_bounds_the_node_ids() {
        let small = plan("192.168.16.0/24", "192.168.30.0/28", None);
        assert_eq!(small.max_node_id(), 14);
        let error = config(plan("192.168.16.0/24", "192.168.30.0/28", Some(17)))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(error.contains("node_ids.vxlan 192.168.30.0/28"), "{error}");
        assert!(error.contains("17 node IDs"), "{error}");
        // A node interconnect without a node address at all.
        let error = config(plan("192.168.16.0/32", "192.168.30.0/24", None))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(error.contains("node_ids.node_interconnect"), "{error}");
        let error = config(plan("192.168.16.0/24", "192.168.30.0/24", Some(0)))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(error.contains("max_node_id: must be at least 1"), "{error}");
    }

    #[test]
    fn excluded_addresses_and_the_pod_split_bound_the_node_ids() {
        let mut p = plan("192.168.16.0/24", "192.168.30.0/24", None);
        // 254 hosts; .1 excluded (twice counts once) → 253; the pods' 256 and VXLAN's 254.
        p.node_interconnect_excluded = vec!["192.168.16.1".parse().unwrap(); 2];
        assert_eq!(p.max_node_id(), 253);
        assert!(NodePlan::derive(&p, 253).is_ok());
        // The pod split is the bound when the networks are larger.
        let wide = NodeIdPlanConfig {
            pod_subnet: "10.1.0.0/22".parse().unwrap(),
            ..plan("192.168.16.0/24", "192.168.30.0/24", None)
        };
        assert_eq!(wide.max_node_id(), 4);
        let error = config(NodeIdPlanConfig {
            max_node_id: Some(5),
            ..wide
        })
        .validate()
        .unwrap_err()
        .to_string();
        assert!(error.contains("node_ids.pod_subnet 10.1.0.0/22"), "{error}");
        assert!(error.contains("addresses for 4 nodes"), "{error}");
    }

    fn every_address(plan: &NodePlan) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("pod subnet", plan.pod_subnet.to_string()),
            ("host interconnect", plan.host_interconnect.to_string()),
            ("node ip", plan.node_ip.to_string()),
            ("vxlan ip", plan.vxlan_ip.to_string()),
        ];
        out.sort();
        out
    }

    fn arb_plan() -> impl Strategy<Value = NodeIdPlanConfig> {
        (
            16u8..=22,
            1u8..=10,
            16u8..=22,
            1u8..=10,
            22u8..=31,
            22u8..=31,
            proptest::collection::vec(0u8..=255, 0..4),
            proptest::option::of(1u32..600),
        )
            .prop_map(|(ps, pd, hs, hd, ni, vx, excluded, max)| {
                let excluded: Vec<IpAddr> = excluded
                    .into_iter()
                    .map(|b| IpAddr::from([192, 168, 16, b]))
                    .collect();
                let node_interconnect: IpNet = format!("192.168.16.0/{ni}").parse().unwrap();
                NodeIdPlanConfig {
                    pod_subnet: format!("10.0.0.0/{ps}").parse::<IpNet>().unwrap().trunc(),
                    pod_subnet_node_prefix_len: (ps + pd).min(29),
                    host_interconnect_subnet: format!("172.16.0.0/{hs}").parse().unwrap(),
                    host_interconnect_node_prefix_len: (hs + hd).min(30),
                    node_interconnect,
                    node_interconnect_excluded: excluded
                        .into_iter()
                        .filter(|a| node_interconnect.contains(a))
                        .collect(),
                    vxlan: format!("192.168.32.0/{vx}").parse().unwrap(),
                    service: "10.96.0.0/12".parse().unwrap(),
                    max_node_id: max,
                }
            })
    }

    proptest! {
        /// For any plan validation accepts, distinct node IDs in range never share an address
        /// (or a subnet) in any network, and every ID in range derives.
        #[test]
        fn node_ids_in_range_never_share_an_address(plan in arb_plan()) {
            if config(plan.clone()).validate().is_err() {
                // Refused plans are never used; a refused max_node_id must exceed a bound.
                if let Some(max) = plan.max_node_id {
                    let fits = plan.bounds().iter().all(|b| u128::from(max) <= b.node_ids);
                    prop_assert!(!fits || max == 0 || plan.bounds().iter().any(|b| b.node_ids == 0));
                }
                return Ok(());
            }
            let max = plan.max_node_id();
            prop_assert!(max >= 1);
            let mut seen: BTreeMap<(&'static str, String), u32> = BTreeMap::new();
            // Up to 1,100 IDs: the ranges drawn stay below that but for the IPv4 pod splits.
            for id in 1..=max.min(1100) {
                let derived = NodePlan::derive(&plan, id);
                prop_assert!(derived.is_ok(), "node {} of {}: {:?}", id, max, derived);
                let derived = derived.unwrap();
                prop_assert!(plan.node_interconnect.contains(&derived.node_ip));
                prop_assert!(!plan.node_interconnect_excluded.contains(&derived.node_ip));
                prop_assert!(plan.vxlan.contains(&derived.vxlan_ip));
                for address in every_address(&derived) {
                    if let Some(other) = seen.insert(address.clone(), id) {
                        prop_assert!(false, "nodes {} and {} share {:?}", other, id, address);
                    }
                }
            }
        }
    }
}
