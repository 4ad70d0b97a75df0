//! The CNI spec's error codes for the engine's refusals, in one table used by both edges that
//! answer CNI: the plugin on its own, and the node agent's `/v1/cni/*` routes, which send the
//! code along with their error, so a refusal gets the same code whichever way the plugin ran.
//! Codes 1-99 are the spec's; 100 and up are corral's own (the plugin's README lists them).

use crate::error::AllocError;
use crate::input::SpecError;

/// Invalid necessary environment variables.
pub const INVALID_ENVIRONMENT: u32 = 4;
/// Invalid network configuration.
pub const INVALID_NETWORK_CONFIG: u32 = 7;
/// Try again later.
pub const TRY_AGAIN_LATER: u32 = 11;
/// corral: no free address of the family in the pool.
pub const POOL_EXHAUSTED: u32 = 100;
/// corral: a requested address is held by another attachment.
pub const ADDRESS_IN_USE: u32 = 101;
/// corral: a requested address is outside the ranges, excluded, reserved or draining.
pub const ADDRESS_UNAVAILABLE: u32 = 102;
/// corral: the attachment already holds a different address than the one requested.
pub const ATTACHMENT_CONFLICT: u32 = 106;
/// An internal error; libcni uses 999 for errors that carry no code.
pub const INTERNAL: u32 = 999;

/// The CNI code of each kind of bad input, once, with no catch-all: a new kind does not
/// compile until it is mapped here.
pub fn of_spec(err: &SpecError) -> u32 {
    match err {
        SpecError::InvalidContainerId { .. } | SpecError::InvalidIfname { .. } => {
            INVALID_ENVIRONMENT
        }
        SpecError::InvalidAddress { .. }
        | SpecError::InvalidCidr { .. }
        | SpecError::HostBitsSet { .. }
        | SpecError::OutsideSubnet { .. }
        | SpecError::FamilyMismatch { .. }
        | SpecError::ReservedBound { .. }
        | SpecError::StartAfterEnd { .. }
        | SpecError::EmptyRange { .. }
        | SpecError::Syntax { .. }
        | SpecError::InvalidPoolName { .. }
        | SpecError::InvalidNetworkName { .. }
        | SpecError::InvalidOwner { .. }
        | SpecError::InvalidExclusionReason { .. }
        | SpecError::InvalidInterfaceId { .. }
        | SpecError::InvalidMac { .. } => INVALID_NETWORK_CONFIG,
    }
}

/// The CNI code of each way the engine refuses an operation, once, with no catch-all: a new
/// kind does not compile until it is mapped here.
pub fn of_alloc(err: &AllocError) -> u32 {
    match err {
        AllocError::Invalid(spec) => of_spec(spec),
        // The pool may gain capacity (an operator delegates a CIDR, a range is added):
        // having none is the same to the caller as having no free address.
        AllocError::PoolExhausted { .. }
        | AllocError::NoCapacity { .. }
        | AllocError::TableFull => POOL_EXHAUSTED,
        AllocError::AddressInUse { .. } | AllocError::GenerationMismatch { .. } => ADDRESS_IN_USE,
        AllocError::OutsidePool { .. }
        | AllocError::Excluded { .. }
        | AllocError::Reserved { .. }
        | AllocError::Draining { .. } => ADDRESS_UNAVAILABLE,
        // The configuration asks for something the engine was set up to refuse, names a
        // pool that does not exist, or has ranges that overlap another network's.
        AllocError::FamilyDisabled { .. }
        | AllocError::UnknownPool { .. }
        | AllocError::RangeOverlap { .. } => INVALID_NETWORK_CONFIG,
        AllocError::AttachmentConflict { .. } => ATTACHMENT_CONFLICT,
        AllocError::RestoreInProgress { .. } => TRY_AGAIN_LATER,
        // Pool management, leases and restore bookkeeping are not reachable from a CNI
        // request; if one surfaces, it is a bug in corral.
        AllocError::PoolExists { .. }
        | AllocError::PoolInUse { .. }
        | AllocError::UnknownRange { .. }
        | AllocError::UnknownExclusion { .. }
        | AllocError::NotAllocated { .. }
        | AllocError::SnapshotMismatch { .. }
        | AllocError::DuplicateTarget { .. }
        | AllocError::GenerationOutOfRange { .. }
        | AllocError::NoLease { .. }
        | AllocError::LeaseExists { .. }
        | AllocError::LeaseMismatch { .. }
        | AllocError::RestoreFinished { .. } => INTERNAL,
    }
}
