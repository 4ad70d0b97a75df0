//! Validated inputs: pool names, attachment keys, owners, ranges and exclusions.
//!
//! Every textual input goes raw → validated here → acted on by the engine, so the engine only
//! ever sees values that are known to be well formed.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::addr::{Family, addr_value};
use crate::input::{Echo, SpecError};

pub use crate::addr::Reserved;
pub use crate::input::{
    MAX_CONTAINER_ID_LEN, MAX_IFNAME_LEN, MAX_NETWORK_LEN, MAX_OWNER_LEN, MAX_POOL_NAME_LEN,
};

/// The name of a pool: 1–63 bytes of `[A-Za-z0-9._-]`, starting with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolName(Arc<str>);

impl PoolName {
    /// The name of the pool every engine starts with.
    pub const DEFAULT: &'static str = "default";

    pub fn new(name: &str) -> Result<PoolName, SpecError> {
        if is_token(name, MAX_POOL_NAME_LEN, b"._-") {
            Ok(PoolName(Arc::from(name)))
        } else {
            Err(SpecError::InvalidPoolName {
                name: name.to_owned(),
            })
        }
    }

    /// The default pool's name.
    pub fn default_pool() -> PoolName {
        PoolName(Arc::from(PoolName::DEFAULT))
    }
}

/// What a validated name held as its text (`$name(text)`, checked by
/// `$name::new(&str) -> Result<$name, $error>`) answers: `as_str`, `Display` (the text) and
/// `FromStr` (through `new`).
macro_rules! name_text {
    ($name:ident, $error:ty) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = $error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::new(s)
            }
        }
    };
}
pub(crate) use name_text;

name_text!(PoolName, SpecError);

/// The CNI primary key of an attachment: (network name, container ID, interface name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttachmentKey {
    network: String,
    container_id: String,
    ifname: String,
}

/// Refuses a CIDR with host bits set (`10.0.0.1/24`), naming the network it would be.
pub(crate) fn no_host_bits(cidr: IpNet) -> Result<(), SpecError> {
    if cidr.network() == cidr.addr() {
        return Ok(());
    }
    Err(SpecError::HostBitsSet {
        subnet: cidr.to_string(),
        network: cidr.trunc().to_string(),
    })
}

/// Whether `text` is 1 to `max_len` bytes of ASCII letters, digits and the bytes of
/// `punctuation`, starting with a letter or digit: a pool name, a CNI network name or container
/// ID, an interface ID. None of these can name a path.
pub(crate) fn is_token(text: &str, max_len: usize, punctuation: &[u8]) -> bool {
    !text.is_empty()
        && text.len() <= max_len
        && text.as_bytes()[0].is_ascii_alphanumeric()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || punctuation.contains(&b))
}

