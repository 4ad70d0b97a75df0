//! Choices among the cloud's resources: the subnet of a new interface, its device index, the
//! fallback after a refused prefix, and the order nodes are served in.

use std::cmp::Reverse;

use corral_core::Family;

use crate::config::CloudPoolConfig;

use super::{CloudAction, InterfaceView, SubnetView, subnet_room};

/// Whether the pool's subnet settings allow `subnet` (explicit IDs, else tags, else any).
fn allowed(cloud: &CloudPoolConfig, subnet: &SubnetView) -> bool {
    if !cloud.subnet_ids.is_empty() {
        return cloud.subnet_ids.contains(&subnet.id);
    }
    cloud
        .subnet_tags
        .iter()
        .all(|(k, v)| subnet.tags.get(k) == Some(v))
}

/// The subnet a new interface goes in, or `None` if none can give it even one address (or
/// prefix, with `prefixes`); `avoid` lists subnets that just refused (a sibling retry).
///
/// Only subnets of the instance's zone, not avoided, with room for a primary address and at
/// least one of `family`'s addresses (or prefixes; a subnet that refused a prefix lately gives
/// none) are considered. Among them: the pool's explicit `subnet_ids` (most free first; ties:
/// the order listed), else those carrying all of `subnet_tags` (most free; ties: lowest ID),
/// else the node's own subnet if it has room for all `count`, else the zone's subnet with most
/// free (ties: lowest ID). The caller asks for at most the chosen subnet's room.
#[allow(clippy::too_many_arguments)]
pub fn choose_subnet<'a>(
    cloud: &CloudPoolConfig,
    zone: &str,
    node_subnet: &str,
    family: Family,
    subnets: &'a [SubnetView],
    count: u32,
    prefixes: bool,
    avoid: &[String],
) -> Option<&'a SubnetView> {
    let room = |s: &SubnetView| subnet_room(s, family, prefixes, true);
    let eligible = |s: &&SubnetView| s.zone == zone && !avoid.contains(&s.id) && room(s) > 0;
    let most_free = |candidates: Vec<&'a SubnetView>| {
        candidates
            .into_iter()
            .enumerate()
            .max_by_key(|(k, s)| (s.free_ipv4, room(s), Reverse(*k)))
            .map(|(_, s)| s)
    };
    if !cloud.subnet_ids.is_empty() {
        let listed = cloud
            .subnet_ids
            .iter()
            .filter_map(|id| subnets.iter().find(|s| s.id == *id))
            .filter(eligible)
            .collect();
        return most_free(listed);
    }
    let mut sorted: Vec<&'a SubnetView> = subnets.iter().filter(eligible).collect();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    if !cloud.subnet_tags.is_empty() {
        return most_free(sorted.into_iter().filter(|s| allowed(cloud, s)).collect());
    }
    if let Some(own) = sorted.iter().find(|s| s.id == node_subnet)
        && room(own) >= u64::from(count)
    {
        return Some(own);
    }
    most_free(sorted)
}

/// The device index for a new interface: the first at or above `first` that no interface has
/// and `occupied` does not list, below the instance's interface limit; after the cloud said
/// `after` is taken, the first such one above it.
pub fn next_device_index(
    interfaces: &[InterfaceView],
    first: u32,
    max_interfaces: u32,
    occupied: &[u32],
    after: Option<u32>,
) -> Option<u32> {
    let start = after.map_or(first, |a| first.max(a.saturating_add(1)));
    (start..max_interfaces)
        .find(|i| !interfaces.iter().any(|f| f.device_index == *i) && !occupied.contains(i))
}

/// How long a refused prefix request is remembered, in milliseconds: the interface takes single
/// addresses and its subnet is not chosen for prefixes until then; after it prefixes are tried
/// again (subnets get freed and defragmented as interfaces go).
pub const PREFIX_REFUSAL_TTL_MS: u64 = 600_000;

/// Whether a prefix refusal at `refused_ms` still holds at `now_ms` (within
/// [`PREFIX_REFUSAL_TTL_MS`]; a refusal from the future, another leader's clock ahead, holds).
pub fn prefix_refusal_holds(refused_ms: Option<u64>, now_ms: u64) -> bool {
    refused_ms.is_some_and(|at| now_ms.saturating_sub(at) < PREFIX_REFUSAL_TTL_MS)
}

