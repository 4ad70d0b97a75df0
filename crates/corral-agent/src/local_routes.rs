//! Reserving local routes (Cilium's `ReserveLocalRoutes`): addresses the node itself holds, or
//! routes somewhere other than to its pods, are excluded from the pools they fall in.
//!
//! The node's networks ([`HostNetworks`], read through netlink by `netlink.rs`) are turned
//! into exclusions by a pure function, [`plan`]: routes, addresses, pools and the allocated
//! addresses in, exclusions and conflicts out. A source is a network with a reason:
//!
//! - every interface address, as a single address (`local address 10.88.0.5 of eth0`);
//! - every interface address's subnet (`local subnet 10.88.0.0/24 of eth0`), which is on
//!   the node's link even without a route (`noprefixroute`);
//! - every route of every table that sends traffic somewhere (unicast) or takes it in
//!   (local): its destination, and each gateway it goes through
//!   (`local route 10.0.0.0/24 via 10.1.0.1 dev eth0`). Broadcast, multicast, blackhole,
//!   unreachable and prohibit routes carry no traffic to a host, and are left out (Calico
//!   installs a blackhole route for its own block).
//!
//! A source is *the pool's own*, and excludes nothing from a range of the pool, when
//!
//! 1. it contains the range's whole subnet: the bridge's subnet route (`10.88.0.0/16 dev
//!    cni0`), an aggregate or the default route say where the range lives, not what in it
//!    is taken, so a route wider than the pool never excludes all of it;
//! 2. it is the range's gateway (the bridge's own address, `10.88.0.1` on `cni0`);
//! 3. all its interfaces hold a gateway of one of the pool's ranges: that interface is the
//!    pool's bridge (`cni0`, or each host-side veth of the ptp plugin), as Cilium skips
//!    routes through its own `cilium_host`;
//! 4. it is a unicast route to one address that is allocated: a pod's host route, as the
//!    ptp plugin and Calico install them.
//!
//! Every other source excludes, from the ranges it is not the own of, the addresses it
//! shares with them: as the fewest CIDRs inside the source that hold them and none of the
//! addresses of the ranges it is the own of (a route over one range's whole subnet and part
//! of another range takes only that part). Addresses in no range of the pool (a subnet's
//! network and broadcast addresses) may go either way, so a route stays one CIDR where it
//! can. An address that is allocated is never excluded: the CIDRs go around it, and it is
//! reported as a conflict (nothing is ever released here).
//! Two sources of one network keep the first reason, in the order above.
//!
//! [`reserve`] applies a plan to a scope: exclusions whose reason starts with `local route `,
//! `local address ` or `local subnet ` are the reservation's own, and are replaced (a new
//! reason), removed (their source is gone) or kept, so running it again changes nothing.
//! An exclusion of the same network with another reason (an operator's) is left as it is.
//! Only the agent's own scope `node` takes local-route exclusions: a CNI network's scope is
//! rebuilt from the configuration its plugin sends, which would drop them.
//! The agent reserves at start (before it is ready, so nothing is handed out first) and on
//! `POST /v1/pools/reserve-local-routes`; conflicts are logged (warn) and answered.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use corral_api::{self as api, ErrorCode};
use corral_core::{
    Engine, Exclusion, Family, IpNet, MAX_OWNER_LEN, PoolName, RangeSpec, addr_value,
};
use corral_store::{PoolSpec, ScopeConfig};

use crate::error::OpError;

/// The reasons of the exclusions a reservation makes start with one of these; exclusions
/// with any other reason are never touched by it.
pub const LOCAL_REASON_PREFIXES: [&str; 3] = ["local route ", "local address ", "local subnet "];

/// Whether an exclusion's reason marks it as made by a reservation of local routes.
pub fn is_local_reason(reason: &str) -> bool {
    LOCAL_REASON_PREFIXES
        .iter()
        .any(|prefix| reason.starts_with(prefix))
}

/// What a route does with the traffic it matches, as far as reserving goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// Sent out of an interface, directly or through a gateway.
    Unicast,
    /// Taken in by this host (the local table's entry for each address, or AnyIP).
    Local,
    /// Broadcast, multicast, blackhole, unreachable, prohibit, ...: reaches no host.
    Other,
}

/// One way out of a route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextHop {
    /// The interface's name (its index when it has none).
    pub device: String,
    pub gateway: Option<IpAddr>,
}

/// A route of any table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalRoute {
    pub destination: IpNet,
    pub kind: RouteKind,
    pub next_hops: Vec<NextHop>,
}

/// An address of an interface, with its prefix length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAddress {
    pub device: String,
    pub address: IpAddr,
    pub prefix_len: u8,
}

/// What the node's network stack holds, as netlink reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetworks {
    pub addresses: Vec<LocalAddress>,
    pub routes: Vec<LocalRoute>,
}

/// A pool and its ranges, as [`plan`] needs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRanges {
    pub pool: PoolName,
    pub ranges: Vec<RangeSpec>,
}

/// An allocated address a source covers: not excluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub pool: PoolName,
    pub address: IpAddr,
    pub reason: String,
}

/// What the node's networks ask of the pools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The exclusions each pool should hold, by network; every pool given is listed.
    pub exclusions: BTreeMap<PoolName, BTreeMap<IpNet, String>>,
    pub conflicts: Vec<Conflict>,
}

