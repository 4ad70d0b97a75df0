//! Block mode on the agent's side, on `MemKv` with a real agent in-process (`tests/common`):
//! the demand it publishes and how often, the release handshake (ready, refused, withdrawn,
//! completed, and after a crash between the local surrender and `ready`), ADDs that wait for a
//! grant, and the pool a CNI call resolves to.
//!
//! Real time: the agent's SQLite threads rule out a paused clock (see `tests/common`).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_agent::AgentConfig;
use corral_agent::link::ClusterOptions;
use corral_api::{AttachmentKey, CniAddRequest, CniKeyRequest, CniNetwork, ErrorCode};
use corral_client::Client;
use corral_cluster::{
    ClusterConfig, DemandRecord, Family, IpNet, NodeName, PoolName, ReleaseRecord, ReleaseState,
    decode_value, encode_value,
};
use corral_kv::{Event, Kv, MemKv, Txn, TxnOp};

const NODE: &str = "node-1";

const CONFIG: &str = include_str!("configs/blocks.toml");
mod common;

use common::{LinkedAgent as Agent, keys, runtime, wait_until};

fn node() -> NodeName {
    common::node_name(NODE)
}

fn start(runtime: &tokio::runtime::Runtime, kv: &MemKv, dir: &Path, pool_wait: Duration) -> Agent {
    start_with(runtime, kv, dir, pool_wait, Duration::from_secs(30))
}

/// `refresh`: how long a demand change that is not urgent may wait.
fn start_with(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    dir: &Path,
    pool_wait: Duration,
    refresh: Duration,
) -> Agent {
    let config = AgentConfig {
        pool_wait,
        ..common::config(dir)
    };
    let options = ClusterOptions {
        demand_refresh: refresh,
        ..common::options(NODE, "uid-1", Duration::from_secs(600))
    };
    Agent::start(runtime, kv, config, options).wait_registered()
}

/// The active cluster ranges of `pool` (subnets), and its surrendered ones.
fn blocks(agent: &Agent, pool: &str) -> (Vec<String>, Vec<String>) {
    let pools = agent.client().pools(Some("node")).unwrap();
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

async fn put_config(kv: &MemKv) {
    let config = ClusterConfig::from_toml(CONFIG).unwrap();
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::put(keys().config(), config.to_json().unwrap())],
        failure: vec![],
    })
    .await
    .unwrap();
}

fn family_of(cidr: &IpNet) -> Family {
    if cidr.addr().is_ipv4() {
        Family::V4
    } else {
        Family::V6
    }
}

/// Grants block `cidr` of `pool` to the node as the leader writes it; answers the grant's
/// create revision.
async fn grant(kv: &MemKv, pool: &str, cidr: &str) -> i64 {
    common::grant(kv, NODE, pool, cidr).await
}

fn release_key(pool: &str, cidr: &str) -> String {
    let cidr: IpNet = cidr.parse().unwrap();
    keys().release(
        &node(),
        &PoolName::new(pool).unwrap(),
        family_of(&cidr),
        &cidr,
    )
}

/// The leader's step 1: `marked`.
async fn mark(kv: &MemKv, pool: &str, cidr: &str, grant_revision: i64) {
    let record = ReleaseRecord {
        state: ReleaseState::Marked,
        grant_revision,
        marked_ms: 1,
        answered_ms: 0,
        reason: None,
    };
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::put(
            release_key(pool, cidr),
            encode_value(&record).unwrap(),
        )],
        failure: vec![],
    })
    .await
    .unwrap();
}

fn release_record(
    runtime: &tokio::runtime::Runtime,
    kv: &MemKv,
    pool: &str,
    cidr: &str,
) -> Option<ReleaseRecord> {
    runtime
        .block_on(kv.get(release_key(pool, cidr).as_bytes()))
        .unwrap()
        .map(|e| decode_value(&e.value).unwrap())
}

fn demand(runtime: &tokio::runtime::Runtime, kv: &MemKv, pool: &str) -> Option<DemandRecord> {
    runtime
        .block_on(
            kv.get(
                keys()
                    .demand(&node(), &PoolName::new(pool).unwrap())
                    .as_bytes(),
            ),
        )
        .unwrap()
        .map(|e| decode_value(&e.value).unwrap())
}

