//! The agent's state: one engine per scope, kept in memory, and the store they are durable in.
//!
//! [`NodeState`] is plain synchronous code, driven by one thread at a time (see
//! `committer.rs`). It applies a *batch* of operations to the engines, collecting the rows
//! they change, then makes the whole batch durable in one transaction (one fsync) before any
//! of its answers is sent: the group commit. A batch whose commit fails is answered with
//! errors, and the scopes it touched are rebuilt from the store, so memory never runs ahead
//! of the disk.
//!
//! It is generic over the store (`corral_store::Store`: SQLite in the agent, `MemoryStore` in
//! tests that need faults) and over the clock ([`Clock`]: the system's, or one a test moves),
//! and reaches the disk only through the store it is given: no sockets, no threads, no
//! timers, so the committer drives it and tests call it directly.
//!
//! The files, bottom up (each imports only files above it in this list, and this file only
//! declares and re-exports):
//!
//! - `request.rs` — the operations' arguments in domain terms (parsed pools, keys,
//!   addresses, a CNI network's configuration), which the API builds at its edge;
//! - `wire.rs` — the engine's values as the API answers them;
//! - `scope.rs` — a scope (configuration, engine, interface tables), the rows a change writes
//!   and how a batch persists them;
//! - `op.rs` — the operations ([`Op`]), their answers ([`Reply`]) and the types they carry;
//! - `state.rs` — [`NodeState`] itself, its [`Clock`], restore at start, its counters;
//! - `scopes.rs` — scopes: lookup, a CNI network's scope under its configuration, rebuilds;
//! - `interfaces.rs`, `node_pool.rs`, `cloud.rs`, `blocks.rs`, `gc.rs`, `ops.rs` — the
//!   operations of each feature (interface pools, CNI on the node's pools, cloud pools, the
//!   release handshake of blocks, leak collection, allocation and the CNI verbs);
//! - `history.rs` — the allocation history read back (every commit writes it: `scope.rs`);
//! - `dispatch.rs` — one operation applied: the match from [`Op`] to the code that runs it;
//! - `batch.rs` — the group commit: a batch applied, then committed in one transaction.

mod batch;
mod blocks;
mod cloud;
mod dispatch;
mod gc;
mod history;
mod interfaces;
mod node_pool;
mod op;
mod ops;
mod request;
mod scope;
mod scopes;
mod state;
#[cfg(test)]
pub(crate) mod testing;
mod wire;

