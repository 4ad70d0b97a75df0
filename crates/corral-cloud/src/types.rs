//! The requests and answers of [`crate::CloudProvider`]: instances, instance-type limits,
//! subnets, network interfaces and their addresses, with `std::net` and `ipnet` types for
//! addresses and plain strings for EC2's resource ids.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Resource tags, key to value (EC2 allows 50 per resource; keys are case-sensitive).
pub type Tags = BTreeMap<String, String>;

/// The state of an instance (EC2's `InstanceState.Name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum InstanceState {
    /// Booting; interfaces cannot be attached yet.
    Pending,
    /// Running: the only state that accepts attachments.
    Running,
    /// Stopping.
    Stopping,
    /// Stopped; its interfaces stay attached.
    Stopped,
    /// Terminating.
    ShuttingDown,
    /// Gone; its delete-on-termination interfaces are deleted, the others detached.
    Terminated,
}

impl InstanceState {
    /// EC2's name for the state (`shutting-down`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
            InstanceState::ShuttingDown => "shutting-down",
            InstanceState::Terminated => "terminated",
        }
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InstanceState {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        Ok(match s {
            "pending" => InstanceState::Pending,
            "running" => InstanceState::Running,
            "stopping" => InstanceState::Stopping,
            "stopped" => InstanceState::Stopped,
            "shutting-down" => InstanceState::ShuttingDown,
            "terminated" => InstanceState::Terminated,
            _ => return Err(UnknownValue::new("instance state", s)),
        })
    }
}

/// A value EC2 sent that this crate does not know (a state, status or hypervisor name).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownValue {
    /// What was being parsed ("instance state", "mac address", ...).
    pub what: &'static str,
    /// The text that was refused.
    pub value: String,
}

impl UnknownValue {
    fn new(what: &'static str, value: &str) -> UnknownValue {
        UnknownValue {
            what,
            value: value.to_owned(),
        }
    }
}

/// One instance as DescribeInstances shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// `i-...`.
    pub id: String,
    /// The instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// Its state.
    pub state: InstanceState,
    /// The availability zone, e.g. `us-east-1a`.
    pub availability_zone: String,
    /// The VPC of its primary interface.
    pub vpc_id: String,
    /// The subnet of its primary interface.
    pub subnet_id: String,
    /// The interfaces attached (or attaching, or detaching), by device index.
    pub interfaces: Vec<InstanceInterface>,
}

/// An interface as DescribeInstances lists it under its instance (less than
/// DescribeNetworkInterfaces says: no tags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceInterface {
    /// `eni-...`.
    pub interface_id: String,
    /// Its subnet.
    pub subnet_id: String,
    /// Its MAC address.
    pub mac: MacAddress,
    /// Its primary private IPv4 address.
    pub primary_ipv4: Ipv4Addr,
    /// The attachment to this instance.
    pub attachment: Attachment,
}

/// The hypervisor of an instance type: prefix delegation needs Nitro.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hypervisor {
    /// The Nitro system.
    Nitro,
    /// Xen (older generations: t2, m4, c4, ...).
    Xen,
    /// Bare metal (no hypervisor; EC2 reports none).
    None,
}

impl Hypervisor {
    /// EC2's name (`nitro`, `xen`; `none` for bare metal).
    pub fn as_str(self) -> &'static str {
        match self {
            Hypervisor::Nitro => "nitro",
            Hypervisor::Xen => "xen",
            Hypervisor::None => "none",
        }
    }
}

impl fmt::Display for Hypervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Hypervisor {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        Ok(match s {
            "nitro" => Hypervisor::Nitro,
            "xen" => Hypervisor::Xen,
            "none" | "" => Hypervisor::None,
            _ => return Err(UnknownValue::new("hypervisor", s)),
        })
    }
}

