//! The allocation table: every allocation once, found by address or by attachment key.
//!
//! Memory matters here (the target is at most 64 bytes per allocation beyond its strings), so
//! records live densely in one `Vec` (40 bytes each) and two hash tables of `u32` indices point
//! into it (about 5 bytes per slot each). The owner and the key's three strings share one heap
//! buffer behind an 8-byte handle. Removal swaps the last record into the hole and repoints its
//! two index entries, so the vector never has gaps.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use thin_vec::ThinVec;

use crate::addr::{AddrKey, Family};
use crate::spec::AttachmentKey;

/// Index of a pool in the engine's pool list.
pub(crate) type PoolId = u32;

const FAMILY_V6_BIT: u32 = 1 << 31;

/// One allocation. 40 bytes: see the module comment before adding a field.
#[derive(Debug)]
struct Record {
    value_high: u64,
    value_low: u64,
    generation: u64,
    /// owner length (u16 LE), network length (u8), container ID length (u16 LE), ifname length
    /// (u8), then the four strings. A zero network length means the allocation has no key.
    text: ThinVec<u8>,
    /// Pool id in the low 31 bits; the top bit is set for IPv6.
    pool_and_family: u32,
}

const TEXT_HEADER: usize = 6;

impl Record {
    fn addr(&self) -> AddrKey {
        let family = if self.pool_and_family & FAMILY_V6_BIT != 0 {
            Family::V6
        } else {
            Family::V4
        };
        AddrKey {
            family,
            value: (u128::from(self.value_high) << 64) | u128::from(self.value_low),
        }
    }

    fn pool(&self) -> PoolId {
        self.pool_and_family & !FAMILY_V6_BIT
    }

    fn lengths(&self) -> [usize; 4] {
        let t = &self.text;
        [
            usize::from(u16::from_le_bytes([t[0], t[1]])),
            usize::from(t[2]),
            usize::from(u16::from_le_bytes([t[3], t[4]])),
            usize::from(t[5]),
        ]
    }

    fn strings(&self) -> [&str; 4] {
        let lengths = self.lengths();
        let mut offset = TEXT_HEADER;
        let mut out = [""; 4];
        for (slot, length) in out.iter_mut().zip(lengths) {
            // The buffer was built from `&str`s at these offsets, so this never fails; an
            // empty string is the harmless fallback rather than a panic.
            *slot = std::str::from_utf8(&self.text[offset..offset + length]).unwrap_or_default();
            offset += length;
        }
        out
    }

    fn key_parts(&self) -> Option<[&str; 3]> {
        let [_, network, container_id, ifname] = self.strings();
        (!network.is_empty()).then_some([network, container_id, ifname])
    }
}

/// A read-only view of one allocation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordView<'a> {
    record: &'a Record,
}

impl<'a> RecordView<'a> {
    pub fn addr(&self) -> AddrKey {
        self.record.addr()
    }
    pub fn pool(&self) -> PoolId {
        self.record.pool()
    }
    pub fn generation(&self) -> u64 {
        self.record.generation
    }
    pub fn owner(&self) -> &'a str {
        self.record.strings()[0]
    }
    pub fn key(&self) -> Option<AttachmentKey> {
        self.record
            .key_parts()
            .map(|[n, c, i]| AttachmentKey::from_validated(n, c, i))
    }
}

/// What a new allocation records.
#[derive(Debug)]
pub(crate) struct NewRecord<'a> {
    pub addr: AddrKey,
    pub pool: PoolId,
    pub generation: u64,
    pub owner: &'a str,
    pub key: Option<&'a AttachmentKey>,
}

#[derive(Debug, Default)]
pub(crate) struct AllocationTable {
    records: Vec<Record>,
    by_addr: HashTable<u32>,
    by_key: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
}

fn key_hash(hasher: &foldhash::fast::RandomState, parts: [&str; 3]) -> u64 {
    hasher.hash_one(parts)
}

fn addr_hash(hasher: &foldhash::fast::RandomState, addr: AddrKey) -> u64 {
    hasher.hash_one(addr)
}

impl AllocationTable {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn get(&self, index: u32) -> RecordView<'_> {
        RecordView {
            record: &self.records[index as usize],
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, RecordView<'_>)> {
        self.records
            .iter()
            .enumerate()
            .map(|(i, record)| (i as u32, RecordView { record }))
    }

    pub fn find_addr(&self, addr: AddrKey) -> Option<u32> {
        let hash = addr_hash(&self.hasher, addr);
        self.by_addr
            .find(hash, |&i| self.records[i as usize].addr() == addr)
            .copied()
    }

    /// Every allocation of an attachment (one per pool and family at most).
    pub fn find_key<'a>(&'a self, key: &'a AttachmentKey) -> impl Iterator<Item = u32> + 'a {
        let parts = [key.network(), key.container_id(), key.ifname()];
        let hash = key_hash(&self.hasher, parts);
        self.by_key
            .iter_hash(hash)
            .copied()
            .filter(move |&i| self.records[i as usize].key_parts() == Some(parts))
    }

