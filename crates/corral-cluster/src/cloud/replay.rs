//! Finishing or undoing a cloud intent a previous leader left open (CLUSTER-DESIGN 6.7,
//! "operator crash mid cloud op").

use ipnet::IpNet;

use crate::keys::{CloudId, CloudIntentRecord, CloudInterfaceRecord, CloudOp};

/// How long a mutation may take to show in the cloud's describe calls, in milliseconds: an
/// intent younger than this whose effect is not visible is waited for, not forgotten (EC2's
/// eventual consistency; the fake cloud caps its lag at 5 s).
pub const DESCRIBE_LAG_BOUND_MS: u64 = 10_000;

/// An interface as the cloud shows it, for replaying an intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedInterface {
    /// The interface.
    pub id: CloudId,
    /// The instance and device index it is attached (or attaching) to.
    pub attached_to: Option<(String, u32)>,
    /// Its secondary addresses and prefixes, both families.
    pub addresses: Vec<IpNet>,
    /// It carries the cluster's tag (`corral.io/cluster`): corral created it. Only these are
    /// ever detached or deleted.
    pub managed: bool,
}

/// What the next leader does with an intent it found open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Nothing was applied (or all of it is recorded already): delete the intent.
    Forget,
    /// The call was applied: record the interface as observed, then delete the intent.
    Record(ObservedInterface),
    /// A created interface never got attached, and the node still needs it: attach it.
    Attach {
        /// The interface.
        interface: CloudId,
        /// Where.
        device_index: u32,
    },
    /// Detach the interface (`force` false) from the intent's instance, then (on a later
    /// replay, once it shows unattached) delete it: a removed node's interface.
    Detach {
        /// The interface.
        interface: CloudId,
    },
    /// Undo: delete the interface (created, unattached, not needed any more).
    Delete {
        /// The interface.
        interface: CloudId,
    },
    /// Addresses surrendered by the agent are still on the interface: unassign them again.
    Unassign {
        /// The interface.
        interface: CloudId,
        /// What.
        addresses: Vec<IpNet>,
    },
    /// The cloud's view is not settled (the interface may not be visible yet): ask again
    /// after a resync, change nothing.
    Wait,
}

