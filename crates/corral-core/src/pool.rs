//! A pool's per-family state: its ranges, exclusions, reservations, cooldowns and the blocked set.
//!
//! Invariant (checked by the property tests): `blocked` is exactly the complement of
//! "free to hand out next", that is every address outside the active (non-draining) ranges,
//! plus every allocated, excluded, reserved and cooling address inside them. Allocation is
//! then one lookup in `blocked` from the cursor, and a wrap-around lookup from zero.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hashbrown::HashMap;

use crate::addr::Family;
use crate::runs::RunSet;
use crate::spec::{Exclusion, RangeSpec};
use crate::time::Timestamp;

/// How the next free address is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReusePolicy {
    /// Continue after the last address handed out, wrapping around at the end (host-local's
    /// behaviour): a just-released address comes back only once the cursor has come round to
    /// it. With a cooldown, it also waits until nothing else is free.
    #[default]
    NextFit,
    /// Always the lowest free address, for users who want compact allocations.
    LowestFree,
}

/// Settings of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolConfig {
    /// An address released less than this long ago is handed out only when nothing else is
    /// free (AWS VPC CNI's IP cooldown).
    pub cooldown: Duration,
    pub reuse: ReusePolicy,
}

impl PoolConfig {
    /// The cooldown used when none is configured, as AWS VPC CNI's default.
    pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            cooldown: PoolConfig::DEFAULT_COOLDOWN,
            reuse: ReusePolicy::NextFit,
        }
    }
}

/// One range of a pool.
#[derive(Clone, Debug)]
pub(crate) struct Range {
    pub spec: RangeSpec,
    pub end: u128,
    pub n_allocated: u64,
    /// Removed while holding allocations: no new allocations, dropped with its last release.
    pub draining: bool,
}

/// Addresses in cooldown, oldest release first.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cooling {
    by_time: BTreeSet<(Timestamp, u128)>,
    by_addr: HashMap<u128, Timestamp>,
}

impl Cooling {
    pub fn insert(&mut self, value: u128, released_at: Timestamp) {
        if let Some(old) = self.by_addr.insert(value, released_at) {
            self.by_time.remove(&(old, value));
        }
        self.by_time.insert((released_at, value));
    }

    pub fn remove(&mut self, value: u128) -> bool {
        match self.by_addr.remove(&value) {
            Some(at) => {
                self.by_time.remove(&(at, value));
                true
            }
            None => false,
        }
    }

    pub fn released_at(&self, value: u128) -> Option<Timestamp> {
        self.by_addr.get(&value).copied()
    }

    /// The address released longest ago.
    pub fn oldest(&self) -> Option<(Timestamp, u128)> {
        self.by_time.first().copied()
    }

    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    /// Entries inside `low..=high`, by scanning (used only by administrative operations).
    pub fn values_in(&self, low: u128, high: u128) -> Vec<u128> {
        self.by_addr
            .keys()
            .copied()
            .filter(|v| (low..=high).contains(v))
            .collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u128, Timestamp)> + '_ {
        self.by_time.iter().map(|&(at, value)| (value, at))
    }
}

/// Everything one pool knows about one family.
#[derive(Clone, Debug)]
pub(crate) struct PoolFamily {
    pub family: Family,
    /// Ranges by their first address.
    pub ranges: BTreeMap<u128, Range>,
    /// Where next-fit continues.
    pub cursor: u128,
    /// See the module comment.
    pub blocked: RunSet,
    /// The union of the pool's exclusions of this family.
    pub excluded: RunSet,
    /// Gateways of the pool's ranges, counted by how many ranges name them.
    pub reserved: HashMap<u128, u32>,
    pub cooling: Cooling,
    /// Allocations of this pool and family, wherever they are (draining or no range included).
    pub n_allocated: u64,
}

impl PoolFamily {
    pub fn new(family: Family) -> PoolFamily {
        let mut blocked = RunSet::new();
        blocked.insert_range(0, family.max_value());
        PoolFamily {
            family,
            ranges: BTreeMap::new(),
            cursor: 0,
            blocked,
            excluded: RunSet::new(),
            reserved: HashMap::new(),
            cooling: Cooling::default(),
            n_allocated: 0,
        }
    }

    /// The range holding `value`, draining or not.
    pub fn range_of(&self, value: u128) -> Option<(&u128, &Range)> {
        self.ranges
            .range(..=value)
            .next_back()
            .filter(|(_, range)| range.end >= value)
    }

    pub fn range_of_mut(&mut self, value: u128) -> Option<&mut Range> {
        self.ranges
            .range_mut(..=value)
            .next_back()
            .map(|(_, range)| range)
            .filter(|range| range.end >= value)
    }

    pub fn is_active_capacity(&self, value: u128) -> bool {
        self.range_of(value)
            .is_some_and(|(_, range)| !range.draining)
    }

    /// Whether an address must stay blocked for a reason other than being allocated or cooling.
    pub fn is_held_back(&self, value: u128) -> bool {
        self.excluded.contains(value) || self.reserved.contains_key(&value)
    }

    /// The next free address from the cursor (or from the bottom), wrapping around once.
    pub fn find_free(&self, policy: ReusePolicy) -> Option<u128> {
        let max = self.family.max_value();
        let from = match policy {
            ReusePolicy::NextFit => self.cursor.min(max),
            ReusePolicy::LowestFree => 0,
        };
        self.blocked.first_absent(from, max).or_else(|| {
            from.checked_sub(1)
                .and_then(|below| self.blocked.first_absent(0, below))
        })
    }

    /// Moves cooled-down addresses back to free.
    pub fn expire_cooling(&mut self, now: Timestamp, cooldown: Duration) {
        while let Some((released_at, value)) = self.cooling.oldest() {
            if released_at.saturating_add(cooldown) > now {
                break;
            }
            self.cooling.remove(value);
            if self.is_active_capacity(value) && !self.is_held_back(value) {
                self.blocked.remove(value);
            }
        }
    }

    /// Adds an exclusion's addresses to the merged set and the blocked set.
    pub fn add_exclusion(&mut self, exclusion: &Exclusion) {
        let (low, high) = exclusion.bounds();
        self.excluded.insert_range(low, high);
        self.blocked.insert_range(low, high);
        // An exclusion outranks a cooldown: the address is not coming back when it cools.
        for value in self.cooling.values_in(low, high) {
            self.cooling.remove(value);
        }
    }

    /// Recomputes `blocked` on `low..=high` from its sources; `allocated` lists this pool and
    /// family's allocated addresses inside the interval.
    pub fn rebuild(&mut self, low: u128, high: u128, allocated: &[u128]) {
        self.blocked.insert_range(low, high);
        let active: Vec<(u128, u128)> = self
            .ranges
            .iter()
            .filter(|(_, range)| !range.draining)
            .map(|(&start, range)| (start, range.end))
            .filter(|&(start, end)| start <= high && end >= low)
            .collect();
        for (start, end) in active {
            self.blocked.remove_range(start.max(low), end.min(high));
        }
        let excluded: Vec<(u128, u128)> = self.excluded.runs_in(low, high).collect();
        for (start, end) in excluded {
            self.blocked.insert_range(start, end);
        }
        let points = self
            .reserved
            .keys()
            .copied()
            .chain(self.cooling.values_in(low, high))
            .chain(allocated.iter().copied())
            .filter(|v| (low..=high).contains(v))
            .collect::<Vec<_>>();
        for value in points {
            self.blocked.insert(value);
        }
    }
}
