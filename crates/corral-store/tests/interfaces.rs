//! Interface-backed pools in a real SQLite store: interfaces, assignments and cooling
//! addresses survive a reopen, the cooldown is still enforced after one, a partial build
//! accepts interface ranges like any range, and checkpoints carry interfaces.

use crate::common;

use common::{attached, one_pool};

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Family, InterfaceId, InterfaceSpec, InterfaceStats,
    Interfaces, IpNet, PoolName, Timestamp,
};
use corral_store::{
    Need, PoolSpec, RangeSource, ScopeConfig, SqliteStore, Store, StoreError, StoredAllocation,
    Txn, build_engine, export_checkpoint, import_checkpoint, restore_interfaces, save_engine,
};

const SCOPE: &str = "node";
const T0: u64 = 1_700_000_000_000;

fn at(secs_after_t0: u64) -> Timestamp {
    Timestamp::from_unix_millis(T0 + secs_after_t0 * 1000)
}

fn pool() -> PoolName {
    PoolName::new("eni").unwrap()
}

fn key(name: &str) -> AttachmentKey {
    AttachmentKey::new("aws-cni", name, "eth0").unwrap()
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn spec(id: &str, device_number: u32, created_at: Timestamp) -> InterfaceSpec {
    InterfaceSpec {
        id: InterfaceId::new(id).unwrap(),
        device_number,
        primary: device_number == 0,
        trunk: false,
        excluded: false,
        subnets: vec![net("10.0.0.0/20"), net("2600:1f14:abc:de00::/64")],
        mac: format!("0a:00:00:00:00:{device_number:02x}")
            .parse()
            .unwrap(),
        gateways: vec!["fe80::1".parse().unwrap()],
        routes: vec![net("10.0.0.0/16")],
        primary_addresses: vec![],
        created_at,
    }
}

/// The agent's part, reduced to what the store needs: the node scope's configuration, its
/// engine and the interface table, each change committed with its rows.
struct Node {
    store: SqliteStore,
    config: ScopeConfig,
    engine: Engine,
    table: Interfaces,
}

/// The scope's engine built in full under `config`, and whether the stored state fitted it.
fn build_full(txn: &mut impl Txn, config: &ScopeConfig) -> (Engine, bool) {
    build_engine(txn, SCOPE, config, EngineConfig::default(), Need::Full).unwrap()
}

impl Node {
    /// Opens the state directory and restores everything, as an agent does at start.
    fn open(dir: &Path) -> Node {
        let mut store = SqliteStore::open(dir).unwrap();
        let mut txn = store.begin().unwrap();
        let config = txn
            .stored_config(SCOPE)
            .unwrap()
            .unwrap_or_else(|| one_pool(&pool(), &[], Duration::from_secs(30)));
        let (engine, full) = build_full(&mut txn, &config);
        assert!(full);
        let mut tables = restore_interfaces(&config, &engine).unwrap();
        let table = tables.pop().unwrap_or_else(|| Interfaces::new(pool()));
        assert!(tables.is_empty());
        txn.finish().unwrap();
        engine.check_invariants().unwrap();
        table.check(&engine).unwrap();
        Node {
            store,
            config,
            engine,
            table,
        }
    }

    /// Commits the configuration and engine state after a change, with the rows it touched.
    fn commit(&mut self, put: &[StoredAllocation], deleted: &[IpAddr]) {
        self.config.pools[0].set_interfaces(&self.table).unwrap();
        let mut txn = self.store.begin().unwrap();
        for row in put {
            txn.put_allocation(SCOPE, row).unwrap();
        }
        for addr in deleted {
            txn.delete_allocation(SCOPE, *addr).unwrap();
        }
        save_engine(&mut txn, SCOPE, &self.config, &self.engine).unwrap();
        txn.commit().unwrap();
    }

    /// [`Node::open`], then interface `eni-0a` (device 0) added at t0 holding `addresses`.
    fn open_with_eni(dir: &Path, addresses: &[&str]) -> Node {
        let mut node = Node::open(dir);
        node.add_interface(spec("eni-0a", 0, at(0)), addresses, at(0));
        node
    }

    fn add_interface(&mut self, spec: InterfaceSpec, addresses: &[&str], now: Timestamp) {
        let id = spec.id.clone();
        self.table.add_interface(spec).unwrap();
        for address in addresses {
            self.table
                .add_address(&mut self.engine, &id, net(address), now)
                .unwrap();
        }
        self.commit(&[], &[]);
    }

    fn assign(&mut self, name: &str, family: Family, now: Timestamp) -> IpAddr {
        let assignment = self
            .table
            .assign(&mut self.engine, &key(name), name, family, now)
            .unwrap();
        assert!(!assignment.existing);
        self.commit(
            &[attached(
                pool(),
                (assignment.addr, assignment.generation),
                name.to_owned(),
                key(name),
            )],
            &[],
        );
        assignment.addr
    }

    fn unassign(&mut self, name: &str, now: Timestamp) -> Vec<IpAddr> {
        let out = self
            .table
            .unassign(&mut self.engine, &key(name), now)
            .unwrap();
        let addrs: Vec<IpAddr> = out.iter().map(|u| u.addr).collect();
        self.commit(&[], &addrs);
        addrs
    }

    fn listing(&self) -> Vec<(InterfaceSpec, Vec<IpNet>)> {
        self.table
            .interfaces()
            .map(|(spec, addresses)| (spec.clone(), addresses.to_vec()))
            .collect()
    }

    fn stats(&self, now: Timestamp) -> InterfaceStats {
        self.table.stats(&self.engine, now).unwrap()
    }
}

#[test]
fn interfaces_assignments_and_cooling_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::open_with_eni(
        dir.path(),
        &[
            "10.0.0.11/32",
            "10.0.0.12/32",
            "2600:1f14:abc:de00:1234::/80",
        ],
    );
    node.add_interface(spec("eni-1b", 1, at(1)), &["10.0.1.16/28"], at(1));
    let a = node.assign("a", Family::V4, at(2));
    let b = node.assign("b", Family::V4, at(2));
    let c = node.assign("c", Family::V4, at(2));
    let v6 = node.assign("a", Family::V6, at(2));
    assert_eq!(node.unassign("b", at(3)), vec![b]);
    let listing = node.listing();
    let stats = node.stats(at(4));
    assert_eq!((stats.assigned, stats.cooling), (3, 1));
    drop(node);

    let mut node = Node::open(dir.path());
    assert_eq!(node.listing(), listing);
    assert_eq!(node.stats(at(4)), stats);
    assert_eq!(node.engine.cooldown(b), Some((pool(), at(3))));
    // The same keys get the same addresses with their interfaces' data.
    for (name, family, addr, device) in [
        ("a", Family::V4, a, 0),
        ("c", Family::V4, c, 1),
        ("a", Family::V6, v6, 0),
    ] {
        let again = node
            .table
            .assign(&mut node.engine, &key(name), name, family, at(5))
            .unwrap();
        assert!(again.existing);
        assert_eq!((again.addr, again.device_number), (addr, device));
    }
    let of_c = node.table.assignment_of(&node.engine, c).unwrap();
    assert_eq!(of_c.interface.as_str(), "eni-1b");
    assert_eq!(of_c.gateway, Some("10.0.0.1".parse().unwrap()));

    // The configuration holds the interface ranges as ranges of source `interface`.
    let sources: Vec<(String, RangeSource)> = node.config.pools[0]
        .ranges
        .iter()
        .map(|r| (r.range.clone(), r.source))
        .collect();
    assert_eq!(sources.len(), 4);
    assert!(sources.iter().all(|(_, s)| *s == RangeSource::Interface));

    // Removing an interface removes its ranges from the configuration, and stays removed.
    let removal = node
        .table
        .remove_interface(
            &mut node.engine,
            &InterfaceId::new("eni-1b").unwrap(),
            true,
            at(6),
        )
        .unwrap();
    let released: Vec<IpAddr> = removal.released.iter().map(|r| r.addr).collect();
    assert_eq!(released, vec![c]);
    node.commit(&[], &released);
    let listing = node.listing();
    drop(node);
    let node = Node::open(dir.path());
    assert_eq!(node.listing(), listing);
    assert_eq!(node.config.pools[0].ranges.len(), 3);
    assert!(node.engine.lookup(c).is_none());
}

