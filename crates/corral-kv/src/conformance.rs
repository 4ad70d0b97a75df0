//! The conformance suite: etcd's semantics as test cases any `Kv` must pass, run against
//! `MemKv` (`tests/mem.rs`) and real etcd (corral-etcd's `tests/etcd.rs`), so the fake cannot
//! drift from the real store.
//!
//! Each case takes the store and a key prefix unique to the run, writes only under it, and
//! panics (as a test does) when the store departs from etcd. The cases count revisions, so run
//! them one at a time on a store nobody else writes to meanwhile. Waits use tokio's clock: under
//! `tokio::time::pause()` a case that waits for a lease to expire takes no real time.

use std::time::Duration;

use crate::{
    Compare, CompareOp, Event, KeyValue, Kv, KvError, LeaseId, MAX_TXN_OPS, RangePage, Revision,
    Target, Txn, TxnOp, TxnResponse, Watch,
};

/// How long any single wait of the suite lasts at most (an event, a lease expiry).
const PATIENCE: Duration = Duration::from_secs(15);

/// Runs every case in order (leases and compaction last: they take longest and compaction
/// discards the history the other cases read).
pub async fn run_all<K: Kv>(kv: &K, prefix: &str) {
    txn_compares(kv, &format!("{prefix}/compares")).await;
    prefix_compares(kv, &format!("{prefix}/prefix")).await;
    revision_accounting(kv, &format!("{prefix}/revisions")).await;
    header(kv, &format!("{prefix}/header")).await;
    txn_limits(kv, &format!("{prefix}/limits")).await;
    range_pagination(kv, &format!("{prefix}/range")).await;
    range_spans(kv, &format!("{prefix}/span")).await;
    watch_replay(kv, &format!("{prefix}/watch")).await;
    lease_revoke(kv, &format!("{prefix}/revoke")).await;
    lease_keep_alive(kv, &format!("{prefix}/keepalive")).await;
    lease_expiry(kv, &format!("{prefix}/expiry")).await;
    compaction(kv, &format!("{prefix}/compaction")).await;
}

fn key(prefix: &str, name: &str) -> Vec<u8> {
    format!("{prefix}/{name}").into_bytes()
}

async fn txn<K: Kv>(
    kv: &K,
    compares: Vec<Compare>,
    success: Vec<TxnOp>,
    failure: Vec<TxnOp>,
) -> TxnResponse {
    let request = Txn {
        compares,
        success,
        failure,
    };
    match kv.txn(request.clone()).await {
        Ok(response) => response,
        Err(error) => panic!("txn {request:?} failed: {error}"),
    }
}

/// A transaction without compares, so its `ops` always run.
async fn apply<K: Kv>(kv: &K, ops: Vec<TxnOp>) -> TxnResponse {
    txn(kv, vec![], ops, vec![]).await
}

async fn put<K: Kv>(kv: &K, key: &[u8], value: &str) -> Revision {
    apply(kv, vec![TxnOp::put(key, value)]).await.revision
}

async fn grant<K: Kv>(kv: &K, ttl: Duration) -> LeaseId {
    kv.lease_grant(ttl).await.expect("lease grant")
}

/// Puts "1" at each of `keys` on `lease`, in one transaction.
async fn put_on_lease<K: Kv>(kv: &K, keys: &[&[u8]], lease: LeaseId) -> TxnResponse {
    let ops = keys
        .iter()
        .map(|key| TxnOp::put_on_lease(*key, "1", lease))
        .collect();
    apply(kv, ops).await
}

async fn get<K: Kv>(kv: &K, key: &[u8]) -> Option<KeyValue> {
    kv.get(key)
        .await
        .unwrap_or_else(|error| panic!("get {:?} failed: {error}", String::from_utf8_lossy(key)))
}

async fn current_revision<K: Kv>(kv: &K) -> Revision {
    apply(kv, vec![]).await.revision
}

fn compare(key: &[u8], op: CompareOp, target: Target) -> Compare {
    Compare {
        key: key.to_vec(),
        op,
        target,
        prefix: false,
    }
}

/// Whether a txn with only these compares takes its success branch.
async fn holds<K: Kv>(kv: &K, compares: Vec<Compare>) -> bool {
    txn(kv, compares, vec![], vec![]).await.succeeded
}