fn network(pool: Option<&str>, namespace: Option<&str>) -> CniNetwork {
    CniNetwork {
        name: "podnet".into(),
        pools: vec![],
        node_pool: Some(pool.unwrap_or("default").into()),
        requested_pool: pool.map(str::to_owned),
        configured_pool: None,
        namespace: namespace.map(str::to_owned),
    }
}

fn key(i: usize) -> AttachmentKey {
    AttachmentKey {
        network: "podnet".into(),
        container_id: format!("c{i}"),
        ifname: "eth0".into(),
    }
}

fn add(
    client: &mut Client,
    network: &CniNetwork,
    i: usize,
) -> Result<std::net::IpAddr, corral_client::Error> {
    let added = client.cni_add(&CniAddRequest {
        network: network.clone(),
        key: key(i),
        owner: format!("pod-{i}"),
        sets: vec![],
    })?;
    Ok(added.allocations[0].address)
}

fn within(cidr: &str, address: std::net::IpAddr) -> bool {
    cidr.parse::<IpNet>().unwrap().contains(&address)
}

#[test]
fn demand_is_published_with_its_numbers_at_most_once_a_second_and_adds_make_no_requests() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    // A change that is not urgent (more free addresses) goes out within 2 s.
    let agent = start_with(
        &runtime,
        &kv,
        dir.path(),
        Duration::from_secs(5),
        Duration::from_secs(2),
    );
    runtime.block_on(grant(&kv, "pods", "10.60.0.0/24"));
    runtime.block_on(grant(&kv, "pods", "10.60.1.0/24"));
    // The demand once the grants are recorded: 2 empty blocks, highest first.
    wait_until("the first demand", Duration::from_secs(10), || {
        demand(&runtime, &kv, "pods").is_some_and(|d| d.ipv4.is_some_and(|f| f.blocks == 2))
    });
    let first = demand(&runtime, &kv, "pods").unwrap();
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
    // Every write of the demand, as etcd sees it.
    let writes: Arc<Mutex<Vec<Instant>>> = Arc::default();
    {
        let (kv, writes) = (kv.clone(), Arc::clone(&writes));
        let prefix = keys().demand_of_node_prefix(&node());
        runtime.spawn(async move {
            let from = kv
                .range(prefix.as_bytes(), None, 1, None)
                .await
                .unwrap()
                .revision
                + 1;
            let mut watch = kv.watch(prefix.as_bytes(), from).await.unwrap();
            while let Ok(events) = watch.next().await {
                for event in events {
                    if matches!(event, Event::Put(_)) {
                        writes.lock().unwrap().push(Instant::now());
                    }
                }
            }
        });
    }
    std::thread::sleep(Duration::from_millis(200));
    // The node's assertion of what it holds (`holdings/<node>`) is put when a range goes from
    // empty to in use (and its counts at most every 30 s): counted by its version.
    let holdings_key = keys().holdings(&node());
    let holdings_version = |kv: &MemKv| {
        runtime
            .block_on(kv.get(holdings_key.as_bytes()))
            .unwrap()
            .map_or(0, |e| e.version)
    };
    let holdings_before = holdings_version(&kv);
    let before = kv.requests();
    let started = Instant::now();
    let mut client = agent.client();
    let pods = network(Some("pods"), None);
    for i in 0..100 {
        let address = add(&mut client, &pods, i).unwrap();
        assert!(within("10.60.0.0/23", address), "{address}");
    }
    let elapsed = started.elapsed();
    // Free fell below pre-allocate (300): the demand went out within the second. Nothing
    // reads the store meanwhile, so what it counted is the agent's alone.
    std::thread::sleep(Duration::from_millis(2500));
    let requests = kv.requests() - before;
    let holdings_writes = u64::try_from(holdings_version(&kv) - holdings_before).unwrap();
    assert!(holdings_writes <= 2, "{holdings_writes} holdings writes");
    let seen = writes.lock().unwrap().clone();
    let v4 = demand(&runtime, &kv, "pods").unwrap().ipv4.unwrap();
    assert_eq!((v4.used, v4.free, v4.blocks), (100, 408, 2));
    assert_eq!(v4.empty, vec!["10.60.1.0/24".parse::<IpNet>().unwrap()]);
    assert!(!seen.is_empty());
    let window = elapsed + Duration::from_millis(1500);
    assert!(
        seen.len() as f64 <= window.as_secs_f64() + 1.0,
        "{} demand writes in {window:?}",
        seen.len()
    );
    for pair in seen.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(900),
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
    let metrics = agent.client().metrics().unwrap();
    assert!(
        metrics.contains("corral_pool_allocations_total{pool=\"pods\",outcome=\"ok\"} 100"),
        "{metrics}"
    );
    assert!(metrics.contains("corral_demand_writes_total"), "{metrics}");
    assert!(
        metrics.contains("corral_pool_available_addresses{pool=\"pods\",family=\"ipv4\"} 408"),
        "{metrics}"
    );
    agent.stop(&runtime);
}

