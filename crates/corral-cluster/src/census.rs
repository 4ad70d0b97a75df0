//! The cluster-wide budget of demand writes, as values: each node's share of the budget
//! ([`demand_interval`]: one demand write per `nodes / demand_writes_per_sec` seconds, never
//! more than one a second), and the node count the leader publishes for the agents to divide
//! by (`meta/census`, a [`CensusRecord`]; [`census_to_publish`]).
//!
//! The count is a record the leader writes only when the number of registered nodes outgrows
//! it or falls below half of it, with an eighth of headroom: growing from 0 to 100,000 nodes
//! writes it about 90 times. Agents learn it with no request of their own: each demand write
//! reads it back in the same transaction. A count-only read of `nodes/` by every agent would
//! make etcd walk every registration each time, N agents times N keys.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The shortest time between two demand writes of one node, whatever the budget: the rule
/// before there was one (at most once a second), kept for small clusters.
pub const DEMAND_MIN_INTERVAL: Duration = Duration::from_secs(1);

/// `meta/census`'s value: the node count the agents pace their demand writes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CensusRecord {
    /// At least the number of registered nodes when it was written (up to an eighth more).
    pub nodes: u64,
}

/// The count to publish when `registered` nodes are registered and `published` is the count
/// last written (`None`: not known to have been written), if it must be written: when the
/// nodes outgrew it, or fell below half of it. What it writes is an eighth above the count, so
/// the next growth that must be written is an eighth away.
pub fn census_to_publish(published: Option<u64>, registered: u64) -> Option<u64> {
    match published {
        Some(count) if registered <= count && registered.saturating_mul(2) >= count => None,
        _ => Some(registered.saturating_add(registered / 8)),
    }
}

/// The shortest time between two demand writes of one node when `nodes` nodes share a budget
/// of `writes_per_sec` demand writes a second (at least [`DEMAND_MIN_INTERVAL`]). A budget of 0
/// (refused by the configuration) is taken as no budget.
pub fn demand_interval(nodes: u64, writes_per_sec: u64) -> Duration {
    if writes_per_sec == 0 {
        return DEMAND_MIN_INTERVAL;
    }
    let nanos = u128::from(nodes) * 1_000_000_000 / u128::from(writes_per_sec);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)).max(DEMAND_MIN_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_interval_is_the_nodes_share_of_the_budget_and_at_least_a_second() {
        assert_eq!(demand_interval(10_000, 1_000), Duration::from_secs(10));
        assert_eq!(demand_interval(100_000, 1_000), Duration::from_secs(100));
        assert_eq!(demand_interval(1_500, 1_000), Duration::from_millis(1_500));
        assert_eq!(demand_interval(10, 1_000), DEMAND_MIN_INTERVAL);
        assert_eq!(demand_interval(0, 1_000), DEMAND_MIN_INTERVAL);
        assert_eq!(demand_interval(10_000, 0), DEMAND_MIN_INTERVAL);
        assert_eq!(demand_interval(u64::MAX, 1), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn the_census_is_written_when_outgrown_or_halved() {
        assert_eq!(census_to_publish(None, 0), Some(0));
        assert_eq!(census_to_publish(None, 800), Some(900));
        assert_eq!(census_to_publish(Some(900), 900), None);
        assert_eq!(census_to_publish(Some(900), 901), Some(1_013));
        assert_eq!(census_to_publish(Some(900), 450), None);
        assert_eq!(census_to_publish(Some(900), 449), Some(505));
        assert_eq!(census_to_publish(Some(0), 0), None);
        assert_eq!(census_to_publish(Some(0), 1), Some(1));
    }

    proptest! {
        /// Whatever the registrations do, the count the agents divide by is never below the
        /// nodes registered (the budget holds), never more than twice as many plus one (the
        /// share is not wasted), and growing to N nodes writes it O(log N) times.
        #[test]
        fn the_published_count_bounds_the_registered_one(
            steps in proptest::collection::vec((any::<bool>(), 0u64..2_000), 1..200)
        ) {
            let mut registered: u64 = 0;
            let mut published = None;
            let mut writes = 0u32;
            let mut most = 0u64;
            for (grow, by) in steps {
                registered = if grow { registered + by } else { registered.saturating_sub(by) };
                most = most.max(registered);
                if let Some(count) = census_to_publish(published, registered) {
                    published = Some(count);
                    writes += 1;
                }
                let count = published.unwrap();
                prop_assert!(count >= registered, "{count} < {registered}");
                prop_assert!(count <= 2 * registered + 1, "{count} for {registered}");
            }
            prop_assert!(writes >= 1);
        }

        /// One node at a time from 0 to `n`: about log(n) / log(9/8) writes, plus one per
        /// node below 8 (an eighth of a small count is 0).
        #[test]
        fn growing_one_node_at_a_time_writes_logarithmically(n in 1u64..200_000) {
            let mut published = None;
            let mut writes = 0u32;
            for registered in 0..=n {
                if let Some(count) = census_to_publish(published, registered) {
                    published = Some(count);
                    writes += 1;
                }
            }
            let bound = 16.0 + (n as f64).ln() / (9.0f64 / 8.0).ln();
            prop_assert!(f64::from(writes) <= bound, "{writes} writes to {n}");
        }
    }
}
