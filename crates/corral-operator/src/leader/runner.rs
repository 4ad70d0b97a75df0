//! The reconcile runner every loop of the leader stands on: the leading loop (grants, removals,
//! drains, block pools), the cloud node manager, the to-cloud delegations and the node CIDR
//! sync from the cloud.
//!
//! A loop is a [`Reconciler`]: it says what to start on a turn, what to wait for besides its
//! tasks (a signal, a watch, timers of its own), and what a finished task means. The
//! [`Runner`] keeps what every loop needs the same way:
//!
//! - the tasks in flight (a `JoinSet`), at most `workers` of them when the reconciler asks
//!   [`Runner::is_full`] before it starts one; a task about one key runs in that key's span
//!   (`node{node=NAME}`), one about several in a `nodes` span, so its events name them;
//! - the busy set: a key (a node) has at most one task in flight; it is busy from
//!   [`Runner::spawn`] until its task's result is handed to [`Reconciler::finish`];
//! - per key, when it may be tried again and its backoff ([`RetryState`], nodeipam's timing:
//!   `InitialRetry` doubling to `MaxBackoff`). A key that waits is not due
//!   ([`Runner::is_due`]); once its time comes, the runner hands it back to
//!   [`Reconciler::due`] and keeps its backoff, so a failure again waits longer.
//!
//! [`run`] is the one loop: hand back the keys whose wait ran out, let the reconciler take its
//! turn, then sleep until a task ends, a wait runs out or the reconciler's own wake-up comes.
//! It ends when one of the reconciler's calls answers `Err(end)`. Keys are ordered (`Ord`,
//! kept in B-tree maps), so due keys come back in one order, and its `select!` is `biased`, so a
//! seeded run on a paused clock repeats itself exactly.
//!
//! The managers beside the leading loop (the cloud node manager, the to-cloud delegations) share
//! one more shape, [`NodeManager`]: woken by the nodes the leading loop's events concern
//! ([`PendingNodes`]) or by timers of their own, their keys are nodes, and a node whose wait
//! ran out joins their `pending` set. [`manage`] runs one.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use corral_cluster::{NodeName, Resync, RetryState};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::pending::PendingNodes;

/// One loop of the leader, driven by [`run`]. Every call answers `Err(end)` to end the loop.
pub(crate) trait Reconciler {
    /// What a task is about: one at a time per key.
    type Key: Clone + Ord + Send + 'static;
    /// What a finished task hands back.
    type Done: Send + 'static;
    /// What [`Reconciler::wait`] woke for.
    type Wake;
    /// Why the loop ended.
    type End;

    /// Starts what is due (asking [`Runner::is_full`] and [`Runner::is_due`] first).
    async fn turn(&mut self, runner: &mut Runner<Self::Key, Self::Done>) -> Result<(), Self::End>;

    /// Waits for what the reconciler follows besides its tasks and its keys' waits (a signal,
    /// a watch, timers of its own). Dropped unfinished when a task ends first: it must lose
    /// nothing then (cancel safe).
    async fn wait(&mut self) -> Self::Wake;

    /// Takes in what [`Reconciler::wait`] woke for.
    async fn woke(
        &mut self,
        runner: &mut Runner<Self::Key, Self::Done>,
        wake: Self::Wake,
    ) -> Result<(), Self::End>;

    /// Takes in a finished task (its keys are no longer busy).
    async fn finish(
        &mut self,
        runner: &mut Runner<Self::Key, Self::Done>,
        done: Self::Done,
    ) -> Result<(), Self::End>;

    /// Keys whose wait ran out: they may be tried again (their backoff is kept).
    fn due(&mut self, keys: Vec<Self::Key>);
}

/// Runs `reconciler` until one of its calls ends the loop.
pub(crate) async fn run<R: Reconciler>(
    reconciler: &mut R,
    runner: &mut Runner<R::Key, R::Done>,
) -> R::End {
    loop {
        let due = runner.take_due(Instant::now());
        if !due.is_empty() {
            reconciler.due(due);
        }
        if let Err(end) = reconciler.turn(runner).await {
            return end;
        }
        let next_due = runner.next_due();
        // In a fixed order (`biased`), so a seeded run on a paused clock repeats itself: a
        // finished task first (tasks are bounded by `workers`, so the others are not starved),
        // then the reconciler's own wake-up, then the keys' waits.
        let flow = tokio::select! {
            biased;
            Some(done) = runner.join_next(), if runner.in_flight() > 0 => match done {
                Some(done) => reconciler.finish(runner, done).await,
                // A task that panicked hands back nothing (its keys stay busy).
                None => Ok(()),
            },
            wake = reconciler.wait() => reconciler.woke(runner, wake).await,
            () = sleep_until(next_due) => Ok(()),
        };
        if let Err(end) = flow {
            return end;
        }
    }
}

