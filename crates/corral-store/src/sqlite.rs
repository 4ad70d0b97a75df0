//! The embedded default store: one SQLite database per state directory.
//!
//! Tuned for many short-lived processes (each CNI call is one):
//! - WAL, and a commit is one append to the log and one fsync, durable when it returns. The
//!   fsync is the store's own, made after the directory lock is released (SQLite runs with
//!   `synchronous=OFF` for commits): the next writer appends while this one waits for the
//!   disk, so concurrent processes share the device's flushes instead of queueing behind
//!   each other's. This is safe because nothing is acknowledged before its own fsync returns,
//!   and the log's frames are checksummed in a chain, so after a crash SQLite recovers a
//!   prefix of the commits: a commit that survives has every commit before it. Folding the
//!   log into the database (a checkpoint) runs with `synchronous=FULL`: the log is synced
//!   before pages are copied and the database after, before the log is emptied;
//! - the log is kept short: SQLite's own checkpoints are off (no automatic checkpoint, none
//!   when a connection closes), and a writer folds the log into the database and truncates
//!   it once it passes 256 KiB. Every process that opens a WAL database as its only
//!   connection must re-read and checksum the whole log, so a long log would make every CNI
//!   call slower (measured: 3 ms to 6.6 ms within 400 calls); a rollback journal instead
//!   costs five fsyncs per commit (measured ~0.4 ms slower per ADD than this);
//! - SQLite is built without its directory fsync (`.cargo/config.toml`), which it would repeat
//!   in every process; the store syncs the directory itself when it creates the database or
//!   the log, the only times a directory entry changes;
//! - writers queue on an exclusive `flock` of `corral.lock` before `BEGIN IMMEDIATE`, so they
//!   wait in the kernel and wake the moment the holder is done, instead of SQLite's busy loop
//!   of sleeps; the lock dies with its process, so SIGKILL never leaves it held;
//! - a transaction reads one state row (8 KiB of bitmap for a /16) and the rows of one
//!   attachment, never every allocation.
//!
//! The allocation table's primary key is (scope, family, address): whatever happens above,
//! the database refuses to record one address twice.

use std::fs::{File, OpenOptions};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_core::{AttachmentKey, Family, Lease, PoolName, Timestamp, Uuid, addr_value};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use crate::codec::{decode_cooling, decode_snapshots, encode_cooling, encode_snapshots};
use crate::{SCHEMA_VERSION, ScopeConfig, ScopeState, Store, StoreError, StoredAllocation, Txn};

/// The database file inside the state directory.
pub const DB_FILE: &str = "corral.db";
/// The lock file inside the state directory.
pub const LOCK_FILE: &str = "corral.lock";

/// The write-ahead log is folded into the database past this size (see `fold_log`).
const WAL_LIMIT: u64 = 256 * 1024;

/// Each entry takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 → 1
    "CREATE TABLE scopes (
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
    CREATE INDEX allocations_by_key ON allocations (scope, network, container_id, ifname);",
];

/// A SQLite-backed [`Store`] over one state directory.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    lock: File,
    dir: PathBuf,
}

fn dir_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Directory {
        path: path.display().to_string(),
        source,
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `dir`, migrating an older schema.
    pub fn open(dir: &Path) -> Result<SqliteStore, StoreError> {
        create_dir_durably(dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(dir_error(&lock_path))?;
        let conn = Connection::open(dir.join(DB_FILE))?;
        conn.busy_timeout(Duration::from_secs(30))?;
        let mut store = SqliteStore {
            conn,
            lock,
            dir: dir.to_path_buf(),
        };
        // Both settings belong to the connection; neither needs the directory lock.
        store
            .conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        // WAL is a property of the database file: set once, under the lock, because
        // switching needs the database to itself (two processes creating it at once would
        // otherwise see "database is locked").
        let mode: String = store
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            store.with_lock(|conn| {
                let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
                if mode.eq_ignore_ascii_case("wal") {
                    Ok(())
                } else {
                    Err(StoreError::Corrupt {
                        what: "journal mode".into(),
                        reason: format!("SQLite kept {mode} instead of wal"),
                    })
                }
            })?;
        }
        store.conn.pragma_update(None, "synchronous", "OFF")?;
        store.conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // Migrations take the lock, and check the version again under it; the usual open
        // finds the current version and takes no lock at all.
        if store.schema_version()? != SCHEMA_VERSION {
            store.with_lock(migrate)?;
            // A new database (and its log) just got directory entries: make them durable.
            sync_dir(&store.dir)?;
            remember_synced_log(&store.dir);
        }
        Ok(store)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn with_lock<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let lock_path = self.dir.join(LOCK_FILE);
        self.lock.lock().map_err(|source| StoreError::Lock {
            path: lock_path.display().to_string(),
            source,
        })?;
        let result = f(&mut self.conn);
        // Unlocking cannot fail in a way we could act on; the lock also dies with the file.
        let _ = self.lock.unlock();
        result
    }

    /// Folds the write-ahead log into the database and empties it once it passes
    /// `WAL_LIMIT`. Every process that opens the database alone re-reads the whole log, so
    /// it is kept short; the caller holds the directory lock.
    fn fold_log(&mut self) -> Result<(), StoreError> {
        let wal = self.dir.join(format!("{DB_FILE}-wal"));
        let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        if size > WAL_LIMIT {
            // Commits sync the log themselves; a checkpoint must have SQLite sync the log
            // before copying and the database before truncating the log.
            self.conn.pragma_update(None, "synchronous", "FULL")?;
            let folded = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            self.conn.pragma_update(None, "synchronous", "OFF")?;
            folded?;
        }
        Ok(())
    }

    /// Whether the scope has stored state, read without the directory lock (a snapshot read
    /// of committed data): enough to skip work that only a new scope needs.
    pub fn has_scope(&self, scope: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM scopes WHERE scope = ?1")?
            .exists([scope])?)
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        Ok(self
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))?)
    }
}

