//! `make bench-demand` (issue 25): the cluster-wide demand write budget under churn at 10,000
//! nodes, on a local three-member etcd (real processes, real fsync).
//!
//! Each of the 10,000 nodes runs the agent's own demand writer (`corral_agent::link::
//! DemandWriter`: the pacing, the urgency rule, the record and its transaction, which reads the
//! node count back) in a task of this process, as its cluster link drives it: a change of the
//! node's pods touches it, and it looks when due. Only what the link reads from the node state
//! is simulated: each node's pods churn (a pod added or deleted every 500 ms on average, so
//! every node always has a change to publish), in one IPv4 block pool of /26 blocks with a
//! pre-allocate watermark of 8; a node whose demand was written with fewer than 16 free gets a
//! block at once (the leader's grant), one with more than 192 free gives one back. The node
//! count is the leader's rule (`corral_cluster::census_to_publish`), written once before the
//! runs, as the leader does when the nodes register. Nodes start over 10 s.
//!
//! Two runs: with the budget (`BENCH_DEMAND_BUDGET`, default 1,000 a second), then without
//! one (the 1 s floor alone, as before issue 25). Each waits for every node's first demand
//! (60 s at most) and one share more, then measures for `BENCH_DEMAND_SECS` (30) or two shares,
//! whichever is longer (150 s at most): the demand writes etcd completed a second (mean,
//! highest second), calls that failed, etcd's revision advance (one revision per write; nothing
//! else writes; blank when etcd did not answer the probe), and how long urgent changes
//! (free below the watermark) waited for their write. `BENCH_DEMAND_NODES` changes the size.
//! The raw etcd transaction rate (32 writers) is measured in the same run first.
//!
//! Figures go to BENCHMARKS.md by hand, with the command.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use corral_agent::link::DemandWriter;
use corral_cluster::{
    CensusRecord, ClusterConfig, DemandRecord, FamilyDemand, Keys, NodeName, PoolName,
    census_to_publish, demand_interval, encode_value,
};
use corral_etcd::EtcdKv;
use corral_etcd::testing::{EtcdCluster, Workload, raw_txn_rate};
use corral_kv::{Kv, Txn, TxnOp};
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

mod knobs;
#[allow(dead_code)]
mod operator;

use knobs::env;
use operator::{percentile, runtime_and_etcd};

const CLUSTER: &str = "bench-demand";
const BLOCK: u64 = 64;
const PRE_ALLOCATE: u64 = 8;
/// etcd clients the nodes share (real agents have one each; a few channels keep this
/// process from being the bottleneck).
const CLIENTS: usize = 16;
/// A budget no cluster here reaches: each node's share is the 1 s floor, as before issue 25.
const UNBOUNDED: u64 = 1_000_000_000;

fn config(budget: u64) -> ClusterConfig {
    ClusterConfig::from_toml(&format!(
        r#"
demand_writes_per_sec = {budget}
[[pools]]
name = "pods"
mode = "blocks"
[pools.watermarks]
pre_allocate = {PRE_ALLOCATE}
[pools.ipv4]
cidrs = ["10.0.0.0/8"]
block_prefix_len = 26
"#
    ))
    .unwrap()
}

fn main() {
    let (runtime, etcd) = runtime_and_etcd(3, &[]);
    runtime.block_on(bench(&etcd));
}

