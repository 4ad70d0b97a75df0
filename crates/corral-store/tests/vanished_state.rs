//! State that vanished from outside, on real files: a database truncated or deleted, a log
//! deleted or emptied while it held commits, a database replaced with an older copy. Each is
//! refused with `StoreError::StateLost` naming the file, in every mode, and the refusal
//! changes nothing on disk; the legitimate look-alikes (a new directory, folds, the `sqlite3`
//! shell removing a log it folded, a creation cut short, a directory copied whole) open.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use corral_core::PoolName;
use corral_store::{
    DB_FILE, LostState, SYNCED_FILE, SqliteStore, Store, StoreError, StoredAllocation, Txn,
};

const SCOPE: &str = "net";

fn log_path(dir: &Path) -> std::path::PathBuf {
    dir.join(format!("{DB_FILE}-wal"))
}

fn allocation(i: u32) -> StoredAllocation {
    StoredAllocation {
        pool: PoolName::default_pool(),
        addr: IpAddr::from([10, 0, (i / 250) as u8, (i % 250) as u8 + 1]),
        // Long owners fill log pages quickly, so a few dozen commits pass the fold limit.
        owner: format!("{i:0>1500}"),
        key: None,
        generation: u64::from(i) + 1,
        lease: None,
    }
}

/// `n` CNI-style calls, each its own one-shot store, adding allocations `from..from + n`.
fn commit_calls(dir: &Path, from: u32, n: u32) {
    for i in from..from + n {
        let mut store = SqliteStore::open_one_shot(dir).unwrap();
        let mut txn = store.begin().unwrap();
        txn.put_allocation(SCOPE, &allocation(i)).unwrap();
        txn.commit().unwrap();
        store.close().unwrap();
    }
}

fn n_allocations(dir: &Path) -> usize {
    let mut store = SqliteStore::open_one_shot(dir).unwrap();
    let mut txn = store.begin().unwrap();
    let n = txn.all_allocations(SCOPE).unwrap().len();
    txn.finish().unwrap();
    store.close().unwrap();
    n
}

/// Every file of the directory with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            (
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read(entry.path()).unwrap(),
            )
        })
        .collect()
}

/// Opens a store in one mode.
type Opener<'a> = dyn Fn() -> Result<SqliteStore, StoreError> + 'a;

/// Removes the write-ahead log and asserts that the state is then refused as lost.
fn assert_log_loss_refused(dir: &Path) {
    std::fs::remove_file(log_path(dir)).unwrap();
    assert_log_missing_refused(dir);
}

/// [`assert_refused`] for a missing write-ahead log.
fn assert_log_missing_refused(dir: &Path) {
    assert_refused(dir, LostState::LogMissing, &format!("{DB_FILE}-wal"));
}

/// Opens the directory in each mode and expects each to refuse it as `kind`, naming `file`
/// in its message, without changing a byte of the directory.
fn assert_refused(dir: &Path, kind: LostState, file: &str) {
    let before = files(dir);
    let socket = dir.join("agent.sock");
    // One mode at a time: a store that opened after all holds the directory lock until it
    // is dropped, at the end of its turn.
    let modes: [(&str, &Opener); 3] = [
        ("one-shot", &|| SqliteStore::open_one_shot(dir)),
        ("shared", &|| SqliteStore::open(dir)),
        ("owned", &|| SqliteStore::open_owned(dir, &socket)),
    ];
    for (mode, open) in modes {
        match open() {
            Err(StoreError::StateLost {
                kind: found, path, ..
            }) if found == kind => {
                assert_eq!(path, dir.join(file).display().to_string(), "{mode}");
            }
            Err(other) => panic!("{mode}: expected {kind:?}, got {other}"),
            Ok(_) => panic!("{mode}: expected {kind:?}, but the store opened"),
        }
        assert_eq!(
            files(dir),
            before,
            "{mode}: the refusal changed the directory"
        );
    }
    let error = SqliteStore::open_one_shot(dir).unwrap_err();
    assert!(!error.is_retryable(), "a refusal is for good: {error}");
    let message = error.to_string();
    let named = dir.join(file).display().to_string();
    assert!(message.starts_with(&named), "{message}");
    assert!(message.contains("restore"), "{message}");
    assert!(message.contains("to start afresh"), "{message}");
}

/// What the sqlite3 shell does when it closes the database last: SQLite folds the whole log
/// into the database and removes it.
fn sqlite3_shell_looks(dir: &Path) {
    let shell = rusqlite::Connection::open(dir.join(DB_FILE)).unwrap();
    let _: i64 = shell
        .query_row("SELECT count(*) FROM allocations", [], |r| r.get(0))
        .unwrap();
    drop(shell);
    assert!(!log_path(dir).exists(), "SQLite removes the folded log");
}

