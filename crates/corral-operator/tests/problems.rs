//! The operator's problems are current conditions (issue 23: `/v1/status` still listed old
//! election errors long after the replica led again): on `MemKv` and tokio's paused clock, an
//! etcd outage raises a problem with its identity and `since`, seeing it again moves
//! `last_seen` only, and leading again ends it, while the bounded event list keeps it.

use crate::common;

use common::*;

#[tokio::test(start_paused = true)]
async fn an_outage_is_a_problem_since_its_start_until_the_replica_leads_again() {
    let (kv, auditor) = audited(DUAL).await;
    let a = start_leading(&kv, "op-a").await;
    register_served(&kv, "node-1").await;
    assert_eq!(a.shared.problems(), Vec::<String>::new());
    let before = a.shared.conditions.now_ms();

    kv.set_unavailable(true);
    wait_until("op-a reports the election's trouble", TTL * 3, || async {
        a.shared
            .conditions
            .conditions()
            .iter()
            .any(|c| c.kind == "election")
    })
    .await;
    let first = a.shared.conditions.conditions();
    let first = first.iter().find(|c| c.kind == "election").unwrap().clone();
    assert_eq!(first.subject, "op-a");
    assert!(
        first.since_ms >= before && first.since_ms <= a.shared.conditions.now_ms(),
        "{first:?}"
    );
    // Seen again while etcd stays away: the same problem, seen later, begun as before.
    tokio::time::sleep(TTL * 5).await;
    let later = a.shared.conditions.conditions();
    let later: Vec<_> = later.iter().filter(|c| c.kind == "election").collect();
    assert_eq!(later.len(), 1, "one problem per identity: {later:#?}");
    assert_eq!(later[0].since_ms, first.since_ms);
    assert!(later[0].last_seen_ms > first.last_seen_ms, "{later:#?}");
    assert_eq!(
        a.shared
            .problems()
            .iter()
            .filter(|p| p.contains("stopped leading") || p.contains("joining the election"))
            .count(),
        1,
        "{:#?}",
        a.shared.problems()
    );

    // etcd is back: op-a leads again, and nothing is wrong now.
    kv.set_unavailable(false);
    wait_leading(&a, TTL * 5).await;
    register_served(&kv, "node-2").await;
    assert_eq!(a.shared.problems(), Vec::<String>::new());
    assert!(a.shared.conditions.conditions().is_empty());
    // The past is kept: the problem raised, and over.
    let events = a.shared.conditions.events();
    let raised = events
        .iter()
        .find(|e| e.kind == "election" && !e.resolved)
        .expect("the problem raised is an event");
    assert_eq!(raised.at_ms, first.since_ms);
    let over = events
        .iter()
        .find(|e| e.kind == "election" && e.resolved)
        .expect("the problem's end is an event");
    assert!(over.at_ms > later[0].last_seen_ms, "{events:#?}");
    assert_clean_end(&kv, &auditor).await;
}
