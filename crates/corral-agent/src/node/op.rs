//! What the node state is asked and what it answers: [`Op`], one operation as the committer
//! receives it, [`Reply`], its answer, and the domain types they carry (cluster grants, the
//! release handshake, cloud interfaces, the reports the cluster link publishes, gauges).

use std::collections::{BTreeMap, BTreeSet};

use corral_api as api;
use corral_core::{Family, InterfaceId, IpNet, MacAddr, PoolName, RangeSpec};
use corral_store::Checkpoint;

use super::request::{
    AddExclusion, AddInterface, Allocate, CniAdd, CniCheck, CniDel, CniGc, CniStatus, Gc, History,
    ImportIpamd, LeaseStart, LeaseStop, PoolRange, Release, RemoveExclusion,
};

/// One operation of the API, as the committer receives it.
#[derive(Debug)]
pub enum Op {
    Allocate(Allocate),
    Release(Release),
    LeaseStart(LeaseStart),
    LeaseStop(LeaseStop),
    Dump(Option<String>),
    Status(Option<String>),
    Pools(Option<String>),
    AddRange(PoolRange),
    RemoveRange(PoolRange),
    AddExclusion(AddExclusion),
    RemoveExclusion(RemoveExclusion),
    Export,
    /// A state checkpoint (`corral export`), into empty scopes; commits on its own.
    Import(Checkpoint),
    CniAdd(CniAdd),
    CniDel(CniDel),
    CniCheck(CniCheck),
    /// CNI GC: the leak collector over a network's attachments (`gc.rs`); commits on its own.
    CniGc(CniGc),
    CniStatus(CniStatus),
    /// The leak collector over a scope's attachments (`gc.rs`); commits on its own.
    Gc(Gc),
    /// Reconciles the `node` scope's cluster ranges with the complete set the cluster grants
    /// the node now (see [`ClusterRanges`]); answered with [`Reply::ClusterRanges`].
    SetClusterRanges(ClusterRanges),
    /// The release handshake of a block: surrenders the cluster range if it holds no
    /// allocation, in one commit (`blocks.rs`); answered with [`Reply::Surrender`].
    SurrenderBlock {
        pool: PoolName,
        range: RangeSpec,
    },
    /// Takes a surrendered block back while its grant lasts (its handshake was withdrawn).
    ReclaimBlock {
        pool: PoolName,
        range: RangeSpec,
    },
    /// The node scope's counts and cluster ranges, for the demand of block pools; answered
    /// with [`Reply::Blocks`].
    BlockReport,
    /// Excludes what the node's routes and addresses cover (`local_routes.rs`).
    ReserveLocalRoutes(crate::local_routes::LocalRoutesRequest),
    /// Expires leases and ends cooldowns that have run out.
    Tick,
    /// Counts for the metrics endpoint.
    Gauges,
    /// The allocation history (`history.rs`): read from the store, written by every commit.
    History(History),
    /// The node's interface-backed pools, or one (`interfaces.rs`).
    Interfaces(Option<PoolName>),
    /// One interface with its use.
    Interface(InterfaceId),
    /// Adds an interface (and its addresses, all or nothing); commits what came before first.
    AddInterface(AddInterface),
    RemoveInterface {
        id: InterfaceId,
        force: bool,
    },
    AddInterfaceAddress {
        id: InterfaceId,
        address: IpNet,
    },
    RemoveInterfaceAddress {
        id: InterfaceId,
        address: IpNet,
        force: bool,
    },
    /// AWS VPC CNI's ipamd checkpoint into an interface-backed pool, all or nothing; commits
    /// what came before first.
    ImportIpamd(ImportIpamd),
    /// Interface counts for the metrics endpoint.
    InterfaceGauges,
    /// Makes the cloud pools' interfaces match the cluster's `interfaces/` records (`cloud.rs`);
    /// answered with [`Reply::CloudInterfaces`].
    SetCloudInterfaces(CloudInterfaces),
    /// The release handshake of a cloud address or prefix: surrendered if nothing is allocated
    /// in it and nothing cooling, in one commit; answered with [`Reply::Surrender`].
    SurrenderCloudAddress {
        pool: PoolName,
        address: IpNet,
    },
    /// The interface-backed pools' counts and addresses, for the demand of cloud pools;
    /// answered with [`Reply::Cloud`].
    CloudReport,
}

