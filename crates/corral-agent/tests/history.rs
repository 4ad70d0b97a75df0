//! The allocation history through the agent's API, on the paused clock (an in-memory agent,
//! its committer inline): every allocation and release is an event of the commit that made
//! it, with its kind (a lease running out is `expired`), owner, key and generation; `at`
//! answers who held an address at each instant; a lease rewritten is no event; bad filters
//! are a typed 400 that changes nothing.

use crate::common;

use std::time::Duration;

use common::paused::Api;
use corral_agent::testing::InMemoryAgent;
use corral_agent::{AgentConfig, config};
use corral_api::{
    AllocateRequest, AttachmentKey, ErrorCode, HistoryEvent, HistoryKind, LeaseStartRequest,
    ReleaseRequest,
};
use corral_client::Error;
use corral_store::{HistoryLimits, MemoryStore};

const ADDR: &str = "10.88.0.7";

async fn start() -> (InMemoryAgent, Api) {
    start_with(HistoryLimits::default()).await
}

async fn start_with(history: HistoryLimits) -> (InMemoryAgent, Api) {
    let config = AgentConfig {
        pools: config::pools(&config::default_pools()).unwrap(),
        history,
        ..common::paused::config()
    };
    let agent = InMemoryAgent::start(&config, MemoryStore::new(), None)
        .await
        .expect("the agent starts");
    let api = Api::of(&agent);
    (agent, api)
}

fn allocate(owner: &str, lease_ms: Option<u64>) -> AllocateRequest {
    AllocateRequest {
        scope: "node".into(),
        pool: "default".into(),
        family: None,
        address: Some(ADDR.parse().unwrap()),
        owner: owner.into(),
        key: Some(AttachmentKey {
            network: "podnet".into(),
            container_id: format!("c-{}", owner.replace('/', "-")),
            ifname: "eth0".into(),
        }),
        lease_ms,
    }
}

fn kinds(events: &[HistoryEvent]) -> Vec<(HistoryKind, &str)> {
    events.iter().map(|e| (e.event, e.owner.as_str())).collect()
}

async fn holder(api: &Api, at_ms: u64) -> Vec<String> {
    let response = api
        .history(&format!("address={ADDR}&at={at_ms}"))
        .await
        .unwrap();
    response
        .held
        .expect("held is answered with address and at")
        .into_iter()
        .map(|e| e.owner)
        .collect()
}

