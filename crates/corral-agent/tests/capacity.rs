//! A pool's capacity has one source of truth, the scope's stored configuration: any sequence of
//! accepted API calls, then a restart, gives the same pools, ranges, states and allocations,
//! and a refused call changes nothing. Run against the real SQLite store, with a configuration
//! file whose ranges the calls remove, move and re-add.

use std::path::Path;

use corral_agent::node::{NodeState, Op, OpError, Reply};
use corral_api as api;
use corral_store::{PoolSpec, RangeEntry, RangeSource, RangeState, ScopeConfig, SqliteStore};
use proptest::prelude::*;

const SOCKET: &str = "/nonexistent/agent.sock";

fn file_pool(name: &str, ranges: &[&str]) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        cooldown_ms: 30_000,
        lowest_free: false,
        ranges: ranges
            .iter()
            .map(|range| RangeEntry {
                range: (*range).into(),
                source: RangeSource::File,
                state: RangeState::Active,
            })
            .collect(),
        exclusions: vec![],
        interfaces: vec![],
        interface_backed: false,
    }
}

/// The configuration file of most tests: pool `default` with a /28, pool `a` with a /24 that
/// the calls below overlap, remove and move.
fn declared() -> ScopeConfig {
    ScopeConfig {
        pools: vec![
            file_pool("default", &["10.88.0.0/28"]),
            file_pool("a", &["10.50.0.0/24"]),
        ],
    }
}

/// The file as an operator edits it between restarts: as `declared`, without pool `a`'s
/// range, or with that range moved to pool `b`.
fn file_variant(variant: usize) -> ScopeConfig {
    match variant % 3 {
        0 => declared(),
        1 => ScopeConfig {
            pools: vec![file_pool("default", &["10.88.0.0/28"]), file_pool("a", &[])],
        },
        _ => ScopeConfig {
            pools: vec![
                file_pool("default", &["10.88.0.0/28"]),
                file_pool("b", &["10.50.0.0/24"]),
            ],
        },
    }
}

fn open(dir: &Path, declared: &ScopeConfig) -> NodeState {
    let store = SqliteStore::open_owned(dir, Path::new(SOCKET)).expect("store opens");
    NodeState::restore(store, declared).expect("the agent restores its state")
}

/// [`open`] in a new temporary directory; bound as `let (dir, node) = ...`, the node state
/// closes before the directory goes.
fn open_new(declared: &ScopeConfig) -> (tempfile::TempDir, NodeState) {
    let dir = tempfile::tempdir().unwrap();
    let node = open(dir.path(), declared);
    (dir, node)
}

fn run(node: &mut NodeState, op: Op) -> Result<Reply, OpError> {
    node.run_batch(vec![op]).pop().expect("one answer")
}

fn range_request(pool: &str, range: &str) -> api::RangeRequest {
    api::RangeRequest {
        scope: api::NODE_SCOPE.into(),
        pool: pool.into(),
        range: range.into(),
    }
}

fn add_range(node: &mut NodeState, pool: &str, range: &str) -> Result<Reply, OpError> {
    run(node, Op::AddRange(range_request(pool, range).try_into()?))
}

fn remove_range(node: &mut NodeState, pool: &str, range: &str) -> Result<Reply, OpError> {
    run(
        node,
        Op::RemoveRange(range_request(pool, range).try_into()?),
    )
}

fn allocate(node: &mut NodeState, pool: &str, owner: &str) -> Result<std::net::IpAddr, OpError> {
    let request = api::AllocateRequest {
        scope: api::NODE_SCOPE.into(),
        pool: pool.into(),
        owner: owner.into(),
        key: None,
        family: None,
        address: None,
        lease_ms: None,
    };
    match run(node, Op::Allocate(request.try_into()?))? {
        Reply::Allocated(answer) => Ok(answer.allocations[0].address),
        other => panic!("allocate answered {other:?}"),
    }
}

