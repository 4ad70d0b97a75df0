//! A scope as the node state keeps it: its stored configuration, its engine and its
//! interface tables, the rows a change writes ([`Write`]), what a batch changed so far
//! ([`Changes`], the one argument every operation records into) and how it persists them, and
//! the small edits every operation makes to a scope's stored configuration. Plain data and
//! functions over it, below everything that runs operations.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{Engine, Family, Interfaces, PoolName, Released, Timestamp};
use corral_store::{
    HistoryKind, HistoryLimits, HistoryRecord, PoolSpec, RangeEntry, RangeSource, ScopeConfig,
    Store, StoreError, StoredAllocation, Txn, save_engine,
};

use super::wire::family_name;
use crate::capacity;
use crate::error::OpError;

pub(super) struct Scope {
    pub(super) config: ScopeConfig,
    pub(super) engine: Engine,
    /// The interface-backed pools' tables (`interfaces.rs`), from `config`.
    pub(super) interfaces: BTreeMap<PoolName, Interfaces>,
}

impl Scope {
    /// A scope of an engine built from `config`, with the interface tables `config` holds.
    pub(super) fn new(config: ScopeConfig, mut engine: Engine) -> Result<Scope, StoreError> {
        let interfaces = tables_of(&config, &engine)?;
        // State written before trunk and excluded interfaces' addresses were stored as
        // exclusions gets them here (idempotent: the stored ones are the same).
        for table in interfaces.values() {
            table
                .exclude_reserved(&mut engine)
                .map_err(|e| StoreError::Corrupt {
                    what: format!("exclusions of the interfaces of pool {}", table.pool()),
                    reason: e.to_string(),
                })?;
        }
        Ok(Scope {
            config,
            engine,
            interfaces,
        })
    }

    /// Adds the configuration file's ranges that were kept out by a range of another pool
    /// which has since left (see [`capacity::now_applicable`]); returns whether any was.
    pub(super) fn adopt_file_ranges(&mut self, declared: &ScopeConfig) -> bool {
        let mut adopted = false;
        for (pool, spec) in capacity::now_applicable(&self.config, declared) {
            let Ok(pool_name) = PoolName::new(&pool) else {
                continue;
            };
            if !self.engine.pool_names().contains(&pool_name)
                && self
                    .engine
                    .add_pool(&pool_name, Default::default())
                    .is_err()
            {
                continue;
            }
            if self.engine.add_range(&pool_name, spec).is_ok()
                && let Some(stored) = self.config.pools.iter_mut().find(|p| p.name == pool)
            {
                stored
                    .ranges
                    .push(RangeEntry::new(&spec, RangeSource::File));
                adopted = true;
            }
        }
        adopted
    }

    /// The pools worth showing: those the configuration names, and any other that holds
    /// allocations (the engine's implicit `default` pool of a CNI network is neither).
    pub(super) fn visible_pools(&self) -> Vec<PoolName> {
        self.engine
            .pool_names()
            .into_iter()
            .filter(|pool| {
                self.config.pools.iter().any(|p| p.name == pool.as_str())
                    || [Family::V4, Family::V6].into_iter().any(|family| {
                        self.engine
                            .stats(pool, family)
                            .is_ok_and(|stats| stats.used > 0)
                    })
            })
            .collect()
    }
}

/// The node scope's configuration after importing `imported` into it (while it holds no
/// allocation): its pools as they are, with the imported pools' ranges and exclusions added.
/// Imported ranges keep their source, except that bare ones (written by builds before ranges
/// had a source) are classified by the configuration file, as at start.
pub(super) fn combine_node(
    existing: &ScopeConfig,
    imported: &ScopeConfig,
    declared: &ScopeConfig,
) -> ScopeConfig {
    let mut imported = imported.clone();
    capacity::classify_imported(&mut imported, declared);
    let mut out = existing.clone();
    for pool in imported.pools {
        match out.pools.iter_mut().find(|p| p.name == pool.name) {
            Some(target) => {
                for entry in pool.ranges {
                    match entry.spec().and_then(|spec| target.entry_at(&spec)) {
                        Some(index) => target.ranges[index] = entry,
                        None => target.ranges.push(entry),
                    }
                }
                for exclusion in pool.exclusions {
                    target.exclusions.retain(|e| e.0 != exclusion.0);
                    target.exclusions.push(exclusion);
                }
            }
            None => out.pools.push(pool),
        }
    }
    out
}

/// The scope's stored configuration gets an entry for `pool` if it has none (a pool created
/// through the API, or the engine's implicit `default`), so what is added to it is kept.
pub(super) fn ensure_spec<'a>(
    scope: &'a mut Scope,
    pool: &PoolName,
) -> Result<&'a mut PoolSpec, OpError> {
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
pub(super) fn spec_mut<'a>(scope: &'a mut Scope, pool: &PoolName) -> Option<&'a mut PoolSpec> {
    scope
        .config
        .pools
        .iter_mut()
        .find(|p| p.name == pool.as_str())
}

