//! The network configuration on stdin, in host-local's format with corral's additions,
//! turned into validated values.
//!
//! host-local's `ipam` keys are read with its semantics:
//! - `ranges` is a list of range sets, each a list of `{subnet, rangeStart, rangeEnd,
//!   gateway}` of one family; ADD hands out one address from each set.
//! - The older single-range form (`subnet`, `rangeStart`, `rangeEnd`, `gateway` directly in
//!   `ipam`) becomes the first set, and `runtimeConfig.ipRanges` (the capability) is put
//!   before both, in that order, as host-local does.
//! - A range without `gateway` gets the subnet's first address (network + 1) as gateway,
//!   except /31, /32, /127 and /128 subnets, which have no address to spare. The gateway is
//!   reserved when it lies inside `rangeStart..=rangeEnd`.
//! - `rangeStart` and `rangeEnd` default to the first and last usable addresses of the
//!   subnet (the IPv4 broadcast address is never handed out).
//! - Empty strings in `rangeStart`, `rangeEnd`, `gateway`, `routes[].gw`, `dataDir` and
//!   `resolvConf` read as absent, as Go's decoders read them.
//! - Requested addresses come from `CNI_ARGS` `IP=`, `args.cni.ips` and `runtimeConfig.ips`,
//!   each assigned to the range set that contains it.
//!
//! corral's own `ipam` keys: `pool` (the pool name, instead of the network name), `exclude`
//! (addresses or CIDRs never handed out: `"10.0.0.5"` or `{"network": "10.0.0.16/28",
//! "reason": "routers"}`), `cooldownSeconds` (how long a released address rests),
//! `gcGracePeriodSeconds` and `gcMaxReleased` (GC, below), and `agent` (the node agent's
//! socket, to delegate to it instead of using `dataDir`).
//!
//! GC (spec 1.1) releases nothing at once by default: an allocation whose attachment is not in
//! `cni.dev/valid-attachments` is recorded as a suspect, and a later GC releases it only if
//! it is still missing, still holds the same addresses, and `gcGracePeriodSeconds` (default
//! 900, Calico's 15 minutes; at most a week) have passed since it was first seen missing; at
//! most `gcMaxReleased` attachments (default 64) go per GC, the rest at the next. With
//! `gcGracePeriodSeconds: 0` one observation is enough: a GC releases what it finds missing.
//!
//! With `agent` and no ranges at all (no `ipam.ranges`, `ipam.subnet` or
//! `runtimeConfig.ipRanges`), `pool` names a pool of the agent's own node scope (default
//! `default`; a call may name another in `runtimeConfig.pool` or `args.cni.pool`), such as the
//! one the cluster grants the node's pod CIDRs or blocks to: ADD takes one address per family
//! the pool has active ranges in. The plugin sends the call's pool, `ipam.pool` and the pod's
//! namespace (`K8S_POD_NAMESPACE` in `CNI_ARGS`) separately, and an agent in a cluster chooses:
//! the call's pool, else the namespace's pool in the cluster configuration, else `ipam.pool`,
//! else the cluster's `default_pool`, else `default`. With `agent`, `pool` and ranges together are refused (code 7).
//! Without `agent`, a configuration without ranges is refused as host-local refuses it.
//!
//! Errors: a wrong JSON type is code 6; a value that is well-typed but wrong is code 7; both
//! name the field, such as `ipam.ranges[0][1].rangeStart`.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use corral_core::{
    AttachmentKey, DEFAULT_GC_GRACE, DEFAULT_GC_MAX_RELEASED, Exclusion, Family, GcPolicy, IpNet,
    PoolName, RangeSpec, SpecError, addr_value,
};
use serde_json::Value;

use crate::env::{CniArgs, Command, parse_requested_ip};
use crate::error::CniError;
use crate::json::{Obj, as_array, as_str, index, join, wrong_type};
use crate::result::{
    IpConfig, PrevResult, Route, parse_cidr, parse_ip, parse_prev_result, parse_routes,
};
use crate::version::{CniVersion, supported_versions_text};

/// The largest network configuration accepted on stdin.
pub const MAX_STDIN_BYTES: usize = 1 << 20;
/// Where state is kept when `ipam.dataDir` is not set (host-local's default).
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";
/// The longest cooldown accepted: a week.
pub const MAX_COOLDOWN_SECONDS: u64 = 7 * 24 * 60 * 60;
/// The longest GC grace period accepted: a week.
pub const MAX_GC_GRACE_SECONDS: u64 = 7 * 24 * 60 * 60;
/// The most attachments one GC may be allowed to release.
pub const MAX_GC_MAX_RELEASED: u64 = 1 << 20;
/// The shortest IPv4 prefix accepted for a subnet; a larger subnet is a typo, not a plan.
pub const MIN_IPV4_PREFIX: u8 = 8;
/// The shortest IPv6 prefix accepted for a subnet.
pub const MIN_IPV6_PREFIX: u8 = 16;
/// The longest unix socket path (`sun_path` less its terminating NUL).
pub const MAX_SOCKET_PATH_LEN: usize = 107;
/// The reason recorded for an exclusion that gives none.
pub const DEFAULT_EXCLUSION_REASON: &str = "excluded in network config";

