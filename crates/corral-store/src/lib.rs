//! corral-store: durable state behind one trait, with SQLite as the embedded default.
//!
//! State is kept per *scope* (a CNI network, or an agent's node): its configuration (pools,
//! ranges, exclusions), its allocations and cooldowns, and its derived state (pool
//! snapshots, the next generation). The allocations and cooldowns are rows; the derived state
//! lets a short-lived process build a partial [`Engine`] from the snapshot and the few rows it
//! needs, so a CNI call costs the same whether the scope holds ten allocations or sixty
//! thousand, and however many addresses are cooling down.
//!
//! Every transaction is exclusive and durable: when [`Txn::commit`] returns, its writes have
//! been synced to disk.

mod checkpoint;
mod codec;
mod files;
pub mod fuzz;
mod gc;
mod history;
mod hostlocal;
mod interfaces;
mod load;
mod memory;
mod pending;
mod sqlite;

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Exclusion, Family, GcSuspect, PoolName, PoolSnapshot, RangeSpec,
    RestoredAllocation, ReusePolicy, Timestamp,
};

pub use checkpoint::{
    CHECKPOINT_FORMAT, Checkpoint, CheckpointAllocation, CheckpointCooling, ScopeCheckpoint,
    export_checkpoint, import_checkpoint,
};
pub use files::{SmallFileError, read_small_file};
pub use gc::{GcOutcome, collect_garbage};
pub use history::{
    DEFAULT_HISTORY_MAX_AGE, DEFAULT_HISTORY_MAX_EVENTS, HistoryEvent, HistoryKind, HistoryLimits,
    HistoryQuery, HistoryRecord, PRUNE_BATCH,
};
pub use hostlocal::{
    HostLocalDir, HostLocalEntry, HostLocalWritten, LAST_RESERVED_PREFIX,
    MAX_HOST_LOCAL_FILE_BYTES, UNKNOWN_HOST_LOCAL_OWNER, host_local_allocations,
    host_local_file_exists, parse_host_local_files, read_host_local_dir, write_host_local_dir,
};
pub use interfaces::{InterfaceEntry, restore_interfaces};
pub use load::{EXPIRED_PER_BUILD, Need, build_engine, save_engine};
pub use memory::{MemoryStore, MemoryTxn};
pub use pending::{
    AGENT_CLAIM_SUFFIX, Claimed, MAX_PENDING_RECORD_BYTES, PENDING_DIR, PENDING_FORMAT, PendingDel,
    PendingError, PendingFile, claim_all_for_agent, claim_pending_del, pending_dir,
    pending_file_name, record_pending_del,
};
pub use sqlite::{
    AGENT_FILE, DB_FILE, HostLocalTakeover, LOCK_FILE, SYNCED_FILE, SqliteStore, SqliteTxn,
    StoreHealth,
};

/// The schema version this build writes; older databases are migrated when opened.
pub const SCHEMA_VERSION: u32 = 7;

/// Something went wrong underneath; the transaction changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the state directory {path}: {source}")]
    Directory {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The state directory's path names something that is not a directory (a regular file
    /// given by mistake), or passes through one.
    #[error("the state directory {path} cannot be used: {blocker} is a {kind}, not a directory")]
    NotADirectory {
        path: String,
        blocker: String,
        kind: &'static str,
    },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the state directory {path} is held by {holder}")]
    Held { path: String, holder: String },
    /// The database engine underneath failed. Its error is part of the message (and can be
    /// downcast from `error`), so callers need not know which backend a store uses.
    #[error("{backend}: {error}")]
    Backend {
        /// The backend that failed: `"sqlite"`.
        backend: &'static str,
        /// Whether the same transaction may succeed later: the database was busy or locked by
        /// a program outside corral (the `sqlite3` shell).
        retryable: bool,
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// State the directory is known to have held is gone, or older than it was (deleted,
    /// truncated or replaced from outside). Starting afresh would forget allocations still
    /// in use and hand their addresses out again, so the store refuses to open until someone
    /// decides; nothing was changed on disk.
    #[error("{path} {problem}; {remedy}")]
    StateLost {
        kind: LostState,
        /// The file that is gone or older.
        path: String,
        problem: String,
        remedy: String,
    },
    #[error("{addr} is already recorded as held in scope {scope}")]
    Taken { scope: String, addr: IpAddr },
    #[error("database schema version {found} is newer than this build understands ({supported})")]
    SchemaTooNew { found: u32, supported: u32 },
    #[error("stored {what} is corrupt: {reason}")]
    Corrupt { what: String, reason: String },
    #[error(transparent)]
    Engine(#[from] corral_core::AllocError),
    #[error(
        "an earlier sync of {path} failed, so what the disk holds is uncertain: nothing more \
         is written until the state is reopened (restart the agent) and recovered from the disk"
    )]
    SyncFailed { path: String },
}