impl AttachmentKey {
    /// Validates the three parts as the CNI spec defines them.
    ///
    /// Network names and container IDs are `[A-Za-z0-9][A-Za-z0-9_.-]*`; interface names are
    /// 1–15 bytes, not `.` or `..`, without `/`, `:` or whitespace. No part can name a path.
    pub fn new(
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<AttachmentKey, SpecError> {
        let name_ok = |s: &str, max: usize| is_token(s, max, b"_.-");
        if !name_ok(network, MAX_NETWORK_LEN) {
            return Err(SpecError::InvalidNetworkName {
                name: network.to_owned(),
            });
        }
        if !name_ok(container_id, MAX_CONTAINER_ID_LEN) {
            return Err(SpecError::InvalidContainerId {
                id: container_id.to_owned(),
            });
        }
        let ifname_ok = !ifname.is_empty()
            && ifname.len() <= MAX_IFNAME_LEN
            && ifname != "."
            && ifname != ".."
            && ifname
                .chars()
                .all(|c| c != '/' && c != ':' && !c.is_whitespace() && !c.is_control());
        if !ifname_ok {
            return Err(SpecError::InvalidIfname {
                ifname: ifname.to_owned(),
            });
        }
        Ok(AttachmentKey {
            network: network.to_owned(),
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        })
    }

    /// Rebuilds a key from parts that were validated when it was first made.
    pub(crate) fn from_validated(network: &str, container_id: &str, ifname: &str) -> AttachmentKey {
        AttachmentKey {
            network: network.to_owned(),
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        }
    }

    pub fn network(&self) -> &str {
        &self.network
    }

    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}

impl fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Checks an owner string: at most [`MAX_OWNER_LEN`] bytes, no control characters.
pub fn validate_owner(owner: &str) -> Result<(), SpecError> {
    if is_free_text(owner) {
        Ok(())
    } else {
        Err(SpecError::InvalidOwner {
            owner: owner.to_owned(),
        })
    }
}

/// Whether `text` may be an owner or an exclusion reason: at most [`MAX_OWNER_LEN`] bytes,
/// without control characters.
fn is_free_text(text: &str) -> bool {
    // One pass over the bytes; only a text with non-ASCII characters needs char decoding.
    let suspicious = text.bytes().any(|b| !(0x20..0x7f).contains(&b));
    text.len() <= MAX_OWNER_LEN && !(suspicious && text.chars().any(char::is_control))
}

/// A validated range of capacity: a subnet, the part of it to allocate from, and its gateway.
///
/// The subnet says which addresses are special (network, IPv4 broadcast); `start..=end` says
/// which addresses belong to the pool. A whole CIDR, a start–end range, a single secondary IP
/// (`start == end`) and a delegated prefix inside a larger subnet are all ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RangeSpec {
    subnet: IpNet,
    start: IpAddr,
    end: IpAddr,
    gateway: Option<IpAddr>,
}

impl RangeSpec {
    /// Validates a range.
    ///
    /// `start` and `end` default to the first and last usable addresses of the subnet. The
    /// network address and the IPv4 broadcast address are usable only in /31, /32, /127 and
    /// /128 subnets (point-to-point links, RFC 3021 and RFC 6164); elsewhere they are refused
    /// as explicit bounds. The gateway must be of the subnet's family; it is reserved when it
    /// lies inside `start..=end`.
    pub fn new(
        subnet: IpNet,
        start: Option<IpAddr>,
        end: Option<IpAddr>,
        gateway: Option<IpAddr>,
    ) -> Result<RangeSpec, SpecError> {
        no_host_bits(subnet)?;
        let family = Family::of(subnet.addr());
        let (first, last) = usable_bounds(subnet);
        if first > last {
            // Only a /0 could get here, and it still has usable addresses; keep the check
            // anyway so no subnet can produce an inverted range.
            return Err(SpecError::EmptyRange {
                range: subnet.to_string(),
            });
        }
        let check_bound = |addr: IpAddr, what: &'static str| -> Result<u128, SpecError> {
            if Family::of(addr) != family {
                return Err(SpecError::FamilyMismatch {
                    what,
                    addr,
                    subnet: subnet.to_string(),
                });
            }
            if !subnet.contains(&addr) {
                return Err(SpecError::OutsideSubnet {
                    what,
                    addr,
                    subnet: subnet.to_string(),
                });
            }
            let value = addr_value(addr);
            if value < first || value > last {
                let reserved = if value < first {
                    Reserved::Network
                } else {
                    Reserved::Broadcast
                };
                return Err(SpecError::ReservedBound {
                    what,
                    addr,
                    reserved,
                });
            }
            Ok(value)
        };
        let start_value = match start {
            Some(addr) => check_bound(addr, "start")?,
            None => first,
        };
        let end_value = match end {
            Some(addr) => check_bound(addr, "end")?,
            None => last,
        };
        if start_value > end_value {
            return Err(SpecError::StartAfterEnd {
                start: family.addr(start_value),
                end: family.addr(end_value),
            });
        }
        if let Some(gateway) = gateway
            && Family::of(gateway) != family
        {
            return Err(SpecError::FamilyMismatch {
                what: "gateway",
                addr: gateway,
                subnet: subnet.to_string(),
            });
        }
        let spec = RangeSpec {
            subnet,
            start: family.addr(start_value),
            end: family.addr(end_value),
            gateway,
        };
        if spec.gateway_inside() && start_value == end_value {
            return Err(SpecError::EmptyRange {
                range: spec.to_string(),
            });
        }
        Ok(spec)
    }

    /// A whole subnet with the default bounds and no gateway.
    pub fn subnet(subnet: IpNet) -> Result<RangeSpec, SpecError> {
        RangeSpec::new(subnet, None, None, None)
    }

    pub fn family(&self) -> Family {
        Family::of(self.subnet.addr())
    }

    pub fn subnet_net(&self) -> IpNet {
        self.subnet
    }

    pub fn start(&self) -> IpAddr {
        self.start
    }

    pub fn end(&self) -> IpAddr {
        self.end
    }

    pub fn gateway(&self) -> Option<IpAddr> {
        self.gateway
    }

    pub(crate) fn bounds(&self) -> (u128, u128) {
        (addr_value(self.start), addr_value(self.end))
    }

    fn gateway_inside(&self) -> bool {
        let (start, end) = self.bounds();
        self.gateway
            .map(addr_value)
            .is_some_and(|g| g >= start && g <= end)
    }

    /// Number of addresses the range can hand out.
    pub fn size(&self) -> u128 {
        let (start, end) = self.bounds();
        (end - start).saturating_add(1) - u128::from(self.gateway_inside())
    }

    /// The reason an address inside the subnet but outside the range is special, if it is.
    pub(crate) fn reserved_kind(&self, addr: IpAddr) -> Option<Reserved> {
        if !self.subnet.contains(&addr) {
            return None;
        }
        let value = addr_value(addr);
        let (first, last) = usable_bounds(self.subnet);
        if Some(addr) == self.gateway {
            Some(Reserved::Gateway)
        } else if value < first {
            Some(Reserved::Network)
        } else if value > last {
            Some(Reserved::Broadcast)
        } else {
            None
        }
    }
}

