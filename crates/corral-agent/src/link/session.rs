//! The agent's part in a cluster (`corral agent --etcd URL --node NAME`): register the node,
//! keep its liveness key on a lease, watch its own grants, and hand them to the node state as the
//! `node` scope's cluster ranges (recorded durably before anything is allocated from them).
//!
//! Pod allocations never touch etcd: this task only moves address space. While etcd cannot
//! be reached the agent keeps serving from what it holds and says so in its status
//! (`degraded`, since when); nothing it holds is dropped for want of etcd, only a grant that
//! etcd says is gone (a node removal) drains.
//!
//! This file runs the link: a round registers the node, claims its liveness key, reads its
//! keys at one revision and follows them with a watch; a failure ends the round and the next
//! one starts after a backoff.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use corral_cluster::{
    ClusterName, Keys, LiveRecord, NodeName, NodeRecord, decode_value, encode_value,
};

use corral_kv::{Compare, Event, Kv, KvError, LeaseId, Revision, Txn, TxnOp};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::cloud::{CLOUD_FROZEN_RECHECK, apply_cloud};
use super::demand::{DemandWriter, sleep_until_due};
use super::handshake::{handshake, held_locally};
use super::held::{AcrossRounds, Held, screen};
use super::holdings;
use super::liveness::{Renewal, Renewed};
use super::state::{
    ClusterOptions, Cx, LinkError, Retrying, SharedClusterState, backoff, now_ms, update,
};
use crate::committer::Committer;
use crate::node::{ClusterRanges, Pools};

/// Runs the cluster link until `stop` fires, reconnecting with jittered backoff (1 s doubling
/// to 30 s) after any failure. The agent's gate ([`Gate`](crate::link::Gate)) opens once the first round holds
/// the node's liveness key or ends for another reason; another live agent holding it is fatal
/// for an agent that never held it (it exits), and ends the link of one that did.
pub async fn run<K: Kv>(
    kv: K,
    options: ClusterOptions,
    committer: Committer,
    state: SharedClusterState,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    // The session's span: every event of the link (and of the holdings publisher it starts)
    // names the node and the cluster.
    let span = tracing::info_span!("cluster", node = %options.node, cluster = %options.cluster);
    run_link(kv, options, committer, &state, stop)
        .instrument(span)
        .await;
    // However the link ended, the agent is not kept waiting by it.
    state.open_gate();
}

