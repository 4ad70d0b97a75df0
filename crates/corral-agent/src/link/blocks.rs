//! Block-mode pools on the agent's side: what the CNI path and the cluster link
//! share ([`BlockSignals`]: ADDs waiting per pool, a cheap in-process "something changed", the
//! node pools' ranges changing, the cluster's choice of pool per namespace), the pool a CNI
//! call allocates from ([`resolve_pool`]), and the demand records, computed purely from the
//! node state's [`BlockReport`] ([`demand_records`], [`is_urgent`]).
//!
//! A CNI ADD or DEL never touches etcd: it only wakes the cluster link, which reads the node state's
//! state and writes `demand/<node>/<pool>` at most once a second.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use corral_cluster::{
    ClusterConfig, DemandRecord, Family, FamilyDemand, IpNet, PoolConfig, PoolName, PoolRule,
};

use crate::node::BlockReport;

/// What the CNI path and the cluster link share.
#[derive(Debug)]
pub struct BlockSignals {
    /// ADDs waiting for a grant per pool, and since when ADDs have waited there without a
    /// break.
    pending: Mutex<BTreeMap<String, (u64, tokio::time::Instant)>>,
    /// Woken after each local change the demand may follow (an ADD, a DEL, an ADD waiting).
    changed: tokio::sync::Notify,
    /// Set when an ADD starts waiting: the demand goes out as soon as allowed.
    urgent: AtomicBool,
    /// Bumped when the node pools' ranges change (grants applied, a block taken back): a
    /// waiting ADD tries again.
    ranges: tokio::sync::watch::Sender<u64>,
    /// The cluster configuration last read (pools per namespace, the default pool, which
    /// pools are block pools).
    config: Mutex<Option<Arc<ClusterConfig>>>,
}

