//! Reading the grants' history from etcd (`corral_cluster::history`): who held an address or a
//! CIDR (at a time), everything a node held, the newest events. Each answer joins the grants
//! still held (`grants/`, their `granted_ms`) with the ended ones (`history/`), newest first.
//! The operator's `GET /v1/history` and `corral cluster history` both read through [`read`].
//!
//! Cheap range reads: an address is looked up under the one CIDR of its pool's prefix length
//! that contains it (one `grants/` key and one `history/cidr/` prefix per pool that contains
//! it), a node under `owned/<node>/` and `history/node/<node>/`; the newest events: the
//! grants held from the leader's view when given (else every `grants/` key), and the last
//! `limit` keys of `history/at/` (with a time, from a window that grows until it holds
//! `limit` of them).

use std::net::IpAddr;

use corral_cluster::history::{HistoryEvent, newest_first};
use corral_cluster::{
    CloudInterfaceRecord, ClusterConfig, Family, GrantRecord, HistoryRecord, IpNet, Key, Keys,
    NodeName, PoolName, decode_value,
};
use corral_kv::{KeyValue, Kv, KvError};

/// What to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryQuery {
    /// Who held the address (each pool whose range contains it).
    Address(IpAddr),
    /// Who held the CIDR (a node CIDR or block of any pool).
    Cidr(IpNet),
    /// Everything a node held.
    Node(NodeName),
    /// The newest events of the cluster.
    Newest,
}

impl HistoryQuery {
    /// Who held `target`: an IP address, else a CIDR (its host bits cleared); `None` when it is
    /// neither.
    pub fn address_or_cidr(target: &str) -> Option<HistoryQuery> {
        if let Ok(ip) = target.parse::<IpAddr>() {
            Some(HistoryQuery::Address(ip))
        } else {
            let cidr = target.parse::<IpNet>().ok()?;
            Some(HistoryQuery::Cidr(cidr.trunc()))
        }
    }
}

/// A history read: the query, the time it must cover (if any) and at most how many events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRequest {
    /// What to read.
    pub query: HistoryQuery,
    /// Only the events that held their CIDR at this time (milliseconds since the epoch).
    pub at_ms: Option<u64>,
    /// At most this many events, newest first.
    pub limit: usize,
}

/// `events` as the operator's API and `corral cluster history -o json` answer them.
pub fn to_wire(events: Vec<HistoryEvent>) -> corral_api::operator::GrantHistory {
    corral_api::operator::GrantHistory {
        events: events
            .into_iter()
            .map(|e| corral_api::operator::GrantEvent {
                pool: e.pool.to_string(),
                family: e.family().name().to_owned(),
                cidr: e.cidr.to_string(),
                node: e.node.to_string(),
                from_ms: e.from_ms,
                to_ms: e.to_ms,
                why: e.why.map(|why| why.as_str().to_owned()),
            })
            .collect(),
    }
}

/// The page size of history reads.
const PAGE: usize = 1000;

/// Reads the events `request` asks for, newest first (`config`: the cluster's, for the pools'
/// ranges and prefix lengths; `now_ms`: where the newest events' window ends).
pub async fn read<K: Kv>(
    kv: &K,
    keys: &Keys,
    config: &ClusterConfig,
    request: &HistoryRequest,
    now_ms: u64,
) -> Result<Vec<HistoryEvent>, KvError> {
    read_with_held(kv, keys, config, request, now_ms, None).await
}

/// [`read`], with the grants held given (`held`: the leader's view,
/// `ClusterView::held_events`) for the newest events: then no `grants/` key is read, and
/// without `at_ms` the ended ones are the last `limit` keys of `history/at/`, one request.
pub async fn read_with_held<K: Kv>(
    kv: &K,
    keys: &Keys,
    config: &ClusterConfig,
    request: &HistoryRequest,
    now_ms: u64,
    held: Option<Vec<HistoryEvent>>,
) -> Result<Vec<HistoryEvent>, KvError> {
    let mut events = match &request.query {
        HistoryQuery::Address(address) => {
            let mut events = Vec::new();
            for (pool, cidr) in cidrs_of_address(config, *address) {
                events.extend(of_cidr(kv, keys, &pool, &cidr).await?);
            }
            events
        }
        HistoryQuery::Cidr(cidr) => {
            let family = corral_cluster::net::family_of(cidr);
            let mut events = Vec::new();
            for pool in &config.pools {
                if pool.families().any(|(f, _)| f == family) {
                    events.extend(of_cidr(kv, keys, &pool.name, cidr).await?);
                }
            }
            events
        }
        HistoryQuery::Node(node) => of_node(kv, keys, node).await?,
        HistoryQuery::Newest => match held {
            Some(mut events) if request.at_ms.is_none() => {
                let last = kv
                    .range_last(keys.history_at_prefix().as_bytes(), request.limit)
                    .await?;
                events.extend(ended(&last));
                events
            }
            held => newest(kv, keys, request, now_ms, held).await?,
        },
    };
    if let Some(at) = request.at_ms {
        events.retain(|e| e.covers(at));
    }
    newest_first(&mut events, request.limit);
    Ok(events)
}