/// What to do when a prefix request was refused with `InsufficientCidrBlocks` (the subnet has
/// no free aligned /28, though it may have single addresses left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixFallback {
    /// A new interface: try a sibling subnet of the same zone (not yet tried) with prefixes.
    Sibling {
        /// The subnet.
        subnet_id: String,
        /// How many prefixes to ask there: the refused count, at most the sibling's room.
        count: u32,
    },
    /// Single addresses on that interface (or a new interface in that subnet) instead: the
    /// interface is `secondaries_only` from now on; the node's others keep prefixes.
    Secondaries,
}

/// Chooses the fallback after `InsufficientCidrBlocks` for `action` (an `Assign` or `Create`
/// with `prefixes`); `tried` lists the subnets already refused (the refusing one counts as
/// tried anyway). A `Create` moves to the sibling subnet of the same zone, allowed by the
/// pool's subnet settings, not tried, not known to refuse prefixes, with room for a prefix
/// (most free first); with none left, or for an `Assign` (the interface stays where it is),
/// single addresses.
pub fn prefix_fallback(
    action: &CloudAction,
    cloud: &CloudPoolConfig,
    zone: &str,
    family: Family,
    subnets: &[SubnetView],
    tried: &[String],
) -> PrefixFallback {
    let CloudAction::Create {
        subnet_id,
        prefixes: true,
        count,
        ..
    } = action
    else {
        return PrefixFallback::Secondaries;
    };
    subnets
        .iter()
        .filter(|s| s.zone == zone && s.id != *subnet_id && !tried.contains(&s.id))
        .filter(|s| allowed(cloud, s))
        .filter(|s| subnet_room(s, family, true, true) > 0)
        .min_by(|a, b| b.free_ipv4.cmp(&a.free_ipv4).then_with(|| a.id.cmp(&b.id)))
        .map_or(PrefixFallback::Secondaries, |s| PrefixFallback::Sibling {
            subnet_id: s.id.clone(),
            count: (*count)
                .min(u32::try_from(subnet_room(s, family, true, true)).unwrap_or(u32::MAX)),
        })
}

/// A node's place in the serving order: what it needs per family and what it has in excess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServeKey {
    /// IPv4 addresses needed.
    pub needed_v4: u64,
    /// IPv6 addresses needed (breaks ties of IPv4 need).
    pub needed_v6: u64,
    /// Addresses in excess, both families (counts only when nothing is needed).
    pub excess: u64,
}

impl From<(u64, u64)> for ServeKey {
    /// `(needed, excess)` of a single-family node.
    fn from((needed, excess): (u64, u64)) -> ServeKey {
        ServeKey {
            needed_v4: needed,
            needed_v6: 0,
            excess,
        }
    }
}

