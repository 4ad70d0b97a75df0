//! `MemoryStore`: the [`Store`] traits over memory, for tests of the layers above (the agent's
//! host and committer) that need a store without a disk, and faults on demand.
//!
//! A transaction works on a copy of everything and replaces the shared state when it commits,
//! so a dropped or failed transaction changes nothing, as with SQLite. Handles are cheap
//! clones of one shared state: a test keeps one to inject faults and to "restart" (restore a
//! new host from the same state) while the code under test owns another. Nothing is durable
//! beyond the process, and nothing here is meant for production.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use corral_core::{AttachmentKey, Family, GcSuspect, PoolName, Timestamp};

use crate::history::holders;
use crate::{
    HistoryEvent, HistoryLimits, HistoryQuery, HistoryRecord, PRUNE_BATCH, ScopeConfig, ScopeState,
    Store, StoreError, StoredAllocation, StoredCooldown, Txn,
};

#[derive(Clone, Debug, Default)]
struct Data {
    states: BTreeMap<String, ScopeState>,
    allocations: BTreeMap<(String, IpAddr), StoredAllocation>,
    cooldowns: BTreeMap<(String, IpAddr), StoredCooldown>,
    gc_suspects: BTreeMap<(String, AttachmentKey), GcSuspect>,
    /// The allocation history in the order recorded.
    history: Vec<HistoryEvent>,
}

/// The rows of one scope in a table keyed by scope first, in key order.
fn of_scope<K, V: Clone>(table: &BTreeMap<(String, K), V>, scope: &str) -> Vec<V> {
    table
        .iter()
        .filter(|((s, _), _)| s == scope)
        .map(|(_, row)| row.clone())
        .collect()
}

#[derive(Debug, Default)]
struct Shared {
    data: Data,
    /// How many of the next commits fail (and change nothing).
    failing_commits: usize,
    commits: usize,
}

/// An in-memory store; clones share one state.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    shared: Arc<Mutex<Shared>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A test that panicked while holding the lock leaves consistent data: every change
        // is a whole replacement.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `n` commits fail with a store error and change nothing.
    pub fn fail_next_commits(&self, n: usize) {
        self.lock().failing_commits = n;
    }

    /// How many commits succeeded so far.
    pub fn commits(&self) -> usize {
        self.lock().commits
    }
}

/// One transaction of a [`MemoryStore`]: a copy of the data, swapped in by `commit`.
#[derive(Debug)]
pub struct MemoryTxn {
    store: MemoryStore,
    data: Data,
    /// The allocations this transaction deleted, for [`Txn::released_addresses`].
    released: Vec<(String, IpAddr)>,
}

impl Store for MemoryStore {
    type Txn<'a> = MemoryTxn;

    fn begin(&mut self) -> Result<MemoryTxn, StoreError> {
        Ok(MemoryTxn {
            store: self.clone(),
            data: self.lock().data.clone(),
            released: Vec::new(),
        })
    }
}

/// The history newest first: by time, then latest recorded.
fn newest_first(history: &[HistoryEvent]) -> Vec<&HistoryEvent> {
    let mut events: Vec<(usize, &HistoryEvent)> = history.iter().enumerate().collect();
    events.sort_by_key(|&(i, event)| std::cmp::Reverse((event.at, i)));
    events.into_iter().map(|(_, event)| event).collect()
}

impl Txn for MemoryTxn {
    fn record(&mut self, event: HistoryRecord<'_>) -> Result<(), StoreError> {
        self.data.history.push(event.to_event());
        Ok(())
    }

    fn prune_history(&mut self, limits: &HistoryLimits, now: Timestamp) -> Result<u64, StoreError> {
        // As SQLite does it (`sqlite.rs`): by count once a batch over, then by age.
        let history = &mut self.data.history;
        let before = history.len();
        let max = usize::try_from(limits.max_events).unwrap_or(usize::MAX);
        let batch = usize::try_from(PRUNE_BATCH).unwrap_or(usize::MAX);
        let over = history.len().saturating_sub(max);
        if over >= batch.min(max.max(1)) {
            history.drain(..over.min(batch));
        }
        let cutoff = limits.cutoff(now);
        if history.iter().any(|event| event.at < cutoff) {
            let ahead = cutoff.saturating_add(limits.max_age / 100);
            let mut dropped = 0;
            history.retain(|event| {
                let drop = event.at < ahead && dropped < batch;
                dropped += usize::from(drop);
                !drop
            });
        }
        Ok((before - history.len()) as u64)
    }

