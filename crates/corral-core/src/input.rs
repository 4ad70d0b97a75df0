//! What outside input may be before it becomes a value: the length limits of names and
//! texts, how an input is echoed in a message (quoted, escaped and cut), and [`SpecError`],
//! the refusal of input that breaks a rule. A leaf: the value types (`spec.rs`) and the
//! engine's errors (`error.rs`) both build on it.

use std::net::IpAddr;

use crate::addr::Reserved;

/// Longest owner string accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 1024;
/// Longest network name accepted, in bytes.
pub const MAX_NETWORK_LEN: usize = 253;
/// Longest container ID accepted, in bytes.
pub const MAX_CONTAINER_ID_LEN: usize = 1024;
/// Longest interface name accepted (Linux IFNAMSIZ less the terminating NUL).
pub const MAX_IFNAME_LEN: usize = 15;
/// Longest pool name accepted, in bytes.
pub const MAX_POOL_NAME_LEN: usize = 63;

/// Input that could not be turned into a valid value. Nothing was changed.
///
/// Messages echo at most [`ECHO_CHARS`] characters of an input (quoted and escaped), so an
/// over-long input never comes back whole; inputs over their length limit are said to be too
/// long, with the limit and the length.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("invalid address {}", Echo(.input))]
    InvalidAddress { input: String },
    #[error("invalid cidr {}", Echo(.input))]
    InvalidCidr { input: String },
    #[error("subnet {subnet} has host bits set; the network is {network}")]
    HostBitsSet { subnet: String, network: String },
    #[error("{what} {addr} is not in subnet {subnet}")]
    OutsideSubnet {
        what: &'static str,
        addr: IpAddr,
        subnet: String,
    },
    #[error("{what} {addr} is not of the family of subnet {subnet}")]
    FamilyMismatch {
        what: &'static str,
        addr: IpAddr,
        subnet: String,
    },
    #[error("{what} {addr} is the subnet's {reserved}, which is never handed out")]
    ReservedBound {
        what: &'static str,
        addr: IpAddr,
        reserved: Reserved,
    },
    #[error("range start {start} is after its end {end}")]
    StartAfterEnd { start: IpAddr, end: IpAddr },
    #[error("range {range} has no address to hand out")]
    EmptyRange { range: String },
    #[error("cannot parse {}: {reason}", Echo(.input))]
    Syntax { input: String, reason: String },
    #[error(
        "{}",
        name_problem(
            "pool name",
            .name,
            MAX_POOL_NAME_LEN,
            "use 1-63 of [A-Za-z0-9._-], starting with a letter or digit"
        )
    )]
    InvalidPoolName { name: String },
    #[error(
        "{}",
        name_problem(
            "network name",
            .name,
            MAX_NETWORK_LEN,
            "use [A-Za-z0-9_.-], starting with a letter or digit"
        )
    )]
    InvalidNetworkName { name: String },
    #[error(
        "{}",
        name_problem(
            "container id",
            .id,
            MAX_CONTAINER_ID_LEN,
            "use [A-Za-z0-9_.-], starting with a letter or digit"
        )
    )]
    InvalidContainerId { id: String },
    // The rule names the limit already, and CNI runtimes match on this message's shape.
    #[error(
        "invalid interface name {}: use 1-15 bytes without '/', ':' or whitespace, not '.' or '..'",
        Echo(.ifname)
    )]
    InvalidIfname { ifname: String },
    #[error(
        "invalid interface id {}: use 1-64 of [A-Za-z0-9._:-], starting with a letter or digit",
        Echo(.id)
    )]
    InvalidInterfaceId { id: String },
    #[error(
        "invalid mac address {}: use six hexadecimal pairs separated by ':'",
        Echo(.input)
    )]
    InvalidMac { input: String },
    #[error("{}", text_problem("owner", .owner))]
    InvalidOwner { owner: String },
    #[error("{}", text_problem("exclusion reason", .reason))]
    InvalidExclusionReason { reason: String },
}

/// How many characters of an input an error message echoes at most.
pub const ECHO_CHARS: usize = 64;

/// An input as an error message shows it: quoted and escaped as Rust's `{:?}` does, and cut
/// after [`ECHO_CHARS`] characters (then followed by `...`), so a message never carries a
/// megabyte of someone's input back.
#[derive(Clone, Copy, Debug)]
pub struct Echo<'a>(pub &'a str);

impl std::fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(ECHO_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(f, "{:?}...", &self.0[..cut]),
        }
    }
}

/// The message for a name that broke its rule: too long (with the limit and the length), or
/// made of what the rule does not allow.
fn name_problem(what: &str, input: &str, max: usize, rule: &str) -> String {
    if input.len() > max {
        too_long(what, input, max)
    } else {
        format!("invalid {what} {}: {rule}", Echo(input))
    }
}

/// The message for a free text (an owner, an exclusion reason) that broke its rule.
fn text_problem(what: &str, input: &str) -> String {
    if input.len() > MAX_OWNER_LEN {
        too_long(what, input, MAX_OWNER_LEN)
    } else {
        format!(
            "invalid {what} {}: control characters are not allowed",
            Echo(input)
        )
    }
}

fn too_long(what: &str, input: &str, max: usize) -> String {
    format!(
        "{what} {} is too long: {} bytes, at most {max}",
        Echo(input),
        input.len()
    )
}
