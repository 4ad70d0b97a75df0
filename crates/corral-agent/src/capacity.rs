//! A scope's capacity as configured: how the configuration file and run-time changes combine,
//! and how the stored configuration follows what the engine does with ranges.
//!
//! The stored configuration of a scope is the one source of truth for its capacity. Each
//! range in it knows where it came from ([`RangeSource`]) and its state ([`RangeState`]):
//!
//! - a range added through the API stays until removed through the API;
//! - a range the configuration file declares is added at start unless the stored state
//!   already says something about the same addresses: removed at run time (a *tombstone*,
//!   [`RangeState::Removed`], so a restart never resurrects it), draining, or taken by a range
//!   added at run time that overlaps it (then the file's range is not applied, and the agent
//!   says so in its status warnings instead of refusing to start);
//! - a file range the file no longer declares drains and leaves (state `withdrawn`: declaring
//!   it again cancels the drain, and it leaves no tombstone), and its tombstone (if any) is
//!   forgotten;
//! - a removed range that still holds allocations is draining, across restarts, until its last
//!   allocation is released; adding it again exactly as it was cancels the drain;
//! - pool settings (cooldown, reuse) come from the file for the pools it declares;
//! - exclusions of the file are applied at every start (an exclusion only ever holds addresses
//!   back, so applying one again is safe); one removed at run time comes back at the next start
//!   while the file declares it;
//! - a range the cluster granted (source `cluster`) is treated like one added through the API:
//!   the file never drops, reclassifies or overrides it (a file range over it is not applied
//!   and is reported), and only the next set of grants removes it ([`cluster_removals`],
//!   [`check_grant`]); a granted range over a range of another source is not applied and is
//!   reported, never the reverse.
//!
//! Everything here is pure: configurations in, configuration (and warnings) out.

use corral_core::{DrainedRange, RangeSpec};
use corral_store::{PoolSpec, RangeEntry, RangeSource, RangeState, ScopeConfig};

/// Whether the file declares a range of `pool` with the same addresses as `spec`.
fn declared_at(declared: &ScopeConfig, pool: &str, spec: &RangeSpec) -> bool {
    declared
        .pools
        .iter()
        .find(|p| p.name == pool)
        .is_some_and(|p| p.entry_at(spec).is_some())
}

/// Whether two ranges share an address (the engine's rule for refusing a range).
fn overlaps(a: &RangeSpec, b: &RangeSpec) -> bool {
    a.family() == b.family() && a.start() <= b.end() && b.start() <= a.end()
}

/// A range in the engine (active or draining) of any pool that shares an address with `spec`.
fn overlapping<'a>(config: &'a ScopeConfig, spec: &RangeSpec) -> Option<(&'a str, &'a str)> {
    config.pools.iter().find_map(|pool| {
        pool.ranges
            .iter()
            .filter(|entry| entry.in_engine())
            .find(|entry| entry.spec().is_some_and(|other| overlaps(&other, spec)))
            .map(|entry| (pool.name.as_str(), entry.range.as_str()))
    })
}

/// Builds before ranges had a source wrote every range bare, which reads as a CNI network's;
/// in the agent's own scope such a range came from the file (if the file declares it) or the
/// API.
pub fn classify_bare(config: &mut ScopeConfig, declared: &ScopeConfig) {
    for pool in &mut config.pools {
        for entry in &mut pool.ranges {
            if entry.source == RangeSource::Cni {
                let in_file = entry
                    .spec()
                    .is_some_and(|spec| declared_at(declared, &pool.name, &spec));
                entry.source = if in_file {
                    RangeSource::File
                } else {
                    RangeSource::Api
                };
            }
        }
    }
}

/// Ranges imported into the agent's own scope come from the file only if this agent's file
/// declares them; any other is the API's (a checkpoint's `file` names another agent's file).
pub fn classify_imported(config: &mut ScopeConfig, declared: &ScopeConfig) {
    classify_bare(config, declared);
    for pool in &mut config.pools {
        for entry in &mut pool.ranges {
            let in_file = entry
                .spec()
                .is_some_and(|spec| declared_at(declared, &pool.name, &spec));
            if in_file {
                entry.source = RangeSource::File;
            } else if entry.source == RangeSource::File {
                entry.source = RangeSource::Api;
                if entry.state == RangeState::Withdrawn {
                    entry.state = RangeState::Draining;
                }
            }
        }
        // A tombstone means nothing to an agent whose file does not declare the range.
        pool.ranges
            .retain(|e| e.state != RangeState::Removed || e.source == RangeSource::File);
    }
}

