//! The fuzz target `agent_records` (through `corral_agent::fuzz::records`): etcd's keys and
//! values as the link reads its node's (`Held::apply`), screened, and turned into the ranges
//! and cloud interfaces the node state would be given; nothing fed to it may panic.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use corral_cluster::{ClusterConfig, ClusterName, Keys, NodeName};
use corral_kv::KeyValue;

use super::cloud_pool;
use super::held::{AcrossRounds, Held, screen};

/// Records separated by NUL, each `KEY LF VALUE` (a put) or `-KEY` (a delete), keys relative to
/// the cluster's prefix unless they start with `/`; the node is `n1`, and the view starts from
/// `corral_cluster::fuzz::RECORDS_CONFIG`.
pub(crate) fn fuzz_records(data: &[u8]) {
    let keys = Keys::new(ClusterName::new("t").expect("a valid cluster name"));
    let node = NodeName::new("n1").expect("a valid node name");
    let config = ClusterConfig::from_toml(corral_cluster::fuzz::RECORDS_CONFIG)
        .expect("the records' configuration");
    let mut held = Held {
        plan: config.node_ids.clone(),
        config: Some(Arc::new(config)),
        ..Held::default()
    };
    let mut created: BTreeMap<String, i64> = BTreeMap::new();
    for (revision, key, value) in corral_cluster::fuzz::records(&keys, data) {
        let Some(value) = value else {
            held.apply(&keys, &node, &key, None);
            created.remove(&key);
            continue;
        };
        let create_revision = *created.entry(key.clone()).or_insert(revision);
        let entry = KeyValue {
            key: key.clone().into_bytes(),
            value: value.to_vec(),
            create_revision,
            mod_revision: revision,
            version: 1,
            lease: None,
        };
        held.apply(&keys, &node, &key, Some(&entry));
    }
    let mut across = AcrossRounds {
        seen_before: 5,
        ..AcrossRounds::default()
    };
    screen(&mut held, &mut across, &BTreeSet::new());
    let _ = held.ranges();
    let _ = held.block_families();
    if let Some(config) = held.config.clone() {
        let _ = cloud_pool::wanted(&config, &held.cloud, Some("i-1"), BTreeSet::new());
    }
}