/// Where a range of a scope's configuration came from: what may change or remove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RangeSource {
    /// The agent's configuration file: it stays while the file declares it, a run-time
    /// removal is remembered (see [`RangeState::Removed`]), and it goes when the file stops
    /// declaring it.
    File,
    /// Added through the agent's API at run time; only the API removes it.
    Api,
    /// A CNI network's configuration, which the plugin sends with every call.
    Cni,
    /// Granted to the node by the cluster authority; only the release handshake removes it.
    Cluster,
    /// A secondary address or delegated prefix of a cloud interface of an interface-backed
    /// pool ([`PoolSpec::interfaces`]); it comes and goes with the interface's address.
    Interface,
}

impl RangeSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RangeSource::File => "file",
            RangeSource::Api => "api",
            RangeSource::Cni => "cni",
            RangeSource::Cluster => "cluster",
            RangeSource::Interface => "interface",
        }
    }
}

impl StoreError {
    /// Whether trying the same operation again later may succeed without anyone fixing
    /// anything: another program had the database busy, or an agent holds the directory.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Backend { retryable, .. } => *retryable,
            StoreError::Held { .. } => true,
            StoreError::Engine(error) => error.is_retryable(),
            StoreError::Directory { .. }
            | StoreError::Lock { .. }
            | StoreError::StateLost { .. }
            | StoreError::NotADirectory { .. }
            | StoreError::Taken { .. }
            | StoreError::SchemaTooNew { .. }
            | StoreError::Corrupt { .. }
            | StoreError::SyncFailed { .. } => false,
        }
    }
}

/// Whether a range of a scope's configuration hands out addresses.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RangeState {
    #[default]
    Active,
    /// Removed while it held allocations: it hands out nothing more, its allocations stay, and
    /// it leaves the configuration with its last release (adding it again cancels the drain).
    Draining,
    /// Draining because the configuration file stopped declaring it (not removed at run time):
    /// the file declaring it again cancels the drain, and it leaves no tombstone.
    Withdrawn,
    /// A range the configuration file declares that was removed at run time: it stays out
    /// until added again through the API or dropped from the file (never resurrected by a
    /// restart). It is not part of the engine.
    Removed,
}

impl RangeState {
    pub fn as_str(self) -> &'static str {
        match self {
            RangeState::Active => "active",
            RangeState::Draining => "draining",
            RangeState::Withdrawn => "withdrawn",
            RangeState::Removed => "removed",
        }
    }
}

/// One range of a pool's configuration: its canonical text, where it came from and its state.
///
/// Stored as JSON; a range from a CNI network configuration that is active is written as its
/// bare text, the form every earlier build wrote for every range, so a network's stored
/// configuration reads the same as before. The agent reclassifies bare ranges of its own
/// scope when it restores it (see `corral-agent`'s `capacity.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(from = "RangeEntryRepr", into = "RangeEntryRepr")]
pub struct RangeEntry {
    /// The range in its canonical text form ([`RangeSpec`]'s `Display`).
    pub range: String,
    pub source: RangeSource,
    pub state: RangeState,
}

impl RangeEntry {
    /// An active range.
    pub fn new(spec: &RangeSpec, source: RangeSource) -> RangeEntry {
        RangeEntry {
            range: spec.to_string(),
            source,
            state: RangeState::Active,
        }
    }

    /// The range, parsed; `None` if the stored text is not a range.
    pub fn spec(&self) -> Option<RangeSpec> {
        self.range.parse().ok()
    }

