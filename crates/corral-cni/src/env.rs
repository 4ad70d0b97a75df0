//! The CNI environment: `CNI_COMMAND` and the parameters each command needs.
//!
//! Parsing takes the variables as (name, value) pairs, so the binary passes
//! `std::env::vars_os()` and tests pass literals; nothing here reads the process
//! environment.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use corral_core::AttachmentKey;

use crate::error::CniError;
use crate::version::CniVersion;

/// A CNI operation, from `CNI_COMMAND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    /// Every command, in the order the spec lists them.
    pub const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Status,
        Command::Version,
        Command::Gc,
    ];

    /// The command named exactly (upper case, as runtimes send it) by `text`.
    pub fn parse(text: &str) -> Option<Command> {
        Command::ALL.into_iter().find(|c| c.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// Whether the command acts on one attachment, and so needs `CNI_CONTAINERID` and
    /// `CNI_IFNAME`.
    pub fn is_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }

    /// The variables the spec (1.1.0) requires for the command, besides `CNI_COMMAND`.
    pub fn required_variables(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &[CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME],
            Command::Del => &[CNI_CONTAINERID, CNI_IFNAME],
            Command::Gc => &[CNI_PATH],
            Command::Status | Command::Version => &[],
        }
    }
}

/// Which versions allow which commands.
impl CniVersion {
    /// The oldest version in which `command` exists: CHECK came with 0.4.0, GC and STATUS
    /// with 1.1.0.
    pub fn first_with(command: Command) -> CniVersion {
        match command {
            Command::Check => CniVersion::V0_4_0,
            Command::Gc | Command::Status => CniVersion::V1_1_0,
            Command::Add | Command::Del | Command::Version => CniVersion::V0_3_0,
        }
    }

    /// Whether a configuration of this version may be used with `command`.
    pub fn allows(self, command: Command) -> bool {
        self >= CniVersion::first_with(command)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub const CNI_COMMAND: &str = "CNI_COMMAND";
pub const CNI_CONTAINERID: &str = "CNI_CONTAINERID";
pub const CNI_NETNS: &str = "CNI_NETNS";
pub const CNI_IFNAME: &str = "CNI_IFNAME";
pub const CNI_ARGS: &str = "CNI_ARGS";
pub const CNI_PATH: &str = "CNI_PATH";

/// The parsed CNI environment.
///
/// For ADD, DEL and CHECK, `container_id` and `ifname` are present and valid CNI names (no
/// part can name a path); GC, STATUS and VERSION ignore them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: CniArgs,
    /// `CNI_PATH` split on `:`, empty entries dropped.
    pub path: Vec<PathBuf>,
}

impl Env {
    /// The attachment key for `network`: (network, container ID, interface name).
    ///
    /// Only ADD, DEL and CHECK have one; the network name is validated here (code 7), the
    /// container ID and interface name were validated when the environment was parsed.
    pub fn attachment_key(&self, network: &str) -> Result<AttachmentKey, CniError> {
        let (Some(container_id), Some(ifname)) = (&self.container_id, &self.ifname) else {
            return Err(CniError::internal(format!(
                "{} has no attachment",
                self.command
            )));
        };
        Ok(AttachmentKey::new(network, container_id, ifname)?)
    }
}

/// `CNI_ARGS`: `KEY=VALUE` pairs separated by `;`.
///
/// `IP` (any case, as host-local's README writes it `ip`) requests addresses: one or more,
/// comma-separated, each optionally with a prefix length that is ignored. Other keys
/// (`K8S_POD_NAME`, `IgnoreUnknown`, ...) are kept in `pairs` and otherwise ignored, as
/// host-local does when `IgnoreUnknown` is set; runtimes always pass keys a plugin does not
/// know.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub ips: Vec<IpAddr>,
    pub pairs: Vec<(String, String)>,
}

impl CniArgs {
    /// Parses `CNI_ARGS`; empty segments (a trailing `;`) are skipped.
    pub fn parse(text: &str) -> Result<CniArgs, CniError> {
        let mut args = CniArgs::default();
        let mut seen = HashSet::new();
        for pair in text.split(';') {
            if pair.is_empty() {
                continue;
            }
            let Some((key, value)) = pair.split_once('=').filter(|(key, _)| !key.is_empty()) else {
                return Err(CniError::invalid_environment(format!(
                    "{CNI_ARGS}: invalid pair {pair:?}, expected KEY=VALUE"
                )));
            };
            if key.eq_ignore_ascii_case("IP") {
                for text in value.split(',') {
                    let addr = parse_requested_ip(text).ok_or_else(|| {
                        CniError::invalid_environment(format!(
                            "{CNI_ARGS}: {key}={value}: invalid address {text:?}"
                        ))
                    })?;
                    if seen.insert(addr) {
                        args.ips.push(addr);
                    }
                }
            }
            args.pairs.push((key.to_owned(), value.to_owned()));
        }
        Ok(args)
    }

