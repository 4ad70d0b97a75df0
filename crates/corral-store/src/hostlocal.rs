//! The reference host-local plugin's data directory: read, so a network can switch to
//! corral-ipam without losing its allocations; and written, so it can switch back.
//!
//! host-local (1.x) keeps one file per address in `dataDir/<network>/`: the file is named by
//! the address and holds the container ID, then `\r\n` and the interface name (older versions
//! wrote only the container ID). `last_reserved_ip.N` holds the last address handed out from
//! the N-th range set (host-local's next-fit position), and `lock` is the file it flocks.
//!
//! Only regular files are read, each at most [`MAX_HOST_LOCAL_FILE_BYTES`] (see
//! [`crate::read_small_file`]): a FIFO, a device or an oversized file named like an address
//! never blocks or floods the call. Its address is still taken over, held by an unknown owner,
//! because host-local may consider it held; the reader reports it as a warning.

use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use corral_core::{AttachmentKey, Family, PoolName, validate_owner};

use crate::files::read_small_file;
use crate::{StoreError, StoredAllocation};

/// The largest host-local file read: a container ID (corral accepts up to 1,024 bytes), a line
/// break and an interface name fit many times over.
pub const MAX_HOST_LOCAL_FILE_BYTES: u64 = 4096;

/// The prefix of host-local's next-fit files, followed by the range set's index.
pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";

/// The owner recorded for an address whose host-local file names no usable container ID.
pub const UNKNOWN_HOST_LOCAL_OWNER: &str = "imported-from-host-local";

/// One address host-local recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLocalEntry {
    pub addr: IpAddr,
    pub container_id: String,
    pub ifname: Option<String>,
}

/// What a host-local network directory holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostLocalDir {
    /// Every address file, ordered by family and address.
    pub entries: Vec<HostLocalEntry>,
    /// `last_reserved_ip.N` as (N, address), for each one that could be read.
    pub last_reserved: Vec<(usize, IpAddr)>,
    /// Files that could not be read as host-local writes them, each saying why and what was
    /// done instead; for the caller to report.
    pub warnings: Vec<String>,
}

fn directory_error(dir: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Directory {
        path: dir.display().to_string(),
        source,
    }
}

/// The contents of `dir` (host-local's `dataDir/<network>`); `Ok(None)` if it does not exist.
/// Files that are not addresses or bookkeeping are skipped; an unreadable directory is an
/// error.
pub fn read_host_local_dir(dir: &Path) -> Result<Option<HostLocalDir>, StoreError> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(directory_error(dir)(source)),
    };
    let mut names = Vec::new();
    for entry in listing {
        let entry = entry.map_err(directory_error(dir))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    Ok(Some(parse_host_local_files(
        names.iter().map(String::as_str),
        |name| {
            let path = dir.join(name);
            let bytes =
                read_small_file(&path, MAX_HOST_LOCAL_FILE_BYTES).map_err(|e| e.to_string());
            (path.display().to_string(), bytes)
        },
    )))
}

