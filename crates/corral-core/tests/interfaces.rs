//! Interface-backed pools: data-driven scripts (`tests/interfaces/*.txt`) with their expected
//! transcripts (`*.out`), and random operation sequences against a reference model.
//!
//! `run` is the only caller of the `Interfaces` API in the scripts. Each command is echoed as
//! `> command`, followed by `= result` or `! error`; after every command the engine's and the
//! table's invariants are checked, and a refused command must leave both exactly as they were.
//! Commands:
//!
//! ```text
//! pool [cooldown=SECS]                       the engine pool "eni" (created by the first command)
//! time SECS                                  the clock
//! iface ID dev=N subnet=CIDR[,CIDR] mac=MAC [gw=IP[,IP]] [routes=CIDR[,CIDR]] [primary] [trunk] [excluded]
//! unface ID [force]                          remove an interface
//! addr ID NET / unaddr ID NET [force]        add / remove a secondary address or a prefix
//! assign v4|v6 NET/CONTAINER/IF              assign by key (owner "pod")
//! unassign NET/CONTAINER/IF
//! of IP                                      the interface data of an allocated address
//! freeable ID
//! needing LIMIT [skip-primary]               interfaces below LIMIT addresses and prefixes
//! removable [warm=N] [min=N] [warm-prefix=N] [min-age=SECS]
//! stats / table
//! ```
//!
//! Run with `UPDATE_EXPECT=1` to rewrite the transcripts after a deliberate change.

use crate::common;

use common::proptest_config;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    Assignment, AttachmentKey, Engine, EngineConfig, Family, InterfaceError, InterfaceId,
    InterfaceSpec, Interfaces, IpNet, PoolConfig, PoolName, RemovalPolicy, Timestamp,
};
use expect_test::expect_file;
use proptest::prelude::*;

fn pool_name() -> PoolName {
    PoolName::new("eni").unwrap()
}

fn key(text: &str) -> AttachmentKey {
    let parts: Vec<&str> = text.split('/').collect();
    AttachmentKey::new(parts[0], parts[1], parts[2]).expect("script error: key")
}

fn id(text: &str) -> InterfaceId {
    InterfaceId::new(text).expect("script error: interface id")
}

fn nets(text: &str) -> Vec<IpNet> {
    text.split(',')
        .map(|n| n.parse().expect("script error: cidr"))
        .collect()
}

fn describe(assignment: &Assignment) -> String {
    let mut out = format!(
        "{} gen={} on {} dev={} mac={} subnet={}",
        assignment.addr,
        assignment.generation,
        assignment.interface,
        assignment.device_number,
        assignment.mac,
        assignment.subnet
    );
    if let Some(gateway) = assignment.gateway {
        write!(out, " gw={gateway}").unwrap();
    }
    let routes: Vec<String> = assignment.routes.iter().map(ToString::to_string).collect();
    write!(out, " routes=[{}]", routes.join(",")).unwrap();
    if assignment.existing {
        out.push_str(" (existing)");
    }
    out
}

fn list(nets: &[IpNet]) -> String {
    let texts: Vec<String> = nets.iter().map(ToString::to_string).collect();
    format!("[{}]", texts.join(" "))
}

/// What a removal took out of the pool and released.
fn removed(removal: &corral_core::Removal) -> String {
    let released: Vec<String> = removal
        .released
        .iter()
        .map(|r| r.addr.to_string())
        .collect();
    format!(
        "removed {} released [{}]",
        list(&removal.addresses),
        released.join(" ")
    )
}

/// Everything a refused command must leave as it was.
fn state(engine: &Engine, table: &Interfaces) -> String {
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{}",
        engine.dump(),
        engine.ranges(&pool_name()).ok(),
        engine.cooling(&pool_name()).ok(),
        table.interfaces().collect::<Vec<_>>(),
        engine.next_generation(),
    )
}

struct Script {
    engine: Engine,
    table: Interfaces,
    now: Timestamp,
}

impl Script {
    fn new() -> Script {
        let mut engine = Engine::new(EngineConfig::default());
        engine
            .add_pool(&pool_name(), PoolConfig::default())
            .unwrap();
        Script {
            engine,
            table: Interfaces::new(pool_name()),
            now: Timestamp::ZERO,
        }
    }

