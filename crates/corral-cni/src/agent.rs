//! The agent backend (`"agent": "<socket>"` in the ipam configuration): corral-ipam sends each
//! verb to the node agent over its unix socket instead of opening the database under
//! `dataDir`. The agent keeps the network as a scope of its own, under the same pools the
//! plugin would use, and answers once the change is durable; the results and error codes are
//! the local backend's. An agent that cannot be reached (no socket, refused, timed out) is
//! code 11, "try again later" — except for DEL.
//!
//! A DEL never fails because the agent is away (unreachable, timed out, restoring): it is
//! recorded durably under `dataDir` (see `corral_store::PendingDel`) and answered with
//! success, and the agent applies it when it starts, before it serves anything. So that a
//! late release never frees what a later ADD of the same attachment obtained (a restarted
//! container keeps its ID and interface), an ADD or CHECK first settles its own attachment's
//! record: it claims it, delivers the DEL, and removes it durably before it goes on. It never
//! touches another attachment's record: runtimes serialise calls per container only.
//!
//! The client is `corral-client`: blocking, no async runtime, HTTP parsed by httparse.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_api as api;
use corral_api::ErrorCode;
use corral_client::{Client, Error};
use corral_core::{AttachmentKey, Family, IpNet, PoolName, Timestamp};
use corral_store::{PendingDel, PendingError, claim_pending_del, record_pending_del};

use crate::backend::{Backend, scope_config, warn_gc_capped};
use crate::verdict::{check_held, check_previous, result_ip, status_verdict};
use crate::{Attachment, CloudInterface, CniError, IpConfig, IpamResult, NetConfig, Route};

/// How long one call waits to connect to the agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one call waits for the agent's answer: longer than the agent's default pool wait
/// (20 s: an ADD waits that long for a grant or for the agent to finish restoring, through an
/// operator failover), within the runtime's own deadline for a CNI call (minutes).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The verbs sent to the agent listening on `socket`.
#[derive(Clone, Debug)]
pub struct Agent {
    pub socket: PathBuf,
}

impl Agent {
    pub fn new(socket: &Path) -> Agent {
        Agent {
            socket: socket.to_path_buf(),
        }
    }

    fn client(&self) -> Client {
        Client::unix(&self.socket)
            .with_connect_timeout(Some(CONNECT_TIMEOUT))
            .with_read_timeout(Some(ANSWER_TIMEOUT))
    }

    /// Delivers the attachment's own pending DEL, if it has one, before anything else is
    /// asked for it; see the module documentation.
    fn settle_pending(&self, client: &mut Client, attachment: &Attachment) -> Result<(), CniError> {
        let data_dir = &attachment.config.ipam.data_dir;
        let Some(claimed) = claim_pending_del(data_dir, &attachment.key).map_err(pending_error)?
        else {
            return Ok(());
        };
        match client.cni_del(&key_request(attachment)) {
            // Removed durably before the ADD is sent: a record that came back after a crash
            // would release the address this ADD obtains.
            Ok(_) => claimed.remove().map_err(pending_error),
            Err(error) => {
                let put_back = claimed.put_back();
                let error = agent_error(error);
                Err(match put_back {
                    Ok(()) => error,
                    Err(problem) => error.with_details(format!(
                        "and the pending DEL of {} could not be put back: {problem}",
                        attachment.key
                    )),
                })
            }
        }
    }
}

/// A pending record that could not be written, claimed or removed: the state under `dataDir`.
fn pending_error(error: PendingError) -> CniError {
    CniError::store(error).context("ipam.dataDir")
}

/// Whether the agent is away rather than refusing: nothing listens, it did not answer in
/// time, the connection broke, or it is still restoring (or its store failed).
fn agent_is_away(error: &Error) -> bool {
    match error {
        Error::Unreachable { .. } | Error::Timeout { .. } | Error::Io { .. } => true,
        Error::Api { error: body, .. } => body.code == ErrorCode::RetryLater,
        Error::Protocol(_) | Error::Status { .. } => false,
    }
}