pub(super) async fn run_link<K: Kv>(
    kv: K,
    options: ClusterOptions,
    committer: Committer,
    state: &SharedClusterState,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let state = state.clone();
    let (keys, node) = match (
        ClusterName::new(&options.cluster),
        NodeName::new(&options.node),
    ) {
        (Ok(cluster), Ok(node)) => (Keys::new(cluster), node),
        (Err(error), _) | (_, Err(error)) => {
            update(&state, |s| s.last_error = Some(error.to_string()));
            return;
        }
    };
    update(&state, |s| s.node = options.node.clone());
    let mut failures: u32 = 0;
    // The node's assertion of what it holds: published beside the link for the agent's whole
    // life (a removed node keeps asserting while it drains), until `stop`.
    let guard = Arc::new(holdings::EpochGuard::load(options.epoch_file.clone()));
    let identity = crate::link::liveness::ProcessIdentity::current();
    tokio::spawn(
        holdings::publish(
            kv.clone(),
            keys.clone(),
            node.clone(),
            options.uid.clone(),
            committer.clone(),
            Arc::clone(&state),
            Arc::clone(&guard),
            identity.clone(),
            stop.clone(),
        )
        .in_current_span(),
    );
    // What outlives a round: the registration this process made or found (a later round
    // that finds it gone or replaced means the node was removed meanwhile), and the last
    // node ID and plan that could be read (one that cannot be read later keeps them).
    let mut across = AcrossRounds {
        epoch: Some(Arc::clone(&guard)),
        identity: identity.clone(),
        ..AcrossRounds::default()
    };
    let asserter = holdings::Asserter {
        kv: &kv,
        keys: &keys,
        node: &node,
        uid: &options.uid,
        committer: &committer,
        state: &state,
        guard: &guard,
        identity: &identity,
    };
    let cx = &Cx {
        kv: &kv,
        keys: &keys,
        node: &node,
        options: &options,
        committer: &committer,
        state: &state,
    };
    loop {
        // etcd went back in time (restored, wiped): the holdings are asserted again first,
        // and the registration etcd forgot is made again (not taken for a removal).
        let before = guard.floor();
        if asserter.round_start().await {
            across.registration = None;
        }
        across.seen_before = before.min(guard.floor());
        let outcome = link(cx, &mut stop, &mut across).await;
        if across.served {
            failures = 0;
            across.served = false;
        }
        match outcome {
            Err(LinkError::Stopped) | Ok(()) => return,
            Err(error @ LinkError::Held { .. }) => {
                // Another live agent serves the node (a cloned machine, a copied state
                // directory): this one serves none of the node's cluster ranges (those it
                // recorded drain: its pods keep their addresses, nothing new is handed out
                // from them, also after a restart, until it holds the liveness itself), and
                // does not fight for the key.
                let message = error.to_string();
                tracing::error!(
                    %error,
                    "not serving the node's cluster ranges while another agent holds it"
                );
                // Said before the ranges drain, so whoever sees them drained sees why.
                update(&state, |s| {
                    s.registered = false;
                    s.grants.clear();
                    s.node_id = None;
                    s.last_error = Some(message.clone());
                });
                if let Err(e) = committer.call(ClusterRanges::default()).await {
                    update(&state, |s| {
                        s.last_error =
                            Some(format!("{message}; draining its cluster ranges: {e:?}"))
                    });
                }
                if !across.live {
                    state.fail(message);
                }
                return;
            }
            Err(error @ LinkError::Forgotten(_)) => {
                // What the node holds is asserted before it registers again, so nothing it
                // serves is granted around it; then the next round at once.
                tracing::warn!(
                    %error,
                    "asserting what the node holds and registering it again"
                );
                update(&state, |s| {
                    s.registered = false;
                    s.last_error = Some(error.to_string());
                });
                across.registration = None;
                if let Err(error) = asserter.assert_now().await {
                    tracing::warn!(%error, "asserting the node's holdings");
                }
            }
            Err(LinkError::Removed(_)) => {
                // An administrator removed the node while it runs: its grants are gone, so it
                // drains here (pods keep their addresses, nothing new is handed out, ADDs on
                // its cluster pools are refused), and the node does not register again behind
                // the administrator's back: a restart of the agent does. What it still holds
                // waits in etcd until it gives it up (`while_removed`).
                state
                    .removed
                    .store(true, std::sync::atomic::Ordering::Release);
                tracing::warn!(
                    "removed from the cluster: its ranges drain; restart the agent to register \
                     the node again"
                );
                // Said before the ranges drain, so whoever sees them drained sees why.
                update(&state, |s| {
                    s.registered = false;
                    s.grants.clear();
                    s.node_id = None;
                    s.last_error = Some(format!(
                        "node {} was removed from the cluster; restart the agent to register it again",
                        options.node
                    ));
                });
                if let Err(error) = committer.call(ClusterRanges::default()).await {
                    tracing::error!(?error, "draining the node's ranges after its removal");
                    update(&state, |s| {
                        s.last_error = Some(format!(
                            "node {} was removed from the cluster; draining its ranges failed: \
                             {error:?}",
                            options.node
                        ))
                    });
                }
                while_removed(cx, &mut stop, across.live_lease.take(), &across.identity).await;
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cluster link round failed");
                // The first round could not get as far as the liveness key: the agent serves
                // what it holds meanwhile.
                state.open_gate();
                let unreachable = matches!(&error, LinkError::Kv(e) if e.is_retryable());
                update(&state, |s| {
                    s.last_error = Some(error.to_string());
                    if unreachable && s.degraded_since_ms.is_none() {
                        s.degraded_since_ms = Some(now_ms());
                    }
                });
                failures = failures.saturating_add(1);
                let seed = u64::from(std::process::id())
                    ^ u64::from(
                        SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.subsec_nanos()),
                    );
                tokio::select! {
                    _ = tokio::time::sleep(backoff(failures, seed)) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// The cluster ranges the node scope still holds (granted or draining), with their pools and
/// allocations; `None` if the node state could not answer.
pub(super) async fn cluster_ranges_held(
    committer: &Committer,
) -> Option<Vec<(String, corral_api::RangeInfo)>> {
    match committer.call(Pools(Some("node".into()))).await {
        Ok(pools) => Some(
            pools
                .pools
                .into_iter()
                .flat_map(|p| {
                    let name = p.name;
                    p.ranges
                        .into_iter()
                        .filter(|r| r.source == corral_api::RangeSource::Cluster)
                        .map(move |r| (name.clone(), r))
                })
                .collect(),
        ),
        _ => None,
    }
}

/// How often a removed node looks at what it still holds.
pub(super) const REMOVED_TICK: Duration = Duration::from_secs(1);

/// After the node's removal: the agent stays live (its `live/<node>` key on a lease it keeps
/// alive: a removed node that shows no liveness for the quarantine time is taken for gone)
/// and keeps asserting what it holds until its cluster ranges drained, then revokes its lease
/// and ends. Stops with the agent.
pub(super) async fn while_removed<K: Kv>(
    cx: &Cx<'_, K>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    lease: Option<LeaseId>,
    identity: &crate::link::liveness::ProcessIdentity,
) {
    let (kv, keys, node, options, committer, state) = cx.parts();
    // The round's lease, kept alive from now on (etcd says at once if it is gone already).
    let mut renewal = lease.map(|lease| Renewal::new(lease, options.lease_ttl, Instant::now()));
    let keep_alive_every = (options.lease_ttl / 3)
        .max(Duration::from_millis(200))
        .min(REMOVED_TICK);
    let mut tick = tokio::time::interval(keep_alive_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {
                if let Some(renewal) = &renewal {
                    let _ = kv.lease_revoke(renewal.lease()).await;
                }
                return;
            }
        }
        // The liveness key: kept alive (through slow answers, `Renewal`), or put again on a
        // new lease (etcd was unreachable for longer than the TTL, or the round that found
        // the removal had none).
        let alive = match &mut renewal {
            Some(renewal) => renewal.renew(kv).await.is_ok(),
            None => false,
        };
        if !alive {
            let asked = Instant::now();
            renewal = live_again(kv, keys, node, options.lease_ttl, identity)
                .await
                .ok()
                .map(|lease| {
                    state.set_live_lease(lease);
                    Renewal::new(lease, options.lease_ttl, asked)
                });
        }
        let Some(held) = cluster_ranges_held(committer).await else {
            continue;
        };
        // What is still held is asserted by the holdings publisher (`holdings.rs`), which
        // runs for the agent's whole life: the leader quarantines a removed range only once
        // that record drops it.
        let pods: u64 = held.iter().map(|(_, r)| r.allocated).sum();
        update(state, |s| {
            s.last_error = Some(format!(
                "node {} was removed from the cluster; it takes no new pods and drains \
                 ({} range(s), {pods} pod address(es) left); restart the agent to register it again",
                options.node,
                held.len()
            ));
        });
        if held.is_empty() {
            tracing::info!("drained after its removal: the node holds nothing");
            if let Some(renewal) = &renewal {
                let _ = kv.lease_revoke(renewal.lease()).await;
            }
            return;
        }
    }
}

/// Puts `live/<node>` on a new lease of the agent's TTL, only if no key is there (one live
/// agent per node: another process's key, or this one's on a lease it lost track of, is left
/// alone; the next turn tries again once it is gone).
pub(super) async fn live_again<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    ttl: Duration,
    identity: &crate::link::liveness::ProcessIdentity,
) -> Result<LeaseId, KvError> {
    let lease = kv.lease_grant(ttl).await?;
    let live = identity.record(now_ms(), ttl);
    let key = keys.live(node);
    let response = kv
        .txn(Txn {
            compares: vec![Compare::absent(key.as_str())],
            success: vec![TxnOp::put_on_lease(
                key.as_str(),
                encode_value(&live).unwrap_or_default(),
                lease,
            )],
            failure: vec![],
        })
        .await;
    match response {
        Ok(response) if response.succeeded => Ok(lease),
        Ok(_) => {
            let _ = kv.lease_revoke(lease).await;
            Err(KvError::Unavailable(format!(
                "{key} is held by another lease"
            )))
        }
        Err(error) => {
            let _ = kv.lease_revoke(lease).await;
            Err(error)
        }
    }
}

/// One connected round: register, go live, read and watch the grants.
pub(super) async fn link<K: Kv>(
    cx: &Cx<'_, K>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    across: &mut AcrossRounds,
) -> Result<(), LinkError> {
    let (kv, keys, node, options, committer, state) = cx.parts();
    let registration = register(kv, keys, node, options, across.registration).await?;
    across.registration = Some(registration);
    let asked = Instant::now();
    let lease = kv.lease_grant(options.lease_ttl).await?;
    // The liveness key is created only if no other process holds it (liveness.rs): a second
    // agent under the node's name is refused, naming the holder.
    let live_key = keys.live(node);
    let live: LiveRecord = across.identity.record(now_ms(), options.lease_ttl);
    let report = |message: &str| update(state, |s| s.last_error = Some(message.to_owned()));
    let mut claim = async |ask_first| {
        crate::link::liveness::claim(
            kv,
            &live_key,
            &live,
            lease,
            &across.identity,
            options.lease_ttl,
            stop,
            ask_first,
            report,
        )
        .await
    };
    let mut claimed = claim(state.serving()).await;
    if let Err(crate::link::liveness::ClaimError::MustWait(message)) = &claimed {
        // Serving already (a later round, or started while etcd was unreachable): the node's
        // ranges drain while the holder is waited for, so two never serve them; the grants
        // come back with the key.
        report(message);
        let drained = committer.call(ClusterRanges::default()).await;
        if let Err(error) = drained {
            tracing::warn!(?error, "draining the node's ranges");
        }
        update(state, |s| {
            s.registered = false;
            s.grants.clear();
        });
        claimed = claim(false).await;
    }
    let claimed = match claimed {
        Ok(claimed) => claimed,
        Err(error) => {
            let _ = kv.lease_revoke(lease).await;
            return Err(match error {
                crate::link::liveness::ClaimError::Held(holder) => LinkError::Held {
                    node: options.node.clone(),
                    holder,
                },
                crate::link::liveness::ClaimError::Kv(error) => LinkError::Kv(error),
                crate::link::liveness::ClaimError::Stopped => LinkError::Stopped,
                crate::link::liveness::ClaimError::MustWait(message) => {
                    LinkError::Kv(KvError::Unavailable(message))
                }
            });
        }
    };
    across.live = true;
    state.set_live_lease(lease);
    state.open_gate();
    let result = tokio::select! {
        result = follow(cx, stop,
            registration,
            Renewal::new(lease, options.lease_ttl, asked),
            across,
        ) => result,
        // Another process took the key (after this one's lease lapsed, or overwriting it):
        // the round ends, and the node's ranges are not served by two.
        lost = crate::link::liveness::guard(kv, &live_key, &live, lease, claimed) => Err(match lost {
            crate::link::liveness::Lost::Taken(holder) => LinkError::Held {
                node: options.node.clone(),
                holder,
            },
            crate::link::liveness::Lost::Kv(error) => LinkError::Kv(error),
        }),
    };
    if matches!(result, Err(LinkError::Stopped)) {
        // A clean stop says so at once; a crash leaves the key to its lease. Revoking the
        // lease deletes only what is on it: the key this process created (never another
        // agent's, which is on that agent's lease).
        let _ = kv.lease_revoke(lease).await;
    }
    if matches!(result, Err(LinkError::Removed(_))) {
        // The node stays live while it drains (`while_removed`).
        across.live_lease = Some(lease);
    }
    result
}

/// Creates the node's registration if absent, else checks it is this machine's. Answers the
/// registration's create revision. Once this process registered (`known`), only that
/// registration will do: gone or replaced means the node was removed while the link was
/// down, and only a restart of the agent registers it again.
pub(super) async fn register<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    options: &ClusterOptions,
    known: Option<Revision>,
) -> Result<Revision, LinkError> {
    let node_key = keys.node(node);
    let node_key = node_key.as_str();
    loop {
        let existing = kv.get(node_key.as_bytes()).await?;
        if let Some(known) = known
            && existing.as_ref().is_none_or(|e| e.create_revision != known)
        {
            return Err(gone_why(kv, keys, node, known, None).await?);
        }
        if let Some(existing) = existing {
            let record: Option<NodeRecord> = decode_value(&existing.value).ok();
            return match record {
                Some(record) if record.uid == options.uid => {
                    match (&record.instance_id, &options.instance_id) {
                        (Some(registered), Some(ours)) if registered != ours => {
                            Err(LinkError::InstanceMismatch {
                                node: options.node.clone(),
                                registered: registered.clone(),
                                ours: ours.clone(),
                            })
                        }
                        (registered, ours)
                            if (registered.is_none() && ours.is_some())
                                || record.max_pods != options.max_pods =>
                        {
                            // Registered before it knew its instance (an older agent), or with
                            // another pod cap (`--max-pods` changed): the record is brought up
                            // to date, the registration (create revision) kept.
                            let updated = NodeRecord {
                                instance_id: ours.clone().or(record.instance_id.clone()),
                                max_pods: options.max_pods,
                                ..record
                            };
                            let response = kv
                                .txn(Txn {
                                    compares: vec![Compare::modified_at(
                                        node_key,
                                        existing.mod_revision,
                                    )],
                                    success: vec![TxnOp::put(
                                        node_key,
                                        encode_value(&updated).unwrap_or_default(),
                                    )],
                                    failure: vec![],
                                })
                                .await?;
                            if !response.succeeded {
                                continue;
                            }
                            Ok(existing.create_revision)
                        }
                        _ => Ok(existing.create_revision),
                    }
                }
                Some(record) => Err(LinkError::UidMismatch {
                    node: options.node.clone(),
                    found: record.uid,
                }),
                None => Err(LinkError::UidMismatch {
                    node: options.node.clone(),
                    found: "an unreadable record".into(),
                }),
            };
        }
        let record = NodeRecord {
            uid: options.uid.clone(),
            addresses: Vec::new(),
            registered_ms: now_ms(),
            instance_id: options.instance_id.clone(),
            max_pods: options.max_pods,
        };
        let response = kv
            .txn(Txn {
                compares: vec![Compare::absent(node_key)],
                success: vec![TxnOp::put(
                    node_key,
                    encode_value(&record).unwrap_or_default(),
                )],
                failure: vec![],
            })
            .await?;
        if response.succeeded {
            tracing::info!(revision = response.revision, "registered");
            return Ok(response.revision);
        }
        // Someone registered it meanwhile (a previous attempt of ours that timed out): look
        // again.
    }
}

/// Why the registration this process made (create revision `known`) is gone or replaced, as
/// etcd says at `at` (the revision the change was seen at; the latest if `None` or compacted):
/// a removal records itself (`removals/<node>` naming that registration, put before the
/// registration is deleted and kept while the node still holds anything), so without one
/// etcd forgot it ([`LinkError::Forgotten`]).
pub(super) async fn gone_why<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
    known: Revision,
    at: Option<Revision>,
) -> Result<LinkError, KvError> {
    let key = keys.removal(node);
    let page = match kv.range(key.as_bytes(), None, 2, at).await {
        Err(KvError::Compacted { .. }) if at.is_some() => {
            kv.range(key.as_bytes(), None, 2, None).await?
        }
        page => page?,
    };
    let removed = page
        .kvs
        .iter()
        .find(|e| e.key == key.as_bytes())
        .is_some_and(|e| {
            // One that cannot be read is taken at its word: the node drains.
            decode_value::<corral_cluster::RemovalRecord>(&e.value)
                .map_or(true, |r| r.node_revision == known)
        });
    Ok(if removed {
        LinkError::Removed(node.to_string())
    } else {
        LinkError::Forgotten(node.to_string())
    })
}

