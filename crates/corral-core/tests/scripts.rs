//! Data-driven engine tests: a short script of operations and the transcript it must produce.
//!
//! `run` is the only caller of the engine API here, so the scripts survive refactors. Each
//! command is echoed as `> command`, followed by `= result` or `! error`. Commands:
//!
//! ```text
//! pool NAME [cooldown=SECS] [reuse=lowest]     create a pool
//! range POOL SPEC / unrange POOL SPEC          add / remove capacity
//! exclude POOL NET REASON / unexclude POOL NET
//! alloc POOL v4|v6 OWNER [key=N/C/I] [lease=SECS]
//! alloc-ip POOL IP OWNER [key=N/C/I]
//! dual POOL OWNER [key=N/C/I]
//! release IP [gen=N] / release-key N/C/I / release-owner OWNER / gc NETWORK [N/C/I ...]
//! lease IP SECS / unlease IP UUID / expire / time SECS
//! restore POOL IP OWNER GEN [key=N/C/I] / cool POOL IP SECS / finish-restore
//! table / stats POOL v4|v6 / status / drained (ranges that drained since the last call)
//! ```
//!
//! Run with `UPDATE_EXPECT=1` to rewrite the expected transcripts after a deliberate change.

use std::fmt::Write as _;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Exclusion, Family, PoolConfig, PoolName, RangeSpec,
    Request, RestoredAllocation, ReusePolicy, Target, Timestamp, parse_addr, parse_net,
};
use expect_test::{Expect, expect};

fn family(text: &str) -> Family {
    match text {
        "v4" => Family::V4,
        "v6" => Family::V6,
        other => panic!("script error: family {other:?}"),
    }
}

fn key(text: &str) -> AttachmentKey {
    let parts: Vec<&str> = text.split('/').collect();
    AttachmentKey::new(parts[0], parts[1], parts[2]).expect("script error: key")
}

/// Splits `a b key=x lease=3` into positional words and options.
fn split(
    words: &[&str],
) -> (
    Vec<String>,
    Option<AttachmentKey>,
    Option<Duration>,
    Option<u64>,
) {
    let mut positional = Vec::new();
    let mut attachment = None;
    let mut lease = None;
    let mut generation = None;
    for word in words {
        if let Some(text) = word.strip_prefix("key=") {
            attachment = Some(key(text));
        } else if let Some(text) = word.strip_prefix("lease=") {
            lease = Some(Duration::from_secs(text.parse().unwrap()));
        } else if let Some(text) = word.strip_prefix("gen=") {
            generation = Some(text.parse().unwrap());
        } else {
            positional.push((*word).to_owned());
        }
    }
    (positional, attachment, lease, generation)
}

fn describe(allocation: &corral_core::Allocation) -> String {
    let mut out = format!("{} gen={}", allocation.addr, allocation.generation);
    if let Some(range) = allocation.range {
        write!(out, " subnet={}", range.subnet_net()).unwrap();
        if let Some(gateway) = range.gateway() {
            write!(out, " gw={gateway}").unwrap();
        }
    }
    if let Some(lease) = allocation.lease {
        write!(out, " lease-until={}", lease.expires_at).unwrap();
    }
    if allocation.existing {
        out.push_str(" (existing)");
    }
    out
}

fn run(script: &str, expected: Expect) {
    run_with(EngineConfig::default(), script, expected);
}