fn release(node: &mut NodeState, address: std::net::IpAddr) {
    let request = api::ReleaseRequest {
        scope: api::NODE_SCOPE.into(),
        key: None,
        address: Some(address),
        generation: None,
        owner: None,
    };
    run(node, Op::Release(request.try_into().expect("release"))).expect("release");
}

fn pools(node: &mut NodeState) -> api::PoolsResponse {
    match run(node, Op::Pools(None)) {
        Ok(Reply::Pools(pools)) => pools,
        other => panic!("pools answered {other:?}"),
    }
}

fn pool<'a>(pools: &'a api::PoolsResponse, name: &str) -> Option<&'a api::PoolInfo> {
    pools
        .pools
        .iter()
        .find(|p| p.scope == "node" && p.name == name)
}

fn range_texts(pools: &api::PoolsResponse, name: &str) -> Vec<String> {
    pool(pools, name)
        .map(|p| p.ranges.iter().map(|r| r.range.clone()).collect())
        .unwrap_or_default()
}

/// Everything a restart must bring back: pools with their ranges (source, state, how many
/// allocations they hold), exclusions, removed file ranges; every allocation; and the whole
/// checkpoint (configuration, cooldowns with their times, next-fit positions, generations).
#[derive(Debug, PartialEq)]
struct Fingerprint {
    pools: api::PoolsResponse,
    dump: api::DumpResponse,
    checkpoint: serde_json::Value,
}

fn fingerprint(node: &mut NodeState) -> Fingerprint {
    let answers = node.run_batch(vec![Op::Pools(None), Op::Dump(None), Op::Export]);
    let mut answers = answers.into_iter();
    let (
        Some(Ok(Reply::Pools(pools))),
        Some(Ok(Reply::Dump(dump))),
        Some(Ok(Reply::Checkpoint(checkpoint))),
    ) = (answers.next(), answers.next(), answers.next())
    else {
        panic!("introspection failed");
    };
    Fingerprint {
        pools,
        dump,
        checkpoint,
    }
}

/// A checkpoint of the node scope with one pool `x` (no cooldown) holding `ranges` and
/// `allocations`.
fn node_checkpoint(ranges: serde_json::Value, allocations: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "format": "corral-checkpoint/1",
        "scopes": [{
            "scope": "node",
            "config": {"pools": [{"name": "x", "cooldown_ms": 0, "lowest_free": false,
                                  "ranges": ranges, "exclusions": []}]},
            "nextGeneration": 7,
            "allocations": allocations,
            "cooling": []
        }]
    })
}

// ---- regressions (issue 10, as a user met them) ----------------------------------------------

/// Removal named the range with its gateway; the store matched spec text, the engine
/// addresses, so the range came back on restart and, once another pool took it, the agent no
/// longer started ("range 10.50.0.0/24 overlaps range 10.50.0.0/24 of pool a", exit 4).
#[test]
fn a_range_removed_by_its_addresses_stays_removed_and_may_move_to_another_pool() {
    let (dir, mut node) = open_new(&ScopeConfig::default());
    add_range(&mut node, "a", "10.50.0.0/24").unwrap();
    match remove_range(&mut node, "a", "10.50.0.0/24,gateway=10.50.0.1").unwrap() {
        Reply::RangeRemoved(removed) => assert_eq!(removed.outcome, api::RangeRemoval::Removed),
        other => panic!("{other:?}"),
    }
    add_range(&mut node, "b", "10.50.0.0/24").unwrap();
    let before = fingerprint(&mut node);
    drop(node);
    let mut node = open(dir.path(), &ScopeConfig::default());
    assert_eq!(fingerprint(&mut node), before);
    let pools = pools(&mut node);
    assert_eq!(range_texts(&pools, "a"), Vec::<String>::new());
    assert_eq!(range_texts(&pools, "b"), ["10.50.0.0/24"]);
}

