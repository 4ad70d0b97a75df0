//! A new leader's rebuild and its grants, on `MemKv`: the operator's own share of issue 25's
//! failover at 100,000 nodes, with no etcd beside it on the two cores (so a profile shows only
//! the operator: `perf record` on this binary).
//!
//! `BENCH_NODES` nodes (default 100,000; names `node-NNNNNN`) register on the cluster bench's
//! dual-stack pool (`bench_cluster.toml`: IPv4 /26s, IPv6 /64s); replica `op-a` grants them
//! (timed: its grants per second, with no etcd round trip), then every node's holdings are
//! asserted as agents do, and op-a stops cleanly. Then `BENCH_ROUNDS` (default 3) replicas in
//! turn take the lead, each rebuilding from the whole store: the rebuild's time (the leader's
//! own `last_rebuild`) and what it read. Before those, the view alone (`BENCH_VIEW_ROUNDS`,
//! default 3): the keys read into memory once, then applied to a new view as a rebuild does.
//! Last (`BENCH_RESTORE`, default 1; 0 leaves it out), a restore that lost every grant: the
//! grants, `owned/` keys, node IDs and history deleted, the holdings kept (every node's agent
//! asserts what it holds), so every held range is blocked without a grant; a new leader
//! rebuilds and grants every node again around them (up to 131,072 nodes: held and granted
//! again, they fill the pool's 262,144 IPv4 node CIDRs). `BENCH_NODE_IDS=1` adds a node-ID
//! plan of 65,536 IDs (Contiv's), so every grant carries one.
//!
//! ```sh
//! cargo bench -p corral-operator --bench rebuild
//! BENCH_NODES=30000 cargo bench -p corral-operator --bench rebuild
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_cluster::{
    ClusterConfig, ClusterName, HeldRange, HoldingsRecord, Key, Keys, NodeRecord,
};
use corral_cluster::{NodeName, encode_value};
use corral_kv::{Kv, MemKv, Txn, TxnOp};
use corral_operator::{OperatorConfig, Shared};

const CONFIG: &str = include_str!("../../corral-cli/tests/configs/bench_cluster.toml");

/// A node-ID plan of 65,536 IDs beside the pool (`BENCH_NODE_IDS`).
const NODE_IDS: &str = r#"
[node_ids]
pod_subnet = "100.0.0.0/8"
pod_subnet_node_prefix_len = 24
host_interconnect_subnet = "101.0.0.0/8"
host_interconnect_node_prefix_len = 24
node_interconnect = "102.0.0.0/16"
vxlan = "102.1.0.0/16"
service = "102.16.0.0/12"
"#;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().map_or(default, |v| {
        v.parse().unwrap_or_else(|_| panic!("{name} is a number"))
    })
}

