//! Entry points for the fuzz targets (`fuzz/fuzz_targets/cni_*.rs`) and their corpus replay
//! (`tests/fuzz_corpus.rs`): each takes arbitrary bytes, runs the plugin's own parsing on them,
//! and panics only when an invariant breaks (a parse must never panic, and what it accepts must
//! render to JSON that parses back).

use crate::config::{parse_config, reply_version};
use crate::env::{CniArgs, Command};
use crate::error::CniError;
use crate::invocation::{Invocation, parse_invocation};
use crate::result::{IpamResult, parse_resolv_conf};
use crate::version::CniVersion;

/// stdin as the network configuration of every command but VERSION (CNI_ARGS empty), and as
/// a `resolv.conf`: accepted configurations render a result that is JSON, refusals an error
/// object that is JSON.
pub fn config(data: &[u8]) {
    let version = reply_version(data);
    for command in [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Gc,
        Command::Status,
    ] {
        match parse_config(command, data, &CniArgs::default()) {
            Ok(config) => {
                assert_eq!(config.cni_version, version, "reply_version disagrees");
                rendered(&config.ipam.range_sets, config.cni_version);
            }
            Err(error) => refused(&error, version),
        }
    }
    let _ = parse_resolv_conf(&String::from_utf8_lossy(data));
}

/// The environment and stdin of one call: `NAME=VALUE` lines up to the first empty line are
/// the environment, the rest is stdin; `CNI_ARGS` alone is also read from the first line.
pub fn invocation(data: &[u8]) {
    let (head, stdin) = split_at_blank_line(data);
    let head = String::from_utf8_lossy(head);
    let vars: Vec<(&str, &str)> = head
        .lines()
        .filter_map(|line| line.split_once('='))
        .collect();
    if let Some(first) = head.lines().next() {
        let _ = CniArgs::parse(first);
    }
    let version = reply_version(stdin);
    match parse_invocation(vars, stdin) {
        Ok(invocation) => {
            if let Invocation::Add(attachment)
            | Invocation::Del(attachment)
            | Invocation::Check(attachment) = &invocation
            {
                let key = attachment.key.to_string();
                assert!(
                    key.starts_with(&attachment.config.name),
                    "key {key:?} is not of network {:?}",
                    attachment.config.name
                );
                let owner = attachment.owner();
                assert!(!owner.is_empty(), "an attachment with an empty owner");
            }
            if let Some(config) = invocation.config() {
                rendered(&config.ipam.range_sets, invocation.cni_version());
            }
        }
        Err(error) => refused(&error, version),
    }
}

fn split_at_blank_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[]),
    }
}

/// The result of an ADD that got each set's first and last address parses as JSON.
fn rendered(sets: &[crate::config::RangeSet], version: CniVersion) {
    let ips = sets
        .iter()
        .flat_map(|set| set.ranges.iter().map(move |range| (set, range)))
        .flat_map(|(set, range)| [set.ip_config(range.start()), set.ip_config(range.end())])
        .map(|ip| ip.expect("a range's own bound has no ip config"))
        .collect();
    let result = IpamResult {
        ips,
        ..IpamResult::default()
    };
    let json = result.to_json(version);
    serde_json::from_str::<serde_json::Value>(&json).expect("a result that is not JSON");
}

/// A refusal prints as a JSON error object with its code.
fn refused(error: &CniError, version: CniVersion) {
    let json = error.to_json(version);
    let value: serde_json::Value =
        serde_json::from_str(&json).expect("an error object that is not JSON");
    assert!(value.get("code").is_some(), "an error object without code");
}
