//! Reading a whole prefix at one revision in pages whose cost stays in proportion to the page.
//!
//! etcd answers a range read with a limit by walking every key of the range, to the range's
//! end, to count them (its `count` field; etcd 3.4 and 3.5 have no way to skip the count), and
//! returns only the first `limit`. Paging through a prefix by moving the start and keeping the
//! end at the prefix's end therefore walks, for page `i` of `n`, every key left: the whole read
//! costs the square of the prefix's size (at 500,000 keys, 11.6 s of a 12.3 s rebuild).
//!
//! [`Scan`] asks for bounded ranges instead: `[cursor, end)` where `end` closes a few sibling
//! subtrees of the key tree (keys that share their first `depth` bytes, and the next values
//! of the byte at `depth`), as many as should hold about one page. Key names built of digits,
//! hex or words fill the tree unevenly byte by byte, but each subtree is a real run of keys,
//! so a range rarely reaches far past the keys it was sized for (the range after a gap
//! in the values a byte takes, such as `9` to `a`, can hold much of what is left). From each answer the scan
//! learns: a range that held more than a page (per `count`) is followed by fewer siblings or
//! deeper subtrees; a short one by more siblings or shallower ones. What etcd walks over a
//! whole read is a small multiple of the keys read: each kind once (its first range), then
//! about one more per key for names of digits, two or three for hex, UUIDs and EC2 names. Every key is
//! read exactly once whatever the ranges: each starts where the last ended (or just after the
//! last key of a full page), and ranges cover the prefix to its end.
//!
//! The ranges are corral's estimate only: they never decide which keys are read, only how
//! many requests read them and how much etcd walks.

use crate::{KeyValue, Kv, KvError, RangePage, Revision};

/// What a scan cost: requests made and keys the store walked to answer them (the sum of each
/// answer's `count`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Range requests made.
    pub requests: u64,
    /// Keys the ranges held (what the store walked to count them).
    pub walked: u64,
    /// Keys returned.
    pub keys: u64,
}

/// A read of every key under a prefix at one revision, page by page (see the module doc).
#[derive(Clone, Debug)]
pub struct Scan {
    planner: Planner,
    limit: usize,
    revision: Option<Revision>,
    stats: ScanStats,
    /// Bytes of the keys and values read so far: a page is cut to about [`PAGE_BYTES`] at
    /// the mean size seen.
    bytes: u64,
}

/// About how many bytes of keys and values a page may hold: a store's answer is one message
/// (etcd's client refuses one of more than its decoding limit), and a page is in memory
/// beside the next one. Pages of small values are cut by the count alone.
pub const PAGE_BYTES: u64 = 4 << 20;

impl Scan {
    /// A scan of every key under `prefix`, at most `page` keys per request, at the revision of
    /// its first answer.
    pub fn new(prefix: &[u8], page: usize) -> Scan {
        Scan {
            planner: Planner::new(prefix, prefix_end(prefix)),
            limit: page.max(1),
            revision: None,
            stats: ScanStats::default(),
            bytes: 0,
        }
    }

    /// Leaves out the keys under `skip` (inside the prefix): no request reaches them.
    pub fn skipping(mut self, skip: &[u8]) -> Scan {
        self.planner.skip = Some((skip.to_vec(), prefix_end(skip)));
        self
    }

    /// Reads each of `segments` (prefixes inside the scan's, such as the kinds of key a layout
    /// has) with ranges of its own: no range spans two, so a dense segment is not walked
    /// while the read is still in another. Keys outside every segment are read too.
    pub fn by_segments<S: AsRef<[u8]>>(mut self, segments: &[S]) -> Scan {
        let mut cuts: Vec<Vec<u8>> = segments
            .iter()
            .flat_map(|segment| [segment.as_ref().to_vec(), prefix_end(segment.as_ref())])
            .filter(|cut| !cut.is_empty())
            .collect();
        cuts.sort();
        cuts.dedup();
        self.planner.cuts = cuts;
        self
    }

