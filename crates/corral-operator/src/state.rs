//! What the operator shows of itself: the leading loop keeps its view here (the API reads it) and
//! counts what it does; the API and the metrics read them.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use corral_cluster::ClusterView;
use corral_core::Family;
use corral_kv::{Revision, ScanStats};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// How a grant transaction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum TxnOutcome {
    /// Committed.
    Granted,
    /// A compare failed (a stale view, or the fence): nothing written, retried.
    Conflict,
    /// The store failed; the view is rebuilt before anything else.
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: TxnOutcome,
}

/// How a resync (the leader's periodic re-read of the prefix against its view) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum ResyncOutcome {
    Ok,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResyncLabels {
    pub outcome: ResyncOutcome,
}

/// A block pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

/// How a step of a release handshake ended: `marked`, `released` (the agent answered ready
/// and the grant went), `refused` (the agent's refusal forgotten), `unmarked`, `conflict` (a
/// compare failed: planned again).
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HandshakeLabels {
    pub outcome: String,
}

/// Reads the cloud call scheduler's counters.
pub type CloudStats = Box<dyn Fn() -> corral_cloud::SchedulerStats + Send + Sync>;

/// One node's figures in one cloud pool and family, as the cloud node manager last planned
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudNodeFigures {
    pub pool: String,
    pub family: Family,
    /// Cilium's statistics (addresses).
    pub stats: corral_cluster::blocks::Statistics,
    /// Needs addresses, but the instance is at its limits (or no subnet has room): no call.
    pub at_capacity: bool,
}

/// Shared between the leading loop, the API and the metrics.
#[derive(Debug)]
pub struct Shared {
    pub replica: String,
    inner: Mutex<Inner>,
    /// The leader's view itself (not a copy): the leading loop changes it in short sections
    /// between its awaits, the API reads it. Its own lock, taken before `inner` when both are
    /// (the loop reports problems while it holds the view), never the other way round.
    view: Mutex<Option<(ClusterView, Revision)>>,
    pub metrics: Metrics,
    cloud_stats: CloudStatsCell,
    /// etcd's time as this replica saw it, and the wait for the agents' assertions
    /// (`epoch.rs`).
    pub(crate) epoch: Mutex<EpochState>,
    /// The current problems and the events (`problems.rs`).
    pub conditions: crate::problems::Problems,
    /// Reads the grants' history from etcd (`history.rs`), set by `run`.
    history: HistoryCell,
}

/// Where the [`HistoryReader`] is kept (a closure has no `Debug`).
#[derive(Default)]
struct HistoryCell(std::sync::OnceLock<HistoryReader>);

impl std::fmt::Debug for HistoryCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HistoryCell")
    }
}

/// A read of the grants' history under a configuration, with the grants held from the
/// leader's view for the newest events (a closure over the replica's `Kv`, which the API is
/// not generic over; see `history::read_with_held`).
pub type HistoryReader = std::sync::Arc<
    dyn Fn(
            corral_cluster::ClusterConfig,
            crate::history::HistoryRequest,
            Option<Vec<corral_cluster::history::HistoryEvent>>,
        ) -> std::pin::Pin<
            Box<
                dyn Future<
                        Output = Result<
                            Vec<corral_cluster::history::HistoryEvent>,
                            corral_kv::KvError,
                        >,
                    > + Send,
            >,
        > + Send
        + Sync,
>;

/// Where [`CloudStats`] is kept (a closure has no `Debug`).
#[derive(Default)]
struct CloudStatsCell(Mutex<Option<CloudStats>>);

impl std::fmt::Debug for CloudStatsCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CloudStatsCell")
    }
}