impl Op {
    /// Whether the operation is one of the short, frequent ones a caller may commit on its
    /// own runtime thread when the committer is idle (see `committer.rs`); the rest (dumps,
    /// imports, pool changes) always run on the committer's thread.
    pub(crate) fn is_quick(&self) -> bool {
        matches!(
            self,
            Op::Allocate(_)
                | Op::Release(_)
                | Op::LeaseStart(_)
                | Op::LeaseStop(_)
                | Op::CniAdd(_)
                | Op::CniDel(_)
                | Op::CniCheck(_)
        )
    }

    /// Whether the operation may change state (and so belongs to a commit).
    pub(super) fn writes(&self) -> bool {
        !matches!(
            self,
            Op::Dump(_)
                | Op::Status(_)
                | Op::Pools(_)
                | Op::Export
                | Op::Gauges
                | Op::History(_)
                | Op::CniCheck(_)
                | Op::BlockReport
                | Op::Interfaces(_)
                | Op::Interface(_)
                | Op::InterfaceGauges
                | Op::CloudReport
        )
    }

    /// Operations that change several things, undone on a refusal part way by rebuilding the
    /// node scope from the store; the batch commits what came before them first.
    pub(super) fn undone_by_reload(&self) -> bool {
        matches!(
            self,
            Op::AddInterface(_) | Op::ImportIpamd(_) | Op::SetCloudInterfaces(_)
        )
    }
}

/// What an operation answers.
#[derive(Debug)]
pub enum Reply {
    Allocated(api::AllocateResponse),
    Released(api::ReleaseResponse),
    Lease(api::Lease),
    Done,
    Dump(api::DumpResponse),
    Status(api::StatusResponse),
    Pools(api::PoolsResponse),
    RangeRemoved(api::RangeRemoved),
    Checkpoint(serde_json::Value),
    ScopeStatus(api::ScopeStatus),
    Gauges(Vec<Gauge>),
    /// A tick: how many leases expired.
    Expired(usize),
    LocalRoutes(api::ReserveLocalRoutesResponse),
    ClusterRanges(ClusterRangesOutcome),
    Surrender(Surrender),
    Blocks(BlockReport),
    Gc(api::GcResponse),
    Interfaces(api::InterfacesResponse),
    Interface(api::InterfaceInfo),
    InterfaceRemoved(api::InterfaceRemoved),
    IpamdImported(api::IpamdImportResponse),
    InterfaceGauges(Vec<InterfaceGauge>),
    CloudInterfaces(CloudOutcome),
    Cloud(CloudReport),
    History(api::HistoryResponse),
}

/// Every range the cluster grants this node now, of all pools: the argument of
/// [`Op::SetClusterRanges`], which makes the `node` scope's ranges of source `cluster` exactly
/// these, in one commit:
///
/// - a granted range not present is added to its pool (created with default settings if
///   missing); a granted range that is draining is active again;
/// - a cluster range no longer granted is removed: at once if it holds nothing, else it drains
///   (nothing new from it, its allocations stay, it leaves with the last release);
/// - ranges of other sources (file, api) are never touched: a granted range over one of them
///   is not applied, and is reported in [`ClusterRangesOutcome::refused`] and as a warning in
///   `status` until the next set of grants;
/// - the same set again changes nothing and writes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRanges {
    pub ranges: Vec<(PoolName, RangeSpec)>,
    /// The families each block pool of the cluster configuration has: a CNI ADD on such a
    /// pool takes an address of every one of them, or waits (retry later) until each has a
    /// free address, so a dual-stack pod never starts with one family because the other
    /// family's block was granted a moment later.
    pub block_families: BTreeMap<PoolName, Vec<Family>>,
}

/// What [`Op::SetClusterRanges`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRangesOutcome {
    /// Granted ranges added (or whose drain was cancelled).
    pub added: Vec<(PoolName, RangeSpec)>,
    /// Ranges no longer granted that held nothing: gone.
    pub removed: Vec<(PoolName, RangeSpec)>,
    /// Ranges no longer granted that hold allocations: draining until the last is released.
    pub draining: Vec<(PoolName, RangeSpec)>,
    /// Granted ranges not applied, one sentence each (also in `status` warnings).
    pub refused: Vec<String>,
}

/// One line of per-pool counts for the metrics endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Gauge {
    pub scope: String,
    pub pool: String,
    pub family: &'static str,
    pub used: f64,
    pub free: f64,
    pub excluded: f64,
    pub cooling: f64,
}