fn run_with(config: EngineConfig, script: &str, expected: Expect) {
    let restoring = script.lines().any(|l| l.trim() == "finish-restore");
    let mut engine = if restoring {
        Engine::restoring(config)
    } else {
        Engine::new(config)
    };
    let mut now = Timestamp::ZERO;
    let mut out = String::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        writeln!(out, "> {line}").unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        let (args, attachment, lease, generation) = split(&words[1..]);
        let pool = |i: usize| PoolName::new(&args[i]).expect("script error: pool");
        let result: Result<String, String> = match words[0] {
            "pool" => {
                let mut config = PoolConfig::default();
                for option in &args[1..] {
                    if let Some(secs) = option.strip_prefix("cooldown=") {
                        config.cooldown = Duration::from_secs(secs.parse().unwrap());
                    } else if option == "reuse=lowest" {
                        config.reuse = ReusePolicy::LowestFree;
                    }
                }
                let name = pool(0);
                if engine.pool_names().contains(&name) {
                    engine.set_pool_config(&name, config).map(|()| "ok".into())
                } else {
                    engine.add_pool(&name, config).map(|()| "ok".into())
                }
                .map_err(|e| e.to_string())
            }
            "range" => args[1]
                .parse::<RangeSpec>()
                .map_err(|e| e.to_string())
                .and_then(|spec| {
                    engine
                        .add_range(&pool(0), spec)
                        .map(|()| format!("{} usable", spec.size()))
                        .map_err(|e| e.to_string())
                }),
            "unrange" => args[1]
                .parse::<RangeSpec>()
                .map_err(|e| e.to_string())
                .and_then(|spec| {
                    engine
                        .remove_range(&pool(0), &spec)
                        .map(|r| format!("{r:?}"))
                        .map_err(|e| e.to_string())
                }),
            "exclude" => Exclusion::parse(&args[1], &args[2..].join(" "))
                .map_err(|e| e.to_string())
                .and_then(|exclusion| {
                    engine
                        .exclude(&pool(0), exclusion)
                        .map(|()| "ok".into())
                        .map_err(|e| e.to_string())
                }),
            "unexclude" => engine
                .remove_exclusion(&pool(0), parse_net(&args[1]).unwrap())
                .map(|()| "ok".into())
                .map_err(|e| e.to_string()),
            "alloc" | "alloc-ip" | "dual" => {
                let name = pool(0);
                let owner_index = if words[0] == "dual" { 1 } else { 2 };
                let request = Request {
                    pool: &name,
                    owner: &args[owner_index],
                    key: attachment.as_ref(),
                    lease,
                };
                match words[0] {
                    "alloc" => engine
                        .allocate(&request, Target::Next(family(&args[1])), now)
                        .map(|a| describe(&a)),
                    "alloc-ip" => engine
                        .allocate(
                            &request,
                            Target::Specific(parse_addr(&args[1]).unwrap()),
                            now,
                        )
                        .map(|a| describe(&a)),
                    _ => engine
                        .allocate_dual(&request, now)
                        .map(|[v4, v6]| format!("{} + {}", describe(&v4), describe(&v6))),
                }
                .map_err(|e| e.to_string())
            }
            "release" => engine
                .release(parse_addr(&args[0]).unwrap(), generation, now)
                .map(|r| format!("{} gen={}", r.addr, r.generation))
                .map_err(|e| e.to_string()),
            "release-key" => {
                let released = engine.release_key(&key(&args[0]), now);
                Ok(format!("{} released", released.len()))
            }
            "release-owner" => {
                let released = engine.release_owner(&args[0], now);
                let addrs: Vec<String> = released.iter().map(|r| r.addr.to_string()).collect();
                Ok(format!("released [{}]", addrs.join(", ")))
            }
            "gc" => {
                let live: Vec<AttachmentKey> = args[1..].iter().map(|k| key(k)).collect();
                engine
                    .release_unlisted(&args[0], &live, now)
                    .map(|released| {
                        let addrs: Vec<String> =
                            released.iter().map(|r| r.addr.to_string()).collect();
                        format!("released [{}]", addrs.join(", "))
                    })
                    .map_err(|e| e.to_string())
            }
            "lease" => engine
                .start_lease(
                    parse_addr(&args[0]).unwrap(),
                    Duration::from_secs(args[1].parse().unwrap()),
                    now,
                )
                .map(|l| format!("{} until {}", l.id, l.expires_at))
                .map_err(|e| e.to_string()),
            "unlease" => engine
                .stop_lease(parse_addr(&args[0]).unwrap(), args[1].parse().unwrap())
                .map(|()| "ok".into())
                .map_err(|e| e.to_string()),
            "expire" => {
                let released = engine.expire(now);
                let addrs: Vec<String> = released.iter().map(|r| r.addr.to_string()).collect();
                Ok(format!("expired [{}]", addrs.join(", ")))
            }
            "time" => {
                now = Timestamp::from_unix_millis(args[0].parse::<u64>().unwrap() * 1000);
                engine.advance(now);
                Ok(format!("now {now}"))
            }
            "restore" => engine
                .restore_allocation(&RestoredAllocation {
                    pool: pool(0),
                    addr: parse_addr(&args[1]).unwrap(),
                    owner: args[2].clone(),
                    key: attachment.clone(),
                    generation: args[3].parse().unwrap(),
                    lease: None,
                })
                .map(|()| "ok".into())
                .map_err(|e| e.to_string()),
            "cool" => engine
                .restore_cooling(
                    &pool(0),
                    parse_addr(&args[1]).unwrap(),
                    Timestamp::from_unix_millis(args[2].parse::<u64>().unwrap() * 1000),
                )
                .map(|()| "ok".into())
                .map_err(|e| e.to_string()),
            "finish-restore" => {
                engine.finish_restore();
                Ok(format!("next generation {}", engine.next_generation()))
            }
            "table" => {
                let mut table = String::new();
                for pool in engine.dump() {
                    for entry in pool.allocations {
                        write!(
                            table,
                            "\n  {} {} {} gen={}",
                            pool.pool, entry.addr, entry.owner, entry.generation
                        )
                        .unwrap();
                        if let Some(key) = entry.key {
                            write!(table, " key={key}").unwrap();
                        }
                        if let Some(lease) = entry.lease {
                            write!(table, " lease-until={}", lease.expires_at).unwrap();
                        }
                    }
                }
                Ok(format!("{} allocations{table}", engine.n_allocations()))
            }
            "stats" => engine
                .stats(&pool(0), family(&args[1]))
                .map(|s| {
                    format!(
                        "capacity={} used={} free={} excluded={} cooling={} ranges={} draining={}",
                        s.capacity,
                        s.used,
                        s.free,
                        s.excluded,
                        s.cooling,
                        s.ranges,
                        s.draining_ranges
                    )
                })
                .map_err(|e| e.to_string()),
            "status" => Ok(engine.status_line()),
            "drained" => Ok(engine
                .take_drained()
                .iter()
                .map(|d| format!("{} {}", d.pool, d.spec))
                .collect::<Vec<_>>()
                .join(", ")),
            other => panic!("script error: unknown command {other:?}"),
        };
        match result {
            Ok(text) => writeln!(out, "= {text}").unwrap(),
            Err(text) => writeln!(out, "! {text}").unwrap(),
        }
        if let Err(problem) = engine.check_invariants() {
            panic!("invariant broken after {line:?}: {problem}\n{out}");
        }
    }
    expected.assert_eq(&out);
}

