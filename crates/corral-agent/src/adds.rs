//! The latest CNI ADDs on node pools, in memory (`/v1/status`'s `adds`): the pool each used,
//! the rule that chose it (the call's pool, the namespace's, the network's, the default), and
//! how it ended, so `corral explain pod` can say which pool a pod's ADD really used, even one
//! that got no address. Bounded ([`api::AddRecord::KEPT`], one entry per attachment); a
//! restart forgets them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use corral_api as api;

/// The ADDs kept, oldest first.
#[derive(Debug, Default)]
pub struct AddLog(Mutex<VecDeque<api::AddRecord>>);

impl AddLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<api::AddRecord>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an ADD that arrived (its outcome `waiting`), replacing the attachment's earlier
    /// one and forgetting the oldest beyond the bound.
    pub fn arrived(&self, record: api::AddRecord) {
        let mut adds = self.lock();
        adds.retain(|a| a.key != record.key);
        adds.push_back(record);
        while adds.len() > api::AddRecord::KEPT {
            adds.pop_front();
        }
    }

    /// Records how the attachment's ADD ended: `Ok` or why it failed.
    pub fn ended(&self, key: &api::AttachmentKey, result: Result<(), &str>) {
        if let Some(add) = self.lock().iter_mut().rev().find(|a| &a.key == key) {
            match result {
                Ok(()) => {
                    add.outcome = "ok".to_owned();
                    add.error = None;
                }
                Err(error) => {
                    add.outcome = "failed".to_owned();
                    add.error = Some(error.to_owned());
                }
            }
        }
    }

    /// Records an ADD that arrived, and answers a guard that records how it ended: by
    /// [`AddGuard::end`], else, when the guard is dropped first (the client went away and the
    /// request was dropped), as failed for that.
    pub fn track(self: &Arc<Self>, record: api::AddRecord) -> AddGuard {
        let key = record.key.clone();
        self.arrived(record);
        AddGuard {
            log: Arc::clone(self),
            key: Some(key),
        }
    }

    /// The ADDs kept, oldest first.
    pub fn list(&self) -> Vec<api::AddRecord> {
        self.lock().iter().cloned().collect()
    }
}

/// An ADD in progress in an [`AddLog`].
#[derive(Debug)]
pub struct AddGuard {
    log: Arc<AddLog>,
    /// `None` once ended.
    key: Option<api::AttachmentKey>,
}

impl AddGuard {
    /// Records how the ADD ended.
    pub fn end(mut self, result: Result<(), &str>) {
        if let Some(key) = self.key.take() {
            self.log.ended(&key, result);
        }
    }
}

impl Drop for AddGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.log.ended(
                &key,
                Err("the client went away before the answer (the request was dropped)"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(container: &str) -> api::AddRecord {
        api::AddRecord {
            key: api::AttachmentKey {
                network: "net".into(),
                container_id: container.into(),
                ifname: "eth0".into(),
            },
            owner: format!("ns/{container}"),
            pool: "pods".into(),
            rule: "network".into(),
            namespace: Some("ns".into()),
            at_ms: 1,
            outcome: "waiting".into(),
            error: None,
        }
    }

    #[test]
    fn one_entry_per_attachment_bounded_and_ended() {
        let log = AddLog::default();
        for i in 0..api::AddRecord::KEPT + 10 {
            log.arrived(add(&format!("c{i}")));
        }
        let list = log.list();
        assert_eq!(list.len(), api::AddRecord::KEPT);
        assert_eq!(list[0].key.container_id, "c10");
        // The same attachment again replaces its entry, now the newest.
        log.arrived(add("c10"));
        let list = log.list();
        assert_eq!(list.len(), api::AddRecord::KEPT);
        assert_eq!(list.last().unwrap().key.container_id, "c10");
        log.ended(&add("c10").key, Err("pool pods is exhausted"));
        let last = log.list().pop().unwrap();
        assert_eq!(
            (last.outcome.as_str(), last.error.as_deref()),
            ("failed", Some("pool pods is exhausted"))
        );
        log.ended(&add("c10").key, Ok(()));
        let last = log.list().pop().unwrap();
        assert_eq!((last.outcome.as_str(), last.error), ("ok", None));
    }

    #[test]
    fn an_add_dropped_before_its_answer_is_recorded_as_failed() {
        let log = Arc::new(AddLog::default());
        log.track(add("a")).end(Ok(()));
        drop(log.track(add("b")));
        let list = log.list();
        assert_eq!(list[0].outcome, "ok");
        assert_eq!(list[1].outcome, "failed");
        assert!(
            list[1]
                .error
                .as_deref()
                .unwrap()
                .contains("the client went away"),
            "{list:?}"
        );
    }
}
