//! What a node waits for, and why, from the view alone (so the leader's API and the CLI, which
//! reads etcd, say the same): a node CIDR it lacks in a node-CIDR pool, blocks the node
//! manager's decision (`crate::blocks::plan`) would grant it in a block pool, a node ID. Each
//! wait says whether space is free for it (not granted yet) or not (the pool exhausted, or its
//! only space in quarantine): a node waiting for space that is not there is *starving*, and
//! `full` names every starving node per pool and family.
//!
//! The leader publishes its decision per node (`owned/<node>/waiting`, a [`WaitingRecord`])
//! from the same waits, plus what only it knows (granting paused, a cloud instance at its
//! limit): [`ClusterView::waiting_changes`] says which records to put or delete.

use std::collections::BTreeMap;

use corral_core::{Family, PoolName};

use super::ClusterView;
use crate::blocks;
use crate::keys::{NodeName, QuarantineState, WaitingCause, WaitingEntry, WaitingRecord};
use crate::space::SpaceStats;

/// What a node lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitUnit {
    /// A node CIDR of a node-CIDR pool.
    Cidr,
    /// Blocks of a block pool.
    Block,
    /// A node ID of the node-ID plan.
    NodeId,
    /// Addresses of a cloud pool.
    Address,
}

impl WaitUnit {
    /// The word people read: `CIDR`, `block`, `node ID`.
    pub fn word(self) -> &'static str {
        match self {
            WaitUnit::Cidr => "CIDR",
            WaitUnit::Block => "block",
            WaitUnit::NodeId => "node ID",
            WaitUnit::Address => "address",
        }
    }
}

/// Why a node still lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// Space is free (or a proposal of the node is in flight): the leader grants it next.
    NotGranted,
    /// No free space, and none in quarantine: the pool is exhausted.
    Exhausted,
    /// No free space; this many come back when their quarantine ends.
    Quarantined(u128),
    /// A cloud pool: the node's instance is at its limit of interfaces and addresses (the
    /// leader's cloud node manager says so in its published record).
    AtCapacity,
}

/// One thing a node waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeWait {
    /// The pool (`None` for a node ID).
    pub pool: Option<PoolName>,
    /// The family (IPv4 for a node ID).
    pub family: Family,
    pub unit: WaitUnit,
    pub reason: WaitReason,
    /// How many node IDs the plan has (node IDs only).
    pub max_ids: u32,
}

impl NodeWait {
    /// Whether the node waits for space that is not there.
    pub fn is_starving(&self) -> bool {
        self.reason != WaitReason::NotGranted
    }

    /// `pool family` (or `node-id`), as `waiting_for` has always named it.
    pub fn what(&self) -> String {
        match &self.pool {
            Some(pool) => format!("{pool} {}", self.family.name()),
            None => "node-id".to_owned(),
        }
    }

    /// Why, in words fitting the pool's mode: `no free block: the pool is exhausted`, `no free
    /// CIDR: 2 in quarantine`, `block not granted yet`.
    pub fn why(&self) -> String {
        let unit = self.unit.word();
        match self.reason {
            WaitReason::NotGranted => format!("{unit} not granted yet"),
            WaitReason::Exhausted if self.unit == WaitUnit::NodeId => {
                format!("no free {unit}: all {} in use", self.max_ids)
            }
            WaitReason::Exhausted => format!("no free {unit}: the pool is exhausted"),
            WaitReason::Quarantined(n) => format!(
                "no free {unit}: the only space is in quarantine ({n} {unit}{})",
                if n == 1 { "" } else { "s" }
            ),
            WaitReason::AtCapacity => "no more addresses: the node's instance is at its limit \
                                       of interfaces and addresses (or no subnet has room)"
                .to_owned(),
        }
    }

    /// The key of the operator's `full` map: `pool/family` (`node-ids (max N)/ipv4` for node
    /// IDs, as the leader has always noted them).
    pub fn full_key(&self) -> String {
        match &self.pool {
            Some(pool) => format!("{pool}/{}", self.family),
            None => format!("node-ids (max {})/{}", self.max_ids, Family::V4),
        }
    }
}

