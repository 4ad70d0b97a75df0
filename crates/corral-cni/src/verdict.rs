//! The verdicts both backends share, pure: what CHECK and STATUS conclude from what is held,
//! and the result entry of an address ADD obtained.

use std::net::IpAddr;

use corral_core::{Family, PoolName};

use crate::config::RangeSet;
use crate::{Attachment, CniError, IpConfig, NetConfig};

/// The result entry for `addr`, which the attachment holds in `set`'s pool. An address that
/// lies in none of the set's ranges was kept from an earlier configuration (`existing`: the
/// configuration changed under a live attachment, code 106) or is a bug (999).
pub fn result_ip(
    attachment: &Attachment,
    set: &RangeSet,
    addr: IpAddr,
    existing: bool,
) -> Result<IpConfig, CniError> {
    set.ip_config(addr).ok_or_else(|| {
        if existing {
            CniError::new(
                CniError::ATTACHMENT_CONFLICT,
                format!(
                    "attachment {} holds {addr}, which no range of {} contains any more",
                    attachment.key, set.field
                ),
                "DEL the attachment and ADD it again to get an address from the new ranges",
            )
        } else {
            CniError::internal(format!(
                "{addr} was handed out from {} but lies in none of its ranges",
                set.field
            ))
        }
    })
}

/// CHECK's verdict on what the attachment holds (pool and address of each allocation): an
/// address in every range set, and every address of the previous result that lies in our
/// ranges among them.
pub fn check_held(attachment: &Attachment, held: &[(PoolName, IpAddr)]) -> Result<(), CniError> {
    let config = &attachment.config;
    let mut problems = Vec::new();
    for set in &config.ipam.range_sets {
        if !held.iter().any(|(pool, addr)| {
            *pool == set.pool && Family::of(*addr) == set.family && set.contains(*addr)
        }) {
            problems.push(format!(
                "attachment {} holds no address from {}",
                attachment.key, set.field
            ));
        }
    }
    check_previous(attachment, held, problems, |addr| {
        config.ipam.range_sets.iter().any(|set| set.contains(addr))
    })
}

/// CHECK's conclusion: `problems` found so far, and every address of the previous result
/// that is `ours` but not among those the attachment holds.
pub fn check_previous(
    attachment: &Attachment,
    held: &[(PoolName, IpAddr)],
    mut problems: Vec<String>,
    ours: impl Fn(IpAddr) -> bool,
) -> Result<(), CniError> {
    if let Some(prev) = &attachment.config.prev_result {
        for addr in prev.addresses() {
            if ours(addr) && !held.iter().any(|(_, held)| *held == addr) {
                problems.push(format!(
                    "prevResult lists {addr}, which attachment {} does not hold",
                    attachment.key
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CniError::check_failed(problems.join("; ")))
    }
}

/// STATUS's verdict: code 50 naming every range set that could not serve an ADD.
pub fn status_verdict(
    config: &NetConfig,
    can_serve: impl Fn(&RangeSet) -> bool,
) -> Result<(), CniError> {
    let full: Vec<String> = config
        .ipam
        .range_sets
        .iter()
        .filter(|set| !can_serve(set))
        .map(|set| format!("{} has no free address", set.field))
        .collect();
    if full.is_empty() {
        Ok(())
    } else {
        Err(CniError::not_available(full.join("; ")))
    }
}
