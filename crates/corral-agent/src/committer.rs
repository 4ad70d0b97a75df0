//! The group commit. Requests queue; a *leader* takes everything queued as one batch,
//! applies it, commits it with one fsync, and only then answers each request. Under load the
//! batches grow, so the cost of the fsync is shared by every request that arrived while the
//! previous batch ran.
//!
//! Who leads: the committer's own thread, except that a quick request (an allocation, a
//! release, a CNI verb) that finds nobody leading commits a batch of quick requests (its own
//! first) right on the runtime thread that parsed it. A lone request so pays no hand-off to
//! another thread and back (two wake-ups, ~70 µs of its ~0.3 ms on the 2-vCPU machine of
//! BENCHMARKS.md). If requests queued meanwhile, that caller hands the lead to the
//! committer's thread before answering, and the thread runs batches back to back until the
//! queue is empty: a runtime thread is blocked for at most one batch of quick requests, and
//! only when the agent was idle.
//!
//! Tests on tokio's paused clock use `Committer::start_inline` (feature `testing`): no
//! thread, the caller that takes the lead runs every batch, so no commit is ever in progress
//! off the runtime while its clock jumps ahead.
//!
//! Invariants: at most one leader at a time, and only the leader touches the [`NodeState`](crate::node::NodeState);
//! while the queue holds a job there is a leader, so every job is answered.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;

use corral_api::ErrorCode;
use tokio::sync::oneshot;

use crate::node::{Op, OpError, Reply, Request, RunBatch};

/// The most operations in one batch (one transaction).
const MAX_BATCH: usize = 1024;

/// A handle to the group commit; cheap to clone. When the last clone is dropped the
/// committer closes (as [`Committer::close`]), so its store is never left open.
#[derive(Clone, Debug)]
pub struct Committer {
    owner: Arc<Owner>,
}

/// What the clones of a [`Committer`] share; the committer's thread holds only [`Shared`],
/// so dropping the last clone reaches [`Owner`]'s `Drop`.
#[derive(Debug)]
struct Owner {
    shared: Arc<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.shared.close();
    }
}

#[derive(Debug)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when the committer's thread is given the lead, and on close.
    lead_given: Condvar,
    /// `None` once [`Committer::close`] has closed the store.
    node: Mutex<Option<Box<dyn RunBatch>>>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
    /// No committer's thread (tests on a paused clock, see [`Committer::start_inline`]): the
    /// caller that finds nobody leading runs every batch queued, quick or not.
    inline: bool,
}

#[derive(Debug, Default)]
struct Queue {
    jobs: VecDeque<Job>,
    leader: Leader,
    /// [`Committer::close`] was called: nothing new is accepted.
    closed: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Leader {
    #[default]
    Nobody,
    /// A caller is committing on its own thread.
    Caller,
    /// The committer's thread.
    Thread,
}

struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Reply, OpError>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("op", &self.op).finish()
    }
}

