//! Contiv's node-ID address plan: a pure function from the plan's configuration and a node ID to the node's addresses, and back.
//!
//! The formulas are Contiv's (`dissectSubnetForNode`, `cidr.Host` offsets), for IPv4 and IPv6
//! alike (u128 arithmetic). With per-node prefix P over subnet S/s, node n gets subnet index
//! `n & (2^(P−s) − 1)`, so n = 2^(P−s) maps to index 0.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::NodeIdPlanConfig;
use crate::config::node_id_bounds::last_node_address;
use crate::net::{addr_of, addr_u128, family_of, host_mask, net_of, net_range};

/// Why a node's plan cannot be derived.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// The node ID is 0 or above the plan's largest (`NodeIdPlanConfig::max_node_id`, bounded
    /// by every network of the plan, so an ID in range never fails below).
    #[error("node ID {id} is outside 1..={max}")]
    NodeIdOutOfRange {
        /// The node ID.
        id: u32,
        /// The plan's largest node ID.
        max: u32,
    },
    /// The node ID's host part in the node interconnect network is 0.
    #[error("node ID {id} has no node interconnect IP in {network} (its host part is 0)")]
    NoNodeIp {
        /// The node ID.
        id: u32,
        /// The node interconnect network.
        network: IpNet,
    },
    /// Skipping excluded addresses moved the node IP out of its network.
    #[error("node ID {id}'s node interconnect IP falls outside {network} after excluded addresses")]
    NodeIpOutside {
        /// The node ID.
        id: u32,
        /// The node interconnect network.
        network: IpNet,
    },
    /// The node ID's host part in the VXLAN network is 0, or its broadcast address.
    #[error("node ID {id} has no VXLAN IP in {network} (its host part is 0 or the broadcast)")]
    NoVxlanIp {
        /// The node ID.
        id: u32,
        /// The VXLAN network.
        network: IpNet,
    },
}

/// One node's addresses under the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlan {
    /// The node ID.
    pub node_id: u32,
    /// The node's pod subnet.
    #[serde(with = "crate::text")]
    pub pod_subnet: IpNet,
    /// The pods' gateway: host 1 of the pod subnet.
    pub pod_gateway: IpAddr,
    /// The NAT loopback: the pod subnet's broadcast − 1.
    pub nat_loopback: IpAddr,
    /// The first pod address: host 2.
    pub pod_range_start: IpAddr,
    /// The last pod address: broadcast − 2.
    pub pod_range_end: IpAddr,
    /// The node's host interconnect subnet.
    #[serde(with = "crate::text")]
    pub host_interconnect: IpNet,
    /// Its VPP end: host 1.
    pub host_interconnect_vpp: IpAddr,
    /// Its Linux end: host 2.
    pub host_interconnect_linux: IpAddr,
    /// The node's IP on the node interconnect network.
    pub node_ip: IpAddr,
    /// The node interconnect network (the node IP's prefix).
    #[serde(with = "crate::text")]
    pub node_interconnect: IpNet,
    /// The node's VXLAN IP.
    pub vxlan_ip: IpAddr,
    /// The VXLAN network.
    #[serde(with = "crate::text")]
    pub vxlan: IpNet,
    /// The service network.
    #[serde(with = "crate::text")]
    pub service: IpNet,
}

/// Subnet `node_id` of `subnet` split at `prefix_len` (index `n & (2^(P−s) − 1)`).
fn nth_subnet(subnet: &IpNet, prefix_len: u8, node_id: u32) -> Option<IpNet> {
    let family = family_of(subnet);
    let new_bits = u32::from(prefix_len.saturating_sub(subnet.prefix_len()));
    let index = if new_bits >= 32 {
        u128::from(node_id)
    } else {
        u128::from(node_id & ((1u32 << new_bits) - 1))
    };
    let host_bits = u32::from(family.bits().saturating_sub(prefix_len));
    let offset = if host_bits >= 128 {
        0
    } else {
        index << host_bits
    };
    let (base, _) = net_range(subnet);
    net_of(family, base | offset, prefix_len)
}

/// The host part `n & (2^b − 1)` of `network`, or None when it is 0.
fn host_of(network: &IpNet, node_id: u32) -> Option<u128> {
    let part = u128::from(node_id) & host_mask(family_of(network), network.prefix_len());
    (part != 0).then_some(part)
}