pub(super) async fn follow<K: Kv>(
    cx: &Cx<'_, K>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    registration: Revision,
    mut renewal: Renewal,
    across: &mut AcrossRounds,
) -> Result<(), LinkError> {
    let (kv, keys, node, options, committer, state) = cx.parts();
    let owned_prefix = keys.owned_prefix(node);
    let release_prefix = keys.release_of_node_prefix(node);
    let id_key = keys.node_id_of_node(node);
    let config_key = keys.config();
    let node_key = keys.node(node);
    let mut held = Held {
        node_id: across.node_id,
        node_id_revision: across.node_id_revision,
        plan: across.plan.clone(),
        config: across.config.clone(),
        ..Held::default()
    };
    let (owned, revision) = corral_kv::read_all(kv, owned_prefix.as_bytes(), 1000).await?;
    if let Some(guard) = &across.epoch {
        // Only advances: the link's reads and the publisher's answers interleave.
        guard.observe_revision(0, revision);
    }
    for entry in &owned {
        held.apply(keys, node, &entry.key_str(), Some(entry));
    }
    // The registration, the node ID and the configuration at the same revision as the
    // grants, so the watches below miss nothing: a removal that landed since `register`
    // read the registration is seen here.
    let reassert_key = keys.reassert();
    for key in [&node_key, &id_key, &config_key, &reassert_key] {
        if key == &reassert_key {
            // A leader that saw etcd go back in time put it: a grant made before it may be
            // one etcd handed back after its space went to another node, which an agent
            // that was away (its own memory of etcd's time older than the grant) cannot
            // tell from a grant made while it was away. Such grants are refused unless the
            // host holds their space; the leader revokes them and grants anew.
            let page = kv.range(key.as_bytes(), None, 1, Some(revision)).await?;
            if let Some(entry) = page.kvs.iter().find(|e| e.key == key.as_bytes()) {
                across.seen_before = across.seen_before.max(entry.mod_revision);
            }
            continue;
        }
        if key == &config_key {
            // `config` and `config-applied` (one prefix; `config-applied` applied first, so
            // the stored `config` is followed only while there is none).
            let page = kv.range(key.as_bytes(), None, 2, Some(revision)).await?;
            for entry in page.kvs.iter().rev() {
                held.apply(keys, node, &entry.key_str(), Some(entry));
            }
            continue;
        }
        let page = kv.range(key.as_bytes(), None, 1, Some(revision)).await?;
        let entry = page.kvs.into_iter().find(|e| e.key == key.as_bytes());
        if key == &node_key {
            if entry.is_none_or(|e| e.create_revision != registration) {
                return Err(gone_why(kv, keys, node, registration, Some(revision)).await?);
            }
            continue;
        }
        match entry {
            Some(entry) => held.apply(keys, node, key, Some(&entry)),
            None if key == &id_key => held.node_id = None,
            None => {}
        }
    }
    let (releases, release_revision) =
        corral_kv::read_all(kv, release_prefix.as_bytes(), 1000).await?;
    for entry in &releases {
        held.apply(keys, node, &entry.key_str(), Some(entry));
    }
    // The node's cloud interface records, read at one revision and watched from the next
    // (a compaction breaks the watch, and the next round reads them all again).
    let cloud_prefix = keys.cloud_interfaces_of_node_prefix(node);
    let (clouds, cloud_revision) = corral_kv::read_all(kv, cloud_prefix.as_bytes(), 1000).await?;
    for entry in &clouds {
        held.apply(keys, node, &entry.key_str(), Some(entry));
    }
    // The operators campaigning (`election/`), to say when none leads (an ADD's error).
    let election_prefix = keys.election_prefix();
    let (campaigning, election_revision) =
        corral_kv::read_all(kv, election_prefix.as_bytes(), 100).await?;
    let mut election = Election::default();
    for entry in &campaigning {
        election.apply(&entry.key_str(), Some(entry));
    }
    election.show(keys, state);
    // What the node state holds before this round hands it anything.
    let local = held_locally(committer).await?;
    screen(&mut held, across, &local);
    apply(committer, state, &held).await?;
    let mut frozen = apply_cloud(cx, &held, restored_up_to(across)).await?;
    across.node_id = held.node_id;
    across.node_id_revision = held.node_id_revision;
    across.plan = held.plan.clone();
    across.config = held.config.clone();
    across.served = true;
    update(state, |s| {
        s.registered = true;
        s.instance_id = options.instance_id.clone();
        s.degraded_since_ms = None;
        s.last_error = None;
    });
    // The local store is reconciled with the grants: the handshakes, then the first demand.
    handshake(cx, &mut held).await?;
    let mut demand = DemandWriter::new(options);
    let mut grants = kv.watch(owned_prefix.as_bytes(), revision + 1).await?;
    let mut ids = kv.watch(id_key.as_bytes(), revision + 1).await?;
    let mut config = kv.watch(config_key.as_bytes(), revision + 1).await?;
    let mut registrations = kv.watch(node_key.as_bytes(), revision + 1).await?;
    let mut release_watch = kv
        .watch(release_prefix.as_bytes(), release_revision + 1)
        .await?;
    let mut cloud_watch = kv
        .watch(cloud_prefix.as_bytes(), cloud_revision + 1)
        .await?;
    let mut election_watch = kv
        .watch(election_prefix.as_bytes(), election_revision + 1)
        .await?;
    // While an address is frozen, the records are applied again every few seconds: it leaves
    // once its pods and its cooldown are gone.
    let mut cloud_tick = tokio::time::interval(CLOUD_FROZEN_RECHECK);
    cloud_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let keep_alive_every = (options.lease_ttl / 3).max(Duration::from_millis(200));
    let mut keep_alive = tokio::time::interval(keep_alive_every);
    keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut keep_alive_retry = Retrying::default();
    let signals = Arc::clone(&state.blocks);
    loop {
        let due = demand.due();
        let events = tokio::select! {
            batch = grants.next() => batch?,
            batch = ids.next() => batch?,
            batch = config.next() => batch?,
            batch = release_watch.next() => batch?,
            batch = cloud_watch.next() => batch?,
            _ = cloud_tick.tick(), if frozen => {
                frozen = apply_cloud(cx, &held, restored_up_to(across)).await?;
                demand.touched(Instant::now());
                continue;
            }
            batch = registrations.next() => {
                let batch = batch?;
                for event in &batch {
                    let gone = match event {
                        Event::Delete { key, mod_revision } => {
                            (key == node_key.as_bytes()).then_some(*mod_revision)
                        }
                        Event::Put(entry) => (entry.key == node_key.as_bytes()
                            && entry.create_revision != registration)
                            .then_some(entry.mod_revision),
                    };
                    if let Some(at) = gone {
                        // Not registered any more is said with why (the round's error
                        // handler), never before: a status read between the two showed an
                        // unregistered node without a reason.
                        return Err(gone_why(kv, keys, node, registration, Some(at)).await?);
                    }
                }
                continue;
            }
            batch = election_watch.next() => {
                for event in &batch? {
                    let key = String::from_utf8_lossy(event.key()).into_owned();
                    match event {
                        Event::Put(entry) => election.apply(&key, Some(entry)),
                        Event::Delete { .. } => election.apply(&key, None),
                    }
                }
                election.show(keys, state);
                continue;
            }
            _ = keep_alive.tick() => {
                match renewal.renew(kv).await? {
                    Renewed::Yes => keep_alive_retry.succeeded(state),
                    Renewed::Late(error) => {
                        // The round goes on: the lease still runs, and etcd may be only slow.
                        tracing::warn!(%error, "keeping the liveness lease alive failed; trying again");
                        keep_alive_retry.failed(state, format!(
                            "keeping the liveness lease alive failed ({error}); trying again until its TTL runs out"
                        ));
                        keep_alive.reset_after(renewal.retry_in());
                    }
                }
                continue;
            }
            () = signals.touched() => {
                demand.touched(Instant::now());
                continue;
            }
            () = sleep_until_due(due) => {
                demand.publish(kv, keys, node, committer, state, &held).await?;
                continue;
            }
            _ = stop.changed() => return Err(LinkError::Stopped),
        };
        for event in &events {
            let key = String::from_utf8_lossy(event.key()).into_owned();
            match event {
                Event::Put(entry) => held.apply(keys, node, &key, Some(entry)),
                Event::Delete { .. } => held.apply(keys, node, &key, None),
            }
        }
        screen(&mut held, across, &local);
        apply(committer, state, &held).await?;
        frozen = apply_cloud(cx, &held, restored_up_to(across)).await?;
        handshake(cx, &mut held).await?;
        across.node_id = held.node_id;
        across.node_id_revision = held.node_id_revision;
        across.plan = held.plan.clone();
        across.config = held.config.clone();
        demand.touched(Instant::now());
    }
}