fn stopped() -> OpError {
    OpError::new(ErrorCode::RetryLater, "the agent's committer has stopped")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A leader that panics (a bug) is handled by `Leading`; every step under these locks
    // leaves the data consistent, so poisoning is ignored.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Committer {
    /// Takes charge of `node` and starts the committer's thread; [`Committer::close`]
    /// stops it and closes the store.
    pub fn start(node: impl RunBatch + 'static) -> std::io::Result<Committer> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            lead_given: Condvar::new(),
            node: Mutex::new(Some(Box::new(node))),
            thread: Mutex::new(None),
            inline: false,
        });
        let thread = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("corral-committer".into())
                .spawn(move || shared.run_thread())?
        };
        *lock(&shared.thread) = Some(thread);
        Ok(Committer {
            owner: Arc::new(Owner { shared }),
        })
    }

    /// Takes charge of `node` with no thread of its own: whoever submits while nobody leads
    /// runs every batch queued on its own (runtime) thread. For tests on tokio's paused
    /// clock, which advances whenever the runtime is idle, so a batch must never be in
    /// progress on another thread; `node` must therefore not block (a `MemoryStore`).
    #[cfg(feature = "testing")]
    pub fn start_inline(node: impl RunBatch + 'static) -> Committer {
        Committer {
            owner: Arc::new(Owner {
                shared: Arc::new(Shared {
                    queue: Mutex::new(Queue::default()),
                    lead_given: Condvar::new(),
                    node: Mutex::new(Some(Box::new(node))),
                    thread: Mutex::new(None),
                    inline: true,
                }),
            }),
        }
    }

    /// Runs one operation and waits until it is durable.
    /// Runs `request` and hands back its answer: [`Committer::submit`], typed by the request,
    /// so the caller never sees a [`Reply`]. A reply of another kind than the request's (a
    /// bug in the node state) is an internal error.
    pub async fn call<R: Request>(&self, request: R) -> Result<R::Answer, OpError> {
        let reply = self.submit(request.into_op()).await?;
        R::answer(reply).map_err(|other| {
            OpError::new(
                ErrorCode::RetryLater,
                format!("internal: the node state answered {other:?}"),
            )
        })
    }

    pub async fn submit(&self, op: Op) -> Result<Reply, OpError> {
        let quick = op.is_quick();
        let (reply, answer) = oneshot::channel();
        {
            let shared = &self.owner.shared;
            let mut queue = lock(&shared.queue);
            if queue.closed {
                return Err(stopped());
            }
            queue.jobs.push_back(Job { op, reply });
            if queue.leader == Leader::Nobody {
                if quick || shared.inline {
                    queue.leader = Leader::Caller;
                    drop(queue);
                    shared.lead_once();
                } else {
                    queue.leader = Leader::Thread;
                    shared.lead_given.notify_one();
                }
            }
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Stops accepting operations, lets the committer's thread finish what is queued (a
    /// caller leading its one batch finishes it too; jobs it would hand on are answered with
    /// an error), stops the thread and closes the store. Blocks for at most those batches.
    pub fn close(&self) {
        self.owner.shared.close();
    }
}

/// Clears the lead if a leader panics (a bug): queued callers are answered with an error and
/// nothing more is accepted, so no caller waits for a leader that will never come.
struct Leading<'a> {
    shared: &'a Shared,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            let mut queue = lock(&self.shared.queue);
            queue.closed = true;
            queue.leader = Leader::Nobody;
            for job in queue.jobs.drain(..) {
                let _ = job.reply.send(Err(stopped()));
            }
        }
    }
}

impl Shared {
    fn close(&self) {
        lock(&self.queue).closed = true;
        self.lead_given.notify_one();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
        // A caller may be leading its one batch: this waits for it.
        let node = lock(&self.node).take();
        drop(node);
    }

