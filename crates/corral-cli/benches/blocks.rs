//! `make bench-cluster` (second part): block mode on a local three-member etcd (real processes,
//! real fsync):
//! - 100 nodes claiming blocks at once: conflicts per successful grant transaction, beside
//!   etcd's one-contended-key compare-and-swap measured in the same run (Calico's shape: every
//!   claimer on shared keys); wall time, p50/p99 per grant transaction, etcd requests per grant
//!   (the operator runs in this process, on the counting etcd client);
//! - a cold node to its first pod address in agent mode (`corral agent` and `corral operator`
//!   processes): agent start to the first CNI ADD answered, the ADD waiting for the node's
//!   first blocks;
//! - etcd requests per CNI ADD during churn: every unary request etcd served (its own
//!   counters, all clients: agent, operator) during 2,000 ADDs and 2,000 DELs on that agent;
//! - excess to quarantine: 200 pods released at once; from the last DEL until the excess
//!   blocks are deleted into quarantine, against the release delay (10 s here).
//!
//! Figures go to BENCHMARKS.md by hand, with the command.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_client::Client;
use corral_cluster::testing::PoolTable;
use corral_cluster::{DemandRecord, FamilyDemand, Keys, NodeName, encode_value};
use corral_etcd::EtcdKv;
use corral_etcd::testing::{EtcdCluster, Workload, raw_txn_rate};
use corral_kv::{Kv, Txn, TxnOp};

mod operator;

use operator::{InProcess, install_config, node_record, percentile, runtime_and_etcd};

#[allow(dead_code)] // the bench uses part of the tests\' harness
#[path = "../tests/common/mod.rs"]
mod common;

use common::{pod_add, pod_del};

const NODES: usize = 100;
/// Addresses each node waits for: beyond its first block, two more /26s (62 each) of IPv4 and
/// two more /122s of IPv6.
const PENDING: u64 = 150;
const RELEASE_DELAY_SECS: u64 = 10;

fn config() -> String {
    let pods = PoolTable::blocks("pods")
        .set("release_delay_secs", RELEASE_DELAY_SECS)
        .ipv4("10.0.0.0/8", 26)
        .ipv6("fd00::/64", 122);
    format!("quarantine_secs = 60\n{pods}")
}

fn main() {
    let (runtime, etcd) = runtime_and_etcd(3, &[]);
    runtime.block_on(claims(&etcd));
    processes(&runtime, &etcd);
}

fn node(i: usize) -> NodeName {
    NodeName::new(&format!("node-{i:03}")).unwrap()
}

async fn claims(etcd: &EtcdCluster) {
    let endpoints = etcd.endpoints();
    let kv = EtcdKv::connect(&endpoints, Default::default())
        .await
        .unwrap();
    println!(
        "rig: etcd 3 members on 127.0.0.1 (fsync on), {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let raw = raw_txn_rate(
        &kv,
        "/bench-raw",
        Workload::OneKeyCas,
        NODES,
        Duration::from_secs(3),
    )
    .await;
    println!("one contended key, {NODES} claimers (compare-and-swap): {raw}");

    let keys = Keys::new(corral_cluster::ClusterName::new("blocks").unwrap());
    install_config(&kv, &keys, &config()).await;
    // The nodes, registered; their agents' demand comes all at once below.
    let mut register = Txn::default();
    for i in 0..NODES {
        let record = node_record(format!("uid-{i}"));
        register
            .success
            .push(TxnOp::put(keys.node(&node(i)), record));
    }
    kv.txn(register).await.unwrap();

    let operator = InProcess::start(&endpoints, "blocks", 16, corral_kv::MAX_TXN_OPS).await;
    let (counted, shared) = (&operator.counted, &operator.shared);
    // Cold nodes get their watermarks' blocks first (one per family each): wait for them.
    let cold = 2 * NODES as u64;
    wait_blocks(shared, cold).await;
    let granted_before = shared.grant_txns(corral_operator::TxnOutcome::Granted);
    let conflicts_before = shared.grant_txns(corral_operator::TxnOutcome::Conflict);
    let requests_before = counted.requests();
    let blocks_before = blocks_granted(shared);

    // Every node's demand at once: 150 addresses waiting per family.
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..NODES {
        let kv = kv.clone();
        let key = keys.demand(&node(i), &corral_cluster::PoolName::new("pods").unwrap());
        tasks.spawn(async move {
            let family = FamilyDemand {
                used: 0,
                free: 62,
                pending: PENDING,
                blocks: 1,
                empty: Vec::new(),
            };
            let record = DemandRecord {
                ipv4: Some(family.clone()),
                ipv6: Some(FamilyDemand { free: 64, ..family }),
                at_ms: 1,
            };
            kv.txn(Txn {
                compares: vec![],
                success: vec![TxnOp::put(key, encode_value(&record).unwrap())],
                failure: vec![],
            })
            .await
            .unwrap();
        });
    }
    while tasks.join_next().await.is_some() {}
    // 150 waiting, 62 free (64 for IPv6): a surge of 88 (86), two more blocks per family.
    let wanted = blocks_before + 4 * NODES as u64;
    wait_blocks(shared, wanted).await;
    let wall = started.elapsed();
    let granted = shared.grant_txns(corral_operator::TxnOutcome::Granted) - granted_before;
    let conflicts = shared.grant_txns(corral_operator::TxnOutcome::Conflict) - conflicts_before;
    let requests = counted.requests() - requests_before;
    let mut samples = shared.txn_samples();
    samples.sort();
    println!(
        "{NODES} nodes claiming {} blocks at once: {:.2} s, {granted} grant txns, {conflicts} conflicts ({:.3} per successful grant), {:.2} etcd requests per grant txn",
        wanted - blocks_before,
        wall.as_secs_f64(),
        conflicts as f64 / granted.max(1) as f64,
        requests as f64 / granted.max(1) as f64
    );
    println!(
        "txn latency (all of the operator's): p50 {:.2} ms, p99 {:.2} ms ({} samples)",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.len()
    );
    operator.stop().await;
}

