//! `corral cluster check`: the cluster invariant verified from the keys alone, by code that
//! shares nothing with the operator's view (a checker built on the code it checks proves
//! little): every key parses and every value decodes; granted CIDRs are pairwise disjoint,
//! inside their pool at its node prefix length, clear of reserved and quarantined ranges;
//! `grants/` and `owned/` match both ways; every grant names a registered node under its
//! current registration; a node holds at most one CIDR per pool and family of a node-CIDR pool
//! (any number of blocks in a block pool, any number of delegated prefixes in a from-cloud
//! pool); every release key names a current grant of its node
//! (the grant's create revision is its `grant_revision`); node IDs are one-to-one, inside the
//! plan and not quarantined. Cloud pools ([`cloud`]): every `interfaces/` record names a cloud
//! pool and a registered node, its addresses lie in the pool's CIDRs, no address is on two
//! records, a node's records have distinct device indexes, and release keys name an address of
//! the node's record; [`cloud_problems`] compares the records with the cloud's own view.

mod cloud;
mod holdings;
mod parse;

pub use cloud::{CloudTruth, cloud_problems};
pub use holdings::holdings_problems;
pub use parse::Entry;

use std::collections::{BTreeMap, BTreeSet};

use corral_core::{Family, PoolName, RangeSpec};
use ipnet::IpNet;

use crate::config::ClusterConfig;
use crate::keys::{Key, Keys, NodeName, ReleaseState};
use crate::net::net_range;
use crate::plan::NodePlan;
use parse::{Parsed, overlapping, overlaps, parse, span};

