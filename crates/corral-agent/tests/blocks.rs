//! Block mode on the agent's side, on `MemKv` (`tests/common`): the demand it publishes and
//! how often, the release handshake (ready, refused, withdrawn, completed, and after a crash
//! between the local surrender and `ready`), ADDs that wait for a grant, and the pool a CNI
//! call resolves to.
//!
//! Paused clock (`tests/common/paused.rs`: the agent over a `MemoryStore`, in-process), so
//! the once-a-second spacing and the pool wait are exact in virtual time; the crash between
//! the surrender and `ready` needs the real store across a restart, so it runs on a real
//! agent (SQLite, socket) in real time.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_agent::AgentConfig;
use corral_agent::link::ClusterOptions;
use corral_api::{CniAddRequest, CniKeyRequest, CniNetwork, ErrorCode};
use corral_cluster::{
    DemandRecord, Family, IpNet, NodeName, PoolName, ReleaseRecord, ReleaseState,
};
use corral_kv::{Event, Kv, MemKv, Txn, TxnOp};
use corral_store::MemoryStore;
use tokio::time::Instant;

const NODE: &str = "node-1";

const CONFIG: &str = include_str!("configs/blocks.toml");
use crate::common;

use common::paused::{Api, MemAgent, wait_for};
use common::{LinkedAgent as Agent, key, keys, network, runtime, wait_until, within};

fn node() -> NodeName {
    common::node_name(NODE)
}

/// A real agent (SQLite, socket) on real time.
fn start(runtime: &tokio::runtime::Runtime, kv: &MemKv, dir: &Path, pool_wait: Duration) -> Agent {
    let config = AgentConfig {
        pool_wait,
        ..common::config(dir)
    };
    let options = common::options(NODE, "uid-1", Duration::from_secs(600));
    Agent::start(runtime, kv, config, options).wait_registered()
}

/// A `MemKv` holding the configuration and an agent on it on the paused clock (`pool_wait`),
/// with its API.
async fn configured_paused(pool_wait: Duration) -> (MemKv, MemAgent, Api) {
    configured_paused_with(pool_wait, Duration::from_secs(30)).await
}

/// [`configured_paused`] with `refresh` (see [`start_paused_with`]).
async fn configured_paused_with(pool_wait: Duration, refresh: Duration) -> (MemKv, MemAgent, Api) {
    let kv = MemKv::new();
    put_config(&kv).await;
    let agent = start_paused_with(&kv, &MemoryStore::new(), pool_wait, refresh).await;
    let api = agent.api();
    (kv, agent, api)
}

/// An in-memory agent on the paused clock, over `store`; demand changes that are not
/// urgent wait up to 30 s.
async fn start_paused(kv: &MemKv, store: &MemoryStore, pool_wait: Duration) -> MemAgent {
    start_paused_with(kv, store, pool_wait, Duration::from_secs(30)).await
}

/// `refresh`: how long a demand change that is not urgent may wait.
async fn start_paused_with(
    kv: &MemKv,
    store: &MemoryStore,
    pool_wait: Duration,
    refresh: Duration,
) -> MemAgent {
    let config = AgentConfig {
        pool_wait,
        ..common::paused::config()
    };
    let options = ClusterOptions {
        demand_refresh: refresh,
        ..common::options(NODE, "uid-1", Duration::from_secs(600))
    };
    MemAgent::start(kv, store, config, options)
        .await
        .wait_registered()
        .await
}

/// The active cluster ranges of `pool` (subnets), and its surrendered ones.
fn ranges_of(pools: &corral_api::PoolsResponse, pool: &str) -> (Vec<String>, Vec<String>) {
    let Some(info) = pools.pools.iter().find(|p| p.name == pool) else {
        return (vec![], vec![]);
    };
    let mut active: Vec<String> = info
        .ranges
        .iter()
        .filter(|r| !r.draining)
        .map(|r| r.range.clone())
        .collect();
    active.sort();
    (active, info.removed.clone())
}

