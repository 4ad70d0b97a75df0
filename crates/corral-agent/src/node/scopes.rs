//! Scopes: looking them up, a CNI network's scope under the configuration its plugin sent,
//! and rebuilding one from the store.

use corral_api as api;
use corral_store::{Need, ScopeConfig, Store, StoreError, Txn, build_engine, save_engine};

use super::scope::{Broken, Changes, Scope};
use super::state::{Clock, NodeState};
use crate::capacity;
use crate::error::OpError;

impl<S: Store, C: Clock> NodeState<S, C> {
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
        self.not_broken(scope)?;
        self.scopes
            .get_mut(scope)
            .ok_or_else(|| OpError::unknown_scope(scope))
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
        self.not_broken(scope)?;
        self.scopes
            .get(scope)
            .ok_or_else(|| OpError::unknown_scope(scope))
    }

    /// Refuses a scope whose state could not be read, with why.
    fn not_broken(&self, scope: &str) -> Result<(), OpError> {
        match self.broken.get(scope) {
            Some(broken) => Err(broken.error(scope)),
            None => Ok(()),
        }
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

    /// The scope `name` of a CNI network under the configuration its plugin sent (which
    /// parses, and `name` is not the node scope's: the API checked both); creates it, or
    /// rebuilds it from the store when the configuration changed (as corral-ipam does on its
    /// own database). A build reads the store, so what the batch holds so far is committed
    /// first: the store must know everything the engines do.
    pub(super) fn cni_scope(
        &mut self,
        name: String,
        desired: ScopeConfig,
        changes: &mut Changes,
    ) -> Result<String, OpError> {
        if self.scopes.get(&name).is_some_and(|s| s.config == desired) {
            return Ok(name);
        }
        self.flush(changes)?;
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
            StoreError::Engine(e) => {
                let mut error = OpError::bad_request(format!("network configuration: {e}"));
                error.pool = OpError::from(e.clone()).0.pool;
                error
            }
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
