//! The embedded default store: one SQLite database per state directory.
//!
//! Tuned for many short-lived processes (each CNI call is one); figures are from this
//! repository's `make bench-cni` machine:
//! - WAL, and a commit is one append to the log and one fsync, durable before it is
//!   acknowledged. The fsync is the store's own, made after the directory lock is released
//!   (SQLite runs with `synchronous=OFF` for commits): the next writer appends while this one
//!   waits for the disk, so concurrent processes share the device's flushes instead of
//!   queueing behind each other's (+35% ADDs/s with 8 callers). This is safe because nothing
//!   is acknowledged before its own fsync returns, and the log's frames are checksummed in a
//!   chain, so after a crash SQLite recovers a prefix of the commits: a commit that survives
//!   has every commit before it. An answer read rather than written (an ADD that finds its
//!   address recorded) also syncs first: what it read may be a killed writer's unsynced commit.
//!   The agent (an owned store) syncs after each commit too, through the log file it keeps
//!   open. A sync that fails leaves the store refusing every later transaction.
//! - the log is kept short and rewritten in place: SQLite's own checkpoints are off (none
//!   automatic, none when a connection closes); a writer folds the log into the database
//!   once it passes 64 frames (256 KiB) with `synchronous=FULL` (the log synced before pages
//!   are copied, the database after) and starts it again from the beginning. Every process
//!   re-reads the whole log when it opens the database (a long log made every CNI call
//!   slower: 3 ms to 6.6 ms within 400 calls), and an fdatasync of a file that did not grow
//!   need not write its inode (0.15 ms instead of 0.35 ms), so the log is never truncated; a
//!   rollback journal instead costs five fsyncs per commit;
//! - SQLite is built without its directory fsync (`.cargo/config.toml`), which it would repeat
//!   in every process; the store syncs the directory itself when it creates the database or
//!   the log, the only times a directory entry changes;
//! - writers queue on an exclusive `flock` of `corral.lock`, so they wait in the kernel and
//!   wake the moment the holder is done, instead of SQLite's busy loop of sleeps; the lock
//!   dies with its process, so SIGKILL never leaves it held. A one-shot store (a CNI call)
//!   holds it from open to close and locks the database exclusively, which lets SQLite keep
//!   the log's index in memory instead of setting up its shared-memory file (0.25 ms less
//!   per call) — unless something else (the `sqlite3` shell) has the database open, when it
//!   falls back to the shared-memory index at once; a shared store takes it per transaction;
//! - a transaction reads one state row (a few bytes to 8 KiB of bitmap for a /16, see
//!   `codec.rs`), the rows of one attachment and a few cooldowns (those that ran out, at most
//!   a batch, and the oldest: see `load.rs`), never every allocation or cooldown.
//!
//! The allocation table's primary key is (scope, family, address): whatever happens above,
//! the database refuses to record one address twice. Cooldowns have their own table, keyed
//! the same way (an address cools in at most one pool: the one whose range holds it) and
//! indexed by pool, family and release time.
//!
//! State that vanished from outside is refused, never started afresh over (see
//! `check_state_kept`): `corral.synced` says a database was created here, and the database
//! header's application ID counts corral's *marks*. Whenever corral starts the log again (a
//! fold), it writes the next mark into the log and records the database's own mark in
//! `corral.synced`; until someone folds the log into the database, the database holds that
//! recorded mark, and a log that vanishes then held commits the database lacks. SQLite itself
//! removes a log only after folding all of it (the `sqlite3` shell closing the database),
//! which moves the database past the recorded mark.

use std::cell::{Cell, RefCell};
use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use corral_core::{AttachmentKey, Family, GcSuspect, Lease, PoolName, Timestamp, Uuid};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::codec::{decode_cooling, decode_snapshots, encode_snapshots};
use crate::files::create_dirs_synced;
use crate::{
    HistoryEvent, HistoryLimits, HistoryQuery, HistoryRecord, LostState, SCHEMA_VERSION,
    ScopeConfig, ScopeState, Store, StoreError, StoredAllocation, StoredCooldown, Txn,
};

/// The database file inside the state directory.
pub const DB_FILE: &str = "corral.db";
/// The lock file inside the state directory.
pub const LOCK_FILE: &str = "corral.lock";

/// How long a statement waits for a lock SQLite itself takes (only readers outside corral
/// hold one: corral's own processes queue on the directory lock first).
const BUSY_WAIT: Duration = Duration::from_secs(30);
/// How long a fold waits for such a reader before leaving the log as it is.
const FOLD_WAIT: Duration = Duration::from_millis(100);

/// The write-ahead log is folded into the database once it holds more frames (pages) than
/// this: 256 KiB of 4 KiB pages (see `fold_log`).
const WAL_LIMIT_FRAMES: u32 = 64;

/// The same for a long-lived owner (the agent): 16 MiB. Nobody else opens the database while
/// it runs, so a long log costs no process a re-read; and a commit of a large batch writes
/// more pages than the short log holds (schema 5's history indexes took a page each per
/// event), and would fold (three syncs instead of one) at every commit.
const OWNED_WAL_LIMIT_FRAMES: u32 = 4096;

mod columns;
mod history;

use columns::{addr_blob, corrupt, family_code, millis, read_addr};

/// One step of the schema, run inside the migrating transaction.
type Migration = fn(&rusqlite::Transaction<'_>) -> Result<(), StoreError>;

/// Each entry takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[Migration] = &[
    |tx| Ok(tx.execute_batch(SCHEMA_1)?),
    migrate_cooldowns_to_rows,
    |tx| Ok(tx.execute_batch(SCHEMA_3_TAKEOVER)?),
    |tx| Ok(tx.execute_batch(SCHEMA_4_GC_SUSPECTS)?),
    // Schema 5's history (a table and four indexes, each written per event) is created no
    // more: 5 → 6 turns one that exists into the log, or creates the log.
    |_| Ok(()),
    history::migrate_to_log,
    // Schema 6's log held one row per event; 7's rows hold a write's events.
    history::migrate_to_rows,
];

/// Version 1: the scopes' derived state (with every cooldown in one blob) and the allocations.
const SCHEMA_1: &str = "CREATE TABLE scopes (
        scope TEXT PRIMARY KEY,
        config TEXT NOT NULL,
        next_generation INTEGER NOT NULL,
        snapshots BLOB NOT NULL,
        cooling BLOB NOT NULL
    ) STRICT;
    CREATE TABLE allocations (
        scope TEXT NOT NULL,
        family INTEGER NOT NULL,
        addr BLOB NOT NULL,
        pool TEXT NOT NULL,
        owner TEXT NOT NULL,
        network TEXT,
        container_id TEXT,
        ifname TEXT,
        generation INTEGER NOT NULL,
        lease_id TEXT,
        lease_expires INTEGER,
        PRIMARY KEY (scope, family, addr)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX allocations_by_key ON allocations (scope, network, container_id, ifname);";

/// Version 2: cooldowns as rows of their own, so a CNI call reads and writes only the few it
/// acts on instead of decoding and re-encoding every cooling address of the scope.
const SCHEMA_2_COOLDOWNS: &str = "CREATE TABLE cooldowns (
        scope TEXT NOT NULL,
        family INTEGER NOT NULL,
        addr BLOB NOT NULL,
        pool TEXT NOT NULL,
        released_at INTEGER NOT NULL,
        PRIMARY KEY (scope, family, addr)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX cooldowns_by_time ON cooldowns (scope, pool, family, released_at);";

/// 1 → 2: the cooldowns of each state row become rows; the blob column goes. A state row
/// whose cooldowns do not decode is left for a rebuild from the allocations (its snapshot
/// emptied, so it no longer decodes either), as such a row always was: a snapshot must not
/// block addresses whose cooldowns are gone.
fn migrate_cooldowns_to_rows(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    tx.execute_batch(SCHEMA_2_COOLDOWNS)?;
    let blobs: Vec<(String, Vec<u8>)> = tx
        .prepare("SELECT scope, cooling FROM scopes")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (scope, blob) in blobs {
        match decode_cooling(&blob) {
            Ok(cooling) => {
                for (pool, addr, released_at) in cooling {
                    insert_cooldown(
                        tx,
                        &scope,
                        &StoredCooldown {
                            pool,
                            addr,
                            released_at,
                        },
                    )?;
                }
            }
            Err(_) => {
                tx.execute(
                    "UPDATE scopes SET snapshots = x'' WHERE scope = ?1",
                    [&scope],
                )?;
            }
        }
    }
    tx.execute_batch("ALTER TABLE scopes DROP COLUMN cooling")?;
    Ok(())
}

/// Records a cooldown, replacing any at the same address.
fn insert_cooldown(
    conn: &Connection,
    scope: &str,
    cooldown: &StoredCooldown,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO cooldowns (scope, family, addr, pool, released_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (scope, family, addr) DO UPDATE SET pool = ?4, released_at = ?5",
    )?
    .execute(params![
        scope,
        family_code(Family::of(cooldown.addr)),
        addr_blob(cooldown.addr),
        cooldown.pool.as_str(),
        millis(cooldown.released_at),
    ])?;
    Ok(())
}

/// One cooldown row as read: (family, address, release time) of `pool`.
fn read_cooldown(
    pool: PoolName,
    family: i64,
    addr: Vec<u8>,
    released_at: i64,
) -> Result<StoredCooldown, StoreError> {
    Ok(StoredCooldown {
        pool,
        addr: read_addr("cooldown", family, addr)?,
        released_at: Timestamp::from_unix_millis(u64::try_from(released_at).unwrap_or(0)),
    })
}

/// Version 3: the addresses corral-ipam took over from host-local and still watches (see
/// `HostLocalTakeover`).
const SCHEMA_3_TAKEOVER: &str = "CREATE TABLE host_local_takeover (
        scope TEXT PRIMARY KEY,
        dir_mtime_ns INTEGER NOT NULL,
        addrs TEXT NOT NULL
    ) STRICT;";