/// Collects exactly `n` events from a watch (batches in revision order, none empty).
pub async fn next_events(watch: &mut Watch, n: usize) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    while events.len() < n {
        let batch = match tokio::time::timeout(PATIENCE, watch.next()).await {
            Ok(Ok(batch)) => batch,
            Ok(Err(error)) => panic!("watch failed after {} of {n} events: {error}", events.len()),
            Err(_) => panic!(
                "watch delivered {} of {n} events in {PATIENCE:?}: {events:?}",
                events.len()
            ),
        };
        assert!(!batch.is_empty(), "a watch delivered an empty batch");
        for event in &batch {
            if let Some(last) = events.last() {
                assert!(
                    event.revision() >= last.revision(),
                    "watch events out of order: {last:?} then {event:?}"
                );
            }
        }
        events.extend(batch);
    }
    assert_eq!(
        events.len(),
        n,
        "watch delivered more events than expected: {events:?}"
    );
    events
}

/// Asserts the watch delivers nothing more for a while (exactly once: no repeats).
pub async fn assert_quiet(watch: &mut Watch) {
    if let Ok(delivered) = tokio::time::timeout(Duration::from_millis(300), watch.next()).await {
        panic!("watch delivered unexpectedly: {delivered:?}");
    }
}

/// Waits until `key` is gone (a lease expiry), for at most `PATIENCE`.
async fn wait_absent<K: Kv>(kv: &K, key: &[u8]) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while get(kv, key).await.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?} still exists {PATIENCE:?} after its lease should have expired",
            String::from_utf8_lossy(key)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Compares on absent and present keys, each target, both branches.
/// A prefix compare: `prefix_empty` holds until a key exists under the prefix, fails while one
/// does (whatever sits beside the prefix), and holds again once it is deleted.
pub async fn prefix_compares<K: Kv>(kv: &K, prefix: &str) {
    let under = format!("{prefix}/p/");
    let inside = key(&format!("{prefix}/p"), "x");
    let beside = key(prefix, "q");
    apply(kv, vec![TxnOp::put(beside.clone(), "b")]).await;
    assert!(holds(kv, vec![Compare::prefix_empty(under.clone())]).await);
    apply(kv, vec![TxnOp::put(inside.clone(), "x")]).await;
    assert!(!holds(kv, vec![Compare::prefix_empty(under.clone())]).await);
    apply(kv, vec![TxnOp::delete(inside)]).await;
    assert!(holds(kv, vec![Compare::prefix_empty(under)]).await);
}