/// The first and last addresses of a subnet that may be handed out.
fn usable_bounds(subnet: IpNet) -> (u128, u128) {
    let network = addr_value(subnet.network());
    let broadcast = addr_value(subnet.broadcast());
    let family = Family::of(subnet.addr());
    // Point-to-point subnets have no network or broadcast address to skip.
    if subnet.prefix_len() + 1 >= family.bits() {
        return (network, broadcast);
    }
    match family {
        Family::V4 => (network + 1, broadcast - 1),
        // IPv6 has no broadcast, but the all-zeros subnet-router anycast address is skipped.
        Family::V6 => (network + 1, broadcast),
    }
}

impl fmt::Display for RangeSpec {
    /// The canonical textual form, which [`RangeSpec::from_str`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.subnet)?;
        let (first, last) = usable_bounds(self.subnet);
        let (start, end) = self.bounds();
        if start != first || end != last {
            write!(f, ",range={}-{}", self.start, self.end)?;
        }
        if let Some(gateway) = self.gateway {
            write!(f, ",gateway={gateway}")?;
        }
        Ok(())
    }
}

impl FromStr for RangeSpec {
    type Err = SpecError;

    /// Parses `SUBNET[,range=START-END][,start=IP][,end=IP][,gateway=IP]`, or a bare address
    /// (a /32 or /128 of one usable address).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let mut parts = text.split(',');
        let head = parts.next().unwrap_or_default().trim();
        let subnet = parse_net(head)?;
        let mut start = None;
        let mut end = None;
        let mut gateway = None;
        for part in parts {
            let (key, value) = part.split_once('=').ok_or_else(|| SpecError::Syntax {
                input: text.to_owned(),
                reason: format!("expected key=value, found {}", Echo(part)),
            })?;
            let value = value.trim();
            match key.trim() {
                "range" => {
                    let (low, high) = value.split_once('-').ok_or_else(|| SpecError::Syntax {
                        input: text.to_owned(),
                        reason: format!("range must be START-END, found {}", Echo(value)),
                    })?;
                    start = Some(parse_addr(low)?);
                    end = Some(parse_addr(high)?);
                }
                "start" => start = Some(parse_addr(value)?),
                "end" => end = Some(parse_addr(value)?),
                "gateway" | "gw" => gateway = Some(parse_addr(value)?),
                other => {
                    return Err(SpecError::Syntax {
                        input: text.to_owned(),
                        reason: format!(
                            "unknown key {} (expected range, start, end or gateway)",
                            Echo(other)
                        ),
                    });
                }
            }
        }
        RangeSpec::new(subnet, start, end, gateway)
    }
}