#[test]
fn next_fit_does_not_hand_back_a_just_released_address() {
    run(
        "
        pool default cooldown=0
        range default 10.0.0.0/29,gateway=10.0.0.1
        alloc default v4 a key=net/c1/eth0
        alloc default v4 b key=net/c2/eth0
        release-key net/c1/eth0
        alloc default v4 c key=net/c3/eth0
        alloc default v4 d
        alloc default v4 e
        alloc default v4 f
        alloc default v4 g
        alloc default v4 h
        table
        stats default v4
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > range default 10.0.0.0/29,gateway=10.0.0.1
            = 5 usable
            > alloc default v4 a key=net/c1/eth0
            = 10.0.0.2 gen=1 subnet=10.0.0.0/29 gw=10.0.0.1
            > alloc default v4 b key=net/c2/eth0
            = 10.0.0.3 gen=2 subnet=10.0.0.0/29 gw=10.0.0.1
            > release-key net/c1/eth0
            = 1 released
            > alloc default v4 c key=net/c3/eth0
            = 10.0.0.4 gen=3 subnet=10.0.0.0/29 gw=10.0.0.1
            > alloc default v4 d
            = 10.0.0.5 gen=4 subnet=10.0.0.0/29 gw=10.0.0.1
            > alloc default v4 e
            = 10.0.0.6 gen=5 subnet=10.0.0.0/29 gw=10.0.0.1
            > alloc default v4 f
            = 10.0.0.2 gen=6 subnet=10.0.0.0/29 gw=10.0.0.1
            > alloc default v4 g
            ! pool default has no free ipv4 address
            > alloc default v4 h
            ! pool default has no free ipv4 address
            > table
            = 5 allocations
              default 10.0.0.2 f gen=6
              default 10.0.0.3 b gen=2 key=net/c2/eth0
              default 10.0.0.4 c gen=3 key=net/c3/eth0
              default 10.0.0.5 d gen=4
              default 10.0.0.6 e gen=5
            > stats default v4
            = capacity=5 used=5 free=0 excluded=0 cooling=0 ranges=1 draining=0
        "#]],
    );
}

