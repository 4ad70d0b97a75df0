//! Checkpoints: a store's scopes as one versioned JSON document, to move state between
//! machines or backends, or to keep a copy a person can read.
//!
//! Import validates the whole document (every address, key and range, that the allocations fit
//! together in an engine, and that each interface-backed pool's interfaces match its ranges)
//! before it writes anything. Interfaces travel in each pool's configuration (`interfaces`,
//! absent for other pools, so documents without interfaces read and write as before).

use std::net::IpAddr;

use corral_core::{AttachmentKey, Engine, EngineConfig, Lease, PoolName, Timestamp, Uuid};
use serde::{Deserialize, Serialize};

use crate::load::{Need, build_engine, rewrite_cooldowns, save_engine};
use crate::{ScopeConfig, StoreError, StoredAllocation, StoredCooldown, Txn};

/// The format this build writes and reads.
pub const CHECKPOINT_FORMAT: &str = "corral-checkpoint/1";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub format: String,
    pub scopes: Vec<ScopeCheckpoint>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScopeCheckpoint {
    pub scope: String,
    pub config: ScopeConfig,
    pub next_generation: u64,
    pub allocations: Vec<CheckpointAllocation>,
    /// Addresses in cooldown with their release time (milliseconds since the epoch).
    pub cooling: Vec<CheckpointCooling>,
    /// Where next-fit continues in each range, so an imported store decides as the old one.
    #[serde(default)]
    pub positions: Vec<CheckpointPosition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CheckpointPosition {
    pub pool: String,
    pub range: String,
    /// The address next-fit tries first in this range.
    pub next: String,
    /// Whether this is the range the pool continues in, for its family.
    pub current: bool,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CheckpointAllocation {
    pub pool: String,
    pub address: String,
    pub owner: String,
    pub network: Option<String>,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    pub generation: u64,
    pub lease_id: Option<String>,
    pub lease_expires_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CheckpointCooling {
    pub pool: String,
    pub address: String,
    pub released_ms: u64,
}

fn invalid(what: &str, reason: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: format!("checkpoint {what}"),
        reason: reason.to_string(),
    }
}

impl CheckpointAllocation {
    fn from_stored(row: &StoredAllocation) -> CheckpointAllocation {
        CheckpointAllocation {
            pool: row.pool.to_string(),
            address: row.addr.to_string(),
            owner: row.owner.clone(),
            network: row.key.as_ref().map(|k| k.network().to_owned()),
            container_id: row.key.as_ref().map(|k| k.container_id().to_owned()),
            ifname: row.key.as_ref().map(|k| k.ifname().to_owned()),
            generation: row.generation,
            lease_id: row.lease.map(|l| l.id.to_string()),
            lease_expires_ms: row.lease.map(|l| l.expires_at.as_unix_millis()),
        }
    }

    fn to_stored(&self) -> Result<StoredAllocation, StoreError> {
        let addr: IpAddr = self
            .address
            .parse()
            .map_err(|_| invalid("address", format!("{:?} is not an address", self.address)))?;
        let key = match (&self.network, &self.container_id, &self.ifname) {
            (Some(n), Some(c), Some(i)) => {
                Some(AttachmentKey::new(n, c, i).map_err(|e| invalid("attachment", e))?)
            }
            (None, None, None) => None,
            _ => {
                return Err(invalid(
                    "attachment",
                    format!("{} has only part of an attachment key", self.address),
                ));
            }
        };
        let lease = match (&self.lease_id, self.lease_expires_ms) {
            (Some(id), Some(at)) => Some(Lease {
                id: Uuid::parse_str(id).map_err(|e| invalid("lease", e))?,
                expires_at: Timestamp::from_unix_millis(at),
            }),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "lease",
                    format!("{} has half a lease", self.address),
                ));
            }
        };
        Ok(StoredAllocation {
            pool: PoolName::new(&self.pool).map_err(|e| invalid("pool", e))?,
            addr,
            owner: self.owner.clone(),
            key,
            generation: self.generation,
            lease,
        })
    }
}

fn positions_of(state: &crate::ScopeState) -> Vec<CheckpointPosition> {
    let mut out = Vec::new();
    for (pool, snapshot) in &state.snapshots {
        for range in &snapshot.ranges {
            let family = range.spec.family();
            let start = corral_core::addr_value(range.spec.start());
            out.push(CheckpointPosition {
                pool: pool.to_string(),
                range: range.spec.to_string(),
                next: family.addr(start.saturating_add(range.cursor)).to_string(),
                current: snapshot.current[family_index(family)] == start,
            });
        }
    }
    out
}

fn family_index(family: corral_core::Family) -> usize {
    match family {
        corral_core::Family::V4 => 0,
        corral_core::Family::V6 => 1,
    }
}

