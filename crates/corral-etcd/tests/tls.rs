//! `EtcdKv` over TLS: against real etcd members that serve TLS only and ask for a client
//! certificate (`--client-cert-auth`), with a PKI the test makes (rcgen). The conformance suite
//! over TLS; a server certificate from another CA and a client certificate etcd does not trust
//! are refused by the handshake, each with its own message; the files' own faults (missing,
//! readable by others, expired, a key that does not match) are start-up errors naming the file,
//! before any connection; rotated files are picked up without a new client, and a user keeps
//! its role over TLS across a rotation.
//! The tests that start etcd need its binary (`make deps`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use corral_etcd::testing::{EtcdCluster, Leaf, TestPki, write_file};
use corral_etcd::{ConnectError, EtcdKv, EtcdOptions, EtcdTls, TlsError};
use corral_kv::{Kv, KvError, conformance};

use crate::SERIAL;

async fn tls_cluster(members: usize) -> (tokio::sync::MutexGuard<'static, ()>, EtcdCluster) {
    let serial = SERIAL.lock().await;
    let cluster = EtcdCluster::start_tls(members)
        .await
        .unwrap_or_else(|error| panic!("starting {members} TLS etcd members: {error}"));
    (serial, cluster)
}

fn with_tls(tls: EtcdTls) -> EtcdOptions {
    EtcdOptions {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        tls: Some(tls),
        ..EtcdOptions::default()
    }
}

/// What a read answers, which must be `Unavailable`.
async fn unavailable(kv: &EtcdKv) -> String {
    match kv.get(b"/tls/probe").await {
        Err(KvError::Unavailable(message)) => message,
        other => panic!("a read answered {other:?}"),
    }
}

/// What a read through a client of `tls` answers (connecting is lazy), which must be
/// `Unavailable`.
async fn unavailable_over(endpoints: &[String], tls: EtcdTls) -> String {
    let kv = EtcdKv::connect(endpoints, with_tls(tls))
        .await
        .expect("connecting is lazy");
    unavailable(&kv).await
}