/// A range of the configuration file removed at run time reappeared on restart, and with
/// another pool added over it the agent no longer started.
#[test]
fn a_file_range_removed_at_run_time_is_not_resurrected_by_a_restart() {
    let (dir, mut node) = open_new(&declared());
    remove_range(&mut node, "a", "10.50.0.0/24").unwrap();
    add_range(&mut node, "b", "10.50.0.0/25").unwrap();
    let before = fingerprint(&mut node);
    assert_eq!(
        pool(&before.pools, "a").unwrap().removed,
        ["10.50.0.0/24"],
        "the file's range is listed as removed"
    );
    drop(node);
    let mut node = open(dir.path(), &declared());
    assert_eq!(fingerprint(&mut node), before);
    assert!(node.warnings().is_empty(), "{:?}", node.warnings());
    // Adding it back lifts the tombstone once the other pool has let go of its addresses.
    assert!(add_range(&mut node, "a", "10.50.0.0/24").is_err());
    remove_range(&mut node, "b", "10.50.0.0/25").unwrap();
    add_range(&mut node, "a", "10.50.0.0/24").unwrap();
    let pools = pools(&mut node);
    let a = pool(&pools, "a").unwrap();
    assert!(a.removed.is_empty());
    assert_eq!(a.ranges[0].source, api::RangeSource::File);
}

/// A range declared in the file over one added at run time is not applied, and the agent
/// says so instead of refusing to start.
#[test]
fn a_file_range_over_a_run_time_range_is_reported_not_fatal() {
    let (dir, mut node) = open_new(&ScopeConfig::default());
    add_range(&mut node, "b", "10.50.0.128/25").unwrap();
    drop(node);
    let mut node = open(dir.path(), &declared());
    assert_eq!(node.warnings().len(), 1, "{:?}", node.warnings());
    assert!(node.warnings()[0].contains("10.50.0.0/24 of pool a"));
    match run(&mut node, Op::Status(None)) {
        Ok(Reply::Status(status)) => assert_eq!(status.warnings, node.warnings()),
        other => panic!("{other:?}"),
    }
    let pools = pools(&mut node);
    assert_eq!(range_texts(&pools, "b"), ["10.50.0.128/25"]);
    assert_eq!(range_texts(&pools, "a"), Vec::<String>::new());
}

/// A draining range disappeared from `pool list` after a restart (and could then be added to
/// another pool), and re-adding it to its own pool, to cancel the drain, was refused.
#[test]
fn draining_survives_a_restart_can_be_cancelled_and_ends_with_the_last_release() {
    let (dir, mut node) = open_new(&ScopeConfig::default());
    add_range(&mut node, "a", "10.60.0.0/29,gateway=10.60.0.1").unwrap();
    let first = allocate(&mut node, "a", "one").unwrap();
    let second = allocate(&mut node, "a", "two").unwrap();
    match remove_range(&mut node, "a", "10.60.0.0/29").unwrap() {
        Reply::RangeRemoved(removed) => assert_eq!(removed.outcome, api::RangeRemoval::Draining),
        other => panic!("{other:?}"),
    }
    drop(node);
    let mut node = open(dir.path(), &ScopeConfig::default());
    let listed = pools(&mut node);
    let range = &pool(&listed, "a").unwrap().ranges[0];
    assert!(range.draining, "{range:?}");
    assert_eq!(range.allocated, 2);
    assert!(add_range(&mut node, "b", "10.60.0.0/29").is_err());
    assert!(allocate(&mut node, "a", "three").is_err());
    // Cancel the drain: the same range again.
    add_range(&mut node, "a", "10.60.0.0/29,gateway=10.60.0.1").unwrap();
    allocate(&mut node, "a", "three").unwrap();
    drop(node);
    let mut node = open(dir.path(), &ScopeConfig::default());
    assert!(!pool(&pools(&mut node), "a").unwrap().ranges[0].draining);
    // Drain again, release everything: the range leaves the configuration for good.
    remove_range(&mut node, "a", "10.60.0.0/29").unwrap();
    release(&mut node, first);
    release(&mut node, second);
    let third = host_address(&mut node, "three");
    release(&mut node, third);
    assert_eq!(range_texts(&pools(&mut node), "a"), Vec::<String>::new());
    drop(node);
    let mut node = open(dir.path(), &ScopeConfig::default());
    assert_eq!(range_texts(&pools(&mut node), "a"), Vec::<String>::new());
    add_range(&mut node, "b", "10.60.0.0/29").unwrap();
}

