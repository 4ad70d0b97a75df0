//! `corral history`: the agent's allocation history, through its socket. Who held an address
//! at an instant (`corral history ADDRESS --at TIME`), or the events of an address, a pod, an
//! attachment or a time span, newest first.
//!
//! With `--etcd` (or `CORRAL_ETCD`) it answers cluster-wide: the grants' history in etcd
//! (`history_cluster`) names the node whose node CIDR or block held the address then, beside
//! this node's agent's own events; `--node N` lists what a node held, from etcd alone.

use std::net::IpAddr;

use clap::Args;
use corral_api::history::{HistoryFilter, format_time, parse_time};
use corral_api::operator::GrantHistory;
use corral_api::{HistoryEvent, HistoryKind, HistoryResponse};
use corral_client::Client;
use corral_operator::history::HistoryRequest;
use serde::Serialize;

use crate::commands::Session;
use crate::exit::{Failure, Outcome};
use crate::output::Table;

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only the events of this address
    #[arg(value_name = "ADDRESS")]
    address: Option<String>,
    /// Who held ADDRESS at this instant: RFC 3339 (2026-11-27T14:02:00Z; UTC when the zone is
    /// left out) or milliseconds since the epoch
    #[arg(long, value_name = "TIME", requires = "address")]
    at: Option<String>,
    /// Only the events of this pod (NAMESPACE/NAME), or of this owner of `corral alloc`
    #[arg(long, value_name = "NS/NAME")]
    pod: Option<String>,
    /// Only the events of this attachment: CONTAINER_ID or CONTAINER_ID/IFNAME
    #[arg(long, value_name = "CONTAINER[/IFNAME]")]
    key: Option<String>,
    /// Only events at or after this time (as --at)
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only events at or before this time (as --at)
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// At most this many events, newest first
    #[arg(long, value_name = "N", default_value_t = corral_api::history::DEFAULT_HISTORY_LIMIT,
          value_parser = clap::value_parser!(u64).range(1..=corral_api::history::MAX_HISTORY_LIMIT))]
    limit: u64,
    /// etcd (optional): answer cluster-wide, adding the grants' history (which node held the
    /// node CIDR or block containing ADDRESS, at --at)
    #[command(flatten)]
    etcd: crate::cluster::MaybeEtcd,
    /// Everything this node held and holds, from the grants' history in etcd (needs --etcd;
    /// the agent is not asked)
    #[arg(long, value_name = "NODE", conflicts_with_all = ["address", "pod", "key"])]
    node: Option<String>,
}

impl HistoryArgs {
    /// The cluster-wide read the arguments ask for: with --etcd, an address or --node (the
    /// cluster knows no pods); a usage error before anything is sent.
    fn cluster_request(&self) -> Result<Option<HistoryRequest>, Failure> {
        if self.etcd.given().is_none() {
            if self.node.is_some() {
                return Err(Failure::Usage(
                    "--node reads the grants' history in etcd: give --etcd (or CORRAL_ETCD)".into(),
                ));
            }
            return Ok(None);
        }
        if self.address.is_none() && self.node.is_none() {
            return Ok(None);
        }
        let options = crate::history_cluster::HistoryOptions {
            target: self.address.clone(),
            node: self.node.clone(),
            at: self.at.clone(),
            limit: usize::try_from(self.limit).unwrap_or(usize::MAX),
        };
        options.request().map(Some)
    }

    fn cluster_options(&self) -> crate::history_cluster::HistoryOptions {
        crate::history_cluster::HistoryOptions {
            target: self.address.clone(),
            node: self.node.clone(),
            at: self.at.clone(),
            limit: 0,
        }
    }

    /// The filter the arguments ask for; a bad address or time is a usage error (exit 2), found
    /// before anything is sent.
    pub fn filter(&self) -> Result<HistoryFilter, Failure> {
        let time = |flag: &str, text: &Option<String>| {
            text.as_deref()
                .map(|text| parse_time(text).map_err(|e| Failure::Usage(format!("{flag}: {e}"))))
                .transpose()
        };
        let address = self
            .address
            .as_deref()
            .map(|text| {
                text.parse::<IpAddr>().map_err(|_| {
                    Failure::Usage(format!(
                        "{text:?} is not an IP address (give ADDRESS as 10.0.3.7 or fd00::7)"
                    ))
                })
            })
            .transpose()?;
        let filter = HistoryFilter {
            address,
            at: time("--at", &self.at)?,
            pod: self.pod.clone(),
            key: self.key.clone(),
            since: time("--since", &self.since)?,
            until: time("--until", &self.until)?,
            limit: Some(self.limit),
        };
        if let (Some(since), Some(until)) = (filter.since, filter.until)
            && since > until
        {
            return Err(Failure::Usage("--since is after --until".into()));
        }
        Ok(filter)
    }
}