pub async fn txn_compares<K: Kv>(kv: &K, prefix: &str) {
    let a = key(prefix, "a");
    let absent = key(prefix, "absent");

    let created = txn(
        kv,
        vec![Compare::absent(a.clone())],
        vec![TxnOp::put(a.clone(), "1")],
        vec![],
    )
    .await;
    assert!(created.succeeded, "absent compare on an absent key failed");
    let r1 = created.revision;
    let kv_a = get(kv, &a).await.expect("key written by a successful txn");
    assert_eq!(
        (
            kv_a.value.as_slice(),
            kv_a.create_revision,
            kv_a.mod_revision,
            kv_a.version
        ),
        (&b"1"[..], r1, r1, 1)
    );
    assert_eq!(kv_a.lease, None);

    let again = txn(
        kv,
        vec![Compare::absent(a.clone())],
        vec![TxnOp::put(a.clone(), "x")],
        vec![TxnOp::get(a.clone())],
    )
    .await;
    assert!(!again.succeeded, "absent compare on a present key held");
    assert_eq!(
        again.revision, r1,
        "a failed txn with only gets advanced the revision"
    );
    assert_eq!(
        again.gets,
        vec![Some(kv_a.clone())],
        "the failure branch's get"
    );

    assert!(
        holds(
            kv,
            vec![
                Compare::created_at(a.clone(), r1),
                Compare::modified_at(a.clone(), r1)
            ]
        )
        .await
    );
    let r2 = txn(
        kv,
        vec![Compare::modified_at(a.clone(), r1)],
        vec![TxnOp::put(a.clone(), "2")],
        vec![],
    )
    .await
    .revision;
    assert_eq!(r2, r1 + 1);
    let kv_a = get(kv, &a).await.expect("key a");
    assert_eq!(
        (kv_a.create_revision, kv_a.mod_revision, kv_a.version),
        (r1, r2, 2)
    );
    assert!(
        !holds(kv, vec![Compare::modified_at(a.clone(), r1)]).await,
        "stale compare-and-swap held"
    );
    assert!(
        holds(kv, vec![Compare::created_at(a.clone(), r1)]).await,
        "create revision moved on update"
    );
    // Each target and operator on a present key (value "2", version 2, created at r1,
    // modified at r2) and on an absent one: create and mod revision 0 and version 0, and a
    // value compare fails whatever the operator.
    let cases: Vec<(Vec<Compare>, bool, &str)> = vec![
        (vec![Compare::value_is(a.clone(), "2")], true, "value equal"),
        (
            vec![Compare::value_is(a.clone(), "1")],
            false,
            "value equal to the old value held",
        ),
        (
            vec![compare(
                &a,
                CompareOp::Greater,
                Target::Value(b"1".to_vec()),
            )],
            true,
            "value greater",
        ),
        (
            vec![compare(&a, CompareOp::Less, Target::Value(b"3".to_vec()))],
            true,
            "value less",
        ),
        (
            vec![compare(&a, CompareOp::Greater, Target::Version(1))],
            true,
            "version greater",
        ),
        (
            vec![compare(&a, CompareOp::NotEqual, Target::ModRevision(r1))],
            true,
            "mod revision not equal",
        ),
        (
            vec![compare(&a, CompareOp::Less, Target::CreateRevision(r2))],
            true,
            "create revision less",
        ),
        (
            vec![
                Compare::created_at(a.clone(), r1),
                Compare::value_is(a.clone(), "1"),
            ],
            false,
            "compares are a conjunction",
        ),
        (
            vec![
                Compare::created_at(absent.clone(), 0),
                Compare::modified_at(absent.clone(), 0),
            ],
            true,
            "revisions of an absent key",
        ),
        (
            vec![compare(&absent, CompareOp::Less, Target::Version(1))],
            true,
            "version of an absent key",
        ),
        (
            vec![Compare::value_is(absent.clone(), "")],
            false,
            "value compare on an absent key held",
        ),
        (
            vec![compare(
                &absent,
                CompareOp::NotEqual,
                Target::Value(b"x".to_vec()),
            )],
            false,
            "value not-equal compare on an absent key held",
        ),
    ];
    for (compares, expected, what) in cases {
        assert_eq!(holds(kv, compares).await, expected, "{what}");
    }

    // Deleted and created again: a new create revision, version 1.
    let r3 = apply(kv, vec![TxnOp::delete(a.clone())]).await.revision;
    assert_eq!(r3, r2 + 1);
    assert_eq!(get(kv, &a).await, None);
    assert!(holds(kv, vec![Compare::absent(a.clone())]).await);
    let r4 = put(kv, &a, "3").await;
    let kv_a = get(kv, &a).await.expect("key a");
    assert_eq!(
        (kv_a.create_revision, kv_a.mod_revision, kv_a.version),
        (r4, r4, 1)
    );

    // A get after a put in the same txn sees the put.
    let c = key(prefix, "c");
    let seen = apply(
        kv,
        vec![
            TxnOp::put(c.clone(), "v"),
            TxnOp::get(c.clone()),
            TxnOp::get(absent.clone()),
        ],
    )
    .await;
    let got = seen.gets[0].clone().expect("a get sees the txn's own put");
    assert_eq!(
        (got.value.as_slice(), got.mod_revision),
        (&b"v"[..], seen.revision)
    );
    assert_eq!(seen.gets.len(), 2);
    assert_eq!(seen.gets[1], None);
}

