//! Scopes: looking them up, a CNI network's scope under the configuration its plugin sent,
//! and rebuilding one from the store.

use std::collections::BTreeSet;

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{Echo, Engine, Family, PoolName};
use corral_store::{
    Need, PoolSpec, RangeEntry, RangeSource, ScopeConfig, Store, StoreError, Txn, build_engine,
    save_engine,
};

use super::batch::Write;
use super::wire::{scope_config_of, validate_config};
use super::{Clock, Host, OpError};
use crate::capacity;

pub(super) struct Scope {
    pub(super) config: ScopeConfig,
    pub(super) engine: Engine,
    /// The interface-backed pools' tables (`interfaces.rs`), from `config`.
    pub(super) interfaces: std::collections::BTreeMap<PoolName, corral_core::Interfaces>,
}

impl Scope {
    /// A scope of an engine built from `config`, with the interface tables `config` holds.
    pub(super) fn new(config: ScopeConfig, mut engine: Engine) -> Result<Scope, StoreError> {
        let interfaces = super::interfaces::tables_of(&config, &engine)?;
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
    config: ScopeConfig,
    /// What the store said when the rebuild failed.
    reason: String,
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

impl<S: Store, C: Clock> Host<S, C> {
    /// Rebuilds a scope's engine from the store (after a failed commit), under the
    /// configuration the store holds: what the failed batch changed in memory, configuration
    /// included, is forgotten. A scope the store does not know (created by the failed batch)
    /// is dropped. If the store fails again the scope is set aside as broken: requests for it
    /// get 503 and try again.
    pub(super) fn reload(&mut self, scope: &str) {
        let fallback = match self.scopes.get(scope) {
            Some(s) => s.config.clone(),
            None => match self.broken.get(scope) {
                Some(broken) => broken.config.clone(),
                None => return,
            },
        };
        let engine_config = self.engine_config();
        let declared = (scope == api::NODE_SCOPE).then_some(&self.declared);
        let rebuilt = self.store.begin().and_then(|mut txn| {
            let (state, _) = txn.scope_state(scope)?;
            let Some(mut config) = state
                .map(|s| s.config)
                .or_else(|| (scope == api::NODE_SCOPE).then(ScopeConfig::default))
            else {
                txn.finish()?;
                return Ok(None);
            };
            let (mut engine, _) =
                build_engine(&mut txn, scope, &config, engine_config, Need::Full)?;
            txn.finish()?;
            capacity::forget_drained(&mut config, &engine.take_drained(), declared);
            Ok(Some(Scope::new(config, engine)?))
        });
        match rebuilt {
            Ok(Some(rebuilt)) => {
                self.broken.remove(scope);
                self.scopes.insert(scope.to_owned(), rebuilt);
            }
            Ok(None) => {
                self.broken.remove(scope);
                self.scopes.remove(scope);
            }
            Err(error) => {
                let config = fallback;
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
        self.count_broken();
    }

    /// Publishes how many scopes are broken, for `/readyz`; called after every change to
    /// `broken`.
    pub(super) fn count_broken(&self) {
        self.n_broken
            .store(self.broken.len(), std::sync::atomic::Ordering::Release);
    }

    pub(super) fn scope_mut(&mut self, scope: &str) -> Result<&mut Scope, OpError> {
        if self.broken.contains_key(scope) {
            self.reload(scope);
        }
        if let Some(broken) = self.broken.get(scope) {
            return Err(broken.error(scope));
        }
        self.scopes.get_mut(scope).ok_or_else(|| {
            OpError::new(
                ErrorCode::NotFound,
                format!("unknown scope {}", Echo(scope)),
            )
        })
    }

    /// A scope whose capacity the API may change: the agent's own. A CNI network's pools
    /// come from its configuration, which the plugin sends with every call; a change made
    /// here would be undone by the next call, so it is refused.
    pub(super) fn node_scope_mut(
        &mut self,
        scope: &str,
        what: &str,
    ) -> Result<&mut Scope, OpError> {
        if scope != api::NODE_SCOPE
            && (self.scopes.contains_key(scope) || self.broken.contains_key(scope))
        {
            return Err(OpError::bad_request(format!(
                "scope {scope:?} is a CNI network's: its {what} come from the network's \
                 configuration (change that instead)"
            )));
        }
        self.scope_mut(scope)
    }

    pub(super) fn scope(&self, scope: &str) -> Result<&Scope, OpError> {
        if let Some(broken) = self.broken.get(scope) {
            return Err(broken.error(scope));
        }
        self.scopes.get(scope).ok_or_else(|| {
            OpError::new(
                ErrorCode::NotFound,
                format!("unknown scope {}", Echo(scope)),
            )
        })
    }

    pub(super) fn selected(&self, scope: Option<&str>) -> Result<Vec<(&String, &Scope)>, OpError> {
        match scope {
            Some(name) => {
                self.scope(name)?;
                Ok(self.scopes.get_key_value(name).into_iter().collect())
            }
            None => Ok(self.scopes.iter().collect()),
        }
    }

    /// The scope of a CNI network under the configuration the plugin sent; creates it, or
    /// rebuilds it from the store when the configuration changed (as corral-ipam does on its
    /// own database). A build reads the store, so what the batch holds so far is committed
    /// first: the store must know everything the engines do.
    pub(super) fn cni_scope(
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
                interfaces: Default::default(),
            },
        );
        Ok(name)
    }
}