fn host_address(node: &mut NodeState, owner: &str) -> std::net::IpAddr {
    let dump = fingerprint(node).dump;
    dump.scopes
        .iter()
        .flat_map(|s| &s.pools)
        .flat_map(|p| &p.allocations)
        .find(|a| a.owner == owner)
        .map(|a| a.address)
        .expect("the owner holds an address")
}

/// A checkpoint imported into the live node scope with a pool over the default pool answered
/// 200, then every node request 503 while /readyz said ready, and the restart failed.
#[test]
fn an_import_that_does_not_fit_the_node_scope_is_refused_and_changes_nothing() {
    let (dir, mut node) = open_new(&declared());
    let document = node_checkpoint(
        serde_json::json!(["10.88.0.0/24"]),
        serde_json::json!([{"pool": "x", "address": "10.88.0.200", "owner": "imported", "generation": 3}]),
    );
    let before = fingerprint(&mut node);
    let refused = run(
        &mut node,
        Op::Import(serde_json::from_value(document).unwrap()),
    )
    .unwrap_err();
    assert_eq!(refused.code, api::ErrorCode::Conflict, "{refused:?}");
    assert!(
        refused.message.contains("10.88.0.0/24") && refused.message.contains("10.88.0.0/28"),
        "{refused:?}"
    );
    assert_eq!(fingerprint(&mut node), before);
    allocate(&mut node, "default", "after").unwrap();
    let before = fingerprint(&mut node);
    drop(node);
    let mut node = open(dir.path(), &declared());
    assert_eq!(fingerprint(&mut node), before);
}

/// An import that fits is taken, and the restart keeps it.
#[test]
fn an_import_that_fits_the_node_scope_is_kept_across_a_restart() {
    let (dir, mut node) = open_new(&declared());
    let document = node_checkpoint(
        serde_json::json!(["10.77.0.0/24"]),
        serde_json::json!([{"pool": "x", "address": "10.77.0.200", "owner": "imported", "generation": 3}]),
    );
    run(
        &mut node,
        Op::Import(serde_json::from_value(document).unwrap()),
    )
    .unwrap();
    let before = fingerprint(&mut node);
    let x = pool(&before.pools, "x").unwrap();
    assert_eq!(x.ranges[0].source, api::RangeSource::Api);
    assert_eq!(range_texts(&before.pools, "default"), ["10.88.0.0/28"]);
    drop(node);
    let mut node = open(dir.path(), &declared());
    assert_eq!(fingerprint(&mut node), before);
}

/// A range the file stops declaring drains and leaves like one removed through the API.
#[test]
fn a_range_dropped_from_the_file_drains_and_leaves() {
    let (dir, mut node) = open_new(&declared());
    let held = allocate(&mut node, "a", "held").unwrap();
    drop(node);
    let mut without_a = declared();
    without_a.pools[1].ranges.clear();
    let mut node = open(dir.path(), &without_a);
    let listed = pools(&mut node);
    assert!(pool(&listed, "a").unwrap().ranges[0].draining);
    release(&mut node, held);
    assert_eq!(range_texts(&pools(&mut node), "a"), Vec::<String>::new());
    drop(node);
    let mut node = open(dir.path(), &without_a);
    assert_eq!(range_texts(&pools(&mut node), "a"), Vec::<String>::new());
    assert!(pool(&pools(&mut node), "a").unwrap().removed.is_empty());
}

