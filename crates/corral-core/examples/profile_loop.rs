//! Profiling aid (not a benchmark): allocate + release in a loop on a half-full /16 or a /64.

use corral_core::{AttachmentKey, Engine, EngineConfig, Family, PoolConfig, PoolName, Request, ReusePolicy, Target, Timestamp};
use std::time::Duration;

fn main() {
    let v6 = std::env::args().nth(1).as_deref() == Some("v6");
    let mut engine = Engine::new(EngineConfig { default_pool: PoolConfig { cooldown: Duration::ZERO, reuse: ReusePolicy::NextFit }, ..EngineConfig::default() });
    let pool = PoolName::default_pool();
    engine.add_range(&pool, if v6 { "fd00:1::/64".parse().unwrap() } else { "10.0.0.0/16".parse().unwrap() }).unwrap();
    let family = if v6 { Family::V6 } else { Family::V4 };
    let keys: Vec<AttachmentKey> = (0..(if v6 { 1_001_000u64 } else { 33_000 })).map(|i| AttachmentKey::new("net", &format!("{:064x}", i * 7919), "eth0").unwrap()).collect();
    let fill = if v6 { 1_000_000 } else { 32_000 };
    let mut held = Vec::new();
    for key in keys.iter().take(fill) {
        let a = engine.allocate(&Request { pool: &pool, owner: "ns-01/web-0123456789-abcde", key: Some(key), lease: None }, Target::Next(family), Timestamp::ZERO).unwrap();
        held.push(a);
    }
    let t = std::time::Instant::now();
    let n = 30_000_000u64;
    for i in 0..n {
        let key = &keys[fill + (i as usize % 1000)];
        let a = engine.allocate(&Request { pool: &pool, owner: "ns-01/web-0123456789-abcde", key: Some(key), lease: None }, Target::Next(family), Timestamp::ZERO).unwrap();
        engine.release(a.addr, Some(a.generation), Timestamp::ZERO).unwrap();
    }
    eprintln!("{:.1} ns per alloc+release", t.elapsed().as_nanos() as f64 / n as f64);
}
