//! From-cloud pools in the view (`cloud_sync = "from-cloud"`): their grants and quarantines
//! per pool and family, the input of `cloud::plan_from_cloud`. The view keeps a space for them
//! like any node-cidr pool (so an overlapping grant is refused and reported), but never proposes
//! from it: `needs` leaves them out.

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use super::ClusterView;
use crate::config::NodeCidrSync;
use crate::keys::NodeName;

impl ClusterView {
    /// Whether `pool` takes its node CIDRs from the cloud.
    pub fn is_from_cloud_pool(&self, pool: &PoolName) -> bool {
        self.config
            .pool(pool)
            .is_some_and(|p| p.cloud_sync() == Some(NodeCidrSync::FromCloud))
    }

    /// The families of every from-cloud pool.
    pub fn from_cloud_families(&self) -> Vec<(PoolName, Family)> {
        self.config
            .pools
            .iter()
            .filter(|p| p.cloud_sync() == Some(NodeCidrSync::FromCloud))
            .flat_map(|p| p.families().map(|(family, _)| (p.name.clone(), family)))
            .collect()
    }

    /// The grants of one pool and family whose value decodes: CIDR → (node, the grant key's
    /// create revision).
    pub fn pool_grants(&self, pool: &PoolName, family: Family) -> BTreeMap<IpNet, (NodeName, i64)> {
        self.grants
            .iter()
            .filter(|((p, f, _), _)| p == pool && *f == family)
            .filter_map(|((_, _, cidr), entry)| {
                entry
                    .record
                    .as_ref()
                    .map(|r| (*cidr, (r.node.clone(), entry.create_revision)))
            })
            .collect()
    }

    /// The quarantined CIDRs of one pool and family.
    pub fn quarantined_cidrs(&self, pool: &PoolName, family: Family) -> BTreeSet<IpNet> {
        self.quarantines
            .keys()
            .filter(|(p, f, _)| p == pool && *f == family)
            .map(|(_, _, cidr)| *cidr)
            .collect()
    }
}