    /// Takes up to [`MAX_BATCH`] queued jobs (with `quick_only`, only the quick ones at the
    /// front of the queue), commits them, and answers them.
    fn run_batch(&self, quick_only: bool) {
        let batch: Vec<Job> = {
            let mut queue = lock(&self.queue);
            let n = if quick_only {
                queue
                    .jobs
                    .iter()
                    .take(MAX_BATCH)
                    .take_while(|job| job.op.is_quick())
                    .count()
            } else {
                queue.jobs.len().min(MAX_BATCH)
            };
            queue.jobs.drain(..n).collect()
        };
        let (ops, replies): (Vec<Op>, Vec<_>) =
            batch.into_iter().map(|job| (job.op, job.reply)).unzip();
        let answers = match lock(&self.node).as_mut() {
            Some(node) => node.run_batch(ops),
            None => ops.iter().map(|_| Err(stopped())).collect(),
        };
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A caller that went away no longer needs its answer; the change stands.
            let _ = reply.send(answer);
        }
    }

    /// A caller's turn as leader: one batch of quick jobs (its own is the first: the queue
    /// was empty when it took the lead), then the lead goes to the committer's thread if
    /// more is queued. A slow job that queued meanwhile is thus never run on the caller's
    /// runtime thread.
    fn lead_once(&self) {
        let _leading = Leading { shared: self };
        self.run_batch(true);
        let mut queue = lock(&self.queue);
        if queue.jobs.is_empty() {
            queue.leader = Leader::Nobody;
        } else if queue.closed {
            // The committer's thread may have ended already.
            queue.leader = Leader::Nobody;
            for job in queue.jobs.drain(..) {
                let _ = job.reply.send(Err(stopped()));
            }
        } else if self.inline {
            // No thread to hand the lead to: this caller runs what is queued, slow jobs too.
            drop(queue);
            loop {
                self.run_batch(false);
                let mut queue = lock(&self.queue);
                if queue.jobs.is_empty() {
                    queue.leader = Leader::Nobody;
                    break;
                }
            }
        } else {
            queue.leader = Leader::Thread;
            self.lead_given.notify_one();
        }
    }

    /// The committer's thread: waits for the lead, then runs batches until the queue is
    /// empty; ends on close once nothing is queued.
    fn run_thread(&self) {
        let _leading = Leading { shared: self };
        loop {
            {
                let mut queue = lock(&self.queue);
                while queue.leader != Leader::Thread && !queue.closed {
                    queue = self
                        .lead_given
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if queue.leader != Leader::Thread {
                    // Closed, and a caller (if any) still leads its last batch.
                    return;
                }
                if queue.jobs.is_empty() {
                    queue.leader = Leader::Nobody;
                    if queue.closed {
                        return;
                    }
                    continue;
                }
            }
            self.run_batch(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::IpAddr;
    use std::path::Path;

    use corral_api as api;
    use corral_store::{ScopeConfig, SqliteStore};

    use super::*;
    use crate::node::testing::{attachment, cni_add, cni_network};

    fn network() -> api::CniNetwork {
        cni_network("10.5.0.0/24", 0)
    }

    fn key(container: &str) -> api::AttachmentKey {
        attachment("net", container)
    }

    fn add(container: &str) -> Op {
        cni_add(network(), container)
    }

    fn del(container: &str) -> Op {
        Op::CniDel(
            api::CniKeyRequest {
                network: network(),
                key: key(container),
            }
            .try_into()
            .unwrap(),
        )
    }

    fn held(committer: &Committer, runtime: &tokio::runtime::Runtime) -> usize {
        match runtime.block_on(committer.submit(Op::Dump(Some("net".into())))) {
            Ok(Reply::Dump(dump)) => dump
                .scopes
                .iter()
                .flat_map(|s| &s.pools)
                .map(|p| p.allocations.len())
                .sum(),
            other => panic!("{other:?}"),
        }
    }

    fn start(dir: &Path) -> Committer {
        let store = SqliteStore::open_owned(dir, Path::new("/x.sock")).unwrap();
        Committer::start(crate::node::NodeState::restore(store, &ScopeConfig::default()).unwrap())
            .unwrap()
    }

    /// Runs `test` on a thread of its own and fails if it takes more than 60 s: a caller
    /// left without a leader waits forever, and that must fail the test, not hang it.
    fn bounded(test: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        let thread = thread::spawn(move || {
            test();
            let _ = done.send(());
        });
        match finished.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(()) => thread.join().unwrap(),
            // The test panicked: report its panic.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::panic::resume_unwind(thread.join().unwrap_err())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("a caller is still waiting after 60 s")
            }
        }
    }

    /// Many callers at once, on both kinds of runtime: each is answered once, with its own
    /// address; quick and slow operations mix; what was answered is what a restart finds.
    #[test]
    fn concurrent_callers_are_each_answered_and_durable() {
        bounded(concurrent_callers);
    }

    fn concurrent_callers() {
        for multi_thread in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let runtime = if multi_thread {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .build()
            } else {
                tokio::runtime::Builder::new_current_thread().build()
            }
            .unwrap();
            let committer = start(dir.path());
            let tasks: Vec<_> = (0..48)
                .map(|i| {
                    let committer = committer.clone();
                    runtime.spawn(async move {
                        let added = committer.submit(add(&format!("c{i}"))).await;
                        // A slow (non-quick) operation among the quick ones.
                        committer.submit(Op::Status(None)).await.unwrap();
                        if i % 2 == 1 {
                            committer.submit(del(&format!("c{i}"))).await.unwrap();
                        }
                        match added {
                            Ok(Reply::Allocated(a)) => a.allocations[0].address,
                            other => panic!("{other:?}"),
                        }
                    })
                })
                .collect();
            let addresses: BTreeSet<IpAddr> = tasks
                .into_iter()
                .map(|t| runtime.block_on(t).unwrap())
                .collect();
            assert_eq!(addresses.len(), 48, "every caller got its own address");
            assert_eq!(held(&committer, &runtime), 24);
            committer.close();
            let reopened = start(dir.path());
            assert_eq!(
                held(&reopened, &runtime),
                24,
                "multi_thread: {multi_thread}"
            );
            reopened.close();
        }
    }

    /// A caller leading on its runtime thread takes only the quick jobs at the front of the
    /// queue: a slow one that queued behind it is left for the committer's thread.
    #[test]
    fn a_caller_leads_only_quick_jobs() {
        bounded(|| {
            let dir = tempfile::tempdir().unwrap();
            let committer = start(dir.path());
            let shared = &committer.owner.shared;
            let mut answers = Vec::new();
            {
                let mut queue = lock(&shared.queue);
                // Held as if a caller led, so the committer's thread stays out of it.
                queue.leader = Leader::Caller;
                for op in [add("a"), add("b"), Op::Status(None), add("c")] {
                    let (reply, answer) = oneshot::channel();
                    queue.jobs.push_back(Job { op, reply });
                    answers.push(answer);
                }
            }
            shared.run_batch(true);
            assert_eq!(lock(&shared.queue).jobs.len(), 2, "status and what follows");
            for (i, answer) in answers.iter_mut().enumerate() {
                assert_eq!(answer.try_recv().is_ok(), i < 2, "job {i}");
            }
            shared.run_batch(false);
            assert!(lock(&shared.queue).jobs.is_empty());
            lock(&shared.queue).leader = Leader::Nobody;
            committer.close();
        });
    }

    /// Inline (tests on a paused clock): no thread; quick and slow jobs from many tasks are
    /// all answered, each run by a caller on the runtime.
    #[cfg(feature = "testing")]
    #[test]
    fn an_inline_committer_answers_every_job_without_a_thread() {
        bounded(|| {
            let store = corral_store::MemoryStore::new();
            let node =
                crate::node::NodeState::restore(store.clone(), &ScopeConfig::default()).unwrap();
            let committer = Committer::start_inline(node);
            assert!(lock(&committer.owner.shared.thread).is_none());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let tasks: Vec<_> = (0..16)
                .map(|i| {
                    let committer = committer.clone();
                    runtime.spawn(async move {
                        committer.submit(Op::Status(None)).await.unwrap();
                        committer.submit(add(&format!("c{i}"))).await.unwrap();
                    })
                })
                .collect();
            for task in tasks {
                runtime.block_on(task).unwrap();
            }
            assert_eq!(held(&committer, &runtime), 16);
            committer.close();
            assert!(store.commits() > 0);
        });
    }

    /// Dropping every handle closes the store too, so another owner can take the directory.
    #[test]
    fn dropping_the_last_handle_closes_the_store() {
        bounded(|| {
            let dir = tempfile::tempdir().unwrap();
            let committer = start(dir.path());
            let other = committer.clone();
            drop(committer);
            // One handle is left: the directory is still held.
            assert!(SqliteStore::open_owned(dir.path(), Path::new("/y.sock")).is_err());
            drop(other);
            SqliteStore::open_owned(dir.path(), Path::new("/y.sock")).unwrap();
        });
    }

    /// After close nothing is accepted, and the store is closed (another owner may open it).
    #[test]
    fn a_closed_committer_refuses_and_frees_the_directory() {
        bounded(closed_committer);
    }

    fn closed_committer() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let committer = start(dir.path());
        runtime.block_on(committer.submit(add("a"))).unwrap();
        committer.close();
        for op in [add("b"), Op::Status(None)] {
            let refused = runtime.block_on(committer.submit(op)).unwrap_err();
            assert_eq!(refused.code, ErrorCode::RetryLater);
        }
        let next = start(dir.path());
        assert_eq!(held(&next, &runtime), 1);
        next.close();
    }
}
