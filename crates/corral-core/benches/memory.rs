//! Memory per allocation and the cost of an empty pool, measured with a counting allocator.
//!
//! The global allocator is `cap::Cap<System>`, which counts the bytes of every live heap
//! block as requested (`Layout::size()`); the workspace forbids `unsafe`, and declaring a
//! `#[global_allocator] static` of a ready-made wrapper needs none. Figures are therefore exact
//! requested bytes, without malloc's own per-block overhead; the resident-set (RSS) delta of the
//! process, read from `/proc/self/statm`, is printed beside them as the real-world figure.
//!
//! Each scenario runs in a fresh child process (this binary run again with `--scenario NAME`)
//! so RSS starts clean and no freed memory of one scenario is reused by the next.
//!
//! Per allocation, for N allocations each with an owner (`ns-NN/web-…`, 26 bytes) and an
//! attachment key (`net`, a 64-hex-character container ID, `eth0`):
//!
//! * (a) total: heap bytes after the N allocations less heap bytes before them, over N;
//! * (b) strings: the owner and key contents (the engine keeps them in one shared arena, so
//!   there is no per-string header; the arena entry's 6-byte length header and its padding
//!   count as overhead, in (c));
//! * (c) beyond owner strings: (a) − (b), the figure the ≤ 64-byte target is about.
//!
//! `cargo bench` passes `--bench`: the /64 then holds 1,000,000 allocations. Without it (as under
//! `cargo test --benches`) it holds 20,000, to keep the smoke run quick.

use std::alloc::System;
use std::process::Command;
use std::time::Duration;

use cap::Cap;

#[allow(dead_code)] // the criterion settings are for the timed benchmarks
mod common;
use common::{key, keyed_request, owner};
use corral_core::{
    Engine, EngineConfig, Family, PoolConfig, PoolName, ReusePolicy, Target, Timestamp,
};

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);

const TARGET_BYTES_BEYOND_STRINGS: f64 = 64.0;

fn heap() -> usize {
    HEAP.allocated()
}

/// Resident set size of this process, in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn engine() -> Engine {
    Engine::new(EngineConfig {
        default_pool: PoolConfig {
            cooldown: Duration::ZERO,
            reuse: ReusePolicy::NextFit,
        },
        ..EngineConfig::default()
    })
}

/// Allocates with a fresh owner and key; returns the bytes of their contents. The owner and key
/// are dropped before the caller reads the heap again.
fn allocate_one(engine: &mut Engine, pool: &PoolName, family: Family, i: u64) -> usize {
    let owner = owner(i);
    let key = key(i);
    let request = keyed_request(pool, &owner, &key);
    engine
        .allocate(&request, Target::Next(family), Timestamp::ZERO)
        .expect("allocate");
    owner.len() + key.network().len() + key.container_id().len() + key.ifname().len()
}

/// Allocation counts just past a growth of the record vector (2^k + 1) or of the index tables
/// (7/8 of 2^k, + 1), where bytes per allocation peak, plus round counts, all below `n`.
fn checkpoints(n: usize) -> Vec<usize> {
    let mut points: Vec<usize> = (10..=24)
        .flat_map(|k| [(1usize << k) + 1, (7usize << k) / 8 + 1])
        .chain([10_000, 100_000, 250_000, 500_000, 750_000])
        .filter(|&p| p < n)
        .collect();
    points.sort_unstable();
    points.dedup();
    points
}

/// Fills a fresh pool holding `range` with `n` allocations and prints
/// `checkpoint COUNT HEAP_DELTA CONTENT` lines on the way, then one line
/// `final N HEAP_DELTA CONTENT HEADER TABLE_BYTES RSS_DELTA`.
fn per_allocation(range: &str, family: Family, n: usize) {
    let pool = PoolName::default_pool();
    let mut engine = engine();
    engine
        .add_range(&pool, range.parse().expect("range"))
        .expect("add range");
    let (heap_before, rss_before) = (heap(), rss());
    let mut content = 0usize;
    let mut points = checkpoints(n).into_iter().peekable();
    for i in 0..n as u64 {
        content += allocate_one(&mut engine, &pool, family, i);
        if points.peek() == Some(&(i as usize + 1)) {
            points.next();
            println!("checkpoint {} {} {content}", i + 1, heap() - heap_before);
        }
    }
    let (heap_after, rss_after) = (heap(), rss());
    let table = engine.table_bytes();
    println!(
        "final {n} {} {content} {table} {}",
        heap_after - heap_before,
        rss_after.saturating_sub(rss_before)
    );
}

/// Heap bytes of `Engine::new` and of adding one range to its empty default pool:
/// `engine_bytes range_bytes`.
fn empty_pool(range: &str) {
    let h0 = heap();
    let mut engine = engine();
    let h1 = heap();
    engine
        .add_range(&PoolName::default_pool(), range.parse().expect("range"))
        .expect("add range");
    let h2 = heap();
    assert_eq!(engine.n_allocations(), 0);
    println!("{} {}", h1 - h0, h2 - h1);
}

