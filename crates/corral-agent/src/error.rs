//! The agent's one error type, [`OpError`]: what a failed operation answers, the API's
//! [`ErrorBody`] (its code, a message for people, the pool concerned), and how every engine
//! and store error maps onto it. A leaf: it imports nothing of the agent, so the state machine, the local-routes
//! planner and the API all share it without importing each other.

use std::ops::{Deref, DerefMut};

use corral_api::{ErrorBody, ErrorCode, ErrorResponse};
use corral_core::{AllocError, InterfaceError, SpecError, cni_code};
use corral_store::StoreError;

/// A failed operation: the body of the API's error answer (its code, a message for people,
/// the pool concerned, the CNI ADD's set, whether to retry, the plugin's CNI code), owned
/// here so the agent's mappings of engine and store errors can be its `From`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError(pub ErrorBody);

impl Deref for OpError {
    type Target = ErrorBody;
    fn deref(&self) -> &ErrorBody {
        &self.0
    }
}

impl DerefMut for OpError {
    fn deref_mut(&mut self) -> &mut ErrorBody {
        &mut self.0
    }
}

impl OpError {
    /// The answer of `code` about no pool, set or CNI code in particular; retryable when the
    /// code is [`ErrorCode::RetryLater`].
    pub fn new(code: ErrorCode, message: impl Into<String>) -> OpError {
        OpError(ErrorResponse::new(code, message).error)
    }

    /// This error about `pool`.
    pub fn with_pool(mut self, pool: impl std::fmt::Display) -> OpError {
        self.pool = Some(pool.to_string());
        self
    }

    /// This error about a CNI ADD's `set`.
    pub fn with_set(mut self, set: Option<usize>) -> OpError {
        self.set = set;
        self
    }

    /// No scope of that name (echoed safely).
    pub fn unknown_scope(scope: &str) -> OpError {
        OpError::new(
            ErrorCode::NotFound,
            format!("unknown scope {}", corral_core::Echo(scope)),
        )
    }

    pub fn bad_request(message: impl Into<String>) -> OpError {
        OpError::new(ErrorCode::BadRequest, message)
    }

    /// Input refused before it reached the engine, with the CNI code the plugin gives it.
    pub fn invalid(context: &str, error: &SpecError) -> OpError {
        let mut op = OpError::bad_request(format!("{context}: {error}"));
        op.cni_code = Some(cni_code::of_spec(error));
        op
    }

    /// Every store error by its kind, with no catch-all: a failed read or write of the disk
    /// (which a retry may get past, and after which the touched scopes are rebuilt from the
    /// store) is "retry later"; state that cannot be trusted (a failed sync, corrupt or lost
    /// state, a schema from a newer build, a row memory and disk disagree on) is
    /// [`ErrorCode::StoreFailed`], which no retry gets past.
    pub(crate) fn store(error: StoreError) -> OpError {
        let code = match &error {
            StoreError::Engine(error) => return OpError::from(error.clone()),
            StoreError::Backend { .. }
            | StoreError::Directory { .. }
            | StoreError::Lock { .. }
            | StoreError::Held { .. } => ErrorCode::RetryLater,
            StoreError::NotADirectory { .. }
            | StoreError::StateLost { .. }
            | StoreError::Taken { .. }
            | StoreError::SchemaTooNew { .. }
            | StoreError::Corrupt { .. }
            | StoreError::SyncFailed { .. } => ErrorCode::StoreFailed,
        };
        OpError::new(code, format!("the agent's store failed: {error}"))
    }
}