async fn bench(etcd: &EtcdCluster) {
    let nodes: u64 = env("BENCH_DEMAND_NODES", 10_000);
    let budget: u64 = env("BENCH_DEMAND_BUDGET", 1_000);
    let secs: u64 = env("BENCH_DEMAND_SECS", 30);
    let endpoints = etcd.endpoints();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(
            EtcdKv::connect(&endpoints, Default::default())
                .await
                .unwrap(),
        );
    }
    let kv = clients[0].clone();
    println!(
        "rig: etcd 3 members on 127.0.0.1 (fsync on), {} cores; {nodes} nodes, churn a pod \
         change every 500 ms per node on average",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let raw = raw_txn_rate(
        &kv,
        "/bench-raw",
        Workload::DistinctKeys,
        32,
        Duration::from_secs(3),
    )
    .await;
    println!("raw etcd txn, 32 writers: {raw}");
    let keys = Keys::new(corral_cluster::ClusterName::new(CLUSTER).unwrap());
    // The leader's count, as it writes it once the nodes registered.
    let census = census_to_publish(None, nodes).unwrap();
    kv.txn(Txn {
        compares: vec![],
        success: vec![TxnOp::put(
            keys.census(),
            encode_value(&CensusRecord { nodes: census }).unwrap(),
        )],
        failure: vec![],
    })
    .await
    .unwrap();
    // The budget first: the run without one may leave etcd overloaded for a while.
    for (label, run_budget) in [("budget", budget), ("no budget (1 s floor)", UNBOUNDED)] {
        let interval = demand_interval(census, run_budget);
        println!(
            "\n{label}: demand_writes_per_sec = {}, census {census} nodes, share: one write \
             per {interval:?}",
            if run_budget == UNBOUNDED {
                "unbounded".to_owned()
            } else {
                run_budget.to_string()
            }
        );
        run(&clients, &endpoints, &keys, nodes, config(run_budget), secs).await;
    }
}

/// What the link reads from one node's state, simulated: its pods and blocks.
struct NodeState {
    used: u64,
    blocks: u64,
    /// Since when its free addresses are below the watermark, unwritten.
    urgent_since: Option<Instant>,
}

impl NodeState {
    fn free(&self) -> u64 {
        self.blocks * BLOCK - self.used
    }

    fn records(&self, pool: &PoolName) -> BTreeMap<PoolName, DemandRecord> {
        let record = DemandRecord {
            ipv4: Some(FamilyDemand {
                used: self.used,
                free: self.free(),
                pending: 0,
                blocks: self.blocks,
                empty: vec![],
            }),
            ipv6: None,
            at_ms: 0,
        };
        BTreeMap::from([(pool.clone(), record)])
    }
}

#[derive(Default)]
struct Counts {
    writes: AtomicU64,
    /// Nodes that wrote their first demand.
    first: AtomicU64,
    errors: AtomicU64,
}

/// etcd's revision now (`None` if an overloaded etcd does not answer).
async fn revision(kv: &EtcdKv) -> Option<i64> {
    match kv.txn(Txn::default()).await {
        Ok(response) => Some(response.revision),
        Err(error) => {
            eprintln!("  probe: {error}");
            None
        }
    }
}

