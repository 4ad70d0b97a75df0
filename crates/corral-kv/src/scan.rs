//! Reading a whole prefix at one revision in pages whose cost stays in proportion to the page.
//!
//! etcd answers a range read with a limit by walking every key of the range, to the range's
//! end, to count them (its `count` field; etcd 3.4 and 3.5 have no way to skip the count), and
//! returns only the first `limit`. Paging through a prefix by moving the start and keeping the
//! end at the prefix's end therefore walks, for page `i` of `n`, every key left: the whole read
//! costs the square of the prefix's size (at 500,000 keys, 11.6 s of a 12.3 s rebuild).
//!
//! [`Scan`] asks for bounded ranges instead: `[cursor, end)` where `end` is chosen so that the
//! range should hold about one page. Keys are placed on a line by 16 of their bytes read as a
//! number, starting at an offset where the keys in sight differ; from each answer the scan
//! learns how wide a page is there (a full page: the distance from the range's start to its
//! last key; a short one: its width scaled by the keys it held, per `count`), so the next range
//! is about a page wide. A range that was too wide costs one walk of what it holds, then the
//! width shrinks to what one page spanned; what etcd walks over a whole read is a small multiple
//! of the keys read. Every key is read exactly once whatever the widths: each range starts where
//! the last ended (or just after the last key of a full page), and ranges cover the prefix to
//! its end.
//!
//! The width is corral's estimate only: it never decides which keys are read, only how many
//! requests read them.

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
}