/// A network some interface or route covers, with why.
#[derive(Debug)]
struct Source<'a> {
    network: IpNet,
    reason: String,
    /// The interfaces it is on (empty: none known).
    devices: Vec<&'a str>,
    /// A unicast route to exactly one address.
    host_route: bool,
    /// A unicast route (or one of its gateways): only those may be a bridge's own (rule 3);
    /// an interface address or a local route on the bridge is a host address all the same.
    unicast: bool,
}

/// The address alone, as a /32 or /128.
fn host_net(address: IpAddr) -> IpNet {
    IpNet::from(address)
}

/// A reason an exclusion accepts: no control characters (an interface name may hold some),
/// at most [`MAX_OWNER_LEN`] bytes.
fn clean_reason(text: String) -> String {
    let mut clean: String = text
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if clean.len() > MAX_OWNER_LEN {
        let mut end = MAX_OWNER_LEN;
        while !clean.is_char_boundary(end) {
            end -= 1;
        }
        clean.truncate(end);
    }
    clean
}

fn route_text(route: &LocalRoute) -> String {
    // As `ip route` writes it.
    let destination = if route.destination.prefix_len() == 0 {
        "default".to_owned()
    } else if route.destination.prefix_len() == route.destination.max_prefix_len() {
        route.destination.addr().to_string()
    } else {
        route.destination.to_string()
    };
    let hops: Vec<String> = route
        .next_hops
        .iter()
        .map(|hop| match hop.gateway {
            Some(gateway) => format!("via {gateway} dev {}", hop.device),
            None => format!("dev {}", hop.device),
        })
        .collect();
    if hops.is_empty() {
        format!("local route {destination}")
    } else {
        format!("local route {destination} {}", hops.join(", "))
    }
}

/// Every source, in the order their reasons take precedence.
fn sources(host: &HostNetworks) -> Vec<Source<'_>> {
    let mut out = Vec::new();
    for address in &host.addresses {
        out.push(Source {
            network: host_net(address.address),
            reason: clean_reason(format!(
                "local address {} of {}",
                address.address, address.device
            )),
            devices: vec![address.device.as_str()],
            host_route: false,
            unicast: false,
        });
    }
    for address in &host.addresses {
        let bits = Family::of(address.address).bits();
        if address.prefix_len >= bits {
            continue;
        }
        let Ok(subnet) = IpNet::new(address.address, address.prefix_len) else {
            continue;
        };
        out.push(Source {
            network: subnet.trunc(),
            reason: clean_reason(format!(
                "local subnet {} of {}",
                subnet.trunc(),
                address.device
            )),
            devices: vec![address.device.as_str()],
            host_route: false,
            // The kernel's connected route: a route on the bridge like any other.
            unicast: true,
        });
    }
    for route in &host.routes {
        if route.kind == RouteKind::Other {
            continue;
        }
        let reason = clean_reason(route_text(route));
        let devices: Vec<&str> = route.next_hops.iter().map(|h| h.device.as_str()).collect();
        out.push(Source {
            network: route.destination.trunc(),
            reason: reason.clone(),
            devices,
            host_route: route.kind == RouteKind::Unicast
                && route.destination.prefix_len() == route.destination.max_prefix_len(),
            unicast: route.kind == RouteKind::Unicast,
        });
        if route.kind == RouteKind::Unicast {
            for hop in &route.next_hops {
                if let Some(gateway) = hop.gateway {
                    out.push(Source {
                        network: host_net(gateway),
                        reason: reason.clone(),
                        devices: vec![hop.device.as_str()],
                        host_route: false,
                        unicast: true,
                    });
                }
            }
        }
    }
    out
}

/// Whether `source` is the pool's own as far as `range` goes (rules 1, 2 and 4; rule 3 is
/// the pool's, checked once per source).
fn is_own(source: &Source<'_>, range: &RangeSpec, allocated: &BTreeSet<IpAddr>) -> bool {
    let network = source.network;
    let single = network.prefix_len() == network.max_prefix_len();
    // Rule 1: it says where the range lives, not what in it is taken.
    network.contains(&range.subnet_net())
        // Rule 2: the range's gateway.
        || (single && range.gateway() == Some(network.addr()))
        // Rule 4: a pod's host route.
        || (source.host_route && allocated.contains(&network.addr()))
}

/// The addresses a source must exclude (`must`) and must leave alone (`keep`, and the
/// allocated ones), within one of its CIDR blocks.
struct Cover<'a> {
    family: Family,
    must: &'a [(u128, u128)],
    keep: &'a [(u128, u128)],
    allocated: &'a BTreeSet<IpAddr>,
}

