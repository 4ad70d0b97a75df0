//! What a new leader's rebuild costs the store, counted rather than timed: range requests, and
//! keys the store walked to answer them (each range's `count`, which etcd walks to the range's
//! end). Paging with the range's end at the prefix's end walked, for a prefix of `n` keys,
//! about n²/(2·page): quadratic, 12 s of a rebuild at 100,000 nodes. The rebuild's ranges are
//! bounded to about a page per kind of key, so both counts grow with the keys read.
//!
//! On `MemKv`, whose `count` is what etcd's is (every key of the range at the revision); on
//! tokio's paused clock.

use crate::common;

use common::*;
use corral_kv::{MemKv, ScanStats, TxnOp};

/// The rebuild's page: smaller than the operator's default (10,000), so that these sizes
/// are many pages (quadratic paging shows at 20 pages, not at 4).
const PAGE: u64 = 2000;

/// A store holding `nodes` registrations named as EC2 names its instances (names of uneven
/// lengths, which sort unevenly), and as many history records: the first rebuild's cost.
async fn first_rebuild(nodes: usize) -> (ScanStats, u64) {
    let kv: MemKv = initialized(include_str!("configs/tiny.toml")).await;
    let names: Vec<String> = (0..nodes)
        .map(|i| {
            format!(
                "ip-10-{}-{}-{}.ec2.internal",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            )
        })
        .collect();
    for chunk in names.chunks(60) {
        let mut ops = Vec::new();
        for name in chunk {
            ops.push(TxnOp::put(keys().node(&node(name)), node_record(name)));
            // The grants' history, which the rebuild leaves out.
            ops.push(TxnOp::put(
                format!("{}history/node/{name}/x", keys().prefix()),
                b"{}".to_vec(),
            ));
        }
        apply(&kv, ops).await;
    }
    let replica =
        Replica::start_paged::<_, corral_cloud::FakeEc2>(&kv, "op-a", PAGE as usize, None);
    wait_leading(&replica, std::time::Duration::from_secs(5)).await;
    let (cost, _) = replica.shared.last_rebuild().expect("a rebuild");
    drop(replica);
    (cost, nodes as u64)
}

#[tokio::test(start_paused = true)]
async fn a_rebuild_walks_in_proportion_to_the_keys_it_reads() {
    let mut walked_per_key = Vec::new();
    for nodes in [10_000, 40_000] {
        let (cost, keys_read) = first_rebuild(nodes).await;
        // Every registration is read (and the configuration), none of the history.
        assert!(
            cost.keys >= keys_read && cost.keys < keys_read + 10,
            "{nodes} nodes: {cost:?}"
        );
        // The unbounded paging walked about n²/(2·page): 110,000 keys for 10,000 nodes'
        // registrations and their history, 1,640,000 for 40,000. Ranges sized by byte
        // arithmetic walked about 5 per key read at 40,000; sibling subtrees walk each kind
        // once (its first range), then 0.9 more per key read at 10,000 and 1.9 at 40,000.
        assert!(
            cost.walked <= 3 * cost.keys + 4 * PAGE,
            "{nodes} nodes: {cost:?}"
        );
        assert!(
            cost.requests <= 4 * cost.keys / PAGE + 60,
            "{nodes} nodes: {cost:?}"
        );
        eprintln!("{nodes} nodes: {cost:?}");
        walked_per_key.push(cost.walked as f64 / cost.keys as f64);
    }
    // Linear: four times the keys, at most about twice the walk per key (quadratic paging:
    // four times; these names of uneven decimals part a level deeper at 40,000).
    assert!(
        walked_per_key[1] <= walked_per_key[0] * 2.0,
        "walked per key read: {walked_per_key:?}"
    );
}
