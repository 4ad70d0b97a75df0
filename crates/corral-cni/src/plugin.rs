//! The verbs of corral-ipam on the embedded store: one exclusive, durable transaction each.
//!
//! ADD, DEL, CHECK and STATUS build a partial engine (the network's snapshot plus the rows of
//! one attachment), so their cost does not grow with the allocations held; GC reads all.

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AllocError, Engine, EngineConfig, Family, PoolConfig, PoolName, Request, ReusePolicy, Target,
    Timestamp,
};
use corral_store::{
    Need, PoolSpec, ScopeConfig, SqliteStore, Store, StoreError, StoredAllocation, Txn,
    build_engine, host_local_allocations, read_host_local_dir, save_engine,
};

use crate::{Attachment, CniError, IpamResult, NetConfig, parse_resolv_conf};

fn store_error(error: StoreError) -> CniError {
    match error {
        StoreError::Engine(error) => CniError::from(error),
        // A running agent owns the directory (and keeps it locked until it stops).
        StoreError::Held { .. } => CniError::new(
            CniError::TRY_AGAIN_LATER,
            error.to_string(),
            "set \"agent\" in the ipam configuration to the agent's socket, or stop the agent",
        ),
        other => CniError::store(other),
    }
}

fn engine_error(error: AllocError) -> CniError {
    CniError::from(error)
}

/// The network's pools as the store keeps them: one per pool name, with every range of the
/// range sets that name it.
pub fn scope_config(config: &NetConfig) -> ScopeConfig {
    let cooldown = config
        .ipam
        .cooldown_seconds
        .map(Duration::from_secs)
        .unwrap_or(PoolConfig::DEFAULT_COOLDOWN);
    let mut pools: Vec<(PoolName, Vec<corral_core::RangeSpec>)> = Vec::new();
    for set in &config.ipam.range_sets {
        match pools.iter_mut().find(|(name, _)| *name == set.pool) {
            Some((_, ranges)) => ranges.extend(set.ranges.iter().copied()),
            None => pools.push((set.pool.clone(), set.ranges.clone())),
        }
    }
    ScopeConfig {
        pools: pools
            .iter()
            .map(|(name, ranges)| {
                PoolSpec::new(
                    name,
                    cooldown,
                    ReusePolicy::NextFit,
                    ranges,
                    &config.ipam.exclude,
                )
            })
            .collect(),
    }
}

/// The network's engine inside `txn` (see [`build_engine`]); store errors become CNI errors.
fn load_engine(
    txn: &mut impl Txn,
    config: &NetConfig,
    desired: &ScopeConfig,
    now: Timestamp,
    need: Need<'_>,
) -> Result<Engine, CniError> {
    build_engine(txn, &config.name, desired, engine_config(now), need)
        .map(|(engine, _)| engine)
        .map_err(store_error)
}

fn engine_config(now: Timestamp) -> EngineConfig {
    EngineConfig {
        lease_id_seed: now.as_unix_millis() ^ u64::from(std::process::id()).rotate_left(32),
        ..EngineConfig::default()
    }
}

/// The network's store for this one call: the state directory stays locked until
/// [`close`], which syncs what was committed; no answer may be given before it returns.
fn open(config: &NetConfig) -> Result<SqliteStore, CniError> {
    let mut store = SqliteStore::open_one_shot(&config.ipam.data_dir).map_err(|error| {
        let held = matches!(error, StoreError::Held { .. });
        let error = store_error(error);
        if held {
            error
        } else {
            error.context(&format!(
                "state directory {}",
                config.ipam.data_dir.display()
            ))
        }
    })?;
    import_host_local(&mut store, config)?;
    Ok(store)
}

/// Releases the state directory, then makes this call's commits durable.
fn close(store: SqliteStore) -> Result<(), CniError> {
    store.close().map_err(store_error)
}

