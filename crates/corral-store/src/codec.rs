//! Binary encoding of a scope's derived state (pool snapshots), and of the cooldown list
//! schema 1 kept beside it (now rows of their own: decoded only to migrate).
//!
//! A versioned little-endian layout rather than JSON: a /16's occupancy is up to 8 KiB of
//! words, read and written on every CNI call. Bitmap words are written as runs of empty
//! words, runs of full words and literal words, so the usual occupancy (next-fit fills a
//! range from its start) takes a few bytes, and a state row fits one database page instead
//! of three: every commit writes, and every process re-reads, fewer log frames. Decoding
//! never panics; anything malformed is a `Corrupt` error, and callers then rebuild the
//! state from the allocations.

use std::net::IpAddr;

use corral_core::{
    Family, OccupancySnapshot, PoolName, PoolSnapshot, RangeSnapshot, RangeSpec, Timestamp,
};

use crate::StoreError;

const FORMAT: u8 = 1;

/// Occupancy kinds: raw bitmap words (still read), runs of addresses, run-length words.
const KIND_WORDS: u8 = 0;
const KIND_RUNS: u8 = 1;
const KIND_PACKED_WORDS: u8 = 2;

/// Tokens of a packed bitmap: a run of empty words, a run of full words, literal words.
const RUN_EMPTY: u8 = 0;
const RUN_FULL: u8 = 1;
const LITERALS: u8 = 2;

/// The most words a bitmap has (2^20 addresses; larger ranges are runs).
const MAX_WORDS: usize = 1 << 14;

/// Writes bitmap words as [`RUN_EMPTY`] / [`RUN_FULL`] runs and [`LITERALS`].
fn pack_words(w: &mut Writer, words: &[u64]) {
    w.count(words.len());
    let mut i = 0;
    while i < words.len() {
        let word = words[i];
        let run = words[i..].iter().take_while(|&&x| x == word).count();
        if word == 0 || word == u64::MAX {
            w.u8(if word == 0 { RUN_EMPTY } else { RUN_FULL });
            w.count(run);
            i += run;
        } else {
            let literals = words[i..]
                .iter()
                .take_while(|&&x| x != 0 && x != u64::MAX)
                .count();
            w.u8(LITERALS);
            w.count(literals);
            for &literal in &words[i..i + literals] {
                w.u64(literal);
            }
            i += literals;
        }
    }
}

impl Reader<'_> {
    fn packed_words(&mut self) -> Result<Vec<u64>, StoreError> {
        let total = self.u32()? as usize;
        if total > MAX_WORDS {
            return Err(self.corrupt("bitmap larger than any range"));
        }
        let mut words = Vec::with_capacity(total);
        while words.len() < total {
            let token = self.u8()?;
            let n = self.u32()? as usize;
            if n == 0 || n > total - words.len() {
                return Err(self.corrupt("bitmap run out of bounds"));
            }
            match token {
                RUN_EMPTY => words.resize(words.len() + n, 0),
                RUN_FULL => words.resize(words.len() + n, u64::MAX),
                LITERALS => {
                    for _ in 0..n {
                        words.push(self.u64()?);
                    }
                }
                _ => return Err(self.corrupt("unknown bitmap token")),
            }
        }
        Ok(words)
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u128(&mut self, v: u128) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn text(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn count(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader of `bytes`, which must start with the [`FORMAT`] byte; `what` names them in
    /// errors.
    fn formatted(bytes: &'a [u8], what: &'static str) -> Result<Reader<'a>, StoreError> {
        let mut r = Reader { bytes, what };
        if r.u8()? != FORMAT {
            return Err(r.corrupt("unknown format"));
        }
        Ok(r)
    }
    fn corrupt(&self, reason: &str) -> StoreError {
        StoreError::Corrupt {
            what: self.what.to_owned(),
            reason: reason.to_owned(),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.bytes.len() < n {
            return Err(self.corrupt("truncated"));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, StoreError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, StoreError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn u128(&mut self) -> Result<u128, StoreError> {
        let mut a = [0u8; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(u128::from_le_bytes(a))
    }
    fn text(&mut self) -> Result<&'a str, StoreError> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| self.corrupt("text is not UTF-8"))
    }
    /// A count of items that each take at least `min_item` bytes: refuses counts the remaining
    /// bytes cannot hold, so a corrupt count cannot make us allocate gigabytes.
    fn count(&mut self, min_item: usize) -> Result<usize, StoreError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.bytes.len() {
            return Err(self.corrupt("count larger than the data"));
        }
        Ok(n)
    }
    fn pool(&mut self) -> Result<PoolName, StoreError> {
        let text = self.text()?;
        PoolName::new(text).map_err(|e| self.corrupt(&e.to_string()))
    }
    fn finish(self) -> Result<(), StoreError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.corrupt("trailing bytes"))
        }
    }
}