/// One revision per successful write txn, whatever it writes; none for reads, failed compares
/// without writes, or deletions of absent keys.
pub async fn revision_accounting<K: Kv>(kv: &K, prefix: &str) {
    let (a, b, c) = (key(prefix, "a"), key(prefix, "b"), key(prefix, "c"));
    let r0 = current_revision(kv).await;
    let read = apply(kv, vec![TxnOp::get(a.clone()), TxnOp::get(b.clone())]).await;
    assert_eq!(read.revision, r0, "a read-only txn advanced the revision");
    let failed = txn(
        kv,
        vec![Compare::value_is(a.clone(), "nothing")],
        vec![TxnOp::put(a.clone(), "x")],
        vec![],
    )
    .await;
    assert_eq!(
        (failed.succeeded, failed.revision),
        (false, r0),
        "a failed txn advanced the revision"
    );

    let three = apply(
        kv,
        vec![
            TxnOp::put(a.clone(), "1"),
            TxnOp::put(b.clone(), "1"),
            TxnOp::put(c.clone(), "1"),
        ],
    )
    .await;
    assert_eq!(
        three.revision,
        r0 + 1,
        "a txn of three puts is one revision"
    );
    for name in [&a, &b, &c] {
        assert_eq!(get(kv, name).await.expect("written").mod_revision, r0 + 1);
    }
    let nothing = apply(kv, vec![TxnOp::delete(key(prefix, "never"))]).await;
    assert_eq!(
        nothing.revision,
        r0 + 1,
        "deleting an absent key advanced the revision"
    );
    assert_eq!(
        kv.get(&a).await.map(|kv| kv.map(|kv| kv.version)),
        Ok(Some(1))
    );

    let failure_branch = txn(
        kv,
        vec![Compare::absent(a.clone())],
        vec![],
        vec![TxnOp::put(a.clone(), "2")],
    )
    .await;
    assert_eq!(
        (failure_branch.succeeded, failure_branch.revision),
        (false, r0 + 2),
        "a failure branch that writes is a revision"
    );
    let deleted = apply(kv, vec![TxnOp::delete(b.clone()), TxnOp::delete(c.clone())]).await;
    assert_eq!(deleted.revision, r0 + 3);
    assert_eq!(current_revision(kv).await, r0 + 3);
}

/// `header` answers the current revision (a write's, until the next write) and one cluster ID,
/// the same on every call.
pub async fn header<K: Kv>(kv: &K, prefix: &str) {
    let written = put(kv, &key(prefix, "a"), "1").await;
    let first = kv.header().await.expect("header");
    assert_eq!(
        first.revision, written,
        "the header's revision is the last write's"
    );
    assert_ne!(first.cluster_id, 0, "the store names its cluster");
    let again = put(kv, &key(prefix, "a"), "2").await;
    let second = kv.header().await.expect("header");
    assert_eq!(second.revision, again);
    assert_eq!(second.cluster_id, first.cluster_id);
    assert_eq!(
        current_revision(kv).await,
        again,
        "a header read writes nothing"
    );
}

/// etcd's refusals: a key put twice (or put and deleted) in one branch (`Refused`), more
/// compares or operations than `MAX_TXN_OPS` (`TooManyOps`, which the operator's leader
/// answers by granting in smaller transactions), a put on an unknown lease.
pub async fn txn_limits<K: Kv>(kv: &K, prefix: &str) {
    let a = key(prefix, "a");
    let refused = |request: Txn, expected: fn(&KvError) -> bool| async move {
        let r0 = current_revision(kv).await;
        match kv.txn(request.clone()).await {
            Err(error) if expected(&error) => {}
            other => panic!("txn {request:?} answered {other:?}"),
        }
        assert_eq!(
            current_revision(kv).await,
            r0,
            "a refused txn changed the store"
        );
    };
    let malformed = |error: &KvError| matches!(error, KvError::Refused(_));
    let too_many = |error: &KvError| matches!(error, KvError::TooManyOps(_));
    refused(
        Txn {
            success: vec![TxnOp::put(a.clone(), "1"), TxnOp::put(a.clone(), "2")],
            ..Txn::default()
        },
        malformed,
    )
    .await;
    refused(
        Txn {
            success: vec![TxnOp::delete(a.clone()), TxnOp::put(a.clone(), "2")],
            ..Txn::default()
        },
        malformed,
    )
    .await;
    refused(
        Txn {
            success: vec![TxnOp::put(a.clone(), "2"), TxnOp::delete(a.clone())],
            ..Txn::default()
        },
        malformed,
    )
    .await;
    // Both branches are checked, whichever would run.
    refused(
        Txn {
            failure: vec![TxnOp::put(a.clone(), "1"), TxnOp::put(a.clone(), "2")],
            ..Txn::default()
        },
        malformed,
    )
    .await;
    let many: Vec<TxnOp> = (0..=MAX_TXN_OPS)
        .map(|i| TxnOp::put(key(prefix, &format!("many/{i:03}")), "x"))
        .collect();
    refused(
        Txn {
            success: many.clone(),
            ..Txn::default()
        },
        too_many,
    )
    .await;
    let compares: Vec<Compare> = (0..=MAX_TXN_OPS)
        .map(|i| Compare::absent(key(prefix, &format!("c/{i}"))))
        .collect();
    refused(
        Txn {
            compares,
            ..Txn::default()
        },
        too_many,
    )
    .await;

    // Allowed: the same key deleted twice, read and written, or put in both branches.
    apply(kv, vec![TxnOp::delete(a.clone()), TxnOp::delete(a.clone())]).await;
    txn(
        kv,
        vec![],
        vec![TxnOp::get(a.clone()), TxnOp::put(a.clone(), "1")],
        vec![TxnOp::put(a.clone(), "2")],
    )
    .await;
    let full = apply(kv, many[..MAX_TXN_OPS].to_vec()).await;
    let page = kv
        .range(&key(prefix, "many/"), None, 0, None)
        .await
        .expect("range");
    assert_eq!(page.kvs.len(), MAX_TXN_OPS);
    assert!(page.kvs.iter().all(|kv| kv.mod_revision == full.revision));

    let unknown = LeaseId(0x3c0f_fee0_dead_beef);
    let r0 = current_revision(kv).await;
    match kv
        .txn(Txn {
            success: vec![TxnOp::put_on_lease(a.clone(), "x", unknown)],
            ..Txn::default()
        })
        .await
    {
        Err(KvError::LeaseNotFound(lease)) => assert_eq!(lease, unknown),
        other => panic!("a put on an unknown lease answered {other:?}"),
    }
    assert_eq!(current_revision(kv).await, r0);
}

