//! A subnet's address space in the fake: free /32s and free aligned /28s of IPv4 (a bitmap), and
//! IPv6 addresses and /80 prefixes of its /64. AWS reserves the first four addresses and the last
//! one of every IPv4 subnet, so the first and the last /28 of a subnet are never free as prefixes.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use rand::Rng;

/// Addresses in an IPv4 /28.
const BLOCK: u32 = 16;

/// Why an explicit address or prefix was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not inside the subnet (or a reserved address, or a misaligned prefix).
    Outside,
    /// Already used.
    InUse,
}

/// The IPv4 space of a subnet.
#[derive(Clone, Debug)]
pub(crate) struct Ipv4Pool {
    cidr: Ipv4Net,
    size: u32,
    used: Vec<u64>,
    free: u32,
}

impl Ipv4Pool {
    /// The subnet's space with AWS's five reserved addresses taken.
    pub(crate) fn new(cidr: Ipv4Net) -> Ipv4Pool {
        let cidr = cidr.trunc();
        let size = 1u32 << (32 - u32::from(cidr.prefix_len()));
        let mut pool = Ipv4Pool {
            cidr,
            size,
            used: vec![0; size.div_ceil(64) as usize],
            free: size,
        };
        for offset in [0, 1, 2, 3, size - 1] {
            pool.mark(offset);
        }
        pool
    }

    /// Free addresses.
    pub(crate) fn free(&self) -> u32 {
        self.free
    }

    fn is_used(&self, offset: u32) -> bool {
        self.used[(offset / 64) as usize] & (1 << (offset % 64)) != 0
    }

    fn mark(&mut self, offset: u32) {
        if !self.is_used(offset) {
            self.used[(offset / 64) as usize] |= 1 << (offset % 64);
            self.free -= 1;
        }
    }

    fn clear(&mut self, offset: u32) {
        if self.is_used(offset) {
            self.used[(offset / 64) as usize] &= !(1 << (offset % 64));
            self.free += 1;
        }
    }

    fn offset(&self, addr: Ipv4Addr) -> Option<u32> {
        self.cidr
            .contains(&addr)
            .then(|| u32::from(addr) - u32::from(self.cidr.network()))
    }

    fn addr(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.cidr.network()) + offset)
    }

    fn block_is_free(&self, block: u32) -> bool {
        let first = block * BLOCK;
        let word = self.used[(first / 64) as usize];
        (word >> (first % 64)) & 0xffff == 0
    }

    /// Marks one address in a `fraction` of the /28 blocks as used (by someone else), so that
    /// many /28s are no longer free while /32s remain: fragmentation.
    pub(crate) fn fragment(&mut self, fraction: f64, rng: &mut impl Rng) {
        for block in 0..self.size / BLOCK {
            if self.block_is_free(block) && rng.random_bool(fraction.clamp(0.0, 1.0)) {
                self.mark(block * BLOCK + rng.random_range(0..BLOCK));
            }
        }
    }

    /// Takes the `n` lowest free addresses, or nothing when fewer are free.
    pub(crate) fn take_any(&mut self, n: usize) -> Option<Vec<Ipv4Addr>> {
        if (self.free as usize) < n {
            return None;
        }
        let mut taken = Vec::with_capacity(n);
        let mut offset = 0;
        while taken.len() < n {
            let word = self.used[(offset / 64) as usize];
            if word == u64::MAX {
                offset = (offset / 64 + 1) * 64;
                continue;
            }
            if !self.is_used(offset) {
                self.mark(offset);
                taken.push(self.addr(offset));
            }
            offset += 1;
        }
        Some(taken)
    }

    /// Takes `n` free aligned /28s (the lowest first), or nothing when fewer exist.
    pub(crate) fn take_prefixes(&mut self, n: usize) -> Option<Vec<Ipv4Net>> {
        let blocks: Vec<u32> = (0..self.size / BLOCK)
            .filter(|&block| self.block_is_free(block))
            .take(n)
            .collect();
        if blocks.len() < n {
            return None;
        }
        Some(
            blocks
                .into_iter()
                .map(|block| {
                    for offset in block * BLOCK..(block + 1) * BLOCK {
                        self.mark(offset);
                    }
                    Ipv4Net::new(self.addr(block * BLOCK), 28).expect("28 is a valid length")
                })
                .collect(),
        )
    }

    /// Takes one given address.
    pub(crate) fn take(&mut self, addr: Ipv4Addr) -> Result<(), Refusal> {
        let offset = self.offset(addr).ok_or(Refusal::Outside)?;
        if offset < 4 || offset == self.size - 1 {
            return Err(Refusal::Outside);
        }
        if self.is_used(offset) {
            return Err(Refusal::InUse);
        }
        self.mark(offset);
        Ok(())
    }

    /// Takes one given aligned /28.
    pub(crate) fn take_prefix(&mut self, prefix: Ipv4Net) -> Result<(), Refusal> {
        if prefix.prefix_len() != 28 || prefix.trunc() != prefix {
            return Err(Refusal::Outside);
        }
        let first = self.offset(prefix.network()).ok_or(Refusal::Outside)?;
        if !self.block_is_free(first / BLOCK) {
            return Err(Refusal::InUse);
        }
        for offset in first..first + BLOCK {
            self.mark(offset);
        }
        Ok(())
    }

    /// Frees an address.
    pub(crate) fn release(&mut self, addr: Ipv4Addr) {
        if let Some(offset) = self.offset(addr) {
            self.clear(offset);
        }
    }

    /// Frees a /28.
    pub(crate) fn release_prefix(&mut self, prefix: Ipv4Net) {
        if let Some(first) = self.offset(prefix.network()) {
            for offset in first..(first + BLOCK).min(self.size) {
                self.clear(offset);
            }
        }
    }
}

