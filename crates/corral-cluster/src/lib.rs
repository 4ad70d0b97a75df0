//! corral-cluster: the pure decisions of corral's cluster side, as values.
//!
//! The crate does no I/O, starts no threads, has no async and never reads a clock: time comes
//! in as values. It holds the cluster configuration (`config`), the etcd key layout and value
//! records (`keys`), the node CIDR and node-ID spaces (`space`), Contiv's node-ID address plan
//! (`plan`), nodeipam's resync backoff (`backoff`) and the operator's cache of the cluster
//! (`view`), which proposes grants the operator commits in one fenced etcd transaction, and the
//! `[cluster]` and `[log]` tables both daemons' configuration files share (`daemon`).

pub mod backoff;
pub mod blocks;
pub mod census;
pub mod check;
pub mod cloud;
pub mod config;
pub mod daemon;
pub mod epoch;
pub mod fuzz;
pub mod history;
pub mod keys;
pub mod net;
pub mod plan;
pub mod removal;
pub mod removed;
pub mod report;
pub mod space;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
mod text;
pub mod view;

pub use backoff::{Resync, RetryState};
pub use census::{CensusRecord, census_to_publish, demand_interval};
pub use check::{
    AgentCheck, AgentHoldings, CloudTruth, Entry, agents_problems, block_capacity, block_range,
    check, cloud_problems, election_candidate, election_leader, election_problems,
    holdings_problems, node_range,
};
pub use config::{
    AppliedConfigRecord, CloudPool, CloudPoolConfig, ClusterConfig, ConfigError, DemandConfig,
    FamilyConfig, HeldGrant, HistoryConfig, MAX_LEASE_TTL_SECS, NodeCidrSync, NodeIdBound,
    NodeIdPlanConfig, PoolConfig, PoolKind, PoolMode, PoolRule, ReleasePolicy, ResyncConfig,
    WarmTargets, WatermarkOverride, Watermarks,
};
pub use epoch::{Epoch, EpochMemory, KeptEpoch, Observed, Regression, assertions_owed};
pub use keys::{
    CloudAttachment, CloudId, CloudIntentRecord, CloudInterfaceRecord, CloudOp, ClusterName,
    DelegationRecord, DemandRecord, FamilyDemand, GrantEnd, GrantRecord, HeldCloudAddress,
    HeldRange, HistoryIndex, HistoryRecord, HoldingsRecord, Key, KeyError, Keys, LiveRecord,
    NodeIdOfNodeRecord, NodeIdRecord, NodeName, NodeRecord, OwnedRecord, QuarantineRecord,
    ReassertRecord, RecoverRecord, RefusedGrant, RefusedNodeId, ReleaseRecord, ReleaseState,
    RemovalRecord, SchemaRecord, ValueError, decode_value, encode_value,
};
pub use keys::{QuarantineState, RemovalMode, RemovalPhase, SilenceRecord};
pub use keys::{WaitingCause, WaitingEntry, WaitingRecord};
pub use plan::{NodePlan, PlanError, host_interconnect_of, node_id_of_pod_ip, pod_subnet_of};
pub use removal::{RemovalStep, removal_steps};
pub use removed::{QuarantinedReport, RemovedNodeReport};
pub use report::{BlockReport, NodeReport, StatusReport, WaitReport};
pub use space::{CidrSpace, NodeIdSpace, SpaceError, SpaceStats};

/// Re-exported so callers name the same family, pool and CIDR types.
pub use corral_core::{Family, PoolName};
pub use ipnet::IpNet;
pub use view::{
    BlockProposal, CloudEntry, ClusterView, Condition, Needs, NodeBlockStats, NodeCidr, NodeEntry,
    NodeInfo, NodeWait, PoolFamily, Problem, Proposal, ProposeError, QuarantinedFrom,
    ReleaseChange, ReleaseKind, Removal, RemovedGrant, RemovedNodeId, Revocation, WaitReason,
    WaitUnit, WaitingOn, WaitingQuarantine, is_config_key,
};
