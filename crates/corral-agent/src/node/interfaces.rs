//! Interface-backed pools of the node scope (`/v1/interfaces`): the cloud interfaces of the
//! node with their secondary addresses and delegated prefixes, kept by corral-core's
//! [`Interfaces`] beside the scope's engine (one table per pool), and durable in the scope's
//! stored configuration (`PoolSpec::interfaces`, each address also a range of source
//! `interface`), written in the same commit as the rows, like every other change.
//!
//! A pool becomes interface-backed with its first interface. Its capacity is then exactly its
//! interfaces' addresses: a plain range is refused in it, and an interface in a pool that has
//! plain ranges, both with `pool_kind_mismatch` (an address handed out from a plain range
//! would have no interface to route the pod through).

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{
    Assignment, AttachmentKey, Engine, Family, InterfaceError, InterfaceId, InterfaceSpec,
    Interfaces, IpNet, PoolName, Released, Request, Target, Timestamp,
};
use corral_store::{HistoryKind, RangeSource, Store, StoredAllocation};

use super::op::InterfaceGauge;
use super::request::{AddInterface, ImportIpamd};
use super::scope::{Changes, Scope, Write, ensure_spec, record_released};
use super::state::{Clock, NodeState};
use super::wire::{allocated, family_name};
use crate::error::OpError;

/// Writes a pool's table into the scope's stored configuration: its interfaces, and its
/// ranges of source `interface` exactly the table's addresses.
pub(super) fn store_table(scope: &mut Scope, pool: &PoolName) -> Result<(), OpError> {
    let table = scope
        .interfaces
        .get(pool)
        .cloned()
        .unwrap_or_else(|| Interfaces::new(pool.clone()));
    ensure_spec(scope, pool)?
        .set_interfaces(&table)
        .map_err(OpError::store)
}

fn allocated_interface(assignment: &Assignment) -> api::AllocatedInterface {
    api::AllocatedInterface {
        id: assignment.interface.to_string(),
        device_number: assignment.device_number,
        mac: assignment.mac.to_string(),
        subnet: assignment.subnet.to_string(),
        gateway: assignment.gateway,
        routes: assignment.routes.iter().map(ToString::to_string).collect(),
    }
}

/// An assignment as the API answers an allocation.
pub(super) fn allocated_of(pool: &PoolName, assignment: &Assignment) -> api::Allocated {
    api::Allocated {
        address: assignment.addr,
        family: family_name(Family::of(assignment.addr)),
        pool: pool.to_string(),
        generation: assignment.generation,
        existing: assignment.existing,
        subnet: Some(assignment.subnet.to_string()),
        gateway: assignment.gateway,
        lease: None,
        interface: Some(allocated_interface(assignment)),
    }
}

/// Adds the interface data to answers of an interface-backed pool (an allocation made by the
/// engine directly: a requested address, several families at once, no key).
pub(super) fn decorate(scope: &Scope, allocations: &mut [api::Allocated]) {
    for allocated in allocations {
        let Ok(pool) = PoolName::new(&allocated.pool) else {
            continue;
        };
        let Some(table) = scope.interfaces.get(&pool) else {
            continue;
        };
        if let Some(assignment) = table.assignment_of(&scope.engine, allocated.address) {
            allocated.subnet = Some(assignment.subnet.to_string());
            allocated.gateway = assignment.gateway;
            allocated.interface = Some(allocated_interface(&assignment));
        }
    }
}

/// The answer of allocations in `pool`: each address, with its interface's subnet, gateway
/// and interface when the pool is interface-backed.
pub(super) fn allocation_answer(
    scope: &Scope,
    pool: &PoolName,
    allocations: &[corral_core::Allocation],
) -> api::AllocateResponse {
    let mut answer: Vec<api::Allocated> = allocations.iter().map(|a| allocated(pool, a)).collect();
    // Only an interface-backed pool has anything to add: a plain pool's ADD (the hot path)
    // does not pay for the per-address lookups.
    if scope.interfaces.contains_key(pool) {
        decorate(scope, &mut answer);
    }
    api::AllocateResponse {
        allocations: answer,
    }
}

/// Whether a pool has ranges that are not its interfaces' addresses.
pub(super) fn has_plain_ranges(scope: &Scope, pool: &PoolName) -> bool {
    scope.config.pools.iter().any(|p| {
        p.name == pool.as_str()
            && p.ranges.iter().any(|r| {
                r.source != RangeSource::Interface && r.state != corral_store::RangeState::Removed
            })
    })
}

