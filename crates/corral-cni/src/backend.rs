//! Where the verbs are carried out: the embedded store ([`crate::local::Local`]) or the node
//! agent ([`crate::agent::Agent`]). `main` chooses one from the configuration; [`run`] does
//! what both share (reading `resolvConf`, rendering the result) around it.

use std::time::Duration;

use corral_core::{PoolConfig, PoolName, RangeSpec, ReusePolicy, Timestamp};
use corral_store::{PoolSpec, ScopeConfig};

use crate::{Attachment, CniError, Invocation, IpamResult, NetConfig, parse_resolv_conf};

/// The largest `resolvConf` read; glibc's resolver reads a few hundred bytes of it.
pub const MAX_RESOLV_CONF_BYTES: u64 = 64 * 1024;

/// One way of carrying out the verbs. Each returns once what it changed is durable.
pub trait Backend {
    /// ADD: one address from each range set (the requested one where asked), all or
    /// nothing; fills `result.ips` in range-set order.
    fn add(
        &self,
        attachment: &Attachment,
        now: Timestamp,
        result: &mut IpamResult,
    ) -> Result<(), CniError>;
    /// DEL: releases every address of the attachment; releasing nothing is success.
    fn del(&self, attachment: &Attachment, now: Timestamp) -> Result<(), CniError>;
    /// CHECK: see [`crate::verdict::check_held`].
    fn check(&self, attachment: &Attachment, now: Timestamp) -> Result<(), CniError>;
    /// GC: releases every allocation of the network whose attachment is not listed.
    fn gc(&self, config: &NetConfig, now: Timestamp) -> Result<(), CniError>;
    /// STATUS: code 50 when some range set could not serve an ADD.
    fn status(&self, config: &NetConfig, now: Timestamp) -> Result<(), CniError>;
}

/// Tells the runtime's log that a GC stopped at its cap: `capped` attachments wait for the
/// next GC.
pub fn warn_gc_capped(released: usize, capped: usize) {
    if capped > 0 {
        eprintln!(
            "corral-ipam: GC released {released} attachments, its cap (ipam.gcMaxReleased); \
             {capped} more wait for the next GC"
        );
    }
}

/// Runs one invocation on `backend`: the text to print on success (ADD's result), if any.
/// VERSION needs no backend; it is answered by `main`.
pub fn run(
    backend: &dyn Backend,
    invocation: &Invocation,
    now: Timestamp,
) -> Result<Option<String>, CniError> {
    match invocation {
        Invocation::Version => Err(CniError::internal("VERSION has no backend")),
        Invocation::Add(attachment) => add(backend, attachment, now).map(Some),
        Invocation::Del(attachment) => backend.del(attachment, now).map(|()| None),
        Invocation::Check(attachment) => backend.check(attachment, now).map(|()| None),
        Invocation::Gc(config) => backend.gc(config, now).map(|()| None),
        Invocation::Status(config) => backend.status(config, now).map(|()| None),
    }
}

fn add(backend: &dyn Backend, attachment: &Attachment, now: Timestamp) -> Result<String, CniError> {
    let config = &attachment.config;
    // Everything that can fail without touching the state comes first.
    let mut result = IpamResult {
        routes: config.ipam.routes.clone(),
        ..IpamResult::default()
    };
    if let Some(path) = &config.ipam.resolv_conf {
        result.dns = parse_resolv_conf(&read_resolv_conf(path)?);
    }
    backend.add(attachment, now, &mut result)?;
    Ok(result.to_json(config.cni_version))
}

/// `ipam.resolvConf`: a regular file of at most [`MAX_RESOLV_CONF_BYTES`]. Anything else (a
/// device, a FIFO, a directory, a huge file) is the configuration's mistake, code 7; a file
/// that cannot be read is code 5.
fn read_resolv_conf(path: &std::path::Path) -> Result<String, CniError> {
    match corral_store::read_small_file(path, MAX_RESOLV_CONF_BYTES) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(error @ corral_store::SmallFileError::Io { .. }) => {
            Err(CniError::io(format!("ipam.resolvConf: {error}")))
        }
        Err(
            error @ (corral_store::SmallFileError::NotRegular { .. }
            | corral_store::SmallFileError::TooLarge { .. }),
        ) => Err(CniError::invalid_config(format!(
            "ipam.resolvConf: {error}"
        ))),
    }
}

/// The network's pools as the store and the agent keep them: one per pool name, with every
/// range of the range sets that name it, in range-set order. A network on a pool of the
/// agent's node scope is that one pool without ranges (the form its pending DEL is recorded
/// in, which no network with ranges takes).
pub fn scope_config(config: &NetConfig) -> ScopeConfig {
    if let Some(pool) = &config.ipam.node_pool {
        return ScopeConfig {
            pools: vec![PoolSpec::new(
                pool,
                PoolConfig::DEFAULT_COOLDOWN,
                ReusePolicy::NextFit,
                &[],
                &[],
            )],
        };
    }
    let cooldown = config
        .ipam
        .cooldown_seconds
        .map(Duration::from_secs)
        .unwrap_or(PoolConfig::DEFAULT_COOLDOWN);
    let mut pools: Vec<(PoolName, Vec<RangeSpec>)> = Vec::new();
    for set in &config.ipam.range_sets {
        match pools.iter_mut().find(|(name, _)| *name == set.pool) {
            Some((_, ranges)) => ranges.extend(set.ranges.iter().copied()),
            None => pools.push((set.pool.clone(), set.ranges.clone())),
        }
    }
    ScopeConfig {
        pools: pools
            .iter()
            .map(|(name, ranges)| {
                PoolSpec::new(
                    name,
                    cooldown,
                    ReusePolicy::NextFit,
                    ranges,
                    &config.ipam.exclude,
                )
            })
            .collect(),
    }
}
