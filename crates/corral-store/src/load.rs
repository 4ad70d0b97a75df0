//! Building an engine from stored state, and storing its derived state back.
//!
//! A *partial* engine is what a CNI call needs: the configuration, each pool's snapshot, only
//! the allocations it will touch (one attachment's, a requested address's), and only the
//! cooldowns it may act on: those that have run out by `now` (at most
//! [`EXPIRED_PER_BUILD`] per pool and family, oldest first) and the oldest one still running,
//! which is handed out when nothing else is free. Every other cooling address stays blocked in
//! the snapshot's occupancy, as every other allocation does, so a call costs the same whether
//! the scope holds ten allocations or sixty thousand, and ten cooldowns or thousands. A *full*
//! engine reads every allocation and every cooldown; it is built when the configuration
//! changed, when the stored state is missing or corrupt, and for operations that need
//! everything (GC, dump, the agent).
//!
//! Cooldowns are rows of their own (see [`Txn::put_cooldown`]), kept equal to the engine's
//! cooling addresses by three rules: a cooldown starts only when an allocation is released,
//! and every release deletes its row in the same transaction, so [`save_engine`] writes a
//! cooldown for each address the transaction released that is now cooling; recording an
//! allocation deletes any cooldown at its address (the store does this in
//! [`Txn::put_allocation`]); and cooldowns end oldest first, so a full engine deletes the rows
//! older than its oldest cooldown, while a partial build deletes the rows it read and ended.
//! What else ends a cooldown (an exclusion, a range removed, a gateway) changes the
//! configuration, and a full engine saved under another configuration than the stored one
//! rewrites the scope's cooldowns.

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Exclusion, Family, PoolConfig, PoolName, RangeSpec,
    ReusePolicy, Timestamp,
};

use crate::{RangeState, ScopeConfig, ScopeState, StoreError, StoredCooldown, Txn};

/// How many cooldowns that have run out a partial build ends, per pool and family. Each one
/// ended is a row deleted (a page of the log written, the rows lying by address), so the cost
/// of a call stays bounded however many cooldowns end at once; the rest stay blocked until a
/// later call ends them.
pub const EXPIRED_PER_BUILD: usize = 16;

/// What an engine must know.
#[derive(Clone, Copy, Debug)]
pub enum Need<'a> {
    /// Every allocation and cooldown.
    Full,
    /// The allocations of these attachments and addresses, and the cooldowns an operation at
    /// `now` may act on; the rest only as occupancy.
    Partial {
        keys: &'a [AttachmentKey],
        addrs: &'a [IpAddr],
        now: Timestamp,
    },
}

fn corrupt(what: &str, reason: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: what.to_owned(),
        reason: reason.to_string(),
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
    now: Timestamp,
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
    rows.sort_by_key(|row| (Family::of(row.addr), row.addr));
    rows.dedup_by_key(|row| row.addr);
    for row in rows {
        if ensure_pool(&mut engine, &row.pool).is_err()
            || engine.restore_allocation_accounted(&row).is_err()
        {
            return Ok(None);
        }
    }
    // Only the cooldowns this call may act on: those that ran out (to free them) and the
    // oldest still running (handed out when nothing else is free). The snapshot blocks the
    // others already.
    let mut read = Vec::new();
    for (pool, snapshot) in &state.snapshots {
        let cooldown = engine.pool_config(pool)?.cooldown;
        let ran_out_by = Timestamp::from_unix_millis(
            now.as_unix_millis()
                .saturating_sub(u64::try_from(cooldown.as_millis()).unwrap_or(u64::MAX)),
        );
        for family in Family::ALL {
            if !snapshot.ranges.iter().any(|r| r.spec.family() == family) {
                continue;
            }
            for cooling in
                txn.oldest_cooldowns(scope, pool, family, ran_out_by, EXPIRED_PER_BUILD)?
            {
                engine.restore_cooling(&cooling.pool, cooling.addr, cooling.released_at)?;
                read.push(cooling);
            }
        }
    }
    engine.restore_generation(state.next_generation);
    engine.finish_restore();
    // Time passes before anything is decided: the cooldowns read that ran out end here, and
    // so do their rows, in the same transaction as the snapshot that frees their addresses.
    engine.advance(now);
    for cooling in read {
        if engine.cooldown(cooling.addr) != Some((cooling.pool, cooling.released_at)) {
            txn.delete_cooldown(scope, cooling.addr)?;
        }
    }
    Ok(Some(engine))
}

