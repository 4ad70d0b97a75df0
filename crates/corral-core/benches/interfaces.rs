//! Criterion benchmarks of assign and unassign by key on an interface-backed pool, beside a
//! faithful Rust re-implementation of AWS VPC CNI ipamd's datastore lookup.
//!
//! The node: 15 interfaces × 50 secondary /32 addresses (750 addresses, an m5.24xlarge), or
//! 15 interfaces × 50 delegated /28 prefixes (12,000 addresses). The pool is filled the way
//! churn fills it: every address assigned to its own key, then a seeded random subset
//! unassigned (their cooldowns long over) until 50% or 90% is left.
//!
//! Functions of each group, each timing batches of 8 operations with `iter_custom` (the
//! other half of each batch runs untimed, so the fill stays put), `now` advancing 1 s per
//! assignment with ipamd's 30 s cooldown (about 30 addresses cooling at steady state):
//!
//! * `corral_assign` / `corral_unassign`: `Interfaces::assign` (engine allocation by key, then
//!   the interface of the address: device number, MAC, gateway, subnet, routes) and
//!   `Interfaces::unassign` (the key's allocations released, each with its interface).
//! * `engine_assign` / `engine_unassign`: the engine's part of those alone on the same pool
//!   (`Engine::allocate` by key, `Engine::release_key_in_pool`), so the table's share shows.
//! * `ipamd_assign` / `ipamd_unassign`: the seed's `AssignPodIPv4Address` and
//!   `UnassignPodIPv4Address` over `HashMap<eni id, Eni { addresses: HashMap<ip text,
//!   AddressInfo> }>`: assign first looks for the key (`FindAddressForSandbox`, a scan of every
//!   address), then scans interfaces and addresses for one unassigned and not cooling; unassign
//!   scans for the key. Strings are `Arc<str>`, so copying a key or returning an address costs
//!   what Go's string headers cost (no allocation), never more.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, InterfaceId, InterfaceSpec, Interfaces, IpNet,
    PoolConfig, PoolName, Request, Target, Timestamp,
};
#[allow(dead_code)] // the engine benchmarks use the rest
mod common;
use common::{container_id, mix};
use criterion::{BenchmarkGroup, Criterion, criterion_group, measurement::WallTime};

const N_INTERFACES: u32 = 15;
const PER_INTERFACE: u32 = 50;
const BATCH: usize = 8;
const COOLDOWN_MS: u64 = 30_000;
/// Churn starts long after the fill's releases, so none of them is cooling.
const START_MS: u64 = 10_000_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Secondaries,
    Prefixes,
}

/// The addresses of interface `i`, as CIDRs inside 10.0.0.0/16.
fn addresses_of(kind: Kind, i: u32) -> Vec<IpNet> {
    (0..PER_INTERFACE)
        .map(|j| {
            let n = i * PER_INTERFACE + j;
            match kind {
                // 10.0.1.0 onwards: one /32 each.
                Kind::Secondaries => IpNet::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0100 + n)), 32),
                // 10.0.16.0 onwards: one /28 each.
                Kind::Prefixes => IpNet::new(IpAddr::V4(Ipv4Addr::from(0x0a00_1000 + n * 16)), 28),
            }
            .unwrap()
        })
        .collect()
}

fn interface_id(i: u32) -> String {
    format!("eni-{:017x}", mix(u64::from(i)) >> 4)
}

// ---- corral --------------------------------------------------------------------------------

struct Corral {
    engine: Engine,
    table: Interfaces,
}

impl Corral {
    fn new(kind: Kind) -> Corral {
        let pool = PoolName::new("eni").unwrap();
        let mut engine = Engine::new(EngineConfig::default());
        engine
            .add_pool(
                &pool,
                PoolConfig {
                    cooldown: Duration::from_millis(COOLDOWN_MS),
                    ..PoolConfig::default()
                },
            )
            .unwrap();
        let mut table = Interfaces::new(pool);
        for i in 0..N_INTERFACES {
            let id = InterfaceId::new(&interface_id(i)).unwrap();
            table
                .add_interface(InterfaceSpec {
                    id: id.clone(),
                    device_number: i,
                    primary: i == 0,
                    trunk: false,
                    excluded: false,
                    subnets: vec!["10.0.0.0/16".parse().unwrap()],
                    mac: format!("0a:00:00:00:00:{i:02x}").parse().unwrap(),
                    gateways: Vec::new(),
                    routes: vec!["10.0.0.0/16".parse().unwrap()],
                    primary_addresses: vec![],
                    created_at: Timestamp::ZERO,
                })
                .unwrap();
            for address in addresses_of(kind, i) {
                table
                    .add_address(&mut engine, &id, address, Timestamp::ZERO)
                    .unwrap();
            }
        }
        Corral { engine, table }
    }

