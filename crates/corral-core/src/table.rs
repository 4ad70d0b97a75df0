//! The allocation table: every allocation once, found by address or by attachment key.
//!
//! Memory and speed both matter here (targets: at most 64 bytes per allocation beyond its
//! strings, and allocation in well under 100 ns), so:
//! - records are 32 bytes, dense in one `Vec`;
//! - the owner and key strings of all records live in one byte arena, each record holding a
//!   4-byte offset; appending is a `memcpy`, and the arena is compacted once more than half of
//!   it belongs to released records (amortised O(1) per release);
//! - two `hashbrown::HashTable<u32>` index the records by address and by key (about 5 bytes
//!   per slot each), hashing and comparing raw bytes;
//! - removal leaves a hole that the next insertion fills (a free list), so no other record
//!   moves and no index entry has to be repointed.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::addr::{AddrKey, Family};
use crate::spec::AttachmentKey;

/// Index of a pool in the engine's pool list.
pub(crate) type PoolId = u32;

const FAMILY_V6_BIT: u32 = 1 << 31;
/// Arena offsets count 4-byte units, so a `u32` reaches 16 GiB of strings.
const ARENA_UNIT: usize = 4;
/// owner length (u16 LE), network length (u8), container ID length (u16 LE), ifname length (u8).
const TEXT_HEADER: usize = 6;
/// Below this size the arena is never compacted: the copy would cost more than it frees.
const COMPACT_MIN_BYTES: usize = 64 * 1024;
/// `pool_and_family` of a free slot; pool ids stay below 2^31.
const FREE_SLOT: u32 = u32::MAX;

/// One allocation. 32 bytes: see the module comment before adding a field.
#[derive(Clone, Copy, Debug)]
struct Record {
    value_high: u64,
    value_low: u64,
    generation: u64,
    /// Offset of the record's strings in the arena, in `ARENA_UNIT`s.
    text: u32,
    /// Pool id in the low 31 bits; the top bit is set for IPv6.
    pool_and_family: u32,
}

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

    fn is_live(&self) -> bool {
        self.pool_and_family != FREE_SLOT
    }
}

/// The four strings of a record, as raw bytes of the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Text<'a> {
    owner: &'a [u8],
    network: &'a [u8],
    container_id: &'a [u8],
    ifname: &'a [u8],
}

impl<'a> Text<'a> {
    fn read(arena: &'a [u8], unit_offset: u32) -> Text<'a> {
        let at = unit_offset as usize * ARENA_UNIT;
        let header = &arena[at..at + TEXT_HEADER];
        let lengths = [
            usize::from(u16::from_le_bytes([header[0], header[1]])),
            usize::from(header[2]),
            usize::from(u16::from_le_bytes([header[3], header[4]])),
            usize::from(header[5]),
        ];
        let mut offset = at + TEXT_HEADER;
        let mut parts: [&[u8]; 4] = [&[]; 4];
        for (part, length) in parts.iter_mut().zip(lengths) {
            *part = &arena[offset..offset + length];
            offset += length;
        }
        Text {
            owner: parts[0],
            network: parts[1],
            container_id: parts[2],
            ifname: parts[3],
        }
    }

    /// Bytes the entry occupies in the arena, padding included.
    fn stored_len(&self) -> usize {
        entry_len(
            self.owner.len() + self.network.len() + self.container_id.len() + self.ifname.len(),
        )
    }

    fn key_parts(&self) -> Option<KeyBytes<'a>> {
        (!self.network.is_empty()).then_some((self.network, self.container_id, self.ifname))
    }
}

/// Addresses are hashed keeping their low 4 bits: 16 consecutive addresses (what next-fit
/// hands out) land in neighbouring slots, so a filling range touches a new cache line of the
/// index only every 16 allocations, and an allocation followed by its release touches one
/// (at 1M allocations this halves the time of an allocate + release). The rest of the
/// address goes through the seeded hasher, so the runs of 16 are scattered unpredictably (no
/// clustering an input could provoke) and the tag bits hashbrown compares first stay random.
fn addr_hash(hasher: &foldhash::fast::RandomState, addr: AddrKey) -> u64 {
    let run = hasher.hash_one((addr.family, addr.value >> 4));
    (run & !0xf) | (addr.value & 0xf) as u64
}