    fn history(&mut self, query: &HistoryQuery) -> Result<Vec<HistoryEvent>, StoreError> {
        Ok(newest_first(&self.data.history)
            .into_iter()
            .filter(|event| query.matches(event))
            .take(query.limit)
            .cloned()
            .collect())
    }

    fn held_at(&mut self, addr: IpAddr, at: Timestamp) -> Result<Vec<HistoryEvent>, StoreError> {
        Ok(holders(
            newest_first(&self.data.history)
                .into_iter()
                .filter(|event| event.addr == addr && event.at <= at)
                .cloned(),
        ))
    }

    fn gc_suspects(&mut self, scope: &str) -> Result<Vec<GcSuspect>, StoreError> {
        Ok(of_scope(&self.data.gc_suspects, scope))
    }

    fn put_gc_suspect(&mut self, scope: &str, suspect: &GcSuspect) -> Result<(), StoreError> {
        self.data
            .gc_suspects
            .insert((scope.to_owned(), suspect.key.clone()), suspect.clone());
        Ok(())
    }

    fn delete_gc_suspect(&mut self, scope: &str, key: &AttachmentKey) -> Result<(), StoreError> {
        self.data
            .gc_suspects
            .remove(&(scope.to_owned(), key.clone()));
        Ok(())
    }

    fn scopes(&mut self) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = self.data.states.keys().cloned().collect();
        names.extend(self.data.allocations.keys().map(|(scope, _)| scope.clone()));
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn scope_state(
        &mut self,
        scope: &str,
    ) -> Result<(Option<ScopeState>, Option<String>), StoreError> {
        Ok((self.data.states.get(scope).cloned(), None))
    }

    fn put_scope_state(&mut self, scope: &str, state: &ScopeState) -> Result<(), StoreError> {
        self.data.states.insert(scope.to_owned(), state.clone());
        Ok(())
    }

    fn stored_config(&mut self, scope: &str) -> Result<Option<ScopeConfig>, StoreError> {
        Ok(self
            .data
            .states
            .get(scope)
            .map(|state| state.config.clone()))
    }

    fn cooldowns(&mut self, scope: &str) -> Result<Vec<StoredCooldown>, StoreError> {
        let mut out = of_scope(&self.data.cooldowns, scope);
        out.sort_by_key(|c| (c.released_at, c.addr));
        Ok(out)
    }

    fn oldest_cooldowns(
        &mut self,
        scope: &str,
        pool: &PoolName,
        family: Family,
        ran_out_by: Timestamp,
        limit: usize,
    ) -> Result<Vec<StoredCooldown>, StoreError> {
        let mut rows: Vec<StoredCooldown> = self
            .cooldowns(scope)?
            .into_iter()
            .filter(|c| &c.pool == pool && Family::of(c.addr) == family)
            .filter(|c| {
                !self
                    .data
                    .allocations
                    .contains_key(&(scope.to_owned(), c.addr))
            })
            .collect();
        let ran_out = rows
            .iter()
            .take_while(|c| c.released_at <= ran_out_by)
            .count();
        let taken = ran_out.min(limit);
        let mut out: Vec<StoredCooldown> = rows.drain(..taken).collect();
        if let Some(next) = rows.into_iter().next() {
            out.push(next);
        }
        Ok(out)
    }

    fn put_cooldown(&mut self, scope: &str, cooldown: &StoredCooldown) -> Result<(), StoreError> {
        self.data
            .cooldowns
            .insert((scope.to_owned(), cooldown.addr), cooldown.clone());
        Ok(())
    }

    fn delete_cooldown(&mut self, scope: &str, addr: IpAddr) -> Result<(), StoreError> {
        self.data.cooldowns.remove(&(scope.to_owned(), addr));
        Ok(())
    }

