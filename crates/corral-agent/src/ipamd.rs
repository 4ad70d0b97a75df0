//! AWS VPC CNI's ipamd checkpoint (`vpc-cni-ipam/1`), read so a node switches to corral
//! without losing a pod address. Pure: a JSON document in, the allocations or a typed error
//! naming the problem out.
//!
//! ipamd writes `{"version": "vpc-cni-ipam/1", "allocations": [entry, ...]}`, each entry its
//! `CheckpointEntry`: the CNI key (`IPAMKey`, which Go embeds, so its `networkName`,
//! `containerID` and `ifName` sit beside the other fields), `ipv4` and/or `ipv6`,
//! `allocationTimestamp` and `metadata` (`k8sPodNamespace`, `k8sPodName`). The key nested as
//! `"ipamKey": {...}` is read as well. An entry ipamd backfilled from CRI (network
//! [`BACKFILL_NETWORK_NAME`]) is recorded under [`migrated_key`]. Unknown fields are ignored, as ipamd's own reader
//! (Go's `encoding/json`) ignores them; anything else that does not fit refuses the whole
//! document.

use std::collections::HashMap;
use std::net::IpAddr;

use corral_core::{AttachmentKey, Echo, validate_owner};
use serde_json::{Map, Value};

pub use corral_api::IPAMD_CHECKPOINT_VERSION;

/// The network name ipamd >= 1.7 gives the entries it backfilled from CRI on a node upgraded
/// from 1.6 (`BackfillNetworkName`); not a valid corral network name (it starts with `_`).
pub const BACKFILL_NETWORK_NAME: &str = "_migrated-from-cri";
/// The interface name of those entries (`BackfillNetworkIface`).
pub const BACKFILL_NETWORK_IFACE: &str = "unknown";
/// The network a backfilled entry is recorded under: its container ID and interface
/// [`BACKFILL_NETWORK_IFACE`] complete the key ([`migrated_key`]). A DEL or CHECK of an
/// interface-backed pool's attachment that finds nothing under its own key falls back to it,
/// as ipamd's DEL falls back to matching the container ID alone.
pub const MIGRATED_NETWORK: &str = "migrated-from-cri";

/// The key a backfilled entry of container `container_id` is recorded under, if the
/// container ID is a valid one.
pub fn migrated_key(container_id: &str) -> Option<AttachmentKey> {
    AttachmentKey::new(MIGRATED_NETWORK, container_id, BACKFILL_NETWORK_IFACE).ok()
}

/// One pod's addresses in the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpamdAllocation {
    pub key: AttachmentKey,
    /// One or two (one per family).
    pub addresses: Vec<IpAddr>,
    /// `namespace/name` of the pod when the metadata has both, else the container ID.
    pub owner: String,
}

/// Why a checkpoint is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IpamdError {
    #[error("the checkpoint is not a JSON object")]
    NotAnObject,
    #[error("the checkpoint has no \"version\" (expected {IPAMD_CHECKPOINT_VERSION:?})")]
    MissingVersion,
    #[error("unknown checkpoint version {0} (this build reads {IPAMD_CHECKPOINT_VERSION:?})")]
    UnknownVersion(String),
    #[error("the checkpoint has no \"allocations\" array")]
    MissingAllocations,
    #[error("allocations[{index}]: {reason}")]
    Malformed { index: usize, reason: String },
    #[error("address {address} is in allocations[{first}] and allocations[{second}]")]
    DuplicateAddress {
        address: IpAddr,
        first: usize,
        second: usize,
    },
    #[error("key {key} is in allocations[{first}] and allocations[{second}]")]
    DuplicateKey {
        key: String,
        first: usize,
        second: usize,
    },
}

