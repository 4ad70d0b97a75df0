//! Interface-backed pools: the cloud interfaces of a node (AWS ENIs, Azure NICs), their
//! secondary addresses and delegated prefixes, as ranges of one engine pool.
//!
//! This is AWS VPC CNI ipamd's `DataStore` on top of the [`Engine`]: every address or prefix of
//! an interface is one range of the pool (a /32 or /128 secondary address, a /28 IPv4 or /80
//! IPv6 delegated prefix, inside the interface's subnet), so allocation, the attachment-key
//! index, cooldowns and restore are the engine's. [`Interfaces`] only remembers which interface
//! each range belongs to, so [`Interfaces::assign`] returns the address with its interface's
//! device number, MAC, gateway, subnet and routes (Cilium's `AllocationResult`) in O(log n).
//!
//! Invariants (checked by [`Interfaces::check`]):
//!
//! - interface ids and device numbers are unique within the table;
//! - every address of an interface lies in the interface's subnet of its family, is a single
//!   address or a delegated prefix, and is exactly one active range of the pool in the engine;
//!   every active range of the pool is the address of exactly one interface (an interface
//!   pool holds only interface addresses: add no other range to it);
//! - only interface addresses are handed out: [`Interfaces::assign`] sees the engine's choice
//!   before it is made ([`Engine::allocate_if`]) and refuses one outside every interface
//!   address (a range added to the pool by other means) with
//!   [`InterfaceError::NotOnInterface`], so even a pool that breaks the previous rule never
//!   hands such an address out, and the refusal leaves no cooldown or generation behind;
//! - addresses never overlap, within an interface or across interfaces (the engine refuses
//!   ranges that overlap any range of any pool);
//! - every refusal changes nothing: each operation validates and plans against the table and
//!   the engine first, then applies;
//! - a released address cools for the pool's cooldown (AWS: 30 s) and is handed out again only
//!   when nothing else is free; the cooldown is the engine's, so stores keep it across restarts.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use crate::addr::{Family, addr_value};
use crate::engine::{Engine, Released, Request, Target};
use crate::error::AllocError;
use crate::input::SpecError;
use crate::spec::{AttachmentKey, Exclusion, PoolName, RangeSpec, Reserved};
use crate::time::Timestamp;

/// How the reason of an exclusion made for a trunk or excluded interface's address starts
/// (see [`InterfaceSpec::exclusion_of`]); stores recognise and rewrite them by it.
pub const INTERFACE_EXCLUSION_PREFIX: &str = "address of interface ";

/// Longest interface id accepted, in bytes.
pub const MAX_INTERFACE_ID_LEN: usize = 64;

/// The id of a cloud interface (`eni-0123456789abcdef0`): 1–64 bytes of `[A-Za-z0-9._:-]`,
/// starting with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InterfaceId(Arc<str>);

impl InterfaceId {
    pub fn new(id: &str) -> Result<InterfaceId, SpecError> {
        if crate::spec::is_token(id, MAX_INTERFACE_ID_LEN, b"._:-") {
            Ok(InterfaceId(Arc::from(id)))
        } else {
            Err(SpecError::InvalidInterfaceId { id: id.to_owned() })
        }
    }
}

crate::spec::name_text!(InterfaceId, SpecError);

/// A MAC address, shown as `0a:1b:2c:3d:4e:5f`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = SpecError;

    /// Six pairs of hexadecimal digits separated by `:`, in either case.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || SpecError::InvalidMac {
            input: text.to_owned(),
        };
        let mut bytes = [0u8; 6];
        let mut parts = text.split(':');
        for byte in &mut bytes {
            let part = parts.next().ok_or_else(invalid)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| invalid())?;
        }
        if parts.next().is_some() {
            return Err(invalid());
        }
        Ok(MacAddr(bytes))
    }
}

/// What is known about one interface, as the cloud describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceSpec {
    pub id: InterfaceId,
    /// The attachment's device index (0 is the primary interface).
    pub device_number: u32,
    pub primary: bool,
    /// A trunk interface carries branch interfaces (security groups for pods), never pod
    /// addresses of its own.
    pub trunk: bool,
    /// Excluded from pod addresses (ipamd's `node.k8s.amazonaws.com/no_manage` tag).
    pub excluded: bool,
    /// The interface's subnets, at most one per family.
    pub subnets: Vec<IpNet>,
    pub mac: MacAddr,
    /// Gateways, at most one per family. Without one for IPv4, the subnet's first host (the
    /// VPC router, network + 1) is the gateway; IPv6 has none unless given (it may be
    /// link-local, outside the subnet).
    pub gateways: Vec<IpAddr>,
    /// The CIDRs routed through this interface (the VPC's), for the pod's routes.
    pub routes: Vec<IpNet>,
    /// The interface's own primary addresses, at most one per family, each inside its
    /// family's subnet (ipamd: an ENI's primary private IP; on the primary interface, the
    /// node's address): recorded and shown, never handed out. An address or prefix that holds
    /// one is refused ([`Reserved::Primary`]).
    pub primary_addresses: Vec<IpAddr>,
    pub created_at: Timestamp,
}

impl InterfaceSpec {
    /// The interface's subnet of a family.
    pub fn subnet(&self, family: Family) -> Option<IpNet> {
        self.subnets
            .iter()
            .copied()
            .find(|subnet| Family::of(subnet.addr()) == family)
    }

    /// The gateway of a family: the one given, else for IPv4 the subnet's first host.
    pub fn gateway(&self, family: Family) -> Option<IpAddr> {
        if let Some(gateway) = self
            .gateways
            .iter()
            .copied()
            .find(|gateway| Family::of(*gateway) == family)
        {
            return Some(gateway);
        }
        match (family, self.subnet(family)) {
            (Family::V4, Some(subnet)) if subnet.prefix_len() < 31 => {
                Some(family.addr(addr_value(subnet.network()) + 1))
            }
            _ => None,
        }
    }

    /// Whether the interface's addresses may go to pods: neither a trunk nor excluded.
    pub fn serves_pods(&self) -> bool {
        !(self.trunk || self.excluded)
    }

    /// The engine exclusion that keeps an address of a trunk or excluded interface from ever
    /// being handed out; its reason starts with [`INTERFACE_EXCLUSION_PREFIX`] and names the
    /// interface. `None` for an interface that serves pods.
    pub fn exclusion_of(&self, address: IpNet) -> Option<Exclusion> {
        if self.serves_pods() {
            return None;
        }
        let what = if self.trunk { "trunk" } else { "excluded" };
        Exclusion::new(
            address,
            &format!("{INTERFACE_EXCLUSION_PREFIX}{} ({what})", self.id),
        )
        .ok()
    }

    /// The family of `items[i]` (its address read by `addr`), refused when an earlier item
    /// has that family: a spec has at most one `what` per family.
    fn one_per_family<T>(
        &self,
        items: &[T],
        i: usize,
        addr: impl Fn(&T) -> IpAddr,
        what: &str,
    ) -> Result<Family, InterfaceError> {
        let family = Family::of(addr(&items[i]));
        if items[..i]
            .iter()
            .any(|other| Family::of(addr(other)) == family)
        {
            return Err(InterfaceError::InvalidSpec {
                interface: self.id.clone(),
                reason: format!("more than one {family} {what}"),
            });
        }
        Ok(family)
    }

