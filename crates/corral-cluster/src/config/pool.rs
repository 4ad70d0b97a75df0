//! A pool's configuration, typed per mode: what a node-cidr, blocks or cloud pool carries, and
//! nothing else (a `PoolConfig` cannot hold a field its mode does not have).
//!
//! The file and stored forms stay flat (`mode = "blocks"` beside `watermarks`, `cloud`, …):
//! `raw.rs` reads them and checks each pool into this form knowing its index, so a field of
//! another mode is refused with its path (`pools[3].cloud_sync`).

use std::collections::BTreeMap;

use corral_core::{Family, PoolName};

use super::{
    CloudPoolConfig, ConfigError, DEFAULT_RELEASE_DELAY_SECS, FamilyConfig, NodeCidrSync, PoolMode,
    WatermarkOverride, Watermarks, invalid,
};
use crate::keys::NodeName;

/// A pool of node CIDRs, blocks or cloud addresses, with at most one configuration per family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The pool's name (corral-core's `PoolName` rules).
    pub name: PoolName,
    /// The IPv4 node CIDRs, if the pool has that family.
    pub ipv4: Option<FamilyConfig>,
    /// The IPv6 node CIDRs, if the pool has that family.
    pub ipv6: Option<FamilyConfig>,
    /// How the pool's space reaches nodes, with that mode's settings; the mode is fixed once
    /// set.
    pub kind: PoolKind,
}

/// A pool's mode and the settings only that mode has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolKind {
    /// `mode = "node-cidr"` (the default): one node CIDR per node and family, at the family's
    /// `node_prefix_len` (nodeipam).
    NodeCidr {
        /// Node CIDRs synced with the cloud ([`NodeCidrSync`]); `None`: the cluster alone
        /// grants them.
        cloud_sync: Option<NodeCidrSync>,
    },
    /// `mode = "blocks"`: blocks granted on demand, each node kept between its watermarks.
    Blocks(DemandConfig),
    /// `mode = "cloud"`: addresses of cloud interfaces attached to each node's instance.
    Cloud(CloudPool),
}

/// What a blocks or cloud pool's nodes' holdings follow: watermarks, their per-node
/// overrides, the release delay and the pod cap. Each field is kept as written (left out:
/// `None` or empty), so the stored configuration reads back byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DemandConfig {
    /// The watermarks of every node (defaults: pre-allocate 8, the rest 0).
    pub watermarks: Option<Watermarks>,
    /// Per-node overrides of the watermarks, by node name.
    pub node_watermarks: BTreeMap<String, WatermarkOverride>,
    /// How long a block or address stays excess before the operator marks it for release, in
    /// seconds (default 180).
    pub release_delay_secs: Option<u64>,
    /// The most addresses a node holds in the pool, whatever its watermarks or warm targets
    /// ask (ipamd's max pods: the kubelet's `--max-pods`, or eni-max-pods); a node's own
    /// `--max-pods` (its registration) lowers it for that node. Growth stops once a node holds
    /// this many (a block or prefix may take it past, as ipamd's chunks do); the node is
    /// reported at capacity when the cap binds.
    pub max_pods: Option<u64>,
}

/// A cloud pool's settings: its demand and its `cloud` table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloudPool {
    /// Watermarks (or warm targets in `cloud`), release delay and pod cap.
    pub demand: DemandConfig,
    /// The `cloud` table as written (`None`: left out, every setting at its default).
    pub cloud: Option<CloudPoolConfig>,
}

impl PoolConfig {
    /// The pool's configured families, IPv4 first.
    pub fn families(&self) -> impl Iterator<Item = (Family, &FamilyConfig)> {
        families(&self.ipv4, &self.ipv6)
    }

    /// The configuration of one family, if the pool has it.
    pub fn family(&self, family: Family) -> Option<&FamilyConfig> {
        match family {
            Family::V4 => self.ipv4.as_ref(),
            Family::V6 => self.ipv6.as_ref(),
        }
    }

    /// The pool's mode.
    pub fn mode(&self) -> PoolMode {
        match self.kind {
            PoolKind::NodeCidr { .. } => PoolMode::NodeCidr,
            PoolKind::Blocks(_) => PoolMode::Blocks,
            PoolKind::Cloud(_) => PoolMode::Cloud,
        }
    }

    /// Whether the pool hands out blocks on demand.
    pub fn is_blocks(&self) -> bool {
        matches!(self.kind, PoolKind::Blocks(_))
    }

    /// Whether the pool hands out cloud interface addresses.
    pub fn is_cloud(&self) -> bool {
        matches!(self.kind, PoolKind::Cloud(_))
    }

    /// Whether the pool grants one node CIDR per node and family.
    pub fn is_node_cidr(&self) -> bool {
        matches!(self.kind, PoolKind::NodeCidr { .. })
    }

    /// A node-cidr pool's sync with the cloud, if any.
    pub fn cloud_sync(&self) -> Option<NodeCidrSync> {
        match self.kind {
            PoolKind::NodeCidr { cloud_sync } => cloud_sync,
            _ => None,
        }
    }

    /// A block pool's demand settings; `None` for other pools.
    pub fn blocks(&self) -> Option<&DemandConfig> {
        match &self.kind {
            PoolKind::Blocks(demand) => Some(demand),
            _ => None,
        }
    }

