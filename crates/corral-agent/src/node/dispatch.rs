//! One operation applied to the node state: the match from [`Op`] to the code that runs it.
//! The operations of a line or two are here; the rest call the feature files (`ops.rs`,
//! `node_pool.rs`, `blocks.rs`, `cloud.rs`, `interfaces.rs`, `gc.rs`).

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{RangeRemoval, Timestamp};
use corral_store::{HistoryKind, Store, Txn, export_checkpoint};

use super::op::{
    AddInterfaceAddress, AddRange, CloudInterfaces, ClusterRanges, Dump, Export, Gauges, Interface,
    InterfaceGauges, Interfaces, Op, Pools, ReclaimBlock, RemoveInterface, RemoveInterfaceAddress,
    RemoveRange, Reply, ReportBlocks, ReportCloud, Request, Status, SurrenderBlock,
    SurrenderCloudAddress, Tick,
};
use super::request::{
    AddExclusion, AddInterface, Allocate, CniAdd, CniCheck, CniDel, CniStatus, Gc, History,
    ImportIpamd, LeaseStart, LeaseStop, NetworkPools, PoolRange, Release, RemoveExclusion,
};
use super::scope::{Changes, ensure_spec, record_released, rewrite_row, scope_status, spec_mut};
use super::state::{Clock, NodeState};
use super::wire::{api_lease, held_by_key, released};
use super::{cloud, interfaces};
use crate::capacity;
use crate::error::OpError;
use crate::local_routes::LocalRoutesRequest;

/// An exclusion an operator makes may not carry a reason the reservation of local routes
/// marks its own with: the next reservation would remove it.
fn reject_local_reason(reason: &str) -> Result<(), OpError> {
    if crate::local_routes::is_local_reason(reason) {
        return Err(OpError::bad_request(format!(
            "exclusion reason: reasons starting with {} are kept for the exclusions that \
             reserving local routes makes; choose another",
            crate::local_routes::LOCAL_REASON_PREFIXES
                .map(|p| format!("{:?}", p.trim_end()))
                .join(", ")
        )));
    }
    Ok(())
}