/// The keys under `election/` as the link follows them: key → (lease, create revision, value).
/// Who leads is `corral_cluster::election_leader`'s rule, as for the operators and the CLI.
#[derive(Debug, Default)]
struct Election(BTreeMap<String, (Option<i64>, i64, Vec<u8>)>);

impl Election {
    fn apply(&mut self, key: &str, entry: Option<&corral_kv::KeyValue>) {
        match entry {
            Some(e) => {
                let seen = (e.lease.map(|l| l.0), e.create_revision, e.value.clone());
                self.0.insert(key.to_owned(), seen);
            }
            None => {
                self.0.remove(key);
            }
        }
    }

    /// Shows who leads in the link's state.
    fn show(&self, keys: &Keys, state: &SharedClusterState) {
        let leader = corral_cluster::election_leader(
            keys,
            self.0
                .iter()
                .map(|(key, (lease, created, value))| (key, *lease, *created, value.as_slice())),
        );
        update(state, |s| {
            s.election_read = true;
            s.leader = leader;
        });
    }
}

/// The highest revision a restore of etcd may have brought back, as far as this process knows:
/// where it saw etcd go back in time (0: never). Not the leader's `reassert` key, which stays
/// for good: an agent whose state directory was wiped since would serve nothing of its records.
fn restored_up_to(across: &AcrossRounds) -> Revision {
    across
        .epoch
        .as_ref()
        .map_or(0, |guard| guard.restored_up_to())
}