pub use crate::error::OpError;
pub use batch::RunBatch;
/// The requests of the operations whose argument another shares (or that take none); the
/// rest are their argument types ([`Allocate`], [`ClusterRanges`], ...).
pub use op::{
    AddInterfaceAddress, AddRange, Dump, Export, Gauges, Import, Interface, InterfaceGauges,
    Interfaces, Pools, ReclaimBlock, RemoveInterface, RemoveInterfaceAddress, RemoveRange,
    ReportBlocks, ReportCloud, Status, SurrenderBlock, SurrenderCloudAddress, Tick,
};
pub use op::{
    BlockReport, CloudAddress, CloudInterface, CloudInterfaces, CloudOutcome, CloudReport,
    ClusterRanges, ClusterRangesOutcome, FROZEN_REASON, Gauge, HeldRange, InterfaceGauge, Op,
    Reply, Request, SURRENDERED_REASON, Surrender,
};
pub use request::{
    AddExclusion, AddInterface, Allocate, CniAdd, CniAddSets, CniCheck, CniDel, CniGc, CniNetwork,
    CniSet, CniStatus, Gc, History, ImportIpamd, LeaseStart, LeaseStop, NetworkPools, PoolRange,
    Release, ReleaseOf, RemoveExclusion, Wanted,
};
pub use state::{Clock, InterfaceCounters, InterfaceOutcome, NodeState, SystemClock, now};

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::path::Path;

    use std::time::Duration;

    use corral_api as api;
    use corral_api::ErrorCode;
    use corral_core::{PoolName, RangeSpec, Timestamp};
    use corral_store::{ScopeConfig, SqliteStore, Store};

    use super::testing::{allocate, attachment, cni_add, cni_network, file_pool};
    use super::*;

    fn add(container: &str, cooldown_ms: u64) -> Op {
        cni_add(cni_network("10.5.0.0/29", cooldown_ms), container)
    }

    fn address(answer: &Result<Reply, OpError>) -> IpAddr {
        match answer {
            Ok(Reply::Allocated(a)) => a.allocations[0].address,
            other => panic!("{other:?}"),
        }
    }

    /// A clock the test moves.
    #[derive(Clone, Debug, Default)]
    struct ManualClock(std::sync::Arc<std::sync::atomic::AtomicU64>);

    impl ManualClock {
        fn advance(&self, millis: u64) {
            self.0
                .fetch_add(millis, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Timestamp {
            Timestamp::from_unix_millis(
                1_000_000 + self.0.load(std::sync::atomic::Ordering::SeqCst),
            )
        }
    }

    fn node_allocate(owner: &str, lease_ms: Option<u64>) -> Op {
        allocate(api::NODE_SCOPE, "default", owner, None, lease_ms)
    }

    fn declared() -> ScopeConfig {
        ScopeConfig {
            pools: vec![file_pool(
                &PoolName::default_pool(),
                Duration::from_secs(30),
                "10.9.0.0/29",
            )],
        }
    }

    /// Leases run out when the clock says so: no sleeping, and a restore in between keeps them.
    #[test]
    fn a_lease_expires_when_its_time_has_come_and_not_before() {
        let store = corral_store::MemoryStore::new();
        let clock = ManualClock::default();
        let mut node = NodeState::restore_with(store.clone(), &declared(), clock.clone()).unwrap();
        let leased = address(&node.run_batch(vec![node_allocate("short", Some(1_000))])[0]);
        address(&node.run_batch(vec![node_allocate("keeper", None)])[0]);
        clock.advance(999);
        assert!(matches!(
            node.run_batch(vec![Op::Tick])[0],
            Ok(Reply::Expired(0))
        ));
        drop(node);
        let mut node = NodeState::restore_with(store.clone(), &declared(), clock.clone()).unwrap();
        clock.advance(1);
        assert!(matches!(
            node.run_batch(vec![Op::Tick])[0],
            Ok(Reply::Expired(1))
        ));
        let dump = node.dump(None).unwrap();
        let held: Vec<IpAddr> = dump
            .scopes
            .iter()
            .flat_map(|s| &s.pools)
            .flat_map(|p| &p.allocations)
            .map(|a| a.address)
            .collect();
        assert_eq!(held.len(), 1);
        assert!(!held.contains(&leased));
    }

    /// A failed commit answers 503, and the scope is rebuilt from the store under the
    /// configuration the store holds: the failed batch's range is not in memory either.
    #[test]
    fn a_failed_commit_forgets_the_batchs_changes_configuration_included() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        let add = |range: &str| {
            Op::AddRange(
                api::RangeRequest {
                    scope: api::NODE_SCOPE.into(),
                    pool: "default".into(),
                    range: range.into(),
                }
                .try_into()
                .unwrap(),
            )
        };
        store.fail_next_commits(1);
        let answers = node.run_batch(vec![add("10.10.0.0/24"), node_allocate("x", None)]);
        for answer in &answers {
            let error = answer.as_ref().unwrap_err();
            assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
        }
        let ranges = |node: &NodeState<corral_store::MemoryStore>| -> Vec<String> {
            node.pools(None).unwrap().pools[0]
                .ranges
                .iter()
                .map(|r| r.range.clone())
                .collect()
        };
        assert_eq!(ranges(&node), ["10.9.0.0/29"]);
        assert_eq!(
            node.dump(None).unwrap().scopes[0].pools[0]
                .allocations
                .len(),
            0
        );
        assert!(node.run_batch(vec![add("10.10.0.0/24")])[0].is_ok());
        assert_eq!(ranges(&node), ["10.9.0.0/29", "10.10.0.0/24"]);
    }

    /// Regression (podman): `corral status --scope <network>` showed an empty `default` pool,
    /// the engine's implicit one, beside the network's real pools.
    #[test]
    fn a_networks_status_shows_only_its_own_pools() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        address(&node.run_batch(vec![add("c1", 0)])[0]);
        let status = node.status(Some("net"), now()).unwrap();
        let pools: Vec<&str> = status.scopes[0]
            .pools
            .iter()
            .map(|p| p.pool.as_str())
            .collect();
        assert_eq!(pools, ["net"]);
        let listed = node.pools(Some("net")).unwrap();
        assert_eq!(listed.pools.len(), 1);
        assert_eq!(listed.pools[0].ranges[0].source, api::RangeSource::Cni);
    }

    /// Regression: a changed network configuration rebuilds the scope from the store, so
    /// what the batch changed before must be committed first; otherwise the rebuilt engine
    /// does not know it and hands the same address out again.
    #[test]
    fn a_configuration_change_inside_a_batch_sees_the_batch_so_far() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        let answers = node.run_batch(vec![add("c1", 0), add("c2", 1000)]);
        let (a, b) = (address(&answers[0]), address(&answers[1]));
        assert_ne!(a, b);
        // What memory says is what the disk says.
        let dump = node.dump(Some("net")).unwrap();
        drop(node);
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        assert_eq!(node.dump(Some("net")).unwrap(), dump);
    }

    // ---- the cluster's grants (Op::SetClusterRanges) -------------------------------------

    fn grant(list: &[(&str, &str)]) -> Op {
        Op::SetClusterRanges(ClusterRanges {
            ranges: list
                .iter()
                .map(|(pool, range)| (PoolName::new(pool).unwrap(), range.parse().unwrap()))
                .collect(),
            ..ClusterRanges::default()
        })
    }

    fn outcome(answer: Result<Reply, OpError>) -> ClusterRangesOutcome {
        match answer {
            Ok(Reply::ClusterRanges(outcome)) => outcome,
            other => panic!("{other:?}"),
        }
    }

    fn granted(list: &[(&str, &str)]) -> Vec<(PoolName, RangeSpec)> {
        list.iter()
            .map(|(pool, range)| (PoolName::new(pool).unwrap(), range.parse().unwrap()))
            .collect()
    }

    /// `(pool, range, source, draining)` of every range of the node scope.
    fn node_ranges<S: Store, C: Clock>(
        node: &NodeState<S, C>,
    ) -> Vec<(String, String, api::RangeSource, bool)> {
        node.pools(Some(api::NODE_SCOPE))
            .unwrap()
            .pools
            .into_iter()
            .flat_map(|p| {
                p.ranges
                    .into_iter()
                    .map(move |r| (p.name.clone(), r.range, r.source, r.draining))
            })
            .collect()
    }

    fn pods_allocate(owner: &str) -> Op {
        match node_allocate(owner, None) {
            Op::Allocate(request) => Op::Allocate(Allocate {
                pool: PoolName::new("pods").unwrap(),
                ..request
            }),
            _ => unreachable!(),
        }
    }

    fn run_one<S: Store, C: Clock>(node: &mut NodeState<S, C>, op: Op) -> Result<Reply, OpError> {
        node.run_batch(vec![op]).remove(0)
    }

    const NODE_CIDRS: [(&str, &str); 2] = [("pods", "10.77.0.0/24"), ("pods", "fd77::/120")];

    #[test]
    fn granted_ranges_are_added_to_a_new_pool_as_the_clusters_and_serve_allocations() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        let done = outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        assert_eq!(done.added, granted(&NODE_CIDRS));
        assert!(done.removed.is_empty() && done.draining.is_empty() && done.refused.is_empty());
        let ranges = node_ranges(&node);
        assert!(ranges.contains(&(
            "pods".into(),
            "10.77.0.0/24".into(),
            api::RangeSource::Cluster,
            false
        )));
        assert!(ranges.contains(&(
            "pods".into(),
            "fd77::/120".into(),
            api::RangeSource::Cluster,
            false
        )));
        let dual = Op::Allocate(Allocate {
            wanted: Wanted::Dual,
            ..match pods_allocate("pod") {
                Op::Allocate(request) => request,
                _ => unreachable!(),
            }
        });
        match run_one(&mut node, dual) {
            Ok(Reply::Allocated(a)) => assert_eq!(a.allocations.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_same_grants_again_change_nothing_and_write_nothing() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        let before = node_ranges(&node);
        let commits = store.commits();
        let again = outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        assert_eq!(again, ClusterRangesOutcome::default());
        assert_eq!(store.commits(), commits);
        assert_eq!(node_ranges(&node), before);
    }

    #[test]
    fn a_range_no_longer_granted_goes_at_once_when_empty_and_drains_when_used() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        let held = address(&run_one(&mut node, pods_allocate("pod")));
        assert!(held.is_ipv4());
        // Only the file's range is left granted... to nobody: the cluster grants nothing now.
        let done = outcome(run_one(&mut node, grant(&[])));
        assert_eq!(done.removed, granted(&[("pods", "fd77::/120")]));
        assert_eq!(done.draining, granted(&[("pods", "10.77.0.0/24")]));
        let pods: Vec<_> = node_ranges(&node)
            .into_iter()
            .filter(|r| r.0 == "pods")
            .collect();
        assert_eq!(
            pods,
            [(
                "pods".to_owned(),
                "10.77.0.0/24".to_owned(),
                api::RangeSource::Cluster,
                true
            )]
        );
        // Nothing new from a draining range; the allocation stays until released.
        let error = run_one(&mut node, pods_allocate("other")).unwrap_err();
        assert_eq!(error.code, ErrorCode::Exhausted, "{error:?}");
        assert_eq!(
            node.dump(Some(api::NODE_SCOPE)).unwrap().scopes[0]
                .pools
                .len(),
            2
        );
        let release = Op::Release(
            api::ReleaseRequest {
                scope: api::NODE_SCOPE.into(),
                key: None,
                address: Some(held),
                generation: None,
                owner: None,
            }
            .try_into()
            .unwrap(),
        );
        run_one(&mut node, release).unwrap();
        assert!(node_ranges(&node).iter().all(|r| r.0 != "pods"));
        // The stored configuration agrees after a restart.
        drop(node);
        let node = NodeState::restore(store, &declared()).unwrap();
        assert!(node_ranges(&node).iter().all(|r| r.0 != "pods"));
    }

    #[test]
    fn granting_a_draining_range_again_cancels_its_drain() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        address(&run_one(&mut node, pods_allocate("pod")));
        let done = outcome(run_one(&mut node, grant(&[("pods", "fd77::/120")])));
        assert_eq!(done.draining, granted(&[("pods", "10.77.0.0/24")]));
        let done = outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        assert_eq!(done.added, granted(&[("pods", "10.77.0.0/24")]));
        assert!(
            node_ranges(&node)
                .iter()
                .filter(|r| r.0 == "pods")
                .all(|r| !r.3)
        );
        address(&run_one(&mut node, pods_allocate("another")));
    }

    #[test]
    fn a_grant_over_a_file_or_api_range_is_reported_and_the_rest_applied() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        let add_api = Op::AddRange(
            api::RangeRequest {
                scope: api::NODE_SCOPE.into(),
                pool: "manual".into(),
                range: "10.50.0.0/24".into(),
            }
            .try_into()
            .unwrap(),
        );
        run_one(&mut node, add_api).unwrap();
        let before = node_ranges(&node);
        let done = outcome(run_one(
            &mut node,
            grant(&[
                ("pods", "10.9.0.0/28"),
                ("default", "10.50.0.0/25"),
                ("pods", "10.77.0.0/24"),
            ]),
        ));
        assert_eq!(done.added, granted(&[("pods", "10.77.0.0/24")]));
        assert_eq!(done.refused.len(), 2, "{:?}", done.refused);
        assert!(
            done.refused[0].contains("overlaps file range 10.9.0.0/29 of pool default"),
            "{:?}",
            done.refused
        );
        assert!(
            done.refused[1].contains("overlaps api range 10.50.0.0/24 of pool manual"),
            "{:?}",
            done.refused
        );
        // The file's and the API's ranges are as they were.
        let after = node_ranges(&node);
        for range in &before {
            assert!(after.contains(range), "{range:?} in {after:?}");
        }
        let status = node.status(None, now()).unwrap();
        assert!(
            done.refused.iter().all(|r| status.warnings.contains(r)),
            "{:?}",
            status.warnings
        );
        // A set of grants that fits clears the warnings.
        outcome(run_one(&mut node, grant(&[("pods", "10.77.0.0/24")])));
        assert!(node.status(None, now()).unwrap().warnings.is_empty());
    }

    #[test]
    fn cluster_ranges_survive_a_restart_as_they_were_whatever_the_file_says() {
        let dir = tempfile::tempdir().unwrap();
        let open = || SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(open(), &declared()).unwrap();
        outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        address(&run_one(&mut node, pods_allocate("pod")));
        // The IPv4 range drains, the IPv6 one stays active.
        outcome(run_one(&mut node, grant(&[("pods", "fd77::/120")])));
        let pods = |node: &NodeState| -> Vec<_> {
            node_ranges(node)
                .into_iter()
                .filter(|r| r.0 == "pods")
                .collect()
        };
        let before = pods(&node);
        assert_eq!(before.len(), 2);
        drop(node);
        // A file that declares a pool `pods` with one of the cluster's ranges and another.
        let file = ScopeConfig {
            pools: vec![file_pool(
                &PoolName::new("pods").unwrap(),
                Duration::from_secs(30),
                "fd77::/120",
            )],
        };
        let node = NodeState::restore(open(), &file).unwrap();
        assert_eq!(pods(&node), before);
        assert!(
            node.warnings()
                .iter()
                .any(|w| w.contains("granted by the cluster")),
            "{:?}",
            node.warnings()
        );
        drop(node);
        // And without any file at all.
        let node = NodeState::restore(open(), &ScopeConfig::default()).unwrap();
        assert_eq!(pods(&node), before);
    }

    /// An interface-backed pool takes no plain range, from the API or the cluster, and an
    /// interface goes into no pool of plain ranges; each refusal changes nothing.
    #[test]
    fn interface_pools_and_plain_ranges_do_not_mix() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        let eni = |pool: &str, id: &str, device: u32| {
            eni_op(pool, id, device, &["10.60.0.10", "10.60.0.16/28"])
        };
        run_one(&mut node, eni("eni", "eni-1", 1)).unwrap();
        let before = node_ranges(&node);
        let error = run_one(&mut node, eni("default", "eni-2", 2)).unwrap_err();
        assert_eq!(error.code, ErrorCode::PoolKindMismatch, "{error:?}");
        let add = Op::AddRange(
            api::RangeRequest {
                scope: api::NODE_SCOPE.into(),
                pool: "eni".into(),
                range: "10.61.0.0/24".into(),
            }
            .try_into()
            .unwrap(),
        );
        let error = run_one(&mut node, add).unwrap_err();
        assert_eq!(error.code, ErrorCode::PoolKindMismatch, "{error:?}");
        let done = outcome(run_one(&mut node, grant(&[("eni", "10.62.0.0/24")])));
        assert!(done.added.is_empty(), "{done:?}");
        assert!(done.refused[0].contains("interface-backed"), "{done:?}");
        // An interface whose second address is refused leaves nothing behind.
        let mut bad = match eni("eni", "eni-3", 3) {
            Op::AddInterface(request) => request,
            _ => unreachable!(),
        };
        bad.addresses = vec![
            "10.60.0.11/32".parse().unwrap(),
            "10.60.0.10/32".parse().unwrap(),
        ];
        let error = run_one(&mut node, Op::AddInterface(bad)).unwrap_err();
        assert_eq!(error.code, ErrorCode::AddressAlreadyPresent, "{error:?}");
        assert_eq!(node_ranges(&node), before);
        // And the table and the store agree after a restart.
        drop(node);
        let mut node = NodeState::restore(store, &declared()).unwrap();
        assert_eq!(node_ranges(&node), before);
        match run_one(
            &mut node,
            Op::Interfaces(Some(PoolName::new("eni").unwrap())),
        ) {
            Ok(Reply::Interfaces(list)) => {
                let ids: Vec<&str> = list.pools[0]
                    .interfaces
                    .iter()
                    .map(|i| i.id.as_str())
                    .collect();
                assert_eq!(ids, ["eni-1"]);
                assert_eq!(list.pools[0].total, 17);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failed_commit_of_the_grants_changes_nothing() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        let before = node_ranges(&node);
        store.fail_next_commits(1);
        let error = run_one(&mut node, grant(&NODE_CIDRS)).unwrap_err();
        assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
        assert_eq!(node_ranges(&node), before);
        drop(node);
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        assert_eq!(node_ranges(&node), before);
        let done = outcome(run_one(&mut node, grant(&NODE_CIDRS)));
        assert_eq!(done.added, granted(&NODE_CIDRS));
    }

    // ---- interface pools: trunk/excluded, file ranges, scopes, cooling -----------------

    /// The network of AWS VPC CNI's pods, served by the node's interface pool `eni`.
    fn eni_network() -> api::CniNetwork {
        api::CniNetwork::on_node_pool("aws-cni", "eni")
    }

    fn eni_op(pool: &str, id: &str, device: u32, addresses: &[&str]) -> Op {
        Op::AddInterface(
            api::InterfaceRequest {
                pool: pool.into(),
                id: id.into(),
                device_number: device,
                mac: format!("0a:00:00:00:00:{device:02x}"),
                subnets: vec!["10.60.0.0/24".into()],
                gateways: vec![],
                routes: vec![],
                primary: false,
                primary_addresses: vec![],
                trunk: false,
                excluded: false,
                addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            }
            .try_into()
            .unwrap(),
        )
    }

    /// The configuration file declares a plain range in a pool that has become
    /// interface-backed at run time (or an operator reuses the name): the agent must still
    /// start (a warning, as for every other range the file cannot apply).
    #[test]
    fn a_file_range_in_an_interface_pool_is_skipped_and_the_agent_restarts() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        run_one(&mut node, eni_op("eni", "eni-1", 1, &["10.60.0.10"])).unwrap();
        drop(node);
        let mut file = declared();
        file.pools.push(file_pool(
            &PoolName::new("eni").unwrap(),
            Duration::from_secs(30),
            "10.61.0.0/24",
        ));
        let mut restored = NodeState::restore(store, &file).expect("the agent starts");
        let Ok(Reply::Checkpoint(doc)) = run_one(&mut restored, Op::Export) else {
            panic!("export")
        };
        assert!(!doc.to_string().contains("10.61.0.0"), "{doc}");
    }

    /// A state checkpoint whose non-node scope carries interfaces is imported; a keyed
    /// allocation in that scope then runs `assign_on_interface` on the *node* scope, which
    /// has no such pool: `expect("an interface-backed pool")` panics the node state.
    #[test]
    fn interfaces_imported_into_another_scope_are_refused() {
        let mut a = NodeState::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        run_one(&mut a, eni_op("eni", "eni-1", 1, &["10.60.0.10"])).unwrap();
        let Ok(Reply::Checkpoint(mut doc)) = run_one(&mut a, Op::Export) else {
            panic!("export")
        };
        for scope in doc["scopes"].as_array_mut().unwrap() {
            if scope["scope"] == "node" {
                scope["scope"] = serde_json::json!("net1");
            }
        }
        let mut b = NodeState::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        let Err(refused) = run_one(
            &mut b,
            Op::Import(serde_json::from_value(doc.clone()).unwrap()),
        ) else {
            panic!("imported interfaces into scope net1: {doc}")
        };
        assert_eq!(refused.code, ErrorCode::BadRequest, "{refused:?}");
        assert!(
            refused.message.contains("only the \"node\" scope"),
            "{refused:?}"
        );
        // Nothing was imported: the scope does not exist, and a keyed allocation there is a
        // typed refusal, not a panic.
        let answer = run_one(
            &mut b,
            allocate("net1", "eni", "pod", Some(attachment("net1", "c1")), None),
        );
        assert!(answer.is_err(), "{answer:?}");
    }

    /// An excluded interface ("excluded from pod addresses") and a trunk ("never pod
    /// addresses of its own") must not serve a keyed allocation.
    #[test]
    fn excluded_and_trunk_interfaces_serve_no_pod() {
        let store = corral_store::MemoryStore::new();
        let mut node = NodeState::restore(store.clone(), &declared()).unwrap();
        for (id, device, trunk, excluded, address) in [
            ("eni-x", 1, false, true, "10.60.0.10"),
            ("eni-t", 2, true, false, "10.60.0.11"),
        ] {
            let Op::AddInterface(mut request) = eni_op("eni", id, device, &[address]) else {
                unreachable!()
            };
            request.trunk = trunk;
            request.excluded = excluded;
            request.mac = format!("0a:00:00:00:00:0{device}").parse().unwrap();
            run_one(&mut node, Op::AddInterface(request)).unwrap();
        }
        let allocate = |node: &mut NodeState<corral_store::MemoryStore, _>| {
            run_one(
                node,
                allocate(
                    api::NODE_SCOPE,
                    "eni",
                    "pod",
                    Some(attachment("aws-cni", "c1")),
                    None,
                ),
            )
        };
        let answer = allocate(&mut node);
        let Err(error) = answer else {
            panic!("handed out {answer:?}")
        };
        assert_eq!(error.code, ErrorCode::Exhausted, "{error:?}");
        // The exclusions are stored with the interfaces: a restarted agent refuses too.
        drop(node);
        let mut node = NodeState::restore(store, &declared()).unwrap();
        let answer = allocate(&mut node);
        assert!(answer.is_err(), "handed out {answer:?} after a restart");
    }

    /// A cooling address is not removed without force: [`ErrorCode::AddressInUse`] ("the
    /// address or prefix holds allocated or cooling addresses (`force` drains it)"). Removed,
    /// its cooldown would go with it, and added back (the cloud returns it) it would go to the
    /// next pod at once, inside the cooldown its last holder's peers still count on.
    #[test]
    fn a_cooling_address_is_not_removed_without_force() {
        let mut node = NodeState::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        run_one(&mut node, eni_op("eni", "eni-1", 1, &["10.60.0.10"])).unwrap();
        let alloc = |container: &str| {
            allocate(
                api::NODE_SCOPE,
                "eni",
                "pod",
                Some(attachment("aws-cni", container)),
                None,
            )
        };
        run_one(&mut node, alloc("c1")).unwrap();
        run_one(
            &mut node,
            Op::Release(
                api::ReleaseRequest {
                    scope: api::NODE_SCOPE.into(),
                    key: Some(attachment("aws-cni", "c1")),
                    ..Default::default()
                }
                .try_into()
                .unwrap(),
            ),
        )
        .unwrap();
        let removed = run_one(
            &mut node,
            Op::RemoveInterfaceAddress {
                id: corral_core::InterfaceId::new("eni-1").unwrap(),
                address: "10.60.0.10/32".parse().unwrap(),
                force: false,
            },
        );
        if removed.is_ok() {
            run_one(
                &mut node,
                Op::AddInterfaceAddress {
                    id: corral_core::InterfaceId::new("eni-1").unwrap(),
                    address: "10.60.0.10/32".parse().unwrap(),
                },
            )
            .unwrap();
            let again = run_one(&mut node, alloc("c2"));
            panic!("removed while cooling; re-added, then c2 got {again:?}");
        }
        let refused = removed.unwrap_err();
        assert_eq!(refused.code, ErrorCode::AddressInUse, "{refused:?}");
    }

    /// An ipamd checkpoint with an entry backfilled from CRI imports (under the container's
    /// migrated key), and the runtime's later CHECK and DEL, which name the real network and
    /// interface, find it; the same import again (its answer lost) succeeds and changes
    /// nothing, while a key holding another address is refused.
    #[test]
    fn ipamd_import_takes_backfilled_entries_and_repeats() {
        let mut node = NodeState::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        run_one(
            &mut node,
            eni_op(
                "eni",
                "eni-1",
                1,
                &["10.60.0.10", "10.60.0.11", "10.60.0.12"],
            ),
        )
        .unwrap();
        let checkpoint = |c1: &str| {
            serde_json::json!({"version": "vpc-cni-ipam/1", "allocations": [
                {"networkName": "aws-cni", "containerID": "c1", "ifName": "eth0", "ipv4": c1,
                 "allocationTimestamp": 0,
                 "metadata": {"k8sPodNamespace": "default", "k8sPodName": "one"}},
                {"networkName": "_migrated-from-cri", "containerID": "c0ffee",
                 "ifName": "unknown", "ipv4": "10.60.0.11", "allocationTimestamp": 0,
                 "metadata": {}}
            ]})
        };
        let import = |node: &mut NodeState<corral_store::MemoryStore, _>, c1: &str| {
            run_one(
                node,
                Op::ImportIpamd(
                    api::IpamdImportRequest {
                        pool: "eni".into(),
                        checkpoint: checkpoint(c1),
                    }
                    .try_into()
                    .unwrap(),
                ),
            )
        };
        let Ok(Reply::IpamdImported(first)) = import(&mut node, "10.60.0.10") else {
            panic!("import refused")
        };
        assert_eq!(first.imported.len(), 2, "{first:?}");
        assert_eq!(first.imported[1].key.network, "migrated-from-cri");
        let Ok(Reply::IpamdImported(again)) = import(&mut node, "10.60.0.10") else {
            panic!("the same import again was refused")
        };
        assert_eq!(again.imported, first.imported);
        let Err(error) = import(&mut node, "10.60.0.12") else {
            panic!("a key holding another address was taken over")
        };
        assert_eq!(error.code, ErrorCode::InUse, "{error:?}");
        let runtime_key = api::CniKeyRequest {
            network: eni_network(),
            key: attachment("aws-cni", "c0ffee"),
        };
        let Ok(Reply::Allocated(held)) = run_one(
            &mut node,
            Op::CniCheck(runtime_key.clone().try_into().unwrap()),
        ) else {
            panic!("check")
        };
        let addresses: Vec<String> = held
            .allocations
            .iter()
            .map(|a| a.address.to_string())
            .collect();
        assert_eq!(addresses, ["10.60.0.11"]);
        let Ok(Reply::Released(gone)) = run_one(
            &mut node,
            Op::CniDel(runtime_key.clone().try_into().unwrap()),
        ) else {
            panic!("del")
        };
        let addresses: Vec<String> = gone
            .released
            .iter()
            .map(|r| r.address.to_string())
            .collect();
        assert_eq!(addresses, ["10.60.0.11"]);
        // Gone: a second DEL releases nothing, and c1 keeps its address.
        let Ok(Reply::Released(gone)) =
            run_one(&mut node, Op::CniDel(runtime_key.try_into().unwrap()))
        else {
            panic!("del")
        };
        assert!(gone.released.is_empty(), "{gone:?}");
    }

    /// Every release is one event of the history, whichever way it came: a CNI DEL through an
    /// interface pool recorded its address's release twice (once by the unassign, once more
    /// with the engine's own releases).
    #[test]
    fn each_release_is_one_event_of_the_history_on_every_path() {
        let mut node = NodeState::restore(corral_store::MemoryStore::new(), &declared()).unwrap();
        let addresses = ["10.60.0.10", "10.60.0.11", "10.60.0.12"];
        run_one(&mut node, eni_op("eni", "eni-1", 1, &addresses)).unwrap();
        let network = eni_network();
        let add = Op::CniAdd(
            api::CniAddRequest {
                network: network.clone(),
                key: attachment("aws-cni", "via-cni"),
                owner: "via-cni".into(),
                sets: vec![],
            }
            .try_into()
            .unwrap(),
        );
        let del = api::CniKeyRequest {
            network,
            key: attachment("aws-cni", "via-cni"),
        };
        let keyed = Some(attachment("aws-cni", "via-api"));
        let by_key = api::ReleaseRequest {
            scope: api::NODE_SCOPE.into(),
            key: keyed.clone(),
            ..Default::default()
        };
        let release = |request: api::ReleaseRequest| Op::Release(request.try_into().unwrap());
        type Release = Box<dyn Fn(IpAddr) -> Op>;
        let cases: [(&str, Op, Release); 4] = [
            (
                "CNI DEL",
                add,
                Box::new(move |_| Op::CniDel(del.clone().try_into().unwrap())),
            ),
            (
                "release by key",
                allocate(api::NODE_SCOPE, "eni", "via-api", keyed, None),
                Box::new(move |_| release(by_key.clone())),
            ),
            (
                "release by address",
                allocate(api::NODE_SCOPE, "eni", "by-address", None, None),
                Box::new(move |addr| {
                    release(api::ReleaseRequest {
                        scope: api::NODE_SCOPE.into(),
                        address: Some(addr),
                        ..Default::default()
                    })
                }),
            ),
            (
                "release by owner",
                allocate(api::NODE_SCOPE, "default", "by-owner", None, None),
                Box::new(move |_| {
                    release(api::ReleaseRequest {
                        scope: api::NODE_SCOPE.into(),
                        owner: Some("by-owner".into()),
                        ..Default::default()
                    })
                }),
            ),
        ];
        for (path, add, release) in cases {
            let addr = address(&node.run_batch(vec![add])[0]);
            let Ok(Reply::Released(gone)) = run_one(&mut node, release(addr)) else {
                panic!("{path}: not released")
            };
            assert_eq!(gone.released.len(), 1, "{path}: {gone:?}");
            let query = corral_store::HistoryQuery {
                addr: Some(addr),
                limit: 100,
                ..Default::default()
            };
            let Ok(Reply::History(history)) = run_one(
                &mut node,
                Op::History(History {
                    query,
                    held_at: None,
                }),
            ) else {
                panic!("{path}: no history")
            };
            let kinds: Vec<_> = history.events.iter().map(|e| e.event).collect();
            assert_eq!(
                kinds,
                [api::HistoryKind::Released, api::HistoryKind::Allocated],
                "{path}: {addr}"
            );
        }
    }
}
