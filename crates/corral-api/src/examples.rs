//! The values the OpenAPI examples of several request bodies share (feature `openapi`): one
//! CNI network and one attachment of it, so every example describes the same pod.

use serde_json::{Value, json};

/// The CNI network `podnet`: one dual-stack pool.
pub(crate) fn cni_network() -> Value {
    json!({
        "name": "podnet",
        "pools": [
            {
                "name": "podnet-0",
                "cooldown_ms": 0,
                "lowest_free": false,
                "ranges": [
                    "10.90.0.0/24",
                    "fd90::/64"
                ],
                "exclusions": []
            }
        ]
    })
}

/// A pod's `eth0` on `podnet`.
pub(crate) fn attachment_key() -> Value {
    json!({"network": "podnet", "container_id": "9b1d0c2e", "ifname": "eth0"})
}
