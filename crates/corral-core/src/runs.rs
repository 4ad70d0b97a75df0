//! A set of integers stored as maximal runs: the structure that makes allocation O(log n) in
//! the engine, and the occupancy of the cluster's address spaces (corral-cluster's `space.rs`).
//!
//! Invariant: runs are disjoint, non-adjacent (`a.end + 1 < b.start`) and non-empty. Because they
//! are maximal, the first integer after a run is never in the set, so "next member-free integer
//! at or after x" is one ordered-map lookup whatever the fill level. Memory is one map entry per
//! run, so a sequentially filled /64 costs one entry, not a bitmap of 2^64 bits.

use std::collections::BTreeMap;
use std::ops::Bound;

/// A set of `u128` values kept as maximal inclusive runs `start..=end`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunSet {
    runs: BTreeMap<u128, u128>,
}

impl RunSet {
    pub fn new() -> RunSet {
        RunSet::default()
    }

    /// The number of maximal runs (the set's memory, in map entries).
    pub fn n_runs(&self) -> usize {
        self.runs.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The first run (in order) that shares a value with `start..=end`, unclipped.
    pub fn first_overlap(&self, start: u128, end: u128) -> Option<(u128, u128)> {
        if start > end {
            return None;
        }
        if let Some(run) = self.run_containing(start) {
            return Some(run);
        }
        self.runs.range(start..=end).next().map(|(&s, &e)| (s, e))
    }

    /// Whether any value of `start..=end` is in the set.
    pub fn intersects(&self, start: u128, end: u128) -> bool {
        self.first_overlap(start, end).is_some()
    }

    /// Whether every value of `start..=end` is in the set.
    pub fn covers(&self, start: u128, end: u128) -> bool {
        start <= end && self.run_containing(start).is_some_and(|(_, e)| e >= end)
    }

    /// The run holding `value`, if any.
    fn run_containing(&self, value: u128) -> Option<(u128, u128)> {
        let (&start, &end) = self.runs.range(..=value).next_back()?;
        (end >= value).then_some((start, end))
    }

    pub fn contains(&self, value: u128) -> bool {
        self.run_containing(value).is_some()
    }

    /// The smallest value in `low..=high` that is not in the set.
    pub fn first_absent(&self, low: u128, high: u128) -> Option<u128> {
        if low > high {
            return None;
        }
        match self.run_containing(low) {
            None => Some(low),
            // Runs are maximal, so `end + 1` is absent (when it exists).
            Some((_, end)) => (end < high).then(|| end + 1),
        }
    }

    /// Adds one value; returns false if it was already present.
    ///
    /// The common cases (extending a run at either end, a new isolated value) cost two
    /// lookups and no allocation.
    pub fn insert(&mut self, value: u128) -> bool {
        let mut extend_previous = false;
        if let Some((_, end)) = self.runs.range_mut(..=value).next_back() {
            if *end >= value {
                return false;
            }
            if *end + 1 == value {
                *end = value;
                extend_previous = true;
            }
        }
        let next_end = value
            .checked_add(1)
            .and_then(|next| self.runs.remove(&next));
        match (extend_previous, next_end) {
            (true, Some(next_end)) => {
                if let Some((_, end)) = self.runs.range_mut(..=value).next_back() {
                    *end = next_end;
                }
            }
            (false, Some(next_end)) => {
                self.runs.insert(value, next_end);
            }
            (false, None) => {
                self.runs.insert(value, value);
            }
            (true, None) => {}
        }
        true
    }

    /// Adds `start..=end`, merging with touching runs; returns true if any value was new (an
    /// empty range, `start > end`, adds nothing).
    pub fn insert_range(&mut self, start: u128, end: u128) -> bool {
        if start > end {
            return false;
        }
        let mut new_start = start;
        let mut new_end = end;
        // A run that starts before `start` and reaches it (or is adjacent) merges in.
        if let Some((&prev_start, &prev_end)) = self.runs.range(..=start).next_back()
            && prev_end.saturating_add(1) >= start
        {
            if prev_end >= end {
                return false;
            }
            new_start = prev_start;
        }
        // Every run that starts inside (or right after) the new one merges in.
        let upper = end.saturating_add(1);
        let absorbed: Vec<u128> = self
            .runs
            .range((Bound::Included(new_start), Bound::Included(upper)))
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

    /// Removes one value; returns false if it was not present.
    pub fn remove(&mut self, value: u128) -> bool {
        let Some((&start, end)) = self.runs.range_mut(..=value).next_back() else {
            return false;
        };
        if *end < value {
            return false;
        }
        let old_end = *end;
        if start == value {
            self.runs.remove(&start);
        } else {
            *end = value - 1;
        }
        if old_end > value {
            self.runs.insert(value + 1, old_end);
        }
        true
    }

    /// Removes `start..=end`, splitting runs as needed; returns false if no value was present.
    pub fn remove_range(&mut self, start: u128, end: u128) -> bool {
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

    /// How many values of `low..=high` are in the set (saturating at `u128::MAX`).
    pub fn count_in(&self, low: u128, high: u128) -> u128 {
        self.runs_in(low, high)
            .map(|(s, e)| e - s)
            .fold(0u128, |acc, span| {
                acc.saturating_add(span).saturating_add(1)
            })
    }

    /// The runs clipped to `low..=high`, in order (none when `low > high`).
    pub fn runs_in(&self, low: u128, high: u128) -> impl Iterator<Item = (u128, u128)> + '_ {
        let first = self.run_containing(low).map(|(s, _)| s).unwrap_or(low);
        (low <= high)
            .then(|| self.runs.range(first..=high))
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

    fn runs(set: &RunSet) -> Vec<(u128, u128)> {
        set.iter().collect()
    }

    #[test]
    fn inserts_merge_into_maximal_runs() {
        let mut set = RunSet::new();
        assert!(set.insert(5));
        assert!(set.insert(7));
        assert_eq!(runs(&set), vec![(5, 5), (7, 7)]);
        assert!(set.insert(6));
        assert_eq!(runs(&set), vec![(5, 7)]);
        assert!(!set.insert(6));
        assert!(set.insert_range(0, 4));
        assert_eq!(runs(&set), vec![(0, 7)]);
        assert!(set.insert_range(10, 20));
        assert!(set.insert_range(8, 9));
        assert_eq!(runs(&set), vec![(0, 20)]);
    }

    #[test]
    fn removal_splits_runs() {
        let mut set = RunSet::new();
        set.insert_range(0, 10);
        assert!(set.remove(5));
        assert_eq!(runs(&set), vec![(0, 4), (6, 10)]);
        assert!(set.remove(0));
        assert!(set.remove(10));
        assert!(!set.remove(10));
        assert_eq!(runs(&set), vec![(1, 4), (6, 9)]);
        assert!(set.remove(4));
        assert!(set.remove(1));
        assert_eq!(runs(&set), vec![(2, 3), (6, 9)]);
    }

    #[test]
    fn first_absent_skips_a_whole_run_in_one_step() {
        let mut set = RunSet::new();
        set.insert_range(100, 199);
        assert_eq!(set.first_absent(0, 1000), Some(0));
        assert_eq!(set.first_absent(100, 1000), Some(200));
        assert_eq!(set.first_absent(150, 199), None);
        assert_eq!(set.first_absent(150, 200), Some(200));
        assert_eq!(set.first_absent(5, 4), None);
    }

    #[test]
    fn extremes_of_the_u128_space_do_not_overflow() {
        let mut set = RunSet::new();
        set.insert_range(u128::MAX - 1, u128::MAX);
        set.insert(0);
        assert_eq!(set.first_absent(u128::MAX - 1, u128::MAX), None);
        assert_eq!(set.count_in(0, u128::MAX), 3);
        set.insert_range(0, u128::MAX);
        assert_eq!(set.count_in(0, u128::MAX), u128::MAX);
        assert!(set.remove(u128::MAX));
        assert_eq!(runs(&set), vec![(0, u128::MAX - 1)]);
    }

    #[test]
    fn count_and_clipped_runs() {
        let mut set = RunSet::new();
        set.insert_range(0, 9);
        set.insert_range(20, 29);
        assert_eq!(set.count_in(5, 24), 10);
        assert_eq!(
            set.runs_in(5, 24).collect::<Vec<_>>(),
            vec![(5, 9), (20, 24)]
        );
    }

    #[test]
    fn insert_merges_touching_runs_and_remove_splits() {
        let mut set = RunSet::new();
        assert!(set.insert_range(10, 19));
        assert!(set.insert_range(30, 39));
        assert!(set.insert_range(20, 29));
        assert_eq!(runs(&set), [(10, 39)]);
        assert!(!set.insert_range(12, 15));
        assert!(set.remove_range(15, 24));
        assert_eq!(runs(&set), [(10, 14), (25, 39)]);
        assert_eq!(set.count_in(0, 100), 20);
        assert_eq!(set.first_overlap(0, 12), Some((10, 14)));
        assert_eq!(set.first_overlap(15, 24), None);
        assert!(set.covers(25, 39));
        assert!(!set.covers(14, 25));
        assert!(!set.remove_range(15, 24));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let mut set = RunSet::new();
        assert!(set.insert_range(u128::MAX - 1, u128::MAX));
        assert!(set.insert_range(0, 0));
        assert!(set.remove_range(u128::MAX, u128::MAX));
        assert_eq!(runs(&set), [(0, 0), (u128::MAX - 1, u128::MAX - 1)]);
        assert_eq!(set.count_in(0, u128::MAX), 2);
        assert!(set.insert_range(0, u128::MAX));
        assert_eq!(set.count_in(0, u128::MAX), u128::MAX);
    }
}
