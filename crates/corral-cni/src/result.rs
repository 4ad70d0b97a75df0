//! Success results: the IPAM result of ADD in each spec version's format, the VERSION
//! result, a `prevResult` read back (for CHECK), and DNS settings read from a resolv.conf.
//!
//! Field order and omission follow libcni's Go types, so output compares equal to
//! host-local's: `ips` and `routes` are left out when empty, `dns` is always present.

use std::net::IpAddr;

use corral_core::{Family, IpNet};
use serde::Serialize;
use serde_json::Value;

use crate::error::CniError;
use crate::json::{Obj, as_array, index};
use crate::version::CniVersion;

/// One address of a result: the address with its subnet's prefix length, the subnet's
/// gateway, and (in a main plugin's result, never in an IPAM plugin's) the index of the
/// interface it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpConfig {
    pub address: IpNet,
    pub gateway: Option<IpAddr>,
    pub interface: Option<u32>,
}

impl IpConfig {
    /// An IPAM result entry: no interface index.
    pub fn new(address: IpNet, gateway: Option<IpAddr>) -> IpConfig {
        IpConfig {
            address,
            gateway,
            interface: None,
        }
    }

    pub fn family(&self) -> Family {
        Family::of(self.address.addr())
    }
}

/// A route for the container, as configured in `ipam.routes` and returned in the result.
///
/// `mtu`, `advmss`, `priority`, `table` and `scope` are the route attributes spec 1.1.0
/// added; like libcni, corral passes them through when set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The destination; host bits are kept as written (`3ffe:ffff:0:1ff::1/64`).
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u8>,
}

impl Route {
    /// A route to `dst`, through `gw` when given, without attributes.
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// DNS settings of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

/// The cloud interface (an AWS ENI, say) addresses of the result lie on: what the agent
/// answers for an interface-backed pool.
///
/// The CNI spec has IPAM plugins return an abbreviated result, "that does not include the
/// `interfaces` key, since IPAM plugins should be unaware of interfaces configured by their
/// parent plugin", and leaves `ips[].interface` (an index into `interfaces`) to the main
/// plugin. So corral-ipam puts neither there: the interface's gateway goes into
/// `ips[].gateway`, its routable CIDRs into `routes` (via that gateway), and its identity
/// (ID, device number, MAC) under the result's own `corral` key, `{"interfaces": [{"id",
/// "deviceNumber", "mac", "addresses"}]}`, which a main plugin that routes through the
/// node's interfaces reads; libcni and every other consumer ignore a key they do not know.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CloudInterface {
    pub id: String,
    pub device_number: u32,
    pub mac: String,
    /// The result's addresses on it, as in `ips[].address`.
    pub addresses: Vec<IpNet>,
}

/// The result of an IPAM ADD: addresses, routes and DNS, without interfaces (an IPAM plugin
/// knows nothing of them), and the cloud interfaces of an interface-backed pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpamResult {
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
    pub cloud_interfaces: Vec<CloudInterface>,
}

impl IpamResult {
    /// The result in the format of `version`: 0.3.0 to 0.4.0 put `"version": "4"|"6"` in each
    /// `ips` entry; 1.0.0 and 1.1.0 do not.
    pub fn to_json(&self, version: CniVersion) -> String {
        let out = ResultOut {
            cni_version: version.as_str(),
            ips: self
                .ips
                .iter()
                .map(|ip| IpOut {
                    version: version.has_ip_version_field().then(|| match ip.family() {
                        Family::V4 => "4",
                        Family::V6 => "6",
                    }),
                    interface: ip.interface,
                    address: ip.address.to_string(),
                    gateway: ip.gateway.map(|g| g.to_string()),
                })
                .collect(),
            routes: self
                .routes
                .iter()
                .map(|route| RouteOut {
                    dst: route.dst.to_string(),
                    gw: route.gw.map(|g| g.to_string()),
                    // libcni omits zero MTU, advmss and priority (Go's omitempty on ints).
                    mtu: route.mtu.filter(|&n| n != 0),
                    advmss: route.advmss.filter(|&n| n != 0),
                    priority: route.priority.filter(|&n| n != 0),
                    table: route.table,
                    scope: route.scope,
                })
                .collect(),
            dns: DnsOut {
                nameservers: &self.dns.nameservers,
                domain: self.dns.domain.as_deref(),
                search: &self.dns.search,
                options: &self.dns.options,
            },
            corral: (!self.cloud_interfaces.is_empty()).then(|| CorralOut {
                interfaces: self
                    .cloud_interfaces
                    .iter()
                    .map(|i| CloudInterfaceOut {
                        id: &i.id,
                        device_number: i.device_number,
                        mac: &i.mac,
                        addresses: i.addresses.iter().map(ToString::to_string).collect(),
                    })
                    .collect(),
            }),
        };
        // Serialising strings, integers and vectors of them cannot fail.
        serde_json::to_string(&out).unwrap_or_default()
    }
}

