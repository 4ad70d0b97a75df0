//! The leak collector in the agent: CNI GC (`/v1/cni/gc`) and the node's own (`/v1/gc`,
//! `corral gc`), both `corral_store::collect_garbage` on the scope's engine, in a
//! transaction of their own: the suspects are read, the decision made, the allocations
//! checked again and released, and the suspects and rows written, in that one commit.

use std::collections::HashSet;

use corral_api as api;
use corral_core::{AttachmentKey, GcPolicy, GcSuspect, Timestamp};
use corral_store::{
    GcOutcome, HistoryKind, HistoryRecord, Store, Txn, collect_garbage, save_engine,
};

use super::op::Op;
use super::request::{CniGc, Gc, NetworkPools};
use super::scope::Changes;
use super::state::{Clock, NodeState};
use super::wire::api_key;
use crate::capacity;
use crate::error::OpError;

impl<S: Store, C: Clock> NodeState<S, C> {
    /// Runs [`Op::CniGc`] or [`Op::Gc`]: the batch's writes so far are committed first
    /// (`run_batch` does that), then the run commits on its own.
    pub(super) fn run_gc(
        &mut self,
        op: Op,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::GcResponse, OpError> {
        match op {
            Op::CniGc(CniGc {
                network,
                live,
                policy,
            }) => {
                let name = network.name;
                let scope = match network.pools {
                    // A network on a node pool: its attachments in the node scope.
                    NetworkPools::Node(_) => api::NODE_SCOPE.to_owned(),
                    NetworkPools::Own(config) => {
                        let scope = self.cni_scope(name.clone(), config, changes)?;
                        // A changed configuration is committed before the run reads.
                        self.flush(changes)?;
                        scope
                    }
                };
                let wanted = |key: &AttachmentKey| key.network() == name;
                self.collect(&scope, wanted, &live, now, &policy, false)
                    .map(|outcome| response(outcome, false))
            }
            Op::Gc(Gc {
                scope,
                live,
                policy,
                dry_run,
            }) => self
                .collect(&scope, |_| true, &live, now, &policy, dry_run)
                .map(|outcome| response(outcome, dry_run)),
            _ => Err(OpError::new(
                api::ErrorCode::RetryLater,
                "not a garbage collection",
            )),
        }
    }

    /// One run over `scope_name`'s attachments that `wanted` selects, in one transaction.
    /// A failure rebuilds the scope from the store, so memory never runs ahead of the disk.
    fn collect(
        &mut self,
        scope_name: &str,
        wanted: impl Fn(&AttachmentKey) -> bool,
        live: &HashSet<AttachmentKey>,
        now: Timestamp,
        policy: &GcPolicy,
        dry_run: bool,
    ) -> Result<GcOutcome, OpError> {
        // Makes sure the scope is there and readable (a broken one is tried again).
        self.scope_mut(scope_name)?;
        let declared = (scope_name == api::NODE_SCOPE).then_some(&self.declared);
        let Some(scope) = self.scopes.get_mut(scope_name) else {
            return Err(OpError::unknown_scope(scope_name));
        };
        let result = self.store.begin().and_then(|mut txn| {
            let outcome = collect_garbage(
                &mut txn,
                scope_name,
                &mut scope.engine,
                wanted,
                live,
                now,
                policy,
                dry_run,
            )?;
            if dry_run {
                txn.finish()?;
                return Ok(outcome);
            }
            // A draining range leaves with its last release, from the configuration too.
            let drained = scope.engine.take_drained();
            if !drained.is_empty() {
                capacity::forget_drained(&mut scope.config, &drained, declared);
                if let Some(declared) = declared {
                    scope.adopt_file_ranges(declared);
                }
            }
            if self.history.max_events > 0 {
                for row in &outcome.freed_rows {
                    txn.record(HistoryRecord::of(
                        now,
                        HistoryKind::Collected,
                        scope_name,
                        row,
                    ))?;
                }
            }
            save_engine(&mut txn, scope_name, &scope.config, &scope.engine)?;
            txn.prune_history(&self.history, now)?;
            txn.commit()?;
            Ok(outcome)
        });
        result.map_err(|error| {
            self.reload(scope_name);
            OpError::store(error)
        })
    }
}

fn suspect(suspect: &GcSuspect, due: Option<Timestamp>) -> api::GcSuspect {
    api::GcSuspect {
        key: api_key(&suspect.key),
        first_seen_ms: suspect.first_seen.as_unix_millis(),
        due_ms: due.map(Timestamp::as_unix_millis),
        addresses: suspect
            .held
            .iter()
            .map(|held| api::GcAddress {
                address: held.addr,
                generation: held.generation,
            })
            .collect(),
    }
}

fn response(outcome: GcOutcome, dry_run: bool) -> api::GcResponse {
    api::GcResponse {
        dry_run,
        live: outcome.live as u64,
        recorded: outcome.recorded.iter().map(|s| suspect(s, None)).collect(),
        released: outcome.released.iter().map(|s| suspect(s, None)).collect(),
        waiting: outcome
            .waiting
            .iter()
            .map(|(s, due)| suspect(s, Some(*due)))
            .collect(),
        capped: outcome.capped.iter().map(|s| suspect(s, None)).collect(),
        cleared: outcome.cleared.iter().map(api_key).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use corral_store::{MemoryStore, ScopeConfig};

    use std::time::Duration;

    use super::*;
    use crate::node::Reply;
    use crate::node::testing;

    #[derive(Clone, Debug, Default)]
    struct TestClock(Arc<AtomicU64>);

    impl Clock for TestClock {
        fn now(&self) -> Timestamp {
            Timestamp::from_unix_millis(1_000_000 + self.0.load(Ordering::SeqCst))
        }
    }

    fn declared() -> ScopeConfig {
        ScopeConfig {
            pools: vec![testing::file_pool(
                &corral_core::PoolName::default_pool(),
                Duration::ZERO,
                "10.9.0.0/29",
            )],
        }
    }

    fn allocate(container: &str) -> Op {
        testing::allocate(
            api::NODE_SCOPE,
            "default",
            container,
            Some(testing::attachment("net", container)),
            None,
        )
    }

    fn gc() -> Op {
        Op::Gc(
            api::GcRequest {
                scope: api::NODE_SCOPE.into(),
                live: vec![],
                // 1 ms: a run records, the next (the test clock moved) releases.
                grace_ms: Some(1),
                max_released: None,
                dry_run: false,
            }
            .try_into()
            .unwrap(),
        )
    }

    fn report(answer: &Result<Reply, OpError>) -> &api::GcResponse {
        match answer {
            Ok(Reply::Gc(response)) => response,
            other => panic!("{other:?}"),
        }
    }

    fn n_held<S: Store, C: Clock>(node: &NodeState<S, C>) -> usize {
        node.dump(None)
            .unwrap()
            .scopes
            .iter()
            .flat_map(|s| &s.pools)
            .map(|p| p.allocations.len())
            .sum()
    }

    /// A run in a batch sees what the batch did before it (committed first), and the batch
    /// goes on after it.
    #[test]
    fn a_run_in_a_batch_sees_the_batch_so_far() {
        let clock = TestClock::default();
        let mut node = NodeState::restore_with(MemoryStore::new(), &declared(), clock).unwrap();
        let answers = node.run_batch(vec![allocate("a"), gc(), allocate("b")]);
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(report(&answers[1]).recorded.len(), 1);
        assert_eq!(n_held(&node), 2);
    }

    /// A run whose commit fails answers 503 and leaves memory as the store is: the addresses
    /// it released in memory are held again, and the next run releases them.
    #[test]
    fn a_failed_commit_of_a_run_releases_nothing() {
        let store = MemoryStore::new();
        let clock = TestClock::default();
        let mut node = NodeState::restore_with(store.clone(), &declared(), clock.clone()).unwrap();
        node.run_batch(vec![allocate("a")]);
        assert_eq!(report(&node.run_batch(vec![gc()])[0]).recorded.len(), 1);
        clock.0.fetch_add(1, Ordering::SeqCst);
        store.fail_next_commits(1);
        let failed = node.run_batch(vec![gc()]);
        assert!(
            matches!(&failed[0], Err(e) if e.code == api::ErrorCode::RetryLater),
            "{failed:?}"
        );
        assert_eq!(n_held(&node), 1, "memory is rebuilt from the store");
        assert_eq!(report(&node.run_batch(vec![gc()])[0]).released.len(), 1);
        assert_eq!(n_held(&node), 0);
        let node = NodeState::restore_with(store, &declared(), clock).unwrap();
        assert_eq!(n_held(&node), 0);
    }
}
