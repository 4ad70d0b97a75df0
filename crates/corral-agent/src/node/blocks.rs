//! Blocks of block-mode pools: the agent's side of the release handshake, and what
//! its demand is computed from.
//!
//! - [`Op::SurrenderBlock`](super::Op::SurrenderBlock): in one commit, a cluster range that
//!   holds no allocation leaves the engine and stays in the stored configuration as
//!   *surrendered* (source `cluster`, state `removed`), so nothing is allocated from it again
//!   and [`Op::SetClusterRanges`](super::Op::SetClusterRanges) does not add it back while its
//!   grant lasts; a range in use (or not held) is refused and nothing changes.
//! - [`Op::ReclaimBlock`](super::Op::ReclaimBlock): a surrendered range whose handshake was
//!   withdrawn while the grant lasts is active again.
//! - [`Op::BlockReport`](super::Op::BlockReport): the node scope's counts and ranges, read
//!   only, for the demand the cluster link publishes.

use corral_api as api;
use corral_core::{Family, PoolName, RangeRemoval, RangeSpec};
use corral_store::Store;

use super::op::{BlockReport, HeldRange, Surrender};
use super::scope::{Changes, ensure_spec, spec_mut};
use super::state::{Clock, NodeState};
use crate::capacity;
use crate::error::OpError;

fn same(a: &RangeSpec, b: &RangeSpec) -> bool {
    a.start() == b.start() && a.end() == b.end()
}

impl<S: Store, C: Clock> NodeState<S, C> {
    pub(super) fn surrender_block(
        &mut self,
        pool: &PoolName,
        spec: &RangeSpec,
        changes: &mut Changes,
    ) -> Result<Surrender, OpError> {
        let declared = self.declared.clone();
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        let refuse = |reason: String| Ok(Surrender::Refused(reason));
        let entry = spec_mut(scope, pool)
            .and_then(|stored| stored.entry_at(spec).map(|i| stored.ranges[i].clone()));
        match entry {
            Some(entry) if capacity::is_surrendered(&entry) => {
                return Ok(Surrender::AlreadySurrendered);
            }
            Some(entry)
                if entry.source == corral_store::RangeSource::Cluster
                    && entry.state == corral_store::RangeState::Active => {}
            Some(entry) => {
                return refuse(format!(
                    "range {} of pool {pool} is {} (source {}), not an active block granted by \
                     the cluster",
                    entry.range,
                    entry.state.as_str(),
                    entry.source.as_str()
                ));
            }
            None => return refuse(format!("the agent does not hold {spec} in pool {pool}")),
        }
        let info = scope
            .engine
            .ranges(pool)
            .ok()
            .and_then(|ranges| ranges.into_iter().find(|r| same(&r.spec, spec)));
        match info {
            None => return refuse(format!("the agent does not hold {spec} in pool {pool}")),
            Some(info) if info.draining => {
                return refuse(format!("block {spec} of pool {pool} is draining"));
            }
            Some(info) if info.n_allocated > 0 => {
                return refuse(format!(
                    "block {spec} of pool {pool} holds {} allocation(s)",
                    info.n_allocated
                ));
            }
            Some(_) => {}
        }
        match scope.engine.remove_range(pool, spec)? {
            RangeRemoval::Removed => {}
            RangeRemoval::Draining { .. } => {
                // Not reachable (it held nothing); undo, and say no.
                let _ = scope.engine.add_range(pool, *spec);
                return refuse(format!("block {spec} of pool {pool} is in use"));
            }
        }
        // Our range is reported as drained: it stays, surrendered; others that drained
        // meanwhile leave as usual.
        let others: Vec<_> = scope
            .engine
            .take_drained()
            .into_iter()
            .filter(|d| !(d.pool == *pool && same(&d.spec, spec)))
            .collect();
        capacity::forget_drained(&mut scope.config, &others, Some(&declared));
        if let Some(stored) = spec_mut(scope, pool) {
            capacity::note_surrendered(stored, spec);
        }
        changes.touched.insert(api::NODE_SCOPE.to_owned());
        Ok(Surrender::Surrendered)
    }

