//! A pool's per-family state: its ranges with their occupancy, exclusions, reservations and
//! cooldowns.
//!
//! Invariant (checked by `Engine::check_invariants`): a range's occupancy has a position set
//! exactly when that address is allocated, excluded, reserved (a gateway of the pool) or, in
//! an active range, cooling. `n_blocked` counts the set positions, and `with_free` lists the
//! active ranges that still have a clear one. Allocation therefore picks a range from
//! `with_free` and asks its occupancy for the first clear position from the range's cursor.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hashbrown::HashMap;

use crate::addr::Family;
use crate::bitmap::Bitmap;
use crate::runs::RunSet;
use crate::spec::{Exclusion, RangeSpec};
use crate::time::Timestamp;

/// How the next free address is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReusePolicy {
    /// Continue after the last address handed out in the range, wrapping around at the end
    /// (host-local's behaviour): a just-released address comes back only once the cursor has
    /// come round to it. With a cooldown, it also waits until nothing else is free.
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

/// Ranges up to this many addresses get a dense hierarchical bitmap (128 KiB at most);
/// larger ones a run set, whose memory follows what is blocked, not the size of the range.
const DENSE_MAX: u128 = 1 << 20;

/// Which positions of a range (offsets from its first address) are blocked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Occupancy {
    Dense(Bitmap),
    Sparse(RunSet),
}

impl Occupancy {
    fn new(size: u128) -> Occupancy {
        if size <= DENSE_MAX {
            Occupancy::Dense(Bitmap::new(size as u64))
        } else {
            Occupancy::Sparse(RunSet::new())
        }
    }

    fn set(&mut self, offset: u128) -> bool {
        match self {
            Occupancy::Dense(bitmap) => bitmap.set(offset as u64),
            Occupancy::Sparse(runs) => runs.insert(offset),
        }
    }

    fn clear(&mut self, offset: u128) -> bool {
        match self {
            Occupancy::Dense(bitmap) => bitmap.clear(offset as u64),
            Occupancy::Sparse(runs) => runs.remove(offset),
        }
    }

    /// Sets `low..=high`; returns how many positions were newly set.
    fn set_range(&mut self, low: u128, high: u128) -> u128 {
        match self {
            Occupancy::Dense(bitmap) => u128::from(bitmap.fill(low as u64, high as u64, true)),
            Occupancy::Sparse(runs) => {
                let before = runs.count_in(low, high);
                runs.insert_range(low, high);
                (high - low).saturating_add(1) - before
            }
        }
    }

    fn first_clear(&self, from: u128, to: u128) -> Option<u128> {
        match self {
            Occupancy::Dense(bitmap) => bitmap.first_clear(from as u64, to as u64).map(u128::from),
            Occupancy::Sparse(runs) => runs.first_absent(from, to),
        }
    }

    pub(crate) fn count(&self, low: u128, high: u128) -> u128 {
        match self {
            Occupancy::Dense(bitmap) => u128::from(bitmap.count(low as u64, high as u64)),
            Occupancy::Sparse(runs) => runs.count_in(low, high),
        }
    }
}

/// Which positions of a range (offsets from its first address) are blocked, as a store keeps
/// it between processes: the bitmap's words for ranges of up to 2^20 addresses, the blocked
/// runs beyond.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OccupancySnapshot {
    Bits(Vec<u64>),
    Runs(Vec<(u128, u128)>),
}

impl Occupancy {
    pub(crate) fn snapshot(&self) -> OccupancySnapshot {
        match self {
            Occupancy::Dense(bitmap) => OccupancySnapshot::Bits(bitmap.words().to_vec()),
            Occupancy::Sparse(runs) => OccupancySnapshot::Runs(runs.iter().collect()),
        }
    }

    /// The occupancy of a range of `size` addresses from a snapshot; `None` if the snapshot
    /// does not fit a range of that size.
    pub(crate) fn from_snapshot(size: u128, snapshot: &OccupancySnapshot) -> Option<Occupancy> {
        match (Occupancy::new(size), snapshot) {
            (Occupancy::Dense(_), OccupancySnapshot::Bits(words)) => {
                Bitmap::from_words(size as u64, words).map(Occupancy::Dense)
            }
            (Occupancy::Sparse(mut set), OccupancySnapshot::Runs(runs)) => {
                for &(low, high) in runs {
                    if low > high || high >= size {
                        return None;
                    }
                    set.insert_range(low, high);
                }
                Some(Occupancy::Sparse(set))
            }
            _ => None,
        }
    }
}

