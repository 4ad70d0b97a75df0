//! Ranges blocked by keys that occupy no counted slot (a held range without its grant, a
//! foreign key): a multiset, since ranges may overlap and the same range may be blocked more
//! than once (each block is undone by one unblock), with their union kept as runs, so a
//! search meets a stretch of blocked ranges as one run, whatever their number.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use corral_core::RunSet;

/// Blocked ranges `start..=end`, counted, and their union.
#[derive(Debug, Clone, Default)]
pub(super) struct Blocked {
    /// Each distinct range, with how many blocks name it.
    ranges: BTreeMap<(u128, u128), usize>,
    /// The distinct ranges' lengths (`end - start`), with how many ranges have each: the
    /// longest bounds how far before a point a range covering it can start.
    lengths: BTreeMap<u128, usize>,
    /// The union of the ranges.
    union: RunSet,
}

impl Blocked {
    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Blocks `start..=end` once more.
    pub(super) fn block(&mut self, start: u128, end: u128) {
        let count = self.ranges.entry((start, end)).or_default();
        *count += 1;
        if *count == 1 {
            *self.lengths.entry(end - start).or_default() += 1;
            self.union.insert_range(start, end);
        }
    }

    /// Undoes one block of exactly `start..=end`; nothing if there is none. What other ranges
    /// block stays blocked.
    pub(super) fn unblock(&mut self, start: u128, end: u128) {
        let Entry::Occupied(mut count) = self.ranges.entry((start, end)) else {
            return;
        };
        *count.get_mut() -= 1;
        if *count.get() > 0 {
            return;
        }
        count.remove();
        if let Entry::Occupied(mut length) = self.lengths.entry(end - start) {
            *length.get_mut() -= 1;
            if *length.get() == 0 {
                length.remove();
            }
        }
        self.union.remove_range(start, end);
        let others: Vec<(u128, u128)> = self.overlapping(start, end).collect();
        for (s, e) in others {
            self.union.insert_range(s.max(start), e.min(end));
        }
    }

    /// The distinct ranges that share a value with `start..=end`.
    fn overlapping(&self, start: u128, end: u128) -> impl Iterator<Item = (u128, u128)> + '_ {
        let longest = self.lengths.last_key_value().map_or(0, |(l, _)| *l);
        let from = start.saturating_sub(longest);
        self.ranges
            .range((from, 0)..=(end, u128::MAX))
            .map(|(range, _)| *range)
            .filter(move |&(s, e)| s <= end && start <= e)
    }

    /// The end of the run of blocked values that shares a value with `start..=end` first, if
    /// any: everything from where it starts to its end is blocked.
    pub(super) fn run_end(&self, start: u128, end: u128) -> Option<u128> {
        self.union.first_overlap(start, end).map(|(_, e)| e)
    }

    /// Whether `value` is blocked.
    #[cfg(test)]
    pub(super) fn contains(&self, value: u128) -> bool {
        self.union.contains(value)
    }

    /// The union's runs, in order.
    pub(super) fn runs(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.union.iter()
    }

    /// The distinct blocked ranges, in order.
    #[cfg(test)]
    pub(super) fn ranges(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.ranges.keys().copied()
    }

    /// How many runs the union holds (what a search meets).
    pub(super) fn n_runs(&self) -> usize {
        self.union.n_runs()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_stretch_of_blocked_ranges_is_one_run() {
        let mut blocked = Blocked::default();
        for i in 0..10_000u128 {
            blocked.block(i * 64, i * 64 + 63);
        }
        assert_eq!(blocked.n_runs(), 1);
        assert_eq!(blocked.run_end(100, 100), Some(10_000 * 64 - 1));
        blocked.unblock(64, 127);
        assert_eq!(blocked.n_runs(), 2);
        assert_eq!(blocked.run_end(0, 200), Some(63));
        assert_eq!(blocked.run_end(64, 127), None);
        assert_eq!(blocked.run_end(64, 128), Some(10_000 * 64 - 1));
    }

    #[test]
    fn a_range_blocked_twice_needs_two_unblocks_and_overlaps_keep_their_part() {
        let mut blocked = Blocked::default();
        blocked.block(0, 127);
        blocked.block(0, 127);
        blocked.block(64, 255);
        blocked.unblock(0, 127);
        assert!(blocked.contains(0));
        blocked.unblock(0, 127);
        assert!(!blocked.contains(0) && !blocked.contains(63));
        assert!(blocked.contains(64) && blocked.contains(255));
        blocked.unblock(1, 127); // never blocked: nothing changes
        assert!(blocked.contains(64));
        blocked.unblock(64, 255);
        assert!(blocked.is_empty() && blocked.runs().next().is_none());
    }

    proptest! {
        /// Against the plain list it replaces: one entry per block, a linear search.
        #[test]
        fn agrees_with_a_list_of_blocks(
            ops in prop::collection::vec((0u8..3, 0u128..40, 0u128..12, any::<usize>()), 1..120),
            probes in prop::collection::vec((0u128..60, 0u128..8), 1..30),
        ) {
            let mut blocked = Blocked::default();
            let mut list: Vec<(u128, u128)> = Vec::new();
            for (op, start, len, pick) in ops {
                // Blocks, unblocks of a range picked at random (mostly never blocked), and
                // unblocks of one that is (overlapping others, or blocked twice).
                let range = match op {
                    2 if !list.is_empty() => list[pick % list.len()],
                    _ => (start, start + len),
                };
                if op == 0 {
                    blocked.block(range.0, range.1);
                    list.push(range);
                } else {
                    blocked.unblock(range.0, range.1);
                    if let Some(i) = list.iter().position(|r| *r == range) {
                        list.swap_remove(i);
                    }
                }
            }
            for value in 0..60 {
                let listed = list.iter().any(|&(s, e)| s <= value && value <= e);
                prop_assert_eq!(blocked.contains(value), listed, "value {}", value);
            }
            for (start, len) in probes {
                let end = start + len;
                let listed = list.iter().any(|&(s, e)| s <= end && start <= e);
                let run = blocked.run_end(start, end);
                prop_assert_eq!(run.is_some(), listed);
                if let Some(run_end) = run {
                    // The run ends at a blocked value, is blocked up to there from where it
                    // meets the probe, and goes no further.
                    let from = (start..=end).find(|v| blocked.contains(*v)).unwrap();
                    let in_list = |v: u128| list.iter().any(|&(s, e)| s <= v && v <= e);
                    prop_assert!((from..=run_end).all(in_list));
                    let next = run_end + 1;
                    prop_assert!(!list.iter().any(|&(s, e)| s <= next && next <= e));
                }
            }
            let mut distinct: Vec<(u128, u128)> = list.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(blocked.ranges().collect::<Vec<_>>(), distinct);
        }
    }
}