    fn command(&mut self, words: &[&str]) -> Result<String, InterfaceError> {
        let (engine, table, now) = (&mut self.engine, &mut self.table, self.now);
        let flag = |name: &str| words.contains(&name);
        let option = |name: &str| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(name).and_then(|w| w.strip_prefix('=')))
        };
        match words[0] {
            "pool" => {
                let mut config = PoolConfig::default();
                if let Some(secs) = option("cooldown") {
                    config.cooldown = Duration::from_secs(secs.parse().unwrap());
                }
                engine.set_pool_config(&pool_name(), config)?;
                Ok("ok".into())
            }
            "time" => {
                self.now = Timestamp::from_unix_millis(words[1].parse::<u64>().unwrap() * 1000);
                Ok(format!("now {}", self.now))
            }
            "iface" => {
                let spec = InterfaceSpec {
                    id: InterfaceId::new(words[1])?,
                    device_number: option("dev").unwrap().parse().unwrap(),
                    primary: flag("primary"),
                    trunk: flag("trunk"),
                    excluded: flag("excluded"),
                    subnets: nets(option("subnet").unwrap()),
                    mac: option("mac").unwrap_or("0a:00:00:00:00:01").parse()?,
                    gateways: option("gw")
                        .map(|text| text.split(',').map(|g| g.parse().unwrap()).collect())
                        .unwrap_or_default(),
                    routes: option("routes").map(nets).unwrap_or_default(),
                    primary_addresses: vec![],
                    created_at: now,
                };
                table.add_interface(spec)?;
                Ok("ok".into())
            }
            "unface" => {
                let removal = table.remove_interface(engine, &id(words[1]), flag("force"), now)?;
                Ok(removed(&removal))
            }
            "addr" => {
                table.add_address(engine, &id(words[1]), words[2].parse().unwrap(), now)?;
                Ok("ok".into())
            }
            "unaddr" => {
                let removal = table.remove_address(
                    engine,
                    &id(words[1]),
                    words[2].parse().unwrap(),
                    flag("force"),
                    now,
                )?;
                Ok(removed(&removal))
            }
            "assign" => {
                let family = match words[1] {
                    "v4" => Family::V4,
                    "v6" => Family::V6,
                    other => panic!("script error: family {other}"),
                };
                let assignment = table.assign(engine, &key(words[2]), "pod", family, now)?;
                Ok(describe(&assignment))
            }
            "unassign" => {
                let out = table.unassign(engine, &key(words[1]), now)?;
                let texts: Vec<String> = out
                    .iter()
                    .map(|u| match (&u.interface, u.device_number) {
                        (Some(interface), Some(device)) => format!(
                            "{} gen={} from {interface} dev={device}",
                            u.addr, u.released.generation
                        ),
                        _ => format!("{} gen={} from no interface", u.addr, u.released.generation),
                    })
                    .collect();
                Ok(format!("[{}]", texts.join(", ")))
            }
            "of" => Ok(
                match table.assignment_of(engine, words[1].parse::<IpAddr>().unwrap()) {
                    Some(assignment) => describe(&assignment),
                    None => "none".into(),
                },
            ),
            "freeable" => Ok(list(&table.freeable(engine, &id(words[1]), now)?)),
            "needing" => {
                let limit: usize = words[1].parse().unwrap();
                let found: Vec<String> = table
                    .needing_addresses(&|_| limit, flag("skip-primary"))
                    .iter()
                    .map(|spec| spec.id.to_string())
                    .collect();
                Ok(format!("[{}]", found.join(" ")))
            }
            "removable" => {
                let number = |name: &str| option(name).map_or(0, |n| n.parse().unwrap());
                let policy = RemovalPolicy {
                    warm_ip_target: number("warm"),
                    minimum_ip_target: number("min"),
                    warm_prefix_target: number("warm-prefix"),
                    min_age: option("min-age").map_or(RemovalPolicy::DEFAULT_MIN_AGE, |s| {
                        Duration::from_secs(s.parse().unwrap())
                    }),
                };
                Ok(match table.removable(engine, &policy, now) {
                    Some(interface) => interface.to_string(),
                    None => "none".into(),
                })
            }
            "stats" => {
                let stats = table.stats(engine, now)?;
                let mut out = format!(
                    "total={} assigned={} cooling={}",
                    stats.total, stats.assigned, stats.cooling
                );
                for s in &stats.interfaces {
                    write!(
                        out,
                        "\n    {} dev={}{}{} total={} assigned={} cooling={} addresses={} prefixes={}",
                        s.id,
                        s.device_number,
                        if s.primary { " primary" } else { "" },
                        if s.trunk { " trunk" } else { "" },
                        s.total,
                        s.assigned,
                        s.cooling,
                        s.addresses,
                        s.prefixes
                    )
                    .unwrap();
                }
                Ok(out)
            }
            "table" => {
                let mut out = String::new();
                for (spec, addresses) in table.interfaces() {
                    write!(
                        out,
                        "\n    {} dev={} mac={} {}",
                        spec.id,
                        spec.device_number,
                        spec.mac,
                        list(addresses)
                    )
                    .unwrap();
                }
                Ok(format!("{} interfaces{out}", table.len()))
            }
            other => panic!("script error: unknown command {other}"),
        }
    }
}