impl Cover<'_> {
    /// The fewest CIDRs inside the block `low`/`prefix_len` that hold every `must` address
    /// and no `keep` or allocated one; what is neither may go either way (the network and
    /// broadcast addresses, the part of a subnet outside its range), so a route stays one
    /// CIDR where it can.
    fn cover(&self, low: u128, prefix_len: u8, out: &mut Vec<IpNet>) {
        let host_bits = u32::from(self.family.bits() - prefix_len);
        let high = if host_bits >= 128 {
            u128::MAX
        } else {
            low | ((1u128 << host_bits) - 1)
        };
        let overlaps = |list: &[(u128, u128)]| list.iter().any(|&(a, b)| a <= high && b >= low);
        if !overlaps(self.must) {
            return;
        }
        let holds_allocated = self
            .allocated
            .range(self.family.addr(low)..=self.family.addr(high))
            .next()
            .is_some();
        if !overlaps(self.keep) && !holds_allocated {
            if let Ok(net) = IpNet::new(self.family.addr(low), prefix_len) {
                out.push(net);
            }
            return;
        }
        if host_bits == 0 {
            return;
        }
        let half = 1u128 << (host_bits - 1);
        self.cover(low, prefix_len + 1, out);
        self.cover(low | half, prefix_len + 1, out);
    }
}

/// What the node's networks exclude from each pool; see the module documentation for the
/// rules. `allocated` holds every allocated address of the scope.
pub fn plan(host: &HostNetworks, pools: &[PoolRanges], allocated: &BTreeSet<IpAddr>) -> Plan {
    let sources = sources(host);
    let mut plan = Plan::default();
    for pool in pools {
        let gateways: BTreeSet<IpAddr> = pool.ranges.iter().filter_map(|r| r.gateway()).collect();
        // Rule 3: the interfaces that hold one of the pool's gateways are its bridges.
        let own_devices: BTreeSet<&str> = host
            .addresses
            .iter()
            .filter(|a| gateways.contains(&a.address))
            .map(|a| a.device.as_str())
            .collect();
        let wanted = plan.exclusions.entry(pool.pool.clone()).or_default();
        let mut reported: BTreeSet<IpAddr> = BTreeSet::new();
        for source in &sources {
            if source.unicast
                && !source.devices.is_empty()
                && source.devices.iter().all(|d| own_devices.contains(d))
            {
                continue;
            }
            let network = source.network;
            let family = Family::of(network.addr());
            let (low, high) = (
                addr_value(network.network()),
                addr_value(network.broadcast()),
            );
            let mut must = Vec::new();
            let mut keep = Vec::new();
            for range in pool.ranges.iter().filter(|r| r.family() == family) {
                let bounds = (addr_value(range.start()), addr_value(range.end()));
                if is_own(source, range, allocated) {
                    keep.push(bounds);
                } else if bounds.0 <= high && bounds.1 >= low {
                    // A range the source is not the range's own route for lies in a subnet
                    // that holds the whole source (CIDRs nest, and rule 1 took the other way).
                    must.push((bounds.0.max(low), bounds.1.min(high)));
                }
            }
            if must.is_empty() {
                continue;
            }
            for &(from, to) in &must {
                for &address in allocated.range(family.addr(from)..=family.addr(to)) {
                    if reported.insert(address) {
                        plan.conflicts.push(Conflict {
                            pool: pool.pool.clone(),
                            address,
                            reason: source.reason.clone(),
                        });
                    }
                }
            }
            let mut nets = Vec::new();
            Cover {
                family,
                must: &must,
                keep: &keep,
                allocated,
            }
            .cover(low, network.prefix_len(), &mut nets);
            for net in nets {
                wanted.entry(net).or_insert_with(|| source.reason.clone());
            }
        }
    }
    plan
}

/// A reservation of local routes in one scope, as the committer runs it.
#[derive(Debug)]
pub struct LocalRoutesRequest {
    pub scope: String,
    pub host: HostNetworks,
}

/// The one scope local-route exclusions live in: a CNI network's scope is rebuilt from the
/// configuration its plugin sends, which would drop them.
pub fn check_scope(scope: &str) -> Result<(), OpError> {
    if scope == api::NODE_SCOPE {
        Ok(())
    } else {
        Err(OpError::bad_request(format!(
            "local routes are reserved only in scope {:?} (the agent's own pools), not in \
             {scope:?}: a CNI network's pools follow its configuration (exclude addresses there)",
            api::NODE_SCOPE
        )))
    }
}

/// The scope's stored configuration of `pool`, created if it has none.
fn stored_pool<'a>(
    config: &'a mut ScopeConfig,
    engine: &Engine,
    pool: &PoolName,
) -> Result<&'a mut PoolSpec, OpError> {
    let index = match config.pools.iter().position(|p| p.name == pool.as_str()) {
        Some(index) => index,
        None => {
            let pool_config = engine.pool_config(pool)?;
            config.pools.push(PoolSpec::new(
                pool,
                pool_config.cooldown,
                pool_config.reuse,
                &[],
                &[],
            ));
            config.pools.len() - 1
        }
    };
    Ok(&mut config.pools[index])
}

fn exclusion_info(pool: &PoolName, network: IpNet, reason: &str) -> api::LocalRouteExclusion {
    api::LocalRouteExclusion {
        pool: pool.to_string(),
        network: network.to_string(),
        reason: reason.to_owned(),
    }
}