#[test]
fn a_database_truncated_to_zero_bytes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 3);
    std::fs::File::create(dir.path().join(DB_FILE)).unwrap();
    assert_refused(dir.path(), LostState::DatabaseEmpty, DB_FILE);
    // Also once the log was folded into the database and started again.
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 80);
    std::fs::File::create(dir.path().join(DB_FILE)).unwrap();
    assert_refused(dir.path(), LostState::DatabaseEmpty, DB_FILE);
}

#[test]
fn a_database_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 3);
    let db = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(DB_FILE))
        .unwrap();
    db.set_len(40).unwrap();
    assert_refused(dir.path(), LostState::DatabaseUnreadable, DB_FILE);
}

#[test]
fn a_deleted_database_whose_log_remains_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 3);
    std::fs::remove_file(dir.path().join(DB_FILE)).unwrap();
    // SQLite would create an empty database and delete the log at its first read.
    assert!(log_path(dir.path()).exists());
    assert_refused(dir.path(), LostState::DatabaseMissing, DB_FILE);
}

#[test]
fn a_log_deleted_while_it_held_commits_is_refused() {
    let wal = format!("{DB_FILE}-wal");
    // A young database: everything since its creation is in the log.
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 3);
    std::fs::remove_file(log_path(dir.path())).unwrap();
    assert_refused(dir.path(), LostState::LogMissing, &wal);
    // After folds: the commits since the last one are in the log only.
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 100);
    std::fs::remove_file(log_path(dir.path())).unwrap();
    assert_refused(dir.path(), LostState::LogMissing, &wal);
    // Emptied rather than deleted.
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 100);
    std::fs::File::create(log_path(dir.path())).unwrap();
    assert_refused(dir.path(), LostState::LogEmpty, &wal);
}

#[test]
fn a_log_deleted_from_under_an_agent_is_refused_at_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let mut agent = SqliteStore::open_owned(dir.path(), &socket).unwrap();
    for i in 0..100 {
        let mut txn = agent.begin().unwrap();
        txn.put_allocation(SCOPE, &allocation(i)).unwrap();
        txn.commit().unwrap();
    }
    std::fs::remove_file(log_path(dir.path())).unwrap();
    agent.close().unwrap();
    assert_log_missing_refused(dir.path());
}

#[test]
fn a_database_replaced_with_an_older_copy_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 10);
    // A consistent backup: everything folded into the database first.
    sqlite3_shell_looks(dir.path());
    let copy = std::fs::read(dir.path().join(DB_FILE)).unwrap();
    // Enough commits for the log to be folded into the database since the copy.
    commit_calls(dir.path(), 10, 100);
    std::fs::write(dir.path().join(DB_FILE), &copy).unwrap();
    assert_refused(dir.path(), LostState::DatabaseOlder, DB_FILE);
    // Also with the log gone (a backup of the database alone put back).
    std::fs::remove_file(log_path(dir.path())).unwrap();
    assert_refused(dir.path(), LostState::DatabaseOlder, DB_FILE);
    // Someone who means it removes the record, and the copy is taken as it is.
    std::fs::remove_file(dir.path().join(SYNCED_FILE)).unwrap();
    assert_eq!(n_allocations(dir.path()), 10);
}

/// Removing the record is the way to go on from the database alone, deliberately.
#[test]
fn a_refused_directory_opens_once_its_record_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 100);
    std::fs::remove_file(log_path(dir.path())).unwrap();
    assert!(SqliteStore::open_one_shot(dir.path()).is_err());
    std::fs::remove_file(dir.path().join(SYNCED_FILE)).unwrap();
    let kept = n_allocations(dir.path());
    assert!((1..100).contains(&kept), "{kept}");
    // From here on the directory is watched again.
    commit_calls(dir.path(), 100, 3);
    assert_log_loss_refused(dir.path());
}

#[test]
fn a_new_directory_opens_in_every_mode() {
    let root = tempfile::tempdir().unwrap();
    let socket = root.path().join("agent.sock");
    SqliteStore::open_one_shot(&root.path().join("a"))
        .unwrap()
        .close()
        .unwrap();
    SqliteStore::open(&root.path().join("b")).unwrap();
    SqliteStore::open_owned(&root.path().join("c"), &socket)
        .unwrap()
        .close()
        .unwrap();
    for name in ["a", "b", "c"] {
        let dir = root.path().join(name);
        assert!(dir.join(SYNCED_FILE).exists(), "{name}");
        commit_calls(&dir, 0, 2);
        assert_eq!(n_allocations(&dir), 2, "{name}");
    }
}

