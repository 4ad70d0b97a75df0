//! What the examples that load a real etcd share: their size, read from the environment, and
//! a local 3-member etcd (fsync on) with a client of it.

use corral_etcd::testing::EtcdCluster;
use corral_etcd::{EtcdKv, EtcdOptions};

/// The number in the environment variable `name`, else `default`; a value that is not a
/// number stops the example.
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).ok().map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} is a number"))
    })
}

/// A local 3-member etcd and a client of it (the cluster stops when it is dropped); each member
/// also takes the flags in `ETCD_ARGS` (split at spaces, e.g. `--max-txn-ops 512`).
pub async fn three_members() -> (EtcdCluster, EtcdKv) {
    let extra = std::env::var("ETCD_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    let etcd = EtcdCluster::start_with(3, &extra)
        .await
        .expect("etcd starts (make deps)");
    let kv = etcd.client(EtcdOptions::default()).await.unwrap();
    (etcd, kv)
}
