//! Entry points for the fuzz targets of what the operator and `corral cluster` decode
//! (`fuzz/fuzz_targets/`: `cluster_config`, `cluster_keys`, `cluster_records`, `epoch_file`) and
//! their corpus replay (`tests/fuzz_corpus.rs`): each takes arbitrary bytes and panics only when
//! an invariant breaks. "Nothing fed to the view panics" (ARCHITECTURE.md) is the one they
//! hold the crate to.

use std::collections::BTreeMap;

use crate::check::check;
use crate::config::ClusterConfig;
use crate::epoch::EpochMemory;
use crate::keys::{ClusterName, Keys};
use crate::view::ClusterView;
use crate::{Family, PoolName};

/// The `[node_ids]` table of [`RECORDS_CONFIG`], in TOML: a macro, so `concat!` can put it
/// into constants (the unit tests plan node IDs with it too, and `testing::node_id_plan`
/// parses it for other crates' tests).
macro_rules! node_ids_toml {
    () => {
        r#"[node_ids]
pod_subnet = "10.1.0.0/16"
pod_subnet_node_prefix_len = 24
host_interconnect_subnet = "172.30.0.0/16"
host_interconnect_node_prefix_len = 24
node_interconnect = "192.168.16.0/24"
vxlan = "192.168.30.0/24"
service = "10.96.0.0/12"
"#
    };
}
#[cfg_attr(not(test), allow(unused_imports))]
pub(crate) use node_ids_toml;

/// The configuration the view of [`records`] starts from: a node-CIDR pool, a block pool of
/// both families and a node-ID plan, so every kind of record has something to land in.
pub const RECORDS_CONFIG: &str = concat!(
    r#"
default_pool = "pods"
[[pools]]
name = "default"
[pools.ipv4]
cidrs = ["10.244.0.0/16"]
node_prefix_len = 24
[[pools]]
name = "pods"
mode = "blocks"
[pools.ipv4]
cidrs = ["10.64.0.0/16"]
block_prefix_len = 26
[pools.ipv6]
cidrs = ["fd00:64::/64"]
block_prefix_len = 122
"#,
    node_ids_toml!()
);

/// The cluster configuration as the file's TOML and as the stored JSON: what reads prints
/// (`to_json`) and reads back the same.
pub fn cluster_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for config in [
        ClusterConfig::from_toml(&text),
        ClusterConfig::from_json(data),
    ]
    .into_iter()
    .flatten()
    {
        let json = config.to_json().expect("a read configuration prints");
        let again = ClusterConfig::from_json(json.as_bytes())
            .unwrap_or_else(|e| panic!("a printed configuration does not read: {e}\n{json}"));
        assert_eq!(config, again, "{json}");
        config.validate().expect("a read configuration validates");
        let _ = ClusterConfig::check_change(&config, &again);
    }
}

/// A key under a cluster's prefix (the prefix added when the text does not start with `/`):
/// a key that parses formats back to the same text.
pub fn cluster_keys(data: &[u8]) {
    let keys = Keys::new(ClusterName::new("t").expect("a valid cluster name"));
    let text = String::from_utf8_lossy(data);
    let key = if text.starts_with('/') {
        text.into_owned()
    } else {
        format!("{}{text}", keys.prefix())
    };
    if let Ok(parsed) = keys.parse(&key) {
        assert_eq!(keys.format(&parsed), key, "{parsed:?}");
    }
}

/// etcd's keys and values as the operator's view and `corral cluster check` read them:
/// records separated by NUL, each `KEY LF VALUE` (a put) or `-KEY` (a delete), keys relative
/// to the prefix unless they start with `/`. The view takes them all, then proposes for every
/// node; the check judges the puts that were left.
pub fn cluster_records(data: &[u8]) {
    let config = ClusterConfig::from_toml(RECORDS_CONFIG).expect("the records' configuration");
    let keys = Keys::new(ClusterName::new("t").expect("a valid cluster name"));
    let mut view = ClusterView::new(keys.clone(), config);
    let mut stored: BTreeMap<String, (Vec<u8>, i64)> = BTreeMap::new();
    for (revision, key, value) in records(&keys, data) {
        match value {
            None => {
                view.apply_delete(&key, revision);
                stored.remove(&key);
            }
            Some(value) => {
                let create = stored.get(&key).map_or(revision, |(_, created)| *created);
                view.apply_put(&key, value, create, revision);
                stored.insert(key, (value.to_vec(), create));
            }
        }
    }
    let _ = view.take_problems();
    let _ = view.node_reports(None);
    let _ = view.refused_grants();
    let _ = view.waiting_quarantines();
    let _ = view.uncovered_holdings();
    let nodes: Vec<_> = view.nodes().map(|(node, _)| node.clone()).collect();
    for node in &nodes {
        let _ = view.needs(node);
        if let Ok(proposal) = view.propose(node) {
            view.abandon(&proposal);
        }
        for (pool, family) in [("pods", Family::V4), ("pods", Family::V6)] {
            let pool = PoolName::new(pool).expect("a valid pool name");
            if let Ok(proposal) = view.propose_blocks(node, &pool, family, 2) {
                view.abandon_blocks(&proposal);
            }
        }
    }
    let entries: Vec<_> = stored
        .into_iter()
        .map(|(key, (value, revision))| (key, value, revision))
        .collect();
    let _ = check(&keys, &entries);
}

/// The records of a records target's input, at revisions 2, 3, …: NUL-separated, each
/// `KEY LF VALUE` (a put, `Some(value)`) or `-KEY` (a delete, `None`), keys under `keys`'
/// prefix unless they start with `/`. Shared by this crate's and the agent's records targets.
pub fn records<'a>(
    keys: &'a Keys,
    data: &'a [u8],
) -> impl Iterator<Item = (i64, String, Option<&'a [u8]>)> + 'a {
    let absolute = move |key: &[u8]| {
        let key = String::from_utf8_lossy(key);
        if key.starts_with('/') {
            key.into_owned()
        } else {
            format!("{}{key}", keys.prefix())
        }
    };
    (2..)
        .zip(data.split(|&b| b == 0))
        .map(move |(revision, record)| {
            if let Some(key) = record.strip_prefix(b"-") {
                return (revision, absolute(key), None);
            }
            let (key, value) = match record.iter().position(|&b| b == b'\n') {
                Some(at) => (&record[..at], &record[at + 1..]),
                None => (record, &[][..]),
            };
            (revision, absolute(key), Some(value))
        })
}

/// The operator's `etcd-epoch-<cluster>.json`: a memory that reads writes back the same.
pub fn epoch_file(data: &[u8]) {
    let Ok(memory) = EpochMemory::from_json(data) else {
        return;
    };
    let again = EpochMemory::from_json(&memory.to_json()).expect("a written epoch file reads");
    assert_eq!(memory, again);
}