impl NodeWait {
    /// The entry of a published [`WaitingRecord`] (`until_ms`: when the first of the
    /// quarantined space comes back, if known).
    pub fn entry(&self, until_ms: Option<u64>) -> WaitingEntry {
        let (cause, quarantined) = match self.reason {
            WaitReason::NotGranted => (WaitingCause::NotGranted, 0),
            WaitReason::Exhausted => (WaitingCause::Exhausted, 0),
            WaitReason::Quarantined(n) => (
                WaitingCause::Quarantined,
                u64::try_from(n).unwrap_or(u64::MAX),
            ),
            WaitReason::AtCapacity => (WaitingCause::AtCapacity, 0),
        };
        WaitingEntry {
            pool: self.pool.clone(),
            family: self.family,
            unit: self.unit.word().to_owned(),
            cause,
            quarantined,
            until_ms: until_ms.filter(|_| cause == WaitingCause::Quarantined),
            why: self.why(),
        }
    }
}

/// Why a space with nothing free for the node has nothing: exhausted, or quarantined.
fn no_space(stats: &SpaceStats) -> WaitReason {
    if stats.quarantined > 0 {
        WaitReason::Quarantined(stats.quarantined)
    } else {
        WaitReason::Exhausted
    }
}

impl ClusterView {
    /// What a registered node waits for, and why: node CIDRs it lacks, blocks the decision
    /// would grant it, a node ID, and addresses of a cloud pool its instance has no room for
    /// (only the leader knows that: read from its published record). Empty for a served node.
    pub fn waits(&self, node: &NodeName) -> Vec<NodeWait> {
        let mut out = self.own_waits(node);
        let published = self.stored_waiting(node).into_iter().flat_map(|r| &r.waits);
        out.extend(
            published
                .filter(|w| w.cause == WaitingCause::AtCapacity)
                .map(|w| NodeWait {
                    pool: w.pool.clone(),
                    family: w.family,
                    unit: WaitUnit::Address,
                    reason: WaitReason::AtCapacity,
                    max_ids: 0,
                }),
        );
        out
    }

    /// [`Self::waits`] from the view's own keys (not the leader's published record: the
    /// leader's decision is made from these, so an old record never feeds itself).
    fn own_waits(&self, node: &NodeName) -> Vec<NodeWait> {
        let mut out = Vec::new();
        let in_flight = self.in_flight.contains_key(node);
        let needs = self.needs(node);
        let reason =
            |pool: &PoolName, family: Family, in_flight: bool| match self.space(pool, family) {
                _ if in_flight => WaitReason::NotGranted,
                Some(space) if space.lowest_free().is_some() => WaitReason::NotGranted,
                Some(space) => no_space(&space.stats()),
                None => WaitReason::Exhausted,
            };
        for (pool, family) in &needs.cidrs {
            out.push(NodeWait {
                pool: Some(pool.clone()),
                family: *family,
                unit: WaitUnit::Cidr,
                reason: reason(pool, *family, in_flight),
                max_ids: 0,
            });
        }
        let blocks_in_flight = self.block_in_flight.contains_key(node);
        for (pool, family) in self.block_pool_families() {
            let held = self.held_blocks(node, &pool, family, |_| 0);
            let Some(input) = self.block_input(node, &pool, family, &held, None, 0) else {
                continue;
            };
            if blocks::plan(&input).grant == 0 {
                continue;
            }
            out.push(NodeWait {
                reason: reason(&pool, family, blocks_in_flight),
                pool: Some(pool),
                family,
                unit: WaitUnit::Block,
                max_ids: 0,
            });
        }
        if needs.node_id {
            let space = self.id_space.as_ref();
            let reason = match space {
                _ if in_flight => WaitReason::NotGranted,
                Some(space) if space.lowest_free().is_some() => WaitReason::NotGranted,
                Some(space) => no_space(&space.stats()),
                None => WaitReason::Exhausted,
            };
            out.push(NodeWait {
                pool: None,
                family: Family::V4,
                unit: WaitUnit::NodeId,
                reason,
                max_ids: space.map_or(0, |s| s.max()),
            });
        }
        out
    }