#[serde_with::skip_serializing_none]
#[derive(Serialize)]
struct ResultOut<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ips: Vec<IpOut>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routes: Vec<RouteOut>,
    dns: DnsOut<'a>,
    corral: Option<CorralOut<'a>>,
}

#[derive(Serialize)]
struct CorralOut<'a> {
    interfaces: Vec<CloudInterfaceOut<'a>>,
}

#[derive(Serialize)]
struct CloudInterfaceOut<'a> {
    id: &'a str,
    #[serde(rename = "deviceNumber")]
    device_number: u32,
    mac: &'a str,
    addresses: Vec<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Serialize)]
struct IpOut {
    version: Option<&'static str>,
    interface: Option<u32>,
    address: String,
    gateway: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Serialize)]
struct RouteOut {
    dst: String,
    gw: Option<String>,
    mtu: Option<u32>,
    advmss: Option<u32>,
    priority: Option<u32>,
    table: Option<u32>,
    scope: Option<u8>,
}

#[serde_with::skip_serializing_none]
#[derive(Serialize)]
struct DnsOut<'a> {
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    nameservers: &'a [String],
    domain: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    search: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    options: &'a [String],
}

/// The VERSION result: `{"cniVersion":"1.0.0","supportedVersions":[...]}`, answered in
/// `version`.
///
/// Spec 1.0 and 1.1 ask for "the value of cniVersion specified on input"; 0.3.x and 0.4.0
/// call it "the version of the CNI spec in use for this output", which is the input's too. A
/// version corral-ipam does not speak (older than 0.3.0, newer than it knows, missing, or
/// stdin that is not JSON) is answered in the newest it speaks rather than refused: VERSION
/// is how a runtime finds out what a plugin speaks, and the list answers that.
/// `main` passes [`crate::reply_version`] of stdin, which is exactly that choice.
pub fn version_json(version: CniVersion) -> String {
    #[derive(Serialize)]
    struct VersionOut {
        #[serde(rename = "cniVersion")]
        cni_version: &'static str,
        #[serde(rename = "supportedVersions")]
        supported_versions: Vec<&'static str>,
    }
    let out = VersionOut {
        cni_version: version.as_str(),
        supported_versions: CniVersion::ALL.iter().map(|v| v.as_str()).collect(),
    };
    serde_json::to_string(&out).unwrap_or_default()
}

/// The addresses a previous ADD returned, read back from `prevResult`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrevResult {
    pub ips: Vec<IpConfig>,
}

impl PrevResult {
    /// The addresses alone, without prefix lengths.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ips.iter().map(|ip| ip.address.addr())
    }
}

/// Reads a `prevResult` (any supported version's format; a main plugin's result with
/// `interfaces` is fine) at `path`.
///
/// Only `ips` is read: each entry needs `address` in CIDR form; `gateway`, `interface` and the
/// pre-1.0 `version` are checked when present. Wrong types are code 6, bad values code 7.
pub fn parse_prev_result(path: &str, value: &Value) -> Result<PrevResult, CniError> {
    let result = Obj::of(path, value)?;
    let mut prev = PrevResult::default();
    let ips_path = result.path_of("ips");
    for (i, entry) in result.array("ips")?.into_iter().flatten().enumerate() {
        let entry_path = index(&ips_path, i);
        let entry = Obj::of(&entry_path, entry)?;
        let address_text = entry.str("address")?.ok_or_else(|| {
            CniError::invalid_config(format!("{}: missing", entry.path_of("address")))
        })?;
        let address = parse_cidr(&entry.path_of("address"), address_text)?;
        let gateway = entry
            .non_empty_str("gateway")?
            .map(|text| parse_ip(&entry.path_of("gateway"), text))
            .transpose()?;
        let interface = entry
            .uint("interface", u64::from(u32::MAX))?
            .map(|n| n as u32);
        if let Some(version) = entry.non_empty_str("version")? {
            let expected = match Family::of(address.addr()) {
                Family::V4 => "4",
                Family::V6 => "6",
            };
            if version != expected {
                return Err(CniError::invalid_config(format!(
                    "{}: version {version:?} does not match address {address}",
                    entry.path_of("version")
                )));
            }
        }
        prev.ips.push(IpConfig {
            address,
            gateway,
            interface,
        });
    }
    Ok(prev)
}

