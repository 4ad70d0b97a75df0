//! Publishing the node's demand (`demand/<node>`): what its block and cloud pools use and
//! want, written when it changes enough, at most once a second unless urgent.

use std::collections::BTreeMap;
use std::time::Duration;

use corral_cluster::{DemandRecord, Keys, NodeName, encode_value};
use corral_core::PoolName;

use corral_kv::{Kv, Txn, TxnOp};
use tokio::time::Instant;

use super::held::Held;
use super::state::{ClusterOptions, LinkError, SharedClusterState, now_ms};
use crate::committer::Committer;
use crate::link::blocks::{demand_records, is_urgent, same_demand};
use crate::link::cloud_pool::{self};
use crate::node::{ReportBlocks, ReportCloud};

pub(super) async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// When and what the demand of the node's block pools is written (`demand/<node>/<pool>`):
/// at most once per [`ClusterOptions::DEMAND_MIN_INTERVAL`], only what changed (`at_ms`
/// aside), as soon as allowed when urgent ([`is_urgent`]), else within `demand_refresh`.
pub(super) struct DemandWriter {
    pub(super) refresh: Duration,
    /// What this round wrote (each round writes its first demand once reconciled).
    pub(super) written: BTreeMap<PoolName, DemandRecord>,
    pub(super) last_write: Option<Instant>,
    pub(super) last_look: Option<Instant>,
    /// When to look next; `None`: when something changes.
    pub(super) due: Option<Instant>,
}

impl DemandWriter {
    pub(super) fn new(options: &ClusterOptions) -> DemandWriter {
        DemandWriter {
            refresh: options.demand_refresh,
            written: BTreeMap::new(),
            last_write: None,
            last_look: None,
            // The first look at once: the local store is reconciled.
            due: Some(Instant::now()),
        }
    }

    /// Something changed: look again as soon as allowed.
    pub(super) fn touched(&mut self, now: Instant) {
        let allowed = self
            .last_look
            .map_or(now, |t| t + ClusterOptions::DEMAND_MIN_INTERVAL)
            .max(now);
        self.due = Some(self.due.map_or(allowed, |due| due.min(allowed)));
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn publish<K: Kv>(
        &mut self,
        kv: &K,
        keys: &Keys,
        node: &NodeName,
        committer: &Committer,
        state: &SharedClusterState,
        held: &Held,
    ) -> Result<(), LinkError> {
        let now = Instant::now();
        self.due = None;
        self.last_look = Some(now);
        let Some(config) = held.config.as_ref() else {
            return Ok(());
        };
        let blocks = config.pools.iter().any(|p| p.is_blocks());
        let clouds = config.pools.iter().any(|p| p.is_cloud());
        if !blocks && !clouds {
            return Ok(());
        }
        let mut block_report = None;
        if blocks {
            let report = match committer.call(ReportBlocks {}).await {
                Ok(report) => report,
                Err(error) => {
                    tracing::warn!(?error, "reading the pools for the demand");
                    self.due = Some(now + ClusterOptions::DEMAND_MIN_INTERVAL);
                    return Ok(());
                }
            };
            state
                .metrics
                .surrendered
                .set(i64::try_from(report.surrendered.len()).unwrap_or(i64::MAX));
            block_report = Some(report);
        }
        let mut cloud_report = None;
        if clouds {
            let report = match committer.call(ReportCloud {}).await {
                Ok(report) => report,
                Err(error) => {
                    tracing::warn!(?error, "reading the cloud pools for the demand");
                    self.due = Some(now + ClusterOptions::DEMAND_MIN_INTERVAL);
                    return Ok(());
                }
            };
            cloud_report = Some(report);
        }
        // As ever: the urgency taken, then the waiting ADDs read, after the pools were.
        let urgent_add = state.blocks.take_urgent();
        let pending = state.blocks.pending();
        let mut records = block_report
            .map(|report| demand_records(config, &report, &pending))
            .unwrap_or_default();
        if let Some(report) = cloud_report {
            records.extend(cloud_pool::demand_records(config, &report, &pending));
        }
        let mut changed = Vec::new();
        let mut urgent = urgent_add;
        for (pool, record) in &records {
            let written = self.written.get(pool);
            if written.is_some_and(|w| same_demand(w, record)) {
                continue;
            }
            urgent |= is_urgent(config, node.as_str(), pool, record, written);
            changed.push(pool.clone());
        }
        if changed.is_empty() {
            return Ok(());
        }
        let refresh_at = self.last_write.map_or(now, |t| t + self.refresh);
        if !urgent && now < refresh_at {
            // Not urgent: it goes with the periodic refresh (or sooner, if something urgent
            // comes up meanwhile).
            self.due = Some(refresh_at);
            return Ok(());
        }
        let at_ms = now_ms();
        let mut puts = Vec::new();
        for pool in &changed {
            let record = DemandRecord {
                at_ms,
                ..records[pool].clone()
            };
            puts.push(TxnOp::put(
                keys.demand(node, pool),
                encode_value(&record).unwrap_or_default(),
            ));
        }
        for chunk in puts.chunks(corral_kv::MAX_TXN_OPS) {
            kv.txn(Txn {
                compares: vec![],
                success: chunk.to_vec(),
                failure: vec![],
            })
            .await?;
        }
        state.metrics.demand_writes.inc();
        self.last_write = Some(now);
        for pool in changed {
            let record = records[&pool].clone();
            self.written.insert(pool, record);
        }
        Ok(())
    }
}