#[test]
fn an_empty_marked_block_is_surrendered_ready_and_never_allocated_from_again() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_millis(300));
    runtime.block_on(grant(&kv, "small", "10.61.0.0/28"));
    let second = runtime.block_on(grant(&kv, "small", "10.61.0.16/28"));
    wait_until("both blocks", Duration::from_secs(10), || {
        blocks(&agent, "small").0.len() == 2
    });
    runtime.block_on(mark(&kv, "small", "10.61.0.16/28", second));
    wait_until("ready", Duration::from_secs(10), || {
        release_record(&runtime, &kv, "small", "10.61.0.16/28")
            .is_some_and(|r| r.state == ReleaseState::Ready)
    });
    let record = release_record(&runtime, &kv, "small", "10.61.0.16/28").unwrap();
    assert!(
        record.answered_ms > 0 && record.reason.is_none(),
        "{record:?}"
    );
    assert_eq!(record.grant_revision, second);
    let (active, surrendered) = blocks(&agent, "small");
    assert_eq!(active, ["10.61.0.0/28"]);
    assert_eq!(surrendered, ["10.61.0.16/28"]);
    // Fill the other block and more: nothing ever comes from the surrendered one.
    let mut client = agent.client();
    let small = network(Some("small"), None);
    let mut got = Vec::new();
    for i in 0..20 {
        match add(&mut client, &small, i) {
            Ok(address) => got.push(address),
            Err(corral_client::Error::Api { error, .. }) => {
                assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
                assert_eq!(error.pool.as_deref(), Some("small"), "{error:?}");
                assert!(error.message.contains("small"), "{error:?}");
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(got.len(), 14, "a /28's addresses: {got:?}");
    assert!(got.iter().all(|a| within("10.61.0.0/28", *a)), "{got:?}");
    let metrics = agent.client().metrics().unwrap();
    assert!(
        metrics.contains("corral_release_handshakes_total{outcome=\"ready\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("corral_surrendered_blocks 1"), "{metrics}");
    assert!(
        metrics.contains("corral_pool_allocations_total{pool=\"small\",outcome=\"timeout\"} 6"),
        "{metrics}"
    );
    // The leader's step 3: the grant, owned and release keys go in one txn; the agent
    // forgets the surrendered block.
    let cidr: IpNet = "10.61.0.16/28".parse().unwrap();
    let pool = PoolName::new("small").unwrap();
    runtime
        .block_on(kv.txn(Txn {
            compares: vec![],
            success: vec![
                TxnOp::delete(keys().grant(&pool, Family::V4, &cidr)),
                TxnOp::delete(keys().owned(&node(), &pool, Family::V4, &cidr)),
                TxnOp::delete(release_key("small", "10.61.0.16/28")),
            ],
            failure: vec![],
        }))
        .unwrap();
    wait_until(
        "the surrendered block forgotten",
        Duration::from_secs(10),
        || blocks(&agent, "small").1.is_empty(),
    );
    assert_eq!(blocks(&agent, "small").0, ["10.61.0.0/28"]);
    agent.stop(&runtime);
}

#[test]
fn a_block_in_use_is_refused_and_nothing_changes() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_secs(5));
    let revision = runtime.block_on(grant(&kv, "small", "10.61.0.0/28"));
    wait_until("the block", Duration::from_secs(10), || {
        blocks(&agent, "small").0.len() == 1
    });
    let held = add(&mut agent.client(), &network(Some("small"), None), 1).unwrap();
    runtime.block_on(mark(&kv, "small", "10.61.0.0/28", revision));
    wait_until("refused", Duration::from_secs(10), || {
        release_record(&runtime, &kv, "small", "10.61.0.0/28")
            .is_some_and(|r| r.state == ReleaseState::Refused)
    });
    let record = release_record(&runtime, &kv, "small", "10.61.0.0/28").unwrap();
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("allocation")),
        "{record:?}"
    );
    assert_eq!(
        blocks(&agent, "small"),
        (vec!["10.61.0.0/28".to_owned()], vec![])
    );
    // The allocation stays, and the block still serves.
    let again = add(&mut agent.client(), &network(Some("small"), None), 1).unwrap();
    assert_eq!(again, held);
    let other = add(&mut agent.client(), &network(Some("small"), None), 2).unwrap();
    assert!(within("10.61.0.0/28", other));
    // A mark naming another grant of the block is refused too.
    runtime.block_on(mark(&kv, "small", "10.61.0.0/28", revision + 100));
    wait_until("refused again", Duration::from_secs(10), || {
        release_record(&runtime, &kv, "small", "10.61.0.0/28").is_some_and(|r| {
            r.state == ReleaseState::Refused
                && r.reason.as_deref().is_some_and(|r| r.contains("revision"))
        })
    });
    agent.stop(&runtime);
}