/// The node pool an agent-mode configuration without ranges allocates from when it names none.
pub const DEFAULT_NODE_POOL: &str = "default";

/// The GC key naming the attachments still in use.
pub const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";
/// The name an earlier draft of spec 1.1.0 used; libcni sends both.
pub const ATTACHMENTS: &str = "cni.dev/attachments";

/// A validated network configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    pub cni_version: CniVersion,
    /// The network name, a valid CNI name (no part of it can name a path).
    pub name: String,
    pub ipam: IpamConfig,
    /// ADD only: every requested address once, in the order the sources give them
    /// (`CNI_ARGS`, `args.cni.ips`, `runtimeConfig.ips`); each is also in its range set's
    /// `requested`.
    pub requested: Vec<IpAddr>,
    /// CHECK only: the addresses the previous ADD returned, when the runtime passed them.
    pub prev_result: Option<PrevResult>,
    /// GC only: the attachments of this network still in use; the rest are suspects.
    pub valid_attachments: Vec<AttachmentKey>,
}

/// The validated `ipam` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpamConfig {
    /// `ipam.type`, when given (corral does not insist on its own binary name).
    pub plugin_type: Option<String>,
    /// At least one set, unless `node_pool` is set (then none); no two ranges of all sets
    /// overlap.
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub data_dir: PathBuf,
    pub resolv_conf: Option<PathBuf>,
    /// `ipam.pool`, when given.
    pub pool: Option<PoolName>,
    pub exclude: Vec<Exclusion>,
    pub cooldown_seconds: Option<u64>,
    /// `gcGracePeriodSeconds`: how long after its attachment was first seen missing an
    /// allocation may be released by GC (default [`corral_core::DEFAULT_GC_GRACE`]).
    pub gc_grace_seconds: Option<u64>,
    /// `gcMaxReleased`: attachments one GC releases at most (at least 1; default
    /// [`corral_core::DEFAULT_GC_MAX_RELEASED`]).
    pub gc_max_released: Option<u64>,
    /// The node agent's unix socket, when corral-ipam should delegate to it.
    pub agent: Option<PathBuf>,
    /// Agent mode without ranges: the pool of the agent's node scope to allocate from (one
    /// address per family it has active ranges in), from `runtimeConfig.pool`, else
    /// `args.cni.pool`, else `ipam.pool`, else [`DEFAULT_NODE_POOL`]. An agent in a cluster
    /// chooses again from what the plugin sends: the call's pool (`requested_pool`), else the
    /// pod's namespace's pool (`K8S_POD_NAMESPACE`, mapped by the cluster configuration),
    /// else `ipam.pool`, else the cluster's default pool.
    pub node_pool: Option<PoolName>,
    /// With `node_pool`: the pool the call itself named (`runtimeConfig.pool`, else
    /// `args.cni.pool`), if it named one.
    pub requested_pool: Option<PoolName>,
}

impl IpamConfig {
    /// How GC decides: the configured grace period and cap, or Calico's defaults.
    pub fn gc_policy(&self) -> GcPolicy {
        GcPolicy {
            grace: self
                .gc_grace_seconds
                .map(std::time::Duration::from_secs)
                .unwrap_or(DEFAULT_GC_GRACE),
            max_released: self
                .gc_max_released
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(DEFAULT_GC_MAX_RELEASED),
        }
    }
}

/// One range set: the ranges ADD takes one address from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSet {
    /// Where the set is written, such as `ipam.ranges[1]`, for messages.
    pub field: String,
    /// The pool the set allocates from. The first set of each family uses the pool name
    /// (`ipam.pool`, else the network name); the n-th set of the same family appends `-n`,
    /// because an attachment holds one address per pool and family. Names longer than 63
    /// bytes are shortened with a hash (see [`pool_name`]).
    pub pool: PoolName,
    pub family: Family,
    pub ranges: Vec<RangeSpec>,
    /// ADD only: the address requested from this set.
    pub requested: Option<IpAddr>,
}

impl RangeSet {
    /// The range whose `start..=end` holds `addr`.
    pub fn range_for(&self, addr: IpAddr) -> Option<&RangeSpec> {
        self.ranges.iter().find(|range| in_bounds(range, addr))
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        self.range_for(addr).is_some()
    }

