//! The group commit: a batch of operations applied to the engines, then made durable in one
//! transaction before any answer is given.

use corral_store::Store;

use super::op::{Import, Op, Reply, Request};
use super::request::Gc;
use super::scope::{Changes, persist};
use super::state::{Clock, NodeState};
use crate::capacity;
use crate::error::OpError;
use corral_api as api;

impl<S: Store, C: Clock> NodeState<S, C> {
    /// Applies a batch of operations and makes their changes durable in one commit; the
    /// answers, in order, are valid only once this returns.
    pub fn run_batch(&mut self, ops: Vec<Op>) -> Vec<Result<Reply, OpError>> {
        let now = self.clock.now();
        let mut changes = Changes::default();
        let mut answers = Vec::with_capacity(ops.len());
        self.committed_upto = 0;
        for (i, op) in ops.into_iter().enumerate() {
            self.current = i;
            if let Some(error) = &self.batch_failed {
                // A commit of this batch failed: what follows is refused, not applied.
                answers.push(Err(error.clone()));
                continue;
            }
            if let Op::Import(checkpoint) = op {
                // An import replaces state underneath the engines: it commits on its own.
                let answer = self
                    .flush(&mut changes)
                    .and_then(|()| self.import(checkpoint).map(Import::reply));
                if answer.is_ok() {
                    self.committed_upto = i + 1;
                }
                answers.push(answer);
                continue;
            }
            if matches!(op, Op::CniGc(_) | Op::Gc(_)) {
                // A garbage collection reads and writes its suspects in a transaction of its
                // own, after what the batch did so far is committed.
                let answer = self
                    .flush(&mut changes)
                    .and_then(|()| self.run_gc(op, now, &mut changes).map(Gc::reply));
                if answer.is_ok() {
                    self.committed_upto = i + 1;
                }
                answers.push(answer);
                continue;
            }
            if op.undone_by_reload() {
                let answer = self.flush(&mut changes).and_then(|()| {
                    let answer = self.apply(op, now, &mut changes);
                    if answer.is_err() {
                        // Part of it may have been applied: back to what the store holds.
                        changes.clear();
                        self.reload(api::NODE_SCOPE);
                    }
                    answer
                });
                self.forget_drained(&mut changes);
                answers.push(answer);
                continue;
            }
            let writes_before = changes.writes.len();
            let may_write = op.writes();
            let answer = self.apply(op, now, &mut changes);
            debug_assert!(may_write || changes.writes.len() == writes_before);
            if may_write {
                self.forget_drained(&mut changes);
            }
            answers.push(answer);
        }
        self.current = answers.len();
        let _ = self.flush(&mut changes);
        if let Some(error) = self.batch_failed.take() {
            // Memory must not run ahead of the disk: what no commit covered is not
            // acknowledged (it was rolled back, or never applied).
            for answer in &mut answers[self.committed_upto..] {
                *answer = Err(error.clone());
            }
        }
        answers
    }

    /// Commits collected writes and the derived state of touched scopes; on failure rebuilds
    /// those scopes from the store.
    pub(super) fn flush(&mut self, changes: &mut Changes) -> Result<(), OpError> {
        if changes.is_empty() {
            self.committed_upto = self.current;
            return Ok(());
        }
        let now = self.clock.now();
        let result = persist(&mut self.store, &self.scopes, changes, (now, &self.history));
        let scopes: Vec<String> = std::mem::take(&mut changes.touched).into_iter().collect();
        changes.writes.clear();
        match result {
            Ok(()) => {
                // Everything applied before the operation now running is on disk.
                self.committed_upto = self.current;
                Ok(())
            }
            Err(error) => {
                for scope in scopes {
                    self.reload(&scope);
                }
                let error = OpError::store(error);
                self.batch_failed.get_or_insert_with(|| error.clone());
                Err(error)
            }
        }
    }

    /// Ranges that left an engine (drained, or removed while holding nothing) leave the
    /// scope's stored configuration too, in the same commit.
    pub(super) fn forget_drained(&mut self, changes: &mut Changes) {
        for (name, scope) in &mut self.scopes {
            let drained = scope.engine.take_drained();
            if drained.is_empty() {
                continue;
            }
            let declared = (name == api::NODE_SCOPE).then_some(&self.declared);
            let forgotten = capacity::forget_drained(&mut scope.config, &drained, declared);
            let adopted = declared.is_some_and(|declared| scope.adopt_file_ranges(declared));
            if forgotten || adopted {
                changes.touched.insert(name.clone());
            }
        }
    }
}

/// What the committer drives: a node state of any store and clock.
pub trait RunBatch: Send + std::fmt::Debug {
    /// See [`NodeState::run_batch`].
    fn run_batch(&mut self, ops: Vec<Op>) -> Vec<Result<Reply, OpError>>;
}

impl<S: Store + Send, C: Clock + Send> RunBatch for NodeState<S, C> {
    fn run_batch(&mut self, ops: Vec<Op>) -> Vec<Result<Reply, OpError>> {
        NodeState::run_batch(self, ops)
    }
}
