//! Between the API's types and the engine's: conversions, and each error as the API reports
//! it. The parsers (`pool_name`, `key_of`, `node_pool_of`, `validate_config`, ...) are the
//! API edge's checks (`api.rs`), with the messages the API answers.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use corral_api as api;
use corral_core::{
    AllocError, Allocation, AttachmentKey, DEFAULT_GC_GRACE, DEFAULT_GC_MAX_RELEASED, Echo,
    Exclusion, Family, GcPolicy, InterfaceId, IpNet, PoolName, RangeSpec, Released,
};
use corral_store::{PoolSpec, RangeEntry, RangeSource, RangeState, ScopeConfig};

use super::request::CniSet;
use crate::error::OpError;

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

pub(crate) fn family_of(name: api::FamilyName) -> Family {
    match name {
        api::FamilyName::Ipv4 => Family::V4,
        api::FamilyName::Ipv6 => Family::V6,
    }
}

pub(crate) fn pool_name(text: &str) -> Result<PoolName, OpError> {
    PoolName::new(text).map_err(|e| OpError::invalid(&format!("pool {}", Echo(text)), &e))
}

pub(crate) fn key_of(key: &api::AttachmentKey) -> Result<AttachmentKey, OpError> {
    AttachmentKey::new(&key.network, &key.container_id, &key.ifname)
        .map_err(|e| OpError::invalid("key", &e))
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

pub(crate) fn scope_config_of(pools: &[api::CniPool]) -> ScopeConfig {
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

/// A configuration the plugin sent must at least parse; the engine refuses the rest.
pub(crate) fn validate_config(config: &ScopeConfig) -> Result<(), OpError> {
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

/// The node pool a CNI network names, if it names one; with `pools` beside it, refused.
pub(crate) fn node_pool_of(network: &api::CniNetwork) -> Result<Option<PoolName>, OpError> {
    let Some(pool) = &network.node_pool else {
        return Ok(None);
    };
    if !network.pools.is_empty() {
        return Err(OpError::bad_request(format!(
            "network {:?}: node_pool and pools both given; a network allocates from a pool of \
             the agent's node scope or from its own pools, not both",
            network.name
        )));
    }
    pool_name(pool).map(Some)
}

/// The configuration of a network on its own pools, checked as its scope is built from it:
/// the network may not take the agent's own scope's name, and the configuration must parse.
pub(crate) fn own_network_config(network: &api::CniNetwork) -> Result<ScopeConfig, OpError> {
    if network.name == api::NODE_SCOPE {
        return Err(OpError::bad_request(format!(
            "network name {:?} is the agent's own scope",
            network.name
        )));
    }
    let config = scope_config_of(&network.pools);
    validate_config(&config)?;
    Ok(config)
}

/// The sets of an ADD on a node pool: only requested addresses, at most one per family (the
/// pool's families decide the rest).
pub(crate) fn node_pool_requested(
    pool: &PoolName,
    sets: &[api::CniSet],
) -> Result<Vec<(Family, IpAddr)>, OpError> {
    let mut requested: Vec<(Family, IpAddr)> = Vec::new();
    for set in sets {
        let Some(addr) = set.requested else {
            return Err(OpError::bad_request(
                "a network on a node pool takes sets only to request addresses; the pool's \
                 families decide the rest",
            ));
        };
        let family = Family::of(addr);
        if family != family_of(set.family) {
            return Err(OpError::bad_request(format!(
                "requested address {addr} is not of family {:?}",
                set.family
            )));
        }
        if requested.iter().any(|(f, _)| *f == family) {
            return Err(OpError::new(
                api::ErrorCode::Unavailable,
                format!(
                    "two {family} addresses requested from pool {pool}, which hands out one per \
                     family"
                ),
            ));
        }
        requested.push((family, addr));
    }
    Ok(requested)
}

/// The attachments a leak collection is told are live.
pub(crate) fn live_keys(keys: &[api::AttachmentKey]) -> Result<HashSet<AttachmentKey>, OpError> {
    keys.iter().map(key_of).collect()
}

/// A leak collection's policy, its defaults filled in.
pub(crate) fn gc_policy(
    grace_ms: Option<u64>,
    max_released: Option<u64>,
) -> Result<GcPolicy, OpError> {
    let max_released = match max_released {
        Some(0) => {
            return Err(OpError::bad_request(
                "max_released: 0 would release nothing; give at least 1",
            ));
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_GC_MAX_RELEASED,
    };
    Ok(GcPolicy {
        grace: grace_ms.map_or(DEFAULT_GC_GRACE, Duration::from_millis),
        max_released,
    })
}

/// An interface's address: a CIDR, or a bare address (as a /32 or /128).
pub(crate) fn net_or_addr(text: &str) -> Result<IpNet, OpError> {
    let net = if text.contains('/') {
        corral_core::parse_net(text)
    } else {
        corral_core::parse_addr(text).map(IpNet::from)
    };
    net.map_err(|e| OpError::bad_request(format!("address {}: {e}", Echo(text))))
}

pub(crate) fn interface_id(text: &str) -> Result<InterfaceId, OpError> {
    InterfaceId::new(text).map_err(|e| OpError::bad_request(format!("interface id: {e}")))
}
