//! The engine: pools, allocation, release, exclusions, leases, restore and introspection.
//!
//! Every operation validates its whole request before it changes anything, so a refused
//! request leaves the engine exactly as it was. Operations that depend on time take `now`.
//!
//! Invariants beside "plan before apply": ranges never overlap, within or across pools, and a
//! draining range still counts; removing a range that holds allocations drains it (nothing new from
//! it, gone with its last release), and adding it again exactly as specified cancels the drain;
//! every range that leaves the engine is queued for `take_drained`, so whoever keeps a
//! configuration beside the engine learns it; generations only increase across the engine's life
//! (stores persist `next_generation`), so a release naming a generation never frees a later
//! allocation of the address; a cooling address is handed out only when nothing else is free,
//! oldest release first, and an exclusion or a range removal ends its cooldown; an operation that
//! takes `now` first lets time pass for its pool, then decides; next-fit cursors are per range and
//! move only when the engine chooses the address, and the current range is kept by address, so a
//! restore continues in the same range; while restoring, recorded allocations are accepted as they
//! are and nothing is allocated or released.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use hashbrown::HashMap;
use ipnet::IpNet;

use crate::addr::{AddrKey, Family, addr_value};
use crate::error::{AllocError, Holder};
use crate::pool::{Occupancy, OccupancySnapshot, PoolConfig, PoolFamily, Range, ReusePolicy};
use crate::spec::{AttachmentKey, Exclusion, PoolName, RangeSpec, Reserved, validate_owner};
use crate::table::{AllocationTable, NewRecord, PoolId};
use crate::time::{Lease, LeaseIds, Timestamp};

/// The largest generation accepted from durable state.
const MAX_GENERATION: u64 = 1 << 63;

/// Engine-wide settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    pub ipv4_enabled: bool,
    pub ipv6_enabled: bool,
    /// Seed for lease ids; binaries pass OS randomness, tests a constant.
    pub lease_id_seed: u64,
    /// Settings of the default pool created with the engine.
    pub default_pool: PoolConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            ipv4_enabled: true,
            ipv6_enabled: true,
            lease_id_seed: 0,
            default_pool: PoolConfig::default(),
        }
    }
}

/// What to allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The next free address of a family.
    Next(Family),
    /// Exactly this address.
    Specific(IpAddr),
}

/// One allocation request.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub pool: &'a PoolName,
    pub owner: &'a str,
    /// The CNI attachment; allocating again with the same key returns the same address.
    pub key: Option<&'a AttachmentKey>,
    /// Start an expiration timer of this length with the allocation.
    pub lease: Option<Duration>,
}

/// An address handed out (or handed out again, for a repeated key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub addr: IpAddr,
    pub generation: u64,
    /// The range the address came from (its subnet and gateway), if it still has one.
    pub range: Option<RangeSpec>,
    pub lease: Option<Lease>,
    /// True when the key already held this address and nothing was changed.
    pub existing: bool,
}

/// An allocation that was released, as it was (its owner and key too: the agent records the
/// release in its history from this, without reading the row back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub addr: IpAddr,
    pub pool: PoolName,
    pub generation: u64,
    pub lease: Option<Lease>,
    pub owner: String,
    pub key: Option<AttachmentKey>,
}

/// What removing a range did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeRemoval {
    /// The range held nothing and is gone.
    Removed,
    /// The range still holds allocations: it hands out nothing more and disappears with the
    /// release of its last allocation.
    Draining { n_allocated: u64 },
}

/// A range that was removed from its pool, at once (it held nothing) or with the release of
/// its last allocation after draining.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainedRange {
    pub pool: PoolName,
    pub spec: RangeSpec,
}

/// An allocation read back from durable state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredAllocation {
    pub pool: PoolName,
    pub addr: IpAddr,
    pub owner: String,
    pub key: Option<AttachmentKey>,
    pub generation: u64,
    pub lease: Option<Lease>,
}

/// One line of a dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpEntry {
    pub addr: IpAddr,
    pub owner: String,
    pub key: Option<AttachmentKey>,
    pub generation: u64,
    pub lease: Option<Lease>,
}

/// Every allocation of one pool, ordered by family then address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolDump {
    pub pool: PoolName,
    pub allocations: Vec<DumpEntry>,
}

/// Counts for one pool and family. Over the active ranges,
/// `capacity == free + used_active + excluded + cooling` holds, where `used_active` is `used`
/// less the allocations in draining ranges or outside every range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyStats {
    /// Addresses the active ranges can hand out (gateways not counted).
    pub capacity: u128,
    /// Allocations of this pool and family, wherever they are.
    pub used: u64,
    /// Allocations in draining ranges or outside every range.
    pub used_outside_active: u64,
    pub free: u128,
    /// Excluded, unallocated addresses of the active ranges.
    pub excluded: u128,
    /// Released addresses still in cooldown.
    pub cooling: u64,
    pub ranges: usize,
    pub draining_ranges: usize,
}

/// One range as listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeInfo {
    pub spec: RangeSpec,
    pub n_allocated: u64,
    pub draining: bool,
}

/// The persisted form of one range's derived state (see [`Engine::pool_snapshot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSnapshot {
    pub spec: RangeSpec,
    pub draining: bool,
    /// Offset from the range's first address where next-fit continues.
    pub cursor: u128,
    pub n_allocated: u64,
    pub occupancy: OccupancySnapshot,
}

/// The derived state of one pool: what lets a short-lived process allocate without reading
/// every allocation. Per-family fields are indexed IPv4 first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// First address of the range next-fit continues in, per family.
    pub current: [u128; 2],
    /// Allocations of the pool per family, wherever they are.
    pub n_allocated: [u64; 2],
    pub ranges: Vec<RangeSnapshot>,
}

/// What is known about one allocated address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationInfo {
    pub pool: PoolName,
    pub entry: DumpEntry,
}

#[derive(Clone, Debug)]
struct Pool {
    name: PoolName,
    config: PoolConfig,
    families: [PoolFamily; 2],
    exclusions: Vec<Exclusion>,
}

impl Pool {
    fn new(name: PoolName, config: PoolConfig) -> Pool {
        Pool {
            name,
            config,
            families: [PoolFamily::new(Family::V4), PoolFamily::new(Family::V6)],
            exclusions: Vec::new(),
        }
    }

    fn family(&self, family: Family) -> &PoolFamily {
        &self.families[family.index()]
    }

    fn family_mut(&mut self, family: Family) -> &mut PoolFamily {
        &mut self.families[family.index()]
    }
}

/// Who holds an allocation being recorded.
#[derive(Clone, Copy, Debug)]
struct Holding<'a> {
    owner: &'a str,
    key: Option<&'a AttachmentKey>,
    key_hash: Option<u64>,
    generation: u64,
    lease: Option<Lease>,
}

/// A decided, not yet applied, allocation.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// The key already holds this allocation (a table index).
    Existing(u32),
    /// Hand out this address; `next` says the engine chose it (which moves a next-fit
    /// cursor), `range` names its range's first address when known.
    Fresh {
        addr: AddrKey,
        next: bool,
        range: Option<u128>,
    },
}

/// The allocation engine. See the crate documentation.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    pools: Vec<Option<Pool>>,
    pool_ids: HashMap<PoolName, PoolId>,
    /// Every range of every pool, by family and first address: (last address, pool).
    range_index: [BTreeMap<u128, (u128, PoolId)>; 2],
    table: AllocationTable,
    leases: HashMap<AddrKey, Lease>,
    lease_queue: std::collections::BTreeSet<(Timestamp, AddrKey)>,
    lease_ids: LeaseIds,
    next_generation: u64,
    restoring: bool,
    /// Draining ranges that emptied and left their pool, oldest first, until
    /// [`Engine::take_drained`] hands them to the caller.
    drained: Vec<DrainedRange>,
    /// Restored from pool snapshots (see [`Engine::is_partial`]).
    partial: bool,
}