/// A manager of nodes beside the leading loop, run by [`manage`].
pub(crate) trait NodeManager {
    /// What a finished task hands back.
    type Done: Send + 'static;

    /// Takes the signal and starts what is due; `None` when the view is gone (leading ended).
    fn turn(&mut self, runner: &mut Runner<NodeName, Self::Done>) -> Option<()>;

    /// Takes in a finished task.
    fn finish(&mut self, runner: &mut Runner<NodeName, Self::Done>, done: Self::Done);

    /// When its own timers are next due (a resync, a collector run); the runner keeps the
    /// nodes' waits.
    fn next_wake(&self) -> Instant;

    /// The nodes the leading loop's events concern, and the wake-up that goes with them.
    fn signal(&self) -> &PendingNodes;

    /// The nodes to look at on the next turn.
    fn pending(&mut self) -> &mut BTreeSet<NodeName>;
}

/// Runs `manager` with at most `workers` tasks at once, until the view is gone.
pub(crate) async fn manage<M: NodeManager>(manager: M, workers: usize) {
    run(&mut Managed(manager), &mut Runner::new(workers)).await;
}

/// A [`NodeManager`] as a [`Reconciler`].
struct Managed<M>(M);

impl<M: NodeManager> Reconciler for Managed<M> {
    type Key = NodeName;
    type Done = M::Done;
    type Wake = ();
    type End = ();

    async fn turn(&mut self, runner: &mut Runner<NodeName, M::Done>) -> Result<(), ()> {
        self.0.turn(runner).ok_or(())
    }

