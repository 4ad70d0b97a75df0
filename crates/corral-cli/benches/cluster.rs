//! `make bench-cluster`: the operator on a local three-member etcd (real processes, real
//! fsync), beside the raw etcd transaction rate measured in the same run:
//! - dual-stack CIDR grants for 10,000 registered nodes (`BENCH_NODES`): wall time, grants/s,
//!   p50/p99 per grant transaction, etcd requests per grant (the operator runs in this
//!   process, on the counting etcd client);
//! - leader failover with those nodes: two `corral operator` processes, the leader
//!   SIGKILLed, then a node registered: time until the new leader granted it;
//! - `corral cluster check` of them all (exit code, time);
//! - rebuilding the operator's state from their grants: time, range requests and keys etcd
//!   walked (the standby's own report), its peak RSS, and etcd's database size.
//!
//! The agents' assertions are on (issue 20): as each grant lands, a task playing the
//! agents puts the node's `holdings/<node>` record naming it (batched, as agents' own writes
//! would reach etcd), so the leader grants while it reads and counts the holdings.
//! `BENCH_ASSERTIONS=0` leaves the stand-in out, to tell the operator's share of their cost
//! from etcd's.
//!
//! The size is `BENCH_NODES` (default 10,000; `make bench-cluster NODES=100000`); the pool's
//! IPv4 side gives /26s of 10.0.0.0/8 (262,144 of them), enough for any size asked.
//! `BENCH_WORKERS` sets the in-process leader's grant transactions in flight (the
//! operator's default, 64, otherwise); `BENCH_MAX_TXN_OPS` the operations a transaction may
//! hold, etcd's `--max-txn-ops` and the operators' alike (etcd's default, 128, otherwise).
//!
//! Figures go to BENCHMARKS.md by hand, with the command.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_cluster::{Keys, encode_value};
use corral_etcd::EtcdKv;
use corral_etcd::testing::{EtcdCluster, Workload, etcd_binary, raw_txn_rate};
use corral_kv::{Kv, Txn, TxnOp};

mod knobs;
mod operator;

use operator::{InProcess, install_config, node_record, percentile, runtime_and_etcd};

/// Nodes registered (`BENCH_NODES`; default 10,000).
fn nodes() -> usize {
    std::env::var("BENCH_NODES")
        .ok()
        .and_then(|n| n.replace('_', "").parse().ok())
        .unwrap_or(10_000)
}
/// Grant transactions in flight in the in-process leader (`BENCH_WORKERS`; the operator's
/// default otherwise).
fn workers() -> usize {
    knobs::env(
        "BENCH_WORKERS",
        corral_operator::OperatorConfig::DEFAULT_WORKERS,
    )
}
/// Operations a transaction may hold, in etcd and the operators (`BENCH_MAX_TXN_OPS`; etcd's
/// default otherwise).
fn max_txn_ops() -> usize {
    knobs::env("BENCH_MAX_TXN_OPS", corral_kv::MAX_TXN_OPS)
}
const CONFIG: &str = include_str!("../tests/configs/bench_cluster.toml");

fn main() {
    let ops = max_txn_ops();
    let (runtime, etcd) = runtime_and_etcd(3, &["--max-txn-ops", &ops.to_string()]);
    runtime.block_on(bench(&etcd, ops));
}

