//! `CidrSpace` (the node CIDRs of one pool and family) and `NodeIdSpace` (node IDs 1..=max): what is occupied, and the lowest free.
//!
//! Occupancy is kept as four interval sets: granted, quarantined, reserved and in flight
//! (proposed, not yet committed). Memory follows the number of occupied runs, never the size of
//! the space, so a /32 IPv6 cluster CIDR with /64 nodes (2^32 node CIDRs) costs nothing until
//! used. `lowest_free` jumps from each blocking run to the next aligned start, so its cost is
//! the number of runs it meets times a map lookup, whatever the fill level. What keys block
//! without occupying a counted slot (ranges an agent holds without a grant, foreign keys) is
//! kept the same way (`blocked.rs`): a stretch of them is one run, so a space after a restore
//! that lost thousands of grants is searched as fast as a full one.

use corral_core::{Family, RunSet};
use ipnet::IpNet;
use thiserror::Error;

use crate::config::FamilyConfig;
use crate::net::{family_of, host_mask, net_of, net_range, pow2_saturating};

mod blocked;

use blocked::Blocked;

/// Why an occupancy change was refused; it changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpaceError {
    /// The CIDR is not an aligned node CIDR inside one of the space's cluster CIDRs.
    #[error(
        "{cidr} is not a node CIDR of this space (an aligned /{node_prefix_len} inside a cluster CIDR)"
    )]
    NotNodeCidr {
        /// The refused CIDR.
        cidr: IpNet,
        /// The space's node prefix length.
        node_prefix_len: u8,
    },
    /// A grant overlaps one already granted.
    #[error("grant of {cidr} overlaps an existing grant")]
    GrantOverlap {
        /// The refused CIDR.
        cidr: IpNet,
    },
    /// The CIDR is already quarantined.
    #[error("{cidr} is already quarantined")]
    AlreadyQuarantined {
        /// The refused CIDR.
        cidr: IpNet,
    },
    /// Releasing a CIDR that is not granted.
    #[error("{cidr} is not granted")]
    NotGranted {
        /// The CIDR.
        cidr: IpNet,
    },
    /// Releasing a CIDR that is not quarantined.
    #[error("{cidr} is not quarantined")]
    NotQuarantined {
        /// The CIDR.
        cidr: IpNet,
    },
    /// Proposing a CIDR that is occupied.
    #[error("{cidr} is not free")]
    NotFree {
        /// The CIDR.
        cidr: IpNet,
    },
    /// Abandoning a CIDR that is not in flight.
    #[error("{cidr} is not in flight")]
    NotInFlight {
        /// The CIDR.
        cidr: IpNet,
    },
    /// A node ID outside 1..=max.
    #[error("node ID {id} is outside 1..={max}")]
    NodeIdOutOfRange {
        /// The refused ID.
        id: u32,
        /// The largest node ID.
        max: u32,
    },
    /// A node ID granted twice.
    #[error("node ID {id} is already granted")]
    NodeIdTaken {
        /// The refused ID.
        id: u32,
    },
    /// A node ID quarantined twice.
    #[error("node ID {id} is already quarantined")]
    NodeIdAlreadyQuarantined {
        /// The refused ID.
        id: u32,
    },
    /// Releasing a node ID that is not granted.
    #[error("node ID {id} is not granted")]
    NodeIdNotGranted {
        /// The ID.
        id: u32,
    },
    /// Releasing a node ID that is not quarantined.
    #[error("node ID {id} is not quarantined")]
    NodeIdNotQuarantined {
        /// The ID.
        id: u32,
    },
    /// Proposing a node ID that is occupied.
    #[error("node ID {id} is not free")]
    NodeIdNotFree {
        /// The ID.
        id: u32,
    },
    /// Abandoning a node ID that is not in flight.
    #[error("node ID {id} is not in flight")]
    NodeIdNotInFlight {
        /// The ID.
        id: u32,
    },
}

/// Counts of one space, in node CIDRs (or node IDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceStats {
    /// Every node CIDR (node ID) of the space, saturating at `u128::MAX`.
    pub capacity: u128,
    /// Granted.
    pub granted: u128,
    /// Quarantined.
    pub quarantined: u128,
    /// Overlapping a reserved range (never granted).
    pub reserved: u128,
    /// Proposed and not yet committed or abandoned.
    pub in_flight: u128,
    /// Occupied by nothing above, only blocked: a key that is not one of the space's node
    /// CIDRs (another prefix length, outside the cluster CIDRs) or space an agent holds
    /// without a grant of it (`holdings/`).
    pub blocked: u128,
    /// What is free: capacity less every node CIDR (node ID) that anything occupies, each
    /// counted once (a grant left over a reserved range is one node CIDR, not two).
    pub free: u128,
}

