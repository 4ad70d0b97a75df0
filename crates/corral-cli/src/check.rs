//! `corral check`: a consistency report computed from a dump, a status and the list of live
//! attachments, as a pure function so it is tested without an agent.

use std::collections::HashSet;

use corral_api::{AttachmentKey, DumpResponse, FamilyStatus, StatusResponse};
use serde::Serialize;

use crate::output;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// An allocation whose attachment is not live.
    Stale,
    /// A lease past its expiry that the agent has not acted on.
    Overdue,
    /// No address left in a family that has capacity.
    Exhausted,
    /// More than 90% of the usable addresses in use.
    NearlyFull,
}

impl ProblemKind {
    pub fn label(self) -> &'static str {
        match self {
            ProblemKind::Stale => "stale",
            ProblemKind::Overdue => "overdue",
            ProblemKind::Exhausted => "exhausted",
            ProblemKind::NearlyFull => "nearly full",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub problem: ProblemKind,
    pub scope: String,
    pub pool: String,
    /// The address, or the family of a full pool.
    pub subject: String,
    pub detail: String,
}

/// The report `corral check -o json` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    pub ok: bool,
    pub allocations_checked: usize,
    pub pools_checked: usize,
    pub problems: Vec<Problem>,
}

/// Finds the problems in `dump` and `status` given the live attachments at `now_ms`
/// (milliseconds since the Unix epoch). Fails only on a count that is not a number.
pub fn report(
    dump: &DumpResponse,
    status: &StatusResponse,
    live: &HashSet<KeyText>,
    now_ms: u64,
) -> Result<Report, String> {
    let mut problems = Vec::new();
    let mut allocations_checked = 0;
    for scope in &dump.scopes {
        for pool in &scope.pools {
            for entry in &pool.allocations {
                allocations_checked += 1;
                let mut problem = |problem, detail| {
                    problems.push(Problem {
                        problem,
                        scope: scope.scope.clone(),
                        pool: pool.pool.clone(),
                        subject: entry.address.to_string(),
                        detail,
                    })
                };
                if let Some(key) = &entry.key
                    && !live.contains(&KeyText::of(key))
                {
                    problem(
                        ProblemKind::Stale,
                        format!(
                            "attachment {} is not live (owner {})",
                            KeyText::of(key).0,
                            entry.owner
                        ),
                    );
                }
                if let Some(lease) = &entry.lease
                    && lease.expires_at_ms < now_ms
                {
                    problem(
                        ProblemKind::Overdue,
                        format!(
                            "lease {} expired at {}",
                            lease.id,
                            output::utc(lease.expires_at_ms)
                        ),
                    );
                }
            }
        }
    }

    let mut pools_checked = 0;
    for scope in &status.scopes {
        for pool in &scope.pools {
            pools_checked += 1;
            for family in &pool.families {
                if let Some((problem, detail)) = judge_family(family)? {
                    problems.push(Problem {
                        problem,
                        scope: scope.scope.clone(),
                        pool: pool.pool.clone(),
                        subject: output::family(family.family).to_owned(),
                        detail,
                    });
                }
            }
        }
    }
    Ok(Report {
        ok: problems.is_empty(),
        allocations_checked,
        pools_checked,
        problems,
    })
}

/// Whether one pool family is exhausted or nearly full. Addresses in cooldown still count as
/// available: the agent hands them out when nothing else is free.
fn judge_family(family: &FamilyStatus) -> Result<Option<(ProblemKind, String)>, String> {
    let count = |name: &str, text: &str| {
        text.parse::<u128>()
            .map_err(|_| format!("status: {name} {text:?} is not a count"))
    };
    let capacity = count("capacity", &family.capacity)?;
    let excluded = count("excluded", &family.excluded)?;
    let free = count("free", &family.free)?;
    let cooling = count("cooling", &family.cooling)?;
    let available = free.saturating_add(cooling);
    let usable = capacity.saturating_sub(excluded);
    if capacity == 0 {
        return Ok(None);
    }
    if available == 0 {
        return Ok(Some((
            ProblemKind::Exhausted,
            format!("no free address (capacity {capacity}, {excluded} excluded)"),
        )));
    }
    // More than 90% in use is less than 10% available: available * 10 < usable, which is
    // available < ceil(usable / 10) without overflow.
    let in_use = usable.saturating_sub(available);
    if available < usable.div_ceil(10) {
        let percent = (in_use as f64 / usable as f64 * 100.0).floor();
        return Ok(Some((
            ProblemKind::NearlyFull,
            format!("{percent}% in use ({in_use} of {usable} usable, {available} available)"),
        )));
    }
    Ok(None)
}