impl NodePlan {
    /// The plan of node `node_id` (1..=`config.max_node_id()`).
    pub fn derive(config: &NodeIdPlanConfig, node_id: u32) -> Result<NodePlan, PlanError> {
        let max = config.max_node_id();
        let out_of_range = PlanError::NodeIdOutOfRange { id: node_id, max };
        if node_id == 0 || node_id > max {
            return Err(out_of_range);
        }
        // Each network in its own family (pods IPv4, node interconnect IPv6, say).
        let family = family_of(&config.pod_subnet);
        let pod_subnet = nth_subnet(
            &config.pod_subnet,
            config.pod_subnet_node_prefix_len,
            node_id,
        )
        .ok_or(out_of_range.clone())?;
        let (pod_start, pod_end) = net_range(&pod_subnet);
        let host_interconnect = nth_subnet(
            &config.host_interconnect_subnet,
            config.host_interconnect_node_prefix_len,
            node_id,
        )
        .ok_or(out_of_range)?;
        let (host_start, _) = net_range(&host_interconnect);

        let network = config.node_interconnect;
        let part = host_of(&network, node_id).ok_or(PlanError::NoNodeIp {
            id: node_id,
            network,
        })?;
        let (net_start, _) = net_range(&network);
        let net_last = last_node_address(&network);
        let mut node_ip = net_start + part;
        for ex in config.excluded_node_addresses() {
            if ex <= node_ip {
                node_ip = node_ip.saturating_add(1);
            }
        }
        if node_ip > net_last {
            return Err(PlanError::NodeIpOutside {
                id: node_id,
                network,
            });
        }
        let vxlan_part = host_of(&config.vxlan, node_id).ok_or(PlanError::NoVxlanIp {
            id: node_id,
            network: config.vxlan,
        })?;
        let (vxlan_start, _) = net_range(&config.vxlan);
        if vxlan_start + vxlan_part > last_node_address(&config.vxlan) {
            return Err(PlanError::NoVxlanIp {
                id: node_id,
                network: config.vxlan,
            });
        }
        Ok(NodePlan {
            node_id,
            pod_subnet,
            pod_gateway: addr_of(family, pod_start + 1),
            nat_loopback: addr_of(family, pod_end - 1),
            pod_range_start: addr_of(family, pod_start + 2),
            pod_range_end: addr_of(family, pod_end - 2),
            host_interconnect,
            host_interconnect_vpp: addr_of(family_of(&host_interconnect), host_start + 1),
            host_interconnect_linux: addr_of(family_of(&host_interconnect), host_start + 2),
            node_ip: addr_of(family_of(&network), node_ip),
            node_interconnect: network,
            vxlan_ip: addr_of(family_of(&config.vxlan), vxlan_start + vxlan_part),
            vxlan: config.vxlan,
            service: config.service,
        })
    }
}

/// The pod subnet of node `node_id`, or None outside 1..=max.
pub fn pod_subnet_of(config: &NodeIdPlanConfig, node_id: u32) -> Option<IpNet> {
    let prefix_len = config.pod_subnet_node_prefix_len;
    node_subnet_of(config, &config.pod_subnet, prefix_len, node_id)
}

/// The host interconnect subnet of node `node_id`, or None outside 1..=max.
pub fn host_interconnect_of(config: &NodeIdPlanConfig, node_id: u32) -> Option<IpNet> {
    let prefix_len = config.host_interconnect_node_prefix_len;
    node_subnet_of(
        config,
        &config.host_interconnect_subnet,
        prefix_len,
        node_id,
    )
}

/// Node `node_id`'s `/prefix_len` of `network`, or None outside 1..=max.
fn node_subnet_of(
    config: &NodeIdPlanConfig,
    network: &IpNet,
    prefix_len: u8,
    node_id: u32,
) -> Option<IpNet> {
    if node_id == 0 || node_id > config.max_node_id() {
        return None;
    }
    nth_subnet(network, prefix_len, node_id)
}