/// The order nodes are served in (Cilium's `GetNodesByIPWatermarkLocked`, CLUSTER-DESIGN 1.4):
/// nodes that need addresses first, largest IPv4 need first (IPv6 need breaking ties), then
/// nodes with nothing to do, then releases, largest excess first (Cilium's key is `-excess`
/// and two negatives sort ascending: `[+8, +3, 0, 0, -9, -2]`). Returns the indexes of `keys`
/// in that order; stable for equal keys (Cilium's `sort.Slice` is not).
pub fn serve_order(keys: &[ServeKey]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| {
        let k = &keys[i];
        let needs = k.needed_v4 > 0 || k.needed_v6 > 0;
        let (class, a, b) = if needs {
            (0u8, Reverse(k.needed_v4), Reverse(k.needed_v6))
        } else if k.excess == 0 {
            (1, Reverse(0), Reverse(0))
        } else {
            (2, Reverse(k.excess), Reverse(0))
        };
        (class, a, b)
    });
    order
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::keys::CloudId;

    fn subnet(id: &str, zone: &str, free: u32) -> SubnetView {
        SubnetView {
            id: id.to_owned(),
            zone: zone.to_owned(),
            cidrs: vec!["10.0.0.0/16".parse().unwrap()],
            free_ipv4: free,
            tags: BTreeMap::new(),
            no_free_prefix: false,
        }
    }

    fn subnets() -> Vec<SubnetView> {
        let mut tagged = subnet("subnet-t", "az1", 50);
        tagged.tags.insert("corral".to_owned(), "pods".to_owned());
        vec![
            subnet("subnet-own", "az1", 20),
            subnet("subnet-big", "az1", 500),
            subnet("subnet-other-zone", "az2", 5000),
            subnet("subnet-mid", "az1", 100),
            tagged,
        ]
    }

    fn pick(
        cloud: &CloudPoolConfig,
        count: u32,
        prefixes: bool,
        avoid: &[String],
    ) -> Option<String> {
        let s = subnets();
        choose_subnet(
            cloud,
            "az1",
            "subnet-own",
            Family::V4,
            &s,
            count,
            prefixes,
            avoid,
        )
        .map(|s| s.id.clone())
    }

    #[test]
    fn subnet_choice_order() {
        let default = CloudPoolConfig::default();
        // The node's own subnet when it has room for all of them.
        assert_eq!(pick(&default, 9, false, &[]).as_deref(), Some("subnet-own"));
        // Not enough there (a primary takes one): the zone's most free, never another zone.
        assert_eq!(
            pick(&default, 20, false, &[]).as_deref(),
            Some("subnet-big")
        );
        // Explicit IDs win, most free among them, other zones never.
        let explicit = CloudPoolConfig {
            subnet_ids: vec![
                "subnet-other-zone".into(),
                "subnet-mid".into(),
                "subnet-t".into(),
            ],
            ..CloudPoolConfig::default()
        };
        assert_eq!(
            pick(&explicit, 1, false, &[]).as_deref(),
            Some("subnet-mid")
        );
        assert_eq!(
            pick(&explicit, 1, false, &["subnet-mid".into()]).as_deref(),
            Some("subnet-t")
        );
        // Explicit but all full: none (no fall-through to other subnets).
        let full = CloudPoolConfig {
            subnet_ids: vec!["subnet-other-zone".into()],
            ..CloudPoolConfig::default()
        };
        assert_eq!(pick(&full, 1, false, &[]), None);
        // Tags next.
        let tags = CloudPoolConfig {
            subnet_tags: [("corral".to_owned(), "pods".to_owned())].into(),
            ..CloudPoolConfig::default()
        };
        assert_eq!(pick(&tags, 1, false, &[]).as_deref(), Some("subnet-t"));
        // Prefixes: the own subnet holds one /28 (20 free less the primary); two go elsewhere.
        assert_eq!(pick(&default, 1, true, &[]).as_deref(), Some("subnet-own"));
        assert_eq!(pick(&default, 2, true, &[]).as_deref(), Some("subnet-big"));
        // A subnet that refused a prefix lately is not chosen for prefixes.
        let mut s = subnets();
        s[1].no_free_prefix = true;
        let got = choose_subnet(&default, "az1", "subnet-own", Family::V4, &s, 2, true, &[]);
        assert_eq!(got.map(|s| s.id.as_str()), Some("subnet-mid"));
        let got = choose_subnet(
            &default,
            "az1",
            "subnet-own",
            Family::V4,
            &s,
            30,
            false,
            &[],
        );
        assert_eq!(got.map(|s| s.id.as_str()), Some("subnet-big"));
        // Nothing with room: none.
        let empty = [subnet("subnet-own", "az1", 1)];
        let got = choose_subnet(
            &default,
            "az1",
            "subnet-own",
            Family::V4,
            &empty,
            1,
            false,
            &[],
        );
        assert_eq!(got, None, "a primary address takes the last one");
        // IPv6: only subnets with an IPv6 CIDR.
        let mut v6 = subnet("subnet-v6", "az1", 3);
        v6.cidrs.push("2001:db8::/56".parse().unwrap());
        let both = [subnet("subnet-big", "az1", 500), v6];
        let got = choose_subnet(
            &default,
            "az1",
            "subnet-own",
            Family::V6,
            &both,
            4,
            false,
            &[],
        );
        assert_eq!(got.map(|s| s.id.as_str()), Some("subnet-v6"));
    }

    fn iface(id: &str, index: u32) -> InterfaceView {
        InterfaceView {
            id: CloudId::new(id).unwrap(),
            device_index: index,
            subnet_id: "subnet-own".to_owned(),
            managed: index > 0,
            excluded: false,
            attached: true,
            addresses: Vec::new(),
            secondaries_only: false,
        }
    }

    #[test]
    fn device_index_choice() {
        let ifs = [iface("eni-0", 0), iface("eni-2", 2)];
        assert_eq!(next_device_index(&ifs, 1, 4, &[], None), Some(1));
        assert_eq!(next_device_index(&ifs, 1, 4, &[1], None), Some(3));
        assert_eq!(next_device_index(&ifs, 1, 4, &[], Some(1)), Some(3));
        assert_eq!(next_device_index(&ifs, 1, 4, &[3], Some(1)), None);
        assert_eq!(next_device_index(&ifs, 0, 2, &[], None), Some(1));
        assert_eq!(
            next_device_index(&ifs[..1], 1, 1, &[], None),
            None,
            "t2 limits"
        );
        assert_eq!(next_device_index(&[], 0, 3, &[], None), Some(0));
        assert_eq!(next_device_index(&ifs, 1, 3, &[], Some(u32::MAX)), None);
    }

    #[test]
    fn prefix_fallback_tries_siblings_then_secondaries() {
        let default = CloudPoolConfig::default();
        let create = CloudAction::Create {
            subnet_id: "subnet-big".to_owned(),
            device_index: 1,
            count: 1,
            prefixes: true,
        };
        let s = subnets();
        let fb =
            |tried: &[String]| prefix_fallback(&create, &default, "az1", Family::V4, &s, tried);
        assert_eq!(
            fb(&[]),
            PrefixFallback::Sibling {
                subnet_id: "subnet-mid".to_owned(),
                count: 1
            }
        );
        assert_eq!(
            fb(&["subnet-mid".to_owned()]),
            PrefixFallback::Sibling {
                subnet_id: "subnet-t".to_owned(),
                count: 1
            }
        );
        let all: Vec<String> = ["subnet-mid", "subnet-t", "subnet-own"]
            .map(String::from)
            .to_vec();
        assert_eq!(fb(&all), PrefixFallback::Secondaries);
        // The sibling's room bounds the count: subnet-own holds one /28 besides a primary.
        let three = CloudAction::Create {
            subnet_id: "subnet-big".to_owned(),
            device_index: 1,
            count: 3,
            prefixes: true,
        };
        let tried: Vec<String> = ["subnet-mid", "subnet-t"].map(String::from).to_vec();
        assert_eq!(
            prefix_fallback(&three, &default, "az1", Family::V4, &s, &tried),
            PrefixFallback::Sibling {
                subnet_id: "subnet-own".to_owned(),
                count: 1
            }
        );
        let assign = CloudAction::Assign {
            interface: CloudId::new("eni-1").unwrap(),
            count: 1,
            prefixes: true,
        };
        assert_eq!(
            prefix_fallback(&assign, &default, "az1", Family::V4, &s, &[]),
            PrefixFallback::Secondaries
        );
        // Explicit subnets bound the siblings too.
        let explicit = CloudPoolConfig {
            subnet_ids: vec!["subnet-big".into(), "subnet-own".into()],
            ..CloudPoolConfig::default()
        };
        assert_eq!(
            prefix_fallback(&create, &explicit, "az1", Family::V4, &s, &[]),
            PrefixFallback::Sibling {
                subnet_id: "subnet-own".to_owned(),
                count: 1
            }
        );
    }

    #[test]
    fn serve_order_is_cilium_s() {
        // Cilium's example [+8, +3, 0, 0, -9, -2], given shuffled.
        let keys: Vec<ServeKey> = [(0, 2), (3, 0), (0, 0), (8, 0), (0, 9), (0, 0)]
            .into_iter()
            .map(ServeKey::from)
            .collect();
        assert_eq!(serve_order(&keys), vec![3, 1, 2, 5, 4, 0]);
        // IPv4 need first, IPv6 need breaks ties; a node needing only IPv6 is still served
        // before idle nodes; need wins over excess.
        let keys = [
            ServeKey {
                needed_v4: 0,
                needed_v6: 0,
                excess: 0,
            },
            ServeKey {
                needed_v4: 0,
                needed_v6: 5,
                excess: 0,
            },
            ServeKey {
                needed_v4: 2,
                needed_v6: 1,
                excess: 0,
            },
            ServeKey {
                needed_v4: 2,
                needed_v6: 7,
                excess: 0,
            },
            ServeKey {
                needed_v4: 1,
                needed_v6: 0,
                excess: 40,
            },
        ];
        assert_eq!(serve_order(&keys), vec![3, 2, 4, 1, 0]);
        assert_eq!(serve_order(&[]), Vec::<usize>::new());
    }
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn a_prefix_refusal_expires_after_its_ttl() {
        assert!(!prefix_refusal_holds(None, 5));
        assert!(prefix_refusal_holds(Some(1_000), 1_000));
        assert!(prefix_refusal_holds(
            Some(1_000),
            1_000 + PREFIX_REFUSAL_TTL_MS - 1
        ));
        assert!(!prefix_refusal_holds(
            Some(1_000),
            1_000 + PREFIX_REFUSAL_TTL_MS
        ));
        assert!(prefix_refusal_holds(Some(9_000), 1_000));
    }
}