/// The configuration of the agent's own scope at start: what is stored, combined with what
/// the configuration file declares, by the rules of the module documentation. Also returns
/// what could not be applied, one sentence each.
pub fn merge_declared(stored: &ScopeConfig, declared: &ScopeConfig) -> (ScopeConfig, Vec<String>) {
    let mut out = stored.clone();
    let mut warnings = Vec::new();
    classify_bare(&mut out, declared);
    for pool in &mut out.pools {
        let name = pool.name.clone();
        // File ranges the file no longer declares: forget tombstones, drain the rest.
        pool.ranges.retain_mut(|entry| {
            if entry.source != RangeSource::File
                || entry
                    .spec()
                    .is_some_and(|spec| declared_at(declared, &name, &spec))
            {
                return true;
            }
            match entry.state {
                RangeState::Removed => false,
                RangeState::Active | RangeState::Draining | RangeState::Withdrawn => {
                    entry.state = RangeState::Withdrawn;
                    true
                }
            }
        });
    }
    for declared_pool in &declared.pools {
        let index = match out.pools.iter().position(|p| p.name == declared_pool.name) {
            Some(index) => {
                out.pools[index].cooldown_ms = declared_pool.cooldown_ms;
                out.pools[index].lowest_free = declared_pool.lowest_free;
                index
            }
            None => {
                out.pools.push(PoolSpec {
                    ranges: Vec::new(),
                    exclusions: Vec::new(),
                    ..declared_pool.clone()
                });
                out.pools.len() - 1
            }
        };
        for declared_range in &declared_pool.ranges {
            let Some(spec) = declared_range.spec() else {
                warnings.push(format!(
                    "range {:?} of pool {} in the configuration file is not a range; it is not applied",
                    declared_range.range, declared_pool.name
                ));
                continue;
            };
            if out.pools[index].is_interface_pool() {
                // Its ranges are its interfaces' addresses (the agent would not start).
                warnings.push(format!(
                    "range {spec} of pool {} in the configuration file is in a pool backed by \
                     the node's interfaces, which holds only their addresses; it is not applied",
                    declared_pool.name
                ));
                continue;
            }
            if let Some(i) = out.pools[index].entry_at(&spec) {
                let entry = &mut out.pools[index].ranges[i];
                if entry.source == RangeSource::Cluster {
                    // The cluster's grant: the file neither takes it over nor changes it.
                    warnings.push(format!(
                        "range {spec} of pool {} in the configuration file is granted by the \
                         cluster as {}; the file's range is not applied",
                        declared_pool.name, entry.range
                    ));
                    continue;
                }
                entry.source = RangeSource::File;
                if entry.state == RangeState::Withdrawn {
                    // Declared again: the drain the file caused is cancelled.
                    entry.state = RangeState::Active;
                }
                if entry.state != RangeState::Removed && entry.range != spec.to_string() {
                    warnings.push(format!(
                        "range {spec} of pool {} in the configuration file is kept as {} (its \
                         state at run time); remove it and add it again to change it",
                        declared_pool.name, entry.range
                    ));
                }
                continue;
            }
            if let Some((other_pool, other_range)) = overlapping(&out, &spec) {
                warnings.push(format!(
                    "range {spec} of pool {} in the configuration file overlaps range \
                     {other_range} of pool {other_pool}; it is not applied",
                    declared_pool.name
                ));
                continue;
            }
            out.pools[index]
                .ranges
                .push(RangeEntry::new(&spec, RangeSource::File));
        }
        for exclusion in &declared_pool.exclusions {
            let exclusions = &mut out.pools[index].exclusions;
            match exclusions.iter_mut().find(|e| e.0 == exclusion.0) {
                Some(existing) => existing.1.clone_from(&exclusion.1),
                None => exclusions.push(exclusion.clone()),
            }
        }
    }
    (out, warnings)
}