/// Makes room for `additional` more elements, growing by a quarter instead of doubling: the
/// table's memory per allocation then never carries more than ~25% of slack, and large
/// reallocations are cheap anyway (glibc moves mmapped blocks with `mremap`, without copying).
fn grow_gently<T>(vec: &mut Vec<T>, additional: usize) {
    if vec.len() + additional > vec.capacity() {
        let step = (vec.capacity() / 4).max(1024).max(additional);
        vec.reserve_exact(step);
    }
}

fn family_bit(family: Family) -> u32 {
    match family {
        Family::V4 => 0,
        Family::V6 => FAMILY_V6_BIT,
    }
}

fn entry_len(strings: usize) -> usize {
    (TEXT_HEADER + strings).div_ceil(ARENA_UNIT) * ARENA_UNIT
}

type KeyBytes<'a> = (&'a [u8], &'a [u8], &'a [u8]);

fn key_bytes(key: &AttachmentKey) -> KeyBytes<'_> {
    (
        key.network().as_bytes(),
        key.container_id().as_bytes(),
        key.ifname().as_bytes(),
    )
}

fn text_str(bytes: &[u8]) -> &str {
    // The arena only ever receives whole `&str`s, so this never fails; an empty string is the
    // harmless fallback rather than a panic.
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// A read-only view of one allocation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordView<'a> {
    record: &'a Record,
    arena: &'a [u8],
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
    fn text(&self) -> Text<'a> {
        Text::read(self.arena, self.record.text)
    }
    pub fn owner(&self) -> &'a str {
        text_str(self.text().owner)
    }
    pub fn owner_is(&self, owner: &str) -> bool {
        self.text().owner == owner.as_bytes()
    }
    pub fn key(&self) -> Option<AttachmentKey> {
        self.text()
            .key_parts()
            .map(|(n, c, i)| AttachmentKey::from_validated(text_str(n), text_str(c), text_str(i)))
    }
    pub fn key_network_is(&self, network: &str) -> bool {
        let text = self.text();
        !text.network.is_empty() && text.network == network.as_bytes()
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
    /// Records and free slots (see `FREE_SLOT`).
    records: Vec<Record>,
    free_slots: Vec<u32>,
    arena: Vec<u8>,
    /// Arena bytes that belong to released records.
    dead_bytes: usize,
    /// Holes left by released records (length and offset in units), latest last.
    text_holes: Vec<(u32, u32)>,
    by_addr: HashTable<u32>,
    by_key: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
}

impl AllocationTable {
    pub fn len(&self) -> usize {
        self.records.len() - self.free_slots.len()
    }