    /// The result entry for `addr`: the address with its subnet's prefix length and the
    /// subnet's gateway. A range's bounds are tried first, then its whole subnet, so an
    /// address kept from an earlier configuration still gets its subnet when it has one.
    pub fn ip_config(&self, addr: IpAddr) -> Option<IpConfig> {
        let range = self.range_for(addr).or_else(|| {
            self.ranges
                .iter()
                .find(|range| range.subnet_net().contains(&addr))
        })?;
        let address = IpNet::new(addr, range.subnet_net().prefix_len()).ok()?;
        Some(IpConfig::new(address, range.gateway()))
    }
}

fn in_bounds(range: &RangeSpec, addr: IpAddr) -> bool {
    Family::of(addr) == range.family() && {
        let value = addr_value(addr);
        addr_value(range.start()) <= value && value <= addr_value(range.end())
    }
}

/// The `cniVersion` to answer in, from a stdin that may not parse: the configured version
/// when it is a supported one, else the newest.
pub fn reply_version(stdin: &[u8]) -> CniVersion {
    if stdin.len() > MAX_STDIN_BYTES {
        return CniVersion::LATEST;
    }
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .as_ref()
        .and_then(|root| root.get("cniVersion"))
        .and_then(Value::as_str)
        .and_then(CniVersion::parse)
        .unwrap_or(CniVersion::LATEST)
}

/// Parses and validates the network configuration for `command`.
///
/// `cni_args` supplies the addresses requested through `CNI_ARGS`. Only ADD reads requested
/// addresses, only CHECK reads `prevResult`, only GC reads the valid attachments, so a
/// teardown never fails on input it does not use.
pub fn parse_config(
    command: Command,
    stdin: &[u8],
    cni_args: &CniArgs,
) -> Result<NetConfig, CniError> {
    if command == Command::Version {
        return Err(CniError::internal("VERSION reads no network config"));
    }
    if stdin.len() > MAX_STDIN_BYTES {
        return Err(CniError::decoding(format!(
            "network config is {} bytes, more than the limit of {MAX_STDIN_BYTES}",
            stdin.len()
        )));
    }
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Err(CniError::decoding("network config on stdin is empty"));
    }
    let root_value: Value = serde_json::from_slice(stdin)
        .map_err(|err| CniError::decoding(format!("network config is not valid json: {err}")))?;
    let root = Obj::of("", &root_value)?;

    let cni_version = parse_version(&root)?;
    if !cni_version.allows(command) {
        return Err(CniError::command_needs_version(
            command.as_str(),
            cni_version,
            CniVersion::first_with(command),
        ));
    }
    let name = parse_name(&root)?;
    let ipam_value = root
        .get("ipam")
        .ok_or_else(|| CniError::invalid_config("ipam: missing (the ipam section)"))?;
    let ipam = Obj::of("ipam", ipam_value)?;
    let runtime_config = root
        .get("runtimeConfig")
        .map(|value| Obj::of("runtimeConfig", value))
        .transpose()?;

    let pool = ipam
        .non_empty_str("pool")?
        .map(|text| PoolName::new(text).map_err(|err| CniError::from(err).context("ipam.pool")))
        .transpose()?;
    let agent = ipam
        .non_empty_str("agent")?
        .map(parse_agent_socket)
        .transpose()?;
    let has_ranges = ipam.get("ranges").is_some()
        || ipam.get("subnet").is_some()
        || runtime_config
            .as_ref()
            .is_some_and(|rc| rc.get("ipRanges").is_some());
    let (range_sets, node_pool, requested_pool) = if agent.is_some() && !has_ranges {
        let per_call = per_call_pool(&root, runtime_config.as_ref())?;
        let node_pool = match per_call.clone().or_else(|| pool.clone()) {
            Some(pool) => pool,
            None => PoolName::new(DEFAULT_NODE_POOL)
                .map_err(|err| CniError::internal(err.to_string()))?,
        };
        (Vec::new(), Some(node_pool), per_call)
    } else {
        if agent.is_some() && pool.is_some() {
            return Err(CniError::invalid_config(
                "ipam.pool: with ipam.agent, names a pool of the agent's node scope, which takes \
                 no ranges; give ipam.pool or the ranges (ipam.ranges, ipam.subnet, \
                 runtimeConfig.ipRanges), not both",
            ));
        }
        let mut range_sets = parse_all_range_sets(&ipam, runtime_config.as_ref())?;
        check_overlaps(&range_sets)?;
        let pools = pool_names(&name, pool.as_ref(), &range_sets)?;
        for (set, pool) in range_sets.iter_mut().zip(pools) {
            set.pool = pool;
        }
        (range_sets, None, None)
    };

    let routes = match ipam.get("routes") {
        Some(value) => parse_routes("ipam.routes", value)?,
        None => Vec::new(),
    };
    let data_dir = match ipam.non_empty_str("dataDir")? {
        Some(text) => checked_path("ipam.dataDir", text)?,
        None => PathBuf::from(DEFAULT_DATA_DIR),
    };
    let resolv_conf = ipam
        .non_empty_str("resolvConf")?
        .map(|text| checked_path("ipam.resolvConf", text))
        .transpose()?;
    let ipam_config = IpamConfig {
        plugin_type: ipam.str("type")?.map(str::to_owned),
        range_sets,
        routes,
        data_dir,
        resolv_conf,
        pool,
        exclude: parse_exclusions(&ipam)?,
        cooldown_seconds: ipam.uint("cooldownSeconds", MAX_COOLDOWN_SECONDS)?,
        gc_grace_seconds: ipam.uint("gcGracePeriodSeconds", MAX_GC_GRACE_SECONDS)?,
        gc_max_released: match ipam.uint("gcMaxReleased", MAX_GC_MAX_RELEASED)? {
            Some(0) => {
                return Err(CniError::invalid_config(
                    "ipam.gcMaxReleased: 0 would release nothing; give at least 1",
                ));
            }
            other => other,
        },
        agent,
        node_pool,
        requested_pool,
    };

    let mut config = NetConfig {
        cni_version,
        name,
        ipam: ipam_config,
        requested: Vec::new(),
        prev_result: None,
        valid_attachments: Vec::new(),
    };
    match command {
        Command::Add => {
            config.requested = parse_requested(&root, runtime_config.as_ref(), cni_args)?;
            match &config.ipam.node_pool {
                Some(pool) => check_requested_per_family(&config.requested, pool)?,
                None => assign_requested(&config.requested, &mut config.ipam.range_sets)?,
            }
        }
        Command::Check => {
            config.prev_result = root
                .get("prevResult")
                .map(|value| parse_prev_result("prevResult", value))
                .transpose()?;
        }
        Command::Gc => {
            config.valid_attachments = parse_valid_attachments(&root, &config.name)?;
        }
        Command::Del | Command::Status | Command::Version => {}
    }
    Ok(config)
}