/// The first time corral-ipam serves a network whose host-local directory exists
/// (`dataDir/<network>/`, host-local's own layout), it takes over every address recorded
/// there, so replacing `host-local` by `corral-ipam` in a configuration loses nothing.
/// host-local's files are left as they are.
fn import_host_local(store: &mut SqliteStore, config: &NetConfig) -> Result<(), CniError> {
    let dir = config.ipam.data_dir.join(&config.name);
    if !dir.is_dir() {
        return Ok(());
    }
    let scope = config.name.as_str();
    // Once the network has state, host-local's files (left in place) need no second look,
    // and no transaction: this runs on every call.
    if store.has_scope(scope).map_err(store_error)? {
        return Ok(());
    }
    let mut txn = store.begin().map_err(store_error)?;
    // Checked again under the lock: another process may have imported meanwhile.
    let (state, corrupt) = txn.scope_state(scope).map_err(store_error)?;
    if state.is_some() || corrupt.is_some() {
        return Ok(());
    }
    let Some(entries) = read_host_local_dir(&dir).map_err(store_error)? else {
        return Ok(());
    };
    let fallback = config
        .ipam
        .range_sets
        .first()
        .map(|set| set.pool.clone())
        .unwrap_or_else(PoolName::default_pool);
    let rows = host_local_allocations(scope, &entries, |addr| {
        config
            .ipam
            .range_sets
            .iter()
            .find(|set| set.contains(addr))
            .or_else(|| {
                config
                    .ipam
                    .range_sets
                    .iter()
                    .find(|set| set.family == Family::of(addr))
            })
            .map(|set| set.pool.clone())
            .unwrap_or_else(|| fallback.clone())
    });
    for row in &rows {
        txn.put_allocation(scope, row).map_err(store_error)?;
    }
    let desired = scope_config(config);
    let (engine, _) = build_engine(
        &mut txn,
        scope,
        &desired,
        engine_config(Timestamp::ZERO),
        Need::Full,
    )
    .map_err(store_error)?;
    save_engine(&mut txn, scope, &desired, &engine).map_err(store_error)?;
    txn.commit().map_err(store_error)
}

/// ADD: one address from each range set (the requested one where asked), all or nothing.
pub fn add(attachment: &Attachment, now: Timestamp) -> Result<String, CniError> {
    let config = &attachment.config;
    // Everything that can fail without touching the store comes first.
    let mut result = IpamResult {
        routes: config.ipam.routes.clone(),
        ..IpamResult::default()
    };
    if let Some(path) = &config.ipam.resolv_conf {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CniError::io(format!("cannot read resolvConf {}: {e}", path.display())))?;
        result.dns = parse_resolv_conf(&text);
    }
    if let Some(socket) = &config.ipam.agent {
        crate::agent::add(socket, attachment, &mut result)?;
        return Ok(result.to_json(config.cni_version));
    }
    let mut store = open(config)?;
    // The snapshot and the rows are written together, so they agree; should they ever not
    // (the database refuses an address the snapshot thought free), the allocation is decided
    // again from every row, which also rewrites the snapshot.
    match add_in(&mut store, attachment, now, false, &mut result) {
        Err(AddError::Taken(_)) => {
            add_in(&mut store, attachment, now, true, &mut result).map_err(|error| match error {
                AddError::Taken(error) | AddError::Other(error) => error,
            })?
        }
        Err(AddError::Other(error)) => return Err(error),
        Ok(()) => {}
    }
    close(store)?;
    Ok(result.to_json(config.cni_version))
}

enum AddError {
    /// The database refused an address as already held.
    Taken(CniError),
    Other(CniError),
}

impl From<CniError> for AddError {
    fn from(error: CniError) -> AddError {
        AddError::Other(error)
    }
}