impl Scan {
    /// A scan of every key under `prefix`, at most `page` keys per request, at the revision of
    /// its first answer.
    pub fn new(prefix: &[u8], page: usize) -> Scan {
        Scan {
            planner: Planner::new(prefix, prefix_end(prefix)),
            limit: page.max(1),
            revision: None,
            stats: ScanStats::default(),
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
        let page = kv
            .range_span(&start, &end, self.limit, self.revision)
            .await?;
        self.revision = Some(page.revision);
        self.stats.requests += 1;
        self.stats.walked += page.count;
        self.stats.keys += page.kvs.len() as u64;
        self.planner.observe(&end, self.limit, &page);
        Ok(Some(page))
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

/// How many bytes of a key, from the offset, make its place on the line.
const WIDTH_BYTES: usize = 16;

/// How much wider the range after a short page is (one with less than 1/16 of a page), in
/// bits.
const SHORT_GROWTH: u32 = 4;

/// How much wider the range after an empty one is, in bits (doubled for each empty one in a
/// row, up to eight times).
const EMPTY_GROWTH: u32 = 4;

/// The largest width kept at an offset: wider is the same range at a shallower offset.
const MAX_WIDTH: u128 = 1 << 120;

/// The choice of ranges, apart from any store: where the next range starts, and how wide it
/// is, at which offset.
#[derive(Clone, Debug)]
struct Planner {
    /// The next key to read (inclusive).
    cursor: Vec<u8>,
    /// Where the read ends (exclusive): the prefix's end (empty: no end).
    hi: Vec<u8>,
    /// Keys left out: `[start, end)` (empty end: to `hi`).
    skip: Option<(Vec<u8>, Vec<u8>)>,
    /// Where a segment ends and the next begins, in order: no range crosses one, and each
    /// segment's first range reaches its end (one walk of it), after which its pages are
    /// sized from what the first one spanned.
    cuts: Vec<Vec<u8>>,
    /// The end of the segment the last range was in.
    segment_end: Option<Vec<u8>>,
    /// The offset of the bytes that place a key on the line.
    offset: usize,
    /// The next range's width on the line at `offset`.
    width: u128,
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
            offset: prefix.len(),
            width: MAX_WIDTH,
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
            // A new segment: its first range is all of it.
            return Some((self.cursor.clone(), segment_end));
        }
        let end = match advance(&self.cursor, self.offset, self.width) {
            Some(end) if Self::before(&end, &segment_end) => end,
            _ => segment_end,
        };
        Some((self.cursor.clone(), end))
    }

    /// Learns from the answer to `[start, end)`.
    fn observe(&mut self, end: &[u8], limit: usize, page: &RangePage) {
        match (page.kvs.first(), page.kvs.last()) {
            (Some(first), Some(last)) if page.more => {
                // The page spanned first..=last: a page is that wide here.
                let offset = common_prefix(&first.key, &last.key);
                self.offset = offset;
                self.width = place(&last.key, offset)
                    .saturating_sub(place(&first.key, offset))
                    .max(1);
                self.narrow();
                self.empties = 0;
                let mut cursor = last.key.clone();
                cursor.push(0);
                self.cursor = cursor;
            }
            _ => {
                if end.is_empty() || end == self.hi.as_slice() {
                    self.done = true;
                }
                self.cursor = end.to_vec();
                let held = page.count.max(page.kvs.len() as u64);
                let limit = limit as u64;
                if held != 0 {
                    self.empties = 0;
                }
                if held == 0 {
                    // Nothing here: 16 times wider, then 256, 65,536, 2^32 times in a row, so
                    // a gap costs a request or two and the tail of a segment a few. (Wider
                    // at once walks the next subtrees of names that sort unevenly, such as
                    // decimal numbers, again and again: 2.75 keys walked per key read at
                    // 40,000 EC2-named nodes at 16 times, 5 at 256.)
                    self.widen(EMPTY_GROWTH << self.empties.min(3));
                    self.empties += 1;
                } else if held << SHORT_GROWTH < limit {
                    self.widen(SHORT_GROWTH);
                } else {
                    // About a page held: scale the width to one page (by at most 16).
                    self.width = (self.width / u128::from(held))
                        .max(1)
                        .saturating_mul(u128::from(limit));
                    self.narrow();
                }
            }
        }
    }

    /// Doubles the width `bits` times, moving to a shallower offset as it grows.
    fn widen(&mut self, bits: u32) {
        for _ in 0..bits {
            if self.width >= MAX_WIDTH {
                if self.offset == 0 {
                    return;
                }
                self.offset -= 1;
                self.width >>= 8;
            }
            self.width = self.width.saturating_mul(2);
        }
    }

    /// Keeps the width below the line's top byte (the same range at a shallower offset).
    fn narrow(&mut self) {
        while self.width > MAX_WIDTH && self.offset > 0 {
            self.offset -= 1;
            self.width >>= 8;
        }
    }
}

/// The key `width` past `key`'s place at `offset` (key padded with zeros to the offset);
/// `None` past the end of every key that shares `key`'s first `offset` bytes and has no
/// greater key of that length (all `0xff`).
fn advance(key: &[u8], offset: usize, width: u128) -> Option<Vec<u8>> {
    let mut base: Vec<u8> = key.iter().copied().take(offset).collect();
    base.resize(offset, 0);
    match place(key, offset).checked_add(width) {
        Some(value) => {
            base.extend_from_slice(&value.to_be_bytes());
            Some(base)
        }
        None => {
            let end = prefix_end(&base);
            (!end.is_empty()).then_some(end)
        }
    }
}

/// A key's place on the line at `offset`: its bytes from there, 16 of them, as a number
/// (missing bytes are zeros).
fn place(key: &[u8], offset: usize) -> u128 {
    let mut bytes = [0u8; WIDTH_BYTES];
    for (slot, byte) in bytes.iter_mut().zip(key.iter().skip(offset)) {
        *slot = *byte;
    }
    u128::from_be_bytes(bytes)
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
        let kv = MemKv::new();
        block_on(async {
            for chunk in keys.chunks(100) {
                let txn = Txn {
                    success: chunk
                        .iter()
                        .map(|key| TxnOp::Put {
                            key: key.clone(),
                            value: b"v".to_vec(),
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
    fn advance_moves_past_the_key_and_carries() {
        assert!(advance(b"abc", 1, 1).unwrap().as_slice() > b"abc".as_slice());
        assert_eq!(advance(b"a\xff", 1, u128::MAX), Some(b"b".to_vec()));
        assert_eq!(advance(b"\xff", 0, u128::MAX), None);
        // A key shorter than the offset is padded.
        assert!(advance(b"a", 3, 1).unwrap().as_slice() > b"a".as_slice());
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_keys_are_read_once_in_order(
            keys in prop::collection::btree_set(prop::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0xffu8), any::<u8>()], 0..24), 0..300),
            prefix in prop::collection::vec(prop_oneof![Just(b'a'), Just(0xffu8)], 0..3),
            skip in prop::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(0xffu8)], 0..3),
            page in 1usize..40,
            segments in prop::collection::vec(prop::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(0xffu8)], 0..4), 0..4),
        ) {
            let keys: Vec<Vec<u8>> = keys.into_iter().filter(|k| !k.is_empty()).collect();
            let kv = store(&keys);
            let mut skip_prefix = prefix.clone();
            skip_prefix.extend(&skip);
            let skipping = !skip.is_empty();
            let mut scan = Scan::new(&prefix, page).by_segments(&segments);
            if skipping {
                scan = scan.skipping(&skip_prefix);
            }
            let read = scan_all(&kv, &mut scan);
            let expected: Vec<Vec<u8>> = keys
                .iter()
                .filter(|k| k.starts_with(&prefix) && !(skipping && k.starts_with(&skip_prefix)))
                .cloned()
                .collect();
            prop_assert_eq!(read, expected);
        }
    }
}