/// What [`Op::SurrenderBlock`](super::Op::SurrenderBlock) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Surrender {
    /// Surrendered now, durably with this batch.
    Surrendered,
    /// Surrendered before (a `ready` to send again, e.g. after a restart).
    AlreadySurrendered,
    /// Not surrendered, nothing changed: why.
    Refused(String),
}

/// One cluster range of the node scope, as [`BlockReport`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldRange {
    pub pool: PoolName,
    pub spec: RangeSpec,
    pub n_allocated: u64,
    pub draining: bool,
}

/// The node scope's counts per pool and family, its cluster ranges, and its surrendered ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockReport {
    /// `(pool, family, used, free)` of every pool of the node scope.
    pub stats: Vec<(PoolName, Family, u64, u64)>,
    /// The cluster ranges in the engine (active or draining).
    pub ranges: Vec<HeldRange>,
    /// The surrendered ranges: out of the engine while their grant lasts.
    pub surrendered: Vec<(PoolName, RangeSpec)>,
}

/// The reason of the exclusion that marks an address surrendered in a release handshake.
pub const SURRENDERED_REASON: &str = "cloud address surrendered in a release handshake";
/// The reason of the exclusion that freezes an address gone from its cloud record while in use.
pub const FROZEN_REASON: &str = "cloud address gone from its interface record while in use";

/// One attached interface as the cluster's record describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudInterface {
    pub pool: PoolName,
    pub id: InterfaceId,
    /// The attachment's device index (0: the primary interface).
    pub device_number: u32,
    pub subnets: Vec<IpNet>,
    pub mac: MacAddr,
    /// The pool's CIDRs of the families (the VPC's), routed through the interface.
    pub routes: Vec<IpNet>,
    /// The record's secondary addresses and delegated prefixes.
    pub addresses: Vec<IpNet>,
    /// The interface's primary address (never a pod's).
    pub primary_addresses: Vec<std::net::IpAddr>,
}

/// The argument of [`Op::SetCloudInterfaces`](super::Op::SetCloudInterfaces).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloudInterfaces {
    /// The cloud pools of the cluster configuration: only their interfaces are reconciled.
    pub pools: BTreeSet<PoolName>,
    /// The attached interfaces the records list.
    pub interfaces: Vec<CloudInterface>,
    /// Interfaces left exactly as they are: their record is attaching, or cannot be read.
    pub untouched: BTreeSet<InterfaceId>,
    /// Surrendered addresses to keep out (their handshake is open, or not judged yet); every
    /// other surrendered marker of the pools is dropped, and the address is served again if
    /// a record lists it.
    pub keep_surrendered: BTreeSet<(PoolName, IpNet)>,
}

/// What [`Op::SetCloudInterfaces`](super::Op::SetCloudInterfaces) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloudOutcome {
    /// Interfaces and addresses added (`interface address` or `interface`).
    pub added: Vec<String>,
    /// Addresses and interfaces removed.
    pub removed: Vec<String>,
    /// Addresses frozen (gone from the record while in use), as `pool address`.
    pub frozen: Vec<(PoolName, IpNet)>,
    /// Surrendered markers dropped (the address served again if on a record).
    pub reclaimed: Vec<(PoolName, IpNet)>,
    /// One sentence per thing not done, and per frozen address.
    pub problems: Vec<String>,
}

impl CloudOutcome {
    /// Whether the node scope changed.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty() && self.removed.is_empty() && self.reclaimed.is_empty())
    }
}

/// What [`Op::SurrenderCloudAddress`](super::Op::SurrenderCloudAddress) did.
pub use Surrender as CloudSurrender;

/// One address or prefix of a cloud pool, as [`CloudReport`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudAddress {
    pub pool: PoolName,
    pub interface: InterfaceId,
    pub address: IpNet,
    pub n_allocated: u64,
    /// Nothing allocated and nothing cooling in it: it could be given back.
    pub free: bool,
    pub frozen: bool,
}

/// The node scope's interface-backed pools: counts, addresses, markers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloudReport {
    /// `(pool, family, used, free)` of every interface-backed pool (free: what can be handed
    /// out now, frozen addresses not counted).
    pub stats: Vec<(PoolName, Family, u64, u64)>,
    pub addresses: Vec<CloudAddress>,
    /// Surrendered markers.
    pub surrendered: Vec<(PoolName, IpNet)>,
    /// Frozen addresses.
    pub frozen: Vec<(PoolName, IpNet)>,
}

