//! A hierarchical bitmap: find the first clear bit at or after any position in O(levels).
//!
//! Level 0 holds one bit per position. Each higher level holds one bit per word of the level
//! below, set when that word is full, up to a single top word. Finding the next clear bit
//! looks at one word per level on the way up and one per level on the way down, so it costs
//! the same at 0% fill and with one clear bit left (a linear scan of a /16 costs ~1 µs there).
//! Padding bits past the end are kept set, so they are never found.

/// Bits per word.
const W: u64 = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bitmap {
    /// `levels[0]` is one bit per position; `levels.last()` has exactly one word.
    levels: Vec<Vec<u64>>,
    size: u64,
}

fn words_for(bits: u64) -> usize {
    bits.div_ceil(W) as usize
}

impl Bitmap {
    /// A bitmap of `size` clear bits (`size >= 1`).
    pub fn new(size: u64) -> Bitmap {
        let mut levels = Vec::new();
        let mut bits = size.max(1);
        loop {
            let n_words = words_for(bits);
            let mut words = vec![0u64; n_words];
            // Padding past the end counts as set, so it is never handed out and a word
            // whose real bits are all set reads as full.
            let tail = bits % W;
            if tail != 0 {
                words[n_words - 1] = !0u64 << tail;
            }
            levels.push(words);
            if n_words == 1 {
                break;
            }
            bits = n_words as u64;
        }
        let mut bitmap = Bitmap { levels, size };
        // A one-word level 0 may already be full of padding only if size == 0, which callers
        // never ask for; still, keep the summary levels consistent.
        for level in 0..bitmap.levels.len() - 1 {
            for index in 0..bitmap.levels[level].len() {
                bitmap.sync_summary(level, index as u64);
            }
        }
        bitmap
    }

    /// The position bits (level 0), padding included.
    pub fn words(&self) -> &[u64] {
        &self.levels[0]
    }

    /// A bitmap of `size` positions with these level-0 words (padding is forced set); `None`
    /// when the number of words does not fit `size`.
    pub fn from_words(size: u64, words: &[u64]) -> Option<Bitmap> {
        let mut bitmap = Bitmap::new(size);
        if words.len() != bitmap.levels[0].len() {
            return None;
        }
        let padding = *bitmap.levels[0].last()?;
        bitmap.levels[0].copy_from_slice(words);
        if let Some(last) = bitmap.levels[0].last_mut() {
            *last |= padding;
        }
        for index in 0..bitmap.levels[0].len() {
            bitmap.sync_summary(0, index as u64);
        }
        Some(bitmap)
    }

    #[cfg(test)]
    pub fn get(&self, position: u64) -> bool {
        position < self.size && self.levels[0][(position / W) as usize] & (1 << (position % W)) != 0
    }

    /// Makes the summary bit for word `index` of `level` match whether that word is full,
    /// propagating upwards while anything changes.
    fn sync_summary(&mut self, mut level: usize, mut index: u64) {
        while level + 1 < self.levels.len() {
            let full = self.levels[level][index as usize] == !0u64;
            let parent = &mut self.levels[level + 1][(index / W) as usize];
            let bit = 1u64 << (index % W);
            let was_full = *parent == !0u64;
            if full {
                *parent |= bit;
            } else {
                *parent &= !bit;
            }
            let now_full = *parent == !0u64;
            if was_full == now_full {
                return;
            }
            level += 1;
            index /= W;
        }
    }

    /// Sets a bit; returns true if it was clear.
    pub fn set(&mut self, position: u64) -> bool {
        debug_assert!(position < self.size);
        let index = position / W;
        let word = &mut self.levels[0][index as usize];
        let bit = 1u64 << (position % W);
        if *word & bit != 0 {
            return false;
        }
        *word |= bit;
        if *word == !0u64 {
            self.sync_summary(0, index);
        }
        true
    }

    /// Clears a bit; returns true if it was set.
    pub fn clear(&mut self, position: u64) -> bool {
        debug_assert!(position < self.size);
        let index = position / W;
        let word = &mut self.levels[0][index as usize];
        let bit = 1u64 << (position % W);
        if *word & bit == 0 {
            return false;
        }
        let was_full = *word == !0u64;
        *word &= !bit;
        if was_full {
            self.sync_summary(0, index);
        }
        true
    }

    /// First index at or after `from` on `level` whose bit is clear.
    fn next_clear(&self, level: usize, from: u64) -> Option<u64> {
        let words = &self.levels[level];
        let index = from / W;
        let word = *words.get(index as usize)?;
        let candidates = !word & (!0u64 << (from % W));
        if candidates != 0 {
            return Some(index * W + u64::from(candidates.trailing_zeros()));
        }
        if level + 1 == self.levels.len() {
            return None;
        }
        // The next word of this level with a clear bit is the next clear bit one level up.
        let next = self.next_clear(level + 1, index + 1)?;
        let word = words[next as usize];
        Some(next * W + u64::from((!word).trailing_zeros()))
    }