/// The CNI code for each of the agent's error codes, once, with no catch-all: a new code does
/// not compile until it is mapped here.
fn cni_code(code: ErrorCode) -> u32 {
    match code {
        ErrorCode::Exhausted => CniError::POOL_EXHAUSTED,
        ErrorCode::InUse | ErrorCode::Conflict => CniError::ADDRESS_IN_USE,
        ErrorCode::Unavailable => CniError::ADDRESS_UNAVAILABLE,
        ErrorCode::AttachmentConflict => CniError::ATTACHMENT_CONFLICT,
        ErrorCode::BadRequest | ErrorCode::NotFound => CniError::INVALID_NETWORK_CONFIG,
        ErrorCode::RetryLater => CniError::TRY_AGAIN_LATER,
        ErrorCode::StoreFailed => CniError::STORE_FAILURE,
        // The interface API's own refusals; a CNI verb never causes them, but an agent
        // whose interfaces changed under a call is a configuration matter.
        ErrorCode::DuplicateInterface
        | ErrorCode::UnknownInterface
        | ErrorCode::InterfaceInUse
        | ErrorCode::AddressAlreadyPresent
        | ErrorCode::UnknownAddress
        | ErrorCode::AddressInUse
        | ErrorCode::PoolKindMismatch => CniError::INVALID_NETWORK_CONFIG,
        // The unix socket needs no token, and the plugin sends JSON bodies of bounded size to
        // the paths and methods of its own build: an agent of another version, or something
        // else listening on the socket.
        ErrorCode::Unauthorized
        | ErrorCode::MethodNotAllowed
        | ErrorCode::TooLarge
        | ErrorCode::UnsupportedMediaType => CniError::AGENT_FAILURE,
    }
}

/// The agent's refusal as the CNI error the local backend gives for the same cause, with the
/// range set it concerns named as the local backend names it.
fn add_error(error: Error, config: &NetConfig) -> CniError {
    let set = match &error {
        Error::Api { error: body, .. } => body.set,
        Error::Unreachable { .. }
        | Error::Timeout { .. }
        | Error::Io { .. }
        | Error::Protocol(_)
        | Error::Status { .. } => None,
    };
    let error = agent_error(error);
    match set.and_then(|i| config.ipam.range_sets.get(i)) {
        Some(set) => error.context(&set.field),
        None => error,
    }
}