    /// The value of the first pair named `key` (exact case).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A requested address: a bare address or an address with a prefix length (as host-local's
/// `ip.IP` accepts), whose prefix is ignored.
pub(crate) fn parse_requested_ip(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    let addr = match text.split_once('/') {
        Some((addr, prefix)) => {
            let prefix: u8 = prefix.parse().ok()?;
            let addr: IpAddr = addr.parse().ok()?;
            let bits = if addr.is_ipv4() { 32 } else { 128 };
            if prefix > bits {
                return None;
            }
            addr
        }
        None => text.parse().ok()?,
    };
    Some(addr)
}

/// Parses the CNI environment from (name, value) pairs.
///
/// Unset and empty variables are the same (libcni's rule). Errors are code 4 and name the
/// variables; a container ID or interface name that could name a path is refused. For ADD
/// and CHECK a malformed `CNI_ARGS` is an error; DEL ignores it, so a teardown never fails
/// on arguments it does not need.
pub fn parse_env<I, K, V>(vars: I) -> Result<Env, CniError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut command = None;
    let mut container_id = None;
    let mut netns = None;
    let mut ifname = None;
    let mut args = None;
    let mut path = None;
    for (name, value) in vars {
        let slot = match name.as_ref().to_str() {
            Some(CNI_COMMAND) => &mut command,
            Some(CNI_CONTAINERID) => &mut container_id,
            Some(CNI_NETNS) => &mut netns,
            Some(CNI_IFNAME) => &mut ifname,
            Some(CNI_ARGS) => &mut args,
            Some(CNI_PATH) => &mut path,
            _ => continue,
        };
        let name = name.as_ref().to_string_lossy();
        let value = value
            .as_ref()
            .to_str()
            .ok_or_else(|| CniError::invalid_environment(format!("{name} is not valid utf-8")))?;
        *slot = (!value.is_empty()).then(|| value.to_owned());
    }

    let command_text = command.ok_or_else(|| {
        CniError::invalid_environment(format!("{CNI_COMMAND} is not set"))
            .with_details("expected ADD, DEL, CHECK, GC, STATUS or VERSION")
    })?;
    let command = Command::parse(&command_text).ok_or_else(|| {
        CniError::invalid_environment(format!("unknown {CNI_COMMAND} {command_text:?}"))
            .with_details("expected ADD, DEL, CHECK, GC, STATUS or VERSION")
    })?;
    if command == Command::Version {
        return Ok(Env {
            command,
            container_id: None,
            netns: None,
            ifname: None,
            args: CniArgs::default(),
            path: Vec::new(),
        });
    }

    let missing: Vec<&str> = command
        .required_variables()
        .iter()
        .copied()
        .filter(|&name| {
            let value = match name {
                CNI_CONTAINERID => &container_id,
                CNI_NETNS => &netns,
                CNI_IFNAME => &ifname,
                _ => &path,
            };
            value.is_none()
        })
        .collect();
    if !missing.is_empty() {
        return Err(CniError::invalid_environment(format!(
            "{command} needs {}, which {} not set",
            missing.join(", "),
            if missing.len() == 1 { "is" } else { "are" }
        )));
    }

    let (container_id, ifname) = if command.is_attachment() {
        validate_attachment_parts(container_id.as_deref(), ifname.as_deref())?;
        (container_id, ifname)
    } else {
        (None, None)
    };

    let args = match (command, args) {
        (_, None) | (Command::Gc | Command::Status, _) => CniArgs::default(),
        (Command::Del, Some(text)) => CniArgs::parse(&text).unwrap_or_default(),
        (_, Some(text)) => CniArgs::parse(&text)?,
    };

    let path = path
        .as_deref()
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();

    Ok(Env {
        command,
        container_id,
        netns,
        ifname,
        args,
        path,
    })
}

/// Checks a container ID and interface name with the engine's attachment-key rules.
fn validate_attachment_parts(
    container_id: Option<&str>,
    ifname: Option<&str>,
) -> Result<(), CniError> {
    // The network name comes from the configuration, read later; any valid name stands in
    // for it so the rules live in one place (`AttachmentKey::new`).
    const STAND_IN_NETWORK: &str = "network";
    let container_id = container_id.unwrap_or_default();
    let ifname = ifname.unwrap_or_default();
    AttachmentKey::new(STAND_IN_NETWORK, container_id, ifname).map_err(|err| {
        let name = match err {
            corral_core::SpecError::InvalidIfname { .. } => CNI_IFNAME,
            _ => CNI_CONTAINERID,
        };
        CniError::invalid_environment(format!("{name}: {err}"))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        parse_env(vars.iter().copied())
    }

    #[test]
    fn version_needs_nothing_else() {
        let parsed = env(&[("CNI_COMMAND", "VERSION"), ("CNI_CONTAINERID", "../x")]).unwrap();
        assert_eq!(parsed.command, Command::Version);
        assert_eq!(parsed.container_id, None);
    }

    #[test]
    fn empty_variables_count_as_missing() {
        let err = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", ""),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert_eq!(err.code, 4);
        assert_eq!(err.msg, "DEL needs CNI_CONTAINERID, which is not set");
    }

    #[test]
    fn args_parse_ips_and_keep_other_pairs() {
        let args = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAME=web-0;IP=10.0.0.5,fd00::5/64;ip=10.0.0.5;",
        )
        .unwrap();
        assert_eq!(
            args.ips,
            vec![
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert_eq!(args.get("K8S_POD_NAME"), Some("web-0"));
        assert_eq!(args.get("IgnoreUnknown"), Some("1"));
    }

    #[test]
    fn requested_ip_forms() {
        assert!(parse_requested_ip("10.0.0.1").is_some());
        assert!(parse_requested_ip("10.0.0.1/24").is_some());
        assert!(parse_requested_ip("10.0.0.1/33").is_none());
        assert!(parse_requested_ip("10.0.0.1/").is_none());
        assert!(parse_requested_ip("").is_none());
        assert!(parse_requested_ip("fd00::1/128").is_some());
    }

    #[test]
    fn del_ignores_bad_args_but_add_refuses_them() {
        let vars = |command| {
            vec![
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", "/run/netns/c1"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_ARGS", "garbage"),
            ]
        };
        assert!(parse_env(vars("DEL")).is_ok());
        assert_eq!(parse_env(vars("ADD")).unwrap_err().code, 4);
    }

    #[test]
    fn path_is_split() {
        let parsed = env(&[
            ("CNI_COMMAND", "GC"),
            ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
        ])
        .unwrap();
        assert_eq!(
            parsed.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
    }
}