    /// Adds an allocation; the caller has checked that the address is free.
    pub fn insert(&mut self, new: NewRecord<'_>) -> u32 {
        let index = u32::try_from(self.records.len()).expect("fewer than 2^32 allocations");
        let (network, container_id, ifname) = match new.key {
            Some(key) => (key.network(), key.container_id(), key.ifname()),
            None => ("", "", ""),
        };
        let mut text = ThinVec::with_capacity(
            TEXT_HEADER + new.owner.len() + network.len() + container_id.len() + ifname.len(),
        );
        // Lengths were bounded by validation (owner and container ID ≤ 1024, network ≤ 253,
        // ifname ≤ 15), so these conversions cannot truncate.
        text.extend_from_slice(&(new.owner.len() as u16).to_le_bytes());
        text.push(network.len() as u8);
        text.extend_from_slice(&(container_id.len() as u16).to_le_bytes());
        text.push(ifname.len() as u8);
        for part in [new.owner, network, container_id, ifname] {
            text.extend_from_slice(part.as_bytes());
        }
        let family_bit = match new.addr.family {
            Family::V4 => 0,
            Family::V6 => FAMILY_V6_BIT,
        };
        self.records.push(Record {
            value_high: (new.addr.value >> 64) as u64,
            value_low: new.addr.value as u64,
            generation: new.generation,
            text,
            pool_and_family: new.pool | family_bit,
        });
        let Self {
            records,
            by_addr,
            by_key,
            hasher,
        } = self;
        by_addr.insert_unique(addr_hash(hasher, new.addr), index, |&i| {
            addr_hash(hasher, records[i as usize].addr())
        });
        if let Some(key) = new.key {
            let parts = [key.network(), key.container_id(), key.ifname()];
            by_key.insert_unique(key_hash(hasher, parts), index, |&i| {
                records[i as usize]
                    .key_parts()
                    .map_or(0, |p| key_hash(hasher, p))
            });
        }
        index
    }

    /// Removes an allocation and returns what it held.
    pub fn remove(&mut self, index: u32) -> RemovedRecord {
        let last = self.records.len() as u32 - 1;
        self.unindex(index);
        if index != last {
            self.repoint(last, index);
        }
        let record = self.records.swap_remove(index as usize);
        let [owner, ..] = record.strings();
        RemovedRecord {
            addr: record.addr(),
            pool: record.pool(),
            generation: record.generation,
            owner: owner.to_owned(),
            key: record
                .key_parts()
                .map(|[n, c, i]| AttachmentKey::from_validated(n, c, i)),
        }
    }

    fn unindex(&mut self, index: u32) {
        let record = &self.records[index as usize];
        let hash = addr_hash(&self.hasher, record.addr());
        if let Ok(entry) = self.by_addr.find_entry(hash, |&i| i == index) {
            entry.remove();
        }
        if let Some(parts) = record.key_parts() {
            let hash = key_hash(&self.hasher, parts);
            if let Ok(entry) = self.by_key.find_entry(hash, |&i| i == index) {
                entry.remove();
            }
        }
    }

    /// Makes the index entries that point at `from` point at `to`.
    fn repoint(&mut self, from: u32, to: u32) {
        let record = &self.records[from as usize];
        let hash = addr_hash(&self.hasher, record.addr());
        if let Some(slot) = self.by_addr.find_mut(hash, |&i| i == from) {
            *slot = to;
        }
        if let Some(parts) = record.key_parts() {
            let hash = key_hash(&self.hasher, parts);
            if let Some(slot) = self.by_key.find_mut(hash, |&i| i == from) {
                *slot = to;
            }
        }
    }

    /// Heap bytes held by the table's own structures (not counting the string buffers).
    pub fn index_bytes(&self) -> usize {
        self.records.capacity() * size_of::<Record>()
            + (self.by_addr.capacity() + self.by_key.capacity()) * (size_of::<u32>() + 1)
    }
}

/// An allocation taken out of the table.
#[derive(Debug)]
pub(crate) struct RemovedRecord {
    pub addr: AddrKey,
    pub pool: PoolId,
    pub generation: u64,
    pub owner: String,
    pub key: Option<AttachmentKey>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_forty_bytes() {
        assert_eq!(size_of::<Record>(), 40);
    }

    #[test]
    fn swap_removal_keeps_both_indexes_pointing_right() {
        let mut table = AllocationTable::default();
        let keys: Vec<AttachmentKey> = (0..50)
            .map(|i| AttachmentKey::new("net", &format!("c{i}"), "eth0").unwrap())
            .collect();
        for (i, key) in keys.iter().enumerate() {
            table.insert(NewRecord {
                addr: AddrKey {
                    family: if i % 2 == 0 { Family::V4 } else { Family::V6 },
                    value: i as u128 * 7,
                },
                pool: 3,
                generation: i as u64,
                owner: &format!("owner-{i}"),
                key: Some(key),
            });
        }
        for i in (0..50).step_by(3) {
            let addr = AddrKey {
                family: if i % 2 == 0 { Family::V4 } else { Family::V6 },
                value: i as u128 * 7,
            };
            let index = table.find_addr(addr).unwrap();
            let removed = table.remove(index);
            assert_eq!(removed.generation, i as u64);
            assert_eq!(removed.owner, format!("owner-{i}"));
            assert_eq!(removed.key.as_ref(), Some(&keys[i]));
        }
        for (i, key) in keys.iter().enumerate() {
            let addr = AddrKey {
                family: if i % 2 == 0 { Family::V4 } else { Family::V6 },
                value: i as u128 * 7,
            };
            let by_key: Vec<u32> = table.find_key(key).collect();
            if i % 3 == 0 {
                assert!(table.find_addr(addr).is_none());
                assert!(by_key.is_empty());
            } else {
                let index = table.find_addr(addr).unwrap();
                assert_eq!(by_key, vec![index]);
                let view = table.get(index);
                assert_eq!(view.generation(), i as u64);
                assert_eq!(view.owner(), format!("owner-{i}"));
                assert_eq!(view.key().as_ref(), Some(key));
                assert_eq!(view.pool(), 3);
                assert_eq!(view.addr(), addr);
            }
        }
    }
}
