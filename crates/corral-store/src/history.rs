//! The allocation history: every allocation and release a store recorded, with its time,
//! address, pool, attachment, owner and generation, kept for a bounded number of events and a
//! bounded age.
//!
//! An event is written by [`Txn::record`](crate::Txn::record) (borrowing it, as a
//! [`HistoryRecord`]) in the transaction of the change it records, so it is durable with that
//! change and costs no commit (no fsync) of its own.
//! [`Txn::prune_history`](crate::Txn::prune_history) drops the oldest events in batches: a commit checks two ends of an index, and deletes only once
//! [`PRUNE_BATCH`] events are over the count (or the oldest is past the age), so the cost is
//! amortised over the commits that added them.
//!
//! SQLite keeps the events as an append-only log with no index written per event, summarised
//! in chunks of 1,024 (`sqlite/history.rs`): a query reads the newest events not yet
//! summarised and the chunks whose filters may hold a match, so a query over a million events
//! reads a few thousand.

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{AttachmentKey, PoolName, Timestamp};

use crate::StoredAllocation;

/// The default bound on the number of events kept.
pub const DEFAULT_HISTORY_MAX_EVENTS: u64 = 1_000_000;
/// The default bound on the age of events kept: 30 days.
pub const DEFAULT_HISTORY_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How many events over a bound a store lets accumulate before one commit deletes them (and at
/// most how many one commit deletes).
pub const PRUNE_BATCH: u64 = 512;

/// What happened to an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HistoryKind {
    /// Allocated to its owner.
    Allocated,
    /// Released by its owner (a DEL, a release through the API).
    Released,
    /// Its lease ran out.
    Expired,
    /// Released by the leak collector (its attachment was gone).
    Collected,
    /// Released because the space holding it went away (a range or interface address the
    /// node gave up or lost).
    Surrendered,
}

impl HistoryKind {
    pub const ALL: [HistoryKind; 5] = [
        HistoryKind::Allocated,
        HistoryKind::Released,
        HistoryKind::Expired,
        HistoryKind::Collected,
        HistoryKind::Surrendered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Allocated => "allocated",
            HistoryKind::Released => "released",
            HistoryKind::Expired => "expired",
            HistoryKind::Collected => "collected",
            HistoryKind::Surrendered => "surrendered",
        }
    }

    /// The number a store keeps.
    pub(crate) fn code(self) -> i64 {
        match self {
            HistoryKind::Allocated => 1,
            HistoryKind::Released => 2,
            HistoryKind::Expired => 3,
            HistoryKind::Collected => 4,
            HistoryKind::Surrendered => 5,
        }
    }

    pub(crate) fn from_code(code: i64) -> Option<HistoryKind> {
        HistoryKind::ALL
            .into_iter()
            .find(|kind| kind.code() == code)
    }
}

/// One event of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEvent {
    pub at: Timestamp,
    pub kind: HistoryKind,
    pub scope: String,
    pub pool: PoolName,
    pub addr: IpAddr,
    pub key: Option<AttachmentKey>,
    pub owner: String,
    pub generation: u64,
}

impl HistoryEvent {
    /// The event `kind` of the allocation `row` of `scope`, at `at`.
    pub fn of(at: Timestamp, kind: HistoryKind, scope: &str, row: &StoredAllocation) -> Self {
        HistoryEvent {
            at,
            kind,
            scope: scope.to_owned(),
            pool: row.pool.clone(),
            addr: row.addr,
            key: row.key.clone(),
            owner: row.owner.clone(),
            generation: row.generation,
        }
    }
}

/// An event of the history as a store records it, borrowing what it names
/// ([`Txn::record`](crate::Txn::record)): recording an allocation or a release copies nothing
/// but the bytes the store writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryRecord<'a> {
    pub at: Timestamp,
    pub kind: HistoryKind,
    pub scope: &'a str,
    pub pool: &'a PoolName,
    pub addr: IpAddr,
    pub key: Option<&'a AttachmentKey>,
    pub owner: &'a str,
    pub generation: u64,
}

