//! The conformance suite on `MemKv`, on tokio's paused clock, and `MemKv`'s own test knobs.

use std::time::Duration;

use corral_kv::{Compare, Event, Kv, KvError, MemKv, Txn, TxnOp, conformance};

#[tokio::test(start_paused = true)]
async fn conformance_suite() {
    let kv = MemKv::new();
    conformance::run_all(&kv, "/conformance").await;
}

#[tokio::test(start_paused = true)]
async fn each_case_alone_on_a_fresh_store() {
    conformance::txn_compares(&MemKv::new(), "/p").await;
    conformance::revision_accounting(&MemKv::new(), "/p").await;
    conformance::txn_limits(&MemKv::new(), "/p").await;
    conformance::range_pagination(&MemKv::new(), "/p").await;
    conformance::watch_replay(&MemKv::new(), "/p").await;
    conformance::lease_revoke(&MemKv::new(), "/p").await;
    conformance::lease_keep_alive(&MemKv::new(), "/p").await;
    conformance::lease_expiry(&MemKv::new(), "/p").await;
    conformance::compaction(&MemKv::new(), "/p").await;
}

#[tokio::test]
async fn a_new_store_is_at_revision_one() {
    let kv = MemKv::new();
    assert_eq!(kv.revision(), 1);
    let response = kv
        .txn(Txn {
            success: vec![TxnOp::put("a", "1")],
            ..Txn::default()
        })
        .await
        .unwrap();
    assert_eq!(response.revision, 2);
    assert_eq!(kv.get(b"a").await.unwrap().unwrap().create_revision, 2);
}

#[tokio::test]
async fn unavailable_refuses_every_call_and_counts_it() {
    let kv = MemKv::new();
    kv.txn(Txn {
        success: vec![TxnOp::put("a", "1")],
        ..Txn::default()
    })
    .await
    .unwrap();
    assert_eq!(kv.requests(), 1);
    kv.set_unavailable(true);
    let unavailable = |result: Result<(), KvError>| {
        assert!(matches!(result, Err(KvError::Unavailable(_))), "{result:?}")
    };
    unavailable(kv.get(b"a").await.map(drop));
    unavailable(kv.range(b"", None, 0, None).await.map(drop));
    unavailable(kv.txn(Txn::default()).await.map(drop));
    unavailable(kv.lease_grant(Duration::from_secs(5)).await.map(drop));
    unavailable(kv.lease_keep_alive(corral_kv::LeaseId(1)).await.map(drop));
    unavailable(kv.lease_revoke(corral_kv::LeaseId(1)).await);
    unavailable(kv.watch(b"", 0).await.map(drop));
    unavailable(kv.compact(1).await);
    assert_eq!(kv.requests(), 9);
    kv.set_unavailable(false);
    assert_eq!(kv.get(b"a").await.unwrap().unwrap().value, b"1");
    assert_eq!(kv.requests(), 10);
}