async fn bad_request(api: &Api, query: &str) -> String {
    match api.history(query).await {
        Err(Error::Api { status, error }) => {
            assert_eq!(status, 400, "{query}");
            assert_eq!(error.code, ErrorCode::BadRequest, "{query}");
            error.message
        }
        other => panic!("{query}: expected a 400, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn who_held_an_address_at_each_instant() {
    let (agent, api) = start().await;
    let first = api.allocate(&allocate("ns/a", None)).await.unwrap();
    let generation_a = first.allocations[0].generation;
    // A lease started and stopped rewrites the row: no event.
    api.lease_start(&LeaseStartRequest {
        scope: "node".into(),
        address: ADDR.parse().unwrap(),
        duration_ms: 3_600_000,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    api.release(&ReleaseRequest {
        scope: "node".into(),
        key: None,
        address: Some(ADDR.parse().unwrap()),
        generation: None,
        owner: None,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    // The same address to another owner, on a lease that runs out.
    api.allocate(&allocate("ns/b", Some(5_000))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;

    let all = api.history(&format!("address={ADDR}")).await.unwrap();
    assert_eq!(
        kinds(&all.events),
        [
            (HistoryKind::Expired, "ns/b"),
            (HistoryKind::Allocated, "ns/b"),
            (HistoryKind::Released, "ns/a"),
            (HistoryKind::Allocated, "ns/a"),
        ],
        "newest first, the lease rewrite recorded nothing"
    );
    assert!(all.held.is_none(), "held only with at");
    let oldest = &all.events[3];
    assert_eq!(oldest.generation, generation_a);
    assert_eq!(oldest.pool, "default");
    assert_eq!(oldest.scope, "node");
    assert_eq!(oldest.key.as_ref().unwrap().container_id, "c-ns-a");
    assert_eq!(oldest.at, corral_api::history::format_time(oldest.at_ms));
    let t0 = oldest.at_ms;
    assert_eq!(all.events[2].at_ms, t0 + 10_000);
    assert_eq!(all.events[1].at_ms, t0 + 20_000);

    assert!(holder(&api, t0 - 1).await.is_empty(), "nobody before");
    assert_eq!(holder(&api, t0).await, ["ns/a"]);
    assert_eq!(holder(&api, t0 + 9_999).await, ["ns/a"]);
    assert!(holder(&api, t0 + 15_000).await.is_empty(), "released");
    assert_eq!(holder(&api, t0 + 21_000).await, ["ns/b"]);
    assert!(holder(&api, t0 + 60_000).await.is_empty(), "expired");
    // RFC 3339 works as well as milliseconds.
    let at = corral_api::history::format_time(t0 + 21_000);
    let response = api
        .history(&format!("address={ADDR}&at={at}"))
        .await
        .unwrap();
    assert_eq!(response.held.unwrap()[0].owner, "ns/b");

    // Each filter.
    let by_pod = api.history("pod=ns%2Fa").await.unwrap();
    assert_eq!(
        kinds(&by_pod.events),
        [
            (HistoryKind::Released, "ns/a"),
            (HistoryKind::Allocated, "ns/a")
        ]
    );
    let by_key = api.history("key=c-ns-b%2Feth0").await.unwrap();
    assert_eq!(by_key.events.len(), 2);
    assert!(by_key.events.iter().all(|e| e.owner == "ns/b"));
    assert_eq!(api.history("key=c-ns-b").await.unwrap().events.len(), 2);
    let span = api
        .history(&format!("since={}&until={}", t0 + 5_000, t0 + 20_000))
        .await
        .unwrap();
    assert_eq!(
        kinds(&span.events),
        [
            (HistoryKind::Allocated, "ns/b"),
            (HistoryKind::Released, "ns/a")
        ]
    );
    assert_eq!(api.history("limit=1").await.unwrap().events.len(), 1);

    // Bad filters: a typed 400 naming the problem, and nothing changed.
    for (query, needle) in [
        ("at=1000", "at goes with address"),
        ("address=10.88.0.7&at=yesterday", "is not a time"),
        ("address=10.88.0.300", "not an IP address"),
        ("since=2026-13-01T00:00", "is not a time"),
        ("since=2000&until=1000", "since is after until"),
        ("limit=0", "limit 0"),
        ("limit=100000", "limit 100000"),
        ("limit=many", "limit"),
        ("key=%2Feth0", "key"),
        ("pod=", "pod is empty"),
        ("owner=x", "unknown field"),
    ] {
        let message = bad_request(&api, query).await;
        assert!(message.contains(needle), "{query}: {message}");
    }
    let after = api.history(&format!("address={ADDR}")).await.unwrap();
    assert_eq!(after, all);
    agent.stop().await.unwrap();
}

/// The agent keeps the history within its configured bounds: the oldest events go, in
/// batches, within the commits that add new ones.
#[tokio::test(start_paused = true)]
async fn the_history_keeps_within_its_configured_bounds() {
    let (agent, api) = start_with(HistoryLimits {
        max_events: 4,
        max_age: Duration::from_secs(3600),
    })
    .await;
    let release = ReleaseRequest {
        scope: "node".into(),
        key: None,
        address: Some(ADDR.parse().unwrap()),
        generation: None,
        owner: None,
    };
    for i in 0..10 {
        api.allocate(&allocate(&format!("ns/p{i}"), None))
            .await
            .unwrap();
        api.release(&release).await.unwrap();
        let kept = api.history("limit=10000").await.unwrap().events;
        // A batch (here as large as the bound) accumulates before it goes.
        assert!(kept.len() < 4 + 4, "{} events kept", kept.len());
        assert_eq!(kept[0].owner, format!("ns/p{i}"), "the newest stay");
    }
    // An hour later, the next commit drops what is past the age.
    tokio::time::sleep(Duration::from_secs(3601)).await;
    api.allocate(&allocate("ns/late", None)).await.unwrap();
    let kept = api.history("limit=10000").await.unwrap().events;
    assert_eq!(kinds(&kept), [(HistoryKind::Allocated, "ns/late")]);
    agent.stop().await.unwrap();
}
