//! The local backend: the verbs on the embedded store under `dataDir`, one exclusive, durable
//! transaction each.
//!
//! ADD, DEL, CHECK and STATUS build a partial engine (the network's snapshot plus the rows of
//! one attachment), so their cost does not grow with the allocations held; GC reads all, and
//! releases only what `corral_store::collect_garbage` proves leaked (see `config.rs`).
//!
//! The first call on a network whose host-local directory (`dataDir/<network>/`) exists takes
//! over every address recorded there, and host-local's next-fit positions; afterwards, while
//! taken-over allocations remain, a call whose host-local directory changed releases those
//! whose host-local file is gone (see [`watch_host_local`]).

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use corral_core::{
    AllocError, AttachmentKey, Engine, EngineConfig, Family, PoolName, Released, Request, Target,
    Timestamp, addr_value,
};
use corral_store::{
    HostLocalTakeover, Need, ScopeConfig, SqliteStore, SqliteTxn, Store, StoreError,
    StoredAllocation, Txn, build_engine, collect_garbage, host_local_allocations,
    host_local_file_exists, read_host_local_dir, save_engine,
};

use crate::backend::{Backend, scope_config, warn_gc_capped};
use crate::verdict::{check_held, result_ip, status_verdict};
use crate::{Attachment, CniError, IpamResult, NetConfig};

/// The verbs on the SQLite store under the configuration's `dataDir`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Local;

/// The store's error as a CNI error: each kind mapped once, with no catch-all, so a new kind
/// does not compile until it is given a code.
fn store_error(error: StoreError) -> CniError {
    match error {
        StoreError::Engine(error) => CniError::from(error),
        // A running agent owns the directory (and keeps it locked until it stops).
        StoreError::Held { .. } => CniError::new(
            CniError::TRY_AGAIN_LATER,
            error.to_string(),
            "set \"agent\" in the ipam configuration to the agent's socket, or stop the agent",
        ),
        // The configuration names a file (or a path through one) as its state directory.
        StoreError::NotADirectory { .. } => {
            CniError::invalid_config(error.to_string()).context("ipam.dataDir")
        }
        StoreError::Directory { .. }
        | StoreError::Lock { .. }
        | StoreError::Backend { .. }
        | StoreError::StateLost { .. }
        | StoreError::Taken { .. }
        | StoreError::SchemaTooNew { .. }
        | StoreError::Corrupt { .. }
        | StoreError::SyncFailed { .. } => CniError::store(error),
    }
}

/// Deletes the rows of what `engine` released, stores its derived state (which starts the
/// cooldowns of those addresses) and commits.
fn commit_released(
    mut txn: impl Txn,
    scope: &str,
    desired: &ScopeConfig,
    engine: &Engine,
    released: &[Released],
) -> Result<(), CniError> {
    for r in released {
        txn.delete_allocation(scope, r.addr).map_err(store_error)?;
    }
    save_engine(&mut txn, scope, desired, engine).map_err(store_error)?;
    txn.commit().map_err(store_error)
}

fn engine_error(error: AllocError) -> CniError {
    CniError::from(error)
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
fn open(config: &NetConfig, now: Timestamp) -> Result<SqliteStore, CniError> {
    let mut store = SqliteStore::open_one_shot(&config.ipam.data_dir).map_err(|error| {
        let plain = matches!(
            error,
            StoreError::Held { .. } | StoreError::NotADirectory { .. }
        );
        let error = store_error(error);
        if plain {
            error
        } else {
            error.context(&format!(
                "state directory {}",
                config.ipam.data_dir.display()
            ))
        }
    })?;
    watch_host_local(&mut store, config, now)?;
    Ok(store)
}

/// Releases the state directory, then makes this call's commits durable.
fn close(store: SqliteStore) -> Result<(), CniError> {
    store.close().map_err(store_error)
}

/// A directory's modification time in nanoseconds since the epoch (0 if unknown).
fn mtime_ns(metadata: &std::fs::Metadata) -> i64 {
    metadata
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_nanos()).ok())
        .unwrap_or(0)
}

/// A directory time this close to now may be shared by a change still to come (file systems
/// keep time in ticks): it is not trusted, so the next call looks again.
const MTIME_SETTLE: Duration = Duration::from_secs(2);

fn settled_mtime_ns(mtime_ns: i64, now: Timestamp) -> i64 {
    let now_ns = i128::from(now.as_unix_millis()) * 1_000_000;
    if i128::from(mtime_ns) + MTIME_SETTLE.as_nanos() as i128 > now_ns {
        0
    } else {
        mtime_ns
    }
}