/// Runs a script file and compares its transcript with the `.out` file beside it.
fn run(script: &str) -> String {
    let mut harness = Script::new();
    let mut out = String::new();
    for line in script.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            if line.starts_with('#') {
                writeln!(out, "{line}").unwrap();
            }
            continue;
        }
        writeln!(out, "> {line}").unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        let before = state(&harness.engine, &harness.table);
        match harness.command(&words) {
            Ok(text) => writeln!(out, "= {text}").unwrap(),
            Err(err) => {
                let retry = if err.is_retryable() {
                    " (retryable)"
                } else {
                    ""
                };
                writeln!(out, "! {err}{retry}").unwrap();
                assert_eq!(
                    state(&harness.engine, &harness.table),
                    before,
                    "`{line}` was refused but changed the state"
                );
            }
        }
        if let Err(problem) = harness.engine.check_invariants() {
            panic!("after `{line}`: engine invariants broken: {problem}");
        }
        if let Err(problem) = harness.table.check(&harness.engine) {
            panic!("after `{line}`: table invariants broken: {problem}");
        }
    }
    out
}

macro_rules! script_test {
    ($name:ident) => {
        #[test]
        fn $name() {
            let script = include_str!(concat!("interfaces/", stringify!($name), ".txt"));
            expect_file![concat!("interfaces/", stringify!($name), ".out")].assert_eq(&run(script));
        }
    };
}

script_test!(secondaries);
script_test!(prefixes);
script_test!(ipv6_prefix);
script_test!(errors);
script_test!(lifecycle);
script_test!(cooldown);
script_test!(removal);

/// Odd subnets and addresses at the edges of the address space: each is accepted and handed
/// out, or refused with a typed error, never a panic, and the table agrees with the engine.
#[test]
fn odd_subnets_give_typed_errors_or_work() {
    let cases = [
        ("10.0.0.0/32", "10.0.0.0/32"),
        ("10.0.0.0/31", "10.0.0.1/32"),
        ("10.0.0.0/31", "10.0.0.0/32"),
        ("0.0.0.0/0", "255.255.255.255/32"),
        ("0.0.0.0/0", "255.255.255.240/28"),
        ("0.0.0.0/0", "0.0.0.0/28"),
        ("0.0.0.0/0", "0.0.0.16/28"),
        ("10.0.0.0/28", "10.0.0.0/28"),
        ("10.0.0.0/20", "10.0.15.224/28"),
        ("10.0.0.0/20", "10.0.15.240/28"),
        ("::/0", "ffff:ffff:ffff:ffff:ffff::/80"),
        ("::/0", "::/80"),
        ("2600::/80", "2600::/80"),
        ("2600::/128", "2600::/128"),
        ("::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"),
    ];
    let mut out = String::new();
    for (subnet, address) in cases {
        let mut harness = Script::new();
        let family = if subnet.contains(':') { "v6" } else { "v4" };
        let mut lines = vec![
            format!("iface eni-0 dev=0 primary subnet={subnet}"),
            format!("addr eni-0 {address}"),
        ];
        for _ in 0..3 {
            lines.push(format!("assign {family} net/c1/eth0"));
            lines.push("unassign net/c1/eth0".to_owned());
        }
        lines.push("stats".to_owned());
        writeln!(out, "{subnet} {address}:").unwrap();
        for line in &lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            let result = match harness.command(&words) {
                Ok(text) => format!("= {}", text.lines().next().unwrap_or_default()),
                Err(err) => format!("! {err}"),
            };
            if !line.starts_with("iface") {
                writeln!(out, "  {} {result}", words[0]).unwrap();
            }
            harness.engine.check_invariants().unwrap();
            harness.table.check(&harness.engine).unwrap();
        }
    }
    expect_test::expect_file!["interfaces/odd_subnets.out"].assert_eq(&out);
}

// ---- random sequences against a reference model ---------------------------------------------

