//! The agent's state: one engine per scope, kept in memory, and the store they are durable in.
//!
//! [`Host`] is plain synchronous code, driven by one thread at a time (see `committer.rs`). It applies
//! a *batch* of operations to the engines, collecting the rows they change, then makes the
//! whole batch durable in one transaction (one fsync) before any of its answers is sent: the
//! group commit. A batch whose commit fails is answered with errors, and the scopes it
//! touched are rebuilt from the store, so memory never runs ahead of the disk.
//!
//! It is generic over the store (`corral_store::Store`: SQLite in the agent, `MemoryStore` in
//! tests that need faults) and over the clock ([`Clock`]: the system's, or one a test moves).
//! The parts:
//!
//! - `mod.rs` — [`Host`], the operations ([`Op`]) and answers ([`Reply`]), restore, dispatch;
//! - `batch.rs` — the group commit: a batch applied, then committed in one transaction;
//! - `scopes.rs` — scopes: lookup, a CNI network's scope under its configuration, rebuilds;
//! - `ops.rs` — the operations that need more than a line (allocate, release, CNI ADD, import,
//!   introspection);
//! - `node_pool.rs` — the CNI verbs of a network on a pool of the node's own scope;
//! - `wire.rs` — conversions between the API's types and the engine's, and errors.

mod batch;
mod blocks;
mod cloud;
mod gc;
mod interfaces;
mod node_pool;
mod ops;
mod scopes;
mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{
    Echo, EngineConfig, Exclusion, Family, PoolName, RangeRemoval, RangeSpec, Timestamp,
};
use corral_store::{
    Need, ScopeConfig, SqliteStore, Store, StoreError, Txn, build_engine, export_checkpoint,
    save_engine,
};

use crate::capacity;
use batch::{Write, record_released, rewrite_row};
pub use blocks::{BlockReport, HeldRange, Surrender};
pub use cloud::{
    CloudAddress, CloudInterface, CloudInterfaces, CloudOutcome, CloudReport, FROZEN_REASON,
    SURRENDERED_REASON,
};
pub use interfaces::{InterfaceCounters, InterfaceGauge};
use scopes::{Broken, Scope, ensure_spec, spec_mut};
pub use wire::OpError;
use wire::{api_lease, family_name, key_of, pool_name, released, scope_status};

/// Where the host reads the time: every batch reads it once, and the engines are handed it.
pub trait Clock {
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        now()
    }
}

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

/// What the committer drives: a host of any store and clock.
pub trait RunBatch: Send + std::fmt::Debug {
    /// See [`Host::run_batch`].
    fn run_batch(&mut self, ops: Vec<Op>) -> Vec<Result<Reply, OpError>>;
}

impl<S: Store + Send, C: Clock + Send> RunBatch for Host<S, C> {
    fn run_batch(&mut self, ops: Vec<Op>) -> Vec<Result<Reply, OpError>> {
        Host::run_batch(self, ops)
    }
}

/// One operation of the API, as the committer receives it.
#[derive(Debug)]
pub enum Op {
    Allocate(api::AllocateRequest),
    Release(api::ReleaseRequest),
    LeaseStart(api::LeaseStartRequest),
    LeaseStop(api::LeaseStopRequest),
    Dump(Option<String>),
    Status(Option<String>),
    Pools(Option<String>),
    AddRange(api::RangeRequest),
    RemoveRange(api::RangeRequest),
    AddExclusion(api::ExclusionRequest),
    RemoveExclusion(api::ExclusionRequest),
    Export,
    Import(serde_json::Value),
    CniAdd(api::CniAddRequest),
    CniDel(api::CniKeyRequest),
    CniCheck(api::CniKeyRequest),
    /// CNI GC: the leak collector over a network's attachments (`gc.rs`); commits on its own.
    CniGc(api::CniGcRequest),
    CniStatus(api::CniStatusRequest),
    /// The leak collector over a scope's attachments (`gc.rs`); commits on its own.
    Gc(api::GcRequest),
    /// Reconciles the `node` scope's cluster ranges with the complete set the cluster grants
    /// the node now (see [`ClusterRanges`]); answered with [`Reply::ClusterRanges`].
    SetClusterRanges(ClusterRanges),
    /// The release handshake of a block: surrenders the cluster range if it holds no
    /// allocation, in one commit (`blocks.rs`); answered with [`Reply::Surrender`].
    SurrenderBlock {
        pool: PoolName,
        range: RangeSpec,
    },
    /// Takes a surrendered block back while its grant lasts (its handshake was withdrawn).
    ReclaimBlock {
        pool: PoolName,
        range: RangeSpec,
    },
    /// The node scope's counts and cluster ranges, for the demand of block pools; answered
    /// with [`Reply::Blocks`].
    BlockReport,
    /// Excludes what the node's routes and addresses cover (`local_routes.rs`).
    ReserveLocalRoutes(crate::local_routes::LocalRoutesRequest),
    /// Expires leases and ends cooldowns that have run out.
    Tick,
    /// Counts for the metrics endpoint.
    Gauges,
    /// The node's interface-backed pools, or one (`interfaces.rs`).
    Interfaces(Option<String>),
    /// One interface with its use.
    Interface(String),
    /// Adds an interface (and its addresses, all or nothing); commits what came before first.
    AddInterface(api::InterfaceRequest),
    RemoveInterface {
        id: String,
        force: bool,
    },
    AddInterfaceAddress {
        id: String,
        address: String,
    },
    RemoveInterfaceAddress {
        id: String,
        address: String,
        force: bool,
    },
    /// AWS VPC CNI's ipamd checkpoint into an interface-backed pool, all or nothing; commits
    /// what came before first.
    ImportIpamd(api::IpamdImportRequest),
    /// Interface counts for the metrics endpoint.
    InterfaceGauges,
    /// Makes the cloud pools' interfaces match the cluster's `interfaces/` records (`cloud.rs`);
    /// answered with [`Reply::CloudInterfaces`].
    SetCloudInterfaces(CloudInterfaces),
    /// The release handshake of a cloud address or prefix: surrendered if nothing is allocated
    /// in it and nothing cooling, in one commit; answered with [`Reply::Surrender`].
    SurrenderCloudAddress {
        pool: PoolName,
        address: corral_core::IpNet,
    },
    /// The interface-backed pools' counts and addresses, for the demand of cloud pools;
    /// answered with [`Reply::Cloud`].
    CloudReport,
}

impl Op {
    /// Whether the operation is one of the short, frequent ones a caller may commit on its
    /// own runtime thread when the committer is idle (see `committer.rs`); the rest (dumps,
    /// imports, pool changes) always run on the committer's thread.
    pub(crate) fn is_quick(&self) -> bool {
        matches!(
            self,
            Op::Allocate(_)
                | Op::Release(_)
                | Op::LeaseStart(_)
                | Op::LeaseStop(_)
                | Op::CniAdd(_)
                | Op::CniDel(_)
                | Op::CniCheck(_)
        )
    }