/// The node ID whose pod subnet holds `ip`: `(ip XOR pod_subnet) >> (bits − P)`, index 0 being
/// node 2^(P−s); None outside the pod subnet or when that node ID is above the plan's largest.
pub fn node_id_of_pod_ip(config: &NodeIdPlanConfig, ip: IpAddr) -> Option<u32> {
    if !config.pod_subnet.contains(&ip) {
        return None;
    }
    let family = family_of(&config.pod_subnet);
    let (base, _) = net_range(&config.pod_subnet);
    let host_bits = u32::from(family.bits() - config.pod_subnet_node_prefix_len);
    let index = (addr_u128(ip) ^ base) >> host_bits;
    let id = if index == 0 {
        let new_bits =
            u32::from(config.pod_subnet_node_prefix_len - config.pod_subnet.prefix_len());
        if new_bits >= 32 {
            return None;
        }
        1u32 << new_bits
    } else {
        u32::try_from(index).ok()?
    };
    (id <= config.max_node_id()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> NodeIdPlanConfig {
        NodeIdPlanConfig {
            pod_subnet: "10.1.0.0/16".parse().unwrap(),
            pod_subnet_node_prefix_len: 24,
            host_interconnect_subnet: "172.30.0.0/16".parse().unwrap(),
            host_interconnect_node_prefix_len: 24,
            node_interconnect: "192.168.16.0/24".parse().unwrap(),
            node_interconnect_excluded: vec!["192.168.16.1".parse().unwrap()],
            vxlan: "192.168.30.0/24".parse().unwrap(),
            service: "10.96.0.0/12".parse().unwrap(),
            max_node_id: None,
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_worked_example_node_5() {
        let config = defaults();
        let plan = NodePlan::derive(&config, 5).unwrap();
        assert_eq!(plan.pod_subnet.to_string(), "10.1.5.0/24");
        assert_eq!(plan.pod_gateway, ip("10.1.5.1"));
        assert_eq!(plan.nat_loopback, ip("10.1.5.254"));
        assert_eq!(plan.pod_range_start, ip("10.1.5.2"));
        assert_eq!(plan.pod_range_end, ip("10.1.5.253"));
        assert_eq!(plan.host_interconnect.to_string(), "172.30.5.0/24");
        assert_eq!(plan.host_interconnect_vpp, ip("172.30.5.1"));
        assert_eq!(plan.host_interconnect_linux, ip("172.30.5.2"));
        assert_eq!(plan.node_ip, ip("192.168.16.6"));
        assert_eq!(plan.vxlan_ip, ip("192.168.30.5"));
        assert_eq!(plan.service.to_string(), "10.96.0.0/12");
        let no_exclusion = NodeIdPlanConfig {
            node_interconnect_excluded: vec![],
            ..defaults()
        };
        assert_eq!(
            NodePlan::derive(&no_exclusion, 5).unwrap().node_ip,
            ip("192.168.16.5")
        );
        assert_eq!(node_id_of_pod_ip(&config, ip("10.1.5.9")), Some(5));
        assert_eq!(pod_subnet_of(&config, 5), Some(plan.pod_subnet));
        assert_eq!(
            host_interconnect_of(&config, 5),
            Some(plan.host_interconnect)
        );
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(serde_json::from_str::<NodePlan>(&json).unwrap(), plan);
    }

    #[test]
    fn edges_of_the_id_range() {
        let config = defaults();
        // The pod and host splits hold 256 nodes, the node interconnect /24 253 (hosts 1 to
        // 254, .1 excluded), the VXLAN /24 254: every network bounds the range.
        assert_eq!(config.max_node_id(), 253);
        assert_eq!(
            NodePlan::derive(&config, 253).unwrap().node_ip,
            ip("192.168.16.254")
        );
        // 256 = 2^newBits would map to pod subnet index 0, and node interconnect host 0.
        assert_eq!(pod_subnet_of(&config, 256), None);
        assert_eq!(node_id_of_pod_ip(&config, ip("10.1.0.7")), None);
        assert!(matches!(
            NodePlan::derive(&config, 0),
            Err(PlanError::NodeIdOutOfRange { .. })
        ));
        for id in [254, 255, 256, 257] {
            assert!(matches!(
                NodePlan::derive(&config, id),
                Err(PlanError::NodeIdOutOfRange { max: 253, .. })
            ));
        }
        // With a larger node interconnect, the pod split bounds it, and node 256 takes pod
        // subnet 0 (Contiv's index `n & (2^(P−s) − 1)`).
        let wide = NodeIdPlanConfig {
            node_interconnect: "192.168.16.0/23".parse().unwrap(),
            vxlan: "192.168.30.0/23".parse().unwrap(),
            ..defaults()
        };
        assert_eq!(wide.max_node_id(), 256);
        assert_eq!(
            pod_subnet_of(&wide, 256).unwrap().to_string(),
            "10.1.0.0/24"
        );
        assert_eq!(node_id_of_pod_ip(&wide, ip("10.1.0.7")), Some(256));
        assert_eq!(
            NodePlan::derive(&wide, 256).unwrap().node_ip,
            ip("192.168.17.1")
        );
        assert_eq!(node_id_of_pod_ip(&config, ip("10.2.0.1")), None);
        assert_eq!(node_id_of_pod_ip(&config, ip("fd00::1")), None);
        // Stepping over several excluded addresses, in any order.
        let stepping = NodeIdPlanConfig {
            node_interconnect_excluded: vec![
                ip("192.168.16.3"),
                ip("192.168.16.1"),
                ip("192.168.16.2"),
            ],
            ..defaults()
        };
        assert_eq!(
            NodePlan::derive(&stepping, 1).unwrap().node_ip,
            ip("192.168.16.4")
        );
        assert_eq!(
            NodePlan::derive(&stepping, 5).unwrap().node_ip,
            ip("192.168.16.8")
        );
    }

    #[test]
    fn an_ipv6_plan() {
        let config = NodeIdPlanConfig {
            pod_subnet: "fd00:1::/48".parse().unwrap(),
            pod_subnet_node_prefix_len: 64,
            host_interconnect_subnet: "fd00:2::/48".parse().unwrap(),
            host_interconnect_node_prefix_len: 64,
            node_interconnect: "fd00:3::/64".parse().unwrap(),
            node_interconnect_excluded: vec![],
            vxlan: "fd00:4::/64".parse().unwrap(),
            service: "fd00:5::/108".parse().unwrap(),
            max_node_id: None,
        };
        assert_eq!(config.max_node_id(), 65_536);
        let plan = NodePlan::derive(&config, 5).unwrap();
        assert_eq!(plan.pod_subnet.to_string(), "fd00:1:0:5::/64");
        assert_eq!(plan.nat_loopback, ip("fd00:1:0:5:ffff:ffff:ffff:fffe"));
        assert_eq!(plan.node_ip, ip("fd00:3::5"));
        assert_eq!(node_id_of_pod_ip(&config, ip("fd00:1:0:5::9")), Some(5));
    }

    /// Contiv's `TestNodeCIDRIPv6`: an IPv6 node interconnect under IPv4 pods, node 1 gets
    /// fe10:f00d::1 in fe10:f00d::/90. Each network keeps its own family (here an IPv6 VXLAN
    /// and host interconnect too), and the configuration validates.
    #[test]
    fn a_mixed_family_plan() {
        let config = NodeIdPlanConfig {
            node_interconnect: "fe10:f00d::/90".parse().unwrap(),
            node_interconnect_excluded: vec![],
            ..defaults()
        };
        let plan = NodePlan::derive(&config, 1).unwrap();
        assert_eq!(plan.node_ip, ip("fe10:f00d::1"));
        assert_eq!(plan.pod_subnet.to_string(), "10.1.1.0/24");
        assert_eq!(plan.vxlan_ip, ip("192.168.30.1"));
        // The /90 holds far more nodes than the IPv4 networks: the VXLAN /24's 254 hosts
        // bound the IDs.
        assert_eq!(config.max_node_id(), 254);
        let text = r#"
[[pools]]
name = "default"
[pools.ipv4]
cidrs = ["10.244.0.0/16"]
node_prefix_len = 24
[node_ids]
pod_subnet = "10.1.0.0/16"
pod_subnet_node_prefix_len = 24
host_interconnect_subnet = "fd30::/48"
host_interconnect_node_prefix_len = 64
node_interconnect = "fe10:f00d::/90"
node_interconnect_excluded = ["fe10:f00d::1"]
vxlan = "fd40::/64"
service = "10.96.0.0/12"
"#;
        let config = crate::ClusterConfig::from_toml(text).unwrap();
        let ids = config.node_ids.as_ref().unwrap();
        let plan = NodePlan::derive(ids, 3).unwrap();
        assert_eq!(plan.node_ip, ip("fe10:f00d::4"), "past the excluded ::1");
        assert_eq!(plan.host_interconnect.to_string(), "fd30:0:0:3::/64");
        assert_eq!(plan.host_interconnect_vpp, ip("fd30:0:0:3::1"));
        assert_eq!(plan.vxlan_ip, ip("fd40::3"));
        assert_eq!(plan.pod_gateway, ip("10.1.3.1"));
        // A network of either family is still checked against its own: an IPv6 host
        // interconnect split past /126 has no room for the two ends.
        let bad = text.replace(
            "host_interconnect_node_prefix_len = 64",
            "host_interconnect_node_prefix_len = 127",
        );
        let error = crate::ClusterConfig::from_toml(&bad)
            .unwrap_err()
            .to_string();
        assert!(error.contains("between"), "{error}");
    }
}