/// Version 4: the leak collector's suspects (`corral_core::plan_gc`): attachments seen
/// missing from the live set, when first, and what they held then (`addr@generation ...`).
const SCHEMA_4_GC_SUSPECTS: &str = "CREATE TABLE gc_suspects (
        scope TEXT NOT NULL,
        network TEXT NOT NULL,
        container_id TEXT NOT NULL,
        ifname TEXT NOT NULL,
        first_seen INTEGER NOT NULL,
        held TEXT NOT NULL,
        PRIMARY KEY (scope, network, container_id, ifname)
    ) STRICT, WITHOUT ROWID;";

/// What corral-ipam took over from host-local for one network (scope): the addresses whose
/// allocations it still watches, and the host-local directory's modification time when it
/// last looked. While the time is unchanged, no file was removed, so there is nothing to
/// look at; once an address's file is gone (host-local's DEL, sent by a runtime that kept
/// the old configuration), its allocation is released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostLocalTakeover {
    /// Nanoseconds since the epoch; 0 when the next call must look again.
    pub dir_mtime_ns: i64,
    pub addrs: Vec<IpAddr>,
}

fn read_takeover(conn: &Connection, scope: &str) -> Result<Option<HostLocalTakeover>, StoreError> {
    let row = conn
        .prepare_cached("SELECT dir_mtime_ns, addrs FROM host_local_takeover WHERE scope = ?1")?
        .query_row([scope], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })
        .optional()?;
    let Some((dir_mtime_ns, addrs)) = row else {
        return Ok(None);
    };
    let addrs = addrs
        .split_whitespace()
        .map(|a| {
            a.parse::<IpAddr>().map_err(|_| StoreError::Corrupt {
                what: "host-local takeover".into(),
                reason: format!("{a:?} is not an address"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(HostLocalTakeover {
        dir_mtime_ns,
        addrs,
    }))
}

/// A SQLite-backed [`Store`] over one state directory.
#[derive(Debug)]
pub struct SqliteStore {
    /// `None` only once [`SqliteStore::close`] has closed it.
    conn: Option<Connection>,
    lock: File,
    dir: PathBuf,
    mode: Mode,
    /// One-shot mode: a commit (or an answer read) is waiting for [`SqliteStore::close`] to
    /// sync the log.
    unsynced: Cell<bool>,
    /// Frames in the log after this connection's last commit, as SQLite reports them.
    log_frames: Arc<AtomicU32>,
    /// Owned mode: the log's directory entry is durable and cannot change under us.
    log_known_synced: Cell<bool>,
    /// Owned mode: the log, kept open to sync it. It is the same file for as long as the
    /// connection is open: SQLite removes a log only when a closing connection can lock the
    /// database exclusively, which this connection's own lock prevents, and the store never
    /// truncates the log or changes the journal mode.
    log_file: RefCell<Option<File>>,
    /// Whether a sync of the log failed (see [`StoreHealth`]).
    health: StoreHealth,
    /// What `corral.synced` holds, and the database's mark.
    kept: Kept,
    /// Owned mode: the history log's ends as of the last commit (`sqlite/history.rs`), so a
    /// commit need not read them; `None` while a transaction holds them or they are unknown.
    history_ends: RefCell<Option<history::Ends>>,
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> StoreError {
        let retryable = matches!(
            error.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        );
        StoreError::Backend {
            backend: "sqlite",
            retryable,
            error: Box::new(error),
        }
    }
}

/// Whether a store can still write, readable without the store (the agent's `/healthz`
/// reads it while a batch holds the store). Cheap to clone.
///
/// A sync of the log that fails leaves what reached the disk unknown: the kernel may have
/// dropped the pages it could not write, and a later sync would then succeed without them
/// (the fsyncgate problem). So the store refuses every later transaction
/// ([`StoreError::SyncFailed`]); only reopening it, which recovers from what the disk holds,
/// makes it usable again.
#[derive(Clone, Debug, Default)]
pub struct StoreHealth(Arc<AtomicBool>);

impl StoreHealth {
    /// A sync of the store's log has failed since it was opened.
    pub fn sync_failed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn record_sync_failure(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// How a store shares its directory, and when a commit is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Any number of stores (threads, processes) at once: each transaction takes the
    /// directory lock, and a commit is durable when it returns.
    Shared,
    /// One short-lived process (a CNI call): the directory is locked from open to close, the
    /// connection locks the database exclusively (so SQLite keeps its log index in memory
    /// instead of setting up the shared-memory file: ~0.25 ms per process), and commits
    /// become durable when [`SqliteStore::close`] returns, after the locks are released.
    OneShot,
    /// A long-lived owner (the agent): the directory is locked from open to close, refused if
    /// another process holds it, and a commit is durable when it returns.
    Owned,
}

/// How a store is being opened (the owner's socket goes into [`AGENT_FILE`]).
#[derive(Clone, Copy, Debug)]
enum Opening<'a> {
    Shared,
    OneShot,
    Owned(&'a Path),
}

/// The file a running agent keeps in its state directory: its socket's path. A CNI call that
/// finds the directory locked and this file present is told to ask the agent instead of
/// waiting for a lock that is not released until the agent stops.
pub const AGENT_FILE: &str = "corral.agent";

fn dir_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Directory {
        path: path.display().to_string(),
        source,
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `dir`, migrating an older schema. Many stores
    /// may be open on one directory at once; each transaction takes the directory lock, and
    /// [`Txn::commit`] is durable when it returns.
    pub fn open(dir: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_in(dir, Opening::Shared)
    }

    /// Opens the store for one short-lived process: the directory stays locked (other
    /// processes wait) until [`SqliteStore::close`], which must return before anything
    /// committed is acknowledged — commits are synced there, after the locks are released,
    /// so the next process can start while this one waits for the disk. Dropping the store
    /// without closing it syncs too, but cannot report a failure.
    pub fn open_one_shot(dir: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_in(dir, Opening::OneShot)
    }

    /// Opens the store for a long-lived owner (the agent): the directory stays locked until
    /// the store is closed or dropped, and opening fails at once with [`StoreError::Held`]
    /// when another process holds it. Commits are durable when they return. `agent_socket`
    /// is recorded in [`AGENT_FILE`] for CNI calls that find the directory locked.
    pub fn open_owned(dir: &Path, agent_socket: &Path) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_in(dir, Opening::Owned(agent_socket))
    }

    fn open_in(dir: &Path, opening: Opening<'_>) -> Result<SqliteStore, StoreError> {
        let mode = match opening {
            Opening::Shared => Mode::Shared,
            Opening::OneShot => Mode::OneShot,
            Opening::Owned(_) => Mode::Owned,
        };
        create_dir_durably(dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(dir_error(&lock_path))?;
        match mode {
            Mode::Shared => {}
            Mode::OneShot => match lock.try_lock() {
                // An agent file left by an agent that was killed is stale once we hold the
                // lock; it must not make later calls believe an agent holds the directory.
                Ok(()) => {
                    let _ = std::fs::remove_file(dir.join(AGENT_FILE));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    // An agent holds the directory for as long as it runs: say so rather
                    // than wait. A file left by a killed agent names a dead socket.
                    if let Ok(socket) = std::fs::read_to_string(dir.join(AGENT_FILE))
                        && std::os::unix::net::UnixStream::connect(&socket).is_ok()
                    {
                        return Err(StoreError::Held {
                            path: dir.display().to_string(),
                            holder: format!("the corral agent listening on {socket}"),
                        });
                    }
                    lock_dir(&lock, &lock_path)?;
                }
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(StoreError::Lock {
                        path: lock_path.display().to_string(),
                        source,
                    });
                }
            },
            Mode::Owned => match lock.try_lock() {
                // The agent file first, so a CNI call that finds the directory locked while
                // the agent restores or migrates is told to ask the agent.
                Ok(()) => {
                    if let Opening::Owned(socket) = opening {
                        let marker = dir.join(AGENT_FILE);
                        std::fs::write(&marker, socket.as_os_str().as_encoded_bytes())
                            .map_err(dir_error(&marker))?;
                    }
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::Held {
                        path: dir.display().to_string(),
                        holder: "another process (an agent, or a corral-ipam call)".into(),
                    });
                }
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(StoreError::Lock {
                        path: lock_path.display().to_string(),
                        source,
                    });
                }
            },
        }
        let mut store = SqliteStore {
            conn: None,
            lock,
            dir: dir.to_path_buf(),
            mode,
            unsynced: Cell::new(false),
            log_frames: Arc::new(AtomicU32::new(0)),
            log_known_synced: Cell::new(false),
            log_file: RefCell::new(None),
            health: StoreHealth::default(),
            kept: Kept::default(),
            history_ends: RefCell::new(None),
        };
        // A shared store takes the directory lock for opening too: what the checks read and a
        // new database's creation must not interleave with another process's.
        store.acquire()?;
        let opened = store.open_database();
        store.release();
        opened?;
        Ok(store)
    }

    /// Under the directory lock: refuses state that vanished, then opens (creating or
    /// migrating) the database.
    fn open_database(&mut self) -> Result<(), StoreError> {
        let record = read_record(&self.dir);
        // Before SQLite reads anything: it deletes the log of an empty database.
        let db_mark = check_state_kept(&self.dir, record.as_ref())?;
        *self.kept.record.borrow_mut() = record.unwrap_or_default();
        self.kept.db_mark.set(db_mark);
        let exclusive = self.mode != Mode::Shared;
        let (conn, journal) = match connect(&self.dir, exclusive, &self.log_frames) {
            Ok(opened) => opened,
            // Another connection (the sqlite3 shell, a shared store) has the database open,
            // so it cannot be locked exclusively: use SQLite's shared-memory index instead.
            Err(error) if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                connect(&self.dir, false, &self.log_frames)?
            }
            Err(error) => return Err(error.into()),
        };
        let conn = self.conn.insert(conn);
        if !journal.eq_ignore_ascii_case("wal") {
            let journal: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
            if !journal.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Corrupt {
                    what: "journal mode".into(),
                    reason: format!("SQLite kept {journal} instead of wal"),
                });
            }
        }
        conn.pragma_update(None, "synchronous", "OFF")?;
        // The usual open finds the current version and writes nothing.
        if self.schema_version()? != SCHEMA_VERSION {
            migrate(self.conn.as_mut().expect("opened above"))?;
            // A new database (and its log) just got directory entries: make them durable,
            // with what the migration wrote (the log's first mark among it), and only then
            // record that the directory holds a database.
            sync_log(&self.dir)?;
            sync_dir(&self.dir)?;
            let identity = log_inode(&self.dir);
            self.kept.update(&self.dir, |record| {
                record.log = identity;
                record.folded = Some(db_mark);
            });
        }
        Ok(())
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A handle that tells, without the store, whether it can still write.
    pub fn health(&self) -> StoreHealth {
        self.health.clone()
    }

    /// Closes the store: the connection, then the directory lock, then (one-shot mode)
    /// syncs the log if anything was committed or answered from what was read. Nothing
    /// committed through a one-shot store may be acknowledged before this returns `Ok`.
    pub fn close(mut self) -> Result<(), StoreError> {
        if let Some(conn) = self.conn.take() {
            conn.close().map_err(|(_, error)| error)?;
        }
        self.give_up_ownership();
        let _ = self.lock.unlock();
        if self.unsynced.replace(false) {
            sync_log(&self.dir)?;
        }
        Ok(())
    }

    /// An owner removes its [`AGENT_FILE`] before it lets go of the directory.
    fn give_up_ownership(&self) {
        if self.mode == Mode::Owned {
            let _ = std::fs::remove_file(self.dir.join(AGENT_FILE));
        }
    }

    fn conn(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("the connection is open until close")
    }

    /// Takes the directory lock for one transaction (a one-shot store holds it already).
    fn acquire(&self) -> Result<(), StoreError> {
        match self.mode {
            Mode::Shared => lock_dir(&self.lock, &self.dir.join(LOCK_FILE)),
            Mode::OneShot | Mode::Owned => Ok(()),
        }
    }

    fn release(&self) {
        if self.mode == Mode::Shared {
            // Unlocking cannot fail in a way we could act on; the lock dies with the file.
            let _ = self.lock.unlock();
        }
    }

    /// Whether the scope has stored state, read outside any transaction (without the
    /// directory lock in shared mode: a snapshot read of committed data): enough to skip
    /// work that only a new scope needs.
    pub fn has_scope(&self, scope: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .prepare_cached("SELECT 1 FROM scopes WHERE scope = ?1")?
            .exists([scope])?)
    }

    /// The scope's host-local takeover, read outside any transaction (as [`Self::has_scope`]).
    pub fn host_local_takeover(
        &self,
        scope: &str,
    ) -> Result<Option<HostLocalTakeover>, StoreError> {
        read_takeover(self.conn(), scope)
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        Ok(self
            .conn()
            .pragma_query_value(None, "user_version", |r| r.get(0))?)
    }
}