/// Runs this binary again on one scenario and returns its output lines, split into words.
fn run_child(args: &[&str]) -> Vec<Vec<String>> {
    let exe = std::env::current_exe().expect("current exe");
    let output = Command::new(exe)
        .arg("--scenario")
        .args(args)
        .output()
        .expect("run scenario");
    assert!(
        output.status.success(),
        "scenario {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn numbers(words: &[String]) -> Vec<usize> {
    words.iter().map(|w| w.parse().expect("number")).collect()
}

fn report_per_allocation(label: &str, range: &str, family: &str, n: usize) {
    let lines = run_child(&["fill", range, family, &n.to_string()]);
    let final_line = lines
        .iter()
        .find(|l| l.first().map(String::as_str) == Some("final"))
        .expect("final line");
    let [n, total, content, table, rss] = numbers(&final_line[1..])[..] else {
        panic!("unexpected scenario output {final_line:?}");
    };
    let per = |bytes: usize, count: usize| bytes as f64 / count as f64;
    let beyond = |total: usize, content: usize, count: usize| per(total - content, count);
    let verdict = |bytes: f64| {
        if bytes <= TARGET_BYTES_BEYOND_STRINGS {
            "met"
        } else {
            "MISSED"
        }
    };
    let c = beyond(total, content, n);
    println!("{label}: {n} allocations in {range}");
    println!(
        "  (a) total heap delta          {:>8.1} B/alloc  ({total} B)",
        per(total, n)
    );
    println!(
        "  (b) strings (contents)        {:>8.1} B/alloc",
        per(content, n)
    );
    println!(
        "  (c) beyond owner strings      {c:>8.1} B/alloc  target <= {TARGET_BYTES_BEYOND_STRINGS}: {}",
        verdict(c)
    );
    println!(
        "      Engine::table_bytes()     {:>8.1} B/alloc  (the engine's own count of its table)",
        per(table, n)
    );
    println!(
        "      (c) - table_bytes()       {:>8.1} B/alloc",
        c - per(table, n)
    );
    println!(
        "  RSS delta (incl. malloc)      {:>8.1} B/alloc",
        per(rss, n)
    );
    let mut worst = (c, n);
    let mut sweep = Vec::new();
    for line in lines
        .iter()
        .filter(|l| l.first().map(String::as_str) == Some("checkpoint"))
    {
        let [count, total, content] = numbers(&line[1..])[..] else {
            panic!("unexpected checkpoint {line:?}");
        };
        let c = beyond(total, content, count);
        if c > worst.0 {
            worst = (c, count);
        }
        sweep.push(format!("{count}: {c:.1}"));
    }
    if !sweep.is_empty() {
        println!(
            "  (c) on the way, B/alloc at COUNT allocations (growth points and round counts):"
        );
        for chunk in sweep.chunks(6) {
            println!("      {}", chunk.join("  "));
        }
        println!(
            "  (c) worst seen: {:.1} B/alloc at {} allocations: {}",
            worst.0,
            worst.1,
            verdict(worst.0)
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--scenario") {
        let rest: Vec<&str> = args[at + 1..].iter().map(String::as_str).collect();
        match rest[..] {
            ["fill", range, family, n] => {
                let family = if family == "v6" {
                    Family::V6
                } else {
                    Family::V4
                };
                per_allocation(range, family, n.parse().expect("count"));
            }
            ["empty", range] => empty_pool(range),
            _ => panic!("unknown scenario {rest:?}"),
        }
        return;
    }
    let bench = args.iter().any(|a| a == "--bench");
    let n_v6 = if bench { 1_000_000 } else { 20_000 };
    println!("corral-core memory (requested heap bytes, counted by cap::Cap<System>)");
    println!();
    report_per_allocation("IPv6 /64", "fd00:1::/64", "v6", n_v6);
    report_per_allocation("IPv4 /16", "10.0.0.0/16", "v4", 65_000);
    println!();
    println!("empty pool (heap bytes; Engine::new alone shown once)");
    let mut range_bytes = Vec::new();
    for range in [
        "10.0.0.0/24",
        "10.0.0.0/16",
        "10.0.0.0/8",
        "fd00:1::/64",
        "fd00::/48",
    ] {
        let lines = run_child(&["empty", range]);
        let v = numbers(&lines[0]);
        let [engine_bytes, bytes] = v[..] else {
            panic!("unexpected scenario output {v:?}");
        };
        if range_bytes.is_empty() {
            println!("  Engine::new()                 {engine_bytes:>6} B");
        }
        println!("  + empty range {range:<15} {bytes:>6} B");
        range_bytes.push(bytes);
    }
    // Ranges up to 2^20 addresses get a dense bitmap (a /16 costs 8 KiB); larger ones a run
    // set whose size follows what is blocked, so the last three must cost the same.
    let sparse = &range_bytes[2..];
    let constant = sparse.windows(2).all(|w| w[0] == w[1]);
    println!(
        "  O(1) in range size beyond 2^20 addresses (/8, /64, /48): {}",
        if constant {
            "yes (all equal)"
        } else {
            "NO (differs)"
        }
    );
}