/// The interface and address limits of an instance type (DescribeInstanceTypes' `NetworkInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceTypeInfo {
    /// e.g. `m5.large`.
    pub instance_type: String,
    /// Interfaces attachable at once, the primary included.
    pub max_interfaces: u32,
    /// Private IPv4 addresses per interface, the primary included; on Nitro a /28 prefix takes
    /// one of these slots.
    pub ipv4_per_interface: u32,
    /// IPv6 addresses per interface (0 without IPv6 support); a /80 prefix takes one slot.
    pub ipv6_per_interface: u32,
    /// Whether /28 (IPv4) and /80 (IPv6) prefixes can be delegated (Nitro only).
    pub prefix_delegation: bool,
    /// The hypervisor.
    pub hypervisor: Hypervisor,
}

impl InstanceTypeInfo {
    /// AWS VPC CNI's max pods for this type without prefix delegation:
    /// `interfaces * (ipv4 - 1) + 2`.
    pub fn max_pods(&self) -> u32 {
        self.max_interfaces * self.ipv4_per_interface.saturating_sub(1) + 2
    }
}

/// One subnet as DescribeSubnets shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    /// `subnet-...`.
    pub id: String,
    /// Its VPC.
    pub vpc_id: String,
    /// Its availability zone.
    pub availability_zone: String,
    /// Its IPv4 CIDR.
    pub ipv4_cidr: Ipv4Net,
    /// Its IPv6 CIDR (a /64), if it has one.
    pub ipv6_cidr: Option<Ipv6Net>,
    /// Free IPv4 addresses (`AvailableIpAddressCount`).
    pub available_ipv4: u32,
    /// Its tags.
    pub tags: Tags,
}

/// Which subnets DescribeSubnets returns: every given criterion must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubnetFilter {
    /// These ids only (empty: any); an unknown id is `InvalidSubnetID.NotFound`.
    pub ids: Vec<String>,
    /// In this VPC only.
    pub vpc_id: Option<String>,
    /// Carrying these tags (`None`: the key with any value, EC2's `tag-key`).
    pub tags: BTreeMap<String, Option<String>>,
}

/// The status of an interface (EC2's `NetworkInterfaceStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum InterfaceStatus {
    /// Not attached.
    Available,
    /// Being attached.
    Attaching,
    /// Attached.
    InUse,
    /// Being detached.
    Detaching,
}

impl InterfaceStatus {
    /// EC2's name (`in-use`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceStatus::Available => "available",
            InterfaceStatus::Attaching => "attaching",
            InterfaceStatus::InUse => "in-use",
            InterfaceStatus::Detaching => "detaching",
        }
    }
}

impl fmt::Display for InterfaceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InterfaceStatus {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        Ok(match s {
            "available" => InterfaceStatus::Available,
            "attaching" => InterfaceStatus::Attaching,
            "in-use" => InterfaceStatus::InUse,
            "detaching" => InterfaceStatus::Detaching,
            _ => return Err(UnknownValue::new("interface status", s)),
        })
    }
}

/// The status of an attachment (EC2's `AttachmentStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum AttachmentStatus {
    /// The attach call returned; the device is not there yet.
    Attaching,
    /// Attached.
    Attached,
    /// The detach call returned; the device is still there.
    Detaching,
    /// Detached (the attachment is about to disappear).
    Detached,
}

impl AttachmentStatus {
    /// EC2's name.
    pub fn as_str(self) -> &'static str {
        match self {
            AttachmentStatus::Attaching => "attaching",
            AttachmentStatus::Attached => "attached",
            AttachmentStatus::Detaching => "detaching",
            AttachmentStatus::Detached => "detached",
        }
    }
}

impl fmt::Display for AttachmentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AttachmentStatus {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        Ok(match s {
            "attaching" => AttachmentStatus::Attaching,
            "attached" => AttachmentStatus::Attached,
            "detaching" => AttachmentStatus::Detaching,
            "detached" => AttachmentStatus::Detached,
            _ => return Err(UnknownValue::new("attachment status", s)),
        })
    }
}