/// Every engine error as the API reports it: its code and the pool it concerns. The matches
/// are exhaustive, with no catch-all, so a new kind of error does not compile until it is
/// mapped here (the CNI plugin maps the same errors to CNI codes on its own edge).
impl From<AllocError> for OpError {
    fn from(error: AllocError) -> OpError {
        use AllocError as E;
        let (code, pool) = match &error {
            E::Invalid(_) | E::GenerationOutOfRange { .. } => (ErrorCode::BadRequest, None),
            E::DuplicateTarget { pool, .. } => (ErrorCode::BadRequest, Some(pool)),
            E::UnknownPool { pool }
            | E::UnknownRange { pool, .. }
            | E::UnknownExclusion { pool, .. } => (ErrorCode::NotFound, Some(pool)),
            E::NotAllocated { .. } | E::NoLease { .. } => (ErrorCode::NotFound, None),
            E::PoolExhausted { pool, .. } | E::NoCapacity { pool, .. } => {
                (ErrorCode::Exhausted, Some(pool))
            }
            E::TableFull => (ErrorCode::Exhausted, None),
            E::AddressInUse { .. } => (ErrorCode::InUse, None),
            E::AttachmentConflict { pool, .. } => (ErrorCode::AttachmentConflict, Some(pool)),
            E::OutsidePool { pool, .. } | E::Draining { pool, .. } => {
                (ErrorCode::Unavailable, Some(pool))
            }
            E::Excluded { .. } | E::Reserved { .. } | E::FamilyDisabled { .. } => {
                (ErrorCode::Unavailable, None)
            }
            E::RestoreInProgress { .. } => (ErrorCode::RetryLater, None),
            E::PoolExists { pool } | E::PoolInUse { pool, .. } => (ErrorCode::Conflict, Some(pool)),
            E::RangeOverlap { .. } => (ErrorCode::Conflict, None),
            E::GenerationMismatch { .. } | E::LeaseExists { .. } | E::LeaseMismatch { .. } => {
                (ErrorCode::Conflict, None)
            }
            // Restore-phase misuse and stored snapshots that do not fit are the agent's own
            // state, never the caller's input; they are refused as conflicts with the state.
            E::SnapshotMismatch { pool, .. } => (ErrorCode::Conflict, Some(pool)),
            E::RestoreFinished { .. } => (ErrorCode::Conflict, None),
        };
        OpError(ErrorBody {
            code,
            message: error.to_string(),
            pool: pool.map(ToString::to_string),
            set: None,
            retryable: error.is_retryable(),
            cni_code: Some(cni_code::of_alloc(&error)),
        })
    }
}

/// Every interface error as the API reports it; exhaustive, no catch-all.
impl From<InterfaceError> for OpError {
    fn from(error: InterfaceError) -> OpError {
        use InterfaceError as E;
        let code = match &error {
            E::Engine(inner) => return OpError::from(inner.clone()),
            E::Invalid(_) | E::InvalidSpec { .. } | E::NotInSubnet { .. } => ErrorCode::BadRequest,
            E::BadPrefixLength { .. } | E::ReservedAddress { .. } => ErrorCode::BadRequest,
            E::DuplicateInterface { .. }
            | E::DuplicateDeviceNumber { .. }
            | E::DuplicateMac { .. } => ErrorCode::DuplicateInterface,
            E::AddressAlreadyPresent { .. } => ErrorCode::AddressAlreadyPresent,
            E::UnknownAddress { .. } => ErrorCode::UnknownAddress,
            E::AddressInUse { .. } | E::AddressCooling { .. } => ErrorCode::AddressInUse,
            E::InterfaceInUse { .. } | E::InterfaceCooling { .. } | E::PrimaryOrTrunk { .. } => {
                ErrorCode::InterfaceInUse
            }
            E::UnknownInterface { .. } => ErrorCode::UnknownInterface,
            E::Exhausted { .. } => ErrorCode::Exhausted,
            E::NotOnInterface { .. } => ErrorCode::Conflict,
        };
        let pool = match &error {
            E::Exhausted { pool, .. } | E::NotOnInterface { pool, .. } => Some(pool.to_string()),
            _ => None,
        };
        OpError(ErrorBody {
            code,
            message: error.to_string(),
            pool,
            set: None,
            retryable: error.is_retryable(),
            cni_code: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_refusal_carries_the_code_the_plugin_gives_it() {
        let error = AllocError::FamilyDisabled {
            family: corral_core::Family::V6,
        };
        let op = OpError::from(error.clone());
        assert_eq!(op.code, ErrorCode::Unavailable);
        assert_eq!(op.cni_code, Some(cni_code::of_alloc(&error)));
        assert_eq!(op.cni_code, Some(cni_code::INVALID_NETWORK_CONFIG));
    }

    #[test]
    fn store_errors_are_mapped_by_kind() {
        let failed_io = OpError::store(StoreError::Directory {
            path: "/var/lib/corral".into(),
            source: std::io::Error::other("EIO"),
        });
        assert_eq!(failed_io.code, ErrorCode::RetryLater);
        assert!(failed_io.retryable);
        for broken in [
            StoreError::Corrupt {
                what: "allocation row".into(),
                reason: "bad address".into(),
            },
            StoreError::SchemaTooNew {
                found: 9,
                supported: 3,
            },
            StoreError::SyncFailed {
                path: "/var/lib/corral/state.db".into(),
            },
        ] {
            let op = OpError::store(broken);
            assert_eq!(op.code, ErrorCode::StoreFailed, "{op:?}");
            assert!(!op.retryable, "{op:?}");
        }
    }
}