/// Parses an address, with a typed error naming the input.
pub fn parse_addr(text: &str) -> Result<IpAddr, SpecError> {
    text.trim()
        .parse::<IpAddr>()
        .map_err(|_| SpecError::InvalidAddress {
            input: text.to_owned(),
        })
}

/// Parses a CIDR; a bare address is taken as a /32 or /128.
pub fn parse_net(text: &str) -> Result<IpNet, SpecError> {
    let text = text.trim();
    if text.contains('/') {
        text.parse::<IpNet>().map_err(|_| SpecError::InvalidCidr {
            input: text.to_owned(),
        })
    } else {
        parse_addr(text).map(IpNet::from)
    }
}

/// A network (or single address) that is never handed out, with the reason it was excluded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Exclusion {
    network: IpNet,
    reason: String,
}

impl Exclusion {
    /// An exclusion of `network`; host bits are cleared only for a bare address, a CIDR with
    /// host bits set is refused so a typo does not exclude a different network than meant.
    pub fn new(network: IpNet, reason: &str) -> Result<Exclusion, SpecError> {
        no_host_bits(network)?;
        if !is_free_text(reason) {
            return Err(SpecError::InvalidExclusionReason {
                reason: reason.to_owned(),
            });
        }
        Ok(Exclusion {
            network,
            reason: reason.to_owned(),
        })
    }

    /// Parses `CIDR` or `ADDRESS` with a reason.
    pub fn parse(text: &str, reason: &str) -> Result<Exclusion, SpecError> {
        Exclusion::new(parse_net(text)?, reason)
    }

    pub fn network(&self) -> IpNet {
        self.network
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }

    pub fn family(&self) -> Family {
        Family::of(self.network.addr())
    }

