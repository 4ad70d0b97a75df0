//! `PendingNodes`: which nodes the leading loop's events concern, for a manager that runs
//! beside it (the cloud node manager, the to-cloud delegations), and the wake-up that goes with
//! them.

use std::collections::BTreeSet;

use corral_cluster::NodeName;
use tokio::sync::Notify;

/// Nodes to look at again (or all of them), and a wake-up for the task that takes them.
#[derive(Debug, Default)]
pub(crate) struct PendingNodes {
    state: std::sync::Mutex<(BTreeSet<NodeName>, bool)>,
    notify: Notify,
}

impl PendingNodes {
    /// One node must be looked at again.
    pub(crate) fn node(&self, node: &NodeName) {
        self.lock().0.insert(node.clone());
        self.notify.notify_one();
    }

    /// Every node must be looked at again.
    pub(crate) fn all(&self) {
        self.lock().1 = true;
        self.notify.notify_one();
    }

    /// The nodes noted since the last call, and whether all must be looked at.
    pub(crate) fn take(&self) -> (BTreeSet<NodeName>, bool) {
        let mut state = self.lock();
        (std::mem::take(&mut state.0), std::mem::take(&mut state.1))
    }

    /// Waits until something is noted (at once if it was noted since the last wait).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (BTreeSet<NodeName>, bool)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn noted_nodes_are_taken_once_and_a_note_before_the_wait_wakes_it() {
        let pending = PendingNodes::default();
        let a = NodeName::new("a").unwrap();
        pending.node(&a);
        pending.node(&a);
        pending.notified().await;
        assert_eq!(pending.take(), (BTreeSet::from([a]), false));
        assert_eq!(pending.take(), (BTreeSet::new(), false));
        pending.all();
        assert_eq!(pending.take(), (BTreeSet::new(), true));
    }
}
