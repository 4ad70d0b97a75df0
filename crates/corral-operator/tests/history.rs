//! The grants' history on `MemKv`, in-process, on tokio's paused clock: a grant carries its
//! start (`granted_ms`), its end is recorded in the fenced transaction that deletes it with the
//! right `why` (a block released by the handshake, a node removed), a deposed leader records
//! nothing, the leader trims the history to its bounds, a rebuild reads past it, and the readers (`history::read`, the
//! API's `GET /v1/history`) answer who held an address or a CIDR, at a time, and what a node
//! held. Times are the wall clock's milliseconds: the tests compare them with each other, never
//! with a bound.

use crate::common;

use std::time::Duration;

use common::*;
use corral_cluster::history::HistoryEvent;
use corral_cluster::{
    ClusterConfig, Family, GrantEnd, GrantRecord, HistoryRecord, IpNet, PoolName, ReleaseState,
    decode_value,
};
use corral_kv::{Kv, MemKv, TxnOp};
use corral_operator::election::Fence;
use corral_operator::history::{HistoryQuery, HistoryRequest, read};

const BLOCKS: &str = include_str!("configs/blocks.toml");

/// Every history record under one index (`at`, `cidr`, `node`), decoded.
async fn records(kv: &MemKv, index: &str) -> Vec<HistoryRecord> {
    under(kv, &format!("history/{index}/"))
        .await
        .iter()
        .map(|e| decode_value::<HistoryRecord>(&e.value).unwrap())
        .collect()
}

/// The three indexes hold the same records (each once).
async fn assert_indexes_agree(kv: &MemKv) -> Vec<HistoryRecord> {
    let at = records(kv, "at").await;
    let key = |r: &HistoryRecord| (r.to_ms, r.pool.clone(), r.cidr, r.node.clone());
    for index in ["cidr", "node"] {
        let mut other = records(kv, index).await;
        other.sort_by_key(key);
        let mut sorted = at.clone();
        sorted.sort_by_key(key);
        assert_eq!(other, sorted, "history/{index}/ differs from history/at/");
    }
    at
}

/// The stored configuration.
async fn config_of(kv: &MemKv) -> ClusterConfig {
    let entry = kv.get(keys().config().as_bytes()).await.unwrap().unwrap();
    serde_json::from_slice(&entry.value).unwrap()
}

async fn history(kv: &MemKv, query: HistoryQuery, at_ms: Option<u64>) -> Vec<HistoryEvent> {
    let request = HistoryRequest {
        query,
        at_ms,
        limit: 100,
    };
    read(kv, &keys(), &config_of(kv).await, &request, u64::MAX / 2)
        .await
        .unwrap()
}

/// The agent's answer to a mark: `ready` (CAS on the release key).
async fn surrender(kv: &MemKv, name: &str, block: &str) {
    let answered = answer_release(kv, name, block, |record| {
        record.state = ReleaseState::Ready;
        record.answered_ms = 1;
    })
    .await;
    assert_eq!(answered, Some(true), "{block}");
}