/// The IPv6 space of a subnet's /64: addresses come from its first /80, prefixes are the other
/// /80s.
#[derive(Clone, Debug)]
pub(crate) struct Ipv6Pool {
    cidr: Ipv6Net,
    addresses: BTreeSet<u128>,
    prefixes: BTreeSet<u128>,
}

impl Ipv6Pool {
    pub(crate) fn new(cidr: Ipv6Net) -> Ipv6Pool {
        Ipv6Pool {
            cidr: cidr.trunc(),
            addresses: BTreeSet::new(),
            prefixes: BTreeSet::new(),
        }
    }

    pub(crate) fn cidr(&self) -> Ipv6Net {
        self.cidr
    }

    fn prefix_of(&self, addr: u128) -> u128 {
        addr & !((1u128 << 48) - 1)
    }

    fn host_bits(&self) -> u32 {
        128 - u32::from(self.cidr.prefix_len())
    }

    /// Takes `n` unused addresses from the first /80.
    pub(crate) fn take_any(&mut self, n: usize) -> Vec<Ipv6Addr> {
        let base = u128::from(self.cidr.network());
        let mut taken = Vec::with_capacity(n);
        // AWS hands out addresses from low host numbers too; 0 is skipped as the subnet-router
        // anycast address.
        let mut host = 1u128;
        while taken.len() < n {
            let addr = base + host;
            if !self.addresses.contains(&addr) && !self.prefixes.contains(&self.prefix_of(addr)) {
                self.addresses.insert(addr);
                taken.push(Ipv6Addr::from(addr));
            }
            host += 1;
        }
        taken
    }

    /// Takes `n` unused /80s, or nothing when fewer exist.
    pub(crate) fn take_prefixes(&mut self, n: usize) -> Option<Vec<Ipv6Net>> {
        let base = u128::from(self.cidr.network());
        let count = 1u128 << (self.host_bits().saturating_sub(48));
        let mut taken = Vec::with_capacity(n);
        for block in 1..count {
            if taken.len() == n {
                break;
            }
            let prefix = base + (block << 48);
            let end = prefix + (1u128 << 48);
            if !self.prefixes.contains(&prefix)
                && self.addresses.range(prefix..end).next().is_none()
            {
                taken.push(prefix);
            }
        }
        if taken.len() < n {
            return None;
        }
        self.prefixes.extend(taken.iter().copied());
        Some(
            taken
                .into_iter()
                .map(|prefix| Ipv6Net::new(Ipv6Addr::from(prefix), 80).expect("80 is valid"))
                .collect(),
        )
    }