/// Brings a scope's local-route exclusions in line with the node's networks: adds what is
/// new, replaces what changed reason, removes what lost its source, in the engine and in
/// the stored configuration alike. Nothing allocated is excluded or released.
pub fn reserve(
    scope: &str,
    engine: &mut Engine,
    config: &mut ScopeConfig,
    host: &HostNetworks,
) -> Result<api::ReserveLocalRoutesResponse, OpError> {
    check_scope(scope)?;
    let mut pools = Vec::new();
    for pool in engine.pool_names() {
        let ranges = engine.ranges(&pool)?.into_iter().map(|r| r.spec).collect();
        pools.push(PoolRanges { pool, ranges });
    }
    let allocated: BTreeSet<IpAddr> = engine
        .dump()
        .iter()
        .flat_map(|pool| pool.allocations.iter().map(|a| a.addr))
        .collect();
    let plan = plan(host, &pools, &allocated);

    // Decide every change before making any, so a refusal changes nothing.
    let mut removals: Vec<(PoolName, IpNet, String)> = Vec::new();
    let mut additions: Vec<(PoolName, Exclusion)> = Vec::new();
    for (pool, wanted) in &plan.exclusions {
        let current = engine.exclusions(pool)?;
        let by_network: BTreeMap<IpNet, &str> =
            current.iter().map(|e| (e.network(), e.reason())).collect();
        for exclusion in &current {
            if is_local_reason(exclusion.reason()) && !wanted.contains_key(&exclusion.network()) {
                removals.push((
                    pool.clone(),
                    exclusion.network(),
                    exclusion.reason().to_owned(),
                ));
            }
        }
        for (&network, reason) in wanted {
            match by_network.get(&network) {
                Some(existing) if *existing == reason.as_str() => {}
                // An operator's exclusion of the same network stays as they made it.
                Some(existing) if !is_local_reason(existing) => {}
                _ => {
                    let exclusion = Exclusion::new(network, reason).map_err(|e| {
                        OpError::new(
                            ErrorCode::RetryLater,
                            format!("internal: local route exclusion {network}: {e}"),
                        )
                    })?;
                    additions.push((pool.clone(), exclusion));
                }
            }
        }
    }

    for (pool, network, _) in &removals {
        engine.remove_exclusion(pool, *network)?;
        let text = network.to_string();
        stored_pool(config, engine, pool)?
            .exclusions
            .retain(|e| e.0 != text);
    }
    for (pool, exclusion) in &additions {
        engine.exclude(pool, exclusion.clone())?;
        let text = exclusion.network().to_string();
        let stored = stored_pool(config, engine, pool)?;
        // In place, as the engine replaces it: the order is what a restart rebuilds.
        let reason = exclusion.reason().to_owned();
        match stored.exclusions.iter_mut().find(|e| e.0 == text) {
            Some(existing) => existing.1 = reason,
            None => stored.exclusions.push((text, reason)),
        }
    }

    let mut excluded = Vec::new();
    for pool in engine.pool_names() {
        for exclusion in engine.exclusions(&pool)? {
            if is_local_reason(exclusion.reason()) {
                excluded.push(exclusion_info(
                    &pool,
                    exclusion.network(),
                    exclusion.reason(),
                ));
            }
        }
    }
    Ok(api::ReserveLocalRoutesResponse {
        scope: scope.to_owned(),
        excluded,
        added: additions
            .iter()
            .map(|(pool, e)| exclusion_info(pool, e.network(), e.reason()))
            .collect(),
        removed: removals
            .iter()
            .map(|(pool, network, reason)| exclusion_info(pool, *network, reason))
            .collect(),
        conflicts: plan
            .conflicts
            .iter()
            .map(|c| api::LocalRouteConflict {
                pool: c.pool.to_string(),
                address: c.address,
                owner: engine
                    .lookup(c.address)
                    .map(|info| info.entry.owner)
                    .unwrap_or_default(),
                reason: c.reason.clone(),
            })
            .collect(),
    })
}

/// Logs a reservation: what changed (info), and every conflict (warn: an address the node
/// uses that a pod holds needs a person).
pub fn log(response: &api::ReserveLocalRoutesResponse) {
    for e in &response.added {
        tracing::info!(
            network = %e.network,
            pool = %e.pool,
            reason = %e.reason,
            "local routes: excluded"
        );
    }
    for e in &response.removed {
        tracing::info!(
            network = %e.network,
            pool = %e.pool,
            was = %e.reason,
            "local routes: no longer excluded"
        );
    }
    for c in &response.conflicts {
        tracing::warn!(
            address = %c.address,
            pool = %c.pool,
            owner = ?c.owner,
            covered_by = %c.reason,
            "local routes: conflict: allocated but covered by a local route; left allocated and \
             not excluded"
        );
    }
}

#[cfg(test)]
mod tests {
    use corral_core::{EngineConfig, Request, Target, Timestamp};

    use super::*;

