//! Empty managed interfaces given back (AWS VPC CNI ipamd's `RemoveUnusedENIFromStore`): an
//! interface corral created that holds nothing any more, on a node that needs nothing, is
//! detached and deleted once it has stayed empty for the pool's release delay (a node whose
//! pods come and go would otherwise create and delete interfaces with them).

use std::collections::BTreeMap;

use super::{CloudAction, CloudPlan, InterfaceView, is_usable};
use crate::keys::CloudId;

/// Whether `interface` could be given back if it stayed empty: usable, created by corral,
/// attached, not the primary, holding nothing of either family.
pub fn is_empty_managed(interface: &InterfaceView, first_interface_index: u32) -> bool {
    is_usable(interface, first_interface_index)
        && interface.managed
        && interface.attached
        && interface.device_index != 0
        && interface.addresses.is_empty()
}

/// When each empty managed interface was first seen empty: `since` brought up to date with
/// `interfaces` at `now_ms` (an interface seen empty for the first time starts now, one that
/// holds something again or is gone is forgotten).
pub fn track_empty(
    since: &mut BTreeMap<CloudId, u64>,
    interfaces: &[InterfaceView],
    first_interface_index: u32,
    now_ms: u64,
) {
    since.retain(|id, _| {
        interfaces
            .iter()
            .any(|i| &i.id == id && is_empty_managed(i, first_interface_index))
    });
    for interface in interfaces {
        if is_empty_managed(interface, first_interface_index) {
            since.entry(interface.id.clone()).or_insert(now_ms);
        }
    }
}

/// The interface to detach and delete, if any: usable (at or above `first_interface_index`, not
/// excluded), created by corral (`managed`), attached, not the primary (device index 0), and
/// holding no address or prefix of either family since at least `delay_ms` before `now_ms`
/// (`empty_since`, kept by [`track_empty`]), while every plan of the node in the pool (one per
/// family, from a demand report) does nothing, needs nothing and is not at capacity. The
/// highest device index goes first.
///
/// The addresses it held went back through the release handshake (marked, surrendered, then
/// unassigned), so no pod has one. It never flaps: the targets count addresses, and an empty
/// interface holds none, so its deletion changes neither what the node holds nor its capacity
/// (a free device index counts at full size, as the empty interface did): a node that needed
/// nothing still needs nothing.
pub fn empty_interface_to_delete(
    interfaces: &[InterfaceView],
    first_interface_index: u32,
    plans: &[&CloudPlan],
    empty_since: &BTreeMap<CloudId, u64>,
    now_ms: u64,
    delay_ms: u64,
) -> Option<CloudId> {
    let quiet = plans.iter().all(|p| {
        p.action == CloudAction::Nothing
            && p.stats.needed == 0
            && !p.at_capacity
            && p.unmark.is_empty()
            && p.forget.is_empty()
    });
    if plans.is_empty() || !quiet {
        return None;
    }
    interfaces
        .iter()
        .filter(|i| {
            is_empty_managed(i, first_interface_index)
                && empty_since
                    .get(&i.id)
                    .is_some_and(|at| now_ms.saturating_sub(*at) >= delay_ms)
        })
        .max_by_key(|i| (i.device_index, i.id.clone()))
        .map(|i| i.id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::Statistics;

    fn interface(index: u32, managed: bool, addresses: &[&str]) -> InterfaceView {
        InterfaceView {
            id: CloudId::new(&format!("eni-{index}")).unwrap(),
            device_index: index,
            subnet_id: "subnet-1".to_owned(),
            managed,
            excluded: false,
            attached: true,
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
            secondaries_only: false,
        }
    }

    /// [`empty_interface_to_delete`] for interfaces empty since long enough.
    fn settled(interfaces: &[InterfaceView], first: u32, plans: &[&CloudPlan]) -> Option<CloudId> {
        let mut since = BTreeMap::new();
        track_empty(&mut since, interfaces, first, 0);
        empty_interface_to_delete(interfaces, first, plans, &since, 10_000, 10_000)
    }

    /// ipamd gives an empty ENI back at once; a node whose pods come and go then creates and
    /// deletes interfaces with them. corral waits the pool's release delay: an interface
    /// empty for less is kept, one that holds something again starts over.
    #[test]
    fn an_empty_interface_goes_only_after_the_release_delay() {
        let quiet = CloudPlan::default();
        let mut interfaces = vec![
            interface(1, true, &["10.0.0.5/32"]),
            interface(2, true, &[]),
        ];
        let mut since = BTreeMap::new();
        track_empty(&mut since, &interfaces, 1, 1_000);
        let at = |interfaces: &[InterfaceView], since: &BTreeMap<CloudId, u64>, now| {
            empty_interface_to_delete(interfaces, 1, &[&quiet], since, now, 60_000)
        };
        assert_eq!(at(&interfaces, &since, 1_000), None);
        assert_eq!(at(&interfaces, &since, 60_999), None);
        assert_eq!(
            at(&interfaces, &since, 61_000),
            Some(CloudId::new("eni-2").unwrap())
        );
        // It took an address meanwhile: forgotten; empty again: the delay starts over.
        interfaces[1].addresses = vec!["10.0.0.9/32".parse().unwrap()];
        track_empty(&mut since, &interfaces, 1, 30_000);
        assert!(since.is_empty());
        interfaces[1].addresses.clear();
        track_empty(&mut since, &interfaces, 1, 50_000);
        assert_eq!(at(&interfaces, &since, 61_000), None);
        assert_eq!(
            at(&interfaces, &since, 110_000),
            Some(CloudId::new("eni-2").unwrap())
        );
    }

    #[test]
    fn only_an_empty_managed_secondary_interface_of_a_quiet_node() {
        let quiet = CloudPlan::default();
        let interfaces = vec![
            interface(0, false, &[]),
            interface(1, true, &["10.0.0.5/32"]),
            interface(2, true, &[]),
        ];
        assert_eq!(
            settled(&interfaces, 1, &[&quiet]),
            Some(CloudId::new("eni-2").unwrap())
        );
        // Never the primary, never an untagged one, never one holding an address.
        let none = vec![
            interface(0, true, &[]),
            interface(1, false, &[]),
            interface(2, true, &["10.0.0.6/32"]),
        ];
        assert_eq!(settled(&none, 0, &[&quiet]), None);
        // Below the pool's first interface index, attaching: not the pool's to give back.
        let mut attaching = interface(2, true, &[]);
        attaching.attached = false;
        assert_eq!(settled(&[attaching], 1, &[&quiet]), None);
        assert_eq!(settled(&[interface(1, true, &[])], 2, &[&quiet]), None);
        // A node that needs, grows, releases or is at capacity keeps it.
        let needs = CloudPlan {
            stats: Statistics {
                needed: 1,
                ..Statistics::default()
            },
            ..CloudPlan::default()
        };
        let releasing = CloudPlan {
            action: CloudAction::Mark {
                interface: CloudId::new("eni-1").unwrap(),
                addresses: vec!["10.0.0.5/32".parse().unwrap()],
            },
            ..CloudPlan::default()
        };
        let full = CloudPlan {
            at_capacity: true,
            ..CloudPlan::default()
        };
        for plan in [&needs, &releasing, &full] {
            assert_eq!(settled(&interfaces, 1, &[&quiet, plan]), None);
        }
        assert_eq!(settled(&interfaces, 1, &[]), None);
    }
}