/// A range the file dropped while it held an allocation drained; declared again, it was kept
/// draining, became a tombstone with its last release and was gone after the next restart.
#[test]
fn a_range_the_file_dropped_and_declares_again_is_active_again() {
    let (dir, mut node) = open_new(&declared());
    let held = allocate(&mut node, "a", "held").unwrap();
    drop(node);
    let mut node = open(dir.path(), &file_variant(1));
    assert!(pool(&pools(&mut node), "a").unwrap().ranges[0].draining);
    drop(node);
    let mut node = open(dir.path(), &declared());
    let listed = pools(&mut node);
    assert!(
        !pool(&listed, "a").unwrap().ranges[0].draining,
        "{listed:?}"
    );
    release(&mut node, held);
    drop(node);
    let mut node = open(dir.path(), &declared());
    assert_eq!(range_texts(&pools(&mut node), "a"), ["10.50.0.0/24"]);
}

/// A range the file moved from one pool to another was in neither pool until a second
/// restart, with a warning about the pool that no longer held it.
#[test]
fn a_range_the_file_moves_to_another_pool_is_there_after_one_restart() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), &declared()));
    let mut node = open(dir.path(), &file_variant(2));
    assert!(node.warnings().is_empty(), "{:?}", node.warnings());
    let listed = pools(&mut node);
    assert_eq!(range_texts(&listed, "b"), ["10.50.0.0/24"]);
    assert_eq!(range_texts(&listed, "a"), Vec::<String>::new());
}

/// A checkpoint naming the same addresses twice in a pool (active and removed), or a range
/// from another agent's file, must not leave state a restart reads differently.
#[test]
fn an_import_with_a_range_twice_is_refused_and_foreign_file_ranges_become_api_ranges() {
    let (dir, mut node) = open_new(&declared());
    let twice = node_checkpoint(
        serde_json::json!([{"range": "10.77.0.0/24", "source": "api", "state": "removed"}, {"range": "10.77.0.0/24", "source": "api", "state": "active"}]),
        serde_json::json!([]),
    );
    let before = fingerprint(&mut node);
    match run(
        &mut node,
        Op::Import(serde_json::from_value(twice).unwrap()),
    ) {
        Err(refused) => {
            assert_eq!(refused.code, api::ErrorCode::Conflict, "{refused:?}");
            assert_eq!(fingerprint(&mut node), before);
        }
        Ok(_) => {
            // Taken without the tombstone, which means nothing to this agent's file.
            let imported = fingerprint(&mut node);
            let x = pool(&imported.pools, "x").unwrap();
            assert!(x.removed.is_empty(), "{x:?}");
            drop(node);
            node = open(dir.path(), &declared());
            assert_eq!(fingerprint(&mut node), imported);
            drop(node);
            let dir = tempfile::tempdir().unwrap();
            return foreign_file_ranges_become_api_ranges(dir.path());
        }
    }
    drop(node);
    foreign_file_ranges_become_api_ranges(dir.path());
}

fn foreign_file_ranges_become_api_ranges(dir: &Path) {
    let mut node = open(dir, &declared());
    let foreign = node_checkpoint(
        serde_json::json!([{"range": "10.77.0.0/24", "source": "file", "state": "active"}]),
        serde_json::json!([]),
    );
    run(
        &mut node,
        Op::Import(serde_json::from_value(foreign).unwrap()),
    )
    .unwrap();
    let before = fingerprint(&mut node);
    assert_eq!(
        pool(&before.pools, "x").unwrap().ranges[0].source,
        api::RangeSource::Api
    );
    drop(node);
    let mut node = open(dir, &declared());
    assert_eq!(fingerprint(&mut node), before);
}