/// The contents of a host-local network directory from its file names, reading a file only
/// when its name is an address or a `last_reserved_ip.N`: `read` answers the file's path (for
/// messages) and its bytes, or why they could not be read. Pure, so the fuzz target
/// (`fuzz/fuzz_targets/host_local.rs`) drives it with files in memory.
pub fn parse_host_local_files<'a>(
    names: impl IntoIterator<Item = &'a str>,
    read: impl Fn(&str) -> (String, Result<Vec<u8>, String>),
) -> HostLocalDir {
    let mut out = HostLocalDir::default();
    // (whether the name is the address's canonical text, the name, what the file holds)
    let mut entries: Vec<(bool, &str, HostLocalEntry)> = Vec::new();
    for name in names {
        if let Some(index) = name.strip_prefix(LAST_RESERVED_PREFIX) {
            let Ok(index) = index.parse::<usize>() else {
                continue;
            };
            let (path, bytes) = read(name);
            let position = bytes.and_then(|bytes| {
                String::from_utf8_lossy(&bytes)
                    .trim()
                    .parse::<IpAddr>()
                    .map_err(|_| format!("{path} holds no address"))
            });
            match position {
                Ok(addr) => out.last_reserved.push((index, addr)),
                Err(why) => out
                    .warnings
                    .push(format!("{why}; next-fit starts from the range's beginning")),
            }
            continue;
        }
        let Ok(addr) = name.parse::<IpAddr>() else {
            continue;
        };
        // A file that cannot be read as host-local writes it keeps its address, held by an
        // unknown owner: host-local may hold it, so it must never be handed out twice.
        let text = match read(name).1 {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(error) => {
                out.warnings.push(format!(
                    "{error}; {addr} is taken over as held by an unknown owner"
                ));
                String::new()
            }
        };
        let mut lines = text.lines().map(str::trim);
        let container_id = lines.next().unwrap_or_default().to_owned();
        let ifname = lines.next().filter(|s| !s.is_empty()).map(str::to_owned);
        let entry = HostLocalEntry {
            addr,
            container_id,
            ifname,
        };
        entries.push((name == addr.to_string(), name, entry));
    }
    // An IPv6 address has many texts (`fd01::2`, `fd01:0::2`, `fd01::0002`): host-local names
    // its file by the canonical one, and a second file naming the same address is read once
    // (the canonical name first), never imported as two allocations of one address (found by
    // the fuzz target `host_local`: the takeover's store refused the second row, and every call
    // on the network failed).
    entries.sort_by_key(|(canonical, name, e)| (Family::of(e.addr), e.addr, !canonical, *name));
    for (_, name, entry) in entries {
        if let Some(kept) = out.entries.last()
            && kept.addr == entry.addr
        {
            out.warnings.push(format!(
                "{name} names {} again, which another file holds; it is read once",
                entry.addr
            ));
            continue;
        }
        out.entries.push(entry);
    }
    out.last_reserved.sort();
    out
}

/// Whether host-local's file for `addr` is still in `dir`, whatever it holds: only its
/// removal (host-local's DEL) says the address was given up. An error other than "not
/// found" counts as present.
pub fn host_local_file_exists(dir: &Path, addr: IpAddr) -> bool {
    match std::fs::symlink_metadata(dir.join(addr.to_string())) {
        Ok(_) => true,
        Err(error) => error.kind() != std::io::ErrorKind::NotFound,
    }
}

/// Turns host-local's entries into allocations of `network`, each in the pool `pool_for`
/// names. An entry whose container ID or interface name is not a valid attachment key part
/// keeps its address under an owner that says so, so nothing recorded is lost.
pub fn host_local_allocations(
    network: &str,
    entries: &[HostLocalEntry],
    pool_for: impl Fn(IpAddr) -> PoolName,
) -> Vec<StoredAllocation> {
    // An attachment holds one address per pool and family; a second one (old files without
    // an interface name, or an address that falls back to another set's pool) keeps its
    // address without the key, so nothing recorded is lost and the import cannot conflict.
    let mut keyed = std::collections::HashSet::new();
    entries
        .iter()
        .map(|entry| {
            let ifname = entry.ifname.as_deref().unwrap_or("eth0");
            let pool = pool_for(entry.addr);
            let key = AttachmentKey::new(network, &entry.container_id, ifname)
                .ok()
                .filter(|key| keyed.insert((pool.clone(), Family::of(entry.addr), key.clone())));
            let owner =
                if validate_owner(&entry.container_id).is_ok() && !entry.container_id.is_empty() {
                    entry.container_id.clone()
                } else {
                    UNKNOWN_HOST_LOCAL_OWNER.to_owned()
                };
            StoredAllocation {
                pool,
                addr: entry.addr,
                owner,
                key,
                // Generation 0 is never handed out by an engine (they start at 1): a release
                // naming it frees only the allocation taken over, never a later one.
                generation: 0,
                lease: None,
            }
        })
        .collect()
}

/// What [`write_host_local_dir`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostLocalWritten {
    pub dir: PathBuf,
    /// Address files written.
    pub written: usize,
    /// Address files of addresses not among the entries, left as they are: host-local may
    /// have handed them out since, and removing one could hand it out twice.
    pub kept: usize,
}