#[test]
fn a_withdrawn_release_gives_the_block_back() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_secs(5));
    let revision = runtime.block_on(grant(&kv, "small", "10.61.0.0/28"));
    wait_until("the block", Duration::from_secs(10), || {
        blocks(&agent, "small").0.len() == 1
    });
    runtime.block_on(mark(&kv, "small", "10.61.0.0/28", revision));
    wait_until("surrendered", Duration::from_secs(10), || {
        blocks(&agent, "small") == (vec![], vec!["10.61.0.0/28".to_owned()])
    });
    // The leader un-marks it (the block is needed again): the agent takes it back.
    runtime
        .block_on(kv.txn(Txn {
            compares: vec![],
            success: vec![TxnOp::delete(release_key("small", "10.61.0.0/28"))],
            failure: vec![],
        }))
        .unwrap();
    wait_until("taken back", Duration::from_secs(10), || {
        blocks(&agent, "small") == (vec!["10.61.0.0/28".to_owned()], vec![])
    });
    let address = add(&mut agent.client(), &network(Some("small"), None), 1).unwrap();
    assert!(within("10.61.0.0/28", address));
    agent.stop(&runtime);
}

/// A crash between the local surrender and `ready` (the host's commit done, the txn not
/// sent): the restarted agent finds the block surrendered and the key still marked, and
/// sends `ready`.
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
        blocks(&agent, "small").0.len() == 2
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
        release_record(&runtime, &kv, "small", "10.61.0.0/28")
            .is_some_and(|r| r.state == ReleaseState::Ready)
    });
    // Still surrendered: the grant lasts, and the set of grants does not add it back.
    assert_eq!(
        blocks(&agent, "small"),
        (
            vec!["10.61.0.16/28".to_owned()],
            vec!["10.61.0.0/28".to_owned()]
        )
    );
    agent.stop(&runtime);
}