/// Switching a network from host-local to corral-ipam, and living with it afterwards.
///
/// The first call on a network whose host-local directory exists takes over every address
/// recorded there (host-local's files are left as they are), so replacing `host-local` by
/// `corral-ipam` in a configuration loses nothing, and next-fit continues after host-local's
/// `last_reserved_ip.N`.
///
/// A runtime deletes a container with the configuration it started it with, so the DEL of a
/// container started before the switch goes to host-local, which removes its file. While
/// taken-over allocations remain, a call whose host-local directory changed since the last
/// look releases each one whose file is gone. The cost of a call is one `stat` of the
/// directory and one row read when it exists, nothing when it does not.
fn watch_host_local(
    store: &mut SqliteStore,
    config: &NetConfig,
    now: Timestamp,
) -> Result<(), CniError> {
    let dir = config.ipam.data_dir.join(&config.name);
    let metadata = match std::fs::metadata(&dir) {
        Ok(metadata) if metadata.is_dir() => metadata,
        _ => return Ok(()),
    };
    let scope = config.name.as_str();
    match store.host_local_takeover(scope).map_err(store_error)? {
        Some(takeover) if takeover.addrs.is_empty() => Ok(()),
        Some(takeover) if takeover.dir_mtime_ns == mtime_ns(&metadata) => Ok(()),
        Some(_) => release_gone(store, config, &dir, now),
        // Once the network has state, a takeover was done (by an older corral-ipam that kept
        // no watch list) or not needed: host-local's files need no second look.
        None if store.has_scope(scope).map_err(store_error)? => Ok(()),
        None => import_host_local(store, config, &dir, now),
    }
}

