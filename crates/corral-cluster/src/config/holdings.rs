//! A candidate configuration against what nodes hold now: every grant must still fit it, so installing it frees no held space.
//!
//! `check_change` compares two configurations; this compares one with the grants themselves,
//! which is what matters when there is no earlier configuration to compare with (a fresh
//! leader reading a configuration written around the CLI) and catches what `check_change`
//! allows in general but not over a grant (a reserved range laid over it).

use std::fmt::Write as _;

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use super::{ClusterConfig, ConfigError, invalid};
use crate::net::{net_range, overlaps};

/// A grant held now (a `grants/` key), as the check sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldGrant {
    /// Its pool.
    pub pool: PoolName,
    /// Its family.
    pub family: Family,
    /// The CIDR.
    pub cidr: IpNet,
    /// The node it names (None when its value does not decode: the view keeps its addresses
    /// blocked, but `check_holdings` passes over it).
    pub node: Option<String>,
}

impl HeldGrant {
    fn describe(&self) -> String {
        match &self.node {
            Some(node) => format!("{} (node {node})", self.cidr),
            None => format!("{} (unreadable grant)", self.cidr),
        }
    }
}

type Broken<'a> = Vec<(String, &'static str, Vec<&'a HeldGrant>)>;

/// Notes a grant breaking `rule` of `field`.
fn note<'a>(broken: &mut Broken<'a>, field: String, rule: &'static str, grant: &'a HeldGrant) {
    if let Some(entry) = broken
        .iter_mut()
        .find(|(f, r, _)| *f == field && *r == rule)
    {
        entry.2.push(grant);
    } else {
        broken.push((field, rule, vec![grant]));
    }
}

/// At most this many grants are named in one refusal.
const NAMED: usize = 8;

fn list(grants: &[&HeldGrant]) -> String {
    let mut text = grants
        .iter()
        .take(NAMED)
        .map(|g| g.describe())
        .collect::<Vec<_>>()
        .join(", ");
    if grants.len() > NAMED {
        let _ = write!(text, " and {} more", grants.len() - NAMED);
    }
    text
}

impl ClusterConfig {
    /// The one rule every path that installs a configuration holds it to (`cluster apply`,
    /// and the leader's watch, resync, restart and failover): valid on its own, no change
    /// grants rest on against the last configuration installed (`check_change`, when there is
    /// one), and every grant and node ID held now fits it (`check_holdings`).
    pub fn check_install(
        last: Option<&ClusterConfig>,
        new: &ClusterConfig,
        grants: &[HeldGrant],
        node_ids: &[u32],
    ) -> Result<(), ConfigError> {
        new.validate()?;
        // The grants first: their refusal names what is held.
        new.check_holdings(grants, node_ids)?;
        match last {
            Some(last) => ClusterConfig::check_change(last, new),
            None => Ok(()),
        }
    }

