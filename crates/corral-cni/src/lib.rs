//! corral-cni: the CNI protocol (environment, configuration, results, errors) for corral-ipam.
//!
//! The protocol modules are pure: functions take the environment as (name, value) pairs and
//! stdin as bytes, and return values. A [`Backend`] carries the verbs out: [`Local`] on the
//! embedded store, [`Agent`] through the node agent; the `corral-ipam` binary chooses one,
//! and does the reading and printing. It speaks CNI spec 0.3.0 to 1.1.0 (ADD, DEL, CHECK, GC, STATUS, VERSION) and
//! reads the reference `host-local` plugin's `ipam` configuration, so corral-ipam can
//! replace host-local in an existing network configuration.
//!
//! ```
//! use corral_cni::{CniVersion, Invocation, IpamResult, parse_invocation};
//!
//! let stdin = br#"{
//!     "cniVersion": "1.0.0",
//!     "name": "mynet",
//!     "ipam": {"type": "corral-ipam", "ranges": [[{"subnet": "10.1.0.0/16"}]]}
//! }"#;
//! let env = [
//!     ("CNI_COMMAND", "ADD"),
//!     ("CNI_CONTAINERID", "c1"),
//!     ("CNI_NETNS", "/run/netns/c1"),
//!     ("CNI_IFNAME", "eth0"),
//! ];
//! let Invocation::Add(add) = parse_invocation(env, stdin).unwrap() else { unreachable!() };
//! assert_eq!(add.key.to_string(), "mynet/c1/eth0");
//!
//! // The plugin allocates from each range set's pool, then renders the result.
//! let set = &add.config.ipam.range_sets[0];
//! let ip = set.ip_config("10.1.0.2".parse().unwrap()).unwrap();
//! let result = IpamResult { ips: vec![ip], ..IpamResult::default() };
//! assert_eq!(
//!     result.to_json(add.config.cni_version),
//!     r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/16","gateway":"10.1.0.1"}],"dns":{}}"#
//! );
//! # let _ = CniVersion::LATEST;
//! ```

mod agent;
pub mod backend;
pub mod config;
pub mod env;
pub mod error;
pub mod fuzz;
mod invocation;
mod json;
mod local;
pub mod result;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verdict;
pub mod version;

pub use agent::Agent;
pub use backend::{Backend, scope_config};
pub use local::Local;

pub use config::{
    DEFAULT_DATA_DIR, IpamConfig, MAX_STDIN_BYTES, NetConfig, RangeSet, parse_config, pool_name,
    reply_version,
};
pub use env::{CniArgs, Command, Env, parse_env};
pub use error::CniError;
pub use invocation::{Attachment, Invocation, parse_invocation};
pub use result::{
    CloudInterface, Dns, IpConfig, IpamResult, PrevResult, Route, parse_prev_result,
    parse_resolv_conf, version_json,
};
pub use version::CniVersion;