/// The bench on `etcd`, whose members take transactions of `max_txn_ops` operations.
async fn bench(etcd: &EtcdCluster, max_txn_ops: usize) {
    let nodes = nodes();
    let endpoints = etcd.endpoints();
    let kv = EtcdKv::connect(&endpoints, Default::default())
        .await
        .unwrap();
    let version = etcd_binary()
        .map(|binary| corral_etcd::testing::version_of(&binary))
        .unwrap_or_default();
    println!(
        "rig: {version} (3 members on 127.0.0.1, fsync on), {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // The raw rate first, in the same run.
    let fsyncs_before = etcd.wal_fsyncs(0).ok();
    for (workload, concurrency) in [
        (Workload::DistinctKeys, 1),
        (Workload::DistinctKeys, 32),
        (Workload::OneKeyCas, 32),
    ] {
        let report = raw_txn_rate(
            &kv,
            "/bench-raw",
            workload,
            concurrency,
            Duration::from_secs(3),
        )
        .await;
        println!("raw etcd txn, {workload:?}: {report}");
    }
    if let (Some(before), Ok(after)) = (fsyncs_before, etcd.wal_fsyncs(0))
        && let Some(mean) = after.mean_since(&before)
    {
        println!(
            "etcd WAL fsync mean during the raw runs: {:.3} ms",
            mean.as_secs_f64() * 1e3
        );
    }

    // The cluster and its registrations (100 per transaction, 16 at once).
    let keys = Keys::new(corral_cluster::ClusterName::new("bench").unwrap());
    install_config(&kv, &keys, CONFIG).await;
    register(&kv, &keys, 0..nodes).await;

    // The operator, in this process, on a client whose requests are counted.
    let operator = InProcess::start(&endpoints, "bench", workers(), max_txn_ops).await;
    let (counted, shared) = (&operator.counted, &operator.shared);
    let assert = std::env::var("BENCH_ASSERTIONS").as_deref() != Ok("0");
    let assertions = assert.then(|| tokio::spawn(assert_holdings(kv.clone(), keys.clone(), nodes)));
    let started = Instant::now();
    let requests_before = counted.requests();
    let mut led_at = None;
    let mut last = (0, Instant::now());
    loop {
        let granted = shared.granted() as usize;
        if led_at.is_none() && shared.leading() {
            led_at = Some(started.elapsed());
        }
        if granted >= nodes {
            break;
        }
        // A grant whose answer was lost (a timeout under load) is found by the rebuild that
        // follows, not counted as granted: once the count stands still for a second, the
        // view's count settles it (it walks every node under the view's lock, so not sooner).
        if granted != last.0 {
            last = (granted, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(1)
            && shared
                .with_view(|view, revision| view.status_report(revision, None).nodes_served)
                .is_some_and(|served| served >= nodes)
        {
            break;
        } else if last.1.elapsed() > Duration::from_secs(1) {
            last.1 = Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(300 + nodes as u64 / 100),
            "grants stalled at {granted}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let wall = started.elapsed();
    let requests = counted.requests() - requests_before;
    let rebuilds = shared.last_rebuild().map(|(cost, took)| (cost.keys, took));
    let mut samples = shared.txn_samples();
    samples.sort();
    let from_lead = wall - led_at.unwrap_or_default();
    println!(
        "grants: {nodes} dual-stack nodes in {:.2} s ({:.2} s after taking the lead: rebuild + grants), {:.0} nodes/s",
        wall.as_secs_f64(),
        from_lead.as_secs_f64(),
        nodes as f64 / from_lead.as_secs_f64()
    );
    println!(
        "grant txn latency: p50 {:.2} ms, p99 {:.2} ms ({} samples); etcd requests per grant: {:.2}; last rebuild (keys, time): {rebuilds:?}",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.len(),
        requests as f64 / nodes as f64
    );
    // What made the leader read everything again, if it did (a lost answer whose read-back
    // failed, a term ended): its problems, deduplicated.
    let mut reported = shared.reported();
    reported.sort();
    reported.dedup();
    println!(
        "full reads of the store (the lead's included): {}; problems raised: {}{}",
        shared.metrics.rebuilds.get(),
        reported.len(),
        reported
            .iter()
            .take(5)
            .map(|p| format!("\n  {p}"))
            .collect::<String>()
    );
    operator.stop().await;
    match assertions {
        Some(task) => println!(
            "holdings asserted by the agents' stand-in during the grants: {} nodes",
            task.await.unwrap_or(0)
        ),
        None => println!("holdings: none asserted (BENCH_ASSERTIONS=0)"),
    }

    // `corral cluster check` on every grant: the independent check of the promise, at this
    // size (the real CLI, reading the whole cluster).
    let binary = env!("CARGO_BIN_EXE_corral");
    let checked = Instant::now();
    let check = Command::new(binary)
        .args([
            "cluster",
            "check",
            "--etcd",
            &endpoints.join(","),
            "--cluster",
            "bench",
        ])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    println!(
        "cluster check: exit {} in {:.2} s: {}",
        check.status.code().unwrap_or(-1),
        checked.elapsed().as_secs_f64(),
        report.lines().last().unwrap_or("").trim()
    );

    // Failover: two operator processes; the leader killed; one node registered at once.
    let ttl = 10;
    let dir = tempfile::tempdir().unwrap();
    let spawn = |name: &str| {
        Command::new(binary)
            .args([
                "operator",
                "--etcd",
                &endpoints.join(","),
                "--cluster",
                "bench",
                "--replica",
                name,
            ])
            .args(["--lease-ttl", &ttl.to_string()])
            .args(["--max-txn-ops", &max_txn_ops.to_string()])
            .args([
                "--api-socket",
                dir.path().join(format!("{name}.sock")).to_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = spawn("op-a");
    wait_leader(&kv, &keys, "op-a").await;
    let mut second = spawn("op-b");
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.kill().unwrap();
    let killed = Instant::now();
    first.wait().unwrap();
    register(&kv, &keys, nodes..nodes + 1).await;
    let probe = keys.owned_prefix(&corral_cluster::NodeName::new(&node_name(nodes)).unwrap());
    loop {
        let page = kv.range(probe.as_bytes(), None, 10, None).await.unwrap();
        if page.kvs.len() == 2 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "failover stalled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "failover: SIGKILL of the leader to the new leader's first grant: {:.2} s (lease TTL {ttl} s)",
        killed.elapsed().as_secs_f64()
    );

    // The standby's rebuild from every grant (its own report) and its peak RSS.
    let status = corral_client_status(&dir.path().join("op-b.sock"));
    let rss = std::fs::read_to_string(format!("/proc/{}/status", second.id()))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .map(|l| {
            l.split_whitespace()
                .nth(1)
                .unwrap_or("0")
                .parse::<u64>()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    let rebuild = &status["last_rebuild"];
    println!(
        "rebuild: {} keys ({} grants) in {} ms, {} range requests, {} keys walked by etcd; the operator's peak RSS {:.1} MiB",
        rebuild["keys"],
        2 * (nodes + 1),
        rebuild["ms"],
        rebuild["requests"],
        rebuild["walked"],
        rss as f64 / 1024.0
    );
    let db_size = etcd
        .metrics(0)
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("etcd_mvcc_db_total_size_in_bytes "))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    println!("etcd db size: {:.1} MB", db_size / 1e6);
    let _ = second.kill();
    let _ = second.wait();
}

/// Plays the agents' holdings publishers: watches `owned/` and, for every node granted, puts
/// `holdings/<node>` naming its grants (up to 100 nodes per txn, as soon as they arrive) until
/// every node asserted; answers how many did.
async fn assert_holdings(kv: EtcdKv, keys: Keys, nodes: usize) -> usize {
    use std::collections::BTreeMap;
    let owned_prefix = format!("{}owned/", keys.prefix());
    let mut watch = kv.watch(owned_prefix.as_bytes(), 1).await.unwrap();
    let mut ranges: BTreeMap<String, Vec<corral_cluster::HeldRange>> = BTreeMap::new();
    let mut asserted = 0;
    while asserted < nodes {
        let Ok(batch) = watch.next().await else {
            break;
        };
        let mut due = Vec::new();
        for event in batch {
            let corral_kv::Event::Put(entry) = event else {
                continue;
            };
            let Ok(corral_cluster::Key::Owned {
                node, pool, cidr, ..
            }) = keys.parse(&entry.key_str())
            else {
                continue;
            };
            let held = ranges.entry(node.to_string()).or_default();
            held.push(corral_cluster::HeldRange {
                pool,
                cidr,
                draining: false,
                allocations: 0,
            });
            if held.len() == 2 {
                due.push(node);
            }
        }
        for chunk in due.chunks(100) {
            let mut txn = Txn::default();
            for node in chunk {
                let record = corral_cluster::HoldingsRecord {
                    // The registration's uid (`register`: node-NNNNNN has uid-N).
                    uid: format!(
                        "uid-{}",
                        node.as_str()
                            .trim_start_matches("node-")
                            .parse::<usize>()
                            .unwrap_or_default()
                    ),
                    ranges: ranges[node.as_str()].clone(),
                    ..Default::default()
                };
                txn.success.push(TxnOp::put(
                    keys.holdings(node),
                    encode_value(&record).unwrap(),
                ));
            }
            kv.txn(txn).await.unwrap();
            asserted += chunk.len();
        }
    }
    asserted
}

fn node_name(i: usize) -> String {
    format!("node-{i:06}")
}

async fn register(kv: &EtcdKv, keys: &Keys, nodes: std::ops::Range<usize>) {
    let batches: Vec<Vec<usize>> = nodes
        .collect::<Vec<_>>()
        .chunks(100)
        .map(<[usize]>::to_vec)
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for batch in batches {
        let kv = kv.clone();
        let keys = keys.clone();
        tasks.spawn(async move {
            let mut txn = Txn::default();
            for i in batch {
                let node = corral_cluster::NodeName::new(&node_name(i)).unwrap();
                let record = node_record(format!("uid-{i}"));
                txn.success.push(TxnOp::put(keys.node(&node), record));
            }
            kv.txn(txn).await.unwrap();
        });
        while tasks.len() >= 16 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
}

async fn wait_leader(kv: &EtcdKv, keys: &Keys, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (all, _) = corral_kv::read_all(kv, keys.election_prefix().as_bytes(), 100)
            .await
            .unwrap();
        if all
            .iter()
            .min_by_key(|k| k.create_revision)
            .is_some_and(|k| k.value == name.as_bytes())
        {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET /v1/status` of an operator's API socket, with a tiny HTTP/1.0 exchange.
fn corral_client_status(socket: &std::path::Path) -> serde_json::Value {
    use std::io::{Read, Write};
    for _ in 0..200 {
        if let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) {
            let _ = stream.write_all(b"GET /v1/status HTTP/1.0\r\nHost: corral\r\n\r\n");
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            if let Some((_, body)) = text.split_once("\r\n\r\n")
                && let Ok(value) = serde_json::from_str::<serde_json::Value>(body)
                && !value["last_rebuild"].is_null()
            {
                return value;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    serde_json::Value::Null
}