/// The node CIDRs of one pool and family.
#[derive(Debug, Clone)]
pub struct CidrSpace {
    family: Family,
    node_prefix_len: u8,
    /// The cluster CIDRs in address order, with their integer ranges.
    clusters: Vec<(u128, u128, IpNet)>,
    granted: RunSet,
    n_granted: u128,
    quarantined: RunSet,
    n_quarantined: u128,
    reserved: RunSet,
    n_reserved: u128,
    in_flight: RunSet,
    n_in_flight: u128,
    /// Addresses of keys that are not node CIDRs of the space (a grant or quarantine key of
    /// another prefix length, or outside the cluster CIDRs: garbage an operator never
    /// writes) and ranges held without their grant: blocked, uncounted, one block per key or
    /// holding (they may overlap).
    foreign: Blocked,
}

impl CidrSpace {
    /// A space of node CIDRs of `node_prefix_len` inside `cluster_cidrs`, with `reserved` ranges.
    ///
    /// CIDRs of another family are ignored and cluster CIDRs longer than the node prefix hold
    /// no node CIDR (a validated configuration has neither).
    pub fn new(
        family: Family,
        cluster_cidrs: &[IpNet],
        node_prefix_len: u8,
        reserved: &[IpNet],
    ) -> CidrSpace {
        let mut clusters: Vec<(u128, u128, IpNet)> = cluster_cidrs
            .iter()
            .filter(|c| family_of(c) == family && c.prefix_len() <= node_prefix_len)
            .map(|c| {
                let (s, e) = net_range(&c.trunc());
                (s, e, c.trunc())
            })
            .collect();
        clusters.sort_by_key(|&(s, _, _)| s);
        clusters.dedup_by_key(|&mut (s, _, _)| s);
        let mut space = CidrSpace {
            family,
            node_prefix_len: node_prefix_len.min(family.bits()),
            clusters,
            granted: RunSet::new(),
            n_granted: 0,
            quarantined: RunSet::new(),
            n_quarantined: 0,
            reserved: RunSet::new(),
            n_reserved: 0,
            in_flight: RunSet::new(),
            n_in_flight: 0,
            foreign: Blocked::default(),
        };
        for net in reserved.iter().filter(|r| family_of(r) == family) {
            let (s, e) = net_range(net);
            space.reserved.insert_range(s, e);
        }
        space.n_reserved = space.count_reserved();
        space
    }

    /// The space of one configured family.
    pub fn from_config(family: Family, config: &FamilyConfig) -> CidrSpace {
        CidrSpace::new(
            family,
            &config.cidrs,
            config.node_prefix_len,
            &config.reserved,
        )
    }

    /// The space's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The node prefix length.
    pub fn node_prefix_len(&self) -> u8 {
        self.node_prefix_len
    }

    /// `2^host_bits - 1` of a node CIDR.
    fn node_span(&self) -> u128 {
        host_mask(self.family, self.node_prefix_len)
    }

    fn host_bits(&self) -> u32 {
        u32::from(self.family.bits() - self.node_prefix_len)
    }

    /// Node CIDRs (per cluster CIDR, by index) that reserved ranges overlap.
    fn count_reserved(&self) -> u128 {
        self.count_slots(self.reserved.iter().collect())
    }

    /// Node CIDRs (per cluster CIDR, by index) that any of `runs` overlaps, each counted once
    /// however many runs share it (runs may overlap and come in any order).
    fn count_slots(&self, mut runs: Vec<(u128, u128)>) -> u128 {
        runs.sort_unstable();
        let host_bits = self.host_bits();
        let index = |value: u128, base: u128| {
            if host_bits >= 128 {
                0
            } else {
                (value - base) >> host_bits
            }
        };
        let mut total = 0u128;
        for &(cs, ce, _) in &self.clusters {
            // The first node CIDR (by index) not counted yet.
            let mut next: Option<u128> = None;
            for &(s, e) in &runs {
                if e < cs || s > ce {
                    continue;
                }
                let first = index(s.max(cs), cs);
                let last = index(e.min(ce), cs);
                let first = next.map_or(first, |n| first.max(n));
                if first <= last {
                    total = total.saturating_add(last - first).saturating_add(1);
                    next = last.checked_add(1).or(Some(u128::MAX));
                    if last == u128::MAX {
                        break;
                    }
                }
            }
        }
        total
    }

    /// The runs of everything that occupies space, blocked runs (`foreign`) included or not.
    fn occupied_runs(&self, with_blocked: bool) -> Vec<(u128, u128)> {
        let mut runs: Vec<(u128, u128)> = [
            &self.granted,
            &self.quarantined,
            &self.reserved,
            &self.in_flight,
        ]
        .iter()
        .flat_map(|set| set.iter())
        .collect();
        if with_blocked {
            runs.extend(self.foreign.runs());
        }
        runs
    }