impl Drop for SqliteStore {
    /// A one-shot store dropped without [`SqliteStore::close`] still syncs what it committed
    /// (a failure then goes unreported).
    fn drop(&mut self) {
        drop(self.conn.take());
        self.give_up_ownership();
        let _ = self.lock.unlock();
        if self.unsynced.replace(false) {
            let _ = sync_log(&self.dir);
        }
    }
}

/// Opens the database and reads its journal mode (its first read). With `exclusive`, the
/// connection locks the database for as long as it is open, which lets SQLite keep the
/// log's index in memory (no shared-memory file, ~0.25 ms less per CNI call); that first
/// read then fails at once with `DatabaseBusy` if anything else has the database open.
fn connect(
    dir: &Path,
    exclusive: bool,
    log_frames: &Arc<AtomicU32>,
) -> rusqlite::Result<(Connection, String)> {
    let mut conn = Connection::open(dir.join(DB_FILE))?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    if exclusive {
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        conn.busy_timeout(Duration::ZERO)?;
    } else {
        conn.busy_timeout(BUSY_WAIT)?;
    }
    // Counting the log's frames after each commit (for `fold_log`) also replaces SQLite's
    // own automatic checkpoints.
    let frames = Arc::clone(log_frames);
    conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: c_int| {
        frames.store(u32::try_from(pages).unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }))?;
    let journal: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    conn.busy_timeout(BUSY_WAIT)?;
    Ok((conn, journal))
}

fn lock_dir(lock: &File, path: &Path) -> Result<(), StoreError> {
    lock.lock().map_err(|source| StoreError::Lock {
        path: path.display().to_string(),
        source,
    })
}

/// The file recording what the state directory is known to hold (see `SyncRecord`).
pub const SYNCED_FILE: &str = "corral.synced";

/// What `corral.synced` records. That the file exists says a database was created in the
/// directory: it is first written once a new database is durable, so a database found
/// missing or empty after that is refused instead of started afresh.
///
/// Written without a sync, and only after what it states is durable: after a power loss it
/// may be older than the state, or torn, which only costs a directory sync or a check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SyncRecord {
    /// The identity (see `log_inode`) of the log whose directory entry was last synced.
    log: Option<String>,
    /// The database file's mark when corral last wrote the next one into the log (see the
    /// module documentation). Until the log is folded the database keeps this mark, and a
    /// log lost then held commits the database lacks; the database's mark never drops below
    /// it unless the database is replaced with an older copy.
    folded: Option<u32>,
}

impl SyncRecord {
    /// Parses what the file holds: lines `log <inode> <creation time>` and `folded <mark>`,
    /// or an earlier build's single `<inode> <creation time>`.
    fn parse(bytes: &[u8]) -> SyncRecord {
        let mut record = SyncRecord::default();
        let Ok(text) = std::str::from_utf8(bytes) else {
            return record;
        };
        if !text.contains('\n') {
            let is_number =
                |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
            if let Some((inode, created)) = text.split_once(' ')
                && is_number(inode)
                && is_number(created)
            {
                record.log = Some(text.to_owned());
            }
            return record;
        }
        for line in text.split_inclusive('\n') {
            // A line without its newline is the torn end of an interrupted write.
            let Some(line) = line.strip_suffix('\n') else {
                break;
            };
            match line.split_once(' ') {
                Some(("log", identity)) => record.log = Some(identity.to_owned()),
                Some(("folded", mark)) => record.folded = mark.parse().ok(),
                _ => {}
            }
        }
        record
    }