/// An attachment key in its `NETWORK/CONTAINER/IFNAME` form, hashable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyText(pub String);

impl KeyText {
    pub fn of(key: &AttachmentKey) -> KeyText {
        KeyText(format!(
            "{}/{}/{}",
            key.network, key.container_id, key.ifname
        ))
    }
}

#[cfg(test)]
mod tests {
    use corral_api::{DumpEntry, FamilyName, Lease, PoolDump, PoolStatus, ScopeDump, ScopeStatus};

    use super::*;

    fn family(
        capacity: &str,
        used: &str,
        free: &str,
        excluded: &str,
        cooling: &str,
    ) -> FamilyStatus {
        FamilyStatus {
            family: FamilyName::Ipv4,
            capacity: capacity.into(),
            used: used.into(),
            free: free.into(),
            excluded: excluded.into(),
            cooling: cooling.into(),
        }
    }

    fn kind(family: &FamilyStatus) -> Option<ProblemKind> {
        judge_family(family).unwrap().map(|(kind, _)| kind)
    }

    #[test]
    fn full_and_nearly_full_families() {
        use ProblemKind::{Exhausted, NearlyFull};
        let huge = u128::MAX.to_string();
        let huge = huge.as_str();
        // Capacity, used, free, excluded, cooling; and the verdict.
        let cases = [
            (["0", "0", "0", "0", "0"], None),
            (["254", "254", "0", "0", "0"], Some(Exhausted)),
            (["254", "0", "0", "254", "0"], Some(Exhausted)),
            (["254", "250", "0", "0", "4"], Some(NearlyFull)),
            (["100", "91", "9", "0", "0"], Some(NearlyFull)),
            (["100", "90", "10", "0", "0"], None),
            // Exclusions are not "in use": 50 excluded, 40 of the other 50 used is 80%.
            (["100", "40", "10", "50", "0"], None),
            ([huge, "1", huge, "0", "0"], None),
            ([huge, "1", "5", "0", "0"], Some(NearlyFull)),
        ];
        for (counts, expected) in cases {
            let [capacity, used, free, excluded, cooling] = counts;
            let status = family(capacity, used, free, excluded, cooling);
            assert_eq!(kind(&status), expected, "{counts:?}");
        }
        assert!(judge_family(&family("lots", "1", "1", "0", "0")).is_err());
    }

    #[test]
    fn stale_and_overdue_allocations() {
        let key = |container: &str| AttachmentKey {
            network: "net1".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
        };
        let entry = |address: &str, key, lease| DumpEntry {
            address: address.parse().unwrap(),
            owner: "ns/pod".into(),
            key,
            generation: 1,
            lease,
        };
        let dump = DumpResponse {
            scopes: vec![ScopeDump {
                scope: "net1".into(),
                pools: vec![PoolDump {
                    pool: "default".into(),
                    allocations: vec![
                        entry("10.0.0.2", Some(key("live")), None),
                        entry("10.0.0.3", Some(key("gone")), None),
                        entry(
                            "10.0.0.4",
                            None,
                            Some(Lease {
                                id: "l-1".into(),
                                expires_at_ms: 1_000,
                            }),
                        ),
                        entry(
                            "10.0.0.5",
                            None,
                            Some(Lease {
                                id: "l-2".into(),
                                expires_at_ms: 9_000,
                            }),
                        ),
                    ],
                }],
            }],
        };
        let status = StatusResponse {
            ready: true,
            summary: vec![],
            warnings: vec![],
            cluster: None,
            adds: vec![],
            scopes: vec![ScopeStatus {
                scope: "net1".into(),
                pools: vec![PoolStatus {
                    pool: "default".into(),
                    families: vec![family("254", "4", "250", "0", "0")],
                }],
            }],
        };
        let live = HashSet::from([KeyText("net1/live/eth0".into())]);
        let report = report(&dump, &status, &live, 5_000).unwrap();
        assert!(!report.ok);
        assert_eq!((report.allocations_checked, report.pools_checked), (4, 1));
        let found: Vec<(ProblemKind, &str)> = report
            .problems
            .iter()
            .map(|problem| (problem.problem, problem.subject.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                (ProblemKind::Stale, "10.0.0.3"),
                (ProblemKind::Overdue, "10.0.0.4")
            ]
        );
        assert_eq!(
            report.problems[0].detail,
            "attachment net1/gone/eth0 is not live (owner ns/pod)"
        );
        assert_eq!(
            report.problems[1].detail,
            "lease l-1 expired at 1970-01-01T00:00:01Z"
        );
    }
}
