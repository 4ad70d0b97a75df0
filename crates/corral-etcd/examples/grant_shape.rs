//! What a grant transaction's shape costs a real 3-member etcd: `N` nodes (default 30,000)
//! granted two CIDRs each, `BATCHES` nodes a transaction (a list; default 16) and `IN_FLIGHT`
//! transactions in flight (default 16), each of the `SHAPES` (a list; default all) twice,
//! alternating; nodes/s per shape. `ETCD_ARGS` passes flags to etcd (e.g. `--max-txn-ops 512`
//! for batches past etcd's 128 operations).
//!
//! ```sh
//! SHAPES=PoolPrefix BATCHES=21,42 IN_FLIGHT=64 ETCD_ARGS="--max-txn-ops 512" \
//!     cargo run --release -p corral-etcd --features testing --example grant_shape
//! ```

use std::time::Instant;

mod common;

use corral_kv::{Compare, Kv, Txn, TxnOp};

const REGISTER: usize = 100;

#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Today: registration compare; per CIDR grant and quarantine absent, owned prefix
    /// empty; puts grant and owned.
    Today,
    /// One owned prefix compare for the pool (both families).
    PoolPrefix,
    /// No owned key: registration, grant and quarantine compares; grant puts.
    NoOwned,
    /// Puts only (grant and owned).
    PutsOnly,
    /// One owned key per node and pool holding both CIDRs.
    OneOwned,
}

fn txn(
    shape: Shape,
    round: usize,
    nodes: std::ops::Range<usize>,
    value: &[u8],
    registered: &[i64],
) -> Txn {
    let mut txn = Txn::default();
    txn.compares
        .push(Compare::absent(format!("/c/{round}/config")));
    txn.compares
        .push(Compare::absent(format!("/c/{round}/fence")));
    for n in nodes {
        let node = format!("node-{n:06}");
        let grants = [
            format!(
                "/c/{round}/grants/default/ipv4/10.{}.{}.0-26",
                n / 256,
                n % 256
            ),
            format!("/c/{round}/grants/default/ipv6/fd00:{n:x}::-80"),
        ];
        let owned = [
            format!(
                "/c/{round}/owned/{node}/default/ipv4/10.{}.{}.0-26",
                n / 256,
                n % 256
            ),
            format!("/c/{round}/owned/{node}/default/ipv6/fd00:{n:x}::-80"),
        ];
        if !matches!(shape, Shape::PutsOnly) {
            txn.compares.push(Compare::created_at(
                format!("/c/nodes/{node}"),
                registered[n / REGISTER],
            ));
            for g in &grants {
                txn.compares.push(Compare::absent(g.clone()));
                txn.compares
                    .push(Compare::absent(g.replace("/grants/", "/quarantine/")));
            }
        }
        match shape {
            Shape::Today => {
                for family in ["ipv4", "ipv6"] {
                    txn.compares.push(Compare::prefix_empty(format!(
                        "/c/{round}/owned/{node}/default/{family}/"
                    )));
                }
            }
            Shape::PoolPrefix | Shape::OneOwned => txn.compares.push(Compare::prefix_empty(
                format!("/c/{round}/owned/{node}/default/"),
            )),
            Shape::NoOwned | Shape::PutsOnly => {}
        }
        for g in &grants {
            txn.success.push(TxnOp::put(g.clone(), value.to_vec()));
        }
        match shape {
            Shape::Today | Shape::PoolPrefix | Shape::PutsOnly => {
                for o in &owned {
                    txn.success
                        .push(TxnOp::put(o.clone(), b"{\"node_revision\":12345}".to_vec()));
                }
            }
            Shape::OneOwned => txn.success.push(TxnOp::put(
                format!("/c/{round}/owned/{node}/default/"),
                b"{\"node_revision\":12345,\"ipv4\":\"10.0.0.0/26\",\"ipv6\":\"fd00::/80\"}"
                    .to_vec(),
            )),
            Shape::NoOwned => {}
        }
    }
    txn
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = common::env_count("N", 30_000);
    let (_etcd, kv) = common::three_members().await;
    let mut registered = Vec::new();
    let registration = vec![b'r'; 200];
    for chunk in 0..n.div_ceil(REGISTER) {
        let success = (chunk * REGISTER..((chunk + 1) * REGISTER).min(n))
            .map(|i| TxnOp::put(format!("/c/nodes/node-{i:06}"), registration.clone()))
            .collect();
        let response = kv
            .txn(Txn {
                success,
                ..Txn::default()
            })
            .await
            .unwrap();
        registered.push(response.revision);
    }
    let registered = std::sync::Arc::new(registered);
    let value = br#"{"node":"node-000123","uid":"6b1f0c2e-3c1d-4f5e-9a7b-1234567890ab","node_revision":123456,"granted_ms":1764500000000}"#;
    let shapes = [
        Shape::Today,
        Shape::PoolPrefix,
        Shape::NoOwned,
        Shape::PutsOnly,
        Shape::OneOwned,
    ];
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let only = std::env::var("SHAPES").unwrap_or_default();
    let shapes: Vec<Shape> = shapes
        .into_iter()
        .filter(|s| only.is_empty() || only.split(',').any(|o| o == format!("{s:?}")))
        .collect();
    let batches: Vec<usize> = std::env::var("BATCHES")
        .unwrap_or_else(|_| "16".into())
        .split(',')
        .map(|b| b.parse().expect("a number"))
        .collect();
    let in_flight = env("IN_FLIGHT", 16);
    let combos: Vec<(Shape, usize)> = shapes
        .iter()
        .flat_map(|s| batches.iter().map(move |b| (*s, *b)))
        .collect();
    for round in 0..combos.len() * 2 {
        let (shape, batch_nodes) = combos[round % combos.len()];
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for batch in 0..n.div_ceil(batch_nodes) {
            let t = txn(
                shape,
                round,
                batch * batch_nodes..((batch + 1) * batch_nodes).min(n),
                value,
                &registered,
            );
            let kv = kv.clone();
            tasks.spawn(async move { assert!(kv.txn(t).await.unwrap().succeeded) });
            while tasks.len() >= in_flight {
                tasks.join_next().await.unwrap().unwrap();
            }
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        let s = started.elapsed().as_secs_f64();
        println!(
            "{shape:?} x{batch_nodes} ({in_flight} in flight): {n} nodes in {s:.2} s, {:.0} nodes/s",
            n as f64 / s
        );
    }
}