/// The TLS error `connect` answers to `tls`, which must refuse before connecting.
async fn refused(endpoints: &[String], tls: EtcdTls) -> TlsError {
    match EtcdKv::connect(endpoints, with_tls(tls)).await {
        Err(ConnectError::Tls(error)) => error,
        Err(other) => panic!("connect answered {other}"),
        Ok(_) => panic!("connect accepted the TLS files"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (make deps)"]
async fn the_conformance_suite_passes_over_tls_with_a_client_certificate() {
    let (_serial, cluster) = tls_cluster(3).await;
    assert!(cluster.endpoint(0).starts_with("https://"));
    let kv = cluster
        .client(EtcdOptions::default())
        .await
        .expect("client");
    conformance::run_all(&kv, "/tls/conformance").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (make deps)"]
async fn a_wrong_ca_and_an_untrusted_client_each_fail_with_their_own_message() {
    let (_serial, cluster) = tls_cluster(1).await;
    let endpoints = cluster.endpoints();
    let pki = cluster.pki().expect("a TLS cluster has a PKI");
    let good = cluster.client_tls().expect("client TLS");
    let dir = tempfile::tempdir().expect("tempdir");

    // etcd's certificate does not verify against another CA: refused, never used.
    let other = TestPki::new(dir.path(), "other").expect("other CA");
    let wrong_ca = EtcdTls {
        ca_cert: other.ca_cert(),
        ..good.clone()
    };
    let message = unavailable_over(&endpoints, wrong_ca).await;
    assert!(
        message.contains("etcd's TLS certificate does not verify against the CA certificate given (UnknownIssuer)"),
        "{message}"
    );

    // A client certificate etcd does not trust (another CA signed it): etcd refuses it.
    let (cert, key) = other.issue("stranger", Leaf::Client).expect("issue");
    let untrusted = EtcdTls::new(pki.ca_cert()).with_client(cert, key);
    // No client certificate at all: refused too.
    for tls in [untrusted, EtcdTls::new(pki.ca_cert())] {
        let message = unavailable_over(&endpoints, tls).await;
        assert!(
            message.contains("etcd refused the TLS client certificate"),
            "{message}"
        );
    }

    // The right files work.
    let kv = EtcdKv::connect(&endpoints, with_tls(good))
        .await
        .expect("client");
    kv.get(b"/tls/probe").await.expect("a read over TLS");
}

#[tokio::test]
async fn bad_files_are_start_up_errors_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::new(dir.path(), "ca").expect("CA");
    let (cert, key) = pki.issue("client", Leaf::Client).expect("issue");
    let endpoints = vec!["https://127.0.0.1:1".to_owned()];
    let text = |error: TlsError| error.to_string();

    let missing = dir.path().join("missing.pem");
    let error = refused(&endpoints, EtcdTls::new(&missing).with_client(&cert, &key)).await;
    assert!(matches!(error, TlsError::Unreadable { .. }), "{error:?}");
    assert!(text(error).starts_with(&format!(
        "cannot read the etcd CA certificate {}: ",
        missing.display()
    )));
    let error = refused(
        &endpoints,
        EtcdTls::new(pki.ca_cert()).with_client(&cert, &missing),
    )
    .await;
    assert!(text(error).starts_with(&format!(
        "cannot read the etcd client key {}",
        missing.display()
    )));

    // A key others can read, a key that is not the certificate's, an expired certificate, not
    // PEM, a certificate without its key.
    let exposed = dir.path().join("exposed-key.pem");
    copy(&key, &exposed, 0o644);
    let (_, other_key) = pki.issue("another", Leaf::Client).expect("issue");
    let (expired, expired_key) = pki.issue("expired", Leaf::ExpiredClient).expect("issue");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write");
    let mut half = EtcdTls::new(pki.ca_cert());
    half.cert = Some(cert.clone());
    let with_client = |cert: &Path, key: &Path| EtcdTls::new(pki.ca_cert()).with_client(cert, key);
    let cases = [
        (
            with_client(&cert, &exposed),
            format!(
                "the etcd client key {} can be read by others (mode 0644): `chmod o-rwx` it (0600 or 0640)",
                exposed.display()
            ),
        ),
        (
            with_client(&cert, &other_key),
            format!(
                "the etcd client key {} does not match the certificate {}",
                other_key.display(),
                cert.display()
            ),
        ),
        (
            with_client(&expired, &expired_key),
            format!(
                "the etcd client certificate {} expired at 2001-01-01 00:00:00 UTC",
                expired.display()
            ),
        ),
        (
            EtcdTls::new(&garbage),
            format!(
                "the etcd CA certificate {} holds no PEM certificate",
                garbage.display()
            ),
        ),
        (
            half,
            format!(
                "the etcd client certificate {} is given without its key",
                cert.display()
            ),
        ),
    ];
    for (tls, expected) in cases {
        assert_eq!(text(refused(&endpoints, tls).await), expected);
    }

    // The right files pass, a key its group can read among them (connecting is lazy: nothing
    // listens there).
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    EtcdKv::connect(
        &endpoints,
        with_tls(EtcdTls::new(pki.ca_cert()).with_client(&cert, &key)),
    )
    .await
    .expect("good files");
}

#[tokio::test]
async fn endpoints_and_tls_options_that_do_not_go_together_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::new(dir.path(), "ca").expect("CA");
    let error = refused(
        &["http://127.0.0.1:2379".to_owned()],
        EtcdTls::new(pki.ca_cert()),
    )
    .await;
    assert_eq!(
        error.to_string(),
        "http://127.0.0.1:2379 is plaintext but TLS files are given: use an https:// URL"
    );
    match EtcdKv::connect(
        &["https://127.0.0.1:2379".to_owned()],
        EtcdOptions::default(),
    )
    .await
    {
        Err(ConnectError::Tls(error)) => assert_eq!(
            error.to_string(),
            "https://127.0.0.1:2379 needs the CA certificate that signs etcd's certificate \
             (--etcd-cacert, or etcd_cacert in the configuration file)"
        ),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("https without a CA was accepted"),
    }
}

/// Copies `from` to `to` with `mode`, replacing `to` at once.
fn copy(from: &Path, to: &Path, mode: u32) {
    let contents = std::fs::read(from).expect("read");
    write_file(to, &contents, mode).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (make deps)"]
async fn rotated_files_are_picked_up_without_a_new_client() {
    let (_serial, cluster) = tls_cluster(1).await;
    let pki = cluster.pki().expect("PKI");
    let good = cluster.client_tls().expect("client TLS");
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));

    // It starts with a certificate etcd does not trust: reads fail.
    let other = TestPki::new(dir.path(), "other").expect("other CA");
    let (stranger, stranger_key) = other.issue("stranger", Leaf::Client).expect("issue");
    copy(&stranger, &cert, 0o644);
    copy(&stranger_key, &key, 0o600);
    let mut tls = EtcdTls::new(pki.ca_cert()).with_client(&cert, &key);
    tls.reload_interval = Duration::from_millis(50);
    let kv = EtcdKv::connect(&cluster.endpoints(), with_tls(tls))
        .await
        .expect("client");
    let message = unavailable(&kv).await;
    assert!(
        message.contains("refused the TLS client certificate"),
        "{message}"
    );

    // The trusted certificate rotated in: the same client reads.
    let mut news = kv.tls_reloads();
    copy(good.cert.as_deref().expect("cert"), &cert, 0o644);
    copy(good.key.as_deref().expect("key"), &key, 0o600);
    news.wait_for(|news| news.reloads >= 1 && news.refused.is_none())
        .await
        .expect("reload task alive");
    kv.get(b"/tls/probe").await.expect("a read after rotation");

    // A key that does not match is refused: the clients in use stay.
    let (_, wrong_key) = pki.issue("another", Leaf::Client).expect("issue");
    copy(&wrong_key, &key, 0o600);
    let refusal = news
        .wait_for(|news| news.refused.is_some())
        .await
        .expect("reload task alive")
        .refused
        .clone()
        .expect("refused");
    assert!(
        refusal.contains("does not match the certificate"),
        "{refusal}"
    );
    kv.get(b"/tls/probe")
        .await
        .expect("a read on the clients in use");
}

/// TLS and etcd's auth together: the user's role decides (not the certificate's name), and a
/// client rebuilt from rotated files logs in again before its first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd (make deps)"]
async fn a_user_over_tls_keeps_its_role_across_a_rotation() {
    use corral_etcd::Credentials;
    use corral_etcd::auth::{Access, Grant};
    use corral_kv::{Txn, TxnOp};

    let (_serial, cluster) = tls_cluster(1).await;
    let pki = cluster.pki().expect("PKI");
    let open = cluster
        .client(EtcdOptions::default())
        .await
        .expect("client");
    open.ensure_role("app", &[Grant::prefix(Access::ReadWrite, "/app/")])
        .await
        .expect("role app");
    open.ensure_role("root", &[]).await.expect("role root");
    open.ensure_user("app", "apppw", "app")
        .await
        .expect("user app");
    open.ensure_user("root", "rootpw", "root")
        .await
        .expect("user root");
    open.enable_auth().await.expect("auth on");

    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let good = cluster.client_tls().expect("client TLS");
    copy(good.cert.as_deref().expect("cert"), &cert, 0o644);
    copy(good.key.as_deref().expect("key"), &key, 0o600);
    let mut tls = EtcdTls::new(pki.ca_cert()).with_client(&cert, &key);
    tls.reload_interval = Duration::from_millis(50);
    let app = EtcdKv::connect(
        &cluster.endpoints(),
        EtcdOptions {
            credentials: Some(Credentials {
                user: "app".into(),
                password: "apppw".into(),
            }),
            ..with_tls(tls)
        },
    )
    .await
    .expect("client");
    let put = |key: &str| Txn {
        success: vec![TxnOp::put(key, "v")],
        ..Txn::default()
    };
    let refused = |outcome: Result<_, KvError>| matches!(outcome, Err(KvError::Refused(message)) if message.contains("permission denied"));
    app.txn(put("/app/before")).await.expect("its own prefix");
    assert!(refused(app.txn(put("/other/before")).await));

    // Another trusted certificate (another name) rotated in: new connections, logged in again.
    let mut news = app.tls_reloads();
    let (rotated, rotated_key) = pki.issue("rotated", Leaf::Client).expect("issue");
    copy(&rotated, &cert, 0o644);
    copy(&rotated_key, &key, 0o600);
    news.wait_for(|news| news.reloads >= 1 && news.refused.is_none())
        .await
        .expect("reload task alive");
    app.txn(put("/app/after"))
        .await
        .expect("its own prefix after");
    assert!(refused(app.txn(put("/other/after")).await));
    assert_eq!(
        app.get(b"/app/after")
            .await
            .expect("read")
            .map(|kv| kv.value),
        Some(b"v".to_vec())
    );
}
