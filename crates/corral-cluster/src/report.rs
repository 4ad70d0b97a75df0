//! What people and scrapers see of a cluster view: the status report (pools, nodes, the
//! leader), node reports, tables for the CLI and Prometheus text for the operator's
//! `/metrics`. Counts that can pass 2^53 (an IPv6 space) are decimal strings.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::plan::NodePlan;
use crate::space::SpaceStats;
use crate::view::ClusterView;

/// A count as a table prints it: as it is up to 12 digits; past that (an IPv6 space: a /64
/// holds 2^64 addresses, 20 digits) as a power of two when it is one or within a million of
/// one (`2^64`, `2^64-2`, `2^48+5`), else three significant digits, rounded down (`1.84e19`).
/// JSON keeps the exact decimal string. Anything that is not a decimal count is left as it is.
pub fn readable_count(decimal: &str) -> String {
    const MAX_EXACT_DIGITS: usize = 12;
    const NEAR: u128 = 1_000_000;
    if decimal.len() <= MAX_EXACT_DIGITS || !decimal.bytes().all(|b| b.is_ascii_digit()) {
        return decimal.to_owned();
    }
    let digits = decimal.trim_start_matches('0');
    if digits.len() <= MAX_EXACT_DIGITS {
        return if digits.is_empty() { "0" } else { digits }.to_owned();
    }
    // 2^128 (a whole IPv6 space) is one more than u128 holds.
    if digits == "340282366920938463463374607431768211456" {
        return "2^128".to_owned();
    }
    if let Ok(count) = digits.parse::<u128>() {
        let below = 127 - count.leading_zeros();
        let over = count - (1u128 << below);
        if over < NEAR {
            return if over == 0 {
                format!("2^{below}")
            } else {
                format!("2^{below}+{over}")
            };
        }
        // 2^(below+1) - count, written so that 2^128 need not be held.
        let under = (u128::MAX >> (127 - below)) - count + 1;
        if under < NEAR {
            return format!("2^{}-{under}", below + 1);
        }
    }
    format!("{}.{}e{}", &digits[..1], &digits[1..3], digits.len() - 1)
}

/// One pool and family of the status report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolReport {
    pub pool: String,
    pub family: String,
    pub node_prefix_len: u8,
    /// Node CIDRs in all, granted, quarantined, overlapping a reserved range, blocked (a key
    /// that is not a node CIDR of the pool, or space held without a grant), free (decimal
    /// strings). Free is capacity less the union of the rest: a node CIDR both granted and
    /// reserved is counted in both columns but once against free.
    pub capacity: String,
    pub granted: String,
    pub quarantined: String,
    #[serde(default)]
    pub reserved: String,
    #[serde(default)]
    pub blocked: String,
    pub free: String,
}

impl PoolReport {
    /// The row of one space, its counts as decimal strings.
    fn of(pool: String, family: &str, node_prefix_len: u8, stats: &SpaceStats) -> PoolReport {
        PoolReport {
            pool,
            family: family.to_owned(),
            node_prefix_len,
            capacity: stats.capacity.to_string(),
            granted: stats.granted.to_string(),
            quarantined: stats.quarantined.to_string(),
            reserved: stats.reserved.to_string(),
            blocked: stats.blocked.to_string(),
            free: stats.free.to_string(),
        }
    }
}

/// The cluster as one view sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The etcd revision the view is at.
    pub revision: i64,
    /// The replica that leads, if known.
    pub leader: Option<String>,
    pub nodes: usize,
    /// Registered nodes that hold everything the configuration grants.
    pub nodes_served: usize,
    /// Registered nodes that wait for something (`nodes - nodes_served`).
    #[serde(default)]
    pub nodes_waiting: usize,
    /// Pools and families (`pool/family`) where nodes wait for space that is not there, each
    /// naming every such node and why.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub full: std::collections::BTreeMap<String, String>,
    pub pools: Vec<PoolReport>,
    /// Node IDs granted and quarantined, and the plan's largest, in a node-ID cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ids: Option<PoolReport>,
    /// Removals asked for and not done yet.
    pub removals_pending: usize,
    /// What the view found wrong in etcd (garbage keys, conflicting grants), newest last.
    pub problems: Vec<String>,
}

/// One node.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub name: String,
    pub uid: String,
    /// The create revision of its registration.
    pub registered_revision: i64,
    /// Whether its agent's liveness key exists (absence means unreachable, never free).
    pub live: Option<bool>,
    /// `pool family cidr`, one per grant.
    pub grants: Vec<String>,
    pub node_id: Option<u32>,
    /// What it still lacks, as `pool family` (and `node-id`).
    pub waiting_for: Vec<String>,
    /// The same, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitReport>,
    pub removal_requested: bool,
    /// Block pools: the node's statistics per pool and family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<BlockReport>,
}

