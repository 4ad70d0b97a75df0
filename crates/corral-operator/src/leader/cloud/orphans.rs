//! The cloud's leftovers: intents of no node (the leak collector's deletions) replayed, and the
//! leak collector itself, which deletes corral-tagged, available interfaces that no record or
//! intent names.
//!
//! A leak is deleted only when two collector runs at least the interval apart both saw it, at
//! most `gc_max_per_run` per run, each behind a `Delete` intent of no node.

use std::collections::{BTreeMap, BTreeSet};

use corral_cloud::{CloudError, CloudProvider, InterfaceFilter, InterfaceStatus};
use corral_cluster::cloud::{self as decide, GcPlan, LeakCandidate};
use corral_cluster::{CloudEntry, CloudId, CloudIntentRecord, CloudOp, PoolName, encode_value};
use corral_kv::{Compare, Kv, Txn, TxnOp};

use crate::leader::cloud::ctx::{Ctx, TAG_CLUSTER, TAG_CREATED_AT, TAG_INTENT, TAG_NODE};
use crate::leader::logged::{Write, WriteError};

/// Replays an intent of no node (a collector's deletion): delete the interface if it is
/// still there and available, then the intent.
pub(super) async fn replay_orphan<K: Kv, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    id: &CloudId,
    entry: &CloudEntry<CloudIntentRecord>,
    writes: &mut Vec<Write>,
) -> Result<(), String> {
    let key = ctx.term.keys.cloud_intent(id);
    let mut revision = entry.mod_revision;
    if let Some(
        record @ CloudIntentRecord {
            op: CloudOp::Delete { interface },
            ..
        },
    ) = &entry.record
    {
        // Rewritten fenced first: a deposed leader, or a view behind, makes no call.
        let value = encode_value(record).map_err(|e| e.to_string())?;
        let txn = Txn {
            compares: vec![Compare::modified_at(key.clone(), revision)],
            success: vec![TxnOp::put(key.clone(), value)],
            failure: vec![],
        };
        revision = match ctx.term.fenced_txn(txn, writes).await {
            Ok(revision) => revision,
            Err(WriteError::Refused) => {
                return Err(format!("intent {id} refused (fenced or changed)"));
            }
            Err(WriteError::Uncertain(error)) => return Err(error.to_string()),
        };
        match ctx.provider.delete_interface(interface.as_str()).await {
            Ok(()) => {}
            Err(error) if error.is_not_found() => {}
            // Attached again (in use): not a leak after all; the intent goes.
            Err(CloudError::InterfaceInUse { .. }) => {}
            Err(error) => return Err(error.to_string()),
        }
    }
    let txn = Txn {
        compares: vec![Compare::modified_at(key.clone(), revision)],
        success: vec![TxnOp::delete(key)],
        failure: vec![],
    };
    // Refused or uncertain: the intent stays and is replayed again.
    let _ = ctx.term.fenced_txn(txn, writes).await;
    Ok(())
}

pub(super) struct LeakContext {
    pub(super) recorded: BTreeSet<String>,
    pub(super) intents: BTreeSet<String>,
    pub(super) busy: BTreeSet<String>,
    pub(super) seen: BTreeMap<CloudId, u64>,
    pub(super) interval_ms: u64,
    pub(super) cap: usize,
    pub(super) base: String,
}

/// One collector run: corral-tagged available interfaces of this cluster, planned by
/// `plan_leak_gc`, each deletion behind an intent.
pub(super) async fn collect_leaks<K: Kv, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    pool: &PoolName,
    leaks: LeakContext,
    writes: &mut Vec<Write>,
) -> Result<(GcPlan, usize), CloudError> {
    let mut filter = InterfaceFilter::default();
    filter
        .tags
        .insert(TAG_CLUSTER.to_owned(), Some(ctx.cluster.clone()));
    filter.status = Some(InterfaceStatus::Available);
    let found = ctx.provider.describe_interfaces(&filter).await?;
    let candidates: Vec<LeakCandidate> = found
        .iter()
        .filter_map(|ni| {
            let id = CloudId::new(&ni.id).ok()?;
            let named_by_intent = ni
                .tags
                .get(TAG_INTENT)
                .is_some_and(|i| leaks.intents.contains(i));
            let node_busy = ni
                .tags
                .get(TAG_NODE)
                .is_some_and(|n| leaks.busy.contains(n));
            Some(LeakCandidate {
                id,
                tagged: ni.tags.get(TAG_CLUSTER).is_some_and(|c| *c == ctx.cluster),
                available: ni.status == InterfaceStatus::Available && ni.attachment.is_none(),
                created_ms: ni
                    .tags
                    .get(TAG_CREATED_AT)
                    .and_then(|t| t.parse::<u64>().ok()),
                recorded: leaks.recorded.contains(&ni.id) || named_by_intent || node_busy,
            })
        })
        .collect();
    let now = (ctx.clock)();
    let plan = decide::plan_leak_gc(&candidates, &leaks.seen, now, leaks.interval_ms, leaks.cap);
    let mut deleted = 0;
    for (n, interface) in plan.delete.iter().enumerate() {
        let Ok(id) = CloudId::new(&format!("{}-gc{n}", leaks.base)) else {
            continue;
        };
        let key = ctx.term.keys.cloud_intent(&id);
        let record = CloudIntentRecord {
            node: None,
            pool: pool.clone(),
            instance_id: None,
            op: CloudOp::Delete {
                interface: interface.clone(),
            },
            started_ms: now,
        };
        let Ok(value) = encode_value(&record) else {
            continue;
        };
        let txn = Txn {
            compares: vec![Compare::absent(key.clone())],
            success: vec![TxnOp::put(key.clone(), value)],
            failure: vec![],
        };
        let Ok(revision) = ctx.term.fenced_txn(txn, writes).await else {
            // Fenced or failed: no call.
            break;
        };
        ctx.term.shared.note_cloud_intent();
        let result = ctx.provider.delete_interface(interface.as_str()).await;
        match result {
            Ok(()) => deleted += 1,
            Err(error) if error.is_not_found() => {}
            Err(CloudError::InterfaceInUse { .. }) => {}
            // Perhaps deleted, or not: the intent stays and is replayed.
            Err(_) => continue,
        }
        let txn = Txn {
            compares: vec![Compare::modified_at(key.clone(), revision)],
            success: vec![TxnOp::delete(key)],
            failure: vec![],
        };
        // Refused or uncertain: the intent stays and is replayed.
        let _ = ctx.term.fenced_txn(txn, writes).await;
    }
    Ok((plan, deleted))
}