/// Hands the held grants to the node state (durable before it answers) and publishes them. A
/// failure ends the round: the next one reads the grants again and retries.
pub(super) async fn apply(
    committer: &Committer,
    state: &SharedClusterState,
    held: &Held,
) -> Result<(), LinkError> {
    state.blocks.set_config(held.config.clone());
    let ranges = held.ranges();
    let block_families = held.block_families();
    let mut shown: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (pool, range) in &ranges {
        shown
            .entry(pool.to_string())
            .or_default()
            .push(range.to_string());
    }
    let grants = ClusterRanges {
        ranges,
        block_families,
    };
    match committer.call(grants).await {
        Ok(_) => {
            let mut before = BTreeMap::new();
            update(state, |s| {
                before = std::mem::replace(&mut s.grants, shown.clone());
                s.node_id = held.node_id.filter(|_| held.refused_node_id.is_none());
                s.refused = held.refused.values().cloned().collect();
                s.refused_node_id = held.refused_node_id;
                s.waiting = held.waiting.clone();
            });
            state.blocks.ranges_changed();
            log_range_changes(&before, &shown);
            Ok(())
        }
        Err(error) => Err(LinkError::Record(format!("{error:?}"))),
    }
}

/// Logs the cluster ranges the node's pools took up (`granted`) and gave up (`released`).
fn log_range_changes(
    before: &BTreeMap<String, Vec<String>>,
    after: &BTreeMap<String, Vec<String>>,
) {
    let holds = |map: &BTreeMap<String, Vec<String>>, pool: &str, cidr: &str| {
        map.get(pool)
            .is_some_and(|ranges| ranges.iter().any(|r| r == cidr))
    };
    for (pool, ranges) in after {
        for range in ranges.iter().filter(|range| !holds(before, pool, range)) {
            tracing::info!(pool, range, "granted");
        }
    }
    for (pool, ranges) in before {
        for range in ranges.iter().filter(|range| !holds(after, pool, range)) {
            tracing::info!(pool, range, "released");
        }
    }
}
