//! `corral pool reserve-local-routes`: how the agent's answer is shown to people.

use corral_api::ReserveLocalRoutesResponse;

use crate::output::Table;

/// One line per local-route exclusion (added, unchanged or removed) and per conflict: an
/// allocated address that the node's routes or addresses cover, which the agent left
/// allocated and did not exclude.
pub fn table(response: &ReserveLocalRoutesResponse) -> String {
    let mut table = Table::new(&["POOL", "NETWORK", "REASON", "CHANGE"]);
    for exclusion in &response.excluded {
        let change = if response.added.contains(exclusion) {
            "added"
        } else {
            "unchanged"
        };
        table.push(vec![
            exclusion.pool.clone(),
            exclusion.network.clone(),
            exclusion.reason.clone(),
            change.to_owned(),
        ]);
    }
    for exclusion in &response.removed {
        table.push(vec![
            exclusion.pool.clone(),
            exclusion.network.clone(),
            exclusion.reason.clone(),
            "removed".to_owned(),
        ]);
    }
    for conflict in &response.conflicts {
        table.push(vec![
            conflict.pool.clone(),
            conflict.address.to_string(),
            conflict.reason.clone(),
            format!("conflict: allocated to {:?}, not excluded", conflict.owner),
        ]);
    }
    if table.is_empty() {
        format!(
            "no local route or interface address overlaps the pools of scope {}\n",
            response.scope
        )
    } else {
        table.render()
    }
}

#[cfg(test)]
mod tests {
    use corral_api::{LocalRouteConflict, LocalRouteExclusion};

    use super::*;

    fn exclusion(network: &str, reason: &str) -> LocalRouteExclusion {
        LocalRouteExclusion {
            pool: "default".into(),
            network: network.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn the_table_tells_added_unchanged_removed_and_conflicts() {
        let added = exclusion("10.88.0.5/32", "local address 10.88.0.5 of eth0");
        let kept = exclusion("10.88.7.0/24", "local route 10.88.7.0/24 dev eth1");
        let response = ReserveLocalRoutesResponse {
            scope: "node".into(),
            excluded: vec![added.clone(), kept],
            added: vec![added],
            removed: vec![exclusion(
                "10.88.9.0/29",
                "local route 10.88.9.0/29 dev eth1",
            )],
            conflicts: vec![LocalRouteConflict {
                pool: "default".into(),
                address: "10.88.0.9".parse().unwrap(),
                owner: "pod-a".into(),
                reason: "local address 10.88.0.9 of eth0".into(),
            }],
        };
        let text = table(&response);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[1].contains("10.88.0.5/32") && lines[1].ends_with("added"));
        assert!(lines[2].ends_with("unchanged"));
        assert!(lines[3].contains("10.88.9.0/29") && lines[3].ends_with("removed"));
        assert!(lines[4].contains("conflict: allocated to \"pod-a\", not excluded"));
    }

    #[test]
    fn nothing_found_says_so() {
        let response = ReserveLocalRoutesResponse {
            scope: "node".into(),
            excluded: vec![],
            added: vec![],
            removed: vec![],
            conflicts: vec![],
        };
        assert_eq!(
            table(&response),
            "no local route or interface address overlaps the pools of scope node\n"
        );
    }
}
