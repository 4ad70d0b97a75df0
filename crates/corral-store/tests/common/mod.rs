//! What corral-store's tests share: a scope of one pool, and the row an attachment's
//! allocation is stored as.

use std::net::IpAddr;
use std::time::Duration;

use corral_core::{AttachmentKey, PoolName, RangeSpec, ReusePolicy};
use corral_store::{PoolSpec, ScopeConfig, StoredAllocation};

/// A scope of one next-fit pool: `ranges`, released addresses cooling for `cooldown`.
pub fn one_pool(pool: &PoolName, ranges: &[&str], cooldown: Duration) -> ScopeConfig {
    let specs: Vec<RangeSpec> = ranges.iter().map(|r| r.parse().unwrap()).collect();
    ScopeConfig {
        pools: vec![PoolSpec::new(
            pool,
            cooldown,
            ReusePolicy::NextFit,
            &specs,
            &[],
        )],
    }
}

/// The row of an allocation of `addr` (its `generation`) in `pool` for `owner` under the
/// attachment `key`.
pub fn attached(
    pool: PoolName,
    (addr, generation): (IpAddr, u64),
    owner: String,
    key: AttachmentKey,
) -> StoredAllocation {
    StoredAllocation {
        pool,
        addr,
        owner,
        key: Some(key),
        generation,
        lease: None,
    }
}
