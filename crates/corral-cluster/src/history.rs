//! The grants' history, as values: what the leader writes when a grant of a node CIDR or block
//! ends (one [`HistoryRecord`] under three keys, in the fenced transaction that deletes the
//! grant, so no ended grant misses its record and a deposed leader writes none), which events
//! answer "who held this address at that time", and what trimming deletes.
//!
//! A grant still held has no history key: its `grants/` value carries `granted_ms`, and a
//! reader joins the two ([`HistoryEvent::held`]). A grant made before the history was kept has
//! no `granted_ms`: its events say `from_ms: None` ("before history"), never an error.
//!
//! The history is bounded by count and age (`ClusterConfig::history`): the leader trims the
//! oldest events off the grant path, in fenced batches ([`trim_plan`]).

use std::net::IpAddr;

use corral_core::{Family, PoolName};
use ipnet::IpNet;

use crate::keys::{GrantEnd, GrantRecord, HistoryRecord, Keys, NodeName, ValueError, encode_value};

/// Default of `history.max_events`: events kept at most.
pub const DEFAULT_HISTORY_MAX_EVENTS: u64 = 100_000;
/// Default of `history.max_age_secs`: how long an event is kept at most (30 days).
pub const DEFAULT_HISTORY_MAX_AGE_SECS: u64 = 30 * 24 * 3600;
/// History events a trimming transaction deletes at most (three keys each, inside etcd's 128
/// operations).
pub const TRIM_BATCH: usize = 40;

/// The record of a grant ending now: `grant` is its `grants/` value as the view saw it (`None`
/// when it did not decode: the node then is `node`, the start unknown).
pub fn ended(
    pool: &PoolName,
    cidr: &IpNet,
    node: &NodeName,
    grant: Option<&GrantRecord>,
    to_ms: u64,
    why: GrantEnd,
) -> HistoryRecord {
    HistoryRecord {
        pool: pool.clone(),
        cidr: *cidr,
        node: grant.map_or_else(|| node.clone(), |g| g.node.clone()),
        from_ms: grant.and_then(|g| g.granted_ms),
        to_ms,
        why,
    }
}

/// A grant about to end, as the view saw it: what its history record is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndingGrant {
    /// The pool.
    pub pool: PoolName,
    /// The node CIDR or block.
    pub cidr: IpNet,
    /// The node it was granted to.
    pub node: NodeName,
    /// Its `grants/` value (`None`: it did not decode).
    pub record: Option<GrantRecord>,
}

impl EndingGrant {
    /// Its record, ending at `to_ms` for `why`.
    pub fn ended(&self, to_ms: u64, why: GrantEnd) -> HistoryRecord {
        ended(
            &self.pool,
            &self.cidr,
            &self.node,
            self.record.as_ref(),
            to_ms,
            why,
        )
    }
}

/// The family of a record's CIDR.
fn family_of(record: &HistoryRecord) -> Family {
    crate::net::family_of(&record.cidr)
}

/// The three keys of one record (by time, by CIDR, by node).
pub fn record_keys(keys: &Keys, record: &HistoryRecord) -> [String; 3] {
    let family = family_of(record);
    [
        keys.history_at(record.to_ms, &record.pool, family, &record.cidr),
        keys.history_cidr(&record.pool, family, &record.cidr, record.to_ms),
        keys.history_node(
            &record.node,
            record.to_ms,
            &record.pool,
            family,
            &record.cidr,
        ),
    ]
}

/// The puts that record a grant's end: the same value under its three keys. They go into the
/// transaction that deletes the grant.
pub fn puts(keys: &Keys, record: &HistoryRecord) -> Result<Vec<(String, Vec<u8>)>, ValueError> {
    let value = encode_value(record)?;
    Ok(record_keys(keys, record)
        .into_iter()
        .map(|key| (key, value.clone()))
        .collect())
}