/// Refuses a plain range in an interface-backed pool.
pub(super) fn refuse_range_in_interface_pool(
    scope: &Scope,
    pool: &PoolName,
) -> Result<(), OpError> {
    if scope.interfaces.contains_key(pool) {
        return Err(OpError::new(
            ErrorCode::PoolKindMismatch,
            format!(
                "pool {pool} is interface-backed: its addresses come from its interfaces \
                     (corral interface address add), not from ranges"
            ),
        )
        .with_pool(pool));
    }
    Ok(())
}

/// The key an ipamd entry backfilled from CRI for the same container was imported under,
/// unless `key` is that key already.
pub(super) fn migrated_fallback(key: &AttachmentKey) -> Option<AttachmentKey> {
    crate::ipamd::migrated_key(key.container_id()).filter(|migrated| migrated != key)
}

/// Which table holds interface `id` (interface IDs are unique on the node).
fn pool_of(scope: &Scope, id: &InterfaceId) -> Result<PoolName, OpError> {
    scope
        .interfaces
        .iter()
        .find(|(_, table)| table.get(id).is_some())
        .map(|(pool, _)| pool.clone())
        .ok_or_else(|| {
            InterfaceError::UnknownInterface {
                interface: id.clone(),
            }
            .into()
        })
}

/// The pool of interface `id`, its table and the scope's engine (the table's changes go to it).
fn table_of<'a>(
    scope: &'a mut Scope,
    id: &InterfaceId,
) -> Result<(PoolName, &'a mut Interfaces, &'a mut Engine), OpError> {
    let pool = pool_of(scope, id)?;
    let Some(table) = scope.interfaces.get_mut(&pool) else {
        return Err(InterfaceError::UnknownInterface {
            interface: id.clone(),
        }
        .into());
    };
    Ok((pool, table, &mut scope.engine))
}

/// After a change to interface `id`: its pool's table stored, the node scope changes, and
/// the interface as the API answers it.
fn stored_info(
    scope: &mut Scope,
    pool: &PoolName,
    id: &InterfaceId,
    now: Timestamp,
    changes: &mut Changes,
) -> Result<api::InterfaceInfo, OpError> {
    store_table(scope, pool)?;
    changes.touched.insert(api::NODE_SCOPE.to_owned());
    info_of(scope, pool, id, now)
}

fn info_of(
    scope: &Scope,
    pool: &PoolName,
    id: &InterfaceId,
    now: Timestamp,
) -> Result<api::InterfaceInfo, OpError> {
    let table = scope.interfaces.get(pool).ok_or_else(|| {
        OpError::from(InterfaceError::UnknownInterface {
            interface: id.clone(),
        })
    })?;
    let stats = table.stats(&scope.engine, now)?;
    let stat = stats
        .interfaces
        .iter()
        .find(|s| s.id == *id)
        .ok_or_else(|| {
            OpError::from(InterfaceError::UnknownInterface {
                interface: id.clone(),
            })
        })?;
    let spec = table.get(id).ok_or_else(|| {
        OpError::from(InterfaceError::UnknownInterface {
            interface: id.clone(),
        })
    })?;
    let addresses = table.addresses(id).unwrap_or_default();
    let freeable = table.freeable(&scope.engine, id, now)?;
    Ok(api::InterfaceInfo {
        id: id.to_string(),
        pool: pool.to_string(),
        device_number: spec.device_number,
        primary: spec.primary,
        trunk: spec.trunk,
        excluded: spec.excluded,
        mac: spec.mac.to_string(),
        subnets: spec.subnets.iter().map(ToString::to_string).collect(),
        gateways: Family::ALL
            .iter()
            .filter_map(|family| spec.gateway(*family))
            .collect(),
        routes: spec.routes.iter().map(ToString::to_string).collect(),
        primary_addresses: spec.primary_addresses.clone(),
        created_at_ms: spec.created_at.as_unix_millis(),
        addresses: addresses.iter().map(ToString::to_string).collect(),
        n_addresses: stat.addresses as u64,
        n_prefixes: stat.prefixes as u64,
        total: stat.total,
        assigned: stat.assigned,
        cooling: stat.cooling,
        freeable: freeable.iter().map(ToString::to_string).collect(),
    })
}

impl<S: Store, C: Clock> NodeState<S, C> {
    fn node(&mut self) -> Result<&mut Scope, OpError> {
        self.scope_mut(api::NODE_SCOPE)
    }

