//! A removed node as `corral node show` sees it until its space is back: its removal's phase,
//! the space still quarantined from it (waiting for its agent, or on the quarantine lease
//! and when that ends), and the ranges its agent still asserts.

use serde::{Deserialize, Serialize};

use crate::keys::{HeldRange, NodeName, QuarantineState, RemovalMode, RemovalPhase};
use crate::view::{ClusterView, WaitingOn};

/// A node no longer registered whose space is not all back.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedNodeReport {
    pub name: String,
    /// Always true: the registration is gone (a registered node has a [`crate::NodeReport`]).
    pub removed: bool,
    /// Whether its agent's liveness key exists.
    pub live: Option<bool>,
    /// The removal's record while the leader keeps it: `requested`, `draining` (waiting for
    /// its agent to give its space up) or `silent` (it showed no liveness); `done` once the
    /// leader deleted it (what is left is on the quarantine lease, or asserted by its agent).
    pub phase: String,
    /// How it was asked (`plain`, `drain`, `force`), while the record exists.
    pub mode: Option<String>,
    /// When it was asked, in milliseconds since the epoch, while the record exists.
    pub requested_ms: Option<u64>,
    /// Space quarantined from it.
    pub quarantined: Vec<QuarantinedReport>,
    /// The ranges its agent still asserts (`holdings/`): occupied until it gives them up.
    pub asserted: Vec<HeldRange>,
}

/// One node CIDR, block or node ID in quarantine from a removed node.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinedReport {
    /// `pool family cidr`, or `node-id N`.
    pub space: String,
    /// `waiting` (its agent may still serve from it: the quarantine has not begun) or
    /// `quarantined` (on the quarantine lease).
    pub state: String,
    /// When the record was written (for `quarantined`: when the quarantine began), in
    /// milliseconds since the epoch.
    pub since_ms: u64,
    /// When the quarantine ends (etcd deletes the key with its lease), for `quarantined`.
    pub until_ms: Option<u64>,
}

impl ClusterView {
    /// The report of `node` if it is not registered and something of it is still held: a
    /// removal record, quarantine keys from it, or ranges its agent asserts. `None` for a
    /// registered node, or one whose space is all back.
    pub fn removed_node_report(&self, node: &NodeName, live: bool) -> Option<RemovedNodeReport> {
        if self.registration(node).is_some() {
            return None;
        }
        let removal = self.removals().get(node).map(|(_, record)| record.clone());
        let quarantine_ms = self.config().quarantine_secs.saturating_mul(1000);
        let quarantined: Vec<QuarantinedReport> = self
            .quarantines_from(node)
            .into_iter()
            .map(|q| {
                let space = match (q.pool, q.held) {
                    (Some(pool), WaitingOn::Range(cidr)) => {
                        let family = if cidr.addr().is_ipv4() {
                            "ipv4"
                        } else {
                            "ipv6"
                        };
                        format!("{pool} {family} {cidr}")
                    }
                    (_, WaitingOn::Range(cidr)) => cidr.to_string(),
                    (_, WaitingOn::NodeId(id)) => format!("node-id {id}"),
                };
                let waiting = q.record.state == QuarantineState::Waiting;
                QuarantinedReport {
                    space,
                    state: if waiting { "waiting" } else { "quarantined" }.to_owned(),
                    since_ms: q.record.since_ms,
                    until_ms: (!waiting).then(|| q.record.since_ms.saturating_add(quarantine_ms)),
                }
            })
            .collect();
        let asserted: Vec<HeldRange> = self
            .holdings_of(node)
            .and_then(|entry| entry.record.as_ref())
            .map(|record| record.ranges.clone())
            .unwrap_or_default();
        if removal.is_none() && quarantined.is_empty() && asserted.is_empty() {
            return None;
        }
        Some(RemovedNodeReport {
            name: node.to_string(),
            removed: true,
            live: Some(live),
            phase: match removal.as_ref().map(|r| r.phase) {
                None => "done",
                Some(RemovalPhase::Requested) => "requested",
                Some(RemovalPhase::Draining) => "draining",
                Some(RemovalPhase::Silent) => "silent",
            }
            .to_owned(),
            mode: removal.as_ref().map(|r| {
                match r.mode {
                    RemovalMode::Plain => "plain",
                    RemovalMode::Drain => "drain",
                    RemovalMode::Force => "force",
                }
                .to_owned()
            }),
            requested_ms: removal.as_ref().map(|r| r.requested_ms),
            quarantined,
            asserted,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ClusterConfig;
    use crate::keys::{
        ClusterName, Keys, NodeName, QuarantineRecord, QuarantineState, encode_value,
    };
    use crate::tests::pool_toml;
    use crate::view::ClusterView;

    const CONFIG: &str = concat!(
        "quarantine_secs = 5\n",
        pool_toml!("default", "10.0.0.0/16", node_prefix_len = 24)
    );

    fn quarantine(view: &mut ClusterView, keys: &Keys, cidr: &str, state: QuarantineState) {
        let record = QuarantineRecord {
            from_node: NodeName::new("gone").unwrap(),
            reason: "node removed".into(),
            since_ms: 1_000,
            state,
        };
        let key = keys.quarantine(
            &crate::PoolName::new("default").unwrap(),
            crate::Family::V4,
            &cidr.parse().unwrap(),
        );
        view.apply_put(&key, &encode_value(&record).unwrap(), 11, 11);
    }

    #[test]
    fn a_removed_node_shows_what_is_not_back_and_when_its_quarantine_ends() {
        let keys = Keys::new(ClusterName::new("t").unwrap());
        let mut view = ClusterView::new(keys.clone(), ClusterConfig::from_toml(CONFIG).unwrap());
        let gone = NodeName::new("gone").unwrap();
        assert_eq!(view.removed_node_report(&gone, false), None);
        quarantine(&mut view, &keys, "10.0.1.0/24", QuarantineState::Waiting);
        quarantine(
            &mut view,
            &keys,
            "10.0.2.0/24",
            QuarantineState::Quarantined,
        );
        let report = view.removed_node_report(&gone, false).unwrap();
        assert_eq!(report.phase, "done");
        assert_eq!(report.quarantined.len(), 2);
        let [waiting, quarantined] = &report.quarantined[..] else {
            panic!("{report:?}");
        };
        assert_eq!(waiting.space, "default ipv4 10.0.1.0/24");
        assert_eq!(
            (waiting.state.as_str(), waiting.until_ms),
            ("waiting", None)
        );
        assert_eq!(quarantined.state, "quarantined");
        assert_eq!(quarantined.until_ms, Some(6_000));
        // Another node's quarantine is not this one's.
        assert_eq!(
            view.removed_node_report(&NodeName::new("other").unwrap(), false),
            None
        );
    }
}