/// One range of a pool.
#[derive(Clone, Debug)]
pub(crate) struct Range {
    pub spec: RangeSpec,
    pub start: u128,
    pub end: u128,
    pub occupancy: Occupancy,
    /// Set positions of `occupancy`.
    pub n_blocked: u128,
    /// Offset where next-fit continues.
    pub cursor: u128,
    pub n_allocated: u64,
    /// Removed while holding allocations: no new allocations, dropped with its last release.
    pub draining: bool,
}

impl Range {
    pub fn new(spec: RangeSpec) -> Range {
        let (start, end) = spec.bounds();
        Range {
            spec,
            start,
            end,
            occupancy: Occupancy::new(end - start + 1),
            n_blocked: 0,
            cursor: 0,
            n_allocated: 0,
            draining: false,
        }
    }

    /// Number of addresses (a range never spans the whole IPv6 space: the network address
    /// of a /0 is not in it, so this cannot overflow).
    pub fn size(&self) -> u128 {
        self.end - self.start + 1
    }

    pub fn contains(&self, value: u128) -> bool {
        value >= self.start && value <= self.end
    }

    pub fn has_free(&self) -> bool {
        !self.draining && self.n_blocked < self.size()
    }

    /// The first clear address from the cursor (or from the bottom), wrapping once.
    fn find_free(&self, policy: ReusePolicy) -> Option<u128> {
        let last = self.end - self.start;
        let from = match policy {
            ReusePolicy::NextFit => self.cursor.min(last),
            ReusePolicy::LowestFree => 0,
        };
        self.occupancy
            .first_clear(from, last)
            .or_else(|| {
                from.checked_sub(1)
                    .and_then(|below| self.occupancy.first_clear(0, below))
            })
            .map(|offset| self.start + offset)
    }
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
        if self.by_addr.is_empty() {
            return false;
        }
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

    /// Takes out the address released longest ago if its cooldown has run out by `now`.
    pub fn pop_expired(&mut self, now: Timestamp, cooldown: Duration) -> Option<u128> {
        let &(released_at, value) = self.by_time.first()?;
        if released_at.saturating_add(cooldown) > now {
            return None;
        }
        self.by_time.pop_first();
        self.by_addr.remove(&value);
        Some(value)
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
    /// First addresses of the active ranges with a clear position.
    pub with_free: BTreeSet<u128>,
    /// The range next-fit continues in.
    pub current: u128,
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
        PoolFamily {
            family,
            ranges: BTreeMap::new(),
            with_free: BTreeSet::new(),
            current: 0,
            excluded: RunSet::new(),
            reserved: HashMap::new(),
            cooling: Cooling::default(),
            n_allocated: 0,
        }
    }

    /// Makes the range holding `position` the one next-fit continues in. A position in no
    /// range (its range was removed since) is kept as it is: next-fit goes on at the first
    /// range above it, as the running engine does after the removal, so a restored position
    /// means the same as the one the running engine had.
    pub fn set_current(&mut self, position: u128) {
        self.current = self
            .range_of(position)
            .map_or(position, |range| range.start);
    }

    /// The range holding `value`, draining or not.
    pub fn range_of(&self, value: u128) -> Option<&Range> {
        self.ranges
            .range(..=value)
            .next_back()
            .map(|(_, range)| range)
            .filter(|range| range.end >= value)
    }

    pub fn is_active_capacity(&self, value: u128) -> bool {
        self.range_of(value).is_some_and(|range| !range.draining)
    }

    /// Whether an address must stay blocked for a reason other than being allocated or cooling.
    pub fn is_held_back(&self, value: u128) -> bool {
        self.excluded.contains(value) || self.reserved.contains_key(&value)
    }

    /// Keeps `with_free` in step with one range after its occupancy changed.
    fn sync_free(with_free: &mut BTreeSet<u128>, range: &Range, had_free: bool) {
        let has_free = range.has_free();
        if has_free && !had_free {
            with_free.insert(range.start);
        } else if had_free && !has_free {
            with_free.remove(&range.start);
        }
    }