    async fn wait(&mut self) {
        let wake = self.0.next_wake();
        tokio::select! {
            biased;
            () = self.0.signal().notified() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }

    async fn woke(&mut self, _: &mut Runner<NodeName, M::Done>, (): ()) -> Result<(), ()> {
        Ok(())
    }

    async fn finish(
        &mut self,
        runner: &mut Runner<NodeName, M::Done>,
        done: M::Done,
    ) -> Result<(), ()> {
        self.0.finish(runner, done);
        Ok(())
    }

    fn due(&mut self, nodes: Vec<NodeName>) {
        self.0.pending().extend(nodes);
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A key's place in line.
#[derive(Debug, Default)]
struct Wait {
    /// Not tried before then; `None` once that time came (the key was handed back as due).
    at: Option<Instant>,
    backoff: RetryState,
}

/// The tasks in flight, the busy keys, and each key's wait and backoff (see the module doc).
pub(crate) struct Runner<K, D> {
    running: JoinSet<(Vec<K>, D)>,
    busy: BTreeSet<K>,
    waits: BTreeMap<K, Wait>,
    workers: usize,
}

impl<K: Clone + Ord + Send + 'static, D: Send + 'static> Runner<K, D> {
    /// A runner that lets `workers` tasks run at once (at least one).
    pub(crate) fn new(workers: usize) -> Self {
        Runner {
            running: JoinSet::new(),
            busy: BTreeSet::new(),
            waits: BTreeMap::new(),
            workers: workers.max(1),
        }
    }

    /// The tasks allowed at once.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// Tasks in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.running.len()
    }

    /// `workers` tasks are in flight: start no more.
    pub(crate) fn is_full(&self) -> bool {
        self.running.len() >= self.workers
    }

    /// A task about `key` is in flight.
    pub(crate) fn is_busy(&self, key: &K) -> bool {
        self.busy.contains(key)
    }

    /// The keys with a task in flight.
    pub(crate) fn busy(&self) -> impl Iterator<Item = &K> {
        self.busy.iter()
    }

    /// `key` waits past `now` (a backoff, a wait asked for).
    pub(crate) fn is_waiting(&self, key: &K, now: Instant) -> bool {
        self.waits
            .get(key)
            .is_some_and(|w| w.at.is_some_and(|at| at > now))
    }

    /// `key` may be tried now: not busy, not waiting.
    pub(crate) fn is_due(&self, key: &K, now: Instant) -> bool {
        !self.is_busy(key) && !self.is_waiting(key, now)
    }

    /// Starts `task` about `keys` (none for a task about no key: a resync, a collector run);
    /// they are busy until its result is handed back.
    pub(crate) fn spawn(
        &mut self,
        keys: impl IntoIterator<Item = K>,
        task: impl Future<Output = D> + Send + 'static,
    ) where
        K: std::fmt::Display,
    {
        let keys: Vec<K> = keys.into_iter().collect();
        self.busy.extend(keys.iter().cloned());
        let span = match keys.as_slice() {
            [] => tracing::Span::current(),
            [key] => tracing::info_span!("node", node = %key),
            more => tracing::info_span!("nodes", nodes = more.len()),
        };
        self.running
            .spawn(async move { (keys, task.await) }.instrument(span));
    }

    /// The next finished task (its keys no longer busy); `Some(None)` for a task that panicked.
    pub(crate) async fn join_next(&mut self) -> Option<Option<D>> {
        match self.running.join_next().await? {
            Ok((keys, done)) => {
                for key in &keys {
                    self.busy.remove(key);
                }
                Some(Some(done))
            }
            Err(_) => Some(None),
        }
    }

    /// Waits for every task in flight, handing each result to `each`; then nothing is busy.
    pub(crate) async fn drain(&mut self, mut each: impl FnMut(D)) {
        while let Some(done) = self.join_next().await {
            if let Some(done) = done {
                each(done);
            }
        }
        self.busy.clear();
    }

    /// `key` failed: it waits its backoff (`timing`), longer after each failure in a row.
    pub(crate) fn back_off(&mut self, key: &K, timing: &Resync) {
        let wait = self.waits.entry(key.clone()).or_default();
        let delay = wait.backoff.error(timing);
        wait.at = Some(Instant::now() + delay);
    }

    /// `key` waits `delay` without counting a failure (an intent not settled yet).
    pub(crate) fn wait(&mut self, key: &K, delay: Duration) {
        self.waits.entry(key.clone()).or_default().at = Some(Instant::now() + delay);
    }

    /// `key` is handed back by `at` at the latest (an earlier wait is kept).
    pub(crate) fn come_back_by(&mut self, key: &K, at: Instant) {
        let wait = self.waits.entry(key.clone()).or_default();
        wait.at = Some(wait.at.map_or(at, |t| t.min(at)));
    }

    /// `key` succeeded: its backoff starts over (a wait it was given stays).
    pub(crate) fn reset_backoff(&mut self, key: &K) {
        if let Some(wait) = self.waits.get_mut(key) {
            wait.backoff = RetryState::default();
        }
    }

    /// Nothing of `key` is kept: no wait, no backoff.
    pub(crate) fn forget(&mut self, key: &K) {
        self.waits.remove(key);
    }

    /// Nothing of any key is kept.
    pub(crate) fn forget_all(&mut self) {
        self.waits.clear();
    }

    /// Every key may be tried now (their backoffs are kept): something changed that may make
    /// a failure succeed.
    pub(crate) fn end_waits(&mut self) {
        for wait in self.waits.values_mut() {
            wait.at = None;
        }
    }

    /// The keys whose wait ran out by `now`; their backoffs are kept.
    fn take_due(&mut self, now: Instant) -> Vec<K> {
        let mut due = Vec::new();
        for (key, wait) in &mut self.waits {
            if wait.at.is_some_and(|at| at <= now) {
                wait.at = None;
                due.push(key.clone());
            }
        }
        due
    }

    /// When the next wait runs out.
    fn next_due(&self) -> Option<Instant> {
        self.waits.values().filter_map(|w| w.at).min()
    }
}

/// Runs `tasks` with at most `workers` at once and answers their results, in the order they
/// finished (a task that panicked is left out).
pub(crate) async fn all_bounded<T: Send + 'static>(
    workers: usize,
    tasks: impl IntoIterator<Item = impl Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let mut running = JoinSet::new();
    let mut results = Vec::new();
    for task in tasks {
        if running.len() >= workers.max(1)
            && let Some(Ok(done)) = running.join_next().await
        {
            results.push(done);
        }
        running.spawn(task);
    }
    while let Some(done) = running.join_next().await {
        if let Ok(done) = done {
            results.push(done);
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_is_busy_while_its_task_runs_and_waits_its_backoff_after() {
        let mut runner: Runner<&'static str, u32> = Runner::new(1);
        let start = Instant::now();
        runner.spawn(["a"], async { 7 });
        assert!(runner.is_full());
        assert!(!runner.is_due(&"a", start));
        assert_eq!(runner.join_next().await, Some(Some(7)));
        assert!(runner.is_due(&"a", start));
        let timing = Resync::default();
        runner.back_off(&"a", &timing);
        assert!(!runner.is_due(&"a", start));
        let first = runner.next_due().unwrap();
        tokio::time::sleep_until(first).await;
        assert_eq!(runner.take_due(Instant::now()), vec!["a"]);
        assert!(runner.is_due(&"a", Instant::now()));
        // The backoff was kept: the next failure waits longer.
        runner.back_off(&"a", &timing);
        assert!(runner.next_due().unwrap() - Instant::now() > first - start);
        runner.reset_backoff(&"a");
        runner.end_waits();
        assert_eq!(runner.next_due(), None);
    }
}