/// Writes `entries` as host-local's files in `dir` (host-local's `dataDir/<network>`), so
/// host-local treats exactly these addresses as taken: one file per address holding
/// `<container ID>\r\n<ifname>` (the container ID alone without an interface name), the
/// `last_reserved_ip.N` files, and `lock`. Address files for other addresses are removed.
/// host-local's lock is held meanwhile, and everything is synced before this returns.
pub fn write_host_local_dir(
    dir: &Path,
    entries: &[HostLocalEntry],
    last_reserved: &[(usize, IpAddr)],
) -> Result<HostLocalWritten, StoreError> {
    let fail = directory_error(dir);
    std::fs::create_dir_all(dir).map_err(&fail)?;
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(&fail)?;
    // host-local flocks this file for each call: a call running now finishes first, and
    // the next one sees every file.
    lock.lock().map_err(&fail)?;
    let mut out = HostLocalWritten {
        dir: dir.to_path_buf(),
        ..HostLocalWritten::default()
    };
    let wanted: std::collections::HashSet<IpAddr> = entries.iter().map(|e| e.addr).collect();
    for listed in std::fs::read_dir(dir).map_err(&fail)? {
        let listed = listed.map_err(&fail)?;
        let stale = listed
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<IpAddr>().ok())
            .is_some_and(|addr| !wanted.contains(&addr));
        if stale && listed.file_type().map_err(&fail)?.is_file() {
            out.kept += 1;
        }
    }
    let write = |name: String, contents: &str| -> Result<(), StoreError> {
        let mut file = File::create(dir.join(name)).map_err(&fail)?;
        file.write_all(contents.as_bytes()).map_err(&fail)?;
        file.sync_all().map_err(&fail)
    };
    for entry in entries {
        let contents = match &entry.ifname {
            Some(ifname) => format!("{}\r\n{ifname}", entry.container_id),
            None => entry.container_id.clone(),
        };
        write(entry.addr.to_string(), &contents)?;
        out.written += 1;
    }
    for (index, addr) in last_reserved {
        write(format!("{LAST_RESERVED_PREFIX}{index}"), &addr.to_string())?;
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(&fail)?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(directory_error(parent))?;
    }
    drop(lock);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// host-local's folder of network `name` in a new temporary folder, holding `files`
    /// (name, text).
    fn network_dir(name: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join(name);
        std::fs::create_dir(&net).unwrap();
        for (file, text) in files {
            std::fs::write(net.join(file), text).unwrap();
        }
        (dir, net)
    }

    #[test]
    fn reads_both_file_formats_and_skips_bookkeeping() {
        let (dir, net) = network_dir(
            "mynet",
            &[
                ("10.22.0.2", "abc123\r\neth0"),
                ("10.22.0.3", "old-format-id"),
                ("fd22::5", "v6ctr\r\nnet1"),
                ("10.22.0.9", "../evil\r\neth0"),
                ("10.22.0.4", "old-format-id"),
                ("last_reserved_ip.0", "10.22.0.3"),
                ("lock", ""),
            ],
        );
        let read = read_host_local_dir(&net).unwrap().unwrap();
        assert_eq!(read.last_reserved, [(0, "10.22.0.3".parse().unwrap())]);
        assert!(read.warnings.is_empty(), "{:?}", read.warnings);
        let entries = read.entries;
        assert_eq!(entries.len(), 5);
        let rows = host_local_allocations("mynet", &entries, |_| PoolName::new("mynet").unwrap());
        assert_eq!(rows[0].addr.to_string(), "10.22.0.2");
        assert_eq!(
            rows[0].key.as_ref().unwrap().to_string(),
            "mynet/abc123/eth0"
        );
        assert_eq!(rows[1].key.as_ref().unwrap().ifname(), "eth0");
        // The same attachment twice in one pool and family: the second keeps only its address.
        assert_eq!(rows[2].addr.to_string(), "10.22.0.4");
        assert!(rows[2].key.is_none());
        // An entry that cannot be a key still holds its address.
        assert_eq!(rows[3].addr.to_string(), "10.22.0.9");
        assert!(rows[3].key.is_none());
        assert_eq!(
            rows[4].key.as_ref().unwrap().to_string(),
            "mynet/v6ctr/net1"
        );
        assert!(
            read_host_local_dir(&dir.path().join("absent"))
                .unwrap()
                .is_none()
        );
    }

    /// Regression: a FIFO among host-local's files made the takeover wait forever for a
    /// writer, holding the state directory's lock.
    #[test]
    fn an_address_two_files_name_is_read_once_from_its_canonical_name() {
        let (_dir, net) = network_dir(
            "n",
            &[
                ("fd01:0::0002", "other\r\neth1"),
                ("fd01::2", "c1\r\neth0"),
                ("fd01:0:0::2", "third\r\neth2"),
                ("10.1.0.2", "c2\r\neth0"),
            ],
        );
        let read = read_host_local_dir(&net).unwrap().unwrap();
        let ids: Vec<_> = read
            .entries
            .iter()
            .map(|e| (e.addr.to_string(), e.container_id.as_str()))
            .collect();
        assert_eq!(
            ids,
            [("10.1.0.2".to_owned(), "c2"), ("fd01::2".to_owned(), "c1")]
        );
        assert_eq!(read.warnings.len(), 2, "{:?}", read.warnings);
        assert!(
            read.warnings[0].starts_with("fd01:0:0::2 names fd01::2 again"),
            "{:?}",
            read.warnings
        );
    }

    #[test]
    fn a_fifo_a_directory_or_an_oversized_file_keeps_its_address_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("10.22.0.7"))
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        std::fs::create_dir(dir.path().join("10.22.0.8")).unwrap();
        std::fs::write(dir.path().join("10.22.0.9"), vec![b'x'; 5000]).unwrap();
        std::fs::write(dir.path().join("10.22.0.10"), "ok\r\neth0").unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("last_reserved_ip.0"))
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let read = read_host_local_dir(dir.path()).unwrap().unwrap();
        let addrs: Vec<String> = read.entries.iter().map(|e| e.addr.to_string()).collect();
        assert_eq!(addrs, ["10.22.0.7", "10.22.0.8", "10.22.0.9", "10.22.0.10"]);
        assert_eq!(read.entries[3].container_id, "ok");
        assert!(read.last_reserved.is_empty());
        assert_eq!(read.warnings.len(), 4, "{:?}", read.warnings);
        let all = read.warnings.join("\n");
        for needle in ["fifo", "directory", "larger than 4096 bytes", "next-fit"] {
            assert!(all.contains(needle), "{all}");
        }
    }

    #[test]
    fn what_is_written_reads_back_and_other_addresses_are_kept() {
        let (_dir, net) = network_dir("n", &[("10.1.0.9", "gone\r\neth0"), ("notes", "kept")]);
        let entries = vec![
            HostLocalEntry {
                addr: "10.1.0.2".parse().unwrap(),
                container_id: "c1".into(),
                ifname: Some("eth0".into()),
            },
            HostLocalEntry {
                addr: "fd01::2".parse().unwrap(),
                container_id: "c1".into(),
                ifname: Some("eth0".into()),
            },
        ];
        let last = [(0, "10.1.0.2".parse().unwrap())];
        let written = write_host_local_dir(&net, &entries, &last).unwrap();
        assert_eq!((written.written, written.kept), (2, 1));
        assert!(
            net.join("10.1.0.9").exists(),
            "a file corral does not hold is kept"
        );
        assert_eq!(
            std::fs::read(net.join("10.1.0.2")).unwrap(),
            b"c1\r\neth0".to_vec()
        );
        assert!(net.join("lock").exists() && net.join("notes").exists());
        let read = read_host_local_dir(&net).unwrap().unwrap();
        for entry in &entries {
            assert!(read.entries.contains(entry), "{entry:?}");
        }
        assert_eq!(read.entries.len(), entries.len() + 1, "and the kept file");
        assert_eq!(read.last_reserved, last);
    }
}