/// One grant in a history answer: ended (`to_ms` set) or still held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEvent {
    /// The pool.
    pub pool: PoolName,
    /// The node CIDR or block.
    pub cidr: IpNet,
    /// Its holder.
    pub node: NodeName,
    /// Granted at (`None`: before history).
    pub from_ms: Option<u64>,
    /// Ended at (`None`: still held).
    pub to_ms: Option<u64>,
    /// Why it ended (`None`: still held).
    pub why: Option<GrantEnd>,
}

impl HistoryEvent {
    /// An ended grant.
    pub fn ended(record: HistoryRecord) -> HistoryEvent {
        HistoryEvent {
            pool: record.pool,
            cidr: record.cidr,
            node: record.node,
            from_ms: record.from_ms,
            to_ms: Some(record.to_ms),
            why: Some(record.why),
        }
    }

    /// A grant still held (its `grants/` key and value).
    pub fn held(pool: &PoolName, cidr: &IpNet, grant: &GrantRecord) -> HistoryEvent {
        HistoryEvent {
            pool: pool.clone(),
            cidr: *cidr,
            node: grant.node.clone(),
            from_ms: grant.granted_ms,
            to_ms: None,
            why: None,
        }
    }

    /// The family of its CIDR.
    pub fn family(&self) -> Family {
        crate::net::family_of(&self.cidr)
    }

    /// Whether it held its CIDR at `at_ms` (granted at or before, ended after; a grant from
    /// before history counts as held since ever).
    pub fn covers(&self, at_ms: u64) -> bool {
        self.from_ms.is_none_or(|from| from <= at_ms) && self.to_ms.is_none_or(|to| at_ms < to)
    }

    /// What it sorts by, newest first: its last happening (its end, or its start while
    /// held); a held one first on a tie.
    fn recency(&self) -> (u64, bool) {
        match self.to_ms {
            None => (self.from_ms.unwrap_or(0), true),
            Some(to) => (to, false),
        }
    }
}

/// Sorts events newest first (by their end, or their start while held) and keeps `limit`.
pub fn newest_first(events: &mut Vec<HistoryEvent>, limit: usize) {
    events.sort_by(|a, b| {
        b.recency()
            .cmp(&a.recency())
            .then_with(|| a.cidr.cmp(&b.cidr))
            .then_with(|| a.pool.cmp(&b.pool))
    });
    events.truncate(limit);
}

/// The CIDRs of length `min_len..=max` (32 or 128) that contain `address`: the candidates
/// whose `history/cidr/` prefixes say who held it.
pub fn containing(address: IpAddr, min_len: u8) -> Vec<IpNet> {
    let max = match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    (min_len.min(max)..=max)
        .filter_map(|len| IpNet::new(address, len).ok().map(|net| net.trunc()))
        .collect()
}

/// The bounds in force: events kept at most, and their age at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Events kept at most.
    pub max_events: u64,
    /// Age kept at most, in milliseconds.
    pub max_age_ms: u64,
}