    pub(crate) fn bounds(&self) -> (u128, u128) {
        (
            addr_value(self.network.network()),
            addr_value(self.network.broadcast()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::ECHO_CHARS;

    fn range(text: &str) -> Result<RangeSpec, SpecError> {
        text.parse()
    }

    #[test]
    fn default_bounds_skip_network_and_broadcast() {
        let spec = range("10.0.0.0/24").unwrap();
        assert_eq!(spec.start().to_string(), "10.0.0.1");
        assert_eq!(spec.end().to_string(), "10.0.0.254");
        assert_eq!(spec.size(), 254);
        let spec = range("fd00::/64").unwrap();
        assert_eq!(spec.start().to_string(), "fd00::1");
        assert_eq!(spec.size(), u128::from(u64::MAX));
    }

    #[test]
    fn point_to_point_subnets_use_every_address() {
        assert_eq!(range("10.0.0.0/31").unwrap().size(), 2);
        assert_eq!(range("10.0.0.7/32").unwrap().size(), 1);
        assert_eq!(range("10.0.0.7").unwrap().size(), 1);
        assert_eq!(range("fd00::/127").unwrap().size(), 2);
        assert_eq!(range("fd00::5/128").unwrap().size(), 1);
        // A /30 keeps the usual rules: two usable addresses.
        assert_eq!(range("10.0.0.0/30").unwrap().size(), 2);
    }

    #[test]
    fn gateway_inside_the_range_is_not_counted() {
        let spec = range("10.0.0.0/24,gateway=10.0.0.1").unwrap();
        assert_eq!(spec.size(), 253);
        let spec = range("10.0.0.0/24,range=10.0.0.10-10.0.0.20,gateway=10.0.0.1").unwrap();
        assert_eq!(spec.size(), 11);
        assert!(matches!(
            range("10.0.0.0/31,range=10.0.0.0-10.0.0.0,gateway=10.0.0.0"),
            Err(SpecError::EmptyRange { .. })
        ));
    }

    #[test]
    fn canonical_text_round_trips() {
        for text in [
            "10.0.0.0/24",
            "10.0.0.0/20,range=10.0.0.16-10.0.0.31",
            "10.0.0.0/24,gateway=10.0.0.1",
            "fd00::/64,range=fd00::10-fd00::ff,gateway=fd00::1",
        ] {
            assert_eq!(range(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn bad_ranges_get_typed_errors() {
        type Expected = fn(&SpecError) -> bool;
        let cases: [(&str, Expected); 11] = [
            ("10.0.0.1/24", |e| {
                matches!(e, SpecError::HostBitsSet { .. })
            }),
            ("10.0.0.0/33", |e| {
                matches!(e, SpecError::InvalidCidr { .. })
            }),
            ("banana", |e| matches!(e, SpecError::InvalidAddress { .. })),
            ("10.0.0.0/24,range=10.0.1.1-10.0.1.5", |e| {
                matches!(e, SpecError::OutsideSubnet { .. })
            }),
            ("10.0.0.0/24,range=10.0.0.9-10.0.0.5", |e| {
                matches!(e, SpecError::StartAfterEnd { .. })
            }),
            ("10.0.0.0/24,start=10.0.0.0", |e| {
                matches!(
                    e,
                    SpecError::ReservedBound {
                        reserved: Reserved::Network,
                        ..
                    }
                )
            }),
            ("10.0.0.0/24,end=10.0.0.255", |e| {
                matches!(
                    e,
                    SpecError::ReservedBound {
                        reserved: Reserved::Broadcast,
                        ..
                    }
                )
            }),
            ("10.0.0.0/24,gateway=fd00::1", |e| {
                matches!(e, SpecError::FamilyMismatch { .. })
            }),
            ("10.0.0.0/24,foo=1", |e| {
                matches!(e, SpecError::Syntax { .. })
            }),
            ("10.0.0.0/24,range=10.0.0.1", |e| {
                matches!(e, SpecError::Syntax { .. })
            }),
            ("", |e| matches!(e, SpecError::InvalidAddress { .. })),
        ];
        for (text, expected) in cases {
            match range(text) {
                Err(error) => assert!(expected(&error), "{text:?}: {error:?}"),
                Ok(spec) => panic!("{text:?} parsed as {spec}"),
            }
        }
    }

    #[test]
    fn attachment_keys_follow_the_cni_spec() {
        assert!(AttachmentKey::new("net", "abc123", "eth0").is_ok());
        for (network, container_id, ifname) in [
            ("", "c", "eth0"),
            ("../etc", "c", "eth0"),
            ("net", "../../x", "eth0"),
            ("net", "c/d", "eth0"),
            ("net", "-c", "eth0"),
            ("net", "c", ".."),
            ("net", "c", "a/b"),
            ("net", "c", "this-is-too-long0"),
            ("net", "c", "eth 0"),
            ("net", "c", ""),
        ] {
            assert!(
                AttachmentKey::new(network, container_id, ifname).is_err(),
                "{network:?} {container_id:?} {ifname:?} was accepted"
            );
        }
    }

    #[test]
    fn pool_names_and_owners_are_checked() {
        assert!(PoolName::new("default").is_ok());
        assert!(PoolName::new("blue-2.a_b").is_ok());
        assert!(PoolName::new("").is_err());
        assert!(PoolName::new("../x").is_err());
        assert!(PoolName::new(&"a".repeat(64)).is_err());
        assert!(validate_owner("pod/ns/name").is_ok());
        assert!(validate_owner("bad\nowner").is_err());
        assert!(validate_owner(&"o".repeat(MAX_OWNER_LEN + 1)).is_err());
    }

    #[test]
    fn exclusions_parse_addresses_and_networks() {
        let single = Exclusion::parse("10.0.0.5", "router").unwrap();
        assert_eq!(single.network().to_string(), "10.0.0.5/32");
        let net = Exclusion::parse("10.0.1.0/28", "metal").unwrap();
        assert_eq!(net.bounds().1 - net.bounds().0, 15);
        assert!(Exclusion::parse("10.0.1.1/28", "x").is_err());
    }

    #[test]
    fn over_long_names_are_called_too_long_with_the_limit_and_the_length() {
        let id = "c".repeat(MAX_CONTAINER_ID_LEN + 76);
        let message = AttachmentKey::new("net", &id, "eth0")
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            format!(
                "container id {:?}... is too long: 1100 bytes, at most 1024",
                "c".repeat(ECHO_CHARS)
            )
        );
        let network = "n".repeat(MAX_NETWORK_LEN + 1);
        let message = AttachmentKey::new(&network, "c", "eth0")
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            format!(
                "network name {:?}... is too long: 254 bytes, at most 253",
                "n".repeat(ECHO_CHARS)
            )
        );
        let message = PoolName::new(&"p".repeat(64)).unwrap_err().to_string();
        assert!(
            message.ends_with("is too long: 64 bytes, at most 63"),
            "{message}"
        );
        // At the limit the rule applies, and a short input is echoed whole.
        assert!(AttachmentKey::new(&"n".repeat(MAX_NETWORK_LEN), "c", "eth0").is_ok());
        assert_eq!(
            AttachmentKey::new("net", "c/d", "eth0")
                .unwrap_err()
                .to_string(),
            "invalid container id \"c/d\": use [A-Za-z0-9_.-], starting with a letter or digit"
        );
    }

    #[test]
    fn an_exclusion_reason_is_named_as_one_not_as_an_owner() {
        let net: IpNet = "10.0.0.0/28".parse().unwrap();
        let error = Exclusion::new(net, "bad\nreason").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid exclusion reason \"bad\\nreason\": control characters are not allowed"
        );
        let error = Exclusion::new(net, &"r".repeat(MAX_OWNER_LEN + 1)).unwrap_err();
        assert!(
            error.to_string().starts_with("exclusion reason \"rrrr")
                && error
                    .to_string()
                    .ends_with("... is too long: 1025 bytes, at most 1024"),
            "{error}"
        );
        let error = validate_owner(&"o".repeat(MAX_OWNER_LEN + 1)).unwrap_err();
        assert!(error.to_string().starts_with("owner \"oooo"), "{error}");
        let error = validate_owner("pod\u{7}").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid owner \"pod\\u{7}\": control characters are not allowed"
        );
    }

    #[test]
    fn no_message_echoes_an_over_long_input_whole() {
        // A megabyte of each kind of bad input, with multi-byte characters so a cut that
        // ignores character boundaries would panic.
        let long = "é/".repeat(512 * 1024);
        let messages = [
            parse_addr(&long).unwrap_err(),
            parse_net(&format!("{long}/24")).unwrap_err(),
            range(&format!("10.0.0.0/24,{long}")).unwrap_err(),
            range(&format!("10.0.0.0/24,{long}=1")).unwrap_err(),
            range(&format!("10.0.0.0/24,range={long}")).unwrap_err(),
            PoolName::new(&long).unwrap_err(),
            AttachmentKey::new(&long, "c", "eth0").unwrap_err(),
            AttachmentKey::new("n", &long, "eth0").unwrap_err(),
            AttachmentKey::new("n", "c", &long).unwrap_err(),
            validate_owner(&long).unwrap_err(),
            Exclusion::parse("10.0.0.0/28", &long).unwrap_err(),
        ]
        .map(|error| error.to_string());
        for message in messages {
            assert!(
                message.len() < 300,
                "{} bytes: {message:.300}",
                message.len()
            );
        }
    }
}