#[derive(Debug, Default)]
struct Inner {
    leading: bool,
    last_rebuild: Option<(ScanStats, Duration)>,
    took_lead_in: Option<Duration>,
    /// The latency of recent grant transactions, for the benchmark's percentiles.
    samples: Vec<Duration>,
    /// Cloud pools: each node's last figures.
    cloud_nodes: BTreeMap<String, Vec<CloudNodeFigures>>,
    /// Cloud pools: the cloud view had a successful resync (mutations allowed).
    cloud_ready: bool,
    /// From-cloud pools: each node's reports (why it lacks what the cloud shows, or waits).
    /// (kind, sentence) per node.
    from_cloud: BTreeMap<String, Vec<(&'static str, String)>>,
    /// Cloud pools: interface records refused because another record holds the interface or
    /// an address (each sentence once, newest kept).
    record_conflicts: std::collections::BTreeSet<String>,
    /// Cloud pools: records the cloud does not have, as the last full resync confirmed.
    records_missing: Vec<String>,
    /// The election key's holder (the replica that leads), as last read; `None` when no
    /// candidate was found.
    leader_seen: Option<String>,
}

/// Grant latencies kept (the newest).
const MAX_SAMPLES: usize = 100_000;

/// The operator's Prometheus metrics (the per-pool gauges are read from the view at scrape
/// time).
#[derive(Debug)]
pub struct Metrics {
    pub grants: MetricFamily<OutcomeLabels, Counter>,
    pub resyncs: MetricFamily<ResyncLabels, Counter>,
    pub txn_seconds: Histogram,
    pub rebuilds: Counter,
    pub leader: Gauge,
    pub blocks_granted: MetricFamily<PoolLabels, Counter>,
    pub blocks_released: MetricFamily<PoolLabels, Counter>,
    pub handshakes: MetricFamily<HandshakeLabels, Counter>,
    pub cloud_gc_deleted: Counter,
    pub cloud_intents_written: Counter,
    pub cloud_record_conflicts: Counter,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            grants: MetricFamily::default(),
            resyncs: MetricFamily::default(),
            txn_seconds: Histogram::new([
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
            rebuilds: Counter::default(),
            leader: Gauge::default(),
            blocks_granted: MetricFamily::default(),
            blocks_released: MetricFamily::default(),
            handshakes: MetricFamily::default(),
            cloud_gc_deleted: Counter::default(),
            cloud_intents_written: Counter::default(),
            cloud_record_conflicts: Counter::default(),
        }
    }
}

/// Cloud record conflicts remembered (each reported once).
const MAX_PROBLEMS: usize = 64;

impl Shared {
    pub fn new(replica: String) -> Shared {
        Shared {
            replica,
            inner: Mutex::new(Inner::default()),
            view: Mutex::new(None),
            metrics: Metrics::default(),
            cloud_stats: CloudStatsCell::default(),
            history: HistoryCell::default(),
            epoch: Mutex::default(),
            conditions: crate::problems::Problems::default(),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock left plain data behind; it is still readable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn view(&self) -> std::sync::MutexGuard<'_, Option<(ClusterView, Revision)>> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_leading(&self, leading: bool, took: Duration) {
        if !leading {
            let nodes = self.view().take().map(|(view, _)| view_nodes(&view));
            if let Some(nodes) = nodes {
                self.epoch
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .last_term = Some((tokio::time::Instant::now(), nodes));
            }
        }
        if !leading {
            // What the lead ran into is no longer this replica's to fix.
            self.conditions
                .resolve_where(|kind| !matches!(kind, "election" | "election-key" | "epoch"));
        }
        let mut inner = self.inner();
        inner.leading = leading;
        if leading {
            inner.took_lead_in = Some(took);
        }
        self.metrics.leader.set(i64::from(leading));
    }

    pub fn leading(&self) -> bool {
        self.inner().leading
    }

    /// The nodes of the leader's view (registered, or with a holdings record), if this replica
    /// leads and its view is not in use right now.
    pub fn view_nodes(&self) -> Option<Vec<corral_cluster::NodeName>> {
        let view = self.view.try_lock().ok()?;
        view.as_ref().map(|(view, _)| view_nodes(view))
    }

    /// Installs the leader's view (after a read of the whole prefix), replacing any other.
    pub fn install(&self, view: ClusterView, revision: Revision) {
        *self.view() = Some((view, revision));
    }

    /// Runs `f` on the leader's view, if this replica leads; `f` must not block.
    pub fn with_view<T>(&self, f: impl FnOnce(&ClusterView, Revision) -> T) -> Option<T> {
        self.view()
            .as_ref()
            .map(|(view, revision)| f(view, *revision))
    }

    /// Runs `f` on the leader's view to change it (the leading loop only).
    pub fn with_view_mut<T>(
        &self,
        f: impl FnOnce(&mut ClusterView, &mut Revision) -> T,
    ) -> Option<T> {
        self.view()
            .as_mut()
            .map(|(view, revision)| f(view, revision))
    }

    /// The last rebuild's cost (requests, keys read, keys etcd walked) and time.
    pub fn note_rebuild(&self, cost: ScanStats, took: Duration) {
        self.inner().last_rebuild = Some((cost, took));
        self.metrics.rebuilds.inc();
    }

    pub fn last_rebuild(&self) -> Option<(ScanStats, Duration)> {
        self.inner().last_rebuild
    }

    /// Every starving node by pool and family, as the leader's view works it out (the same
    /// reasons as `waiting`: a block pool says block); empty when this replica does not lead
    /// (a standby cannot know, and no memory of an old term is shown as current).
    pub fn full_pools(&self) -> BTreeMap<String, String> {
        self.with_view(|view, _| view.full()).unwrap_or_default()
    }

    /// Raises (or sees again) the problem `kind`/`subject` with `message` (`problems.rs`): it
    /// stands until [`Shared::resolve`] ends it.
    pub fn raise(&self, kind: &'static str, subject: impl Into<String>, message: String) {
        self.conditions.raise(kind, subject.into(), message);
    }

    /// Ends the problem `kind`/`subject`, if it stands.
    pub fn resolve(&self, kind: &'static str, subject: &str) {
        self.conditions.resolve(kind, subject);
    }

    /// A happening that is no lasting condition: logged and kept among the events only.
    pub fn note_problem(&self, problem: String) {
        self.conditions.event(problem);
    }

    /// Every message still known: the current problems' and the events' (what was reported,
    /// over or not).
    pub fn reported(&self) -> Vec<String> {
        let mut messages = self.problems();
        messages.extend(self.conditions.events().into_iter().map(|e| e.message));
        messages
    }

    /// The messages of the current problems, oldest first.
    pub fn problems(&self) -> Vec<String> {
        self.conditions
            .conditions()
            .into_iter()
            .map(|c| c.message)
            .collect()
    }

    /// The keys' problems a full read of the prefix found: those it did not find are over.
    pub fn set_key_problems(&self, problems: Vec<corral_cluster::Problem>) {
        self.conditions
            .resolve_all("key", |key| problems.iter().any(|p| p.key == key));
        for problem in problems {
            let message = format!("{}: {}", problem.key, problem.message);
            self.raise("key", problem.key, message);
        }
    }

    /// What is wrong under `election/` now (ends what is no longer); logged when new.
    pub fn set_election_problems(&self, problems: Vec<String>) {
        self.conditions
            .resolve_all("election-key", |p| problems.iter().any(|q| q == p));
        for problem in problems {
            self.raise("election-key", problem.clone(), problem);
        }
    }

    pub fn note_txn(&self, took: Duration) {
        self.metrics.txn_seconds.observe(took.as_secs_f64());
        let mut inner = self.inner();
        if inner.samples.len() >= MAX_SAMPLES {
            inner.samples.clear();
        }
        inner.samples.push(took);
    }

    /// Recent grant transaction latencies.
    pub fn txn_samples(&self) -> Vec<Duration> {
        self.inner().samples.clone()
    }

    pub fn note_grant(&self, outcome: TxnOutcome) {
        self.metrics
            .grants
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Counts a resync of the view by its outcome (called by the leading loop).
    pub fn note_resync(&self, ok: bool) {
        let outcome = if ok {
            ResyncOutcome::Ok
        } else {
            ResyncOutcome::Failed
        };
        self.metrics
            .resyncs
            .get_or_create(&ResyncLabels { outcome })
            .inc();
    }

    /// Resyncs that ended well, under any leader of this replica.
    pub fn resyncs_ok(&self) -> u64 {
        self.metrics
            .resyncs
            .get_or_create(&ResyncLabels {
                outcome: ResyncOutcome::Ok,
            })
            .get()
    }

    /// Counts blocks granted in a block pool.
    pub fn note_blocks_granted(&self, pool: &str, n: u64) {
        self.metrics
            .blocks_granted
            .get_or_create(&PoolLabels {
                pool: pool.to_owned(),
            })
            .inc_by(n);
    }

    /// Blocks granted in `pool` since start.
    pub fn blocks_granted(&self, pool: &str) -> u64 {
        self.metrics
            .blocks_granted
            .get_or_create(&PoolLabels {
                pool: pool.to_owned(),
            })
            .get()
    }

    /// Counts blocks released (their grant deleted after the agent surrendered them).
    pub fn note_blocks_released(&self, pool: &str, n: u64) {
        self.metrics
            .blocks_released
            .get_or_create(&PoolLabels {
                pool: pool.to_owned(),
            })
            .inc_by(n);
    }

    /// Counts a step of a release handshake by its outcome.
    pub fn note_handshake(&self, outcome: &str) {
        self.metrics
            .handshakes
            .get_or_create(&HandshakeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Handshake steps of one outcome since start.
    pub fn handshakes(&self, outcome: &str) -> u64 {
        self.metrics
            .handshakes
            .get_or_create(&HandshakeLabels {
                outcome: outcome.to_owned(),
            })
            .get()
    }

    /// Grant transactions of one outcome since start.
    pub fn grant_txns(&self, outcome: TxnOutcome) -> u64 {
        self.metrics
            .grants
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }

    /// Grant transactions committed since start.
    pub fn granted(&self) -> u64 {
        self.metrics
            .grants
            .get_or_create(&OutcomeLabels {
                outcome: TxnOutcome::Granted,
            })
            .get()
    }

    /// Where the cloud call scheduler's counters are read (set once by `run_with_cloud`).
    /// Sets how the grants' history is read (once; `run` does).
    pub fn set_history_reader(&self, reader: HistoryReader) {
        let _ = self.history.0.set(reader);
    }

    /// How the grants' history is read, once `run` set it.
    pub fn history_reader(&self) -> Option<HistoryReader> {
        self.history.0.get().cloned()
    }

    pub fn set_cloud_stats(&self, stats: CloudStats) {
        *self.cloud_stats.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats);
    }

    /// The cloud call scheduler's counters now, if the operator has a cloud provider.
    pub fn cloud_stats(&self) -> Option<corral_cloud::SchedulerStats> {
        self.cloud_stats
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|stats| stats())
    }

    /// Cloud calls of one action (EC2's name) answered with one outcome (`ok`, `throttled`,
    /// or an error's kind) since start, every attempt counted.
    pub fn cloud_calls(&self, action: &str, outcome: &str) -> u64 {
        let Some(stats) = self.cloud_stats() else {
            return 0;
        };
        let Some((_, stats)) = stats.iter().find(|(a, _)| a.as_str() == action) else {
            return 0;
        };
        match outcome {
            "ok" => stats.ok,
            "throttled" => stats.throttled,
            "sent" => stats.sent,
            kind => stats.errors.get(kind).copied().unwrap_or(0),
        }
    }

    /// The cloud calls' metrics text (OpenMetrics), from the scheduler's counters.
    pub fn cloud_metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let Some(stats) = self.cloud_stats() else {
            return String::new();
        };
        let mut text = String::new();
        text.push_str("# HELP corral_operator_cloud_calls Cloud API calls sent by the cloud node manager, by action and outcome (every attempt).\n");
        text.push_str("# TYPE corral_operator_cloud_calls counter\n");
        for (action, s) in stats.iter() {
            let mut outcomes: Vec<(&str, u64)> = vec![("ok", s.ok), ("throttled", s.throttled)];
            outcomes.extend(s.errors.iter().map(|(kind, n)| (*kind, *n)));
            for (outcome, n) in outcomes {
                let _ = writeln!(
                    text,
                    "corral_operator_cloud_calls_total{{action=\"{}\",outcome=\"{outcome}\"}} {n}",
                    action.as_str()
                );
            }
        }
        if let Some(open) = self.with_view(|view, _| view.cloud_intents().count()) {
            let _ = writeln!(
                text,
                "# HELP corral_operator_cloud_intents_open Cloud intents in the store not yet recorded or replayed.\n# TYPE corral_operator_cloud_intents_open gauge\ncorral_operator_cloud_intents_open {open}"
            );
        }
        let _ = writeln!(
            text,
            "# HELP corral_operator_cloud_nodes_at_capacity Nodes that need addresses their instance cannot take (no call is made).\n# TYPE corral_operator_cloud_nodes_at_capacity gauge\ncorral_operator_cloud_nodes_at_capacity {}",
            self.cloud_at_capacity().len()
        );
        let _ = writeln!(
            text,
            "# HELP corral_operator_cloud_record_conflicts Interface records refused at write: another record holds the interface or an address.\n# TYPE corral_operator_cloud_record_conflicts counter\ncorral_operator_cloud_record_conflicts_total {}",
            self.cloud_record_conflicts()
        );
        let _ = writeln!(
            text,
            "# HELP corral_operator_cloud_records_missing Interface records and recorded addresses the cloud does not have (confirmed by the last full resync).\n# TYPE corral_operator_cloud_records_missing gauge\ncorral_operator_cloud_records_missing {}",
            self.cloud_records_missing().len()
        );
        text
    }

    /// Keeps a node's figures in the cloud pools (the manager's last plan of it).
    pub fn note_cloud_node(&self, node: &str, figures: Vec<CloudNodeFigures>) {
        let mut inner = self.inner();
        if figures.is_empty() {
            inner.cloud_nodes.remove(node);
        } else {
            inner.cloud_nodes.insert(node.to_owned(), figures);
        }
    }

    /// A node's figures in the cloud pools.
    pub fn cloud_node(&self, node: &str) -> Vec<CloudNodeFigures> {
        self.inner()
            .cloud_nodes
            .get(node)
            .cloned()
            .unwrap_or_default()
    }

    /// Nodes at capacity in some cloud pool and family.
    pub fn cloud_at_capacity(&self) -> Vec<String> {
        self.inner()
            .cloud_nodes
            .iter()
            .filter(|(_, figures)| figures.iter().any(|f| f.at_capacity))
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Forgets the cloud node manager's state (leading ended).
    pub fn clear_cloud(&self) {
        let mut inner = self.inner();
        inner.cloud_nodes.clear();
        inner.cloud_ready = false;
        inner.from_cloud.clear();
        inner.records_missing.clear();
        inner.record_conflicts.clear();
    }

    pub fn set_cloud_ready(&self, ready: bool) {
        self.inner().cloud_ready = ready;
    }

    /// Whether the cloud view had its first successful resync under this leader.
    pub fn cloud_ready(&self) -> bool {
        self.inner().cloud_ready
    }

    /// Keeps the from-cloud sync's reports (node → (kind, sentence); nodes without any left
    /// out).
    pub fn set_from_cloud_reports(&self, reports: BTreeMap<String, Vec<(&'static str, String)>>) {
        self.inner().from_cloud = reports;
    }

    /// A node's from-cloud reports (`pool P ipv6: ...` sentences), as last planned.
    pub fn from_cloud_reports(&self, node: &str) -> Vec<String> {
        self.inner()
            .from_cloud
            .get(node)
            .map(|lines| lines.iter().map(|(_, line)| line.clone()).collect())
            .unwrap_or_default()
    }

    /// The from-cloud reports' metrics text: nodes reported, by the report's kind.
    pub fn from_cloud_metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let inner = self.inner();
        if inner.from_cloud.is_empty() {
            return String::new();
        }
        let mut text = String::from(
            "# HELP corral_operator_from_cloud_reports Reports of from-cloud pools' nodes (a prefix not granted, or a node waiting), by kind.\n# TYPE corral_operator_from_cloud_reports gauge\n",
        );
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for (kind, _) in inner.from_cloud.values().flatten() {
            *counts.entry(kind).or_default() += 1;
        }
        for (kind, n) in counts {
            let _ = writeln!(
                text,
                "corral_operator_from_cloud_reports{{kind=\"{kind}\"}} {n}"
            );
        }
        text
    }

    /// An interface record refused at write (it would have named an interface or address
    /// another record holds): counted, and each new sentence reported as a problem.
    pub fn note_cloud_record_conflict(&self, sentence: String) {
        self.metrics.cloud_record_conflicts.inc();
        let new = {
            let mut inner = self.inner();
            if inner.record_conflicts.len() >= MAX_PROBLEMS {
                inner.record_conflicts.clear();
            }
            inner.record_conflicts.insert(sentence.clone())
        };
        if new {
            self.raise("cloud-record", sentence.clone(), sentence);
        }
    }

    /// Interface records refused at write since start.
    pub fn cloud_record_conflicts(&self) -> u64 {
        self.metrics.cloud_record_conflicts.get()
    }

    /// The records (and recorded addresses) the last full resync confirmed the cloud does not
    /// have; each one not reported before is reported as a problem.
    pub fn set_cloud_records_missing(&self, sentences: Vec<String>) {
        self.conditions
            .resolve_all("cloud-record-missing", |s| sentences.iter().any(|t| t == s));
        for sentence in &sentences {
            self.raise("cloud-record-missing", sentence.clone(), sentence.clone());
        }
        self.inner().records_missing = sentences;
    }

    /// The records the cloud does not have, as the last full resync confirmed.
    pub fn cloud_records_missing(&self) -> Vec<String> {
        self.inner().records_missing.clone()
    }

    pub fn note_cloud_gc_deleted(&self, n: u64) {
        self.metrics.cloud_gc_deleted.inc_by(n);
    }

    /// Leaked interfaces the collector deleted since start.
    pub fn cloud_gc_deleted(&self) -> u64 {
        self.metrics.cloud_gc_deleted.get()
    }

    pub fn note_cloud_intent(&self) {
        self.metrics.cloud_intents_written.inc();
    }

    /// Cloud intents written since start.
    pub fn cloud_intents_written(&self) -> u64 {
        self.metrics.cloud_intents_written.get()
    }

    pub fn took_lead_in(&self) -> Option<Duration> {
        self.inner().took_lead_in
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "corral_operator_grants",
            "Grant transactions by outcome",
            self.metrics.grants.clone(),
        );
        registry.register(
            "corral_operator_resyncs",
            "Resyncs of the view by outcome",
            self.metrics.resyncs.clone(),
        );
        registry.register(
            "corral_operator_etcd_txn_seconds",
            "Latency of grant transactions",
            self.metrics.txn_seconds.clone(),
        );
        registry.register(
            "corral_operator_rebuilds",
            "Rebuilds of the view from a full read of the prefix",
            self.metrics.rebuilds.clone(),
        );
        registry.register(
            "corral_operator_blocks_granted",
            "Blocks granted in block pools, by pool",
            self.metrics.blocks_granted.clone(),
        );
        registry.register(
            "corral_operator_blocks_released",
            "Blocks released in block pools (surrendered by the agent, grant deleted), by pool",
            self.metrics.blocks_released.clone(),
        );
        registry.register(
            "corral_operator_handshakes",
            "Steps of block release handshakes by outcome",
            self.metrics.handshakes.clone(),
        );
        registry.register(
            "corral_operator_cloud_gc_deleted",
            "Leaked cloud interfaces deleted by the collector",
            self.metrics.cloud_gc_deleted.clone(),
        );
        registry.register(
            "corral_operator_cloud_intents",
            "Cloud intents written (one before every cloud mutation)",
            self.metrics.cloud_intents_written.clone(),
        );
        registry.register(
            "corral_operator_leader",
            "1 while this replica leads",
            self.metrics.leader.clone(),
        );
    }
}

/// The operator's memory of etcd's time, and the wait for the agents' assertions.
#[derive(Debug)]
pub struct EpochState {
    pub(crate) path: Option<std::path::PathBuf>,
    /// What it remembers, and when that was last written.
    pub(crate) kept: corral_cluster::KeptEpoch,
    /// How long to wait for the agents' assertions at most.
    pub(crate) settle: Duration,
    /// When this process first saw the unsettled regression (the settle time runs from it).
    pub(crate) since: Option<tokio::time::Instant>,
    /// This term waits for the live nodes' holdings until then.
    pub(crate) term_deadline: Option<tokio::time::Instant>,
    /// `corral cluster recover --yes` asked to resume granting.
    pub(crate) recover: bool,
    /// The mod revision of the `reassert` key this replica put for the unsettled regression
    /// (assertions count from it); `None` until it is put in a term.
    pub(crate) reasserted: Option<Revision>,
    /// The nodes (registered, or with a holdings record) of the view this replica led with
    /// when it saw the unsettled regression; `None`: it did not lead up to it.
    pub(crate) known_before: Option<Vec<corral_cluster::NodeName>>,
    /// When this replica's last term ended, and its view's nodes then.
    pub(crate) last_term: Option<(tokio::time::Instant, Vec<corral_cluster::NodeName>)>,
    /// Why granting is paused now (a status problem while it is).
    pub(crate) paused: Option<String>,
    pub(crate) regressions: u64,
}

impl Default for EpochState {
    fn default() -> Self {
        EpochState {
            path: None,
            kept: corral_cluster::KeptEpoch::default(),
            settle: DEFAULT_SETTLE,
            since: None,
            term_deadline: None,
            recover: false,
            reasserted: None,
            known_before: None,
            last_term: None,
            paused: None,
            regressions: 0,
        }
    }
}

/// The default settle time: twice the agents' default liveness lease (20 s). An agent that
/// is live renews its lease every third of it and asserts its holdings at once when it sees
/// etcd go back in time, so a live agent has asserted well within it.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(40);

/// The nodes a view knows: registered, or with a holdings record (a removed node draining).
fn view_nodes(view: &ClusterView) -> Vec<corral_cluster::NodeName> {
    let mut nodes: std::collections::BTreeSet<corral_cluster::NodeName> =
        view.nodes().map(|(node, _)| node.clone()).collect();
    nodes.extend(view.holdings().map(|(node, _)| node.clone()));
    nodes.into_iter().collect()
}

/// Who leads, as every replica reads it from the election keys (a standby's 503 names it).
impl Shared {
    /// The election key's holder as last read (`None`: no candidate).
    pub fn leader_seen(&self) -> Option<String> {
        self.inner().leader_seen.clone()
    }

    /// Notes the election key's holder read now.
    pub fn set_leader_seen(&self, leader: Option<String>) {
        self.inner().leader_seen = leader;
    }
}