/// One thing a node waits for, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitReport {
    /// `pool family`, or `node-id`.
    pub what: String,
    /// `CIDR`, `block` or `node ID`.
    pub unit: String,
    /// Why: `no free block: the pool is exhausted`, `CIDR not granted yet`, ...
    pub reason: String,
    /// Whether it waits for space that is not there (the pool exhausted, or its only space
    /// in quarantine).
    pub starving: bool,
}

impl WaitReport {
    fn of(wait: &crate::view::NodeWait) -> WaitReport {
        WaitReport {
            what: wait.what(),
            unit: wait.unit.word().to_owned(),
            reason: wait.why(),
            starving: wait.is_starving(),
        }
    }
}

/// One node's blocks of one pool and family: Cilium's `Statistics` (in addresses) and the
/// blocks it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockReport {
    pub pool: String,
    pub family: String,
    /// Allocated on the node (its agent's last demand report).
    pub used: u64,
    /// Held: the addresses of its blocks, less those it surrendered.
    pub available: u64,
    /// The most it may hold (max-allocate in whole blocks; 0: no cap).
    pub capacity: u64,
    /// Still to grant to reach the watermarks.
    pub needed: u64,
    /// Held beyond what it keeps.
    pub excess: u64,
    /// Blocks held.
    pub blocks: u64,
    /// Blocks in a release handshake.
    pub in_handshake: u64,
    /// At max-allocate and still needing addresses.
    pub at_capacity: bool,
    /// Whether its agent reported demand.
    pub has_demand: bool,
}

impl BlockReport {
    /// `pool family: N blocks (H in handshake), used U of A, needed N, excess E`.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "{} {}: {} blocks, used {} of {}",
            self.pool, self.family, self.blocks, self.used, self.available
        );
        if self.in_handshake > 0 {
            let _ = write!(text, ", {} in handshake", self.in_handshake);
        }
        if self.needed > 0 {
            let _ = write!(text, ", needs {}", self.needed);
        }
        if self.excess > 0 {
            let _ = write!(text, ", excess {}", self.excess);
        }
        if self.at_capacity {
            let _ = write!(text, ", at capacity {}", self.capacity);
        }
        if !self.has_demand {
            text.push_str(", no demand reported");
        }
        text
    }
}

impl ClusterView {
    /// The status report at `revision`.
    pub fn status_report(&self, revision: i64, leader: Option<String>) -> StatusReport {
        let pools = self
            .space_stats()
            .into_iter()
            .map(|(pool, family, stats)| {
                let node_prefix_len = self
                    .space(&pool, family)
                    .map_or(0, |space| space.node_prefix_len());
                PoolReport::of(pool.to_string(), family.name(), node_prefix_len, &stats)
            })
            .collect();
        let node_ids = self
            .node_id_stats()
            .map(|stats| PoolReport::of("node-ids".to_owned(), "-", 0, &stats));
        let mut problems: Vec<String> = self
            .problems()
            .iter()
            .map(|p| format!("{}: {}", p.key, p.message))
            .collect();
        // The stored configuration refused stays a problem for as long as it is stored (the
        // problem list above may have been taken by the operator's log).
        if let Some(refusal) = self.config_refusal() {
            let line = format!("{}: {refusal}", self.keys().config());
            if !problems.contains(&line) {
                problems.push(line);
            }
        }
        problems.extend(
            self.consistency_problems()
                .iter()
                .map(|p| format!("{}: {}", p.key, p.message)),
        );
        let nodes = self.nodes().count();
        let waits = self.all_waits();
        StatusReport {
            revision,
            leader,
            nodes,
            nodes_served: nodes - waits.len(),
            nodes_waiting: waits.len(),
            full: crate::view::full_of(&waits),
            pools,
            node_ids,
            removals_pending: self.removals_requested().len(),
            problems,
        }
    }

