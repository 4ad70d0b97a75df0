//! What is wrong now, and what went wrong before: the operator's problems are conditions with
//! an identity (a kind and a subject: `etcd`/`resync`, `grant`/a node, `election`/the
//! replica), the time each began (`since`) and was last seen, and its newest message; each is
//! resolved by the success that ends it (the next resync, the node's next grant, joining the
//! election). The past is a bounded list of events: each condition raised or changed, each
//! resolved, and the happenings that are no condition (a revocation, a drift a resync fixed).
//!
//! Times are milliseconds since the Unix epoch on a clock anchored at the wall clock when the
//! operator started and advanced by tokio's clock (monotonic; paused-clock tests drive it).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// Conditions kept at most (the oldest-seen go first past it).
const MAX_CONDITIONS: usize = 256;
/// Events kept (the newest).
pub const MAX_EVENTS: usize = 100;

/// A current problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// What kind of thing is wrong: `election`, `etcd`, `key`, `grant`, `cloud`...
    pub kind: &'static str,
    /// What it is wrong with: a node, a key, the replica, a step.
    pub subject: String,
    /// The newest sentence.
    pub message: String,
    /// When it began (ms since the epoch).
    pub since_ms: u64,
    /// When it was last reported.
    pub last_seen_ms: u64,
}

/// Something that happened: a condition raised, changed or resolved, or a happening.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub at_ms: u64,
    /// The condition's kind, or `event` for a happening that is no condition.
    pub kind: &'static str,
    pub subject: String,
    pub message: String,
    /// The condition ended.
    pub resolved: bool,
}

/// The conditions and the events, behind their own lock (never held while taking another).
#[derive(Debug)]
pub struct Problems {
    inner: Mutex<Inner>,
    /// The wall clock when the operator started, and tokio's clock then.
    anchor: (u64, tokio::time::Instant),
}

#[derive(Debug, Default)]
struct Inner {
    conditions: BTreeMap<(&'static str, String), Condition>,
    events: VecDeque<Event>,
}

impl Default for Problems {
    fn default() -> Problems {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Problems {
            inner: Mutex::default(),
            anchor: (wall, tokio::time::Instant::now()),
        }
    }
}

impl Problems {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Now, in milliseconds since the epoch (see the module's documentation).
    pub fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.anchor.1.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.anchor.0.saturating_add(elapsed)
    }

    /// Raises (or sees again) the condition `kind`/`subject`; logged and recorded as an event
    /// when new or when its message changed. Answers whether it was new.
    pub fn raise(&self, kind: &'static str, subject: String, message: String) -> bool {
        let now = self.now_ms();
        let mut inner = self.inner();
        let key = (kind, subject);
        let changed = match inner.conditions.get_mut(&key) {
            Some(condition) => {
                condition.last_seen_ms = now;
                let changed = condition.message != message;
                condition.message.clone_from(&message);
                changed
            }
            None => {
                if inner.conditions.len() >= MAX_CONDITIONS {
                    let oldest = inner
                        .conditions
                        .iter()
                        .min_by_key(|(_, c)| c.last_seen_ms)
                        .map(|(k, _)| k.clone());
                    if let Some(oldest) = oldest {
                        inner.conditions.remove(&oldest);
                    }
                }
                inner.conditions.insert(
                    key.clone(),
                    Condition {
                        kind,
                        subject: key.1.clone(),
                        message: message.clone(),
                        since_ms: now,
                        last_seen_ms: now,
                    },
                );
                true
            }
        };
        if changed {
            tracing::warn!(kind, subject = %key.1, "{message}");
            push(&mut inner.events, now, kind, key.1, message, false);
        }
        changed
    }

    /// Ends the condition `kind`/`subject`, if it stands (recorded as an event).
    pub fn resolve(&self, kind: &'static str, subject: &str) {
        let now = self.now_ms();
        let mut inner = self.inner();
        if let Some(condition) = inner.conditions.remove(&(kind, subject.to_owned())) {
            push(
                &mut inner.events,
                now,
                kind,
                condition.subject,
                condition.message,
                true,
            );
        }
    }

    /// Ends every condition of `kind` whose subject `keep` refuses.
    pub fn resolve_all(&self, kind: &'static str, keep: impl Fn(&str) -> bool) {
        let subjects: Vec<String> = self
            .inner()
            .conditions
            .keys()
            .filter(|(k, subject)| *k == kind && !keep(subject))
            .map(|(_, subject)| subject.clone())
            .collect();
        for subject in subjects {
            self.resolve(kind, &subject);
        }
    }

    /// Ends every condition whose kind `end` accepts.
    pub fn resolve_where(&self, end: impl Fn(&str) -> bool) {
        let ended: Vec<(&'static str, String)> = self
            .inner()
            .conditions
            .keys()
            .filter(|(kind, _)| end(kind))
            .cloned()
            .collect();
        for (kind, subject) in ended {
            self.resolve(kind, &subject);
        }
    }

    /// Records a happening that is no lasting condition (logged).
    pub fn event(&self, message: String) {
        tracing::warn!("{message}");
        let now = self.now_ms();
        push(
            &mut self.inner().events,
            now,
            "event",
            String::new(),
            message,
            false,
        );
    }

    /// The current conditions, oldest first.
    pub fn conditions(&self) -> Vec<Condition> {
        let mut conditions: Vec<Condition> = self.inner().conditions.values().cloned().collect();
        conditions.sort_by_key(|c| c.since_ms);
        conditions
    }

    /// The current problems counted by kind, in the OpenMetrics text format.
    pub fn metrics_text(&self) -> String {
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        for (kind, _) in self.inner().conditions.keys() {
            *counts.entry(kind).or_default() += 1;
        }
        let mut text = String::from(
            "# HELP corral_operator_current_problems Problems standing now (`current` of \
             /v1/status), by kind.\n# TYPE corral_operator_current_problems gauge\n",
        );
        for (kind, n) in counts {
            text.push_str(&format!(
                "corral_operator_current_problems{{kind=\"{kind}\"}} {n}\n"
            ));
        }
        text
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.inner().events.iter().cloned().collect()
    }
}

fn push(
    events: &mut VecDeque<Event>,
    at_ms: u64,
    kind: &'static str,
    subject: String,
    message: String,
    resolved: bool,
) {
    if events.len() >= MAX_EVENTS {
        events.pop_front();
    }
    events.push_back(Event {
        at_ms,
        kind,
        subject,
        message,
        resolved,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_condition_keeps_its_start_and_the_events_keep_the_newest_hundred() {
        let problems = Problems::default();
        assert!(problems.raise("etcd", "resync".into(), "resync: down".into()));
        let since = problems.now_ms();
        tokio::time::sleep(std::time::Duration::from_secs(7)).await;
        assert!(!problems.raise("etcd", "resync".into(), "resync: down".into()));
        let now = problems.conditions();
        assert_eq!(now.len(), 1);
        assert_eq!(
            (now[0].since_ms, now[0].last_seen_ms),
            (since, since + 7000)
        );
        assert_eq!(problems.events().len(), 1, "seen again is no event");
        problems.resolve("etcd", "resync");
        assert!(problems.conditions().is_empty());
        for i in 0..150 {
            problems.event(format!("happening {i}"));
        }
        let events = problems.events();
        assert_eq!(events.len(), MAX_EVENTS);
        assert_eq!(events[0].message, "happening 50");
        assert_eq!(events[99].message, "happening 149");
    }
}