/// Regression (review of issue 13): a pool whose last interface was removed was no longer
/// an interface pool after a reopen (no table came back), so it would have taken plain
/// ranges. The pool stays interface-backed, with an empty table.
#[test]
fn an_interface_pool_without_interfaces_stays_one_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::open(dir.path());
    node.add_interface(spec("eni-1b", 1, at(0)), &["10.0.1.16/28"], at(0));
    node.table
        .remove_interface(
            &mut node.engine,
            &InterfaceId::new("eni-1b").unwrap(),
            false,
            at(1),
        )
        .unwrap();
    node.commit(&[], &[]);
    assert!(node.config.pools[0].interfaces.is_empty());
    assert!(node.config.pools[0].ranges.is_empty());
    assert!(node.config.pools[0].is_interface_pool());
    drop(node);

    let mut store = SqliteStore::open(dir.path()).unwrap();
    let mut txn = store.begin().unwrap();
    let config = txn.stored_config(SCOPE).unwrap().unwrap();
    let (engine, _) = build_full(&mut txn, &config);
    txn.finish().unwrap();
    let tables = restore_interfaces(&config, &engine).unwrap();
    assert_eq!(tables.len(), 1, "the pool is still interface-backed");
    assert_eq!(tables[0].pool(), &pool());
    assert!(tables[0].is_empty());
    tables[0].check(&engine).unwrap();
}