    fn assign(&mut self, key: &AttachmentKey, now_ms: u64) -> (IpAddr, u32) {
        let assignment = self
            .table
            .assign(
                &mut self.engine,
                key,
                "pod",
                Family::V4,
                Timestamp::from_unix_millis(now_ms),
            )
            .expect("a free address");
        (assignment.addr, assignment.device_number)
    }

    fn unassign(&mut self, key: &AttachmentKey, now_ms: u64) -> (IpAddr, Option<u32>) {
        let out = self
            .table
            .unassign(&mut self.engine, key, Timestamp::from_unix_millis(now_ms))
            .unwrap();
        (out[0].addr, out[0].device_number)
    }

    /// The engine's part of [`Corral::assign`] alone: the allocation by key on the same pool,
    /// without the interface's data.
    fn engine_assign(&mut self, key: &AttachmentKey, now_ms: u64) -> IpAddr {
        let request = Request {
            pool: self.table.pool(),
            owner: "pod",
            key: Some(key),
            lease: None,
        };
        self.engine
            .allocate(
                &request,
                Target::Next(Family::V4),
                Timestamp::from_unix_millis(now_ms),
            )
            .expect("a free address")
            .addr
    }

    /// The engine's part of [`Corral::unassign`] alone.
    fn engine_unassign(&mut self, key: &AttachmentKey, now_ms: u64) -> IpAddr {
        let pool = self.table.pool().clone();
        self.engine
            .release_key_in_pool(&pool, key, Timestamp::from_unix_millis(now_ms))
            .unwrap()[0]
            .addr
    }
}

// ---- ipamd's datastore, faithfully ---------------------------------------------------------

/// The CNI key, as ipamd's `IPAMKey` (three Go strings).
#[derive(Clone, PartialEq, Eq)]
struct IpamKey {
    network_name: Arc<str>,
    container_id: Arc<str>,
    if_name: Arc<str>,
}

/// ipamd's `AddressInfo`: an address, the key holding it (empty when free), and when it was
/// assigned and last unassigned.
struct AddressInfo {
    address: Arc<str>,
    ipam_key: Option<IpamKey>,
    assigned_time_ms: u64,
    unassigned_time_ms: Option<u64>,
}

/// ipamd's `ENI`.
struct Eni {
    #[allow(dead_code)]
    id: String,
    #[allow(dead_code)]
    is_primary: bool,
    device_number: i32,
    /// By the address's dotted-decimal text.
    addresses: HashMap<String, AddressInfo>,
}

/// ipamd's `DataStore`: ENIs by id.
struct IpamdDataStore {
    eni_pool: HashMap<String, Eni>,
    assigned: usize,
}

impl IpamdDataStore {
    fn new(kind: Kind) -> IpamdDataStore {
        let mut eni_pool = HashMap::new();
        for i in 0..N_INTERFACES {
            let mut addresses = HashMap::new();
            for cidr in addresses_of(kind, i) {
                // With prefix delegation ipamd hands out the addresses of each prefix: every
                // one is an entry to scan.
                let IpAddr::V4(network) = cidr.network() else {
                    unreachable!("ipv4 only")
                };
                let first = u32::from(network);
                for value in first..first + (1u32 << (32 - cidr.prefix_len())) {
                    let text = Ipv4Addr::from(value).to_string();
                    addresses.insert(
                        text.clone(),
                        AddressInfo {
                            address: Arc::from(text),
                            ipam_key: None,
                            assigned_time_ms: 0,
                            unassigned_time_ms: None,
                        },
                    );
                }
            }
            eni_pool.insert(
                interface_id(i),
                Eni {
                    id: interface_id(i),
                    is_primary: i == 0,
                    device_number: i as i32,
                    addresses,
                },
            );
        }
        IpamdDataStore {
            eni_pool,
            assigned: 0,
        }
    }