    pub(crate) fn take(&mut self, addr: Ipv6Addr) -> Result<(), Refusal> {
        if !self.cidr.contains(&addr) {
            return Err(Refusal::Outside);
        }
        let addr = u128::from(addr);
        if self.addresses.contains(&addr) || self.prefixes.contains(&self.prefix_of(addr)) {
            return Err(Refusal::InUse);
        }
        self.addresses.insert(addr);
        Ok(())
    }

    pub(crate) fn take_prefix(&mut self, prefix: Ipv6Net) -> Result<(), Refusal> {
        if prefix.prefix_len() != 80 || prefix.trunc() != prefix || !self.cidr.contains(&prefix) {
            return Err(Refusal::Outside);
        }
        let start = u128::from(prefix.network());
        let end = start + (1u128 << 48);
        if self.prefixes.contains(&start) || self.addresses.range(start..end).next().is_some() {
            return Err(Refusal::InUse);
        }
        self.prefixes.insert(start);
        Ok(())
    }

    pub(crate) fn release(&mut self, addr: Ipv6Addr) {
        self.addresses.remove(&u128::from(addr));
    }

    pub(crate) fn release_prefix(&mut self, prefix: Ipv6Net) {
        self.prefixes.remove(&u128::from(prefix.network()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn reserves_aws_addresses_and_hands_out_the_lowest() {
        let mut pool = Ipv4Pool::new(net("10.0.0.0/24"));
        assert_eq!(pool.free(), 251);
        assert_eq!(
            pool.take_any(2).unwrap(),
            vec![Ipv4Addr::new(10, 0, 0, 4), Ipv4Addr::new(10, 0, 0, 5)]
        );
        assert_eq!(
            pool.take(Ipv4Addr::new(10, 0, 0, 255)),
            Err(Refusal::Outside)
        );
        assert_eq!(pool.take(Ipv4Addr::new(10, 0, 0, 5)), Err(Refusal::InUse));
        // The first /28 holds reserved addresses: the first free one is 10.0.0.16/28.
        assert_eq!(pool.take_prefixes(1).unwrap(), vec![net("10.0.0.16/28")]);
        assert_eq!(pool.free(), 251 - 2 - 16);
        pool.release_prefix(net("10.0.0.16/28"));
        assert_eq!(pool.free(), 251 - 2);
    }

    #[test]
    fn a_full_pool_gives_nothing() {
        let mut pool = Ipv4Pool::new(net("10.0.0.0/28"));
        assert_eq!(pool.free(), 11);
        assert!(pool.take_prefixes(1).is_none());
        assert!(pool.take_any(12).is_none());
        assert_eq!(pool.free(), 11);
        assert_eq!(pool.take_any(11).unwrap().len(), 11);
        assert!(pool.take_any(1).is_none());
    }

    #[test]
    fn fragmentation_leaves_no_prefix_but_addresses() {
        let mut pool = Ipv4Pool::new(net("10.0.0.0/24"));
        pool.fragment(1.0, &mut rand_chacha::ChaCha8Rng::seed_from_u64(1));
        assert!(pool.take_prefixes(1).is_none());
        assert_eq!(pool.free(), 251 - 14);
        assert!(pool.take_any(1).is_some());
    }

    #[test]
    fn ipv6_prefixes_avoid_addresses() {
        let mut pool = Ipv6Pool::new("2600:1f18:0:1::/64".parse().unwrap());
        let addresses = pool.take_any(2);
        assert_eq!(
            addresses[0],
            "2600:1f18:0:1::1".parse::<Ipv6Addr>().unwrap()
        );
        let prefixes = pool.take_prefixes(2).unwrap();
        assert_eq!(
            prefixes[0],
            "2600:1f18:0:1:1::/80".parse::<Ipv6Net>().unwrap()
        );
        assert_eq!(pool.take_prefix(prefixes[0]), Err(Refusal::InUse));
        assert_eq!(
            pool.take("2600:1f18:0:1:1::5".parse().unwrap()),
            Err(Refusal::InUse)
        );
    }
}
