//! etcd going back in time, on the operator's side, and the wait for the agents'
//! assertions before granting.
//!
//! Each replica remembers the highest etcd revision and the cluster ID it saw
//! (`corral_cluster::EpochMemory`), in `--state-dir` (`etcd-epoch-<cluster>.json`; without
//! one, in memory for the process's life: etcd itself cannot be trusted to remember it, a
//! restore takes the record back too). It feeds the memory every header it gets for free
//! (watch events, its transactions' answers) and asks etcd for its header when a term starts
//! and at each resync. A regression (a lower revision, another cluster ID) stops all granting,
//! is reported (a log line, a status problem, `corral_operator_etcd_regressions_total`,
//! `corral_operator_granting_paused`), and granting resumes only once every live registered
//! node's agent asserted its holdings after the regression was seen, or the settle time
//! passed, or `corral cluster recover --yes` asked for it.
//!
//! A new term waits the same way (cheaply: when every live node already has a `holdings/`
//! record, not at all), so a leader that never saw the regression does not grant into space
//! an agent holds before it asserted it. It cannot tell a record the restore brought back from
//! a fresh one, though: if every replica restarted across a restore without `--state-dir`, a
//! live node whose old record came back counts as asserted, and space its agent took after the
//! snapshot may be granted in the seconds before that agent (which remembers etcd's time
//! durably) puts its record again. Hence `--state-dir` (docs/operations.md).

use std::path::PathBuf;
use std::time::Duration;

use corral_cluster::{ClusterView, Epoch, EpochMemory, KeptEpoch, Regression, assertions_owed};
use corral_kv::{Kv, KvError, Revision};
use tokio::time::Instant;

use crate::state::Shared;

/// A regression seen this soon after the replica's term ended is taken to have ended it: the
/// nodes of that term's view are who may hold space etcd forgot.
const LAST_TERM_FRESH: Duration = Duration::from_secs(60);

pub use crate::state::{DEFAULT_SETTLE, EpochState};

/// The epoch file of `cluster` in `dir`.
pub fn epoch_file(dir: &std::path::Path, cluster: &str) -> PathBuf {
    dir.join(format!("etcd-epoch-{cluster}.json"))
}

/// Writes `bytes` to `path` through a temporary file, synced, renamed.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temporary = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)
}

