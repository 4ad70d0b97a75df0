//! CNI verbs of a network that allocates from a pool of the agent's own scope
//! (`CniNetwork::node_pool`: corral-ipam's `"pool"` without ranges in agent mode), such as the
//! pool the cluster grants the node's pod CIDRs to.
//!
//! The allocations live in the `node` scope, keyed by the attachment as any CNI allocation;
//! an ADD takes one address per family the pool has active ranges in (all or nothing), and the
//! other verbs act on the network's attachments in that pool only, except DEL, which releases
//! the attachment's addresses in any pool of the node scope (the pool a call resolves to may
//! differ between ADD and DEL).

use corral_api as api;
use corral_api::ErrorCode;
use corral_core::{AllocError, AttachmentKey, Family, PoolName, Request, Target, Timestamp};
use corral_store::{HistoryKind, Store, StoredAllocation};

use super::scope::{Changes, Write, record_released, scope_status};
use super::state::{Clock, NodeState};
use super::wire::{held_by_key, released};
use crate::error::OpError;

/// The pool is not there yet, or has no active range: the cluster may not have granted the
/// node its range yet, so the caller may try again later.
fn not_granted(pool: &PoolName, what: &str) -> OpError {
    OpError::new(
        ErrorCode::RetryLater,
        format!(
            "pool {pool} of the agent's {} scope {what}; the cluster may not have granted \
                 this node its range yet",
            api::NODE_SCOPE
        ),
    )
    .with_pool(pool)
}

impl<S: Store, C: Clock> NodeState<S, C> {
    pub(super) fn node_pool_add(
        &mut self,
        pool: PoolName,
        requested: &[(Family, std::net::IpAddr)],
        (key, owner): (&AttachmentKey, &str),
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::AllocateResponse, OpError> {
        let block_families = self.block_families.get(&pool).cloned();
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        let interface_backed = scope.interfaces.contains_key(&pool);
        let ranges = match scope.engine.ranges(&pool) {
            Ok(ranges) => ranges,
            Err(AllocError::UnknownPool { .. }) => {
                return Err(not_granted(&pool, "does not exist"));
            }
            Err(error) => return Err(error.into()),
        };
        // The families with an active range, and those the attachment holds already (so a
        // repeated ADD answers what it holds even from a range that is draining now).
        let held = scope.engine.lookup_key(key);
        let families: Vec<Family> = [Family::V4, Family::V6]
            .into_iter()
            .filter(|&family| {
                ranges
                    .iter()
                    .any(|r| !r.draining && r.spec.family() == family)
                    || held
                        .iter()
                        .any(|h| h.pool == pool && Family::of(h.entry.addr) == family)
                    || requested.iter().any(|(f, _)| *f == family)
            })
            .collect();
        if families.is_empty() {
            return Err(not_granted(&pool, "has no active range"));
        }
        // A block pool serves every family it is configured with, or the ADD waits: a
        // dual-stack pod does not start with one family because the other family's block
        // came a moment later.
        if let Some(wanted) = &block_families
            && held.is_empty()
            && let Some(missing) = wanted.iter().find(|f| !families.contains(f))
        {
            return Err(not_granted(
                &pool,
                &format!("has no active {missing} block yet"),
            ));
        }
        if interface_backed && requested.is_empty() && families.len() == 1 {
            let allocated = self.assign_on_interface(
                (api::NODE_SCOPE, &pool),
                (key, owner),
                families[0],
                now,
                changes,
            )?;
            return Ok(api::AllocateResponse {
                allocations: vec![allocated],
            });
        }
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        let wanted: Vec<(Request<'_>, Target)> = families
            .iter()
            .map(|&family| {
                let target = requested
                    .iter()
                    .find(|(f, _)| *f == family)
                    .map_or(Target::Next(family), |(_, addr)| Target::Specific(*addr));
                (
                    Request {
                        pool: &pool,
                        owner,
                        key: Some(key),
                        lease: None,
                    },
                    target,
                )
            })
            .collect();
        let got = scope.engine.allocate_all(&wanted, now)?;
        for a in got.iter().filter(|a| !a.existing) {
            changes.writes.push(Write::Put(
                api::NODE_SCOPE.to_owned(),
                StoredAllocation {
                    pool: pool.clone(),
                    addr: a.addr,
                    owner: owner.to_owned(),
                    key: Some(key.clone()),
                    generation: a.generation,
                    lease: None,
                },
            ));
            changes.touched.insert(api::NODE_SCOPE.to_owned());
        }
        Ok(super::interfaces::allocation_answer(scope, &pool, &got))
    }

    pub(super) fn node_pool_del(
        &mut self,
        pool: &PoolName,
        key: &AttachmentKey,
        now: Timestamp,
        changes: &mut Changes,
    ) -> Result<api::ReleaseResponse, OpError> {
        // Those unassigned from interfaces are recorded released by the unassign.
        let mut gone = self.unassign_on_interfaces(key, now, changes)?;
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        // Every pool of the node scope: the key names the network, whose attachments live
        // only here, and the pool a call resolves to may differ between ADD and DEL (the
        // namespace's pool changed, or a DEL recorded while the agent was away names the
        // plugin's own choice).
        let _ = pool;
        let mut rest = Vec::new();
        for info in scope.engine.lookup_key(key) {
            rest.push(
                scope
                    .engine
                    .release(info.entry.addr, Some(info.entry.generation), now)?,
            );
        }
        record_released(api::NODE_SCOPE, &rest, HistoryKind::Released, changes);
        gone.extend(rest);
        Ok(api::ReleaseResponse {
            released: gone.iter().map(released).collect(),
        })
    }

    pub(super) fn node_pool_check(
        &self,
        pool: &PoolName,
        key: &AttachmentKey,
    ) -> Result<api::AllocateResponse, OpError> {
        let scope = self.scope(api::NODE_SCOPE)?;
        let mut found = scope.engine.lookup_key(key);
        if found.is_empty()
            && scope.interfaces.contains_key(pool)
            && let Some(migrated) = super::interfaces::migrated_fallback(key)
        {
            // An entry ipamd backfilled from CRI (see `unassign_on_interfaces`).
            found = scope.engine.lookup_key(&migrated);
        }
        let held = found
            .into_iter()
            .filter(|info| info.pool == *pool)
            .map(|info| api::Allocated {
                lease: None,
                ..held_by_key(&info)
            })
            .collect();
        Ok(api::AllocateResponse { allocations: held })
    }

    /// The pool's use; no pools at all when it does not exist (yet).
    pub(super) fn node_pool_status(
        &mut self,
        pool: &PoolName,
        now: Timestamp,
    ) -> Result<api::ScopeStatus, OpError> {
        let scope = self.scope_mut(api::NODE_SCOPE)?;
        scope.engine.advance(now);
        let mut status = scope_status(api::NODE_SCOPE, scope);
        status.pools.retain(|p| p.pool == pool.as_str());
        Ok(status)
    }
}