/// The attachment of an interface to an instance.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    /// `eni-attach-...`, what DetachNetworkInterface takes.
    pub id: String,
    /// The instance.
    pub instance_id: String,
    /// The device index (0 is the primary interface).
    pub device_index: u32,
    /// Its status.
    pub status: AttachmentStatus,
    /// Whether terminating the instance deletes the interface (true for the primary).
    pub delete_on_termination: bool,
}

/// A MAC address, shown as EC2 does (`0a:1b:2c:3d:4e:5f`, lower-case).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct MacAddress(pub [u8; 6]);

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddress {
    type Err = UnknownValue;
    fn from_str(s: &str) -> Result<Self, UnknownValue> {
        let mut bytes = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut bytes {
            let part = parts
                .next()
                .ok_or_else(|| UnknownValue::new("mac address", s))?;
            if part.len() != 2 {
                return Err(UnknownValue::new("mac address", s));
            }
            *byte =
                u8::from_str_radix(part, 16).map_err(|_| UnknownValue::new("mac address", s))?;
        }
        if parts.next().is_some() {
            return Err(UnknownValue::new("mac address", s));
        }
        Ok(MacAddress(bytes))
    }
}

/// One network interface as DescribeNetworkInterfaces shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetworkInterface {
    /// `eni-...`.
    pub id: String,
    /// Its subnet.
    pub subnet_id: String,
    /// Its VPC.
    pub vpc_id: String,
    /// Its availability zone (the subnet's).
    pub availability_zone: String,
    /// Its MAC address.
    pub mac: MacAddress,
    /// Its description (empty when none was given).
    pub description: String,
    /// Its status.
    pub status: InterfaceStatus,
    /// Its attachment, while it has one.
    pub attachment: Option<Attachment>,
    /// The primary private IPv4 address (fixed for the interface's life).
    pub primary_ipv4: Ipv4Addr,
    /// Secondary private IPv4 addresses, in the order assigned.
    pub secondary_ipv4: Vec<Ipv4Addr>,
    /// Delegated IPv4 prefixes (/28).
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// IPv6 addresses.
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// Delegated IPv6 prefixes (/80).
    pub ipv6_prefixes: Vec<Ipv6Net>,
    /// Its security groups.
    pub security_groups: Vec<String>,
    /// Its tags.
    pub tags: Tags,
}

impl NetworkInterface {
    /// Its delegated prefixes, both families (IPv4 first).
    pub fn prefixes(&self) -> Vec<IpNet> {
        self.ipv4_prefixes
            .iter()
            .map(|p| IpNet::V4(*p))
            .chain(self.ipv6_prefixes.iter().map(|p| IpNet::V6(*p)))
            .collect()
    }

    /// Everything it holds besides its primary address: secondary addresses (as networks of
    /// one address) and delegated prefixes, IPv4 then IPv6.
    pub fn secondary_nets(&self) -> Vec<IpNet> {
        let v4 = self
            .secondary_ipv4
            .iter()
            .map(|a| IpNet::from(IpAddr::V4(*a)));
        let v6 = self
            .ipv6_addresses
            .iter()
            .map(|a| IpNet::from(IpAddr::V6(*a)));
        v4.chain(self.ipv4_prefixes.iter().map(|p| IpNet::V4(*p)))
            .chain(v6)
            .chain(self.ipv6_prefixes.iter().map(|p| IpNet::V6(*p)))
            .collect()
    }
}

/// Which interfaces DescribeNetworkInterfaces returns: every given criterion must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceFilter {
    /// These ids only (empty: any); an unknown id is `InvalidNetworkInterfaceID.NotFound`.
    pub ids: Vec<String>,
    /// Attached (attaching, attached or detaching) to this instance
    /// (`attachment.instance-id`).
    pub attached_instance: Option<String>,
    /// In this subnet.
    pub subnet_id: Option<String>,
    /// Carrying these tags (`None`: the key with any value, EC2's `tag-key`).
    pub tags: BTreeMap<String, Option<String>>,
    /// In this status.
    pub status: Option<InterfaceStatus>,
}

