//! The node's grants as the link holds them ([`Held`]): a projection of the node's keys in
//! etcd, built from one read and kept up by the watch, and the screen that decides which
//! grants the node takes up (only grants this process took up, grants made after the highest
//! revision it has seen, or grants of space it holds; the rest are refused for the leader to
//! revoke). Pure: no etcd, no clock.

use std::collections::BTreeMap;
use std::sync::Arc;

use corral_cluster::{
    ClusterConfig, Family, IpNet, Key, Keys, NodeIdOfNodeRecord, NodeIdPlanConfig, NodeName,
    NodePlan, ReleaseRecord, decode_value,
};
use corral_core::{PoolName, RangeSpec};

use corral_kv::{LeaseId, Revision};

use super::holdings;
use super::state::ClusterOptions;
use crate::link::cloud_pool::CloudEntry;

/// What the link keeps from one round to the next.
#[derive(Default)]
pub(super) struct AcrossRounds {
    /// The create revision of the registration this process made or found.
    pub(super) registration: Option<Revision>,
    /// The node ID and plan last read.
    pub(super) node_id: Option<u32>,
    /// The create revision of the node ID's grant (with `node_id`).
    pub(super) node_id_revision: Revision,
    pub(super) plan: Option<NodeIdPlanConfig>,
    pub(super) config: Option<Arc<ClusterConfig>>,
    /// Whether the round got as far as serving (its backoff then starts again).
    pub(super) served: bool,
    /// Whether this process ever held the node's liveness key.
    pub(super) live: bool,
    /// This process, as its liveness key names it.
    pub(super) identity: crate::link::liveness::ProcessIdentity,
    /// The liveness lease of the round that found the node removed: the drain keeps it.
    pub(super) live_lease: Option<LeaseId>,
    /// The agent's memory of etcd's time (`holdings.rs`), fed the revisions the link reads.
    pub(super) epoch: Option<Arc<holdings::EpochGuard>>,
    /// The highest revision the agent had seen before this round reached etcd (the one a
    /// regression showed, if lower), raised to the `reassert` key's mod revision when the
    /// round reads one: a grant made at or before it that the node does not hold is one it
    /// gave up, or one etcd may have handed back after another node got its space (`screen`).
    pub(super) seen_before: Revision,
    /// Grants this process took up (`owned/` key, create revision): taken up again whatever
    /// the node state holds now.
    pub(super) accepted: std::collections::BTreeSet<(String, Revision)>,
}

/// One grant of the node, as read from `owned/<node>/...`.
#[derive(Clone, Debug)]
pub(super) struct Grant {
    pub(super) pool: PoolName,
    pub(super) family: Family,
    pub(super) cidr: IpNet,
    /// The create revision of the `owned/` key, which the grant txn created with `grants/`.
    pub(super) revision: Revision,
}

/// One release handshake of the node, as read from `release/<node>/...`.
#[derive(Clone, Debug)]
pub(super) struct Release {
    pub(super) pool: PoolName,
    pub(super) family: Family,
    pub(super) cidr: IpNet,
    /// `None`: a value that cannot be read (answered as refused).
    pub(super) record: Option<ReleaseRecord>,
    pub(super) mod_revision: Revision,
}

/// What the node holds in the cluster, as read from etcd.
#[derive(Default)]
pub(super) struct Held {
    /// `owned/` key → grant.
    pub(super) grants: BTreeMap<String, Grant>,
    /// `release/` key → handshake.
    pub(super) releases: BTreeMap<String, Release>,
    /// `interfaces/<node>/` records, by interface ID.
    pub(super) cloud: BTreeMap<String, CloudEntry>,
    pub(super) node_id: Option<u32>,
    pub(super) plan: Option<NodeIdPlanConfig>,
    pub(super) config: Option<Arc<ClusterConfig>>,
    /// Whether `config-applied` (the configuration the leader installed) was read: it is
    /// followed from then on, and `config` (what someone stored, maybe refused) no more.
    pub(super) applied: bool,
    /// Grants not taken up (`screen`), by `owned/` key: not served.
    pub(super) refused: BTreeMap<String, corral_cluster::RefusedGrant>,
    /// The create revision of `node-id-of-node/<node>` (with `node_id`).
    pub(super) node_id_revision: Revision,
    /// The node ID not taken up (`screen`): its plan is not served.
    pub(super) refused_node_id: Option<corral_cluster::RefusedNodeId>,
    /// The leader's record of why it cannot serve the node (`owned/<node>/waiting`): what an
    /// ADD that waited in vain names as its cause.
    pub(super) waiting: Option<corral_cluster::WaitingRecord>,
}

