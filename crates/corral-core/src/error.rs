//! The engine's typed errors: what was refused and why, so a caller can decide what to do.

use std::net::IpAddr;

use crate::addr::Family;
use crate::spec::{
    AttachmentKey, MAX_CONTAINER_ID_LEN, MAX_NETWORK_LEN, MAX_OWNER_LEN, MAX_POOL_NAME_LEN,
    PoolName, Reserved,
};

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

/// Who holds an address, as reported when a request for it is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub owner: String,
    pub key: Option<AttachmentKey>,
    pub generation: u64,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "owner {:?}", self.owner)?;
        if let Some(key) = &self.key {
            write!(f, " (attachment {key})")?;
        }
        write!(f, " at generation {}", self.generation)
    }
}

/// An engine operation that was refused. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error(transparent)]
    Invalid(#[from] SpecError),
    #[error("{family} allocation disabled")]
    FamilyDisabled { family: Family },
    #[error("unknown pool {pool}")]
    UnknownPool { pool: PoolName },
    #[error("pool {pool} already exists")]
    PoolExists { pool: PoolName },
    #[error("pool {pool} still holds {n_allocations} allocations")]
    PoolInUse { pool: PoolName, n_allocations: u64 },
    #[error("pool {pool} has no {family} capacity")]
    NoCapacity { pool: PoolName, family: Family },
    #[error("pool {pool} has no free {family} address")]
    PoolExhausted { pool: PoolName, family: Family },
    #[error("{addr} is not in pool {pool}")]
    OutsidePool { addr: IpAddr, pool: PoolName },
    #[error("{addr} is already held by {holder}")]
    AddressInUse { addr: IpAddr, holder: Box<Holder> },
    #[error("{addr} is excluded by {network} ({reason})")]
    Excluded {
        addr: IpAddr,
        network: String,
        reason: String,
    },
    #[error("{addr} is reserved as the {reserved} of range {range}")]
    Reserved {
        addr: IpAddr,
        reserved: Reserved,
        range: String,
    },
    #[error("{addr} is in range {range} of pool {pool}, which is draining")]
    Draining {
        addr: IpAddr,
        range: String,
        pool: PoolName,
    },
    #[error("range {range} overlaps range {existing} of pool {existing_pool}")]
    RangeOverlap {
        range: String,
        existing: String,
        existing_pool: PoolName,
    },
    #[error("pool {pool} has no range {range}")]
    UnknownRange { range: String, pool: PoolName },
    #[error("pool {pool} has no exclusion {network}")]
    UnknownExclusion { network: String, pool: PoolName },
    #[error("{addr} is not allocated")]
    NotAllocated { addr: IpAddr },
    #[error("{addr} is held at generation {actual}, not {requested}")]
    GenerationMismatch {
        addr: IpAddr,
        requested: u64,
        actual: u64,
    },
    #[error("snapshot of pool {pool} does not fit: {reason}")]
    SnapshotMismatch { pool: PoolName, reason: String },
    #[error("the allocation table is full (2^32 allocations or 16 GiB of owner and key strings)")]
    TableFull,
    #[error("two requests of one all-or-nothing allocation target pool {pool}, {family}")]
    DuplicateTarget { pool: PoolName, family: Family },
    #[error("generation {generation} is out of range (at most 2^63)")]
    GenerationOutOfRange { generation: u64 },
    #[error("attachment {key} already holds {existing} in pool {pool}")]
    AttachmentConflict {
        key: AttachmentKey,
        existing: IpAddr,
        pool: PoolName,
    },
    #[error("{addr} has no lease")]
    NoLease { addr: IpAddr },
    #[error("{addr} already has lease {lease}")]
    LeaseExists { addr: IpAddr, lease: uuid::Uuid },
    #[error("lease {requested} does not match lease {actual} of {addr}")]
    LeaseMismatch {
        addr: IpAddr,
        requested: uuid::Uuid,
        actual: uuid::Uuid,
    },
    #[error("restore is in progress: {operation} must wait until restore has finished")]
    RestoreInProgress { operation: &'static str },
    #[error("restore has finished: {operation} is only accepted while restoring")]
    RestoreFinished { operation: &'static str },
}

impl AllocError {
    /// Whether the same request may succeed later without a change of configuration: the pool
    /// may gain free addresses, or the restore phase may end.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AllocError::PoolExhausted { .. } | AllocError::RestoreInProgress { .. }
        )
    }
}
