//! Releases waiting for the node agent: the one record format corral-ipam writes and the agent
//! applies.
//!
//! In agent mode a DEL must not fail because the agent is away (runtimes ignore a failed DEL,
//! so the address would leak). corral-ipam then records the DEL durably under the network's
//! `dataDir`, in `corral.pending/<hash>.del`, and answers success; the agent applies every
//! record meant for it when it starts, before it serves anything. A record is a small JSON
//! document ([`PendingDel`], format [`PENDING_FORMAT`]) naming the agent's socket, the
//! attachment key and the network's pools; its file name is a hash of the key (the key is
//! inside, and a record whose key differs is never taken for another's).
//!
//! A late release must never free what a later ADD of the same key obtained. So a record is
//! *claimed* by renaming it (to `<name>.claimed-<pid>` by corral-ipam, `<name>.agent` by the
//! agent) before it is applied, so exactly one process applies it; an ADD or CHECK of a key
//! first settles that key's own record (claim, DEL through the agent, remove); and a removal
//! is synced before anything that relies on it is answered. Claimed files of corral-ipam are
//! never applied by anyone else: a process killed with one leaves the key holding its
//! address, which its next DEL releases.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use corral_core::AttachmentKey;
use serde::{Deserialize, Serialize};

use crate::files::{create_dirs_synced, read_small_file};
use crate::{PoolSpec, ScopeConfig};

/// The directory, under a CNI network's `dataDir`, that holds pending records.
pub const PENDING_DIR: &str = "corral.pending";
/// The format tag every record carries.
pub const PENDING_FORMAT: &str = "corral-pending-del/1";
/// The largest record read (a network's pools with their exclusions fit many times over).
pub const MAX_PENDING_RECORD_BYTES: u64 = 1 << 20;
/// The suffix of an unclaimed record.
const RECORD_SUFFIX: &str = ".del";
/// The suffix the agent gives a record it claimed (and applies before it serves anything).
pub const AGENT_CLAIM_SUFFIX: &str = ".agent";

/// A DEL corral-ipam could not deliver to the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PendingDel {
    pub format: String,
    /// The agent's socket, as the network configuration names it: only that agent applies
    /// the record.
    pub agent: PathBuf,
    pub network: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    /// The network's pools, as the DEL would have sent them.
    pub pools: Vec<PoolSpec>,
}

impl PendingDel {
    pub fn new(agent: &Path, key: &AttachmentKey, config: &ScopeConfig) -> PendingDel {
        PendingDel {
            format: PENDING_FORMAT.to_owned(),
            agent: agent.to_path_buf(),
            network: key.network().to_owned(),
            container_id: key.container_id().to_owned(),
            ifname: key.ifname().to_owned(),
            pools: config.pools.clone(),
        }
    }

    /// The attachment key, validated.
    pub fn key(&self) -> Result<AttachmentKey, String> {
        AttachmentKey::new(&self.network, &self.container_id, &self.ifname)
            .map_err(|e| e.to_string())
    }

    /// Parses a record, checking its format and key.
    pub fn parse(bytes: &[u8]) -> Result<PendingDel, String> {
        let record: PendingDel = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if record.format != PENDING_FORMAT {
            return Err(format!(
                "format {:?} is not {PENDING_FORMAT:?}",
                record.format
            ));
        }
        record.key()?;
        Ok(record)
    }
}

/// Why a pending record could not be written, claimed or removed.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds the pending release of another attachment ({other})")]
    SlotTaken { path: PathBuf, other: String },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PendingError {
    let path = path.to_path_buf();
    move |source| PendingError::Io {
        action,
        path,
        source,
    }
}

/// `data_dir/corral.pending`.
pub fn pending_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(PENDING_DIR)
}

/// The record's file name for `key`: 128-bit FNV-1a of its three parts, in hex. The parts
/// themselves may be up to 1,300 bytes together, more than a file name holds.
pub fn pending_file_name(key: &AttachmentKey) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut hash = OFFSET;
    let parts = [key.network(), key.container_id(), key.ifname()];
    for (i, part) in parts.iter().enumerate() {
        let separator: &[u8] = if i == 0 { b"" } else { b"\0" };
        for &byte in separator.iter().chain(part.as_bytes()) {
            hash ^= u128::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    format!("{hash:032x}{RECORD_SUFFIX}")
}

fn sync_dir(dir: &Path) -> Result<(), PendingError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync", dir))
}