/// Checks the cluster's keys (as read at one revision); answers one sentence per problem.
pub fn check(keys: &Keys, entries: &[Entry]) -> Vec<String> {
    let mut problems = Vec::new();
    let parsed = parse(keys, entries, &mut problems);
    // Pairwise disjoint per family, whatever the pool.
    let grants = parsed.grants.iter().map(|g| (g.1, &g.2, &g.3.node));
    for (other, other_node, cidr, node) in overlapping(grants) {
        problems.push(format!(
            "{other} (node {other_node}) and {cidr} (node {node}) overlap"
        ));
    }
    let mut per_node: BTreeMap<(&NodeName, &PoolName, Family), usize> = BTreeMap::new();
    for (pool, family, cidr, record) in &parsed.grants {
        *per_node.entry((&record.node, pool, *family)).or_default() += 1;
        match parsed.pool(pool).and_then(|p| p.family(*family)) {
            None => problems.push(format!(
                "grant {cidr} is in pool {pool} {family}, which the configuration does not have"
            )),
            Some(config) => {
                if cidr.prefix_len() != config.node_prefix_len {
                    problems.push(format!(
                        "grant {cidr} is not a /{} of pool {pool}",
                        config.node_prefix_len
                    ));
                }
                let (first, last) = span(cidr);
                if !config.cidrs.iter().any(|c| {
                    let (c0, c1) = span(c);
                    c0 <= first && last <= c1
                }) {
                    problems.push(format!(
                        "grant {cidr} is outside pool {pool}'s cluster CIDRs"
                    ));
                }
                for reserved in &config.reserved {
                    if overlaps(cidr, reserved) {
                        problems.push(format!("grant {cidr} overlaps reserved {reserved}"));
                    }
                }
            }
        }
        for (q_pool, q_family, q_cidr) in &parsed.quarantined {
            if q_family == family && overlaps(cidr, q_cidr) {
                problems.push(format!(
                    "grant {cidr} (node {}) overlaps {q_cidr}, quarantined in pool {q_pool}",
                    record.node
                ));
            }
        }
        match parsed.nodes.get(&record.node) {
            None => problems.push(format!(
                "grant {cidr} names node {}, which is not registered",
                record.node
            )),
            Some((revision, uid)) if *revision != record.node_revision || *uid != record.uid => {
                problems.push(format!(
                    "grant {cidr} was made for an earlier registration of node {} \
                     (revision {}, uid {}; now revision {revision}, uid {uid})",
                    record.node, record.node_revision, record.uid
                ))
            }
            Some(_) => {}
        }
        if !parsed
            .owned
            .contains(&(record.node.clone(), pool.clone(), *family, *cidr))
        {
            problems.push(format!(
                "grant {cidr} of node {} has no owned key",
                record.node
            ));
        }
    }
    let is_blocks = |pool: &PoolName| parsed.pool(pool).is_some_and(|p| p.is_blocks());
    let is_cloud = |pool: &PoolName| parsed.pool(pool).is_some_and(|p| p.is_cloud());
    // A from-cloud pool's node holds what the cloud delegated to its instance (IPv4: several
    // /28s), each still a node CIDR under every other rule.
    let is_from_cloud = |pool: &PoolName| {
        parsed
            .pool(pool)
            .is_some_and(|p| p.cloud_sync() == Some(crate::config::NodeCidrSync::FromCloud))
    };
    for ((node, pool, family), count) in per_node {
        if count > 1 && !is_blocks(pool) && !is_from_cloud(pool) {
            problems.push(format!(
                "node {node} holds {count} CIDRs of pool {pool} {family}"
            ));
        }
    }
    let granted: BTreeSet<(&NodeName, &PoolName, Family, &IpNet)> = parsed
        .grants
        .iter()
        .map(|(pool, family, cidr, record)| (&record.node, pool, *family, cidr))
        .collect();
    for (node, pool, family, cidr) in &parsed.owned {
        if !granted.contains(&(node, pool, *family, cidr)) {
            problems.push(format!("owned key {cidr} of node {node} has no grant"));
        }
    }
    for ((node, pool, family, cidr), record) in &parsed.releases {
        let grant = parsed
            .grants
            .iter()
            .find(|(p, f, c, r)| p == pool && f == family && c == cidr && &r.node == node);
        let revision = parsed
            .grant_revisions
            .get(&(pool.clone(), *family, *cidr))
            .copied();
        if is_cloud(pool) {
            problems.extend(cloud::release_problem(
                &parsed, node, pool, *family, cidr, record,
            ));
        } else if !is_blocks(pool) {
            problems.push(format!(
                "release key of {cidr} (node {node}) is in pool {pool}, which is neither a \
                 block pool nor a cloud pool"
            ));
        } else if grant.is_none() {
            problems.push(format!(
                "release key of {cidr} (node {node}, {}) names no grant of that node",
                record.state.name()
            ));
        } else if revision != Some(record.grant_revision) {
            problems.push(format!(
                "release key of {cidr} (node {node}) names grant revision {}, the grant's is {}",
                record.grant_revision,
                revision.unwrap_or(0)
            ));
        }
    }
    let max_id = parsed.config.as_ref().map(ClusterConfig::max_node_id);
    for (id, node) in &parsed.ids {
        if parsed.id_of_node.get(node) != Some(id) {
            problems.push(format!(
                "node ID {id} names node {node}, whose own key says otherwise"
            ));
        }
        if !parsed.nodes.contains_key(node) {
            problems.push(format!(
                "node ID {id} names node {node}, which is not registered"
            ));
        }
        if parsed.quarantined_ids.contains(id) {
            problems.push(format!("node ID {id} is granted and quarantined at once"));
        }
        if *id == 0 || max_id.is_some_and(|max| *id > max) {
            problems.push(format!("node ID {id} is outside the plan"));
        }
    }
    for (node, id) in &parsed.id_of_node {
        if parsed.ids.get(id) != Some(node) {
            problems.push(format!(
                "node {node} says it has ID {id}, which is not granted to it"
            ));
        }
    }
    problems.extend(cloud::record_problems(&parsed));
    problems.extend(cloud::delegation_problems(&parsed));
    problems
}

/// The cluster's keys parsed once for judging agents against them (`corral cluster check
/// --agent`): one parse however many agents are checked.
pub struct AgentCheck {
    parsed: Parsed,
}

impl std::fmt::Debug for AgentCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentCheck")
            .field("grants", &self.parsed.grants.len())
            .finish_non_exhaustive()
    }
}

impl AgentCheck {
    /// `entries` parsed (what does not parse is [`check`]'s to report).
    pub fn new(keys: &Keys, entries: &[Entry]) -> AgentCheck {
        let mut ignored = Vec::new();
        AgentCheck {
            parsed: parse(keys, entries, &mut ignored),
        }
    }