impl Held {
    pub(super) fn apply(
        &mut self,
        keys: &Keys,
        node: &NodeName,
        key: &str,
        value: Option<&corral_kv::KeyValue>,
    ) {
        match keys.parse(key) {
            Ok(Key::Owned {
                node: owner,
                pool,
                family,
                cidr,
            }) if &owner == node => match value {
                Some(entry) => {
                    self.grants.insert(
                        key.to_owned(),
                        Grant {
                            pool,
                            family,
                            cidr,
                            revision: entry.create_revision,
                        },
                    );
                }
                None => {
                    self.grants.remove(key);
                }
            },
            Ok(Key::Waiting { node: owner }) if &owner == node => {
                self.waiting = value.and_then(|entry| {
                    decode_value::<corral_cluster::WaitingRecord>(&entry.value)
                        .map_err(|error| tracing::warn!(%key, %error, "a waiting record that does not decode"))
                        .ok()
                });
            }
            Ok(Key::Release {
                node: owner,
                pool,
                family,
                cidr,
            }) if &owner == node => match value {
                Some(entry) => {
                    let record = match decode_value::<ReleaseRecord>(&entry.value) {
                        Ok(record) => Some(record),
                        Err(error) => {
                            tracing::warn!(key, %error, "unreadable release record");
                            None
                        }
                    };
                    self.releases.insert(
                        key.to_owned(),
                        Release {
                            pool,
                            family,
                            cidr,
                            record,
                            mod_revision: entry.mod_revision,
                        },
                    );
                }
                None => {
                    self.releases.remove(key);
                }
            },
            Ok(Key::CloudInterface {
                node: owner,
                interface,
            }) if &owner == node => match value {
                Some(entry) => {
                    let record = decode_value::<corral_cluster::CloudInterfaceRecord>(&entry.value)
                        .map_err(|e| e.to_string());
                    if let Err(error) = &record {
                        tracing::warn!(key, %error, "unreadable cloud interface record");
                    }
                    self.cloud.insert(
                        interface.as_str().to_owned(),
                        CloudEntry {
                            record,
                            create_revision: entry.create_revision,
                            mod_revision: entry.mod_revision,
                        },
                    );
                }
                None => {
                    self.cloud.remove(interface.as_str());
                }
            },
            Ok(Key::NodeIdOfNode { node: owner }) if &owner == node => match value {
                None => self.node_id = None,
                Some(v) => match decode_value::<NodeIdOfNodeRecord>(&v.value) {
                    Ok(record) => {
                        self.node_id = Some(record.id);
                        self.node_id_revision = v.create_revision;
                    }
                    // Unreadable: what was held stays (its pod range is not dropped for it).
                    Err(error) => tracing::warn!(key, %error, "unreadable node ID record"),
                },
            },
            Ok(Key::ConfigApplied) => {
                match value.map(|v| decode_value::<corral_cluster::AppliedConfigRecord>(&v.value)) {
                    Some(Ok(record)) => {
                        self.applied = true;
                        self.plan = record.config.node_ids.clone();
                        self.config = Some(Arc::new(record.config));
                    }
                    // Unreadable (a configuration that breaks a rule does not decode) or deleted:
                    // what was held stays.
                    Some(Err(error)) => {
                        tracing::warn!(key, %error, "unreadable applied configuration")
                    }
                    None => {}
                }
            }
            // Before the leader installed one (a new cluster), the stored configuration; once
            // `config-applied` exists, a configuration written around the CLI that the leader
            // refused never moves this node's plan.
            Ok(Key::Config) if self.applied => {}
            Ok(Key::Config) => match value.map(|v| ClusterConfig::from_json(&v.value)) {
                Some(Ok(config)) => {
                    self.plan = config.node_ids.clone();
                    self.config = Some(Arc::new(config));
                }
                // A configuration this build cannot read changes nothing held.
                Some(Err(error)) => tracing::warn!(key, %error, "unreadable configuration"),
                None => {}
            },
            _ => {}
        }
    }