/// One line of interface counts for `/metrics`: a pool's totals (`interface` none) or one
/// interface's.
#[derive(Clone, Debug, PartialEq)]
pub struct InterfaceGauge {
    pub pool: String,
    /// The interface's id and device number.
    pub interface: Option<(String, u32)>,
    pub interfaces: f64,
    pub assigned: f64,
    pub free: f64,
    pub cooling: f64,
}

/// An operation with the one answer it gets. [`Committer::call`](crate::committer::Committer::call)
/// submits it and hands back that answer, typed: no caller matches a [`Reply`], so none can
/// meet one it did not expect. The pairs are listed once, below, each with the [`Op`] it makes
/// and the [`Reply`] variant that carries its answer.
pub trait Request {
    /// What the operation answers.
    type Answer;

    /// The operation the committer runs.
    fn into_op(self) -> Op;

    /// The answer out of the reply the node state gave; a reply of another variant comes
    /// back as it is (it cannot happen: the node state builds each reply with [`reply`]).
    ///
    /// [`reply`]: Request::reply
    fn answer(reply: Reply) -> Result<Self::Answer, Box<Reply>>;

    /// The reply that carries `answer`: the node state answers each operation through its
    /// request's `reply`, so the two sides name one variant.
    fn reply(answer: Self::Answer) -> Reply;
}

/// The requests of the operations whose argument type names no other operation's.
macro_rules! requests {
    ($($request:ty => $op:ident, $variant:ident($answer:ty);)*) => {$(
        impl Request for $request {
            type Answer = $answer;

            fn into_op(self) -> Op {
                Op::$op(self)
            }

            fn answer(reply: Reply) -> Result<$answer, Box<Reply>> {
                match reply {
                    Reply::$variant(answer) => Ok(answer),
                    other => Err(Box::new(other)),
                }
            }

            fn reply(answer: $answer) -> Reply {
                Reply::$variant(answer)
            }
        }
    )*};
}

/// Requests that wrap an argument another operation shares (or none), with the operation
/// they make.
macro_rules! wrapped {
    ($($(#[$doc:meta])* $name:ident $(($arg:ty))? $({ $($field:ident: $fty:ty),* $(,)? })?
        => |$this:ident| $op:expr, $variant:ident $(($answer:ty))?;)*) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name $((pub $arg);)? $({ $(pub $field: $fty),* })?

        impl Request for $name {
            type Answer = wrapped!(@answer $($answer)?);

            fn into_op(self) -> Op {
                let $this = self;
                $op
            }

            fn answer(reply: Reply) -> Result<Self::Answer, Box<Reply>> {
                wrapped!(@match reply, $variant $(, $answer)?)
            }

            fn reply(answer: Self::Answer) -> Reply {
                wrapped!(@reply answer, $variant $(, $answer)?)
            }
        }
    )*};
    (@reply $value:ident, $variant:ident, $answer:ty) => { Reply::$variant($value) };
    (@reply $value:ident, $variant:ident) => {{
        let () = $value;
        Reply::$variant
    }};
    (@answer $answer:ty) => { $answer };
    (@answer) => { () };
    (@match $reply:ident, $variant:ident, $answer:ty) => {
        match $reply {
            Reply::$variant(answer) => Ok(answer),
            other => Err(Box::new(other)),
        }
    };
    (@match $reply:ident, $variant:ident) => {
        match $reply {
            Reply::$variant => Ok(()),
            other => Err(Box::new(other)),
        }
    };
}

/// The requests of the operations that answer only that they are done.
macro_rules! done_requests {
    ($($request:ty => $op:ident;)*) => {$(
        impl Request for $request {
            type Answer = ();

            fn into_op(self) -> Op {
                Op::$op(self)
            }

            fn answer(reply: Reply) -> Result<(), Box<Reply>> {
                match reply {
                    Reply::Done => Ok(()),
                    other => Err(Box::new(other)),
                }
            }

            fn reply((): ()) -> Reply {
                Reply::Done
            }
        }
    )*};
}

done_requests! {
    LeaseStop => LeaseStop;
    AddExclusion => AddExclusion;
    RemoveExclusion => RemoveExclusion;
}