    /// A cloud pool's settings; `None` for other pools.
    pub fn cloud(&self) -> Option<&CloudPool> {
        match &self.kind {
            PoolKind::Cloud(cloud) => Some(cloud),
            _ => None,
        }
    }

    /// The demand settings of a pool whose nodes' holdings follow demand (blocks and cloud
    /// pools); `None` for a node-cidr pool.
    pub fn demand(&self) -> Option<&DemandConfig> {
        match &self.kind {
            PoolKind::NodeCidr { .. } => None,
            PoolKind::Blocks(demand) => Some(demand),
            PoolKind::Cloud(cloud) => Some(&cloud.demand),
        }
    }
}

impl DemandConfig {
    /// The watermarks a node's holdings follow: [`DemandConfig::watermarks_for`], with
    /// `max_allocate` lowered to the pod cap (the pool's `max_pods`, and `node_max_pods`, the
    /// node's own from its registration, whichever is lower).
    pub fn capped_watermarks_for(&self, node: &str, node_max_pods: Option<u64>) -> Watermarks {
        let mut watermarks = self.watermarks_for(node);
        let cap = [self.max_pods, node_max_pods]
            .into_iter()
            .flatten()
            .filter(|m| *m > 0)
            .min();
        if let Some(cap) = cap
            && (watermarks.max_allocate == 0 || cap < watermarks.max_allocate)
        {
            watermarks.max_allocate = cap;
        }
        watermarks
    }

    /// The watermarks of `node` in this pool: the pool's, with the node's overrides.
    pub fn watermarks_for(&self, node: &str) -> Watermarks {
        let base = self.watermarks.unwrap_or_default();
        match self.node_watermarks.get(node) {
            Some(over) => base.with(over),
            None => base,
        }
    }

    /// How long a block stays excess before it is marked for release, in milliseconds.
    pub fn release_delay_ms(&self) -> u64 {
        self.release_delay_secs
            .unwrap_or(DEFAULT_RELEASE_DELAY_SECS)
            .saturating_mul(1000)
    }

    /// Watermarks, their per-node overrides and the release delay (block and cloud pools).
    pub(super) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let base = self.watermarks.unwrap_or_default();
        base.validate(&format!("{path}.watermarks"))?;
        for (node, over) in &self.node_watermarks {
            let field = format!("{path}.node_watermarks.{node}");
            if NodeName::new(node).is_err() {
                return Err(invalid(field, "not a valid node name"));
            }
            base.with(over).validate(&field)?;
        }
        if self.release_delay_secs == Some(0) {
            return Err(invalid(
                format!("{path}.release_delay_secs"),
                "must be at least 1",
            ));
        }
        // The operator adds the delay to its clock, which cannot hold arbitrary durations.
        if self
            .release_delay_secs
            .is_some_and(|d| d > MAX_CLOUD_DELAY_SECS)
        {
            return Err(invalid(
                format!("{path}.release_delay_secs"),
                "must be at most a week (604800)",
            ));
        }
        Ok(())
    }
}

/// The longest GC interval of a cloud pool and release delay of any pool (a week): the
/// operator adds them to its clock, which cannot hold arbitrary durations.
const MAX_CLOUD_DELAY_SECS: u64 = 7 * 24 * 3600;

impl CloudPool {
    /// The pool's cloud settings, defaults where it gives none.
    pub fn settings(&self) -> CloudPoolConfig {
        self.cloud.clone().unwrap_or_default()
    }

    /// A cloud pool's own settings.
    pub(super) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let demand = &self.demand;
        demand.validate(path)?;
        let cloud = self.settings();
        if let Some(warm) = &cloud.warm {
            if demand.watermarks.is_some() || !demand.node_watermarks.is_empty() {
                return Err(invalid(
                    format!("{path}.cloud.warm"),
                    "use either watermarks or warm targets, not both",
                ));
            }
            if warm.warm_prefix.is_some() && !cloud.prefix_delegation {
                return Err(invalid(
                    format!("{path}.cloud.warm.warm_prefix"),
                    "needs prefix_delegation = true",
                ));
            }
        }
        if cloud.gc_interval_secs == 0 || cloud.gc_interval_secs > MAX_CLOUD_DELAY_SECS {
            return Err(invalid(
                format!("{path}.cloud.gc_interval_secs"),
                "must be at least 1 and at most a week (604800)",
            ));
        }
        if cloud.gc_max_per_run == 0 {
            return Err(invalid(
                format!("{path}.cloud.gc_max_per_run"),
                "must be at least 1",
            ));
        }
        for (k, id) in cloud.subnet_ids.iter().enumerate() {
            if crate::keys::CloudId::new(id).is_err() {
                return Err(invalid(
                    format!("{path}.cloud.subnet_ids[{k}]"),
                    "not a cloud ID",
                ));
            }
        }
        Ok(())
    }
}

/// The families given, IPv4 first.
pub(super) fn families<'a>(
    ipv4: &'a Option<FamilyConfig>,
    ipv6: &'a Option<FamilyConfig>,
) -> impl Iterator<Item = (Family, &'a FamilyConfig)> {
    [(Family::V4, ipv4), (Family::V6, ipv6)]
        .into_iter()
        .filter_map(|(family, config)| config.as_ref().map(|c| (family, c)))
}
