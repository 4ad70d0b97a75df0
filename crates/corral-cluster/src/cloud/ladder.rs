//! The cloud node manager's first question about a node: what comes before planning its pools.
//!
//! The answer is a ladder, the first rung that holds wins:
//!
//! 1. an open intent of the node is replayed before anything else (the cloud may have done what
//!    it names);
//! 2. a node whose instance was never described, or whose describe is stale, is described;
//! 3. records of an earlier instance of the node (registered again on a new one) are torn down
//!    as a removed node's;
//! 4. an instance shutting down or terminated: its records and release handshakes go (the leak
//!    collector takes its interfaces);
//! 5. an instance not running (pending, stopping, stopped) gets nothing;
//! 6. an instance type whose limits are unknown is described;
//! 7. an attachment the describe shows complete is confirmed; one still attaching is polled
//!    (described again soon) while the pools are planned;
//! 8. otherwise the pools are planned (`plan_node`).
//!
//! Nothing here does I/O or reads a clock: the operator gathers the facts, asks, and acts.

use crate::keys::CloudId;

/// Where a node's instance is in its life, as last described.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceLife {
    /// Running: interfaces may be attached and addresses assigned.
    Running,
    /// Pending, stopping or stopped: nothing is attached to it now.
    NotRunning,
    /// Shutting down or terminated (or not found): it will not come back.
    Gone,
}

/// One of the node's interface records that is still attaching, with what the describe shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attaching {
    /// The interface.
    pub interface: CloudId,
    /// The describe shows it attached to the node's instance.
    pub attached: bool,
}

/// What the manager knows of a node before planning its pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts<'a> {
    /// The node has an open intent (not a to-cloud delegation's).
    pub open_intent: bool,
    /// Its instance as last described; `None`: never described.
    pub instance: Option<InstanceLife>,
    /// Its interfaces must be described again before it is planned.
    pub stale: bool,
    /// It has records of an earlier instance (registered again on a new one).
    pub earlier_records: bool,
    /// The limits of its instance type are known.
    pub limits_known: bool,
    /// Its records still attaching, in record order.
    pub attaching: &'a [Attaching],
}

/// The rung of the ladder that holds (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstStep {
    /// Replay the node's open intents.
    Replay,
    /// Describe the instance and its interfaces.
    Describe,
    /// Tear down the records of the earlier instance.
    TeardownEarlier,
    /// The instance is gone: delete the node's records and release handshakes.
    ForgetGone,
    /// The instance is not running: nothing to do.
    Nothing,
    /// Record that this interface's attachment completed.
    Confirm(CloudId),
    /// Plan the pools.
    PlanPools,
}

/// The ladder's answer: the step, and whether an attachment still in progress must be polled
/// (the node described again soon) whatever the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    pub step: FirstStep,
    pub poll_attaching: bool,
}

