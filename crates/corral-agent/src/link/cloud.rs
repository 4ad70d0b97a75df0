//! Cloud interface records (`interfaces/<node>/…`) handed to the node state as its cloud
//! pools' interfaces, with addresses gone from a record while in use frozen, not dropped.

use std::time::Duration;

use corral_cluster::{Family, ReleaseRecord, ReleaseState, decode_value};

use corral_kv::{Kv, Txn};

use super::held::Held;
use super::state::{Cx, LinkError, update};
use crate::link::cloud_pool::{self};
use crate::node::ReportCloud;

/// How often the cloud records are applied again while an address is frozen.
pub(super) const CLOUD_FROZEN_RECHECK: Duration = Duration::from_secs(5);

/// Makes the cloud pools' interfaces match the node's `interfaces/` records (`node/cloud.rs`),
/// after judging each surrendered address: kept out while its handshake is open (`marked` or
/// `ready`); taken back (served again) when the handshake is gone while a record still lists
/// it, judged on the record and the release key read at one revision (the leader takes an
/// address off its record no later than it deletes the release key, and the two watches may
/// deliver those apart); forgotten when no record lists it. Answers whether an address is
/// frozen (gone from its record while in use). A failure to record ends the round.
///
/// Once this agent saw etcd go back in time (`restored_up_to`: see
/// [`cloud_pool::screen_restored`]), a record written before the restore serves only what the
/// node state holds (or surrendered and may take back): an address the node gave up and forgot
/// after the snapshot may be another node's by now, so it waits for a newer record.
pub(super) async fn apply_cloud<K: Kv>(
    cx: &Cx<'_, K>,
    held: &Held,
    restored_up_to: corral_kv::Revision,
) -> Result<bool, LinkError> {
    let (kv, keys, node, options, committer, state) = cx.parts();
    let Some(config) = held.config.as_ref() else {
        return Ok(false);
    };
    if !config.pools.iter().any(|p| p.is_cloud()) {
        update(state, |s| s.problems.clear());
        return Ok(false);
    }
    let report = committer
        .call(ReportCloud {})
        .await
        .map_err(|error| LinkError::Record(format!("reading the cloud pools: {error:?}")))?;
    // What the node state holds, surrendered addresses included: a surrender whose handshake
    // was withdrawn is taken back as ever (below).
    let holding: std::collections::BTreeSet<_> = report
        .addresses
        .iter()
        .map(|a| (a.pool.clone(), a.address))
        .chain(report.surrendered.iter().cloned())
        .collect();
    let (records, unconfirmed) = cloud_pool::screen_restored(&held.cloud, restored_up_to, &holding);
    let open = |r: Option<&ReleaseRecord>| {
        r.is_some_and(|r| matches!(r.state, ReleaseState::Marked | ReleaseState::Ready))
    };
    let mut keep = std::collections::BTreeSet::new();
    for (pool, address) in &report.surrendered {
        let family = Family::of(address.addr());
        let release_key = keys.release(node, pool, family, address);
        if open(
            held.releases
                .get(&release_key)
                .and_then(|r| r.record.as_ref()),
        ) {
            keep.insert((pool.clone(), *address));
            continue;
        }
        let Some((interface, _)) = cloud_pool::record_listing(&records, pool, address) else {
            // On no record: nothing to take back (the marker goes).
            continue;
        };
        let Ok(id) = corral_cluster::CloudId::new(interface) else {
            keep.insert((pool.clone(), *address));
            continue;
        };
        let record_key = keys.cloud_interface(node, &id);
        let response = kv
            .txn(Txn::reads([record_key.as_str(), release_key.as_str()]))
            .await?;
        let listed_now = response
            .gets
            .first()
            .cloned()
            .flatten()
            .and_then(|e| decode_value::<corral_cluster::CloudInterfaceRecord>(&e.value).ok())
            .is_some_and(|r| {
                &r.pool == pool
                    && r.attachment == corral_cluster::CloudAttachment::Attached
                    && r.addresses.contains(address)
            });
        let release_open = response
            .gets
            .get(1)
            .cloned()
            .flatten()
            .is_some_and(|e| open(decode_value::<ReleaseRecord>(&e.value).ok().as_ref()));
        if listed_now && !release_open {
            tracing::info!(
                %address,
                %pool,
                "address taken back (its release was withdrawn)"
            );
        } else {
            keep.insert((pool.clone(), *address));
        }
    }
    let (wanted, errors) =
        cloud_pool::wanted(config, &records, options.instance_id.as_deref(), keep);
    let outcome = committer
        .call(wanted)
        .await
        .map_err(|error| LinkError::Record(format!("{error:?}")))?;
    let mut problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
    problems.extend(unconfirmed.iter().map(ToString::to_string));
    problems.extend(outcome.problems.iter().cloned());
    // Logged when they first show (they are applied again on every change).
    let before = state
        .lock()
        .map(|s| s.problems.clone())
        .unwrap_or_else(|e| e.into_inner().problems.clone());
    for problem in problems.iter().filter(|p| !before.contains(p)) {
        tracing::warn!("{problem}");
    }
    state
        .metrics
        .cloud_frozen
        .set(i64::try_from(outcome.frozen.len()).unwrap_or(i64::MAX));
    state
        .metrics
        .cloud_bad_records
        .set(i64::try_from(errors.len()).unwrap_or(i64::MAX));
    let surrendered = report
        .surrendered
        .len()
        .saturating_sub(outcome.reclaimed.len());
    state
        .metrics
        .cloud_surrendered
        .set(i64::try_from(surrendered).unwrap_or(i64::MAX));
    update(state, |s| s.problems = problems);
    if outcome.changed() {
        state.blocks.ranges_changed();
    }
    Ok(!outcome.frozen.is_empty())
}