async fn run(
    clients: &[EtcdKv],
    endpoints: &[String],
    keys: &Keys,
    nodes: u64,
    config: ClusterConfig,
    secs: u64,
) {
    let config = Arc::new(config);
    let counts = Arc::new(Counts::default());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let interval = demand_interval(nodes + nodes / 8, config.demand_writes_per_sec);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..nodes {
        let kv = clients[i as usize % clients.len()].clone();
        let (keys, config, counts) = (keys.clone(), Arc::clone(&config), Arc::clone(&counts));
        let mut stop = stop.clone();
        tasks.spawn(async move {
            let node = NodeName::new(&format!("node-{i:05}")).unwrap();
            let pool = PoolName::new("pods").unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i);
            let mut state = NodeState {
                used: rng.random_range(60..124),
                blocks: 2,
                urgent_since: None,
            };
            // Agents start over 10 s, not all in one instant.
            let start = Instant::now() + Duration::from_millis(rng.random_range(0..10_000));
            let mut writer = DemandWriter::with_refresh(Duration::from_secs(1), start);
            let mut next_churn = Instant::now() + Duration::from_millis(rng.random_range(0..1000));
            let mut waits: Vec<(Instant, Duration)> = Vec::new();
            let mut first = true;
            loop {
                let due = writer.due();
                tokio::select! {
                    _ = stop.changed() => break,
                    () = tokio::time::sleep_until(next_churn) => {
                        let now = Instant::now();
                        if rng.random_bool(0.5) {
                            state.used = (state.used + 1).min(state.blocks * BLOCK);
                        } else {
                            state.used = state.used.saturating_sub(1);
                        }
                        if state.free() < PRE_ALLOCATE && state.urgent_since.is_none() {
                            state.urgent_since = Some(now);
                        }
                        writer.touched(now);
                        next_churn = now + Duration::from_millis(rng.random_range(0..1000));
                    }
                    () = sleep_until_due(due) => {
                        let now = Instant::now();
                        let records = state.records(&pool);
                        match writer.offer(&kv, &keys, &node, &config, &records, false, now).await {
                            Ok(true) => {
                                counts.writes.fetch_add(1, Ordering::Relaxed);
                                if std::mem::take(&mut first) {
                                    counts.first.fetch_add(1, Ordering::Relaxed);
                                }
                                let free = state.free();
                                // The leader's answer to what was written.
                                if free < 2 * PRE_ALLOCATE {
                                    state.blocks += 1;
                                } else if free > 3 * BLOCK {
                                    state.blocks -= 1;
                                }
                                if let Some(since) = state.urgent_since.take() {
                                    waits.push((since, now - since));
                                }
                            }
                            Ok(false) => {}
                            Err(_) => {
                                counts.errors.fetch_add(1, Ordering::Relaxed);
                                writer.touched(Instant::now() + Duration::from_secs(1));
                            }
                        }
                    }
                }
            }
            waits
        });
    }
    // The probe has a client of its own: the nodes' queues do not delay its reads.
    let probe = EtcdKv::connect(endpoints, Default::default())
        .await
        .unwrap();
    // Warm-up: every node's first demand (all at once: a cold start), then one share more,
    // so each node's bucket is down to its steady pace (2 minutes at most).
    let started = Instant::now();
    while counts.first.load(Ordering::Relaxed) < nodes
        && started.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "  warm-up: {} of {nodes} first demands written in {:.1} s",
        counts.first.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep((interval + Duration::from_secs(2)).min(Duration::from_secs(60))).await;
    // The window: at least two shares, so every node's steady pace is in it (150 s at most).
    let secs = secs.max(2 * interval.as_secs() + 1).min(150);
    let measured_from = Instant::now();
    let measured_to = measured_from + Duration::from_secs(secs);
    let kv = &probe;
    let first = revision(kv).await;
    let writes_before = counts.writes.load(Ordering::Relaxed);
    let mut last = writes_before;
    let mut highest = 0u64;
    let mut tick = tokio::time::interval_at(
        measured_from + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    for _ in 0..secs {
        tick.tick().await;
        let now = counts.writes.load(Ordering::Relaxed);
        highest = highest.max(now - last);
        last = now;
    }
    let end = revision(kv).await;
    let elapsed = Instant::now() - measured_from;
    let writes = counts.writes.load(Ordering::Relaxed) - writes_before;
    let _ = stop_tx.send(true);
    let mut waits = Vec::new();
    while let Some(done) = tasks.join_next().await {
        waits.extend(
            done.unwrap()
                .into_iter()
                .filter(|(since, _)| *since >= measured_from && *since < measured_to)
                .map(|(_, waited)| waited),
        );
    }
    waits.sort();
    let rate =
        end.map_or(f64::NAN, |end| (end - first.unwrap_or(end)) as f64) / elapsed.as_secs_f64();
    println!(
        "  etcd revisions: {:.0}/s mean over {:.1} s; demand writes done {:.0}/s, highest \
         1-s {highest}/s; errors (timeouts) {}",
        rate,
        elapsed.as_secs_f64(),
        writes as f64 / elapsed.as_secs_f64(),
        counts.errors.load(Ordering::Relaxed)
    );
    println!(
        "  urgent changes written in the window: {}, waited p50 {:?}, p99 {:?}, max {:?}",
        waits.len(),
        percentile(&waits, 0.5),
        percentile(&waits, 0.99),
        waits.last().copied().unwrap_or_default()
    );
}

async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
