//! Between the API's types and the engine's: conversions, and each error as the API reports
//! it.

use std::net::IpAddr;

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{
    AllocError, Allocation, AttachmentKey, Echo, Exclusion, Family, PoolName, RangeSpec, Released,
};
use corral_store::{PoolSpec, RangeEntry, RangeSource, RangeState, ScopeConfig, StoreError};

use super::scopes::Scope;

/// A failed operation: the API's error code, a message for people, and the pool concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    pub code: ErrorCode,
    pub message: String,
    pub pool: Option<String>,
    /// A CNI ADD: the set that could not be served.
    pub set: Option<usize>,
    pub retryable: bool,
}

impl OpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> OpError {
        OpError {
            code,
            message: message.into(),
            pool: None,
            set: None,
            retryable: code == ErrorCode::RetryLater,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> OpError {
        OpError::new(ErrorCode::BadRequest, message)
    }

    pub(super) fn store(error: StoreError) -> OpError {
        match error {
            StoreError::Engine(error) => OpError::from(error),
            other => OpError::new(
                ErrorCode::RetryLater,
                format!("the agent's store failed: {other}"),
            ),
        }
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
        OpError {
            code,
            message: error.to_string(),
            pool: pool.map(ToString::to_string),
            set: None,
            retryable: error.is_retryable(),
        }
    }
}

pub(super) fn api_source(source: RangeSource) -> api::RangeSource {
    match source {
        RangeSource::File => api::RangeSource::File,
        RangeSource::Api => api::RangeSource::Api,
        RangeSource::Cni => api::RangeSource::Cni,
        RangeSource::Cluster => api::RangeSource::Cluster,
        RangeSource::Interface => api::RangeSource::Interface,
    }
}

pub(super) fn family_name(family: Family) -> api::FamilyName {
    match family {
        Family::V4 => api::FamilyName::Ipv4,
        Family::V6 => api::FamilyName::Ipv6,
    }
}

pub(super) fn family_of(name: api::FamilyName) -> Family {
    match name {
        api::FamilyName::Ipv4 => Family::V4,
        api::FamilyName::Ipv6 => Family::V6,
    }
}

pub(super) fn pool_name(text: &str) -> Result<PoolName, OpError> {
    PoolName::new(text).map_err(|e| OpError::bad_request(format!("pool {}: {e}", Echo(text))))
}

pub(super) fn key_of(key: &api::AttachmentKey) -> Result<AttachmentKey, OpError> {
    AttachmentKey::new(&key.network, &key.container_id, &key.ifname)
        .map_err(|e| OpError::bad_request(format!("key: {e}")))
}

pub(super) fn api_key(key: &AttachmentKey) -> api::AttachmentKey {
    api::AttachmentKey {
        network: key.network().to_owned(),
        container_id: key.container_id().to_owned(),
        ifname: key.ifname().to_owned(),
    }
}

pub(super) fn api_lease(lease: &corral_core::Lease) -> api::Lease {
    api::Lease {
        id: lease.id.to_string(),
        expires_at_ms: lease.expires_at.as_unix_millis(),
    }
}

pub(super) fn released(r: &Released) -> api::ReleasedAddress {
    api::ReleasedAddress {
        address: r.addr,
        pool: r.pool.to_string(),
        generation: r.generation,
    }
}

pub(super) fn allocated(pool: &PoolName, a: &Allocation) -> api::Allocated {
    api::Allocated {
        address: a.addr,
        family: family_name(Family::of(a.addr)),
        pool: pool.to_string(),
        generation: a.generation,
        existing: a.existing,
        subnet: a.range.map(|r| r.subnet_net().to_string()),
        gateway: a.range.and_then(|r| r.gateway()),
        lease: a.lease.as_ref().map(api_lease),
        interface: None,
    }
}

pub(super) fn scope_config_of(pools: &[api::CniPool]) -> ScopeConfig {
    ScopeConfig {
        pools: pools
            .iter()
            .map(|p| PoolSpec {
                name: p.name.clone(),
                cooldown_ms: p.cooldown_ms,
                lowest_free: p.lowest_free,
                ranges: p
                    .ranges
                    .iter()
                    .map(|range| RangeEntry {
                        range: range.clone(),
                        source: RangeSource::Cni,
                        state: RangeState::Active,
                    })
                    .collect(),
                interfaces: Vec::new(),
                interface_backed: false,
                exclusions: p
                    .exclusions
                    .iter()
                    .map(|e| (e.network.clone(), e.reason.clone()))
                    .collect(),
            })
            .collect(),
    }
}

pub(super) fn scope_status(name: &str, scope: &Scope) -> api::ScopeStatus {
    let engine = &scope.engine;
    api::ScopeStatus {
        scope: name.to_owned(),
        pools: scope
            .visible_pools()
            .into_iter()
            .map(|pool| api::PoolStatus {
                pool: pool.to_string(),
                families: [Family::V4, Family::V6]
                    .into_iter()
                    .filter_map(|family| {
                        let stats = engine.stats(&pool, family).ok()?;
                        Some(api::FamilyStatus {
                            family: family_name(family),
                            capacity: stats.capacity.to_string(),
                            used: stats.used.to_string(),
                            free: stats.free.to_string(),
                            excluded: stats.excluded.to_string(),
                            cooling: stats.cooling.to_string(),
                        })
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Which set of a CNI ADD an allocation error is about, so the plugin can name it.
pub(super) fn failed_set(
    error: &AllocError,
    sets: &[api::CniSet],
    pools: &[PoolName],
) -> Option<usize> {
    let by_pool = |pool: &PoolName, family: Option<Family>| {
        sets.iter()
            .zip(pools)
            .position(|(set, p)| p == pool && family.is_none_or(|f| family_of(set.family) == f))
    };
    let by_addr = |addr: &IpAddr| sets.iter().position(|set| set.requested == Some(*addr));
    match error {
        AllocError::PoolExhausted { pool, family } | AllocError::NoCapacity { pool, family } => {
            by_pool(pool, Some(*family))
        }
        AllocError::FamilyDisabled { family } => {
            sets.iter().position(|set| family_of(set.family) == *family)
        }
        AllocError::AddressInUse { addr, .. }
        | AllocError::OutsidePool { addr, .. }
        | AllocError::Excluded { addr, .. }
        | AllocError::Reserved { addr, .. }
        | AllocError::Draining { addr, .. } => by_addr(addr),
        AllocError::AttachmentConflict { pool, existing, .. } => {
            by_pool(pool, Some(Family::of(*existing)))
        }
        AllocError::UnknownPool { pool } => by_pool(pool, None),
        _ => None,
    }
}

/// A configuration the plugin sent must at least parse; the engine refuses the rest.
pub(super) fn validate_config(config: &ScopeConfig) -> Result<(), OpError> {
    for pool in &config.pools {
        pool_name(&pool.name)?;
        for range in &pool.ranges {
            range
                .range
                .parse::<RangeSpec>()
                .map_err(|e| OpError::bad_request(format!("range {}: {e}", Echo(&range.range))))?;
        }
        for (network, reason) in &pool.exclusions {
            Exclusion::parse(network, reason)
                .map_err(|e| OpError::bad_request(format!("exclusion {}: {e}", Echo(network))))?;
        }
    }
    Ok(())
}
