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

/// What the model takes from a subnet's space of one family, whichever the family: any free
/// addresses or prefixes (IPv4 /28s, IPv6 /80s), or given ones.
pub(crate) trait FamilyPool {
    type Addr: Copy + Ord + std::fmt::Display;
    type Net: Copy + Ord + std::fmt::Display;
    fn take_any(&mut self, n: usize) -> Option<Vec<Self::Addr>>;
    fn take(&mut self, addr: Self::Addr) -> Result<(), Refusal>;
    fn take_prefixes(&mut self, n: usize) -> Option<Vec<Self::Net>>;
    fn take_prefix(&mut self, prefix: Self::Net) -> Result<(), Refusal>;
}

/// Each family's pool by its own methods.
macro_rules! family_pool {
    ($pool:ty, $addr:ty, $net:ty) => {
        impl FamilyPool for $pool {
            type Addr = $addr;
            type Net = $net;
            fn take_any(&mut self, n: usize) -> Option<Vec<$addr>> {
                <$pool>::take_any(self, n)
            }
            fn take(&mut self, addr: $addr) -> Result<(), Refusal> {
                <$pool>::take(self, addr)
            }
            fn take_prefixes(&mut self, n: usize) -> Option<Vec<$net>> {
                <$pool>::take_prefixes(self, n)
            }
            fn take_prefix(&mut self, prefix: $net) -> Result<(), Refusal> {
                <$pool>::take_prefix(self, prefix)
            }
        }
    };
}

family_pool!(Ipv4Pool, Ipv4Addr, Ipv4Net);
family_pool!(Ipv6Pool, Ipv6Addr, Ipv6Net);

/// The IPv4 space of a subnet.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
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

    /// Takes the `n` lowest free addresses, or nothing when fewer are free. Walks the bitmap a
    /// word at a time and the free bits of a word by their position: O(words + n).
    pub(crate) fn take_any(&mut self, n: usize) -> Option<Vec<Ipv4Addr>> {
        if (self.free as usize) < n {
            return None;
        }
        let mut taken = Vec::with_capacity(n);
        for word in 0..self.used.len() {
            let mut free = !self.used[word];
            while free != 0 && taken.len() < n {
                let offset = word as u32 * 64 + free.trailing_zeros();
                if offset >= self.size {
                    break;
                }
                self.mark(offset);
                taken.push(self.addr(offset));
                free &= free - 1;
            }
            if taken.len() == n {
                break;
            }
        }
        debug_assert_eq!(taken.len(), n, "the free count promised enough");
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

/// Host bits of an IPv6 /80 prefix.
const PREFIX6_BITS: u32 = 48;

/// The IPv6 space of a subnet's /64, in /80 blocks: block 0 (the first /80) is where addresses
/// given by count come from, and is never delegated; the other blocks are delegated as /80
/// prefixes while no address lies in them. Explicit addresses may lie anywhere outside a
/// delegated prefix; host 0 (the subnet-router anycast address) is never handed out.
///
/// Only what is in use is stored, and every search walks the stored entries, not the space: a
/// call costs O(n + entries in use), whatever the size of the /64.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Ipv6Pool {
    cidr: Ipv6Net,
    addresses: BTreeSet<u128>,
    prefixes: BTreeSet<u128>,
}

impl Ipv6Pool {
    /// The space of `cidr`, a /64 (any length up to /80 works: a /80 subnet is all block 0).
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

    fn base(&self) -> u128 {
        u128::from(self.cidr.network())
    }

    /// The last address of the subnet.
    fn last(&self) -> u128 {
        self.base()
            | u128::MAX
                .checked_shr(self.cidr.prefix_len().into())
                .unwrap_or(0)
    }

    /// Addresses in one block: a /80, or the whole subnet when it is smaller.
    fn block_size(&self) -> u128 {
        let host_bits = 128 - u32::from(self.cidr.prefix_len());
        1u128 << PREFIX6_BITS.min(host_bits)
    }

    fn prefix_of(&self, addr: u128) -> u128 {
        addr & !((1u128 << PREFIX6_BITS) - 1)
    }