    /// The ranges an agent of `node` must hold as its cluster ranges: its grants in node-CIDR
    /// pools, and its plan's pod range (in pool `plan_pool`) in a node-ID cluster (block pools:
    /// [`AgentCheck::block_problems`]).
    pub fn expected_ranges(&self, node: &str, plan_pool: &PoolName) -> Vec<(PoolName, RangeSpec)> {
        let parsed = &self.parsed;
        let is_blocks = |pool: &PoolName| parsed.pool(pool).is_some_and(|p| p.is_blocks());
        let mut ranges: Vec<(PoolName, RangeSpec)> = parsed
            .grants
            .iter()
            .filter(|g| g.3.node.as_str() == node && !is_blocks(&g.0))
            .filter_map(|(pool, _, cidr, _)| Some((pool.clone(), node_range(*cidr).ok()?)))
            .collect();
        let plan = parsed.config.as_ref().and_then(|c| c.node_ids.as_ref());
        let id = parsed
            .id_of_node
            .iter()
            .find(|(n, _)| n.as_str() == node)
            .map(|(_, id)| *id);
        if let (Some(plan), Some(id)) = (plan, id)
            && let Ok(derived) = NodePlan::derive(plan, id)
            && let Ok(range) = derived.pod_range()
        {
            ranges.push((plan_pool.clone(), range));
        }
        ranges
    }

    /// Every granted CIDR with the node holding it (for checking what agents hold against it).
    pub fn granted_cidrs(&self) -> impl Iterator<Item = (&IpNet, &NodeName)> {
        self.parsed
            .grants
            .iter()
            .map(|(_, _, cidr, record)| (cidr, &record.node))
    }

    /// Whether `pool` is a block pool in the configuration the keys hold.
    pub fn is_block_pool(&self, pool: &str) -> bool {
        self.parsed
            .config
            .as_ref()
            .and_then(|c| c.pools.iter().find(|p| p.name.as_str() == pool))
            .is_some_and(|p| p.is_blocks())
    }

    /// An agent's active cluster ranges in block pools (`held`: pool and range text) against the
    /// node's blocks: each must be the [`block_range`] of a block granted to the node in that
    /// pool, and each block granted to it that it does not hold must be surrendered (its release
    /// key `marked` or `ready`: the agent gives a block up before it answers). Anything else is a
    /// problem, one sentence each.
    pub fn block_problems(&self, node: &str, held: &[(String, String)]) -> Vec<String> {
        let parsed = &self.parsed;
        let Some(config) = parsed.config.as_ref() else {
            return Vec::new();
        };
        let blocks: Vec<(&PoolName, Family, &IpNet, String)> = parsed
            .grants
            .iter()
            .filter(|(pool, _, _, record)| {
                record.node.as_str() == node && config.pool(pool).is_some_and(|p| p.is_blocks())
            })
            .filter_map(|(pool, family, cidr, _)| {
                Some((pool, *family, cidr, block_range(*cidr).ok()?.to_string()))
            })
            .collect();
        let mut problems = Vec::new();
        for (pool, range) in held {
            if !config
                .pools
                .iter()
                .any(|p| p.name.as_str() == pool && p.is_blocks())
            {
                continue;
            }
            let Some((_, family, cidr, _)) = blocks
                .iter()
                .find(|(p, _, _, r)| p.as_str() == pool && r == range)
            else {
                problems.push(format!(
                    "node {node} holds {range} in block pool {pool}, which is not granted to it"
                ));
                continue;
            };
            // `ready` says the agent surrendered the block: it must not serve it any more (the
            // leader may release it at any moment).
            let ready = parsed.releases.iter().any(|((n, p, f, c), record)| {
                n.as_str() == node
                    && p.as_str() == pool
                    && f == family
                    && c == *cidr
                    && record.state == ReleaseState::Ready
            });
            if ready {
                problems.push(format!(
                    "node {node} serves block {cidr} of pool {pool}, which it answered ready to release"
                ));
            }
        }
        for (pool, family, cidr, range) in &blocks {
            let held_it = held
                .iter()
                .any(|(p, r)| p.as_str() == pool.as_str() && r == range);
            if held_it {
                continue;
            }
            let release = parsed
                .releases
                .iter()
                .find(|((n, p, f, c), _)| {
                    n.as_str() == node && p == *pool && f == family && c == *cidr
                })
                .map(|(_, record)| record.state);
            if !matches!(release, Some(ReleaseState::Marked | ReleaseState::Ready)) {
                problems.push(format!(
                    "node {node} does not hold block {cidr} of pool {pool}, granted to it and not surrendered ({})",
                    release.map_or("no release key", ReleaseState::name)
                ));
            }
        }
        problems
    }
}