impl InterfaceFilter {
    /// The filter for one interface by id.
    pub fn id(interface_id: &str) -> InterfaceFilter {
        InterfaceFilter {
            ids: vec![interface_id.to_owned()],
            ..InterfaceFilter::default()
        }
    }

    /// The filter for the interfaces attached to one instance.
    pub fn instance(instance_id: &str) -> InterfaceFilter {
        InterfaceFilter {
            attached_instance: Some(instance_id.to_owned()),
            ..InterfaceFilter::default()
        }
    }
}

/// How many of something, or exactly which (EC2's `...Count` versus the explicit list).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Amount<T> {
    /// This many, chosen by the cloud.
    Count(u32),
    /// Exactly these.
    Explicit(Vec<T>),
}

impl<T> Amount<T> {
    /// How many are asked for.
    pub fn len(&self) -> usize {
        match self {
            Amount::Count(n) => *n as usize,
            Amount::Explicit(items) => items.len(),
        }
    }

    /// Whether nothing is asked for.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// CreateNetworkInterface's parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CreateInterface {
    /// The subnet to create it in.
    pub subnet_id: String,
    /// Its description.
    pub description: Option<String>,
    /// Tags set at creation (`TagSpecifications`), so no untagged interface ever exists.
    pub tags: Tags,
    /// Security groups (empty: the VPC's default group).
    pub security_groups: Vec<String>,
    /// The primary IPv4 address (None: chosen by the cloud).
    pub primary_ipv4: Option<Ipv4Addr>,
    /// Secondary IPv4 addresses.
    pub secondary_ipv4: Option<Amount<Ipv4Addr>>,
    /// IPv4 /28 prefixes (Nitro only).
    pub ipv4_prefixes: Option<Amount<Ipv4Net>>,
    /// IPv6 addresses (the subnet needs an IPv6 CIDR).
    pub ipv6_addresses: Option<Amount<Ipv6Addr>>,
    /// IPv6 /80 prefixes (Nitro only).
    pub ipv6_prefixes: Option<Amount<Ipv6Net>>,
    /// EC2's `ClientToken`: a repeat with the same token returns the first call's interface.
    pub client_token: Option<String>,
}

/// AttachNetworkInterface's request: which interface goes to which instance, at which device
/// index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachInterface<'a> {
    /// The interface to attach.
    pub interface_id: &'a str,
    /// The instance to attach it to.
    pub instance_id: &'a str,
    /// The device index it takes on the instance.
    pub device_index: u32,
}

impl<'a> AttachInterface<'a> {
    /// Interface `interface_id` to instance `instance_id` at `device_index`.
    pub fn new(interface_id: &'a str, instance_id: &'a str, device_index: u32) -> Self {
        AttachInterface {
            interface_id,
            instance_id,
            device_index,
        }
    }
}

/// What AssignPrivateIpAddresses adds: secondary addresses or prefixes (EC2 takes one kind per
/// call).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ipv4Assign {
    /// Secondary /32 addresses.
    Addresses(Amount<Ipv4Addr>),
    /// Delegated /28 prefixes.
    Prefixes(Amount<Ipv4Net>),
}

/// What AssignIpv6Addresses adds: addresses or prefixes (one kind per call).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ipv6Assign {
    /// /128 addresses.
    Addresses(Amount<Ipv6Addr>),
    /// Delegated /80 prefixes.
    Prefixes(Amount<Ipv6Net>),
}

/// IPv4 addresses and prefixes: what an assign returned, or what to unassign.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ipv4Set {
    /// Secondary addresses.
    pub addresses: Vec<Ipv4Addr>,
    /// /28 prefixes.
    pub prefixes: Vec<Ipv4Net>,
}

/// IPv6 addresses and prefixes: what an assign returned, or what to unassign.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ipv6Set {
    /// Addresses.
    pub addresses: Vec<Ipv6Addr>,
    /// /80 prefixes.
    pub prefixes: Vec<Ipv6Net>,
}