requests! {
    Allocate => Allocate, Allocated(api::AllocateResponse);
    Release => Release, Released(api::ReleaseResponse);
    LeaseStart => LeaseStart, Lease(api::Lease);
    CniAdd => CniAdd, Allocated(api::AllocateResponse);
    CniDel => CniDel, Released(api::ReleaseResponse);
    CniCheck => CniCheck, Allocated(api::AllocateResponse);
    CniGc => CniGc, Gc(api::GcResponse);
    Gc => Gc, Gc(api::GcResponse);
    CniStatus => CniStatus, ScopeStatus(api::ScopeStatus);
    ClusterRanges => SetClusterRanges, ClusterRanges(ClusterRangesOutcome);
    crate::local_routes::LocalRoutesRequest => ReserveLocalRoutes,
        LocalRoutes(api::ReserveLocalRoutesResponse);
    AddInterface => AddInterface, Interface(api::InterfaceInfo);
    ImportIpamd => ImportIpamd, IpamdImported(api::IpamdImportResponse);
    CloudInterfaces => SetCloudInterfaces, CloudInterfaces(CloudOutcome);
    History => History, History(api::HistoryResponse);
}

wrapped! {
    /// [`Op::Dump`] of one scope, or all.
    Dump(Option<String>) => |r| Op::Dump(r.0), Dump(api::DumpResponse);
    /// [`Op::Status`] of one scope, or all.
    Status(Option<String>) => |r| Op::Status(r.0), Status(api::StatusResponse);
    /// [`Op::Pools`] of one scope, or all.
    Pools(Option<String>) => |r| Op::Pools(r.0), Pools(api::PoolsResponse);
    /// [`Op::AddRange`].
    AddRange(PoolRange) => |r| Op::AddRange(r.0), Done;
    /// [`Op::RemoveRange`].
    RemoveRange(PoolRange) => |r| Op::RemoveRange(r.0), RangeRemoved(api::RangeRemoved);
    /// [`Op::Export`].
    Export {} => |_r| Op::Export, Checkpoint(serde_json::Value);
    /// [`Op::Import`].
    Import(Checkpoint) => |r| Op::Import(r.0), Done;
    /// [`Op::SurrenderBlock`].
    SurrenderBlock { pool: PoolName, range: RangeSpec }
        => |r| Op::SurrenderBlock { pool: r.pool, range: r.range }, Surrender(Surrender);
    /// [`Op::ReclaimBlock`].
    ReclaimBlock { pool: PoolName, range: RangeSpec }
        => |r| Op::ReclaimBlock { pool: r.pool, range: r.range }, Done;
    /// [`Op::BlockReport`].
    ReportBlocks {} => |_r| Op::BlockReport, Blocks(BlockReport);
    /// [`Op::Tick`]: how many leases expired.
    Tick {} => |_r| Op::Tick, Expired(usize);
    /// [`Op::Gauges`].
    Gauges {} => |_r| Op::Gauges, Gauges(Vec<Gauge>);
    /// [`Op::Interfaces`] of one pool, or all.
    Interfaces(Option<PoolName>) => |r| Op::Interfaces(r.0), Interfaces(api::InterfacesResponse);
    /// [`Op::Interface`].
    Interface(InterfaceId) => |r| Op::Interface(r.0), Interface(api::InterfaceInfo);
    /// [`Op::RemoveInterface`].
    RemoveInterface { id: InterfaceId, force: bool }
        => |r| Op::RemoveInterface { id: r.id, force: r.force },
        InterfaceRemoved(api::InterfaceRemoved);
    /// [`Op::AddInterfaceAddress`].
    AddInterfaceAddress { id: InterfaceId, address: IpNet }
        => |r| Op::AddInterfaceAddress { id: r.id, address: r.address },
        Interface(api::InterfaceInfo);
    /// [`Op::RemoveInterfaceAddress`].
    RemoveInterfaceAddress { id: InterfaceId, address: IpNet, force: bool }
        => |r| Op::RemoveInterfaceAddress { id: r.id, address: r.address, force: r.force },
        Interface(api::InterfaceInfo);
    /// [`Op::InterfaceGauges`].
    InterfaceGauges {} => |_r| Op::InterfaceGauges, InterfaceGauges(Vec<InterfaceGauge>);
    /// [`Op::SurrenderCloudAddress`].
    SurrenderCloudAddress { pool: PoolName, address: IpNet }
        => |r| Op::SurrenderCloudAddress { pool: r.pool, address: r.address },
        Surrender(Surrender);
    /// [`Op::CloudReport`].
    ReportCloud {} => |_r| Op::CloudReport, Cloud(CloudReport);
}