/// What the model knows: interfaces with their addresses, who holds which address, and when
/// each released address was released.
#[derive(Default)]
struct Model {
    interfaces: BTreeMap<u32, Vec<IpNet>>,
    held: BTreeMap<String, IpAddr>,
    released: BTreeMap<IpAddr, Timestamp>,
}

/// The pool's cooldown (the default, AWS's).
const COOLDOWN: Duration = PoolConfig::DEFAULT_COOLDOWN;

impl Model {
    /// Every address of every interface.
    fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.interfaces
            .values()
            .flatten()
            .flat_map(|net| net.hosts_and_bounds())
    }

    fn is_held(&self, addr: IpAddr) -> bool {
        self.held.values().any(|held| *held == addr)
    }

    /// Released less than the cooldown ago, and not held again.
    fn is_cooling(&self, addr: IpAddr, now: Timestamp) -> bool {
        self.released
            .get(&addr)
            .is_some_and(|at| now < at.saturating_add(COOLDOWN))
            && !self.is_held(addr)
    }

    fn n_held_in(&self, net: &IpNet) -> usize {
        self.held
            .values()
            .filter(|addr| net.contains(*addr))
            .count()
    }

    fn n_cooling_in(&self, net: &IpNet, now: Timestamp) -> usize {
        net.hosts_and_bounds()
            .filter(|addr| self.is_cooling(*addr, now))
            .count()
    }

    /// Forgets the cooldowns of addresses that left with `net` (a forced removal).
    fn forget(&mut self, net: &IpNet) {
        self.released.retain(|addr, _| !net.contains(addr));
        self.held.retain(|_, addr| !net.contains(&*addr));
    }
}

/// Every address of a network, its first and last included (an interface prefix hands out
/// all of them).
trait AllAddresses {
    fn hosts_and_bounds(&self) -> Box<dyn Iterator<Item = IpAddr>>;
}

impl AllAddresses for IpNet {
    fn hosts_and_bounds(&self) -> Box<dyn Iterator<Item = IpAddr>> {
        match self {
            IpNet::V4(net) => {
                let (first, last) = (u32::from(net.network()), u32::from(net.broadcast()));
                Box::new((first..=last).map(|v| IpAddr::from(std::net::Ipv4Addr::from(v))))
            }
            IpNet::V6(net) => {
                let (first, last) = (u128::from(net.network()), u128::from(net.broadcast()));
                Box::new((first..=last).map(|v| IpAddr::from(std::net::Ipv6Addr::from(v))))
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    AddInterface(u32),
    RemoveInterface(u32, bool),
    AddAddress(u32, u8, bool),
    /// Device, slot, prefix, force: any address of any kind on any interface.
    RemoveAddress(u32, u8, bool, bool),
    /// Index into the model's addresses (on their own interface), force: removals that can
    /// meet a held or cooling address often.
    RemoveExisting(u8, bool),
    Assign(u8),
    Unassign(u8),
    Advance(u8),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..4u32).prop_map(Op::AddInterface),
        1 => (0..4u32, any::<bool>()).prop_map(|(d, f)| Op::RemoveInterface(d, f)),
        // Mostly single addresses, so that the pool fills up and cooling addresses are handed
        // out (the cooldown order is checked then).
        3 => (0..4u32, 0..12u8, prop::bool::weighted(0.2))
            .prop_map(|(d, s, p)| Op::AddAddress(d, s, p)),
        1 => (0..4u32, 0..12u8, any::<bool>(), any::<bool>())
            .prop_map(|(d, s, p, f)| Op::RemoveAddress(d, s, p, f)),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(i, f)| Op::RemoveExisting(i, f)),
        5 => (0..24u8).prop_map(Op::Assign),
        3 => (0..24u8).prop_map(Op::Unassign),
        2 => (0..20u8).prop_map(Op::Advance),
    ]
}

fn interface_id(device: u32) -> InterfaceId {
    id(&format!("eni-{device}"))
}

/// Slot `s` of the subnet: a /32 at 10.0.0.(16 + s) or a /28 at 10.0.(1 + s).16; slots of
/// different kinds never overlap, and the same slot on two interfaces collides.
fn slot_address(slot: u8, prefix: bool) -> IpNet {
    if prefix {
        format!("10.0.{}.16/28", 1 + slot).parse().unwrap()
    } else {
        format!("10.0.0.{}/32", 16 + slot).parse().unwrap()
    }
}

