//! Cloud pools of the node scope: the interface-backed pools whose interfaces and
//! addresses follow the cluster's `interfaces/<node>/` records, which the operator writes once the
//! cloud confirmed them.
//!
//! - [`Op::SetCloudInterfaces`](super::Op::SetCloudInterfaces): makes the interface tables of
//!   the cloud pools match the records, in one commit: an attached interface exists locally
//!   with exactly its record's addresses (less those surrendered in a release handshake); an
//!   address gone from its record (or an interface whose record is gone) leaves at once if
//!   free, else stays *frozen* (an engine exclusion: nothing new is handed out from it) and is
//!   reported until it is free. Every conflict (a device number or MAC taken, a pool with plain
//!   ranges, an address another pool holds) is reported and skipped; nothing else changes for
//!   it.
//! - [`Op::SurrenderCloudAddress`](super::Op::SurrenderCloudAddress): the release handshake of
//!   one address or prefix: in one commit, if nothing is allocated in it and nothing cooling,
//!   it leaves its interface and is recorded as *surrendered* (an engine exclusion too, so it
//!   is never handed out, nor added back by the records, while the handshake lasts); a refusal
//!   changes nothing.
//! - [`Op::CloudReport`](super::Op::CloudReport): counts and addresses, read only, for the
//!   demand and the handshakes.
//!
//! Both markers live in the pool's stored exclusions (reasons [`SURRENDERED_REASON`] and
//! [`FROZEN_REASON`]), so they are durable in the same commit as the change they go with and
//! come back with the engine after a restart.

use std::collections::{BTreeMap, BTreeSet};

use corral_api as api;
use corral_core::{
    AllocError, Exclusion, Family, InterfaceError, InterfaceId, InterfaceSpec, Interfaces, IpNet,
    PoolName, Timestamp,
};
use corral_store::Store;

use super::interfaces::{has_plain_ranges, store_table};
use super::op::{
    CloudAddress, CloudInterface, CloudInterfaces, CloudOutcome, CloudReport, CloudSurrender,
    FROZEN_REASON, SURRENDERED_REASON,
};
use super::scope::{Changes, Scope, ensure_spec, spec_mut};
use super::state::{Clock, NodeState};
use crate::error::OpError;

/// The stored exclusions of `pool`, as (network, reason).
fn exclusions<'a>(
    scope: &'a Scope,
    pool: &'a PoolName,
) -> impl Iterator<Item = &'a (String, String)> {
    scope
        .config
        .pools
        .iter()
        .filter(move |p| p.name == pool.as_str())
        .flat_map(|p| &p.exclusions)
}

fn marked(scope: &Scope, pool: &PoolName, reason: &str) -> BTreeSet<IpNet> {
    exclusions(scope, pool)
        .filter(|(_, r)| r == reason)
        .filter_map(|(net, _)| corral_core::parse_net(net).ok())
        .collect()
}

/// The reason of an exclusion someone else made on exactly `net` (the engine keeps one
/// exclusion per network, so a cloud marker there would take it over, and drop it when it
/// ends).
fn foreign_exclusion(scope: &Scope, pool: &PoolName, net: IpNet) -> Option<String> {
    exclusions(scope, pool)
        .find(|(n, r)| {
            r != SURRENDERED_REASON
                && r != FROZEN_REASON
                && corral_core::parse_net(n).is_ok_and(|n| n == net)
        })
        .map(|(_, r)| r.clone())
}

/// An exclusion an operator makes may not carry a cloud marker's reason: the cluster link
/// would take it for its own.
pub(super) fn reject_cloud_reason(reason: &str) -> Result<(), OpError> {
    if reason == SURRENDERED_REASON || reason == FROZEN_REASON {
        return Err(OpError::bad_request(format!(
            "exclusion reason {reason:?} is kept for the cluster link's cloud pools; choose another"
        )));
    }
    Ok(())
}