/// The same addresses twice in one pool of a checkpoint, both live, are refused.
#[test]
fn an_import_naming_a_range_twice_in_a_pool_is_refused() {
    let (_dir, mut node) = open_new(&declared());
    let twice = node_checkpoint(
        serde_json::json!([{"range": "10.77.0.0/24", "source": "api", "state": "draining"}, {"range": "10.77.0.0/24,gateway=10.77.0.1", "source": "api", "state": "active"}]),
        serde_json::json!([]),
    );
    let before = fingerprint(&mut node);
    let refused = run(
        &mut node,
        Op::Import(serde_json::from_value(twice).unwrap()),
    )
    .unwrap_err();
    assert!(
        matches!(
            refused.code,
            api::ErrorCode::Conflict | api::ErrorCode::BadRequest
        ),
        "{refused:?}"
    );
    assert!(refused.message.contains("10.77.0.0/24"), "{refused:?}");
    assert_eq!(fingerprint(&mut node), before);
}

/// An operator's exclusion whose reason looked like a local-route reservation's was removed
/// by the next reservation (and, from the file, came back at every start to be removed again).
#[test]
fn an_exclusion_reason_kept_for_local_routes_is_refused() {
    let (_dir, mut node) = open_new(&declared());
    let before = fingerprint(&mut node);
    let refused = run(
        &mut node,
        Op::AddExclusion(
            api::ExclusionRequest {
                scope: api::NODE_SCOPE.into(),
                pool: "default".into(),
                network: "10.88.0.5".into(),
                reason: "local address of the VIP".into(),
            }
            .try_into()
            .unwrap(),
        ),
    )
    .unwrap_err();
    assert_eq!(refused.code, api::ErrorCode::BadRequest, "{refused:?}");
    assert!(refused.message.contains("local address"), "{refused:?}");
    assert_eq!(fingerprint(&mut node), before);
}

// ---- the property -------------------------------------------------------------------------

const POOLS: [&str; 3] = ["default", "a", "b"];
const RANGES: [&str; 7] = [
    "10.50.0.0/24",
    "10.50.0.0/24,gateway=10.50.0.1",
    "10.50.0.0/25",
    "10.50.0.128/25,gateway=10.50.0.129",
    "10.51.0.0/29",
    "10.88.0.0/28",
    "fd50::/125",
];
const EXCLUSIONS: [&str; 3] = ["10.50.0.5/32", "10.88.0.3/32", "10.51.0.0/30"];

#[derive(Clone, Debug)]
enum Call {
    AddRange(usize, usize),
    RemoveRange(usize, usize),
    Allocate(usize, bool),
    /// Releases the n-th address handed out so far (modulo how many there are).
    Release(usize),
    Exclude(usize, usize),
    Unexclude(usize, usize),
    Restart,
    /// Restarts with an edited configuration file (see `file_variant`).
    RestartWith(usize),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        3 => (0..POOLS.len(), 0..RANGES.len()).prop_map(|(p, r)| Call::AddRange(p, r)),
        3 => (0..POOLS.len(), 0..RANGES.len()).prop_map(|(p, r)| Call::RemoveRange(p, r)),
        4 => (0..POOLS.len(), any::<bool>()).prop_map(|(p, v6)| Call::Allocate(p, v6)),
        3 => any::<usize>().prop_map(Call::Release),
        1 => (0..POOLS.len(), 0..EXCLUSIONS.len()).prop_map(|(p, e)| Call::Exclude(p, e)),
        1 => (0..POOLS.len(), 0..EXCLUSIONS.len()).prop_map(|(p, e)| Call::Unexclude(p, e)),
        2 => Just(Call::Restart),
        1 => (0..3usize).prop_map(Call::RestartWith),
    ]
}

