//! The leader's decision about every node it cannot serve, published: `owned/<node>/waiting`
//! (a `WaitingRecord`), under the prefix the node's agent already watches, so an ADD that
//! waited out its pool wait names the cause (the pool exhausted, only quarantined space and
//! until when, granting paused, the instance at its limit) without asking etcd.
//!
//! What the record says comes from `ClusterView::waiting_changes` (the view's waits, the same
//! the API and the CLI show) with what only the leader knows: granting paused after etcd went
//! back in time, and the cloud node manager's instances at their limit. A record is written
//! only when the decision changes, and deleted once the node is served (or gone), in fenced
//! transactions, at most once a second (every node's waits are worked out per pass).
//!
//! The same pass publishes the node count the agents pace their demand writes by
//! (`meta/census`, `corral_cluster::census`), when block or cloud pools are configured: only
//! when the registered nodes outgrow it or fall below half of it, and once per term.

use std::collections::BTreeMap;
use std::time::Duration;

use corral_cluster::{
    CensusRecord, Family, Keys, NodeName, NodeWait, PoolName, WaitReason, WaitUnit, WaitingEntry,
    WaitingRecord, census_to_publish, encode_value,
};
use corral_kv::{Kv, Txn, TxnOp};
use tokio::time::Instant;

use crate::election::Fence;
use crate::state::Shared;

/// At most one pass over every node's waits in this time.
const SPACING: Duration = Duration::from_secs(1);

/// Records put or deleted per transaction (etcd allows 128 operations; the fence is one).
const CHUNK: usize = 100;

/// The publisher's memory within a term.
#[derive(Debug)]
pub(super) struct Publisher {
    /// The next pass may run from then.
    next: Instant,
    /// A pass is owed (the view changed since the last one).
    owed: bool,
    /// What the last pass wrote (the view may not show it yet): not written again in the
    /// next pass.
    sent: BTreeMap<NodeName, Option<WaitingRecord>>,
    /// The node count this term wrote to `meta/census` (`None`: none yet, so the first pass
    /// of a term writes it).
    census: Option<u64>,
}

impl Publisher {
    pub(super) fn new() -> Publisher {
        Publisher {
            next: Instant::now(),
            owed: true,
            sent: BTreeMap::new(),
            census: None,
        }
    }

    /// When an owed pass may run (the loop wakes then), if one is owed.
    pub(super) fn due(&self) -> Option<Instant> {
        self.owed.then_some(self.next)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The cloud node manager's instances at their limit, as waits of their nodes.
fn cloud_waits(shared: &Shared) -> BTreeMap<NodeName, Vec<WaitingEntry>> {
    let mut out = BTreeMap::new();
    for node in shared.cloud_at_capacity() {
        let Ok(name) = NodeName::new(&node) else {
            continue;
        };
        let entries: Vec<WaitingEntry> = shared
            .cloud_node(&node)
            .into_iter()
            .filter(|f| f.at_capacity)
            .filter_map(|f| at_capacity(&f.pool, f.family))
            .collect();
        if !entries.is_empty() {
            out.insert(name, entries);
        }
    }
    out
}

/// A cloud pool's wait for addresses its node's instance cannot take.
fn at_capacity(pool: &str, family: Family) -> Option<WaitingEntry> {
    let wait = NodeWait {
        pool: Some(PoolName::new(pool).ok()?),
        family,
        unit: WaitUnit::Address,
        reason: WaitReason::AtCapacity,
        max_ids: 0,
    };
    Some(wait.entry(None))
}

/// One pass, if one is owed and its time has come: works out what changed and writes it.
/// A failed write is reported and tried again on the next pass.
pub(super) async fn publish<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    shared: &Shared,
    publisher: &mut Publisher,
) {
    publisher.owed = true;
    let now = Instant::now();
    if now < publisher.next {
        return;
    }
    publisher.owed = false;
    publisher.next = now + SPACING;
    // Paused after etcd went back in time, in words that do not change while it lasts (the
    // live reason counts down; the record is written on change only). A new term's short wait
    // for the agents' assertions is not published.
    let paused = (shared.regression_unsettled() && shared.granting_paused().is_some()).then_some(
        "etcd went back in time: the leader waits for the agents to assert what they hold \
         (`corral cluster recover --yes` ends the wait)",
    );
    let more = cloud_waits(shared);
    let Some((changes, census)) = shared.with_view(|view, _| {
        // Only agents with block or cloud pools write demand.
        let demand = view.config().pools.iter().any(|p| p.demand().is_some());
        let census = demand
            .then(|| census_to_publish(publisher.census, view.nodes().count() as u64))
            .flatten();
        (view.waiting_changes(paused, &more, now_ms()), census)
    }) else {
        return;
    };
    if let Some(nodes) = census
        && !publish_census(kv, keys, fence, shared, nodes).await
    {
        publisher.owed = true;
        return;
    }
    publisher.census = census.or(publisher.census);
    // What the last pass wrote, which the view may not show yet (the watch brings it): not
    // written again in this pass; still missing in the next, it is written again.
    let sent = std::mem::take(&mut publisher.sent);
    let changes: Vec<(NodeName, Option<WaitingRecord>)> = changes
        .into_iter()
        .filter(|(node, record)| match (sent.get(node), record) {
            (Some(Some(old)), Some(new)) => !old.same_decision(new),
            (Some(None), None) => false,
            _ => true,
        })
        .collect();
    for chunk in changes.chunks(CHUNK) {
        let mut ops = Vec::with_capacity(chunk.len());
        for (node, record) in chunk {
            let key = keys.waiting(node);
            match record {
                Some(record) => match encode_value(record) {
                    Ok(value) => ops.push(TxnOp::put(key, value)),
                    Err(error) => shared.raise("key", key.clone(), format!("{key}: {error}")),
                },
                None => ops.push(TxnOp::delete(key)),
            }
        }
        let txn = Txn {
            compares: vec![],
            success: ops,
            failure: vec![],
        };
        match kv.txn(fence.guard(txn)).await {
            Ok(response) if response.succeeded => {
                shared.resolve("etcd", "waiting records");
                publisher.sent.extend(chunk.iter().cloned());
            }
            // The fence is gone: leading ends, and the next leader publishes.
            Ok(_) => return,
            Err(error) => {
                shared.raise(
                    "etcd",
                    "waiting records",
                    format!("the nodes' waiting records: not written: {error}"),
                );
                publisher.owed = true;
                return;
            }
        }
    }
}

/// Writes the node count the agents pace their demand by; false if it was not written (the
/// fence is gone, or etcd failed: reported, and tried again on the next pass).
async fn publish_census<K: Kv>(
    kv: &K,
    keys: &Keys,
    fence: &Fence,
    shared: &Shared,
    nodes: u64,
) -> bool {
    let key = keys.census();
    let value = match encode_value(&CensusRecord { nodes }) {
        Ok(value) => value,
        Err(error) => {
            shared.raise("key", key.clone(), format!("{key}: {error}"));
            return false;
        }
    };
    let txn = Txn {
        compares: vec![],
        success: vec![TxnOp::put(key, value)],
        failure: vec![],
    };
    match kv.txn(fence.guard(txn)).await {
        Ok(response) if response.succeeded => {
            shared.resolve("etcd", "census");
            true
        }
        Ok(_) => false,
        Err(error) => {
            shared.raise(
                "etcd",
                "census",
                format!("the node count for the demand budget: not written: {error}"),
            );
            false
        }
    }
}