fn add_in(
    store: &mut SqliteStore,
    attachment: &Attachment,
    now: Timestamp,
    full: bool,
    result: &mut IpamResult,
) -> Result<(), AddError> {
    let config = &attachment.config;
    let scope = config.name.as_str();
    let desired = scope_config(config);
    let mut txn = store.begin().map_err(store_error)?;
    let keys = [attachment.key.clone()];
    let requested: Vec<IpAddr> = config
        .ipam
        .range_sets
        .iter()
        .filter_map(|s| s.requested)
        .collect();
    let need = if full {
        Need::Full
    } else {
        Need::Partial {
            keys: &keys,
            addrs: &requested,
            now,
        }
    };
    let mut engine = load_engine(&mut txn, config, &desired, now, need)?;
    let owner = attachment.owner();
    let mut ips = Vec::new();
    let mut fresh = Vec::new();
    for set in &config.ipam.range_sets {
        let request = Request {
            pool: &set.pool,
            owner: &owner,
            key: Some(&attachment.key),
            lease: None,
        };
        let target = match set.requested {
            Some(addr) => Target::Specific(addr),
            None => Target::Next(set.family),
        };
        // Nothing is committed unless every set succeeds, so an error here leaves the store
        // as it was.
        let allocation = engine
            .allocate(&request, target, now)
            .map_err(|error| engine_error(error).context(&set.field))?;
        let ip = set.ip_config(allocation.addr).ok_or_else(|| {
            if allocation.existing {
                // The configuration changed under a live attachment.
                CniError::new(
                    CniError::ATTACHMENT_CONFLICT,
                    format!(
                        "attachment {} holds {}, which no range of {} contains any more",
                        attachment.key, allocation.addr, set.field
                    ),
                    "DEL the attachment and ADD it again to get an address from the new ranges",
                )
            } else {
                CniError::internal(format!(
                    "{} was handed out from {} but lies in none of its ranges",
                    allocation.addr, set.field
                ))
            }
        })?;
        ips.push(ip);
        if !allocation.existing {
            fresh.push(StoredAllocation {
                pool: set.pool.clone(),
                addr: allocation.addr,
                owner: owner.clone(),
                key: Some(attachment.key.clone()),
                generation: allocation.generation,
                lease: None,
            });
        }
    }
    if !fresh.is_empty() {
        for row in &fresh {
            txn.put_allocation(scope, row)
                .map_err(|error| match error {
                    StoreError::Taken { .. } => AddError::Taken(store_error(error)),
                    other => AddError::Other(store_error(other)),
                })?;
        }
        save_engine(&mut txn, scope, &desired, &engine).map_err(store_error)?;
        txn.commit().map_err(store_error)?;
    } else {
        // Every address was already the attachment's: answered from what was read.
        txn.finish().map_err(store_error)?;
    }
    result.ips = ips;
    Ok(())
}

/// DEL: releases every address of the attachment; releasing nothing is success.
pub fn del(attachment: &Attachment, now: Timestamp) -> Result<(), CniError> {
    let config = &attachment.config;
    if let Some(socket) = &config.ipam.agent {
        return crate::agent::del(socket, attachment);
    }
    let scope = config.name.as_str();
    let desired = scope_config(config);
    let mut store = open(config)?;
    let mut txn = store.begin().map_err(store_error)?;
    let keys = [attachment.key.clone()];
    let mut engine = load_engine(
        &mut txn,
        config,
        &desired,
        now,
        Need::Partial {
            keys: &keys,
            addrs: &[],
            now,
        },
    )?;
    let released = engine.release_key(&attachment.key, now);
    if released.is_empty() {
        // Nothing to release, as read: answered only once what was read is durable.
        txn.finish().map_err(store_error)?;
    } else {
        for r in &released {
            txn.delete_allocation(scope, r.addr).map_err(store_error)?;
        }
        save_engine(&mut txn, scope, &desired, &engine).map_err(store_error)?;
        txn.commit().map_err(store_error)?;
    }
    close(store)
}

