//! The release handshake from the node's side: a block or cloud address the leader asks
//! back is surrendered only if it holds nothing (durably, before `ready` is written), refused
//! otherwise; a handshake withdrawn gives the space back to the node.

use corral_cluster::{IpNet, ReleaseRecord, ReleaseState, decode_value, encode_value};
use corral_core::PoolName;

use corral_kv::{Compare, Kv, Txn, TxnOp};

use super::held::{Held, Release};
use super::state::{Cx, LinkError, now_ms};
use crate::committer::Committer;
use crate::node::{ReclaimBlock, ReportBlocks, Surrender, SurrenderBlock, SurrenderCloudAddress};

/// The release handshakes of the node (ARCHITECTURE.md, "Block mode"): answers each
/// `marked` key, and reconciles the surrendered blocks with the keys and grants. Runs only
/// while etcd answers (a degraded link answers nothing).
pub(super) async fn handshake<K: Kv>(cx: &Cx<'_, K>, held: &mut Held) -> Result<(), LinkError> {
    let (kv, keys, node, _, committer, state) = cx.parts();
    // A few passes: a lost compare-and-swap reads the key again and answers what it says now.
    for _ in 0..4 {
        let marked: Vec<(String, Release)> = held
            .releases
            .iter()
            .filter(|(_, r)| {
                r.record
                    .as_ref()
                    .is_none_or(|r| r.state == ReleaseState::Marked)
            })
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        if marked.is_empty() {
            break;
        }
        let mut lost = false;
        let mut surrendered = false;
        for (key, release) in marked {
            let answer = answer_for(committer, held, &release).await?;
            let Some(record) = release.record.clone() else {
                // Unreadable: nothing to answer in (the leader wrote it; it will fix it).
                continue;
            };
            let (state_now, reason) = match &answer {
                Ok(()) => (ReleaseState::Ready, None),
                Err(reason) => (ReleaseState::Refused, Some(reason.clone())),
            };
            let value = ReleaseRecord {
                state: state_now,
                answered_ms: now_ms(),
                reason,
                ..record
            };
            let response = kv
                .txn(Txn {
                    compares: vec![Compare::modified_at(key.as_str(), release.mod_revision)],
                    success: vec![TxnOp::put(
                        key.as_str(),
                        encode_value(&value).unwrap_or_default(),
                    )],
                    failure: vec![TxnOp::get(key.as_str())],
                })
                .await?;
            if response.succeeded {
                surrendered |= state_now == ReleaseState::Ready;
                state
                    .metrics
                    .handshakes
                    .get_or_create(&crate::metrics::Outcome {
                        outcome: state_now.name().to_owned(),
                    })
                    .inc();
                if let Some(entry) = held.releases.get_mut(&key) {
                    entry.record = Some(value);
                    entry.mod_revision = response.revision;
                }
            } else {
                lost = true;
                let current = response.gets.into_iter().next().flatten();
                held.apply(keys, node, &key, current.as_ref());
            }
        }
        if surrendered {
            // What the node holds changed: its holdings record says so now, not at the next
            // look (a check would find the space asserted here and granted elsewhere).
            state.blocks.ranges_changed();
        }
        if !lost {
            break;
        }
    }
    reconcile_surrendered(cx, held).await
}

/// The answer to a `marked` key: `Ok` once the block is surrendered (now or before), else
/// why not (nothing changed locally).
pub(super) async fn answer_for(
    committer: &Committer,
    held: &Held,
    release: &Release,
) -> Result<Result<(), String>, LinkError> {
    let Some(record) = &release.record else {
        return Ok(Err("the release record cannot be read".into()));
    };
    if held.is_cloud_pool(&release.pool) {
        return answer_cloud(committer, held, release, record).await;
    }
    let grant = held
        .grants
        .values()
        .find(|g| g.pool == release.pool && g.family == release.family && g.cidr == release.cidr);
    let Some(grant) = grant else {
        return Ok(Err(format!(
            "the node holds no grant of {} in pool {}",
            release.cidr, release.pool
        )));
    };
    if grant.revision != record.grant_revision {
        return Ok(Err(format!(
            "the node holds {} under grant revision {}, not {}",
            release.cidr, grant.revision, record.grant_revision
        )));
    }
    if !held.is_block_pool(&release.pool) {
        return Ok(Err(format!("pool {} is not a block pool", release.pool)));
    }
    let range = match held.range_of(grant) {
        Ok(range) => range,
        Err(error) => return Ok(Err(error.to_string())),
    };
    let surrender = SurrenderBlock {
        pool: release.pool.clone(),
        range,
    };
    match committer.call(surrender).await {
        Ok(Surrender::Surrendered | Surrender::AlreadySurrendered) => Ok(Ok(())),
        Ok(Surrender::Refused(reason)) => Ok(Err(reason)),
        // Not recorded locally: no answer now (the next round asks again).
        Err(error) => Err(LinkError::Record(format!("{error:?}"))),
    }
}

