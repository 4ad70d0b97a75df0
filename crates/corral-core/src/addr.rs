//! Address families and the integer form of addresses the engine computes with.
//!
//! The engine works on `u128` offsets in a per-family address space: an IPv4 address is its
//! 32-bit value, an IPv6 address its 128-bit value. Families never share a set, so the two spaces
//! never collide (`10.0.0.1` and `::a00:1` are different addresses).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address.
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The largest address of the family as an integer.
    pub fn max_value(self) -> u128 {
        match self {
            Family::V4 => u128::from(u32::MAX),
            Family::V6 => u128::MAX,
        }
    }

    /// Number of bits in an address of the family.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// Index used for per-family arrays.
    pub(crate) fn index(self) -> usize {
        match self {
            Family::V4 => 0,
            Family::V6 => 1,
        }
    }

    /// The lower-case name used in messages and status lines.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// Turns an integer of this family back into an address.
    ///
    /// Values beyond the family's range are truncated; the engine never produces them.
    pub fn addr(self, value: u128) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The integer value of an address within its family.
pub fn addr_value(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// An address with its family, in the integer form the engine indexes by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct AddrKey {
    pub family: Family,
    pub value: u128,
}

impl AddrKey {
    pub fn new(addr: IpAddr) -> AddrKey {
        AddrKey {
            family: Family::of(addr),
            value: addr_value(addr),
        }
    }

    pub fn ip(self) -> IpAddr {
        self.family.addr(self.value)
    }
}

/// What an address that is never handed out is reserved as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reserved {
    /// The subnet's network address.
    Network,
    /// The IPv4 subnet's broadcast address.
    Broadcast,
    /// The range's gateway.
    Gateway,
    /// An interface's primary address: the address of the interface (on the primary
    /// interface, the node's own), never a pod's.
    Primary,
}

impl fmt::Display for Reserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reserved::Network => "network address",
            Reserved::Broadcast => "broadcast address",
            Reserved::Gateway => "gateway",
            Reserved::Primary => "interface's primary address",
        })
    }
}