#[test]
fn same_key_gets_the_same_address_and_dual_stack_is_all_or_nothing() {
    run(
        "
        range default 10.1.0.0/30
        range default fd00::/126
        dual default pod-a key=net/a/eth0
        dual default pod-a key=net/a/eth0
        alloc default v4 pod-b key=net/b/eth0
        dual default pod-c key=net/c/eth0
        table
        alloc-ip default 10.1.0.2 pod-a key=net/a/eth0
        alloc-ip default 10.1.0.1 pod-a key=net/a/eth0
        ",
        expect![[r#"
            > range default 10.1.0.0/30
            = 2 usable
            > range default fd00::/126
            = 3 usable
            > dual default pod-a key=net/a/eth0
            = 10.1.0.1 gen=1 subnet=10.1.0.0/30 + fd00::1 gen=2 subnet=fd00::/126
            > dual default pod-a key=net/a/eth0
            = 10.1.0.1 gen=1 subnet=10.1.0.0/30 (existing) + fd00::1 gen=2 subnet=fd00::/126 (existing)
            > alloc default v4 pod-b key=net/b/eth0
            = 10.1.0.2 gen=3 subnet=10.1.0.0/30
            > dual default pod-c key=net/c/eth0
            ! pool default has no free ipv4 address
            > table
            = 3 allocations
              default 10.1.0.1 pod-a gen=1 key=net/a/eth0
              default 10.1.0.2 pod-b gen=3 key=net/b/eth0
              default fd00::1 pod-a gen=2 key=net/a/eth0
            > alloc-ip default 10.1.0.2 pod-a key=net/a/eth0
            ! attachment net/a/eth0 already holds 10.1.0.1 in pool default
            > alloc-ip default 10.1.0.1 pod-a key=net/a/eth0
            = 10.1.0.1 gen=1 subnet=10.1.0.0/30 (existing)
        "#]],
    );
}

#[test]
fn specific_requests_say_why_they_are_refused() {
    run(
        "
        range default 10.0.0.0/24,range=10.0.0.10-10.0.0.20,gateway=10.0.0.10
        exclude default 10.0.0.12 metal lb
        alloc-ip default 10.0.0.11 a
        alloc-ip default 10.0.0.11 b
        alloc-ip default 10.0.0.12 b
        alloc-ip default 10.0.0.10 b
        alloc-ip default 10.0.0.0 b
        alloc-ip default 10.0.0.255 b
        alloc-ip default 10.0.0.30 b
        alloc-ip default 192.168.0.1 b
        alloc-ip default fd00::1 b
        alloc-ip nope 10.0.0.13 b
        release 10.0.0.13
        release 10.0.0.11 gen=7
        release 10.0.0.11 gen=1
        stats default v4
        ",
        expect![[r#"
            > range default 10.0.0.0/24,range=10.0.0.10-10.0.0.20,gateway=10.0.0.10
            = 10 usable
            > exclude default 10.0.0.12 metal lb
            = ok
            > alloc-ip default 10.0.0.11 a
            = 10.0.0.11 gen=1 subnet=10.0.0.0/24 gw=10.0.0.10
            > alloc-ip default 10.0.0.11 b
            ! 10.0.0.11 is already held by owner "a" at generation 1
            > alloc-ip default 10.0.0.12 b
            ! 10.0.0.12 is excluded by 10.0.0.12/32 (metal lb)
            > alloc-ip default 10.0.0.10 b
            ! 10.0.0.10 is reserved as the gateway of range 10.0.0.0/24,range=10.0.0.10-10.0.0.20,gateway=10.0.0.10
            > alloc-ip default 10.0.0.0 b
            ! 10.0.0.0 is reserved as the network address of range 10.0.0.0/24,range=10.0.0.10-10.0.0.20,gateway=10.0.0.10
            > alloc-ip default 10.0.0.255 b
            ! 10.0.0.255 is reserved as the broadcast address of range 10.0.0.0/24,range=10.0.0.10-10.0.0.20,gateway=10.0.0.10
            > alloc-ip default 10.0.0.30 b
            ! 10.0.0.30 is not in pool default
            > alloc-ip default 192.168.0.1 b
            ! 192.168.0.1 is not in pool default
            > alloc-ip default fd00::1 b
            ! fd00::1 is not in pool default
            > alloc-ip nope 10.0.0.13 b
            ! unknown pool nope
            > release 10.0.0.13
            ! 10.0.0.13 is not allocated
            > release 10.0.0.11 gen=7
            ! 10.0.0.11 is held at generation 1, not 7
            > release 10.0.0.11 gen=1
            = 10.0.0.11 gen=1
            > stats default v4
            = capacity=10 used=0 free=8 excluded=1 cooling=1 ranges=1 draining=0
        "#]],
    );
}

#[test]
fn cooldown_holds_released_addresses_back_until_nothing_else_is_free() {
    run(
        "
        pool lowest cooldown=30 reuse=lowest
        range lowest 10.0.1.0/29
        alloc lowest v4 x
        release 10.0.1.1
        alloc lowest v4 y
        pool default cooldown=30
        range default 10.0.0.0/30
        alloc default v4 a
        alloc default v4 b
        release 10.0.0.1
        time 10
        release 10.0.0.2
        alloc default v4 c
        stats default v4
        alloc default v4 d
        time 45
        stats default v4
        release 10.0.0.1
        release 10.0.0.2
        pool default cooldown=30 reuse=lowest
        time 46
        alloc default v4 e
        time 80
        alloc default v4 f
        ",
        expect![[r#"
            > pool lowest cooldown=30 reuse=lowest
            = ok
            > range lowest 10.0.1.0/29
            = 6 usable
            > alloc lowest v4 x
            = 10.0.1.1 gen=1 subnet=10.0.1.0/29
            > release 10.0.1.1
            = 10.0.1.1 gen=1
            > alloc lowest v4 y
            = 10.0.1.2 gen=2 subnet=10.0.1.0/29
            > pool default cooldown=30
            = ok
            > range default 10.0.0.0/30
            = 2 usable
            > alloc default v4 a
            = 10.0.0.1 gen=3 subnet=10.0.0.0/30
            > alloc default v4 b
            = 10.0.0.2 gen=4 subnet=10.0.0.0/30
            > release 10.0.0.1
            = 10.0.0.1 gen=3
            > time 10
            = now 10.000
            > release 10.0.0.2
            = 10.0.0.2 gen=4
            > alloc default v4 c
            = 10.0.0.1 gen=5 subnet=10.0.0.0/30
            > stats default v4
            = capacity=2 used=1 free=0 excluded=0 cooling=1 ranges=1 draining=0
            > alloc default v4 d
            = 10.0.0.2 gen=6 subnet=10.0.0.0/30
            > time 45
            = now 45.000
            > stats default v4
            = capacity=2 used=2 free=0 excluded=0 cooling=0 ranges=1 draining=0
            > release 10.0.0.1
            = 10.0.0.1 gen=5
            > release 10.0.0.2
            = 10.0.0.2 gen=6
            > pool default cooldown=30 reuse=lowest
            = ok
            > time 46
            = now 46.000
            > alloc default v4 e
            = 10.0.0.1 gen=7 subnet=10.0.0.0/30
            > time 80
            = now 80.000
            > alloc default v4 f
            = 10.0.0.2 gen=8 subnet=10.0.0.0/30
        "#]],
    );
}

#[test]
fn leases_expire_unless_stopped_with_their_id() {
    run_with(
        EngineConfig {
            lease_id_seed: 42,
            ..EngineConfig::default()
        },
        "
        pool default cooldown=0
        range default 10.0.0.0/29
        alloc default v4 a lease=60
        alloc default v4 b
        lease 10.0.0.2 30
        lease 10.0.0.2 30
        unlease 10.0.0.1 00000000-0000-4000-8000-000000000000
        lease 10.0.0.9 5
        table
        time 30
        expire
        time 59
        expire
        time 60
        expire
        table
        unlease 10.0.0.1 00000000-0000-4000-8000-000000000000
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > range default 10.0.0.0/29
            = 6 usable
            > alloc default v4 a lease=60
            = 10.0.0.1 gen=1 subnet=10.0.0.0/29 lease-until=60.000
            > alloc default v4 b
            = 10.0.0.2 gen=2 subnet=10.0.0.0/29
            > lease 10.0.0.2 30
            = 7bfa87c9-2aa0-4ff0-9035-180e3a7e0a08 until 30.000
            > lease 10.0.0.2 30
            ! 10.0.0.2 already has lease 7bfa87c9-2aa0-4ff0-9035-180e3a7e0a08
            > unlease 10.0.0.1 00000000-0000-4000-8000-000000000000
            ! lease 00000000-0000-4000-8000-000000000000 does not match lease c2a6eebd-f397-4ad0-ae1e-cfa58a9959a9 of 10.0.0.1
            > lease 10.0.0.9 5
            ! 10.0.0.9 is not allocated
            > table
            = 2 allocations
              default 10.0.0.1 a gen=1 lease-until=60.000
              default 10.0.0.2 b gen=2 lease-until=30.000
            > time 30
            = now 30.000
            > expire
            = expired [10.0.0.2]
            > time 59
            = now 59.000
            > expire
            = expired []
            > time 60
            = now 60.000
            > expire
            = expired [10.0.0.1]
            > table
            = 0 allocations
            > unlease 10.0.0.1 00000000-0000-4000-8000-000000000000
            ! 10.0.0.1 is not allocated
        "#]],
    );
}

#[test]
fn removing_capacity_with_allocations_drains_it() {
    run(
        "
        pool default cooldown=0
        range default 10.0.0.0/30
        range default 10.0.1.0/30
        alloc default v4 a
        unrange default 10.0.0.0/30
        stats default v4
        alloc default v4 b
        alloc-ip default 10.0.0.2 c
        range default 10.0.0.0/29
        unrange default 10.0.0.0/29
        release 10.0.0.1
        stats default v4
        range default 10.0.0.0/29
        stats default v4
        unrange default 10.0.1.0/30
        unrange default 10.0.1.0/30
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > range default 10.0.0.0/30
            = 2 usable
            > range default 10.0.1.0/30
            = 2 usable
            > alloc default v4 a
            = 10.0.0.1 gen=1 subnet=10.0.0.0/30
            > unrange default 10.0.0.0/30
            = Draining { n_allocated: 1 }
            > stats default v4
            = capacity=2 used=1 free=2 excluded=0 cooling=0 ranges=2 draining=1
            > alloc default v4 b
            = 10.0.1.1 gen=2 subnet=10.0.1.0/30
            > alloc-ip default 10.0.0.2 c
            ! 10.0.0.2 is in range 10.0.0.0/30 of pool default, which is draining
            > range default 10.0.0.0/29
            ! range 10.0.0.0/29 overlaps range 10.0.0.0/30 of pool default
            > unrange default 10.0.0.0/29
            ! pool default has no range 10.0.0.0/29
            > release 10.0.0.1
            = 10.0.0.1 gen=1
            > stats default v4
            = capacity=2 used=1 free=1 excluded=0 cooling=0 ranges=1 draining=0
            > range default 10.0.0.0/29
            = 6 usable
            > stats default v4
            = capacity=8 used=1 free=7 excluded=0 cooling=0 ranges=2 draining=0
            > unrange default 10.0.1.0/30
            = Draining { n_allocated: 1 }
            > unrange default 10.0.1.0/30
            = Draining { n_allocated: 1 }
        "#]],
    );
}

#[test]
fn adding_a_draining_range_again_cancels_the_drain_and_emptied_ranges_are_reported() {
    run(
        "
        pool default cooldown=0
        range default 10.0.0.0/29,gateway=10.0.0.1
        alloc default v4 a
        alloc default v4 b
        unrange default 10.0.0.0/29
        alloc default v4 c
        range default 10.0.0.0/29
        range default 10.0.0.0/29,gateway=10.0.0.1
        stats default v4
        alloc default v4 c
        drained
        unrange default 10.0.0.0/29
        release 10.0.0.2
        release 10.0.0.3
        drained
        release 10.0.0.4
        drained
        drained
        range default 10.0.1.0/30
        unrange default 10.0.1.0/30
        drained
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > range default 10.0.0.0/29,gateway=10.0.0.1
            = 5 usable
            > alloc default v4 a
            = 10.0.0.2 gen=1 subnet=10.0.0.0/29 gw=10.0.0.1
            > alloc default v4 b
            = 10.0.0.3 gen=2 subnet=10.0.0.0/29 gw=10.0.0.1
            > unrange default 10.0.0.0/29
            = Draining { n_allocated: 2 }
            > alloc default v4 c
            ! pool default has no ipv4 capacity
            > range default 10.0.0.0/29
            ! range 10.0.0.0/29 overlaps range 10.0.0.0/29,gateway=10.0.0.1 of pool default
            > range default 10.0.0.0/29,gateway=10.0.0.1
            = 5 usable
            > stats default v4
            = capacity=5 used=2 free=3 excluded=0 cooling=0 ranges=1 draining=0
            > alloc default v4 c
            = 10.0.0.4 gen=3 subnet=10.0.0.0/29 gw=10.0.0.1
            > drained
            = 
            > unrange default 10.0.0.0/29
            = Draining { n_allocated: 3 }
            > release 10.0.0.2
            = 10.0.0.2 gen=1
            > release 10.0.0.3
            = 10.0.0.3 gen=2
            > drained
            = 
            > release 10.0.0.4
            = 10.0.0.4 gen=3
            > drained
            = default 10.0.0.0/29,gateway=10.0.0.1
            > drained
            = 
            > range default 10.0.1.0/30
            = 2 usable
            > unrange default 10.0.1.0/30
            = Removed
            > drained
            = default 10.0.1.0/30
        "#]],
    );
}

#[test]
fn exclusions_keep_allocations_but_stop_reuse() {
    run(
        "
        pool default cooldown=0
        range default 10.0.0.0/28
        alloc-ip default 10.0.0.5 a
        exclude default 10.0.0.4/30 rack-4
        stats default v4
        release 10.0.0.5
        alloc-ip default 10.0.0.5 b
        alloc default v4 c
        unexclude default 10.0.0.4/30
        unexclude default 10.0.0.4/30
        alloc-ip default 10.0.0.5 b
        exclude default 10.0.0.1/28 typo
        exclude default 192.168.9.0/24 not yet here
        range default 192.168.9.0/30
        alloc default v4 d
        stats default v4
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > range default 10.0.0.0/28
            = 14 usable
            > alloc-ip default 10.0.0.5 a
            = 10.0.0.5 gen=1 subnet=10.0.0.0/28
            > exclude default 10.0.0.4/30 rack-4
            = ok
            > stats default v4
            = capacity=14 used=1 free=10 excluded=3 cooling=0 ranges=1 draining=0
            > release 10.0.0.5
            = 10.0.0.5 gen=1
            > alloc-ip default 10.0.0.5 b
            ! 10.0.0.5 is excluded by 10.0.0.4/30 (rack-4)
            > alloc default v4 c
            = 10.0.0.1 gen=2 subnet=10.0.0.0/28
            > unexclude default 10.0.0.4/30
            = ok
            > unexclude default 10.0.0.4/30
            ! pool default has no exclusion 10.0.0.4/30
            > alloc-ip default 10.0.0.5 b
            = 10.0.0.5 gen=3 subnet=10.0.0.0/28
            > exclude default 10.0.0.1/28 typo
            ! subnet 10.0.0.1/28 has host bits set; the network is 10.0.0.0/28
            > exclude default 192.168.9.0/24 not yet here
            = ok
            > range default 192.168.9.0/30
            = 2 usable
            > alloc default v4 d
            = 10.0.0.2 gen=4 subnet=10.0.0.0/28
            > stats default v4
            = capacity=16 used=3 free=11 excluded=2 cooling=0 ranges=2 draining=0
        "#]],
    );
}

#[test]
fn restore_accepts_records_as_they_are_and_gates_allocation() {
    run(
        "
        pool default cooldown=30
        range default 10.0.0.0/29
        restore default 10.0.0.3 pod-a 17 key=net/a/eth0
        restore default 10.0.0.99 orphan 4
        restore default 10.0.0.3 pod-x 18
        restore default 10.0.0.4 pod-b 19 key=net/a/eth0
        cool default 10.0.0.4 100
        alloc default v4 too-early
        gc net
        time 110
        expire
        finish-restore
        restore default 10.0.0.5 late 20
        alloc default v4 pod-c key=net/c/eth0
        alloc default v4 pod-d
        alloc default v4 pod-e
        alloc default v4 pod-f
        alloc default v4 pod-g
        gc net net/c/eth0
        table
        status
        ",
        expect![[r#"
            > pool default cooldown=30
            = ok
            > range default 10.0.0.0/29
            = 6 usable
            > restore default 10.0.0.3 pod-a 17 key=net/a/eth0
            = ok
            > restore default 10.0.0.99 orphan 4
            = ok
            > restore default 10.0.0.3 pod-x 18
            ! 10.0.0.3 is already held by owner "pod-a" (attachment net/a/eth0) at generation 17
            > restore default 10.0.0.4 pod-b 19 key=net/a/eth0
            ! attachment net/a/eth0 already holds 10.0.0.3 in pool default
            > cool default 10.0.0.4 100
            = ok
            > alloc default v4 too-early
            ! restore is in progress: allocate must wait until restore has finished
            > gc net
            ! restore is in progress: release of unlisted attachments must wait until restore has finished
            > time 110
            = now 110.000
            > expire
            = expired []
            > finish-restore
            = next generation 18
            > restore default 10.0.0.5 late 20
            ! restore has finished: restore_allocation is only accepted while restoring
            > alloc default v4 pod-c key=net/c/eth0
            = 10.0.0.1 gen=18 subnet=10.0.0.0/29
            > alloc default v4 pod-d
            = 10.0.0.2 gen=19 subnet=10.0.0.0/29
            > alloc default v4 pod-e
            = 10.0.0.5 gen=20 subnet=10.0.0.0/29
            > alloc default v4 pod-f
            = 10.0.0.6 gen=21 subnet=10.0.0.0/29
            > alloc default v4 pod-g
            = 10.0.0.4 gen=22 subnet=10.0.0.0/29
            > gc net net/c/eth0
            = released [10.0.0.3]
            > table
            = 6 allocations
              default 10.0.0.1 pod-c gen=18 key=net/c/eth0
              default 10.0.0.2 pod-d gen=19
              default 10.0.0.4 pod-g gen=22
              default 10.0.0.5 pod-e gen=20
              default 10.0.0.6 pod-f gen=21
              default 10.0.0.99 orphan gen=4
            > status
            = ipv4 5/6 used in 1 pool (+1 outside active ranges), ipv6 0/0 used in 0 pools
        "#]],
    );
}

#[test]
fn release_by_owner_and_attachment_gc() {
    run(
        "
        pool default cooldown=0
        range default 10.0.0.0/28
        range default fd00::/120
        dual default pod-a key=net/a/eth0
        alloc default v4 pod-a key=net/a/net1
        dual default pod-b key=net/b/eth0
        alloc default v4 pod-c key=other/c/eth0
        alloc default v4 host-service
        release-owner pod-a
        release-owner pod-a
        gc net
        release-key net/b/eth0
        table
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > range default 10.0.0.0/28
            = 14 usable
            > range default fd00::/120
            = 255 usable
            > dual default pod-a key=net/a/eth0
            = 10.0.0.1 gen=1 subnet=10.0.0.0/28 + fd00::1 gen=2 subnet=fd00::/120
            > alloc default v4 pod-a key=net/a/net1
            = 10.0.0.2 gen=3 subnet=10.0.0.0/28
            > dual default pod-b key=net/b/eth0
            = 10.0.0.3 gen=4 subnet=10.0.0.0/28 + fd00::2 gen=5 subnet=fd00::/120
            > alloc default v4 pod-c key=other/c/eth0
            = 10.0.0.4 gen=6 subnet=10.0.0.0/28
            > alloc default v4 host-service
            = 10.0.0.5 gen=7 subnet=10.0.0.0/28
            > release-owner pod-a
            = released [10.0.0.1, 10.0.0.2, fd00::1]
            > release-owner pod-a
            = released []
            > gc net
            = released [10.0.0.3, fd00::2]
            > release-key net/b/eth0
            = 0 released
            > table
            = 2 allocations
              default 10.0.0.4 pod-c gen=6 key=other/c/eth0
              default 10.0.0.5 host-service gen=7
        "#]],
    );
}

#[test]
fn point_to_point_and_single_address_ranges() {
    run(
        "
        pool default cooldown=0
        range default 10.0.0.0/31
        range default 10.0.0.9/32
        range default fd00::/127
        range default fd00::9
        alloc default v4 a
        alloc default v4 b
        alloc default v4 c
        alloc default v4 d
        alloc default v6 e
        alloc default v6 f
        alloc default v6 g
        alloc default v6 h
        status
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > range default 10.0.0.0/31
            = 2 usable
            > range default 10.0.0.9/32
            = 1 usable
            > range default fd00::/127
            = 2 usable
            > range default fd00::9
            = 1 usable
            > alloc default v4 a
            = 10.0.0.0 gen=1 subnet=10.0.0.0/31
            > alloc default v4 b
            = 10.0.0.1 gen=2 subnet=10.0.0.0/31
            > alloc default v4 c
            = 10.0.0.9 gen=3 subnet=10.0.0.9/32
            > alloc default v4 d
            ! pool default has no free ipv4 address
            > alloc default v6 e
            = fd00:: gen=4 subnet=fd00::/127
            > alloc default v6 f
            = fd00::1 gen=5 subnet=fd00::/127
            > alloc default v6 g
            = fd00::9 gen=6 subnet=fd00::9/128
            > alloc default v6 h
            ! pool default has no free ipv6 address
            > status
            = ipv4 3/3 used in 1 pool, ipv6 3/3 used in 1 pool
        "#]],
    );
}

#[test]
fn ranges_may_not_overlap_within_or_across_pools() {
    run(
        "
        range default 10.0.0.0/24
        pool blue
        range blue 10.0.0.128/25
        range blue 10.0.1.0/24
        range default 10.0.1.0/24,range=10.0.1.200-10.0.1.210
        range default 10.0.0.0/23
        range blue 10.0.2.0/24,range=10.0.2.10-10.0.2.10
        range blue 10.0.2.0/24,range=10.0.2.11-10.0.2.11
        pool blue
        alloc blue v4 a
        alloc blue v6 a
        status
        ",
        expect![[r#"
            > range default 10.0.0.0/24
            = 254 usable
            > pool blue
            = ok
            > range blue 10.0.0.128/25
            ! range 10.0.0.128/25 overlaps range 10.0.0.0/24 of pool default
            > range blue 10.0.1.0/24
            = 254 usable
            > range default 10.0.1.0/24,range=10.0.1.200-10.0.1.210
            ! range 10.0.1.0/24,range=10.0.1.200-10.0.1.210 overlaps range 10.0.1.0/24 of pool blue
            > range default 10.0.0.0/23
            ! range 10.0.0.0/23 overlaps range 10.0.1.0/24 of pool blue
            > range blue 10.0.2.0/24,range=10.0.2.10-10.0.2.10
            = 1 usable
            > range blue 10.0.2.0/24,range=10.0.2.11-10.0.2.11
            = 1 usable
            > pool blue
            = ok
            > alloc blue v4 a
            = 10.0.1.1 gen=1 subnet=10.0.1.0/24
            > alloc blue v6 a
            ! pool blue has no ipv6 capacity
            > status
            = ipv4 1/510 used in 2 pools, ipv6 0/0 used in 0 pools
        "#]],
    );
}

#[test]
fn disabled_families_have_their_own_error() {
    run_with(
        EngineConfig {
            ipv6_enabled: false,
            ..EngineConfig::default()
        },
        "
        range default 10.0.0.0/30
        range default fd00::/64
        alloc default v6 a
        dual default a
        alloc-ip default fd00::1 a
        exclude default fd00::/120 x
        status
        ",
        expect![[r#"
            > range default 10.0.0.0/30
            = 2 usable
            > range default fd00::/64
            ! ipv6 allocation disabled
            > alloc default v6 a
            ! ipv6 allocation disabled
            > dual default a
            ! ipv6 allocation disabled
            > alloc-ip default fd00::1 a
            ! ipv6 allocation disabled
            > exclude default fd00::/120 x
            ! ipv6 allocation disabled
            > status
            = ipv4 0/2 used in 1 pool, ipv6 disabled
        "#]],
    );
}

#[test]
fn a_new_gateway_ends_the_cooldown_of_its_address() {
    run(
        "
        pool default cooldown=60
        range default 10.0.0.0/24,range=10.0.0.1-10.0.0.2
        alloc default v4 a
        alloc default v4 b
        release 10.0.0.1
        range default 10.0.0.0/24,range=10.0.0.3-10.0.0.3,gateway=10.0.0.1
        alloc default v4 c
        alloc default v4 d
        stats default v4
        ",
        expect![[r#"
            > pool default cooldown=60
            = ok
            > range default 10.0.0.0/24,range=10.0.0.1-10.0.0.2
            = 2 usable
            > alloc default v4 a
            = 10.0.0.1 gen=1 subnet=10.0.0.0/24
            > alloc default v4 b
            = 10.0.0.2 gen=2 subnet=10.0.0.0/24
            > release 10.0.0.1
            = 10.0.0.1 gen=1
            > range default 10.0.0.0/24,range=10.0.0.3-10.0.0.3,gateway=10.0.0.1
            = 1 usable
            > alloc default v4 c
            = 10.0.0.3 gen=3 subnet=10.0.0.0/24 gw=10.0.0.1
            > alloc default v4 d
            ! pool default has no free ipv4 address
            > stats default v4
            = capacity=2 used=2 free=0 excluded=0 cooling=0 ranges=2 draining=0
        "#]],
    );
}

/// Regression (review of the store): an allocation recorded in one pool at an address that
/// now lies in another pool's range (a range moved between pools by a configuration change)
/// must not be handed out there, and comes back there when released.
#[test]
fn an_address_held_by_another_pool_is_never_handed_out() {
    run(
        "
        pool default cooldown=0
        pool blue cooldown=0
        range blue 10.0.1.0/29
        restore default 10.0.1.1 moved 5 key=net/old/eth0
        finish-restore
        alloc blue v4 a
        stats blue v4
        release 10.0.1.1
        pool blue cooldown=0 reuse=lowest
        alloc blue v4 b
        table
        ",
        expect![[r#"
            > pool default cooldown=0
            = ok
            > pool blue cooldown=0
            = ok
            > range blue 10.0.1.0/29
            = 6 usable
            > restore default 10.0.1.1 moved 5 key=net/old/eth0
            = ok
            > finish-restore
            = next generation 6
            > alloc blue v4 a
            = 10.0.1.2 gen=6 subnet=10.0.1.0/29
            > stats blue v4
            = capacity=6 used=1 free=4 excluded=1 cooling=0 ranges=1 draining=0
            > release 10.0.1.1
            = 10.0.1.1 gen=5
            > pool blue cooldown=0 reuse=lowest
            = ok
            > alloc blue v4 b
            = 10.0.1.1 gen=7 subnet=10.0.1.0/29
            > table
            = 2 allocations
              blue 10.0.1.1 b gen=7
              blue 10.0.1.2 a gen=6
        "#]],
    );
}