/// Ranges of the file that could not be applied at start because a range of another pool was
/// in the way (the file moved a range between pools while it held allocations) and that fit
/// now: `(pool, range)`, to be added to the engine and the configuration as the file's.
pub fn now_applicable(config: &ScopeConfig, declared: &ScopeConfig) -> Vec<(String, RangeSpec)> {
    let mut out = Vec::new();
    for declared_pool in &declared.pools {
        let interface_pool = config
            .pools
            .iter()
            .any(|p| p.name == declared_pool.name && p.is_interface_pool());
        if interface_pool {
            // Its ranges are its interfaces' addresses (see `merge_declared`).
            continue;
        }
        for declared_range in &declared_pool.ranges {
            let Some(spec) = declared_range.spec() else {
                continue;
            };
            let present = config
                .pools
                .iter()
                .find(|p| p.name == declared_pool.name)
                .is_some_and(|p| p.entry_at(&spec).is_some());
            if !present && overlapping(config, &spec).is_none() {
                out.push((declared_pool.name.clone(), spec));
            }
        }
    }
    out
}

/// The stored configuration after ranges left the engine (drained, or removed while they held
/// nothing): a file range the file still declares becomes a tombstone, any other is forgotten.
/// Returns whether anything changed.
pub fn forget_drained(
    config: &mut ScopeConfig,
    drained: &[DrainedRange],
    declared: Option<&ScopeConfig>,
) -> bool {
    let mut changed = false;
    for range in drained {
        let Some(pool) = config
            .pools
            .iter_mut()
            .find(|p| p.name == range.pool.as_str())
        else {
            continue;
        };
        let Some(index) = pool.entry_at(&range.spec) else {
            continue;
        };
        let entry = &mut pool.ranges[index];
        if entry.state == RangeState::Removed {
            continue;
        }
        let keep_tombstone = entry.source == RangeSource::File
            && entry.state != RangeState::Withdrawn
            && declared.is_some_and(|d| declared_at(d, &pool.name, &range.spec));
        if keep_tombstone {
            entry.state = RangeState::Removed;
        } else {
            pool.ranges.remove(index);
        }
        changed = true;
    }
    changed
}

/// The stored configuration after the engine accepted `spec` into `pool`: a new range from
/// the API, a drain cancelled, or a tombstone lifted.
pub fn note_added(pool: &mut PoolSpec, spec: &RangeSpec) {
    match pool.entry_at(spec) {
        Some(index) => {
            let entry = &mut pool.ranges[index];
            if entry.state == RangeState::Withdrawn {
                // The file let go of it; whoever adds it back now keeps it.
                entry.source = RangeSource::Api;
            }
            entry.state = RangeState::Active;
            entry.range = spec.to_string();
        }
        None => pool.ranges.push(RangeEntry::new(spec, RangeSource::Api)),
    }
}

/// The stored configuration after the engine started draining the range at `spec`'s
/// addresses (one it removed at once is reported by [`Engine::take_drained`] instead).
///
/// [`Engine::take_drained`]: corral_core::Engine::take_drained
pub fn note_draining(pool: &mut PoolSpec, spec: &RangeSpec) {
    if let Some(index) = pool.entry_at(spec) {
        let entry = &mut pool.ranges[index];
        // A range the file withdrew is draining already, for the file's reason.
        if entry.state != RangeState::Withdrawn {
            entry.state = RangeState::Draining;
        }
    }
}

/// Ranges of the cluster in the stored configuration that `granted` (the complete set the
/// cluster grants the node now) no longer names, as `(pool, range)`: each is to be removed (it
/// drains if it holds allocations). A range already draining stays as it is, and ranges of
/// other sources are never listed.
pub fn cluster_removals(
    config: &ScopeConfig,
    granted: &[(String, RangeSpec)],
) -> Vec<(String, RangeSpec)> {
    let is_granted = |pool: &str, spec: &RangeSpec| {
        granted
            .iter()
            .any(|(p, g)| p == pool && g.start() == spec.start() && g.end() == spec.end())
    };
    let mut out = Vec::new();
    for pool in &config.pools {
        for entry in &pool.ranges {
            if entry.source != RangeSource::Cluster || entry.state != RangeState::Active {
                continue;
            }
            if let Some(spec) = entry.spec()
                && !is_granted(&pool.name, &spec)
            {
                out.push((pool.name.clone(), spec));
            }
        }
    }
    out
}