/// Paginated reads at one revision see one snapshot while writes continue.
pub async fn range_pagination<K: Kv>(kv: &K, prefix: &str) {
    let dir = format!("{prefix}/");
    let names: Vec<String> = (0..10).map(|i| format!("k{i:02}")).collect();
    let puts = names
        .iter()
        .map(|name| TxnOp::put(key(prefix, name), format!("v-{name}")))
        .collect();
    apply(kv, puts).await;
    // Beside the prefix, sorting right after it: not part of the range.
    put(kv, format!("{prefix}0").as_bytes(), "outside").await;

    let first = kv
        .range(dir.as_bytes(), None, 3, None)
        .await
        .expect("first page");
    assert!(first.more);
    let at = first.revision;
    assert_eq!(first.revision, current_revision(kv).await);

    put(kv, &key(prefix, "k015"), "new").await;
    apply(kv, vec![TxnOp::delete(key(prefix, "k05"))]).await;
    put(kv, &key(prefix, "k03"), "changed").await;
    put(kv, &key(prefix, "k99"), "new").await;

    let mut seen = first.kvs;
    let mut after = seen.last().map(|kv| kv.key.clone());
    let mut pages = 1;
    loop {
        let page = kv
            .range(dir.as_bytes(), after.as_deref(), 3, Some(at))
            .await
            .expect("next page at the first's revision");
        assert_eq!(page.revision, at, "a page read at a revision says another");
        pages += 1;
        after = page.kvs.last().map(|kv| kv.key.clone());
        seen.extend(page.kvs);
        if !page.more {
            break;
        }
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 4);
    let seen_keys: Vec<Vec<u8>> = seen.iter().map(|kv| kv.key.clone()).collect();
    let expected: Vec<Vec<u8>> = names.iter().map(|name| key(prefix, name)).collect();
    assert_eq!(seen_keys, expected, "a paginated read at one revision");
    assert!(
        seen.iter().all(|kv| kv.value.starts_with(b"v-")),
        "a page showed a later write"
    );

    let now = kv
        .range(dir.as_bytes(), None, 0, None)
        .await
        .expect("range without limit");
    assert!(!now.more);
    let now_keys: Vec<String> = now
        .kvs
        .iter()
        .map(|kv| kv.key_str().trim_start_matches(&dir).to_string())
        .collect();
    assert_eq!(
        now_keys,
        [
            "k00", "k01", "k015", "k02", "k03", "k04", "k06", "k07", "k08", "k09", "k99"
        ]
    );
    let (all, revision) = crate::read_all(kv, dir.as_bytes(), 4)
        .await
        .expect("read_all");
    assert_eq!((all, revision), (now.kvs, now.revision));

    let exact = kv
        .range(dir.as_bytes(), Some(&key(prefix, "k09")), 1, None)
        .await
        .expect("last page");
    assert_eq!(exact.kvs.len(), 1);
    assert!(!exact.more);
    match kv
        .range(dir.as_bytes(), None, 1, Some(now.revision + 1000))
        .await
    {
        Err(KvError::Refused(_)) => {}
        other => panic!("a read at a future revision answered {other:?}"),
    }
}