/// Decides how to finish or undo an open intent from what the cloud shows now: `found` is the
/// interface the intent is about (for a create: the one carrying the intent's client token or
/// tag), `record` the node's `interfaces/` record of it, `node_present` whether the node is still
/// registered with this instance, `index_free` whether the intent's device index is free on
/// the instance (no other interface there), `age_ms` how long ago the intent was written.
///
/// - `CreateAttach`: nothing found: `Wait` while younger than [`DESCRIBE_LAG_BOUND_MS`], then
///   `Forget` (a create that shows up later is the collector's); found attached to the
///   intent's instance: `Record`; attached elsewhere: `Forget` (never touch an attached
///   interface); unattached: `Wait` while younger than the bound (the attachment may not be
///   visible yet), then `Attach` if the node is present and the index free, else `Delete`.
/// - `Assign`: addresses on the interface beyond `before` and the record: `Record`; none yet:
///   `Wait` within the lag bound, then `Forget`; interface gone: `Forget`.
/// - `Unassign`: none of the addresses on the interface (or the interface gone): `Forget`;
///   some still on it: `Wait` while the intent (rewritten at each call) is younger than the
///   lag bound (the describe may be behind the call), then `Unassign` those again (the agent
///   surrendered them: safe).
/// - `Delete` (written with the deletion of the interface's record): never an interface
///   without the cluster's tag nor one at device index 0 (the primary): `Forget`; still there
///   and unattached: `Delete`; attached to the intent's instance: `Detach`, unless a record
///   names it again (it serves the node: `Forget`); attached elsewhere or gone: `Forget`.
pub fn replay_intent(
    intent: &CloudIntentRecord,
    found: Option<&ObservedInterface>,
    record: Option<&CloudInterfaceRecord>,
    node_present: bool,
    index_free: bool,
    age_ms: u64,
) -> Replay {
    let settled = age_ms >= DESCRIBE_LAG_BOUND_MS;
    match &intent.op {
        CloudOp::CreateAttach { device_index, .. } => {
            let Some(found) = found else {
                return if settled {
                    Replay::Forget
                } else {
                    Replay::Wait
                };
            };
            match &found.attached_to {
                Some((instance, _)) if Some(instance) == intent.instance_id.as_ref() => {
                    Replay::Record(found.clone())
                }
                Some(_) => Replay::Forget,
                // The attachment may not be visible yet: neither attach again nor undo.
                None if !settled => Replay::Wait,
                None if node_present && index_free && intent.instance_id.is_some() => {
                    Replay::Attach {
                        interface: found.id.clone(),
                        device_index: *device_index,
                    }
                }
                None => Replay::Delete {
                    interface: found.id.clone(),
                },
            }
        }
        CloudOp::Assign { before, .. } => {
            let Some(found) = found else {
                return Replay::Forget;
            };
            let recorded = record.map_or(&[][..], |r| r.addresses.as_slice());
            let new = found
                .addresses
                .iter()
                .any(|a| !before.contains(a) && !recorded.contains(a));
            if new {
                Replay::Record(found.clone())
            } else if settled {
                Replay::Forget
            } else {
                Replay::Wait
            }
        }
        CloudOp::Unassign {
            interface,
            addresses,
        } => {
            let still: Vec<IpNet> = found.map_or_else(Vec::new, |f| {
                addresses
                    .iter()
                    .filter(|a| f.addresses.contains(a))
                    .copied()
                    .collect()
            });
            if still.is_empty() {
                Replay::Forget
            } else if !settled {
                // Within the describe lag of the last call (the intent is rewritten with the
                // time of each call): the addresses may be gone already and the describe
                // behind; asked again at once, the cloud refuses (not assigned) and the
                // replay would repeat until the describe caught up.
                Replay::Wait
            } else {
                Replay::Unassign {
                    interface: interface.clone(),
                    addresses: still,
                }
            }
        }
        CloudOp::Delete { interface } => match found.map(|f| (f, &f.attached_to)) {
            Some((f, _)) if !f.managed => Replay::Forget,
            Some((_, Some((_, 0)))) => Replay::Forget,
            // Never delete an attached interface (EC2 refuses it as in use). On the intent's
            // instance it is detached first: its record went with the intent's write (a
            // removed node's interface, an empty one); recorded again, it serves the node and
            // stays.
            Some((_, Some((instance, _)))) if Some(instance) == intent.instance_id.as_ref() => {
                if record.is_some() {
                    Replay::Forget
                } else {
                    Replay::Detach {
                        interface: interface.clone(),
                    }
                }
            }
            Some((_, Some(_))) => Replay::Forget,
            Some((_, None)) => Replay::Delete {
                interface: interface.clone(),
            },
            None => Replay::Forget,
        },
        // A node-CIDR delegation's (to-cloud pools) is replayed by `to_cloud::replay_delegation`;
        // here it is never forgotten nor acted on.
        CloudOp::DelegatePrefix { .. } | CloudOp::UndelegatePrefix { .. } => Replay::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{interface_record, net};

    fn id(s: &str) -> CloudId {
        CloudId::new(s).unwrap()
    }

    fn intent(op: CloudOp) -> CloudIntentRecord {
        CloudIntentRecord {
            node: Some("node-a".parse().unwrap()),
            pool: "pods".parse().unwrap(),
            instance_id: Some("i-1".to_owned()),
            op,
            started_ms: 0,
        }
    }

    fn observed(attached: Option<(&str, u32)>, addresses: &[&str]) -> ObservedInterface {
        ObservedInterface {
            id: id("eni-1"),
            attached_to: attached.map(|(i, d)| (i.to_owned(), d)),
            addresses: addresses.iter().map(|a| net(a)).collect(),
            managed: true,
        }
    }

    fn record(addresses: &[&str]) -> CloudInterfaceRecord {
        interface_record("pods", "i-1", addresses)
    }

    const LAG: u64 = DESCRIBE_LAG_BOUND_MS;

    #[test]
    fn create_attach() {
        let i = intent(CloudOp::CreateAttach {
            subnet_id: "subnet-1".to_owned(),
            device_index: 1,
        });
        assert_eq!(
            replay_intent(&i, None, None, true, true, LAG - 1),
            Replay::Wait
        );
        assert_eq!(
            replay_intent(&i, None, None, true, true, LAG),
            Replay::Forget
        );
        let attached = observed(Some(("i-1", 1)), &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&i, Some(&attached), None, true, false, 0),
            Replay::Record(attached.clone())
        );
        let elsewhere = observed(Some(("i-2", 1)), &[]);
        assert_eq!(
            replay_intent(&i, Some(&elsewhere), None, true, true, LAG),
            Replay::Forget
        );
        let loose = observed(None, &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&i, Some(&loose), None, true, true, LAG),
            Replay::Attach {
                interface: id("eni-1"),
                device_index: 1
            }
        );
        let delete = Replay::Delete {
            interface: id("eni-1"),
        };
        assert_eq!(
            replay_intent(&i, Some(&loose), None, false, true, LAG),
            delete
        );
        assert_eq!(
            replay_intent(&i, Some(&loose), None, true, false, LAG),
            delete
        );
    }

    /// A created interface that shows unattached within the describe lag bound may be attached
    /// already (the create is visible, the attachment not yet): neither attached again (EC2:
    /// in use) nor deleted (in use, or a live interface), but waited for.
    #[test]
    fn an_unattached_interface_is_not_undone_or_reattached_on_an_unsettled_view() {
        let i = intent(CloudOp::CreateAttach {
            subnet_id: "subnet-1".to_owned(),
            device_index: 1,
        });
        let loose = observed(None, &["10.0.0.5/32"]);
        for (node_present, index_free) in [(true, true), (false, true), (true, false)] {
            assert_eq!(
                replay_intent(&i, Some(&loose), None, node_present, index_free, LAG - 1),
                Replay::Wait,
                "{node_present} {index_free}"
            );
        }
    }

    #[test]
    fn assign() {
        let i = intent(CloudOp::Assign {
            interface: id("eni-1"),
            count: 2,
            prefixes: false,
            ipv6: false,
            before: vec![net("10.0.0.5/32")],
        });
        let applied = observed(
            Some(("i-1", 1)),
            &["10.0.0.5/32", "10.0.0.6/32", "10.0.0.7/32"],
        );
        assert_eq!(
            replay_intent(
                &i,
                Some(&applied),
                Some(&record(&["10.0.0.5/32"])),
                true,
                false,
                LAG
            ),
            Replay::Record(applied.clone())
        );
        // Already recorded: nothing new.
        let all = record(&["10.0.0.5/32", "10.0.0.6/32", "10.0.0.7/32"]);
        assert_eq!(
            replay_intent(&i, Some(&applied), Some(&all), true, false, LAG),
            Replay::Forget
        );
        // Not visible yet: wait within the lag bound.
        let before = observed(Some(("i-1", 1)), &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&i, Some(&before), None, true, false, 10),
            Replay::Wait
        );
        assert_eq!(
            replay_intent(&i, Some(&before), None, true, false, LAG),
            Replay::Forget
        );
        assert_eq!(
            replay_intent(&i, None, None, true, false, 10),
            Replay::Forget
        );
    }

    #[test]
    fn unassign_and_delete() {
        let i = intent(CloudOp::Unassign {
            interface: id("eni-1"),
            addresses: vec![net("10.0.0.6/32"), net("10.0.0.7/32")],
        });
        let half = observed(Some(("i-1", 1)), &["10.0.0.5/32", "10.0.0.7/32"]);
        // Within the describe lag of the last call: waited for, not called again.
        assert_eq!(
            replay_intent(&i, Some(&half), None, true, false, 0),
            Replay::Wait
        );
        assert_eq!(
            replay_intent(&i, Some(&half), None, true, false, LAG - 1),
            Replay::Wait
        );
        assert_eq!(
            replay_intent(&i, Some(&half), None, true, false, LAG),
            Replay::Unassign {
                interface: id("eni-1"),
                addresses: vec![net("10.0.0.7/32")]
            }
        );
        let done = observed(Some(("i-1", 1)), &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&i, Some(&done), None, true, false, 0),
            Replay::Forget
        );
        assert_eq!(
            replay_intent(&i, None, None, true, false, 0),
            Replay::Forget
        );
        let d = intent(CloudOp::Delete {
            interface: id("eni-1"),
        });
        let gone_loose = observed(None, &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&d, Some(&gone_loose), None, false, false, 0),
            Replay::Delete {
                interface: id("eni-1")
            }
        );
        assert_eq!(
            replay_intent(&d, None, None, false, false, 0),
            Replay::Forget
        );
    }

    /// CLUSTER-DESIGN 6.7: the undo deletes an unattached interface only. A delete intent
    /// whose interface shows attached is never a `Delete` (EC2 refuses it as in use, and the
    /// replay would fail on every round): attached to the intent's instance it is detached
    /// first (or kept, if a record names it again), attached elsewhere it is not ours.
    #[test]
    fn a_delete_intent_never_deletes_an_attached_interface() {
        let d = intent(CloudOp::Delete {
            interface: id("eni-1"),
        });
        let ours = observed(Some(("i-1", 1)), &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&d, Some(&ours), None, true, false, LAG),
            Replay::Detach {
                interface: id("eni-1")
            }
        );
        assert_eq!(
            replay_intent(&d, Some(&ours), Some(&record(&[])), true, false, LAG),
            Replay::Forget
        );
        let elsewhere = observed(Some(("i-2", 1)), &[]);
        assert_eq!(
            replay_intent(&d, Some(&elsewhere), None, true, false, LAG),
            Replay::Forget
        );
        let loose = observed(None, &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&d, Some(&loose), None, false, false, LAG),
            Replay::Delete {
                interface: id("eni-1")
            }
        );
    }

    /// A removed node's interface still attached to its running instance is detached, then
    /// deleted once it shows unattached; never the primary, never an untagged interface.
    #[test]
    fn a_removed_nodes_interface_is_detached_then_deleted() {
        let d = intent(CloudOp::Delete {
            interface: id("eni-1"),
        });
        let attached = observed(Some(("i-1", 1)), &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&d, Some(&attached), None, false, false, 0),
            Replay::Detach {
                interface: id("eni-1")
            }
        );
        let loose = observed(None, &[]);
        assert_eq!(
            replay_intent(&d, Some(&loose), None, false, false, 0),
            Replay::Delete {
                interface: id("eni-1")
            }
        );
        let primary = observed(Some(("i-1", 0)), &["10.0.0.5/32"]);
        assert_eq!(
            replay_intent(&d, Some(&primary), None, false, false, LAG),
            Replay::Forget
        );
        for found in [attached, loose] {
            let untagged = ObservedInterface {
                managed: false,
                ..found
            };
            assert_eq!(
                replay_intent(&d, Some(&untagged), None, false, false, LAG),
                Replay::Forget
            );
        }
    }
}