/// What a range the cluster grants asks of the engine (see [`check_grant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Held already, exactly as granted: nothing to do.
    Held,
    /// Not in the pool: to be added.
    Add,
    /// Draining in the pool: adding it again cancels the drain.
    CancelDrain,
}

/// Whether the cluster's grant of `spec` to `pool` can be applied to the stored configuration
/// as it is, and how; a refusal is one sentence saying why (a range of another source over
/// the same addresses, or one that overlaps it: those are never touched).
pub fn check_grant(config: &ScopeConfig, pool: &str, spec: &RangeSpec) -> Result<Grant, String> {
    if let Some(held) = config.pools.iter().find(|p| p.name == pool)
        && let Some(index) = held.entry_at(spec)
    {
        let entry = &held.ranges[index];
        if entry.source != RangeSource::Cluster {
            return Err(format!(
                "range {spec} granted to pool {pool} by the cluster is range {} of source {} \
                 (state {}) in that pool already; it is not applied",
                entry.range,
                entry.source.as_str(),
                entry.state.as_str()
            ));
        }
        return match entry.state {
            // Surrendered in a release handshake: it stays out while the grant lasts.
            RangeState::Removed => Ok(Grant::Held),
            RangeState::Active if entry.range == spec.to_string() => Ok(Grant::Held),
            RangeState::Active => Err(format!(
                "range {spec} granted to pool {pool} by the cluster is held as {}; the change \
                 is not applied (a range changes only by being released and granted again)",
                entry.range
            )),
            RangeState::Draining | RangeState::Withdrawn => Ok(Grant::CancelDrain),
        };
    }
    if let Some((other_pool, other_range)) = overlapping(config, spec) {
        let source = config
            .pools
            .iter()
            .find(|p| p.name == other_pool)
            .and_then(|p| p.ranges.iter().find(|e| e.range == other_range))
            .map_or("unknown", |e| e.source.as_str());
        return Err(format!(
            "range {spec} granted to pool {pool} by the cluster overlaps {source} range \
             {other_range} of pool {other_pool}; it is not applied"
        ));
    }
    Ok(Grant::Add)
}

/// The stored configuration after the engine accepted the cluster's grant of `spec` into
/// `pool`: a new range of source `cluster`, or a drain cancelled.
pub fn note_granted(pool: &mut PoolSpec, spec: &RangeSpec) {
    match pool.entry_at(spec) {
        Some(index) => {
            let entry = &mut pool.ranges[index];
            entry.source = RangeSource::Cluster;
            entry.state = RangeState::Active;
            entry.range = spec.to_string();
        }
        None => pool
            .ranges
            .push(RangeEntry::new(spec, RangeSource::Cluster)),
    }
}

/// Whether a stored range is a block surrendered in a release handshake: a cluster range in
/// state `removed` (out of the engine; nothing is allocated from it while its grant lasts).
pub fn is_surrendered(entry: &RangeEntry) -> bool {
    entry.source == RangeSource::Cluster && entry.state == RangeState::Removed
}

/// A block surrendered in a release handshake (of any pool) that shares an address with
/// `spec`: nothing may put its addresses in use while the leader may release it.
pub fn surrendered_overlapping<'a>(
    config: &'a ScopeConfig,
    spec: &RangeSpec,
) -> Option<(&'a str, &'a str)> {
    config.pools.iter().find_map(|pool| {
        pool.ranges
            .iter()
            .filter(|entry| is_surrendered(entry))
            .find(|entry| entry.spec().is_some_and(|other| overlaps(&other, spec)))
            .map(|entry| (pool.name.as_str(), entry.range.as_str()))
    })
}

/// The stored configuration after the engine let go of the block at `spec` in a release
/// handshake: kept as surrendered until its grant goes (or the handshake is withdrawn).
pub fn note_surrendered(pool: &mut PoolSpec, spec: &RangeSpec) {
    match pool.entry_at(spec) {
        Some(index) => {
            let entry = &mut pool.ranges[index];
            entry.source = RangeSource::Cluster;
            entry.state = RangeState::Removed;
        }
        None => pool.ranges.push(RangeEntry {
            state: RangeState::Removed,
            ..RangeEntry::new(spec, RangeSource::Cluster)
        }),
    }
}