/// The file recording which log file the directory was last synced with.
const SYNCED_FILE: &str = "corral.synced";

/// The identity of the current log file: inode and creation time (inode numbers alone are
/// reused when a file is deleted and another created). `None` when there is no log, or the
/// filesystem does not report creation times, in which case every commit syncs.
fn log_inode(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(dir.join(format!("{DB_FILE}-wal"))).ok()?;
    let created = metadata
        .created()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!("{} {}", metadata.ino(), created.as_nanos()))
}

/// Whether the log file that exists now is the one whose directory entry was made durable.
/// A log created since (by us, or recreated by someone closing the database with the
/// `sqlite3` shell, which deletes it) has a new identity, so the next commit syncs again.
fn log_is_synced(dir: &Path) -> bool {
    let recorded = std::fs::read_to_string(dir.join(SYNCED_FILE)).ok();
    match (log_inode(dir), recorded) {
        (Some(identity), Some(text)) => text.trim() == identity,
        _ => false,
    }
}

/// Records the current log's identity after a directory sync. Losing this record only costs
/// one more sync later, so it is written without one.
fn remember_synced_log(dir: &Path) {
    if let Some(identity) = log_inode(dir) {
        let _ = std::fs::write(dir.join(SYNCED_FILE), identity);
    }
}

/// Creates the state directory (and missing ancestors), syncing each new directory's parent
/// so the directory itself survives a power loss.
fn create_dir_durably(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut current = Some(dir);
    while let Some(path) = current {
        if path.as_os_str().is_empty() || path.exists() {
            break;
        }
        missing.push(path);
        current = path.parent();
    }
    std::fs::create_dir_all(dir).map_err(dir_error(dir))?;
    for path in missing.iter().rev() {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Makes the write-ahead log's contents durable (every commit appended so far, this
/// process's and any other's). A missing log has nothing to sync: it was folded into the
/// database by a checkpoint, which synced the database first.
fn sync_log(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(format!("{DB_FILE}-wal"));
    match File::open(&path) {
        Ok(log) => log.sync_data().map_err(dir_error(&path)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
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
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version as u32 + 1)?;
    }
    tx.commit()?;
    Ok(())
}

/// One exclusive transaction on a [`SqliteStore`]; it holds the directory lock until it ends.
#[derive(Debug)]
pub struct SqliteTxn<'a> {
    tx: Option<rusqlite::Transaction<'a>>,
    lock: &'a File,
    /// The state directory, whose log the commit syncs.
    dir: &'a Path,
    /// Set when the log's directory entry may not be durable yet (see `log_is_synced`): the
    /// commit then also syncs the directory (SQLite is built without doing so itself).
    sync_dir_after: Option<&'a Path>,
}

impl Drop for SqliteTxn<'_> {
    fn drop(&mut self) {
        // Roll back (if not committed) before letting the next writer in.
        drop(self.tx.take());
        let _ = self.lock.unlock();
    }
}

impl Store for SqliteStore {
    type Txn<'a> = SqliteTxn<'a>;