    /// Checks the spec on its own: subnets without host bits, at most one per family;
    /// gateways at most one per family, each with a subnet of its family (an IPv4 gateway
    /// inside it); primary addresses at most one per family, each inside the subnet of its
    /// family and neither its network address, its IPv4 broadcast address nor its gateway.
    fn validate(&self) -> Result<(), InterfaceError> {
        let invalid = |reason: String| InterfaceError::InvalidSpec {
            interface: self.id.clone(),
            reason,
        };
        for (i, subnet) in self.subnets.iter().enumerate() {
            crate::spec::no_host_bits(*subnet)?;
            self.one_per_family(&self.subnets, i, |s| s.addr(), "subnet")?;
        }
        for (i, gateway) in self.gateways.iter().enumerate() {
            let family = self.one_per_family(&self.gateways, i, |a| *a, "gateway")?;
            match self.subnet(family) {
                None => {
                    return Err(invalid(format!("gateway {gateway} has no {family} subnet")));
                }
                Some(subnet) if family == Family::V4 && !subnet.contains(gateway) => {
                    return Err(invalid(format!(
                        "gateway {gateway} is not in subnet {subnet}"
                    )));
                }
                Some(_) => {}
            }
        }
        for (i, primary) in self.primary_addresses.iter().enumerate() {
            let family =
                self.one_per_family(&self.primary_addresses, i, |a| *a, "primary address")?;
            match self.subnet(family) {
                Some(subnet) if subnet.contains(primary) => {
                    let broadcast = family == Family::V4 && subnet.broadcast() == *primary;
                    if subnet.network() == *primary
                        || broadcast
                        || self.gateway(family) == Some(*primary)
                    {
                        return Err(invalid(format!(
                            "primary address {primary} is the subnet's network address, \
                             broadcast address or gateway"
                        )));
                    }
                }
                Some(subnet) => {
                    return Err(invalid(format!(
                        "primary address {primary} is not in subnet {subnet}"
                    )));
                }
                None => {
                    return Err(invalid(format!(
                        "primary address {primary} has no {family} subnet"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The engine range of one address or prefix of this interface: a single address or a
    /// delegated prefix (/28 IPv4, /80 IPv6) inside the subnet of its family, without a
    /// gateway (every address of a prefix is usable).
    ///
    /// An address that would hand out the subnet's network address, its IPv4 broadcast
    /// address or the interface's gateway of that family is refused
    /// ([`InterfaceError::ReservedAddress`]): a pod with one of them has no working network.
    /// Other addresses a cloud reserves (AWS and Azure: network + 2 and + 3 for DNS and future
    /// use; GCP: the second-to-last) differ by cloud and are never assigned by it, so they are
    /// left to the cloud.
    pub fn range_of(&self, address: IpNet) -> Result<RangeSpec, InterfaceError> {
        let family = Family::of(address.addr());
        let single = address.max_prefix_len();
        if ![single, delegated_prefix_len(family)].contains(&address.prefix_len()) {
            return Err(InterfaceError::BadPrefixLength { address });
        }
        crate::spec::no_host_bits(address)?;
        let subnet = match self.subnet(family) {
            Some(subnet) if subnet.contains(&address) => subnet,
            subnet => {
                return Err(InterfaceError::NotInSubnet {
                    interface: self.id.clone(),
                    address,
                    subnet,
                });
            }
        };
        let reserved = |addr: IpAddr, reserved: Reserved| InterfaceError::ReservedAddress {
            interface: self.id.clone(),
            address,
            addr,
            reserved,
            subnet,
        };
        let range = RangeSpec::new(
            subnet,
            Some(address.network()),
            Some(address.broadcast()),
            None,
        )
        .map_err(|err| match err {
            SpecError::ReservedBound {
                addr, reserved: r, ..
            } => reserved(addr, r),
            other => other.into(),
        })?;
        if let Some(primary) = self
            .primary_addresses
            .iter()
            .find(|primary| address.contains(*primary))
        {
            return Err(reserved(*primary, Reserved::Primary));
        }
        match self.gateway(family) {
            Some(gateway) if address.contains(&gateway) => {
                Err(reserved(gateway, Reserved::Gateway))
            }
            _ => Ok(range),
        }
    }
}

/// An address handed out, with what the pod's interface needs (Cilium's `AllocationResult`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub addr: IpAddr,
    pub generation: u64,
    pub interface: InterfaceId,
    pub device_number: u32,
    pub mac: MacAddr,
    pub gateway: Option<IpAddr>,
    /// The interface's subnet of the address's family.
    pub subnet: IpNet,
    /// The interface's routes of the address's family.
    pub routes: Vec<IpNet>,
    /// True when the key already held this address and nothing was changed.
    pub existing: bool,
}

/// An address given back by [`Interfaces::unassign`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unassigned {
    pub addr: IpAddr,
    /// The interface it was on, if it still lies in one of the pool's interface addresses
    /// (an allocation restored outside them has none).
    pub interface: Option<InterfaceId>,
    pub device_number: Option<u32>,
    /// What the engine released, for the store.
    pub released: Released,
}

/// What removing an address or an interface did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// The addresses and prefixes that left the pool (to give back to the cloud).
    pub addresses: Vec<IpNet>,
    /// Allocations a forced removal released (their pods lost their address with the cloud's).
    pub released: Vec<Released>,
}

/// When an unused interface may be removed (ipamd's `RemoveUnusedENIFromStore`). A target of
/// 0 is unset. Each target is counted on the other interfaces (see [`Interfaces::removable`]):
/// an interface is kept while the rest of the pool falls short of a target, even one without
/// addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemovalPolicy {
    /// Free addresses (not assigned; cooling ones count) the other interfaces must hold, per
    /// family.
    pub warm_ip_target: usize,
    /// Addresses the other interfaces must hold in total, per family.
    pub minimum_ip_target: usize,
    /// Prefixes without any assignment the other interfaces must hold.
    pub warm_prefix_target: usize,
    /// An interface younger than this is kept (ipamd's `minENILifeTime`).
    pub min_age: Duration,
}

impl RemovalPolicy {
    /// AWS VPC CNI's minimum interface age.
    pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(60);
}

impl Default for RemovalPolicy {
    fn default() -> Self {
        RemovalPolicy {
            warm_ip_target: 0,
            minimum_ip_target: 0,
            warm_prefix_target: 0,
            min_age: RemovalPolicy::DEFAULT_MIN_AGE,
        }
    }
}

/// Counts of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceStat {
    pub id: InterfaceId,
    pub device_number: u32,
    pub primary: bool,
    pub trunk: bool,
    /// Excluded from pod addresses: with `trunk`, its addresses are engine exclusions, never
    /// handed out, and left out of the pool's counts in [`InterfaceStats`].
    pub excluded: bool,
    /// Addresses it holds (a prefix counts all of its addresses).
    pub total: u64,
    pub assigned: u64,
    pub cooling: u64,
    /// Secondary addresses (/32, /128).
    pub addresses: usize,
    /// Delegated prefixes (/28, /80).
    pub prefixes: usize,
}

/// Counts of the pool's interfaces (ipamd's `GetStats` and `GetENIInfos`). The pool's counts
/// are of the interfaces that serve pods (neither trunk nor excluded): what pods can get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceStats {
    pub total: u64,
    pub assigned: u64,
    pub cooling: u64,
    /// By device number.
    pub interfaces: Vec<InterfaceStat>,
}

/// A refused interface operation. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InterfaceError {
    #[error(transparent)]
    Invalid(#[from] SpecError),
    #[error("invalid interface {interface}: {reason}")]
    InvalidSpec {
        interface: InterfaceId,
        reason: String,
    },
    #[error("interface {interface} already exists")]
    DuplicateInterface { interface: InterfaceId },
    #[error("device number {device_number} is already interface {existing}")]
    DuplicateDeviceNumber {
        device_number: u32,
        existing: InterfaceId,
    },
    #[error("interface {interface} has MAC {mac}, which is already interface {existing}'s")]
    DuplicateMac {
        interface: InterfaceId,
        mac: MacAddr,
        existing: InterfaceId,
    },
    #[error("address {address} is already present as {existing}")]
    AddressAlreadyPresent { address: IpNet, existing: String },
    #[error("interface {interface} has no address {address}")]
    UnknownAddress {
        interface: InterfaceId,
        address: IpNet,
    },
    #[error("address {address} of interface {interface} still holds {n_allocated} allocations")]
    AddressInUse {
        interface: InterfaceId,
        address: IpNet,
        n_allocated: u64,
    },
    #[error("interface {interface} still holds {n_allocated} allocations")]
    InterfaceInUse {
        interface: InterfaceId,
        n_allocated: u64,
    },
    #[error(
        "address {address} of interface {interface} is cooling ({n_cooling} addresses until {until}): removing it needs force"
    )]
    AddressCooling {
        interface: InterfaceId,
        address: IpNet,
        n_cooling: u64,
        /// When the last of them ends its cooldown.
        until: Timestamp,
    },
    #[error(
        "interface {interface} is cooling ({n_cooling} addresses until {until}): removing it needs force"
    )]
    InterfaceCooling {
        interface: InterfaceId,
        n_cooling: u64,
        /// When the last of them ends its cooldown.
        until: Timestamp,
    },
    #[error("unknown interface {interface}")]
    UnknownInterface { interface: InterfaceId },
    #[error("address {address} is not in {} of interface {interface}", subnet_text(.subnet))]
    NotInSubnet {
        interface: InterfaceId,
        address: IpNet,
        subnet: Option<IpNet>,
    },
    #[error(
        "address {address} of interface {interface} holds {addr}, the {reserved} of subnet {subnet}, which is never a pod address"
    )]
    ReservedAddress {
        interface: InterfaceId,
        address: IpNet,
        /// The reserved address inside `address`.
        addr: IpAddr,
        reserved: Reserved,
        subnet: IpNet,
    },
    #[error(
        "address {address} is neither a single address nor a delegated prefix (/28 ipv4, /80 ipv6)"
    )]
    BadPrefixLength { address: IpNet },
    #[error("interface {interface} is the {what} interface: removing it needs force")]
    PrimaryOrTrunk {
        interface: InterfaceId,
        what: &'static str,
    },
    #[error("pool {pool} has no free {family} address on its interfaces")]
    Exhausted { pool: PoolName, family: Family },
    #[error("{addr} of pool {pool} is on none of its interfaces")]
    NotOnInterface { addr: IpAddr, pool: PoolName },
    #[error(transparent)]
    Engine(#[from] AllocError),
}

