//! Criterion benchmarks of allocate-next + release, with a plain bitmap allocator as baseline.
//!
//! Groups (one pool state per group, built once per group, never per sample):
//!
//! * `v4_slash16_fill_{0,50,99}pct` and `v4_slash16_fill_all_but_one`: the default pool holds
//!   `10.0.0.0/16` (65,534 usable addresses). A filled pool is made the way churn makes it:
//!   every address is allocated with allocate-next, each with its own owner and attachment
//!   key, then a seeded random subset is released until the wanted fill is left (65,533
//!   allocations, exactly one free address, for `all_but_one`). 0% is a fresh pool.
//! * `v6_slash64_1m`: the default pool holds `fd00:1::/64` with 1,000,000 allocations (owner and
//!   key each) made by allocate-next.
//!
//! Functions in each group:
//!
//! * `corral_alloc_release`: one iteration = `allocate(Target::Next(V4|V6))` with owner and
//!   key, then `release(addr, Some(generation))` of that address. Cooldown is zero, reuse is
//!   next-fit (the defaults otherwise), so the pool state after an iteration equals the state
//!   before it except for the next-fit cursor. The `Released` value (owner and key strings) is
//!   dropped inside the timed loop, as a caller would drop it.
//! * `corral_alloc_only`: allocate-next alone, with `iter_custom`. Where the pool has room, a
//!   batch of K allocations (distinct keys, K = 64, or 16 at 99%) is timed with one pair of
//!   clock reads, then released untimed. With exactly one free address K must be 1: each
//!   allocation is timed alone and the median cost of an empty `Instant::now()`/`elapsed()`
//!   pair, measured at start-up and printed, is subtracted from each sample.
//! * `bitmap_alloc_release` (IPv4 groups only): the baseline, a `Vec<u64>` bitmap over the
//!   whole /16 holding exactly the same free addresses (network and broadcast bits set),
//!   next-fit cursor, scanning a word at a time for a zero bit, wrapping once; then clearing
//!   the bit. It stores no owner or key, so it is a lower bound on bookkeeping cost and shows
//!   what a linear scan costs at high fill.
//! * `corral_alloc_release_cooldown30s` (99% group only): as `corral_alloc_release` with the
//!   default 30 s cooldown, `now` advancing 100 ms per iteration, so about 300 released
//!   addresses are cooling at steady state and every allocation expires one.
//!
//! Without `--bench` (as under `cargo test --benches`) the /64 holds 10,000 allocations instead
//! of 1,000,000 so the smoke run stays quick.

use std::hint::black_box;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, PoolConfig, PoolName, Request, ReusePolicy,
    Target, Timestamp, addr_value,
};
mod common;
use common::{key, keyed_request, mix, owner};
use criterion::{BenchmarkGroup, Criterion, criterion_group, measurement::WallTime};

/// Usable addresses of a /16 (network and broadcast are never handed out).
const V4_CAPACITY: usize = 65_534;
const V4_NET: &str = "10.0.0.0/16";
const V4_BASE: u32 = 0x0a00_0000;
const V6_NET: &str = "fd00:1::/64";
const V6_ALLOCATIONS: usize = 1_000_000;
const V6_ALLOCATIONS_SMOKE: usize = 10_000;

fn config(cooldown: Duration) -> EngineConfig {
    EngineConfig {
        default_pool: PoolConfig {
            cooldown,
            reuse: ReusePolicy::NextFit,
        },
        ..EngineConfig::default()
    }
}

/// Owners and keys for the timed allocations; ids far from the fill's ids so keys never clash.
struct Requesters {
    owners: Vec<String>,
    keys: Vec<AttachmentKey>,
}

impl Requesters {
    fn new(n: usize) -> Requesters {
        let base = 1 << 40;
        Requesters {
            owners: (0..n as u64).map(|i| owner(base + i)).collect(),
            keys: (0..n as u64).map(|i| key(base + i)).collect(),
        }
    }

    fn request<'a>(&'a self, pool: &'a PoolName, i: usize) -> Request<'a> {
        Request {
            pool,
            owner: &self.owners[i],
            key: Some(&self.keys[i]),
            lease: None,
        }
    }
}

/// Allocates `n` addresses with allocate-next, each with its own owner and key.
fn fill_next(engine: &mut Engine, pool: &PoolName, family: Family, n: usize) -> Vec<(IpAddr, u64)> {
    (0..n as u64)
        .map(|i| {
            let owner = owner(i);
            let key = key(i);
            let request = keyed_request(pool, &owner, &key);
            let a = engine
                .allocate(&request, Target::Next(family), Timestamp::ZERO)
                .expect("fill allocation");
            (a.addr, a.generation)
        })
        .collect()
}

