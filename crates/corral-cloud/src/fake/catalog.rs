//! The instance types the fake knows, with their real interface and address limits (AWS VPC
//! CNI's `vpc_ip_resource_limit.go`; IPv6 addresses per interface equal IPv4's).

use crate::{Hypervisor, InstanceTypeInfo};

/// (type, interfaces, IPv4 per interface, hypervisor).
const TYPES: &[(&str, u32, u32, Hypervisor)] = &[
    ("t2.micro", 2, 2, Hypervisor::Xen),
    ("t3.nano", 2, 2, Hypervisor::Nitro),
    ("t3.micro", 2, 2, Hypervisor::Nitro),
    ("t3.small", 3, 4, Hypervisor::Nitro),
    ("t3.medium", 3, 6, Hypervisor::Nitro),
    ("t3.large", 3, 12, Hypervisor::Nitro),
    ("m4.large", 2, 10, Hypervisor::Xen),
    ("m5.large", 3, 10, Hypervisor::Nitro),
    ("c5.large", 3, 10, Hypervisor::Nitro),
    ("m5.xlarge", 4, 15, Hypervisor::Nitro),
    ("m5.2xlarge", 4, 15, Hypervisor::Nitro),
    ("m5.4xlarge", 8, 30, Hypervisor::Nitro),
    ("m5.24xlarge", 15, 50, Hypervisor::Nitro),
    ("c5n.18xlarge", 15, 50, Hypervisor::Nitro),
];

/// Every built-in instance type's limits.
pub fn instance_types() -> Vec<InstanceTypeInfo> {
    TYPES
        .iter()
        .map(
            |&(name, interfaces, addresses, hypervisor)| InstanceTypeInfo {
                instance_type: name.to_owned(),
                max_interfaces: interfaces,
                ipv4_per_interface: addresses,
                ipv6_per_interface: addresses,
                prefix_delegation: hypervisor == Hypervisor::Nitro,
                hypervisor,
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_pods_match_aws_vpc_cni() {
        let types = instance_types();
        let max_pods = |name: &str| {
            types
                .iter()
                .find(|t| t.instance_type == name)
                .unwrap()
                .max_pods()
        };
        assert_eq!(max_pods("t2.micro"), 4);
        assert_eq!(max_pods("t3.small"), 11);
        assert_eq!(max_pods("m5.large"), 29);
        assert_eq!(max_pods("m5.4xlarge"), 234);
        assert_eq!(max_pods("m5.24xlarge"), 737);
    }
}
