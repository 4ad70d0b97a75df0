//! `corral cluster history ADDRESS|CIDR [--at TIME]` and `corral cluster history --node N`:
//! the grants of node CIDRs and blocks (who, from, to, why they ended), newest first, read from
//! etcd directly (`corral_operator::history::read`, as the operator's `GET /v1/history`), so
//! they answer whether or not an operator runs. [`events`] gives the same answer as data.

use clap::Args;
use corral_api::operator::{GrantEvent, GrantHistory, parse_at};
use corral_cluster::{ClusterConfig, Keys, NodeName};
use corral_kv::Kv;
use corral_operator::history::{HistoryQuery, HistoryRequest, read};

use crate::Output;
use crate::exit::{Failure, Outcome};

/// What `corral cluster history` asks.
#[derive(Debug, Args)]
pub struct HistoryOptions {
    /// An address (who held the node CIDR or block containing it) or a CIDR
    #[arg(
        value_name = "ADDRESS|CIDR",
        required_unless_present = "node",
        conflicts_with = "node"
    )]
    pub target: Option<String>,
    /// Everything this node held and holds
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Only the grants held at this time: RFC 3339 in UTC (2026-11-27T14:02:00Z) or
    /// milliseconds since the epoch
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// At most this many events, newest first
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

impl HistoryOptions {
    /// The read the options ask for (usage errors name the argument).
    pub fn request(&self) -> Result<HistoryRequest, Failure> {
        let query = match (&self.target, &self.node) {
            (Some(target), None) => HistoryQuery::address_or_cidr(target).ok_or_else(|| {
                Failure::Usage(format!("{target:?} is neither an address nor a CIDR"))
            })?,
            (None, Some(node)) => HistoryQuery::Node(
                NodeName::new(node).map_err(|e| Failure::Usage(format!("--node: {e}")))?,
            ),
            _ => return Err(Failure::Usage("give ADDRESS|CIDR or --node".into())),
        };
        let at_ms = self
            .at
            .as_deref()
            .map(parse_at)
            .transpose()
            .map_err(|e| Failure::Usage(format!("--at: {e}")))?;
        if self.limit == 0 {
            return Err(Failure::Usage("--limit: at least 1".into()));
        }
        Ok(HistoryRequest {
            query,
            at_ms,
            limit: self.limit,
        })
    }
}

/// The cluster's grant events `request` asks for, newest first, as the operator's API answers
/// them (read from etcd under the stored configuration).
pub async fn events<K: Kv>(
    kv: &K,
    keys: &Keys,
    request: &HistoryRequest,
) -> Result<GrantHistory, Failure> {
    let stored = kv
        .get(keys.config().as_bytes())
        .await
        .map_err(Failure::Cluster)?
        .ok_or_else(|| {
            Failure::Refused(format!(
                "cluster {} has no configuration (corral cluster init)",
                keys.cluster()
            ))
        })?;
    let config: ClusterConfig = serde_json::from_slice(&stored.value).map_err(|e| {
        Failure::Refused(format!(
            "the stored cluster configuration does not read: {e}"
        ))
    })?;
    let events = read(kv, keys, &config, request, now_ms())
        .await
        .map_err(Failure::Cluster)?;
    Ok(corral_operator::history::to_wire(events))
}

/// Runs `corral cluster history`.
pub async fn show<K: Kv>(
    kv: &K,
    keys: &Keys,
    options: &HistoryOptions,
    output: Output,
) -> Result<Outcome, Failure> {
    let request = options.request()?;
    let history = events(kv, keys, &request).await?;
    Ok(Outcome::ok(match output {
        Output::Json => serde_json::to_string_pretty(&history).unwrap_or_default() + "\n",
        Output::Table => table(&history.events, options),
    }))
}

/// One line per event: pool, family, CIDR, node, from, to, why (times in UTC; `before
/// history` for a grant older than the history, `held` while held).
pub(crate) fn table(events: &[GrantEvent], options: &HistoryOptions) -> String {
    if events.is_empty() {
        let what = options
            .target
            .clone()
            .or_else(|| options.node.as_ref().map(|n| format!("node {n}")))
            .unwrap_or_default();
        let when = options
            .at
            .as_ref()
            .map(|at| format!(" at {at}"))
            .unwrap_or_default();
        return format!("no grant of {what}{when} in the cluster's history\n");
    }
    let mut table =
        crate::output::Table::new(&["POOL", "FAMILY", "CIDR", "NODE", "FROM", "TO", "WHY"]);
    for e in events {
        table.push(vec![
            e.pool.clone(),
            e.family.clone(),
            e.cidr.clone(),
            e.node.clone(),
            e.from_ms
                .map_or_else(|| "before history".into(), crate::output::utc),
            e.to_ms.map_or_else(|| "-".into(), crate::output::utc),
            e.why.clone().unwrap_or_else(|| "held".into()),
        ]);
    }
    table.render()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(target: Option<&str>, node: Option<&str>, at: Option<&str>) -> HistoryOptions {
        HistoryOptions {
            target: target.map(Into::into),
            node: node.map(Into::into),
            at: at.map(Into::into),
            limit: 100,
        }
    }

    #[test]
    fn a_table_names_holders_with_their_times_and_says_held_and_before_history() {
        let events = [
            GrantEvent {
                pool: "pods".into(),
                family: "ipv4".into(),
                cidr: "10.64.0.16/28".into(),
                node: "b".into(),
                from_ms: Some(1_795_788_120_000),
                to_ms: None,
                why: None,
            },
            GrantEvent {
                pool: "pods".into(),
                family: "ipv4".into(),
                cidr: "10.64.0.16/28".into(),
                node: "a".into(),
                from_ms: None,
                to_ms: Some(1_795_788_000_000),
                why: Some("node_removed".into()),
            },
        ];
        let text = table(&events, &options(Some("10.64.0.17"), None, None));
        assert_eq!(
            text,
            "POOL  FAMILY  CIDR           NODE  FROM                  TO                    WHY\n\
             pods  ipv4    10.64.0.16/28  b     2026-11-27T14:02:00Z  -                     held\n\
             pods  ipv4    10.64.0.16/28  a     before history        2026-11-27T14:00:00Z  node_removed\n"
        );
        let none = table(
            &[],
            &options(Some("10.0.0.1"), None, Some("2026-11-27T14:02")),
        );
        assert_eq!(
            none,
            "no grant of 10.0.0.1 at 2026-11-27T14:02 in the cluster's history\n"
        );
    }

    #[test]
    fn bad_options_are_usage_errors_naming_the_argument() {
        let usage = |o: HistoryOptions| match o.request() {
            Err(Failure::Usage(message)) => message,
            other => panic!("{other:?}"),
        };
        assert!(usage(options(Some("nope"), None, None)).contains("neither an address nor a CIDR"));
        assert!(usage(options(None, Some("Bad_Node"), None)).starts_with("--node:"));
        assert!(usage(options(Some("10.0.0.1"), None, Some("noon"))).starts_with("--at:"));
        let request = options(Some("10.0.0.0/8"), None, Some("1000"))
            .request()
            .unwrap();
        assert_eq!(
            (request.query, request.at_ms),
            (
                HistoryQuery::Cidr("10.0.0.0/8".parse().unwrap()),
                Some(1000)
            )
        );
    }
}