    /// `GET /v1/interfaces[?pool=]`.
    pub(super) fn list_interfaces(
        &mut self,
        wanted: Option<PoolName>,
        now: Timestamp,
    ) -> Result<api::InterfacesResponse, OpError> {
        let scope = self.node()?;
        scope.engine.advance(now);
        if let Some(wanted) = &wanted
            && !scope.interfaces.contains_key(wanted)
        {
            return Err(OpError::new(
                ErrorCode::NotFound,
                format!("pool {wanted} has no interfaces"),
            )
            .with_pool(wanted));
        }
        let scope = &*scope;
        let mut pools = Vec::new();
        for (name, table) in &scope.interfaces {
            if wanted.as_ref().is_some_and(|w| w != name) {
                continue;
            }
            let stats = table.stats(&scope.engine, now)?;
            let interfaces = table
                .interfaces()
                .map(|(spec, _)| info_of(scope, name, &spec.id, now))
                .collect::<Result<Vec<_>, _>>()?;
            pools.push(api::InterfacePool {
                pool: name.to_string(),
                total: stats.total,
                assigned: stats.assigned,
                cooling: stats.cooling,
                interfaces,
            });
        }
        Ok(api::InterfacesResponse { pools })
    }

    /// `GET /v1/interfaces/{id}`.
    pub(super) fn show_interface(
        &mut self,
        id: &InterfaceId,
        now: Timestamp,
    ) -> Result<api::InterfaceInfo, OpError> {
        let scope = self.node()?;
        scope.engine.advance(now);
        let pool = pool_of(scope, id)?;
        info_of(scope, &pool, id, now)
    }

