//! `EtcdKv` against real etcd with auth enabled: roles and users made by `auth` (idempotent),
//! a simple token that expires (`--auth-token-ttl 1`) renewed without the caller seeing it, a
//! wrong password named as such, and permissions enforced by etcd itself.
//! Each test needs the etcd binary (`make deps`) and fails loudly without it.

use std::time::Duration;

use corral_etcd::auth::{Access, Grant, Made};
use corral_etcd::testing::EtcdCluster;
use corral_etcd::{Credentials, EtcdKv, EtcdOptions};
use corral_kv::{Kv, KvError, Txn, TxnOp};

use crate::SERIAL;

fn as_user(user: &str, password: &str) -> EtcdOptions {
    EtcdOptions {
        credentials: Some(Credentials {
            user: user.into(),
            password: password.into(),
        }),
        ..EtcdOptions::default()
    }
}

/// A member with auth on: a root user (password "rootpw") and user "app" (password "apppw")
/// that may read and write under `/app/` and read `/shared`.
async fn secured(extra: &[&str]) -> (EtcdCluster, EtcdKv) {
    let etcd = EtcdCluster::start_with(1, extra).await.expect("etcd");
    let open = etcd.client(EtcdOptions::default()).await.expect("client");
    let grants = [
        Grant::prefix(Access::ReadWrite, "/app/"),
        Grant::key(Access::Read, "/shared"),
    ];
    assert_eq!(
        open.ensure_role("app", &grants).await.unwrap(),
        Made::Created
    );
    assert_eq!(
        open.ensure_role("app", &grants).await.unwrap(),
        Made::Unchanged
    );
    assert_eq!(open.ensure_role("root", &[]).await.unwrap(), Made::Created);
    assert_eq!(
        open.ensure_user("app", "apppw", "app").await.unwrap(),
        Made::Created
    );
    assert_eq!(
        open.ensure_user("root", "rootpw", "root").await.unwrap(),
        Made::Created
    );
    open.enable_auth().await.expect("auth enabled");
    let root = etcd.client(as_user("root", "rootpw")).await.expect("root");
    // Idempotent once on, and the existing user keeps its password.
    root.enable_auth().await.expect("auth enabled again");
    assert_eq!(
        root.ensure_user("app", "another", "app").await.unwrap(),
        Made::Unchanged
    );
    (etcd, root)
}

fn put(key: &str) -> Txn {
    Txn {
        compares: vec![],
        success: vec![TxnOp::put(key, "v")],
        failure: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (make deps)"]
async fn etcd_enforces_the_roles_and_a_wrong_password_is_named() {
    let _serial = SERIAL.lock().await;
    let (etcd, root) = secured(&[]).await;
    let app = etcd.client(as_user("app", "apppw")).await.expect("app");
    app.txn(put("/app/x")).await.expect("its own prefix");
    assert!(app.get(b"/app/x").await.unwrap().is_some());
    for refused in ["/other", "/app", "/shared"] {
        match app.txn(put(refused)).await {
            Err(KvError::Refused(message)) => {
                assert!(
                    message.contains("permission denied"),
                    "{refused}: {message}"
                )
            }
            other => panic!("{refused}: {other:?}"),
        }
    }
    // Without any credentials once auth is on: refused, not unreachable.
    let anonymous = etcd.client(EtcdOptions::default()).await.expect("client");
    assert!(matches!(
        anonymous.get(b"/app/x").await,
        Err(KvError::Refused(_))
    ));
    // A wrong password: its own message, naming the user and not the password.
    let wrong = etcd
        .client(as_user("app", "s3cret-wrong"))
        .await
        .expect("lazy");
    match wrong.get(b"/app/x").await {
        Err(KvError::Refused(message)) => {
            assert!(
                message.contains("etcd refused the credentials of user \"app\""),
                "{message}"
            );
            assert!(!message.contains("s3cret"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Narrowing a role takes the rest away.
    let narrowed = [Grant::key(Access::Read, "/shared")];
    assert_eq!(
        root.ensure_role("app", &narrowed).await.unwrap(),
        Made::Updated
    );
    assert!(matches!(
        app.txn(put("/app/y")).await,
        Err(KvError::Refused(_))
    ));
    // The password never shows in Debug.
    let shown = format!("{:?}", as_user("app", "s3cret"));
    assert!(
        !shown.contains("s3cret") && shown.contains("***"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (make deps)"]
async fn an_expired_token_is_renewed_for_requests_watches_and_leases() {
    let _serial = SERIAL.lock().await;
    let (etcd, _root) = secured(&["--auth-token", "simple", "--auth-token-ttl", "1"]).await;
    let app = etcd.client(as_user("app", "apppw")).await.expect("app");
    app.txn(put("/app/a")).await.expect("first write");
    let lease = app.lease_grant(Duration::from_secs(30)).await.unwrap();
    // Idle past the token's TTL (etcd's token keeper checks each second): the token lapses.
    tokio::time::sleep(Duration::from_secs(4)).await;
    app.txn(put("/app/b"))
        .await
        .expect("a write after the token lapsed");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut watch = app
        .watch(b"/app/", 1)
        .await
        .expect("a watch after it lapsed");
    let first = watch.next().await.expect("events");
    assert!(!first.is_empty());
    tokio::time::sleep(Duration::from_secs(4)).await;
    app.lease_keep_alive(lease)
        .await
        .expect("a keep-alive after it lapsed");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(app.get(b"/app/a").await.unwrap().is_some());
    // etcd says the token is gone: the renewal was needed.
    assert!(
        etcd.log_tail(0, 400).contains("deleted a simple token"),
        "{}",
        etcd.log_tail(0, 40)
    );
}