    /// Marks an address blocked (or clear) in whichever range holds it.
    pub fn mark(&mut self, value: u128, blocked: bool) {
        let Self {
            ranges, with_free, ..
        } = self;
        if let Some((_, range)) = ranges.range_mut(..=value).next_back()
            && range.end >= value
        {
            let had_free = range.has_free();
            let offset = value - range.start;
            if blocked && range.occupancy.set(offset) {
                range.n_blocked += 1;
            } else if !blocked && range.occupancy.clear(offset) {
                range.n_blocked -= 1;
            } else {
                return;
            }
            Self::sync_free(with_free, range, had_free);
        }
    }

    /// The next free address by the pool's policy, with the first address of its range: the
    /// current range first (from its cursor), then the following ranges with room, wrapping.
    pub fn find_free(&self, policy: ReusePolicy) -> Option<(u128, u128)> {
        if policy == ReusePolicy::NextFit
            && let Some(range) = self.ranges.get(&self.current)
            && range.has_free()
        {
            // The usual case: the current range still has room.
            return Some((self.current, range.find_free(policy)?));
        }
        let start = *match policy {
            ReusePolicy::NextFit => self
                .with_free
                .range(self.current..)
                .next()
                .or_else(|| self.with_free.first()),
            ReusePolicy::LowestFree => self.with_free.first(),
        }?;
        let value = self.ranges.get(&start)?.find_free(policy)?;
        Some((start, value))
    }

    /// Enters an allocation of `value`: blocks it, counts it in its range and, if next-fit
    /// chose it, moves the range's cursor past it. `range_start` names the range when the
    /// caller already knows it. Returns the range's spec, if the address is in one.
    pub fn take(
        &mut self,
        value: u128,
        range_start: Option<u128>,
        move_cursor: bool,
    ) -> Option<RangeSpec> {
        self.cooling.remove(value);
        self.n_allocated += 1;
        let Self {
            ranges,
            with_free,
            current,
            ..
        } = self;
        let range = match range_start {
            Some(start) => ranges.get_mut(&start),
            None => ranges
                .range_mut(..=value)
                .next_back()
                .map(|(_, range)| range)
                .filter(|range| range.end >= value),
        }?;
        range.n_allocated += 1;
        let had_free = range.has_free();
        let offset = value - range.start;
        if range.occupancy.set(offset) {
            range.n_blocked += 1;
            Self::sync_free(with_free, range, had_free);
        }
        if move_cursor {
            range.cursor = if offset == range.end - range.start {
                0
            } else {
                offset + 1
            };
            *current = range.start;
        }
        Some(range.spec)
    }

    /// Takes a released allocation out of its range: the address becomes free, starts its
    /// cooldown, or stays blocked when excluded or reserved. Returns `None` when no range of
    /// this pool holds the address, else the first address of a draining range that this
    /// release emptied (which the caller must drop), if any.
    pub fn give_back(
        &mut self,
        value: u128,
        now: Timestamp,
        cooldown: Duration,
    ) -> Option<Option<u128>> {
        self.n_allocated -= 1;
        let held_back = self.is_held_back(value);
        let Self {
            ranges,
            with_free,
            cooling,
            ..
        } = self;
        let range = ranges
            .range_mut(..=value)
            .next_back()
            .map(|(_, range)| range)
            .filter(|range| range.end >= value)?;
        range.n_allocated -= 1;
        if !held_back {
            Self::free_or_cool(with_free, cooling, range, value, now, cooldown);
        }
        Some((range.draining && range.n_allocated == 0).then_some(range.start))
    }

    /// The address becomes free, or (in an active range, with a cooldown) starts cooling.
    fn free_or_cool(
        with_free: &mut BTreeSet<u128>,
        cooling: &mut Cooling,
        range: &mut Range,
        value: u128,
        now: Timestamp,
        cooldown: Duration,
    ) {
        if range.draining || cooldown.is_zero() {
            let had_free = range.has_free();
            if range.occupancy.clear(value - range.start) {
                range.n_blocked -= 1;
                Self::sync_free(with_free, range, had_free);
            }
        } else {
            // Stays blocked until the cooldown has run out.
            cooling.insert(value, now);
        }
    }