fn blocks_granted(shared: &corral_operator::Shared) -> u64 {
    shared.blocks_granted("pods")
}

async fn wait_blocks(shared: &corral_operator::Shared, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while blocks_granted(shared) < n {
        assert!(
            Instant::now() < deadline,
            "blocks stalled at {} of {n}",
            blocks_granted(shared)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn add(client: &mut Client, container: &str) {
    pod_add(client, "pods", container, container.into()).unwrap();
}

fn del(client: &mut Client, container: &str) {
    pod_del(client, "pods", container).unwrap();
}

/// Unary requests etcd served, summed over its members (its own `grpc_server_handled_total`).
fn etcd_requests(etcd: &EtcdCluster) -> u64 {
    (0..etcd.len())
        .filter_map(|i| etcd.metrics(i).ok())
        .flat_map(|text| {
            text.lines()
                .filter(|l| {
                    l.starts_with("grpc_server_handled_total{") && l.contains("grpc_type=\"unary\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum::<f64>() as u64
}

/// The node's blocks in etcd.
fn node_blocks(runtime: &tokio::runtime::Runtime, kv: &EtcdKv, keys: &Keys, node: &str) -> usize {
    let prefix = keys.owned_prefix(&NodeName::new(node).unwrap());
    runtime
        .block_on(corral_kv::read_all(kv, prefix.as_bytes(), 1000))
        .unwrap()
        .0
        .len()
}

fn spawn_operator(endpoints: &str, dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args([
            "operator",
            "--etcd",
            endpoints,
            "--cluster",
            "blocks",
            "--replica",
            "op",
        ])
        .args(["--api-socket", dir.join("op.sock").to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("operator.log")).unwrap())
        .spawn()
        .unwrap()
}

fn processes(runtime: &tokio::runtime::Runtime, etcd: &EtcdCluster) {
    let endpoints = etcd.endpoints().join(",");
    let kv = runtime
        .block_on(EtcdKv::connect(&etcd.endpoints(), Default::default()))
        .unwrap();
    let keys = Keys::new(corral_cluster::ClusterName::new("blocks").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut operator = spawn_operator(&endpoints, dir.path());
    std::thread::sleep(Duration::from_secs(1));

    // A cold node: the agent process started, its first ADD at once (it waits for blocks).
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let socket = state.join("agent.sock");
    let config = state.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nsocket = {:?}\ncni_data_dirs = []\n",
            state.join("state"),
            socket
        ),
    )
    .unwrap();
    let started = Instant::now();
    let agent = common::Agent::start(
        &[
            "--config".as_ref(),
            config.as_os_str(),
            "--etcd".as_ref(),
            endpoints.as_ref(),
            "--cluster".as_ref(),
            "blocks".as_ref(),
            "--node".as_ref(),
            "cold".as_ref(),
        ],
        &socket,
    );
    let ready = started.elapsed();
    let mut client = Client::unix(&socket);
    add(&mut client, "first");
    let first = started.elapsed();
    println!(
        "cold node: agent start to API ready {:.0} ms, to its first pod address {:.0} ms (the ADD waited {:.0} ms for the node's first blocks)",
        ready.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        (first - ready).as_secs_f64() * 1e3
    );

    // Churn: 2,000 ADDs and 2,000 DELs, at most 100 pods at a time.
    std::thread::sleep(Duration::from_secs(2));
    let before = etcd_requests(etcd);
    let churn_started = Instant::now();
    let mut live = std::collections::VecDeque::new();
    for i in 0..2000 {
        let container = format!("churn-{i}");
        add(&mut client, &container);
        live.push_back(container);
        if live.len() > 100 {
            del(&mut client, &live.pop_front().unwrap());
        }
        // About 200 ADDs a second.
        std::thread::sleep(Duration::from_millis(5));
    }
    while let Some(container) = live.pop_front() {
        del(&mut client, &container);
    }
    let churn = churn_started.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let requests = etcd_requests(etcd) - before;
    println!(
        "churn: 2000 ADDs and 2000 DELs in {:.1} s: {requests} etcd requests in all (agent's debounced demand, the operator's grants and handshakes, keep-alives excluded): {:.3} per ADD; 0 made by any ADD or DEL itself",
        churn.as_secs_f64(),
        requests as f64 / 2000.0
    );

    // Excess to quarantine: 200 pods, then all released at once.
    std::thread::sleep(Duration::from_secs(RELEASE_DELAY_SECS + 5));
    for i in 0..200 {
        add(&mut client, &format!("grow-{i}"));
    }
    std::thread::sleep(Duration::from_secs(2));
    let grown = node_blocks(runtime, &kv, &keys, "cold");
    for i in 0..200 {
        del(&mut client, &format!("grow-{i}"));
    }
    del(&mut client, "first");
    let released_at = Instant::now();
    // Back to the watermarks: one /26 and one /122 cover pre-allocate 8. The handshake's
    // timeline: its first `marked` and `ready` keys seen.
    let (mut marked, mut ready) = (None, None);
    let mut last_line: Option<String> = None;
    let release_prefix = keys.release_of_node_prefix(&NodeName::new("cold").unwrap());
    loop {
        if node_blocks(runtime, &kv, &keys, "cold") <= 2 {
            break;
        }
        let (open, _) = runtime
            .block_on(corral_kv::read_all(&kv, release_prefix.as_bytes(), 100))
            .unwrap();
        if std::env::var_os("BENCH_TIMELINE").is_some() {
            let states: Vec<String> = open
                .iter()
                .map(|e| {
                    let text = String::from_utf8_lossy(&e.value).into_owned();
                    let key = e.key_str().into_owned();
                    format!("{} {}", key.rsplit('/').next().unwrap_or(""), text)
                })
                .collect();
            let line = format!(
                "{} blocks; {states:?}",
                node_blocks(runtime, &kv, &keys, "cold")
            );
            if last_line.as_deref() != Some(line.as_str()) {
                println!("  {:.2} s: {line}", released_at.elapsed().as_secs_f64());
                last_line = Some(line);
            }
        }
        for entry in &open {
            let text = String::from_utf8_lossy(&entry.value);
            if marked.is_none() && text.contains("\"marked\"") {
                marked = Some(released_at.elapsed());
            }
            if ready.is_none() && text.contains("\"ready\"") {
                marked.get_or_insert(released_at.elapsed());
                ready = Some(released_at.elapsed());
            }
        }
        assert!(
            released_at.elapsed() < Duration::from_secs(120),
            "the excess was not released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = released_at.elapsed();
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    println!(
        "release timeline after the last DEL: first block marked {:.2} s, first ready {:.2} s, excess quarantined {:.2} s",
        secs(marked),
        secs(ready),
        took.as_secs_f64()
    );
    println!(
        "excess to quarantine: {grown} blocks held, all pods released: the excess blocks quarantined {:.2} s after the last DEL (release delay {RELEASE_DELAY_SECS} s, so {:.2} s beyond it; Cilium: about 4-6 min at its 180 s delay)",
        took.as_secs_f64(),
        took.as_secs_f64() - RELEASE_DELAY_SECS as f64
    );
    if let Ok(path) = std::env::var("BENCH_OPERATOR_LOG") {
        let _ = std::fs::copy(dir.path().join("operator.log"), path);
    }
    drop(agent);
    let _ = operator.kill();
    let _ = operator.wait();
}