/// A cloud marker is not removed through the API, nor replaced by an exclusion of the same
/// network (which would end it): a surrendered address may be released by
/// the cluster any moment, and a frozen one is no longer the node's in the cloud.
pub(super) fn refuse_marker_removal(
    scope: &Scope,
    pool: &PoolName,
    network: IpNet,
) -> Result<(), OpError> {
    for reason in [SURRENDERED_REASON, FROZEN_REASON] {
        if marked(scope, pool, reason).contains(&network) {
            return Err(OpError::new(
                corral_api::ErrorCode::Conflict,
                format!(
                    "{network} of pool {pool} is excluded by the cluster link ({reason}); it \
                     leaves with its handshake or once free"
                ),
            ));
        }
    }
    Ok(())
}

/// Adds a marker exclusion (engine and stored configuration).
fn mark(scope: &mut Scope, pool: &PoolName, net: IpNet, reason: &str) -> Result<(), OpError> {
    let exclusion =
        Exclusion::new(net, reason).map_err(|e| OpError::bad_request(format!("{net}: {e}")))?;
    if !scope.engine.pool_names().contains(pool) {
        scope.engine.add_pool(pool, Default::default())?;
    }
    scope.engine.exclude(pool, exclusion)?;
    let stored = ensure_spec(scope, pool)?;
    let text = net.to_string();
    match stored.exclusions.iter_mut().find(|e| e.0 == text) {
        Some(existing) => existing.1 = reason.to_owned(),
        None => stored.exclusions.push((text, reason.to_owned())),
    }
    Ok(())
}

