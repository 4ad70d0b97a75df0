//! What every task of the cloud node manager shares: the store, the fence, the provider and
//! the claims of records being written (`Ctx`); a node's instance as described
//! (`InstanceInfo`); and the tags corral puts on the interfaces it creates. Cloud calls go to
//! the provider directly: the scheduler under it (`corral_cloud::Scheduled`) counts them by
//! action and outcome.
//!
//! Nothing here decides anything: it is the bottom layer the manager's other files stand on.

use std::sync::Arc;

use corral_cloud::InstanceState;
use corral_cluster::{CloudId, CloudInterfaceRecord, ClusterView, NodeName};

use crate::WallClock;
use crate::leader::logged::Term;

/// Tags corral puts on every interface it creates.
pub const TAG_CLUSTER: &str = "corral.io/cluster";
pub const TAG_NODE: &str = "corral.io/node";
pub const TAG_INTENT: &str = "corral.io/intent";
pub const TAG_CREATED_AT: &str = "corral.io/created-at";

/// What every task needs.
pub(super) struct Ctx<K, P> {
    pub(super) term: Term<K>,
    pub(super) provider: Arc<P>,
    pub(super) cluster: String,
    pub(super) clock: WallClock,
    /// Interface records being written by running tasks (not in the view yet): each checked
    /// with the view's against a new record, so two tasks never record one interface or
    /// address for two nodes; a node's go when its task's writes are applied to the view.
    pub(super) claims: Arc<std::sync::Mutex<Vec<(NodeName, CloudId, CloudInterfaceRecord)>>>,
}

impl<K: Clone, P> Clone for Ctx<K, P> {
    fn clone(&self) -> Self {
        Ctx {
            term: self.term.clone(),
            provider: Arc::clone(&self.provider),
            cluster: self.cluster.clone(),
            clock: Arc::clone(&self.clock),
            claims: Arc::clone(&self.claims),
        }
    }
}

/// A node's instance as described.
#[derive(Debug, Clone)]
pub(super) struct InstanceInfo {
    pub(super) instance_type: String,
    pub(super) state: InstanceState,
    pub(super) zone: String,
    pub(super) vpc_id: String,
    pub(super) subnet_id: String,
}

/// The instance a node registered with, if it named one.
pub(super) fn instance_of(view: &ClusterView, node: &NodeName) -> Option<String> {
    view.registration(node)
        .and_then(|e| e.record.instance_id.clone())
}