impl<'a> HistoryRecord<'a> {
    /// The event `kind` of the allocation `row` of `scope`, at `at` (as [`HistoryEvent::of`]).
    pub fn of(at: Timestamp, kind: HistoryKind, scope: &'a str, row: &'a StoredAllocation) -> Self {
        HistoryRecord {
            at,
            kind,
            scope,
            pool: &row.pool,
            addr: row.addr,
            key: row.key.as_ref(),
            owner: &row.owner,
            generation: row.generation,
        }
    }

    /// The event, owning its fields.
    pub fn to_event(&self) -> HistoryEvent {
        HistoryEvent {
            at: self.at,
            kind: self.kind,
            scope: self.scope.to_owned(),
            pool: self.pool.clone(),
            addr: self.addr,
            key: self.key.cloned(),
            owner: self.owner.to_owned(),
            generation: self.generation,
        }
    }
}

impl<'a> From<&'a HistoryEvent> for HistoryRecord<'a> {
    fn from(event: &'a HistoryEvent) -> Self {
        HistoryRecord {
            at: event.at,
            kind: event.kind,
            scope: &event.scope,
            pool: &event.pool,
            addr: event.addr,
            key: event.key.as_ref(),
            owner: &event.owner,
            generation: event.generation,
        }
    }
}

/// How much history a store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimits {
    /// The most events kept (0 keeps none).
    pub max_events: u64,
    /// Events older than this are dropped.
    pub max_age: Duration,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits {
            max_events: DEFAULT_HISTORY_MAX_EVENTS,
            max_age: DEFAULT_HISTORY_MAX_AGE,
        }
    }
}

impl HistoryLimits {
    /// The oldest time kept at `now`.
    pub(crate) fn cutoff(&self, now: Timestamp) -> Timestamp {
        Timestamp::from_unix_millis(
            now.as_unix_millis()
                .saturating_sub(u64::try_from(self.max_age.as_millis()).unwrap_or(u64::MAX)),
        )
    }
}

/// Which events a query wants; every filter given must match. Answered newest first (by
/// time, then by the order they were recorded), at most `limit`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    pub addr: Option<IpAddr>,
    /// The owner exactly (a pod is `NAMESPACE/NAME`).
    pub owner: Option<String>,
    /// The attachment's container ID, and its interface name if given.
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    /// Events at or after this time.
    pub since: Option<Timestamp>,
    /// Events at or before this time.
    pub until: Option<Timestamp>,
    pub limit: usize,
}

impl HistoryQuery {
    /// Whether `event` matches every filter.
    pub fn matches(&self, event: &HistoryEvent) -> bool {
        self.addr.is_none_or(|addr| event.addr == addr)
            && self
                .owner
                .as_ref()
                .is_none_or(|owner| &event.owner == owner)
            && self.container_id.as_ref().is_none_or(|id| {
                event
                    .key
                    .as_ref()
                    .is_some_and(|key| key.container_id() == id)
            })
            && self
                .ifname
                .as_ref()
                .is_none_or(|ifname| event.key.as_ref().is_some_and(|key| key.ifname() == ifname))
            && self.since.is_none_or(|since| event.at >= since)
            && self.until.is_none_or(|until| event.at <= until)
    }
}

/// The holders of `addr` at `at` from its events at or before `at`, newest first: per scope,
/// the last event, if it is an allocation.
pub(crate) fn holders(
    events_newest_first: impl IntoIterator<Item = HistoryEvent>,
) -> Vec<HistoryEvent> {
    let mut seen = Vec::<String>::new();
    let mut out = Vec::new();
    for event in events_newest_first {
        if seen.contains(&event.scope) {
            continue;
        }
        seen.push(event.scope.clone());
        if event.kind == HistoryKind::Allocated {
            out.push(event);
        }
    }
    out
}