    /// Whether the operation may change state (and so belongs to a commit).
    fn writes(&self) -> bool {
        !matches!(
            self,
            Op::Dump(_)
                | Op::Status(_)
                | Op::Pools(_)
                | Op::Export
                | Op::Gauges
                | Op::CniCheck(_)
                | Op::BlockReport
                | Op::Interfaces(_)
                | Op::Interface(_)
                | Op::InterfaceGauges
                | Op::CloudReport
        )
    }

    /// Operations that change several things, undone on a refusal part way by rebuilding the
    /// node scope from the store; the batch commits what came before them first.
    fn undone_by_reload(&self) -> bool {
        matches!(
            self,
            Op::AddInterface(_) | Op::ImportIpamd(_) | Op::SetCloudInterfaces(_)
        )
    }
}

/// What an operation answers.
#[derive(Debug)]
pub enum Reply {
    Allocated(api::AllocateResponse),
    Released(api::ReleaseResponse),
    Lease(api::Lease),
    Done,
    Dump(api::DumpResponse),
    Status(api::StatusResponse),
    Pools(api::PoolsResponse),
    RangeRemoved(api::RangeRemoved),
    Checkpoint(serde_json::Value),
    ScopeStatus(api::ScopeStatus),
    Gauges(Vec<Gauge>),
    /// A tick: how many leases expired.
    Expired(usize),
    LocalRoutes(api::ReserveLocalRoutesResponse),
    ClusterRanges(ClusterRangesOutcome),
    Surrender(Surrender),
    Blocks(BlockReport),
    Gc(api::GcResponse),
    Interfaces(api::InterfacesResponse),
    Interface(api::InterfaceInfo),
    InterfaceRemoved(api::InterfaceRemoved),
    IpamdImported(api::IpamdImportResponse),
    InterfaceGauges(Vec<InterfaceGauge>),
    CloudInterfaces(CloudOutcome),
    Cloud(CloudReport),
}

/// Every range the cluster grants this node now, of all pools: the argument of
/// [`Op::SetClusterRanges`], which makes the `node` scope's ranges of source `cluster` exactly
/// these, in one commit:
///
/// - a granted range not present is added to its pool (created with default settings if
///   missing); a granted range that is draining is active again;
/// - a cluster range no longer granted is removed: at once if it holds nothing, else it drains
///   (nothing new from it, its allocations stay, it leaves with the last release);
/// - ranges of other sources (file, api) are never touched: a granted range over one of them
///   is not applied, and is reported in [`ClusterRangesOutcome::refused`] and as a warning in
///   `status` until the next set of grants;
/// - the same set again changes nothing and writes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRanges {
    pub ranges: Vec<(PoolName, RangeSpec)>,
    /// The families each block pool of the cluster configuration has: a CNI ADD on such a
    /// pool takes an address of every one of them, or waits (retry later) until each has a
    /// free address, so a dual-stack pod never starts with one family because the other
    /// family's block was granted a moment later.
    pub block_families: BTreeMap<PoolName, Vec<Family>>,
}

/// What [`Op::SetClusterRanges`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRangesOutcome {
    /// Granted ranges added (or whose drain was cancelled).
    pub added: Vec<(PoolName, RangeSpec)>,
    /// Ranges no longer granted that held nothing: gone.
    pub removed: Vec<(PoolName, RangeSpec)>,
    /// Ranges no longer granted that hold allocations: draining until the last is released.
    pub draining: Vec<(PoolName, RangeSpec)>,
    /// Granted ranges not applied, one sentence each (also in `status` warnings).
    pub refused: Vec<String>,
}

/// One line of per-pool counts for the metrics endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Gauge {
    pub scope: String,
    pub pool: String,
    pub family: &'static str,
    pub used: f64,
    pub free: f64,
    pub excluded: f64,
    pub cooling: f64,
}

/// The agent's scopes and its store.
pub struct Host<S: Store = SqliteStore, C: Clock = SystemClock> {
    store: S,
    clock: C,
    scopes: BTreeMap<String, Scope>,
    lease_seed: u64,
    /// Set when a commit failed during the current batch: the rest of the batch is refused
    /// unapplied, and answers not covered by an earlier successful commit become errors.
    batch_failed: Option<OpError>,
    /// The operations of the current batch before this index are committed.
    committed_upto: usize,
    /// The index of the operation being applied.
    current: usize,
    /// Scopes whose engine could not be rebuilt after a failed commit, with their
    /// configuration: tried again on use, answered 503 meanwhile.
    broken: BTreeMap<String, Broken>,
    /// The node scope's pools as the configuration file declares them.
    declared: ScopeConfig,
    /// How many scopes are broken, for `/readyz`, which cannot wait for a batch.
    n_broken: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The cluster's grants the last [`Op::SetClusterRanges`] could not apply, for `status`.
    cluster_refused: Vec<String>,
    /// The last [`ClusterRanges::block_families`].
    block_families: BTreeMap<PoolName, Vec<Family>>,
    /// Assign and unassign outcomes on interface-backed pools, for `/metrics`.
    interface_counters: InterfaceCounters,
}