#[test]
fn an_add_waits_for_a_grant_and_times_out_naming_the_pool() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_secs(5));
    // Nothing granted: the ADD waits, counted as pending in the demand.
    let socket = agent.socket.clone();
    let waiting = std::thread::spawn(move || {
        add(&mut Client::unix(&socket), &network(Some("small"), None), 1)
    });
    wait_until(
        "the pending ADD in the demand",
        Duration::from_secs(3),
        || demand(&runtime, &kv, "small").is_some_and(|d| d.ipv4.is_some_and(|f| f.pending == 1)),
    );
    // Meanwhile the agent answers others.
    assert!(agent.client().status(None).is_ok());
    runtime.block_on(grant(&kv, "small", "10.61.0.0/28"));
    // Served from the grant (a wait that ran out would be an error, not an address).
    let address = waiting.join().unwrap().unwrap();
    assert!(within("10.61.0.0/28", address));
    // Pending again 0 in the demand, promptly.
    wait_until("no pending ADD", Duration::from_secs(3), || {
        demand(&runtime, &kv, "small").is_some_and(|d| d.ipv4.is_some_and(|f| f.pending == 0))
    });
    let metrics = agent.client().metrics().unwrap();
    assert!(
        metrics.contains("corral_pool_allocations_total{pool=\"small\",outcome=\"waited_ok\"} 1"),
        "{metrics}"
    );
    agent.stop(&runtime);

    // A short wait and no grant: code 11 (retry_later) naming the pool.
    let agent = start(&runtime, &kv, dir.path(), Duration::from_millis(400));
    let started = Instant::now();
    let error = add(&mut agent.client(), &network(Some("blue"), None), 2).unwrap_err();
    let waited = started.elapsed();
    match error {
        corral_client::Error::Api { error, .. } => {
            assert_eq!(error.code, ErrorCode::RetryLater, "{error:?}");
            assert_eq!(error.pool.as_deref(), Some("blue"), "{error:?}");
            assert!(error.message.contains("pool blue"), "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    // It waited the whole `pool_wait` (how much longer is the machine's business: a wait that
    // never ended would fail on the client's own timeout, as an error of another kind).
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    agent.stop(&runtime);
}

#[test]
fn the_namespace_picks_its_pool_and_an_explicit_pool_wins() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start(&runtime, &kv, dir.path(), Duration::from_secs(2));
    runtime.block_on(grant(&kv, "blue", "10.62.0.0/28"));
    runtime.block_on(grant(&kv, "small", "10.61.0.0/28"));
    wait_until("the blocks", Duration::from_secs(10), || {
        !blocks(&agent, "blue").0.is_empty() && !blocks(&agent, "small").0.is_empty()
    });
    let mut client = agent.client();
    // Namespace blue maps to pool blue.
    let mapped = add(&mut client, &network(None, Some("blue")), 1).unwrap();
    assert!(within("10.62.0.0/28", mapped), "{mapped}");
    // The call's pool wins over the namespace's.
    let explicit = add(&mut client, &network(Some("small"), Some("blue")), 2).unwrap();
    assert!(within("10.61.0.0/28", explicit), "{explicit}");
    // A DEL resolves the same way (and releases the attachment wherever it is).
    let released = client
        .cni_del(&CniKeyRequest {
            network: network(None, Some("blue")),
            key: key(1),
        })
        .unwrap();
    assert_eq!(released.released.len(), 1);
    agent.stop(&runtime);
}

/// Issue 23: `corral alloc` / `corral release` (`/v1/allocate`, `/v1/release`) on a block pool
/// move the node's demand as CNI ADD and DEL do. Before, a node filled through the API never
/// published its use (still stale after 45 s), so it never got another block.
#[test]
fn the_api_moves_a_block_pools_demand_as_cni_calls_do() {
    let runtime = runtime();
    let kv = MemKv::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(put_config(&kv));
    let agent = start_with(
        &runtime,
        &kv,
        dir.path(),
        Duration::from_secs(5),
        Duration::from_secs(1),
    );
    runtime.block_on(grant(&kv, "pods", "10.60.0.0/24"));
    let used =
        |kv: &MemKv| demand(&runtime, kv, "pods").and_then(|d| d.ipv4.map(|f| (f.used, f.blocks)));
    wait_until("the first demand", Duration::from_secs(10), || {
        used(&kv) == Some((0, 1))
    });
    let mut client = agent.client();
    for i in 0..3 {
        client
            .allocate(&corral_api::AllocateRequest {
                scope: "node".into(),
                pool: "pods".into(),
                family: None,
                address: None,
                owner: format!("api-{i}"),
                key: None,
                lease_ms: None,
            })
            .unwrap();
    }
    wait_until("the allocations counted", Duration::from_secs(10), || {
        used(&kv) == Some((3, 1))
    });
    client
        .release(&corral_api::ReleaseRequest {
            scope: "node".into(),
            key: None,
            address: None,
            generation: None,
            owner: Some("api-0".into()),
        })
        .unwrap();
    wait_until("the release counted", Duration::from_secs(10), || {
        used(&kv) == Some((2, 1))
    });
    agent.stop(&runtime);
}