    fn to_text(&self) -> String {
        let mut text = String::new();
        if let Some(identity) = &self.log {
            text.push_str(&format!("log {identity}\n"));
        }
        if let Some(mark) = self.folded {
            text.push_str(&format!("folded {mark}\n"));
        }
        text
    }
}

/// What a store knows of the state it keeps: the record, and the database file's mark.
#[derive(Debug, Default)]
struct Kept {
    /// What `corral.synced` holds (re-read by shared stores for each transaction).
    record: RefCell<SyncRecord>,
    /// The mark in the database file, as read when the store was opened and set by its folds.
    db_mark: Cell<u32>,
}

impl Kept {
    /// Changes the record and writes it, under the directory lock. A write that fails leaves
    /// the old record, which costs a directory sync or a check later, never a refusal.
    fn update(&self, dir: &Path, change: impl FnOnce(&mut SyncRecord)) {
        let mut record = self.record.borrow_mut();
        change(&mut record);
        let _ = std::fs::write(dir.join(SYNCED_FILE), record.to_text());
    }
}

/// Reads `corral.synced`: `None` if there is none. A file that cannot be read counts as an
/// empty record: the database existed, nothing more is known.
fn read_record(dir: &Path) -> Option<SyncRecord> {
    use std::io::Read;
    let mut file = match File::open(dir.join(SYNCED_FILE)) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(_) => return Some(SyncRecord::default()),
    };
    // One read (this runs on every CNI call): the record is a fraction of the buffer, and a
    // regular file returns all it holds up to the buffer's size.
    let mut buffer = [0; 256];
    match file.read(&mut buffer) {
        Ok(len) => Some(SyncRecord::parse(&buffer[..len])),
        Err(_) => Some(SyncRecord::default()),
    }
}

/// What `statx` tells of the log file.
#[derive(Debug, PartialEq, Eq)]
enum LogFile {
    Missing,
    Present {
        size: u64,
        /// Inode and creation time; `None` when the filesystem does not report creation times.
        identity: Option<String>,
    },
    /// It could not be looked at (permissions): neither checked nor trusted.
    Unknown,
}

/// Looks at the log file (one `statx`). Its identity is its inode and creation time (inode
/// numbers alone are reused when a file is deleted and another created).
///
/// Read with `statx` directly: std's `Metadata::created` asks `statx` only when built on
/// glibc, so a musl build (`make plugin`) would find no creation time and sync the directory
/// on every commit.
fn log_file(dir: &Path) -> LogFile {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let stat = match statx(
        CWD,
        log_path(dir),
        AtFlags::empty(),
        StatxFlags::INO | StatxFlags::BTIME | StatxFlags::SIZE,
    ) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return LogFile::Missing,
        Err(_) => return LogFile::Unknown,
    };
    let identity = StatxFlags::from_bits_retain(stat.stx_mask)
        .contains(StatxFlags::BTIME)
        .then(|| {
            let created = i128::from(stat.stx_btime.tv_sec) * 1_000_000_000
                + i128::from(stat.stx_btime.tv_nsec);
            format!("{} {created}", stat.stx_ino)
        });
    LogFile::Present {
        size: stat.stx_size,
        identity,
    }
}

/// The identity of the current log file (see `log_file`). `None` when there is no log, or
/// the filesystem does not report creation times, in which case every commit syncs.
fn log_inode(dir: &Path) -> Option<String> {
    match log_file(dir) {
        LogFile::Present { identity, .. } => identity,
        LogFile::Missing | LogFile::Unknown => None,
    }
}

/// What the first 100 bytes of the database file say.
#[derive(Debug)]
enum DatabaseFile {
    Missing,
    Empty,
    /// Too short for a header, or not SQLite's.
    Unreadable {
        len: usize,
    },
    Header {
        page_size: u64,
        schema_version: u32,
        /// The application ID: corral's mark.
        mark: u32,
    },
}

/// Reads the database file's header with plain file reads (open, one `pread`, close):
/// SQLite must not see a database before `check_state_kept` has.
fn read_database_header(path: &Path) -> Result<DatabaseFile, StoreError> {
    use std::os::unix::fs::FileExt;
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(DatabaseFile::Missing);
        }
        Err(error) => return Err(dir_error(path)(error)),
    };
    let mut header = [0u8; 100];
    let mut len = 0;
    while len < header.len() {
        match file.read_at(&mut header[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(dir_error(path)(error)),
        }
    }
    let field = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    Ok(match len {
        0 => DatabaseFile::Empty,
        100 if header.starts_with(b"SQLite format 3\0") => DatabaseFile::Header {
            // Two bytes at offset 16; 1 stands for 65536.
            page_size: match u16::from_be_bytes([header[16], header[17]]) {
                1 => 65536,
                size => u64::from(size),
            },
            schema_version: field(60),
            mark: field(68),
        },
        len => DatabaseFile::Unreadable { len },
    })
}

/// Refuses a state directory whose database or log was removed, emptied or replaced with an
/// older copy from outside, before SQLite touches either (at its first read SQLite deletes
/// the log of an empty database, and creates a missing log). Runs under the directory lock,
/// so no corral process is creating or folding meanwhile. Returns the database file's mark.
///
/// What may legitimately be found, and is let through:
/// - no record: a new directory, or a creation that was cut short before the database was
///   durable (nothing was acknowledged from it), or a directory of an earlier build;
/// - no log, or an empty one, with the database past the recorded mark: SQLite removed (or
///   truncated) the log after folding all of it, the `sqlite3` shell closing the database;
/// - a log of another identity: the directory was copied or moved whole, or the log was
///   created again after such a removal (the identity only decides directory syncs).
fn check_state_kept(dir: &Path, record: Option<&SyncRecord>) -> Result<u32, StoreError> {
    let db_path = dir.join(DB_FILE);
    let header = read_database_header(&db_path)?;
    let Some(record) = record else {
        return Ok(match header {
            DatabaseFile::Header { mark, .. } => mark,
            _ => 0,
        });
    };
    let synced = dir.join(SYNCED_FILE).display().to_string();
    let start_afresh = format!(
        "restore it, or remove the whole state directory {} to start afresh deliberately \
         (addresses still in use would then be handed out again)",
        dir.display()
    );
    let go_on = format!(
        "restore it, or remove {synced} to go on from {} as it is, or remove the whole state \
         directory {} to start afresh; either way allocations still in use may be handed out \
         again",
        db_path.display(),
        dir.display()
    );
    let lost = |kind, path: &Path, problem: String, remedy: &str| StoreError::StateLost {
        kind,
        path: path.display().to_string(),
        problem,
        remedy: remedy.to_owned(),
    };
    let held = format!("but {synced} shows the directory held corral's state");
    let (page_size, schema_version, mark) = match header {
        DatabaseFile::Missing => {
            return Err(lost(
                LostState::DatabaseMissing,
                &db_path,
                format!("is missing, {held}"),
                &start_afresh,
            ));
        }
        DatabaseFile::Empty => {
            return Err(lost(
                LostState::DatabaseEmpty,
                &db_path,
                format!("is empty (0 bytes), {held}"),
                &start_afresh,
            ));
        }
        DatabaseFile::Unreadable { len } => {
            return Err(lost(
                LostState::DatabaseUnreadable,
                &db_path,
                format!("does not begin with a SQLite database header ({len} bytes read), {held}"),
                &start_afresh,
            ));
        }
        DatabaseFile::Header {
            page_size,
            schema_version,
            mark,
        } => (page_size, schema_version, mark),
    };
    if let Some(folded) = record.folded
        && mark < folded
    {
        return Err(lost(
            LostState::DatabaseOlder,
            &db_path,
            format!(
                "is older than the state recorded in {synced} (its mark is {mark}, the \
                 recorded one {folded}): it was replaced with an older copy"
            ),
            &go_on.replace("restore it", "restore the current one"),
        ));
    }
    let log_path = log_path(dir);
    let log_lost = match log_file(dir) {
        LogFile::Missing => Some((LostState::LogMissing, "is missing".to_owned())),
        // A log header (32 bytes) and one frame (24 bytes and a page) hold the least commit.
        LogFile::Present { size, .. } if size < 32 + 24 + page_size => Some((
            LostState::LogEmpty,
            format!("holds no commit ({size} bytes)"),
        )),
        LogFile::Present { .. } | LogFile::Unknown => None,
    };
    if let Some((kind, found)) = log_lost {
        let unfolded = match record.folded {
            Some(folded) => mark == folded,
            // A record of an earlier build knows no marks; a database without a schema was
            // never folded since its creation.
            None => schema_version == 0,
        };
        if unfolded {
            return Err(lost(
                kind,
                &log_path,
                format!(
                    "{found}, but it held commits not yet folded into {} ({synced} records \
                     the database's mark before them)",
                    db_path.display()
                ),
                &go_on,
            ));
        }
    }
    Ok(mark)
}