/// The cooldown is not forgotten by a restart (ipamd keeps it in memory only): a released
/// address is not handed out again before its cooldown ends while another is free.
#[test]
fn cooldown_is_enforced_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::open_with_eni(dir.path(), &["10.0.0.11/32", "10.0.0.12/32"]);
    let first = node.assign("a", Family::V4, at(1));
    let second = node.assign("b", Family::V4, at(1));
    assert_eq!(first.to_string(), "10.0.0.11");
    // `second` cools from 10 s to 40 s, `first` from 41 s to 71 s.
    node.unassign("b", at(10));
    node.unassign("a", at(41));
    drop(node);

    // At 42 s both are free, `first` still cooling. Next-fit alone would wrap round to
    // `first` (its range comes after the last one handed out); the cooldown says `second`.
    let mut node = Node::open(dir.path());
    node.engine.advance(at(42));
    assert_eq!(node.engine.cooldown(first), Some((pool(), at(41))));
    assert_eq!(node.engine.cooldown(second), None);
    assert_eq!(node.assign("c", Family::V4, at(42)), second);
    drop(node);

    // Still cooling after another reopen; with nothing else free it is handed out rather
    // than failing (and its cooldown ends).
    let mut node = Node::open(dir.path());
    assert_eq!(node.engine.cooldown(first), Some((pool(), at(41))));
    assert_eq!(node.assign("d", Family::V4, at(43)), first);
    drop(node);
    let node = Node::open(dir.path());
    assert_eq!(node.engine.cooldown(first), None);
    assert_eq!(node.stats(at(44)).assigned, 2);
}

/// A short-lived process's partial build reads interface ranges as any other range.
#[test]
fn a_partial_build_accepts_interface_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::open_with_eni(dir.path(), &["10.0.0.32/28"]);
    let a = node.assign("a", Family::V4, at(1));
    node.unassign("a", at(2));
    let config = node.config.clone();
    drop(node);

    let mut store = SqliteStore::open(dir.path()).unwrap();
    let mut txn = store.begin().unwrap();
    let keys = [key("b")];
    let (mut engine, full) = build_engine(
        &mut txn,
        SCOPE,
        &config,
        EngineConfig::default(),
        Need::Partial {
            keys: &keys,
            addrs: &[],
            now: at(3),
        },
    )
    .unwrap();
    assert!(!full, "the stored state fits: a partial build");
    let table = restore_interfaces(&config, &engine).unwrap().pop().unwrap();
    let assignment = table
        .assign(&mut engine, &key("b"), "b", Family::V4, at(3))
        .unwrap();
    assert_ne!(assignment.addr, a, "the cooling address waits");
    assert_eq!(assignment.interface.as_str(), "eni-0a");
    engine.check_invariants().unwrap();
    txn.finish().unwrap();
}