    /// Every registered node; `live` names the nodes whose liveness key exists (pass `None`
    /// when it was not read).
    pub fn node_reports(&self, live: Option<&[String]>) -> Vec<NodeReport> {
        let removals: Vec<String> = self
            .removals_requested()
            .into_iter()
            .map(|(node, ..)| node.to_string())
            .collect();
        self.nodes()
            .map(|(name, entry)| {
                let waits = self.waits(name);
                let waiting_for: Vec<String> = waits.iter().map(|w| w.what()).collect();
                NodeReport {
                    name: name.to_string(),
                    uid: entry.record.uid.clone(),
                    registered_revision: entry.create_revision,
                    live: live.map(|live| live.iter().any(|n| n == name.as_str())),
                    grants: self
                        .grants_of(name)
                        .iter()
                        .map(|g| format!("{} {} {}", g.pool, g.family.name(), g.cidr))
                        .collect(),
                    node_id: self.node_id_of(name),
                    waiting_for,
                    waiting: waits.iter().map(WaitReport::of).collect(),
                    removal_requested: removals.iter().any(|n| n == name.as_str()),
                    blocks: self
                        .node_block_stats(name)
                        .into_iter()
                        .map(|b| BlockReport {
                            pool: b.pool.to_string(),
                            family: b.family.name().to_owned(),
                            used: b.stats.used,
                            available: b.stats.available,
                            capacity: b.stats.capacity,
                            needed: b.stats.needed,
                            excess: b.stats.excess,
                            blocks: b.blocks,
                            in_handshake: b.in_handshake,
                            at_capacity: b.at_capacity,
                            has_demand: b.has_demand,
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Prometheus text (without `# EOF`) for the operator's `/metrics`: nodes by state, node
    /// CIDRs per pool and family by state.
    pub fn metrics_text(&self) -> String {
        let mut text = String::new();
        let nodes = self.nodes().count();
        let served = self.served_nodes();
        let _ = writeln!(
            text,
            "# HELP corral_operator_nodes Registered nodes by state"
        );
        let _ = writeln!(text, "# TYPE corral_operator_nodes gauge");
        let _ = writeln!(text, "corral_operator_nodes{{state=\"served\"}} {served}");
        let _ = writeln!(
            text,
            "corral_operator_nodes{{state=\"waiting\"}} {}",
            nodes - served
        );
        let _ = writeln!(
            text,
            "corral_operator_nodes{{state=\"removing\"}} {}",
            self.removals_requested().len()
        );
        let _ = writeln!(
            text,
            "# HELP corral_operator_cidrs Node CIDRs per pool and family by state"
        );
        let _ = writeln!(text, "# TYPE corral_operator_cidrs gauge");
        for (pool, family, stats) in self.space_stats() {
            for (state, value) in [
                ("granted", stats.granted),
                ("quarantined", stats.quarantined),
                ("reserved", stats.reserved),
                ("blocked", stats.blocked),
                ("free", stats.free),
            ] {
                // A gauge is a float: an IPv6 space's count is approximate past 2^53.
                let _ = writeln!(
                    text,
                    "corral_operator_cidrs{{pool=\"{pool}\",family=\"{}\",state=\"{state}\"}} {}",
                    family.name(),
                    value as f64
                );
            }
        }
        let _ = writeln!(
            text,
            "# HELP corral_operator_problems What the view found wrong in etcd"
        );
        let _ = writeln!(text, "# TYPE corral_operator_problems gauge");
        let _ = writeln!(text, "corral_operator_problems {}", self.problems().len());
        text
    }
}

impl StatusReport {
    /// Aligned text for people.
    pub fn to_table(&self) -> String {
        let mut text = String::new();
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let _ = writeln!(
            text,
            "revision {}, leader {}, {} ({} served, {} waiting), {} pending",
            self.revision,
            self.leader.as_deref().unwrap_or("none"),
            plural(self.nodes, "node", "nodes"),
            self.nodes_served,
            self.nodes_waiting,
            plural(self.removals_pending, "removal", "removals")
        );
        let _ = writeln!(
            text,
            "{:<16} {:<6} {:>6} {:>22} {:>12} {:>12} {:>12} {:>12} {:>22}",
            "POOL",
            "FAMILY",
            "PREFIX",
            "CAPACITY",
            "GRANTED",
            "QUARANTINED",
            "RESERVED",
            "BLOCKED",
            "FREE"
        );
        for p in self.pools.iter().chain(&self.node_ids) {
            let _ = writeln!(
                text,
                "{:<16} {:<6} {:>6} {:>22} {:>12} {:>12} {:>12} {:>12} {:>22}",
                p.pool,
                p.family,
                if p.node_prefix_len > 0 {
                    format!("/{}", p.node_prefix_len)
                } else {
                    "-".to_owned()
                },
                readable_count(&p.capacity),
                readable_count(&p.granted),
                readable_count(&p.quarantined),
                readable_count(&p.reserved),
                readable_count(&p.blocked),
                readable_count(&p.free)
            );
        }
        for (pool, nodes) in &self.full {
            let _ = writeln!(text, "full: {pool}: {nodes}");
        }
        for problem in &self.problems {
            let _ = writeln!(text, "problem: {problem}");
        }
        text
    }
}

impl NodeReport {
    /// Aligned text for people.
    pub fn table(nodes: &[NodeReport]) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "{:<24} {:<5} {:>7} {:<44} WAITING FOR",
            "NODE", "LIVE", "NODE-ID", "GRANTS"
        );
        for node in nodes {
            let live = match node.live {
                Some(true) => "yes",
                Some(false) => "no",
                None => "?",
            };
            let id = node.node_id.map_or("-".to_owned(), |id| id.to_string());
            // A block pool's grants are summed up (a node may hold many blocks).
            let mut grants: Vec<String> = node
                .grants
                .iter()
                .filter(|g| {
                    !node
                        .blocks
                        .iter()
                        .any(|b| g.starts_with(&format!("{} {} ", b.pool, b.family)))
                })
                .cloned()
                .collect();
            grants.extend(node.blocks.iter().map(|b| {
                format!(
                    "{} {} {} blocks{}",
                    b.pool,
                    b.family,
                    b.blocks,
                    if b.at_capacity { " (at capacity)" } else { "" }
                )
            }));
            let grants = if grants.is_empty() {
                "-".to_owned()
            } else {
                grants.join(", ")
            };
            // With why when known (a report of an older version has only `waiting_for`).
            let mut waiting = if node.waiting.is_empty() {
                node.waiting_for.join(", ")
            } else {
                node.waiting
                    .iter()
                    .map(|w| format!("{} ({})", w.what, w.reason))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if node.removal_requested {
                waiting = "removal requested".to_owned();
            }
            let _ = writeln!(
                text,
                "{:<24} {live:<5} {id:>7} {grants:<44} {waiting}",
                node.name
            );
        }
        text
    }
}

impl NodePlan {
    /// Aligned text for people.
    pub fn to_table(&self) -> String {
        let mut text = String::new();
        let rows: [(&str, String); 12] = [
            ("node id", self.node_id.to_string()),
            ("pod subnet", self.pod_subnet.to_string()),
            ("pod gateway", self.pod_gateway.to_string()),
            ("nat loopback", self.nat_loopback.to_string()),
            (
                "pod range",
                format!("{}-{}", self.pod_range_start, self.pod_range_end),
            ),
            ("host interconnect", self.host_interconnect.to_string()),
            ("  vpp end", self.host_interconnect_vpp.to_string()),
            ("  linux end", self.host_interconnect_linux.to_string()),
            (
                "node ip",
                format!("{} in {}", self.node_ip, self.node_interconnect),
            ),
            ("vxlan ip", format!("{} in {}", self.vxlan_ip, self.vxlan)),
            ("service network", self.service.to_string()),
            ("", String::new()),
        ];
        for (name, value) in rows.iter().filter(|(name, _)| !name.is_empty()) {
            let _ = writeln!(text, "{name:<18} {value}");
        }
        text
    }

    /// The pod range as a range of the agent's pool: the pod subnet, hosts from
    /// `pod_range_start` to `pod_range_end`, the pod gateway as its gateway.
    pub fn pod_range(&self) -> Result<corral_core::RangeSpec, corral_core::SpecError> {
        corral_core::RangeSpec::new(
            self.pod_subnet,
            Some(self.pod_range_start),
            Some(self.pod_range_end),
            Some(self.pod_gateway),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::readable_count;

    #[test]
    fn counts_up_to_twelve_digits_print_as_they_are() {
        for count in ["0", "1", "65536", "4294967296", "999999999999"] {
            assert_eq!(readable_count(count), count);
        }
    }

    #[test]
    fn an_ipv6_space_prints_near_its_power_of_two() {
        assert_eq!(readable_count("18446744073709551616"), "2^64");
        assert_eq!(readable_count("18446744073709551614"), "2^64-2");
        assert_eq!(readable_count("18446744073709551617"), "2^64+1");
        assert_eq!(readable_count("1208925819614629174706176"), "2^80");
        assert_eq!(
            readable_count("340282366920938463463374607431768211456"),
            "2^128"
        );
        assert_eq!(
            readable_count("340282366920938463463374607431768211455"),
            "2^128-1"
        );
    }

    #[test]
    fn other_large_counts_print_three_digits_and_an_exponent() {
        // 2^64 * 3 / 4, far from any power of two.
        assert_eq!(readable_count("13835058055282163712"), "1.38e19");
        assert_eq!(readable_count("1000000000000"), "1.00e12");
    }

    #[test]
    fn what_is_not_a_count_is_left_alone() {
        assert_eq!(readable_count("-"), "-");
        assert_eq!(readable_count("12345678901234x"), "12345678901234x");
    }
}
