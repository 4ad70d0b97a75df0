//! What corral-cluster's tests share: a node's registration and holdings records as agents
//! write them, the event log a simulated etcd keeps for its watchers, and a bare
//! `ClusterView` fed by hand.

use corral_cluster::{
    ClusterConfig, ClusterName, ClusterView, HeldRange, HoldingsRecord, Keys, NodeName, NodeRecord,
    Proposal, encode_value,
};

/// Cluster `t`'s keys.
pub fn keys() -> Keys {
    Keys::new(ClusterName::new("t").unwrap())
}

/// A node's registration record, as its agent writes it (no addresses, no instance).
pub fn node_record(uid: String) -> Vec<u8> {
    encode_value(&NodeRecord {
        uid,
        addresses: vec![],
        registered_ms: 0,
        instance_id: None,
        max_pods: None,
    })
    .unwrap()
}

/// A node's holdings record: `ranges` and `node_id`, nothing refused, no cloud interface.
pub fn holdings_record(uid: String, ranges: Vec<HeldRange>, node_id: Option<u32>) -> Vec<u8> {
    encode_value(&HoldingsRecord {
        uid,
        ranges,
        node_id,
        ..HoldingsRecord::default()
    })
    .unwrap()
}

/// One change in a simulated etcd's log, as a watch delivers it.
#[derive(Debug, Clone)]
pub enum Event {
    Put {
        key: String,
        value: Vec<u8>,
        create: i64,
        modified: i64,
    },
    Delete {
        key: String,
        revision: i64,
    },
}

impl Event {
    /// Feeds the change to `view`, as a replica's watch does.
    pub fn apply(&self, view: &mut ClusterView) {
        match self {
            Event::Put {
                key,
                value,
                create,
                modified,
            } => view.apply_put(key, value, *create, *modified),
            Event::Delete { key, revision } => view.apply_delete(key, *revision),
        }
    }
}

/// A simulated etcd's keys: key → (value, create revision, mod revision).
pub type Stored = std::collections::BTreeMap<String, (Vec<u8>, i64, i64)>;

/// Puts `key` at `revision` (its create revision kept if it exists) and logs the put.
pub fn put_logged(
    kv: &mut Stored,
    log: &mut Vec<Event>,
    revision: i64,
    key: String,
    value: Vec<u8>,
) {
    let create = kv.get(&key).map_or(revision, |(_, c, _)| *c);
    kv.insert(key.clone(), (value.clone(), create, revision));
    log.push(Event::Put {
        key,
        value,
        create,
        modified: revision,
    });
}

/// Deletes `key` at `revision` and logs the delete, if it exists; answers whether it did.
pub fn delete_logged(kv: &mut Stored, log: &mut Vec<Event>, revision: i64, key: &str) -> bool {
    let existed = kv.remove(key).is_some();
    if existed {
        log.push(Event::Delete {
            key: key.to_owned(),
            revision,
        });
    }
    existed
}

/// A bare view of cluster `t`, fed by hand: every write one revision.
pub struct ViewFixture {
    pub keys: Keys,
    pub view: ClusterView,
    pub revision: i64,
}

impl ViewFixture {
    pub fn new(config: ClusterConfig) -> ViewFixture {
        let keys = keys();
        ViewFixture {
            view: ClusterView::new(keys.clone(), config),
            keys,
            revision: 1,
        }
    }

    pub fn put(&mut self, key: &str, value: &[u8]) {
        self.revision += 1;
        self.view
            .apply_put(key, value, self.revision, self.revision);
    }

    pub fn delete(&mut self, key: &str) {
        self.revision += 1;
        self.view.apply_delete(key, self.revision);
    }

    /// Registers `node` (its record with `uid`).
    pub fn register_node(&mut self, node: NodeName, uid: String) -> NodeName {
        self.put(&self.keys.node(&node), &node_record(uid));
        node
    }

    /// Proposes for `node` and commits it as the leader would (its puts, seen back).
    pub fn commit_proposal(&mut self, node: &NodeName) -> Proposal {
        let proposal = self.view.propose(node).unwrap();
        self.revision += 1;
        self.view.commit(&proposal, self.revision);
        proposal
    }

    /// `node`'s agent asserts `ranges` and `node_id` (its holdings record, with `uid`).
    pub fn hold(
        &mut self,
        node: &NodeName,
        uid: String,
        ranges: Vec<HeldRange>,
        node_id: Option<u32>,
    ) {
        let value = holdings_record(uid, ranges, node_id);
        self.put(&self.keys.holdings(node), &value);
    }
}

/// A held range with one allocation, not draining.
pub fn held(pool: corral_cluster::PoolName, cidr: corral_cluster::IpNet) -> HeldRange {
    HeldRange {
        pool,
        cidr,
        draining: false,
        allocations: 1,
    }
}

/// The keys among `stored` that are what `wanted` picks.
pub fn keys_of<'a>(
    keys: &Keys,
    stored: impl IntoIterator<Item = &'a String>,
    wanted: impl Fn(&corral_cluster::Key) -> bool,
) -> Vec<String> {
    stored
        .into_iter()
        .filter(|k| keys.parse(k).is_ok_and(|key| wanted(&key)))
        .cloned()
        .collect()
}

/// The quarantine key (of a range or a node ID) an `Expire(i)` deletes among `stored`: the
/// `i`th, counting round; none when nothing is quarantined.
pub fn quarantine_to_expire<'a>(
    keys: &Keys,
    stored: impl IntoIterator<Item = &'a String>,
    i: usize,
) -> Option<String> {
    let quarantined = keys_of(keys, stored, |key| {
        matches!(
            key,
            corral_cluster::Key::Quarantine { .. } | corral_cluster::Key::QuarantineId { .. }
        )
    });
    (!quarantined.is_empty()).then(|| quarantined[i % quarantined.len()].clone())
}