#[test]
fn checkpoints_carry_interfaces() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::open_with_eni(dir.path(), &["10.0.0.11/32", "10.0.0.32/28"]);
    let a = node.assign("a", Family::V4, at(1));
    let b = node.assign("b", Family::V4, at(1));
    node.unassign("b", at(2));
    let listing = node.listing();
    let mut txn = node.store.begin().unwrap();
    let checkpoint = export_checkpoint(&mut txn).unwrap();
    txn.finish().unwrap();
    drop(node);
    let text = serde_json::to_string_pretty(&checkpoint).unwrap();
    assert!(text.contains("\"interfaces\""));
    assert!(text.contains("\"source\": \"interface\""));

    let other = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(other.path()).unwrap();
    let mut txn = store.begin().unwrap();
    import_checkpoint(&mut txn, &serde_json::from_str(&text).unwrap()).unwrap();
    txn.commit().unwrap();
    drop(store);
    let node = Node::open(other.path());
    assert_eq!(node.listing(), listing);
    assert_eq!(
        node.table
            .assignment_of(&node.engine, a)
            .unwrap()
            .device_number,
        0
    );
    assert_eq!(node.engine.cooldown(b), Some((pool(), at(2))));

    // A document whose interfaces do not match its ranges is refused and imports nothing.
    let mut broken = checkpoint.clone();
    broken.scopes[0].config.pools[0].interfaces[0].addresses = vec!["10.0.0.99/32".into()];
    let third = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(third.path()).unwrap();
    let mut txn = store.begin().unwrap();
    let err = import_checkpoint(&mut txn, &broken).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    drop(txn);
    let mut txn = store.begin().unwrap();
    assert!(txn.scopes().unwrap().is_empty());
    txn.finish().unwrap();
}

/// Pools without interfaces are stored exactly as before: no `interfaces` key, and a stored
/// configuration written by an earlier build reads back as it was.
#[test]
fn pools_without_interfaces_serialize_as_before() {
    let old = r#"{"name":"default","cooldown_ms":30000,"lowest_free":false,"ranges":["10.0.0.0/24"],"exclusions":[]}"#;
    let pool: PoolSpec = serde_json::from_str(old).unwrap();
    assert!(pool.interfaces.is_empty());
    assert!(!pool.interface_backed);
    assert_eq!(serde_json::to_string(&pool).unwrap(), old);
    // An interface pool says so, also without interfaces.
    let mut pool = pool;
    pool.set_interfaces(&Interfaces::new(PoolName::new("default").unwrap()))
        .unwrap();
    let text = serde_json::to_string(&pool).unwrap();
    assert!(
        text.ends_with(r#""exclusions":[],"interface_backed":true}"#),
        "{text}"
    );
    let read: PoolSpec = serde_json::from_str(&text).unwrap();
    assert!(read.is_interface_pool());
}

#[test]
fn damaged_interface_entries_are_corrupt_not_panics() {
    let mut config = one_pool(&pool(), &[], Duration::from_secs(30));
    let mut table = Interfaces::new(pool());
    table.add_interface(spec("eni-0a", 0, at(0))).unwrap();
    config.pools[0].set_interfaces(&table).unwrap();
    let engine = Engine::new(EngineConfig::default());
    for damage in [
        |e: &mut corral_store::InterfaceEntry| e.mac = "zz".into(),
        |e: &mut corral_store::InterfaceEntry| e.id = "/etc".into(),
        |e: &mut corral_store::InterfaceEntry| e.subnets = vec!["10.0.0.0/99".into()],
        |e: &mut corral_store::InterfaceEntry| e.gateways = vec!["nope".into()],
        |e: &mut corral_store::InterfaceEntry| e.addresses = vec!["10.0.0.11/32".into()],
    ] {
        let mut damaged = config.clone();
        damage(&mut damaged.pools[0].interfaces[0]);
        let err = restore_interfaces(&damaged, &engine).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }
}