fn parse_version(root: &Obj<'_>) -> Result<CniVersion, CniError> {
    match root.str("cniVersion")? {
        Some(text) => text.parse(),
        None => Err(CniError::new(
            CniError::INCOMPATIBLE_VERSION,
            "cniVersion: missing",
            format!("supported versions: {}", supported_versions_text()),
        )),
    }
}

fn parse_name(root: &Obj<'_>) -> Result<String, CniError> {
    let name = root
        .str("name")?
        .ok_or_else(|| CniError::invalid_config("name: missing (the network name)"))?;
    // `AttachmentKey::new` holds the CNI naming rules; any valid container ID and interface
    // name stand in for the parts that come from the environment.
    AttachmentKey::new(name, "container", "eth0")
        .map_err(|err| CniError::invalid_config(err.to_string()).context("name"))?;
    Ok(name.to_owned())
}

/// Every range set in host-local's order: `runtimeConfig.ipRanges`, the older single range,
/// `ipam.ranges`. Pools are named afterwards.
fn parse_all_range_sets(
    ipam: &Obj<'_>,
    runtime_config: Option<&Obj<'_>>,
) -> Result<Vec<RangeSet>, CniError> {
    let mut sets = Vec::new();
    if let Some(runtime_config) = runtime_config
        && let Some(value) = runtime_config.get("ipRanges")
    {
        sets.extend(parse_range_sets("runtimeConfig.ipRanges", value)?);
    }
    if ipam.get("subnet").is_some() {
        let range = parse_range(*ipam)?;
        sets.push(RangeSet {
            field: "ipam".to_owned(),
            pool: PoolName::default_pool(),
            family: range.family(),
            ranges: vec![range],
            requested: None,
        });
    } else {
        for key in ["rangeStart", "rangeEnd", "gateway"] {
            if ipam.non_empty_str(key)?.is_some() {
                return Err(CniError::invalid_config(format!(
                    "{}: set without ipam.subnet (put ranges in ipam.ranges)",
                    ipam.path_of(key)
                )));
            }
        }
    }
    if let Some(value) = ipam.get("ranges") {
        sets.extend(parse_range_sets("ipam.ranges", value)?);
    }
    if sets.is_empty() {
        if let Some(file) = ipam.non_empty_str("rangeFromFile")? {
            return Err(CniError::unsupported_field("ipam.rangeFromFile", file)
                .with_details("put the range in ipam.ranges"));
        }
        return Err(CniError::invalid_config(
            "ipam: no ranges configured (set ipam.ranges, or the older ipam.subnet)",
        ));
    }
    Ok(sets)
}

