//! AWS VPC CNI ipamd's warm targets (CLUSTER-DESIGN 2.1), as needed and excess addresses, with
//! corral's no-flap rule: releasing the excess never makes the node short next round.

use crate::config::WarmTargets;

use super::InstanceLimits;

/// Which of AWS VPC CNI's targets rules a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmMode {
    /// `WARM_IP_TARGET` and/or `MINIMUM_IP_TARGET` (an unset one counts 0).
    Ip {
        /// Free addresses kept ahead of use.
        warm: u64,
        /// Addresses held at least.
        minimum: u64,
    },
    /// `WARM_ENI_TARGET` (default 1): this many whole interfaces' worth kept free; a node
    /// that is short fills whole interfaces.
    Eni(u64),
    /// `WARM_PREFIX_TARGET` (prefix delegation, no IP target): free /28s kept ahead.
    Prefix(u64),
}

/// The mode `targets` put a node in: IP targets win, then the prefix target (only under
/// prefix delegation), else the ENI target (default 1).
pub fn warm_mode(targets: &WarmTargets, prefixes: bool) -> WarmMode {
    if targets.warm_ip.is_some() || targets.minimum_ip.is_some() {
        return WarmMode::Ip {
            warm: targets.warm_ip.unwrap_or(0),
            minimum: targets.minimum_ip.unwrap_or(0),
        };
    }
    match targets.warm_prefix {
        Some(n) if prefixes => WarmMode::Prefix(n),
        _ => WarmMode::Eni(targets.warm_eni.unwrap_or(1)),
    }
}

/// Addresses one interface gives WARM_ENI (`perENI`): its IPv4 slots less the primary, x16 with
/// prefixes.
fn eni_units(limits: &InstanceLimits, prefixes: bool) -> u64 {
    u64::from(limits.ipv4_per_interface.saturating_sub(1)).saturating_mul(if prefixes {
        16
    } else {
        1
    })
}

/// The excess of a node whose release has begun (it was in excess at its last plan): as
/// [`warm_needed_and_excess`]'s, except that under WARM_ENI the release goes on down to
/// `max(n * perENI, 1)` free once begun above `(n + 1) * perENI`, as AWS frees interface after
/// interface while what stays free is at least the target (without it a release that marked
/// the 16 entries an agent lists stopped under the threshold, 2 short: 11 free where the rule
/// says 9). It never flaps: growth begins only under `n * perENI` free, and the release stops
/// at it.
pub fn warm_excess_releasing(
    targets: &WarmTargets,
    limits: &InstanceLimits,
    prefixes: bool,
    available: u64,
    used: u64,
) -> u64 {
    let (needed, excess) = warm_needed_and_excess(targets, limits, prefixes, available, used, 0);
    match warm_mode(targets, prefixes) {
        WarmMode::Eni(n) if needed == 0 => {
            let target = n.saturating_mul(eni_units(limits, prefixes)).max(1);
            available.saturating_sub(used).saturating_sub(target)
        }
        _ => excess,
    }
}

