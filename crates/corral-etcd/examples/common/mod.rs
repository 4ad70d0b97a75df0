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

/// A local 3-member etcd and a client of it (the cluster stops when it is dropped).
pub async fn three_members() -> (EtcdCluster, EtcdKv) {
    let etcd = EtcdCluster::start(3)
        .await
        .expect("etcd starts (make deps)");
    let kv = etcd.client(EtcdOptions::default()).await.unwrap();
    (etcd, kv)
}
