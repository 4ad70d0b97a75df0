//! The leak collector's rule (Calico's way): an allocation is valid until proven leaked.
//!
//! Given the attachments a caller knows to be live, an allocation whose attachment is not
//! live is only a *suspect*: the first run that sees it records when (a [`GcSuspect`], kept
//! durably by the caller's store); a later run releases it only if (a) at least the grace
//! period has passed since that first observation, (b) it sees the attachment missing again,
//! and (c) the attachment still holds exactly the allocations recorded (same addresses, same
//! generations). A suspect whose attachment is live again, or whose allocations changed or
//! are gone, is cleared. An attachment goes whole (every pool and family) or not at all, and
//! at most [`GcPolicy::max_released`] attachments go per run.
//!
//! A zero grace period is the caller saying one observation is enough (the CNI spec's model:
//! a runtime may call GC once, and stale reservations SHOULD be freed): an allocation whose
//! attachment is not live goes at the run that first sees it, nothing recorded. The grace
//! period and the second observation stay the default, because a runtime's list of valid
//! attachments can be briefly wrong (a container being created while the list was taken).
//!
//! Freeing an address still in use is worse than leaking one, so every doubt keeps it: a
//! clock that went back, a record that does not match, a run over the cap.
//!
//! [`plan_gc`] decides, from values only; [`release_suspect`] applies one decision to an
//! engine, checking it again first.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use crate::{AllocError, AttachmentKey, Engine, Released, Timestamp};

/// The grace period when a caller names none: Calico's 15 minutes.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(15 * 60);
/// Attachments released per run when a caller names no cap.
pub const DEFAULT_GC_MAX_RELEASED: usize = 64;

/// How a run decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    /// How long after its first observation a suspect may be released.
    pub grace: Duration,
    /// At most this many attachments are released per run; the rest wait for the next.
    pub max_released: usize,
}

impl Default for GcPolicy {
    fn default() -> GcPolicy {
        GcPolicy {
            grace: DEFAULT_GC_GRACE,
            max_released: DEFAULT_GC_MAX_RELEASED,
        }
    }
}

/// One allocation as a suspect records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GcHeld {
    pub addr: IpAddr,
    pub generation: u64,
}

/// An attachment seen missing from the live set, with what it held then (sorted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcSuspect {
    pub key: AttachmentKey,
    pub first_seen: Timestamp,
    pub held: Vec<GcHeld>,
}

/// What one run decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Attachments holding allocations that are live.
    pub live: usize,
    /// New suspects to record (first observations).
    pub recorded: Vec<GcSuspect>,
    /// Suspects to forget: live again, or their allocations changed or are gone.
    pub cleared: Vec<AttachmentKey>,
    /// Suspects to release now (seen again past the grace period), oldest first.
    pub release: Vec<GcSuspect>,
    /// Suspects seen again before the grace period ended, with when it ends.
    pub waiting: Vec<(GcSuspect, Timestamp)>,
    /// Suspects due but over this run's cap: released by a later run.
    pub capped: Vec<GcSuspect>,
}

/// Every allocation with an attachment key, grouped by attachment (each group sorted), for
/// the attachments `wanted` selects (a network's, or all of a scope's).
pub fn held_by_attachment(
    engine: &Engine,
    wanted: impl Fn(&AttachmentKey) -> bool,
) -> BTreeMap<AttachmentKey, Vec<GcHeld>> {
    let mut held: BTreeMap<AttachmentKey, Vec<GcHeld>> = BTreeMap::new();
    for pool in engine.dump() {
        for entry in pool.allocations {
            if let Some(key) = entry.key
                && wanted(&key)
            {
                held.entry(key).or_default().push(GcHeld {
                    addr: entry.addr,
                    generation: entry.generation,
                });
            }
        }
    }
    for group in held.values_mut() {
        group.sort_unstable();
    }
    held
}

/// Decides one run. `suspects` are the recorded suspects of the attachments `held` covers
/// (suspects of other attachments must not be passed); `held` is what each attachment holds
/// now ([`held_by_attachment`]), `live` the attachments known to be in use.
pub fn plan_gc(
    suspects: &[GcSuspect],
    held: &BTreeMap<AttachmentKey, Vec<GcHeld>>,
    live: &HashSet<AttachmentKey>,
    now: Timestamp,
    policy: &GcPolicy,
) -> GcPlan {
    let mut plan = GcPlan::default();
    let recorded: BTreeMap<&AttachmentKey, &GcSuspect> =
        suspects.iter().map(|s| (&s.key, s)).collect();
    let mut due = Vec::new();
    for (key, allocations) in held {
        let suspect = recorded.get(key).copied();
        if live.contains(key) {
            plan.live += 1;
            if suspect.is_some() {
                plan.cleared.push(key.clone());
            }
            continue;
        }
        let mut sorted = allocations.clone();
        sorted.sort_unstable();
        match suspect {
            Some(suspect) if suspect.held == sorted => {
                let ends = suspect.first_seen.saturating_add(policy.grace);
                if now >= ends && (policy.grace.is_zero() || now > suspect.first_seen) {
                    due.push(suspect.clone());
                } else {
                    plan.waiting.push((suspect.clone(), ends));
                }
            }
            other => {
                // A different allocation under the same key is a new suspect: its grace
                // period starts now.
                if other.is_some() {
                    plan.cleared.push(key.clone());
                }
                let suspect = GcSuspect {
                    key: key.clone(),
                    first_seen: now,
                    held: sorted,
                };
                // No grace period: this observation is enough.
                if policy.grace.is_zero() {
                    due.push(suspect);
                } else {
                    plan.recorded.push(suspect);
                }
            }
        }
    }
    // Suspects whose attachment holds nothing any more (released meanwhile).
    for suspect in suspects {
        if !held.contains_key(&suspect.key) {
            plan.cleared.push(suspect.key.clone());
        }
    }
    due.sort_by(|a, b| (a.first_seen, &a.key).cmp(&(b.first_seen, &b.key)));
    let cap = policy.max_released.min(due.len());
    plan.capped = due.split_off(cap);
    plan.release = due;
    plan.cleared.sort();
    plan.cleared.dedup();
    plan
}