/// Creates the state directory (and missing ancestors), syncing each new directory's parent
/// so the directory itself survives a power loss.
fn create_dir_durably(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    not_a_directory(dir)?;
    create_dirs_synced(dir, dir_error(dir), sync_dir)
}

/// Refuses a state directory path that names, or passes through, something other than a
/// directory (`mkdir` would only say "File exists" or "Not a directory").
fn not_a_directory(dir: &Path) -> Result<(), StoreError> {
    for path in dir.ancestors().filter(|p| !p.as_os_str().is_empty()) {
        if let Ok(metadata) = std::fs::metadata(path) {
            let file_type = metadata.file_type();
            if file_type.is_dir() {
                return Ok(());
            }
            use std::os::unix::fs::FileTypeExt;
            let kind = if file_type.is_file() {
                "regular file"
            } else if file_type.is_fifo() {
                "fifo (named pipe)"
            } else if file_type.is_socket() {
                "socket"
            } else if file_type.is_char_device() || file_type.is_block_device() {
                "device"
            } else {
                "special file"
            };
            return Err(StoreError::NotADirectory {
                path: dir.display().to_string(),
                blocker: path.display().to_string(),
                kind,
            });
        }
    }
    Ok(())
}

/// Makes the write-ahead log's contents durable (every commit appended so far, this
/// process's and any other's). A missing log has nothing to sync: it was folded into the
/// database by a checkpoint, which synced the database first.
fn sync_log(dir: &Path) -> Result<(), StoreError> {
    match open_log(dir)? {
        Some(log) => log.sync_data().map_err(dir_error(&log_path(dir))),
        None => Ok(()),
    }
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join(format!("{DB_FILE}-wal"))
}

/// The write-ahead log, opened to sync it; `None` if there is none.
fn open_log(dir: &Path) -> Result<Option<File>, StoreError> {
    let path = log_path(dir);
    match File::open(&path) {
        Ok(log) => Ok(Some(log)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(dir_error(&path)(error)),
    }
}

/// Makes the directory's entries (a new database or log file) durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(dir_error(dir))
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let found: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for (version, step) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        step(&tx)?;
        tx.pragma_update(None, "user_version", version as u32 + 1)?;
    }
    write_next_mark(&tx)?;
    tx.commit()?;
    Ok(())
}

/// Writes the next mark (see the module documentation) into the database header, in the
/// open transaction; returns the mark it follows.
fn write_next_mark(conn: &Connection) -> Result<u32, StoreError> {
    // SQLite keeps the application ID as a signed 32-bit integer; it counts here as unsigned.
    let mark: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let mark = mark as u32;
    conn.pragma_update(None, "application_id", mark.wrapping_add(1) as i32)?;
    Ok(mark)
}

/// One exclusive transaction on a [`SqliteStore`]; it holds the directory lock until it ends.
#[derive(Debug)]
pub struct SqliteTxn<'a> {
    conn: &'a Connection,
    /// Whether the transaction is still open (not yet committed or finished).
    open: bool,
    log_frames: &'a AtomicU32,
    /// Shared mode: the directory lock, taken for this transaction and released by it.
    lock: Option<&'a File>,
    /// The state directory, whose log the commit syncs.
    dir: &'a Path,
    /// One-shot mode: the store's flag for a sync owed at close.
    unsynced: Option<&'a Cell<bool>>,
    /// Owned mode: the store's open log file.
    log_file: Option<&'a RefCell<Option<File>>>,
    /// Told when a sync of the log fails.
    health: &'a StoreHealth,
    /// Set when the log's directory entry may not be durable yet (see `prepare_log`): the
    /// commit then also syncs the directory (SQLite is built without doing so itself).
    sync_dir_after: Option<&'a Path>,
    /// The allocations this transaction deleted (scope, address), for
    /// [`Txn::released_addresses`].
    released: Vec<(String, IpAddr)>,
    /// The store's record and the database's mark.
    kept: &'a Kept,
    /// The log holds no mark past the database's (see `prepare_txn`): the commit writes one
    /// (`synchronous=FULL` is on until it is recorded).
    mark_due: bool,
    history: HistoryTxn<'a>,
}

/// A transaction's view of the history log's ends (see `SqliteStore::history_ends`).
#[derive(Debug)]
struct HistoryTxn<'a> {
    /// Owned mode: where the ends are kept between transactions.
    kept: Option<&'a RefCell<Option<history::Ends>>>,
    ends: Option<history::Ends>,
    /// Whether this transaction changed the history (its ends are then kept only if it
    /// commits).
    written: bool,
    committed: bool,
    /// Events recorded and not yet written.
    pending: history::Pending,
}

impl Drop for HistoryTxn<'_> {
    fn drop(&mut self) {
        if let Some(kept) = self.kept
            && (self.committed || !self.written)
        {
            kept.replace(self.ends.take());
        }
    }
}

impl Drop for SqliteTxn<'_> {
    fn drop(&mut self) {
        // Roll back (if not committed) before letting the next writer in.
        self.end();
        if let Some(lock) = self.lock {
            let _ = lock.unlock();
        }
    }
}

impl SqliteTxn<'_> {
    /// Rolls back what is still open. A failed rollback leaves SQLite to roll back when the
    /// connection closes; nothing of it was committed either way.
    fn end(&mut self) {
        if std::mem::take(&mut self.open) {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        if std::mem::take(&mut self.mark_due) {
            let _ = self.conn.pragma_update(None, "synchronous", "OFF");
        }
    }

    /// Commits with the next mark in the log, and records the database's mark once the
    /// commit is durable (`synchronous=FULL`, set when the transaction began).
    fn commit_marked(&mut self) -> Result<(), StoreError> {
        write_next_mark(self.conn)?;
        self.conn.execute_batch("COMMIT")?;
        self.open = false;
        let db_mark = self.kept.db_mark.get();
        self.kept
            .update(self.dir, |record| record.folded = Some(db_mark));
        self.end();
        Ok(())
    }

    /// Folds the write-ahead log into the database once it holds more than
    /// `WAL_LIMIT_FRAMES`, and has the next commit start it again from the beginning. Every
    /// process that opens the database re-reads the whole log, so it is kept short; and it
    /// is rewritten in place, not truncated, because an fdatasync of a file that did not
    /// grow need not write its inode: measured here, 0.15 ms instead of 0.35 ms per commit.
    /// Commits sync the log themselves (`synchronous=OFF`), but a checkpoint must have SQLite
    /// sync the log before copying pages and the database before the log starts again.
    fn fold_log(&mut self) -> Result<(), StoreError> {
        let limit = if self.log_file.is_some() {
            OWNED_WAL_LIMIT_FRAMES
        } else {
            WAL_LIMIT_FRAMES
        };
        if self.log_frames.load(Ordering::Relaxed) <= limit {
            return Ok(());
        }
        let folded = (|| {
            self.conn.pragma_update(None, "synchronous", "FULL")?;
            // A reader outside corral (the sqlite3 shell) may hold the log: then the fold
            // waits a moment, not the connection's 30 s, and the log grows until next time.
            self.conn.busy_timeout(FOLD_WAIT)?;
            let busy: i64 = self
                .conn
                .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get(0))?;
            if busy == 0 {
                // Only a write starts the log again (SQLite remembers what was folded in
                // memory, and a one-shot process exits next): the next mark, one page. Still
                // with synchronous=FULL: SQLite then syncs the log's new header before
                // anything is written after it, so a power loss cannot leave later frames
                // behind an old header; and the mark is durable before it is recorded.
                let mark = write_next_mark(self.conn)?;
                // Everything is folded: the database file holds the mark the log had.
                self.kept.db_mark.set(mark);
                self.kept
                    .update(self.dir, |record| record.folded = Some(mark));
            }
            Ok::<(), StoreError>(())
        })();
        self.conn.busy_timeout(BUSY_WAIT)?;
        self.conn.pragma_update(None, "synchronous", "OFF")?;
        folded
    }

    /// The transaction's work is done: the log is synced now (shared mode, after releasing
    /// the directory lock, so the next writer can go on meanwhile) or at the store's close
    /// (one-shot mode).
    fn sync_before_answer(&mut self) -> Result<(), StoreError> {
        if let Some(unsynced) = self.unsynced {
            unsynced.set(true);
            return Ok(());
        }
        if let Some(lock) = self.lock.take() {
            let _ = lock.unlock();
        }
        let synced = match self.log_file {
            None => sync_log(self.dir),
            Some(log_file) => {
                let mut log_file = log_file.borrow_mut();
                if log_file.is_none() {
                    *log_file = open_log(self.dir)?;
                }
                match &*log_file {
                    Some(log) => log.sync_data().map_err(dir_error(&log_path(self.dir))),
                    None => Ok(()),
                }
            }
        };
        if synced.is_err() {
            self.health.record_sync_failure();
        }
        synced
    }
}

