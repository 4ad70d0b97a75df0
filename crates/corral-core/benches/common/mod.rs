//! Owners and attachment keys shared by the benchmarks, shaped like what a runtime passes, and
//! the criterion settings of the timed ones.

use std::time::Duration;

use corral_core::{AttachmentKey, PoolName, Request};
use criterion::Criterion;

/// SplitMix64: a deterministic stream for container IDs and the random release order.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A 64-hex-character container ID, like the ones a container runtime passes to CNI.
pub fn container_id(i: u64) -> String {
    (0..4).map(|k| format!("{:016x}", mix(i * 4 + k))).collect()
}

/// An owner of the `namespace/pod-name` shape, 26 bytes.
pub fn owner(i: u64) -> String {
    format!(
        "ns-{:02}/web-{:010x}-{:05x}",
        i % 40,
        mix(i) >> 24,
        mix(!i) >> 44
    )
}

/// The attachment key of allocation `i`: network `net`, interface `eth0`.
pub fn key(i: u64) -> AttachmentKey {
    AttachmentKey::new("net", &container_id(i), "eth0").expect("valid attachment key")
}

/// A request by `owner` for `key`, without a lease.
pub fn keyed_request<'a>(
    pool: &'a PoolName,
    owner: &'a str,
    key: &'a AttachmentKey,
) -> Request<'a> {
    Request {
        pool,
        owner,
        key: Some(key),
        lease: None,
    }
}

/// The settings of the timed benchmarks: a second of warm-up, three of measurement, 50 samples.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(1000))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}
