//! A node's step carried out (`StepRun`): the intent-logged EC2 mutations (assign, create and
//! attach, unassign, detach and delete), the release handshake's etcd steps, and the replay of
//! an intent left open.
//!
//! Invariants every step keeps:
//! - a fenced `intents/<id>` put comes before the cloud call (a deposed leader's put fails, so
//!   it calls nothing), and one fenced transaction after it records the outcome
//!   (`interfaces/<node>/<id>`, compared at its mod revision) and deletes the intent;
//! - an answer that does not say what the cloud did changes no record: the intent stays open
//!   and its replay reads the interface, past the describe lag of the last call;
//! - every write a step makes is handed back (`writes`) for the manager to put into the view
//!   at once.

use std::collections::BTreeMap;
use std::time::Duration;

use corral_cloud::{
    Amount, AttachInterface, CloudError, CloudProvider, CreateInterface, InterfaceFilter,
    Ipv4Assign, Ipv6Assign, NetworkInterface, Subnet,
};
use corral_cluster::cloud::{
    self as decide, CloudAction, InstanceLimits, InterfaceView, ObservedInterface, PrefixFallback,
    Replay, SubnetView,
};
use corral_cluster::{
    CloudAttachment, CloudEntry, CloudId, CloudIntentRecord, CloudInterfaceRecord, CloudOp, Family,
    GrantEnd, HistoryRecord, IpNet, Key, NodeName, PoolName, encode_value,
};
use corral_kv::{Compare, Kv, Revision, Txn, TxnOp};

use crate::leader::cloud::ctx::{
    Ctx, TAG_CLUSTER, TAG_CREATED_AT, TAG_INTENT, TAG_NODE, instance_of,
};
use crate::leader::cloud::describe::subnet_view;
use crate::leader::logged::{Write, WriteError};

/// At most this many operations (compares and writes) per transaction: etcd refuses more than
/// 128 by default (`--max-txn-ops`), and the fence adds its own compare.
const TXN_OPS: usize = 100;

/// How soon a node is looked at again while an interface it got is attaching.
pub(super) const ATTACH_POLL: Duration = Duration::from_secs(2);

/// Attach tries at successive device indexes when the cloud says an index is taken.
pub(super) const ATTACH_TRIES: usize = 5;

/// How soon an intent the cloud could not settle yet (`Replay::Wait`) is replayed again.
pub(super) const REPLAY_WAIT: Duration = Duration::from_secs(3);

/// How long a node waits after a compare failed on a stale view (the watch catches up).
pub(super) const STALE_WAIT: Duration = Duration::from_millis(200);

/// How a node's step ended.
pub(super) enum Outcome {
    /// Done; the node is planned again at once (it may need more).
    Ok,
    /// The plan changed (a prefix refused, a release withdrawn): planned again at once.
    Replan,
    /// Wait this long, without counting an error (an intent not settled, an attachment).
    Wait(Duration),
    /// Failed: the node backs off.
    Failed(String),
    /// Leading is gone (a fenced write refused): nothing more.
    Fenced,
}

/// One node's next step.
// A step lives from its planning to its task's end, one per busy node: its size does not
// matter, and boxing would only add noise.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step {
    /// Describe the node's instance and interfaces.
    Describe,
    /// Replay the node's open intents.
    Replay(Vec<(CloudId, CloudEntry<CloudIntentRecord>)>),
    /// Record that an attachment completed.
    Confirm {
        interface: CloudId,
        entry: CloudEntry<CloudInterfaceRecord>,
    },
    /// Release handshake steps (etcd only).
    Handshake(Vec<HandshakeStep>),
    /// Records to delete, a managed interface's with a `Delete` intent (a removed node's
    /// interfaces, an empty one).
    Teardown(Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)>),
    /// Unassign addresses the agent surrendered (`ready`), then record it.
    Unassign {
        pool: PoolName,
        family: Family,
        interface: CloudId,
        entry: CloudEntry<CloudInterfaceRecord>,
        /// (address, release key's mod revision).
        addresses: Vec<(IpNet, i64)>,
    },
    /// Assign addresses to an attached interface.
    Assign {
        pool: PoolName,
        family: Family,
        interface: CloudId,
        count: u32,
        prefixes: bool,
        /// The interface's record, or what describe showed of it (unrecorded: the primary).
        record: Option<CloudEntry<CloudInterfaceRecord>>,
        described: Option<NetworkInterface>,
        attempt: AttemptContext,
    },
    /// Create an interface with addresses and attach it.
    Create {
        pool: PoolName,
        family: Family,
        subnet_id: String,
        device_index: u32,
        count: u32,
        prefixes: bool,
        attempt: AttemptContext,
    },
}

/// What a create or assign needs beside the action for its fallbacks.
#[derive(Clone)]
pub(super) struct AttemptContext {
    pub(super) cloud: corral_cluster::CloudPoolConfig,
    pub(super) zone: String,
    pub(super) subnets: Vec<SubnetView>,
    pub(super) interfaces: Vec<InterfaceView>,
    pub(super) security_groups: Vec<String>,
}

/// One etcd step of a release handshake.
pub(super) enum HandshakeStep {
    /// Put `marked` (the key absent, the interface record's create revision).
    Mark {
        key: String,
        record_key: String,
        record_revision: i64,
        value: Vec<u8>,
    },
    /// Delete a release key at its mod revision (un-mark, forget a refusal, a stale key).
    Delete { key: String, revision: i64 },
}

/// A node's step being carried out.
pub(super) struct StepRun<'a, K, P> {
    pub(super) ctx: &'a Ctx<K, P>,
    pub(super) node: &'a NodeName,
    pub(super) instance_id: &'a str,
    pub(super) intent_base: String,
    pub(super) intents: u32,
    pub(super) writes: Vec<Write>,
    pub(super) secondaries_only: Vec<String>,
    pub(super) no_free_prefix: Vec<String>,
    pub(super) occupied: Vec<u32>,
    /// A cloud mutation was made (the node's interfaces are described after).
    pub(super) mutated: bool,
    pub(super) limits: Option<InstanceLimits>,
    pub(super) subnets: Vec<Subnet>,
    /// The node's interfaces as last described.
    pub(super) known: Vec<NetworkInterface>,
    /// Interfaces whose prefix request was refused, and when: written into their records.
    pub(super) prefixes_refused: BTreeMap<String, u64>,
    /// The create fell back to single addresses after its subnet refused prefixes, then: the
    /// new interface's record keeps it.
    pub(super) created_refused_ms: Option<u64>,
}