    /// Whether the engine holds this range (active or draining).
    pub fn in_engine(&self) -> bool {
        self.state != RangeState::Removed
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum RangeEntryRepr {
    Bare(String),
    Full {
        range: String,
        source: RangeSource,
        #[serde(default)]
        state: RangeState,
    },
}

impl From<RangeEntryRepr> for RangeEntry {
    fn from(repr: RangeEntryRepr) -> RangeEntry {
        match repr {
            RangeEntryRepr::Bare(range) => RangeEntry {
                range,
                source: RangeSource::Cni,
                state: RangeState::Active,
            },
            RangeEntryRepr::Full {
                range,
                source,
                state,
            } => RangeEntry {
                range,
                source,
                state,
            },
        }
    }
}

impl From<RangeEntry> for RangeEntryRepr {
    fn from(entry: RangeEntry) -> RangeEntryRepr {
        if entry.source == RangeSource::Cni && entry.state == RangeState::Active {
            RangeEntryRepr::Bare(entry.range)
        } else {
            RangeEntryRepr::Full {
                range: entry.range,
                source: entry.source,
                state: entry.state,
            }
        }
    }
}

/// Which part of a state directory's known state is gone or older ([`StoreError::StateLost`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostState {
    /// The database file is gone.
    DatabaseMissing,
    /// The database file is empty (truncated to zero bytes).
    DatabaseEmpty,
    /// The database file does not begin with a database header (truncated, overwritten).
    DatabaseUnreadable,
    /// The database is older than the last state recorded (replaced with an older copy).
    DatabaseOlder,
    /// The log is gone while it held commits the database does not.
    LogMissing,
    /// The log holds no commit while it should hold commits the database does not.
    LogEmpty,
}

/// One pool of a scope's configuration.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolSpec {
    pub name: String,
    pub cooldown_ms: u64,
    pub lowest_free: bool,
    /// The pool's ranges, in the order they were added.
    pub ranges: Vec<RangeEntry>,
    /// Exclusions as (network, reason).
    pub exclusions: Vec<(String, String)>,
    /// The cloud interfaces of an interface-backed pool; their addresses are the pool's
    /// ranges of source [`RangeSource::Interface`]. Absent (and not written) for other pools,
    /// so their stored configuration reads and writes as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceEntry>,
    /// The pool is interface-backed, even with no interface left: set by
    /// [`PoolSpec::set_interfaces`], so a pool whose last interface was removed is still one
    /// after a reopen (its table comes back empty from [`restore_interfaces`]) and takes no
    /// plain range. Absent (and not written) for other pools.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interface_backed: bool,
}

impl PoolSpec {
    /// A pool specification from validated values, its ranges active and from a CNI network
    /// configuration (see [`PoolSpec::with_source`] for others).
    pub fn new(
        name: &PoolName,
        cooldown: Duration,
        reuse: ReusePolicy,
        ranges: &[RangeSpec],
        exclusions: &[Exclusion],
    ) -> PoolSpec {
        PoolSpec {
            name: name.to_string(),
            cooldown_ms: u64::try_from(cooldown.as_millis()).unwrap_or(u64::MAX),
            lowest_free: reuse == ReusePolicy::LowestFree,
            ranges: ranges
                .iter()
                .map(|spec| RangeEntry::new(spec, RangeSource::Cni))
                .collect(),
            exclusions: exclusions
                .iter()
                .map(|e| (e.network().to_string(), e.reason().to_owned()))
                .collect(),
            interfaces: Vec::new(),
            interface_backed: false,
        }
    }

    /// The same pool with every range marked as coming from `source`.
    pub fn with_source(mut self, source: RangeSource) -> PoolSpec {
        for range in &mut self.ranges {
            range.source = source;
        }
        self
    }

    /// The entry of the range with the same addresses as `spec` (whatever its gateway).
    pub fn entry_at(&self, spec: &RangeSpec) -> Option<usize> {
        self.ranges.iter().position(|entry| {
            entry
                .spec()
                .is_some_and(|s| s.start() == spec.start() && s.end() == spec.end())
        })
    }
}

/// The configuration of a scope: what its pools are.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScopeConfig {
    pub pools: Vec<PoolSpec>,
}

/// The derived state of a scope, written after every change. A snapshot's occupancy blocks
/// every allocated and every cooling address; the cooldowns themselves are rows
/// ([`StoredCooldown`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeState {
    /// The configuration the snapshots were taken under.
    pub config: ScopeConfig,
    pub next_generation: u64,
    pub snapshots: Vec<(PoolName, PoolSnapshot)>,
}

/// One cooling address as stored: released from (or given back to) `pool` at `released_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCooldown {
    pub pool: PoolName,
    pub addr: IpAddr,
    pub released_at: Timestamp,
}

/// One allocation as stored: exactly what an engine restores.
pub type StoredAllocation = RestoredAllocation;

/// A durable store of scopes. Only binaries choose a backend.
pub trait Store {
    type Txn<'a>: Txn
    where
        Self: 'a;

    /// Starts an exclusive transaction: no other process or thread writes until it ends.
    fn begin(&mut self) -> Result<Self::Txn<'_>, StoreError>;
}