/// [`ranges_of`] `pool` on a real agent.
fn blocks_of(agent: &Agent, pool: &str) -> (Vec<String>, Vec<String>) {
    ranges_of(&agent.client().pools(Some("node")).unwrap(), pool)
}

/// [`ranges_of`] `pool` on an in-memory agent.
async fn blocks(api: &Api, pool: &str) -> (Vec<String>, Vec<String>) {
    ranges_of(&api.pools(Some("node")).await.unwrap(), pool)
}

async fn put_config(kv: &MemKv) {
    common::put_config(kv, CONFIG).await;
}

/// Grants block `cidr` of `pool` to the node as the leader writes it; answers the grant's
/// create revision.
async fn grant(kv: &MemKv, pool: &str, cidr: &str) -> i64 {
    common::grant(kv, NODE, pool, cidr).await
}

/// Grants the node two blocks of `pods` and waits (at most `limit`) for the first demand that
/// counts both.
async fn two_blocks_granted(kv: &MemKv, limit: Duration) {
    grant(kv, "pods", "10.60.0.0/24").await;
    grant(kv, "pods", "10.60.1.0/24").await;
    wait_for("the first demand", limit, async || {
        demand(kv, "pods")
            .await
            .is_some_and(|d| d.ipv4.is_some_and(|f| f.blocks == 2))
    })
    .await;
}

fn release_key(pool: &str, cidr: &str) -> String {
    common::release_key(NODE, pool, cidr)
}

/// The leader's step 1: `marked`.
async fn mark(kv: &MemKv, pool: &str, cidr: &str, grant_revision: i64) {
    common::mark(kv, NODE, pool, cidr, grant_revision).await;
}

async fn release_record(kv: &MemKv, pool: &str, cidr: &str) -> Option<ReleaseRecord> {
    common::release_record(kv, NODE, pool, cidr).await
}

async fn demand(kv: &MemKv, pool: &str) -> Option<DemandRecord> {
    common::demand(kv, NODE, pool).await
}

/// Waits (virtual time) until the agent serves `n` active blocks of `pool`.
async fn wait_active(api: &Api, pool: &str, n: usize, what: &str) {
    wait_for(what, Duration::from_secs(10), async || {
        blocks(api, pool).await.0.len() == n
    })
    .await;
}

/// The agent's answer to the mark of `cidr` once it is `state` (virtual time).
async fn answered(
    kv: &MemKv,
    pool: &str,
    cidr: &str,
    state: ReleaseState,
    what: &str,
) -> ReleaseRecord {
    wait_for(what, Duration::from_secs(10), async || {
        release_record(kv, pool, cidr)
            .await
            .is_some_and(|r| r.state == state)
    })
    .await;
    release_record(kv, pool, cidr).await.unwrap()
}

/// [`configured_paused`] (pool wait 5 s) serving block 10.61.0.0/28 of `small`; the grant's
/// revision.
async fn with_small_block() -> (MemKv, MemAgent, Api, i64) {
    let (kv, agent, api) = configured_paused(Duration::from_secs(5)).await;
    let revision = grant(&kv, "small", "10.61.0.0/28").await;
    wait_active(&api, "small", 1, "the block").await;
    (kv, agent, api, revision)
}

/// The agent's metrics hold every one of `lines`.
async fn assert_metrics(api: &Api, lines: &[&str]) {
    let metrics = api.metrics().await.unwrap();
    for line in lines {
        assert!(metrics.contains(line), "{line} not in {metrics}");
    }
}

async fn add(
    api: &Api,
    network: &CniNetwork,
    i: usize,
) -> Result<std::net::IpAddr, corral_client::Error> {
    let added = api
        .cni_add(&CniAddRequest {
            network: network.clone(),
            key: key(i),
            owner: format!("pod-{i}"),
            sets: vec![],
        })
        .await?;
    Ok(added.allocations[0].address)
}

