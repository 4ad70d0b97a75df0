//! corral-core: the pure allocation engine behind every part of corral.
//!
//! A pool's capacity is a set of address intervals per family (CIDRs, start–end ranges,
//! single addresses, delegated prefixes), added and removed at run time. Allocation finds the
//! next free address in the same few steps at any fill level, and memory grows with what is
//! allocated, never with the size of a large range, so an IPv6 /64 per node costs nothing until
//! it is used.
//!
//! The crate does no I/O, starts no threads and reads no clock: operations that depend on
//! time take `now`, and results carry everything a store must persist.
//!
//! ```
//! use corral_core::{Engine, EngineConfig, Family, PoolName, RangeSpec, Request, Target, Timestamp};
//!
//! let mut engine = Engine::new(EngineConfig::default());
//! let pool = PoolName::default_pool();
//! engine.add_range(&pool, "10.0.0.0/24,gateway=10.0.0.1".parse().unwrap()).unwrap();
//! let request = Request { pool: &pool, owner: "pod-a", key: None, lease: None };
//! let allocation = engine.allocate(&request, Target::Next(Family::V4), Timestamp::ZERO).unwrap();
//! assert_eq!(allocation.addr.to_string(), "10.0.0.2");
//! ```

mod addr;
mod bitmap;
pub mod cni_code;
mod engine;
mod error;
mod gc;
mod input;
mod interfaces;
mod pool;
mod runs;
mod spec;
mod table;
mod time;

pub use addr::{Family, addr_value};
pub use engine::{
    Allocation, AllocationInfo, DrainedRange, DumpEntry, Engine, EngineConfig, FamilyStats,
    PoolDump, PoolSnapshot, RangeInfo, RangeRemoval, RangeSnapshot, Released, Request,
    RestoredAllocation, Target,
};
pub use error::{AllocError, Holder};
pub use gc::{
    DEFAULT_GC_GRACE, DEFAULT_GC_MAX_RELEASED, GcHeld, GcPlan, GcPolicy, GcRefusal, GcSuspect,
    held_by_attachment, plan_gc, release_suspect,
};
pub use input::{ECHO_CHARS, Echo, SpecError};
pub use interfaces::{
    Assignment, INTERFACE_EXCLUSION_PREFIX, InterfaceError, InterfaceId, InterfaceSpec,
    InterfaceStat, InterfaceStats, Interfaces, MAX_INTERFACE_ID_LEN, MacAddr, Removal,
    RemovalPolicy, Unassigned,
};
pub use pool::{OccupancySnapshot, PoolConfig, ReusePolicy};
pub use runs::RunSet;
pub use spec::{
    AttachmentKey, Exclusion, MAX_CONTAINER_ID_LEN, MAX_IFNAME_LEN, MAX_NETWORK_LEN, MAX_OWNER_LEN,
    MAX_POOL_NAME_LEN, PoolName, RangeSpec, Reserved, parse_addr, parse_net, validate_owner,
};
pub use time::{Lease, Timestamp};

/// Re-exported so callers name the same CIDR and UUID types as the engine.
pub use ipnet::IpNet;
pub use uuid::Uuid;