/// Creates `dir` and any missing parents, each made durable in its parent.
fn create_dir_durably(dir: &Path) -> Result<(), PendingError> {
    create_dirs_synced(dir, io_error("create", dir), sync_dir)
}

/// The record in `path`, if it is there: `Ok(None)` when it is not.
fn read_record(path: &Path) -> Result<Option<Result<PendingDel, String>>, PendingError> {
    match read_small_file(path, MAX_PENDING_RECORD_BYTES) {
        Ok(bytes) => Ok(Some(PendingDel::parse(&bytes))),
        Err(crate::SmallFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(error) => Ok(Some(Err(error.to_string()))),
    }
}

/// Records `record` under `data_dir`, durably (the file and its directory synced) before it
/// returns. A record of the same key is replaced; one of another key (a hash collision) is
/// never overwritten.
pub fn record_pending_del(data_dir: &Path, record: &PendingDel) -> Result<PathBuf, PendingError> {
    let key = record
        .key()
        .map_err(|e| io_error("record", data_dir)(std::io::Error::other(e)))?;
    let dir = pending_dir(data_dir);
    create_dir_durably(&dir)?;
    let path = dir.join(pending_file_name(&key));
    if let Some(existing) = read_record(&path)? {
        let same = existing
            .as_ref()
            .is_ok_and(|other| other.key() == Ok(key.clone()));
        if !same {
            return Err(PendingError::SlotTaken {
                path,
                other: match existing {
                    Ok(other) => other.key().map(|k| k.to_string()).unwrap_or_default(),
                    Err(why) => why,
                },
            });
        }
    }
    let temporary = dir.join(format!(
        "{}.tmp-{}",
        pending_file_name(&key),
        std::process::id()
    ));
    let bytes = serde_json::to_vec(record)
        .map_err(|e| io_error("encode", &temporary)(std::io::Error::other(e)))?;
    let mut file = File::create(&temporary).map_err(io_error("create", &temporary))?;
    file.write_all(&bytes)
        .and_then(|()| file.sync_all())
        .map_err(io_error("write", &temporary))?;
    drop(file);
    std::fs::rename(&temporary, &path).map_err(io_error("rename", &temporary))?;
    sync_dir(&dir)?;
    Ok(path)
}

/// A record this process has claimed: nobody else applies it.
#[derive(Debug)]
pub struct Claimed {
    /// Where the record was.
    slot: PathBuf,
    /// Where it is now.
    claimed: PathBuf,
    pub record: PendingDel,
}

impl Claimed {
    /// The record was applied: removes it, durably, so it can never be applied again.
    pub fn remove(self) -> Result<(), PendingError> {
        match std::fs::remove_file(&self.claimed) {
            // Gone already: what was to be done is done.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            other => other.map_err(io_error("remove", &self.claimed))?,
        }
        sync_dir(parent_of(&self.claimed))
    }

    /// The record could not be applied: puts it back for a later attempt.
    pub fn put_back(self) -> Result<(), PendingError> {
        std::fs::rename(&self.claimed, &self.slot).map_err(io_error("rename", &self.claimed))?;
        sync_dir(parent_of(&self.slot))
    }

    /// Where the claimed record is now.
    pub fn path(&self) -> &Path {
        &self.claimed
    }
}

fn parent_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// Claims the record of `key` under `data_dir` for this process (corral-ipam): `Ok(None)`
/// when there is none (one failed rename: the usual case), or when the file there is not
/// this key's record (it is left as it was).
pub fn claim_pending_del(
    data_dir: &Path,
    key: &AttachmentKey,
) -> Result<Option<Claimed>, PendingError> {
    let slot = pending_dir(data_dir).join(pending_file_name(key));
    let claimed = slot.with_file_name(format!(
        "{}.claimed-{}",
        pending_file_name(key),
        std::process::id()
    ));
    match std::fs::rename(&slot, &claimed) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error("claim", &slot)(error)),
    }
    let record = read_record(&claimed)?.and_then(Result::ok);
    match record {
        Some(record) if record.key().as_ref() == Ok(key) => Ok(Some(Claimed {
            slot,
            claimed,
            record,
        })),
        _ => {
            std::fs::rename(&claimed, &slot).map_err(io_error("rename", &claimed))?;
            Ok(None)
        }
    }
}