    /// An allocation recorded in another pool, at an address in one of this pool's ranges,
    /// was released: the address comes back here as if released from this pool.
    pub fn give_back_foreign(&mut self, value: u128, now: Timestamp, cooldown: Duration) {
        if self.is_held_back(value) {
            return;
        }
        let Self {
            ranges,
            with_free,
            cooling,
            ..
        } = self;
        if let Some((_, range)) = ranges.range_mut(..=value).next_back()
            && range.end >= value
        {
            Self::free_or_cool(with_free, cooling, range, value, now, cooldown);
        }
    }

    /// Moves cooled-down addresses back to free.
    pub fn expire_cooling(&mut self, now: Timestamp, cooldown: Duration) {
        // One search of the queue and one of the ranges per expired address: this runs before
        // every allocation, and with churn about one address expires per allocation.
        while let Some(value) = self.cooling.pop_expired(now, cooldown) {
            if self.is_held_back(value) {
                continue;
            }
            let Self {
                ranges, with_free, ..
            } = self;
            if let Some((_, range)) = ranges.range_mut(..=value).next_back()
                && range.end >= value
                && !range.draining
            {
                let had_free = range.has_free();
                if range.occupancy.clear(value - range.start) {
                    range.n_blocked -= 1;
                    Self::sync_free(with_free, range, had_free);
                }
            }
        }
    }

    /// Adds an exclusion's addresses to the merged set and blocks them.
    pub fn add_exclusion(&mut self, exclusion: &Exclusion) {
        let (low, high) = exclusion.bounds();
        self.excluded.insert_range(low, high);
        // An exclusion outranks a cooldown: the address is not coming back when it cools.
        for value in self.cooling.values_in(low, high) {
            self.cooling.remove(value);
        }
        let Self {
            ranges, with_free, ..
        } = self;
        for (_, range) in ranges.range_mut(..=high) {
            if range.end < low {
                continue;
            }
            let had_free = range.has_free();
            let (from, to) = (low.max(range.start), high.min(range.end));
            range.n_blocked += range
                .occupancy
                .set_range(from - range.start, to - range.start);
            Self::sync_free(with_free, range, had_free);
        }
    }

    /// Recomputes one range's occupancy from its sources; `allocated` lists this pool and
    /// family's allocated addresses (any outside the range are ignored).
    pub fn rebuild(&mut self, start: u128, allocated: &[u128]) {
        let Some(range) = self.ranges.get(&start) else {
            return;
        };
        let rebuilt = self.rebuilt(range, allocated);
        // Membership, not the range's old counts: a new range is not listed yet.
        let had_free = self.with_free.contains(&start);
        if let Some(range) = self.ranges.get_mut(&start) {
            range.n_blocked = rebuilt.count(0, range.end - range.start);
            range.occupancy = rebuilt;
            Self::sync_free(&mut self.with_free, range, had_free);
        }
    }

    /// What a range's occupancy should be, from its sources.
    pub fn rebuilt(&self, range: &Range, allocated: &[u128]) -> Occupancy {
        let mut occupancy = Occupancy::new(range.size());
        for (low, high) in self.excluded.runs_in(range.start, range.end) {
            occupancy.set_range(low - range.start, high - range.start);
        }
        let cooling = if range.draining {
            Vec::new()
        } else {
            self.cooling.values_in(range.start, range.end)
        };
        for value in self
            .reserved
            .keys()
            .chain(cooling.iter())
            .chain(allocated.iter())
            .copied()
            .filter(|&v| range.contains(v))
        {
            occupancy.set(value - range.start);
        }
        occupancy
    }

    /// Recomputes `with_free` from the ranges (after a snapshot replaced their occupancy).
    pub fn resync_free(&mut self) {
        self.with_free = self
            .ranges
            .iter()
            .filter(|(_, range)| range.has_free())
            .map(|(&start, _)| start)
            .collect();
    }

    /// Counts positions of the range that are blocked, for statistics.
    pub fn blocked_in(range: &Range) -> u128 {
        range.occupancy.count(0, range.end - range.start)
    }
}