    pub(super) fn reclaim_block(
        &mut self,
        pool: &PoolName,
        spec: &RangeSpec,
        changes: &mut Changes,
    ) -> Result<(), OpError> {
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        let surrendered = spec_mut(scope, pool)
            .and_then(|stored| stored.entry_at(spec).map(|i| stored.ranges[i].clone()))
            .is_some_and(|entry| capacity::is_surrendered(&entry));
        if !surrendered {
            return Ok(());
        }
        let new_pool = !scope.engine.pool_names().contains(pool);
        if new_pool {
            scope.engine.add_pool(pool, Default::default())?;
        }
        scope.engine.add_range(pool, *spec)?;
        capacity::note_granted(ensure_spec(scope, pool)?, spec);
        changes.touched.insert(api::NODE_SCOPE.to_owned());
        Ok(())
    }

    pub(super) fn block_report(&self) -> Result<BlockReport, OpError> {
        let scope = self.scope(api::NODE_SCOPE)?;
        let mut report = BlockReport::default();
        for pool in scope.engine.pool_names() {
            for family in [Family::V4, Family::V6] {
                if let Ok(stats) = scope.engine.stats(&pool, family) {
                    report.stats.push((
                        pool.clone(),
                        family,
                        stats.used,
                        u64::try_from(stats.free).unwrap_or(u64::MAX),
                    ));
                }
            }
        }
        for stored in &scope.config.pools {
            let Ok(name) = PoolName::new(&stored.name) else {
                continue;
            };
            let engine_ranges = scope.engine.ranges(&name).unwrap_or_default();
            for entry in &stored.ranges {
                if entry.source != corral_store::RangeSource::Cluster {
                    continue;
                }
                let Some(spec) = entry.spec() else { continue };
                if capacity::is_surrendered(entry) {
                    report.surrendered.push((name.clone(), spec));
                } else if let Some(info) = engine_ranges.iter().find(|r| same(&r.spec, &spec)) {
                    report.ranges.push(HeldRange {
                        pool: name.clone(),
                        spec,
                        n_allocated: info.n_allocated,
                        draining: info.draining,
                    });
                }
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use corral_store::{ScopeConfig, SqliteStore};

    use super::super::{ClusterRanges, Op};
    use super::*;
    use crate::node::Reply;

    const A: &str = "10.61.0.0/28";
    const B: &str = "10.61.0.16/28";

    fn pool() -> PoolName {
        PoolName::new("small").unwrap()
    }

    fn grants(list: &[&str]) -> Op {
        Op::SetClusterRanges(ClusterRanges {
            ranges: list.iter().map(|r| (pool(), r.parse().unwrap())).collect(),
            ..ClusterRanges::default()
        })
    }

    fn surrender(range: &str) -> Op {
        Op::SurrenderBlock {
            pool: pool(),
            range: range.parse().unwrap(),
        }
    }

    fn run<S: Store, C: Clock>(node: &mut NodeState<S, C>, op: Op) -> Reply {
        node.run_batch(vec![op]).remove(0).unwrap()
    }

    fn report<S: Store, C: Clock>(node: &mut NodeState<S, C>) -> BlockReport {
        match run(node, Op::BlockReport) {
            Reply::Blocks(report) => report,
            other => panic!("{other:?}"),
        }
    }

    fn active<S: Store, C: Clock>(node: &mut NodeState<S, C>) -> Vec<String> {
        report(node)
            .ranges
            .iter()
            .filter(|r| !r.draining)
            .map(|r| r.spec.to_string())
            .collect()
    }

    fn surrendered<S: Store, C: Clock>(node: &mut NodeState<S, C>) -> Vec<String> {
        report(node)
            .surrendered
            .iter()
            .map(|(_, r)| r.to_string())
            .collect()
    }

    fn cni_add(container: &str) -> Op {
        Op::CniAdd(
            api::CniAddRequest {
                network: api::CniNetwork::on_node_pool("net", "small"),
                key: api::AttachmentKey {
                    network: "net".into(),
                    container_id: container.into(),
                    ifname: "eth0".into(),
                },
                owner: container.into(),
                sets: vec![],
            }
            .try_into()
            .unwrap(),
        )
    }

    #[test]
    fn no_range_is_added_over_a_surrendered_block() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        run(&mut node, grants(&[A, B]));
        run(&mut node, surrender(B));
        // The API adding the same addresses (in this pool or another) is refused: the leader
        // may release the block any moment.
        for (pool, range) in [("small", B), ("other", "10.61.0.16/29")] {
            let error = node
                .run_batch(vec![Op::AddRange(
                    api::RangeRequest {
                        scope: api::NODE_SCOPE.into(),
                        pool: pool.into(),
                        range: range.into(),
                    }
                    .try_into()
                    .unwrap(),
                )])
                .remove(0)
                .unwrap_err();
            assert_eq!(error.code, api::ErrorCode::Conflict, "{error:?}");
            assert!(error.message.contains("surrendered"), "{}", error.message);
        }
        assert_eq!(active(&mut node), [A]);
        assert_eq!(surrendered(&mut node), [B]);
    }

    #[test]
    fn a_dual_stack_block_pool_waits_for_both_families() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        let dual = |list: &[&str]| {
            Op::SetClusterRanges(ClusterRanges {
                ranges: list.iter().map(|r| (pool(), r.parse().unwrap())).collect(),
                block_families: [(pool(), vec![Family::V4, Family::V6])].into(),
            })
        };
        // Only the IPv4 block so far: the ADD is told to retry, naming the pool, and holds
        // nothing.
        run(&mut node, dual(&[A]));
        let error = node.run_batch(vec![cni_add("c1")]).remove(0).unwrap_err();
        assert_eq!(error.code, api::ErrorCode::RetryLater, "{error:?}");
        assert_eq!(error.pool.as_deref(), Some("small"));
        assert!(error.message.contains("ipv6"), "{}", error.message);
        // Both families: one address of each.
        run(&mut node, dual(&[A, "fd61::/124"]));
        match run(&mut node, cni_add("c1")) {
            Reply::Allocated(got) => assert_eq!(got.allocations.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_empty_block_is_surrendered_durably_and_stays_out_while_granted() {
        let dir = tempfile::tempdir().unwrap();
        let open = || SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(open(), &ScopeConfig::default()).unwrap();
        run(&mut node, grants(&[A, B]));
        assert!(matches!(
            run(&mut node, surrender(B)),
            Reply::Surrender(Surrender::Surrendered)
        ));
        assert_eq!(active(&mut node), [A]);
        assert_eq!(surrendered(&mut node), [B]);
        // The same grants again: B stays out; nothing comes from it.
        run(&mut node, grants(&[A, B]));
        assert_eq!(active(&mut node), [A]);
        let a: corral_core::IpNet = A.parse().unwrap();
        for i in 0..20 {
            match node.run_batch(vec![cni_add(&format!("c{i}"))]).remove(0) {
                Ok(Reply::Allocated(got)) => assert!(a.contains(&got.allocations[0].address)),
                Ok(other) => panic!("{other:?}"),
                Err(error) => assert_eq!(error.code, api::ErrorCode::Exhausted, "{error:?}"),
            }
        }
        // A crash and restart: still surrendered, and saying so again answers "already".
        drop(node);
        let mut node = NodeState::restore(open(), &ScopeConfig::default()).unwrap();
        assert_eq!(surrendered(&mut node), [B]);
        assert_eq!(active(&mut node), [A]);
        assert!(matches!(
            run(&mut node, surrender(B)),
            Reply::Surrender(Surrender::AlreadySurrendered)
        ));
        // Taken back while granted: active again.
        run(
            &mut node,
            Op::ReclaimBlock {
                pool: pool(),
                range: B.parse().unwrap(),
            },
        );
        assert_eq!(active(&mut node), [A, B]);
        assert!(surrendered(&mut node).is_empty());
        // Surrendered again, then the grant goes: forgotten.
        run(&mut node, surrender(B));
        run(&mut node, grants(&[A]));
        assert!(surrendered(&mut node).is_empty());
        assert_eq!(active(&mut node), [A]);
        drop(node);
        let mut node = NodeState::restore(open(), &ScopeConfig::default()).unwrap();
        assert!(surrendered(&mut node).is_empty());
    }

    #[test]
    fn a_block_in_use_or_not_held_is_refused_and_nothing_changes() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &ScopeConfig::default()).unwrap();
        run(&mut node, grants(&[A]));
        run(&mut node, cni_add("c1"));
        let commits = store.commits();
        match run(&mut node, surrender(A)) {
            Reply::Surrender(Surrender::Refused(reason)) => {
                assert!(reason.contains("1 allocation"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        match run(&mut node, surrender(B)) {
            Reply::Surrender(Surrender::Refused(reason)) => {
                assert!(reason.contains("does not hold"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(store.commits(), commits, "a refusal writes nothing");
        assert_eq!(active(&mut node), [A]);
        assert!(surrendered(&mut node).is_empty());
    }
}