impl<S: Store, C: Clock> std::fmt::Debug for Host<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("scopes", &self.scopes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The current time as the engine counts it.
pub fn now() -> Timestamp {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Timestamp::from_unix_millis(millis)
}

impl<S: Store> Host<S, SystemClock> {
    /// [`Host::restore_with`] on the system's clock.
    pub fn restore(store: S, declared: &ScopeConfig) -> Result<Self, StoreError> {
        Host::restore_with(store, declared, SystemClock)
    }
}

impl<S: Store, C: Clock> Host<S, C> {
    /// Restores every scope of the store, with `node` (the agent's own pools) configured from
    /// what is stored and what the configuration file `declared` lists, combined as
    /// `capacity.rs` says (what could not be applied is in [`Host::warnings`]). Nothing is
    /// released or expired here: the engines finish their restore phase with every stored
    /// allocation, lease and cooldown, and [`Op::Tick`] expires what is overdue afterwards.
    pub fn restore_with(
        mut store: S,
        declared: &ScopeConfig,
        clock: C,
    ) -> Result<Self, StoreError> {
        let lease_seed =
            clock.now().as_unix_millis() ^ u64::from(std::process::id()).rotate_left(32);
        let mut scopes = BTreeMap::new();
        let mut txn = store.begin()?;
        let mut names = txn.scopes()?;
        if !names.iter().any(|s| s == api::NODE_SCOPE) {
            names.push(api::NODE_SCOPE.to_owned());
        }
        for name in names {
            let (state, _) = txn.scope_state(&name)?;
            let stored = state.map(|s| s.config).unwrap_or_default();
            let (mut config, node_declared) = if name == api::NODE_SCOPE {
                (
                    capacity::merge_declared(&stored, declared).0,
                    Some(declared),
                )
            } else {
                (stored, None)
            };
            let engine_config = EngineConfig {
                lease_id_seed: lease_seed ^ scopes.len() as u64,
                ..EngineConfig::default()
            };
            let (mut engine, _) =
                build_engine(&mut txn, &name, &config, engine_config, Need::Full)?;
            capacity::forget_drained(&mut config, &engine.take_drained(), node_declared);
            let mut scope = Scope::new(config, engine)?;
            if let Some(declared) = node_declared {
                // Ranges that left at start (a range the file moved to another pool, empty
                // in the old one) no longer keep the file's ranges out.
                scope.adopt_file_ranges(declared);
            }
            save_engine(&mut txn, &name, &scope.config, &scope.engine)?;
            scopes.insert(name, scope);
        }
        txn.commit()?;
        Ok(Host {
            store,
            clock,
            scopes,
            lease_seed,
            batch_failed: None,
            committed_upto: 0,
            current: 0,
            broken: BTreeMap::new(),
            declared: declared.clone(),
            n_broken: Default::default(),
            cluster_refused: Vec::new(),
            block_families: BTreeMap::new(),
            interface_counters: Default::default(),
        })
    }

    /// Counts assign and unassign outcomes in `counters` from now on.
    pub fn with_interface_counters(mut self, counters: InterfaceCounters) -> Self {
        self.interface_counters = counters;
        self
    }

    /// Counts its broken scopes (see `scopes.rs`) in `gauge` from now on: `/readyz` says
    /// "not ready" while any scope cannot be read back from the store.
    pub fn with_broken_gauge(
        mut self,
        gauge: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        gauge.store(self.broken.len(), std::sync::atomic::Ordering::Release);
        self.n_broken = gauge;
        self
    }

    /// What the configuration file asks for that is not applied (see `capacity.rs`), from the
    /// node scope's configuration as it is now.
    /// The cluster's grants that could not be applied are listed after them.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = self
            .scopes
            .get(api::NODE_SCOPE)
            .map(|node| capacity::merge_declared(&node.config, &self.declared).1)
            .unwrap_or_default();
        warnings.extend(self.cluster_refused.iter().cloned());
        warnings
    }

    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            lease_id_seed: self.lease_seed ^ self.clock.now().as_unix_millis().rotate_left(17),
            ..EngineConfig::default()
        }
    }

    fn apply(
        &mut self,
        op: Op,
        now: Timestamp,
        writes: &mut Vec<Write>,
        touched: &mut BTreeSet<String>,
    ) -> Result<Reply, OpError> {
        if matches!(op, Op::CniGc(_) | Op::Gc(_)) {
            return self.run_gc(op, now, writes, touched);
        }
        match op {
            Op::Allocate(request) => self.allocate(request, now, writes, touched),
            Op::Release(request) => self.release(request, now, writes, touched),
            Op::LeaseStart(request) => {
                let scope = self.scope_mut(&request.scope)?;
                let lease = scope.engine.start_lease(
                    request.address,
                    Duration::from_millis(request.duration_ms),
                    now,
                )?;
                rewrite_row(&request.scope, scope, request.address, writes, touched);
                Ok(Reply::Lease(api_lease(&lease)))
            }
            Op::LeaseStop(request) => {
                let id = corral_core::Uuid::parse_str(&request.id).map_err(|e| {
                    OpError::bad_request(format!("lease id {}: {e}", Echo(&request.id)))
                })?;
                let scope = self.scope_mut(&request.scope)?;
                scope.engine.stop_lease(request.address, id)?;
                rewrite_row(&request.scope, scope, request.address, writes, touched);
                Ok(Reply::Done)
            }
            Op::Dump(scope) => Ok(Reply::Dump(self.dump(scope.as_deref())?)),
            Op::Status(scope) => Ok(Reply::Status(self.status(scope.as_deref(), now)?)),
            Op::Pools(scope) => Ok(Reply::Pools(self.pools(scope.as_deref())?)),
            Op::AddRange(request) => {
                let pool = pool_name(&request.pool)?;
                let spec: RangeSpec = request.range.parse().map_err(|e| {
                    OpError::bad_request(format!("range {}: {e}", Echo(&request.range)))
                })?;
                let scope = self.node_scope_mut(&request.scope, "ranges")?;
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
                touched.insert(request.scope);
                Ok(Reply::Done)
            }
            Op::RemoveRange(request) => {
                let pool = pool_name(&request.pool)?;
                let spec: RangeSpec = request.range.parse().map_err(|e| {
                    OpError::bad_request(format!("range {}: {e}", Echo(&request.range)))
                })?;
                let scope = self.node_scope_mut(&request.scope, "ranges")?;
                let outcome = scope.engine.remove_range(&pool, &spec)?;
                // A range removed at once is reported by the engine as drained and leaves
                // the stored configuration after this operation (`forget_drained`).
                if let (RangeRemoval::Draining { .. }, Some(stored)) =
                    (outcome, spec_mut(scope, &pool))
                {
                    capacity::note_draining(stored, &spec);
                }
                touched.insert(request.scope);
                Ok(Reply::RangeRemoved(api::RangeRemoved {
                    outcome: match outcome {
                        RangeRemoval::Removed => api::RangeRemoval::Removed,
                        RangeRemoval::Draining { .. } => api::RangeRemoval::Draining,
                    },
                }))
            }
            Op::AddExclusion(request) => {
                let pool = pool_name(&request.pool)?;
                let exclusion = Exclusion::parse(&request.network, &request.reason)
                    .map_err(|e| OpError::bad_request(format!("exclusion: {e}")))?;
                reject_local_reason(&request.reason)?;
                cloud::reject_cloud_reason(&request.reason)?;
                let scope = self.node_scope_mut(&request.scope, "exclusions")?;
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
                touched.insert(request.scope);
                Ok(Reply::Done)
            }
            Op::RemoveExclusion(request) => {
                let pool = pool_name(&request.pool)?;
                let network = corral_core::parse_net(&request.network)
                    .map_err(|e| OpError::bad_request(format!("network: {e}")))?;
                let scope = self.node_scope_mut(&request.scope, "exclusions")?;
                cloud::refuse_marker_removal(scope, &pool, network)?;
                scope.engine.remove_exclusion(&pool, network)?;
                let text = network.to_string();
                if let Some(stored) = spec_mut(scope, &pool) {
                    stored.exclusions.retain(|e| e.0 != text);
                }
                touched.insert(request.scope);
                Ok(Reply::Done)
            }
            Op::Export => {
                let mut txn = self.store.begin().map_err(OpError::store)?;
                let checkpoint = export_checkpoint(&mut txn).map_err(OpError::store)?;
                txn.finish().map_err(OpError::store)?;
                serde_json::to_value(&checkpoint)
                    .map(Reply::Checkpoint)
                    .map_err(|e| OpError::new(ErrorCode::RetryLater, e.to_string()))
            }
            Op::Import(_) => unreachable!("imports are run by run_batch"),
            Op::CniAdd(request) => self.cni_add(request, now, writes, touched),
            Op::CniDel(request) => {
                if let Some(pool) = node_pool::node_pool_of(&request.network)? {
                    return self.node_pool_del(pool, &request, now, writes, touched);
                }
                let key = key_of(&request.key)?;
                let name = self.cni_scope(&request.network, writes, touched)?;
                let scope = self.scope_mut(&name)?;
                let released_now = scope.engine.release_key(&key, now);
                record_released(&name, &released_now, writes, touched);
                Ok(Reply::Released(api::ReleaseResponse {
                    released: released_now.iter().map(released).collect(),
                }))
            }
            Op::CniCheck(request) => {
                if let Some(pool) = node_pool::node_pool_of(&request.network)? {
                    return self.node_pool_check(&pool, &request);
                }
                let key = key_of(&request.key)?;
                let scope = self.scope(&request.network.name);
                let held = match scope {
                    Ok(scope) => scope
                        .engine
                        .lookup_key(&key)
                        .into_iter()
                        .map(|info| api::Allocated {
                            address: info.entry.addr,
                            family: family_name(Family::of(info.entry.addr)),
                            pool: info.pool.to_string(),
                            generation: info.entry.generation,
                            existing: true,
                            subnet: None,
                            gateway: None,
                            lease: info.entry.lease.as_ref().map(api_lease),
                            interface: None,
                        })
                        .collect(),
                    Err(_) => Vec::new(),
                };
                Ok(Reply::Allocated(api::AllocateResponse {
                    allocations: held,
                }))
            }
            Op::CniGc(_) | Op::Gc(_) => unreachable!("garbage collections are run by run_gc"),
            Op::CniStatus(request) => {
                if let Some(pool) = node_pool::node_pool_of(&request.network)? {
                    return self.node_pool_status(&pool, now);
                }
                let name = self.cni_scope(&request.network, writes, touched)?;
                let scope = self.scope_mut(&name)?;
                scope.engine.advance(now);
                let mut status = scope_status(&name, scope);
                // Only the network's own pools (not the engine's implicit default).
                status
                    .pools
                    .retain(|p| request.network.pools.iter().any(|n| n.name == p.pool));
                Ok(Reply::ScopeStatus(status))
            }
            Op::SetClusterRanges(grants) => self.set_cluster_ranges(grants, touched),
            Op::SurrenderBlock { pool, range } => self.surrender_block(&pool, &range, touched),
            Op::ReclaimBlock { pool, range } => self.reclaim_block(&pool, &range, touched),
            Op::BlockReport => self.block_report(),
            Op::ReserveLocalRoutes(request) => {
                let scope = self.scope_mut(&request.scope)?;
                let response = crate::local_routes::reserve(
                    &request.scope,
                    &mut scope.engine,
                    &mut scope.config,
                    &request.host,
                )?;
                touched.insert(request.scope);
                Ok(Reply::LocalRoutes(response))
            }
            Op::Tick => {
                let mut expired = 0;
                for (name, scope) in &mut self.scopes {
                    let gone = scope.engine.expire(now);
                    expired += gone.len();
                    record_released(name, &gone, writes, touched);
                }
                Ok(Reply::Expired(expired))
            }
            Op::Gauges => Ok(Reply::Gauges(self.gauges(now))),
            Op::Interfaces(pool) => self.list_interfaces(pool, now),
            Op::Interface(id) => self.show_interface(&id, now),
            Op::AddInterface(request) => self.add_interface(request, now, touched),
            Op::RemoveInterface { id, force } => {
                self.remove_interface(&id, force, now, writes, touched)
            }
            Op::AddInterfaceAddress { id, address } => {
                self.add_interface_address(&id, &address, now, touched)
            }
            Op::RemoveInterfaceAddress { id, address, force } => {
                self.remove_interface_address(&id, &address, force, now, writes, touched)
            }
            Op::ImportIpamd(request) => self.import_ipamd(request, now, writes, touched),
            Op::InterfaceGauges => Ok(Reply::InterfaceGauges(self.interface_gauges(now))),
            Op::SetCloudInterfaces(wanted) => self.set_cloud_interfaces(wanted, now, touched),
            Op::SurrenderCloudAddress { pool, address } => {
                self.surrender_cloud_address(&pool, address, now, touched)
            }
            Op::CloudReport => self.cloud_report(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::path::Path;

    use super::*;

    fn network(cooldown_ms: u64) -> api::CniNetwork {
        api::CniNetwork {
            name: "net".into(),
            pools: vec![api::CniPool {
                name: "net".into(),
                cooldown_ms,
                lowest_free: false,
                ranges: vec!["10.5.0.0/29".into()],
                exclusions: vec![],
            }],
            node_pool: None,
            requested_pool: None,
            configured_pool: None,
            namespace: None,
        }
    }

    fn add(container: &str, cooldown_ms: u64) -> Op {
        Op::CniAdd(api::CniAddRequest {
            network: network(cooldown_ms),
            key: api::AttachmentKey {
                network: "net".into(),
                container_id: container.into(),
                ifname: "eth0".into(),
            },
            owner: container.into(),
            sets: vec![api::CniSet {
                pool: "net".into(),
                family: api::FamilyName::Ipv4,
                requested: None,
            }],
        })
    }

    fn address(answer: &Result<Reply, OpError>) -> IpAddr {
        match answer {
            Ok(Reply::Allocated(a)) => a.allocations[0].address,
            other => panic!("{other:?}"),
        }
    }

    /// A clock the test moves.
    #[derive(Clone, Debug, Default)]
    struct ManualClock(std::sync::Arc<std::sync::atomic::AtomicU64>);

    impl ManualClock {
        fn advance(&self, millis: u64) {
            self.0
                .fetch_add(millis, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Timestamp {
            Timestamp::from_unix_millis(
                1_000_000 + self.0.load(std::sync::atomic::Ordering::SeqCst),
            )
        }
    }

    fn node_allocate(owner: &str, lease_ms: Option<u64>) -> Op {
        Op::Allocate(api::AllocateRequest {
            scope: api::NODE_SCOPE.into(),
            pool: "default".into(),
            owner: owner.into(),
            key: None,
            family: None,
            address: None,
            lease_ms,
        })
    }

    fn declared() -> ScopeConfig {
        ScopeConfig {
            pools: vec![
                corral_store::PoolSpec::new(
                    &PoolName::default_pool(),
                    Duration::from_secs(30),
                    corral_core::ReusePolicy::NextFit,
                    &["10.9.0.0/29".parse().unwrap()],
                    &[],
                )
                .with_source(corral_store::RangeSource::File),
            ],
        }
    }

    /// Leases run out when the clock says so: no sleeping, and a restore in between keeps them.
    #[test]
    fn a_lease_expires_when_its_time_has_come_and_not_before() {
        let store = corral_store::MemoryStore::new();
        let clock = ManualClock::default();
        let mut host = Host::restore_with(store.clone(), &declared(), clock.clone()).unwrap();
        let leased = address(&host.run_batch(vec![node_allocate("short", Some(1_000))])[0]);
        address(&host.run_batch(vec![node_allocate("keeper", None)])[0]);
        clock.advance(999);
        assert!(matches!(
            host.run_batch(vec![Op::Tick])[0],
            Ok(Reply::Expired(0))
        ));
        drop(host);
        let mut host = Host::restore_with(store.clone(), &declared(), clock.clone()).unwrap();
        clock.advance(1);
        assert!(matches!(
            host.run_batch(vec![Op::Tick])[0],
            Ok(Reply::Expired(1))
        ));
        let dump = host.dump(None).unwrap();
        let held: Vec<IpAddr> = dump
            .scopes
            .iter()
            .flat_map(|s| &s.pools)
            .flat_map(|p| &p.allocations)
            .map(|a| a.address)
            .collect();
        assert_eq!(held.len(), 1);
        assert!(!held.contains(&leased));
    }

    /// A failed commit answers 503, and the scope is rebuilt from the store under the
    /// configuration the store holds: the failed batch's range is not in memory either.
    #[test]
    fn a_failed_commit_forgets_the_batchs_changes_configuration_included() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        let add = |range: &str| {
            Op::AddRange(api::RangeRequest {
                scope: api::NODE_SCOPE.into(),
                pool: "default".into(),
                range: range.into(),
            })
        };
        store.fail_next_commits(1);
        let answers = host.run_batch(vec![add("10.10.0.0/24"), node_allocate("x", None)]);
        for answer in &answers {
            let error = answer.as_ref().unwrap_err();
            assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
        }
        let ranges = |host: &Host<corral_store::MemoryStore>| -> Vec<String> {
            host.pools(None).unwrap().pools[0]
                .ranges
                .iter()
                .map(|r| r.range.clone())
                .collect()
        };
        assert_eq!(ranges(&host), ["10.9.0.0/29"]);
        assert_eq!(
            host.dump(None).unwrap().scopes[0].pools[0]
                .allocations
                .len(),
            0
        );
        assert!(host.run_batch(vec![add("10.10.0.0/24")])[0].is_ok());
        assert_eq!(ranges(&host), ["10.9.0.0/29", "10.10.0.0/24"]);
    }

    /// Regression (podman): `corral status --scope <network>` showed an empty `default` pool,
    /// the engine's implicit one, beside the network's real pools.
    #[test]
    fn a_networks_status_shows_only_its_own_pools() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut host = Host::restore(store, &ScopeConfig::default()).unwrap();
        address(&host.run_batch(vec![add("c1", 0)])[0]);
        let status = host.status(Some("net"), now()).unwrap();
        let pools: Vec<&str> = status.scopes[0]
            .pools
            .iter()
            .map(|p| p.pool.as_str())
            .collect();
        assert_eq!(pools, ["net"]);
        let listed = host.pools(Some("net")).unwrap();
        assert_eq!(listed.pools.len(), 1);
        assert_eq!(listed.pools[0].ranges[0].source, api::RangeSource::Cni);
    }

    /// Regression: a changed network configuration rebuilds the scope from the store, so
    /// what the batch changed before must be committed first; otherwise the rebuilt engine
    /// does not know it and hands the same address out again.
    #[test]
    fn a_configuration_change_inside_a_batch_sees_the_batch_so_far() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut host = Host::restore(store, &ScopeConfig::default()).unwrap();
        let answers = host.run_batch(vec![add("c1", 0), add("c2", 1000)]);
        let (a, b) = (address(&answers[0]), address(&answers[1]));
        assert_ne!(a, b);
        // What memory says is what the disk says.
        let dump = host.dump(Some("net")).unwrap();
        drop(host);
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let host = Host::restore(store, &ScopeConfig::default()).unwrap();
        assert_eq!(host.dump(Some("net")).unwrap(), dump);
    }

    // ---- the cluster's grants (Op::SetClusterRanges) -------------------------------------

    fn grant(list: &[(&str, &str)]) -> Op {
        Op::SetClusterRanges(ClusterRanges {
            ranges: list
                .iter()
                .map(|(pool, range)| (PoolName::new(pool).unwrap(), range.parse().unwrap()))
                .collect(),
            ..ClusterRanges::default()
        })
    }

    fn outcome(answer: Result<Reply, OpError>) -> ClusterRangesOutcome {
        match answer {
            Ok(Reply::ClusterRanges(outcome)) => outcome,
            other => panic!("{other:?}"),
        }
    }

    fn granted(list: &[(&str, &str)]) -> Vec<(PoolName, RangeSpec)> {
        list.iter()
            .map(|(pool, range)| (PoolName::new(pool).unwrap(), range.parse().unwrap()))
            .collect()
    }

    /// `(pool, range, source, draining)` of every range of the node scope.
    fn node_ranges<S: Store, C: Clock>(
        host: &Host<S, C>,
    ) -> Vec<(String, String, api::RangeSource, bool)> {
        host.pools(Some(api::NODE_SCOPE))
            .unwrap()
            .pools
            .into_iter()
            .flat_map(|p| {
                p.ranges
                    .into_iter()
                    .map(move |r| (p.name.clone(), r.range, r.source, r.draining))
            })
            .collect()
    }

    fn pods_allocate(owner: &str) -> Op {
        Op::Allocate(api::AllocateRequest {
            pool: "pods".into(),
            ..match node_allocate(owner, None) {
                Op::Allocate(request) => request,
                _ => unreachable!(),
            }
        })
    }

    fn run_one<S: Store, C: Clock>(host: &mut Host<S, C>, op: Op) -> Result<Reply, OpError> {
        host.run_batch(vec![op]).remove(0)
    }

    const NODE_CIDRS: [(&str, &str); 2] = [("pods", "10.77.0.0/24"), ("pods", "fd77::/120")];

    #[test]
    fn granted_ranges_are_added_to_a_new_pool_as_the_clusters_and_serve_allocations() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        let done = outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        assert_eq!(done.added, granted(&NODE_CIDRS));
        assert!(done.removed.is_empty() && done.draining.is_empty() && done.refused.is_empty());
        let ranges = node_ranges(&host);
        assert!(ranges.contains(&(
            "pods".into(),
            "10.77.0.0/24".into(),
            api::RangeSource::Cluster,
            false
        )));
        assert!(ranges.contains(&(
            "pods".into(),
            "fd77::/120".into(),
            api::RangeSource::Cluster,
            false
        )));
        let dual = Op::Allocate(api::AllocateRequest {
            family: Some(api::FamilyChoice::Dual),
            ..match pods_allocate("pod") {
                Op::Allocate(request) => request,
                _ => unreachable!(),
            }
        });
        match run_one(&mut host, dual) {
            Ok(Reply::Allocated(a)) => assert_eq!(a.allocations.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_same_grants_again_change_nothing_and_write_nothing() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        let before = node_ranges(&host);
        let commits = store.commits();
        let again = outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        assert_eq!(again, ClusterRangesOutcome::default());
        assert_eq!(store.commits(), commits);
        assert_eq!(node_ranges(&host), before);
    }

    #[test]
    fn a_range_no_longer_granted_goes_at_once_when_empty_and_drains_when_used() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        let held = address(&run_one(&mut host, pods_allocate("pod")));
        assert!(held.is_ipv4());
        // Only the file's range is left granted... to nobody: the cluster grants nothing now.
        let done = outcome(run_one(&mut host, grant(&[])));
        assert_eq!(done.removed, granted(&[("pods", "fd77::/120")]));
        assert_eq!(done.draining, granted(&[("pods", "10.77.0.0/24")]));
        let pods: Vec<_> = node_ranges(&host)
            .into_iter()
            .filter(|r| r.0 == "pods")
            .collect();
        assert_eq!(
            pods,
            [(
                "pods".to_owned(),
                "10.77.0.0/24".to_owned(),
                api::RangeSource::Cluster,
                true
            )]
        );
        // Nothing new from a draining range; the allocation stays until released.
        let error = run_one(&mut host, pods_allocate("other")).unwrap_err();
        assert_eq!(error.code, ErrorCode::Exhausted, "{error:?}");
        assert_eq!(
            host.dump(Some(api::NODE_SCOPE)).unwrap().scopes[0]
                .pools
                .len(),
            2
        );
        let release = Op::Release(api::ReleaseRequest {
            scope: api::NODE_SCOPE.into(),
            key: None,
            address: Some(held),
            generation: None,
            owner: None,
        });
        run_one(&mut host, release).unwrap();
        assert!(node_ranges(&host).iter().all(|r| r.0 != "pods"));
        // The stored configuration agrees after a restart.
        drop(host);
        let host = Host::restore(store, &declared()).unwrap();
        assert!(node_ranges(&host).iter().all(|r| r.0 != "pods"));
    }

    #[test]
    fn granting_a_draining_range_again_cancels_its_drain() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        address(&run_one(&mut host, pods_allocate("pod")));
        let done = outcome(run_one(&mut host, grant(&[("pods", "fd77::/120")])));
        assert_eq!(done.draining, granted(&[("pods", "10.77.0.0/24")]));
        let done = outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        assert_eq!(done.added, granted(&[("pods", "10.77.0.0/24")]));
        assert!(
            node_ranges(&host)
                .iter()
                .filter(|r| r.0 == "pods")
                .all(|r| !r.3)
        );
        address(&run_one(&mut host, pods_allocate("another")));
    }

    #[test]
    fn a_grant_over_a_file_or_api_range_is_reported_and_the_rest_applied() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        let add_api = Op::AddRange(api::RangeRequest {
            scope: api::NODE_SCOPE.into(),
            pool: "manual".into(),
            range: "10.50.0.0/24".into(),
        });
        run_one(&mut host, add_api).unwrap();
        let before = node_ranges(&host);
        let done = outcome(run_one(
            &mut host,
            grant(&[
                ("pods", "10.9.0.0/28"),
                ("default", "10.50.0.0/25"),
                ("pods", "10.77.0.0/24"),
            ]),
        ));
        assert_eq!(done.added, granted(&[("pods", "10.77.0.0/24")]));
        assert_eq!(done.refused.len(), 2, "{:?}", done.refused);
        assert!(
            done.refused[0].contains("overlaps file range 10.9.0.0/29 of pool default"),
            "{:?}",
            done.refused
        );
        assert!(
            done.refused[1].contains("overlaps api range 10.50.0.0/24 of pool manual"),
            "{:?}",
            done.refused
        );
        // The file's and the API's ranges are as they were.
        let after = node_ranges(&host);
        for range in &before {
            assert!(after.contains(range), "{range:?} in {after:?}");
        }
        let status = host.status(None, now()).unwrap();
        assert!(
            done.refused.iter().all(|r| status.warnings.contains(r)),
            "{:?}",
            status.warnings
        );
        // A set of grants that fits clears the warnings.
        outcome(run_one(&mut host, grant(&[("pods", "10.77.0.0/24")])));
        assert!(host.status(None, now()).unwrap().warnings.is_empty());
    }

    #[test]
    fn cluster_ranges_survive_a_restart_as_they_were_whatever_the_file_says() {
        let dir = tempfile::tempdir().unwrap();
        let open = || SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut host = Host::restore(open(), &declared()).unwrap();
        outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        address(&run_one(&mut host, pods_allocate("pod")));
        // The IPv4 range drains, the IPv6 one stays active.
        outcome(run_one(&mut host, grant(&[("pods", "fd77::/120")])));
        let pods = |host: &Host| -> Vec<_> {
            node_ranges(host)
                .into_iter()
                .filter(|r| r.0 == "pods")
                .collect()
        };
        let before = pods(&host);
        assert_eq!(before.len(), 2);
        drop(host);
        // A file that declares a pool `pods` with one of the cluster's ranges and another.
        let file = ScopeConfig {
            pools: vec![
                corral_store::PoolSpec::new(
                    &PoolName::new("pods").unwrap(),
                    Duration::from_secs(30),
                    corral_core::ReusePolicy::NextFit,
                    &["fd77::/120".parse().unwrap()],
                    &[],
                )
                .with_source(corral_store::RangeSource::File),
            ],
        };
        let host = Host::restore(open(), &file).unwrap();
        assert_eq!(pods(&host), before);
        assert!(
            host.warnings()
                .iter()
                .any(|w| w.contains("granted by the cluster")),
            "{:?}",
            host.warnings()
        );
        drop(host);
        // And without any file at all.
        let host = Host::restore(open(), &ScopeConfig::default()).unwrap();
        assert_eq!(pods(&host), before);
    }

    /// An interface-backed pool takes no plain range, from the API or the cluster, and an
    /// interface goes into no pool of plain ranges; each refusal changes nothing.
    #[test]
    fn interface_pools_and_plain_ranges_do_not_mix() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        let eni = |pool: &str, id: &str, device: u32| {
            Op::AddInterface(api::InterfaceRequest {
                pool: pool.into(),
                id: id.into(),
                device_number: device,
                mac: format!("0a:00:00:00:00:{device:02x}"),
                subnets: vec!["10.60.0.0/24".into()],
                gateways: vec![],
                routes: vec![],
                primary: false,
                primary_addresses: vec![],
                trunk: false,
                excluded: false,
                addresses: vec!["10.60.0.10".into(), "10.60.0.16/28".into()],
            })
        };
        run_one(&mut host, eni("eni", "eni-1", 1)).unwrap();
        let before = node_ranges(&host);
        let error = run_one(&mut host, eni("default", "eni-2", 2)).unwrap_err();
        assert_eq!(error.code, ErrorCode::PoolKindMismatch, "{error:?}");
        let add = Op::AddRange(api::RangeRequest {
            scope: api::NODE_SCOPE.into(),
            pool: "eni".into(),
            range: "10.61.0.0/24".into(),
        });
        let error = run_one(&mut host, add).unwrap_err();
        assert_eq!(error.code, ErrorCode::PoolKindMismatch, "{error:?}");
        let done = outcome(run_one(&mut host, grant(&[("eni", "10.62.0.0/24")])));
        assert!(done.added.is_empty(), "{done:?}");
        assert!(done.refused[0].contains("interface-backed"), "{done:?}");
        // An interface whose second address is refused leaves nothing behind.
        let mut bad = match eni("eni", "eni-3", 3) {
            Op::AddInterface(request) => request,
            _ => unreachable!(),
        };
        bad.addresses = vec!["10.60.0.11".into(), "10.60.0.10".into()];
        let error = run_one(&mut host, Op::AddInterface(bad)).unwrap_err();
        assert_eq!(error.code, ErrorCode::AddressAlreadyPresent, "{error:?}");
        assert_eq!(node_ranges(&host), before);
        // And the table and the store agree after a restart.
        drop(host);
        let mut host = Host::restore(store, &declared()).unwrap();
        assert_eq!(node_ranges(&host), before);
        match run_one(&mut host, Op::Interfaces(Some("eni".into()))) {
            Ok(Reply::Interfaces(list)) => {
                let ids: Vec<&str> = list.pools[0]
                    .interfaces
                    .iter()
                    .map(|i| i.id.as_str())
                    .collect();
                assert_eq!(ids, ["eni-1"]);
                assert_eq!(list.pools[0].total, 17);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failed_commit_of_the_grants_changes_nothing() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        let before = node_ranges(&host);
        store.fail_next_commits(1);
        let error = run_one(&mut host, grant(&NODE_CIDRS)).unwrap_err();
        assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
        assert_eq!(node_ranges(&host), before);
        drop(host);
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        assert_eq!(node_ranges(&host), before);
        let done = outcome(run_one(&mut host, grant(&NODE_CIDRS)));
        assert_eq!(done.added, granted(&NODE_CIDRS));
    }

    // ---- interface pools: trunk/excluded, file ranges, scopes, cooling -----------------

    fn eni_op(pool: &str, id: &str, device: u32, addresses: &[&str]) -> Op {
        Op::AddInterface(api::InterfaceRequest {
            pool: pool.into(),
            id: id.into(),
            device_number: device,
            mac: format!("0a:00:00:00:00:{device:02x}"),
            subnets: vec!["10.60.0.0/24".into()],
            gateways: vec![],
            routes: vec![],
            primary: false,
            primary_addresses: vec![],
            trunk: false,
            excluded: false,
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
        })
    }

    /// The configuration file declares a plain range in a pool that has become
    /// interface-backed at run time (or an operator reuses the name): the agent must still
    /// start (a warning, as for every other range the file cannot apply).
    #[test]
    fn a_file_range_in_an_interface_pool_is_skipped_and_the_agent_restarts() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        run_one(&mut host, eni_op("eni", "eni-1", 1, &["10.60.0.10"])).unwrap();
        drop(host);
        let mut file = declared();
        file.pools.push(
            corral_store::PoolSpec::new(
                &PoolName::new("eni").unwrap(),
                Duration::from_secs(30),
                corral_core::ReusePolicy::NextFit,
                &["10.61.0.0/24".parse().unwrap()],
                &[],
            )
            .with_source(corral_store::RangeSource::File),
        );
        let mut restored = Host::restore(store, &file).expect("the agent starts");
        let Ok(Reply::Checkpoint(doc)) = run_one(&mut restored, Op::Export) else {
            panic!("export")
        };
        assert!(!doc.to_string().contains("10.61.0.0"), "{doc}");
    }

    /// A state checkpoint whose non-node scope carries interfaces is imported; a keyed
    /// allocation in that scope then runs `assign_on_interface` on the *node* scope, which
    /// has no such pool: `expect("an interface-backed pool")` panics the host.
    #[test]
    fn interfaces_imported_into_another_scope_are_refused() {
        let mut a = Host::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        run_one(&mut a, eni_op("eni", "eni-1", 1, &["10.60.0.10"])).unwrap();
        let Ok(Reply::Checkpoint(mut doc)) = run_one(&mut a, Op::Export) else {
            panic!("export")
        };
        for scope in doc["scopes"].as_array_mut().unwrap() {
            if scope["scope"] == "node" {
                scope["scope"] = serde_json::json!("net1");
            }
        }
        let mut b = Host::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        let Err(refused) = run_one(&mut b, Op::Import(doc.clone())) else {
            panic!("imported interfaces into scope net1: {doc}")
        };
        assert_eq!(refused.code, ErrorCode::BadRequest, "{refused:?}");
        assert!(
            refused.message.contains("only the \"node\" scope"),
            "{refused:?}"
        );
        // Nothing was imported: the scope does not exist, and a keyed allocation there is a
        // typed refusal, not a panic.
        let answer = run_one(
            &mut b,
            Op::Allocate(api::AllocateRequest {
                scope: "net1".into(),
                pool: "eni".into(),
                owner: "pod".into(),
                key: Some(api::AttachmentKey {
                    network: "net1".into(),
                    container_id: "c1".into(),
                    ifname: "eth0".into(),
                }),
                family: None,
                address: None,
                lease_ms: None,
            }),
        );
        assert!(answer.is_err(), "{answer:?}");
    }

    /// An excluded interface ("excluded from pod addresses") and a trunk ("never pod
    /// addresses of its own") must not serve a keyed allocation.
    #[test]
    fn excluded_and_trunk_interfaces_serve_no_pod() {
        let store = corral_store::MemoryStore::new();
        let mut host = Host::restore(store.clone(), &declared()).unwrap();
        for (id, device, trunk, excluded, address) in [
            ("eni-x", 1, false, true, "10.60.0.10"),
            ("eni-t", 2, true, false, "10.60.0.11"),
        ] {
            let Op::AddInterface(mut request) = eni_op("eni", id, device, &[address]) else {
                unreachable!()
            };
            request.trunk = trunk;
            request.excluded = excluded;
            request.mac = format!("0a:00:00:00:00:0{device}");
            run_one(&mut host, Op::AddInterface(request)).unwrap();
        }
        let allocate = |host: &mut Host<corral_store::MemoryStore, _>| {
            run_one(
                host,
                Op::Allocate(api::AllocateRequest {
                    scope: api::NODE_SCOPE.into(),
                    pool: "eni".into(),
                    owner: "pod".into(),
                    key: Some(api::AttachmentKey {
                        network: "aws-cni".into(),
                        container_id: "c1".into(),
                        ifname: "eth0".into(),
                    }),
                    family: None,
                    address: None,
                    lease_ms: None,
                }),
            )
        };
        let answer = allocate(&mut host);
        let Err(error) = answer else {
            panic!("handed out {answer:?}")
        };
        assert_eq!(error.code, ErrorCode::Exhausted, "{error:?}");
        // The exclusions are stored with the interfaces: a restarted agent refuses too.
        drop(host);
        let mut host = Host::restore(store, &declared()).unwrap();
        let answer = allocate(&mut host);
        assert!(answer.is_err(), "handed out {answer:?} after a restart");
    }

    /// ErrorCode::AddressInUse: "the address or prefix holds allocated or cooling addresses
    /// (`force` drains it)". A cooling address is removed without force, its cooldown with
    /// it; added back (the cloud returns it), it goes to the next pod at once.
    #[test]
    fn a_cooling_address_is_not_removed_without_force() {
        let mut host = Host::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        run_one(&mut host, eni_op("eni", "eni-1", 1, &["10.60.0.10"])).unwrap();
        let alloc = |container: &str| {
            Op::Allocate(api::AllocateRequest {
                scope: api::NODE_SCOPE.into(),
                pool: "eni".into(),
                owner: "pod".into(),
                key: Some(api::AttachmentKey {
                    network: "aws-cni".into(),
                    container_id: container.into(),
                    ifname: "eth0".into(),
                }),
                family: None,
                address: None,
                lease_ms: None,
            })
        };
        run_one(&mut host, alloc("c1")).unwrap();
        run_one(
            &mut host,
            Op::Release(api::ReleaseRequest {
                scope: api::NODE_SCOPE.into(),
                key: Some(api::AttachmentKey {
                    network: "aws-cni".into(),
                    container_id: "c1".into(),
                    ifname: "eth0".into(),
                }),
                ..Default::default()
            }),
        )
        .unwrap();
        let removed = run_one(
            &mut host,
            Op::RemoveInterfaceAddress {
                id: "eni-1".into(),
                address: "10.60.0.10".into(),
                force: false,
            },
        );
        if removed.is_ok() {
            run_one(
                &mut host,
                Op::AddInterfaceAddress {
                    id: "eni-1".into(),
                    address: "10.60.0.10".into(),
                },
            )
            .unwrap();
            let again = run_one(&mut host, alloc("c2"));
            panic!("removed while cooling; re-added, then c2 got {again:?}");
        }
    }

    /// An ipamd checkpoint with an entry backfilled from CRI imports (under the container's
    /// migrated key), and the runtime's later CHECK and DEL, which name the real network and
    /// interface, find it; the same import again (its answer lost) succeeds and changes
    /// nothing, while a key holding another address is refused.
    #[test]
    fn ipamd_import_takes_backfilled_entries_and_repeats() {
        let mut host = Host::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        run_one(
            &mut host,
            eni_op(
                "eni",
                "eni-1",
                1,
                &["10.60.0.10", "10.60.0.11", "10.60.0.12"],
            ),
        )
        .unwrap();
        let checkpoint = |c1: &str| {
            serde_json::json!({"version": "vpc-cni-ipam/1", "allocations": [
                {"networkName": "aws-cni", "containerID": "c1", "ifName": "eth0", "ipv4": c1,
                 "allocationTimestamp": 0,
                 "metadata": {"k8sPodNamespace": "default", "k8sPodName": "one"}},
                {"networkName": "_migrated-from-cri", "containerID": "c0ffee",
                 "ifName": "unknown", "ipv4": "10.60.0.11", "allocationTimestamp": 0,
                 "metadata": {}}
            ]})
        };
        let import = |host: &mut Host<corral_store::MemoryStore, _>, c1: &str| {
            run_one(
                host,
                Op::ImportIpamd(api::IpamdImportRequest {
                    pool: "eni".into(),
                    checkpoint: checkpoint(c1),
                }),
            )
        };
        let Ok(Reply::IpamdImported(first)) = import(&mut host, "10.60.0.10") else {
            panic!("import refused")
        };
        assert_eq!(first.imported.len(), 2, "{first:?}");
        assert_eq!(first.imported[1].key.network, "migrated-from-cri");
        let Ok(Reply::IpamdImported(again)) = import(&mut host, "10.60.0.10") else {
            panic!("the same import again was refused")
        };
        assert_eq!(again.imported, first.imported);
        let Err(error) = import(&mut host, "10.60.0.12") else {
            panic!("a key holding another address was taken over")
        };
        assert_eq!(error.code, ErrorCode::InUse, "{error:?}");
        let runtime_key = api::CniKeyRequest {
            network: api::CniNetwork {
                name: "aws-cni".into(),
                pools: vec![],
                node_pool: Some("eni".into()),
                requested_pool: None,
                configured_pool: None,
                namespace: None,
            },
            key: api::AttachmentKey {
                network: "aws-cni".into(),
                container_id: "c0ffee".into(),
                ifname: "eth0".into(),
            },
        };
        let Ok(Reply::Allocated(held)) = run_one(&mut host, Op::CniCheck(runtime_key.clone()))
        else {
            panic!("check")
        };
        let addresses: Vec<String> = held
            .allocations
            .iter()
            .map(|a| a.address.to_string())
            .collect();
        assert_eq!(addresses, ["10.60.0.11"]);
        let Ok(Reply::Released(gone)) = run_one(&mut host, Op::CniDel(runtime_key.clone())) else {
            panic!("del")
        };
        let addresses: Vec<String> = gone
            .released
            .iter()
            .map(|r| r.address.to_string())
            .collect();
        assert_eq!(addresses, ["10.60.0.11"]);
        // Gone: a second DEL releases nothing, and c1 keeps its address.
        let Ok(Reply::Released(gone)) = run_one(&mut host, Op::CniDel(runtime_key)) else {
            panic!("del")
        };
        assert!(gone.released.is_empty(), "{gone:?}");
    }
}