    /// Whether `cidr` is a node CIDR of the space: of its family, inside a cluster CIDR and
    /// aligned at the node prefix length.
    pub fn contains(&self, cidr: &IpNet) -> bool {
        if family_of(cidr) != self.family
            || cidr.prefix_len() != self.node_prefix_len
            || cidr.trunc() != *cidr
        {
            return false;
        }
        let (s, e) = net_range(cidr);
        self.clusters.iter().any(|&(cs, ce, _)| cs <= s && e <= ce)
    }

    fn node_range(&self, cidr: &IpNet) -> Result<(u128, u128), SpaceError> {
        if self.contains(cidr) {
            Ok(net_range(cidr))
        } else {
            Err(SpaceError::NotNodeCidr {
                cidr: *cidr,
                node_prefix_len: self.node_prefix_len,
            })
        }
    }

    /// An end up to which everything is occupied from inside `start..=end` (the largest end of
    /// each kind's first run that shares an address with it), if anything there is occupied.
    fn blocking_end(&self, start: u128, end: u128) -> Option<u128> {
        [
            &self.granted,
            &self.quarantined,
            &self.reserved,
            &self.in_flight,
        ]
        .iter()
        .filter_map(|set| set.first_overlap(start, end).map(|(_, e)| e))
        .chain(self.foreign.run_end(start, end))
        .max()
    }

    /// Blocks the addresses of a key of the space's family that is not one of its node CIDRs
    /// (reported by the caller): nothing overlapping it is proposed while the key exists, as
    /// the grant transaction's absence compare covers only keys of the exact node CIDR.
    pub fn block_foreign(&mut self, cidr: &IpNet) {
        if family_of(cidr) == self.family {
            let (start, end) = net_range(cidr);
            self.foreign.block(start, end);
        }
    }

    /// Unblocks one `block_foreign` of `cidr` (its key deleted); nothing if there is none.
    pub fn unblock_foreign(&mut self, cidr: &IpNet) {
        let (start, end) = net_range(cidr);
        self.foreign.unblock(start, end);
    }

    /// Whether `cidr` is a node CIDR of the space that nothing occupies.
    pub fn is_free(&self, cidr: &IpNet) -> bool {
        self.node_range(cidr)
            .is_ok_and(|(s, e)| self.blocking_end(s, e).is_none())
    }

    /// The lowest free node CIDR (cluster CIDRs in address order), if any.
    pub fn lowest_free(&self) -> Option<IpNet> {
        let span = self.node_span();
        let host_bits = self.host_bits();
        for &(cs, ce, _) in &self.clusters {
            let mut candidate = cs;
            loop {
                let candidate_end = candidate.saturating_add(span);
                let Some(blocked_to) = self.blocking_end(candidate, candidate_end) else {
                    return net_of(self.family, candidate, self.node_prefix_len);
                };
                if blocked_to >= ce || host_bits >= 128 {
                    break;
                }
                let index = (blocked_to - cs) >> host_bits;
                if index == (ce - cs) >> host_bits {
                    break;
                }
                // Jump past the blocking run to the next aligned start.
                candidate = cs + ((index + 1) << host_bits);
            }
        }
        None
    }

    /// Records a committed grant; refused if it is not a node CIDR of the space or overlaps a
    /// grant already recorded.
    pub fn occupy_granted(&mut self, cidr: &IpNet) -> Result<(), SpaceError> {
        let (s, e) = self.node_range(cidr)?;
        if self.granted.intersects(s, e) {
            return Err(SpaceError::GrantOverlap { cidr: *cidr });
        }
        self.granted.insert_range(s, e);
        self.n_granted += 1;
        Ok(())
    }

    /// Forgets a grant (deleted in etcd).
    pub fn release_granted(&mut self, cidr: &IpNet) -> Result<(), SpaceError> {
        let (s, e) = self.node_range(cidr)?;
        if !self.granted.covers(s, e) {
            return Err(SpaceError::NotGranted { cidr: *cidr });
        }
        self.granted.remove_range(s, e);
        self.n_granted -= 1;
        Ok(())
    }

    /// Records a quarantined node CIDR.
    pub fn occupy_quarantined(&mut self, cidr: &IpNet) -> Result<(), SpaceError> {
        let (s, e) = self.node_range(cidr)?;
        if self.quarantined.intersects(s, e) {
            return Err(SpaceError::AlreadyQuarantined { cidr: *cidr });
        }
        self.quarantined.insert_range(s, e);
        self.n_quarantined += 1;
        Ok(())
    }