    pub(super) fn is_cloud_pool(&self, pool: &PoolName) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.pool(pool))
            .is_some_and(|p| p.is_cloud())
    }

    pub(super) fn is_block_pool(&self, pool: &PoolName) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.pool(pool))
            .is_some_and(|p| p.is_blocks())
    }

    /// The range the agent serves from a grant: a block pool's whole block, else the node
    /// CIDR with its gateway.
    pub(super) fn range_of(&self, grant: &Grant) -> Result<RangeSpec, corral_core::SpecError> {
        if self.is_block_pool(&grant.pool) {
            corral_cluster::block_range(grant.cidr)
        } else {
            corral_cluster::node_range(grant.cidr)
        }
    }

    /// The ranges the node's pools must hold.
    pub(super) fn ranges(&self) -> Vec<(PoolName, RangeSpec)> {
        let mut ranges: Vec<(PoolName, RangeSpec)> = Vec::new();
        for (key, grant) in &self.grants {
            if self.refused.contains_key(key) {
                continue;
            }
            match self.range_of(grant) {
                Ok(range) => ranges.push((grant.pool.clone(), range)),
                Err(error) => tracing::warn!(key, %error, "ignoring a grant"),
            }
        }
        if let (Some(id), Some(plan)) = (self.node_id, &self.plan)
            && self.refused_node_id.is_none()
            && let Ok(derived) = NodePlan::derive(plan, id)
            && let Ok(range) = derived.pod_range()
            && let Ok(pool) = PoolName::new(ClusterOptions::PLAN_POOL)
        {
            ranges.push((pool, range));
        }
        ranges
    }

    /// The families of each block pool of the configuration.
    pub(super) fn block_families(&self) -> BTreeMap<PoolName, Vec<Family>> {
        self.config
            .iter()
            .flat_map(|c| &c.pools)
            .filter(|p| p.is_blocks())
            .map(|p| (p.name.clone(), p.families().map(|(f, _)| f).collect()))
            .collect()
    }

    /// The grant of `pool` whose served range is `range`.
    pub(super) fn grant_of(&self, pool: &PoolName, range: &RangeSpec) -> Option<(&String, &Grant)> {
        self.grants.iter().find(|(_, g)| {
            &g.pool == pool
                && self
                    .range_of(g)
                    .is_ok_and(|r| r.start() == range.start() && r.end() == range.end())
        })
    }
}