/// One file of a pending directory, as the agent finds it at start.
#[derive(Debug)]
pub enum PendingFile {
    /// A record claimed for the agent: apply it, then [`Claimed::remove`] it (or
    /// [`Claimed::put_back`]).
    Claimed(Claimed),
    /// A record for another agent's socket, left as it is.
    OtherAgent { path: PathBuf, agent: PathBuf },
    /// A file that is not a valid record, left as it is for a person to look at.
    Malformed { path: PathBuf, reason: String },
}

/// Claims, for the agent listening on a socket `is_mine` accepts, every record under
/// `data_dir` (unclaimed ones, and those an agent claimed before it stopped mid-way). A
/// missing directory holds nothing.
pub fn claim_all_for_agent(
    data_dir: &Path,
    is_mine: impl Fn(&Path) -> bool,
) -> Result<Vec<PendingFile>, PendingError> {
    let dir = pending_dir(data_dir);
    let listing = match std::fs::read_dir(&dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io_error("list", &dir)(error)),
    };
    let mut names: Vec<String> = Vec::new();
    for entry in listing {
        let entry = entry.map_err(io_error("list", &dir))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    names.sort();
    let mut out = Vec::new();
    // A slot may be listed twice: `X.del`, recorded again by a DEL while the agent was down,
    // beside `X.del.agent`, a claim a killed agent left. Both are the same key's DEL; the
    // first claims the slot (renaming over the old claim), the second is the same claim.
    let mut slots_seen = std::collections::BTreeSet::new();
    for name in names {
        let (slot_name, already_claimed) = if name.ends_with(RECORD_SUFFIX) {
            (name.clone(), false)
        } else if let Some(slot) = name.strip_suffix(AGENT_CLAIM_SUFFIX)
            && slot.ends_with(RECORD_SUFFIX)
        {
            (slot.to_owned(), true)
        } else {
            continue;
        };
        if !slots_seen.insert(slot_name.clone()) {
            continue;
        }
        let slot = dir.join(&slot_name);
        let claimed = dir.join(format!("{slot_name}{AGENT_CLAIM_SUFFIX}"));
        let record = match read_record(if already_claimed { &claimed } else { &slot })? {
            Some(Ok(record)) => record,
            Some(Err(reason)) => {
                out.push(PendingFile::Malformed {
                    path: dir.join(&name),
                    reason,
                });
                continue;
            }
            None => continue,
        };
        if !is_mine(&record.agent) {
            out.push(PendingFile::OtherAgent {
                path: dir.join(&name),
                agent: record.agent,
            });
            continue;
        }
        if !already_claimed {
            match std::fs::rename(&slot, &claimed) {
                Ok(()) => {}
                // corral-ipam claimed it meanwhile, to settle it itself.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(io_error("claim", &slot)(error)),
            }
        }
        out.push(PendingFile::Claimed(Claimed {
            slot,
            claimed,
            record,
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(container: &str) -> AttachmentKey {
        AttachmentKey::new("net", container, "eth0").unwrap()
    }

    const SOCKET: &str = "/run/a.sock";

    /// A directory holding the DEL record of `c1` for the agent at [`SOCKET`].
    fn recorded_c1() -> (tempfile::TempDir, PendingDel) {
        let dir = tempfile::tempdir().unwrap();
        let record = PendingDel::new(Path::new(SOCKET), &key("c1"), &ScopeConfig::default());
        record_pending_del(dir.path(), &record).unwrap();
        (dir, record)
    }

    /// No agent finds a record to claim in `dir`.
    fn assert_nothing_to_claim(dir: &Path) {
        assert!(claim_all_for_agent(dir, |_| true).unwrap().is_empty());
    }

    #[test]
    fn a_record_is_claimed_once_and_only_for_its_own_key() {
        let (dir, record) = recorded_c1();
        let socket = Path::new(SOCKET);
        // Recording the same key again replaces it.
        record_pending_del(dir.path(), &record).unwrap();
        assert!(claim_pending_del(dir.path(), &key("c2")).unwrap().is_none());
        let claimed = claim_pending_del(dir.path(), &key("c1")).unwrap().unwrap();
        assert_eq!(claimed.record, record);
        // Claimed: nobody else finds it.
        assert!(claim_pending_del(dir.path(), &key("c1")).unwrap().is_none());
        assert_nothing_to_claim(dir.path());
        claimed.put_back().unwrap();
        let all = claim_all_for_agent(dir.path(), |agent| agent == socket).unwrap();
        let [PendingFile::Claimed(claimed)] = all.as_slice() else {
            panic!("{all:?}")
        };
        assert_eq!(claimed.record, record);
        // An agent that stopped before removing its claim finds it again at its next start.
        let again = claim_all_for_agent(dir.path(), |agent| agent == socket).unwrap();
        let [PendingFile::Claimed(claimed)] = again.as_slice() else {
            panic!("{again:?}")
        };
        std::fs::remove_file(claimed.path()).unwrap();
        assert_nothing_to_claim(dir.path());
    }

    /// Regression (review): an agent killed between claiming and removing a record, then the
    /// same key's DEL recorded again while it was down: the slot was claimed twice, the second
    /// removal failed and the agent would not start.
    #[test]
    fn a_slot_recorded_again_beside_a_killed_agents_claim_is_claimed_once() {
        let (dir, record) = recorded_c1();
        let socket = Path::new(SOCKET);
        // The agent claims it and is killed before removing the claim.
        let first = claim_all_for_agent(dir.path(), |_| true).unwrap();
        assert_eq!(first.len(), 1);
        drop(first);
        // The runtime retries the DEL while the agent is down: recorded again.
        record_pending_del(dir.path(), &record).unwrap();
        let all = claim_all_for_agent(dir.path(), |agent| agent == socket).unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        for file in all {
            let PendingFile::Claimed(claimed) = file else {
                panic!("{file:?}")
            };
            claimed.remove().unwrap();
        }
        assert_nothing_to_claim(dir.path());
    }

    #[test]
    fn malformed_and_foreign_records_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let record = PendingDel::new(
            Path::new("/run/b.sock"),
            &key("c1"),
            &ScopeConfig::default(),
        );
        record_pending_del(dir.path(), &record).unwrap();
        let pending = pending_dir(dir.path());
        std::fs::write(pending.join("junk.del"), "{not json").unwrap();
        std::fs::write(pending.join("notes.txt"), "ignored").unwrap();
        let all =
            claim_all_for_agent(dir.path(), |agent| agent == Path::new("/run/a.sock")).unwrap();
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(
            all.iter()
                .any(|f| matches!(f, PendingFile::OtherAgent { .. }))
        );
        assert!(
            all.iter()
                .any(|f| matches!(f, PendingFile::Malformed { .. }))
        );
        assert!(pending.join("junk.del").exists());
        assert!(pending.join(pending_file_name(&key("c1"))).exists());
    }

    #[test]
    fn a_hash_collision_never_overwrites_another_keys_record() {
        let dir = tempfile::tempdir().unwrap();
        let pending = pending_dir(dir.path());
        std::fs::create_dir_all(&pending).unwrap();
        // Another key's record where c1's would go.
        let other = PendingDel::new(Path::new("/s"), &key("c2"), &ScopeConfig::default());
        std::fs::write(
            pending.join(pending_file_name(&key("c1"))),
            serde_json::to_vec(&other).unwrap(),
        )
        .unwrap();
        let mine = PendingDel::new(Path::new("/s"), &key("c1"), &ScopeConfig::default());
        let error = record_pending_del(dir.path(), &mine).unwrap_err();
        assert!(matches!(error, PendingError::SlotTaken { .. }), "{error}");
        assert!(claim_pending_del(dir.path(), &key("c1")).unwrap().is_none());
        assert!(pending.join(pending_file_name(&key("c1"))).exists());
    }
}