/// The agent's refusal as the CNI error the local backend gives for the same cause.
fn agent_error(error: Error) -> CniError {
    match error {
        Error::Unreachable { .. } | Error::Timeout { .. } | Error::Io { .. } => {
            CniError::try_again_later(format!("{error}; is the corral agent running?"))
        }
        Error::Api { error: body, .. } => {
            let details = if body.retryable {
                "the request may succeed later"
            } else {
                ""
            };
            // The engine's refusals carry the plugin's own code for them, so both ways of
            // running answer the same; the agent's own errors map by their API code.
            let code = body.cni_code.unwrap_or_else(|| cni_code(body.code));
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

/// The network as the agent gets it: its name and the pools the plugin derives; on a node
/// pool, what the agent chooses the pool from (the call's pool, the pod's namespace, the
/// network's `ipam.pool`), beside the plugin's own choice for agents that do not choose.
fn network(config: &NetConfig, namespace: Option<&str>) -> api::CniNetwork {
    if let Some(pool) = &config.ipam.node_pool {
        return api::CniNetwork {
            requested_pool: config.ipam.requested_pool.as_ref().map(ToString::to_string),
            configured_pool: config.ipam.pool.as_ref().map(ToString::to_string),
            namespace: namespace.filter(|n| !n.is_empty()).map(str::to_owned),
            ..api::CniNetwork::on_node_pool(&config.name, pool.to_string())
        };
    }
    api::CniNetwork::with_pools(
        &config.name,
        scope_config(config)
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
    )
}

fn api_key(key: &AttachmentKey) -> api::AttachmentKey {
    api::AttachmentKey {
        network: key.network().to_owned(),
        container_id: key.container_id().to_owned(),
        ifname: key.ifname().to_owned(),
    }
}

/// The pod's Kubernetes namespace, when the runtime passed it (`K8S_POD_NAMESPACE`).
fn namespace(attachment: &Attachment) -> Option<&str> {
    attachment.env.args.get("K8S_POD_NAMESPACE")
}

/// ADD's request for the attachment: these sets, from its network.
fn add_request(attachment: &Attachment, sets: Vec<api::CniSet>) -> api::CniAddRequest {
    api::CniAddRequest {
        network: network(&attachment.config, namespace(attachment)),
        key: api_key(&attachment.key),
        owner: attachment.owner(),
        sets,
    }
}

fn key_request(attachment: &Attachment) -> api::CniKeyRequest {
    api::CniKeyRequest {
        network: network(&attachment.config, namespace(attachment)),
        key: api_key(&attachment.key),
    }
}

impl Backend for Agent {
    fn add(
        &self,
        attachment: &Attachment,
        _now: Timestamp,
        result: &mut IpamResult,
    ) -> Result<(), CniError> {
        let config = &attachment.config;
        let mut client = self.client();
        self.settle_pending(&mut client, attachment)?;
        if let Some(pool) = &config.ipam.node_pool {
            return node_pool_add(&mut client, attachment, pool, result);
        }
        let sets = config.ipam.range_sets.iter().map(|set| api::CniSet {
            pool: set.pool.to_string(),
            family: family_name(set.family),
            requested: set.requested,
        });
        let request = add_request(attachment, sets.collect());
        let answer = client.cni_add(&request).map_err(|e| add_error(e, config))?;
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
            // Whatever the agent says, an address outside the set's ranges is one the
            // configuration no longer covers.
            ips.push(result_ip(attachment, set, allocated.address, true)?);
        }
        result.ips = ips;
        Ok(())
    }

    /// Delivered, or recorded for the agent's next start when it is away.
    fn del(&self, attachment: &Attachment, _now: Timestamp) -> Result<(), CniError> {
        let data_dir = &attachment.config.ipam.data_dir;
        match self.client().cni_del(&key_request(attachment)) {
            Ok(_) => {
                // A record left by an earlier DEL is superseded; left in place, it would
                // only be delivered again (harmlessly) by the next ADD or the agent's start.
                match claim_pending_del(data_dir, &attachment.key)
                    .and_then(|claimed| claimed.map_or(Ok(()), corral_store::Claimed::remove))
                {
                    Ok(()) => {}
                    Err(problem) => eprintln!("corral-ipam: {problem}"),
                }
                Ok(())
            }
            Err(error) if agent_is_away(&error) => {
                let record = PendingDel::new(
                    &self.socket,
                    &attachment.key,
                    &scope_config(&attachment.config),
                );
                match record_pending_del(data_dir, &record) {
                    Ok(path) => {
                        // The runtime keeps a plugin's stderr in its log.
                        eprintln!(
                            "corral-ipam: {error}: DEL of {} recorded in {}; the agent applies it when it starts",
                            attachment.key,
                            path.display()
                        );
                        Ok(())
                    }
                    Err(problem) => Err(agent_error(error)
                        .with_details(format!("and the DEL could not be recorded: {problem}"))),
                }
            }
            Err(error) => Err(agent_error(error)),
        }
    }

    /// What the agent holds for the attachment (after its pending DEL, if any), judged as the
    /// local backend judges it.
    fn check(&self, attachment: &Attachment, _now: Timestamp) -> Result<(), CniError> {
        let mut client = self.client();
        self.settle_pending(&mut client, attachment)?;
        let answer = client
            .cni_check(&key_request(attachment))
            .map_err(agent_error)?;
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
        match &attachment.config.ipam.node_pool {
            Some(pool) => check_node_pool(attachment, pool, &held),
            None => check_held(attachment, &held),
        }
    }

    /// The agent runs the same leak collector as the local backend, with the grace period
    /// and cap of this configuration.
    fn gc(&self, config: &NetConfig, _now: Timestamp) -> Result<(), CniError> {
        let policy = config.ipam.gc_policy();
        let request = api::CniGcRequest {
            network: network(config, None),
            valid_attachments: config.valid_attachments.iter().map(api_key).collect(),
            grace_ms: Some(u64::try_from(policy.grace.as_millis()).unwrap_or(u64::MAX)),
            max_released: Some(policy.max_released as u64),
        };
        let outcome = self.client().cni_gc(&request).map_err(agent_error)?;
        warn_gc_capped(outcome.released.len(), outcome.capped.len());
        Ok(())
    }

    /// Code 50 when a range set's pool has no free or cooling address.
    fn status(&self, config: &NetConfig, _now: Timestamp) -> Result<(), CniError> {
        let request = api::CniStatusRequest {
            network: network(config, None),
        };
        let answer = self.client().cni_status(&request).map_err(agent_error)?;
        if let Some(pool) = &config.ipam.node_pool {
            let serves = answer
                .pools
                .iter()
                .filter(|p| p.pool == pool.as_str())
                .flat_map(|p| &p.families)
                .any(|f| f.free != "0" || f.cooling != "0");
            return if serves {
                Ok(())
            } else {
                Err(CniError::not_available(format!(
                    "pool {pool} of the agent's node scope has no free address (no active range \
                     yet, or every address is taken)"
                )))
            };
        }
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
}

/// ADD on a pool of the agent's node scope: the agent chooses the families (those the pool has
/// active ranges in); each address comes back with its range's subnet and gateway.
fn node_pool_add(
    client: &mut Client,
    attachment: &Attachment,
    pool: &PoolName,
    result: &mut IpamResult,
) -> Result<(), CniError> {
    let config = &attachment.config;
    let sets = config.requested.iter().map(|&addr| api::CniSet {
        pool: pool.to_string(),
        family: family_name(Family::of(addr)),
        requested: Some(addr),
    });
    let request = add_request(attachment, sets.collect());
    let answer = client.cni_add(&request).map_err(agent_error)?;
    if answer.allocations.is_empty() {
        return Err(CniError::new(
            CniError::AGENT_FAILURE,
            format!("the agent answered no address from pool {pool}"),
            "",
        ));
    }
    let mut ips = Vec::with_capacity(answer.allocations.len());
    for allocated in &answer.allocations {
        let Some(subnet) = &allocated.subnet else {
            return Err(CniError::new(
                CniError::ATTACHMENT_CONFLICT,
                format!(
                    "attachment {} holds {}, which no range of pool {pool} contains any more",
                    attachment.key, allocated.address
                ),
                "DEL the attachment and ADD it again to get an address from the pool's ranges",
            ));
        };
        let prefix = subnet
            .parse::<IpNet>()
            .map_err(|e| {
                CniError::new(
                    CniError::AGENT_FAILURE,
                    format!("the agent's subnet {subnet:?}: {e}"),
                    "",
                )
            })?
            .prefix_len();
        let address = IpNet::new(allocated.address, prefix).map_err(|e| {
            CniError::new(
                CniError::AGENT_FAILURE,
                format!("the agent's address {} in {subnet}: {e}", allocated.address),
                "",
            )
        })?;
        ips.push(IpConfig::new(address, allocated.gateway));
        if let Some(interface) = &allocated.interface {
            add_interface(result, interface, address)?;
        }
    }
    result.ips = ips;
    Ok(())
}

/// An address of an interface-backed pool: its interface's routable CIDRs become routes via
/// the interface's gateway (after the configuration's own, a destination given twice
/// once), and the interface itself goes under the result's `corral` key (see
/// [`crate::CloudInterface`] for why not under `interfaces`).
fn add_interface(
    result: &mut IpamResult,
    interface: &api::AllocatedInterface,
    address: IpNet,
) -> Result<(), CniError> {
    let family = Family::of(address.addr());
    for route in &interface.routes {
        let dst = route.parse::<IpNet>().map_err(|e| {
            CniError::new(
                CniError::AGENT_FAILURE,
                format!(
                    "the agent's route {route:?} of interface {}: {e}",
                    interface.id
                ),
                "",
            )
        })?;
        if Family::of(dst.addr()) != family || result.routes.iter().any(|r| r.dst == dst) {
            continue;
        }
        let gateway = interface
            .gateway
            .filter(|gateway| Family::of(*gateway) == family);
        result.routes.push(Route::new(dst, gateway));
    }
    match result
        .cloud_interfaces
        .iter_mut()
        .find(|known| known.id == interface.id)
    {
        Some(known) => known.addresses.push(address),
        None => result.cloud_interfaces.push(CloudInterface {
            id: interface.id.clone(),
            device_number: interface.device_number,
            mac: interface.mac.clone(),
            addresses: vec![address],
        }),
    }
    Ok(())
}

/// CHECK on a pool of the agent's node scope: the attachment holds an address there, and
/// every address of the previous result is among those it holds. The agent answers only the
/// addresses of the pool it chose (which may be the namespace's, not `pool`).
fn check_node_pool(
    attachment: &Attachment,
    pool: &PoolName,
    held: &[(PoolName, IpAddr)],
) -> Result<(), CniError> {
    let mut problems = Vec::new();
    if held.is_empty() {
        problems.push(format!(
            "attachment {} holds no address from pool {pool} of the agent",
            attachment.key
        ));
    }
    check_previous(attachment, held, problems, |_| true)
}