    /// What every waiting registered node waits for, in one pass (a node that waits for
    /// nothing is left out): the count, `full` and the metrics' categories all read it.
    pub fn all_waits(&self) -> BTreeMap<&NodeName, Vec<NodeWait>> {
        self.nodes
            .keys()
            .map(|node| (node, self.waits(node)))
            .filter(|(_, waits)| !waits.is_empty())
            .collect()
    }

    /// When the first quarantined range of a pool and family (or, with `pool` `None`, the
    /// first quarantined node ID) leaves quarantine, in milliseconds since the epoch: its
    /// `since_ms` plus the configured quarantine time (a range still held by a removed node,
    /// `waiting`, has no end yet).
    pub fn quarantine_until(&self, pool: Option<&PoolName>, family: Family) -> Option<u64> {
        let quarantine_ms = self.config.quarantine_secs.saturating_mul(1000);
        let ends = |e: &super::QuarantineEntry| {
            e.record
                .as_ref()
                .filter(|r| r.state == QuarantineState::Quarantined)
                .map(|r| r.since_ms.saturating_add(quarantine_ms))
        };
        match pool {
            Some(pool) => self
                .quarantines
                .iter()
                .filter(|((p, f, _), _)| p == pool && *f == family)
                .filter_map(|(_, e)| ends(e))
                .min(),
            None => self.quarantined_ids.values().filter_map(ends).min(),
        }
    }

    /// The leader's decision about a node, as it publishes it (without its time): `None` when
    /// the node is served, or waits only for space the leader grants next. `paused`: granting
    /// is paused cluster-wide, and why; `more`: waits only the caller knows (a cloud instance
    /// at its limit).
    pub fn waiting_decision(
        &self,
        node: &NodeName,
        paused: Option<&str>,
        more: &[WaitingEntry],
    ) -> Option<WaitingRecord> {
        if !self.nodes.contains_key(node) {
            return None;
        }
        let mut waits: Vec<WaitingEntry> = self
            .own_waits(node)
            .iter()
            .map(|w| w.entry(self.quarantine_until(w.pool.as_ref(), w.family)))
            .collect();
        waits.extend(more.iter().cloned());
        let removing = self.removals.contains_key(node);
        let starving = waits.iter().any(|w| w.cause != WaitingCause::NotGranted);
        if waits.is_empty() || !(starving || paused.is_some() || removing) {
            return None;
        }
        Some(WaitingRecord {
            since_ms: 0,
            waits,
            paused: paused.map(str::to_owned),
            removing,
        })
    }

    /// The published decision of a node as stored (`owned/<node>/waiting`), if it decodes.
    pub fn stored_waiting(&self, node: &NodeName) -> Option<&WaitingRecord> {
        self.waiting_records.get(node).and_then(Option::as_ref)
    }

    /// The `owned/<node>/waiting` records to put (`Some`) or delete (`None`) so the stored ones
    /// say the leader's decision ([`Self::waiting_decision`]) for every node: only where the
    /// decision changed, keeping `since_ms` while the node still waits (`now_ms` for a new
    /// one). `more`: per node, waits only the caller knows.
    pub fn waiting_changes(
        &self,
        paused: Option<&str>,
        more: &BTreeMap<NodeName, Vec<WaitingEntry>>,
        now_ms: u64,
    ) -> Vec<(NodeName, Option<WaitingRecord>)> {
        let mut out = Vec::new();
        for node in self.nodes.keys() {
            let extra = more.get(node).map_or(&[][..], Vec::as_slice);
            let decided = self.waiting_decision(node, paused, extra);
            let stored = self.waiting_records.get(node);
            match (decided, stored) {
                (None, None) => {}
                (None, Some(_)) => out.push((node.clone(), None)),
                (Some(mut record), stored) => {
                    let old = stored.and_then(Option::as_ref);
                    if old.is_some_and(|old| old.same_decision(&record)) {
                        continue;
                    }
                    record.since_ms = old.map_or(now_ms, |old| old.since_ms);
                    out.push((node.clone(), Some(record)));
                }
            }
        }
        // A record of a node no longer registered goes too.
        for node in self.waiting_records.keys() {
            if !self.nodes.contains_key(node) {
                out.push((node.clone(), None));
            }
        }
        out
    }