    /// Forgets a quarantine (expired or deleted).
    pub fn release_quarantined(&mut self, cidr: &IpNet) -> Result<(), SpaceError> {
        let (s, e) = self.node_range(cidr)?;
        if !self.quarantined.covers(s, e) {
            return Err(SpaceError::NotQuarantined { cidr: *cidr });
        }
        self.quarantined.remove_range(s, e);
        self.n_quarantined -= 1;
        Ok(())
    }

    /// Marks a free node CIDR in flight (proposed), so nothing else proposes it.
    pub fn propose(&mut self, cidr: &IpNet) -> Result<(), SpaceError> {
        let (s, e) = self.node_range(cidr)?;
        if self.blocking_end(s, e).is_some() {
            return Err(SpaceError::NotFree { cidr: *cidr });
        }
        self.in_flight.insert_range(s, e);
        self.n_in_flight += 1;
        Ok(())
    }

    /// Un-marks a node CIDR in flight (committed or given up).
    pub fn abandon(&mut self, cidr: &IpNet) -> Result<(), SpaceError> {
        let (s, e) = self.node_range(cidr)?;
        if !self.in_flight.covers(s, e) {
            return Err(SpaceError::NotInFlight { cidr: *cidr });
        }
        self.in_flight.remove_range(s, e);
        self.n_in_flight -= 1;
        Ok(())
    }

    /// Un-marks everything in flight.
    pub fn abandon_all(&mut self) {
        self.in_flight = RunSet::new();
        self.n_in_flight = 0;
    }

    /// The number of node CIDRs of the space (saturating).
    pub fn capacity(&self) -> u128 {
        self.clusters.iter().fold(0u128, |acc, (_, _, net)| {
            let bits = u32::from(self.node_prefix_len - net.prefix_len());
            acc.saturating_add(pow2_saturating(bits))
        })
    }

    /// The counts of the space. `free` comes from the union of everything that occupies
    /// space (one pass over its runs, sorted: linear in the runs, not in the space).
    pub fn stats(&self) -> SpaceStats {
        let capacity = self.capacity();
        let occupied = self.count_slots(self.occupied_runs(true));
        let blocked = if self.foreign.is_empty() {
            0
        } else {
            occupied.saturating_sub(self.count_slots(self.occupied_runs(false)))
        };
        SpaceStats {
            capacity,
            granted: self.n_granted,
            quarantined: self.n_quarantined,
            reserved: self.n_reserved,
            in_flight: self.n_in_flight,
            blocked,
            free: capacity.saturating_sub(occupied),
        }
    }

    /// The number of granted node CIDRs.
    pub fn granted(&self) -> u128 {
        self.n_granted
    }

    /// The number of quarantined node CIDRs.
    pub fn quarantined(&self) -> u128 {
        self.n_quarantined
    }

    /// The free node CIDRs (see `SpaceStats::free`).
    pub fn free(&self) -> u128 {
        self.stats().free
    }

    /// The runs of what occupies or blocks space: what `lowest_free` meets at most (and, but
    /// for one entry per distinct blocked range, the space's memory in map entries).
    pub fn n_runs(&self) -> usize {
        self.granted.n_runs()
            + self.quarantined.n_runs()
            + self.reserved.n_runs()
            + self.in_flight.n_runs()
            + self.foreign.n_runs()
    }
}

/// Node IDs `1..=max`: granted, quarantined and in flight.
#[derive(Debug, Clone)]
pub struct NodeIdSpace {
    max: u32,
    granted: RunSet,
    quarantined: RunSet,
    in_flight: RunSet,
    /// IDs an agent asserts it serves without a grant of them (`holdings/`): blocked,
    /// uncounted, with how many assertions block each.
    held: Blocked,
}

impl NodeIdSpace {
    /// The node IDs `1..=max`.
    pub fn new(max: u32) -> NodeIdSpace {
        NodeIdSpace {
            max,
            granted: RunSet::new(),
            quarantined: RunSet::new(),
            in_flight: RunSet::new(),
            held: Blocked::default(),
        }
    }

    /// Blocks `id` for an agent's assertion that it serves it (no grant of it to that
    /// node): never proposed while blocked. IDs outside the space are ignored.
    pub fn block_held(&mut self, id: u32) {
        if self.contains(id) {
            self.held.block(u128::from(id), u128::from(id));
        }
    }

    /// Unblocks one `block_held` of `id`; nothing if there is none.
    pub fn unblock_held(&mut self, id: u32) {
        self.held.unblock(u128::from(id), u128::from(id));
    }

    /// The largest node ID.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Whether `id` is in `1..=max`.
    pub fn contains(&self, id: u32) -> bool {
        (1..=self.max).contains(&id)
    }