/// Why [`release_suspect`] released nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GcRefusal {
    #[error("{key} is live again")]
    Live { key: AttachmentKey },
    #[error("{key} no longer holds what was recorded")]
    Changed { key: AttachmentKey },
    #[error(transparent)]
    Engine(#[from] AllocError),
}

/// Releases every allocation of a suspect, checking first (in the caller's transaction, on
/// its engine) that the attachment is still not live and still holds exactly what was
/// recorded: all of it goes, or nothing does.
pub fn release_suspect(
    engine: &mut Engine,
    suspect: &GcSuspect,
    live: &HashSet<AttachmentKey>,
    now: Timestamp,
) -> Result<Vec<Released>, GcRefusal> {
    if engine.is_restoring() {
        return Err(AllocError::RestoreInProgress {
            operation: "garbage collection",
        }
        .into());
    }
    if live.contains(&suspect.key) {
        return Err(GcRefusal::Live {
            key: suspect.key.clone(),
        });
    }
    let mut now_held: Vec<GcHeld> = engine
        .lookup_key(&suspect.key)
        .into_iter()
        .map(|info| GcHeld {
            addr: info.entry.addr,
            generation: info.entry.generation,
        })
        .collect();
    now_held.sort_unstable();
    if now_held != suspect.held {
        return Err(GcRefusal::Changed {
            key: suspect.key.clone(),
        });
    }
    let mut released = Vec::with_capacity(now_held.len());
    for held in &now_held {
        // Checked above, in the same engine: each release names its generation anyway.
        released.push(engine.release(held.addr, Some(held.generation), now)?);
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(container: &str) -> AttachmentKey {
        AttachmentKey::new("net", container, "eth0").unwrap()
    }

    fn held(addrs: &[(&str, u64)]) -> Vec<GcHeld> {
        let mut held: Vec<GcHeld> = addrs
            .iter()
            .map(|(a, g)| GcHeld {
                addr: a.parse().unwrap(),
                generation: *g,
            })
            .collect();
        held.sort_unstable();
        held
    }

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_unix_millis(1_000_000 + seconds * 1000)
    }

    const POLICY: GcPolicy = GcPolicy {
        grace: Duration::from_secs(60),
        max_released: 2,
    };

    #[test]
    fn a_first_observation_only_records() {
        let current = BTreeMap::from([(key("a"), held(&[("10.0.0.2", 1)]))]);
        let plan = plan_gc(&[], &current, &HashSet::new(), at(0), &POLICY);
        assert_eq!(plan.recorded.len(), 1);
        assert_eq!(plan.recorded[0].first_seen, at(0));
        assert!(plan.release.is_empty());
    }

    /// The CNI spec's model (one GC call; stale reservations SHOULD be freed): with no grace
    /// period the first observation releases, a live attachment stays, and the cap holds.
    #[test]
    fn with_no_grace_period_a_first_observation_releases() {
        let current = BTreeMap::from([
            (key("a"), held(&[("10.0.0.2", 1)])),
            (key("b"), held(&[("10.0.0.3", 1), ("fd00::3", 1)])),
            (key("c"), held(&[("10.0.0.4", 1)])),
            (key("live"), held(&[("10.0.0.5", 1)])),
        ]);
        let zero = GcPolicy {
            grace: Duration::ZERO,
            max_released: 2,
        };
        let live = HashSet::from([key("live")]);
        let plan = plan_gc(&[], &current, &live, at(0), &zero);
        assert!(plan.recorded.is_empty(), "{plan:?}");
        let released: Vec<_> = plan.release.iter().map(|s| s.key.clone()).collect();
        assert_eq!(released, vec![key("a"), key("b")]);
        assert_eq!(plan.release[1].held.len(), 2, "an attachment goes whole");
        assert_eq!(plan.capped.len(), 1);
        assert_eq!(plan.live, 1);
        // With a grace period the same run only records.
        let plan = plan_gc(&[], &current, &live, at(0), &POLICY);
        assert!(plan.release.is_empty());
        assert_eq!(plan.recorded.len(), 3);
    }

    #[test]
    fn a_clock_that_went_back_waits() {
        let current = BTreeMap::from([(key("a"), held(&[("10.0.0.2", 1)]))]);
        let suspect = GcSuspect {
            key: key("a"),
            first_seen: at(100),
            held: held(&[("10.0.0.2", 1)]),
        };
        let zero = GcPolicy {
            grace: Duration::ZERO,
            max_released: 1,
        };
        let plan = plan_gc(&[suspect], &current, &HashSet::new(), at(50), &zero);
        assert!(plan.release.is_empty());
        assert_eq!(plan.waiting.len(), 1);
    }

    #[test]
    fn a_suspect_of_an_attachment_holding_nothing_is_cleared() {
        let suspect = GcSuspect {
            key: key("a"),
            first_seen: at(0),
            held: held(&[("10.0.0.2", 1)]),
        };
        let plan = plan_gc(
            &[suspect],
            &BTreeMap::new(),
            &HashSet::new(),
            at(100),
            &POLICY,
        );
        assert_eq!(plan.cleared, vec![key("a")]);
    }
}