    /// `POST /v1/interfaces`: the interface, then its addresses, all or nothing.
    pub(super) fn add_interface(
        &mut self,
        request: AddInterface,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::InterfaceInfo, OpError> {
        let AddInterface {
            pool,
            id,
            device_number,
            mac,
            subnets,
            gateways,
            routes,
            primary,
            primary_addresses,
            trunk,
            excluded,
            addresses,
        } = request;
        let spec = InterfaceSpec {
            id: id.clone(),
            device_number,
            primary,
            trunk,
            excluded,
            subnets,
            mac,
            gateways,
            routes,
            primary_addresses,
            created_at: now,
        };
        let scope = self.node()?;
        if let Ok(other) = pool_of(scope, &id) {
            return Err(OpError::new(
                ErrorCode::DuplicateInterface,
                format!("interface {id} already exists (in pool {other})"),
            ));
        }
        if let Some((other, table)) = scope.interfaces.iter().find(|(name, table)| {
            **name != pool
                && table
                    .interfaces()
                    .any(|(s, _)| s.device_number == spec.device_number)
        }) {
            let holder = table
                .interfaces()
                .find(|(s, _)| s.device_number == spec.device_number)
                .map(|(s, _)| s.id.to_string())
                .unwrap_or_default();
            return Err(OpError::new(
                ErrorCode::DuplicateInterface,
                format!(
                    "device number {} is already interface {holder} (in pool {other})",
                    spec.device_number
                ),
            ));
        }
        if has_plain_ranges(scope, &pool) {
            return Err(OpError::new(
                ErrorCode::PoolKindMismatch,
                format!(
                    "pool {pool} has plain ranges: interfaces go into a pool of their own \
                         (an address from a plain range would have no interface)"
                ),
            )
            .with_pool(pool));
        }
        // The table is planned on a copy; the engine changes address by address, and a
        // refusal part way is undone by the caller, which rebuilds the scope from the store
        // (`run_batch` commits what came before this operation first).
        let mut table = scope
            .interfaces
            .get(&pool)
            .cloned()
            .unwrap_or_else(|| Interfaces::new(pool.clone()));
        table.add_interface(spec)?;
        if !scope.engine.pool_names().contains(&pool) {
            scope.engine.add_pool(&pool, Default::default())?;
        }
        for address in &addresses {
            table.add_address(&mut scope.engine, &id, *address, now)?;
        }
        scope.interfaces.insert(pool.clone(), table);
        stored_info(scope, &pool, &id, now, changes)
    }

    /// `DELETE /v1/interfaces/{id}`: with `force`, its allocations are released (the pods
    /// lose the address with the cloud's) and a primary or trunk interface goes too.
    pub(super) fn remove_interface(
        &mut self,
        id: InterfaceId,
        force: bool,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::InterfaceRemoved, OpError> {
        let scope = self.node()?;
        let (pool, table, engine) = table_of(scope, &id)?;
        let removal = table.remove_interface(engine, &id, force, now)?;
        if table.is_empty() {
            // The pool stays (empty); it may get interfaces again.
            scope.interfaces.remove(&pool);
        }
        record_released(
            api::NODE_SCOPE,
            &removal.released,
            HistoryKind::Surrendered,
            changes,
        );
        store_table(scope, &pool)?;
        changes.touched.insert(api::NODE_SCOPE.to_owned());
        Ok(api::InterfaceRemoved {
            id: id.to_string(),
            pool: pool.to_string(),
            addresses: removal.addresses.iter().map(ToString::to_string).collect(),
        })
    }

    /// `POST /v1/interfaces/{id}/addresses`.
    pub(super) fn add_interface_address(
        &mut self,
        id: InterfaceId,
        address: IpNet,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::InterfaceInfo, OpError> {
        let scope = self.node()?;
        let (pool, table, engine) = table_of(scope, &id)?;
        table.add_address(engine, &id, address, now)?;
        stored_info(scope, &pool, &id, now, changes)
    }

    /// `DELETE /v1/interfaces/{id}/addresses`.
    pub(super) fn remove_interface_address(
        &mut self,
        id: InterfaceId,
        address: IpNet,
        force: bool,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::InterfaceInfo, OpError> {
        let scope = self.node()?;
        let (pool, table, engine) = table_of(scope, &id)?;
        let removal = table.remove_address(engine, &id, address, force, now)?;
        record_released(
            api::NODE_SCOPE,
            &removal.released,
            HistoryKind::Surrendered,
            changes,
        );
        stored_info(scope, &pool, &id, now, changes)
    }

    /// A CNI ADD (or a keyed API allocation) of one family on an interface-backed pool:
    /// `Interfaces::assign`, idempotent per key.
    pub(super) fn assign_on_interface(
        &mut self,
        (scope_name, pool): (&str, &PoolName),
        (key, owner): (&AttachmentKey, &str),
        family: Family,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::Allocated, OpError> {
        let counters = self.interface_counters.clone();
        let scope = self.scope_mut(scope_name)?;
        let Some(table) = scope.interfaces.get(pool) else {
            return Err(OpError::new(
                ErrorCode::NotFound,
                format!("pool {pool} of scope {scope_name:?} has no interfaces"),
            )
            .with_pool(pool));
        };
        let result = table.assign(&mut scope.engine, key, owner, family, now);
        counters.count_assign(pool, &result);
        let assignment = result?;
        if !assignment.existing {
            changes.writes.push(Write::Put(
                scope_name.to_owned(),
                StoredAllocation {
                    pool: pool.clone(),
                    addr: assignment.addr,
                    owner: owner.to_owned(),
                    key: Some(key.clone()),
                    generation: assignment.generation,
                    lease: None,
                },
            ));
            changes.touched.insert(scope_name.to_owned());
        }
        Ok(allocated_of(pool, &assignment))
    }

    /// Releases a key's allocations in every interface-backed pool (`Interfaces::unassign`).
    pub(super) fn unassign_on_interfaces(
        &mut self,
        key: &AttachmentKey,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<Vec<Released>, OpError> {
        let counters = self.interface_counters.clone();
        let scope = self.node()?;
        let mut gone = Vec::new();
        for (pool, table) in &scope.interfaces {
            let result = table.unassign(&mut scope.engine, key, now);
            counters.count_unassign(pool, &result);
            gone.extend(result?.into_iter().map(|u| u.released));
        }
        // An entry ipamd backfilled from CRI was imported under its container's migrated
        // key: the runtime's DEL names the real network and interface (ipamd's DEL falls back
        // to the container ID the same way).
        if gone.is_empty()
            && let Some(migrated) = migrated_fallback(key)
        {
            for (pool, table) in &scope.interfaces {
                let result = table.unassign(&mut scope.engine, &migrated, now);
                counters.count_unassign(pool, &result);
                gone.extend(result?.into_iter().map(|u| u.released));
            }
        }
        record_released(api::NODE_SCOPE, &gone, HistoryKind::Released, changes);
        Ok(gone)
    }

    /// `POST /v1/import-ipamd`: every allocation of the checkpoint, recorded under
    /// its CNI key, all or nothing. What the batch did before is committed first, so a refusal
    /// (or a failed step) can put the scope back as the store holds it.
    pub(super) fn import_ipamd(
        &mut self,
        request: ImportIpamd,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::IpamdImportResponse, OpError> {
        let ImportIpamd { pool, allocations } = request;
        let scope = self.node()?;
        let Some(table) = scope.interfaces.get(&pool) else {
            return Err(OpError::new(
                ErrorCode::NotFound,
                format!(
                    "pool {pool} has no interfaces: add the node's interfaces and their \
                         addresses first (corral interface add)"
                ),
            )
            .with_pool(pool));
        };
        // A refusal part way is undone by the caller, which rebuilds the scope from the
        // store (`run_batch` commits what came before this operation first).
        let engine = &mut scope.engine;
        let mut imported = Vec::with_capacity(allocations.len());
        let mut puts = Vec::new();
        for allocation in &allocations {
            let held = engine.lookup_key(&allocation.key);
            if !held.is_empty() {
                // The same import again (its answer was lost): a key holding exactly these
                // addresses of this pool counts as imported; anything else is refused.
                let mut held_addresses: Vec<std::net::IpAddr> = held
                    .iter()
                    .filter(|info| info.pool == pool)
                    .map(|info| info.entry.addr)
                    .collect();
                let mut wanted = allocation.addresses.clone();
                held_addresses.sort();
                wanted.sort();
                let same = held.len() == held_addresses.len() && held_addresses == wanted;
                if !same {
                    return Err(OpError::new(
                        ErrorCode::InUse,
                        format!(
                            "ipamd checkpoint: key {} already holds another address here",
                            allocation.key
                        ),
                    ));
                }
                for info in held {
                    let assignment =
                        table
                            .assignment_of(engine, info.entry.addr)
                            .ok_or_else(|| {
                                OpError::from(InterfaceError::NotOnInterface {
                                    addr: info.entry.addr,
                                    pool: pool.clone(),
                                })
                            })?;
                    imported.push(api::ImportedAllocation {
                        key: super::wire::api_key(&allocation.key),
                        address: info.entry.addr,
                        owner: info.entry.owner.to_string(),
                        interface: assignment.interface.to_string(),
                        device_number: assignment.device_number,
                        generation: info.entry.generation,
                    });
                }
                continue;
            }
            for &address in &allocation.addresses {
                if table.interface_of(IpNet::from(address)).is_none()
                    && !table
                        .interfaces()
                        .any(|(_, nets)| nets.iter().any(|n| n.contains(&address)))
                {
                    return Err(OpError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "ipamd checkpoint: {address} of {} is on no interface of pool \
                                 {pool}; add the interface and its addresses first",
                            allocation.key
                        ),
                    )
                    .with_pool(pool));
                }
                let request = Request {
                    pool: &pool,
                    owner: &allocation.owner,
                    key: Some(&allocation.key),
                    lease: None,
                };
                let got = engine
                    .allocate(&request, Target::Specific(address), now)
                    .map_err(|e| {
                        let mut error = OpError::from(e.clone());
                        error.message =
                            format!("ipamd checkpoint: {address} of {}: {e}", allocation.key);
                        error
                    })?;
                let assignment = table.assignment_of(engine, got.addr).ok_or_else(|| {
                    OpError::from(InterfaceError::NotOnInterface {
                        addr: got.addr,
                        pool: pool.clone(),
                    })
                })?;
                puts.push(StoredAllocation {
                    pool: pool.clone(),
                    addr: got.addr,
                    owner: allocation.owner.clone(),
                    key: Some(allocation.key.clone()),
                    generation: got.generation,
                    lease: None,
                });
                imported.push(api::ImportedAllocation {
                    key: super::wire::api_key(&allocation.key),
                    address: got.addr,
                    owner: allocation.owner.clone(),
                    interface: assignment.interface.to_string(),
                    device_number: assignment.device_number,
                    generation: got.generation,
                });
            }
        }
        for row in puts {
            changes
                .writes
                .push(Write::Put(api::NODE_SCOPE.to_owned(), row));
        }
        changes.touched.insert(api::NODE_SCOPE.to_owned());
        Ok(api::IpamdImportResponse {
            pool: pool.to_string(),
            imported,
        })
    }

    /// Per pool: interfaces, and per interface its addresses by state, for `/metrics`.
    pub(super) fn interface_gauges(&mut self, now: Timestamp) -> Vec<InterfaceGauge> {
        let Ok(scope) = self.node() else {
            return Vec::new();
        };
        scope.engine.advance(now);
        let mut out = Vec::new();
        for (pool, table) in &scope.interfaces {
            let Ok(stats) = table.stats(&scope.engine, now) else {
                continue;
            };
            out.push(InterfaceGauge {
                pool: pool.to_string(),
                interface: None,
                interfaces: stats.interfaces.len() as f64,
                assigned: stats.assigned as f64,
                cooling: stats.cooling as f64,
                free: stats.total.saturating_sub(stats.assigned + stats.cooling) as f64,
            });
            for stat in &stats.interfaces {
                out.push(InterfaceGauge {
                    pool: pool.to_string(),
                    interface: Some((stat.id.to_string(), stat.device_number)),
                    interfaces: 1.0,
                    assigned: stat.assigned as f64,
                    cooling: stat.cooling as f64,
                    free: stat.total.saturating_sub(stat.assigned + stat.cooling) as f64,
                });
            }
        }
        out
    }
}