/// The CIDR of each pool's prefix length that contains `address`, in the pools whose ranges
/// contain it; in a cloud pool each CIDR that could hold it as an address or
/// a delegated prefix.
fn cidrs_of_address(config: &ClusterConfig, address: IpAddr) -> Vec<(PoolName, IpNet)> {
    let family = match address {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    };
    let mut out = Vec::new();
    for pool in &config.pools {
        // A cloud pool's addresses are single addresses or delegated prefixes (a /28 of IPv4,
        // an /80 of IPv6) of the cloud's subnets: each length that could hold it.
        if pool.is_cloud() {
            let shortest = if family == Family::V4 { 28 } else { 80 };
            out.extend(
                corral_cluster::history::containing(address, shortest)
                    .into_iter()
                    .map(|cidr| (pool.name.clone(), cidr)),
            );
            continue;
        }
        for (f, family_config) in pool.families() {
            let inside = family_config.cidrs.iter().any(|c| c.contains(&address));
            if f != family || !inside || family_config.node_prefix_len == 0 {
                continue;
            }
            if let Ok(cidr) = IpNet::new(address, family_config.node_prefix_len) {
                out.push((pool.name.clone(), cidr.trunc()));
            }
        }
    }
    out
}

/// Every key under `prefix` after `after` (at the current revision, in bounded ranges: a
/// prefix of 200,000 grants is walked about twice, not once a page).
async fn range_from<K: Kv>(
    kv: &K,
    prefix: &str,
    after: Option<Vec<u8>>,
) -> Result<Vec<KeyValue>, KvError> {
    let mut scan = corral_kv::Scan::new(prefix.as_bytes(), PAGE);
    if let Some(mut after) = after {
        after.push(0);
        scan = scan.starting_at(&after);
    }
    Ok(scan.read_all(kv).await?.0)
}

/// The ended events among `entries` (values that do not decode are left out).
fn ended(entries: &[KeyValue]) -> impl Iterator<Item = HistoryEvent> + '_ {
    entries
        .iter()
        .filter_map(|e| decode_value::<HistoryRecord>(&e.value).ok())
        .map(HistoryEvent::ended)
}

/// The grant of `cidr` in `pool` if held, as an event.
async fn held<K: Kv>(
    kv: &K,
    keys: &Keys,
    pool: &PoolName,
    cidr: &IpNet,
) -> Result<Option<HistoryEvent>, KvError> {
    let family = corral_cluster::net::family_of(cidr);
    let grant = kv.get(keys.grant(pool, family, cidr).as_bytes()).await?;
    Ok(grant
        .and_then(|e| decode_value::<GrantRecord>(&e.value).ok())
        .map(|g| HistoryEvent::held(pool, cidr, &g)))
}

/// Every holder of one CIDR of one pool.
async fn of_cidr<K: Kv>(
    kv: &K,
    keys: &Keys,
    pool: &PoolName,
    cidr: &IpNet,
) -> Result<Vec<HistoryEvent>, KvError> {
    let family = corral_cluster::net::family_of(cidr);
    let prefix = keys.history_of_cidr_prefix(pool, family, cidr);
    let mut events: Vec<HistoryEvent> = ended(&range_from(kv, &prefix, None).await?).collect();
    events.extend(held(kv, keys, pool, cidr).await?);
    Ok(events)
}

/// Everything a node held and holds: its grants, and its cloud interfaces' addresses.
async fn of_node<K: Kv>(
    kv: &K,
    keys: &Keys,
    node: &NodeName,
) -> Result<Vec<HistoryEvent>, KvError> {
    let prefix = keys.history_of_node_prefix(node);
    let mut events: Vec<HistoryEvent> = ended(&range_from(kv, &prefix, None).await?).collect();
    for entry in range_from(kv, &keys.owned_prefix(node), None).await? {
        if let Ok(Key::Owned { pool, cidr, .. }) = keys.parse(&entry.key_str()) {
            events.extend(
                held(kv, keys, &pool, &cidr)
                    .await?
                    .filter(|e| &e.node == node),
            );
        }
    }
    // Cloud addresses and prefixes its interface records hold, since they were assigned (a
    // record written before the records kept that time does not say).
    let prefix = keys.cloud_interfaces_of_node_prefix(node);
    for entry in range_from(kv, &prefix, None).await? {
        if let Ok(record) = decode_value::<CloudInterfaceRecord>(&entry.value) {
            events.extend(record.addresses.iter().map(|cidr| HistoryEvent {
                pool: record.pool.clone(),
                cidr: *cidr,
                node: node.clone(),
                from_ms: record.assigned_ms.get(cidr).copied(),
                to_ms: None,
                why: None,
            }));
        }
    }
    Ok(events)
}

/// The newest events: every grant held (`held`, else read from `grants/`), and the ended
/// ones from a window before `now_ms` that grows (from an hour) until it holds `limit` events
/// or covers the whole history.
async fn newest<K: Kv>(
    kv: &K,
    keys: &Keys,
    request: &HistoryRequest,
    now_ms: u64,
    held: Option<Vec<HistoryEvent>>,
) -> Result<Vec<HistoryEvent>, KvError> {
    let mut events = Vec::new();
    match held {
        Some(held) => events = held,
        None => {
            for entry in range_from(kv, &keys.grants_prefix(), None).await? {
                if let Ok(Key::Grant { pool, cidr, .. }) = keys.parse(&entry.key_str())
                    && let Ok(grant) = decode_value::<GrantRecord>(&entry.value)
                {
                    events.push(HistoryEvent::held(&pool, &cidr, &grant));
                }
            }
        }
    }
    let prefix = keys.history_at_prefix();
    let mut window: u64 = 3_600_000;
    loop {
        let since = now_ms.saturating_sub(window);
        let after = (since > 0)
            .then(|| format!("{prefix}{}", corral_cluster::keys::time_segment(since)).into_bytes());
        let found: Vec<HistoryEvent> = ended(&range_from(kv, &prefix, after).await?)
            .filter(|e| request.at_ms.is_none_or(|at| e.covers(at)))
            .collect();
        if found.len() >= request.limit || since == 0 {
            events.extend(found);
            return Ok(events);
        }
        window = window.saturating_mul(4);
    }
}
