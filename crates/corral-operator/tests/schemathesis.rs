//! schemathesis (property-based API testing, from PyPI) against the real operator: a
//! one-member etcd on 127.0.0.1, a dual-stack cluster configuration and a few registered
//! nodes, `corral_operator::run` in-process on `EtcdKv` with its API's TCP listener on
//! 127.0.0.1 and a bearer token; every operation of the committed `openapi-operator.json` is
//! fed generated valid and invalid requests. A response must never be a 5xx (the replica
//! leads throughout, so not even 503); its status, media type and body must be what the
//! document says; invalid requests and undocumented methods must be refused.
//!
//! schemathesis and etcd must be installed (`make deps`); the test fails, it does not skip,
//! when either is missing. `SCHEMATHESIS` names another `st` executable, `SCHEMATHESIS_SEED`
//! another seed, `SCHEMATHESIS_EXAMPLES` another number of examples per operation.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_api::testing::Schemathesis;
use corral_cluster::{ClusterConfig, ClusterName, Keys};
use corral_kv::{Compare, Kv, Txn, TxnOp};
use corral_operator::api::ApiConfig;
use corral_operator::{OperatorConfig, Shared};

const TOKEN: &str = "schemathesis-operator-token-0123456789";
const NODES: usize = 5;

const CONFIG: &str = include_str!("configs/schemathesis.toml");

/// Writes the configuration (as `corral cluster init` does: only if absent) and registers
/// the nodes (as agents do).
async fn seed_cluster(kv: &impl Kv, keys: &Keys) {
    let config = ClusterConfig::from_toml(CONFIG).unwrap();
    let mut txns = vec![Txn {
        compares: vec![Compare::absent(keys.config())],
        success: vec![TxnOp::put(keys.config(), config.to_json().unwrap())],
        failure: vec![],
    }];
    for n in 0..NODES {
        let name = format!("node-{n}");
        let record = common::node_record(&name);
        let key = format!("/corral/t/v1/nodes/{name}");
        txns.push(Txn {
            compares: vec![Compare::absent(key.clone())],
            success: vec![TxnOp::put(key, record)],
            failure: vec![],
        });
    }
    for txn in txns {
        assert!(kv.txn(txn).await.unwrap().succeeded);
    }
}

#[test]
#[ignore = "needs schemathesis and etcd (make deps)"]
fn schemathesis_finds_nothing_in_the_operator_api() {
    let st = Schemathesis::find();
    let dir = tempfile::tempdir().unwrap();
    let (runtime, etcd, kv) = common::etcd_runtime();
    let keys = Keys::new(ClusterName::new("t").unwrap());
    runtime.block_on(seed_cluster(&kv, &keys));
    let shared = Arc::new(Shared::new("op-st".into()));
    let api = runtime
        .block_on(corral_operator::api::bind(
            ApiConfig {
                socket: dir.path().join("operator.sock"),
                tcp: Some("127.0.0.1:0".parse().unwrap()),
                token: Some(corral_operator::api::BearerToken::new(TOKEN)),
            },
            Arc::clone(&shared),
        ))
        .unwrap();
    let addr = api.tcp_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = runtime.spawn(corral_operator::run(
        kv,
        OperatorConfig {
            cluster: "t".into(),
            replica: "op-st".into(),
            lease_ttl: Duration::from_secs(5),
            workers: 4,
            page: OperatorConfig::DEFAULT_PAGE,
            max_txn_ops: corral_kv::MAX_TXN_OPS,
        },
        Arc::clone(&shared),
        async move {
            let _ = stopped.await;
        },
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while shared
        .with_view(|view, _| view.served_nodes())
        .is_none_or(|served| served < NODES)
    {
        assert!(
            Instant::now() < deadline,
            "the operator did not serve {NODES} nodes within 30 s: {:?}",
            shared.problems()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let run = st.run("openapi-operator.json", addr, TOKEN, dir.path());

    // The replica led throughout and still serves every node.
    let still_leading = shared.leading();
    let _ = stop.send(());
    runtime.block_on(operator).unwrap().unwrap();
    runtime.block_on(api.stop());
    drop(etcd);
    run.assert_passed();
    assert!(still_leading, "the replica lost the lead during the run");
}
