//! Building an engine from stored state, and storing its derived state back.
//!
//! A *partial* engine is what a CNI call needs: the configuration, each pool's snapshot, the
//! cooldowns, and only the allocations it will touch (one attachment's, a requested
//! address's). It costs the same however many allocations the scope holds. A *full* engine
//! reads every allocation; it is built when the configuration changed, when the stored state
//! is missing or corrupt, and for operations that need everything (GC, dump).

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Exclusion, PoolConfig, PoolName, RangeSpec,
    RestoredAllocation, ReusePolicy,
};

use crate::{RangeState, ScopeConfig, ScopeState, StoreError, StoredAllocation, Txn};

/// What an engine must know.
#[derive(Clone, Copy, Debug)]
pub enum Need<'a> {
    /// Every allocation.
    Full,
    /// The allocations of these attachments and addresses; the rest only as occupancy.
    Partial {
        keys: &'a [AttachmentKey],
        addrs: &'a [IpAddr],
    },
}

fn corrupt(what: &str, reason: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

fn restored(allocation: StoredAllocation) -> RestoredAllocation {
    RestoredAllocation {
        pool: allocation.pool,
        addr: allocation.addr,
        owner: allocation.owner,
        key: allocation.key,
        generation: allocation.generation,
        lease: allocation.lease,
    }
}

/// An engine in its restore phase holding the configured pools, ranges and exclusions.
fn configured(config: &ScopeConfig, engine_config: EngineConfig) -> Result<Engine, StoreError> {
    let mut engine = Engine::restoring(engine_config);
    for pool in &config.pools {
        let name = PoolName::new(&pool.name).map_err(|e| corrupt("pool name", e))?;
        let pool_config = PoolConfig {
            cooldown: Duration::from_millis(pool.cooldown_ms),
            reuse: if pool.lowest_free {
                ReusePolicy::LowestFree
            } else {
                ReusePolicy::NextFit
            },
        };
        if engine.pool_names().contains(&name) {
            engine.set_pool_config(&name, pool_config)?;
        } else {
            engine.add_pool(&name, pool_config)?;
        }
        for range in pool.ranges.iter().filter(|r| r.in_engine()) {
            let spec: RangeSpec = range.range.parse().map_err(|e| corrupt("range", e))?;
            engine.add_range(&name, spec)?;
        }
        for (network, reason) in &pool.exclusions {
            let exclusion =
                Exclusion::parse(network, reason).map_err(|e| corrupt("exclusion", e))?;
            engine.exclude(&name, exclusion)?;
        }
    }
    Ok(engine)
}

fn ensure_pool(engine: &mut Engine, pool: &PoolName) -> Result<(), StoreError> {
    if !engine.pool_names().contains(pool) {
        engine.add_pool(pool, PoolConfig::default())?;
    }
    Ok(())
}

/// Tries the partial build; `Ok(None)` means the stored state does not fit and a full build
/// is needed.
fn partial(
    txn: &mut impl Txn,
    scope: &str,
    state: &ScopeState,
    engine_config: EngineConfig,
    keys: &[AttachmentKey],
    addrs: &[IpAddr],
) -> Result<Option<Engine>, StoreError> {
    let mut engine = configured(&state.config, engine_config)?;
    for (pool, snapshot) in &state.snapshots {
        ensure_pool(&mut engine, pool)?;
        if engine.restore_pool_snapshot(pool, snapshot).is_err() {
            return Ok(None);
        }
    }
    let mut rows = Vec::new();
    for key in keys {
        rows.extend(txn.allocations_by_key(scope, key)?);
    }
    for &addr in addrs {
        rows.extend(txn.allocation_by_addr(scope, addr)?);
    }
    rows.sort_by_key(|row| (corral_core::Family::of(row.addr), row.addr));
    rows.dedup_by_key(|row| row.addr);
    for row in rows {
        if ensure_pool(&mut engine, &row.pool).is_err()
            || engine.restore_allocation_accounted(&restored(row)).is_err()
        {
            return Ok(None);
        }
    }
    for (pool, addr, at) in &state.cooling {
        ensure_pool(&mut engine, pool)?;
        engine.restore_cooling(pool, *addr, *at)?;
    }
    engine.restore_generation(state.next_generation);
    engine.finish_restore();
    Ok(Some(engine))
}

/// Builds the engine of `scope` under the `desired` configuration.
///
/// Returns the engine and whether it is full (holds every allocation). A partial build is
/// used when `need` allows it and the stored state was taken under the same configuration;
/// otherwise every allocation is read, which also reconciles a changed configuration:
/// allocations outside the new ranges are kept (as allocations outside active ranges) until
/// released, and never handed out again.
pub fn build_engine(
    txn: &mut impl Txn,
    scope: &str,
    desired: &ScopeConfig,
    engine_config: EngineConfig,
    need: Need<'_>,
) -> Result<(Engine, bool), StoreError> {
    let (state, _corrupt) = txn.scope_state(scope)?;
    if let (Need::Partial { keys, addrs }, Some(state)) = (need, &state)
        && state.config == *desired
        && let Some(engine) = partial(txn, scope, state, engine_config, keys, addrs)?
    {
        return Ok((engine, false));
    }
    let mut engine = configured(desired, engine_config)?;
    for row in txn.all_allocations(scope)? {
        ensure_pool(&mut engine, &row.pool)?;
        // Stored rows that do not fit together are damaged state, not the caller's request.
        engine
            .restore_allocation(&restored(row))
            .map_err(|e| corrupt("allocations", e))?;
    }
    if let Some(state) = &state {
        for (pool, snapshot) in &state.snapshots {
            ensure_pool(&mut engine, pool)?;
            engine.restore_cursors(pool, snapshot)?;
        }
        for (pool, addr, at) in &state.cooling {
            ensure_pool(&mut engine, pool)?;
            engine.restore_cooling(pool, *addr, *at)?;
        }
        engine.restore_generation(state.next_generation);
    }
    drain_configured(&mut engine, desired)?;
    engine.finish_restore();
    Ok((engine, true))
}

/// Drains the ranges the configuration says are draining, once every allocation is in: one
/// that holds nothing any more leaves the engine at once, and [`Engine::take_drained`]
/// reports it, so the caller forgets it in its configuration too.
fn drain_configured(engine: &mut Engine, config: &ScopeConfig) -> Result<(), StoreError> {
    for pool in &config.pools {
        let name = PoolName::new(&pool.name).map_err(|e| corrupt("pool name", e))?;
        for range in &pool.ranges {
            if matches!(range.state, RangeState::Draining | RangeState::Withdrawn) {
                let spec: RangeSpec = range.range.parse().map_err(|e| corrupt("range", e))?;
                engine.remove_range(&name, &spec)?;
            }
        }
    }
    Ok(())
}

/// Stores the engine's derived state for `scope`, taken under `config`.
pub fn save_engine(
    txn: &mut impl Txn,
    scope: &str,
    config: &ScopeConfig,
    engine: &Engine,
) -> Result<(), StoreError> {
    let mut snapshots = Vec::new();
    let mut cooling = Vec::new();
    for pool in engine.pool_names() {
        snapshots.push((pool.clone(), engine.pool_snapshot(&pool)?));
        for (addr, at) in engine.cooling(&pool)? {
            cooling.push((pool.clone(), addr, at));
        }
    }
    txn.put_scope_state(
        scope,
        &ScopeState {
            config: config.clone(),
            next_generation: engine.next_generation(),
            snapshots,
            cooling,
        },
    )
}
