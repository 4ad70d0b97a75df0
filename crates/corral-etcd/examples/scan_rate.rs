//! What a whole-prefix read costs on a real 3-member etcd, next to the best any bounded
//! paging can do: `N` keys (default 300,000; `/p/k/NNNNNNNN`, 150-byte values) written, then
//! three reads with `corral_kv::Scan` (page 2,000) and three with ranges cut exactly at every
//! 2,000th key (each walked once: what an oracle of the keys would ask), alternating.
//!
//! ```sh
//! cargo run --release -p corral-etcd --features testing --example scan_rate
//! ```

use std::time::Instant;

mod common;

use corral_kv::{Kv, Scan, Txn, TxnOp};

const PAGE: usize = 2000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = common::env_count("N", 300_000);
    let (_etcd, kv) = common::three_members().await;
    let value = vec![b'x'; 150];
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in 0..n.div_ceil(100) {
        let (kv, value) = (kv.clone(), value.clone());
        tasks.spawn(async move {
            let success = (chunk * 100..((chunk + 1) * 100).min(n))
                .map(|i| TxnOp::put(format!("/p/k/{i:08}"), value.clone()))
                .collect();
            kv.txn(Txn {
                success,
                ..Txn::default()
            })
            .await
            .unwrap();
        });
        while tasks.len() >= 16 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}
    let revision = kv
        .range_span(b"/p/", b"/p0", 1, None)
        .await
        .unwrap()
        .revision;
    println!("{n} keys written");
    for round in 0..6 {
        let started = Instant::now();
        let (what, keys, requests, walked) = if round % 2 == 0 {
            let mut scan = Scan::new(b"/p/", PAGE).at(revision);
            while scan.next(&kv).await.unwrap().is_some() {}
            let stats = scan.stats();
            ("Scan ", stats.keys, stats.requests, stats.walked)
        } else {
            let (mut keys, mut requests, mut walked) = (0, 0, 0);
            for i in 0..n.div_ceil(PAGE) {
                let start = format!("/p/k/{:08}", i * PAGE);
                let end = format!("/p/k/{:08}", (i + 1) * PAGE);
                let page = kv
                    .range_span(start.as_bytes(), end.as_bytes(), PAGE, Some(revision))
                    .await
                    .unwrap();
                keys += page.kvs.len() as u64;
                requests += 1;
                walked += page.count;
            }
            ("exact", keys, requests, walked)
        };
        println!(
            "{what}: {keys} keys in {:.0} ms, {requests} requests, {walked} keys walked",
            started.elapsed().as_secs_f64() * 1e3
        );
    }
}
