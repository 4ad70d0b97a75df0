//! Filling the /16 to 95% without going through the plugins, in each plugin's own format.
//!
//! The fill is made the way churn makes it: every allocatable address is handed out in order
//! (allocate-next, one container each), then a seeded random 5% is released long enough ago
//! that no cooldown is left. Both plugins get the same held addresses with the same container
//! IDs, so the next ADD of either starts from the same place. [`corral_all`] stops before the
//! release: every address held, and the bench releases the same 5% through the plugin itself
//! (DEL), so their cooldowns are real and recent.
//!
//! * corral: in-process through the library, exactly as the plugin would have stored it: the
//!   scope configuration the plugin derives (`corral_cni::scope_config`), a full engine from
//!   `build_engine`, one row per held address keyed by
//!   (network, container ID, `eth0`) with the container ID as owner, then `save_engine` and
//!   one commit. Should the store run SQLite in WAL mode, that one large transaction would
//!   leave all its pages in the log, for every later call to re-read; the fill therefore ends
//!   with `PRAGMA wal_checkpoint(TRUNCATE)` (a no-op with a rollback journal), so the measured
//!   calls start from an empty log, as on the empty /16.
//! * host-local: its disk backend (`plugins/ipam/host-local/backend/disk/backend.go`): one
//!   file per held address in `dataDir/<network>/`, named by the address and holding
//!   `<container ID>\r\n<ifname>`; `last_reserved_ip.0` with the last address handed out
//!   (no newline); and the empty `lock` file it flocks.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use corral_cni::scope_config;
use corral_cni::{CniArgs, Command, NetConfig, parse_config};
use corral_core::{AttachmentKey, EngineConfig, Family, Request, Target, Timestamp};
use corral_store::{
    DB_FILE, Need, SqliteStore, Store, StoredAllocation, Txn, build_engine, save_engine,
};

use super::{ALLOCATABLE, FILLED, NETWORK, container_id, mix};

/// Container IDs of the fill come from this stream (see [`container_id`]).
pub const FILL_STREAM: u64 = 1;
const SEED: u64 = 0x5eed_0095;

/// The held addresses of the filled /16 and who holds them; identical for both plugins.
#[derive(Debug)]
pub struct Fill {
    pub held: Vec<(IpAddr, String)>,
    /// The address handed out last while filling (host-local's `last_reserved_ip.0`).
    pub last: IpAddr,
}

impl Fill {
    pub fn held_set(&self) -> HashSet<IpAddr> {
        self.held.iter().map(|(addr, _)| *addr).collect()
    }
}

fn now_millis() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(since.as_millis()).expect("millis fit u64")
}

fn net_config(stdin: &[u8]) -> NetConfig {
    parse_config(Command::Add, stdin, &CniArgs::default()).expect("the bench config is valid")
}

/// Fills corral's store in `data_dir` (configuration `stdin`) to [`FILLED`] addresses.
pub fn corral(stdin: &[u8], data_dir: &Path) -> Fill {
    fill_corral(stdin, data_dir, true).0
}

/// Fills corral's store in `data_dir` (configuration `stdin`) with every allocatable address;
/// also returns the container IDs of the seeded 5% that [`corral`] releases, for the bench to
/// release through the plugin.
pub fn corral_all(stdin: &[u8], data_dir: &Path) -> (Fill, Vec<String>) {
    fill_corral(stdin, data_dir, false)
}