/// A scope whose engine could not be rebuilt from the store after a failed commit: set
/// aside, its requests answered 503, and rebuilt on its next use.
#[derive(Debug)]
pub(super) struct Broken {
    pub(super) config: ScopeConfig,
    /// What the store said when the rebuild failed.
    pub(super) reason: String,
}

impl Broken {
    pub(super) fn error(&self, scope: &str) -> OpError {
        OpError::new(
            ErrorCode::RetryLater,
            format!(
                "scope {scope:?} could not be read back from the store after a failed commit: {}",
                self.reason
            ),
        )
    }
}

/// A change to a row, in the order the batch made it.
#[derive(Debug)]
pub(super) enum Write {
    /// An allocation: its row, and an event of the history.
    Put(String, StoredAllocation),
    /// A release: the row goes, and an event of this kind is recorded (from what the engine
    /// released, which is what the row held: no read of the row).
    Delete(String, Released, HistoryKind),
    /// The same allocation written again (its lease changed): no event.
    Rewrite(String, StoredAllocation),
}

/// What a batch changed since its last commit, made durable together by the next one
/// (`NodeState::flush`): the rows to write, in order, and the scopes whose stored
/// configuration and engine state are saved again.
#[derive(Debug, Default)]
pub(super) struct Changes {
    pub writes: Vec<Write>,
    pub touched: BTreeSet<String>,
}

impl Changes {
    /// Nothing to commit.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.touched.is_empty()
    }

    /// Forgets everything (the batch is reloaded from the store).
    pub fn clear(&mut self) {
        self.writes.clear();
        self.touched.clear();
    }
}

/// The rows of the allocations `gone` go, each recorded in the history as `kind`.
pub(super) fn record_released(
    scope: &str,
    gone: &[Released],
    kind: HistoryKind,
    changes: &mut Changes,
) {
    for r in gone {
        changes
            .writes
            .push(Write::Delete(scope.to_owned(), r.clone(), kind));
    }
    if !gone.is_empty() {
        changes.touched.insert(scope.to_owned());
    }
}

/// A lease changed on an allocation: its row is written again.
pub(super) fn rewrite_row(scope_name: &str, scope: &Scope, addr: IpAddr, changes: &mut Changes) {
    if let Some(info) = scope.engine.lookup(addr) {
        changes.writes.push(Write::Rewrite(
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
        changes.touched.insert(scope_name.to_owned());
    }
}

/// One transaction: the rows in order with their events of the history (at `now`, unless
/// `history` keeps none), the derived state of every touched scope, and the history pruned
/// to its bounds (in batches: most commits only look).
pub(super) fn persist<S: Store>(
    store: &mut S,
    scopes: &BTreeMap<String, Scope>,
    changes: &Changes,
    (now, history): (Timestamp, &HistoryLimits),
) -> Result<(), StoreError> {
    let mut txn = store.begin()?;
    let recording = history.max_events > 0;
    for write in &changes.writes {
        match write {
            Write::Put(scope, row) => {
                txn.put_allocation(scope, row)?;
                if recording {
                    txn.record(HistoryRecord::of(now, HistoryKind::Allocated, scope, row))?;
                }
            }
            Write::Delete(scope, released, kind) => {
                if recording {
                    txn.record(HistoryRecord {
                        at: now,
                        kind: *kind,
                        scope,
                        pool: &released.pool,
                        addr: released.addr,
                        key: released.key.as_ref(),
                        owner: &released.owner,
                        generation: released.generation,
                    })?;
                }
                txn.delete_allocation(scope, released.addr)?;
            }
            Write::Rewrite(scope, row) => {
                txn.delete_allocation(scope, row.addr)?;
                txn.put_allocation(scope, row)?;
            }
        }
    }
    for name in &changes.touched {
        if let Some(scope) = scopes.get(name) {
            save_engine(&mut txn, name, &scope.config, &scope.engine)?;
        }
    }
    if !changes.writes.is_empty() {
        txn.prune_history(history, now)?;
    }
    txn.commit()
}

/// The interface tables of a scope, rebuilt from its stored configuration after the engine
/// was built from the same configuration, and checked against it (`restore_interfaces`).
pub(super) fn tables_of(
    config: &ScopeConfig,
    engine: &Engine,
) -> Result<BTreeMap<PoolName, Interfaces>, StoreError> {
    Ok(corral_store::restore_interfaces(config, engine)?
        .into_iter()
        .map(|table| (table.pool().clone(), table))
        .collect())
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