impl Engine {
    /// An engine ready to allocate, with an empty default pool.
    pub fn new(config: EngineConfig) -> Engine {
        let mut engine = Engine {
            config,
            pools: Vec::new(),
            pool_ids: HashMap::new(),
            range_index: [BTreeMap::new(), BTreeMap::new()],
            table: AllocationTable::default(),
            leases: HashMap::new(),
            lease_queue: std::collections::BTreeSet::new(),
            lease_ids: LeaseIds::new(config.lease_id_seed),
            next_generation: 1,
            restoring: false,
            drained: Vec::new(),
            partial: false,
        };
        engine.insert_pool(PoolName::default_pool(), config.default_pool);
        engine
    }

    /// An engine in the restore phase: recorded allocations are accepted as they are with
    /// [`Engine::restore_allocation`], and nothing is allocated, expired or released for being
    /// unknown until [`Engine::finish_restore`].
    pub fn restoring(config: EngineConfig) -> Engine {
        let mut engine = Engine::new(config);
        engine.restoring = true;
        engine
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn is_restoring(&self) -> bool {
        self.restoring
    }

    /// The generation the next allocation gets; persisted so generations never repeat.
    pub fn next_generation(&self) -> u64 {
        self.next_generation
    }

    fn family_enabled(&self, family: Family) -> Result<(), AllocError> {
        let enabled = match family {
            Family::V4 => self.config.ipv4_enabled,
            Family::V6 => self.config.ipv6_enabled,
        };
        if enabled {
            Ok(())
        } else {
            Err(AllocError::FamilyDisabled { family })
        }
    }

    fn pool_id(&self, name: &PoolName) -> Result<PoolId, AllocError> {
        // Nodes have a handful of pools: comparing a short name (often the same `Arc`) beats
        // hashing it on every request.
        if let Some(id) = self
            .pools
            .iter()
            .take(4)
            .position(|pool| pool.as_ref().is_some_and(|pool| pool.name == *name))
        {
            return Ok(id as PoolId);
        }
        self.pool_ids
            .get(name)
            .copied()
            .ok_or_else(|| AllocError::UnknownPool { pool: name.clone() })
    }

    fn pool(&self, id: PoolId) -> &Pool {
        self.pools[id as usize]
            .as_ref()
            .expect("pool ids in use always name a live pool")
    }

    fn pool_mut(&mut self, id: PoolId) -> &mut Pool {
        self.pools[id as usize]
            .as_mut()
            .expect("pool ids in use always name a live pool")
    }

    fn require_restoring(&self, operation: &'static str) -> Result<(), AllocError> {
        if self.restoring {
            Ok(())
        } else {
            Err(AllocError::RestoreFinished { operation })
        }
    }

    fn require_ready(&self, operation: &'static str) -> Result<(), AllocError> {
        if self.restoring {
            Err(AllocError::RestoreInProgress { operation })
        } else {
            Ok(())
        }
    }

    // ---- pools ---------------------------------------------------------------------------

    fn insert_pool(&mut self, name: PoolName, config: PoolConfig) -> PoolId {
        let id = self.pools.len() as PoolId;
        self.pools.push(Some(Pool::new(name.clone(), config)));
        self.pool_ids.insert(name, id);
        id
    }

    /// Creates an empty pool.
    pub fn add_pool(&mut self, name: &PoolName, config: PoolConfig) -> Result<(), AllocError> {
        if self.pool_ids.contains_key(name) {
            return Err(AllocError::PoolExists { pool: name.clone() });
        }
        self.insert_pool(name.clone(), config);
        Ok(())
    }

    /// Removes a pool that holds no allocation, with its ranges and exclusions.
    pub fn remove_pool(&mut self, name: &PoolName) -> Result<(), AllocError> {
        let id = self.pool_id(name)?;
        let pool = self.pool(id);
        let n_allocations: u64 = pool.families.iter().map(|f| f.n_allocated).sum();
        if n_allocations > 0 {
            return Err(AllocError::PoolInUse {
                pool: name.clone(),
                n_allocations,
            });
        }
        for family in Family::ALL {
            let starts: Vec<u128> = self
                .pool(id)
                .family(family)
                .ranges
                .keys()
                .copied()
                .collect();
            for start in starts {
                self.range_index[family.index()].remove(&start);
            }
        }
        self.pools[id as usize] = None;
        self.pool_ids.remove(name);
        Ok(())
    }

    /// Changes a pool's settings; they apply from the next operation on.
    pub fn set_pool_config(
        &mut self,
        name: &PoolName,
        config: PoolConfig,
    ) -> Result<(), AllocError> {
        let id = self.pool_id(name)?;
        self.pool_mut(id).config = config;
        Ok(())
    }

    pub fn pool_config(&self, name: &PoolName) -> Result<PoolConfig, AllocError> {
        Ok(self.pool(self.pool_id(name)?).config)
    }

    /// Pool names in creation order.
    pub fn pool_names(&self) -> Vec<PoolName> {
        self.pools
            .iter()
            .flatten()
            .map(|p| p.name.clone())
            .collect()
    }

    // ---- capacity ------------------------------------------------------------------------

    /// Adds a range of capacity to a pool. Refused if it overlaps any range of any pool,
    /// except that adding a draining range of the same pool again, exactly as it was
    /// specified, cancels the drain: it hands out addresses again and stays.
    pub fn add_range(&mut self, pool: &PoolName, spec: RangeSpec) -> Result<(), AllocError> {
        let family = spec.family();
        self.family_enabled(family)?;
        let id = self.pool_id(pool)?;
        let (start, end) = spec.bounds();
        if self
            .pool(id)
            .family(family)
            .ranges
            .get(&start)
            .is_some_and(|range| range.draining && range.spec == spec)
        {
            self.undrain(id, family, start);
            return Ok(());
        }
        let index = &self.range_index[family.index()];
        let before = index.range(..=end).next_back();
        if let Some((&other_start, &(other_end, other_pool))) = before
            && other_end >= start
        {
            let other = self.pool(other_pool);
            let existing = other
                .family(family)
                .ranges
                .get(&other_start)
                .map(|r| r.spec.to_string())
                .unwrap_or_default();
            return Err(AllocError::RangeOverlap {
                range: spec.to_string(),
                existing,
                existing_pool: other.name.clone(),
            });
        }
        self.range_index[family.index()].insert(start, (end, id));
        let allocated = self.allocated_in(family, start, end);
        let own = self
            .table
            .iter()
            .filter(|(_, r)| r.pool() == id && r.addr().family == family)
            .filter(|(_, r)| (start..=end).contains(&r.addr().value))
            .count();
        let pool_family = self.pool_mut(id).family_mut(family);
        let mut range = Range::new(spec);
        range.n_allocated = own as u64;
        pool_family.ranges.insert(start, range);
        // Next-fit positions are kept by address: a range added over the position of one
        // removed earlier continues from there (a restore reads it the same way).
        let position = pool_family.current;
        pool_family.set_current(position);
        if let Some(gateway) = spec.gateway() {
            let value = addr_value(gateway);
            *pool_family.reserved.entry(value).or_insert(0) += 1;
            // A gateway may name a cooling address of another range: it must not come back.
            pool_family.cooling.remove(value);
            pool_family.mark(value, true);
        }
        pool_family.rebuild(start, &allocated);
        Ok(())
    }

    /// Allocated addresses of a family inside `low..=high`, by scanning every allocation;
    /// only administrative operations call this. Every pool's allocations count: an address
    /// recorded in one pool (say, restored from an older configuration) may lie in a range
    /// that now belongs to another, and must not be handed out there either.
    fn allocated_in(&self, family: Family, low: u128, high: u128) -> Vec<u128> {
        self.table
            .iter()
            .map(|(_, record)| record.addr())
            .filter(|addr| addr.family == family && (low..=high).contains(&addr.value))
            .map(|addr| addr.value)
            .collect()
    }

    /// The pool whose range holds `addr`, if any.
    fn range_owner(&self, addr: AddrKey) -> Option<PoolId> {
        self.range_index[addr.family.index()]
            .range(..=addr.value)
            .next_back()
            .filter(|(_, (end, _))| *end >= addr.value)
            .map(|(_, (_, pool))| *pool)
    }

    /// Removes a range (named by its exact bounds). A range that still holds allocations is
    /// drained instead: see [`RangeRemoval::Draining`].
    pub fn remove_range(
        &mut self,
        pool: &PoolName,
        spec: &RangeSpec,
    ) -> Result<RangeRemoval, AllocError> {
        let family = spec.family();
        let id = self.pool_id(pool)?;
        let (start, end) = spec.bounds();
        let pool_family = self.pool_mut(id).family_mut(family);
        let n_allocated = match pool_family.ranges.get_mut(&start) {
            Some(range) if range.end == end => {
                range.draining = true;
                range.n_allocated
            }
            _ => {
                return Err(AllocError::UnknownRange {
                    range: spec.to_string(),
                    pool: pool.clone(),
                });
            }
        };
        pool_family.with_free.remove(&start);
        for value in pool_family.cooling.values_in(start, end) {
            pool_family.cooling.remove(value);
        }
        if n_allocated > 0 {
            let allocated = self.allocated_in(family, start, end);
            self.pool_mut(id)
                .family_mut(family)
                .rebuild(start, &allocated);
            return Ok(RangeRemoval::Draining { n_allocated });
        }
        self.drop_range(id, family, start);
        Ok(RangeRemoval::Removed)
    }

    /// A draining range becomes active again: its free addresses are handed out from now on.
    /// Cooldowns it had ended when it started draining, so its occupancy is rebuilt from the
    /// allocations, exclusions and reservations alone.
    fn undrain(&mut self, id: PoolId, family: Family, start: u128) {
        let Some(end) = self
            .pool(id)
            .family(family)
            .ranges
            .get(&start)
            .map(|r| r.end)
        else {
            return;
        };
        let allocated = self.allocated_in(family, start, end);
        let pool_family = self.pool_mut(id).family_mut(family);
        if let Some(range) = pool_family.ranges.get_mut(&start) {
            range.draining = false;
        }
        pool_family.with_free.remove(&start);
        pool_family.rebuild(start, &allocated);
    }

    /// Draining ranges that have emptied and left their pools since the last call (a range
    /// removed while it held nothing counts too), oldest first. A caller that keeps a
    /// configuration beside the engine forgets them there; a cluster authority waiting for a
    /// range to be given back learns here that it may take it.
    pub fn take_drained(&mut self) -> Vec<DrainedRange> {
        std::mem::take(&mut self.drained)
    }

    /// Forgets a drained range entirely.
    fn drop_range(&mut self, id: PoolId, family: Family, start: u128) {
        self.range_index[family.index()].remove(&start);
        let pool_name = self.pool(id).name.clone();
        let pool_family = self.pool_mut(id).family_mut(family);
        pool_family.with_free.remove(&start);
        let Some(range) = pool_family.ranges.remove(&start) else {
            return;
        };
        self.drained.push(DrainedRange {
            pool: pool_name,
            spec: range.spec,
        });
        let pool_family = self.pool_mut(id).family_mut(family);
        let Some(gateway) = range.spec.gateway().map(addr_value) else {
            return;
        };
        let Some(count) = pool_family.reserved.get_mut(&gateway) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        pool_family.reserved.remove(&gateway);
        // The gateway may sit in another range of the pool, where it is now an ordinary
        // address again unless something else holds it.
        if let Some(other) = pool_family.range_of(gateway) {
            let (other_start, other_end) = (other.start, other.end);
            let allocated = self.allocated_in(family, other_start, other_end);
            self.pool_mut(id)
                .family_mut(family)
                .rebuild(other_start, &allocated);
        }
    }

    /// The ranges of a pool, IPv4 first, in address order.
    pub fn ranges(&self, pool: &PoolName) -> Result<Vec<RangeInfo>, AllocError> {
        let pool = self.pool(self.pool_id(pool)?);
        Ok(pool
            .families
            .iter()
            .flat_map(|f| f.ranges.values())
            .map(|r| RangeInfo {
                spec: r.spec,
                n_allocated: r.n_allocated,
                draining: r.draining,
            })
            .collect())
    }

    // ---- exclusions ----------------------------------------------------------------------

    /// Excludes a network (or one address) from a pool: it is never handed out. An allocated
    /// address inside keeps its allocation and is not handed out again after release. The
    /// network need not lie in the pool's current capacity. Excluding the same network again
    /// replaces its reason.
    pub fn exclude(&mut self, pool: &PoolName, exclusion: Exclusion) -> Result<(), AllocError> {
        self.family_enabled(exclusion.family())?;
        let id = self.pool_id(pool)?;
        let pool = self.pool_mut(id);
        if let Some(existing) = pool
            .exclusions
            .iter_mut()
            .find(|e| e.network() == exclusion.network())
        {
            *existing = exclusion;
            return Ok(());
        }
        pool.family_mut(exclusion.family())
            .add_exclusion(&exclusion);
        pool.exclusions.push(exclusion);
        Ok(())
    }

    /// Removes an exclusion; its addresses become free unless something else holds them.
    pub fn remove_exclusion(&mut self, pool: &PoolName, network: IpNet) -> Result<(), AllocError> {
        let id = self.pool_id(pool)?;
        let family = Family::of(network.addr());
        let pool_ref = self.pool_mut(id);
        let Some(position) = pool_ref
            .exclusions
            .iter()
            .position(|e| e.network() == network)
        else {
            return Err(AllocError::UnknownExclusion {
                network: network.to_string(),
                pool: pool.clone(),
            });
        };
        let removed = pool_ref.exclusions.remove(position);
        let mut excluded = crate::runs::RunSet::new();
        for exclusion in pool_ref.exclusions.iter().filter(|e| e.family() == family) {
            let (low, high) = exclusion.bounds();
            excluded.insert_range(low, high);
        }
        pool_ref.family_mut(family).excluded = excluded;
        let (low, high) = removed.bounds();
        let touched: Vec<(u128, u128)> = pool_ref
            .family(family)
            .ranges
            .range(..=high)
            .filter(|(_, range)| range.end >= low)
            .map(|(&start, range)| (start, range.end))
            .collect();
        if let (Some(first), Some(last)) = (touched.first(), touched.last()) {
            let allocated = self.allocated_in(family, first.0, last.1);
            let pool_family = self.pool_mut(id).family_mut(family);
            for (start, _) in touched {
                pool_family.rebuild(start, &allocated);
            }
        }
        Ok(())
    }

    /// The exclusions of a pool, in the order they were made.
    pub fn exclusions(&self, pool: &PoolName) -> Result<Vec<Exclusion>, AllocError> {
        Ok(self.pool(self.pool_id(pool)?).exclusions.clone())
    }

    // ---- allocation ----------------------------------------------------------------------

    /// Lets time pass for one pool: cooldowns that have run out by `now` end. Every operation
    /// that takes `now` does this first, so a refused request changes nothing else.
    fn advance_pool(&mut self, id: PoolId, now: Timestamp) {
        let pool = self.pool_mut(id);
        let cooldown = pool.config.cooldown;
        for pool_family in &mut pool.families {
            pool_family.expire_cooling(now, cooldown);
        }
    }

    fn check_room(&self, request: &Request<'_>, n_records: usize) -> Result<(), AllocError> {
        let strings = request.owner.len()
            + request.key.map_or(0, |key| {
                key.network().len() + key.container_id().len() + key.ifname().len()
            });
        if self.table.has_room(n_records, strings) {
            Ok(())
        } else {
            Err(AllocError::TableFull)
        }
    }

    /// Allocates one address: the next free one of a family, or a specific one.
    ///
    /// With a key that already holds an address in this pool and family, returns that address
    /// (`existing == true`) and changes nothing.
    pub fn allocate(
        &mut self,
        request: &Request<'_>,
        target: Target,
        now: Timestamp,
    ) -> Result<Allocation, AllocError> {
        let accepted = self.allocate_if(request, target, now, |_| Some(()))?;
        Ok(accepted.expect("every address is accepted").0)
    }

    /// Like [`Engine::allocate`], but shows the planned address to `accept` before anything
    /// changes (a fresh one, or the one the key already holds): when it returns `None`, the
    /// request is refused with `Ok(None)` and nothing changed; otherwise the allocation is made
    /// and returned with what `accept` said. A caller that hands out only some of a pool's
    /// addresses (an interface pool, which only hands out interface addresses) refuses the
    /// others without the release, cooldown and generation a refusal after the fact would
    /// leave.
    pub fn allocate_if<T>(
        &mut self,
        request: &Request<'_>,
        target: Target,
        now: Timestamp,
        accept: impl FnOnce(IpAddr) -> Option<T>,
    ) -> Result<Option<(Allocation, T)>, AllocError> {
        self.require_ready("allocate")?;
        validate_owner(request.owner)?;
        let id = self.pool_id(request.pool)?;
        self.advance_pool(id, now);
        let key_hash = request.key.map(|key| self.table.key_hash(key));
        let plan = match target {
            Target::Next(family) => self.plan_next(id, family, request.key, key_hash)?,
            Target::Specific(addr) => self.plan_specific(id, addr, request.key, key_hash)?,
        };
        self.check_room(request, 1)?;
        let planned = match plan {
            Plan::Existing(index) => self.table.get(index).addr().ip(),
            Plan::Fresh { addr, .. } => addr.ip(),
        };
        let Some(accepted) = accept(planned) else {
            return Ok(None);
        };
        Ok(Some((
            self.apply(id, plan, request, key_hash, now),
            accepted,
        )))
    }

    /// Allocates one IPv4 and one IPv6 address, or neither.
    pub fn allocate_dual(
        &mut self,
        request: &Request<'_>,
        now: Timestamp,
    ) -> Result<[Allocation; 2], AllocError> {
        self.require_ready("allocate")?;
        validate_owner(request.owner)?;
        let id = self.pool_id(request.pool)?;
        self.advance_pool(id, now);
        let key_hash = request.key.map(|key| self.table.key_hash(key));
        let v4 = self.plan_next(id, Family::V4, request.key, key_hash)?;
        let v6 = self.plan_next(id, Family::V6, request.key, key_hash)?;
        self.check_room(request, 2)?;
        Ok([
            self.apply(id, v4, request, key_hash, now),
            self.apply(id, v6, request, key_hash, now),
        ])
    }

    /// Allocates one address per request, each from its own pool and family, or none: every
    /// address is chosen before any is taken, so a failure leaves the engine as it was. (Two
    /// requests for the same pool and family are refused: their choices would collide.)
    pub fn allocate_all(
        &mut self,
        requests: &[(Request<'_>, Target)],
        now: Timestamp,
    ) -> Result<Vec<Allocation>, AllocError> {
        self.require_ready("allocate")?;
        let mut targets = Vec::with_capacity(requests.len());
        for (request, target) in requests {
            validate_owner(request.owner)?;
            let id = self.pool_id(request.pool)?;
            let family = match *target {
                Target::Next(family) => family,
                Target::Specific(addr) => Family::of(addr),
            };
            if targets.contains(&(id, family)) {
                return Err(AllocError::DuplicateTarget {
                    pool: request.pool.clone(),
                    family,
                });
            }
            targets.push((id, family));
            self.advance_pool(id, now);
        }
        let mut plans = Vec::with_capacity(requests.len());
        for ((request, target), &(id, _)) in requests.iter().zip(&targets) {
            let key_hash = request.key.map(|key| self.table.key_hash(key));
            let plan = match *target {
                Target::Next(family) => self.plan_next(id, family, request.key, key_hash)?,
                Target::Specific(addr) => self.plan_specific(id, addr, request.key, key_hash)?,
            };
            self.check_room(request, requests.len())?;
            plans.push((id, plan, key_hash));
        }
        Ok(plans
            .into_iter()
            .zip(requests)
            .map(|((id, plan, key_hash), (request, _))| {
                self.apply(id, plan, request, key_hash, now)
            })
            .collect())
    }

    /// The allocation a key already holds in a pool and family.
    fn existing_for_key(
        &self,
        id: PoolId,
        family: Family,
        key: &AttachmentKey,
        key_hash: u64,
    ) -> Option<u32> {
        self.table.find_key(key, key_hash).find(|&index| {
            let record = self.table.get(index);
            record.pool() == id && record.addr().family == family
        })
    }

    fn plan_next(
        &self,
        id: PoolId,
        family: Family,
        key: Option<&AttachmentKey>,
        key_hash: Option<u64>,
    ) -> Result<Plan, AllocError> {
        self.family_enabled(family)?;
        if let (Some(key), Some(hash)) = (key, key_hash)
            && let Some(index) = self.existing_for_key(id, family, key, hash)
        {
            return Ok(Plan::Existing(index));
        }
        let pool = self.pool(id);
        let pool_family = pool.family(family);
        let chosen = pool_family
            .find_free(pool.config.reuse)
            .map(|(start, value)| (Some(start), value))
            .or_else(|| pool_family.cooling.oldest().map(|(_, value)| (None, value)));
        match chosen {
            Some((range, value)) => Ok(Plan::Fresh {
                addr: AddrKey { family, value },
                next: true,
                range,
            }),
            // Only on failure is it worth telling "no capacity at all" from "all of it used".
            None if pool_family.ranges.values().all(|r| r.draining) => {
                Err(AllocError::NoCapacity {
                    pool: pool.name.clone(),
                    family,
                })
            }
            None => Err(AllocError::PoolExhausted {
                pool: pool.name.clone(),
                family,
            }),
        }
    }

    fn plan_specific(
        &self,
        id: PoolId,
        addr: IpAddr,
        key: Option<&AttachmentKey>,
        key_hash: Option<u64>,
    ) -> Result<Plan, AllocError> {
        let family = Family::of(addr);
        self.family_enabled(family)?;
        let addr_key = AddrKey::new(addr);
        if let (Some(key), Some(hash)) = (key, key_hash)
            && let Some(index) = self.existing_for_key(id, family, key, hash)
        {
            let record = self.table.get(index);
            if record.addr() == addr_key {
                return Ok(Plan::Existing(index));
            }
            return Err(AllocError::AttachmentConflict {
                key: key.clone(),
                existing: record.addr().ip(),
                pool: self.pool(id).name.clone(),
            });
        }
        if let Some(index) = self.table.find_addr(addr_key) {
            return Err(self.in_use_error(index));
        }
        let pool = self.pool(id);
        let pool_family = pool.family(family);
        let value = addr_key.value;
        let Some(range) = pool_family.range_of(value) else {
            // Say why when the address is special in one of the pool's subnets.
            for range in pool_family.ranges.values() {
                if let Some(reserved) = range.spec.reserved_kind(addr) {
                    return Err(AllocError::Reserved {
                        addr,
                        reserved,
                        range: range.spec.to_string(),
                    });
                }
            }
            return Err(AllocError::OutsidePool {
                addr,
                pool: pool.name.clone(),
            });
        };
        if range.draining {
            return Err(AllocError::Draining {
                addr,
                range: range.spec.to_string(),
                pool: pool.name.clone(),
            });
        }
        if pool_family.excluded.contains(value) {
            let exclusion = pool.exclusions.iter().find(|e| e.network().contains(&addr));
            return Err(AllocError::Excluded {
                addr,
                network: exclusion
                    .map(|e| e.network().to_string())
                    .unwrap_or_default(),
                reason: exclusion.map(|e| e.reason().to_owned()).unwrap_or_default(),
            });
        }
        if pool_family.reserved.contains_key(&value) {
            let gateway_range = pool_family
                .ranges
                .values()
                .find(|r| r.spec.gateway() == Some(addr))
                .unwrap_or(range);
            return Err(AllocError::Reserved {
                addr,
                reserved: Reserved::Gateway,
                range: gateway_range.spec.to_string(),
            });
        }
        // A cooling address may be asked for by name: cooldown only steers "next".
        Ok(Plan::Fresh {
            addr: addr_key,
            next: false,
            range: Some(range.start),
        })
    }

    fn in_use_error(&self, index: u32) -> AllocError {
        let record = self.table.get(index);
        AllocError::AddressInUse {
            addr: record.addr().ip(),
            holder: Box::new(Holder {
                owner: record.owner().to_owned(),
                key: record.key(),
                generation: record.generation(),
            }),
        }
    }

    fn apply(
        &mut self,
        id: PoolId,
        plan: Plan,
        request: &Request<'_>,
        key_hash: Option<u64>,
        now: Timestamp,
    ) -> Allocation {
        match plan {
            Plan::Existing(index) => {
                let record = self.table.get(index);
                let addr = record.addr();
                Allocation {
                    addr: addr.ip(),
                    generation: record.generation(),
                    range: self.range_spec_of(id, addr),
                    lease: self.leases.get(&addr).copied(),
                    existing: true,
                }
            }
            Plan::Fresh { addr, next, range } => {
                let generation = self.next_generation;
                self.next_generation += 1;
                let lease = request.lease.map(|duration| Lease {
                    id: self.lease_ids.next_id(),
                    expires_at: now.saturating_add(duration),
                });
                // Only next-fit choices move the cursor: asking for a specific address says
                // nothing about where the next free one should come from.
                let move_cursor = next && self.pool(id).config.reuse == ReusePolicy::NextFit;
                let spec = self.record(
                    id,
                    addr,
                    Holding {
                        owner: request.owner,
                        key: request.key,
                        key_hash,
                        generation,
                        lease,
                    },
                    range,
                    move_cursor,
                );
                Allocation {
                    addr: addr.ip(),
                    generation,
                    range: spec,
                    lease,
                    existing: false,
                }
            }
        }
    }

    /// Enters an allocation into every structure; shared by allocation and restore. The
    /// caller has checked the table has room. Returns the spec of the address's range.
    fn record(
        &mut self,
        id: PoolId,
        addr: AddrKey,
        holding: Holding<'_>,
        range: Option<u128>,
        move_cursor: bool,
    ) -> Option<RangeSpec> {
        let spec = self
            .pool_mut(id)
            .family_mut(addr.family)
            .take(addr.value, range, move_cursor);
        // Outside its own pool's ranges, the address may lie in another pool's: block it there.
        if spec.is_none()
            && let Some(other) = self.range_owner(addr).filter(|&other| other != id)
        {
            self.pool_mut(other)
                .family_mut(addr.family)
                .mark(addr.value, true);
        }
        self.table.insert(
            NewRecord {
                addr,
                pool: id,
                generation: holding.generation,
                owner: holding.owner,
                key: holding.key,
            },
            holding.key_hash,
        );
        if let Some(lease) = holding.lease {
            self.leases.insert(addr, lease);
            self.lease_queue.insert((lease.expires_at, addr));
        }
        spec
    }

    fn range_spec_of(&self, id: PoolId, addr: AddrKey) -> Option<RangeSpec> {
        self.pool(id)
            .family(addr.family)
            .range_of(addr.value)
            .map(|range| range.spec)
    }

    // ---- release -------------------------------------------------------------------------

    /// Releases one address. With a generation, releases it only if it is still that
    /// allocation, so a stale release cannot free an address handed out again since.
    pub fn release(
        &mut self,
        addr: IpAddr,
        generation: Option<u64>,
        now: Timestamp,
    ) -> Result<Released, AllocError> {
        let index = self
            .table
            .find_addr(AddrKey::new(addr))
            .ok_or(AllocError::NotAllocated { addr })?;
        let actual = self.table.get(index).generation();
        if let Some(requested) = generation
            && requested != actual
        {
            return Err(AllocError::GenerationMismatch {
                addr,
                requested,
                actual,
            });
        }
        Ok(self.release_index(index, now))
    }

    /// Releases every allocation of an attachment (none is not an error: DEL is idempotent).
    pub fn release_key(&mut self, key: &AttachmentKey, now: Timestamp) -> Vec<Released> {
        let hash = self.table.key_hash(key);
        let addrs: Vec<AddrKey> = self
            .table
            .find_key(key, hash)
            .map(|i| self.table.get(i).addr())
            .collect();
        self.release_addrs(&addrs, now)
    }

    /// Releases the allocations an attachment holds in one pool (its others stay), in address
    /// order; none is not an error.
    pub fn release_key_in_pool(
        &mut self,
        pool: &PoolName,
        key: &AttachmentKey,
        now: Timestamp,
    ) -> Result<Vec<Released>, AllocError> {
        let id = self.pool_id(pool)?;
        let hash = self.table.key_hash(key);
        // Released by index, in address order: the key was looked up once, and its hash is
        // not computed again on removal (this is every CNI DEL of an interface pool).
        let mut found: Vec<(AddrKey, u32)> = self
            .table
            .find_key(key, hash)
            .map(|i| (self.table.get(i), i))
            .filter(|(record, _)| record.pool() == id)
            .map(|(record, i)| (record.addr(), i))
            .collect();
        found.sort_unstable();
        Ok(found
            .into_iter()
            .map(|(_, index)| self.release_index_hashed(index, Some(hash), now))
            .collect())
    }

    /// Releases every allocation of an owner.
    pub fn release_owner(&mut self, owner: &str, now: Timestamp) -> Vec<Released> {
        let addrs: Vec<AddrKey> = self
            .table
            .iter()
            .filter(|(_, record)| record.owner_is(owner))
            .map(|(_, record)| record.addr())
            .collect();
        self.release_addrs(&addrs, now)
    }

    /// Releases every allocation of `network` whose attachment is not in `live` (the CNI GC
    /// verb); allocations without a key are left alone. Refused while restoring, because an
    /// allocation not restored yet would look unknown.
    pub fn release_unlisted(
        &mut self,
        network: &str,
        live: &[AttachmentKey],
        now: Timestamp,
    ) -> Result<Vec<Released>, AllocError> {
        self.require_ready("release of unlisted attachments")?;
        let live: hashbrown::HashSet<&AttachmentKey> = live.iter().collect();
        let addrs: Vec<AddrKey> = self
            .table
            .iter()
            .filter(|(_, record)| record.key_network_is(network))
            .filter_map(|(_, record)| {
                let key = record.key()?;
                (!live.contains(&key)).then(|| record.addr())
            })
            .collect();
        Ok(self.release_addrs(&addrs, now))
    }

    /// Releases the given addresses in address order (IPv4 first), so reports read the same
    /// whatever order the table holds them in.
    fn release_addrs(&mut self, addrs: &[AddrKey], now: Timestamp) -> Vec<Released> {
        let mut addrs = addrs.to_vec();
        addrs.sort_unstable();
        let mut released = Vec::with_capacity(addrs.len());
        for addr in addrs {
            if let Some(index) = self.table.find_addr(addr) {
                released.push(self.release_index(index, now));
            }
        }
        released
    }

    fn release_index(&mut self, index: u32, now: Timestamp) -> Released {
        self.release_index_hashed(index, None, now)
    }

    /// [`Engine::release_index`] with the record's key hash, when the caller knows it.
    fn release_index_hashed(
        &mut self,
        index: u32,
        key_hash: Option<u64>,
        now: Timestamp,
    ) -> Released {
        let (owner, key) = {
            let record = self.table.get(index);
            (record.owner().to_owned(), record.key())
        };
        let (addr, id, generation) = self.table.remove(index, key_hash);
        let lease = if self.leases.is_empty() {
            None
        } else {
            self.leases.remove(&addr)
        };
        if let Some(lease) = lease {
            self.lease_queue.remove(&(lease.expires_at, addr));
        }
        let pool = self.pool_mut(id);
        let cooldown = pool.config.cooldown;
        let given_back = pool
            .family_mut(addr.family)
            .give_back(addr.value, now, cooldown);
        let pool_name = pool.name.clone();
        let drained = given_back.flatten();
        if given_back.is_none()
            && let Some(other) = self.range_owner(addr).filter(|&other| other != id)
        {
            // Held in one pool, lying in another's range: that pool gets the address back.
            let other_pool = self.pool_mut(other);
            let cooldown = other_pool.config.cooldown;
            other_pool
                .family_mut(addr.family)
                .give_back_foreign(addr.value, now, cooldown);
        }
        if let Some(start) = drained {
            self.drop_range(id, addr.family, start);
        }
        Released {
            addr: addr.ip(),
            pool: pool_name,
            generation,
            lease,
            owner,
            key,
        }
    }

    // ---- leases --------------------------------------------------------------------------

    /// Starts an expiration timer on an allocated address.
    pub fn start_lease(
        &mut self,
        addr: IpAddr,
        duration: Duration,
        now: Timestamp,
    ) -> Result<Lease, AllocError> {
        let addr_key = AddrKey::new(addr);
        if self.table.find_addr(addr_key).is_none() {
            return Err(AllocError::NotAllocated { addr });
        }
        if let Some(lease) = self.leases.get(&addr_key) {
            return Err(AllocError::LeaseExists {
                addr,
                lease: lease.id,
            });
        }
        let lease = Lease {
            id: self.lease_ids.next_id(),
            expires_at: now.saturating_add(duration),
        };
        self.leases.insert(addr_key, lease);
        self.lease_queue.insert((lease.expires_at, addr_key));
        Ok(lease)
    }

    /// Stops an expiration timer; the id must be the one the lease was started with.
    pub fn stop_lease(&mut self, addr: IpAddr, id: uuid::Uuid) -> Result<(), AllocError> {
        let addr_key = AddrKey::new(addr);
        let Some(lease) = self.leases.get(&addr_key).copied() else {
            return Err(if self.table.find_addr(addr_key).is_none() {
                AllocError::NotAllocated { addr }
            } else {
                AllocError::NoLease { addr }
            });
        };
        if lease.id != id {
            return Err(AllocError::LeaseMismatch {
                addr,
                requested: id,
                actual: lease.id,
            });
        }
        self.leases.remove(&addr_key);
        self.lease_queue.remove(&(lease.expires_at, addr_key));
        Ok(())
    }

    /// Releases every allocation whose lease has expired by `now` and reports them, and ends
    /// cooldowns that have run out (see [`Engine::advance`]). Does nothing while restoring.
    pub fn expire(&mut self, now: Timestamp) -> Vec<Released> {
        if self.restoring {
            return Vec::new();
        }
        // This is the periodic tick, so cooldowns that have run out end here too.
        self.advance(now);
        let mut released = Vec::new();
        while let Some(&(expires_at, addr)) = self.lease_queue.first() {
            if expires_at > now {
                break;
            }
            match self.table.find_addr(addr) {
                Some(index) => released.push(self.release_index(index, now)),
                None => {
                    self.lease_queue.pop_first();
                }
            }
        }
        released
    }

    /// When the earliest lease expires, for a caller that schedules [`Engine::expire`].
    pub fn next_expiry(&self) -> Option<Timestamp> {
        self.lease_queue.first().map(|&(at, _)| at)
    }

    /// Moves every address whose cooldown has passed back to free, in every pool. Allocation
    /// does this for its own pool; call it before reading statistics.
    pub fn advance(&mut self, now: Timestamp) {
        for pool in self.pools.iter_mut().flatten() {
            let cooldown = pool.config.cooldown;
            for pool_family in &mut pool.families {
                pool_family.expire_cooling(now, cooldown);
            }
        }
    }

    // ---- restore -------------------------------------------------------------------------

    /// Accepts a recorded allocation as it is, even outside the pool's current capacity or in
    /// an excluded network. Refused only if it contradicts what was already restored.
    pub fn restore_allocation(&mut self, restored: &RestoredAllocation) -> Result<(), AllocError> {
        let (id, addr, key_hash) = self.check_restored(restored)?;
        self.record(
            id,
            addr,
            Holding {
                owner: &restored.owner,
                key: restored.key.as_ref(),
                key_hash,
                generation: restored.generation,
                lease: restored.lease,
            },
            None,
            false,
        );
        self.next_generation = self.next_generation.max(restored.generation + 1);
        Ok(())
    }

    /// Restores a cooldown: `addr` was released at `released_at`. Ignored when the address is
    /// no longer free capacity of the pool.
    pub fn restore_cooling(
        &mut self,
        pool: &PoolName,
        addr: IpAddr,
        released_at: Timestamp,
    ) -> Result<(), AllocError> {
        self.require_restoring("restore_cooling")?;
        let id = self.pool_id(pool)?;
        let addr_key = AddrKey::new(addr);
        if self.table.find_addr(addr_key).is_some() {
            return Ok(());
        }
        let pool_family = self.pool_mut(id).family_mut(addr_key.family);
        if pool_family.is_active_capacity(addr_key.value)
            && !pool_family.is_held_back(addr_key.value)
        {
            pool_family.cooling.insert(addr_key.value, released_at);
            pool_family.mark(addr_key.value, true);
        }
        Ok(())
    }

    /// Validates a recorded allocation against what was restored so far.
    fn check_restored(
        &self,
        restored: &RestoredAllocation,
    ) -> Result<(PoolId, AddrKey, Option<u64>), AllocError> {
        self.require_restoring("restore_allocation")?;
        validate_owner(&restored.owner)?;
        // Far from any real count, and it keeps `next_generation + 1` from overflowing.
        if restored.generation > MAX_GENERATION {
            return Err(AllocError::GenerationOutOfRange {
                generation: restored.generation,
            });
        }
        let id = self.pool_id(&restored.pool)?;
        let addr = AddrKey::new(restored.addr);
        if let Some(index) = self.table.find_addr(addr) {
            return Err(self.in_use_error(index));
        }
        let key_hash = restored.key.as_ref().map(|key| self.table.key_hash(key));
        if let (Some(key), Some(hash)) = (&restored.key, key_hash)
            && let Some(index) = self.existing_for_key(id, addr.family, key, hash)
        {
            return Err(AllocError::AttachmentConflict {
                key: key.clone(),
                existing: self.table.get(index).addr().ip(),
                pool: restored.pool.clone(),
            });
        }
        let strings = restored.owner.len()
            + restored.key.as_ref().map_or(0, |key| {
                key.network().len() + key.container_id().len() + key.ifname().len()
            });
        if !self.table.has_room(1, strings) {
            return Err(AllocError::TableFull);
        }
        Ok((id, addr, key_hash))
    }

    /// Accepts a recorded allocation whose address is already accounted for by a restored
    /// [`PoolSnapshot`]: only the record (and its lease) is entered. This is how a short-lived
    /// process loads just the allocations it needs (those of one attachment) next to the
    /// pool's snapshot; such a partial engine must not be asked about other allocations.
    pub fn restore_allocation_accounted(
        &mut self,
        restored: &RestoredAllocation,
    ) -> Result<(), AllocError> {
        let (id, addr, key_hash) = self.check_restored(restored)?;
        self.table.insert(
            NewRecord {
                addr,
                pool: id,
                generation: restored.generation,
                owner: &restored.owner,
                key: restored.key.as_ref(),
            },
            key_hash,
        );
        if let Some(lease) = restored.lease {
            self.leases.insert(addr, lease);
            self.lease_queue.insert((lease.expires_at, addr));
        }
        self.next_generation = self.next_generation.max(restored.generation + 1);
        Ok(())
    }

    /// The derived state of a pool, for a store to keep beside the allocations.
    pub fn pool_snapshot(&self, pool: &PoolName) -> Result<PoolSnapshot, AllocError> {
        let pool = self.pool(self.pool_id(pool)?);
        Ok(PoolSnapshot {
            current: [pool.families[0].current, pool.families[1].current],
            n_allocated: [pool.families[0].n_allocated, pool.families[1].n_allocated],
            ranges: pool
                .families
                .iter()
                .flat_map(|f| f.ranges.values())
                .map(|range| RangeSnapshot {
                    spec: range.spec,
                    draining: range.draining,
                    cursor: range.cursor,
                    n_allocated: range.n_allocated,
                    occupancy: range.occupancy.snapshot(),
                })
                .collect(),
        })
    }

    /// Replaces a pool's derived state with a snapshot, while restoring. The pool must have
    /// exactly the snapshot's ranges already (added with [`Engine::add_range`]); nothing is
    /// changed when it does not fit.
    pub fn restore_pool_snapshot(
        &mut self,
        pool: &PoolName,
        snapshot: &PoolSnapshot,
    ) -> Result<(), AllocError> {
        self.require_restoring("restore_pool_snapshot")?;
        let id = self.pool_id(pool)?;
        let mismatch = |reason: String| AllocError::SnapshotMismatch {
            pool: pool.clone(),
            reason,
        };
        let existing = self.pool(id);
        let n_ranges: usize = existing.families.iter().map(|f| f.ranges.len()).sum();
        if n_ranges != snapshot.ranges.len() {
            return Err(mismatch(format!(
                "the pool has {n_ranges} ranges, the snapshot {}",
                snapshot.ranges.len()
            )));
        }
        let mut occupancies = Vec::with_capacity(snapshot.ranges.len());
        for range in &snapshot.ranges {
            let (start, end) = range.spec.bounds();
            let family = existing.family(range.spec.family());
            match family.ranges.get(&start) {
                Some(current) if current.spec == range.spec => {}
                _ => return Err(mismatch(format!("the pool has no range {}", range.spec))),
            }
            let occupancy = Occupancy::from_snapshot(end - start + 1, &range.occupancy)
                .ok_or_else(|| mismatch(format!("occupancy of {} does not fit", range.spec)))?;
            occupancies.push(occupancy);
        }
        let pool_ref = self.pool_mut(id);
        for (range, occupancy) in snapshot.ranges.iter().zip(occupancies) {
            let pool_family = pool_ref.family_mut(range.spec.family());
            if let Some(target) = pool_family.ranges.get_mut(&range.spec.bounds().0) {
                target.n_blocked = occupancy.count(0, target.end - target.start);
                target.occupancy = occupancy;
                target.cursor = range.cursor.min(target.end - target.start);
                target.n_allocated = range.n_allocated;
                target.draining = range.draining;
            }
        }
        for family in Family::ALL {
            let pool_family = pool_ref.family_mut(family);
            pool_family.set_current(snapshot.current[family.index()]);
            pool_family.n_allocated = snapshot.n_allocated[family.index()];
            pool_family.resync_free();
        }
        self.partial = true;
        Ok(())
    }

    /// Whether a pool's occupancy came from a snapshot ([`Engine::restore_pool_snapshot`]):
    /// it then blocks addresses the engine was not told about (allocations and cooldowns that
    /// were not restored), and such a partial engine knows only the allocations and cooldowns
    /// restored into it, or made since. It still never hands out a blocked address; a
    /// cooldown it does not know ends only in another engine that is told about it.
    pub fn is_partial(&self) -> bool {
        self.partial
    }

    /// Takes over the next-fit positions of a snapshot (the current range per family and each
    /// range's cursor, by address), while restoring. A rebuild from the allocations uses this
    /// so next-fit continues where it was instead of starting over at the bottom of each range.
    pub fn restore_cursors(
        &mut self,
        pool: &PoolName,
        snapshot: &PoolSnapshot,
    ) -> Result<(), AllocError> {
        self.require_restoring("restore_cursors")?;
        let id = self.pool_id(pool)?;
        let pool_ref = self.pool_mut(id);
        // Positions are carried over by address, so they survive a range being widened or
        // split: a cursor lands in whichever range now holds the address it pointed at.
        for range in &snapshot.ranges {
            let position = range.spec.bounds().0.saturating_add(range.cursor);
            let pool_family = pool_ref.family_mut(range.spec.family());
            if let Some((_, target)) = pool_family.ranges.range_mut(..=position).next_back()
                && target.end >= position
            {
                target.cursor = position - target.start;
            }
        }
        for family in Family::ALL {
            pool_ref
                .family_mut(family)
                .set_current(snapshot.current[family.index()]);
        }
        Ok(())
    }

    /// Raises the next generation to at least `floor` (persisted counters come back this way).
    pub fn restore_generation(&mut self, floor: u64) {
        self.next_generation = self.next_generation.max(floor.min(MAX_GENERATION + 1));
    }

    /// Ends the restore phase: allocation, expiry and release of unknown attachments resume.
    pub fn finish_restore(&mut self) {
        self.restoring = false;
    }

    // ---- introspection -------------------------------------------------------------------

    fn entry(&self, index: u32) -> DumpEntry {
        let record = self.table.get(index);
        DumpEntry {
            addr: record.addr().ip(),
            owner: record.owner().to_owned(),
            key: record.key(),
            generation: record.generation(),
            lease: self.leases.get(&record.addr()).copied(),
        }
    }

    /// What is known about one address, if it is allocated.
    pub fn lookup(&self, addr: IpAddr) -> Option<AllocationInfo> {
        let index = self.table.find_addr(AddrKey::new(addr))?;
        Some(AllocationInfo {
            pool: self.pool(self.table.get(index).pool()).name.clone(),
            entry: self.entry(index),
        })
    }

    /// Every allocation of an attachment.
    pub fn lookup_key(&self, key: &AttachmentKey) -> Vec<AllocationInfo> {
        let mut found: Vec<AllocationInfo> = self
            .table
            .find_key(key, self.table.key_hash(key))
            .map(|index| AllocationInfo {
                pool: self.pool(self.table.get(index).pool()).name.clone(),
                entry: self.entry(index),
            })
            .collect();
        found.sort_by_key(|info| (Family::of(info.entry.addr), info.entry.addr));
        found
    }

    /// Every allocation, per pool (in creation order), ordered by family and address.
    pub fn dump(&self) -> Vec<PoolDump> {
        let mut per_pool: BTreeMap<PoolId, Vec<(AddrKey, u32)>> = BTreeMap::new();
        for (index, record) in self.table.iter() {
            per_pool
                .entry(record.pool())
                .or_default()
                .push((record.addr(), index));
        }
        self.pools
            .iter()
            .enumerate()
            .filter_map(|(id, pool)| pool.as_ref().map(|p| (id as PoolId, p)))
            .map(|(id, pool)| {
                let mut entries = per_pool.remove(&id).unwrap_or_default();
                entries.sort_unstable();
                PoolDump {
                    pool: pool.name.clone(),
                    allocations: entries.into_iter().map(|(_, i)| self.entry(i)).collect(),
                }
            })
            .collect()
    }

    /// Cooling addresses of a pool with their release times, for persistence.
    pub fn cooling(&self, pool: &PoolName) -> Result<Vec<(IpAddr, Timestamp)>, AllocError> {
        let pool = self.pool(self.pool_id(pool)?);
        Ok(pool
            .families
            .iter()
            .flat_map(|f| {
                f.cooling
                    .iter()
                    .map(move |(value, at)| (f.family.addr(value), at))
            })
            .collect())
    }

    /// The cooling address of a pool and family released longest ago, which is handed out
    /// when nothing else is free.
    pub fn oldest_cooling(
        &self,
        pool: &PoolName,
        family: Family,
    ) -> Result<Option<(IpAddr, Timestamp)>, AllocError> {
        let pool = self.pool(self.pool_id(pool)?);
        Ok(pool
            .family(family)
            .cooling
            .oldest()
            .map(|(at, value)| (family.addr(value), at)))
    }

    /// The pool an address is cooling in (the one whose range holds it) and when it was
    /// released, if it is cooling.
    pub fn cooldown(&self, addr: IpAddr) -> Option<(PoolName, Timestamp)> {
        let addr_key = AddrKey::new(addr);
        let pool = self.pool(self.range_owner(addr_key)?);
        let released_at = pool
            .family(addr_key.family)
            .cooling
            .released_at(addr_key.value)?;
        Some((pool.name.clone(), released_at))
    }

    /// When an address was released, if it is still cooling.
    pub fn cooling_since(&self, pool: &PoolName, addr: IpAddr) -> Option<Timestamp> {
        let pool = self.pool(self.pool_id(pool).ok()?);
        pool.family(Family::of(addr))
            .cooling
            .released_at(addr_value(addr))
    }

    /// Counts for one pool and family, as of the last operation (see [`Engine::advance`]).
    pub fn stats(&self, pool: &PoolName, family: Family) -> Result<FamilyStats, AllocError> {
        let pool = self.pool(self.pool_id(pool)?);
        let pool_family = pool.family(family);
        let mut stats = FamilyStats {
            used: pool_family.n_allocated,
            cooling: pool_family.cooling.len() as u64,
            ranges: pool_family.ranges.len(),
            ..FamilyStats::default()
        };
        let mut used_active = 0u64;
        let mut raw = 0u128;
        let mut blocked = 0u128;
        let mut reserved = 0u128;
        for (&start, range) in &pool_family.ranges {
            if range.draining {
                stats.draining_ranges += 1;
                continue;
            }
            used_active += range.n_allocated;
            raw = raw.saturating_add(range.size());
            blocked = blocked.saturating_add(range.n_blocked);
            reserved += pool_family
                .reserved
                .keys()
                .filter(|&&v| v >= start && v <= range.end)
                .filter(|&&v| self.table.find_addr(AddrKey { family, value: v }).is_none())
                .count() as u128;
        }
        stats.capacity = raw - reserved;
        stats.free = raw - blocked;
        stats.used_outside_active = stats.used - used_active;
        stats.excluded = blocked
            .saturating_sub(u128::from(used_active))
            .saturating_sub(u128::from(stats.cooling))
            .saturating_sub(reserved);
        Ok(stats)
    }

    /// Total addresses the active ranges of all pools can hand out, per family.
    pub fn capacity(&self, family: Family) -> u128 {
        self.pool_names()
            .iter()
            .filter_map(|name| self.stats(name, family).ok())
            .fold(0u128, |acc, s| acc.saturating_add(s.capacity))
    }

    /// Number of allocations in all pools.
    pub fn n_allocations(&self) -> usize {
        self.table.len()
    }

    /// One line for logs and `corral status`, e.g.
    /// `ipv4 12/254 used in 1 pool, ipv6 12/18446744073709551614 used in 1 pool`.
    pub fn status_line(&self) -> String {
        let mut parts = Vec::new();
        for family in Family::ALL {
            let enabled = match family {
                Family::V4 => self.config.ipv4_enabled,
                Family::V6 => self.config.ipv6_enabled,
            };
            if !enabled {
                parts.push(format!("{family} disabled"));
                continue;
            }
            let mut used = 0u64;
            let mut outside = 0u64;
            let mut capacity = 0u128;
            let mut n_pools = 0;
            for name in self.pool_names() {
                if let Ok(stats) = self.stats(&name, family)
                    && (stats.ranges > 0 || stats.used > 0)
                {
                    used += stats.used - stats.used_outside_active;
                    outside += stats.used_outside_active;
                    capacity = capacity.saturating_add(stats.capacity);
                    n_pools += 1;
                }
            }
            let plural = if n_pools == 1 { "" } else { "s" };
            let mut part = format!("{family} {used}/{capacity} used in {n_pools} pool{plural}");
            if outside > 0 {
                part.push_str(&format!(" (+{outside} outside active ranges)"));
            }
            parts.push(part);
        }
        if self.restoring {
            parts.push("restoring".to_owned());
        }
        parts.join(", ")
    }

    /// Recomputes every derived structure from its sources and compares: the blocked sets,
    /// per-range and per-pool allocation counts, the range index and the lease queue. For
    /// tests; returns a description of the first difference.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut per_family: HashMap<(PoolId, Family), Vec<u128>> = HashMap::new();
        // Occupancy counts every pool's allocations (see `allocated_in`).
        let mut held: [Vec<u128>; 2] = [Vec::new(), Vec::new()];
        for (_, record) in self.table.iter() {
            per_family
                .entry((record.pool(), record.addr().family))
                .or_default()
                .push(record.addr().value);
            held[record.addr().family.index()].push(record.addr().value);
        }
        let mut n_ranges = [0usize; 2];
        for (id, pool) in self.pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            for pool_family in &pool.families {
                let family = pool_family.family;
                let allocated = per_family
                    .remove(&(id as PoolId, family))
                    .unwrap_or_default();
                if pool_family.n_allocated != allocated.len() as u64 {
                    return Err(format!("pool {} {family}: allocation count", pool.name));
                }
                for (&start, range) in &pool_family.ranges {
                    n_ranges[family.index()] += 1;
                    if pool_family.rebuilt(range, &held[family.index()]) != range.occupancy {
                        return Err(format!(
                            "range {}: occupancy differs from its sources",
                            range.spec
                        ));
                    }
                    if PoolFamily::blocked_in(range) != range.n_blocked {
                        return Err(format!("range {}: blocked count", range.spec));
                    }
                    if pool_family.with_free.contains(&start) != range.has_free() {
                        return Err(format!("range {}: with_free is stale", range.spec));
                    }
                    let inside = allocated
                        .iter()
                        .filter(|&&v| v >= start && v <= range.end)
                        .count() as u64;
                    if inside != range.n_allocated {
                        return Err(format!("range {}: allocation count", range.spec));
                    }
                    if range.draining && range.n_allocated == 0 {
                        return Err(format!("range {}: drained but kept", range.spec));
                    }
                    if self.range_index[family.index()].get(&start)
                        != Some(&(range.end, id as PoolId))
                    {
                        return Err(format!(
                            "range {}: missing from the range index",
                            range.spec
                        ));
                    }
                }
                if pool_family
                    .with_free
                    .iter()
                    .any(|start| !pool_family.ranges.contains_key(start))
                {
                    return Err(format!(
                        "pool {} {family}: with_free names no range",
                        pool.name
                    ));
                }
                for (value, _) in pool_family.cooling.iter() {
                    if !pool_family.is_active_capacity(value) || pool_family.is_held_back(value) {
                        return Err(format!("pool {} {family}: stale cooling entry", pool.name));
                    }
                }
            }
        }
        if !per_family.is_empty() {
            return Err("allocation in a pool that does not exist".to_owned());
        }
        for family in Family::ALL {
            if self.range_index[family.index()].len() != n_ranges[family.index()] {
                return Err(format!("{family}: range index has extra entries"));
            }
        }
        if self.lease_queue.len() != self.leases.len()
            || self
                .lease_queue
                .iter()
                .any(|(at, addr)| self.leases.get(addr).map(|l| l.expires_at) != Some(*at))
        {
            return Err("lease queue and leases disagree".to_owned());
        }
        Ok(())
    }

    /// Heap bytes of the allocation table's own structures, for the memory benchmark.
    #[doc(hidden)]
    pub fn table_bytes(&self) -> usize {
        self.table.index_bytes()
    }
}
