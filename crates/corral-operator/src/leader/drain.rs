//! A removed node's drain (`corral_cluster::removal_steps`): each step one fenced transaction
//! whose compares prove that the view it was decided on still holds, so a stale view costs a
//! refused transaction, and a new leader finishes from etcd alone what the old one started.

use std::time::Duration;

use corral_cluster::{
    Keys, NodeName, QuarantineState, RemovalPhase, RemovalRecord, RemovalStep, SilenceRecord,
    encode_value,
};
use corral_kv::{Compare, Kv, KvError, LeaseId, Revision, Txn, TxnOp};

use super::txn::{TxnFailure, run};
use crate::election::Fence;

/// Waiting keys given up or deleted per transaction (each a compare and a put or delete),
/// well inside etcd's 128 operations with the compares a step adds.
const CHUNK: usize = 50;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, TxnFailure> {
    encode_value(value).map_err(|e| TxnFailure::Uncertain(KvError::Refused(e.to_string())))
}

/// Carries out one step; answers the revision of its (last) transaction.
pub(super) async fn carry_out<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    step: &RemovalStep,
    quarantine: Duration,
) -> Result<Revision, TxnFailure> {
    match step {
        RemovalStep::GiveUp { node, keys: given } => {
            // One lease per chunk: a refused chunk revokes its own lease only.
            let mut last = 0;
            for chunk in given.chunks(CHUNK) {
                let lease = kv
                    .lease_grant(quarantine)
                    .await
                    .map_err(TxnFailure::Uncertain)?;
                let mut txn = Txn::default();
                for key in chunk {
                    let mut record = key.record.clone();
                    record.state = QuarantineState::Quarantined;
                    record.since_ms = now_ms();
                    record.reason = format!("given up by removed node {node}");
                    txn.compares
                        .push(Compare::modified_at(key.key.clone(), key.mod_revision));
                    txn.success.push(TxnOp::put_on_lease(
                        key.key.clone(),
                        encode(&record)?,
                        lease,
                    ));
                }
                let outcome = run(kv, fence.guard(txn)).await;
                if matches!(outcome, Err(TxnFailure::Refused)) {
                    let _ = kv.lease_revoke(lease).await;
                }
                last = outcome?;
            }
            Ok(last)
        }
        RemovalStep::StartSilence {
            node,
            removal_revision,
            record,
        } => {
            let lease: LeaseId = kv
                .lease_grant(quarantine)
                .await
                .map_err(TxnFailure::Uncertain)?;
            let record = RemovalRecord {
                phase: RemovalPhase::Silent,
                ..record.clone()
            };
            let txn = Txn {
                compares: vec![
                    Compare::modified_at(keys.removal(node), *removal_revision),
                    Compare::absent(keys.live(node)),
                    Compare::absent(keys.silence(node)),
                ],
                success: vec![
                    TxnOp::put(keys.removal(node), encode(&record)?),
                    TxnOp::put_on_lease(
                        keys.silence(node),
                        encode(&SilenceRecord { since_ms: now_ms() })?,
                        lease,
                    ),
                ],
                failure: vec![],
            };
            let outcome = run(kv, fence.guard(txn)).await;
            if matches!(outcome, Err(TxnFailure::Refused)) {
                let _ = kv.lease_revoke(lease).await;
            }
            outcome
        }
        RemovalStep::Returned {
            node,
            removal_revision,
            record,
        } => {
            let record = RemovalRecord {
                phase: RemovalPhase::Draining,
                ..record.clone()
            };
            let txn = Txn {
                compares: vec![Compare::modified_at(keys.removal(node), *removal_revision)],
                success: vec![
                    TxnOp::put(keys.removal(node), encode(&record)?),
                    TxnOp::delete(keys.silence(node)),
                ],
                failure: vec![],
            };
            run(kv, fence.guard(txn)).await
        }
        RemovalStep::ProvenGone {
            node,
            removal_revision,
            keys: waiting,
            holdings,
        } => {
            let base = vec![
                Compare::modified_at(keys.removal(node), *removal_revision),
                Compare::absent(keys.live(node)),
                Compare::absent(keys.silence(node)),
            ];
            // The waiting keys in chunks under the same compares (the removal record is
            // touched only by the last), then the records.
            let mut chunks: Vec<&[corral_cluster::WaitingQuarantine]> =
                waiting.chunks(CHUNK).collect();
            let last_chunk = chunks.pop().unwrap_or(&[]);
            for chunk in chunks {
                let mut txn = Txn {
                    compares: base.clone(),
                    ..Txn::default()
                };
                for key in chunk {
                    txn.compares
                        .push(Compare::modified_at(key.key.clone(), key.mod_revision));
                    txn.success.push(TxnOp::delete(key.key.clone()));
                }
                run(kv, fence.guard(txn)).await?;
            }
            let mut txn = Txn {
                compares: base,
                ..Txn::default()
            };
            for key in last_chunk {
                txn.compares
                    .push(Compare::modified_at(key.key.clone(), key.mod_revision));
                txn.success.push(TxnOp::delete(key.key.clone()));
            }
            if let Some(revision) = holdings {
                txn.compares
                    .push(Compare::modified_at(keys.holdings(node), *revision));
                txn.compares.push(Compare::absent(keys.node(node)));
                txn.success.push(TxnOp::delete(keys.holdings(node)));
            }
            txn.success.push(TxnOp::delete(keys.removal(node)));
            run(kv, fence.guard(txn)).await
        }
        RemovalStep::Done {
            node,
            removal_revision,
            silence,
            holdings,
        } => {
            let mut txn = Txn {
                compares: vec![Compare::modified_at(keys.removal(node), *removal_revision)],
                success: vec![TxnOp::delete(keys.removal(node))],
                failure: vec![],
            };
            if silence.is_some() {
                txn.success.push(TxnOp::delete(keys.silence(node)));
            }
            if let Some(revision) = holdings {
                // Only the empty record the view saw, of a node not registered again.
                txn.compares
                    .push(Compare::modified_at(keys.holdings(node), *revision));
                txn.compares.push(Compare::absent(keys.node(node)));
                txn.success.push(TxnOp::delete(keys.holdings(node)));
            }
            run(kv, fence.guard(txn)).await
        }
        RemovalStep::Adopt { node } => {
            let record = RemovalRecord {
                node_revision: 0,
                requested_ms: now_ms(),
                mode: Default::default(),
                phase: RemovalPhase::Draining,
            };
            let txn = Txn {
                compares: vec![Compare::absent(keys.removal(node))],
                success: vec![TxnOp::put(keys.removal(node), encode(&record)?)],
                failure: vec![],
            };
            run(kv, fence.guard(txn)).await
        }
    }
}

/// What the operator logs when a step committed.
pub(super) fn describe(step: &RemovalStep) -> Option<String> {
    let node: &NodeName = step.node();
    match step {
        RemovalStep::GiveUp { keys, .. } => Some(format!(
            "removed node {node} gave up {} range(s) or node ID(s); their quarantine begins",
            keys.len()
        )),
        RemovalStep::StartSilence { .. } => Some(format!(
            "removed node {node} shows no liveness; what it holds comes back if it stays away for the quarantine time"
        )),
        RemovalStep::Returned { .. } => Some(format!(
            "removed node {node} is live again; it keeps what it holds until it gives it up"
        )),
        RemovalStep::ProvenGone { keys, .. } => Some(format!(
            "removed node {node} showed no liveness for the whole quarantine; {} range(s) or node ID(s) it held are free",
            keys.len()
        )),
        RemovalStep::Done { .. } => Some(format!("removal of node {node} done")),
        RemovalStep::Adopt { .. } => None,
    }
}