/// A bounded range answers its keys in order, at most the limit, and counts every key it holds
/// (what the store walked); an empty end reads to the last key; a read at an earlier
/// revision sees the keys of then.
pub async fn range_spans<K: Kv>(kv: &K, prefix: &str) {
    let names: Vec<String> = (0..10).map(|i| format!("k{i:02}")).collect();
    let puts = names
        .iter()
        .map(|name| TxnOp::put(key(prefix, name), format!("v-{name}")))
        .collect();
    let at = apply(kv, puts).await.revision;
    let span = |from: &str, to: &str| (key(prefix, from), key(prefix, to));
    let names_of = |page: &RangePage| -> Vec<String> {
        page.kvs
            .iter()
            .map(|kv| {
                kv.key_str()
                    .trim_start_matches(&format!("{prefix}/"))
                    .to_string()
            })
            .collect()
    };

    let (start, end) = span("k02", "k07");
    let page = kv.range_span(&start, &end, 3, None).await.expect("span");
    assert_eq!(names_of(&page), ["k02", "k03", "k04"]);
    assert!(page.more);
    assert_eq!(page.count, 5, "the span holds k02..k06");
    let page = kv.range_span(&start, &end, 0, None).await.expect("span");
    assert_eq!(names_of(&page), ["k02", "k03", "k04", "k05", "k06"]);
    assert!(!page.more);
    assert_eq!(page.count, 5);

    // An empty span, and one whose end is not after its start.
    let (start, end) = span("k035", "k04");
    let page = kv.range_span(&start, &end, 3, None).await.expect("span");
    assert!(page.kvs.is_empty() && !page.more && page.count == 0);
    let page = kv.range_span(&end, &start, 3, None).await.expect("span");
    assert!(page.kvs.is_empty() && !page.more && page.count == 0);

    // Writes after `at` are not seen by a read at `at`; an empty end reads to the last key.
    apply(kv, vec![TxnOp::delete(key(prefix, "k08"))]).await;
    put(kv, &key(prefix, "k085"), "new").await;
    let start = key(prefix, "k07");
    let then = kv.range_span(&start, b"", 0, Some(at)).await.expect("span");
    assert_eq!(then.revision, at);
    let then: Vec<String> = names_of(&then).into_iter().take(3).collect();
    assert_eq!(then, ["k07", "k08", "k09"]);
    let now = kv
        .range_span(&start, &key(prefix, "k1"), 0, None)
        .await
        .expect("span");
    assert_eq!(names_of(&now), ["k07", "k085", "k09"]);
    assert_eq!(now.count, 3);
}

