//! [`NodeState`], the node's state: one engine per scope over a [`Store`], read at one [`Clock`];
//! how it is restored from the store at start, and the counters it keeps for `/metrics`.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use corral_api as api;
use corral_core::{Assignment, EngineConfig, Family, InterfaceError, PoolName, Timestamp};
use corral_store::{
    HistoryLimits, Need, ScopeConfig, SqliteStore, Store, StoreError, Txn, build_engine,
    save_engine,
};

use super::scope::{Broken, Scope};
use crate::capacity;
use crate::error::OpError;

/// Where the node state reads the time: every batch reads it once, and the engines are handed it.
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

/// The agent's scopes and its store.
pub struct NodeState<S: Store = SqliteStore, C: Clock = SystemClock> {
    pub(super) store: S,
    pub(super) clock: C,
    pub(super) scopes: BTreeMap<String, Scope>,
    pub(super) lease_seed: u64,
    /// Set when a commit failed during the current batch: the rest of the batch is refused
    /// unapplied, and answers not covered by an earlier successful commit become errors.
    pub(super) batch_failed: Option<OpError>,
    /// The operations of the current batch before this index are committed.
    pub(super) committed_upto: usize,
    /// The index of the operation being applied.
    pub(super) current: usize,
    /// Scopes whose engine could not be rebuilt after a failed commit, with their
    /// configuration: tried again on use, answered 503 meanwhile.
    pub(super) broken: BTreeMap<String, Broken>,
    /// The node scope's pools as the configuration file declares them.
    pub(super) declared: ScopeConfig,
    /// How many scopes are broken, for `/readyz`, which cannot wait for a batch.
    pub(super) n_broken: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The cluster's grants the last [`Op::SetClusterRanges`] could not apply, for `status`.
    pub(super) cluster_refused: Vec<String>,
    /// The last [`ClusterRanges::block_families`].
    pub(super) block_families: BTreeMap<PoolName, Vec<Family>>,
    /// Assign and unassign outcomes on interface-backed pools, for `/metrics`.
    pub(super) interface_counters: InterfaceCounters,
    /// How much allocation history the store keeps (`history.rs` of corral-store).
    pub(super) history: HistoryLimits,
}

impl<S: Store, C: Clock> std::fmt::Debug for NodeState<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeState")
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

impl<S: Store> NodeState<S, SystemClock> {
    /// [`NodeState::restore_with`] on the system's clock.
    pub fn restore(store: S, declared: &ScopeConfig) -> Result<Self, StoreError> {
        NodeState::restore_with(store, declared, SystemClock)
    }
}

impl<S: Store, C: Clock> NodeState<S, C> {
    /// Restores every scope of the store, with `node` (the agent's own pools) configured from
    /// what is stored and what the configuration file `declared` lists, combined as
    /// `capacity.rs` says (what could not be applied is in [`NodeState::warnings`]). Nothing is
    /// released or expired here: the engines finish their restore phase with every stored
    /// allocation, lease and cooldown, and [`Op::Tick`](crate::node::Op::Tick) expires what is overdue afterwards.
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
        Ok(NodeState {
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
            history: HistoryLimits::default(),
        })
    }

    /// Keeps the allocation history within `limits` from now on.
    pub fn with_history(mut self, limits: HistoryLimits) -> Self {
        self.history = limits;
        self
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

    pub(super) fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            lease_id_seed: self.lease_seed ^ self.clock.now().as_unix_millis().rotate_left(17),
            ..EngineConfig::default()
        }
    }
}

/// The labels of an assign or unassign outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct InterfaceOutcome {
    pub pool: String,
    pub operation: String,
    pub outcome: String,
}

/// Outcomes of assign and unassign, counted where they happen (a family the metrics
/// endpoint registers; a node state without one counts into a family nobody reads).
#[derive(Clone, Debug, Default)]
pub struct InterfaceCounters {
    pub outcomes: prometheus_client::metrics::family::Family<
        InterfaceOutcome,
        prometheus_client::metrics::counter::Counter,
    >,
}

impl InterfaceCounters {
    fn bump(&self, pool: &PoolName, operation: &str, outcome: &str) {
        self.outcomes
            .get_or_create(&InterfaceOutcome {
                pool: pool.to_string(),
                operation: operation.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    pub(super) fn count_assign(
        &self,
        pool: &PoolName,
        result: &Result<Assignment, InterfaceError>,
    ) {
        let outcome = match result {
            Ok(a) if a.existing => "existing",
            Ok(_) => "ok",
            Err(InterfaceError::Exhausted { .. }) => "exhausted",
            Err(_) => "error",
        };
        self.bump(pool, "assign", outcome);
    }

    pub(super) fn count_unassign<T>(
        &self,
        pool: &PoolName,
        result: &Result<Vec<T>, InterfaceError>,
    ) {
        let outcome = match result {
            Ok(released) if released.is_empty() => return,
            Ok(_) => "ok",
            Err(_) => "error",
        };
        self.bump(pool, "unassign", outcome);
    }
}
