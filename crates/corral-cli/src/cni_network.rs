//! The pool a CNI network names, read from its configuration as the container runtime does:
//! a `.conf` (one plugin, `ipam` at the top) or a `.conflist` (the `ipam` of the corral-ipam
//! plugin in `plugins`), given as a file, or by the network's name in a configuration directory
//! (the first file in name order whose `name` matches, as libcni picks). For `corral explain
//! pod --cni-config`.

use std::path::Path;

use serde_json::Value;

/// The corral-ipam side of one CNI network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniNetwork {
    /// The network's `name`.
    pub name: String,
    /// The file it was read from.
    pub file: String,
    /// How corral-ipam allocates for it.
    pub ipam: NetworkIpam,
}

/// How corral-ipam allocates for a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkIpam {
    /// From a pool of the agent's node scope: `ipam.pool` if given.
    NodePool(Option<String>),
    /// From the network's own ranges (`ipam.ranges`, `ipam.subnet`): no cluster pool.
    OwnRanges,
    /// Without `ipam.agent`: the plugin allocates alone, the agent is not asked.
    Local,
    /// The network's IPAM plugin is another one (`ipam.type`).
    Other(String),
}

/// Reads the network `spec` names: a file, else the network of that name in `dir`.
pub fn read(spec: &str, dir: &Path) -> Result<CniNetwork, String> {
    let path = Path::new(spec);
    if path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{spec}: {e}"))?;
        return parse(&text, spec);
    }
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| {
            format!(
                "{spec} is neither a file nor readable as a network name in {}: {e}",
                dir.display()
            )
        })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "conf" || x == "conflist" || x == "json")
        })
        .collect();
    files.sort();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        if let Ok(network) = parse(&text, &file.display().to_string())
            && network.name == spec
        {
            return Ok(network);
        }
    }
    Err(format!(
        "no file {spec}, and no network named {spec} in {}",
        dir.display()
    ))
}

/// One configuration file's network.
pub fn parse(text: &str, file: &str) -> Result<CniNetwork, String> {
    let root: Value =
        serde_json::from_str(text).map_err(|e| format!("{file}: not a CNI configuration: {e}"))?;
    let name = root
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{file}: not a CNI configuration: no name"))?
        .to_owned();
    let ipam = match root.get("plugins").and_then(Value::as_array) {
        Some(plugins) => plugins
            .iter()
            .filter_map(|p| p.get("ipam"))
            .find(|ipam| ipam.get("type").and_then(Value::as_str) == Some("corral-ipam"))
            .or_else(|| plugins.iter().find_map(|p| p.get("ipam"))),
        None => root.get("ipam"),
    };
    let ipam = match ipam {
        None => NetworkIpam::Other("none".to_owned()),
        Some(ipam) => match ipam.get("type").and_then(Value::as_str) {
            Some("corral-ipam") => {
                let given = |key: &str| {
                    ipam.get(key)
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                };
                if given("agent").is_none() {
                    NetworkIpam::Local
                } else if ipam.get("ranges").is_some() || ipam.get("subnet").is_some() {
                    NetworkIpam::OwnRanges
                } else {
                    NetworkIpam::NodePool(given("pool"))
                }
            }
            other => NetworkIpam::Other(other.unwrap_or("none").to_owned()),
        },
    };
    Ok(CniNetwork {
        name,
        file: file.to_owned(),
        ipam,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflist_names_the_corral_ipam_plugins_pool() {
        let text = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[
            {"type":"bridge","ipam":{"type":"corral-ipam","agent":"/run/corral/agent.sock","pool":"blue"}},
            {"type":"portmap"}]}"#;
        let network = parse(text, "10-k8s.conflist").unwrap();
        assert_eq!(network.name, "k8s");
        assert_eq!(network.ipam, NetworkIpam::NodePool(Some("blue".into())));
        let conf = r#"{"name":"n","type":"bridge","ipam":{"type":"corral-ipam","agent":"/s"}}"#;
        assert_eq!(parse(conf, "f").unwrap().ipam, NetworkIpam::NodePool(None));
        let ranges =
            r#"{"name":"n","ipam":{"type":"corral-ipam","agent":"/s","subnet":"10.0.0.0/24"}}"#;
        assert_eq!(parse(ranges, "f").unwrap().ipam, NetworkIpam::OwnRanges);
        let local = r#"{"name":"n","ipam":{"type":"corral-ipam","subnet":"10.0.0.0/24"}}"#;
        assert_eq!(parse(local, "f").unwrap().ipam, NetworkIpam::Local);
        let other = r#"{"name":"n","ipam":{"type":"host-local"}}"#;
        assert_eq!(
            parse(other, "f").unwrap().ipam,
            NetworkIpam::Other("host-local".into())
        );
        assert!(parse("{}", "f").unwrap_err().contains("no name"));
    }

    #[test]
    fn a_network_is_found_by_name_in_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("05-other.conf"),
            r#"{"name":"other","ipam":{}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("10-k8s.conflist"),
            r#"{"name":"k8s","plugins":[{"ipam":{"type":"corral-ipam","agent":"/s","pool":"p"}}]}"#,
        )
        .unwrap();
        let network = read("k8s", dir.path()).unwrap();
        assert_eq!(network.ipam, NetworkIpam::NodePool(Some("p".into())));
        assert!(network.file.ends_with("10-k8s.conflist"), "{network:?}");
        let error = read("none", dir.path()).unwrap_err();
        assert!(error.contains("no network named none"), "{error}");
    }
}
