//! Agent mode: with `"agent": "<socket>"` in the ipam configuration, corral-ipam sends each
//! verb to the node agent over its unix socket instead of opening the database under
//! `dataDir`. The agent keeps the network as a scope of its own, under the same pools the
//! plugin would use, and answers once the change is durable; the results and error codes are
//! the standalone plugin's. An agent that cannot be reached (no socket, refused, timed out)
//! is code 11, "try again later".
//!
//! The client is `corral-client`: blocking, no async runtime, HTTP parsed by httparse.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use corral_api as api;
use corral_api::ErrorCode;
use corral_client::{Client, Error};
use corral_core::{AttachmentKey, Family, PoolName};

use crate::plugin::{check_held, scope_config, status_verdict};
use crate::{Attachment, CniError, IpamResult, NetConfig};

/// How long one call waits for the agent (connecting, and for the durable answer).
const TIMEOUT: Duration = Duration::from_secs(10);

fn client(socket: &Path) -> Client {
    Client::unix(socket)
        .with_connect_timeout(Some(TIMEOUT))
        .with_read_timeout(Some(TIMEOUT))
}

/// The agent's refusal as the CNI error the standalone plugin gives for the same cause, with
/// the range set it concerns named as the standalone plugin names it.
fn add_error(error: Error, config: &NetConfig) -> CniError {
    let set = match &error {
        Error::Api { error: body, .. } => body.set,
        _ => None,
    };
    let error = agent_error(error);
    match set.and_then(|i| config.ipam.range_sets.get(i)) {
        Some(set) => error.context(&set.field),
        None => error,
    }
}

/// The agent's refusal as the CNI error the standalone plugin gives for the same cause.
fn agent_error(error: Error) -> CniError {
    match error {
        Error::Unreachable { .. } | Error::Timeout { .. } | Error::Io { .. } => {
            CniError::try_again_later(format!("{error}; is the corral agent running?"))
        }
        Error::Api { error: body, .. } => {
            let code = match body.code {
                ErrorCode::Exhausted => CniError::POOL_EXHAUSTED,
                ErrorCode::InUse | ErrorCode::Conflict => CniError::ADDRESS_IN_USE,
                ErrorCode::Unavailable => CniError::ADDRESS_UNAVAILABLE,
                ErrorCode::AttachmentConflict => CniError::ATTACHMENT_CONFLICT,
                ErrorCode::BadRequest | ErrorCode::NotFound => CniError::INVALID_NETWORK_CONFIG,
                ErrorCode::RetryLater => CniError::TRY_AGAIN_LATER,
                _ => CniError::AGENT_FAILURE,
            };
            let details = if body.retryable {
                "the request may succeed later"
            } else {
                ""
            };
            CniError::new(code, body.message, details)
        }
        Error::Protocol(_) | Error::Status { .. } => {
            CniError::new(CniError::AGENT_FAILURE, error.to_string(), "")
        }
    }
}

fn family_name(family: Family) -> api::FamilyName {
    match family {
        Family::V4 => api::FamilyName::Ipv4,
        Family::V6 => api::FamilyName::Ipv6,
    }
}

/// The network as the agent gets it: its name and the pools the plugin derives.
fn network(config: &NetConfig) -> api::CniNetwork {
    api::CniNetwork {
        name: config.name.clone(),
        pools: scope_config(config)
            .pools
            .into_iter()
            .map(|pool| api::CniPool {
                name: pool.name,
                cooldown_ms: pool.cooldown_ms,
                lowest_free: pool.lowest_free,
                ranges: pool.ranges.into_iter().map(|entry| entry.range).collect(),
                exclusions: pool
                    .exclusions
                    .into_iter()
                    .map(|(network, reason)| api::ExclusionInfo { network, reason })
                    .collect(),
            })
            .collect(),
    }
}