/// Encodes pool snapshots.
pub fn encode_snapshots(snapshots: &[(PoolName, PoolSnapshot)]) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    w.u8(FORMAT);
    w.count(snapshots.len());
    for (name, snapshot) in snapshots {
        w.text(name.as_str());
        for family in 0..2 {
            w.u128(snapshot.current[family]);
            w.u64(snapshot.n_allocated[family]);
        }
        w.count(snapshot.ranges.len());
        for range in &snapshot.ranges {
            w.text(&range.spec.to_string());
            w.u8(u8::from(range.draining));
            w.u128(range.cursor);
            w.u64(range.n_allocated);
            match &range.occupancy {
                OccupancySnapshot::Bits(words) => {
                    w.u8(KIND_PACKED_WORDS);
                    pack_words(&mut w, words);
                }
                OccupancySnapshot::Runs(runs) => {
                    w.u8(KIND_RUNS);
                    w.count(runs.len());
                    for &(low, high) in runs {
                        w.u128(low);
                        w.u128(high);
                    }
                }
            }
        }
    }
    w.0
}

/// Decodes what [`encode_snapshots`] wrote.
pub fn decode_snapshots(bytes: &[u8]) -> Result<Vec<(PoolName, PoolSnapshot)>, StoreError> {
    let mut r = Reader::formatted(bytes, "pool snapshot")?;
    let n_pools = r.count(4)?;
    let mut out = Vec::with_capacity(n_pools);
    for _ in 0..n_pools {
        let name = r.pool()?;
        let mut current = [0u128; 2];
        let mut n_allocated = [0u64; 2];
        for family in 0..2 {
            current[family] = r.u128()?;
            n_allocated[family] = r.u64()?;
        }
        let n_ranges = r.count(30)?;
        let mut ranges = Vec::with_capacity(n_ranges);
        for _ in 0..n_ranges {
            let text = r.text()?;
            let spec: RangeSpec = text
                .parse()
                .map_err(|e: corral_core::SpecError| r.corrupt(&e.to_string()))?;
            let draining = r.u8()? != 0;
            let cursor = r.u128()?;
            let range_allocated = r.u64()?;
            let occupancy = match r.u8()? {
                KIND_WORDS => {
                    let n = r.count(8)?;
                    let mut words = Vec::with_capacity(n);
                    for _ in 0..n {
                        words.push(r.u64()?);
                    }
                    OccupancySnapshot::Bits(words)
                }
                KIND_PACKED_WORDS => OccupancySnapshot::Bits(r.packed_words()?),
                KIND_RUNS => {
                    let n = r.count(32)?;
                    let mut runs = Vec::with_capacity(n);
                    for _ in 0..n {
                        runs.push((r.u128()?, r.u128()?));
                    }
                    OccupancySnapshot::Runs(runs)
                }
                _ => return Err(r.corrupt("unknown occupancy kind")),
            };
            ranges.push(RangeSnapshot {
                spec,
                draining,
                cursor,
                n_allocated: range_allocated,
                occupancy,
            });
        }
        out.push((
            name,
            PoolSnapshot {
                current,
                n_allocated,
                ranges,
            },
        ));
    }
    r.finish()?;
    Ok(out)
}

/// Encodes cooldowns: (pool, address, release time), as schema 1 stored them in the state
/// row; kept to test the decoding.
#[cfg(test)]
pub fn encode_cooling(cooling: &[(PoolName, IpAddr, Timestamp)]) -> Vec<u8> {
    let mut w = Writer(Vec::new());
    w.u8(FORMAT);
    w.count(cooling.len());
    for (pool, addr, at) in cooling {
        w.text(pool.as_str());
        w.u8(match Family::of(*addr) {
            Family::V4 => 4,
            Family::V6 => 6,
        });
        w.u128(corral_core::addr_value(*addr));
        w.u64(at.as_unix_millis());
    }
    w.0
}