    /// The first clear position in `from..=to`.
    pub fn first_clear(&self, from: u64, to: u64) -> Option<u64> {
        if from > to {
            return None;
        }
        self.next_clear(0, from).filter(|&position| position <= to)
    }

    /// Sets or clears every bit of `low..=high`; returns how many bits changed.
    pub fn fill(&mut self, low: u64, high: u64, value: bool) -> u64 {
        debug_assert!(low <= high && high < self.size);
        let mut changed = 0;
        let (first, last) = (low / W, high / W);
        for index in first..=last {
            let from = if index == first { low % W } else { 0 };
            let to = if index == last { high % W } else { W - 1 };
            let mask = (!0u64 << from) & (!0u64 >> (W - 1 - to));
            let word = &mut self.levels[0][index as usize];
            let before = *word;
            if value {
                *word |= mask;
            } else {
                *word &= !mask;
            }
            changed += u64::from((before ^ *word).count_ones());
            if before != *word {
                self.sync_summary(0, index);
            }
        }
        changed
    }

    /// How many bits of `low..=high` are set.
    pub fn count(&self, low: u64, high: u64) -> u64 {
        if low > high {
            return 0;
        }
        let (first, last) = (low / W, high / W);
        (first..=last)
            .map(|index| {
                let from = if index == first { low % W } else { 0 };
                let to = if index == last { high % W } else { W - 1 };
                let mask = (!0u64 << from) & (!0u64 >> (W - 1 - to));
                u64::from((self.levels[0][index as usize] & mask).count_ones())
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_first_clear(bits: &[bool], from: u64, to: u64) -> Option<u64> {
        (from..=to.min(bits.len() as u64 - 1)).find(|&i| !bits[i as usize])
    }

    #[test]
    fn finds_the_single_clear_bit_anywhere() {
        for size in [1u64, 2, 63, 64, 65, 4095, 4096, 4097, 65_534, 70_000] {
            let mut bitmap = Bitmap::new(size);
            assert_eq!(bitmap.fill(0, size - 1, true), size);
            assert_eq!(bitmap.first_clear(0, size - 1), None);
            for hole in [0, size / 3, size / 2, size - 1] {
                assert!(bitmap.clear(hole));
                assert_eq!(bitmap.first_clear(0, size - 1), Some(hole), "size {size}");
                assert_eq!(bitmap.first_clear(hole, size - 1), Some(hole));
                if hole > 0 {
                    assert_eq!(bitmap.first_clear(0, hole - 1), None);
                }
                assert!(bitmap.set(hole));
                assert_eq!(bitmap.first_clear(0, size - 1), None);
            }
        }
    }

    #[test]
    fn rebuilding_from_words_restores_the_summaries() {
        let size = 70_000u64;
        let mut bitmap = Bitmap::new(size);
        bitmap.fill(0, size - 1, true);
        bitmap.clear(12_345);
        let rebuilt = Bitmap::from_words(size, bitmap.words()).unwrap();
        assert_eq!(rebuilt, bitmap);
        assert_eq!(rebuilt.first_clear(0, size - 1), Some(12_345));
        assert!(Bitmap::from_words(size, &bitmap.words()[1..]).is_none());
        // Padding cannot be cleared through a snapshot.
        let mut words = Bitmap::new(65).words().to_vec();
        words[1] = 0;
        let padded = Bitmap::from_words(65, &words).unwrap();
        assert_eq!(padded.first_clear(0, 200), Some(0));
        assert_eq!(padded.count(0, 64), 0);
    }

    #[test]
    fn agrees_with_a_plain_vector_of_bits() {
        let size = 5_000u64;
        let mut bitmap = Bitmap::new(size);
        let mut bits = vec![false; size as usize];
        let mut state = 12345u64;
        for step in 0..20_000u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let position = (state >> 33) % size;
            match step % 5 {
                0 | 1 => assert_eq!(bitmap.set(position), !bits[position as usize]),
                2 => assert_eq!(bitmap.clear(position), bits[position as usize]),
                3 => {
                    let high = (position + (state >> 50) % 300).min(size - 1);
                    let value = state & 1 == 0;
                    let expected = (position..=high)
                        .filter(|&i| bits[i as usize] != value)
                        .count();
                    assert_eq!(bitmap.fill(position, high, value), expected as u64);
                    for i in position..=high {
                        bits[i as usize] = value;
                    }
                }
                _ => {
                    let high = (position + (state >> 40) % 2000).min(size - 1);
                    assert_eq!(
                        bitmap.count(position, high),
                        (position..=high).filter(|&i| bits[i as usize]).count() as u64
                    );
                }
            }
            if bits[position as usize] {
                bits[position as usize] = true;
            }
            bits[position as usize] = bitmap.get(position);
            let from = (state >> 20) % size;
            assert_eq!(
                bitmap.first_clear(from, size - 1),
                naive_first_clear(&bits, from, size - 1)
            );
        }
    }
}
