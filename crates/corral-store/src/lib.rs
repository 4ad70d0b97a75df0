//! corral-store: durable state behind one trait, with SQLite as the embedded default.
//!
//! State is kept per *scope* (a CNI network, or an agent's node): its configuration (pools,
//! ranges, exclusions), its allocations, and its derived state (pool snapshots, cooldowns,
//! the next generation). The allocations are rows; the derived state lets a short-lived
//! process build a partial [`Engine`] from the snapshot and the few rows it needs, so a CNI
//! call costs the same whether the scope holds ten allocations or sixty thousand.
//!
//! Every transaction is exclusive and durable: when [`Txn::commit`] returns, its writes have
//! been synced to disk.

mod checkpoint;
mod codec;
mod hostlocal;
mod load;
mod sqlite;

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{
    AttachmentKey, Exclusion, Lease, PoolName, PoolSnapshot, RangeSpec, ReusePolicy, Timestamp,
};

pub use checkpoint::{
    CHECKPOINT_FORMAT, Checkpoint, CheckpointAllocation, CheckpointCooling, ScopeCheckpoint,
    export_checkpoint, import_checkpoint,
};
pub use hostlocal::{HostLocalEntry, host_local_allocations, read_host_local_dir};
pub use load::{Need, build_engine, save_engine};
pub use sqlite::{
    AGENT_FILE, DB_FILE, LOCK_FILE, SYNCED_FILE, SqliteStore, SqliteTxn, StoreHealth,
};

/// The schema version this build writes; older databases are migrated when opened.
pub const SCHEMA_VERSION: u32 = 1;

/// Something went wrong underneath; the transaction changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the state directory {path}: {source}")]
    Directory {
        path: String,
        #[source]
        source: std::io::Error,
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
            | StoreError::Taken { .. }
            | StoreError::SchemaTooNew { .. }
            | StoreError::Corrupt { .. }
            | StoreError::SyncFailed { .. } => false,
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
    /// Ranges in their canonical text form.
    pub ranges: Vec<String>,
    /// Exclusions as (network, reason).
    pub exclusions: Vec<(String, String)>,
}

impl PoolSpec {
    /// A pool specification from validated values.
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
            ranges: ranges.iter().map(ToString::to_string).collect(),
            exclusions: exclusions
                .iter()
                .map(|e| (e.network().to_string(), e.reason().to_owned()))
                .collect(),
        }
    }
}

/// The configuration of a scope: what its pools are.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScopeConfig {
    pub pools: Vec<PoolSpec>,
}

/// The derived state of a scope, written after every change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeState {
    /// The configuration the snapshots were taken under.
    pub config: ScopeConfig,
    pub next_generation: u64,
    pub snapshots: Vec<(PoolName, PoolSnapshot)>,
    pub cooling: Vec<(PoolName, IpAddr, Timestamp)>,
}

/// One allocation as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAllocation {
    pub pool: PoolName,
    pub addr: IpAddr,
    pub owner: String,
    pub key: Option<AttachmentKey>,
    pub generation: u64,
    pub lease: Option<Lease>,
}

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
    fn put_allocation(
        &mut self,
        scope: &str,
        allocation: &StoredAllocation,
    ) -> Result<(), StoreError>;
    fn delete_allocation(&mut self, scope: &str, addr: IpAddr) -> Result<(), StoreError>;
    /// Makes every write of the transaction durable, then ends it.
    fn commit(self) -> Result<(), StoreError>;
    /// Ends a transaction that wrote nothing, once everything it read is durable: an answer
    /// given from what it read (an ADD that finds its attachment already recorded, a DEL
    /// that finds nothing to release) may rest on another writer's commit that has not
    /// been synced yet, because its writer was killed between commit and sync.
    fn finish(self) -> Result<(), StoreError>;
}