/// Folds start the log again in place, in every mode; reopening finds everything.
#[test]
fn folded_logs_open_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 100);
    let mut shared = SqliteStore::open(dir.path()).unwrap();
    for i in 100..200 {
        let mut txn = shared.begin().unwrap();
        txn.put_allocation(SCOPE, &allocation(i)).unwrap();
        txn.commit().unwrap();
    }
    drop(shared);
    let mut owned = SqliteStore::open_owned(dir.path(), &dir.path().join("a.sock")).unwrap();
    for i in 200..300 {
        let mut txn = owned.begin().unwrap();
        txn.put_allocation(SCOPE, &allocation(i)).unwrap();
        txn.commit().unwrap();
    }
    owned.close().unwrap();
    assert_eq!(n_allocations(dir.path()), 300);
}

/// The sqlite3 shell removes the log when it closes the database last, after folding all of
/// it: that is no loss, whenever it happens, and the log it leaves behind is watched again.
#[test]
fn a_log_the_sqlite3_shell_folded_and_removed_is_no_loss() {
    let dir = tempfile::tempdir().unwrap();
    // Right after the creation, mid-cycle, and right after corral's own fold.
    commit_calls(dir.path(), 0, 1);
    sqlite3_shell_looks(dir.path());
    assert_eq!(n_allocations(dir.path()), 1);
    commit_calls(dir.path(), 1, 5);
    sqlite3_shell_looks(dir.path());
    assert_eq!(n_allocations(dir.path()), 6);
    for i in 6..200 {
        commit_calls(dir.path(), i, 1);
        if i % 37 == 0 {
            sqlite3_shell_looks(dir.path());
        }
    }
    assert_eq!(n_allocations(dir.path()), 200);
    // Twice in a row, with nothing written between (the shell recreates the log and removes
    // it again).
    sqlite3_shell_looks(dir.path());
    sqlite3_shell_looks(dir.path());
    assert_eq!(n_allocations(dir.path()), 200);
    // The log corral starts after the shell's removal is marked by its first commit: losing
    // it is noticed.
    commit_calls(dir.path(), 200, 2);
    assert_log_loss_refused(dir.path());
}

/// The shell may also fold the log without removing it (`PRAGMA wal_checkpoint`); commits
/// after that are in the log only, and losing them is noticed.
#[test]
fn a_log_folded_by_the_sqlite3_shell_then_deleted_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 10);
    let shell = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    shell
        .query_row("PRAGMA wal_checkpoint", [], |_| Ok(()))
        .unwrap();
    // The shell stays open meanwhile, as a user's would.
    commit_calls(dir.path(), 10, 3);
    std::mem::forget(shell);
    std::fs::remove_file(log_path(dir.path())).unwrap();
    std::fs::remove_file(dir.path().join(format!("{DB_FILE}-shm"))).unwrap();
    assert_log_missing_refused(dir.path());
}

/// A creation cut short leaves no record, so whatever it left starts afresh: nothing was
/// acknowledged from it.
#[test]
fn a_creation_cut_short_starts_afresh() {
    // Killed right after SQLite created the file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::File::create(dir.path().join(DB_FILE)).unwrap();
    commit_calls(dir.path(), 0, 1);
    assert_eq!(n_allocations(dir.path()), 1);
    // Killed after the schema was written, before the record.
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open(dir.path()).unwrap());
    std::fs::remove_file(dir.path().join(SYNCED_FILE)).unwrap();
    commit_calls(dir.path(), 0, 1);
    assert_eq!(n_allocations(dir.path()), 1);
    // ... and the record, once written, watches it from then on.
    assert_log_loss_refused(dir.path());
}

/// A state directory copied or moved whole (new inodes, a log not yet folded) is the same
/// state: it opens with everything.
#[test]
fn a_directory_copied_whole_opens() {
    let from = tempfile::tempdir().unwrap();
    commit_calls(from.path(), 0, 100);
    let to = tempfile::tempdir().unwrap();
    for (name, bytes) in files(from.path()) {
        std::fs::write(to.path().join(name), bytes).unwrap();
    }
    assert_eq!(n_allocations(to.path()), 100);
    commit_calls(to.path(), 100, 1);
    assert_eq!(n_allocations(to.path()), 101);
}

/// A record an earlier build wrote (the log's identity alone) is taken as it is; the next
/// commit marks the log, and from then on a lost log is noticed.
#[test]
fn an_earlier_builds_record_is_upgraded_by_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    commit_calls(dir.path(), 0, 100);
    let record = std::fs::read_to_string(dir.path().join(SYNCED_FILE)).unwrap();
    let identity = record
        .lines()
        .find_map(|line| line.strip_prefix("log "))
        .expect("the record names the log")
        .to_owned();
    std::fs::write(dir.path().join(SYNCED_FILE), &identity).unwrap();
    assert_eq!(n_allocations(dir.path()), 100);
    commit_calls(dir.path(), 100, 1);
    let record = std::fs::read_to_string(dir.path().join(SYNCED_FILE)).unwrap();
    assert!(record.contains(&format!("log {identity}\n")), "{record}");
    assert!(record.contains("folded "), "{record}");
    assert_log_loss_refused(dir.path());
}
