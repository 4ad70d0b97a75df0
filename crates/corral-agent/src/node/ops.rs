//! The operations that need more than a line: allocation and release, a CNI ADD, importing a
//! checkpoint, and what the agent reports about its pools.

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{
    AllocError, Allocation, Family, PoolName, RangeRemoval, RangeSpec, Request, Target, Timestamp,
};
use corral_store::{
    HistoryKind, Need, RangeSource, RangeState, Store, StoreError, StoredAllocation, Txn,
    build_engine, import_checkpoint, save_engine,
};

use super::op::{ClusterRanges, ClusterRangesOutcome, Gauge};
use super::request::{Allocate, CniAdd, CniAddSets, Release, ReleaseOf, Wanted};
use super::scope::{
    Changes, Scope, Write, combine_node, ensure_spec, record_released, scope_status, spec_mut,
};
use super::state::{Clock, NodeState};
use super::wire::{allocated, api_key, api_lease, api_source, failed_set, released};
use crate::capacity;
use crate::error::OpError;

impl<S: Store, C: Clock> NodeState<S, C> {
    pub(super) fn allocate(
        &mut self,
        request: Allocate,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::AllocateResponse, OpError> {
        let Allocate {
            scope: scope_name,
            pool,
            owner,
            key,
            wanted,
            lease,
        } = request;
        let interface_backed = self.scope_mut(&scope_name)?.interfaces.contains_key(&pool);
        if interface_backed && let (Some(key), Wanted::Next(family), None) = (&key, wanted, lease) {
            let allocated = self.assign_on_interface(
                (&scope_name, &pool),
                (key, &owner),
                family,
                now,
                changes,
            )?;
            return Ok(api::AllocateResponse {
                allocations: vec![allocated],
            });
        }
        let scope = self.scope_mut(&scope_name)?;
        let core_request = Request {
            pool: &pool,
            owner: &owner,
            key: key.as_ref(),
            lease,
        };
        let allocations: Vec<Allocation> = match wanted {
            Wanted::Address(addr) => {
                vec![
                    scope
                        .engine
                        .allocate(&core_request, Target::Specific(addr), now)?,
                ]
            }
            Wanted::Dual => scope.engine.allocate_dual(&core_request, now)?.to_vec(),
            Wanted::Next(family) => {
                vec![
                    scope
                        .engine
                        .allocate(&core_request, Target::Next(family), now)?,
                ]
            }
        };
        for a in allocations.iter().filter(|a| !a.existing) {
            changes.writes.push(Write::Put(
                scope_name.clone(),
                StoredAllocation {
                    pool: pool.clone(),
                    addr: a.addr,
                    owner: owner.clone(),
                    key: key.clone(),
                    generation: a.generation,
                    lease: a.lease,
                },
            ));
            changes.touched.insert(scope_name.clone());
        }
        Ok(super::interfaces::allocation_answer(
            scope,
            &pool,
            &allocations,
        ))
    }

    pub(super) fn release(
        &mut self,
        request: Release,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::ReleaseResponse, OpError> {
        let Release {
            scope: scope_name,
            of,
        } = request;
        let mut unassigned = Vec::new();
        if let ReleaseOf::Key(key) = &of
            && scope_name == api::NODE_SCOPE
        {
            unassigned = self.unassign_on_interfaces(key, now, changes)?;
        }
        let scope = self.scope_mut(&scope_name)?;
        let gone = match of {
            ReleaseOf::Key(key) => {
                let mut gone = unassigned;
                let rest = scope.engine.release_key(&key, now);
                record_released(&scope_name, &rest, HistoryKind::Released, changes);
                gone.extend(rest);
                return Ok(api::ReleaseResponse {
                    released: gone.iter().map(released).collect(),
                });
            }
            ReleaseOf::Address {
                address,
                generation,
            } => match scope.engine.release(address, generation, now) {
                Ok(r) => vec![r],
                // Releasing what is not held is success with nothing released.
                Err(AllocError::NotAllocated { .. }) => Vec::new(),
                Err(error) => return Err(error.into()),
            },
            ReleaseOf::Owner(owner) => scope.engine.release_owner(&owner, now),
        };
        record_released(&scope_name, &gone, HistoryKind::Released, changes);
        Ok(api::ReleaseResponse {
            released: gone.iter().map(released).collect(),
        })
    }

    pub(super) fn cni_add(
        &mut self,
        request: CniAdd,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::AllocateResponse, OpError> {
        let CniAdd {
            network,
            key,
            owner,
            sets,
        } = request;
        let (config, sets) = match sets {
            CniAddSets::Node { pool, requested } => {
                return self.node_pool_add(pool, &requested, (&key, &owner), now, changes);
            }
            CniAddSets::Own { config, sets } => (config, sets),
        };
        let name = self.cni_scope(network, config, changes)?;
        let scope = self.scope_mut(&name)?;
        let wanted: Vec<(Request<'_>, Target)> = sets
            .iter()
            .map(|set| {
                (
                    Request {
                        pool: &set.pool,
                        owner: &owner,
                        key: Some(&key),
                        lease: None,
                    },
                    match set.requested {
                        Some(addr) => Target::Specific(addr),
                        None => Target::Next(set.family),
                    },
                )
            })
            .collect();
        let got = scope.engine.allocate_all(&wanted, now).map_err(|error| {
            let set = failed_set(&error, &sets);
            // A family the engine refuses is the network configuration's problem for a CNI
            // caller (standalone corral-ipam says 7), not an unavailable address.
            let base = match &error {
                AllocError::FamilyDisabled { .. } => OpError::bad_request(error.to_string()),
                _ => OpError::from(error),
            };
            base.with_set(set)
        })?;
        for (a, set) in got.iter().zip(&sets).filter(|(a, _)| !a.existing) {
            changes.writes.push(Write::Put(
                name.clone(),
                StoredAllocation {
                    pool: set.pool.clone(),
                    addr: a.addr,
                    owner: owner.clone(),
                    key: Some(key.clone()),
                    generation: a.generation,
                    lease: None,
                },
            ));
            changes.touched.insert(name.clone());
        }
        Ok(api::AllocateResponse {
            allocations: got
                .iter()
                .zip(&sets)
                .map(|(a, set)| allocated(&set.pool, a))
                .collect(),
        })
    }

    /// [`super::Op::SetClusterRanges`]: removals first (so a range moved between pools or
    /// resized fits when the old one held nothing), then the grants in their order, each
    /// checked against the configuration as it is by then (`capacity.rs`).
    pub(super) fn set_cluster_ranges(
        &mut self,
        grants: ClusterRanges,
        changes: &mut Changes,
    ) -> Result<ClusterRangesOutcome, OpError> {
        let declared = self.declared.clone();
        let granted: Vec<(String, RangeSpec)> = grants
            .ranges
            .iter()
            .map(|(pool, spec)| (pool.to_string(), *spec))
            .collect();
        self.block_families.clone_from(&grants.block_families);
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        let mut outcome = ClusterRangesOutcome::default();
        let mut changed = false;
        for (pool, spec) in capacity::cluster_removals(&scope.config, &granted) {
            let Ok(name) = PoolName::new(&pool) else {
                continue;
            };
            match scope.engine.remove_range(&name, &spec) {
                Ok(RangeRemoval::Removed) => outcome.removed.push((name, spec)),
                Ok(RangeRemoval::Draining { .. }) => {
                    if let Some(stored) = spec_mut(scope, &name) {
                        capacity::note_draining(stored, &spec);
                    }
                    outcome.draining.push((name, spec));
                }
                Err(error) => {
                    outcome.refused.push(format!(
                        "range {spec} of pool {pool} is no longer granted by the cluster but \
                         could not be removed: {error}"
                    ));
                    continue;
                }
            }
            changed = true;
        }
        // Surrendered blocks whose grant is gone: the handshake is over.
        if !capacity::forget_surrendered(&mut scope.config, &granted).is_empty() {
            changed = true;
        }
        if changed {
            // What left at once leaves the configuration now, so the grants below see it gone.
            capacity::forget_drained(
                &mut scope.config,
                &scope.engine.take_drained(),
                Some(&declared),
            );
        }
        for (pool, spec) in &grants.ranges {
            if scope.interfaces.contains_key(pool) {
                outcome.refused.push(format!(
                    "range {spec} granted to pool {pool} by the cluster: the pool is \
                     interface-backed (its addresses come from its interfaces); it is not applied"
                ));
                continue;
            }
            match capacity::check_grant(&scope.config, pool.as_str(), spec) {
                Ok(capacity::Grant::Held) => {}
                Ok(capacity::Grant::Add | capacity::Grant::CancelDrain) => {
                    let new_pool = !scope.engine.pool_names().contains(pool);
                    if new_pool && let Err(error) = scope.engine.add_pool(pool, Default::default())
                    {
                        outcome.refused.push(format!(
                            "range {spec} granted to pool {pool} by the cluster: {error}; it is \
                             not applied"
                        ));
                        continue;
                    }
                    if let Err(error) = scope.engine.add_range(pool, *spec) {
                        // A refused range leaves no empty pool behind.
                        if new_pool {
                            let _ = scope.engine.remove_pool(pool);
                        }
                        outcome.refused.push(format!(
                            "range {spec} granted to pool {pool} by the cluster: {error}; it is \
                             not applied"
                        ));
                        continue;
                    }
                    match ensure_spec(scope, pool) {
                        Ok(stored) => capacity::note_granted(stored, spec),
                        Err(error) => {
                            // Not reachable (the pool exists); the engine keeps nothing the
                            // configuration does not.
                            let _ = scope.engine.remove_range(pool, spec);
                            let _ = scope.engine.take_drained();
                            outcome.refused.push(format!(
                                "range {spec} granted to pool {pool} by the cluster: {}",
                                error.message
                            ));
                            continue;
                        }
                    }
                    outcome.added.push((pool.clone(), *spec));
                    changed = true;
                }
                Err(reason) => outcome.refused.push(reason),
            }
        }
        if changed {
            // A cluster range that left may make room for a file range kept out by it.
            scope.adopt_file_ranges(&declared);
            changes.touched.insert(api::NODE_SCOPE.to_owned());
        }
        self.cluster_refused.clone_from(&outcome.refused);
        Ok(outcome)
    }

    pub(super) fn import(&mut self, checkpoint: corral_store::Checkpoint) -> Result<(), OpError> {
        // Interfaces are the node's: a pool backed by them belongs to the `node` scope only.
        for scope in checkpoint
            .scopes
            .iter()
            .filter(|s| s.scope != api::NODE_SCOPE)
        {
            if let Some(pool) = scope.config.pools.iter().find(|p| p.is_interface_pool()) {
                return Err(OpError::bad_request(format!(
                    "checkpoint: pool {} of scope {:?} is backed by interfaces, which only \
                         the {:?} scope may hold; nothing was imported",
                    pool.name,
                    scope.scope,
                    api::NODE_SCOPE
                ))
                .with_pool(&pool.name));
            }
        }
        let names: Vec<String> = checkpoint.scopes.iter().map(|s| s.scope.clone()).collect();
        // The agent's node scope exists from the start; it may be imported into while empty.
        for name in &names {
            if let Some(scope) = self.scopes.get(name)
                && scope.engine.n_allocations() > 0
            {
                return Err(OpError::new(
                    ErrorCode::Conflict,
                    format!(
                        "scope {name:?} already holds allocations; import only into empty scopes"
                    ),
                ));
            }
        }
        // Everything is checked inside one transaction, before it commits: the document, and
        // that every imported scope builds into an engine under the configuration it will
        // have (for `node`, the imported pools beside the ones it has). A refusal changes
        // nothing.
        let engine_config = self.engine_config();
        let existing_node = self.scopes.get(api::NODE_SCOPE).map(|s| s.config.clone());
        let mut txn = self.store.begin().map_err(OpError::store)?;
        import_checkpoint(&mut txn, &checkpoint).map_err(|error| match error {
            // The store itself failing is worth a retry; anything else is the document.
            StoreError::Backend { .. }
            | StoreError::Directory { .. }
            | StoreError::Lock { .. }
            | StoreError::Held { .. } => OpError::store(error),
            other => OpError::bad_request(format!("checkpoint: {other}")),
        })?;
        let mut built = Vec::with_capacity(names.len());
        for name in names {
            let (state, _) = txn.scope_state(&name).map_err(OpError::store)?;
            let imported = state.map(|s| s.config).unwrap_or_default();
            let mut config = match (&existing_node, name == api::NODE_SCOPE) {
                (Some(existing), true) => combine_node(existing, &imported, &self.declared),
                _ => imported,
            };
            capacity::check_disjoint(&config).map_err(|problem| {
                OpError::new(
                    ErrorCode::Conflict,
                    format!("checkpoint scope {name:?} does not fit: {problem}"),
                )
            })?;
            let (mut engine, _) = build_engine(&mut txn, &name, &config, engine_config, Need::Full)
                .map_err(|error| match error {
                    StoreError::Engine(e) => OpError::new(
                        ErrorCode::Conflict,
                        format!("checkpoint scope {name:?} does not fit: {e}"),
                    ),
                    other => OpError::bad_request(format!("checkpoint scope {name:?}: {other}")),
                })?;
            let declared = (name == api::NODE_SCOPE).then_some(&self.declared);
            capacity::forget_drained(&mut config, &engine.take_drained(), declared);
            save_engine(&mut txn, &name, &config, &engine).map_err(OpError::store)?;
            built.push((name, Scope::new(config, engine).map_err(OpError::store)?));
        }
        txn.commit().map_err(OpError::store)?;
        for (name, scope) in built {
            self.broken.remove(&name);
            self.scopes.insert(name, scope);
        }
        self.count_broken();
        Ok(())
    }

    pub(super) fn dump(&self, scope: Option<&str>) -> Result<api::DumpResponse, OpError> {
        Ok(api::DumpResponse {
            scopes: self
                .selected(scope)?
                .into_iter()
                .map(|(name, scope)| api::ScopeDump {
                    scope: name.clone(),
                    pools: scope
                        .engine
                        .dump()
                        .into_iter()
                        .map(|pool| api::PoolDump {
                            pool: pool.pool.to_string(),
                            allocations: pool
                                .allocations
                                .iter()
                                .map(|e| api::DumpEntry {
                                    address: e.addr,
                                    owner: e.owner.clone(),
                                    key: e.key.as_ref().map(api_key),
                                    generation: e.generation,
                                    lease: e.lease.as_ref().map(api_lease),
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
        })
    }

    pub(super) fn status(
        &mut self,
        scope: Option<&str>,
        now: Timestamp,
    ) -> Result<api::StatusResponse, OpError> {
        for s in self.scopes.values_mut() {
            s.engine.advance(now);
        }
        let selected = self.selected(scope)?;
        Ok(api::StatusResponse {
            ready: true,
            summary: selected
                .iter()
                .map(|(name, s)| format!("{name}: {}", s.engine.status_line()))
                .collect(),
            scopes: selected
                .iter()
                .map(|(name, s)| scope_status(name, s))
                .collect(),
            warnings: self.warnings(),
            cluster: None,
            adds: vec![],
        })
    }

    pub(super) fn pools(&self, scope: Option<&str>) -> Result<api::PoolsResponse, OpError> {
        let mut pools = Vec::new();
        for (name, s) in self.selected(scope)? {
            for pool in s.visible_pools() {
                let config = s.engine.pool_config(&pool)?;
                let spec = s.config.pools.iter().find(|p| p.name == pool.as_str());
                let source_of = |range: &RangeSpec| {
                    let source = spec
                        .and_then(|p| p.entry_at(range).map(|i| p.ranges[i].source))
                        .unwrap_or(RangeSource::Api);
                    api_source(source)
                };
                pools.push(api::PoolInfo {
                    scope: name.clone(),
                    name: pool.to_string(),
                    cooldown_ms: u64::try_from(config.cooldown.as_millis()).unwrap_or(u64::MAX),
                    lowest_free: config.reuse == corral_core::ReusePolicy::LowestFree,
                    ranges: s
                        .engine
                        .ranges(&pool)?
                        .into_iter()
                        .map(|r| api::RangeInfo {
                            range: r.spec.to_string(),
                            draining: r.draining,
                            source: source_of(&r.spec),
                            allocated: r.n_allocated,
                        })
                        .collect(),
                    removed: spec
                        .map(|p| {
                            p.ranges
                                .iter()
                                .filter(|r| r.state == RangeState::Removed)
                                .map(|r| r.range.clone())
                                .collect()
                        })
                        .unwrap_or_default(),
                    exclusions: s
                        .engine
                        .exclusions(&pool)?
                        .into_iter()
                        .map(|e| api::ExclusionInfo {
                            network: e.network().to_string(),
                            reason: e.reason().to_owned(),
                        })
                        .collect(),
                });
            }
        }
        Ok(api::PoolsResponse { pools })
    }

    pub(super) fn gauges(&mut self, now: Timestamp) -> Vec<Gauge> {
        let mut out = Vec::new();
        for (name, s) in &mut self.scopes {
            s.engine.advance(now);
            for pool in s.visible_pools() {
                for family in [Family::V4, Family::V6] {
                    if let Ok(stats) = s.engine.stats(&pool, family) {
                        out.push(Gauge {
                            scope: name.clone(),
                            pool: pool.to_string(),
                            family: if family == Family::V4 { "ipv4" } else { "ipv6" },
                            used: stats.used as f64,
                            free: stats.free as f64,
                            excluded: stats.excluded as f64,
                            cooling: stats.cooling as f64,
                        });
                    }
                }
            }
        }
        out
    }
}