/// A /16 pool left with `allocated` allocations, the rest released in a seeded random order.
/// Returns the engine and the free addresses as offsets from 10.0.0.0.
fn v4_pool(allocated: usize) -> (Engine, Vec<u32>) {
    let pool = PoolName::default_pool();
    let mut engine = Engine::new(config(Duration::ZERO));
    engine
        .add_range(&pool, V4_NET.parse().expect("range"))
        .expect("add range");
    if allocated == 0 {
        let free = (1..=V4_CAPACITY as u32).collect();
        return (engine, free);
    }
    let mut all = fill_next(&mut engine, &pool, Family::V4, V4_CAPACITY);
    let n_release = V4_CAPACITY - allocated;
    let mut state = 0x5eed_u64;
    for i in 0..n_release {
        state = mix(state);
        let j = i + (state % (all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    let mut free = Vec::with_capacity(n_release);
    for &(addr, generation) in &all[..n_release] {
        engine
            .release(addr, Some(generation), Timestamp::ZERO)
            .expect("release");
        free.push(addr_value(addr) as u32 - V4_BASE);
    }
    free.sort_unstable();
    (engine, free)
}

/// The baseline: one bit per address of the /16, set when the address is not free.
struct Bitmap {
    words: Vec<u64>,
    cursor: usize,
}

impl Bitmap {
    /// A bitmap whose only free addresses are `free`, with the cursor where the engine's is
    /// after a full fill (just past the last usable address).
    fn with_free(free: &[u32]) -> Bitmap {
        let mut words = vec![u64::MAX; 1 << 10];
        for &offset in free {
            words[offset as usize / 64] &= !(1 << (offset % 64));
        }
        let cursor = if free.len() == V4_CAPACITY {
            0
        } else {
            V4_CAPACITY + 1
        };
        Bitmap { words, cursor }
    }

    fn take(&mut self, word: usize, bits: u64) -> u32 {
        let bit = bits.trailing_zeros() as usize;
        self.words[word] |= 1 << bit;
        let offset = word * 64 + bit;
        self.cursor = (offset + 1) % (self.words.len() * 64);
        offset as u32
    }

    /// Next-fit: the first zero bit at or after the cursor, wrapping around once.
    fn allocate(&mut self) -> Option<u32> {
        let start = self.cursor / 64;
        let below = (1u64 << (self.cursor % 64)) - 1;
        let here = !self.words[start] & !below;
        if here != 0 {
            return Some(self.take(start, here));
        }
        for word in (start + 1..self.words.len()).chain(0..start) {
            let bits = !self.words[word];
            if bits != 0 {
                return Some(self.take(word, bits));
            }
        }
        let wrapped = !self.words[start] & below;
        (wrapped != 0).then(|| self.take(start, wrapped))
    }

    fn release(&mut self, offset: u32) {
        self.words[offset as usize / 64] &= !(1 << (offset % 64));
    }
}

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Median cost of one empty `Instant::now()` + `elapsed()` pair.
fn clock_overhead() -> Duration {
    let mut samples: Vec<Duration> = (0..20_001)
        .map(|_| {
            let start = Instant::now();
            black_box(start.elapsed())
        })
        .collect();
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// How `corral_alloc_only` times allocations.
#[derive(Clone, Copy)]
enum AllocOnly {
    /// K allocations under one pair of clock reads.
    Batch(usize),
    /// One allocation at a time, less this clock overhead.
    Single(Duration),
}

fn bench_alloc_release(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    engine: &mut Engine,
    family: Family,
) {
    let pool = PoolName::default_pool();
    let requesters = Requesters::new(1);
    let request = requesters.request(&pool, 0);
    group.bench_function(name, |b| {
        b.iter(|| {
            let a = engine
                .allocate(&request, Target::Next(family), Timestamp::ZERO)
                .expect("allocate");
            engine
                .release(a.addr, Some(a.generation), Timestamp::ZERO)
                .expect("release")
        })
    });
}

fn bench_alloc_only(
    group: &mut BenchmarkGroup<'_, WallTime>,
    engine: &mut Engine,
    family: Family,
    mode: AllocOnly,
) {
    let pool = PoolName::default_pool();
    let k = match mode {
        AllocOnly::Batch(k) => k,
        AllocOnly::Single(_) => 1,
    };
    let requesters = Requesters::new(k);
    let requests: Vec<Request<'_>> = (0..k).map(|i| requesters.request(&pool, i)).collect();
    let mut held: Vec<(IpAddr, u64)> = Vec::with_capacity(k);
    group.bench_function("corral_alloc_only", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0u64;
            while done < iters {
                let n = k.min((iters - done) as usize);
                let start = Instant::now();
                for request in &requests[..n] {
                    let a = engine
                        .allocate(request, Target::Next(family), Timestamp::ZERO)
                        .expect("allocate");
                    held.push(black_box((a.addr, a.generation)));
                }
                let elapsed = start.elapsed();
                total += match mode {
                    AllocOnly::Batch(_) => elapsed,
                    AllocOnly::Single(overhead) => elapsed.saturating_sub(overhead),
                };
                for (addr, generation) in held.drain(..) {
                    engine
                        .release(addr, Some(generation), Timestamp::ZERO)
                        .expect("release");
                }
                done += n as u64;
            }
            total
        })
    });
}

fn bench_bitmap(group: &mut BenchmarkGroup<'_, WallTime>, free: &[u32]) {
    let mut bitmap = Bitmap::with_free(free);
    group.bench_function("bitmap_alloc_release", |b| {
        b.iter(|| {
            let offset = bitmap.allocate().expect("bitmap has a free bit");
            bitmap.release(black_box(offset));
            offset
        })
    });
}

/// Allocate/release pairs on the engine and the bitmap must pick the same addresses.
fn check_same_choices(engine: &mut Engine, free: &[u32]) {
    let pool = PoolName::default_pool();
    let requesters = Requesters::new(1);
    let request = requesters.request(&pool, 0);
    let mut bitmap = Bitmap::with_free(free);
    for _ in 0..200 {
        let a = engine
            .allocate(&request, Target::Next(Family::V4), Timestamp::ZERO)
            .expect("allocate");
        let offset = bitmap.allocate().expect("bitmap allocate");
        assert_eq!(addr_value(a.addr) as u32 - V4_BASE, offset);
        engine
            .release(a.addr, Some(a.generation), Timestamp::ZERO)
            .expect("release");
        bitmap.release(offset);
    }
}

fn v4_groups(c: &mut Criterion) {
    let overhead = clock_overhead();
    eprintln!("clock overhead subtracted from single-allocation samples: {overhead:?}");
    let fills: [(&str, usize, AllocOnly); 4] = [
        ("v4_slash16_fill_0pct", 0, AllocOnly::Batch(64)),
        (
            "v4_slash16_fill_50pct",
            V4_CAPACITY / 2,
            AllocOnly::Batch(64),
        ),
        (
            "v4_slash16_fill_99pct",
            V4_CAPACITY * 99 / 100,
            AllocOnly::Batch(16),
        ),
        (
            "v4_slash16_fill_all_but_one",
            V4_CAPACITY - 1,
            AllocOnly::Single(overhead),
        ),
    ];
    for (name, allocated, mode) in fills {
        let (mut engine, free) = v4_pool(allocated);
        assert_eq!(engine.n_allocations(), allocated);
        assert_eq!(free.len(), V4_CAPACITY - allocated);
        check_same_choices(&mut engine, &free);
        let mut group = c.benchmark_group(name);
        bench_alloc_release(&mut group, "corral_alloc_release", &mut engine, Family::V4);
        bench_alloc_only(&mut group, &mut engine, Family::V4, mode);
        bench_bitmap(&mut group, &free);
        if name == "v4_slash16_fill_99pct" {
            bench_cooldown(&mut group, &mut engine);
        }
        assert_eq!(engine.n_allocations(), allocated);
        group.finish();
    }
}

fn bench_cooldown(group: &mut BenchmarkGroup<'_, WallTime>, engine: &mut Engine) {
    let pool = PoolName::default_pool();
    engine
        .set_pool_config(&pool, PoolConfig::default())
        .expect("pool config");
    let requesters = Requesters::new(1);
    let request = requesters.request(&pool, 0);
    let mut now = Timestamp::from_unix_millis(1_000_000);
    group.bench_function("corral_alloc_release_cooldown30s", |b| {
        b.iter(|| {
            now = Timestamp::from_unix_millis(now.as_unix_millis() + 100);
            let a = engine
                .allocate(&request, Target::Next(Family::V4), now)
                .expect("allocate");
            engine
                .release(a.addr, Some(a.generation), now)
                .expect("release")
        })
    });
    let stats = engine.stats(&pool, Family::V4).expect("stats");
    eprintln!(
        "cooldown bench steady state: {} cooling, {} free",
        stats.cooling, stats.free
    );
}

fn v6_group(c: &mut Criterion) {
    let n = if bench_mode() {
        V6_ALLOCATIONS
    } else {
        V6_ALLOCATIONS_SMOKE
    };
    let pool = PoolName::default_pool();
    let mut engine = Engine::new(config(Duration::ZERO));
    engine
        .add_range(&pool, V6_NET.parse().expect("range"))
        .expect("add range");
    let started = Instant::now();
    fill_next(&mut engine, &pool, Family::V6, n);
    eprintln!(
        "filled {V6_NET} with {n} allocations in {:?}",
        started.elapsed()
    );
    let mut group = c.benchmark_group("v6_slash64_1m");
    bench_alloc_release(&mut group, "corral_alloc_release", &mut engine, Family::V6);
    bench_alloc_only(&mut group, &mut engine, Family::V6, AllocOnly::Batch(64));
    group.finish();
    assert_eq!(engine.n_allocations(), n);
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = v4_groups, v6_group
}
criterion::criterion_main!(benches);
