//! The agent's state: one engine per scope, kept in memory, and the store they are durable in.
//!
//! [`Host`] is plain synchronous code, driven by one thread at a time (see `committer.rs`). It applies
//! a *batch* of operations to the engines, collecting the rows they change, then makes the
//! whole batch durable in one transaction (one fsync) before any of its answers is sent: the
//! group commit. A batch whose commit fails is answered with errors, and the scopes it
//! touched are rebuilt from the store, so memory never runs ahead of the disk.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
#[cfg(test)]
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{
    AllocError, Allocation, AttachmentKey, Engine, EngineConfig, Exclusion, Family, PoolName,
    RangeRemoval, RangeSpec, Released, Request, Target, Timestamp,
};
use corral_store::{
    Need, PoolSpec, ScopeConfig, SqliteStore, Store, StoreError, StoredAllocation, Txn,
    build_engine, export_checkpoint, import_checkpoint, save_engine,
};

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

    fn store(error: StoreError) -> OpError {
        match error {
            StoreError::Engine(error) => OpError::from(error),
            other => OpError::new(
                ErrorCode::RetryLater,
                format!("the agent's store failed: {other}"),
            ),
        }
    }
}

impl From<AllocError> for OpError {
    fn from(error: AllocError) -> OpError {
        let pool = match &error {
            AllocError::UnknownPool { pool }
            | AllocError::PoolExhausted { pool, .. }
            | AllocError::NoCapacity { pool, .. }
            | AllocError::OutsidePool { pool, .. }
            | AllocError::Draining { pool, .. }
            | AllocError::PoolExists { pool }
            | AllocError::PoolInUse { pool, .. }
            | AllocError::UnknownRange { pool, .. }
            | AllocError::UnknownExclusion { pool, .. }
            | AllocError::AttachmentConflict { pool, .. }
            | AllocError::DuplicateTarget { pool, .. } => Some(pool.to_string()),
            _ => None,
        };
        let code = match &error {
            AllocError::Invalid(_) | AllocError::DuplicateTarget { .. } => ErrorCode::BadRequest,
            AllocError::UnknownPool { .. }
            | AllocError::UnknownRange { .. }
            | AllocError::UnknownExclusion { .. }
            | AllocError::NotAllocated { .. }
            | AllocError::NoLease { .. } => ErrorCode::NotFound,
            AllocError::PoolExhausted { .. }
            | AllocError::NoCapacity { .. }
            | AllocError::TableFull => ErrorCode::Exhausted,
            AllocError::AddressInUse { .. } => ErrorCode::InUse,
            AllocError::AttachmentConflict { .. } => ErrorCode::AttachmentConflict,
            AllocError::OutsidePool { .. }
            | AllocError::Excluded { .. }
            | AllocError::Reserved { .. }
            | AllocError::Draining { .. }
            | AllocError::FamilyDisabled { .. } => ErrorCode::Unavailable,
            AllocError::RestoreInProgress { .. } => ErrorCode::RetryLater,
            _ => ErrorCode::Conflict,
        };
        OpError {
            code,
            message: error.to_string(),
            pool,
            set: None,
            retryable: error.is_retryable(),
        }
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
    CniGc(api::CniGcRequest),
    CniStatus(api::CniStatusRequest),
    /// Expires leases and ends cooldowns that have run out.
    Tick,
    /// Counts for the metrics endpoint.
    Gauges,
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
            Op::Dump(_) | Op::Status(_) | Op::Pools(_) | Op::Export | Op::Gauges | Op::CniCheck(_)
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

/// A change to a row, in the order the batch made it.
#[derive(Debug)]
enum Write {
    Put(String, StoredAllocation),
    Delete(String, IpAddr),
}

struct Scope {
    config: ScopeConfig,
    engine: Engine,
}

/// The agent's scopes and its store.
pub struct Host {
    store: SqliteStore,
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
}

impl std::fmt::Debug for Host {
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

fn family_name(family: Family) -> api::FamilyName {
    match family {
        Family::V4 => api::FamilyName::Ipv4,
        Family::V6 => api::FamilyName::Ipv6,
    }
}

fn family_of(name: api::FamilyName) -> Family {
    match name {
        api::FamilyName::Ipv4 => Family::V4,
        api::FamilyName::Ipv6 => Family::V6,
    }
}

fn pool_name(text: &str) -> Result<PoolName, OpError> {
    PoolName::new(text).map_err(|e| OpError::bad_request(format!("pool {text:?}: {e}")))
}

fn key_of(key: &api::AttachmentKey) -> Result<AttachmentKey, OpError> {
    AttachmentKey::new(&key.network, &key.container_id, &key.ifname)
        .map_err(|e| OpError::bad_request(format!("key: {e}")))
}

fn api_key(key: &AttachmentKey) -> api::AttachmentKey {
    api::AttachmentKey {
        network: key.network().to_owned(),
        container_id: key.container_id().to_owned(),
        ifname: key.ifname().to_owned(),
    }
}

fn api_lease(lease: &corral_core::Lease) -> api::Lease {
    api::Lease {
        id: lease.id.to_string(),
        expires_at_ms: lease.expires_at.as_unix_millis(),
    }
}

fn released(r: &Released) -> api::ReleasedAddress {
    api::ReleasedAddress {
        address: r.addr,
        pool: r.pool.to_string(),
        generation: r.generation,
    }
}

fn allocated(pool: &PoolName, a: &Allocation) -> api::Allocated {
    api::Allocated {
        address: a.addr,
        family: family_name(Family::of(a.addr)),
        pool: pool.to_string(),
        generation: a.generation,
        existing: a.existing,
        subnet: a.range.map(|r| r.subnet_net().to_string()),
        gateway: a.range.and_then(|r| r.gateway()),
        lease: a.lease.as_ref().map(api_lease),
    }
}

fn scope_config_of(pools: &[api::CniPool]) -> ScopeConfig {
    ScopeConfig {
        pools: pools
            .iter()
            .map(|p| PoolSpec {
                name: p.name.clone(),
                cooldown_ms: p.cooldown_ms,
                lowest_free: p.lowest_free,
                ranges: p.ranges.clone(),
                exclusions: p
                    .exclusions
                    .iter()
                    .map(|e| (e.network.clone(), e.reason.clone()))
                    .collect(),
            })
            .collect(),
    }
}

/// The union of two configurations: every pool of either, every range and exclusion of
/// either (the stored one first). The agent's configuration file declares pools; what was
/// added at run time through the API is kept across restarts.
pub fn union(stored: &ScopeConfig, declared: &ScopeConfig) -> ScopeConfig {
    let mut out = stored.clone();
    for pool in &declared.pools {
        match out.pools.iter_mut().find(|p| p.name == pool.name) {
            Some(existing) => {
                for range in &pool.ranges {
                    if !existing.ranges.contains(range) {
                        existing.ranges.push(range.clone());
                    }
                }
                for exclusion in &pool.exclusions {
                    if !existing.exclusions.iter().any(|e| e.0 == exclusion.0) {
                        existing.exclusions.push(exclusion.clone());
                    }
                }
            }
            None => out.pools.push(pool.clone()),
        }
    }
    out
}

impl Host {
    /// Restores every scope of the store, with `node` (the agent's own pools) configured as
    /// the union of what is stored and what `declared` lists. Nothing is released or
    /// expired here: the engines finish their restore phase with every stored allocation,
    /// lease and cooldown, and [`Op::Tick`] expires what is overdue afterwards.
    pub fn restore(mut store: SqliteStore, declared: &ScopeConfig) -> Result<Host, StoreError> {
        let lease_seed = now().as_unix_millis() ^ u64::from(std::process::id()).rotate_left(32);
        let mut scopes = BTreeMap::new();
        let mut txn = store.begin()?;
        let mut names = txn.scopes()?;
        if !names.iter().any(|s| s == api::NODE_SCOPE) {
            names.push(api::NODE_SCOPE.to_owned());
        }
        for name in names {
            let (state, _) = txn.scope_state(&name)?;
            let stored = state.map(|s| s.config).unwrap_or_default();
            let config = if name == api::NODE_SCOPE {
                union(&stored, declared)
            } else {
                stored
            };
            let engine_config = EngineConfig {
                lease_id_seed: lease_seed ^ scopes.len() as u64,
                ..EngineConfig::default()
            };
            let (engine, _) = build_engine(&mut txn, &name, &config, engine_config, Need::Full)?;
            save_engine(&mut txn, &name, &config, &engine)?;
            scopes.insert(name, Scope { config, engine });
        }
        txn.commit()?;
        Ok(Host {
            store,
            scopes,
            lease_seed,
            batch_failed: None,
            committed_upto: 0,
            current: 0,
            broken: BTreeMap::new(),
        })
    }

    /// Applies a batch of operations and makes their changes durable in one commit; the
    /// answers, in order, are valid only once this returns.
    pub fn run_batch(&mut self, ops: Vec<Op>) -> Vec<Result<Reply, OpError>> {
        let now = now();
        let mut writes = Vec::new();
        let mut touched = BTreeSet::new();
        let mut answers = Vec::with_capacity(ops.len());
        self.committed_upto = 0;
        for (i, op) in ops.into_iter().enumerate() {
            self.current = i;
            if let Some(error) = &self.batch_failed {
                // A commit of this batch failed: what follows is refused, not applied.
                answers.push(Err(error.clone()));
                continue;
            }
            if let Op::Import(document) = op {
                // An import replaces state underneath the engines: it commits on its own.
                let answer = self
                    .flush(&mut writes, &mut touched)
                    .and_then(|()| self.import(document));
                if answer.is_ok() {
                    self.committed_upto = i + 1;
                }
                answers.push(answer);
                continue;
            }
            let writes_before = writes.len();
            let may_write = op.writes();
            let answer = self.apply(op, now, &mut writes, &mut touched);
            debug_assert!(may_write || writes.len() == writes_before);
            answers.push(answer);
        }
        self.current = answers.len();
        let _ = self.flush(&mut writes, &mut touched);
        if let Some(error) = self.batch_failed.take() {
            // Memory must not run ahead of the disk: what no commit covered is not
            // acknowledged (it was rolled back, or never applied).
            for answer in &mut answers[self.committed_upto..] {
                *answer = Err(error.clone());
            }
        }
        answers
    }

    /// Commits collected writes and the derived state of touched scopes; on failure rebuilds
    /// those scopes from the store.
    fn flush(
        &mut self,
        writes: &mut Vec<Write>,
        touched: &mut BTreeSet<String>,
    ) -> Result<(), OpError> {
        if writes.is_empty() && touched.is_empty() {
            self.committed_upto = self.current;
            return Ok(());
        }
        let result = persist(&mut self.store, &self.scopes, writes, touched);
        let scopes: Vec<String> = std::mem::take(touched).into_iter().collect();
        writes.clear();
        match result {
            Ok(()) => {
                // Everything applied before the operation now running is on disk.
                self.committed_upto = self.current;
                Ok(())
            }
            Err(error) => {
                for scope in scopes {
                    self.reload(&scope);
                }
                let error = OpError::store(error);
                self.batch_failed.get_or_insert_with(|| error.clone());
                Err(error)
            }
        }
    }

    /// Rebuilds a scope's engine from the store (after a failed commit). If the store fails
    /// again the scope is set aside as broken: requests for it get 503 and try again.
    fn reload(&mut self, scope: &str) {
        let config = match self.scopes.get(scope) {
            Some(s) => s.config.clone(),
            None => match self.broken.get(scope) {
                Some(broken) => broken.config.clone(),
                None => return,
            },
        };
        let engine_config = self.engine_config();
        let rebuilt = self.store.begin().and_then(|mut txn| {
            let (engine, _) = build_engine(&mut txn, scope, &config, engine_config, Need::Full)?;
            Ok(engine)
        });
        match rebuilt {
            Ok(engine) => {
                self.broken.remove(scope);
                self.scopes
                    .insert(scope.to_owned(), Scope { config, engine });
            }
            Err(error) => {
                self.scopes.remove(scope);
                self.broken.insert(
                    scope.to_owned(),
                    Broken {
                        config,
                        reason: error.to_string(),
                    },
                );
            }
        }
    }

    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            lease_id_seed: self.lease_seed ^ now().as_unix_millis().rotate_left(17),
            ..EngineConfig::default()
        }
    }

    fn scope_mut(&mut self, scope: &str) -> Result<&mut Scope, OpError> {
        if self.broken.contains_key(scope) {
            self.reload(scope);
        }
        if let Some(broken) = self.broken.get(scope) {
            return Err(broken.error(scope));
        }
        self.scopes
            .get_mut(scope)
            .ok_or_else(|| OpError::new(ErrorCode::NotFound, format!("unknown scope {scope:?}")))
    }

    fn scope(&self, scope: &str) -> Result<&Scope, OpError> {
        if let Some(broken) = self.broken.get(scope) {
            return Err(broken.error(scope));
        }
        self.scopes
            .get(scope)
            .ok_or_else(|| OpError::new(ErrorCode::NotFound, format!("unknown scope {scope:?}")))
    }

    fn selected(&self, scope: Option<&str>) -> Result<Vec<(&String, &Scope)>, OpError> {
        match scope {
            Some(name) => {
                self.scope(name)?;
                Ok(self.scopes.get_key_value(name).into_iter().collect())
            }
            None => Ok(self.scopes.iter().collect()),
        }
    }

    fn apply(
        &mut self,
        op: Op,
        now: Timestamp,
        writes: &mut Vec<Write>,
        touched: &mut BTreeSet<String>,
    ) -> Result<Reply, OpError> {
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
                let id = corral_core::Uuid::parse_str(&request.id)
                    .map_err(|e| OpError::bad_request(format!("lease id {:?}: {e}", request.id)))?;
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
                let spec: RangeSpec = request
                    .range
                    .parse()
                    .map_err(|e| OpError::bad_request(format!("range {:?}: {e}", request.range)))?;
                let scope = self.scope_mut(&request.scope)?;
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
                let spec_text = spec.to_string();
                let stored = ensure_spec(scope, &pool)?;
                stored.ranges.retain(|r| *r != spec_text);
                stored.ranges.push(spec_text);
                touched.insert(request.scope);
                Ok(Reply::Done)
            }
            Op::RemoveRange(request) => {
                let pool = pool_name(&request.pool)?;
                let spec: RangeSpec = request
                    .range
                    .parse()
                    .map_err(|e| OpError::bad_request(format!("range {:?}: {e}", request.range)))?;
                let scope = self.scope_mut(&request.scope)?;
                let outcome = scope.engine.remove_range(&pool, &spec)?;
                let spec_text = spec.to_string();
                if let Some(stored) = spec_mut(scope, &pool) {
                    stored.ranges.retain(|r| *r != spec_text);
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
                let scope = self.scope_mut(&request.scope)?;
                scope.engine.exclude(&pool, exclusion.clone())?;
                let network = exclusion.network().to_string();
                let stored = ensure_spec(scope, &pool)?;
                stored.exclusions.retain(|e| e.0 != network);
                stored
                    .exclusions
                    .push((network, exclusion.reason().to_owned()));
                touched.insert(request.scope);
                Ok(Reply::Done)
            }
            Op::RemoveExclusion(request) => {
                let pool = pool_name(&request.pool)?;
                let network = corral_core::parse_net(&request.network)
                    .map_err(|e| OpError::bad_request(format!("network: {e}")))?;
                let scope = self.scope_mut(&request.scope)?;
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
                        })
                        .collect(),
                    Err(_) => Vec::new(),
                };
                Ok(Reply::Allocated(api::AllocateResponse {
                    allocations: held,
                }))
            }
            Op::CniGc(request) => {
                let valid = request
                    .valid_attachments
                    .iter()
                    .map(key_of)
                    .collect::<Result<Vec<_>, _>>()?;
                let name = self.cni_scope(&request.network, writes, touched)?;
                let scope = self.scope_mut(&name)?;
                let released_now = scope.engine.release_unlisted(&name, &valid, now)?;
                record_released(&name, &released_now, writes, touched);
                Ok(Reply::Released(api::ReleaseResponse {
                    released: released_now.iter().map(released).collect(),
                }))
            }
            Op::CniStatus(request) => {
                let name = self.cni_scope(&request.network, writes, touched)?;
                let scope = self.scope_mut(&name)?;
                scope.engine.advance(now);
                let mut status = scope_status(&name, &scope.engine);
                // Only the network's own pools (not the engine's implicit default).
                status
                    .pools
                    .retain(|p| request.network.pools.iter().any(|n| n.name == p.pool));
                Ok(Reply::ScopeStatus(status))
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
        }
    }

    fn allocate(
        &mut self,
        request: api::AllocateRequest,
        now: Timestamp,
        writes: &mut Vec<Write>,
        touched: &mut BTreeSet<String>,
    ) -> Result<Reply, OpError> {
        let pool = pool_name(&request.pool)?;
        let key = request.key.as_ref().map(key_of).transpose()?;
        let family = match (request.family, request.address) {
            (Some(api::FamilyChoice::Dual), Some(_)) => {
                return Err(OpError::bad_request(
                    "family dual allocates the next address of each family; it takes no address",
                ));
            }
            (Some(choice), Some(addr)) => {
                let wanted = match choice {
                    api::FamilyChoice::Ipv4 => Family::V4,
                    _ => Family::V6,
                };
                if Family::of(addr) != wanted {
                    return Err(OpError::bad_request(format!(
                        "address {addr} is not of family {choice:?}"
                    )));
                }
                choice
            }
            (Some(choice), None) => choice,
            (None, Some(addr)) => match Family::of(addr) {
                Family::V4 => api::FamilyChoice::Ipv4,
                Family::V6 => api::FamilyChoice::Ipv6,
            },
            (None, None) => api::FamilyChoice::Ipv4,
        };
        let lease = request.lease_ms.map(Duration::from_millis);
        let scope_name = request.scope;
        let scope = self.scope_mut(&scope_name)?;
        let core_request = Request {
            pool: &pool,
            owner: &request.owner,
            key: key.as_ref(),
            lease,
        };
        let allocations: Vec<Allocation> = match (family, request.address) {
            (_, Some(addr)) => {
                vec![
                    scope
                        .engine
                        .allocate(&core_request, Target::Specific(addr), now)?,
                ]
            }
            (api::FamilyChoice::Dual, None) => {
                scope.engine.allocate_dual(&core_request, now)?.to_vec()
            }
            (api::FamilyChoice::Ipv4, None) => {
                vec![
                    scope
                        .engine
                        .allocate(&core_request, Target::Next(Family::V4), now)?,
                ]
            }
            (api::FamilyChoice::Ipv6, None) => {
                vec![
                    scope
                        .engine
                        .allocate(&core_request, Target::Next(Family::V6), now)?,
                ]
            }
        };
        for a in allocations.iter().filter(|a| !a.existing) {
            writes.push(Write::Put(
                scope_name.clone(),
                StoredAllocation {
                    pool: pool.clone(),
                    addr: a.addr,
                    owner: request.owner.clone(),
                    key: key.clone(),
                    generation: a.generation,
                    lease: a.lease,
                },
            ));
            touched.insert(scope_name.clone());
        }
        Ok(Reply::Allocated(api::AllocateResponse {
            allocations: allocations.iter().map(|a| allocated(&pool, a)).collect(),
        }))
    }

    fn release(
        &mut self,
        request: api::ReleaseRequest,
        now: Timestamp,
        writes: &mut Vec<Write>,
        touched: &mut BTreeSet<String>,
    ) -> Result<Reply, OpError> {
        let given = usize::from(request.key.is_some())
            + usize::from(request.address.is_some())
            + usize::from(request.owner.is_some());
        if given != 1 {
            return Err(OpError::bad_request(
                "give exactly one of key, address (with an optional generation) or owner",
            ));
        }
        if request.generation.is_some() && request.address.is_none() {
            return Err(OpError::bad_request("generation goes with address"));
        }
        let key = request.key.as_ref().map(key_of).transpose()?;
        let scope_name = request.scope;
        let scope = self.scope_mut(&scope_name)?;
        let gone = if let Some(key) = key {
            scope.engine.release_key(&key, now)
        } else if let Some(addr) = request.address {
            match scope.engine.release(addr, request.generation, now) {
                Ok(r) => vec![r],
                // Releasing what is not held is success with nothing released.
                Err(AllocError::NotAllocated { .. }) => Vec::new(),
                Err(error) => return Err(error.into()),
            }
        } else {
            scope
                .engine
                .release_owner(request.owner.as_deref().unwrap_or_default(), now)
        };
        record_released(&scope_name, &gone, writes, touched);
        Ok(Reply::Released(api::ReleaseResponse {
            released: gone.iter().map(released).collect(),
        }))
    }

    /// The scope of a CNI network under the configuration the plugin sent; creates it, or
    /// rebuilds it from the store when the configuration changed (as corral-ipam does on its
    /// own database). A build reads the store, so what the batch holds so far is committed
    /// first: the store must know everything the engines do.
    fn cni_scope(
        &mut self,
        network: &api::CniNetwork,
        writes: &mut Vec<Write>,
        touched: &mut BTreeSet<String>,
    ) -> Result<String, OpError> {
        let name = network.name.clone();
        if name == api::NODE_SCOPE {
            return Err(OpError::bad_request(format!(
                "network name {name:?} is the agent's own scope"
            )));
        }
        let desired = scope_config_of(&network.pools);
        if self.scopes.get(&name).is_some_and(|s| s.config == desired) {
            return Ok(name);
        }
        validate_config(&desired)?;
        self.flush(writes, touched)?;
        let engine_config = self.engine_config();
        let built = (|| {
            let mut txn = self.store.begin()?;
            let (engine, _) = build_engine(&mut txn, &name, &desired, engine_config, Need::Full)?;
            save_engine(&mut txn, &name, &desired, &engine)?;
            txn.commit()?;
            Ok::<_, StoreError>(engine)
        })()
        .map_err(|error| match error {
            // The network's configuration does not fit together (overlapping ranges): the
            // plugin's configuration error, as standalone corral-ipam reports it.
            StoreError::Engine(e) => OpError {
                pool: OpError::from(e.clone()).pool,
                ..OpError::bad_request(format!("network configuration: {e}"))
            },
            StoreError::Corrupt { what, reason } => {
                OpError::bad_request(format!("network configuration: {what}: {reason}"))
            }
            other => OpError::store(other),
        })?;
        self.scopes.insert(
            name.clone(),
            Scope {
                config: desired,
                engine: built,
            },
        );
        Ok(name)
    }

    fn cni_add(
        &mut self,
        request: api::CniAddRequest,
        now: Timestamp,
        writes: &mut Vec<Write>,
        touched: &mut BTreeSet<String>,
    ) -> Result<Reply, OpError> {
        let key = key_of(&request.key)?;
        let pools = request
            .sets
            .iter()
            .map(|s| pool_name(&s.pool))
            .collect::<Result<Vec<_>, _>>()?;
        let name = self.cni_scope(&request.network, writes, touched)?;
        let scope = self.scope_mut(&name)?;
        let wanted: Vec<(Request<'_>, Target)> = request
            .sets
            .iter()
            .zip(&pools)
            .map(|(set, pool)| {
                (
                    Request {
                        pool,
                        owner: &request.owner,
                        key: Some(&key),
                        lease: None,
                    },
                    match set.requested {
                        Some(addr) => Target::Specific(addr),
                        None => Target::Next(family_of(set.family)),
                    },
                )
            })
            .collect();
        let got = scope.engine.allocate_all(&wanted, now).map_err(|error| {
            let set = failed_set(&error, &request.sets, &pools);
            // A family the engine refuses is the network configuration's problem for a CNI
            // caller (standalone corral-ipam says 7), not an unavailable address.
            let base = match &error {
                AllocError::FamilyDisabled { .. } => OpError::bad_request(error.to_string()),
                _ => OpError::from(error),
            };
            OpError { set, ..base }
        })?;
        for (a, pool) in got.iter().zip(&pools).filter(|(a, _)| !a.existing) {
            writes.push(Write::Put(
                name.clone(),
                StoredAllocation {
                    pool: pool.clone(),
                    addr: a.addr,
                    owner: request.owner.clone(),
                    key: Some(key.clone()),
                    generation: a.generation,
                    lease: None,
                },
            ));
            touched.insert(name.clone());
        }
        Ok(Reply::Allocated(api::AllocateResponse {
            allocations: got
                .iter()
                .zip(&pools)
                .map(|(a, pool)| allocated(pool, a))
                .collect(),
        }))
    }

    fn import(&mut self, document: serde_json::Value) -> Result<Reply, OpError> {
        let checkpoint: corral_store::Checkpoint = serde_json::from_value(document)
            .map_err(|e| OpError::bad_request(format!("checkpoint: {e}")))?;
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
        let mut txn = self.store.begin().map_err(OpError::store)?;
        import_checkpoint(&mut txn, &checkpoint).map_err(|error| match error {
            // The store itself failing is worth a retry; anything else is the document.
            StoreError::Backend { .. }
            | StoreError::Directory { .. }
            | StoreError::Lock { .. }
            | StoreError::Held { .. } => OpError::store(error),
            other => OpError::bad_request(format!("checkpoint: {other}")),
        })?;
        txn.commit().map_err(OpError::store)?;
        for name in names {
            let config = {
                let mut txn = self.store.begin().map_err(OpError::store)?;
                let (state, _) = txn.scope_state(&name).map_err(OpError::store)?;
                let stored = state.map(|s| s.config).unwrap_or_default();
                txn.finish().map_err(OpError::store)?;
                match self.scopes.get(&name) {
                    Some(existing) if name == api::NODE_SCOPE => union(&stored, &existing.config),
                    _ => stored,
                }
            };
            self.scopes.insert(
                name.clone(),
                Scope {
                    config,
                    engine: Engine::new(EngineConfig::default()),
                },
            );
            self.reload(&name);
        }
        Ok(Reply::Done)
    }

    fn dump(&self, scope: Option<&str>) -> Result<api::DumpResponse, OpError> {
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

    fn status(
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
                .map(|(name, s)| scope_status(name, &s.engine))
                .collect(),
        })
    }

    fn pools(&self, scope: Option<&str>) -> Result<api::PoolsResponse, OpError> {
        let mut pools = Vec::new();
        for (name, s) in self.selected(scope)? {
            for pool in s.engine.pool_names() {
                let config = s.engine.pool_config(&pool)?;
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
                        })
                        .collect(),
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

    fn gauges(&mut self, now: Timestamp) -> Vec<Gauge> {
        let mut out = Vec::new();
        for (name, s) in &mut self.scopes {
            s.engine.advance(now);
            for pool in s.engine.pool_names() {
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

fn scope_status(name: &str, engine: &Engine) -> api::ScopeStatus {
    api::ScopeStatus {
        scope: name.to_owned(),
        pools: engine
            .pool_names()
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

/// The scope's stored configuration gets an entry for `pool` if it has none (a pool created
/// through the API, or the engine's implicit `default`), so what is added to it is kept.
fn ensure_spec<'a>(scope: &'a mut Scope, pool: &PoolName) -> Result<&'a mut PoolSpec, OpError> {
    let index = match scope
        .config
        .pools
        .iter()
        .position(|p| p.name == pool.as_str())
    {
        Some(index) => index,
        None => {
            let config = scope.engine.pool_config(pool)?;
            scope
                .config
                .pools
                .push(PoolSpec::new(pool, config.cooldown, config.reuse, &[], &[]));
            scope.config.pools.len() - 1
        }
    };
    Ok(&mut scope.config.pools[index])
}

/// The scope's stored configuration of `pool`, if it has one.
fn spec_mut<'a>(scope: &'a mut Scope, pool: &PoolName) -> Option<&'a mut PoolSpec> {
    scope
        .config
        .pools
        .iter_mut()
        .find(|p| p.name == pool.as_str())
}

/// A scope whose engine could not be rebuilt from the store after a failed commit: set
/// aside, its requests answered 503, and rebuilt on its next use.
#[derive(Debug)]
struct Broken {
    config: ScopeConfig,
    /// What the store said when the rebuild failed.
    reason: String,
}

impl Broken {
    fn error(&self, scope: &str) -> OpError {
        OpError::new(
            ErrorCode::RetryLater,
            format!(
                "scope {scope:?} could not be read back from the store after a failed commit: {}",
                self.reason
            ),
        )
    }
}

/// Which set of a CNI ADD an allocation error is about, so the plugin can name it.
fn failed_set(error: &AllocError, sets: &[api::CniSet], pools: &[PoolName]) -> Option<usize> {
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
fn validate_config(config: &ScopeConfig) -> Result<(), OpError> {
    for pool in &config.pools {
        pool_name(&pool.name)?;
        for range in &pool.ranges {
            range
                .parse::<RangeSpec>()
                .map_err(|e| OpError::bad_request(format!("range {range:?}: {e}")))?;
        }
        for (network, reason) in &pool.exclusions {
            Exclusion::parse(network, reason)
                .map_err(|e| OpError::bad_request(format!("exclusion {network:?}: {e}")))?;
        }
    }
    Ok(())
}

fn record_released(
    scope: &str,
    gone: &[Released],
    writes: &mut Vec<Write>,
    touched: &mut BTreeSet<String>,
) {
    for r in gone {
        writes.push(Write::Delete(scope.to_owned(), r.addr));
    }
    if !gone.is_empty() {
        touched.insert(scope.to_owned());
    }
}

/// A lease changed on an allocation: its row is written again.
fn rewrite_row(
    scope_name: &str,
    scope: &Scope,
    addr: IpAddr,
    writes: &mut Vec<Write>,
    touched: &mut BTreeSet<String>,
) {
    if let Some(info) = scope.engine.lookup(addr) {
        writes.push(Write::Delete(scope_name.to_owned(), addr));
        writes.push(Write::Put(
            scope_name.to_owned(),
            StoredAllocation {
                pool: info.pool,
                addr,
                owner: info.entry.owner,
                key: info.entry.key,
                generation: info.entry.generation,
                lease: info.entry.lease,
            },
        ));
        touched.insert(scope_name.to_owned());
    }
}

/// One transaction: the rows in order, then the derived state of every touched scope.
fn persist(
    store: &mut SqliteStore,
    scopes: &BTreeMap<String, Scope>,
    writes: &[Write],
    touched: &BTreeSet<String>,
) -> Result<(), StoreError> {
    let mut txn = store.begin()?;
    for write in writes {
        match write {
            Write::Put(scope, row) => txn.put_allocation(scope, row)?,
            Write::Delete(scope, addr) => txn.delete_allocation(scope, *addr)?,
        }
    }
    for name in touched {
        if let Some(scope) = scopes.get(name) {
            save_engine(&mut txn, name, &scope.config, &scope.engine)?;
        }
    }
    txn.commit()
}

#[cfg(test)]
mod tests {
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
}
