//! The leaked-interface collector's decision: Cilium's two-observation rule with AWS VPC CNI's
//! minimum age (CLUSTER-DESIGN 1.4, 2.3).

use std::collections::BTreeMap;

use crate::keys::CloudId;

/// An interface the leaked-interface collector looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakCandidate {
    /// The interface.
    pub id: CloudId,
    /// It carries corral's tags for this cluster (never touch anything else).
    pub tagged: bool,
    /// It is `available`: not attached, not attaching, not detaching.
    pub available: bool,
    /// When corral created it (its creation tag), if known.
    pub created_ms: Option<u64>,
    /// A `interfaces/` record or an open intent names it (then it is not a leak).
    pub recorded: bool,
}

/// What one collector run does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GcPlan {
    /// Delete these now: tagged, available, unrecorded, seen so on a run at least the
    /// interval ago and created at least the interval ago; at most the cap, oldest sightings
    /// first (ties: lowest ID).
    pub delete: Vec<CloudId>,
    /// The first sightings to keep for the next run: every leak candidate not deleted now
    /// (sightings of interfaces no longer candidates are forgotten).
    pub seen: BTreeMap<CloudId, u64>,
    /// Leaks old enough left for a later run by the cap.
    pub over_cap: usize,
}

/// Cilium's two-observation rule for leaked interfaces, with AWS VPC CNI's minimum age: an
/// interface is deleted only if it is tagged, available and unrecorded now, was first seen so
/// on an earlier run at least `interval_ms` ago (`seen`: the last run's `GcPlan::seen`), and
/// (when its creation time is known) was created at least `interval_ms` ago. A leader's first
/// run deletes nothing (its `seen` is empty). Untagged, attached or recorded interfaces are
/// never deleted and lose their sighting.
pub fn plan_leak_gc(
    candidates: &[LeakCandidate],
    seen: &BTreeMap<CloudId, u64>,
    now_ms: u64,
    interval_ms: u64,
    cap: usize,
) -> GcPlan {
    let mut plan = GcPlan::default();
    let mut ripe: Vec<(u64, &CloudId)> = Vec::new();
    for c in candidates {
        if !c.tagged || !c.available || c.recorded {
            continue;
        }
        let first = seen.get(&c.id).copied().unwrap_or(now_ms).min(now_ms);
        let old_enough = |t: u64| now_ms.saturating_sub(t) >= interval_ms;
        if seen.contains_key(&c.id) && old_enough(first) && c.created_ms.is_none_or(old_enough) {
            ripe.push((first, &c.id));
        }
        plan.seen.insert(c.id.clone(), first);
    }
    ripe.sort();
    plan.over_cap = ripe.len().saturating_sub(cap);
    for (_, id) in ripe.into_iter().take(cap) {
        plan.seen.remove(id);
        plan.delete.push(id.clone());
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN5: u64 = 300_000;

    fn leak(id: &str) -> LeakCandidate {
        LeakCandidate {
            id: CloudId::new(id).unwrap(),
            tagged: true,
            available: true,
            created_ms: None,
            recorded: false,
        }
    }

    fn id(s: &str) -> CloudId {
        CloudId::new(s).unwrap()
    }

    #[test]
    fn two_observations_an_interval_apart() {
        let c = [leak("eni-a")];
        let run1 = plan_leak_gc(&c, &BTreeMap::new(), 1_000_000, MIN5, 25);
        assert!(run1.delete.is_empty(), "first sighting only");
        assert_eq!(run1.seen.get(&id("eni-a")), Some(&1_000_000));
        let early = plan_leak_gc(&c, &run1.seen, 1_000_000 + MIN5 - 1, MIN5, 25);
        assert!(early.delete.is_empty());
        assert_eq!(early.seen, run1.seen, "the first sighting is kept");
        let run2 = plan_leak_gc(&c, &early.seen, 1_000_000 + MIN5, MIN5, 25);
        assert_eq!(run2.delete, vec![id("eni-a")]);
        assert!(run2.seen.is_empty());
    }

    #[test]
    fn never_untagged_attached_recorded_or_fresh() {
        let untagged = LeakCandidate {
            tagged: false,
            ..leak("eni-u")
        };
        let attached = LeakCandidate {
            available: false,
            ..leak("eni-t")
        };
        let recorded = LeakCandidate {
            recorded: true,
            ..leak("eni-r")
        };
        let fresh = LeakCandidate {
            created_ms: Some(2 * MIN5),
            ..leak("eni-f")
        };
        let c = [untagged, attached, recorded, fresh];
        let seen: BTreeMap<CloudId, u64> = c.iter().map(|c| (c.id.clone(), 0)).collect();
        let plan = plan_leak_gc(&c, &seen, 2 * MIN5 + 10, MIN5, 25);
        assert!(plan.delete.is_empty());
        // Sightings of non-candidates are forgotten; the fresh one keeps its sighting.
        assert_eq!(plan.seen.keys().collect::<Vec<_>>(), vec![&id("eni-f")]);
        let plan = plan_leak_gc(&c, &plan.seen, 3 * MIN5, MIN5, 25);
        assert_eq!(plan.delete, vec![id("eni-f")]);
        // An interface attached between the runs is not deleted, and seen again from scratch.
        let back = [leak("eni-t")];
        let plan = plan_leak_gc(&back, &BTreeMap::new(), 4 * MIN5, MIN5, 25);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn at_most_the_cap_oldest_first() {
        let c: Vec<LeakCandidate> = (0..30).map(|i| leak(&format!("eni-{i:02}"))).collect();
        let seen: BTreeMap<CloudId, u64> = c
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), 100 - i as u64))
            .collect();
        let plan = plan_leak_gc(&c, &seen, 100 + MIN5, MIN5, 25);
        assert_eq!(plan.delete.len(), 25);
        assert_eq!(plan.over_cap, 5);
        assert_eq!(plan.delete[0], id("eni-29"), "oldest sighting first");
        assert_eq!(plan.seen.len(), 5);
        let next = plan_leak_gc(&c[..5], &plan.seen, 100 + 2 * MIN5, MIN5, 25);
        assert_eq!(next.delete.len(), 5);
        assert!(
            plan_leak_gc(&c, &seen, 100 + MIN5, MIN5, 0)
                .delete
                .is_empty()
        );
    }
}