fn op(call: &Call, handed_out: &[std::net::IpAddr], serial: usize) -> Op {
    match *call {
        Call::AddRange(p, r) => {
            Op::AddRange(range_request(POOLS[p], RANGES[r]).try_into().unwrap())
        }
        Call::RemoveRange(p, r) => {
            Op::RemoveRange(range_request(POOLS[p], RANGES[r]).try_into().unwrap())
        }
        Call::Allocate(p, v6) => Op::Allocate(
            api::AllocateRequest {
                scope: api::NODE_SCOPE.into(),
                pool: POOLS[p].into(),
                owner: format!("owner-{serial}"),
                key: None,
                family: Some(if v6 {
                    api::FamilyChoice::Ipv6
                } else {
                    api::FamilyChoice::Ipv4
                }),
                address: None,
                lease_ms: None,
            }
            .try_into()
            .unwrap(),
        ),
        Call::Release(n) => Op::Release(
            api::ReleaseRequest {
                scope: api::NODE_SCOPE.into(),
                key: None,
                address: Some(
                    handed_out
                        .get(n % handed_out.len().max(1))
                        .copied()
                        .unwrap_or("10.50.0.9".parse().unwrap()),
                ),
                generation: None,
                owner: None,
            }
            .try_into()
            .unwrap(),
        ),
        Call::Exclude(p, e) => Op::AddExclusion(
            api::ExclusionRequest {
                scope: api::NODE_SCOPE.into(),
                pool: POOLS[p].into(),
                network: EXCLUSIONS[e].into(),
                reason: "test".into(),
            }
            .try_into()
            .unwrap(),
        ),
        Call::Unexclude(p, e) => Op::RemoveExclusion(
            api::ExclusionRequest {
                scope: api::NODE_SCOPE.into(),
                pool: POOLS[p].into(),
                network: EXCLUSIONS[e].into(),
                reason: String::new(),
            }
            .try_into()
            .unwrap(),
        ),
        Call::Restart | Call::RestartWith(_) => unreachable!("restarts are not operations"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any sequence of accepted calls, then a restart, gives the same state; a refused call
    /// changes nothing; and the agent always starts again.
    #[test]
    fn accepted_calls_survive_a_restart_and_refused_ones_change_nothing(
        calls in proptest::collection::vec(call(), 1..40)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut declared = declared();
        let mut node = open(dir.path(), &declared);
        let mut handed_out = Vec::new();
        let mut state = fingerprint(&mut node);
        for (serial, call) in calls.iter().enumerate() {
            if let Call::RestartWith(variant) = call {
                // An edited file may change the pools, but the agent starts, and what it
                // starts with is what every later restart with the same file gives.
                declared = file_variant(*variant);
                drop(node);
                node = open(dir.path(), &declared);
                state = fingerprint(&mut node);
                drop(node);
                node = open(dir.path(), &declared);
                prop_assert_eq!(&fingerprint(&mut node), &state, "a second restart with file {} after {:?} changed the state", variant, &calls[..serial]);
                continue;
            }
            if let Call::Restart = call {
                drop(node);
                node = open(dir.path(), &declared);
                // Warnings may be given (a file range over one added at run time is not
                // applied and said so); the state is what it was.
                let after = fingerprint(&mut node);
                prop_assert_eq!(&after, &state, "a restart after {:?} changed the state", &calls[..serial]);
                continue;
            }
            let answer = run(&mut node, op(call, &handed_out, serial));
            let after = fingerprint(&mut node);
            match answer {
                Ok(Reply::Allocated(allocated)) => {
                    handed_out.extend(allocated.allocations.iter().map(|a| a.address));
                }
                Ok(_) => {}
                Err(error) => {
                    prop_assert!(error.code != api::ErrorCode::RetryLater, "{:?}: {:?}", call, error);
                    prop_assert_eq!(&after, &state, "refused {:?} ({:?}) changed the state", call, error);
                }
            }
            state = after;
        }
        drop(node);
        let mut node = open(dir.path(), &declared);
        prop_assert_eq!(fingerprint(&mut node), state);
    }
}