    /// Starts at `start` (inclusive; a start before the prefix is the prefix): the keys before
    /// it are not read.
    pub fn starting_at(mut self, start: &[u8]) -> Scan {
        if start > self.planner.cursor.as_slice() {
            self.planner.cursor = start.to_vec();
        }
        self
    }

    /// Reads at `revision` rather than at the first answer's.
    pub fn at(mut self, revision: Revision) -> Scan {
        self.revision = Some(revision).filter(|revision| *revision > 0);
        self
    }

    /// The next page (in key order, possibly empty), or `None` once the prefix is read. Every
    /// page is read at the scan's revision.
    pub async fn next<K: Kv>(&mut self, kv: &K) -> Result<Option<RangePage>, KvError> {
        let Some((start, end)) = self.planner.next_range() else {
            return Ok(None);
        };
        let limit = self.page_limit();
        let page = kv.range_span(&start, &end, limit, self.revision).await?;
        self.revision = Some(page.revision);
        self.stats.requests += 1;
        self.stats.walked += page.count;
        self.stats.keys += page.kvs.len() as u64;
        self.bytes += page
            .kvs
            .iter()
            .map(|kv| (kv.key.len() + kv.value.len()) as u64)
            .sum::<u64>();
        self.planner.observe(&end, limit, &page);
        Ok(Some(page))
    }

    /// The keys the next request may return: the scan's page, fewer if the keys read so far
    /// are so large that a page of them would pass [`PAGE_BYTES`].
    fn page_limit(&self) -> usize {
        match self.bytes.checked_div(self.stats.keys) {
            Some(mean) if mean > 0 => {
                usize::try_from(PAGE_BYTES / mean).map_or(self.limit, |n| n.clamp(1, self.limit))
            }
            _ => self.limit,
        }
    }

    /// Every key the scan reads, and the revision it read them at.
    pub async fn read_all<K: Kv>(mut self, kv: &K) -> Result<(Vec<KeyValue>, Revision), KvError> {
        let mut all = Vec::new();
        while let Some(page) = self.next(kv).await? {
            all.extend(page.kvs);
        }
        Ok((all, self.revision.unwrap_or(0)))
    }

    /// The revision the scan reads at (known after its first page).
    pub fn revision(&self) -> Option<Revision> {
        self.revision
    }

    /// What the scan has cost so far.
    pub fn stats(&self) -> ScanStats {
        self.stats
    }
}

/// How many sibling subtrees a range may span: every value of one byte.
const MAX_SPAN: u64 = 256;

/// What the keys read showed of one byte position.
#[derive(Clone, Copy, Debug)]
struct Seen {
    low: u8,
    high: u8,
    /// Every value the byte takes under a parent has likely been seen: it fell back from one
    /// key to the next (a byte before it moved on), or a range past its highest was empty.
    /// A value past the highest clears it.
    round: bool,
}

impl Default for Seen {
    /// Nothing seen yet (`high < low`).
    fn default() -> Seen {
        Seen {
            low: 0xff,
            high: 0,
            round: false,
        }
    }
}

/// What the keys read so far showed of their bytes, by position: the lowest and highest value
/// of each, and whether it has gone round. A range that would reach past the highest of a byte
/// that went round ends at its parent's end instead, and a cursor past it stands at the next
/// parent's start (no request for the values no key uses, such as those after `9`); a cursor
/// short of the depth counts from the lowest.
#[derive(Clone, Debug, Default)]
struct Shape {
    seen: Vec<Seen>,
    /// The last key read.
    last: Vec<u8>,
}

impl Shape {
    fn at(&self, at: usize) -> Seen {
        self.seen.get(at).copied().unwrap_or_default()
    }

    /// Whether `byte` at `at` is past every value that byte takes (as far as the keys tell).
    fn past(&self, at: usize, byte: u8) -> bool {
        let seen = self.at(at);
        seen.round && byte > seen.high
    }

