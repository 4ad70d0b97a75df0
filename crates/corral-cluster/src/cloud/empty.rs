//! Empty managed interfaces given back (AWS VPC CNI ipamd's `RemoveUnusedENIFromStore`): an
//! interface corral created that holds nothing any more, on a node that needs nothing, is
//! detached and deleted.

use super::{CloudAction, CloudPlan, InterfaceView, is_usable};
use crate::keys::CloudId;

/// The interface to detach and delete, if any: usable (at or above `first_interface_index`, not
/// excluded), created by corral (`managed`), attached, not the primary (device index 0), and
/// holding no address or prefix of either family, while every plan of the node in the pool
/// (one per family, from a demand report) does nothing, needs nothing and is not at capacity.
/// The highest device index goes first.
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
            is_usable(i, first_interface_index)
                && i.managed
                && i.attached
                && i.device_index != 0
                && i.addresses.is_empty()
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

    #[test]
    fn only_an_empty_managed_secondary_interface_of_a_quiet_node() {
        let quiet = CloudPlan::default();
        let interfaces = vec![
            interface(0, false, &[]),
            interface(1, true, &["10.0.0.5/32"]),
            interface(2, true, &[]),
        ];
        assert_eq!(
            empty_interface_to_delete(&interfaces, 1, &[&quiet]),
            Some(CloudId::new("eni-2").unwrap())
        );
        // Never the primary, never an untagged one, never one holding an address.
        let none = vec![
            interface(0, true, &[]),
            interface(1, false, &[]),
            interface(2, true, &["10.0.0.6/32"]),
        ];
        assert_eq!(empty_interface_to_delete(&none, 0, &[&quiet]), None);
        // Below the pool's first interface index, attaching: not the pool's to give back.
        let mut attaching = interface(2, true, &[]);
        attaching.attached = false;
        assert_eq!(empty_interface_to_delete(&[attaching], 1, &[&quiet]), None);
        assert_eq!(
            empty_interface_to_delete(&[interface(1, true, &[])], 2, &[&quiet]),
            None
        );
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
            assert_eq!(
                empty_interface_to_delete(&interfaces, 1, &[&quiet, plan]),
                None
            );
        }
        assert_eq!(empty_interface_to_delete(&interfaces, 1, &[]), None);
    }
}