impl Shared {
    fn epoch(&self) -> std::sync::MutexGuard<'_, EpochState> {
        self.epoch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the replica remembers etcd's time (`None`: in memory only) and how long it waits
    /// for the agents' assertions at most. A file that cannot be read is an error naming it
    /// (nothing is changed).
    pub fn configure_epoch(&self, path: Option<PathBuf>, settle: Duration) -> Result<(), String> {
        let memory = match &path {
            None => EpochMemory::default(),
            Some(path) => match std::fs::read(path) {
                Ok(bytes) => EpochMemory::from_json(&bytes)
                    .map_err(|e| format!("{} cannot be read: {e}", path.display()))?,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    EpochMemory::default()
                }
                Err(error) => return Err(format!("reading {}: {error}", path.display())),
            },
        };
        let mut state = self.epoch();
        state.path = path;
        state.kept = KeptEpoch::new(memory);
        state.settle = settle;
        Ok(())
    }

    /// What the replica remembers of etcd's time.
    pub fn epoch_memory(&self) -> EpochMemory {
        self.epoch().kept.memory
    }

    /// Feeds an epoch etcd answered at now; answers the regression it shows (reported here).
    pub fn observe_epoch(&self, found: Epoch) -> Option<Regression> {
        let floor = self.epoch_floor();
        self.observe_epoch_after(floor, found)
    }

    /// The highest revision seen: taken before a request, passed with its answer to
    /// [`Shared::observe_epoch_after`].
    pub fn epoch_floor(&self) -> Revision {
        self.epoch().kept.memory.floor()
    }

    /// Feeds the answer of a request sent when the highest revision seen was `floor` (0: it
    /// only advances; answers of concurrent requests arrive in any order, so one is never
    /// judged against another's).
    pub fn observe_epoch_after(&self, floor: Revision, found: Epoch) -> Option<Regression> {
        let (regression, save, path) = {
            let mut state = self.epoch();
            let (regression, save) =
                state
                    .kept
                    .observe_after(floor, found, std::time::Instant::now());
            if regression.is_some() {
                state.since = Some(Instant::now());
                state.recover = false;
                state.reasserted = None;
                // The nodes of the view this replica leads with now, or of the term that just
                // ended (etcd failed under it): who may hold space etcd forgot.
                state.known_before = self.view_nodes().or_else(|| {
                    state
                        .last_term
                        .take()
                        .filter(|(ended, _)| ended.elapsed() < LAST_TERM_FRESH)
                        .map(|(_, nodes)| nodes)
                });
                state.regressions += 1;
            }
            (regression, save, state.path.clone())
        };
        if let (Some(memory), Some(path)) = (save, path) {
            self.note_memory_written(&path, write_atomically(&path, &memory.to_json()));
        }
        if let Some(regression) = regression {
            // An event: the pause itself stands among the problems while it lasts
            // (`granting_paused`).
            self.note_problem(format!(
                "{regression}: all granting stops until the live agents asserted what they \
                 hold (or the settle time passed, or `corral cluster recover --yes`)"
            ));
        }
        regression
    }

    /// Feeds a revision from an answer that carries no cluster ID, to a request sent when the
    /// highest revision seen was `floor` (0 for a watch event: it only advances).
    pub fn observe_revision(&self, floor: Revision, revision: Revision) -> Option<Regression> {
        self.observe_epoch_after(floor, Epoch::at_revision(revision))
    }

    /// Asks etcd for its header and feeds it.
    pub async fn probe_epoch<K: Kv>(&self, kv: &K) -> Result<Option<Regression>, KvError> {
        let floor = self.epoch_floor();
        let header = kv.header().await?;
        Ok(self.observe_epoch_after(
            floor,
            Epoch {
                cluster_id: header.cluster_id,
                revision: header.revision,
            },
        ))
    }

    /// A term starts: it waits for the live nodes' holdings (or the settle time).
    pub fn begin_term(&self) {
        let mut state = self.epoch();
        state.term_deadline = Some(Instant::now() + state.settle);
    }

    /// The term ended: nothing waits on this replica.
    pub fn end_term(&self) {
        let mut state = self.epoch();
        state.term_deadline = None;
        state.paused = None;
        state.reasserted = None;
    }

    /// The regression the agents are to be asked to assert their holdings again for (put
    /// `reassert`), if one waits and this term has not asked yet.
    pub fn reassert_due(&self) -> Option<Regression> {
        let state = self.epoch();
        state
            .kept
            .memory
            .unsettled
            .filter(|_| state.reasserted.is_none() && !state.recover)
    }

    /// `reassert` was put at `revision`: holdings written before it do not count as asserted.
    pub fn reasserted(&self, revision: Revision) {
        let mut state = self.epoch();
        if state.kept.memory.unsettled.is_some() {
            state.reasserted = Some(revision);
        }
    }

    /// Asks every agent to put its holdings record again (`reassert`, fenced): a record that
    /// came back with a snapshot cannot be told from one written since the restore by its
    /// revision alone (etcd goes on from the snapshot's revision), and an agent that never saw
    /// the higher revision (started since) would not put its record again by itself.
    pub async fn reassert<K: Kv>(
        &self,
        kv: &K,
        keys: &corral_cluster::Keys,
        fence: &crate::election::Fence,
    ) {
        let Some(regression) = self.reassert_due() else {
            return;
        };
        let record = corral_cluster::ReassertRecord {
            requested_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            replica: self.replica.clone(),
            reason: regression.to_string(),
        };
        let key = keys.reassert();
        let txn = corral_kv::Txn {
            compares: vec![],
            success: vec![corral_kv::TxnOp::put(
                key.clone(),
                corral_cluster::encode_value(&record).unwrap_or_default(),
            )],
            failure: vec![],
        };
        match kv.txn(fence.guard(txn)).await {
            Ok(response) if response.succeeded => {
                self.resolve("etcd", &key);
                self.reasserted(response.revision);
            }
            // Not leading any more: the next leader asks.
            Ok(_) => {}
            Err(error) => self.raise("etcd", &key, format!("{key}: not written: {error}")),
        }
    }

    /// Raises or ends the problem of the epoch's memory file by how writing it went.
    fn note_memory_written(&self, path: &std::path::Path, written: std::io::Result<()>) {
        let subject = path.display().to_string();
        match written {
            Ok(()) => self.resolve("epoch", &subject),
            Err(error) => self.raise("epoch", &subject, format!("writing {subject}: {error}")),
        }
    }

    /// `corral cluster recover --yes`: granting resumes at once, whatever is owed.
    pub fn request_recover(&self) -> Option<Regression> {
        let mut state = self.epoch();
        state.recover = true;
        state.kept.memory.unsettled
    }

    /// Whether etcd went back in time and granting has not resumed since: nothing that gives
    /// space back or takes more (the cloud node manager's mutations) runs meanwhile.
    pub fn regression_unsettled(&self) -> bool {
        self.epoch().kept.memory.unsettled.is_some()
    }

    /// Why granting is paused now, if it is.
    pub fn granting_paused(&self) -> Option<String> {
        self.epoch().paused.clone()
    }

    /// Regressions this process saw.
    pub fn regressions(&self) -> u64 {
        self.epoch().regressions
    }

    /// When the wait for assertions ends by itself (to look again then), if one is on.
    pub fn epoch_wake(&self) -> Option<Instant> {
        let state = self.epoch();
        state.paused.as_ref()?;
        let regression = state
            .kept
            .memory
            .unsettled
            .map(|_| state.since.unwrap_or_else(Instant::now) + state.settle);
        regression.or(state.term_deadline)
    }

    /// Whether the leader may grant now (judged on its view); logs when granting resumes.
    /// O(1) once nothing is owed; O(nodes) while a wait is on.
    pub fn may_grant(&self, view: &ClusterView) -> bool {
        let now = Instant::now();
        let mut state = self.epoch();
        let mut resumed = None;
        if let Some(regression) = state.kept.memory.unsettled {
            let since = *state.since.get_or_insert(now);
            // Assertions count from the `reassert` this term put (before it is written, from
            // the revision the regression was seen at).
            let from = state.reasserted.unwrap_or(regression.found.revision);
            let mut owed = assertions_owed(view, from);
            // etcd may have forgotten registrations (a restore, a wipe): the nodes of the view
            // this replica led with up to the regression owe an assertion too. A replica with
            // no such view cannot know who may hold space: only the settle time or `recover`
            // ends its wait.
            let known_before = state.known_before.as_ref().map(|nodes| {
                let asserted = |node: &corral_cluster::NodeName| {
                    view.holdings_of(node)
                        .is_some_and(|e| e.record.is_some() && e.mod_revision > from)
                };
                let listed: std::collections::BTreeSet<_> = owed.iter().cloned().collect();
                owed.extend(
                    nodes
                        .iter()
                        .filter(|n| !listed.contains(*n) && !asserted(n))
                        .cloned(),
                );
            });
            let why = if state.recover {
                Some("`corral cluster recover --yes` asked for it".to_owned())
            } else if owed.is_empty() && known_before.is_some() {
                Some("every live agent asserted what it holds".to_owned())
            } else if now >= since + state.settle {
                Some(format!(
                    "the settle time ({}s) passed; not asserted: {}",
                    state.settle.as_secs(),
                    names(&owed)
                ))
            } else {
                None
            };
            match why {
                Some(why) => {
                    state.kept.settle();
                    state.since = None;
                    state.known_before = None;
                    state.recover = false;
                    state.term_deadline = None;
                    resumed = Some(format!(
                        "granting resumes after {}: {why}",
                        regression_short(&regression)
                    ));
                }
                None => {
                    state.paused = Some(format!(
                        "granting stopped: {regression}; waiting for {} node(s) to assert \
                         what they hold ({}){}, at most {}s more, or `corral cluster recover --yes`",
                        owed.len(),
                        names(&owed),
                        if known_before.is_none() {
                            " and for the settle time (this replica did not lead up to the \
                             regression: it cannot know every node that may hold space)"
                        } else {
                            ""
                        },
                        (since + state.settle)
                            .saturating_duration_since(now)
                            .as_secs()
                    ));
                    return false;
                }
            }
        }
        if let Some(deadline) = state.term_deadline {
            let owed = assertions_owed(view, 0);
            if owed.is_empty() || now >= deadline || state.recover {
                state.term_deadline = None;
                if state.paused.is_some() && !owed.is_empty() {
                    resumed = Some(format!(
                        "granting starts: the settle time ({}s) passed; no holdings from: {}",
                        state.settle.as_secs(),
                        names(&owed)
                    ));
                }
            } else {
                state.paused = Some(format!(
                    "a new term waits for {} live node(s) to assert what they hold ({}), at most \
                     {}s more",
                    owed.len(),
                    names(&owed),
                    deadline.saturating_duration_since(now).as_secs()
                ));
                return false;
            }
        }
        state.paused = None;
        let save = state.kept.due(std::time::Instant::now());
        let path = state.path.clone();
        drop(state);
        if let (Some(memory), Some(path)) = (save, path) {
            self.note_memory_written(&path, write_atomically(&path, &memory.to_json()));
        }
        if let Some(resumed) = resumed {
            self.note_problem(resumed);
        }
        true
    }

    /// The epoch's metrics, in the text format.
    pub fn epoch_metrics_text(&self) -> String {
        let state = self.epoch();
        format!(
            "# HELP corral_operator_etcd_regressions etcd going back in time, as this replica saw it (a lower revision or another cluster ID).\n\
             # TYPE corral_operator_etcd_regressions counter\n\
             corral_operator_etcd_regressions_total {}\n\
             # HELP corral_operator_granting_paused Whether granting waits for the agents' assertions (after a regression, or a new term).\n\
             # TYPE corral_operator_granting_paused gauge\n\
             corral_operator_granting_paused {}\n\
             # HELP corral_operator_etcd_revision_seen The highest etcd revision this replica saw (what a restore is told by).\n\
             # TYPE corral_operator_etcd_revision_seen gauge\n\
             corral_operator_etcd_revision_seen {}\n",
            state.regressions,
            u8::from(state.paused.is_some()),
            state.kept.memory.floor(),
        )
    }
}