fn parse_range_sets(path: &str, value: &Value) -> Result<Vec<RangeSet>, CniError> {
    let mut sets = Vec::new();
    for (i, set_value) in as_array(path, value)?.iter().enumerate() {
        let set_path = index(path, i);
        let items = as_array(&set_path, set_value)?;
        if items.is_empty() {
            return Err(CniError::invalid_config(format!(
                "{set_path}: empty range set"
            )));
        }
        let mut ranges: Vec<RangeSpec> = Vec::with_capacity(items.len());
        for (j, item) in items.iter().enumerate() {
            let range_path = index(&set_path, j);
            let range = parse_range(Obj::of(&range_path, item)?)?;
            if let Some(first) = ranges.first()
                && first.family() != range.family()
            {
                return Err(CniError::invalid_config(format!(
                    "{range_path}: subnet {} is {} but {set_path}[0] is {}; a range set holds one family",
                    range.subnet_net(),
                    range.family(),
                    first.family()
                )));
            }
            ranges.push(range);
        }
        sets.push(RangeSet {
            field: set_path,
            pool: PoolName::default_pool(),
            family: ranges[0].family(),
            ranges,
            requested: None,
        });
    }
    Ok(sets)
}

/// Reads one `{subnet, rangeStart, rangeEnd, gateway}` object.
fn parse_range(range: Obj<'_>) -> Result<RangeSpec, CniError> {
    let path = range.path;
    let subnet_path = range.path_of("subnet");
    let subnet_text = range
        .str("subnet")?
        .ok_or_else(|| CniError::invalid_config(format!("{subnet_path}: missing")))?;
    let subnet = parse_cidr(&subnet_path, subnet_text)?;
    let family = Family::of(subnet.addr());
    let min_prefix = match family {
        Family::V4 => MIN_IPV4_PREFIX,
        Family::V6 => MIN_IPV6_PREFIX,
    };
    if subnet.prefix_len() < min_prefix {
        return Err(CniError::invalid_config(format!(
            "{subnet_path}: {subnet} is too large; {family} subnets must be /{min_prefix} or longer"
        )));
    }
    let read_addr = |key: &str| -> Result<Option<IpAddr>, CniError> {
        range
            .non_empty_str(key)?
            .map(|text| parse_ip(&range.path_of(key), text))
            .transpose()
    };
    let start = read_addr("rangeStart")?;
    let end = read_addr("rangeEnd")?;
    let explicit_gateway = read_addr("gateway")?;
    let gateway = explicit_gateway.or_else(|| default_gateway(subnet));
    let spec = RangeSpec::new(subnet, start, end, gateway).map_err(|err| range_error(path, err))?;
    if let Some(gateway) = explicit_gateway
        && !subnet.contains(&gateway)
    {
        return Err(CniError::invalid_config(format!(
            "{}: gateway {gateway} is not in subnet {subnet}",
            range.path_of("gateway")
        )));
    }
    Ok(spec)
}

/// host-local's default gateway: the subnet's first address after the network address.
/// Point-to-point subnets (/31, /32, /127, /128) get none: every address is a host.
fn default_gateway(subnet: IpNet) -> Option<IpAddr> {
    let family = Family::of(subnet.addr());
    if subnet.prefix_len() + 1 >= family.bits() {
        return None;
    }
    Some(family.addr(addr_value(subnet.network()) + 1))
}

/// A `SpecError` about a range, with the path of the field it concerns.
fn range_error(path: &str, err: SpecError) -> CniError {
    let key = match &err {
        SpecError::HostBitsSet { .. } => Some("subnet"),
        SpecError::StartAfterEnd { .. } => Some("rangeStart"),
        SpecError::OutsideSubnet { what, .. }
        | SpecError::FamilyMismatch { what, .. }
        | SpecError::ReservedBound { what, .. } => match *what {
            "start" => Some("rangeStart"),
            "end" => Some("rangeEnd"),
            "gateway" => Some("gateway"),
            _ => None,
        },
        _ => None,
    };
    let field = key.map_or_else(|| path.to_owned(), |key| join(path, key));
    CniError::from(err).context(&field)
}

/// Refuses any two ranges, in the same set or not, whose `start..=end` intersect (host-local
/// refuses the same).
fn check_overlaps(sets: &[RangeSet]) -> Result<(), CniError> {
    struct Bounds<'a> {
        family: Family,
        start: u128,
        end: u128,
        order: usize,
        field: String,
        range: &'a RangeSpec,
    }
    let mut all: Vec<Bounds<'_>> = Vec::new();
    for set in sets {
        for (j, range) in set.ranges.iter().enumerate() {
            let field = if set.field == "ipam" {
                "ipam".to_owned()
            } else {
                index(&set.field, j)
            };
            all.push(Bounds {
                family: range.family(),
                start: addr_value(range.start()),
                end: addr_value(range.end()),
                order: all.len(),
                field,
                range,
            });
        }
    }
    all.sort_by_key(|b| (b.family, b.start, b.end));
    // Sorted by start, a range overlaps an earlier one exactly when it starts at or before
    // the furthest end seen so far in its family.
    let mut furthest: Option<&Bounds<'_>> = None;
    for bounds in &all {
        if let Some(previous) = furthest
            && previous.family == bounds.family
            && bounds.start <= previous.end
        {
            let (first, second) = if previous.order < bounds.order {
                (previous, bounds)
            } else {
                (bounds, previous)
            };
            return Err(CniError::invalid_config(format!(
                "{} ({}-{}) overlaps {} ({}-{})",
                second.field,
                second.range.start(),
                second.range.end(),
                first.field,
                first.range.start(),
                first.range.end()
            )));
        }
        if furthest.is_none_or(|f| f.family != bounds.family || bounds.end > f.end) {
            furthest = Some(bounds);
        }
    }
    Ok(())
}