/// The range an agent serves from a granted node CIDR: the whole CIDR with its first host as
/// the gateway (host-local's default, and what a bridge on the node takes), handed out from
/// the host after it. A CIDR too small for a gateway (/31, /32; /127, /128) has none.
pub fn node_range(cidr: IpNet) -> Result<RangeSpec, corral_core::SpecError> {
    let (first, last) = net_range(&cidr);
    let family = crate::net::family_of(&cidr);
    if last.saturating_sub(first) < 3 {
        return RangeSpec::subnet(cidr);
    }
    RangeSpec::new(
        cidr,
        None,
        None,
        Some(crate::net::addr_of(family, first + 1)),
    )
}

/// The range an agent serves from a granted block of a block-mode pool: the whole block, no
/// gateway (pods of block pools are routed per address, as Calico's), every address but an
/// IPv4 block's network and broadcast address handed out.
pub fn block_range(cidr: IpNet) -> Result<RangeSpec, corral_core::SpecError> {
    RangeSpec::subnet(cidr)
}

/// How many addresses an agent hands out from a block ([`block_range`]'s size).
pub fn block_capacity(cidr: IpNet) -> u64 {
    block_range(cidr).map_or(0, |spec| u64::try_from(spec.size()).unwrap_or(u64::MAX))
}

/// What one agent serves, as `corral cluster check --agent` reads it: where it answers, the
/// node it serves, its cluster ranges (draining ones included: their pods keep their
/// addresses) as (pool, CIDR), and the addresses allocated in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHoldings {
    /// How the agent is named in problems (its socket).
    pub agent: String,
    pub node: String,
    pub ranges: Vec<(String, IpNet)>,
    pub addresses: Vec<std::net::IpAddr>,
}

/// Problems between agents, one sentence each: two agents serving one node (the same node
/// name: a cloned machine, a copied state directory), two agents whose cluster ranges overlap,
/// and an address allocated on two agents.
pub fn agents_problems(agents: &[AgentHoldings]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        for b in &agents[i + 1..] {
            if a.node == b.node {
                problems.push(format!(
                    "agents {} and {} both serve node {}: one node, one live agent (a cloned \
                     machine or a copied state directory?)",
                    a.agent, b.agent, a.node
                ));
            }
            for (pool_a, range_a) in &a.ranges {
                for (pool_b, range_b) in &b.ranges {
                    if overlaps(range_a, range_b) {
                        problems.push(format!(
                            "agent {} (node {}) holds {range_a} in pool {pool_a} and agent {} \
                             (node {}) holds {range_b} in pool {pool_b}: they overlap",
                            a.agent, a.node, b.agent, b.node
                        ));
                    }
                }
            }
            for address in a.addresses.iter().filter(|x| b.addresses.contains(x)) {
                problems.push(format!(
                    "{address} is allocated on agent {} (node {}) and on agent {} (node {})",
                    a.agent, a.node, b.agent, b.node
                ));
            }
        }
    }
    problems
}

/// Whether an `election/` key (with its lease; `None`: not on a lease) is a candidate of the
/// operators' election: on a lease, and named after it. Any other key would never go away
/// with a replica, so the replicas pass it over.
pub fn election_candidate(keys: &Keys, key: &str, lease: Option<i64>) -> bool {
    match keys.parse(key) {
        Ok(Key::Election { lease: named }) => {
            lease.is_some_and(|l| l != 0 && u64::try_from(l).is_ok_and(|l| l == named))
        }
        _ => false,
    }
}

