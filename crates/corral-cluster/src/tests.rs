//! Fixtures the unit tests of several files share: a cluster's stored entries, written key by
//! key as etcd would hold them, the records in them, and the configurations they start from.

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use crate::check::{Entry, check};
use crate::config::{ClusterConfig, Watermarks};
use crate::keys::{CloudAttachment, CloudId, CloudInterfaceRecord, encode_value};
use crate::keys::{ClusterName, Keys, NodeName, NodeRecord, ReleaseRecord, ReleaseState};
use crate::view::ClusterView;

/// The `[node_ids]` table the tests plan node IDs with (the fuzz records' one), in TOML.
pub(crate) use crate::fuzz::node_ids_toml;

/// One `[[pools]]` table with the IPv4 range `cidr`, in TOML: its name, its mode when given,
/// then `[pools.ipv4]` with `cidrs` and the `key = value` pairs that follow (a macro, so
/// `concat!` can put it into constants).
macro_rules! pool_toml {
    ($name:literal $(, mode = $mode:literal)?, $cidr:literal $(, $key:ident = $value:tt)*) => {
        concat!(
            "[[pools]]\n",
            "name = \"", $name, "\"\n",
            $("mode = \"", $mode, "\"\n",)?
            "[pools.ipv4]\n",
            "cidrs = [\"", $cidr, "\"]\n",
            $(stringify!($key), " = ", stringify!($value), "\n",)*
        )
    };
}
pub(crate) use pool_toml;

/// Asserts that each of `texts` is part of some problem in `problems`.
#[track_caller]
pub fn assert_reported(problems: &[String], texts: &[&str]) {
    for text in texts {
        assert!(
            problems.iter().any(|p| p.contains(text)),
            "{text:?} in {problems:#?}"
        );
    }
}

/// A [`ClusterView`] of cluster `t` fed key by key, each put at the next revision. The view's
/// tests add the steps they need in `impl ViewFixture` blocks of their own.
pub struct ViewFixture {
    pub view: ClusterView,
    pub revision: i64,
}

impl ViewFixture {
    /// The view of configuration `config` (TOML) at revision 1.
    pub fn new(config: &str) -> ViewFixture {
        ViewFixture::of("t", config)
    }

    /// [`ViewFixture::new`] in cluster `cluster`.
    pub fn of(cluster: &str, config: &str) -> ViewFixture {
        let keys = Keys::new(ClusterName::new(cluster).unwrap());
        ViewFixture {
            view: ClusterView::new(keys, ClusterConfig::from_toml(config).unwrap()),
            revision: 1,
        }
    }

    /// Puts `value` at `key` at the next revision, which it answers.
    pub fn put(&mut self, key: &str, value: &[u8]) -> i64 {
        self.revision += 1;
        self.view
            .apply_put(key, value, self.revision, self.revision);
        self.revision
    }

    /// Registers node `name` (uid `uid-<name>`).
    pub fn register(&mut self, name: &str) -> NodeName {
        let node = NodeName::new(name).unwrap();
        let record = NodeRecord {
            uid: format!("uid-{name}"),
            addresses: vec![],
            registered_ms: 0,
            instance_id: None,
            max_pods: None,
        };
        let key = self.view.keys().node(&node);
        self.put(&key, &encode_value(&record).unwrap());
        node
    }
}

/// The block pool of the view's tests.
pub fn pods() -> PoolName {
    PoolName::new("pods").unwrap()
}

pub fn node(name: &str) -> NodeName {
    NodeName::new(name).unwrap()
}

pub fn id(text: &str) -> CloudId {
    CloudId::new(text).unwrap()
}

pub fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// Watermarks in the order of the file's table: `pre_allocate`, `min_allocate`,
/// `max_above_watermark`, `max_allocate`.
pub fn watermarks(pre: u64, min: u64, maw: u64, max: u64) -> Watermarks {
    Watermarks {
        pre_allocate: pre,
        min_allocate: min,
        max_above_watermark: maw,
        max_allocate: max,
    }
}

/// An attached interface corral manages, at device index 1 in subnet-1 (10.0.0.0/16), holding
/// `addresses`.
pub fn interface_record(pool: &str, instance_id: &str, addresses: &[&str]) -> CloudInterfaceRecord {
    CloudInterfaceRecord {
        pool: PoolName::new(pool).unwrap(),
        instance_id: instance_id.to_owned(),
        device_index: 1,
        subnet_id: "subnet-1".to_owned(),
        subnets: vec![net("10.0.0.0/16")],
        mac: "02:00:00:00:00:01".to_owned(),
        primary_ipv4: None,
        addresses: addresses.iter().map(|a| net(a)).collect(),
        assigned_ms: Default::default(),
        attachment: CloudAttachment::Attached,
        managed: true,
        prefixes_refused_ms: None,
    }
}

/// The entries of cluster `t`, each at the next revision.
pub struct Cluster {
    pub keys: Keys,
    pub entries: Vec<Entry>,
    pub revision: i64,
}

impl Cluster {
    /// The configuration `config` (TOML) at revision 1.
    pub fn with_config(config: &str) -> Cluster {
        let keys = Keys::new(ClusterName::new("t").unwrap());
        let config = ClusterConfig::from_toml(config).unwrap();
        let entries = vec![(keys.config(), config.to_json().unwrap().into_bytes(), 1)];
        Cluster {
            keys,
            entries,
            revision: 1,
        }
    }

    pub fn add(&mut self, key: String, value: Vec<u8>) -> i64 {
        self.revision += 1;
        self.entries.push((key, value, self.revision));
        self.revision
    }

    /// Node `name` registered, on `instance_id` if given.
    pub fn node(&mut self, name: &str, instance_id: Option<String>) {
        let record = NodeRecord {
            uid: "u".into(),
            addresses: vec![],
            registered_ms: 0,
            instance_id,
            max_pods: None,
        };
        let key = self.keys.node(&NodeName::new(name).unwrap());
        self.add(key, encode_value(&record).unwrap());
    }

    /// The release record of IPv4 `cidr` of `pool` on node `node`.
    pub fn release(
        &mut self,
        node: &str,
        pool: &str,
        cidr: &str,
        state: ReleaseState,
        grant_revision: i64,
    ) {
        let record = ReleaseRecord {
            state,
            grant_revision,
            marked_ms: 0,
            answered_ms: 0,
            reason: None,
        };
        self.add(
            self.keys.release(
                &NodeName::new(node).unwrap(),
                &PoolName::new(pool).unwrap(),
                Family::V4,
                &net(cidr),
            ),
            encode_value(&record).unwrap(),
        );
    }

    pub fn check(&self) -> Vec<String> {
        check(&self.keys, &self.entries)
    }
}