/// Turns checkpoint positions into snapshots that carry only next-fit positions, which a
/// full rebuild takes over (occupancy comes from the rows).
fn position_snapshots(
    positions: &[CheckpointPosition],
) -> Result<Vec<(PoolName, corral_core::PoolSnapshot)>, StoreError> {
    let mut out: Vec<(PoolName, corral_core::PoolSnapshot)> = Vec::new();
    for position in positions {
        let pool = PoolName::new(&position.pool).map_err(|e| invalid("position pool", e))?;
        let spec: corral_core::RangeSpec = position
            .range
            .parse()
            .map_err(|e| invalid("position range", e))?;
        let next: IpAddr = position
            .next
            .parse()
            .map_err(|_| invalid("position", format!("{:?}", position.next)))?;
        let start = corral_core::addr_value(spec.start());
        let cursor = corral_core::addr_value(next).saturating_sub(start);
        let index = match out.iter().position(|(name, _)| *name == pool) {
            Some(index) => index,
            None => {
                out.push((
                    pool.clone(),
                    corral_core::PoolSnapshot {
                        current: [0, 0],
                        n_allocated: [0, 0],
                        ranges: Vec::new(),
                    },
                ));
                out.len() - 1
            }
        };
        let snapshot = &mut out[index].1;
        if position.current {
            snapshot.current[family_index(spec.family())] = start;
        }
        snapshot.ranges.push(corral_core::RangeSnapshot {
            spec,
            draining: false,
            cursor,
            n_allocated: 0,
            occupancy: corral_core::OccupancySnapshot::Runs(Vec::new()),
        });
    }
    Ok(out)
}

/// Every scope of the store as one document.
pub fn export_checkpoint(txn: &mut impl Txn) -> Result<Checkpoint, StoreError> {
    let mut scopes = Vec::new();
    for scope in txn.scopes()? {
        let (state, corrupt) = txn.scope_state(&scope)?;
        let rows = txn.all_allocations(&scope)?;
        let positions = state.as_ref().map(positions_of).unwrap_or_default();
        let cooling = txn
            .cooldowns(&scope)?
            .into_iter()
            .map(|cooling| CheckpointCooling {
                pool: cooling.pool.to_string(),
                address: cooling.addr.to_string(),
                released_ms: cooling.released_at.as_unix_millis(),
            })
            .collect();
        let (config, next_generation) = match state {
            Some(state) => (state.config, state.next_generation),
            // Without readable derived state, the rows still say everything that matters.
            None => {
                let _ = corrupt;
                let next = rows.iter().map(|r| r.generation + 1).max().unwrap_or(1);
                (ScopeConfig::default(), next)
            }
        };
        scopes.push(ScopeCheckpoint {
            scope,
            config,
            next_generation,
            allocations: rows.iter().map(CheckpointAllocation::from_stored).collect(),
            cooling,
            positions,
        });
    }
    Ok(Checkpoint {
        format: CHECKPOINT_FORMAT.to_owned(),
        scopes,
    })
}

/// The engine of a scope being imported, built from every row stored for it so far.
fn full_engine(txn: &mut impl Txn, scope: &ScopeCheckpoint) -> Result<Engine, StoreError> {
    let (engine, _) = build_engine(
        txn,
        &scope.scope,
        &scope.config,
        EngineConfig::default(),
        Need::Full,
    )?;
    Ok(engine)
}

/// Loads a checkpoint into scopes that hold no allocations yet. Everything is validated
/// (including that each scope's allocations fit its configuration without conflicts) before
/// the first write; on error the caller drops the transaction and nothing changes.
pub fn import_checkpoint(txn: &mut impl Txn, checkpoint: &Checkpoint) -> Result<(), StoreError> {
    if checkpoint.format != CHECKPOINT_FORMAT {
        return Err(invalid(
            "format",
            format!(
                "{:?} is not {CHECKPOINT_FORMAT:?}, the format this build reads",
                checkpoint.format
            ),
        ));
    }
    let mut parsed = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for scope in &checkpoint.scopes {
        if !seen.insert(scope.scope.as_str()) {
            return Err(invalid(
                "scope",
                format!("scope {} appears twice", scope.scope),
            ));
        }
        if !txn.all_allocations(&scope.scope)?.is_empty() {
            return Err(invalid(
                "scope",
                format!("scope {} already holds allocations here", scope.scope),
            ));
        }
        let rows = scope
            .allocations
            .iter()
            .map(CheckpointAllocation::to_stored)
            .collect::<Result<Vec<_>, _>>()?;
        parsed.push((scope, rows));
    }
    for (scope, rows) in &parsed {
        for row in rows {
            txn.put_allocation(&scope.scope, row)?;
        }
        // Building an engine checks every row against the others and the configuration,
        // and the interfaces of interface-backed pools against their ranges.
        let engine = full_engine(txn, scope)?;
        crate::restore_interfaces(&scope.config, &engine)?;
        let state = crate::ScopeState {
            config: scope.config.clone(),
            // Generations only ever grow: a scope that held allocations before keeps its
            // counter if that is higher.
            next_generation: txn
                .scope_state(&scope.scope)?
                .0
                .map_or(scope.next_generation, |state| {
                    state.next_generation.max(scope.next_generation)
                }),
            snapshots: position_snapshots(&scope.positions)?,
        };
        let cooling = scope
            .cooling
            .iter()
            .map(|c| {
                Ok(StoredCooldown {
                    pool: PoolName::new(&c.pool).map_err(|e| invalid("cooling pool", e))?,
                    addr: c
                        .address
                        .parse()
                        .map_err(|_| invalid("cooling", format!("{:?}", c.address)))?,
                    released_at: Timestamp::from_unix_millis(c.released_ms),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        // Store the cooldowns and generation first, then rebuild with them and store the
        // snapshots and the cooldowns that go with the rows (the engine drops those that are
        // not free capacity of their pool).
        txn.delete_cooldowns(&scope.scope)?;
        for cooldown in &cooling {
            txn.put_cooldown(&scope.scope, cooldown)?;
        }
        txn.put_scope_state(&scope.scope, &state)?;
        let engine = full_engine(txn, scope)?;
        save_engine(txn, &scope.scope, &scope.config, &engine)?;
        rewrite_cooldowns(txn, &scope.scope, &engine)?;
    }
    Ok(())
}