    /// Learns which values each byte of `keys` (read in order, after the last) takes.
    fn see(&mut self, keys: &[KeyValue]) {
        for key in keys {
            let key = &key.key;
            if self.seen.len() < key.len() {
                self.seen.resize(key.len(), Seen::default());
            }
            let parted = common_prefix(&self.last, key);
            // The bytes shared with the last key were seen with it: nothing to learn there.
            let from = parted.min(self.last.len());
            for (at, (seen, &byte)) in self.seen.iter_mut().zip(key).enumerate().skip(from) {
                if seen.high < seen.low {
                    (seen.low, seen.high) = (byte, byte);
                } else {
                    seen.low = seen.low.min(byte);
                    if byte > seen.high {
                        // A value past the highest: the byte had not gone round after all
                        // (`a` after `9`, when only an empty answer said it had).
                        seen.high = byte;
                        seen.round = false;
                    }
                }
                if at > parted && self.last.get(at).is_some_and(|&before| byte < before) {
                    seen.round = true;
                }
            }
            self.last.clone_from(key);
        }
    }

    /// An empty range ended at `end`: each of its first `depth` bytes past the highest value
    /// seen is taken to have gone round.
    fn trust_highs(&mut self, end: &[u8], depth: usize) {
        for (seen, &byte) in self.seen.iter_mut().zip(end).take(depth) {
            if seen.low <= seen.high && byte > seen.high {
                seen.round = true;
            }
        }
    }
}

/// The choice of ranges, apart from any store: where the next range starts, and how much of
/// the key tree it covers.
#[derive(Clone, Debug)]
struct Planner {
    /// The next key to read (inclusive).
    cursor: Vec<u8>,
    /// Where the read ends (exclusive): the prefix's end (empty: no end).
    hi: Vec<u8>,
    /// Keys left out: `[start, end)` (empty end: to `hi`).
    skip: Option<(Vec<u8>, Vec<u8>)>,
    /// Where a segment ends and the next begins, in order: no range crosses one, and each
    /// segment's first range reaches its end (one walk of it), after which its ranges are
    /// sized from what the first one held.
    cuts: Vec<Vec<u8>>,
    /// The end of the segment the last range was in.
    segment_end: Option<Vec<u8>>,
    /// The depth of the subtrees a range covers: keys sharing their first `depth` bytes,
    /// the prefix's included (at least one; at the prefix's length, a range is the rest of
    /// the prefix).
    depth: usize,
    /// How many sibling subtrees at `depth` the next range covers, from the cursor's.
    span: u64,
    /// What the keys of this segment showed of their bytes.
    shape: Shape,
    /// Empty ranges in a row.
    empties: u32,
    done: bool,
}

impl Planner {
    fn new(prefix: &[u8], hi: Vec<u8>) -> Planner {
        Planner {
            cursor: prefix.to_vec(),
            hi,
            skip: None,
            cuts: Vec::new(),
            segment_end: None,
            depth: prefix.len().max(1),
            span: 1,
            shape: Shape::default(),
            empties: 0,
            done: false,
        }
    }

    /// Whether `key` is before `end` (an empty end is no end).
    fn before(key: &[u8], end: &[u8]) -> bool {
        end.is_empty() || key < end
    }

    /// The next range to read, or `None` when the read is complete.
    fn next_range(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        if let Some((skip, skip_end)) = &self.skip
            && self.cursor >= *skip
            && Self::before(&self.cursor, skip_end)
        {
            if skip_end.is_empty() {
                self.done = true;
            }
            self.cursor = skip_end.clone();
        }
        if self.done || !Self::before(&self.cursor, &self.hi) {
            self.done = true;
            return None;
        }
        // The end of the cursor's segment: the next cut, or the skipped keys, or the end.
        let mut segment_end = self
            .cuts
            .iter()
            .find(|cut| cut.as_slice() > self.cursor.as_slice() && Self::before(cut, &self.hi))
            .unwrap_or(&self.hi)
            .clone();
        if let Some((skip, _)) = &self.skip
            && *skip > self.cursor
            && Self::before(skip, &segment_end)
        {
            segment_end = skip.clone();
        }
        let fresh = self.segment_end.as_ref() != Some(&segment_end);
        self.segment_end = Some(segment_end.clone());
        if fresh {
            // A new segment: its first range is all of it, and what the last one taught
            // (another kind of key, other bytes where) is forgotten.
            self.shape = Shape::default();
            self.empties = 0;
            self.span = 1;
            return Some((self.cursor.clone(), segment_end));
        }
        let end = match self.siblings_end() {
            Some(end) if Self::before(&end, &segment_end) => end,
            _ => segment_end,
        };
        Some((self.cursor.clone(), end))
    }

