//! From the engine's types to the API's answers, and which set of a CNI ADD an allocation
//! error is about. (Requests come parsed: `request.rs`; the API checks them at its edge.)

use std::net::IpAddr;

use corral_api as api;
use corral_core::{AllocError, Allocation, AttachmentKey, Family, PoolName, Released};
use corral_store::RangeSource;

use super::request::CniSet;

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

/// An address an attachment holds, as CHECK answers it: existing, with its lease.
pub(super) fn held_by_key(info: &corral_core::AllocationInfo) -> api::Allocated {
    api::Allocated {
        address: info.entry.addr,
        family: family_name(Family::of(info.entry.addr)),
        pool: info.pool.to_string(),
        generation: info.entry.generation,
        existing: true,
        subnet: None,
        gateway: None,
        lease: info.entry.lease.as_ref().map(api_lease),
        interface: None,
    }
}

/// Which set of a CNI ADD an allocation error is about, so the plugin can name it.
pub(super) fn failed_set(error: &AllocError, sets: &[CniSet]) -> Option<usize> {
    let by_pool = |pool: &PoolName, family: Option<Family>| {
        sets.iter()
            .position(|set| set.pool == *pool && family.is_none_or(|f| set.family == f))
    };
    let by_addr = |addr: &IpAddr| sets.iter().position(|set| set.requested == Some(*addr));
    match error {
        AllocError::PoolExhausted { pool, family } | AllocError::NoCapacity { pool, family } => {
            by_pool(pool, Some(*family))
        }
        AllocError::FamilyDisabled { family } => sets.iter().position(|set| set.family == *family),
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
