//! `corral node show` of a removed node: its removal's phase, the space still quarantined
//! from it (and when each quarantine ends), and the ranges its agent still asserts.

use corral_cluster::RemovedNodeReport;

use crate::output::{Table, utc};

/// Aligned text for people.
pub fn table(report: &RemovedNodeReport) -> String {
    let mut text = format!("node {}: removed, removal {}", report.name, report.phase);
    if let Some(mode) = &report.mode {
        text.push_str(&format!(" ({mode}"));
        if let Some(asked) = report.requested_ms.filter(|ms| *ms > 0) {
            text.push_str(&format!(", asked {}", utc(asked)));
        }
        text.push(')');
    }
    let live = match report.live {
        Some(true) => "yes",
        Some(false) => "no",
        None => "?",
    };
    text.push_str(&format!("; live: {live}\n"));
    if !report.quarantined.is_empty() {
        text.push_str("space not back yet:\n");
        let mut table = Table::new(&["SPACE", "STATE", "SINCE", "UNTIL"]);
        for space in &report.quarantined {
            table.push(vec![
                space.space.clone(),
                space.state.clone(),
                utc(space.since_ms),
                space.until_ms.map_or_else(
                    || "its agent gives it up (or shows no liveness)".to_owned(),
                    utc,
                ),
            ]);
        }
        text.push_str(&table.render());
    }
    if !report.asserted.is_empty() {
        text.push_str("its agent still asserts:\n");
        let mut table =
            Table::new(&["POOL", "RANGE", "STATE", "ALLOCATIONS"]).right(&["ALLOCATIONS"]);
        for range in &report.asserted {
            table.push(vec![
                range.pool.to_string(),
                range.cidr.to_string(),
                if range.draining {
                    "draining"
                } else {
                    "serving"
                }
                .to_owned(),
                range.allocations.to_string(),
            ]);
        }
        text.push_str(&table.render());
    }
    text
}