/// Takes over host-local's addresses and next-fit positions; see [`watch_host_local`].
fn import_host_local(
    store: &mut SqliteStore,
    config: &NetConfig,
    dir: &Path,
    now: Timestamp,
) -> Result<(), CniError> {
    let scope = config.name.as_str();
    let mut txn = store.begin().map_err(store_error)?;
    // Checked again under the lock: another process may have imported meanwhile.
    let (state, corrupt) = txn.scope_state(scope).map_err(store_error)?;
    if state.is_some() || corrupt.is_some() {
        return Ok(());
    }
    let mtime = std::fs::metadata(dir).map(|m| mtime_ns(&m)).unwrap_or(0);
    let Some(host_local) = read_host_local_dir(dir).map_err(store_error)? else {
        return Ok(());
    };
    for warning in &host_local.warnings {
        // The runtime keeps a plugin's stderr in its log; the call itself goes on.
        eprintln!(
            "corral-ipam: taking over host-local's {}: {warning}",
            dir.display()
        );
    }
    let fallback = config
        .ipam
        .range_sets
        .first()
        .map(|set| set.pool.clone())
        .unwrap_or_else(PoolName::default_pool);
    let rows = host_local_allocations(scope, &host_local.entries, |addr| {
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
    continue_after_host_local(&mut txn, config, &host_local.last_reserved)?;
    txn.put_host_local_takeover(
        scope,
        &HostLocalTakeover {
            dir_mtime_ns: settled_mtime_ns(mtime, now),
            addrs: rows.iter().map(|row| row.addr).collect(),
        },
    )
    .map_err(store_error)?;
    txn.commit().map_err(store_error)
}

/// Sets each range set's next-fit position just after host-local's `last_reserved_ip.N`
/// (N is the range set's index, in the order both plugins read them), in the stored
/// snapshots the next partial build starts from.
fn continue_after_host_local(
    txn: &mut SqliteTxn<'_>,
    config: &NetConfig,
    last_reserved: &[(usize, IpAddr)],
) -> Result<(), CniError> {
    if last_reserved.is_empty() {
        return Ok(());
    }
    let scope = config.name.as_str();
    let (Some(mut state), _) = txn.scope_state(scope).map_err(store_error)? else {
        return Ok(());
    };
    for &(index, addr) in last_reserved {
        let Some(set) = config.ipam.range_sets.get(index) else {
            continue;
        };
        if !set.contains(addr) {
            continue;
        }
        let Some((_, snapshot)) = state.snapshots.iter_mut().find(|(p, _)| *p == set.pool) else {
            continue;
        };
        let value = addr_value(addr);
        let Some(range) = snapshot.ranges.iter_mut().find(|r| {
            r.spec.family() == set.family
                && addr_value(r.spec.start()) <= value
                && value <= addr_value(r.spec.end())
        }) else {
            continue;
        };
        let start = addr_value(range.spec.start());
        let end = addr_value(range.spec.end());
        // As the engine moves a cursor after handing out `addr`: the next address, or the
        // range's beginning after its last.
        range.cursor = if value == end { 0 } else { value - start + 1 };
        let family_index = match set.family {
            Family::V4 => 0,
            Family::V6 => 1,
        };
        snapshot.current[family_index] = start;
    }
    txn.put_scope_state(scope, &state).map_err(store_error)
}

/// Releases the taken-over allocations whose host-local file is gone, and forgets those
/// that were released otherwise; see [`watch_host_local`]. A release names generation 0,
/// which only a taken-over allocation has, so it never frees a later allocation.
fn release_gone(
    store: &mut SqliteStore,
    config: &NetConfig,
    dir: &Path,
    now: Timestamp,
) -> Result<(), CniError> {
    let scope = config.name.as_str();
    let mut txn = store.begin().map_err(store_error)?;
    let Some(takeover) = txn.host_local_takeover(scope).map_err(store_error)? else {
        return Ok(());
    };
    // The time before the look: a removal during it changes the time again.
    let mtime = std::fs::metadata(dir).map(|m| mtime_ns(&m)).unwrap_or(0);
    let mut watched = Vec::new();
    let mut gone = Vec::new();
    for &addr in &takeover.addrs {
        let row = txn.allocation_by_addr(scope, addr).map_err(store_error)?;
        if row.is_none_or(|row| row.generation != 0) {
            // Released through corral since (and perhaps handed out again): not ours to watch.
            continue;
        }
        if host_local_file_exists(dir, addr) {
            watched.push(addr);
        } else {
            gone.push(addr);
        }
    }
    if !gone.is_empty() {
        let desired = scope_config(config);
        let mut engine = load_engine(
            &mut txn,
            config,
            &desired,
            now,
            Need::Partial {
                keys: &[],
                addrs: &gone,
                now,
            },
        )?;
        for &addr in &gone {
            if engine.release(addr, Some(0), now).is_ok() {
                txn.delete_allocation(scope, addr).map_err(store_error)?;
            }
        }
        save_engine(&mut txn, scope, &desired, &engine).map_err(store_error)?;
    }
    txn.put_host_local_takeover(
        scope,
        &HostLocalTakeover {
            dir_mtime_ns: settled_mtime_ns(mtime, now),
            addrs: watched,
        },
    )
    .map_err(store_error)?;
    txn.commit().map_err(store_error)
}

impl Backend for Local {
    fn add(
        &self,
        attachment: &Attachment,
        now: Timestamp,
        result: &mut IpamResult,
    ) -> Result<(), CniError> {
        let mut store = open(&attachment.config, now)?;
        // The snapshot and the rows are written together, so they agree; should they ever
        // not (the database refuses an address the snapshot thought free), the allocation is
        // decided again from every row, which also rewrites the snapshot.
        match add_in(&mut store, attachment, now, false, result) {
            Err(AddError::Taken(_)) => {
                add_in(&mut store, attachment, now, true, result).map_err(|error| match error {
                    AddError::Taken(error) | AddError::Other(error) => error,
                })?
            }
            Err(AddError::Other(error)) => return Err(error),
            Ok(()) => {}
        }
        close(store)
    }

    fn del(&self, attachment: &Attachment, now: Timestamp) -> Result<(), CniError> {
        let config = &attachment.config;
        let scope = config.name.as_str();
        let desired = scope_config(config);
        let mut store = open(config, now)?;
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
            commit_released(txn, scope, &desired, &engine, &released)?;
        }
        close(store)
    }

    fn check(&self, attachment: &Attachment, now: Timestamp) -> Result<(), CniError> {
        let config = &attachment.config;
        let scope = config.name.as_str();
        let mut store = open(config, now)?;
        let mut txn = store.begin().map_err(store_error)?;
        let held = txn
            .allocations_by_key(scope, &attachment.key)
            .map_err(store_error)?;
        txn.finish().map_err(store_error)?;
        close(store)?;
        let held: Vec<(PoolName, IpAddr)> =
            held.into_iter().map(|row| (row.pool, row.addr)).collect();
        check_held(attachment, &held)
    }

    fn gc(&self, config: &NetConfig, now: Timestamp) -> Result<(), CniError> {
        let scope = config.name.as_str();
        let desired = scope_config(config);
        let live: HashSet<AttachmentKey> = config.valid_attachments.iter().cloned().collect();
        let mut store = open(config, now)?;
        let mut txn = store.begin().map_err(store_error)?;
        let mut engine = load_engine(&mut txn, config, &desired, now, Need::Full)?;
        let outcome = collect_garbage(
            &mut txn,
            scope,
            &mut engine,
            |key| key.network() == scope,
            &live,
            now,
            &config.ipam.gc_policy(),
            false,
        )
        .map_err(store_error)?;
        save_engine(&mut txn, scope, &desired, &engine).map_err(store_error)?;
        txn.commit().map_err(store_error)?;
        close(store)?;
        warn_gc_capped(outcome.released.len(), outcome.capped.len());
        Ok(())
    }

    fn status(&self, config: &NetConfig, now: Timestamp) -> Result<(), CniError> {
        let desired = scope_config(config);
        let mut store = open(config, now)?;
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
        let ip = result_ip(attachment, set, allocation.addr, allocation.existing)?;
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