fn subnet_text(subnet: &Option<IpNet>) -> String {
    match subnet {
        Some(subnet) => format!("subnet {subnet}"),
        None => "a subnet".to_owned(),
    }
}

impl InterfaceError {
    /// Whether the same request may succeed later without a change of configuration: the
    /// pool may gain addresses (the cloud attaches more), a cooldown may end, or a restore may
    /// end.
    pub fn is_retryable(&self) -> bool {
        match self {
            InterfaceError::Exhausted { .. }
            | InterfaceError::AddressCooling { .. }
            | InterfaceError::InterfaceCooling { .. } => true,
            InterfaceError::Engine(err) => err.is_retryable(),
            _ => false,
        }
    }
}

#[derive(Clone, Debug)]
struct Slot {
    spec: InterfaceSpec,
    /// Sorted.
    addresses: Vec<IpNet>,
}

/// The length of a delegated prefix: /28 for IPv4, /80 for IPv6 (the only other interface
/// addresses are single ones).
fn delegated_prefix_len(family: Family) -> u8 {
    match family {
        Family::V4 => 28,
        Family::V6 => 80,
    }
}

fn is_prefix(address: &IpNet) -> bool {
    address.prefix_len() < address.max_prefix_len()
}

fn bounds(address: &IpNet) -> (Family, u128, u128) {
    (
        Family::of(address.addr()),
        addr_value(address.network()),
        addr_value(address.broadcast()),
    )
}

/// Per-address counts read from the engine for one decision.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    allocated: u64,
    cooling: u64,
    /// When the last cooling address ends its cooldown.
    cooling_until: Option<Timestamp>,
}

impl Usage {
    fn add(&mut self, other: Usage) {
        self.allocated += other.allocated;
        self.cooling += other.cooling;
        self.cooling_until = self.cooling_until.max(other.cooling_until);
    }
}

/// The interfaces of one interface-backed pool. See the module documentation.
#[derive(Clone, Debug)]
pub struct Interfaces {
    pool: PoolName,
    slots: Vec<Option<Slot>>,
    by_id: BTreeMap<InterfaceId, u32>,
    by_device: BTreeMap<u32, u32>,
    /// Every address of every interface, by family and first address: (last address, slot).
    ranges: [BTreeMap<u128, (u128, u32)>; 2],
}

impl Interfaces {
    /// An empty table for a pool of the engine (which the caller creates).
    pub fn new(pool: PoolName) -> Interfaces {
        Interfaces {
            pool,
            slots: Vec::new(),
            by_id: BTreeMap::new(),
            by_device: BTreeMap::new(),
            ranges: [BTreeMap::new(), BTreeMap::new()],
        }
    }

    /// Rebuilds a table from stored interfaces whose ranges the engine already has (a store
    /// built it from its configuration); the engine is not touched. Use [`Interfaces::check`]
    /// to compare it with the engine.
    pub fn restore(
        pool: PoolName,
        interfaces: impl IntoIterator<Item = (InterfaceSpec, Vec<IpNet>)>,
    ) -> Result<Interfaces, InterfaceError> {
        let mut table = Interfaces::new(pool);
        for (spec, addresses) in interfaces {
            let id = spec.id.clone();
            table.add_interface(spec)?;
            for address in addresses {
                let slot = table.plan_address(&id, address)?.0;
                table.insert_address(slot, address);
            }
        }
        Ok(table)
    }

    pub fn pool(&self) -> &PoolName {
        &self.pool
    }