/// A watch from a past revision replays history, then streams new writes, each once.
pub async fn watch_replay<K: Kv>(kv: &K, prefix: &str) {
    let (a, b, c) = (key(prefix, "a"), key(prefix, "b"), key(prefix, "c"));
    let r1 = put(kv, &a, "1").await;
    let r2 = put(kv, &b, "1").await;
    let r3 = apply(kv, vec![TxnOp::delete(a.clone())]).await.revision;
    put(kv, format!("{prefix}-beside").as_bytes(), "not watched").await;

    let mut watch = kv
        .watch(format!("{prefix}/").as_bytes(), r1)
        .await
        .expect("watch");
    let mut live = kv
        .watch(format!("{prefix}/").as_bytes(), 0)
        .await
        .expect("watch from now");
    let replayed = next_events(&mut watch, 3).await;
    let summary: Vec<(String, Revision, bool)> = replayed
        .iter()
        .map(|event| {
            (
                String::from_utf8_lossy(event.key()).into(),
                event.revision(),
                matches!(event, Event::Put(_)),
            )
        })
        .collect();
    let name = |key: &[u8]| String::from_utf8_lossy(key).into_owned();
    assert_eq!(
        summary,
        vec![
            (name(&a), r1, true),
            (name(&b), r2, true),
            (name(&a), r3, false)
        ]
    );
    if let Event::Put(kv_b) = &replayed[1] {
        assert_eq!(
            (kv_b.value.as_slice(), kv_b.create_revision, kv_b.version),
            (&b"1"[..], r2, 1)
        );
    }

    let r5 = apply(
        kv,
        vec![TxnOp::put(b.clone(), "2"), TxnOp::put(c.clone(), "1")],
    )
    .await
    .revision;
    for watch in [&mut watch, &mut live] {
        let streamed = next_events(watch, 2).await;
        assert!(
            streamed.iter().all(|event| event.revision() == r5),
            "one txn's events at one revision: {streamed:?}"
        );
        assert_eq!(
            streamed.iter().map(Event::key).collect::<Vec<_>>(),
            vec![&b[..], &c[..]]
        );
        match &streamed[0] {
            Event::Put(kv_b) => assert_eq!(
                (kv_b.create_revision, kv_b.mod_revision, kv_b.version),
                (r2, r5, 2)
            ),
            other => panic!("expected a put, got {other:?}"),
        }
    }
    let r6 = apply(kv, vec![TxnOp::delete(c.clone())]).await.revision;
    assert_eq!(
        next_events(&mut watch, 1).await,
        vec![Event::Delete {
            key: c.clone(),
            mod_revision: r6
        }]
    );
    assert_eq!(
        next_events(&mut live, 1).await,
        vec![Event::Delete {
            key: c.clone(),
            mod_revision: r6
        }]
    );
    assert_quiet(&mut watch).await;
    assert_quiet(&mut live).await;
}

/// Revoking a lease deletes its keys in one revision; a key put again without the lease is
/// no longer on it.
pub async fn lease_revoke<K: Kv>(kv: &K, prefix: &str) {
    let (a, b, c) = (key(prefix, "a"), key(prefix, "b"), key(prefix, "c"));
    let lease = grant(kv, Duration::from_secs(60)).await;
    let written = put_on_lease(kv, &[&a, &b, &c], lease).await;
    assert_eq!(get(kv, &a).await.and_then(|kv| kv.lease), Some(lease));
    put(kv, &c, "detached").await;
    assert_eq!(get(kv, &c).await.and_then(|kv| kv.lease), None);

    let mut watch = kv
        .watch(format!("{prefix}/").as_bytes(), written.revision + 2)
        .await
        .expect("watch");
    kv.lease_revoke(lease).await.expect("revoke");
    assert_eq!(get(kv, &a).await, None);
    assert_eq!(get(kv, &b).await, None);
    assert!(
        get(kv, &c).await.is_some(),
        "a key put again without the lease was deleted with it"
    );
    let deleted = next_events(&mut watch, 2).await;
    let revision = written.revision + 2;
    assert_eq!(
        deleted,
        vec![
            Event::Delete {
                key: a.clone(),
                mod_revision: revision
            },
            Event::Delete {
                key: b.clone(),
                mod_revision: revision
            }
        ]
    );
    assert_quiet(&mut watch).await;
    match kv.lease_keep_alive(lease).await {
        Err(KvError::LeaseNotFound(found)) => assert_eq!(found, lease),
        other => panic!("keep-alive of a revoked lease answered {other:?}"),
    }
    kv.lease_revoke(lease)
        .await
        .expect("revoking an unknown lease is not an error");
}

/// Keep-alives keep a lease's keys past its TTL; without them the keys go.
pub async fn lease_keep_alive<K: Kv>(kv: &K, prefix: &str) {
    let a = key(prefix, "a");
    let lease = grant(kv, Duration::from_secs(2)).await;
    put_on_lease(kv, &[&a], lease).await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ttl = kv
            .lease_keep_alive(lease)
            .await
            .expect("keep-alive of a live lease");
        assert!(
            ttl >= Duration::from_secs(2),
            "keep-alive answered ttl {ttl:?}"
        );
    }
    assert!(
        get(kv, &a).await.is_some(),
        "a kept-alive lease's key expired"
    );
    wait_absent(kv, &a).await;
    match kv.lease_keep_alive(lease).await {
        Err(KvError::LeaseNotFound(_)) => {}
        other => panic!("keep-alive of an expired lease answered {other:?}"),
    }
}