/// The pool of each range set: see [`RangeSet::pool`].
fn pool_names(
    network: &str,
    pool: Option<&PoolName>,
    sets: &[RangeSet],
) -> Result<Vec<PoolName>, CniError> {
    let base = pool.map_or(network, PoolName::as_str);
    let mut n_of_family = [0usize; 2];
    sets.iter()
        .map(|set| {
            let n = &mut n_of_family[usize::from(set.family == Family::V6)];
            *n += 1;
            let suffix = if *n == 1 {
                String::new()
            } else {
                format!("-{n}")
            };
            pool_name(base, &suffix)
        })
        .collect()
}

/// `base` followed by `suffix` as a pool name. Network names may be up to 253 bytes and pool
/// names only 63, so a longer name keeps its first bytes and gets a hash of the whole name,
/// which keeps distinct networks in distinct pools and the same network always in the same
/// pool. `base` must itself be a valid network or pool name (code 7 otherwise).
pub fn pool_name(base: &str, suffix: &str) -> Result<PoolName, CniError> {
    let full = format!("{base}{suffix}");
    if let Ok(name) = PoolName::new(&full) {
        return Ok(name);
    }
    // FNV-1a: stable across builds and platforms, unlike std's randomly seeded hasher.
    let hash = full.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let tail = format!("-{hash:08x}{suffix}");
    let keep = corral_core::MAX_POOL_NAME_LEN - tail.len();
    // Network and pool names are ASCII, so any byte index is a char boundary.
    let head = base.get(..keep.min(base.len())).unwrap_or(base);
    PoolName::new(&format!("{head}{tail}")).map_err(|err| CniError::from(err).context("pool name"))
}

fn parse_exclusions(ipam: &Obj<'_>) -> Result<Vec<Exclusion>, CniError> {
    let path = ipam.path_of("exclude");
    let mut exclusions = Vec::new();
    for (i, item) in ipam.array("exclude")?.into_iter().flatten().enumerate() {
        let item_path = index(&path, i);
        let (network, network_path, reason) = match item {
            Value::String(text) => (text.as_str(), item_path.clone(), DEFAULT_EXCLUSION_REASON),
            Value::Object(_) => {
                let object = Obj::of(&item_path, item)?;
                let network = object.str("network")?.ok_or_else(|| {
                    CniError::invalid_config(format!("{}: missing", object.path_of("network")))
                })?;
                let reason = object.str("reason")?.unwrap_or(DEFAULT_EXCLUSION_REASON);
                (network, object.path_of("network"), reason)
            }
            other => {
                return Err(wrong_type(
                    &item_path,
                    "an address, a cidr or {\"network\", \"reason\"}",
                    other,
                ));
            }
        };
        let network = corral_core::parse_net(network)
            .map_err(|err| CniError::from(err).context(&network_path))?;
        let exclusion = Exclusion::new(network, reason).map_err(|err| match err {
            SpecError::InvalidExclusionReason { .. } => CniError::invalid_config(format!(
                "{}: at most 1024 bytes without control characters",
                join(&item_path, "reason")
            )),
            other => CniError::from(other).context(&network_path),
        })?;
        exclusions.push(exclusion);
    }
    Ok(exclusions)
}

/// A path from the config, refusing what no system call can open.
fn checked_path(path: &str, text: &str) -> Result<PathBuf, CniError> {
    if text.contains('\0') {
        return Err(CniError::invalid_config(format!(
            "{path}: {text:?} contains a NUL byte"
        )));
    }
    Ok(PathBuf::from(text))
}

fn parse_agent_socket(text: &str) -> Result<PathBuf, CniError> {
    let path = checked_path("ipam.agent", text)?;
    if !Path::new(text).is_absolute() {
        return Err(CniError::invalid_config(format!(
            "ipam.agent: socket path {text:?} is not absolute"
        )));
    }
    if text.len() > MAX_SOCKET_PATH_LEN {
        return Err(CniError::invalid_config(format!(
            "ipam.agent: socket path is {} bytes, more than the {MAX_SOCKET_PATH_LEN} a unix socket allows",
            text.len()
        )));
    }
    Ok(path)
}

