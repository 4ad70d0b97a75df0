//! etcd going back in time: what operators and agents remember of the store they
//! talk to, and what they conclude when it answers from an earlier time.
//!
//! etcd's revision only grows and its cluster ID never changes, unless the store was restored
//! from a snapshot (the revision goes back to the snapshot's) or wiped and made again (the
//! revision starts over, usually under another cluster ID). Either way etcd has forgotten
//! grants whose space agents still hold. Each process keeps an [`EpochMemory`] (durably: the
//! agent in its state directory, the operator in its `--state-dir`), feeds it every header it
//! sees ([`EpochMemory::observe`]), and on a [`Regression`] stops trusting etcd's word on what
//! is free until the agents' own assertions (`holdings/`) were read back
//! ([`assertions_owed`]).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::keys::NodeName;
use crate::view::ClusterView;

/// One store's identity and time: its cluster ID (0: unknown) and a revision it answered at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Epoch {
    /// etcd's cluster ID (0: the store did not say).
    pub cluster_id: u64,
    /// A revision the store answered at.
    pub revision: i64,
}

impl Epoch {
    /// A revision of an answer that did not say its cluster ID (0).
    pub fn at_revision(revision: i64) -> Epoch {
        Epoch {
            cluster_id: 0,
            revision,
        }
    }
}

/// The store answered from an earlier time, or is another cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Regression {
    /// The highest revision seen before (and its cluster ID).
    pub remembered: Epoch,
    /// What the store answered.
    pub found: Epoch,
}

impl std::fmt::Display for Regression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.remembered.cluster_id != 0
            && self.found.cluster_id != 0
            && self.remembered.cluster_id != self.found.cluster_id
        {
            write!(
                f,
                "etcd went back in time: its cluster ID is {:x}, revision {}, after cluster {:x} \
                 was seen at revision {} (etcd was wiped and made again, or another cluster \
                 answers)",
                self.found.cluster_id,
                self.found.revision,
                self.remembered.cluster_id,
                self.remembered.revision
            )
        } else {
            write!(
                f,
                "etcd went back in time: revision {} after revision {} was seen (restored from \
                 a snapshot, or wiped and made again)",
                self.found.revision, self.remembered.revision
            )
        }
    }
}

/// What an observation tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Nothing new (a revision not above the highest seen, same cluster).
    Same,
    /// A higher revision: remember it.
    Advanced,
    /// Back in time: the new revision and cluster ID are remembered from now on.
    Regressed(Regression),
}

/// What a process remembers durably of the store: the highest revision and the cluster ID it
/// saw, and a regression not yet settled (granting waits for the agents' assertions; an
/// operator restarted meanwhile keeps waiting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EpochMemory {
    /// The highest revision seen, with its cluster ID (`None`: nothing seen yet).
    #[serde(default)]
    pub highest: Option<Epoch>,
    /// The last regression seen and not yet settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsettled: Option<Regression>,
}

impl EpochMemory {
    /// Feeds a header (the store's cluster ID and its current revision; never a revision a
    /// read asked for): answers whether it is new, and remembers it.
    pub fn observe(&mut self, found: Epoch) -> Observed {
        let floor = self.floor();
        self.observe_after(floor, found)
    }

    /// The highest revision seen (0: none): pass it to [`EpochMemory::observe_after`] with
    /// the answer of a request sent now.
    pub fn floor(&self) -> i64 {
        self.highest.map_or(0, |h| h.revision)
    }

