//! Requests the unit tests of the node state and the committer build (test builds only): a
//! CNI network of one pool, its ADD, an attachment key, a node-scope allocation and a pool the
//! configuration file declares.

use std::time::Duration;

use corral_api as api;
use corral_core::{PoolName, ReusePolicy};
use corral_store::{PoolSpec, RangeSource};

use super::Op;

/// Network `net` whose one pool `net` serves `range`, reusing an address after `cooldown_ms`.
pub(crate) fn cni_network(range: &str, cooldown_ms: u64) -> api::CniNetwork {
    api::CniNetwork::with_pools(
        "net",
        vec![api::CniPool {
            name: "net".into(),
            cooldown_ms,
            lowest_free: false,
            ranges: vec![range.into()],
            exclusions: vec![],
        }],
    )
}

/// Container `container`'s `eth0` in network `network`.
pub(crate) fn attachment(network: &str, container: &str) -> api::AttachmentKey {
    api::AttachmentKey {
        network: network.into(),
        container_id: container.into(),
        ifname: "eth0".into(),
    }
}

/// The ADD of `container` (its owner too) in `network`: one IPv4 address of pool `net`.
pub(crate) fn cni_add(network: api::CniNetwork, container: &str) -> Op {
    Op::CniAdd(
        api::CniAddRequest {
            network,
            key: attachment("net", container),
            owner: container.into(),
            sets: vec![api::CniSet {
                pool: "net".into(),
                family: api::FamilyName::Ipv4,
                requested: None,
            }],
        }
        .try_into()
        .unwrap(),
    )
}

/// An address of `pool` in `scope` for `owner`, under `key` if given, for `lease_ms` if given.
pub(crate) fn allocate(
    scope: &str,
    pool: &str,
    owner: &str,
    key: Option<api::AttachmentKey>,
    lease_ms: Option<u64>,
) -> Op {
    Op::Allocate(
        api::AllocateRequest {
            scope: scope.into(),
            pool: pool.into(),
            owner: owner.into(),
            key,
            family: None,
            address: None,
            lease_ms,
        }
        .try_into()
        .unwrap(),
    )
}

/// Pool `pool` as the configuration file declares it: `range`, next-fit, `cooldown`.
pub(crate) fn file_pool(pool: &PoolName, cooldown: Duration, range: &str) -> PoolSpec {
    PoolSpec::new(
        pool,
        cooldown,
        ReusePolicy::NextFit,
        &[range.parse().unwrap()],
        &[],
    )
    .with_source(RangeSource::File)
}