    /// `ENIPool.FindAddressForSandbox`: every address of every ENI, compared by key.
    fn find_address_for_sandbox(&self, key: &IpamKey) -> Option<(&Eni, &AddressInfo)> {
        for eni in self.eni_pool.values() {
            for addr in eni.addresses.values() {
                if addr.ipam_key.as_ref() == Some(key) {
                    return Some((eni, addr));
                }
            }
        }
        None
    }

    fn in_cooling_period(addr: &AddressInfo, now_ms: u64) -> bool {
        addr.unassigned_time_ms
            .is_some_and(|at| now_ms.saturating_sub(at) < COOLDOWN_MS)
    }

    /// `AssignPodIPv4Address`: the key's address if it has one, else the first unassigned
    /// address not in cooldown, ENI by ENI.
    fn assign_pod_ipv4_address(&mut self, key: &IpamKey, now_ms: u64) -> Option<(Arc<str>, i32)> {
        if let Some((eni, addr)) = self.find_address_for_sandbox(key) {
            return Some((addr.address.clone(), eni.device_number));
        }
        for eni in self.eni_pool.values_mut() {
            for addr in eni.addresses.values_mut() {
                if addr.ipam_key.is_none() && !Self::in_cooling_period(addr, now_ms) {
                    addr.ipam_key = Some(key.clone());
                    addr.assigned_time_ms = now_ms;
                    self.assigned += 1;
                    return Some((addr.address.clone(), eni.device_number));
                }
            }
        }
        None
    }

    /// `UnassignPodIPv4Address`: find the key's address, mark it unassigned and cooling.
    fn unassign_pod_ipv4_address(&mut self, key: &IpamKey, now_ms: u64) -> Option<(Arc<str>, i32)> {
        for eni in self.eni_pool.values_mut() {
            for addr in eni.addresses.values_mut() {
                if addr.ipam_key.as_ref() == Some(key) {
                    addr.ipam_key = None;
                    addr.unassigned_time_ms = Some(now_ms);
                    self.assigned -= 1;
                    return Some((addr.address.clone(), eni.device_number));
                }
            }
        }
        None
    }
}

// ---- the benchmark -------------------------------------------------------------------------

fn corral_key(i: u64) -> AttachmentKey {
    AttachmentKey::new("aws-cni", &container_id(i), "eth0").unwrap()
}

fn ipamd_key(i: u64) -> IpamKey {
    IpamKey {
        network_name: Arc::from("aws-cni"),
        container_id: Arc::from(container_id(i)),
        if_name: Arc::from("eth0"),
    }
}

/// The keys that stay assigned at `fill_pct` percent of `capacity`: all, less a seeded
/// random subset.
fn released_during_fill(capacity: usize, fill_pct: usize) -> Vec<u64> {
    let mut order: Vec<u64> = (0..capacity as u64).collect();
    for i in (1..order.len()).rev() {
        let j = (mix(i as u64 ^ 0x5eed) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order.truncate(capacity - capacity * fill_pct / 100);
    order
}

fn capacity(kind: Kind) -> usize {
    let per = match kind {
        Kind::Secondaries => 1,
        Kind::Prefixes => 16,
    };
    (N_INTERFACES * PER_INTERFACE) as usize * per
}

#[derive(Clone, Copy)]
enum Timed {
    Assign,
    Unassign,
}

/// Times batches of assign (or unassign) on one implementation: `assign(k, now)` and
/// `unassign(k, now)` act on churn key `k` of the batch.
fn bench_batches(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    timed: Timed,
    clock: &Cell<u64>,
    mut assign: impl FnMut(usize, u64),
    mut unassign: impl FnMut(usize, u64),
) {
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let now_ms = clock.get();
                let n = BATCH.min((iters - done) as usize);
                let started = Instant::now();
                for k in 0..n {
                    assign(k, now_ms + k as u64 * 1000);
                }
                if let Timed::Assign = timed {
                    total += started.elapsed();
                }
                let now_ms = now_ms + n as u64 * 1000;
                clock.set(now_ms);
                let started = Instant::now();
                for k in 0..n {
                    unassign(k, now_ms);
                }
                if let Timed::Unassign = timed {
                    total += started.elapsed();
                }
                done += n as u64;
            }
            total
        });
    });
}

