//! What other crates' tests and benches write cluster configurations with (feature
//! `testing`): [`PoolTable`], one `[[pools]]` table in the TOML `corral cluster init` reads,
//! so a test names the pool, its mode and its ranges instead of writing the file's lines; and
//! [`node_id_plan`], the node-ID plan the tests derive nodes' addresses from.

use std::fmt;

use crate::config::NodeIdPlanConfig;

/// [`node_id_plan`] as a `[node_ids]` table in TOML.
pub const NODE_IDS_TOML: &str = crate::fuzz::node_ids_toml!();

/// The node-ID plan of [`crate::fuzz::RECORDS_CONFIG`]: pod subnet 10.1.0.0/16 and host
/// interconnect 172.30.0.0/16 in /24s, node interconnect 192.168.16.0/24, VXLAN
/// 192.168.30.0/24, services 10.96.0.0/12.
pub fn node_id_plan() -> NodeIdPlanConfig {
    #[derive(serde::Deserialize)]
    struct File {
        node_ids: NodeIdPlanConfig,
    }
    toml::from_str::<File>(NODE_IDS_TOML)
        .expect("the plan parses")
        .node_ids
}

/// One `[[pools]]` table, in TOML: a node-CIDR pool ([`PoolTable::node_cidrs`]) or a block
/// pool ([`PoolTable::blocks`]), its settings ([`PoolTable::set`]), its watermarks and one
/// range set per family. Its [`Display`](fmt::Display) is the table.
#[derive(Clone, Debug)]
pub struct PoolTable {
    head: String,
    /// `node_prefix_len` or `block_prefix_len`, as the mode has it.
    prefix_key: &'static str,
    tables: String,
}

impl PoolTable {
    /// A pool of node CIDRs named `name`.
    pub fn node_cidrs(name: &str) -> PoolTable {
        PoolTable {
            head: format!("[[pools]]\nname = \"{name}\"\n"),
            prefix_key: "node_prefix_len",
            tables: String::new(),
        }
    }

    /// A block pool named `name` (`mode = "blocks"`).
    pub fn blocks(name: &str) -> PoolTable {
        PoolTable {
            head: format!("[[pools]]\nname = \"{name}\"\nmode = \"blocks\"\n"),
            prefix_key: "block_prefix_len",
            tables: String::new(),
        }
    }

    /// The pool's setting `key = value` (`value` as TOML: a string carries its quotes).
    pub fn set(mut self, key: &str, value: impl fmt::Display) -> PoolTable {
        self.head += &format!("{key} = {value}\n");
        self
    }

    /// The pool's watermarks: `pre_allocate` blocks a node asks for.
    pub fn pre_allocate(mut self, blocks: u32) -> PoolTable {
        self.tables += &format!("[pools.watermarks]\npre_allocate = {blocks}\n");
        self
    }

    /// IPv4 range `cidr`, in node CIDRs or blocks of `/prefix_len`.
    pub fn ipv4(self, cidr: &str, prefix_len: u8) -> PoolTable {
        self.family("ipv4", cidr, prefix_len)
    }

    /// IPv6 range `cidr`, in node CIDRs or blocks of `/prefix_len`.
    pub fn ipv6(self, cidr: &str, prefix_len: u8) -> PoolTable {
        self.family("ipv6", cidr, prefix_len)
    }

    fn family(mut self, family: &str, cidr: &str, prefix_len: u8) -> PoolTable {
        self.tables += &format!(
            "[pools.{family}]\ncidrs = [\"{cidr}\"]\n{} = {prefix_len}\n",
            self.prefix_key
        );
        self
    }
}

impl fmt::Display for PoolTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.head, self.tables)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterConfig;

    #[test]
    fn a_pool_table_is_what_the_file_says() {
        let blocks = PoolTable::blocks("pods")
            .set("release_delay_secs", 10)
            .pre_allocate(8)
            .ipv4("10.64.0.0/28", 28)
            .to_string();
        assert_eq!(
            blocks,
            "[[pools]]\nname = \"pods\"\nmode = \"blocks\"\nrelease_delay_secs = 10\n\
             [pools.watermarks]\npre_allocate = 8\n\
             [pools.ipv4]\ncidrs = [\"10.64.0.0/28\"]\nblock_prefix_len = 28\n"
        );
        let cidrs = PoolTable::node_cidrs("default")
            .ipv4("10.0.0.0/16", 24)
            .ipv6("fd00::/32", 64);
        let config = ClusterConfig::from_toml(&format!("{cidrs}{blocks}")).unwrap();
        assert_eq!(config.pools.len(), 2);
        assert_eq!(config.pools[0].ipv6.as_ref().unwrap().node_prefix_len, 64);
        assert!(config.pools[1].is_blocks());
    }
}