    /// Registered nodes that wait for something (see [`Self::waits`]).
    pub fn waiting_nodes(&self) -> usize {
        self.all_waits().len()
    }

    /// Every pool and family (or the node IDs) with starving nodes, keyed as the operator's
    /// `full` (`pool/family`), each naming every starving node: `no free block for 2 nodes
    /// (node-a, node-b): the pool is exhausted`.
    pub fn full(&self) -> BTreeMap<String, String> {
        full_of(&self.all_waits())
    }
}

/// [`ClusterView::full`] of waits already worked out ([`ClusterView::all_waits`]).
pub(crate) fn full_of(waits: &BTreeMap<&NodeName, Vec<NodeWait>>) -> BTreeMap<String, String> {
    let mut starving: BTreeMap<String, (NodeWait, Vec<&NodeName>)> = BTreeMap::new();
    for (node, node_waits) in waits {
        for wait in node_waits.iter().filter(|w| w.is_starving()) {
            starving
                .entry(wait.full_key())
                .or_insert_with(|| (wait.clone(), Vec::new()))
                .1
                .push(*node);
        }
    }
    starving
        .into_iter()
        .map(|(key, (wait, nodes))| {
            let why = wait.why();
            let cause = why.split_once(": ").map_or(why.as_str(), |(_, c)| c);
            let names: Vec<&str> = nodes.iter().map(|n| n.as_str()).collect();
            let count = match names.len() {
                1 => "1 node".to_owned(),
                n => format!("{n} nodes"),
            };
            let text = format!(
                "no free {} for {count} ({}): {cause}",
                wait.unit.word(),
                names.join(", ")
            );
            (key, text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{DemandRecord, FamilyDemand, encode_value};
    use crate::keys::{QuarantineRecord, QuarantineState};
    use crate::tests::{ViewFixture, pods, pool_toml};

    /// A block pool of two /28 blocks beside a node-CIDR pool of two /24s.
    const CONFIG: &str = concat!(
        pool_toml!("cidrs", "10.1.0.0/23", node_prefix_len = 24),
        pool_toml!(
            "pods",
            mode = "blocks",
            "10.0.0.0/27",
            block_prefix_len = 28
        ),
    );

    impl ViewFixture {
        /// The node's agent reports `used` addresses of the block pool in use.
        fn demand(&mut self, node: &NodeName, used: u64) {
            let record = DemandRecord {
                ipv4: Some(FamilyDemand {
                    used,
                    ..Default::default()
                }),
                ipv6: None,
                at_ms: 0,
            };
            let key = self.view.keys().demand(node, &pods());
            self.put(&key, &encode_value(&record).unwrap());
        }

        /// Grants the node everything it lacks that is free (as the leader would).
        fn grant(&mut self, node: &NodeName) {
            if let Ok(p) = self.view.propose(node) {
                self.revision += 1;
                self.view.commit(&p, self.revision);
            }
            if let Ok(p) = self.view.propose_blocks(node, &pods(), Family::V4, 1) {
                self.revision += 1;
                self.view.commit_blocks(&p, self.revision);
            }
        }

        fn reasons(&self, node: &NodeName) -> Vec<String> {
            self.view
                .waits(node)
                .iter()
                .map(|w| format!("{}: {}", w.what(), w.why()))
                .collect()
        }
    }

    #[test]
    fn a_node_with_no_block_in_an_exhausted_block_pool_waits_starving_and_is_named_in_full() {
        let mut f = ViewFixture::new(CONFIG);
        let a = f.register("a");
        let b = f.register("b");
        let c = f.register("c");
        let d = f.register("d");
        // Before any grant: every node waits, with space free.
        assert_eq!(
            f.reasons(&a),
            [
                "cidrs ipv4: CIDR not granted yet",
                "pods ipv4: block not granted yet"
            ]
        );
        assert!(f.view.full().is_empty());
        for node in [&a, &b, &c, &d] {
            f.grant(node);
        }
        // Two /24s and two /28s: a and b are served, c and d starve in both pools.
        assert!(f.view.waits(&a).is_empty() && f.view.waits(&b).is_empty());
        assert_eq!(
            f.reasons(&c),
            [
                "cidrs ipv4: no free CIDR: the pool is exhausted",
                "pods ipv4: no free block: the pool is exhausted"
            ]
        );
        assert_eq!((f.view.served_nodes(), f.view.waiting_nodes()), (2, 2));
        let full = f.view.full();
        assert_eq!(
            full.get("pods/ipv4").map(String::as_str),
            Some("no free block for 2 nodes (c, d): the pool is exhausted")
        );
        assert_eq!(
            full.get("cidrs/ipv4").map(String::as_str),
            Some("no free CIDR for 2 nodes (c, d): the pool is exhausted")
        );
        let report = f.view.status_report(1, None);
        assert_eq!((report.nodes_served, report.nodes_waiting), (2, 2));
        assert!(
            report.to_table().contains("4 nodes (2 served, 2 waiting)"),
            "{}",
            report.to_table()
        );
        let nodes = f.view.node_reports(None);
        assert_eq!(nodes[2].waiting_for, ["cidrs ipv4", "pods ipv4"]);
        assert!(nodes[2].waiting.iter().all(|w| w.starving));
        let table = crate::NodeReport::table(&nodes);
        assert!(
            table.contains("pods ipv4 (no free block: the pool is exhausted)"),
            "{table}"
        );
        // A live starving node is its own block category.
        for node in [&a, &b, &c, &d] {
            let key = f.view.keys().live(node);
            f.put(
                &key,
                b"{\"schema\":1,\"pid\":1,\"version\":\"t\",\"started_ms\":0}",
            );
        }
        let metrics = f.view.block_metrics_text();
        assert!(
            metrics.contains("corral_operator_block_nodes{category=\"starving\"} 2"),
            "{metrics}"
        );
        assert!(
            metrics.contains("corral_operator_block_nodes{category=\"ok\"} 2"),
            "{metrics}"
        );
        let metrics = f.view.metrics_text();
        assert!(
            metrics.contains("corral_operator_nodes{state=\"waiting\"} 2"),
            "{metrics}"
        );
    }

    #[test]
    fn a_node_whose_demand_outgrows_its_block_waits_and_one_within_its_watermarks_does_not() {
        let mut f = ViewFixture::new(CONFIG);
        let a = f.register("a");
        let b = f.register("b");
        f.grant(&a);
        f.grant(&b);
        f.demand(&a, 2);
        assert!(f.view.waits(&a).is_empty(), "{:?}", f.reasons(&a));
        // Its block (14 addresses) full: the decision asks for another, and none is free.
        f.demand(&a, 14);
        assert_eq!(
            f.reasons(&a),
            ["pods ipv4: no free block: the pool is exhausted"]
        );
        assert!(
            f.view.all_waits()[&a]
                .iter()
                .any(|w| w.unit == WaitUnit::Block && w.is_starving())
        );
        assert!(!f.view.all_waits().get(&b).is_some_and(|w| {
            w.iter()
                .any(|w| w.unit == WaitUnit::Block && w.is_starving())
        }));
    }

    #[test]
    fn a_pool_whose_only_space_is_quarantined_says_so() {
        let mut f = ViewFixture::new(CONFIG);
        let a = f.register("a");
        f.grant(&a);
        let b = f.register("b");
        f.grant(&b);
        // b's block goes into quarantine (as a completed release would leave it).
        let block = f.view.blocks_of(&b, &pods(), Family::V4)[0].0;
        let keys = f.view.keys().clone();
        delete(&mut f, &keys.grant(&pods(), Family::V4, &block));
        delete(&mut f, &keys.owned(&b, &pods(), Family::V4, &block));
        let record = QuarantineRecord {
            from_node: b.clone(),
            reason: "released".into(),
            since_ms: 0,
            state: QuarantineState::default(),
        };
        f.put(
            &keys.quarantine(&pods(), Family::V4, &block),
            &encode_value(&record).unwrap(),
        );
        let c = f.register("c");
        f.grant(&c);
        assert_eq!(
            f.reasons(&c),
            [
                "cidrs ipv4: no free CIDR: the pool is exhausted",
                "pods ipv4: no free block: the only space is in quarantine (1 block)"
            ]
        );
        assert_eq!(
            f.view.full().get("pods/ipv4").map(String::as_str),
            Some("no free block for 2 nodes (b, c): the only space is in quarantine (1 block)")
        );
    }

    #[test]
    fn the_published_record_changes_only_with_the_decision_and_goes_when_the_node_is_served() {
        let mut f = ViewFixture::new(CONFIG);
        let a = f.register("a");
        let b = f.register("b");
        let c = f.register("c");
        // Waiting only for space the leader grants next: nothing to publish.
        assert!(f.view.waiting_changes(None, &BTreeMap::new(), 7).is_empty());
        // ... unless granting is paused.
        let paused = f
            .view
            .waiting_changes(Some("etcd went back"), &BTreeMap::new(), 7);
        assert_eq!(paused.len(), 3);
        for node in [&a, &b, &c] {
            f.grant(node);
        }
        // c starves in both pools: one record naming both, at now.
        let changes = f.view.waiting_changes(None, &BTreeMap::new(), 7);
        assert_eq!(changes.len(), 1, "{changes:?}");
        let (node, record) = &changes[0];
        let record = record.clone().unwrap();
        assert_eq!((node, record.since_ms), (&c, 7));
        let whys: Vec<_> = record
            .waits
            .iter()
            .map(|w| (w.cause, w.why.as_str()))
            .collect();
        assert_eq!(
            whys,
            [
                (
                    WaitingCause::Exhausted,
                    "no free CIDR: the pool is exhausted"
                ),
                (
                    WaitingCause::Exhausted,
                    "no free block: the pool is exhausted"
                )
            ]
        );
        // Stored: the same decision later writes nothing.
        let key = f.view.keys().waiting(&c);
        f.put(&key, &encode_value(&record).unwrap());
        assert_eq!(f.view.stored_waiting(&c), Some(&record));
        assert!(f.view.waiting_changes(None, &BTreeMap::new(), 9).is_empty());
        // A changed decision keeps its since.
        let changes = f.view.waiting_changes(Some("paused"), &BTreeMap::new(), 9);
        assert_eq!(changes[0].1.as_ref().unwrap().since_ms, 7);
        // The node removed (its registration gone): the record goes.
        let node_key = f.view.keys().node(&c);
        delete(&mut f, &node_key);
        assert_eq!(
            f.view.waiting_changes(None, &BTreeMap::new(), 9),
            [(c.clone(), None)]
        );
    }

    #[test]
    fn a_published_instance_limit_shows_as_a_starving_wait_and_lapses_with_the_managers_word() {
        let mut f = ViewFixture::new(CONFIG);
        let a = f.register("a");
        f.grant(&a);
        assert!(f.view.waits(&a).is_empty());
        // The leader's cloud manager says a's instance is full in pool `pods`.
        let more: BTreeMap<NodeName, Vec<WaitingEntry>> = [(
            a.clone(),
            vec![
                NodeWait {
                    pool: Some(pods()),
                    family: Family::V4,
                    unit: WaitUnit::Address,
                    reason: WaitReason::AtCapacity,
                    max_ids: 0,
                }
                .entry(None),
            ],
        )]
        .into();
        let changes = f.view.waiting_changes(None, &more, 1);
        let record = changes[0].1.clone().unwrap();
        assert_eq!(record.waits[0].cause, WaitingCause::AtCapacity);
        let key = f.view.keys().waiting(&a);
        f.put(&key, &encode_value(&record).unwrap());
        // Published, every reader of the view sees it.
        assert_eq!(
            f.reasons(&a),
            [
                "pods ipv4: no more addresses: the node's instance is at its limit of interfaces \
              and addresses (or no subnet has room)"
            ]
        );
        assert!(f.view.full()["pods/ipv4"].starts_with("no free address for 1 node (a)"));
        // The manager no longer says so: the record goes (it never feeds itself).
        assert_eq!(
            f.view.waiting_changes(None, &BTreeMap::new(), 2),
            [(a.clone(), None)]
        );
    }

    fn delete(f: &mut ViewFixture, key: &str) {
        f.revision += 1;
        f.view.apply_delete(key, f.revision);
    }
}
