//! The raw transaction rate of a local 3-member etcd (fsync on): sequential and 32 concurrent
//! create-if-absent txns on distinct keys, and 32 tasks compare-and-swapping one key; with the
//! mean WAL fsync time. `cargo run --release -p corral-etcd --features testing --example raw_rate [seconds]`

use std::time::Duration;

use corral_etcd::EtcdOptions;
use corral_etcd::testing::{EtcdCluster, Workload, raw_txn_rate};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(10);
    let duration = Duration::from_secs(seconds);
    let cluster = EtcdCluster::start(3).await?;
    let kv = cluster.client(EtcdOptions::default()).await?;
    println!(
        "etcd: {} members on 127.0.0.1, {seconds} s per run",
        cluster.len()
    );
    for (name, workload, concurrency) in [
        ("sequential, distinct keys", Workload::DistinctKeys, 1),
        ("concurrent, distinct keys", Workload::DistinctKeys, 32),
        ("one key, compare-and-swap", Workload::OneKeyCas, 32),
    ] {
        let before = cluster.wal_fsyncs(0)?;
        let requests = kv.requests();
        let report = raw_txn_rate(
            &kv,
            &format!("/rate/{concurrency}/{name}"),
            workload,
            concurrency,
            duration,
        )
        .await;
        let after = cluster.wal_fsyncs(0)?;
        let fsyncs = after.count - before.count;
        println!(
            "{name:<28} {report}; {:.2} requests per success; member 0: {fsyncs:.0} WAL fsyncs, mean {:.2} ms",
            (kv.requests() - requests) as f64 / report.successes.max(1) as f64,
            after.mean_since(&before).unwrap_or_default().as_secs_f64() * 1e3
        );
    }
    Ok(())
}