/// Decodes schema 1's cooldown list (see [`encode_cooling`]); read only when migrating.
pub fn decode_cooling(bytes: &[u8]) -> Result<Vec<(PoolName, IpAddr, Timestamp)>, StoreError> {
    let mut r = Reader::formatted(bytes, "cooldowns")?;
    let n = r.count(29)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let pool = r.pool()?;
        let family = match r.u8()? {
            4 => Family::V4,
            6 => Family::V6,
            _ => return Err(r.corrupt("unknown family")),
        };
        let value = r.u128()?;
        if value > family.max_value() {
            return Err(r.corrupt("address out of range"));
        }
        let at = Timestamp::from_unix_millis(r.u64()?);
        out.push((pool, family.addr(value), at));
    }
    r.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_core::{Engine, EngineConfig, Request};

    fn sample() -> Vec<(PoolName, PoolSnapshot)> {
        let pool = PoolName::default_pool();
        let mut engine = Engine::new(EngineConfig::default());
        engine
            .add_range(&pool, "10.0.0.0/24,gateway=10.0.0.1".parse().unwrap())
            .unwrap();
        engine
            .add_range(&pool, "fd00::/64".parse().unwrap())
            .unwrap();
        let request = Request {
            pool: &pool,
            owner: "o",
            key: None,
            lease: None,
        };
        engine.allocate_dual(&request, Timestamp::ZERO).unwrap();
        vec![(pool.clone(), engine.pool_snapshot(&pool).unwrap())]
    }

    #[test]
    fn snapshots_and_cooldowns_round_trip() {
        let snapshots = sample();
        assert_eq!(
            decode_snapshots(&encode_snapshots(&snapshots)).unwrap(),
            snapshots
        );
        let cooling = vec![
            (
                PoolName::default_pool(),
                "10.0.0.7".parse().unwrap(),
                Timestamp::from_unix_millis(5),
            ),
            (
                PoolName::default_pool(),
                "fd00::9".parse().unwrap(),
                Timestamp::from_unix_millis(6),
            ),
        ];
        assert_eq!(decode_cooling(&encode_cooling(&cooling)).unwrap(), cooling);
    }

    /// Bitmaps round-trip whatever their words, and the usual ones pack small.
    #[test]
    fn bitmap_words_pack_and_unpack() {
        let cases: Vec<Vec<u64>> = vec![
            vec![],
            vec![0; 1024],
            vec![u64::MAX; 1024],
            [vec![u64::MAX; 300], vec![0b1011], vec![0; 723]].concat(),
            (0..1024u64)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect(),
            vec![5, 0, u64::MAX, 7, 7, 0, 0, u64::MAX, 1],
        ];
        for words in cases {
            let mut w = Writer(Vec::new());
            pack_words(&mut w, &words);
            let size = w.0.len();
            let mut r = Reader {
                bytes: &w.0,
                what: "test",
            };
            assert_eq!(r.packed_words().unwrap(), words);
            r.finish().unwrap();
            let runs_only = words.iter().all(|&x| x == 0 || x == u64::MAX);
            if runs_only && words.len() > 100 {
                assert!(size <= 4 + 2 * 5, "{size} bytes for {} words", words.len());
            }
        }
        // A /16 filled from its start to 30% by next-fit: 16 bytes, not 8 KiB.
        let mut w = Writer(Vec::new());
        pack_words(&mut w, &[vec![u64::MAX; 300], vec![0; 724]].concat());
        assert_eq!(w.0.len(), 14);
        // Claims beyond the bitmap's size are refused before anything is allocated.
        for bytes in [
            [255u8, 255, 255, 255].as_slice(),
            &[4, 0, 0, 0, RUN_EMPTY, 5, 0, 0, 0],
            &[4, 0, 0, 0, RUN_EMPTY, 0, 0, 0, 0],
            &[4, 0, 0, 0, 9, 1, 0, 0, 0],
            &[2, 0, 0, 0, LITERALS, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        ] {
            let mut r = Reader {
                bytes,
                what: "test",
            };
            assert!(r.packed_words().is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let bytes = encode_snapshots(&sample());
        for cut in 0..bytes.len() {
            assert!(decode_snapshots(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut state = 7u64;
        for _ in 0..2000 {
            let mut corrupted = bytes.clone();
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            let at = (state >> 33) as usize % corrupted.len();
            corrupted[at] ^= (state >> 20) as u8 | 1;
            let _ = decode_snapshots(&corrupted);
        }
        assert!(decode_cooling(&[1, 255, 255, 255, 255]).is_err());
        assert!(decode_cooling(&[]).is_err());
    }
}