impl<K: Kv, P: CloudProvider> StepRun<'_, K, P> {
    fn next_intent(&mut self) -> CloudId {
        self.intents += 1;
        CloudId::new(&format!("{}-{}", self.intent_base, self.intents))
            .unwrap_or_else(|_| CloudId::min())
    }

    /// Runs a fenced transaction; answers its revision.
    async fn txn(&mut self, txn: Txn) -> Result<Revision, WriteError> {
        self.ctx.term.fenced_txn(txn, &mut self.writes).await
    }

    /// Writes the intent (fenced, the key absent) before a cloud mutation.
    async fn open_intent(
        &mut self,
        id: &CloudId,
        pool: &PoolName,
        op: CloudOp,
    ) -> Result<(String, Revision), Outcome> {
        self.open_intent_if(id, pool, op, Vec::new()).await
    }

    /// Writes the intent as [`Self::open_intent`], only if `also` holds too (the records the
    /// call relies on are still as planned). A refusal with `also` is waited out: the view was
    /// behind, or leading is gone and every later write is refused as well.
    async fn open_intent_if(
        &mut self,
        id: &CloudId,
        pool: &PoolName,
        op: CloudOp,
        also: Vec<Compare>,
    ) -> Result<(String, Revision), Outcome> {
        let guarded = !also.is_empty();
        let record = CloudIntentRecord {
            node: Some(self.node.clone()),
            pool: pool.clone(),
            instance_id: Some(self.instance_id.to_owned()),
            op,
            started_ms: (self.ctx.clock)(),
        };
        let key = self.ctx.term.keys.cloud_intent(id);
        let value = encode_value(&record).map_err(|e| Outcome::Failed(e.to_string()))?;
        let mut compares = vec![Compare::absent(key.clone())];
        compares.extend(also);
        let txn = Txn {
            compares,
            success: vec![TxnOp::put(key.clone(), value)],
            failure: vec![],
        };
        match self.txn(txn).await {
            Ok(revision) => {
                self.ctx.term.shared.note_cloud_intent();
                Ok((key, revision))
            }
            Err(WriteError::Refused) if guarded => Err(Outcome::Wait(STALE_WAIT)),
            // The fence failed (or, impossibly, the ID is taken): no call is made.
            Err(WriteError::Refused) => Err(Outcome::Fenced),
            // Perhaps written: it is replayed (nothing was called, so it is forgotten).
            Err(WriteError::Uncertain(error)) => {
                Err(Outcome::Failed(format!("writing intent {id}: {error}")))
            }
        }
    }

    /// Rewrites an open intent, fenced and at the revision seen, before a replay's cloud call:
    /// the call is made only by the leader, and only while the intent is still open (not
    /// finished meanwhile by another leader or an earlier replay). Its `started_ms` becomes
    /// now, so the next replay measures the describe lag from this call (a describe behind
    /// it is waited for, not answered by calling again). Answers its new revision.
    async fn touch_intent(
        &mut self,
        key: &str,
        entry: &CloudEntry<CloudIntentRecord>,
        intent: &CloudIntentRecord,
    ) -> Result<Revision, Outcome> {
        let mut intent = intent.clone();
        intent.started_ms = (self.ctx.clock)();
        let value = encode_value(&intent).map_err(|e| Outcome::Failed(e.to_string()))?;
        let txn = Txn {
            compares: vec![Compare::modified_at(key.to_owned(), entry.mod_revision)],
            success: vec![TxnOp::put(key.to_owned(), value)],
            failure: vec![],
        };
        match self.txn(txn).await {
            Ok(revision) => Ok(revision),
            // Fenced, or the view was behind (the intent is gone or newer): no call.
            Err(WriteError::Refused) => Err(Outcome::Wait(STALE_WAIT)),
            Err(error) => Err(Outcome::Failed(format!("touching intent {key}: {error}"))),
        }
    }

    /// Deletes an intent whose call surely changed nothing.
    async fn drop_intent(&mut self, key: &str, revision: Revision) {
        let txn = Txn {
            compares: vec![Compare::modified_at(key.to_owned(), revision)],
            success: vec![TxnOp::delete(key.to_owned())],
            failure: vec![],
        };
        let _ = self.txn(txn).await;
    }

    pub(super) async fn run(&mut self, step: Step) -> Outcome {
        match step {
            Step::Describe => Outcome::Ok,
            Step::Replay(intents) => self.replay(intents).await,
            Step::Confirm { interface, entry } => self.confirm(&interface, &entry).await,
            Step::Handshake(steps) => self.handshake(steps).await,
            Step::Teardown(records) => self.teardown(records).await,
            Step::Unassign {
                pool,
                family,
                interface,
                entry,
                addresses,
            } => {
                self.unassign(&pool, family, &interface, &entry, &addresses)
                    .await
            }
            Step::Assign {
                pool,
                family,
                interface,
                count,
                prefixes,
                record,
                described,
                attempt,
            } => {
                self.assign(
                    &pool, family, &interface, count, prefixes, record, described, &attempt,
                )
                .await
            }
            Step::Create {
                pool,
                family,
                subnet_id,
                device_index,
                count,
                prefixes,
                attempt,
            } => {
                self.create(
                    &pool,
                    family,
                    subnet_id,
                    device_index,
                    count,
                    prefixes,
                    &attempt,
                )
                .await
            }
        }
    }

    async fn handshake(&mut self, steps: Vec<HandshakeStep>) -> Outcome {
        for step in steps {
            let txn = match step {
                HandshakeStep::Mark {
                    key,
                    record_key,
                    record_revision,
                    value,
                } => Txn {
                    compares: vec![
                        Compare::absent(key.clone()),
                        Compare::created_at(record_key, record_revision),
                    ],
                    success: vec![TxnOp::put(key, value)],
                    failure: vec![],
                },
                HandshakeStep::Delete { key, revision } => Txn {
                    compares: vec![Compare::modified_at(key.clone(), revision)],
                    success: vec![TxnOp::delete(key)],
                    failure: vec![],
                },
            };
            match self.txn(txn).await {
                Ok(_) => {}
                // The view was behind (the agent answered meanwhile): planned again once the
                // watch caught up.
                Err(WriteError::Refused) => return Outcome::Wait(STALE_WAIT),
                Err(error) => return Outcome::Failed(format!("release handshake: {error}")),
            }
        }
        Outcome::Ok
    }

    /// The node's record of `interface` in the leader's view, if any.
    fn recorded(&self, interface: &CloudId) -> Option<CloudInterfaceRecord> {
        self.ctx
            .term
            .shared
            .with_view(|view, _| {
                view.cloud_interfaces_of(self.node)
                    .find(|(i, _)| *i == interface)
                    .and_then(|(_, e)| e.record.clone())
            })
            .flatten()
    }

    /// The history's keys for cloud addresses of `record` that end now (`ended`), each for
    /// `why`: the node's, from when the record says it was assigned (unknown for an address
    /// recorded before the records kept it).
    fn history_puts(
        &self,
        record: &CloudInterfaceRecord,
        ended: &[IpNet],
        why: impl Fn(&IpNet) -> GrantEnd,
    ) -> Result<Vec<(String, Vec<u8>)>, Outcome> {
        let now = (self.ctx.clock)();
        let mut puts = Vec::new();
        for net in ended {
            let record = HistoryRecord {
                pool: record.pool.clone(),
                cidr: *net,
                node: self.node.clone(),
                from_ms: record.assigned_ms.get(net).copied(),
                to_ms: now,
                why: why(net),
            };
            puts.extend(
                corral_cluster::history::puts(&self.ctx.term.keys, &record)
                    .map_err(|e| Outcome::Failed(format!("encoding a history record: {e}")))?,
            );
        }
        Ok(puts)
    }

    /// Adds history puts to `txn` up to [`TXN_OPS`] operations; answers the rest, written
    /// after it by [`StepRun::write_history`].
    fn with_history(
        &self,
        txn: &mut Txn,
        mut history: Vec<(String, Vec<u8>)>,
    ) -> Vec<(String, Vec<u8>)> {
        let room = TXN_OPS.saturating_sub(txn.success.len() + txn.compares.len());
        let rest = history.split_off(room.min(history.len()));
        txn.success
            .extend(history.into_iter().map(|(k, v)| TxnOp::put(k, v)));
        rest
    }

    /// History puts that did not fit their transaction, in fenced transactions of their own.
    async fn write_history(&mut self, rest: Vec<(String, Vec<u8>)>) -> Outcome {
        for chunk in rest.chunks(TXN_OPS) {
            let txn = Txn {
                compares: vec![],
                success: chunk
                    .iter()
                    .map(|(k, v)| TxnOp::put(k.clone(), v.clone()))
                    .collect(),
                failure: vec![],
            };
            match self.txn(txn).await {
                Ok(_) => {}
                Err(WriteError::Refused) => return Outcome::Wait(STALE_WAIT),
                Err(error) => return Outcome::Failed(format!("recording history: {error}")),
            }
        }
        Outcome::Ok
    }

    /// Records to delete (a removed node's, an empty interface's): a managed interface still
    /// on an instance (not the primary) gets a `Delete` intent in the transaction that deletes
    /// its record (its replay detaches and deletes it); the others' records are deleted. Each
    /// at the record's mod revision.
    pub(super) async fn teardown(
        &mut self,
        records: Vec<(CloudId, CloudEntry<CloudInterfaceRecord>)>,
    ) -> Outcome {
        for (id, entry) in records {
            let key = self.ctx.term.keys.cloud_interface(self.node, &id);
            let mut txn = Txn {
                compares: vec![Compare::modified_at(key.clone(), entry.mod_revision)],
                success: vec![TxnOp::delete(key)],
                failure: vec![],
            };
            // The addresses it still held end with it: the node removed, else withdrawn.
            let removed = self
                .ctx
                .term
                .shared
                .with_view(|view, _| view.removals().contains_key(self.node))
                .unwrap_or(false);
            let history = match &entry.record {
                Some(record) => match self.history_puts(record, &record.addresses, |_| {
                    if removed {
                        GrantEnd::NodeRemoved
                    } else {
                        GrantEnd::Withdrawn
                    }
                }) {
                    Ok(puts) => puts,
                    Err(outcome) => return outcome,
                },
                None => Vec::new(),
            };
            let detach = entry
                .record
                .as_ref()
                .filter(|r| r.managed && !r.instance_id.is_empty() && r.device_index != 0);
            if let Some(record) = detach {
                let intent = CloudIntentRecord {
                    node: Some(self.node.clone()),
                    pool: record.pool.clone(),
                    instance_id: Some(record.instance_id.clone()),
                    op: CloudOp::Delete {
                        interface: id.clone(),
                    },
                    started_ms: (self.ctx.clock)(),
                };
                let Ok(value) = encode_value(&intent) else {
                    return Outcome::Failed("encoding a cloud intent".to_owned());
                };
                let intent_key = self.ctx.term.keys.cloud_intent(&self.next_intent());
                txn.compares.push(Compare::absent(intent_key.clone()));
                txn.success.push(TxnOp::put(intent_key, value));
            }
            let rest = self.with_history(&mut txn, history);
            match self.txn(txn).await {
                Ok(_) => {
                    if detach.is_some() {
                        self.ctx.term.shared.note_cloud_intent();
                    }
                    if let Outcome::Failed(error) = self.write_history(rest).await {
                        return Outcome::Failed(error);
                    }
                }
                Err(WriteError::Refused) => return Outcome::Wait(STALE_WAIT),
                Err(error) => return Outcome::Failed(format!("removing {id}'s record: {error}")),
            }
        }
        // Planned again at once: the intents are replayed.
        Outcome::Ok
    }

    async fn confirm(
        &mut self,
        interface: &CloudId,
        entry: &CloudEntry<CloudInterfaceRecord>,
    ) -> Outcome {
        let Some(record) = &entry.record else {
            return Outcome::Ok;
        };
        let mut record = record.clone();
        record.attachment = CloudAttachment::Attached;
        let key = self.ctx.term.keys.cloud_interface(self.node, interface);
        let Ok(value) = encode_value(&record) else {
            return Outcome::Ok;
        };
        let txn = Txn {
            compares: vec![Compare::modified_at(key.clone(), entry.mod_revision)],
            success: vec![TxnOp::put(key, value)],
            failure: vec![],
        };
        match self.txn(txn).await {
            Ok(_) => Outcome::Ok,
            Err(WriteError::Refused) => Outcome::Wait(STALE_WAIT),
            Err(error) => Outcome::Failed(format!("recording attachment of {interface}: {error}")),
        }
    }

    /// The subnet CIDRs of a record.
    fn subnet_cidrs(&self, subnet_id: &str) -> Vec<IpNet> {
        self.subnets
            .iter()
            .find(|s| s.id == subnet_id)
            .map(|s| subnet_view(s, false).cidrs)
            .unwrap_or_default()
    }

    #[allow(clippy::too_many_arguments)]
    async fn assign(
        &mut self,
        pool: &PoolName,
        family: Family,
        interface: &CloudId,
        count: u32,
        prefixes: bool,
        record: Option<CloudEntry<CloudInterfaceRecord>>,
        described: Option<NetworkInterface>,
        attempt: &AttemptContext,
    ) -> Outcome {
        let before: Vec<IpNet> = match (&record, &described) {
            (Some(entry), _) => entry
                .record
                .as_ref()
                .map(|r| r.addresses.clone())
                .unwrap_or_default(),
            (None, Some(ni)) => ni.secondary_nets(),
            (None, None) => return Outcome::Ok,
        };
        let id = self.next_intent();
        let op = CloudOp::Assign {
            interface: interface.clone(),
            count,
            prefixes,
            ipv6: family == Family::V6,
            before: before.clone(),
        };
        let (intent_key, intent_revision) = match self.open_intent(&id, pool, op).await {
            Ok(opened) => opened,
            Err(outcome) => return outcome,
        };
        self.mutated = true;
        let provider = &self.ctx.provider;
        let result: Result<Vec<IpNet>, CloudError> = match family {
            Family::V4 => {
                let request = if prefixes {
                    Ipv4Assign::Prefixes(Amount::Count(count))
                } else {
                    Ipv4Assign::Addresses(Amount::Count(count))
                };
                provider
                    .assign_ipv4(interface.as_str(), &request)
                    .await
                    .map(|set| set.nets())
            }
            Family::V6 => {
                let request = if prefixes {
                    Ipv6Assign::Prefixes(Amount::Count(count))
                } else {
                    Ipv6Assign::Addresses(Amount::Count(count))
                };
                provider
                    .assign_ipv6(interface.as_str(), &request)
                    .await
                    .map(|set| set.nets())
            }
        };
        let added = match result {
            Ok(added) => added,
            Err(error) => {
                if error.is_ambiguous() {
                    // Perhaps assigned: the intent stays, and is replayed (by describing)
                    // before the node is served again.
                    return Outcome::Wait(REPLAY_WAIT);
                }
                self.drop_intent(&intent_key, intent_revision).await;
                if matches!(error, CloudError::InsufficientCidrBlocks { .. }) && prefixes {
                    let action = CloudAction::Assign {
                        interface: interface.clone(),
                        count,
                        prefixes,
                    };
                    let fallback = decide::prefix_fallback(
                        &action,
                        &attempt.cloud,
                        &attempt.zone,
                        family,
                        &attempt.subnets,
                        &[],
                    );
                    if let PrefixFallback::Secondaries = fallback {
                        self.secondaries_only.push(interface.to_string());
                        // Kept in the record (if there is one yet; else written with the
                        // record the next assign makes) so a new leader does not ask again.
                        if let Some(entry) = &record
                            && let Some(mut kept) = entry.record.clone()
                        {
                            kept.prefixes_refused_ms = Some((self.ctx.clock)());
                            let key = self.ctx.term.keys.cloud_interface(self.node, interface);
                            if let Ok(value) = encode_value(&kept) {
                                let txn = Txn {
                                    compares: vec![Compare::modified_at(
                                        key.clone(),
                                        entry.mod_revision,
                                    )],
                                    success: vec![TxnOp::put(key, value)],
                                    failure: vec![],
                                };
                                let _ = self.txn(txn).await;
                            }
                        }
                    }
                    return Outcome::Replan;
                }
                return Outcome::Failed(format!("assigning to {interface}: {error}"));
            }
        };
        // Recorded with the addresses: one transaction, the record compared at the revision
        // the plan saw, the intent deleted.
        let key = self.ctx.term.keys.cloud_interface(self.node, interface);
        let mut addresses = before;
        for net in added {
            if !addresses.contains(&net) {
                addresses.push(net);
            }
        }
        let (record, compare) = match (record, described) {
            (Some(entry), _) => {
                let Some(mut record) = entry.record else {
                    return Outcome::Ok;
                };
                record.addresses = addresses;
                record.prefixes_refused_ms = record
                    .prefixes_refused_ms
                    .max(self.prefixes_refused.get(interface.as_str()).copied());
                (
                    record,
                    Compare::modified_at(key.clone(), entry.mod_revision),
                )
            }
            (None, Some(ni)) => (
                CloudInterfaceRecord {
                    pool: pool.clone(),
                    instance_id: self.instance_id.to_owned(),
                    device_index: ni.attachment.as_ref().map_or(0, |a| a.device_index),
                    subnet_id: ni.subnet_id.clone(),
                    subnets: self.subnet_cidrs(&ni.subnet_id),
                    mac: ni.mac.to_string(),
                    primary_ipv4: Some(ni.primary_ipv4),
                    addresses,
                    assigned_ms: Default::default(),
                    attachment: if ni
                        .attachment
                        .as_ref()
                        .is_some_and(|a| a.status == corral_cloud::AttachmentStatus::Attached)
                    {
                        CloudAttachment::Attached
                    } else {
                        CloudAttachment::Attaching
                    },
                    managed: ni
                        .tags
                        .get(TAG_CLUSTER)
                        .is_some_and(|c| *c == self.ctx.cluster),
                    prefixes_refused_ms: self.prefixes_refused.get(interface.as_str()).copied(),
                },
                Compare::absent(key.clone()),
            ),
            (None, None) => return Outcome::Ok,
        };
        self.record(key, record, compare, &intent_key, intent_revision, &[])
            .await
    }

    /// Checks a record about to be written against every other record (the view's and those
    /// other tasks are writing) and, if nothing stands against it, claims it until this task's
    /// writes are in the view: what stands against it, else nothing. The fence makes this
    /// leader the only writer of `interfaces/` (agents never write them; a removal only
    /// deletes), so its view plus the claims is every record; etcd cannot compare a key
    /// pattern (the same interface under any node), and a compare per node would not fit
    /// etcd's 128 operations per transaction.
    fn claim(
        &self,
        interface: &CloudId,
        record: &CloudInterfaceRecord,
    ) -> Vec<decide::RecordConflict> {
        let mut claims = self.ctx.claims.lock().unwrap_or_else(|e| e.into_inner());
        let conflicts = self
            .ctx
            .term
            .shared
            .with_view(|view, _| {
                let in_view = view
                    .cloud_record_candidates(interface, record)
                    .filter(|(n, i, _)| !claims.iter().any(|(cn, ci, _)| cn == *n && ci == *i));
                let claimed = claims.iter().map(|(n, i, r)| (n, i, r));
                decide::record_conflicts(in_view.chain(claimed), self.node, interface, record)
            })
            .unwrap_or_default();
        if conflicts.is_empty() {
            claims.retain(|(n, i, _)| !(n == self.node && i == interface));
            claims.push((self.node.clone(), interface.clone(), record.clone()));
        }
        conflicts
    }

    /// The one transaction after a mutation: the record put, the intent deleted (and release
    /// keys completed with it deleted).
    async fn record(
        &mut self,
        key: String,
        mut record: CloudInterfaceRecord,
        compare: Compare,
        intent_key: &str,
        intent_revision: Revision,
        release_deletes: &[(String, i64)],
    ) -> Outcome {
        let interface = match self.ctx.term.keys.parse(&key) {
            Ok(Key::CloudInterface { interface, .. }) => Some(interface),
            _ => None,
        };
        let old = interface.as_ref().and_then(|i| self.recorded(i));
        // An address's history starts when it is first recorded on the interface.
        record.stamp_assigned(old.as_ref(), (self.ctx.clock)());
        let Ok(value) = encode_value(&record) else {
            return Outcome::Failed("encoding a cloud interface record".to_owned());
        };
        // The addresses the record gives up end in the history, in this transaction.
        let mut history = Vec::new();
        // Disjoint records: never one interface or address for two nodes (the intent stays
        // open; its replay meets the same refusal until the other record goes).
        if let Some(interface) = interface {
            if let Some(old) = old {
                let gone: Vec<IpNet> = old
                    .addresses
                    .iter()
                    .filter(|a| old.pool != record.pool || !record.addresses.contains(a))
                    .copied()
                    .collect();
                // Given back through the release handshake (its key completed here), else
                // gone from the interface as the cloud shows it.
                let released = |net: &IpNet| {
                    let family = corral_cluster::net::family_of(net);
                    let key = self
                        .ctx
                        .term
                        .keys
                        .release(self.node, &old.pool, family, net);
                    release_deletes.iter().any(|(k, _)| *k == key)
                };
                match self.history_puts(&old, &gone, |net| {
                    if released(net) {
                        GrantEnd::Released
                    } else {
                        GrantEnd::Withdrawn
                    }
                }) {
                    Ok(puts) => history = puts,
                    Err(outcome) => return outcome,
                }
            }
            let conflicts = self.claim(&interface, &record);
            if let Some(first) = conflicts.first() {
                for conflict in &conflicts {
                    self.ctx
                        .term
                        .shared
                        .note_cloud_record_conflict(conflict.to_string());
                }
                return Outcome::Failed(first.to_string());
            }
        }
        let mut txn = Txn {
            compares: vec![
                compare,
                Compare::modified_at(intent_key.to_owned(), intent_revision),
            ],
            success: vec![TxnOp::put(key, value), TxnOp::delete(intent_key.to_owned())],
            failure: vec![],
        };
        for (release_key, revision) in release_deletes {
            txn.compares
                .push(Compare::modified_at(release_key.clone(), *revision));
            txn.success.push(TxnOp::delete(release_key.clone()));
        }
        let rest = self.with_history(&mut txn, history);
        match self.txn(txn).await {
            Ok(_) => self.write_history(rest).await,
            // The intent stays open: the next leader (or this one, once the view shows it)
            // replays it from what the cloud shows.
            Err(WriteError::Refused) => Outcome::Wait(REPLAY_WAIT),
            Err(error) => Outcome::Failed(format!("recording: {error}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn create(
        &mut self,
        pool: &PoolName,
        family: Family,
        mut subnet_id: String,
        device_index: u32,
        mut count: u32,
        mut prefixes: bool,
        attempt: &AttemptContext,
    ) -> Outcome {
        let mut tried: Vec<String> = Vec::new();
        loop {
            let id = self.next_intent();
            let op = CloudOp::CreateAttach {
                subnet_id: subnet_id.clone(),
                device_index,
            };
            let (intent_key, intent_revision) = match self.open_intent(&id, pool, op).await {
                Ok(opened) => opened,
                Err(outcome) => return outcome,
            };
            self.mutated = true;
            let now = (self.ctx.clock)();
            let mut tags = attempt.cloud.tags.clone();
            tags.insert(TAG_CLUSTER.to_owned(), self.ctx.cluster.clone());
            tags.insert(TAG_NODE.to_owned(), self.node.to_string());
            tags.insert(TAG_INTENT.to_owned(), id.to_string());
            tags.insert(TAG_CREATED_AT.to_owned(), now.to_string());
            let mut request = CreateInterface {
                subnet_id: subnet_id.clone(),
                description: Some(format!("corral {} {}", self.ctx.cluster, self.node)),
                tags,
                security_groups: attempt.security_groups.clone(),
                client_token: Some(id.to_string()),
                ..CreateInterface::default()
            };
            match (family, prefixes) {
                (Family::V4, false) => request.secondary_ipv4 = Some(Amount::Count(count)),
                (Family::V4, true) => request.ipv4_prefixes = Some(Amount::Count(count)),
                (Family::V6, false) => request.ipv6_addresses = Some(Amount::Count(count)),
                (Family::V6, true) => request.ipv6_prefixes = Some(Amount::Count(count)),
            }
            let created = self.ctx.provider.create_interface(&request).await;
            let created = match created {
                Ok(created) => created,
                Err(error) if error.is_ambiguous() => {
                    // Perhaps created: the intent (the client token and tag) finds it.
                    return Outcome::Wait(REPLAY_WAIT);
                }
                Err(error) => {
                    self.drop_intent(&intent_key, intent_revision).await;
                    if matches!(error, CloudError::InsufficientCidrBlocks { .. }) && prefixes {
                        tried.push(subnet_id.clone());
                        self.no_free_prefix.push(subnet_id.clone());
                        let action = CloudAction::Create {
                            subnet_id: subnet_id.clone(),
                            device_index,
                            count,
                            prefixes,
                        };
                        match decide::prefix_fallback(
                            &action,
                            &attempt.cloud,
                            &attempt.zone,
                            family,
                            &attempt.subnets,
                            &tried,
                        ) {
                            PrefixFallback::Sibling {
                                subnet_id: sibling,
                                count: sibling_count,
                            } => {
                                subnet_id = sibling;
                                count = sibling_count.max(1);
                            }
                            PrefixFallback::Secondaries => {
                                // Single addresses in that subnet: as many as the prefixes
                                // would have given, within the interface's limit. The new
                                // interface's record keeps the refusal.
                                prefixes = false;
                                self.created_refused_ms = Some((self.ctx.clock)());
                                let per = self.limits.map_or(count.saturating_mul(16), |l| {
                                    l.ipv4_per_interface.saturating_sub(1)
                                });
                                let count_now = count.saturating_mul(16).min(per.max(1));
                                return Box::pin(self.create(
                                    pool,
                                    family,
                                    subnet_id,
                                    device_index,
                                    count_now,
                                    prefixes,
                                    attempt,
                                ))
                                .await;
                            }
                        }
                        if tried.len() > attempt.subnets.len() {
                            return Outcome::Failed("no subnet has a free prefix".to_owned());
                        }
                        continue;
                    }
                    return Outcome::Failed(format!("creating an interface: {error}"));
                }
            };
            return self
                .attach(
                    pool,
                    &created,
                    device_index,
                    &intent_key,
                    intent_revision,
                    attempt,
                )
                .await;
        }
    }

    /// Attaches a created interface at `device_index` (the next free one on an occupied
    /// index, up to 5 tries), then records it; deletes it if attaching fails.
    async fn attach(
        &mut self,
        pool: &PoolName,
        created: &NetworkInterface,
        mut device_index: u32,
        intent_key: &str,
        intent_revision: Revision,
        attempt: &AttemptContext,
    ) -> Outcome {
        let max_interfaces = self.limits.map_or(u32::MAX, |l| l.max_interfaces);
        let mut attached = None;
        let mut last_error = None;
        for _ in 0..ATTACH_TRIES {
            match self
                .ctx
                .provider
                .attach_interface(AttachInterface::new(
                    &created.id,
                    self.instance_id,
                    device_index,
                ))
                .await
            {
                Ok(_) => {
                    attached = Some(device_index);
                    break;
                }
                Err(CloudError::DeviceIndexInUse { .. }) => {
                    self.occupied.push(device_index);
                    let occupied = self.occupied.clone();
                    match decide::next_device_index(
                        &attempt.interfaces,
                        attempt.cloud.first_interface_index,
                        max_interfaces,
                        &occupied,
                        Some(device_index),
                    ) {
                        Some(next) => device_index = next,
                        None => {
                            last_error = Some("no free device index".to_owned());
                            break;
                        }
                    }
                }
                Err(error) if error.is_ambiguous() => {
                    // Perhaps attached: the intent is replayed from what the cloud shows.
                    return Outcome::Wait(REPLAY_WAIT);
                }
                Err(error) => {
                    last_error = Some(error.to_string());
                    break;
                }
            }
        }
        let Some(device_index) = attached else {
            // Not attached: the interface is deleted (best effort; the intent stays open if
            // that fails, and its replay deletes it).
            let deleted = self.ctx.provider.delete_interface(&created.id).await;
            if deleted.is_ok() || deleted.as_ref().is_err_and(CloudError::is_not_found) {
                self.drop_intent(intent_key, intent_revision).await;
            }
            return Outcome::Failed(format!(
                "attaching {}: {}",
                created.id,
                last_error.unwrap_or_default()
            ));
        };
        let Ok(interface) = CloudId::new(&created.id) else {
            return Outcome::Failed(format!("the cloud named an interface {:?}", created.id));
        };
        let key = self.ctx.term.keys.cloud_interface(self.node, &interface);
        let record = CloudInterfaceRecord {
            pool: pool.clone(),
            instance_id: self.instance_id.to_owned(),
            device_index,
            subnet_id: created.subnet_id.clone(),
            subnets: self.subnet_cidrs(&created.subnet_id),
            mac: created.mac.to_string(),
            primary_ipv4: Some(created.primary_ipv4),
            addresses: created.secondary_nets(),
            assigned_ms: Default::default(),
            attachment: CloudAttachment::Attaching,
            managed: true,
            prefixes_refused_ms: self.created_refused_ms,
        };
        self.record(
            key.clone(),
            record,
            Compare::absent(key),
            intent_key,
            intent_revision,
            &[],
        )
        .await
    }

    async fn unassign(
        &mut self,
        pool: &PoolName,
        family: Family,
        interface: &CloudId,
        entry: &CloudEntry<CloudInterfaceRecord>,
        addresses: &[(IpNet, i64)],
    ) -> Outcome {
        let Some(record) = &entry.record else {
            return Outcome::Ok;
        };
        let nets: Vec<IpNet> = addresses.iter().map(|(net, _)| *net).collect();
        let id = self.next_intent();
        let op = CloudOp::Unassign {
            interface: interface.clone(),
            addresses: nets.clone(),
        };
        // Only while each `ready` is still the one seen (at its mod revision) and the record
        // still holds the addresses: a view behind must not unassign what was re-granted.
        let key = self.ctx.term.keys.cloud_interface(self.node, interface);
        let mut also = vec![Compare::modified_at(key, entry.mod_revision)];
        for (net, revision) in addresses {
            also.push(Compare::modified_at(
                self.ctx.term.keys.release(self.node, pool, family, net),
                *revision,
            ));
        }
        let (intent_key, intent_revision) = match self.open_intent_if(&id, pool, op, also).await {
            Ok(opened) => opened,
            Err(outcome) => return outcome,
        };
        self.mutated = true;
        let result = unassign_call(self.ctx, interface.as_str(), &nets).await;
        match result {
            Ok(()) => {}
            // Some are not on the interface: EC2 (and the fake) refuse the whole call, so the
            // others are still assigned; moto drops what is there and answers success. Either
            // way the answer does not say which are gone: the intent stays open and its replay
            // reads the interface (after the describe lag bound) before the record drops any.
            Err(error) if is_not_assigned(&error) => return Outcome::Wait(REPLAY_WAIT),
            Err(error) if error.is_ambiguous() => return Outcome::Wait(REPLAY_WAIT),
            Err(error) => {
                self.drop_intent(&intent_key, intent_revision).await;
                return Outcome::Failed(format!("unassigning from {interface}: {error}"));
            }
        }
        let mut record = record.clone();
        record.addresses.retain(|a| !nets.contains(a));
        let key = self.ctx.term.keys.cloud_interface(self.node, interface);
        let release_deletes: Vec<(String, i64)> = addresses
            .iter()
            .map(|(net, revision)| {
                (
                    self.ctx.term.keys.release(self.node, pool, family, net),
                    *revision,
                )
            })
            .collect();
        self.record(
            key.clone(),
            record,
            Compare::modified_at(key, entry.mod_revision),
            &intent_key,
            intent_revision,
            &release_deletes,
        )
        .await
    }

    /// Finishes or undoes the node's open intents from what the cloud shows.
    pub(super) async fn replay(
        &mut self,
        intents: Vec<(CloudId, CloudEntry<CloudIntentRecord>)>,
    ) -> Outcome {
        for (id, entry) in intents {
            let intent_key = self.ctx.term.keys.cloud_intent(&id);
            let Some(intent) = entry.record.clone() else {
                self.drop_intent(&intent_key, entry.mod_revision).await;
                continue;
            };
            let found = match find_intent_interface(self.ctx, &id, &intent).await {
                Ok(found) => found,
                Err(error) => return Outcome::Failed(format!("replaying intent {id}: {error}")),
            };
            let observed = found.as_ref().map(|ni| observe(ni, &self.ctx.cluster));
            let record_entry = found.as_ref().and_then(|ni| {
                let iid = CloudId::new(&ni.id).ok()?;
                self.ctx
                    .term
                    .shared
                    .with_view(|view, _| {
                        view.cloud_interfaces_of(self.node)
                            .find(|(i, _)| **i == iid)
                            .map(|(_, e)| e.clone())
                    })
                    .flatten()
            });
            let node_present = self
                .ctx
                .term
                .shared
                .with_view(|view, _| {
                    instance_of(view, self.node).as_deref() == intent.instance_id.as_deref()
                })
                .unwrap_or(false);
            let age = (self.ctx.clock)().saturating_sub(intent.started_ms);
            let index_free = match &intent.op {
                CloudOp::CreateAttach { device_index, .. } => !self.known.iter().any(|ni| {
                    ni.attachment
                        .as_ref()
                        .is_some_and(|a| a.device_index == *device_index)
                        && found.as_ref().is_none_or(|f| f.id != ni.id)
                }),
                _ => true,
            };
            let replay = decide::replay_intent(
                &intent,
                observed.as_ref(),
                record_entry.as_ref().and_then(|e| e.record.as_ref()),
                node_present,
                index_free,
                age,
            );
            let outcome = self
                .carry_out_replay(
                    &intent_key,
                    &entry,
                    &intent,
                    replay,
                    found.as_ref(),
                    record_entry.as_ref(),
                )
                .await;
            match outcome {
                Outcome::Ok | Outcome::Replan => {}
                other => return other,
            }
        }
        Outcome::Ok
    }

    async fn carry_out_replay(
        &mut self,
        intent_key: &str,
        entry: &CloudEntry<CloudIntentRecord>,
        intent: &CloudIntentRecord,
        replay: Replay,
        found: Option<&NetworkInterface>,
        record_entry: Option<&CloudEntry<CloudInterfaceRecord>>,
    ) -> Outcome {
        match replay {
            Replay::Forget => {
                // An unassign that went through (its addresses are not on the interface any
                // more): they leave the record with the intent, with their release keys (left
                // in the record, a later unassign naming them with others would be refused
                // as "not assigned" and drop the others from the record while still assigned).
                if let CloudOp::Unassign {
                    interface,
                    addresses,
                } = &intent.op
                    && found.is_some()
                    && let Some(e) = record_entry
                    && let Some(record) = &e.record
                    && record.addresses.iter().any(|a| addresses.contains(a))
                {
                    let mut record = record.clone();
                    record.addresses.retain(|a| !addresses.contains(a));
                    let release_deletes = self
                        .ctx
                        .term
                        .shared
                        .with_view(|view, _| {
                            view.releases_of(self.node)
                                .filter(|((_, p, _, c), _)| {
                                    *p == intent.pool && addresses.contains(c)
                                })
                                .map(|((_, p, f, c), (rev, _))| {
                                    (view.keys().release(self.node, p, *f, c), *rev)
                                })
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default();
                    let key = self.ctx.term.keys.cloud_interface(self.node, interface);
                    return self
                        .record(
                            key.clone(),
                            record,
                            Compare::modified_at(key, e.mod_revision),
                            intent_key,
                            entry.mod_revision,
                            &release_deletes,
                        )
                        .await;
                }
                self.drop_intent(intent_key, entry.mod_revision).await;
                Outcome::Ok
            }
            Replay::Wait => Outcome::Wait(REPLAY_WAIT),
            Replay::Record(observed) => {
                let Some(ni) = found else {
                    return Outcome::Wait(REPLAY_WAIT);
                };
                self.record_observed(intent_key, entry, intent, ni, &observed, record_entry)
                    .await
            }
            Replay::Attach {
                interface,
                device_index,
            } => {
                let Some(ni) = found else {
                    return Outcome::Wait(REPLAY_WAIT);
                };
                let revision = match self.touch_intent(intent_key, entry, intent).await {
                    Ok(revision) => revision,
                    Err(outcome) => return outcome,
                };
                self.mutated = true;
                let attempt = AttemptContext {
                    cloud: self
                        .ctx
                        .term
                        .shared
                        .with_view(|view, _| {
                            view.config()
                                .pool(&intent.pool)
                                .and_then(|p| p.cloud().map(|c| c.settings()))
                        })
                        .flatten()
                        .unwrap_or_default(),
                    zone: ni.availability_zone.clone(),
                    subnets: Vec::new(),
                    interfaces: Vec::new(),
                    security_groups: Vec::new(),
                };
                let _ = interface;
                self.attach(
                    &intent.pool,
                    ni,
                    device_index,
                    intent_key,
                    revision,
                    &attempt,
                )
                .await
            }
            Replay::Delete { interface } => {
                let revision = match self.touch_intent(intent_key, entry, intent).await {
                    Ok(revision) => revision,
                    Err(outcome) => return outcome,
                };
                self.mutated = true;
                match self.ctx.provider.delete_interface(interface.as_str()).await {
                    Ok(()) => {
                        self.drop_intent(intent_key, revision).await;
                        Outcome::Ok
                    }
                    Err(error) if error.is_not_found() => {
                        self.drop_intent(intent_key, revision).await;
                        Outcome::Ok
                    }
                    // Still detaching (shown unattached a moment early): asked again soon.
                    Err(CloudError::InterfaceInUse { .. }) => Outcome::Wait(ATTACH_POLL),
                    Err(error) => Outcome::Failed(format!("deleting {interface}: {error}")),
                }
            }
            Replay::Detach { interface } => {
                let Some(attachment) = found.and_then(|ni| ni.attachment.as_ref()) else {
                    return Outcome::Wait(REPLAY_WAIT);
                };
                if let Err(outcome) = self.touch_intent(intent_key, entry, intent).await {
                    return outcome;
                }
                self.mutated = true;
                // Not forced: the instance is running and the interface leaves cleanly (its
                // addresses left the agent with its record before this call).
                match self
                    .ctx
                    .provider
                    .detach_interface(&attachment.id, false)
                    .await
                {
                    // Deleted once a replay shows it unattached.
                    Ok(()) => Outcome::Wait(ATTACH_POLL),
                    Err(error) if error.is_not_found() || error.is_ambiguous() => {
                        Outcome::Wait(ATTACH_POLL)
                    }
                    Err(error) => Outcome::Failed(format!("detaching {interface}: {error}")),
                }
            }
            Replay::Unassign {
                interface,
                addresses,
            } => {
                if let Err(outcome) = self.touch_intent(intent_key, entry, intent).await {
                    return outcome;
                }
                self.mutated = true;
                // Done or not, the next replay reads the interface again (waiting within the
                // describe lag of this call) before anything is recorded.
                match unassign_call(self.ctx, interface.as_str(), &addresses).await {
                    Ok(()) => Outcome::Wait(REPLAY_WAIT),
                    Err(error) if is_not_assigned(&error) || error.is_ambiguous() => {
                        Outcome::Wait(REPLAY_WAIT)
                    }
                    Err(error) => Outcome::Failed(format!("unassigning from {interface}: {error}")),
                }
            }
        }
    }

    /// Records what the cloud shows of an intent's interface, deleting the intent (and, for
    /// an unassign, the release keys of addresses gone).
    async fn record_observed(
        &mut self,
        intent_key: &str,
        entry: &CloudEntry<CloudIntentRecord>,
        intent: &CloudIntentRecord,
        ni: &NetworkInterface,
        observed: &ObservedInterface,
        record_entry: Option<&CloudEntry<CloudInterfaceRecord>>,
    ) -> Outcome {
        let key = self.ctx.term.keys.cloud_interface(self.node, &observed.id);
        let (record, compare) =
            match record_entry.and_then(|e| e.record.clone().map(|r| (e, r))) {
                Some((e, mut record)) => {
                    record.addresses = observed.addresses.clone();
                    if let Some((_, index)) = &observed.attached_to {
                        record.device_index = *index;
                    }
                    (record, Compare::modified_at(key.clone(), e.mod_revision))
                }
                None => {
                    let Some((attached_to, device_index)) = observed.attached_to.clone() else {
                        return Outcome::Wait(REPLAY_WAIT);
                    };
                    (
                        CloudInterfaceRecord {
                            pool: intent.pool.clone(),
                            // The instance it is on (the intent's, perhaps not the node's
                            // current one: then the record is dropped, never served there).
                            instance_id: attached_to,
                            device_index,
                            subnet_id: ni.subnet_id.clone(),
                            subnets: self.subnet_cidrs(&ni.subnet_id),
                            mac: ni.mac.to_string(),
                            primary_ipv4: Some(ni.primary_ipv4),
                            addresses: observed.addresses.clone(),
                            assigned_ms: Default::default(),
                            attachment: if ni.attachment.as_ref().is_some_and(|a| {
                                a.status == corral_cloud::AttachmentStatus::Attached
                            }) {
                                CloudAttachment::Attached
                            } else {
                                CloudAttachment::Attaching
                            },
                            managed: ni
                                .tags
                                .get(TAG_CLUSTER)
                                .is_some_and(|c| *c == self.ctx.cluster),
                            prefixes_refused_ms: None,
                        },
                        Compare::absent(key.clone()),
                    )
                }
            };
        // An unassign that went through: its release keys go with the intent.
        let mut release_deletes = Vec::new();
        if let CloudOp::Unassign { addresses, .. } = &intent.op {
            let gone: Vec<IpNet> = addresses
                .iter()
                .filter(|a| !observed.addresses.contains(a))
                .copied()
                .collect();
            release_deletes = self
                .ctx
                .term
                .shared
                .with_view(|view, _| {
                    view.releases_of(self.node)
                        .filter(|((_, p, _, c), _)| *p == intent.pool && gone.contains(c))
                        .map(|((_, p, f, c), (rev, _))| {
                            (view.keys().release(self.node, p, *f, c), *rev)
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
        }
        self.record(
            key,
            record,
            compare,
            intent_key,
            entry.mod_revision,
            &release_deletes,
        )
        .await
    }
}

/// An unassign whose addresses were not on the interface any more (a repeat).
pub(super) fn is_not_assigned(error: &CloudError) -> bool {
    matches!(error, CloudError::InvalidParameterValue { message } if message.contains("not assigned"))
}

/// Unassigns addresses and prefixes of both families (one call per family present).
pub(super) async fn unassign_call<K, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    interface: &str,
    nets: &[IpNet],
) -> Result<(), CloudError> {
    let (v4, v6) = corral_cloud::sets_of(nets);
    if !v4.is_empty() {
        ctx.provider.unassign_ipv4(interface, &v4).await?;
    }
    if !v6.is_empty() {
        ctx.provider.unassign_ipv6(interface, &v6).await?;
    }
    Ok(())
}

pub(super) fn observe(ni: &NetworkInterface, cluster: &str) -> ObservedInterface {
    ObservedInterface {
        managed: ni.tags.get(TAG_CLUSTER).is_some_and(|c| c == cluster),
        id: CloudId::new(&ni.id).unwrap_or_else(|_| CloudId::min()),
        attached_to: ni.attachment.as_ref().and_then(|a| {
            matches!(
                a.status,
                corral_cloud::AttachmentStatus::Attached
                    | corral_cloud::AttachmentStatus::Attaching
            )
            .then(|| (a.instance_id.clone(), a.device_index))
        }),
        addresses: ni.secondary_nets(),
    }
}

/// The interface an intent is about, as the cloud shows it now: for a create, the one
/// carrying the intent's tag; otherwise the one it names (`None`: not found).
pub(super) async fn find_intent_interface<K, P: CloudProvider>(
    ctx: &Ctx<K, P>,
    id: &CloudId,
    intent: &CloudIntentRecord,
) -> Result<Option<NetworkInterface>, CloudError> {
    let interface = match &intent.op {
        CloudOp::CreateAttach { .. } => {
            let mut filter = InterfaceFilter::default();
            filter
                .tags
                .insert(TAG_INTENT.to_owned(), Some(id.to_string()));
            let found = ctx.provider.describe_interfaces(&filter).await?;
            return Ok(found.into_iter().next());
        }
        CloudOp::Assign { interface, .. }
        | CloudOp::Unassign { interface, .. }
        | CloudOp::Delete { interface }
        | CloudOp::DelegatePrefix { interface, .. }
        | CloudOp::UndelegatePrefix { interface, .. } => interface,
    };
    match ctx
        .provider
        .describe_interfaces(&InterfaceFilter::id(interface.as_str()))
        .await
    {
        Ok(found) => Ok(found.into_iter().next()),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(error),
    }
}