    /// Number of interfaces.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    fn slot(&self, index: u32) -> &Slot {
        self.slots[index as usize]
            .as_ref()
            .expect("indexed slots are live")
    }

    fn slot_mut(&mut self, index: u32) -> &mut Slot {
        self.slots[index as usize]
            .as_mut()
            .expect("indexed slots are live")
    }

    fn find(&self, id: &InterfaceId) -> Result<u32, InterfaceError> {
        self.by_id
            .get(id)
            .copied()
            .ok_or_else(|| InterfaceError::UnknownInterface {
                interface: id.clone(),
            })
    }

    /// The interface whose address holds `addr`, if any.
    ///
    /// An interface address is a single address or a prefix of one length per family, so
    /// `addr` can only lie in the one starting at itself or at itself with the prefix's host
    /// bits cleared: two exact lookups, cheaper than a range search of the map (which finds
    /// both ends of the range), on every assign and unassign.
    fn slot_of(&self, addr: IpAddr) -> Option<u32> {
        let family = Family::of(addr);
        let value = addr_value(addr);
        let host_bits = u32::from(family.bits() - delegated_prefix_len(family));
        let ranges = &self.ranges[family.index()];
        ranges
            .get(&value)
            .or_else(|| ranges.get(&(value >> host_bits << host_bits)))
            .filter(|(end, _)| *end >= value)
            .map(|(_, slot)| *slot)
    }

    /// Every interface with its addresses and prefixes, by device number.
    pub fn interfaces(&self) -> impl Iterator<Item = (&InterfaceSpec, &[IpNet])> {
        self.by_device.values().map(|&index| {
            let slot = self.slot(index);
            (&slot.spec, slot.addresses.as_slice())
        })
    }

    pub fn get(&self, id: &InterfaceId) -> Option<&InterfaceSpec> {
        let index = self.by_id.get(id)?;
        Some(&self.slot(*index).spec)
    }

    /// The addresses and prefixes of an interface, in address order.
    pub fn addresses(&self, id: &InterfaceId) -> Option<&[IpNet]> {
        let index = self.by_id.get(id)?;
        Some(&self.slot(*index).addresses)
    }

    /// The interface holding an address or prefix exactly as added.
    pub fn interface_of(&self, address: IpNet) -> Option<&InterfaceSpec> {
        let index = self.slot_of(address.addr())?;
        let slot = self.slot(index);
        slot.addresses
            .binary_search(&address)
            .ok()
            .map(|_| &slot.spec)
    }

    /// Adds an interface without addresses (ipamd's `AddENI`).
    pub fn add_interface(&mut self, spec: InterfaceSpec) -> Result<(), InterfaceError> {
        spec.validate()?;
        if self.by_id.contains_key(&spec.id) {
            return Err(InterfaceError::DuplicateInterface {
                interface: spec.id.clone(),
            });
        }
        if let Some(&other) = self.by_device.get(&spec.device_number) {
            return Err(InterfaceError::DuplicateDeviceNumber {
                device_number: spec.device_number,
                existing: self.slot(other).spec.id.clone(),
            });
        }
        if let Some((other, _)) = self.interfaces().find(|(other, _)| other.mac == spec.mac) {
            return Err(InterfaceError::DuplicateMac {
                interface: spec.id.clone(),
                mac: spec.mac,
                existing: other.id.clone(),
            });
        }
        let index = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        } as u32;
        self.by_id.insert(spec.id.clone(), index);
        self.by_device.insert(spec.device_number, index);
        self.slots[index as usize] = Some(Slot {
            spec,
            addresses: Vec::new(),
        });
        Ok(())
    }

    /// Validates an address for an interface against the table: its slot and range.
    fn plan_address(
        &self,
        id: &InterfaceId,
        address: IpNet,
    ) -> Result<(u32, RangeSpec), InterfaceError> {
        let index = self.find(id)?;
        let spec = self.slot(index).spec.range_of(address)?;
        let (family, start, end) = bounds(&address);
        let overlapping = self.ranges[family.index()]
            .range(..=end)
            .next_back()
            .filter(|(_, (other_end, _))| *other_end >= start);
        if let Some((&other_start, &(other_end, other))) = overlapping {
            let holder = self.slot(other);
            let existing = holder
                .addresses
                .iter()
                .find(|a| bounds(a) == (family, other_start, other_end))
                .map_or_else(|| address.to_string(), ToString::to_string);
            return Err(InterfaceError::AddressAlreadyPresent {
                address,
                existing: format!("{existing} on interface {}", holder.spec.id),
            });
        }
        Ok((index, spec))
    }

    fn insert_address(&mut self, index: u32, address: IpNet) {
        let (family, start, end) = bounds(&address);
        self.ranges[family.index()].insert(start, (end, index));
        let addresses = &mut self.slot_mut(index).addresses;
        let at = addresses.binary_search(&address).unwrap_or_else(|at| at);
        addresses.insert(at, address);
    }

    fn forget_address(&mut self, index: u32, address: IpNet) {
        let (family, start, _) = bounds(&address);
        self.ranges[family.index()].remove(&start);
        self.slot_mut(index).addresses.retain(|a| *a != address);
    }

    /// Adds a secondary address or delegated prefix to an interface: one new range of the
    /// pool (ipamd's `AddIPv4AddressToStore` / `AddIPv4CidrToStore`). Refused if it is present
    /// on any interface or overlaps any range of the engine.
    pub fn add_address(
        &mut self,
        engine: &mut Engine,
        id: &InterfaceId,
        address: IpNet,
        now: Timestamp,
    ) -> Result<(), InterfaceError> {
        let _ = now;
        let (index, spec) = self.plan_address(id, address)?;
        engine
            .add_range(&self.pool, spec)
            .map_err(|err| match err {
                AllocError::RangeOverlap {
                    existing,
                    existing_pool,
                    ..
                } => InterfaceError::AddressAlreadyPresent {
                    address,
                    existing: format!("range {existing} of pool {existing_pool}"),
                },
                other => InterfaceError::Engine(other),
            })?;
        if let Some(exclusion) = self.slot(index).spec.exclusion_of(address)
            && let Err(err) = engine.exclude(&self.pool, exclusion)
        {
            // Cannot happen after the range was added (same pool and family); undo anyway.
            let _ = engine.remove_range(&self.pool, &spec);
            return Err(err.into());
        }
        self.insert_address(index, address);
        Ok(())
    }

    /// Adds the exclusions of the trunk and excluded interfaces' addresses to the engine
    /// (idempotent): for an engine built from state written without them.
    pub fn exclude_reserved(&self, engine: &mut Engine) -> Result<(), InterfaceError> {
        for (spec, addresses) in self.interfaces() {
            for address in addresses {
                if let Some(exclusion) = spec.exclusion_of(*address) {
                    engine.exclude(&self.pool, exclusion)?;
                }
            }
        }
        Ok(())
    }

    /// The exclusions the trunk and excluded interfaces' addresses need (for a store).
    pub fn reserved_exclusions(&self) -> Vec<Exclusion> {
        self.interfaces()
            .flat_map(|(spec, addresses)| addresses.iter().filter_map(|a| spec.exclusion_of(*a)))
            .collect()
    }

    /// Per-address allocation and cooling counts of the pool, from the engine, by family and
    /// first address.
    fn usage(
        &self,
        engine: &Engine,
        now: Timestamp,
    ) -> Result<[BTreeMap<u128, Usage>; 2], InterfaceError> {
        let mut usage = [BTreeMap::new(), BTreeMap::new()];
        for range in engine.ranges(&self.pool)? {
            let value = addr_value(range.spec.start());
            usage[range.spec.family().index()].insert(
                value,
                Usage {
                    allocated: range.n_allocated,
                    ..Usage::default()
                },
            );
        }
        let cooldown = engine.pool_config(&self.pool)?.cooldown;
        for (addr, released_at) in engine.cooling(&self.pool)? {
            let until = released_at.saturating_add(cooldown);
            if until <= now {
                continue;
            }
            let family = Family::of(addr);
            let value = addr_value(addr);
            if let Some((_, entry)) = usage[family.index()]
                .range_mut(..=value)
                .next_back()
                .filter(|(start, _)| self.ranges[family.index()].contains_key(start))
            {
                entry.cooling += 1;
                entry.cooling_until = entry.cooling_until.max(Some(until));
            }
        }
        Ok(usage)
    }

    fn usage_of(usage: &[BTreeMap<u128, Usage>; 2], address: &IpNet) -> Usage {
        let (family, start, _) = bounds(address);
        usage[family.index()]
            .get(&start)
            .copied()
            .unwrap_or_default()
    }

    /// Allocations of the pool inside the given addresses, by scanning the pool's
    /// allocations (forced removals only).
    fn allocations_in(&self, engine: &Engine, addresses: &[IpNet]) -> Vec<(IpAddr, u64)> {
        engine
            .dump()
            .into_iter()
            .filter(|dump| dump.pool == self.pool)
            .flat_map(|dump| dump.allocations)
            .filter(|entry| addresses.iter().any(|a| a.contains(&entry.addr)))
            .map(|entry| (entry.addr, entry.generation))
            .collect()
    }

    /// Releases the allocations in `addresses` (a forced removal) and removes their ranges.
    fn remove_addresses(
        &mut self,
        engine: &mut Engine,
        index: u32,
        addresses: &[IpNet],
        now: Timestamp,
    ) -> Result<Vec<Released>, InterfaceError> {
        let specs: Vec<RangeSpec> = addresses
            .iter()
            .map(|address| self.slot(index).spec.range_of(*address))
            .collect::<Result<_, _>>()?;
        let mut released = Vec::new();
        for (addr, generation) in self.allocations_in(engine, addresses) {
            released.push(engine.release(addr, Some(generation), now)?);
        }
        for (address, spec) in addresses.iter().zip(&specs) {
            // Nothing is allocated in it any more: the range leaves at once, its cooldowns
            // with it (the address goes back to the cloud).
            engine.remove_range(&self.pool, spec)?;
            if self.slot(index).spec.exclusion_of(*address).is_some() {
                match engine.remove_exclusion(&self.pool, *address) {
                    Ok(()) | Err(AllocError::UnknownExclusion { .. }) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            self.forget_address(index, *address);
        }
        Ok(released)
    }

    /// Removes an address or prefix from its interface and its range from the pool (ipamd's
    /// `DelIPv4CidrFromStore`). One that holds allocations, or has an address cooling, is
    /// refused unless `force` (the cloud no longer has it): then its allocations are released
    /// and its cooldowns end with it. Unforced, a cooling address keeps its cooldown: removing
    /// it would drop the cooldown, and the cloud could hand the address back at once to be
    /// assigned to a new pod while the old pod's traffic still drains (ipamd does not delete
    /// an address or an interface with one in cooldown either).
    pub fn remove_address(
        &mut self,
        engine: &mut Engine,
        id: &InterfaceId,
        address: IpNet,
        force: bool,
        now: Timestamp,
    ) -> Result<Removal, InterfaceError> {
        let index = self.find(id)?;
        if self.slot(index).addresses.binary_search(&address).is_err() {
            return Err(InterfaceError::UnknownAddress {
                interface: id.clone(),
                address,
            });
        }
        let usage = self.usage(engine, now)?;
        let usage = Self::usage_of(&usage, &address);
        if usage.allocated > 0 && !force {
            return Err(InterfaceError::AddressInUse {
                interface: id.clone(),
                address,
                n_allocated: usage.allocated,
            });
        }
        if let (Some(until), false) = (usage.cooling_until, force) {
            return Err(InterfaceError::AddressCooling {
                interface: id.clone(),
                address,
                n_cooling: usage.cooling,
                until,
            });
        }
        let released = self.remove_addresses(engine, index, &[address], now)?;
        Ok(Removal {
            addresses: vec![address],
            released,
        })
    }

    /// Removes an interface with its addresses (ipamd's `RemoveENIFromDataStore`). The primary
    /// and the trunk interface, one holding allocations and one with an address cooling are
    /// refused unless `force`; a forced removal releases the allocations and ends the
    /// cooldowns (see [`Interfaces::remove_address`]).
    pub fn remove_interface(
        &mut self,
        engine: &mut Engine,
        id: &InterfaceId,
        force: bool,
        now: Timestamp,
    ) -> Result<Removal, InterfaceError> {
        let index = self.find(id)?;
        let slot = self.slot(index);
        if !force && (slot.spec.primary || slot.spec.trunk) {
            return Err(InterfaceError::PrimaryOrTrunk {
                interface: id.clone(),
                what: if slot.spec.primary {
                    "primary"
                } else {
                    "trunk"
                },
            });
        }
        let usage = self.usage(engine, now)?;
        let mut total = Usage::default();
        for address in &slot.addresses {
            total.add(Self::usage_of(&usage, address));
        }
        if total.allocated > 0 && !force {
            return Err(InterfaceError::InterfaceInUse {
                interface: id.clone(),
                n_allocated: total.allocated,
            });
        }
        if let (Some(until), false) = (total.cooling_until, force) {
            return Err(InterfaceError::InterfaceCooling {
                interface: id.clone(),
                n_cooling: total.cooling,
                until,
            });
        }
        let addresses = slot.addresses.clone();
        let released = self.remove_addresses(engine, index, &addresses, now)?;
        let spec = self.slots[index as usize]
            .take()
            .expect("found slots are live")
            .spec;
        self.by_id.remove(&spec.id);
        self.by_device.remove(&spec.device_number);
        Ok(Removal {
            addresses,
            released,
        })
    }

    fn describe(&self, addr: IpAddr, generation: u64, existing: bool) -> Option<Assignment> {
        self.describe_in(self.slot_of(addr)?, addr, generation, existing)
    }

    /// The assignment of `addr`, an address of the interface in slot `index`.
    fn describe_in(
        &self,
        index: u32,
        addr: IpAddr,
        generation: u64,
        existing: bool,
    ) -> Option<Assignment> {
        let spec = &self.slot(index).spec;
        let family = Family::of(addr);
        Some(Assignment {
            addr,
            generation,
            interface: spec.id.clone(),
            device_number: spec.device_number,
            mac: spec.mac,
            gateway: spec.gateway(family),
            subnet: spec.subnet(family)?,
            routes: spec
                .routes
                .iter()
                .filter(|route| Family::of(route.addr()) == family)
                .copied()
                .collect(),
            existing,
        })
    }

    /// Assigns an address of a family to an attachment (ipamd's `AssignPodIPv4Address`): the
    /// engine's next free address of the pool, a cooling one only when nothing else is free.
    /// The same key again gets the address it holds (`existing`).
    ///
    /// Only interface addresses are handed out: the engine shows its choice first, and one
    /// outside every interface address (a range added to the pool behind the table's back, or
    /// an old allocation of the key restored outside them) is refused with
    /// [`InterfaceError::NotOnInterface`] before anything changes.
    pub fn assign(
        &self,
        engine: &mut Engine,
        key: &AttachmentKey,
        owner: &str,
        family: Family,
        now: Timestamp,
    ) -> Result<Assignment, InterfaceError> {
        let request = Request {
            pool: &self.pool,
            owner,
            key: Some(key),
            lease: None,
        };
        let mut planned = None;
        let accept = |addr: IpAddr| {
            planned = Some(addr);
            self.slot_of(addr)
        };
        match engine.allocate_if(&request, Target::Next(family), now, accept) {
            Ok(Some((allocation, index))) => self
                .describe_in(
                    index,
                    allocation.addr,
                    allocation.generation,
                    allocation.existing,
                )
                .ok_or_else(|| InterfaceError::NotOnInterface {
                    addr: allocation.addr,
                    pool: self.pool.clone(),
                }),
            Ok(None) => Err(InterfaceError::NotOnInterface {
                addr: planned.expect("a refused address was planned"),
                pool: self.pool.clone(),
            }),
            Err(AllocError::PoolExhausted { .. } | AllocError::NoCapacity { .. }) => {
                Err(InterfaceError::Exhausted {
                    pool: self.pool.clone(),
                    family,
                })
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Releases every address the attachment holds in the pool (ipamd's
    /// `UnassignPodIPv4Address`); none is not an error (DEL is idempotent). Each address cools
    /// for the pool's cooldown.
    pub fn unassign(
        &self,
        engine: &mut Engine,
        key: &AttachmentKey,
        now: Timestamp,
    ) -> Result<Vec<Unassigned>, InterfaceError> {
        let released = engine.release_key_in_pool(&self.pool, key, now)?;
        let mut unassigned = Vec::with_capacity(released.len());
        for released in released {
            let slot = self.slot_of(released.addr).map(|index| self.slot(index));
            unassigned.push(Unassigned {
                addr: released.addr,
                interface: slot.map(|slot| slot.spec.id.clone()),
                device_number: slot.map(|slot| slot.spec.device_number),
                released,
            });
        }
        Ok(unassigned)
    }

    /// The interface data of an allocated address of the pool.
    pub fn assignment_of(&self, engine: &Engine, addr: IpAddr) -> Option<Assignment> {
        let info = engine.lookup(addr)?;
        if info.pool != self.pool {
            return None;
        }
        self.describe(addr, info.entry.generation, true)
    }

    /// The addresses and prefixes of an interface with nothing allocated and nothing cooling
    /// (ipamd's `FindFreeableCidrs`): those the shrink path may give back to the cloud.
    pub fn freeable(
        &self,
        engine: &Engine,
        id: &InterfaceId,
        now: Timestamp,
    ) -> Result<Vec<IpNet>, InterfaceError> {
        let index = self.find(id)?;
        let usage = self.usage(engine, now)?;
        Ok(self
            .slot(index)
            .addresses
            .iter()
            .filter(|a| {
                let usage = Self::usage_of(&usage, a);
                usage.allocated == 0 && usage.cooling == 0
            })
            .copied()
            .collect())
    }

    /// Interfaces that may take more addresses (ipamd's `GetENINeedsIP`): fewer addresses and
    /// prefixes than `limit` says, neither trunk nor excluded, and not the primary when
    /// `skip_primary` (custom networking); by device number.
    pub fn needing_addresses(
        &self,
        limit: &dyn Fn(&InterfaceSpec) -> usize,
        skip_primary: bool,
    ) -> Vec<&InterfaceSpec> {
        self.interfaces()
            .filter(|(spec, _)| !(spec.trunk || spec.excluded || (skip_primary && spec.primary)))
            .filter(|(spec, addresses)| addresses.len() < limit(spec))
            .map(|(spec, _)| spec)
            .collect()
    }

    /// An interface that can be removed (ipamd's `RemoveUnusedENIFromStore`, as a decision):
    /// neither primary, trunk nor excluded (someone else manages it), at least `min_age` old,
    /// without allocation or cooling address, and not required by a target. The highest device
    /// number wins. The table is not changed: the caller removes it with
    /// [`Interfaces::remove_interface`] and then detaches it in the cloud.
    ///
    /// The targets count the *other* interfaces, whatever the candidate holds, as ipamd's
    /// `isRequiredForWarmIPTarget`, `isRequiredForMinimumIPTarget` and
    /// `isRequiredForWarmPrefixTarget` do. The candidate is kept when, without it,
    ///
    /// - fewer than `warm_ip_target` addresses would be free (not assigned; cooling ones count
    ///   as free, as in ipamd): `total - assigned - own < warm_ip_target`;
    /// - fewer than `minimum_ip_target` addresses would remain: `total - own < minimum_ip_target`;
    /// - fewer than `warm_prefix_target` prefixes without assignment would remain.
    ///
    /// An interface without addresses is kept too when the others fall short: it takes away no
    /// address, but it is the room the node grows into (attaching another interface is slower
    /// and rate-limited), so removing it only to attach one again is churn. The address
    /// targets apply per family, to the families the candidate has a subnet of and the pool
    /// serves (some interface holds an address of it; when none holds any address at all,
    /// every family of the candidate's subnets counts, as an empty node still needs room to
    /// grow): a dual-stack subnet on an IPv4-only node does not keep every interface for lack
    /// of IPv6 addresses. Unlike ipamd with prefix delegation, the address targets are not
    /// rounded up to whole prefixes: a caller that wants that passes rounded targets.
    pub fn removable(
        &self,
        engine: &Engine,
        policy: &RemovalPolicy,
        now: Timestamp,
    ) -> Option<InterfaceId> {
        let usage = self.usage(engine, now).ok()?;
        let mut total = [0u128; 2];
        let mut assigned = [0u128; 2];
        let mut free_prefixes = 0usize;
        for (_, addresses) in self.interfaces().filter(|(spec, _)| spec.serves_pods()) {
            for address in addresses {
                let (family, start, end) = bounds(address);
                let used = Self::usage_of(&usage, address).allocated;
                total[family.index()] += end - start + 1;
                assigned[family.index()] += u128::from(used);
                if is_prefix(address) && used == 0 {
                    free_prefixes += 1;
                }
            }
        }
        let node_is_empty = total.iter().all(|n| *n == 0);
        let warm = policy.warm_ip_target as u128;
        let minimum = policy.minimum_ip_target as u128;
        self.interfaces()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .filter(|(spec, _)| !(spec.primary || spec.trunk || spec.excluded))
            .filter(|(spec, _)| spec.created_at.saturating_add(policy.min_age) <= now)
            .find(|(spec, addresses)| {
                let mut own = [0u128; 2];
                let mut own_prefixes = 0usize;
                for address in *addresses {
                    let usage = Self::usage_of(&usage, address);
                    if usage.allocated > 0 || usage.cooling > 0 {
                        return false;
                    }
                    let (family, start, end) = bounds(address);
                    own[family.index()] += end - start + 1;
                    own_prefixes += usize::from(is_prefix(address));
                }
                // Nothing is assigned on the candidate, so the others hold every assignment.
                let families_ok = Family::ALL.iter().all(|family| {
                    let i = family.index();
                    let counted = spec.subnet(*family).is_some() && (total[i] > 0 || node_is_empty);
                    let others_total = total[i] - own[i];
                    let others_free = others_total - assigned[i];
                    !counted
                        || ((warm == 0 || others_free >= warm)
                            && (minimum == 0 || others_total >= minimum))
                });
                let prefixes_ok = policy.warm_prefix_target == 0
                    || free_prefixes - own_prefixes >= policy.warm_prefix_target;
                families_ok && prefixes_ok
            })
            .map(|(spec, _)| spec.id.clone())
    }

    /// Counts of the pool and of each interface (ipamd's `GetStats`, `GetENIInfos`).
    pub fn stats(&self, engine: &Engine, now: Timestamp) -> Result<InterfaceStats, InterfaceError> {
        let usage = self.usage(engine, now)?;
        let mut stats = InterfaceStats {
            total: 0,
            assigned: 0,
            cooling: 0,
            interfaces: Vec::with_capacity(self.len()),
        };
        for (spec, addresses) in self.interfaces() {
            let mut stat = InterfaceStat {
                id: spec.id.clone(),
                device_number: spec.device_number,
                primary: spec.primary,
                trunk: spec.trunk,
                excluded: spec.excluded,
                total: 0,
                assigned: 0,
                cooling: 0,
                addresses: 0,
                prefixes: 0,
            };
            for address in addresses {
                let (_, start, end) = bounds(address);
                let usage = Self::usage_of(&usage, address);
                stat.total = stat
                    .total
                    .saturating_add(u64::try_from(end - start + 1).unwrap_or(u64::MAX));
                stat.assigned += usage.allocated;
                stat.cooling += usage.cooling;
                if is_prefix(address) {
                    stat.prefixes += 1;
                } else {
                    stat.addresses += 1;
                }
            }
            if spec.serves_pods() {
                stats.total = stats.total.saturating_add(stat.total);
                stats.assigned += stat.assigned;
                stats.cooling += stat.cooling;
            }
            stats.interfaces.push(stat);
        }
        Ok(stats)
    }

    /// Compares the table with itself and with the engine (see the module invariants). For
    /// tests and restore; returns a description of the first difference.
    pub fn check(&self, engine: &Engine) -> Result<(), String> {
        let mut n_addresses = 0;
        for (id, &index) in &self.by_id {
            let Some(Some(slot)) = self.slots.get(index as usize) else {
                return Err(format!("interface {id}: empty slot"));
            };
            if slot.spec.id != *id {
                return Err(format!("interface {id}: slot holds {}", slot.spec.id));
            }
            if self.by_device.get(&slot.spec.device_number) != Some(&index) {
                return Err(format!("interface {id}: device number index"));
            }
            if !slot.addresses.is_sorted() {
                return Err(format!("interface {id}: addresses out of order"));
            }
            for address in &slot.addresses {
                n_addresses += 1;
                let (family, start, end) = bounds(address);
                if self.ranges[family.index()].get(&start) != Some(&(end, index)) {
                    return Err(format!("address {address}: missing from the range index"));
                }
                slot.spec
                    .range_of(*address)
                    .map_err(|err| format!("address {address}: {err}"))?;
            }
        }
        if self.by_device.len() != self.by_id.len()
            || self.slots.iter().flatten().count() != self.by_id.len()
        {
            return Err("interface indexes differ in size".to_owned());
        }
        if self.ranges.iter().map(BTreeMap::len).sum::<usize>() != n_addresses {
            return Err("range index has extra entries".to_owned());
        }
        let ranges = engine.ranges(&self.pool).map_err(|err| err.to_string())?;
        let mut n_active = 0;
        for range in &ranges {
            if range.draining {
                continue;
            }
            n_active += 1;
            let start = range.spec.start();
            let Some(index) = self.slot_of(start) else {
                return Err(format!("range {} is on no interface", range.spec));
            };
            let slot = self.slot(index);
            let matching = slot.addresses.iter().any(|address| {
                address.network() == start
                    && address.broadcast() == range.spec.end()
                    && slot.spec.range_of(*address).ok() == Some(range.spec)
            });
            if !matching {
                return Err(format!(
                    "range {} differs from the addresses of interface {}",
                    range.spec, slot.spec.id
                ));
            }
        }
        if n_active != n_addresses {
            return Err(format!(
                "{n_addresses} interface addresses but {n_active} active ranges"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use crate::pool::PoolConfig;

    fn pool() -> PoolName {
        PoolName::new("eni").unwrap()
    }

    fn id(text: &str) -> InterfaceId {
        InterfaceId::new(text).unwrap()
    }

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    fn spec(name: &str, device_number: u32) -> InterfaceSpec {
        InterfaceSpec {
            id: id(name),
            device_number,
            primary: device_number == 0,
            trunk: false,
            excluded: false,
            subnets: vec![net("10.0.0.0/20"), net("2600:1f14::/64")],
            mac: format!("0a:00:00:00:00:{device_number:02x}")
                .parse()
                .unwrap(),
            gateways: Vec::new(),
            routes: vec![net("10.0.0.0/16")],
            primary_addresses: vec![],
            created_at: Timestamp::ZERO,
        }
    }

    fn key(container: &str) -> AttachmentKey {
        AttachmentKey::new("aws-cni", container, "eth0").unwrap()
    }

    /// An engine with the pool and a table with eni-0 (primary: 10.0.0.10, 10.0.0.11) and
    /// eni-1 (10.0.1.16/28), and one assignment.
    /// An IPv4 address for `container`'s `eth0`, for `owner`, at time zero.
    fn assign_v4(
        table: &Interfaces,
        engine: &mut Engine,
        container: &str,
        owner: &str,
    ) -> Result<Assignment, InterfaceError> {
        table.assign(engine, &key(container), owner, Family::V4, Timestamp::ZERO)
    }

    fn setup() -> (Engine, Interfaces) {
        let mut engine = Engine::new(EngineConfig::default());
        engine.add_pool(&pool(), PoolConfig::default()).unwrap();
        let mut table = Interfaces::new(pool());
        table.add_interface(spec("eni-0", 0)).unwrap();
        table.add_interface(spec("eni-1", 1)).unwrap();
        for (interface, address) in [
            ("eni-0", "10.0.0.10/32"),
            ("eni-0", "10.0.0.11/32"),
            ("eni-1", "10.0.1.16/28"),
        ] {
            table
                .add_address(&mut engine, &id(interface), net(address), Timestamp::ZERO)
                .unwrap();
        }
        assign_v4(&table, &mut engine, "c1", "pod-1").unwrap();
        (engine, table)
    }

    /// What must not change when an operation is refused.
    fn state(engine: &Engine, table: &Interfaces) -> String {
        format!(
            "{:?}\n{:?}\n{:?}\n{:?}\n{}",
            engine.dump(),
            engine.ranges(&pool()).unwrap(),
            engine.cooling(&pool()).unwrap(),
            table.interfaces().collect::<Vec<_>>(),
            engine.next_generation(),
        )
    }

    /// Runs a refused operation and checks it changed nothing.
    fn refused<T: fmt::Debug>(
        op: impl FnOnce(&mut Engine, &mut Interfaces) -> Result<T, InterfaceError>,
    ) -> InterfaceError {
        let (mut engine, mut table) = setup();
        let before = state(&engine, &table);
        let err = op(&mut engine, &mut table).expect_err("the operation must be refused");
        assert_eq!(
            state(&engine, &table),
            before,
            "refused with {err} but changed"
        );
        engine.check_invariants().unwrap();
        table.check(&engine).unwrap();
        err
    }

    /// The refusal of adding `address` to `interface` (see [`refused`]).
    fn add_refused(interface: &str, address: &str) -> InterfaceError {
        refused(|engine, table| {
            table.add_address(engine, &id(interface), net(address), Timestamp::ZERO)
        })
    }

    #[test]
    fn assign_returns_the_interface_data_and_is_idempotent() {
        let (mut engine, table) = setup();
        let first = assign_v4(&table, &mut engine, "c2", "pod-2").unwrap();
        assert_eq!(first.addr.to_string(), "10.0.0.11");
        assert_eq!(first.interface, id("eni-0"));
        assert_eq!(first.device_number, 0);
        assert_eq!(first.mac.to_string(), "0a:00:00:00:00:00");
        assert_eq!(first.gateway, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(first.subnet, net("10.0.0.0/20"));
        assert_eq!(first.routes, vec![net("10.0.0.0/16")]);
        assert!(!first.existing);
        let again = assign_v4(&table, &mut engine, "c2", "pod-2").unwrap();
        assert_eq!(again.addr, first.addr);
        assert!(again.existing);
        let third = assign_v4(&table, &mut engine, "c3", "pod-3").unwrap();
        assert_eq!(third.addr.to_string(), "10.0.1.16");
        assert_eq!(third.device_number, 1);
        assert_eq!(
            table.assignment_of(&engine, third.addr),
            Some(Assignment {
                existing: true,
                ..third
            })
        );
        table.check(&engine).unwrap();
        engine.check_invariants().unwrap();
    }

    /// Regression: a range added to the pool behind the table's back
    /// drew an assignment, which was then released (a cooldown, a generation) and refused.
    /// The engine now shows its choice first and the refusal changes nothing.
    #[test]
    fn assign_refuses_a_range_on_no_interface_without_changing_anything() {
        let (mut engine, table) = setup();
        engine
            .add_range(&pool(), "9.0.0.0/29".parse().unwrap())
            .unwrap();
        // Next-fit hands out the interface addresses after the cursor, then wraps to 9.0.0.1.
        let mut n = 0;
        let (before, err) = loop {
            n += 1;
            let before = state(&engine, &table);
            match assign_v4(&table, &mut engine, &format!("x{n}"), "pod") {
                Ok(assignment) => assert_ne!(assignment.addr.to_string(), "9.0.0.1"),
                Err(err) => break (before, err),
            }
        };
        assert_eq!(n, 18, "the 17 free interface addresses came first");
        assert_eq!(
            err.to_string(),
            "9.0.0.1 of pool eni is on none of its interfaces"
        );
        assert!(!err.is_retryable());
        assert_eq!(state(&engine, &table), before, "refused but changed");
        // Once the stray range is gone, the pool is what the table says again.
        engine
            .remove_range(&pool(), &"9.0.0.0/29".parse().unwrap())
            .unwrap();
        table.check(&engine).unwrap();
        let err = table
            .assign(&mut engine, &key("x99"), "pod", Family::V4, Timestamp::ZERO)
            .unwrap_err();
        assert!(matches!(err, InterfaceError::Exhausted { .. }));
    }

    #[test]
    fn unassign_returns_address_and_device_number() {
        let (mut engine, table) = setup();
        let out = table
            .unassign(&mut engine, &key("c1"), Timestamp::ZERO)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].addr.to_string(), "10.0.0.10");
        assert_eq!(out[0].device_number, Some(0));
        assert!(
            table
                .unassign(&mut engine, &key("c1"), Timestamp::ZERO)
                .unwrap()
                .is_empty()
        );
        assert_eq!(engine.cooling(&pool()).unwrap().len(), 1);
    }

    #[test]
    fn unassign_leaves_the_key_s_addresses_in_other_pools() {
        let (mut engine, table) = setup();
        let other = PoolName::default_pool();
        engine
            .add_range(&other, "192.168.0.0/24".parse().unwrap())
            .unwrap();
        let request = Request {
            pool: &other,
            owner: "pod-1",
            key: Some(&key("c1")),
            lease: None,
        };
        let kept = engine
            .allocate(&request, Target::Next(Family::V4), Timestamp::ZERO)
            .unwrap();
        let out = table
            .unassign(&mut engine, &key("c1"), Timestamp::ZERO)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].addr.to_string(), "10.0.0.10");
        assert_eq!(engine.lookup(kept.addr).unwrap().pool, other);
        engine.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_mac_is_refused() {
        let (_, mut table) = setup();
        let twin = InterfaceSpec {
            mac: table.get(&id("eni-1")).unwrap().mac,
            ..spec("eni-2", 2)
        };
        let err = table.add_interface(twin).unwrap_err();
        assert_eq!(
            err.to_string(),
            "interface eni-2 has MAC 0a:00:00:00:00:01, which is already interface eni-1's"
        );
        assert!(table.get(&id("eni-2")).is_none());
    }

    #[test]
    fn duplicate_interface_is_refused() {
        let err = refused(|_, table| table.add_interface(spec("eni-1", 7)));
        assert_eq!(err.to_string(), "interface eni-1 already exists");
        let err = refused(|_, table| table.add_interface(spec("eni-7", 1)));
        assert_eq!(
            err.to_string(),
            "device number 1 is already interface eni-1"
        );
    }

    #[test]
    fn address_already_present_is_refused() {
        let err = add_refused("eni-1", "10.0.0.10/32");
        assert_eq!(
            err.to_string(),
            "address 10.0.0.10/32 is already present as 10.0.0.10/32 on interface eni-0"
        );
        let err = add_refused("eni-0", "10.0.1.20/32");
        assert!(matches!(err, InterfaceError::AddressAlreadyPresent { .. }));
        // A range of another pool counts too.
        let err = refused(|engine, table| {
            engine
                .add_range(&PoolName::default_pool(), "10.0.2.0/24".parse().unwrap())
                .unwrap();
            let before = state(engine, table);
            let result =
                table.add_address(engine, &id("eni-0"), net("10.0.2.5/32"), Timestamp::ZERO);
            assert_eq!(state(engine, table), before);
            // Undo the setup change so the outer comparison sees the original state.
            engine
                .remove_range(&PoolName::default_pool(), &"10.0.2.0/24".parse().unwrap())
                .unwrap();
            result
        });
        assert_eq!(
            err.to_string(),
            "address 10.0.2.5/32 is already present as range 10.0.2.0/24 of pool default"
        );
    }

    #[test]
    fn addresses_must_fit_the_interface() {
        let err = add_refused("eni-0", "10.1.0.5/32");
        assert_eq!(
            err.to_string(),
            "address 10.1.0.5/32 is not in subnet 10.0.0.0/20 of interface eni-0"
        );
        let err = add_refused("eni-0", "10.0.3.0/24");
        assert!(matches!(err, InterfaceError::BadPrefixLength { .. }));
        let err = add_refused("eni-0", "10.0.3.5/28");
        assert!(matches!(
            err,
            InterfaceError::Invalid(SpecError::HostBitsSet { .. })
        ));
        let err = add_refused("eni-9", "10.0.3.5/32");
        assert_eq!(err.to_string(), "unknown interface eni-9");
    }

    #[test]
    fn unknown_address_is_refused() {
        let err = refused(|engine, table| {
            table.remove_address(
                engine,
                &id("eni-1"),
                net("10.0.0.10/32"),
                false,
                Timestamp::ZERO,
            )
        });
        assert_eq!(
            err.to_string(),
            "interface eni-1 has no address 10.0.0.10/32"
        );
    }

    #[test]
    fn address_in_use_is_refused_unless_forced() {
        let err = refused(|engine, table| {
            table.remove_address(
                engine,
                &id("eni-0"),
                net("10.0.0.10/32"),
                false,
                Timestamp::ZERO,
            )
        });
        assert_eq!(
            err.to_string(),
            "address 10.0.0.10/32 of interface eni-0 still holds 1 allocations"
        );
        let (mut engine, mut table) = setup();
        let removal = table
            .remove_address(
                &mut engine,
                &id("eni-0"),
                net("10.0.0.10/32"),
                true,
                Timestamp::ZERO,
            )
            .unwrap();
        assert_eq!(removal.addresses, vec![net("10.0.0.10/32")]);
        assert_eq!(removal.released.len(), 1);
        assert_eq!(engine.n_allocations(), 0);
        assert!(engine.cooling(&pool()).unwrap().is_empty());
        table.check(&engine).unwrap();
        engine.check_invariants().unwrap();
    }

    #[test]
    fn interface_in_use_primary_and_unknown_are_refused() {
        let err = refused(|engine, table| {
            table.remove_interface(engine, &id("eni-0"), false, Timestamp::ZERO)
        });
        assert_eq!(
            err.to_string(),
            "interface eni-0 is the primary interface: removing it needs force"
        );
        let (mut engine, mut table) = setup();
        for container in ["c2", "c3"] {
            assign_v4(&table, &mut engine, container, "pod").unwrap();
        }
        let before = state(&engine, &table);
        let err = table
            .remove_interface(&mut engine, &id("eni-1"), false, Timestamp::ZERO)
            .unwrap_err();
        assert_eq!(err.to_string(), "interface eni-1 still holds 1 allocations");
        assert_eq!(state(&engine, &table), before);
        table.check(&engine).unwrap();
        let err = refused(|engine, table| {
            table.remove_interface(engine, &id("eni-9"), true, Timestamp::ZERO)
        });
        assert_eq!(err.to_string(), "unknown interface eni-9");
    }

    #[test]
    fn forced_removal_of_the_primary_releases_its_allocations() {
        let (mut engine, mut table) = setup();
        let removal = table
            .remove_interface(&mut engine, &id("eni-0"), true, Timestamp::ZERO)
            .unwrap();
        assert_eq!(
            removal.addresses,
            vec![net("10.0.0.10/32"), net("10.0.0.11/32")]
        );
        assert_eq!(removal.released.len(), 1);
        assert!(table.get(&id("eni-0")).is_none());
        table.check(&engine).unwrap();
        engine.check_invariants().unwrap();
    }

    /// Trunk and excluded interfaces never give out pod addresses: their addresses are
    /// engine exclusions naming the interface, kept in step with the table, and left out of
    /// the pool's counts; removing them removes the exclusions.
    #[test]
    fn trunk_and_excluded_interfaces_give_out_no_address() {
        let mut engine = Engine::new(EngineConfig::default());
        engine.add_pool(&pool(), PoolConfig::default()).unwrap();
        let mut table = Interfaces::new(pool());
        let trunk = InterfaceSpec {
            trunk: true,
            ..spec("eni-t", 1)
        };
        let excluded = InterfaceSpec {
            excluded: true,
            ..spec("eni-x", 2)
        };
        table.add_interface(trunk).unwrap();
        table.add_interface(excluded).unwrap();
        table.add_interface(spec("eni-3", 3)).unwrap();
        for (interface, address) in [
            ("eni-t", "10.0.0.10/32"),
            ("eni-t", "10.0.1.16/28"),
            ("eni-x", "10.0.0.11/32"),
            ("eni-x", "2600:1f14::1:0:0:0/80"),
            ("eni-3", "10.0.0.12/32"),
        ] {
            table
                .add_address(&mut engine, &id(interface), net(address), Timestamp::ZERO)
                .unwrap();
        }
        let reasons: Vec<String> = table
            .reserved_exclusions()
            .iter()
            .map(|e| format!("{} {}", e.network(), e.reason()))
            .collect();
        assert_eq!(
            reasons,
            [
                "10.0.0.10/32 address of interface eni-t (trunk)",
                "10.0.1.16/28 address of interface eni-t (trunk)",
                "10.0.0.11/32 address of interface eni-x (excluded)",
                "2600:1f14:0:0:1::/80 address of interface eni-x (excluded)",
            ]
        );
        let got = table
            .assign(&mut engine, &key("c1"), "pod", Family::V4, Timestamp::ZERO)
            .unwrap();
        assert_eq!(got.addr.to_string(), "10.0.0.12");
        assert_eq!(got.interface, id("eni-3"));
        for family in Family::ALL {
            let err = table
                .assign(&mut engine, &key("c2"), "pod", family, Timestamp::ZERO)
                .unwrap_err();
            assert!(
                matches!(err, InterfaceError::Exhausted { .. }),
                "{family}: {err}"
            );
        }
        let stats = table.stats(&engine, Timestamp::ZERO).unwrap();
        assert_eq!((stats.total, stats.assigned), (1, 1));
        let per: Vec<_> = stats
            .interfaces
            .iter()
            .map(|s| (s.id.to_string(), s.trunk, s.excluded, s.total))
            .collect();
        assert_eq!(
            per,
            [
                ("eni-t".to_owned(), true, false, 17),
                ("eni-x".to_owned(), false, true, 1 + (1 << 48)),
                ("eni-3".to_owned(), false, false, 1),
            ]
        );
        // The exclusions leave with the addresses; a plain interface reusing one serves it.
        table
            .remove_interface(&mut engine, &id("eni-t"), true, Timestamp::ZERO)
            .unwrap();
        table
            .remove_address(
                &mut engine,
                &id("eni-x"),
                net("10.0.0.11/32"),
                false,
                Timestamp::ZERO,
            )
            .unwrap();
        assert_eq!(table.reserved_exclusions().len(), 1);
        table
            .add_address(
                &mut engine,
                &id("eni-3"),
                net("10.0.0.11/32"),
                Timestamp::ZERO,
            )
            .unwrap();
        let got = table
            .assign(&mut engine, &key("c2"), "pod", Family::V4, Timestamp::ZERO)
            .unwrap();
        assert_eq!(got.addr.to_string(), "10.0.0.11");
        // A table rebuilt over an engine without the exclusions puts them back.
        let mut bare = Engine::new(EngineConfig::default());
        bare.add_pool(&pool(), PoolConfig::default()).unwrap();
        let mut rebuilt = Interfaces::new(pool());
        rebuilt
            .add_interface(InterfaceSpec {
                excluded: true,
                ..spec("eni-x", 2)
            })
            .unwrap();
        bare.add_range(
            &pool(),
            rebuilt
                .get(&id("eni-x"))
                .unwrap()
                .range_of(net("10.0.0.11/32"))
                .unwrap(),
        )
        .unwrap();
        let rebuilt = Interfaces::restore(
            pool(),
            [(
                rebuilt.get(&id("eni-x")).unwrap().clone(),
                vec![net("10.0.0.11/32")],
            )],
        )
        .unwrap();
        rebuilt.exclude_reserved(&mut bare).unwrap();
        rebuilt.exclude_reserved(&mut bare).unwrap();
        let err = rebuilt
            .assign(&mut bare, &key("c1"), "pod", Family::V4, Timestamp::ZERO)
            .unwrap_err();
        assert!(matches!(err, InterfaceError::Exhausted { .. }), "{err}");
    }

    #[test]
    fn exhausted_is_retryable_and_changes_nothing() {
        let (mut engine, table) = setup();
        for n in 0..17 {
            assign_v4(&table, &mut engine, &format!("x{n}"), "pod").unwrap();
        }
        let before = state(&engine, &table);
        let err = assign_v4(&table, &mut engine, "late", "pod").unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(
            err.to_string(),
            "pool eni has no free ipv4 address on its interfaces"
        );
        assert_eq!(state(&engine, &table), before);
    }

    #[test]
    fn ids_and_macs_parse_and_print() {
        assert!(InterfaceId::new("eni-0123456789abcdef0").is_ok());
        assert!(InterfaceId::new("-eni").is_err());
        assert!(InterfaceId::new("").is_err());
        assert!(InterfaceId::new(&"a".repeat(65)).is_err());
        assert!(InterfaceId::new("eni/x").is_err());
        let mac: MacAddr = "0A:1b:2c:3d:4e:5f".parse().unwrap();
        assert_eq!(mac.to_string(), "0a:1b:2c:3d:4e:5f");
        for bad in [
            "",
            "0a:1b:2c:3d:4e",
            "0a:1b:2c:3d:4e:5f:00",
            "0a-1b-2c-3d-4e-5f",
            "+a:1b:2c:3d:4e:5f",
        ] {
            assert!(matches!(
                bad.parse::<MacAddr>(),
                Err(SpecError::InvalidMac { .. })
            ));
        }
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut two_subnets = spec("eni-5", 5);
        two_subnets.subnets.push(net("10.1.0.0/16"));
        let err = refused(|_, table| table.add_interface(two_subnets.clone()));
        assert_eq!(
            err.to_string(),
            "invalid interface eni-5: more than one ipv4 subnet"
        );
        let mut far_gateway = spec("eni-5", 5);
        far_gateway.gateways.push("10.9.0.1".parse().unwrap());
        let err = refused(|_, table| table.add_interface(far_gateway.clone()));
        assert_eq!(
            err.to_string(),
            "invalid interface eni-5: gateway 10.9.0.1 is not in subnet 10.0.0.0/20"
        );
    }
}
