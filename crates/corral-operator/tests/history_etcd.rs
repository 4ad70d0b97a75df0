//! The newest events of the grants' history (`GET /v1/history` with no filter: the
//! dashboard's "recent", polled every 2 s) on real etcd, counting the client's requests: read
//! with the grants held from the leader's view, one request answers it whatever the number of
//! grants, where reading `grants/` takes a request per thousand grants. Also: etcd's backward
//! `range_last` answers what paging through the whole prefix answers.
//!
//! Needs Debian's etcd (`make deps`) and is ignored by a plain `cargo test`.

use crate::common;

use corral_cluster::history::{HistoryEvent, newest_first};
use corral_cluster::{
    ClusterConfig, ClusterName, Family, GrantEnd, GrantRecord, HistoryRecord, IpNet, Keys,
    NodeName, PoolName, encode_value,
};
use corral_kv::{Kv, TxnOp};
use corral_operator::history::{HistoryQuery, HistoryRequest, read, read_with_held};

const BLOCKS: &str = include_str!("configs/blocks.toml");

/// Grants held in pool `pods` (10.64.0.0/16 in /28 blocks).
const GRANTS: u32 = 2500;
/// Ended grants in the history.
const ENDED: u32 = 30;

/// Writes `puts` in transactions of 100 (etcd's default limit of operations is 128).
async fn put_all(kv: &impl Kv, puts: Vec<(String, Vec<u8>)>) {
    for chunk in puts.chunks(100) {
        let ops = chunk.iter().map(|(k, v)| TxnOp::put(k.clone(), v.clone()));
        common::apply(kv, ops.collect()).await;
    }
}

fn block(i: u32) -> IpNet {
    let base = u32::from(std::net::Ipv4Addr::new(10, 64, 0, 16));
    IpNet::new(std::net::Ipv4Addr::from(base + i * 16).into(), 28).unwrap()
}

#[test]
#[ignore = "needs etcd (make deps)"]
fn the_newest_events_read_the_held_grants_from_the_view_in_one_request() {
    let (runtime, _etcd, kv) = common::etcd_runtime();
    let keys = Keys::new(ClusterName::new("t").unwrap());
    let config = ClusterConfig::from_toml(BLOCKS).unwrap();
    let pool = PoolName::new("pods").unwrap();
    let mut held = Vec::new();
    let mut puts = Vec::new();
    for i in 0..GRANTS {
        let grant = GrantRecord {
            node: NodeName::new(&format!("node-{}", i % 100)).unwrap(),
            uid: "u".into(),
            node_revision: 1,
            granted_ms: Some(1_000 + u64::from(i)),
        };
        puts.push((
            keys.grant(&pool, Family::V4, &block(i)),
            encode_value(&grant).unwrap(),
        ));
        held.push(HistoryEvent::held(&pool, &block(i), &grant));
    }
    for i in 0..ENDED {
        let record = HistoryRecord {
            pool: pool.clone(),
            cidr: block(GRANTS + i),
            node: NodeName::new("node-gone").unwrap(),
            from_ms: Some(500),
            to_ms: 10_000 + u64::from(i),
            why: GrantEnd::NodeRemoved,
        };
        puts.extend(corral_cluster::history::puts(&keys, &record).unwrap());
    }
    runtime.block_on(put_all(&kv, puts));
    let request = HistoryRequest {
        query: HistoryQuery::Newest,
        at_ms: None,
        limit: 100,
    };
    let now_ms = 20_000;

    // Reading `grants/`: a request per thousand grants, and more for the history's windows.
    let before = kv.requests();
    let from_etcd = runtime
        .block_on(read(&kv, &keys, &config, &request, now_ms))
        .unwrap();
    let etcd_requests = kv.requests() - before;
    assert!(etcd_requests > 3, "{etcd_requests}");
    assert_eq!(from_etcd.len(), 100);
    // The ended ones are the newest, then the newest grants held.
    assert!(
        from_etcd[..ENDED as usize]
            .iter()
            .all(|e| e.to_ms.is_some())
    );
    assert_eq!(
        from_etcd[ENDED as usize].from_ms,
        Some(1_000 + u64::from(GRANTS) - 1)
    );

    // With the grants held from the view (as `ClusterView::held_events` gives them): one
    // request, the same answer.
    newest_first(&mut held, request.limit);
    let before = kv.requests();
    let from_view = runtime
        .block_on(read_with_held(
            &kv,
            &keys,
            &config,
            &request,
            now_ms,
            Some(held),
        ))
        .unwrap();
    assert_eq!(kv.requests() - before, 1);
    assert_eq!(from_view, from_etcd);

    // etcd's backward read is the tail of the forward one.
    let prefix = keys.history_at_prefix();
    let (all, _) = runtime
        .block_on(corral_kv::read_all(&kv, prefix.as_bytes(), 7))
        .unwrap();
    assert_eq!(all.len(), ENDED as usize);
    let before = kv.requests();
    let last = runtime
        .block_on(kv.range_last(prefix.as_bytes(), 10))
        .unwrap();
    assert_eq!(kv.requests() - before, 1);
    let keys_of =
        |kvs: &[corral_kv::KeyValue]| kvs.iter().map(|e| e.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys_of(&last), keys_of(&all[all.len() - 10..]));
    let mem = corral_kv::MemKv::new();
    runtime.block_on(put_all(
        &mem,
        all.iter()
            .map(|e| (e.key_str().into_owned(), e.value.clone()))
            .collect(),
    ));
    let from_mem = runtime
        .block_on(mem.range_last(prefix.as_bytes(), 10))
        .unwrap();
    assert_eq!(keys_of(&from_mem), keys_of(&last));
}