    fn begin(&mut self) -> Result<SqliteTxn<'_>, StoreError> {
        let lock_path = self.dir.join(LOCK_FILE);
        self.lock.lock().map_err(|source| StoreError::Lock {
            path: lock_path.display().to_string(),
            source,
        })?;
        if let Err(error) = self.fold_log() {
            let _ = self.lock.unlock();
            return Err(error);
        }
        // A log that exists but whose directory entry was never synced (its creator was
        // killed between commit and sync, or the sqlite3 shell recreated it) is synced now,
        // before anything is acknowledged on top of it; one that does not exist yet is
        // synced after the commit that creates it.
        let log_exists = log_inode(&self.dir).is_some();
        let mut log_synced = log_is_synced(&self.dir);
        if log_exists && !log_synced {
            if let Err(error) = sync_dir(&self.dir) {
                let _ = self.lock.unlock();
                return Err(error);
            }
            remember_synced_log(&self.dir);
            log_synced = true;
        }
        match self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
        {
            Ok(tx) => Ok(SqliteTxn {
                tx: Some(tx),
                lock: &self.lock,
                dir: &self.dir,
                sync_dir_after: (!log_synced).then_some(self.dir.as_path()),
            }),
            Err(error) => {
                let _ = self.lock.unlock();
                Err(error.into())
            }
        }
    }
}

fn family_code(family: Family) -> i64 {
    match family {
        Family::V4 => 4,
        Family::V6 => 6,
    }
}

fn addr_blob(addr: IpAddr) -> [u8; 16] {
    addr_value(addr).to_be_bytes()
}

fn corrupt(what: &str, reason: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what: what.to_owned(),
        reason: reason.to_string(),
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
        let family = match family {
            4 => Family::V4,
            6 => Family::V6,
            other => return Err(corrupt("allocation", format!("family {other}"))),
        };
        let bytes: [u8; 16] = addr
            .try_into()
            .map_err(|_| corrupt("allocation", "address is not 16 bytes"))?;
        let value = u128::from_be_bytes(bytes);
        if value > family.max_value() {
            return Err(corrupt("allocation", "address out of range"));
        }
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
            addr: family.addr(value),
            owner,
            key,
            generation: generation as u64,
            lease,
        })
    })())
}

impl SqliteTxn<'_> {
    fn tx(&self) -> &rusqlite::Transaction<'_> {
        self.tx
            .as_ref()
            .expect("a transaction is present until commit or drop")
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

impl Txn for SqliteTxn<'_> {
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
                "SELECT config, next_generation, snapshots, cooling FROM scopes WHERE scope = ?1",
            )?
            .query_row([scope], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                    r.get::<_, Vec<u8>>(3)?,
                ))
            })
            .optional()?;
        let Some((config, next_generation, snapshots, cooling)) = row else {
            return Ok((None, None));
        };
        let decoded = (|| -> Result<ScopeState, StoreError> {
            let config: ScopeConfig =
                serde_json::from_str(&config).map_err(|e| corrupt("scope configuration", e))?;
            Ok(ScopeState {
                config,
                next_generation: next_generation as u64,
                snapshots: decode_snapshots(&snapshots)?,
                cooling: decode_cooling(&cooling)?,
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
                "INSERT INTO scopes (scope, config, next_generation, snapshots, cooling)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (scope) DO UPDATE SET config = ?2, next_generation = ?3,
                   snapshots = ?4, cooling = ?5",
            )?
            .execute(params![
                scope,
                config,
                state.next_generation as i64,
                encode_snapshots(&state.snapshots),
                encode_cooling(&state.cooling),
            ])?;
        Ok(())
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
        Ok(self
            .query_allocations(
                &format!(
                    "SELECT {ALLOCATION_COLUMNS} FROM allocations
                     WHERE scope = ?1 AND family = ?2 AND addr = ?3"
                ),
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
                _ => StoreError::Sqlite(error),
            })?;
        Ok(())
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
        Ok(())
    }

    fn commit(mut self) -> Result<(), StoreError> {
        if let Some(tx) = self.tx.take() {
            tx.commit()?;
        }
        if let Some(dir) = self.sync_dir_after {
            sync_dir(dir)?;
            remember_synced_log(dir);
        }
        // The next writer may go on while this commit waits for the disk (see the module
        // documentation); the commit is acknowledged only once the log is synced.
        let _ = self.lock.unlock();
        sync_log(self.dir)
    }

    fn finish(mut self) -> Result<(), StoreError> {
        drop(self.tx.take());
        let _ = self.lock.unlock();
        sync_log(self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .conn
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

    /// Regression: the attachment lookup must use its index, not a scan of the network.
    #[test]
    fn the_attachment_lookup_uses_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let plan: Vec<String> = store
            .conn
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
}