impl Store for SqliteStore {
    type Txn<'a> = SqliteTxn<'a>;

    fn begin(&mut self) -> Result<SqliteTxn<'_>, StoreError> {
        if self.health.sync_failed() {
            return Err(StoreError::SyncFailed {
                path: log_path(&self.dir).display().to_string(),
            });
        }
        self.acquire()?;
        let (log_synced, mark_due) = match self.prepare_txn() {
            Ok(prepared) => prepared,
            Err(error) => {
                self.release();
                return Err(error);
            }
        };
        let mode = self.mode;
        Ok(SqliteTxn {
            conn: self.conn(),
            open: true,
            log_frames: &self.log_frames,
            lock: (mode == Mode::Shared).then_some(&self.lock),
            dir: &self.dir,
            unsynced: (mode == Mode::OneShot).then_some(&self.unsynced),
            log_file: (mode == Mode::Owned).then_some(&self.log_file),
            health: &self.health,
            sync_dir_after: (!log_synced).then_some(self.dir.as_path()),
            released: Vec::new(),
            kept: &self.kept,
            mark_due,
            history: HistoryTxn {
                kept: (mode == Mode::Owned).then_some(&self.history_ends),
                ends: if mode == Mode::Owned {
                    self.history_ends.take()
                } else {
                    None
                },
                written: false,
                committed: false,
                pending: history::Pending::default(),
            },
        })
    }
}

impl SqliteStore {
    /// Under the directory lock: prepares the log (`prepare_log`), decides whether the
    /// commit marks the log, and begins the transaction. Returns whether the log's entry is
    /// known durable and whether a mark is due.
    ///
    /// A mark is due when the database's mark is not the recorded one: the log was folded
    /// by a program outside corral (the `sqlite3` shell, which may then have removed it), or
    /// the record was written by an earlier build, or lost. The log may then hold commits
    /// but no mark past the database's, and would be lost unnoticed; the next commit marks
    /// it (one more page, and its log synced by SQLite, only then). A shared store does not
    /// know the database's mark (other stores fold it) and leaves this to the others.
    fn prepare_txn(&self) -> Result<(bool, bool), StoreError> {
        if self.mode == Mode::Shared {
            // Other stores write the record too.
            *self.kept.record.borrow_mut() = read_record(&self.dir).unwrap_or_default();
        }
        let log_synced = self.prepare_log()?;
        let mark_due = self.mode != Mode::Shared
            && self.kept.record.borrow().folded != Some(self.kept.db_mark.get());
        if mark_due {
            self.conn().pragma_update(None, "synchronous", "FULL")?;
        }
        if let Err(error) = self.conn().execute_batch("BEGIN IMMEDIATE") {
            if mark_due {
                let _ = self.conn().pragma_update(None, "synchronous", "OFF");
            }
            return Err(error.into());
        }
        Ok((log_synced, mark_due))
    }

    /// Under the directory lock, before a transaction: syncs the directory entry of a log
    /// that exists but was never synced (its creator was killed between commit and sync, or
    /// the sqlite3 shell recreated it), before anything is acknowledged on top of it.
    /// Returns whether the log's entry is known durable (a log that does not exist yet is
    /// synced after the commit that creates it). An owner checks once: while it holds the
    /// directory nobody else can replace the log.
    fn prepare_log(&self) -> Result<bool, StoreError> {
        if self.log_known_synced.get() {
            return Ok(true);
        }
        // One look at the log (a `statx`) per transaction: this runs on every CNI call.
        let Some(identity) = log_inode(&self.dir) else {
            // No log yet: the commit that creates it syncs its entry.
            return Ok(false);
        };
        if self.kept.record.borrow().log.as_deref() != Some(identity.as_str()) {
            sync_dir(&self.dir)?;
            self.kept
                .update(&self.dir, |record| record.log = Some(identity));
        }
        if self.mode == Mode::Owned {
            self.log_known_synced.set(true);
        }
        Ok(true)
    }
}

/// The allocations of one attachment. The index is named, because without statistics SQLite
/// prefers scanning the primary key by scope, which reads every allocation of the network
/// (10 ms at 62k rows, where the index takes 0.1 ms).
fn by_key_sql() -> String {
    format!(
        "SELECT {ALLOCATION_COLUMNS} FROM allocations INDEXED BY allocations_by_key
         WHERE scope = ?1 AND network = ?2 AND container_id = ?3 AND ifname = ?4"
    )
}

const ALLOCATION_COLUMNS: &str =
    "family, addr, pool, owner, network, container_id, ifname, generation, lease_id, lease_expires";

fn read_allocation(row: &Row<'_>) -> Result<Result<StoredAllocation, StoreError>, rusqlite::Error> {
    let family: i64 = row.get(0)?;
    let addr: Vec<u8> = row.get(1)?;
    let pool: String = row.get(2)?;
    let owner: String = row.get(3)?;
    let network: Option<String> = row.get(4)?;
    let container_id: Option<String> = row.get(5)?;
    let ifname: Option<String> = row.get(6)?;
    let generation: i64 = row.get(7)?;
    let lease_id: Option<String> = row.get(8)?;
    let lease_expires: Option<i64> = row.get(9)?;
    Ok((|| {
        let addr = read_addr("allocation", family, addr)?;
        let key = match (network, container_id, ifname) {
            (Some(n), Some(c), Some(i)) => {
                Some(AttachmentKey::new(&n, &c, &i).map_err(|e| corrupt("allocation", e))?)
            }
            _ => None,
        };
        let lease = match (lease_id, lease_expires) {
            (Some(id), Some(at)) => Some(Lease {
                id: Uuid::parse_str(&id).map_err(|e| corrupt("allocation lease", e))?,
                expires_at: Timestamp::from_unix_millis(at as u64),
            }),
            _ => None,
        };
        Ok(StoredAllocation {
            pool: PoolName::new(&pool).map_err(|e| corrupt("allocation", e))?,
            addr,
            owner,
            key,
            generation: generation as u64,
            lease,
        })
    })())
}

impl SqliteTxn<'_> {
    fn tx(&self) -> &Connection {
        debug_assert!(self.open, "the transaction is open until commit or finish");
        self.conn
    }

    /// The scope's host-local takeover, if it has one.
    pub fn host_local_takeover(
        &mut self,
        scope: &str,
    ) -> Result<Option<HostLocalTakeover>, StoreError> {
        read_takeover(self.tx(), scope)
    }

    /// Records the scope's host-local takeover (kept when it lists no address any more, so
    /// the next call knows at once that the network was taken over).
    pub fn put_host_local_takeover(
        &mut self,
        scope: &str,
        takeover: &HostLocalTakeover,
    ) -> Result<(), StoreError> {
        let addrs: Vec<String> = takeover.addrs.iter().map(ToString::to_string).collect();
        self.tx()
            .prepare_cached(
                "INSERT OR REPLACE INTO host_local_takeover (scope, dir_mtime_ns, addrs) \
                 VALUES (?1, ?2, ?3)",
            )?
            .execute(params![scope, takeover.dir_mtime_ns, addrs.join(" ")])?;
        Ok(())
    }

    fn query_allocations(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<StoredAllocation>, StoreError> {
        let mut statement = self.tx().prepare_cached(sql)?;
        let rows = statement.query_map(params, read_allocation)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(row??);
        }
        Ok(out)
    }
}

impl SqliteTxn<'_> {
    /// Writes the events recorded so far (before the log is read, and at commit).
    fn write_history(&mut self) -> Result<(), StoreError> {
        let history = &mut self.history;
        history.pending.write(self.conn, history.ends.as_mut())
    }
}

