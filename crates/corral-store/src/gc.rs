//! The leak collector on a store: [`collect_garbage`] applies `corral_core`'s rule
//! ([`plan_gc`]) to one scope's engine inside the caller's transaction, where its suspects
//! are kept, so a one-shot corral-ipam and a restarted agent go on from the same
//! observations. Every entry point (CNI GC in corral-ipam's local mode, the agent's CNI GC
//! and its `/v1/gc`) runs this one function.

use std::collections::HashSet;
use std::net::IpAddr;

use corral_core::{
    AttachmentKey, Engine, GcHeld, GcPolicy, GcRefusal, GcSuspect, Released, Timestamp,
    held_by_attachment, plan_gc, release_suspect,
};

use crate::{StoreError, StoredAllocation, Txn};

/// What one run did (or, dry, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcOutcome {
    /// Attachments holding allocations that are live.
    pub live: usize,
    /// Suspects recorded by this run (first observations).
    pub recorded: Vec<GcSuspect>,
    /// Suspects released, each with what it held.
    pub released: Vec<GcSuspect>,
    /// Suspects seen again before their grace period ended, with when it ends.
    pub waiting: Vec<(GcSuspect, Timestamp)>,
    /// Suspects due but over the run's cap: a later run releases them.
    pub capped: Vec<GcSuspect>,
    /// Suspects forgotten: live again, or their allocations changed or are gone.
    pub cleared: Vec<AttachmentKey>,
    /// The allocations released, for the caller's rows and answers (empty when dry).
    pub freed: Vec<Released>,
    /// The rows of the allocations released, as they were stored (for the history).
    pub freed_rows: Vec<StoredAllocation>,
}

/// One run of the leak collector over the attachments of `scope` that `wanted` selects,
/// with `live` the attachments known to be in use.
///
/// Reads the scope's suspects from `txn`, decides ([`plan_gc`]), and, unless `dry_run`,
/// records new suspects, forgets cleared ones and releases the due ones from `engine`
/// (each checked again on the engine first: [`release_suspect`]), deleting their rows in
/// `txn`. The caller then saves the engine's derived state and commits; a failure leaves
/// `engine` ahead of the store, to be dropped or rebuilt.
#[allow(clippy::too_many_arguments)]
pub fn collect_garbage(
    txn: &mut impl Txn,
    scope: &str,
    engine: &mut Engine,
    wanted: impl Fn(&AttachmentKey) -> bool,
    live: &HashSet<AttachmentKey>,
    now: Timestamp,
    policy: &GcPolicy,
    dry_run: bool,
) -> Result<GcOutcome, StoreError> {
    if engine.is_restoring() {
        return Err(corral_core::AllocError::RestoreInProgress {
            operation: "garbage collection",
        }
        .into());
    }
    let suspects: Vec<GcSuspect> = txn
        .gc_suspects(scope)?
        .into_iter()
        .filter(|s| wanted(&s.key))
        .collect();
    let held = held_by_attachment(engine, &wanted);
    let plan = plan_gc(&suspects, &held, live, now, policy);
    let mut outcome = GcOutcome {
        live: plan.live,
        recorded: plan.recorded,
        released: Vec::new(),
        waiting: plan.waiting,
        capped: plan.capped,
        cleared: plan.cleared,
        freed: Vec::new(),
        freed_rows: Vec::new(),
    };
    if dry_run {
        outcome.released = plan.release;
        return Ok(outcome);
    }
    for key in &outcome.cleared {
        txn.delete_gc_suspect(scope, key)?;
    }
    for suspect in &outcome.recorded {
        txn.put_gc_suspect(scope, suspect)?;
    }
    for suspect in plan.release {
        txn.delete_gc_suspect(scope, &suspect.key)?;
        match release_suspect(engine, &suspect, live, now) {
            Ok(freed) => {
                for released in &freed {
                    outcome
                        .freed_rows
                        .extend(txn.allocation_by_addr(scope, released.addr)?);
                    txn.delete_allocation(scope, released.addr)?;
                }
                outcome.freed.extend(freed);
                outcome.released.push(suspect);
            }
            Err(GcRefusal::Live { key } | GcRefusal::Changed { key }) => {
                outcome.cleared.push(key);
            }
            Err(GcRefusal::Engine(error)) => return Err(error.into()),
        }
    }
    outcome.cleared.sort();
    outcome.cleared.dedup();
    Ok(outcome)
}

/// A suspect's allocations as stored: `addr@generation`, space-separated.
pub(crate) fn encode_held(held: &[GcHeld]) -> String {
    held.iter()
        .map(|h| format!("{}@{}", h.addr, h.generation))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn decode_held(text: &str) -> Result<Vec<GcHeld>, StoreError> {
    let corrupt = |item: &str| StoreError::Corrupt {
        what: "gc suspect".into(),
        reason: format!("{item:?} is not address@generation"),
    };
    let mut held = text
        .split_whitespace()
        .map(|item| {
            let (addr, generation) = item.split_once('@').ok_or_else(|| corrupt(item))?;
            Ok(GcHeld {
                addr: addr.parse::<IpAddr>().map_err(|_| corrupt(item))?,
                generation: generation.parse().map_err(|_| corrupt(item))?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    held.sort_unstable();
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_round_trips_and_garbage_is_corrupt() {
        let held = vec![
            GcHeld {
                addr: "10.0.0.2".parse().unwrap(),
                generation: 7,
            },
            GcHeld {
                addr: "fd00::2".parse().unwrap(),
                generation: 8,
            },
        ];
        assert_eq!(decode_held(&encode_held(&held)).unwrap(), held);
        for bad in ["10.0.0.2", "10.0.0.2@x", "nope@1"] {
            assert!(matches!(decode_held(bad), Err(StoreError::Corrupt { .. })));
        }
    }
}