    /// `ip route`-like text: `[local|blackhole|broadcast] DEST|default [via GW] [dev DEV] ...`,
    /// where each `dev` ends a next hop.
    fn route(text: &str) -> LocalRoute {
        let mut words = text.split_whitespace().peekable();
        let kind = match words.peek() {
            Some(&"local") => RouteKind::Local,
            Some(&"blackhole") | Some(&"broadcast") => RouteKind::Other,
            _ => RouteKind::Unicast,
        };
        if kind != RouteKind::Unicast {
            words.next();
        }
        let destination = words.next().unwrap();
        let mut next_hops = Vec::new();
        let mut gateway = None;
        while let Some(word) = words.next() {
            match word {
                "via" => gateway = Some(words.next().unwrap().parse().unwrap()),
                "dev" => next_hops.push(NextHop {
                    device: words.next().unwrap().to_owned(),
                    gateway: gateway.take(),
                }),
                other => panic!("unknown word {other}"),
            }
        }
        let destination = if destination == "default" {
            let family_of_gateway = next_hops.iter().find_map(|h| h.gateway);
            match family_of_gateway {
                Some(IpAddr::V6(_)) => "::/0".parse().unwrap(),
                _ => "0.0.0.0/0".parse().unwrap(),
            }
        } else {
            corral_core::parse_net(destination).unwrap()
        };
        LocalRoute {
            destination,
            kind,
            next_hops,
        }
    }

    /// `DEV ADDRESS/LEN`.
    fn address(text: &str) -> LocalAddress {
        let (device, net) = text.split_once(' ').unwrap();
        let net: IpNet = net.parse().unwrap();
        LocalAddress {
            device: device.to_owned(),
            address: net.addr(),
            prefix_len: net.prefix_len(),
        }
    }

