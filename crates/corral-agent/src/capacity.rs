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
//!   while the file declares it.
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
            if let Some(i) = out.pools[index].entry_at(&spec) {
                let entry = &mut out.pools[index].ranges[i];
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
        for entry in pool.ranges.iter().filter(|e| e.in_engine()) {
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
}