fn run_ops(ops: &[Op]) {
    let mut harness = Script::new();
    let mut model = Model::default();
    for op in ops {
        let before = state(&harness.engine, &harness.table);
        let now = harness.now;
        let (engine, table) = (&mut harness.engine, &mut harness.table);
        // A removal of an existing address is a removal of that device, slot and kind.
        let existing: Vec<(u32, IpNet)> = model
            .interfaces
            .iter()
            .flat_map(|(device, addresses)| addresses.iter().map(|a| (*device, *a)))
            .collect();
        let op = match op {
            Op::RemoveExisting(index, force) if !existing.is_empty() => {
                let (device, address) = existing[*index as usize % existing.len()];
                let prefix = address.prefix_len() == 28;
                let slot = (0..12u8)
                    .find(|slot| slot_address(*slot, prefix) == address)
                    .unwrap();
                &Op::RemoveAddress(device, slot, prefix, *force)
            }
            other => other,
        };
        let result: Result<(), InterfaceError> = match op {
            Op::AddInterface(device) => table
                .add_interface(InterfaceSpec {
                    id: interface_id(*device),
                    device_number: *device,
                    primary: *device == 0,
                    trunk: false,
                    excluded: false,
                    subnets: vec!["10.0.0.0/16".parse().unwrap()],
                    mac: format!("0a:00:00:00:00:{device:02x}").parse().unwrap(),
                    gateways: Vec::new(),
                    routes: Vec::new(),
                    primary_addresses: vec![],
                    created_at: now,
                })
                .map(|()| {
                    model.interfaces.insert(*device, Vec::new());
                }),
            Op::RemoveInterface(device, force) => {
                let result = table.remove_interface(engine, &interface_id(*device), *force, now);
                if let Some(addresses) = model.interfaces.get(device) {
                    let held: usize = addresses.iter().map(|a| model.n_held_in(a)).sum();
                    let cooling: usize = addresses.iter().map(|a| model.n_cooling_in(a, now)).sum();
                    let refused = *device == 0 || held > 0 || cooling > 0;
                    assert_eq!(
                        result.is_err(),
                        !*force && refused,
                        "{op:?} with {held} held, {cooling} cooling: {result:?}"
                    );
                    if let (Err(InterfaceError::InterfaceCooling { n_cooling, .. }), false) =
                        (&result, *device == 0 || held > 0)
                    {
                        assert_eq!(*n_cooling as usize, cooling);
                    }
                } else {
                    assert!(result.is_err(), "{op:?} removed an unknown interface");
                }
                result.map(|removal| {
                    let gone = model.interfaces.remove(device).unwrap();
                    assert_eq!(removal.addresses, gone);
                    for released in &removal.released {
                        assert!(*force, "an unforced removal released {}", released.addr);
                    }
                    for net in &gone {
                        model.forget(net);
                    }
                })
            }
            Op::AddAddress(device, slot, prefix) => {
                let address = slot_address(*slot, *prefix);
                table
                    .add_address(engine, &interface_id(*device), address, now)
                    .map(|()| {
                        let addresses = model.interfaces.get_mut(device).unwrap();
                        addresses.push(address);
                        addresses.sort();
                    })
            }
            Op::RemoveAddress(device, slot, prefix, force) => {
                let address = slot_address(*slot, *prefix);
                let result =
                    table.remove_address(engine, &interface_id(*device), address, *force, now);
                let known = model
                    .interfaces
                    .get(device)
                    .is_some_and(|addresses| addresses.contains(&address));
                if known {
                    let held = model.n_held_in(&address);
                    let cooling = model.n_cooling_in(&address, now);
                    match &result {
                        Ok(_) => assert!(*force || (held == 0 && cooling == 0)),
                        Err(InterfaceError::AddressInUse { n_allocated, .. }) => {
                            assert!(!*force);
                            assert_eq!(*n_allocated as usize, held);
                        }
                        Err(InterfaceError::AddressCooling { n_cooling, .. }) => {
                            assert!(!*force && held == 0);
                            assert_eq!(*n_cooling as usize, cooling);
                        }
                        Err(err) => panic!("{op:?} refused: {err}"),
                    }
                } else {
                    assert!(result.is_err(), "{op:?} removed an unknown address");
                }
                result.map(|removal| {
                    model
                        .interfaces
                        .get_mut(device)
                        .unwrap()
                        .retain(|a| *a != address);
                    for released in &removal.released {
                        assert!(*force);
                        assert!(address.contains(&released.addr));
                    }
                    model.forget(&address);
                })
            }
            Op::Assign(n) => {
                let name = format!("c{n}");
                table
                    .assign(
                        engine,
                        &key(&format!("net/{name}/eth0")),
                        "pod",
                        Family::V4,
                        now,
                    )
                    .map(|assignment| {
                        if let Some(previous) = model.held.get(&name) {
                            assert!(assignment.existing);
                            assert_eq!(*previous, assignment.addr);
                            return;
                        }
                        assert!(!assignment.existing);
                        assert!(
                            !model.is_held(assignment.addr),
                            "{} assigned twice",
                            assignment.addr
                        );
                        let addresses = &model.interfaces[&assignment.device_number];
                        assert!(
                            addresses.iter().any(|a| a.contains(&assignment.addr)),
                            "{} is not on interface {}",
                            assignment.addr,
                            assignment.interface
                        );
                        // Cooldown order: a cooling address only when nothing else is free,
                        // and then the one released first.
                        if model.is_cooling(assignment.addr, now) {
                            let free: Vec<IpAddr> = model
                                .addresses()
                                .filter(|a| !model.is_held(*a) && !model.is_cooling(*a, now))
                                .collect();
                            assert!(
                                free.is_empty(),
                                "cooling {} handed out while {free:?} were free",
                                assignment.addr
                            );
                            let oldest = model
                                .addresses()
                                .filter(|a| model.is_cooling(*a, now))
                                .map(|a| model.released[&a])
                                .min();
                            assert_eq!(
                                Some(model.released[&assignment.addr]),
                                oldest,
                                "{} is not the longest cooling",
                                assignment.addr
                            );
                        }
                        model.held.insert(name, assignment.addr);
                    })
            }
            Op::Unassign(n) => {
                let name = format!("c{n}");
                table
                    .unassign(engine, &key(&format!("net/{name}/eth0")), now)
                    .map(|out| {
                        let expected: Vec<IpAddr> = model.held.remove(&name).into_iter().collect();
                        let got: Vec<IpAddr> = out.iter().map(|u| u.addr).collect();
                        assert_eq!(got, expected);
                        for addr in got {
                            model.released.insert(addr, now);
                        }
                    })
            }
            Op::Advance(secs) => {
                harness.now = now.saturating_add(Duration::from_secs(u64::from(*secs)));
                Ok(())
            }
            Op::RemoveExisting(..) => Ok(()),
        };
        match result {
            Err(InterfaceError::Exhausted { .. }) => {
                let capacity = model.addresses().count();
                assert_eq!(model.held.len(), capacity, "exhausted with free addresses");
                assert_eq!(state(&harness.engine, &harness.table), before);
            }
            Err(_) => assert_eq!(
                state(&harness.engine, &harness.table),
                before,
                "{op:?} was refused but changed the state"
            ),
            Ok(()) => {}
        }
        harness.engine.check_invariants().unwrap();
        harness.table.check(&harness.engine).unwrap();
        // Every held address lies on an interface of the pool, and no address is held twice.
        let distinct: BTreeSet<IpAddr> = model.held.values().copied().collect();
        assert_eq!(distinct.len(), model.held.len());
        for addr in model.held.values() {
            let assignment = harness
                .table
                .assignment_of(&harness.engine, *addr)
                .expect("a held address is on an interface");
            assert!(
                model.interfaces[&assignment.device_number]
                    .iter()
                    .any(|a| a.contains(addr))
            );
        }
        assert_eq!(harness.engine.n_allocations(), model.held.len());
        // The counts agree with the model, cooling addresses included.
        let stats = harness.table.stats(&harness.engine, harness.now).unwrap();
        let cooling = model
            .addresses()
            .filter(|a| model.is_cooling(*a, harness.now))
            .count();
        assert_eq!(
            (stats.assigned as usize, stats.cooling as usize),
            (model.held.len(), cooling)
        );
        let model_interfaces: Vec<(u32, Vec<IpNet>)> = model
            .interfaces
            .iter()
            .map(|(d, a)| (*d, a.clone()))
            .collect();
        let table_interfaces: Vec<(u32, Vec<IpNet>)> = harness
            .table
            .interfaces()
            .map(|(spec, addresses)| (spec.device_number, addresses.to_vec()))
            .collect();
        assert_eq!(table_interfaces, model_interfaces);
    }
}

proptest! {
    #![proptest_config(proptest_config(512))]

    /// Random interface operations agree with the model after every step: an address is never
    /// assigned twice, an assigned address is always on an interface of the pool, a refusal
    /// changes nothing, and the engine's and the table's invariants hold.
    #[test]
    fn random_interface_operations_agree_with_the_model(
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        run_ops(&ops);
    }
}