/// Forgets the surrendered blocks whose grant is gone (`granted`: the complete set the cluster
/// grants now); answers them as `(pool, range)`.
pub fn forget_surrendered(
    config: &mut ScopeConfig,
    granted: &[(String, RangeSpec)],
) -> Vec<(String, RangeSpec)> {
    let mut out = Vec::new();
    for pool in &mut config.pools {
        let name = pool.name.clone();
        pool.ranges.retain(|entry| {
            if !is_surrendered(entry) {
                return true;
            }
            let Some(spec) = entry.spec() else {
                return true;
            };
            let held = granted
                .iter()
                .any(|(p, g)| *p == name && g.start() == spec.start() && g.end() == spec.end());
            if !held {
                out.push((name.clone(), spec));
            }
            held
        });
    }
    out
}

/// Checks that a configuration's ranges in the engine do not overlap, naming the first two
/// that do; used to refuse an import before anything is written.
pub fn check_disjoint(config: &ScopeConfig) -> Result<(), String> {
    let mut seen: Vec<(&str, &str, RangeSpec)> = Vec::new();
    for pool in &config.pools {
        // One entry per set of addresses in a pool, whatever its state: a tombstone beside an
        // active range of the same addresses would make removal and restarts disagree.
        for (i, entry) in pool.ranges.iter().enumerate() {
            if let Some(spec) = entry.spec()
                && pool.entry_at(&spec) != Some(i)
            {
                return Err(format!(
                    "pool {} lists the addresses of range {} twice",
                    pool.name, entry.range
                ));
            }
        }
        // A block surrendered in a release handshake counts as held: the leader may release
        // it at any moment, so nothing else may put its addresses in use meanwhile.
        for entry in pool
            .ranges
            .iter()
            .filter(|e| e.in_engine() || is_surrendered(e))
        {
            let Some(spec) = entry.spec() else {
                return Err(format!(
                    "range {:?} of pool {} is not a range",
                    entry.range, pool.name
                ));
            };
            if let Some((other_pool, other_range, _)) =
                seen.iter().find(|(_, _, other)| overlaps(other, &spec))
            {
                return Err(format!(
                    "range {} of pool {} overlaps range {other_range} of pool {other_pool}",
                    entry.range, pool.name
                ));
            }
            seen.push((&pool.name, &entry.range, spec));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(range: &str, source: RangeSource, state: RangeState) -> RangeEntry {
        RangeEntry {
            range: range.into(),
            source,
            state,
        }
    }

    fn pool(name: &str, ranges: Vec<RangeEntry>) -> PoolSpec {
        PoolSpec {
            name: name.into(),
            cooldown_ms: 30_000,
            lowest_free: false,
            ranges,
            exclusions: Vec::new(),
            interfaces: Vec::new(),
            interface_backed: false,
        }
    }

    fn file(pools: Vec<PoolSpec>) -> ScopeConfig {
        ScopeConfig { pools }
    }

    use RangeSource::{Api, Cni, File};
    use RangeState::{Active, Draining, Removed, Withdrawn};

    #[test]
    fn a_first_start_takes_the_file_as_it_is() {
        let declared = file(vec![pool(
            "default",
            vec![entry("10.88.0.0/16", File, Active)],
        )]);
        let (merged, warnings) = merge_declared(&ScopeConfig::default(), &declared);
        assert_eq!(merged, declared);
        assert!(warnings.is_empty());
    }

    #[test]
    fn a_file_range_removed_at_run_time_stays_removed_and_another_pool_keeps_it() {
        let declared = file(vec![pool(
            "default",
            vec![entry("10.88.0.0/16", File, Active)],
        )]);
        let stored = file(vec![
            pool("default", vec![entry("10.88.0.0/16", File, Removed)]),
            pool("b", vec![entry("10.88.0.0/16", Api, Active)]),
        ]);
        let (merged, warnings) = merge_declared(&stored, &declared);
        assert_eq!(merged, stored);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn a_file_range_over_a_run_time_range_is_not_applied_and_said() {
        let declared = file(vec![pool(
            "default",
            vec![entry("10.88.0.0/16", File, Active)],
        )]);
        let stored = file(vec![pool("b", vec![entry("10.88.1.0/24", Api, Active)])]);
        let (merged, warnings) = merge_declared(&stored, &declared);
        assert_eq!(merged.pools[1].name, "default");
        assert!(merged.pools[1].ranges.is_empty());
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("overlaps range 10.88.1.0/24 of pool b"),
            "{warnings:?}"
        );
    }

    #[test]
    fn a_range_the_file_dropped_drains_and_its_tombstone_goes() {
        let declared = file(vec![pool("default", vec![])]);
        let stored = file(vec![pool(
            "default",
            vec![
                entry("10.88.0.0/16", File, Active),
                entry("10.89.0.0/16", File, Removed),
                entry("10.90.0.0/16", Api, Active),
            ],
        )]);
        let (merged, _) = merge_declared(&stored, &declared);
        assert_eq!(
            merged.pools[0].ranges,
            vec![
                entry("10.88.0.0/16", File, Withdrawn),
                entry("10.90.0.0/16", Api, Active),
            ]
        );
    }

    #[test]
    fn bare_ranges_of_older_builds_are_classified_by_the_file() {
        let declared = file(vec![pool(
            "default",
            vec![entry("10.88.0.0/16", File, Active)],
        )]);
        let stored = file(vec![pool(
            "default",
            vec![
                entry("10.88.0.0/16", Cni, Active),
                entry("10.90.0.0/16", Cni, Active),
            ],
        )]);
        let (merged, _) = merge_declared(&stored, &declared);
        assert_eq!(
            merged.pools[0].ranges,
            vec![
                entry("10.88.0.0/16", File, Active),
                entry("10.90.0.0/16", Api, Active),
            ]
        );
    }

    #[test]
    fn a_draining_file_range_stays_draining_and_the_files_settings_apply() {
        let mut declared_pool = pool("default", vec![entry("10.88.0.0/16", File, Active)]);
        declared_pool.cooldown_ms = 0;
        declared_pool.lowest_free = true;
        let declared = file(vec![declared_pool]);
        let stored = file(vec![pool(
            "default",
            vec![entry("10.88.0.0/16", File, Draining)],
        )]);
        let (merged, _) = merge_declared(&stored, &declared);
        assert_eq!(merged.pools[0].ranges[0].state, Draining);
        assert_eq!(merged.pools[0].cooldown_ms, 0);
        assert!(merged.pools[0].lowest_free);
    }

    #[test]
    fn drained_file_ranges_leave_tombstones_and_others_leave() {
        let declared = file(vec![pool("a", vec![entry("10.1.0.0/24", File, Active)])]);
        let mut config = file(vec![pool(
            "a",
            vec![
                entry("10.1.0.0/24", File, Draining),
                entry("10.2.0.0/24,gateway=10.2.0.1", Api, Draining),
            ],
        )]);
        let drained = [
            DrainedRange {
                pool: corral_core::PoolName::new("a").unwrap(),
                spec: "10.1.0.0/24".parse().unwrap(),
            },
            DrainedRange {
                pool: corral_core::PoolName::new("a").unwrap(),
                spec: "10.2.0.0/24,gateway=10.2.0.1".parse().unwrap(),
            },
        ];
        assert!(forget_drained(&mut config, &drained, Some(&declared)));
        assert_eq!(
            config.pools[0].ranges,
            vec![entry("10.1.0.0/24", File, Removed)]
        );
        assert!(!forget_drained(&mut config, &drained, Some(&declared)));
    }

    #[test]
    fn overlaps_are_named() {
        let config = file(vec![
            pool("a", vec![entry("10.1.0.0/24", Api, Active)]),
            pool(
                "b",
                vec![
                    entry("10.1.0.0/25", Api, Removed),
                    entry("10.1.0.128/25", Api, Draining),
                ],
            ),
        ]);
        assert_eq!(
            check_disjoint(&config),
            Err("range 10.1.0.128/25 of pool b overlaps range 10.1.0.0/24 of pool a".into())
        );
    }

    use RangeSource::Cluster;

    fn grants(list: &[(&str, &str)]) -> Vec<(String, RangeSpec)> {
        list.iter()
            .map(|(pool, range)| ((*pool).to_owned(), range.parse().unwrap()))
            .collect()
    }

    #[test]
    fn a_cluster_range_the_file_declares_too_stays_the_clusters() {
        let declared = file(vec![pool(
            "default",
            vec![entry("10.77.0.0/24", File, Active)],
        )]);
        let stored = file(vec![pool(
            "default",
            vec![entry("10.77.0.0/24", Cluster, Active)],
        )]);
        let (merged, warnings) = merge_declared(&stored, &declared);
        assert_eq!(merged, stored);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("granted by the cluster"),
            "{warnings:?}"
        );
    }

    #[test]
    fn a_file_without_the_cluster_ranges_keeps_them_and_a_file_range_over_one_is_not_applied() {
        let declared = file(vec![pool(
            "default",
            vec![entry("10.77.0.0/16", File, Active)],
        )]);
        let stored = file(vec![pool(
            "pods",
            vec![
                entry("10.77.1.0/24", Cluster, Active),
                entry("fd77::/120", Cluster, Draining),
            ],
        )]);
        let (merged, warnings) = merge_declared(&stored, &declared);
        assert_eq!(merged.pools[0], stored.pools[0]);
        assert!(merged.pools[1].ranges.is_empty());
        assert!(
            warnings[0].contains("overlaps range 10.77.1.0/24 of pool pods"),
            "{warnings:?}"
        );
    }

    #[test]
    fn only_active_cluster_ranges_no_longer_granted_are_removed() {
        let config = file(vec![pool(
            "default",
            vec![
                entry("10.77.0.0/24", Cluster, Active),
                entry("10.78.0.0/24", Cluster, Active),
                entry("10.79.0.0/24", Cluster, Draining),
                entry("10.80.0.0/24", Api, Active),
                entry("10.81.0.0/24", File, Active),
            ],
        )]);
        let removals = cluster_removals(&config, &grants(&[("default", "10.77.0.0/24")]));
        assert_eq!(removals, grants(&[("default", "10.78.0.0/24")]));
        // The same addresses in another pool are another grant.
        let removals = cluster_removals(&config, &grants(&[("other", "10.77.0.0/24")]));
        assert_eq!(
            removals,
            grants(&[("default", "10.77.0.0/24"), ("default", "10.78.0.0/24")])
        );
    }

    #[test]
    fn grants_are_held_added_undrained_or_refused() {
        let config = file(vec![
            pool(
                "default",
                vec![
                    entry("10.77.0.0/24", Cluster, Active),
                    entry("10.78.0.0/24", Cluster, Draining),
                    entry("10.80.0.0/24", Api, Active),
                    entry("10.81.0.0/24", File, Removed),
                ],
            ),
            pool("b", vec![entry("10.82.0.0/24", File, Active)]),
        ]);
        let check = |pool: &str, range: &str| check_grant(&config, pool, &range.parse().unwrap());
        assert_eq!(check("default", "10.77.0.0/24"), Ok(Grant::Held));
        assert_eq!(check("default", "10.78.0.0/24"), Ok(Grant::CancelDrain));
        assert_eq!(check("default", "10.79.0.0/24"), Ok(Grant::Add));
        assert_eq!(check("new", "fd77::/120"), Ok(Grant::Add));
        let refused = check("default", "10.80.0.0/24").unwrap_err();
        assert!(refused.contains("of source api"), "{refused}");
        let refused = check("default", "10.81.0.0/24").unwrap_err();
        assert!(
            refused.contains("of source file (state removed)"),
            "{refused}"
        );
        let refused = check("default", "10.82.0.0/23").unwrap_err();
        assert_eq!(
            refused,
            "range 10.82.0.0/23 granted to pool default by the cluster overlaps file range \
             10.82.0.0/24 of pool b; it is not applied"
        );
        let refused = check("default", "10.77.0.0/24,gateway=10.77.0.1").unwrap_err();
        assert!(refused.contains("is held as 10.77.0.0/24"), "{refused}");
    }

    #[test]
    fn a_grant_is_noted_as_the_clusters() {
        let mut spec = pool("default", vec![entry("10.78.0.0/24", Cluster, Draining)]);
        note_granted(&mut spec, &"10.78.0.0/24".parse().unwrap());
        note_granted(&mut spec, &"fd77::/120".parse().unwrap());
        assert_eq!(
            spec.ranges,
            vec![
                entry("10.78.0.0/24", Cluster, Active),
                entry("fd77::/120", Cluster, Active)
            ]
        );
    }
}
