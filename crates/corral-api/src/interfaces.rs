//! Interface-backed pools: the bodies of `/v1/interfaces` and its sub-paths.
//!
//! A pool of the agent's node scope becomes interface-backed with its first interface (an
//! elastic network interface in AWS, say): its capacity is then exactly the secondary
//! addresses and delegated prefixes of its interfaces, and every allocation from it is
//! answered with the interface it lies on ([`AllocatedInterface`]). Plain ranges are refused
//! in such a pool, and interfaces in a pool with plain ranges.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::AttachmentKey;

/// The version of AWS VPC CNI's ipamd checkpoint `corral interface import-ipamd` reads.
pub const IPAMD_CHECKPOINT_VERSION: &str = "vpc-cni-ipam/1";

/// `POST /v1/interfaces`: adds an interface to a pool of the node scope (creating the pool,
/// interface-backed, if it does not exist), with its addresses if given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(
        json!({
            "pool": "eni",
            "id": "eni-0a1b2c3d4e5f60718",
            "device_number": 1,
            "mac": "0a:1b:2c:3d:4e:5f",
            "subnets": ["10.0.32.0/19"],
            "routes": ["10.0.0.0/16"],
            "addresses": ["10.0.32.10/32", "10.0.40.16/28"]
        }),
    ))
)]
#[serde(deny_unknown_fields)]
pub struct InterfaceRequest {
    pub pool: String,
    /// 1–64 characters `[A-Za-z0-9._:-]`, starting with a letter or digit; unique on the node.
    pub id: String,
    /// The interface's device index on the instance (0: the primary interface).
    pub device_number: u32,
    /// The hardware address, `0a:1b:2c:3d:4e:5f`.
    pub mac: String,
    /// The interface's subnets in CIDR form, at most one per family.
    pub subnets: Vec<String>,
    /// The gateway of each family; without one, an IPv4 subnet's first host (the VPC router).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub gateways: Vec<IpAddr>,
    /// The CIDRs reachable through the gateway (the VPC's), routed in the CNI result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
    /// The instance's primary interface: never removed without `force`.
    #[serde(default)]
    pub primary: bool,
    /// The interface's own primary address of each family (ipamd: the ENI's primary private
    /// IP; on the primary interface, the node's address): recorded and shown, never handed
    /// to a pod; an address or prefix in `addresses` that holds one is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub primary_addresses: Vec<IpAddr>,
    /// A trunk interface (branch interfaces for pods): never given addresses, never removed
    /// without `force`.
    #[serde(default)]
    pub trunk: bool,
    /// Kept out of pod networking: needs no addresses.
    #[serde(default)]
    pub excluded: bool,
    /// Secondary addresses (`/32`, `/128`) and delegated prefixes (`/28`, `/80`) to add with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

/// `POST /v1/interfaces/{id}/addresses`: a secondary address (`10.0.32.10` or
/// `10.0.32.10/32`) or a delegated prefix (`10.0.40.16/28`) of the interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(json!({"address": "10.0.32.11"}), json!({"address": "10.0.40.32/28"})))
)]
#[serde(deny_unknown_fields)]
pub struct InterfaceAddressRequest {
    pub address: String,
}

/// `DELETE /v1/interfaces/{id}/addresses?address=...[&force=true]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::IntoParams),
    into_params(parameter_in = Query)
)]
#[serde(deny_unknown_fields)]
pub struct InterfaceAddressQuery {
    /// The secondary address or delegated prefix
    pub address: String,
    /// Also when it holds allocations (released) or is the primary or a trunk interface
    #[serde(default)]
    pub force: bool,
}

/// `DELETE /v1/interfaces/{id}[?force=true]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::IntoParams),
    into_params(parameter_in = Query)
)]
#[serde(deny_unknown_fields)]
pub struct ForceQuery {
    /// Also when it holds allocations (released) or is the primary or a trunk interface
    #[serde(default)]
    pub force: bool,
}