/// How many addresses the node needs and has in excess under AWS VPC CNI's targets
/// (CLUSTER-DESIGN 2.1: `short`, `over`, WARM_ENI, WARM_PREFIX), with corral's no-flap rule;
/// `(needed, excess)`. `available` is what the node holds (AWS's `total`), `used` what its
/// pods have (`assigned`), `pending` allocations waiting (a surge: at least `pending - free`
/// is needed). The targets count IPv4 interface slots (`perENI = ipv4_per_interface - 1`,
/// x16 with `prefixes`).
///
/// - IP targets: `short = max(warm - free, min - total, 0)`; `over = max(min(free - warm,
///   total - min), 0)` (releasing it leaves `free >= warm` and `total >= min`: never short
///   next round). With prefixes, `over` is whole prefixes beyond the prefixes covering
///   `max(used + warm, min)` (AWS's `overPrefix`; a minimum above 16N acts as 16(N+1)).
/// - WARM_ENI n: short when `free < n * perENI` (or n = 0 and nothing free): needs the
///   difference (at least 1); excess only when `free >= (n + 1) * perENI` (and more than one
///   interface's worth: with n = 0 a growth step leaves exactly `perENI` free), down to
///   `max(n * perENI, 1)` free (so n = 0 does not flap between 0 and 1 free).
/// - WARM_PREFIX n: short when fewer than n whole prefixes are free (or nothing is free):
///   needs `16 * max(n - freePrefixes, 1)`; excess `16 * (freePrefixes - max(n, 1))`.
pub fn warm_needed_and_excess(
    targets: &WarmTargets,
    limits: &InstanceLimits,
    prefixes: bool,
    available: u64,
    used: u64,
    pending: u64,
) -> (u64, u64) {
    let free = available.saturating_sub(used);
    let (needed, excess) = match warm_mode(targets, prefixes) {
        WarmMode::Ip { warm, minimum } => {
            let short = warm
                .saturating_sub(free)
                .max(minimum.saturating_sub(available));
            let over = if prefixes {
                let keep = used
                    .saturating_add(warm)
                    .max(minimum)
                    .div_ceil(16)
                    .saturating_mul(16);
                available.saturating_sub(keep) / 16 * 16
            } else {
                free.saturating_sub(warm)
                    .min(available.saturating_sub(minimum))
            };
            (short, over)
        }
        WarmMode::Eni(n) => {
            let per = eni_units(limits, prefixes);
            let target = n.saturating_mul(per);
            let needed = if free < target || (n == 0 && free == 0) {
                target.saturating_sub(free).max(1)
            } else {
                0
            };
            // AWS frees an interface at `free >= (n + 1) * perENI`; with n = 0 that is exactly
            // what one growth step leaves (nothing free: a whole interface's worth), so corral
            // asks for one address more than that: a node never releases what it just took.
            let threshold = n
                .saturating_add(1)
                .saturating_mul(per)
                .max(per.saturating_add(1));
            let excess = if per > 0 && free >= threshold {
                free.saturating_sub(target.max(1))
            } else {
                0
            };
            (needed, excess)
        }
        WarmMode::Prefix(n) => {
            let free_prefixes = free / 16;
            let needed = if free_prefixes < n || free == 0 {
                n.saturating_sub(free_prefixes).max(1).saturating_mul(16)
            } else {
                0
            };
            (
                needed,
                free_prefixes.saturating_sub(n.max(1)).saturating_mul(16),
            )
        }
    };
    let surge = pending.saturating_sub(free);
    let needed = needed.max(surge);
    (needed, if needed > 0 { 0 } else { excess })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Nitro instance (it takes prefixes) of `max_interfaces` interfaces of
    /// `per_interface` addresses (of each family).
    fn nitro(max_interfaces: u32, per_interface: u32) -> InstanceLimits {
        InstanceLimits {
            max_interfaces,
            ipv4_per_interface: per_interface,
            ipv6_per_interface: per_interface,
            prefix_delegation: true,
        }
    }

    fn m5_large() -> InstanceLimits {
        nitro(3, 10)
    }

    fn ip(warm: Option<u64>, minimum: Option<u64>) -> WarmTargets {
        WarmTargets {
            warm_ip: warm,
            minimum_ip: minimum,
            ..WarmTargets::default()
        }
    }

    /// CLUSTER-DESIGN 2.1's rows for WARM_IP=2 MIN=10 on an m5.large.
    #[test]
    fn ip_targets_worked_examples() {
        let t = ip(Some(2), Some(10));
        let l = m5_large();
        // 0 pods, nothing held: short 10.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 0, 0, 0), (10, 0));
        // 9 held after the first assign (9 on the primary): short 1 more.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 9, 0, 0), (1, 0));
        // 10 held, 9 pods: free 1 < 2: short 1 -> 11.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 10, 9, 0), (1, 0));
        assert_eq!(warm_needed_and_excess(&t, &l, false, 11, 9, 0), (0, 0));
        // 4 pods deleted: 11 held, 5 used: over = min(6 - 2, 11 - 10) = 1 -> 10.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 11, 5, 0), (0, 1));
        assert_eq!(warm_needed_and_excess(&t, &l, false, 10, 5, 0), (0, 0));
        // p3dn.24xlarge WARM_IP=5 MIN=10, 45 pods on 50: neither.
        let t = ip(Some(5), Some(10));
        assert_eq!(warm_needed_and_excess(&t, &l, false, 50, 45, 0), (0, 0));
    }

    #[test]
    fn ip_targets_never_flap() {
        let l = m5_large();
        for warm in [None, Some(0), Some(1), Some(2), Some(7), Some(20)] {
            for minimum in [None, Some(0), Some(3), Some(10), Some(33)] {
                if warm.is_none() && minimum.is_none() {
                    continue;
                }
                let t = ip(warm, minimum);
                for prefixes in [false, true] {
                    for available in 0..80 {
                        for used in 0..=available {
                            let (needed, excess) =
                                warm_needed_and_excess(&t, &l, prefixes, available, used, 0);
                            assert!(needed == 0 || excess == 0);
                            if excess > 0 {
                                let after = available - excess;
                                assert_eq!(
                                    warm_needed_and_excess(&t, &l, prefixes, after, used, 0),
                                    (0, 0),
                                    "{t:?} {prefixes} {available} {used}"
                                );
                            }
                            if needed > 0 {
                                let unit = if prefixes { 16 } else { 1 };
                                let after = available + needed.div_ceil(unit) * unit;
                                let (n2, e2) =
                                    warm_needed_and_excess(&t, &l, prefixes, after, used, 0);
                                assert_eq!((n2, e2), (0, 0), "{t:?} {prefixes} {available} {used}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// CLUSTER-DESIGN 2.1's WARM_ENI rows on an m5.large (primary interface used: 9 slots).
    #[test]
    fn eni_target_worked_examples() {
        let t = WarmTargets::default();
        let l = m5_large();
        assert_eq!(warm_mode(&t, false), WarmMode::Eni(1));
        // 0 pods, 9 held: 9 >= 1 * 9.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 9, 0, 0), (0, 0));
        // 1 pod: 8 free < 9: short (a whole interface is attached).
        assert_eq!(warm_needed_and_excess(&t, &l, false, 9, 1, 0), (1, 0));
        assert_eq!(warm_needed_and_excess(&t, &l, false, 18, 1, 0), (0, 0));
        // 10 pods, 27 held, 17 free: fine, and not a whole extra interface free.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 27, 10, 0), (0, 0));
        // 27 held, 0 pods: 27 >= 2 * 9: release down to 9 free.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 27, 0, 0), (0, 18));
        // A release begun goes on to 9 free (AWS frees interface after interface): one round
        // marks at most the 16 entries an agent lists, leaving 11, under the threshold of 18.
        assert_eq!(warm_needed_and_excess(&t, &l, false, 11, 0, 0), (0, 0));
        assert_eq!(warm_excess_releasing(&t, &l, false, 11, 0), 2);
        assert_eq!(warm_excess_releasing(&t, &l, false, 27, 0), 18);
        assert_eq!(warm_excess_releasing(&t, &l, false, 9, 0), 0);
        // ...and never into growth: under 9 free the node needs, and releases nothing.
        assert_eq!(warm_excess_releasing(&t, &l, false, 9, 1), 0);
        assert_eq!(warm_excess_releasing(&t, &l, false, 17, 1), 7);
        // WARM_ENI = 0: something free is kept, never 0 then 1 again.
        let zero = WarmTargets {
            warm_eni: Some(0),
            ..WarmTargets::default()
        };
        assert_eq!(warm_needed_and_excess(&zero, &l, false, 5, 5, 0), (1, 0));
        // 9 free is what a growth step leaves (a whole interface): kept; 10 is excess.
        assert_eq!(warm_needed_and_excess(&zero, &l, false, 14, 5, 0), (0, 0));
        assert_eq!(warm_needed_and_excess(&zero, &l, false, 15, 5, 0), (0, 9));
        assert_eq!(warm_needed_and_excess(&zero, &l, false, 6, 5, 0), (0, 0));
        // Prefix delegation: an interface's worth is 9 * 16.
        assert_eq!(warm_needed_and_excess(&t, &l, true, 144, 1, 0), (1, 0));
    }

    /// CLUSTER-DESIGN 2.1: t3.small PD, WARM_PREFIX=1, 17 pods on 3 prefixes (16, 1, 0 used).
    #[test]
    fn prefix_target_worked_examples() {
        let t = WarmTargets {
            warm_prefix: Some(1),
            ..WarmTargets::default()
        };
        let l = nitro(3, 4);
        assert_eq!(warm_mode(&t, true), WarmMode::Prefix(1));
        assert_eq!(
            warm_mode(&t, false),
            WarmMode::Eni(1),
            "no prefixes: ENI target"
        );
        assert_eq!(warm_needed_and_excess(&t, &l, true, 48, 17, 0), (0, 0));
        // 32 held, 17 used: no whole prefix free: one more.
        assert_eq!(warm_needed_and_excess(&t, &l, true, 32, 17, 0), (16, 0));
        // 64 held, 17 used: two whole free beyond the one kept... 47 free = 2 whole: one goes.
        assert_eq!(warm_needed_and_excess(&t, &l, true, 64, 17, 0), (0, 16));
        // WARM_PREFIX = 0: one whole free prefix is kept (no 0 <-> 1 flap).
        let zero = WarmTargets {
            warm_prefix: Some(0),
            ..WarmTargets::default()
        };
        assert_eq!(warm_needed_and_excess(&zero, &l, true, 32, 32, 0), (16, 0));
        assert_eq!(warm_needed_and_excess(&zero, &l, true, 48, 32, 0), (0, 0));
    }

    #[test]
    fn waiting_allocations_surge() {
        let t = ip(Some(2), None);
        // 10 held, 8 used: nothing short, but 6 wait: 4 more.
        assert_eq!(
            warm_needed_and_excess(&t, &m5_large(), false, 10, 8, 6),
            (4, 0)
        );
    }

    /// WARM_ENI = 0 grows by a whole interface when nothing is free; what that leaves is not
    /// excess (a proptest found the node releasing 48 of the 49 addresses it had just taken).
    #[test]
    fn warm_eni_zero_keeps_the_interface_it_just_filled() {
        let t = WarmTargets {
            warm_eni: Some(0),
            ..WarmTargets::default()
        };
        let big = nitro(15, 50);
        assert_eq!(warm_needed_and_excess(&t, &big, false, 0, 0, 0), (1, 0));
        assert_eq!(warm_needed_and_excess(&t, &big, false, 49, 0, 0), (0, 0));
        // One interface's worth and more free: the rest goes back, down to one free.
        assert_eq!(warm_needed_and_excess(&t, &big, false, 60, 10, 0), (0, 49));
    }
}