impl<S: Store, C: Clock> NodeState<S, C> {
    pub(super) fn apply(
        &mut self,
        op: Op,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<Reply, OpError> {
        if matches!(op, Op::CniGc(_) | Op::Gc(_)) {
            return self.run_gc(op, now, changes).map(Gc::reply);
        }
        match op {
            Op::Allocate(request) => self.allocate(request, now, changes).map(Allocate::reply),
            Op::Release(request) => self.release(request, now, changes).map(Release::reply),
            Op::LeaseStart(request) => {
                let scope = self.scope_mut(&request.scope)?;
                let lease = scope
                    .engine
                    .start_lease(request.address, request.duration, now)?;
                rewrite_row(&request.scope, scope, request.address, changes);
                Ok(LeaseStart::reply(api_lease(&lease)))
            }
            Op::LeaseStop(request) => {
                let scope = self.scope_mut(&request.scope)?;
                scope.engine.stop_lease(request.address, request.id)?;
                rewrite_row(&request.scope, scope, request.address, changes);
                Ok(LeaseStop::reply(()))
            }
            Op::Dump(scope) => Ok(Dump::reply(self.dump(scope.as_deref())?)),
            Op::Status(scope) => Ok(Status::reply(self.status(scope.as_deref(), now)?)),
            Op::Pools(scope) => Ok(Pools::reply(self.pools(scope.as_deref())?)),
            Op::AddRange(PoolRange {
                scope: scope_name,
                pool,
                range: spec,
            }) => {
                let scope = self.node_scope_mut(&scope_name, "ranges")?;
                interfaces::refuse_range_in_interface_pool(scope, &pool)?;
                if let Some((other_pool, block)) =
                    capacity::surrendered_overlapping(&scope.config, &spec)
                {
                    return Err(OpError::new(
                        ErrorCode::Conflict,
                        format!(
                            "range {spec} overlaps block {block} of pool {other_pool}, which this \
                             node surrendered to the cluster in a release handshake"
                        ),
                    ));
                }
                let new_pool = !scope.engine.pool_names().contains(&pool);
                if new_pool {
                    scope.engine.add_pool(&pool, Default::default())?;
                }
                if let Err(error) = scope.engine.add_range(&pool, spec) {
                    // A refused range leaves no empty pool behind.
                    if new_pool {
                        let _ = scope.engine.remove_pool(&pool);
                    }
                    return Err(error.into());
                }
                capacity::note_added(ensure_spec(scope, &pool)?, &spec);
                changes.touched.insert(scope_name);
                Ok(AddRange::reply(()))
            }
            Op::RemoveRange(PoolRange {
                scope: scope_name,
                pool,
                range: spec,
            }) => {
                let scope = self.node_scope_mut(&scope_name, "ranges")?;
                let outcome = scope.engine.remove_range(&pool, &spec)?;
                // A range removed at once is reported by the engine as drained and leaves
                // the stored configuration after this operation (`forget_drained`).
                if let (RangeRemoval::Draining { .. }, Some(stored)) =
                    (outcome, spec_mut(scope, &pool))
                {
                    capacity::note_draining(stored, &spec);
                }
                changes.touched.insert(scope_name);
                Ok(RemoveRange::reply(api::RangeRemoved {
                    outcome: match outcome {
                        RangeRemoval::Removed => api::RangeRemoval::Removed,
                        RangeRemoval::Draining { .. } => api::RangeRemoval::Draining,
                    },
                }))
            }
            Op::AddExclusion(AddExclusion {
                scope: scope_name,
                pool,
                exclusion,
            }) => {
                reject_local_reason(exclusion.reason())?;
                cloud::reject_cloud_reason(exclusion.reason())?;
                let scope = self.node_scope_mut(&scope_name, "exclusions")?;
                // Replacing a cloud marker's reason would end the marker.
                cloud::refuse_marker_removal(scope, &pool, exclusion.network())?;
                scope.engine.exclude(&pool, exclusion.clone())?;
                let network = exclusion.network().to_string();
                let stored = ensure_spec(scope, &pool)?;
                // In place, as the engine replaces it: the order is what a restart rebuilds.
                let reason = exclusion.reason().to_owned();
                match stored.exclusions.iter_mut().find(|e| e.0 == network) {
                    Some(existing) => existing.1 = reason,
                    None => stored.exclusions.push((network, reason)),
                }
                changes.touched.insert(scope_name);
                Ok(AddExclusion::reply(()))
            }
            Op::RemoveExclusion(RemoveExclusion {
                scope: scope_name,
                pool,
                network,
            }) => {
                let scope = self.node_scope_mut(&scope_name, "exclusions")?;
                cloud::refuse_marker_removal(scope, &pool, network)?;
                scope.engine.remove_exclusion(&pool, network)?;
                let text = network.to_string();
                if let Some(stored) = spec_mut(scope, &pool) {
                    stored.exclusions.retain(|e| e.0 != text);
                }
                changes.touched.insert(scope_name);
                Ok(RemoveExclusion::reply(()))
            }
            Op::Export => {
                let mut txn = self.store.begin().map_err(OpError::store)?;
                let checkpoint = export_checkpoint(&mut txn).map_err(OpError::store)?;
                txn.finish().map_err(OpError::store)?;
                serde_json::to_value(&checkpoint)
                    .map(Export::reply)
                    .map_err(|e| OpError::new(ErrorCode::RetryLater, e.to_string()))
            }
            Op::Import(_) => unreachable!("imports are run by run_batch"),
            Op::CniAdd(request) => self.cni_add(request, now, changes).map(CniAdd::reply),
            Op::CniDel(CniDel { network, key }) => {
                let config = match network.pools {
                    NetworkPools::Node(pool) => {
                        return self
                            .node_pool_del(&pool, &key, now, changes)
                            .map(CniDel::reply);
                    }
                    NetworkPools::Own(config) => config,
                };
                let name = self.cni_scope(network.name, config, changes)?;
                let scope = self.scope_mut(&name)?;
                let released_now = scope.engine.release_key(&key, now);
                record_released(&name, &released_now, HistoryKind::Released, changes);
                Ok(CniDel::reply(api::ReleaseResponse {
                    released: released_now.iter().map(released).collect(),
                }))
            }
            Op::CniCheck(CniCheck {
                network,
                node_pool,
                key,
            }) => {
                if let Some(pool) = node_pool {
                    return self.node_pool_check(&pool, &key).map(CniCheck::reply);
                }
                let held = match self.scope(&network) {
                    Ok(scope) => scope
                        .engine
                        .lookup_key(&key)
                        .into_iter()
                        .map(|info| held_by_key(&info))
                        .collect(),
                    Err(_) => Vec::new(),
                };
                Ok(CniCheck::reply(api::AllocateResponse { allocations: held }))
            }
            Op::CniGc(_) | Op::Gc(_) => unreachable!("garbage collections are run by run_gc"),
            Op::CniStatus(CniStatus { network }) => {
                let config = match network.pools {
                    NetworkPools::Node(pool) => {
                        return self.node_pool_status(&pool, now).map(CniStatus::reply);
                    }
                    NetworkPools::Own(config) => config,
                };
                let name = self.cni_scope(network.name, config, changes)?;
                let scope = self.scope_mut(&name)?;
                scope.engine.advance(now);
                let mut status = scope_status(&name, scope);
                // Only the network's own pools (not the engine's implicit default).
                status
                    .pools
                    .retain(|p| scope.config.pools.iter().any(|n| n.name == p.pool));
                Ok(CniStatus::reply(status))
            }
            Op::SetClusterRanges(grants) => self
                .set_cluster_ranges(grants, changes)
                .map(ClusterRanges::reply),
            Op::SurrenderBlock { pool, range } => self
                .surrender_block(&pool, &range, changes)
                .map(SurrenderBlock::reply),
            Op::ReclaimBlock { pool, range } => self
                .reclaim_block(&pool, &range, changes)
                .map(ReclaimBlock::reply),
            Op::BlockReport => self.block_report().map(ReportBlocks::reply),
            Op::ReserveLocalRoutes(request) => {
                let scope = self.scope_mut(&request.scope)?;
                let response = crate::local_routes::reserve(
                    &request.scope,
                    &mut scope.engine,
                    &mut scope.config,
                    &request.host,
                )?;
                changes.touched.insert(request.scope);
                Ok(LocalRoutesRequest::reply(response))
            }
            Op::Tick => {
                let mut expired = 0;
                for (name, scope) in &mut self.scopes {
                    let gone = scope.engine.expire(now);
                    expired += gone.len();
                    record_released(name, &gone, HistoryKind::Expired, changes);
                }
                Ok(Tick::reply(expired))
            }
            Op::Gauges => Ok(Gauges::reply(self.gauges(now))),
            Op::History(request) => self.history(request).map(History::reply),
            Op::Interfaces(pool) => self.list_interfaces(pool, now).map(Interfaces::reply),
            Op::Interface(id) => self.show_interface(&id, now).map(Interface::reply),
            Op::AddInterface(request) => self
                .add_interface(request, now, changes)
                .map(AddInterface::reply),
            Op::RemoveInterface { id, force } => self
                .remove_interface(id, force, now, changes)
                .map(RemoveInterface::reply),
            Op::AddInterfaceAddress { id, address } => self
                .add_interface_address(id, address, now, changes)
                .map(AddInterfaceAddress::reply),
            Op::RemoveInterfaceAddress { id, address, force } => self
                .remove_interface_address(id, address, force, now, changes)
                .map(RemoveInterfaceAddress::reply),
            Op::ImportIpamd(request) => self
                .import_ipamd(request, now, changes)
                .map(ImportIpamd::reply),
            Op::InterfaceGauges => Ok(InterfaceGauges::reply(self.interface_gauges(now))),
            Op::SetCloudInterfaces(wanted) => self
                .set_cloud_interfaces(wanted, now, changes)
                .map(CloudInterfaces::reply),
            Op::SurrenderCloudAddress { pool, address } => self
                .surrender_cloud_address(&pool, address, now, changes)
                .map(SurrenderCloudAddress::reply),
            Op::CloudReport => self.cloud_report(now).map(ReportCloud::reply),
        }
    }
}