/// Which of the [`ALLOCATABLE`] addresses (by the order they were handed out) the 95% fill
/// releases: a seeded Fisher-Yates shuffle picks 5%.
fn released_share() -> Vec<bool> {
    let mut order: Vec<usize> = (0..ALLOCATABLE).collect();
    for i in (1..order.len()).rev() {
        let j = (mix(SEED ^ i as u64) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut released = vec![false; ALLOCATABLE];
    for &i in &order[..ALLOCATABLE - FILLED] {
        released[i] = true;
    }
    released
}

fn fill_corral(stdin: &[u8], data_dir: &Path, release: bool) -> (Fill, Vec<String>) {
    let config = net_config(stdin);
    assert_eq!(config.ipam.range_sets.len(), 1, "one range set");
    let set = &config.ipam.range_sets[0];
    let scope = config.name.as_str();
    let desired = scope_config(&config);
    let now = now_millis();
    let filled_at = Timestamp::from_unix_millis(now - 2 * 3_600_000);
    let released_at = Timestamp::from_unix_millis(now - 2 * 3_600_000 + 1_000);
    let settled = Timestamp::from_unix_millis(now - 3_600_000);

    let mut store = SqliteStore::open(data_dir).expect("open corral's store");
    let mut txn = store.begin().expect("begin");
    let engine_config = EngineConfig {
        lease_id_seed: SEED,
        ..EngineConfig::default()
    };
    let (mut engine, full) = build_engine(&mut txn, scope, &desired, engine_config, Need::Full)
        .expect("build the engine");
    assert!(full, "a full engine");

    let mut rows = Vec::with_capacity(ALLOCATABLE);
    for i in 0..ALLOCATABLE {
        let owner = container_id(FILL_STREAM, i as u64);
        let key = AttachmentKey::new(scope, &owner, "eth0").expect("valid key");
        let request = Request {
            pool: &set.pool,
            owner: &owner,
            key: Some(&key),
            lease: None,
        };
        let allocation = engine
            .allocate(&request, Target::Next(Family::V4), filled_at)
            .expect("room while filling");
        rows.push(StoredAllocation {
            pool: set.pool.clone(),
            addr: allocation.addr,
            owner,
            key: Some(key),
            generation: allocation.generation,
            lease: None,
        });
    }
    let last = rows.last().expect("rows").addr;
    let stats = engine.stats(&set.pool, Family::V4).expect("stats");
    assert_eq!(
        (stats.free, stats.used),
        (0, ALLOCATABLE as u64),
        "every address handed out"
    );

    let share = released_share();
    let to_release: Vec<String> = rows
        .iter()
        .zip(&share)
        .filter(|(_, released)| **released)
        .map(|(row, _)| row.owner.clone())
        .collect();
    let released = if release {
        for (row, _) in rows.iter().zip(&share).filter(|(_, released)| **released) {
            engine
                .release(row.addr, Some(row.generation), released_at)
                .expect("release");
        }
        engine.advance(settled);
        let stats = engine.stats(&set.pool, Family::V4).expect("stats");
        assert_eq!(
            (stats.used, stats.cooling, stats.free),
            (FILLED as u64, 0, (ALLOCATABLE - FILLED) as u128),
            "95% held, no cooldown left"
        );
        share
    } else {
        vec![false; ALLOCATABLE]
    };

    let held: Vec<StoredAllocation> = rows
        .into_iter()
        .zip(released)
        .filter_map(|(row, released)| (!released).then_some(row))
        .collect();
    for row in &held {
        txn.put_allocation(scope, row).expect("put_allocation");
    }
    save_engine(&mut txn, scope, &desired, &engine).expect("save_engine");
    txn.commit().expect("commit");
    drop(store);
    truncate_wal(data_dir);
    let fill = Fill {
        held: held.into_iter().map(|row| (row.addr, row.owner)).collect(),
        last,
    };
    (fill, to_release)
}

/// Folds SQLite's write-ahead log, if any, into the database and empties it.
fn truncate_wal(data_dir: &Path) {
    let conn = rusqlite::Connection::open(data_dir.join(DB_FILE)).expect("open corral.db");
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .expect("checkpoint");
    assert_eq!(busy, 0, "checkpoint blocked");
    let wal = data_dir.join(format!("{DB_FILE}-wal"));
    assert_eq!(
        std::fs::metadata(wal).map_or(0, |m| m.len()),
        0,
        "log emptied"
    );
}

/// Checks what corral-ipam left in `data_dir` after the fill and one ADD through the binary:
/// the stored configuration is still ours (so the plugin took its partial path, not a rebuild
/// from every row) and exactly `rows` allocations are stored.
pub fn check_corral(stdin: &[u8], data_dir: &Path, rows: usize) {
    let config = net_config(stdin);
    let mut store = SqliteStore::open(data_dir).expect("open corral's store");
    let mut txn = store.begin().expect("begin");
    let (state, corrupt) = txn.scope_state(&config.name).expect("scope state");
    assert!(corrupt.is_none(), "corrupt state: {corrupt:?}");
    let state = state.expect("the scope has state");
    assert_eq!(
        state.config,
        scope_config(&config),
        "the plugin stored another configuration than the fill"
    );
    let stored = txn.all_allocations(&config.name).expect("rows").len();
    assert_eq!(stored, rows, "stored allocations");
}

/// Writes host-local's data directory for `fill` under `data_dir`.
pub fn host_local(data_dir: &Path, fill: &Fill) {
    let dir = data_dir.join(NETWORK);
    std::fs::create_dir_all(&dir).expect("create host-local's directory");
    for (addr, container) in &fill.held {
        std::fs::write(dir.join(addr.to_string()), format!("{container}\r\neth0"))
            .expect("write an address file");
    }
    std::fs::write(dir.join("last_reserved_ip.0"), fill.last.to_string())
        .expect("write last_reserved_ip.0");
    std::fs::File::create(dir.join("lock")).expect("create the lock file");
}