    fn check(&self, id: u32) -> Result<u128, SpaceError> {
        if self.contains(id) {
            Ok(u128::from(id))
        } else {
            Err(SpaceError::NodeIdOutOfRange { id, max: self.max })
        }
    }

    fn blocking_end(&self, id: u128) -> Option<u128> {
        [&self.granted, &self.quarantined, &self.in_flight]
            .iter()
            .filter_map(|set| set.first_overlap(id, id).map(|(_, e)| e))
            .chain(self.held.run_end(id, id))
            .max()
    }

    /// Whether `id` is in range and nothing occupies it.
    pub fn is_free(&self, id: u32) -> bool {
        self.check(id).is_ok_and(|v| self.blocking_end(v).is_none())
    }

    /// The smallest free node ID, if any.
    pub fn lowest_free(&self) -> Option<u32> {
        let mut candidate: u128 = 1;
        while candidate <= u128::from(self.max) {
            match self.blocking_end(candidate) {
                None => return u32::try_from(candidate).ok(),
                Some(end) => candidate = end + 1,
            }
        }
        None
    }

    /// Records a granted node ID.
    pub fn occupy_granted(&mut self, id: u32) -> Result<(), SpaceError> {
        let v = self.check(id)?;
        if !self.granted.insert_range(v, v) {
            return Err(SpaceError::NodeIdTaken { id });
        }
        Ok(())
    }

    /// Forgets a granted node ID.
    pub fn release_granted(&mut self, id: u32) -> Result<(), SpaceError> {
        let v = self.check(id)?;
        if !self.granted.remove_range(v, v) {
            return Err(SpaceError::NodeIdNotGranted { id });
        }
        Ok(())
    }

    /// Records a quarantined node ID.
    pub fn occupy_quarantined(&mut self, id: u32) -> Result<(), SpaceError> {
        let v = self.check(id)?;
        if !self.quarantined.insert_range(v, v) {
            return Err(SpaceError::NodeIdAlreadyQuarantined { id });
        }
        Ok(())
    }

    /// Forgets a quarantined node ID.
    pub fn release_quarantined(&mut self, id: u32) -> Result<(), SpaceError> {
        let v = self.check(id)?;
        if !self.quarantined.remove_range(v, v) {
            return Err(SpaceError::NodeIdNotQuarantined { id });
        }
        Ok(())
    }

    /// Marks a free node ID in flight.
    pub fn propose(&mut self, id: u32) -> Result<(), SpaceError> {
        let v = self.check(id)?;
        if self.blocking_end(v).is_some() {
            return Err(SpaceError::NodeIdNotFree { id });
        }
        self.in_flight.insert_range(v, v);
        Ok(())
    }

    /// Un-marks a node ID in flight.
    pub fn abandon(&mut self, id: u32) -> Result<(), SpaceError> {
        let v = self.check(id)?;
        if !self.in_flight.remove_range(v, v) {
            return Err(SpaceError::NodeIdNotInFlight { id });
        }
        Ok(())
    }

    /// Un-marks everything in flight.
    pub fn abandon_all(&mut self) {
        self.in_flight = RunSet::new();
    }

