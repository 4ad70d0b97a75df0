//! The group commit: one thread owns the [`Host`]; requests queue on a channel, and the thread
//! takes everything queued as one batch, applies it, commits it with one fsync, and only then
//! answers each request. Under load the batches grow, so the cost of the fsync is shared by
//! every request that arrived while the previous one ran.

use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use crate::host::{Host, Op, OpError, Reply};

/// The most operations in one batch (one transaction).
const MAX_BATCH: usize = 1024;

struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Reply, OpError>>,
}

/// A handle to the committer thread; cheap to clone.
#[derive(Clone, Debug)]
pub struct Committer {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("op", &self.op).finish()
    }
}

impl Committer {
    /// Starts the thread that owns `host`; it ends (closing the store) when every handle
    /// is dropped.
    pub fn start(host: Host) -> std::io::Result<(Committer, thread::JoinHandle<()>)> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = thread::Builder::new()
            .name("corral-committer".into())
            .spawn(move || run(host, queue))?;
        Ok((Committer { jobs }, thread))
    }

    /// Runs one operation and waits until it is durable.
    pub async fn submit(&self, op: Op) -> Result<Reply, OpError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || {
            OpError::new(
                corral_api::ErrorCode::RetryLater,
                "the agent's committer has stopped",
            )
        };
        self.jobs.send(Job { op, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn run(mut host: Host, queue: mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let (ops, replies): (Vec<Op>, Vec<_>) =
            batch.into_iter().map(|job| (job.op, job.reply)).unzip();
        let answers = host.run_batch(ops);
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A caller that went away no longer needs its answer; the change stands.
            let _ = reply.send(answer);
        }
    }
}