fn api_key(key: &AttachmentKey) -> api::AttachmentKey {
    api::AttachmentKey {
        network: key.network().to_owned(),
        container_id: key.container_id().to_owned(),
        ifname: key.ifname().to_owned(),
    }
}

fn key(attachment: &Attachment) -> api::AttachmentKey {
    api_key(&attachment.key)
}

/// ADD through the agent; fills `result.ips` in range-set order.
pub fn add(
    socket: &Path,
    attachment: &Attachment,
    result: &mut IpamResult,
) -> Result<(), CniError> {
    let config = &attachment.config;
    let request = api::CniAddRequest {
        network: network(config),
        key: key(attachment),
        owner: attachment.owner(),
        sets: config
            .ipam
            .range_sets
            .iter()
            .map(|set| api::CniSet {
                pool: set.pool.to_string(),
                family: family_name(set.family),
                requested: set.requested,
            })
            .collect(),
    };
    let answer = client(socket)
        .cni_add(&request)
        .map_err(|e| add_error(e, config))?;
    if answer.allocations.len() != config.ipam.range_sets.len() {
        return Err(CniError::new(
            CniError::AGENT_FAILURE,
            format!(
                "the agent answered {} addresses for {} range sets",
                answer.allocations.len(),
                config.ipam.range_sets.len()
            ),
            "",
        ));
    }
    let mut ips = Vec::new();
    for (set, allocated) in config.ipam.range_sets.iter().zip(&answer.allocations) {
        let ip = set.ip_config(allocated.address).ok_or_else(|| {
            CniError::new(
                CniError::ATTACHMENT_CONFLICT,
                format!(
                    "attachment {} holds {}, which no range of {} contains any more",
                    attachment.key, allocated.address, set.field
                ),
                "DEL the attachment and ADD it again to get an address from the new ranges",
            )
        })?;
        ips.push(ip);
    }
    result.ips = ips;
    Ok(())
}

/// DEL through the agent: releasing nothing is success.
pub fn del(socket: &Path, attachment: &Attachment) -> Result<(), CniError> {
    let request = api::CniKeyRequest {
        network: network(&attachment.config),
        key: key(attachment),
    };
    client(socket).cni_del(&request).map_err(agent_error)?;
    Ok(())
}

/// CHECK through the agent: what it holds for the attachment, judged as the plugin does.
pub fn check(socket: &Path, attachment: &Attachment) -> Result<(), CniError> {
    let request = api::CniKeyRequest {
        network: network(&attachment.config),
        key: key(attachment),
    };
    let answer = client(socket).cni_check(&request).map_err(agent_error)?;
    let held = answer
        .allocations
        .iter()
        .map(|a| {
            let pool = PoolName::new(&a.pool).map_err(|e| {
                CniError::new(CniError::AGENT_FAILURE, format!("agent pool: {e}"), "")
            })?;
            Ok((pool, a.address))
        })
        .collect::<Result<Vec<(PoolName, IpAddr)>, CniError>>()?;
    check_held(attachment, &held)
}

/// GC through the agent.
pub fn gc(socket: &Path, config: &NetConfig) -> Result<(), CniError> {
    let request = api::CniGcRequest {
        network: network(config),
        valid_attachments: config.valid_attachments.iter().map(api_key).collect(),
    };
    client(socket).cni_gc(&request).map_err(agent_error)?;
    Ok(())
}

/// STATUS through the agent: code 50 when a range set's pool has no free or cooling address.
pub fn status(socket: &Path, config: &NetConfig) -> Result<(), CniError> {
    let request = api::CniStatusRequest {
        network: network(config),
    };
    let answer = client(socket).cni_status(&request).map_err(agent_error)?;
    status_verdict(config, |set| {
        answer
            .pools
            .iter()
            .filter(|p| p.pool == set.pool.as_str())
            .flat_map(|p| &p.families)
            .filter(|f| f.family == family_name(set.family))
            .any(|f| f.free != "0" || f.cooling != "0")
    })
}