/// `GET /v1/interfaces[?pool=]`.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::IntoParams),
    into_params(parameter_in = Query)
)]
#[serde(deny_unknown_fields)]
pub struct PoolQuery {
    /// Only this pool; every interface-backed pool of the node when absent
    pub pool: Option<String>,
}

/// One interface with its addresses and their use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InterfaceInfo {
    pub id: String,
    pub pool: String,
    pub device_number: u32,
    pub primary: bool,
    pub trunk: bool,
    pub excluded: bool,
    pub mac: String,
    pub subnets: Vec<String>,
    /// The gateway of each family, as configured or derived (the subnet's first host).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub gateways: Vec<IpAddr>,
    pub routes: Vec<String>,
    /// The interface's own primary addresses (never a pod's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub primary_addresses: Vec<IpAddr>,
    /// When the interface was added, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Its secondary addresses and delegated prefixes, in CIDR form.
    pub addresses: Vec<String>,
    /// How many of `addresses` are secondary addresses, and how many delegated prefixes.
    pub n_addresses: u64,
    pub n_prefixes: u64,
    /// Usable addresses (a prefix counts each of its addresses), allocated, and cooling.
    pub total: u64,
    pub assigned: u64,
    pub cooling: u64,
    /// Addresses and prefixes with nothing allocated and nothing cooling: these can be given
    /// back to the cloud.
    pub freeable: Vec<String>,
}

/// One interface-backed pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InterfacePool {
    pub pool: String,
    pub total: u64,
    pub assigned: u64,
    pub cooling: u64,
    /// By device number.
    pub interfaces: Vec<InterfaceInfo>,
}

/// `GET /v1/interfaces[?pool=]`: the node's interface-backed pools.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InterfacesResponse {
    pub pools: Vec<InterfacePool>,
}

/// `DELETE /v1/interfaces/{id}`: what left with the interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InterfaceRemoved {
    pub id: String,
    pub pool: String,
    /// Its addresses and prefixes, now out of the pool.
    pub addresses: Vec<String>,
}

/// The interface an allocated address lies on (in an [`crate::Allocated`] of an
/// interface-backed pool): what a CNI result needs to route the pod through it.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AllocatedInterface {
    pub id: String,
    pub device_number: u32,
    pub mac: String,
    /// The interface's subnet of the address's family.
    pub subnet: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, format = "ip"))]
    pub gateway: Option<IpAddr>,
    /// The CIDRs reachable through the gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
}

/// `POST /v1/import-ipamd`: AWS VPC CNI's ipamd checkpoint
/// (`{"version": "vpc-cni-ipam/1", "allocations": [...]}`), imported into an
/// interface-backed pool whose interfaces hold every address of it. Each allocation is
/// recorded under its CNI key, so the runtime's later DEL or CHECK finds it. All or nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(examples(json!({
        "pool": "eni",
        "checkpoint": {
            "version": "vpc-cni-ipam/1",
            "allocations": [{
                "networkName": "aws-cni",
                "containerID": "9b1d0c2e",
                "ifName": "eth0",
                "ipv4": "10.0.32.10",
                "allocationTimestamp": 1700000000000000000u64,
                "metadata": {"k8sPodNamespace": "default", "k8sPodName": "web-0"}
            }]
        }
    })))
)]
#[serde(deny_unknown_fields)]
pub struct IpamdImportRequest {
    pub pool: String,
    /// The checkpoint file's document, as ipamd wrote it.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub checkpoint: serde_json::Value,
}

/// One allocation an import recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ImportedAllocation {
    pub key: AttachmentKey,
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = "ip"))]
    pub address: IpAddr,
    pub owner: String,
    pub interface: String,
    pub device_number: u32,
    pub generation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct IpamdImportResponse {
    pub pool: String,
    pub imported: Vec<ImportedAllocation>,
}