fn names(nodes: &[corral_cluster::NodeName]) -> String {
    const SHOWN: usize = 10;
    let mut text = nodes
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if nodes.len() > SHOWN {
        text.push_str(&format!(" and {} more", nodes.len() - SHOWN));
    }
    text
}

fn regression_short(regression: &Regression) -> String {
    format!(
        "etcd went back in time (revision {} after {})",
        regression.found.revision, regression.remembered.revision
    )
}

/// The holdings the view counts without a grant, and node IDs served without one: current
/// status problems, one sentence each.
pub fn holdings_problems(view: &ClusterView) -> Vec<String> {
    let mut problems: Vec<String> = view
        .uncovered_holdings()
        .into_iter()
        .map(|(node, pool, cidr)| {
            format!(
                "node {node} holds {cidr} of pool {pool} without a grant: kept occupied until \
                 it is given up or granted back"
            )
        })
        .collect();
    problems.extend(view.uncovered_node_ids().into_iter().map(|(node, id)| {
        format!("node {node} serves node ID {id} without its grant: kept occupied")
    }));
    problems
}

/// The holdings metrics, in the text format.
pub fn holdings_metrics_text(view: &ClusterView) -> String {
    format!(
        "# HELP corral_operator_uncovered_holdings Ranges an agent asserts it holds that no grant to it covers (kept occupied).\n\
         # TYPE corral_operator_uncovered_holdings gauge\n\
         corral_operator_uncovered_holdings {}\n\
         # HELP corral_operator_uncovered_node_ids Node IDs an agent serves without their grant (kept occupied).\n\
         # TYPE corral_operator_uncovered_node_ids gauge\n\
         corral_operator_uncovered_node_ids {}\n",
        view.uncovered_holdings().len(),
        view.uncovered_node_ids().len(),
    )
}