/// The replica that leads: the value of the candidate ([`election_candidate`]) created first;
/// `entries` are (key, lease, create revision, value) as read. `None` while no replica campaigns.
pub fn election_leader<'a, K: AsRef<str>>(
    keys: &Keys,
    entries: impl IntoIterator<Item = (K, Option<i64>, i64, &'a [u8])>,
) -> Option<String> {
    entries
        .into_iter()
        .filter(|(key, lease, ..)| election_candidate(keys, key.as_ref(), *lease))
        .min_by_key(|(_, _, created, _)| *created)
        .map(|(.., value)| String::from_utf8_lossy(value).into_owned())
}

/// The `election/` keys that are not candidates ([`election_candidate`]), one sentence each:
/// `entries` are (key, lease) as read.
pub fn election_problems(keys: &Keys, entries: &[(String, Option<i64>)]) -> Vec<String> {
    entries
        .iter()
        .filter(|(key, lease)| !election_candidate(keys, key, *lease))
        .map(|(key, lease)| match lease.filter(|l| *l != 0) {
            None => format!(
                "election key {key} is not on a lease (written by hand?): no replica counts it \
                 as a candidate; delete it (etcdctl del {key})"
            ),
            Some(lease) => format!(
                "election key {key} is on lease {lease:x}, not the one its name says: no replica \
                 counts it as a candidate; delete it (etcdctl del {key})"
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AppliedConfigRecord;
    use crate::keys::{ClusterName, GrantRecord, OwnedRecord, encode_value};
    use crate::tests::{Cluster, assert_reported, net, pool_toml};

    const BLOCKS: &str = concat!(
        pool_toml!(
            "pods",
            mode = "blocks",
            "10.0.0.0/24",
            block_prefix_len = 28
        ),
        pool_toml!("nodes", "10.1.0.0/16", node_prefix_len = 24),
    );

    /// The leader is the candidate created first; keys not on the lease their name says, or on
    /// no lease, lead nothing however early they were written.
    #[test]
    fn the_leader_is_the_first_created_candidate_never_a_key_written_by_hand() {
        let keys = Keys::new(ClusterName::new("t").unwrap());
        let (a, b) = (keys.election(0xa), keys.election(0xb));
        let by_hand = format!("{}x", keys.election_prefix());
        let entries = [
            (by_hand.as_str(), None, 1, b"by-hand".as_slice()),
            (a.as_str(), Some(0xb), 2, b"wrong-lease".as_slice()),
            (b.as_str(), Some(0xb), 3, b"op-b".as_slice()),
        ];
        assert_eq!(election_leader(&keys, entries), Some("op-b".into()));
        let none: [(&str, Option<i64>, i64, &[u8]); 0] = [];
        assert_eq!(election_leader(&keys, none), None);
    }

    fn cluster() -> Cluster {
        let mut cluster = Cluster::with_config(BLOCKS);
        cluster.node("a", None);
        cluster
    }

    impl Cluster {
        /// A grant of IPv4 `cidr` in `pool` to node `a`, and its `owned` key.
        fn grant(&mut self, pool: &str, cidr: &str) -> i64 {
            let node = NodeName::new("a").unwrap();
            let pool = PoolName::new(pool).unwrap();
            let record = GrantRecord {
                node: node.clone(),
                uid: "u".into(),
                node_revision: 2,
                granted_ms: None,
            };
            let revision = self.add(
                self.keys.grant(&pool, Family::V4, &net(cidr)),
                encode_value(&record).unwrap(),
            );
            self.add(
                self.keys.owned(&node, &pool, Family::V4, &net(cidr)),
                encode_value(&OwnedRecord { node_revision: 2 }).unwrap(),
            );
            revision
        }
    }

    /// Issue 20: a configuration written around the CLI is judged as the leader judges it:
    /// against `config-applied` and the grants. The grants are checked against the one in
    /// force; the refused one is one problem; no configuration at all is one too.
    #[test]
    fn a_stored_configuration_the_leader_refuses_is_a_problem_and_the_applied_one_rules() {
        let mut c = cluster();
        c.grant("nodes", "10.1.0.0/24");
        let applied = AppliedConfigRecord {
            config_revision: 1,
            config: ClusterConfig::from_toml(BLOCKS).unwrap(),
        };
        c.add(c.keys.config_applied(), encode_value(&applied).unwrap());
        assert_eq!(c.check(), Vec::<String>::new());
        let renamed = ClusterConfig::from_toml(&BLOCKS.replace("\"nodes\"", "\"hosts\""))
            .unwrap()
            .to_json()
            .unwrap();
        c.entries[0].1 = renamed.into_bytes();
        let problems = c.check();
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].contains("is not applied"), "{problems:#?}");
        assert!(
            problems[0].contains("10.1.0.0/24 (node a)"),
            "{problems:#?}"
        );
        assert!(problems[0].contains("stays in force"), "{problems:#?}");
        c.entries.remove(0);
        let problems = c.check();
        assert!(
            problems.iter().any(|p| p.contains("has no configuration")),
            "{problems:#?}"
        );
    }

    #[test]
    fn many_blocks_per_node_are_fine_and_release_keys_must_name_a_current_grant() {
        let mut c = cluster();
        let first = c.grant("pods", "10.0.0.0/28");
        c.grant("pods", "10.0.0.16/28");
        c.grant("nodes", "10.1.0.0/24");
        c.release("a", "pods", "10.0.0.0/28", ReleaseState::Marked, first);
        assert_eq!(c.check(), Vec::<String>::new());
        // A second node CIDR of a node-CIDR pool is still a problem.
        c.grant("nodes", "10.1.1.0/24");
        assert_eq!(c.check().len(), 1, "{:?}", c.check());
        let mut c = cluster();
        let first = c.grant("pods", "10.0.0.0/28");
        c.release("a", "pods", "10.0.0.0/28", ReleaseState::Ready, first + 100);
        c.release("a", "pods", "10.0.0.32/28", ReleaseState::Marked, first);
        c.release("a", "nodes", "10.1.0.0/24", ReleaseState::Marked, first);
        let problems = c.check();
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert_reported(
            &problems,
            &[
                "names grant revision",
                "names no grant",
                "neither a block pool",
            ],
        );
    }

    #[test]
    fn a_from_cloud_node_may_hold_several_node_cidrs_each_still_a_node_cidr() {
        let mut c = cluster();
        let config = BLOCKS.replace(
            "name = \"nodes\"\n",
            "name = \"nodes\"\ncloud_sync = \"from-cloud\"\n",
        );
        let config = ClusterConfig::from_toml(
            &config.replace("node_prefix_len = 24", "node_prefix_len = 28"),
        )
        .unwrap();
        c.entries[0].1 = config.to_json().unwrap().into_bytes();
        c.grant("nodes", "10.1.0.0/28");
        c.grant("nodes", "10.1.0.16/28");
        assert_eq!(c.check(), Vec::<String>::new());
        // Every other rule holds: the length, the pool's CIDRs, the owned key.
        c.grant("nodes", "10.1.1.0/24");
        c.grant("nodes", "10.9.0.0/28");
        let problems = c.check();
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert_reported(&problems, &["is not a /28", "outside pool nodes"]);
        let expected = AgentCheck::new(&c.keys, &c.entries)
            .expected_ranges("a", &PoolName::new("plan").unwrap());
        assert_eq!(expected.len(), 4);
    }

    #[test]
    fn an_agent_holds_its_blocks_or_has_surrendered_them() {
        let mut c = cluster();
        let first = c.grant("pods", "10.0.0.0/28");
        let second = c.grant("pods", "10.0.0.16/28");
        c.grant("pods", "10.0.0.32/28");
        c.grant("nodes", "10.1.0.0/24");
        let range = |cidr: &str| block_range(net(cidr)).unwrap().to_string();
        let held = |cidrs: &[&str]| -> Vec<(String, String)> {
            cidrs
                .iter()
                .map(|c| ("pods".to_owned(), range(c)))
                .chain([("nodes".to_owned(), "ignored here".to_owned())])
                .collect()
        };
        let all = held(&["10.0.0.0/28", "10.0.0.16/28", "10.0.0.32/28"]);
        assert!(
            AgentCheck::new(&c.keys, &c.entries)
                .block_problems("a", &all)
                .is_empty()
        );
        assert!(AgentCheck::new(&c.keys, &c.entries).is_block_pool("pods"));
        assert!(!AgentCheck::new(&c.keys, &c.entries).is_block_pool("nodes"));
        // Not granted; and two blocks not held, one surrendered (ready), one not.
        let mut odd = held(&["10.0.0.32/28"]);
        odd.push(("pods".to_owned(), range("10.0.0.64/28")));
        c.release("a", "pods", "10.0.0.0/28", ReleaseState::Ready, first);
        c.release("a", "pods", "10.0.0.16/28", ReleaseState::Refused, second);
        let problems = AgentCheck::new(&c.keys, &c.entries).block_problems("a", &odd);
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems.iter().any(|p| p.contains("10.0.0.64/28")));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("10.0.0.16/28") && p.contains("refused"))
        );
        // Serving a block it answered ready for is a problem (the leader may release it).
        let mut serving = held(&["10.0.0.0/28", "10.0.0.32/28"]);
        serving.push(("pods".to_owned(), range("10.0.0.16/28")));
        let problems = AgentCheck::new(&c.keys, &c.entries).block_problems("a", &serving);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].contains("10.0.0.0/28") && problems[0].contains("ready"));
        // Node-CIDR pools are left to `AgentCheck::expected_ranges`, which leaves block pools out.
        let expected = AgentCheck::new(&c.keys, &c.entries)
            .expected_ranges("a", &PoolName::new("plan").unwrap());
        assert_eq!(expected.len(), 1);
        assert_eq!(expected[0].0.as_str(), "nodes");
    }

    #[test]
    fn two_agents_serving_one_node_or_one_range_or_address_are_problems() {
        let agent = |agent: &str, node: &str, ranges: &[&str], addresses: &[&str]| AgentHoldings {
            agent: agent.into(),
            node: node.into(),
            ranges: ranges
                .iter()
                .map(|r| ("default".to_owned(), net(r)))
                .collect(),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        };
        let a = agent("a.sock", "node-a", &["10.1.1.0/24"], &["10.1.1.2"]);
        let b = agent("b.sock", "node-b", &["10.1.2.0/24"], &["10.1.2.2"]);
        assert!(agents_problems(&[a.clone(), b.clone()]).is_empty());
        // A clone: the same node, the same range, the same address.
        let clone = agent("c.sock", "node-a", &["10.1.1.0/24"], &["10.1.1.2"]);
        let problems = agents_problems(&[a.clone(), b.clone(), clone]);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].contains("both serve node node-a"),
            "{problems:#?}"
        );
        assert!(problems[1].contains("overlap") && problems[1].contains("10.1.1.0/24"));
        assert!(problems[2].contains("10.1.1.2 is allocated on agent a.sock"));
        // Another node over a part of the range (a removed node's draining range).
        let inside = agent("d.sock", "node-d", &["10.1.2.128/25"], &[]);
        let problems = agents_problems(&[b, inside]);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        // Families never overlap.
        let v6 = agent("e.sock", "node-e", &["fd00::/64"], &[]);
        assert!(agents_problems(&[a, v6]).is_empty());
    }

    #[test]
    fn election_keys_not_on_their_lease_are_not_candidates() {
        let keys = Keys::new(ClusterName::new("t").unwrap());
        let key = keys.election(0xab);
        assert!(election_candidate(&keys, &key, Some(0xab)));
        assert!(!election_candidate(&keys, &key, None));
        assert!(!election_candidate(&keys, &key, Some(0)));
        assert!(!election_candidate(&keys, &key, Some(0xac)));
        assert!(!election_candidate(&keys, &keys.config(), Some(0xab)));
        let problems = election_problems(
            &keys,
            &[
                (key.clone(), Some(0xab)),
                (keys.election(0x1), None),
                (keys.election(0x2), Some(0x3)),
            ],
        );
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].contains("/corral/t/v1/election/1 is not on a lease"));
        assert!(problems[1].contains("election/2 is on lease 3"));
    }
}
