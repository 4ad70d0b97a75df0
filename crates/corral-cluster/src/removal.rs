//! A removed node's drain, decided from the view alone (so a new leader finishes what the old
//! one started): removal is a handshake with the node's agent.
//!
//! The removal transaction deletes the node's registration and grants and puts a quarantine
//! key for each range and node ID in state `waiting`, not on a lease, and keeps
//! `removals/<node>` in phase `draining`. Then, per removed node:
//! - a waiting key whose range (or ID) the node's `holdings/` record no longer lists (or the
//!   record is gone or empty) was given up: it becomes a quarantine on a lease
//!   ([`RemovalStep::GiveUp`]);
//! - a node that shows no liveness goes to phase `silent` with `silence/<node>` put on a lease
//!   of the quarantine time in the same transaction ([`RemovalStep::StartSilence`]); live again,
//!   it goes back to `draining` and the silence key goes ([`RemovalStep::Returned`]); the
//!   silence key gone (its lease ran out) while the phase is `silent` and the node still not
//!   live proves it gone for a whole quarantine: its waiting keys and its holdings go
//!   ([`RemovalStep::ProvenGone`]);
//! - once nothing of it waits, the removal record goes, with its holdings record if that is
//!   empty ([`RemovalStep::Done`]);
//! - waiting keys of a node with no removal record (a request dropped over them) get one back
//!   ([`RemovalStep::Adopt`]).
//!
//! Nothing is reused on silence: a node's liveness key expiring frees nothing by itself, and space
//! becomes free only when etcd deletes its quarantine key at the end of its lease; etcd's leases do
//! not expire while it has no quorum, so an etcd outage frees nothing either.

use crate::keys::{HoldingsRecord, NodeName, RemovalPhase, RemovalRecord};
use crate::net::overlaps;
use crate::view::{ClusterView, WaitingOn, WaitingQuarantine};

/// One step of a removed node's drain: one transaction, fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemovalStep {
    /// Waiting keys of `node` its agent no longer holds: each put again as a quarantine on a
    /// lease of the quarantine time (compare: each key's mod revision).
    GiveUp {
        node: NodeName,
        keys: Vec<WaitingQuarantine>,
    },
    /// The node shows no liveness: the removal goes to phase `silent` and `silence/<node>` is
    /// put on a lease of the quarantine time (compares: the removal's mod revision, the
    /// liveness and silence keys absent).
    StartSilence {
        node: NodeName,
        removal_revision: i64,
        record: RemovalRecord,
    },
    /// The node is live again: back to `draining`, the silence key deleted (compare: the
    /// removal's mod revision).
    Returned {
        node: NodeName,
        removal_revision: i64,
        record: RemovalRecord,
    },
    /// No liveness for a whole quarantine: the waiting keys, the removal record and (if the
    /// node is not registered again) its holdings record are deleted (compares: the
    /// removal's mod revision, liveness and silence keys absent, each key's and the holdings'
    /// mod revision).
    ProvenGone {
        node: NodeName,
        removal_revision: i64,
        keys: Vec<WaitingQuarantine>,
        /// The holdings record's mod revision, if it is to be deleted.
        holdings: Option<i64>,
    },
    /// Nothing of the node waits any more: the removal record goes, with the silence key and
    /// (if empty and the node is not registered again) the holdings record.
    Done {
        node: NodeName,
        removal_revision: i64,
        silence: Option<i64>,
        holdings: Option<i64>,
    },
    /// Waiting keys of a node without a removal record: a `draining` one is written back
    /// (compare: absent).
    Adopt { node: NodeName },
}

impl RemovalStep {
    /// The node it is about.
    pub fn node(&self) -> &NodeName {
        match self {
            RemovalStep::GiveUp { node, .. }
            | RemovalStep::StartSilence { node, .. }
            | RemovalStep::Returned { node, .. }
            | RemovalStep::ProvenGone { node, .. }
            | RemovalStep::Done { node, .. }
            | RemovalStep::Adopt { node } => node,
        }
    }
}

/// Whether the holder's record (`None`: no record) still holds what `key` keeps. A record
/// that cannot be read holds everything (`unreadable`).
pub fn still_held(holdings: Option<&HoldingsRecord>, unreadable: bool, key: &WaitingOn) -> bool {
    if unreadable {
        return true;
    }
    let Some(record) = holdings.filter(|r| !r.is_empty()) else {
        return false;
    };
    match key {
        WaitingOn::Range(cidr) => record.ranges.iter().any(|r| overlaps(&r.cidr, cidr)),
        WaitingOn::NodeId(id) => record.node_ids().any(|held| held == *id),
    }
}