    /// The end of `span` sibling subtrees at `depth` from the cursor's, never past their
    /// parent's end (nor past the highest value seen: then the parent's end). A cursor past
    /// the highest value seen at some byte stands at the next parent's start (the range then
    /// covers the rest of the cursor's parent too; at the prefix's depth, the rest of it); one shorter than
    /// `depth` at its subtree's start, its missing bytes the lowest values seen. `None`: no
    /// end.
    fn siblings_end(&self) -> Option<Vec<u8>> {
        let shape = &self.shape;
        let mut base = self.cursor.clone();
        base.truncate(self.depth);
        // Past every value seen at a byte: the next parent's start.
        while let Some(at) = (0..base.len()).find(|&at| shape.past(at, base[at])) {
            base = prefix_end(&base[..at]);
            if base.is_empty() {
                return None;
            }
        }
        while base.len() < self.depth {
            base.push(shape.at(base.len()).low);
        }
        let (last, parent) = base.split_last()?;
        let next = u64::from(*last) + self.span;
        let end = if next > 0xff || shape.past(parent.len(), (next - 1) as u8) {
            prefix_end(parent)
        } else {
            let mut end = parent.to_vec();
            end.push(next as u8);
            end
        };
        (!end.is_empty()).then_some(end)
    }

    fn set_depth(&mut self, depth: usize) {
        self.depth = depth.max(1);
    }

    /// Learns from the answer to `[start, end)`.
    fn observe(&mut self, end: &[u8], limit: usize, page: &RangePage) {
        let limit = limit as u64;
        let held = page.count.max(page.kvs.len() as u64);
        match (page.kvs.first(), page.kvs.last()) {
            (Some(first), Some(last)) if page.more => {
                self.empties = 0;
                // More than a page here: the subtrees this page spans below where its first
                // and last keys part are about a page.
                let parted = common_prefix(&first.key, &last.key);
                if parted < first.key.len().min(last.key.len()) {
                    self.set_depth(parted + 1);
                    self.span = u64::from(last.key[parted] - first.key[parted]).max(1);
                } else {
                    self.set_depth(self.depth + 1);
                    self.span = 1;
                }
                self.shape.see(&page.kvs);
                let mut cursor = last.key.clone();
                cursor.push(0);
                self.cursor = cursor;
            }
            (Some(first), Some(last)) => {
                self.empties = 0;
                let parted = common_prefix(&first.key, &last.key);
                if parted + 1 < self.depth {
                    // The keys part above the subtrees: the range reached past a parent.
                    self.set_depth(parted + 1);
                }
                let at = self.depth - 1;
                let values = match (first.key.get(at), last.key.get(at)) {
                    (Some(a), Some(b)) => u64::from(b.saturating_sub(*a)) + 1,
                    _ => 1,
                };
                // As many siblings as would hold a page at the density seen.
                let span = values.saturating_mul(limit) / held;
                self.shape.see(&page.kvs);
                if span > MAX_SPAN && self.depth > 1 {
                    // Sparse even over every value: whole parents.
                    self.set_depth(self.depth - 1);
                    self.span = 1;
                } else {
                    self.span = span.clamp(1, MAX_SPAN);
                }
                self.advance_to(end);
            }
            _ => {
                if self.empties == 0 {
                    // Nothing here: most likely past the values a byte takes (`9` of digits).
                    // Trusting the highest value seen of the bytes the range passed, the next
                    // range starts at the next parent that holds keys.
                    self.shape.trust_highs(end, self.depth);
                } else {
                    // Nothing again: a gap or a segment's tail; the rest of the parent next
                    // (then of its parent, …), a request a level.
                    self.set_depth(self.depth - 1);
                    self.span = 1;
                }
                self.empties += 1;
                self.advance_to(end);
            }
        }
    }

