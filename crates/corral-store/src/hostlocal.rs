//! Reading the reference host-local plugin's data directory, so a network can switch to
//! corral-ipam without losing its allocations.
//!
//! host-local keeps one file per address in `dataDir/<network>/`: the file is named by the
//! address and holds the container ID, then `\r\n` and the interface name (older versions
//! wrote only the container ID). `last_reserved_ip.N` and `lock` are bookkeeping.

use std::net::IpAddr;
use std::path::Path;

use corral_core::{AttachmentKey, PoolName, validate_owner};

use crate::{StoreError, StoredAllocation};

/// One address host-local recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLocalEntry {
    pub addr: IpAddr,
    pub container_id: String,
    pub ifname: Option<String>,
}

/// The entries of `dir` (host-local's `dataDir/<network>`); `Ok(None)` if it does not exist.
/// Files that are not addresses are skipped; an unreadable directory is an error.
pub fn read_host_local_dir(dir: &Path) -> Result<Option<Vec<HostLocalEntry>>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StoreError::Directory {
                path: dir.display().to_string(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| StoreError::Directory {
            path: dir.display().to_string(),
            source,
        })?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Ok(addr) = name.parse::<IpAddr>() else {
            continue;
        };
        // A file we cannot read is skipped rather than failing the switch; the address is
        // still imported, held by an unknown owner, so it is never handed out twice.
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let mut lines = text.lines().map(str::trim);
        let container_id = lines.next().unwrap_or_default().to_owned();
        let ifname = lines.next().filter(|s| !s.is_empty()).map(str::to_owned);
        out.push(HostLocalEntry {
            addr,
            container_id,
            ifname,
        });
    }
    out.sort_by_key(|e| (corral_core::Family::of(e.addr), e.addr));
    Ok(Some(out))
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
                .filter(|key| {
                    keyed.insert((
                        pool.clone(),
                        corral_core::Family::of(entry.addr),
                        key.clone(),
                    ))
                });
            let owner =
                if validate_owner(&entry.container_id).is_ok() && !entry.container_id.is_empty() {
                    entry.container_id.clone()
                } else {
                    "imported-from-host-local".to_owned()
                };
            StoredAllocation {
                pool,
                addr: entry.addr,
                owner,
                key,
                generation: 0,
                lease: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_file_formats_and_skips_bookkeeping() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("mynet");
        std::fs::create_dir(&net).unwrap();
        std::fs::write(net.join("10.22.0.2"), "abc123\r\neth0").unwrap();
        std::fs::write(net.join("10.22.0.3"), "old-format-id").unwrap();
        std::fs::write(net.join("fd22::5"), "v6ctr\r\nnet1").unwrap();
        std::fs::write(net.join("10.22.0.9"), "../evil\r\neth0").unwrap();
        std::fs::write(net.join("10.22.0.4"), "old-format-id").unwrap();
        std::fs::write(net.join("last_reserved_ip.0"), "10.22.0.3").unwrap();
        std::fs::write(net.join("lock"), "").unwrap();
        let entries = read_host_local_dir(&net).unwrap().unwrap();
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
}