fn group(c: &mut Criterion, kind: Kind, fill_pct: usize) {
    let capacity = capacity(kind);
    let released = released_during_fill(capacity, fill_pct);

    let mut corral = Corral::new(kind);
    let mut engine_only = Corral::new(kind);
    let mut ipamd = IpamdDataStore::new(kind);
    for i in 0..capacity as u64 {
        corral.assign(&corral_key(i), 0);
        engine_only.assign(&corral_key(i), 0);
        ipamd.assign_pod_ipv4_address(&ipamd_key(i), 0).unwrap();
    }
    for &i in &released {
        corral.unassign(&corral_key(i), 0);
        engine_only.unassign(&corral_key(i), 0);
        ipamd.unassign_pod_ipv4_address(&ipamd_key(i), 0).unwrap();
    }
    let held = capacity - released.len();
    assert_eq!(corral.engine.n_allocations(), held);
    assert_eq!(ipamd.assigned, held);

    let churn: Vec<u64> = (0..BATCH as u64).map(|k| 1_000_000 + k).collect();
    let corral_keys: Vec<AttachmentKey> = churn.iter().map(|&i| corral_key(i)).collect();
    let ipamd_keys: Vec<IpamKey> = churn.iter().map(|&i| ipamd_key(i)).collect();

    let label = match kind {
        Kind::Secondaries => "secondaries",
        Kind::Prefixes => "prefixes28",
    };
    let clock = Cell::new(START_MS);
    let mut group = c.benchmark_group(format!("eni_15x50_{label}_fill{fill_pct}"));
    for timed in [Timed::Assign, Timed::Unassign] {
        let suffix = match timed {
            Timed::Assign => "assign",
            Timed::Unassign => "unassign",
        };
        let corral_cell = RefCell::new(&mut corral);
        bench_batches(
            &mut group,
            &format!("corral_{suffix}"),
            timed,
            &clock,
            |k, now| {
                black_box(corral_cell.borrow_mut().assign(&corral_keys[k], now));
            },
            |k, now| {
                black_box(corral_cell.borrow_mut().unassign(&corral_keys[k], now));
            },
        );
        let engine_cell = RefCell::new(&mut engine_only);
        bench_batches(
            &mut group,
            &format!("engine_{suffix}"),
            timed,
            &clock,
            |k, now| {
                black_box(engine_cell.borrow_mut().engine_assign(&corral_keys[k], now));
            },
            |k, now| {
                black_box(
                    engine_cell
                        .borrow_mut()
                        .engine_unassign(&corral_keys[k], now),
                );
            },
        );
        let ipamd_cell = RefCell::new(&mut ipamd);
        bench_batches(
            &mut group,
            &format!("ipamd_{suffix}"),
            timed,
            &clock,
            |k, now| {
                black_box(
                    ipamd_cell
                        .borrow_mut()
                        .assign_pod_ipv4_address(&ipamd_keys[k], now)
                        .expect("a free address"),
                );
            },
            |k, now| {
                black_box(
                    ipamd_cell
                        .borrow_mut()
                        .unassign_pod_ipv4_address(&ipamd_keys[k], now)
                        .expect("the key's address"),
                );
            },
        );
    }
    group.finish();
    assert_eq!(corral.engine.n_allocations(), held);
    assert_eq!(engine_only.engine.n_allocations(), held);
    assert_eq!(ipamd.assigned, held);
    corral.engine.check_invariants().unwrap();
    engine_only.engine.check_invariants().unwrap();
    corral.table.check(&corral.engine).unwrap();
}

fn groups(c: &mut Criterion) {
    for kind in [Kind::Secondaries, Kind::Prefixes] {
        for fill_pct in [50, 90] {
            group(c, kind, fill_pct);
        }
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = groups
}
criterion::criterion_main!(benches);