    struct Case {
        name: &'static str,
        /// `POOL RANGE`, one range per entry.
        pools: &'static [&'static str],
        addresses: &'static [&'static str],
        routes: &'static [&'static str],
        allocated: &'static [&'static str],
        /// `POOL NETWORK REASON`.
        excluded: &'static [&'static str],
        /// `POOL ADDRESS REASON`.
        conflicts: &'static [&'static str],
    }

    const NO: &[&str] = &[];

    fn run(case: &Case) -> (Vec<String>, Vec<String>) {
        let mut pools: Vec<PoolRanges> = Vec::new();
        for line in case.pools {
            let (pool, range) = line.split_once(' ').unwrap();
            let pool = PoolName::new(pool).unwrap();
            let range: RangeSpec = range.parse().unwrap();
            match pools.iter_mut().find(|p| p.pool == pool) {
                Some(existing) => existing.ranges.push(range),
                None => pools.push(PoolRanges {
                    pool,
                    ranges: vec![range],
                }),
            }
        }
        let host = HostNetworks {
            addresses: case.addresses.iter().map(|a| address(a)).collect(),
            routes: case.routes.iter().map(|r| route(r)).collect(),
        };
        let allocated = case.allocated.iter().map(|a| a.parse().unwrap()).collect();
        let plan = plan(&host, &pools, &allocated);
        let excluded = plan
            .exclusions
            .iter()
            .flat_map(|(pool, wanted)| {
                wanted
                    .iter()
                    .map(move |(network, reason)| format!("{pool} {network} {reason}"))
            })
            .collect();
        let conflicts = plan
            .conflicts
            .iter()
            .map(|c| format!("{} {} {}", c.pool, c.address, c.reason))
            .collect();
        (excluded, conflicts)
    }

    #[test]
    fn plan_follows_the_rules_of_the_pools_own() {
        let cases = [
            Case {
                name: "the node's own address inside a pod range; its subnet holds the range",
                pools: &["default 10.88.0.0/16"],
                addresses: &["eth0 10.88.0.5/16"],
                routes: &["10.88.0.0/16 dev eth0", "local 10.88.0.5 dev eth0"],
                allocated: NO,
                excluded: &["default 10.88.0.5/32 local address 10.88.0.5 of eth0"],
                conflicts: NO,
            },
            Case {
                name: "a host network inside a pool: the address and its subnet",
                pools: &["default 10.88.0.0/16"],
                addresses: &["eth1 10.88.5.1/24"],
                routes: &["10.88.5.0/24 dev eth1"],
                allocated: NO,
                excluded: &[
                    "default 10.88.5.0/24 local subnet 10.88.5.0/24 of eth1",
                    "default 10.88.5.1/32 local address 10.88.5.1 of eth1",
                ],
                conflicts: NO,
            },
            Case {
                name: "a route through a gateway into the pool",
                pools: &["default 10.88.0.0/16"],
                addresses: NO,
                routes: &["10.88.7.0/24 via 192.168.1.1 dev eth0"],
                allocated: NO,
                excluded: &[
                    "default 10.88.7.0/24 local route 10.88.7.0/24 via 192.168.1.1 dev eth0",
                ],
                conflicts: NO,
            },
            Case {
                name: "the bridge: its address is the gateway, its routes are the pool's",
                pools: &["default 10.88.0.0/16,gateway=10.88.0.1"],
                addresses: &["cni0 10.88.0.1/16"],
                routes: &[
                    "10.88.0.0/16 dev cni0",
                    "local 10.88.0.1 dev cni0",
                    "10.88.3.0/24 dev cni0",
                ],
                allocated: NO,
                excluded: NO,
                conflicts: NO,
            },
            Case {
                name: "the bridge with a narrower mask than the range is still the pool's",
                pools: &["default 10.88.0.0/16,gateway=10.88.0.1"],
                addresses: &["cni0 10.88.0.1/24"],
                routes: &["10.88.0.0/24 dev cni0"],
                allocated: NO,
                excluded: NO,
                conflicts: NO,
            },
            Case {
                name: "a second address of the node on the pool's bridge is excluded",
                pools: &["default 10.88.0.0/16,gateway=10.88.0.1"],
                addresses: &["cni0 10.88.0.1/16", "cni0 10.88.0.254/16"],
                routes: &["10.88.0.0/16 dev cni0", "local 10.88.0.254 dev cni0"],
                allocated: NO,
                excluded: &["default 10.88.0.254/32 local address 10.88.0.254 of cni0"],
                conflicts: NO,
            },
            Case {
                name: "whatever its name, the interface holding the gateway is the pool's bridge",
                pools: &["default 10.88.0.0/16,gateway=10.88.0.1"],
                addresses: &["eth1 10.88.0.1/32"],
                routes: &["10.88.0.0/30 dev eth1"],
                allocated: NO,
                excluded: NO,
                conflicts: NO,
            },
            Case {
                name: "default and aggregate routes never exclude a whole pool",
                pools: &["default 10.88.0.0/16", "default fd88::/64"],
                addresses: NO,
                routes: &[
                    "default via 192.168.1.1 dev eth0",
                    "default via fe80::1 dev eth0",
                    "10.0.0.0/8 via 192.168.1.1 dev eth0",
                    "fd00::/8 dev eth0",
                ],
                allocated: NO,
                excluded: NO,
                conflicts: NO,
            },
            Case {
                name: "pods on the node's LAN (macvlan): the LAN is the range's, the node's \
                       address and the router inside it are not",
                pools: &["lan 192.168.1.0/24,start=192.168.1.100,end=192.168.1.200"],
                addresses: &["eth0 192.168.1.5/24", "eth0 192.168.1.120/24"],
                routes: &[
                    "192.168.1.0/24 dev eth0",
                    "default via 192.168.1.150 dev eth0",
                ],
                allocated: NO,
                excluded: &[
                    "lan 192.168.1.120/32 local address 192.168.1.120 of eth0",
                    "lan 192.168.1.150/32 local route default via 192.168.1.150 dev eth0",
                ],
                conflicts: NO,
            },
            Case {
                name: "a route over one range's subnet takes only its part of another range",
                pools: &[
                    "default 10.0.0.0/24",
                    "default 10.0.0.0/16,start=10.0.1.0,end=10.0.1.255",
                ],
                addresses: NO,
                routes: &["10.0.0.0/23 dev eth1"],
                allocated: NO,
                excluded: &["default 10.0.1.0/24 local route 10.0.0.0/23 dev eth1"],
                conflicts: NO,
            },
            Case {
                name: "a route that holds one range's subnet still takes another range's \
                       addresses inside it, in the fewest CIDRs",
                pools: &[
                    "default 10.0.0.0/24,start=10.0.0.1,end=10.0.0.100",
                    "default 10.0.0.0/16,start=10.0.0.101,end=10.0.0.200",
                ],
                addresses: NO,
                routes: &["10.0.0.0/24 dev eth0"],
                allocated: NO,
                excluded: &[
                    "default 10.0.0.101/32 local route 10.0.0.0/24 dev eth0",
                    "default 10.0.0.102/31 local route 10.0.0.0/24 dev eth0",
                    "default 10.0.0.104/29 local route 10.0.0.0/24 dev eth0",
                    "default 10.0.0.112/28 local route 10.0.0.0/24 dev eth0",
                    "default 10.0.0.128/25 local route 10.0.0.0/24 dev eth0",
                ],
                conflicts: NO,
            },
            Case {
                name: "an allocated address is left out and reported",
                pools: &["default 10.88.0.0/16"],
                addresses: NO,
                routes: &["10.88.9.0/29 dev eth1"],
                allocated: &["10.88.9.4"],
                excluded: &[
                    "default 10.88.9.0/30 local route 10.88.9.0/29 dev eth1",
                    "default 10.88.9.5/32 local route 10.88.9.0/29 dev eth1",
                    "default 10.88.9.6/31 local route 10.88.9.0/29 dev eth1",
                ],
                conflicts: &["default 10.88.9.4 local route 10.88.9.0/29 dev eth1"],
            },
            Case {
                name: "the node's address held by a pod is a conflict",
                pools: &["default 10.88.0.0/16"],
                addresses: &["eth0 10.88.0.9/32"],
                routes: &["local 10.88.0.9 dev eth0"],
                allocated: &["10.88.0.9"],
                excluded: NO,
                conflicts: &["default 10.88.0.9 local address 10.88.0.9 of eth0"],
            },
            Case {
                name: "a pod's host route (Calico, ptp) is the pool's; a stray one is not",
                pools: &["default 10.88.0.0/16"],
                addresses: NO,
                routes: &["10.88.0.7 dev cali1", "10.88.0.8 dev cali2"],
                allocated: &["10.88.0.7"],
                excluded: &["default 10.88.0.8/32 local route 10.88.0.8 dev cali2"],
                conflicts: NO,
            },
            Case {
                name: "blackhole and broadcast routes carry nothing to a host",
                pools: &["default 10.88.0.0/16"],
                addresses: NO,
                routes: &["blackhole 10.88.1.0/24", "broadcast 10.88.0.255 dev eth0"],
                allocated: NO,
                excluded: NO,
                conflicts: NO,
            },
            Case {
                name: "IPv6: the address inside the pool, a routed prefix, link-local ignored",
                pools: &["default fd88::/64"],
                addresses: &["eth0 fd88::5/64", "eth0 fe80::1/64"],
                routes: &["fd88::1:0/112 dev eth1", "fe80::/64 dev eth0"],
                allocated: NO,
                excluded: &[
                    "default fd88::5/128 local address fd88::5 of eth0",
                    "default fd88::1:0/112 local route fd88::1:0/112 dev eth1",
                ],
                conflicts: NO,
            },
            Case {
                name: "each pool gets what falls in it; a family without ranges nothing",
                pools: &["a 10.88.0.0/24", "b 10.89.0.0/24"],
                addresses: &["eth0 fd89::1/64"],
                routes: &["10.89.0.0/28 dev eth1"],
                allocated: NO,
                excluded: &["b 10.89.0.0/28 local route 10.89.0.0/28 dev eth1"],
                conflicts: NO,
            },
            Case {
                name: "multipath: every next hop is named, every gateway excluded",
                pools: &["default 10.88.0.0/16"],
                addresses: NO,
                routes: &["10.88.8.0/24 via 10.88.0.2 dev eth0 via 10.88.0.3 dev eth1"],
                allocated: NO,
                excluded: &[
                    "default 10.88.0.2/32 local route 10.88.8.0/24 via 10.88.0.2 dev eth0, via 10.88.0.3 dev eth1",
                    "default 10.88.0.3/32 local route 10.88.8.0/24 via 10.88.0.2 dev eth0, via 10.88.0.3 dev eth1",
                    "default 10.88.8.0/24 local route 10.88.8.0/24 via 10.88.0.2 dev eth0, via 10.88.0.3 dev eth1",
                ],
                conflicts: NO,
            },
        ];
        let mut failures = Vec::new();
        for case in &cases {
            let (excluded, conflicts) = run(case);
            if excluded != case.excluded || conflicts != case.conflicts {
                failures.push(format!(
                    "{}:\n  excluded {excluded:#?}\n  conflicts {conflicts:#?}",
                    case.name
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn reasons_are_valid_exclusion_reasons_whatever_the_interface_name() {
        let host = HostNetworks {
            addresses: vec![LocalAddress {
                device: "bad\u{1}name".into(),
                address: "10.88.0.5".parse().unwrap(),
                prefix_len: 32,
            }],
            routes: vec![LocalRoute {
                destination: "10.88.1.0/24".parse().unwrap(),
                kind: RouteKind::Unicast,
                next_hops: (0..200)
                    .map(|i| NextHop {
                        device: format!("eth{i}"),
                        gateway: Some("192.168.1.1".parse().unwrap()),
                    })
                    .collect(),
            }],
        };
        let pools = [PoolRanges {
            pool: PoolName::default_pool(),
            ranges: vec!["10.88.0.0/16".parse().unwrap()],
        }];
        let plan = plan(&host, &pools, &BTreeSet::new());
        let wanted = &plan.exclusions[&PoolName::default_pool()];
        assert_eq!(wanted.len(), 2);
        for (network, reason) in wanted {
            Exclusion::new(*network, reason).unwrap();
            assert!(is_local_reason(reason), "{reason}");
        }
    }

    // ---- reserve: the plan applied to an engine and its stored configuration ----------

    struct Scope {
        engine: Engine,
        config: ScopeConfig,
    }

    fn scope() -> Scope {
        let mut engine = Engine::new(EngineConfig::default());
        let pool = PoolName::default_pool();
        engine
            .add_range(&pool, "10.88.0.0/24".parse().unwrap())
            .unwrap();
        let config = ScopeConfig {
            pools: vec![PoolSpec {
                name: "default".into(),
                cooldown_ms: 0,
                lowest_free: false,
                ranges: vec![corral_store::RangeEntry::new(
                    &"10.88.0.0/24".parse().unwrap(),
                    corral_store::RangeSource::File,
                )],
                exclusions: vec![],
                interfaces: vec![],
                interface_backed: false,
            }],
        };
        Scope { engine, config }
    }

    fn host(addresses: &[&str], routes: &[&str]) -> HostNetworks {
        HostNetworks {
            addresses: addresses.iter().map(|a| address(a)).collect(),
            routes: routes.iter().map(|r| route(r)).collect(),
        }
    }

    fn reserve_in(scope: &mut Scope, host: &HostNetworks) -> api::ReserveLocalRoutesResponse {
        let response =
            reserve(api::NODE_SCOPE, &mut scope.engine, &mut scope.config, host).unwrap();
        scope.engine.check_invariants().unwrap();
        response
    }

    fn networks(list: &[api::LocalRouteExclusion]) -> Vec<&str> {
        list.iter().map(|e| e.network.as_str()).collect()
    }

    fn stored(scope: &Scope) -> Vec<(String, String)> {
        scope.config.pools[0].exclusions.clone()
    }

    fn allocate(scope: &mut Scope, target: Target, owner: &str) -> IpAddr {
        let pool = PoolName::default_pool();
        let request = Request {
            pool: &pool,
            owner,
            key: None,
            lease: None,
        };
        scope
            .engine
            .allocate(&request, target, Timestamp::ZERO)
            .unwrap()
            .addr
    }

    #[test]
    fn a_second_reservation_changes_nothing_and_a_gone_route_is_unexcluded() {
        let mut scope = scope();
        let node = host(
            &["eth0 10.88.0.1/32"],
            &["10.88.0.2/31 dev eth0", "10.88.0.8/29 dev eth1"],
        );
        let first = reserve_in(&mut scope, &node);
        assert_eq!(
            networks(&first.added),
            ["10.88.0.1/32", "10.88.0.2/31", "10.88.0.8/29"]
        );
        assert_eq!(first.excluded, first.added);
        assert!(first.removed.is_empty() && first.conflicts.is_empty());
        // Stored as the engine holds them, so a restart keeps them.
        assert_eq!(stored(&scope).len(), 3);
        // Allocation skips them.
        assert_eq!(
            allocate(&mut scope, Target::Next(Family::V4), "a").to_string(),
            "10.88.0.4"
        );

        let again = reserve_in(&mut scope, &node);
        assert!(
            again.added.is_empty() && again.removed.is_empty(),
            "{again:?}"
        );
        assert_eq!(again.excluded, first.excluded);
        assert_eq!(stored(&scope).len(), 3);

        let without_route = host(&["eth0 10.88.0.1/32"], &["10.88.0.2/31 dev eth0"]);
        let after = reserve_in(&mut scope, &without_route);
        assert_eq!(networks(&after.removed), ["10.88.0.8/29"]);
        assert_eq!(after.removed[0].reason, "local route 10.88.0.8/29 dev eth1");
        assert_eq!(networks(&after.excluded), ["10.88.0.1/32", "10.88.0.2/31"]);
        assert!(!stored(&scope).iter().any(|e| e.0 == "10.88.0.8/29"));
        allocate(
            &mut scope,
            Target::Specific("10.88.0.9".parse().unwrap()),
            "b",
        );
    }

    #[test]
    fn an_operators_exclusion_is_never_touched() {
        let mut scope = scope();
        let pool = PoolName::default_pool();
        scope
            .engine
            .exclude(
                &pool,
                Exclusion::parse("10.88.0.8/29", "reserved for routers").unwrap(),
            )
            .unwrap();
        scope.config.pools[0]
            .exclusions
            .push(("10.88.0.8/29".into(), "reserved for routers".into()));
        let response = reserve_in(&mut scope, &host(&[], &["10.88.0.8/29 dev eth1"]));
        assert!(response.added.is_empty() && response.excluded.is_empty());
        let response = reserve_in(&mut scope, &host(&[], &[]));
        assert!(response.removed.is_empty());
        assert_eq!(
            scope.engine.exclusions(&pool).unwrap()[0].reason(),
            "reserved for routers"
        );
        assert_eq!(stored(&scope).len(), 1);
    }

    #[test]
    fn a_changed_reason_replaces_the_exclusion() {
        let mut scope = scope();
        reserve_in(&mut scope, &host(&[], &["10.88.0.8/29 dev eth1"]));
        let response = reserve_in(&mut scope, &host(&[], &["10.88.0.8/29 dev eth2"]));
        assert_eq!(
            response.added[0].reason,
            "local route 10.88.0.8/29 dev eth2"
        );
        assert!(response.removed.is_empty());
        assert_eq!(
            stored(&scope),
            [(
                "10.88.0.8/29".to_owned(),
                "local route 10.88.0.8/29 dev eth2".to_owned()
            )]
        );
    }

    #[test]
    fn an_allocated_address_is_reported_and_kept_never_excluded() {
        let mut scope = scope();
        let held = allocate(
            &mut scope,
            Target::Specific("10.88.0.20".parse().unwrap()),
            "pod-a",
        );
        let response = reserve_in(&mut scope, &host(&[], &["10.88.0.16/28 dev eth1"]));
        assert_eq!(
            networks(&response.excluded),
            [
                "10.88.0.16/30",
                "10.88.0.21/32",
                "10.88.0.22/31",
                "10.88.0.24/29"
            ]
        );
        assert_eq!(
            response.conflicts,
            [api::LocalRouteConflict {
                pool: "default".into(),
                address: held,
                owner: "pod-a".into(),
                reason: "local route 10.88.0.16/28 dev eth1".into(),
            }]
        );
        assert_eq!(scope.engine.lookup(held).unwrap().entry.owner, "pod-a");
        // Once released, the next reservation excludes the whole route.
        scope.engine.release(held, None, Timestamp::ZERO).unwrap();
        let response = reserve_in(&mut scope, &host(&[], &["10.88.0.16/28 dev eth1"]));
        assert_eq!(networks(&response.excluded), ["10.88.0.16/28"]);
        assert_eq!(response.removed.len(), 4);
        assert!(response.conflicts.is_empty());
    }

    #[test]
    fn only_the_node_scope_takes_local_route_exclusions() {
        let mut scope = scope();
        let error = reserve(
            "podnet",
            &mut scope.engine,
            &mut scope.config,
            &host(&[], &[]),
        )
        .unwrap_err();
        assert_eq!(error.code, ErrorCode::BadRequest);
        assert!(error.message.contains("\"podnet\""), "{}", error.message);
    }
}