/// Reads a checkpoint document; every entry is checked before anything is returned.
pub fn parse_checkpoint(document: &Value) -> Result<Vec<IpamdAllocation>, IpamdError> {
    let object = document.as_object().ok_or(IpamdError::NotAnObject)?;
    match object.get("version") {
        None | Some(Value::Null) => return Err(IpamdError::MissingVersion),
        Some(Value::String(version)) if version == IPAMD_CHECKPOINT_VERSION => {}
        Some(Value::String(version)) => {
            return Err(IpamdError::UnknownVersion(Echo(version).to_string()));
        }
        Some(other) => return Err(IpamdError::UnknownVersion(shorten(&other.to_string()))),
    }
    let entries = match object.get("allocations") {
        Some(Value::Array(entries)) => entries,
        // ipamd writes `null` for a node without pods (a nil Go slice).
        Some(Value::Null) => return Ok(Vec::new()),
        _ => return Err(IpamdError::MissingAllocations),
    };
    let mut out = Vec::with_capacity(entries.len());
    let mut by_address: HashMap<IpAddr, usize> = HashMap::new();
    let mut by_key: HashMap<AttachmentKey, usize> = HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        let malformed = |reason: String| IpamdError::Malformed { index, reason };
        let entry = entry
            .as_object()
            .ok_or_else(|| malformed("not a JSON object".into()))?;
        let allocation = parse_entry(entry).map_err(malformed)?;
        if let Some(&first) = by_key.get(&allocation.key) {
            return Err(IpamdError::DuplicateKey {
                key: allocation.key.to_string(),
                first,
                second: index,
            });
        }
        for address in &allocation.addresses {
            if let Some(&first) = by_address.get(address) {
                return Err(IpamdError::DuplicateAddress {
                    address: *address,
                    first,
                    second: index,
                });
            }
            by_address.insert(*address, index);
        }
        by_key.insert(allocation.key.clone(), index);
        out.push(allocation);
    }
    Ok(out)
}

fn parse_entry(entry: &Map<String, Value>) -> Result<IpamdAllocation, String> {
    let key_fields = match entry.get("ipamKey") {
        Some(Value::Object(nested)) => {
            if ["networkName", "containerID", "ifName"]
                .iter()
                .any(|field| entry.contains_key(*field))
            {
                return Err("the key is given both as \"ipamKey\" and beside it".into());
            }
            nested
        }
        Some(_) => return Err("\"ipamKey\" is not an object".into()),
        None => entry,
    };
    let text = |fields: &Map<String, Value>, name: &str| -> Result<String, String> {
        match fields.get(name) {
            Some(Value::String(text)) if !text.is_empty() => Ok(text.clone()),
            Some(Value::String(_)) | None | Some(Value::Null) => Err(format!("{name} is missing")),
            Some(_) => Err(format!("{name} is not a string")),
        }
    };
    let network = text(key_fields, "networkName")?;
    let container_id = text(key_fields, "containerID")?;
    let ifname = text(key_fields, "ifName")?;
    let key = if network == BACKFILL_NETWORK_NAME {
        // Backfilled from CRI: the network and interface were unknown to ipamd.
        AttachmentKey::new(MIGRATED_NETWORK, &container_id, BACKFILL_NETWORK_IFACE)
    } else {
        AttachmentKey::new(&network, &container_id, &ifname)
    }
    .map_err(|e| e.to_string())?;
    let mut addresses = Vec::new();
    for (field, v6) in [("ipv4", false), ("ipv6", true)] {
        match entry.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) if text.is_empty() => {}
            Some(Value::String(text)) => {
                let address: IpAddr = text
                    .parse()
                    .map_err(|_| format!("{field} {} is not an address", Echo(text)))?;
                if address.is_ipv6() != v6 {
                    return Err(format!("{field} {address} is not of its family"));
                }
                addresses.push(address);
            }
            Some(_) => return Err(format!("{field} is not a string")),
        }
    }
    if addresses.is_empty() {
        return Err("neither ipv4 nor ipv6 is given".into());
    }
    match entry.get("allocationTimestamp") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {}
        Some(_) => return Err("allocationTimestamp is not an integer".into()),
    }
    let metadata = match entry.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(metadata)) => Some(metadata),
        Some(_) => return Err("metadata is not an object".into()),
    };
    let pod = metadata.and_then(|m| {
        let namespace = m.get("k8sPodNamespace")?.as_str()?;
        let name = m.get("k8sPodName")?.as_str()?;
        (!namespace.is_empty() && !name.is_empty()).then(|| format!("{namespace}/{name}"))
    });
    let owner = pod
        .filter(|owner| validate_owner(owner).is_ok())
        .unwrap_or_else(|| key.container_id().to_owned());
    Ok(IpamdAllocation {
        key,
        addresses,
        owner,
    })
}

