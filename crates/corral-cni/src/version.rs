//! The CNI spec versions corral-ipam speaks and their result formats. A leaf: which commands
//! each version allows is beside the commands (`env.rs`), and the refusal of an unsupported
//! version is with the errors (`error.rs`).

use std::fmt;

/// A CNI spec version this plugin supports.
///
/// Versions before 0.3.0 used a different result format (`ip4`/`ip6`) and are refused with
/// code 1; runtimes from the last several years all speak 0.3.0 or later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CniVersion {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl CniVersion {
    /// Every supported version, oldest first, as VERSION reports them.
    pub const ALL: [CniVersion; 5] = [
        CniVersion::V0_3_0,
        CniVersion::V0_3_1,
        CniVersion::V0_4_0,
        CniVersion::V1_0_0,
        CniVersion::V1_1_0,
    ];

    /// The newest version, used for output that has no configured version (VERSION, early
    /// errors).
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// The version named exactly by `text`, as libcni matches versions (no normalising).
    pub fn parse(text: &str) -> Option<CniVersion> {
        CniVersion::ALL.into_iter().find(|v| v.as_str() == text)
    }

    /// Whether results of this version carry `"version": "4"|"6"` in each `ips` entry
    /// (0.3.0 to 0.4.0; 1.0.0 dropped it).
    pub fn has_ip_version_field(self) -> bool {
        self < CniVersion::V1_0_0
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The supported versions as a comma-separated list, for error details.
pub fn supported_versions_text() -> String {
    CniVersion::ALL
        .iter()
        .map(|v| v.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