    /// Refuses this configuration if a grant held now would not fit it: its pool and family
    /// not configured, its CIDR not at the family's node prefix length, outside the cluster
    /// CIDRs, or inside a reserved range; or a node ID granted beyond the plan (or with no
    /// plan). The error names the field and the grants (the first rule broken, up to eight
    /// grants). A cloud pool's addresses are not `grants/` keys and are not checked here, nor
    /// are grant keys whose value does not decode (garbage, reported by the view and `check`).
    pub fn check_holdings(
        &self,
        grants: &[HeldGrant],
        node_ids: &[u32],
    ) -> Result<(), ConfigError> {
        let mut unconfigured: Vec<&HeldGrant> = Vec::new();
        // (field, grants) per rule broken, in the order found.
        let mut broken: Broken<'_> = Vec::new();
        // A grant key whose value does not decode is garbage: reported, and its addresses kept
        // blocked by the view, but no holding a configuration could be refused over.
        for grant in grants.iter().filter(|g| g.node.is_some()) {
            let found = self
                .pools
                .iter()
                .enumerate()
                .find(|(_, p)| p.name == grant.pool)
                .and_then(|(i, p)| p.family(grant.family).map(|f| (i, p, f)));
            let Some((i, pool, family)) = found else {
                unconfigured.push(grant);
                continue;
            };
            if pool.is_cloud() {
                continue;
            }
            let path = format!("pools[{i}].{}", grant.family.name());
            if grant.cidr.prefix_len() != family.node_prefix_len {
                note(
                    &mut broken,
                    format!("{path}.node_prefix_len"),
                    "does not match the prefix length of grants",
                    grant,
                );
            }
            let (first, last) = net_range(&grant.cidr);
            if !family.cidrs.iter().any(|c| {
                let (c0, c1) = net_range(c);
                c0 <= first && last <= c1
            }) {
                note(
                    &mut broken,
                    format!("{path}.cidrs"),
                    "no longer covers grants",
                    grant,
                );
            }
            if let Some((k, _)) = family
                .reserved
                .iter()
                .enumerate()
                .find(|(_, r)| overlaps(r, &grant.cidr))
            {
                note(
                    &mut broken,
                    format!("{path}.reserved[{k}]"),
                    "lies over grants",
                    grant,
                );
            }
        }
        if !unconfigured.is_empty() {
            let mut pools: Vec<String> = unconfigured
                .iter()
                .map(|g| format!("{} {}", g.pool, g.family.name()))
                .collect();
            pools.sort();
            pools.dedup();
            return Err(invalid(
                "pools",
                format!(
                    "pool {} is not configured but holds grants {}: a pool or family nodes \
                     hold grants from cannot be removed or renamed",
                    pools.join(", "),
                    list(&unconfigured)
                ),
            ));
        }
        if let Some((field, rule, held)) = broken.first() {
            return Err(invalid(
                field.clone(),
                format!(
                    "{rule} {} (held space cannot be taken back by a configuration)",
                    list(held)
                ),
            ));
        }
        let max = self.max_node_id();
        let mut beyond: Vec<u32> = node_ids.iter().copied().filter(|id| *id > max).collect();
        beyond.sort_unstable();
        if !beyond.is_empty() {
            let named: Vec<String> = beyond.iter().take(NAMED).map(u32::to_string).collect();
            return Err(match &self.node_ids {
                None => invalid(
                    "node_ids",
                    format!(
                        "is not configured but node IDs {} are granted",
                        named.join(", ")
                    ),
                ),
                Some(_) => invalid(
                    "node_ids",
                    format!(
                        "the largest node ID would be {max}, but node IDs {} are granted",
                        named.join(", ")
                    ),
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{node_ids_toml, pool_toml};

    const CONFIG: &str = pool_toml!("default", "10.244.0.0/16", node_prefix_len = 24);

    fn grant(pool: &str, cidr: &str, node: &str) -> HeldGrant {
        let cidr: IpNet = cidr.parse().unwrap();
        HeldGrant {
            pool: PoolName::new(pool).unwrap(),
            family: crate::net::family_of(&cidr),
            cidr,
            node: Some(node.to_owned()),
        }
    }

    fn with(extra: &str) -> ClusterConfig {
        ClusterConfig::from_toml(&format!("{CONFIG}{extra}")).unwrap()
    }

    /// Why `config` refuses `grants` and `node_ids` (it must).
    fn refusal(config: &ClusterConfig, grants: &[HeldGrant], node_ids: &[u32]) -> String {
        config
            .check_holdings(grants, node_ids)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn grants_that_fit_pass() {
        let grants = [grant("default", "10.244.1.0/24", "a")];
        with("").check_holdings(&grants, &[]).unwrap();
        with("reserved = [\"10.244.2.0/24\"]\n")
            .check_holdings(&grants, &[])
            .unwrap();
    }

    #[test]
    fn a_reserved_range_over_grants_is_refused_naming_them() {
        let grants = [
            grant("default", "10.244.1.0/24", "a"),
            grant("default", "10.244.2.0/24", "b"),
            grant("default", "10.244.9.0/24", "c"),
        ];
        let error = refusal(&with("reserved = [\"10.244.0.0/22\"]\n"), &grants, &[]);
        assert!(error.contains("pools[0].ipv4.reserved[0]"), "{error}");
        assert!(
            error.contains("10.244.1.0/24 (node a), 10.244.2.0/24 (node b)"),
            "{error}"
        );
        assert!(!error.contains("node c"), "{error}");
    }

    #[test]
    fn a_renamed_pool_or_another_prefix_length_is_refused() {
        let grants = [grant("default", "10.244.1.0/24", "a")];
        let renamed = ClusterConfig::from_toml(&CONFIG.replace("\"default\"", "\"pods\"")).unwrap();
        let error = refusal(&renamed, &grants, &[]);
        assert!(error.contains("field pools:"), "{error}");
        assert!(
            error.contains("pool default ipv4 is not configured"),
            "{error}"
        );
        assert!(error.contains("10.244.1.0/24 (node a)"), "{error}");
        let longer = ClusterConfig::from_toml(&CONFIG.replace("= 24", "= 25")).unwrap();
        let error = refusal(&longer, &grants, &[]);
        assert!(error.contains("pools[0].ipv4.node_prefix_len"), "{error}");
        let moved =
            ClusterConfig::from_toml(&CONFIG.replace("10.244.0.0/16", "10.245.0.0/16")).unwrap();
        let error = refusal(&moved, &grants, &[]);
        assert!(error.contains("pools[0].ipv4.cidrs"), "{error}");
    }

    #[test]
    fn node_ids_beyond_the_plan_are_refused() {
        let error = refusal(&with(""), &[], &[3]);
        assert!(
            error.contains("node_ids: is not configured but node IDs 3"),
            "{error}"
        );
        let plan = concat!("\n", node_ids_toml!(), "max_node_id = 10\n");
        let config = with(plan);
        config.check_holdings(&[], &[1, 10]).unwrap();
        let error = refusal(&config, &[], &[12, 11]);
        assert!(error.contains("largest node ID would be 10"), "{error}");
        assert!(error.contains("11, 12"), "{error}");
    }
}
