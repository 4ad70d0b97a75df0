//! Address arithmetic on `u128`: CIDRs as inclusive integer ranges, and back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use corral_core::Family;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The family of a CIDR.
pub fn family_of(net: &IpNet) -> Family {
    match net {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    }
}

/// An address as an integer in its family's space.
pub fn addr_u128(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of a family with integer value `value` (truncated to the family's width).
pub fn addr_of(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// `2^host_bits - 1`: the largest host offset of a prefix, without overflow for /0 IPv6.
pub fn host_mask(family: Family, prefix_len: u8) -> u128 {
    let host_bits = u32::from(family.bits().saturating_sub(prefix_len));
    if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    }
}

/// The first and last address of a CIDR as integers.
pub fn net_range(net: &IpNet) -> (u128, u128) {
    let start = addr_u128(net.network());
    let family = family_of(net);
    (start, start | host_mask(family, net.prefix_len()))
}

/// The CIDR of a family starting at `start` with `prefix_len` (host bits are cleared).
pub fn net_of(family: Family, start: u128, prefix_len: u8) -> Option<IpNet> {
    let start = start & !host_mask(family, prefix_len);
    match addr_of(family, start) {
        IpAddr::V4(a) => Ipv4Net::new(a, prefix_len).ok().map(IpNet::V4),
        IpAddr::V6(a) => Ipv6Net::new(a, prefix_len).ok().map(IpNet::V6),
    }
}

/// Whether two CIDRs share an address (never across families).
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    if family_of(a) != family_of(b) {
        return false;
    }
    let (a_start, a_end) = net_range(a);
    let (b_start, b_end) = net_range(b);
    a_start <= b_end && b_start <= a_end
}

/// `2^exponent`, saturating at `u128::MAX`.
pub fn pow2_saturating(exponent: u32) -> u128 {
    if exponent >= 128 {
        u128::MAX
    } else {
        1u128 << exponent
    }
}