#[tokio::test(start_paused = true)]
async fn leases_do_not_expire_while_unavailable_and_run_a_full_ttl_after() {
    let kv = MemKv::new();
    let lease = kv.lease_grant(Duration::from_secs(10)).await.unwrap();
    kv.txn(Txn {
        success: vec![TxnOp::put_on_lease("a", "1", lease)],
        ..Txn::default()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    kv.set_unavailable(true);
    tokio::time::sleep(Duration::from_secs(60)).await;
    kv.set_unavailable(false);
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(
        kv.get(b"a").await.unwrap().is_some(),
        "a lease expired during or right after an outage"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(kv.get(b"a").await.unwrap(), None);
}

#[tokio::test]
async fn a_lease_ttl_is_whole_seconds_at_least_one() {
    let kv = MemKv::new();
    let short = kv.lease_grant(Duration::from_millis(10)).await.unwrap();
    assert_eq!(
        kv.lease_keep_alive(short).await.unwrap(),
        Duration::from_secs(1)
    );
    let odd = kv.lease_grant(Duration::from_millis(2500)).await.unwrap();
    assert_eq!(
        kv.lease_keep_alive(odd).await.unwrap(),
        Duration::from_secs(3)
    );
}

#[tokio::test]
async fn a_watch_gets_one_batch_per_revision() {
    let kv = MemKv::new();
    for i in 0..5 {
        kv.txn(Txn {
            success: vec![
                TxnOp::put(format!("k/{i}/a"), "1"),
                TxnOp::put(format!("k/{i}/b"), "1"),
            ],
            ..Txn::default()
        })
        .await
        .unwrap();
    }
    let mut watch = kv.watch(b"k/", 1).await.unwrap();
    for revision in 2..7 {
        let batch = watch.next().await.unwrap();
        assert_eq!(batch.len(), 2);
        assert!(batch.iter().all(|event| event.revision() == revision));
    }
}

#[tokio::test]
async fn a_watch_that_falls_behind_a_compaction_is_compacted() {
    let kv = MemKv::new();
    let mut watch = kv.watch(b"k", 0).await.unwrap();
    // More revisions than the watch buffers, so the feeder waits for the reader.
    let mut last = 0;
    for i in 0..300 {
        last = kv
            .txn(Txn {
                success: vec![TxnOp::put("k", format!("{i}"))],
                ..Txn::default()
            })
            .await
            .unwrap()
            .revision;
    }
    kv.compact(last).await.unwrap();
    let mut delivered = 0;
    let outcome = loop {
        match watch.next().await {
            Ok(batch) => delivered += batch.len(),
            Err(error) => break error,
        }
    };
    assert_eq!(
        outcome,
        KvError::Compacted {
            compact_revision: last
        }
    );
    assert!(delivered < 300);
    assert_eq!(watch.next().await, Err(KvError::Closed));
}

#[tokio::test]
async fn dropping_the_store_ends_its_watches() {
    let kv = MemKv::new();
    let mut watch = kv.watch(b"", 0).await.unwrap();
    drop(kv);
    assert_eq!(watch.next().await, Err(KvError::Closed));
}

#[tokio::test]
async fn a_cas_loop_on_one_key_loses_no_update() {
    let kv = MemKv::new();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let kv = kv.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                loop {
                    let current = kv.get(b"counter").await.unwrap();
                    let (value, compare) = match &current {
                        Some(kv) => (
                            String::from_utf8_lossy(&kv.value).parse::<u64>().unwrap(),
                            Compare::modified_at("counter", kv.mod_revision),
                        ),
                        None => (0, Compare::absent("counter")),
                    };
                    let txn = Txn {
                        compares: vec![compare],
                        success: vec![TxnOp::put("counter", (value + 1).to_string())],
                        ..Txn::default()
                    };
                    if kv.txn(txn).await.unwrap().succeeded {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(kv.get(b"counter").await.unwrap().unwrap().value, b"400");
    let mut watch = kv.watch(b"counter", 1).await.unwrap();
    let events = conformance::next_events(&mut watch, 400).await;
    assert!(events.iter().all(|event| matches!(event, Event::Put(_))));
}

#[tokio::test]
async fn a_read_of_everything_but_one_prefix_jumps_past_it() {
    let kv = MemKv::new();
    for key in [
        "/p/a/1", "/p/h/1", "/p/h/2", "/p/h/3", "/p/h/4", "/p/hz", "/p/z/1",
    ] {
        kv.txn(Txn {
            compares: vec![],
            success: vec![TxnOp::put(key, "v")],
            failure: vec![],
        })
        .await
        .unwrap();
    }
    for page in [1, 2, 100] {
        let (all, _) = corral_kv::read_all_but(&kv, b"/p/", Some(b"/p/h/"), page)
            .await
            .unwrap();
        let keys: Vec<String> = all.iter().map(|e| e.key_str().into_owned()).collect();
        assert_eq!(keys, ["/p/a/1", "/p/hz", "/p/z/1"], "page {page}");
    }
    let (all, _) = corral_kv::read_all(&kv, b"/p/", 2).await.unwrap();
    assert_eq!(all.len(), 7);
}
