//! The engine's typed errors: what was refused and why, so a caller can decide what to do.
//! Input that is malformed before it reaches the engine is refused with [`SpecError`]
//! (`input.rs`).

use std::net::IpAddr;

use crate::addr::Family;
use crate::input::SpecError;
use crate::spec::{AttachmentKey, PoolName, Reserved};

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