    /// Feeds an answer to a request sent when the highest revision seen was `floor`: only a
    /// revision below that (or another cluster ID) is a regression. Answers of requests in
    /// flight together arrive in any order, so one is never judged against another's. A
    /// `floor` of 0 only advances (watch events, answers of requests sent earlier).
    pub fn observe_after(&mut self, floor: i64, found: Epoch) -> Observed {
        let Some(highest) = self.highest else {
            self.highest = Some(found);
            return Observed::Advanced;
        };
        let other_cluster = highest.cluster_id != 0
            && found.cluster_id != 0
            && highest.cluster_id != found.cluster_id;
        if other_cluster || found.revision < floor {
            let regression = Regression {
                remembered: highest,
                found,
            };
            self.highest = Some(found);
            self.unsettled = Some(regression);
            return Observed::Regressed(regression);
        }
        if found.revision > highest.revision || (highest.cluster_id == 0 && found.cluster_id != 0) {
            self.highest = Some(Epoch {
                cluster_id: if found.cluster_id != 0 {
                    found.cluster_id
                } else {
                    highest.cluster_id
                },
                revision: found.revision.max(highest.revision),
            });
            return Observed::Advanced;
        }
        Observed::Same
    }

    /// The regression is settled: the agents' assertions were read back (or the settle time
    /// passed, or `corral cluster recover` said so).
    pub fn settle(&mut self) {
        self.unsettled = None;
    }

    /// As JSON, for the file it is kept in.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// From the file's JSON; a file that does not decode is an error naming why.
    pub fn from_json(bytes: &[u8]) -> Result<EpochMemory, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// The epoch file is written at most this often while the revision only advances.
pub const EPOCH_SAVE_EVERY: Duration = Duration::from_secs(5);

/// An [`EpochMemory`] as a daemon keeps it in its file: whether it changed since it was last
/// handed out to be written, and when that was. A regression is written at once, an advance
/// at most every [`EPOCH_SAVE_EVERY`]; the caller writes what the methods hand out.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeptEpoch {
    /// What is remembered now.
    pub memory: EpochMemory,
    /// When it was last handed out to be written (`None`: not yet, or due at once).
    written: Option<Instant>,
    /// It changed since.
    changed: bool,
}

impl KeptEpoch {
    /// `memory`, as read from the file.
    pub fn new(memory: EpochMemory) -> KeptEpoch {
        KeptEpoch {
            memory,
            ..KeptEpoch::default()
        }
    }

    /// [`EpochMemory::observe_after`] at `now`: the regression it shows, if any, and the
    /// memory to write if that is due.
    pub fn observe_after(
        &mut self,
        floor: i64,
        found: Epoch,
        now: Instant,
    ) -> (Option<Regression>, Option<EpochMemory>) {
        let regression = match self.memory.observe_after(floor, found) {
            Observed::Same => None,
            Observed::Advanced => {
                self.changed = true;
                None
            }
            Observed::Regressed(regression) => {
                self.changed = true;
                Some(regression)
            }
        };
        let due = regression.is_some()
            || self
                .written
                .is_none_or(|t| now.saturating_duration_since(t) >= EPOCH_SAVE_EVERY);
        (regression, self.hand_out(due, now))
    }

    /// The regression is settled ([`EpochMemory::settle`]): the memory is due at once.
    pub fn settle(&mut self) {
        self.memory.settle();
        self.changed = true;
        self.written = None;
    }

    /// The memory to write at `now` if it changed and is due at once (never handed out, or
    /// settled since).
    pub fn due(&mut self, now: Instant) -> Option<EpochMemory> {
        self.hand_out(self.written.is_none(), now)
    }

    /// The memory to write at `now` if it changed since it was last handed out, whenever
    /// that was.
    pub fn flush(&mut self, now: Instant) -> Option<EpochMemory> {
        self.hand_out(true, now)
    }

    fn hand_out(&mut self, due: bool, now: Instant) -> Option<EpochMemory> {
        (self.changed && due).then(|| {
            self.written = Some(now);
            self.changed = false;
            self.memory
        })
    }
}