/// Drops a marker exclusion (engine and stored configuration), if it is one with `reason`.
fn unmark(scope: &mut Scope, pool: &PoolName, net: IpNet, reason: &str) -> Result<(), OpError> {
    let text = net.to_string();
    let Some(stored) = spec_mut(scope, pool) else {
        return Ok(());
    };
    if !stored
        .exclusions
        .iter()
        .any(|(n, r)| *n == text && r == reason)
    {
        return Ok(());
    }
    stored.exclusions.retain(|(n, _)| *n != text);
    match scope.engine.remove_exclusion(pool, net) {
        Ok(()) | Err(AllocError::UnknownExclusion { .. } | AllocError::UnknownPool { .. }) => {
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// The interface `id` in any interface table of the scope: its pool and spec.
fn find_interface<'a>(
    scope: &'a Scope,
    id: &InterfaceId,
) -> Option<(&'a PoolName, &'a InterfaceSpec)> {
    scope
        .interfaces
        .iter()
        .find_map(|(pool, table)| table.get(id).map(|spec| (pool, spec)))
}

impl<S: Store, C: Clock> NodeState<S, C> {
    pub(super) fn set_cloud_interfaces(
        &mut self,
        wanted: CloudInterfaces,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<CloudOutcome, OpError> {
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        scope.engine.advance(now);
        let mut outcome = CloudOutcome::default();
        let mut changed_pools: BTreeSet<PoolName> = BTreeSet::new();
        // Surrendered markers whose handshake ended: the address may be served again.
        for pool in &wanted.pools {
            for net in marked(scope, pool, SURRENDERED_REASON) {
                if !wanted.keep_surrendered.contains(&(pool.clone(), net)) {
                    unmark(scope, pool, net, SURRENDERED_REASON)?;
                    outcome.reclaimed.push((pool.clone(), net));
                    changed_pools.insert(pool.clone());
                }
            }
        }
        let mut listed: BTreeSet<InterfaceId> = BTreeSet::new();
        for interface in &wanted.interfaces {
            listed.insert(interface.id.clone());
            let pool = &interface.pool;
            if !wanted.pools.contains(pool) {
                outcome.problems.push(format!(
                    "interface {}: pool {pool} is not a cloud pool of the cluster configuration",
                    interface.id
                ));
                continue;
            }
            match find_interface(scope, &interface.id) {
                Some((other, _)) if other != pool => {
                    outcome.problems.push(format!(
                        "interface {} is in pool {other} on the node, its record says pool {pool}",
                        interface.id
                    ));
                    continue;
                }
                Some((_, spec))
                    if spec.device_number != interface.device_number
                        || spec.mac != interface.mac =>
                {
                    outcome.problems.push(format!(
                        "interface {} is device {} with MAC {} on the node, its record says \
                         device {} with MAC {}: left as it is",
                        interface.id,
                        spec.device_number,
                        spec.mac,
                        interface.device_number,
                        interface.mac
                    ));
                    continue;
                }
                Some(_) => {}
                None => {
                    if let Err(problem) = add_cloud_interface(scope, interface, now) {
                        outcome.problems.push(problem);
                        continue;
                    }
                    outcome.added.push(interface.id.to_string());
                    changed_pools.insert(pool.clone());
                }
            }
            let surrendered = marked(scope, pool, SURRENDERED_REASON);
            let frozen = marked(scope, pool, FROZEN_REASON);
            let desired: BTreeSet<IpNet> = interface
                .addresses
                .iter()
                .copied()
                .filter(|a| !surrendered.contains(a))
                .collect();
            let current: BTreeSet<IpNet> = scope
                .interfaces
                .get(pool)
                .and_then(|t| t.addresses(&interface.id))
                .map(|a| a.iter().copied().collect())
                .unwrap_or_default();
            for address in desired.difference(&current) {
                let Some(table) = scope.interfaces.get_mut(pool) else {
                    continue;
                };
                match table.add_address(&mut scope.engine, &interface.id, *address, now) {
                    Ok(()) => {
                        outcome.added.push(format!("{} {address}", interface.id));
                        changed_pools.insert(pool.clone());
                    }
                    Err(error) => outcome.problems.push(format!(
                        "address {address} of interface {} (pool {pool}) not served: {error}",
                        interface.id
                    )),
                }
            }
            for address in desired.intersection(&current) {
                if frozen.contains(address) {
                    // Back on the record: served again.
                    unmark(scope, pool, *address, FROZEN_REASON)?;
                    changed_pools.insert(pool.clone());
                }
            }
            for address in current.difference(&desired) {
                if surrendered.contains(address) {
                    continue;
                }
                if retire(scope, pool, &interface.id, *address, now, &mut outcome)? {
                    changed_pools.insert(pool.clone());
                }
            }
        }
        // Interfaces of the cloud pools without an attached record.
        for pool in &wanted.pools {
            let orphans: Vec<(InterfaceId, Vec<IpNet>)> = scope
                .interfaces
                .get(pool)
                .map(|table| {
                    table
                        .interfaces()
                        .filter(|(spec, _)| {
                            !listed.contains(&spec.id) && !wanted.untouched.contains(&spec.id)
                        })
                        .map(|(spec, addresses)| (spec.id.clone(), addresses.to_vec()))
                        .collect()
                })
                .unwrap_or_default();
            for (id, addresses) in orphans {
                for address in addresses {
                    if retire(scope, pool, &id, address, now, &mut outcome)? {
                        changed_pools.insert(pool.clone());
                    }
                }
                let Some(table) = scope.interfaces.get_mut(pool) else {
                    continue;
                };
                if table.addresses(&id).is_some_and(<[IpNet]>::is_empty) {
                    // No address left, so nothing allocated: the primary goes too.
                    match table.remove_interface(&mut scope.engine, &id, true, now) {
                        Ok(_) => {
                            outcome.removed.push(id.to_string());
                            changed_pools.insert(pool.clone());
                        }
                        Err(error) => outcome
                            .problems
                            .push(format!("interface {id} (pool {pool}) not removed: {error}")),
                    }
                    if table.is_empty() {
                        scope.interfaces.remove(pool);
                    }
                } else {
                    outcome.problems.push(format!(
                        "interface {id} (pool {pool}) has no attached record but still holds \
                         addresses in use: frozen"
                    ));
                }
            }
        }
        for pool in &wanted.pools {
            for net in marked(scope, pool, FROZEN_REASON) {
                outcome.frozen.push((pool.clone(), net));
            }
        }
        for pool in &changed_pools {
            if scope.interfaces.contains_key(pool) || spec_mut(scope, pool).is_some() {
                store_table(scope, pool)?;
            }
        }
        if !changed_pools.is_empty() {
            changes.touched.insert(api::NODE_SCOPE.to_owned());
        }
        Ok(outcome)
    }

    pub(super) fn surrender_cloud_address(
        &mut self,
        pool: &PoolName,
        address: IpNet,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<CloudSurrender, OpError> {
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        scope.engine.advance(now);
        if marked(scope, pool, SURRENDERED_REASON).contains(&address) {
            return Ok(CloudSurrender::AlreadySurrendered);
        }
        if marked(scope, pool, FROZEN_REASON).contains(&address) {
            return Ok(CloudSurrender::Refused(format!(
                "{address} of pool {pool} is gone from its record and still in use"
            )));
        }
        if let Some(reason) = foreign_exclusion(scope, pool, address) {
            // Its marker would replace that exclusion, and drop it when the handshake ends.
            return Ok(CloudSurrender::Refused(format!(
                "{address} of pool {pool} is excluded on the node ({reason:?}); remove the \
                 exclusion to let it go"
            )));
        }
        let holder = scope
            .interfaces
            .get(pool)
            .and_then(|t| t.interface_of(address))
            .map(|spec| spec.id.clone());
        if let Some(id) = holder {
            let Some(table) = scope.interfaces.get_mut(pool) else {
                return Ok(CloudSurrender::Refused(format!(
                    "the agent does not hold {address} in pool {pool}"
                )));
            };
            // Unforced: in use or cooling is refused, and a refusal changes nothing.
            match table.remove_address(&mut scope.engine, &id, address, false, now) {
                Ok(_) => {}
                Err(error) => {
                    return Ok(CloudSurrender::Refused(format!(
                        "{address} of interface {id}: {error}"
                    )));
                }
            }
            store_table(scope, pool)?;
        } else if let Some(other) = scope
            .interfaces
            .get(pool)
            .and_then(|t| {
                t.interfaces()
                    .find(|(_, nets)| nets.iter().any(|n| overlaps(n, &address)))
            })
            .map(|(spec, _)| spec.id.clone())
        {
            return Ok(CloudSurrender::Refused(format!(
                "{address} overlaps another address of interface {other} in pool {pool}"
            )));
        }
        // Not held (any more): marked so the records do not bring it back while the
        // handshake lasts.
        mark(scope, pool, address, SURRENDERED_REASON)?;
        changes.touched.insert(api::NODE_SCOPE.to_owned());
        Ok(CloudSurrender::Surrendered)
    }

    pub(super) fn cloud_report(&self, now: Timestamp) -> Result<CloudReport, OpError> {
        let scope = self.scope(api::NODE_SCOPE)?;
        let mut report = CloudReport::default();
        let pools: BTreeSet<PoolName> = scope
            .config
            .pools
            .iter()
            .filter(|p| {
                p.is_interface_pool() || p.exclusions.iter().any(|(_, r)| r == SURRENDERED_REASON)
            })
            .filter_map(|p| PoolName::new(&p.name).ok())
            .collect();
        for pool in &pools {
            for family in [Family::V4, Family::V6] {
                if let Ok(stats) = scope.engine.stats(pool, family) {
                    report.stats.push((
                        pool.clone(),
                        family,
                        stats.used,
                        u64::try_from(stats.free).unwrap_or(u64::MAX),
                    ));
                }
            }
            let frozen = marked(scope, pool, FROZEN_REASON);
            report.surrendered.extend(
                marked(scope, pool, SURRENDERED_REASON)
                    .into_iter()
                    .map(|n| (pool.clone(), n)),
            );
            report
                .frozen
                .extend(frozen.iter().map(|n| (pool.clone(), *n)));
            let Some(table) = scope.interfaces.get(pool) else {
                continue;
            };
            let ranges = scope.engine.ranges(pool).unwrap_or_default();
            let allocated: BTreeMap<std::net::IpAddr, u64> = ranges
                .iter()
                .map(|r| (r.spec.start(), r.n_allocated))
                .collect();
            for (spec, addresses) in table.interfaces() {
                let freeable: BTreeSet<IpNet> = table
                    .freeable(&scope.engine, &spec.id, now)
                    .map(|f| f.into_iter().collect())
                    .unwrap_or_default();
                for address in addresses {
                    // An interface address is one range starting at its network address.
                    let start = address.network();
                    report.addresses.push(CloudAddress {
                        pool: pool.clone(),
                        interface: spec.id.clone(),
                        address: *address,
                        n_allocated: allocated.get(&start).copied().unwrap_or(0),
                        free: freeable.contains(address) && !frozen.contains(address),
                        frozen: frozen.contains(address),
                    });
                }
            }
        }
        Ok(report)
    }
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Adds an interface of a record (no addresses yet); a refusal is the problem's sentence.
fn add_cloud_interface(
    scope: &mut Scope,
    interface: &CloudInterface,
    now: Timestamp,
) -> Result<(), String> {
    let pool = &interface.pool;
    if has_plain_ranges(scope, pool) {
        return Err(format!(
            "interface {}: pool {pool} has plain ranges on the node; a cloud pool's addresses \
             come from its interfaces only",
            interface.id
        ));
    }
    if let Some((other, spec)) = scope.interfaces.iter().find_map(|(name, table)| {
        table
            .interfaces()
            .find(|(s, _)| s.device_number == interface.device_number || s.mac == interface.mac)
            .map(|(s, _)| (name.clone(), s.clone()))
    }) {
        return Err(format!(
            "interface {}: device {} / MAC {} conflicts with interface {} (device {}, MAC {}) of \
             pool {other}",
            interface.id,
            interface.device_number,
            interface.mac,
            spec.id,
            spec.device_number,
            spec.mac
        ));
    }
    let spec = InterfaceSpec {
        id: interface.id.clone(),
        device_number: interface.device_number,
        primary: interface.device_number == 0,
        trunk: false,
        excluded: false,
        subnets: interface.subnets.clone(),
        mac: interface.mac,
        gateways: Vec::new(),
        routes: interface.routes.clone(),
        primary_addresses: interface.primary_addresses.clone(),
        created_at: now,
    };
    let mut table = scope
        .interfaces
        .get(pool)
        .cloned()
        .unwrap_or_else(|| Interfaces::new(pool.clone()));
    table
        .add_interface(spec)
        .map_err(|e| format!("interface {}: {e}", interface.id))?;
    if !scope.engine.pool_names().contains(pool) {
        scope
            .engine
            .add_pool(pool, Default::default())
            .map_err(|e| format!("interface {}: {e}", interface.id))?;
    }
    scope.interfaces.insert(pool.clone(), table);
    Ok(())
}

/// An address no record lists (and not surrendered): removed if nothing is allocated in it
/// (a cooling one too), else frozen. Answers whether anything changed.
fn retire(
    scope: &mut Scope,
    pool: &PoolName,
    id: &InterfaceId,
    address: IpNet,
    now: Timestamp,
    outcome: &mut CloudOutcome,
) -> Result<bool, OpError> {
    let Some(table) = scope.interfaces.get_mut(pool) else {
        return Ok(false);
    };
    // Nothing allocated in it is enough: the cloud took it already, so a cooldown has nothing
    // left to protect here (it only kept the node from handing it to a new pod too soon).
    let result = match table.remove_address(&mut scope.engine, id, address, false, now) {
        Err(InterfaceError::AddressCooling { .. }) => {
            table.remove_address(&mut scope.engine, id, address, true, now)
        }
        other => other,
    };
    match result {
        Ok(_) => {
            unmark(scope, pool, address, FROZEN_REASON)?;
            outcome.removed.push(format!("{id} {address}"));
            Ok(true)
        }
        Err(error @ InterfaceError::AddressInUse { .. })
            if foreign_exclusion(scope, pool, address).is_some() =>
        {
            // Excluded already, so nothing new is handed out from it; the marker would take
            // that exclusion over and drop it once the address leaves.
            outcome.frozen.push((pool.clone(), address));
            outcome.problems.push(format!(
                "address {address} of interface {id} (pool {pool}) is gone from the cloud record \
                 but still in use ({error}): excluded on the node already, it leaves once free"
            ));
            Ok(false)
        }
        Err(error @ InterfaceError::AddressInUse { .. }) => {
            let newly = !marked(scope, pool, FROZEN_REASON).contains(&address);
            if newly {
                mark(scope, pool, address, FROZEN_REASON)?;
            }
            outcome.problems.push(format!(
                "address {address} of interface {id} (pool {pool}) is gone from the cloud record \
                 but still in use ({error}): frozen, nothing new is handed out from it"
            ));
            Ok(newly)
        }
        Err(error) => {
            outcome.problems.push(format!(
                "address {address} of interface {id} (pool {pool}) not removed: {error}"
            ));
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use corral_store::{ScopeConfig, SqliteStore};

    use super::super::Op;
    use super::*;
    use crate::node::Reply;

    fn pool() -> PoolName {
        PoolName::new("vpc").unwrap()
    }

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    fn wanted(addresses: &[&str], keep: &[&str]) -> Op {
        Op::SetCloudInterfaces(CloudInterfaces {
            pools: [pool()].into(),
            interfaces: vec![CloudInterface {
                pool: pool(),
                id: InterfaceId::new("eni-a").unwrap(),
                device_number: 1,
                subnets: vec![net("10.0.1.0/24")],
                mac: "02:00:00:00:00:01".parse().unwrap(),
                routes: vec![net("10.0.0.0/16")],
                addresses: addresses.iter().map(|a| net(a)).collect(),
                primary_addresses: vec![],
            }],
            untouched: BTreeSet::new(),
            keep_surrendered: keep.iter().map(|a| (pool(), net(a))).collect(),
        })
    }

    fn run<S: Store, C: Clock>(node: &mut NodeState<S, C>, op: Op) -> Reply {
        node.run_batch(vec![op]).remove(0).unwrap()
    }

    fn outcome<S: Store, C: Clock>(node: &mut NodeState<S, C>, op: Op) -> CloudOutcome {
        match run(node, op) {
            Reply::CloudInterfaces(outcome) => outcome,
            other => panic!("{other:?}"),
        }
    }

    fn report<S: Store, C: Clock>(node: &mut NodeState<S, C>) -> CloudReport {
        match run(node, Op::CloudReport) {
            Reply::Cloud(report) => report,
            other => panic!("{other:?}"),
        }
    }

    fn held<S: Store, C: Clock>(node: &mut NodeState<S, C>) -> Vec<String> {
        report(node)
            .addresses
            .iter()
            .map(|a| a.address.to_string())
            .collect()
    }

    fn surrender(address: &str) -> Op {
        Op::SurrenderCloudAddress {
            pool: pool(),
            address: net(address),
        }
    }

    fn allocate(owner: &str) -> Op {
        Op::Allocate(
            api::AllocateRequest {
                scope: api::NODE_SCOPE.into(),
                pool: "vpc".into(),
                owner: owner.into(),
                key: None,
                family: None,
                address: None,
                lease_ms: None,
            }
            .try_into()
            .unwrap(),
        )
    }

    #[test]
    fn records_surrenders_and_frozen_addresses_are_durable_and_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let open = || SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(open(), &ScopeConfig::default()).unwrap();
        let first = outcome(&mut node, wanted(&["10.0.1.10/32", "10.0.1.11/32"], &[]));
        assert_eq!(first.added.len(), 3, "{first:?}");
        // The same records again: nothing changes.
        assert!(!outcome(&mut node, wanted(&["10.0.1.10/32", "10.0.1.11/32"], &[])).changed());
        let used = match run(&mut node, allocate("pod")) {
            Reply::Allocated(got) => got.allocations[0].address.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(used, "10.0.1.10");
        // In use: refused, nothing changed. Free: surrendered, then already surrendered.
        assert!(matches!(
            run(&mut node, surrender("10.0.1.10/32")),
            Reply::Surrender(CloudSurrender::Refused(_))
        ));
        assert!(matches!(
            run(&mut node, surrender("10.0.1.11/32")),
            Reply::Surrender(CloudSurrender::Surrendered)
        ));
        assert!(matches!(
            run(&mut node, surrender("10.0.1.11/32")),
            Reply::Surrender(CloudSurrender::AlreadySurrendered)
        ));
        assert_eq!(held(&mut node), ["10.0.1.10/32"]);
        // The marker is the link's: the API neither removes it nor makes one.
        let exclusion = |network: &str, reason: &str| api::ExclusionRequest {
            scope: api::NODE_SCOPE.into(),
            pool: "vpc".into(),
            network: network.into(),
            reason: reason.into(),
        };
        let refused = node
            .run_batch(vec![Op::RemoveExclusion(
                exclusion("10.0.1.11/32", "").try_into().unwrap(),
            )])
            .remove(0)
            .unwrap_err();
        assert_eq!(refused.code, api::ErrorCode::Conflict, "{refused:?}");
        let refused = node
            .run_batch(vec![Op::AddExclusion(
                exclusion("10.0.1.99/32", SURRENDERED_REASON)
                    .try_into()
                    .unwrap(),
            )])
            .remove(0)
            .unwrap_err();
        assert_eq!(refused.code, api::ErrorCode::BadRequest, "{refused:?}");
        // Kept out while its handshake lasts, across a restart.
        drop(node);
        let mut node = NodeState::restore(open(), &ScopeConfig::default()).unwrap();
        let again = outcome(
            &mut node,
            wanted(&["10.0.1.10/32", "10.0.1.11/32"], &["10.0.1.11/32"]),
        );
        assert!(!again.changed(), "{again:?}");
        assert_eq!(held(&mut node), ["10.0.1.10/32"]);
        assert_eq!(
            report(&mut node).surrendered,
            [(pool(), net("10.0.1.11/32"))]
        );
        // The record drops the address in use: frozen, durably; nothing new from it.
        let frozen = outcome(&mut node, wanted(&[], &["10.0.1.11/32"]));
        assert_eq!(frozen.frozen, [(pool(), net("10.0.1.10/32"))]);
        drop(node);
        let mut node = NodeState::restore(open(), &ScopeConfig::default()).unwrap();
        assert_eq!(report(&mut node).frozen, [(pool(), net("10.0.1.10/32"))]);
        assert!(node.run_batch(vec![allocate("other")]).remove(0).is_err());
        // Back on the record (and the handshake over): both served again.
        let back = outcome(&mut node, wanted(&["10.0.1.10/32", "10.0.1.11/32"], &[]));
        assert!(
            back.frozen.is_empty() && back.reclaimed.len() == 1,
            "{back:?}"
        );
        assert_eq!(held(&mut node), ["10.0.1.10/32", "10.0.1.11/32"]);
        match run(&mut node, allocate("other")) {
            Reply::Allocated(got) => {
                assert_eq!(got.allocations[0].address.to_string(), "10.0.1.11")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_operators_exclusion_is_neither_taken_over_nor_dropped_by_a_cloud_marker() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        outcome(&mut node, wanted(&["10.0.1.10/32", "10.0.1.11/32"], &[]));
        let exclude = |network: &str| {
            Op::AddExclusion(
                api::ExclusionRequest {
                    scope: api::NODE_SCOPE.into(),
                    pool: "vpc".into(),
                    network: network.into(),
                    reason: "broken NIC queue".into(),
                }
                .try_into()
                .unwrap(),
            )
        };
        run(&mut node, exclude("10.0.1.11/32"));
        // Surrendering the excluded address would take the operator's exclusion over (one
        // exclusion per network) and drop it when the handshake ends: refused instead.
        assert!(matches!(
            run(&mut node, surrender("10.0.1.11/32")),
            Reply::Surrender(CloudSurrender::Refused(_))
        ));
        let used = match run(&mut node, allocate("pod")) {
            Reply::Allocated(got) => got.allocations[0].address.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(used, "10.0.1.10");
        // Freezing an excluded address in use keeps the operator's reason, and the address
        // leaving the record drops neither it nor the exclusion while in use.
        run(&mut node, exclude("10.0.1.10/32"));
        let frozen = outcome(&mut node, wanted(&["10.0.1.11/32"], &[]));
        assert_eq!(frozen.frozen, [(pool(), net("10.0.1.10/32"))], "{frozen:?}");
        // Back on the record: the operator's exclusions are still there.
        outcome(&mut node, wanted(&["10.0.1.10/32", "10.0.1.11/32"], &[]));
        let mut reasons: Vec<(String, String)> =
            match run(&mut node, Op::Pools(Some(api::NODE_SCOPE.into()))) {
                Reply::Pools(pools) => pools
                    .pools
                    .iter()
                    .flat_map(|p| &p.exclusions)
                    .map(|e| (e.network.clone(), e.reason.clone()))
                    .collect(),
                other => panic!("{other:?}"),
            };
        reasons.sort();
        assert_eq!(
            reasons,
            [
                ("10.0.1.10/32".to_owned(), "broken NIC queue".to_owned()),
                ("10.0.1.11/32".to_owned(), "broken NIC queue".to_owned())
            ]
        );
        assert!(node.run_batch(vec![allocate("other")]).remove(0).is_err());
    }

    #[test]
    fn an_exclusion_made_over_a_cloud_marker_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        outcome(&mut node, wanted(&["10.0.1.10/32", "10.0.1.11/32"], &[]));
        run(&mut node, allocate("pod"));
        run(&mut node, surrender("10.0.1.11/32"));
        outcome(&mut node, wanted(&["10.0.1.11/32"], &["10.0.1.11/32"]));
        // Replacing either marker's reason would end it: the surrendered address served again
        // from its (stale) record, the frozen one handed out once the exclusion is removed.
        for network in ["10.0.1.11/32", "10.0.1.10/32"] {
            let refused = node
                .run_batch(vec![Op::AddExclusion(
                    api::ExclusionRequest {
                        scope: api::NODE_SCOPE.into(),
                        pool: "vpc".into(),
                        network: network.into(),
                        reason: "maintenance".into(),
                    }
                    .try_into()
                    .unwrap(),
                )])
                .remove(0)
                .unwrap_err();
            assert_eq!(refused.code, api::ErrorCode::Conflict, "{refused:?}");
        }
        let after = report(&mut node);
        assert_eq!(after.surrendered, [(pool(), net("10.0.1.11/32"))]);
        assert_eq!(after.frozen, [(pool(), net("10.0.1.10/32"))]);
        let again = outcome(&mut node, wanted(&["10.0.1.11/32"], &["10.0.1.11/32"]));
        assert!(!again.changed(), "{again:?}");
        assert_eq!(held(&mut node), ["10.0.1.10/32"]);
    }

    #[test]
    fn conflicts_are_reported_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_owned(dir.path(), Path::new("/x.sock")).unwrap();
        let mut node = NodeState::restore(store, &ScopeConfig::default()).unwrap();
        outcome(&mut node, wanted(&["10.0.1.10/32"], &[]));
        // Another interface at the same device number: reported, not added.
        let mut other = match wanted(&["10.0.1.20/32"], &[]) {
            Op::SetCloudInterfaces(w) => w,
            _ => unreachable!(),
        };
        other.interfaces[0].id = InterfaceId::new("eni-b").unwrap();
        other.interfaces[0].mac = "02:00:00:00:00:02".parse().unwrap();
        // eni-a stays untouched (its record attaching, say).
        other.untouched.insert(InterfaceId::new("eni-a").unwrap());
        let got = outcome(&mut node, Op::SetCloudInterfaces(other));
        assert!(!got.changed(), "{got:?}");
        assert!(got.problems[0].contains("device 1"), "{:?}", got.problems);
        assert_eq!(held(&mut node), ["10.0.1.10/32"]);
        // An address not held (its record not applied yet, say) is marked all the same, so
        // a record listing it later does not bring it in while the handshake lasts.
        assert!(matches!(
            run(&mut node, surrender("10.0.1.20/32")),
            Reply::Surrender(CloudSurrender::Surrendered)
        ));
        outcome(
            &mut node,
            wanted(&["10.0.1.10/32", "10.0.1.20/32"], &["10.0.1.20/32"]),
        );
        assert_eq!(held(&mut node), ["10.0.1.10/32"]);
    }
}
