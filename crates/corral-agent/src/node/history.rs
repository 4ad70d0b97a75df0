//! The allocation history read back: [`Op::History`](super::Op::History). Every commit of a
//! batch writes its events (`scope.rs`, `persist`) and prunes the history to its bounds; this
//! only asks the store, in a transaction that writes nothing.

use corral_api as api;
use corral_core::Family;
use corral_store::{HistoryEvent, HistoryKind, Store, Txn};

use super::request::History;
use super::state::{Clock, NodeState};
use super::wire::{api_key, family_name};
use crate::error::OpError;

impl<S: Store, C: Clock> NodeState<S, C> {
    pub(super) fn history(&mut self, request: History) -> Result<api::HistoryResponse, OpError> {
        let mut txn = self.store.begin().map_err(OpError::store)?;
        let events = txn.history(&request.query).map_err(OpError::store)?;
        let held = match request.held_at {
            Some((addr, at)) => Some(txn.held_at(addr, at).map_err(OpError::store)?),
            None => None,
        };
        // Read only: dropping the transaction rolls back nothing.
        drop(txn);
        Ok(api::HistoryResponse {
            events: events.iter().map(api_event).collect(),
            held: held.map(|held| held.iter().map(api_event).collect()),
        })
    }
}

fn api_kind(kind: HistoryKind) -> api::HistoryKind {
    match kind {
        HistoryKind::Allocated => api::HistoryKind::Allocated,
        HistoryKind::Released => api::HistoryKind::Released,
        HistoryKind::Expired => api::HistoryKind::Expired,
        HistoryKind::Collected => api::HistoryKind::Collected,
        HistoryKind::Surrendered => api::HistoryKind::Surrendered,
    }
}

fn api_event(event: &HistoryEvent) -> api::HistoryEvent {
    let at_ms = event.at.as_unix_millis();
    api::HistoryEvent {
        at_ms,
        at: api::history::format_time(at_ms),
        event: api_kind(event.kind),
        address: event.addr,
        family: family_name(Family::of(event.addr)),
        scope: event.scope.clone(),
        pool: event.pool.to_string(),
        key: event.key.as_ref().map(api_key),
        owner: event.owner.clone(),
        generation: event.generation,
    }
}