/// Which events to trim, oldest first: every event ended before `now_ms - max_age_ms`, and the
/// oldest beyond `max_events`. `oldest_first` is every `history/at/` event (its end time),
/// in key order.
pub fn trim_plan(oldest_first: &[u64], bounds: Bounds, now_ms: u64) -> usize {
    let cutoff = now_ms.saturating_sub(bounds.max_age_ms);
    let too_old = oldest_first.iter().take_while(|&&to| to < cutoff).count();
    let over = oldest_first
        .len()
        .saturating_sub(usize::try_from(bounds.max_events).unwrap_or(usize::MAX));
    too_old.max(over)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{ClusterName, HistoryIndex, Key, decode_value};
    use crate::tests::{net, node, pods as pool};

    fn keys() -> Keys {
        Keys::new(ClusterName::new("c").unwrap())
    }

    fn grant(name: &str, granted_ms: Option<u64>) -> GrantRecord {
        GrantRecord {
            node: node(name),
            uid: "u".into(),
            node_revision: 3,
            granted_ms,
        }
    }

    #[test]
    fn an_ended_grant_is_one_record_under_three_keys_that_parse_back() {
        let keys = keys();
        let record = ended(
            &pool(),
            &net("10.0.0.16/28"),
            &node("a"),
            Some(&grant("a", Some(1_000))),
            2_500,
            GrantEnd::Released,
        );
        let puts = puts(&keys, &record).unwrap();
        let names: Vec<&str> = puts.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "/corral/c/v1/history/at/0000000000002500/pods/ipv4/10.0.0.16-28",
                "/corral/c/v1/history/cidr/pods/ipv4/10.0.0.16-28/0000000000002500",
                "/corral/c/v1/history/node/a/0000000000002500/pods/ipv4/10.0.0.16-28",
            ]
        );
        let indexes: Vec<HistoryIndex> = puts
            .iter()
            .map(|(k, _)| match keys.parse(k).unwrap() {
                Key::History {
                    index,
                    pool: p,
                    family,
                    cidr,
                    to_ms,
                } => {
                    assert_eq!(
                        (p, family, cidr, to_ms),
                        (pool(), Family::V4, net("10.0.0.16/28"), 2_500)
                    );
                    index
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            indexes,
            [
                HistoryIndex::At,
                HistoryIndex::Cidr,
                HistoryIndex::Node(node("a"))
            ]
        );
        for (key, value) in &puts {
            assert_eq!(keys.format(&keys.parse(key).unwrap()), *key);
            assert_eq!(decode_value::<HistoryRecord>(value).unwrap(), record);
        }
        assert_eq!(
            String::from_utf8(puts[0].1.clone()).unwrap(),
            r#"{"schema":1,"pool":"pods","cidr":"10.0.0.16/28","node":"a","from_ms":1000,"to_ms":2500,"why":"released"}"#
        );
        // Keys of one CIDR and of one node sort by time under their prefixes.
        assert!(puts[1].0.starts_with(&keys.history_of_cidr_prefix(
            &pool(),
            Family::V4,
            &net("10.0.0.16/28")
        )));
        assert!(
            puts[2]
                .0
                .starts_with(&keys.history_of_node_prefix(&node("a")))
        );
        assert!(keys.history_at(999, &pool(), Family::V4, &net("10.0.0.0/28")) < puts[0].0);
    }

    #[test]
    fn history_keys_that_break_the_layout_are_refused() {
        let keys = keys();
        for bad in [
            "history/at/2500/pods/ipv4/10.0.0.16-28",
            "history/at/000000000000250x/pods/ipv4/10.0.0.16-28",
            "history/cidr/pods/ipv4/10.0.0.16-28",
            "history/cidr/pods/ipv6/10.0.0.16-28/0000000000002500",
            "history/node/A/0000000000002500/pods/ipv4/10.0.0.16-28",
            "history/other/x",
            "history",
        ] {
            assert!(keys.parse(&format!("/corral/c/v1/{bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_grant_from_before_history_reads_with_no_start_and_covers_every_earlier_time() {
        let old = br#"{"schema":1,"node":"a","uid":"u","node_revision":3}"#;
        let record: GrantRecord = decode_value(old).unwrap();
        assert_eq!(record.granted_ms, None);
        let ended = HistoryEvent::ended(ended(
            &pool(),
            &net("10.0.0.0/28"),
            &node("x"),
            Some(&record),
            50,
            GrantEnd::NodeRemoved,
        ));
        assert_eq!((ended.node.as_str(), ended.from_ms), ("a", None));
        assert!(ended.covers(0) && ended.covers(49) && !ended.covers(50));
        // A grant that did not decode still ends, named after the node the caller knew.
        let blind = super::ended(
            &pool(),
            &net("10.0.0.0/28"),
            &node("x"),
            None,
            50,
            GrantEnd::Revoked,
        );
        assert_eq!((blind.node.as_str(), blind.from_ms), ("x", None));
    }

    #[test]
    fn held_grants_cover_from_their_start_and_sort_by_their_last_happening() {
        let held = HistoryEvent::held(&pool(), &net("10.0.0.0/28"), &grant("b", Some(100)));
        assert!(!held.covers(99) && held.covers(100) && held.covers(u64::MAX));
        let old = HistoryEvent::ended(ended(
            &pool(),
            &net("10.0.0.0/28"),
            &node("a"),
            Some(&grant("a", Some(10))),
            60,
            GrantEnd::Released,
        ));
        let older = HistoryEvent::ended(ended(
            &pool(),
            &net("10.0.0.16/28"),
            &node("a"),
            None,
            20,
            GrantEnd::Released,
        ));
        let mut events = vec![older.clone(), held.clone(), old.clone()];
        newest_first(&mut events, 10);
        assert_eq!(events, [held.clone(), old.clone(), older]);
        newest_first(&mut events, 1);
        assert_eq!(events, [held]);
        // A grant held for long sorts after a newer end (the newest happenings first), and a
        // held grant before an end at the same time.
        let long = HistoryEvent::held(&pool(), &net("10.0.1.0/28"), &grant("c", Some(15)));
        let same = HistoryEvent::held(&pool(), &net("10.0.2.0/28"), &grant("d", Some(60)));
        let mut events = vec![long.clone(), old.clone(), same.clone()];
        newest_first(&mut events, 10);
        assert_eq!(events, [same, old, long]);
    }

    #[test]
    fn the_candidates_of_an_address_are_its_cidrs_from_the_pools_length_down() {
        let got = containing("10.0.3.7".parse().unwrap(), 29);
        assert_eq!(
            got,
            [
                net("10.0.3.0/29"),
                net("10.0.3.4/30"),
                net("10.0.3.6/31"),
                net("10.0.3.7/32")
            ]
        );
        assert_eq!(
            containing("fd00::1".parse().unwrap(), 200),
            [net("fd00::1/128")]
        );
    }

    #[test]
    fn the_bounds_are_settings_with_defaults_and_a_zero_age_is_refused() {
        use crate::config::ClusterConfig;
        let pool = "[[pools]]\nname = \"p\"\n[pools.ipv4]\ncidrs = [\"10.0.0.0/16\"]\nnode_prefix_len = 24\n";
        let plain = ClusterConfig::from_toml(pool).unwrap();
        assert_eq!(
            plain.history.bounds(),
            Bounds {
                max_events: 100_000,
                max_age_ms: 30 * 24 * 3600 * 1000
            }
        );
        assert!(
            !plain.to_json().unwrap().contains("history"),
            "defaults are not stored"
        );
        let set = ClusterConfig::from_toml(&format!(
            "history_max_events = 5\nhistory_max_age_secs = 60\n{pool}"
        ))
        .unwrap();
        assert_eq!(
            set.history.bounds(),
            Bounds {
                max_events: 5,
                max_age_ms: 60_000
            }
        );
        assert_eq!(
            ClusterConfig::from_json(set.to_json().unwrap().as_bytes()).unwrap(),
            set
        );
        let zero = ClusterConfig::from_toml(&format!("history_max_age_secs = 0\n{pool}"))
            .unwrap_err()
            .to_string();
        assert!(
            zero.contains("history_max_age_secs") && zero.contains("at least 1"),
            "{zero}"
        );
    }

    #[test]
    fn trimming_takes_the_older_of_age_and_count() {
        let bounds = Bounds {
            max_events: 3,
            max_age_ms: 100,
        };
        assert_eq!(trim_plan(&[], bounds, 1_000), 0);
        assert_eq!(trim_plan(&[950, 960], bounds, 1_000), 0);
        assert_eq!(trim_plan(&[850, 899, 900, 960], bounds, 1_000), 2);
        assert_eq!(trim_plan(&[910, 920, 930, 940, 950], bounds, 1_000), 2);
        assert_eq!(trim_plan(&[1, 2, 3, 4, 5], bounds, 1_000), 5);
    }
}