async fn grant_of(kv: &MemKv, pool: &str, family: Family, cidr: &str) -> Option<GrantRecord> {
    let key = keys().grant(&PoolName::new(pool).unwrap(), family, &net(cidr));
    let entry = kv.get(key.as_bytes()).await.unwrap()?;
    Some(decode_value(&entry.value).unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_block_released_by_the_handshake_is_recorded_and_read_back_by_address_node_and_time() {
    let (kv, auditor) = audited(BLOCKS).await;
    let _a = start_leading(&kv, "op-a").await;
    register(&kv, "n1").await;
    // 20 addresses needed: two blocks (10.64.0.16/28, 10.64.0.32/28), each stamped.
    demand(&kv, "n1", 20, 0, 0, &[]).await;
    wait_until("two blocks", Duration::from_secs(10), || async {
        grants(&kv).await.get("n1").is_some_and(|g| g.len() == 2)
    })
    .await;
    let granted = grant_of(&kv, "pods", Family::V4, "10.64.0.32/28")
        .await
        .unwrap()
        .granted_ms
        .expect("a grant names its start");
    assert!(under(&kv, "history/").await.is_empty(), "nothing ended yet");
    // The agent needs one block: the other is marked after the release delay, surrendered.
    demand(&kv, "n1", 2, 26, 0, &["10.64.0.32/28"]).await;
    wait_until("marked", Duration::from_secs(15), || async {
        !under(&kv, "release/n1/").await.is_empty()
    })
    .await;
    surrender(&kv, "n1", "10.64.0.32/28").await;
    wait_until("released", Duration::from_secs(5), || async {
        grant_of(&kv, "pods", Family::V4, "10.64.0.32/28")
            .await
            .is_none()
    })
    .await;
    let recorded = assert_indexes_agree(&kv).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let event = &recorded[0];
    assert_eq!(
        (
            event.pool.as_str(),
            event.cidr,
            event.node.as_str(),
            event.why
        ),
        ("pods", net("10.64.0.32/28"), "n1", GrantEnd::Released)
    );
    assert_eq!(event.from_ms, Some(granted));
    assert!(event.to_ms >= granted);
    // Read back: by an address in the block, by the node, at a time after the end.
    let by_address = history(
        &kv,
        HistoryQuery::Address("10.64.0.40".parse().unwrap()),
        None,
    )
    .await;
    assert_eq!(by_address, [HistoryEvent::ended(event.clone())]);
    let mut by_node = history(&kv, HistoryQuery::Node(node("n1")), None).await;
    assert_eq!(
        by_node.len(),
        2,
        "the block held and the one released: {by_node:?}"
    );
    by_node.sort_by_key(|e| e.cidr);
    assert_eq!(
        (by_node[0].cidr, by_node[0].to_ms),
        (net("10.64.0.16/28"), None)
    );
    assert_eq!(by_node[1], HistoryEvent::ended(event.clone()));
    let after = history(
        &kv,
        HistoryQuery::Address("10.64.0.40".parse().unwrap()),
        Some(event.to_ms),
    )
    .await;
    assert!(after.is_empty(), "nobody held it after its end: {after:?}");
    // `corral cluster check` is content with the history beside the grants.
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_removed_node_s_grants_end_as_node_removed_and_the_next_holder_is_named_at_its_time() {
    let (kv, auditor) = audited(include_str!("configs/tiny.toml")).await;
    let _a = start_leading(&kv, "op-a").await;
    // tiny.toml: 10.9.0.0/29 in /30 node CIDRs, quarantine 3 s: two nodes fill it.
    let a = register(&kv, "node-a").await;
    register(&kv, "node-b").await;
    wait_until("both served", Duration::from_secs(10), || async {
        grants(&kv).await.len() == 2
    })
    .await;
    let held = grants(&kv).await["node-a"].clone();
    assert_eq!(held, ["default/ipv4/10.9.0.0-30"]);
    request_removal(&kv, "node-a", a).await;
    wait_until("node-a removed", Duration::from_secs(5), || async {
        registration(&kv, "node-a").await.is_none()
    })
    .await;
    let recorded = assert_indexes_agree(&kv).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(
        (recorded[0].cidr, recorded[0].node.as_str(), recorded[0].why),
        (net("10.9.0.0/30"), "node-a", GrantEnd::NodeRemoved)
    );
    assert!(recorded[0].from_ms.is_some());
    // After the quarantine the space goes to node-c.
    register(&kv, "node-c").await;
    wait_until("node-c served", Duration::from_secs(15), || async {
        grants(&kv).await.contains_key("node-c")
    })
    .await;
    let c = grant_of(&kv, "default", Family::V4, "10.9.0.0/30")
        .await
        .unwrap();
    assert_eq!(c.node.as_str(), "node-c");
    let t2 = c.granted_ms.unwrap();
    assert!(t2 >= recorded[0].to_ms);
    let x = HistoryQuery::Address("10.9.0.1".parse().unwrap());
    let all = history(&kv, x.clone(), None).await;
    let names: Vec<&str> = all.iter().map(|e| e.node.as_str()).collect();
    assert_eq!(names, ["node-c", "node-a"], "newest first");
    let then = history(&kv, x.clone(), Some(t2)).await;
    assert_eq!(then.len(), 1);
    assert_eq!(then[0].node.as_str(), "node-c");
    // By CIDR, the same answer.
    assert_eq!(
        history(&kv, HistoryQuery::Cidr(net("10.9.0.0/30")), None).await,
        all
    );
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_records_nothing_and_the_next_records_each_end_once() {
    let (kv, auditor) = audited(DUAL).await;
    let a = start_leading(&kv, "op-a").await;
    let b = Replica::start(&kv, "op-b");
    let revision = register_served(&kv, "node-1").await;
    register_served(&kv, "node-2").await;
    // The removal is asked for while op-a's lease is revoked under it: whatever it still
    // tries is fenced; op-b removes the node.
    let (name, lease, key, key_revision) = leader_key(&kv).await.unwrap();
    assert_eq!(name, "op-a");
    kv.lease_revoke(lease).await.unwrap();
    request_removal(&kv, "node-1", revision).await;
    wait_until("op-b leads", TTL * 3, || async { b.leading() }).await;
    wait_until("node-1 removed", Duration::from_secs(10), || async {
        registration(&kv, "node-1").await.is_none()
    })
    .await;
    let recorded = assert_indexes_agree(&kv).await;
    let mut ended: Vec<(IpNet, GrantEnd)> = recorded.iter().map(|r| (r.cidr, r.why)).collect();
    ended.sort();
    assert_eq!(
        ended,
        [
            (net("10.192.1.0/24"), GrantEnd::NodeRemoved),
            (net("fd00:200::/64"), GrantEnd::NodeRemoved),
        ],
        "one record per grant ended"
    );
    // A trim behind op-a's dead fence deletes nothing.
    let fence = Fence {
        key,
        revision: key_revision,
    };
    let bounds = corral_cluster::history::Bounds {
        max_events: 0,
        max_age_ms: 1,
    };
    let trimmed = corral_operator::trim_history(&kv, &keys(), &fence, bounds, u64::MAX / 2).await;
    assert!(
        matches!(trimmed, Err(corral_operator::TrimError::Refused)),
        "{trimmed:?}"
    );
    assert_eq!(records(&kv, "at").await.len(), 2);
    drop(a);
    assert_clean_end(&kv, &auditor).await;
}

#[tokio::test(start_paused = true)]
async fn the_leader_trims_the_oldest_events_past_its_bounds_off_the_grant_path() {
    let toml = format!(
        "history_max_events = 2\n{}",
        include_str!("configs/tiny.toml")
    );
    let kv = initialized(&toml).await;
    assert_eq!(config_of(&kv).await.history.max_events, 2);
    let _a = start_leading(&kv, "op-a").await;
    // Five events, as leaders before wrote them (the newest, 5, is a second old).
    let now = corral_operator::system_clock()();
    for i in 1..=5u64 {
        let record = HistoryRecord {
            pool: PoolName::new("default").unwrap(),
            cidr: net(&format!("10.9.{i}.0/30")),
            node: node(&format!("old-{i}")),
            from_ms: None,
            to_ms: now - (6 - i) * 1000,
            why: GrantEnd::Released,
        };
        let ops = corral_cluster::history::puts(&keys(), &record)
            .unwrap()
            .into_iter()
            .map(|(k, v)| TxnOp::put(k, v))
            .collect();
        apply(&kv, ops).await;
    }
    assert_eq!(records(&kv, "at").await.len(), 5);
    // The next trim (every 10 minutes) keeps the newest two, in all three indexes.
    wait_until(
        "trimmed to two",
        corral_operator::HISTORY_TRIM_EVERY + Duration::from_secs(5),
        || async { records(&kv, "at").await.len() == 2 },
    )
    .await;
    let kept = assert_indexes_agree(&kv).await;
    let names: Vec<&str> = kept.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(names, ["old-4", "old-5"]);
    assert_consistent(&kv).await;
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_s_rebuild_reads_past_the_history_and_a_long_one_stays_out_of_the_view() {
    let kv = initialized(include_str!("configs/tiny.toml")).await;
    // 3,000 ended grants (9,000 keys): more than a page of the rebuild's read.
    for chunk in 0..75u64 {
        let mut ops = Vec::new();
        for i in 0..40u64 {
            let n = chunk * 40 + i;
            let record = HistoryRecord {
                pool: PoolName::new("default").unwrap(),
                cidr: net(&format!("10.9.{}.{}/30", n / 64, n % 64 * 4)),
                node: node(&format!("old-{n}")),
                from_ms: Some(1),
                to_ms: 1_000 + n,
                why: GrantEnd::Released,
            };
            ops.extend(
                corral_cluster::history::puts(&keys(), &record)
                    .unwrap()
                    .into_iter()
                    .map(|(k, v)| TxnOp::put(k, v)),
            );
        }
        apply(&kv, ops).await;
    }
    register(&kv, "node-a").await;
    let a = start_leading(&kv, "op-a").await;
    let (read, _) = a.shared.last_rebuild().unwrap();
    assert!(
        read.keys < 3_000 && read.walked < 3_000,
        "the rebuild read {read:?}: the history's 9,000 keys too"
    );
    wait_until("node-a served", Duration::from_secs(10), || async {
        grants(&kv).await.contains_key("node-a")
    })
    .await;
    assert_consistent(&kv).await;
}