/// The next step of every removed node's drain (at most one per node).
pub fn removal_steps(view: &ClusterView) -> Vec<RemovalStep> {
    let mut waiting: std::collections::BTreeMap<NodeName, Vec<WaitingQuarantine>> =
        std::collections::BTreeMap::new();
    for key in view.waiting_quarantines() {
        waiting
            .entry(key.record.from_node.clone())
            .or_default()
            .push(key);
    }
    let mut nodes: std::collections::BTreeSet<NodeName> = waiting.keys().cloned().collect();
    nodes.extend(
        view.removals()
            .iter()
            .filter(|(_, (_, r))| !r.phase.is_requested())
            .map(|(n, _)| n.clone()),
    );
    let mut steps = Vec::new();
    for node in nodes {
        let keys = waiting.remove(&node).unwrap_or_default();
        let entry = view.holdings_of(&node);
        let holdings = entry.and_then(|e| e.record.as_ref());
        let unreadable = entry.is_some_and(|e| e.record.is_none());
        let live = view.is_live(&node);
        let registered = view.registration(&node).is_some();
        let removal = view.removals().get(&node);
        if removal.is_some_and(|(_, r)| r.phase.is_requested()) {
            // The leader's removal transaction comes first.
            continue;
        }
        let given_up: Vec<WaitingQuarantine> = keys
            .iter()
            .filter(|k| !still_held(holdings, unreadable, &k.held))
            .cloned()
            .collect();
        if !given_up.is_empty() {
            steps.push(RemovalStep::GiveUp {
                node,
                keys: given_up,
            });
            continue;
        }
        let Some((removal_revision, record)) = removal else {
            if !keys.is_empty() {
                steps.push(RemovalStep::Adopt { node });
            }
            continue;
        };
        let removal_revision = *removal_revision;
        let silence = view.silence_of(&node);
        let holdings_revision = entry.map(|e| e.mod_revision);
        match record.phase {
            RemovalPhase::Silent if live => {
                steps.push(RemovalStep::Returned {
                    node,
                    removal_revision,
                    record: record.clone(),
                });
                continue;
            }
            RemovalPhase::Silent if silence.is_none() => {
                steps.push(RemovalStep::ProvenGone {
                    node,
                    removal_revision,
                    keys,
                    holdings: holdings_revision.filter(|_| !registered),
                });
                continue;
            }
            _ => {}
        }
        let empty = !unreadable && holdings.is_none_or(HoldingsRecord::is_empty);
        if keys.is_empty() && (empty || registered) {
            steps.push(RemovalStep::Done {
                node,
                removal_revision,
                silence,
                holdings: holdings_revision.filter(|_| empty && !registered && entry.is_some()),
            });
            continue;
        }
        if record.phase == RemovalPhase::Draining && !live && silence.is_none() {
            steps.push(RemovalStep::StartSilence {
                node,
                removal_revision,
                record: record.clone(),
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterConfig;
    use crate::keys::{
        ClusterName, HeldRange, Keys, QuarantineRecord, QuarantineState, RemovalMode, encode_value,
    };
    use crate::tests::pool_toml;
    use crate::view::WaitingOn;

    const CONFIG: &str = concat!(
        "quarantine_secs = 5\n",
        pool_toml!("default", "10.0.0.0/16", node_prefix_len = 24),
    );

    struct F {
        keys: Keys,
        view: ClusterView,
        revision: i64,
    }

    impl F {
        fn new() -> F {
            let keys = Keys::new(ClusterName::new("t").unwrap());
            let view = ClusterView::new(keys.clone(), ClusterConfig::from_toml(CONFIG).unwrap());
            F {
                keys,
                view,
                revision: 10,
            }
        }

        fn put(&mut self, key: String, value: Vec<u8>) -> i64 {
            self.revision += 1;
            self.view
                .apply_put(&key, &value, self.revision, self.revision);
            self.revision
        }

        fn delete(&mut self, key: String) {
            self.revision += 1;
            self.view.apply_delete(&key, self.revision);
        }

        fn waiting(&mut self, cidr: &str) -> i64 {
            let cidr: IpNet = cidr.parse().unwrap();
            let record = QuarantineRecord {
                from_node: n(),
                reason: "node removed".into(),
                since_ms: 0,
                state: QuarantineState::Waiting,
            };
            let key = self.keys.quarantine(
                &crate::PoolName::new("default").unwrap(),
                crate::Family::V4,
                &cidr,
            );
            self.put(key, encode_value(&record).unwrap())
        }

        fn removal(&mut self, phase: RemovalPhase) -> i64 {
            let record = RemovalRecord {
                node_revision: 1,
                requested_ms: 0,
                mode: RemovalMode::Drain,
                phase,
            };
            self.put(self.keys.removal(&n()), encode_value(&record).unwrap())
        }

        fn holdings(&mut self, cidrs: &[&str]) -> i64 {
            let record = HoldingsRecord {
                uid: "u".into(),
                ranges: cidrs
                    .iter()
                    .map(|c| HeldRange {
                        pool: crate::PoolName::new("default").unwrap(),
                        cidr: c.parse().unwrap(),
                        draining: true,
                        allocations: 1,
                    })
                    .collect(),
                node_id: None,
                other_node_ids: vec![],
                cloud: vec![],
                refused: vec![],
                refused_node_id: None,
                written_ms: 0,
            };
            self.put(self.keys.holdings(&n()), encode_value(&record).unwrap())
        }

        fn live(&mut self) {
            self.put(self.keys.live(&n()), b"{}".to_vec());
        }
    }

    /// Review (2026-12-01): a node serving two IDs' pod ranges (its ID changed while pods
    /// still use the old one) holds both; only the highest used to count.
    #[test]
    fn every_node_id_the_record_names_is_still_held() {
        let record = HoldingsRecord {
            uid: "uid".into(),
            node_id: Some(2),
            other_node_ids: vec![1],
            ..HoldingsRecord::default()
        };
        assert!(still_held(Some(&record), false, &WaitingOn::NodeId(1)));
        assert!(still_held(Some(&record), false, &WaitingOn::NodeId(2)));
        assert!(!still_held(Some(&record), false, &WaitingOn::NodeId(3)));
        assert!(!record.is_empty());
        let only_other = HoldingsRecord {
            node_id: None,
            ..record
        };
        assert!(!only_other.is_empty());
        assert!(still_held(Some(&only_other), false, &WaitingOn::NodeId(1)));
    }
    fn n() -> NodeName {
        NodeName::new("node-a").unwrap()
    }

    use crate::IpNet;

    #[test]
    fn a_live_node_holding_its_range_keeps_it_waiting() {
        let mut f = F::new();
        f.waiting("10.0.1.0/24");
        f.removal(RemovalPhase::Draining);
        f.holdings(&["10.0.1.0/24"]);
        f.live();
        assert_eq!(removal_steps(&f.view), vec![]);
    }

    #[test]
    fn a_range_its_holdings_dropped_is_given_up_and_none_without_a_record() {
        let mut f = F::new();
        f.waiting("10.0.1.0/24");
        let dropped = f.waiting("10.0.2.0/24");
        f.removal(RemovalPhase::Draining);
        f.holdings(&["10.0.1.0/24"]);
        f.live();
        let steps = removal_steps(&f.view);
        let [RemovalStep::GiveUp { keys, .. }] = steps.as_slice() else {
            panic!("{steps:?}");
        };
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].mod_revision, dropped);
        assert_eq!(
            keys[0].held,
            WaitingOn::Range("10.0.2.0/24".parse().unwrap())
        );
        // No record at all (an agent that does not assert holdings): everything is given up.
        f.delete(f.keys.holdings(&n()));
        let steps = removal_steps(&f.view);
        let [RemovalStep::GiveUp { keys, .. }] = steps.as_slice() else {
            panic!("{steps:?}");
        };
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn an_unreadable_holdings_record_holds_everything() {
        let mut f = F::new();
        f.waiting("10.0.1.0/24");
        f.removal(RemovalPhase::Draining);
        f.put(f.keys.holdings(&n()), b"garbage".to_vec());
        f.live();
        assert_eq!(removal_steps(&f.view), vec![]);
    }

    #[test]
    fn silence_return_and_proof_of_absence() {
        let mut f = F::new();
        f.waiting("10.0.1.0/24");
        let draining = f.removal(RemovalPhase::Draining);
        let holdings = f.holdings(&["10.0.1.0/24"]);
        // Not live: silent.
        let steps = removal_steps(&f.view);
        assert!(
            matches!(steps.as_slice(), [RemovalStep::StartSilence { removal_revision, .. }] if *removal_revision == draining),
            "{steps:?}"
        );
        f.removal(RemovalPhase::Silent);
        f.put(f.keys.silence(&n()), b"{}".to_vec());
        assert_eq!(removal_steps(&f.view), vec![]);
        // Live again: back to draining.
        f.live();
        assert!(matches!(
            removal_steps(&f.view).as_slice(),
            [RemovalStep::Returned { .. }]
        ));
        // Silence ran out while not live: proven gone, its holdings go (not registered).
        f.delete(f.keys.live(&n()));
        f.delete(f.keys.silence(&n()));
        let steps = removal_steps(&f.view);
        let [
            RemovalStep::ProvenGone {
                keys,
                holdings: Some(h),
                ..
            },
        ] = steps.as_slice()
        else {
            panic!("{steps:?}");
        };
        assert_eq!(keys.len(), 1);
        assert_eq!(*h, holdings);
    }

    #[test]
    fn done_once_nothing_waits_and_the_holdings_are_empty() {
        let mut f = F::new();
        f.removal(RemovalPhase::Draining);
        let holdings = f.holdings(&[]);
        f.live();
        let steps = removal_steps(&f.view);
        assert!(
            matches!(steps.as_slice(), [RemovalStep::Done { holdings: Some(h), silence: None, .. }] if *h == holdings),
            "{steps:?}"
        );
        // Still holding a range no waiting key names: not done while live.
        f.holdings(&["10.0.9.0/24"]);
        assert_eq!(removal_steps(&f.view), vec![]);
    }

    #[test]
    fn waiting_keys_without_a_removal_record_are_adopted_and_requested_ones_wait() {
        let mut f = F::new();
        f.waiting("10.0.1.0/24");
        f.holdings(&["10.0.1.0/24"]);
        assert!(matches!(
            removal_steps(&f.view).as_slice(),
            [RemovalStep::Adopt { .. }]
        ));
        f.removal(RemovalPhase::Requested);
        assert_eq!(removal_steps(&f.view), vec![]);
    }
}
