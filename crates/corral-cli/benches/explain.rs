//! `corral explain` on a 1,000-node cluster (issue 23): etcd (one member on 127.0.0.1, fsync
//! on), 1,000 registered nodes granted dual-stack node CIDRs by an operator in this process
//! (5,000 keys: registrations, grants, owned keys), then `corral explain node NAME --etcd`
//! run as a process, as a person would: wall time per run (it reads the whole cluster at one
//! revision and the election keys, then walks the links), median and worst of 20.
//!
//! `cargo bench -p corral-cli --bench explain`; figures go to BENCHMARKS.md by hand.

use std::process::Command;
use std::time::{Duration, Instant};

use corral_cluster::Keys;
use corral_etcd::EtcdKv;
use corral_kv::{Kv, Txn, TxnOp};

mod operator;

use operator::{InProcess, install_config, node_record, percentile, runtime_and_etcd};

const NODES: usize = 1_000;
const RUNS: usize = 20;
const CONFIG: &str = include_str!("../tests/configs/bench_cluster.toml");

fn main() {
    let (runtime, etcd) = runtime_and_etcd(1, &[]);
    let endpoints = etcd.endpoints();
    let operator = runtime.block_on(async {
        let kv = EtcdKv::connect(&endpoints, Default::default())
            .await
            .unwrap();
        let keys = Keys::new(corral_cluster::ClusterName::new("bench").unwrap());
        install_config(&kv, &keys, CONFIG).await;
        for chunk in (0..NODES).collect::<Vec<_>>().chunks(100) {
            let mut txn = Txn::default();
            for i in chunk {
                let node = corral_cluster::NodeName::new(&format!("node-{i:05}")).unwrap();
                txn.success.push(TxnOp::put(
                    keys.node(&node),
                    node_record(format!("uid-{i}")),
                ));
            }
            kv.txn(txn).await.unwrap();
        }
        let operator = InProcess::start(&endpoints, "bench", 16, corral_kv::MAX_TXN_OPS).await;
        while (operator.shared.granted() as usize) < NODES {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        operator
    });
    let etcd_arg = endpoints.join(",");
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["explain", "node", "node-00500", "--etcd", &etcd_arg])
            .args(["--cluster", "bench"])
            .output()
            .unwrap();
        samples.push(started.elapsed());
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    samples.sort();
    println!(
        "the operator granted {NODES} nodes in {} etcd requests",
        operator.counted.requests()
    );
    println!(
        "explain node on {NODES} nodes ({} keys): median {:.1} ms, worst {:.1} ms of {RUNS} runs \
         (a process each: start, read, walk, print)",
        NODES * 5,
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
    );
    runtime.block_on(operator.stop());
}
