//! `make run` until the agent exists: a short walk through the engine on the embedded default
//! (a dual-stack default pool), printing what each step does.

use std::io::Write as _;
use std::time::Duration;

/// Prints a line; stops the walk quietly when stdout is gone (e.g. piped into `head`).
macro_rules! out {
    ($($arg:tt)*) => {
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            return Ok(());
        }
    };
}

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Exclusion, Family, PoolName, Request, Target, Timestamp,
};

fn main() {
    if let Err(error) = run() {
        eprintln!("demo failed: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    let mut engine = Engine::new(EngineConfig {
        lease_id_seed: seed,
        ..EngineConfig::default()
    });
    let pool = PoolName::default_pool();
    let mut now = Timestamp::from_unix_millis(1_700_000_000_000);

    out!("corral-core demo: the allocation engine on its embedded default\n");
    for spec in [
        "10.88.0.0/16,gateway=10.88.0.1",
        "fd00:88::/64,gateway=fd00:88::1",
    ] {
        engine.add_range(&pool, spec.parse()?)?;
        out!("add capacity   {spec}");
    }
    engine.exclude(&pool, Exclusion::parse("10.88.0.2", "node address")?)?;
    out!("exclude        10.88.0.2 (node address)");
    out!("status         {}\n", engine.status_line());

    for i in 1..=3 {
        let key = AttachmentKey::new("demo-net", &format!("container{i}"), "eth0")?;
        let owner = format!("default/pod-{i}");
        let request = Request {
            pool: &pool,
            owner: &owner,
            key: Some(&key),
            lease: None,
        };
        let [v4, v6] = engine.allocate_dual(&request, now)?;
        out!(
            "ADD {:<28} -> {} + {} (generation {}, {})",
            key.to_string(),
            v4.addr,
            v6.addr,
            v4.generation,
            v6.generation
        );
    }
    let key = AttachmentKey::new("demo-net", "container2", "eth0")?;
    let again = engine.allocate_dual(
        &Request {
            pool: &pool,
            owner: "default/pod-2",
            key: Some(&key),
            lease: None,
        },
        now,
    )?;
    out!(
        "ADD {:<28} -> {} + {} again (same key, existing = {})",
        key.to_string(),
        again[0].addr,
        again[1].addr,
        again[0].existing
    );

    let leased = engine.allocate(
        &Request {
            pool: &pool,
            owner: "kube-system/probe",
            key: None,
            lease: Some(Duration::from_secs(60)),
        },
        Target::Next(Family::V4),
        now,
    )?;
    out!(
        "lease          {} for 60 s (lease id {})",
        leased.addr,
        leased.lease.map(|l| l.id.to_string()).unwrap_or_default()
    );

    let released = engine.release_key(&AttachmentKey::new("demo-net", "container1", "eth0")?, now);
    for r in &released {
        out!("DEL            {} released (cools down for 30 s)", r.addr);
    }
    let next = engine.allocate(
        &Request {
            pool: &pool,
            owner: "default/pod-4",
            key: None,
            lease: None,
        },
        Target::Next(Family::V4),
        now,
    )?;
    out!(
        "ADD            -> {} (next-fit: the released address waits)",
        next.addr
    );

    now = now.saturating_add(Duration::from_secs(61));
    for r in engine.expire(now) {
        out!("expire         {} (its 60 s lease ran out)", r.addr);
    }

    if let Err(error) = engine.allocate(
        &Request {
            pool: &pool,
            owner: "x",
            key: None,
            lease: None,
        },
        Target::Specific("10.88.0.2".parse()?),
        now,
    ) {
        out!("refused        {error}");
    }

    out!("\ndump:");
    for pool_dump in engine.dump() {
        for entry in pool_dump.allocations {
            let key = entry
                .key
                .map(|k| k.to_string())
                .unwrap_or_else(|| "-".into());
            out!(
                "  {:<8} {:<16} {:<20} {:<28} gen {}",
                pool_dump.pool,
                entry.addr,
                entry.owner,
                key,
                entry.generation
            );
        }
    }
    for family in Family::ALL {
        let stats = engine.stats(&pool, family)?;
        out!(
            "{family}: capacity {} used {} free {} excluded {} cooling {}",
            stats.capacity,
            stats.used,
            stats.free,
            stats.excluded,
            stats.cooling
        );
    }
    out!("status         {}", engine.status_line());
    Ok(())
}