/// The answer to a `marked` key of a cloud address or prefix: it must be on the node's record
/// whose create revision the key names; then surrendered (now or before) if nothing is
/// allocated in it and nothing cooling, else why not (nothing changed locally).
pub(super) async fn answer_cloud(
    committer: &Committer,
    held: &Held,
    release: &Release,
    record: &ReleaseRecord,
) -> Result<Result<(), String>, LinkError> {
    let listing = held.cloud.iter().find(|(_, entry)| {
        entry
            .record
            .as_ref()
            .is_ok_and(|r| r.pool == release.pool && r.addresses.contains(&release.cidr))
    });
    match listing {
        None => {
            return Ok(Err(format!(
                "no cloud interface record of the node lists {} in pool {}",
                release.cidr, release.pool
            )));
        }
        Some((interface, entry)) if entry.create_revision != record.grant_revision => {
            return Ok(Err(format!(
                "the node holds {} on interface {interface} under record revision {}, not {}",
                release.cidr, entry.create_revision, record.grant_revision
            )));
        }
        Some(_) => {}
    }
    let surrender = SurrenderCloudAddress {
        pool: release.pool.clone(),
        address: release.cidr,
    };
    match committer.call(surrender).await {
        Ok(Surrender::Surrendered | Surrender::AlreadySurrendered) => Ok(Ok(())),
        Ok(Surrender::Refused(reason)) => Ok(Err(reason)),
        Err(error) => Err(LinkError::Record(format!("{error:?}"))),
    }
}

/// Surrendered blocks whose handshake was withdrawn (the release key gone or not `marked`
/// or `ready`) while the grant lasts are taken back; the grant and the key are read at one
/// revision first, since the leader deletes both in one txn when it releases the block.
pub(super) async fn reconcile_surrendered<K: Kv>(
    cx: &Cx<'_, K>,
    held: &Held,
) -> Result<(), LinkError> {
    let (kv, keys, node, _, committer, state) = cx.parts();
    let report = committer
        .call(ReportBlocks {})
        .await
        .map_err(|error| LinkError::Record(format!("reading the blocks: {error:?}")))?;
    state
        .metrics
        .surrendered
        .set(i64::try_from(report.surrendered.len()).unwrap_or(i64::MAX));
    let mut reclaimed = false;
    for (pool, range) in &report.surrendered {
        let Some((owned_key, grant)) = held.grant_of(pool, range) else {
            // The grant is gone: the next set of grants forgets it.
            continue;
        };
        let release_key = keys.release(node, pool, grant.family, &grant.cidr);
        let open = |r: Option<&ReleaseRecord>| {
            r.is_some_and(|r| matches!(r.state, ReleaseState::Marked | ReleaseState::Ready))
        };
        if open(
            held.releases
                .get(&release_key)
                .and_then(|r| r.record.as_ref()),
        ) {
            continue;
        }
        let response = kv
            .txn(Txn::reads([owned_key.as_str(), release_key.as_str()]))
            .await?;
        let owned_now = response.gets.first().cloned().flatten();
        let release_now = response.gets.get(1).cloned().flatten();
        let release_open = release_now
            .as_ref()
            .is_some_and(|e| open(decode_value::<ReleaseRecord>(&e.value).ok().as_ref()));
        if owned_now.is_none_or(|e| e.create_revision != grant.revision) || release_open {
            continue;
        }
        let reclaim = ReclaimBlock {
            pool: pool.clone(),
            range: *range,
        };
        match committer.call(reclaim).await {
            Ok(_) => {
                tracing::info!(
                    cidr = %range,
                    %pool,
                    "block taken back (its release was withdrawn)"
                );
                reclaimed = true;
            }
            Err(error) => return Err(LinkError::Record(format!("{error:?}"))),
        }
    }
    if reclaimed {
        state.blocks.ranges_changed();
    }
    Ok(())
}

/// The cluster ranges the node state holds (granted or draining), as (pool, CIDR).
pub(super) async fn held_locally(
    committer: &Committer,
) -> Result<std::collections::BTreeSet<(PoolName, IpNet)>, LinkError> {
    match committer.call(ReportBlocks {}).await {
        Ok(report) => Ok(report
            .ranges
            .iter()
            .map(|r| (r.pool.clone(), r.spec.subnet_net()))
            .collect()),
        Err(error) => Err(LinkError::Record(format!(
            "reading the node's ranges: {error:?}"
        ))),
    }
}