/// Builds the engine of `scope` under the `desired` configuration.
///
/// Returns the engine and whether it is full (holds every allocation and cooldown). A partial
/// build is used when `need` allows it and the stored state was taken under the same
/// configuration; otherwise every allocation is read, which also reconciles a changed
/// configuration: allocations outside the new ranges are kept (as allocations outside active
/// ranges) until released, and never handed out again.
///
/// A partial build ends the cooldowns it read that ran out by `now`, deleting their rows in
/// `txn`: the caller commits them with the snapshot [`save_engine`] writes, or drops both.
pub fn build_engine(
    txn: &mut impl Txn,
    scope: &str,
    desired: &ScopeConfig,
    engine_config: EngineConfig,
    need: Need<'_>,
) -> Result<(Engine, bool), StoreError> {
    let (state, _corrupt) = txn.scope_state(scope)?;
    if let (Need::Partial { keys, addrs, now }, Some(state)) = (need, &state)
        && state.config == *desired
        && let Some(engine) = partial(txn, scope, state, engine_config, keys, addrs, now)?
    {
        return Ok((engine, false));
    }
    let mut engine = configured(desired, engine_config)?;
    for row in txn.all_allocations(scope)? {
        ensure_pool(&mut engine, &row.pool)?;
        // Stored rows that do not fit together are damaged state, not the caller's request.
        engine
            .restore_allocation(&row)
            .map_err(|e| corrupt("allocations", e))?;
    }
    if let Some(state) = &state {
        for (pool, snapshot) in &state.snapshots {
            ensure_pool(&mut engine, pool)?;
            engine.restore_cursors(pool, snapshot)?;
        }
        engine.restore_generation(state.next_generation);
    }
    // A cooldown of a pool that is no longer configured ended with the pool (the engine
    // ignores those of addresses that are no longer free capacity of their pool).
    let pools = engine.pool_names();
    for cooling in txn.cooldowns(scope)? {
        if pools.contains(&cooling.pool) {
            engine.restore_cooling(&cooling.pool, cooling.addr, cooling.released_at)?;
        }
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

/// Stores the engine's derived state for `scope`, taken under `config`: the scope's state row
/// and the changes to its cooldowns (see the module documentation). `txn` must be the
/// transaction that deleted the rows of the allocations the engine released.
pub fn save_engine(
    txn: &mut impl Txn,
    scope: &str,
    config: &ScopeConfig,
    engine: &Engine,
) -> Result<(), StoreError> {
    let pools = engine.pool_names();
    let mut snapshots = Vec::with_capacity(pools.len());
    for pool in &pools {
        snapshots.push((pool.clone(), engine.pool_snapshot(pool)?));
    }
    // A full engine saved under another configuration than the stored one may have ended
    // cooldowns for it (an exclusion, a range removed): its cooldowns replace the stored ones.
    let rewrite = !engine.is_partial() && txn.stored_config(scope)?.as_ref() != Some(config);
    txn.put_scope_state(
        scope,
        &ScopeState {
            config: config.clone(),
            next_generation: engine.next_generation(),
            snapshots,
        },
    )?;
    if rewrite {
        return rewrite_cooldowns(txn, scope, engine);
    }
    if !engine.is_partial() {
        // A full engine knows every cooldown, and cooldowns end oldest first (a pool's all
        // last as long): the rows released before its oldest have ended.
        for pool in &pools {
            for family in Family::ALL {
                let oldest = engine.oldest_cooling(pool, family)?.map(|(_, at)| at);
                txn.delete_cooldowns_before(scope, pool, family, oldest)?;
            }
        }
    }
    for addr in txn.released_addresses(scope) {
        if let Some((pool, released_at)) = engine.cooldown(addr) {
            txn.put_cooldown(
                scope,
                &StoredCooldown {
                    pool,
                    addr,
                    released_at,
                },
            )?;
        }
    }
    Ok(())
}

/// Replaces the scope's stored cooldowns with the (full) engine's.
pub(crate) fn rewrite_cooldowns(
    txn: &mut impl Txn,
    scope: &str,
    engine: &Engine,
) -> Result<(), StoreError> {
    txn.delete_cooldowns(scope)?;
    for pool in engine.pool_names() {
        for (addr, released_at) in engine.cooling(&pool)? {
            txn.put_cooldown(
                scope,
                &StoredCooldown {
                    pool: pool.clone(),
                    addr,
                    released_at,
                },
            )?;
        }
    }
    Ok(())
}