fn shorten(text: &str) -> String {
    let mut out: String = text.chars().take(64).collect();
    if out.len() < text.len() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::testing::{ipamd_checkpoint as document, ipamd_entry as entry};

    #[test]
    fn reads_what_ipamd_writes_flat_or_nested() {
        let nested = json!({
            "ipamKey": {"networkName": "aws-cni", "containerID": "c2", "ifName": "eth0"},
            "ipv6": "2600:1f14::5",
            "someFutureField": true
        });
        let parsed = parse_checkpoint(&document(vec![entry("c1", "10.0.0.5"), nested])).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].key.to_string(), "aws-cni/c1/eth0");
        assert_eq!(parsed[0].addresses, ["10.0.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(parsed[0].owner, "default/pod-c1");
        assert_eq!(parsed[1].owner, "c2");
        assert_eq!(
            parsed[1].addresses,
            ["2600:1f14::5".parse::<IpAddr>().unwrap()]
        );
        assert!(
            parse_checkpoint(&json!({"version": "vpc-cni-ipam/1", "allocations": null}))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        let cases: Vec<(Value, &str)> = vec![
            (json!([]), "not a JSON object"),
            (json!({"allocations": []}), "no \"version\""),
            (
                json!({"version": "vpc-cni-ipam/2", "allocations": []}),
                "unknown checkpoint version \"vpc-cni-ipam/2\"",
            ),
            (json!({"version": 1}), "unknown checkpoint version 1"),
            (json!({"version": "vpc-cni-ipam/1"}), "no \"allocations\""),
            (
                document(vec![json!(3)]),
                "allocations[0]: not a JSON object",
            ),
            (
                document(vec![entry("c1", "10.0.0.5"), entry("c2", "10.0.0.300")]),
                "allocations[1]: ipv4 \"10.0.0.300\" is not an address",
            ),
            (
                document(vec![
                    json!({"networkName": "n", "ifName": "eth0", "ipv4": "10.0.0.1"}),
                ]),
                "allocations[0]: containerID is missing",
            ),
            (
                document(vec![
                    json!({"networkName": "n", "containerID": "c", "ifName": "eth0"}),
                ]),
                "neither ipv4 nor ipv6",
            ),
            (
                document(vec![entry("c1", "fd00::1")]),
                "ipv4 fd00::1 is not of its family",
            ),
            (
                document(vec![entry("c1", "10.0.0.5"), entry("c2", "10.0.0.5")]),
                "address 10.0.0.5 is in allocations[0] and allocations[1]",
            ),
            (
                document(vec![entry("c1", "10.0.0.5"), entry("c1", "10.0.0.6")]),
                "key aws-cni/c1/eth0 is in allocations[0] and allocations[1]",
            ),
            (
                document(vec![
                    json!({"networkName": "a/b", "containerID": "c", "ifName": "eth0", "ipv4": "10.0.0.1"}),
                ]),
                "allocations[0]: ",
            ),
        ];
        for (document, expected) in cases {
            let error = parse_checkpoint(&document).unwrap_err().to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
    }

    /// ipamd >= 1.7 on a node upgraded from 1.6 keeps the entries it backfilled from CRI
    /// under BackfillNetworkName "_migrated-from-cri" / BackfillNetworkIface "unknown": they
    /// are read under the migrated key of their container, the rest as written.
    #[test]
    fn backfilled_entries_are_read_under_the_migrated_key() {
        let document = json!({"version": "vpc-cni-ipam/1", "allocations": [
            entry("c1", "10.0.0.5"),
            {"networkName": "_migrated-from-cri", "containerID": "c0ffee", "ifName": "unknown",
             "ipv4": "10.0.0.6", "allocationTimestamp": 0, "metadata": {}}
        ]});
        let parsed = parse_checkpoint(&document).unwrap();
        assert_eq!(parsed[0].key.to_string(), "aws-cni/c1/eth0");
        assert_eq!(Some(&parsed[1].key), migrated_key("c0ffee").as_ref());
        assert_eq!(parsed[1].key.network(), MIGRATED_NETWORK);
        assert_eq!(parsed[1].owner, "c0ffee");
        assert_eq!(parsed[1].addresses, ["10.0.0.6".parse::<IpAddr>().unwrap()]);
    }
}