    fn delete_cooldowns_before(
        &mut self,
        scope: &str,
        pool: &PoolName,
        family: Family,
        before: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.data.cooldowns.retain(|(s, addr), c| {
            !(s == scope
                && &c.pool == pool
                && Family::of(*addr) == family
                && before.is_none_or(|before| c.released_at < before))
        });
        Ok(())
    }

    fn delete_cooldowns(&mut self, scope: &str) -> Result<(), StoreError> {
        self.data.cooldowns.retain(|(s, _), _| s != scope);
        Ok(())
    }

    fn released_addresses(&self, scope: &str) -> Vec<IpAddr> {
        self.released
            .iter()
            .filter(|(s, _)| s == scope)
            .map(|(_, addr)| *addr)
            .collect()
    }

    fn allocations_by_key(
        &mut self,
        scope: &str,
        key: &AttachmentKey,
    ) -> Result<Vec<StoredAllocation>, StoreError> {
        Ok(self
            .data
            .allocations
            .iter()
            .filter(|((s, _), row)| s == scope && row.key.as_ref() == Some(key))
            .map(|(_, row)| row.clone())
            .collect())
    }

    fn allocation_by_addr(
        &mut self,
        scope: &str,
        addr: IpAddr,
    ) -> Result<Option<StoredAllocation>, StoreError> {
        Ok(self
            .data
            .allocations
            .get(&(scope.to_owned(), addr))
            .cloned())
    }

    fn all_allocations(&mut self, scope: &str) -> Result<Vec<StoredAllocation>, StoreError> {
        Ok(of_scope(&self.data.allocations, scope))
    }

    fn put_allocation(
        &mut self,
        scope: &str,
        allocation: &StoredAllocation,
    ) -> Result<(), StoreError> {
        let key = (scope.to_owned(), allocation.addr);
        if self.data.allocations.contains_key(&key) {
            // As the database's primary key (scope, family, address) refuses it.
            return Err(StoreError::Taken {
                scope: scope.to_owned(),
                addr: allocation.addr,
            });
        }
        self.data.cooldowns.remove(&key);
        self.data.allocations.insert(key, allocation.clone());
        Ok(())
    }

    fn delete_allocation(&mut self, scope: &str, addr: IpAddr) -> Result<(), StoreError> {
        if self
            .data
            .allocations
            .remove(&(scope.to_owned(), addr))
            .is_some()
        {
            self.released.push((scope.to_owned(), addr));
        }
        Ok(())
    }

    fn commit(self) -> Result<(), StoreError> {
        let mut shared = self.store.lock();
        if shared.failing_commits > 0 {
            shared.failing_commits -= 1;
            return Err(StoreError::Directory {
                path: "memory".into(),
                source: std::io::Error::other("a commit failed on purpose (MemoryStore)"),
            });
        }
        shared.data = self.data;
        shared.commits += 1;
        Ok(())
    }

    fn finish(self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(addr: &str) -> StoredAllocation {
        StoredAllocation {
            pool: PoolName::new("p").unwrap(),
            addr: addr.parse().unwrap(),
            owner: "o".into(),
            key: None,
            generation: 1,
            lease: None,
        }
    }

    #[test]
    fn a_commit_publishes_and_a_failed_or_dropped_one_changes_nothing() {
        let mut store = MemoryStore::new();
        let mut txn = store.begin().unwrap();
        txn.put_allocation("s", &row("10.0.0.1")).unwrap();
        assert!(matches!(
            txn.put_allocation("s", &row("10.0.0.1")),
            Err(StoreError::Taken { .. })
        ));
        drop(txn);
        assert!(
            store
                .begin()
                .unwrap()
                .all_allocations("s")
                .unwrap()
                .is_empty()
        );
        store.fail_next_commits(1);
        let mut txn = store.begin().unwrap();
        txn.put_allocation("s", &row("10.0.0.1")).unwrap();
        assert!(txn.commit().is_err());
        assert!(store.begin().unwrap().scopes().unwrap().is_empty());
        let mut txn = store.begin().unwrap();
        txn.put_allocation("s", &row("10.0.0.1")).unwrap();
        txn.commit().unwrap();
        let other_handle = store.clone();
        assert_eq!(
            other_handle.clone().begin().unwrap().scopes().unwrap(),
            ["s"]
        );
        assert_eq!(other_handle.commits(), 1);
    }
}