/// The agent's events that `filter` selects (and, with an address and `at`, who held it then).
pub fn agent_history(
    client: &mut Client,
    filter: &HistoryFilter,
) -> Result<HistoryResponse, Failure> {
    Ok(client.history(filter)?)
}

/// What `corral history` answers: the cluster's grants (with --etcd) and the agent's events
/// (not with --node). As JSON the agent's answer keeps its own fields, and `cluster` is added.
#[derive(Debug, Serialize)]
struct Answer {
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<GrantHistory>,
    #[serde(flatten)]
    agent: Option<HistoryResponse>,
}

/// `corral history`: every usage error before anything is asked, then etcd, then the agent.
pub fn run(mut session: Session, args: HistoryArgs) -> Result<Outcome, Failure> {
    let filter = args.filter()?;
    let cluster_request = args.cluster_request()?;
    let cluster = match (&cluster_request, args.etcd.given()) {
        (Some(request), Some(etcd)) => Some(crate::cluster::grant_history(&etcd, request)?),
        _ => None,
    };
    let agent = match args.node {
        Some(_) => None,
        None => Some(agent_history(&mut session.client, &filter)?),
    };
    let answer = Answer { cluster, agent };
    session.render(&answer, |answer| {
        let mut text = String::new();
        if let Some(cluster) = &answer.cluster {
            text.push_str("the cluster's grants (etcd):\n");
            text.push_str(&crate::history_cluster::table(
                &cluster.events,
                &args.cluster_options(),
            ));
            if answer.agent.is_some() {
                text.push_str(
                    "\nthis node's agent (each node's agent keeps its pods' history: \
                     `corral history` there):\n",
                );
            }
        }
        if let Some(agent) = &answer.agent {
            text.push_str(&render(&filter, agent));
        }
        text
    })
}

fn kind(kind: HistoryKind) -> &'static str {
    match kind {
        HistoryKind::Allocated => "allocated",
        HistoryKind::Released => "released",
        HistoryKind::Expired => "expired",
        HistoryKind::Collected => "collected",
        HistoryKind::Surrendered => "surrendered",
    }
}

fn key_text(event: &HistoryEvent) -> String {
    event
        .key
        .as_ref()
        .map(|k| format!("{}/{}/{}", k.network, k.container_id, k.ifname))
        .unwrap_or_else(|| "-".into())
}

/// The events as a table, after the answer to `--at` when it was asked.
fn render(filter: &HistoryFilter, response: &HistoryResponse) -> String {
    let mut text = String::new();
    if let (Some(address), Some(at), Some(held)) = (filter.address, filter.at, &response.held) {
        let at = format_time(at);
        if held.is_empty() {
            text.push_str(&format!("{address} at {at}: held by nobody\n"));
        }
        for event in held {
            text.push_str(&format!(
                "{address} at {at}: held by {} (pool {}, scope {}, key {}, generation {}, since {})\n",
                event.owner,
                event.pool,
                event.scope,
                key_text(event),
                event.generation,
                event.at
            ));
        }
        text.push('\n');
    }
    if response.events.is_empty() {
        text.push_str("no events\n");
        return text;
    }
    let mut table = Table::new(&[
        "TIME",
        "EVENT",
        "ADDRESS",
        "SCOPE",
        "POOL",
        "OWNER",
        "KEY",
        "GENERATION",
    ])
    .right(&["GENERATION"]);
    for event in &response.events {
        table.push(vec![
            event.at.clone(),
            kind(event.event).to_owned(),
            event.address.to_string(),
            event.scope.clone(),
            event.pool.clone(),
            event.owner.clone(),
            key_text(event),
            event.generation.to_string(),
        ]);
    }
    text.push_str(&table.render());
    text
}