#[tokio::test(start_paused = true)]
async fn demand_is_published_with_its_numbers_at_most_once_a_second_and_adds_make_no_requests() {
    // A change that is not urgent (more free addresses) goes out within 2 s.
    let (kv, agent, api) =
        configured_paused_with(Duration::from_secs(5), Duration::from_secs(2)).await;
    two_blocks_granted(&kv, Duration::from_secs(10)).await;
    // The demand once the grants are recorded: 2 empty blocks, highest first.
    let first = demand(&kv, "pods").await.unwrap();
    let v4 = first.ipv4.clone().unwrap();
    assert_eq!((v4.used, v4.free, v4.pending, v4.blocks), (0, 508, 0, 2));
    assert_eq!(
        v4.empty,
        vec![
            "10.60.1.0/24".parse::<IpNet>().unwrap(),
            "10.60.0.0/24".parse().unwrap()
        ]
    );
    assert!(first.ipv6.is_none() && first.at_ms > 0);
    // Every write of the demand, as etcd sees it, in virtual time.
    let writes: Arc<Mutex<Vec<Instant>>> = Arc::default();
    {
        let (kv, writes) = (kv.clone(), Arc::clone(&writes));
        let prefix = keys().demand_of_node_prefix(&node());
        let from = kv
            .range(prefix.as_bytes(), None, 1, None)
            .await
            .unwrap()
            .revision
            + 1;
        let mut watch = kv.watch(prefix.as_bytes(), from).await.unwrap();
        tokio::spawn(async move {
            while let Ok(events) = watch.next().await {
                for event in events {
                    if matches!(event, Event::Put(_)) {
                        writes.lock().unwrap().push(Instant::now());
                    }
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The node's assertion of what it holds (`holdings/<node>`) is put when a range goes from
    // empty to in use (and its counts at most every 30 s): counted by its version.
    let holdings_key = keys().holdings(&node());
    let holdings_version = async |kv: &MemKv| {
        kv.get(holdings_key.as_bytes())
            .await
            .unwrap()
            .map_or(0, |e| e.version)
    };
    let holdings_before = holdings_version(&kv).await;
    let before = kv.requests();
    let started = Instant::now();
    let pods = network(Some("pods"), None);
    for i in 0..100 {
        let address = add(&api, &pods, i).await.unwrap();
        assert!(within("10.60.0.0/23", address), "{address}");
    }
    let added = Instant::now();
    let elapsed = added - started;
    // Free (408) stays above pre-allocate (300): not urgent, so the change goes out with the
    // refresh, within 2 s of the last write. Nothing reads the store meanwhile, so what it
    // counted is the agent's alone.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let requests = kv.requests() - before;
    let holdings_writes = u64::try_from(holdings_version(&kv).await - holdings_before).unwrap();
    assert!(holdings_writes <= 2, "{holdings_writes} holdings writes");
    let seen = writes.lock().unwrap().clone();
    let v4 = demand(&kv, "pods").await.unwrap().ipv4.unwrap();
    assert_eq!((v4.used, v4.free, v4.blocks), (100, 408, 2));
    assert_eq!(v4.empty, vec!["10.60.1.0/24".parse::<IpNet>().unwrap()]);
    assert!(!seen.is_empty());
    // Within the refresh (2 s) of the ADDs, in virtual time (exact: no machine's load in it).
    assert!(
        seen[0] - added <= Duration::from_secs(2),
        "the first demand write {:?} after the ADDs",
        seen[0] - added
    );
    let window = elapsed + Duration::from_millis(1500);
    assert!(
        seen.len() as f64 <= window.as_secs_f64() + 1.0,
        "{} demand writes in {window:?}",
        seen.len()
    );
    for pair in seen.windows(2) {
        assert!(
            pair[1] - pair[0] >= ClusterOptions::DEMAND_MIN_INTERVAL,
            "two demand writes {:?} apart",
            pair[1] - pair[0]
        );
    }
    // The only store requests: the demand writes and the holdings writes, one txn each (none
    // per ADD).
    assert_eq!(
        requests,
        seen.len() as u64 + holdings_writes,
        "store requests beside the demand and holdings writes"
    );
    assert_metrics(
        &api,
        &[
            "corral_pool_allocations_total{pool=\"pods\",outcome=\"ok\"} 100",
            "corral_demand_writes_total",
            "corral_pool_available_addresses{pool=\"pods\",family=\"ipv4\"} 408",
        ],
    )
    .await;
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_empty_marked_block_is_surrendered_ready_and_never_allocated_from_again() {
    let (kv, agent, api) = configured_paused(Duration::from_millis(300)).await;
    grant(&kv, "small", "10.61.0.0/28").await;
    let second = grant(&kv, "small", "10.61.0.16/28").await;
    wait_active(&api, "small", 2, "both blocks").await;
    mark(&kv, "small", "10.61.0.16/28", second).await;
    let record = answered(&kv, "small", "10.61.0.16/28", ReleaseState::Ready, "ready").await;
    assert!(
        record.answered_ms > 0 && record.reason.is_none(),
        "{record:?}"
    );
    assert_eq!(record.grant_revision, second);
    let (active, surrendered) = blocks(&api, "small").await;
    assert_eq!(active, ["10.61.0.0/28"]);
    assert_eq!(surrendered, ["10.61.0.16/28"]);
    // Fill the other block and more: nothing ever comes from the surrendered one.
    let small = network(Some("small"), None);
    let mut got = Vec::new();
    for i in 0..20 {
        let asked = Instant::now();
        match add(&api, &small, i).await {
            Ok(address) => got.push(address),
            Err(corral_client::Error::Api { error, .. }) => {
                assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
                assert_eq!(error.pool.as_deref(), Some("small"), "{error:?}");
                assert!(error.message.contains("small"), "{error:?}");
                // It waited the whole `pool_wait`, and no more than one look later.
                let waited = asked.elapsed();
                assert!(
                    waited >= Duration::from_millis(300) && waited < Duration::from_millis(800),
                    "{waited:?}"
                );
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(got.len(), 14, "a /28's addresses: {got:?}");
    assert!(got.iter().all(|a| within("10.61.0.0/28", *a)), "{got:?}");
    assert_metrics(
        &api,
        &[
            "corral_release_handshakes_total{outcome=\"ready\"} 1",
            "corral_surrendered_blocks 1",
            "corral_pool_allocations_total{pool=\"small\",outcome=\"timeout\"} 6",
        ],
    )
    .await;
    // The leader's step 3: the grant, owned and release keys go in one txn; the agent
    // forgets the surrendered block.
    let cidr: IpNet = "10.61.0.16/28".parse().unwrap();
    let pool = PoolName::new("small").unwrap();
    kv.txn(Txn {
        compares: vec![],
        success: vec![
            TxnOp::delete(keys().grant(&pool, Family::V4, &cidr)),
            TxnOp::delete(keys().owned(&node(), &pool, Family::V4, &cidr)),
            TxnOp::delete(release_key("small", "10.61.0.16/28")),
        ],
        failure: vec![],
    })
    .await
    .unwrap();
    wait_for(
        "the surrendered block forgotten",
        Duration::from_secs(10),
        async || blocks(&api, "small").await.1.is_empty(),
    )
    .await;
    assert_eq!(blocks(&api, "small").await.0, ["10.61.0.0/28"]);
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_block_in_use_is_refused_and_nothing_changes() {
    let (kv, agent, api, revision) = with_small_block().await;
    let held = add(&api, &network(Some("small"), None), 1).await.unwrap();
    mark(&kv, "small", "10.61.0.0/28", revision).await;
    let record = answered(
        &kv,
        "small",
        "10.61.0.0/28",
        ReleaseState::Refused,
        "refused",
    )
    .await;
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("allocation")),
        "{record:?}"
    );
    assert_eq!(
        blocks(&api, "small").await,
        (vec!["10.61.0.0/28".to_owned()], vec![])
    );
    // The allocation stays, and the block still serves.
    let again = add(&api, &network(Some("small"), None), 1).await.unwrap();
    assert_eq!(again, held);
    let other = add(&api, &network(Some("small"), None), 2).await.unwrap();
    assert!(within("10.61.0.0/28", other));
    // A mark naming another grant of the block is refused too.
    mark(&kv, "small", "10.61.0.0/28", revision + 100).await;
    wait_for("refused again", Duration::from_secs(10), async || {
        release_record(&kv, "small", "10.61.0.0/28")
            .await
            .is_some_and(|r| {
                r.state == ReleaseState::Refused
                    && r.reason.as_deref().is_some_and(|r| r.contains("revision"))
            })
    })
    .await;
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_withdrawn_release_gives_the_block_back() {
    let (kv, agent, api, revision) = with_small_block().await;
    mark(&kv, "small", "10.61.0.0/28", revision).await;
    wait_for("surrendered", Duration::from_secs(10), async || {
        blocks(&api, "small").await == (vec![], vec!["10.61.0.0/28".to_owned()])
    })
    .await;
    // The leader un-marks it (the block is needed again): the agent takes it back.
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::delete(release_key("small", "10.61.0.0/28"))],
        failure: vec![],
    })
    .await
    .unwrap();
    wait_for("taken back", Duration::from_secs(10), async || {
        blocks(&api, "small").await == (vec!["10.61.0.0/28".to_owned()], vec![])
    })
    .await;
    let address = add(&api, &network(Some("small"), None), 1).await.unwrap();
    assert!(within("10.61.0.0/28", address));
    agent.stop().await;
}

/// A crash between the local surrender and `ready` (the host's commit done, the txn not
/// sent): the restarted agent finds the block surrendered and the key still marked, and
/// sends `ready`. On the real store (SQLite) and real time: it restarts the agent.
#[test]
fn ready_is_sent_again_after_a_crash_between_the_surrender_and_the_answer() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_secs(5));
    let revision = runtime.block_on(grant(&kv, "small", "10.61.0.0/28"));
    runtime.block_on(grant(&kv, "small", "10.61.0.16/28"));
    wait_until("the blocks", Duration::from_secs(10), || {
        blocks_of(&agent, "small").0.len() == 2
    });
    agent.stop(&runtime);
    // The host alone, on the agent's store: the surrender commits, then the process dies.
    {
        let config = AgentConfig::in_dir(dir.path());
        let store =
            corral_store::SqliteStore::open_owned(&config.data_dir, &config.socket).unwrap();
        let mut host = corral_agent::node::NodeState::restore(
            store,
            &corral_agent::config::pools(&[]).unwrap(),
        )
        .unwrap();
        let answer = host.run_batch(vec![corral_agent::node::Op::SurrenderBlock {
            pool: PoolName::new("small").unwrap(),
            range: "10.61.0.0/28".parse().unwrap(),
        }]);
        assert!(
            matches!(
                answer[0],
                Ok(corral_agent::node::Reply::Surrender(
                    corral_agent::node::Surrender::Surrendered
                ))
            ),
            "{answer:?}"
        );
        drop(host);
    }
    runtime.block_on(mark(&kv, "small", "10.61.0.0/28", revision));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_secs(5));
    wait_until("ready after the restart", Duration::from_secs(10), || {
        runtime
            .block_on(release_record(&kv, "small", "10.61.0.0/28"))
            .is_some_and(|r| r.state == ReleaseState::Ready)
    });
    // Still surrendered: the grant lasts, and the set of grants does not add it back.
    assert_eq!(
        blocks_of(&agent, "small"),
        (
            vec!["10.61.0.16/28".to_owned()],
            vec!["10.61.0.0/28".to_owned()]
        )
    );
    agent.stop(&runtime);
}

#[tokio::test(start_paused = true)]
async fn an_add_waits_for_a_grant_and_times_out_naming_the_pool() {
    let kv = MemKv::new();
    let store = MemoryStore::new();
    put_config(&kv).await;
    let agent = start_paused(&kv, &store, Duration::from_secs(5)).await;
    let api = agent.api();
    // Nothing granted: the ADD waits, counted as pending in the demand.
    let asked = Instant::now();
    let waiting = tokio::spawn({
        let api = api.clone();
        async move { add(&api, &network(Some("small"), None), 1).await }
    });
    wait_for(
        "the pending ADD in the demand",
        Duration::from_secs(3),
        async || {
            demand(&kv, "small")
                .await
                .is_some_and(|d| d.ipv4.is_some_and(|f| f.pending == 1))
        },
    )
    .await;
    // The pending ADD is urgent: out as soon as the once-a-second spacing allows (virtual
    // time, so exact; the 20 ms are how often `wait_for` looks).
    let bound = ClusterOptions::DEMAND_MIN_INTERVAL + Duration::from_millis(20);
    assert!(asked.elapsed() <= bound, "{:?}", asked.elapsed());
    // Meanwhile the agent answers others.
    assert!(api.status(None).await.is_ok());
    grant(&kv, "small", "10.61.0.0/28").await;
    let granted = Instant::now();
    // Served from the grant (a wait that ran out would be an error, not an address).
    let address = waiting.await.unwrap().unwrap();
    assert!(within("10.61.0.0/28", address));
    // As soon as the grant is recorded, not at the next half-second look.
    assert!(
        granted.elapsed() < Duration::from_millis(500),
        "{:?}",
        granted.elapsed()
    );
    // Pending again 0 in the demand, promptly.
    wait_for("no pending ADD", Duration::from_secs(3), async || {
        demand(&kv, "small")
            .await
            .is_some_and(|d| d.ipv4.is_some_and(|f| f.pending == 0))
    })
    .await;
    assert!(granted.elapsed() <= bound, "{:?}", granted.elapsed());
    assert_metrics(
        &api,
        &["corral_pool_allocations_total{pool=\"small\",outcome=\"waited_ok\"} 1"],
    )
    .await;
    agent.stop().await;

    // A short wait and no grant: code 11 (retry_later) naming the pool.
    let agent = start_paused(&kv, &store, Duration::from_millis(400)).await;
    let started = Instant::now();
    let error = add(&agent.api(), &network(Some("blue"), None), 2)
        .await
        .unwrap_err();
    let waited = started.elapsed();
    match error {
        corral_client::Error::Api { error, .. } => {
            assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
            assert_eq!(error.pool.as_deref(), Some("blue"), "{error:?}");
            assert!(error.message.contains("pool blue"), "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    // It waited the whole `pool_wait`, and (virtual time) exactly that.
    assert_eq!(waited, Duration::from_millis(400));
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_namespace_picks_its_pool_and_an_explicit_pool_wins() {
    let (kv, agent, api) = configured_paused(Duration::from_secs(2)).await;
    grant(&kv, "blue", "10.62.0.0/28").await;
    grant(&kv, "small", "10.61.0.0/28").await;
    wait_for("the blocks", Duration::from_secs(10), async || {
        !blocks(&api, "blue").await.0.is_empty() && !blocks(&api, "small").await.0.is_empty()
    })
    .await;
    // Namespace blue maps to pool blue.
    let mapped = add(&api, &network(None, Some("blue")), 1).await.unwrap();
    assert!(within("10.62.0.0/28", mapped), "{mapped}");
    // The call's pool wins over the namespace's.
    let explicit = add(&api, &network(Some("small"), Some("blue")), 2)
        .await
        .unwrap();
    assert!(within("10.61.0.0/28", explicit), "{explicit}");
    // A DEL resolves the same way (and releases the attachment wherever it is).
    let released = api
        .cni_del(&CniKeyRequest {
            network: network(None, Some("blue")),
            key: key(1),
        })
        .await
        .unwrap();
    assert_eq!(released.released.len(), 1);
    agent.stop().await;
}

/// Issue 23: `corral alloc` / `corral release` (`/v1/allocate`, `/v1/release`) on a block pool
/// move the node's demand as CNI ADD and DEL do. Before, a node filled through the API never
/// published its use (still stale after 45 s), so it never got another block.
/// The IPv4 addresses used and blocks held of `pods` as the node's demand record says.
async fn used(kv: &MemKv) -> Option<(u64, u64)> {
    demand(kv, "pods")
        .await
        .and_then(|d| d.ipv4.map(|f| (f.used, f.blocks)))
}

/// [`configured_paused_with`] (demand refresh 1 s) granted block 10.60.0.0/24 of `pods`, its
/// first demand published.
async fn with_first_demand() -> (MemKv, MemAgent, Api) {
    let (kv, agent, api) =
        configured_paused_with(Duration::from_secs(5), Duration::from_secs(1)).await;
    grant(&kv, "pods", "10.60.0.0/24").await;
    wait_for("the first demand", Duration::from_secs(10), async || {
        used(&kv).await == Some((0, 1))
    })
    .await;
    (kv, agent, api)
}

#[tokio::test(start_paused = true)]
async fn the_api_moves_a_block_pools_demand_as_cni_calls_do() {
    let (kv, agent, api) = with_first_demand().await;
    for i in 0..3 {
        api.allocate(&corral_api::AllocateRequest {
            scope: "node".into(),
            pool: "pods".into(),
            family: None,
            address: None,
            owner: format!("api-{i}"),
            key: None,
            lease_ms: None,
        })
        .await
        .unwrap();
    }
    wait_for(
        "the allocations counted",
        Duration::from_secs(10),
        async || used(&kv).await == Some((3, 1)),
    )
    .await;
    api.release(&corral_api::ReleaseRequest {
        scope: "node".into(),
        key: None,
        address: None,
        generation: None,
        owner: Some("api-0".into()),
    })
    .await
    .unwrap();
    wait_for("the release counted", Duration::from_secs(10), async || {
        used(&kv).await == Some((2, 1))
    })
    .await;
    agent.stop().await;
}

/// A demand write that fails while etcd does not answer is written again once it does, in
/// the same round of the link: its lease and liveness key unchanged (a failed write used to
/// end the round, and every agent of a starved etcd registered and watched again).
#[tokio::test(start_paused = true)]
async fn a_failed_demand_write_is_written_again_and_the_round_goes_on() {
    let (kv, agent, api) = with_first_demand().await;
    let live_key = keys().live(&node());
    let before = kv.get(live_key.as_bytes()).await.unwrap().expect("live");
    kv.set_unavailable(true);
    let refused = kv.requests();
    for i in 0..3 {
        add(&api, &network(Some("pods"), None), i).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        kv.requests() > refused,
        "the demand was tried while etcd did not answer"
    );
    let status = agent.cluster_status().await;
    assert!(
        status.degraded
            && status.registered
            && status
                .last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("writing the node's demand failed (")),
        "degraded, the round going on: {status:?}"
    );
    kv.set_unavailable(false);
    wait_for(
        "the demand written again",
        Duration::from_secs(10),
        async || used(&kv).await == Some((3, 1)),
    )
    .await;
    let status = agent.cluster_status().await;
    assert!(
        !status.degraded && status.last_error.is_none(),
        "{status:?}"
    );
    let after = kv.get(live_key.as_bytes()).await.unwrap().expect("live");
    assert_eq!(
        (after.lease, after.create_revision),
        (before.lease, before.create_revision),
        "the same round: its lease and key"
    );
    agent.stop().await;
}

/// Every put of the node's demand from now on, at its virtual time.
async fn demand_writes(kv: &MemKv) -> Arc<Mutex<Vec<Instant>>> {
    let writes: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (kv, seen) = (kv.clone(), Arc::clone(&writes));
    let prefix = keys().demand_of_node_prefix(&node());
    let mut watch = kv.watch(prefix.as_bytes(), 0).await.unwrap();
    tokio::spawn(async move {
        while let Ok(events) = watch.next().await {
            for event in events {
                if matches!(event, Event::Put(_)) {
                    seen.lock().unwrap().push(Instant::now());
                }
            }
        }
    });
    writes
}

/// Issue 25: the cluster-wide demand write budget. With `demand_writes_per_sec = 100` and a
/// census of 1,000 nodes the node's share is one write per 10 s: two minutes of churn (a pod
/// added or deleted every 200 ms, each a change to publish, none urgent) write at most the
/// bucket's 2 plus 12 — a second apart without the budget (the refresh here is 1 s), so about
/// 120. A change that becomes urgent (free below the watermark) still goes out with the next
/// look, from the token kept for it.
#[tokio::test(start_paused = true)]
async fn the_demand_write_budget_paces_the_node_by_its_share_and_urgency_goes_first() {
    let kv = MemKv::new();
    common::put_config(&kv, &format!("demand_writes_per_sec = 100\n{CONFIG}")).await;
    let census = corral_cluster::CensusRecord { nodes: 1_000 };
    common::put(
        &kv,
        keys().census(),
        corral_cluster::encode_value(&census).unwrap(),
    )
    .await;
    let store = MemoryStore::new();
    let agent =
        start_paused_with(&kv, &store, Duration::from_secs(5), Duration::from_secs(1)).await;
    let api = agent.api();
    two_blocks_granted(&kv, Duration::from_secs(30)).await;
    let writes = demand_writes(&kv).await;
    let interval = Duration::from_secs(10);
    let window = Duration::from_secs(120);
    let pods = network(Some("pods"), None);
    let started = Instant::now();
    let mut next = 0;
    while Instant::now() - started < window {
        // 20 pods at most: free stays above pre-allocate (300), nothing is urgent.
        if next < 20 {
            add(&api, &pods, next).await.unwrap();
            next += 1;
        } else {
            next = 0;
            for i in 0..20 {
                api.cni_del(&CniKeyRequest {
                    network: pods.clone(),
                    key: key(i),
                })
                .await
                .unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let churned = writes.lock().unwrap().clone();
    let allowed = 2 + (window.as_secs() / interval.as_secs()) as usize;
    assert!(
        churned.len() <= allowed,
        "{} demand writes in {window:?} of churn, at most {allowed} allowed",
        churned.len()
    );
    // Paced, not stopped: the changes still go out, one per share.
    assert!(churned.len() >= 8, "{} demand writes", churned.len());
    for pair in churned.windows(2) {
        assert!(
            pair[1] - pair[0] >= interval,
            "two writes that are not urgent {:?} apart",
            pair[1] - pair[0]
        );
    }
    // Urgent: 300 pods more leave free (508 - 320) below pre-allocate (300).
    let before = writes.lock().unwrap().len();
    for i in 100..400 {
        add(&api, &pods, i).await.unwrap();
    }
    let urgent_at = Instant::now();
    wait_for("the urgent demand", interval, async || {
        demand(&kv, "pods")
            .await
            .is_some_and(|d| d.ipv4.is_some_and(|f| f.free < 300))
    })
    .await;
    let seen = writes.lock().unwrap()[before..].to_vec();
    let first = *seen.first().unwrap();
    // Served at the next look (at most a second on), from the token kept for urgency.
    assert!(
        first - urgent_at <= ClusterOptions::DEMAND_MIN_INTERVAL,
        "the urgent demand written {:?} after it arose",
        first - urgent_at
    );
    agent.stop().await;
}