/// Climbs the ladder for one node (see the module doc).
pub fn first_step(facts: &NodeFacts<'_>) -> Ladder {
    let only = |step| Ladder {
        step,
        poll_attaching: false,
    };
    if facts.open_intent {
        return only(FirstStep::Replay);
    }
    let Some(instance) = facts.instance else {
        return only(FirstStep::Describe);
    };
    if facts.stale {
        return only(FirstStep::Describe);
    }
    if facts.earlier_records {
        return only(FirstStep::TeardownEarlier);
    }
    match instance {
        InstanceLife::Gone => return only(FirstStep::ForgetGone),
        InstanceLife::NotRunning => return only(FirstStep::Nothing),
        InstanceLife::Running => {}
    }
    if !facts.limits_known {
        return only(FirstStep::Describe);
    }
    let mut poll_attaching = false;
    for attaching in facts.attaching {
        if attaching.attached {
            return Ladder {
                step: FirstStep::Confirm(attaching.interface.clone()),
                poll_attaching,
            };
        }
        poll_attaching = true;
    }
    Ladder {
        step: FirstStep::PlanPools,
        poll_attaching,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row of the ladder's table: the facts, then the expected answer.
    struct Row {
        name: &'static str,
        open_intent: bool,
        instance: Option<InstanceLife>,
        stale: bool,
        earlier_records: bool,
        limits_known: bool,
        /// (interface, attached per the describe), in record order.
        attaching: &'static [(&'static str, bool)],
        step: FirstStep,
        poll_attaching: bool,
    }

    /// A running, described node with nothing special about it: the pools are planned.
    const PLAIN: Row = Row {
        name: "plain",
        open_intent: false,
        instance: Some(InstanceLife::Running),
        stale: false,
        earlier_records: false,
        limits_known: true,
        attaching: &[],
        step: FirstStep::PlanPools,
        poll_attaching: false,
    };

    fn id(s: &str) -> CloudId {
        CloudId::new(s).unwrap()
    }

    #[test]
    fn the_first_rung_that_holds_wins() {
        let rows = [
            PLAIN,
            Row {
                name: "an open intent beats everything",
                open_intent: true,
                instance: None,
                stale: true,
                earlier_records: true,
                limits_known: false,
                attaching: &[("eni-a", true)],
                step: FirstStep::Replay,
                ..PLAIN
            },
            Row {
                name: "never described",
                instance: None,
                earlier_records: true,
                step: FirstStep::Describe,
                ..PLAIN
            },
            Row {
                name: "stale beats an earlier instance's records",
                stale: true,
                earlier_records: true,
                step: FirstStep::Describe,
                ..PLAIN
            },
            Row {
                name: "an earlier instance's records beat a gone instance",
                instance: Some(InstanceLife::Gone),
                earlier_records: true,
                step: FirstStep::TeardownEarlier,
                ..PLAIN
            },
            Row {
                name: "a gone instance: records go, limits or not",
                instance: Some(InstanceLife::Gone),
                limits_known: false,
                step: FirstStep::ForgetGone,
                ..PLAIN
            },
            Row {
                name: "not running: nothing, not even a describe for limits",
                instance: Some(InstanceLife::NotRunning),
                limits_known: false,
                attaching: &[("eni-a", true)],
                step: FirstStep::Nothing,
                ..PLAIN
            },
            Row {
                name: "unknown limits are described before attachments",
                limits_known: false,
                attaching: &[("eni-a", true)],
                step: FirstStep::Describe,
                ..PLAIN
            },
            Row {
                name: "an attachment completed is confirmed",
                attaching: &[("eni-a", true)],
                step: FirstStep::Confirm(id("eni-a")),
                ..PLAIN
            },
            Row {
                name: "one still attaching is polled while the pools are planned",
                attaching: &[("eni-a", false)],
                poll_attaching: true,
                ..PLAIN
            },
            Row {
                name: "one attaching before a completed one: polled, and the other confirmed",
                attaching: &[("eni-a", false), ("eni-b", true), ("eni-c", true)],
                step: FirstStep::Confirm(id("eni-b")),
                poll_attaching: true,
                ..PLAIN
            },
            Row {
                name: "the first completed one is confirmed, those after it wait their turn",
                attaching: &[("eni-a", true), ("eni-b", false)],
                step: FirstStep::Confirm(id("eni-a")),
                poll_attaching: false,
                ..PLAIN
            },
        ];
        for row in rows {
            let attaching: Vec<Attaching> = row
                .attaching
                .iter()
                .map(|(interface, attached)| Attaching {
                    interface: id(interface),
                    attached: *attached,
                })
                .collect();
            let ladder = first_step(&NodeFacts {
                open_intent: row.open_intent,
                instance: row.instance,
                stale: row.stale,
                earlier_records: row.earlier_records,
                limits_known: row.limits_known,
                attaching: &attaching,
            });
            assert_eq!(
                ladder,
                Ladder {
                    step: row.step,
                    poll_attaching: row.poll_attaching,
                },
                "{}",
                row.name
            );
        }
    }
}
