//! `corral host-local export`: the way back from corral-ipam to the reference host-local
//! plugin. It reads a network's allocations from corral's state directory, offline, and
//! writes them as host-local's files, so host-local treats exactly those addresses as taken.
//!
//! The state is read with the directory's lock held, as a corral-ipam call would; a running
//! agent owns its directory, so the export refuses while one does (stop it first). corral's
//! own state is left as it is.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use corral_core::Family;
use corral_store::{
    DB_FILE, HostLocalEntry, ScopeState, SqliteStore, Store, StoreError, StoredAllocation, Txn,
    write_host_local_dir,
};

use crate::exit::{Failure, Outcome};

#[derive(Debug, Subcommand)]
pub enum HostLocalCommand {
    /// Write a network's allocations as host-local's files (`<dir>/<network>/<ip>`), so the
    /// network can go back to host-local without handing out an address twice
    ///
    /// Each file holds `<container ID>\r\n<ifname>`, as host-local 1.x writes it, so
    /// host-local's DEL of the container frees it; `last_reserved_ip.N` carries corral's
    /// next-fit position of each range set (N counts the range sets in the order of the
    /// network's pools and, within a pool, IPv4 before IPv6, which is the configuration's
    /// order for the usual `[[IPv4 range], [IPv6 range]]`). Address files of addresses corral
    /// does not hold are left as they are (host-local may have handed them out). Reads
    /// corral's state offline, holding its lock until the files are written (corral-ipam calls
    /// wait meanwhile): refused while an agent owns the directory.
    ///
    /// corral keeps its state: switching the network back to corral-ipam later does not take
    /// over host-local's files again, so remove corral's state of the network first if
    /// host-local has handed out addresses meanwhile.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// corral's state directory: corral-ipam's `dataDir`, or the agent's `data_dir` for a
    /// network served in agent mode
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// The CNI network's name (its `name`)
    #[arg(long, value_name = "NAME")]
    network: String,
    /// host-local's `dataDir` [default: --data-dir]
    #[arg(long, value_name = "DIR")]
    to: Option<PathBuf>,
}

pub fn run(command: HostLocalCommand) -> Result<Outcome, Failure> {
    match command {
        HostLocalCommand::Export(args) => export(&args),
    }
}

fn store_failure(data_dir: &Path, error: StoreError) -> Failure {
    match error {
        StoreError::Held { holder, .. } => Failure::Usage(format!(
            "{} is owned by {holder}: stop the agent first (the export reads corral's state offline)",
            data_dir.display()
        )),
        other => Failure::Usage(format!("state directory {}: {other}", data_dir.display())),
    }
}

fn export(args: &ExportArgs) -> Result<Outcome, Failure> {
    let data_dir = &args.data_dir;
    // Opening would create a fresh store: a mistyped directory must not look empty.
    if !data_dir.join(DB_FILE).is_file() {
        return Err(Failure::Usage(format!(
            "{} holds no corral state ({DB_FILE} is missing)",
            data_dir.display()
        )));
    }
    // The one-shot store holds corral's lock from open to close: no corral-ipam call can
    // allocate between the read and the files being written.
    let mut store = SqliteStore::open_one_shot(data_dir).map_err(|e| store_failure(data_dir, e))?;
    let (rows, state) = {
        let mut txn = store.begin().map_err(|e| store_failure(data_dir, e))?;
        let rows = txn
            .all_allocations(&args.network)
            .map_err(|e| store_failure(data_dir, e))?;
        let (state, _) = txn
            .scope_state(&args.network)
            .map_err(|e| store_failure(data_dir, e))?;
        txn.finish().map_err(|e| store_failure(data_dir, e))?;
        (rows, state)
    };
    if rows.is_empty() && state.is_none() {
        return Err(Failure::Usage(format!(
            "{} holds no network {:?}",
            data_dir.display(),
            args.network
        )));
    }
    let entries: Vec<HostLocalEntry> = rows.iter().map(entry).collect();
    let last_reserved = state.as_ref().map(last_reserved).unwrap_or_default();
    let to = args.to.as_deref().unwrap_or(data_dir).join(&args.network);
    let written = write_host_local_dir(&to, &entries, &last_reserved)
        .map_err(|e| Failure::Usage(format!("cannot write host-local's files: {e}")))?;
    store.close().map_err(|e| store_failure(data_dir, e))?;
    Ok(Outcome::ok(format!(
        "wrote {} address files to {} (kept {} of addresses corral does not hold)\n",
        written.written,
        written.dir.display(),
        written.kept
    )))
}

/// host-local's record of one allocation: the attachment's container ID and interface, or
/// the owner alone for an allocation made without a key (host-local's DEL never matches it,
/// so the address stays taken).
fn entry(row: &StoredAllocation) -> HostLocalEntry {
    match &row.key {
        Some(key) => HostLocalEntry {
            addr: row.addr,
            container_id: key.container_id().to_owned(),
            ifname: Some(key.ifname().to_owned()),
        },
        None => HostLocalEntry {
            addr: row.addr,
            container_id: row.owner.clone(),
            ifname: None,
        },
    }
}

/// The last address next-fit handed out per range set, as host-local's `last_reserved_ip.N`:
/// range sets are counted per pool (in the stored order) and family (IPv4 first).
fn last_reserved(state: &ScopeState) -> Vec<(usize, IpAddr)> {
    let mut out = Vec::new();
    let mut index = 0;
    for pool in &state.config.pools {
        let families: Vec<Family> = Family::ALL
            .into_iter()
            .filter(|family| {
                pool.ranges
                    .iter()
                    .any(|range| range.spec().is_some_and(|r| r.family() == *family))
            })
            .collect();
        let snapshot = state
            .snapshots
            .iter()
            .find(|(name, _)| name.as_str() == pool.name)
            .map(|(_, snapshot)| snapshot);
        for family in families {
            let position = snapshot.and_then(|snapshot| {
                let current = snapshot.current[usize::from(family == Family::V6)];
                let range = snapshot.ranges.iter().find(|r| {
                    r.spec.family() == family && corral_core::addr_value(r.spec.start()) == current
                })?;
                // Cursor 0: nothing handed out yet, or the range wrapped; host-local then
                // starts from the beginning, as corral would.
                (range.cursor > 0).then(|| family.addr(current + range.cursor - 1))
            });
            if let Some(addr) = position {
                out.push((index, addr));
            }
            index += 1;
        }
    }
    out
}
