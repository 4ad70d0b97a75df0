//! Publishing the node's demand (`demand/<node>`): what its block and cloud pools use and
//! want, written when it changes enough, at most once a second, and at most the node's share
//! of the cluster's demand write budget (`demand_writes_per_sec` over the node count the
//! leader publishes in `meta/census`, read back by each write in its own transaction):
//! [`DemandPace`], urgent changes first.

use std::collections::BTreeMap;
use std::time::Duration;

use corral_cluster::{
    CensusRecord, ClusterConfig, DemandRecord, Keys, NodeName, decode_value, demand_interval,
    encode_value,
};
use corral_core::PoolName;

use corral_kv::{Kv, KvError, Txn, TxnOp};
use tokio::time::Instant;

use super::held::Held;
use super::pace::DemandPace;
use super::state::{ClusterOptions, LinkError, Retrying, SharedClusterState, now_ms};
use crate::committer::Committer;
use crate::link::blocks::{demand_records, is_urgent, same_demand};
use crate::link::cloud_pool::{self};
use crate::node::{ReportBlocks, ReportCloud, Request};

pub(super) async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// When and what the demand of the node's block pools is written (`demand/<node>/<pool>`):
/// at most once per [`ClusterOptions::DEMAND_MIN_INTERVAL`] and within the node's share of
/// the budget ([`DemandPace`]), only what changed (`at_ms` aside), as soon as allowed when
/// urgent ([`is_urgent`]), else within `demand_refresh` once the pace allows.
#[derive(Debug)]
pub struct DemandWriter {
    refresh: Duration,
    /// What this round wrote (each round writes its first demand once reconciled).
    written: BTreeMap<PoolName, DemandRecord>,
    last_write: Option<Instant>,
    last_look: Option<Instant>,
    /// When to look next; `None`: when something changes.
    due: Option<Instant>,
    /// The node's share of the budget.
    pace: DemandPace,
    /// The node count in `meta/census` as the last write read it (`None`: not read yet, or
    /// no leader published it: the pace is the 1 s floor, as without a budget).
    census: Option<u64>,
    /// An urgent change waits for the pace: it stays urgent until written.
    urgent_owed: bool,
    /// Why the last look's write failed while etcd did not answer (it is tried again).
    failed: Option<KvError>,
    /// What the status says of those failures.
    retrying: Retrying,
}

impl DemandWriter {
    pub(super) fn new(options: &ClusterOptions) -> DemandWriter {
        DemandWriter::with_refresh(options.demand_refresh, Instant::now())
    }

    /// A writer whose changes that are not urgent wait up to `refresh`, looking first at
    /// `now` (the local store is reconciled), with a full bucket.
    pub fn with_refresh(refresh: Duration, now: Instant) -> DemandWriter {
        DemandWriter {
            refresh,
            written: BTreeMap::new(),
            last_write: None,
            last_look: None,
            due: Some(now),
            pace: DemandPace::new(now, ClusterOptions::DEMAND_MIN_INTERVAL),
            census: None,
            urgent_owed: false,
            failed: None,
            retrying: Retrying::default(),
        }
    }

    /// When to look next ([`DemandWriter::offer`]); `None`: when something changes.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The node's share of the budget: one write per this time.
    pub fn interval(&self) -> Duration {
        self.pace.interval()
    }

    /// Something changed: look again as soon as allowed.
    pub fn touched(&mut self, now: Instant) {
        let allowed = self
            .last_look
            .map_or(now, |t| t + ClusterOptions::DEMAND_MIN_INTERVAL)
            .max(now);
        self.due = Some(self.due.map_or(allowed, |due| due.min(allowed)));
    }