    /// The counts of the space; `free` from the union of what occupies IDs (an ID held
    /// without a grant and also granted or quarantined counts once).
    pub fn stats(&self) -> SpaceStats {
        let all = (1u128, u128::from(self.max));
        let granted = self.granted.count_in(all.0, all.1);
        let quarantined = self.quarantined.count_in(all.0, all.1);
        let in_flight = self.in_flight.count_in(all.0, all.1);
        let mut union = RunSet::new();
        for set in [&self.granted, &self.quarantined, &self.in_flight] {
            for (s, e) in set.runs_in(all.0, all.1) {
                union.insert_range(s, e);
            }
        }
        let occupied_by_records = union.count_in(all.0, all.1);
        for (s, e) in self.held.runs() {
            union.insert_range(s, e);
        }
        let occupied = union.count_in(all.0, all.1);
        let capacity = u128::from(self.max);
        SpaceStats {
            capacity,
            granted,
            quarantined,
            reserved: 0,
            in_flight,
            blocked: occupied - occupied_by_records,
            free: capacity.saturating_sub(occupied),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::net;

    fn space(cidrs: &[&str], node_prefix_len: u8, reserved: &[&str]) -> CidrSpace {
        let cidrs: Vec<IpNet> = cidrs.iter().map(|c| net(c)).collect();
        let reserved: Vec<IpNet> = reserved.iter().map(|c| net(c)).collect();
        CidrSpace::new(family_of(&cidrs[0]), &cidrs, node_prefix_len, &reserved)
    }

    #[test]
    fn lowest_free_jumps_over_runs_and_into_the_next_cluster_cidr() {
        // Given out of address order: allocation still goes in address order.
        let mut s = space(&["10.1.0.0/30", "10.0.0.0/29"], 30, &[]);
        assert_eq!(s.capacity(), 3);
        assert_eq!(s.lowest_free(), Some(net("10.0.0.0/30")));
        s.occupy_granted(&net("10.0.0.0/30")).unwrap();
        assert_eq!(s.lowest_free(), Some(net("10.0.0.4/30")));
        s.propose(&net("10.0.0.4/30")).unwrap();
        assert_eq!(s.lowest_free(), Some(net("10.1.0.0/30")));
        s.occupy_quarantined(&net("10.1.0.0/30")).unwrap();
        assert_eq!(s.lowest_free(), None);
        s.abandon(&net("10.0.0.4/30")).unwrap();
        assert_eq!(s.lowest_free(), Some(net("10.0.0.4/30")));
        let stats = s.stats();
        assert_eq!(
            (
                stats.granted,
                stats.quarantined,
                stats.in_flight,
                stats.free
            ),
            (1, 1, 0, 1)
        );
    }

    #[test]
    fn a_run_of_many_grants_is_one_jump() {
        let mut s = space(&["10.0.0.0/8"], 24, &[]);
        for i in 0..1000u32 {
            let cidr = net_of(Family::V4, u128::from(0x0a00_0000u32 + (i << 8)), 24).unwrap();
            s.occupy_granted(&cidr).unwrap();
        }
        assert_eq!(s.n_runs(), 1);
        assert_eq!(s.lowest_free(), Some(net("10.3.232.0/24")));
        s.release_granted(&net("10.1.0.0/24")).unwrap();
        assert_eq!(s.lowest_free(), Some(net("10.1.0.0/24")));
        assert_eq!(s.granted(), 999);
    }

    /// Ranges held without their grants (a restore lost them) are searched as grants are, as
    /// one run however many: a new node's CIDR is found in one jump past them (each was a
    /// step of its own, and each step looked at every one of them).
    #[test]
    fn a_stretch_of_ranges_held_without_grants_is_one_run() {
        let mut s = space(&["10.0.0.0/8"], 24, &[]);
        for i in 0..1000u32 {
            let cidr = net_of(Family::V4, u128::from(0x0a00_0000u32 + (i << 8)), 24).unwrap();
            s.block_foreign(&cidr);
        }
        s.block_foreign(&net("10.0.0.0/24"));
        assert_eq!(s.n_runs(), 1);
        assert_eq!(s.lowest_free(), Some(net("10.3.232.0/24")));
        s.unblock_foreign(&net("10.1.0.0/24"));
        assert_eq!(s.lowest_free(), Some(net("10.1.0.0/24")));
        // Blocked twice, free after two unblocks.
        s.unblock_foreign(&net("10.0.0.0/24"));
        assert_eq!(s.lowest_free(), Some(net("10.1.0.0/24")));
        s.unblock_foreign(&net("10.0.0.0/24"));
        assert_eq!(s.lowest_free(), Some(net("10.0.0.0/24")));
        assert_eq!((s.stats().blocked, s.n_runs()), (998, 2));
    }

    #[test]
    fn node_ids_held_without_grants_are_one_run() {
        let mut ids = NodeIdSpace::new(100_000);
        for id in 1..=50_000 {
            ids.block_held(id);
        }
        assert_eq!(ids.held.n_runs(), 1);
        assert_eq!(ids.lowest_free(), Some(50_001));
        ids.unblock_held(7);
        assert_eq!(ids.lowest_free(), Some(7));
        assert_eq!(ids.stats().blocked, 49_999);
    }

    #[test]
    fn reserved_ranges_occupy_every_node_cidr_they_overlap() {
        // A /20 at the start, a single address in the middle of 10.244.17.0/24, and a range
        // bigger than the cluster CIDR's tail.
        let mut s = space(
            &["10.244.0.0/16"],
            24,
            &[
                "10.244.0.0/20",
                "10.244.16.0/24",
                "10.244.17.77/32",
                "10.244.255.0/24",
            ],
        );
        assert_eq!(s.stats().reserved, 16 + 1 + 1 + 1);
        assert_eq!(s.lowest_free(), Some(net("10.244.18.0/24")));
        assert!(!s.is_free(&net("10.244.17.0/24")));
        assert_eq!(
            s.propose(&net("10.244.17.0/24")),
            Err(SpaceError::NotFree {
                cidr: net("10.244.17.0/24")
            })
        );
        // A grant committed over a reserved range (e.g. before the range was reserved) is
        // still recorded: etcd holds it.
        s.occupy_granted(&net("10.244.1.0/24")).unwrap();
        // Two reserved addresses in one node CIDR count it once.
        let t = space(
            &["10.0.0.0/24"],
            30,
            &["10.0.0.1/32", "10.0.0.3/32", "10.0.0.9/32"],
        );
        assert_eq!(t.stats().reserved, 2);
        assert_eq!(t.lowest_free(), Some(net("10.0.0.4/30")));
    }

    /// Cilium's `TestSetReservedRangesOverlap`: a node CIDR granted before a reserved range
    /// was laid over it is one unavailable node CIDR, not two (Cilium: 1 unavailable).
    #[test]
    fn a_grant_under_a_reserved_range_counts_once() {
        let mut s = space(&["10.0.0.0/24"], 26, &[]);
        s.occupy_granted(&net("10.0.0.64/26")).unwrap();
        let mut reserved = space(&["10.0.0.0/24"], 26, &["10.0.0.70/31"]);
        reserved.occupy_granted(&net("10.0.0.64/26")).unwrap();
        let stats = reserved.stats();
        assert_eq!((stats.granted, stats.reserved), (1, 1));
        assert_eq!(stats.free, 3, "{stats:?}");
        assert_eq!(stats.free, s.stats().free);
        // A quarantine under a reserved range and a proposal in flight beside it.
        reserved.occupy_quarantined(&net("10.0.0.128/26")).unwrap();
        let mut reserved_too = space(&["10.0.0.0/24"], 26, &["10.0.0.70/31", "10.0.0.130/32"]);
        reserved_too.occupy_granted(&net("10.0.0.64/26")).unwrap();
        reserved_too
            .occupy_quarantined(&net("10.0.0.128/26"))
            .unwrap();
        reserved_too.propose(&net("10.0.0.0/26")).unwrap();
        let stats = reserved_too.stats();
        assert_eq!(stats.free, 1, "{stats:?}");
        assert_eq!(reserved_too.lowest_free(), Some(net("10.0.0.192/26")));
    }

    /// Kubernetes' `TestCidrSetMetrics` counts what its allocator cannot hand out; here a key
    /// that is not a node CIDR of the space (a grant of another prefix length: garbage an
    /// operator wrote) blocks the node CIDRs it overlaps, and they are not free. A blocked
    /// node CIDR that is also granted counts once.
    #[test]
    fn space_blocked_by_a_foreign_key_is_not_free() {
        let mut s = space(&["10.0.0.0/24"], 26, &[]);
        assert_eq!(s.stats().free, 4);
        // A /25 over the first two node CIDRs.
        s.block_foreign(&net("10.0.0.0/25"));
        let stats = s.stats();
        assert_eq!((stats.blocked, stats.free), (2, 2), "{stats:?}");
        assert_eq!(s.lowest_free(), Some(net("10.0.0.128/26")));
        s.occupy_granted(&net("10.0.0.128/26")).unwrap();
        // A single address over a granted node CIDR: blocked adds nothing.
        s.block_foreign(&net("10.0.0.130/32"));
        let stats = s.stats();
        assert_eq!(
            (stats.granted, stats.blocked, stats.free),
            (1, 2, 1),
            "{stats:?}"
        );
        s.unblock_foreign(&net("10.0.0.0/25"));
        let stats = s.stats();
        assert_eq!((stats.blocked, stats.free), (0, 3), "{stats:?}");
    }

    /// Node IDs an agent holds without a grant are not free; one also granted counts once.
    #[test]
    fn node_ids_held_without_a_grant_are_not_free() {
        let mut ids = NodeIdSpace::new(8);
        ids.occupy_granted(1).unwrap();
        ids.block_held(1);
        ids.block_held(5);
        let stats = ids.stats();
        assert_eq!(
            (stats.granted, stats.blocked, stats.free),
            (1, 1, 6),
            "{stats:?}"
        );
    }

    #[test]
    fn wrong_shapes_and_overlaps_are_refused() {
        let mut s = space(&["10.0.0.0/16"], 24, &[]);
        for bad in ["10.1.0.0/24", "10.0.0.0/23", "10.0.0.0/25", "fd00::/24"] {
            assert!(
                matches!(
                    s.occupy_granted(&net(bad)),
                    Err(SpaceError::NotNodeCidr { .. })
                ),
                "{bad}"
            );
        }
        assert!(!s.contains(&"10.0.0.1/24".parse::<IpNet>().unwrap()));
        s.occupy_granted(&net("10.0.5.0/24")).unwrap();
        assert_eq!(
            s.occupy_granted(&net("10.0.5.0/24")),
            Err(SpaceError::GrantOverlap {
                cidr: net("10.0.5.0/24")
            })
        );
        assert_eq!(
            s.release_granted(&net("10.0.6.0/24")),
            Err(SpaceError::NotGranted {
                cidr: net("10.0.6.0/24")
            })
        );
        assert_eq!(
            s.release_quarantined(&net("10.0.6.0/24")),
            Err(SpaceError::NotQuarantined {
                cidr: net("10.0.6.0/24")
            })
        );
        assert_eq!(
            s.abandon(&net("10.0.6.0/24")),
            Err(SpaceError::NotInFlight {
                cidr: net("10.0.6.0/24")
            })
        );
        assert_eq!(s.granted(), 1);
    }

    #[test]
    fn a_huge_ipv6_space_costs_what_is_occupied() {
        let mut s = space(&["fd00::/32"], 64, &["fd00:0:0:10::/60"]);
        assert_eq!(s.capacity(), 1u128 << 32);
        for _ in 0..10_000 {
            let cidr = s.lowest_free().unwrap();
            s.occupy_granted(&cidr).unwrap();
        }
        // Grants 0..16 (before the reserved /60) and 32..10,016: two runs plus the reserved one.
        assert_eq!(s.n_runs(), 3);
        assert_eq!(s.granted(), 10_000);
        assert_eq!(s.lowest_free(), Some(net("fd00:0:0:2720::/64")));
        assert_eq!(s.stats().free, (1u128 << 32) - 10_000 - 16);
        // A checkerboard costs one run per grant, still nothing per free CIDR.
        let mut t = space(&["fd00::/32"], 64, &[]);
        for i in 0..1000u128 {
            let cidr = net_of(
                Family::V6,
                net_range(&net("fd00::/32")).0 + ((i * 2) << 64),
                64,
            )
            .unwrap();
            t.occupy_granted(&cidr).unwrap();
        }
        assert_eq!(t.n_runs(), 1000);
        assert_eq!(t.lowest_free(), Some(net("fd00:0:0:1::/64")));
    }

    #[test]
    fn extreme_prefixes_do_not_overflow() {
        let mut whole = space(&["::/0"], 0, &[]);
        assert_eq!(whole.capacity(), 1);
        assert_eq!(whole.lowest_free(), Some(net("::/0")));
        whole.occupy_granted(&net("::/0")).unwrap();
        assert_eq!(whole.lowest_free(), None);
        let mut top = space(&["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126"], 128, &[]);
        for _ in 0..4 {
            let cidr = top.lowest_free().unwrap();
            top.occupy_granted(&cidr).unwrap();
        }
        assert_eq!(top.lowest_free(), None);
        let all = space(&["::/0"], 128, &[]);
        assert_eq!(all.capacity(), u128::MAX);
        let mut v4 = space(&["0.0.0.0/0"], 32, &["0.0.0.0/1"]);
        assert_eq!(v4.lowest_free(), Some(net("128.0.0.0/32")));
        v4.occupy_granted(&net("255.255.255.255/32")).unwrap();
    }

    #[test]
    fn node_ids_fill_the_lowest_gap() {
        let mut ids = NodeIdSpace::new(5);
        assert_eq!(ids.lowest_free(), Some(1));
        for id in [1, 2, 4] {
            ids.occupy_granted(id).unwrap();
        }
        assert_eq!(ids.lowest_free(), Some(3));
        ids.occupy_quarantined(3).unwrap();
        assert_eq!(ids.lowest_free(), Some(5));
        ids.propose(5).unwrap();
        assert_eq!(ids.lowest_free(), None);
        assert_eq!(ids.propose(5), Err(SpaceError::NodeIdNotFree { id: 5 }));
        ids.release_granted(2).unwrap();
        assert_eq!(ids.lowest_free(), Some(2));
        ids.release_quarantined(3).unwrap();
        ids.abandon(5).unwrap();
        assert_eq!(
            ids.occupy_granted(4),
            Err(SpaceError::NodeIdTaken { id: 4 })
        );
        assert_eq!(
            ids.occupy_granted(0),
            Err(SpaceError::NodeIdOutOfRange { id: 0, max: 5 })
        );
        assert_eq!(
            ids.occupy_granted(6),
            Err(SpaceError::NodeIdOutOfRange { id: 6, max: 5 })
        );
        let stats = ids.stats();
        assert_eq!((stats.capacity, stats.granted, stats.free), (5, 2, 3));
        assert_eq!(NodeIdSpace::new(0).lowest_free(), None);
        let mut big = NodeIdSpace::new(u32::MAX);
        big.occupy_granted(u32::MAX).unwrap();
        assert_eq!(big.lowest_free(), Some(1));
    }
}
