//! `IntervalSet`: a set of `u128` kept as maximal inclusive runs, the occupancy structure of the cluster spaces.
//!
//! Invariant: runs are disjoint, non-adjacent and non-empty, so memory follows the number of
//! runs (what is occupied), never the size of the space, and "the run blocking x" is one ordered
//! map lookup.

use std::collections::BTreeMap;

/// A set of `u128` values stored as maximal runs `start..=end` in a `BTreeMap`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntervalSet {
    runs: BTreeMap<u128, u128>,
}

impl IntervalSet {
    /// An empty set.
    pub fn new() -> IntervalSet {
        IntervalSet::default()
    }

    /// The number of maximal runs (the set's memory, in map entries).
    pub fn n_runs(&self) -> usize {
        self.runs.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The first run (in address order) that shares a value with `start..=end`, unclipped.
    pub fn first_overlap(&self, start: u128, end: u128) -> Option<(u128, u128)> {
        if start > end {
            return None;
        }
        if let Some((&s, &e)) = self.runs.range(..=start).next_back()
            && e >= start
        {
            return Some((s, e));
        }
        self.runs.range(start..=end).next().map(|(&s, &e)| (s, e))
    }

    /// Whether any value of `start..=end` is in the set.
    pub fn intersects(&self, start: u128, end: u128) -> bool {
        self.first_overlap(start, end).is_some()
    }

    /// Whether every value of `start..=end` is in the set.
    pub fn covers(&self, start: u128, end: u128) -> bool {
        start <= end
            && self
                .runs
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }

    /// Adds `start..=end`, merging with touching runs; returns false if every value was present.
    pub fn insert(&mut self, start: u128, end: u128) -> bool {
        if start > end || self.covers(start, end) {
            return false;
        }
        let mut new_start = start;
        let mut new_end = end;
        if let Some((&s, &e)) = self.runs.range(..=start).next_back()
            && e.saturating_add(1) >= start
        {
            new_start = s;
            new_end = new_end.max(e);
        }
        let upper = end.saturating_add(1);
        let absorbed: Vec<u128> = self
            .runs
            .range(new_start..=upper)
            .map(|(&s, _)| s)
            .collect();
        for run_start in absorbed {
            if let Some(run_end) = self.runs.remove(&run_start) {
                new_end = new_end.max(run_end);
            }
        }
        self.runs.insert(new_start, new_end);
        true
    }

    /// Removes `start..=end`, splitting runs as needed; returns false if no value was present.
    pub fn remove(&mut self, start: u128, end: u128) -> bool {
        if start > end || !self.intersects(start, end) {
            return false;
        }
        let mut touched: Vec<(u128, u128)> = Vec::new();
        if let Some((&s, &e)) = self.runs.range(..start).next_back()
            && e >= start
        {
            touched.push((s, e));
        }
        touched.extend(self.runs.range(start..=end).map(|(&s, &e)| (s, e)));
        for (s, e) in touched {
            self.runs.remove(&s);
            if s < start {
                self.runs.insert(s, start - 1);
            }
            if e > end {
                self.runs.insert(end + 1, e);
            }
        }
        true
    }

    /// How many values of `low..=high` are in the set (saturating).
    pub fn count_in(&self, low: u128, high: u128) -> u128 {
        self.runs_in(low, high).fold(0u128, |acc, (s, e)| {
            acc.saturating_add(e - s).saturating_add(1)
        })
    }

    /// The runs clipped to `low..=high`, in order.
    pub fn runs_in(&self, low: u128, high: u128) -> impl Iterator<Item = (u128, u128)> + '_ {
        let first = match self.runs.range(..=low).next_back() {
            Some((&s, &e)) if e >= low => s,
            _ => low,
        };
        let range = if low <= high {
            Some(self.runs.range(first..=high))
        } else {
            None
        };
        range
            .into_iter()
            .flatten()
            .map(move |(&s, &e)| (s.max(low), e.min(high)))
    }

    /// All runs in order.
    pub fn iter(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.runs.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(set: &IntervalSet) -> Vec<(u128, u128)> {
        set.iter().collect()
    }

    #[test]
    fn insert_merges_touching_runs_and_remove_splits() {
        let mut set = IntervalSet::new();
        assert!(set.insert(10, 19));
        assert!(set.insert(30, 39));
        assert!(set.insert(20, 29));
        assert_eq!(runs(&set), [(10, 39)]);
        assert!(!set.insert(12, 15));
        assert!(set.remove(15, 24));
        assert_eq!(runs(&set), [(10, 14), (25, 39)]);
        assert_eq!(set.count_in(0, 100), 20);
        assert_eq!(set.first_overlap(0, 12), Some((10, 14)));
        assert_eq!(set.first_overlap(15, 24), None);
        assert!(set.covers(25, 39));
        assert!(!set.covers(14, 25));
        assert!(!set.remove(15, 24));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let mut set = IntervalSet::new();
        assert!(set.insert(u128::MAX - 1, u128::MAX));
        assert!(set.insert(0, 0));
        assert!(set.remove(u128::MAX, u128::MAX));
        assert_eq!(runs(&set), [(0, 0), (u128::MAX - 1, u128::MAX - 1)]);
        assert_eq!(set.count_in(0, u128::MAX), 2);
        assert!(set.insert(0, u128::MAX));
        assert_eq!(set.count_in(0, u128::MAX), u128::MAX);
    }
}