    fn view(&self, index: u32) -> RecordView<'_> {
        RecordView {
            record: &self.records[index as usize],
            arena: &self.arena,
        }
    }

    pub fn get(&self, index: u32) -> RecordView<'_> {
        self.view(index)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, RecordView<'_>)> {
        self.records
            .iter()
            .enumerate()
            .filter(|(_, record)| record.is_live())
            .map(|(i, record)| {
                (
                    i as u32,
                    RecordView {
                        record,
                        arena: &self.arena,
                    },
                )
            })
    }

    fn addr_hash(&self, addr: AddrKey) -> u64 {
        addr_hash(&self.hasher, addr)
    }

    /// The hash of an attachment key, to pass to [`AllocationTable::find_key`] and
    /// [`AllocationTable::insert`] so a key is hashed once per request.
    pub fn key_hash(&self, key: &AttachmentKey) -> u64 {
        self.hasher.hash_one(key_bytes(key))
    }

    pub fn find_addr(&self, addr: AddrKey) -> Option<u32> {
        let hash = self.addr_hash(addr);
        self.by_addr
            .find(hash, |&i| self.records[i as usize].addr() == addr)
            .copied()
    }

    /// Every allocation of an attachment (one per pool and family at most).
    pub fn find_key<'a>(
        &'a self,
        key: &'a AttachmentKey,
        hash: u64,
    ) -> impl Iterator<Item = u32> + 'a {
        let wanted = key_bytes(key);
        self.by_key.iter_hash(hash).copied().filter(move |&i| {
            Text::read(&self.arena, self.records[i as usize].text).key_parts() == Some(wanted)
        })
    }

    /// Whether `n_records` more records with `strings` bytes of strings each fit.
    pub fn has_room(&self, n_records: usize, strings: usize) -> bool {
        let arena_units = (self.arena.len() + n_records * entry_len(strings)) / ARENA_UNIT;
        self.len() + n_records < u32::MAX as usize && arena_units <= u32::MAX as usize
    }

    /// Adds an allocation; the caller has checked that the address is free and, with
    /// [`AllocationTable::has_room`], that it fits. `key_hash` is
    /// [`AllocationTable::key_hash`] of `new.key`.
    pub fn insert(&mut self, new: NewRecord<'_>, key_hash: Option<u64>) -> u32 {
        let (network, container_id, ifname) = match new.key {
            Some(key) => key_bytes(key),
            None => (&[][..], &[][..], &[][..]),
        };
        let owner = new.owner.as_bytes();
        let strings = owner.len() + network.len() + container_id.len() + ifname.len();
        let length = entry_len(strings);
        let unit_offset = self.place_text(length);
        let at = unit_offset as usize * ARENA_UNIT;
        // Lengths were bounded by validation (owner and container ID ≤ 1024, network ≤ 253,
        // ifname ≤ 15), so these conversions cannot truncate.
        let mut header = [0u8; TEXT_HEADER];
        header[..2].copy_from_slice(&(owner.len() as u16).to_le_bytes());
        header[2] = network.len() as u8;
        header[3..5].copy_from_slice(&(container_id.len() as u16).to_le_bytes());
        header[5] = ifname.len() as u8;
        let entry = &mut self.arena[at..at + length];
        let mut offset = 0;
        for part in [&header[..], owner, network, container_id, ifname] {
            entry[offset..offset + part.len()].copy_from_slice(part);
            offset += part.len();
        }
        let record = Record {
            value_high: (new.addr.value >> 64) as u64,
            value_low: new.addr.value as u64,
            generation: new.generation,
            text: unit_offset,
            pool_and_family: new.pool | family_bit(new.addr.family),
        };
        let index = match self.free_slots.pop() {
            Some(slot) => {
                self.records[slot as usize] = record;
                slot
            }
            None => {
                grow_gently(&mut self.records, 1);
                self.records.push(record);
                (self.records.len() - 1) as u32
            }
        };
        let Self {
            records,
            arena,
            by_addr,
            by_key,
            hasher,
            ..
        } = self;
        by_addr.insert_unique(addr_hash(hasher, new.addr), index, |&i| {
            addr_hash(hasher, records[i as usize].addr())
        });
        if let Some(key) = new.key {
            let hash = key_hash.unwrap_or_else(|| hasher.hash_one(key_bytes(key)));
            by_key.insert_unique(hash, index, |&i| {
                let text = Text::read(arena, records[i as usize].text);
                text.key_parts().map_or(0, |parts| hasher.hash_one(parts))
            });
        }
        index
    }

    /// Removes an allocation and returns its address, pool and generation.
    /// `key_hash`, when the caller knows it, is [`AllocationTable::key_hash`] of the record's
    /// key, which then is not computed again.
    pub fn remove(&mut self, index: u32, key_hash: Option<u64>) -> (AddrKey, PoolId, u64) {
        let record = self.records[index as usize];
        let text = Text::read(&self.arena, record.text);
        let hash = self.addr_hash(record.addr());
        if let Ok(entry) = self.by_addr.find_entry(hash, |&i| i == index) {
            entry.remove();
        }
        if let Some(parts) = text.key_parts() {
            let hash = key_hash.unwrap_or_else(|| self.hasher.hash_one(parts));
            if let Ok(entry) = self.by_key.find_entry(hash, |&i| i == index) {
                entry.remove();
            }
        }
        let stored = text.stored_len();
        self.dead_bytes += stored;
        self.text_holes
            .push(((stored / ARENA_UNIT) as u32, record.text));
        self.records[index as usize].pool_and_family = FREE_SLOT;
        self.free_slots.push(index);
        if self.dead_bytes * 2 > self.arena.len() && self.arena.len() > COMPACT_MIN_BYTES {
            self.compact();
        }
        (record.addr(), record.pool(), record.generation)
    }

    /// Finds room for an entry of `length` bytes: the hole the last release left if it has
    /// exactly that size (the usual case, since keys and owners have regular shapes), else
    /// the end of the arena. Returns the offset in units.
    fn place_text(&mut self, length: usize) -> u32 {
        let units = (length / ARENA_UNIT) as u32;
        if let Some(&(hole_units, hole)) = self.text_holes.last()
            && hole_units == units
        {
            self.text_holes.pop();
            self.dead_bytes -= length;
            return hole;
        }
        let at = self.arena.len();
        grow_gently(&mut self.arena, length);
        self.arena.resize(at + length, 0);
        (at / ARENA_UNIT) as u32
    }

    /// Copies the live entries into a fresh arena, dropping released ones.
    fn compact(&mut self) {
        let mut arena = Vec::with_capacity(self.arena.len() - self.dead_bytes);
        for record in self.records.iter_mut().filter(|r| r.is_live()) {
            let at = record.text as usize * ARENA_UNIT;
            let length = Text::read(&self.arena, record.text).stored_len();
            // The new arena is smaller than the old one, so the offset still fits.
            record.text = (arena.len() / ARENA_UNIT) as u32;
            arena.extend_from_slice(&self.arena[at..at + length]);
        }
        self.arena = arena;
        self.dead_bytes = 0;
        self.text_holes.clear();
    }

    /// Heap bytes held by the table's own structures (records, index slots, arena slack).
    pub fn index_bytes(&self) -> usize {
        self.records.capacity() * size_of::<Record>()
            + self.free_slots.capacity() * size_of::<u32>()
            + self.text_holes.capacity() * size_of::<(u32, u32)>()
            + (self.by_addr.capacity() + self.by_key.capacity()) * (size_of::<u32>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_thirty_two_bytes() {
        assert_eq!(size_of::<Record>(), 32);
    }

    fn addr(i: usize) -> AddrKey {
        AddrKey {
            family: if i.is_multiple_of(2) {
                Family::V4
            } else {
                Family::V6
            },
            value: i as u128 * 7,
        }
    }

    #[test]
    fn swap_removal_and_compaction_keep_both_indexes_pointing_right() {
        let mut table = AllocationTable::default();
        let n = 3000;
        let keys: Vec<AttachmentKey> = (0..n)
            .map(|i| AttachmentKey::new("net", &format!("container-{i:060}"), "eth0").unwrap())
            .collect();
        for (i, key) in keys.iter().enumerate() {
            let hash = table.key_hash(key);
            table.insert(
                NewRecord {
                    addr: addr(i),
                    pool: 3,
                    generation: i as u64,
                    owner: &format!("owner-{i}"),
                    key: (i % 5 != 0).then_some(key),
                },
                Some(hash),
            );
        }
        let arena_before = table.arena.len();
        // Remove two thirds, which forces at least one compaction.
        for i in (0..n).filter(|i| i % 3 != 0) {
            let index = table.find_addr(addr(i)).unwrap();
            let (removed, pool, generation) = table.remove(index, None);
            assert_eq!((removed, pool, generation), (addr(i), 3, i as u64));
        }
        assert!(
            table.arena.len() < arena_before / 2,
            "arena was not compacted"
        );
        for (i, key) in keys.iter().enumerate() {
            let by_key: Vec<u32> = table.find_key(key, table.key_hash(key)).collect();
            if i % 3 != 0 {
                assert!(table.find_addr(addr(i)).is_none());
                assert!(by_key.is_empty());
                continue;
            }
            let index = table.find_addr(addr(i)).unwrap();
            let view = table.get(index);
            assert_eq!(view.generation(), i as u64);
            assert_eq!(view.owner(), format!("owner-{i}"));
            assert!(view.owner_is(&format!("owner-{i}")));
            assert_eq!(view.pool(), 3);
            assert_eq!(view.addr(), addr(i));
            if i % 5 == 0 {
                assert!(by_key.is_empty());
                assert_eq!(view.key(), None);
            } else {
                assert_eq!(by_key, vec![index]);
                assert_eq!(view.key().as_ref(), Some(key));
            }
        }
    }
}