/// One exclusive transaction. Dropping it without [`Txn::commit`] changes nothing.
pub trait Txn {
    /// Every scope with state or allocations.
    fn scopes(&mut self) -> Result<Vec<String>, StoreError>;
    /// The scope's derived state, if it has any. A corrupt state reads as `Ok(None)` with the
    /// reason in the second value, so callers rebuild it from the allocations.
    fn scope_state(
        &mut self,
        scope: &str,
    ) -> Result<(Option<ScopeState>, Option<String>), StoreError>;
    fn put_scope_state(&mut self, scope: &str, state: &ScopeState) -> Result<(), StoreError>;
    /// The configuration the scope's derived state was stored under; `None` without state or
    /// when it does not parse.
    fn stored_config(&mut self, scope: &str) -> Result<Option<ScopeConfig>, StoreError>;
    /// Every cooldown of the scope, oldest release first.
    fn cooldowns(&mut self, scope: &str) -> Result<Vec<StoredCooldown>, StoreError>;
    /// The cooldowns of one pool and family, oldest release first: those released at or
    /// before `ran_out_by` (at most `limit`), then the next one, if any. A row at an
    /// allocated address is skipped: it is no cooldown.
    fn oldest_cooldowns(
        &mut self,
        scope: &str,
        pool: &PoolName,
        family: Family,
        ran_out_by: Timestamp,
        limit: usize,
    ) -> Result<Vec<StoredCooldown>, StoreError>;
    /// Records a cooldown, replacing any at the same address.
    fn put_cooldown(&mut self, scope: &str, cooldown: &StoredCooldown) -> Result<(), StoreError>;
    fn delete_cooldown(&mut self, scope: &str, addr: IpAddr) -> Result<(), StoreError>;
    /// Deletes one pool and family's cooldowns released before `before` (all with `None`).
    fn delete_cooldowns_before(
        &mut self,
        scope: &str,
        pool: &PoolName,
        family: Family,
        before: Option<Timestamp>,
    ) -> Result<(), StoreError>;
    /// Deletes every cooldown of the scope.
    fn delete_cooldowns(&mut self, scope: &str) -> Result<(), StoreError>;
    /// The addresses whose allocations this transaction deleted in `scope`, in order: where
    /// its cooldowns started (see [`save_engine`]).
    fn released_addresses(&self, scope: &str) -> Vec<IpAddr>;
    fn allocations_by_key(
        &mut self,
        scope: &str,
        key: &AttachmentKey,
    ) -> Result<Vec<StoredAllocation>, StoreError>;
    fn allocation_by_addr(
        &mut self,
        scope: &str,
        addr: IpAddr,
    ) -> Result<Option<StoredAllocation>, StoreError>;
    fn all_allocations(&mut self, scope: &str) -> Result<Vec<StoredAllocation>, StoreError>;
    /// Records an allocation, and deletes any cooldown at its address.
    fn put_allocation(
        &mut self,
        scope: &str,
        allocation: &StoredAllocation,
    ) -> Result<(), StoreError>;
    fn delete_allocation(&mut self, scope: &str, addr: IpAddr) -> Result<(), StoreError>;
    /// The leak collector's suspects in `scope` (see [`collect_garbage`]), by attachment.
    fn gc_suspects(&mut self, scope: &str) -> Result<Vec<GcSuspect>, StoreError>;
    /// Records a suspect, replacing any of the same attachment.
    fn put_gc_suspect(&mut self, scope: &str, suspect: &GcSuspect) -> Result<(), StoreError>;
    fn delete_gc_suspect(&mut self, scope: &str, key: &AttachmentKey) -> Result<(), StoreError>;
    /// Records an event of the allocation history (see `history.rs`), durable with the
    /// transaction's other writes.
    fn record(&mut self, event: HistoryRecord<'_>) -> Result<(), StoreError>;
    /// [`Txn::record`] of an owned event.
    fn record_history(&mut self, event: &HistoryEvent) -> Result<(), StoreError> {
        self.record(event.into())
    }
    /// Drops the oldest events past `limits` at `now`, in batches ([`PRUNE_BATCH`]): most
    /// calls only look. Returns how many were dropped.
    fn prune_history(&mut self, limits: &HistoryLimits, now: Timestamp) -> Result<u64, StoreError>;
    /// The events `query` matches, newest first.
    fn history(&mut self, query: &HistoryQuery) -> Result<Vec<HistoryEvent>, StoreError>;
    /// Who held `addr` at `at`: per scope, the allocation event in force then (its last event
    /// at or before `at`, when that is an allocation).
    fn held_at(&mut self, addr: IpAddr, at: Timestamp) -> Result<Vec<HistoryEvent>, StoreError>;
    /// Makes every write of the transaction durable, then ends it.
    fn commit(self) -> Result<(), StoreError>;
    /// Ends a transaction that wrote nothing, once everything it read is durable: an answer
    /// given from what it read (an ADD that finds its attachment already recorded, a DEL
    /// that finds nothing to release) may rest on another writer's commit that has not
    /// been synced yet, because its writer was killed between commit and sync.
    fn finish(self) -> Result<(), StoreError>;
}