impl Ipv4Set {
    /// The addresses (as networks of one address), then the prefixes.
    pub fn nets(&self) -> Vec<IpNet> {
        nets(&self.addresses, &self.prefixes)
    }

    /// Neither an address nor a prefix.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.prefixes.is_empty()
    }
}

impl Ipv6Set {
    /// The addresses (as networks of one address), then the prefixes.
    pub fn nets(&self) -> Vec<IpNet> {
        nets(&self.addresses, &self.prefixes)
    }

    /// Neither an address nor a prefix.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.prefixes.is_empty()
    }
}

/// `nets` as the sets of each family that name them (what [`Ipv4Set::nets`] and
/// [`Ipv6Set::nets`] undo): a network of one address (/32, /128) as an address, any other as
/// a prefix.
pub fn sets_of(nets: &[IpNet]) -> (Ipv4Set, Ipv6Set) {
    let mut v4 = Ipv4Set::default();
    let mut v6 = Ipv6Set::default();
    for net in nets {
        match net {
            IpNet::V4(n) if n.prefix_len() == 32 => v4.addresses.push(n.addr()),
            IpNet::V4(n) => v4.prefixes.push(*n),
            IpNet::V6(n) if n.prefix_len() == 128 => v6.addresses.push(n.addr()),
            IpNet::V6(n) => v6.prefixes.push(*n),
        }
    }
    (v4, v6)
}

/// `addresses` (as networks of one address), then `prefixes`.
fn nets<A, P>(addresses: &[A], prefixes: &[P]) -> Vec<IpNet>
where
    A: Copy + Into<IpAddr>,
    P: Copy + Into<IpNet>,
{
    let addresses = addresses.iter().map(|a| IpNet::from((*a).into()));
    addresses
        .chain(prefixes.iter().map(|p| (*p).into()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_address_round_trips_and_refuses_garbage() {
        let mac: MacAddress = "0a:1B:2c:3d:4e:5f".parse().unwrap();
        assert_eq!(mac.to_string(), "0a:1b:2c:3d:4e:5f");
        for bad in [
            "",
            "0a:1b:2c:3d:4e",
            "0a:1b:2c:3d:4e:5f:00",
            "0a:1b:2c:3d:4e:5",
            "zz:1b:2c:3d:4e:5f",
        ] {
            assert!(bad.parse::<MacAddress>().is_err(), "{bad}");
        }
    }

    #[test]
    fn states_round_trip() {
        for state in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Stopping,
            InstanceState::Stopped,
            InstanceState::ShuttingDown,
            InstanceState::Terminated,
        ] {
            assert_eq!(state.as_str().parse::<InstanceState>(), Ok(state));
        }
        for status in [
            InterfaceStatus::Available,
            InterfaceStatus::Attaching,
            InterfaceStatus::InUse,
            InterfaceStatus::Detaching,
        ] {
            assert_eq!(status.as_str().parse::<InterfaceStatus>(), Ok(status));
        }
        assert!("bogus".parse::<AttachmentStatus>().is_err());
    }

    #[test]
    fn sets_of_nets_round_trips() {
        let nets: Vec<IpNet> = [
            "10.0.0.5/32",
            "10.0.1.16/28",
            "fd00::7/128",
            "fd00:0:0:1::/80",
        ]
        .iter()
        .map(|n| n.parse().unwrap())
        .collect();
        let (v4, v6) = sets_of(&nets);
        assert_eq!(v4.addresses, ["10.0.0.5".parse::<Ipv4Addr>().unwrap()]);
        assert_eq!(v4.prefixes, ["10.0.1.16/28".parse::<Ipv4Net>().unwrap()]);
        assert_eq!(v6.addresses, ["fd00::7".parse::<Ipv6Addr>().unwrap()]);
        assert_eq!(v6.prefixes, ["fd00:0:0:1::/80".parse::<Ipv6Net>().unwrap()]);
        assert_eq!([v4.nets(), v6.nets()].concat(), nets);
        let (v4, v6) = sets_of(&[]);
        assert!(v4.is_empty() && v6.is_empty());
    }
}