    /// Takes the `n` lowest unused addresses of block 0 (host 0 excluded), or nothing when
    /// fewer are free there.
    pub(crate) fn take_any(&mut self, n: usize) -> Option<Vec<Ipv6Addr>> {
        let first = self.base().saturating_add(1);
        // Exclusive; block 0 is never delegated, so only addresses can be in the way.
        let end = self.base().saturating_add(self.block_size());
        let mut taken = Vec::with_capacity(n.min(1024));
        let mut next = first;
        for &used in self.addresses.range(first..end) {
            while next < used && taken.len() < n {
                taken.push(next);
                next += 1;
            }
            if taken.len() == n {
                break;
            }
            next = used + 1;
        }
        while taken.len() < n && next < end {
            taken.push(next);
            next += 1;
        }
        if taken.len() < n {
            return None;
        }
        self.addresses.extend(taken.iter().copied());
        Some(taken.into_iter().map(Ipv6Addr::from).collect())
    }

    /// Takes the `n` lowest unused /80s after block 0, or nothing when fewer exist. Each block
    /// looked at is either taken or holds a stored entry, so the search is bounded by `n` and
    /// the entries in use.
    pub(crate) fn take_prefixes(&mut self, n: usize) -> Option<Vec<Ipv6Net>> {
        let size = self.block_size();
        if size < 1u128 << PREFIX6_BITS {
            // Smaller than a /80: nothing to delegate.
            return (n == 0).then(Vec::new);
        }
        let last = self.last();
        let mut taken = Vec::with_capacity(n.min(1024));
        let Some(mut prefix) = self.base().checked_add(size) else {
            return (n == 0).then(Vec::new);
        };
        while taken.len() < n && prefix <= last {
            let end = prefix + (size - 1);
            if !self.prefixes.contains(&prefix)
                && self.addresses.range(prefix..=end).next().is_none()
            {
                taken.push(prefix);
            }
            match end.checked_add(1) {
                Some(next) => prefix = next,
                None => break,
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

    /// Takes one given address: inside the subnet, not host 0, not in use, not inside a
    /// delegated prefix.
    pub(crate) fn take(&mut self, addr: Ipv6Addr) -> Result<(), Refusal> {
        if !self.cidr.contains(&addr) {
            return Err(Refusal::Outside);
        }
        let addr = u128::from(addr);
        if addr == self.base() {
            return Err(Refusal::Outside);
        }
        if self.addresses.contains(&addr) || self.prefixes.contains(&self.prefix_of(addr)) {
            return Err(Refusal::InUse);
        }
        self.addresses.insert(addr);
        Ok(())
    }

    /// Takes one given /80: aligned, inside the subnet, not block 0 (where addresses by count
    /// come from: EC2 refuses it too), with no address in it.
    pub(crate) fn take_prefix(&mut self, prefix: Ipv6Net) -> Result<(), Refusal> {
        if prefix.prefix_len() != 80
            || prefix.trunc() != prefix
            || !self.cidr.contains(&prefix)
            || self.block_size() < 1u128 << PREFIX6_BITS
        {
            return Err(Refusal::Outside);
        }
        let start = u128::from(prefix.network());
        if start == self.base() {
            return Err(Refusal::Outside);
        }
        let end = start + ((1u128 << PREFIX6_BITS) - 1);
        if self.prefixes.contains(&start) || self.addresses.range(start..=end).next().is_some() {
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
        let addresses = pool.take_any(2).unwrap();
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

    fn net6(s: &str) -> Ipv6Net {
        s.parse().unwrap()
    }

    /// Regression: delegating the first /80 let `take_any` step through its 2^48 addresses one
    /// at a time, holding the account's lock forever.
    #[test]
    fn the_first_80_is_never_delegated() {
        let mut pool = Ipv6Pool::new(net6("2600:1f18:0:1::/64"));
        assert_eq!(
            pool.take_prefix(net6("2600:1f18:0:1::/80")),
            Err(Refusal::Outside)
        );
        assert_eq!(
            pool.take_any(1).unwrap(),
            vec!["2600:1f18:0:1::1".parse::<Ipv6Addr>().unwrap()]
        );
        assert_eq!(pool.take_prefix(net6("2600:1f18:0:1:2::/80")), Ok(()));
        assert_eq!(
            pool.take_prefixes(2).unwrap(),
            vec![net6("2600:1f18:0:1:1::/80"), net6("2600:1f18:0:1:3::/80")]
        );
    }

    #[test]
    fn ipv6_addresses_by_count_skip_used_ones_and_stop_at_the_end_of_block_0() {
        // A subnet smaller than a /80 is all block 0: 255 hosts (host 0 is never handed out).
        let mut pool = Ipv6Pool::new(net6("2600:1f18::/120"));
        pool.take("2600:1f18::3".parse().unwrap()).unwrap();
        assert_eq!(
            pool.take("2600:1f18::".parse().unwrap()),
            Err(Refusal::Outside),
            "host 0 is the subnet-router anycast address"
        );
        let first = pool.take_any(3).unwrap();
        assert_eq!(
            first,
            ["2600:1f18::1", "2600:1f18::2", "2600:1f18::4"]
                .map(|a| a.parse::<Ipv6Addr>().unwrap())
        );
        assert!(pool.take_any(252).is_none(), "251 are left");
        assert_eq!(pool.take_any(251).unwrap().len(), 251);
        assert!(pool.take_any(1).is_none());
        assert!(pool.take_prefixes(1).is_none(), "nothing to delegate");
        assert_eq!(pool.take_prefixes(0), Some(Vec::new()));
        pool.release("2600:1f18::80".parse().unwrap());
        assert_eq!(
            pool.take_any(1).unwrap(),
            vec!["2600:1f18::80".parse::<Ipv6Addr>().unwrap()]
        );
    }

    #[test]
    fn ipv6_prefixes_skip_blocks_holding_an_address_and_run_out_at_the_end() {
        // A /78 holds four /80s: block 0 (addresses) and three to delegate.
        let mut pool = Ipv6Pool::new(net6("2600:1f18::/78"));
        pool.take("2600:1f18:0:0:1::9".parse().unwrap()).unwrap();
        assert_eq!(
            pool.take_prefix(net6("2600:1f18:0:0:1::/80")),
            Err(Refusal::InUse)
        );
        assert!(pool.take_prefixes(3).is_none(), "only two are free");
        assert_eq!(
            pool.take_prefixes(2).unwrap(),
            vec![net6("2600:1f18:0:0:2::/80"), net6("2600:1f18:0:0:3::/80")]
        );
        assert!(pool.take_prefixes(1).is_none());
        assert_eq!(
            pool.take_prefix(net6("2600:1f18:0:0:4::/80")),
            Err(Refusal::Outside),
            "outside the subnet"
        );
        assert_eq!(
            pool.take("2600:1f18:0:0:2::1".parse().unwrap()),
            Err(Refusal::InUse),
            "inside a delegated prefix"
        );
    }

    #[test]
    fn ipv4_take_any_skips_used_addresses_word_by_word() {
        let mut pool = Ipv4Pool::new(net("10.0.0.0/16"));
        // Fill the first 200 words except one address in the middle.
        let all = pool.take_any(200 * 64 - 4).unwrap();
        assert_eq!(all.len(), 200 * 64 - 4);
        pool.release(Ipv4Addr::new(10, 0, 20, 7));
        assert_eq!(
            pool.take_any(2).unwrap(),
            vec![Ipv4Addr::new(10, 0, 20, 7), Ipv4Addr::new(10, 0, 50, 0)]
        );
        // The last address is reserved: a /16 has 65536 - 5 usable.
        let rest = pool.free() as usize;
        assert_eq!(rest, 65536 - 5 - 200 * 64 + 4 - 1);
        let last = pool.take_any(rest).unwrap();
        assert_eq!(last.last(), Some(&Ipv4Addr::new(10, 0, 255, 254)));
        assert!(pool.take_any(1).is_none());
    }

    #[test]
    fn a_subnet_at_the_top_of_the_address_space_does_not_overflow() {
        let mut pool = Ipv6Pool::new(net6("ffff:ffff:ffff:ffff::/64"));
        assert_eq!(pool.take_any(2).unwrap().len(), 2);
        let prefixes = pool.take_prefixes(65535).unwrap();
        assert_eq!(
            prefixes.last(),
            Some(&net6("ffff:ffff:ffff:ffff:ffff::/80"))
        );
        assert!(pool.take_prefixes(1).is_none());
        let mut tiny = Ipv6Pool::new(net6("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"));
        assert!(tiny.take_any(1).is_none());
        assert!(tiny.take_prefixes(1).is_none());
    }
}
