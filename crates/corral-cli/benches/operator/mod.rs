//! What the benches that run the operator in this process share: the replica on a client
//! whose etcd requests are counted, and the percentiles they report.

use std::sync::Arc;
use std::time::Duration;

use corral_etcd::EtcdKv;
use corral_etcd::testing::EtcdCluster;
use corral_kv::{Compare, Kv as _, Txn, TxnOp};
use corral_operator::{OperatorConfig, Shared};

/// Replica `bench` of `cluster` (`workers` workers) running in this process on a client of
/// its own (its requests counted apart from the bench's); stopped by [`InProcess::stop`].
pub struct InProcess {
    pub counted: EtcdKv,
    pub shared: Arc<Shared>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), corral_operator::OperatorError>>,
}

impl InProcess {
    /// The replica, `workers` transactions in flight, each of up to `max_txn_ops` operations
    /// (etcd's own limit as high: `runtime_and_etcd`'s `extra_args`).
    pub async fn start(
        endpoints: &[String],
        cluster: &str,
        workers: usize,
        max_txn_ops: usize,
    ) -> InProcess {
        let counted = EtcdKv::connect(endpoints, Default::default())
            .await
            .unwrap();
        let shared = Arc::new(Shared::new("bench".into()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(corral_operator::run(
            counted.clone(),
            OperatorConfig {
                cluster: cluster.into(),
                replica: "bench".into(),
                lease_ttl: Duration::from_secs(10),
                workers,
                page: OperatorConfig::DEFAULT_PAGE,
                max_txn_ops,
            },
            Arc::clone(&shared),
            async move {
                let _ = stopped.await;
            },
        ));
        InProcess {
            counted,
            shared,
            stop,
            task,
        }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// A node's registration record as its agent writes it, with `uid`.
pub fn node_record(uid: String) -> Vec<u8> {
    corral_cluster::encode_value(&corral_cluster::NodeRecord {
        uid,
        addresses: Vec::new(),
        registered_ms: 0,
        instance_id: None,
        max_pods: None,
    })
    .unwrap()
}

/// Puts the configuration `toml` as the cluster's (`keys`), as `corral cluster init` would.
pub async fn install_config(kv: &EtcdKv, keys: &corral_cluster::Keys, toml: &str) {
    let config = corral_cluster::ClusterConfig::from_toml(toml).unwrap();
    kv.txn(Txn {
        compares: vec![Compare::absent(keys.config())],
        success: vec![TxnOp::put(keys.config(), config.to_json().unwrap())],
        failure: vec![],
    })
    .await
    .unwrap();
}

/// A runtime, and `members` etcd members started on it, each also given `extra_args`.
pub fn runtime_and_etcd(
    members: usize,
    extra_args: &[&str],
) -> (tokio::runtime::Runtime, EtcdCluster) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let etcd = runtime
        .block_on(EtcdCluster::start_with(members, extra_args))
        .expect("etcd starts (make deps)");
    (runtime, etcd)
}

/// The `p` quantile (0 to 1) of sorted latencies, the nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