/// The `args.cni` object of the configuration, when it has one (each level checked to be an
/// object).
fn args_cni<'a>(root: &Obj<'a>) -> Result<Option<Obj<'a>>, CniError> {
    let args = root.get("args").map(|v| Obj::of("args", v)).transpose()?;
    args.and_then(|args| args.get("cni"))
        .map(|v| Obj::of("args.cni", v))
        .transpose()
}

/// The pool a call names for itself: `runtimeConfig.pool`, else `args.cni.pool`.
fn per_call_pool(
    root: &Obj<'_>,
    runtime_config: Option<&Obj<'_>>,
) -> Result<Option<PoolName>, CniError> {
    let args_cni = args_cni(root)?;
    for source in [runtime_config, args_cni.as_ref()].into_iter().flatten() {
        if let Some(text) = source.non_empty_str("pool")? {
            let pool = PoolName::new(text)
                .map_err(|err| CniError::from(err).context(&source.path_of("pool")))?;
            return Ok(Some(pool));
        }
    }
    Ok(None)
}

/// A node pool hands out one address per family, so at most one may be requested of each
/// (code 102 otherwise).
fn check_requested_per_family(requested: &[IpAddr], pool: &PoolName) -> Result<(), CniError> {
    for (i, addr) in requested.iter().enumerate() {
        if let Some(other) = requested[..i]
            .iter()
            .find(|other| Family::of(**other) == Family::of(*addr))
        {
            return Err(CniError::new(
                CniError::ADDRESS_UNAVAILABLE,
                format!(
                    "requested addresses {other} and {addr} are both {}, and pool {pool} of the \
                     agent hands out one address per family",
                    Family::of(*addr)
                ),
                "",
            ));
        }
    }
    Ok(())
}

/// Every requested address once: `CNI_ARGS` first, then `args.cni.ips`, then
/// `runtimeConfig.ips`.
fn parse_requested(
    root: &Obj<'_>,
    runtime_config: Option<&Obj<'_>>,
    cni_args: &CniArgs,
) -> Result<Vec<IpAddr>, CniError> {
    let mut requested = cni_args.ips.clone();
    let args_cni = args_cni(root)?;
    for source in [args_cni.as_ref(), runtime_config].into_iter().flatten() {
        let path = source.path_of("ips");
        for (i, item) in source.array("ips")?.into_iter().flatten().enumerate() {
            let item_path = index(&path, i);
            let text = as_str(&item_path, item)?;
            let addr = parse_requested_ip(text).ok_or_else(|| {
                CniError::invalid_config(format!("{item_path}: invalid address {text:?}"))
            })?;
            requested.push(addr);
        }
    }
    let mut seen = HashSet::with_capacity(requested.len());
    requested.retain(|addr| seen.insert(*addr));
    Ok(requested)
}

/// Gives each requested address to the range set whose ranges hold it (code 102 when none
/// does, or when two fall in one set, which hands out one address).
fn assign_requested(requested: &[IpAddr], sets: &mut [RangeSet]) -> Result<(), CniError> {
    for &addr in requested {
        let set = sets
            .iter_mut()
            .find(|set| set.contains(addr))
            .ok_or_else(|| {
                CniError::new(
                    CniError::ADDRESS_UNAVAILABLE,
                    format!("requested address {addr} is not in any configured range"),
                    "",
                )
            })?;
        if let Some(other) = set.requested {
            return Err(CniError::new(
                CniError::ADDRESS_UNAVAILABLE,
                format!(
                    "requested addresses {other} and {addr} are both in range set {}, which hands out one address",
                    set.field
                ),
                "",
            ));
        }
        set.requested = Some(addr);
    }
    Ok(())
}