/// Which grants the node takes up: one this process took up before, one made after the
/// highest revision the agent had seen before this round or after the last `reassert`
/// (`seen_before`), or one of space the node state holds (granted or draining: its own from before
/// a restart). Any other is space this node gave up that etcd handed back, or a grant from
/// before etcd went back in time that this node never took up (restored from a snapshot;
/// the space may be another node's by now): it is not served, and is asserted as refused
/// (`HoldingsRecord::refused`) for the leader to revoke.
pub(super) fn screen(
    held: &mut Held,
    across: &mut AcrossRounds,
    local: &std::collections::BTreeSet<(PoolName, IpNet)>,
) {
    let mut refused = BTreeMap::new();
    for (key, grant) in &held.grants {
        if across.accepted.contains(&(key.clone(), grant.revision)) {
            continue;
        }
        if grant.revision > across.seen_before || local.contains(&(grant.pool.clone(), grant.cidr))
        {
            across.accepted.insert((key.clone(), grant.revision));
            continue;
        }
        if !held.refused.contains_key(key) {
            tracing::warn!(
                cidr = %grant.cidr,
                pool = %grant.pool,
                revision = grant.revision,
                seen_before = across.seen_before,
                "not taking up a grant made before the revision this agent had seen, of space \
                 it does not hold (etcd handed back a grant this node gave up); the leader \
                 revokes it"
            );
        }
        refused.insert(
            key.clone(),
            corral_cluster::RefusedGrant {
                pool: grant.pool.clone(),
                cidr: grant.cidr,
                grant_revision: grant.revision,
            },
        );
    }
    held.refused = refused;
    // The node ID, judged the same way by its plan's pod range (unjudged until the plan is
    // known: nothing of it is served before).
    let mut node_id_key = None;
    held.refused_node_id = None;
    if let (Some(id), Some(plan)) = (held.node_id, &held.plan) {
        let key = format!("node-id/{id}");
        let revision = held.node_id_revision;
        let pod_range = corral_cluster::pod_subnet_of(plan, id);
        let holds = pod_range.is_some_and(|range| {
            PoolName::new(ClusterOptions::PLAN_POOL)
                .is_ok_and(|pool| local.contains(&(pool, range)))
        });
        if across.accepted.contains(&(key.clone(), revision))
            || revision > across.seen_before
            || holds
        {
            across.accepted.insert((key.clone(), revision));
        } else {
            tracing::warn!(
                node_id = id,
                revision,
                seen_before = across.seen_before,
                "not taking up a node ID granted before the revision this agent had seen, whose \
                 pod range is not held here (etcd handed back an ID this node gave up); the \
                 leader revokes it"
            );
            held.refused_node_id = Some(corral_cluster::RefusedNodeId { id, revision });
        }
        node_id_key = Some((key, revision));
    }
    // Only grants that still stand are remembered.
    across.accepted.retain(|(key, revision)| {
        held.grants
            .get(key)
            .is_some_and(|g| g.revision == *revision)
            || node_id_key.as_ref() == Some(&(key.clone(), *revision))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(pool: &str, cidr: &str, revision: Revision) -> (String, Grant) {
        let cidr: IpNet = cidr.parse().unwrap();
        (
            format!("owned/n/{pool}/{cidr}"),
            Grant {
                pool: PoolName::new(pool).unwrap(),
                family: if cidr.addr().is_ipv4() {
                    Family::V4
                } else {
                    Family::V6
                },
                cidr,
                revision,
            },
        )
    }

    #[test]
    fn a_node_id_is_taken_up_on_the_same_grounds_as_a_grant() {
        let plan = corral_cluster::testing::node_id_plan();
        let mut across = AcrossRounds {
            seen_before: 100,
            ..AcrossRounds::default()
        };
        let mut held = Held {
            node_id: Some(5),
            node_id_revision: 60,
            plan: Some(plan.clone()),
            ..Held::default()
        };
        // Granted before revision 100, its pod range not held here: refused, its plan not
        // served.
        screen(&mut held, &mut across, &Default::default());
        assert_eq!(
            held.refused_node_id,
            Some(corral_cluster::RefusedNodeId {
                id: 5,
                revision: 60
            })
        );
        assert!(held.ranges().is_empty());
        // Its pod range held here (the node's own from before a restart): taken up.
        let pod_range = corral_cluster::pod_subnet_of(&plan, 5).unwrap();
        let local = [(PoolName::new(ClusterOptions::PLAN_POOL).unwrap(), pod_range)]
            .into_iter()
            .collect();
        screen(&mut held, &mut across, &local);
        assert_eq!(held.refused_node_id, None);
        assert_eq!(held.ranges().len(), 1);
        // Granted anew after what was seen: taken up.
        held.node_id = Some(7);
        held.node_id_revision = 150;
        screen(&mut held, &mut across, &Default::default());
        assert_eq!(held.refused_node_id, None);
    }

    #[test]
    fn a_grant_is_taken_up_if_taken_before_made_after_what_was_seen_or_of_space_held() {
        let mut across = AcrossRounds {
            seen_before: 100,
            ..AcrossRounds::default()
        };
        let mut held = Held::default();
        // Made after revision 100: new, taken up. Made before, of space the node state holds (its
        // own from before a restart): taken up. Made before, of space not held: refused.
        for (key, g) in [
            grant("default", "10.0.1.0/24", 150),
            grant("default", "10.0.2.0/24", 40),
            grant("default", "10.0.3.0/24", 60),
        ] {
            held.grants.insert(key, g);
        }
        let local: std::collections::BTreeSet<(PoolName, IpNet)> = [(
            PoolName::new("default").unwrap(),
            "10.0.2.0/24".parse().unwrap(),
        )]
        .into_iter()
        .collect();
        screen(&mut held, &mut across, &local);
        let refused: Vec<String> = held.refused.values().map(|r| r.cidr.to_string()).collect();
        assert_eq!(refused, ["10.0.3.0/24"]);
        assert_eq!(held.refused.values().next().unwrap().grant_revision, 60);
        let served: Vec<String> = held
            .ranges()
            .iter()
            .map(|(_, r)| r.subnet_net().to_string())
            .collect();
        assert_eq!(served, ["10.0.1.0/24", "10.0.2.0/24"]);
        // A later round: what this process took up stays taken up, even if the node state dropped
        // it meanwhile (a drain while another process held the liveness key), and even with a
        // higher revision seen.
        across.seen_before = 1_000;
        screen(&mut held, &mut across, &Default::default());
        let refused: Vec<String> = held.refused.values().map(|r| r.cidr.to_string()).collect();
        assert_eq!(refused, ["10.0.3.0/24"]);
        // A grant that goes is forgotten: made again at the same place, it is judged anew.
        let (key, _) = grant("default", "10.0.1.0/24", 150);
        held.grants.remove(&key);
        screen(&mut held, &mut across, &Default::default());
        assert!(!across.accepted.iter().any(|(k, _)| k == &key));
        let (key, again) = grant("default", "10.0.1.0/24", 900);
        held.grants.insert(key, again);
        screen(&mut held, &mut across, &Default::default());
        let refused: Vec<String> = held.refused.values().map(|r| r.cidr.to_string()).collect();
        assert_eq!(refused, ["10.0.1.0/24", "10.0.3.0/24"]);
    }
}