/// Reads a route object at `path` (`{dst, gw?, mtu?, advmss?, priority?, table?, scope?}`).
pub(crate) fn parse_route(path: &str, value: &Value) -> Result<Route, CniError> {
    let route = Obj::of(path, value)?;
    let dst_text = route
        .str("dst")?
        .ok_or_else(|| CniError::invalid_config(format!("{}: missing", route.path_of("dst"))))?;
    let dst = parse_cidr(&route.path_of("dst"), dst_text)?;
    let gw = route
        .non_empty_str("gw")?
        .map(|text| parse_ip(&route.path_of("gw"), text))
        .transpose()?;
    if let Some(gw) = gw
        && Family::of(gw) != Family::of(dst.addr())
    {
        return Err(CniError::invalid_config(format!(
            "{}: gateway {gw} is not of the family of destination {dst}",
            route.path_of("gw")
        )));
    }
    let max = u64::from(u32::MAX);
    let narrow = |n: u64| n as u32;
    Ok(Route {
        dst,
        gw,
        mtu: route.uint("mtu", max)?.map(narrow),
        advmss: route.uint("advmss", max)?.map(narrow),
        priority: route.uint("priority", max)?.map(narrow),
        table: route.uint("table", max)?.map(narrow),
        scope: route.uint("scope", u64::from(u8::MAX))?.map(|n| n as u8),
    })
}

/// Reads the routes array at `path`.
pub(crate) fn parse_routes(path: &str, value: &Value) -> Result<Vec<Route>, CniError> {
    as_array(path, value)?
        .iter()
        .enumerate()
        .map(|(i, route)| parse_route(&index(path, i), route))
        .collect()
}

/// Parses an address, code 7 naming the field.
pub(crate) fn parse_ip(path: &str, text: &str) -> Result<IpAddr, CniError> {
    corral_core::parse_addr(text).map_err(|err| CniError::from(err).context(path))
}

/// Parses a CIDR (a `/` is required; host bits are kept), code 7 naming the field.
pub(crate) fn parse_cidr(path: &str, text: &str) -> Result<IpNet, CniError> {
    if !text.contains('/') {
        return Err(CniError::invalid_config(format!(
            "{path}: {text:?} is not in cidr notation (such as 10.1.0.0/16)"
        )));
    }
    corral_core::parse_net(text).map_err(|err| CniError::from(err).context(path))
}

/// DNS settings from the text of a resolv.conf, as host-local reads its `resolvConf`:
/// `nameserver`, `domain`, `search` and `options` lines; comments (`#`, `;`) and lines
/// with a keyword alone are skipped.
pub fn parse_resolv_conf(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(keyword), Some(first)) = (fields.next(), fields.next()) else {
            continue;
        };
        let rest = std::iter::once(first).chain(fields).map(str::to_owned);
        match keyword {
            "nameserver" => dns.nameservers.push(first.to_owned()),
            "domain" => dns.domain = Some(first.to_owned()),
            "search" => dns.search.extend(rest),
            "options" => dns.options.extend(rest),
            _ => {}
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    fn sample() -> IpamResult {
        IpamResult {
            ips: vec![
                IpConfig::new(net("10.1.0.2/16"), Some("10.1.0.1".parse().unwrap())),
                IpConfig::new(net("fd00::2/64"), None),
            ],
            routes: vec![
                Route::new(net("0.0.0.0/0"), None),
                Route::new(net("192.168.0.0/16"), Some("10.1.5.1".parse().unwrap())),
            ],
            dns: Dns::default(),
            cloud_interfaces: Vec::new(),
        }
    }

    #[test]
    fn current_format_has_no_ip_version() {
        assert_eq!(
            sample().to_json(CniVersion::V1_1_0),
            r#"{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.2/16","gateway":"10.1.0.1"},{"address":"fd00::2/64"}],"routes":[{"dst":"0.0.0.0/0"},{"dst":"192.168.0.0/16","gw":"10.1.5.1"}],"dns":{}}"#
        );
    }

    #[test]
    fn old_formats_carry_the_ip_version() {
        let json = sample().to_json(CniVersion::V0_3_1);
        assert_eq!(
            json,
            r#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.1.0.2/16","gateway":"10.1.0.1"},{"version":"6","address":"fd00::2/64"}],"routes":[{"dst":"0.0.0.0/0"},{"dst":"192.168.0.0/16","gw":"10.1.5.1"}],"dns":{}}"#
        );
    }

    #[test]
    fn resolv_conf_like_host_local() {
        let dns = parse_resolv_conf(
            "# generated\nnameserver 10.0.0.10\nnameserver fd00::10\n; note\ndomain example.com\nsearch a.example b.example\nsearch c.example\noptions ndots:5 edns0\nnameserver\n",
        );
        assert_eq!(dns.nameservers, ["10.0.0.10", "fd00::10"]);
        assert_eq!(dns.domain.as_deref(), Some("example.com"));
        assert_eq!(dns.search, ["a.example", "b.example", "c.example"]);
        assert_eq!(dns.options, ["ndots:5", "edns0"]);
    }
}