    fn advance_to(&mut self, end: &[u8]) {
        if end.is_empty() || end == self.hi.as_slice() {
            self.done = true;
        }
        self.cursor = end.to_vec();
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

/// The first key after every key that starts with `prefix` (empty: no end, when the prefix is
/// all `0xff` bytes or empty).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemKv, Txn, TxnOp};
    use proptest::prelude::*;
    use std::future::Future;

    fn block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    fn store(keys: &[Vec<u8>]) -> MemKv {
        store_valued(keys, b"v")
    }

    /// `keys` written 100 to a transaction, each holding `value`.
    fn store_valued(keys: &[Vec<u8>], value: &[u8]) -> MemKv {
        let kv = MemKv::new();
        block_on(async {
            for chunk in keys.chunks(100) {
                let txn = Txn {
                    success: chunk
                        .iter()
                        .map(|key| TxnOp::Put {
                            key: key.clone(),
                            value: value.to_vec(),
                            lease: None,
                        })
                        .collect(),
                    ..Txn::default()
                };
                kv.txn(txn).await.unwrap();
            }
        });
        kv
    }

    fn scan_all(kv: &MemKv, scan: &mut Scan) -> Vec<Vec<u8>> {
        block_on(async {
            let mut keys = Vec::new();
            while let Some(page) = scan.next(kv).await.unwrap() {
                keys.extend(page.kvs.into_iter().map(|kv: KeyValue| kv.key));
            }
            keys
        })
    }

    #[test]
    fn prefix_end_is_the_first_key_after_the_prefix() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"");
        assert_eq!(prefix_end(b""), b"");
    }

    #[test]
    fn a_range_ends_inside_its_parent() {
        let mut planner = Planner::new(b"k/", b"k0".to_vec());
        planner.depth = 4;
        planner.cursor = b"k/123".to_vec();
        planner.span = 1;
        assert_eq!(planner.siblings_end(), Some(b"k/13".to_vec()));
        planner.span = 3;
        assert_eq!(planner.siblings_end(), Some(b"k/15".to_vec()));
        planner.cursor = b"k/1\xfe".to_vec();
        planner.span = 5;
        assert_eq!(planner.siblings_end(), Some(b"k/2".to_vec()));
        // Past the highest value seen of a byte that went round: the parent's end.
        let key = |key: &[u8]| KeyValue {
            key: key.to_vec(),
            value: Vec::new(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: None,
        };
        // `k/10` after `k/04`: the last byte went round, its highest is 4.
        planner
            .shape
            .see(&[key(b"k/00"), key(b"k/04"), key(b"k/10")]);
        planner.cursor = b"k/12".to_vec();
        assert_eq!(planner.siblings_end(), Some(b"k/2".to_vec()));
        // A cursor past the highest value seen stands at the next parent's start, counted
        // from the lowest value seen.
        planner.span = 2;
        planner.cursor = b"k/1:".to_vec();
        assert_eq!(planner.siblings_end(), Some(b"k/22".to_vec()));
        planner.cursor = b"k/2".to_vec();
        assert_eq!(planner.siblings_end(), Some(b"k/22".to_vec()));
        planner.cursor = b"\xff\xff\xff".to_vec();
        planner.depth = 3;
        planner.shape = Shape::default();
        assert_eq!(planner.siblings_end(), None);
    }

    #[test]
    fn names_of_digits_are_walked_about_once() {
        // The old ranges, sized by byte arithmetic on a 16-byte window, walked 7.3 keys per
        // key read here on etcd (300,000 keys, page 2,000): digits fill 10 of a byte's 256
        // values, so a width learned on one run of digits reached far past the next.
        let keys: Vec<Vec<u8>> = (0..20_000)
            .map(|i| format!("/p/k/{i:08}").into_bytes())
            .collect();
        let kv = store(&keys);
        let mut scan = Scan::new(b"/p/", 500);
        assert_eq!(scan_all(&kv, &mut scan), keys);
        let stats = scan.stats();
        let n = keys.len() as u64;
        // The first range is the whole prefix (walked once); then about a key per key read.
        assert!(stats.walked <= 2 * n + 2 * 500, "{stats:?}");
        assert!(stats.requests <= 3 * n / 500 + 10, "{stats:?}");
        eprintln!("{stats:?}");
    }

    /// The layout of a large cluster: many keys per node, names that share long prefixes.
    fn cluster_keys(nodes: usize) -> Vec<Vec<u8>> {
        let mut keys = vec![b"/corral/t/v1/config".to_vec()];
        for i in 0..nodes {
            let name = format!(
                "ip-10-{}-{}-{}.ec2.internal",
                i / 65536,
                (i / 256) % 256,
                i % 256
            );
            keys.push(format!("/corral/t/v1/nodes/{name}").into_bytes());
            keys.push(format!("/corral/t/v1/live/{name}").into_bytes());
            keys.push(
                format!(
                    "/corral/t/v1/owned/{name}/default/ipv4/10.{}.{}.0-24",
                    i / 256 % 256,
                    i % 256
                )
                .into_bytes(),
            );
            keys.push(
                format!(
                    "/corral/t/v1/grants/default/ipv4/10.{}.{}.0-24",
                    i / 256 % 256,
                    i % 256
                )
                .into_bytes(),
            );
            keys.push(format!("/corral/t/v1/history/at/{:016}/x", i).into_bytes());
        }
        keys.push(b"/corral/t/v10".to_vec());
        keys.push(b"/corral/t/v1".to_vec());
        keys
    }

    #[test]
    fn a_scan_reads_every_key_once_and_walks_in_proportion_to_them() {
        for nodes in [1_000, 8_000] {
            let keys = cluster_keys(nodes);
            let kv = store(&keys);
            let kinds = ["config", "grants/", "history/", "live/", "nodes/", "owned/"]
                .map(|kind| format!("/corral/t/v1/{kind}"));
            let mut scan = Scan::new(b"/corral/t/v1/", 500)
                .skipping(b"/corral/t/v1/history/")
                .by_segments(&kinds);
            let read = scan_all(&kv, &mut scan);
            let mut expected: Vec<Vec<u8>> = keys
                .iter()
                .filter(|k| {
                    k.starts_with(b"/corral/t/v1/") && !k.starts_with(b"/corral/t/v1/history/")
                })
                .cloned()
                .collect();
            expected.sort();
            assert_eq!(read, expected);
            let stats = scan.stats();
            let n = expected.len() as u64;
            eprintln!("{nodes} nodes: {stats:?}");
            // Paging with the end at the prefix's end walks n²/(2·page): 16,000 for 1,000
            // nodes, a million for 8,000.
            // Decimal names sort unevenly (`ip-10-0-1-88` before `ip-10-0-10-0`): a range
            // sized from the page before can hold a few pages, walked once.
            assert!(
                stats.walked <= 4 * n + 4 * 500,
                "{nodes} nodes: {stats:?} for {n} keys"
            );
            assert!(
                stats.requests <= 4 * n / 500 + 60,
                "{nodes} nodes: {stats:?} for {n} keys"
            );
        }
    }

    /// Large values cut the pages by their bytes: after the first, no page passes
    /// `PAGE_BYTES` (one answer of a store is one message), and every key is read once.
    #[test]
    fn pages_of_large_values_are_cut_to_the_byte_budget() {
        let keys: Vec<Vec<u8>> = (0..120)
            .map(|i| format!("/p/{i:04}").into_bytes())
            .collect();
        let kv = store_valued(&keys, &vec![b'x'; 256 << 10]);
        let mut scan = Scan::new(b"/p/", 100);
        let mut read = Vec::new();
        let mut first = true;
        block_on(async {
            while let Some(page) = scan.next(&kv).await.unwrap() {
                let bytes: u64 = page
                    .kvs
                    .iter()
                    .map(|e| (e.key.len() + e.value.len()) as u64)
                    .sum();
                if !first {
                    assert!(bytes <= PAGE_BYTES, "a page of {bytes} bytes");
                }
                first = false;
                read.extend(page.kvs.into_iter().map(|e| e.key));
            }
        });
        // Without the budget the second page holds the 20 keys left: 5 MiB.
        assert_eq!(read, keys);
    }

    #[test]
    fn segments_read_together_cost_what_each_costs_alone() {
        // What one kind of key taught (which bytes go round where) misled the next: at
        // 100,000 nodes the rebuild walked 3.15 million keys, its kinds alone 1.43 million.
        // The cluster bench's layout: dual-stack /26 and /64 grants of `node-NNNNNN`.
        let mut keys = Vec::new();
        for i in 0..8_000u32 {
            let v4 = std::net::Ipv4Addr::from(0x0a00_0000 + i * 64);
            let v6 = format!("fd00:0:{:x}:{:x}::", i >> 16, i & 0xffff);
            for cidr in [format!("ipv4/{v4}-26"), format!("ipv6/{v6}-64")] {
                keys.push(format!("/corral/t/v1/grants/default/{cidr}").into_bytes());
                keys.push(format!("/corral/t/v1/owned/node-{i:06}/default/{cidr}").into_bytes());
            }
            keys.push(format!("/corral/t/v1/nodes/node-{i:06}").into_bytes());
            keys.push(format!("/corral/t/v1/holdings/node-{i:06}").into_bytes());
        }
        let kv = store(&keys);
        let kinds =
            ["grants/", "holdings/", "nodes/", "owned/"].map(|kind| format!("/corral/t/v1/{kind}"));
        let mut together = Scan::new(b"/corral/t/v1/", 500).by_segments(&kinds);
        scan_all(&kv, &mut together);
        let alone: u64 = kinds
            .iter()
            .map(|kind| {
                let mut scan = Scan::new(kind.as_bytes(), 500);
                scan_all(&kv, &mut scan);
                scan.stats().walked
            })
            .sum();
        let walked = together.stats().walked;
        assert!(
            walked <= alone + 2 * 500,
            "together {walked}, alone {alone}"
        );
    }

    #[test]
    fn digits_then_letters_are_walked_in_proportion() {
        // An empty range past `9` marked the byte as gone round; `a`, `b`, … then each ran to
        // the prefix's end (12.3 keys walked per key read) until a value past the highest
        // cleared the mark.
        let keys: Vec<Vec<u8>> = b"0123456789abcdefghijklmnopqrstuvwxyz"
            .iter()
            .flat_map(|&c| (0..1000).map(move |i| format!("k/{}{i:04}", c as char).into_bytes()))
            .collect();
        let kv = store(&keys);
        let mut scan = Scan::new(b"k/", 500);
        assert_eq!(scan_all(&kv, &mut scan), keys);
        let stats = scan.stats();
        assert!(stats.walked <= 4 * keys.len() as u64, "{stats:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_keys_are_read_once_in_order(
            keys in prop::collection::btree_set(prop::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0xffu8), any::<u8>()], 0..24), 0..300),
            prefix in prop::collection::vec(prop_oneof![Just(b'a'), Just(0xffu8)], 0..3),
            skip in prop::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(0xffu8)], 0..3),
            page in 1usize..40,
            segments in prop::collection::vec(prop::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(0xffu8)], 0..4), 0..4),
            start in prop::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0xffu8)], 0..4),
        ) {
            let keys: Vec<Vec<u8>> = keys.into_iter().filter(|k| !k.is_empty()).collect();
            let kv = store(&keys);
            let mut skip_prefix = prefix.clone();
            skip_prefix.extend(&skip);
            let skipping = !skip.is_empty();
            let mut scan = Scan::new(&prefix, page).by_segments(&segments).starting_at(&start);
            if skipping {
                scan = scan.skipping(&skip_prefix);
            }
            let read = scan_all(&kv, &mut scan);
            let expected: Vec<Vec<u8>> = keys
                .iter()
                .filter(|k| k.starts_with(&prefix) && !(skipping && k.starts_with(&skip_prefix)))
                .filter(|k| k.as_slice() >= start.as_slice())
                .cloned()
                .collect();
            prop_assert_eq!(read, expected);
        }
    }
}
