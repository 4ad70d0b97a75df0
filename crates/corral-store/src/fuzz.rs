//! Entry points for the fuzz targets of the files and documents the store imports
//! (`fuzz/fuzz_targets/`: `checkpoint_import`, `host_local`, `pending_del`) and their corpus
//! replay (`tests/fuzz_corpus.rs`): each takes arbitrary bytes and panics only when an
//! invariant breaks.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use corral_core::{Family, PoolName};

use crate::{
    Checkpoint, MemoryStore, PendingDel, Store, Txn, export_checkpoint, host_local_allocations,
    import_checkpoint, parse_host_local_files,
};

/// A checkpoint document imported into an empty store; one that imports exports a document
/// that imports again into another empty store and exports the same.
pub fn checkpoint_import(data: &[u8]) {
    let Ok(checkpoint) = serde_json::from_slice::<Checkpoint>(data) else {
        return;
    };
    let Some(exported) = imported(&checkpoint) else {
        return;
    };
    let again = imported(&exported).unwrap_or_else(|| {
        panic!("an exported checkpoint does not import: {exported:?}");
    });
    assert_eq!(exported, again, "export(import(export)) is not export");
}

/// Imports into a fresh store and exports, `None` if the import was refused.
fn imported(checkpoint: &Checkpoint) -> Option<Checkpoint> {
    let mut store = MemoryStore::new();
    let mut txn = store.begin().expect("a memory store begins");
    if import_checkpoint(&mut txn, checkpoint).is_err() {
        return None;
    }
    let exported = export_checkpoint(&mut txn).expect("an imported store exports");
    txn.commit().expect("a memory store commits");
    Some(exported)
}

/// A host-local network directory as files in memory: `name NUL contents NUL`, repeated.
/// Every file named by an address becomes one entry and one allocation; no attachment key is
/// given twice in one pool and family.
pub fn host_local(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0);
    let mut files = BTreeMap::new();
    while let (Some(name), Some(contents)) = (parts.next(), parts.next()) {
        files.insert(
            String::from_utf8_lossy(name).into_owned(),
            contents.to_vec(),
        );
    }
    let dir = parse_host_local_files(files.keys().map(String::as_str), |name| {
        let bytes = match files.get(name) {
            // A file of "\u{1}" stands for one that cannot be read (a FIFO, too large).
            Some(bytes) if bytes.as_slice() != b"\x01" => Ok(bytes.clone()),
            _ => Err(format!("cannot read {name}")),
        };
        (name.to_owned(), bytes)
    });
    let addresses: HashSet<IpAddr> = files.keys().filter_map(|n| n.parse().ok()).collect();
    assert_eq!(
        dir.entries.len(),
        addresses.len(),
        "an address file lost or doubled"
    );
    let pool = |addr: IpAddr| {
        let name = if addr.is_ipv4() { "v4" } else { "v6" };
        PoolName::new(name).expect("a valid pool name")
    };
    let allocations = host_local_allocations("net", &dir.entries, pool);
    assert_eq!(allocations.len(), dir.entries.len());
    let mut keys = HashSet::new();
    for allocation in &allocations {
        assert!(addresses.contains(&allocation.addr));
        if let Some(key) = &allocation.key {
            let family = Family::of(allocation.addr);
            assert!(
                keys.insert((allocation.pool.clone(), family, key.clone())),
                "key {key} twice in one pool and family"
            );
        }
    }
}

/// A pending-DEL record (`corral.pending/`); one that parses writes back the same record.
pub fn pending_del(data: &[u8]) {
    let Ok(record) = PendingDel::parse(data) else {
        return;
    };
    let written = serde_json::to_vec(&record).expect("a pending record serializes");
    let again = PendingDel::parse(&written).expect("a written pending record parses");
    assert_eq!(record, again);
}