    /// Reads `pools` (what `request` reports) for the demand when `wanted` (else `None`); a
    /// failure is logged and puts the next look off by the minimum interval.
    async fn read<R: Request>(
        &mut self,
        wanted: bool,
        committer: &Committer,
        request: R,
        pools: &str,
        now: Instant,
    ) -> Result<Option<R::Answer>, ()> {
        if !wanted {
            return Ok(None);
        }
        match committer.call(request).await {
            Ok(answer) => Ok(Some(answer)),
            Err(error) => {
                tracing::warn!(?error, "reading {pools} for the demand");
                self.due = Some(now + ClusterOptions::DEMAND_MIN_INTERVAL);
                Err(())
            }
        }
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
        let Ok(block_report) = self
            .read(blocks, committer, ReportBlocks {}, "the pools", now)
            .await
        else {
            return Ok(());
        };
        if let Some(report) = &block_report {
            state
                .metrics
                .surrendered
                .set(i64::try_from(report.surrendered.len()).unwrap_or(i64::MAX));
        }
        let Ok(cloud_report) = self
            .read(clouds, committer, ReportCloud {}, "the cloud pools", now)
            .await
        else {
            return Ok(());
        };
        // As ever: the urgency taken, then the waiting ADDs read, after the pools were.
        let urgent_add = state.blocks.take_urgent();
        let pending = state.blocks.pending();
        let mut records = block_report
            .map(|report| demand_records(config, &report, &pending))
            .unwrap_or_default();
        if let Some(report) = cloud_report {
            records.extend(cloud_pool::demand_records(config, &report, &pending));
        }
        if self
            .offer(kv, keys, node, config, &records, urgent_add, now)
            .await?
        {
            state.metrics.demand_writes.inc();
            self.retrying.succeeded(state);
        } else if let Some(error) = self.failed.take() {
            self.retrying.failed(
                state,
                format!("writing the node's demand failed ({error}); trying again"),
            );
        }
        Ok(())
    }

    /// A look at the node's demand `records` at `now` (`urgent_add`: an ADD started waiting
    /// since the last look): writes what changed if its time has come, else says when to look
    /// again ([`DemandWriter::due`]). True if it wrote. What the link does once it has read the
    /// node's pools; the demand bench drives it alone.
    #[allow(clippy::too_many_arguments)]
    pub async fn offer<K: Kv>(
        &mut self,
        kv: &K,
        keys: &Keys,
        node: &NodeName,
        config: &ClusterConfig,
        records: &BTreeMap<PoolName, DemandRecord>,
        urgent_add: bool,
        now: Instant,
    ) -> Result<bool, KvError> {
        self.due = None;
        self.last_look = Some(now);
        let mut changed = Vec::new();
        let mut urgent = urgent_add || self.urgent_owed;
        for (pool, record) in records {
            let written = self.written.get(pool);
            if written.is_some_and(|w| same_demand(w, record)) {
                continue;
            }
            urgent |= is_urgent(config, node.as_str(), pool, record, written);
            changed.push(pool.clone());
        }
        if changed.is_empty() {
            self.urgent_owed = false;
            return Ok(false);
        }
        // The share of the budget: the node count the last write read, else the floor.
        let interval = demand_interval(self.census.unwrap_or(1), config.demand_writes_per_sec);
        self.pace.set_interval(now, interval);
        let at = if urgent {
            self.pace.allowed_at(now, true)
        } else {
            // Not urgent: it goes with the periodic refresh, once the bucket is full (or
            // sooner, if something urgent comes up meanwhile).
            let refresh_at = self.last_write.map_or(now, |t| t + self.refresh);
            self.pace.allowed_at(now, false).max(refresh_at)
        };
        if now < at {
            self.urgent_owed = urgent;
            self.due = Some(at);
            return Ok(false);
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
        let census_key = keys.census();
        let mut census = None;
        // The node count for the next write's pace, read in the first transaction.
        for (i, chunk) in puts.chunks(corral_kv::MAX_TXN_OPS - 1).enumerate() {
            let mut success = chunk.to_vec();
            if i == 0 {
                success.push(TxnOp::Get {
                    key: census_key.clone().into_bytes(),
                });
            }
            let response = match kv
                .txn(Txn {
                    compares: vec![],
                    success,
                    failure: vec![],
                })
                .await
            {
                Ok(response) => response,
                Err(error) if error.is_retryable() => {
                    // etcd slow or briefly without a leader: the demand is written again
                    // at the next interval (what was written is not recorded, so it counts
                    // as changed), and the link's round goes on. Ending the round here made
                    // every agent of a starved etcd register and watch again.
                    tracing::warn!(%error, "writing the node's demand failed; trying again");
                    self.failed = Some(error);
                    self.urgent_owed = urgent;
                    self.due = Some(now + ClusterOptions::DEMAND_MIN_INTERVAL);
                    return Ok(false);
                }
                Err(error) => return Err(error),
            };
            if i == 0 {
                census = response.gets.into_iter().next().flatten();
            }
        }
        self.pace.wrote(now);
        self.urgent_owed = false;
        self.census = census.and_then(|entry| match decode_value::<CensusRecord>(&entry.value) {
            Ok(record) => Some(record.nodes),
            Err(error) => {
                tracing::warn!(%error, key = %census_key, "the node count does not read");
                None
            }
        });
        self.last_write = Some(now);
        for pool in changed {
            let record = records[&pool].clone();
            self.written.insert(pool, record);
        }
        Ok(true)
    }
}