/// CHECK: the attachment holds an address in every range set, and every address of the
/// previous result that lies in our ranges is one of them.
pub fn check(attachment: &Attachment) -> Result<(), CniError> {
    let config = &attachment.config;
    if let Some(socket) = &config.ipam.agent {
        return crate::agent::check(socket, attachment);
    }
    let scope = config.name.as_str();
    let mut store = open(config)?;
    let mut txn = store.begin().map_err(store_error)?;
    let held = txn
        .allocations_by_key(scope, &attachment.key)
        .map_err(store_error)?;
    txn.finish().map_err(store_error)?;
    close(store)?;
    let held: Vec<(PoolName, IpAddr)> = held.into_iter().map(|row| (row.pool, row.addr)).collect();
    check_held(attachment, &held)
}

/// CHECK's verdict on what the attachment holds (pool and address of each allocation).
pub(crate) fn check_held(
    attachment: &Attachment,
    held: &[(PoolName, IpAddr)],
) -> Result<(), CniError> {
    let config = &attachment.config;
    let mut problems = Vec::new();
    for set in &config.ipam.range_sets {
        if !held.iter().any(|(pool, addr)| {
            *pool == set.pool && Family::of(*addr) == set.family && set.contains(*addr)
        }) {
            problems.push(format!(
                "attachment {} holds no address from {}",
                attachment.key, set.field
            ));
        }
    }
    if let Some(prev) = &config.prev_result {
        for addr in prev.addresses() {
            let ours = config.ipam.range_sets.iter().any(|set| set.contains(addr));
            if ours && !held.iter().any(|(_, held)| *held == addr) {
                problems.push(format!(
                    "prevResult lists {addr}, which attachment {} does not hold",
                    attachment.key
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CniError::check_failed(problems.join("; ")))
    }
}

/// GC: releases every allocation of the network whose attachment is not listed.
pub fn gc(config: &NetConfig, now: Timestamp) -> Result<(), CniError> {
    if let Some(socket) = &config.ipam.agent {
        return crate::agent::gc(socket, config);
    }
    let scope = config.name.as_str();
    let desired = scope_config(config);
    let mut store = open(config)?;
    let mut txn = store.begin().map_err(store_error)?;
    let mut engine = load_engine(&mut txn, config, &desired, now, Need::Full)?;
    let released = engine
        .release_unlisted(scope, &config.valid_attachments, now)
        .map_err(engine_error)?;
    for r in &released {
        txn.delete_allocation(scope, r.addr).map_err(store_error)?;
    }
    save_engine(&mut txn, scope, &desired, &engine).map_err(store_error)?;
    txn.commit().map_err(store_error)?;
    close(store)
}

/// STATUS: code 50 when some range set could not serve an ADD (no free or cooling address).
pub fn status(config: &NetConfig, now: Timestamp) -> Result<(), CniError> {
    if let Some(socket) = &config.ipam.agent {
        return crate::agent::status(socket, config);
    }
    let desired = scope_config(config);
    let mut store = open(config)?;
    let mut txn = store.begin().map_err(store_error)?;
    let mut engine = load_engine(
        &mut txn,
        config,
        &desired,
        now,
        Need::Partial {
            keys: &[],
            addrs: &[],
            now,
        },
    )?;
    drop(txn);
    close(store)?;
    engine.advance(now);
    status_verdict(config, |set| {
        engine
            .stats(&set.pool, set.family)
            .is_ok_and(|s| s.free > 0 || s.cooling > 0)
    })
}

/// STATUS's verdict: code 50 naming every range set that could not serve an ADD.
pub(crate) fn status_verdict(
    config: &NetConfig,
    can_serve: impl Fn(&crate::config::RangeSet) -> bool,
) -> Result<(), CniError> {
    let full: Vec<String> = config
        .ipam
        .range_sets
        .iter()
        .filter(|set| !can_serve(set))
        .map(|set| format!("{} has no free address", set.field))
        .collect();
    if full.is_empty() {
        Ok(())
    } else {
        Err(CniError::not_available(full.join("; ")))
    }
}