/// The live registered nodes whose assertion of what they hold (`holdings/<node>`) was not
/// written after revision `since` (0: that have none at all): the leader grants nothing while
/// one is owed, until a settle time passed. A node without a liveness key cannot assert and
/// is not waited for.
pub fn assertions_owed(view: &ClusterView, since: i64) -> Vec<NodeName> {
    view.nodes()
        .filter(|(node, _)| view.is_live(node))
        .filter(|(node, _)| {
            view.holdings_of(node)
                .is_none_or(|entry| entry.record.is_none() || entry.mod_revision <= since)
        })
        .map(|(node, _)| node.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(cluster_id: u64, revision: i64) -> Epoch {
        Epoch {
            cluster_id,
            revision,
        }
    }

    #[test]
    fn a_lower_revision_or_another_cluster_is_a_regression_remembered_until_settled() {
        let mut memory = EpochMemory::default();
        assert_eq!(memory.observe(at(7, 10)), Observed::Advanced);
        assert_eq!(memory.observe(at(7, 10)), Observed::Same);
        assert_eq!(memory.observe(at(7, 25)), Observed::Advanced);
        let Observed::Regressed(regression) = memory.observe(at(7, 12)) else {
            panic!("a lower revision is a regression");
        };
        assert_eq!(regression.remembered, at(7, 25));
        assert!(
            regression
                .to_string()
                .contains("revision 12 after revision 25")
        );
        assert_eq!(memory.unsettled, Some(regression));
        // The restored store is the baseline from now on.
        assert_eq!(memory.observe(at(7, 13)), Observed::Advanced);
        memory.settle();
        assert_eq!(memory.unsettled, None);
        // Another cluster ID, even at a higher revision.
        assert!(matches!(memory.observe(at(9, 100)), Observed::Regressed(_)));
        // An unknown cluster ID is no evidence either way.
        assert_eq!(memory.observe(at(0, 101)), Observed::Advanced);
        assert_eq!(memory.highest, Some(at(9, 101)));
        // An answer to a request sent before a higher revision was seen is no evidence.
        let floor = memory.floor();
        assert_eq!(memory.observe(at(9, 150)), Observed::Advanced);
        assert_eq!(memory.observe_after(floor, at(9, 120)), Observed::Same);
        assert!(matches!(
            memory.observe_after(memory.floor(), at(9, 120)),
            Observed::Regressed(_)
        ));
        let back = EpochMemory::from_json(&memory.to_json()).unwrap();
        assert_eq!(back, memory);
        assert!(EpochMemory::from_json(b"{").is_err());
    }

    #[test]
    fn a_regression_or_a_settlement_is_written_at_once_an_advance_at_most_every_few_seconds() {
        let start = Instant::now();
        let later = |secs| start + Duration::from_secs(secs);
        let mut kept = KeptEpoch::new(EpochMemory::default());
        assert_eq!(kept.due(start), None, "nothing changed");
        // The first advance is written, the next ones only once `EPOCH_SAVE_EVERY` passed.
        let (regression, written) = kept.observe_after(0, at(7, 10), start);
        assert_eq!(regression, None);
        assert_eq!(written.map(|m| m.floor()), Some(10));
        assert_eq!(kept.observe_after(0, at(7, 20), later(1)).1, None);
        assert_eq!(kept.due(later(2)), None, "written before");
        let written = kept.observe_after(0, at(7, 30), later(5)).1;
        assert_eq!(written.map(|m| m.floor()), Some(30));
        assert_eq!(
            kept.observe_after(0, at(7, 30), later(20)).1,
            None,
            "no change"
        );
        // A regression is written at once.
        let (regression, written) = kept.observe_after(30, at(7, 12), later(6));
        assert_eq!(regression.map(|r| r.remembered), Some(at(7, 30)));
        assert_eq!(written.and_then(|m| m.unsettled), regression);
        // So is its settlement, at the next look.
        kept.settle();
        assert!(kept.due(later(7)).is_some_and(|m| m.unsettled.is_none()));
        assert_eq!(kept.due(later(8)), None);
        // A flush writes any change, however recent the last write.
        assert_eq!(kept.flush(later(8)), None);
        kept.observe_after(0, at(7, 40), later(8));
        assert_eq!(kept.flush(later(8)).map(|m| m.floor()), Some(40));
        assert_eq!(kept.flush(later(8)), None);
    }
}
