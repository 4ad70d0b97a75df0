//! The fake's resources in a file, so that every process on a machine running the same fake
//! cloud (the replicas of `corral operator --cloud fake`, `corral cluster check --cloud fake`)
//! sees one cloud, and a process that dies takes nothing of it along
//! ([`super::FakeEc2::shared_state`]).
//!
//! Each call takes an exclusive `flock` on `PATH.lock`, reads the file if another process wrote
//! it since, applies itself, and (a mutating call that succeeded) writes the file whole to
//! `PATH.tmp` and renames it over `PATH`, so a process killed mid-write leaves the previous
//! state. Times (attachments completing, changes showing in describes) are kept as wall-clock
//! nanoseconds, so one process's "visible in 2 s" is every process's.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::model::{Model, Persisted, PersistedRef};
use crate::CloudError;

/// The file as written.
#[derive(serde::Serialize)]
struct FileRef<'a> {
    /// What the state was first made from (the seed): a state file of another seed is refused.
    fingerprint: &'a str,
    model: PersistedRef<'a>,
}

/// The file as read.
#[derive(serde::Deserialize)]
struct FileOwned {
    fingerprint: String,
    model: Persisted,
}

/// A fake's state file and its lock.
#[derive(Debug)]
pub(crate) struct StateFile {
    path: PathBuf,
    lock: File,
    fingerprint: String,
    /// The generation of the file last read or written here: while the file's is the same,
    /// the model in memory is the file's and is not decoded again. Every write (under the
    /// lock, after a read) numbers the file one more, so no two writes share a generation.
    seen: Option<u64>,
}

/// How long a call waits for another process's lock (held for microseconds, unless that
/// process was stopped while holding it).
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The file's first line: this and the generation.
const HEADER: &str = "corral-fake-cloud-state";

fn failed(path: &Path, what: &str, error: impl std::fmt::Display) -> CloudError {
    CloudError::InternalError {
        message: format!(
            "the fake cloud's state file {}: {what}: {error}",
            path.display()
        ),
    }
}

impl StateFile {
    /// Opens (creating) `PATH.lock` beside the state file.
    pub(crate) fn open(path: &Path, fingerprint: &str) -> Result<StateFile, CloudError> {
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| failed(path, "opening its lock file", e))?;
        Ok(StateFile {
            path: path.to_owned(),
            lock,
            fingerprint: fingerprint.to_owned(),
            seen: None,
        })
    }

    /// Runs `f` holding the lock (other processes wait). A lock held for longer than
    /// [`LOCK_WAIT`] (its holder stopped with SIGSTOP mid-call) fails the call with
    /// `InternalError`, rather than hanging this process behind it.
    pub(crate) fn with_lock<T>(
        &mut self,
        f: impl FnOnce(&mut StateFile) -> Result<T, CloudError>,
    ) -> Result<T, CloudError> {
        let started = std::time::Instant::now();
        loop {
            match self.lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(failed(
                        &self.path,
                        "locking",
                        format!("another process has held it for {LOCK_WAIT:?}"),
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(failed(&self.path, "locking", e));
                }
            }
        }
        let result = f(self);
        let _ = self.lock.unlock();
        result
    }

    /// Reads the file into `model` unless it is what this process last read or wrote; answers
    /// whether there is a file. Call with the lock held.
    pub(crate) fn load(&mut self, model: &mut Model) -> Result<bool, CloudError> {
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.seen = None;
                return Ok(false);
            }
            Err(e) => return Err(failed(&self.path, "reading", e)),
        };
        let mut reader = BufReader::new(file);
        let mut header = String::new();
        reader
            .read_line(&mut header)
            .map_err(|e| failed(&self.path, "reading", e))?;
        let generation = header
            .trim_end()
            .strip_prefix(HEADER)
            .and_then(|rest| rest.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                failed(
                    &self.path,
                    "decoding",
                    format!("its first line is not `{HEADER} GENERATION`"),
                )
            })?;
        if self.seen == Some(generation) {
            return Ok(true);
        }
        let mut bytes = Vec::new();
        reader
            .read_to_end(&mut bytes)
            .map_err(|e| failed(&self.path, "reading", e))?;
        let file: FileOwned =
            serde_json::from_slice(&bytes).map_err(|e| failed(&self.path, "decoding", e))?;
        if file.fingerprint != self.fingerprint {
            return Err(CloudError::InvalidParameterValue {
                message: format!(
                    "the fake cloud's state file {} was made from another seed; remove it to \
                     start the fake cloud afresh from this one",
                    self.path.display()
                ),
            });
        }
        model.import(file.model);
        self.seen = Some(generation);
        Ok(true)
    }

    /// Writes `model` whole as the next generation (a temporary file renamed over the state
    /// file). Call with the lock held, after [`StateFile::load`]. A failure leaves the file as
    /// it was, and the next call decodes it again.
    pub(crate) fn save(&mut self, model: &Model) -> Result<(), CloudError> {
        let generation = self.seen.take().unwrap_or(0) + 1;
        let mut bytes = format!("{HEADER} {generation}\n").into_bytes();
        serde_json::to_writer(
            &mut bytes,
            &FileRef {
                fingerprint: &self.fingerprint,
                model: model.export(),
            },
        )
        .map_err(|e| failed(&self.path, "encoding", e))?;
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, &bytes).map_err(|e| failed(&self.path, "writing", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| failed(&self.path, "writing", e))?;
        self.seen = Some(generation);
        Ok(())
    }
}