/// A lease that is not kept alive expires, deleting its keys in one revision that watches see.
pub async fn lease_expiry<K: Kv>(kv: &K, prefix: &str) {
    let (a, b) = (key(prefix, "a"), key(prefix, "b"));
    let lease = grant(kv, Duration::from_secs(1)).await;
    let written = put_on_lease(kv, &[&a, &b], lease).await;
    assert!(get(kv, &a).await.is_some(), "a fresh lease's key is gone");
    let mut watch = kv
        .watch(format!("{prefix}/").as_bytes(), written.revision + 1)
        .await
        .expect("watch");
    wait_absent(kv, &a).await;
    assert_eq!(get(kv, &b).await, None);
    let deleted = next_events(&mut watch, 2).await;
    assert!(
        matches!(&deleted[..], [Event::Delete { .. }, Event::Delete { .. }]),
        "expiry events: {deleted:?}"
    );
    assert_eq!(
        deleted[0].revision(),
        deleted[1].revision(),
        "a lease's keys expire in one revision"
    );
    assert!(deleted[0].revision() > written.revision);
    match kv.lease_keep_alive(lease).await {
        Err(KvError::LeaseNotFound(_)) => {}
        other => panic!("keep-alive of an expired lease answered {other:?}"),
    }
    match kv
        .txn(Txn {
            success: vec![TxnOp::put_on_lease(a.clone(), "2", lease)],
            ..Txn::default()
        })
        .await
    {
        Err(KvError::LeaseNotFound(_)) => {}
        other => panic!("a put on an expired lease answered {other:?}"),
    }
}

/// Asserts a watch from a compacted revision fails with `Compacted` (at creation or on its
/// first `next`, as etcd does).
async fn assert_watch_compacted<K: Kv>(
    kv: &K,
    prefix: &[u8],
    from: Revision,
    compact_revision: Revision,
) {
    let outcome = match kv.watch(prefix, from).await {
        Ok(mut watch) => match tokio::time::timeout(PATIENCE, watch.next()).await {
            Ok(outcome) => outcome.map(|_| ()),
            Err(_) => panic!("a watch from a compacted revision delivered nothing in {PATIENCE:?}"),
        },
        Err(error) => Err(error),
    };
    assert_eq!(
        outcome,
        Err(KvError::Compacted { compact_revision }),
        "watch from compacted revision {from}"
    );
}

/// After `compact(r)`, reads and watches before `r` fail with `Compacted { r }`; from `r` on
/// they work.
pub async fn compaction<K: Kv>(kv: &K, prefix: &str) {
    let a = key(prefix, "a");
    let dir = format!("{prefix}/");
    let r1 = put(kv, &a, "1").await;
    let r2 = put(kv, &a, "2").await;
    let r3 = put(kv, &a, "3").await;
    kv.compact(r2).await.expect("compact");

    match kv.range(dir.as_bytes(), None, 0, Some(r1)).await {
        Err(KvError::Compacted { compact_revision }) => assert_eq!(compact_revision, r2),
        other => panic!("a read at a compacted revision answered {other:?}"),
    }
    let at_r2 = kv
        .range(dir.as_bytes(), None, 0, Some(r2))
        .await
        .expect("a read at the compaction revision");
    assert_eq!(
        at_r2
            .kvs
            .iter()
            .map(|kv| kv.value.clone())
            .collect::<Vec<_>>(),
        vec![b"2".to_vec()]
    );
    let at_r3 = kv
        .range(dir.as_bytes(), None, 0, Some(r3))
        .await
        .expect("a read after the compaction revision");
    assert_eq!(at_r3.kvs[0].value, b"3");

    assert_watch_compacted(kv, dir.as_bytes(), r1, r2).await;
    let mut watch = kv
        .watch(dir.as_bytes(), r3)
        .await
        .expect("watch after the compaction revision");
    match &next_events(&mut watch, 1).await[..] {
        [Event::Put(kv_a)] => assert_eq!(
            (kv_a.value.as_slice(), kv_a.mod_revision, kv_a.version),
            (&b"3"[..], r3, 3)
        ),
        other => panic!("watch from r3 delivered {other:?}"),
    }

    match kv.compact(r2).await {
        Err(KvError::Compacted { compact_revision }) => assert_eq!(compact_revision, r2),
        other => panic!("compacting at the compaction revision again answered {other:?}"),
    }
    match kv.compact(r3 + 1000).await {
        Err(KvError::Refused(_)) => {}
        other => panic!("compacting a future revision answered {other:?}"),
    }
}