impl Txn for SqliteTxn<'_> {
    fn record(&mut self, event: HistoryRecord<'_>) -> Result<(), StoreError> {
        let history = &mut self.history;
        history.written = true;
        history.pending.push(event);
        Ok(())
    }

    fn prune_history(&mut self, limits: &HistoryLimits, now: Timestamp) -> Result<u64, StoreError> {
        debug_assert!(self.open, "the transaction is open until commit or finish");
        let conn = self.conn;
        let history = &mut self.history;
        history.written = true;
        let mut ends = match history.ends.take() {
            Some(mut ends) => {
                history.pending.write(conn, Some(&mut ends))?;
                ends
            }
            None => {
                history.pending.write(conn, None)?;
                let mut ends = history::Ends::load(conn)?;
                // Owned mode: the ends live on across commits, and with them the tail's
                // summaries, made from its rows this once.
                if history.kept.is_some() {
                    ends.track(conn)?;
                }
                ends
            }
        };
        let dropped = history::prune(conn, &mut ends, limits, now)?;
        history.ends = Some(ends);
        Ok(dropped)
    }

    fn history(&mut self, query: &HistoryQuery) -> Result<Vec<HistoryEvent>, StoreError> {
        self.write_history()?;
        Ok(history::history(self.tx(), query)?.0)
    }

    fn held_at(&mut self, addr: IpAddr, at: Timestamp) -> Result<Vec<HistoryEvent>, StoreError> {
        self.write_history()?;
        Ok(history::held_at(self.tx(), addr, at)?.0)
    }

    fn gc_suspects(&mut self, scope: &str) -> Result<Vec<GcSuspect>, StoreError> {
        let mut statement = self.tx().prepare_cached(
            "SELECT network, container_id, ifname, first_seen, held FROM gc_suspects \
             WHERE scope = ?1 ORDER BY network, container_id, ifname",
        )?;
        let rows = statement.query_map([scope], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (network, container_id, ifname, first_seen, held) = row?;
            let key = AttachmentKey::new(&network, &container_id, &ifname)
                .map_err(|e| corrupt("gc suspect", e))?;
            out.push(GcSuspect {
                key,
                first_seen: Timestamp::from_unix_millis(u64::try_from(first_seen).unwrap_or(0)),
                held: crate::gc::decode_held(&held)?,
            });
        }
        Ok(out)
    }

    fn put_gc_suspect(&mut self, scope: &str, suspect: &GcSuspect) -> Result<(), StoreError> {
        self.tx()
            .prepare_cached(
                "INSERT OR REPLACE INTO gc_suspects \
                 (scope, network, container_id, ifname, first_seen, held) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                scope,
                suspect.key.network(),
                suspect.key.container_id(),
                suspect.key.ifname(),
                i64::try_from(suspect.first_seen.as_unix_millis()).unwrap_or(i64::MAX),
                crate::gc::encode_held(&suspect.held),
            ])?;
        Ok(())
    }

    fn delete_gc_suspect(&mut self, scope: &str, key: &AttachmentKey) -> Result<(), StoreError> {
        self.tx()
            .prepare_cached(
                "DELETE FROM gc_suspects \
                 WHERE scope = ?1 AND network = ?2 AND container_id = ?3 AND ifname = ?4",
            )?
            .execute(params![
                scope,
                key.network(),
                key.container_id(),
                key.ifname()
            ])?;
        Ok(())
    }

    fn scopes(&mut self) -> Result<Vec<String>, StoreError> {
        let mut statement = self.tx().prepare_cached(
            "SELECT scope FROM scopes UNION SELECT DISTINCT scope FROM allocations ORDER BY 1",
        )?;
        let scopes = statement
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(scopes)
    }

    fn scope_state(
        &mut self,
        scope: &str,
    ) -> Result<(Option<ScopeState>, Option<String>), StoreError> {
        let row = self
            .tx()
            .prepare_cached(
                "SELECT config, next_generation, snapshots FROM scopes WHERE scope = ?1",
            )?
            .query_row([scope], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                ))
            })
            .optional()?;
        let Some((config, next_generation, snapshots)) = row else {
            return Ok((None, None));
        };
        let decoded = (|| -> Result<ScopeState, StoreError> {
            let config: ScopeConfig =
                serde_json::from_str(&config).map_err(|e| corrupt("scope configuration", e))?;
            Ok(ScopeState {
                config,
                next_generation: next_generation as u64,
                snapshots: decode_snapshots(&snapshots)?,
            })
        })();
        match decoded {
            Ok(state) => Ok((Some(state), None)),
            Err(error) => Ok((None, Some(error.to_string()))),
        }
    }

    fn put_scope_state(&mut self, scope: &str, state: &ScopeState) -> Result<(), StoreError> {
        let config =
            serde_json::to_string(&state.config).map_err(|e| corrupt("scope configuration", e))?;
        self.tx()
            .prepare_cached(
                "INSERT INTO scopes (scope, config, next_generation, snapshots)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (scope) DO UPDATE SET config = ?2, next_generation = ?3,
                   snapshots = ?4",
            )?
            .execute(params![
                scope,
                config,
                state.next_generation as i64,
                encode_snapshots(&state.snapshots),
            ])?;
        Ok(())
    }

    fn stored_config(&mut self, scope: &str) -> Result<Option<ScopeConfig>, StoreError> {
        let text: Option<String> = self
            .tx()
            .prepare_cached("SELECT config FROM scopes WHERE scope = ?1")?
            .query_row([scope], |r| r.get(0))
            .optional()?;
        Ok(text.and_then(|text| serde_json::from_str(&text).ok()))
    }

    fn cooldowns(&mut self, scope: &str) -> Result<Vec<StoredCooldown>, StoreError> {
        let mut statement = self.tx().prepare_cached(
            "SELECT pool, family, addr, released_at FROM cooldowns WHERE scope = ?1
             ORDER BY released_at, family, addr",
        )?;
        let rows = statement.query_map([scope], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (pool, family, addr, released_at) = row?;
            let pool = PoolName::new(&pool).map_err(|e| corrupt("cooldown", e))?;
            out.push(read_cooldown(pool, family, addr, released_at)?);
        }
        Ok(out)
    }

    fn oldest_cooldowns(
        &mut self,
        scope: &str,
        pool: &PoolName,
        family: Family,
        ran_out_by: Timestamp,
        limit: usize,
    ) -> Result<Vec<StoredCooldown>, StoreError> {
        // The index walks one pool and family in release order; a row at an allocated address
        // (which recording the allocation deletes, so only damage leaves one) is not a
        // cooldown, and must never free that address.
        let mut statement = self.tx().prepare_cached(
            "SELECT addr, released_at FROM cooldowns AS c INDEXED BY cooldowns_by_time
             WHERE scope = ?1 AND pool = ?2 AND family = ?3
               AND NOT EXISTS (SELECT 1 FROM allocations AS a
                               WHERE a.scope = ?1 AND a.family = ?3 AND a.addr = c.addr)
             ORDER BY released_at LIMIT ?4",
        )?;
        let mut rows = statement.query(params![
            scope,
            pool.as_str(),
            family_code(family),
            i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX),
        ])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let cooling =
                read_cooldown(pool.clone(), family_code(family), row.get(0)?, row.get(1)?)?;
            let ran_out = cooling.released_at <= ran_out_by;
            if ran_out && out.len() == limit {
                break;
            }
            out.push(cooling);
            if !ran_out {
                break;
            }
        }
        Ok(out)
    }

    fn put_cooldown(&mut self, scope: &str, cooldown: &StoredCooldown) -> Result<(), StoreError> {
        insert_cooldown(self.tx(), scope, cooldown)
    }

    fn delete_cooldown(&mut self, scope: &str, addr: IpAddr) -> Result<(), StoreError> {
        self.tx()
            .prepare_cached("DELETE FROM cooldowns WHERE scope = ?1 AND family = ?2 AND addr = ?3")?
            .execute(params![
                scope,
                family_code(Family::of(addr)),
                addr_blob(addr)
            ])?;
        Ok(())
    }

    fn delete_cooldowns_before(
        &mut self,
        scope: &str,
        pool: &PoolName,
        family: Family,
        before: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.tx()
            .prepare_cached(
                "DELETE FROM cooldowns
                 WHERE scope = ?1 AND pool = ?2 AND family = ?3 AND released_at < ?4",
            )?
            .execute(params![
                scope,
                pool.as_str(),
                family_code(family),
                before.map_or(i64::MAX, millis),
            ])?;
        Ok(())
    }

    fn delete_cooldowns(&mut self, scope: &str) -> Result<(), StoreError> {
        self.tx()
            .prepare_cached("DELETE FROM cooldowns WHERE scope = ?1")?
            .execute([scope])?;
        Ok(())
    }

    fn released_addresses(&self, scope: &str) -> Vec<IpAddr> {
        self.released
            .iter()
            .filter(|(released_scope, _)| released_scope == scope)
            .map(|&(_, addr)| addr)
            .collect()
    }

    fn allocations_by_key(
        &mut self,
        scope: &str,
        key: &AttachmentKey,
    ) -> Result<Vec<StoredAllocation>, StoreError> {
        self.query_allocations(
            &by_key_sql(),
            params![scope, key.network(), key.container_id(), key.ifname()],
        )
    }

    fn allocation_by_addr(
        &mut self,
        scope: &str,
        addr: IpAddr,
    ) -> Result<Option<StoredAllocation>, StoreError> {
        // ALLOCATION_COLUMNS spelled out: a constant statement, not formatted on each call
        // before the statement cache finds it.
        Ok(self
            .query_allocations(
                "SELECT family, addr, pool, owner, network, container_id, ifname, generation,
                 lease_id, lease_expires FROM allocations
                 WHERE scope = ?1 AND family = ?2 AND addr = ?3",
                params![scope, family_code(Family::of(addr)), addr_blob(addr)],
            )?
            .pop())
    }

    fn all_allocations(&mut self, scope: &str) -> Result<Vec<StoredAllocation>, StoreError> {
        self.query_allocations(
            &format!("SELECT {ALLOCATION_COLUMNS} FROM allocations WHERE scope = ?1"),
            [scope],
        )
    }

    fn put_allocation(
        &mut self,
        scope: &str,
        allocation: &StoredAllocation,
    ) -> Result<(), StoreError> {
        let key = allocation.key.as_ref();
        self.tx()
            .prepare_cached(&format!(
                "INSERT INTO allocations (scope, {ALLOCATION_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ))?
            .execute(params![
                scope,
                family_code(Family::of(allocation.addr)),
                addr_blob(allocation.addr),
                allocation.pool.as_str(),
                allocation.owner,
                key.map(AttachmentKey::network),
                key.map(AttachmentKey::container_id),
                key.map(AttachmentKey::ifname),
                allocation.generation as i64,
                allocation.lease.map(|l| l.id.to_string()),
                allocation
                    .lease
                    .map(|l| l.expires_at.as_unix_millis() as i64),
            ])
            .map_err(|error| match error.sqlite_error_code() {
                Some(rusqlite::ErrorCode::ConstraintViolation) => StoreError::Taken {
                    scope: scope.to_owned(),
                    addr: allocation.addr,
                },
                _ => StoreError::from(error),
            })?;
        // An allocated address is not cooling (a cooling address may be asked for by name,
        // or handed out when nothing else is free).
        self.delete_cooldown(scope, allocation.addr)
    }

    fn delete_allocation(&mut self, scope: &str, addr: IpAddr) -> Result<(), StoreError> {
        self.tx()
            .prepare_cached(
                "DELETE FROM allocations WHERE scope = ?1 AND family = ?2 AND addr = ?3",
            )?
            .execute(params![
                scope,
                family_code(Family::of(addr)),
                addr_blob(addr)
            ])?;
        self.released.push((scope.to_owned(), addr));
        Ok(())
    }

    fn commit(mut self) -> Result<(), StoreError> {
        // A failed COMMIT (or write of the history) is rolled back by the drop.
        self.write_history()?;
        if self.mark_due {
            self.commit_marked()?;
        } else if self.open {
            self.conn.execute_batch("COMMIT")?;
            self.open = false;
        }
        self.history.committed = true;
        self.fold_log()?;
        if let Some(dir) = self.sync_dir_after {
            sync_dir(dir)?;
            let identity = log_inode(dir);
            self.kept.update(dir, |record| record.log = identity);
        }
        self.sync_before_answer()
    }

    fn finish(mut self) -> Result<(), StoreError> {
        self.end();
        self.sync_before_answer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the log file that exists now is the one whose directory entry was made durable.
    fn log_is_synced(dir: &Path) -> bool {
        log_inode(dir).is_some_and(|identity| {
            read_record(dir).and_then(|record| record.log) == Some(identity)
        })
    }

    /// The directory is synced again whenever the log file is a new one.
    #[test]
    fn a_new_state_directory_and_its_parents_are_created() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/state");
        SqliteStore::open(&dir).unwrap();
        assert!(dir.join(DB_FILE).exists());
        assert!(log_is_synced(&dir));
    }

    #[test]
    fn a_recreated_log_gets_its_directory_entry_synced() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        assert!(log_is_synced(dir.path()), "a new store syncs its directory");
        // What the sqlite3 shell does when it closes the database last: it folds the log into
        // the database and removes it.
        store
            .conn()
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        drop(store);
        std::fs::remove_file(dir.path().join(format!("{DB_FILE}-wal"))).unwrap();
        assert!(!log_is_synced(dir.path()));
        let mut store = SqliteStore::open(dir.path()).unwrap();
        // Reopening recreated the log; the next transaction syncs its entry before anything
        // is acknowledged on top of it.
        let mut txn = store.begin().unwrap();
        assert!(log_is_synced(dir.path()));
        txn.put_allocation(
            "s",
            &StoredAllocation {
                pool: PoolName::default_pool(),
                addr: "10.0.0.1".parse().unwrap(),
                owner: "o".into(),
                key: None,
                generation: 1,
                lease: None,
            },
        )
        .unwrap();
        txn.commit().unwrap();
        assert!(log_is_synced(dir.path()));
        let txn = store.begin().unwrap();
        assert!(
            txn.sync_dir_after.is_none(),
            "no sync while the log is the same file"
        );
    }

    /// The identity read with `statx` is the one std reports on glibc, so a record written by
    /// an earlier build still matches (no extra directory sync after an upgrade).
    #[test]
    fn the_log_identity_is_its_inode_and_creation_time() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        drop(SqliteStore::open(dir.path()).unwrap());
        let metadata = std::fs::metadata(log_path(dir.path())).unwrap();
        let Ok(created) = metadata.created() else {
            // std reads creation times only on glibc, where this means the filesystem keeps
            // none (NFS, an old tmpfs): then neither does statx, and every commit syncs.
            if cfg!(target_env = "gnu") {
                assert_eq!(log_inode(dir.path()), None);
            }
            return;
        };
        let nanos = created
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        assert_eq!(
            log_inode(dir.path()),
            Some(format!("{} {nanos}", metadata.ino()))
        );
    }

    /// Regression: the attachment lookup must use its index, not a scan of the network.
    #[test]
    fn the_attachment_lookup_uses_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let plan: Vec<String> = store
            .conn()
            .prepare(&format!("EXPLAIN QUERY PLAN {}", by_key_sql()))
            .unwrap()
            .query_map(params!["s", "n", "c", "i"], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX allocations_by_key")),
            "{plan:?}"
        );
    }

    /// A failed sync of the log leaves the store refusing to write: the disk may lack what
    /// the page cache showed, and a later sync would not say so.
    #[test]
    fn a_store_whose_sync_failed_writes_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        store.begin().unwrap().commit().unwrap();
        // As `sync_before_answer` records a failed fdatasync (a failing disk is not at hand).
        let health = store.health();
        assert!(!health.sync_failed());
        store.health.record_sync_failure();
        assert!(health.sync_failed(), "every handle sees the failure");
        let refused = store.begin().unwrap_err();
        assert!(
            matches!(refused, StoreError::SyncFailed { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("corral.db-wal"), "{refused}");
        drop(store);
        // Reopening starts from what the disk holds.
        let mut store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        store.begin().unwrap().commit().unwrap();
    }

    /// The log is folded into the database once it passes its limit and then rewritten in
    /// place by the next process: it neither grows without end (every process re-reads it)
    /// nor shrinks (a sync of a file that grew also writes its inode), and nothing is lost.
    #[test]
    fn the_log_is_folded_and_reused_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join(format!("{DB_FILE}-wal"));
        let frame = 4096 + 24;
        let mut largest = 0;
        let mut restarted = false;
        for i in 0..120u32 {
            let mut store = SqliteStore::open_one_shot(dir.path()).unwrap();
            let mut txn = store.begin().unwrap();
            txn.put_allocation(
                "s",
                &StoredAllocation {
                    pool: PoolName::default_pool(),
                    addr: IpAddr::from([10, 0, (i / 250) as u8, (i % 250) as u8]),
                    owner: "o".repeat(2000),
                    key: None,
                    generation: u64::from(i) + 1,
                    lease: None,
                },
            )
            .unwrap();
            txn.commit().unwrap();
            let frames = store.log_frames.load(Ordering::Relaxed);
            restarted |= i > 0 && frames <= 2;
            store.close().unwrap();
            largest = largest.max(std::fs::metadata(&wal).unwrap().len());
        }
        assert!(restarted, "the log never started again");
        assert!(
            largest <= (u64::from(WAL_LIMIT_FRAMES) + 16) * frame,
            "the log grew to {largest} bytes"
        );
        let mut store = SqliteStore::open(dir.path()).unwrap();
        let mut txn = store.begin().unwrap();
        assert_eq!(txn.all_allocations("s").unwrap().len(), 120);
    }
}