struct Replica {
    shared: Arc<Shared>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn start(kv: &MemKv, name: &str) -> Replica {
    let shared = Arc::new(Shared::new(name.to_owned()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = OperatorConfig {
        cluster: "t".into(),
        replica: name.into(),
        lease_ttl: Duration::from_secs(10),
        workers: 16,
        page: OperatorConfig::DEFAULT_PAGE,
        max_txn_ops: corral_kv::MAX_TXN_OPS,
    };
    let task = tokio::spawn({
        let (kv, shared) = (kv.clone(), Arc::clone(&shared));
        async move {
            corral_operator::run_with_cloud::<_, corral_cloud::FakeEc2>(
                kv,
                config,
                shared,
                None,
                async move {
                    let _ = stopped.await;
                },
            )
            .await
            .expect("the operator runs until stopped");
        }
    });
    Replica { shared, stop, task }
}

async fn count(kv: &MemKv, prefix: &str) -> u64 {
    let end = corral_kv::prefix_end(prefix.as_bytes());
    kv.range_span(prefix.as_bytes(), &end, 1, None)
        .await
        .unwrap()
        .count
}

/// Writes `ops`, 100 to a transaction (as agents' writes reach etcd).
async fn write_in_batches(kv: &MemKv, mut ops: Vec<TxnOp>) {
    while !ops.is_empty() {
        let rest = ops.split_off(ops.len().min(100));
        kv.txn(Txn {
            success: ops,
            ..Txn::default()
        })
        .await
        .unwrap();
        ops = rest;
    }
}

async fn wait_leading(replica: &Replica) {
    while !replica.shared.leading() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The view's share of a rebuild: every key a rebuild reads, in the order it reads them (the
/// history left out, kind by kind), already in memory, applied to a new view as the leader
/// applies its pages, `rounds` times. What a rebuild on etcd adds is etcd's serving and the
/// client's decoding of its answers.
async fn view_alone(kv: &MemKv, keys: &Keys, rounds: usize) {
    let mut scan = corral_kv::Scan::new(keys.prefix().as_bytes(), OperatorConfig::DEFAULT_PAGE)
        .skipping(keys.history_prefix().as_bytes())
        .by_segments(&keys.kinds());
    let mut entries = Vec::new();
    while let Some(page) = scan.next(kv).await.unwrap() {
        entries.extend(page.kvs);
    }
    let value_of = |key: String| {
        entries
            .iter()
            .find(|e| e.key == key.as_bytes())
            .map(|e| (e.value.clone(), e.mod_revision))
    };
    let (stored, applied) = (value_of(keys.config()), value_of(keys.config_applied()));
    let mut times = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let mut view = corral_cluster::ClusterView::for_read_after(
            keys.clone(),
            stored.as_ref().map(|(v, _)| v.as_slice()),
            applied.as_ref().map(|(v, _)| v.as_slice()),
            None,
        )
        .unwrap();
        let applied = corral_operator::apply_read_page(&mut view, keys, &entries);
        view.finish_read(stored.as_ref().map(|(v, r)| (v.as_slice(), *r)));
        times.push((started.elapsed(), applied));
        assert!(view.config_in_force());
        drop(view);
    }
    times.sort();
    if let Some((median, applied)) = times.get(times.len() / 2) {
        println!(
            "the view alone: {:.0} ms median of {rounds} for {applied} keys ({:.2} µs a key)",
            median.as_secs_f64() * 1e3,
            median.as_secs_f64() * 1e6 / *applied as f64
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes = env_usize("BENCH_NODES", 100_000);
    let rounds = env_usize("BENCH_ROUNDS", 3);
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let kv = MemKv::new();
    // `BENCH_NODE_IDS=1`: with a node-ID plan of 65,536 IDs (Contiv's), every node granted one.
    let config = if env_usize("BENCH_NODE_IDS", 0) != 0 {
        assert!(nodes <= 65_536, "the node-ID plan holds 65,536 nodes");
        ClusterConfig::from_toml(&format!("{CONFIG}{NODE_IDS}")).unwrap()
    } else {
        ClusterConfig::from_toml(CONFIG).unwrap()
    };
    kv.txn(Txn {
        success: vec![TxnOp::put(keys.config(), config.to_json().unwrap())],
        ..Txn::default()
    })
    .await
    .unwrap();
    let names: Vec<NodeName> = (0..nodes)
        .map(|i| NodeName::new(&format!("node-{i:06}")).unwrap())
        .collect();
    let registrations = names
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let record = NodeRecord {
                uid: format!("uid-{i}"),
                addresses: vec![],
                registered_ms: 0,
                instance_id: None,
                max_pods: None,
            };
            TxnOp::put(keys.node(node), encode_value(&record).unwrap())
        })
        .collect();
    write_in_batches(&kv, registrations).await;
    let started = Instant::now();
    let first = start(&kv, "op-a");
    let grants = keys.grants_prefix();
    while count(&kv, &grants).await < 2 * nodes as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let granted = started.elapsed();
    println!(
        "{nodes} nodes: op-a granted {} in {:.2} s ({:.0} grants/s, rebuild included)",
        2 * nodes,
        granted.as_secs_f64(),
        (2 * nodes) as f64 / granted.as_secs_f64()
    );
    // Holdings, as agents assert them: what `owned/` gives each node.
    let (owned, _) = corral_kv::read_all(&kv, keys.all_owned_prefix().as_bytes(), 5000)
        .await
        .unwrap();
    let mut held: std::collections::BTreeMap<NodeName, Vec<HeldRange>> = Default::default();
    for entry in owned {
        if let Ok(Key::Owned {
            node, pool, cidr, ..
        }) = keys.parse(&entry.key_str())
        {
            held.entry(node).or_default().push(HeldRange {
                pool,
                cidr,
                draining: false,
                allocations: 0,
            });
        }
    }
    let holdings = held
        .into_iter()
        .map(|(node, ranges)| {
            let uid = node
                .as_str()
                .trim_start_matches("node-")
                .parse::<usize>()
                .unwrap();
            let record = HoldingsRecord {
                uid: format!("uid-{uid}"),
                ranges,
                ..Default::default()
            };
            TxnOp::put(keys.holdings(&node), encode_value(&record).unwrap())
        })
        .collect();
    write_in_batches(&kv, holdings).await;
    let _ = first.stop.send(());
    first.task.await.unwrap();
    let total = count(&kv, keys.prefix()).await;
    println!("store: {total} keys");
    // What each kind costs read alone (as the rebuild reads it: its first range the whole
    // kind, then ranges of about a page).
    for kind in keys.kinds() {
        let mut scan = corral_kv::Scan::new(kind.as_bytes(), 2000);
        while scan.next(&kv).await.unwrap().is_some() {}
        let stats = scan.stats();
        if stats.keys > 0 {
            println!(
                "  {kind}: {} keys, {} requests, {} walked ({:.2} a key)",
                stats.keys,
                stats.requests,
                stats.walked,
                stats.walked as f64 / stats.keys as f64
            );
        }
    }
    view_alone(&kv, &keys, env_usize("BENCH_VIEW_ROUNDS", 3)).await;
    let mut times = Vec::new();
    for round in 0..rounds {
        let replica = start(&kv, &format!("op-{round}"));
        wait_leading(&replica).await;
        let (stats, took) = replica.shared.last_rebuild().expect("a rebuild");
        println!(
            "rebuild {round}: {:.0} ms, {} keys, {} requests, {} walked ({:.2} µs a key)",
            took.as_secs_f64() * 1e3,
            stats.keys,
            stats.requests,
            stats.walked,
            took.as_secs_f64() * 1e6 / stats.keys as f64
        );
        times.push(took);
        let _ = replica.stop.send(());
        replica.task.await.unwrap();
    }
    times.sort();
    if let Some(median) = times.get(times.len() / 2) {
        println!("rebuild median: {:.0} ms", median.as_secs_f64() * 1e3);
    }
    if env_usize("BENCH_RESTORE", 1) != 0 {
        if nodes <= RESTORE_MAX_NODES {
            grants_lost(&kv, &keys, nodes).await;
        } else {
            println!(
                "every grant lost: left out above {RESTORE_MAX_NODES} nodes (the pool cannot hold every node twice)"
            );
        }
    }
}

/// The most nodes whose held ranges and new grants fit the bench pool's IPv4 side together
/// (262,144 node CIDRs of /26 in 10.0.0.0/8).
const RESTORE_MAX_NODES: usize = 131_072;

/// A restore from a snapshot taken before any grant: the grants, `owned/` keys, node IDs and
/// history are gone, the registrations and holdings stay (the agents assert theirs again), so
/// each node's held ranges are blocked, granted to nobody. A new leader rebuilds and grants
/// every node again, around the blocked ranges.
async fn grants_lost(kv: &MemKv, keys: &Keys, nodes: usize) {
    let mut deletes = Vec::new();
    for prefix in [
        keys.grants_prefix(),
        keys.all_owned_prefix(),
        keys.node_ids_prefix(),
        keys.history_prefix(),
    ] {
        let (entries, _) = corral_kv::read_all(kv, prefix.as_bytes(), 5000)
            .await
            .unwrap();
        deletes.extend(entries.into_iter().map(|e| TxnOp::delete(e.key)));
    }
    write_in_batches(kv, deletes).await;
    let started = Instant::now();
    let replica = start(kv, "op-restored");
    wait_leading(&replica).await;
    let (stats, took) = replica.shared.last_rebuild().expect("a rebuild");
    let grants = keys.grants_prefix();
    while count(kv, &grants).await < 2 * nodes as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "every grant lost, every range held: rebuild {:.0} ms ({} keys), every node granted again {:.2} s after the replica started",
        took.as_secs_f64() * 1e3,
        stats.keys,
        started.elapsed().as_secs_f64()
    );
    let _ = replica.stop.send(());
    replica.task.await.unwrap();
}
