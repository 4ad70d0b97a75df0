//! The agent's part in a cluster (`corral agent --etcd URL --node NAME`): register the node,
//! keep its liveness key on a lease, watch its own grants, and hand them to the node state as
//! the `node` scope's cluster ranges (durable before anything is allocated from them).
//!
//! Pod allocations never touch etcd: the link only moves address space. While etcd cannot
//! be reached the agent keeps serving from what it holds and says so in its status
//! (`degraded`, since when); nothing it holds is dropped for want of etcd, only a grant that
//! etcd says is gone (a node removal) drains.
//!
//! The link also answers the release handshake: a `marked` key of a block or cloud address it holds
//! under the named grant is surrendered through the committer (`Op::SurrenderBlock`,
//! `Op::SurrenderCloudAddress`), then answered by a compare-and-swap on the key's mod revision; a
//! degraded link answers nothing. A surrendered block is taken back (`Op::ReclaimBlock`) only after
//! `owned/` and `release/` were read in one transaction, because the leader deletes both in one
//! revision and two watches may deliver them apart. Before every apply, grants are screened
//! (`screen`): only a grant this process took up before, one made after the highest revision it had
//! seen, or one of space it holds is served; any other may be space etcd handed back after a
//! restore, and is refused and listed for the leader to revoke. A registration found gone is a
//! removal only if `removals/<node>` names it (the node drains); otherwise etcd forgot it, and the
//! node asserts its holdings and registers again. It also follows the operators' `election/`
//! keys, so that an ADD that got no grant can say whether any operator leads (`api.rs`), and
//! reads the leader's record of why it cannot serve the node (`owned/<node>/waiting`, under
//! the grants' own prefix: no watch more), so the ADD names that cause.
//!
//! The files, bottom up: `state.rs` (options and shared state), `liveness.rs` (one live agent
//! per node), `held.rs` (the grants held, and which are taken up), `blocks.rs` and
//! `cloud_pool.rs` (the demand of block and cloud pools), `demand.rs` (publishing it, paced
//! by `pace.rs` within the node's share of the cluster's demand write budget),
//! `holdings.rs` (asserting what the node holds), `handshake.rs` (the release handshake),
//! `cloud.rs` (interface records), `session.rs` (the rounds that run all of it).

pub mod blocks;
mod cloud;
pub mod cloud_pool;
mod demand;
mod fuzz;
mod handshake;
mod held;
pub mod holdings;
pub mod liveness;
mod pace;
mod session;
mod state;

pub use demand::DemandWriter;
pub(crate) use fuzz::fuzz_records;
pub(crate) use liveness::utc;
pub use pace::DemandPace;
pub use session::run;
pub(crate) use state::now_ms;
pub use state::{
    ClusterOptions, ClusterShared, ClusterState, Gate, SharedClusterState, api_status, backoff,
    machine_uid,
};