impl Default for BlockSignals {
    fn default() -> Self {
        BlockSignals {
            pending: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            urgent: AtomicBool::new(false),
            ranges: tokio::sync::watch::Sender::new(0),
            config: Mutex::default(),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl BlockSignals {
    /// Something local changed (no I/O: a flag for the cluster link to look at).
    pub fn touch(&self) {
        self.changed.notify_one();
    }

    /// Waits for [`BlockSignals::touch`] (a touch while nobody waits is kept for the next).
    pub async fn touched(&self) {
        self.changed.notified().await;
    }

    /// An ADD starts waiting in `pool`; the guard counts it until dropped.
    pub fn wait_in(self: &Arc<Self>, pool: &str) -> PendingGuard {
        lock(&self.pending)
            .entry(pool.to_owned())
            .or_insert_with(|| (0, tokio::time::Instant::now()))
            .0 += 1;
        self.urgent.store(true, Ordering::Release);
        self.touch();
        PendingGuard {
            signals: Arc::clone(self),
            pool: pool.to_owned(),
        }
    }

    /// How long ADDs have waited in `pool` without a break (zero when none waits).
    pub fn waited_in(&self, pool: &str) -> std::time::Duration {
        lock(&self.pending)
            .get(pool)
            .map(|(_, since)| since.elapsed())
            .unwrap_or_default()
    }

    /// ADDs waiting per pool.
    pub fn pending(&self) -> BTreeMap<String, u64> {
        lock(&self.pending)
            .iter()
            .map(|(pool, (n, _))| (pool.clone(), *n))
            .collect()
    }

    /// Whether an ADD started waiting since the last call.
    pub fn take_urgent(&self) -> bool {
        self.urgent.swap(false, Ordering::AcqRel)
    }

    /// The node pools' ranges changed.
    pub fn ranges_changed(&self) {
        self.ranges.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver woken by [`BlockSignals::ranges_changed`].
    pub fn subscribe_ranges(&self) -> tokio::sync::watch::Receiver<u64> {
        self.ranges.subscribe()
    }

    pub fn set_config(&self, config: Option<Arc<ClusterConfig>>) {
        *lock(&self.config) = config;
    }

    pub fn config(&self) -> Option<Arc<ClusterConfig>> {
        lock(&self.config).clone()
    }
}

/// Counts one waiting ADD while it lives.
#[derive(Debug)]
pub struct PendingGuard {
    signals: Arc<BlockSignals>,
    pool: String,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        let mut pending = lock(&self.signals.pending);
        if let Some((n, _)) = pending.get_mut(&self.pool) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pending.remove(&self.pool);
            }
        }
        drop(pending);
        self.signals.touch();
    }
}

/// The pool a CNI call on a node pool allocates from: the pool the call names
/// (`runtimeConfig.pool`, `args.cni.pool`), else its Kubernetes namespace's pool in the
/// cluster configuration, else the network's `ipam.pool`, else the cluster's default pool,
/// else `default`. Without a cluster configuration namespaces map to nothing.
pub fn resolve_pool(
    config: Option<&ClusterConfig>,
    requested: Option<&str>,
    namespace: Option<&str>,
    configured: Option<&str>,
) -> String {
    choose_pool(config, requested, namespace, configured).0
}

/// [`resolve_pool`], and the rule that chose the pool.
pub fn choose_pool(
    config: Option<&ClusterConfig>,
    requested: Option<&str>,
    namespace: Option<&str>,
    configured: Option<&str>,
) -> (String, PoolRule) {
    match config {
        Some(config) => config.choose_pool(requested, namespace, configured),
        None => [
            (requested, PoolRule::Requested),
            (configured, PoolRule::Network),
        ]
        .into_iter()
        .find_map(|(p, rule)| p.filter(|p| !p.is_empty()).map(|p| (p.to_owned(), rule)))
        .unwrap_or_else(|| ("default".to_owned(), PoolRule::Default)),
    }
}

/// The demand of each block pool of `config`, from the node state's report and the ADDs waiting
/// (`at_ms` left 0: the caller stamps what it writes).
pub fn demand_records(
    config: &ClusterConfig,
    report: &BlockReport,
    pending: &BTreeMap<String, u64>,
) -> BTreeMap<PoolName, DemandRecord> {
    config
        .pools
        .iter()
        .filter(|p| p.is_blocks())
        .map(|pool| {
            let held = |family: Family| -> Vec<(IpNet, bool)> {
                report
                    .ranges
                    .iter()
                    .filter(|r| r.pool == pool.name && r.spec.family() == family && !r.draining)
                    .map(|r| (r.spec.subnet_net(), r.n_allocated == 0))
                    .collect()
            };
            (
                pool.name.clone(),
                demand_record(pool, &report.stats, pending, held),
            )
        })
        .collect()
}

/// One pool's demand: per family its `used` and `free` (from `stats`, `(pool, family, used,
/// free)`), `blocks` = the units of space it holds (`held`: each with whether nothing is
/// allocated or cooling in it), `empty` = up to [`FamilyDemand::MAX_EMPTY`] of the empty ones,
/// highest first (the candidates the operator may mark for release), and the ADDs waiting
/// spread over the families.
pub fn demand_record(
    pool: &PoolConfig,
    stats: &[(PoolName, Family, u64, u64)],
    pending: &BTreeMap<String, u64>,
    held: impl Fn(Family) -> Vec<(IpNet, bool)>,
) -> DemandRecord {
    let mut record = DemandRecord::default();
    for (family, _) in pool.families() {
        let (used, free) = stats
            .iter()
            .find(|(p, f, _, _)| *p == pool.name && *f == family)
            .map_or((0, 0), |(_, _, used, free)| (*used, *free));
        let mut held = held(family);
        held.sort_by_key(|(net, _)| std::cmp::Reverse(net.addr()));
        let empty = held
            .iter()
            .filter(|(_, empty)| *empty)
            .take(FamilyDemand::MAX_EMPTY)
            .map(|(net, _)| *net)
            .collect();
        *record.family_mut(family) = Some(FamilyDemand {
            used,
            free,
            pending: 0,
            blocks: held.len() as u64,
            empty,
        });
    }
    spread_waiting(
        &mut record,
        pending.get(pool.name.as_str()).copied().unwrap_or(0),
    );
    record
}

/// Whether two records say the same, `at_ms` aside.
pub fn same_demand(a: &DemandRecord, b: &DemandRecord) -> bool {
    a.ipv4 == b.ipv4 && a.ipv6 == b.ipv6
}

/// Whether the demand must go out as soon as allowed: a family's free addresses fell below
/// its pre-allocate watermark (and were not below it in what was written), or the ADDs
/// waiting changed.
pub fn is_urgent(
    config: &ClusterConfig,
    node: &str,
    pool: &PoolName,
    record: &DemandRecord,
    written: Option<&DemandRecord>,
) -> bool {
    let Some(written) = written else {
        return true;
    };
    // Only blocks and cloud pools have watermarks; another keeps the default ones.
    let pre = config.pool(pool).map_or(0, |p| {
        p.demand()
            .map_or(corral_cluster::Watermarks::default(), |d| {
                d.watermarks_for(node)
            })
            .pre_allocate
    });
    [Family::V4, Family::V6].into_iter().any(|family| {
        let now = record.family(family);
        let before = written.family(family);
        let low = |d: Option<&FamilyDemand>| d.is_some_and(|d| d.free < pre);
        let pending = |d: Option<&FamilyDemand>| d.map_or(0, |d| d.pending);
        (low(now) && (!low(before) || now.map(|d| d.free) != before.map(|d| d.free)))
            || pending(now) != pending(before)
    })
}

/// Puts `waiting` ADDs into a demand record as `pending`: they wait for the families with
/// nothing free (all of the record's, if none is empty). Block and cloud pools alike.
pub(crate) fn spread_waiting(record: &mut DemandRecord, waiting: u64) {
    if waiting == 0 {
        return;
    }
    let empty: Vec<Family> = [Family::V4, Family::V6]
        .into_iter()
        .filter(|&f| record.family(f).is_some_and(|d| d.free == 0))
        .collect();
    let families = if empty.is_empty() {
        vec![Family::V4, Family::V6]
    } else {
        empty
    };
    for family in families {
        if let Some(demand) = record.family_mut(family) {
            demand.pending = waiting;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::HeldRange;

    fn config() -> ClusterConfig {
        ClusterConfig::from_toml(include_str!("../../tests/configs/pool_choice.toml")).unwrap()
    }

    #[test]
    fn the_pool_is_the_calls_then_the_namespaces_then_the_networks_then_the_clusters() {
        let c = config();
        assert_eq!(
            resolve_pool(Some(&c), Some("x"), Some("blue"), Some("y")),
            "x"
        );
        assert_eq!(
            resolve_pool(Some(&c), None, Some("blue"), Some("y")),
            "bluepool"
        );
        assert_eq!(resolve_pool(Some(&c), None, Some("red"), Some("y")), "y");
        assert_eq!(resolve_pool(Some(&c), None, Some("red"), None), "main");
        assert_eq!(resolve_pool(None, None, Some("blue"), None), "default");
        assert_eq!(resolve_pool(None, Some(""), None, Some("z")), "z");
    }

    fn held(range: &str, n_allocated: u64) -> HeldRange {
        HeldRange {
            pool: PoolName::new("main").unwrap(),
            spec: range.parse().unwrap(),
            n_allocated,
            draining: false,
        }
    }

    #[test]
    fn demand_counts_blocks_and_lists_empty_ones_highest_first() {
        let c = config();
        let main = PoolName::new("main").unwrap();
        let report = BlockReport {
            stats: vec![(main.clone(), Family::V4, 3, 25)],
            ranges: vec![
                held("10.0.0.0/28", 3),
                held("10.0.0.16/28", 0),
                held("10.0.0.32/28", 0),
                HeldRange {
                    draining: true,
                    ..held("10.0.0.48/28", 0)
                },
            ],
            surrendered: vec![],
        };
        let records = demand_records(&c, &report, &BTreeMap::new());
        assert_eq!(records.len(), 1, "only block pools");
        let v4 = records[&main].ipv4.clone().unwrap();
        assert_eq!((v4.used, v4.free, v4.pending, v4.blocks), (3, 25, 0, 3));
        assert_eq!(
            v4.empty,
            vec![
                "10.0.0.32/28".parse().unwrap(),
                "10.0.0.16/28".parse().unwrap()
            ]
        );
        assert!(records[&main].ipv6.is_none());
        // Waiting ADDs count in the family with nothing free.
        let full = BlockReport {
            stats: vec![(main.clone(), Family::V4, 14, 0)],
            ranges: vec![held("10.0.0.0/28", 14)],
            surrendered: vec![],
        };
        let pending = BTreeMap::from([("main".to_owned(), 2)]);
        let records = demand_records(&c, &full, &pending);
        assert_eq!(records[&main].ipv4.as_ref().unwrap().pending, 2);
    }

    #[test]
    fn urgency_is_free_below_pre_allocate_or_waiting_adds_changing() {
        let c = config();
        let main = PoolName::new("main").unwrap();
        let record = |free, pending| DemandRecord {
            ipv4: Some(FamilyDemand {
                used: 1,
                free,
                pending,
                blocks: 1,
                empty: vec![],
            }),
            ipv6: None,
            at_ms: 0,
        };
        // (the new record, the one last written, urgent): with nothing written yet it is;
        // free below pre-allocate, when it was not or has changed, is; so is a change of the
        // waiting ADDs.
        let cases = [
            (record(20, 0), None, true),
            (record(20, 0), Some(record(30, 0)), false),
            (record(7, 0), Some(record(30, 0)), true),
            (record(0, 1), Some(record(0, 0)), true),
            (record(7, 0), Some(record(7, 0)), false),
        ];
        for (new, last, urgent) in &cases {
            assert_eq!(
                is_urgent(&c, "n", &main, new, last.as_ref()),
                *urgent,
                "{new:?} after {last:?}"
            );
        }
        assert!(same_demand(
            &record(7, 0),
            &DemandRecord {
                at_ms: 5,
                ..record(7, 0)
            }
        ));
    }
}