/// The attachments GC must keep: the union of `cni.dev/valid-attachments` and
/// `cni.dev/attachments`. Without either, GC is refused: an empty list would release
/// everything.
fn parse_valid_attachments(root: &Obj<'_>, network: &str) -> Result<Vec<AttachmentKey>, CniError> {
    let mut keys: Vec<AttachmentKey> = Vec::new();
    let mut seen: HashSet<AttachmentKey> = HashSet::new();
    let mut found = false;
    for list_key in [VALID_ATTACHMENTS, ATTACHMENTS] {
        let Some(items) = root.array(list_key)? else {
            continue;
        };
        found = true;
        for (i, item) in items.iter().enumerate() {
            let item_path = index(list_key, i);
            let attachment = Obj::of(&item_path, item)?;
            let read = |key: &str| {
                attachment.str(key)?.ok_or_else(|| {
                    CniError::invalid_config(format!("{}: missing", attachment.path_of(key)))
                })
            };
            let container_id = read("containerID")?;
            let ifname = read("ifname")?;
            let key = AttachmentKey::new(network, container_id, ifname)
                .map_err(|err| CniError::invalid_config(err.to_string()).context(&item_path))?;
            if seen.insert(key.clone()) {
                keys.push(key);
            }
        }
    }
    if !found {
        return Err(CniError::invalid_config(format!(
            "{VALID_ATTACHMENTS}: missing; GC without it would release every allocation"
        )));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(command: Command, ipam: &str, extra: &str) -> Result<NetConfig, CniError> {
        let stdin = format!(
            r#"{{"cniVersion":"1.1.0","name":"podnet","type":"bridge","ipam":{ipam}{extra}}}"#
        );
        parse_config(command, stdin.as_bytes(), &CniArgs::default())
    }

    fn node_pool(ipam: &str, extra: &str) -> Option<String> {
        parse(Command::Add, ipam, extra)
            .unwrap()
            .ipam
            .node_pool
            .map(|p| p.to_string())
    }

    const AGENT: &str = r#""type":"corral-ipam","agent":"/run/corral/agent.sock""#;

    #[test]
    fn agent_mode_without_ranges_allocates_from_the_node_pool_default_by_default() {
        let config = parse(Command::Add, &format!("{{{AGENT}}}"), "").unwrap();
        assert_eq!(config.ipam.node_pool.unwrap().as_str(), DEFAULT_NODE_POOL);
        assert!(config.ipam.range_sets.is_empty());
        for command in [Command::Del, Command::Check, Command::Status] {
            let config = parse(command, &format!("{{{AGENT}}}"), "").unwrap();
            assert_eq!(config.ipam.node_pool.unwrap().as_str(), "default");
        }
    }

    #[test]
    fn the_node_pool_comes_from_the_call_then_the_configuration() {
        let ipam = format!(r#"{{{AGENT},"pool":"pods"}}"#);
        assert_eq!(node_pool(&ipam, "").as_deref(), Some("pods"));
        let args = r#","args":{"cni":{"pool":"blue"}}"#;
        assert_eq!(node_pool(&ipam, args).as_deref(), Some("blue"));
        let runtime = r#","args":{"cni":{"pool":"blue"}},"runtimeConfig":{"pool":"green"}"#;
        assert_eq!(node_pool(&ipam, runtime).as_deref(), Some("green"));
        let error = parse(Command::Add, &ipam, r#","runtimeConfig":{"pool":"../x"}"#).unwrap_err();
        assert_eq!(error.code, CniError::INVALID_NETWORK_CONFIG);
        assert!(error.msg.contains("runtimeConfig.pool"), "{error:?}");
    }

    #[test]
    fn agent_mode_with_pool_and_ranges_is_refused() {
        for ranges in [
            r#""ranges":[[{"subnet":"10.0.0.0/24"}]]"#,
            r#""subnet":"10.0.0.0/24""#,
        ] {
            let ipam = format!(r#"{{{AGENT},"pool":"pods",{ranges}}}"#);
            let error = parse(Command::Add, &ipam, "").unwrap_err();
            assert_eq!(error.code, CniError::INVALID_NETWORK_CONFIG, "{error:?}");
            assert!(error.msg.contains("ipam.pool"), "{error:?}");
            assert!(error.msg.contains("not both"), "{error:?}");
        }
        // Ranges from the runtime count too.
        let ipam = format!(r#"{{{AGENT},"pool":"pods"}}"#);
        let runtime = r#","runtimeConfig":{"ipRanges":[[{"subnet":"10.0.0.0/24"}]]}"#;
        assert!(parse(Command::Add, &ipam, runtime).is_err());
        // Agent mode with ranges and no pool is as before.
        let ipam = format!(r#"{{{AGENT},"ranges":[[{{"subnet":"10.0.0.0/24"}}]]}}"#);
        let config = parse(Command::Add, &ipam, "").unwrap();
        assert_eq!(config.ipam.node_pool, None);
        assert_eq!(config.ipam.range_sets[0].pool.as_str(), "podnet");
    }

    #[test]
    fn without_the_agent_a_configuration_without_ranges_is_refused_as_before() {
        for ipam in [
            r#"{"type":"corral-ipam"}"#,
            r#"{"type":"corral-ipam","pool":"x"}"#,
        ] {
            let error = parse(Command::Add, ipam, "").unwrap_err();
            assert_eq!(error.code, CniError::INVALID_NETWORK_CONFIG);
            assert!(error.msg.contains("ipam.ranges"), "{error:?}");
        }
    }

    #[test]
    fn a_node_pool_takes_one_requested_address_per_family() {
        let ipam = format!("{{{AGENT}}}");
        let one_each = r#","runtimeConfig":{"ips":["10.77.0.9","fd77::9"]}"#;
        let config = parse(Command::Add, &ipam, one_each).unwrap();
        assert_eq!(config.requested.len(), 2);
        let two_v4 = r#","runtimeConfig":{"ips":["10.77.0.9","10.77.0.10"]}"#;
        let error = parse(Command::Add, &ipam, two_v4).unwrap_err();
        assert_eq!(error.code, CniError::ADDRESS_UNAVAILABLE, "{error:?}");
    }
}
